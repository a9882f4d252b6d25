//! Crash tests of the partition log on the fault-injecting disk: random commits,
//! a crash at a random device operation (any subset of unsynced sectors survives),
//! reboot, reopen, and a check against what was acknowledged, not what was written.
//! Every failure prints its seed; `NARAD_LOG_CRASH_SEED=<n>` replays one seed,
//! and `NARAD_CRASH_SEEDS=<n>` runs that many (from a random base) instead of
//! the default.

use futures_lite::future::block_on;
use narad_io::sim::{SimDisk, SimFaults};
use narad_shards::ids::Offset;
use narad_shards::log::{LogConfig, LogError, PartitionLog, ReadItem, RecordRef};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const DIR: &str = "topics/t/p00003";
const SEEDS: u64 = 200;
/// Crash and reopen cycles per seed.
const CYCLES: usize = 4;
/// Commits attempted per cycle at most.
const COMMITS_PER_CYCLE_MAX: usize = 40;

/// One record as the test remembers it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Expected {
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    commit_time_ms: u64,
}

fn config(rng: &mut ChaCha8Rng) -> LogConfig {
    LogConfig {
        segment_bytes_max: rng.random_range(4096..24 * 1024),
        segment_ms: 50,
        prep_chunk_bytes: [0, 4096, 8192][rng.random_range(0..3)],
        // Commits average about 4 KiB: zeros always, seldom, or on and off.
        prep_commit_bytes_max: [u64::MAX, 2048, 4096][rng.random_range(0..3)],
        index_interval_bytes: 1024,
        frame_area_bytes_target: rng.random_range(200..3000),
        commit_bytes_max: 64 * 1024,
        zstd_level: rng.random_bool(0.3).then_some(1),
        cache_bytes_max: rng.random_range(0..16 * 1024),
        ..LogConfig::default()
    }
}

fn random_batch(rng: &mut ChaCha8Rng) -> Vec<(Option<Vec<u8>>, Vec<u8>)> {
    (0..rng.random_range(1..12))
        .map(|_| {
            let key = rng.random_bool(0.5).then(|| {
                let len = rng.random_range(0..20);
                (0..len).map(|_| rng.random()).collect()
            });
            let len = rng.random_range(0..700);
            // Half compressible, half random, so zstd frames of both kinds occur.
            let payload = if rng.random_bool(0.5) {
                vec![rng.random(); len]
            } else {
                (0..len).map(|_| rng.random()).collect()
            };
            (key, payload)
        })
        .collect()
}

/// Reads the whole log and checks it against the acknowledged records, plus
/// possibly the one commit that was in flight when the crash hit.
async fn check_recovered(
    seed: u64,
    log: &mut PartitionLog<SimDisk>,
    acked: &mut Vec<Expected>,
    in_flight: &[Expected],
) {
    let hwm = log.high_watermark().0 as usize;
    assert!(
        hwm == acked.len() || (hwm == acked.len() + in_flight.len() && !in_flight.is_empty()),
        "seed {seed}: recovered hwm {hwm}, acknowledged {}, in flight {}",
        acked.len(),
        in_flight.len()
    );
    if hwm > acked.len() {
        // The unacknowledged commit reached the disk whole: it is now committed.
        acked.extend_from_slice(in_flight);
    }
    assert!(
        log.corrupt_gaps().is_empty(),
        "seed {seed}: gaps {:?}",
        log.corrupt_gaps()
    );
    let mut at = Offset(0);
    while at < log.high_watermark() {
        let batch = log
            .read(at, 50, 16 * 1024)
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: read at {at}: {e}"));
        assert!(batch.next_offset > at, "seed {seed}: no progress at {at}");
        for item in batch.items {
            let ReadItem::Record(record) = item else {
                panic!("seed {seed}: corrupt item {item:?}")
            };
            let want = &acked[record.offset.0 as usize];
            let got = Expected {
                key: record.key.map(|k| k.to_vec()),
                payload: record.payload.to_vec(),
                commit_time_ms: record.commit_time_ms,
            };
            assert_eq!(&got, want, "seed {seed}: offset {}", record.offset);
        }
        at = batch.next_offset;
    }
}

/// One cycle: commits until the crash point (or the cycle's end), then crashes.
/// Returns the commit in flight at the crash.
async fn run_cycle(
    rng: &mut ChaCha8Rng,
    disk: &SimDisk,
    log: &mut PartitionLog<SimDisk>,
    acked: &mut Vec<Expected>,
    now_ms: &mut u64,
) -> Vec<Expected> {
    disk.crash_at_op(disk.ops() + rng.random_range(1..60));
    // Half the cycles run with writes in flight while the zeros ahead are
    // prepared beside them (a sync issued meanwhile does not cover them).
    disk.set_slow_writes(rng.random_bool(0.5));
    // Spontaneous read flips fail some commits at the read-back (they are
    // retried); a failed fdatasync poisons the log, which ends the cycle.
    disk.set_faults(SimFaults {
        read_flip_ppm: 20_000,
        sync_eio_ppm: 5_000,
    });
    for _ in 0..COMMITS_PER_CYCLE_MAX {
        *now_ms += rng.random_range(0..30);
        if rng.random_bool(0.1) && log.maybe_roll(*now_ms).await.is_err() {
            break;
        }
        let batch = random_batch(rng);
        let records: Vec<RecordRef> = batch
            .iter()
            .map(|(k, p)| RecordRef {
                key: k.as_deref(),
                payload: p,
                mask: 0,
            })
            .collect();
        let commit_ms = (*now_ms).max(acked.last().map_or(0, |e| e.commit_time_ms));
        let expected: Vec<Expected> = batch
            .iter()
            .map(|(k, p)| Expected {
                key: k.clone(),
                payload: p.clone(),
                commit_time_ms: commit_ms,
            })
            .collect();
        // A read-back failure is retried with the same records and time, and
        // so is a failure to retire the tail hint (its sync failed) before
        // anything was written.
        let mut outcome = Err(LogError::Poisoned);
        for _ in 0..5 {
            outcome = log.commit_durable(&records, *now_ms).await;
            let retried = matches!(
                outcome,
                Err(LogError::ReadBackMismatch { .. }
                    | LogError::Io {
                        op: "retire the tail hint",
                        ..
                    })
            );
            if !retried {
                break;
            }
        }
        match outcome {
            Ok(range) => {
                assert_eq!(range.start.0 as usize, acked.len());
                acked.extend(expected);
            }
            Err(_) if disk.is_crashed() => return expected,
            // A failed read-back whose repair of the shared block failed too
            // poisons the log: it must be reopened.
            Err(
                LogError::ReadBackMismatch { .. }
                | LogError::SyncFailed(_)
                | LogError::Poisoned
                | LogError::Io {
                    op: "retire the tail hint",
                    ..
                },
            ) => return expected,
            Err(e) => panic!("unexpected commit error {e}"),
        }
    }
    Vec::new()
}

fn run_seed(seed: u64) {
    block_on(async {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let disk = SimDisk::new(seed, SimFaults::default());
        let cfg = config(&mut rng);
        let mut acked: Vec<Expected> = Vec::new();
        let mut now_ms = 1_000u64;
        for _ in 0..CYCLES {
            let mut log = PartitionLog::open(disk.clone(), DIR, cfg.clone())
                .await
                .unwrap_or_else(|e| panic!("seed {seed}: open: {e}"));
            let in_flight = run_cycle(&mut rng, &disk, &mut log, &mut acked, &mut now_ms).await;
            drop(log);
            // Half the crashes lose power; the others only kill the process, so
            // its unsynced writes stay readable for the next open, and a later
            // power loss decides their fate.
            if rng.random_bool(0.5) {
                disk.crash();
                disk.reboot();
            } else {
                disk.restart_process();
            }
            disk.set_faults(SimFaults::default());
            let mut log = PartitionLog::open(disk.clone(), DIR, cfg.clone())
                .await
                .unwrap_or_else(|e| panic!("seed {seed}: reopen: {e}"));
            check_recovered(seed, &mut log, &mut acked, &in_flight).await;
            // Half the checks end in a clean close, which leaves a tail hint
            // for the next open: the next cycle commits past it and crashes, so
            // the open after that finds a stale hint. Some closes crash midway
            // through writing it.
            if rng.random_bool(0.5) {
                if rng.random_bool(0.3) {
                    disk.crash_at_op(disk.ops() + rng.random_range(1..4));
                }
                let _ = log.close().await;
                if disk.is_crashed() {
                    disk.crash();
                    disk.reboot();
                } else {
                    // A clean close and reopen changes nothing.
                    disk.restart_process();
                    let mut log = PartitionLog::open(disk.clone(), DIR, cfg.clone())
                        .await
                        .unwrap_or_else(|e| panic!("seed {seed}: open after close: {e}"));
                    check_recovered(seed, &mut log, &mut acked, &[]).await;
                    let _ = log.close().await;
                }
            } else {
                drop(log);
            }
        }
    });
}

#[test]
fn every_acknowledged_commit_survives_crashes() {
    if let Some(seed) = std::env::var("NARAD_LOG_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        run_seed(seed);
        return;
    }
    let count: u64 = std::env::var("NARAD_CRASH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEEDS);
    let base: u64 = rand::rng().random_range(0..1 << 40);
    for seed in base..base + count {
        // Every failure names its seed, a panic inside the log included.
        let ran = std::panic::catch_unwind(|| run_seed(seed));
        if let Err(panic) = ran {
            eprintln!("log crash test failed: seed={seed}");
            eprintln!(
                "replay with NARAD_LOG_CRASH_SEED={seed} cargo test -p narad-shards --test log_crash"
            );
            std::panic::resume_unwind(panic);
        }
    }
}
