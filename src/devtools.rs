//! `narad debug wal-writer`: the process the crash tests kill.
//!
//! It runs the storage engine's produce path without HTTP on one executor: many
//! appenders write records into an ingress WAL, a dispatcher reads the durable ones
//! and commits them into one partition log (fsync, read-back, verify), then moves
//! the checkpoint so the WAL compacts and recycles. Every append that returned
//! success is printed as a line `a <id>` on stdout; the test records those lines
//! itself, kills the process with SIGKILL at a moment of its choosing, and checks
//! that every id it saw is in the partition log or still in the WAL.
//!
//! Payloads are derived from the record id ([`payload_for`], from the shards'
//! testkit), so the checker needs no table to tell an intact payload from a
//! corrupt one.

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::rc::Rc;
use std::time::{Duration, Instant};

use narad_io::dma::DmaStorage;
use narad_io::Storage;
use narad_shards::ids::{IncarnationId, PartitionId, Seq};
use narad_shards::log::{LogConfig, PartitionLog, RecordRef};
use narad_shards::wal::{DispatchProgress, IngressRecord, Wal, WalConfig};

use crate::cli::WalWriterArgs;
pub use narad_shards::testkit::{check_payload, payload_for};

/// How often acknowledged ids are written to stdout.
const ACK_FLUSH_INTERVAL: Duration = Duration::from_millis(5);
/// Records the dispatcher commits at most in one partition commit.
const DISPATCH_BATCH_RECORDS_MAX: usize = 512;

/// The directory layout the writer and its checker share.
pub const WAL_DIR: &str = "wal";
/// Partitions the writer commits to, each a log directory `log-<p>`.
pub const WRITER_PARTITIONS: usize = 4;

/// The log directory of one of the writer's partitions.
pub fn log_dir(partition: usize) -> String {
    format!("log-{partition}")
}

/// The partition log settings of the writer: small segments, so rolls happen,
/// and `prep_chunk_bytes` of zeros written ahead of the commits (0: none).
pub fn writer_log_config(prep_chunk_bytes: u64) -> LogConfig {
    LogConfig {
        segment_bytes_max: 1 << 20,
        prep_chunk_bytes,
        ..LogConfig::default()
    }
}

/// Runs the writer until `args.seconds` pass (or it is killed).
pub fn wal_writer(args: WalWriterArgs) -> Result<(), String> {
    narad_io::rt::run_local(None, async move {
        let storage = DmaStorage::new(&args.dir);
        let config = WalConfig {
            segment_bytes_max: args.segment_bytes,
            ..WalConfig::default()
        };
        let wal = Wal::open(storage.clone(), WAL_DIR, config)
            .await
            .map_err(|e| e.to_string())?;
        let mut logs = Vec::new();
        for partition in 0..WRITER_PARTITIONS {
            let dir = log_dir(partition);
            storage
                .create_dir_all(&dir)
                .await
                .map_err(|e| e.to_string())?;
            let log = PartitionLog::open(
                storage.clone(),
                &dir,
                writer_log_config(args.log_prep_chunk_bytes),
            );
            logs.push(log.await.map_err(|e| e.to_string())?);
        }
        let acked = Rc::new(RefCell::new(Vec::<u8>::new()));
        let next_id = Rc::new(Cell::new(args.id_base));
        let deadline = Instant::now() + Duration::from_secs(args.seconds);
        let slow = Duration::from_millis(args.slow_commit_ms);
        glommio::spawn_local(dispatch(wal.clone(), logs, slow)).detach();
        glommio::spawn_local(print_acks(acked.clone())).detach();
        let mut appenders = Vec::new();
        for _ in 0..args.appenders {
            let (wal, acked, next_id) = (wal.clone(), acked.clone(), next_id.clone());
            appenders.push(glommio::spawn_local(async move {
                while Instant::now() < deadline {
                    let id = next_id.get();
                    next_id.set(id + 1);
                    let payload = payload_for(id, args.size);
                    let record = IngressRecord {
                        topic: "crash",
                        incarnation: IncarnationId(1),
                        partition: PartitionId((id % WRITER_PARTITIONS as u64) as u32),
                        accept_time_ms: narad_io::rt::unix_ms(),
                        key: None,
                        payload: &payload,
                    };
                    if wal.append(&record).await.is_err() {
                        return;
                    }
                    writeln!(acked.borrow_mut(), "a {id}").expect("writing to memory");
                }
            }));
        }
        for appender in appenders {
            appender.await;
        }
        wal.close().await;
        Ok(())
    })
}

async fn print_acks(acked: Rc<RefCell<Vec<u8>>>) {
    loop {
        narad_io::rt::sleep(ACK_FLUSH_INTERVAL).await;
        let lines = std::mem::take(&mut *acked.borrow_mut());
        let mut out = std::io::stdout().lock();
        if out.write_all(&lines).and_then(|()| out.flush()).is_err() {
            return;
        }
    }
}

/// Records waiting for one partition's next commit, with their WAL sequence numbers.
type PartitionQueue = Rc<RefCell<Vec<(Seq, Vec<u8>)>>>;

/// A small dispatcher: the reader hands each durable record to its partition's
/// queue, and each partition commits its queue in batches, one commit at a time.
/// Partitions commit concurrently, so commits land out of order, and the
/// checkpoint must stay at the first record whose commit has not landed.
async fn dispatch(wal: Wal<DmaStorage>, logs: Vec<PartitionLog<DmaStorage>>, slow: Duration) {
    let progress = Rc::new(RefCell::new(DispatchProgress::new(wal.checkpoint())));
    let queues: Vec<PartitionQueue> = (0..logs.len()).map(|_| Rc::default()).collect();
    let wake = Rc::new(glommio::sync::Semaphore::new(0));
    for (partition, (log, queue)) in logs.into_iter().zip(&queues).enumerate() {
        let (wal, progress, queue, wake) =
            (wal.clone(), progress.clone(), queue.clone(), wake.clone());
        let delay = if partition == 0 { slow } else { Duration::ZERO };
        glommio::spawn_local(commit_partition(wal, log, queue, progress, wake, delay)).detach();
    }
    let mut reader = wal.reader(wal.checkpoint());
    loop {
        let read = reader
            .read(DISPATCH_BATCH_RECORDS_MAX, |seq, record| {
                let partition = record.partition.0 as usize % queues.len();
                queues[partition]
                    .borrow_mut()
                    .push((seq, record.payload_vec()));
            })
            .await;
        match read {
            Err(e) => {
                tracing::error!(error = %e, "dispatch read failed");
                return;
            }
            Ok(0) => {
                let position = reader.position();
                futures_lite::future::or(
                    wal.wait_durable_past(position),
                    narad_io::rt::sleep(Duration::from_millis(50)),
                )
                .await;
            }
            Ok(_) => wake.signal(queues.len() as u64),
        }
    }
}

async fn commit_partition(
    wal: Wal<DmaStorage>,
    mut log: PartitionLog<DmaStorage>,
    queue: PartitionQueue,
    progress: Rc<RefCell<DispatchProgress>>,
    wake: Rc<glommio::sync::Semaphore>,
    delay: Duration,
) {
    loop {
        let batch = std::mem::take(&mut *queue.borrow_mut());
        if batch.is_empty() {
            if wake.acquire(1).await.is_err() {
                return;
            }
            continue;
        }
        if !delay.is_zero() {
            narad_io::rt::sleep(delay).await;
        }
        let records: Vec<RecordRef<'_>> = batch
            .iter()
            .map(|(_, p)| RecordRef {
                key: None,
                payload: p,
                mask: 0,
            })
            .collect();
        if let Err(e) = log.commit_durable(&records, narad_io::rt::unix_ms()).await {
            tracing::error!(error = %e, "partition commit failed");
            return;
        }
        let checkpoint = {
            let mut progress = progress.borrow_mut();
            for (seq, _) in &batch {
                progress.mark_done(*seq);
            }
            progress.checkpoint()
        };
        wal.store_checkpoint(checkpoint);
    }
}
