//! The open-log budget of an [`Owner`]: past it, opening a log first closes the
//! least recently used one, and the closed partitions lose nothing: their next
//! commit or read opens them again.

use std::ops::Range;
use std::rc::Rc;
use std::time::Duration;

use crate::common::TOPIC;
use narad_io::dma::DmaStorage;
use narad_io::rt::run_local;
use narad_io::Storage;
use narad_shards::ids::{IncarnationId, Offset, PartitionId};
use narad_shards::log::LogConfig;
use narad_shards::produce::{OwnedPartition, Owner};

const ID: IncarnationId = IncarnationId(0xb0d9e7);
const PARTITIONS: u32 = 6;

fn owner_on<S: Storage>(storage: S) -> Rc<Owner<S>> {
    let live = Box::new(|topic: &str, id: IncarnationId, p: PartitionId| {
        topic == TOPIC && id == ID && p.0 < PARTITIONS
    });
    let config = LogConfig {
        segment_bytes_max: 64 << 10,
        prep_chunk_bytes: 16 << 10,
        ..LogConfig::default()
    };
    Owner::with_reopen_backoff(storage, config, live, Duration::ZERO)
}

fn owned(partition: u32) -> OwnedPartition {
    crate::common::owned(ID, partition)
}

async fn commit<S: Storage>(owner: &Rc<Owner<S>>, partition: u32, tag: &str) -> Range<Offset> {
    let payloads: Vec<String> = (0..3).map(|i| format!("{tag}-{i}")).collect();
    crate::common::try_commit(owner, ID, partition, &payloads)
        .await
        .expect("commit")
}

#[test]
fn past_the_budget_the_least_recently_used_log_closes_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run_local(None, async move {
        let owner = owner_on(DmaStorage::new(&path));
        owner.set_open_logs_max(2);
        commit(&owner, 0, "a").await;
        commit(&owner, 1, "a").await;
        assert_eq!(owner.open_log_count(), 2);
        // A third log closes the one used longest ago, partition 0.
        commit(&owner, 2, "a").await;
        assert_eq!(owner.open_log_count(), 2);
        assert!(!owner.is_open(&owned(0)) && owner.is_open(&owned(1)));
        // Used again, partition 1 is kept over partition 2.
        commit(&owner, 1, "b").await;
        commit(&owner, 3, "a").await;
        assert!(owner.is_open(&owned(1)) && !owner.is_open(&owned(2)));
        for round in ["c", "d", "e"] {
            for p in 0..PARTITIONS {
                commit(&owner, p, round).await;
                assert!(owner.open_log_count() <= 2, "{}", owner.open_log_count());
            }
        }
        for p in 0..PARTITIONS {
            let mut expected = vec![];
            let rounds: &[&str] = match p {
                0 | 2 => &["a", "c", "d", "e"],
                1 => &["a", "b", "c", "d", "e"],
                3 => &["a", "c", "d", "e"],
                _ => &["c", "d", "e"],
            };
            for round in rounds {
                expected.extend((0..3).map(|i| format!("{round}-{i}")));
            }
            assert_eq!(
                crate::common::payloads_of(&owner, ID, p).await,
                expected,
                "partition {p}"
            );
            assert!(owner.open_log_count() <= 2);
        }
        owner.close_all().await;
    });
}

#[test]
fn without_a_budget_every_log_used_stays_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run_local(None, async move {
        let owner = owner_on(DmaStorage::new(&path));
        for p in 0..PARTITIONS {
            commit(&owner, p, "a").await;
        }
        assert_eq!(owner.open_log_count(), PARTITIONS as usize);
        owner.close_all().await;
    });
}
