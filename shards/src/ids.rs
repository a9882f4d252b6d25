//! Typed identifiers and positions shared by the WAL and the partition log.
//!
//! Bare integers at these seams have caused real bugs in brokers (an offset passed
//! as a sequence number, a partition index as a shard index), so each gets a type.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

/// A sequence number in one shard's ingress WAL. Dense: every append takes the next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seq(pub u64);

/// An offset in one partition's log. Dense: every committed record takes the next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Offset(pub u64);

/// A partition index inside a topic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartitionId(pub u32);

/// A topic's incarnation: a random id given at creation, so that a topic deleted and
/// recreated under the same name never mixes its data with the old one's.
/// New ids are 64 random bits, written as 16 hex digits as the reference's
/// are; the 128-bit ids of topics created before keep their 32 digits (an id
/// is written as 32 digits exactly when it does not fit in 64 bits, so its
/// text, and the data directory named by it, never changes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IncarnationId(pub u128);

impl IncarnationId {
    /// A new random id: 64 bits, never 0.
    pub fn fresh() -> IncarnationId {
        loop {
            let id = rand::random::<u64>();
            if id != 0 {
                return IncarnationId(u128::from(id));
            }
        }
    }
}

impl Seq {
    /// The next sequence number.
    pub fn next(self) -> Seq {
        Seq(self.0 + 1)
    }
}

impl Offset {
    /// The next offset.
    pub fn next(self) -> Offset {
        Offset(self.0 + 1)
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for IncarnationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 >> 64 == 0 {
            write!(f, "{:016x}", self.0)
        } else {
            write!(f, "{:032x}", self.0)
        }
    }
}

/// Hashes the integer ids this process hands out itself (commit ids, topic
/// incarnations with partition indexes; WAL sequence numbers take
/// [`SeqHasher`]) for maps that the
/// produce and consume paths touch once or more per record: one
/// rotate and multiply per word (the FxHash step) instead of SipHash, whose
/// defence against chosen keys buys nothing for keys no client picks. A
/// multiply by an odd constant keeps consecutive ids apart in the low bits that
/// pick a bucket and mixes them into the high bits the table's tags take.
/// A few lines for keys that are plain integers; not worth a dependency.
#[derive(Clone, Copy, Debug, Default)]
pub struct DenseIdHasher(u64);

const DENSE_ID_MULTIPLIER: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl Hasher for DenseIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for_each_word(bytes, |word| self.write_u64(word));
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(DENSE_ID_MULTIPLIER);
    }

    fn write_u32(&mut self, word: u32) {
        self.write_u64(u64::from(word));
    }

    fn write_u128(&mut self, word: u128) {
        self.write_u64(word as u64);
        self.write_u64((word >> 64) as u64);
    }

    fn write_usize(&mut self, word: usize) {
        self.write_u64(word as u64);
    }
}

/// Hands `bytes` to `write` as little-endian 64-bit words, the last one
/// zero-padded: how the id hashers take keys that are not plain integers.
fn for_each_word(bytes: &[u8], mut write: impl FnMut(u64)) {
    for chunk in bytes.chunks(8) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        write(u64::from_le_bytes(word));
    }
}

/// A hash map keyed by ids this process hands out; see [`DenseIdHasher`].
pub type DenseIdMap<K, V> = HashMap<K, V, BuildHasherDefault<DenseIdHasher>>;

/// A hash set of ids this process hands out; see [`DenseIdHasher`].
pub type DenseIdSet<K> = HashSet<K, BuildHasherDefault<DenseIdHasher>>;

/// Hashes WAL sequence numbers for the maps of records in flight, which hold
/// runs of nearby numbers and touch each one a few times: the number itself
/// picks the bucket, so the records of a read sit in consecutive buckets and a
/// pass over them walks the table in order instead of missing the cache at
/// every record as a scattering hash ([`DenseIdHasher`]) makes it. A multiply
/// mixes the number into the top bits, which the table's tags take.
#[derive(Clone, Copy, Debug, Default)]
pub struct SeqHasher(u64);

/// The hash bits a hashbrown table takes its tags from.
const TAG_BITS: u64 = 0xfe00_0000_0000_0000;

impl Hasher for SeqHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for_each_word(bytes, |word| self.write_u64(word));
    }

    fn write_u64(&mut self, word: u64) {
        let word = self.0.rotate_left(5) ^ word;
        self.0 = word ^ (word.wrapping_mul(DENSE_ID_MULTIPLIER) & TAG_BITS);
    }
}

/// A hash map keyed by WAL sequence numbers; see [`SeqHasher`].
pub type SeqMap<V> = HashMap<Seq, V, BuildHasherDefault<SeqHasher>>;

/// A hash set of WAL sequence numbers; see [`SeqHasher`].
pub type SeqSet = HashSet<Seq, BuildHasherDefault<SeqHasher>>;

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::*;

    #[test]
    fn an_incarnation_id_is_written_in_16_digits_unless_it_needs_32() {
        assert_eq!(IncarnationId(0xfeed).to_string(), "000000000000feed");
        assert_eq!(
            IncarnationId(u128::from(u64::MAX)).to_string(),
            "ffffffffffffffff"
        );
        assert_eq!(
            IncarnationId(1 << 64).to_string(),
            "00000000000000010000000000000000"
        );
        let ids: HashSet<IncarnationId> = (0..1_000).map(|_| IncarnationId::fresh()).collect();
        assert_eq!(ids.len(), 1_000);
        assert!(ids.iter().all(|id| id.0 != 0 && id.to_string().len() == 16));
    }

    #[test]
    fn consecutive_ids_take_distinct_buckets_and_all_are_found() {
        let build = BuildHasherDefault::<DenseIdHasher>::default();
        // The low 16 bits pick among 65,536 buckets: 65,536 consecutive
        // sequence numbers, from anywhere, must land in as many.
        let start = 7_000_000_123u64;
        let buckets: HashSet<u64> = (start..start + 65_536)
            .map(|n| build.hash_one(Seq(n)) & 0xffff)
            .collect();
        assert_eq!(buckets.len(), 65_536);
        let mut set = DenseIdSet::default();
        set.extend((0..100_000).map(Seq));
        assert!((0..100_000).all(|n| set.contains(&Seq(n))));
        assert!(!set.contains(&Seq(100_000)));
    }

    #[test]
    fn consecutive_seqs_take_consecutive_buckets_and_varied_tags() {
        let build = BuildHasherDefault::<SeqHasher>::default();
        let start = 7_000_000_123u64;
        let hashes: Vec<u64> = (start..start + 4_096)
            .map(|n| build.hash_one(Seq(n)))
            .collect();
        // The bucket bits follow the number: a run of records is a run of
        // buckets.
        assert!(hashes
            .windows(2)
            .all(|w| (w[1] & !TAG_BITS) == (w[0] & !TAG_BITS) + 1));
        // The tags (top seven bits) vary from one to the next, so a probe
        // seldom compares keys it does not want.
        let tags: HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert!(tags.len() >= 100, "only {} distinct tags", tags.len());
        let mut map = SeqMap::default();
        map.extend((0..100_000).map(|n| (Seq(n), n)));
        assert!((0..100_000).all(|n| map.get(&Seq(n)) == Some(&n)));
        assert!(map.remove(&Seq(100_000)).is_none());
    }
}
