//! Partition log under device faults: read-back bit flips, failed fdatasync, ENOSPC;
//! and the plain commit/read round trip on the simulated and the real disk.

use futures_lite::future::block_on;
use narad_io::dma::DmaStorage;
use narad_io::sim::{SimDisk, SimFaults};
use narad_io::Storage;
use narad_shards::ids::Offset;
use narad_shards::log::{
    acknowledged_end, LogConfig, LogError, PartitionLog, ReadItem, Record, RecordRef, HINT_FILE,
};

const DIR: &str = "topics/t/p00000";

fn config() -> LogConfig {
    LogConfig {
        segment_bytes_max: 256 * 1024,
        prep_chunk_bytes: 64 * 1024,
        index_interval_bytes: 4096,
        frame_area_bytes_target: 8 * 1024,
        commit_bytes_max: 1024 * 1024,
        ..LogConfig::default()
    }
}

fn payload(i: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i as usize * 31 + j) as u8).collect()
}

/// Commits `n` records with payloads derived from their index `first..first+n`.
async fn commit_n<S: Storage>(
    log: &mut PartitionLog<S>,
    first: u64,
    n: u64,
    now_ms: u64,
) -> Result<std::ops::Range<Offset>, LogError> {
    let payloads: Vec<Vec<u8>> = (first..first + n)
        .map(|i| payload(i, 100 + (i % 7) as usize * 50))
        .collect();
    let keys: Vec<Vec<u8>> = (first..first + n)
        .map(|i| format!("key-{i}").into_bytes())
        .collect();
    let records: Vec<RecordRef> = payloads
        .iter()
        .zip(&keys)
        .enumerate()
        .map(|(j, (p, k))| RecordRef {
            key: (j % 3 != 0).then_some(k.as_slice()),
            payload: p,
        })
        .collect();
    log.commit_durable(&records, now_ms).await
}

/// Reads everything from `from` to the high watermark.
async fn read_all<S: Storage>(log: &mut PartitionLog<S>, from: Offset) -> Vec<ReadItem> {
    let mut items = Vec::new();
    let mut at = from;
    for _ in 0..100_000 {
        if at >= log.high_watermark() {
            break;
        }
        let batch = log.read(at, 37, 64 * 1024).await.expect("read");
        assert!(batch.next_offset > at, "reads make progress");
        at = batch.next_offset;
        items.extend(batch.items);
    }
    items
}

/// Checks that the log holds exactly the records `0..n` written by `commit_n`.
async fn assert_holds<S: Storage>(log: &mut PartitionLog<S>, n: u64) {
    assert_eq!(log.high_watermark(), Offset(n));
    let items = read_all(log, Offset(0)).await;
    assert_eq!(items.len() as u64, n);
    for (i, item) in items.iter().enumerate() {
        let i = i as u64;
        let ReadItem::Record(record) = item else {
            panic!("offset {i} unreadable: {item:?}")
        };
        assert_eq!(record.offset, Offset(i));
        assert_eq!(
            record.payload.as_ref(),
            payload(i, 100 + (i % 7) as usize * 50).as_slice(),
            "offset {i}"
        );
        // Records were committed in batches; the key rule is per position in its
        // batch, so only check that a present key is the right one.
        if let Some(key) = &record.key {
            assert_eq!(key.as_ref(), format!("key-{i}").as_bytes());
        }
    }
}

#[test]
fn round_trip_on_the_simulated_disk_with_and_without_zstd() {
    for zstd_level in [None, Some(3)] {
        block_on(async {
            let disk = SimDisk::new(1, SimFaults::default());
            let cfg = LogConfig {
                zstd_level,
                segment_bytes_max: 32 * 1024,
                ..config()
            };
            let mut log = PartitionLog::open(disk.clone(), DIR, cfg.clone())
                .await
                .unwrap();
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
        let disk = SimDisk::new(2, SimFaults::default());
        let mut log = PartitionLog::open(disk, DIR, config()).await.unwrap();
        let records = [
            RecordRef {
                key: None,
                payload: b"a",
            },
            RecordRef {
                key: Some(b""),
                payload: b"",
            },
            RecordRef {
                key: Some(b"k"),
                payload: b"c",
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
        let disk = SimDisk::new(3, SimFaults::default());
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
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
        let disk = SimDisk::new(17, SimFaults::default());
        let segment = format!("{DIR}/{:020}.log", 0);
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
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

/// Guards against the frames of a commit whose read-back failed outliving it.
/// The failed commit F wrote offsets 7..10 at bytes 3584..5120, one 512-byte
/// frame a record; its retry R is shorter (offset 7 alone) and succeeds; the
/// next commit C (offsets 8..10) starts where R ended, so its frames fall on
/// F's later ones, same offsets and positions. The power goes while C's write
/// is unsynced: where C's first sector survives and its second does not, F's
/// last frame (still on the disk had only the first block been repaired)
/// would complete C's, and recovery would return F's record at offset 9, one
/// never acknowledged there. Recovery must give back R, and C whole or not at
/// all. Every seed draws another fate for C's sectors.
#[test]
fn a_failed_commits_frames_never_complete_a_later_torn_commit() {
    use narad_shards::log::commit_bytes_bound;

    // One record of this payload is one frame of exactly one sector.
    let payload_len = 512 - commit_bytes_bound(None, 0);
    let record = |tag: u8, i: u64| {
        let mut payload = vec![tag; payload_len];
        payload[..8].copy_from_slice(&i.to_be_bytes());
        payload
    };
    let segment = format!("{DIR}/{:020}.log", 0);
    let mut exposed = 0;
    for prep_chunk_bytes in [0, 64 * 1024] {
        let cfg = LogConfig {
            prep_chunk_bytes,
            frame_area_bytes_target: 1,
            ..config()
        };
        for seed in 0..32u64 {
            block_on(async {
                let disk = SimDisk::new(seed, SimFaults::default());
                let mut log = PartitionLog::open(disk.clone(), DIR, cfg.clone())
                    .await
                    .unwrap();
                let commit = async |log: &mut PartitionLog<SimDisk>,
                                    tag: u8,
                                    offsets: std::ops::Range<u64>,
                                    now_ms: u64| {
                    let payloads: Vec<Vec<u8>> = offsets.map(|i| record(tag, i)).collect();
                    let records: Vec<RecordRef> = payloads
                        .iter()
                        .map(|p| RecordRef {
                            key: None,
                            payload: p,
                        })
                        .collect();
                    log.commit_durable(&records, now_ms).await
                };
                // Seven frames: the last acknowledged commit ends inside block 0.
                assert_eq!(
                    commit(&mut log, b'p', 0..7, 1).await.unwrap(),
                    Offset(0)..Offset(7)
                );
                assert_eq!(log.stats().size_bytes, 3584);
                // F: frames at 3584, 4096 and 4608; its read-back sees a flipped
                // bit in block 1.
                disk.flip_next_read_at(&segment, 4096 + 100, 1);
                let failed = commit(&mut log, b'f', 7..10, 2).await;
                assert!(
                    matches!(failed, Err(LogError::ReadBackMismatch { .. })),
                    "seed {seed}: {failed:?}"
                );
                assert!(!log.is_poisoned(), "seed {seed}: the repair succeeded");
                // R, the shorter retry: acknowledged, it ends at 4096.
                assert_eq!(
                    commit(&mut log, b'r', 7..8, 3).await.unwrap(),
                    Offset(7)..Offset(8)
                );
                assert_eq!(log.stats().size_bytes, 4096);
                // C: its write lands, the power goes at its sync.
                disk.crash_at_op(disk.ops() + 2);
                let torn = commit(&mut log, b'c', 8..10, 4).await;
                assert!(torn.is_err() && disk.is_crashed(), "seed {seed}: {torn:?}");
                let written = disk.contents(&segment).unwrap();
                drop(log);
                disk.reboot();
                let kept = disk.contents(&segment).unwrap();
                let sector = |bytes: &[u8], s: usize| bytes[s * 512..(s + 1) * 512].to_vec();
                if sector(&kept, 8) == sector(&written, 8)
                    && sector(&kept, 9) != sector(&written, 9)
                {
                    exposed += 1;
                }
                let mut log = PartitionLog::open(disk.clone(), DIR, cfg.clone())
                    .await
                    .unwrap();
                let hwm = log.high_watermark().0;
                assert!(
                    hwm == 8 || hwm == 10,
                    "seed {seed}, prep {prep_chunk_bytes}: recovered up to {hwm}"
                );
                let items = read_all(&mut log, Offset(0)).await;
                let found: Vec<(u64, Vec<u8>)> = items
                    .into_iter()
                    .map(|item| match item {
                        ReadItem::Record(r) => (r.offset.0, r.payload.to_vec()),
                        other => panic!("seed {seed}, prep {prep_chunk_bytes}: {other:?}"),
                    })
                    .collect();
                let wanted: Vec<(u64, Vec<u8>)> = (0..7)
                    .map(|i| (i, record(b'p', i)))
                    .chain([(7, record(b'r', 7))])
                    .chain((8..hwm.max(8)).map(|i| (i, record(b'c', i))))
                    .collect();
                let tags = |records: &[(u64, Vec<u8>)]| -> String {
                    records.iter().map(|(_, p)| p[8] as char).collect()
                };
                assert!(
                    found == wanted,
                    "seed {seed}, prep {prep_chunk_bytes}: recovered the records of commits {:?}, acknowledged (and in flight) {:?}",
                    tags(&found),
                    tags(&wanted)
                );
            });
        }
    }
    assert!(
        exposed > 0,
        "no seed kept C's first sector and lost its second"
    );
}

/// Reopens the log on `disk`: it holds exactly records `0..n`, and takes two
/// more after them.
async fn reopened_holds_and_goes_on(disk: &SimDisk, n: u64) {
    let mut log = PartitionLog::open(disk.clone(), DIR, config())
        .await
        .unwrap();
    assert_holds(&mut log, n).await;
    commit_n(&mut log, n, 2, 3).await.unwrap();
    assert_holds(&mut log, n + 2).await;
}

/// A record whose payload is laid out as a valid frame (offsets near 2^62, a
/// commit time far ahead) stays a payload: when damage to its own commit's
/// header makes recovery search the bytes after it, the search finds nothing
/// there. After a crash (no tail hint) the damaged last commit is cut as a
/// torn tail; after a clean close it is kept as a corrupt gap.
#[test]
fn a_frame_forged_in_a_payload_is_never_recovered_as_one() {
    use narad_shards::log::envelope::{encode_envelope, envelope_len};
    use narad_shards::log::frame::{encode_unmasked_frame, push_record, Codec, FrameSpec};

    /// Three records, then one whose payload is a forged frame; closed cleanly.
    /// Returns the disk and where the forged record's commit starts.
    async fn forged_log() -> (SimDisk, usize) {
        let disk = SimDisk::new(18, SimFaults::default());
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        commit_n(&mut log, 0, 3, 1).await.unwrap();
        let forged_at = log.stats().size_bytes;
        let mut area = Vec::new();
        let payload = b"not from this log";
        push_record(&mut area, envelope_len(None, payload.len()), |out| {
            encode_envelope(out, None, u64::MAX / 2, payload)
        });
        let spec = FrameSpec {
            base_offset: Offset(1 << 62),
            record_count: 1,
            codec: Codec::None,
            first_of_commit: true,
            last_of_commit: true,
        };
        let forged = encode_unmasked_frame(spec, &area, 1);
        let record = RecordRef {
            key: None,
            payload: &forged,
        };
        log.commit_durable(&[record], 2).await.unwrap();
        log.close().await.unwrap();
        (disk, forged_at as usize)
    }

    block_on(async {
        let segment = format!("{DIR}/{:020}.log", 0);
        // The base offset in the header of the commit holding it rots. Closed
        // cleanly, the tail hint says offset 3 was committed: a corrupt gap.
        let (disk, forged_at) = forged_log().await;
        disk.rot(&segment, forged_at + 10, 2);
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        assert_eq!(log.high_watermark(), Offset(4));
        assert_eq!(log.corrupt_gaps(), &[Offset(3)..Offset(4)]);
        let items = read_all(&mut log, Offset(0)).await;
        assert_eq!(items.len(), 4, "{items:?}");
        assert_eq!(items[3], ReadItem::Corrupt(Offset(3)..Offset(4)));
        assert_eq!(
            commit_n(&mut log, 4, 1, 3).await.unwrap(),
            Offset(4)..Offset(5)
        );
        // The hint that did not hold is retired by that commit: it can never
        // be a later open's floor for a tail written since.
        let hint = disk
            .open(
                &format!("{DIR}/{HINT_FILE}"),
                narad_io::file::OpenMode::Existing,
            )
            .await
            .unwrap();
        let mut image = vec![0u8; 64 << 10];
        let read = narad_io::BlockFile::read_at(&hint, 0, &mut image)
            .await
            .unwrap();
        assert_eq!(acknowledged_end(&image[..read], Offset(0)), None);
        // The same rot with no hint, as after a crash: cut as a torn tail.
        let (disk, forged_at) = forged_log().await;
        disk.rot(&segment, forged_at + 10, 2);
        disk.remove(&format!("{DIR}/tail.hint")).await.unwrap();
        reopened_holds_and_goes_on(&disk, 3).await;
    });
}

/// Guards against an acknowledged commit lost to a transient read flip at open:
/// the tail scan saw the last commit fail its CRC, and because nothing non-zero
/// lay past the 4 KiB block where the verified tail ended, it cut that commit
/// without reading the segment again; the next commit then took its offsets and
/// overwrote it on the disk.
#[test]
fn a_read_flip_at_open_does_not_cut_the_last_commit() {
    block_on(async {
        let disk = SimDisk::new(8, SimFaults::default());
        let segment = format!("{DIR}/{:020}.log", 0);
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        commit_n(&mut log, 0, 3, 1).await.unwrap();
        let last_commit_pos = log.stats().size_bytes;
        commit_n(&mut log, 3, 2, 2).await.unwrap();
        let end = log.stats().size_bytes;
        assert!(
            end < narad_io::align_up(last_commit_pos + 1),
            "both commits end in the first block"
        );
        log.close().await.unwrap();
        // One bad read of a byte inside the last commit's records.
        disk.flip_next_read_at(&segment, last_commit_pos + (end - last_commit_pos) / 2, 5);
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        assert_holds(&mut log, 5).await;
        commit_n(&mut log, 5, 2, 3).await.unwrap();
        assert_holds(&mut log, 7).await;
        log.close().await.unwrap();
        let mut log = PartitionLog::open(disk, DIR, config()).await.unwrap();
        assert_holds(&mut log, 7).await;
    });
}

/// Guards: the reads of the active segment at open were a fixed budget, so a
/// few bad reads in a row, each at a later commit than the one before (every
/// read better than the last), ended the rereading with a bad read kept, and
/// the commits after its bad byte were cut.
#[test]
fn bad_reads_at_open_that_each_get_further_do_not_end_the_rereading() {
    block_on(async {
        let disk = SimDisk::new(9, SimFaults::default());
        let segment = format!("{DIR}/{:020}.log", 0);
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        let mut ends = Vec::new();
        for commit in 0..8u64 {
            commit_n(&mut log, commit * 2, 2, commit + 1).await.unwrap();
            ends.push(log.stats().size_bytes);
        }
        log.close().await.unwrap();
        // Each read of the segment is bad inside a later commit than the last.
        for commit in 1..7 {
            let (from, to) = (ends[commit - 1], ends[commit]);
            disk.flip_next_read_at(&segment, from + (to - from) / 2, 4);
        }
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        assert_holds(&mut log, 16).await;
        log.close().await.unwrap();
        let mut log = PartitionLog::open(disk, DIR, config()).await.unwrap();
        assert_holds(&mut log, 16).await;
    });
}

#[test]
fn failed_fdatasync_poisons_the_log_until_reopen() {
    block_on(async {
        let disk = SimDisk::new(4, SimFaults::default());
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
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
    block_on(async {
        let disk = SimDisk::new(5, SimFaults::default());
        let cfg = LogConfig {
            prep_chunk_bytes: 0,
            ..config()
        };
        let mut log = PartitionLog::open(disk.clone(), DIR, cfg.clone())
            .await
            .unwrap();
        commit_n(&mut log, 0, 20, 1).await.unwrap();
        let size = log.stats().size_bytes;
        disk.set_capacity(Some(narad_io::align_up(size)));
        let failed = commit_n(&mut log, 20, 200, 2).await;
        assert!(matches!(failed, Err(LogError::Io { .. })), "{failed:?}");
        assert_eq!(log.high_watermark(), Offset(20));
        assert_eq!(
            log.read(Offset(20), 10, 1 << 20).await.unwrap().items,
            vec![]
        );
        assert_holds(&mut log, 20).await;
        disk.set_capacity(None);
        commit_n(&mut log, 20, 200, 3).await.unwrap();
        assert_holds(&mut log, 220).await;
        drop(log);
        let mut log = PartitionLog::open(disk, DIR, cfg).await.unwrap();
        assert_holds(&mut log, 220).await;
    });
}

#[test]
fn enospc_while_preparing_space_is_a_clean_failure() {
    block_on(async {
        let disk = SimDisk::new(6, SimFaults::default());
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
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
            let disk = SimDisk::new(7, SimFaults::default());
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
            let mut log = PartitionLog::open(disk.clone(), DIR, cfg).await.unwrap();
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

#[test]
fn oversized_batches_are_refused_before_any_write() {
    block_on(async {
        let disk = SimDisk::new(8, SimFaults::default());
        let cfg = LogConfig {
            commit_bytes_max: 4096,
            ..config()
        };
        let mut log = PartitionLog::open(disk.clone(), DIR, cfg).await.unwrap();
        let big = vec![0u8; 5000];
        let writes = disk.stats().writes;
        let refused = log
            .commit_durable(
                &[RecordRef {
                    key: None,
                    payload: &big,
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
            let disk = SimDisk::new(seed, SimFaults::default());
            // A cache of one frame: nearly every read goes to the segments.
            let cfg = LogConfig {
                cache_bytes_max: 8 * 1024,
                ..config()
            };
            let mut log = PartitionLog::open(disk, DIR, cfg).await.unwrap();
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
        let disk = SimDisk::new(12, SimFaults::default());
        let segment = format!("{DIR}/{:020}.log", 0);
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
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
