//! The simulated node and the plumbing every step uses.
//!
//! It owns the topics (partition `p` of a topic is owned by shard
//! `(p + shift) % shards`), what survives a crash ([`Disk`]), each shard's memory
//! ([`Shard`], [`PartQ`]), the consumers and claims in progress, the messages of
//! the mesh ([`Msg`]) and the scheduled events ([`Ev`]), all held by [`Sim`]. Its
//! helpers schedule events, send over the mesh (FIFO per ordered pair after a
//! random delay) and wake a shard's pump.
//!
//! Everything runs on the test's one thread: a shard is an index into
//! `Sim::shards`, and its `epoch` counts its crashes, so an event or message of an
//! earlier life is dropped when it comes due.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_channel::oneshot;
use narad_shards::consume::inflight::{Caps, InFlight};
use narad_shards::consume::tokens::{PromiseId, Tokens};
use narad_shards::consume::waiters::{self, Notification, Waiter, Waiters};
use narad_shards::ids::{IncarnationId, Offset, PartitionId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::events::Workload;
use crate::{
    CALM_ONE_IN, CAPS_LARGE, MESH_DELAY_MAX_MS, MESH_STALL_MS, MESH_STALL_ONE_IN,
    PERSIST_INTERVAL_MS, PURGE_INTERVAL_MS, SMALL_CAPS_MAX, SMALL_CAPS_ONE_IN, TASK_DELAY_MAX_MS,
    TRACE_EVENTS_MAX,
};

pub(crate) fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// One lease as its consumer holds it (the receipt handle, plus the topic).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Lease {
    pub(crate) topic: usize,
    pub(crate) partition: PartitionId,
    pub(crate) offset: Offset,
    pub(crate) nonce: u64,
}

pub(crate) type Records = Vec<Lease>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Ack,
    Extend,
    Nack,
}

/// Who waits for the answer of an `Op::Consume`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Asker {
    /// `consume_queue`'s probe of the `at`-th other owner.
    Probe { consumer: usize, at: usize },
    /// `flow::claim` after a notification.
    Claim { claim: usize },
    /// A pinned consume forwarded to the partition's owner.
    Pinned { consumer: usize },
}

#[derive(Debug)]
pub(crate) enum Msg {
    Consume {
        topic: usize,
        partition: Option<PartitionId>,
        max: usize,
        claim: Option<PromiseId>,
        wait_ms: u64,
        asker: Asker,
    },
    /// The answer to a `Consume`; `None` when the owner dropped the op (crashed).
    Answer {
        asker: Asker,
        records: Option<Records>,
    },
    Register {
        topic: usize,
        from: usize,
        ttl: Duration,
    },
    Notify {
        topic: usize,
        owner: usize,
        promise: PromiseId,
    },
    Pass {
        topic: usize,
        promise: PromiseId,
    },
    Release {
        topic: usize,
        records: Records,
    },
    Settle {
        lease: Lease,
        kind: Kind,
    },
}

pub(crate) enum Ev {
    Tick,
    Mesh {
        from: usize,
        to: usize,
        from_epoch: u64,
        to_epoch: u64,
        msg: Msg,
    },
    Pump(usize, u64),
    /// The task that pumps one topic starts (`pump_topic_task`).
    PumpTopic(usize, u64, IncarnationId),
    /// That task ends: its topic is reported pumped.
    Pumped(usize, u64, IncarnationId),
    ClaimStart(usize, u64, Notification),
    Keeper(usize, u64),
    Purge(usize, u64),
    Persist(usize, u64),
    Deadline(usize),
    Act(u64),
    /// `Waiters::kick_at_claim_deadline` fires: topic `t` is served again.
    PromiseLapse(usize, u64, usize),
    /// `Waiters::kick_later` fires after a failed read: topic `t` is served
    /// again.
    ReadRetry(usize, u64, usize),
}

pub(crate) struct Topic {
    pub(crate) id: IncarnationId,
    pub(crate) name: Arc<str>,
    pub(crate) partitions: u32,
    pub(crate) shift: usize,
    pub(crate) visibility_ms: u64,
    /// `max_in_flight_per_partition` and `max_acked_ahead_per_partition`.
    pub(crate) caps: Caps,
}

/// What survives a crash: the log's high watermark and the persisted settled state.
pub(crate) struct Disk {
    pub(crate) hwm: Offset,
    pub(crate) frontier: Offset,
    pub(crate) ahead: Vec<Offset>,
}

/// `Queues`' `PartitionQueue`.
pub(crate) struct PartQ {
    pub(crate) table: InFlight,
    pub(crate) hwm: Offset,
    /// The lowest frontier this life may show: the loaded one, then the last seen.
    pub(crate) frontier_seen: Offset,
}

pub(crate) struct Shard {
    pub(crate) epoch: u64,
    pub(crate) parts: BTreeMap<(usize, PartitionId), PartQ>,
    pub(crate) waiters: Waiters<Records>,
    pub(crate) tokens: Tokens,
    pub(crate) pump_scheduled: bool,
    pub(crate) keeper_running: bool,
    /// Topics with a `kick_at_claim_deadlines` timer running.
    pub(crate) promise_timer: BTreeSet<usize>,
    /// Topics with a `kick_later` pending (`Waiters::retrying`).
    pub(crate) retrying: BTreeSet<usize>,
}

impl Shard {
    pub(crate) fn new(epoch: u64) -> Self {
        Shard {
            epoch,
            parts: BTreeMap::new(),
            waiters: Waiters::default(),
            tokens: Tokens::default(),
            pump_scheduled: false,
            keeper_running: false,
            promise_timer: BTreeSet::new(),
            retrying: BTreeSet::new(),
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum State {
    Probing {
        at: usize,
    },
    Parked,
    /// A pinned consume waiting for its owner's answer.
    Forwarded,
    Done,
}

pub(crate) struct Consumer {
    pub(crate) shard: usize,
    pub(crate) epoch: u64,
    pub(crate) topic: usize,
    pub(crate) pinned: Option<PartitionId>,
    pub(crate) max: usize,
    pub(crate) wait_ms: u64,
    pub(crate) deadline_ms: u64,
    pub(crate) remote: Vec<usize>,
    pub(crate) state: State,
    pub(crate) parked_at_ms: u64,
    pub(crate) waiter: Option<Rc<Waiter<Records>>>,
    pub(crate) answer: Option<oneshot::Receiver<Records>>,
    /// The consumer whose forwarded pinned consume this one serves on its owner.
    pub(crate) origin: Option<usize>,
}

pub(crate) struct Claim {
    pub(crate) shard: usize,
    pub(crate) epoch: u64,
    pub(crate) topic: usize,
    pub(crate) owner: usize,
    pub(crate) waiter: Rc<Waiter<Records>>,
}

/// What a consumer does with a record it received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    Ack,
    ExtendThenAck,
    Nack,
    /// Acks after its lease expired: stale by then.
    AckLate,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Held {
    pub(crate) lease: Lease,
    pub(crate) plan: Plan,
}

/// A promise the simulation counts: (notified shard, deadline in ms, id).
pub(crate) type Promised = (usize, u64, PromiseId);

/// Where the fairness scenario's pollers arrive.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Pollers {
    /// On this shard, unpinned: each takes from the shard's own partition,
    /// then probes the other owners.
    On(usize),
    /// On every shard that owns a partition, pinned to it.
    PinnedOnOwners,
}

/// The fairness scenario's workload (see `Sim::fair`): records at a steady
/// pace, and on every shard the same number of consumers waiting, each one
/// replaced as soon as it is answered.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Steady {
    pub(crate) consumers_per_shard: usize,
    /// The pollers of the scenario, if any: besides the waiting consumers,
    /// one consumer that does not wait (`wait=0`) arrives every tick.
    pub(crate) pollers: Option<Pollers>,
    pub(crate) produce_every_ms: u64,
    pub(crate) next_produce_ms: u64,
    pub(crate) next_partition: u32,
    /// Each consumer's `max`, and the records each produce commits, are
    /// drawn from 1 to this (1: one record at a time).
    pub(crate) batch_max: usize,
}

pub(crate) struct Sim {
    pub(crate) seed: u64,
    pub(crate) workload: Workload,
    /// Replaces the random workload until the drain (the fairness scenario).
    pub(crate) steady: Option<Steady>,
    /// Replaces the random workload until the drain (the read fault
    /// scenario): the step it is at.
    pub(crate) faulty_reads: Option<u32>,
    /// Records delivered to consumers, per shard they arrived on, before
    /// the drain.
    pub(crate) delivered_per_shard: Vec<u64>,
    pub(crate) rng: ChaCha8Rng,
    pub(crate) now_ms: u64,
    pub(crate) seq: u64,
    pub(crate) events: BTreeMap<(u64, u64), Ev>,
    pub(crate) topics: Vec<Topic>,
    pub(crate) disk: BTreeMap<(usize, PartitionId), Disk>,
    pub(crate) shards: Vec<Shard>,
    pub(crate) mesh_last_ms: Vec<Vec<u64>>,
    pub(crate) consumers: Vec<Consumer>,
    pub(crate) parked: BTreeSet<usize>,
    pub(crate) claims: Vec<Option<Claim>>,
    pub(crate) held: BTreeMap<u64, Held>,
    pub(crate) next_held: u64,
    pub(crate) delivered: BTreeSet<Lease>,
    pub(crate) acked: BTreeSet<(usize, PartitionId, Offset)>,
    /// Promises per (owner shard, topic) of notifications not retired.
    pub(crate) ledger: BTreeMap<(usize, usize), VecDeque<Promised>>,
    /// Since when records were available without a break, per (owner, topic) and
    /// per (topic, partition).
    pub(crate) avail_since: BTreeMap<(usize, usize), u64>,
    pub(crate) avail_since_part: BTreeMap<(usize, PartitionId), u64>,
    /// When a consumer parked on (shard, topic, pinned partition) was last served.
    pub(crate) served_ms: BTreeMap<(usize, usize, Option<PartitionId>), u64>,
    pub(crate) crashed_ms: Option<u64>,
    /// No crash and no mesh stall in this seed, so the lost-wake bound holds
    /// unrelaxed from start to end.
    pub(crate) calm: bool,
    /// When the latest mesh stall ends.
    pub(crate) stall_end_ms: Option<u64>,
    /// Partitions whose reads fail, until when (a faulty disk under them);
    /// kept after the fault ends.
    pub(crate) read_faults: BTreeMap<(usize, PartitionId), u64>,
    pub(crate) draining: bool,
    pub(crate) trace: VecDeque<String>,
    pub(crate) stats: BTreeMap<&'static str, u64>,
}

impl Sim {
    pub(crate) fn new(seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let shards = rng.random_range(3..=4);
        let calm = rng.random_range(0..CALM_ONE_IN) == 0;
        let topics: Vec<Topic> = (0..rng.random_range(1..=2))
            .map(|t| Topic {
                id: IncarnationId(t as u128 + 1),
                name: Arc::from(format!("t{t}")),
                partitions: rng.random_range(1..=6),
                shift: rng.random_range(0..shards),
                visibility_ms: rng.random_range(300..3_000),
                caps: roll_caps(&mut rng),
            })
            .collect();
        Sim::with(seed, rng, shards, topics, calm)
    }

    /// The fairness scenario: 4 shards, one topic of 3 partitions on shards 0
    /// to 2, so that shard 3 owns none; no crash, no stall; records every 60
    /// ms; two consumers always waiting on every shard.
    pub(crate) fn fair(seed: u64, pollers: Option<Pollers>, batch_max: usize) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let topic = Topic {
            id: IncarnationId(1),
            name: Arc::from("t0"),
            partitions: 3,
            shift: 0,
            visibility_ms: rng.random_range(300..3_000),
            caps: CAPS_LARGE,
        };
        let mut sim = Sim::with(seed, rng, 4, vec![topic], true);
        sim.steady = Some(Steady {
            consumers_per_shard: 2,
            pollers,
            produce_every_ms: 60,
            next_produce_ms: 0,
            next_partition: 0,
            batch_max,
        });
        sim
    }

    /// The read fault scenario: 3 shards, one topic of 3 to 6 partitions;
    /// consumers park on every shard (one pinned to each partition besides),
    /// every partition's reads fail for a while, records arrive while they
    /// do, and then nothing happens: only the retry after the failed reads
    /// can serve the parked consumers once the fault is over.
    pub(crate) fn faulty_reads(seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let topic = Topic {
            id: IncarnationId(1),
            name: Arc::from("t0"),
            partitions: rng.random_range(3..=6),
            shift: rng.random_range(0..3),
            visibility_ms: rng.random_range(300..3_000),
            caps: CAPS_LARGE,
        };
        let mut sim = Sim::with(seed, rng, 3, vec![topic], true);
        sim.faulty_reads = Some(0);
        sim
    }

    fn with(seed: u64, mut rng: ChaCha8Rng, shards: usize, topics: Vec<Topic>, calm: bool) -> Self {
        let mut disk = BTreeMap::new();
        for (t, topic) in topics.iter().enumerate() {
            for p in 0..topic.partitions {
                let d = Disk {
                    hwm: Offset(0),
                    frontier: Offset(0),
                    ahead: Vec::new(),
                };
                disk.insert((t, PartitionId(p)), d);
            }
        }
        let workload = Workload::roll(&mut rng, 1_000);
        let mut sim = Sim {
            seed,
            workload,
            steady: None,
            faulty_reads: None,
            delivered_per_shard: vec![0; shards],
            rng,
            now_ms: 1_000,
            seq: 0,
            events: BTreeMap::new(),
            topics,
            disk,
            shards: (0..shards).map(|_| Shard::new(0)).collect(),
            mesh_last_ms: vec![vec![0; shards]; shards],
            consumers: Vec::new(),
            parked: BTreeSet::new(),
            claims: Vec::new(),
            held: BTreeMap::new(),
            next_held: 0,
            delivered: BTreeSet::new(),
            acked: BTreeSet::new(),
            ledger: BTreeMap::new(),
            avail_since: BTreeMap::new(),
            avail_since_part: BTreeMap::new(),
            served_ms: BTreeMap::new(),
            crashed_ms: None,
            calm,
            stall_end_ms: None,
            read_faults: BTreeMap::new(),
            draining: false,
            trace: VecDeque::new(),
            stats: BTreeMap::new(),
        };
        for s in 0..shards {
            sim.start_shard_tasks(s);
        }
        sim.at(0, Ev::Tick);
        sim
    }

    /// When the latest read fault of topic `t` ends, if it had one.
    pub(crate) fn fault_end_ms(&self, t: usize) -> Option<u64> {
        let faults = self.read_faults.iter();
        faults
            .filter(|((ft, _), _)| *ft == t)
            .map(|(_, &until)| until)
            .max()
    }

    pub(crate) fn count(&mut self, what: &'static str) {
        *self.stats.entry(what).or_default() += 1;
    }

    pub(crate) fn note(&mut self, what: String) {
        if self.trace.len() == TRACE_EVENTS_MAX {
            self.trace.pop_front();
        }
        self.trace.push_back(format!("{:>7} {what}", self.now_ms));
    }

    pub(crate) fn at(&mut self, after_ms: u64, ev: Ev) {
        self.seq += 1;
        self.events.insert((self.now_ms + after_ms, self.seq), ev);
    }

    pub(crate) fn shards(&self) -> usize {
        self.shards.len()
    }

    pub(crate) fn owner_of(&self, t: usize, p: PartitionId) -> usize {
        (p.0 as usize + self.topics[t].shift) % self.shards()
    }

    pub(crate) fn local_partitions(&self, s: usize, t: usize) -> Vec<PartitionId> {
        (0..self.topics[t].partitions)
            .map(PartitionId)
            .filter(|&p| self.owner_of(t, p) == s)
            .collect()
    }

    /// `Shard::remote_owners`: the other shards owning partitions of the topic.
    pub(crate) fn remote_owners(&self, s: usize, t: usize) -> Vec<usize> {
        let owners: BTreeSet<usize> = (0..self.topics[t].partitions)
            .map(|p| self.owner_of(t, PartitionId(p)))
            .filter(|&o| o != s)
            .collect();
        owners.into_iter().collect()
    }

    pub(crate) fn topic_of(&self, id: IncarnationId) -> usize {
        (id.0 - 1) as usize
    }

    pub(crate) fn send(&mut self, from: usize, to: usize, msg: Msg) {
        assert_ne!(from, to, "a shard never sends itself an op");
        // Now and then a pair stalls (the receiving shard busy, a slow
        // machine) for longer than a promise's claim deadline, so a claim or
        // pass can arrive after its promise lapsed; only while the workload
        // runs, as crashes.
        let stalled =
            !self.draining && !self.calm && self.rng.random_range(0..MESH_STALL_ONE_IN) == 0;
        let delay = if stalled {
            let stall = self.rng.random_range(MESH_STALL_MS);
            self.stall_end_ms = self.stall_end_ms.max(Some(self.now_ms + stall));
            self.count("mesh stalls");
            stall
        } else {
            self.rng.random_range(1..=MESH_DELAY_MAX_MS)
        };
        // FIFO per ordered pair: never before the previous message on the pair.
        let when = (self.now_ms + delay).max(self.mesh_last_ms[from][to]);
        self.mesh_last_ms[from][to] = when;
        let ev = Ev::Mesh {
            from,
            to,
            from_epoch: self.shards[from].epoch,
            to_epoch: self.shards[to].epoch,
            msg,
        };
        self.at(when - self.now_ms, ev);
    }

    pub(crate) fn wake_pump(&mut self, s: usize) {
        if !self.shards[s].pump_scheduled {
            self.shards[s].pump_scheduled = true;
            let delay = self.rng.random_range(0..=TASK_DELAY_MAX_MS);
            let epoch = self.shards[s].epoch;
            self.at(delay, Ev::Pump(s, epoch));
        }
    }

    /// `flow::newcomer_share` / `Queues::newcomer_share`: how many of `max`
    /// records a consumer arriving on owner `s` may take, beyond those
    /// promised, one per live token, and what the consumers parked there will
    /// take; the partitions are loaded first when anyone waits. Then
    /// `waiters::leave_to_pinned`: pinned to `pinned`, only what its pinned
    /// consumers leave of it; unpinned, `local` reordered so their partitions
    /// come last.
    pub(crate) fn newcomer_share(
        &mut self,
        s: usize,
        t: usize,
        local: &mut [PartitionId],
        pinned: Option<PartitionId>,
        max: usize,
    ) -> Option<usize> {
        let (id, now) = (self.topics[t].id, self.now_ms);
        let tokens = &self.shards[s].tokens;
        let held = tokens.outstanding(id, now) + tokens.held(id, now);
        if held == 0 && !self.shards[s].waiters.any_parked_on(id) {
            return Some(max);
        }
        for p in self.local_partitions(s, t) {
            self.load(s, t, p);
        }
        let left = self.available_loaded(s, t).saturating_sub(held);
        let caps = self.topics[t].caps;
        let turn = self.rng.random_range(0..usize::MAX);
        let shard = &self.shards[s];
        let in_one = |p: PartitionId| {
            shard
                .parts
                .get(&(t, p))
                .map_or(0, |q| q.table.available_under(q.hwm, &caps))
        };
        let spare = left.saturating_sub(shard.waiters.waiting_demand(id, left, in_one));
        let share = (spare > 0).then(|| max.min(spare as usize))?;
        waiters::leave_to_pinned(share, pinned, local, turn, |p| {
            let available = in_one(p);
            (available, shard.waiters.pinned_demand(id, p, available))
        })
    }

    /// `Queues::own_share`: how many of `max` records a consumer of owner
    /// `s` may take, beyond those promised; `None` when all are promised.
    pub(crate) fn own_share(&self, s: usize, t: usize, max: usize) -> Option<usize> {
        let id = self.topics[t].id;
        let outstanding = self.shards[s].tokens.outstanding(id, self.now_ms);
        if outstanding == 0 {
            return Some(max);
        }
        let spare = self.available_loaded(s, t).saturating_sub(outstanding);
        (spare > 0).then(|| max.min(spare as usize))
    }

    /// One turn of the `kick_at_claim_deadlines` timer task: sleep to the
    /// next deadline the tokens keep, or end when none is left.
    pub(crate) fn promise_timer_sleep(&mut self, s: usize, t: usize) {
        let (id, now) = (self.topics[t].id, self.now_ms);
        match self.shards[s].tokens.next_deadline(id, now) {
            Some(due) => {
                let epoch = self.shards[s].epoch;
                self.at(due - now + 1, Ev::PromiseLapse(s, epoch, t));
            }
            None => {
                self.shards[s].promise_timer.remove(&t);
            }
        }
    }

    /// The `wake` callback of `Queues`: kick the topic, wake the pump.
    pub(crate) fn wake(&mut self, s: usize, t: usize) {
        let (id, name) = (self.topics[t].id, self.topics[t].name.clone());
        self.shards[s].waiters.kick(id, &name);
        self.wake_pump(s);
    }

    pub(crate) fn start_shard_tasks(&mut self, s: usize) {
        let epoch = self.shards[s].epoch;
        let purge = self.rng.random_range(1..=PURGE_INTERVAL_MS);
        self.at(purge, Ev::Purge(s, epoch));
        let persist = self.rng.random_range(1..=PERSIST_INTERVAL_MS);
        self.at(persist, Ev::Persist(s, epoch));
    }
}

/// A topic's caps: now and then small ones (see the crate doc).
fn roll_caps(rng: &mut ChaCha8Rng) -> Caps {
    if rng.random_range(0..SMALL_CAPS_ONE_IN) != 0 {
        return CAPS_LARGE;
    }
    Caps {
        in_flight_max: rng.random_range(1..=SMALL_CAPS_MAX),
        acked_ahead_max: rng.random_range(1..=SMALL_CAPS_MAX),
    }
}
