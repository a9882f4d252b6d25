//! The chunked topic map: the same answers as one `BTreeMap` through any
//! sequence of inserts and removes, its chunk invariants, and copies that
//! share all but what a change touches.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::meta::topics::Chunked;

/// Chunks hold at most this many entries (the module's `CHUNK_MAX`).
const CHUNK_MAX: usize = 128;

#[track_caller]
fn assert_chunks_sound(sizes: &[usize], len: usize) {
    assert_eq!(sizes.iter().sum::<usize>(), len, "sizes {sizes:?}");
    assert!(
        sizes.iter().all(|&n| (1..=CHUNK_MAX).contains(&n)),
        "sizes {sizes:?}"
    );
    assert!(
        sizes.windows(2).all(|w| w[0] + w[1] > CHUNK_MAX / 2),
        "neighbours that fit in half a chunk: {sizes:?}"
    );
}

#[derive(Clone, Debug)]
enum Op {
    Insert(u16, u32),
    Remove(u16),
    /// Removes a run of keys from this one up: the deletes that leave chunks
    /// small.
    RemoveRun(u16, u16),
}

fn op() -> impl Strategy<Value = Op> {
    // Keys from a range a few chunks wide, so chunks split, empty and join.
    prop_oneof![
        4 => (0..1200u16, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
        2 => (0..1200u16).prop_map(Op::Remove),
        1 => (0..1200u16, 1..300u16).prop_map(|(k, n)| Op::RemoveRun(k, n)),
    ]
}

proptest! {
    #[test]
    fn a_chunked_map_answers_as_one_btree_map(ops in proptest::collection::vec(op(), 1..1500)) {
        let mut map = Chunked::<u16, u32>::default();
        let mut model = BTreeMap::new();
        for op in ops {
            match op {
                Op::Insert(k, v) => prop_assert_eq!(map.insert(k, v), model.insert(k, v)),
                Op::Remove(k) => prop_assert_eq!(map.remove(&k), model.remove(&k)),
                Op::RemoveRun(k, n) => {
                    for k in k..k.saturating_add(n) {
                        prop_assert_eq!(map.remove(&k), model.remove(&k));
                    }
                }
            }
            prop_assert_eq!(map.len(), model.len());
            assert_chunks_sound(&map.chunk_sizes(), model.len());
        }
        prop_assert!(map.iter().eq(model.iter()));
        for k in (0..1210u16).step_by(7) {
            prop_assert_eq!(map.get(&k), model.get(&k));
            let after: Vec<_> = map.iter_after(&k).take(300).collect();
            let expected: Vec<_> = model.range(k + 1..).take(300).collect();
            prop_assert_eq!(after, expected);
        }
    }
}

#[derive(Clone, Debug)]
enum TopicOp {
    /// Creates the name if neither it (in any case) nor the id is taken.
    Create(u16, bool, u16),
    /// Replaces the topic of that name with another incarnation.
    Replace(u16, bool, u16),
    /// Alters the topic of that name (same incarnation).
    Alter(u16, bool),
    Remove(u16, bool),
}

/// Names from a range a few chunks wide; `upper` picks the case of their
/// last letter, so twins come up often.
fn topic_name(n: u16, upper: bool) -> String {
    format!("t{n:03}{}", if upper { 'Q' } else { 'q' })
}

fn topic_op() -> impl Strategy<Value = TopicOp> {
    let name = (0..400u16, any::<bool>());
    prop_oneof![
        5 => (name.clone(), 0..1000u16).prop_map(|((n, u), id)| TopicOp::Create(n, u, id)),
        1 => (name.clone(), 0..1000u16).prop_map(|((n, u), id)| TopicOp::Replace(n, u, id)),
        1 => name.clone().prop_map(|(n, u)| TopicOp::Alter(n, u)),
        3 => name.prop_map(|(n, u)| TopicOp::Remove(n, u)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The topic map against a model that scans every topic, through
    /// creates, replacements, alters and removes: the same topics in the same
    /// order, and its id and case indexes agree with the scan.
    #[test]
    fn the_topic_map_answers_as_a_scan_of_every_topic(
        ops in proptest::collection::vec(topic_op(), 1..1200),
    ) {
        let mut map = TopicMap::default();
        let mut model: BTreeMap<String, Arc<TopicRecord>> = BTreeMap::new();
        let twin = |model: &BTreeMap<String, Arc<TopicRecord>>, name: &str| {
            model.keys().find(|k| k.eq_ignore_ascii_case(name)).cloned()
        };
        let id_taken = |model: &BTreeMap<String, Arc<TopicRecord>>, id: u128| {
            model.values().any(|t| t.id.0 == id)
        };
        for op in ops {
            match op {
                TopicOp::Create(n, upper, id) => {
                    let (name, id) = (topic_name(n, upper), u128::from(id));
                    if twin(&model, &name).is_none() && !id_taken(&model, id) {
                        prop_assert_eq!(map.insert(topic(&name, id)), None);
                        model.insert(name.clone(), topic(&name, id));
                    }
                }
                TopicOp::Replace(n, upper, id) => {
                    let (name, id) = (topic_name(n, upper), u128::from(id));
                    if model.contains_key(&name) && !id_taken(&model, id) {
                        let old = map.insert(topic(&name, id));
                        prop_assert_eq!(old, model.insert(name.clone(), topic(&name, id)));
                    }
                }
                TopicOp::Alter(n, upper) => {
                    let name = topic_name(n, upper);
                    if let Some(old) = model.get(&name).cloned() {
                        let altered = Arc::new(TopicRecord { partitions: old.partitions + 1, ..TopicRecord::clone(&old) });
                        prop_assert_eq!(map.insert(altered.clone()), Some(old));
                        model.insert(name, altered);
                    }
                }
                TopicOp::Remove(n, upper) => {
                    let name = topic_name(n, upper);
                    prop_assert_eq!(map.remove(&name), model.remove(&name));
                }
            }
            prop_assert_eq!(map.len(), model.len());
        }
        prop_assert!(map.values().eq(model.values()));
        for sizes in map.chunk_sizes() {
            assert_chunks_sound(&sizes, model.len());
        }
        for n in 0..400u16 {
            for upper in [false, true] {
                let name = topic_name(n, upper);
                prop_assert_eq!(map.get(&name), model.get(&name));
                prop_assert_eq!(map.case_twin(&name).map(str::to_string), twin(&model, &name));
            }
        }
        for id in 0..1000u128 {
            prop_assert_eq!(map.contains_id(IncarnationId(id)), id_taken(&model, id));
        }
    }
}

fn topic(name: &str, id: u128) -> Arc<TopicRecord> {
    Arc::new(record(name, id))
}

#[test]
fn a_copy_shares_every_chunk_but_the_one_a_change_touches() {
    let mut map = Chunked::<u32, u32>::default();
    for k in 0..100_000 {
        map.insert(k, k);
    }
    let chunks = map.chunk_sizes().len();
    assert_chunks_sound(&map.chunk_sizes(), 100_000);
    assert!(chunks <= 4 * 100_000 / CHUNK_MAX + 1, "{chunks} chunks");

    let before = map.clone();
    assert_eq!(map.chunks_shared_with(&before), chunks);
    map.insert(50_000, 7);
    assert_eq!(map.chunks_shared_with(&before), chunks - 1);
    let before = map.clone();
    map.remove(&77_777);
    assert_eq!(map.chunks_shared_with(&before), chunks - 1);
    // Nothing to remove copies nothing.
    let before = map.clone();
    assert_eq!(map.remove(&77_777), None);
    assert_eq!(map.chunks_shared_with(&before), chunks);
    assert_eq!(before.get(&50_000), Some(&7));
}

#[test]
fn the_topic_map_finds_topics_by_name_id_and_name_without_case() {
    let mut map = TopicMap::default();
    for (i, name) in ["orders", "Payments", "a.b-c_d"].iter().enumerate() {
        assert_eq!(map.insert(topic(name, i as u128 + 1)), None);
    }
    assert_eq!(map.len(), 3);
    assert_eq!(map.get("orders").map(|t| t.id.0), Some(1));
    assert!(map.get("Orders").is_none() && !map.contains_key("payments"));
    assert_eq!(map.case_twin("ORDERS"), Some("orders"));
    assert_eq!(map.case_twin("payments"), Some("Payments"));
    assert_eq!(map.case_twin("A.B-C_D"), Some("a.b-c_d"));
    assert_eq!(map.case_twin("order"), None);
    assert!(map.contains_id(IncarnationId(2)) && !map.contains_id(IncarnationId(4)));

    // The same topic altered keeps its id; a replacement under the same name
    // takes the old one's id out of the index.
    let altered = Arc::new(TopicRecord {
        partitions: 9,
        ..record("orders", 1)
    });
    assert_eq!(map.insert(altered.clone()).map(|t| t.partitions), Some(3));
    assert!(map.contains_id(IncarnationId(1)));
    map.insert(topic("orders", 5));
    assert!(!map.contains_id(IncarnationId(1)) && map.contains_id(IncarnationId(5)));

    assert_eq!(map.remove("Payments").map(|t| t.id.0), Some(2));
    assert_eq!(map.remove("Payments"), None);
    assert!(!map.contains_id(IncarnationId(2)));
    assert_eq!(map.case_twin("PAYMENTS"), None);
    let names: Vec<&str> = map.values().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a.b-c_d", "orders"]);
    let after: Vec<&str> = map.values_after("a").map(|t| t.name.as_str()).collect();
    assert_eq!(after, ["a.b-c_d", "orders"]);
    assert_eq!(map.values_after("a.b-c_d").count(), 1);
}

#[test]
#[should_panic(expected = "differ only in case")]
fn the_topic_map_refuses_a_second_name_that_differs_only_in_case() {
    let mut map = TopicMap::default();
    map.insert(topic("orders", 1));
    map.insert(topic("ORDERS", 2));
}

/// Many topics created and most deleted: every index agrees with the names
/// left, through splits and joins of all three maps.
#[test]
fn the_topic_maps_indexes_follow_creates_and_deletes() {
    let mut map = TopicMap::default();
    let name = |i: u32| {
        format!(
            "t{:05}{}",
            (i * 7919) % 5000,
            if i % 3 == 0 { "X" } else { "y" }
        )
    };
    for i in 0..5000 {
        map.insert(topic(&name(i), u128::from(i) + 1));
    }
    for i in (0..5000).filter(|i| i % 10 != 0) {
        assert!(map.remove(&name(i)).is_some());
    }
    assert_eq!(map.len(), 500);
    for sizes in map.chunk_sizes() {
        assert_chunks_sound(&sizes, 500);
    }
    for i in 0..5000 {
        let live = i % 10 == 0;
        assert_eq!(map.contains_key(&name(i)), live);
        assert_eq!(map.contains_id(IncarnationId(u128::from(i) + 1)), live);
        let upper = name(i).to_ascii_uppercase();
        assert_eq!(map.case_twin(&upper).is_some(), live, "{upper}");
    }
}
