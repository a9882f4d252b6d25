//! The broker on one shard: what the HTTP routes call, the partitions this shard
//! owns, its dispatcher, and the ops shards send each other.
//!
//! Which cores: one [`Shard`] per shard thread, behind an `Rc`, never shared. Work for
//! a partition another shard owns goes to that shard as an [`Op`] over the mesh
//! (bounded lock-free channels, `narad_io::mesh`), with a oneshot channel for the
//! answer; the same ops will travel between nodes in the cluster issue.
//!
//! The partitions a shard owns and its dispatch task are
//! `narad_shards::produce::{Owner, driver}`, generic over storage.
//!
//! Placement: partition `p` of a topic with incarnation id `id` lives on shard
//! `(fnv1a32(id) + p) mod shards` ([`owner_shard`]), so a topic's partitions spread
//! over the shards and a restart with another shard count only re-maps them: data on
//! disk is keyed by topic and partition, never by shard.
//!
//! Map:
//! - [`ops`]: the mesh ops and their answers.
//! - [`env`]: what the dispatch task (`narad_shards::produce::driver`) sees of this
//!   node: the metadata as a cluster, and where commits go.
//! - [`shard`]: the per-shard context and the mesh receive loops.
//! - [`layout`]: the data directory at startup: leftover WALs, orphaned topic data.

pub mod env;
pub mod layout;
pub mod ops;
pub mod shard;

pub use shard::Shard;

use narad_shards::ids::{IncarnationId, PartitionId};

/// The shard that owns partition `partition` of the incarnation `id`.
pub fn owner_shard(id: IncarnationId, partition: PartitionId, shards: usize) -> usize {
    owner_shard_placed(placement_hash(id), partition, shards)
}

/// What places the partitions of the incarnation `id` ([`owner_shard`]): kept
/// by callers that place many of its records.
pub fn placement_hash(id: IncarnationId) -> u32 {
    crate::partition::fnv1a32(&id.0.to_be_bytes())
}

/// [`owner_shard`] from the incarnation's [`placement_hash`].
pub fn owner_shard_placed(hash: u32, partition: PartitionId, shards: usize) -> usize {
    assert!(shards > 0);
    ((hash as u64 + partition.0 as u64) % shards as u64) as usize
}

pub use narad_shards::produce::{incarnation_dir, partition_dir};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_spreads_a_topic_over_the_shards() {
        let id = IncarnationId(0x1234_5678_9abc_def0_1122_3344_5566_7788);
        for shards in 1..=8 {
            let owners: Vec<usize> = (0..shards as u32)
                .map(|p| owner_shard(id, PartitionId(p), shards))
                .collect();
            let mut sorted = owners.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), shards, "{owners:?}");
        }
        assert_eq!(
            partition_dir("orders", id, PartitionId(7)),
            "topics/orders/123456789abcdef01122334455667788/p00007"
        );
    }
}
