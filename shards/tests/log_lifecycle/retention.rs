//! Time-based roll and retention by age, also over damaged segments, lost
//! indexes and failed directory syncs.

use futures_lite::future::block_on;
use narad_io::sim::{SimDisk, SimFaults};
use narad_io::Storage;
use narad_shards::ids::Offset;
use narad_shards::log::{LogError, PartitionLog};

use crate::*;

#[test]
fn time_based_roll_and_retention_by_age() {
    block_on(async {
        let (disk, mut log) = fresh_log(13, DIR, config()).await;
        assert_eq!(log.stats().oldest_segment_ms, None, "no record, no time");
        commit(&mut log, 3, 0).await;
        commit(&mut log, 3, 500).await;
        assert_eq!(log.stats().oldest_segment_ms, Some(500));
        assert!(
            !log.maybe_roll(999).await.unwrap(),
            "the segment is 999 ms old"
        );
        assert!(
            log.maybe_roll(1000).await.unwrap(),
            "a slow topic seals by age"
        );
        assert!(
            !log.maybe_roll(1001).await.unwrap(),
            "an empty segment does not roll"
        );
        commit(&mut log, 4, 2000).await;
        assert!(log.maybe_roll(3000).await.unwrap());
        commit(&mut log, 2, 3500).await;
        let stats = log.stats();
        assert_eq!(
            (stats.segment_count, stats.oldest_offset, stats.next_offset),
            (3, Offset(0), Offset(12))
        );
        // What retention judges the oldest segment by.
        assert_eq!(stats.oldest_segment_ms, Some(500));
        let names = disk.list(DIR).await.unwrap();
        assert!(
            names.contains(&format!("{:020}.log", 6))
                && names.contains(&format!("{:020}.index", 6)),
            "{names:?}"
        );
        // Newest record of segment 0 was committed at 500.
        assert_eq!(
            log.enforce_retention(5499).await.unwrap().segments_deleted,
            0
        );
        let outcome = log.enforce_retention(5500).await.unwrap();
        assert_eq!(outcome.segments_deleted, 1);
        assert_eq!(log.oldest_offset(), Offset(6));
        assert_eq!(log.stats().oldest_segment_ms, Some(2000));
        let cached_start = log.shared_cache().borrow().start();
        assert!(
            cached_start.is_none_or(|start| start >= Offset(6)),
            "the cache serves nothing retention deleted: {cached_start:?}"
        );
        let aged = log.read(Offset(5), 10, 1 << 20).await;
        assert!(
            matches!(
                aged,
                Err(LogError::AgedOut {
                    requested: Offset(5),
                    oldest: Offset(6)
                })
            ),
            "{aged:?}"
        );
        assert_records(&read_all(&mut log, 6).await, 6..12);
        // The active segment is never deleted, however old.
        assert_eq!(
            log.enforce_retention(1_000_000)
                .await
                .unwrap()
                .segments_deleted,
            1
        );
        assert_eq!(log.stats().segment_count, 1);
        assert_records(&read_all(&mut log, 10).await, 10..12);
        log.close().await.unwrap();
        reopen_after_retention(&disk).await;
    });
}

#[test]
fn a_segment_rolled_after_a_reopen_keeps_its_commit_time_for_retention() {
    block_on(async {
        let (disk, mut log) = fresh_log(14, DIR, config()).await;
        commit(&mut log, 3, 100).await;
        commit(&mut log, 3, 900).await;
        log.close().await.unwrap();
        // Reopened (a restart, or the cold walk after idle eviction), then rolled
        // by age before any commit: the sealed segment's newest record is from 900.
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        assert!(log.maybe_roll(1100).await.unwrap());
        assert_eq!(
            log.enforce_retention(5899).await.unwrap().segments_deleted,
            0,
            "deleted before its retention ran out"
        );
        assert_eq!(log.oldest_offset(), Offset(0));
        assert_records(&read_all(&mut log, 0).await, 0..6);
        assert_eq!(
            log.enforce_retention(5900).await.unwrap().segments_deleted,
            1
        );
        log.close().await.unwrap();
    });
}

/// After retention emptied the sealed segments: the oldest offset, the high
/// watermark and the newest commit time all survive a reopen.
async fn reopen_after_retention(disk: &SimDisk) {
    let mut log = PartitionLog::open(disk.clone(), DIR, config())
        .await
        .unwrap();
    assert_eq!(
        (log.oldest_offset(), log.high_watermark()),
        (Offset(10), Offset(12))
    );
    // Commit times stay monotonic across the reopen even with a clock behind.
    commit(&mut log, 1, 100).await;
    let last = log.read(Offset(12), 1, 1 << 20).await.unwrap();
    let ReadItem::Record(r) = &last.items[0] else {
        panic!()
    };
    assert_eq!(r.commit_time_ms, 3500);
    let files = disk.list(DIR).await.unwrap();
    assert_eq!(
        files.iter().filter(|n| *n != "tail.hint").count(),
        1,
        "no stray index files: {files:?}"
    );
}

#[test]
fn an_empty_log_advanced_starts_at_the_floor_and_retention_drops_the_gap() {
    block_on(async {
        let (disk, mut log) = fresh_log(31, DIR, config()).await;
        assert!(log.advance_to(Offset(7)).await.unwrap());
        disk.crash();
        disk.reboot();
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        assert_eq!(log.high_watermark(), Offset(7));
        assert_eq!(commit(&mut log, 1, 1_000).await, Offset(7)..Offset(8));
        let items = read_all(&mut log, 0).await;
        assert_eq!(items[0], ReadItem::Corrupt(Offset(0)..Offset(7)));
        assert_records(&items[1..], 7..8);
        // The gap's empty segment holds no record: the first retention run
        // deletes it.
        let outcome = log.enforce_retention(10_000).await.unwrap();
        assert_eq!(outcome.segments_deleted, 1);
        assert_eq!(log.oldest_offset(), Offset(7));
        log.close().await.unwrap();
    });
}

/// A log with three segments: `0..3` committed at 0 and 500, `3..7` at 2000,
/// and the active `7..9` at 3500; reopened, so no index is held in memory.
async fn three_segments(disk: &SimDisk) -> PartitionLog<SimDisk> {
    let mut log = PartitionLog::open(disk.clone(), DIR, config())
        .await
        .unwrap();
    commit(&mut log, 2, 0).await;
    commit(&mut log, 1, 500).await;
    assert!(log.maybe_roll(1000).await.unwrap());
    commit(&mut log, 4, 2000).await;
    assert!(log.maybe_roll(3000).await.unwrap());
    commit(&mut log, 2, 3500).await;
    log.close().await.unwrap();
    PartitionLog::open(disk.clone(), DIR, config())
        .await
        .unwrap()
}

#[test]
fn an_unreadable_index_is_rebuilt_and_retention_goes_on() {
    block_on(async {
        let disk = SimDisk::new(37, SimFaults::default());
        let mut log = three_segments(&disk).await;
        disk.set_unreadable(&format!("{DIR}/{:020}.index", 0), true);
        let outcome = log.enforce_retention(5500).await.unwrap();
        assert_eq!(outcome.segments_deleted, 1);
        assert_eq!(log.oldest_offset(), Offset(3));
        log.close().await.unwrap();
    });
}

#[test]
fn an_unreadable_oldest_segment_is_judged_by_the_records_after_it() {
    block_on(async {
        let disk = SimDisk::new(41, SimFaults::default());
        let mut log = three_segments(&disk).await;
        disk.set_unreadable(&format!("{DIR}/{:020}.index", 0), true);
        disk.set_unreadable(&segment_path(0), true);
        // Its own records aged out at 5500, but nothing can show it: the next
        // segment's newest (2000) bounds them, so it goes once that one ages.
        assert_eq!(
            log.enforce_retention(5500).await.unwrap().segments_deleted,
            0
        );
        let outcome = log.enforce_retention(7000).await.unwrap();
        assert_eq!(outcome.segments_deleted, 2);
        assert_eq!(log.oldest_offset(), Offset(7));
        assert_records(&read_all(&mut log, 7).await, 7..9);
        log.close().await.unwrap();
    });
}

#[test]
fn a_log_whose_last_sealed_segment_cannot_be_read_still_opens() {
    block_on(async {
        let (disk, mut log) = fresh_log(47, DIR, config()).await;
        commit(&mut log, 3, 1_000).await;
        assert!(log.maybe_roll(2_000).await.unwrap());
        log.close().await.unwrap();
        // The active segment is empty; the sealed one and its index fail reads.
        let index = format!("{DIR}/{:020}.index", 0);
        disk.set_unreadable(&index, true);
        disk.set_unreadable(&segment_path(0), true);
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .expect("the log opens");
        assert_eq!(log.high_watermark(), Offset(3));
        assert!(log.read(Offset(0), 3, 1 << 20).await.is_err());
        commit(&mut log, 2, 3_000).await;
        // The medium recovers: every record reads.
        disk.set_unreadable(&index, false);
        disk.set_unreadable(&segment_path(0), false);
        assert_records(&read_all(&mut log, 0).await, 0..5);
        log.close().await.unwrap();
    });
}

#[test]
fn a_gap_after_a_roll_takes_the_last_commit_time_for_retention() {
    block_on(async {
        let (disk, mut log) = fresh_log(43, DIR, config()).await;
        commit(&mut log, 3, 1_000).await;
        assert!(log.maybe_roll(2_000).await.unwrap());
        // The active segment is empty: the gap is a segment of no record.
        assert!(log.advance_to(Offset(10)).await.unwrap());
        commit(&mut log, 1, 3_000).await;
        log.close().await.unwrap();
        // The oldest segment cannot be read: the gap after it bounds its
        // records by the last commit before the gap, not by "never".
        disk.set_unreadable(&format!("{DIR}/{:020}.index", 0), true);
        disk.set_unreadable(&segment_path(0), true);
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        assert_eq!(
            log.enforce_retention(5_999).await.unwrap().segments_deleted,
            0
        );
        assert_eq!(
            log.enforce_retention(6_000).await.unwrap().segments_deleted,
            2
        );
        assert_eq!(log.oldest_offset(), Offset(10));
        log.close().await.unwrap();
    });
}

/// Retention deletes its segments in one batch with one directory sync. A
/// sync that fails leaves them out of the log all the same (they are gone
/// from the directory): a read below the new oldest offset is aged out, not a
/// failed open of a missing file, and the run still reports the failure.
#[test]
fn a_failed_directory_sync_after_retention_leaves_the_segments_deleted() {
    block_on(async {
        let disk = SimDisk::new(43, SimFaults::default());
        let mut log = three_segments(&disk).await;
        disk.fail_next_dir_sync_of(DIR);
        assert!(log.enforce_retention(1_000_000).await.is_err());
        assert_eq!(log.oldest_offset(), Offset(7));
        let aged = log.read(Offset(0), 10, 1 << 20).await;
        assert!(
            matches!(
                aged,
                Err(LogError::AgedOut {
                    oldest: Offset(7),
                    ..
                })
            ),
            "{aged:?}"
        );
        let names = disk.list(DIR).await.unwrap();
        assert!(
            !names
                .iter()
                .any(|n| n.starts_with(&format!("{:020}", 0))
                    || n.starts_with(&format!("{:020}", 3))),
            "segments and indexes are gone: {names:?}"
        );
        assert_records(&read_all(&mut log, 7).await, 7..9);
        let again = log.enforce_retention(1_000_000).await.unwrap();
        assert_eq!(again.segments_deleted, 0);
        log.close().await.unwrap();
    });
}

/// A sealed segment's index is rebuilt by a scan of the segment. A bad read of
/// its last frame must not leave the index with an older newest commit time
/// (retention would delete records still inside it), neither in memory nor in
/// the index file the rebuild writes.
#[test]
fn a_bad_read_while_rebuilding_an_index_does_not_age_a_segment_early() {
    block_on(async {
        let (disk, mut log) = fresh_log(53, DIR, config()).await;
        commit(&mut log, 2, 100).await;
        commit(&mut log, 1, 500).await;
        let last_frame_end = log.stats().size_bytes;
        assert!(log.maybe_roll(1200).await.unwrap());
        commit(&mut log, 4, 2000).await;
        log.close().await.unwrap();
        disk.remove(&format!("{DIR}/{:020}.index", 0))
            .await
            .unwrap();
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        // The rebuild's read is bad inside the frame committed at 500.
        disk.flip_next_read_at(&segment_path(0), last_frame_end - 8, 2);
        // At 5400 the commit at 100 is past the retention of 5000, the one at
        // 500 is not.
        let outcome = log.enforce_retention(5_400).await.unwrap();
        assert_eq!(outcome.segments_deleted, 0);
        log.close().await.unwrap();
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        let outcome = log.enforce_retention(5_400).await.unwrap();
        assert_eq!(outcome.segments_deleted, 0, "the index file written");
        let outcome = log.enforce_retention(5_500).await.unwrap();
        assert_eq!(outcome.segments_deleted, 1);
        log.close().await.unwrap();
    });
}
