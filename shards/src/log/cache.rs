//! The bounded cache of recent frames, so a consumer reading right behind the high
//! watermark never touches the disk.
//!
//! Runs on the shard that owns the partition. Segment I/O is O_DIRECT, which has no
//! page cache to fall back on; without this cache every consume of a just-committed
//! record would cost a device read. The commit path inserts each verified frame's
//! records area (uncompressed, so a hit costs no zstd work either).
//!
//! Budget, in two parts, charged as records-area bytes plus a fixed per-frame
//! overhead:
//! - **Its own**, one per partition ([`LogConfig::cache_bytes_max`], default
//!   1 MiB): a partition always keeps its newest frames up to this, so a busy
//!   partition cannot evict a quiet one's tail. A log without a pool stays within it.
//! - **The shard's pool** ([`CachePool`], `storage.read_cache_bytes` in the
//!   broker): bytes a cache holds past its own budget are charged to the pool its
//!   shard shares, and when the pool is over budget the globally oldest of those
//!   frames go first, whichever partition holds them. So a burst on a few
//!   partitions can use the whole pool (consumers that fall a second behind still
//!   read from memory), while the shard's total stays at most the pool plus one
//!   own budget per open log, however many partitions it owns. (A log's read
//!   window and last decoded frame, kept for reads from the device, are outside
//!   both budgets: see `PartitionLog::read_window`.)
//!
//! The pool knows its members through weak references and is shared by the
//! shard's caches only (an `Rc`), so no state crosses cores. A cache reclaims for
//! the pool on its own push: it scans the members for the oldest frame held past
//! an own budget, which costs one pass over the shard's open logs per frame
//! evicted, per commit, not per record.
//!
//! Invariants: the cached frames are contiguous in offset and end exactly at the
//! high watermark (or the cache is empty); after a push returns, the cache is
//! within its own budget (no pool), or the pool is within its budget (unless
//! every frame held past an own budget belongs to a cache that was busy).
//!
//! [`LogConfig::cache_bytes_max`]: super::LogConfig::cache_bytes_max

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};

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

/// The memory a shard's recent-frame caches share past their own budgets (see the
/// module documentation). Cheap to clone; every clone is the same pool.
#[derive(Clone, Debug)]
pub struct CachePool {
    shared: Rc<PoolShared>,
}

#[derive(Debug)]
struct PoolShared {
    budget_bytes: usize,
    /// Bytes the members hold past their own budgets.
    pooled_bytes: Cell<usize>,
    /// Insertion order of every frame cached through this pool: frames with a
    /// lower number are older.
    next_seq: Cell<u64>,
    members: RefCell<Vec<Weak<RefCell<FrameCache>>>>,
}

impl CachePool {
    /// A pool of `budget_bytes` (0: caches keep to their own budgets).
    pub fn new(budget_bytes: usize) -> Self {
        Self {
            shared: Rc::new(PoolShared {
                budget_bytes,
                pooled_bytes: Cell::new(0),
                next_seq: Cell::new(0),
                members: RefCell::new(Vec::new()),
            }),
        }
    }

    /// The pool's budget.
    pub fn budget_bytes(&self) -> usize {
        self.shared.budget_bytes
    }

    /// Bytes the member caches hold past their own budgets now.
    pub fn pooled_bytes(&self) -> usize {
        self.shared.pooled_bytes.get()
    }

    fn over_budget(&self) -> bool {
        self.pooled_bytes() > self.shared.budget_bytes
    }

    fn next_seq(&self) -> u64 {
        let seq = self.shared.next_seq.get();
        self.shared.next_seq.set(seq + 1);
        seq
    }

    fn add_pooled(&self, before: usize, after: usize) {
        let pooled = self.shared.pooled_bytes.get() + after - before;
        self.shared.pooled_bytes.set(pooled);
    }

    /// The member (other than the one being pushed to, which is borrowed) whose
    /// oldest frame past its own budget is the oldest, with that frame's number.
    fn oldest_other(&self) -> Option<(u64, Rc<RefCell<FrameCache>>)> {
        let mut members = self.shared.members.borrow_mut();
        members.retain(|member| member.strong_count() > 0);
        let mut oldest: Option<(u64, Rc<RefCell<FrameCache>>)> = None;
        for member in members.iter() {
            let Some(cache) = member.upgrade() else {
                continue;
            };
            // The cache being pushed to is borrowed by its caller: skipped here
            // and weighed by the caller itself.
            let Ok(borrowed) = cache.try_borrow() else {
                continue;
            };
            let Some(seq) = borrowed.reclaimable_seq() else {
                continue;
            };
            drop(borrowed);
            if oldest.as_ref().is_none_or(|(best, _)| seq < *best) {
                oldest = Some((seq, cache));
            }
        }
        oldest
    }
}

/// The recent-frame cache of one partition.
#[derive(Debug)]
pub struct FrameCache {
    frames: VecDeque<CachedFrame>,
    /// The pool's number of each frame, in step with `frames` (empty without a
    /// pool).
    seqs: VecDeque<u64>,
    charged_bytes: usize,
    budget_bytes: usize,
    pool: Option<CachePool>,
}

impl FrameCache {
    /// An empty cache holding at most `budget_bytes`.
    pub fn new(budget_bytes: usize) -> Self {
        Self {
            frames: VecDeque::new(),
            seqs: VecDeque::new(),
            charged_bytes: 0,
            budget_bytes,
            pool: None,
        }
    }

    /// An empty cache that keeps `budget_bytes` of its own and may hold more while
    /// `pool` has room.
    pub fn in_pool(budget_bytes: usize, pool: &CachePool) -> Rc<RefCell<Self>> {
        let mut cache = Self::new(budget_bytes);
        cache.pool = Some(pool.clone());
        let cache = Rc::new(RefCell::new(cache));
        let mut members = pool.shared.members.borrow_mut();
        // Closed logs leave dead entries; a pool that never fills would
        // otherwise keep one per log ever opened.
        members.retain(|member| member.strong_count() > 0);
        members.push(Rc::downgrade(&cache));
        drop(members);
        cache
    }

    /// The first offset the cache can serve, if any.
    pub fn start(&self) -> Option<Offset> {
        self.frames.front().map(|f| f.base)
    }

    /// Bytes charged against the budget.
    pub fn charged_bytes(&self) -> usize {
        self.charged_bytes
    }

    fn pooled_part(&self, charged: usize) -> usize {
        charged.saturating_sub(self.budget_bytes)
    }

    /// Sets the charged bytes, keeping the pool's count of bytes past own
    /// budgets in step.
    fn set_charged(&mut self, charged: usize) {
        if let Some(pool) = &self.pool {
            pool.add_pooled(
                self.pooled_part(self.charged_bytes),
                self.pooled_part(charged),
            );
        }
        self.charged_bytes = charged;
    }

    /// The number of the oldest frame, when the cache holds more than its own
    /// budget (so the pool may take it).
    fn reclaimable_seq(&self) -> Option<u64> {
        if self.charged_bytes > self.budget_bytes {
            self.seqs.front().copied()
        } else {
            None
        }
    }

    fn evict_oldest(&mut self) {
        let evicted = self
            .frames
            .pop_front()
            .expect("evicting from a non-empty cache");
        self.seqs.pop_front();
        self.set_charged(self.charged_bytes - evicted.charge());
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
        let room = self.budget_bytes + self.pool.as_ref().map_or(0, CachePool::budget_bytes);
        if frame.charge() > room {
            // Too large to cache; what is cached no longer ends at the high
            // watermark, so it must go too.
            self.clear();
            return;
        }
        self.set_charged(self.charged_bytes + frame.charge());
        self.frames.push_back(frame);
        let Some(pool) = self.pool.clone() else {
            while self.charged_bytes > self.budget_bytes {
                self.evict_oldest();
            }
            return;
        };
        self.seqs.push_back(pool.next_seq());
        // Bounded: every pass evicts a frame, or stops.
        while pool.over_budget() {
            let own = self.reclaimable_seq();
            match (own, pool.oldest_other()) {
                (Some(own), Some((other, _))) if own < other => self.evict_oldest(),
                (Some(_), None) => self.evict_oldest(),
                (_, Some((_, other))) => other.borrow_mut().evict_oldest(),
                (None, None) => break,
            }
        }
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
            self.evict_oldest();
        }
    }

    /// Drops everything.
    pub fn clear(&mut self) {
        self.frames.clear();
        self.seqs.clear();
        self.set_charged(0);
    }

    /// The cached frames holding `offset` and after, oldest first.
    pub fn frames_from(&self, offset: Offset) -> impl Iterator<Item = &CachedFrame> {
        let skip = self.frames.partition_point(|f| f.end() <= offset);
        self.frames.iter().skip(skip)
    }
}

impl Drop for FrameCache {
    fn drop(&mut self) {
        // A closed log's bytes leave the pool with it.
        self.set_charged(0);
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

    fn pooled(budget: usize, pool: &CachePool) -> Rc<RefCell<FrameCache>> {
        FrameCache::in_pool(budget, pool)
    }

    /// Each frame here charges 164 bytes (100 + overhead).
    const CHARGE: usize = 164;

    #[test]
    fn a_burst_grows_into_the_pool_and_the_oldest_frames_past_own_budgets_go_first() {
        let pool = CachePool::new(10 * CHARGE);
        let quiet = pooled(2 * CHARGE, &pool);
        let busy = pooled(2 * CHARGE, &pool);
        for i in 0..4 {
            quiet.borrow_mut().push(frame(i, 1, 100));
        }
        assert_eq!(quiet.borrow().start(), Some(Offset(0)), "room in the pool");
        assert_eq!(pool.pooled_bytes(), 2 * CHARGE);
        for i in 0..20 {
            busy.borrow_mut().push(frame(i, 1, 100));
            assert!(pool.pooled_bytes() <= pool.budget_bytes());
        }
        // The quiet cache's two frames past its budget were the oldest: gone first,
        // its own two stay; the busy one holds its own two plus the whole pool.
        assert_eq!(quiet.borrow().start(), Some(Offset(2)));
        assert_eq!(quiet.borrow().charged_bytes(), 2 * CHARGE);
        assert_eq!(busy.borrow().start(), Some(Offset(8)));
        assert_eq!(busy.borrow().charged_bytes(), 12 * CHARGE);
        // A closed log gives its bytes back.
        drop(busy);
        assert_eq!(pool.pooled_bytes(), 0);
        for i in 4..14 {
            quiet.borrow_mut().push(frame(i, 1, 100));
        }
        assert_eq!(
            quiet.borrow().start(),
            Some(Offset(2)),
            "the pool is its again"
        );
    }

    /// Logs opened and closed again and again, on a pool that never fills, leave
    /// it no more members than are open.
    #[test]
    fn closed_caches_do_not_pile_up_in_the_pool() {
        let pool = CachePool::new(1 << 30);
        let kept = pooled(CHARGE, &pool);
        for i in 0..1000 {
            let cache = pooled(CHARGE, &pool);
            cache.borrow_mut().push(frame(i, 1, 100));
        }
        assert_eq!(pool.shared.members.borrow().len(), 2);
        drop(kept);
        let _last = pooled(CHARGE, &pool);
        assert_eq!(pool.shared.members.borrow().len(), 1);
        assert_eq!(pool.pooled_bytes(), 0);
    }

    /// The bytes of a cache's newest frames that together fit its own budget.
    fn newest_within_budget(cache: &FrameCache) -> usize {
        let mut kept = 0;
        for frame in cache.frames.iter().rev() {
            if kept + frame.charge() > cache.budget_bytes {
                break;
            }
            kept += frame.charge();
        }
        kept
    }

    /// Random pushes, trims and closes over a few caches of one pool: the pool's
    /// count is the sum of what members hold past their budgets, it stays within
    /// its budget after every push, and no push takes a cache below its own
    /// budget: another cache's push takes only frames past the newest ones that
    /// fit a cache's own budget.
    #[test]
    fn pool_accounting_holds_over_random_operations() {
        use rand::{Rng, SeedableRng};
        for seed in 0..64u64 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let pool = CachePool::new(rng.random_range(0..4000));
            let mut caches: Vec<Option<Rc<RefCell<FrameCache>>>> = (0..4)
                .map(|_| Some(pooled(rng.random_range(0..1500), &pool)))
                .collect();
            let mut next = [0u64; 4];
            for step in 0..400 {
                let i = rng.random_range(0..caches.len());
                // What each cache is sure to keep through another's push: its
                // newest frames that fit its own budget.
                let floor: Vec<usize> = caches
                    .iter()
                    .map(|c| c.as_ref().map_or(0, |c| newest_within_budget(&c.borrow())))
                    .collect();
                match (rng.random_range(0..20), &caches[i]) {
                    (0, Some(_)) => caches[i] = None,
                    (0, None) => caches[i] = Some(pooled(rng.random_range(0..1500), &pool)),
                    (1, Some(cache)) => {
                        let cut = next[i].saturating_sub(rng.random_range(0..8));
                        cache.borrow_mut().trim_below(Offset(cut));
                    }
                    (_, Some(cache)) => {
                        let count = rng.random_range(1..4);
                        let bytes = rng.random_range(1..700);
                        cache.borrow_mut().push(frame(next[i], count, bytes));
                        next[i] += u64::from(count);
                        assert!(
                            pool.pooled_bytes() <= pool.budget_bytes(),
                            "seed {seed} step {step}: pool over budget"
                        );
                        for (j, other) in caches.iter().enumerate() {
                            let Some(other) = other.as_ref().filter(|_| j != i) else {
                                continue;
                            };
                            let other = other.borrow();
                            assert!(
                                other.charged_bytes() >= floor[j],
                                "seed {seed} step {step}: cache {j} lost frames within its own budget"
                            );
                        }
                    }
                    (_, None) => {}
                }
                let held: usize = caches
                    .iter()
                    .flatten()
                    .map(|c| {
                        let c = c.borrow();
                        c.charged_bytes().saturating_sub(c.budget_bytes)
                    })
                    .sum();
                assert_eq!(
                    held,
                    pool.pooled_bytes(),
                    "seed {seed} step {step}: pool count"
                );
            }
        }
    }
}
