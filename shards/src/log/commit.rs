//! `commit_durable`: the only way records become visible.
//!
//! Runs on the shard that owns the partition, one commit at a time (`&mut self`;
//! the commit combiner above queues the rest). Steps, all before the high
//! watermark moves:
//! 1. encode the records into frames (first/last-of-commit flags, contiguous
//!    offsets from the high watermark, commit time never going backwards);
//! 2. roll first if the commit would overflow the segment or the segment is old;
//! 3. prepare zeroed space;
//! 4. append every frame in one durable (`O_DSYNC`) device write: the write and
//!    its sync in one round trip (a write and an `fdatasync` where it grows the
//!    file, with no zeros prepared ahead: see `narad_io::append`);
//! 5. read the just-written bytes back from the device (O_DIRECT in production,
//!    so it is the disk that answers, not a cache) and verify each frame's CRC,
//!    offsets and flags, and that the bytes are the ones written;
//! 6. advance the high watermark, index the frames and cache them.
//!
//! A failure in 3 or 5, or a write in 4 refused for space, rewinds the appender
//! to the mark taken before 3, so a retry succeeds. A failure in 5 comes after
//! the frames reached the disk: before the commit returns, every block it wrote
//! is repaired and synced (the first one written again from memory, the others
//! zeroed), so none of its frames is left for a later, shorter commit and a
//! crash to make recovery take for records (`repair_after_read_back`); if that
//! fails, the log is poisoned. Any other failure in 4 also poisons the log: a
//! failed sync leaves the file's content unknown until a reopen scans it.
//! Invariant: the high watermark moves only at the end of step 6.

use std::ops::Range;
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_io::append::AppendMark;
use narad_io::{align_down, Storage};

use super::cache::CachedFrame;
use super::envelope::{encode_masked_envelope, envelope_len, KEY_BYTES_MAX};
#[cfg(not(feature = "broken-log-unmasked"))]
use super::frame::mask_word;
use super::frame::{
    push_record, Codec, FrameError, FrameSpec, FRAME_HEADER_BYTES, MASK_WORD_BYTES,
    RECORD_LEN_BYTES,
};
use super::outgoing::{OutgoingFrame, ReadBackFault};
use super::{LogError, PartitionLog, RecordRef, RECORD_BYTES_MAX};
use crate::ids::Offset;

/// One frame of a commit, encoded.
struct EncodedFrame {
    base: Offset,
    count: u32,
    /// Header and stored payload, as written (produced as they are copied).
    frame: OutgoingFrame,
    /// The uncompressed records area, for the cache (an uncompressed frame
    /// masks it as it is written).
    area: Bytes,
}

impl EncodedFrame {
    fn end(&self) -> Offset {
        Offset(self.base.0 + u64::from(self.count))
    }

    fn len(&self) -> usize {
        self.frame.len()
    }
}

/// A frame's bytes as [`narad_io::AppendFile`] writes them.
impl narad_io::AppendSource for EncodedFrame {
    fn len(&self) -> usize {
        self.frame.len()
    }

    fn copy_to(&self, from: usize, out: &mut [u8]) {
        narad_io::AppendSource::copy_to(&self.frame, from, out)
    }
}

/// What one commit cost the device, for the storage metrics: the owner reads it
/// after a successful commit ([`PartitionLog::last_commit_io`]) rather than the
/// log recording metrics itself, so the log stays free of any metrics registry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitIo {
    /// Step 3: preparing zeroed space (when due).
    pub write: Duration,
    /// Step 4: the durable write of the frames (write and sync).
    pub sync: Duration,
    /// Bytes of frames the commit wrote (headers included, padding not).
    pub bytes: u64,
}

/// The most bytes one record can add to a commit as written: its length prefix
/// and envelope, and a frame header and mask word in case it opens a frame of its
/// own (a frame holds at least one record, and compression never makes one
/// larger). Records
/// whose bounds sum to at most `commit_bytes_max` always fit one commit, so a
/// caller can cut a run of any size into commits the log takes.
pub fn commit_bytes_bound(key: Option<&[u8]>, payload_len: usize) -> usize {
    FRAME_HEADER_BYTES + MASK_WORD_BYTES + RECORD_LEN_BYTES + envelope_len(key, payload_len)
}

impl<S: Storage> PartitionLog<S> {
    /// Makes `records` durable and visible, or nothing of them. Returns their
    /// offsets. See the module documentation for the steps and failure rules.
    pub async fn commit_durable(
        &mut self,
        records: &[RecordRef<'_>],
        now_ms: u64,
    ) -> Result<Range<Offset>, LogError> {
        self.last_commit_io = None;
        if self.poisoned {
            return Err(LogError::Poisoned);
        }
        self.check_batch(records)?;
        let start = self.high_watermark;
        if records.is_empty() {
            return Ok(start..start);
        }
        let commit_ms = now_ms.max(self.last_commit_ms);
        let frames = self.encode_commit(records, start, commit_ms);
        let commit_bytes: u64 = frames.iter().map(|f| f.len() as u64).sum();
        if commit_bytes > self.config.commit_bytes_max as u64 {
            // Frame headers can push a batch of tiny records over the limit; the
            // limit bounds what recovery reads, so it holds for the bytes on disk.
            return Err(LogError::InvalidBatch(format!(
                "commit of {commit_bytes} bytes on disk exceeds commit_bytes_max {}",
                self.config.commit_bytes_max
            )));
        }
        self.note_commit_bytes(commit_bytes);
        if self.hint_to_retire || self.stale_hint {
            // Before anything passes the tail the hint names (see `hint.rs`).
            #[cfg(not(feature = "broken-log-trust-stale-hint"))]
            super::hint::retire(&self.storage, &self.dir)
                .await
                .map_err(super::io_err("retire the tail hint"))?;
            self.hint_to_retire = false;
            self.stale_hint = false;
        }
        let data_bytes = self.active.file.len();
        let overflow = data_bytes + commit_bytes > self.config.segment_bytes_max;
        if data_bytes > 0 && (overflow || self.roll_due_by_age(now_ms, self.config.segment_ms)) {
            if let Err(e) = self.roll().await {
                self.commit_failed = true;
                return Err(e);
            }
        }
        let mark = self.active.file.mark();
        let io = match self.write_sync_verify(&frames, commit_bytes, &mark).await {
            Ok(io) => io,
            Err(e) => {
                self.active.file.rewind(&mark);
                self.commit_failed = true;
                return Err(e);
            }
        };
        self.publish(frames, mark.len(), commit_ms);
        self.last_commit_io = Some(io);
        assert_eq!(
            self.high_watermark.0,
            start.0 + records.len() as u64,
            "offsets are dense"
        );
        Ok(start..self.high_watermark)
    }

    /// Refuses a batch the log cannot hold, before anything is written.
    fn check_batch(&self, records: &[RecordRef<'_>]) -> Result<(), LogError> {
        let mut total_bytes = 0usize;
        for (i, record) in records.iter().enumerate() {
            if record.key.is_some_and(|k| k.len() > KEY_BYTES_MAX) {
                return Err(LogError::InvalidBatch(format!(
                    "record {i}: key longer than {KEY_BYTES_MAX} bytes"
                )));
            }
            if record.payload.len() > RECORD_BYTES_MAX {
                return Err(LogError::InvalidBatch(format!(
                    "record {i}: payload longer than {RECORD_BYTES_MAX} bytes"
                )));
            }
            total_bytes += RECORD_LEN_BYTES + envelope_len(record.key, record.payload.len());
        }
        if total_bytes > self.config.commit_bytes_max {
            return Err(LogError::InvalidBatch(format!(
                "commit of {total_bytes} bytes exceeds commit_bytes_max {}",
                self.config.commit_bytes_max
            )));
        }
        Ok(())
    }

    /// Cuts the records into frames of about `frame_area_bytes_target` bytes.
    fn encode_commit(
        &self,
        records: &[RecordRef<'_>],
        start: Offset,
        commit_ms: u64,
    ) -> Vec<EncodedFrame> {
        let target = self.config.frame_area_bytes_target;
        let codec = if self.config.zstd_level.is_some() {
            Codec::Zstd
        } else {
            Codec::None
        };
        let level = self.config.zstd_level.unwrap_or(0);
        let record_bytes =
            |r: &RecordRef<'_>| RECORD_LEN_BYTES + envelope_len(r.key, r.payload.len());
        let largest = records.iter().map(record_bytes).max().unwrap_or(0);
        let mut left: usize = records.iter().map(record_bytes).sum();
        // A records area is built once, sized up front (a frame ends at the record
        // that takes its area to the target); it stays in memory for the cache
        // while the frame carries it masked.
        let fresh = |left: usize| Vec::with_capacity(left.min(target + largest));
        let mut frames: Vec<EncodedFrame> = Vec::new();
        let mut building = fresh(left);
        let mut base = start;
        let mut count = 0u32;
        for (i, record) in records.iter().enumerate() {
            let len = envelope_len(record.key, record.payload.len());
            push_record(&mut building, len, |out| {
                encode_masked_envelope(out, record.key, commit_ms, record.payload, record.mask)
            });
            left -= RECORD_LEN_BYTES + len;
            count += 1;
            let last = i + 1 == records.len();
            if building.len() >= target || last {
                let spec = FrameSpec {
                    base_offset: base,
                    record_count: count,
                    codec,
                    first_of_commit: frames.is_empty(),
                    last_of_commit: last,
                };
                let mut area =
                    std::mem::replace(&mut building, if last { Vec::new() } else { fresh(left) });
                // The cache charges an area's length: room sized for the
                // largest record of the commit, and left unused, goes back.
                if area.capacity() > area.len() + area.len() / 4 {
                    area.shrink_to_fit();
                }
                let area = Bytes::from(area);
                #[cfg(not(feature = "broken-log-unmasked"))]
                let frame = OutgoingFrame::new(spec, &area, level, mask_word());
                #[cfg(feature = "broken-log-unmasked")]
                let frame = OutgoingFrame::unmasked(spec, &area, level);
                let encoded = EncodedFrame {
                    base,
                    count,
                    frame,
                    area,
                };
                base = encoded.end();
                count = 0;
                frames.push(encoded);
            }
        }
        assert_eq!(base.0, start.0 + records.len() as u64);
        assert_eq!(left, 0);
        frames
    }

    /// Steps 3 to 5, timing 3 and 4. The caller rewinds on error.
    async fn write_sync_verify(
        &mut self,
        frames: &[EncodedFrame],
        commit_bytes: u64,
        mark: &AppendMark,
    ) -> Result<CommitIo, LogError> {
        let write_start = Instant::now();
        let end = mark.len() + commit_bytes;
        self.prepare_active(end).await?;
        // Zeros landing after this commit's write would wipe it.
        assert!(
            end <= self.active.prepared_bytes() || self.active.preparing.is_none(),
            "a commit past the prepared space runs beside zeros in flight"
        );
        let sync_start = Instant::now();
        // One `O_DSYNC` write, or a write and a sync where it grows the file
        // (no zeros prepared ahead of it): see `narad_io::append`.
        if let Err(e) = self.active.file.append_durable_from(frames).await {
            if narad_io::out_of_space(&e) {
                // Refused for space before any of it went out (a commit
                // refused in part, after a piece was written, is an error of
                // another kind): the device holds what the log does, and the
                // caller rewinds.
                return Err(super::io_err("append frames")(e));
            }
            self.poisoned = true;
            tracing::error!(dir = %self.dir, error = %e, "partition log durable write failed; log poisoned until reopened");
            return Err(LogError::SyncFailed(e));
        }
        let io = CommitIo {
            write: sync_start - write_start,
            sync: sync_start.elapsed(),
            bytes: commit_bytes,
        };
        #[cfg(not(feature = "broken-no-readback"))]
        if let Err(e) = self
            .verify_read_back(frames, mark.len(), commit_bytes)
            .await
        {
            self.active.file.rewind(mark);
            self.unsettled_tail = true;
            self.repair_after_read_back(mark.len() + commit_bytes).await;
            return Err(e);
        }
        self.prepare_ahead(mark.len() + commit_bytes).await;
        Ok(io)
    }

    /// After a read-back that failed once its fdatasync had succeeded, the device
    /// may hold the commit's frames, whole or damaged, in every block it wrote,
    /// up to `end`:
    /// - the first block, whose head is the end of the last acknowledged commit:
    ///   left damaged, a close or a crash would have recovery cut that commit;
    /// - the blocks after it, holding frames whose CRCs may well verify. The
    ///   next commit overwrites from the high watermark, but a shorter one
    ///   leaves some of them past its end; were a later commit, starting there,
    ///   torn by a crash, recovery could walk from its first frame on into the
    ///   stale frames whose offsets follow (the offsets of both count from the
    ///   same high watermark) and recover records never acknowledged as that
    ///   commit.
    ///
    /// So the first block is written again from memory and every block after
    /// it, through `end`, as zeros (what prepared space holds), then synced and
    /// read back, before the failed commit returns and so before any other
    /// commit: the device then holds exactly what the log does. If
    /// any step fails, the log is poisoned and commits nothing more until it is
    /// reopened (whose scan zeros whatever lies past the recovered tail).
    #[cfg_attr(feature = "broken-no-readback", allow(dead_code))]
    async fn repair_after_read_back(&mut self, end: u64) {
        use narad_io::{align_up, BlockFile};

        let head = self.active.tail_block.clone();
        assert_eq!(
            self.active.file.tail(),
            &head[..],
            "rewound to the last commit"
        );
        let pos = align_down(self.active.file.len());
        let len = (align_up(end) - pos) as usize;
        let file = &mut self.active.file;
        let repaired = async {
            file.rewrite_tail_zeroed_to(end).await?;
            file.sync().await?;
            file.file()
                .read_with(pos, len, |read| {
                    read[..head.len()] == head[..] && read[head.len()..].iter().all(|&b| b == 0)
                })
                .await
        }
        .await;
        match repaired {
            Ok(true) => {
                tracing::warn!(dir = %self.dir, pos, end, "partition log wrote the last commit's final block again and zeroed the failed commit's blocks after a failed read-back")
            }
            outcome => {
                self.poisoned = true;
                tracing::error!(dir = %self.dir, pos, end, ?outcome, "partition log could not repair the blocks of a commit whose read-back failed; log poisoned until reopened");
            }
        }
    }

    /// Step 5: reads back every block the append wrote and checks it: the
    /// rewritten head of the first block still holds the earlier commits' bytes,
    /// every frame verifies (CRC, offsets, flags) and is the bytes written, and the
    /// padding after the last frame is zeros.
    #[cfg_attr(feature = "broken-no-readback", allow(dead_code))]
    async fn verify_read_back(
        &self,
        frames: &[EncodedFrame],
        pos: u64,
        commit_bytes: u64,
    ) -> Result<(), LogError> {
        use narad_io::{align_up, BlockFile};

        let head = &self.active.tail_block;
        assert_eq!(
            align_down(pos) + head.len() as u64,
            pos,
            "the tail block ends at the mark"
        );
        let len = (align_up(pos + commit_bytes) - align_down(pos)) as usize;
        let first = frames.first().map_or(self.high_watermark, |f| f.base);
        let mismatch =
            |offset: Offset, detail: String| LogError::ReadBackMismatch { offset, detail };
        let check = |read: &[u8]| {
            if read[..head.len()] != head[..] {
                return Err(mismatch(
                    first,
                    "the rewritten head of the first block changed".to_string(),
                ));
            }
            let at = head.len() + verify_frames(&read[head.len()..], frames)?;
            assert_eq!(at - head.len(), commit_bytes as usize);
            if read[at..].iter().any(|&b| b != 0) {
                return Err(mismatch(
                    first,
                    "the padding after the commit is not zeros".to_string(),
                ));
            }
            Ok(())
        };
        // Checked in the buffer the device filled: nothing is copied out.
        self.active
            .file
            .file()
            .read_with(align_down(pos), len, check)
            .await
            .map_err(super::io_err("read back"))?
    }

    /// Step 6: the commit is durable and verified; make it visible.
    fn publish(&mut self, frames: Vec<EncodedFrame>, pos: u64, commit_ms: u64) {
        let interval = self.config.index_interval_bytes;
        let mut at = pos;
        // The new partial last block: the bytes written from its start to the
        // end, which the appender holds.
        self.active.tail_block.clear();
        self.active
            .tail_block
            .extend_from_slice(self.active.file.tail());
        for frame in frames {
            assert_eq!(
                frame.base, self.high_watermark,
                "frames follow the high watermark"
            );
            self.active
                .index
                .note_frame(at, frame.base, frame.end(), interval, false);
            self.active.last_frame_pos = Some(at);
            at += frame.len() as u64;
            self.high_watermark = frame.end();
            self.cache.borrow_mut().push(CachedFrame {
                base: frame.base,
                count: frame.count,
                area: frame.area,
            });
        }
        assert_eq!(
            at,
            self.active.file.len(),
            "the appender ends at the high watermark"
        );
        assert!(
            commit_ms >= self.last_commit_ms,
            "commit times never go backwards"
        );
        assert_eq!(
            self.active.tail_block.len() as u64,
            at - align_down(at),
            "tail block tracks the file"
        );
        self.active.index.note_commit_ms(commit_ms);
        self.active.index.set_data_bytes(at);
        self.active.first_commit_ms.get_or_insert(commit_ms);
        self.last_commit_ms = commit_ms;
    }
}

/// Checks that `read` starts with exactly the `frames` of one commit: each one
/// verifies (CRC, bounds), carries the offsets, count and commit flags written,
/// and is byte for byte what was written. Returns the bytes they span.
#[cfg_attr(feature = "broken-no-readback", allow(dead_code))]
fn verify_frames(read: &[u8], frames: &[EncodedFrame]) -> Result<usize, LogError> {
    let mut at = 0usize;
    for (i, frame) in frames.iter().enumerate() {
        let mismatch = |detail: String| LogError::ReadBackMismatch {
            offset: frame.base,
            detail,
        };
        let header =
            super::frame::decode_header(&read[at..]).map_err(|e| mismatch(e.to_string()))?;
        let expected = (
            frame.base,
            frame.count,
            i == 0,
            i + 1 == frames.len(),
            frame.len(),
        );
        let found = (
            header.base_offset,
            header.record_count,
            header.first_of_commit,
            header.last_of_commit,
            header.frame_bytes(),
        );
        if expected != found {
            return Err(mismatch(format!("header {found:?}, wrote {expected:?}")));
        }
        let bytes = read
            .get(at..at + frame.len())
            .ok_or_else(|| mismatch(FrameError::Short.to_string()))?;
        match frame.frame.check_read_back(bytes) {
            Ok(()) => {}
            Err(ReadBackFault::BadCrc) => return Err(mismatch(FrameError::BadCrc.to_string())),
            Err(ReadBackFault::Differs) => {
                return Err(mismatch("bytes differ from those written".to_string()))
            }
        }
        at += frame.len();
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::envelope::encode_envelope;

    /// One uncompressed first-and-last frame of a commit at offset 10,
    /// holding `payload` as its only record, masked with `word`.
    fn encoded(payload: &[u8], word: u64) -> EncodedFrame {
        let mut area = Vec::new();
        push_record(&mut area, envelope_len(None, payload.len()), |out| {
            encode_envelope(out, None, 1_000, payload)
        });
        let area = Bytes::from(area);
        let spec = FrameSpec {
            base_offset: Offset(10),
            record_count: 1,
            codec: Codec::None,
            first_of_commit: true,
            last_of_commit: true,
        };
        EncodedFrame {
            base: Offset(10),
            count: 1,
            frame: OutgoingFrame::new(spec, &area, 0, word),
            area,
        }
    }

    fn laid_out(frame: &EncodedFrame) -> Vec<u8> {
        let mut bytes = vec![0; frame.len()];
        narad_io::AppendSource::copy_to(frame, 0, &mut bytes);
        bytes
    }

    #[test]
    fn a_read_back_of_another_valid_frame_with_the_same_header_fails() {
        // What a device that dropped this write and kept an earlier, failed
        // commit of the same offsets and size would return: a frame whose CRC,
        // offsets, count, flags and length all check.
        let written = encoded(b"the records of this commit", 0x1111_2222_3333_4444);
        let stale = encoded(b"an earlier commit's record", 0x5555_6666_7777_8888);
        assert_eq!(written.len(), stale.len());
        let frames = [written];
        assert_eq!(
            verify_frames(&laid_out(&frames[0]), &frames).unwrap(),
            frames[0].len()
        );
        match verify_frames(&laid_out(&stale), &frames) {
            Err(LogError::ReadBackMismatch { offset, detail }) => {
                assert_eq!(offset, Offset(10));
                assert!(detail.contains("differ"), "{detail}");
            }
            other => panic!("a stale frame passed the read-back: {other:?}"),
        }
    }
}
