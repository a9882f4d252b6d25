//! WAL frames and the ingress record they carry.
//!
//! A frame is `magic "NWAL" | body_len u32 | seq u64 | crc32c u32 | body`, all
//! big-endian, the checksum covering `body_len`, `seq` and the body. Frames are
//! packed back to back with no alignment; [`narad_io::AppendFile`] deals with blocks.
//! The sequence number is inside the checksum so that a frame left over from a
//! recycled segment (valid, but from an older life of the file) is never taken for
//! a new one: recovery only accepts the sequence number it expects next.
//!
//! The body starts with a format byte. Format 1 is the only one so far; a decoder
//! meeting an unknown format refuses it rather than guessing. The byte-level layout
//! is in `docs/FORMAT.md`.

use crate::ids::{IncarnationId, PartitionId, Seq};

/// Frame magic, the first four bytes of every frame.
pub const FRAME_MAGIC: [u8; 4] = *b"NWAL";
/// Bytes before the body.
pub const FRAME_HEADER_BYTES: usize = 20;
/// The largest body a frame may carry: one record of at most 16 MiB plus its
/// fields. Bounds what recovery reads for a single frame.
pub const RECORD_BYTES_MAX: usize = 16 << 20;
/// Body bytes of a record with an empty topic, no key and no payload.
const BODY_FIXED_BYTES: usize = 1 + 4 + 8 + 16 + 2 + 4;
/// The one record format written today.
pub const FORMAT_V1: u8 = 1;
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
    Truncated,
    TopicNotUtf8,
}

impl IngressRecord<'_> {
    /// Bytes of the body this record encodes to.
    pub fn body_len(&self) -> usize {
        BODY_FIXED_BYTES + self.topic.len() + self.key.map_or(0, <[u8]>::len) + self.payload.len()
    }

    /// Bytes of the whole frame.
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

    /// Appends the record's frame with sequence number `seq` to `out`.
    pub fn encode_frame(&self, seq: Seq, out: &mut Vec<u8>) {
        debug_assert!(self.check().is_ok());
        let start = out.len();
        let body_len = self.body_len();
        out.reserve(FRAME_HEADER_BYTES + body_len);
        out.extend_from_slice(&FRAME_MAGIC);
        out.extend_from_slice(&(body_len as u32).to_be_bytes());
        out.extend_from_slice(&seq.0.to_be_bytes());
        out.extend_from_slice(&[0; 4]);
        out.push(FORMAT_V1);
        out.extend_from_slice(&self.partition.0.to_be_bytes());
        out.extend_from_slice(&self.accept_time_ms.to_be_bytes());
        out.extend_from_slice(&self.incarnation.0.to_be_bytes());
        out.extend_from_slice(&(self.topic.len() as u16).to_be_bytes());
        out.extend_from_slice(self.topic.as_bytes());
        match self.key {
            Some(key) => {
                out.extend_from_slice(&(key.len() as u32).to_be_bytes());
                out.extend_from_slice(key);
            }
            None => out.extend_from_slice(&NO_KEY.to_be_bytes()),
        }
        out.extend_from_slice(self.payload);
        let crc = frame_crc(
            &out[start + 4..start + 16],
            &out[start + FRAME_HEADER_BYTES..],
        );
        out[start + 16..start + 20].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(out.len() - start, FRAME_HEADER_BYTES + body_len);
    }

    /// Decodes a frame body.
    pub fn decode_body(body: &[u8]) -> Result<IngressRecord<'_>, RecordError> {
        let mut r = Reader { bytes: body };
        let format = r.take(1)?[0];
        if format != FORMAT_V1 {
            return Err(RecordError::UnknownFormat(format));
        }
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
        Ok(IngressRecord {
            topic,
            incarnation,
            partition,
            accept_time_ms,
            key,
            payload: r.bytes,
        })
    }
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
    if bytes.len() < FRAME_HEADER_BYTES {
        return Err(FrameError::Short);
    }
    if bytes[..4] != FRAME_MAGIC {
        return Err(FrameError::BadMagic);
    }
    let body_len = u32::from_be_bytes(bytes[4..8].try_into().expect("4 bytes")) as usize;
    if body_len > RECORD_BYTES_MAX {
        return Err(FrameError::TooLong);
    }
    let len = FRAME_HEADER_BYTES + body_len;
    if bytes.len() < len {
        return Err(FrameError::Short);
    }
    let seq = Seq(u64::from_be_bytes(
        bytes[8..16].try_into().expect("8 bytes"),
    ));
    let crc = u32::from_be_bytes(bytes[16..20].try_into().expect("4 bytes"));
    let body = &bytes[FRAME_HEADER_BYTES..len];
    if frame_crc(&bytes[4..16], body) != crc {
        return Err(FrameError::BadChecksum);
    }
    Ok(Frame { seq, body, len })
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

    proptest! {
        #[test]
        fn frames_round_trip((topic, inc, part, ts, key, payload) in record_strategy(), seq in any::<u64>()) {
            let record = borrowed(&topic, inc, part, ts, key.as_deref(), &payload);
            let mut out = vec![7u8; 3];
            record.encode_frame(Seq(seq), &mut out);
            let frame = decode_frame(&out[3..]).unwrap();
            prop_assert_eq!(frame.seq, Seq(seq));
            prop_assert_eq!(frame.len, record.frame_len());
            prop_assert_eq!(encoded_frame_len(&out[3..]), record.frame_len());
            prop_assert_eq!(IngressRecord::decode_body(frame.body).unwrap(), record);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(frame) = decode_frame(&bytes) {
                let _ = IngressRecord::decode_body(frame.body);
            }
            let _ = IngressRecord::decode_body(&bytes);
        }

        #[test]
        fn any_single_bit_flip_is_caught((topic, inc, part, ts, key, payload) in record_strategy(), bit in any::<usize>()) {
            let record = borrowed(&topic, inc, part, ts, key.as_deref(), &payload);
            let mut out = Vec::new();
            record.encode_frame(Seq(9), &mut out);
            let bit = bit % (out.len() * 8);
            out[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(decode_frame(&out).is_err());
        }
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
        record.encode_frame(Seq(42), &mut out);
        let hex: String = out.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, FIXTURE_V1);
        let frame = decode_frame(&out).unwrap();
        assert_eq!(IngressRecord::decode_body(frame.body).unwrap(), record);
    }

    const FIXTURE_V1: &str = "4e57414c00000030000000000000002aeb46443e01000000030000018bcfe568000102030405060708090a0b0c0d0e0f1000066f7264657273000000026b3168656c6c6f";
}
