//! The dispatcher's bounds and timings, and the window that sizes itself to the
//! fan-out it sees.
//!
//! Every bound the dispatcher keeps on memory or work is here, with the relations
//! between them checked at compile time for the defaults and at construction for a
//! custom configuration (tests shrink the window so a short simulation reaches it).

use std::time::Duration;

use crate::wal::progress::TRACKED_SEQS_MAX;

/// Records held in memory at once (queued or in flight, hung commits aside) when few
/// destinations are active.
pub const WINDOW_BASE_RECORDS: usize = 4_096;
/// The window's hard cap.
pub const WINDOW_RECORDS_MAX: usize = 65_536;
/// The window aims for this many records per active destination, and a smaller
/// batch lingers while other commits run.
pub const TARGET_RECORDS_PER_DESTINATION: usize = 64;
/// A lingering batch never waits longer than this.
pub const LINGER_MAX: Duration = Duration::from_millis(50);
/// A destination's queue holds a quarter of the window, or at least this many.
pub const QUEUE_RECORDS_MIN: usize = 4_096;
/// The reader never reads more than this many windows past the checkpoint.
pub const LOOKAHEAD_WINDOWS: usize = 16;
/// Commits in flight at once; hung ones do not count.
pub const COMMITS_IN_FLIGHT_MAX: usize = 16;
/// Hung commits tolerated before they count against the fan-out again, so that a
/// cluster of silent owners cannot make the dispatcher hold unbounded memory.
pub const COMMITS_HUNG_MAX: usize = 256;
/// A commit in flight longer than this is hung.
pub const HUNG_AFTER: Duration = Duration::from_secs(1);
/// The driver's timeout for a commit, and for a single-record probe.
pub const COMMIT_BUDGET: Duration = Duration::from_secs(30);
pub const PROBE_BUDGET: Duration = Duration::from_secs(5);
/// A failing destination probes again this long after its last failure.
pub const FAILURE_BACKOFF: Duration = Duration::from_secs(1);
/// A destination failing this long (from the start of its first failed attempt)
/// has its records rerouted to a live sibling.
pub const REROUTE_AFTER: Duration = Duration::from_secs(3);
/// Records left in the WAL are read again at least this often.
pub const RESCAN_INTERVAL: Duration = Duration::from_secs(1);
/// An owner that does not resolve is looked up again this often.
pub const OWNER_LOOKUP_INTERVAL: Duration = Duration::from_millis(10);
/// A commit to another node carries at most this many encoded bytes (half the
/// 16 MiB stream frame limit), and always at least one record.
pub const REMOTE_COMMIT_BYTES_MAX: u64 = 8 << 20;
/// An unconfirmed "is this incarnation gone?" answer is remembered this long.
pub const GONE_ANSWER_TTL: Duration = Duration::from_secs(1);
/// An idle destination's state is forgotten after this long.
pub const IDLE_FORGET_AFTER: Duration = Duration::from_secs(10);
/// Confirmed-gone incarnations remembered per topic.
pub const GONE_INCARNATIONS_MAX: usize = 16;
/// Destinations tracked at once. Each holds a record, a skipped record, a commit or
/// was active in the last [`IDLE_FORGET_AFTER`], so this is a sanity bound.
pub const DESTINATIONS_MAX: usize = 1 << 20;

const _: () = assert!(WINDOW_BASE_RECORDS <= WINDOW_RECORDS_MAX);
const _: () = assert!(TARGET_RECORDS_PER_DESTINATION <= QUEUE_RECORDS_MIN);
const _: () = assert!((LOOKAHEAD_WINDOWS * WINDOW_RECORDS_MAX) as u64 <= TRACKED_SEQS_MAX);
const _: () =
    assert!(queue_records_max(WINDOW_RECORDS_MAX, QUEUE_RECORDS_MIN) * 4 <= WINDOW_RECORDS_MAX);
const _: () = assert!(HUNG_AFTER.as_nanos() < PROBE_BUDGET.as_nanos());
const _: () = assert!(PROBE_BUDGET.as_nanos() <= COMMIT_BUDGET.as_nanos());
const _: () = assert!(FAILURE_BACKOFF.as_nanos() < REROUTE_AFTER.as_nanos());
const _: () = assert!(LINGER_MAX.as_nanos() < HUNG_AFTER.as_nanos());

/// A destination's queue cap for a window: a quarter of it, at least `floor`.
pub const fn queue_records_max(window_records: usize, floor: usize) -> usize {
    let quarter = window_records / 4;
    if quarter > floor {
        quarter
    } else {
        floor
    }
}

/// The dispatcher's bounds and timings. [`Default`] gives the seed's constants.
#[derive(Clone, Debug)]
pub struct DispatchConfig {
    pub window_base_records: usize,
    pub window_records_max: usize,
    pub target_records_per_destination: usize,
    pub linger_max: Duration,
    pub queue_records_min: usize,
    pub lookahead_windows: usize,
    pub commits_in_flight_max: usize,
    pub commits_hung_max: usize,
    pub hung_after: Duration,
    pub commit_budget: Duration,
    pub probe_budget: Duration,
    pub failure_backoff: Duration,
    pub reroute_after: Duration,
    pub rescan_interval: Duration,
    pub owner_lookup_interval: Duration,
    pub remote_commit_bytes_max: u64,
    pub gone_answer_ttl: Duration,
    pub idle_forget_after: Duration,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        Self {
            window_base_records: WINDOW_BASE_RECORDS,
            window_records_max: WINDOW_RECORDS_MAX,
            target_records_per_destination: TARGET_RECORDS_PER_DESTINATION,
            linger_max: LINGER_MAX,
            queue_records_min: QUEUE_RECORDS_MIN,
            lookahead_windows: LOOKAHEAD_WINDOWS,
            commits_in_flight_max: COMMITS_IN_FLIGHT_MAX,
            commits_hung_max: COMMITS_HUNG_MAX,
            hung_after: HUNG_AFTER,
            commit_budget: COMMIT_BUDGET,
            probe_budget: PROBE_BUDGET,
            failure_backoff: FAILURE_BACKOFF,
            reroute_after: REROUTE_AFTER,
            rescan_interval: RESCAN_INTERVAL,
            owner_lookup_interval: OWNER_LOOKUP_INTERVAL,
            remote_commit_bytes_max: REMOTE_COMMIT_BYTES_MAX,
            gone_answer_ttl: GONE_ANSWER_TTL,
            idle_forget_after: IDLE_FORGET_AFTER,
        }
    }
}

impl DispatchConfig {
    /// Panics when the relations the dispatcher relies on do not hold.
    pub fn check(&self) {
        assert!(self.window_base_records >= 1);
        assert!(self.window_base_records <= self.window_records_max);
        assert!(self.target_records_per_destination >= 1);
        assert!(self.queue_records_min >= self.target_records_per_destination);
        assert!(self.lookahead_windows >= 1);
        assert!((self.lookahead_windows * self.window_records_max) as u64 <= TRACKED_SEQS_MAX);
        assert!(self.commits_in_flight_max >= 1);
        assert!(self.hung_after < self.probe_budget && self.probe_budget <= self.commit_budget);
        assert!(self.failure_backoff < self.reroute_after);
        assert!(self.linger_max < self.hung_after);
        assert!(self.remote_commit_bytes_max >= 1);
        assert!(!self.owner_lookup_interval.is_zero());
    }

    /// The window for `destinations_active` destinations: the per-destination
    /// target for each, between the base and the cap.
    pub fn window_records(&self, destinations_active: usize) -> usize {
        let wanted = destinations_active.saturating_mul(self.target_records_per_destination);
        let window = wanted.clamp(self.window_base_records, self.window_records_max);
        assert!(window >= self.window_base_records && window <= self.window_records_max);
        window
    }

    /// A destination's queue cap under `window_records`.
    pub fn queue_records_max(&self, window_records: usize) -> usize {
        queue_records_max(window_records, self.queue_records_min)
    }

    /// Records held (queued or in flight, hung aside) at which the reader stops:
    /// the window, but at least four destinations' worth, so one destination (a
    /// commit in flight and a full queue) never takes more than half of it.
    pub fn held_records_max(&self, window_records: usize) -> usize {
        window_records.max(4 * self.queue_records_max(window_records))
    }

    /// The largest `held_records_max` any window can give.
    pub fn held_records_bound(&self) -> usize {
        self.held_records_max(self.window_records_max)
    }

    /// How far past the checkpoint the reader may read under `window_records`.
    pub fn lookahead_records(&self, window_records: usize) -> u64 {
        (self.lookahead_windows * window_records) as u64
    }
}
