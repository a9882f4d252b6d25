//! The partition log: one directory of segment files per partition, the only place
//! a record becomes visible to consumers.
//!
//! Which cores: every shard runs partition logs, and each log lives on the one
//! shard that owns its partition. A log is `!Send`, single-writer (`&mut self`), and
//! takes no lock; the commit combiner above it serialises commits.
//!
//! Map of this folder:
//! - `mod.rs` (here): configuration, errors, the public types, open, close, stats.
//! - [`frame`]: the CRC-framed batch of records, its encoder and decoders.
//! - [`envelope`]: one record's bytes inside a frame (key, commit time, payload).
//! - `commit.rs`: [`PartitionLog::commit_durable`]: one durable (`O_DSYNC`)
//!   append, read back from the device, verify, advance the high watermark;
//!   failure handling.
//! - `read.rs`: [`PartitionLog::read`]: cache first, then the index, then frames.
//! - `open.rs`: opening the directory: sealed segments set up unread, the
//!   active one recovered from its tail hint (`hint.rs`) or a full scan.
//! - `segment.rs`: segment files, preparation, roll, retention, lazy loading of
//!   sealed segments' indexes.
//! - [`recovery`]: byte scans: the verified tail at open, index rebuilds,
//!   resynchronising after a corrupt frame.
//! - [`index`]: the sparse offset index and its file.
//! - [`cache`]: the bounded cache of recent frames.
//!
//! Invariants (asserted in release builds where a break would lose or corrupt data):
//! - Offsets are dense: a commit of n records takes exactly `[hwm, hwm + n)`.
//! - The high watermark only moves forward, and only after the frames holding the
//!   records were made durable, read back from the device and verified.
//! - Nothing at or above the high watermark is ever returned by a read.
//! - Commit times never go backwards along the partition.
//! - After a failed sync (an `fdatasync`, or a durable write failing other than by
//!   a refusal for space) the log refuses every commit until it is reopened: what
//!   is on disk is unknown until a reopen scans it.

pub mod cache;
mod commit;
pub use commit::{commit_bytes_bound, CommitIo};
pub mod envelope;
pub mod frame;
mod hint;
pub use hint::{acknowledged_end, HINT_FILE};
pub mod index;
mod open;
mod outgoing;
mod read;
pub use read::{read_cached, ReadRange};
pub mod recovery;
mod segment;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::ops::Range;
use std::rc::Rc;

use bytes::Bytes;
use narad_io::rt::{LocalGuard, LocalSemaphore};
use narad_io::{align_down, align_up, AppendFile, BlockFile, Storage, BLOCK_BYTES};

use self::cache::FrameCache;
use self::index::{SparseIndex, INDEX_ENTRIES_MAX};
use self::segment::SealedSegment;
use crate::ids::Offset;

pub use self::segment::{RetentionOutcome, PREP_COMMIT_BYTES_MAX};

/// Largest payload of one record: the ingress WAL's record limit.
pub const RECORD_BYTES_MAX: usize = 16 * 1024 * 1024;

/// Largest segment, commit or preparation chunk a configuration may ask for:
/// segment positions are stored as `u32` in the index.
const CONFIG_BYTES_MAX: u64 = 1024 * 1024 * 1024;

/// Sealed segments one retention run deletes at most, so a run has a bounded cost.
pub const RETENTION_SEGMENTS_PER_RUN_MAX: usize = 64;

const _: () = assert!(
    RECORD_BYTES_MAX + envelope::KEY_BYTES_MAX + 64 < frame::FRAME_BYTES_MAX,
    "any single valid record fits one frame"
);
const _: () = assert!(CONFIG_BYTES_MAX * 2 <= u32::MAX as u64);

/// Tuning of one partition log. Operator-facing names carry their units.
#[derive(Clone, Debug)]
pub struct LogConfig {
    /// A segment rolls before a commit would take it past this size.
    pub segment_bytes_max: u64,
    /// A segment rolls once its first record is this old, so slow topics seal too
    /// and retention can delete them. Keep it at most `retention_ms`, so data goes
    /// between one and two retention periods after it was committed.
    pub segment_ms: u64,
    /// Sealed segments whose newest record is older than this are deleted.
    pub retention_ms: u64,
    /// zstd level for frame payloads; `None` stores them uncompressed.
    pub zstd_level: Option<i32>,
    /// Byte budget of this partition's own recent-frame cache: its newest frames
    /// up to this stay cached whatever other partitions do.
    pub cache_bytes_max: usize,
    /// The shard's pool the cache may grow into past its own budget
    /// ([`cache::CachePool`]); `None`: the own budget is the whole cache.
    pub cache_pool: Option<cache::CachePool>,
    /// The active segment is grown by writing zeros in chunks of this size ahead of
    /// the write position (0: grow by appending).
    pub prep_chunk_bytes: u64,
    /// Zeros are written ahead only while the log's recent commits average
    /// fewer bytes than this; larger ones grow the file themselves (see
    /// `segment.rs`). `u64::MAX`: whatever their size.
    pub prep_commit_bytes_max: u64,
    /// One index entry per this many bytes of segment data.
    pub index_interval_bytes: u64,
    /// Largest commit, checked both on its records (before compression) and on
    /// its frames as written.
    pub commit_bytes_max: usize,
    /// A commit is cut into frames of about this many records-area bytes, so a
    /// reader decodes (and decompresses) a bounded amount to reach one record.
    pub frame_area_bytes_target: usize,
    /// The shard's bound on full scans at open ([`ScanGate`]); `None`: no
    /// bound.
    pub scan_gate: Option<ScanGate>,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_bytes_max: 64 * 1024 * 1024,
            segment_ms: 24 * 3600 * 1000,
            retention_ms: 7 * 24 * 3600 * 1000,
            zstd_level: None,
            cache_bytes_max: 1024 * 1024,
            cache_pool: None,
            prep_chunk_bytes: 1024 * 1024,
            prep_commit_bytes_max: PREP_COMMIT_BYTES_MAX,
            index_interval_bytes: 128 * 1024,
            commit_bytes_max: 64 * 1024 * 1024,
            frame_area_bytes_target: 1024 * 1024,
            scan_gate: None,
        }
    }
}

impl LogConfig {
    /// The most bytes a segment file can hold that the log ever reads: one full
    /// segment or one commit, plus a preparation chunk. A larger file on disk is not
    /// one the log wrote; reading it whole would only risk memory.
    pub fn segment_file_bytes_max(&self) -> u64 {
        self.segment_bytes_max.max(self.commit_bytes_max as u64)
            + self.prep_chunk_bytes
            + BLOCK_BYTES as u64
    }

    /// Checks the relations the log relies on.
    pub fn validate(&self) -> Result<(), LogError> {
        let fail = |why: &str| Err(LogError::Config(why.to_string()));
        let segment_span = self.segment_bytes_max.max(self.commit_bytes_max as u64);
        if !(4096..=CONFIG_BYTES_MAX).contains(&self.segment_bytes_max) {
            return fail("segment_bytes_max must be within 4 KiB..1 GiB");
        }
        if self.commit_bytes_max as u64 > CONFIG_BYTES_MAX || self.commit_bytes_max == 0 {
            return fail("commit_bytes_max must be within 1 B..1 GiB");
        }
        if self.prep_chunk_bytes % BLOCK_BYTES as u64 != 0
            || self.prep_chunk_bytes > CONFIG_BYTES_MAX
        {
            return fail("prep_chunk_bytes must be a multiple of 4 KiB, at most 1 GiB");
        }
        if self.index_interval_bytes < 512
            || segment_span / self.index_interval_bytes >= INDEX_ENTRIES_MAX as u64
        {
            return fail("index_interval_bytes too small for the segment size");
        }
        if self.frame_area_bytes_target == 0 || self.frame_area_bytes_target > 64 * 1024 * 1024 {
            return fail("frame_area_bytes_target must be within 1 B..64 MiB");
        }
        if self.segment_ms == 0 || self.retention_ms == 0 {
            return fail("segment_ms and retention_ms must be positive");
        }
        Ok(())
    }
}

/// Full scans of active segments one shard runs at once by default (see
/// [`ScanGate`]).
pub const FULL_SCANS_AT_ONCE: usize = 2;

/// Bounds the full scans of active segments running at once on one shard: each
/// holds a whole segment in memory (see `open.rs`). Clones share the bound.
#[derive(Clone)]
pub struct ScanGate {
    inner: Rc<ScanGateInner>,
}

struct ScanGateInner {
    permits: LocalSemaphore,
    running: Cell<usize>,
    most: Cell<usize>,
}

/// Held while a full scan runs.
pub(crate) struct ScanTicket<'a> {
    gate: &'a ScanGateInner,
    _permit: LocalGuard<'a>,
}

impl Drop for ScanTicket<'_> {
    fn drop(&mut self) {
        self.gate.running.set(self.gate.running.get() - 1);
    }
}

impl ScanGate {
    /// A gate letting `at_once` scans (at least 1) run together.
    pub fn new(at_once: usize) -> Self {
        Self {
            inner: Rc::new(ScanGateInner {
                permits: LocalSemaphore::new(at_once.max(1) as u64),
                running: Cell::new(0),
                most: Cell::new(0),
            }),
        }
    }

    /// Waits until a scan may start.
    pub(crate) async fn enter(&self) -> ScanTicket<'_> {
        let permit = self.inner.permits.acquire().await;
        let running = self.inner.running.get() + 1;
        self.inner.running.set(running);
        self.inner.most.set(self.inner.most.get().max(running));
        ScanTicket {
            gate: &self.inner,
            _permit: permit,
        }
    }

    /// The most scans that ran at once through this gate.
    pub fn most_at_once(&self) -> usize {
        self.inner.most.get()
    }
}

impl fmt::Debug for ScanGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScanGate")
            .field("running", &self.inner.running.get())
            .finish()
    }
}

/// What went wrong. Every variant leaves nothing above the high watermark visible.
#[derive(Debug)]
pub enum LogError {
    /// A device operation failed; the commit (if any) was discarded and a retry
    /// may succeed.
    Io {
        /// What the log was doing.
        op: &'static str,
        /// The error.
        source: io::Error,
    },
    /// A durable write (a write and its sync) or an fdatasync failed: the
    /// commit was discarded and the log is now poisoned.
    SyncFailed(io::Error),
    /// An earlier durable write or fdatasync failed; reopen the log.
    Poisoned,
    /// The bytes read back from the device after the fsync are not the ones
    /// written; the commit was discarded and a retry may succeed.
    ReadBackMismatch {
        /// Offset of the first record of the frame that did not verify.
        offset: Offset,
        /// Why.
        detail: String,
    },
    /// The records cannot be committed as given (too large); nothing was written.
    InvalidBatch(String),
    /// The offset is below the oldest retained one.
    AgedOut {
        /// The offset asked for.
        requested: Offset,
        /// The oldest offset still in the log.
        oldest: Offset,
    },
    /// The configuration breaks a relation the log relies on.
    Config(String),
}

impl fmt::Display for LogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogError::Io { op, source } => write!(f, "partition log {op}: {source}"),
            LogError::SyncFailed(e) => {
                write!(
                    f,
                    "partition log write or fdatasync failed, log poisoned: {e}"
                )
            }
            LogError::Poisoned => {
                write!(
                    f,
                    "partition log poisoned by an earlier failed write or fdatasync"
                )
            }
            LogError::ReadBackMismatch { offset, detail } => {
                write!(
                    f,
                    "partition log read-back mismatch at offset {offset}: {detail}"
                )
            }
            LogError::InvalidBatch(why) => write!(f, "invalid batch: {why}"),
            LogError::AgedOut { requested, oldest } => {
                write!(
                    f,
                    "offset {requested} aged out; oldest retained is {oldest}"
                )
            }
            LogError::Config(why) => write!(f, "invalid partition log configuration: {why}"),
        }
    }
}

impl std::error::Error for LogError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LogError::Io { source, .. } | LogError::SyncFailed(source) => Some(source),
            _ => None,
        }
    }
}

/// Wraps an I/O error with the step that failed.
fn io_err(op: &'static str) -> impl FnOnce(io::Error) -> LogError {
    move |source| LogError::Io { op, source }
}

/// One record to commit.
#[derive(Clone, Copy, Debug)]
pub struct RecordRef<'a> {
    /// The key, if the producer gave one.
    pub key: Option<&'a [u8]>,
    /// The payload.
    pub payload: &'a [u8],
    /// The word the key and payload are still masked with, as the ingress WAL
    /// stored them (the payload continuing the key's phase; see
    /// [`crate::mask`]); 0 for plain bytes. The commit unmasks them as it
    /// copies them into the records area.
    pub mask: u64,
}

/// One committed record, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Its offset.
    pub offset: Offset,
    /// Its key, if it has one.
    pub key: Option<Bytes>,
    /// When it became visible (never decreasing along the partition).
    pub commit_time_ms: u64,
    /// Its payload.
    pub payload: Bytes,
}

/// One item of a read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadItem {
    /// A record.
    Record(Record),
    /// Offsets whose bytes are unreadable (bit rot): the consume path skips them.
    Corrupt(Range<Offset>),
}

/// The answer to [`PartitionLog::read`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadBatch {
    /// Records and corrupt ranges, in offset order, contiguous from the offset
    /// asked for.
    pub items: Vec<ReadItem>,
    /// Where the next read should start.
    pub next_offset: Offset,
}

/// A snapshot of the log's shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogStats {
    /// The oldest offset still retained.
    pub oldest_offset: Offset,
    /// The high watermark: the next offset to be committed.
    pub next_offset: Offset,
    /// Segment files, the active one included.
    pub segment_count: usize,
    /// Bytes of frames in all segments.
    pub size_bytes: u64,
    /// Corrupt ranges recovery found in the active segment.
    pub corrupt_gap_count: usize,
    /// Bytes charged to the recent-frame cache.
    pub cache_bytes: usize,
    /// Commit time (Unix milliseconds) of the newest record of the oldest
    /// segment: the time retention judges that segment by. `None` when the
    /// log holds no record, or when the oldest segment's index was not read
    /// yet (its first retention check reads it).
    pub oldest_segment_ms: Option<u64>,
}

/// The segment being appended to.
struct ActiveSegment<F> {
    base: Offset,
    file: AppendFile<F>,
    /// The data bytes of the file's last, partial block: every append rewrites
    /// them, so the read-back checks they are still there.
    tail_block: Vec<u8>,
    index: SparseIndex,
    first_commit_ms: Option<u64>,
    /// Where the last frame starts, if the segment holds one (for the tail
    /// hint).
    last_frame_pos: Option<u64>,
    /// The zero chunk being written ahead of the appends, if any.
    preparing: Option<Preparing>,
}

impl<F: BlockFile> ActiveSegment<F> {
    /// Bytes of the file that exist on the device, where zeros written ahead
    /// start: its whole blocks, and at least the block the data ends in. Read
    /// from the appender, which learns of every size change (its own writes,
    /// growing commits among them; the zeros written beside it; the trim at
    /// sealing), so it never trails the data.
    fn prepared_bytes(&self) -> u64 {
        align_down(self.file.file_bytes()).max(align_up(self.file.len()))
    }
}

/// A device write submitted and not yet collected.
type PendingWrite = std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<()>>>>;

/// A zero chunk written ahead of the appends, in flight.
struct Preparing {
    /// The prepared size once it lands.
    end: u64,
    write: PendingWrite,
}

/// One partition's log. See the module documentation.
pub struct PartitionLog<S: Storage> {
    storage: S,
    dir: String,
    config: LogConfig,
    sealed: VecDeque<SealedSegment>,
    /// Bytes of frames in the sealed segments, kept with `sealed` so the log's
    /// size costs no walk over thousands of segments after every commit.
    sealed_bytes: u64,
    active: ActiveSegment<Rc<S::File>>,
    high_watermark: Offset,
    last_commit_ms: u64,
    poisoned: bool,
    /// A commit's read-back failed after its sync: its frames may be durable
    /// past the high watermark, so an open could recover more than this shape.
    unsettled_tail: bool,
    /// A commit failed since the open: what it left past the tail is unknown,
    /// so the close writes no tail hint and the next open scans.
    commit_failed: bool,
    /// The open trusted a tail hint, still on the disk and still describing
    /// the active segment: the next commit retires it first
    /// ([`hint::retire`]), and a close before any commit or roll leaves it.
    hint_to_retire: bool,
    /// The open found an intact tail hint of the active segment that did not
    /// hold and scanned instead: the next commit retires it too, so that it
    /// never serves a later open as the floor of a tail this log has since
    /// written differently (`recovery::scan_tail_above`). The close writes a
    /// fresh one either way.
    stale_hint: bool,
    /// The device time of the last commit, if it succeeded (for metrics).
    last_commit_io: Option<CommitIo>,
    /// Bytes of the recent commits, a moving average (each commit weighs an
    /// eighth): whether zeros ahead pay for themselves (`segment.rs`).
    commit_bytes_avg: u64,
    /// Shared with the owner, which serves reads of the cached tail without
    /// taking the partition's lock (so a consume never waits for a commit's
    /// fdatasync). Only `publish` adds to it, in the same step that moves the
    /// high watermark, so it never holds an unverified or invisible record.
    cache: Rc<RefCell<FrameCache>>,
    gaps: Vec<Range<Offset>>,
    /// One open handle to a sealed segment, for reads: thousands of partitions
    /// cannot keep every segment open.
    sealed_file: Option<(Offset, S::File)>,
    /// The segment bytes the last read fetched, by segment base: consumers
    /// reading a backlog one record at a time read the device once per window,
    /// not once per record. Only committed bytes are ever fetched, and committed
    /// bytes never change, so the window stays true until its segment is deleted
    /// (and reads below the oldest offset are refused before they get here).
    read_window: Option<(Offset, read::Window)>,
    /// Bytes reads of records have fetched from the device since the open (the
    /// windows of segment reads; the recent-frame cache costs none).
    device_read_bytes: u64,
    /// The last frame a segment read decoded, so consecutive single-record reads
    /// check and decode each frame once.
    last_frame: Option<cache::CachedFrame>,
}

impl<S: Storage> PartitionLog<S> {
    /// Opens (creating if needed) the log in `dir`, a storage-relative path, and
    /// recovers its high watermark from the verified tail of the active segment.
    pub async fn open(storage: S, dir: &str, config: LogConfig) -> Result<Self, LogError> {
        config.validate()?;
        let opened = open::open_segments(&storage, dir, &config).await?;
        let cache = match &config.cache_pool {
            Some(pool) => FrameCache::in_pool(config.cache_bytes_max, pool),
            None => Rc::new(RefCell::new(FrameCache::new(config.cache_bytes_max))),
        };
        let sealed_bytes = opened.sealed.iter().map(|s| s.data_bytes).sum();
        let mut log = Self {
            storage,
            dir: dir.to_string(),
            config,
            sealed: opened.sealed,
            sealed_bytes,
            active: opened.active,
            high_watermark: opened.next_offset,
            last_commit_ms: opened.last_commit_ms,
            poisoned: false,
            unsettled_tail: false,
            commit_failed: false,
            hint_to_retire: opened.from_hint,
            stale_hint: opened.stale_hint,
            last_commit_io: None,
            commit_bytes_avg: 0,
            cache,
            gaps: opened.gaps,
            sealed_file: None,
            read_window: None,
            device_read_bytes: 0,
            last_frame: None,
        };
        if log.active.first_commit_ms.is_none() && !log.sealed.is_empty() {
            // The active segment is empty: the newest commit time is the last
            // sealed segment's, which keeps commit times monotonic across restarts.
            // A segment that cannot be read (nor its index) must not keep the log
            // from opening for good: commit times then go on from the clock, and
            // reads of that segment report it.
            let last = log.sealed.len() - 1;
            match log.sealed_index(last).await {
                Ok(index) => log.last_commit_ms = index.max_commit_ms,
                Err(e) => {
                    tracing::error!(dir = %log.dir, base = log.sealed[last].base.0, error = %e, "partition log cannot read its last sealed segment; commit times go on from the clock");
                }
            }
        }
        for gap in &log.gaps {
            tracing::warn!(dir = %log.dir, start = gap.start.0, end = gap.end.0, "partition log has a corrupt gap (bit rot); its records are unreadable");
        }
        Ok(log)
    }

    /// Closes the log. Every commit that returned `Ok` is already durable.
    pub async fn close(mut self) -> Result<(), LogError> {
        // The chunk in flight holds the file: let it land before closing (and
        // before anything below can return early, so that it never lands after
        // a reopen appended there). Its failure loses nothing, since it lay
        // past the data.
        if let Err(e) = self.finish_preparing().await {
            tracing::warn!(dir = %self.dir, error = %e, "partition log preparation failed at close");
        }
        if let Some((_, file)) = self.sealed_file.take() {
            file.close().await.map_err(io_err("close sealed segment"))?;
        }
        self.store_tail_hint().await;
        self.active
            .file
            .into_file()
            .close()
            .await
            .map_err(io_err("close active segment"))
    }

    /// Writes the tail hint the next open starts from ([`hint`]), when
    /// nothing since the open leaves the segment's end in doubt. A hint that
    /// cannot be written costs that open a full scan, nothing else.
    async fn store_tail_hint(&self) {
        let in_doubt = self.poisoned
            || self.unsettled_tail
            || self.commit_failed
            || !self.gaps.is_empty()
            || self.active.index.data_bytes != self.active.file.len();
        // Opened from the hint on the disk and neither committed to nor
        // rolled since: that hint still says all there is to say.
        if in_doubt || self.hint_to_retire {
            return;
        }
        let found = hint::TailHint {
            first_commit_ms: self.active.first_commit_ms,
            last_frame_pos: self.active.last_frame_pos,
            index: self.active.index.clone(),
        };
        if let Err(e) = hint::store(&self.storage, &self.dir, &found).await {
            tracing::debug!(dir = %self.dir, error = %e, "partition log could not write its tail hint");
        }
    }

    /// The recent-frame cache, for reads that do not take the log (see
    /// [`read_cached`]).
    pub fn shared_cache(&self) -> Rc<RefCell<FrameCache>> {
        self.cache.clone()
    }

    /// The high watermark: every offset below it is visible, none at or above.
    pub fn high_watermark(&self) -> Offset {
        self.high_watermark
    }

    /// The oldest offset still retained.
    pub fn oldest_offset(&self) -> Offset {
        self.sealed.front().map_or(self.active.base, |s| s.base)
    }

    /// Whether a failed durable write or fdatasync poisoned the log.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// Whether an open of these files could recover another shape than this
    /// log's: a commit's read-back failed after its sync since it was opened,
    /// so frames past the high watermark may be durable (recovery keeps every
    /// commit whose frames verify).
    pub fn tail_may_differ_on_disk(&self) -> bool {
        self.unsettled_tail
    }

    /// Offset ranges recovery found unreadable in the active segment.
    pub fn corrupt_gaps(&self) -> &[Range<Offset>] {
        &self.gaps
    }

    /// The device time of the last commit: `None` when it failed, wrote nothing,
    /// or no commit was made since the log was opened.
    pub fn last_commit_io(&self) -> Option<CommitIo> {
        self.last_commit_io
    }

    /// Bytes reads of records have fetched from the device since the log was
    /// opened.
    pub fn device_read_bytes(&self) -> u64 {
        self.device_read_bytes
    }

    /// The log's shape now. Costs no walk over the segments.
    pub fn stats(&self) -> LogStats {
        debug_assert_eq!(
            self.sealed_bytes,
            self.sealed.iter().map(|s| s.data_bytes).sum::<u64>(),
            "the sealed bytes follow the sealed segments"
        );
        LogStats {
            oldest_offset: self.oldest_offset(),
            next_offset: self.high_watermark,
            segment_count: self.sealed.len() + 1,
            size_bytes: self.sealed_bytes + self.active.file.len(),
            corrupt_gap_count: self.gaps.len(),
            cache_bytes: self.cache.borrow().charged_bytes(),
            oldest_segment_ms: self.oldest_segment_ms(),
        }
    }

    /// [`LogStats::oldest_segment_ms`], from what is in memory. A segment of
    /// no record knows no time.
    fn oldest_segment_ms(&self) -> Option<u64> {
        match self.sealed.front() {
            Some(oldest) => {
                let index = oldest.index.as_ref()?;
                (index.end > index.base).then_some(index.max_commit_ms)
            }
            None => (self.high_watermark > self.active.base).then_some(self.last_commit_ms),
        }
    }
}
