//! The bounded cache of recent frames, so a consumer reading right behind the high
//! watermark never touches the disk.
//!
//! Runs on the shard that owns the partition. Segment I/O is O_DIRECT, which has no
//! page cache to fall back on; without this cache every consume of a just-committed
//! record would cost a device read. The commit path inserts each verified frame's
//! records area (uncompressed, so a hit costs no zstd work either).
//!
//! Budget: one per partition ([`LogConfig::cache_bytes_max`], default 1 MiB), charged
//! as records-area bytes plus a fixed per-frame overhead. Per partition rather than
//! per shard so that a busy partition cannot evict a quiet one's tail and no state
//! is shared between logs; a shard with thousands of partitions lowers the budget,
//! and an idle log's cache goes with the log when it is closed.
//!
//! Invariants: the cached frames are contiguous in offset and end exactly at the
//! high watermark (or the cache is empty); the charged bytes never exceed the
//! budget after an insert returns.
//!
//! [`LogConfig::cache_bytes_max`]: super::LogConfig::cache_bytes_max

use std::collections::VecDeque;

use bytes::Bytes;

use crate::ids::Offset;

/// Bytes charged per cached frame on top of its records area: the queue slot and
/// the `Bytes` handle.
const FRAME_OVERHEAD_BYTES: usize = 64;

/// One cached frame.
#[derive(Clone, Debug)]
pub struct CachedFrame {
    /// Offset of the first record.
    pub base: Offset,
    /// Records in the frame.
    pub count: u32,
    /// The uncompressed records area, as verified on commit.
    pub area: Bytes,
}

impl CachedFrame {
    /// The offset after its last record.
    pub fn end(&self) -> Offset {
        Offset(self.base.0 + u64::from(self.count))
    }

    fn charge(&self) -> usize {
        self.area.len() + FRAME_OVERHEAD_BYTES
    }
}

/// The recent-frame cache of one partition.
#[derive(Debug)]
pub struct FrameCache {
    frames: VecDeque<CachedFrame>,
    charged_bytes: usize,
    budget_bytes: usize,
}

impl FrameCache {
    /// An empty cache holding at most `budget_bytes`.
    pub fn new(budget_bytes: usize) -> Self {
        Self {
            frames: VecDeque::new(),
            charged_bytes: 0,
            budget_bytes,
        }
    }

    /// The first offset the cache can serve, if any.
    pub fn start(&self) -> Option<Offset> {
        self.frames.front().map(|f| f.base)
    }

    /// Bytes charged against the budget.
    pub fn charged_bytes(&self) -> usize {
        self.charged_bytes
    }

    /// Adds the frame just committed, evicting the oldest ones to stay in budget. A
    /// frame that does not follow the cached ones (first commit after open) starts
    /// the cache afresh, which keeps the cached range contiguous.
    pub fn push(&mut self, frame: CachedFrame) {
        if self
            .frames
            .back()
            .is_some_and(|last| last.end() != frame.base)
        {
            self.clear();
        }
        if frame.charge() > self.budget_bytes {
            // Too large to cache; what is cached no longer ends at the high
            // watermark, so it must go too.
            self.clear();
            return;
        }
        self.charged_bytes += frame.charge();
        self.frames.push_back(frame);
        while self.charged_bytes > self.budget_bytes {
            let evicted = self
                .frames
                .pop_front()
                .expect("over budget means non-empty");
            self.charged_bytes -= evicted.charge();
        }
        assert!(self.charged_bytes <= self.budget_bytes);
    }

    /// The offset after the last cached record: the high watermark, when the
    /// cache is not empty.
    pub fn end(&self) -> Option<Offset> {
        self.frames.back().map(CachedFrame::end)
    }

    /// Drops the frames that end at or below `offset` (retention deleted their
    /// segment).
    pub fn trim_below(&mut self, offset: Offset) {
        while self.frames.front().is_some_and(|f| f.base < offset) {
            let dropped = self.frames.pop_front().expect("checked non-empty");
            self.charged_bytes -= dropped.charge();
        }
    }

    /// Drops everything.
    pub fn clear(&mut self) {
        self.frames.clear();
        self.charged_bytes = 0;
    }

    /// The cached frames holding `offset` and after, oldest first.
    pub fn frames_from(&self, offset: Offset) -> impl Iterator<Item = &CachedFrame> {
        let skip = self.frames.partition_point(|f| f.end() <= offset);
        self.frames.iter().skip(skip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(base: u64, count: u32, bytes: usize) -> CachedFrame {
        CachedFrame {
            base: Offset(base),
            count,
            area: Bytes::from(vec![0u8; bytes]),
        }
    }

    #[test]
    fn stays_in_budget_and_contiguous() {
        let mut cache = FrameCache::new(1000);
        for i in 0..20 {
            cache.push(frame(i * 2, 2, 100));
            assert!(cache.charged_bytes() <= 1000);
        }
        // 164 bytes per frame: six fit.
        assert_eq!(cache.start(), Some(Offset(28)));
        let firsts: Vec<u64> = cache.frames_from(Offset(35)).map(|f| f.base.0).collect();
        assert_eq!(firsts, vec![34, 36, 38]);
        cache.push(frame(41, 1, 10));
        assert_eq!(cache.start(), Some(Offset(41)), "a gap restarts the cache");
        cache.push(frame(42, 1, 5000));
        assert_eq!(cache.start(), None, "an oversized frame empties it");
    }

    #[test]
    fn trimming_drops_the_frames_below_an_offset() {
        let mut cache = FrameCache::new(1 << 20);
        for base in [0, 10, 20] {
            cache.push(frame(base, 10, 100));
        }
        assert_eq!(
            (cache.start(), cache.end()),
            (Some(Offset(0)), Some(Offset(30)))
        );
        cache.trim_below(Offset(10));
        assert_eq!(
            (cache.start(), cache.end()),
            (Some(Offset(10)), Some(Offset(30)))
        );
        cache.trim_below(Offset(30));
        assert_eq!(
            (cache.start(), cache.end(), cache.charged_bytes()),
            (None, None, 0)
        );
    }
}
