//! Choosing where a partition's records go while its owner is dead or its commits
//! have kept failing past the reroute grace.
//!
//! The sibling is the next partition of the same topic, counting up and wrapping
//! around, whose owner membership reports alive and whose own commits are neither
//! failing nor hung. The grace is measured in time (from the start of the first
//! failed attempt), not in attempts, so a handoff freeze or an owner restart does
//! not scatter records across partitions.

use std::time::Instant;

use super::{Cluster, Dispatcher};
use crate::ids::PartitionId;

impl Dispatcher {
    /// The live sibling of `partition` in a topic of `partitions`, if any; its
    /// destination entry exists on return.
    pub(super) fn sibling(
        &mut self,
        now: Instant,
        topic: &str,
        partition: PartitionId,
        partitions: u32,
        cluster: &impl Cluster,
    ) -> Option<PartitionId> {
        assert!(partition.0 < partitions);
        let state = self.topics.get(topic).expect("destination created");
        let found = (1..partitions)
            .map(|step| PartitionId((partition.0 + step) % partitions))
            .find(|&candidate| {
                let owner_alive = cluster
                    .owner(topic, candidate)
                    .is_some_and(|o| cluster.is_alive(o));
                let healthy = state
                    .partitions
                    .get(&candidate)
                    .is_none_or(|d| d.failing.is_none() && !d.hung);
                owner_alive && healthy
            });
        if let Some(sibling) = found {
            self.ensure_dest(topic, sibling, now);
        }
        found
    }
}
