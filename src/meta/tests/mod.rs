//! Tests of topic metadata: request rules, the state machine, the store's
//! recovery, and a property test of the store against the state in memory.

use narad_shards::ids::IncarnationId;

use super::*;
use crate::config::{Config, TopicDefaults};

mod prop;
mod request;
mod state;
mod store;
mod topics;

fn defaults() -> TopicDefaults {
    Config::default().topic
}

/// A valid record with the reference's defaults.
fn record(name: &str, id: u128) -> TopicRecord {
    TopicRecord {
        name: name.to_string(),
        id: IncarnationId(id),
        partitions: 3,
        retention_ms: 604_800_000,
        visibility_timeout_ms: 30_000,
        max_in_flight_per_partition: 1024,
        max_acked_ahead_per_partition: 1024,
        created_at: 1_700_000_000,
    }
}

fn create(name: &str, id: u128) -> Command {
    Command::CreateTopic(record(name, id))
}

fn alter(name: &str, id: u128, changes: TopicChanges) -> Command {
    Command::AlterTopic {
        name: name.to_string(),
        id: IncarnationId(id),
        changes,
    }
}

fn delete(name: &str, id: u128) -> Command {
    Command::DeleteTopic {
        name: name.to_string(),
        id: IncarnationId(id),
    }
}

fn retention(retention_ms: u64) -> TopicChanges {
    TopicChanges {
        retention_ms: Some(retention_ms),
        ..TopicChanges::default()
    }
}

/// Asserts `result` failed with `status` and a message holding each of `words`.
#[track_caller]
fn assert_refused<T: std::fmt::Debug>(result: Result<T, MetaError>, status: u16, words: &[&str]) {
    let error = result.expect_err("expected a refusal");
    assert_eq!(error.status(), status, "{error}");
    for word in words {
        assert!(
            error.message().contains(word),
            "{error:?} should mention {word:?}"
        );
    }
}
