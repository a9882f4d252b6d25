//! The produce path past the WAL: the dispatch task that drives the dispatcher, and
//! the owner side that commits into partition logs (the commit combiner).
//!
//! Map:
//! - [`types`]: what a commit, a read and a stats request carry and answer.
//! - [`combiner`]: the partitions a shard owns: logs, the commit combiner, reads,
//!   stats, purge.
//! - [`reaper`]: retention, time-based roll and idle eviction of the owned logs.
//! - [`observe`]: the storage events the owner reports (for the metrics).
//! - [`driver`]: the dispatch task over one WAL.

pub mod combiner;
pub mod driver;
pub mod observe;
mod reads;
pub mod reaper;
pub mod types;

pub use combiner::{Liveness, OnVisible, Owner};
pub use driver::{DispatchEnv, DriverConfig, Mode};
pub use observe::{PartitionObserver, StorageObserver};
pub use reaper::{OwnedPartition, OwnedPartitions, ReaperConfig, Retention, RetentionOf};
pub use types::{CommitError, CommitReply, OwnedRecord, PartitionStats, ReadError};

use crate::ids::{IncarnationId, PartitionId};

/// The storage-relative directory of one partition's log: bound to the topic's
/// incarnation, so a recreated topic never opens its predecessor's data.
pub fn partition_dir(topic: &str, id: IncarnationId, partition: PartitionId) -> String {
    format!("{}/p{:05}", incarnation_dir(topic, id), partition.0)
}

/// The storage-relative directory of one topic incarnation.
pub fn incarnation_dir(topic: &str, id: IncarnationId) -> String {
    format!("topics/{topic}/{id}")
}
