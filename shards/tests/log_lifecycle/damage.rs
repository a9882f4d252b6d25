//! Bit rot, failed rolls, index rebuilds, the recent-frame cache, preparation
//! and gaps.

use futures_lite::future::block_on;
use narad_io::sim::SimDisk;
use narad_io::Storage;
use narad_shards::ids::Offset;
use narad_shards::log::{read_cached, PartitionLog, ReadRange};

use crate::*;

/// The names of the index files in the log's directory.
async fn index_files(disk: &SimDisk) -> Vec<String> {
    let names = disk.list(DIR).await.unwrap().into_iter();
    names.filter(|f| f.ends_with(".index")).collect()
}

#[test]
fn rot_in_the_active_segment_keeps_later_commits_and_reports_the_gap() {
    block_on(async {
        let (disk, mut log) = fresh_log(11, DIR, config()).await;
        commit(&mut log, 5, 10).await;
        let rotten_at = log.stats().size_bytes;
        let rotten = commit(&mut log, 4, 20).await;
        commit(&mut log, 6, 30).await;
        commit(&mut log, 3, 40).await;
        log.close().await.unwrap();
        // Synced bytes of the second commit rot on the platter.
        disk.rot(&segment_path(0), rotten_at as usize + 40, 3);
        for round in 0..2 {
            // The first open takes the tail from the hint the clean close left,
            // so only the reads below meet the rot; the second one has no hint
            // (as after a crash) and its scan finds the gap.
            if round == 1 {
                disk.remove(&format!("{DIR}/tail.hint")).await.unwrap();
            }
            let mut log = PartitionLog::open(disk.clone(), DIR, config())
                .await
                .unwrap();
            let found_at_open: &[_] = if round == 0 {
                &[]
            } else {
                std::slice::from_ref(&rotten)
            };
            assert_eq!(log.corrupt_gaps(), found_at_open, "round {round}");
            assert!(log.high_watermark() >= Offset(18), "later commits kept");
            let items = read_all(&mut log, 0).await;
            assert_records(&items[..5], 0..5);
            assert_eq!(items[5], ReadItem::Corrupt(rotten.clone()));
            assert_records(&items[6..], 9..log.high_watermark().0);
            // Reads starting inside the gap report it too.
            let inside = log.read(Offset(7), 10, 1 << 20).await.unwrap();
            assert_eq!(inside.items[0], ReadItem::Corrupt(Offset(7)..Offset(9)));
            // The log goes on; the second round checks the gap survives reopening.
            commit(&mut log, 2, 50 + round).await;
            log.close().await.unwrap();
        }
    });
}

#[test]
fn rot_in_a_sealed_segment_is_reported_by_reads_and_skipped() {
    block_on(async {
        let cfg = LogConfig {
            cache_bytes_max: 0,
            segment_bytes_max: 8 * 1024,
            ..config()
        };
        let (disk, mut log) = fresh_log(12, DIR, cfg.clone()).await;
        for i in 0..40 {
            commit(&mut log, 20, i).await;
        }
        assert!(log.stats().segment_count >= 3);
        log.close().await.unwrap();
        let sealed = disk.contents(&segment_path(0)).unwrap();
        disk.rot(&segment_path(0), sealed.len() / 2, 0);
        let mut log = PartitionLog::open(disk.clone(), DIR, cfg).await.unwrap();
        let items = read_all(&mut log, 0).await;
        let corrupt: Vec<_> = items
            .iter()
            .filter_map(|i| match i {
                ReadItem::Corrupt(r) => Some(r.clone()),
                ReadItem::Record(_) => None,
            })
            .collect();
        assert_eq!(corrupt.len(), 1, "one frame rotted: {corrupt:?}");
        let lost = corrupt[0].end.0 - corrupt[0].start.0;
        assert!(
            lost > 0 && lost <= 20,
            "at most one frame's records: {lost}"
        );
        let records = items
            .iter()
            .filter(|i| matches!(i, ReadItem::Record(_)))
            .count() as u64;
        assert_eq!(records + lost, 800, "everything else is readable");
    });
}

#[test]
fn a_roll_that_fails_to_create_its_segment_leaves_no_file_to_hide_later_commits() {
    // Seeds, for the power loss below: each unsynced sector survives it or not.
    for seed in 0..64 {
        a_roll_that_fails_to_create_its_segment(seed);
    }
}

fn a_roll_that_fails_to_create_its_segment(seed: u64) {
    block_on(async {
        let (disk, mut log) = fresh_log(seed, DIR, config()).await;
        commit(&mut log, 3, 100).await;
        // The reaper's roll at a short retention: the new file is created, then
        // its creation fails.
        disk.fail_next_create_of(&segment_path(3));
        assert!(log.maybe_roll_at_age(200, 50).await.is_err());
        // Commits go on into the current segment, past the failed roll's base,
        // and are durable: the trim cut the file, so the first of them grows
        // it again (a write and a sync, not one `O_DSYNC` write) and survives
        // a power loss.
        commit(&mut log, 4, 300).await;
        assert_eq!(log.high_watermark(), Offset(7));
        drop(log);
        disk.crash();
        disk.reboot();
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        assert_eq!(
            (log.oldest_offset(), log.high_watermark()),
            (Offset(0), Offset(7)),
            "seed {seed}"
        );
        assert_records(&read_all(&mut log, 0).await, 0..7);
        log.close().await.unwrap();
    });
}

#[test]
fn a_failed_roll_that_cannot_remove_its_new_segment_poisons_the_log() {
    block_on(async {
        let (disk, mut log) = fresh_log(16, DIR, config()).await;
        commit(&mut log, 3, 100).await;
        // The new segment is created, its creation fails, and so does its removal:
        // it would open as the active segment, above any record committed to the
        // current one. So nothing more is committed until the log is reopened.
        disk.fail_next_create_of(&segment_path(3));
        disk.fail_next_remove_of(&segment_path(3));
        assert!(log.maybe_roll_at_age(200, 50).await.is_err());
        let after = RecordRef {
            key: None,
            payload: b"after the failed roll",
            mask: 0,
        };
        assert!(log.commit_durable(&[after], 300).await.is_err());
        assert_eq!(log.high_watermark(), Offset(3));
        drop(log);
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        assert_eq!(log.high_watermark(), Offset(3));
        commit(&mut log, 4, 400).await;
        log.close().await.unwrap();
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        assert_eq!(
            (log.oldest_offset(), log.high_watermark()),
            (Offset(0), Offset(7))
        );
        assert_records(&read_all(&mut log, 0).await, 0..7);
        log.close().await.unwrap();
    });
}

#[test]
fn a_missing_or_corrupt_index_is_rebuilt_and_reads_stay_bounded() {
    block_on(async {
        let cfg = LogConfig {
            segment_bytes_max: 1024 * 1024,
            cache_bytes_max: 0,
            ..config()
        };
        let (disk, mut log) = fresh_log(14, DIR, cfg.clone()).await;
        let mut n = 0;
        while log.stats().segment_count < 3 {
            n = commit(&mut log, 50, 7).await.end.0;
        }
        log.close().await.unwrap();
        let indexes = index_files(&disk).await;
        assert_eq!(indexes.len(), 2);
        disk.remove(&format!("{DIR}/{}", indexes[0])).await.unwrap();
        disk.rot(&format!("{DIR}/{}", indexes[1]), 50, 1);
        let mut log = PartitionLog::open(disk.clone(), DIR, cfg.clone())
            .await
            .unwrap();
        assert_records(&read_all(&mut log, 0).await, 0..n);
        let rebuilt = index_files(&disk).await;
        assert_eq!(rebuilt, indexes, "rebuilt indexes are written back");
        drop(log);
        // With intact indexes, one record in the middle of a 1 MiB segment costs a
        // bounded read, not a scan of the segment.
        let mut log = PartitionLog::open(disk.clone(), DIR, cfg).await.unwrap();
        let sealed_bytes = disk.contents(&segment_path(0)).unwrap().len() as u64;
        let middle = log.stats().next_offset.0 / 6;
        let before = disk.stats().bytes_read;
        let one = log.read(Offset(middle), 1, 1).await.unwrap();
        assert_records(&one.items, middle..middle + 1);
        let read_bytes = disk.stats().bytes_read - before;
        assert!(
            read_bytes < sealed_bytes / 2,
            "read {read_bytes} of a {sealed_bytes}-byte segment"
        );
    });
}

#[test]
fn reads_right_behind_the_high_watermark_never_touch_the_disk() {
    block_on(async {
        let cfg = LogConfig {
            cache_bytes_max: 8 * 1024,
            ..config()
        };
        let (disk, mut log) = fresh_log(15, DIR, cfg).await;
        for i in 0..100 {
            let range = commit(&mut log, 3, i).await;
            let before = disk.stats().bytes_read;
            let batch = log.read(range.start, 10, 1 << 20).await.unwrap();
            assert_records(&batch.items, range.start.0..range.end.0);
            assert_eq!(
                disk.stats().bytes_read,
                before,
                "commit {i} read from the cache"
            );
        }
        assert!(log.stats().cache_bytes <= 8 * 1024);
        // The shared cache answers what it covers exactly as a read does, and
        // nothing at or past the high watermark.
        let cache = log.shared_cache();
        let start = cache.borrow().start().unwrap();
        assert_eq!(cache.borrow().end(), Some(log.high_watermark()));
        for from in start.0..log.high_watermark().0 + 2 {
            let cached =
                read_cached(&cache.borrow(), ReadRange::new(Offset(from), 4, 1 << 20)).unwrap();
            if from >= log.high_watermark().0 {
                assert!(cached.items.is_empty(), "{from}: {cached:?}");
                continue;
            }
            let read = log.read(Offset(from), 4, 1 << 20).await.unwrap();
            assert_eq!(cached, read, "from {from}");
        }
        assert!(read_cached(
            &cache.borrow(),
            ReadRange::new(Offset(start.0 - 1), 4, 1 << 20),
        )
        .is_none());
        // Old records fell out of the budget and come from the disk.
        let before = disk.stats().bytes_read;
        assert_records(&log.read(Offset(0), 3, 1 << 20).await.unwrap().items, 0..3);
        assert!(disk.stats().bytes_read > before);
    });
}

/// A consumer working through a backlog one record at a time: each window of
/// segment bytes is fetched once and each frame decoded once, not once per record.
#[test]
fn reading_a_backlog_one_record_at_a_time_reads_each_byte_about_once() {
    block_on(async {
        let cfg = LogConfig {
            cache_bytes_max: 0,
            ..config()
        };
        let (disk, mut log) = fresh_log(16, DIR, cfg).await;
        for i in 0..40 {
            commit(&mut log, 10, i).await;
        }
        let stored = log.stats().size_bytes;
        let before = disk.stats().bytes_read;
        for offset in 0..log.high_watermark().0 {
            let batch = log.read(Offset(offset), 1, 1 << 20).await.unwrap();
            assert_records(&batch.items, offset..offset + 1);
        }
        let read = disk.stats().bytes_read - before;
        assert!(
            read <= 3 * stored,
            "read {read} bytes for {stored} stored, one record at a time"
        );
    });
}

#[test]
fn preparation_keeps_file_growth_to_one_chunk_ahead() {
    block_on(async {
        let cfg = LogConfig {
            segment_bytes_max: 1024 * 1024,
            prep_chunk_bytes: 64 * 1024,
            ..config()
        };
        let (disk, mut log) = fresh_log(16, DIR, cfg).await;
        let path = segment_path(0);
        let mut size_changes = 0;
        let mut file_bytes = 0;
        for i in 0..300 {
            commit(&mut log, 2, i).await;
            let now = disk.contents(&path).unwrap().len();
            size_changes += usize::from(now != file_bytes);
            file_bytes = now;
            let data = log.stats().size_bytes as usize;
            assert!(
                file_bytes >= data && file_bytes <= data + 2 * 64 * 1024,
                "{file_bytes} for {data}"
            );
        }
        assert!(
            size_changes * 10 < 300,
            "most commits do not grow the file: {size_changes}"
        );
        // Sealing trims the zeros: sealed segments are exactly their frames.
        log.maybe_roll(1_000_000).await.unwrap();
        let sealed = disk.contents(&path).unwrap().len() as u64;
        assert_eq!(sealed, log.stats().size_bytes);
    });
}

#[test]
fn advancing_past_lost_offsets_leaves_a_gap_that_reads_report_and_reopens_keep() {
    block_on(async {
        let (disk, mut log) = fresh_log(29, DIR, config()).await;
        commit(&mut log, 5, 1_000).await;
        assert!(
            !log.advance_to(Offset(3)).await.unwrap(),
            "below: nothing to do"
        );
        assert!(log.advance_to(Offset(12)).await.unwrap());
        assert_eq!(log.high_watermark(), Offset(12));
        assert_eq!(commit(&mut log, 2, 2_000).await, Offset(12)..Offset(14));
        let check = |items: &[ReadItem]| {
            assert_records(&items[..5], 0..5);
            assert_eq!(items[5], ReadItem::Corrupt(Offset(5)..Offset(12)));
            assert_records(&items[6..], 12..14);
        };
        check(&read_all(&mut log, 0).await);
        log.close().await.unwrap();
        disk.crash();
        disk.reboot();
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        assert_eq!(log.high_watermark(), Offset(14));
        check(&read_all(&mut log, 0).await);
        log.close().await.unwrap();
    });
}
