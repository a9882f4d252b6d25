//! The values a commit, a read or a stats request carries between a caller and the
//! partition's owner, on one shard, across the mesh, or (later) between nodes.

use std::ops::Range;

use bytes::Bytes;

use crate::ids::{Offset, PartitionId};

/// One record on its way to a partition log.
#[derive(Clone, Debug)]
pub struct OwnedRecord {
    pub key: Option<Bytes>,
    pub payload: Bytes,
    /// The word the key and payload are still masked with, as the ingress WAL
    /// stored them (the payload continuing the key's phase; see
    /// [`crate::mask`]); 0 for plain bytes. A record read from the WAL's
    /// memory keeps its bytes there until the owner's commit copies them into
    /// the partition log, unmasking them on the way.
    pub mask: u64,
}

impl OwnedRecord {
    /// The payload's plain bytes: shared when the record is plain, a copy when
    /// it is still masked.
    pub fn plain_payload(&self) -> Bytes {
        if self.mask == 0 {
            return self.payload.clone();
        }
        let mut out = Vec::with_capacity(self.payload.len());
        let phase = self.key.as_ref().map_or(0, Bytes::len);
        crate::mask::extend_unmasked(&mut out, &self.payload, self.mask, phase);
        Bytes::from(out)
    }
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
    /// The owner is stopping (or stopped): ask again elsewhere or later.
    Stopping,
}

/// One partition's shape, for `partition_stats`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionStats {
    pub partition: PartitionId,
    pub oldest_offset: Offset,
    pub next_offset: Offset,
    pub segments: usize,
    pub size_bytes: u64,
    /// See [`crate::log::LogStats::oldest_segment_ms`].
    pub oldest_segment_ms: Option<u64>,
}
