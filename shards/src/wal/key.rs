//! The WAL's frame key: the secret that masks the key and payload bytes of every
//! format 2 frame (see `frame.rs`), made once per WAL directory.
//!
//! Stored in one 4 KiB block of the file `frame-key`: `magic "NWKY" | version u8 |
//! 3 zero bytes | k0 u64 | k1 u64 | crc32c u32`, the checksum over the 24 bytes
//! before it. A new key is written to `frame-key.tmp`, synced and renamed into
//! place (the rename syncs the directory) before any frame uses it, so a crash
//! leaves either no key (and no frame that needs one) or the whole key. A key
//! file that fails its checksum is refused loudly: the frames it masked could not
//! be read without it.

use narad_io::file::{join, OpenMode};
use narad_io::{BlockFile, Storage, BLOCK_BYTES};

use std::collections::VecDeque;

use super::frame::{FrameKey, FORMAT_V2, FRAME_HEADER_BYTES, FRAME_MAGIC};
use super::segment::segment_name;
use super::WalError;
use crate::ids::Seq;

/// File name of the frame key inside a WAL directory.
pub const KEY_FILE: &str = "frame-key";
const MAGIC: [u8; 4] = *b"NWKY";
const VERSION: u8 = 1;
const ENCODED_BYTES: usize = 28;

fn encode(key: &FrameKey) -> Vec<u8> {
    let mut block = vec![0u8; BLOCK_BYTES];
    block[..4].copy_from_slice(&MAGIC);
    block[4] = VERSION;
    let words = key.words();
    block[8..16].copy_from_slice(&words[0].to_be_bytes());
    block[16..24].copy_from_slice(&words[1].to_be_bytes());
    let crc = crc32c::crc32c(&block[..24]);
    block[24..ENCODED_BYTES].copy_from_slice(&crc.to_be_bytes());
    block
}

fn decode(block: &[u8]) -> Option<FrameKey> {
    if block.len() < ENCODED_BYTES || block[..4] != MAGIC || block[4] != VERSION {
        return None;
    }
    let crc = u32::from_be_bytes(block[24..28].try_into().ok()?);
    if crc32c::crc32c(&block[..24]) != crc {
        return None;
    }
    Some(FrameKey::new([
        u64::from_be_bytes(block[8..16].try_into().ok()?),
        u64::from_be_bytes(block[16..24].try_into().ok()?),
    ]))
}

/// The check word of the key a `frame-key` file holds, if it is intact: what
/// an offline reader needs to tell this WAL's frames apart (see
/// `segment::scan_past_dispatched`).
pub fn key_check_of(block: &[u8]) -> Option<u32> {
    decode(block).map(|key| key.check())
}

/// The key of the WAL in `dir` if it has an intact one; nothing is made or
/// refused here (`load_or_create` does that).
pub async fn load_existing<S: Storage>(
    storage: &S,
    dir: &str,
) -> Result<Option<FrameKey>, WalError> {
    if !storage.list(dir).await?.iter().any(|n| n == KEY_FILE) {
        return Ok(None);
    }
    let file = storage
        .open(&join(dir, KEY_FILE), OpenMode::Existing)
        .await?;
    let mut block = vec![0u8; BLOCK_BYTES];
    let read = file.read_at(0, &mut block).await;
    file.close().await?;
    read?;
    Ok(decode(&block))
}

/// Reads the key of the WAL in `dir`, making one if it has none yet. A WAL whose
/// `segments` already hold masked frames but has no key lost it: that is refused,
/// since a new key would leave those records unreadable.
pub async fn load_or_create<S: Storage>(
    storage: &S,
    dir: &str,
    segments: &VecDeque<Seq>,
) -> Result<FrameKey, WalError> {
    let path = join(dir, KEY_FILE);
    if storage.list(dir).await?.iter().any(|n| n == KEY_FILE) {
        let file = storage.open(&path, OpenMode::Existing).await?;
        let mut block = vec![0u8; BLOCK_BYTES];
        let read = file.read_at(0, &mut block).await;
        file.close().await?;
        read?;
        return decode(&block).ok_or_else(|| {
            WalError::Corrupt(
                format!("{path} is damaged: the records of this WAL cannot be read without it")
                    .into(),
            )
        });
    }
    for &first in segments {
        if first_frame_is_masked(storage, &join(dir, &segment_name(first))).await? {
            return Err(WalError::Corrupt(
                format!(
                    "{path} is missing, but {} holds records masked with it: they cannot be read \
                     without it; restore the file from where this directory was copied or backed up",
                    segment_name(first)
                )
                .into(),
            ));
        }
    }
    let key = FrameKey::new([rand::random(), rand::random()]);
    let tmp = join(dir, "frame-key.tmp");
    let file = storage.open(&tmp, OpenMode::CreateOrOpen).await?;
    file.write_at(0, &encode(&key)).await?;
    file.sync_data().await?;
    file.close().await?;
    storage.rename(&tmp, &path).await?;
    Ok(key)
}

/// Whether the segment at `path` starts with a format 2 frame (what is there
/// is not checked further: a torn first frame reads as not masked).
async fn first_frame_is_masked<S: Storage>(storage: &S, path: &str) -> Result<bool, WalError> {
    let file = storage.open(path, OpenMode::Existing).await?;
    let mut block = vec![0u8; BLOCK_BYTES];
    let read = file.read_at(0, &mut block).await;
    file.close().await?;
    let read = read?;
    Ok(read > FRAME_HEADER_BYTES
        && block[..4] == FRAME_MAGIC
        && block[FRAME_HEADER_BYTES] == FORMAT_V2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let key = FrameKey::new([1, u64::MAX]);
        let block = encode(&key);
        assert_eq!(decode(&block), Some(key));
        for bit in 0..(ENCODED_BYTES * 8) {
            let mut damaged = block.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(decode(&damaged), None, "bit {bit}");
        }
        assert_eq!(decode(&[0u8; BLOCK_BYTES]), None);
    }
}
