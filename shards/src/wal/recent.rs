//! What the WAL keeps in memory for its readers: the batches flushed last
//! (a dispatcher that keeps up reads them, never the device) and marks of
//! where frames start (a lagging reader seeks by them instead of scanning a
//! segment from its start).
//!
//! Which cores: the WAL's shard, inside its shared state.

use bytes::Bytes;

use super::Shared;
use crate::ids::Seq;

/// A flushed (durable) batch of frames kept for readers. Shared bytes: the
/// dispatcher hands slices of it to partition commits without copying them
/// (`StoredRecord::shared`), and those keep it alive after it is evicted.
pub(super) struct RecentBatch {
    pub(super) first: Seq,
    pub(super) end: Seq,
    pub(super) frames: Bytes,
}

/// Where the frame of `seq` starts: in segment `segment`, at byte `pos`.
#[derive(Clone, Copy, Debug)]
pub(super) struct PositionMark {
    pub(super) seq: Seq,
    pub(super) segment: Seq,
    pub(super) pos: u64,
}

/// Position marks kept, one or more per flush: about a minute of flushes at
/// full speed, 24 bytes each. They spare a lagging reader a scan from the start
/// of a 64 MiB segment.
const POSITION_MARKS_MAX: usize = 65_536;

impl Shared {
    /// Keeps a flushed batch for readers and returns a buffer the budget evicted
    /// (if nothing still holds a slice of it), for reuse as a staging buffer.
    pub(super) fn keep_recent(&mut self, batch: RecentBatch, bytes_max: usize) -> Option<Vec<u8>> {
        self.recent_bytes += batch.frames.len();
        self.recent.push_back(batch);
        let mut reusable = None;
        while self.recent_bytes > bytes_max && self.recent.len() > 1 {
            let old = self.recent.pop_front().expect("more than one batch");
            self.recent_bytes -= old.frames.len();
            if let Ok(buf) = old.frames.try_into_mut() {
                reusable = Some(Vec::from(buf));
            }
        }
        reusable
    }

    /// The kept batch holding `seq`, if any.
    pub(super) fn recent_holding(&self, seq: Seq) -> Option<(Seq, Bytes)> {
        let index = self.recent.partition_point(|b| b.end <= seq);
        let batch = self.recent.get(index)?;
        (batch.first <= seq).then(|| (batch.first, batch.frames.clone()))
    }

    pub(super) fn add_mark(&mut self, mark: PositionMark) {
        if self.marks.len() == POSITION_MARKS_MAX {
            self.marks.pop_front();
        }
        self.marks.push_back(mark);
    }

    /// The latest mark at or before `seq` inside `segment`.
    pub(super) fn mark_before(&self, segment: Seq, seq: Seq) -> Option<PositionMark> {
        let index = self.marks.partition_point(|m| m.seq <= seq);
        let kept = index
            .checked_sub(1)
            .and_then(|i| self.marks.get(i).copied())
            .filter(|m| m.segment == segment);
        let pinned = self
            .pinned_marks
            .iter()
            .filter(|m| m.segment == segment && m.seq <= seq)
            .max_by_key(|m| m.seq)
            .copied();
        match (kept, pinned) {
            (Some(k), Some(p)) => Some(if p.seq > k.seq { p } else { k }),
            (k, p) => k.or(p),
        }
    }
}
