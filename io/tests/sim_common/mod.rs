//! Helpers the simulated disk's tests share.
#![allow(dead_code)]

use narad_io::file::OpenMode;
use narad_io::sim::{SimDisk, SimFaults, SimFile};
use narad_io::Storage;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Seeds swept by the crash tests. Each unsynced sector survives with probability
/// one half, so a few hundred seeds observe every outcome the tests look for with
/// overwhelming probability, and the sweep is deterministic anyway.
pub const SEEDS_MAX: u64 = 300;

pub fn new_disk(seed: u64) -> SimDisk {
    SimDisk::new(seed, SimFaults::default())
}

pub async fn open(disk: &SimDisk, path: &str) -> SimFile {
    disk.open(path, OpenMode::CreateOrOpen)
        .await
        .expect("open on a disk without faults")
}

pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    ChaCha8Rng::seed_from_u64(seed).fill_bytes(&mut bytes);
    bytes
}

/// `bytes` padded with zeros to `len`, which is what a reader sees past a short file.
pub fn padded(bytes: &[u8], len: usize) -> Vec<u8> {
    let mut out = bytes.to_vec();
    out.resize(len.max(bytes.len()), 0);
    out
}
