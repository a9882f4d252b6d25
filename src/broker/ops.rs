//! The ops one shard sends another over the mesh, and their answers.
//!
//! These are the ops the cluster's node RPC will carry between nodes: commit a batch
//! to a partition, read a partition (replay), report partition stats, purge a
//! deleted topic. Each carries a oneshot sender for its answer; a shard that drops
//! the op (it is stopping) drops the sender, which the caller sees as a failure.
//!
//! Records travel as `Bytes`, so handing a batch to another shard moves reference
//! counts, not payloads. The values themselves are defined next to the combiner,
//! in `narad_shards::produce`.

use std::sync::Arc;

use futures_channel::oneshot;
use narad_shards::ids::{IncarnationId, Offset, PartitionId};
use narad_shards::log::ReadBatch;
pub use narad_shards::produce::{CommitError, CommitReply, OwnedRecord, PartitionStats, ReadError};

/// A message between shards.
pub enum Op {
    Commit {
        topic: Arc<str>,
        incarnation: IncarnationId,
        partition: PartitionId,
        records: Vec<OwnedRecord>,
        reply: oneshot::Sender<CommitReply>,
    },
    Read {
        topic: Arc<str>,
        incarnation: IncarnationId,
        partition: PartitionId,
        from: Offset,
        max_records: usize,
        max_bytes: usize,
        reply: oneshot::Sender<Result<ReadBatch, ReadError>>,
    },
    Stats {
        topic: Arc<str>,
        incarnation: IncarnationId,
        partitions: Vec<PartitionId>,
        reply: oneshot::Sender<Vec<Result<PartitionStats, ReadError>>>,
    },
    /// Close every log of the incarnation this shard has open; answered when none
    /// is open or in use any more.
    Purge {
        topic: Arc<str>,
        incarnation: IncarnationId,
        reply: oneshot::Sender<()>,
    },
}
