//! Property tests of [`AppendFile`] over the simulated disk.
//!
//! The model is a plain `Vec<u8>`: whatever sequence of appends, syncs, marks,
//! rewinds and reopens the strategy draws, the file's bytes `[0, len)` must equal
//! the model. A second property crashes the disk after a run of appends and checks
//! that recovery at the last synced length both finds the synced bytes and can carry
//! on appending, which is how every log resumes after a restart.
//!
//! The simulated disk never waits on anything, so a plain `block_on` drives it and
//! no io_uring executor is needed.

use futures_lite::future::block_on;
use narad_io::append::{read_exact_at, AppendMark};
use narad_io::file::OpenMode;
use narad_io::sim::{SimDisk, SimFaults, SimFile};
use narad_io::{AppendFile, BlockFile, Storage};
use proptest::prelude::*;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The largest single append the strategy draws, in bytes: over two blocks, so an
/// append can start mid-block, span a whole block and end mid-block.
const APPEND_BYTES_MAX: usize = 10_000;

/// Operations per generated run. Bounded so that one case stays well under a
/// megabyte of simulated file.
const OPS_MAX: usize = 48;

#[derive(Clone, Debug)]
enum Op {
    /// Appends `len` bytes drawn from `seed`, split into `parts` slices.
    Append {
        len: usize,
        parts: usize,
        seed: u64,
    },
    Sync,
    Mark,
    /// Rewinds to the mark chosen by this index (modulo the marks held).
    Rewind(usize),
    /// Gives the file back and opens a new `AppendFile` at the current length, which
    /// has to read the partial tail block from the device.
    Reopen,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..APPEND_BYTES_MAX, 1usize..=3, any::<u64>())
            .prop_map(|(len, parts, seed)| Op::Append { len, parts, seed }),
        2 => Just(Op::Sync),
        1 => Just(Op::Mark),
        1 => any::<usize>().prop_map(Op::Rewind),
        1 => Just(Op::Reopen),
    ]
}

/// Deterministic bytes, so a shrunk case prints a seed rather than 10 KB of data.
fn bytes_from_seed(len: usize, seed: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    ChaCha8Rng::seed_from_u64(seed).fill_bytes(&mut bytes);
    bytes
}

/// Splits `bytes` into `parts` slices of nearly equal length (some may be empty).
fn split_parts(bytes: &[u8], parts: usize) -> Vec<&[u8]> {
    assert!(parts > 0);
    let step = bytes.len().div_ceil(parts).max(1);
    let mut slices: Vec<&[u8]> = bytes.chunks(step).collect();
    while slices.len() < parts {
        slices.push(&[]);
    }
    slices
}

async fn open_file(disk: &SimDisk) -> SimFile {
    disk.open("log", OpenMode::CreateOrOpen)
        .await
        .expect("the simulated disk has no faults configured")
}

async fn assert_matches_model(file: &AppendFile<SimFile>, model: &[u8]) {
    assert_eq!(file.len(), model.len() as u64);
    let read = read_exact_at(file.file(), 0, model.len())
        .await
        .expect("reads cannot fail without injected faults");
    assert!(read == model, "file bytes differ from the appended bytes");
    let size = file.file().size().await.expect("size of an open file");
    assert!(
        size >= model.len() as u64,
        "the device holds every appended byte"
    );
}

async fn run_ops(seed: u64, ops: Vec<Op>) {
    let disk = SimDisk::new(seed, SimFaults::default());
    let mut file = AppendFile::open_at(open_file(&disk).await, 0)
        .await
        .expect("open an empty file");
    let mut model: Vec<u8> = Vec::new();
    // Marks taken since the last rewind, oldest first; their lengths never decrease.
    let mut marks: Vec<AppendMark> = Vec::new();
    for op in ops {
        match op {
            Op::Append { len, parts, seed } => {
                let bytes = bytes_from_seed(len, seed);
                file.append(&split_parts(&bytes, parts))
                    .await
                    .expect("append without faults");
                model.extend_from_slice(&bytes);
            }
            Op::Sync => file.sync().await.expect("sync without faults"),
            Op::Mark => marks.push(file.mark()),
            Op::Rewind(pick) => {
                if marks.is_empty() {
                    continue;
                }
                let index = pick % marks.len();
                let mark = marks[index].clone();
                file.rewind(&mark);
                model.truncate(mark.len() as usize);
                // Marks taken after this one lie past the new end and are invalid.
                marks.truncate(index + 1);
            }
            Op::Reopen => {
                let len = file.len();
                file = AppendFile::open_at(file.into_file(), len)
                    .await
                    .expect("reopen without faults");
                // A mark holds a copy of its tail block, so it stays valid across a
                // reopen of the same bytes.
            }
        }
        assert_matches_model(&file, &model).await;
    }
}

/// Appends, syncing sometimes, then crashes, and checks that recovery at the last
/// synced length sees exactly the synced bytes and can keep appending over the
/// unsynced remains.
async fn crash_and_resume(seed: u64, lens: Vec<(usize, bool)>, more: usize) {
    let disk = SimDisk::new(seed, SimFaults::default());
    let mut file = AppendFile::open_at(open_file(&disk).await, 0)
        .await
        .expect("open an empty file");
    let mut model: Vec<u8> = Vec::new();
    let mut synced_len = 0usize;
    for (i, (len, sync)) in lens.into_iter().enumerate() {
        let bytes = bytes_from_seed(len, seed ^ i as u64);
        file.append(&[&bytes]).await.expect("append without faults");
        model.extend_from_slice(&bytes);
        if sync {
            file.sync().await.expect("sync without faults");
            synced_len = model.len();
        }
    }
    disk.crash();
    disk.reboot();
    model.truncate(synced_len);
    let mut file = AppendFile::open_at(open_file(&disk).await, synced_len as u64)
        .await
        .expect("reopen after reboot");
    assert_matches_model(&file, &model).await;
    let bytes = bytes_from_seed(more, !seed);
    file.append(&[&bytes]).await.expect("append after reboot");
    model.extend_from_slice(&bytes);
    file.sync().await.expect("sync after reboot");
    assert_matches_model(&file, &model).await;
}

proptest! {
    #[test]
    fn appended_bytes_read_back(
        seed in any::<u64>(),
        ops in prop::collection::vec(op_strategy(), 1..OPS_MAX),
    ) {
        block_on(run_ops(seed, ops));
    }

    #[test]
    fn synced_prefix_survives_crash_and_appends_resume(
        seed in any::<u64>(),
        lens in prop::collection::vec((0..APPEND_BYTES_MAX, any::<bool>()), 1..24),
        more in 0..APPEND_BYTES_MAX,
    ) {
        block_on(crash_and_resume(seed, lens, more));
    }
}

#[test]
fn split_parts_keeps_every_byte() {
    let bytes: Vec<u8> = (0..10u8).collect();
    for parts in 1..=4 {
        let slices = split_parts(&bytes, parts);
        assert_eq!(slices.len(), parts);
        assert_eq!(slices.concat(), bytes);
    }
    assert_eq!(split_parts(&[], 3), vec![&[] as &[u8]; 3]);
}

#[test]
fn mark_and_rewind_overwrite_the_abandoned_bytes() {
    block_on(async {
        let disk = SimDisk::new(7, SimFaults::default());
        let mut file = AppendFile::open_at(open_file(&disk).await, 0)
            .await
            .unwrap();
        file.append(&[b"hello "]).await.unwrap();
        let mark = file.mark();
        file.append(&[&[b'x'; 5000]]).await.unwrap();
        file.rewind(&mark);
        assert_eq!(file.len(), 6);
        file.append(&[b"wor", b"ld"]).await.unwrap();
        let read = read_exact_at(file.file(), 0, 11).await.unwrap();
        assert_eq!(read, b"hello world");
        // The rewind does not touch the device, so the block after the new end
        // still holds the abandoned bytes: readers must stop at the logical length.
        let stale = read_exact_at(file.file(), 4096, 10).await.unwrap();
        assert_eq!(stale, vec![b'x'; 10]);
    });
}

/// Appends of 512 KiB and more go to the device as several writes, each laid
/// out from the rewritten head, the parts and the padding: every byte lands
/// where it belongs, across piece and part boundaries, and the padding after
/// the end is zeros (the simulated device buffer starts full of stale bytes).
#[test]
fn large_appends_land_byte_for_byte_with_zero_padding() {
    block_on(async {
        let disk = SimDisk::new(11, SimFaults::default());
        let mut file = AppendFile::open_at(open_file(&disk).await, 0)
            .await
            .unwrap();
        let mut model = Vec::new();
        for (i, len) in [1_234usize, 700_001, 3, 1_300_007, 524_288]
            .into_iter()
            .enumerate()
        {
            let bytes = bytes_from_seed(len, i as u64);
            let parts = split_parts(&bytes, 1 + i % 4);
            file.append(&parts).await.unwrap();
            model.extend_from_slice(&bytes);
            assert_matches_model(&file, &model).await;
            let padded = narad_io::align_up(model.len() as u64) as usize;
            let padding = read_exact_at(file.file(), model.len() as u64, padded - model.len())
                .await
                .unwrap();
            assert!(
                padding.iter().all(|&b| b == 0),
                "append {i}: padding is zeros"
            );
        }
    });
}

/// A durable append inside the file's size is one durable write; one that
/// grows the file is a plain write and a sync, whose bytes survive a power loss
/// under the simulated disk's model of growing `O_DSYNC` writes. The size comes
/// from the opening, the appends, and what the caller says it prepared.
#[test]
fn a_durable_append_that_grows_the_file_is_a_write_and_a_sync() {
    for seed in 0..64 {
        block_on(async {
            let disk = SimDisk::new(seed, SimFaults::default());
            let raw = open_file(&disk).await;
            raw.write_at(0, &vec![0u8; 8192]).await.unwrap();
            raw.sync_data().await.unwrap();
            let mut file = AppendFile::open_at(raw, 0).await.unwrap();
            assert_eq!(file.file_bytes(), 8192);
            let before = disk.stats();
            // Inside the prepared size: one durable write, no separate sync.
            file.append_durable(&[&[1u8; 5000]]).await.unwrap();
            let inside = disk.stats();
            assert_eq!(inside.durable_writes - before.durable_writes, 1);
            assert_eq!(inside.syncs, before.syncs);
            assert!(!file.would_grow(3000) && file.would_grow(3500));
            // Past it: a plain write and a sync.
            file.append_durable(&[&[2u8; 5000]]).await.unwrap();
            let grown = disk.stats();
            assert_eq!(grown.durable_writes, inside.durable_writes, "seed {seed}");
            assert_eq!(grown.syncs - inside.syncs, 1, "seed {seed}");
            assert_eq!(file.file_bytes(), 12288);
            // Zeros written beside the handle, and said so: durable writes again.
            file.file().write_at(12288, &vec![0u8; 4096]).await.unwrap();
            file.file().sync_data().await.unwrap();
            file.grew_to(16384);
            file.append_durable(&[&[3u8; 100]]).await.unwrap();
            assert_eq!(disk.stats().durable_writes, grown.durable_writes + 1);
            disk.crash();
            disk.reboot();
            let bytes = disk.contents("log").unwrap();
            let want: Vec<u8> = [vec![1u8; 5000], vec![2u8; 5000], vec![3u8; 100]].concat();
            assert_eq!(&bytes[..want.len()], &want[..], "seed {seed}");
        });
    }
}
