//! The read path: records by offset, strictly below the high watermark.
//!
//! Runs on the shard that owns the partition. Order of sources: the recent-frame
//! cache (no I/O; it always ends at the high watermark), then the segment holding
//! the offset, entered through its sparse index, so a read scans at most one index
//! interval plus one frame before the first record it returns.
//!
//! A frame that fails its CRC is read from the device again (twice at most: a
//! bad read is not bad bytes, and consumers skip corrupt records for good), and
//! only then reported as [`ReadItem::Corrupt`] with the offsets
//! it makes unreadable: the reader resynchronises on the next valid frame of the
//! segment, or gives up the rest of the segment if none follows. Never a panic, and
//! never a silent skip.
//!
//! Invariants: items are contiguous from the offset asked for and never reach the
//! high watermark; a read always makes progress (one record even above
//! `max_bytes`); reads from disk are bounded by the segment's size.

use std::borrow::Cow;
use std::ops::Range;

use bytes::Bytes;
use narad_io::append::read_exact_at;
use narad_io::{align_down, align_up, BlockFile, Storage};

use super::cache::{CachedFrame, FrameCache};
use super::envelope::decode_envelope;
use super::frame::{check_frame, decode_header, records_area, records_in, FRAME_HEADER_BYTES};
use super::index::SparseIndex;
use super::recovery::find_frame;
use super::{io_err, LogError, PartitionLog, ReadBatch, ReadItem, Record};
use crate::ids::Offset;

/// Bytes a segment read fetches at once: several frames per device read.
const READ_WINDOW_BYTES: usize = 256 * 1024;

/// The read being assembled, with its limits.
struct Assembly {
    batch: ReadBatch,
    records_max: usize,
    bytes_max: usize,
    bytes: usize,
    /// The high watermark: nothing at or above it is returned.
    end: Offset,
    /// A record was refused for `max_bytes`: the read ends before it.
    stopped: bool,
}

impl Assembly {
    /// An empty read from `from`, ending before `end` at the latest.
    fn new(from: Offset, records_max: usize, bytes_max: usize, end: Offset) -> Self {
        Assembly {
            batch: ReadBatch {
                items: Vec::new(),
                next_offset: from,
            },
            records_max,
            bytes_max,
            bytes: 0,
            end,
            stopped: false,
        }
    }

    fn full(&self) -> bool {
        self.stopped
            || self.batch.items.len() >= self.records_max
            || self.bytes >= self.bytes_max
            || self.batch.next_offset >= self.end
    }

    /// Adds a record at `next_offset`; false (and nothing added) when the batch is
    /// full or the record would overflow `max_bytes` behind other items.
    fn push_record(&mut self, record: Record) -> bool {
        assert_eq!(
            record.offset, self.batch.next_offset,
            "reads are contiguous"
        );
        let size = record.payload.len() + record.key.as_ref().map_or(0, Bytes::len);
        if self.full() {
            return false;
        }
        if !self.batch.items.is_empty() && self.bytes + size > self.bytes_max {
            self.stopped = true;
            return false;
        }
        self.bytes += size;
        self.batch.next_offset = record.offset.next();
        self.batch.items.push(ReadItem::Record(record));
        true
    }

    /// Reports `range` as unreadable, clipped to what this read still covers.
    fn push_corrupt(&mut self, range: Range<Offset>) {
        let start = range.start.max(self.batch.next_offset);
        let end = range.end.min(self.end);
        if start >= end || self.full() {
            return;
        }
        assert_eq!(
            start, self.batch.next_offset,
            "corrupt ranges are contiguous with the read"
        );
        self.batch.items.push(ReadItem::Corrupt(start..end));
        self.batch.next_offset = end;
    }

    /// Adds the records of one frame's area from `next_offset` on. A records area
    /// that passed its CRC but does not decode (a writer bug) is reported corrupt.
    fn push_frame(&mut self, base: Offset, count: u32, area: &Bytes) {
        let end = Offset(base.0 + u64::from(count));
        if end <= self.batch.next_offset {
            return;
        }
        let Ok(ranges) = records_in(area, count) else {
            self.push_corrupt(base..end);
            return;
        };
        let skip = (self.batch.next_offset.0.saturating_sub(base.0)) as usize;
        for (i, range) in ranges.enumerate().skip(skip) {
            // A full batch takes nothing more: not even a record that does not
            // decode, which would otherwise be dropped here and leave the next
            // record out of line with the read.
            if self.full() {
                return;
            }
            let offset = Offset(base.0 + i as u64);
            let envelope = area.slice(range);
            let Ok(view) = decode_envelope(&envelope) else {
                self.push_corrupt(offset..offset.next());
                continue;
            };
            let record = Record {
                offset,
                key: view.key.map(|k| envelope.slice(k)),
                commit_time_ms: view.commit_time_ms,
                payload: envelope.slice(view.payload),
            };
            if !self.push_record(record) {
                return;
            }
        }
    }
}

/// What a read of a partition asks for: records from `from` on, at most
/// `max_records` of them and about `max_bytes` of keys and payloads (at least
/// one record whatever its size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadRange {
    pub from: Offset,
    pub max_records: usize,
    pub max_bytes: usize,
}

impl ReadRange {
    pub fn new(from: Offset, max_records: usize, max_bytes: usize) -> ReadRange {
        ReadRange {
            from,
            max_records,
            max_bytes,
        }
    }
}

/// Reads from the recent-frame cache alone, without the log: `None` when the
/// cache does not cover `from` (the caller reads through the log). The cache ends
/// exactly at the high watermark, so an offset at or past its end has nothing to
/// read yet.
pub fn read_cached(cache: &FrameCache, range: ReadRange) -> Option<ReadBatch> {
    let ReadRange {
        from,
        max_records,
        max_bytes,
    } = range;
    let (start, end) = (cache.start()?, cache.end()?);
    if from < start {
        return None;
    }
    let mut assembly = Assembly::new(from, max_records, max_bytes, end);
    for frame in cache.frames_from(from) {
        if assembly.full() {
            break;
        }
        assembly.push_frame(frame.base, frame.count, &frame.area);
    }
    assert!(assembly.batch.next_offset <= end.max(from));
    Some(assembly.batch)
}

/// A window of one segment's bytes, refilled as scans move on, and kept between
/// reads of the partition with where the last scan stopped.
///
/// Records handed out are slices of the window (no copy per frame or record);
/// a refill starts a new buffer, and the old one lives on only while records
/// cut from it are still held.
#[derive(Default)]
pub(super) struct Window {
    /// Block-aligned device position of `bytes[0]`.
    start: u64,
    bytes: Bytes,
    /// Where the bytes that were data when they were read end: the aligned read
    /// also brought in what lay past the segment's end, which a later commit to
    /// the active segment overwrites.
    valid_end: u64,
    /// The frame boundary the last scan of this segment stopped at: its first
    /// offset and byte position. A consumer reading on from there starts at it
    /// instead of at the sparse index point before it, which would check and
    /// skip up to an index interval of frames on every read.
    resume: Option<(Offset, u64)>,
    /// Bytes this window has read from the device, over all its refills.
    fetched_bytes: u64,
}

impl Window {
    /// Forgets the bytes held, so that the next [`Window::get`] reads the
    /// device again (the count of bytes fetched stays).
    fn forget_bytes(&mut self) {
        self.bytes = Bytes::new();
        self.start = 0;
        self.valid_end = 0;
    }

    /// Makes `[pos, pos + len)` available (clamped to `limit`) and returns it.
    async fn get<F: BlockFile>(
        &mut self,
        file: &F,
        pos: u64,
        len: usize,
        limit: u64,
    ) -> Result<Bytes, LogError> {
        let len = len.min(limit.saturating_sub(pos) as usize);
        let inside = pos >= self.start && pos + len as u64 <= self.valid_end;
        if !inside {
            let fetch = len
                .max(READ_WINDOW_BYTES)
                .min(limit.saturating_sub(pos) as usize);
            // Aligned at both ends, so the device's buffer is the window's bytes:
            // copied out once, into memory nothing zeroed first.
            let start = align_down(pos);
            let window_len = (align_up(pos + fetch as u64) - start) as usize;
            let buf = file
                .read_with(start, window_len, <[u8]>::to_vec)
                .await
                .map_err(io_err("read segment"))?;
            self.fetched_bytes += buf.len() as u64;
            self.valid_end = (start + buf.len() as u64).min(limit);
            self.bytes = Bytes::from(buf);
            self.start = start;
        }
        let at = (pos - self.start) as usize;
        Ok(self.bytes.slice(at..at + len))
    }
}

/// Where a segment read runs: the segment's file, index, offset end and byte end.
struct SegmentView<'a, F> {
    file: &'a F,
    index: &'a SparseIndex,
    end: Offset,
    limit_bytes: u64,
}

impl<S: Storage> PartitionLog<S> {
    /// Reads up to `max_records` records (and about `max_bytes` of keys and
    /// payloads, at least one record) from `from`, strictly below the high
    /// watermark. Offsets below the oldest retained one are `AgedOut`.
    pub async fn read(
        &mut self,
        from: Offset,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<ReadBatch, LogError> {
        let oldest = self.oldest_offset();
        if from < oldest {
            return Err(LogError::AgedOut {
                requested: from,
                oldest,
            });
        }
        let mut assembly = Assembly::new(from, max_records, max_bytes, self.high_watermark);
        // Bounded: every pass adds an item or moves to a later segment.
        while !assembly.full() {
            let before = (assembly.batch.next_offset, assembly.batch.items.len());
            self.read_step(&mut assembly).await?;
            if (assembly.batch.next_offset, assembly.batch.items.len()) == before {
                break;
            }
        }
        assert!(assembly.batch.next_offset <= self.high_watermark.max(from));
        Ok(assembly.batch)
    }

    /// One source: the cache, a recovered gap, or one segment.
    async fn read_step(&mut self, assembly: &mut Assembly) -> Result<(), LogError> {
        let at = assembly.batch.next_offset;
        let served_from_cache = {
            let cache = self.cache.borrow();
            let covered = cache.start().is_some_and(|start| start <= at);
            if covered {
                for frame in cache.frames_from(at) {
                    assembly.push_frame(frame.base, frame.count, &frame.area);
                    if assembly.full() {
                        break;
                    }
                }
            }
            covered
        };
        if served_from_cache {
            return Ok(());
        }
        if let Some(frame) = self
            .last_frame
            .as_ref()
            .filter(|f| f.base <= at && at < f.end())
        {
            assembly.push_frame(frame.base, frame.count, &frame.area);
            return Ok(());
        }
        if let Some(gap) = self.gaps.iter().find(|g| g.contains(&at)) {
            assembly.push_corrupt(gap.clone());
            return Ok(());
        }
        if at >= self.active.base {
            let base = self.active.base;
            let mut window = self.take_window(base);
            let view = SegmentView {
                file: self.active.file.file(),
                index: &self.active.index,
                end: self.high_watermark,
                limit_bytes: self.active.file.len(),
            };
            let fetched_before = window.fetched_bytes;
            let read = read_segment(view, assembly, &mut window, &mut self.last_frame).await;
            self.device_read_bytes += window.fetched_bytes - fetched_before;
            self.read_window = Some((base, window));
            return read;
        }
        let i = self.sealed.partition_point(|s| s.base <= at) - 1;
        let (base, end, limit_bytes) = (
            self.sealed[i].base,
            self.sealed[i].end,
            self.sealed[i].data_bytes,
        );
        self.sealed_index(i).await?;
        self.sealed_file(base).await?;
        let mut window = self.take_window(base);
        let view = SegmentView {
            file: &self.sealed_file.as_ref().expect("opened above").1,
            index: self.sealed[i].index.as_ref().expect("loaded above"),
            end,
            limit_bytes,
        };
        let fetched_before = window.fetched_bytes;
        let read = read_segment(view, assembly, &mut window, &mut self.last_frame).await;
        self.device_read_bytes += window.fetched_bytes - fetched_before;
        self.read_window = Some((base, window));
        read
    }

    /// The last read's window if it is of the segment at `base`, else an empty one.
    fn take_window(&mut self, base: Offset) -> Window {
        match self.read_window.take() {
            Some((b, window)) if b == base => window,
            _ => Window::default(),
        }
    }
}

/// Reads frames of one segment from the index point at or before the read's next
/// offset, until the read is full or the segment ends.
async fn read_segment<F: BlockFile>(
    view: SegmentView<'_, F>,
    assembly: &mut Assembly,
    window: &mut Window,
    last_frame: &mut Option<CachedFrame>,
) -> Result<(), LogError> {
    let next = assembly.batch.next_offset;
    let (mut expected, mut pos) = view.index.lookup(next);
    if let Some((offset, at)) = window.resume.take() {
        if expected < offset && offset <= next {
            (expected, pos) = (offset, at);
        }
    }
    // Fresh device reads of the frame at `pos` since it last failed its check.
    let mut fresh_reads = 0;
    while expected < view.end && !assembly.full() {
        let header_bytes = window
            .get(view.file, pos, FRAME_HEADER_BYTES, view.limit_bytes)
            .await?;
        let frame_len = decode_header(&header_bytes)
            .map(|h| h.frame_bytes())
            .unwrap_or(0);
        let frame = window
            .get(view.file, pos, frame_len, view.limit_bytes)
            .await?;
        match check_frame(&frame) {
            Ok((header, stored)) if header.base_offset == expected && frame.len() == frame_len => {
                match records_area(&header, stored) {
                    Ok(area) => {
                        let area = match area {
                            Cow::Borrowed(area) => frame.slice_ref(area),
                            Cow::Owned(area) => Bytes::from(area),
                        };
                        assembly.push_frame(header.base_offset, header.record_count, &area);
                        *last_frame = Some(CachedFrame {
                            base: header.base_offset,
                            count: header.record_count,
                            area,
                        });
                    }
                    Err(_) => assembly.push_corrupt(expected..header.end_offset()),
                }
                pos += frame_len as u64;
                expected = header.end_offset();
                fresh_reads = 0;
            }
            // A committed frame was verified when it was written, so a check
            // that fails is a bad read until fresh reads from the device agree:
            // calling its records corrupt would have consumers skip them for good.
            _ if fresh_reads < FRESH_READS_MAX => {
                window.forget_bytes();
                fresh_reads += 1;
            }
            _ => match resync(&view, pos, expected).await? {
                Some((next_pos, next_base)) => {
                    assembly.push_corrupt(expected..next_base);
                    (pos, expected) = (next_pos, next_base);
                }
                None => {
                    assembly.push_corrupt(expected..view.end);
                    return Ok(());
                }
            },
        }
    }
    window.resume = Some((expected, pos));
    Ok(())
}

/// How many times a frame that fails its check is read from the device again
/// before its records are reported corrupt.
const FRESH_READS_MAX: u32 = 2;

/// After a corrupt frame at `pos`: the next valid frame of the segment that holds
/// later offsets than `expected`, by a scan of the rest of the segment (a rare
/// path, bounded by the segment's size).
async fn resync<F: BlockFile>(
    view: &SegmentView<'_, F>,
    pos: u64,
    expected: Offset,
) -> Result<Option<(u64, Offset)>, LogError> {
    let rest = view.limit_bytes.saturating_sub(pos) as usize;
    let bytes = read_exact_at(view.file, pos, rest)
        .await
        .map_err(io_err("read segment"))?;
    let end = view.end;
    let found = find_frame(&bytes, 1, |_, h| {
        h.base_offset > expected && h.end_offset() <= end
    });
    Ok(found.map(|(at, h)| (pos + at as u64, h.base_offset)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::envelope::encode_envelope;

    /// A records area of `envelopes`, each behind its big-endian length.
    fn area(envelopes: &[Vec<u8>]) -> Bytes {
        let mut out = Vec::new();
        for envelope in envelopes {
            out.extend_from_slice(&(envelope.len() as u32).to_be_bytes());
            out.extend_from_slice(envelope);
        }
        Bytes::from(out)
    }

    fn envelope(payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_envelope(&mut out, None, 7, payload);
        out
    }

    #[test]
    fn a_full_read_stops_before_a_record_that_does_not_decode() {
        // A frame that passed its checksum whose middle record does not decode.
        let frame = area(&[envelope(b"k"), vec![0xFF, 0xFF], envelope(b"k+2")]);
        for records_max in 1..=3 {
            let mut read = Assembly::new(Offset(10), records_max, 1 << 20, Offset(13));
            read.push_frame(Offset(10), 3, &frame);
            let items = &read.batch.items;
            assert!(matches!(&items[0], ReadItem::Record(r) if r.offset == Offset(10)));
            if records_max >= 2 {
                assert!(
                    matches!(&items[1], ReadItem::Corrupt(r) if *r == (Offset(11)..Offset(12)))
                );
            }
            if records_max == 3 {
                assert!(matches!(&items[2], ReadItem::Record(r) if r.offset == Offset(12)));
            }
            assert_eq!(items.len(), records_max);
            assert_eq!(read.batch.next_offset, Offset(10 + records_max as u64));
        }
    }
}
