//! Opening a partition log. The tail hint a clean close leaves: the next open
//! reads a few blocks, not the whole active segment, and comes back with the same
//! log; a hint that no longer holds (commits after it, a failure before the close,
//! damage) is never taken. Full scans, which hold a whole segment in memory, run
//! at most a gate's worth at once.

use futures_lite::future::block_on;
use narad_io::dma::DmaStorage;
use narad_io::sim::{SimDisk, SimFaults};
use narad_shards::ids::Offset;
use narad_shards::log::{LogConfig, LogStats, PartitionLog, ReadItem, RecordRef, ScanGate};

const DIR: &str = "topics/t/p00000";
const HINT: &str = "topics/t/p00000/tail.hint";
const PAYLOAD_BYTES: usize = 3000;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes_max: 8 << 20,
        prep_chunk_bytes: 256 << 10,
        index_interval_bytes: 16 << 10,
        segment_ms: 60_000,
        ..LogConfig::default()
    }
}

fn payload(i: u64) -> Vec<u8> {
    vec![(i % 251) as u8; PAYLOAD_BYTES]
}

async fn commit_n<S: narad_io::Storage>(log: &mut PartitionLog<S>, n: u64, now_ms: u64) {
    for _ in 0..n {
        let i = log.high_watermark().0;
        let p = payload(i);
        let records = [RecordRef {
            key: None,
            payload: &p,
            mask: 0,
        }];
        log.commit_durable(&records, now_ms).await.expect("commit");
    }
}

/// Reads every record and checks each payload; returns how many there are.
async fn read_all(log: &mut PartitionLog<SimDisk>) -> u64 {
    let mut at = Offset(0);
    while at < log.high_watermark() {
        let batch = log.read(at, 100, 1 << 20).await.expect("read");
        for item in batch.items {
            let ReadItem::Record(record) = item else {
                panic!("corrupt item {item:?}")
            };
            assert_eq!(record.payload.as_ref(), payload(record.offset.0).as_slice());
        }
        at = batch.next_offset;
    }
    at.0
}

/// Opens the log and returns it with the bytes the open read from the disk.
async fn open_counting(disk: &SimDisk) -> (PartitionLog<SimDisk>, u64) {
    let before = disk.stats().bytes_read;
    let log = PartitionLog::open(disk.clone(), DIR, config())
        .await
        .expect("open");
    (log, disk.stats().bytes_read - before)
}

/// Everything about the log's shape but the cache.
fn shape(stats: LogStats) -> LogStats {
    LogStats {
        cache_bytes: 0,
        ..stats
    }
}

#[test]
fn a_clean_close_spares_the_next_open_the_scan() {
    block_on(async {
        let disk = SimDisk::new(11, SimFaults::default());
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        commit_n(&mut log, 1000, 5_000).await;
        let before = shape(log.stats());
        log.close().await.unwrap();
        disk.restart_process();

        let ops = disk.ops();
        let (mut log, read) = open_counting(&disk).await;
        assert_eq!(disk.ops(), ops, "the open wrote or synced nothing");
        assert!(
            read <= 64 << 10,
            "an open after a clean close read {read} bytes of a {} byte segment",
            before.size_bytes
        );
        assert_eq!(shape(log.stats()), before);
        assert_eq!(read_all(&mut log).await, 1000);
        // Closed after reads alone, it leaves the hint as it found it, with
        // no write, and the next open takes it again.
        let ops = disk.ops();
        log.close().await.unwrap();
        assert_eq!(disk.ops(), ops, "a close after reads alone writes nothing");
        let (mut log, read) = open_counting(&disk).await;
        assert!(read <= 64 << 10, "the hint served again: {read}");
        // The log goes on where it was: commits land after the old tail, and
        // the first commit time came back with the hint (the segment rolls by
        // age from it). The first commit retires the hint it was opened from.
        assert!(disk.contents(HINT).unwrap().iter().any(|&b| b != 0));
        commit_n(&mut log, 1, 6_000).await;
        assert!(
            disk.contents(HINT).unwrap().iter().all(|&b| b == 0),
            "the first commit after a hinted open zeroes the hint"
        );
        commit_n(&mut log, 9, 6_000).await;
        assert!(
            log.maybe_roll(5_000 + 60_000).await.unwrap(),
            "rolls by age"
        );
        commit_n(&mut log, 10, 65_001).await;
        assert_eq!(read_all(&mut log).await, 1020);
        drop(log);
        disk.crash();
        disk.reboot();
        let (mut log, _) = open_counting(&disk).await;
        assert_eq!(read_all(&mut log).await, 1020);
    });
}

/// An active segment written with a larger segment size than the one
/// configured now is not taken for a torn one: the open is refused and the
/// file left as it was, and the sizes it was written with open it whole.
#[test]
fn a_segment_longer_than_the_configuration_allows_is_refused_not_cut() {
    block_on(async {
        let disk = SimDisk::new(17, SimFaults::default());
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        commit_n(&mut log, 100, 5_000).await;
        drop(log);
        // No clean close: the next open scans the segment.
        disk.crash();
        disk.reboot();
        let segment = |disk: &SimDisk| {
            let names = block_on(narad_io::Storage::list(disk, DIR)).unwrap();
            let name = names.into_iter().find(|n| n.ends_with(".log")).unwrap();
            disk.contents(&format!("{DIR}/{name}")).unwrap()
        };
        let before = segment(&disk);
        let smaller = LogConfig {
            segment_bytes_max: 64 << 10,
            commit_bytes_max: 64 << 10,
            prep_chunk_bytes: 0,
            ..config()
        };
        let refused = PartitionLog::open(disk.clone(), DIR, smaller).await;
        let error = refused.err().expect("the open is refused").to_string();
        assert!(error.contains("past the"), "{error}");
        assert_eq!(
            segment(&disk),
            before,
            "the refused open changed the segment"
        );
        let (mut log, _) = open_counting(&disk).await;
        assert_eq!(read_all(&mut log).await, 100);
    });
}

#[test]
fn a_bad_read_of_the_last_block_sends_the_open_to_the_scan() {
    block_on(async {
        let disk = SimDisk::new(14, SimFaults::default());
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        // Small records, so the last block holds earlier frames before the
        // last one: bytes the hint's check does not verify.
        let small = |log: &PartitionLog<SimDisk>| payload(log.high_watermark().0)[..90].to_vec();
        loop {
            let p = small(&log);
            let records = [RecordRef {
                key: None,
                payload: &p,
                mask: 0,
            }];
            log.commit_durable(&records, 5_000).await.unwrap();
            let in_block = log.stats().size_bytes % 4096;
            if log.high_watermark().0 > 100 && (1000..3000).contains(&in_block) {
                break;
            }
        }
        let end = log.stats().size_bytes;
        let hwm = log.high_watermark();
        log.close().await.unwrap();
        disk.restart_process();
        // The check's read of the last block returns an earlier frame's byte
        // flipped; the appender's reads of that block do not.
        let segment = format!("{DIR}/{:020}.log", 0);
        disk.flip_next_read_at(&segment, end / 4096 * 4096 + 20, 2);
        let (mut log, read) = open_counting(&disk).await;
        assert!(read > end, "scanned after the reads disagreed: {read}");
        assert_eq!(log.high_watermark(), hwm);
        let p = small(&log);
        let records = [RecordRef {
            key: None,
            payload: &p,
            mask: 0,
        }];
        log.commit_durable(&records, 6_000)
            .await
            .expect("a commit after the open");
    });
}

#[test]
fn commits_after_the_hint_are_found_after_a_crash() {
    block_on(async {
        let disk = SimDisk::new(12, SimFaults::default());
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        commit_n(&mut log, 500, 5_000).await;
        log.close().await.unwrap();
        // Reopened from the hint, committed to, and killed: the hint left by
        // the close still names the old tail (a kill keeps its unsynced bytes).
        let (mut log, _) = open_counting(&disk).await;
        commit_n(&mut log, 7, 6_000).await;
        drop(log);
        disk.restart_process();
        assert!(disk.contents(HINT).is_some());
        let (mut log, read) = open_counting(&disk).await;
        assert!(
            read > 500 * PAYLOAD_BYTES as u64,
            "a stale hint means a scan"
        );
        assert_eq!(log.high_watermark(), Offset(507));
        assert_eq!(read_all(&mut log).await, 507);
    });
}

#[test]
fn no_hint_is_trusted_after_a_failure_or_damage() {
    block_on(async {
        let disk = SimDisk::new(13, SimFaults::default());
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        commit_n(&mut log, 300, 5_000).await;
        log.close().await.unwrap();
        assert!(disk.contents(HINT).is_some(), "a clean close writes a hint");

        // A failed commit since the open: the close writes no hint (the one
        // the open took was retired by the commit before), so the next open
        // scans.
        let (mut log, _) = open_counting(&disk).await;
        commit_n(&mut log, 1, 6_000).await;
        disk.fail_next_syncs(1);
        let p = payload(301);
        let records = [RecordRef {
            key: None,
            payload: &p,
            mask: 0,
        }];
        assert!(log.commit_durable(&records, 6_000).await.is_err());
        log.close().await.unwrap();
        assert!(
            disk.contents(HINT).unwrap().iter().all(|&b| b == 0),
            "no new hint"
        );
        disk.restart_process();
        let (mut log, read) = open_counting(&disk).await;
        assert!(read > 300 * PAYLOAD_BYTES as u64, "scanned: {read}");
        let recovered = read_all(&mut log).await;
        assert!(recovered == 301 || recovered == 302, "{recovered}");
        log.close().await.unwrap();

        // A hint damaged on the disk is refused; the scan finds the same log.
        disk.rot(HINT, 40, 3);
        disk.restart_process();
        let (mut log, read) = open_counting(&disk).await;
        assert!(read > 300 * PAYLOAD_BYTES as u64, "scanned: {read}");
        assert_eq!(read_all(&mut log).await, recovered);
    });
}

/// Opens `partitions` logs that each need a full scan, all at once, through a
/// gate letting `at_once` scans run together; returns the most that did, and
/// checks every log came back whole.
fn concurrent_scans(partitions: u64, at_once: usize) -> usize {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let root = dir.path().to_path_buf();
    narad_io::rt::run_local(None, async move {
        let storage = DmaStorage::new(root);
        let path = |p: u64| format!("topics/t/p{p:05}");
        for p in 0..partitions {
            let mut log = PartitionLog::open(storage.clone(), &path(p), config())
                .await
                .unwrap();
            commit_n(&mut log, 400, 5_000).await;
            // Dropped, not closed: no hint, as after a crash.
            drop(log);
        }
        let gate = ScanGate::new(at_once);
        let cfg = LogConfig {
            scan_gate: Some(gate.clone()),
            ..config()
        };
        let opens: Vec<_> = (0..partitions)
            .map(|p| {
                let (storage, cfg, dir) = (storage.clone(), cfg.clone(), path(p));
                narad_io::rt::spawn_local(async move {
                    let log = PartitionLog::open(storage, &dir, cfg).await.unwrap();
                    let hwm = log.high_watermark();
                    log.close().await.unwrap();
                    hwm
                })
            })
            .collect();
        for open in opens {
            assert_eq!(open.await, Some(Offset(400)));
        }
        gate.most_at_once()
    })
}

#[test]
fn full_scans_run_a_gate_at_a_time() {
    // Unbounded, the opens do overlap (so the bound below is not a given) ...
    assert!(concurrent_scans(6, 64) >= 3, "the opens ran one by one");
    // ... and the gate holds them to its bound.
    assert_eq!(concurrent_scans(6, 2), 2);
}
