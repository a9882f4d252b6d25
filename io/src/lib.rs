//! Narad's I/O layer: the only crate that touches the kernel, glommio, clocks and
//! randomness.
//!
//! Everything durable in Narad (the ingress WAL, the partition logs) is written
//! through the narrow interface in [`file`]: block-aligned positional writes and
//! reads, `fdatasync`, and directory operations that are durable when they return.
//! Two implementations exist and the storage code is generic over them:
//!
//! - [`dma`]: O_DIRECT files on io_uring through glommio's `DmaFile`. Reads really
//!   read the device, so a read-back after `fdatasync` checks what the disk holds.
//! - [`sim`]: an in-memory disk with an honest crash model (unsynced writes survive a
//!   crash as any subset of 512-byte sectors), injected `EIO` on `fdatasync`, `ENOSPC`
//!   on writes and bit flips on reads, all drawn from a seed.
//!
//! [`append`] builds the append-only file every log uses on top of either: it keeps
//! the unaligned tail block in memory and rewrites it with the next write, so
//! callers append byte strings of any length while the device only ever sees
//! aligned blocks. [`rt`] wraps the runtime: executors, timers, task spawning.
//! [`mesh`] lays out the bounded lock-free channels between shards.
//!
//! Concurrency rule: every type here is `!Send` and lives on the core (shard) that
//! created it (the mesh's channel ends move to their shard once, at startup).
//! Nothing in this crate takes a lock.

#[cfg(all(not(debug_assertions), feature = "broken-growing-dsync"))]
compile_error!(
    "the broken-* features exist only to show that tests fail; never build them in release"
);

pub mod append;
pub mod dma;
pub mod file;
pub mod mesh;
pub mod net;
pub mod readiness;
pub mod rt;
pub mod sim;

pub use append::{AppendFile, AppendSource};
pub use file::{BlockFile, Storage, BLOCK_BYTES, SECTOR_BYTES};

/// Whether `e` is a refusal for want of room: a full file system (`ENOSPC`) or
/// a used-up disk quota (`EDQUOT`). Both are refused when the blocks are
/// allocated, before any byte of the write is issued, and both clear once room
/// is made, so callers treat them alike wherever this crate's docs speak of
/// [`io::ErrorKind::StorageFull`].
pub fn out_of_space(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

/// Rounds `value` up to a multiple of [`BLOCK_BYTES`].
pub const fn align_up(value: u64) -> u64 {
    value.div_ceil(BLOCK_BYTES as u64) * BLOCK_BYTES as u64
}

/// Rounds `value` down to a multiple of [`BLOCK_BYTES`].
pub const fn align_down(value: u64) -> u64 {
    value / BLOCK_BYTES as u64 * BLOCK_BYTES as u64
}

/// Whether `value` is a multiple of [`BLOCK_BYTES`].
pub const fn is_aligned(value: u64) -> bool {
    value % BLOCK_BYTES as u64 == 0
}
