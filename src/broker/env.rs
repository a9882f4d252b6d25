//! What the dispatch task sees of this node: the metadata snapshot as a
//! [`Cluster`], commits routed to the owning shard, and the stop signal.
//!
//! Which cores: one per dispatch task, on its shard.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use narad_io::rt::Notify;
use narad_shards::dispatch::{Cluster, OwnerId, TopicMeta};
use narad_shards::ids::{IncarnationId, PartitionId};
use narad_shards::produce::{CommitReply, DispatchEnv, OwnedRecord};

use super::Shard;
use crate::control::Snapshot;

/// The cluster as one node's metadata snapshot sees it: every owner is a shard of
/// this node, alive.
pub struct NodeCluster {
    snapshot: Snapshot,
    shards: usize,
    /// The last topic looked up, and what the snapshot holds under its name.
    /// The dispatcher asks about every record it reads, twice, and a read's
    /// records mostly share their topic: a name compared is cheaper than a
    /// name hashed. The snapshot never changes under a view, so neither does
    /// the answer.
    last: RefCell<Option<(Box<str>, Option<Placed>)>>,
}

/// A topic as the snapshot holds it, with what places its partitions.
#[derive(Clone, Copy)]
struct Placed {
    meta: TopicMeta,
    hash: u32,
}

impl NodeCluster {
    pub fn new(snapshot: Snapshot, shards: usize) -> NodeCluster {
        NodeCluster {
            snapshot,
            shards,
            last: RefCell::new(None),
        }
    }

    /// The topic under `name`, from the last lookup when it was the same name.
    fn placed(&self, name: &str) -> Option<Placed> {
        if let Some((last, placed)) = &*self.last.borrow() {
            if **last == *name {
                return *placed;
            }
        }
        let placed = self.snapshot.topics.get(name).map(|t| Placed {
            meta: TopicMeta {
                incarnation: t.id,
                partitions: t.partitions,
            },
            hash: super::placement_hash(t.id),
        });
        *self.last.borrow_mut() = Some((name.into(), placed));
        placed
    }
}

impl Cluster for NodeCluster {
    fn topic(&self, name: &str) -> Option<TopicMeta> {
        self.placed(name).map(|p| p.meta)
    }

    fn owner(&self, topic: &str, partition: PartitionId) -> Option<OwnerId> {
        let placed = self.placed(topic)?;
        (partition.0 < placed.meta.partitions).then(|| OwnerId {
            node: 0,
            shard: super::owner_shard_placed(placed.hash, partition, self.shards) as u32,
        })
    }

    fn is_alive(&self, _owner: OwnerId) -> bool {
        true
    }

    fn is_local(&self, _owner: OwnerId) -> bool {
        true
    }
}

/// A shard as its dispatch tasks see it.
pub struct ShardEnv(pub Rc<Shard>);

impl DispatchEnv for ShardEnv {
    type View = NodeCluster;

    fn view(&self) -> NodeCluster {
        NodeCluster::new(self.0.meta.snapshot(), self.0.shards)
    }

    fn commit(
        &self,
        topic: Arc<str>,
        incarnation: IncarnationId,
        partition: PartitionId,
        records: Vec<OwnedRecord>,
    ) -> Pin<Box<dyn Future<Output = CommitReply>>> {
        let shard = self.0.clone();
        Box::pin(async move { shard.commit(topic, incarnation, partition, records).await })
    }

    fn stopping(&self) -> bool {
        self.0.http_drained.get()
    }

    fn stop_notify(&self) -> &Notify {
        &self.0.stop_notify
    }

    fn drain_held_bytes(&self) -> Option<Rc<std::cell::Cell<u64>>> {
        Some(self.0.drain_held_bytes.clone())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use narad_shards::dispatch::{Cluster, OwnerId, TopicMeta};
    use narad_shards::ids::{IncarnationId, PartitionId};

    use super::NodeCluster;
    use crate::meta::{Command, MetaState, TopicRecord};

    fn topic(name: &str, id: u128, partitions: u32) -> Command {
        Command::CreateTopic(TopicRecord {
            name: name.to_string(),
            id: IncarnationId(id),
            partitions,
            retention_ms: 604_800_000,
            visibility_timeout_ms: 30_000,
            max_in_flight_per_partition: 1024,
            max_acked_ahead_per_partition: 1024,
            created_at: 1_700_000_000,
        })
    }

    /// Lookups that alternate between topics, and of a name the snapshot does
    /// not hold, answer each from its own entry, not from the one before.
    #[test]
    fn each_lookup_answers_for_its_own_topic() {
        let mut state = MetaState::default();
        state.apply(&topic("a", 1, 3)).unwrap();
        state.apply(&topic("ab", 2, 8)).unwrap();
        let shards = 4;
        let view = NodeCluster::new(std::rc::Rc::new(Arc::new(state)), shards);
        let a = Some(TopicMeta {
            incarnation: IncarnationId(1),
            partitions: 3,
        });
        let ab = Some(TopicMeta {
            incarnation: IncarnationId(2),
            partitions: 8,
        });
        for _ in 0..2 {
            assert_eq!(view.topic("a"), a);
            assert_eq!(view.topic("a"), a);
            assert_eq!(view.topic("ab"), ab);
            assert_eq!(view.topic("gone"), None);
            assert_eq!(view.topic("gone"), None);
            assert_eq!(view.topic("ab"), ab);
        }
        for p in 0..8 {
            let owner = |id| OwnerId {
                node: 0,
                shard: super::super::owner_shard(IncarnationId(id), PartitionId(p), shards) as u32,
            };
            assert_eq!(
                view.owner("a", PartitionId(p)),
                (p < 3).then(|| owner(1)),
                "a {p}"
            );
            assert_eq!(view.owner("ab", PartitionId(p)), Some(owner(2)), "ab {p}");
        }
        assert_eq!(view.owner("gone", PartitionId(0)), None);
    }
}
