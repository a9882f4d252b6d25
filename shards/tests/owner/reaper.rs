//! The retention reaper and idle eviction on an [`Owner`]: aged segments go and the
//! oldest offset moves, a topic kept forever keeps everything, an altered retention
//! applies at the next run, a commit racing the reaper keeps offsets dense, a failed
//! fsync while rolling closes the log, idle logs close and reopen with their data,
//! the cold walk reaches closed logs, and the task stops with the owner.
//!
//! Commit times come from the wall clock, so the tests pass the reaper a "now" hours
//! ahead of it rather than waiting; only the task test runs in real time.

use std::cell::Cell;
use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{keyless, topic, TOPIC};
use futures_channel::oneshot;
use narad_io::dma::DmaStorage;
use narad_io::rt::{run_local, unix_ms};
use narad_io::sim::{SimDisk, SimFaults};
use narad_io::Storage;
use narad_shards::ids::{IncarnationId, Offset, PartitionId};
use narad_shards::log::{LogConfig, ReadItem, ReadRange};
use narad_shards::produce::reaper::{self, ColdWalk, ReaperConfig};
use narad_shards::produce::{
    partition_dir, CommitError, OwnedPartition, OwnedRecord, Owner, ReadError, Retention,
};

const ID: IncarnationId = IncarnationId(0xfeed);
const PARTITIONS: u32 = 3;
const HOUR_MS: u64 = 3_600_000;
const HOUR: Duration = Duration::from_secs(3600);

fn log_config() -> LogConfig {
    LogConfig {
        segment_bytes_max: 64 << 10,
        prep_chunk_bytes: 16 << 10,
        index_interval_bytes: 2048,
        frame_area_bytes_target: 2048,
        commit_bytes_max: 64 << 10,
        ..LogConfig::default()
    }
}

/// An owner of `TOPIC` whose retention is whatever `retention` holds at each run.
fn owner_on<S: Storage>(storage: S, retention: &Rc<Cell<Retention>>) -> Rc<Owner<S>> {
    let live = Box::new(|topic: &str, id: IncarnationId, p: PartitionId| {
        topic == TOPIC && id == ID && p.0 < PARTITIONS
    });
    let owner = Owner::with_reopen_backoff(storage, log_config(), live, Duration::ZERO);
    let retention = retention.clone();
    owner.set_retention(Box::new(move |topic, id| {
        (topic == TOPIC && id == ID).then(|| retention.get())
    }));
    owner
}

fn owned(partition: u32) -> OwnedPartition {
    crate::common::owned(ID, partition)
}

/// Commits `payloads` to `partition` and waits for the offsets they took.
async fn commit<S: Storage>(
    owner: &Rc<Owner<S>>,
    partition: u32,
    payloads: &[String],
) -> Range<Offset> {
    try_commit(owner, partition, payloads)
        .await
        .expect("commit")
}

/// [`commit`], returning what the owner answered.
async fn try_commit<S: Storage>(
    owner: &Rc<Owner<S>>,
    partition: u32,
    payloads: &[String],
) -> Result<Range<Offset>, CommitError> {
    crate::common::try_commit(owner, ID, partition, payloads).await
}

fn batch(tag: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{tag}-{i}")).collect()
}

/// Every record of the partition from `from` to its end, as `(offset, payload)`.
async fn read_from<S: Storage>(
    owner: &Rc<Owner<S>>,
    partition: u32,
    from: u64,
) -> Result<Vec<(u64, String)>, ReadError> {
    let mut out = Vec::new();
    let mut at = Offset(from);
    for _ in 0..1000 {
        let batch = owner
            .read(
                &topic(),
                ID,
                PartitionId(partition),
                ReadRange::new(at, 64, 1 << 20),
            )
            .await?;
        if batch.items.is_empty() {
            return Ok(out);
        }
        for item in batch.items {
            match item {
                ReadItem::Record(r) => {
                    out.push((r.offset.0, String::from_utf8(r.payload.to_vec()).unwrap()))
                }
                ReadItem::Corrupt(range) => panic!("corrupt range {range:?}"),
            }
        }
        at = batch.next_offset;
    }
    panic!("the partition did not end");
}

async fn oldest_and_next<S: Storage>(owner: &Rc<Owner<S>>, partition: u32) -> (u64, u64) {
    let stats = owner
        .stats(&topic(), ID, PartitionId(partition))
        .await
        .expect("stats");
    (stats.oldest_offset.0, stats.next_offset.0)
}

async fn segment_files<S: Storage>(storage: &S, partition: u32) -> Vec<String> {
    let dir = partition_dir(TOPIC, ID, PartitionId(partition));
    storage.list(&dir).await.unwrap()
}

#[test]
fn aged_segments_are_deleted_and_the_oldest_offset_moves() {
    let disk = SimDisk::new(1, SimFaults::default());
    run_local(None, async move {
        let retention = Rc::new(Cell::new(Retention::Age(HOUR)));
        let owner = owner_on(disk.clone(), &retention);
        for tag in ["a", "b", "c"] {
            commit(&owner, 0, &batch(tag, 4)).await;
        }
        let now = unix_ms();
        // Younger than the retention: the segment is neither sealed nor deleted.
        let totals = owner.reap_open(now + HOUR_MS / 2).await;
        assert_eq!((totals.segments_rolled, totals.segments_deleted), (0, 0));
        assert_eq!(oldest_and_next(&owner, 0).await, (0, 12));
        // Two hours on, it is sealed by age and deleted in the same run.
        let totals = owner.reap_open(now + 2 * HOUR_MS).await;
        assert_eq!((totals.segments_rolled, totals.segments_deleted), (1, 1));
        assert!(totals.bytes_deleted > 0 && totals.failures == 0);
        assert_eq!(oldest_and_next(&owner, 0).await, (12, 12));
        assert_eq!(
            segment_files(&disk, 0).await,
            vec![format!("{:020}.log", 12)],
            "the deleted segment and its index are gone"
        );
        assert_eq!(
            read_from(&owner, 0, 0).await,
            Err(ReadError::AgedOut { oldest: Offset(12) })
        );
        // Records committed after the run are kept until they age in turn.
        let range = commit(&owner, 0, &batch("d", 2)).await;
        assert_eq!(range, Offset(12)..Offset(14));
        let totals = owner.reap_open(unix_ms() + HOUR_MS / 2).await;
        assert_eq!(totals.segments_deleted, 0);
        let kept = read_from(&owner, 0, 12).await.unwrap();
        assert_eq!(kept, vec![(12, "d-0".into()), (13, "d-1".into())]);
        // The other partitions were never opened by the reaper.
        assert!(segment_files(&disk, 1).await.is_empty());
        owner.close_all().await;
    });
}

/// A retention run that panics on one partition skips it (counted as a
/// failure) and goes on with the others: left to end the run, the same
/// panic would end every run after it too, and no partition of the shard
/// would ever be reaped again.
#[test]
fn a_panic_on_one_partition_does_not_keep_the_others_from_retention() {
    const DOOMED: &str = "doomed";
    let disk = SimDisk::new(6, SimFaults::default());
    run_local(None, async move {
        const DOOMED_ID: IncarnationId = IncarnationId(0xdead);
        let live = Box::new(|topic: &str, id: IncarnationId, p: PartitionId| {
            ((topic == TOPIC && id == ID) || (topic == DOOMED && id == DOOMED_ID))
                && p.0 < PARTITIONS
        });
        let owner = Owner::with_reopen_backoff(disk.clone(), log_config(), live, Duration::ZERO);
        owner.set_retention(Box::new(|topic, _| {
            assert_ne!(topic, DOOMED, "retention of {topic} panics");
            Some(Retention::Age(HOUR))
        }));
        for partition in 0..2 {
            commit(&owner, partition, &batch("a", 4)).await;
        }
        let (reply, answer) = oneshot::channel();
        let records = vec![OwnedRecord {
            key: None,
            payload: b"doomed".to_vec().into(),
            mask: 0,
        }];
        owner.commit(Arc::from(DOOMED), DOOMED_ID, PartitionId(0), records, reply);
        answer.await.unwrap().unwrap();

        let totals = owner.reap_open(unix_ms() + 2 * HOUR_MS).await;
        assert_eq!(totals.failures, 1, "{totals:?}");
        assert_eq!(totals.segments_deleted, 2, "{totals:?}");
        for partition in 0..2 {
            assert_eq!(oldest_and_next(&owner, partition).await, (4, 4));
        }
        owner.close_all().await;
    });
}

#[test]
fn a_full_disk_that_fails_the_roll_still_gets_its_aged_segments_deleted() {
    let disk = SimDisk::new(5, SimFaults::default());
    run_local(None, async move {
        let retention = Rc::new(Cell::new(Retention::Age(HOUR)));
        let owner = owner_on(disk.clone(), &retention);
        // Segments roll at 64 KiB: these fill several.
        for round in 0..8 {
            let payloads: Vec<String> = (0..16)
                .map(|i| format!("{round}-{i}-{}", "x".repeat(1000)))
                .collect();
            commit(&owner, 0, &payloads).await;
        }
        let sealed = segment_files(&disk, 0)
            .await
            .iter()
            .filter(|name| name.ends_with(".log"))
            .count()
            - 1;
        assert!(sealed >= 1, "{:?}", segment_files(&disk, 0).await);
        // The next segment cannot be created (as on a full disk): the roll fails.
        let dir = partition_dir(TOPIC, ID, PartitionId(0));
        disk.fail_next_create_of(&format!("{dir}/{:020}.log", 128));
        let totals = owner.reap_open(unix_ms() + 2 * HOUR_MS).await;
        assert_eq!(totals.failures, 1);
        assert_eq!(totals.segments_deleted, sealed, "{totals:?}");
        // The next run seals and deletes the rest.
        let totals = owner.reap_open(unix_ms() + 2 * HOUR_MS).await;
        assert_eq!(
            (totals.failures, totals.segments_deleted),
            (0, 1),
            "{totals:?}"
        );
        assert_eq!(oldest_and_next(&owner, 0).await, (128, 128));
        owner.close_all().await;
    });
}

#[test]
fn retention_forever_keeps_everything_and_an_altered_retention_applies_next_run() {
    let disk = SimDisk::new(2, SimFaults::default());
    run_local(None, async move {
        let retention = Rc::new(Cell::new(Retention::Forever));
        let owner = owner_on(disk.clone(), &retention);
        commit(&owner, 1, &batch("a", 5)).await;
        let far = unix_ms() + 1000 * 24 * HOUR_MS;
        let totals = owner.reap_open(far).await;
        assert_eq!((totals.segments_rolled, totals.segments_deleted), (0, 0));
        assert_eq!(read_from(&owner, 1, 0).await.unwrap().len(), 5);
        // Altered to one hour: the next run applies it.
        retention.set(Retention::Age(HOUR));
        let totals = owner.reap_open(far).await;
        assert_eq!(totals.segments_deleted, 1);
        assert_eq!(oldest_and_next(&owner, 1).await, (5, 5));
        owner.close_all().await;
    });
}

#[test]
fn a_commit_racing_the_reaper_keeps_offsets_dense_and_records_intact() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let storage = DmaStorage::new(dir.path());
    run_local(None, async move {
        let retention = Rc::new(Cell::new(Retention::Age(HOUR)));
        let owner = owner_on(storage.clone(), &retention);
        const ROUNDS: usize = 20;
        let mut answers = Vec::new();
        let mut deleted = 0;
        for round in 0..ROUNDS {
            // Commits queue on the partition; the reaper asks for its lock at once
            // (ahead of their cycle) or a moment later (while a cycle writes).
            for i in 0..1 + round % 3 {
                let payloads = batch(&format!("r{round}-{i}"), 1 + i);
                let (reply, answer) = oneshot::channel();
                owner.commit(topic(), ID, PartitionId(2), keyless(&payloads), reply);
                answers.push((answer, payloads));
            }
            if round % 2 == 1 {
                glommio::timer::sleep(Duration::from_micros(100)).await;
            }
            // Every run seals the active segment and deletes every sealed one.
            deleted += owner
                .reap_open(unix_ms() + 2 * HOUR_MS)
                .await
                .segments_deleted;
        }
        let mut ranges = Vec::new();
        for (answer, payloads) in answers {
            let range = answer.await.expect("the owner answers").expect("commit");
            ranges.push((range, payloads));
        }
        // Records committed after the last run are retained.
        let tail = batch("tail", 3);
        ranges.push((commit(&owner, 2, &tail).await, tail));
        let totals = owner.reap_open(unix_ms() + HOUR_MS / 2).await;
        assert_eq!(totals.segments_deleted, 0);
        ranges.sort_by_key(|(r, _)| r.start);
        let mut next = 0;
        for (range, payloads) in &ranges {
            assert_eq!(range.start.0, next, "offsets are dense: {ranges:?}");
            assert_eq!((range.end.0 - range.start.0) as usize, payloads.len());
            next = range.end.0;
        }
        let (oldest, end) = oldest_and_next(&owner, 2).await;
        assert_eq!(end, next);
        assert_eq!(next - oldest, 3, "only the tail is retained");
        assert!(
            deleted >= ROUNDS / 2,
            "the reaper deleted segments between commits"
        );
        // What is retained reads back as committed.
        let expected: Vec<(u64, String)> = ranges
            .iter()
            .flat_map(|(r, p)| (r.start.0..r.end.0).zip(p.iter().cloned()))
            .filter(|(offset, _)| *offset >= oldest)
            .collect();
        assert_eq!(read_from(&owner, 2, oldest).await.unwrap(), expected);
        owner.close_all().await;
        // And the log reopens to the same shape.
        let again = owner_on(storage, &retention);
        assert_eq!(oldest_and_next(&again, 2).await, (oldest, next));
        again.close_all().await;
    });
}

#[test]
fn a_failed_fsync_while_rolling_closes_the_log_and_the_next_commit_reopens_it() {
    let disk = SimDisk::new(3, SimFaults::default());
    run_local(None, async move {
        let retention = Rc::new(Cell::new(Retention::Age(HOUR)));
        let owner = owner_on(disk.clone(), &retention);
        commit(&owner, 0, &batch("a", 3)).await;
        disk.fail_next_syncs(1);
        let totals = owner.reap_open(unix_ms() + 2 * HOUR_MS).await;
        assert_eq!((totals.failures, totals.segments_deleted), (1, 0));
        assert_eq!(owner.open_log_count(), 0, "a poisoned log is closed");
        // The next commit reopens (and so recovers) the log and carries on.
        assert_eq!(
            commit(&owner, 0, &batch("b", 2)).await,
            Offset(3)..Offset(5)
        );
        let all = read_from(&owner, 0, 0).await.unwrap();
        assert_eq!(all.len(), 5);
        assert_eq!(all[0], (0, "a-0".into()));
        // The next run does what the failed one could not.
        let totals = owner.reap_open(unix_ms() + 2 * HOUR_MS).await;
        assert_eq!((totals.failures, totals.segments_deleted), (0, 1));
        assert_eq!(oldest_and_next(&owner, 0).await, (5, 5));
        owner.close_all().await;
    });
}

#[test]
fn idle_logs_close_and_a_later_read_reopens_them_with_the_same_data() {
    let disk = SimDisk::new(4, SimFaults::default());
    run_local(None, async move {
        let retention = Rc::new(Cell::new(Retention::Age(HOUR)));
        let owner = owner_on(disk.clone(), &retention);
        commit(&owner, 0, &batch("a", 3)).await;
        commit(&owner, 1, &batch("b", 2)).await;
        assert_eq!(owner.open_log_count(), 2);
        assert_eq!(owner.evict_idle(Instant::now(), HOUR).await, 0);
        assert_eq!(owner.evict_idle(Instant::now() + 2 * HOUR, HOUR).await, 2);
        assert_eq!(owner.open_log_count(), 0);
        // A read opens the log again and finds every record.
        let read = read_from(&owner, 0, 0).await.unwrap();
        assert_eq!(
            read,
            vec![(0, "a-0".into()), (1, "a-1".into()), (2, "a-2".into())]
        );
        assert_eq!(owner.open_log_count(), 1);
        // Used just now: not idle.
        assert_eq!(owner.evict_idle(Instant::now() + HOUR / 2, HOUR).await, 0);
        // A commit to the other one reopens it and continues its offsets.
        assert_eq!(
            commit(&owner, 1, &batch("c", 1)).await,
            Offset(2)..Offset(3)
        );
        assert_eq!(owner.open_log_count(), 2);
        owner.close_all().await;
    });
}

/// An owner on `storage` whose partition 0 holds `a-0`..`a-2`, its log closed.
async fn owner_with_a_closed_log(storage: DmaStorage) -> Rc<Owner<DmaStorage>> {
    let retention = Rc::new(Cell::new(Retention::Age(HOUR)));
    let owner = owner_on(storage, &retention);
    commit(&owner, 0, &batch("a", 3)).await;
    owner.evict_idle(Instant::now() + 2 * HOUR, HOUR).await;
    assert_eq!(owner.open_log_count(), 0);
    owner
}

/// A read dropped half way (a consumer that hung up) leaves the log it opened
/// in its slot: the next read uses it rather than open it a second time, and
/// the count of open logs does not drift. Each round drops the read as soon as
/// it has opened the log and still waits (for the device).
#[test]
fn a_read_dropped_half_way_leaves_its_log_open_in_its_slot() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let storage = DmaStorage::new(dir.path());
    run_local(None, async move {
        let owner = owner_with_a_closed_log(storage).await;
        let mut dropped_while_reading = 0;
        let topic = topic();
        for round in 0..20 {
            owner.evict_idle(Instant::now() + 2 * HOUR, HOUR).await;
            assert_eq!(owner.open_log_count(), 0, "round {round}");
            let mut read = Box::pin(owner.read(
                &topic,
                ID,
                PartitionId(0),
                ReadRange::new(Offset(0), 64, 1 << 20),
            ));
            while futures_lite::future::poll_once(&mut read).await.is_none() {
                if owner.open_log_count() == 1 {
                    dropped_while_reading += 1;
                    break;
                }
                narad_io::rt::sleep(Duration::from_micros(20)).await;
            }
            drop(read);
            let records = read_from(&owner, 0, 0).await.unwrap();
            assert_eq!(records.len(), 3, "round {round}");
            assert_eq!(owner.open_log_count(), 1, "round {round}: opened once");
        }
        assert!(
            dropped_while_reading > 0,
            "no round dropped a read past its open"
        );
        owner.close_all().await;
        assert_eq!(owner.open_log_count(), 0);
    });
}

/// A read dropped while it opens the log does not drop the open half way:
/// the log opens all the same, in a task of its own, into its slot.
#[test]
fn a_read_dropped_while_opening_its_log_leaves_the_open_to_finish() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let storage = DmaStorage::new(dir.path());
    run_local(None, async move {
        let owner = owner_with_a_closed_log(storage).await;
        let topic = topic();
        let mut read = Box::pin(owner.read(
            &topic,
            ID,
            PartitionId(0),
            ReadRange::new(Offset(0), 64, 1 << 20),
        ));
        assert!(futures_lite::future::poll_once(&mut read).await.is_none());
        assert_eq!(owner.open_log_count(), 0, "still opening");
        drop(read);
        let opened = Instant::now();
        while owner.open_log_count() == 0 && opened.elapsed() < Duration::from_secs(5) {
            narad_io::rt::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(
            owner.open_log_count(),
            1,
            "the open finished without its caller"
        );
        assert_eq!(read_from(&owner, 0, 0).await.unwrap().len(), 3);
        assert_eq!(owner.open_log_count(), 1, "and the next read used it");
        owner.close_all().await;
    });
}

#[test]
fn a_sparing_peek_neither_keeps_a_log_open_nor_from_idle_eviction() {
    let disk = SimDisk::new(4, SimFaults::default());
    run_local(None, async move {
        let retention = Rc::new(Cell::new(Retention::Age(HOUR)));
        let owner = owner_on(disk.clone(), &retention);
        commit(&owner, 0, &batch("a", 3)).await;
        let peek = |from: u64| {
            let owner = owner.clone();
            async move {
                let range = ReadRange::new(Offset(from), 1, 1);
                let batch = owner
                    .peek_sparing(&topic(), ID, PartitionId(0), range)
                    .await
                    .expect("peek");
                match batch.items.first() {
                    Some(ReadItem::Record(r)) => r.offset.0,
                    other => panic!("{other:?}"),
                }
            }
        };
        // Open: the peek does not count as a use, so the log is idle an hour
        // after `before` unless something else used it since.
        let before = Instant::now();
        assert_eq!(peek(1).await, 1);
        assert_eq!(owner.evict_idle(before + HOUR, HOUR).await, 1);
        assert_eq!(owner.open_log_count(), 0);
        // Closed: the peek opens it for the read (nothing cached) and closes
        // it again.
        assert_eq!(peek(2).await, 2);
        assert_eq!(owner.open_log_count(), 0);
        // A read opens it for good, and a peek leaves it open.
        read_from(&owner, 0, 0).await.unwrap();
        assert_eq!(peek(0).await, 0);
        assert_eq!(owner.open_log_count(), 1);
        owner.close_all().await;
    });
}

#[test]
fn a_log_that_lost_offsets_its_consumers_settled_never_hands_them_out_again() {
    use narad_shards::consume::state::{AckedState, Committer, CommitterConfig};
    let disk = SimDisk::new(6, SimFaults::default());
    run_local(None, async move {
        let retention = Rc::new(Cell::new(Retention::Age(HOUR)));
        let owner = owner_on(disk.clone(), &retention);
        assert_eq!(
            commit(&owner, 0, &batch("a", 3)).await,
            Offset(0)..Offset(3)
        );
        owner.close_all().await;
        // The consumers settled offsets the log no longer holds (say its last
        // commits rotted): below 10, and 14.
        let dir = partition_dir(TOPIC, ID, PartitionId(0));
        let settled = AckedState {
            frontier: Offset(10),
            ahead: vec![Offset(14)],
        };
        let mut committer = Committer::new(disk.clone(), CommitterConfig::default());
        let report = committer
            .close(Instant::now(), vec![((ID, PartitionId(0)), dir, settled)])
            .await;
        assert!(report.errors.is_empty(), "{report:?}");
        // Reopened, the log hands out offsets above all of them: a record
        // committed at 3 or 14 would count as acked and never be delivered.
        let owner = owner_on(disk.clone(), &retention);
        assert_eq!(
            commit(&owner, 0, &batch("b", 2)).await,
            Offset(15)..Offset(17)
        );
        let stats = owner
            .stats(&topic(), ID, PartitionId(0))
            .await
            .expect("stats");
        assert_eq!(stats.next_offset, Offset(17));
        // A partition whose consumers settled nothing starts where it ended.
        assert_eq!(
            commit(&owner, 1, &batch("c", 1)).await,
            Offset(0)..Offset(1)
        );
        owner.close_all().await;
    });
}

#[test]
fn the_cold_walk_reaps_closed_logs_and_closes_them_again() {
    let disk = SimDisk::new(5, SimFaults::default());
    run_local(None, async move {
        let retention = Rc::new(Cell::new(Retention::Age(HOUR)));
        let owner = owner_on(disk.clone(), &retention);
        commit(&owner, 0, &batch("a", 3)).await;
        commit(&owner, 1, &batch("b", 4)).await;
        owner.evict_idle(Instant::now() + 2 * HOUR, HOUR).await;
        assert_eq!(owner.open_log_count(), 0);
        let all = vec![owned(2), owned(1), owned(0)];
        let mut walk = ColdWalk::default();
        // Not yet aged: visited, nothing deleted, closed again.
        let totals = walk.step(&owner, all.clone(), unix_ms()).await;
        assert_eq!((totals.partitions_reaped, totals.segments_deleted), (2, 0));
        assert_eq!(owner.open_log_count(), 0);
        let totals = walk
            .step(&owner, all.clone(), unix_ms() + 2 * HOUR_MS)
            .await;
        assert_eq!((totals.partitions_reaped, totals.segments_deleted), (2, 2));
        assert_eq!(owner.open_log_count(), 0, "cold logs are closed after");
        // A partition never written is not opened, so not created either.
        assert!(segment_files(&disk, 2).await.is_empty());
        // Each log now holds one empty segment: nothing left to visit.
        let totals = walk.step(&owner, all, unix_ms() + 2 * HOUR_MS).await;
        assert_eq!(totals.partitions_reaped, 0);
        assert_eq!(oldest_and_next(&owner, 0).await, (3, 3));
        assert_eq!(oldest_and_next(&owner, 1).await, (4, 4));
        // Retention forever: the walk leaves the logs alone.
        commit(&owner, 0, &batch("c", 2)).await;
        owner.evict_idle(Instant::now() + 2 * HOUR, HOUR).await;
        retention.set(Retention::Forever);
        let mut walk = ColdWalk::default();
        let totals = walk
            .step(&owner, vec![owned(0)], unix_ms() + 99 * HOUR_MS)
            .await;
        assert_eq!(totals.partitions_reaped, 0);
        owner.close_all().await;
    });
}

/// Stats of a closed log come from the shape it closed with: no open, so no new
/// idle period either (a dashboard polling a topic's stats keeps none of its
/// logs open). A commit reopens the log and the stats follow it; what the cold
/// walk deletes shows without an open.
#[test]
fn stats_of_a_closed_log_do_not_open_it() {
    let disk = SimDisk::new(6, SimFaults::default());
    run_local(None, async move {
        let retention = Rc::new(Cell::new(Retention::Age(HOUR)));
        let owner = owner_on(disk.clone(), &retention);
        commit(&owner, 0, &batch("a", 3)).await;
        commit(&owner, 1, &batch("b", 4)).await;
        let stats = |p: u32| {
            let owner = owner.clone();
            async move { owner.stats(&topic(), ID, PartitionId(p)).await.unwrap() }
        };
        let open_shape = stats(0).await;
        assert_eq!(open_shape.segments, 1);
        assert_eq!(owner.evict_idle(Instant::now() + 2 * HOUR, HOUR).await, 2);
        assert_eq!(stats(0).await, open_shape);
        assert_eq!(stats(1).await.next_offset, Offset(4));
        assert_eq!(owner.open_log_count(), 0, "stats opened a closed log");
        // The same shape an open finds.
        read_from(&owner, 1, 0).await.unwrap();
        assert_eq!(owner.open_log_count(), 1);
        let reopened = stats(1).await;
        assert_eq!((reopened.next_offset, reopened.segments), (Offset(4), 1));
        owner.evict_idle(Instant::now() + 2 * HOUR, HOUR).await;
        assert_eq!(stats(1).await, reopened);
        // A commit reopens the log: its stats are the log's again.
        commit(&owner, 0, &batch("c", 2)).await;
        assert_eq!(owner.open_log_count(), 1);
        let grown = stats(0).await;
        assert_eq!(
            (grown.oldest_offset, grown.next_offset),
            (Offset(0), Offset(5))
        );
        assert!(grown.size_bytes > open_shape.size_bytes);
        owner.evict_idle(Instant::now() + 2 * HOUR, HOUR).await;
        assert_eq!(stats(0).await, grown);
        // The cold walk deletes the aged segments and closes the logs again.
        let mut walk = ColdWalk::default();
        let totals = walk
            .step(&owner, vec![owned(0), owned(1)], unix_ms() + 2 * HOUR_MS)
            .await;
        assert_eq!(totals.segments_deleted, 2);
        let trimmed = stats(0).await;
        assert_eq!(
            (trimmed.oldest_offset, trimmed.next_offset),
            (Offset(5), Offset(5))
        );
        assert!(trimmed.size_bytes < grown.size_bytes);
        assert_eq!(stats(1).await.oldest_offset, Offset(4));
        assert_eq!(owner.open_log_count(), 0, "stats opened a closed log");
        owner.close_all().await;
    });
}

/// A commit whose read-back failed after its sync may have left its frames
/// durable past the high watermark, where an open finds them: such a log's
/// shape is not remembered when it closes, so stats open it and see them.
#[test]
fn stats_after_a_failed_read_back_are_what_an_open_finds() {
    let disk = SimDisk::new(7, SimFaults::default());
    run_local(None, async move {
        let retention = Rc::new(Cell::new(Retention::Age(HOUR)));
        let owner = owner_on(disk.clone(), &retention);
        let dir = partition_dir(TOPIC, ID, PartitionId(0));
        // Opening the log makes its first segment; its first commit starts at
        // a block boundary, so no earlier block is written again after a
        // failed read-back, and the frames stay on the device.
        let empty = owner.stats(&topic(), ID, PartitionId(0)).await.unwrap();
        assert_eq!(empty.next_offset, Offset(0));
        let segment = format!("{dir}/{:020}.log", 0);
        disk.flip_next_read_at(&segment, 10, 3);
        let failed = try_commit(&owner, 0, &batch("b", 3)).await;
        assert!(failed.is_err(), "the read-back was flipped: {failed:?}");
        assert_eq!(
            owner
                .stats(&topic(), ID, PartitionId(0))
                .await
                .unwrap()
                .next_offset,
            Offset(0)
        );
        owner.evict_idle(Instant::now() + 2 * HOUR, HOUR).await;
        assert_eq!(owner.open_log_count(), 0);
        let closed = owner.stats(&topic(), ID, PartitionId(0)).await.unwrap();
        let records = read_from(&owner, 0, 0).await.unwrap();
        assert_eq!(closed.next_offset.0, records.len() as u64, "{records:?}");
        owner.close_all().await;
    });
}

#[test]
fn the_reaper_task_trims_on_its_cadence_and_stops_with_the_owner() {
    let disk = SimDisk::new(6, SimFaults::default());
    run_local(None, async move {
        let retention = Rc::new(Cell::new(Retention::Age(Duration::from_millis(100))));
        let owner = owner_on(disk.clone(), &retention);
        let config = ReaperConfig {
            check_interval: Duration::from_millis(20),
            cold_walk_interval: Duration::from_millis(50),
            idle_eviction: Duration::from_secs(60),
        };
        let task = glommio::spawn_local(reaper::run(
            owner.clone(),
            config,
            Box::new(|| (0..PARTITIONS).map(owned).collect()),
        ))
        .detach();
        commit(&owner, 0, &batch("a", 5)).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while oldest_and_next(&owner, 0).await != (5, 5) {
            assert!(Instant::now() < deadline, "the reaper did not trim in time");
            glommio::timer::sleep(Duration::from_millis(20)).await;
        }
        let started = Instant::now();
        owner.close_all().await;
        assert!(task.await.is_some(), "the reaper ran to its end");
        assert!(started.elapsed() < Duration::from_secs(5));
    });
}

/// Once the owner has closed its logs for the stop, a commit or read that still
/// arrives (another shard's dispatcher, a forwarded consume) is refused rather
/// than opening a log the stop would leave mid-write.
#[test]
fn an_owner_closed_for_the_stop_refuses_commits_and_reads() {
    let disk = SimDisk::new(9, SimFaults::default());
    run_local(None, async move {
        let retention = Rc::new(Cell::new(Retention::from_ms(0)));
        let owner = owner_on(disk.clone(), &retention);
        commit(&owner, 0, &batch("before", 3)).await;
        owner.close_all().await;
        assert_eq!(owner.open_log_count(), 0);
        let (reply, answer) = oneshot::channel();
        let records = vec![OwnedRecord {
            key: None,
            payload: b"late".to_vec().into(),
            mask: 0,
        }];
        owner.commit(topic(), ID, PartitionId(0), records, reply);
        assert!(matches!(
            answer.await.expect("the owner answers"),
            Err(CommitError::Failed(_))
        ));
        assert!(matches!(
            read_from(&owner, 0, 0).await,
            Err(ReadError::Stopping)
        ));
        assert_eq!(owner.open_log_count(), 0, "no log was opened again");
    });
}

/// A commit queued behind a running one when the stop begins is refused as a
/// failure (its records stay in their WAL), not as a change of incarnation,
/// which the dispatcher would report as records accepted for another topic.
#[test]
fn a_commit_queued_when_the_stop_begins_fails_as_stopping() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let storage = DmaStorage::new(dir.path());
    run_local(None, async move {
        let retention = Rc::new(Cell::new(Retention::from_ms(0)));
        let owner = owner_on(storage.clone(), &retention);
        let queue = |payload: &str| {
            let (reply, answer) = oneshot::channel();
            let records = vec![OwnedRecord {
                key: None,
                payload: payload.as_bytes().to_vec().into(),
                mask: 0,
            }];
            owner.commit(topic(), ID, PartitionId(0), records, reply);
            answer
        };
        // The first starts its cycle (it opens the log, then writes); the
        // second queues behind it; then the stop begins.
        let running = queue("running");
        let queued = queue("queued");
        owner.close_all().await;
        let running = running.await.expect("the owner answers");
        assert_eq!(running, Ok(Offset(0)..Offset(1)));
        let queued = queued.await.expect("the owner answers");
        assert!(matches!(queued, Err(CommitError::Failed(_))), "{queued:?}");
    });
}
