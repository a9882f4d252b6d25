//! The `narad` binary's library: command-line interface, startup of one executor
//! per core, and the developer subcommands used by the black-box tests.
//!
//! Map:
//! - [`cli`]: the command line.
//! - [`serve`]: `narad serve`: one pinned executor per shard, the data directory
//!   lock, graceful stop on SIGINT/SIGTERM.
//! - [`devtools`]: `narad debug ...`: a WAL writer under load (killed by the crash
//!   tests) and the payload scheme the tests verify.
//!
//! Dependencies point one way: this crate → `narad-shards` → `narad-io`.

pub mod cli;
pub mod devtools;
pub mod serve;
