//! Tests of the simulated disk's crash model and injected faults.
//!
//! Every crash test in the storage crates trusts this model, so it is checked here
//! against the contract in `narad_io::file`: synced bytes survive a crash, unsynced
//! sectors survive or vanish one by one (so holes occur), and each injected fault
//! does exactly what it claims and nothing more. Seeds are swept rather than drawn,
//! so a failure names the seed that replays it.

use std::io;

use futures_lite::future::block_on;
use narad_io::append::read_exact_at;
use narad_io::file::OpenMode;
use narad_io::sim::{SimDisk, SimFile};
use narad_io::{AppendFile, BlockFile, Storage, BLOCK_BYTES, SECTOR_BYTES};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod sim_common;
use sim_common::{new_disk, open, padded, pattern, SEEDS_MAX};

/// What one seed's crash left behind.
struct CrashOutcome {
    /// Some unsynced sector carried its new bytes across the crash.
    unsynced_kept: bool,
    /// Some unsynced sector lost its new bytes.
    unsynced_lost: bool,
}

/// Appends random lengths with random syncs, crashes, reboots and checks the file
/// sector by sector: below the synced length every byte must survive, and every
/// sector is wholly what the last sync made durable or wholly one of the
/// versions written after it (the newest, or an earlier one written over).
async fn crash_after_random_appends(seed: u64) -> CrashOutcome {
    let disk = new_disk(seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut file = AppendFile::open_at(open(&disk, "log").await, 0)
        .await
        .unwrap();
    let mut durable_image: Vec<u8> = Vec::new();
    // What the file held after each append since the last sync.
    let mut written_since: Vec<Vec<u8>> = Vec::new();
    let mut synced_len = 0usize;
    let appends = rng.random_range(1..20);
    for i in 0..appends {
        let len = rng.random_range(0..10_000);
        file.append(&[&pattern(len, seed * 1000 + i)])
            .await
            .unwrap();
        written_since.push(disk.contents("log").unwrap());
        if rng.random_bool(0.3) {
            file.sync().await.unwrap();
            synced_len = file.len() as usize;
            durable_image = disk.contents("log").unwrap();
            written_since.clear();
        }
    }
    // Always leave some unsynced bytes so that every seed exercises the tear.
    file.append(&[&pattern(6000, !seed)]).await.unwrap();
    let at_crash = disk.contents("log").unwrap();
    let expected = read_exact_at(file.file(), 0, file.len() as usize)
        .await
        .unwrap();
    disk.crash();
    disk.reboot();

    let after = disk.contents("log").expect("the file's name is durable");
    assert!(after.len() >= synced_len, "seed {seed}: lost synced length");
    assert_eq!(
        after[..synced_len],
        expected[..synced_len],
        "seed {seed}: synced bytes changed across the crash"
    );
    let span = after.len().max(at_crash.len()).max(durable_image.len());
    let (after, old, new) = (
        padded(&after, span),
        padded(&durable_image, span),
        padded(&at_crash, span),
    );
    let earlier: Vec<Vec<u8>> = written_since
        .iter()
        .map(|image| padded(image, span))
        .collect();
    let mut outcome = CrashOutcome {
        unsynced_kept: false,
        unsynced_lost: false,
    };
    for start in (0..span).step_by(SECTOR_BYTES) {
        let sector = start..(start + SECTOR_BYTES).min(span);
        let (a, o, n) = (
            &after[sector.clone()],
            &old[sector.clone()],
            &new[sector.clone()],
        );
        assert!(
            a == o || a == n || earlier.iter().any(|image| a == &image[sector.clone()]),
            "seed {seed}: sector at {start} is a mix of old and new bytes"
        );
        if o != n {
            outcome.unsynced_kept |= a == n;
            outcome.unsynced_lost |= a == o;
        }
    }
    outcome
}

#[test]
fn synced_bytes_survive_and_unsynced_sectors_tear() {
    let mut kept = 0;
    let mut lost = 0;
    for seed in 0..SEEDS_MAX {
        let outcome = block_on(crash_after_random_appends(seed));
        kept += outcome.unsynced_kept as u32;
        lost += outcome.unsynced_lost as u32;
    }
    assert!(kept > 0, "no seed kept an unsynced sector");
    assert!(lost > 0, "no seed lost an unsynced sector");
}

/// A crash may keep a later sector and lose an earlier one: the hole a log's
/// recovery has to stop at rather than read across.
#[test]
fn a_crash_can_leave_a_hole_before_surviving_sectors() {
    let block = pattern(BLOCK_BYTES, 1);
    let mut holes = 0;
    let mut whole = 0;
    for seed in 0..SEEDS_MAX {
        block_on(async {
            let disk = new_disk(seed);
            let file = open(&disk, "f").await;
            file.write_at(0, &block).await.unwrap();
            disk.crash();
            disk.reboot();
            let after = padded(&disk.contents("f").unwrap(), BLOCK_BYTES);
            let survived: Vec<bool> = after
                .chunks(SECTOR_BYTES)
                .zip(block.chunks(SECTOR_BYTES))
                .map(|(a, b)| a == b)
                .collect();
            for (a, b) in after.chunks(SECTOR_BYTES).zip(block.chunks(SECTOR_BYTES)) {
                assert!(a == b || a.iter().all(|&x| x == 0), "seed {seed}");
            }
            if survived.iter().all(|&s| s) {
                whole += 1;
            }
            let first_lost = survived.iter().position(|&s| !s);
            if first_lost.is_some_and(|i| survived[i..].iter().any(|&s| s)) {
                holes += 1;
            }
        });
    }
    assert!(holes > 0, "no seed tore a hole before a surviving sector");
    assert!(whole > 0, "no seed kept the whole unsynced block");
}

#[test]
fn handles_opened_before_a_crash_stay_dead() {
    block_on(async {
        let disk = new_disk(3);
        let file = open(&disk, "f").await;
        file.write_at(0, &pattern(BLOCK_BYTES, 2)).await.unwrap();
        file.sync_data().await.unwrap();
        disk.crash();
        assert!(disk.is_crashed());
        assert!(file.write_at(0, &[0u8; BLOCK_BYTES]).await.is_err());
        assert!(disk.open("f", OpenMode::Existing).await.is_err());
        assert!(disk.list("").await.is_err());
        disk.reboot();
        assert!(!disk.is_crashed());

        let mut buf = vec![0u8; BLOCK_BYTES];
        assert!(file.read_at(0, &mut buf).await.is_err());
        assert!(file.write_at(0, &buf).await.is_err());
        assert!(file.sync_data().await.is_err());
        assert!(file.size().await.is_err());
        assert!(file.truncate(0).await.is_err());

        let fresh = disk.open("f", OpenMode::Existing).await.unwrap();
        assert_eq!(fresh.read_at(0, &mut buf).await.unwrap(), BLOCK_BYTES);
        assert_eq!(buf, pattern(BLOCK_BYTES, 2));
    });
}

#[test]
fn a_failed_sync_returns_eio_and_leaves_writes_unsynced() {
    let block = pattern(BLOCK_BYTES, 4);
    let mut lost = 0;
    for seed in 0..SEEDS_MAX {
        block_on(async {
            let disk = new_disk(seed);
            let file = open(&disk, "f").await;
            file.write_at(0, &block).await.unwrap();
            disk.fail_next_syncs(2);
            for _ in 0..2 {
                let err = file.sync_data().await.unwrap_err();
                assert_eq!(err.raw_os_error(), Some(libc::EIO), "seed {seed}");
            }
            assert_eq!(disk.stats().syncs, 0);
            // What readers see is what the device holds: each sector either the
            // new bytes or the old ones (zeros here), never anything else.
            let seen = disk.contents("f").unwrap();
            for (i, sector) in seen.chunks(512).enumerate() {
                let new = &block[i * 512..(i + 1) * 512];
                assert!(
                    sector == new || sector.iter().all(|&b| b == 0),
                    "seed {seed}"
                );
            }
            disk.crash();
            disk.reboot();
            if padded(&disk.contents("f").unwrap(), BLOCK_BYTES) != block {
                lost += 1;
            }
        });
    }
    assert!(
        lost > 0,
        "a write covered only by failed syncs always survived"
    );
}

/// A durable write is durable when it returns, and only it: a plain write
/// before it, not yet synced, still tears or vanishes in a crash, as it would on
/// a device that writes the durable one through with FUA.
#[test]
fn a_durable_write_survives_a_crash_and_syncs_nothing_else() {
    let plain = pattern(BLOCK_BYTES, 11);
    let durable = pattern(2 * BLOCK_BYTES, 12);
    let mut plain_lost = 0;
    for seed in 0..SEEDS_MAX {
        block_on(async {
            let disk = new_disk(seed);
            let file = open(&disk, "f").await;
            // Inside the file's size: a durable write that grows it is not
            // durable whole (below).
            file.truncate(3 * BLOCK_BYTES as u64).await.unwrap();
            file.write_at(0, &plain).await.unwrap();
            file.write_durable_with(BLOCK_BYTES as u64, durable.len(), |out| {
                out.copy_from_slice(&durable)
            })
            .await
            .unwrap();
            assert_eq!(disk.stats().durable_writes, 1);
            assert_eq!(disk.stats().syncs, 0, "a durable write is no fdatasync");
            disk.crash();
            disk.reboot();
            let after = padded(&disk.contents("f").unwrap(), 3 * BLOCK_BYTES);
            assert_eq!(&after[BLOCK_BYTES..], &durable[..], "seed {seed}");
            if after[..BLOCK_BYTES] != plain[..] {
                plain_lost += 1;
            }
        });
    }
    assert!(
        plain_lost > 0,
        "a durable write made an earlier one durable"
    );
}

/// A durable write that grows the file leaves its new size to the file
/// system, as an `O_DSYNC` direct write does (some kernels' ext4 lost it): what
/// lies past the old end survives a crash only as an unsynced write does,
/// until an `fdatasync` makes it durable.
#[test]
fn a_durable_write_that_grows_the_file_is_durable_only_after_a_sync() {
    let first = pattern(BLOCK_BYTES, 21);
    let grown = pattern(BLOCK_BYTES, 22);
    let mut grown_lost = 0;
    for seed in 0..SEEDS_MAX {
        for synced in [false, true] {
            block_on(async {
                let disk = new_disk(seed);
                let file = open(&disk, "f").await;
                file.write_at(0, &first).await.unwrap();
                file.sync_data().await.unwrap();
                file.write_durable_with(BLOCK_BYTES as u64, grown.len(), |out| {
                    out.copy_from_slice(&grown)
                })
                .await
                .unwrap();
                if synced {
                    file.sync_data().await.unwrap();
                }
                disk.crash();
                disk.reboot();
                let after = padded(&disk.contents("f").unwrap(), 2 * BLOCK_BYTES);
                assert_eq!(&after[..BLOCK_BYTES], &first[..], "seed {seed}");
                if after[BLOCK_BYTES..] != grown[..] {
                    assert!(!synced, "seed {seed}: lost after its sync");
                    grown_lost += 1;
                }
            });
        }
    }
    assert!(grown_lost > 0, "a growing durable write always survived");
}

/// A durable write whose sync half fails leaves each of its sectors durable,
/// pending or lost, as a failed `fdatasync` does.
#[test]
fn a_failed_durable_write_returns_eio_and_may_lose_its_sectors() {
    let block = pattern(BLOCK_BYTES, 13);
    let (mut lost, mut kept) = (0, 0);
    for seed in 0..SEEDS_MAX {
        block_on(async {
            let disk = new_disk(seed);
            let file = open(&disk, "f").await;
            disk.fail_next_syncs(1);
            let err = file
                .write_durable_with(0, BLOCK_BYTES, |out| out.copy_from_slice(&block))
                .await
                .unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EIO), "seed {seed}");
            assert_eq!(disk.stats().durable_writes, 0);
            disk.crash();
            disk.reboot();
            if padded(&disk.contents("f").unwrap(), BLOCK_BYTES) == block {
                kept += 1;
            } else {
                lost += 1;
            }
        });
    }
    assert!(lost > 0, "a failed durable write always survived");
    assert!(kept > 0, "a failed durable write never survived");
}

#[test]
fn only_the_requested_number_of_syncs_fail() {
    block_on(async {
        let disk = new_disk(5);
        let file = open(&disk, "f").await;
        let block = pattern(BLOCK_BYTES, 5);
        file.write_at(0, &block).await.unwrap();
        disk.fail_next_syncs(1);
        assert!(file.sync_data().await.is_err());
        // Written again after the failure, so the next sync covers it. (A write
        // covered only by the failed sync may be gone for good: a later successful
        // sync does not bring it back.)
        file.write_at(0, &block).await.unwrap();
        file.sync_data().await.expect("the second sync succeeds");
        assert_eq!(disk.stats().syncs, 1);
        disk.crash();
        disk.reboot();
        assert_eq!(disk.contents("f").unwrap(), block);
    });
}

#[test]
fn a_full_disk_refuses_writes_with_enospc_and_applies_nothing() {
    block_on(async {
        let disk = new_disk(6);
        disk.set_capacity(Some(2 * BLOCK_BYTES as u64));
        let file = open(&disk, "f").await;
        let first = pattern(BLOCK_BYTES, 6);
        file.write_at(0, &first).await.unwrap();
        assert_eq!(disk.space_left_bytes(), Some(BLOCK_BYTES as u64));
        let writes_before = disk.stats().writes;

        let err = file
            .write_at(BLOCK_BYTES as u64, &pattern(2 * BLOCK_BYTES, 7))
            .await
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(28));
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        assert_eq!(disk.contents("f").unwrap(), first, "nothing applied");
        assert_eq!(disk.stats().writes, writes_before);
        assert_eq!(file.size().await.unwrap(), BLOCK_BYTES as u64);

        // Overwrites inside the file need no new space and still succeed, and the
        // last free block can be filled.
        let second = pattern(BLOCK_BYTES, 8);
        file.write_at(0, &second).await.unwrap();
        file.write_at(BLOCK_BYTES as u64, &second).await.unwrap();
        assert_eq!(disk.space_left_bytes(), Some(0));
        let err = open(&disk, "g")
            .await
            .write_at(0, &second)
            .await
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    });
}

#[test]
fn an_append_refused_for_space_keeps_the_logical_length() {
    block_on(async {
        let disk = new_disk(9);
        disk.set_capacity(Some(BLOCK_BYTES as u64));
        let mut file = AppendFile::open_at(open(&disk, "f").await, 0)
            .await
            .unwrap();
        file.append(&[b"abc"]).await.unwrap();
        let err = file.append(&[&[1u8; BLOCK_BYTES]]).await.unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
        assert_eq!(file.len(), 3);
        // Freeing space lets the same append go through, after the old bytes.
        disk.set_capacity(None);
        file.append(&[b"def"]).await.unwrap();
        assert_eq!(read_exact_at(file.file(), 0, 6).await.unwrap(), b"abcdef");
    });
}

#[test]
fn a_targeted_read_flip_hits_its_byte_once() {
    block_on(async {
        let disk = new_disk(9);
        let file = open(&disk, "f").await;
        let data = pattern(2 * BLOCK_BYTES, 9);
        file.write_at(0, &data).await.unwrap();
        let at = BLOCK_BYTES + 17;
        disk.flip_next_read_at("f", at as u64, 3);
        // A read that does not cover the byte leaves the flip armed.
        let mut buf = vec![0u8; BLOCK_BYTES];
        file.read_at(0, &mut buf).await.unwrap();
        assert_eq!(buf, data[..BLOCK_BYTES]);
        let mut buf = vec![0u8; 2 * BLOCK_BYTES];
        file.read_at(0, &mut buf).await.unwrap();
        let mut expected = data.clone();
        expected[at] ^= 1 << 3;
        assert_eq!(buf, expected);
        assert_eq!(disk.contents("f").unwrap(), data, "disk intact");
        file.read_at(0, &mut buf).await.unwrap();
        assert_eq!(buf, data, "only one read is damaged");
    });
}

#[test]
fn a_read_flip_changes_one_returned_bit_and_not_the_disk() {
    block_on(async {
        for seed in 0..32 {
            let disk = new_disk(seed);
            let file = open(&disk, "f").await;
            let data = pattern(2 * BLOCK_BYTES, seed);
            file.write_at(0, &data).await.unwrap();
            disk.flip_next_reads(1);
            let mut buf = vec![0u8; 2 * BLOCK_BYTES];
            file.read_at(0, &mut buf).await.unwrap();
            let flipped_bits: u32 = buf
                .iter()
                .zip(&data)
                .map(|(a, b)| (a ^ b).count_ones())
                .sum();
            assert_eq!(flipped_bits, 1, "seed {seed}");
            assert_eq!(
                disk.contents("f").unwrap(),
                data,
                "seed {seed}: disk intact"
            );
            // Only the requested read was damaged.
            file.read_at(0, &mut buf).await.unwrap();
            assert_eq!(buf, data, "seed {seed}");
        }
    });
}

/// Writes `bytes` at the start of `f` with a sync issued while the write is
/// still in flight (both return before the crash), then loses power; returns
/// what `f` holds after.
async fn write_beside_a_sync_then_crash(disk: &SimDisk, file: &SimFile, bytes: &[u8]) -> Vec<u8> {
    disk.set_slow_writes(true);
    let (written, synced) =
        futures_lite::future::zip(file.write_at(0, bytes), file.sync_data()).await;
    written.unwrap();
    synced.unwrap();
    disk.crash();
    disk.reboot();
    disk.contents("f").unwrap_or_default()
}

#[test]
fn a_sync_issued_while_a_write_is_in_flight_does_not_cover_it() {
    // Per sector: seen lost (zeros: nothing was there) and seen kept.
    let mut kept = [false; 2];
    for seed in 0..SEEDS_MAX {
        block_on(async {
            let disk = new_disk(seed);
            let file = open(&disk, "f").await;
            let block = pattern(BLOCK_BYTES, seed);
            let after = padded(
                &write_beside_a_sync_then_crash(&disk, &file, &block).await,
                BLOCK_BYTES,
            );
            for (got, written) in after.chunks(SECTOR_BYTES).zip(block.chunks(SECTOR_BYTES)) {
                let survived = got == written;
                assert!(survived || got.iter().all(|&b| b == 0), "seed {seed}");
                kept[usize::from(survived)] = true;
            }
            // Once it has returned, a sync covers it.
            let file = open(&disk, "f").await;
            file.write_at(0, &block).await.unwrap();
            file.sync_data().await.unwrap();
            disk.crash();
            disk.reboot();
            assert_eq!(disk.contents("f").unwrap(), block, "seed {seed}");
        });
    }
    assert_eq!(kept, [true, true], "lost and kept both seen");
}

#[test]
fn a_sync_beside_a_rewrite_in_flight_keeps_the_bytes_that_were_there() {
    let mut seen = [false; 2];
    for seed in 0..SEEDS_MAX {
        block_on(async {
            let disk = new_disk(seed);
            let file = open(&disk, "f").await;
            let (old, new) = (pattern(BLOCK_BYTES, seed), pattern(BLOCK_BYTES, seed + 1));
            file.write_at(0, &old).await.unwrap();
            // The device held the old bytes or the new ones when the sync
            // ran, never what was there before both: each sector is one of
            // the two.
            let got = write_beside_a_sync_then_crash(&disk, &file, &new).await;
            for (s, sector) in got.chunks(SECTOR_BYTES).enumerate() {
                let range = s * SECTOR_BYTES..(s + 1) * SECTOR_BYTES;
                let is_new = sector == &new[range.clone()];
                assert!(is_new || sector == &old[range], "seed {seed} sector {s}");
                seen[usize::from(is_new)] = true;
            }
        });
    }
    assert_eq!(seen, [true, true], "old and new sectors both seen");
}

#[test]
fn a_write_whose_caller_stopped_waiting_still_lands_for_a_later_sync() {
    for seed in 0..SEEDS_MAX {
        block_on(async {
            let disk = new_disk(seed);
            let file = open(&disk, "f").await;
            let block = pattern(BLOCK_BYTES, seed);
            disk.set_slow_writes(true);
            let mut write = Box::pin(file.write_at(0, &block));
            assert!(futures_lite::future::poll_once(&mut write).await.is_none());
            drop(write);
            file.sync_data().await.unwrap();
            disk.crash();
            disk.reboot();
            assert_eq!(disk.contents("f").unwrap(), block, "seed {seed}");
        });
    }
}

#[test]
fn a_sector_written_again_before_a_sync_may_come_back_with_an_earlier_version() {
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..SEEDS_MAX {
        block_on(async {
            let disk = new_disk(seed);
            let file = open(&disk, "f").await;
            let synced = vec![1u8; SECTOR_BYTES];
            file.write_at(0, &padded(&synced, BLOCK_BYTES))
                .await
                .unwrap();
            file.sync_data().await.unwrap();
            // Three unsynced versions of the first sector, then a crash.
            for version in 2..=4u8 {
                file.write_at(0, &padded(&[version; SECTOR_BYTES], BLOCK_BYTES))
                    .await
                    .unwrap();
            }
            disk.crash();
            disk.reboot();
            let first = disk.contents("f").unwrap()[0];
            assert!((1..=4).contains(&first), "seed {seed}: {first}");
            seen.insert(first);
            // Once synced, no earlier version comes back.
            let file = open(&disk, "f").await;
            file.write_at(0, &padded(&[5; SECTOR_BYTES], BLOCK_BYTES))
                .await
                .unwrap();
            file.write_at(0, &padded(&[6; SECTOR_BYTES], BLOCK_BYTES))
                .await
                .unwrap();
            file.sync_data().await.unwrap();
            disk.crash();
            disk.reboot();
            assert_eq!(disk.contents("f").unwrap()[0], 6, "seed {seed}");
        });
    }
    assert_eq!(
        seen.len(),
        4,
        "the synced bytes and each unsynced version seen: {seen:?}"
    );
}

#[test]
fn a_sync_beside_two_rewrites_in_flight_leaves_the_middle_one_possible() {
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..SEEDS_MAX {
        block_on(async {
            let disk = new_disk(seed);
            let file = open(&disk, "f").await;
            let version = |v: u8| padded(&[v; SECTOR_BYTES], BLOCK_BYTES);
            file.write_at(0, &version(1)).await.unwrap();
            disk.set_slow_writes(true);
            // Versions 2 and 3 go out one after the other; the sync issued
            // while both are out covers version 1 only.
            let ((second, third), synced) = futures_lite::future::zip(
                futures_lite::future::zip(
                    file.write_at(0, &version(2)),
                    file.write_at(0, &version(3)),
                ),
                file.sync_data(),
            )
            .await;
            second.unwrap();
            third.unwrap();
            synced.unwrap();
            disk.crash();
            disk.reboot();
            let first = disk.contents("f").unwrap()[0];
            assert!((1..=3).contains(&first), "seed {seed}: {first}");
            seen.insert(first);
        });
    }
    assert_eq!(seen.len(), 3, "each version seen: {seen:?}");
}

#[test]
fn a_synced_truncate_keeps_its_length_across_a_crash() {
    for seed in 0..SEEDS_MAX {
        block_on(async {
            let disk = new_disk(seed);
            let file = open(&disk, "f").await;
            let block = pattern(4 * BLOCK_BYTES, seed);
            file.write_at(0, &block).await.unwrap();
            file.sync_data().await.unwrap();
            // Rewritten past the cut and not synced, then cut and synced: the
            // shorter length is durable, whatever the rewrite left dirty.
            file.write_at(2 * BLOCK_BYTES as u64, &pattern(2 * BLOCK_BYTES, !seed))
                .await
                .unwrap();
            file.truncate(BLOCK_BYTES as u64 + 100).await.unwrap();
            file.sync_data().await.unwrap();
            disk.crash();
            disk.reboot();
            let after = disk.contents("f").unwrap();
            assert_eq!(after, &block[..BLOCK_BYTES + 100], "seed {seed}");
        });
    }
}

#[test]
fn crash_at_op_stops_that_operation_and_every_later_one() {
    block_on(async {
        let disk = new_disk(13);
        let file = open(&disk, "f").await;
        let block = pattern(BLOCK_BYTES, 13);
        // Creating the file was the first operation.
        assert_eq!(disk.ops(), 1);
        disk.crash_at_op(4);
        file.write_at(0, &block).await.unwrap();
        file.sync_data().await.unwrap();
        assert_eq!(disk.ops(), 3);
        assert!(file.write_at(BLOCK_BYTES as u64, &block).await.is_err());
        assert!(disk.is_crashed());
        disk.reboot();
        // The synced first block survives; the refused write never happened.
        assert_eq!(disk.contents("f").unwrap(), block);
    });
}
