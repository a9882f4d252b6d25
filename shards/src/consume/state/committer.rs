//! The consumer-offset committer: one per shard, on that shard's core (`!Send`).
//!
//! It runs at two cadences, both driven by the caller's clock:
//! - every tick (T, 100 ms), each partition whose acked state changed gets a fresh
//!   record written into its window slot's page cache (`write_cached_at`, no
//!   device write), through a held descriptor, with no sync: a crash of the
//!   process keeps it;
//! - once per durability interval (D, 1 s by default), each partition written since
//!   is written out (`fdatasync`), on the tick its key hashes to, so the syncs of
//!   many partitions do not reach the device as one burst. A partition whose writes
//!   waited a whole interval is written out on the next tick whatever its turn.
//!
//! Invariants (asserted in release where a break loses acks):
//! - the anchor slot holds the newest record known durable and is never written
//!   while it is the anchor; only a successful sync of the window flips the roles;
//! - the frontier of the records written for a partition never goes backwards, and
//!   never below the record the prime found on disk;
//! - a partition is synced only when its window holds a whole record: after a
//!   failed write or sync, the next tick rewrites the window in full first;
//! - before the first window write of a life, the prime syncs the file as found,
//!   because its newest slot may sit only in the page cache of a process that
//!   crashed, and that window write overwrites the other slot;
//! - nothing creates a directory, and a descriptor evicted under the cap is opened
//!   again only as an existing file whose anchor slot still holds the anchor.
//!
//! Bounds: at most `open_files_max` held descriptors (plus one opened for a single
//! write at a time, or up to `syncs_at_once` for syncs and levellings); one
//! write per changed partition per tick; up to `syncs_at_once` syncs in flight
//! ([`SYNCS_AT_ONCE`] by default).

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::time::{Duration, Instant};

use narad_io::file::{join, OpenMode};
use narad_io::rt::join_all;
use narad_io::{BlockFile, Storage};

use super::offset::level_file;
use super::slot::{self, SLOT_BYTES};
use super::{AckedState, AHEAD_FILE, AHEAD_FILE_BYTES, OFFSET_FILE};
use crate::ids::{IncarnationId, Offset, PartitionId};

/// A partition's key in the committer: opaque to it.
pub type PartitionKey = (IncarnationId, PartitionId);

/// Write tick T.
pub const TICK_DEFAULT: Duration = Duration::from_millis(100);
/// Durability interval D (`storage.consumer_offset_commit_interval_ms`).
pub const DURABILITY_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);
/// Smallest durability interval the configuration accepts.
pub const DURABILITY_INTERVAL_MIN: Duration = Duration::from_millis(10);
/// Largest durability interval the configuration accepts.
pub const DURABILITY_INTERVAL_MAX: Duration = Duration::from_secs(60);
/// How often at most `consumer.offset` is levelled with the frontier.
pub const LEVEL_EVERY_DEFAULT: Duration = Duration::from_secs(30);
/// Held `consumer.ahead` descriptors at most, before the open-file limit lowers it.
pub const OPEN_FILES_MAX_DEFAULT: usize = 4096;
/// Syncs (and levellings) in flight together, by default.
pub const SYNCS_AT_ONCE: usize = 32;

/// How the committer paces its writes and bounds its descriptors.
#[derive(Clone, Debug)]
pub struct CommitterConfig {
    /// Write tick T: each changed partition's window is written (no sync). 100 ms.
    pub tick: Duration,
    /// Durability interval D (`storage.consumer_offset_commit_interval_ms`, default
    /// 1 s, 10..=60000 ms): each partition written since is fdatasynced once per
    /// interval, spread over the ticks by a hash of its key; one that waited a whole
    /// interval goes on the next tick whatever its turn.
    pub durability_interval: Duration,
    /// `consumer.offset` levelling: at most this often per partition, and at close.
    pub level_every: Duration,
    /// Held `consumer.ahead` descriptors at most; past it the committer closes the
    /// least recently written one whose window is durable, else writes through a
    /// descriptor opened for that write alone.
    pub open_files_max: usize,
    /// Syncs, and levellings, in flight together ([`SYNCS_AT_ONCE`]; 1 for a
    /// benchmark's baseline).
    pub syncs_at_once: usize,
}

impl Default for CommitterConfig {
    fn default() -> Self {
        Self {
            tick: TICK_DEFAULT,
            durability_interval: DURABILITY_INTERVAL_DEFAULT,
            level_every: LEVEL_EVERY_DEFAULT,
            open_files_max: OPEN_FILES_MAX_DEFAULT,
            syncs_at_once: SYNCS_AT_ONCE,
        }
    }
}

impl CommitterConfig {
    /// Ticks in one durability interval: the number of turns writeouts spread over.
    /// The tick is the interval when that is shorter.
    fn turns(&self) -> u64 {
        let tick_ns = self.tick.min(self.durability_interval).as_nanos().max(1);
        (self.durability_interval.as_nanos() / tick_ns).max(1) as u64
    }
}

/// What one tick (or close) did.
#[derive(Debug, Default)]
pub struct TickReport {
    /// Window records written.
    pub written: usize,
    /// Successful writeouts (`fdatasync` of `consumer.ahead`).
    pub synced: usize,
    /// `consumer.offset` files brought level.
    pub levelled: usize,
    /// Partitions primed (first touch in this life).
    pub primed: usize,
    /// Failures, one line per partition and step; each is retried next tick.
    pub errors: Vec<(PartitionKey, String)>,
    /// Partitions whose latest given state became durable in this call.
    pub durable: Vec<PartitionKey>,
    /// Acked offsets above the frontier that the latest records written left
    /// out (a set too large for a slot keeps its lowest offsets): after a
    /// close, what a restart delivers again. Summed over partitions.
    pub cut: usize,
}

/// How the error of a failed `consumer.offset` levelling starts in
/// [`TickReport::errors`]: the acks behind it are durable in `consumer.ahead`,
/// so a caller may tell it from the failures that lose them on a crash.
pub const LEVEL_ERROR_PREFIX: &str = "level ";

/// One partition's bookkeeping.
struct Partition<F> {
    dir: String,
    /// The held `consumer.ahead` descriptor, if the cap left room for one.
    file: Option<F>,
    primed: bool,
    /// The directory or file was removed or replaced under the committer: nothing
    /// is written until the partition is forgotten.
    stranded: bool,
    anchor: usize,
    /// Sequence number of the record in the anchor slot (`None`: it held none).
    anchor_seq: Option<u64>,
    /// The largest sequence number written or found.
    seq: u64,
    /// Frontier of the newest record written or found: the floor for the next.
    record_frontier: Offset,
    /// Frontier of the newest durable record, once one is known.
    durable_frontier: Option<Offset>,
    /// The latest state the caller gave.
    state: AckedState,
    /// The latest state is not yet in the window.
    needs_write: bool,
    /// The window holds this record, written and not yet durable.
    window: Option<(u64, Offset)>,
    /// When the oldest write not yet durable landed.
    unsynced_since: Option<Instant>,
    /// The frontier `consumer.offset` is known to hold, and when it was levelled.
    levelled: Option<Offset>,
    levelled_at: Option<Instant>,
    /// Order of the last window write, for evicting the least recently written.
    written_order: u64,
    /// Acked offsets the latest window record left out: it did not fit.
    cut: usize,
    /// The tick of each interval on which this partition is written out.
    turn: u64,
}

impl<F> Partition<F> {
    fn window_slot(&self) -> usize {
        if cfg!(feature = "broken-ack-state-no-anchor") {
            self.anchor
        } else {
            1 - self.anchor
        }
    }

    /// Whether the caller gave a state that is not durable yet.
    fn pending(&self) -> bool {
        !self.stranded && (self.needs_write || self.window.is_some())
    }
}

/// One shard's consumer-offset committer (one per shard, lives on that shard's
/// core, `!Send`).
pub struct Committer<S: Storage> {
    storage: S,
    config: CommitterConfig,
    partitions: HashMap<PartitionKey, Partition<S::File>>,
    write_pending: BTreeSet<PartitionKey>,
    sync_pending: BTreeSet<PartitionKey>,
    level_pending: BTreeSet<PartitionKey>,
    files_held: usize,
    writes_total: u64,
    epoch: Option<Instant>,
}

impl<S: Storage> Committer<S> {
    /// A committer writing through `storage`.
    pub fn new(storage: S, config: CommitterConfig) -> Self {
        assert!(
            config.open_files_max >= 1,
            "the committer needs a descriptor"
        );
        assert!(!config.tick.is_zero(), "a zero tick would spin");
        assert!(
            config.syncs_at_once >= 1,
            "the committer needs a sync at a time"
        );
        assert!(
            (DURABILITY_INTERVAL_MIN..=DURABILITY_INTERVAL_MAX)
                .contains(&config.durability_interval),
            "durability interval {:?} outside 10..=60000 ms",
            config.durability_interval
        );
        Self {
            storage,
            config,
            partitions: HashMap::new(),
            write_pending: BTreeSet::new(),
            sync_pending: BTreeSet::new(),
            level_pending: BTreeSet::new(),
            files_held: 0,
            writes_total: 0,
            epoch: None,
        }
    }

    /// One tick at `now`: writes a fresh window record for each partition in
    /// `changed` (and each whose last write or sync failed), priming partitions
    /// touched for the first time; then writes out the partitions whose turn it is
    /// or that waited a whole interval; levels `consumer.offset` where due. Errors
    /// are reported per partition and retried on the next tick.
    pub async fn tick(
        &mut self,
        now: Instant,
        changed: Vec<(PartitionKey, String, AckedState)>,
    ) -> TickReport {
        self.pass(now, changed, false).await
    }

    /// One pass: accept the states given, write their windows, then write out
    /// and level what is due (`everything`: all of it, as at close).
    async fn pass(
        &mut self,
        now: Instant,
        changed: Vec<(PartitionKey, String, AckedState)>,
        everything: bool,
    ) -> TickReport {
        let mut report = TickReport::default();
        self.accept(changed, &mut report);
        self.write_windows(now, &mut report).await;
        self.write_out(now, everything, &mut report).await;
        self.level_quiet(now, everything, &mut report).await;
        report
    }

    /// Drops everything about a partition; once this returns nothing more is
    /// written for it until it is given again in `changed` (and primed again).
    pub async fn forget(&mut self, key: PartitionKey) {
        self.write_pending.remove(&key);
        self.sync_pending.remove(&key);
        self.level_pending.remove(&key);
        if let Some(partition) = self.partitions.remove(&key) {
            if let Some(file) = partition.file {
                self.files_held -= 1;
                let _ = file.close().await;
            }
        }
    }

    /// Graceful stop: writes the final states given, syncs every partition written
    /// since its last sync, levels every `consumer.offset` and closes every
    /// descriptor. Afterwards both files of every partition without an error in the
    /// report are exact and durable.
    pub async fn close(
        &mut self,
        now: Instant,
        changed: Vec<(PartitionKey, String, AckedState)>,
    ) -> TickReport {
        let mut report = self.pass(now, changed, true).await;
        for (key, partition) in self.partitions.iter_mut() {
            if partition.stranded {
                report.errors.push((*key, stranded_message(&partition.dir)));
            } else if partition.cut > 0 {
                tracing::warn!(dir = %partition.dir, left_out = partition.cut, "stopping with acks that did not fit in consumer.ahead: the restart delivers them again");
                report.cut += partition.cut;
            }
            if let Some(file) = partition.file.take() {
                self.files_held -= 1;
                let _ = file.close().await;
            }
        }
        assert_eq!(self.files_held, 0);
        report
    }

    /// Partitions given a state that is not durable yet (for tests and metrics).
    pub fn pending_sync(&self) -> usize {
        self.partitions.values().filter(|p| p.pending()).count()
    }

    /// Whether `key`'s state is not settled: given and not durable yet, its
    /// `consumer.offset` levelling still owed, or stranded (its writes are
    /// refused). A partition reported failing is well again once it is not.
    pub fn unsettled(&self, key: &PartitionKey) -> bool {
        self.partitions
            .get(key)
            .is_some_and(|p| p.stranded || p.pending())
            || self.level_pending.contains(key)
    }

    /// The partitions whose writes wait for their writeout, and how long the
    /// oldest of those writes has waited at `now`.
    pub fn oldest_unsynced(&self, now: Instant) -> Option<(usize, Duration)> {
        let waiting = self
            .partitions
            .values()
            .filter(|p| !p.stranded)
            .filter_map(|p| p.unsynced_since);
        let (count, oldest) = waiting.fold((0, None::<Instant>), |(n, oldest), since| {
            (n + 1, Some(oldest.map_or(since, |o| o.min(since))))
        });
        oldest.map(|at| (count, now.saturating_duration_since(at)))
    }

    /// When the earliest `consumer.offset` levelling still owed comes due (`now`
    /// for one already due), `None` when none is owed. A caller that ticks only
    /// while writes are pending must tick again from then on (one tick per
    /// tick until the partition's turn), or a quiet partition's file would
    /// trail its durable frontier for as long as nothing more is acked.
    pub fn next_level_at(&self, now: Instant) -> Option<Instant> {
        self.level_pending
            .iter()
            .filter_map(|key| self.partitions.get(key))
            .filter(|p| !p.stranded)
            .map(|p| p.levelled_at.map_or(now, |t| t + self.config.level_every))
            .min()
    }

    /// `consumer.ahead` descriptors held open now.
    pub fn files_held(&self) -> usize {
        self.files_held
    }

    fn accept(
        &mut self,
        changed: Vec<(PartitionKey, String, AckedState)>,
        report: &mut TickReport,
    ) {
        for (key, dir, state) in changed {
            let turns = self.config.turns();
            let partition = self
                .partitions
                .entry(key)
                .or_insert_with(|| Partition::new(dir.clone(), hash_key(key) % turns));
            if partition.dir != dir {
                let message = format!(
                    "partition moved from {} to {dir} without being forgotten; not written",
                    partition.dir
                );
                report.errors.push((key, message));
                continue;
            }
            if partition.stranded {
                report.errors.push((key, stranded_message(&dir)));
                continue;
            }
            assert!(
                state.frontier >= partition.state.frontier,
                "partition {dir}: the frontier went back from {} to {}",
                partition.state.frontier,
                state.frontier
            );
            partition.state = state;
            partition.needs_write = true;
            self.write_pending.insert(key);
        }
    }

    async fn write_windows(&mut self, now: Instant, report: &mut TickReport) {
        let keys: Vec<PartitionKey> = self.write_pending.iter().copied().collect();
        for key in keys {
            if let Err(message) = self.write_window(key, now, report).await {
                report.errors.push((key, message));
            }
        }
    }

    /// Writes the latest state of one partition into its window (priming first).
    async fn write_window(
        &mut self,
        key: PartitionKey,
        now: Instant,
        report: &mut TickReport,
    ) -> Result<(), String> {
        if !self.partitions[&key].primed {
            self.prime(key, report).await?;
        }
        let partition = &self.partitions[&key];
        if partition.state.frontier < partition.record_frontier {
            // The file holds a frontier past what the caller gives: the caller did
            // not load it. Writing would move the durable frontier back. Nothing
            // is left to write for it until a state at or past the file's comes
            // (else it would count as pending, and keep the persister ticking).
            let refused = format!(
                "given frontier {} is below the persisted {}; not written",
                partition.state.frontier, partition.record_frontier
            );
            self.write_pending.remove(&key);
            self.partitions
                .get_mut(&key)
                .expect("partition exists")
                .needs_write = false;
            return Err(refused);
        }
        let window = partition.window_slot();
        #[cfg(not(feature = "broken-ack-state-no-anchor"))]
        assert_ne!(window, partition.anchor, "the anchor slot is never written");
        let seq = partition.seq + 1;
        let frontier = partition.state.frontier;
        let (block, kept) = slot::encode(seq, &partition.state);
        let cut = partition.state.ahead.len() - kept;
        let (file, held) = self.descriptor(key).await?;
        let written = file
            .write_cached_at((window * SLOT_BYTES) as u64, &block)
            .await;
        self.release(key, file, held).await;
        written.map_err(|e| format!("write of {AHEAD_FILE} slot {window}: {e}"))?;
        self.writes_total += 1;
        let partition = self.partitions.get_mut(&key).expect("partition exists");
        assert!(frontier >= partition.record_frontier);
        partition.seq = seq;
        partition.record_frontier = frontier;
        partition.needs_write = false;
        partition.window = Some((seq, frontier));
        partition.unsynced_since.get_or_insert(now);
        partition.written_order = self.writes_total;
        if cut > 0 && partition.cut == 0 {
            tracing::warn!(dir = %partition.dir, acked_ahead = kept + cut, left_out = cut, "the acks above the lowest unacked offset do not fit in a consumer.ahead slot: the lowest are kept, and a restart delivers the rest again (lower max_acked_ahead_per_partition to avoid this)");
        }
        partition.cut = cut;
        self.write_pending.remove(&key);
        self.sync_pending.insert(key);
        report.written += 1;
        Ok(())
    }

    /// First touch in this life: give `consumer.ahead` both slots, anchor on its
    /// newest valid slot and make the file durable as found.
    async fn prime(&mut self, key: PartitionKey, report: &mut TickReport) -> Result<(), String> {
        let path = join(&self.partitions[&key].dir, AHEAD_FILE);
        // CreateOrOpen creates the file only inside an existing directory, and
        // syncs that directory, so a created file is still there after a crash.
        let file = self
            .storage
            .open(&path, OpenMode::CreateOrOpen)
            .await
            .map_err(|e| format!("prime: open {path}: {e}"))?;
        let found = read_for_prime(&file).await;
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                let _ = file.close().await;
                return Err(format!("prime {path}: {e}"));
            }
        };
        let (anchor, record) = match found {
            Some((slot, record)) => (slot, Some(record)),
            None => (0, None),
        };
        let partition = self.partitions.get_mut(&key).expect("partition exists");
        partition.primed = true;
        partition.anchor = anchor;
        partition.anchor_seq = record.as_ref().map(|r| r.seq);
        partition.seq = record.as_ref().map_or(0, |r| r.seq);
        partition.record_frontier = record.as_ref().map_or(Offset(0), |r| r.state.frontier);
        partition.durable_frontier = record.as_ref().map(|r| r.state.frontier);
        partition.window = None;
        partition.unsynced_since = None;
        partition.levelled = None;
        partition.levelled_at = None;
        self.level_pending.insert(key);
        report.primed += 1;
        if self.files_held < self.config.open_files_max || self.evict_one(key).await {
            self.files_held += 1;
            self.partitions
                .get_mut(&key)
                .expect("partition exists")
                .file = Some(file);
        } else {
            let _ = file.close().await;
        }
        Ok(())
    }

    /// The partition's descriptor: the held one, or one opened by path, never
    /// creating, and refused unless its anchor slot still holds the anchor.
    /// Returns whether the committer holds it.
    async fn descriptor(&mut self, key: PartitionKey) -> Result<(S::File, bool), String> {
        let partition = self.partitions.get_mut(&key).expect("partition exists");
        if let Some(file) = partition.file.take() {
            return Ok((file, true));
        }
        let path = join(&partition.dir, AHEAD_FILE);
        let (anchor, anchor_seq) = (partition.anchor, partition.anchor_seq);
        let file = match self.storage.open(&path, OpenMode::Existing).await {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(self.strand(key));
            }
            Err(e) => return Err(format!("reopen {path}: {e}")),
        };
        let mut block = vec![0u8; SLOT_BYTES];
        let read = file.read_at((anchor * SLOT_BYTES) as u64, &mut block).await;
        let found = read.map(|_| slot::decode(&block).map(|r| r.seq));
        let verdict = match (found, anchor_seq) {
            (Err(e), _) => Err(format!("reopen {path}: {e}")),
            (Ok(found), expected) if found == expected => Ok(()),
            // A valid record that is not ours: the path names another file.
            (Ok(Some(_)), _) => Err(self.strand(key)),
            // Ours read as invalid: most likely a bad read; try again next tick.
            (Ok(None), _) => Err(format!("reopen {path}: the anchor slot reads invalid")),
        };
        if let Err(message) = verdict {
            let _ = file.close().await;
            return Err(message);
        }
        if self.files_held < self.config.open_files_max || self.evict_one(key).await {
            self.files_held += 1;
            return Ok((file, true));
        }
        Ok((file, false))
    }

    /// Puts a descriptor back, or closes one opened for a single operation.
    async fn release(&mut self, key: PartitionKey, file: S::File, held: bool) {
        if held {
            let partition = self.partitions.get_mut(&key).expect("partition exists");
            assert!(partition.file.is_none());
            partition.file = Some(file);
        } else {
            let _ = file.close().await;
        }
    }

    /// Closes the held descriptor of the least recently written partition whose
    /// window is durable (never `except`'s). False when there is none.
    async fn evict_one(&mut self, except: PartitionKey) -> bool {
        let victim = self
            .partitions
            .iter()
            .filter(|(key, p)| **key != except && p.file.is_some() && !p.pending())
            .min_by_key(|(_, p)| p.written_order)
            .map(|(key, _)| *key);
        let Some(victim) = victim else {
            return false;
        };
        let file = self.partitions.get_mut(&victim).and_then(|p| p.file.take());
        let file = file.expect("the victim holds a descriptor");
        self.files_held -= 1;
        let _ = file.close().await;
        true
    }

    fn strand(&mut self, key: PartitionKey) -> String {
        let partition = self.partitions.get_mut(&key).expect("partition exists");
        partition.stranded = true;
        self.write_pending.remove(&key);
        self.sync_pending.remove(&key);
        self.level_pending.remove(&key);
        let message = stranded_message(&partition.dir);
        tracing::warn!("{message}");
        message
    }

    /// Syncs the partitions whose turn it is, that waited a whole interval, or all
    /// of them when `force`; a success makes the window the anchor. Up to
    /// `syncs_at_once` syncs are in flight together: one after the other, a
    /// node acking across thousands of partitions took longer than an interval
    /// to sync them, where the device serves many at once.
    async fn write_out(&mut self, now: Instant, force: bool, report: &mut TickReport) {
        let phase = self.phase(now);
        let due: Vec<PartitionKey> = (self.sync_pending.iter())
            .filter(|key| {
                let partition = &self.partitions[key];
                let waited = partition.unsynced_since.is_some_and(|t| {
                    now.saturating_duration_since(t) >= self.config.durability_interval
                });
                // A window that may hold part of a record is rewritten in full
                // before it is synced.
                !partition.needs_write && (force || waited || partition.turn == phase)
            })
            .copied()
            .collect();
        let mut level_now = Vec::new();
        for group in due.chunks(self.config.syncs_at_once) {
            let mut taken = Vec::with_capacity(group.len());
            for &key in group {
                match self.descriptor(key).await {
                    Ok((file, held)) => taken.push((key, file, held)),
                    Err(message) => report.errors.push((key, message)),
                }
            }
            let synced = join_all(taken.iter().map(|(_, file, _)| file.sync_data())).await;
            for ((key, file, held), synced) in taken.into_iter().zip(synced) {
                self.release(key, file, held).await;
                match self.settle_sync(key, synced) {
                    Ok(()) => {
                        report.synced += 1;
                        report.durable.push(key);
                        let partition = &self.partitions[&key];
                        let level_due = force
                            || partition.levelled_at.is_none_or(|t| {
                                now.saturating_duration_since(t) >= self.config.level_every
                            });
                        if level_due {
                            level_now.push(key);
                        }
                    }
                    Err(message) => report.errors.push((key, message)),
                }
            }
        }
        self.level(&level_now, now, report).await;
    }

    /// Takes in the outcome of a sync of the partition's window.
    fn settle_sync(&mut self, key: PartitionKey, synced: io::Result<()>) -> Result<(), String> {
        let partition = self.partitions.get_mut(&key).expect("partition exists");
        if let Err(e) = synced {
            // After a failed sync the window's bytes are unknown, sector by
            // sector; the anchor was not written, so it still stands.
            partition.needs_write = true;
            self.write_pending.insert(key);
            return Err(format!("sync of {AHEAD_FILE}: {e}"));
        }
        let (seq, frontier) = partition
            .window
            .take()
            .expect("a synced window holds a record");
        partition.anchor = partition.window_slot();
        partition.anchor_seq = Some(seq);
        partition.durable_frontier = Some(frontier);
        partition.unsynced_since = None;
        self.sync_pending.remove(&key);
        self.level_pending.insert(key);
        Ok(())
    }

    /// Levels `consumer.offset` of the partitions whose turn it is (all when
    /// `force`) and whose last levelling is old enough.
    async fn level_quiet(&mut self, now: Instant, force: bool, report: &mut TickReport) {
        let phase = self.phase(now);
        let due: Vec<PartitionKey> = (self.level_pending.iter())
            .filter(|key| {
                let partition = &self.partitions[key];
                let due = partition
                    .levelled_at
                    .is_none_or(|t| now.saturating_duration_since(t) >= self.config.level_every);
                force || (due && partition.turn == phase)
            })
            .copied()
            .collect();
        self.level(&due, now, report).await;
    }

    /// Brings `consumer.offset` of each of `keys` level with its durable
    /// frontier, up to `syncs_at_once` files at once (each levelling is a
    /// write and a sync). It never lowers a file: a frontier found there that
    /// is past ours is left as it is.
    async fn level(&mut self, keys: &[PartitionKey], now: Instant, report: &mut TickReport) {
        let mut targets = Vec::with_capacity(keys.len());
        for &key in keys {
            let partition = &self.partitions[&key];
            match partition.durable_frontier {
                Some(target) if partition.levelled != Some(target) && !partition.stranded => {
                    targets.push((key, join(&partition.dir, OFFSET_FILE), target));
                }
                _ => {
                    self.level_pending.remove(&key);
                }
            }
        }
        for group in targets.chunks(self.config.syncs_at_once) {
            let storage = &self.storage;
            let levelled = join_all(
                (group.iter()).map(|(_, path, target)| level_file(storage, path, *target)),
            )
            .await;
            for ((key, path, target), levelled) in group.iter().zip(levelled) {
                let partition = self.partitions.get_mut(key).expect("partition exists");
                // After a failure it is tried again a levelling interval later
                // (or at the close), not on every tick while the fault lasts.
                partition.levelled_at = Some(now);
                match levelled {
                    Ok(wrote) => {
                        partition.levelled = Some(*target);
                        self.level_pending.remove(key);
                        report.levelled += usize::from(wrote);
                    }
                    Err(e) => report
                        .errors
                        .push((*key, format!("{LEVEL_ERROR_PREFIX}{path}: {e}"))),
                }
            }
        }
    }

    /// Which tick of the current interval `now` falls on.
    fn phase(&mut self, now: Instant) -> u64 {
        let epoch = *self.epoch.get_or_insert(now);
        let tick_ns = self
            .config
            .tick
            .min(self.config.durability_interval)
            .as_nanos();
        let ticks = now.saturating_duration_since(epoch).as_nanos() / tick_ns.max(1);
        (ticks % u128::from(self.config.turns())) as u64
    }
}

impl<F> Partition<F> {
    fn new(dir: String, turn: u64) -> Self {
        Self {
            dir,
            file: None,
            primed: false,
            stranded: false,
            anchor: 0,
            anchor_seq: None,
            seq: 0,
            record_frontier: Offset(0),
            durable_frontier: None,
            state: AckedState::default(),
            needs_write: false,
            window: None,
            unsynced_since: None,
            levelled: None,
            levelled_at: None,
            written_order: 0,
            cut: 0,
            turn,
        }
    }
}

/// Extends `consumer.ahead` to both slots, reads them and syncs the file as found.
async fn read_for_prime<F: BlockFile>(file: &F) -> io::Result<Option<(usize, slot::SlotRecord)>> {
    if file.size().await? < AHEAD_FILE_BYTES {
        file.truncate(AHEAD_FILE_BYTES).await?;
    }
    let mut image = vec![0u8; AHEAD_FILE_BYTES as usize];
    file.read_at(0, &mut image).await?;
    let found = slot::newest(&image);
    file.sync_data().await?;
    Ok(found)
}

fn stranded_message(dir: &str) -> String {
    format!(
        "consumer offsets: partition directory {dir} removed or replaced under its \
         persisted state; its acks are not persisted until the partition is dropped"
    )
}

/// A fixed hash (not the process-random one), so a partition's turn is the same on
/// every run and a seeded test replays.
fn hash_key((incarnation, partition): PartitionKey) -> u64 {
    let mut h = splitmix(incarnation.0 as u64);
    h = splitmix(h ^ (incarnation.0 >> 64) as u64);
    splitmix(h ^ u64::from(partition.0))
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
