//! The dispatch checkpoint: the first WAL sequence number not yet committed to its
//! partition. Everything below it may be compacted away.
//!
//! Stored in one 4 KiB block of the file `checkpoint`, overwritten in place through
//! the same storage interface as the segments (so the fault-injecting disk covers
//! it too): `magic "NWCK" | version u8 | 3 zero bytes | seq u64 | crc32c u32`, the
//! checksum over the 16 bytes before it. A store writes the block into the page
//! cache at once (`write_cached_at`), so a process crash keeps the newest value
//! without a device write per store (the checkpoint moves with every commit that
//! lands, at low rates once per record); making it durable is left to a lazy
//! flush (one `fdatasync` for however many stores landed meanwhile). A block that
//! fails its checksum reads as "no checkpoint": dispatch then replays from the
//! oldest segment, which duplicates but never loses.

use std::io;

use narad_io::file::OpenMode;
use narad_io::{BlockFile, Storage, BLOCK_BYTES};

use crate::ids::Seq;

/// File name of the checkpoint inside a WAL directory.
pub const CHECKPOINT_FILE: &str = "checkpoint";
const MAGIC: [u8; 4] = *b"NWCK";
const VERSION: u8 = 1;
const ENCODED_BYTES: usize = 20;

/// Encodes a checkpoint block.
pub fn encode(seq: Seq) -> Vec<u8> {
    let mut block = vec![0u8; BLOCK_BYTES];
    block[..4].copy_from_slice(&MAGIC);
    block[4] = VERSION;
    block[8..16].copy_from_slice(&seq.0.to_be_bytes());
    let crc = crc32c::crc32c(&block[..16]);
    block[16..ENCODED_BYTES].copy_from_slice(&crc.to_be_bytes());
    block
}

/// Decodes a checkpoint block; `None` when it is absent, torn or corrupt.
pub fn decode(block: &[u8]) -> Option<Seq> {
    if block.len() < ENCODED_BYTES || block[..4] != MAGIC || block[4] != VERSION {
        return None;
    }
    let crc = u32::from_be_bytes(block[16..20].try_into().ok()?);
    if crc32c::crc32c(&block[..16]) != crc {
        return None;
    }
    Some(Seq(u64::from_be_bytes(block[8..16].try_into().ok()?)))
}

/// The open checkpoint file.
pub struct CheckpointFile<F> {
    file: F,
}

impl<F: BlockFile> CheckpointFile<F> {
    /// Opens (creating if needed) the checkpoint of the WAL in `dir` and reads it.
    pub async fn open<S: Storage<File = F>>(
        storage: &S,
        dir: &str,
    ) -> io::Result<(Self, Option<Seq>)> {
        let path = narad_io::file::join(dir, CHECKPOINT_FILE);
        let file = storage.open(&path, OpenMode::CreateOrOpen).await?;
        let mut block = vec![0u8; BLOCK_BYTES];
        file.read_at(0, &mut block).await?;
        Ok((Self { file }, decode(&block)))
    }

    /// Overwrites the stored value in the page cache; durable only after
    /// [`CheckpointFile::sync`].
    pub async fn store(&self, seq: Seq) -> io::Result<()> {
        self.file.write_cached_at(0, &encode(seq)).await
    }

    /// Makes the last stored value durable.
    pub async fn sync(&self) -> io::Result<()> {
        self.file.sync_data().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(seq in any::<u64>()) {
            prop_assert_eq!(decode(&encode(Seq(seq))), Some(Seq(seq)));
        }

        #[test]
        fn arbitrary_blocks_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn a_flipped_bit_reads_as_absent(seq in any::<u64>(), bit in 0usize..160) {
            let mut block = encode(Seq(seq));
            block[bit / 8] ^= 1 << (bit % 8);
            prop_assert_eq!(decode(&block), None);
        }
    }

    #[test]
    fn zeros_read_as_absent() {
        assert_eq!(decode(&[0u8; BLOCK_BYTES]), None);
    }
}
