//! The owner side: the broker's `Queues` (`src/consume/queues.rs`).
//!
//! In-flight tables loaded from the persisted state on first touch, reservation
//! before the read (`take`), the release of records nobody received, the settle of
//! receipt handles, the background purger, the ack persister, and the retirement
//! of a promise made by a spend of tokens.
//!
//! A purge of expired leases on a touch of a table (a reservation, the settle of a
//! receipt handle) wakes the pump when it released something, as the background
//! purger does: the spec says a lease expiry fires the wake-up like a
//! high-watermark advance or a nack. A lease purged on touch is never purged by
//! the purger, so without that wake the records it frees are not offered to the
//! tokens held on the owner (nor to consumers parked on it) until something else
//! kicks the topic: a produce, a nack, a registration, at worst the keeper's
//! renewal 5 s later. The broker's `Queues::take` and `Queues::settle` are to wake
//! the same way; without the wake this simulation's no-lost-wake check fails
//! (seed 243065348351, for one: an ack that arrived after its lease expired purged
//! it, and a consumer parked on another shard waited on a free record).

use std::collections::BTreeSet;

use narad_shards::consume::inflight::{InFlight, Reserve};
use narad_shards::consume::tokens::PromiseId;
use narad_shards::ids::PartitionId;
use rand::Rng;

use crate::world::{Ev, Kind, Lease, PartQ, Records, Sim};
use crate::{PERSIST_INTERVAL_MS, PURGE_INTERVAL_MS, READ_RETRY_AFTER_MS};

impl Sim {
    /// `Queues::take`: up to `max` records, staying on a partition until it runs
    /// dry. A partition whose read fails (`Sim::read_faults`) releases what was
    /// reserved for it without a wake and asks for a wake of the topic later
    /// (`wake_later`, `Waiters::kick_later`); `None` when a read failed and
    /// nothing was taken (the broker's `Err`).
    pub(crate) fn take(
        &mut self,
        s: usize,
        t: usize,
        partitions: &[PartitionId],
        max: usize,
    ) -> Option<Records> {
        assert!(max > 0);
        let mut out = Vec::new();
        let mut failed = false;
        for &p in partitions {
            if out.len() >= max {
                break;
            }
            self.load(s, t, p);
            let want = max - out.len();
            let (now, vis, caps) = (
                self.now_ms,
                self.topics[t].visibility_ms,
                self.topics[t].caps,
            );
            // `InFlight::reserve` purges first; done here to see what it released,
            // which wakes the pump (see the module doc).
            let q = self.shards[s].parts.get_mut(&(t, p)).unwrap();
            if q.table.purge_expired(now) > 0 {
                self.wake(s, t);
            }
            let rng = &mut self.rng;
            let q = self.shards[s].parts.get_mut(&(t, p)).unwrap();
            let mut reserved = Vec::new();
            while reserved.len() < want {
                let nonce = rng.random();
                match q.table.reserve(now, q.hwm, &caps, vis, nonce) {
                    Reserve::Reserved { offset, .. } => reserved.push((offset, nonce)),
                    Reserve::Empty | Reserve::Full => break,
                }
            }
            if reserved.is_empty() {
                continue;
            }
            if self
                .read_faults
                .get(&(t, p))
                .is_some_and(|&until| now < until)
            {
                let q = self.shards[s].parts.get_mut(&(t, p)).unwrap();
                for &(offset, nonce) in &reserved {
                    q.table
                        .nack(offset, nonce, now)
                        .expect("a fresh lease releases");
                }
                self.count("failed reads");
                self.kick_later(s, t);
                failed = true;
                continue;
            }
            let (rng, q) = (
                &mut self.rng,
                self.shards[s].parts.get_mut(&(t, p)).unwrap(),
            );
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
        (!failed || !out.is_empty()).then_some(out)
    }

    /// `Waiters::kick_later`: the topic's consumers are served again after
    /// the retry pause, once however many reads failed meanwhile.
    pub(crate) fn kick_later(&mut self, s: usize, t: usize) {
        if self.shards[s].retrying.insert(t) {
            let epoch = self.shards[s].epoch;
            self.at(READ_RETRY_AFTER_MS, Ev::ReadRetry(s, epoch, t));
        }
    }

    /// `Queues::queue`: the partition's table, loaded from the persisted state on
    /// first touch.
    pub(crate) fn load(&mut self, s: usize, t: usize, p: PartitionId) {
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
    pub(crate) fn release_delivered(&mut self, s: usize, t: usize, records: &[Lease]) {
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

    /// Shard `from` claimed or passed `promise` on `owner`: that promise goes,
    /// if it has not lapsed.
    pub(crate) fn retire_promise(
        &mut self,
        owner: usize,
        t: usize,
        from: usize,
        promise: PromiseId,
    ) {
        let id = self.topics[t].id;
        self.shards[owner]
            .tokens
            .retire_notification(id, from, promise);
        let now = self.now_ms;
        let ledger = self.ledger.entry((owner, t)).or_default();
        let found = ledger
            .iter()
            .position(|&(s, _, p)| s == from && p == promise);
        let late = found.is_none_or(|at| ledger[at].1 <= now);
        if let Some(at) = found {
            ledger.remove(at);
        }
        if late {
            let newer = ledger
                .iter()
                .any(|&(s, deadline, _)| s == from && deadline > now);
            self.count("late claims and passes");
            if newer {
                self.count("late beside a newer promise to the same shard");
            }
        }
    }

    /// `Queues::available`: records of the topic's loaded partitions nobody
    /// holds that a reservation could take now, under the topic's caps.
    pub(crate) fn available_loaded(&self, s: usize, t: usize) -> u64 {
        let caps = self.topics[t].caps;
        self.shards[s]
            .parts
            .iter()
            .filter(|((pt, _), _)| *pt == t)
            .map(|(_, q)| q.table.available_under(q.hwm, &caps))
            .sum()
    }

    /// `run_purger` / `Queues::purge_expired`.
    pub(crate) fn purge(&mut self, s: usize) {
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
    pub(crate) fn persist(&mut self, s: usize) {
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

    /// `Queues::settle` on the owner.
    pub(crate) fn apply_settle(&mut self, s: usize, lease: Lease, kind: Kind) {
        let now = self.now_ms;
        let t = lease.topic;
        let vis = self.topics[t].visibility_ms;
        let Some(q) = self.shards[s].parts.get_mut(&(t, lease.partition)) else {
            return self.count("settles stale (not loaded)");
        };
        let purged = q.table.purge_expired(now);
        // An ack that makes room under the caps wakes, as `Queues::settle`
        // does: a consumer may have parked on the full table.
        let caps = self.topics[t].caps;
        let capped = kind == Kind::Ack && q.table.available_under(q.hwm, &caps) == 0;
        let ok = match kind {
            Kind::Ack => q.table.ack(lease.offset, lease.nonce, now).is_ok(),
            Kind::Extend => q.table.extend(lease.offset, lease.nonce, now, vis).is_ok(),
            Kind::Nack => q.table.nack(lease.offset, lease.nonce, now).is_ok(),
        };
        let uncapped = capped && ok && q.table.available_under(q.hwm, &caps) > 0;
        self.note(format!(
            "{kind:?} {lease:?} on {s}: ok {ok}, purged {purged} first"
        ));
        // A purge on touch wakes the pump, as the purger's does (see the module doc).
        if purged > 0 {
            self.wake(s, t);
        }
        if !ok {
            return self.count("settles stale");
        }
        if uncapped {
            self.count("acks that made room under the caps");
            self.wake(s, t);
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
}
