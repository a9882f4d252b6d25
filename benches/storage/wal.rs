//! The ingress WAL under sustained load: N appenders, a model dispatcher, and the
//! upkeep (checkpoint, compaction, segment preparation) all running at once.
//!
//! Runs on the one pinned core, as a shard would. Each appender owns one payload
//! buffer and one batch of records built once, so the hot loop allocates nothing
//! per record; the WAL copies each frame into its staging buffer, as in
//! production. The dispatcher reads only durable records, marks them done in a
//! [`DispatchProgress`] and stores the checkpoint after every read, so segments
//! are compacted and recycled during the measurement and disk use must stay
//! bounded. Without it the WAL would only grow and the figures would leave out
//! the cost of reading back and rolling.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_lite::future;
use hdrhistogram::Histogram;
use narad_io::dma::DmaStorage;
use narad_io::rt;
use narad_shards::ids::{IncarnationId, PartitionId};
use narad_shards::wal::{DispatchProgress, IngressRecord, Wal, WalConfig, WalError, WalStats};

use crate::measure::{self, Ctx, Prefix, RunResult, Sample, PAYLOAD_BYTES};

/// The WAL's directory inside the run's directory.
const WAL_DIR: &str = "wal";
/// Records the dispatcher takes per read.
const DISPATCH_READ_RECORDS_MAX: usize = 4096;
/// How often an idle dispatcher looks whether the run ended.
const DISPATCH_IDLE_POLL: Duration = Duration::from_millis(5);
/// Topic name every record carries (its length sets the frame overhead).
const TOPIC: &str = "bench-topic";

/// The shape of one WAL benchmark.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    /// Concurrent appender tasks.
    pub appenders: usize,
    /// Records per `append_many` call (1: plain `append`-sized calls).
    pub batch_records: usize,
}

/// What the appenders report back.
struct Appended {
    records: u64,
    latency: Histogram<u64>,
}

/// One run: opens a fresh WAL, drives the load for `ctx.duration`, and reports.
pub async fn run(ctx: Ctx, load: Load) -> RunResult {
    assert!(load.appenders > 0 && load.batch_records > 0);
    let rss_start_bytes = measure::proc_status_bytes("VmRSS");
    let storage = DmaStorage::new(&ctx.dir);
    let wal = Wal::open(storage, WAL_DIR, WalConfig::default()).await?;
    let stop = Rc::new(Cell::new(false));
    let dispatcher = ctx
        .dispatch
        .then(|| rt::spawn_local(dispatch(wal.clone(), stop.clone())));
    let before = wal.stats();
    let read_bytes_before = measure::proc_io_bytes("read_bytes");
    let started = Instant::now();
    let appended = append_all(&wal, load, started + ctx.duration).await?;
    let elapsed = started.elapsed();
    let after = wal.stats();
    let read_bytes = measure::proc_io_bytes("read_bytes") - read_bytes_before;
    stop.set(true);
    if let Some(dispatcher) = dispatcher {
        let dispatched = dispatcher.await.ok_or("dispatcher task vanished")??;
        assert_eq!(dispatched, wal.next_seq().0, "every record was dispatched");
    }
    assert_eq!(appended.records, after.records - before.records);
    let rss_end_bytes = measure::proc_status_bytes("VmRSS");
    let segments = wal.segment_count();
    let (files, disk_bytes) = measure::dir_usage(&ctx.dir.join(WAL_DIR))?;
    wal.close().await;
    let mut sample = report(&appended, &before, &after, elapsed, load);
    let payload_bytes = appended.records * PAYLOAD_BYTES as u64;
    sample.add(
        "read/payload",
        read_bytes as f64 / payload_bytes.max(1) as f64,
    );
    sample.add("segments", segments as f64);
    sample.add("wal_files", files as f64);
    sample.add("disk_MiB", measure::mib(disk_bytes));
    sample.add("rss_start_MiB", measure::mib(rss_start_bytes));
    sample.add("rss_end_MiB", measure::mib(rss_end_bytes));
    Ok(sample)
}

/// Spawns the appenders, waits for all of them, and merges their figures.
async fn append_all(
    wal: &Wal<DmaStorage>,
    load: Load,
    deadline: Instant,
) -> Result<Appended, WalError> {
    let latency = Rc::new(RefCell::new(measure::latency_histogram()));
    let tasks: Vec<_> = (0..load.appenders)
        .map(|i| {
            rt::spawn_local(append_loop(
                wal.clone(),
                i,
                load.batch_records,
                deadline,
                latency.clone(),
            ))
        })
        .collect();
    let mut records = 0;
    for task in tasks {
        records += task.await.ok_or(WalError::Closed)??;
    }
    let latency = latency.borrow().clone();
    Ok(Appended { records, latency })
}

/// One appender: `append_many` of the same batch until the deadline. Returns the
/// records it made durable.
async fn append_loop(
    wal: Wal<DmaStorage>,
    index: usize,
    batch_records: usize,
    deadline: Instant,
    latency: Rc<RefCell<Histogram<u64>>>,
) -> Result<u64, WalError> {
    let payload = measure::payload(index);
    let record = IngressRecord {
        topic: TOPIC,
        incarnation: IncarnationId(1),
        partition: PartitionId((index % 4) as u32),
        accept_time_ms: rt::unix_ms(),
        key: None,
        payload: &payload,
    };
    let batch = vec![record; batch_records];
    let mut records = 0;
    while Instant::now() < deadline {
        let issued = Instant::now();
        let seqs = wal.append_many(&batch).await?;
        measure::record_latency(&mut latency.borrow_mut(), issued.elapsed());
        assert_eq!(seqs.end.0 - seqs.start.0, batch_records as u64);
        records += batch_records as u64;
    }
    Ok(records)
}

/// The model dispatcher: reads durable records in order, marks each done and
/// stores the checkpoint, until told to stop and caught up. Returns the records
/// it dispatched.
async fn dispatch(wal: Wal<DmaStorage>, stop: Rc<Cell<bool>>) -> Result<u64, WalError> {
    let mut progress = DispatchProgress::new(wal.checkpoint());
    let mut reader = wal.reader(progress.checkpoint());
    let mut dispatched = 0u64;
    loop {
        let read = reader
            .read(DISPATCH_READ_RECORDS_MAX, |seq, record| {
                assert_eq!(record.payload_vec().len(), PAYLOAD_BYTES);
                progress.mark_done(seq);
            })
            .await?;
        if read > 0 {
            dispatched += read as u64;
            wal.store_checkpoint(progress.checkpoint());
            rt::yield_now().await;
            continue;
        }
        if stop.get() && reader.position() >= wal.durable_next() {
            return Ok(dispatched);
        }
        // The timer only matters at the end of the run, when no append will come.
        future::or(
            wal.wait_durable_past(reader.position()),
            rt::sleep(DISPATCH_IDLE_POLL),
        )
        .await;
    }
}

/// The figures of one run from the appenders' counts and the WAL's counters.
fn report(
    appended: &Appended,
    before: &WalStats,
    after: &WalStats,
    elapsed: Duration,
    load: Load,
) -> Sample {
    let secs = elapsed.as_secs_f64();
    let records = (after.records - before.records) as f64;
    let syncs = (after.syncs - before.syncs) as f64;
    let device_bytes = (after.device_bytes - before.device_bytes) as f64;
    let payload_bytes = records * PAYLOAD_BYTES as f64;
    let mut sample = Sample::default();
    sample.add("records/s", appended.records as f64 / secs);
    // A durable (O_DSYNC) write counts as a sync: it carries its own.
    sample.add("syncs/s", syncs / secs);
    sample.add("records/sync", records / syncs.max(1.0));
    sample.add("payload_MB/s", payload_bytes / 1e6 / secs);
    sample.add("device_MB/s", device_bytes / 1e6 / secs);
    sample.add("device/payload", device_bytes / payload_bytes.max(1.0));
    let frame_bytes = (after.frame_bytes - before.frame_bytes) as f64;
    sample.add("device/frame", device_bytes / frame_bytes.max(1.0));
    let prefix = if load.batch_records == 1 {
        Prefix {
            p50: "append_p50_us",
            p99: "append_p99_us",
        }
    } else {
        Prefix {
            p50: "batch_p50_us",
            p99: "batch_p99_us",
        }
    };
    sample.add_latency(prefix, &appended.latency);
    // The WAL's counters over the measured phase.
    let counted = [
        ("rolls", after.rolls - before.rolls),
        (
            "prepared_rolls",
            after.prepared_rolls - before.prepared_rolls,
        ),
        (
            "recycled",
            after.segments_recycled - before.segments_recycled,
        ),
        (
            "zero_filled",
            after.segments_zero_filled - before.segments_zero_filled,
        ),
        ("compactions", after.compactions - before.compactions),
        (
            "checkpoint_syncs",
            after.checkpoint_syncs - before.checkpoint_syncs,
        ),
    ];
    for (name, count) in counted {
        sample.add(name, count as f64);
    }
    sample
}
