//! The partition log: durable commits one at a time, and reads from the
//! recent-frame cache and from the device.
//!
//! Runs on the one pinned core. A commit is the whole durable path: encode the
//! frame, write it, `fdatasync`, read it back from the device and verify it, then
//! advance the high watermark. One commit at a time is the worst case for the log
//! (no combining across producers), so its rate is compared with fio's queue-depth-1
//! write+fdatasync at the commit's size. Reads come in two kinds because the log
//! uses O_DIRECT and has no page cache behind it: right behind the high watermark
//! they are served from the cache the commit path fills; an old range after a
//! reopen must come from the device.

use std::time::{Duration, Instant};

use narad_io::dma::DmaStorage;
use narad_io::rt;
use narad_shards::ids::Offset;
use narad_shards::log::{LogConfig, LogError, PartitionLog, ReadItem, RecordRef};

use crate::measure::{self, Ctx, Prefix, RunResult, Sample, PAYLOAD_BYTES};

/// The log's directory inside the run's directory.
const LOG_DIR: &str = "log";
/// Records per commit.
const COMMIT_RECORDS: usize = 64;
/// Records a cache read asks for; they must sit well inside the 1 MiB cache.
const CACHE_READ_RECORDS: usize = 256;
/// Records and bytes a device read asks for.
const DISK_READ_RECORDS: usize = 1024;
const DISK_READ_BYTES_MAX: usize = 1 << 20;
/// Data written before a read benchmark: enough for several sealed segments, so
/// device reads cross segments and load sealed indexes.
const DISK_FILL_BYTES: u64 = 1 << 30;
const DISK_FILL_BYTES_QUICK: u64 = 128 << 20;
/// Data written before the cache benchmark: more than the cache holds.
const CACHE_FILL_BYTES: u64 = 8 << 20;
/// Read benchmarks run at most this long: reads are cheap and stable.
const READ_DURATION_MAX: Duration = Duration::from_secs(10);

const _: () = assert!(CACHE_READ_RECORDS * (PAYLOAD_BYTES + 64) < (1 << 20) / 2);

/// `commit_durable` of 64 x 1 KiB records, back to back, for `ctx.duration`.
pub async fn run_commit(ctx: Ctx) -> RunResult {
    let storage = DmaStorage::new(&ctx.dir);
    let mut log = PartitionLog::open(storage, LOG_DIR, LogConfig::default()).await?;
    let payload = measure::payload(0);
    let records = [RecordRef {
        key: None,
        payload: &payload,
        mask: 0,
    }; COMMIT_RECORDS];
    let mut latency = measure::latency_histogram();
    let mut commits = 0u64;
    let started = Instant::now();
    while started.elapsed() < ctx.duration {
        let issued = Instant::now();
        let offsets = log.commit_durable(&records, rt::unix_ms()).await?;
        measure::record_latency(&mut latency, issued.elapsed());
        assert_eq!(offsets.end.0 - offsets.start.0, COMMIT_RECORDS as u64);
        commits += 1;
    }
    let elapsed = started.elapsed();
    let stats = log.stats();
    log.close().await?;
    let payload_bytes = commits * (COMMIT_RECORDS * PAYLOAD_BYTES) as u64;
    let mut sample = Sample::default();
    sample.add("commits/s", commits as f64 / elapsed.as_secs_f64());
    sample.add(
        "records/s",
        (commits * COMMIT_RECORDS as u64) as f64 / elapsed.as_secs_f64(),
    );
    sample.add("payload_MB/s", measure::mb_per_s(payload_bytes, elapsed));
    sample.add(
        "log/payload",
        stats.size_bytes as f64 / payload_bytes as f64,
    );
    sample.add_latency(
        Prefix {
            p50: "commit_p50_us",
            p99: "commit_p99_us",
        },
        &latency,
    );
    sample.add("segments", stats.segment_count as f64);
    Ok(sample)
}

/// Reads right behind the high watermark, which the cache serves.
pub async fn run_read_cache(ctx: Ctx) -> RunResult {
    let storage = DmaStorage::new(&ctx.dir);
    let mut log = PartitionLog::open(storage, LOG_DIR, LogConfig::default()).await?;
    fill(&mut log, CACHE_FILL_BYTES).await?;
    let cache_bytes = log.stats().cache_bytes;
    assert!(cache_bytes > 0, "the commits filled the cache");
    let from = Offset(log.high_watermark().0 - CACHE_READ_RECORDS as u64);
    let duration = ctx.duration.min(READ_DURATION_MAX);
    let (records, bytes, elapsed) =
        read_for(&mut log, duration, |_| from, CACHE_READ_RECORDS, usize::MAX).await?;
    log.close().await?;
    let mut sample = read_sample(records, bytes, elapsed);
    sample.add("cache_KiB", cache_bytes as f64 / 1024.0);
    Ok(sample)
}

/// Reads the log from offset 0 after a reopen, so every byte comes from the device.
pub async fn run_read_disk(ctx: Ctx) -> RunResult {
    let storage = DmaStorage::new(&ctx.dir);
    let mut log = PartitionLog::open(storage.clone(), LOG_DIR, LogConfig::default()).await?;
    let fill_bytes = if ctx.quick {
        DISK_FILL_BYTES_QUICK
    } else {
        DISK_FILL_BYTES
    };
    fill(&mut log, fill_bytes).await?;
    log.close().await?;
    let mut log = PartitionLog::open(storage, LOG_DIR, LogConfig::default()).await?;
    assert_eq!(
        log.stats().cache_bytes,
        0,
        "a reopened log starts with an empty cache"
    );
    let end = log.high_watermark();
    let segments = log.stats().segment_count;
    let duration = ctx.duration.min(READ_DURATION_MAX);
    // Wrap to the start at the end: the reads never populate the cache, so every
    // pass reads the device again.
    let next = move |at: Offset| if at >= end { Offset(0) } else { at };
    let (records, bytes, elapsed) = read_for(
        &mut log,
        duration,
        next,
        DISK_READ_RECORDS,
        DISK_READ_BYTES_MAX,
    )
    .await?;
    log.close().await?;
    let mut sample = read_sample(records, bytes, elapsed);
    sample.add("segments", segments as f64);
    Ok(sample)
}

/// Commits 64-record batches until the log holds `bytes`.
async fn fill(log: &mut PartitionLog<DmaStorage>, bytes: u64) -> Result<(), LogError> {
    let payload = measure::payload(1);
    let records = [RecordRef {
        key: None,
        payload: &payload,
        mask: 0,
    }; COMMIT_RECORDS];
    while log.stats().size_bytes < bytes {
        log.commit_durable(&records, rt::unix_ms()).await?;
    }
    Ok(())
}

/// Reads for `duration`, each read starting where `next` says given where the
/// previous one ended. Returns records and payload bytes read, and the time taken.
async fn read_for(
    log: &mut PartitionLog<DmaStorage>,
    duration: Duration,
    next: impl Fn(Offset) -> Offset,
    records_max: usize,
    bytes_max: usize,
) -> Result<(u64, u64, Duration), LogError> {
    let mut at = next(Offset(0));
    let (mut records, mut bytes) = (0u64, 0u64);
    let started = Instant::now();
    while started.elapsed() < duration {
        let batch = log.read(at, records_max, bytes_max).await?;
        for item in &batch.items {
            match item {
                ReadItem::Record(record) => bytes += record.payload.len() as u64,
                ReadItem::Corrupt(range) => panic!("corrupt range {range:?} in a fresh log"),
            }
        }
        assert!(
            !batch.items.is_empty(),
            "a read below the high watermark returns records"
        );
        records += batch.items.len() as u64;
        at = next(batch.next_offset);
    }
    Ok((records, bytes, started.elapsed()))
}

fn read_sample(records: u64, bytes: u64, elapsed: Duration) -> Sample {
    let mut sample = Sample::default();
    sample.add("records/s", records as f64 / elapsed.as_secs_f64());
    sample.add("payload_MB/s", measure::mb_per_s(bytes, elapsed));
    sample
}
