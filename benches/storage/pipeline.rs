//! The produce path below HTTP: appenders stage batches into the ingress WAL,
//! and the shard's real dispatch task (`driver::run`) commits the durable
//! records to the real commit combiner and partition logs, all on the one
//! pinned core, as a shard runs them.
//!
//! What it is for: a batch produce's broker CPU is about half this path (WAL
//! staging, the dispatcher's reads and bookkeeping, the owner's encode, write,
//! read-back and check), and `benches/ab.sh` measures it only through HTTP,
//! JSON and a load generator on the other core, whose noise (a few percent
//! from one run to the next) hides a change of one or two. Here the core's CPU
//! time per committed record is the figure (`cpu_us/record`), beside the
//! committed rate and how far the commits trail the appends at the end.
//!
//! The appenders are `--appenders` tasks of `append_many` of 100 records of
//! [`PAYLOAD_BYTES`](crate::measure::PAYLOAD_BYTES) spread over [`PARTITIONS`] partitions, as 64 clients of
//! batch produce send them. The owner's metadata is a fixed single topic.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_channel::oneshot;
use narad_io::dma::DmaStorage;
use narad_io::rt::{self, Notify};
use narad_shards::dispatch::{Cluster, OwnerId, TopicMeta};
use narad_shards::ids::{IncarnationId, PartitionId};
use narad_shards::log::LogConfig;
use narad_shards::produce::{
    driver, CommitError, CommitReply, DispatchEnv, DriverConfig, Mode, OwnedRecord, Owner,
};
use narad_shards::wal::{IngressRecord, Wal, WalConfig, WalError};

use crate::measure::{self, Ctx, RunResult, Sample};

/// The topic every record goes to, and its incarnation.
const TOPIC: &str = "bench-topic";
const INCARNATION: IncarnationId = IncarnationId(1);
/// Partitions of the topic (as `narad bench` creates them).
pub const PARTITIONS: u32 = 6;
/// Records per `append_many`, as one batch produce request.
const BATCH_RECORDS: usize = 100;
/// How long the end of a run waits for the commits to catch up.
const DRAIN_MAX: Duration = Duration::from_secs(30);

/// The one topic, owned by this shard.
struct View;

impl Cluster for View {
    fn topic(&self, name: &str) -> Option<TopicMeta> {
        (name == TOPIC).then_some(TopicMeta {
            incarnation: INCARNATION,
            partitions: PARTITIONS,
        })
    }
    fn owner(&self, topic: &str, partition: PartitionId) -> Option<OwnerId> {
        (topic == TOPIC && partition.0 < PARTITIONS).then_some(OwnerId { node: 0, shard: 0 })
    }
    fn is_alive(&self, _: OwnerId) -> bool {
        true
    }
    fn is_local(&self, _: OwnerId) -> bool {
        true
    }
}

/// Commits go straight to this shard's combiner; counts what they committed.
struct Env {
    owner: Rc<Owner<DmaStorage>>,
    committed: Rc<Cell<u64>>,
    stopping: Cell<bool>,
    stop: Notify,
}

impl DispatchEnv for Env {
    type View = View;

    fn view(&self) -> View {
        View
    }

    fn commit(
        &self,
        topic: Arc<str>,
        incarnation: IncarnationId,
        partition: PartitionId,
        records: Vec<OwnedRecord>,
    ) -> Pin<Box<dyn Future<Output = CommitReply>>> {
        let (reply, answer) = oneshot::channel();
        self.owner
            .commit(topic, incarnation, partition, records, reply);
        let committed = self.committed.clone();
        Box::pin(async move {
            let outcome = answer.await.unwrap_or_else(|_| {
                Err(CommitError::Failed("the owner dropped the commit".into()))
            });
            if let Ok(range) = &outcome {
                committed.set(committed.get() + (range.end.0 - range.start.0));
            }
            outcome
        })
    }

    fn stopping(&self) -> bool {
        self.stopping.get()
    }

    fn stop_notify(&self) -> &Notify {
        &self.stop
    }
}

/// One run: a fresh WAL and partition logs, `appenders` appenders for
/// `ctx.duration`, then the commits' catch-up.
pub async fn run(ctx: Ctx, appenders: usize) -> RunResult {
    let storage = DmaStorage::new(&ctx.dir);
    let wal = Wal::open(storage.clone(), "wal", WalConfig::default()).await?;
    let live: narad_shards::produce::Liveness =
        Box::new(|topic: &str, id: IncarnationId, p: PartitionId| {
            topic == TOPIC && id == INCARNATION && p.0 < PARTITIONS
        });
    let owner = Owner::new(storage, LogConfig::default(), live);
    let env = Rc::new(Env {
        owner: owner.clone(),
        committed: Rc::default(),
        stopping: Cell::new(false),
        stop: Notify::default(),
    });
    let dispatch = rt::spawn_local(driver::run(
        env.clone(),
        wal.clone(),
        "bench".to_string(),
        Mode::Own,
        DriverConfig::default(),
    ));
    let rss_start_bytes = measure::proc_status_bytes("VmRSS");
    let usage_before = measure::thread_usage();
    let committed_before = env.committed.get();
    let started = Instant::now();
    let deadline = started + ctx.duration;
    let tasks: Vec<_> = (0..appenders)
        .map(|i| rt::spawn_local(append_loop(wal.clone(), i, deadline)))
        .collect();
    let mut appended = 0u64;
    for task in tasks {
        appended += task.await.ok_or(WalError::Closed)??;
    }
    let elapsed = started.elapsed();
    let committed = env.committed.get() - committed_before;
    let cpu = measure::thread_usage().cpu.saturating_sub(usage_before.cpu);
    let mut sample = Sample::default();
    let secs = elapsed.as_secs_f64();
    sample.add("records/s", appended as f64 / secs);
    sample.add("committed/s", committed as f64 / secs);
    sample.add(
        "cpu_us/record",
        cpu.as_secs_f64() * 1e6 / committed.max(1) as f64,
    );
    sample.add("behind_at_end", (appended - committed) as f64);
    // The commits catch up before the stop, so that every run ends alike.
    let drain_deadline = Instant::now() + DRAIN_MAX;
    while env.committed.get() - committed_before < appended && Instant::now() < drain_deadline {
        rt::sleep(Duration::from_millis(5)).await;
    }
    let caught_up = env.committed.get() - committed_before >= appended;
    sample.add(
        "rss_MiB_peak_delta",
        measure::mib(measure::proc_status_bytes("VmHWM").saturating_sub(rss_start_bytes)),
    );
    env.stopping.set(true);
    env.stop.notify();
    dispatch.await;
    owner.close_all().await;
    wal.close().await;
    if !caught_up {
        return Err(format!("the commits did not catch up with {appended} records").into());
    }
    Ok(sample)
}

/// One appender: `append_many` of the same batch until the deadline. Returns
/// the records it made durable.
async fn append_loop(
    wal: Wal<DmaStorage>,
    index: usize,
    deadline: Instant,
) -> Result<u64, WalError> {
    let payload = measure::payload(index);
    let batch: Vec<IngressRecord<'_>> = (0..BATCH_RECORDS)
        .map(|j| IngressRecord {
            topic: TOPIC,
            incarnation: INCARNATION,
            partition: PartitionId(((index + j) % PARTITIONS as usize) as u32),
            accept_time_ms: rt::unix_ms(),
            key: None,
            payload: &payload,
        })
        .collect();
    let mut records = 0;
    while Instant::now() < deadline {
        let seqs = wal.append_many(&batch).await?;
        records += seqs.end.0 - seqs.start.0;
    }
    Ok(records)
}
