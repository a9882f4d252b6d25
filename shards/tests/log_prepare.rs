//! What the partition log's zeros ahead of its commits cost on disk: a segment
//! holding a few records takes a small multiple of them, not a whole chunk, and
//! one written fast soon prepares full chunks, so few commits change its size;
//! a log whose commits are large writes no zeros at all.

#[path = "log_common/mod.rs"]
mod log_common;

use futures_lite::future::block_on;
use narad_io::align_up;
use narad_io::sim::{SimDisk, SimFaults};
use narad_shards::log::{LogConfig, PartitionLog, RecordRef, PREP_COMMIT_BYTES_MAX};

use log_common::{assert_holds, commit_n, fresh_log, DIR};

const CHUNK: u64 = 1 << 20;

async fn commit(log: &mut PartitionLog<SimDisk>, payload: &[u8], now_ms: u64) {
    let records = [RecordRef {
        key: None,
        payload,
        mask: 0,
    }];
    log.commit_durable(&records, now_ms).await.expect("commit");
}

#[test]
fn a_quiet_partition_takes_little_disk_and_a_busy_one_prepares_full_chunks() {
    block_on(async {
        let config = LogConfig {
            segment_bytes_max: 64 << 20,
            prep_chunk_bytes: CHUNK,
            ..LogConfig::default()
        };
        let (disk, mut log) = fresh_log(3, DIR, config).await;
        let path = format!("{DIR}/{:020}.log", 0);
        for i in 0..3 {
            commit(&mut log, b"a small record", i).await;
        }
        let file_bytes = disk.contents(&path).unwrap().len() as u64;
        assert!(
            file_bytes <= CHUNK / 8,
            "three small records take {file_bytes} bytes on disk"
        );
        let payload = vec![7u8; 4000];
        let mut size_changes = 0;
        let mut last = file_bytes;
        for i in 0..1000 {
            commit(&mut log, &payload, 10 + i).await;
            let now = disk.contents(&path).unwrap().len() as u64;
            let data = log.stats().size_bytes;
            assert!(now >= data && now <= data + 2 * CHUNK, "{now} for {data}");
            size_changes += usize::from(now != last);
            last = now;
        }
        // About 4 MB written: the chunks double from 64 KiB to 1 MiB within
        // the first MiB, then take a MiB at a time.
        assert!(
            size_changes <= 12,
            "{size_changes} of 1,000 commits changed the file's size"
        );
    });
}

/// Commits of about 540 KiB grow the file themselves once the recent average
/// passes the bound: no zeros past their data. Small commits after them make
/// zeros pay again, written from the end of the data on: the records the large
/// commits left are all there after a reopen, read from the device.
#[test]
fn large_commits_write_no_zeros_and_small_ones_after_them_prepare_past_the_data() {
    block_on(async {
        let disk = SimDisk::new(5, SimFaults::default());
        let config = LogConfig {
            segment_bytes_max: 64 << 20,
            prep_chunk_bytes: CHUNK,
            commit_bytes_max: 1 << 20,
            ..LogConfig::default()
        };
        assert_eq!(config.prep_commit_bytes_max, PREP_COMMIT_BYTES_MAX);
        let path = format!("{DIR}/{:020}.log", 0);
        let mut log = PartitionLog::open(disk.clone(), DIR, config.clone())
            .await
            .unwrap();
        let file_len = || disk.contents(&path).unwrap().len() as u64;
        let mut n = 0;
        for i in 0..16 {
            commit_n(&mut log, n, 2_000, i).await.unwrap();
            n += 2_000;
        }
        let data = log.stats().size_bytes;
        assert!(data > 3 * CHUNK, "{data} bytes of large commits");
        assert_eq!(file_len(), align_up(data), "large commits grow the file");
        // The average halves about every five commits.
        const _: () = assert!(PREP_COMMIT_BYTES_MAX < 540 << 10);
        let mut zeros_ahead = false;
        for i in 0..40 {
            commit_n(&mut log, n, 2, 100 + i).await.unwrap();
            n += 2;
            zeros_ahead |= file_len() > align_up(log.stats().size_bytes);
        }
        assert!(zeros_ahead, "small commits prepare zeros again");
        log.close().await.unwrap();
        let mut log = PartitionLog::open(disk.clone(), DIR, config).await.unwrap();
        assert_holds(&mut log, n).await;
    });
}
