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

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Node-wide HTTP state.
#[derive(Debug)]
pub struct NodeState {
    ready: AtomicBool,
    draining: AtomicBool,
    connections: AtomicUsize,
    connections_max: usize,
    batch_bytes: AtomicU64,
    batch_bytes_max: u64,
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

    /// Every shard has recovered its storage: `/readyz` answers 200 from now on.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.is_draining()
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

impl Drop for BatchPermit {
    fn drop(&mut self) {
        self.node
            .batch_bytes
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
