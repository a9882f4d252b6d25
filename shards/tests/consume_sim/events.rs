//! The random workload and the event loop.
//!
//! [`Workload`] phases decide how often a tick produces or brings a consumer;
//! ticks also cancel consumers and crash shards. A consumer that got a record
//! plans what to do with it (ack, extend then ack, nack, ack after the lease
//! expired, or vanish) and acts later through a random shard. `run` pops events in
//! time order, dispatches each (`step`) and checks the invariants after it.
//!
//! Every random choice comes from the seed's one ChaCha8 stream, drawn in event
//! order, so a seed replays exactly.

use narad_shards::ids::{Offset, PartitionId};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::world::{
    Asker, Consumer, Ev, Held, Kind, Lease, Msg, Plan, Pollers, Shard, Sim, State, Steady,
};
use crate::{
    DRAIN_ARRIVE_PER_MILLE, DRAIN_MS_MAX, READ_FAULT_MS, READ_FAULT_PER_MILLE,
    RECORDS_PER_PARTITION_MAX, RUN_MS, TICK_MS, WAIT_MS_MAX,
};

/// Per mille of ticks that produce or bring a consumer, until `until_ms`. Phases
/// change at random: busy ones rarely park anyone, quiet ones leave consumers
/// parked with records arriving (notify and claim), or stop producing so that
/// only a wake-up that was kept serves a parked consumer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Workload {
    pub(crate) produce: u32,
    pub(crate) arrive: u32,
    pub(crate) until_ms: u64,
}

impl Workload {
    pub(crate) fn roll(rng: &mut ChaCha8Rng, now_ms: u64) -> Self {
        Workload {
            produce: [0, 0, 10, 40, 150, 400][rng.random_range(0..6)],
            arrive: [5, 10, 40, 180][rng.random_range(0..4)],
            until_ms: now_ms + rng.random_range(100..2_000),
        }
    }
}

impl Sim {
    pub(crate) fn run(&mut self) {
        if self.calm {
            self.count("calm seeds");
        }
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
            Ev::PumpTopic(s, epoch, id) if self.shards[s].epoch == epoch => {
                self.pump_topic_task(s, id)
            }
            Ev::Pumped(s, epoch, id) if self.shards[s].epoch == epoch => self.pumped(s, id),
            Ev::ClaimStart(s, epoch, n) if self.shards[s].epoch == epoch => self.claim_start(s, n),
            Ev::Keeper(s, epoch) if self.shards[s].epoch == epoch => self.keeper(s),
            Ev::Purge(s, epoch) if self.shards[s].epoch == epoch => self.purge(s),
            Ev::Persist(s, epoch) if self.shards[s].epoch == epoch => self.persist(s),
            Ev::Deadline(c) => self.deadline(c),
            Ev::Act(h) => self.act(h),
            Ev::PromiseLapse(s, epoch, t) if self.shards[s].epoch == epoch => {
                self.wake(s, t);
                self.promise_timer_sleep(s, t);
            }
            Ev::ReadRetry(s, epoch, t) if self.shards[s].epoch == epoch => {
                self.shards[s].retrying.remove(&t);
                self.count("read retries");
                self.wake(s, t);
            }
            // A task of a shard that crashed since.
            Ev::Pump(..)
            | Ev::PumpTopic(..)
            | Ev::Pumped(..)
            | Ev::ClaimStart(..)
            | Ev::Keeper(..)
            | Ev::Purge(..)
            | Ev::Persist(..)
            | Ev::PromiseLapse(..)
            | Ev::ReadRetry(..) => {}
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
        if let Some(steady) = self.steady.filter(|_| !self.draining) {
            self.steady_tick(steady);
            let next = self.rng.random_range(1..=TICK_MS);
            return self.at(next, Ev::Tick);
        }
        if let Some(step) = self.faulty_reads.filter(|_| !self.draining) {
            self.faulty_reads_tick(step);
            let next = self.rng.random_range(1..=TICK_MS);
            return self.at(next, Ev::Tick);
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
        } else if r < w.produce + w.arrive + 17 && !self.calm {
            self.crash();
        } else if r < w.produce + w.arrive + 17 + READ_FAULT_PER_MILLE && !self.calm {
            self.read_fault();
        }
        let next = self.rng.random_range(1..=TICK_MS);
        self.at(next, Ev::Tick);
    }

    /// The fairness scenario's tick: one record to the next partition when
    /// its time comes, every shard's waiting consumers made up again, and a
    /// poller on its shard if the scenario has one.
    fn steady_tick(&mut self, mut steady: Steady) {
        if self.now_ms >= steady.next_produce_ms {
            let p = PartitionId(steady.next_partition % self.topics[0].partitions);
            steady.next_partition += 1;
            steady.next_produce_ms = self.now_ms + steady.produce_every_ms;
            let n = self.rng.random_range(1..=steady.batch_max as u64);
            self.produce_to(0, p, n);
        }
        self.steady = Some(steady);
        for s in 0..self.shards() {
            let open = self
                .consumers
                .iter()
                .filter(|c| c.shard == s && c.origin.is_none() && c.wait_ms > 0)
                .filter(|c| c.state != State::Done)
                .count();
            for _ in open..steady.consumers_per_shard {
                let max = self.rng.random_range(1..=steady.batch_max);
                self.arrive_as(s, 0, None, max, WAIT_MS_MAX);
            }
        }
        // Partition `s` is shard `s`'s: the scenario's topic is not shifted.
        let max = self.rng.random_range(1..=steady.batch_max);
        match steady.pollers {
            Some(Pollers::On(s)) => self.arrive_as(s, 0, None, max, 0),
            Some(Pollers::PinnedOnOwners) => {
                for p in 0..self.topics[0].partitions {
                    self.arrive_as(p as usize, 0, Some(PartitionId(p)), max, 0);
                }
            }
            None => {}
        }
    }

    /// The read fault scenario's tick: first the consumers park and every
    /// partition's reads start to fail, then records arrive on every
    /// partition, then nothing.
    fn faulty_reads_tick(&mut self, step: u32) {
        let partitions = self.topics[0].partitions;
        match step {
            0 => {
                for s in 0..self.shards() {
                    self.arrive_as(s, 0, None, 1, WAIT_MS_MAX);
                    self.arrive_as(s, 0, None, 2, WAIT_MS_MAX);
                }
                for p in (0..partitions).map(PartitionId) {
                    let s = self.rng.random_range(0..self.shards());
                    self.arrive_as(s, 0, Some(p), 1, WAIT_MS_MAX);
                }
                // Past the records' arrival at 1.1 s.
                let until = 1_200 + self.rng.random_range(READ_FAULT_MS);
                for p in (0..partitions).map(PartitionId) {
                    self.read_faults.insert((0, p), until);
                }
                self.count("read faults");
            }
            // After the consumers parked, and while the reads fail.
            1 if self.now_ms >= 1_100 => {
                for p in (0..partitions).map(PartitionId) {
                    let n = self.rng.random_range(1..=4);
                    self.produce_to(0, p, n);
                }
            }
            _ => return,
        }
        self.faulty_reads = Some(step + 1);
    }

    /// `Queues::on_visible` on the owner after a commit.
    fn produce(&mut self) {
        let t = self.rng.random_range(0..self.topics.len());
        let p = PartitionId(self.rng.random_range(0..self.topics[t].partitions));
        let n = self.rng.random_range(1..=3);
        self.produce_to(t, p, n);
    }

    /// `n` records committed to partition `p` of topic `t`.
    fn produce_to(&mut self, t: usize, p: PartitionId, n: u64) {
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
        self.arrive_as(s, t, pinned, max, wait_ms);
    }

    /// A consume request with these parameters lands on shard `s`.
    fn arrive_as(
        &mut self,
        s: usize,
        t: usize,
        pinned: Option<PartitionId>,
        max: usize,
        wait_ms: u64,
    ) {
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
                    claim: None,
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

    pub(crate) fn plan(&mut self, lease: Lease) {
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

    /// A partition's reads start to fail, for a while.
    fn read_fault(&mut self) {
        let t = self.rng.random_range(0..self.topics.len());
        let p = PartitionId(self.rng.random_range(0..self.topics[t].partitions));
        let until = self.now_ms + self.rng.random_range(READ_FAULT_MS);
        self.note(format!("reads of t{t}/{} fail until {until}", p.0));
        let end = self.read_faults.entry((t, p)).or_default();
        *end = (*end).max(until);
        self.count("read faults");
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
}
