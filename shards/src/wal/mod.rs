//! The ingress WAL: where a produce becomes durable before its 202.
//!
//! One WAL per shard, under `ingress/shard-<i>/`, written only by that shard's
//! core. Map:
//! - [`frame`]: the frame and record encoding.
//! - [`segment`]: segment names, the recovery scan and the torn-tail rule.
//! - [`checkpoint`]: the 4 KiB checkpoint block.
//! - [`progress`]: the done-set that computes the checkpoint (sans-IO).
//! - `writer`: the group-commit flush loop and segment rolls.
//! - `place`: a roll's next segment put in place, a shortage of descriptors or
//!   memory waited out rather than latched.
//! - `upkeep`: the lazy checkpoint flush, compaction and segment preparation.
//! - `room`: the free space an append or a preparation needs where nothing was
//!   prepared, refused (not latched) without it.
//! - [`reader`]: the dispatcher's sequential reader.
//!
//! Group commit. An append encodes its frame into a shared staging buffer, takes
//! the next sequence number, wakes the flush loop and waits. The flush loop swaps the
//! staging buffer for a spare (so appends keep staging during the I/O), writes what
//! it took in one write per run of at most 16 MiB, `fdatasync`s, and only then
//! releases the callers in that batch. A staging buffer that reaches
//! [`WalConfig::flush_bytes_target`] is sealed as a batch of its own and the next
//! appends start another, so a burst becomes several batches in a pipeline: the
//! flush loop writes the next batch while the previous one's `fdatasync` runs
//! (never more than one write and one sync at a time, and the next write only
//! after the previous write completed: they share the partial block between
//! them), and appenders released by a sync stage again while the device works. A caller whose record is staged has no way
//! to withdraw it: dropping the future does not unstage, and the record is flushed,
//! replayed and dispatched like any other; the caller simply never learns the
//! outcome. A batch (`append_many`) stages its records back to back under one
//! borrow of the staging state, so they take consecutive sequence numbers.
//!
//! The latch. A failed write or `fdatasync` fails every caller of the batch in
//! flight and every append after it, until the process restarts: a second write on
//! top of a region of unknown content could be acknowledged and then lost. A roll
//! short of descriptors or memory, which has written nothing of the new segment,
//! waits the shortage out for a few seconds first (`place`).
//!
//! Memory: two staging buffers, each kept at most [`STAGING_KEEP_BYTES`] between
//! batches and never grown past [`WalConfig::staging_bytes_max`] (appenders wait
//! for the flush instead); one chunk buffer per reader; the segment list; the
//! flushed batches kept for readers ([`WalConfig::reader_cache_bytes_max`]). A
//! record the dispatcher holds on its way to a partition shares the kept batch
//! it lies in (`StoredRecord::shared`), which then outlives its eviction until
//! the record is committed: the dispatcher counts those bytes as held, within
//! its own bound.

pub mod checkpoint;
pub mod dispatched;
pub mod frame;
pub mod key;
mod place;
pub mod progress;
pub mod reader;
mod recent;
mod recover;
mod room;
pub mod segment;
mod upkeep;
mod writer;

use recent::{PositionMark, RecentBatch};

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::future::poll_fn;
use std::io;
use std::ops::Range;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use narad_io::Storage;

pub use frame::{IngressRecord, SharedRecord, StoredRecord};
pub use progress::DispatchProgress;
pub use reader::WalReader;

use crate::ids::Seq;

/// A staging buffer larger than this is shrunk back after its flush.
pub const STAGING_KEEP_BYTES: usize = 4 << 20;

/// How the WAL lays out and paces its work.
#[derive(Clone, Debug)]
pub struct WalConfig {
    /// Segment size; a segment rolls before a frame would cross it.
    pub segment_bytes_max: u64,
    /// `storage.ingress_wal_prealloc`: prepare the next segment off the append path
    /// (recycling a compacted one, else zero-filling) so appends overwrite blocks
    /// that are already allocated and an `fdatasync` never changes the file size.
    pub prealloc: bool,
    /// Staged bytes past which appenders wait for the flush in progress.
    pub staging_bytes_max: usize,
    /// A staging buffer holding this many bytes is sealed as one batch and later
    /// appends stage into the next: the size of one write in a sustained burst.
    pub flush_bytes_target: usize,
    /// How long a stored checkpoint may sit written but not yet synced (one
    /// that passes the start of a segment is synced at once).
    pub checkpoint_sync_delay: Duration,
    /// The shortest time between two writes of the checkpoint block: the stores
    /// of an interval go out as one write of the newest value. Each write is a
    /// page-cache write the ring hands to a worker thread, which then runs on
    /// the shard's core; a dispatcher moves the checkpoint with every commit,
    /// over a thousand times a second under load.
    pub checkpoint_store_interval: Duration,
    /// Compacted segments kept for recycling.
    pub spare_segments_max: usize,
    /// A fully dispatched active segment past this size is rotated so it can be
    /// compacted.
    pub rotate_dispatched_bytes_min: u64,
    /// Bytes of recently flushed batches kept in memory for readers, so a
    /// dispatcher that keeps up never reads the device (O_DIRECT has no page
    /// cache). A reader that falls further behind reads from disk.
    pub reader_cache_bytes_max: usize,
    /// A batch of one write run, taken with nothing in flight, goes out as one
    /// durable (`O_DSYNC`) write. Off, every batch is written and then synced,
    /// the sync beside the next batch's write: the pipeline that batches too
    /// large for one run always take. Tests turn it off to reach the pipeline
    /// with small batches.
    pub durable_writes: bool,
    /// The bytes free on the WAL's file system when last measured, kept up to
    /// date by the caller (`None`: not measured). A segment is zero-filled only
    /// with room for two: preparing one ahead must not take the last space a
    /// file system has, which the partition logs and the metadata need too.
    /// Recycling a spare takes no space and is not held back. Nor does the WAL
    /// start a segment that grows (none was prepared) without room for two: an
    /// append that needs one is refused with [`WalError::NoRoom`] instead, for
    /// a write that ran out of space would latch the WAL until a restart.
    pub disk_room: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
}

impl Default for WalConfig {
    fn default() -> Self {
        Self {
            segment_bytes_max: SEGMENT_BYTES,
            prealloc: true,
            staging_bytes_max: 32 << 20,
            flush_bytes_target: 1 << 20,
            checkpoint_sync_delay: Duration::from_millis(250),
            checkpoint_store_interval: Duration::from_millis(10),
            spare_segments_max: 2,
            rotate_dispatched_bytes_min: 1 << 20,
            reader_cache_bytes_max: 8 << 20,
            durable_writes: true,
            disk_room: None,
        }
    }
}

/// The size of a segment unless configured otherwise.
pub const SEGMENT_BYTES: u64 = 64 << 20;

/// Why a WAL operation failed.
#[derive(Debug, Clone)]
pub enum WalError {
    /// The record breaks the format's limits; nothing was staged.
    Invalid(&'static str),
    /// A write or sync failed; the WAL refuses appends until restart.
    Latched(Rc<str>),
    /// Recovery or a read met a corrupt frame where only good frames may be.
    Corrupt(Rc<str>),
    /// An I/O error outside the append path (opening, reading).
    Io(Rc<str>),
    /// The append needs a new segment, none is prepared, and the file system
    /// lacks the room to grow one (`WalConfig::disk_room`): nothing was staged
    /// and the WAL goes on; the append can be retried once space is freed.
    NoRoom {
        /// The free space the append waits for, as the WAL counts it.
        needed_bytes: u64,
    },
    /// The WAL is shutting down.
    Closed,
}

impl fmt::Display for WalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WalError::Invalid(why) => write!(f, "invalid WAL record: {why}"),
            WalError::Latched(why) => {
                write!(f, "ingress WAL failed and is latched until restart: {why}")
            }
            WalError::Corrupt(why) => write!(f, "ingress WAL corrupt: {why}"),
            WalError::Io(why) => write!(f, "ingress WAL I/O error: {why}"),
            WalError::NoRoom { needed_bytes } => write!(
                f,
                "the ingress WAL needs {} MiB free on the broker's disk to take more records (for its next segment and a segment to spare); produces are refused until space is freed",
                needed_bytes.div_ceil(1 << 20)
            ),
            WalError::Closed => write!(f, "ingress WAL is closed"),
        }
    }
}

impl std::error::Error for WalError {}

impl From<io::Error> for WalError {
    fn from(e: io::Error) -> Self {
        WalError::Io(e.to_string().into())
    }
}

/// Counters for benchmarks and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalStats {
    /// Records appended (durable or not).
    pub records: u64,
    /// Flushes (group commits) that completed.
    pub flushes: u64,
    /// Syncs of segment files: `fdatasync`s, and durable (`O_DSYNC`) writes,
    /// each of which carries its own.
    pub syncs: u64,
    /// Frame bytes staged.
    pub frame_bytes: u64,
    /// Bytes handed to the device for segments, padding included.
    pub device_bytes: u64,
    /// Segments rolled.
    pub rolls: u64,
    /// Segments compacted away.
    pub compactions: u64,
    /// Rolls that found a prepared segment ready.
    pub prepared_rolls: u64,
    /// Batches whose callers were released only once the next batch's write,
    /// one large enough to go out in pieces, had been submitted.
    pub releases_after_next_write: u64,
    /// Segments prepared by recycling a compacted one (a rename).
    pub segments_recycled: u64,
    /// Segments prepared by zero-filling a new file (a segment's worth of
    /// device writes).
    pub segments_zero_filled: u64,
    /// Rolls that left a growing segment (one made when nothing was prepared)
    /// for a prepared one: as soon as one is ready, however little it holds.
    pub early_rolls: u64,
    /// Checkpoint `fdatasync`s.
    pub checkpoint_syncs: u64,
    /// Segment preparations that failed (each is followed by a pause).
    pub preparations_failed: u64,
    /// Zero-fills not started for want of room (`WalConfig::disk_room`).
    pub preparations_held: u64,
    /// Appends refused because they needed a segment that would grow and the
    /// file system lacked room for it (`WalError::NoRoom`).
    pub appends_refused_for_room: u64,
}

/// A batch of staged frames, as the flush loop takes it.
struct Job {
    buf: Vec<u8>,
    /// Positions in `buf` where a new segment starts.
    roll_points: Vec<usize>,
    first_seq: Seq,
    end_seq: Seq,
    /// When the flush loop took the batch, which is when its write began
    /// (reset at the take: a sealed batch may wait in the queue first).
    taken: Instant,
}

/// What a WAL reports about its group commits as they become durable (for
/// metrics). Called on the WAL's shard, once per batch, after its callers are
/// released.
pub trait WalObserver {
    /// A batch of `records` records became durable `took` after the flush loop
    /// took it: its write, and its sync when the write was not a durable one
    /// (whose start waits for the previous batch's sync, in the pipeline).
    /// `device_bytes_total` is every byte the WAL has handed to the device
    /// since it opened, padding and rewritten tail blocks included.
    fn synced(&self, took: Duration, records: u64, device_bytes_total: u64);
}

/// State shared by appenders, the flush loop, the upkeep task and readers, all on
/// one core. Never borrowed across an `.await`.
struct Shared {
    staging: Vec<u8>,
    spare: Vec<u8>,
    /// Positions in `staging` where a new segment starts.
    roll_points: Vec<usize>,
    /// Full staging buffers waiting for the flush loop, oldest first.
    sealed: VecDeque<Job>,
    /// Bytes in `sealed`.
    sealed_bytes: usize,
    next_seq: Seq,
    /// Every sequence number below this is durable.
    durable_next: Seq,
    /// Since when records have waited to become durable with none becoming
    /// so: set when the first is staged into an all-durable WAL, moved on by
    /// every flush that leaves some waiting, cleared by one that leaves none.
    /// What [`Wal::stalled_for`] reads.
    waiting_since: Option<std::time::Instant>,
    /// `next_seq` when the flush in progress took its buffer.
    inflight_end: Seq,
    staging_waiters: Vec<Waker>,
    inflight_waiters: Vec<Waker>,
    durable_listeners: Vec<Waker>,
    flusher: Option<Waker>,
    latched: Option<Rc<str>>,
    closing: bool,
    /// Bytes of the active segment, staged frames included.
    active_bytes: u64,
    /// First sequence numbers of the segments, oldest first; the last is active.
    segments: VecDeque<Seq>,
    roll_requested: bool,
    /// Rolls staged that the flush loop has not made yet.
    rolls_pending: u64,
    /// The active segment was made empty (no prepared file was ready) and each
    /// write past its end grows it: once a prepared segment is ready, the WAL
    /// rolls onto it rather than grow the file to a full segment.
    active_grows: bool,
    /// The active segment grows, and its blocks up to a full segment are
    /// reserved (`room::reserve_growing`, at its first write): no write to it
    /// can run out of space.
    active_reserved: bool,
    spares: Vec<String>,
    prep_ready: bool,
    prep_running: bool,
    /// No preparation starts before this instant (after one failed).
    prep_retry_at: Option<std::time::Instant>,
    checkpoint_wanted: Seq,
    checkpoint_written: Seq,
    checkpoint_synced: Seq,
    /// The last store or sync of the checkpoint failed, and none has synced
    /// it since: what a restart would replay grows, and nothing compacts.
    checkpoint_failing: bool,
    upkeep_signal: bool,
    upkeep: Option<Waker>,
    /// Durable batches for readers, oldest first, at most the configured bytes
    /// (the newest is kept even alone past it).
    recent: VecDeque<RecentBatch>,
    recent_bytes: usize,
    marks: VecDeque<PositionMark>,
    /// Where recovery resumed past damaged frames below the checkpoint: a
    /// reader must start after such damage, never walk into it from the
    /// segment's start, however many marks flushes have added since.
    pinned_marks: Vec<PositionMark>,
    stats: WalStats,
}

impl Shared {
    /// Queues the staging buffer as a batch of its own and starts a new one.
    fn seal(&mut self, capacity: usize) {
        let first_seq = self.sealed.back().map_or(self.inflight_end, |j| j.end_seq);
        let fresh = if self.spare.capacity() > 0 {
            std::mem::take(&mut self.spare)
        } else {
            Vec::with_capacity(capacity + capacity / 2)
        };
        let job = Job {
            buf: std::mem::replace(&mut self.staging, fresh),
            roll_points: std::mem::take(&mut self.roll_points),
            first_seq,
            end_seq: self.next_seq,
            taken: Instant::now(),
        };
        self.sealed_bytes += job.buf.len();
        self.sealed.push_back(job);
    }

    /// Asks for a roll onto the prepared segment when the active one grows.
    /// Skipped while a roll is already staged: it takes the prepared file, and a
    /// second one right behind it would find none and make another growing file.
    /// (A roll inside the batch the flush loop is writing can still take it
    /// first; the growing file that follows is rolled away in turn once the next
    /// preparation is ready.)
    fn roll_onto_prepared_if_growing(&mut self) {
        let roll_staged = !self.roll_points.is_empty()
            || self.sealed.iter().any(|job| !job.roll_points.is_empty());
        if self.active_grows && self.prep_ready && !roll_staged {
            self.roll_requested = true;
        }
    }

    fn wake_upkeep(&mut self) {
        self.upkeep_signal = true;
        if let Some(waker) = self.upkeep.take() {
            waker.wake();
        }
    }
}

struct Inner<S: Storage> {
    storage: S,
    dir: String,
    config: WalConfig,
    /// Masks the client bytes of every frame written (format 2).
    key: frame::FrameKey,
    shared: RefCell<Shared>,
    tasks: RefCell<Vec<narad_io::rt::JoinHandle<()>>>,
    observer: RefCell<Option<Rc<dyn WalObserver>>>,
    /// The done-set a graceful stop left, until the dispatcher takes it; then
    /// the one its stop leaves, until the close writes it.
    dispatched: RefCell<Option<DispatchProgress>>,
}

/// A handle to one shard's ingress WAL. Clones share it.
pub struct Wal<S: Storage> {
    inner: Rc<Inner<S>>,
}

impl<S: Storage> Clone for Wal<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<S: Storage> Wal<S> {
    /// Opens (or creates) the WAL in `dir`: recovers the segments, truncates a torn
    /// tail of the last one, reads and re-syncs the checkpoint, and starts the flush
    /// loop and the upkeep task on this executor.
    pub async fn open(storage: S, dir: &str, config: WalConfig) -> Result<Self, WalError> {
        assert!(config.segment_bytes_max >= 2 * narad_io::BLOCK_BYTES as u64);
        storage.create_dir_all(dir).await?;
        let recovered = recover::recover(&storage, dir).await?;
        let key = key::load_or_create(&storage, dir, &recovered.segments).await?;
        let recover::Recovered {
            active,
            segments,
            next_seq,
            checkpoint,
            checkpoint_file,
            spares,
            prep_ready,
            resumed,
        } = recovered;
        let dispatched = dispatched::take(&storage, dir, checkpoint, next_seq).await?;
        let active_grows = active.file_bytes() < narad_io::align_up(config.segment_bytes_max);
        let shared = Shared {
            staging: Vec::new(),
            spare: Vec::new(),
            roll_points: Vec::new(),
            sealed: VecDeque::new(),
            sealed_bytes: 0,
            next_seq,
            durable_next: next_seq,
            waiting_since: None,
            inflight_end: next_seq,
            staging_waiters: Vec::new(),
            inflight_waiters: Vec::new(),
            durable_listeners: Vec::new(),
            flusher: None,
            latched: None,
            closing: false,
            active_bytes: active.len(),
            segments,
            roll_requested: false,
            rolls_pending: 0,
            active_grows,
            active_reserved: false,
            spares,
            prep_ready,
            prep_running: false,
            prep_retry_at: None,
            checkpoint_wanted: checkpoint,
            checkpoint_written: checkpoint,
            checkpoint_synced: checkpoint,
            checkpoint_failing: false,
            upkeep_signal: false,
            upkeep: None,
            recent: VecDeque::new(),
            recent_bytes: 0,
            marks: VecDeque::new(),
            pinned_marks: resumed
                .into_iter()
                .map(|(segment, seq, pos)| PositionMark { seq, segment, pos })
                .collect(),
            stats: WalStats::default(),
        };
        let wal = Wal {
            inner: Rc::new(Inner {
                storage,
                dir: dir.to_string(),
                config,
                key,
                shared: RefCell::new(shared),
                tasks: RefCell::new(Vec::new()),
                observer: RefCell::new(None),
                dispatched: RefCell::new(dispatched),
            }),
        };
        wal.inner
            .shared
            .borrow_mut()
            .roll_onto_prepared_if_growing();
        let active_first = *wal
            .inner
            .shared
            .borrow()
            .segments
            .back()
            .expect("a segment");
        let flusher =
            narad_io::rt::spawn_local(writer::flush_loop(wal.clone(), active, active_first));
        let upkeep = narad_io::rt::spawn_local(upkeep::upkeep_loop(wal.clone(), checkpoint_file));
        wal.inner.tasks.borrow_mut().extend([flusher, upkeep]);
        if wal.inner.config.prealloc {
            upkeep::start_preparation(&wal);
        }
        Ok(wal)
    }

    /// Appends one record and returns its sequence number once it is durable.
    pub async fn append(&self, record: &IngressRecord<'_>) -> Result<Seq, WalError> {
        self.append_many(std::slice::from_ref(record))
            .await
            .map(|seqs| seqs.start)
    }

    /// Appends records with consecutive sequence numbers and returns them once the
    /// last is durable. Every record is checked before any is staged.
    pub async fn append_many(&self, records: &[IngressRecord<'_>]) -> Result<Range<Seq>, WalError> {
        for record in records {
            record.check().map_err(WalError::Invalid)?;
        }
        let total_bytes: usize = records.iter().map(IngressRecord::frame_len).sum();
        self.wait_for_staging_room(total_bytes).await?;
        let seqs = self.stage(records, total_bytes)?;
        if seqs.is_empty() {
            return Ok(seqs);
        }
        self.wait_durable(Seq(seqs.end.0 - 1)).await?;
        Ok(seqs)
    }

    /// Stages `records` (`total_bytes` of frames) with consecutive sequence
    /// numbers, or none of them when a segment they need has no room.
    fn stage(
        &self,
        records: &[IngressRecord<'_>],
        total_bytes: usize,
    ) -> Result<Range<Seq>, WalError> {
        let mut guard = self.inner.shared.borrow_mut();
        let sh = &mut *guard;
        let config = &self.inner.config;
        sh.admit(config, records, total_bytes as u64)?;
        if sh.staging.len() >= config.flush_bytes_target {
            sh.seal(config.flush_bytes_target);
        }
        // One growth for the whole batch, not one per frame that overflows.
        sh.staging.reserve(total_bytes);
        let first = sh.next_seq;
        if first == sh.durable_next && !records.is_empty() {
            sh.waiting_since = Some(std::time::Instant::now());
        }
        for record in records {
            let frame_len = record.frame_len() as u64;
            let full = sh.active_bytes > 0
                && sh.active_bytes + frame_len > self.inner.config.segment_bytes_max;
            if full || (sh.roll_requested && sh.active_bytes > 0) {
                sh.roll_points.push(sh.staging.len());
                sh.rolls_pending += 1;
                sh.segments.push_back(sh.next_seq);
                sh.active_bytes = 0;
                sh.roll_requested = false;
            }
            record.encode_frame(sh.next_seq, Some(&self.inner.key), &mut sh.staging);
            sh.active_bytes += frame_len;
            sh.stats.frame_bytes += frame_len;
            sh.next_seq = sh.next_seq.next();
        }
        sh.stats.records += records.len() as u64;
        if let Some(waker) = sh.flusher.take() {
            waker.wake();
        }
        Ok(first..sh.next_seq)
    }

    /// Waits while the staging buffer is too full to take `bytes` more (unless it
    /// is empty: one oversized batch always gets in).
    async fn wait_for_staging_room(&self, bytes: usize) -> Result<(), WalError> {
        poll_fn(|cx| {
            let mut sh = self.inner.shared.borrow_mut();
            if let Some(why) = &sh.latched {
                return Poll::Ready(Err(WalError::Latched(why.clone())));
            }
            if sh.closing {
                return Poll::Ready(Err(WalError::Closed));
            }
            let staged = sh.staging.len() + sh.sealed_bytes;
            if staged == 0 || staged + bytes <= self.inner.config.staging_bytes_max {
                return Poll::Ready(Ok(()));
            }
            sh.staging_waiters.push(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Waits until `seq` is durable, or the WAL latched before it was.
    async fn wait_durable(&self, seq: Seq) -> Result<(), WalError> {
        poll_fn(|cx| {
            let mut sh = self.inner.shared.borrow_mut();
            if sh.durable_next > seq {
                return Poll::Ready(Ok(()));
            }
            if let Some(why) = &sh.latched {
                return Poll::Ready(Err(WalError::Latched(why.clone())));
            }
            if seq < sh.inflight_end {
                sh.inflight_waiters.push(cx.waker().clone());
            } else {
                sh.staging_waiters.push(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }

    /// Waits until some record at or past `seq` is durable (for the dispatcher),
    /// or the WAL latched or closed.
    pub async fn wait_durable_past(&self, seq: Seq) {
        poll_fn(|cx| {
            let mut sh = self.inner.shared.borrow_mut();
            if sh.durable_next > seq || sh.latched.is_some() || sh.closing {
                return Poll::Ready(());
            }
            // The dispatcher races this wait against timers and drops it when
            // they win, then waits again: a task already listening must not be
            // added once more per round, or an idle WAL would collect a waker
            // clone every backstop until the task's reference count overflows.
            let waker = cx.waker();
            if !sh.durable_listeners.iter().any(|w| w.will_wake(waker)) {
                sh.durable_listeners.push(waker.clone());
            }
            Poll::Pending
        })
        .await
    }

    /// Tasks waiting in [`Wal::wait_durable_past`] for the next flush.
    pub fn durable_listener_count(&self) -> usize {
        self.inner.shared.borrow().durable_listeners.len()
    }

    /// Reports every group commit that becomes durable from now on to
    /// `observer` (replacing any observer set before).
    pub fn observe(&self, observer: Rc<dyn WalObserver>) {
        *self.inner.observer.borrow_mut() = Some(observer);
    }

    /// Every sequence number below this is durable.
    pub fn durable_next(&self) -> Seq {
        self.inner.shared.borrow().durable_next
    }

    /// The sequence number the next append will take.
    pub fn next_seq(&self) -> Seq {
        self.inner.shared.borrow().next_seq
    }

    /// Stores the dispatch checkpoint (the first record not yet committed). It is
    /// written at once and made durable within the checkpoint sync delay; the WAL
    /// compacts only behind a durable value. Values never move backwards.
    pub fn store_checkpoint(&self, seq: Seq) {
        let mut sh = self.inner.shared.borrow_mut();
        assert!(
            seq <= sh.durable_next,
            "checkpoint {seq} past the durable end {}",
            sh.durable_next
        );
        if seq > sh.checkpoint_wanted {
            sh.checkpoint_wanted = seq;
            sh.wake_upkeep();
        }
    }

    /// The checkpoint as last stored (it may not be durable yet).
    pub fn checkpoint(&self) -> Seq {
        self.inner.shared.borrow().checkpoint_wanted
    }

    /// The checkpoint as last made durable.
    pub fn synced_checkpoint(&self) -> Seq {
        self.inner.shared.borrow().checkpoint_synced
    }

    /// Records durable here and not yet committed to their partitions: the
    /// durable end minus the checkpoint as last stored. What a restart would
    /// replay is more by the moves not yet synced (up to the checkpoint sync
    /// delay's worth of commits), which are done and not a backlog; a gauge of
    /// it would show a busy node a quarter second behind with nothing waiting.
    pub fn dispatch_backlog_records(&self) -> u64 {
        let sh = self.inner.shared.borrow();
        sh.durable_next.0 - sh.checkpoint_wanted.0
    }

    /// Whether the failure latch is set.
    pub fn is_latched(&self) -> bool {
        self.inner.shared.borrow().latched.is_some()
    }

    /// How long records have waited to become durable with none becoming so,
    /// at `now`; `None` when every staged record is durable. A disk that
    /// stops answering shows here (the flush in flight never completes),
    /// as does one too slow for its load; a latched WAL is reported by
    /// [`Wal::is_latched`] instead.
    pub fn stalled_for(&self, now: std::time::Instant) -> Option<std::time::Duration> {
        let sh = self.inner.shared.borrow();
        if sh.latched.is_some() {
            return None;
        }
        sh.waiting_since
            .map(|since| now.saturating_duration_since(since))
    }

    /// Whether the dispatch checkpoint's last store or sync failed and none
    /// has made it durable since: a restart would commit again more and more
    /// records, and compaction waits, so the WAL's files grow.
    pub fn checkpoint_failing(&self) -> bool {
        self.inner.shared.borrow().checkpoint_failing
    }

    /// Counters so far.
    pub fn stats(&self) -> WalStats {
        self.inner.shared.borrow().stats
    }

    /// Segment files on disk (the active one included).
    pub fn segment_count(&self) -> usize {
        self.inner.shared.borrow().segments.len()
    }

    /// A reader starting at `from`, for the dispatcher.
    pub fn reader(&self, from: Seq) -> WalReader<S> {
        WalReader::new(self.clone(), from)
    }

    /// Flushes what is staged, makes the checkpoint durable and stops the tasks;
    /// then writes the done-set left by [`Wal::leave_dispatched`], if it is
    /// worth writing and still true of what is on disk.
    /// Appends after this fail with [`WalError::Closed`].
    pub async fn close(&self) {
        {
            let mut sh = self.inner.shared.borrow_mut();
            sh.closing = true;
            if let Some(waker) = sh.flusher.take() {
                waker.wake();
            }
            sh.wake_upkeep();
            // A dispatcher waiting for records learns of the close now, not
            // at its next timer.
            for waker in sh.durable_listeners.drain(..) {
                waker.wake();
            }
        }
        let tasks: Vec<_> = self.inner.tasks.borrow_mut().drain(..).collect();
        for task in tasks {
            task.await;
        }
        self.store_dispatched().await;
    }
}
