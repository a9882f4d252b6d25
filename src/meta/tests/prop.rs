//! A property test: random sequences of commands (valid and not) proposed to a
//! store, with reopens, snapshots and torn tails at random points, always reopen
//! to the state kept in memory.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use proptest::prelude::*;

use super::*;

/// Few names, one pair differing only in case, so commands collide often.
const NAMES: [&str; 4] = ["a", "b", "B", "c.d"];

#[derive(Clone, Debug)]
enum Step {
    Create {
        name: usize,
        partitions: u32,
        retention_ms: u64,
    },
    /// `stale`: use an incarnation id that is not the topic's.
    Alter {
        name: usize,
        stale: bool,
        changes: TopicChanges,
    },
    Delete {
        name: usize,
        stale: bool,
    },
    Reopen,
    /// Garbage or zeros at the end of the log, then a reopen: a torn write.
    TearAndReopen {
        tail: Vec<u8>,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let name = 0..NAMES.len();
    let retention_ms = prop_oneof![Just(0u64), Just(5u64), 3_600_000..10_000_000u64];
    let changes = (
        proptest::option::of(retention_ms.clone()),
        proptest::option::of(0..3u32),
        proptest::option::of(1..3u32),
        proptest::option::of(1..8u32),
    )
        .prop_map(
            |(retention_ms, in_flight, acked, partitions)| TopicChanges {
                retention_ms,
                max_in_flight_per_partition: in_flight,
                max_acked_ahead_per_partition: acked,
                partitions,
            },
        );
    prop_oneof![
        4 => (name.clone(), 0..6u32, retention_ms).prop_map(|(name, partitions, retention_ms)| {
            Step::Create { name, partitions, retention_ms }
        }),
        3 => (name.clone(), proptest::bool::weighted(0.2), changes)
            .prop_map(|(name, stale, changes)| Step::Alter { name, stale, changes }),
        2 => (name, proptest::bool::weighted(0.2))
            .prop_map(|(name, stale)| Step::Delete { name, stale }),
        1 => Just(Step::Reopen),
        1 => prop_oneof![
            proptest::collection::vec(any::<u8>(), 1..64),
            (1..600usize).prop_map(|n| vec![0; n]),
        ]
        .prop_map(|tail| Step::TearAndReopen { tail }),
    ]
}

/// The command a step proposes: ids come from `next_id` for creates, and from the
/// state (or a wrong one, when stale) for alters and deletes.
fn command(step: &Step, state: &MetaState, next_id: &mut u128) -> Option<Command> {
    let id_of = |name: &str, stale: bool| {
        let id = state.get(name).map_or(u128::MAX, |r| r.id.0);
        if stale {
            id ^ 1
        } else {
            id
        }
    };
    match step {
        Step::Create {
            name,
            partitions,
            retention_ms,
        } => {
            *next_id += 1;
            Some(Command::CreateTopic(TopicRecord {
                partitions: *partitions,
                retention_ms: *retention_ms,
                ..record(NAMES[*name], *next_id)
            }))
        }
        Step::Alter {
            name,
            stale,
            changes,
        } => {
            let name = NAMES[*name];
            Some(alter(name, id_of(name, *stale), changes.clone()))
        }
        Step::Delete { name, stale } => {
            let name = NAMES[*name];
            Some(delete(name, id_of(name, *stale)))
        }
        Step::Reopen | Step::TearAndReopen { .. } => None,
    }
}

fn reopen(dir: &Path, every: u64) -> (MetaStore, MetaState) {
    let (mut store, state) = MetaStore::open(dir).expect("reopen");
    store.set_snapshot_every(every);
    (store, state)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn the_store_reopens_to_the_state_in_memory(
        steps in proptest::collection::vec(step(), 1..80),
        snapshot_every in 1..12u64,
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("metastore");
        let (mut store, mut state) = reopen(&dir, snapshot_every);
        let mut model = MetaState::default();
        let mut next_id = 0u128;
        for step in &steps {
            if let Some(cmd) = command(step, &model, &mut next_id) {
                let in_memory = model.apply(&cmd);
                let stored = store.propose(&mut state, cmd);
                prop_assert_eq!(&stored, &in_memory);
                prop_assert_eq!(&state, &model);
                continue;
            }
            drop(store);
            if let Step::TearAndReopen { tail } = step {
                let mut log = OpenOptions::new()
                    .append(true)
                    .open(dir.join("commands.log"))
                    .unwrap();
                log.write_all(tail).unwrap();
            }
            (store, state) = reopen(&dir, snapshot_every);
            prop_assert_eq!(&state, &model);
        }
        drop(store);
        let (_, reopened) = reopen(&dir, snapshot_every);
        prop_assert_eq!(reopened, model);
    }
}
