//! The dispatcher's reader: walks durable records in sequence order.
//!
//! Runs on the WAL's shard, beside the writer. It never reads past the durable end,
//! so it never sees a record that could still be lost. Records of recently flushed
//! batches are read from the WAL's memory (the flushed staging buffers, kept up to
//! a byte budget), so a dispatcher that keeps up never touches the device; their
//! checksums are not verified again, since they are the very bytes the checksums
//! were computed over when staged (frames read from disk always are). A kept
//! batch is immutable shared bytes and only ever the staged buffer of a
//! write that succeeded; what this gives up is catching a memory fault in it,
//! which no record held in memory between two checks is protected from either
//! (ECC is the host's part). A reader
//! that falls behind reads from disk: its own file handle and one chunk buffer,
//! starting from the nearest position mark the writer left. Because the writer
//! keeps appending to the active segment after a chunk was read, a frame that does
//! not decode where a durable one must be is read again from the device once
//! before it counts as corrupt.

use bytes::Bytes;
use narad_io::file::{join, OpenMode};
use narad_io::Storage;

use super::frame::{decode_encoded_frame, decode_frame, StoredRecord};
use super::segment::{frame_at, segment_name, ChunkBuf};
use super::{Wal, WalError};
use crate::ids::Seq;

struct OpenSegment<F> {
    first: Seq,
    file: F,
    /// Byte position of the frame carrying `seq`.
    pos: u64,
    seq: Seq,
}

/// A sequential reader over one WAL's durable records.
pub struct WalReader<S: Storage> {
    wal: Wal<S>,
    next: Seq,
    segment: Option<OpenSegment<S::File>>,
    chunk: ChunkBuf,
    /// The kept batch last read from memory, and the seq and byte position of
    /// the frame after the last one read in it.
    memory: Option<(Bytes, Seq, usize)>,
}

impl<S: Storage> WalReader<S> {
    pub(super) fn new(wal: Wal<S>, from: Seq) -> Self {
        Self {
            wal,
            next: from,
            segment: None,
            chunk: ChunkBuf::default(),
            memory: None,
        }
    }

    /// The sequence number the next record read will carry.
    pub fn position(&self) -> Seq {
        self.next
    }

    /// Moves the reader to `seq` (a rescan goes back, a skip goes forward).
    pub fn seek(&mut self, seq: Seq) {
        if seq < self.next {
            self.segment = None;
        }
        self.next = seq;
    }

    /// Hands up to `max_records` durable records to `visit`, in order, without
    /// copying them. Returns how many it visited (0 when caught up).
    pub async fn read(
        &mut self,
        max_records: usize,
        visit: impl FnMut(Seq, StoredRecord<'_>),
    ) -> Result<usize, WalError> {
        self.read_bounded(max_records, u64::MAX, visit).await
    }

    /// [`WalReader::read`], stopping also once the records visited add up to
    /// `max_bytes` of frames (always after at least one record), so that a
    /// reader of large records takes a bounded amount at a time.
    pub async fn read_bounded(
        &mut self,
        max_records: usize,
        max_bytes: u64,
        mut visit: impl FnMut(Seq, StoredRecord<'_>),
    ) -> Result<usize, WalError> {
        let mut visited = 0;
        let mut bytes = 0u64;
        while visited < max_records && self.next < self.wal.durable_next() {
            if visited > 0 && bytes >= max_bytes {
                break;
            }
            let left = (max_records - visited, max_bytes - bytes);
            if let Some((n, read)) = self.read_from_memory(left, &mut visit)? {
                visited += n;
                bytes += read;
                continue;
            }
            self.open_segment_for(self.next).await?;
            let seg = self.segment.as_mut().expect("opened above");
            let mut retried = false;
            let (seq, len) = loop {
                match frame_at(&mut self.chunk, &seg.file, seg.pos).await? {
                    Ok((seq, len)) if seq == seg.seq => break (seq, len),
                    bad if retried => {
                        return Err(WalError::Corrupt(
                            format!(
                                "{} at byte {}: expected seq {}, found {bad:?}",
                                segment_name(seg.first),
                                seg.pos,
                                seg.seq
                            )
                            .into(),
                        ))
                    }
                    _ => {
                        self.chunk.invalidate();
                        retried = true;
                    }
                }
            };
            if seq >= self.next {
                let frame_bytes = self.chunk.bytes_at(&seg.file, seg.pos, len).await?;
                let frame = decode_frame(frame_bytes)
                    .map_err(|e| WalError::Corrupt(format!("{e:?}").into()))?;
                let record = StoredRecord::decode(frame.body, seq, &self.wal.inner.key)
                    .map_err(|e| WalError::Corrupt(format!("seq {seq}: {e:?}").into()))?;
                visit(seq, record);
                visited += 1;
                bytes += len as u64;
                self.next = seq.next();
            }
            seg.pos += len as u64;
            seg.seq = seq.next();
        }
        Ok(visited)
    }

    /// Reads from the kept batch holding the next record, if there is one, up to
    /// `(records, bytes)` (at least one record); returns the records visited and
    /// their frame bytes.
    fn read_from_memory(
        &mut self,
        (max_records, max_bytes): (usize, u64),
        visit: &mut impl FnMut(Seq, StoredRecord<'_>),
    ) -> Result<Option<(usize, u64)>, WalError> {
        let (found, durable_next) = {
            let sh = self.wal.inner.shared.borrow();
            (sh.recent_holding(self.next), sh.durable_next)
        };
        let Some((first, frames)) = found else {
            return Ok(None);
        };
        let (mut seq, mut pos) = match &self.memory {
            Some((buf, seq, pos)) if same_batch(buf, &frames) && *seq <= self.next => (*seq, *pos),
            _ => (first, 0),
        };
        let mut visited = 0;
        let mut bytes = 0u64;
        while pos < frames.len()
            && visited < max_records
            && seq < durable_next
            && (visited == 0 || bytes < max_bytes)
        {
            let corrupt =
                |why: String| WalError::Corrupt(format!("kept batch at seq {seq}: {why}").into());
            let frame =
                decode_encoded_frame(&frames[pos..]).map_err(|e| corrupt(format!("{e:?}")))?;
            if frame.seq != seq {
                return Err(corrupt(format!("frame carries seq {}", frame.seq)));
            }
            if seq >= self.next {
                let record =
                    StoredRecord::decode_kept(&frames, frame.body, seq, &self.wal.inner.key)
                        .map_err(|e| corrupt(format!("{e:?}")))?;
                visit(seq, record);
                visited += 1;
                bytes += frame.len as u64;
                self.next = seq.next();
            }
            pos += frame.len;
            seq = seq.next();
        }
        self.memory = Some((frames, seq, pos));
        // The disk cursor is behind now; a later disk read starts from a mark.
        self.segment = None;
        Ok(Some((visited, bytes)))
    }

    /// Makes `self.segment` the segment holding `seq`, positioned at or before it.
    async fn open_segment_for(&mut self, seq: Seq) -> Result<(), WalError> {
        let first = {
            let sh = self.wal.inner.shared.borrow();
            let index = sh.segments.partition_point(|&first| first <= seq);
            if index == 0 {
                return Err(WalError::Corrupt(
                    format!("seq {seq} is below the oldest WAL segment (already compacted)").into(),
                ));
            }
            sh.segments[index - 1]
        };
        if let Some(open) = self.segment.as_mut() {
            if open.first == first && open.seq <= seq {
                // A seek forward (a rescan pass that ended early) jumps to the
                // nearest mark rather than walking every frame up to it.
                let mark = self.wal.inner.shared.borrow().mark_before(first, seq);
                if let Some(mark) = mark.filter(|m| m.seq > open.seq) {
                    open.pos = mark.pos;
                    open.seq = mark.seq;
                }
                return Ok(());
            }
        }
        let inner = &self.wal.inner;
        let file = inner
            .storage
            .open(&join(&inner.dir, &segment_name(first)), OpenMode::Existing)
            .await?;
        let mark = inner.shared.borrow().mark_before(first, seq);
        let (pos, at) = mark.map_or((0, first), |m| (m.pos, m.seq));
        self.chunk.invalidate();
        self.segment = Some(OpenSegment {
            first,
            file,
            pos,
            seq: at,
        });
        Ok(())
    }
}

/// Whether two handles share one kept batch (each batch is its own allocation).
fn same_batch(a: &Bytes, b: &Bytes) -> bool {
    a.as_ptr() == b.as_ptr() && a.len() == b.len()
}
