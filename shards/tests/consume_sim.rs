//! A seeded simulation of the consume path across the shards of one node: the real
//! cores ([`InFlight`], [`Waiters`], [`Tokens`]) driven through the protocol steps of
//! the broker's `src/consume/flow.rs`, with a mesh between shards that delivers
//! FIFO per ordered pair after random delays, and a clock that only moves between
//! events (nothing here reads a clock, so a seed replays exactly).
//!
//! The world: 3 or 4 shards, one or two topics, partition `p` of a topic owned by
//! shard `(p + h) % shards`. A partition is just a high watermark (the log) and
//! the settled state the ack persister last wrote (`consumer.ahead`); producers
//! move high watermarks, and a shard crash forgets that shard's in-flight tables,
//! parked consumers, claims, tokens and in-flight mesh traffic, and rebuilds its
//! tables from the persisted settled state only, on first touch.
//!
//! Each step mirrors a broker function:
//! - [`Sim::arrive`]: `flow::consume` / `consume_queue` (local take, then a probe
//!   of each other owner in turn, then park, `registrations_needed`, `register`,
//!   `ensure_keeper`) and `consume_pinned_here`; a pinned consume of a partition
//!   another shard owns is forwarded as `Op::Consume` and parks there.
//! - [`Sim::take`]: `Queues::take` / `take_from` / `reserve` (reservation before the
//!   read; the read may return only a prefix, its byte budget spent, and the rest
//!   is released at once). The log read itself takes no simulated time.
//! - [`Sim::serve_consume`]: `flow::serve_consume_op` (a claim retires a promise;
//!   a reply nobody receives is released, `Queues::release_delivered`).
//! - [`Sim::pump`] / [`Sim::pump_topic`] / [`Sim::serve_fifo`]: `run_pump`,
//!   `pump_topic` (pinned FIFOs first, then the topic's FIFO, then, with nobody
//!   parked here and a live token, `load_all` and `spend_tokens`, one `Op::Notify`
//!   each) and `serve_fifo`.
//! - [`Sim::claim_start`] / [`Sim::claim_answered`]: `flow::claim` (pass when
//!   nobody is parked; deliver to the head, or the next live one, or `Op::Release`;
//!   push the waiter back on an empty claim; register again while anyone is
//!   parked).
//! - [`Sim::keeper`]: `flow::keeper`; [`Sim::purge`]: `run_purger` with
//!   `Queues::purge_expired`; [`Sim::settle`]: `flow::settle` and `Queues::settle`;
//!   [`Sim::on_mesh`]: `broker::ops::serve_consume_op`; [`Sim::produce`]:
//!   `Queues::on_visible`.
//!
//! Checked after every event:
//! - no offset has two live leases held by two consumers, and no lease (offset and
//!   nonce) is ever handed to two consumers;
//! - a partition's frontier never regresses within a life of its owner, and never
//!   falls below the persisted one;
//! - every loaded in-flight table's own invariants;
//! - a spend of tokens never notifies more shards than the records available minus
//!   the promises outstanding, counted by the simulation's own ledger;
//! - no lost wake: a live consumer stays parked no longer than the keeper interval
//!   plus a register-notify-claim round trip while a record it could take is
//!   available on some shard and nobody parked beside it is being served (after a
//!   crash, tokens are rebuilt by the keeper's renewal, so the bound is relaxed by
//!   the renewal period for that long).
//!
//! At the end producers, crashes and cancellations stop, consumers that ack
//! everything keep arriving, and every record below every high watermark must be
//! settled, each by an ack of a lease that was delivered: every committed record
//! is delivered until it is acked.
//!
//! `NARAD_TEST_SEED=<n>` replays one seed; `NARAD_SIM_SEEDS=<n>` runs more seeds
//! (default 200) from a random base.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_channel::oneshot;
use narad_shards::consume::inflight::{Caps, InFlight, Reserve};
use narad_shards::consume::tokens::{Tokens, CLAIM_DEADLINE};
use narad_shards::consume::waiters::{Notification, Waiter, Waiters, SHARE_WINDOW};
use narad_shards::ids::{IncarnationId, Offset, PartitionId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SEEDS_DEFAULT: u64 = 200;

/// The broker's cadences (`src/consume/flow.rs`).
const KEEPER_INTERVAL_MS: u64 = 500;
const PURGE_INTERVAL_MS: u64 = 1_000;
const RENEW_AFTER: Duration = Duration::from_secs(5);
/// The persister writes changed partitions about once per tick.
const PERSIST_INTERVAL_MS: u64 = 100;

/// One way across the mesh, and the wait of a woken task for its turn.
const MESH_DELAY_MAX_MS: u64 = 15;
const TASK_DELAY_MAX_MS: u64 = 2;
/// Events a failure prints, the latest.
const TRACE_EVENTS_MAX: usize = 200;
/// The workload generator's step.
const TICK_MS: u64 = 10;

/// Simulated time with producers and crashes, then the drain's limit.
const RUN_MS: u64 = 12_000;
const DRAIN_MS_MAX: u64 = 120_000;
const RECORDS_PER_PARTITION_MAX: u64 = 80;
const WAIT_MS_MAX: u64 = 9_000;
/// Ticks of the drain that bring a consumer, per mille.
const DRAIN_ARRIVE_PER_MILLE: u32 = 60;

/// How long a parked consumer may wait for a record that is available somewhere:
/// the keeper's interval plus register, pump, notify, pump, claim and answer.
const NO_LOST_WAKE_MS: u64 = KEEPER_INTERVAL_MS + 4 * MESH_DELAY_MAX_MS + 4 * TASK_DELAY_MAX_MS;
/// After a crash, the keeper renews every registration within this long.
const AFTER_CRASH_MS: u64 = 5_000 + KEEPER_INTERVAL_MS + 500;

/// Whether a purge of expired leases on a touch of the table (the settle of a
/// receipt handle, a reservation) wakes the pump when it released something.
///
/// The broker's `Queues::settle` and `Queues::take` let the in-flight table purge
/// on touch without waking anyone; only the background purger wakes. A lease
/// purged on touch is then never purged by the purger, so the records it frees
/// are not offered to the tokens held on the owner (nor to consumers parked on
/// it) until something else kicks the topic: a produce, a nack, a registration,
/// at worst the keeper's renewal 5 s later. The spec says a lease expiry fires
/// the wake-up like a high-watermark advance or a nack. The simulation wakes (the
/// fix); with `false` it mirrors the broker as it stands and finds the lost wake
/// (seed 243065348351, for one: an ack that arrived after its lease expired
/// purged it, and a consumer parked on another shard waited on a free record).
const PURGE_ON_TOUCH_WAKES: bool = true;

const CAPS: Caps = Caps {
    in_flight_max: 4_096,
    acked_ahead_max: 4_096,
};
const _: () = assert!(CAPS.in_flight_max as u64 > 2 * 6 * RECORDS_PER_PARTITION_MAX);

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// One lease as its consumer holds it (the receipt handle, plus the topic).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Lease {
    topic: usize,
    partition: PartitionId,
    offset: Offset,
    nonce: u64,
}

type Records = Vec<Lease>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Ack,
    Extend,
    Nack,
}

/// Who waits for the answer of an `Op::Consume`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Asker {
    /// `consume_queue`'s probe of the `at`-th other owner.
    Probe { consumer: usize, at: usize },
    /// `flow::claim` after a notification.
    Claim { claim: usize },
    /// A pinned consume forwarded to the partition's owner.
    Pinned { consumer: usize },
}

#[derive(Debug)]
enum Msg {
    Consume {
        topic: usize,
        partition: Option<PartitionId>,
        max: usize,
        claim: bool,
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
    },
    Pass {
        topic: usize,
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

enum Ev {
    Tick,
    Mesh {
        from: usize,
        to: usize,
        from_epoch: u64,
        to_epoch: u64,
        msg: Msg,
    },
    Pump(usize, u64),
    ClaimStart(usize, u64, Notification),
    Keeper(usize, u64),
    Purge(usize, u64),
    Persist(usize, u64),
    Deadline(usize),
    Act(u64),
}

struct Topic {
    id: IncarnationId,
    name: Arc<str>,
    partitions: u32,
    shift: usize,
    visibility_ms: u64,
}

/// What survives a crash: the log's high watermark and the persisted settled state.
struct Disk {
    hwm: Offset,
    frontier: Offset,
    ahead: Vec<Offset>,
}

/// `Queues`' `PartitionQueue`.
struct PartQ {
    table: InFlight,
    hwm: Offset,
    /// The lowest frontier this life may show: the loaded one, then the last seen.
    frontier_seen: Offset,
}

struct Shard {
    epoch: u64,
    parts: BTreeMap<(usize, PartitionId), PartQ>,
    waiters: Waiters<Records>,
    tokens: Tokens,
    pump_scheduled: bool,
    keeper_running: bool,
}

impl Shard {
    fn new(epoch: u64) -> Self {
        Shard {
            epoch,
            parts: BTreeMap::new(),
            waiters: Waiters::default(),
            tokens: Tokens::default(),
            pump_scheduled: false,
            keeper_running: false,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum State {
    Probing {
        at: usize,
    },
    Parked,
    /// A pinned consume waiting for its owner's answer.
    Forwarded,
    Done,
}

struct Consumer {
    shard: usize,
    epoch: u64,
    topic: usize,
    pinned: Option<PartitionId>,
    max: usize,
    wait_ms: u64,
    deadline_ms: u64,
    remote: Vec<usize>,
    state: State,
    parked_at_ms: u64,
    waiter: Option<Rc<Waiter<Records>>>,
    answer: Option<oneshot::Receiver<Records>>,
    /// The consumer whose forwarded pinned consume this one serves on its owner.
    origin: Option<usize>,
}

struct Claim {
    shard: usize,
    epoch: u64,
    topic: usize,
    owner: usize,
    waiter: Rc<Waiter<Records>>,
}

/// What a consumer does with a record it received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    Ack,
    ExtendThenAck,
    Nack,
    /// Acks after its lease expired: stale by then.
    AckLate,
}

#[derive(Clone, Copy, Debug)]
struct Held {
    lease: Lease,
    plan: Plan,
}

/// Per mille of ticks that produce or bring a consumer, until `until_ms`. Phases
/// change at random: busy ones rarely park anyone, quiet ones leave consumers
/// parked with records arriving (notify and claim), or stop producing so that
/// only a wake-up that was kept serves a parked consumer.
#[derive(Clone, Copy, Debug)]
struct Workload {
    produce: u32,
    arrive: u32,
    until_ms: u64,
}

impl Workload {
    fn roll(rng: &mut ChaCha8Rng, now_ms: u64) -> Self {
        Workload {
            produce: [0, 0, 10, 40, 150, 400][rng.random_range(0..6)],
            arrive: [5, 10, 40, 180][rng.random_range(0..4)],
            until_ms: now_ms + rng.random_range(100..2_000),
        }
    }
}

struct Sim {
    seed: u64,
    workload: Workload,
    rng: ChaCha8Rng,
    now_ms: u64,
    seq: u64,
    events: BTreeMap<(u64, u64), Ev>,
    topics: Vec<Topic>,
    disk: BTreeMap<(usize, PartitionId), Disk>,
    shards: Vec<Shard>,
    mesh_last_ms: Vec<Vec<u64>>,
    consumers: Vec<Consumer>,
    parked: BTreeSet<usize>,
    claims: Vec<Option<Claim>>,
    held: BTreeMap<u64, Held>,
    next_held: u64,
    delivered: HashSet<Lease>,
    acked: HashSet<(usize, PartitionId, Offset)>,
    /// Promises per (owner shard, topic): deadlines of notifications not retired.
    ledger: HashMap<(usize, usize), VecDeque<u64>>,
    /// Since when records were available without a break, per (owner, topic) and
    /// per (topic, partition).
    avail_since: HashMap<(usize, usize), u64>,
    avail_since_part: HashMap<(usize, PartitionId), u64>,
    /// When a consumer parked on (shard, topic, pinned partition) was last served.
    served_ms: HashMap<(usize, usize, Option<PartitionId>), u64>,
    crashed_ms: Option<u64>,
    draining: bool,
    trace: VecDeque<String>,
    stats: BTreeMap<&'static str, u64>,
}

impl Sim {
    fn new(seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let shards = rng.random_range(3..=4);
        let topics: Vec<Topic> = (0..rng.random_range(1..=2))
            .map(|t| Topic {
                id: IncarnationId(t as u128 + 1),
                name: Arc::from(format!("t{t}")),
                partitions: rng.random_range(1..=6),
                shift: rng.random_range(0..shards),
                visibility_ms: rng.random_range(300..3_000),
            })
            .collect();
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
            delivered: HashSet::new(),
            acked: HashSet::new(),
            ledger: HashMap::new(),
            avail_since: HashMap::new(),
            avail_since_part: HashMap::new(),
            served_ms: HashMap::new(),
            crashed_ms: None,
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

    fn count(&mut self, what: &'static str) {
        *self.stats.entry(what).or_default() += 1;
    }

    fn note(&mut self, what: String) {
        if self.trace.len() == TRACE_EVENTS_MAX {
            self.trace.pop_front();
        }
        self.trace.push_back(format!("{:>7} {what}", self.now_ms));
    }

    fn at(&mut self, after_ms: u64, ev: Ev) {
        self.seq += 1;
        self.events.insert((self.now_ms + after_ms, self.seq), ev);
    }

    fn shards(&self) -> usize {
        self.shards.len()
    }

    fn owner_of(&self, t: usize, p: PartitionId) -> usize {
        (p.0 as usize + self.topics[t].shift) % self.shards()
    }

    fn local_partitions(&self, s: usize, t: usize) -> Vec<PartitionId> {
        (0..self.topics[t].partitions)
            .map(PartitionId)
            .filter(|&p| self.owner_of(t, p) == s)
            .collect()
    }

    /// `Shard::remote_owners`: the other shards owning partitions of the topic.
    fn remote_owners(&self, s: usize, t: usize) -> Vec<usize> {
        let owners: BTreeSet<usize> = (0..self.topics[t].partitions)
            .map(|p| self.owner_of(t, PartitionId(p)))
            .filter(|&o| o != s)
            .collect();
        owners.into_iter().collect()
    }

    fn topic_of(&self, id: IncarnationId) -> usize {
        (id.0 - 1) as usize
    }

    fn send(&mut self, from: usize, to: usize, msg: Msg) {
        assert_ne!(from, to, "a shard never sends itself an op");
        let delay = self.rng.random_range(1..=MESH_DELAY_MAX_MS);
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

    fn wake_pump(&mut self, s: usize) {
        if !self.shards[s].pump_scheduled {
            self.shards[s].pump_scheduled = true;
            let delay = self.rng.random_range(0..=TASK_DELAY_MAX_MS);
            let epoch = self.shards[s].epoch;
            self.at(delay, Ev::Pump(s, epoch));
        }
    }

    /// The `wake` callback of `Queues`: kick the topic, wake the pump.
    fn wake(&mut self, s: usize, t: usize) {
        let (id, name) = (self.topics[t].id, self.topics[t].name.clone());
        self.shards[s].waiters.kick(id, &name);
        self.wake_pump(s);
    }

    fn start_shard_tasks(&mut self, s: usize) {
        let epoch = self.shards[s].epoch;
        let purge = self.rng.random_range(1..=PURGE_INTERVAL_MS);
        self.at(purge, Ev::Purge(s, epoch));
        let persist = self.rng.random_range(1..=PERSIST_INTERVAL_MS);
        self.at(persist, Ev::Persist(s, epoch));
    }

    fn run(&mut self) {
        let mut events_max = 2_000_000u64;
        while let Some(((when, _), ev)) = self.events.pop_first() {
            assert!(when >= self.now_ms, "time went backwards");
            self.now_ms = when;
            self.step(ev);
            self.check();
            if self.draining && self.drained() {
                break;
            }
            events_max -= 1;
            assert!(events_max > 0, "the simulation did not settle");
        }
        self.check_drained();
    }

    fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Tick => self.tick(),
            Ev::Mesh {
                from,
                to,
                from_epoch,
                to_epoch,
                msg,
            } => {
                if self.shards[from].epoch != from_epoch {
                    return self.count("mesh lost: sender crashed");
                }
                if self.shards[to].epoch != to_epoch {
                    // The receiver dropped the op with its reply sender.
                    if let Msg::Consume { asker, .. } = msg {
                        self.send(
                            to,
                            from,
                            Msg::Answer {
                                asker,
                                records: None,
                            },
                        );
                    }
                    return self.count("mesh lost: receiver crashed");
                }
                self.on_mesh(from, to, msg);
            }
            Ev::Pump(s, epoch) if self.shards[s].epoch == epoch => self.pump(s),
            Ev::ClaimStart(s, epoch, n) if self.shards[s].epoch == epoch => self.claim_start(s, n),
            Ev::Keeper(s, epoch) if self.shards[s].epoch == epoch => self.keeper(s),
            Ev::Purge(s, epoch) if self.shards[s].epoch == epoch => self.purge(s),
            Ev::Persist(s, epoch) if self.shards[s].epoch == epoch => self.persist(s),
            Ev::Deadline(c) => self.deadline(c),
            Ev::Act(h) => self.act(h),
            // A task of a shard that crashed since.
            Ev::Pump(..)
            | Ev::ClaimStart(..)
            | Ev::Keeper(..)
            | Ev::Purge(..)
            | Ev::Persist(..) => {}
        }
        self.collect_deliveries();
    }

    /// The workload: arrivals, producers, cancellations and crashes.
    fn tick(&mut self) {
        if !self.draining && self.now_ms >= RUN_MS {
            self.draining = true;
            self.note("drain starts".into());
        }
        if self.draining && self.now_ms >= RUN_MS + DRAIN_MS_MAX {
            let what = format!("the drain did not settle: {:?}", self.unsettled());
            self.report_failure(&what);
        }
        if self.now_ms >= self.workload.until_ms {
            self.workload = Workload::roll(&mut self.rng, self.now_ms);
        }
        let w = self.workload;
        let r = self.rng.random_range(0..1_000);
        if self.draining {
            if r < DRAIN_ARRIVE_PER_MILLE {
                self.arrive();
            }
        } else if r < w.produce {
            self.produce();
        } else if r < w.produce + w.arrive {
            self.arrive();
        } else if r < w.produce + w.arrive + 15 {
            self.cancel();
        } else if r < w.produce + w.arrive + 17 {
            self.crash();
        }
        let next = self.rng.random_range(1..=TICK_MS);
        self.at(next, Ev::Tick);
    }

    /// `Queues::on_visible` on the owner after a commit.
    fn produce(&mut self) {
        let t = self.rng.random_range(0..self.topics.len());
        let p = PartitionId(self.rng.random_range(0..self.topics[t].partitions));
        let n = self.rng.random_range(1..=3);
        let disk = self.disk.get_mut(&(t, p)).unwrap();
        let hwm = Offset((disk.hwm.0 + n).min(RECORDS_PER_PARTITION_MAX));
        disk.hwm = hwm;
        let owner = self.owner_of(t, p);
        if let Some(q) = self.shards[owner].parts.get_mut(&(t, p)) {
            q.hwm = q.hwm.max(hwm);
        }
        self.note(format!("produce t{t}/{} hwm {hwm} on {owner}", p.0));
        self.wake(owner, t);
    }

    /// A consume request lands on a shard: `flow::consume`.
    fn arrive(&mut self) {
        let s = self.rng.random_range(0..self.shards());
        let t = self.rng.random_range(0..self.topics.len());
        let pinned = (self.rng.random_bool(0.15))
            .then(|| PartitionId(self.rng.random_range(0..self.topics[t].partitions)));
        let max = if self.draining {
            self.rng.random_range(1..=16)
        } else if self.rng.random_bool(0.7) {
            1
        } else {
            self.rng.random_range(2..=4)
        };
        let wait_ms = if self.rng.random_bool(0.15) {
            0
        } else {
            self.rng.random_range(1..=WAIT_MS_MAX)
        };
        let c = self.consumers.len();
        self.consumers.push(Consumer {
            shard: s,
            epoch: self.shards[s].epoch,
            topic: t,
            pinned,
            max,
            wait_ms,
            deadline_ms: self.now_ms + wait_ms,
            remote: self.remote_owners(s, t),
            state: State::Done,
            parked_at_ms: 0,
            waiter: None,
            answer: None,
            origin: None,
        });
        self.count("consumers");
        self.note(format!(
            "c{c} arrives on {s} t{t} pinned {pinned:?} max {max} wait {wait_ms}"
        ));
        match pinned {
            Some(p) if self.owner_of(t, p) != s => {
                self.consumers[c].state = State::Forwarded;
                let msg = Msg::Consume {
                    topic: t,
                    partition: Some(p),
                    max,
                    claim: false,
                    wait_ms,
                    asker: Asker::Pinned { consumer: c },
                };
                let owner = self.owner_of(t, p);
                self.send(s, owner, msg);
            }
            Some(p) => {
                if let Some(got) = self.consume_pinned_here(c, p) {
                    self.receive(c, got);
                }
            }
            None => self.consume_queue(c),
        }
    }

    /// `consume_queue`, up to the first probe.
    fn consume_queue(&mut self, c: usize) {
        let (s, t, max) = (
            self.consumers[c].shard,
            self.consumers[c].topic,
            self.consumers[c].max,
        );
        let local = self.local_partitions(s, t);
        if !local.is_empty() {
            let got = self.take(s, t, &local, max);
            if !got.is_empty() {
                return self.receive(c, got);
            }
        }
        self.probe_next(c, 0);
    }

    /// `consume_queue`'s loop over the other owners, from the `at`-th; parks after
    /// the last.
    fn probe_next(&mut self, c: usize, at: usize) {
        let consumer = &self.consumers[c];
        let (s, t, max) = (consumer.shard, consumer.topic, consumer.max);
        if let Some(&owner) = consumer.remote.get(at) {
            self.consumers[c].state = State::Probing { at };
            let msg = Msg::Consume {
                topic: t,
                partition: None,
                max,
                claim: false,
                wait_ms: 0,
                asker: Asker::Probe { consumer: c, at },
            };
            return self.send(s, owner, msg);
        }
        if self.consumers[c].wait_ms == 0 {
            return self.receive(c, Vec::new());
        }
        self.park(c, None);
        let (id, name) = (self.topics[t].id, self.topics[t].name.clone());
        let remote = self.consumers[c].remote.clone();
        let deadline_ms = self.consumers[c].deadline_ms;
        let now = self.now_ms;
        let needed =
            self.shards[s]
                .waiters
                .registrations_needed(id, &name, &remote, deadline_ms, now);
        for owner in needed {
            let ttl = Duration::from_millis(deadline_ms.saturating_sub(now)) + SHARE_WINDOW;
            self.send(
                s,
                owner,
                Msg::Register {
                    topic: t,
                    from: s,
                    ttl,
                },
            );
        }
        // `ensure_keeper`.
        if !self.shards[s].keeper_running {
            self.shards[s].keeper_running = true;
            let epoch = self.shards[s].epoch;
            self.at(KEEPER_INTERVAL_MS, Ev::Keeper(s, epoch));
        }
    }

    /// Parks consumer `c` on its shard's FIFO (`Waiters::park`, which kicks).
    fn park(&mut self, c: usize, pinned: Option<PartitionId>) {
        let (s, t) = (self.consumers[c].shard, self.consumers[c].topic);
        let (waiter, answer) = Waiter::new(self.consumers[c].max);
        let (id, name) = (self.topics[t].id, self.topics[t].name.clone());
        self.shards[s]
            .waiters
            .park(id, &name, pinned, waiter.clone());
        self.wake_pump(s);
        let consumer = &mut self.consumers[c];
        consumer.state = State::Parked;
        consumer.parked_at_ms = self.now_ms;
        consumer.waiter = Some(waiter);
        consumer.answer = Some(answer);
        self.parked.insert(c);
        if self.available_on(s, t, pinned) > 0 {
            // A record landed here while the consumer probed: the kick of the park
            // is its only wake.
            self.count("parked beside a free record");
        }
        let after = self.consumers[c].deadline_ms.saturating_sub(self.now_ms);
        self.at(after, Ev::Deadline(c));
        self.note(format!("c{c} parks on {s} pinned {pinned:?}"));
    }

    /// `consume_pinned_here`: the records taken at once, or `None` once parked.
    fn consume_pinned_here(&mut self, c: usize, p: PartitionId) -> Option<Records> {
        let (s, t, max) = (
            self.consumers[c].shard,
            self.consumers[c].topic,
            self.consumers[c].max,
        );
        let got = self.take(s, t, &[p], max);
        if !got.is_empty() || self.consumers[c].wait_ms == 0 {
            return Some(got);
        }
        self.park(c, Some(p));
        None
    }

    /// `Queues::take`: up to `max` records, staying on a partition until it runs dry.
    fn take(&mut self, s: usize, t: usize, partitions: &[PartitionId], max: usize) -> Records {
        assert!(max > 0);
        let mut out = Vec::new();
        for &p in partitions {
            if out.len() >= max {
                break;
            }
            self.load(s, t, p);
            let want = max - out.len();
            let (now, vis) = (self.now_ms, self.topics[t].visibility_ms);
            // `InFlight::reserve` purges first; done here to see what it released.
            let q = self.shards[s].parts.get_mut(&(t, p)).unwrap();
            if q.table.purge_expired(now) > 0 && PURGE_ON_TOUCH_WAKES {
                self.wake(s, t);
            }
            let rng = &mut self.rng;
            let q = self.shards[s].parts.get_mut(&(t, p)).unwrap();
            let mut reserved = Vec::new();
            while reserved.len() < want {
                let nonce = rng.random();
                match q.table.reserve(now, q.hwm, &CAPS, vis, nonce) {
                    Reserve::Reserved { offset, .. } => reserved.push((offset, nonce)),
                    Reserve::Empty | Reserve::Full => break,
                }
            }
            if reserved.is_empty() {
                continue;
            }
            // The read's byte budget may run out; the first record always goes.
            let read = if rng.random_bool(0.1) {
                rng.random_range(1..=reserved.len())
            } else {
                reserved.len()
            };
            for &(offset, nonce) in &reserved[read..] {
                q.table
                    .nack(offset, nonce, now)
                    .expect("a fresh lease releases");
            }
            for &(offset, nonce) in &reserved[..read] {
                assert!(q.table.is_leased(offset, nonce, now));
                out.push(Lease {
                    topic: t,
                    partition: p,
                    offset,
                    nonce,
                });
            }
        }
        out
    }

    /// `Queues::queue`: the partition's table, loaded from the persisted state on
    /// first touch.
    fn load(&mut self, s: usize, t: usize, p: PartitionId) {
        if self.shards[s].parts.contains_key(&(t, p)) {
            return;
        }
        let disk = &self.disk[&(t, p)];
        let table = InFlight::new(disk.frontier, disk.ahead.iter().copied());
        let q = PartQ {
            frontier_seen: table.frontier(),
            table,
            hwm: disk.hwm,
        };
        self.shards[s].parts.insert((t, p), q);
    }

    /// `Queues::release_delivered`.
    fn release_delivered(&mut self, s: usize, t: usize, records: &[Lease]) {
        if records.is_empty() {
            return;
        }
        let now = self.now_ms;
        for r in records {
            if let Some(q) = self.shards[s].parts.get_mut(&(t, r.partition)) {
                let _ = q.table.nack(r.offset, r.nonce, now);
            }
        }
        self.count("released unreceived");
        self.wake(s, t);
    }

    /// `broker::ops::serve_consume_op`.
    fn on_mesh(&mut self, from: usize, to: usize, msg: Msg) {
        if !matches!(msg, Msg::Settle { .. }) {
            self.note(format!("{from} -> {to}: {msg:?}"));
        }
        match msg {
            Msg::Consume {
                topic,
                partition,
                max,
                claim,
                wait_ms,
                asker,
            } => self.serve_consume(to, from, topic, partition, max, claim, wait_ms, asker),
            Msg::Answer { asker, records } => self.answered(asker, records),
            Msg::Register { topic, from, ttl } => {
                let now = self.now_ms;
                let id = self.topics[topic].id;
                self.shards[to].tokens.register(id, from, ttl, now);
                self.wake(to, topic);
            }
            Msg::Notify { topic, owner } => {
                let (id, name) = (self.topics[topic].id, self.topics[topic].name.clone());
                self.shards[to].waiters.notified(id, &name, owner);
                self.wake_pump(to);
            }
            Msg::Pass { topic } => {
                self.retire_promise(to, topic);
                self.wake(to, topic);
            }
            Msg::Release { topic, records } => self.release_delivered(to, topic, &records),
            Msg::Settle { lease, kind } => self.apply_settle(to, lease, kind),
        }
    }

    fn retire_promise(&mut self, owner: usize, t: usize) {
        let id = self.topics[t].id;
        self.shards[owner].tokens.retire_notification(id);
        if let Some(ledger) = self.ledger.get_mut(&(owner, t)) {
            ledger.pop_front();
        }
    }

    /// `flow::serve_consume_op` on owner `s` for a request from `from`.
    #[allow(clippy::too_many_arguments)]
    fn serve_consume(
        &mut self,
        s: usize,
        from: usize,
        t: usize,
        partition: Option<PartitionId>,
        max: usize,
        claim: bool,
        wait_ms: u64,
        asker: Asker,
    ) {
        if claim {
            self.retire_promise(s, t);
        }
        match partition {
            Some(p) => {
                let Asker::Pinned { consumer: origin } = asker else {
                    unreachable!("only pinned consumes name a partition")
                };
                // The owner-side consume of a forwarded pinned request.
                let c = self.consumers.len();
                self.consumers.push(Consumer {
                    shard: s,
                    epoch: self.shards[s].epoch,
                    topic: t,
                    pinned: Some(p),
                    max,
                    wait_ms,
                    deadline_ms: self.now_ms + wait_ms,
                    remote: Vec::new(),
                    state: State::Done,
                    parked_at_ms: 0,
                    waiter: None,
                    answer: None,
                    origin: Some(origin),
                });
                if let Some(got) = self.consume_pinned_here(c, p) {
                    self.answer(s, from, t, asker, got);
                }
            }
            None => {
                let local = self.local_partitions(s, t);
                let got = self.take(s, t, &local, max);
                self.answer(s, from, t, asker, got);
            }
        }
    }

    /// Whether the asker still holds the receiving end of its answer.
    fn receivable(&self, asker: Asker) -> bool {
        let alive = |c: &Consumer| self.shards[c.shard].epoch == c.epoch;
        match asker {
            Asker::Probe { consumer, at } => {
                let c = &self.consumers[consumer];
                alive(c) && c.state == State::Probing { at }
            }
            Asker::Pinned { consumer } => {
                let c = &self.consumers[consumer];
                alive(c) && c.state == State::Forwarded
            }
            Asker::Claim { claim } => self.claims[claim]
                .as_ref()
                .is_some_and(|k| self.shards[k.shard].epoch == k.epoch),
        }
    }

    /// `reply.send(result)` on the owner: a reply nobody receives is released.
    fn answer(&mut self, s: usize, to: usize, t: usize, asker: Asker, records: Records) {
        if !self.receivable(asker) {
            return self.release_delivered(s, t, &records);
        }
        self.send(
            s,
            to,
            Msg::Answer {
                asker,
                records: Some(records),
            },
        );
    }

    fn answered(&mut self, asker: Asker, records: Option<Records>) {
        if !self.receivable(asker) {
            // Received by nobody after it was sent: the leases lapse.
            if records.is_some_and(|r| !r.is_empty()) {
                self.count("answers lost in flight");
            }
            return;
        }
        match asker {
            Asker::Probe { consumer, at } => match records {
                Some(got) if !got.is_empty() => self.receive(consumer, got),
                _ => self.probe_next(consumer, at + 1),
            },
            Asker::Pinned { consumer } => self.receive(consumer, records.unwrap_or_default()),
            Asker::Claim { claim } => self.claim_answered(claim, records),
        }
    }

    /// `run_pump`, one round.
    fn pump(&mut self, s: usize) {
        self.shards[s].pump_scheduled = false;
        self.note(format!("pump of {s} runs"));
        let notifications = self.shards[s].waiters.take_notifications();
        for n in notifications {
            // `spawn_local(claim(..))`: the claim runs after the pump yields.
            let delay = self.rng.random_range(0..=TASK_DELAY_MAX_MS);
            let epoch = self.shards[s].epoch;
            self.at(delay, Ev::ClaimStart(s, epoch, n));
        }
        for kick in self.shards[s].waiters.take_kicked() {
            let t = self.topic_of(kick.incarnation);
            self.pump_topic(s, t);
        }
    }

    /// `pump_topic`.
    fn pump_topic(&mut self, s: usize, t: usize) {
        let id = self.topics[t].id;
        let local = self.local_partitions(s, t);
        for p in self.shards[s].waiters.pinned_partitions(id) {
            if local.contains(&p) {
                self.serve_fifo(s, t, Some(p), &[p]);
            }
        }
        if local.is_empty() {
            return;
        }
        self.serve_fifo(s, t, None, &local);
        let now = self.now_ms;
        if self.shards[s].waiters.has_parked(id) || !self.shards[s].tokens.has_tokens(id, now) {
            return;
        }
        // `load_all`, then `spend_tokens`.
        for &p in &local {
            self.load(s, t, p);
        }
        let available = self.available_loaded(s, t);
        let ledger = self.ledger.entry((s, t)).or_default();
        ledger.retain(|&deadline| deadline > now);
        let promised = ledger.len() as u64;
        let notify = self.shards[s].tokens.spend(id, available, now);
        if notify.len() as u64 > available.saturating_sub(promised) {
            self.report_failure(&format!(
                "shard {s} notified {notify:?} for t{t} with {available} available and {promised} promised"
            ));
        }
        for to in notify {
            let deadline = now + ms(CLAIM_DEADLINE);
            self.ledger.entry((s, t)).or_default().push_back(deadline);
            self.count("notifications");
            self.note(format!("{s} notifies {to} for t{t}"));
            self.send(s, to, Msg::Notify { topic: t, owner: s });
        }
    }

    /// `Queues::available`: records of the topic's loaded partitions nobody holds.
    fn available_loaded(&self, s: usize, t: usize) -> u64 {
        self.shards[s]
            .parts
            .iter()
            .filter(|((pt, _), _)| *pt == t)
            .map(|(_, q)| q.table.available(q.hwm))
            .sum()
    }

    /// `serve_fifo`: hands records to the FIFO's consumers, head first, until one
    /// finds nothing.
    fn serve_fifo(
        &mut self,
        s: usize,
        t: usize,
        pinned: Option<PartitionId>,
        parts: &[PartitionId],
    ) {
        let (id, name) = (self.topics[t].id, self.topics[t].name.clone());
        // Bounded: every round hands records to a consumer taken off the FIFO, or
        // puts it back and stops.
        while let Some(waiter) = self.shards[s].waiters.pop_live(id, pinned) {
            let got = self.take(s, t, parts, waiter.max);
            if got.is_empty() {
                self.shards[s].waiters.push_front(id, &name, pinned, waiter);
                return;
            }
            if let Err(back) = waiter.deliver(got) {
                self.release_delivered(s, t, &back);
            }
        }
    }

    /// `flow::claim`, up to the claim's probe.
    fn claim_start(&mut self, s: usize, n: Notification) {
        let t = self.topic_of(n.incarnation);
        let Some(waiter) = self.shards[s].waiters.pop_live(n.incarnation, None) else {
            self.count("passes");
            return self.send(s, n.owner, Msg::Pass { topic: t });
        };
        let k = self.claims.len();
        let max = waiter.max;
        self.claims.push(Some(Claim {
            shard: s,
            epoch: self.shards[s].epoch,
            topic: t,
            owner: n.owner,
            waiter,
        }));
        self.count("claims");
        let msg = Msg::Consume {
            topic: t,
            partition: None,
            max,
            claim: true,
            wait_ms: 0,
            asker: Asker::Claim { claim: k },
        };
        self.send(s, n.owner, msg);
    }

    /// `flow::claim`, after the claim's answer.
    fn claim_answered(&mut self, k: usize, records: Option<Records>) {
        let Claim {
            shard: s,
            topic: t,
            owner,
            waiter,
            ..
        } = self.claims[k].take().expect("a claim is answered once");
        let (id, name) = (self.topics[t].id, self.topics[t].name.clone());
        match records {
            Some(got) if !got.is_empty() => {
                let mut got = got;
                let mut next = Some(waiter);
                // Bounded by the FIFO: every round takes a consumer off it.
                loop {
                    let w = next
                        .take()
                        .or_else(|| self.shards[s].waiters.pop_live(id, None));
                    let Some(w) = w else {
                        self.count("claimed records released");
                        self.send(
                            s,
                            owner,
                            Msg::Release {
                                topic: t,
                                records: got,
                            },
                        );
                        break;
                    };
                    match w.deliver(got) {
                        Ok(()) => break,
                        Err(back) => got = back,
                    }
                }
            }
            _ => self.shards[s].waiters.push_front(id, &name, None, waiter),
        }
        if self.shards[s].waiters.has_parked(id) {
            let ttl = RENEW_AFTER + SHARE_WINDOW;
            self.send(
                s,
                owner,
                Msg::Register {
                    topic: t,
                    from: s,
                    ttl,
                },
            );
            let now = self.now_ms;
            self.shards[s].waiters.note_registered(id, owner, ttl, now);
        }
    }

    /// `flow::keeper`, one round.
    fn keeper(&mut self, s: usize) {
        let now = self.now_ms;
        if !self.shards[s].waiters.any_parked() {
            self.shards[s].waiters.sweep(now);
            self.shards[s].keeper_running = false;
            return;
        }
        let owners: Vec<Vec<usize>> = (0..self.topics.len())
            .map(|t| self.remote_owners(s, t))
            .collect();
        let owners_of = |id: IncarnationId, _: &str| owners[(id.0 - 1) as usize].clone();
        let stale = self.shards[s]
            .waiters
            .stale_registrations(now, RENEW_AFTER, owners_of);
        for (id, _, owners) in stale {
            let t = self.topic_of(id);
            for owner in owners {
                let ttl = RENEW_AFTER + SHARE_WINDOW;
                self.count("keeper registrations");
                self.send(
                    s,
                    owner,
                    Msg::Register {
                        topic: t,
                        from: s,
                        ttl,
                    },
                );
                self.shards[s].waiters.note_registered(id, owner, ttl, now);
            }
        }
        let epoch = self.shards[s].epoch;
        self.at(KEEPER_INTERVAL_MS, Ev::Keeper(s, epoch));
    }

    /// `run_purger` / `Queues::purge_expired`.
    fn purge(&mut self, s: usize) {
        let now = self.now_ms;
        let mut woken = BTreeSet::new();
        for (&(t, _), q) in self.shards[s].parts.iter_mut() {
            if q.table.purge_expired(now) > 0 {
                woken.insert(t);
            }
        }
        for t in woken {
            self.note(format!("purger on {s} releases leases of t{t}"));
            self.wake(s, t);
        }
        let epoch = self.shards[s].epoch;
        self.at(PURGE_INTERVAL_MS, Ev::Purge(s, epoch));
    }

    /// The ack persister: the settled state of changed partitions reaches the disk.
    fn persist(&mut self, s: usize) {
        for (&key, q) in self.shards[s].parts.iter_mut() {
            if q.table.take_settled_changed() {
                let disk = self.disk.get_mut(&key).unwrap();
                assert!(
                    q.table.frontier() >= disk.frontier,
                    "persisted frontier regressed"
                );
                disk.frontier = q.table.frontier();
                disk.ahead = q.table.acked_ahead().collect();
            }
        }
        let epoch = self.shards[s].epoch;
        let next = self
            .rng
            .random_range(PERSIST_INTERVAL_MS / 2..=PERSIST_INTERVAL_MS);
        self.at(next, Ev::Persist(s, epoch));
    }

    /// `wait_for`'s deadline.
    fn deadline(&mut self, c: usize) {
        if self.consumers[c].state != State::Parked {
            return;
        }
        let waiter = self.consumers[c]
            .waiter
            .take()
            .expect("a parked consumer waits");
        waiter.close();
        // The pump may have sent in the same instant the deadline passed.
        let got = match self.consumers[c].answer.as_mut().map(|a| a.try_recv()) {
            Some(Ok(Some(got))) => got,
            _ => Vec::new(),
        };
        self.receive(c, got);
    }

    /// Parked consumers whose oneshot the pump or a claim filled.
    fn collect_deliveries(&mut self) {
        let parked: Vec<usize> = self.parked.iter().copied().collect();
        for c in parked {
            let Some(answer) = self.consumers[c].answer.as_mut() else {
                continue;
            };
            if let Ok(Some(got)) = answer.try_recv() {
                self.receive(c, got);
            }
        }
    }

    /// A consume is answered: records to a client, or to a forwarded request's origin.
    fn receive(&mut self, c: usize, got: Records) {
        let consumer = &mut self.consumers[c];
        let key = (consumer.shard, consumer.topic, consumer.pinned);
        let was_parked = consumer.state == State::Parked;
        consumer.state = State::Done;
        consumer.waiter = None;
        consumer.answer = None;
        let (s, t, origin) = (consumer.shard, consumer.topic, consumer.origin);
        self.parked.remove(&c);
        if was_parked && !got.is_empty() {
            self.served_ms.insert(key, self.now_ms);
        }
        if let Some(origin) = origin {
            let to = self.consumers[origin].shard;
            return self.answer(s, to, t, Asker::Pinned { consumer: origin }, got);
        }
        self.note(format!("c{c} gets {} records", got.len()));
        for lease in got {
            if !self.delivered.insert(lease) {
                self.report_failure(&format!("{lease:?} was handed out twice"));
            }
            self.count("deliveries");
            self.plan(lease);
        }
    }

    fn plan(&mut self, lease: Lease) {
        let vis = self.topics[lease.topic].visibility_ms;
        let r = self.rng.random_range(0..100);
        let (plan, after_ms) = match r {
            _ if self.draining => (Plan::Ack, 0),
            0..70 => (Plan::Ack, self.rng.random_range(0..vis * 4 / 5)),
            70..78 => (Plan::ExtendThenAck, self.rng.random_range(0..vis / 2)),
            78..86 => (Plan::Nack, self.rng.random_range(0..vis / 2)),
            86..94 => return self.count("vanished with a lease"),
            _ => (Plan::AckLate, vis + self.rng.random_range(1..vis)),
        };
        let h = self.next_held;
        self.next_held += 1;
        self.held.insert(h, Held { lease, plan });
        self.at(after_ms, Ev::Act(h));
    }

    /// A consumer acts on a receipt handle, through a random shard: `flow::settle`.
    fn act(&mut self, h: u64) {
        let Some(held) = self.held.remove(&h) else {
            return;
        };
        let kind = match held.plan {
            Plan::Ack | Plan::AckLate => Kind::Ack,
            Plan::ExtendThenAck => Kind::Extend,
            Plan::Nack => Kind::Nack,
        };
        if kind == Kind::Extend {
            // The consumer acks later, well within the extended lease.
            let vis = self.topics[held.lease.topic].visibility_ms;
            let again = Held {
                lease: held.lease,
                plan: Plan::Ack,
            };
            self.held.insert(h, again);
            let after = self.rng.random_range(0..vis / 2);
            self.at(after, Ev::Act(h));
        }
        let via = self.rng.random_range(0..self.shards());
        let owner = self.owner_of(held.lease.topic, held.lease.partition);
        if owner == via {
            self.apply_settle(owner, held.lease, kind);
        } else {
            self.send(
                via,
                owner,
                Msg::Settle {
                    lease: held.lease,
                    kind,
                },
            );
        }
    }

    /// `Queues::settle` on the owner.
    fn apply_settle(&mut self, s: usize, lease: Lease, kind: Kind) {
        let now = self.now_ms;
        let t = lease.topic;
        let vis = self.topics[t].visibility_ms;
        let Some(q) = self.shards[s].parts.get_mut(&(t, lease.partition)) else {
            return self.count("settles stale (not loaded)");
        };
        let purged = q.table.purge_expired(now);
        let ok = match kind {
            Kind::Ack => q.table.ack(lease.offset, lease.nonce, now).is_ok(),
            Kind::Extend => q.table.extend(lease.offset, lease.nonce, now, vis).is_ok(),
            Kind::Nack => q.table.nack(lease.offset, lease.nonce, now).is_ok(),
        };
        self.note(format!(
            "{kind:?} {lease:?} on {s}: ok {ok}, purged {purged} first"
        ));
        if purged > 0 && PURGE_ON_TOUCH_WAKES {
            self.wake(s, t);
        }
        if !ok {
            return self.count("settles stale");
        }
        match kind {
            Kind::Ack => {
                self.acked.insert((t, lease.partition, lease.offset));
                self.count("acks");
            }
            Kind::Extend => self.count("extends"),
            Kind::Nack => {
                self.count("nacks");
                self.wake(s, t);
            }
        }
    }

    /// A consumer gives up: its request future is dropped.
    fn cancel(&mut self) {
        let open: Vec<usize> = (0..self.consumers.len())
            .filter(|&c| {
                self.consumers[c].state != State::Done && self.consumers[c].origin.is_none()
            })
            .collect();
        if open.is_empty() {
            return;
        }
        let c = open[self.rng.random_range(0..open.len())];
        self.note(format!("c{c} cancels"));
        self.drop_consumer(c);
        self.count("cancellations");
    }

    fn drop_consumer(&mut self, c: usize) {
        let consumer = &mut self.consumers[c];
        consumer.state = State::Done;
        consumer.answer = None;
        consumer.waiter = None;
        self.parked.remove(&c);
    }

    /// A shard restarts: memory is forgotten, the disk is not.
    fn crash(&mut self) {
        let s = self.rng.random_range(0..self.shards());
        let epoch = self.shards[s].epoch + 1;
        self.note(format!("shard {s} crashes"));
        self.shards[s] = Shard::new(epoch);
        for c in 0..self.consumers.len() {
            if self.consumers[c].shard == s && self.consumers[c].state != State::Done {
                self.drop_consumer(c);
                // A forwarded pinned consume served here: its reply sender is
                // dropped, which the origin sees as a failure.
                if let Some(origin) = self.consumers[c].origin {
                    let to = self.consumers[origin].shard;
                    let asker = Asker::Pinned { consumer: origin };
                    self.send(
                        s,
                        to,
                        Msg::Answer {
                            asker,
                            records: None,
                        },
                    );
                }
            }
        }
        self.ledger.retain(|&(o, _), _| o != s);
        self.crashed_ms = Some(self.now_ms);
        self.start_shard_tasks(s);
        self.count("crashes");
    }

    /// Records of a topic nobody holds on owner `o`, loaded or not.
    fn available_on(&self, o: usize, t: usize, only: Option<PartitionId>) -> u64 {
        let mut sum = 0;
        for p in self.local_partitions(o, t) {
            if only.is_some_and(|only| only != p) {
                continue;
            }
            sum += match self.shards[o].parts.get(&(t, p)) {
                Some(q) => q.table.available(q.hwm),
                None => {
                    let d = &self.disk[&(t, p)];
                    let settled = d.ahead.iter().filter(|&&a| a < d.hwm).count() as u64;
                    d.hwm.0.saturating_sub(d.frontier.0).saturating_sub(settled)
                }
            };
        }
        sum
    }

    fn check(&mut self) {
        let now = self.now_ms;
        let mut regressed = None;
        for (s, shard) in self.shards.iter_mut().enumerate() {
            for (&(t, p), q) in shard.parts.iter_mut() {
                q.table.assert_invariants();
                let frontier = q.table.frontier();
                let persisted = self.disk[&(t, p)].frontier;
                if frontier < q.frontier_seen || frontier < persisted {
                    regressed = Some(format!("t{t}/{} on {s}: {frontier}", p.0));
                }
                q.frontier_seen = frontier;
            }
        }
        if let Some(what) = regressed {
            self.report_failure(&format!("the frontier regressed: {what}"));
        }
        let mut live: HashMap<(usize, PartitionId, Offset), u64> = HashMap::new();
        for held in self.held.values() {
            let l = held.lease;
            let owner = self.owner_of(l.topic, l.partition);
            let leased = self.shards[owner]
                .parts
                .get(&(l.topic, l.partition))
                .is_some_and(|q| q.table.is_leased(l.offset, l.nonce, now));
            if leased {
                if let Some(other) = live.insert((l.topic, l.partition, l.offset), l.nonce) {
                    let what = format!("{l:?} and nonce {other} are both live");
                    self.report_failure(&what);
                }
            }
        }
        self.check_no_lost_wake();
    }

    fn check_no_lost_wake(&mut self) {
        let now = self.now_ms;
        for t in 0..self.topics.len() {
            for o in 0..self.shards() {
                let key = (o, t);
                if self.available_on(o, t, None) > 0 {
                    self.avail_since.entry(key).or_insert(now);
                } else {
                    self.avail_since.remove(&key);
                }
            }
            for p in (0..self.topics[t].partitions).map(PartitionId) {
                let o = self.owner_of(t, p);
                if self.available_on(o, t, Some(p)) > 0 {
                    self.avail_since_part.entry((t, p)).or_insert(now);
                } else {
                    self.avail_since_part.remove(&(t, p));
                }
            }
        }
        let floor = self.crashed_ms.map_or(0, |at| at + AFTER_CRASH_MS);
        for &c in &self.parked {
            let consumer = &self.consumers[c];
            if !consumer.waiter.as_ref().is_some_and(|w| w.is_live()) {
                continue;
            }
            let t = consumer.topic;
            let since_available = match consumer.pinned {
                Some(p) => self.avail_since_part.get(&(t, p)).copied(),
                None => (0..self.shards())
                    .filter_map(|o| self.avail_since.get(&(o, t)).copied())
                    .min(),
            };
            let Some(since_available) = since_available else {
                continue;
            };
            let key = (consumer.shard, t, consumer.pinned);
            let served = self.served_ms.get(&key).copied().unwrap_or(0);
            let since = since_available
                .max(consumer.parked_at_ms)
                .max(served)
                .max(floor);
            if now > since + NO_LOST_WAKE_MS {
                let what = format!(
                    "c{c} parked on {} for t{t} (pinned {:?}) since {} while records were available since {since_available} (last served {served})",
                    consumer.shard, consumer.pinned, consumer.parked_at_ms
                );
                self.report_failure(&format!("lost wake: {what}"));
            }
        }
    }

    /// Partitions with records not settled: (topic, partition, frontier, hwm,
    /// leases, acked ahead), loaded or not.
    fn unsettled(&self) -> Vec<(usize, u32, Offset, Offset, usize, usize)> {
        let mut out = Vec::new();
        for (&(t, p), d) in &self.disk {
            let o = self.owner_of(t, p);
            let (frontier, leases, ahead) = match self.shards[o].parts.get(&(t, p)) {
                Some(q) => (
                    q.table.frontier(),
                    q.table.in_flight(),
                    q.table.acked_ahead_len(),
                ),
                None => (d.frontier, 0, d.ahead.len()),
            };
            if frontier < d.hwm {
                out.push((t, p.0, frontier, d.hwm, leases, ahead));
            }
        }
        out
    }

    fn drained(&self) -> bool {
        self.unsettled().is_empty()
    }

    fn check_drained(&mut self) {
        if !self.drained() {
            self.report_failure("the run ended before every record was settled");
        }
        for (&(t, p), d) in &self.disk {
            for offset in (0..d.hwm.0).map(Offset) {
                assert!(
                    self.acked.contains(&(t, p, offset)),
                    "seed {}: t{t}/{} offset {offset} settled without an ack",
                    self.seed,
                    p.0
                );
            }
        }
    }

    fn report_failure(&self, what: &str) -> ! {
        eprintln!("seed {}: last events:", self.seed);
        for line in &self.trace {
            eprintln!("  {line}");
        }
        for t in 0..self.topics.len() {
            for o in 0..self.shards() {
                let id = self.topics[t].id;
                let shard = &self.shards[o];
                eprintln!(
                    "  t{t} on {o}: available {}, parked {}, tokens {}, promised {}",
                    self.available_on(o, t, None),
                    shard.waiters.has_parked(id),
                    shard.tokens.has_tokens(id, self.now_ms),
                    shard.tokens.outstanding(id, self.now_ms),
                );
            }
        }
        panic!("seed {} at {} ms: {what}", self.seed, self.now_ms);
    }
}

fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("NARAD_TEST_SEED") {
        return vec![seed.parse().expect("NARAD_TEST_SEED is a number")];
    }
    let count: u64 = std::env::var("NARAD_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEEDS_DEFAULT);
    let base: u64 = rand::rng().random_range(0..1 << 40);
    (base..base + count).collect()
}

#[test]
fn parked_consumers_get_every_record_across_shards() {
    let mut totals: BTreeMap<&'static str, u64> = BTreeMap::new();
    for seed in seeds() {
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let mut sim = Sim::new(seed);
            sim.run();
            sim.stats
        }));
        match outcome {
            Ok(stats) => {
                for (k, v) in stats {
                    *totals.entry(k).or_default() += v;
                }
            }
            Err(panic) => {
                eprintln!("consume simulation failed: seed={seed}");
                eprintln!(
                    "replay with NARAD_TEST_SEED={seed} cargo test -p narad-shards --test consume_sim"
                );
                std::panic::resume_unwind(panic);
            }
        }
    }
    eprintln!("consume simulation totals: {totals:?}");
}
