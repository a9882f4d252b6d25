//! Choosing a message's partition at accept time.
//!
//! Three rules, in the reference's order of precedence: an explicit `partition`
//! pins the message; a key picks its partition by hash ([`key_partition`]); a
//! keyless message takes the next partition of its topic's rotation
//! ([`RoundRobin`]). The choice reads nothing but the topic's partition count,
//! so accepting a produce never waits on liveness: a dead owner is the
//! dispatcher's problem, later.
//!
//! The hash is FNV-1a 32-bit, as in the reference, so a key lands on the same
//! partition here as it does there, and as it did before a restart.
//!
//! Which cores: every shard. The hash is a pure function; each shard owns one
//! [`RoundRobin`] of its own (it is not shared, and needs no lock), so a topic
//! has one rotation per shard, each starting at a random partition. Keyless
//! messages therefore spread evenly over the partitions from every shard taken
//! alone, which is the property the reference gives per node.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use narad_shards::ids::DenseIdMap;

/// FNV-1a offset basis, 32-bit.
const FNV_OFFSET_BASIS: u32 = 2_166_136_261;
/// FNV-1a prime, 32-bit.
const FNV_PRIME: u32 = 16_777_619;

/// The FNV-1a 32-bit hash of `bytes`.
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(FNV_OFFSET_BASIS, |hash, &byte| {
        (hash ^ u32::from(byte)).wrapping_mul(FNV_PRIME)
    })
}

/// The partition a keyed message goes to: `fnv1a32(key) % partitions`.
///
/// An empty key is a key like any other here; whether a request's empty key
/// means "no key" is decided where the request is decoded.
pub fn key_partition(key: &[u8], partitions: u32) -> u32 {
    assert!(partitions > 0, "a topic has at least one partition");
    let partition = fnv1a32(key) % partitions;
    debug_assert!(partition < partitions);
    partition
}

/// The most topics one [`RoundRobin`] remembers a rotation for.
pub const ROUND_ROBIN_TOPICS_MAX: usize = 4096;

/// Marks "no neighbour" in the recency list.
const NIL: u32 = u32::MAX;

const _: () = assert!(ROUND_ROBIN_TOPICS_MAX > 0);
const _: () = assert!(ROUND_ROBIN_TOPICS_MAX < NIL as usize);

/// One topic's rotation, and its place in the recency list.
struct Rotation {
    topic_id: u128,
    /// The partition the next keyless message of this topic takes, before it is
    /// reduced modulo the current partition count (the topic may have grown).
    next_partition: u32,
    /// Towards the most recently used entry.
    newer: u32,
    /// Towards the least recently used entry.
    older: u32,
}

/// Per-topic round-robin for keyless messages, on one shard.
///
/// Each topic gets its own counter, starting at a partition drawn from a ChaCha8
/// generator seeded at construction, and counting up modulo the topic's
/// partition count. Starting at random keeps the shards (and nodes) of a cluster
/// from all sending a topic's first keyless messages to partition 0.
///
/// Memory is bounded: at most [`ROUND_ROBIN_TOPICS_MAX`] topics are remembered.
/// When a new topic arrives and the table is full, the least recently used topic
/// is forgotten; should it come back it simply starts a new rotation at a new
/// random partition. Forgetting costs nothing but the evenness of that one
/// topic's spread over the next few messages, so an exact LRU (a doubly linked
/// list threaded through a slab, O(1) per call) is all the bookkeeping needed.
pub struct RoundRobin {
    rng: ChaCha8Rng,
    /// Topic id → index into `rotations`.
    /// Topic id to slot; ids are random values this broker drew, so the
    /// cheap hash of [`DenseIdMap`] serves (a keyless produce looks it up).
    index: DenseIdMap<u128, u32>,
    /// The slab of rotations; never longer than `ROUND_ROBIN_TOPICS_MAX`.
    rotations: Vec<Rotation>,
    /// The most recently used rotation, or `NIL` when empty.
    newest: u32,
    /// The least recently used rotation: the next one evicted.
    oldest: u32,
}

impl RoundRobin {
    /// An empty table whose starting partitions are drawn from `seed`: the same
    /// seed and the same calls give the same partitions.
    pub fn new(seed: u64) -> Self {
        RoundRobin {
            rng: ChaCha8Rng::seed_from_u64(seed),
            index: DenseIdMap::default(),
            rotations: Vec::new(),
            newest: NIL,
            oldest: NIL,
        }
    }

    /// The partition the next keyless message of `topic_id` goes to.
    pub fn next(&mut self, topic_id: u128, partitions: u32) -> u32 {
        self.take(topic_id, partitions, 1)
    }

    /// The first of the partitions the next `count` keyless messages of
    /// `topic_id` go to, one after another: the k-th goes to `(first + k) %
    /// partitions`, as `count` calls of [`RoundRobin::next`] would say. A
    /// batch's records take their turns with one lookup.
    pub fn take(&mut self, topic_id: u128, partitions: u32, count: u32) -> u32 {
        assert!(partitions > 0, "a topic has at least one partition");
        let slot = match self.index.get(&topic_id) {
            Some(&slot) => {
                self.unlink(slot);
                slot
            }
            None => self.admit(topic_id, partitions),
        };
        self.link_newest(slot);

        let rotation = &mut self.rotations[slot as usize];
        let partition = rotation.next_partition % partitions;
        rotation.next_partition =
            ((u64::from(partition) + u64::from(count)) % u64::from(partitions)) as u32;

        assert!(partition < partitions);
        assert!(self.index.len() == self.rotations.len());
        assert!(self.rotations.len() <= ROUND_ROBIN_TOPICS_MAX);
        partition
    }

    /// How many topics have a rotation remembered.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether no topic has a rotation remembered.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// A slot for a topic not in the table, with a random starting partition,
    /// not yet linked into the recency list. Evicts the least recently used
    /// topic when the table is full.
    fn admit(&mut self, topic_id: u128, partitions: u32) -> u32 {
        let start = self.rng.random_range(0..partitions);
        let rotation = Rotation {
            topic_id,
            next_partition: start,
            newer: NIL,
            older: NIL,
        };
        let slot = if self.rotations.len() < ROUND_ROBIN_TOPICS_MAX {
            self.rotations.push(rotation);
            (self.rotations.len() - 1) as u32
        } else {
            let slot = self.oldest;
            assert!(slot != NIL);
            self.unlink(slot);
            let evicted = std::mem::replace(&mut self.rotations[slot as usize], rotation);
            let removed = self.index.remove(&evicted.topic_id);
            assert!(removed == Some(slot));
            slot
        };
        self.index.insert(topic_id, slot);
        slot
    }

    /// Takes `slot` out of the recency list.
    fn unlink(&mut self, slot: u32) {
        let (newer, older) = {
            let rotation = &self.rotations[slot as usize];
            (rotation.newer, rotation.older)
        };
        match newer {
            NIL => self.newest = older,
            newer => self.rotations[newer as usize].older = older,
        }
        match older {
            NIL => self.oldest = newer,
            older => self.rotations[older as usize].newer = newer,
        }
        let rotation = &mut self.rotations[slot as usize];
        rotation.newer = NIL;
        rotation.older = NIL;
    }

    /// Puts an unlinked `slot` at the most recently used end of the list.
    fn link_newest(&mut self, slot: u32) {
        let previous_newest = self.newest;
        {
            let rotation = &mut self.rotations[slot as usize];
            rotation.newer = NIL;
            rotation.older = previous_newest;
        }
        match previous_newest {
            NIL => self.oldest = slot,
            previous => self.rotations[previous as usize].newer = slot,
        }
        self.newest = slot;
    }

    #[cfg(test)]
    fn remembers(&self, topic_id: u128) -> bool {
        self.index.contains_key(&topic_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a32_known_answers() {
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9c_f968);
    }

    /// Taking a run of turns at once hands out the partitions one call per
    /// message would, and leaves the rotation where those calls would.
    #[test]
    fn a_run_of_turns_is_the_turns_one_by_one() {
        let (mut at_once, mut one_by_one) = (RoundRobin::new(9), RoundRobin::new(9));
        for (i, count) in [1u32, 5, 7, 1, 13, 1000, 2, 6].into_iter().enumerate() {
            let (topic, partitions) = (i as u128 % 3, 6 + i as u32 % 2);
            let first = at_once.take(topic, partitions, count);
            for k in 0..count {
                let want = one_by_one.next(topic, partitions);
                assert_eq!((first + k) % partitions, want, "run {i}, turn {k}");
            }
        }
    }

    #[test]
    fn keys_hash_to_their_partition() {
        assert_eq!(key_partition(b"foobar", 3), 0xbf9c_f968 % 3);
        assert_eq!(key_partition(b"", 7), 0x811c_9dc5 % 7);
        assert_eq!(key_partition(b"anything", 1), 0);
        for partitions in 1..=108 {
            assert!(key_partition(b"ord_123", partitions) < partitions);
        }
    }

    #[test]
    fn a_rotation_covers_every_partition_evenly() {
        let mut round_robin = RoundRobin::new(7);
        for partitions in 1..=108u32 {
            let topic_id = u128::from(partitions);
            let mut counts = vec![0u32; partitions as usize];
            for _ in 0..partitions * 3 {
                counts[round_robin.next(topic_id, partitions) as usize] += 1;
            }
            assert!(
                counts.iter().all(|&count| count == 3),
                "{partitions}: {counts:?}"
            );
        }
    }

    #[test]
    fn a_rotation_counts_up_from_a_random_start() {
        let mut round_robin = RoundRobin::new(1);
        let starts: Vec<u32> = (0..64u128)
            .map(|topic| round_robin.next(topic, 12))
            .collect();
        assert!(starts.iter().any(|&start| start != starts[0]), "{starts:?}");
        for (topic, &start) in starts.iter().enumerate() {
            for step in 1..30 {
                assert_eq!(round_robin.next(topic as u128, 12), (start + step) % 12);
            }
        }
    }

    #[test]
    fn the_same_seed_replays_the_same_partitions() {
        let run = |seed| {
            let mut round_robin = RoundRobin::new(seed);
            (0..200u128)
                .map(|i| round_robin.next(i % 13, 5))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }

    #[test]
    fn topics_rotate_independently() {
        let mut round_robin = RoundRobin::new(3);
        let a0 = round_robin.next(0xa, 5);
        let b0 = round_robin.next(0xb, 7);
        for step in 1..50 {
            assert_eq!(round_robin.next(0xa, 5), (a0 + step) % 5);
            if step % 3 == 0 {
                // Topic b moves only when it is asked for, whatever a does.
                assert_eq!(round_robin.next(0xb, 7), (b0 + step / 3) % 7);
            }
        }
    }

    #[test]
    fn a_topic_that_grows_keeps_rotating_in_range() {
        let mut round_robin = RoundRobin::new(5);
        let last = (0..4).map(|_| round_robin.next(1, 3)).last().unwrap();
        let mut counts = [0u32; 6];
        for _ in 0..12 {
            counts[round_robin.next(1, 6) as usize] += 1;
        }
        assert_eq!(counts, [2; 6]);
        assert!(last < 3);
    }

    #[test]
    fn eviction_keeps_the_table_bounded_and_forgets_the_least_recently_used() {
        let mut round_robin = RoundRobin::new(9);
        let max = ROUND_ROBIN_TOPICS_MAX as u128;
        for topic in 0..max {
            round_robin.next(topic, 4);
        }
        assert_eq!(round_robin.len(), ROUND_ROBIN_TOPICS_MAX);

        // Touch topic 0 so that topic 1 is now the least recently used.
        let before = round_robin.next(0, 4);
        round_robin.next(max, 4);
        assert_eq!(round_robin.len(), ROUND_ROBIN_TOPICS_MAX);
        assert!(round_robin.remembers(0));
        assert!(!round_robin.remembers(1));
        assert!(round_robin.remembers(2));
        assert!(round_robin.remembers(max));
        // Topic 0 kept its rotation through the eviction.
        assert_eq!(round_robin.next(0, 4), (before + 1) % 4);

        for topic in 0..10 * max {
            round_robin.next(topic * 31, 4);
            assert!(round_robin.len() <= ROUND_ROBIN_TOPICS_MAX);
        }
        // The most recent ROUND_ROBIN_TOPICS_MAX topics are exactly the ones kept.
        for topic in 9 * max..10 * max {
            assert!(round_robin.remembers(topic * 31));
        }
        assert!(!round_robin.remembers((9 * max - 1) * 31));
        assert!(!round_robin.is_empty());
    }

    #[test]
    fn an_evicted_topic_starts_a_fresh_rotation() {
        let mut round_robin = RoundRobin::new(11);
        for topic in 0..=ROUND_ROBIN_TOPICS_MAX as u128 {
            let partition = round_robin.next(topic, 8);
            assert!(partition < 8);
        }
        assert!(!round_robin.remembers(0));
        let restart = round_robin.next(0, 8);
        assert!(restart < 8);
        assert!(round_robin.remembers(0));
        assert_eq!(round_robin.next(0, 8), (restart + 1) % 8);
    }
}
