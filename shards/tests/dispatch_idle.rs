//! An idle dispatch task sleeps: with nothing held and no commit in flight it
//! waits for a record to become durable (or a deadline, or the stop) instead of
//! turning every 10 ms, and a record appended after a long idle spell is still
//! dispatched at once, woken by the WAL rather than found by the backstop.

#[path = "dispatch_common/mod.rs"]
mod dispatch_common;

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use narad_io::rt::{run_local, Notify};
use narad_io::sim::{SimDisk, SimFaults};
use narad_shards::ids::{IncarnationId, Offset, PartitionId};
use narad_shards::produce::{driver, CommitReply, DispatchEnv, DriverConfig, Mode, OwnedRecord};
use narad_shards::wal::{IngressRecord, Wal, WalConfig};

use dispatch_common::View;

const INCARNATION: IncarnationId = IncarnationId(1);
const PARTITIONS: u32 = 4;

/// Owners that commit everything at once; counts the task's turns (each turn
/// takes one view of the cluster) and the records committed.
#[derive(Default)]
struct Env {
    stopping: Cell<bool>,
    stop: Notify,
    turns: Cell<u64>,
    committed: Cell<u64>,
    next_offset: Cell<u64>,
}

impl DispatchEnv for Env {
    type View = View;

    fn view(&self) -> View {
        self.turns.set(self.turns.get() + 1);
        View {
            topic: "idle",
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
        let count = records.len() as u64;
        self.committed.set(self.committed.get() + count);
        let start = self.next_offset.get();
        self.next_offset.set(start + count);
        Box::pin(std::future::ready(Ok(Offset(start)..Offset(start + count))))
    }

    fn stopping(&self) -> bool {
        self.stopping.get()
    }

    fn stop_notify(&self) -> &Notify {
        &self.stop
    }
}

fn record(partition: u32, payload: &[u8]) -> IngressRecord<'_> {
    IngressRecord {
        topic: "idle",
        incarnation: INCARNATION,
        partition: PartitionId(partition % PARTITIONS),
        accept_time_ms: 1,
        key: None,
        payload,
    }
}

/// Waits until `env` has committed `count` records; the time it took.
async fn committed(env: &Env, count: u64) -> Duration {
    let started = Instant::now();
    while env.committed.get() < count {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{} of {count} records committed after 10 s",
            env.committed.get()
        );
        narad_io::rt::sleep(Duration::from_millis(1)).await;
    }
    started.elapsed()
}

#[test]
fn an_idle_dispatcher_sleeps_and_still_dispatches_at_once() {
    run_local(None, async {
        let disk = SimDisk::new(11, SimFaults::default());
        let wal = Wal::open(disk, "ingress/shard-0", WalConfig::default())
            .await
            .unwrap();
        let env = Rc::new(Env::default());
        let task = glommio::spawn_local(driver::run(
            env.clone(),
            wal.clone(),
            "idle".into(),
            Mode::Own,
            DriverConfig::default(),
        ));
        for i in 0..20 {
            wal.append(&record(i, b"before")).await.unwrap();
        }
        committed(&env, 20).await;
        // Let the commits' outcomes and the checkpoint settle, then idle.
        narad_io::rt::sleep(Duration::from_millis(50)).await;
        let turns_before = env.turns.get();
        narad_io::rt::sleep(Duration::from_millis(500)).await;
        let idle_turns = env.turns.get() - turns_before;
        assert!(
            idle_turns <= 3,
            "an idle dispatch task turned {idle_turns} times in 500 ms"
        );
        // After the idle spell a new record is dispatched at once.
        for round in 0..3u64 {
            wal.append(&record(round as u32, b"after")).await.unwrap();
            let took = committed(&env, 21 + round).await;
            assert!(
                took < Duration::from_millis(200),
                "a record appended after an idle spell waited {took:?} for its commit"
            );
            narad_io::rt::sleep(Duration::from_millis(300)).await;
        }
        env.stopping.set(true);
        env.stop.notify();
        task.await;
    });
}
