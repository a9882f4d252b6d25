//! Scanning segment bytes: the recovery of the active segment's verified tail at
//! open, the rebuild of a sealed segment's index, and resynchronising after a
//! corrupt frame.
//!
//! Runs on the shard that owns the partition, at open and on the rare paths (a
//! missing index, a corrupt frame met by a read). Pure functions over bytes already
//! in memory: no I/O here, so every rule is tested directly.
//!
//! The rule that tells a torn tail from bit rot (active segment only):
//! - Commits are written in order, each as one write of frames flagged
//!   first-of-commit ... last-of-commit, and a commit is acknowledged only after
//!   its fdatasync. A crash can therefore damage only the last, unacknowledged
//!   commit: it may leave a hole of zeros or stale bytes, possibly followed by valid
//!   frames of that same commit, but never its first frame after a hole (the first
//!   frame starts where the hole starts).
//! - So after a bad region, a *complete commit* (a valid first-of-commit frame with
//!   contiguous frames up to a last-of-commit one) proves that the bad region was
//!   synced data that rotted: it is recorded as a corrupt gap of offsets and the scan
//!   goes on. Anything less is a torn tail and is cut at the end of the last
//!   complete commit; the next append overwrites it.
//! - Stale bytes of a failed commit (rewound, then overwritten by a shorter retry)
//!   cannot fake a complete commit on their own: their first-of-commit frame
//!   started at the very position the retry overwrote. They could end one,
//!   though: the commit after the retry starts where the retry ended, at the
//!   offsets the failed commit's later frames carry, and where its frames fall
//!   on theirs a crash that tears it (its first sectors kept, later ones lost)
//!   would leave its first frame followed by theirs, up to their last-of-commit
//!   frame. So no such frame is left on the disk: a commit whose read-back
//!   fails has every block it wrote zeroed, past the one the last acknowledged
//!   commit ends in, and synced before it returns (`commit.rs`).
//!
//! The cost of the rule, as for any log that recovers from its own tail: rot that
//! hits the last commit of the active segment looks exactly like a torn write and
//! that commit is cut. It was verified by the read-back when it was acknowledged.
//! Where a clean close left a tail hint, the open knows better
//! ([`scan_tail_above`]): nothing below the end the close recorded can be torn,
//! so rot there becomes a corrupt gap up to that end, and the log goes on after
//! it. Only rot after a crash (no hint) is still taken for a torn tail.
//!
//! Invariants: nothing here panics on arbitrary bytes; the recovered tail always
//! ends at a commit boundary; gaps are disjoint, ordered and below the tail.

use std::ops::Range;

use super::envelope::decode_envelope;
use super::frame::{
    check_frame, records_area, split_records, FrameHeader, FRAME_HEADER_BYTES, FRAME_MAGIC,
};
use super::index::SparseIndex;
use crate::ids::Offset;

/// What the scan of the active segment found.
#[derive(Debug)]
pub struct TailScan {
    /// Bytes up to the end of the last complete commit.
    pub data_bytes: u64,
    /// The high watermark: the offset after the last complete commit.
    pub next_offset: Offset,
    /// Sparse index of the committed frames.
    pub index: SparseIndex,
    /// Offset ranges of synced data that rotted.
    pub gaps: Vec<Range<Offset>>,
    /// Position of the first committed frame, if any.
    pub first_frame_pos: Option<usize>,
    /// Position of the last committed frame, if any.
    pub last_frame_pos: Option<usize>,
}

/// Finds the first position at or after `from` holding a valid frame whose header
/// satisfies `accept`.
pub fn find_frame(
    bytes: &[u8],
    from: usize,
    accept: impl Fn(usize, &FrameHeader) -> bool,
) -> Option<(usize, FrameHeader)> {
    let magic = FRAME_MAGIC.to_be_bytes();
    let mut at = from;
    while at + FRAME_HEADER_BYTES <= bytes.len() {
        if bytes[at] == magic[0] && bytes[at + 1] == magic[1] {
            if let Ok((header, _)) = check_frame(&bytes[at..]) {
                if accept(at, &header) {
                    return Some((at, header));
                }
            }
        }
        at += 1;
    }
    None
}

/// Whether the frame at `pos` (valid, first of its commit) is followed by
/// contiguous valid frames up to one that ends the commit.
fn commit_completes(bytes: &[u8], pos: usize, header: &FrameHeader) -> bool {
    let (mut at, mut current) = (pos, *header);
    loop {
        if current.last_of_commit {
            return true;
        }
        at += current.frame_bytes();
        match check_frame(bytes.get(at..).unwrap_or(&[])) {
            Ok((next, _)) if next.base_offset == current.end_offset() && !next.first_of_commit => {
                current = next
            }
            _ => return false,
        }
    }
}

/// Recovers the committed tail of the active segment from its bytes.
pub fn scan_tail(bytes: &[u8], base: Offset, interval_bytes: u64) -> TailScan {
    scan_tail_above(bytes, base, interval_bytes, None)
}

/// Where a clean close left the active segment's data (its tail hint): every
/// commit below it was acknowledged, so no crash can have torn it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcknowledgedEnd {
    pub data_bytes: u64,
    pub end: Offset,
}

/// [`scan_tail`], knowing that the data reached `floor` once: a bad region
/// below it that no complete commit follows is rot, not a torn tail, so it
/// becomes a corrupt gap up to the floor and the scan goes on from there,
/// rather than cutting acknowledged commits (whose offsets the next commit
/// would then reuse).
pub fn scan_tail_above(
    bytes: &[u8],
    base: Offset,
    interval_bytes: u64,
    mut floor: Option<AcknowledgedEnd>,
) -> TailScan {
    let mut index = SparseIndex::new(base);
    let mut gaps: Vec<Range<Offset>> = Vec::new();
    // End of the last complete commit: (position, offset).
    let mut committed = (0usize, base);
    // Frames of the commit being walked, indexed once it completes.
    let mut pending: Vec<(usize, FrameHeader)> = Vec::new();
    let (mut pos, mut next) = (0usize, base);
    let mut after_gap = false;
    let (mut first_frame_pos, mut last_frame_pos) = (None, None);
    loop {
        let valid = match check_frame(bytes.get(pos..).unwrap_or(&[])) {
            Ok((h, _)) => {
                (h.base_offset == next && h.first_of_commit == pending.is_empty()).then_some(h)
            }
            Err(_) => None,
        };
        if let Some(header) = valid {
            pending.push((pos, header));
            pos += header.frame_bytes();
            next = header.end_offset();
            if header.last_of_commit {
                for (i, (frame_pos, h)) in pending.drain(..).enumerate() {
                    index.note_frame(
                        frame_pos as u64,
                        h.base_offset,
                        h.end_offset(),
                        interval_bytes,
                        after_gap && i == 0,
                    );
                    first_frame_pos.get_or_insert(frame_pos);
                    last_frame_pos = Some(frame_pos);
                }
                committed = (pos, next);
                after_gap = false;
            }
            continue;
        }
        // A bad region starts at `pos`. Only a complete commit after it makes it a
        // gap; the search starts past the frames of the commit cut short.
        let min_base = committed.1;
        let found = find_frame(bytes, pos + 1, |at, h| {
            h.first_of_commit && h.base_offset >= min_base && commit_completes(bytes, at, h)
        });
        let Some((resume_pos, header)) = found else {
            match floor.take() {
                Some(f)
                    if f.end > committed.1
                        && f.data_bytes as usize > committed.0
                        && f.data_bytes as usize <= bytes.len() =>
                {
                    gaps.push(committed.1..f.end);
                    committed = (f.data_bytes as usize, f.end);
                    index.skip_to(f.end);
                    pending.clear();
                    (pos, next) = committed;
                    after_gap = true;
                    continue;
                }
                _ => break,
            }
        };
        if header.base_offset > committed.1 {
            gaps.push(committed.1..header.base_offset);
        }
        pending.clear();
        pos = resume_pos;
        next = header.base_offset;
        after_gap = true;
    }
    index.set_data_bytes(committed.0 as u64);
    assert!(
        gaps.iter().all(|g| g.end <= committed.1),
        "gaps lie below the tail"
    );
    TailScan {
        data_bytes: committed.0 as u64,
        next_offset: committed.1,
        index,
        gaps,
        first_frame_pos,
        last_frame_pos,
    }
}

/// Rebuilds the index of a sealed segment from its bytes, skipping corrupt regions
/// by resynchronising on the next valid frame. Also returns the position of the
/// last valid frame, whose commit time is the segment's newest.
pub fn scan_sealed(
    bytes: &[u8],
    base: Offset,
    interval_bytes: u64,
) -> (SparseIndex, Option<usize>) {
    let mut index = SparseIndex::new(base);
    let (mut pos, mut next) = (0usize, base);
    let mut last_frame_pos = None;
    let mut after_gap = false;
    while pos < bytes.len() {
        let header = match check_frame(&bytes[pos..]) {
            Ok((h, _)) if h.base_offset == next => h,
            _ => {
                let expected = next;
                match find_frame(bytes, pos + 1, |_, h| h.base_offset > expected) {
                    Some((at, h)) => {
                        pos = at;
                        after_gap = true;
                        h
                    }
                    None => break,
                }
            }
        };
        index.note_frame(
            pos as u64,
            header.base_offset,
            header.end_offset(),
            interval_bytes,
            after_gap,
        );
        after_gap = false;
        last_frame_pos = Some(pos);
        pos += header.frame_bytes();
        next = header.end_offset();
        index.set_data_bytes(pos as u64);
    }
    (index, last_frame_pos)
}

/// Commit times of the first and last record of the valid frame at `pos`.
pub fn frame_commit_ms(bytes: &[u8]) -> Option<(u64, u64)> {
    let (header, stored) = check_frame(bytes).ok()?;
    let area = records_area(&header, stored).ok()?;
    let ranges = split_records(&area, header.record_count).ok()?;
    let first = decode_envelope(&area[ranges.first()?.clone()]).ok()?;
    let last = decode_envelope(&area[ranges.last()?.clone()]).ok()?;
    Some((first.commit_time_ms, last.commit_time_ms))
}

#[cfg(test)]
mod tests {
    use super::super::envelope::{encode_envelope, envelope_len};
    use super::super::frame::{encode_frame, mask_word, push_record, Codec, FrameSpec};
    use super::*;

    /// A commit of `frames` one-record frames starting at `base`.
    fn commit(base: u64, frames: u32) -> Vec<u8> {
        let mut out = Vec::new();
        for i in 0..frames {
            let mut area = Vec::new();
            let payload = vec![b'p'; 300];
            push_record(&mut area, envelope_len(None, payload.len()), |o| {
                encode_envelope(o, None, 9, &payload)
            });
            let spec = FrameSpec {
                base_offset: Offset(base + u64::from(i)),
                record_count: 1,
                codec: Codec::None,
                first_of_commit: i == 0,
                last_of_commit: i + 1 == frames,
            };
            out.extend(encode_frame(spec, &area, 1, mask_word()));
        }
        out
    }

    #[test]
    fn clean_tail_and_zeros_after_it() {
        let mut bytes = commit(10, 2);
        bytes.extend(commit(12, 3));
        let end = bytes.len();
        bytes.resize(end + 8192, 0);
        let scan = scan_tail(&bytes, Offset(10), 4096);
        assert_eq!(
            (scan.data_bytes as usize, scan.next_offset),
            (end, Offset(15))
        );
        assert!(scan.gaps.is_empty());
        assert_eq!(
            frame_commit_ms(&bytes[scan.last_frame_pos.unwrap()..]),
            Some((9, 9))
        );
    }

    #[test]
    fn torn_commit_with_a_hole_before_its_later_frames_is_cut() {
        let mut bytes = commit(0, 2);
        let good = bytes.len();
        let torn = commit(2, 3);
        bytes.extend(&torn);
        // The first sectors of the torn commit never reached the disk.
        bytes[good..good + 512].fill(0);
        let scan = scan_tail(&bytes, Offset(0), 4096);
        assert_eq!(
            (scan.data_bytes as usize, scan.next_offset),
            (good, Offset(2))
        );
        assert!(scan.gaps.is_empty());
    }

    #[test]
    fn rot_before_a_complete_commit_is_a_gap() {
        let mut bytes = commit(0, 2);
        let rot_at = bytes.len() + 100;
        bytes.extend(commit(2, 3));
        bytes.extend(commit(5, 1));
        let end = bytes.len();
        bytes[rot_at] ^= 4;
        let scan = scan_tail(&bytes, Offset(0), 4096);
        assert_eq!(
            (scan.data_bytes as usize, scan.next_offset),
            (end, Offset(6))
        );
        assert_eq!(scan.gaps, vec![Offset(2)..Offset(5)]);
        assert_eq!(
            scan.index.lookup(Offset(5)).0,
            Offset(5),
            "indexed right after the gap"
        );
    }

    #[test]
    fn rot_in_the_last_commit_below_an_acknowledged_end_is_a_gap_not_a_cut() {
        let mut bytes = commit(0, 2);
        let good = bytes.len();
        bytes.extend(commit(2, 2));
        let end = bytes.len();
        bytes.resize(end + 4096, 0);
        bytes[good + 100] ^= 4;
        // Without knowing better, it is a torn tail.
        let scan = scan_tail(&bytes, Offset(0), 4096);
        assert_eq!(
            (scan.data_bytes as usize, scan.next_offset),
            (good, Offset(2))
        );
        // A clean close saw the data reach offset 4: the commit rotted.
        let floor = AcknowledgedEnd {
            data_bytes: end as u64,
            end: Offset(4),
        };
        let scan = scan_tail_above(&bytes, Offset(0), 4096, Some(floor));
        assert_eq!(
            (scan.data_bytes as usize, scan.next_offset),
            (end, Offset(4))
        );
        assert_eq!(scan.gaps, vec![Offset(2)..Offset(4)]);
        assert_eq!(scan.index.end, Offset(4));
        assert_eq!(scan.index.data_bytes, end as u64);
        // Commits after the floor (the log went on from it) are read as usual,
        // and a torn one after them is still cut.
        let mut more = bytes[..end].to_vec();
        more.extend(commit(4, 1));
        let after = more.len();
        let torn = commit(5, 2);
        more.extend(&torn[..torn.len() - 50]);
        let scan = scan_tail_above(&more, Offset(0), 4096, Some(floor));
        assert_eq!(
            (scan.data_bytes as usize, scan.next_offset),
            (after, Offset(5))
        );
        assert_eq!(scan.gaps, vec![Offset(2)..Offset(4)]);
        // A floor at or below what verifies changes nothing.
        let below = AcknowledgedEnd {
            data_bytes: good as u64,
            end: Offset(2),
        };
        let scan = scan_tail_above(&bytes, Offset(0), 4096, Some(below));
        assert_eq!(
            (scan.data_bytes as usize, scan.next_offset),
            (good, Offset(2))
        );
        assert!(scan.gaps.is_empty());
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for _ in 0..200 {
            let mut bytes = commit(0, 3);
            bytes.extend(commit(3, 2));
            for _ in 0..rng.random_range(0..6) {
                let at = rng.random_range(0..bytes.len());
                bytes[at] = rng.random();
            }
            let cut = rng.random_range(0..bytes.len());
            let scan = scan_tail(&bytes[..cut], Offset(0), 512);
            assert!(scan.data_bytes as usize <= cut);
            // Any floor, even one that is no commit boundary.
            let floor = AcknowledgedEnd {
                data_bytes: rng.random_range(0..bytes.len() as u64 + 10),
                end: Offset(rng.random_range(0..8)),
            };
            let above = scan_tail_above(&bytes[..cut], Offset(0), 512, Some(floor));
            assert!(above.data_bytes as usize <= cut);
            assert!(above.data_bytes >= scan.data_bytes);
            assert!(above.next_offset >= scan.next_offset);
            let _ = scan_sealed(&bytes[..cut], Offset(0), 512);
        }
    }
}
