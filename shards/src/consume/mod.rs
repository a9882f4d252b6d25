//! The consume path: what each partition has settled and how it reaches the disk.
//!
//! Map:
//! - [`state`]: the durable consumer state of a partition (`consumer.ahead`,
//!   `consumer.offset`), its loader and the per-shard committer that writes it.

pub mod state;
