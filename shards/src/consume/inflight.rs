//! The in-flight table of one partition (sans-IO): which offsets are leased to a
//! consumer, which are settled, and which is the next one to hand out.
//!
//! Runs on the shard that owns the partition, one instance per partition; it is
//! `!Send` like all shard state and is touched by the consume pump, the ack, extend
//! and nack handlers, the expiry purger and the ack persister, all on that core.
//!
//! The `frontier` is the lowest offset not yet settled: everything below it is
//! finished for good (acked, skipped as corrupt, or aged out by retention). Every
//! offset at or above it is exactly one of
//! - leased: handed to one consumer, with a nonce and an expiry;
//! - acked ahead: settled out of order, parked until the gap beneath it closes;
//! - free: to be handed out (again).
//!
//! Only the frontier and the acked-ahead set are persisted; leases live in memory
//! and a crash forgets them, so their records are simply delivered again. A table
//! rebuilt with [`InFlight::new`] from the persisted pair is a valid table.
//!
//! Invariants (asserted, in release too):
//! - The frontier never regresses.
//! - An offset has at most one live lease: leases are keyed by offset, and a lease
//!   is only ever taken on a free offset.
//! - A handle (offset, nonce) settles, extends or releases only the live lease it
//!   names; an expired lease is stale even before the purger has released it.
//! - Memory is bounded: leases by `Caps::in_flight_max`, the acked-ahead set by the
//!   sum of the two caps (acks of leased offsets are always accepted), the expiry
//!   heap by twice the leases plus [`DEADLINES_STALE_SLACK`].
//!
//! Why this structure. The hot path (reserve, ack, extend, nack) runs at tens of
//! thousands of messages a second per core, so none of it scans. Offsets at or above
//! `next_fresh` were never leased: they are free unless acked ahead, which only a
//! recovered set or a corrupt skip puts there. Free offsets below `next_fresh`
//! (expired or nacked) wait in `released`. The lowest free offset is therefore the
//! smaller of `released`'s first entry and `next_fresh`, found in O(log n). Expiry
//! uses a min-heap of deadlines; an extend pushes a new deadline instead of
//! searching for the old one, and a popped deadline acts only if it still matches
//! the lease's nonce and expiry, so a lease is never evicted by its own superseded
//! deadline. Stale deadlines at the top are dropped at once (so the top is always a
//! live lease's deadline), and the heap is rebuilt from the leases when stale
//! deadlines outnumber live ones, which keeps it bounded at amortized O(1) per step.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::ops::Range;

use crate::ids::Offset;

/// Stale deadlines tolerated beyond the live leases before the expiry heap is
/// rebuilt: the heap holds at most `2 * leases + DEADLINES_STALE_SLACK` entries.
pub const DEADLINES_STALE_SLACK: usize = 64;

/// Per-topic caps on one partition's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Leases held at once; at the cap, reserve answers [`Reserve::Full`].
    pub in_flight_max: usize,
    /// Acked-ahead offsets; at the cap, only the frontier hole may be leased.
    pub acked_ahead_max: usize,
}

/// The answer to [`InFlight::reserve`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reserve {
    /// Leased: the caller reads this offset next (reservation before read).
    Reserved { offset: Offset, expiry_ms: u64 },
    /// Nothing free below the high watermark (no record to hand out).
    Empty,
    /// The in-flight cap is reached (consume answers 204).
    Full,
}

/// Why a handle was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandleError {
    /// No live lease at that offset with that nonce: settled, expired and maybe
    /// re-leased, or never leased (HTTP 410).
    Stale,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Lease {
    nonce: u64,
    expiry_ms: u64,
}

/// One entry of the expiry heap; stale once the lease it names is gone or re-armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Deadline {
    expiry_ms: u64,
    offset: Offset,
    nonce: u64,
}

/// The in-flight table of one partition. See the module doc.
#[derive(Debug)]
pub struct InFlight {
    /// The lowest offset not settled.
    frontier: Offset,
    /// Every offset at or above it was never leased since this table was built.
    next_fresh: Offset,
    /// Free offsets in `[frontier, next_fresh)`: expired or nacked leases.
    released: BTreeSet<Offset>,
    leases: BTreeMap<Offset, Lease>,
    /// Settled offsets above the frontier, acked or skipped as corrupt.
    acked_ahead: BTreeSet<Offset>,
    deadlines: BinaryHeap<Reverse<Deadline>>,
    /// The largest high watermark passed to reserve; the watermark only grows.
    hwm_max: Offset,
    settled_changed: bool,
    corrupt_skipped_total: u64,
    /// Offsets [`jump_to`](Self::jump_to) settled that no consumer had acked.
    dropped_total: u64,
}

impl InFlight {
    /// A table recovered from persisted consumer state: `frontier` and the offsets
    /// settled above it. Offsets below `frontier` in `acked_ahead` are ignored; if
    /// the set covers the frontier itself, the frontier advances over the contiguous
    /// run. [`take_settled_changed`](Self::take_settled_changed) then reports a
    /// change when the recovered state was not already in that normal form.
    pub fn new(frontier: Offset, acked_ahead: impl IntoIterator<Item = Offset>) -> Self {
        let mut ignored = false;
        let acked_ahead: BTreeSet<Offset> = acked_ahead
            .into_iter()
            .filter(|&offset| {
                ignored |= offset < frontier;
                offset >= frontier
            })
            .collect();
        let mut table = Self {
            frontier,
            next_fresh: frontier,
            released: BTreeSet::new(),
            leases: BTreeMap::new(),
            acked_ahead,
            deadlines: BinaryHeap::new(),
            hwm_max: Offset(0),
            settled_changed: false,
            corrupt_skipped_total: 0,
            dropped_total: 0,
        };
        let moved = table.collapse_frontier();
        table.settled_changed = ignored || moved;
        assert!(table
            .acked_ahead
            .first()
            .is_none_or(|&o| o > table.frontier));
        table
    }

    /// The lowest offset not yet settled.
    pub fn frontier(&self) -> Offset {
        self.frontier
    }

    /// Acked-ahead offsets, ascending (the set the ack persister writes).
    pub fn acked_ahead(&self) -> impl Iterator<Item = Offset> + '_ {
        self.acked_ahead.iter().copied()
    }

    pub fn acked_ahead_len(&self) -> usize {
        self.acked_ahead.len()
    }

    /// Leases held, expired-but-not-yet-purged ones included.
    pub fn in_flight(&self) -> usize {
        self.leases.len()
    }

    /// Offsets settled by [`skip_corrupt`](Self::skip_corrupt) since this table was built.
    pub fn corrupt_skipped_total(&self) -> u64 {
        self.corrupt_skipped_total
    }

    /// Offsets retention took before any consumer acked them (settled by
    /// [`jump_to`](Self::jump_to)) since this table was built.
    pub fn dropped_total(&self) -> u64 {
        self.dropped_total
    }

    /// Releases every lease whose expiry_ms <= now_ms; returns how many it released.
    /// Called on every touch and by a background purger every second.
    pub fn purge_expired(&mut self, now_ms: u64) -> usize {
        let mut released = 0;
        // Bounded by the heap's length: every iteration pops one deadline.
        while let Some(&Reverse(deadline)) = self.deadlines.peek() {
            if deadline.expiry_ms > now_ms {
                break;
            }
            self.deadlines.pop();
            if self.is_live(&deadline) {
                self.leases.remove(&deadline.offset);
                self.release(deadline.offset);
                released += 1;
            }
        }
        self.tidy_deadlines();
        released
    }

    /// The earliest live lease expiry, if any (for the purger / wake-ups). It may
    /// already be past if nothing has purged since.
    pub fn next_expiry_ms(&self) -> Option<u64> {
        let Reverse(deadline) = self.deadlines.peek()?;
        debug_assert!(self.is_live(deadline));
        Some(deadline.expiry_ms)
    }

    /// Purges expired leases first, then leases the lowest free offset in
    /// `[frontier, hwm)` with `nonce`, expiring at `now_ms + visibility_ms`.
    ///
    /// At `caps.in_flight_max` leases: `Full`. With the acked-ahead set at
    /// `caps.acked_ahead_max`, only the frontier hole itself may be leased: a free
    /// offset above it answers `Full` (204 until the gap closes). `Empty` means no
    /// offset below `hwm` is free at all.
    pub fn reserve(
        &mut self,
        now_ms: u64,
        hwm: Offset,
        caps: &Caps,
        visibility_ms: u64,
        nonce: u64,
    ) -> Reserve {
        assert!(
            visibility_ms > 0,
            "a lease must outlive its own reservation"
        );
        assert!(
            hwm >= self.hwm_max,
            "the high watermark went backwards: {hwm} after {}",
            self.hwm_max
        );
        self.hwm_max = hwm;
        self.purge_expired(now_ms);
        if self.leases.len() >= caps.in_flight_max {
            return Reserve::Full;
        }
        let offset = self.lowest_free();
        if offset >= hwm {
            return Reserve::Empty;
        }
        if self.acked_ahead.len() >= caps.acked_ahead_max && offset != self.frontier {
            return Reserve::Full;
        }
        self.take_free(offset);
        let expiry_ms = now_ms.saturating_add(visibility_ms);
        let lease = Lease { nonce, expiry_ms };
        let previous = self.leases.insert(offset, lease);
        assert!(previous.is_none(), "offset {offset} leased twice");
        self.push_deadline(offset, lease);
        Reserve::Reserved { offset, expiry_ms }
    }

    /// Ack: settles the offset if (offset, nonce) is a live lease. Acks for leased
    /// offsets are always accepted, even past `acked_ahead_max` (the set is bounded
    /// by the sum of the two caps). Advances the frontier over the contiguous run.
    /// An expired-but-not-yet-purged lease is stale (purged first).
    pub fn ack(&mut self, offset: Offset, nonce: u64, now_ms: u64) -> Result<(), HandleError> {
        self.purge_expired(now_ms);
        self.take_lease(offset, nonce, now_ms)?;
        self.settle(offset);
        self.tidy_deadlines();
        Ok(())
    }

    /// Extend: re-arms the lease's expiry to `now_ms + visibility_ms` and returns it.
    /// The superseded deadline stays in the heap and is skipped when popped.
    pub fn extend(
        &mut self,
        offset: Offset,
        nonce: u64,
        now_ms: u64,
        visibility_ms: u64,
    ) -> Result<u64, HandleError> {
        assert!(visibility_ms > 0, "a lease must outlive its own extend");
        self.purge_expired(now_ms);
        let lease = match self.leases.get_mut(&offset) {
            Some(lease) if lease.nonce == nonce => lease,
            _ => return Err(HandleError::Stale),
        };
        assert!(
            lease.expiry_ms > now_ms,
            "an expired lease survived the purge"
        );
        lease.expiry_ms = now_ms.saturating_add(visibility_ms);
        let lease = *lease;
        self.push_deadline(offset, lease);
        self.tidy_deadlines();
        Ok(lease.expiry_ms)
    }

    /// Nack: releases the lease at once so the offset is free again (the caller
    /// wakes a waiting consumer).
    pub fn nack(&mut self, offset: Offset, nonce: u64, now_ms: u64) -> Result<(), HandleError> {
        self.purge_expired(now_ms);
        self.take_lease(offset, nonce, now_ms)?;
        self.release(offset);
        self.tidy_deadlines();
        Ok(())
    }

    /// The offsets `[range.start, range.end)` are permanently unreadable: settle
    /// them (dropping any lease on them) and return how many were not settled yet.
    ///
    /// Skipped offsets above the frontier join the acked-ahead set, so they are
    /// persisted with it and not read again after a restart. A range that reaches
    /// down to the frontier costs O(log n) plus the entries it drops; one above it
    /// costs O(range length log n), so callers pass one frame's records at a time.
    pub fn skip_corrupt(&mut self, range: Range<Offset>) -> u64 {
        let start = range.start.max(self.frontier);
        if start >= range.end {
            return 0;
        }
        let skipped = if start == self.frontier {
            let settled_already = self.acked_ahead.range(..range.end).count() as u64;
            let skipped = range.end.0 - start.0 - settled_already;
            self.settle_below(range.end);
            skipped
        } else {
            self.skip_above_frontier(start..range.end)
        };
        if skipped > 0 {
            self.settled_changed = true;
        }
        self.corrupt_skipped_total += skipped;
        self.tidy_deadlines();
        skipped
    }

    /// Retention outran the consumer: the frontier jumps to `oldest` in one step if
    /// it is below it; leases and acked-ahead entries below `oldest` are dropped.
    /// Returns whether the frontier moved.
    pub fn jump_to(&mut self, oldest: Offset) -> bool {
        if oldest <= self.frontier {
            return false;
        }
        let acked_below = self.acked_ahead.range(..oldest).count() as u64;
        self.dropped_total += oldest.0 - self.frontier.0 - acked_below;
        self.settle_below(oldest);
        self.settled_changed = true;
        self.tidy_deadlines();
        true
    }

    /// Records available to hand out now: free offsets in `[frontier, hwm)` (the
    /// estimate the token protocol gates notifications on). Leases that expired but
    /// were not purged yet still count as taken.
    pub fn available(&self, hwm: Offset) -> u64 {
        if hwm <= self.frontier {
            return 0;
        }
        let span = hwm.0 - self.frontier.0;
        // Leases sit below every high watermark seen; the range counts only run
        // when `hwm` is below an offset the table already knows about.
        let leased = if hwm >= self.next_fresh {
            self.leases.len()
        } else {
            self.leases.range(..hwm).count()
        };
        let acked = match self.acked_ahead.last() {
            Some(&last) if last >= hwm => self.acked_ahead.range(..hwm).count(),
            _ => self.acked_ahead.len(),
        };
        span.checked_sub((leased + acked) as u64)
            .expect("more offsets taken than the span holds")
    }

    /// Records [`reserve`](Self::reserve) could hand out now under `caps`: none at
    /// the in-flight cap, at most the frontier hole at the acked-ahead cap, else
    /// [`available`](Self::available) up to the room left under the in-flight
    /// cap. Notifications are gated on it, so an owner at its caps does not call
    /// consumers of other shards in for records they cannot take.
    pub fn available_under(&self, hwm: Offset, caps: &Caps) -> u64 {
        let room = caps.in_flight_max.saturating_sub(self.leases.len()) as u64;
        if room == 0 {
            return 0;
        }
        if self.acked_ahead.len() >= caps.acked_ahead_max {
            let hole_free = self.frontier < hwm && !self.leases.contains_key(&self.frontier);
            return u64::from(hole_free);
        }
        self.available(hwm).min(room)
    }

    /// Whether the settled state (frontier or acked-ahead set) changed since the
    /// last call; clears the flag. The ack persister uses it.
    pub fn take_settled_changed(&mut self) -> bool {
        std::mem::take(&mut self.settled_changed)
    }

    /// Is (offset, nonce) a live lease now?
    pub fn is_leased(&self, offset: Offset, nonce: u64, now_ms: u64) -> bool {
        self.leases
            .get(&offset)
            .is_some_and(|lease| lease.nonce == nonce && lease.expiry_ms > now_ms)
    }

    /// Does (offset, nonce) still hold its lease entry, lapsed or not? A lapsed
    /// lease nobody has purged yet was not given to anyone else.
    pub fn holds(&self, offset: Offset, nonce: u64) -> bool {
        self.leases
            .get(&offset)
            .is_some_and(|lease| lease.nonce == nonce)
    }

    /// Checks every invariant in O(n); for tests and simulations.
    pub fn assert_invariants(&self) {
        let (frontier, next_fresh) = (self.frontier, self.next_fresh);
        assert!(
            next_fresh >= frontier,
            "next_fresh {next_fresh} < frontier {frontier}"
        );
        for &offset in &self.released {
            assert!(
                offset >= frontier && offset < next_fresh,
                "released {offset}"
            );
            assert!(
                !self.leases.contains_key(&offset),
                "released {offset} leased"
            );
            assert!(
                !self.acked_ahead.contains(&offset),
                "released {offset} acked"
            );
        }
        for &offset in self.leases.keys() {
            assert!(offset >= frontier && offset < next_fresh, "lease {offset}");
            assert!(!self.acked_ahead.contains(&offset), "lease {offset} acked");
        }
        assert!(self.acked_ahead.first().is_none_or(|&o| o > frontier));
        let acked_below_fresh = self.acked_ahead.range(..next_fresh).count();
        assert_eq!(
            next_fresh.0 - frontier.0,
            (self.released.len() + self.leases.len() + acked_below_fresh) as u64,
            "an offset below next_fresh is neither leased, released nor acked"
        );
        let deadlines: BTreeSet<Deadline> = self.deadlines.iter().map(|&Reverse(d)| d).collect();
        for (&offset, lease) in &self.leases {
            let deadline = Deadline {
                expiry_ms: lease.expiry_ms,
                offset,
                nonce: lease.nonce,
            };
            assert!(
                deadlines.contains(&deadline),
                "lease {offset} has no deadline"
            );
        }
        assert!(self
            .deadlines
            .peek()
            .is_none_or(|Reverse(d)| self.is_live(d)));
        assert!(self.deadlines.len() <= 2 * self.leases.len() + DEADLINES_STALE_SLACK);
    }

    /// The lowest free offset (unbounded above: offsets past the fresh mark are free).
    fn lowest_free(&mut self) -> Offset {
        // Acked-ahead offsets at the fresh mark came from a recovered set or a
        // corrupt skip; step over them. Each is stepped over once, as the mark only
        // grows, so the loop is bounded by the set's size.
        while self.acked_ahead.contains(&self.next_fresh) {
            self.next_fresh = self.next_fresh.next();
        }
        match self.released.first() {
            Some(&released) => released.min(self.next_fresh),
            None => self.next_fresh,
        }
    }

    /// Takes `offset`, the lowest free offset, out of the free offsets.
    fn take_free(&mut self, offset: Offset) {
        if !self.released.remove(&offset) {
            assert_eq!(offset, self.next_fresh, "offset {offset} is not free");
            self.next_fresh = offset.next();
        }
        assert!(offset >= self.frontier);
        assert!(
            !self.acked_ahead.contains(&offset),
            "offset {offset} is settled"
        );
    }

    /// Removes the live lease `(offset, nonce)`, or answers `Stale`.
    fn take_lease(&mut self, offset: Offset, nonce: u64, now_ms: u64) -> Result<(), HandleError> {
        match self.leases.get(&offset) {
            Some(lease) if lease.nonce == nonce => {
                assert!(
                    lease.expiry_ms > now_ms,
                    "an expired lease survived the purge"
                );
                self.leases.remove(&offset);
                Ok(())
            }
            _ => Err(HandleError::Stale),
        }
    }

    /// Makes an offset whose lease just ended free again.
    fn release(&mut self, offset: Offset) {
        assert!(offset >= self.frontier && offset < self.next_fresh);
        let fresh = self.released.insert(offset);
        assert!(fresh, "offset {offset} released twice");
    }

    /// Settles `offset`, whose lease was just removed.
    fn settle(&mut self, offset: Offset) {
        assert!(
            offset >= self.frontier,
            "settling {offset} below the frontier"
        );
        let fresh = self.acked_ahead.insert(offset);
        assert!(fresh, "offset {offset} settled twice");
        self.collapse_frontier();
        self.settled_changed = true;
    }

    /// Settles everything below `end` (at or above the frontier): drops leases,
    /// released and acked-ahead entries below it and moves the frontier there.
    fn settle_below(&mut self, end: Offset) {
        assert!(end > self.frontier);
        self.leases = self.leases.split_off(&end);
        self.released = self.released.split_off(&end);
        self.acked_ahead = self.acked_ahead.split_off(&end);
        self.advance_frontier_to(end);
        self.collapse_frontier();
    }

    /// Settles each unsettled offset of `range`, which lies above the frontier.
    fn skip_above_frontier(&mut self, range: Range<Offset>) -> u64 {
        assert!(range.start > self.frontier);
        let mut skipped = 0;
        for offset in (range.start.0..range.end.0).map(Offset) {
            if self.acked_ahead.contains(&offset) {
                continue;
            }
            if self.leases.remove(&offset).is_none() {
                self.released.remove(&offset);
            }
            self.acked_ahead.insert(offset);
            skipped += 1;
        }
        skipped
    }

    /// Advances the frontier over the contiguous settled run at it; returns whether
    /// it moved.
    fn collapse_frontier(&mut self) -> bool {
        let before = self.frontier;
        // Bounded by the acked-ahead set: every iteration removes one entry.
        while self.acked_ahead.first() == Some(&self.frontier) {
            self.acked_ahead.pop_first();
            let next = self.frontier.next();
            self.advance_frontier_to(next);
        }
        self.frontier != before
    }

    fn advance_frontier_to(&mut self, frontier: Offset) {
        assert!(
            frontier >= self.frontier,
            "the frontier regressed from {} to {frontier}",
            self.frontier
        );
        self.frontier = frontier;
        self.next_fresh = self.next_fresh.max(frontier);
        assert!(self.released.first().is_none_or(|&o| o >= frontier));
        assert!(self
            .leases
            .first_key_value()
            .is_none_or(|(&o, _)| o >= frontier));
    }

    fn push_deadline(&mut self, offset: Offset, lease: Lease) {
        self.deadlines.push(Reverse(Deadline {
            expiry_ms: lease.expiry_ms,
            offset,
            nonce: lease.nonce,
        }));
        self.tidy_deadlines();
    }

    /// Drops stale deadlines from the top of the heap, so the top is always a live
    /// lease's, and rebuilds the heap when stale deadlines outnumber live ones.
    fn tidy_deadlines(&mut self) {
        while let Some(Reverse(deadline)) = self.deadlines.peek() {
            if self.is_live(deadline) {
                break;
            }
            self.deadlines.pop();
        }
        if self.deadlines.len() > 2 * self.leases.len() + DEADLINES_STALE_SLACK {
            self.deadlines = self
                .leases
                .iter()
                .map(|(&offset, lease)| {
                    Reverse(Deadline {
                        expiry_ms: lease.expiry_ms,
                        offset,
                        nonce: lease.nonce,
                    })
                })
                .collect();
        }
    }

    /// Whether `deadline` is the current deadline of a lease.
    fn is_live(&self, deadline: &Deadline) -> bool {
        self.leases.get(&deadline.offset)
            == Some(&Lease {
                nonce: deadline.nonce,
                expiry_ms: deadline.expiry_ms,
            })
    }
}

#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod tests;
