//! Opening a partition log's directory: listing its segments, setting the sealed
//! ones up without reading them, and recovering the active one, from its tail
//! hint ([`hint`]) when a clean close left one that still holds, else by reading
//! and scanning it whole.
//!
//! Runs on the shard that owns the partition, once per open. A full scan holds
//! the active segment in memory (up to `segment_file_bytes_max`, and a second
//! and third copy while rereads disagree), so at most [`ScanGate`]'s permits run
//! at once on a shard: a restart after a crash, when every busy partition is
//! scanned, reads them a few at a time instead of loading them all together.
//!
//! [`ScanGate`]: super::ScanGate

use std::collections::VecDeque;
use std::ops::Range;
use std::rc::Rc;

use narad_io::append::read_exact_at;
use narad_io::file::{join, OpenMode};
use narad_io::{align_down, align_up, AppendFile, BlockFile, Storage};

use super::hint;
use super::recovery::{frame_commit_ms, scan_tail_above, AcknowledgedEnd, TailScan};
use super::segment::{segment_file_name, SealedSegment};
use super::{io_err, ActiveSegment, LogConfig, LogError};
use crate::ids::Offset;

/// What opening the directory found.
pub(super) struct OpenedSegments<F> {
    pub sealed: VecDeque<SealedSegment>,
    pub active: ActiveSegment<Rc<F>>,
    pub next_offset: Offset,
    pub last_commit_ms: u64,
    pub gaps: Vec<Range<Offset>>,
    /// The active segment was taken from its tail hint, which must be retired
    /// before the next commit ([`hint::retire`]).
    pub from_hint: bool,
    /// An intact hint of the active segment did not hold, and the segment was
    /// scanned: it is retired before the next commit too.
    pub stale_hint: bool,
}

fn parse_base(name: &str, suffix: &str) -> Option<Offset> {
    let digits = name.strip_suffix(suffix)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().map(Offset)
}

/// Lists the directory, sets sealed segments up without reading them, and recovers
/// the active (last) one.
pub(super) async fn open_segments<S: Storage>(
    storage: &S,
    dir: &str,
    config: &LogConfig,
) -> Result<OpenedSegments<S::File>, LogError> {
    let names = storage
        .list(dir)
        .await
        .map_err(io_err("list partition dir"))?;
    // A tail hint means an earlier open made the directory and its parents
    // durable (every open either syncs them here or finds a hint an earlier
    // one left), so this open spares their syncs; otherwise, the directory may
    // be new, or an earlier life may have died before its entry was durable.
    let hinted = names.iter().any(|n| n == hint::HINT_FILE);
    if !hinted {
        storage
            .create_dir_all(dir)
            .await
            .map_err(io_err("create partition dir"))?;
    }
    let mut bases: Vec<Offset> = names.iter().filter_map(|n| parse_base(n, ".log")).collect();
    bases.sort();
    for name in &names {
        // A temporary index from a crash, or the index of a segment retention
        // deleted just before a crash: neither is referenced any more.
        let orphan_index =
            parse_base(name, ".index").is_some_and(|b| bases.binary_search(&b).is_err());
        if name.ends_with(".tmp") || orphan_index {
            storage
                .remove(&join(dir, name))
                .await
                .map_err(io_err("remove stale file"))?;
        }
    }
    let active_base = bases.pop().unwrap_or(Offset(0));
    let mut sealed = VecDeque::with_capacity(bases.len());
    for (i, &base) in bases.iter().enumerate() {
        let end = bases.get(i + 1).copied().unwrap_or(active_base);
        // Its size is all the open needs of it: a `stat`, not an open.
        let file_bytes = storage
            .size_of(&join(dir, &segment_file_name(base)))
            .await
            .map_err(io_err("size sealed segment"))?;
        // Never trust a length from the disk beyond what the log could have written.
        let data_bytes = file_bytes.min(config.segment_file_bytes_max());
        sealed.push_back(SealedSegment {
            base,
            end,
            data_bytes,
            index: None,
        });
    }
    let (recovered, hint_use) = recover_active(storage, dir, active_base, config, hinted).await?;
    Ok(OpenedSegments {
        sealed,
        active: recovered.0,
        next_offset: recovered.1,
        last_commit_ms: recovered.2,
        gaps: recovered.3,
        from_hint: hint_use == HintUse::Trusted,
        stale_hint: hint_use == HintUse::Rejected,
    })
}

/// Reads of the active segment at open, at most, while they disagree and verify
/// less than the best read before them ...
const TAIL_READS_MAX: usize = 4;
/// ... and in all, however they compare.
const TAIL_READS_HARD_MAX: usize = 16;

/// The recovered active segment, its end offset, its newest commit time and its
/// corrupt gaps.
pub(super) type Recovered<F> = (ActiveSegment<Rc<F>>, Offset, u64, Vec<Range<Offset>>);

/// The end of the last non-zero byte.
fn garbage_end(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .rposition(|&b| b != 0)
        .map_or(0, |p| p as u64 + 1)
}

/// What the open made of a tail hint in the directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HintUse {
    /// None, or none intact for the active segment.
    Absent,
    /// It held: the active segment was taken from it.
    Trusted,
    /// Intact, but it did not hold: the segment was scanned, with its end as
    /// the floor.
    Rejected,
}

/// Scans the active segment for its verified tail and positions the appender
/// after it; with a tail hint in the directory (`hinted`) that still holds,
/// takes the tail from it instead ([`hint`]).
async fn recover_active<S: Storage>(
    storage: &S,
    dir: &str,
    base: Offset,
    config: &LogConfig,
    hinted: bool,
) -> Result<(Recovered<S::File>, HintUse), LogError> {
    // An intact hint of this segment that does not hold still says where a
    // clean close saw the data end: the scan cuts nothing below that.
    let (mut floor, mut floor_commit_ms) = (None, 0);
    if hinted {
        if let Some(found) = hint::load(storage, dir, base).await {
            floor_commit_ms = found.index.max_commit_ms;
            floor = Some(AcknowledgedEnd {
                data_bytes: found.index.data_bytes,
                end: found.index.end,
            });
            if let Some(recovered) = hint::recover(storage, dir, base, config, found).await? {
                return Ok((recovered, HintUse::Trusted));
            }
        }
    }
    let _scanning = match &config.scan_gate {
        Some(gate) => Some(gate.enter().await),
        None => None,
    };
    let path = join(dir, &segment_file_name(base));
    let file = storage
        .open(&path, OpenMode::CreateOrOpen)
        .await
        .map_err(io_err("open active segment"))?;
    let size = file.size().await.map_err(io_err("size active segment"))?;
    // An active segment never holds more than one segment or one commit plus a
    // preparation chunk; reading more would only read garbage.
    let readable = config.segment_file_bytes_max();
    if size > readable {
        refuse_data_past(&file, &path, readable, size).await?;
    }
    let read_len = size.min(readable) as usize;
    let mut bytes = read_exact_at(&file, 0, read_len)
        .await
        .map_err(io_err("read active segment"))?;
    let mut scan = scan_tail_above(&bytes, base, config.index_interval_bytes, floor);
    // Whatever the scan leaves out (a non-zero byte anywhere past the verified tail,
    // in its own last block too, or a gap) may be a bit this read flipped rather than
    // bad bytes on the disk, and cutting it would destroy a durable, acknowledged
    // commit: the next commit takes its offsets and overwrites it. So before
    // anything is cut or zeroed the segment is read again, until two reads in a row
    // agree, and the longest verified tail any read gave is kept: a CRC-valid frame
    // cannot be made up by a bad read.
    if garbage_end(&bytes) > scan.data_bytes || !scan.gaps.is_empty() {
        let rank = |scan: &TailScan| (scan.data_bytes, std::cmp::Reverse(scan.gaps.len()));
        // The last read, when it is not the one kept in `bytes`.
        let mut previous: Option<Vec<u8>> = None;
        let mut stable = false;
        // Only a read that verifies less than the best so far counts: bad
        // reads that each go bad somewhere else (a later commit each time)
        // must not end the rereading while a commit is still cut.
        let (mut counted, mut reads) = (1, 1);
        while counted < TAIL_READS_MAX && reads < TAIL_READS_HARD_MAX {
            let again = read_exact_at(&file, 0, read_len)
                .await
                .map_err(io_err("read active segment"))?;
            reads += 1;
            if again == *previous.as_ref().unwrap_or(&bytes) {
                stable = true;
                break;
            }
            tracing::warn!(
                dir,
                "two reads of the active segment differ: the device returned unstable data"
            );
            let rescan = scan_tail_above(&again, base, config.index_interval_bytes, floor);
            if rank(&rescan) < rank(&scan) {
                counted += 1;
            }
            // On a tie the newer read wins: it may be the first of two that agree.
            if rank(&rescan) >= rank(&scan) {
                bytes = again;
                scan = rescan;
                previous = None;
            } else {
                previous = Some(again);
            }
        }
        if !stable {
            tracing::warn!(
                dir,
                reads,
                "no two reads of the active segment agreed; keeping the longest verified tail"
            );
        }
    }
    let rotted_tail = scan
        .gaps
        .last()
        .filter(|g| g.end == scan.next_offset && Some(g.end) == floor.map(|f| f.end));
    if let Some(rotted) = rotted_tail {
        tracing::error!(
            dir,
            start = rotted.start.0,
            end = rotted.end.0,
            "partition log: the last commits before the clean close no longer verify (bit rot, not a torn write); they are kept as a corrupt gap, not cut"
        );
    }
    let times = |pos: Option<usize>| pos.and_then(|p| frame_commit_ms(&bytes[p..]));
    let first_commit_ms = times(scan.first_frame_pos).map(|t| t.0);
    let mut last_commit_ms = times(scan.last_frame_pos).map_or(0, |t| t.1);
    if rotted_tail.is_some() {
        // The newest commits are unreadable; the close noted their time.
        last_commit_ms = last_commit_ms.max(floor_commit_ms);
    }
    let data_bytes = scan.data_bytes;
    // Zero what a torn commit left after the tail, so stale frames can never be
    // mistaken for data by a later scan. Losing this write to a crash is harmless:
    // the scan rules already refuse those frames.
    let garbage_end = garbage_end(&bytes);
    if garbage_end > align_up(data_bytes) {
        let from = align_up(data_bytes);
        let zeros = vec![0u8; (align_up(garbage_end) - from) as usize];
        file.write_at(from, &zeros)
            .await
            .map_err(io_err("scrub torn tail"))?;
        tracing::info!(
            dir,
            data_bytes,
            garbage_end,
            "partition log cut a torn tail"
        );
    }
    // The scan may have accepted frames that a killed process wrote but never
    // synced (they sit in the device's cache, readable and valid). Publishing
    // them as committed before they are durable would let a later power loss take
    // back visible records and reuse their offsets, so sync before anything is
    // published. A failed sync fails the open.
    file.sync_data().await.map_err(LogError::SyncFailed)?;
    let appender = AppendFile::open_at(Rc::new(file), data_bytes)
        .await
        .map_err(io_err("position appender"))?;
    // The index the roll seals carries the newest commit time retention judges
    // the segment by; the scan does not note it.
    let mut index = scan.index;
    index.note_commit_ms(last_commit_ms);
    let active = ActiveSegment {
        base,
        file: appender,
        tail_block: bytes[align_down(data_bytes) as usize..data_bytes as usize].to_vec(),
        index,
        first_commit_ms,
        last_frame_pos: scan.last_frame_pos.map(|p| p as u64),
        preparing: None,
    };
    let hint_use = if floor.is_some() {
        HintUse::Rejected
    } else {
        HintUse::Absent
    };
    Ok((
        (active, scan.next_offset, last_commit_ms, scan.gaps),
        hint_use,
    ))
}

/// An active segment longer than this configuration allows was written under
/// a larger segment or commit size. Past the limit it may hold only zeros (a
/// preparation chunk): anything else is acknowledged records, which a scan
/// capped at the limit would take for a torn tail and cut. So the open is
/// refused, and nothing is written, until the sizes it was written with are
/// configured again.
async fn refuse_data_past<F: BlockFile>(
    file: &F,
    path: &str,
    readable: u64,
    size: u64,
) -> Result<(), LogError> {
    const CHUNK_BYTES: u64 = 1 << 20;
    let mut pos = readable;
    while pos < size {
        let len = (size - pos).min(CHUNK_BYTES) as usize;
        let chunk = read_exact_at(file, pos, len)
            .await
            .map_err(io_err("read active segment"))?;
        if let Some(at) = chunk.iter().position(|&b| b != 0) {
            return Err(LogError::Config(format!(
                "{path} holds data at byte {}, past the {readable} bytes a segment may span in this configuration: it was written with a larger segment or commit size, which must be configured again to open it",
                pos + at as u64
            )));
        }
        pos += len as u64;
    }
    Ok(())
}
