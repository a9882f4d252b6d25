//! The per-shard context every route and task of a shard uses, the mesh receive
//! loops, and the calls that reach a partition wherever its owner is.
//!
//! Which cores: one `Shard` per shard thread, behind an `Rc`. A call for a partition
//! this shard owns goes straight to its [`Owner`]; any other goes to the owning
//! shard as an [`Op`] and waits for the answer on a oneshot channel. The receive
//! loops never wait on a partition: they hand each op to the owner (which queues
//! commits and spawns reads), so a slow partition holds up only itself.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;

use futures_channel::oneshot;
use glommio::channels::shared_channel::ConnectedReceiver;
use narad_io::dma::DmaStorage;
use narad_io::mesh::MeshLink;
use narad_io::rt::Notify;
use narad_shards::ids::{IncarnationId, PartitionId};
use narad_shards::log::{ReadBatch, ReadRange};
use narad_shards::wal::Wal;

use super::ops::{CommitError, CommitReply, Op, OwnedRecord, PartitionStats, ReadError};
use crate::consume::queues::Queues;
use crate::consume::waiters::Waiters;
use crate::control::{ControlClient, MetaView};
use crate::meta::TopicRecord;
use crate::partition::RoundRobin;

/// How long a topic's GET waits for the owners of its partitions' stats (the
/// reference's 2 s).
pub const STATS_ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The partitions a shard owns, on O_DIRECT storage.
pub type Owner = narad_shards::produce::Owner<DmaStorage>;

/// One shard's broker state.
pub struct Shard {
    pub index: usize,
    pub shards: usize,
    pub meta: Rc<MetaView>,
    pub control: ControlClient,
    pub wal: Wal<DmaStorage>,
    /// WALs left by shards that no longer exist (a restart with fewer shards)
    /// that this shard is draining, by their old shard index; each leaves the
    /// list once drained.
    pub leftover_wals: RefCell<Vec<(usize, Wal<DmaStorage>)>>,
    pub owner: Rc<Owner>,
    pub mesh: MeshLink<Op>,
    pub round_robin: RefCell<RoundRobin>,
    pub storage: DmaStorage,
    /// The node's data directory (absolute).
    pub data_dir: std::path::PathBuf,
    /// Set when the node stops: parked consumers are answered at once and no new
    /// one parks.
    pub stopping: Cell<bool>,
    /// Set once this shard's HTTP requests are drained, so no produce is accepted
    /// any more: the dispatchers then send what they hold and end.
    /// [`Shard::stop_notify`] wakes the tasks that watch it.
    pub http_drained: Cell<bool>,
    pub stop_notify: Notify,
    /// Read-buffer bytes held by the tasks draining leftover WALs here,
    /// together (see `DispatchEnv::drain_held_bytes`).
    pub drain_held_bytes: Rc<Cell<u64>>,
    /// The consumer state of the partitions this shard owns.
    pub queues: Rc<Queues>,
    /// The consumers parked on this shard.
    pub waiters: Rc<Waiters>,
    /// The ack persister task's inbox.
    pub persister: Rc<crate::consume::persist::Persister>,
    /// Turns the order in which a consume scans partitions and owners.
    pub consume_turn: Cell<usize>,
    /// What every shard of the node shares: readiness, caps, the disk guard.
    pub node: std::sync::Arc<crate::http::node::NodeState>,
    /// Per-partition traffic counters.
    pub traffic: crate::metrics::Traffic,
    /// The storage series of the partitions this shard owns (also the owner's
    /// observer), read by the poller for the per-topic sizes.
    pub storage_metrics: Rc<crate::metrics::StorageMetrics>,
    /// Acks on their way to other owner shards.
    pub acks: crate::consume::acks::AckLanes,
    /// This shard's ingress WAL has waited for the disk past
    /// [`WAL_STALL_AFTER`](crate::http::node::WAL_STALL_AFTER): produces are
    /// refused here until it answers (set by [`watch_wal_stall`]).
    pub wal_stalled: Cell<bool>,
    /// This shard's ingress WAL cannot make its dispatch checkpoint durable
    /// (set by [`watch_wal_stall`]).
    pub checkpoint_failing: Cell<bool>,
}

/// How often a shard looks at how long its ingress WAL has waited for the
/// disk ([`watch_wal_stall`]).
const WAL_STALL_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Marks the shard's WAL stalled while its records have waited past
/// [`WAL_STALL_AFTER`](crate::http::node::WAL_STALL_AFTER) for the disk, and
/// not once it answers, until the shard stops. A task of its own that does no
/// I/O: the metrics poller reads partition logs, which a stalled disk would
/// hold up, the check with them.
pub async fn watch_wal_stall(shard: Rc<Shard>) {
    while !shard.stopping.get() {
        let waited = shard.wal.stalled_for(std::time::Instant::now());
        let latched = shard.wal.is_latched();
        shard
            .node
            .note_wal_wait(shard.index, &shard.wal_stalled, waited, latched);
        shard
            .node
            .note_checkpoint_failing(&shard.checkpoint_failing, shard.wal.checkpoint_failing());
        narad_io::rt::sleep(WAL_STALL_CHECK_EVERY).await;
    }
}

impl Shard {
    /// The shard that owns a partition.
    pub fn owner_of(&self, id: IncarnationId, partition: PartitionId) -> usize {
        super::owner_shard(id, partition, self.shards)
    }

    /// Commits records to a partition, wherever its owner is.
    pub async fn commit(
        &self,
        topic: Arc<str>,
        incarnation: IncarnationId,
        partition: PartitionId,
        records: Vec<OwnedRecord>,
    ) -> CommitReply {
        let stopped = || Err(CommitError::Failed("the owner shard stopped".into()));
        let owner = self.owner_of(incarnation, partition);
        if owner == self.index {
            let (reply, answer) = oneshot::channel();
            self.owner
                .commit(topic, incarnation, partition, records, reply);
            return answer.await.unwrap_or_else(|_| stopped());
        }
        let op = |reply| Op::Commit {
            topic,
            incarnation,
            partition,
            records,
            reply,
        };
        self.ask(owner, op, stopped).await
    }

    /// Reads `range` of a partition, wherever its owner is.
    pub async fn read(
        &self,
        topic: Arc<str>,
        incarnation: IncarnationId,
        partition: PartitionId,
        range: ReadRange,
    ) -> Result<ReadBatch, ReadError> {
        let owner = self.owner_of(incarnation, partition);
        if owner == self.index {
            return self.owner.read(&topic, incarnation, partition, range).await;
        }
        let op = |reply| Op::Read {
            topic,
            incarnation,
            partition,
            range,
            reply,
        };
        let stopped = || Err(ReadError::Stopping);
        self.ask(owner, op, stopped).await
    }

    /// The topic `name` if it is still the incarnation `id`.
    pub fn live_topic(&self, name: &str, id: IncarnationId) -> Option<Arc<TopicRecord>> {
        self.meta
            .snapshot()
            .topics
            .get(name)
            .filter(|t| t.id == id)
            .cloned()
    }

    /// The topic's partitions this shard owns, starting at a turning point so that
    /// consumes spread over them.
    pub fn local_partitions(&self, record: &TopicRecord) -> Vec<PartitionId> {
        let mut local: Vec<PartitionId> = (0..record.partitions)
            .map(PartitionId)
            .filter(|&p| self.owner_of(record.id, p) == self.index)
            .collect();
        if !local.is_empty() {
            let turn = self.next_turn() % local.len();
            local.rotate_left(turn);
        }
        local
    }

    /// The other shards that own partitions of the topic, from a turning point.
    pub fn remote_owners(&self, record: &TopicRecord) -> Vec<usize> {
        let mut owners: Vec<usize> = (0..record.partitions.min(self.shards as u32))
            .map(|p| self.owner_of(record.id, PartitionId(p)))
            .filter(|&s| s != self.index)
            .collect();
        owners.sort_unstable();
        owners.dedup();
        if !owners.is_empty() {
            let turn = self.next_turn() % owners.len();
            owners.rotate_left(turn);
        }
        owners
    }

    /// A counter that moves on every call: whose turn it is to come first
    /// among a shard's partitions or the other owners.
    pub fn next_turn(&self) -> usize {
        let turn = self.consume_turn.get();
        self.consume_turn.set(turn.wrapping_add(1));
        turn
    }

    /// Sends another shard an op built around a reply channel and waits for the
    /// answer; `stopped` answers for a shard that dropped the op.
    pub async fn ask<T>(
        &self,
        to: usize,
        op: impl FnOnce(oneshot::Sender<T>) -> Op,
        stopped: impl FnOnce() -> T,
    ) -> T {
        let (reply, answer) = oneshot::channel();
        self.send(to, op(reply)).await;
        answer.await.unwrap_or_else(|_| stopped())
    }

    /// Stats of the given partitions of a topic, asking each owner shard once,
    /// in partition order, each labelled with its partition. Every owner works
    /// at the same time (this shard's own partitions in a task of their own);
    /// partitions whose owner has not answered within [`STATS_ANSWER_WAIT`] of
    /// the call get an error (the topic's GET shows placeholders for them
    /// rather than hang).
    pub async fn stats(
        &self,
        topic: Arc<str>,
        incarnation: IncarnationId,
        partitions: impl IntoIterator<Item = PartitionId>,
    ) -> Vec<(PartitionId, Result<PartitionStats, ReadError>)> {
        type Answer = Vec<Result<PartitionStats, ReadError>>;
        let deadline = std::time::Instant::now() + STATS_ANSWER_WAIT;
        let left = || deadline.saturating_duration_since(std::time::Instant::now());
        let mut by_shard: Vec<Vec<PartitionId>> = vec![Vec::new(); self.shards];
        for p in partitions {
            by_shard[self.owner_of(incarnation, p)].push(p);
        }
        let mut answers = Vec::new();
        for (shard, list) in by_shard.into_iter().enumerate() {
            if list.is_empty() {
                continue;
            }
            let answer: std::pin::Pin<Box<dyn Future<Output = Option<Answer>>>> =
                if shard == self.index {
                    let owner = self.owner.clone();
                    let (topic, list) = (topic.clone(), list.clone());
                    Box::pin(narad_io::rt::spawn_local(async move {
                        let mut out = Vec::with_capacity(list.len());
                        for p in list {
                            out.push(owner.stats(&topic, incarnation, p).await);
                        }
                        out
                    }))
                } else {
                    let (reply, answer) = oneshot::channel();
                    let op = Op::Stats {
                        topic: topic.clone(),
                        incarnation,
                        partitions: list.clone(),
                        reply,
                    };
                    // A peer whose channel stays full past the wait is not
                    // asked at all.
                    let sent = futures_lite::future::or(
                        async {
                            self.send(shard, op).await;
                            true
                        },
                        async {
                            narad_io::rt::sleep(left()).await;
                            false
                        },
                    )
                    .await;
                    match sent {
                        true => Box::pin(async move { answer.await.ok() }),
                        false => Box::pin(std::future::ready(None)),
                    }
                };
            answers.push((list, answer));
        }
        let mut all = Vec::new();
        for (list, answer) in answers {
            let wait = left();
            let answer = futures_lite::future::or(answer, async {
                narad_io::rt::sleep(wait).await;
                None
            })
            .await;
            match answer {
                Some(answer) => all.extend(list.into_iter().zip(answer)),
                None => all.extend(list.into_iter().map(|p| {
                    let why = "the owner shard did not answer (stopped, or slower than the wait)";
                    (p, Err(ReadError::Failed(why.into())))
                })),
            }
        }
        all.sort_by_key(|(p, _)| p.0);
        all
    }

    /// [`Shard::queues_release`] that never waits: records of this shard's own
    /// partitions go back now, the others in a task of their own, so a caller
    /// that goes away (a consume whose client hung up) cannot leave them leased.
    pub fn queues_release_detached(
        self: &Rc<Self>,
        incarnation: IncarnationId,
        topic: &Arc<str>,
        delivered: Vec<crate::consume::Delivered>,
    ) {
        let (here, elsewhere): (Vec<_>, Vec<_>) = delivered
            .into_iter()
            .partition(|d| self.owner_of(incarnation, d.partition) == self.index);
        if !here.is_empty() {
            self.queues.release_delivered(incarnation, topic, &here);
        }
        if !elsewhere.is_empty() {
            let (shard, topic) = (self.clone(), topic.clone());
            narad_io::rt::spawn_local(async move {
                shard.queues_release(incarnation, &topic, elsewhere).await;
            });
        }
    }

    /// Gives leased records nobody will receive back to their owners.
    pub async fn queues_release(
        &self,
        incarnation: IncarnationId,
        topic: &Arc<str>,
        delivered: Vec<crate::consume::Delivered>,
    ) {
        let mut by_owner: Vec<Vec<crate::consume::Delivered>> = vec![Vec::new(); self.shards];
        for d in delivered {
            by_owner[self.owner_of(incarnation, d.partition)].push(d);
        }
        for (owner, records) in by_owner.into_iter().enumerate() {
            if records.is_empty() {
                continue;
            }
            if owner == self.index {
                self.queues.release_delivered(incarnation, topic, &records);
            } else {
                let op = Op::Release {
                    topic: topic.clone(),
                    incarnation,
                    delivered: records,
                };
                self.send(owner, op).await;
            }
        }
    }

    /// Drops a deleted incarnation's consumer state, parked consumers and
    /// cached metric handles here.
    pub fn forget_consumers(&self, incarnation: IncarnationId) {
        self.queues.drop_incarnation(incarnation);
        self.waiters.drop_incarnation(incarnation);
        self.persister.forget(incarnation);
        self.traffic.forget(incarnation);
    }

    /// Closes the incarnation's logs on every shard; returns when all have.
    pub async fn purge_everywhere(&self, topic: Arc<str>, incarnation: IncarnationId) {
        let mut answers = Vec::new();
        for shard in (0..self.shards).filter(|&s| s != self.index) {
            let (reply, answer) = oneshot::channel();
            self.send(
                shard,
                Op::Purge {
                    topic: topic.clone(),
                    incarnation,
                    reply,
                },
            )
            .await;
            answers.push(answer);
        }
        self.owner.purge(incarnation).await;
        self.forget_consumers(incarnation);
        for answer in answers {
            let _ = answer.await;
        }
    }

    /// Has every shard serve the topic's parked consumers again (its caps
    /// changed: a consumer turned away at the old ones may take records now).
    pub async fn kick_everywhere(&self, topic: &Arc<str>, incarnation: IncarnationId) {
        self.waiters.kick(incarnation, topic);
        for shard in (0..self.shards).filter(|&s| s != self.index) {
            let op = Op::Kick {
                topic: topic.clone(),
                incarnation,
            };
            self.send(shard, op).await;
        }
    }

    /// Sends an op; a stopped peer drops it, which its caller sees as a failure.
    pub async fn send(&self, to: usize, op: Op) {
        // A failed send drops the op and its reply sender with it.
        let _ = self.mesh.send(to, op).await;
    }
}

/// Serves the ops one peer shard sends, until that peer stops.
pub async fn receive_loop(shard: Rc<Shard>, receiver: ConnectedReceiver<Op>) {
    let mut served = 0u32;
    while let Some(op) = receiver.recv().await {
        // A receive from a channel that is never empty never waits: a peer
        // that keeps it full must not keep this shard's other tasks from
        // running past their time slice.
        served = served.wrapping_add(1);
        if served % 32 == 0 {
            narad_io::rt::yield_now().await;
        }
        match op {
            Op::Commit {
                topic,
                incarnation,
                partition,
                records,
                reply,
            } => {
                if shard.owner_of(incarnation, partition) != shard.index {
                    let _ = reply.send(Err(CommitError::NotOwner));
                } else {
                    shard
                        .owner
                        .commit(topic, incarnation, partition, records, reply);
                }
            }
            Op::Read {
                topic,
                incarnation,
                partition,
                range,
                reply,
            } => {
                let owner = shard.owner.clone();
                narad_io::rt::spawn_local(async move {
                    let result = owner.read(&topic, incarnation, partition, range).await;
                    let _ = reply.send(result);
                });
            }
            Op::Stats {
                topic,
                incarnation,
                partitions,
                reply,
            } => {
                let owner = shard.owner.clone();
                narad_io::rt::spawn_local(async move {
                    let mut out = Vec::with_capacity(partitions.len());
                    for p in partitions {
                        out.push(owner.stats(&topic, incarnation, p).await);
                    }
                    let _ = reply.send(out);
                });
            }
            Op::Purge {
                incarnation, reply, ..
            } => {
                let shard = shard.clone();
                narad_io::rt::spawn_local(async move {
                    shard.owner.purge(incarnation).await;
                    shard.forget_consumers(incarnation);
                    let _ = reply.send(());
                });
            }
            op => super::ops::serve_consume_op(&shard, op),
        }
    }
}
