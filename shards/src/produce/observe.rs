//! What the owner tells about its partitions' storage: the seam between the
//! partition logs and the node's metrics.
//!
//! Which cores: every shard's [`super::Owner`] holds its own observer and calls
//! it only from that shard (commit cycles, the reaper, purges), so an observer
//! may keep `!Send` state and record into memory no other core writes.
//!
//! Why an observer and not metrics recorded here: the series' names, labels and
//! help texts live with the rest of the node's metrics, and a test or the
//! simulation can watch the same events without a metrics registry. The commit
//! path pays one dynamic call per commit into a per-partition observer the owner
//! keeps in the partition's slot, so the observer can hold its label handles
//! ready and a commit neither allocates nor looks anything up for them.

use std::rc::Rc;

use crate::ids::{IncarnationId, PartitionId};
use crate::log::{CommitIo, LogStats, RetentionOutcome};

/// A shard's storage observer. Every method is required: an observer that
/// ignored one event kind would leave its series silently stale, so leaving one
/// out should be a visible choice in the implementation.
pub trait StorageObserver {
    /// The observer of one partition. Called when the owner starts tracking the
    /// partition (its first use since the start, or since the owner forgot it
    /// after idle eviction), not per commit.
    fn partition(
        &self,
        topic: &str,
        incarnation: IncarnationId,
        partition: PartitionId,
    ) -> Rc<dyn PartitionObserver>;
    /// The reaper closed `logs` idle logs.
    fn idle_evicted(&self, logs: usize);
    /// The incarnation's logs are closed for good (its topic was deleted): its
    /// partitions hold nothing on this shard any more, whether their observer is
    /// still in a slot or not.
    fn purged(&self, incarnation: IncarnationId);
}

/// One partition's storage events. Every method is required, for the reason
/// given on [`StorageObserver`].
pub trait PartitionObserver {
    /// A commit succeeded: what it cost the device, and the log's shape after it.
    fn committed(&self, io: &CommitIo, stats: &LogStats);
    /// The log was opened (recovered) or its segments changed outside a commit
    /// (a roll or retention by the reaper): its shape now.
    fn reshaped(&self, stats: &LogStats);
    /// Retention deleted segments (by age, the only reason this log has).
    fn retained(&self, deleted: &RetentionOutcome);
    /// A retention run over the log took `took`, whatever it found to delete.
    fn retention_ran(&self, took: std::time::Duration);
    /// A read of records was answered: from memory (`device_bytes` 0: the
    /// recent-frame cache, or segment bytes an earlier read fetched), or after
    /// fetching `device_bytes` from the device.
    fn read(&self, device_bytes: u64);
}
