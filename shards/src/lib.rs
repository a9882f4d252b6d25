//! Narad's per-core broker logic.
//!
//! Every type in this crate lives on one shard (one core) and is `!Send`; shards
//! talk to each other only through messages. Durable structures are generic over
//! [`narad_io::Storage`], so the same code runs on O_DIRECT files in production and
//! on the fault-injecting disk in crash tests.
//!
//! Map:
//! - [`ids`]: typed identifiers and positions (`Seq`, `Offset`, `IncarnationId`).
//! - [`wal`]: the ingress WAL, one per shard: group commit, segments, checkpoint,
//!   compaction, recovery, the failure latch.
//! - [`dispatch`]: the produce dispatcher's state machine (sans-IO): which WAL
//!   records go to which partition commit, and the checkpoint.
//! - [`produce`]: the dispatch task and the commit combiner: from a durable WAL
//!   record to a verified, visible partition record.
//! - [`mask`]: the XOR masks that keep client bytes off the disks as sent.
//! - [`testkit`]: self-checking payloads for crash tests.
//! - [`lines`]: one log line a period for events that come by the thousand.
//! - [`log`]: the partition log: CRC-framed batches, commit durable (append,
//!   fdatasync, read back, verify, advance the high watermark), recovery, index,
//!   roll, retention and the recent-frame cache.
//! - [`consume`]: the consume path's cores (sans-IO): the in-flight table of
//!   leases, the settled frontier and the acked-ahead set; the waiter FIFOs and
//!   registrations of a shard; the delivery tokens an owner holds.

#[cfg(all(
    not(debug_assertions),
    any(
        feature = "broken-ack-before-fsync",
        feature = "broken-ack-state-no-anchor",
        feature = "broken-checkpoint-past-uncommitted",
        feature = "broken-dispatched-skipped-as-done",
        feature = "broken-growing-dsync",
        feature = "broken-log-trust-stale-hint",
        feature = "broken-log-unmasked",
        feature = "broken-no-readback",
        feature = "broken-no-torn-truncation"
    )
))]
compile_error!(
    "the broken-* features exist only to show that tests fail; never build them in release"
);

pub mod consume;
pub mod dispatch;
pub mod ids;
pub mod lines;
pub mod log;
pub mod mask;
pub mod produce;
pub mod testkit;
pub mod wal;
