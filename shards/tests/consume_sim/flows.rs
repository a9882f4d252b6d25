//! The request flows of the broker's `src/consume/flow.rs`.
//!
//! A consume's route (`flow::consume`, `consume_queue`: a local take, a probe of
//! each other owner in turn, then park, `registrations_needed`, `register` and
//! `ensure_keeper`), a pinned consume served here (`consume_pinned_here`) or
//! forwarded to its owner, the owner's side of `Op::Consume`
//! (`flow::serve_consume_op`: a reply nobody receives is released), the mesh's
//! dispatch of ops (`broker::ops::serve_consume_op`), and a parked consumer's wait
//! (`wait_for`: a delivery or the deadline).

use std::time::Duration;

use narad_shards::consume::tokens::PromiseId;
use narad_shards::consume::waiters::{Waiter, SHARE_WINDOW};
use narad_shards::ids::PartitionId;

use crate::world::{Asker, Consumer, Ev, Msg, Records, Sim, State};

impl Sim {
    /// `consume_queue`, up to the first probe.
    pub(crate) fn consume_queue(&mut self, c: usize) {
        let (s, t, max) = (
            self.consumers[c].shard,
            self.consumers[c].topic,
            self.consumers[c].max,
        );
        let mut local = self.local_partitions(s, t);
        // It takes only what those waiting before it leave.
        let share = self.newcomer_share(s, t, &mut local, None, max);
        if let (false, Some(max)) = (local.is_empty(), share) {
            match self.take(s, t, &local, max) {
                Some(got) if got.is_empty() => {}
                Some(got) => return self.receive(c, got),
                // The read failed: the consume is answered with the error.
                None => return self.receive(c, Vec::new()),
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
                claim: None,
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
        self.ensure_keeper(s);
    }

    /// Parks consumer `c` on its shard's FIFO (`Waiters::park`, which kicks).
    fn park(&mut self, c: usize, pinned: Option<PartitionId>) {
        let (s, t) = (self.consumers[c].shard, self.consumers[c].topic);
        let consumer = &self.consumers[c];
        let (waiter, answer) = Waiter::new_at(consumer.max, self.now_ms, consumer.deadline_ms);
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
    pub(crate) fn consume_pinned_here(&mut self, c: usize, p: PartitionId) -> Option<Records> {
        let (s, t, max) = (
            self.consumers[c].shard,
            self.consumers[c].topic,
            self.consumers[c].max,
        );
        // It takes only what those waiting before it leave.
        let mut local = self.local_partitions(s, t);
        let got = match self.newcomer_share(s, t, &mut local, Some(p), max) {
            Some(max) => self.take(s, t, &[p], max),
            None => Some(Vec::new()),
        };
        // A failed read answers the consume with the error.
        let Some(got) = got else {
            return Some(Vec::new());
        };
        if !got.is_empty() || self.consumers[c].wait_ms == 0 {
            return Some(got);
        }
        self.park(c, Some(p));
        None
    }

    /// `broker::ops::serve_consume_op`.
    pub(crate) fn on_mesh(&mut self, from: usize, to: usize, msg: Msg) {
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
            Msg::Notify {
                topic,
                owner,
                promise,
            } => {
                let (id, name) = (self.topics[topic].id, self.topics[topic].name.clone());
                self.shards[to].waiters.notified(id, &name, owner, promise);
                self.wake_pump(to);
            }
            Msg::Pass { topic, promise } => {
                self.retire_promise(to, topic, from, promise);
                self.wake(to, topic);
            }
            Msg::Release { topic, records } => self.release_delivered(to, topic, &records),
            Msg::Settle { lease, kind } => self.apply_settle(to, lease, kind),
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
        claim: Option<PromiseId>,
        wait_ms: u64,
        asker: Asker,
    ) {
        if let Some(promise) = claim {
            self.retire_promise(s, t, from, promise);
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
                // A claim takes its own record and what is not promised to
                // other claims; a probe only what those waiting before it
                // leave.
                let mut local = self.local_partitions(s, t);
                let share = match claim {
                    Some(_) => self.own_share(s, t, max),
                    None => self.newcomer_share(s, t, &mut local, None, max),
                };
                let got = match share {
                    Some(max) => self.take(s, t, &local, max),
                    None => Some(Vec::new()),
                };
                match got {
                    Some(got) => self.answer(s, from, t, asker, got),
                    // The read failed: the asker gets the error.
                    None if self.receivable(asker) => {
                        let msg = Msg::Answer {
                            asker,
                            records: None,
                        };
                        self.send(s, from, msg);
                    }
                    None => {}
                }
            }
        }
        // Consumers parked on the owner were held back from what the claim took.
        if claim.is_some() {
            self.wake(s, t);
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

    /// `wait_for`'s deadline.
    pub(crate) fn deadline(&mut self, c: usize) {
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
    pub(crate) fn collect_deliveries(&mut self) {
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
    pub(crate) fn receive(&mut self, c: usize, got: Records) {
        if got.len() > self.consumers[c].max {
            let what = format!("c{c} asked for {} and got {got:?}", self.consumers[c].max);
            self.report_failure(&what);
        }
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
        if origin.is_none() && !self.draining {
            self.delivered_per_shard[s] += got.len() as u64;
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
}
