//! The consume path's state machines (sans-IO): leases handed to consumers, the
//! settled frontier, what may be handed out next, the consumers parked on a
//! shard and the delivery tokens shards leave with owners.
//!
//! Runs on every shard: an in-flight table per partition the shard owns, one
//! [`waiters::Waiters`] and one [`tokens::Tokens`] per shard. Nothing here
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
//! - [`waiters`]: the consumer side of a shard: parked consumers in FIFOs, kicks
//!   and notifications for the pump, and the registrations (delivery tokens) this
//!   shard left with other owners.
//! - [`tokens`]: the owner side of delivery tokens: the tokens other shards left
//!   here and the notifications promised against the available records.
//! - [`state`]: what of it is durable: `consumer.ahead` (anchor and window slots)
//!   and `consumer.offset`, their loader, and the per-shard committer that writes
//!   them every tick and makes them durable once per interval. Unlike the rest of
//!   this folder it does I/O, through `narad_io::Storage`.

pub mod inflight;
pub mod state;
pub mod tokens;
pub mod waiters;
