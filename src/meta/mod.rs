//! Topic metadata: the state machine of topics and their configuration, the
//! parsing of topic requests into its commands, and the durable local store of
//! those commands.
//!
//! Which cores: the control plane, one thread per node, owns the [`MetaStore`]
//! and the [`MetaState`] and is their single writer. Shards read copies of the
//! state (a copy shares all but what a change touches, see `topics`) and never write it;
//! a request that changes topics is parsed where it lands ([`parse_create`],
//! [`parse_alter`]) and its [`Command`] sent to the control plane.
//!
//! Why the state machine is apart from its storage: the state is changed only by
//! applying commands, deterministically (the random incarnation id and the clock
//! reading travel inside the command). Today the commands are kept by a local log
//! with snapshots; later Raft will keep them instead and replicate them, and
//! [`MetaState::apply`] will serve as its state machine unchanged.
//!
//! Why JSON and blocking, buffered `std::fs` I/O with an fsync per command: the
//! state is small (a few hundred bytes per topic) and written only when an
//! operator creates, alters or deletes a topic. Readable files and simple code are
//! worth more here than the speed the data path's O_DIRECT WAL needs.
//!
//! Map:
//! - `state`: [`TopicRecord`], [`Command`], [`MetaState`] and its `apply`,
//!   [`MetaError`].
//! - `request`: strict parsing of create/alter bodies, topic name rules, the
//!   Topic object of the API.
//! - `frame`: the on-disk frames of log entries and snapshots.
//! - `store`: [`MetaStore`], the command log and its snapshots.
//! - `topics`: [`TopicMap`], the state's topics, shared between copies but
//!   for the parts a change touches.

mod frame;
mod request;
mod state;
mod store;
mod topics;

#[cfg(test)]
mod tests;

/// A valid topic record for tests elsewhere in the crate: 3 partitions, kept
/// forever, the reference's other defaults.
#[cfg(test)]
pub(crate) fn sample_record(name: &str, id: u128) -> TopicRecord {
    TopicRecord {
        name: name.to_string(),
        id: narad_shards::ids::IncarnationId(id),
        partitions: 3,
        retention_ms: 0,
        visibility_timeout_ms: 30_000,
        max_in_flight_per_partition: 1024,
        max_acked_ahead_per_partition: 1024,
        created_at: 1_700_000_000,
    }
}

pub use request::{
    parse_alter, parse_create, topic_json, validate_topic_name, PARTITIONS_MIN,
    TOPIC_NAME_CHARS_MAX,
};
pub use state::{
    Applied, Command, MetaError, MetaState, TopicChanges, TopicRecord, CHANGED_SINCE_READ,
    LIST_LIMIT_MAX, TOPICS_MAX,
};
pub use store::{MetaStore, SNAPSHOT_EVERY_ENTRIES};
pub use topics::TopicMap;
