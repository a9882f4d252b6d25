//! Durable consumer state: what each partition has settled, on disk.
//!
//! A partition directory holds two files:
//! - `consumer.ahead`: two 4 KiB slots, each a checksummed record of the frontier
//!   and the offsets acked above it ([`slot`] has the format). The [`Committer`]
//!   gives the slots roles: the *anchor* holds the newest record known to be
//!   durable and is never written while it is the anchor; each tick rewrites the
//!   other slot, the *window*, in the page cache, and a successful `fdatasync`
//!   flips the roles. A power loss can tear only the window, and then recovery
//!   reads the anchor.
//! - `consumer.offset`: the frontier as a u64, little-endian, in the first 8 bytes
//!   of one block: the file older releases and operators read. It is brought level
//!   with the durable frontier at most every 30 s and at close, so it trails.
//!
//! [`load`] therefore takes the larger frontier of the two files, and the
//! acked-ahead set from the newest valid slot, above that frontier. Every record
//! holds only values a caller gave, so no crash of the process or the machine
//! recovers a frontier past an ack.
//!
//! Cores: every shard runs its own committer for the partitions it owns; `load`
//! runs on whichever shard first touches a partition. Nothing here is `Send`.
//!
//! Map:
//! - `slot`: the record encoding (pure).
//! - `committer`: the per-shard committer (tick, writeout, levelling, priming,
//!   descriptor cap).
//! - `offset`: the `consumer.offset` file: its reading and its levelling.

mod committer;
mod offset;
mod slot;

use std::io;

use narad_io::file::{join, OpenMode};
use narad_io::{BlockFile, Storage};

use crate::ids::Offset;

pub use committer::{
    Committer, CommitterConfig, PartitionKey, TickReport, DURABILITY_INTERVAL_DEFAULT,
    DURABILITY_INTERVAL_MAX, DURABILITY_INTERVAL_MIN, LEVEL_ERROR_PREFIX, LEVEL_EVERY_DEFAULT,
    OPEN_FILES_MAX_DEFAULT, SYNCS_AT_ONCE, TICK_DEFAULT,
};
pub use offset::read_offset_file;
pub use slot::{decode, encode, fitted, newest, SlotRecord, PAYLOAD_BYTES_MAX, SLOTS, SLOT_BYTES};

/// File name of the two-slot acked-ahead file inside a partition directory.
pub const AHEAD_FILE: &str = "consumer.ahead";
/// File name of the 8-byte frontier file inside a partition directory.
pub const OFFSET_FILE: &str = "consumer.offset";
/// Size the committer gives `consumer.ahead`: both slots.
pub const AHEAD_FILE_BYTES: u64 = (SLOTS * SLOT_BYTES) as u64;

/// What is settled in one partition: everything below `frontier`, plus `ahead`
/// (strictly ascending, every one above `frontier`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AckedState {
    /// The lowest unsettled offset: every offset below it is settled.
    pub frontier: Offset,
    /// Offsets acked out of order above the frontier, ascending.
    pub ahead: Vec<Offset>,
}

/// Reads a partition's persisted consumer state: the larger frontier of the two
/// files, and the acked-ahead set of the newest valid `consumer.ahead` slot above
/// it. Missing files read as frontier 0 and an empty set. Creates nothing.
pub async fn load<S: Storage>(storage: &S, partition_dir: &str) -> io::Result<AckedState> {
    let offset_frontier = read_offset_file(storage, partition_dir).await?;
    let image = read_ahead_image(storage, partition_dir).await?;
    let record = image.as_deref().and_then(newest).map(|(_, record)| record);
    let mut state = record.map(|r| r.state).unwrap_or_default();
    if let Some(frontier) = offset_frontier {
        if frontier > state.frontier {
            state.frontier = frontier;
            state.ahead.retain(|offset| *offset >= frontier);
        }
    }
    // An acked offset at the frontier (the slot was older than
    // `consumer.offset`) moves it on, with the ones acked right after it.
    let run = state
        .ahead
        .iter()
        .zip(state.frontier.0..)
        .take_while(|(offset, expected)| offset.0 == *expected)
        .count();
    if run > 0 {
        state.frontier = Offset(state.frontier.0 + run as u64);
        state.ahead.drain(..run);
    }
    debug_assert!(state.ahead.iter().all(|offset| *offset > state.frontier));
    Ok(state)
}

/// Both slots of `consumer.ahead`, `None` when the file is missing.
async fn read_ahead_image<S: Storage>(storage: &S, dir: &str) -> io::Result<Option<Vec<u8>>> {
    let Some(file) = open_existing(storage, &join(dir, AHEAD_FILE)).await? else {
        return Ok(None);
    };
    let mut image = vec![0u8; AHEAD_FILE_BYTES as usize];
    let read = file.read_at(0, &mut image).await;
    let _ = file.close().await;
    read?;
    Ok(Some(image))
}

/// Opens an existing file; `None` when it (or its directory) is missing.
async fn open_existing<S: Storage>(storage: &S, path: &str) -> io::Result<Option<S::File>> {
    match storage.open(path, OpenMode::Existing).await {
        Ok(file) => Ok(Some(file)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}
