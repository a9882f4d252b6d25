//! The masks that keep client bytes from reaching a disk as they were sent: a
//! 64-bit word XORed over the bytes, repeated. The ingress WAL masks a record's
//! key and payload with a word of its frame (`wal::frame`); the partition log
//! masks a frame's stored payload with a word of its own (`log::frame`).
//!
//! A record read from the WAL's memory travels to its partition still masked,
//! with its word ([`crate::produce::OwnedRecord::mask`]): the owner unmasks it
//! as it copies it into the log's records area ([`extend_unmasked`]), the one
//! copy it makes anyway, instead of the dispatcher copying every record out
//! first. The key and payload form one masked region, the payload continuing
//! the key's phase.
//!
//! Which cores: any; pure functions.

/// XORs `bytes` with `word` repeated, where `bytes` starts `phase` bytes into
/// the masked region. Its own inverse; 0 leaves the bytes as they are.
pub fn apply_mask(word: u64, phase: usize, bytes: &mut [u8]) {
    if word == 0 {
        return;
    }
    let word = word.rotate_right(8 * (phase % 8) as u32);
    let mut chunks = bytes.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let v = u64::from_le_bytes(chunk.try_into().expect("8 bytes")) ^ word;
        chunk.copy_from_slice(&v.to_le_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= word.to_le_bytes()[i];
    }
}

/// Appends `masked`, which starts `phase` bytes into a region masked with
/// `word`, to `out` as plain bytes. The second pass runs over bytes the copy
/// has just brought into the cache.
pub fn extend_unmasked(out: &mut Vec<u8>, masked: &[u8], word: u64, phase: usize) {
    let start = out.len();
    out.extend_from_slice(masked);
    apply_mask(word, phase, &mut out[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Unmasking a region piece by piece, each piece at its phase, gives
        /// the bytes masked as a whole back.
        #[test]
        fn pieces_unmask_at_their_phase(
            plain in proptest::collection::vec(any::<u8>(), 0..100),
            cut in 0usize..100,
            word in any::<u64>(),
        ) {
            let cut = cut.min(plain.len());
            let mut masked = plain.clone();
            apply_mask(word, 0, &mut masked);
            if word != 0 && plain.len() >= 8 {
                prop_assert_ne!(&masked, &plain);
            }
            let mut out = Vec::new();
            extend_unmasked(&mut out, &masked[..cut], word, 0);
            extend_unmasked(&mut out, &masked[cut..], word, cut);
            prop_assert_eq!(out, plain);
        }
    }
}
