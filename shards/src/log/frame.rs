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
//! - Frames of version 2 (written today) store their payload XORed with a random
//!   mask word that leads the stored bytes. Recovery and the read resync search
//!   damaged bytes for the next valid frame; a producer that could lay out a
//!   valid frame inside its own payload would have that search take its bytes
//!   for the log's (any offsets, any commit time). Masked, a payload reaches the
//!   disk as bytes nobody chose. The CRC covers the masked bytes, so frames are
//!   checked without unmasking. Version 1 (unmasked) is still read.

use std::borrow::Cow;
use std::fmt;

use crate::ids::Offset;

/// Marks the start of a frame. A zeroed (prepared, never written) region reads as a
/// bad magic, which the scanners take as "end of data".
pub const FRAME_MAGIC: u16 = 0xCAFE;

/// The version byte every frame written today carries: the payload is masked.
pub const FRAME_VERSION: u8 = 2;

/// The version of frames written before masking; still read.
pub const FRAME_VERSION_UNMASKED: u8 = 1;

/// Bytes of the mask word that leads a version 2 frame's stored payload.
pub const MASK_WORD_BYTES: usize = 8;

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
    /// Length of the payload as stored after the header (the mask word
    /// included, when masked).
    pub stored_bytes: u32,
    /// Version 2: the stored payload is a mask word, then the payload masked.
    pub masked: bool,
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

/// Encodes one frame (version 2) around a records area (`[len u32][envelope]`
/// repeated), its payload masked with `mask_word` (which must not be 0: draw it
/// at random for each frame, [`mask_word`]). zstd is dropped for a frame it
/// does not shrink, so incompressible payloads cost no decompression on reads.
pub fn encode_frame(
    spec: FrameSpec,
    records_area: &[u8],
    zstd_level: i32,
    mask_word: u64,
) -> Vec<u8> {
    assert_ne!(mask_word, 0, "a zero mask leaves the payload as it came");
    let (codec, compressed) = compress(spec, records_area, zstd_level);
    let payload = compressed.as_deref().unwrap_or(records_area);
    let stored_len = MASK_WORD_BYTES + payload.len();
    let mut out = vec![0u8; FRAME_HEADER_BYTES + stored_len];
    let stored = &mut out[FRAME_HEADER_BYTES..];
    stored[..MASK_WORD_BYTES].copy_from_slice(&mask_word.to_le_bytes());
    copy_masked(&mut stored[MASK_WORD_BYTES..], payload, mask_word);
    let header = frame_header(spec, codec, FRAME_VERSION, records_area.len(), stored);
    out[..FRAME_HEADER_BYTES].copy_from_slice(&header);
    out
}

/// Encodes one frame of version 1 (unmasked), as written before masking: for
/// tests that check old logs still read.
pub fn encode_unmasked_frame(spec: FrameSpec, records_area: &[u8], zstd_level: i32) -> Vec<u8> {
    let (codec, compressed) = compress(spec, records_area, zstd_level);
    let stored = compressed.as_deref().unwrap_or(records_area);
    let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + stored.len());
    out.extend_from_slice(&frame_header(
        spec,
        codec,
        FRAME_VERSION_UNMASKED,
        records_area.len(),
        stored,
    ));
    out.extend_from_slice(stored);
    out
}

/// A fresh random mask word (never 0).
pub fn mask_word() -> u64 {
    loop {
        let word = rand::random::<u64>();
        if word != 0 {
            return word;
        }
    }
}

/// The codec a frame is stored with, and the compressed bytes when it is zstd.
pub(super) fn compress(
    spec: FrameSpec,
    records_area: &[u8],
    zstd_level: i32,
) -> (Codec, Option<Vec<u8>>) {
    assert!(spec.record_count > 0, "a frame holds at least one record");
    assert!(records_area.len() + FRAME_HEADER_BYTES + MASK_WORD_BYTES <= FRAME_BYTES_MAX);
    let compressed = match spec.codec {
        Codec::Zstd => zstd::bulk::compress(records_area, zstd_level)
            .ok()
            .filter(|c| c.len() < records_area.len()),
        Codec::None => None,
    };
    match compressed {
        Some(c) => (Codec::Zstd, Some(c)),
        None => (Codec::None, None),
    }
}

/// `out = from ^ mask`, the mask being `word`'s little-endian bytes repeated.
pub(super) fn copy_masked(out: &mut [u8], from: &[u8], word: u64) {
    assert_eq!(out.len(), from.len());
    let mut outs = out.chunks_exact_mut(8);
    let mut ins = from.chunks_exact(8);
    for (o, i) in (&mut outs).zip(&mut ins) {
        let v = u64::from_le_bytes(i.try_into().expect("8 bytes")) ^ word;
        o.copy_from_slice(&v.to_le_bytes());
    }
    let pattern = word.to_le_bytes();
    for (j, (o, i)) in outs
        .into_remainder()
        .iter_mut()
        .zip(ins.remainder())
        .enumerate()
    {
        *o = i ^ pattern[j];
    }
}

/// Whether `stored == plain ^ mask`, the mask being `word`'s little-endian
/// bytes repeated: [`copy_masked`]'s output, checked without being made. The
/// differences are gathered, not tested word by word, so the loop has no
/// branch; a mismatch is the rare case.
pub(super) fn equals_masked(stored: &[u8], plain: &[u8], word: u64) -> bool {
    if stored.len() != plain.len() {
        return false;
    }
    let mut stored_words = stored.chunks_exact(8);
    let mut plain_words = plain.chunks_exact(8);
    let mut differ = 0u64;
    for (s, p) in (&mut stored_words).zip(&mut plain_words) {
        let s = u64::from_le_bytes(s.try_into().expect("8 bytes"));
        let p = u64::from_le_bytes(p.try_into().expect("8 bytes"));
        differ |= s ^ p ^ word;
    }
    let pattern = word.to_le_bytes();
    for (j, (s, p)) in stored_words
        .remainder()
        .iter()
        .zip(plain_words.remainder())
        .enumerate()
    {
        differ |= u64::from(s ^ p ^ pattern[j]);
    }
    differ == 0
}

/// The header of a frame whose records area of `area_len` bytes is stored as
/// `stored` (the area itself, or its compression by `codec`; after the mask word
/// and masked, for version 2).
fn frame_header(
    spec: FrameSpec,
    codec: Codec,
    version: u8,
    area_len: usize,
    stored: &[u8],
) -> [u8; FRAME_HEADER_BYTES] {
    frame_header_over(spec, codec, version, area_len, stored.len(), |crc| {
        crc32c::crc32c_append(crc, stored)
    })
}

/// [`frame_header`] of stored bytes that `append_stored` feeds to the checksum
/// (`crc32c_append` of them to the CRC it is given), wherever they are.
pub(super) fn frame_header_over(
    spec: FrameSpec,
    codec: Codec,
    version: u8,
    area_len: usize,
    stored_len: usize,
    append_stored: impl FnOnce(u32) -> u32,
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
    header[2] = version;
    header[3] = flags;
    header[4..8].copy_from_slice(&spec.record_count.to_be_bytes());
    header[8..16].copy_from_slice(&spec.base_offset.0.to_be_bytes());
    header[16..20].copy_from_slice(&(area_len as u32).to_be_bytes());
    header[20..24].copy_from_slice(&(stored_len as u32).to_be_bytes());
    let crc = append_stored(crc32c::crc32c(&header[2..24]));
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
    let masked = match bytes[2] {
        FRAME_VERSION => true,
        FRAME_VERSION_UNMASKED => false,
        other => return Err(FrameError::BadVersion(other)),
    };
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
        masked,
    };
    // What the stored bytes hold besides the payload: the mask word.
    let word_bytes = if masked { MASK_WORD_BYTES as u64 } else { 0 };
    let uncompressed = header.uncompressed_bytes as usize;
    let bounded = header.record_count > 0
        && header.frame_bytes() <= FRAME_BYTES_MAX
        && uncompressed <= FRAME_BYTES_MAX
        // Every record takes at least its length prefix.
        && (header.record_count as usize) <= uncompressed / RECORD_LEN_BYTES
        && header.base_offset.0.checked_add(u64::from(header.record_count)).is_some()
        && u64::from(header.stored_bytes) >= word_bytes
        && (codec == Codec::Zstd
            || u64::from(header.stored_bytes) == u64::from(header.uncompressed_bytes) + word_bytes);
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

/// The records area of a checked frame: unmasked (version 2), decompressed
/// when stored so; the stored bytes themselves (no copy) only for an
/// uncompressed version 1 frame.
pub fn records_area<'a>(
    header: &FrameHeader,
    stored: &'a [u8],
) -> Result<Cow<'a, [u8]>, FrameError> {
    let payload: Cow<'a, [u8]> = if header.masked {
        let (word, masked) = stored.split_at(MASK_WORD_BYTES);
        let word = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        let mut plain = vec![0u8; masked.len()];
        copy_masked(&mut plain, masked, word);
        Cow::Owned(plain)
    } else {
        Cow::Borrowed(stored)
    };
    let area = match header.codec {
        Codec::None => payload,
        Codec::Zstd => Cow::Owned(
            zstd::bulk::decompress(&payload, header.uncompressed_bytes as usize)
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

    /// A fixture of the version-2 layout: a change to the encoder that alters the
    /// bytes on disk must fail here, not in production.
    #[test]
    fn frame_fixture_v2() {
        let (spec, area) = fixture();
        let frame = encode_frame(spec, &area, 3, 0x0807_0605_0403_0201);
        // The word (little-endian), then 00 00 00 02 61 62 masked by 01..06.
        check_fixture(&frame, "02", "0000000e", "0102030405060708010203066464");
    }

    /// The fixtures' frame: one record `ab` at offset 7, first and last of its
    /// commit, stored as is.
    fn fixture() -> (FrameSpec, Vec<u8>) {
        let spec = FrameSpec {
            base_offset: Offset(7),
            record_count: 1,
            codec: Codec::None,
            first_of_commit: true,
            last_of_commit: true,
        };
        (spec, area_of(&[b"ab".to_vec()]))
    }

    /// Checks a one-record frame of base 7, first and last of its commit,
    /// against its expected version, stored length and stored bytes (hex).
    fn check_fixture(frame: &[u8], version: &str, stored_len: &str, stored: &str) {
        let hex: String = frame.iter().map(|b| format!("{b:02x}")).collect();
        let header = format!("cafe{version}c000000001000000000000000700000006{stored_len}");
        assert!(hex.starts_with(&header), "{hex}");
        assert!(hex.ends_with(stored), "{hex}");
        let crc = crc32c::crc32c_append(crc32c::crc32c(&frame[2..24]), &frame[28..]);
        assert_eq!(be_u32(frame, 24), crc);
    }

    /// A record whose payload is itself a valid frame: on the disk it is not one.
    /// Unmasked (version 1) it is, and a search of damaged bytes would take it.
    #[test]
    fn a_frame_laid_out_in_a_payload_is_no_frame_on_disk() {
        let inner_spec = FrameSpec {
            base_offset: Offset(1 << 62),
            record_count: 1,
            codec: Codec::None,
            first_of_commit: true,
            last_of_commit: true,
        };
        let forged = encode_unmasked_frame(inner_spec, &area_of(&[b"forged".to_vec()]), 1);
        let spec = FrameSpec {
            base_offset: Offset(0),
            ..inner_spec
        };
        let area = area_of(std::slice::from_ref(&forged));
        let found = |frame: &[u8]| {
            (1..frame.len())
                .filter(|&at| check_frame(&frame[at..]).is_ok())
                .count()
        };
        assert_eq!(
            found(&encode_unmasked_frame(spec, &area, 1)),
            1,
            "the test can see it"
        );
        for _ in 0..100 {
            assert_eq!(found(&encode_frame(spec, &area, 1, mask_word())), 0);
        }
    }

    /// Frames of version 1 (unmasked) still read.
    #[test]
    fn frame_fixture_v1() {
        let (spec, area) = fixture();
        let frame = encode_unmasked_frame(spec, &area, 3);
        check_fixture(&frame, "01", "00000006", "000000026162");
        let (header, stored) = check_frame(&frame).unwrap();
        assert!(!header.masked);
        assert_eq!(&records_area(&header, stored).unwrap()[..], &area[..]);
    }

    proptest! {
        #[test]
        fn frame_round_trip(
            records in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..20),
            base in 0u64..u64::MAX / 2,
            zstd in any::<bool>(),
            first in any::<bool>(),
            last in any::<bool>(),
            unmasked in any::<bool>(),
            word in any::<u64>(),
        ) {
            let area = area_of(&records);
            let spec = FrameSpec {
                base_offset: Offset(base),
                record_count: records.len() as u32,
                codec: if zstd { Codec::Zstd } else { Codec::None },
                first_of_commit: first,
                last_of_commit: last,
            };
            let frame = if unmasked {
                encode_unmasked_frame(spec, &area, 1)
            } else {
                encode_frame(spec, &area, 1, word.max(1))
            };
            let (header, stored) = check_frame(&frame).unwrap();
            prop_assert_eq!(header.masked, !unmasked);
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
            let mut frame = encode_frame(spec, &area, 1, mask_word());
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
