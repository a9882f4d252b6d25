//! Partition log under device faults: read-back bit flips, failed fdatasync, ENOSPC;
//! and the plain commit/read round trip on the simulated and the real disk.
//! What an open recovers from damage is in `log_recovery.rs`.

use futures_lite::future::block_on;
use narad_io::dma::DmaStorage;
use narad_io::sim::{SimDisk, SimFaults};
use narad_shards::ids::Offset;
use narad_shards::log::{LogConfig, LogError, PartitionLog, ReadItem, Record, RecordRef};

#[path = "log_common/mod.rs"]
mod common;
use common::*;

#[test]
fn round_trip_on_the_simulated_disk_with_and_without_zstd() {
    for zstd_level in [None, Some(3)] {
        block_on(async {
            let cfg = LogConfig {
                zstd_level,
                segment_bytes_max: 32 * 1024,
                ..config()
            };
            let (disk, mut log) = fresh_log(1, DIR, cfg.clone()).await;
            let mut n = 0;
            for round in 0..30 {
                let size = 1 + round % 9 * 20;
                let range = commit_n(&mut log, n, size, 1000 + round).await.unwrap();
                assert_eq!(range, Offset(n)..Offset(n + size));
                n += size;
            }
            assert!(log.stats().segment_count > 1, "size rolls happened");
            assert_holds(&mut log, n).await;
            log.close().await.unwrap();
            let mut log = PartitionLog::open(disk, DIR, cfg).await.unwrap();
            assert_holds(&mut log, n).await;
        });
    }
}

#[test]
fn keys_commit_times_and_empty_keys_round_trip() {
    block_on(async {
        let (_, mut log) = fresh_log(2, DIR, config()).await;
        let records = [
            RecordRef {
                key: None,
                payload: b"a",
                mask: 0,
            },
            RecordRef {
                key: Some(b""),
                payload: b"",
                mask: 0,
            },
            RecordRef {
                key: Some(b"k"),
                payload: b"c",
                mask: 0,
            },
        ];
        log.commit_durable(&records, 5000).await.unwrap();
        // The clock went backwards: commit times must not.
        log.commit_durable(&records[..1], 4000).await.unwrap();
        let batch = log.read(Offset(0), 10, 1 << 20).await.unwrap();
        let records: Vec<Record> = batch
            .items
            .into_iter()
            .map(|item| match item {
                ReadItem::Record(r) => r,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(records[0].key, None, "keyless stays keyless");
        assert_eq!(
            records[1].key.as_deref(),
            Some(&b""[..]),
            "an empty key is still a key"
        );
        assert_eq!(records[2].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(
            records.iter().map(|r| r.commit_time_ms).collect::<Vec<_>>(),
            [5000, 5000, 5000, 5000]
        );
        assert_eq!(batch.next_offset, Offset(4));
    });
}

#[test]
fn round_trip_on_the_real_disk() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let root = dir.path().to_path_buf();
    narad_io::rt::run_local(None, async move {
        let storage = DmaStorage::new(root);
        let cfg = LogConfig {
            zstd_level: Some(1),
            ..config()
        };
        let mut log = PartitionLog::open(storage.clone(), DIR, cfg.clone())
            .await
            .unwrap();
        let mut n = 0;
        for round in 0..40 {
            let size = 1 + round % 5 * 30;
            commit_n(&mut log, n, size, round).await.unwrap();
            n += size;
        }
        assert_holds(&mut log, n).await;
        log.close().await.unwrap();
        let mut log = PartitionLog::open(storage, DIR, cfg).await.unwrap();
        assert_holds(&mut log, n).await;
        commit_n(&mut log, n, 10, 99).await.unwrap();
        assert_holds(&mut log, n + 10).await;
        log.close().await.unwrap();
    });
}

/// Guards the read-back: a bit flipped on the way back from the device must fail
/// the commit. With `--features broken-no-readback` this test fails.
#[test]
fn read_back_bit_flip_fails_the_commit_and_a_retry_succeeds() {
    block_on(async {
        let (disk, mut log) = fresh_log(3, DIR, config()).await;
        commit_n(&mut log, 0, 10, 1).await.unwrap();
        disk.flip_next_reads(1);
        let failed = commit_n(&mut log, 10, 20, 2).await;
        assert!(
            matches!(failed, Err(LogError::ReadBackMismatch { .. })),
            "{failed:?}"
        );
        assert_eq!(
            log.high_watermark(),
            Offset(10),
            "nothing above the high watermark"
        );
        assert_eq!(
            log.read(Offset(10), 10, 1 << 20).await.unwrap().items,
            vec![]
        );
        assert_eq!(
            commit_n(&mut log, 10, 20, 3).await.unwrap(),
            Offset(10)..Offset(30)
        );
        assert_holds(&mut log, 30).await;
        log.close().await.unwrap();
        let mut log = PartitionLog::open(disk, DIR, config()).await.unwrap();
        assert_holds(&mut log, 30).await;
    });
}

/// A commit whose write damaged the block it shares with the last acknowledged
/// commit (the device wrote a wrong bit there and the sync made it durable):
/// the read-back fails the commit, and the block is written again at once, so
/// a crash right after it loses nothing acknowledged.
#[test]
fn a_write_that_damages_the_last_commits_block_is_repaired_at_once() {
    block_on(async {
        let segment = format!("{DIR}/{:020}.log", 0);
        let (disk, mut log) = fresh_log(17, DIR, config()).await;
        commit_n(&mut log, 0, 3, 1).await.unwrap();
        let end = log.stats().size_bytes;
        assert!(end % 4096 != 0, "the commit ends inside a block");
        disk.flip_next_write_at(&segment, end - 10, 3);
        let failed = commit_n(&mut log, 3, 2, 2).await;
        assert!(
            matches!(failed, Err(LogError::ReadBackMismatch { .. })),
            "{failed:?}"
        );
        assert_eq!(log.high_watermark(), Offset(3));
        // Power fails: only what was synced survives.
        disk.crash();
        disk.reboot();
        drop(log);
        reopened_holds_and_goes_on(&disk, 3).await;
    });
}

#[test]
fn failed_fdatasync_poisons_the_log_until_reopen() {
    block_on(async {
        let (disk, mut log) = fresh_log(4, DIR, config()).await;
        commit_n(&mut log, 0, 25, 1).await.unwrap();
        disk.fail_next_syncs(1);
        let failed = commit_n(&mut log, 25, 5, 2).await;
        assert!(matches!(failed, Err(LogError::SyncFailed(_))), "{failed:?}");
        assert!(log.is_poisoned());
        assert_eq!(log.high_watermark(), Offset(25));
        // The device is healthy again, but the log must not trust its file.
        for attempt in 0..3 {
            let again = commit_n(&mut log, 25, 5, 3 + attempt).await;
            assert!(matches!(again, Err(LogError::Poisoned)), "{again:?}");
        }
        assert_holds(&mut log, 25).await;
        drop(log);
        let mut log = PartitionLog::open(disk, DIR, config()).await.unwrap();
        assert!(!log.is_poisoned());
        // The failed commit may or may not have reached the disk; it is whole if so.
        let hwm = log.high_watermark();
        assert!(hwm == Offset(25) || hwm == Offset(30), "{hwm:?}");
        assert_holds(&mut log, hwm.0).await;
        commit_n(&mut log, hwm.0, 5, 10).await.unwrap();
        assert_holds(&mut log, hwm.0 + 5).await;
    });
}

#[test]
fn enospc_fails_the_commit_and_keeps_earlier_data() {
    space_refusal_fails_the_commit_and_keeps_earlier_data(SimDisk::set_capacity);
}

/// A used-up disk quota (`EDQUOT`) is a refusal for space like a full disk:
/// the commit fails cleanly and the log is not poisoned, so the next commit
/// once there is room again succeeds without a reopen.
#[test]
fn a_full_quota_fails_the_commit_as_a_full_disk_does() {
    space_refusal_fails_the_commit_and_keeps_earlier_data(SimDisk::set_quota);
}

fn space_refusal_fails_the_commit_and_keeps_earlier_data(limit: fn(&SimDisk, Option<u64>)) {
    block_on(async {
        let cfg = LogConfig {
            prep_chunk_bytes: 0,
            ..config()
        };
        let (disk, mut log) = fresh_log(5, DIR, cfg.clone()).await;
        commit_n(&mut log, 0, 20, 1).await.unwrap();
        let size = log.stats().size_bytes;
        limit(&disk, Some(narad_io::align_up(size)));
        let failed = commit_n(&mut log, 20, 200, 2).await;
        assert!(matches!(failed, Err(LogError::Io { .. })), "{failed:?}");
        assert!(!log.is_poisoned());
        assert_eq!(log.high_watermark(), Offset(20));
        assert_eq!(
            log.read(Offset(20), 10, 1 << 20).await.unwrap().items,
            vec![]
        );
        assert_holds(&mut log, 20).await;
        limit(&disk, None);
        commit_n(&mut log, 20, 200, 3).await.unwrap();
        assert_holds(&mut log, 220).await;
        drop(log);
        let mut log = PartitionLog::open(disk, DIR, cfg).await.unwrap();
        assert_holds(&mut log, 220).await;
    });
}

/// A commit that grows its segment, whose write the disk fills in the middle
/// of (a short write: the blocks that fit are written), is not a clean
/// refusal: those frames lie on the device past the end the log goes back
/// to. The log is poisoned, and the reopen (the owner's, within a second)
/// zeros them.
#[test]
fn a_commit_refused_in_part_poisons_the_log_and_its_frames_are_zeroed() {
    block_on(async {
        let disk = SimDisk::new(8, SimFaults::default());
        disk.set_short_writes(true);
        let cfg = LogConfig {
            zstd_level: None,
            prep_chunk_bytes: 0,
            segment_bytes_max: 16 << 20,
            commit_bytes_max: 4 << 20,
            ..config()
        };
        let mut log = PartitionLog::open(disk.clone(), DIR, cfg.clone())
            .await
            .unwrap();
        commit_n(&mut log, 0, 20, 1).await.unwrap();
        let tail = log.stats().size_bytes;
        // Room for some of a commit of about 1 MB.
        disk.set_capacity(Some(narad_io::align_up(tail) + (384 << 10)));
        let failed = commit_n(&mut log, 20, 3_600, 2).await;
        assert!(matches!(failed, Err(LogError::SyncFailed(_))), "{failed:?}");
        assert!(log.is_poisoned());
        let file = format!("{DIR}/{:020}.log", 0);
        let written = disk.contents(&file).unwrap();
        assert!(
            written[tail as usize..].iter().any(|&b| b != 0),
            "what fitted was written"
        );
        disk.set_capacity(None);
        drop(log);
        let mut log = PartitionLog::open(disk.clone(), DIR, cfg).await.unwrap();
        assert_holds(&mut log, 20).await;
        // Past the block the tail ends in (which the next commit writes again
        // from memory), nothing of the failed commit is left.
        let reopened = disk.contents(&file).unwrap();
        assert!(
            reopened[narad_io::align_up(tail) as usize..]
                .iter()
                .all(|&b| b == 0),
            "the failed commit's frames are gone"
        );
        commit_n(&mut log, 20, 5, 3).await.unwrap();
        assert_holds(&mut log, 25).await;
    });
}

/// A commit that grows its segment and that the disk refuses whole is a
/// clean refusal: nothing of it reaches the device, the log is not poisoned,
/// and it commits once there is room.
#[test]
fn a_growing_commit_refused_whole_is_a_clean_failure() {
    block_on(async {
        let cfg = LogConfig {
            prep_chunk_bytes: 0,
            commit_bytes_max: 4 << 20,
            ..config()
        };
        let (disk, mut log) = fresh_log(10, DIR, cfg).await;
        commit_n(&mut log, 0, 20, 1).await.unwrap();
        let tail = log.stats().size_bytes;
        disk.set_capacity(Some(narad_io::align_up(tail) + (384 << 10)));
        let failed = commit_n(&mut log, 20, 3_600, 2).await;
        assert!(matches!(failed, Err(LogError::Io { .. })), "{failed:?}");
        assert!(!log.is_poisoned());
        let file = format!("{DIR}/{:020}.log", 0);
        let written = disk.contents(&file).unwrap();
        assert!(
            written.len() as u64 <= narad_io::align_up(tail),
            "{} bytes on the device for {tail} of data",
            written.len()
        );
        disk.set_capacity(None);
        commit_n(&mut log, 20, 3_600, 3).await.unwrap();
        assert_holds(&mut log, 3_620).await;
    });
}

#[test]
fn enospc_while_preparing_space_is_a_clean_failure() {
    block_on(async {
        let (disk, mut log) = fresh_log(6, DIR, config()).await;
        commit_n(&mut log, 0, 5, 1).await.unwrap();
        let prepared = disk
            .contents(&format!("{DIR}/{:020}.log", 0))
            .unwrap()
            .len() as u64;
        disk.set_capacity(Some(prepared));
        // Fills the prepared chunk, then needs another one.
        let mut n = 5;
        let failure = loop {
            match commit_n(&mut log, n, 50, 2).await {
                Ok(_) => n += 50,
                Err(e) => break e,
            }
            assert!(n < 100_000);
        };
        assert!(matches!(failure, LogError::Io { .. }), "{failure:?}");
        assert_holds(&mut log, n).await;
        disk.set_capacity(None);
        commit_n(&mut log, n, 50, 3).await.unwrap();
        assert_holds(&mut log, n + 50).await;
    });
}

/// A batch of several frames is one device write: inside zeros prepared
/// ahead of it, one durable (`O_DSYNC`) write; without them, where it grows
/// the file, a plain write and an fdatasync, which makes the new size durable
/// on every kernel.
#[test]
fn a_large_batch_is_several_frames_in_one_write() {
    for prepared in [true, false] {
        block_on(async {
            let cfg = if prepared {
                LogConfig {
                    prep_chunk_bytes: 1 << 20,
                    ..config()
                }
            } else {
                LogConfig {
                    prep_chunk_bytes: 0,
                    ..config()
                }
            };
            let (disk, mut log) = fresh_log(7, DIR, cfg).await;
            if prepared {
                // The first commit waits for the first zeros.
                commit_n(&mut log, 0, 1, 1).await.unwrap();
            }
            let from = u64::from(prepared);
            let before = disk.stats();
            commit_n(&mut log, from, 400, 1).await.unwrap();
            let after = disk.stats();
            let writes = after.writes - before.writes;
            let durable = after.durable_writes - before.durable_writes;
            let syncs = after.syncs - before.syncs;
            if prepared {
                assert_eq!((durable, syncs), (1, 0), "one durable write");
                assert!(
                    writes <= 2,
                    "{writes}: the commit and perhaps the next zeros"
                );
            } else {
                assert_eq!((writes, durable, syncs), (1, 0, 1), "a write and a sync");
            }
            assert!(log.stats().size_bytes > 8 * 1024 * 4, "several frames");
            assert_holds(&mut log, from + 400).await;
        });
    }
}

/// A commit that grows the file is one device write however large it is
/// (pieces that each extend the file would only queue behind each other in
/// the file system), then one fdatasync.
#[test]
fn a_commit_that_grows_the_file_is_one_write_however_large() {
    block_on(async {
        let cfg = LogConfig {
            prep_chunk_bytes: 0,
            ..config()
        };
        let (disk, mut log) = fresh_log(9, DIR, cfg).await;
        let before = disk.stats();
        commit_n(&mut log, 0, 3_000, 1).await.unwrap();
        let after = disk.stats();
        assert!(
            log.stats().size_bytes > 512 * 1024,
            "{} bytes: large enough for pieces",
            log.stats().size_bytes
        );
        let writes = after.writes - before.writes;
        let durable = after.durable_writes - before.durable_writes;
        let syncs = after.syncs - before.syncs;
        assert_eq!((writes, durable, syncs), (1, 0, 1), "one write and a sync");
        assert_holds(&mut log, 3_000).await;
    });
}

#[test]
fn oversized_batches_are_refused_before_any_write() {
    block_on(async {
        let cfg = LogConfig {
            commit_bytes_max: 4096,
            ..config()
        };
        let (disk, mut log) = fresh_log(8, DIR, cfg).await;
        let big = vec![0u8; 5000];
        let writes = disk.stats().writes;
        let refused = log
            .commit_durable(
                &[RecordRef {
                    key: None,
                    payload: &big,
                    mask: 0,
                }],
                1,
            )
            .await;
        assert!(
            matches!(refused, Err(LogError::InvalidBatch(_))),
            "{refused:?}"
        );
        let long_key = vec![1u8; 70 * 1024];
        let refused = log
            .commit_durable(
                &[RecordRef {
                    key: Some(&long_key),
                    payload: b"",
                    mask: 0,
                }],
                1,
            )
            .await;
        assert!(
            matches!(refused, Err(LogError::InvalidBatch(_))),
            "{refused:?}"
        );
        assert_eq!(disk.stats().writes, writes);
        assert_eq!(
            log.commit_durable(&[], 1).await.unwrap(),
            Offset(0)..Offset(0)
        );
    });
}

/// Reads from disk that jump around (a redelivery behind the frontier, a replay,
/// then on from where a scan stopped, or from inside the frame it stopped in)
/// return exactly the records asked for: a scan resumed where the previous one
/// stopped must never start at the wrong frame.
#[test]
fn scattered_reads_from_disk_return_the_records_asked_for() {
    use rand::{Rng, SeedableRng};
    for seed in 0..8u64 {
        block_on(async {
            // A cache of one frame: nearly every read goes to the segments.
            let cfg = LogConfig {
                cache_bytes_max: 8 * 1024,
                ..config()
            };
            let (_, mut log) = fresh_log(seed, DIR, cfg).await;
            let mut n = 0;
            for round in 0..60 {
                let size = 1 + round % 13 * 7;
                commit_n(&mut log, n, size, 1000 + round).await.unwrap();
                n += size;
            }
            assert!(
                log.stats().segment_count > 1,
                "seed {seed}: size rolls happened"
            );
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let mut at = 0u64;
            for step in 0..400 {
                if rng.random_bool(0.3) {
                    at = rng.random_range(0..n);
                }
                let max = rng.random_range(1..40);
                let batch = log.read(Offset(at), max, 64 * 1024).await.expect("read");
                assert!(
                    !batch.items.is_empty(),
                    "seed {seed} step {step}: read at {at}"
                );
                for (i, item) in batch.items.iter().enumerate() {
                    let want = at + i as u64;
                    let ReadItem::Record(record) = item else {
                        panic!("seed {seed} step {step}: offset {want} unreadable: {item:?}")
                    };
                    assert_eq!(record.offset, Offset(want), "seed {seed} step {step}");
                    assert_eq!(
                        record.payload.as_ref(),
                        payload(want, 100 + (want % 7) as usize * 50).as_slice(),
                        "seed {seed} step {step}: offset {want}"
                    );
                }
                at = batch.next_offset.0 % n;
            }
        });
    }
}

/// A committed frame that fails its check on one read is read again from the
/// device before its records count as corrupt: consumers skip what a read
/// reports corrupt for good, so one bad read must not cost them records.
#[test]
fn one_bad_read_of_a_committed_frame_does_not_make_its_records_corrupt() {
    block_on(async {
        let segment = format!("{DIR}/{:020}.log", 0);
        let (disk, mut log) = fresh_log(12, DIR, config()).await;
        let mut ends = Vec::new();
        for commit in 0..6u64 {
            commit_n(&mut log, commit * 5, 5, commit + 1).await.unwrap();
            ends.push(log.stats().size_bytes);
        }
        log.close().await.unwrap();
        for bad_reads in 1..=2 {
            // Reopened, so reads come from the device, not the recent-frame
            // cache; the open's own reads of the segment are done before the
            // flips.
            let mut log = PartitionLog::open(disk.clone(), DIR, config())
                .await
                .unwrap();
            let (from, to) = (ends[2], ends[3]);
            for _ in 0..bad_reads {
                disk.flip_next_read_at(&segment, from + (to - from) / 2, 3);
            }
            assert_holds(&mut log, 30).await;
            log.close().await.unwrap();
        }
    });
}
