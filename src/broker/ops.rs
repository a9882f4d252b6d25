//! The ops one shard sends another over the mesh, and their answers.
//!
//! These are the ops the cluster's node RPC will carry between nodes: commit a batch
//! to a partition, read a partition (replay), report partition stats, purge a
//! deleted topic. Each carries a oneshot sender for its answer; a shard that drops
//! the op (it is stopping) drops the sender, which the caller sees as a failure.
//!
//! Records travel as `Bytes`, so handing a batch to another shard moves reference
//! counts, not payloads.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures_channel::oneshot;
use narad_shards::ids::{IncarnationId, Offset, PartitionId};
use narad_shards::log::ReadBatch;

/// One record on its way to a partition log.
#[derive(Clone, Debug)]
pub struct OwnedRecord {
    pub key: Option<Bytes>,
    pub payload: Bytes,
}

/// Why a commit did not happen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommitError {
    /// The partition's log failed (I/O, poisoned, read-back mismatch); retry later.
    Failed(String),
    /// The owner's metadata holds another incarnation under the name, or none:
    /// nothing was appended (412 between nodes).
    IncarnationMismatch,
    /// This shard does not own the partition (the shard count changed meanwhile).
    NotOwner,
}

/// The answer to a commit: the offsets the records took.
pub type CommitReply = Result<Range<Offset>, CommitError>;

/// Why a read or stats request failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadError {
    /// The topic incarnation is not live here.
    NotFound,
    /// The offset is below the oldest retained one.
    AgedOut { oldest: Offset },
    /// The log could not be opened or read.
    Failed(String),
}

/// One partition's shape, for `partition_stats`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionStats {
    pub partition: PartitionId,
    pub oldest_offset: Offset,
    pub next_offset: Offset,
    pub segments: usize,
    pub size_bytes: u64,
}

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
