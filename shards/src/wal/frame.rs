//! WAL frames and the ingress record they carry.
//!
//! A frame is `magic "NWAL" | body_len u32 | seq u64 | crc32c u32 | body`, all
//! big-endian, the checksum covering `body_len`, `seq` and the body. Frames are
//! packed back to back with no alignment; [`narad_io::AppendFile`] deals with blocks.
//! The sequence number is inside the checksum so that a frame left over from a
//! recycled segment (valid, but from an older life of the file) is never taken for
//! a new one: recovery only accepts the sequence number it expects next.
//!
//! The body starts with a format byte; a decoder meeting an unknown format refuses
//! it rather than guessing. Format 2, written today, is format 1 with the key and
//! payload bytes masked: XORed with a 64-bit word, repeated, that the WAL's secret
//! key ([`FrameKey`]) derives from the frame's sequence number. Client bytes then
//! never reach the disk as sent, so a payload cannot carry a frame that recovery
//! would take for one of its own once a recycled segment leaves it past the end
//! of the new data. The checksum covers the masked bytes, so recovery checks
//! frames without the key; only reading a record's key and payload needs it.
//! Format 1 frames (written before format 2) are still read. The byte-level
//! layout is in `docs/FORMAT.md`.

use bytes::Bytes;

use crate::ids::{IncarnationId, PartitionId, Seq};
use crate::mask::{apply_mask, extend_unmasked};

/// Frame magic, the first four bytes of every frame.
pub const FRAME_MAGIC: [u8; 4] = *b"NWAL";
/// Bytes before the body.
pub const FRAME_HEADER_BYTES: usize = 20;
/// The largest body a frame may carry: one record of at most 16 MiB plus its
/// fields. Bounds what recovery reads for a single frame.
pub const RECORD_BYTES_MAX: usize = 16 << 20;
/// Body bytes of a format 1 record with an empty topic, no key and no payload.
const BODY_FIXED_BYTES: usize = 1 + 4 + 8 + 16 + 2 + 4;
/// Format 2 adds, after the format byte, a check of the key that masked it, so a
/// frame read with another key (a key file lost and made anew) is refused rather
/// than read as garbage.
const KEY_CHECK_BYTES: usize = 4;
/// The record format before masking; still read.
pub const FORMAT_V1: u8 = 1;
/// The record format written today: format 1 with key and payload masked.
pub const FORMAT_V2: u8 = 2;
/// Marks "no key" in the key length field (an empty key is a real key).
const NO_KEY: u32 = u32::MAX;
/// The longest topic name a record can carry.
pub const TOPIC_BYTES_MAX: usize = u16::MAX as usize;

/// One produce as the WAL stores it, borrowed from the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IngressRecord<'a> {
    pub topic: &'a str,
    pub incarnation: IncarnationId,
    pub partition: PartitionId,
    pub accept_time_ms: u64,
    pub key: Option<&'a [u8]>,
    pub payload: &'a [u8],
}

/// Why bytes are not a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Fewer bytes than the header, or than the header says the body has.
    Short,
    /// The magic is missing: zeros, stale bytes, or not a frame at all.
    BadMagic,
    /// The length field is beyond [`RECORD_BYTES_MAX`].
    TooLong,
    /// The checksum does not match.
    BadChecksum,
}

/// Why a frame body is not a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordError {
    UnknownFormat(u8),
    /// Masked with another key than this WAL's (its key file was lost).
    OtherKey,
    Truncated,
    TopicNotUtf8,
}

impl IngressRecord<'_> {
    /// Bytes of the body this record encodes to.
    pub fn body_len(&self) -> usize {
        self.body_len_v1() + KEY_CHECK_BYTES
    }

    fn body_len_v1(&self) -> usize {
        BODY_FIXED_BYTES + self.topic.len() + self.key.map_or(0, <[u8]>::len) + self.payload.len()
    }

    /// Bytes of the whole frame, in the format the WAL writes (2).
    pub fn frame_len(&self) -> usize {
        FRAME_HEADER_BYTES + self.body_len()
    }

    /// Whether the record fits the format's limits.
    pub fn check(&self) -> Result<(), &'static str> {
        if self.topic.len() > TOPIC_BYTES_MAX {
            return Err("topic name too long for a WAL record");
        }
        if self.body_len() > RECORD_BYTES_MAX {
            return Err("record larger than the WAL's 16 MiB record limit");
        }
        Ok(())
    }

    /// Appends the record's frame with sequence number `seq` to `out`: format 2,
    /// masked with `key`'s word for `seq`, or format 1 without a key.
    pub fn encode_frame(&self, seq: Seq, key: Option<&FrameKey>, out: &mut Vec<u8>) {
        debug_assert!(self.check().is_ok());
        let start = out.len();
        let body_len = match key {
            Some(_) => self.body_len(),
            None => self.body_len_v1(),
        };
        out.reserve(FRAME_HEADER_BYTES + body_len);
        out.extend_from_slice(&FRAME_MAGIC);
        out.extend_from_slice(&(body_len as u32).to_be_bytes());
        out.extend_from_slice(&seq.0.to_be_bytes());
        out.extend_from_slice(&[0; 4]);
        match key {
            Some(key) => {
                out.push(FORMAT_V2);
                out.extend_from_slice(&key.check().to_be_bytes());
            }
            None => out.push(FORMAT_V1),
        }
        out.extend_from_slice(&self.partition.0.to_be_bytes());
        out.extend_from_slice(&self.accept_time_ms.to_be_bytes());
        out.extend_from_slice(&self.incarnation.0.to_be_bytes());
        out.extend_from_slice(&(self.topic.len() as u16).to_be_bytes());
        out.extend_from_slice(self.topic.as_bytes());
        let masked_from = match self.key {
            Some(key) => {
                out.extend_from_slice(&(key.len() as u32).to_be_bytes());
                let from = out.len();
                out.extend_from_slice(key);
                from
            }
            None => {
                out.extend_from_slice(&NO_KEY.to_be_bytes());
                out.len()
            }
        };
        out.extend_from_slice(self.payload);
        if let Some(key) = key {
            apply_mask(key.mask_word(seq), 0, &mut out[masked_from..]);
        }
        let crc = frame_crc(
            &out[start + 4..start + 16],
            &out[start + FRAME_HEADER_BYTES..],
        );
        out[start + 16..start + 20].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(out.len() - start, FRAME_HEADER_BYTES + body_len);
    }
}

/// A record as the WAL stored it: its key and payload still masked (format 2);
/// read them with [`StoredRecord::key_to`] and [`StoredRecord::payload_to`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredRecord<'a> {
    pub topic: &'a str,
    pub incarnation: IncarnationId,
    pub partition: PartitionId,
    pub accept_time_ms: u64,
    key: Option<&'a [u8]>,
    payload: &'a [u8],
    /// The mask word; 0 for a format 1 frame, whose bytes are plain.
    mask: u64,
    frame_len: usize,
    /// The WAL's kept batch the frame lies in, when it was read from memory.
    kept: Option<&'a Bytes>,
}

/// A record's key and payload as the WAL stored them, shared with the kept
/// batch they lie in rather than copied: still masked with `mask` (0 for a
/// format 1 frame), the payload continuing the key's phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedRecord {
    pub key: Option<Bytes>,
    pub payload: Bytes,
    pub mask: u64,
}

impl StoredRecord<'_> {
    /// Decodes the body of the frame with sequence number `seq`; `key` is the
    /// WAL's, needed for format 2.
    pub fn decode<'a>(
        body: &'a [u8],
        seq: Seq,
        key: &FrameKey,
    ) -> Result<StoredRecord<'a>, RecordError> {
        let mut r = Reader { bytes: body };
        let format = r.take(1)?[0];
        let mask = match format {
            FORMAT_V1 => 0,
            FORMAT_V2 => {
                if u32::from_be_bytes(r.array()?) != key.check() {
                    return Err(RecordError::OtherKey);
                }
                key.mask_word(seq)
            }
            other => return Err(RecordError::UnknownFormat(other)),
        };
        let partition = PartitionId(u32::from_be_bytes(r.array()?));
        let accept_time_ms = u64::from_be_bytes(r.array()?);
        let incarnation = IncarnationId(u128::from_be_bytes(r.array()?));
        let topic_len = u16::from_be_bytes(r.array()?) as usize;
        let topic =
            std::str::from_utf8(r.take(topic_len)?).map_err(|_| RecordError::TopicNotUtf8)?;
        let key = match u32::from_be_bytes(r.array()?) {
            NO_KEY => None,
            len => Some(r.take(len as usize)?),
        };
        Ok(StoredRecord {
            topic,
            incarnation,
            partition,
            accept_time_ms,
            key,
            payload: r.bytes,
            mask,
            frame_len: FRAME_HEADER_BYTES + body.len(),
            kept: None,
        })
    }

    /// The record as [`StoredRecord::decode`] gives it, noting that `body`
    /// lies in `kept`, a batch the WAL keeps in memory: see
    /// [`StoredRecord::shared`].
    pub(super) fn decode_kept<'a>(
        kept: &'a Bytes,
        body: &'a [u8],
        seq: Seq,
        key: &FrameKey,
    ) -> Result<StoredRecord<'a>, RecordError> {
        let mut record = Self::decode(body, seq, key)?;
        record.kept = Some(kept);
        Ok(record)
    }

    /// The key and payload without a copy, when the record was read from the
    /// WAL's memory: slices of the kept batch, which they keep alive. `None`
    /// for a record read from the device (copy it out with
    /// [`StoredRecord::key_to`] and [`StoredRecord::payload_to`]).
    pub fn shared(&self) -> Option<SharedRecord> {
        let kept = self.kept?;
        Some(SharedRecord {
            key: self.key.map(|key| kept.slice_ref(key)),
            payload: kept.slice_ref(self.payload),
            mask: self.mask,
        })
    }

    /// The kept batch the record lies in, when it was read from memory.
    pub fn kept(&self) -> Option<&Bytes> {
        self.kept
    }

    /// Whether the record has a key (an empty key is a key).
    pub fn has_key(&self) -> bool {
        self.key.is_some()
    }

    /// Bytes of the key and payload together: what [`StoredRecord::key_to`]
    /// and [`StoredRecord::payload_to`] append.
    pub fn plain_len(&self) -> usize {
        self.key.map_or(0, <[u8]>::len) + self.payload.len()
    }

    /// Appends the key's plain bytes to `out`, if there is a key.
    pub fn key_to(&self, out: &mut Vec<u8>) {
        if let Some(key) = self.key {
            extend_unmasked(out, key, self.mask, 0);
        }
    }

    /// Appends the payload's plain bytes to `out`.
    pub fn payload_to(&self, out: &mut Vec<u8>) {
        let phase = self.key.map_or(0, <[u8]>::len);
        extend_unmasked(out, self.payload, self.mask, phase);
    }

    /// The payload's plain bytes.
    pub fn payload_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.payload.len());
        self.payload_to(&mut out);
        out
    }

    /// The key's plain bytes.
    pub fn key_vec(&self) -> Option<Vec<u8>> {
        self.key.map(|k| {
            let mut out = Vec::with_capacity(k.len());
            self.key_to(&mut out);
            out
        })
    }

    /// Bytes of the whole frame.
    pub fn frame_len(&self) -> usize {
        self.frame_len
    }
}

/// The WAL's secret for masking frames, made once per WAL directory (see the
/// module docs and `key.rs`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FrameKey {
    words: [u64; 2],
    /// [`FrameKey::check`], computed once: every record checks it.
    check: u32,
}

impl std::fmt::Debug for FrameKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FrameKey(..)")
    }
}

impl FrameKey {
    pub fn new(words: [u64; 2]) -> Self {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&words[0].to_be_bytes());
        bytes[8..].copy_from_slice(&words[1].to_be_bytes());
        FrameKey {
            words,
            check: crc32c::crc32c(&bytes),
        }
    }

    /// The key's secret words.
    pub fn words(&self) -> [u64; 2] {
        self.words
    }

    /// What format 2 frames carry to say which key masked them: the CRC-32C
    /// of the words, big-endian.
    pub fn check(&self) -> u32 {
        self.check
    }

    /// The mask word of the frame with sequence number `seq`: never 0, so a
    /// format 2 frame is always masked.
    pub fn mask_word(&self, seq: Seq) -> u64 {
        splitmix64(self.words[0] ^ splitmix64(seq.0 ^ self.words[1])) | 1
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], RecordError> {
        if self.bytes.len() < n {
            return Err(RecordError::Truncated);
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], RecordError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
}

fn frame_crc(len_and_seq: &[u8], body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(len_and_seq), body)
}

/// A frame found in a byte string: its sequence number, its body, and the bytes it
/// occupies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    pub seq: Seq,
    pub body: &'a [u8],
    pub len: usize,
}

/// Reads the frame at the start of `bytes`.
pub fn decode_frame(bytes: &[u8]) -> Result<Frame<'_>, FrameError> {
    let frame = decode_encoded_frame(bytes)?;
    let crc = u32::from_be_bytes(bytes[16..20].try_into().expect("4 bytes"));
    if frame_crc(&bytes[4..16], frame.body) != crc {
        return Err(FrameError::BadChecksum);
    }
    Ok(frame)
}

/// [`decode_frame`] of a frame this process encoded and still holds in memory
/// (a kept batch: the staging buffer whose bytes went to the device, never
/// bytes read from it): the header's shape is checked, its checksum is not.
/// The checksum was computed over these very bytes when they were staged, so
/// verifying it again would only re-check the encoder, at the cost of a pass
/// over every payload; what the device returns is always verified.
pub fn decode_encoded_frame(bytes: &[u8]) -> Result<Frame<'_>, FrameError> {
    if bytes.len() < FRAME_HEADER_BYTES {
        return Err(FrameError::Short);
    }
    if bytes[..4] != FRAME_MAGIC {
        return Err(FrameError::BadMagic);
    }
    let len = encoded_frame_len(bytes);
    if len - FRAME_HEADER_BYTES > RECORD_BYTES_MAX {
        return Err(FrameError::TooLong);
    }
    if bytes.len() < len {
        return Err(FrameError::Short);
    }
    let seq = Seq(u64::from_be_bytes(
        bytes[8..16].try_into().expect("8 bytes"),
    ));
    Ok(Frame {
        seq,
        body: &bytes[FRAME_HEADER_BYTES..len],
        len,
    })
}

/// Reads only the length field of a frame header known to be good, to walk a
/// buffer of frames this process encoded itself.
pub fn encoded_frame_len(bytes: &[u8]) -> usize {
    FRAME_HEADER_BYTES + u32::from_be_bytes(bytes[4..8].try_into().expect("4 bytes")) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record_strategy() -> impl Strategy<Value = (String, u128, u32, u64, Option<Vec<u8>>, Vec<u8>)>
    {
        (
            "[a-z0-9._-]{0,40}",
            any::<u128>(),
            any::<u32>(),
            any::<u64>(),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64)),
            proptest::collection::vec(any::<u8>(), 0..2048),
        )
    }

    /// A record borrowing the values a strategy generated.
    fn borrowed<'a>(
        topic: &'a str,
        incarnation: u128,
        partition: u32,
        accept_time_ms: u64,
        key: Option<&'a [u8]>,
        payload: &'a [u8],
    ) -> IngressRecord<'a> {
        IngressRecord {
            topic,
            incarnation: IncarnationId(incarnation),
            partition: PartitionId(partition),
            accept_time_ms,
            key,
            payload,
        }
    }

    static KEY: std::sync::LazyLock<FrameKey> =
        std::sync::LazyLock::new(|| FrameKey::new([0x1234_5678_9abc_def0, 0x0fed_cba9_8765_4321]));

    /// The record a stored one reads back as, owned.
    fn read_back(stored: &StoredRecord<'_>) -> (String, u128, u32, u64, Option<Vec<u8>>, Vec<u8>) {
        (
            stored.topic.to_string(),
            stored.incarnation.0,
            stored.partition.0,
            stored.accept_time_ms,
            stored.key_vec(),
            stored.payload_vec(),
        )
    }

    proptest! {
        #[test]
        fn frames_round_trip(
            (topic, inc, part, ts, key, payload) in record_strategy(),
            seq in any::<u64>(),
            masked in any::<bool>(),
        ) {
            let record = borrowed(&topic, inc, part, ts, key.as_deref(), &payload);
            let mut out = vec![7u8; 3];
            record.encode_frame(Seq(seq), masked.then_some(&*KEY), &mut out);
            let frame = decode_frame(&out[3..]).unwrap();
            prop_assert_eq!(frame.seq, Seq(seq));
            let written = if masked { record.frame_len() } else { record.frame_len() - KEY_CHECK_BYTES };
            prop_assert_eq!(frame.len, written);
            prop_assert_eq!(encoded_frame_len(&out[3..]), written);
            prop_assert_eq!(decode_encoded_frame(&out[3..]), Ok(frame));
            let stored = StoredRecord::decode(frame.body, Seq(seq), &KEY).unwrap();
            prop_assert_eq!(stored.frame_len(), written);
            prop_assert_eq!(read_back(&stored), (topic.clone(), inc, part, ts, key.clone(), payload.clone()));
        }

        #[test]
        fn masked_frames_never_hold_a_payload_as_sent(
            payload in proptest::collection::vec(any::<u8>(), 16..512),
            seq in any::<u64>(),
        ) {
            let record = borrowed("t", 1, 0, 0, None, &payload);
            let mut out = Vec::new();
            record.encode_frame(Seq(seq), Some(&*KEY), &mut out);
            // Not one 8-byte run of the payload reaches the frame as sent.
            let body = &out[out.len() - payload.len()..];
            prop_assert!(body.chunks(8).zip(payload.chunks(8)).all(|(a, b)| a != b));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(frame) = decode_frame(&bytes) {
                let _ = StoredRecord::decode(frame.body, Seq(1), &KEY);
            }
            if let Ok(frame) = decode_encoded_frame(&bytes) {
                let _ = StoredRecord::decode(frame.body, Seq(1), &KEY);
            }
            let _ = StoredRecord::decode(&bytes, Seq(1), &KEY);
        }

        #[test]
        fn any_single_bit_flip_is_caught((topic, inc, part, ts, key, payload) in record_strategy(), bit in any::<usize>()) {
            let record = borrowed(&topic, inc, part, ts, key.as_deref(), &payload);
            let mut out = Vec::new();
            record.encode_frame(Seq(9), Some(&*KEY), &mut out);
            let bit = bit % (out.len() * 8);
            out[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(decode_frame(&out).is_err());
        }
    }

    #[test]
    fn a_frame_masked_with_another_key_is_refused() {
        let record = borrowed("t", 1, 0, 0, Some(b"k"), b"payload");
        let mut out = Vec::new();
        record.encode_frame(Seq(5), Some(&*KEY), &mut out);
        let frame = decode_frame(&out).unwrap();
        let other = FrameKey::new([7, 8]);
        assert_eq!(
            StoredRecord::decode(frame.body, Seq(5), &other),
            Err(RecordError::OtherKey)
        );
    }

    #[test]
    fn fixture_v1_frame_decodes() {
        // A frame written by format 1, kept byte for byte so that a change to the
        // encoder that would break WALs already on disk fails here.
        let record = IngressRecord {
            topic: "orders",
            incarnation: IncarnationId(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10),
            partition: PartitionId(3),
            accept_time_ms: 1_700_000_000_000,
            key: Some(b"k1"),
            payload: b"hello",
        };
        let mut out = Vec::new();
        record.encode_frame(Seq(42), None, &mut out);
        let hex: String = out.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, FIXTURE_V1);
        let frame = decode_frame(&out).unwrap();
        let stored = StoredRecord::decode(frame.body, Seq(42), &KEY).unwrap();
        assert_eq!(stored.key_vec().as_deref(), Some(&b"k1"[..]));
        assert_eq!(stored.payload_vec(), b"hello");
        assert_eq!(stored.topic, "orders");
    }

    const FIXTURE_V1: &str = "4e57414c00000030000000000000002aeb46443e01000000030000018bcfe568000102030405060708090a0b0c0d0e0f1000066f7264657273000000026b3168656c6c6f";
}
