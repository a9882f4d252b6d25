//! WAL segment files: names, the recovery scan, and the torn-tail rule.
//!
//! A segment is named after the first sequence number it holds
//! (`<20 digits>.wal`) and holds a dense run of sequence numbers up to the first of
//! the next segment. Only the last segment can end in a torn write, because a
//! segment is fully synced before the next one is created. Spare files
//! (`next-segment.prep`, `spare-*.wal`) hold no records that matter.
//!
//! The torn-tail rule. Writes into a prepared or recycled segment overwrite blocks
//! in place, and a crash can keep any subset of the unsynced sectors, so the last
//! segment may hold "a bad frame, then valid frames" after a crash. Every write is
//! synced in runs of at most [`WRITE_RUN_BYTES_MAX`], so valid frames that sit
//! within that distance after the first bad frame, with sequence numbers at or past
//! the one expected there, belong to the torn run and were never acknowledged: the
//! scan ends at the bad frame. The flush loop writes one run while the previous
//! run's sync is in flight, so two runs can be unsynced at once: the window is
//! twice a run. A valid frame past that distance means bytes that were
//! synced went bad, and recovery fails loudly instead of guessing.

use std::io;

use narad_io::{align_down, BlockFile, BLOCK_BYTES};

use super::frame::{
    decode_frame, FrameError, FORMAT_V2, FRAME_HEADER_BYTES, FRAME_MAGIC, RECORD_BYTES_MAX,
};
use crate::ids::Seq;

/// Suffix of segment files.
pub const SEGMENT_SUFFIX: &str = ".wal";
/// The prepared next segment, renamed into place by a roll.
pub const PREP_FILE: &str = "next-segment.prep";
/// Prefix of compacted segments kept for recycling.
pub const SPARE_PREFIX: &str = "spare-";
/// The most bytes written between two syncs (one frame may exceed it alone).
pub const WRITE_RUN_BYTES_MAX: usize = 16 << 20;
/// How far past a bad frame surviving frames of a torn run can sit.
pub const TORN_WINDOW_BYTES: u64 = {
    let frame_bytes_max = FRAME_HEADER_BYTES + RECORD_BYTES_MAX;
    let run_bytes_max = if WRITE_RUN_BYTES_MAX > frame_bytes_max {
        WRITE_RUN_BYTES_MAX
    } else {
        frame_bytes_max
    };
    // A run is at most 16 MiB of frames, or one larger frame alone; its write
    // also rewrites the partial block in front of it. Two runs can be unsynced
    // at once (one syncing, the next written beside it).
    2 * (run_bytes_max + BLOCK_BYTES) as u64
};
/// The most frames a torn run can hold: a bound on how far past the expected
/// sequence number a surviving frame of it can be, used to skip stale or forged
/// headers without reading their bodies.
const TORN_RUN_SEQS_MAX: u64 = TORN_WINDOW_BYTES / FRAME_HEADER_BYTES as u64;
/// Bytes read from the device at a time while scanning.
const SCAN_CHUNK_BYTES: usize = 1 << 20;

const _: () = assert!(SCAN_CHUNK_BYTES % BLOCK_BYTES == 0);

/// The file name of the segment starting at `first`.
pub fn segment_name(first: Seq) -> String {
    format!("{:020}{SEGMENT_SUFFIX}", first.0)
}

/// The first sequence number of a segment file name, if it is one.
pub fn parse_segment_name(name: &str) -> Option<Seq> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().map(Seq)
}

/// Where a segment's valid frames end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanEnd {
    /// Byte position just past the last valid frame.
    pub end_bytes: u64,
    /// The sequence number the next frame must carry.
    pub next_seq: Seq,
    /// In the last segment: the end of surviving frames of a torn run that sat
    /// past a hole, which recovery must erase before writing again.
    pub torn_until_bytes: Option<u64>,
    /// The last sequence number among those surviving frames: if the bad frame
    /// was rot rather than a tear, the records up to it go with the erase.
    pub torn_last_seq: Option<Seq>,
    /// Damaged runs of already dispatched records the scan stepped over
    /// ([`scan_past_dispatched`]): the sequence numbers lost, and the byte
    /// position of the frame it resumed at (the first sequence number after).
    pub skipped: Vec<SkippedRun>,
}

/// Frames below the dispatch checkpoint that no longer decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedRun {
    pub seqs: std::ops::Range<Seq>,
    pub resume_bytes: u64,
}

/// Why a segment cannot be recovered.
#[derive(Debug)]
pub enum ScanError {
    Io(io::Error),
    /// A bad frame where only good frames may be.
    Corrupt {
        position_bytes: u64,
        expected: Seq,
        why: String,
    },
}

impl From<io::Error> for ScanError {
    fn from(e: io::Error) -> Self {
        ScanError::Io(e)
    }
}

/// A forward-reading buffer over a file, filled in large aligned chunks. It holds
/// no file, so one buffer serves every segment a reader walks through.
#[derive(Default)]
pub struct ChunkBuf {
    buf: Vec<u8>,
    buf_pos: u64,
    /// The last fill reached the end of the file.
    eof: bool,
}

impl ChunkBuf {
    /// Forgets the buffered bytes (the file may have changed since).
    pub fn invalidate(&mut self) {
        self.buf.clear();
        self.buf_pos = 0;
        self.eof = false;
    }

    /// The bytes from `pos` on: at least `want` of them unless the file ends first.
    pub async fn bytes_at<F: BlockFile>(
        &mut self,
        file: &F,
        pos: u64,
        want: usize,
    ) -> io::Result<&[u8]> {
        let have_end = self.buf_pos + self.buf.len() as u64;
        let covered =
            pos >= self.buf_pos && (pos + want as u64 <= have_end || (self.eof && pos <= have_end));
        if !covered {
            let start = align_down(pos);
            let len = narad_io::align_up((pos + want as u64 - start).max(SCAN_CHUNK_BYTES as u64))
                as usize;
            self.buf.resize(len, 0);
            let got = file.read_at(start, &mut self.buf).await?;
            self.buf.truncate(got);
            self.buf_pos = start;
            self.eof = got < len;
        }
        let from = ((pos - self.buf_pos) as usize).min(self.buf.len());
        Ok(&self.buf[from..])
    }
}

/// Reads of one frame a scan stops at, at most, while they disagree.
const STOP_READS_MAX: usize = 4;

/// Scans a segment from its start. `first` is the sequence number its name
/// promises; `last_expected` (for sealed segments) the last one it must hold.
///
/// A frame that fails to decode may be a bit the read flipped rather than bad
/// bytes on the disk. Ending the last segment there would take the acknowledged
/// records after it for a torn write and erase them (and a sealed segment would
/// fail the open), so before the scan ends at such a frame it reads the segment
/// again from there, until two reads in a row give the same bytes for that frame.
/// Frames a read decodes carry a valid checksum, which no bad read makes up: each
/// read continues after the frames verified so far, so the longest verified run is
/// kept. Zeros where a header would be (or the end of the file) need no second
/// read: no single flipped bit turns a frame's header into zeros.
pub async fn scan<F: BlockFile>(
    file: &F,
    first: Seq,
    last_expected: Option<Seq>,
) -> Result<ScanEnd, ScanError> {
    scan_past_dispatched(file, first, last_expected, Seq(0), None).await
}

/// [`scan`], stepping over damage that holds only records below `checkpoint`:
/// they were committed to their partitions already, so nothing is lost with
/// them, and refusing to start over them would stop the node for nothing. A
/// bad frame is stepped over when the next valid frame after it carries a
/// sequence number above the bad one's and at or below the checkpoint (frames
/// are written in sequence order, and a recycled file's stale frames carry
/// numbers below the segment's first, so no stale frame qualifies), and is a
/// format 2 frame of this WAL's key (`key_check`, the key's check word): the
/// search starts inside the bad frame, and a format 1 payload, stored as the
/// client sent it, could hold bytes that pass for frames, which a client
/// cannot make carry a key it never saw. Without a key nothing is stepped
/// over. Each run stepped over is reported in [`ScanEnd::skipped`] and logged.
pub async fn scan_past_dispatched<F: BlockFile>(
    file: &F,
    first: Seq,
    last_expected: Option<Seq>,
    checkpoint: Seq,
    key_check: Option<u32>,
) -> Result<ScanEnd, ScanError> {
    let mut reader = ChunkBuf::default();
    let mut pos = 0u64;
    let mut expected = first;
    let mut skipped = Vec::new();
    // The bytes of the frame the previous read stopped at, and where.
    let mut previous_stop: Option<(u64, Vec<u8>)> = None;
    let mut reads = 1;
    let why = 'runs: loop {
        let why = loop {
            if last_expected.is_some_and(|last| expected > last) {
                return Ok(ScanEnd {
                    end_bytes: pos,
                    next_seq: expected,
                    torn_until_bytes: None,
                    torn_last_seq: None,
                    skipped,
                });
            }
            let why = match frame_at(&mut reader, file, pos).await? {
                Ok((seq, len)) if seq == expected => {
                    pos += len as u64;
                    expected = expected.next();
                    // Past the frame a read stopped at: a bad frame further on
                    // gets reads of its own.
                    if previous_stop.take().is_some() {
                        reads = 1;
                    }
                    continue;
                }
                // A valid checksum: these are the bytes on the disk.
                Ok((seq, _)) => {
                    break format!("frame carries seq {seq} where {expected} was expected")
                }
                Err(e) => format!("{e:?}"),
            };
            let stop = stop_bytes(&mut reader, file, pos).await?;
            if stop.iter().all(|&b| b == 0) {
                break why;
            }
            if previous_stop
                .as_ref()
                .is_some_and(|(at, bytes)| *at == pos && *bytes == stop)
            {
                break why;
            }
            if reads == STOP_READS_MAX {
                tracing::warn!(
                    position_bytes = pos,
                    expected = expected.0,
                    reads,
                    "ingress WAL: no two reads of a bad frame agreed; ending the scan there"
                );
                break why;
            }
            if previous_stop.is_some() {
                tracing::warn!(
                    position_bytes = pos,
                    expected = expected.0,
                    "ingress WAL: two reads of a segment differ: the device returned unstable data"
                );
            }
            previous_stop = Some((pos, stop));
            reader.invalidate();
            reads += 1;
        };
        if let (true, Some(key_check)) = (expected < checkpoint, key_check) {
            let found =
                next_dispatched_frame(&mut reader, file, pos, expected, checkpoint, key_check);
            if let Some((at, seq)) = found.await? {
                tracing::warn!(
                position_bytes = pos,
                resume_bytes = at,
                from_seq = expected.0,
                to_seq = seq.0,
                checkpoint = checkpoint.0,
                why,
                "ingress WAL: stepping over damaged frames below the dispatch checkpoint (their records were committed already)"
            );
                skipped.push(SkippedRun {
                    seqs: expected..seq,
                    resume_bytes: at,
                });
                pos = at;
                expected = seq;
                previous_stop = None;
                reads = 1;
                continue 'runs;
            }
        }
        break why;
    };
    if let Some(last) = last_expected {
        return Err(ScanError::Corrupt {
            position_bytes: pos,
            expected,
            why: format!("sealed segment ends before seq {last}: {why}"),
        });
    }
    let torn = find_torn_frames(&mut reader, file, pos, expected).await?;
    Ok(ScanEnd {
        end_bytes: pos,
        next_seq: expected,
        torn_until_bytes: torn.map(|(until, _)| until),
        torn_last_seq: torn.map(|(_, seq)| seq),
        skipped,
    })
}

/// The first valid frame after a bad one at `bad_pos` whose sequence number
/// lies in `(expected, checkpoint]`, and where it starts; `None` when there
/// is none (the damage reaches past the checkpoint).
async fn next_dispatched_frame<F: BlockFile>(
    reader: &mut ChunkBuf,
    file: &F,
    bad_pos: u64,
    expected: Seq,
    checkpoint: Seq,
    key_check: u32,
) -> io::Result<Option<(u64, Seq)>> {
    let size_bytes = file.size().await?;
    let mut pos = bad_pos + 1;
    while let Some(at) = next_magic(reader, file, pos, size_bytes).await? {
        // Frames are in sequence order, so the first valid frame of this WAL
        // after the damage carries the next number that survived; only one at
        // or below the checkpoint is read and checked (a header outside that
        // range costs no body read), since one past it would mean undispatched
        // records went with the damage.
        let wanted = |seq: Seq| seq > expected && seq <= checkpoint;
        if let Ok((seq, _)) = frame_at_if(reader, file, at, wanted).await? {
            let format = reader
                .bytes_at(file, at + FRAME_HEADER_BYTES as u64, 5)
                .await?;
            let keyed = format.len() >= 5
                && format[0] == FORMAT_V2
                && format[1..5] == key_check.to_be_bytes();
            if keyed {
                return Ok(Some((at, seq)));
            }
        }
        pos = at + 1;
    }
    Ok(None)
}

/// A copy of the bytes that decide the frame at `pos`: its header (or what the file
/// has of it) and, if the header is plausible, the body it announces.
async fn stop_bytes<F: BlockFile>(
    reader: &mut ChunkBuf,
    file: &F,
    pos: u64,
) -> io::Result<Vec<u8>> {
    let header = reader.bytes_at(file, pos, FRAME_HEADER_BYTES).await?;
    let header_len = header.len().min(FRAME_HEADER_BYTES);
    let mut want = header_len;
    if header_len == FRAME_HEADER_BYTES && header[..4] == FRAME_MAGIC {
        let body_len = u32::from_be_bytes(header[4..8].try_into().expect("4 bytes")) as usize;
        if body_len <= RECORD_BYTES_MAX {
            want += body_len;
        }
    }
    let bytes = reader.bytes_at(file, pos, want).await?;
    Ok(bytes[..want.min(bytes.len())].to_vec())
}

/// Decodes the frame at `pos`: its sequence number and length. Reads the header
/// first so that a stale length field never makes the reader fetch more than one
/// frame's bytes.
pub async fn frame_at<F: BlockFile>(
    reader: &mut ChunkBuf,
    file: &F,
    pos: u64,
) -> io::Result<Result<(Seq, usize), FrameError>> {
    frame_at_if(reader, file, pos, |_| true).await
}

/// [`frame_at`], but a header whose sequence number `wanted` refuses is reported as
/// bad without reading or checksumming its body: recovery scans past a tear meet
/// many stale frames (and payload bytes that look like headers), and each body
/// could be up to 16 MiB.
async fn frame_at_if<F: BlockFile>(
    reader: &mut ChunkBuf,
    file: &F,
    pos: u64,
    wanted: impl Fn(Seq) -> bool,
) -> io::Result<Result<(Seq, usize), FrameError>> {
    let header = reader.bytes_at(file, pos, FRAME_HEADER_BYTES).await?;
    if header.len() < FRAME_HEADER_BYTES {
        return Ok(Err(FrameError::Short));
    }
    if header[..4] != FRAME_MAGIC {
        return Ok(Err(FrameError::BadMagic));
    }
    if !wanted(Seq(u64::from_be_bytes(
        header[8..16].try_into().expect("8 bytes"),
    ))) {
        return Ok(Err(FrameError::BadChecksum));
    }
    let body_len = u32::from_be_bytes(header[4..8].try_into().expect("4 bytes")) as usize;
    if body_len > RECORD_BYTES_MAX {
        return Ok(Err(FrameError::TooLong));
    }
    let bytes = reader
        .bytes_at(file, pos, FRAME_HEADER_BYTES + body_len)
        .await?;
    Ok(decode_frame(bytes).map(|frame| (frame.seq, frame.len)))
}

/// The position of the next frame magic at or after `pos` with room for a
/// header before `size_bytes`, if any. It looks at what the buffer holds from
/// `pos` on, read again only once fewer than a magic's bytes are left in it:
/// asking for a whole chunk from every position would read the device again at
/// each stale frame (a recycled segment holds tens of thousands), which made an
/// idle restart take seconds.
async fn next_magic<F: BlockFile>(
    reader: &mut ChunkBuf,
    file: &F,
    mut pos: u64,
    size_bytes: u64,
) -> io::Result<Option<u64>> {
    while pos + FRAME_HEADER_BYTES as u64 <= size_bytes {
        let window = reader.bytes_at(file, pos, FRAME_MAGIC.len()).await?;
        match window.windows(4).position(|w| w == FRAME_MAGIC) {
            Some(hit) => return Ok(Some(pos + hit as u64)),
            None => pos += window.len().saturating_sub(3).max(1) as u64,
        }
    }
    Ok(None)
}

/// Looks past a bad frame at `bad_pos` for valid frames of the torn run (sequence
/// numbers at or past `expected`). Returns the end of the last one and its
/// sequence number, or an error if one sits beyond the torn window.
async fn find_torn_frames<F: BlockFile>(
    reader: &mut ChunkBuf,
    file: &F,
    bad_pos: u64,
    expected: Seq,
) -> Result<Option<(u64, Seq)>, ScanError> {
    let mut torn_until = None;
    let mut pos = bad_pos + 1;
    let size_bytes = file.size().await?;
    while let Some(at) = next_magic(reader, file, pos, size_bytes).await? {
        let plausible = |seq: Seq| seq >= expected && seq.0 - expected.0 <= TORN_RUN_SEQS_MAX;
        if let Ok((seq, len)) = frame_at_if(reader, file, at, plausible).await? {
            if seq >= expected {
                if at - bad_pos > TORN_WINDOW_BYTES {
                    return Err(ScanError::Corrupt {
                        position_bytes: bad_pos,
                        expected,
                        why: format!(
                            "bad frame followed by valid seq {seq} {} bytes later, beyond any torn write",
                            at - bad_pos
                        ),
                    });
                }
                torn_until = Some((at + len as u64, seq));
            }
        }
        pos = at + 1;
    }
    Ok(torn_until)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(segment_name(Seq(42)), "00000000000000000042.wal");
        assert_eq!(
            parse_segment_name(&segment_name(Seq(u64::MAX))),
            Some(Seq(u64::MAX))
        );
        assert_eq!(parse_segment_name("checkpoint"), None);
        assert_eq!(parse_segment_name("spare-00000000000000000042.wal"), None);
        assert_eq!(parse_segment_name("0000000000000000004x.wal"), None);
    }
}
