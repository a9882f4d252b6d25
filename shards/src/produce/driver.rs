//! The dispatch task: drives one WAL's sans-IO [`Dispatcher`] with real reads,
//! real commits and real time.
//!
//! Which cores: every shard runs one for its own WAL, and one for each WAL left by
//! a shard that no longer exists (a restart with fewer shards), until that WAL is
//! drained. The task owns the `WalReader` and the bytes of the records the
//! dispatcher holds; the dispatcher owns the decisions (see [`crate::dispatch`]).
//! What it needs from the node (metadata, where commits go, the stop signal) comes
//! through [`DispatchEnv`], so the simulation runs this same task over the
//! fault-injecting disk.
//!
//! One turn: read what the dispatcher's budget allows (each record decoded once;
//! its key and payload, still masked, shared with the batch the WAL keeps in
//! memory, or copied out of a read from the device; held until its commit lands
//! or it goes back to the WAL), feed a tick, feed the commit outcomes that arrived, carry out
//! the actions (start commits as tasks, seek the reader, store the checkpoint, drop
//! bytes), then sleep until a record becomes durable, a commit is answered, the
//! dispatcher's deadline, or the backstop: 10 ms while it holds records or has
//! commits in flight, 1 s when it has nothing to do (an idle node's shards then
//! wake once a second for it, not a hundred times).
//!
//! A commit is a task of its own: it sends the records to the owner (this shard's
//! combiner, or another shard's over the mesh), waits at most the dispatcher's
//! budget, and posts the outcome back. Metadata questions ("is this incarnation
//! gone?") are answered from this node's own metadata, which on one node is the
//! leader's.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_lite::future::or;
use narad_io::rt::Notify;
use narad_io::Storage;

use super::types::{CommitError, CommitReply, OwnedRecord};
use crate::dispatch::{
    Action, Cluster, CommitId, CommitOutcome, DispatchConfig, Dispatcher, Event, RecordRead,
};
use crate::ids::{DenseIdMap, IncarnationId, PartitionId, Seq, SeqMap};
use crate::wal::{SharedRecord, Wal, WalReader};

/// Records read per turn at most.
const READ_CHUNK_RECORDS: usize = 4_096;
/// Frame bytes read per turn at most (beyond the first record).
pub const READ_CHUNK_BYTES: u64 = 16 << 20;
/// Bytes of read buffers the records held may keep alive, past which nothing
/// more is read until commits release some.
pub const HELD_BYTES_MAX: u64 = 256 << 20;
/// Records read from the device copy their keys and payloads into buffers
/// the read's records share, of at most about this size, so that a record
/// held a while keeps at most one such buffer alive, not the whole read.
/// (Records read from the WAL's memory are not copied: they share the kept
/// batch they lie in, which the WAL's flushes bound the same way. One held for
/// long, a failing partition's probe, is copied out into bytes of its own: see
/// `HeldBytes::detach`.)
const SHARED_BUFFER_BYTES: usize = 1 << 20;
/// A read's first shared buffer; each next one doubles, up to
/// [`SHARED_BUFFER_BYTES`]. At low rates a read holds a few records, and a
/// megabyte for each (allocated, its fresh pages zeroed by the kernel, then
/// shrunk by a copy) cost more than the records' own handling.
const FIRST_BUFFER_BYTES: usize = 64 << 10;

/// The dispatch task's timings. [`Default`] gives production values; the
/// simulation shrinks them so that a seed runs in milliseconds.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    pub dispatch: DispatchConfig,
    /// The backstop while records are held or commits are in flight: bounds a
    /// missed wake-up.
    pub backstop: Duration,
    /// The backstop with nothing held and nothing in flight: every wake-up that
    /// matters then (a record durable, a commit answered, a deadline, the stop)
    /// is awaited directly.
    pub idle_backstop: Duration,
    /// How long a stopping dispatcher waits for its commits in flight.
    pub stop_grace: Duration,
    /// How long the task pauses after a WAL read error.
    pub read_error_backoff: Duration,
    /// See [`READ_CHUNK_BYTES`].
    pub read_bytes_max: u64,
    /// See [`HELD_BYTES_MAX`].
    pub held_bytes_max: u64,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            dispatch: DispatchConfig::default(),
            backstop: Duration::from_millis(10),
            idle_backstop: Duration::from_secs(1),
            stop_grace: Duration::from_secs(5),
            read_error_backoff: Duration::from_secs(1),
            read_bytes_max: READ_CHUNK_BYTES,
            held_bytes_max: HELD_BYTES_MAX,
        }
    }
}

/// What the dispatch task needs from its node.
pub trait DispatchEnv: 'static {
    /// The cluster as the node's metadata sees it now (an owned, cheap snapshot).
    type View: Cluster;
    fn view(&self) -> Self::View;
    /// Commits records to a partition, wherever its owner is.
    fn commit(
        &self,
        topic: Arc<str>,
        incarnation: IncarnationId,
        partition: PartitionId,
        records: Vec<OwnedRecord>,
    ) -> Pin<Box<dyn Future<Output = CommitReply>>>;
    /// Whether the node is stopping.
    fn stopping(&self) -> bool;
    /// Woken when the node starts stopping.
    fn stop_notify(&self) -> &Notify;
    /// After each turn: the bytes of read buffers the held records keep alive.
    fn held_bytes(&self, _bytes: u64) {}
    /// The count of read-buffer bytes held by every task of this shard that
    /// drains a leftover WAL, shared by them so that together they stay within
    /// one [`DriverConfig::held_bytes_max`] (a node restarted with fewer shards
    /// drains several at once); `None`: each counts alone. A shard's own WAL's
    /// task always counts alone, so drains never hold back new records.
    fn drain_held_bytes(&self) -> Option<Rc<std::cell::Cell<u64>>> {
        None
    }
}

/// A record read from the WAL in this round, and where its key and payload are.
struct Visited {
    seq: Seq,
    incarnation: IncarnationId,
    bytes: VisitedBytes,
    accept_time_ms: u64,
}

enum VisitedBytes {
    /// Read from the WAL's memory: slices of the round's kept batch `kept`,
    /// still masked.
    Shared { kept: usize, record: SharedRecord },
    /// Read from the device: copied, plain, into the round's buffer `buffer`.
    Copied {
        buffer: usize,
        key: Option<std::ops::Range<usize>>,
        payload: std::ops::Range<usize>,
    },
}

/// What a round's records keep alive, each part counted once while any of its
/// records is held: the WAL's kept batches they were read from (the frame
/// bytes the round visited in each), and the buffers that records read from
/// the device were copied into.
#[derive(Default)]
struct RoundBytes {
    /// Per kept batch: its address, to tell batches apart, and the frame
    /// bytes visited in it.
    kept: Vec<(*const u8, u64)>,
    buffers: Vec<Vec<u8>>,
}

impl RoundBytes {
    /// The index of the kept batch `kept`, counting `frame_bytes` more in it.
    fn kept(&mut self, kept: &Bytes, frame_bytes: u64) -> usize {
        match self.kept.last_mut() {
            Some((at, bytes)) if *at == kept.as_ptr() => *bytes += frame_bytes,
            _ => self.kept.push((kept.as_ptr(), frame_bytes)),
        }
        self.kept.len() - 1
    }

    /// The buffer to copy a record of `need` plain bytes into, and its index.
    fn buffer(&mut self, need: usize) -> (usize, &mut Vec<u8>) {
        let next = match self.buffers.last() {
            Some(last) if last.is_empty() || last.len() + need <= last.capacity() => None,
            Some(last) => Some((last.capacity() * 2).min(SHARED_BUFFER_BYTES)),
            None => Some(FIRST_BUFFER_BYTES),
        };
        if let Some(capacity) = next {
            self.buffers.push(Vec::with_capacity(capacity.max(need)));
        }
        let index = self.buffers.len() - 1;
        (index, &mut self.buffers[index])
    }
}

/// A record's bytes while the dispatcher holds it: slices of the WAL's kept
/// batch it was read from, or of the buffer of the read that copied it (either
/// lives until its last record is released).
struct HeldBytes {
    /// Counts what it keeps alive as held until the last record sharing it is
    /// released.
    charge: Rc<Charge>,
    incarnation: IncarnationId,
    key: Option<Bytes>,
    payload: Bytes,
    /// See [`OwnedRecord::mask`].
    mask: u64,
    /// When the accepting shard took the record (Unix ms), for the
    /// produce-to-committed histogram.
    accept_time_ms: u64,
}

impl HeldBytes {
    /// Copies the key and payload into an allocation of their own, charged
    /// alone, so that holding this record no longer keeps its read's shared
    /// buffer alive.
    fn detach(&mut self, total: &Rc<std::cell::Cell<u64>>) {
        let key_len = self.key.as_ref().map_or(0, Bytes::len);
        let len = key_len + self.payload.len();
        if self.mask == 0 && Rc::strong_count(&self.charge) == 1 && self.charge.bytes == len as u64
        {
            return; // detached by an earlier failure
        }
        let mut own = Vec::with_capacity(len);
        if let Some(key) = &self.key {
            crate::mask::extend_unmasked(&mut own, key, self.mask, 0);
        }
        crate::mask::extend_unmasked(&mut own, &self.payload, self.mask, key_len);
        let own = Bytes::from(own);
        self.charge = Charge::new(own.len() as u64, total);
        self.key = self.key.is_some().then(|| own.slice(..key_len));
        self.payload = own.slice(key_len..);
        self.mask = 0;
    }
}

/// One read buffer's bytes, counted in the total while any record of it is held.
struct Charge {
    bytes: u64,
    total: Rc<std::cell::Cell<u64>>,
}

impl Charge {
    fn new(bytes: u64, total: &Rc<std::cell::Cell<u64>>) -> Rc<Charge> {
        total.set(total.get() + bytes);
        Rc::new(Charge {
            bytes,
            total: total.clone(),
        })
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.total.set(self.total.get() - self.bytes);
    }
}

/// What commit tasks post back.
#[derive(Default)]
struct Outcomes {
    done: RefCell<VecDeque<(CommitId, CommitOutcome)>>,
    notify: Notify,
    in_flight: std::cell::Cell<usize>,
}

/// Whether the task runs for the shard's own WAL or drains a leftover one.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// Runs until the shard stops.
    Own,
    /// Runs until the WAL is drained (or the shard stops).
    Drain,
}

/// Runs the dispatcher of `wal` until the shard stops (or, in `Drain` mode, until
/// everything in the WAL is committed).
pub async fn run<E: DispatchEnv, S: Storage>(
    env: Rc<E>,
    wal: Wal<S>,
    name: String,
    mode: Mode,
    config: DriverConfig,
) {
    let start = wal.checkpoint();
    // Records a graceful stop committed above the checkpoint are passed over.
    // The open matched the done-set to the recovered checkpoint, and nothing
    // stores one before this: the filter only keeps a stale one out.
    let left = wal.take_dispatched();
    let mut dispatcher = match left.filter(|p| p.checkpoint() == start) {
        Some(progress) => {
            let done = progress.done_above().filter(|&d| d).count();
            tracing::info!(wal = %name, checkpoint = start.0, done, "resuming dispatch past the records the last stop had committed above the checkpoint");
            Dispatcher::resume(config.dispatch.clone(), progress, Instant::now())
        }
        None => Dispatcher::new(config.dispatch.clone(), start, Instant::now()),
    };
    let mut reader: WalReader<S> = wal.reader(start);
    let mut held: SeqMap<HeldBytes> = SeqMap::default();
    let held_bytes = match (mode, env.drain_held_bytes()) {
        (Mode::Drain, Some(shared)) => shared,
        _ => Rc::new(std::cell::Cell::new(0u64)),
    };
    let mut commits: DenseIdMap<CommitId, Vec<Seq>> = DenseIdMap::default();
    let mut discards = DiscardNotes::default();
    let outcomes = Rc::new(Outcomes::default());
    let mut stop_deadline: Option<Instant> = None;
    tracing::info!(wal = %name, checkpoint = start.0, durable = wal.durable_next().0, "dispatcher started");
    loop {
        let now = Instant::now();
        // A stopping dispatcher reads nothing new but sends what it holds, so that
        // the checkpoint passes every record committed before the stop and a clean
        // restart replays nothing twice; the grace bounds it.
        if env.stopping() {
            let deadline = *stop_deadline.get_or_insert(now + config.stop_grace);
            // A drain task holding nothing may still be held back by the
            // budget it shares with the shard's other drains: it polls for
            // room as before.
            let idle = dispatcher.held_records_total() == 0
                && outcomes.in_flight.get() == 0
                && held_bytes.get() < config.held_bytes_max;
            if idle || now >= deadline {
                break;
            }
        }
        let cluster = env.view();
        // Read what the window allows.
        let budget = if stop_deadline.is_some() || held_bytes.get() >= config.held_bytes_max {
            0
        } else {
            dispatcher.read_budget().min(READ_CHUNK_RECORDS)
        };
        let mut read_failed = false;
        if budget > 0 && reader.position() < wal.durable_next() {
            // A record read from the WAL's memory shares the kept batch it
            // lies in, still masked. One read from the device is copied out:
            // the keys and payloads of one read share a few buffers (one
            // allocation per megabyte, not two per record), each sized up
            // front so that no record's copy first moves the ones before it.
            // The records are held once the read is done.
            let mut round = RoundBytes::default();
            let mut visited: Vec<Visited> = Vec::with_capacity(budget.min(1_024));
            let read = reader
                .read_bounded(budget, config.read_bytes_max, |seq, record| {
                    if !dispatcher.visit(seq) {
                        return;
                    }
                    let bytes = match (record.kept(), record.shared()) {
                        (Some(kept), Some(shared)) => VisitedBytes::Shared {
                            kept: round.kept(kept, record.frame_len() as u64),
                            record: shared,
                        },
                        _ => {
                            let (index, buffer) = round.buffer(record.plain_len());
                            let start = buffer.len();
                            record.key_to(buffer);
                            let key_end = buffer.len();
                            record.payload_to(buffer);
                            VisitedBytes::Copied {
                                buffer: index,
                                key: record.has_key().then_some(start..key_end),
                                payload: key_end..buffer.len(),
                            }
                        }
                    };
                    visited.push(Visited {
                        seq,
                        incarnation: record.incarnation,
                        bytes,
                        accept_time_ms: record.accept_time_ms,
                    });
                    let encoded_bytes = record.frame_len() as u32;
                    dispatcher.handle(
                        now,
                        Event::Record(RecordRead {
                            seq,
                            topic: record.topic,
                            incarnation: record.incarnation,
                            partition: record.partition,
                            encoded_bytes,
                        }),
                        &cluster,
                    );
                })
                .await;
            // Before any action is applied: commits look their records up here.
            // Only records the dispatcher holds keep their bytes: one it skipped
            // is read again later, and one it discarded is done.
            let kept: Vec<Rc<Charge>> = (round.kept.iter())
                .map(|&(_, bytes)| Charge::new(bytes, &held_bytes))
                .collect();
            let buffers: Vec<(Bytes, Rc<Charge>)> = round
                .buffers
                .into_iter()
                .map(|mut b| {
                    // Room a short read left unused goes back (the allocator
                    // shrinks in place); the charge is what is kept.
                    b.shrink_to_fit();
                    let charge = Charge::new(b.len() as u64, &held_bytes);
                    (Bytes::from(b), charge)
                })
                .collect();
            for v in visited.into_iter().filter(|v| dispatcher.is_held(v.seq)) {
                let (charge, key, payload, mask) = match v.bytes {
                    VisitedBytes::Shared { kept: i, record } => {
                        (&kept[i], record.key, record.payload, record.mask)
                    }
                    VisitedBytes::Copied {
                        buffer: i,
                        key,
                        payload,
                    } => {
                        let (buffer, charge) = &buffers[i];
                        let key = key.map(|range| buffer.slice(range));
                        (charge, key, buffer.slice(payload), 0)
                    }
                };
                held.insert(
                    v.seq,
                    HeldBytes {
                        charge: charge.clone(),
                        incarnation: v.incarnation,
                        key,
                        payload,
                        mask,
                        accept_time_ms: v.accept_time_ms,
                    },
                );
            }
            drop((kept, buffers));
            if let Err(e) = read {
                tracing::error!(wal = %name, error = %e, "cannot read the ingress WAL; dispatch paused");
                read_failed = true;
            }
        }
        let finished: Vec<(CommitId, CommitOutcome)> =
            outcomes.done.borrow_mut().drain(..).collect();
        let mut failed: Vec<Seq> = Vec::new();
        for (commit, outcome) in finished {
            let seqs = commits.remove(&commit).unwrap_or_default();
            match outcome {
                CommitOutcome::Committed => {
                    for seq in seqs {
                        held.remove(&seq);
                    }
                }
                CommitOutcome::Failed => failed.extend(seqs),
                _ => {}
            }
            dispatcher.handle(now, Event::CommitDone { commit, outcome }, &cluster);
        }
        dispatcher.handle(now, Event::Tick, &cluster);
        // Applying an action can feed an event (a gone answer), which can add more.
        loop {
            let actions: Vec<Action> = dispatcher.drain_actions().collect();
            if actions.is_empty() {
                break;
            }
            for action in actions {
                apply(
                    &env,
                    &wal,
                    &mut reader,
                    &mut dispatcher,
                    &mut held,
                    &mut commits,
                    &mut discards,
                    &outcomes,
                    &cluster,
                    action,
                );
            }
        }
        // A failed commit's destination keeps one record as its probe (the
        // actions released the rest), for as long as the destination fails:
        // it keeps its own bytes, not the shared read buffer around them.
        for seq in failed {
            if let Some(bytes) = held.get_mut(&seq) {
                bytes.detach(&held_bytes);
            }
        }
        if mode == Mode::Drain
            && dispatcher.checkpoint() >= wal.durable_next()
            && outcomes.in_flight.get() == 0
        {
            tracing::info!(wal = %name, "leftover ingress WAL drained");
            break;
        }
        // Sleep until there is something to do.
        let wait = if read_failed {
            config.read_error_backoff
        } else {
            let idle = dispatcher.held_records_total() == 0 && outcomes.in_flight.get() == 0;
            let backstop = if idle {
                config.idle_backstop
            } else {
                config.backstop
            };
            dispatcher
                .next_deadline()
                .map_or(backstop, |d| d.saturating_duration_since(Instant::now()))
                .min(backstop)
        };
        env.held_bytes(held_bytes.get());
        let can_read = stop_deadline.is_none()
            && dispatcher.read_budget() > 0
            && held_bytes.get() < config.held_bytes_max
            && !read_failed
            && !wal.is_latched();
        let position = reader.position();
        let durable = async {
            if can_read {
                wal.wait_durable_past(position).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        or(
            or(durable, outcomes.notify.wait()),
            or(narad_io::rt::sleep(wait), env.stop_notify().wait()),
        )
        .await;
    }
    // Past the grace: let the commits in flight land so the checkpoint can move
    // past them.
    let deadline = Instant::now() + config.stop_grace;
    while outcomes.in_flight.get() > 0 && Instant::now() < deadline {
        or(outcomes.notify.wait(), narad_io::rt::sleep(config.backstop)).await;
    }
    let cluster = env.view();
    let now = Instant::now();
    let finished: Vec<(CommitId, CommitOutcome)> = outcomes.done.borrow_mut().drain(..).collect();
    for (commit, outcome) in finished {
        dispatcher.handle(now, Event::CommitDone { commit, outcome }, &cluster);
    }
    for action in dispatcher.drain_actions() {
        if let Action::StoreCheckpoint(seq) = action {
            wal.store_checkpoint(seq);
        }
    }
    wal.leave_dispatched(dispatcher.progress_at_stop());
    tracing::info!(wal = %name, checkpoint = dispatcher.checkpoint().0, "dispatcher stopped");
}

/// Records each record's time from its acceptance to now into `histogram`:
/// `narad_produce_to_dispatched_seconds` as its commit is sent to the owner,
/// `narad_produce_to_committed_seconds` once the commit is durable.
/// Records taken together (one batch request's) share their acceptance time:
/// each run of equal times is one observation of many.
fn observe_since_accepted(histogram: &'static str, accepted_ms: &[u64]) {
    let histogram = metrics::histogram!(histogram);
    let now_ms = narad_io::rt::unix_ms();
    for run in accepted_ms.chunk_by(|a, b| a == b) {
        let seconds = now_ms.saturating_sub(run[0]) as f64 / 1000.0;
        histogram.record_many(seconds, run.len());
    }
}

/// The deleted incarnations whose discards were warned of: records produced
/// while the delete went through keep arriving for a while, each discard a
/// few records, and a warning each would flood the log.
#[derive(Default)]
struct DiscardNotes {
    warned: std::collections::HashSet<IncarnationId>,
}

/// Incarnations remembered at most; past it the set starts again (a repeated
/// warning is the only cost).
const DISCARD_NOTES_MAX: usize = 1_024;

impl DiscardNotes {
    /// Whether this is the first discard of `incarnation` noted here.
    fn first(&mut self, incarnation: IncarnationId) -> bool {
        if self.warned.len() >= DISCARD_NOTES_MAX {
            self.warned.clear();
        }
        self.warned.insert(incarnation)
    }
}

#[allow(clippy::too_many_arguments)]
fn apply<E: DispatchEnv, S: Storage>(
    env: &Rc<E>,
    wal: &Wal<S>,
    reader: &mut WalReader<S>,
    dispatcher: &mut Dispatcher,
    held: &mut SeqMap<HeldBytes>,
    commits: &mut DenseIdMap<CommitId, Vec<Seq>>,
    discards: &mut DiscardNotes,
    outcomes: &Rc<Outcomes>,
    cluster: &E::View,
    action: Action,
) {
    match action {
        Action::StartCommit {
            commit,
            topic,
            partition,
            seqs,
            budget,
            ..
        } => {
            let mut records = Vec::with_capacity(seqs.len());
            let mut accepted_ms = Vec::with_capacity(seqs.len());
            let mut incarnation = None;
            let mut mixed = false;
            for seq in &seqs {
                let bytes = held.get(seq).expect("a held record has its bytes");
                records.push(OwnedRecord {
                    key: bytes.key.clone(),
                    payload: bytes.payload.clone(),
                    mask: bytes.mask,
                });
                accepted_ms.push(bytes.accept_time_ms);
                mixed |= incarnation.is_some_and(|i| i != bytes.incarnation);
                incarnation = Some(bytes.incarnation);
            }
            commits.insert(commit, seqs);
            observe_since_accepted("narad_produce_to_dispatched_seconds", &accepted_ms);
            let incarnation = incarnation.expect("a commit has records");
            let env = env.clone();
            let outcomes = outcomes.clone();
            let topic: Arc<str> = Arc::from(&*topic);
            let (log_topic, count) = (topic.clone(), records.len());
            outcomes.in_flight.set(outcomes.in_flight.get() + 1);
            narad_io::rt::spawn_local(async move {
                let outcome = if mixed {
                    CommitOutcome::IncarnationMismatch
                } else {
                    let commit =
                        async { Some(env.commit(topic, incarnation, partition, records).await) };
                    let expire = async {
                        narad_io::rt::sleep(budget).await;
                        None
                    };
                    match or(commit, expire).await {
                        Some(Ok(_)) => {
                            observe_since_accepted(
                                "narad_produce_to_committed_seconds",
                                &accepted_ms,
                            );
                            CommitOutcome::Committed
                        }
                        Some(Err(CommitError::IncarnationMismatch)) => {
                            tracing::warn!(topic = %log_topic, topic_id = %incarnation, partition = partition.0, records = count, "owner refused produce records accepted for another topic incarnation; checking them again");
                            CommitOutcome::IncarnationMismatch
                        }
                        Some(Err(CommitError::NotOwner)) => CommitOutcome::NotOwner,
                        Some(Err(CommitError::Failed(_))) | None => CommitOutcome::Failed,
                    }
                };
                outcomes.done.borrow_mut().push_back((commit, outcome));
                outcomes.in_flight.set(outcomes.in_flight.get() - 1);
                outcomes.notify.notify();
            });
        }
        Action::Seek(seq) => reader.seek(seq),
        Action::StoreCheckpoint(seq) => wal.store_checkpoint(seq),
        Action::Discard {
            topic,
            incarnation,
            partition,
            seqs,
            ..
        } => {
            for seq in &seqs {
                held.remove(seq);
            }
            // One line a discard, not a record: a deleted topic's backlog can
            // be millions of records. And one warning an incarnation: records
            // still arriving for it are discarded a few at a time.
            let (first, last) = (seqs.iter().min(), seqs.iter().max());
            if let (Some(first), Some(last)) = (first, last) {
                if discards.first(incarnation) {
                    tracing::warn!(topic = %topic, topic_id = %incarnation, partition = partition.0, records = seqs.len(), first_seq = first.0, last_seq = last.0, "discarding undispatched records of a deleted topic incarnation; later discards of it are logged at debug level");
                } else {
                    tracing::debug!(topic = %topic, topic_id = %incarnation, partition = partition.0, records = seqs.len(), first_seq = first.0, last_seq = last.0, "discarding undispatched records of a deleted topic incarnation");
                }
            }
        }
        Action::Release { seqs } => {
            for seq in &seqs {
                held.remove(seq);
            }
        }
        Action::AskGone { topic, incarnation } => {
            // One node: its own metadata is the leader's, read now rather than
            // at the start of the turn, whose reads may since have picked up a
            // record of a topic created meanwhile. (The cluster issue asks the
            // leader here, through the environment.)
            let gone = env
                .view()
                .topic(&topic)
                .is_none_or(|t| t.incarnation != incarnation);
            let now = Instant::now();
            dispatcher.handle(
                now,
                Event::GoneAnswer {
                    topic: &topic,
                    incarnation,
                    gone,
                },
                cluster,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_incarnation_is_warned_of_once_and_the_memory_stays_bounded() {
        let mut notes = DiscardNotes::default();
        assert!(notes.first(IncarnationId(1)));
        assert!(!notes.first(IncarnationId(1)));
        assert!(notes.first(IncarnationId(2)));
        for id in 3..=(DISCARD_NOTES_MAX as u128 + 10) {
            notes.first(IncarnationId(id));
        }
        assert!(notes.warned.len() <= DISCARD_NOTES_MAX);
    }
}
