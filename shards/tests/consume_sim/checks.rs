//! The invariants checked after every event, and the end of a run.
//!
//! After every event (the crate doc lists them): no offset with two live leases,
//! no frontier regression, every loaded in-flight table's own invariants, and no
//! lost wake. At the end, every record below every high watermark is settled, each
//! by an ack. A failure prints the seed, the last events and each shard's view of
//! each topic, then panics.

use std::collections::BTreeMap;

use narad_shards::consume::inflight::InFlight;
use narad_shards::ids::{Offset, PartitionId};

use crate::world::Sim;
use crate::{AFTER_CRASH_MS, NO_LOST_WAKE_MS, READ_RETRY_AFTER_MS};

impl Sim {
    /// Records of a topic on owner `o`, loaded or not, that a reservation could
    /// take now: nobody holds them and the topic's caps leave room.
    pub(crate) fn available_on(&self, o: usize, t: usize, only: Option<PartitionId>) -> u64 {
        let caps = self.topics[t].caps;
        let mut sum = 0;
        for p in self.local_partitions(o, t) {
            if only.is_some_and(|only| only != p) {
                continue;
            }
            sum += match self.shards[o].parts.get(&(t, p)) {
                Some(q) => q.table.available_under(q.hwm, &caps),
                None => {
                    // As it would load: no leases, the persisted settled state.
                    let d = &self.disk[&(t, p)];
                    InFlight::new(d.frontier, d.ahead.iter().copied()).available_under(d.hwm, &caps)
                }
            };
        }
        sum
    }

    pub(crate) fn check(&mut self) {
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
        let mut live: BTreeMap<(usize, PartitionId, Offset), u64> = BTreeMap::new();
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
        let floor = (self.crashed_ms.max(self.stall_end_ms)).map_or(0, |at| at + AFTER_CRASH_MS);
        for &c in &self.parked {
            let consumer = &self.consumers[c];
            if !consumer.waiter.as_ref().is_some_and(|w| w.is_live()) {
                continue;
            }
            let t = consumer.topic;
            // After a read fault of the topic, the last failed read's retry
            // serves it within the retry pause of the fault's end.
            let floor =
                (self.fault_end_ms(t)).map_or(floor, |at| floor.max(at + READ_RETRY_AFTER_MS));
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
    pub(crate) fn unsettled(&self) -> Vec<(usize, u32, Offset, Offset, usize, usize)> {
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

    pub(crate) fn drained(&self) -> bool {
        self.unsettled().is_empty()
    }

    pub(crate) fn check_drained(&mut self) {
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

    pub(crate) fn report_failure(&self, what: &str) -> ! {
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
