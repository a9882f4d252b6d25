//! The dispatch task's memory is bounded in bytes, not only in records: with
//! large records and owners that never answer, it reads a bounded amount per
//! turn and stops reading once the buffers its held records keep alive reach
//! `DriverConfig::held_bytes_max`.

#[path = "dispatch_common/mod.rs"]
mod dispatch_common;

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use narad_io::rt::{run_local, Notify};
use narad_io::sim::{SimDisk, SimFaults};
use narad_shards::ids::{IncarnationId, Offset, PartitionId};
use narad_shards::produce::{
    driver, CommitError, CommitReply, DispatchEnv, DriverConfig, Mode, OwnedRecord,
};
use narad_shards::wal::{IngressRecord, Wal, WalConfig};

use dispatch_common::View;

const PARTITIONS: u32 = 8;
const RECORDS: usize = 400;
const PAYLOAD_BYTES: usize = 64 << 10;
const INCARNATION: IncarnationId = IncarnationId(1);

/// Owners that take every commit and never answer.
#[derive(Default)]
struct Env {
    stopping: Cell<bool>,
    stop: Notify,
    held_max: Cell<u64>,
    committed_bytes: Cell<u64>,
    /// The count the shard's drain tasks share, if they share one, and the
    /// most it read after any turn of this task.
    drain_held: Option<Rc<Cell<u64>>>,
    drain_held_max: Cell<u64>,
}

impl DispatchEnv for Env {
    type View = View;

    fn view(&self) -> View {
        View {
            topic: "big",
            incarnation: INCARNATION,
            partitions: PARTITIONS,
        }
    }

    fn commit(
        &self,
        _: Arc<str>,
        _: IncarnationId,
        _: PartitionId,
        records: Vec<OwnedRecord>,
    ) -> Pin<Box<dyn Future<Output = CommitReply>>> {
        let bytes: usize = records.iter().map(|r| r.payload.len()).sum();
        self.committed_bytes
            .set(self.committed_bytes.get() + bytes as u64);
        Box::pin(std::future::pending())
    }

    fn stopping(&self) -> bool {
        self.stopping.get()
    }

    fn stop_notify(&self) -> &Notify {
        &self.stop
    }

    fn held_bytes(&self, bytes: u64) {
        self.held_max.set(self.held_max.get().max(bytes));
        if let Some(shared) = &self.drain_held {
            self.drain_held_max
                .set(self.drain_held_max.get().max(shared.get()));
        }
    }

    fn drain_held_bytes(&self) -> Option<Rc<Cell<u64>>> {
        self.drain_held.clone()
    }
}

/// Fills a WAL with large records, runs the dispatch task against owners that
/// never answer, and returns the most buffer bytes its held records kept alive.
fn held_max_with(config: DriverConfig) -> u64 {
    run_tasks(config, &[Mode::Own], None)[0].held_max
}

/// What one task's environment saw.
struct Seen {
    held_max: u64,
    drain_held_max: u64,
    /// Payload bytes it sent to owners.
    sent: u64,
}

/// Fills one WAL per task with large records and runs a dispatch task of each
/// `mode` over them (each with an environment of its own, sharing
/// `drain_held`) against owners that never answer; returns what each saw.
fn run_tasks(config: DriverConfig, modes: &[Mode], drain_held: Option<Rc<Cell<u64>>>) -> Vec<Seen> {
    let modes = modes.to_vec();
    run_local(None, async move {
        let disk = SimDisk::new(7, SimFaults::default());
        let mut envs = Vec::new();
        let mut tasks = Vec::new();
        for (i, mode) in modes.into_iter().enumerate() {
            let env = Rc::new(Env {
                drain_held: drain_held.clone(),
                ..Env::default()
            });
            envs.push(env.clone());
            let wal_config = WalConfig {
                segment_bytes_max: 8 << 20,
                ..WalConfig::default()
            };
            let wal = Wal::open(disk.clone(), &format!("ingress/shard-{i}"), wal_config)
                .await
                .unwrap();
            let payload = vec![0x5a; PAYLOAD_BYTES];
            for i in 0..RECORDS {
                let record = IngressRecord {
                    topic: "big",
                    incarnation: INCARNATION,
                    partition: PartitionId(i as u32 % PARTITIONS),
                    accept_time_ms: 1,
                    key: None,
                    payload: &payload,
                };
                wal.append(&record).await.unwrap();
            }
            tasks.push(glommio::spawn_local(driver::run(
                env.clone(),
                wal.clone(),
                format!("memory-{i}"),
                mode,
                config.clone(),
            )));
        }
        narad_io::rt::sleep(Duration::from_millis(300)).await;
        for env in &envs {
            env.stopping.set(true);
            env.stop.notify();
        }
        for task in tasks {
            task.await;
        }
        // (A drain that found the shared budget full may have sent nothing.)
        assert!(
            envs.iter().any(|env| env.committed_bytes.get() > 0),
            "the owners were sent records"
        );
        envs.iter()
            .map(|env| Seen {
                held_max: env.held_max.get(),
                drain_held_max: env.drain_held_max.get(),
                sent: env.committed_bytes.get(),
            })
            .collect()
    })
}

fn config() -> DriverConfig {
    DriverConfig {
        backstop: Duration::from_millis(2),
        stop_grace: Duration::from_millis(20),
        read_bytes_max: 1 << 20,
        held_bytes_max: 4 << 20,
        ..DriverConfig::default()
    }
}

#[test]
fn held_records_keep_a_bounded_number_of_bytes_alive() {
    let held = held_max_with(config());
    // The cap, plus the one read that may cross it (its byte bound and one
    // record more), plus one shared buffer's rounding.
    let bound = (4 << 20) + (1 << 20) + 2 * (PAYLOAD_BYTES as u64) + (1 << 20);
    assert!(
        held > 0 && held <= bound,
        "held buffers peaked at {held} bytes, bound {bound}"
    );
    // Without the cap the same run holds far more: the test can tell.
    let unbounded = held_max_with(DriverConfig {
        held_bytes_max: u64::MAX,
        read_bytes_max: u64::MAX,
        ..config()
    });
    assert!(
        unbounded > 2 * bound,
        "without the caps the run held only {unbounded} bytes: the test no longer tells"
    );
}

/// Tasks draining leftover WALs on one shard share one budget: together they
/// hold what one task may, while the shard's own WAL keeps a budget of its own.
#[test]
fn drains_of_leftover_wals_share_one_budget() {
    let bound = (4 << 20) + (1 << 20) + 2 * (PAYLOAD_BYTES as u64) + (1 << 20);
    let drains = [Mode::Drain, Mode::Drain, Mode::Drain];
    let shared = run_tasks(config(), &drains, Some(Rc::new(Cell::new(0))));
    let together = shared.iter().map(|s| s.drain_held_max).max().unwrap();
    assert!(
        together > 0 && together <= bound,
        "three drains held {together} bytes together, bound {bound}"
    );
    // Counting alone, each fills a budget of its own: the test can tell.
    let alone: u64 = run_tasks(config(), &drains, None)
        .iter()
        .map(|s| s.held_max)
        .sum();
    assert!(
        alone > bound + bound / 2,
        "alone, three drains held only {alone}"
    );
    // The own WAL's task fills its own budget beside drains that fill theirs.
    let mixed = [Mode::Drain, Mode::Drain, Mode::Own];
    let seen = run_tasks(config(), &mixed, Some(Rc::new(Cell::new(0))));
    let drains_held = seen[0].drain_held_max.max(seen[1].drain_held_max);
    assert!(
        drains_held >= (4 << 20),
        "the drains held only {drains_held} bytes"
    );
    assert!(
        seen[2].held_max >= (4 << 20) && seen[2].sent > 0,
        "the own task held {} bytes and sent {}",
        seen[2].held_max,
        seen[2].sent
    );
}

/// Owners that fail every commit to partitions below `failing` at once and
/// take every other commit at once.
#[derive(Default)]
struct ProbeEnv {
    failing: u32,
    stopping: Cell<bool>,
    stop: Notify,
    /// Records the healthy partitions took.
    committed: Cell<usize>,
    /// The held bytes after the latest turn.
    held_now: Cell<u64>,
}

impl DispatchEnv for ProbeEnv {
    type View = View;

    fn view(&self) -> View {
        View {
            topic: "wide",
            incarnation: INCARNATION,
            partitions: self.failing + 1,
        }
    }

    fn commit(
        &self,
        _: Arc<str>,
        _: IncarnationId,
        partition: PartitionId,
        records: Vec<OwnedRecord>,
    ) -> Pin<Box<dyn Future<Output = CommitReply>>> {
        let reply = if partition.0 < self.failing {
            Err(CommitError::Failed("injected".into()))
        } else {
            self.committed.set(self.committed.get() + records.len());
            Ok(Offset(0)..Offset(records.len() as u64))
        };
        Box::pin(std::future::ready(reply))
    }

    fn stopping(&self) -> bool {
        self.stopping.get()
    }

    fn stop_notify(&self) -> &Notify {
        &self.stop
    }

    fn held_bytes(&self, bytes: u64) {
        self.held_now.set(bytes);
    }
}

/// A failing partition keeps one record as its probe for as long as it fails.
/// The probe keeps only its own bytes alive, not the shared read buffer it
/// was read into: probes of many failing partitions, each read far from the
/// others, must not fill the held-bytes budget and stall the healthy ones.
#[test]
fn a_failing_partitions_probe_keeps_only_its_own_bytes() {
    const FAILING: u32 = 32;
    const HEALTHY_BETWEEN: usize = 256;
    const RECORD_BYTES: usize = 4 << 10;
    let (committed, held) = run_local(None, async move {
        let disk = SimDisk::new(11, SimFaults::default());
        let env = Rc::new(ProbeEnv {
            failing: FAILING,
            ..ProbeEnv::default()
        });
        let wal = Wal::open(disk, "ingress/shard-0", WalConfig::default())
            .await
            .unwrap();
        let payload = vec![0xa5; RECORD_BYTES];
        let record = |partition: u32| IngressRecord {
            topic: "wide",
            incarnation: INCARNATION,
            partition: PartitionId(partition),
            accept_time_ms: 1,
            key: None,
            payload: &payload,
        };
        // One record of each failing partition, a megabyte of healthy
        // records between each two: every probe lands in a read buffer
        // of its own.
        for failing in 0..FAILING {
            let mut batch = vec![record(failing)];
            batch.extend((0..HEALTHY_BETWEEN).map(|_| record(FAILING)));
            wal.append_many(&batch).await.unwrap();
        }
        let task = glommio::spawn_local(driver::run(
            env.clone(),
            wal.clone(),
            "probes".into(),
            Mode::Own,
            DriverConfig {
                backstop: Duration::from_millis(2),
                stop_grace: Duration::from_millis(20),
                read_bytes_max: 1 << 20,
                held_bytes_max: 2 << 20,
                ..DriverConfig::default()
            },
        ));
        let healthy = FAILING as usize * HEALTHY_BETWEEN;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while env.committed.get() < healthy && std::time::Instant::now() < deadline {
            narad_io::rt::sleep(Duration::from_millis(5)).await;
        }
        narad_io::rt::sleep(Duration::from_millis(20)).await;
        let seen = (env.committed.get(), env.held_now.get());
        env.stopping.set(true);
        env.stop.notify();
        task.await;
        seen
    });
    let healthy = FAILING as usize * HEALTHY_BETWEEN;
    assert_eq!(
        committed, healthy,
        "the healthy partition took {committed} of {healthy} records: probes stalled the reads"
    );
    let bound = FAILING as u64 * (RECORD_BYTES as u64 + 512);
    assert!(
        held <= bound,
        "{FAILING} probes keep {held} bytes of read buffers alive, bound {bound}"
    );
}
