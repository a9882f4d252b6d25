//! Retention and idle eviction for the partitions one shard owns: the reaper.
//!
//! Which cores: every shard runs one reaper task ([`run`]) over its own [`Owner`].
//! It touches a partition's log only under that partition's lock, the one commit
//! cycles, reads and purges take, so it never races them: a commit waits while a
//! segment is rolled or deleted, and a read never meets a half-deleted segment.
//!
//! Three jobs, one task:
//! - Every `check_interval` (the internal `storage.retention_check_interval_ms`,
//!   60 s), for each open log of a live topic: roll the active segment once its
//!   first record is as old as the topic's retention or `segment_ms`, whichever is
//!   shorter, then delete the sealed segments whose newest record is older than the
//!   retention. The retention is read from this shard's metadata on every run
//!   ([`RetentionOf`]), so an altered retention applies at the next run; a topic
//!   that keeps its records forever (`retention_ms` 0) is left alone.
//! - On the same cadence, logs no commit or read used for `idle_eviction`
//!   (`storage.idle_log_eviction_ms`, 30 min) are closed, freeing their file
//!   descriptors and frame cache; the next use opens the log again.
//! - Every `cold_walk_interval` (`storage.cold_retention_walk_ms`, 5 min), and once
//!   at the first check after start, the partitions this shard owns whose log is
//!   not open ([`OwnedPartitions`]) get the same retention: each is opened, reaped
//!   and closed. The same walk opens and closes once each partition with records
//!   whose log no one opened since the start, whatever its retention, so that
//!   its size reaches the observer (the `narad_partition_size_bytes` and
//!   `narad_topic_bytes` gauges) without waiting for a produce or a consume.
//!
//! Why records live between one and two retention periods: retention deletes whole
//! segments, a segment goes when its newest record is too old, and the reaper seals
//! the active segment once its oldest is as old as the retention. So a record goes
//! at most two retention periods (plus a check interval) after its commit.
//!
//! Bounds: the log deletes at most `RETENTION_SEGMENTS_PER_RUN_MAX` segments per
//! partition and run; the rest go at the next run. Opening a cold log recovers its
//! active segment (a read and an fdatasync), so the walk lists at most
//! [`COLD_WALK_LISTINGS_MAX`] partition directories and opens at most
//! [`COLD_WALK_OPENS_MAX`] logs, skipping directories that hold nothing retention
//! could delete; a cursor carries the next walk on from where one stopped.
//!
//! The debug hooks that make retention fast for black-box tests (a retention
//! override and a short check interval) live in `narad serve`, not here: this
//! module takes its durations and the retention of each topic from its caller.

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use narad_io::file::join;
use narad_io::Storage;

use super::combiner::{Owner, Slot};
use crate::ids::{IncarnationId, PartitionId};
use crate::log::{LogError, PartitionLog, RetentionOutcome};

/// Partition directories one cold walk lists at most.
pub const COLD_WALK_LISTINGS_MAX: usize = 1024;

/// Cold logs one walk opens at most.
pub const COLD_WALK_OPENS_MAX: usize = 64;

const _: () = assert!(COLD_WALK_OPENS_MAX <= COLD_WALK_LISTINGS_MAX);

/// A topic's retention, as the reaper applies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retention {
    /// Nothing is ever deleted (`retention_ms` 0).
    Forever,
    /// Sealed segments whose newest record is older than this are deleted.
    Age(Duration),
}

impl Retention {
    /// From a topic's `retention_ms`: 0 keeps records forever.
    pub fn from_ms(retention_ms: u64) -> Retention {
        match retention_ms {
            0 => Retention::Forever,
            ms => Retention::Age(Duration::from_millis(ms)),
        }
    }
}

/// The current retention of a topic incarnation in this shard's metadata:
/// `(topic, incarnation) -> retention`, `None` when it is not live.
pub type RetentionOf = Box<dyn Fn(&str, IncarnationId) -> Option<Retention>>;

/// One partition this shard owns.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct OwnedPartition {
    pub topic: Arc<str>,
    pub incarnation: IncarnationId,
    pub partition: PartitionId,
}

/// The partitions of live topics this shard owns now, for the cold walk.
pub type OwnedPartitions = Box<dyn Fn() -> Vec<OwnedPartition>>;

/// The reaper's cadences.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReaperConfig {
    /// Between two retention runs over the open logs (and idle checks).
    pub check_interval: Duration,
    /// Between two cold walks.
    pub cold_walk_interval: Duration,
    /// A log unused for this long is closed.
    pub idle_eviction: Duration,
}

impl Default for ReaperConfig {
    fn default() -> Self {
        ReaperConfig {
            check_interval: Duration::from_secs(60),
            cold_walk_interval: Duration::from_secs(300),
            idle_eviction: Duration::from_secs(1800),
        }
    }
}

/// What a pass did, for the log and for tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReapTotals {
    /// Logs whose retention was enforced.
    pub partitions_reaped: usize,
    /// Active segments sealed by age.
    pub segments_rolled: usize,
    /// Sealed segments deleted.
    pub segments_deleted: usize,
    /// Bytes of frames deleted.
    pub bytes_deleted: u64,
    /// Logs that could not be opened, rolled or trimmed (they are tried again).
    pub failures: usize,
}

/// Whether the log was open before the reaper came, which decides whether it
/// stays open after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Visit {
    /// Reap only a log that is open; never open one.
    OpenOnly,
    /// Open the log if it is closed, and close it again after.
    Cold,
}

/// Runs the reaper of `owner` until [`Owner::close_all`] stops it.
pub async fn run<S: Storage>(owner: Rc<Owner<S>>, config: ReaperConfig, owned: OwnedPartitions) {
    assert!(
        !config.check_interval.is_zero() && !config.cold_walk_interval.is_zero(),
        "reaper intervals are positive"
    );
    let mut walk = ColdWalk::default();
    // The series exist from the start, so a loop that never succeeds shows as
    // stale rather than missing (the node reads the shard furthest behind).
    note_success("retention");
    note_success("cold_retention");
    let mut next_check = Instant::now() + config.check_interval;
    // After a start every log is closed: the first walk comes with the first
    // check rather than a whole walk interval later.
    let mut next_walk = next_check;
    while !owner.closing.get() {
        let pause = next_check
            .min(next_walk)
            .saturating_duration_since(Instant::now());
        futures_lite::future::or(narad_io::rt::sleep(pause), owner.reaper_wake.wait()).await;
        if owner.closing.get() {
            break;
        }
        let now = Instant::now();
        if now >= next_check {
            let totals = owner.reap_open(narad_io::rt::unix_ms()).await;
            owner.evict_idle(Instant::now(), config.idle_eviction).await;
            if totals.failures == 0 {
                note_success("retention");
            }
            next_check = Instant::now() + config.check_interval;
        }
        if now >= next_walk {
            let totals = walk.step(&owner, owned(), narad_io::rt::unix_ms()).await;
            metrics::counter!("narad_cold_retention_swept_total")
                .increment(totals.segments_deleted as u64);
            if totals.failures == 0 {
                note_success("cold_retention");
            }
            next_walk = Instant::now() + config.cold_walk_interval;
        }
    }
}

/// Sets `narad_poller_last_success_timestamp_seconds{loop}`: the Unix time of
/// the loop's last pass without a failure, or of its start (the node reads the
/// shard furthest behind).
pub fn note_success(loop_name: &'static str) {
    metrics::gauge!("narad_poller_last_success_timestamp_seconds", "loop" => loop_name)
        .set(narad_io::rt::unix_ms() as f64 / 1000.0);
}

/// Where the cold walk goes on from: the walk visits the owned partitions in
/// order, and a walk that hits its bounds leaves the rest to the next one.
#[derive(Debug, Default)]
pub struct ColdWalk {
    after: Option<OwnedPartition>,
}

impl ColdWalk {
    /// One walk over `owned` (in any order), from where the last one stopped.
    pub async fn step<S: Storage>(
        &mut self,
        owner: &Owner<S>,
        mut owned: Vec<OwnedPartition>,
        now_ms: u64,
    ) -> ReapTotals {
        owned.sort();
        owned.dedup();
        let start = self
            .after
            .as_ref()
            .map_or(0, |after| owned.partition_point(|p| p <= after));
        let mut totals = ReapTotals::default();
        let (mut listings, mut opens) = (0, 0);
        for i in 0..owned.len() {
            if listings == COLD_WALK_LISTINGS_MAX
                || opens == COLD_WALK_OPENS_MAX
                || owner.closing.get()
            {
                break;
            }
            let candidate = &owned[(start + i) % owned.len()];
            self.after = Some(candidate.clone());
            if owner.is_open(candidate) {
                continue;
            }
            let retention = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                owner.retention_now(&candidate.topic, candidate.incarnation, candidate.partition)
            }));
            let Ok(retention) = retention else {
                metrics::counter!("narad_cold_retention_panics_total").increment(1);
                tracing::error!(topic = %candidate.topic, partition = candidate.partition.0, "the cold retention walk panicked on a partition; skipped");
                totals.failures += 1;
                continue;
            };
            let reap = matches!(retention, Some(Retention::Age(_)));
            let measure = retention.is_some()
                && !owner.was_measured(candidate.incarnation, candidate.partition);
            if !reap && !measure {
                continue;
            }
            listings += 1;
            if !owner.worth_a_cold_visit(candidate).await {
                continue;
            }
            // The topic may have been deleted while the directory was listed:
            // its purge found no slot, and a slot made now would open (and so
            // recreate) a directory already set aside.
            if !owner.is_live(&candidate.topic, candidate.incarnation, candidate.partition) {
                continue;
            }
            opens += 1;
            let slot = owner.slot(&candidate.topic, candidate.incarnation, candidate.partition);
            // A panic on one partition skips it (counted, as the reference's
            // `cold_retention_panics_total`) rather than end the walk.
            let visit = async {
                if reap {
                    owner
                        .reap_slot(&slot, now_ms, Visit::Cold, &mut totals)
                        .await;
                } else {
                    owner.measure_slot(&slot).await;
                }
            };
            let visited =
                futures_lite::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(visit)).await;
            if visited.is_err() {
                metrics::counter!("narad_cold_retention_panics_total").increment(1);
                tracing::error!(topic = %candidate.topic, partition = candidate.partition.0, "the cold retention walk panicked on a partition; skipped");
                totals.failures += 1;
            }
        }
        owner.forget_unused();
        assert!(opens <= COLD_WALK_OPENS_MAX && listings <= COLD_WALK_LISTINGS_MAX);
        totals
    }
}

/// Rolls the active segment when due and deletes what the retention lets go;
/// returns what was deleted and the first failure. A roll that fails (say, the
/// disk is full and the next segment cannot be prepared) does not keep the sealed
/// segments from going: freeing them is what such a disk needs. Only a log its
/// failure poisoned is left alone.
async fn enforce<S: Storage>(
    log: &mut PartitionLog<S>,
    retention: Duration,
    segment_ms: u64,
    now_ms: u64,
    totals: &mut ReapTotals,
) -> (RetentionOutcome, Option<LogError>) {
    let retention_ms = (retention.as_millis() as u64).max(1);
    let rolled = log
        .maybe_roll_at_age(now_ms, segment_ms.min(retention_ms))
        .await;
    let roll_failure = match rolled {
        Ok(rolled) => {
            totals.segments_rolled += usize::from(rolled);
            None
        }
        Err(e) if log.is_poisoned() => return (RetentionOutcome::default(), Some(e)),
        Err(e) => Some(e),
    };
    match log.enforce_retention_of(now_ms, retention_ms).await {
        Ok(outcome) => (outcome, roll_failure),
        Err(e) => {
            if matches!(
                e,
                LogError::Io {
                    op: "remove segment",
                    ..
                }
            ) {
                metrics::counter!("narad_errors_total", "component" => "storage", "kind" => "retention_unlink")
                    .increment(1);
            }
            (RetentionOutcome::default(), roll_failure.or(Some(e)))
        }
    }
}

impl<S: Storage> Owner<S> {
    /// Sets where the reaper reads each topic's current retention. Without it,
    /// every topic gets the log configuration's `retention_ms`.
    pub fn set_retention(&self, retention: RetentionOf) {
        *self.retention.borrow_mut() = Some(retention);
    }

    /// The retention of a partition now, or `None` when it is not live.
    fn retention_now(
        &self,
        topic: &str,
        incarnation: IncarnationId,
        partition: PartitionId,
    ) -> Option<Retention> {
        if !self.is_live(topic, incarnation, partition) {
            return None;
        }
        match &*self.retention.borrow() {
            Some(retention_of) => retention_of(topic, incarnation),
            None => Some(Retention::from_ms(self.config.retention_ms)),
        }
    }

    /// Whether the owner is closing (the node stops).
    pub fn is_closing(&self) -> bool {
        self.closing.get()
    }

    /// Whether the partition's log is open (or in use right now).
    pub fn is_open(&self, partition: &OwnedPartition) -> bool {
        self.slots
            .borrow()
            .get(&(partition.incarnation, partition.partition))
            .is_some_and(|slot| slot.log.borrow().is_some() || Rc::strong_count(slot) > 1)
    }

    /// One retention run over every open log.
    pub async fn reap_open(&self, now_ms: u64) -> ReapTotals {
        let slots: Vec<Rc<Slot<S>>> = self.slots.borrow().values().cloned().collect();
        let mut totals = ReapTotals::default();
        for slot in slots {
            if self.closing.get() {
                break;
            }
            // A panic on one partition skips it, as in the cold walk: ending
            // the run, it would end every later run at the same partition, and
            // no other partition of the shard would be reaped again.
            let run = self.reap_slot(&slot, now_ms, Visit::OpenOnly, &mut totals);
            let ran =
                futures_lite::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(run)).await;
            if ran.is_err() {
                metrics::counter!("narad_errors_total", "component" => "storage", "kind" => "retention_panic")
                    .increment(1);
                tracing::error!(topic = %slot.topic, partition = slot.partition.0, "retention panicked on a partition; skipped");
                totals.failures += 1;
            }
        }
        totals
    }

    /// Rolls and trims one partition's log under its lock.
    async fn reap_slot(&self, slot: &Slot<S>, now_ms: u64, visit: Visit, totals: &mut ReapTotals) {
        let _guard = slot.lock.lock().await;
        if slot.retired.get() || self.closing.get() {
            return;
        }
        let retention = self.retention_now(&slot.topic, slot.incarnation, slot.partition);
        let Some(Retention::Age(retention)) = retention else {
            return;
        };
        let taken = slot.log.borrow_mut().take();
        let was_open = taken.is_some();
        let mut log = match (taken, visit) {
            (Some(log), _) => log,
            (None, Visit::OpenOnly) => return,
            (None, Visit::Cold) => match self.open_log(slot).await {
                Ok(log) => log,
                Err(_) => {
                    totals.failures += 1;
                    return;
                }
            },
        };
        let oldest_before = log.oldest_offset();
        let started = Instant::now();
        let (outcome, failure) =
            enforce(&mut log, retention, self.config.segment_ms, now_ms, totals).await;
        totals.partitions_reaped += 1;
        if let Some(observer) = &slot.observer {
            observer.retention_ran(started.elapsed());
            // Even a failed run may have rolled or deleted some segments.
            observer.reshaped(&log.stats());
            if outcome.segments_deleted > 0 {
                observer.retained(&outcome);
            }
        }
        if outcome.segments_deleted > 0 {
            totals.segments_deleted += outcome.segments_deleted;
            totals.bytes_deleted += outcome.bytes_deleted;
            tracing::info!(
                topic = %slot.topic,
                partition = slot.partition.0,
                segments_deleted = outcome.segments_deleted,
                bytes_deleted = outcome.bytes_deleted,
                oldest_offset_before = oldest_before.0,
                oldest_offset = log.oldest_offset().0,
                retention_ms = retention.as_millis() as u64,
                "retention deleted sealed segments"
            );
            if let Some(on_retained) = &*self.on_retained.borrow() {
                on_retained(
                    &slot.topic,
                    slot.incarnation,
                    slot.partition,
                    log.oldest_offset(),
                );
            }
        }
        if let Some(e) = failure {
            totals.failures += 1;
            tracing::warn!(topic = %slot.topic, partition = slot.partition.0, error = %e, "retention run failed; the next run tries again");
        }
        if was_open || log.is_poisoned() {
            self.put_back(slot, log).await;
        } else if let Err(e) = self.close_log(slot, log).await {
            tracing::warn!(topic = %slot.topic, partition = slot.partition.0, error = %e, "closing a log after the cold retention walk failed");
        }
    }

    /// Opens a closed log and closes it again, so that its observer learns its
    /// shape (the size gauges of a partition no one used since the start).
    async fn measure_slot(&self, slot: &Slot<S>) {
        let _guard = slot.lock.lock().await;
        if slot.retired.get()
            || self.closing.get()
            || slot.log.borrow().is_some()
            || !self.is_live(&slot.topic, slot.incarnation, slot.partition)
        {
            return;
        }
        let Ok(log) = self.open_log(slot).await else {
            return;
        };
        if log.is_poisoned() {
            self.put_back(slot, log).await;
            return;
        }
        if let Err(e) = self.close_log(slot, log).await {
            tracing::warn!(topic = %slot.topic, partition = slot.partition.0, error = %e, "closing a log after measuring it failed");
        }
    }

    /// Closes the logs no commit or read used for `idle`; returns how many.
    pub async fn evict_idle(&self, now: Instant, idle: Duration) -> usize {
        let is_idle = |slot: &Slot<S>| now.saturating_duration_since(slot.last_used.get()) >= idle;
        let idle_slots: Vec<Rc<Slot<S>>> = self
            .slots
            .borrow()
            .values()
            .filter(|slot| slot.log.borrow().is_some() && is_idle(slot))
            .cloned()
            .collect();
        let mut closed = 0;
        for slot in idle_slots {
            if self.closing.get() {
                break;
            }
            let _guard = slot.lock.lock().await;
            // A commit or read that got the lock first made it busy again.
            if slot.retired.get() || !is_idle(&slot) {
                continue;
            }
            if !self.close_slot_log(&slot, "idle").await {
                continue;
            }
            tracing::debug!(topic = %slot.topic, partition = slot.partition.0, "closed an idle partition log");
            closed += 1;
        }
        self.forget_unused();
        let observer = self.observer.borrow().clone();
        if let Some(observer) = observer.filter(|_| closed > 0) {
            observer.idle_evicted(closed);
        }
        closed
    }

    /// Whether a cold partition's directory holds anything retention could
    /// delete: a sealed segment, or an active one with bytes in it. Skipping the
    /// rest spares them an open (a recovery scan and an fdatasync).
    async fn worth_a_cold_visit(&self, partition: &OwnedPartition) -> bool {
        let dir =
            super::partition_dir(&partition.topic, partition.incarnation, partition.partition);
        let names = match self.storage.list(&dir).await {
            Ok(names) => names,
            Err(e) => {
                tracing::warn!(%dir, error = %e, "cold retention walk cannot list a partition");
                return false;
            }
        };
        let segments: Vec<&String> = names.iter().filter(|n| n.ends_with(".log")).collect();
        match segments.as_slice() {
            [] => false,
            [only] => self
                .storage
                .size_of(&join(&dir, only))
                .await
                .is_ok_and(|size| size > 0),
            _ => true,
        }
    }
}
