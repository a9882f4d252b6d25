//! The storage events an [`Owner`] reports to its observer (the metrics' feed):
//! a commit's bytes and the log's shape after it, the shape at an open, nothing
//! for a failed fdatasync, what retention deleted, idle evictions and purges,
//! where reads were answered from; and the count of open logs through opens,
//! poisoning and evictions.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_channel::oneshot;
use narad_io::rt::{run_local, unix_ms};
use narad_io::sim::{SimDisk, SimFaults};
use narad_shards::ids::{IncarnationId, Offset, PartitionId};
use narad_shards::log::{CommitIo, LogConfig, LogStats, ReadRange, RetentionOutcome};
use narad_shards::produce::reaper::ColdWalk;
use narad_shards::produce::{
    CommitReply, OwnedPartition, OwnedRecord, Owner, PartitionObserver, Retention, StorageObserver,
};

const TOPIC: &str = "orders";
const ID: IncarnationId = IncarnationId(0xbeef);
const HOUR_MS: u64 = 3_600_000;
const HOUR: Duration = Duration::from_secs(3600);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Event {
    Tracked(u32),
    Committed {
        partition: u32,
        bytes: u64,
        size_bytes: u64,
        segments: usize,
    },
    Reshaped {
        partition: u32,
        size_bytes: u64,
        segments: usize,
    },
    Retained {
        partition: u32,
        bytes: u64,
        records: u64,
    },
    RetentionRan {
        partition: u32,
    },
    Evicted(usize),
    Purged(IncarnationId),
    Read {
        partition: u32,
        device_bytes: u64,
    },
}

type Log = Rc<RefCell<Vec<Event>>>;

/// Writes down every event it is told.
#[derive(Default)]
struct Recorder {
    events: Log,
}

struct PartitionRecorder {
    partition: u32,
    events: Log,
}

impl StorageObserver for Recorder {
    fn partition(
        &self,
        topic: &str,
        incarnation: IncarnationId,
        partition: PartitionId,
    ) -> Rc<dyn PartitionObserver> {
        assert_eq!((topic, incarnation), (TOPIC, ID));
        self.events.borrow_mut().push(Event::Tracked(partition.0));
        Rc::new(PartitionRecorder {
            partition: partition.0,
            events: self.events.clone(),
        })
    }

    fn idle_evicted(&self, logs: usize) {
        self.events.borrow_mut().push(Event::Evicted(logs));
    }

    fn purged(&self, incarnation: IncarnationId) {
        self.events.borrow_mut().push(Event::Purged(incarnation));
    }
}

impl PartitionObserver for PartitionRecorder {
    fn committed(&self, io: &CommitIo, stats: &LogStats) {
        self.events.borrow_mut().push(Event::Committed {
            partition: self.partition,
            bytes: io.bytes,
            size_bytes: stats.size_bytes,
            segments: stats.segment_count,
        });
    }

    fn reshaped(&self, stats: &LogStats) {
        self.events.borrow_mut().push(Event::Reshaped {
            partition: self.partition,
            size_bytes: stats.size_bytes,
            segments: stats.segment_count,
        });
    }

    fn retained(&self, deleted: &RetentionOutcome) {
        self.events.borrow_mut().push(Event::Retained {
            partition: self.partition,
            bytes: deleted.bytes_deleted,
            records: deleted.records_deleted,
        });
    }

    fn retention_ran(&self, _took: Duration) {
        self.events.borrow_mut().push(Event::RetentionRan {
            partition: self.partition,
        });
    }

    fn read(&self, device_bytes: u64) {
        self.events.borrow_mut().push(Event::Read {
            partition: self.partition,
            device_bytes,
        });
    }
}

fn owner_on(disk: SimDisk) -> (Rc<Owner<SimDisk>>, Log) {
    let live =
        |topic: &str, id: IncarnationId, p: PartitionId| topic == TOPIC && id == ID && p.0 < 2;
    owner_with_liveness(disk, live)
}

/// [`owner_on`] that asks `live` which partitions are live.
fn owner_with_liveness(
    disk: SimDisk,
    live: impl Fn(&str, IncarnationId, PartitionId) -> bool + 'static,
) -> (Rc<Owner<SimDisk>>, Log) {
    let live = Box::new(live);
    let config = LogConfig {
        retention_ms: HOUR_MS,
        ..LogConfig::default()
    };
    let owner = Owner::with_reopen_backoff(disk, config, live, Duration::ZERO);
    let recorder = Recorder::default();
    let events = recorder.events.clone();
    owner.set_observer(Rc::new(recorder));
    (owner, events)
}

/// The topic's partitions `0..count`, as the cold walk is given them.
fn owned_partitions(count: u32) -> Vec<OwnedPartition> {
    (0..count)
        .map(|p| OwnedPartition {
            topic: Arc::from(TOPIC),
            incarnation: ID,
            partition: PartitionId(p),
        })
        .collect()
}

async fn commit(owner: &Rc<Owner<SimDisk>>, partition: u32, n: usize) -> CommitReply {
    let records = (0..n)
        .map(|i| OwnedRecord {
            key: None,
            payload: format!("record-{i}").into_bytes().into(),
            mask: 0,
        })
        .collect();
    let (reply, answer) = oneshot::channel();
    owner.commit(Arc::from(TOPIC), ID, PartitionId(partition), records, reply);
    answer.await.expect("the owner answers")
}

fn take(events: &Log) -> Vec<Event> {
    std::mem::take(&mut *events.borrow_mut())
}

#[test]
fn commits_report_their_bytes_and_the_shape_after_and_a_failed_sync_reports_nothing() {
    let disk = SimDisk::new(11, SimFaults::default());
    run_local(None, async move {
        let (owner, events) = owner_on(disk.clone());
        assert_eq!(commit(&owner, 0, 3).await.unwrap(), Offset(0)..Offset(3));
        let first = take(&events);
        let [Event::Tracked(0), Event::Reshaped {
            size_bytes: 0,
            segments: 1,
            ..
        }, Event::Committed {
            partition: 0,
            bytes,
            size_bytes,
            segments: 1,
        }] = first[..]
        else {
            panic!("{first:?}");
        };
        assert!(bytes >= 3 * "record-0".len() as u64, "{first:?}");
        assert_eq!(size_bytes, bytes, "a fresh log holds what its commit wrote");
        assert_eq!(owner.open_log_count(), 1);

        commit(&owner, 0, 2).await.unwrap();
        let second = take(&events);
        let [Event::Committed {
            bytes: more,
            size_bytes: grown,
            ..
        }] = second[..]
        else {
            panic!("{second:?}");
        };
        assert_eq!(grown, bytes + more);
        let stats = owner
            .stats(&Arc::from(TOPIC), ID, PartitionId(0))
            .await
            .unwrap();
        assert_eq!(stats.size_bytes, grown);

        // A failed fdatasync: no commit to report, and the poisoned log is closed.
        disk.fail_next_syncs(1);
        assert!(commit(&owner, 0, 1).await.is_err());
        assert_eq!(take(&events), []);
        assert_eq!(owner.open_log_count(), 0);
        // The next commit reopens the log: its recovered shape, then the commit.
        // Recovery may keep the failed commit's frames when they verify (at
        // least once: its records are sent again), so the log may have grown.
        let range = commit(&owner, 0, 1).await.unwrap();
        assert!(range.start >= Offset(5), "{range:?}");
        let reopened = take(&events);
        let [Event::Reshaped {
            size_bytes: recovered,
            ..
        }, Event::Committed {
            bytes, size_bytes, ..
        }] = reopened[..]
        else {
            panic!("{reopened:?}");
        };
        assert!(recovered >= grown, "{reopened:?}");
        assert_eq!(size_bytes, recovered + bytes, "{reopened:?}");
        assert_eq!(owner.open_log_count(), 1);
        owner.close_all().await;
        assert_eq!(owner.open_log_count(), 0);
    });
}

#[test]
fn retention_idle_eviction_and_purge_are_reported() {
    let disk = SimDisk::new(12, SimFaults::default());
    run_local(None, async move {
        let (owner, events) = owner_on(disk.clone());
        commit(&owner, 0, 4).await.unwrap();
        commit(&owner, 1, 2).await.unwrap();
        let sizes: Vec<u64> = take(&events)
            .into_iter()
            .filter_map(|e| match e {
                Event::Committed { size_bytes, .. } => Some(size_bytes),
                _ => None,
            })
            .collect();
        assert_eq!(sizes.len(), 2);

        // Two hours on, each log is sealed by age and deleted in the same run.
        owner.reap_open(unix_ms() + 2 * HOUR_MS).await;
        let mut reaped = take(&events);
        reaped.sort_by_key(|e| format!("{e:?}"));
        assert_eq!(
            reaped,
            [
                Event::Reshaped {
                    partition: 0,
                    size_bytes: 0,
                    segments: 1
                },
                Event::Reshaped {
                    partition: 1,
                    size_bytes: 0,
                    segments: 1
                },
                Event::Retained {
                    partition: 0,
                    bytes: sizes[0],
                    records: 4
                },
                Event::Retained {
                    partition: 1,
                    bytes: sizes[1],
                    records: 2
                },
                Event::RetentionRan { partition: 0 },
                Event::RetentionRan { partition: 1 },
            ]
        );
        // Nothing more to delete: the run and the shape are reported again, no
        // deletion.
        owner.reap_open(unix_ms() + 2 * HOUR_MS).await;
        let again = take(&events);
        assert_eq!(again.len(), 4, "{again:?}");
        assert!(again.iter().all(|e| matches!(
            e,
            Event::Reshaped { size_bytes: 0, .. } | Event::RetentionRan { .. }
        )));

        assert_eq!(owner.open_log_count(), 2);
        assert_eq!(owner.evict_idle(Instant::now() + 2 * HOUR, HOUR).await, 2);
        assert_eq!(take(&events), [Event::Evicted(2)]);
        assert_eq!(owner.open_log_count(), 0);
        // Nothing idle: nothing reported.
        assert_eq!(owner.evict_idle(Instant::now() + 2 * HOUR, HOUR).await, 0);
        assert_eq!(take(&events), []);

        owner.purge(ID).await;
        assert_eq!(take(&events), [Event::Purged(ID)]);
        owner.close_all().await;
    });
}

/// A read right behind the head is answered from memory; after the log was
/// closed (idle) and its cache went with it, the same read fetches segment bytes
/// from the device, and reading them again is memory once more.
#[test]
fn reads_report_whether_they_reached_the_device() {
    run_local(None, async {
        let (owner, events) = owner_on(SimDisk::new(5, SimFaults::default()));
        assert!(commit(&owner, 0, 20).await.is_ok());
        take(&events);
        let topic: Arc<str> = Arc::from(TOPIC);
        // Reads the 20 records and returns the device bytes each read reported.
        let read = async || {
            let batch = owner
                .read(
                    &topic,
                    ID,
                    PartitionId(0),
                    ReadRange::new(Offset(0), 100, 1 << 20),
                )
                .await
                .expect("the records are there");
            assert_eq!(batch.items.len(), 20);
            take(&events)
                .into_iter()
                .filter_map(|e| match e {
                    Event::Read {
                        partition: 0,
                        device_bytes,
                    } => Some(device_bytes),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(read().await, vec![0], "from the cache");
        assert_eq!(owner.evict_idle(Instant::now() + 2 * HOUR, HOUR).await, 1);
        take(&events);
        let fetched = read().await;
        assert!(
            fetched.len() == 1 && fetched[0] >= 4096,
            "one read, from the device: {fetched:?}"
        );
        assert_eq!(read().await, vec![0], "from the window it fetched");
        owner.close_all().await;
    });
}

/// After a restart no log is open, so no partition has reported its size; the
/// cold walk opens each partition with records once, even one whose records are
/// kept forever (which retention never visits), and only once.
#[test]
fn the_cold_walk_reports_the_size_of_partitions_unused_since_the_start() {
    let disk = SimDisk::new(13, SimFaults::default());
    run_local(None, async move {
        let (owner, events) = owner_on(disk.clone());
        commit(&owner, 0, 3).await.unwrap();
        commit(&owner, 1, 5).await.unwrap();
        let mut sizes = [0u64; 2];
        for event in take(&events) {
            if let Event::Committed {
                partition,
                size_bytes,
                ..
            } = event
            {
                sizes[partition as usize] = size_bytes;
            }
        }
        owner.close_all().await;

        let (owner, events) = owner_on(disk.clone());
        owner.set_retention(Box::new(|_, _| Some(Retention::Forever)));
        let owned = owned_partitions(2);
        let mut walk = ColdWalk::default();
        let totals = walk.step(&owner, owned.clone(), unix_ms()).await;
        assert_eq!(totals.partitions_reaped, 0, "nothing is reaped forever");
        let mut seen = take(&events);
        seen.sort_by_key(|e| format!("{e:?}"));
        assert_eq!(
            seen,
            [
                Event::Reshaped {
                    partition: 0,
                    size_bytes: sizes[0],
                    segments: 1
                },
                Event::Reshaped {
                    partition: 1,
                    size_bytes: sizes[1],
                    segments: 1
                },
                Event::Tracked(0),
                Event::Tracked(1),
            ]
        );
        assert!(sizes.iter().all(|&s| s > 0));
        assert_eq!(owner.open_log_count(), 0, "measured logs are closed again");
        walk.step(&owner, owned, unix_ms()).await;
        assert_eq!(take(&events), [], "each partition is measured once");
        owner.close_all().await;
    });
}

/// A topic deleted while the cold walk lists one of its partitions: the walk
/// neither opens the log (which would recreate a directory the delete set
/// aside) nor registers the partition with the observer again.
#[test]
fn the_cold_walk_leaves_a_partition_deleted_while_it_was_listed() {
    let disk = SimDisk::new(17, SimFaults::default());
    run_local(None, async move {
        let (owner, _) = owner_on(disk.clone());
        commit(&owner, 0, 3).await.unwrap();
        owner.close_all().await;

        // Live when the walk picks the partition, deleted by the time its
        // listing is done.
        let asked = Rc::new(std::cell::Cell::new(0));
        let live = {
            let asked = asked.clone();
            move |_: &str, _: IncarnationId, _: PartitionId| {
                asked.set(asked.get() + 1);
                asked.get() == 1
            }
        };
        let (owner, events) = owner_with_liveness(disk.clone(), live);
        owner.set_retention(Box::new(|_, _| Some(Retention::Forever)));
        let owned = owned_partitions(1);
        ColdWalk::default().step(&owner, owned, unix_ms()).await;
        assert_eq!(take(&events), [], "nothing opened or registered");
        assert!(
            asked.get() >= 2,
            "liveness is asked again after the listing"
        );
        assert_eq!(owner.open_log_count(), 0);
        owner.close_all().await;
    });
}

/// A panic while the cold walk visits one partition skips that partition (a
/// failure of the walk) and the walk goes on to the next.
#[test]
fn a_panic_on_one_partition_skips_it_and_the_cold_walk_goes_on() {
    let disk = SimDisk::new(19, SimFaults::default());
    run_local(None, async move {
        let (owner, _) = owner_on(disk.clone());
        commit(&owner, 0, 3).await.unwrap();
        commit(&owner, 1, 3).await.unwrap();
        owner.close_all().await;

        let (owner, events) = owner_on(disk.clone());
        // Partition 0's retention is asked once to choose it, and panics when
        // its visit asks again; partition 1 is kept forever.
        let asked = Rc::new(std::cell::Cell::new(0));
        let retention = {
            let asked = asked.clone();
            move |_: &str, _: IncarnationId| {
                asked.set(asked.get() + 1);
                if asked.get() == 2 {
                    panic!("a retention lookup that panics");
                }
                Some(Retention::Age(Duration::from_secs(3600)))
            }
        };
        owner.set_retention(Box::new(retention));
        let owned = owned_partitions(2);
        let totals = ColdWalk::default().step(&owner, owned, unix_ms()).await;
        assert_eq!(totals.failures, 1, "{totals:?}");
        assert_eq!(
            totals.partitions_reaped, 1,
            "the other partition: {totals:?}"
        );
        assert!(take(&events).contains(&Event::Tracked(1)));
        owner.close_all().await;
    });
}
