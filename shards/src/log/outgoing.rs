//! A frame on its way to the disk, masked as it is copied out.
//!
//! Runs on the shard that owns the partition, inside a commit. [`encode_frame`]
//! lays a frame out in a buffer of its own, which the commit then copies into the
//! device's buffer: an allocation of the frame's size (zeroed, often on fresh
//! pages) and one more pass over every payload byte. An [`OutgoingFrame`] keeps
//! only the header, the mask word and the unmasked payload (the records area the
//! cache keeps anyway, or its compression) and produces the frame's bytes on
//! demand, straight into the device's buffer ([`AppendSource`]) and into the
//! checksum; the read-back checksums the bytes read and compares them against
//! the unmasked payload under the mask, in place and in one pass
//! ([`OutgoingFrame::check_read_back`]). Its bytes are exactly those of
//! [`encode_frame`] (or [`encode_unmasked_frame`]) for the same mask word, which
//! the tests check.
//!
//! [`encode_frame`]: super::frame::encode_frame
//! [`encode_unmasked_frame`]: super::frame::encode_unmasked_frame

use bytes::Bytes;
use narad_io::AppendSource;

use super::frame::{
    compress, copy_masked, equals_masked, frame_header_over, FrameSpec, FRAME_HEADER_BYTES,
    FRAME_VERSION, MASK_WORD_BYTES,
};

/// Bytes of the stack buffer the checksum streams through.
const CHUNK_BYTES: usize = 4096;

/// How bytes read back fail [`OutgoingFrame::check_read_back`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadBackFault {
    /// Their checksum is not the one their header carries.
    BadCrc,
    /// Their checksum holds, but they are not the frame written.
    Differs,
}

/// One frame, ready to be written; see the module documentation.
#[derive(Clone, Debug)]
pub struct OutgoingFrame {
    header: [u8; FRAME_HEADER_BYTES],
    /// The mask word (version 2); 0 for an unmasked frame of version 1, which
    /// stores no mask word.
    word: u64,
    /// The stored payload before masking: the records area, or its zstd
    /// compression.
    payload: Bytes,
}

impl OutgoingFrame {
    /// A frame of version 2 around `area`, its payload masked with `mask_word`
    /// (never 0); zstd is kept only when it shrinks the area.
    #[cfg_attr(feature = "broken-log-unmasked", allow(dead_code))]
    pub fn new(spec: FrameSpec, area: &Bytes, zstd_level: i32, mask_word: u64) -> Self {
        assert_ne!(mask_word, 0, "a zero mask leaves the payload as it came");
        Self::build(spec, area, zstd_level, mask_word)
    }

    /// A frame of version 1 (unmasked), as written before masking.
    #[cfg_attr(not(any(test, feature = "broken-log-unmasked")), allow(dead_code))]
    pub fn unmasked(spec: FrameSpec, area: &Bytes, zstd_level: i32) -> Self {
        Self::build(spec, area, zstd_level, 0)
    }

    fn build(spec: FrameSpec, area: &Bytes, zstd_level: i32, word: u64) -> Self {
        let (codec, compressed) = compress(spec, area, zstd_level);
        let mut frame = OutgoingFrame {
            header: [0; FRAME_HEADER_BYTES],
            word,
            payload: compressed.map_or_else(|| area.clone(), Bytes::from),
        };
        let version = if word == 0 {
            super::frame::FRAME_VERSION_UNMASKED
        } else {
            FRAME_VERSION
        };
        let stored_len = frame.len() - FRAME_HEADER_BYTES;
        // The stored bytes start after the header, which the checksum's pass
        // never reads: it is filled in once the checksum is known.
        frame.header = frame_header_over(spec, codec, version, area.len(), stored_len, |crc| {
            let mut crc = crc;
            frame.for_each_chunk(FRAME_HEADER_BYTES, |chunk| {
                crc = crc32c::crc32c_append(crc, chunk);
            });
            crc
        });
        frame
    }

    /// Bytes of the mask word stored after the header.
    fn prefix_bytes(&self) -> usize {
        if self.word == 0 {
            0
        } else {
            MASK_WORD_BYTES
        }
    }

    /// Header and stored payload.
    pub fn len(&self) -> usize {
        FRAME_HEADER_BYTES + self.prefix_bytes() + self.payload.len()
    }

    /// The read-back's check of `bytes`, read from where this frame was
    /// written: their checksum is the one their header carries (what
    /// [`check_frame`] verifies) and they are exactly this frame, the stored
    /// payload compared against the unmasked one under the mask, with no masked
    /// copy made. One pass, each piece checksummed and compared while it is in
    /// the cache: the device wrote the bytes read back into
    /// memory no core has touched, and a frame of a large commit (up to a
    /// megabyte) does not stay in the cache from one pass to a second.
    ///
    /// [`check_frame`]: super::frame::check_frame
    pub fn check_read_back(&self, bytes: &[u8]) -> Result<(), ReadBackFault> {
        if bytes.len() != self.len() {
            return Err(ReadBackFault::Differs);
        }
        let fixed_bytes = FRAME_HEADER_BYTES + self.prefix_bytes();
        let (header, rest) = bytes.split_at(FRAME_HEADER_BYTES);
        let (word, stored) = rest.split_at(fixed_bytes - FRAME_HEADER_BYTES);
        let mut crc = crc32c::crc32c_append(crc32c::crc32c(&header[2..24]), word);
        let mut same = header == self.header && (self.word == 0 || word == self.word.to_le_bytes());
        // Pieces of a multiple of 8 bytes keep the mask word in phase.
        for (read, plain) in stored
            .chunks(CHUNK_BYTES)
            .zip(self.payload.chunks(CHUNK_BYTES))
        {
            crc = crc32c::crc32c_append(crc, read);
            same &= equals_masked(read, plain, self.word);
        }
        let carried = u32::from_be_bytes(header[24..28].try_into().expect("4 bytes"));
        if crc != carried {
            return Err(ReadBackFault::BadCrc);
        }
        if !same {
            return Err(ReadBackFault::Differs);
        }
        Ok(())
    }

    /// Hands the frame's bytes from `from` on to `visit` in chunks of a stack
    /// buffer.
    fn for_each_chunk(&self, from: usize, mut visit: impl FnMut(&[u8])) {
        let mut buf = [0u8; CHUNK_BYTES];
        let mut at = from;
        while at < self.len() {
            let n = (self.len() - at).min(CHUNK_BYTES);
            self.copy_to(at, &mut buf[..n]);
            visit(&buf[..n]);
            at += n;
        }
    }
}

impl AppendSource for OutgoingFrame {
    fn len(&self) -> usize {
        OutgoingFrame::len(self)
    }

    fn copy_to(&self, from: usize, out: &mut [u8]) {
        assert!(from + out.len() <= self.len(), "copied past the frame");
        let fixed_bytes = FRAME_HEADER_BYTES + self.prefix_bytes();
        let mut filled = 0;
        if from < fixed_bytes {
            let mut fixed = [0u8; FRAME_HEADER_BYTES + MASK_WORD_BYTES];
            fixed[..FRAME_HEADER_BYTES].copy_from_slice(&self.header);
            fixed[FRAME_HEADER_BYTES..].copy_from_slice(&self.word.to_le_bytes());
            filled = (fixed_bytes - from).min(out.len());
            out[..filled].copy_from_slice(&fixed[from..from + filled]);
        }
        if filled == out.len() {
            return;
        }
        let at = from + filled - fixed_bytes;
        let payload = &self.payload[at..at + (out.len() - filled)];
        // Payload byte `j` is masked with byte `j % 8` of the word: starting
        // at `at`, the word turns by `at % 8` bytes.
        let word = self.word.rotate_right(8 * (at % 8) as u32);
        copy_masked(&mut out[filled..], payload, word);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Offset;
    use crate::log::frame::{encode_frame, encode_unmasked_frame, Codec};
    use proptest::prelude::*;

    fn spec(count: u32, codec: Codec) -> FrameSpec {
        FrameSpec {
            base_offset: Offset(1_000),
            record_count: count,
            codec,
            first_of_commit: true,
            last_of_commit: false,
        }
    }

    /// The bytes of `source` from `from` to the end, asked for in pieces of
    /// `piece` bytes.
    fn copied(source: &(impl AppendSource + ?Sized), from: usize, piece: usize) -> Vec<u8> {
        let mut out = vec![0xAA; source.len() - from];
        for (i, chunk) in out.chunks_mut(piece.max(1)).enumerate() {
            source.copy_to(from + i * piece.max(1), chunk);
        }
        out
    }

    proptest! {
        #[test]
        fn its_bytes_are_those_of_the_laid_out_frame(
            area in proptest::collection::vec(any::<u8>(), 1..20_000),
            word in 1u64..,
            zstd in any::<bool>(),
            masked in any::<bool>(),
            from in 0usize..20_000,
            piece in 1usize..5_000,
        ) {
            let codec = if zstd { Codec::Zstd } else { Codec::None };
            let laid_out = if masked {
                encode_frame(spec(3, codec), &area, 1, word)
            } else {
                encode_unmasked_frame(spec(3, codec), &area, 1)
            };
            let area = Bytes::from(area);
            let frame = if masked {
                OutgoingFrame::new(spec(3, codec), &area, 1, word)
            } else {
                OutgoingFrame::unmasked(spec(3, codec), &area, 1)
            };
            prop_assert_eq!(frame.len(), laid_out.len());
            let from = from % laid_out.len();
            prop_assert_eq!(copied(&frame, from, piece), &laid_out[from..]);
            prop_assert_eq!(frame.check_read_back(&laid_out), Ok(()));
        }

        #[test]
        fn it_tells_any_other_bytes_apart(
            area in proptest::collection::vec(any::<u8>(), 1..10_000),
            word in 1u64..,
            flip in any::<usize>(),
            bit in 0u8..8,
        ) {
            let laid_out = encode_frame(spec(1, Codec::None), &area, 1, word);
            let frame = OutgoingFrame::new(spec(1, Codec::None), &Bytes::from(area), 1, word);
            let mut other = laid_out.clone();
            other[flip % laid_out.len()] ^= 1 << bit;
            // The magic is outside the checksum; every other byte is in it.
            let expected = if flip % laid_out.len() < 2 {
                ReadBackFault::Differs
            } else {
                ReadBackFault::BadCrc
            };
            prop_assert_eq!(frame.check_read_back(&other), Err(expected));
            prop_assert_eq!(
                frame.check_read_back(&laid_out[..laid_out.len() - 1]),
                Err(ReadBackFault::Differs)
            );
        }

        #[test]
        fn a_commit_is_its_frames_one_after_another(
            areas in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..6_000), 1..5),
            from in 0usize..30_000,
            piece in 1usize..9_000,
        ) {
            let mut laid_out = Vec::new();
            let mut frames = Vec::new();
            for (i, area) in areas.into_iter().enumerate() {
                let word = 0x0102_0304_0506_0708 + i as u64;
                laid_out.extend(encode_frame(spec(1, Codec::None), &area, 1, word));
                frames.push(OutgoingFrame::new(spec(1, Codec::None), &Bytes::from(area), 1, word));
            }
            prop_assert_eq!(AppendSource::len(&frames[..]), laid_out.len());
            let from = from % laid_out.len();
            prop_assert_eq!(copied(&frames[..], from, piece), &laid_out[from..]);
        }
    }
}
