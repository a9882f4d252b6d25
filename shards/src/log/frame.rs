//! The frame: the unit the partition log writes, checksums and reads back.
//!
//! Runs on the shard that owns the partition. A frame is a fixed 28-byte header and
//! a stored payload (the records area, zstd-compressed or not). The byte layout is
//! documented in `docs/FORMAT.md` ("Partition log"); all integers are big-endian.
//!
//! Invariants:
//! - Every decoder here returns `Result` and never panics on arbitrary bytes: the
//!   log reads frames from a disk that may have rotted, been torn by a crash, or hold
//!   stale bytes of a failed commit.
//! - No frame is longer than [`FRAME_BYTES_MAX`], and no decoder allocates more than
//!   that, whatever a length field claims.
//! - The CRC covers every header byte after the magic and before the CRC field, and
//!   the stored payload, so a frame that passes [`check_frame`] has trustworthy
//!   lengths, flags, count and base offset.

use std::borrow::Cow;
use std::fmt;

use crate::ids::Offset;

/// Marks the start of a frame. A zeroed (prepared, never written) region reads as a
/// bad magic, which the scanners take as "end of data".
pub const FRAME_MAGIC: u16 = 0xCAFE;

/// The version byte every frame written today carries.
pub const FRAME_VERSION: u8 = 1;

/// Header length: magic 2, version 1, flags 1, count 4, base 8, uncompressed 4,
/// stored 4, crc 4.
pub const FRAME_HEADER_BYTES: usize = 28;

/// Largest frame (header plus stored payload) a writer may produce and a reader
/// accepts. Also bounds the decompressed size, so a forged length cannot make a
/// reader allocate more.
pub const FRAME_BYTES_MAX: usize = 256 * 1024 * 1024;

/// Bytes of a record's length prefix inside the records area.
pub const RECORD_LEN_BYTES: usize = 4;

/// Flag bits: the low two bits are the codec.
const FLAG_CODEC_MASK: u8 = 0b0000_0011;
/// Set on the first frame of one commit.
const FLAG_FIRST_OF_COMMIT: u8 = 0b0100_0000;
/// Set on the last frame of one commit: recovery tells a torn tail from mid-file
/// corruption by whether a complete commit follows a bad region.
const FLAG_LAST_OF_COMMIT: u8 = 0b1000_0000;
const FLAGS_KNOWN: u8 = FLAG_CODEC_MASK | FLAG_FIRST_OF_COMMIT | FLAG_LAST_OF_COMMIT;

const _: () = assert!(FRAME_BYTES_MAX <= u32::MAX as usize);
const _: () = assert!(FRAME_HEADER_BYTES == 2 + 1 + 1 + 4 + 8 + 4 + 4 + 4);

/// How a frame's payload is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    /// The records area as is.
    None,
    /// The records area compressed with zstd.
    Zstd,
}

impl Codec {
    fn bits(self) -> u8 {
        match self {
            Codec::None => 0,
            Codec::Zstd => 1,
        }
    }
}

/// Why bytes are not a valid frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Fewer bytes than the header or the lengths it declares.
    Short,
    /// Not the frame magic (zeros after the tail land here).
    BadMagic,
    /// A version this build does not read.
    BadVersion(u8),
    /// Unknown flag bits or codec.
    BadFlags(u8),
    /// A length or count out of its bounds.
    BadLength,
    /// The checksum does not match.
    BadCrc,
    /// The payload does not decompress to the declared length.
    BadPayload,
    /// The records area does not split into the declared records.
    BadRecords,
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Short => write!(f, "frame truncated"),
            FrameError::BadMagic => write!(f, "bad frame magic"),
            FrameError::BadVersion(v) => write!(f, "unknown frame version {v}"),
            FrameError::BadFlags(b) => write!(f, "unknown frame flags {b:#04x}"),
            FrameError::BadLength => write!(f, "frame length or count out of bounds"),
            FrameError::BadCrc => write!(f, "frame checksum mismatch"),
            FrameError::BadPayload => write!(f, "frame payload does not decompress"),
            FrameError::BadRecords => write!(f, "frame records area malformed"),
        }
    }
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// How the payload is stored.
    pub codec: Codec,
    /// First frame of a commit.
    pub first_of_commit: bool,
    /// Last frame of a commit.
    pub last_of_commit: bool,
    /// Records in the frame; at least one.
    pub record_count: u32,
    /// Offset of the first record.
    pub base_offset: Offset,
    /// Length of the records area.
    pub uncompressed_bytes: u32,
    /// Length of the payload as stored after the header.
    pub stored_bytes: u32,
    /// The checksum field.
    pub crc: u32,
}

impl FrameHeader {
    /// Header plus stored payload.
    pub fn frame_bytes(&self) -> usize {
        FRAME_HEADER_BYTES + self.stored_bytes as usize
    }

    /// The offset after the frame's last record.
    pub fn end_offset(&self) -> Offset {
        Offset(self.base_offset.0 + u64::from(self.record_count))
    }
}

/// What the writer says about one frame.
#[derive(Clone, Copy, Debug)]
pub struct FrameSpec {
    /// Offset of the first record.
    pub base_offset: Offset,
    /// Records in the area.
    pub record_count: u32,
    /// Compress the payload (kept only when it is smaller).
    pub codec: Codec,
    /// First frame of a commit.
    pub first_of_commit: bool,
    /// Last frame of a commit.
    pub last_of_commit: bool,
}

/// Encodes one frame around a records area (`[len u32][envelope]` repeated).
/// Returns the frame and the codec really used: zstd is dropped for a frame it
/// does not shrink, so incompressible payloads cost no decompression on reads.
pub fn encode_frame(spec: FrameSpec, records_area: &[u8], zstd_level: i32) -> Vec<u8> {
    assert!(spec.record_count > 0, "a frame holds at least one record");
    assert!(records_area.len() + FRAME_HEADER_BYTES <= FRAME_BYTES_MAX);
    let compressed = match spec.codec {
        Codec::Zstd => zstd::bulk::compress(records_area, zstd_level)
            .ok()
            .filter(|c| c.len() < records_area.len()),
        Codec::None => None,
    };
    let (codec, stored) = match &compressed {
        Some(c) => (Codec::Zstd, c.as_slice()),
        None => (Codec::None, records_area),
    };
    let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + stored.len());
    out.extend_from_slice(&frame_header(spec, codec, records_area.len(), stored));
    out.extend_from_slice(stored);
    out
}

/// Seals a frame stored uncompressed that was built in place: `frame` holds
/// [`FRAME_HEADER_BYTES`] of room followed by the records area, and the header
/// is written into that room. The same bytes as [`encode_frame`] with
/// [`Codec::None`], without copying the area.
pub fn seal_uncompressed_frame(spec: FrameSpec, frame: &mut [u8]) {
    let (header, area) = frame.split_at_mut(FRAME_HEADER_BYTES);
    assert!(spec.record_count > 0, "a frame holds at least one record");
    assert!(area.len() + FRAME_HEADER_BYTES <= FRAME_BYTES_MAX);
    header.copy_from_slice(&frame_header(spec, Codec::None, area.len(), area));
}

/// The header of a frame whose records area of `area_len` bytes is stored as
/// `stored` (the area itself, or its compression by `codec`).
fn frame_header(
    spec: FrameSpec,
    codec: Codec,
    area_len: usize,
    stored: &[u8],
) -> [u8; FRAME_HEADER_BYTES] {
    let mut flags = codec.bits();
    if spec.first_of_commit {
        flags |= FLAG_FIRST_OF_COMMIT;
    }
    if spec.last_of_commit {
        flags |= FLAG_LAST_OF_COMMIT;
    }
    let mut header = [0u8; FRAME_HEADER_BYTES];
    header[..2].copy_from_slice(&FRAME_MAGIC.to_be_bytes());
    header[2] = FRAME_VERSION;
    header[3] = flags;
    header[4..8].copy_from_slice(&spec.record_count.to_be_bytes());
    header[8..16].copy_from_slice(&spec.base_offset.0.to_be_bytes());
    header[16..20].copy_from_slice(&(area_len as u32).to_be_bytes());
    header[20..24].copy_from_slice(&(stored.len() as u32).to_be_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&header[2..24]), stored);
    header[24..28].copy_from_slice(&crc.to_be_bytes());
    header
}

fn be_u32(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_be_bytes(word)
}

fn be_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(word)
}

/// Decodes and bounds-checks a header from the start of `bytes`, without the CRC
/// (which needs the payload). Use it to learn how many bytes the frame spans.
pub fn decode_header(bytes: &[u8]) -> Result<FrameHeader, FrameError> {
    if bytes.len() < FRAME_HEADER_BYTES {
        return Err(FrameError::Short);
    }
    if u16::from_be_bytes([bytes[0], bytes[1]]) != FRAME_MAGIC {
        return Err(FrameError::BadMagic);
    }
    if bytes[2] != FRAME_VERSION {
        return Err(FrameError::BadVersion(bytes[2]));
    }
    let flags = bytes[3];
    let codec = match flags & FLAG_CODEC_MASK {
        0 => Codec::None,
        1 => Codec::Zstd,
        _ => return Err(FrameError::BadFlags(flags)),
    };
    if flags & !FLAGS_KNOWN != 0 {
        return Err(FrameError::BadFlags(flags));
    }
    let header = FrameHeader {
        codec,
        first_of_commit: flags & FLAG_FIRST_OF_COMMIT != 0,
        last_of_commit: flags & FLAG_LAST_OF_COMMIT != 0,
        record_count: be_u32(bytes, 4),
        base_offset: Offset(be_u64(bytes, 8)),
        uncompressed_bytes: be_u32(bytes, 16),
        stored_bytes: be_u32(bytes, 20),
        crc: be_u32(bytes, 24),
    };
    let uncompressed = header.uncompressed_bytes as usize;
    let bounded = header.record_count > 0
        && header.frame_bytes() <= FRAME_BYTES_MAX
        && uncompressed <= FRAME_BYTES_MAX
        // Every record takes at least its length prefix.
        && (header.record_count as usize) <= uncompressed / RECORD_LEN_BYTES
        && header.base_offset.0.checked_add(u64::from(header.record_count)).is_some()
        && (codec == Codec::Zstd || header.stored_bytes == header.uncompressed_bytes);
    if !bounded {
        return Err(FrameError::BadLength);
    }
    Ok(header)
}

/// Checks a whole frame at the start of `bytes`: header bounds and CRC. Returns the
/// header and the stored payload.
pub fn check_frame(bytes: &[u8]) -> Result<(FrameHeader, &[u8]), FrameError> {
    let header = decode_header(bytes)?;
    let end = header.frame_bytes();
    if bytes.len() < end {
        return Err(FrameError::Short);
    }
    let stored = &bytes[FRAME_HEADER_BYTES..end];
    let crc = crc32c::crc32c_append(crc32c::crc32c(&bytes[2..24]), stored);
    if crc != header.crc {
        return Err(FrameError::BadCrc);
    }
    Ok((header, stored))
}

/// The records area of a checked frame: the stored bytes themselves when they are
/// not compressed (no copy), else decompressed.
pub fn records_area<'a>(
    header: &FrameHeader,
    stored: &'a [u8],
) -> Result<Cow<'a, [u8]>, FrameError> {
    let area = match header.codec {
        Codec::None => Cow::Borrowed(stored),
        Codec::Zstd => Cow::Owned(
            zstd::bulk::decompress(stored, header.uncompressed_bytes as usize)
                .map_err(|_| FrameError::BadPayload)?,
        ),
    };
    if area.len() != header.uncompressed_bytes as usize {
        return Err(FrameError::BadPayload);
    }
    Ok(area)
}

/// The envelopes of a records area, as byte ranges into it, without allocating:
/// checks first that the area holds exactly `count` records and nothing after
/// them (so a bad area yields nothing), then walks it again lazily.
pub fn records_in(
    area: &[u8],
    count: u32,
) -> Result<impl Iterator<Item = std::ops::Range<usize>> + '_, FrameError> {
    if count as usize > area.len() / RECORD_LEN_BYTES {
        return Err(FrameError::BadRecords);
    }
    let mut at = 0usize;
    for _ in 0..count {
        if area.len() - at < RECORD_LEN_BYTES {
            return Err(FrameError::BadRecords);
        }
        let len = be_u32(area, at) as usize;
        at += RECORD_LEN_BYTES;
        if area.len() - at < len {
            return Err(FrameError::BadRecords);
        }
        at += len;
    }
    if at != area.len() {
        return Err(FrameError::BadRecords);
    }
    let mut at = 0usize;
    Ok((0..count).map(move |_| {
        let len = be_u32(area, at) as usize;
        let start = at + RECORD_LEN_BYTES;
        at = start + len;
        start..at
    }))
}

/// Splits a records area into `count` envelopes, as byte ranges into `area`. The
/// area must hold exactly `count` records and nothing after them.
pub fn split_records(area: &[u8], count: u32) -> Result<Vec<std::ops::Range<usize>>, FrameError> {
    // The count is bounded by the area length (decode_header), so this cannot
    // allocate more than the frame itself.
    Ok(records_in(area, count)?.collect())
}

/// Appends one record (its envelope) with its length prefix to a records area.
pub fn push_record(
    area: &mut Vec<u8>,
    envelope_len: usize,
    write_envelope: impl FnOnce(&mut Vec<u8>),
) {
    assert!(envelope_len <= u32::MAX as usize);
    area.extend_from_slice(&(envelope_len as u32).to_be_bytes());
    let before = area.len();
    write_envelope(area);
    assert_eq!(
        area.len() - before,
        envelope_len,
        "envelope length was precomputed"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn area_of(records: &[Vec<u8>]) -> Vec<u8> {
        let mut area = Vec::new();
        for r in records {
            push_record(&mut area, r.len(), |out| out.extend_from_slice(r));
        }
        area
    }

    /// A fixture of the version-1 layout: a change to the encoder that alters the
    /// bytes on disk must fail here, not in production.
    #[test]
    fn frame_fixture_v1() {
        let area = area_of(&[b"ab".to_vec()]);
        let spec = FrameSpec {
            base_offset: Offset(7),
            record_count: 1,
            codec: Codec::None,
            first_of_commit: true,
            last_of_commit: true,
        };
        let frame = encode_frame(spec, &area, 3);
        let hex: String = frame.iter().map(|b| format!("{b:02x}")).collect();
        let header = concat!(
            "cafe",
            "01",
            "c0",
            "00000001",
            "0000000000000007",
            "00000006",
            "00000006"
        );
        assert!(hex.starts_with(header), "{hex}");
        assert!(hex.ends_with("000000026162"), "{hex}");
        let crc = crc32c::crc32c_append(crc32c::crc32c(&frame[2..24]), &frame[28..]);
        assert_eq!(be_u32(&frame, 24), crc);
    }

    proptest! {
        #[test]
        fn frame_round_trip(
            records in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..20),
            base in 0u64..u64::MAX / 2,
            zstd in any::<bool>(),
            first in any::<bool>(),
            last in any::<bool>(),
        ) {
            let area = area_of(&records);
            let spec = FrameSpec {
                base_offset: Offset(base),
                record_count: records.len() as u32,
                codec: if zstd { Codec::Zstd } else { Codec::None },
                first_of_commit: first,
                last_of_commit: last,
            };
            let frame = encode_frame(spec, &area, 1);
            if !zstd {
                // Built in place, the frame is byte for byte the encoded one.
                let mut in_place = vec![0xA5u8; FRAME_HEADER_BYTES];
                in_place.extend_from_slice(&area);
                seal_uncompressed_frame(spec, &mut in_place);
                prop_assert_eq!(&in_place, &frame);
            }
            let (header, stored) = check_frame(&frame).unwrap();
            prop_assert_eq!(header.base_offset, Offset(base));
            prop_assert_eq!(header.record_count, records.len() as u32);
            prop_assert_eq!(header.first_of_commit, first);
            prop_assert_eq!(header.last_of_commit, last);
            prop_assert_eq!(header.frame_bytes(), frame.len());
            let decoded = records_area(&header, stored).unwrap();
            prop_assert_eq!(&decoded, &area);
            let ranges = split_records(&decoded, header.record_count).unwrap();
            for (range, record) in ranges.into_iter().zip(&records) {
                prop_assert_eq!(&decoded[range], record.as_slice());
            }
        }

        #[test]
        fn any_single_bit_flip_is_caught(
            records in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..5),
            bit in any::<prop::sample::Index>(),
        ) {
            let area = area_of(&records);
            let spec = FrameSpec {
                base_offset: Offset(1),
                record_count: records.len() as u32,
                codec: Codec::None,
                first_of_commit: true,
                last_of_commit: true,
            };
            let mut frame = encode_frame(spec, &area, 1);
            let bit = bit.index(frame.len() * 8);
            frame[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(check_frame(&frame).is_err());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200), count in any::<u32>()) {
            if let Ok((header, stored)) = check_frame(&bytes) {
                if let Ok(area) = records_area(&header, stored) {
                    let _ = split_records(&area, header.record_count);
                }
            }
            let _ = split_records(&bytes, count);
            let _ = decode_header(&bytes);
        }

        #[test]
        fn forged_header_with_valid_crc_never_panics(
            flags in any::<u8>(),
            count in any::<u32>(),
            base in any::<u64>(),
            uncompressed in any::<u32>(),
            payload in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut frame = Vec::new();
            frame.extend_from_slice(&FRAME_MAGIC.to_be_bytes());
            frame.push(FRAME_VERSION);
            frame.push(flags);
            frame.extend_from_slice(&count.to_be_bytes());
            frame.extend_from_slice(&base.to_be_bytes());
            frame.extend_from_slice(&(uncompressed % 4096).to_be_bytes());
            frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
            let crc = crc32c::crc32c_append(crc32c::crc32c(&frame[2..24]), &payload);
            frame.extend_from_slice(&crc.to_be_bytes());
            frame.extend_from_slice(&payload);
            if let Ok((header, stored)) = check_frame(&frame) {
                if let Ok(area) = records_area(&header, stored) {
                    let _ = split_records(&area, header.record_count);
                }
            }
        }
    }
}
