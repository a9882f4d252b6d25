//! The produce dispatcher's state machine (sans-IO): which durable WAL records go
//! into which partition commit, and how far the checkpoint may move.
//!
//! Runs on every shard, one instance per ingress WAL, driven by that shard's
//! dispatch task. The task owns the `WalReader`, the record bytes and the commit
//! RPCs; this core owns only sequence numbers, destinations and lengths. It is fed
//! events with the time passed in (records read, commit outcomes, answers about
//! deleted incarnations, ticks) and answers with [`Action`]s and a
//! [`Dispatcher::next_deadline`]. It reads no clock and does no I/O, so a seeded
//! simulation drives it through crashes and faults in milliseconds.
//!
//! Invariants (asserted, in release too):
//! - The checkpoint is the first sequence number not done (committed, or discarded
//!   after the leader confirmed its incarnation is gone); it never passes a record
//!   that is held or skipped. Done-ness lives in [`DispatchProgress`].
//! - Every sequence number between the checkpoint and the read frontier is exactly
//!   one of done, held (queued or in a commit in flight) or skipped (left in the WAL,
//!   read again in WAL order when its destination can take it, at least once a
//!   second).
//! - A destination has at most one commit in flight, hung or not; a record in a
//!   commit in flight is never sent again or rerouted until the commit is answered.
//! - Memory is bounded: held records (hung commits aside) stay under
//!   [`DispatchConfig::held_records_max`], a queue under the per-destination cap, the
//!   reader under [`DispatchConfig::lookahead_records`] past the checkpoint, commits
//!   in flight (hung included) under `commits_in_flight_max + commits_hung_max`.
//!
//! Map:
//! - [`config`]: constants, their relations, and window sizing.
//! - `destination`: one partition's queue, commit, failure and hung state.
//! - `place`: where a record read from the WAL goes (held, skipped, discarded).
//! - `commit`: starting commits (linger, byte budget, probes) and their outcomes.
//! - `reroute`: choosing a live sibling partition.
//! - `dispatcher`: the [`Dispatcher`] itself: reader position, rescans, checkpoint, ticks.

mod commit;
pub mod config;
mod destination;
mod dispatcher;
mod place;
mod reroute;
#[cfg(test)]
mod tests;

use std::rc::Rc;
use std::time::Duration;

pub use self::config::DispatchConfig;
pub use self::dispatcher::Dispatcher;
use crate::ids::{IncarnationId, PartitionId, Seq};
pub use crate::wal::DispatchProgress;

/// A partition owner: a shard on a node. Commits to another node have a byte budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OwnerId {
    pub node: u32,
    pub shard: u32,
}

/// Names one commit, so its outcome finds its records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CommitId(pub u64);

/// A topic as this shard's metadata snapshot sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopicMeta {
    pub incarnation: IncarnationId,
    pub partitions: u32,
}

/// The cluster as the driver's metadata snapshot and membership see it. Pure
/// queries: answering one must not block or change anything.
pub trait Cluster {
    /// The live topic under `name` in the local replica, if any.
    fn topic(&self, name: &str) -> Option<TopicMeta>;
    /// The owner of a partition, or `None` while it is not assigned yet.
    fn owner(&self, topic: &str, partition: PartitionId) -> Option<OwnerId>;
    /// Whether membership reports `owner` alive.
    fn is_alive(&self, owner: OwnerId) -> bool;
    /// Whether `owner` is on this node (a local commit has no byte budget).
    fn is_local(&self, owner: OwnerId) -> bool;
}

/// What the reader hands in for one record: enough to route it, not its bytes.
#[derive(Clone, Copy, Debug)]
pub struct RecordRead<'a> {
    pub seq: Seq,
    pub topic: &'a str,
    pub incarnation: IncarnationId,
    pub partition: PartitionId,
    pub encoded_bytes: u32,
}

/// How a commit ended, as the driver saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitOutcome {
    /// The owner committed the records durably.
    Committed,
    /// An error or a timeout: the records may or may not have been committed.
    Failed,
    /// The owner holds another incarnation under the name (412 remotely).
    IncarnationMismatch,
    /// The owner no longer owns the partition (a handoff); retried like a failure.
    NotOwner,
}

/// An event the driver feeds in, with the time it happened.
#[derive(Clone, Copy, Debug)]
pub enum Event<'a> {
    /// A record the reader decoded after [`Dispatcher::visit`] asked for it.
    Record(RecordRead<'a>),
    /// A commit was answered (or timed out at its budget).
    CommitDone {
        commit: CommitId,
        outcome: CommitOutcome,
    },
    /// The leader's answer to [`Action::AskGone`]: `gone` when it confirmed that
    /// `incarnation` no longer lives under `topic`.
    GoneAnswer {
        topic: &'a str,
        incarnation: IncarnationId,
        gone: bool,
    },
    /// Time passed (a deadline, the idle backstop, a membership or metadata change).
    Tick,
}

/// Why records were discarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiscardReason {
    /// The leader confirmed the incarnation the records were accepted under is gone.
    IncarnationGone,
}

/// What the driver must do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send these records (in this order) to `owner` as one commit to `partition`,
    /// and report its outcome, or `Failed` once `budget` runs out.
    StartCommit {
        commit: CommitId,
        topic: Rc<str>,
        partition: PartitionId,
        owner: OwnerId,
        seqs: Vec<Seq>,
        budget: Duration,
    },
    /// Move the reader to `seq` before its next read (a rescan).
    Seek(Seq),
    /// Store this checkpoint in the WAL (`Wal::store_checkpoint`).
    StoreCheckpoint(Seq),
    /// These records are done without a commit; drop their bytes.
    Discard {
        /// The topic, incarnation and partition the records were accepted for,
        /// for the log.
        topic: Rc<str>,
        incarnation: IncarnationId,
        partition: PartitionId,
        seqs: Vec<Seq>,
        reason: DiscardReason,
    },
    /// These records went back to the WAL; drop their bytes, they will be read again.
    Release { seqs: Vec<Seq> },
    /// Ask the leader whether `incarnation` of `topic` is gone; answer with
    /// [`Event::GoneAnswer`].
    AskGone {
        topic: Rc<str>,
        incarnation: IncarnationId,
    },
}
