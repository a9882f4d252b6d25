//! The partitions this shard owns: their logs, the commit combiner, and the
//! purge of a deleted topic (reads and stats are in [`super::reads`]).
//!
//! Which cores: one [`Owner`] per shard; every partition placed on the shard is
//! served there and only there. Generic over [`Storage`], so the simulation runs
//! the same combiner on the fault-injecting disk.
//!
//! A partition's log is opened on first use and kept open until it has been idle
//! for a while (the reaper in [`super::reaper`] closes it; the next use opens it
//! again). Everything that touches it (a commit cycle, a read, stats, a purge, the
//! reaper) holds the partition's lock, a local semaphore of one: the log is
//! single-writer and its reads move its cache.
//!
//! The commit combiner. A commit batch never waits in the caller: it joins the
//! partition's queue, and if no cycle is running one is started. A cycle takes the
//! lock, drains every batch queued by then, checks under the lock that each batch's
//! incarnation is the live one in this shard's metadata snapshot (else it is refused
//! with nothing appended: the dispatcher returns the records to its WAL and checks
//! them again), leaves out batches whose caller stopped waiting, and commits the rest
//! as one run with one `commit_durable` (one write, one fdatasync, one read-back).
//! Every batch in the cycle gets the same outcome; batches that arrived meanwhile
//! make the next cycle. So a busy partition gets fewer, larger commits. A run past
//! the log's commit limit (`commit_bytes_max`, 64 MiB: a backlog of large records
//! drained at once) is cut into pieces committed one after another; a batch is
//! answered with its offsets once all of it is committed, and refused if a piece
//! failed before its end.
//!
//! A poisoned log (a failed fdatasync, or a failed roll or repair) refuses commits
//! until it is reopened; the owner reopens it on the next cycle at most once a
//! second. Recovery keeps every complete commit whose frames verify, including
//! one whose fdatasync or read-back failed (unless the repair of the block it
//! shared with the commit before it erased its start): its producers were told
//! it failed, retry, and the records are then there twice (at least once, never
//! lost); recovery cuts only a torn tail.
//!
//! Storage events (a commit's device time, a log's shape after an open, a commit
//! or the reaper) go to the [`StorageObserver`] set with [`Owner::set_observer`],
//! through a per-partition observer kept in the slot.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_channel::oneshot;
use narad_io::rt::{LocalLock, Notify};
use narad_io::Storage;

use super::observe::{PartitionObserver, StorageObserver};
use super::reaper::RetentionOf;
use super::types::{CommitError, CommitReply, OwnedRecord, PartitionStats};
use crate::ids::{IncarnationId, Offset, PartitionId};
use crate::lines::LineThrottle;
use crate::log::cache::FrameCache;
use crate::log::{commit_bytes_bound, LogConfig, LogError, PartitionLog, RecordRef};

/// How long a poisoned or unopenable log waits before it is tried again.
pub const REOPEN_BACKOFF: Duration = Duration::from_secs(1);

/// A commit batch waiting for a cycle.
struct Pending {
    incarnation: IncarnationId,
    records: Vec<OwnedRecord>,
    reply: oneshot::Sender<CommitReply>,
}

/// One owned partition. Its log is `Some` while open and not in use; a commit cycle
/// or a read takes it out under `lock` and puts it back before letting go.
pub(super) struct Slot<S: Storage> {
    pub(super) topic: Arc<str>,
    pub(super) incarnation: IncarnationId,
    pub(super) partition: PartitionId,
    pub(super) lock: LocalLock,
    pub(super) log: RefCell<Option<PartitionLog<S>>>,
    /// The open log's recent-frame cache: reads of the committed tail are served
    /// from it without the lock, so they never wait for a commit in progress.
    pub(super) cache: RefCell<Option<Rc<RefCell<FrameCache>>>>,
    queue: RefCell<Vec<Pending>>,
    cycling: Cell<bool>,
    pub(super) retired: Cell<bool>,
    /// No open attempt before this instant (after a failure).
    retry_open_at: Cell<Option<Instant>>,
    /// The last commit or read that used the log: idle eviction closes a log not
    /// used for `storage.idle_log_eviction_ms`.
    pub(super) last_used: Cell<Instant>,
    /// Told of this partition's storage events; `None` without an observer.
    pub(super) observer: Option<Rc<dyn PartitionObserver>>,
}

/// Failed opens, and failed commits, of partition logs are logged at most
/// once per this long on a shard.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(10);

pub(super) type SlotKey = (IncarnationId, PartitionId);

/// Whether an incarnation is the live topic under its name with the partition, in
/// this shard's metadata: `(topic, incarnation, partition) -> live`.
pub type Liveness = Box<dyn Fn(&str, IncarnationId, PartitionId) -> bool>;

/// Called after a commit made records visible:
/// `(topic, incarnation, partition, high watermark)`.
pub type OnVisible = Box<dyn Fn(&Arc<str>, IncarnationId, PartitionId, Offset)>;

/// Called after retention deleted segments of a partition:
/// `(topic, incarnation, partition, oldest offset left)`.
pub type OnRetained = Box<dyn Fn(&Arc<str>, IncarnationId, PartitionId, Offset)>;

/// The partitions of one shard.
pub struct Owner<S: Storage> {
    pub(super) storage: S,
    pub(super) config: LogConfig,
    live: Liveness,
    reopen_backoff: Duration,
    pub(super) slots: RefCell<HashMap<SlotKey, Rc<Slot<S>>>>,
    on_visible: RefCell<Option<OnVisible>>,
    pub(super) on_retained: RefCell<Option<OnRetained>>,
    /// The topics' current retention; `None` applies `config.retention_ms`.
    pub(super) retention: RefCell<Option<RetentionOf>>,
    /// Set by [`Owner::close_all`]: the reaper stops and opens nothing more.
    pub(super) closing: Cell<bool>,
    /// Wakes the reaper early (to stop).
    pub(super) reaper_wake: Notify,
    /// Told of storage events, if set.
    pub(super) observer: RefCell<Option<Rc<dyn StorageObserver>>>,
    /// Logs open now, in a slot or taken out by a task using them.
    open_logs: Cell<usize>,
    /// Logs this owner keeps open at most: an open past it first closes the
    /// least recently used log nobody is using (see [`Owner::set_open_logs_max`]).
    open_logs_max: Cell<usize>,
    /// Opens the budget made close another log: one line a minute at most.
    budget_lines: LineThrottle,
    /// Failed opens and failed commits: thousands of partitions failing at
    /// once (a directory gone, a full disk) log one line of each every
    /// [`ERROR_LOG_EVERY`], not one each.
    open_errors: LineThrottle,
    commit_errors: LineThrottle,
    /// Partitions whose log was opened since this owner started, so whose
    /// shape the observer was told: the cold walk opens the others once.
    measured: RefCell<HashSet<SlotKey>>,
    /// The shape of each log closed whole since it was last open (idle
    /// eviction, the cold walk): nothing changes a closed log's files, since
    /// whatever would (a commit, retention) opens it first, and an open drops
    /// the entry. Stats answer from here without opening the log. A log whose
    /// read-back failed after its sync is not remembered: its files may hold
    /// more than its shape, which only an open finds.
    pub(super) closed_shapes: RefCell<HashMap<SlotKey, PartitionStats>>,
}

impl<S: Storage> Owner<S> {
    pub fn new(storage: S, config: LogConfig, live: Liveness) -> Rc<Self> {
        Self::with_reopen_backoff(storage, config, live, REOPEN_BACKOFF)
    }

    /// [`Owner::new`] with another pause before a failed log is opened again.
    pub fn with_reopen_backoff(
        storage: S,
        config: LogConfig,
        live: Liveness,
        reopen_backoff: Duration,
    ) -> Rc<Self> {
        Rc::new(Owner {
            storage,
            config,
            live,
            reopen_backoff,
            slots: RefCell::new(HashMap::new()),
            on_visible: RefCell::new(None),
            on_retained: RefCell::new(None),
            retention: RefCell::new(None),
            closing: Cell::new(false),
            reaper_wake: Notify::default(),
            observer: RefCell::new(None),
            open_logs: Cell::new(0),
            open_logs_max: Cell::new(usize::MAX),
            budget_lines: LineThrottle::new(Duration::from_secs(60)),
            open_errors: LineThrottle::new(ERROR_LOG_EVERY),
            commit_errors: LineThrottle::new(ERROR_LOG_EVERY),
            measured: RefCell::new(HashSet::new()),
            closed_shapes: RefCell::new(HashMap::new()),
        })
    }

    /// Sets who is told of storage events (the metrics). Set it before the first
    /// use: partitions already in use keep the observer they had.
    pub fn set_observer(&self, observer: Rc<dyn StorageObserver>) {
        *self.observer.borrow_mut() = Some(observer);
    }

    /// Logs open now, those a task is using included.
    pub fn open_log_count(&self) -> usize {
        self.open_logs.get()
    }

    /// Keeps at most `max` logs open (each holds up to three descriptors: its
    /// active segment, that segment's `O_DSYNC` descriptor and one sealed
    /// segment for reads), so a node with more partitions than descriptors
    /// closes and reopens logs instead of failing their commits with `EMFILE`.
    /// A log in use is never closed for it, so the count can pass `max` while
    /// every open log is busy.
    pub fn set_open_logs_max(&self, max: usize) {
        self.open_logs_max.set(max.max(1));
    }

    /// Closes least recently used logs nobody is using until one more log fits
    /// the budget, or nothing more can be closed. Takes no lock it would wait
    /// for: the caller holds its own slot's lock, and another opener may hold
    /// another.
    async fn make_room_for_a_log(&self, opening: &Slot<S>) {
        let mut closed = 0;
        while self.open_logs.get() >= self.open_logs_max.get() && !self.closing.get() {
            let mut candidates: Vec<Rc<Slot<S>>> = self
                .slots
                .borrow()
                .values()
                .filter(|slot| !std::ptr::eq(slot.as_ref(), opening))
                .filter(|slot| slot.log.borrow().is_some())
                .cloned()
                .collect();
            candidates.sort_by_key(|slot| slot.last_used.get());
            let mut evicted = false;
            for slot in candidates {
                let Some(_guard) = slot.lock.try_lock() else {
                    continue;
                };
                if !self.close_slot_log(&slot, "over the open-log budget").await {
                    continue;
                }
                closed += 1;
                evicted = true;
                break;
            }
            if !evicted {
                break;
            }
        }
        if closed == 0 {
            return;
        }
        let observer = self.observer.borrow().clone();
        if let Some(observer) = observer {
            observer.idle_evicted(closed);
        }
        if self.budget_lines.due(Instant::now()).is_some() {
            tracing::info!(
                open_logs_max = self.open_logs_max.get(),
                "partition logs in use exceed the open-log budget: the least recently used are closed and opened again when next needed (raise RLIMIT_NOFILE to keep more open)"
            );
        }
    }

    /// Closes a log taken out of `slot` whose use is over, and remembers its
    /// shape for stats if it closed cleanly.
    pub(super) async fn close_log(
        &self,
        slot: &Slot<S>,
        log: PartitionLog<S>,
    ) -> Result<(), LogError> {
        let stats = log.stats();
        let settled = !log.tail_may_differ_on_disk();
        let closed = log.close().await;
        self.note_log_closed();
        if closed.is_ok() && settled && !slot.retired.get() {
            self.closed_shapes.borrow_mut().insert(
                (slot.incarnation, slot.partition),
                PartitionStats {
                    partition: slot.partition,
                    oldest_offset: stats.oldest_offset,
                    next_offset: stats.next_offset,
                    segments: stats.segment_count,
                    size_bytes: stats.size_bytes,
                    oldest_segment_ms: stats.oldest_segment_ms,
                },
            );
        }
        closed
    }

    /// Closes the log in `slot` (the caller holds its lock), with its cache,
    /// which gives back its share of the pool even if something still holds
    /// the slot. Returns whether there was a log to close; a failed close is
    /// logged, naming `why` it was closed.
    pub(super) async fn close_slot_log(&self, slot: &Slot<S>, why: &str) -> bool {
        let Some(log) = slot.log.borrow_mut().take() else {
            return false;
        };
        slot.cache.borrow_mut().take();
        if let Err(e) = self.close_log(slot, log).await {
            tracing::warn!(topic = %slot.topic, partition = slot.partition.0, error = %e, why, "closing a partition log failed");
        }
        true
    }

    /// Counts a log closed (or dropped after a failure) that was counted open.
    pub(super) fn note_log_closed(&self) {
        let open = self.open_logs.get();
        assert!(open > 0, "a log is closed at most once after its open");
        self.open_logs.set(open - 1);
    }

    /// Sets what is told when commits make records visible (the consumers).
    pub fn set_on_visible(&self, on_visible: OnVisible) {
        *self.on_visible.borrow_mut() = Some(on_visible);
    }

    /// Sets what is told when retention deletes records (the consumers, whose
    /// frontier must not stay below them).
    pub fn set_on_retained(&self, on_retained: OnRetained) {
        *self.on_retained.borrow_mut() = Some(on_retained);
    }

    /// Whether the node's metadata has this partition of this incarnation now.
    pub fn is_live(&self, topic: &str, incarnation: IncarnationId, partition: PartitionId) -> bool {
        (self.live)(topic, incarnation, partition)
    }

    pub(super) fn slot(
        &self,
        topic: &Arc<str>,
        incarnation: IncarnationId,
        partition: PartitionId,
    ) -> Rc<Slot<S>> {
        self.slots
            .borrow_mut()
            .entry((incarnation, partition))
            .or_insert_with(|| {
                let observer = self
                    .observer
                    .borrow()
                    .as_ref()
                    .map(|observer| observer.partition(topic, incarnation, partition));
                Rc::new(Slot {
                    topic: topic.clone(),
                    incarnation,
                    partition,
                    lock: LocalLock::default(),
                    log: RefCell::new(None),
                    cache: RefCell::new(None),
                    queue: RefCell::new(Vec::new()),
                    cycling: Cell::new(false),
                    retired: Cell::new(false),
                    retry_open_at: Cell::new(None),
                    last_used: Cell::new(Instant::now()),
                    observer,
                })
            })
            .clone()
    }

    /// Queues a commit batch; `reply` gets its outcome. Never waits.
    pub fn commit(
        self: &Rc<Self>,
        topic: Arc<str>,
        incarnation: IncarnationId,
        partition: PartitionId,
        records: Vec<OwnedRecord>,
        reply: oneshot::Sender<CommitReply>,
    ) {
        if self.closing.get() {
            // After `close_all`, a commit would reopen a log the stop then
            // leaves mid-write; its records stay in their WAL for the restart.
            let _ = reply.send(Err(CommitError::Failed("the owner is stopping".into())));
            return;
        }
        if !self.is_live(&topic, incarnation, partition) {
            let _ = reply.send(Err(CommitError::IncarnationMismatch));
            return;
        }
        let slot = self.slot(&topic, incarnation, partition);
        let mut queue = slot.queue.borrow_mut();
        // Batches whose callers gave up (they send the records again) go now,
        // not at the next cycle: while a slow cycle runs, every retry would
        // otherwise add a copy of its records to the queue.
        queue.retain(|pending| !pending.reply.is_canceled());
        queue.push(Pending {
            incarnation,
            records,
            reply,
        });
        drop(queue);
        if !slot.cycling.replace(true) {
            let owner = self.clone();
            narad_io::rt::spawn_local(async move { owner.run_cycles(slot).await });
        }
    }

    /// Runs commit cycles until the queue is empty.
    async fn run_cycles(self: Rc<Self>, slot: Rc<Slot<S>>) {
        loop {
            let permit = slot.lock.lock().await;
            let batch: Vec<Pending> = std::mem::take(&mut *slot.queue.borrow_mut());
            if batch.is_empty() {
                drop(permit);
                slot.cycling.set(false);
                return;
            }
            self.cycle(&slot, batch).await;
            drop(permit);
        }
    }

    /// One cycle, under the partition's lock.
    async fn cycle(&self, slot: &Slot<S>, batch: Vec<Pending>) {
        let live =
            !slot.retired.get() && self.is_live(&slot.topic, slot.incarnation, slot.partition);
        let mut run = Vec::with_capacity(batch.len());
        for pending in batch {
            if self.closing.get() {
                // The stop retired every slot: not a change of incarnation,
                // which the dispatcher would report as one.
                let stopping = CommitError::Failed("the owner is stopping".into());
                let _ = pending.reply.send(Err(stopping));
            } else if !live || pending.incarnation != slot.incarnation {
                let _ = pending.reply.send(Err(CommitError::IncarnationMismatch));
            } else if pending.reply.is_canceled() {
                // Its caller gave up and will send the records again.
            } else {
                run.push(pending);
            }
        }
        if run.is_empty() {
            return;
        }
        let refs: Vec<RecordRef<'_>> = run
            .iter()
            .flat_map(|p| p.records.iter())
            .map(|r| RecordRef {
                key: r.key.as_deref(),
                payload: &r.payload,
                mask: r.mask,
            })
            .collect();
        // Usually one piece; a run past the log's commit limit (a backlog of large
        // records) is committed as several, in order.
        let mut first: Option<Offset> = None;
        let mut committed = 0usize;
        let mut failure = None;
        for piece in commit_pieces(&refs, self.config.commit_bytes_max) {
            match self.commit_records(slot, &refs[piece.clone()]).await {
                Ok(range) => {
                    let first = *first.get_or_insert(range.start);
                    assert_eq!(
                        range.start.0,
                        first.0 + committed as u64,
                        "the pieces of a run take consecutive offsets"
                    );
                    committed = piece.end;
                    if let Some(on_visible) = &*self.on_visible.borrow() {
                        on_visible(&slot.topic, slot.incarnation, slot.partition, range.end);
                    }
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        drop(refs);
        // A batch is answered with its offsets only if all of it committed. One
        // cut by a failed piece is refused whole and sent again by its caller, so
        // its committed part is delivered twice: at least once, never lost.
        let mut at = 0usize;
        for pending in run {
            let end = at + pending.records.len();
            let answer = match first {
                Some(first) if end <= committed => {
                    Ok(Offset(first.0 + at as u64)..Offset(first.0 + end as u64))
                }
                _ => Err(failure
                    .clone()
                    .expect("a batch left uncommitted met a failure")),
            };
            at = end;
            let _ = pending.reply.send(answer);
        }
    }

    /// Commits one piece of a run with one `commit_durable`.
    async fn commit_records(
        &self,
        slot: &Slot<S>,
        records: &[RecordRef<'_>],
    ) -> Result<std::ops::Range<Offset>, CommitError> {
        let mut log = self.open_log(slot).await.map_err(CommitError::Failed)?;
        slot.last_used.set(Instant::now());
        let result = log.commit_durable(records, narad_io::rt::unix_ms()).await;
        if let (Some(observer), Some(io)) = (&slot.observer, log.last_commit_io()) {
            observer.committed(&io, &log.stats());
        }
        self.put_back(slot, log).await;
        result.map_err(|e| {
            if let Some(unlogged) = self.commit_errors.due(Instant::now()) {
                tracing::warn!(topic = %slot.topic, partition = slot.partition.0, error = %e, failures_not_logged_since_the_last_line = unlogged, "partition commit failed (retried)");
            }
            CommitError::Failed(e.to_string())
        })
    }

    /// Puts a log taken out by [`Owner::open_log`] back in its slot, or closes it
    /// when a failed fdatasync poisoned it (the next use reopens it, recovering).
    pub(super) async fn put_back(&self, slot: &Slot<S>, log: PartitionLog<S>) {
        if let Some(poisoned) = self.return_log(slot, log) {
            // Boxed: a rare path whose future (the log and its close) would
            // otherwise be carried, kilobytes of it, by every read and commit
            // that awaits this.
            let _ = Box::pin(poisoned.close()).await;
        }
    }

    /// The part of [`Owner::put_back`] that does not wait: puts the log back,
    /// or retires a poisoned one (the slot reopens after the backoff) and hands
    /// it back to be closed.
    pub(super) fn return_log(
        &self,
        slot: &Slot<S>,
        log: PartitionLog<S>,
    ) -> Option<PartitionLog<S>> {
        if !log.is_poisoned() {
            *slot.log.borrow_mut() = Some(log);
            return None;
        }
        tracing::error!(topic = %slot.topic, partition = slot.partition.0, "partition log poisoned (a failed write, fdatasync or roll); it will be reopened");
        metrics::counter!("narad_errors_total", "component" => "storage", "kind" => "fsync_poisoned")
            .increment(1);
        slot.retry_open_at
            .set(Some(Instant::now() + self.reopen_backoff));
        slot.cache.borrow_mut().take();
        self.note_log_closed();
        Some(log)
    }

    /// Takes the slot's log out (opening it if needed); the caller puts it back.
    pub(super) async fn open_log(&self, slot: &Slot<S>) -> Result<PartitionLog<S>, String> {
        if let Some(log) = slot.log.borrow_mut().take() {
            return Ok(log);
        }
        // Boxed: opening is rare, and its future (recovery's reads) would
        // otherwise be carried, kilobytes of it, by every read and commit that
        // awaits this.
        Box::pin(self.open_closed_log(slot)).await
    }

    /// [`Owner::open_log`] of a slot whose log is closed.
    async fn open_closed_log(&self, slot: &Slot<S>) -> Result<PartitionLog<S>, String> {
        // Whatever the open finds is the shape from now on, and a failed open
        // is an error to report, not a shape.
        self.closed_shapes
            .borrow_mut()
            .remove(&(slot.incarnation, slot.partition));
        if let Some(at) = slot.retry_open_at.get() {
            if Instant::now() < at {
                return Err("partition log failed recently; retrying shortly".into());
            }
        }
        self.make_room_for_a_log(slot).await;
        let dir = super::partition_dir(&slot.topic, slot.incarnation, slot.partition);
        match open_at_or_above_settled(&self.storage, &dir, &self.config).await {
            Ok(log) => {
                slot.retry_open_at.set(None);
                *slot.cache.borrow_mut() = Some(log.shared_cache());
                self.open_logs.set(self.open_logs.get() + 1);
                self.measured
                    .borrow_mut()
                    .insert((slot.incarnation, slot.partition));
                if let Some(observer) = &slot.observer {
                    observer.reshaped(&log.stats());
                }
                Ok(log)
            }
            Err(e) => {
                if let Some(unlogged) = self.open_errors.due(Instant::now()) {
                    tracing::error!(%dir, error = %e, failures_not_logged_since_the_last_line = unlogged, "cannot open partition log");
                }
                slot.retry_open_at
                    .set(Some(Instant::now() + self.reopen_backoff));
                Err(format!("cannot open partition log {dir}: {e}"))
            }
        }
    }

    /// Drops the slots nobody uses, so the map holds only partitions in use: a
    /// slot goes when its log is closed, nothing is queued or failing, and the map
    /// holds its only reference (so no task holds it or waits on its lock, and the
    /// next use makes a fresh one without two locks ever guarding one log).
    pub(super) fn forget_unused(&self) {
        self.slots.borrow_mut().retain(|_, slot| {
            Rc::strong_count(slot) > 1
                || slot.log.borrow().is_some()
                || slot.cycling.get()
                || !slot.queue.borrow().is_empty()
                || slot.retry_open_at.get().is_some()
        });
    }

    /// Whether the partition's log was opened since this owner started.
    pub(super) fn was_measured(&self, incarnation: IncarnationId, partition: PartitionId) -> bool {
        self.measured.borrow().contains(&(incarnation, partition))
    }

    /// Closes every log of `incarnation`; later commits to it are refused.
    pub async fn purge(&self, incarnation: IncarnationId) {
        self.measured
            .borrow_mut()
            .retain(|&(id, _)| id != incarnation);
        self.closed_shapes
            .borrow_mut()
            .retain(|&(id, _), _| id != incarnation);
        let retired: Vec<Rc<Slot<S>>> = {
            let mut slots = self.slots.borrow_mut();
            let keys: Vec<SlotKey> = slots
                .keys()
                .filter(|(id, _)| *id == incarnation)
                .copied()
                .collect();
            keys.iter().filter_map(|k| slots.remove(k)).collect()
        };
        // All before the first wait: a close of one of them meanwhile (idle
        // eviction) must not remember its shape again.
        for slot in &retired {
            slot.retired.set(true);
        }
        for slot in retired {
            let _guard = slot.lock.lock().await;
            slot.cache.borrow_mut().take();
            let log = slot.log.borrow_mut().take();
            if let Some(log) = log {
                if let Err(e) = log.close().await {
                    tracing::warn!(topic = %slot.topic, error = %e, "closing a deleted topic's log failed");
                }
                self.note_log_closed();
            }
        }
        let observer = self.observer.borrow().clone();
        if let Some(observer) = observer {
            observer.purged(incarnation);
        }
    }

    /// Closes every open log (shutdown) and stops the reaper.
    pub async fn close_all(&self) {
        self.closing.set(true);
        self.reaper_wake.notify();
        let slots: Vec<Rc<Slot<S>>> = self.slots.borrow_mut().drain().map(|(_, s)| s).collect();
        for slot in slots {
            slot.retired.set(true);
            let _guard = slot.lock.lock().await;
            slot.cache.borrow_mut().take();
            let log = slot.log.borrow_mut().take();
            if let Some(log) = log {
                let _ = log.close().await;
                self.note_log_closed();
            }
        }
    }
}

/// Cuts `records` into consecutive pieces that each fit one commit of at most
/// `commit_bytes_max` bytes ([`commit_bytes_bound`]); a record too large for any
/// commit makes a piece of its own, which the log refuses. No records make one
/// empty piece, which commits nothing and answers the high watermark.
fn commit_pieces(
    records: &[RecordRef<'_>],
    commit_bytes_max: usize,
) -> Vec<std::ops::Range<usize>> {
    let mut pieces = Vec::with_capacity(1);
    let mut start = 0;
    let mut bytes = 0usize;
    for (i, record) in records.iter().enumerate() {
        let bound = commit_bytes_bound(record.key, record.payload.len());
        if i > start && bytes + bound > commit_bytes_max {
            pieces.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += bound;
    }
    if start < records.len() || records.is_empty() {
        pieces.push(start..records.len());
    }
    pieces
}

/// Opens a partition's log and makes sure its next offset is above every offset
/// its consumers settled (see [`PartitionLog::advance_to`]): a log that lost its
/// visible tail must not hand those offsets out again, or the records committed
/// there would count as acked.
async fn open_at_or_above_settled<S: Storage>(
    storage: &S,
    dir: &str,
    config: &crate::log::LogConfig,
) -> Result<PartitionLog<S>, LogError> {
    let mut log = PartitionLog::open(storage.clone(), dir, config.clone()).await?;
    let settled = match crate::consume::state::load(storage, dir).await {
        Ok(settled) => settled,
        Err(e) => {
            let _ = log.close().await;
            return Err(LogError::Io {
                op: "read the consumer state",
                source: e,
            });
        }
    };
    let floor = settled
        .ahead
        .last()
        .map_or(settled.frontier, |&last| Offset(last.0 + 1))
        .max(settled.frontier);
    if let Err(e) = log.advance_to(floor).await {
        let _ = log.close().await;
        return Err(e);
    }
    Ok(log)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs<'a>(sizes: &[usize], payload: &'a [u8]) -> Vec<RecordRef<'a>> {
        sizes
            .iter()
            .map(|&n| RecordRef {
                key: None,
                payload: &payload[..n],
                mask: 0,
            })
            .collect()
    }

    #[test]
    fn pieces_cover_the_run_in_order_within_the_limit() {
        let payload = vec![7u8; 10_000];
        let sizes = [10, 9_000, 3_000, 10_000, 1, 1, 5_000, 10_000, 200];
        let records = refs(&sizes, &payload);
        let limit = 12_000;
        let pieces = commit_pieces(&records, limit);
        let mut next = 0;
        for piece in &pieces {
            assert_eq!(piece.start, next, "{pieces:?}");
            assert!(!piece.is_empty());
            let bytes: usize = records[piece.clone()]
                .iter()
                .map(|r| commit_bytes_bound(r.key, r.payload.len()))
                .sum();
            assert!(bytes <= limit, "{piece:?} holds {bytes} bytes");
            next = piece.end;
        }
        assert_eq!(next, records.len());
        // Greedy: no piece could have taken the next record.
        for pair in pieces.windows(2) {
            let bytes: usize = records[pair[0].start..=pair[0].end]
                .iter()
                .map(|r| commit_bytes_bound(r.key, r.payload.len()))
                .sum();
            assert!(bytes > limit, "{pieces:?}");
        }
    }

    #[test]
    fn a_record_past_the_limit_is_a_piece_of_its_own_and_no_records_one_empty_piece() {
        let payload = vec![7u8; 10_000];
        let records = refs(&[10, 10_000, 10], &payload);
        assert_eq!(commit_pieces(&records, 1_000), vec![0..1, 1..2, 2..3]);
        assert_eq!(commit_pieces(&[], 1_000), vec![0..0]);
        assert_eq!(commit_pieces(&records, 1 << 20), vec![0..3]);
    }
}
