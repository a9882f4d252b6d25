//! Dispatch progress: which WAL sequence numbers are done, and the checkpoint.
//!
//! Commits to different partitions land out of order, so "done" is a set, and the
//! checkpoint is the first sequence number that is *not* done. It never passes a
//! record whose commit has not landed: a crash then replays from a point that skips
//! nothing (it may replay records that were committed, which duplicates, as the
//! delivery contract allows). Sans-IO: plain data, no clock, no disk.
//!
//! Memory is bounded by the dispatcher's read-ahead: only sequence numbers between
//! the checkpoint and the read frontier are tracked, one bit each.

use std::collections::VecDeque;

use crate::ids::Seq;

/// The largest window of tracked sequence numbers past the checkpoint. The
/// dispatcher never reads more than 16 windows of 65,536 records past it.
pub const TRACKED_SEQS_MAX: u64 = 16 * 65_536;

/// Done-set and checkpoint of one WAL's dispatch.
#[derive(Clone, Debug)]
pub struct DispatchProgress {
    checkpoint: Seq,
    /// `done[i]` says whether `checkpoint + i` is done.
    done: VecDeque<bool>,
}

impl DispatchProgress {
    /// Starts with everything below `checkpoint` done.
    pub fn new(checkpoint: Seq) -> Self {
        Self {
            checkpoint,
            done: VecDeque::new(),
        }
    }

    /// Resumes a progress left by a graceful stop: `done[i]` says whether
    /// `checkpoint + i` is done. `None` when the flags cannot be a progress: the
    /// checkpoint itself done, or more flags than the read-ahead tracks.
    pub fn resume(checkpoint: Seq, done: impl IntoIterator<Item = bool>) -> Option<Self> {
        let mut done: VecDeque<bool> = done.into_iter().collect();
        if done.front() == Some(&true) || done.len() as u64 > TRACKED_SEQS_MAX {
            return None;
        }
        while done.back() == Some(&false) {
            done.pop_back();
        }
        Some(Self { checkpoint, done })
    }

    /// Whether `checkpoint + i` is done, for each `i` up to the highest done
    /// record above the checkpoint (empty when none is).
    pub fn done_above(&self) -> impl ExactSizeIterator<Item = bool> + '_ {
        let last = self.done.iter().rposition(|&d| d).map_or(0, |i| i + 1);
        self.done.range(..last).copied()
    }

    /// The first sequence number not done.
    pub fn checkpoint(&self) -> Seq {
        self.checkpoint
    }

    /// Records that `seq` was committed (or discarded for good). Marking twice, or
    /// marking something below the checkpoint, is harmless.
    pub fn mark_done(&mut self, seq: Seq) {
        if seq < self.checkpoint {
            return;
        }
        let index = seq.0 - self.checkpoint.0;
        assert!(
            index < TRACKED_SEQS_MAX,
            "seq {seq} is beyond the dispatch read-ahead of checkpoint {}",
            self.checkpoint
        );
        let index = index as usize;
        if self.done.len() <= index {
            self.done.resize(index + 1, false);
        }
        self.done[index] = true;
        self.advance();
    }

    /// Whether `seq` is done.
    pub fn is_done(&self, seq: Seq) -> bool {
        seq < self.checkpoint
            || self
                .done
                .get((seq.0 - self.checkpoint.0) as usize)
                .copied()
                .unwrap_or(false)
    }

    #[cfg(not(feature = "broken-checkpoint-past-uncommitted"))]
    fn advance(&mut self) {
        while self.done.front() == Some(&true) {
            self.done.pop_front();
            self.checkpoint = self.checkpoint.next();
        }
    }

    /// Deliberately broken: the checkpoint jumps past the highest done record, even
    /// over records still in flight. Exists only to show the crash tests fail.
    #[cfg(feature = "broken-checkpoint-past-uncommitted")]
    fn advance(&mut self) {
        let highest = self.done.iter().rposition(|&d| d);
        if let Some(i) = highest {
            self.done.drain(..=i);
            self.checkpoint = Seq(self.checkpoint.0 + i as u64 + 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(not(feature = "broken-checkpoint-past-uncommitted"))]
    fn checkpoint_stops_at_the_first_record_not_done() {
        let mut p = DispatchProgress::new(Seq(10));
        p.mark_done(Seq(12));
        p.mark_done(Seq(11));
        assert_eq!(p.checkpoint(), Seq(10));
        p.mark_done(Seq(10));
        assert_eq!(p.checkpoint(), Seq(13));
        p.mark_done(Seq(5));
        assert_eq!(p.checkpoint(), Seq(13));
        assert!(p.is_done(Seq(12)) && !p.is_done(Seq(13)));
    }

    #[test]
    #[cfg(not(feature = "broken-checkpoint-past-uncommitted"))]
    fn a_resumed_progress_keeps_what_was_done_above_its_checkpoint() {
        let mut p = DispatchProgress::new(Seq(10));
        p.mark_done(Seq(12));
        p.mark_done(Seq(14));
        let flags: Vec<bool> = p.done_above().collect();
        assert_eq!(flags, [false, false, true, false, true]);
        let mut resumed = DispatchProgress::resume(Seq(10), flags.iter().copied().chain([false]))
            .expect("a progress");
        assert_eq!(resumed.done_above().len(), 5, "trailing flags dropped");
        assert!(resumed.is_done(Seq(12)) && !resumed.is_done(Seq(13)));
        resumed.mark_done(Seq(10));
        resumed.mark_done(Seq(11));
        assert_eq!(resumed.checkpoint(), Seq(13));
        assert!(DispatchProgress::resume(Seq(10), [true]).is_none());
        let too_many = std::iter::repeat_n(false, TRACKED_SEQS_MAX as usize + 1);
        assert!(DispatchProgress::resume(Seq(10), too_many).is_none());
        assert_eq!(DispatchProgress::new(Seq(3)).done_above().len(), 0);
    }
}
