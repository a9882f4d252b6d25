//! The `consumer.offset` file: the frontier as a u64, little-endian, in the
//! first 8 bytes of one block (the rest zeros); the file older releases and
//! operators read. The committer brings it level with the durable frontier
//! ([`level_file`]); [`read_offset_file`] reads it back at load.

use std::io;

use narad_io::file::{join, OpenMode};
use narad_io::{BlockFile, Storage, BLOCK_BYTES};

use super::{open_existing, OFFSET_FILE};
use crate::ids::Offset;

/// The frontier a block read from the file holds, `None` when the file held
/// fewer than 8 bytes (created, never written).
fn decode(block: &[u8], bytes_in_file: usize) -> Option<Offset> {
    (bytes_in_file >= 8)
        .then(|| Offset(u64::from_le_bytes(block[..8].try_into().expect("8 bytes"))))
}

/// The frontier `consumer.offset` holds, `None` when the file is missing.
pub async fn read_offset_file<S: Storage>(storage: &S, dir: &str) -> io::Result<Option<Offset>> {
    let Some(file) = open_existing(storage, &join(dir, OFFSET_FILE)).await? else {
        return Ok(None);
    };
    let mut block = vec![0u8; BLOCK_BYTES];
    let read = file.read_at(0, &mut block).await;
    let _ = file.close().await;
    Ok(decode(&block, read?))
}

/// Writes `target` into `consumer.offset` unless it already holds as much; returns
/// whether it wrote.
pub(super) async fn level_file<S: Storage>(
    storage: &S,
    path: &str,
    target: Offset,
) -> io::Result<bool> {
    let file = storage.open(path, OpenMode::CreateOrOpen).await?;
    let outcome = level_open_file(&file, target).await;
    let _ = file.close().await;
    outcome
}

async fn level_open_file<F: BlockFile>(file: &F, target: Offset) -> io::Result<bool> {
    let mut block = vec![0u8; BLOCK_BYTES];
    let bytes_in_file = file.read_at(0, &mut block).await?;
    if decode(&block, bytes_in_file).is_some_and(|found| found >= target) {
        // What the read shows may be a value whose sync failed, still in
        // the device's cache: make it durable before trusting it.
        file.sync_data().await?;
        return Ok(false);
    }
    block.fill(0);
    block[..8].copy_from_slice(&target.0.to_le_bytes());
    file.write_at(0, &block).await?;
    file.sync_data().await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_io::sim::{SimDisk, SimFaults};

    /// A level whose sync failed may leave its value readable but not durable;
    /// the next level, finding it, must not take it as durable unsynced. Over
    /// many seeds the failed sync keeps, leaves pending or drops the sector, and
    /// the crash keeps or drops what is pending: the level always survives.
    #[test]
    fn a_level_after_a_failed_sync_is_durable_when_it_reports_done() {
        for seed in 0..64 {
            let disk = SimDisk::new(seed, SimFaults::default());
            futures_lite::future::block_on(async {
                let file = disk.open("offset", OpenMode::CreateOrOpen).await.unwrap();
                assert!(level_open_file(&file, Offset(5)).await.unwrap());
                disk.fail_next_syncs(1);
                assert!(level_open_file(&file, Offset(9)).await.is_err());
                level_open_file(&file, Offset(9)).await.unwrap();
                disk.crash();
            });
            disk.reboot();
            let bytes = disk.contents("offset").unwrap();
            let found = u64::from_le_bytes(bytes[..8].try_into().unwrap());
            assert_eq!(found, 9, "seed {seed}");
        }
    }
}
