//! What the dispatch task sees of this node: the metadata snapshot as a
//! [`Cluster`], commits routed to the owning shard, and the stop signal.
//!
//! Which cores: one per dispatch task, on its shard.

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
}

impl Cluster for NodeCluster {
    fn topic(&self, name: &str) -> Option<TopicMeta> {
        self.snapshot.topics.get(name).map(|t| TopicMeta {
            incarnation: t.id,
            partitions: t.partitions,
        })
    }

    fn owner(&self, topic: &str, partition: PartitionId) -> Option<OwnerId> {
        let t = self.snapshot.topics.get(topic)?;
        (partition.0 < t.partitions).then(|| OwnerId {
            node: 0,
            shard: super::owner_shard(t.id, partition, self.shards) as u32,
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
        NodeCluster {
            snapshot: self.0.meta.snapshot(),
            shards: self.0.shards,
        }
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
