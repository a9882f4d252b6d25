//! Queue consumption: leases, parked consumers, delivery across shards, acks.
//!
//! A consume is served from the accepting shard's own partitions first (0 hops),
//! then by a non-blocking probe of every other shard that owns partitions of the
//! topic, and only then does it spend its wait: parked on this shard's waiter FIFO
//! and on delivery tokens left with the other owners. Records are leased by the
//! owner of their partition (reservation before read, `narad_shards::consume`'s
//! in-flight table); the receipt handle `partition:offset:nonce` names the lease,
//! and acks, extends and nacks go to that owner.
//!
//! Which cores: every shard runs one [`queues::Queues`] (the partitions it owns) and
//! one [`waiters::Waiters`] with its pump (the consumers parked on it). They talk to
//! other shards only through mesh ops.
//!
//! Map:
//! - [`queues`]: the owner side: in-flight tables, reserve then read, settling
//!   handles, tokens left by other shards.
//! - [`waiters`]: the consumer side: waiter FIFOs, the pump, registrations.
//! - [`acks`]: acks for other shards' partitions, coalesced per owner only when
//!   its in-flight window is full.
//! - [`flow`]: the tasks and request flows: consume routing (local, probe, park),
//!   the pump, claims after a notification, the registration keeper, settling.
//! - [`handle`]: receipt handles.
//! - [`inbound`]: the receiving end of a delivery, which gives records back when
//!   its request is cancelled before it read them.
//! - [`persist`]: the ack persister task feeding the shard's consumer-offset
//!   committer (`consumer.ahead`, `consumer.offset`).

pub mod acks;
pub mod flow;
pub mod handle;
pub mod inbound;
pub mod persist;
pub mod queues;
pub mod waiters;

use std::sync::OnceLock;
use std::time::Instant;

use narad_shards::ids::PartitionId;
use narad_shards::log::Record;

/// Keys and payloads one consume takes at most (the first record always goes).
pub const TAKE_BYTES_MAX: usize = 4 << 20;

/// Records one batch consume asks for at most.
pub const BATCH_RECORDS_MAX: usize = 100;

/// One leased record on its way to a consumer.
#[derive(Clone, Debug)]
pub struct Delivered {
    pub partition: PartitionId,
    pub nonce: u64,
    pub record: Record,
}

impl Delivered {
    /// What the record counts against a take's byte budget.
    pub fn weight_bytes(&self) -> usize {
        self.record.payload.len() + self.record.key.as_ref().map_or(0, |k| k.len())
    }

    /// The receipt handle of this lease.
    pub fn receipt_handle(&self) -> String {
        handle::format(self.partition, self.record.offset, self.nonce)
    }

    /// [`Delivered::receipt_handle`] written over `out`'s text: a batch reply
    /// reuses one string for all of its handles.
    pub fn receipt_handle_into(&self, out: &mut String) {
        out.clear();
        handle::write(out, self.partition, self.record.offset, self.nonce);
    }
}

/// What a receipt handle asks of its lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    Ack,
    Extend,
    Nack,
}

/// Why a consume could not be served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConsumeError {
    /// The topic incarnation is gone.
    NotFound,
    /// The partition could not be read.
    Failed(String),
    /// The partition's owner shard is stopping or gone (503: retry).
    Unavailable(String),
    /// The partition's owner shard did not answer in time (502: retry).
    NoAnswer(String),
}

/// Why an ack, extend or nack was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SettleError {
    /// No live lease with that nonce: settled, lapsed, or leased again (410).
    Stale,
    /// The topic incarnation is gone (404).
    NotFound,
    /// The owner shard could not answer (503).
    Unavailable(String),
    /// The owner shard did not answer within the forward's budget (502): the
    /// settle may still land, and a retry of an ack that did answers 410.
    NoAnswer,
}

/// Milliseconds of this process's monotonic clock: lease expiries live on it.
pub fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    // Starts at 1 s so that "expired at 0" never looks live.
    epoch.elapsed().as_millis() as u64 + 1000
}
