//! The `narad` binary's library: command-line interface, configuration, startup of
//! one executor per core, the HTTP API, and the developer subcommands used by the
//! black-box tests.
//!
//! Map:
//! - [`cli`]: the command line.
//! - [`config`]: the node's configuration, layered from defaults, a JSON file,
//!   `NARAD_*` environment variables and flags.
//! - [`serve`]: `narad serve`: one pinned executor per shard, the data directory
//!   lock, graceful stop on SIGINT/SIGTERM.
//! - [`http`]: the HTTP API server every shard runs.
//! - [`meta`]: topic metadata: the state machine of topics, the parsing of topic
//!   requests, and the durable local command log with snapshots.
//! - [`metrics`]: Prometheus metrics recorded per shard and summed at scrape.
//! - [`partition`]: choosing a message's partition at accept time (key hash,
//!   per-topic round-robin for keyless messages).
//! - [`control`]: the control plane: the metadata store's thread and the snapshot
//!   every shard reads.
//! - [`broker`]: the broker on one shard: owned partitions and the commit
//!   combiner, the dispatcher task, the mesh ops between shards.
//! - [`consume`]: queue consumption: leases, parked consumers and the pump,
//!   delivery tokens between shards, acks.
//! - [`devtools`]: `narad debug ...`: a WAL writer under load (killed by the crash
//!   tests) and the payload scheme the tests verify.
//!
//! Dependencies point one way: this crate → `narad-shards` → `narad-io`.

pub mod broker;
pub mod cli;
pub mod config;
pub mod consume;
pub mod control;
pub mod devtools;
pub mod http;
pub mod json;
pub mod lifecycle;
pub mod meta;
pub mod metrics;
pub mod partition;
pub mod serve;
