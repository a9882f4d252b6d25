//! What the dispatch task's tests share: a cluster of one live topic whose
//! partitions are each owned by a local shard of their own.

use narad_shards::dispatch::{Cluster, OwnerId, TopicMeta};
use narad_shards::ids::{IncarnationId, PartitionId};

/// One topic, each partition on a shard of its own, all alive and local.
pub struct View {
    pub topic: &'static str,
    pub incarnation: IncarnationId,
    pub partitions: u32,
}

impl Cluster for View {
    fn topic(&self, name: &str) -> Option<TopicMeta> {
        (name == self.topic).then_some(TopicMeta {
            incarnation: self.incarnation,
            partitions: self.partitions,
        })
    }
    fn owner(&self, _: &str, partition: PartitionId) -> Option<OwnerId> {
        Some(OwnerId {
            node: 0,
            shard: partition.0,
        })
    }
    fn is_alive(&self, _: OwnerId) -> bool {
        true
    }
    fn is_local(&self, _: OwnerId) -> bool {
        true
    }
}
