//! The little state every shard's HTTP server shares with the others and with the
//! main thread: whether the node is ready, whether it is stopping, and how many
//! connections are open.
//!
//! Which cores: one instance per node, behind an `Arc`; every shard reads it and
//! the main thread writes the two flags. This breaks the shared-nothing rule on
//! purpose and only off the per-message path: the flags are read once per request
//! to `/healthz` and `/readyz` and per request while stopping, and the connection
//! counter is touched once when a connection opens and once when it closes, never
//! per message. `http.max_connections` is a per-node limit, so its counter must be
//! shared; splitting it per shard would refuse connections on a busy shard while
//! an idle one had room.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Stripes of the per-identity consume counts: two shards serving two clients
/// rarely touch the same lock.
const IDENTITY_STRIPES: usize = 64;

/// Node-wide HTTP state.
#[derive(Debug)]
pub struct NodeState {
    ready: AtomicBool,
    draining: AtomicBool,
    connections: AtomicUsize,
    connections_max: usize,
    batch_bytes: AtomicU64,
    batch_bytes_max: u64,
    /// Consumes in flight per identity: `http.max_consume_in_flight_per_identity`.
    consumes: Arc<IdentityCap>,
    /// Produces in flight per identity: `http.max_produce_in_flight_per_identity`
    /// (none: no cap).
    produces: Option<Arc<IdentityCap>>,
    /// The data directory's file system is nearly full: produces are refused
    /// (see [`DiskGuard`]).
    disk_low: AtomicBool,
    /// The data directory's free bytes as last measured (`u64::MAX` before the
    /// first measure): the WALs zero-fill a segment only with room for it.
    disk_room: Arc<AtomicU64>,
    /// A shard's ingress WAL latched after a disk failure: that shard refuses
    /// every produce until the node restarts, so the node is not ready.
    wal_failed: AtomicBool,
    /// Shards whose ingress WAL has waited longer than [`WAL_STALL_AFTER`]
    /// for the disk: they refuse produces (503) and the node is not ready,
    /// until the disk answers.
    wal_stalled_shards: AtomicUsize,
    /// Shards whose consumer offsets failed their last write or sync: acks
    /// are answered but would be redelivered after a crash (`degraded`).
    consumer_state_failing_shards: AtomicUsize,
    /// Shards whose ingress WAL cannot make its dispatch checkpoint durable:
    /// a restart would commit again more and more, and the WAL does not
    /// compact (`degraded`).
    checkpoint_failing_shards: AtomicUsize,
}

/// How long records may wait for the disk to make them durable, with none
/// made so, before their WAL counts as stalled: far beyond any write or sync a
/// working disk takes (a 16 MiB write run on a slow one takes a fraction of a
/// second), so only a disk that stopped answering gets there.
pub const WAL_STALL_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// Counts a shard into (`on`) or out of a node-wide count of shards in some
/// state; each shard calls it only when its own flag changes.
fn count_shard(shards: &AtomicUsize, on: bool) {
    if on {
        shards.fetch_add(1, Ordering::Relaxed);
    } else {
        shards.fetch_sub(1, Ordering::Relaxed);
    }
}

/// When the data directory's free space runs low, produces are answered 503
/// instead of being staged: a WAL that runs out of space latches and refuses
/// everything until the process restarts, while a refused produce is retried
/// and the node takes records again by itself once space is freed (retention,
/// dispatch catching up, an operator). Consumes, acks and retention go on.
///
/// The floor is [`DISK_FLOOR_BYTES`] (room for a few WAL segments of every
/// shard and the partition logs' next chunks), or a tenth of a file system too
/// small for that to make sense, but never below [`WAL_ROOM_BYTES`], under
/// which a WAL refuses to grow a segment anyway; produces resume once the free
/// space is half as much again above it, so the state does not flap.
pub struct DiskGuard;

/// The least free space produces are accepted with, on a file system of 5 GiB
/// or more.
pub const DISK_FLOOR_BYTES: u64 = 512 << 20;

/// The room an ingress WAL wants before it starts a segment that grows: the
/// segment and one to spare (see `narad_shards::wal::WalConfig::disk_room`).
pub const WAL_ROOM_BYTES: u64 = 2 * narad_shards::wal::SEGMENT_BYTES;

impl DiskGuard {
    /// The free bytes below which produces are refused, on a file system of
    /// `total` bytes.
    pub fn floor(total: u64) -> u64 {
        DISK_FLOOR_BYTES.min(total / 10).max(WAL_ROOM_BYTES)
    }

    /// Whether produces should be refused, given the free and total bytes and
    /// whether they are refused now.
    pub fn low(available: u64, total: u64, refusing: bool) -> bool {
        let floor = DiskGuard::floor(total);
        let resume_at = floor + floor / 2;
        if refusing {
            available < resume_at
        } else {
            available < floor
        }
    }
}

/// Requests in flight per identity (the client IP while security is off),
/// counted per node: the caps are per node, so the counts are shared between
/// shards. Touched once when a request starts and once when it ends, never per
/// message.
#[derive(Debug)]
pub struct IdentityCap {
    counts: [Mutex<HashMap<IpAddr, u64>>; IDENTITY_STRIPES],
    max: u64,
}

impl IdentityCap {
    pub fn new(max: u64) -> Arc<Self> {
        Arc::new(IdentityCap {
            counts: std::array::from_fn(|_| Mutex::new(HashMap::new())),
            max: max.max(1),
        })
    }

    fn counts(&self, identity: &IpAddr) -> std::sync::MutexGuard<'_, HashMap<IpAddr, u64>> {
        self.counts[stripe_of(identity)]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a request of `weight` against `identity`'s share, or `None` when
    /// that would pass the cap (429). One request is let through whatever its
    /// weight when the identity has none in flight.
    pub fn try_begin(self: &Arc<Self>, identity: IpAddr, weight: u64) -> Option<IdentityPermit> {
        let mut counts = self.counts(&identity);
        let held = counts.entry(identity).or_insert(0);
        if *held > 0 && held.saturating_add(weight) > self.max {
            return None;
        }
        *held += weight;
        Some(IdentityPermit {
            cap: self.clone(),
            identity,
            weight,
        })
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.counts
            .iter()
            .all(|m| m.lock().unwrap_or_else(|e| e.into_inner()).is_empty())
    }
}

impl NodeState {
    pub fn new(connections_max: usize) -> Self {
        assert!(connections_max > 0);
        NodeState {
            ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            connections_max,
            batch_bytes: AtomicU64::new(0),
            batch_bytes_max: u64::MAX,
            consumes: IdentityCap::new(u64::MAX),
            produces: None,
            disk_low: AtomicBool::new(false),
            disk_room: Arc::new(AtomicU64::new(u64::MAX)),
            wal_failed: AtomicBool::new(false),
            wal_stalled_shards: AtomicUsize::new(0),
            consumer_state_failing_shards: AtomicUsize::new(0),
            checkpoint_failing_shards: AtomicUsize::new(0),
        }
    }

    /// Updates shard `shard`'s flag (`flag`, the shard's own) for a WAL
    /// checkpoint that cannot be made durable, counting the change node-wide.
    pub fn note_checkpoint_failing(&self, flag: &std::cell::Cell<bool>, failing: bool) {
        if failing == flag.replace(failing) {
            return;
        }
        count_shard(&self.checkpoint_failing_shards, failing);
    }

    /// Whether some shard's WAL checkpoint cannot be made durable now.
    pub fn checkpoint_failing(&self) -> bool {
        self.checkpoint_failing_shards.load(Ordering::Relaxed) > 0
    }

    /// Updates shard `shard`'s stall flag (`flag`, the shard's own) from how
    /// long its WAL's records have waited for the disk (`waited`, from
    /// `Wal::stalled_for`), counting the change node-wide and logging it;
    /// returns whether the shard is stalled now.
    pub fn note_wal_wait(
        &self,
        shard: usize,
        flag: &std::cell::Cell<bool>,
        waited: Option<std::time::Duration>,
        latched: bool,
    ) -> bool {
        if latched {
            // A stalled write that ended in an error: the latch speaks now
            // (it may be seen here before any produce or poll sees it).
            self.note_wal_failed();
        }
        let stalled = waited.is_some_and(|w| w >= WAL_STALL_AFTER);
        ::metrics::gauge!("narad_ingress_wal_stalled").set(if stalled { 1.0 } else { 0.0 });
        if stalled == flag.get() {
            return stalled;
        }
        flag.set(stalled);
        count_shard(&self.wal_stalled_shards, stalled);
        if latched {
            tracing::error!(
                shard,
                "the ingress WAL's stalled write failed: the WAL latched"
            );
        } else if stalled {
            tracing::error!(
                shard,
                waited = ?waited.unwrap_or_default(),
                "an ingress WAL has waited this long for the disk to complete a write: its shard refuses produces (503) and /readyz answers 503 until the disk answers"
            );
        } else {
            tracing::info!(
                shard,
                "the ingress WAL's disk answered again: produces are accepted"
            );
        }
        stalled
    }

    /// Whether some shard's ingress WAL is stalled now.
    pub fn wal_stalled(&self) -> bool {
        self.wal_stalled_shards.load(Ordering::Relaxed) > 0
    }

    /// A shard's consumer offsets started failing to persist (`true`), or
    /// persisted again.
    pub fn note_consumer_state_failing(&self, failing: bool) {
        count_shard(&self.consumer_state_failing_shards, failing);
    }

    /// Whether some shard's consumer offsets are failing to persist now.
    pub fn consumer_state_failing(&self) -> bool {
        self.consumer_state_failing_shards.load(Ordering::Relaxed) > 0
    }

    /// A produce found its shard's ingress WAL latched.
    pub fn note_wal_failed(&self) {
        if !self.wal_failed.swap(true, Ordering::Relaxed) {
            tracing::error!("an ingress WAL failed and refuses produces until the node restarts: /readyz answers 503");
        }
    }

    /// Whether a shard's ingress WAL has latched since the start.
    pub fn wal_failed(&self) -> bool {
        self.wal_failed.load(Ordering::Relaxed)
    }

    /// The data directory's free bytes as last measured, shared with the WALs
    /// (`WalConfig::disk_room`).
    pub fn disk_room(&self) -> Arc<AtomicU64> {
        self.disk_room.clone()
    }

    /// Whether produces are refused for want of disk (see [`DiskGuard`]).
    pub fn disk_low(&self) -> bool {
        self.disk_low.load(Ordering::Relaxed)
    }

    /// Records the data directory's free and total bytes; returns whether
    /// produces are refused from now on, logging each change.
    pub fn note_disk(&self, available: u64, total: u64) -> bool {
        self.disk_room.store(available, Ordering::Relaxed);
        let was = self.disk_low();
        let low = DiskGuard::low(available, total, was);
        if low != was {
            self.disk_low.store(low, Ordering::Relaxed);
            if low {
                tracing::error!(available, total, floor = DiskGuard::floor(total), "the data directory's disk is full or nearly full: produces are refused (503) until space is freed (more than `floor` bytes free, and half as much again)");
            } else {
                tracing::info!(
                    available,
                    total,
                    "the data directory's disk has room again: produces are accepted"
                );
            }
        }
        low
    }

    /// Sets `http.max_consume_in_flight_per_identity`.
    pub fn with_consumes_max(mut self, consumes: u64) -> Self {
        self.consumes = IdentityCap::new(consumes);
        self
    }

    /// Sets `http.max_produce_in_flight_per_identity`; 0 is no cap.
    pub fn with_produces_max(mut self, produces: u64) -> Self {
        self.produces = (produces > 0).then(|| IdentityCap::new(produces));
        self
    }

    /// Counts a consume of `weight` (its `max`; a held long-poll counts too), or
    /// `None` past `http.max_consume_in_flight_per_identity`.
    pub fn try_begin_consume(&self, identity: IpAddr, weight: u64) -> Option<IdentityPermit> {
        self.consumes.try_begin(identity, weight)
    }

    /// Counts a produce (a batch counts its records), or `None` past
    /// `http.max_produce_in_flight_per_identity`. `Some(None)`: no cap.
    pub fn try_begin_produce(
        &self,
        identity: IpAddr,
        weight: u64,
    ) -> Option<Option<IdentityPermit>> {
        match &self.produces {
            None => Some(None),
            Some(cap) => cap.try_begin(identity, weight).map(Some),
        }
    }

    /// Sets `http.max_batch_body_bytes_in_flight`.
    pub fn with_batch_bytes_max(mut self, bytes: u64) -> Self {
        self.batch_bytes_max = bytes.max(1);
        self
    }

    /// Reserves `bytes` of the node's batch body budget (touched once per batch
    /// request, not per message), or `None` when it is full. A single body larger
    /// than the whole budget is let through when nothing else is in flight, so a
    /// small budget never refuses every batch.
    pub fn try_reserve_batch_bytes(self: &Arc<Self>, bytes: u64) -> Option<BatchPermit> {
        let max = self.batch_bytes_max;
        self.batch_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held == 0 || held.saturating_add(bytes) <= max).then_some(held + bytes)
            })
            .ok()?;
        Some(BatchPermit {
            node: self.clone(),
            bytes,
        })
    }

    /// Whether `bytes` more would fit the batch body budget now (see
    /// [`NodeState::try_reserve_batch_bytes`]), without holding them.
    pub fn batch_bytes_would_fit(&self, bytes: u64) -> bool {
        let held = self.batch_bytes.load(Ordering::Acquire);
        held == 0 || held.saturating_add(bytes) <= self.batch_bytes_max
    }

    /// Every shard has recovered its storage: `/readyz` answers 200 from now on.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.has_recovered() && !self.is_draining()
    }

    /// Every shard has recovered its storage (whether or not the node stops
    /// since). Until then a shard that recovered early must not serve: its
    /// requests would wait on peers still recovering, for as long as that takes.
    pub fn has_recovered(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The node is stopping: every request is answered 503 from now on.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Takes one of the node's connection slots, or `None` when all are taken. The
    /// slot is given back when the permit drops.
    pub fn try_open_connection(self: &Arc<Self>) -> Option<ConnectionPermit> {
        let max = self.connections_max;
        self.connections
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < max).then_some(open + 1)
            })
            .ok()?;
        Some(ConnectionPermit { node: self.clone() })
    }

    pub fn open_connections(&self) -> usize {
        self.connections.load(Ordering::Acquire)
    }
}

/// One open connection's slot in [`NodeState`]'s count.
#[derive(Debug)]
pub struct ConnectionPermit {
    node: Arc<NodeState>,
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        let before = self.node.connections.fetch_sub(1, Ordering::AcqRel);
        assert!(before > 0, "connection count went below zero");
    }
}

/// A batch body's share of the node's budget, given back on drop.
#[derive(Debug)]
pub struct BatchPermit {
    node: Arc<NodeState>,
    bytes: u64,
}

impl BatchPermit {
    /// The bytes this permit holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Holds `more` bytes besides, or false when the budget cannot take them.
    /// A request that is alone in the budget may always grow (as
    /// [`NodeState::try_reserve_batch_bytes`] lets a lone body in).
    pub fn try_grow(&mut self, more: u64) -> bool {
        let (own, max) = (self.bytes, self.node.batch_bytes_max);
        let grown =
            self.node
                .batch_bytes
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                    (held == own || held.saturating_add(more) <= max).then_some(held + more)
                });
        if grown.is_ok() {
            self.bytes += more;
        }
        grown.is_ok()
    }

    /// Holds exactly `bytes`: growing (see [`BatchPermit::try_grow`]) or
    /// giving back what is no longer held.
    pub fn try_resize(&mut self, bytes: u64) -> bool {
        match bytes.checked_sub(self.bytes) {
            Some(more) => more == 0 || self.try_grow(more),
            None => {
                let less = self.bytes - bytes;
                self.node.batch_bytes.fetch_sub(less, Ordering::AcqRel);
                self.bytes = bytes;
                true
            }
        }
    }
}

impl Drop for BatchPermit {
    fn drop(&mut self) {
        self.node
            .batch_bytes
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

fn stripe_of(identity: &IpAddr) -> usize {
    let bytes = match identity {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    };
    crate::partition::fnv1a32(&bytes) as usize % IDENTITY_STRIPES
}

/// A request's share of its identity's cap, given back on drop.
#[derive(Debug)]
pub struct IdentityPermit {
    cap: Arc<IdentityCap>,
    identity: IpAddr,
    weight: u64,
}

impl Drop for IdentityPermit {
    fn drop(&mut self) {
        let mut counts = self.cap.counts(&self.identity);
        let held = counts
            .get_mut(&self.identity)
            .expect("a permit's identity is counted");
        assert!(*held >= self.weight, "in-flight count went below zero");
        *held -= self.weight;
        if *held == 0 {
            counts.remove(&self.identity);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn produces_stop_below_the_disk_floor_and_resume_half_as_much_again_above() {
        let node = NodeState::new(8);
        let floor = DISK_FLOOR_BYTES;
        // A small file system keeps a tenth free instead, but never less than
        // a WAL wants to grow a segment.
        assert!(!NodeState::new(8).note_disk(300 << 20, 2 << 30));
        assert!(NodeState::new(8).note_disk(200 << 20, 2 << 30));
        assert!(!NodeState::new(8).note_disk(WAL_ROOM_BYTES, 1 << 30));
        assert!(NodeState::new(8).note_disk(WAL_ROOM_BYTES - 1, 1 << 30));
        assert!(!node.note_disk(floor, 100 * floor));
        assert!(node.note_disk(floor - 1, 100 * floor));
        assert!(node.disk_low());
        // Freed a little: still refused, so the state does not flap.
        assert!(node.note_disk(floor + floor / 4, 100 * floor));
        assert!(!node.note_disk(floor + floor / 2, 100 * floor));
        assert!(!node.disk_low());
    }

    #[test]
    fn consumes_are_capped_per_identity_and_returned() {
        let node = Arc::new(NodeState::new(1).with_consumes_max(10));
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "::1".parse().unwrap());
        let first = node.try_begin_consume(a, 6).unwrap();
        assert!(node.try_begin_consume(a, 5).is_none());
        let second = node.try_begin_consume(a, 4).unwrap();
        assert!(node.try_begin_consume(a, 1).is_none());
        // Another identity has its own share; a lone oversized consume passes.
        let big = node.try_begin_consume(b, 50).unwrap();
        drop((first, second, big));
        assert!(node.consumes.is_empty());
        assert!(node.try_begin_consume(a, 10).is_some());
        // Produces are not capped unless asked; then they count apart.
        assert!(matches!(node.try_begin_produce(a, 1_000_000), Some(None)));
        let capped = Arc::new(NodeState::new(1).with_produces_max(2));
        let held = capped.try_begin_produce(a, 2).unwrap();
        assert!(capped.try_begin_produce(a, 1).is_none());
        assert!(capped.try_begin_consume(a, 1).is_some());
        drop(held);
        assert!(capped.try_begin_produce(a, 1).unwrap().is_some());
    }

    #[test]
    fn connection_slots_are_bounded_and_returned() {
        let node = Arc::new(NodeState::new(2));
        let a = node.try_open_connection().unwrap();
        let _b = node.try_open_connection().unwrap();
        assert!(node.try_open_connection().is_none());
        assert_eq!(node.open_connections(), 2);
        drop(a);
        assert_eq!(node.open_connections(), 1);
        assert!(node.try_open_connection().is_some());
    }

    #[test]
    fn a_batch_permit_grows_within_the_budget_or_alone_and_gives_back_what_it_sheds() {
        let node = Arc::new(NodeState::new(1).with_batch_bytes_max(100));
        let mut a = node.try_reserve_batch_bytes(0).unwrap();
        // Alone, it may grow past the budget.
        assert!(a.try_grow(150));
        assert!(node.try_reserve_batch_bytes(0).is_none(), "over full");
        assert!(a.try_resize(60));
        let mut b = node.try_reserve_batch_bytes(0).unwrap();
        assert!(b.try_grow(40) && !b.try_grow(1));
        // Not alone, a permit grows only within the budget.
        assert!(!a.try_resize(61));
        assert_eq!((a.bytes(), b.bytes()), (60, 40));
        drop(b);
        assert!(a.try_resize(500));
        drop(a);
        assert_eq!(node.batch_bytes.load(Ordering::Acquire), 0);
    }

    #[test]
    fn batch_budget_is_bounded_and_returned() {
        let node = Arc::new(NodeState::new(1).with_batch_bytes_max(100));
        let a = node.try_reserve_batch_bytes(60).unwrap();
        assert!(node.try_reserve_batch_bytes(50).is_none());
        let b = node.try_reserve_batch_bytes(40).unwrap();
        drop(a);
        drop(b);
        // Alone, a body larger than the budget passes.
        assert!(node.try_reserve_batch_bytes(500).is_some());
    }

    #[test]
    fn ready_only_until_draining() {
        let node = NodeState::new(1);
        assert!(!node.is_ready());
        node.set_ready();
        assert!(node.is_ready());
        node.start_draining();
        assert!(!node.is_ready() && node.is_draining());
    }
}
