//! The record envelope: what one record looks like inside a frame's records area.
//!
//! Runs on the shard that owns the partition. Layout (documented in
//! `docs/FORMAT.md`): `[version u8][has_key u8][key_len uvarint][key]
//! [commit_time_ms u64 BE][payload]`. The payload runs to the end of the envelope,
//! whose length the records area's `[len u32]` prefix gives.
//!
//! Invariants: the decoder never panics on arbitrary bytes and never allocates (it
//! returns ranges into the input); a key is at most [`KEY_BYTES_MAX`]; `has_key`
//! keeps "no key" apart from "empty key", since keyless produce must stay keyless.

use std::fmt;
use std::ops::Range;

use crate::mask::extend_unmasked;

/// The version byte every envelope written today carries.
pub const ENVELOPE_VERSION: u8 = 1;

/// Longest key a record may carry. Keys travel in query strings and pick a
/// partition; 64 KiB is far above any real one and keeps a forged `key_len` cheap.
pub const KEY_BYTES_MAX: usize = 64 * 1024;

/// Longest LEB128 encoding of a key length that fits [`KEY_BYTES_MAX`].
const UVARINT_BYTES_MAX: usize = 3;

const _: () = assert!(KEY_BYTES_MAX < 1 << (7 * UVARINT_BYTES_MAX));

/// Why bytes are not a valid envelope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnvelopeError {
    /// The envelope ends before its fixed fields do.
    Short,
    /// A version this build does not read.
    BadVersion(u8),
    /// `has_key` is neither 0 nor 1, or a keyless record has a key length.
    BadKeyFlag(u8),
    /// The key length is malformed or above [`KEY_BYTES_MAX`].
    BadKeyLength,
}

impl fmt::Display for EnvelopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvelopeError::Short => write!(f, "envelope truncated"),
            EnvelopeError::BadVersion(v) => write!(f, "unknown envelope version {v}"),
            EnvelopeError::BadKeyFlag(b) => write!(f, "bad has_key byte {b}"),
            EnvelopeError::BadKeyLength => write!(f, "bad key length"),
        }
    }
}

/// A decoded envelope, as ranges into the bytes it was decoded from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvelopeView {
    /// The key, if the record has one.
    pub key: Option<Range<usize>>,
    /// When the record became visible, Unix milliseconds.
    pub commit_time_ms: u64,
    /// The payload.
    pub payload: Range<usize>,
}

fn uvarint_len(mut value: usize) -> usize {
    let mut len = 1;
    while value >= 0x80 {
        value >>= 7;
        len += 1;
    }
    len
}

/// Encoded length of an envelope, so the caller can write the length prefix first.
pub fn envelope_len(key: Option<&[u8]>, payload_len: usize) -> usize {
    let key_len = key.map_or(0, <[u8]>::len);
    2 + uvarint_len(key_len) + key_len + 8 + payload_len
}

/// Appends one envelope to `out`. The key must be at most [`KEY_BYTES_MAX`]; the
/// commit path checks that before encoding anything.
pub fn encode_envelope(out: &mut Vec<u8>, key: Option<&[u8]>, commit_time_ms: u64, payload: &[u8]) {
    encode_masked_envelope(out, key, commit_time_ms, payload, 0);
}

/// [`encode_envelope`] for a key and payload still masked with `mask` as one
/// region (the payload continuing the key's phase; see [`crate::mask`]): the
/// envelope holds them plain, unmasked as they are copied in.
pub fn encode_masked_envelope(
    out: &mut Vec<u8>,
    key: Option<&[u8]>,
    commit_time_ms: u64,
    payload: &[u8],
    mask: u64,
) {
    let key_bytes = key.unwrap_or(&[]);
    assert!(
        key_bytes.len() <= KEY_BYTES_MAX,
        "key length checked by the caller"
    );
    out.push(ENVELOPE_VERSION);
    out.push(u8::from(key.is_some()));
    let mut value = key_bytes.len();
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
    extend_unmasked(out, key_bytes, mask, 0);
    out.extend_from_slice(&commit_time_ms.to_be_bytes());
    extend_unmasked(out, payload, mask, key_bytes.len());
}

/// Decodes one envelope that spans all of `bytes`.
pub fn decode_envelope(bytes: &[u8]) -> Result<EnvelopeView, EnvelopeError> {
    if bytes.len() < 2 {
        return Err(EnvelopeError::Short);
    }
    if bytes[0] != ENVELOPE_VERSION {
        return Err(EnvelopeError::BadVersion(bytes[0]));
    }
    let has_key = match bytes[1] {
        0 => false,
        1 => true,
        other => return Err(EnvelopeError::BadKeyFlag(other)),
    };
    let mut at = 2;
    let mut key_len = 0usize;
    let mut shift = 0;
    loop {
        if shift / 7 >= UVARINT_BYTES_MAX {
            return Err(EnvelopeError::BadKeyLength);
        }
        let byte = *bytes.get(at).ok_or(EnvelopeError::Short)?;
        at += 1;
        key_len |= usize::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            break;
        }
    }
    if key_len > KEY_BYTES_MAX {
        return Err(EnvelopeError::BadKeyLength);
    }
    if !has_key && key_len != 0 {
        return Err(EnvelopeError::BadKeyFlag(bytes[1]));
    }
    if bytes.len() - at < key_len + 8 {
        return Err(EnvelopeError::Short);
    }
    let key = has_key.then_some(at..at + key_len);
    at += key_len;
    let mut time = [0u8; 8];
    time.copy_from_slice(&bytes[at..at + 8]);
    at += 8;
    Ok(EnvelopeView {
        key,
        commit_time_ms: u64::from_be_bytes(time),
        payload: at..bytes.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A fixture of the version-1 layout, so a format change cannot slip in.
    #[test]
    fn envelope_fixture_v1() {
        let mut out = Vec::new();
        encode_envelope(&mut out, Some(b"k"), 0x0102, b"xy");
        assert_eq!(out, [1, 1, 1, b'k', 0, 0, 0, 0, 0, 0, 1, 2, b'x', b'y']);
        let mut keyless = Vec::new();
        encode_envelope(&mut keyless, None, 5, b"");
        assert_eq!(keyless, [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]);
    }

    proptest! {
        #[test]
        fn envelope_round_trip(
            key in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..400)),
            payload in proptest::collection::vec(any::<u8>(), 0..400),
            time in any::<u64>(),
        ) {
            let mut out = Vec::new();
            encode_envelope(&mut out, key.as_deref(), time, &payload);
            prop_assert_eq!(out.len(), envelope_len(key.as_deref(), payload.len()));
            let view = decode_envelope(&out).unwrap();
            prop_assert_eq!(view.key.map(|r| out[r].to_vec()), key);
            prop_assert_eq!(view.commit_time_ms, time);
            prop_assert_eq!(&out[view.payload], payload.as_slice());
        }

        /// A key and payload handed over masked as one region are stored as
        /// the same envelope as their plain bytes.
        #[test]
        fn a_masked_record_encodes_as_its_plain_bytes(
            key in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..20)),
            payload in proptest::collection::vec(any::<u8>(), 0..100),
            word in any::<u64>(),
        ) {
            let mut region = key.clone().unwrap_or_default();
            let key_len = region.len();
            region.extend_from_slice(&payload);
            crate::mask::apply_mask(word, 0, &mut region);
            let (masked_key, masked_payload) = region.split_at(key_len);
            let mut masked = Vec::new();
            encode_masked_envelope(
                &mut masked,
                key.as_ref().map(|_| masked_key),
                9,
                masked_payload,
                word,
            );
            let mut plain = Vec::new();
            encode_envelope(&mut plain, key.as_deref(), 9, &payload);
            prop_assert_eq!(masked, plain);
        }

        #[test]
        fn long_keys_round_trip(len in 0usize..KEY_BYTES_MAX + 1) {
            let key = vec![7u8; len];
            let mut out = Vec::new();
            encode_envelope(&mut out, Some(&key), 1, b"p");
            let view = decode_envelope(&out).unwrap();
            prop_assert_eq!(view.key.map(|r| r.len()), Some(len));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(view) = decode_envelope(&bytes) {
                prop_assert!(view.payload.end == bytes.len());
                if let Some(key) = view.key {
                    prop_assert!(key.end <= view.payload.start);
                }
            }
        }
    }
}
