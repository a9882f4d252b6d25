//! Segment preparation in the ingress WAL: a preparation that fails on a full
//! disk pauses and leaves nothing behind, a growing segment is left for a
//! prepared one as soon as it is ready, a short file is never recycled, and a
//! roll short of descriptors waits rather than latch.

use crate::common::*;
use narad_io::file::OpenMode;
use narad_io::rt::run_local;
use narad_io::sim::{SimDisk, SimFaults};
use narad_io::Storage;
use narad_shards::ids::Seq;
use narad_shards::wal::segment::segment_name;
use narad_shards::wal::{Wal, WalConfig, WalError};

#[test]
fn a_preparation_that_fails_on_a_full_disk_pauses_and_leaves_no_partial_file() {
    let disk = SimDisk::new(13, SimFaults::default());
    run_local(None, async move {
        // No spares: every preparation zero-fills a new file.
        let config = WalConfig {
            spare_segments_max: 0,
            ..small_config(true)
        };
        let wal = Wal::open(disk.clone(), "wal", config).await.unwrap();
        wait_until(|| disk_names_contain(&disk, "next-segment.prep")).await;
        // The first segment grows; the WAL leaves it for the prepared one.
        let payload = vec![5u8; 1024];
        while wal.stats().early_rolls == 0 {
            wal.append(&record(&payload, None)).await.unwrap();
        }
        wait_until(|| disk_names_contain(&disk, "next-segment.prep")).await;
        // The active segment and the next are on the device already; no room
        // for another: the preparation after the next roll fails.
        disk.set_capacity(Some(disk.allocated_bytes() + 8192));
        let rolls = wal.stats().rolls;
        while wal.stats().rolls == rolls {
            wal.append(&record(&payload, None)).await.unwrap();
        }
        wait_until(|| wal.stats().preparations_failed == 1).await;
        // Checkpoint syncs keep asking for a preparation (the checkpoint passes
        // only the short first segment, whose compaction frees a block, far
        // from a segment's room); none starts while the pause lasts.
        for seq in 1..=20 {
            wal.store_checkpoint(Seq(seq));
            wait_until(|| wal.synced_checkpoint() == Seq(seq)).await;
        }
        assert_eq!(wal.stats().preparations_failed, 1, "{:?}", wal.stats());
        assert!(!disk_names_contain(&disk, "next-segment.tmp"));
        disk.set_capacity(None);
        wal.close().await;
    });
}

/// A config (preparing segments or not) with no spares (every preparation
/// zero-fills) whose room, as the broker would measure it, the test sets; 0
/// to begin with.
fn measured_room(prealloc: bool) -> (std::sync::Arc<std::sync::atomic::AtomicU64>, WalConfig) {
    let room = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let config = WalConfig {
        spare_segments_max: 0,
        disk_room: Some(room.clone()),
        ..small_config(prealloc)
    };
    (room, config)
}

/// A segment made because none was prepared grows with every write, and a
/// write that runs out of space latches the WAL. So, as the broker last
/// measured the room: an append is refused (`NoRoom`, nothing staged, the WAL
/// not latched) unless the file system has room for what the growing segment
/// may still take plus a segment, and takes its bytes off the measure; a roll
/// onto a new growing segment needs room for two, and takes one; no segment
/// is zero-filled without room for two. With room again, appends go on with
/// the next sequence number.
#[test]
fn no_segment_grows_nor_is_zero_filled_without_room_for_it_and_one_more() {
    use std::sync::atomic::Ordering;

    let disk = SimDisk::new(14, SimFaults::default());
    // Growing segments go under the measure alone where nothing can be
    // reserved.
    disk.set_reserve_unsupported(true);
    run_local(None, async move {
        let (room, config) = measured_room(true);
        let segment = config.segment_bytes_max;
        room.store(2 * segment - 1, Ordering::Relaxed);
        let wal = Wal::open(disk.clone(), "wal", config).await.unwrap();
        let payload = vec![5u8; 1024];
        // The first segment, made at the open, grows: no room for it.
        let refused = wal.append(&record(&payload, None)).await;
        let needed_bytes = 2 * segment;
        assert!(
            matches!(refused, Err(WalError::NoRoom { needed_bytes: n }) if n == needed_bytes),
            "{refused:?}"
        );
        assert_eq!(wal.next_seq(), Seq(0), "nothing staged");
        // Room for it and one more: it fills, each append taking its bytes
        // off the room, which then lacks room for a roll onto a segment that
        // would grow.
        room.store(2 * segment, Ordering::Relaxed);
        let mut last = None;
        let refused = loop {
            match wal.append(&record(&payload, None)).await {
                Ok(seq) => last = Some(seq),
                Err(e) => break e,
            }
        };
        assert!(matches!(refused, WalError::NoRoom { .. }), "{refused}");
        let stats = wal.stats();
        assert_eq!(stats.rolls, 0, "{stats:?}");
        assert_eq!(stats.appends_refused_for_room, 2, "{stats:?}");
        assert!(stats.preparations_held > 0, "{stats:?}");
        assert_eq!(
            room.load(Ordering::Relaxed),
            2 * segment - stats.frame_bytes
        );
        assert!(!disk_names_contain(&disk, "next-segment.tmp"));
        assert!(!disk_names_contain(&disk, "next-segment.prep"));
        // Measured again with room for three: the roll onto a growing segment
        // takes one, the preparation it starts another.
        room.store(3 * segment, Ordering::Relaxed);
        let taken = wal.append(&record(&payload, None)).await.unwrap();
        assert_eq!(taken, last.unwrap().next(), "nothing was staged meanwhile");
        assert_eq!(wal.stats().rolls, 1);
        wait_until(|| disk_names_contain(&disk, "next-segment.prep")).await;
        assert_eq!(room.load(Ordering::Relaxed), segment);
        reopens_at(wal, &disk, true, taken.next()).await;
    });
}

/// The measure of room appends are admitted by is up to a second old, and
/// another process can fill the disk meanwhile: a segment that grows has its
/// blocks reserved before its first write, so later writes to it cannot run
/// out of space and the WAL does not latch; appends to it then take nothing
/// off the measure. So does the next growing segment a roll makes.
#[test]
fn a_growing_segment_is_reserved_so_a_disk_filled_behind_the_measure_does_not_latch() {
    use std::sync::atomic::Ordering;

    let disk = SimDisk::new(15, SimFaults::default());
    run_local(None, async move {
        let (room, config) = measured_room(false);
        room.store(100 * config.segment_bytes_max, Ordering::Relaxed);
        let wal = Wal::open(disk.clone(), "wal", config).await.unwrap();
        let payload = vec![5u8; 1024];
        let records: Vec<_> = (0..10).map(|_| record(&payload, None)).collect();
        let filler = disk.open("filler", OpenMode::CreateOrOpen).await.unwrap();
        let mut filled = 0;
        for segment in 0..2 {
            // The first write into the segment reserves it.
            wal.append_many(&records).await.unwrap();
            let measured = room.load(Ordering::Relaxed);
            // Another process takes every byte left, after the last measure.
            filled += 4096;
            narad_io::BlockFile::write_at(&filler, filled - 4096, &[1u8; 4096])
                .await
                .unwrap();
            disk.set_capacity(Some(disk.allocated_bytes()));
            for _ in 0..4 {
                wal.append_many(&records).await.unwrap();
            }
            assert!(!wal.is_latched());
            assert_eq!(wal.stats().rolls, segment, "all in one segment");
            assert_eq!(room.load(Ordering::Relaxed), measured, "nothing claimed");
            // Room again, and records up to the next roll.
            disk.set_capacity(None);
            while wal.stats().rolls == segment {
                wal.append(&record(&payload, None)).await.unwrap();
            }
        }
        let end = wal.next_seq();
        reopens_at(wal, &disk, false, end).await;
    });
}

/// A roll off a reserved growing segment makes a new one that is not
/// reserved until its first write: appends staged meanwhile (here while the
/// roll waits for a descriptor) are admitted by the measure of room, and
/// refused when it says the disk is full, rather than written into a segment
/// that can run out of space.
#[test]
fn appends_during_a_roll_off_a_reserved_segment_ask_for_room() {
    use std::sync::atomic::Ordering;
    const EMFILE: i32 = 24;

    let disk = SimDisk::new(16, SimFaults::default());
    run_local(None, async move {
        let (room, config) = measured_room(false);
        let segment = config.segment_bytes_max;
        room.store(100 * segment, Ordering::Relaxed);
        let wal = Wal::open(disk.clone(), "wal", config).await.unwrap();
        let payload = vec![5u8; 1024];
        let frame = record(&payload, None).frame_len() as u64;
        // Up to one record short of the roll.
        while wal.stats().frame_bytes + 2 * frame <= segment {
            wal.append(&record(&payload, None)).await.unwrap();
        }
        wal.append(&record(&payload, None)).await.unwrap();
        assert_eq!(wal.stats().rolls, 0);
        disk.fail_next_opens_with(3, EMFILE);
        let rolling = {
            let wal = wal.clone();
            narad_io::rt::spawn_local(async move { wal.append(&record(&[6u8; 1024], None)).await })
        };
        narad_io::rt::sleep(std::time::Duration::from_millis(5)).await;
        assert_eq!(wal.stats().rolls, 0, "still placing the next segment");
        // The disk fills, and the measure says so.
        room.store(0, Ordering::Relaxed);
        disk.set_capacity(Some(disk.allocated_bytes() + 8192));
        let records: Vec<_> = (0..10).map(|_| record(&[7u8; 1024], None)).collect();
        let refused = wal.append_many(&records).await;
        assert!(
            matches!(refused, Err(WalError::NoRoom { .. })),
            "{refused:?}"
        );
        // The append that rolled was admitted before the disk filled; the new
        // segment's reservation fails, and its one record still fits.
        let rolled = rolling.await.unwrap();
        assert!(rolled.is_ok(), "{rolled:?}");
        assert!(!wal.is_latched());
        wal.close().await;
    });
}

/// A reservation that fails for want of space gives back what it took (a
/// file system may allocate part of the range before it fails), and the
/// segment grows under the measure alone.
#[test]
fn a_failed_reservation_gives_its_space_back() {
    let disk = SimDisk::new(17, SimFaults::default());
    run_local(None, async move {
        let config = small_config(false);
        let segment = config.segment_bytes_max;
        let wal = Wal::open(disk.clone(), "wal", config).await.unwrap();
        let before = disk.allocated_bytes();
        // Room for half a segment: the reservation fails.
        disk.set_capacity(Some(before + segment / 2));
        let payload = vec![5u8; 1024];
        let records: Vec<_> = (0..10).map(|_| record(&payload, None)).collect();
        wal.append_many(&records).await.unwrap();
        assert!(!wal.is_latched());
        let frames = 10 * records[0].frame_len() as u64;
        assert_eq!(
            disk.allocated_bytes() - before,
            narad_io::align_up(frames),
            "only the frames' blocks are taken"
        );
        wal.close().await;
    });
}

/// A WAL with a prepared segment ready, one record in its growing first
/// segment, and no room left on the file system as last measured; and the
/// segment size.
async fn one_prepared_segment_and_no_room(disk: &SimDisk) -> (Wal<SimDisk>, u64) {
    use std::sync::atomic::Ordering;

    let (room, config) = measured_room(true);
    let segment = config.segment_bytes_max;
    room.store(4 * segment, Ordering::Relaxed);
    let wal = Wal::open(disk.clone(), "wal", config).await.unwrap();
    wait_until(|| disk_names_contain(disk, "next-segment.prep")).await;
    wal.append(&record(&[5u8; 1024], None)).await.unwrap();
    room.store(0, Ordering::Relaxed);
    (wal, segment)
}

/// Checks that the WAL rolled once, early, onto its prepared segment, and
/// closes it.
async fn rolled_once_early_onto_the_prepared_segment(wal: Wal<SimDisk>) {
    let stats = wal.stats();
    assert_eq!(
        (stats.rolls, stats.prepared_rolls, stats.early_rolls),
        (1, 1, 1),
        "{stats:?}"
    );
    wal.close().await;
}

/// A prepared segment serves one roll: without room to grow a segment, a
/// batch that needs two is refused whole, and one that fits the prepared
/// segment is taken onto it (the WAL leaves its growing first segment early).
#[test]
fn a_batch_is_refused_whole_when_only_some_of_its_segments_have_room() {
    let disk = SimDisk::new(16, SimFaults::default());
    run_local(None, async move {
        let (wal, segment) = one_prepared_segment_and_no_room(&disk).await;
        let payload = vec![5u8; 1024];
        let one = record(&payload, None);
        let frame = one.frame_len() as u64;
        let two_segments = vec![one; (2 * segment / frame) as usize];
        let next = wal.next_seq();
        let refused = wal.append_many(&two_segments).await;
        assert!(
            matches!(refused, Err(WalError::NoRoom { .. })),
            "{refused:?}"
        );
        assert_eq!(wal.next_seq(), next, "nothing staged");
        let fits = &two_segments[..(segment / frame - 1) as usize];
        let taken = wal.append_many(fits).await.unwrap();
        assert_eq!(taken.start, next);
        rolled_once_early_onto_the_prepared_segment(wal).await;
    });
}

/// Rolls staged and not yet made count against the one prepared segment:
/// appends staged together across two segment ends, with no room to grow a
/// segment, fill the prepared segment (the first leaves the growing one
/// early) and the rest are refused, never rolling onto a segment that grows.
#[test]
fn appends_staged_together_share_the_one_prepared_segment() {
    let disk = SimDisk::new(17, SimFaults::default());
    run_local(None, async move {
        let (wal, segment) = one_prepared_segment_and_no_room(&disk).await;
        let payload = vec![5u8; 1024];
        let one = record(&payload, None);
        let frame = one.frame_len() as u64;
        let appends = (0..2 * segment / frame + 4).map(|_| wal.append(&one));
        let results = narad_io::rt::join_all(appends).await;
        let taken = results.iter().filter(|r| r.is_ok()).count() as u64;
        assert!(
            results[taken as usize..]
                .iter()
                .all(|r| matches!(r, Err(WalError::NoRoom { .. }))),
            "{results:?}"
        );
        assert_eq!(taken, segment / frame, "the prepared segment's worth");
        rolled_once_early_onto_the_prepared_segment(wal).await;
    });
}

/// An early roll that would start a segment that grows, without room for it,
/// is dropped and the append taken into the active segment: here a
/// compaction's rotation of a dispatched segment, with preparation off.
#[test]
fn an_early_roll_without_room_is_dropped_not_the_append() {
    use std::sync::atomic::Ordering;

    let disk = SimDisk::new(18, SimFaults::default());
    run_local(None, async move {
        let (room, config) = measured_room(false);
        let segment = config.segment_bytes_max;
        room.store(u64::MAX, Ordering::Relaxed);
        let wal = Wal::open(disk.clone(), "wal", config.clone())
            .await
            .unwrap();
        let payload = vec![5u8; 1024];
        // Past `rotate_dispatched_bytes_min` and all dispatched: compaction
        // asks for a roll, which the next append makes.
        let mut next = Seq(0);
        while next.0 * 1100 < 2 * config.rotate_dispatched_bytes_min {
            next = wal.append(&record(&payload, None)).await.unwrap().next();
        }
        wal.store_checkpoint(next);
        wait_until(|| wal.synced_checkpoint() == next).await;
        // Room for the rest of the active segment and one more, not for a
        // new segment besides.
        room.store(2 * segment - 1, Ordering::Relaxed);
        let taken = wal.append(&record(&payload, None)).await.unwrap();
        assert_eq!(taken, next);
        assert_eq!(wal.stats().rolls, 0, "{:?}", wal.stats());
        // With room, the next rotation is made.
        room.store(u64::MAX, Ordering::Relaxed);
        wal.store_checkpoint(taken.next());
        wait_until(|| wal.synced_checkpoint() == taken.next()).await;
        wal.append(&record(&payload, None)).await.unwrap();
        assert_eq!(wal.stats().rolls, 1, "{:?}", wal.stats());
        wal.close().await;
    });
}

/// The WALs of several shards read one measure of the room: each takes its
/// segment off it as it starts, so that with room for three segments (less a
/// byte) one of two WALs opening together prepares and the other holds back.
#[test]
fn wals_sharing_one_measure_of_room_count_each_others_segments() {
    use std::sync::atomic::Ordering;

    let disk = SimDisk::new(15, SimFaults::default());
    run_local(None, async move {
        let (room, config) = measured_room(true);
        room.store(3 * config.segment_bytes_max - 1, Ordering::Relaxed);
        let first = Wal::open(disk.clone(), "wal", config.clone())
            .await
            .unwrap();
        let second = Wal::open(disk.clone(), "wal-2", config).await.unwrap();
        wait_until(|| disk_names_contain(&disk, "next-segment.prep")).await;
        assert_eq!(first.stats().preparations_held, 0, "{:?}", first.stats());
        assert!(second.stats().preparations_held > 0, "{:?}", second.stats());
        let names = futures_lite::future::block_on(disk.list("wal-2")).unwrap();
        assert!(
            !names.iter().any(|n| n.starts_with("next-segment")),
            "{names:?}"
        );
        first.close().await;
        second.close().await;
    });
}

/// The sizes of the WAL's files by name.
async fn file_sizes(disk: &SimDisk) -> Vec<(String, u64)> {
    let mut sizes = Vec::new();
    for name in disk.list("wal").await.unwrap() {
        let file = disk
            .open(&format!("wal/{name}"), narad_io::file::OpenMode::Existing)
            .await
            .unwrap();
        sizes.push((name, narad_io::BlockFile::size(&file).await.unwrap()));
        narad_io::BlockFile::close(file).await.unwrap();
    }
    sizes
}

/// A segment made empty (a new WAL, or a WAL reopened on a segment that was
/// growing) grows with every write, and each durable write then carries a size
/// change. The WAL leaves it for a prepared segment as soon as one is ready,
/// and never recycles the short file it leaves behind.
#[test]
fn a_growing_segment_is_left_for_a_prepared_one() {
    let disk = SimDisk::new(14, SimFaults::default());
    run_local(None, async move {
        let segment_bytes = small_config(true).segment_bytes_max;
        // A WAL without preparation grows its segment; reopened with it, the
        // WAL rolls away from that segment once the next one is ready.
        let wal = Wal::open(disk.clone(), "wal", small_config(false))
            .await
            .unwrap();
        let payload = vec![7u8; 1024];
        for _ in 0..4 {
            wal.append(&record(&payload, None)).await.unwrap();
        }
        wal.close().await;
        let wal = Wal::open(disk.clone(), "wal", small_config(true))
            .await
            .unwrap();
        wait_until(|| disk_names_contain(&disk, "next-segment.prep")).await;
        for _ in 0..2 {
            wal.append(&record(&payload, None)).await.unwrap();
        }
        assert_eq!(wal.stats().early_rolls, 1, "{:?}", wal.stats());
        assert_eq!(wal.segment_count(), 2);
        let sizes = file_sizes(&disk).await;
        let grown = &sizes
            .iter()
            .find(|(name, _)| *name == segment_name(Seq(0)))
            .unwrap()
            .1;
        assert!(*grown < segment_bytes / 2, "{sizes:?}");
        // Fill and dispatch several segments: compaction keeps spares, and the
        // short first segment is never prepared again.
        for _ in 0..6 * 64 {
            wal.append(&record(&payload, None)).await.unwrap();
            wal.store_checkpoint(wal.durable_next());
        }
        let target = wal.durable_next();
        wait_until(|| wal.synced_checkpoint() == target).await;
        wait_until(|| wal.stats().compactions >= 4).await;
        wait_until(|| disk_names_contain(&disk, "next-segment.prep")).await;
        let stats = wal.stats();
        assert_eq!(stats.early_rolls, 1, "{stats:?}");
        assert_eq!(
            stats.prepared_rolls, stats.rolls,
            "every roll found a prepared segment: {stats:?}"
        );
        for (name, bytes) in file_sizes(&disk).await {
            if name.starts_with("spare-") || name == "next-segment.prep" {
                assert!(bytes >= segment_bytes, "{name}: {bytes} bytes");
            }
        }
        reopens_at(wal, &disk, true, target).await;
    });
}

/// A spare shorter than a segment found at open (left by a version that kept
/// them) is removed rather than prepared: writes past its end would grow it.
#[test]
fn a_short_spare_found_at_open_is_removed_not_recycled() {
    let disk = SimDisk::new(15, SimFaults::default());
    run_local(None, async move {
        let wal = Wal::open(disk.clone(), "wal", small_config(false))
            .await
            .unwrap();
        wal.append(&record(&[9u8; 100], None)).await.unwrap();
        wal.close().await;
        let short = "wal/spare-00000000000000009999.wal";
        let file = disk
            .open(short, narad_io::file::OpenMode::CreateOrOpen)
            .await
            .unwrap();
        narad_io::BlockFile::write_at(&file, 0, &[0u8; 4096])
            .await
            .unwrap();
        narad_io::BlockFile::close(file).await.unwrap();
        let wal = Wal::open(disk.clone(), "wal", small_config(true))
            .await
            .unwrap();
        wait_until(|| disk_names_contain(&disk, "next-segment.prep")).await;
        let sizes = file_sizes(&disk).await;
        let prep = sizes
            .iter()
            .find(|(n, _)| n == "next-segment.prep")
            .unwrap();
        assert!(prep.1 >= small_config(true).segment_bytes_max, "{sizes:?}");
        assert!(!disk_names_contain(&disk, "spare-00000000000000009999.wal"));
        wal.close().await;
    });
}

/// `EMFILE`: the process is out of descriptors.
const EMFILE: i32 = 24;

/// A roll whose prepared segment's rename is made but cannot be synced (its
/// directory could not be opened), and whose opens then fail for want of
/// descriptors, waits the shortage out: nothing is refused, nothing latches,
/// and every record is read back after a reopen. An error that is no shortage
/// still latches the WAL.
#[test]
fn a_roll_short_of_descriptors_waits_instead_of_latching() {
    let disk = SimDisk::new(15, SimFaults::default());
    run_local(None, async move {
        let wal = Wal::open(disk.clone(), "wal", small_config(true))
            .await
            .unwrap();
        let payload = |id: u64| payload_for(id, 1000);
        let mut id = 0u64;
        // Past the first (growing) segment, onto prepared ones.
        while wal.stats().early_rolls == 0 {
            wal.append(&record(&payload(id), None)).await.unwrap();
            id += 1;
        }
        wait_until(|| disk_names_contain(&disk, "next-segment.prep")).await;
        let rolls = wal.stats().rolls;
        disk.fail_next_rename_of_with("wal/next-segment.prep", EMFILE);
        disk.fail_next_opens_with(3, EMFILE);
        while wal.stats().rolls == rolls {
            let appended = wal.append(&record(&payload(id), None)).await;
            assert!(appended.is_ok(), "record {id}: {appended:?}");
            id += 1;
        }
        assert!(!wal.is_latched());
        assert!(!disk.rename_fault_armed(), "the rename was tried");
        for _ in 0..20 {
            wal.append(&record(&payload(id), None)).await.unwrap();
            id += 1;
        }
        // Not a shortage: the roll fails and the WAL latches, as before.
        wait_until(|| disk_names_contain(&disk, "next-segment.prep")).await;
        disk.fail_next_rename_of("wal/next-segment.prep");
        let refused = loop {
            match wal.append(&record(&payload(id), None)).await {
                Ok(_) => id += 1,
                Err(e) => break e,
            }
        };
        assert!(wal.is_latched(), "{refused}");
        wal.close().await;
        let wal = Wal::open(disk.clone(), "wal", small_config(true))
            .await
            .unwrap();
        let ids: Vec<u64> = read_all(&wal, Seq(0))
            .await
            .into_iter()
            .map(|r| r.1)
            .collect();
        assert!(
            ids.len() as u64 >= id && ids.iter().take(id as usize).copied().eq(0..id),
            "{} records read back, {id} acknowledged",
            ids.len()
        );
        wal.close().await;
    });
}
