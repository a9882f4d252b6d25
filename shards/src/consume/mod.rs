//! The consume path's per-partition state machines (sans-IO): leases handed to
//! consumers, the settled frontier, and what may be handed out next.
//!
//! Runs on every shard, one instance per partition the shard owns. Nothing here
//! reads a clock, draws a random number or touches a file: the owner passes in the
//! time (`now_ms`, milliseconds of a monotonic clock), the nonces (from its
//! per-shard ChaCha8 stream) and the partition's high watermark, so a seeded
//! simulation drives these cores through crashes in milliseconds.
//!
//! The top invariant is the delivery contract: every record below the high
//! watermark is eventually settled (acked, skipped as corrupt, or aged out by
//! retention), and until then it is leased to at most one consumer at a time.
//!
//! Map:
//! - [`inflight`]: the in-flight table: leases with nonces and expiries, the
//!   frontier and the acked-ahead set.
//! - [`state`]: what of it is durable: `consumer.ahead` (anchor and window slots)
//!   and `consumer.offset`, their loader, and the per-shard committer that writes
//!   them every tick and makes them durable once per interval. Unlike the rest of
//!   this folder it does I/O, through `narad_io::Storage`.

pub mod inflight;
pub mod state;
