//! What the WAL asks of its file system before it writes where nothing was
//! prepared.
//!
//! A segment made because none was prepared (zero-filled or recycled) grows
//! the file with every write, and a write that runs out of space latches the
//! WAL until the node restarts. So, by the free space the broker last measured
//! ([`super::WalConfig::disk_room`], shared by every shard's WAL):
//!
//! - a segment is zero-filled only with room for it and one more;
//! - an append is staged only with room for what it grows, plus a segment to
//!   spare: the rest of the active segment if that grows, and each new
//!   segment the one prepared segment does not serve (rolls staged earlier
//!   claim it first). Otherwise it is refused ([`super::WalError::NoRoom`]),
//!   nothing staged;
//! - what is granted is taken off the shared measure at once, so the other
//!   shards count it, until the next measure replaces the figure.
//!
//! The measure is up to a second old, and another process can fill the disk
//! meanwhile. So before its first write a segment that grows has its blocks
//! up to a full segment reserved ([`reserve_growing`]), out of the room its
//! first appends were admitted for: writes to it then cannot run out of
//! space, and later appends to it ask for no room. (A segment never written,
//! such as the one an idle WAL rotates onto, holds nothing.) Where the
//! reservation fails (no room left, or a file system that does not allocate
//! for it), the segment grows as before, under the measure alone.
//!
//! Unmeasured (`disk_room` unset: benchmarks, simulations), nothing is held.

use super::frame::IngressRecord;
use super::{Shared, WalConfig, WalError};

/// What an append asks of the file system: room for `demand` bytes (plus a
/// segment to spare), of which it takes `claim` off the measure.
struct RoomPlan {
    demand: u64,
    claim: u64,
}

impl Shared {
    /// Checks that the file system has room for what appending `records`
    /// (`total_bytes` of frames) grows, and takes it off the measure, before
    /// any of it is staged. An early roll (compaction's, or off a growing
    /// segment) is dropped rather than refuse the append. Refused, nothing
    /// changes.
    pub(super) fn admit(
        &mut self,
        config: &WalConfig,
        records: &[IngressRecord<'_>],
        total_bytes: u64,
    ) -> Result<(), WalError> {
        let plan = self.room_plan(config, records, total_bytes, self.roll_requested);
        let Err(needed_bytes) = claim_room(config, plan.demand, plan.claim) else {
            return Ok(());
        };
        let without_early = self
            .roll_requested
            .then(|| self.room_plan(config, records, total_bytes, false))
            .map(|plan| claim_room(config, plan.demand, plan.claim));
        if !matches!(without_early, Some(Ok(()))) {
            self.stats.appends_refused_for_room += 1;
            return Err(WalError::NoRoom { needed_bytes });
        }
        self.roll_requested = false;
        Ok(())
    }

    /// What appending `records` (`total_bytes` of frames), with an early roll
    /// or not, asks of the file system: segments that grow are written only
    /// with room for what they may still take plus a segment to spare, for a
    /// write that ran out of space would latch the WAL.
    fn room_plan(
        &self,
        config: &WalConfig,
        records: &[IngressRecord<'_>],
        total_bytes: u64,
        early: bool,
    ) -> RoomPlan {
        let max = config.segment_bytes_max;
        let segment = narad_io::align_up(max);
        let rolls = if !early && self.active_bytes + total_bytes <= max {
            0
        } else {
            rolls_needed(self.active_bytes, early, records, max)
        };
        // New segments the prepared one (if ready, and not claimed by a roll
        // staged before) does not serve grow.
        let growing = (self.rolls_pending + rolls)
            .saturating_sub(u64::from(self.prep_ready))
            .min(rolls);
        // Frames written into the active segment before any roll grow it, if
        // it grows; with rolls staged, it is a segment counted above.
        let first_rolls = records.first().is_some_and(|record| {
            let frame_len = record.frame_len() as u64;
            self.active_bytes > 0 && (early || self.active_bytes + frame_len > max)
        });
        let rest = if self.active_grows
            && !self.active_reserved
            && self.rolls_pending == 0
            && !first_rolls
        {
            max.saturating_sub(self.active_bytes)
        } else {
            0
        };
        RoomPlan {
            demand: rest + growing * segment,
            claim: total_bytes.min(rest) + growing * segment,
        }
    }
}

/// How many segments appending `records` starts, from an active segment
/// holding `active_bytes`, with an early roll `requested` or not: as
/// `Wal::stage` rolls.
fn rolls_needed(
    mut active_bytes: u64,
    mut requested: bool,
    records: &[IngressRecord<'_>],
    segment_bytes_max: u64,
) -> u64 {
    let mut rolls = 0;
    for record in records {
        let frame_len = record.frame_len() as u64;
        let full = active_bytes > 0 && active_bytes + frame_len > segment_bytes_max;
        if full || (requested && active_bytes > 0) {
            rolls += 1;
            active_bytes = 0;
            requested = false;
        }
        active_bytes += frame_len;
    }
    rolls
}

/// Reserves the blocks of a segment that grows (now `file_bytes` long), up
/// to a full segment, keeping its size: see the module doc. Returns whether
/// it holds the reservation. A failure is logged, and whatever it allocated
/// is given back (a file system short of space may allocate part of a range
/// before it fails): the file is cut to its own size, which frees blocks past
/// its end.
pub(super) async fn reserve_growing<F: narad_io::BlockFile>(
    file: &F,
    file_bytes: u64,
    config: &WalConfig,
) -> bool {
    let bytes = narad_io::align_up(config.segment_bytes_max);
    let e = match file.reserve(bytes).await {
        Ok(()) => return true,
        Err(e) => e,
    };
    if e.kind() == std::io::ErrorKind::Unsupported {
        tracing::debug!(error = %e, "ingress WAL: the file system cannot reserve a growing segment's space");
    } else {
        tracing::warn!(error = %e, "ingress WAL: cannot reserve a growing segment's space; it grows under the last measure of free space");
    }
    if let Err(e) = file.truncate(file_bytes).await {
        tracing::warn!(error = %e, "ingress WAL: cannot give back a failed reservation");
    }
    false
}

/// Whether the file system has room to write `segments` more segments (a
/// zero-fill): see [`claim_room`].
pub(super) fn room_for_segments(config: &super::WalConfig, segments: u64) -> bool {
    let bytes = narad_io::align_up(config.segment_bytes_max) * segments;
    claim_room(config, bytes, bytes).is_ok()
}

/// Checks that the file system has room for `demand` bytes plus a segment to
/// spare, as last measured ([`super::WalConfig::disk_room`]; always,
/// unmeasured, or for no demand), and takes `claim` off the measure at once,
/// so that the WALs of other shards, which read it too (all of them at a
/// start), count what this one is about to write; the next measure replaces
/// the figure. `Err` holds the room needed; nothing is taken then.
fn claim_room(config: &super::WalConfig, demand: u64, claim: u64) -> Result<(), u64> {
    use std::sync::atomic::Ordering;
    let Some(room) = config.disk_room.as_ref().filter(|_| demand > 0) else {
        return Ok(());
    };
    let needed = demand.saturating_add(narad_io::align_up(config.segment_bytes_max));
    room.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |free| {
        (free >= needed).then(|| free - claim.min(free))
    })
    .map(|_| ())
    .map_err(|_| needed)
}
