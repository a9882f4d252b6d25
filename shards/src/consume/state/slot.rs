//! The record a `consumer.ahead` slot holds, and its encoding.
//!
//! Pure functions, run on whichever shard reads or writes a partition's state.
//!
//! Layout of one 4 KiB slot, little-endian:
//! `magic "NCAH" | version u8 | 3 zero bytes | seq u64 | frontier u64 |
//! count u32 | payload_bytes u32 | payload | crc32c u32 | zeros`.
//! The payload is `count` LEB128 varints: the first is `ahead[0] - frontier - 1`,
//! each next one `ahead[i] - ahead[i - 1] - 1`. Subtracting one means a run of
//! consecutive acks costs one byte per offset, and it makes "ascending and above the
//! frontier" a property of the encoding itself: no decoded record can break it. The
//! checksum covers the header and the payload.
//!
//! Invariants: a slot that decodes was written whole by [`encode`] (or is a 2^-32
//! accident of a torn write); a decoded record's offsets are strictly ascending and
//! all above its frontier; the decoder never panics on any bytes.

use narad_io::BLOCK_BYTES;

use super::AckedState;
use crate::ids::Offset;

/// Bytes of one slot: one device block, so a slot is written in one aligned write.
pub const SLOT_BYTES: usize = BLOCK_BYTES;
/// The acked-ahead file holds two slots.
pub const SLOTS: usize = 2;
const MAGIC: [u8; 4] = *b"NCAH";
const VERSION: u8 = 1;
const HEADER_BYTES: usize = 32;
const CRC_BYTES: usize = 4;
/// Room for varints in one slot.
pub const PAYLOAD_BYTES_MAX: usize = SLOT_BYTES - HEADER_BYTES - CRC_BYTES;
/// A u64 takes at most ten LEB128 bytes.
const VARINT_BYTES_MAX: usize = 10;

const _: () = assert!(SLOTS * SLOT_BYTES == 8192);
const _: () = assert!(
    PAYLOAD_BYTES_MAX >= 1000,
    "about a thousand dense acks must fit"
);

/// One decoded slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotRecord {
    /// Newer records carry larger numbers.
    pub seq: u64,
    /// What the record says is settled.
    pub state: AckedState,
}

/// Encodes `state` into one slot. An acked-ahead set too large for the slot keeps
/// its lowest offsets and drops the rest, which are then simply delivered again;
/// returns the block and how many offsets it kept.
///
/// Panics (in release too) if `state.ahead` is not strictly ascending above the
/// frontier: a caller that breaks it would persist acks it never received.
pub fn encode(seq: u64, state: &AckedState) -> (Vec<u8>, usize) {
    let mut block = vec![0u8; SLOT_BYTES];
    block[..4].copy_from_slice(&MAGIC);
    block[4] = VERSION;
    block[8..16].copy_from_slice(&seq.to_le_bytes());
    block[16..24].copy_from_slice(&state.frontier.0.to_le_bytes());
    let mut payload_bytes = 0usize;
    let mut kept = 0usize;
    let mut previous = state.frontier.0;
    let mut scratch = [0u8; VARINT_BYTES_MAX];
    for offset in &state.ahead {
        assert!(
            offset.0 > previous,
            "acked-ahead offsets must ascend above the frontier ({} after {previous})",
            offset.0
        );
        let len = put_varint(&mut scratch, offset.0 - previous - 1);
        if payload_bytes + len > PAYLOAD_BYTES_MAX {
            break;
        }
        let at = HEADER_BYTES + payload_bytes;
        block[at..at + len].copy_from_slice(&scratch[..len]);
        payload_bytes += len;
        kept += 1;
        previous = offset.0;
    }
    block[24..28].copy_from_slice(&(kept as u32).to_le_bytes());
    block[28..32].copy_from_slice(&(payload_bytes as u32).to_le_bytes());
    let crc_at = HEADER_BYTES + payload_bytes;
    let crc = crc32c::crc32c(&block[..crc_at]);
    block[crc_at..crc_at + CRC_BYTES].copy_from_slice(&crc.to_le_bytes());
    debug_assert!(kept <= state.ahead.len());
    (block, kept)
}

/// The part of `state` that [`encode`] keeps.
pub fn fitted(state: &AckedState) -> AckedState {
    let (_, kept) = encode(0, state);
    AckedState {
        frontier: state.frontier,
        ahead: state.ahead[..kept].to_vec(),
    }
}

/// Decodes a slot; `None` when it is empty, torn, corrupt or of another version.
pub fn decode(block: &[u8]) -> Option<SlotRecord> {
    // The reserved bytes are zero in this version: a later one that gives
    // them a meaning is not read as this one.
    if block.len() < HEADER_BYTES + CRC_BYTES
        || block[..4] != MAGIC
        || block[4] != VERSION
        || block[5..8] != [0; 3]
    {
        return None;
    }
    let u64_at = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(block.get(at..at + 8)?.try_into().ok()?))
    };
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(block.get(at..at + 4)?.try_into().ok()?))
    };
    let count = u32_at(24)? as usize;
    let payload_bytes = u32_at(28)? as usize;
    if payload_bytes > PAYLOAD_BYTES_MAX || count > payload_bytes {
        return None;
    }
    let crc_at = HEADER_BYTES + payload_bytes;
    if block.len() < crc_at + CRC_BYTES || crc32c::crc32c(&block[..crc_at]) != u32_at(crc_at)? {
        return None;
    }
    let frontier = u64_at(16)?;
    let mut payload = &block[HEADER_BYTES..crc_at];
    let mut ahead = Vec::with_capacity(count);
    let mut previous = frontier;
    for _ in 0..count {
        let gap = take_varint(&mut payload)?;
        previous = previous.checked_add(gap)?.checked_add(1)?;
        ahead.push(Offset(previous));
    }
    if !payload.is_empty() {
        return None;
    }
    Some(SlotRecord {
        seq: u64_at(8)?,
        state: AckedState {
            frontier: Offset(frontier),
            ahead,
        },
    })
}

/// Decodes both slots of a `consumer.ahead` image (shorter images read as zeros)
/// and returns the index and record of the newest valid one.
pub fn newest(image: &[u8]) -> Option<(usize, SlotRecord)> {
    let mut best: Option<(usize, SlotRecord)> = None;
    for slot in 0..SLOTS {
        let start = (slot * SLOT_BYTES).min(image.len());
        let end = ((slot + 1) * SLOT_BYTES).min(image.len());
        let Some(record) = decode(&image[start..end]) else {
            continue;
        };
        if best.as_ref().is_none_or(|(_, b)| record.seq > b.seq) {
            best = Some((slot, record));
        }
    }
    best
}

fn put_varint(out: &mut [u8; VARINT_BYTES_MAX], mut value: u64) -> usize {
    let mut len = 0;
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out[len] = byte;
            return len + 1;
        }
        out[len] = byte | 0x80;
        len += 1;
    }
}

fn take_varint(input: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for i in 0..VARINT_BYTES_MAX {
        let (&byte, rest) = input.split_first()?;
        *input = rest;
        let bits = u64::from(byte & 0x7f);
        let shift = 7 * i as u32;
        // The tenth byte may carry only the top bit of a u64.
        if shift == 63 && bits > 1 {
            return None;
        }
        value |= bits << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn state_from(frontier: u64, gaps: &[u64]) -> AckedState {
        let mut ahead = Vec::new();
        let mut previous = frontier;
        for gap in gaps {
            previous = previous.saturating_add(gap + 1);
            if previous == u64::MAX {
                break;
            }
            ahead.push(Offset(previous));
        }
        AckedState {
            frontier: Offset(frontier),
            ahead,
        }
    }

    proptest! {
        #[test]
        fn round_trip(seq in any::<u64>(), frontier in 0u64..u64::MAX / 2,
                      gaps in proptest::collection::vec(0u64..100_000, 0..600)) {
            let state = state_from(frontier, &gaps);
            let (block, kept) = encode(seq, &state);
            prop_assert_eq!(kept, state.ahead.len());
            prop_assert_eq!(block.len(), SLOT_BYTES);
            prop_assert_eq!(decode(&block), Some(SlotRecord { seq, state }));
        }

        #[test]
        fn a_flipped_bit_is_rejected(seq in any::<u64>(),
                                     gaps in proptest::collection::vec(0u64..1000, 0..300),
                                     bit in any::<usize>()) {
            let state = state_from(7, &gaps);
            let (mut block, _) = encode(seq, &state);
            let covered_bits = (HEADER_BYTES + payload_len(&block) + CRC_BYTES) * 8;
            let bit = bit % covered_bits;
            block[bit / 8] ^= 1 << (bit % 8);
            prop_assert_eq!(decode(&block), None);
        }

        #[test]
        fn a_reserved_byte_set_is_rejected_even_when_checksummed(
            gaps in proptest::collection::vec(0u64..1000, 0..300),
            at in 5usize..8, value in 1u8..=255) {
            let (mut block, _) = encode(3, &state_from(7, &gaps));
            block[at] = value;
            let crc_at = HEADER_BYTES + payload_len(&block);
            let crc = crc32c::crc32c(&block[..crc_at]);
            block[crc_at..crc_at + CRC_BYTES].copy_from_slice(&crc.to_le_bytes());
            prop_assert_eq!(decode(&block), None);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..SLOT_BYTES + 8)) {
            let _ = decode(&bytes);
            let _ = newest(&bytes);
        }

        #[test]
        fn a_valid_header_over_arbitrary_payload_never_panics(
            count in 0u32..5000, payload in proptest::collection::vec(any::<u8>(), 0..PAYLOAD_BYTES_MAX)) {
            // Arbitrary bytes almost never pass the checksum, so build ones that do
            // and let the varint decoder meet garbage.
            let mut block = vec![0u8; SLOT_BYTES];
            block[..4].copy_from_slice(&MAGIC);
            block[4] = VERSION;
            block[16..24].copy_from_slice(&u64::MAX.wrapping_sub(3).to_le_bytes());
            block[24..28].copy_from_slice(&count.to_le_bytes());
            block[28..32].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            block[HEADER_BYTES..HEADER_BYTES + payload.len()].copy_from_slice(&payload);
            let crc_at = HEADER_BYTES + payload.len();
            let crc = crc32c::crc32c(&block[..crc_at]);
            block[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
            if let Some(record) = decode(&block) {
                let mut previous = record.state.frontier;
                for offset in record.state.ahead {
                    prop_assert!(offset > previous);
                    previous = offset;
                }
            }
        }
    }

    fn payload_len(block: &[u8]) -> usize {
        u32::from_le_bytes(block[28..32].try_into().unwrap()) as usize
    }

    #[test]
    fn a_set_too_large_keeps_its_lowest_offsets() {
        // Gaps of 2^20 take three varint bytes each: far more than a slot holds.
        let state = state_from(100, &vec![1 << 20; 3000]);
        let (block, kept) = encode(9, &state);
        assert!(kept > 1000 && kept < 3000, "kept {kept}");
        let record = decode(&block).expect("a truncated record still decodes");
        assert_eq!(record.state.ahead, state.ahead[..kept]);
        assert_eq!(record.state, fitted(&state));
    }

    #[test]
    fn dense_acks_fit_by_the_thousand() {
        let state = state_from(0, &[0; 3500]);
        assert_eq!(encode(1, &state).1, 3500);
    }

    #[test]
    fn zeros_and_short_images_are_empty() {
        assert_eq!(decode(&[0u8; SLOT_BYTES]), None);
        assert_eq!(newest(&[]), None);
        assert_eq!(newest(&[0u8; 100]), None);
    }

    #[test]
    fn newest_takes_the_larger_sequence_number() {
        let (old, _) = encode(4, &state_from(1, &[]));
        let (new, _) = encode(5, &state_from(2, &[3]));
        let image = [new.clone(), old.clone()].concat();
        assert_eq!(newest(&image).map(|(slot, r)| (slot, r.seq)), Some((0, 5)));
        let image = [old, new].concat();
        assert_eq!(newest(&image).map(|(slot, r)| (slot, r.seq)), Some((1, 5)));
    }

    #[test]
    #[should_panic(expected = "ascend")]
    fn an_unsorted_set_is_refused() {
        let state = AckedState {
            frontier: Offset(5),
            ahead: vec![Offset(9), Offset(7)],
        };
        let _ = encode(1, &state);
    }
}
