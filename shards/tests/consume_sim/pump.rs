//! The tasks of a consumer's shard in the broker's `src/consume/flow.rs`.
//!
//! The pump (`run_pump`, `pump_topic`, `serve_fifo`: pinned FIFOs first, then the
//! topic's FIFO, then, with nobody parked here and a live token, `load_all` and
//! `spend_tokens`, one `Op::Notify` each), the claim after a notification
//! (`flow::claim`) and the registration keeper (`flow::keeper`).
//!
//! A spend of tokens is checked here against the simulation's own ledger of
//! promises: it never notifies more shards than the records available minus the
//! promises outstanding.

use narad_shards::consume::tokens::CLAIM_DEADLINE;
use std::rc::Rc;

use narad_shards::consume::waiters::{self, Notification, Renewal, Waiter};
use narad_shards::ids::{IncarnationId, PartitionId};
use rand::Rng;

use crate::world::{ms, Asker, Claim, Ev, Msg, Records, Sim};
use crate::{KEEPER_INTERVAL_MS, RENEW_AFTER, TASK_DELAY_MAX_MS};

impl Sim {
    /// `run_pump`, one round.
    pub(crate) fn pump(&mut self, s: usize) {
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
            // `spawn_local(pump_topic_task(..))`: it runs after the pump yields.
            let delay = self.rng.random_range(0..=TASK_DELAY_MAX_MS);
            let epoch = self.shards[s].epoch;
            self.at(delay, Ev::PumpTopic(s, epoch, kick.incarnation));
        }
    }

    /// `pump_topic_task`: the topic is served at once, and its task ends a
    /// while later (its reads took time), which is when it is reported pumped;
    /// kicks meanwhile wait for that.
    pub(crate) fn pump_topic_task(&mut self, s: usize, id: IncarnationId) {
        let t = self.topic_of(id);
        self.pump_topic(s, t);
        let delay = self.rng.random_range(0..=TASK_DELAY_MAX_MS);
        let epoch = self.shards[s].epoch;
        self.at(delay, Ev::Pumped(s, epoch, id));
    }

    /// The end of `pump_topic_task`.
    pub(crate) fn pumped(&mut self, s: usize, id: IncarnationId) {
        if self.shards[s].waiters.pumped(id) {
            self.wake_pump(s);
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
        // Tokens registered before the longest-parked consumer here go first.
        if self.shards[s].tokens.has_tokens(id, self.now_ms) {
            let before = self.shards[s].waiters.head_parked_ms(id);
            self.spend_tokens(s, t, &local, before.unwrap_or(u64::MAX));
        }
        self.serve_fifo(s, t, None, &local);
        let now = self.now_ms;
        if self.shards[s].waiters.has_parked(id) || !self.shards[s].tokens.has_tokens(id, now) {
            return;
        }
        self.spend_tokens(s, t, &local, u64::MAX);
    }

    /// `flow::spend_tokens`: `load_all`, then `Queues::spend_tokens`, one
    /// `Op::Notify` each, and `kick_at_claim_deadline`.
    fn spend_tokens(&mut self, s: usize, t: usize, local: &[PartitionId], before_ms: u64) {
        let (id, now) = (self.topics[t].id, self.now_ms);
        for &p in local {
            self.load(s, t, p);
        }
        let available = self.available_loaded(s, t);
        let ledger = self.ledger.entry((s, t)).or_default();
        ledger.retain(|&(_, deadline, _)| deadline > now);
        let promised = ledger.len() as u64;
        let notify = self.shards[s]
            .tokens
            .spend_registered_before(id, available, now, before_ms);
        if !notify.is_empty() && self.shards[s].promise_timer.insert(t) {
            // `kick_at_claim_deadlines`: a timer that sleeps to the next
            // deadline the tokens keep, kicks, and asks again.
            self.promise_timer_sleep(s, t);
        }
        if notify.len() as u64 > available.saturating_sub(promised) {
            self.report_failure(&format!(
                "shard {s} notified {notify:?} for t{t} with {available} available and {promised} promised"
            ));
        }
        for (to, promise) in notify {
            let deadline = now + ms(CLAIM_DEADLINE);
            self.ledger
                .entry((s, t))
                .or_default()
                .push_back((to, deadline, promise));
            self.count("notifications");
            self.note(format!("{s} notifies {to} for t{t}"));
            let msg = Msg::Notify {
                topic: t,
                owner: s,
                promise,
            };
            self.send(s, to, msg);
        }
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
        // puts it back and stops. Every FIFO takes only unpromised records.
        loop {
            // Promises are the topic's: a pinned consumer, too, takes only
            // what leaves enough on the shard for them.
            let share = self.own_share(s, t, usize::MAX);
            let Some(share) = share else {
                return;
            };
            let Some(waiter) = self.shards[s].waiters.pop_live(id, pinned) else {
                return;
            };
            let max = waiter.max.min(share);
            let got = self.take(s, t, parts, max);
            let Some(got) = got.filter(|got| !got.is_empty()) else {
                // Nothing, or a failed read (which asked for a wake later).
                self.shards[s].waiters.push_front(id, &name, pinned, waiter);
                self.ensure_keeper(s);
                return;
            };
            if let Err(back) = waiter.deliver(got) {
                self.release_delivered(s, t, &back);
            }
        }
    }

    /// `flow::claim`, up to the claim's probe.
    pub(crate) fn claim_start(&mut self, s: usize, n: Notification) {
        let t = self.topic_of(n.incarnation);
        let Some(waiter) = self.shards[s].waiters.pop_live(n.incarnation, None) else {
            self.count("passes");
            let pass = Msg::Pass {
                topic: t,
                promise: n.promise,
            };
            return self.send(s, n.owner, pass);
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
            claim: Some(n.promise),
            wait_ms: 0,
            asker: Asker::Claim { claim: k },
        };
        self.send(s, n.owner, msg);
    }

    /// `flow::claim`, after the claim's answer.
    pub(crate) fn claim_answered(&mut self, k: usize, records: Option<Records>) {
        let Claim {
            shard: s,
            topic: t,
            owner,
            waiter,
            ..
        } = self.claims[k].take().expect("a claim is answered once");
        let id = self.topics[t].id;
        match records {
            Some(got) if !got.is_empty() => {
                // `hand_out`: to the claim's consumer, or the next ones in
                // turn, each at most its own `max`; what nobody takes goes
                // back to the owner.
                let mut next = Some(waiter);
                let waiters = &mut self.shards[s].waiters;
                let unclaimed =
                    waiters::hand_out(got, || next.take().or_else(|| waiters.pop_live(id, None)));
                if !unclaimed.is_empty() {
                    self.count("claimed records released");
                    let release = Msg::Release {
                        topic: t,
                        records: unclaimed,
                    };
                    self.send(s, owner, release);
                }
            }
            Some(_) => {
                self.count("empty claims");
                self.claim_back(s, t, waiter);
            }
            // Failed on the owner (a read): the keeper renews, not the claim,
            // or the same notification would come straight back.
            None => {
                self.count("failed claims");
                self.claim_back(s, t, waiter);
                return;
            }
        }
        // `renew_registrations`: with every owner whose token is spent or
        // lapsing, while anyone is parked.
        let owners = self.remote_owners(s, t);
        let renewal =
            self.shards[s]
                .waiters
                .stale_registrations_of(id, self.now_ms, RENEW_AFTER, |_, _| owners.clone());
        if let Some(renewal) = renewal {
            self.send_renewal(s, renewal, "renewals after a claim");
        }
    }

    /// A claim that brought nothing: its consumer goes back to the head of
    /// the FIFO, the topic is served again (a record of this shard's own
    /// partitions may have come meanwhile), and the keeper runs.
    fn claim_back(&mut self, s: usize, t: usize, waiter: Rc<Waiter<Records>>) {
        let (id, name) = (self.topics[t].id, self.topics[t].name.clone());
        self.shards[s].waiters.push_front(id, &name, None, waiter);
        self.wake(s, t);
        self.ensure_keeper(s);
    }

    /// `ensure_keeper`.
    pub(crate) fn ensure_keeper(&mut self, s: usize) {
        if !self.shards[s].keeper_running {
            self.shards[s].keeper_running = true;
            let epoch = self.shards[s].epoch;
            self.at(KEEPER_INTERVAL_MS, Ev::Keeper(s, epoch));
        }
    }

    /// `send_renewal`: registers with each owner, for the renewal's TTL.
    fn send_renewal(&mut self, s: usize, renewal: Renewal, what: &'static str) {
        let t = self.topic_of(renewal.incarnation);
        let now = self.now_ms;
        for owner in renewal.owners {
            self.count(what);
            self.send(
                s,
                owner,
                Msg::Register {
                    topic: t,
                    from: s,
                    ttl: renewal.ttl,
                },
            );
            self.shards[s]
                .waiters
                .note_registered(renewal.incarnation, owner, renewal.ttl, now);
        }
    }

    /// `flow::keeper`, one round.
    pub(crate) fn keeper(&mut self, s: usize) {
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
        for renewal in stale {
            self.send_renewal(s, renewal, "keeper registrations");
        }
        let epoch = self.shards[s].epoch;
        self.at(KEEPER_INTERVAL_MS, Ev::Keeper(s, epoch));
    }
}
