//! Segment files: preparing the active one, rolling by size and age, retention,
//! and lazy loading of sealed segments' indexes (opening and recovering them is
//! `open.rs`).
//!
//! Runs on the shard that owns the partition. Files in the partition directory:
//! `<20-digit base offset>.log` (frames; the last one by name is active) and
//! `<20-digit base offset>.index` (a sealed segment's sparse index).
//!
//! Preparation. O_DIRECT appends that grow the file make every durable write
//! commit a size change through the file system journal, and pre-zeroing a whole 64 MiB
//! segment per partition is out of the question with thousands of partitions per
//! node (and would double the disk they take). So the active segment is grown by
//! *writing zeros* (allocated blocks, not unwritten extents, which measured ~2x
//! slower) in chunks ahead of the write position: as large as the data the
//! segment holds, from a sixteenth of `prep_chunk_bytes` up to all of it (64 KiB
//! to 1 MiB by default), so a partition that holds a few records takes 128 KiB
//! of disk, not 2 MiB, and one written fast reaches full chunks within its first
//! megabyte.
//! Once a commit leaves less than a chunk prepared past its end, the next chunk's
//! zeros are handed to the device and left in flight while the following
//! commits use the space already prepared, so a commit stays one durable write
//! and one read-back; only the first commit of a segment, or one that outruns
//! the prepared space, waits for zeros. Only about one commit per chunk pays a
//! size change in its durable write (the zeros are never synced on their own: a
//! durable write inside them makes the size that reaches it durable); the cost is one to two chunks of extra disk
//! per partition (the target is the next chunk boundary a whole chunk past the
//! data's end: up to 2 MiB less a block with full chunks) and one extra write of zeros per byte appended (sequential, and
//! coalesced into one 1 MiB write). A zeroed region reads as a bad magic, which
//! every scanner takes as the end of the data. Sealing trims the file to its data,
//! so sealed segments hold frames and nothing else.
//! Zeros pay only for small commits. A commit that grows the file carries a
//! journal commit in its fdatasync (on ext4 without a journal, a synchronous
//! write of the inode), and its extending write is one the kernel cannot issue
//! without blocking, so io_uring runs it on a worker thread (about 4% more
//! broker CPU a message under batch produce): a near-constant cost per
//! commit, which a commit of a few records feels (its median took about 175 µs
//! more without zeros) and a large one does not, while the zeros cost the
//! device a second write of every byte, which matters once the device is
//! busy, and a busy device is what makes commits large (records queue while
//! the commit before them runs). With one
//! shard saturated by batch produce (commits of 300 KiB and more) the device
//! wrote 1.35x as much with zeros for 5-15% fewer records a second, and queued
//! nearly twice as deep. So zeros are written, inline or ahead, only while the
//! log's recent commits (a moving average, each weighing an eighth) are
//! smaller than `prep_commit_bytes_max` (256 KiB by default: a partition
//! committing 250,000 batched 1 KiB records a second over six partitions, about
//! 80 KiB a commit, keeps them and the median commit time they give); past
//! that a commit that outruns the prepared space grows the file itself, after
//! any zero chunk still in flight has landed (a zero write landing after a
//! commit's would wipe it). Where zeros start is read from the appender's
//! idea of the file's size, never stored beside it, and never below the
//! data's last block: zeros written again later start past the data.
//! A `prep_chunk_bytes` of 0 (the broker's `storage.log_prealloc` off) writes no
//! zeros: commits extend the file, each as a plain write and an fdatasync that
//! commits the new size (never one `O_DSYNC` write that grows the file).
//!
//! Invariants: segment bases increase and each sealed segment holds exactly the
//! offsets from its base to the next segment's base; a segment is sealed only
//! after its data is synced and trimmed; the active segment is never deleted by
//! retention; retention deletes from the oldest segment only, at most
//! [`RETENTION_SEGMENTS_PER_RUN_MAX`] per run.

use std::rc::Rc;

use narad_io::append::read_exact_at;
use narad_io::file::{join, OpenMode};
use narad_io::{align_down, align_up, AppendFile, BlockFile, Storage, BLOCK_BYTES};

use super::index::{index_file_name, load_index, persist_index, SparseIndex};
use super::recovery::{frame_commit_ms, scan_sealed};
use super::{
    io_err, ActiveSegment, LogError, PartitionLog, PendingWrite, Preparing,
    RETENTION_SEGMENTS_PER_RUN_MAX,
};
use crate::ids::Offset;

/// A segment no longer appended to.
#[derive(Debug)]
pub(super) struct SealedSegment {
    /// Its first offset.
    pub base: Offset,
    /// The next segment's base: the offset after its last record.
    pub end: Offset,
    /// Bytes of frames in the file.
    pub data_bytes: u64,
    /// Loaded on first use.
    pub index: Option<SparseIndex>,
}

/// What a retention run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetentionOutcome {
    /// Segments deleted.
    pub segments_deleted: usize,
    /// Bytes of frames deleted.
    pub bytes_deleted: u64,
    /// Offsets deleted: the records of the deleted segments (and any corrupt
    /// ranges among them).
    pub records_deleted: u64,
}

/// The segment file's name for the segment starting at `base`.
pub(super) fn segment_file_name(base: Offset) -> String {
    format!("{:020}.log", base.0)
}

/// Reads of a sealed segment whose index is rebuilt, at most, until one
/// verifies frames to the segment's end.
const INDEX_SCAN_READS_MAX: usize = 3;

/// Commits averaging this many bytes or more grow the file themselves rather
/// than write into zeros (see the module docs).
pub const PREP_COMMIT_BYTES_MAX: u64 = 256 * 1024;

/// The zero chunk a segment holding data up to `end` is prepared by, for the
/// configured (largest) chunk `max`: `end` rounded up to a power of two, at
/// least a sixteenth of `max` (and 4 KiB), at most `max`; 0 when `max` is.
pub(super) fn prep_chunk_for(end: u64, max: u64) -> u64 {
    if max == 0 {
        return 0;
    }
    let block = BLOCK_BYTES as u64;
    let floor = align_down(max / 16).max(block).min(max);
    end.max(1).next_power_of_two().clamp(floor, max)
}

impl<S: Storage> PartitionLog<S> {
    fn prep_chunk_at(&self, end: u64) -> u64 {
        prep_chunk_for(end, self.config.prep_chunk_bytes)
    }

    /// Whether the recent commits are small enough for zeros to pay.
    fn zeros_pay(&self) -> bool {
        self.commit_bytes_avg < self.config.prep_commit_bytes_max
    }

    /// Counts a commit of `bytes` into the recent average.
    pub(super) fn note_commit_bytes(&mut self, bytes: u64) {
        self.commit_bytes_avg = (self.commit_bytes_avg * 7 + bytes) / 8;
    }

    /// Makes sure the active file exists on the device, zeroed, up to `end`, by
    /// writing zero chunks ahead of the write position, while zeros pay; when
    /// they do not, only waits for a chunk in flight below `end` (see the
    /// module docs).
    pub(super) async fn prepare_active(&mut self, end: u64) -> Result<(), LogError> {
        let chunk = self.prep_chunk_at(end);
        if chunk == 0 || end <= self.active.prepared_bytes() {
            return Ok(());
        }
        // The chunk being prepared in the background is the one this needs, or
        // lies where a commit growing the file is about to write.
        self.finish_preparing().await?;
        if end <= self.active.prepared_bytes() || !self.zeros_pay() {
            return Ok(());
        }
        let target = (align_up(end) + chunk).div_ceil(chunk) * chunk;
        // Bounded: target - prepared is at most one commit plus two chunks.
        while self.active.prepared_bytes() < target {
            let from = self.active.prepared_bytes();
            let len = (target - from).min(chunk);
            let file = self.active.file.file();
            file.write_zeros(from, len as usize)
                .await
                .map_err(io_err("prepare segment"))?;
            self.active.file.grew_to(from + len);
        }
        Ok(())
    }

    /// Hands the next zero chunk to the device when less than a chunk of
    /// prepared space is left past `end`, and returns without waiting for it:
    /// the write goes on in the background while the commits that follow use
    /// the space already prepared, so each stays one write, one fdatasync and
    /// one read-back. At most one chunk is in flight; a commit that reaches it
    /// before it lands waits for it ([`PartitionLog::prepare_active`]).
    ///
    /// No task is spawned: the write's future is polled once here, which
    /// submits it, and kept; awaiting it later collects the result. So the log
    /// needs no executor of its own and runs the same under the simulations.
    pub(super) async fn prepare_ahead(&mut self, end: u64) {
        let chunk = self.prep_chunk_at(end);
        let prepared = self.active.prepared_bytes();
        if chunk == 0
            || !self.zeros_pay()
            || self.active.preparing.is_some()
            || prepared.saturating_sub(align_up(end)) >= chunk
        {
            return;
        }
        let from = prepared.max(align_up(end));
        let file = self.active.file.file().clone();
        let mut write: PendingWrite =
            Box::pin(async move { file.write_zeros(from, chunk as usize).await });
        let first = futures_lite::future::poll_once(&mut write).await;
        let end = from + chunk;
        match first {
            Some(Ok(())) => self.active.file.grew_to(end),
            // The next commit that needs the space prepares it inline.
            Some(Err(e)) => {
                tracing::warn!(dir = %self.dir, error = %e, "partition log could not prepare ahead");
            }
            None => self.active.preparing = Some(Preparing { end, write }),
        }
    }

    /// Waits for the chunk in flight, if any, and counts it as prepared. A
    /// failed write leaves the space unprepared (the next commit prepares it
    /// inline) and fails the caller.
    pub(super) async fn finish_preparing(&mut self) -> Result<(), LogError> {
        let Some(preparing) = self.active.preparing.take() else {
            return Ok(());
        };
        preparing.write.await.map_err(io_err("prepare segment"))?;
        self.active.file.grew_to(preparing.end);
        Ok(())
    }

    /// Rolls the active segment if its first record is `segment_ms` old. Call it
    /// from a periodic task so slow topics seal too. Returns whether it rolled.
    pub async fn maybe_roll(&mut self, now_ms: u64) -> Result<bool, LogError> {
        self.maybe_roll_at_age(now_ms, self.config.segment_ms).await
    }

    /// [`PartitionLog::maybe_roll`] with the age given by the caller: the retention
    /// reaper rolls at the topic's current retention when that is shorter than the
    /// configured `segment_ms`, so a record is never kept much past its retention.
    pub async fn maybe_roll_at_age(
        &mut self,
        now_ms: u64,
        segment_ms: u64,
    ) -> Result<bool, LogError> {
        assert!(segment_ms > 0, "a segment age of 0 would roll every commit");
        if self.poisoned {
            return Err(LogError::Poisoned);
        }
        if !self.roll_due_by_age(now_ms, segment_ms) {
            return Ok(false);
        }
        self.roll().await?;
        Ok(true)
    }

    pub(super) fn roll_due_by_age(&self, now_ms: u64, segment_ms: u64) -> bool {
        self.active
            .first_commit_ms
            .is_some_and(|first| now_ms.saturating_sub(first) >= segment_ms)
    }

    /// Moves the high watermark up to `floor`, durably: the offsets in between
    /// become a gap that reads report as corrupt, and the next commit lands at
    /// `floor`. For a log that lost records it had made visible (rot in its last
    /// commit, segment files removed by hand) while its consumers' state says
    /// they settled offsets up to `floor`: handing those offsets out again would
    /// make the records committed there look settled, and never delivered.
    /// Returns whether it moved.
    pub async fn advance_to(&mut self, floor: Offset) -> Result<bool, LogError> {
        if self.poisoned {
            return Err(LogError::Poisoned);
        }
        if floor <= self.high_watermark {
            return Ok(false);
        }
        tracing::warn!(
            dir = %self.dir,
            next_offset = self.high_watermark.0,
            floor = floor.0,
            "partition log ends below offsets its consumers settled: records were lost; the offsets in between are left as a gap"
        );
        self.roll_to(floor).await?;
        assert_eq!(self.high_watermark, floor);
        Ok(true)
    }

    /// Seals the active segment (trim, sync, write its index) and starts a new one
    /// at the high watermark.
    pub(super) async fn roll(&mut self) -> Result<(), LogError> {
        assert!(
            !self.active.file.is_empty(),
            "only a segment with records is sealed"
        );
        self.roll_to(self.high_watermark).await
    }

    /// Seals the active segment and starts the next one at `next_base`, at or
    /// above the high watermark; the sealed segment spans up to `next_base`, so
    /// the offsets from the high watermark to it read as a gap.
    async fn roll_to(&mut self, next_base: Offset) -> Result<(), LogError> {
        let data_bytes = self.active.file.len();
        assert!(next_base >= self.high_watermark);
        assert!(
            data_bytes > 0 || next_base > self.high_watermark,
            "only a segment with records, or one a gap follows, is sealed"
        );
        assert_eq!(
            self.active.index.end, self.high_watermark,
            "the active index ends at the high watermark"
        );
        // A zero chunk landing after the trim would grow the sealed file again.
        self.finish_preparing().await?;
        self.active
            .file
            .file()
            .truncate(data_bytes)
            .await
            .map_err(io_err("trim segment"))?;
        self.active.file.truncated_to(data_bytes);
        if let Err(e) = self.active.file.sync().await {
            self.poisoned = true;
            return Err(LogError::SyncFailed(e));
        }
        // Sealed, the segment spans up to the next one, a gap included; put
        // back below if the next segment cannot be made. A segment of no
        // record takes the log's last commit time, so that nothing reads it as
        // decades old.
        self.active.index.end = next_base;
        if data_bytes == 0 {
            self.active.index.note_commit_ms(self.last_commit_ms);
        }
        if let Err(e) = persist_index(&self.storage, &self.dir, &self.active.index).await {
            // The index is rebuilt from the segment when missing; sealing goes on.
            tracing::warn!(dir = %self.dir, error = %e, "partition log could not write a segment index");
        }
        let base = next_base;
        let path = join(&self.dir, &segment_file_name(base));
        let created = match self.storage.open(&path, OpenMode::CreateOrOpen).await {
            Ok(new_file) => AppendFile::open_at(Rc::new(new_file), 0)
                .await
                .map_err(io_err("position appender")),
            Err(e) => Err(io_err("create segment")(e)),
        };
        let appender = match created {
            Ok(appender) => appender,
            Err(e) => {
                // The file may exist though its creation failed (the directory
                // sync after it did). Left there, it would open as the active
                // segment at the next open, above records that later commits
                // append to the current one: remove it; the roll is tried again.
                // If it cannot be removed, nothing more is committed until the
                // log is reopened, which takes it as the active segment.
                if let Err(remove) = self.storage.remove(&path).await {
                    if remove.kind() != std::io::ErrorKind::NotFound {
                        tracing::error!(dir = %self.dir, error = %remove, "partition log could not remove a segment it failed to create; the log is reopened before it commits again");
                        self.poisoned = true;
                    }
                }
                self.active.index.end = self.high_watermark;
                return Err(e);
            }
        };
        let old = std::mem::replace(
            &mut self.active,
            ActiveSegment {
                base,
                file: appender,
                tail_block: Vec::new(),
                index: SparseIndex::new(base),
                first_commit_ms: None,
                last_frame_pos: None,
                preparing: None,
            },
        );
        // A hint on the disk names the sealed segment now: the next open
        // passes it by, and the close writes one for the new segment.
        self.hint_to_retire = false;
        self.stale_hint = false;
        assert!(
            self.sealed.back().is_none_or(|s| s.end == old.base),
            "segments are contiguous"
        );
        self.sealed.push_back(SealedSegment {
            base: old.base,
            end: base,
            data_bytes,
            index: Some(old.index),
        });
        self.sealed_bytes += data_bytes;
        self.high_watermark = base;
        // The segment is synced and now sealed whatever the close says; failing
        // the roll here would leave the log without it.
        if let Err(e) = old.file.into_file().close().await {
            tracing::warn!(dir = %self.dir, base = old.base.0, error = %e, "partition log could not close a sealed segment");
        }
        Ok(())
    }

    /// Deletes whole sealed segments, oldest first, whose newest record is older
    /// than `retention_ms`. The active segment is never deleted: `maybe_roll`
    /// seals it by age first.
    pub async fn enforce_retention(&mut self, now_ms: u64) -> Result<RetentionOutcome, LogError> {
        self.enforce_retention_of(now_ms, self.config.retention_ms)
            .await
    }

    /// [`PartitionLog::enforce_retention`] with the retention given by the caller:
    /// a topic's retention can be altered while its log is open, so the reaper
    /// passes the current one on every run. `retention_ms` is positive; a topic
    /// that keeps its records forever is never passed here.
    pub async fn enforce_retention_of(
        &mut self,
        now_ms: u64,
        retention_ms: u64,
    ) -> Result<RetentionOutcome, LogError> {
        assert!(
            retention_ms > 0,
            "retention 0 means forever; callers skip it"
        );
        let oldest_before = self.oldest_offset();
        let mut outcome = RetentionOutcome::default();
        let result = self.delete_aged(now_ms, retention_ms, &mut outcome).await;
        assert!(
            self.oldest_offset() >= oldest_before && self.oldest_offset() <= self.high_watermark,
            "retention only moves the oldest offset forward, never past the high watermark"
        );
        // Cached frames of a deleted segment must not be read past retention,
        // whether the run ended or failed part way.
        let oldest = self.oldest_offset();
        self.cache.borrow_mut().trim_below(oldest);
        result.map(|()| outcome)
    }

    /// The deletions of one retention run, counted in `outcome`: the oldest
    /// sealed segments whose records are all past `retention_ms`, at most
    /// [`RETENTION_SEGMENTS_PER_RUN_MAX`], in one batch with one directory sync
    /// (a sync per file would hold the partition's commits for a hundred syncs).
    async fn delete_aged(
        &mut self,
        now_ms: u64,
        retention_ms: u64,
        outcome: &mut RetentionOutcome,
    ) -> Result<(), LogError> {
        let mut due = 0;
        while due < self.sealed.len().min(RETENTION_SEGMENTS_PER_RUN_MAX) {
            let newest_ms = match self.sealed_index(due).await {
                Ok(index) => index.max_commit_ms,
                // An unreadable segment must not hold retention back for good
                // (the disk would fill behind it): commit times never go back,
                // so whatever comes after it bounds its newest record.
                Err(e) => match self.newest_bound_after(due).await {
                    Some(bound) => {
                        tracing::warn!(dir = %self.dir, base = self.sealed[due].base.0, error = %e, "partition log cannot read a sealed segment; retention judges it by the records after it");
                        bound
                    }
                    None if due == 0 => return Err(e),
                    None => break,
                },
            };
            if now_ms.saturating_sub(newest_ms) < retention_ms {
                break;
            }
            due += 1;
        }
        if due == 0 {
            return Ok(());
        }
        let bases: Vec<Offset> = self.sealed.iter().take(due).map(|s| s.base).collect();
        if let Some((base, _)) = &self.sealed_file {
            if bases.contains(base) {
                if let Some((_, file)) = self.sealed_file.take() {
                    file.close().await.map_err(io_err("close sealed segment"))?;
                }
            }
        }
        // Every segment first, then their indexes: a crash or a failure in
        // between leaves orphan indexes, which open removes.
        let names: Vec<String> = bases
            .iter()
            .map(|&base| segment_file_name(base))
            .chain(bases.iter().map(|&base| index_file_name(base)))
            .collect();
        let (removed, result) = self.storage.remove_in(&self.dir, &names).await;
        // Gone from the directory, so gone from the log, whatever happens next:
        // a read below the new oldest offset is aged out, not a failed open.
        for _ in 0..removed.min(due) {
            let removed = self
                .sealed
                .pop_front()
                .expect("removed segments were sealed");
            outcome.segments_deleted += 1;
            outcome.bytes_deleted += removed.data_bytes;
            outcome.records_deleted += removed.end.0 - removed.base.0;
            self.sealed_bytes -= removed.data_bytes;
        }
        result.map_err(io_err("remove aged segments"))
    }

    /// A commit time no record of sealed segment `i` is newer than: the newest
    /// of the next sealed segment, else the first of the active one; `None`
    /// when neither can be read or the active segment has no record.
    async fn newest_bound_after(&mut self, i: usize) -> Option<u64> {
        let bound = if self.sealed.len() > i + 1 {
            // Boxed: a rebuild of segment `i + 1` that stops short asks this of
            // `i + 1` in turn.
            Box::pin(self.sealed_index(i + 1))
                .await
                .ok()
                .map(|i| i.max_commit_ms)
        } else {
            self.active.first_commit_ms
        };
        // A segment of no record knows no time: no bound.
        bound.filter(|&ms| ms > 0)
    }

    /// The index of sealed segment `i`, loaded from its file or rebuilt by a scan.
    pub(super) async fn sealed_index(&mut self, i: usize) -> Result<&SparseIndex, LogError> {
        if self.sealed[i].index.is_none() {
            let segment = &self.sealed[i];
            let (base, end, data_bytes) = (segment.base, segment.end, segment.data_bytes);
            let loaded = load_index(&self.storage, &self.dir, base)
                .await
                .unwrap_or_else(|e| {
                    // The segment itself may still read: rebuild from it.
                    tracing::warn!(dir = %self.dir, base = base.0, error = %e, "partition log cannot read a segment index; rebuilding it");
                    None
                })
                .filter(|index| index.end == end && index.data_bytes == data_bytes)
                // A segment of records with no commit time was sealed by a
                // version that lost it when the log was reopened before the
                // roll; rebuilding reads it from the last frame, where retention
                // would otherwise take the segment for decades old.
                .filter(|index| index.max_commit_ms > 0 || end == base);
            let index = match loaded {
                Some(index) => index,
                None => {
                    let (mut index, whole) = self.rebuild_index(base, end, data_bytes).await?;
                    if !whole {
                        // Its last frames did not verify: their commit times are
                        // unknown, and what follows bounds them (retention then
                        // errs on keeping the segment longer).
                        if let Some(bound) = self.newest_bound_after(i).await {
                            index.note_commit_ms(bound);
                        }
                    }
                    index
                }
            };
            self.sealed[i].index = Some(index);
        }
        Ok(self.sealed[i].index.as_ref().expect("just loaded"))
    }

    /// Rebuilds the index of a sealed segment by scanning it, and writes it
    /// out if the scan verified frames up to the segment's end. Returns the
    /// index and whether it did: a scan that stops short took its newest commit
    /// time from an earlier frame, which a bad read can cause as well as damage,
    /// so the segment is read up to [`INDEX_SCAN_READS_MAX`] times, and an
    /// index that never verified whole is not written (a later rebuild tries
    /// again).
    async fn rebuild_index(
        &mut self,
        base: Offset,
        end: Offset,
        data_bytes: u64,
    ) -> Result<(SparseIndex, bool), LogError> {
        let interval = self.config.index_interval_bytes;
        // The scan holds the whole segment in memory, as a full scan at open.
        let gate = self.config.scan_gate.clone();
        let _scanning = match &gate {
            Some(gate) => Some(gate.enter().await),
            None => None,
        };
        let file = self.sealed_file(base).await?;
        let mut best: Option<(SparseIndex, Option<u64>)> = None;
        for _ in 0..INDEX_SCAN_READS_MAX {
            let bytes = read_exact_at(file, 0, data_bytes as usize)
                .await
                .map_err(io_err("read segment"))?;
            let (index, last_pos) = scan_sealed(&bytes, base, interval);
            let last_ms = last_pos
                .and_then(|p| frame_commit_ms(&bytes[p..]))
                .map(|(_, last_ms)| last_ms);
            let further = best
                .as_ref()
                .is_none_or(|(b, _)| index.data_bytes > b.data_bytes);
            if further {
                best = Some((index, last_ms));
            }
            if best
                .as_ref()
                .is_some_and(|(b, _)| b.data_bytes == data_bytes)
            {
                break;
            }
        }
        let (mut index, last_ms) = best.expect("read at least once");
        let whole = index.data_bytes == data_bytes;
        if let Some(last_ms) = last_ms {
            index.note_commit_ms(last_ms);
        }
        // A corrupt end is reported by reads; the index still spans the segment.
        index.end = end;
        index.set_data_bytes(data_bytes);
        if whole {
            tracing::info!(dir = %self.dir, base = base.0, "partition log rebuilt a segment index");
            if let Err(e) = persist_index(&self.storage, &self.dir, &index).await {
                tracing::warn!(dir = %self.dir, error = %e, "partition log could not write a rebuilt index");
            }
        } else {
            tracing::warn!(dir = %self.dir, base = base.0, verified_bytes = index.data_bytes, data_bytes, "partition log could not verify a sealed segment to its end; its rebuilt index is kept in memory only");
        }
        Ok((index, whole))
    }

    /// The open handle of the sealed segment starting at `base`, opening it (and
    /// closing the previous one) if needed.
    pub(super) async fn sealed_file(&mut self, base: Offset) -> Result<&S::File, LogError> {
        if self.sealed_file.as_ref().is_none_or(|(b, _)| *b != base) {
            if let Some((_, old)) = self.sealed_file.take() {
                old.close().await.map_err(io_err("close sealed segment"))?;
            }
            let path = join(&self.dir, &segment_file_name(base));
            let file = self
                .storage
                .open(&path, OpenMode::Existing)
                .await
                .map_err(io_err("open sealed segment"))?;
            self.sealed_file = Some((base, file));
        }
        Ok(&self.sealed_file.as_ref().expect("just opened").1)
    }
}
