//! A seeded simulation of one partition's in-flight table: several consumers with
//! random behaviour (ack in time, extend then ack, nack, vanish, ack late with a
//! stale nonce), a producer growing the high watermark, time steps and jumps past
//! the visibility timeout, corrupt records skipped, retention outrunning the
//! consumers, an ack persister that snapshots (frontier, acked-ahead set) when the
//! settled state changed, and crashes that rebuild the table from the last
//! snapshot only, as recovery from consumer.ahead would.
//!
//! Checks, at every step:
//! - the frontier never regresses within a life, and never falls below the last
//!   persisted frontier across lives;
//! - no offset has two live leases among the handles consumers hold, and every
//!   handle is live exactly when the consumer's own view says it must be (not
//!   expired, not settled, released, skipped, dropped or forgotten by a crash);
//! - a stale handle never settles, extends or releases anything;
//! - the acked-ahead set stays within the sum of the caps (plus corrupt skips);
//! - the table's own invariants.
//!
//! At the end, consumers that ack everything run until the partition drains, and
//! every offset below the high watermark must be settled, each one acked after a
//! delivery, skipped as corrupt, or aged out by retention: every record is
//! delivered until it is acked.
//!
//! `NARAD_TEST_SEED=<n>` replays one seed exactly (nothing here reads a clock);
//! `NARAD_SIM_SEEDS=<n>` runs more seeds (default 200) from a random base.

mod seeded;

use std::collections::{BTreeMap, BTreeSet};

use narad_shards::consume::inflight::{Caps, InFlight, Reserve};
use narad_shards::ids::Offset;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SEEDS_DEFAULT: u64 = 200;
const STEPS: usize = 5_000;
const CONSUMERS: usize = 5;
const RECORDS_MAX: u64 = 800;
const SKIP_RECORDS_MAX: u64 = 3;

/// What a consumer does with a record it received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    Ack,
    ExtendThenAck,
    Nack,
    /// Acks only after its lease expired: the nonce is stale by then.
    AckLate,
}

/// A receipt handle a consumer holds, and what the consumer knows about it.
#[derive(Clone, Copy, Debug)]
struct Held {
    offset: Offset,
    nonce: u64,
    expiry_ms: u64,
    /// Settled, released, dropped or forgotten: live no more, whatever the clock.
    dead: bool,
    plan: Plan,
    due_ms: u64,
}

impl Held {
    fn live(&self, now_ms: u64) -> bool {
        !self.dead && now_ms < self.expiry_ms
    }
}

#[derive(Clone, Copy, Debug)]
struct Behaviour {
    ack: u32,
    extend: u32,
    nack: u32,
    vanish: u32,
    late: u32,
}

struct Sim {
    seed: u64,
    rng: ChaCha8Rng,
    table: InFlight,
    caps: Caps,
    visibility_ms: u64,
    now_ms: u64,
    hwm: Offset,
    consumers: Vec<(Behaviour, Vec<Held>)>,
    /// The last (frontier, acked-ahead set) the persister wrote.
    persisted: (Offset, Vec<Offset>),
    life_frontier: Offset,
    delivered: BTreeSet<Offset>,
    acked_ok: BTreeSet<Offset>,
    skipped: BTreeSet<Offset>,
    dropped: BTreeSet<Offset>,
    stats: BTreeMap<&'static str, u64>,
}

impl Sim {
    fn new(seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let caps = Caps {
            in_flight_max: rng.random_range(1..24),
            acked_ahead_max: rng.random_range(0..24),
        };
        let consumers = (0..CONSUMERS)
            .map(|_| {
                let behaviour = Behaviour {
                    ack: rng.random_range(1..20),
                    extend: rng.random_range(0..5),
                    nack: rng.random_range(0..5),
                    vanish: rng.random_range(0..4),
                    late: rng.random_range(0..4),
                };
                (behaviour, Vec::new())
            })
            .collect();
        Self {
            seed,
            visibility_ms: rng.random_range(20..400),
            rng,
            table: InFlight::new(Offset(0), []),
            caps,
            now_ms: 0,
            hwm: Offset(0),
            consumers,
            persisted: (Offset(0), Vec::new()),
            life_frontier: Offset(0),
            delivered: BTreeSet::new(),
            acked_ok: BTreeSet::new(),
            skipped: BTreeSet::new(),
            dropped: BTreeSet::new(),
            stats: BTreeMap::new(),
        }
    }

    fn count(&mut self, what: &'static str) {
        *self.stats.entry(what).or_default() += 1;
    }

    fn run(&mut self) {
        for _ in 0..STEPS {
            match self.rng.random_range(0..1_000) {
                0..200 => self.produce(),
                200..450 => self.poll(),
                450..700 => self.act_due(),
                700..850 => self.advance(),
                850..920 => self.persist(),
                920..960 => self.purge(),
                960..963 => self.crash(),
                963..966 => self.retention(),
                _ => self.act_random_handle(),
            }
            self.check();
        }
        self.drain();
    }

    fn produce(&mut self) {
        let records = self.rng.random_range(0..5);
        self.hwm = Offset((self.hwm.0 + records).min(RECORDS_MAX));
    }

    fn advance(&mut self) {
        let ms = if self.rng.random_bool(0.03) {
            self.visibility_ms * self.rng.random_range(1..4)
        } else {
            self.rng.random_range(0..self.visibility_ms / 4 + 1)
        };
        self.now_ms += ms;
    }

    fn persist(&mut self) {
        if self.table.take_settled_changed() {
            self.persisted = (self.table.frontier(), self.table.acked_ahead().collect());
            self.count("persists");
        }
    }

    fn purge(&mut self) {
        self.table.purge_expired(self.now_ms);
        if let Some(expiry_ms) = self.table.next_expiry_ms() {
            assert!(expiry_ms > self.now_ms, "a purge left an expired lease");
        }
    }

    /// The owner restarts: leases are forgotten, the persisted pair is recovered.
    fn crash(&mut self) {
        let (frontier, acked) = self.persisted.clone();
        self.table = InFlight::new(frontier, acked);
        self.life_frontier = frontier;
        for (_, held) in &mut self.consumers {
            held.iter_mut().for_each(|h| h.dead = true);
        }
        self.count("crashes");
    }

    /// Retention deletes the oldest records past the frontier.
    fn retention(&mut self) {
        let frontier = self.table.frontier();
        if frontier >= self.hwm {
            return;
        }
        let oldest = Offset(self.rng.random_range(frontier.0 + 1..=self.hwm.0));
        for offset in (frontier.0..oldest.0).map(Offset) {
            if !self.is_settled(offset) {
                self.dropped.insert(offset);
            }
        }
        assert!(
            self.table.jump_to(oldest),
            "a jump above the frontier must move it"
        );
        self.kill(|h| h.offset < oldest);
        self.count("retention jumps");
    }

    fn is_settled(&self, offset: Offset) -> bool {
        offset < self.table.frontier() || self.table.acked_ahead().any(|o| o == offset)
    }

    fn kill(&mut self, which: impl Fn(&Held) -> bool) {
        for (_, held) in &mut self.consumers {
            held.iter_mut()
                .filter(|h| which(h))
                .for_each(|h| h.dead = true);
        }
    }

    fn poll(&mut self) {
        let consumer = self.rng.random_range(0..CONSUMERS);
        let nonce = self.rng.random();
        let before = self.table.frontier();
        let got = self
            .table
            .reserve(self.now_ms, self.hwm, &self.caps, self.visibility_ms, nonce);
        let (offset, expiry_ms) = match got {
            Reserve::Reserved { offset, expiry_ms } => (offset, expiry_ms),
            Reserve::Empty => return self.count("polls empty"),
            Reserve::Full => return self.count("polls full"),
        };
        assert!(
            offset >= before && offset < self.hwm,
            "reserved {offset} out of range"
        );
        assert!(!self.is_settled(offset), "reserved settled offset {offset}");
        assert_eq!(expiry_ms, self.now_ms + self.visibility_ms);
        // Any other handle on this offset must already be dead in its holder's view.
        for (_, held) in &self.consumers {
            for h in held.iter().filter(|h| h.offset == offset) {
                assert!(
                    !h.live(self.now_ms),
                    "{offset} re-leased while {h:?} is live"
                );
            }
        }
        self.delivered.insert(offset);
        self.count("deliveries");
        // The read finds the record's frame unreadable now and then.
        if self.rng.random_bool(0.005) {
            return self.skip(offset);
        }
        let held = self.plan(consumer, offset, nonce, expiry_ms);
        if let Some(held) = held {
            self.consumers[consumer].1.push(held);
        }
    }

    fn plan(
        &mut self,
        consumer: usize,
        offset: Offset,
        nonce: u64,
        expiry_ms: u64,
    ) -> Option<Held> {
        let b = self.consumers[consumer].0;
        let total = b.ack + b.extend + b.nack + b.vanish + b.late;
        let mut pick = self.rng.random_range(0..total);
        let mut next = |weight: u32| {
            let hit = pick < weight;
            pick = pick.saturating_sub(weight);
            hit
        };
        let vis = self.visibility_ms;
        let (plan, due_ms) = if next(b.ack) {
            // Mostly in time; one in ten is late by up to half a timeout.
            (
                Plan::Ack,
                self.now_ms + self.rng.random_range(0..vis + vis / 10),
            )
        } else if next(b.extend) {
            (
                Plan::ExtendThenAck,
                self.now_ms + self.rng.random_range(0..vis),
            )
        } else if next(b.nack) {
            (Plan::Nack, self.now_ms + self.rng.random_range(0..vis))
        } else if next(b.vanish) {
            self.count("vanished");
            return None;
        } else {
            (Plan::AckLate, expiry_ms + self.rng.random_range(0..vis))
        };
        let dead = false;
        Some(Held {
            offset,
            nonce,
            expiry_ms,
            dead,
            plan,
            due_ms,
        })
    }

    fn skip(&mut self, offset: Offset) {
        let len = self.rng.random_range(1..=SKIP_RECORDS_MAX);
        let end = Offset((offset.0 + len).min(self.hwm.0));
        let fresh: Vec<Offset> = (offset.0..end.0)
            .map(Offset)
            .filter(|&o| !self.is_settled(o))
            .collect();
        let skipped = self.table.skip_corrupt(offset..end);
        assert_eq!(skipped, fresh.len() as u64, "skip_corrupt count");
        self.skipped.extend(fresh);
        self.kill(|h| h.offset >= offset && h.offset < end);
        self.count("corrupt skips");
    }

    /// Every consumer acts on its handles that are due, earliest first.
    fn act_due(&mut self) {
        let now_ms = self.now_ms;
        for consumer in 0..CONSUMERS {
            let held = &mut self.consumers[consumer].1;
            held.sort_by_key(|h| h.due_ms);
            let due = held.iter().take_while(|h| h.due_ms <= now_ms).count();
            let due: Vec<Held> = held.drain(..due).collect();
            for h in due {
                self.act(consumer, h);
            }
        }
    }

    /// A consumer acts early on a random handle.
    fn act_random_handle(&mut self) {
        let consumer = self.rng.random_range(0..CONSUMERS);
        let held = &mut self.consumers[consumer].1;
        if held.is_empty() {
            return;
        }
        let h = held.swap_remove(self.rng.random_range(0..held.len()));
        self.act(consumer, h);
    }

    fn act(&mut self, consumer: usize, mut h: Held) {
        let now_ms = self.now_ms;
        let live = h.live(now_ms);
        let settled_before = (self.table.frontier(), self.table.acked_ahead_len());
        match h.plan {
            Plan::Ack | Plan::AckLate => {
                let got = self.table.ack(h.offset, h.nonce, now_ms);
                assert_eq!(got.is_ok(), live, "ack of {h:?} at {now_ms}");
                if got.is_ok() {
                    assert!(
                        self.is_settled(h.offset),
                        "an accepted ack left {h:?} unsettled"
                    );
                    self.acked_ok.insert(h.offset);
                    self.kill(|o| o.offset == h.offset);
                    self.count("acks");
                } else {
                    self.count("stale acks");
                }
            }
            Plan::ExtendThenAck => {
                let got = self
                    .table
                    .extend(h.offset, h.nonce, now_ms, self.visibility_ms);
                assert_eq!(got.is_ok(), live, "extend of {h:?} at {now_ms}");
                if let Ok(expiry_ms) = got {
                    assert_eq!(expiry_ms, now_ms + self.visibility_ms);
                    h.expiry_ms = expiry_ms;
                    h.plan = Plan::Ack;
                    h.due_ms = now_ms + self.rng.random_range(0..self.visibility_ms);
                    self.consumers[consumer].1.push(h);
                    self.count("extends");
                }
            }
            Plan::Nack => {
                let got = self.table.nack(h.offset, h.nonce, now_ms);
                assert_eq!(got.is_ok(), live, "nack of {h:?} at {now_ms}");
                if got.is_ok() {
                    self.kill(|o| o.offset == h.offset);
                    self.count("nacks");
                }
            }
        }
        if !live {
            let after = (self.table.frontier(), self.table.acked_ahead_len());
            assert_eq!(
                settled_before, after,
                "a stale handle {h:?} changed the settled state"
            );
        }
    }

    fn check(&mut self) {
        self.table.assert_invariants();
        let frontier = self.table.frontier();
        assert!(
            frontier >= self.life_frontier,
            "the frontier regressed to {frontier}"
        );
        assert!(
            frontier >= self.persisted.0,
            "the frontier fell below the persisted one"
        );
        self.life_frontier = frontier;
        let bound = self.caps.in_flight_max + self.caps.acked_ahead_max + self.skipped.len();
        assert!(
            self.table.acked_ahead_len() <= bound,
            "the acked-ahead set outgrew its caps"
        );
        assert!(self.table.in_flight() <= self.caps.in_flight_max);
        let mut live: BTreeMap<Offset, usize> = BTreeMap::new();
        for (_, held) in &self.consumers {
            for h in held {
                let leased = self.table.is_leased(h.offset, h.nonce, self.now_ms);
                assert_eq!(
                    leased,
                    h.live(self.now_ms),
                    "handle {h:?} at {}",
                    self.now_ms
                );
                if leased {
                    *live.entry(h.offset).or_default() += 1;
                }
            }
        }
        assert!(
            live.values().all(|&n| n == 1),
            "an offset has two live leases"
        );
    }

    /// Consumers that ack everything run until the partition drains.
    fn drain(&mut self) {
        for (_, held) in &mut self.consumers {
            held.clear();
        }
        let rounds_max = 2 * RECORDS_MAX + 10;
        for _ in 0..rounds_max {
            if self.table.frontier() >= self.hwm {
                break;
            }
            // Whatever vanished consumers still hold expires.
            self.now_ms += self.visibility_ms;
            loop {
                let nonce = self.rng.random();
                let got = self.table.reserve(
                    self.now_ms,
                    self.hwm,
                    &self.caps,
                    self.visibility_ms,
                    nonce,
                );
                let Reserve::Reserved { offset, .. } = got else {
                    break;
                };
                self.delivered.insert(offset);
                self.table
                    .ack(offset, nonce, self.now_ms)
                    .expect("a fresh lease acks");
                self.acked_ok.insert(offset);
                self.check();
            }
        }
        self.check_drained();
    }

    fn check_drained(&self) {
        let seed = self.seed;
        assert_eq!(
            self.table.frontier(),
            self.hwm,
            "seed {seed}: the partition did not drain"
        );
        assert_eq!(self.table.acked_ahead_len(), 0);
        assert_eq!(self.table.in_flight(), 0);
        for offset in (0..self.hwm.0).map(Offset) {
            let by_ack = self.acked_ok.contains(&offset) && self.delivered.contains(&offset);
            let lost = self.skipped.contains(&offset) || self.dropped.contains(&offset);
            assert!(
                by_ack || lost,
                "seed {seed}: {offset} settled without an ack"
            );
        }
    }
}

#[test]
fn every_record_is_delivered_until_settled() {
    seeded::run(
        "in-flight simulation",
        "inflight_sim",
        SEEDS_DEFAULT,
        |seed| {
            let mut sim = Sim::new(seed);
            sim.run();
            sim.stats
        },
    );
}
