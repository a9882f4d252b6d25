//! The tail hint: what a clean close knew about the active segment, so that the
//! next open learns where the data ends without reading the whole segment.
//!
//! Runs on the shard that owns the partition, at close and at open. Without it,
//! an open reads the active segment whole (up to 64 MiB by default), scans every
//! frame and syncs the file: a restart of a node with thousands of written
//! partitions reads gigabytes before its backlog is known, and a node whose
//! open-log budget is smaller than the partitions in use paid that read again
//! at every reopen (a 64-partition topic with 4 MiB in each, on a budget of 16
//! logs a shard, read 12 GB in 10 seconds of produce).
//!
//! A clean close (nothing failed since the open: no failed write, sync or
//! read-back, no corrupt gap) writes `tail.hint` in the partition directory: the
//! segment's base, its data length, the position of its last frame, its first
//! commit time and its sparse index. The file is overwritten in place and never
//! synced: losing it, or tearing it, costs one full scan at the next open.
//!
//! An open trusts a hint only if the segment still ends where the hint says:
//! - the hint is intact (CRC) and names the active segment;
//! - the frame at the hint's last position verifies, is the last frame of a
//!   commit, ends exactly at the hint's data length and at its end offset, and
//!   carries its newest commit time;
//! - the bytes after the data, to the end of the next block, are zeros.
//!
//! A hint is used once. A log opened from one zeroes it, synced, before its
//! first commit (a log that only serves reads leaves it be), so no hint names
//! a tail that a later commit passed. The last rule above guards the same
//! thing a second way: a commit is written at the data's end, and a commit
//! that was acknowledged was made durable whole, its first bytes (the frame
//! magic, never zero) included, so any acknowledged commit past a hint shows
//! as non-zero bytes right after the hint's tail and sends the open to the full
//! scan. A commit torn by a crash with its first sectors lost may leave bytes
//! further on; they were never acknowledged, and they are what a failed write
//! leaves in a running log too: the next commit overwrites from the tail, and
//! the scan rules refuse a frame that does not continue the commit before it.
//!
//! A hint in the directory, trusted or not, also spares the open its directory
//! syncs: whatever open came first in this directory synced it and its parents
//! before anything was committed there, and a hint is only written by a log
//! opened after that (see `open.rs`).
//!
//! What a trusted hint skips is the scan for rot inside the segment: a frame
//! that rotted since the close is found by the read that meets it (reads verify
//! every frame and report unreadable ranges), not at open.
//!
//! A hint that is intact but does not hold (its last frame no longer verifies,
//! say) still tells the full scan where the close saw the data end: every
//! commit below that end was acknowledged, so the scan keeps what no longer
//! verifies there as a corrupt gap instead of cutting it as a torn tail
//! (`recovery::scan_tail_above`). Such a hint is retired before the next
//! commit as a trusted one is (a read of it that failed once would otherwise
//! leave it to a later open, as the floor of a tail written differently since).

use std::io;
use std::rc::Rc;

use narad_io::append::read_exact_at;
use narad_io::file::{join, OpenMode};
use narad_io::{align_down, align_up, AppendFile, BlockFile, Storage, BLOCK_BYTES};

use super::frame::check_frame;
use super::index::{SparseIndex, INDEX_FILE_BYTES_MAX};
use super::recovery::{frame_commit_ms, AcknowledgedEnd};
use super::segment::segment_file_name;
use super::{ActiveSegment, LogConfig, LogError};
use crate::ids::Offset;

/// The hint's file name in the partition directory.
pub const HINT_FILE: &str = "tail.hint";

const HINT_MAGIC: [u8; 4] = *b"NTAL";
const HINT_VERSION: u8 = 1;
/// Magic, version, reserved, first commit time, last frame position, CRC.
const HINT_HEADER_BYTES: usize = 28;
/// Stands for "none" in the header's optional fields.
const NONE: u64 = u64::MAX;

/// What a clean close knew about the active segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct TailHint {
    /// Commit time of the segment's first record, if it has one.
    pub first_commit_ms: Option<u64>,
    /// Position of the segment's last frame, if it has one.
    pub last_frame_pos: Option<u64>,
    /// The segment's index: base, end offset, data length, newest commit time.
    pub index: SparseIndex,
}

impl TailHint {
    /// The file image, padded to a whole block.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(BLOCK_BYTES);
        out.extend_from_slice(&HINT_MAGIC);
        out.push(HINT_VERSION);
        out.extend_from_slice(&[0, 0, 0]);
        out.extend_from_slice(&self.first_commit_ms.unwrap_or(NONE).to_be_bytes());
        out.extend_from_slice(&self.last_frame_pos.unwrap_or(NONE).to_be_bytes());
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_be_bytes());
        debug_assert_eq!(out.len(), HINT_HEADER_BYTES);
        self.index.encode_into(&mut out);
        out.resize(align_up(out.len() as u64) as usize, 0);
        out
    }

    /// Decodes an image (trailing bytes allowed); `None` unless it is an intact
    /// hint of the segment starting at `base`.
    pub fn decode(bytes: &[u8], base: Offset) -> Option<Self> {
        let header = bytes.get(..HINT_HEADER_BYTES)?;
        if header[..4] != HINT_MAGIC || header[4] != HINT_VERSION {
            return None;
        }
        let u64_at = |at: usize| u64::from_be_bytes(header[at..at + 8].try_into().unwrap());
        let crc = u32::from_be_bytes(header[24..28].try_into().unwrap());
        if crc32c::crc32c(&header[..24]) != crc {
            return None;
        }
        let some = |v: u64| (v != NONE).then_some(v);
        let index = SparseIndex::decode(&bytes[HINT_HEADER_BYTES..], base)?;
        Some(Self {
            first_commit_ms: some(u64_at(8)),
            last_frame_pos: some(u64_at(16)),
            index,
        })
    }
}

/// Writes the hint over the previous one, unsynced (see the module docs). The
/// file is created once; later closes overwrite it without a directory sync.
pub(super) async fn store<S: Storage>(storage: &S, dir: &str, hint: &TailHint) -> io::Result<()> {
    let path = join(dir, HINT_FILE);
    let file = match storage.open(&path, OpenMode::Existing).await {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            storage.open(&path, OpenMode::CreateOrOpen).await?
        }
        Err(e) => return Err(e),
    };
    let written = file.write_at(0, &hint.encode()).await;
    file.close().await?;
    written
}

/// Makes the hint useless before the first commit after an open that trusted
/// it: zeros over it, synced (see the module docs). A missing hint is fine.
pub(super) async fn retire<S: Storage>(storage: &S, dir: &str) -> io::Result<()> {
    let file = match storage
        .open(&join(dir, HINT_FILE), OpenMode::Existing)
        .await
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let zeroed = async {
        file.write_at(0, &[0u8; BLOCK_BYTES]).await?;
        file.sync_data().await
    }
    .await;
    file.close().await?;
    zeroed
}

/// Where the hint file's bytes (`image`) say a clean close saw the data of
/// the segment starting at `base` end, if they are an intact hint of it: the
/// floor an offline reader scans with, as the open does.
pub fn acknowledged_end(image: &[u8], base: Offset) -> Option<AcknowledgedEnd> {
    TailHint::decode(image, base).map(|hint| AcknowledgedEnd {
        data_bytes: hint.index.data_bytes,
        end: hint.index.end,
    })
}

/// Reads the hint for the segment starting at `base`; `None` when there is
/// none, it cannot be read, or it is not an intact hint of that segment.
pub(super) async fn load<S: Storage>(storage: &S, dir: &str, base: Offset) -> Option<TailHint> {
    let file = storage
        .open(&join(dir, HINT_FILE), OpenMode::Existing)
        .await
        .ok()?;
    let image = async {
        let size = file.size().await?;
        let len = align_up(size).min(align_up((HINT_HEADER_BYTES + INDEX_FILE_BYTES_MAX) as u64));
        let mut image = vec![0u8; len as usize];
        file.read_at(0, &mut image).await?;
        io::Result::Ok(image)
    }
    .await;
    let _ = file.close().await;
    TailHint::decode(&image.ok()?, base)
}

/// The active segment as the hint describes it, if the segment still ends
/// where the hint says (see the module docs); `Ok(None)` sends the open to the
/// full scan. Reads the last frame and the block after the data, nothing else,
/// and syncs nothing: the data was synced before the close wrote the hint.
pub(super) async fn recover<S: Storage>(
    storage: &S,
    dir: &str,
    base: Offset,
    config: &LogConfig,
    hint: TailHint,
) -> Result<Option<super::open::Recovered<S::File>>, LogError> {
    let data_bytes = hint.index.data_bytes;
    let shape_holds = match (hint.last_frame_pos, hint.first_commit_ms) {
        (Some(last), Some(_)) => {
            last < data_bytes
                && hint.index.end > base
                && hint
                    .index
                    .last_entry()
                    .is_none_or(|e| u64::from(e.pos) <= last)
        }
        (None, None) => data_bytes == 0 && hint.index.end == base,
        _ => false,
    };
    if !shape_holds || data_bytes > config.segment_file_bytes_max() {
        return Ok(None);
    }
    let path = join(dir, &segment_file_name(base));
    let Ok(file) = storage.open(&path, OpenMode::Existing).await else {
        return Ok(None);
    };
    match check_tail(&file, &hint).await {
        Ok(Some(tail_block)) => {
            let file = Rc::new(file);
            // The appender reads the last block again until two reads agree.
            // The check verified only the last frame's bytes of that block:
            // a read that disagrees means a bad read somewhere, so scan.
            let agreed = match AppendFile::open_at(file.clone(), data_bytes).await {
                Ok(appender) if appender.tail() == tail_block.as_slice() => Some(appender),
                _ => None,
            };
            let Some(appender) = agreed else {
                tracing::debug!(
                    dir,
                    "reads of the last block disagree; scanning the segment"
                );
                let _ = file.close().await;
                return Ok(None);
            };
            let active = ActiveSegment {
                base,
                file: appender,
                tail_block,
                index: hint.index.clone(),
                first_commit_ms: hint.first_commit_ms,
                last_frame_pos: hint.last_frame_pos,
                preparing: None,
            };
            let last_commit_ms = if data_bytes == 0 {
                0
            } else {
                hint.index.max_commit_ms
            };
            Ok(Some((active, hint.index.end, last_commit_ms, Vec::new())))
        }
        outcome => {
            if let Err(e) = outcome {
                tracing::debug!(dir, error = %e, "tail hint check failed; scanning the segment");
            }
            let _ = file.close().await;
            Ok(None)
        }
    }
}

/// Checks the segment against the hint; on success, the data bytes of its
/// last, partial block.
async fn check_tail<F: BlockFile>(file: &F, hint: &TailHint) -> io::Result<Option<Vec<u8>>> {
    let data_bytes = hint.index.data_bytes;
    let size = file.size().await?;
    if size < data_bytes {
        return Ok(None);
    }
    let start = align_down(hint.last_frame_pos.unwrap_or(data_bytes));
    // To the end of the block after the data's last byte: where the next
    // commit would have begun.
    let end = align_up(data_bytes + 1);
    let bytes = read_exact_at(file, start, (end - start) as usize).await?;
    let at = |pos: u64| (pos - start) as usize;
    let after = &bytes[at(data_bytes)..];
    #[cfg(not(feature = "broken-log-trust-stale-hint"))]
    if after.iter().any(|&b| b != 0) {
        return Ok(None);
    }
    #[cfg(feature = "broken-log-trust-stale-hint")]
    let _ = after;
    if let Some(last) = hint.last_frame_pos {
        let frame = &bytes[at(last)..at(data_bytes)];
        let Ok((header, _)) = check_frame(frame) else {
            return Ok(None);
        };
        let ends_the_data = header.frame_bytes() == frame.len()
            && header.last_of_commit
            && header.end_offset() == hint.index.end;
        let newest_ms = frame_commit_ms(frame).map(|t| t.1);
        if !ends_the_data || newest_ms != Some(hint.index.max_commit_ms) {
            return Ok(None);
        }
    }
    let tail_block = bytes[at(align_down(data_bytes))..at(data_bytes)].to_vec();
    Ok(Some(tail_block))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TailHint {
        let mut index = SparseIndex::new(Offset(40));
        index.note_frame(0, Offset(40), Offset(43), 1024, false);
        index.note_frame(2000, Offset(43), Offset(47), 1024, false);
        index.note_commit_ms(1_700_000_000_123);
        index.set_data_bytes(3100);
        TailHint {
            first_commit_ms: Some(1_700_000_000_000),
            last_frame_pos: Some(2000),
            index,
        }
    }

    #[test]
    fn round_trip_and_damage_is_refused() {
        let hint = sample();
        let image = hint.encode();
        assert_eq!(image.len() % BLOCK_BYTES, 0);
        assert_eq!(TailHint::decode(&image, Offset(40)), Some(hint.clone()));
        assert_eq!(
            TailHint::decode(&image, Offset(41)),
            None,
            "another segment"
        );
        for byte in [0, 4, 9, 17, 25, 30, 60, 80] {
            let mut bad = image.clone();
            bad[byte] ^= 0x04;
            assert_eq!(TailHint::decode(&bad, Offset(40)), None, "flip at {byte}");
        }
        let empty = TailHint {
            first_commit_ms: None,
            last_frame_pos: None,
            index: SparseIndex::new(Offset(9)),
        };
        assert_eq!(TailHint::decode(&empty.encode(), Offset(9)), Some(empty));
    }
}
