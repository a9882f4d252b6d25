//! The topic map of the metadata state: topics by name, in name order, with
//! an index of their incarnation ids and of their names without case; copies
//! share all of it but the parts a change touches.
//!
//! Why: the control thread publishes a new state for every create, alter and
//! delete, and the shards drop the one before. With one `BTreeMap` that copy
//! and that drop touched every topic, so a change cost O(topics) on the control
//! thread and on a shard (creates took 23 ms at 100,000 topics, and the drops
//! stalled a shard's produces). Here each map is a sorted row of chunks behind
//! `Arc`: a copy takes one reference per chunk, and a change copies the one
//! chunk it lands in. Persistent-map crates do the same with deeper trees;
//! two levels are enough for [`TOPICS_MAX`](super::TOPICS_MAX) topics, keep the
//! name order the topic list pages through, and take a page of code.
//!
//! Cost at 100,000 topics: a copy takes about 2,000 references (chunks of
//! 64 to 128 entries, three maps); a change copies three chunks.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Bound;
use std::sync::Arc;

use narad_shards::ids::IncarnationId;

use super::TopicRecord;

/// Entries a chunk holds at most; a fuller one is split in halves.
const CHUNK_MAX: usize = 128;

/// A sorted map kept as a row of chunks, each a `BTreeMap` behind `Arc`.
///
/// Invariants: no chunk is empty; every key of a chunk sorts below every key
/// of the next; two neighbouring chunks together hold more than
/// `CHUNK_MAX / 2` entries, so there are at most `4 * len / CHUNK_MAX + 1`
/// chunks however many entries were removed.
#[derive(Clone)]
pub struct Chunked<K, V> {
    chunks: Vec<Arc<BTreeMap<K, V>>>,
    len: usize,
}

impl<K, V> Default for Chunked<K, V> {
    fn default() -> Self {
        Chunked {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<K: Ord + Clone, V: Clone> Chunked<K, V> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The chunk `key` belongs in: the last one whose first key is not above
    /// it, or the first chunk for a key below them all (0 when there is none).
    fn chunk_of<Q>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let not_above = self.chunks.partition_point(|chunk| {
            let (first, _) = chunk.first_key_value().expect("chunks are never empty");
            first.borrow() <= key
        });
        not_above.saturating_sub(1)
    }

    pub fn get_key_value<Q>(&self, key: &Q) -> Option<(&K, &V)>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.chunks.get(self.chunk_of(key))?.get_key_value(key)
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.get_key_value(key).map(|(_, value)| value)
    }

    /// Inserts or replaces; returns the value replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        if self.chunks.is_empty() {
            self.chunks.push(Arc::new(BTreeMap::from([(key, value)])));
            self.len = 1;
            return None;
        }
        let at = self.chunk_of(&key);
        let chunk = Arc::make_mut(&mut self.chunks[at]);
        let previous = chunk.insert(key, value);
        if previous.is_none() {
            self.len += 1;
        }
        if chunk.len() > CHUNK_MAX {
            let middle = chunk
                .keys()
                .nth(chunk.len() / 2)
                .expect("a full chunk")
                .clone();
            let upper = chunk.split_off(&middle);
            self.chunks.insert(at + 1, Arc::new(upper));
        }
        previous
    }

    /// Removes `key`; a chunk left empty goes, and one left small joins a
    /// neighbour when the two fit in half a chunk.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let at = self.chunk_of(key);
        // Looked up first: a copy of a shared chunk only for a real removal.
        if !self.chunks.get(at)?.contains_key(key) {
            return None;
        }
        let removed = Arc::make_mut(&mut self.chunks[at]).remove(key);
        self.len -= 1;
        if self.chunks[at].is_empty() {
            self.chunks.remove(at);
            return removed;
        }
        if at + 1 < self.chunks.len() {
            self.join_if_small(at);
        }
        if at > 0 {
            self.join_if_small(at - 1);
        }
        removed
    }

    /// Joins chunk `at + 1` into chunk `at` if the two fit in half a chunk.
    fn join_if_small(&mut self, at: usize) {
        if self.chunks[at].len() + self.chunks[at + 1].len() > CHUNK_MAX / 2 {
            return;
        }
        let mut next = self.chunks.remove(at + 1);
        let next = Arc::make_mut(&mut next);
        Arc::make_mut(&mut self.chunks[at]).append(next);
    }

    /// Every entry in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> + '_ {
        self.chunks.iter().flat_map(|chunk| chunk.iter())
    }

    /// The entries above `key`, in key order.
    pub fn iter_after<'a, Q>(&'a self, key: &'a Q) -> impl Iterator<Item = (&'a K, &'a V)> + 'a
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let at = self.chunk_of(key);
        let first =
            self.chunks.get(at).into_iter().flat_map(move |chunk| {
                chunk.range::<Q, _>((Bound::Excluded(key), Bound::Unbounded))
            });
        let rest = self.chunks.get(at + 1..).unwrap_or_default();
        first.chain(rest.iter().flat_map(|chunk| chunk.iter()))
    }

    /// The chunks' sizes, for tests of the invariants.
    #[cfg(test)]
    pub fn chunk_sizes(&self) -> Vec<usize> {
        self.chunks.iter().map(|chunk| chunk.len()).collect()
    }
}

/// A topic name ordered without regard to ASCII case: the index that finds a
/// name differing from another only in case.
#[derive(Clone)]
struct Folded(Arc<str>);

impl Ord for Folded {
    fn cmp(&self, other: &Self) -> Ordering {
        let a = self.0.bytes().map(|b| b.to_ascii_lowercase());
        a.cmp(other.0.bytes().map(|b| b.to_ascii_lowercase()))
    }
}

impl PartialOrd for Folded {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Folded {
    fn eq(&self, other: &Self) -> bool {
        self.0.eq_ignore_ascii_case(&other.0)
    }
}

impl Eq for Folded {}

/// Every topic by name, with an index of their incarnation ids and of their
/// names without case. Names that differ only in case never both live here:
/// the state machine refuses the second (a case-insensitive file system would
/// merge their directories).
#[derive(Clone, Default)]
pub struct TopicMap {
    by_name: Chunked<Arc<str>, Arc<TopicRecord>>,
    ids: Chunked<IncarnationId, ()>,
    folded: Chunked<Folded, ()>,
}

impl TopicMap {
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The topic named exactly `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<TopicRecord>> {
        self.by_name.get(name)
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Whether a live topic is the incarnation `id`.
    pub fn contains_id(&self, id: IncarnationId) -> bool {
        self.ids.get(&id).is_some()
    }

    /// The name of the topic whose name is `name` but for ASCII case (it may be
    /// `name` itself).
    pub fn case_twin(&self, name: &str) -> Option<&str> {
        let (twin, ()) = self.folded.get_key_value(&Folded(Arc::from(name)))?;
        Some(&twin.0)
    }

    /// Every topic, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &Arc<TopicRecord>)> + '_ {
        self.by_name.iter()
    }

    /// Every topic's record, in name order.
    pub fn values(&self) -> impl Iterator<Item = &Arc<TopicRecord>> + '_ {
        self.iter().map(|(_, record)| record)
    }

    /// The topics named above `name`, in name order.
    pub fn values_after<'a>(
        &'a self,
        name: &'a str,
    ) -> impl Iterator<Item = &'a Arc<TopicRecord>> + 'a {
        self.by_name.iter_after(name).map(|(_, record)| record)
    }

    /// Puts `record` under its name, in place of the topic of that name if
    /// there is one; returns the one replaced. A different topic's name may
    /// not differ from it only in case, nor may it have its incarnation id.
    pub(super) fn insert(&mut self, record: Arc<TopicRecord>) -> Option<Arc<TopicRecord>> {
        let name: Arc<str> = Arc::from(record.name.as_str());
        if let Some(twin) = self.case_twin(&name) {
            assert_eq!(twin, &*name, "topic names that differ only in case");
        }
        let id = record.id;
        let same_id = self.get(&name).is_some_and(|old| old.id == id);
        assert!(
            same_id || !self.contains_id(id),
            "two topics with one incarnation id"
        );
        let previous = self.by_name.insert(name.clone(), record);
        match &previous {
            Some(old) if old.id == id => {}
            Some(old) => {
                self.ids.remove(&old.id);
                self.ids.insert(id, ());
            }
            None => {
                self.ids.insert(id, ());
                self.folded.insert(Folded(name), ());
            }
        }
        previous
    }

    /// Removes the topic named `name`; returns it.
    pub(super) fn remove(&mut self, name: &str) -> Option<Arc<TopicRecord>> {
        let removed = self.by_name.remove(name)?;
        self.ids.remove(&removed.id);
        self.folded.remove(&Folded(Arc::from(name)));
        Some(removed)
    }

    /// The three maps' chunk sizes, for tests of the invariants.
    #[cfg(test)]
    pub fn chunk_sizes(&self) -> [Vec<usize>; 3] {
        [
            self.by_name.chunk_sizes(),
            self.ids.chunk_sizes(),
            self.folded.chunk_sizes(),
        ]
    }
}

impl PartialEq for TopicMap {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for TopicMap {}

impl fmt::Debug for TopicMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
impl<K, V> Chunked<K, V> {
    /// How many of this map's chunks `other` holds too (the same allocation).
    pub fn chunks_shared_with(&self, other: &Self) -> usize {
        (self.chunks.iter())
            .filter(|chunk| other.chunks.iter().any(|o| Arc::ptr_eq(chunk, o)))
            .count()
    }
}
