//! The commit combiner: batches that queue for a partition while a commit runs
//! share the next commit (one write, one sync), each answered its own
//! consecutive offsets; every batch of a cycle gets the cycle's outcome, a
//! failed sync included.
//!
//! The logs here prepare no zeros (`prep_chunk_bytes` 0), so every commit is
//! one write on the simulated disk, made durable by a sync of its own or as a
//! durable write (whose sync the disk counts apart); each sync stays in flight
//! for a few executor turns, so batches can be queued while one is out.

use std::rc::Rc;
use std::time::Duration;

use futures_channel::oneshot;
use narad_io::rt::{run_local, sleep, yield_now};
use narad_io::sim::{SimDisk, SimFaults, SimStats};
use narad_shards::ids::{IncarnationId, Offset, PartitionId};
use narad_shards::log::LogConfig;
use narad_shards::produce::{CommitError, CommitReply, Owner};

use super::common::{keyless, payloads_of, topic, TOPIC};

const ID: IncarnationId = IncarnationId(0xc0b1);

fn owner(disk: &SimDisk) -> Rc<Owner<SimDisk>> {
    let config = LogConfig {
        segment_bytes_max: 1 << 20,
        prep_chunk_bytes: 0,
        ..LogConfig::default()
    };
    let live =
        Box::new(|t: &str, id: IncarnationId, p: PartitionId| t == TOPIC && id == ID && p.0 == 0);
    Owner::with_reopen_backoff(disk.clone(), config, live, Duration::from_millis(5))
}

/// Queues a batch of `count` keyless records tagged `tag` for partition 0;
/// returns where its answer comes.
fn queue(owner: &Rc<Owner<SimDisk>>, tag: &str, count: usize) -> oneshot::Receiver<CommitReply> {
    let payloads: Vec<String> = (0..count).map(|i| format!("{tag}-{i}")).collect();
    let (reply, answer) = oneshot::channel();
    owner.commit(topic(), ID, PartitionId(0), keyless(&payloads), reply);
    answer
}

/// Writes made durable so far: synced ones and durable writes.
fn durable(stats: &SimStats) -> u64 {
    stats.syncs + stats.durable_writes
}

#[test]
fn batches_queued_while_a_commit_runs_share_the_next_one() {
    let disk = SimDisk::new(11, SimFaults::default());
    run_local(None, async move {
        let owner = owner(&disk);
        // The log is opened (and its first segment made) by a first commit.
        queue(&owner, "w", 1).await.unwrap().expect("committed");
        disk.set_sync_turns(20);
        let before = disk.stats();

        let a = queue(&owner, "a", 1);
        // The cycle for `a` takes the queue at once and then waits on its
        // sync, out for 20 turns: the three batches below queue behind it.
        for _ in 0..3 {
            yield_now().await;
        }
        let b = queue(&owner, "b", 2);
        let c = queue(&owner, "c", 3);
        let d = queue(&owner, "d", 1);

        let mut ranges = Vec::new();
        for answer in [a, b, c, d] {
            ranges.push(answer.await.expect("answered").expect("committed"));
        }
        assert_eq!(
            ranges,
            [
                Offset(1)..Offset(2),
                Offset(2)..Offset(4),
                Offset(4)..Offset(7),
                Offset(7)..Offset(8),
            ],
            "each batch its own offsets, in the order queued"
        );
        let after = disk.stats();
        assert_eq!(
            (
                durable(&after) - durable(&before),
                after.writes - before.writes
            ),
            (2, 2),
            "one commit for `a`, one shared by the three queued behind it"
        );
        assert_eq!(
            payloads_of(&owner, ID, 0).await,
            ["w-0", "a-0", "b-0", "b-1", "c-0", "c-1", "c-2", "d-0"]
        );
    });
}

#[test]
fn every_batch_of_a_cycle_gets_its_failure() {
    let disk = SimDisk::new(12, SimFaults::default());
    run_local(None, async move {
        let owner = owner(&disk);
        queue(&owner, "w", 1).await.unwrap().expect("committed");
        let before = durable(&disk.stats());
        disk.fail_next_syncs(1);
        // Queued in one turn: one cycle, one commit, one failed sync.
        let answers = [
            queue(&owner, "a", 2),
            queue(&owner, "b", 1),
            queue(&owner, "c", 3),
        ];
        for (i, answer) in answers.into_iter().enumerate() {
            match answer.await.expect("answered") {
                Err(CommitError::Failed(_)) => {}
                other => panic!("batch {i} of the failed cycle was answered {other:?}"),
            }
        }
        assert_eq!(durable(&disk.stats()), before, "the one sync failed");
        // The log is poisoned and opened again once the backoff has passed: the
        // next batch commits, after whatever of the failed commit recovery kept
        // (at least once).
        sleep(Duration::from_millis(20)).await;
        let range = queue(&owner, "d", 1).await.unwrap().expect("committed");
        let records = payloads_of(&owner, ID, 0).await;
        assert_eq!(records.first().map(String::as_str), Some("w-0"));
        assert_eq!(records.last().map(String::as_str), Some("d-0"));
        assert_eq!(range.end.0 as usize, records.len());
    });
}
