//! Ingress WAL behaviour on both disks: round trips, group commit, rolls,
//! compaction and recycling, the checkpoint rules, the failure latch.

use std::time::Duration;

use crate::common::*;
use narad_io::dma::DmaStorage;
use narad_io::rt::run_local;
use narad_io::sim::{SimDisk, SimFaults};
use narad_io::Storage;
use narad_shards::ids::Seq;
use narad_shards::wal::checkpoint::CheckpointFile;
use narad_shards::wal::segment::segment_name;
use narad_shards::wal::{Wal, WalConfig, WalError};

async fn round_trip<S: Storage>(storage: S, prealloc: bool) {
    let wal = Wal::open(storage.clone(), "wal", small_config(prealloc))
        .await
        .unwrap();
    let mut expected = Vec::new();
    for id in 0..300u64 {
        let payload = payload_for(id, 100 + (id as usize * 37) % 900);
        let seq = wal.append(&record(&payload, Some(b"k"))).await.unwrap();
        assert_eq!(seq, Seq(id));
        expected.push((seq, id));
    }
    let seqs = {
        let payloads: Vec<_> = (300..310u64).map(|id| payload_for(id, 64)).collect();
        let records: Vec<_> = payloads.iter().map(|p| record(p, None)).collect();
        wal.append_many(&records).await.unwrap()
    };
    assert_eq!(seqs, Seq(300)..Seq(310));
    expected.extend((300..310).map(|id| (Seq(id), id)));
    assert!(wal.segment_count() > 1, "64 KiB segments must have rolled");
    assert_eq!(read_all(&wal, Seq(0)).await, expected);
    wal.close().await;
    let wal = Wal::open(storage, "wal", small_config(prealloc))
        .await
        .unwrap();
    assert_eq!(wal.next_seq(), Seq(310));
    assert_eq!(read_all(&wal, Seq(0)).await, expected);
    assert_eq!(read_all(&wal, Seq(305)).await, expected[305..].to_vec());
    wal.close().await;
}

#[test]
fn round_trip_on_the_fault_free_sim() {
    for prealloc in [false, true] {
        run_local(
            None,
            round_trip(SimDisk::new(1, SimFaults::default()), prealloc),
        );
    }
}

#[test]
fn round_trip_on_a_real_disk() {
    for prealloc in [false, true] {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let storage = DmaStorage::new(dir.path());
        run_local(None, round_trip(storage, prealloc));
    }
}

/// Starts `count` appends of about 1 KiB at once; returns their outcomes in order.
async fn burst<S: Storage>(wal: &Wal<S>, ids: std::ops::Range<u64>) -> Vec<Result<Seq, WalError>> {
    let tasks: Vec<_> = ids
        .map(|id| {
            let wal = wal.clone();
            narad_io::rt::spawn_local(async move {
                wal.append(&record(&payload_for(id, 1000), None)).await
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.expect("append task ran"));
    }
    outcomes
}

/// A burst of appends far past the flush target goes out as a pipeline of
/// batches, each released by its own sync, and reads back whole.
async fn burst_round_trip<S: Storage>(storage: S) {
    let config = pipeline_config(true);
    assert_eq!(config.flush_bytes_target, 8 << 10);
    let wal = Wal::open(storage, "wal", config).await.unwrap();
    let before = wal.stats();
    let outcomes = burst(&wal, 0..64).await;
    let seqs: Vec<Seq> = outcomes.into_iter().map(Result::unwrap).collect();
    assert_eq!(seqs, (0..64).map(Seq).collect::<Vec<_>>());
    let after = wal.stats();
    // 64 frames of about 1 KiB against an 8 KiB target: several batches.
    let flushes = after.flushes - before.flushes;
    assert!(flushes >= 4, "{flushes} flushes for a 64 KiB burst");
    assert!(after.syncs - before.syncs >= flushes, "{after:?}");
    let ids: Vec<u64> = read_all(&wal, Seq(0))
        .await
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    assert_eq!(ids, (0..64).collect::<Vec<_>>());
    wal.close().await;
}

#[test]
fn a_burst_is_flushed_as_a_pipeline_of_batches() {
    run_local(
        None,
        burst_round_trip(SimDisk::new(21, SimFaults::default())),
    );
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    run_local(None, burst_round_trip(DmaStorage::new(dir.path())));
}

/// With nothing in flight, a batch that fits one write run is one durable
/// write: no `fdatasync` beside it. With durable writes off, the same append is
/// a write and an `fdatasync`; and so it is, durable writes on, in a segment
/// that grows with each write (one made empty when nothing was prepared): the
/// new size is made durable by the `fdatasync`, not left to the file system's
/// handling of `O_DSYNC`.
#[test]
fn a_lone_batch_is_one_durable_write() {
    for durable in [true, false] {
        let disk = SimDisk::new(23, SimFaults::default());
        run_local(None, async move {
            let config = WalConfig {
                durable_writes: durable,
                ..small_config(true)
            };
            let wal = Wal::open(disk.clone(), "wal", config).await.unwrap();
            // The first segment is made empty and grows: a write and a sync.
            let before = disk.stats();
            wal.append(&record(&payload_for(0, 1000), None))
                .await
                .unwrap();
            let after = disk.stats();
            assert_eq!(after.durable_writes - before.durable_writes, 0);
            assert!(after.syncs > before.syncs);
            // It is left for a prepared segment as soon as one is ready.
            for id in 1.. {
                assert!(id < 1_000, "no prepared segment after {id} appends");
                if wal.stats().prepared_rolls > 0 {
                    break;
                }
                narad_io::rt::sleep(std::time::Duration::from_millis(1)).await;
                wal.append(&record(&payload_for(id, 1000), None))
                    .await
                    .unwrap();
            }
            // The preparation of the next segment, begun by that roll, ends.
            narad_io::rt::sleep(std::time::Duration::from_millis(20)).await;
            let before = disk.stats();
            wal.append(&record(&payload_for(1, 1000), None))
                .await
                .unwrap();
            let after = disk.stats();
            let durable_writes = after.durable_writes - before.durable_writes;
            let syncs = after.syncs - before.syncs;
            assert_eq!(
                (durable_writes, syncs),
                (u64::from(durable), u64::from(!durable))
            );
            let flush_syncs = wal.stats().syncs;
            wal.append(&record(&payload_for(5_000, 1000), None))
                .await
                .unwrap();
            assert_eq!(
                wal.stats().syncs - flush_syncs,
                1,
                "either counts as the flush's sync"
            );
            wal.close().await;
        });
    }
}

/// The batch written while an earlier batch's sync runs is released only by a
/// sync of its own: when the earlier sync fails, every append of the burst
/// fails with the latch, and none of them is acknowledged.
#[test]
fn a_failed_sync_fails_the_batch_written_beside_it() {
    let disk = SimDisk::new(22, SimFaults::default());
    run_local(None, async move {
        // No segment preparation: its sync must not be the one that fails.
        let wal = Wal::open(disk.clone(), "wal", pipeline_config(false))
            .await
            .unwrap();
        disk.fail_next_syncs(1);
        let outcomes = burst(&wal, 0..64).await;
        for (id, outcome) in outcomes.iter().enumerate() {
            assert!(
                matches!(outcome, Err(WalError::Latched(_))),
                "append {id}: {outcome:?}"
            );
        }
        assert_eq!(wal.durable_next(), Seq(0));
        wal.close().await;
    });
}

/// The dispatcher waits for durability in a loop, racing the wait against
/// timers and dropping it when they win. An idle WAL must hold one waker per
/// listening task however many rounds pass: one per round used to pile up until
/// the task's waker reference count overflowed and the shard died.
#[test]
fn an_abandoned_durability_wait_leaves_one_listener() {
    run_local(None, async {
        let wal = Wal::open(
            SimDisk::new(1, SimFaults::default()),
            "wal",
            small_config(false),
        )
        .await
        .unwrap();
        let payload = payload_for(0, 100);
        wal.append(&record(&payload, None)).await.unwrap();
        let position = wal.next_seq();
        for _ in 0..1000 {
            futures_lite::future::or(wal.wait_durable_past(position), std::future::ready(())).await;
        }
        assert_eq!(wal.durable_listener_count(), 1);
        // The one listener is still woken by the next flush.
        let next = payload_for(1, 100);
        futures_lite::future::zip(wal.wait_durable_past(position), async {
            wal.append(&record(&next, None)).await.unwrap();
        })
        .await;
        assert_eq!(wal.durable_listener_count(), 0);
        wal.close().await;
    });
}

#[test]
fn many_appenders_share_each_fdatasync() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let storage = DmaStorage::new(dir.path());
    run_local(None, async move {
        let wal = Wal::open(storage, "wal", WalConfig::default())
            .await
            .unwrap();
        let appenders_count = 256u64;
        let rounds = 8u64;
        let mut tasks = Vec::new();
        for a in 0..appenders_count {
            let wal = wal.clone();
            tasks.push(glommio::spawn_local(async move {
                for r in 0..rounds {
                    let payload = payload_for(a * rounds + r, 1024);
                    wal.append(&record(&payload, None)).await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await;
        }
        let stats = wal.stats();
        let records = appenders_count * rounds;
        assert_eq!(stats.records, records);
        // One write and one fdatasync per group commit, and many records per commit.
        assert_eq!(stats.syncs, stats.flushes, "{stats:?}");
        assert!(
            stats.syncs * 10 <= records,
            "too many fdatasyncs: {stats:?}"
        );
        let ids: Vec<u64> = read_all(&wal, Seq(0))
            .await
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(sorted, (0..records).collect::<Vec<_>>());
        wal.close().await;
    });
}

/// `rounds` rounds of 100 appends of 1000 bytes, each then fully dispatched
/// (checkpoint stored and synced) and followed by `after_round`; returns the
/// number of records appended.
async fn append_and_dispatch_rounds(
    wal: &Wal<SimDisk>,
    rounds: usize,
    after_round: impl Fn(&Wal<SimDisk>),
) -> u64 {
    let mut next_id = 0u64;
    for _round in 0..rounds {
        for _ in 0..100 {
            let payload = payload_for(next_id, 1000);
            wal.append(&record(&payload, None)).await.unwrap();
            next_id += 1;
        }
        wal.store_checkpoint(wal.durable_next());
        let target = wal.durable_next();
        wait_until(|| wal.synced_checkpoint() == target).await;
        narad_io::rt::sleep(Duration::from_millis(5)).await;
        after_round(wal);
    }
    next_id
}

#[test]
fn compaction_recycles_segments_and_bounds_disk_use() {
    let disk = SimDisk::new(3, SimFaults::default());
    run_local(None, async move {
        let wal = Wal::open(disk.clone(), "wal", small_config(true))
            .await
            .unwrap();
        let next_id = append_and_dispatch_rounds(&wal, 12, |wal| {
            assert!(
                wal.segment_count() <= 3,
                "segments pile up: {}",
                wal.segment_count()
            );
        })
        .await;
        let stats = wal.stats();
        assert!(stats.compactions > 5, "{stats:?}");
        assert!(
            stats.prepared_rolls > 5,
            "rolls should find prepared segments: {stats:?}"
        );
        let files = disk.list("wal").await.unwrap();
        assert!(
            files.len() <= 3 + 2 + 1 + 1,
            "disk use not bounded: {files:?}"
        );
        // The checkpoint survives a restart and dispatch resumes there.
        wal.close().await;
        let wal = Wal::open(disk.clone(), "wal", small_config(true))
            .await
            .unwrap();
        assert_eq!(wal.checkpoint(), Seq(next_id));
        assert!(read_all(&wal, wal.checkpoint()).await.is_empty());
        wal.close().await;
    });
}

/// A checkpoint past the end of the WAL means synced bytes were lost (the
/// device broke its promise), and recovery lowers it to the end: sequence
/// numbers already used may be written again. Recycled files may hold frames
/// with such numbers, so recovery drops them rather than recycle them.
#[test]
fn a_checkpoint_past_the_end_drops_the_recycled_files() {
    let disk = SimDisk::new(4, SimFaults::default());
    run_local(None, async move {
        let wal = Wal::open(disk.clone(), "wal", small_config(true))
            .await
            .unwrap();
        append_and_dispatch_rounds(&wal, 6, |_| {}).await;
        let end = wal.durable_next();
        wal.close().await;
        let recycled = |files: &[String]| {
            files
                .iter()
                .filter(|f| f.starts_with("spare-") || f.ends_with(".prep"))
                .count()
        };
        let files = disk.list("wal").await.unwrap();
        assert!(recycled(&files) > 0, "nothing to recycle: {files:?}");
        let (checkpoint, _) = CheckpointFile::open(&disk, "wal").await.unwrap();
        checkpoint.store(Seq(end.0 + 1000)).await.unwrap();
        checkpoint.sync().await.unwrap();
        let wal = Wal::open(disk.clone(), "wal", small_config(false))
            .await
            .unwrap();
        assert_eq!(wal.checkpoint(), end, "lowered to the end");
        let files = disk.list("wal").await.unwrap();
        assert_eq!(recycled(&files), 0, "{files:?}");
        wal.close().await;
    });
}

#[test]
fn a_compaction_whose_rename_failed_its_directory_sync_carries_on() {
    let disk = SimDisk::new(4, SimFaults::default());
    run_local(None, async move {
        let wal = Wal::open(disk.clone(), "wal", small_config(true))
            .await
            .unwrap();
        // Past the first segment (it grows, so it is removed, not kept): the
        // active one now is a prepared, full-size one.
        wait_until(|| disk_names_contain(&disk, "next-segment.prep")).await;
        let payload = vec![1u8; 1000];
        while wal.stats().early_rolls == 0 {
            wal.append(&record(&payload, None)).await.unwrap();
        }
        let files = disk.list("wal").await.unwrap();
        let active = files
            .iter()
            .filter(|f| f.ends_with(".wal") && !f.starts_with("spare-"))
            .max()
            .unwrap_or_else(|| panic!("no segment in {files:?}"));
        // It becomes a spare, but the sync after the rename fails.
        disk.fail_next_rename_of(&format!("wal/{active}"));
        append_and_dispatch_rounds(&wal, 12, |_| {}).await;
        assert!(!disk.rename_fault_armed(), "the rename never happened");
        assert!(
            wal.segment_count() <= 3,
            "compaction stuck: {} segments",
            wal.segment_count()
        );
        wal.close().await;
    });
}

#[test]
fn a_checkpoint_below_the_oldest_segment_starts_at_that_segment() {
    let disk = SimDisk::new(4, SimFaults::default());
    run_local(None, async move {
        let wal = Wal::open(disk.clone(), "wal", small_config(false))
            .await
            .unwrap();
        for id in 0..400u64 {
            let payload = payload_for(id, 1000);
            wal.append(&record(&payload, None)).await.unwrap();
        }
        wal.store_checkpoint(Seq(300));
        wait_until(|| wal.synced_checkpoint() == Seq(300)).await;
        narad_io::rt::sleep(Duration::from_millis(5)).await;
        wal.close().await;
        // The disk lost the checkpoint's last write while the deletions survived.
        let ckpt = disk
            .open("wal/checkpoint", narad_io::file::OpenMode::Existing)
            .await
            .unwrap();
        use narad_io::BlockFile;
        ckpt.write_at(0, &narad_shards::wal::checkpoint::encode(Seq(3)))
            .await
            .unwrap();
        ckpt.sync_data().await.unwrap();
        let names = disk.list("wal").await.unwrap();
        let oldest = names
            .iter()
            .filter_map(|n| narad_shards::wal::segment::parse_segment_name(n))
            .min()
            .unwrap();
        assert!(oldest > Seq(3));
        let wal = Wal::open(disk.clone(), "wal", small_config(false))
            .await
            .unwrap();
        assert_eq!(wal.checkpoint(), oldest);
        let first = read_all(&wal, wal.checkpoint()).await[0];
        assert_eq!(first.0, oldest);
        wal.close().await;
    });
}

#[test]
fn a_failed_fdatasync_latches_and_acked_records_survive() {
    let disk = SimDisk::new(5, SimFaults::default());
    let disk2 = disk.clone();
    run_local(None, async move {
        let wal = Wal::open(disk.clone(), "wal", small_config(true))
            .await
            .unwrap();
        for id in 0..50u64 {
            wal.append(&record(&payload_for(id, 200), None))
                .await
                .unwrap();
        }
        disk.fail_next_syncs(1);
        let failed = wal.append(&record(&payload_for(50, 200), None)).await;
        assert!(matches!(failed, Err(WalError::Latched(_))), "{failed:?}");
        assert!(wal.is_latched());
        // Space or the device may come back: the latch holds until restart.
        let later = wal.append(&record(&payload_for(51, 200), None)).await;
        assert!(matches!(later, Err(WalError::Latched(_))), "{later:?}");
        disk.crash();
    });
    disk2.reboot();
    run_local(None, async move {
        let wal = Wal::open(disk2.clone(), "wal", small_config(true))
            .await
            .unwrap();
        let ids: Vec<u64> = read_all(&wal, Seq(0))
            .await
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        assert!(ids.len() >= 50 && ids.len() <= 51, "{}", ids.len());
        assert_eq!(ids[..50], (0..50).collect::<Vec<_>>()[..]);
        wal.append(&record(&payload_for(60, 200), None))
            .await
            .unwrap();
        wal.close().await;
    });
}

#[test]
fn a_full_disk_answers_enospc_latches_and_loses_nothing_acked() {
    let disk = SimDisk::new(6, SimFaults::default());
    let disk2 = disk.clone();
    let acked = run_local(None, async move {
        let wal = Wal::open(disk.clone(), "wal", small_config(false))
            .await
            .unwrap();
        let used = 4096 * 8;
        disk.set_capacity(Some(used + (200 << 10)));
        let mut acked = Vec::new();
        let mut failure = None;
        for id in 0..10_000u64 {
            match wal.append(&record(&payload_for(id, 1000), None)).await {
                Ok(_) => acked.push(id),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let failure = failure.expect("the disk fills");
        assert!(
            matches!(&failure, WalError::Latched(why) if why.contains("No space")),
            "{failure:?}"
        );
        disk.set_capacity(None);
        assert!(wal
            .append(&record(&payload_for(99_999, 10), None))
            .await
            .is_err());
        disk.crash();
        acked
    });
    disk2.reboot();
    run_local(None, async move {
        let wal = Wal::open(disk2.clone(), "wal", small_config(false))
            .await
            .unwrap();
        let ids: Vec<u64> = read_all(&wal, Seq(0))
            .await
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        assert_eq!(ids[..acked.len()], acked[..]);
        wal.close().await;
    });
}

#[test]
fn bad_records_are_refused_before_anything_is_staged() {
    let disk = SimDisk::new(8, SimFaults::default());
    run_local(None, async move {
        let wal = Wal::open(disk.clone(), "wal", small_config(false))
            .await
            .unwrap();
        let big = vec![1u8; 17 << 20];
        let ok = payload_for(1, 10);
        let records = [record(&ok, None), record(&big, None)];
        assert!(matches!(
            wal.append_many(&records).await,
            Err(WalError::Invalid(_))
        ));
        assert_eq!(wal.next_seq(), Seq(0));
        wal.close().await;
    });
}

#[test]
fn segments_behind_the_recovered_checkpoint_are_compacted_at_open() {
    let disk = SimDisk::new(12, SimFaults::default());
    run_local(None, async move {
        let config = small_config(false);
        let wal = Wal::open(disk.clone(), "wal", config.clone())
            .await
            .unwrap();
        let payload = vec![3u8; 4096];
        while wal.segment_count() < 3 {
            wal.append(&record(&payload, None)).await.unwrap();
        }
        let stored = wal.durable_next();
        disk.restart_process();
        drop(wal);
        // Everything was dispatched and the checkpoint stored, but the process
        // died before the WAL synced it (a store that passes a segment's start
        // is synced at once, so this is put on disk here by hand).
        let (checkpoint, _) = CheckpointFile::open(&disk, "wal").await.unwrap();
        checkpoint.store(stored).await.unwrap();
        drop(checkpoint);
        // The next life syncs the checkpoint it recovers, and compacts behind
        // it at once, though no new checkpoint comes.
        let segments = |files: Vec<String>| {
            let named = |f: &String| narad_shards::wal::segment::parse_segment_name(f).is_some();
            files.iter().filter(|f| named(f)).count()
        };
        assert_eq!(segments(disk.list("wal").await.unwrap()), 3);
        let wal = Wal::open(disk.clone(), "wal", config).await.unwrap();
        assert_eq!(wal.checkpoint(), stored);
        wait_until(|| wal.segment_count() == 1).await;
        wal.close().await;
    });
}

/// A reader sent forward (a dispatcher's rescan pass that ended early) reads on
/// from exactly where it was sent, within a segment (through the nearest
/// position mark) and into the next ones, with nothing kept in memory.
#[test]
fn a_reader_sent_forward_reads_on_from_there() {
    let disk = SimDisk::new(12, SimFaults::default());
    run_local(None, async move {
        let config = WalConfig {
            reader_cache_bytes_max: 0,
            ..small_config(false)
        };
        let wal = Wal::open(disk.clone(), "wal", config).await.unwrap();
        for id in 0..300u64 {
            wal.append(&record(&payload_for(id, 500), None))
                .await
                .unwrap();
        }
        assert!(wal.segment_count() > 1, "the records span segments");
        let mut reader = wal.reader(Seq(0));
        assert_eq!(read_one(&mut reader).await, vec![(0, 0)]);
        for target in [37u64, 38, 150, 151, 299] {
            reader.seek(Seq(target));
            assert_eq!(read_one(&mut reader).await, vec![(target, target)]);
        }
        wal.close().await;
    });
}

/// The next record `reader` reads: (seq, payload id).
async fn read_one(reader: &mut narad_shards::wal::WalReader<SimDisk>) -> Vec<(u64, u64)> {
    let mut got = Vec::new();
    reader
        .read(1, |seq, rec| {
            got.push((seq.0, check_payload(&rec.payload_vec())))
        })
        .await
        .unwrap();
    got
}

/// `(key, payload)` of a record handed out without a copy, unmasked.
fn unmask(shared: &narad_shards::wal::SharedRecord) -> (Option<Vec<u8>>, Vec<u8>) {
    let key_len = shared.key.as_ref().map_or(0, |k| k.len());
    let mut region = shared.key.as_ref().map_or_else(Vec::new, |k| k.to_vec());
    region.extend_from_slice(&shared.payload);
    narad_shards::mask::apply_mask(shared.mask, 0, &mut region);
    let payload = region.split_off(key_len);
    (shared.key.as_ref().map(|_| region), payload)
}

/// A record read from the WAL's memory is handed out as slices of the batch
/// kept there, still masked, and unmasks to what was appended (keys of every
/// length, so that the payload continues the key's phase); those slices stay
/// as they were while later batches push theirs out of memory and their
/// buffers are staged into again. A record read from the device has no
/// slices to share.
#[test]
fn records_read_from_memory_share_the_kept_batch() {
    let disk = SimDisk::new(31, SimFaults::default());
    run_local(None, async move {
        let wal = Wal::open(disk.clone(), "wal", small_config(false))
            .await
            .unwrap();
        let keys: Vec<Option<Vec<u8>>> = (0..12u8)
            .map(|n| (n % 11 != 10).then(|| vec![b'k'; n as usize]))
            .collect();
        let payloads: Vec<Vec<u8>> = (0..12u64).map(|id| payload_for(id, 300)).collect();
        for (key, payload) in keys.iter().zip(&payloads) {
            wal.append(&record(payload, key.as_deref())).await.unwrap();
        }
        let mut reader = wal.reader(Seq(0));
        let mut shared = Vec::new();
        reader
            .read(100, |_, rec| {
                shared.push(rec.shared().expect("read from memory"))
            })
            .await
            .unwrap();
        assert_eq!(shared.len(), 12);
        for (i, held) in shared.iter().enumerate() {
            assert_ne!(held.mask, 0, "format 2 frames are masked");
            assert_ne!(
                held.payload.as_ref(),
                payloads[i].as_slice(),
                "still masked"
            );
            assert_eq!(unmask(held), (keys[i].clone(), payloads[i].clone()));
        }
        // Many more batches than memory keeps (64 KiB), through the staging
        // buffers the evicted ones would give back.
        for id in 12..400u64 {
            wal.append(&record(&payload_for(id, 1000), Some(b"key")))
                .await
                .unwrap();
        }
        for (i, held) in shared.iter().enumerate() {
            assert_eq!(unmask(held), (keys[i].clone(), payloads[i].clone()));
        }
        wal.close().await;
        let wal = Wal::open(disk, "wal", small_config(false)).await.unwrap();
        let mut reader = wal.reader(Seq(0));
        let mut from_disk = 0;
        reader
            .read(12, |_, rec| {
                assert!(rec.shared().is_none(), "read from the device");
                from_disk += 1;
            })
            .await
            .unwrap();
        assert_eq!(from_disk, 12);
        wal.close().await;
    });
}

/// A dispatcher waiting for records to become durable is woken by the close,
/// not left to notice it at its next timer.
#[test]
fn the_close_wakes_a_wait_for_durable_records() {
    run_local(None, async {
        let disk = SimDisk::new(22, SimFaults::default());
        let wal = Wal::open(disk, "wal", small_config(false)).await.unwrap();
        let waiting = wal.clone();
        let woken = narad_io::rt::spawn_local(async move {
            waiting.wait_durable_past(Seq(0)).await;
        });
        narad_io::rt::sleep(Duration::from_millis(5)).await;
        assert_eq!(wal.durable_listener_count(), 1, "the wait is parked");
        wal.close().await;
        let timeout = async {
            narad_io::rt::sleep(Duration::from_secs(2)).await;
            panic!("the wait was not woken by the close");
        };
        futures_lite::future::or(async { woken.await.unwrap() }, timeout).await;
    });
}

/// A compaction that failed is tried again on its own: on an idle node the
/// checkpoint, whose next sync would bring the next attempt, may never move.
#[test]
fn a_failed_compaction_is_tried_again_while_the_wal_is_idle() {
    let disk = SimDisk::new(23, SimFaults::default());
    run_local(None, async move {
        let wal = Wal::open(disk.clone(), "wal", small_config(false))
            .await
            .unwrap();
        for id in 0..200u64 {
            let payload = payload_for(id, 1000);
            wal.append(&record(&payload, None)).await.unwrap();
        }
        assert!(wal.segment_count() > 2, "{} segments", wal.segment_count());
        disk.fail_next_remove_of(&format!("wal/{}", segment_name(Seq(0))));
        wal.store_checkpoint(wal.durable_next());
        // Nothing else happens: the one attempt behind the checkpoint's sync
        // fails, and only a retry of its own compacts.
        wait_until(|| wal.segment_count() == 1).await;
        wal.close().await;
    });
}
