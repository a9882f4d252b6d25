//! The consumer-offset committer: how long it takes to make the acks of many
//! partitions durable, with one sync in flight at a time or many.
//!
//! A node acking across thousands of partitions owes each of them a
//! `consumer.ahead` sync (and now and then a `consumer.offset` levelling) per
//! durability interval; the README promises a power loss loses at most about
//! one interval of acks, so the syncs of a whole interval's partitions must fit
//! in it. Each round writes a new state for every partition (page-cache writes)
//! and then lets a whole interval pass on the committer's clock, so every
//! partition is synced in the round; the round's wall time is what the last of
//! them waited for its sync, beyond the interval itself.

use std::time::{Duration, Instant};

use narad_io::dma::DmaStorage;
use narad_io::Storage;
use narad_shards::consume::state::{AckedState, Committer, CommitterConfig, PartitionKey};
use narad_shards::ids::{IncarnationId, Offset, PartitionId};

use crate::measure::{self, Ctx, Prefix, RunResult, Sample};

fn dir(partition: u32) -> String {
    format!("p{partition:05}")
}

fn states(partitions: u32, frontier: u64) -> Vec<(PartitionKey, String, AckedState)> {
    (0..partitions)
        .map(|p| {
            let key = (IncarnationId(1), PartitionId(p));
            let state = AckedState {
                frontier: Offset(frontier),
                ahead: vec![Offset(frontier + 2)],
            };
            (key, dir(p), state)
        })
        .collect()
}

/// Rounds of acks on every one of `partitions` partitions, `syncs_at_once`
/// syncs in flight at most, for `ctx.duration`.
pub async fn run(ctx: Ctx, partitions: u32, syncs_at_once: usize) -> RunResult {
    let storage = DmaStorage::new(&ctx.dir);
    for p in 0..partitions {
        storage.create_dir_all(&dir(p)).await?;
    }
    let config = CommitterConfig {
        syncs_at_once,
        // What a one-shard node holds: a quarter of the descriptors this
        // process may open (32 to 8,192), two a file.
        open_files_max: ((narad_io::rt::open_files_soft_limit() / 4).clamp(32, 8192) / 2) as usize,
        ..CommitterConfig::default()
    };
    let interval = config.durability_interval;
    let mut committer = Committer::new(storage, config);
    // The committer's clock: a whole interval passes between a round's writes
    // and its syncs, whatever the wall clock says.
    let mut now = Instant::now();
    // The first round creates and primes every file: not measured.
    committer.tick(now, states(partitions, 1)).await;
    now += interval;
    committer.tick(now, Vec::new()).await;
    let mut latency = measure::latency_histogram();
    let (mut rounds, mut synced, mut levelled) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    while started.elapsed() < ctx.duration {
        let round = Instant::now();
        now += Duration::from_millis(1);
        let written = committer.tick(now, states(partitions, 2 + rounds)).await;
        now += interval;
        let durable = committer.tick(now, Vec::new()).await;
        measure::record_latency(&mut latency, round.elapsed());
        for report in [&written, &durable] {
            if let Some((_, error)) = report.errors.first() {
                return Err(error.clone().into());
            }
        }
        synced += (written.synced + durable.synced) as u64;
        levelled += (written.levelled + durable.levelled) as u64;
        rounds += 1;
    }
    let elapsed = started.elapsed();
    let closed = committer.close(now, Vec::new()).await;
    if let Some((_, error)) = closed.errors.first() {
        return Err(error.clone().into());
    }
    assert_eq!(
        synced,
        rounds * u64::from(partitions),
        "every partition synced each round"
    );
    let mut sample = Sample::default();
    sample.add("syncs/s", synced as f64 / elapsed.as_secs_f64());
    sample.add("levels/s", levelled as f64 / elapsed.as_secs_f64());
    sample.add_latency(
        Prefix {
            p50: "round_p50_us",
            p99: "round_p99_us",
        },
        &latency,
    );
    Ok(sample)
}
