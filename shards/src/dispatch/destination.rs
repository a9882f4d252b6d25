//! One destination partition's state: its queue, its commit in flight, and whether
//! it is failing or hung.
//!
//! The same entry also counts the records *of this partition* (by the partition
//! they were accepted for, reroutes aside) that are skipped, which is what keeps a
//! partition's records in WAL order: a record of a partition with an earlier
//! record still skipped is skipped too.

use std::collections::VecDeque;
use std::time::Instant;

use super::CommitId;
use crate::ids::{IncarnationId, PartitionId, Seq};

/// A record held in a destination's queue.
#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    pub seq: Seq,
    pub encoded_bytes: u32,
    pub incarnation: IncarnationId,
    /// The partition the record was accepted for (differs from the queue's when
    /// rerouted).
    pub origin: PartitionId,
    pub placed_at: Instant,
}

/// A destination whose last commit failed.
#[derive(Clone, Copy, Debug)]
pub(super) struct Failing {
    /// The start of the first failed attempt: the reroute grace counts from here.
    pub since: Instant,
    /// When the probe may go again.
    pub next_probe_at: Instant,
}

/// One destination partition.
#[derive(Debug)]
pub(super) struct Destination {
    /// Records waiting for the next commit, in WAL order per origin partition.
    /// While failing, at most the one probe record.
    pub queue: VecDeque<Held>,
    pub in_flight: Option<CommitId>,
    /// The commit in flight passed the hung threshold: it no longer counts, and the
    /// destination takes no records until it lands.
    pub hung: bool,
    pub failing: Option<Failing>,
    /// Records accepted for this partition that are skipped (left in the WAL).
    pub skipped_records: u64,
    /// A record of this partition was skipped (or returned) during the current
    /// rescan pass, so its later records in the pass must be skipped too.
    pub blocked_in_pass: bool,
    /// This destination turned records away (full, hung, probe held): when it can
    /// take records again, a rescan brings them back.
    pub turned_away: bool,
    /// A ready destination that did not commit looks again then: its linger ends,
    /// its probe is due, or its owner is looked up again.
    pub retry_at: Option<Instant>,
    pub last_active: Instant,
    /// Its records go to a sibling (told once in the log, until it recovers).
    pub rerouting: bool,
}

impl Destination {
    pub fn new(now: Instant) -> Self {
        Self {
            queue: VecDeque::new(),
            in_flight: None,
            hung: false,
            failing: None,
            skipped_records: 0,
            blocked_in_pass: false,
            turned_away: false,
            retry_at: None,
            last_active: now,
            rerouting: false,
        }
    }

    /// Whether the destination holds its probe (failing, one record kept).
    pub fn holds_probe(&self) -> bool {
        self.failing.is_some() && (!self.queue.is_empty() || self.in_flight.is_some())
    }

    /// Whether the current rescan pass may still place records of this partition:
    /// it has skipped records and none was skipped (or returned) again yet.
    pub fn open_in_pass(&self) -> bool {
        self.skipped_records > 0 && !self.blocked_in_pass
    }

    /// Whether a record routed here must be skipped instead of queued.
    pub fn turns_away(&self, queue_records_max: usize) -> bool {
        self.hung || self.holds_probe() || self.queue.len() >= queue_records_max
    }

    /// Whether nothing here needs remembering any more.
    pub fn is_forgettable(&self, now: Instant, idle_after: std::time::Duration) -> bool {
        self.queue.is_empty()
            && self.in_flight.is_none()
            && self.skipped_records == 0
            && now.saturating_duration_since(self.last_active) >= idle_after
    }

    /// The failing state, checked: a failing destination holds at most its probe.
    pub fn assert_invariants(&self) {
        if self.failing.is_some() {
            assert!(
                self.queue.len() <= 1,
                "a failing destination holds only its probe"
            );
            assert!(self.queue.is_empty() || self.in_flight.is_none());
        }
        if self.hung {
            assert!(self.in_flight.is_some() && self.queue.is_empty());
        }
    }
}
