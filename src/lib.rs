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
//! - [`devtools`]: `narad debug ...`: a WAL writer under load (killed by the crash
//!   tests) and the payload scheme the tests verify.
//!
//! Dependencies point one way: this crate → `narad-shards` → `narad-io`.

pub mod cli;
pub mod config;
pub mod devtools;
pub mod http;
pub mod serve;
