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
use std::time::Duration;

use futures_channel::oneshot;
use narad_shards::consume::tokens::PromiseId;
use narad_shards::ids::{IncarnationId, PartitionId};
use narad_shards::log::{ReadBatch, ReadRange};
pub use narad_shards::produce::{CommitError, CommitReply, OwnedRecord, PartitionStats, ReadError};

pub use crate::consume::acks::SettleItem;
pub use crate::consume::{ConsumeError, Delivered, Settle, SettleError};

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
        range: ReadRange,
        reply: oneshot::Sender<Result<ReadBatch, ReadError>>,
    },
    Stats {
        topic: Arc<str>,
        incarnation: IncarnationId,
        partitions: Vec<PartitionId>,
        reply: oneshot::Sender<Vec<Result<PartitionStats, ReadError>>>,
    },
    /// Take up to `max` records of the topic's partitions here (or of `partition`
    /// only), for a probe, a claim after a notification (`claim`: the claiming
    /// shard and the promise it answers), or a pinned long-poll (`wait`, zero for
    /// none). A reply nobody receives is released.
    Consume {
        topic: Arc<str>,
        incarnation: IncarnationId,
        partition: Option<PartitionId>,
        max: usize,
        claim: Option<(usize, PromiseId)>,
        wait: Duration,
        reply: oneshot::Sender<Result<Vec<Delivered>, ConsumeError>>,
    },
    /// Leave (or renew) the sender's delivery token for a topic, for `ttl`.
    Register {
        topic: Arc<str>,
        incarnation: IncarnationId,
        from: usize,
        ttl: Duration,
    },
    /// The owner `owner` spent this shard's token: a record is there to claim,
    /// promised as `promise`.
    Notify {
        topic: Arc<str>,
        incarnation: IncarnationId,
        owner: usize,
        promise: PromiseId,
    },
    /// Notified shard `from` had nobody left to take the record of `promise`.
    Pass {
        topic: Arc<str>,
        incarnation: IncarnationId,
        from: usize,
        promise: PromiseId,
    },
    /// The topic changed (its caps were altered): serve its parked consumers
    /// again.
    Kick {
        topic: Arc<str>,
        incarnation: IncarnationId,
    },
    /// Records a consumer on another shard could not take: release them.
    Release {
        topic: Arc<str>,
        incarnation: IncarnationId,
        delivered: Vec<Delivered>,
    },
    /// Acks, extends and nacks, applied in order; each record is answered on
    /// its own, then `done` says the op is finished.
    SettleBatch {
        items: Vec<SettleItem>,
        done: oneshot::Sender<()>,
    },
    /// Close every log of the incarnation this shard has open; answered when none
    /// is open or in use any more.
    Purge {
        topic: Arc<str>,
        incarnation: IncarnationId,
        reply: oneshot::Sender<()>,
    },
}

/// Serves the consume ops a peer shard sent (everything but commit, read, stats
/// and purge): none of them waits in the receive loop.
pub fn serve_consume_op(shard: &std::rc::Rc<super::Shard>, op: Op) {
    use crate::consume::flow::{self, ConsumeRequest};
    match op {
        Op::Consume {
            topic,
            incarnation,
            partition,
            max,
            claim,
            wait,
            reply,
        } => {
            let request = ConsumeRequest {
                partition,
                max,
                wait,
            };
            narad_io::rt::spawn_local(flow::serve_consume_op(
                shard.clone(),
                topic,
                incarnation,
                partition,
                request,
                claim,
                reply,
            ));
        }
        Op::Register {
            topic,
            incarnation,
            from,
            ttl,
        } => {
            // A registration that crossed the topic's delete would leave a token
            // entry nothing ever spends or prunes.
            if shard.live_topic(&topic, incarnation).is_some() {
                shard.queues.register(&topic, incarnation, from, ttl);
            }
        }
        Op::Notify {
            topic,
            incarnation,
            owner,
            promise,
        } => shard.waiters.notified(incarnation, &topic, owner, promise),
        Op::Pass {
            topic,
            incarnation,
            from,
            promise,
        } => {
            shard.queues.retire_notification(incarnation, from, promise);
            shard.waiters.kick(incarnation, &topic);
        }
        Op::Kick { topic, incarnation } => shard.waiters.kick(incarnation, &topic),
        Op::Release {
            topic,
            incarnation,
            delivered,
        } => shard
            .queues
            .release_delivered(incarnation, &topic, &delivered),
        Op::SettleBatch { items, done } => {
            for item in items {
                let answer = match shard.live_topic(&item.topic, item.incarnation) {
                    None => Err(SettleError::NotFound),
                    Some(record) => shard
                        .queues
                        .settle(
                            &record,
                            item.partition,
                            item.offset,
                            item.nonce,
                            item.settle,
                        )
                        .map_err(|_| SettleError::Stale),
                };
                let _ = item.reply.send(answer);
            }
            let _ = done.send(());
        }
        Op::Commit { .. } | Op::Read { .. } | Op::Stats { .. } | Op::Purge { .. } => {
            unreachable!("served by the receive loop")
        }
    }
}
