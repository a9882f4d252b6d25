//! The topic metadata state machine: records, the commands that change them, and
//! their deterministic application.
//!
//! `apply` reads nothing but its arguments: no clock, no randomness, no I/O. What
//! a command needs from the outside world (a topic's random incarnation id, its
//! creation time) is chosen by the proposer and carried inside the command, so
//! replaying the same commands from the same state always gives the same state.
//!
//! `apply` checks every command again against the state it meets, not only the
//! state its request was validated against: another command may have landed in
//! between (a create of the same name, a delete and recreate), and a command that
//! was valid when proposed must then fail cleanly instead of breaking the state.
//! A failed `apply` changes nothing, and the version does not move.

use std::fmt;
use std::sync::Arc;

use narad_shards::ids::IncarnationId;
use serde::{Deserialize, Serialize};

use super::request::validate_topic_name;
use super::topics::TopicMap;
use crate::config::RETENTION_MS_MIN;

/// The largest page [`MetaState::list`] returns, as the reference clamps `limit`.
pub const LIST_LIMIT_MAX: usize = 1000;

/// The message of the 409 a command gets when its topic was deleted and recreated
/// (or otherwise replaced) after the request read it, in the reference's words.
pub const CHANGED_SINCE_READ: &str = "topic changed since it was read";

/// Topics the metadata holds at most. Every snapshot writes the state whole
/// (one topic is a few hundred bytes of it), so the cap keeps a snapshot far
/// below its format's limit and a create from making the control plane fail:
/// past it a create is refused with 409.
pub const TOPICS_MAX: usize = 100_000;

/// One topic's configuration, as created and altered by [`Command`]s.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
// Unknown fields are refused on decode: a record written by a newer version and read
// by this one must stop the node, not lose the fields this version cannot keep.
#[serde(deny_unknown_fields)]
pub struct TopicRecord {
    pub name: String,
    #[serde(with = "incarnation_hex")]
    pub id: IncarnationId,
    pub partitions: u32,
    /// 0 keeps messages forever.
    pub retention_ms: u64,
    pub visibility_timeout_ms: u64,
    pub max_in_flight_per_partition: u32,
    pub max_acked_ahead_per_partition: u32,
    /// Unix seconds, chosen by the proposer.
    pub created_at: u64,
}

/// The changes of one alter; `None` leaves a field as it is. Values are final: a
/// request's "0 = default" is resolved before the command is made.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicChanges {
    pub retention_ms: Option<u64>,
    pub max_in_flight_per_partition: Option<u32>,
    pub max_acked_ahead_per_partition: Option<u32>,
    pub partitions: Option<u32>,
}

/// A change to the topic metadata: what the command log holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Command {
    CreateTopic(TopicRecord),
    /// Alters the topic `name` if it is still incarnation `id`.
    AlterTopic {
        name: String,
        #[serde(with = "incarnation_hex")]
        id: IncarnationId,
        changes: TopicChanges,
    },
    /// Deletes the topic `name` if it is still incarnation `id`.
    DeleteTopic {
        name: String,
        #[serde(with = "incarnation_hex")]
        id: IncarnationId,
    },
}

/// What an applied command changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    Created(Arc<TopicRecord>),
    Altered {
        old: Arc<TopicRecord>,
        new: Arc<TopicRecord>,
    },
    Deleted(Arc<TopicRecord>),
}

/// Why a request or command was refused, or the store failed; each maps to the
/// HTTP status the reference answers with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetaError {
    /// 400: the request is malformed or breaks a rule.
    Invalid(String),
    /// 404: the topic does not exist.
    NotFound(String),
    /// 409: the request clashes with the current state.
    Conflict(String),
    /// 500: the metadata store failed, or found its files damaged.
    Io(String),
}

impl MetaError {
    /// The HTTP status of this error's answer.
    pub fn status(&self) -> u16 {
        match self {
            MetaError::Invalid(_) => 400,
            MetaError::NotFound(_) => 404,
            MetaError::Conflict(_) => 409,
            MetaError::Io(_) => 500,
        }
    }

    /// The message for the `{"error": …}` body.
    pub fn message(&self) -> &str {
        match self {
            MetaError::Invalid(m)
            | MetaError::NotFound(m)
            | MetaError::Conflict(m)
            | MetaError::Io(m) => m,
        }
    }
}

impl fmt::Display for MetaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for MetaError {}

/// Every topic, by name, and the index of the last command applied.
///
/// Records sit behind `Arc`, so a record handed out stays valid after later
/// commands, and the map shares its parts between copies: the control thread
/// publishes a copy for every change, and a shard drops the one before.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetaState {
    pub topics: TopicMap,
    /// The index of the last command applied; 0 before the first. Each applied
    /// command takes the next index, so a state is named by its version.
    pub version: u64,
}

impl MetaState {
    /// Applies `cmd` as the next command (index `version + 1`), or refuses it and
    /// changes nothing.
    pub fn apply(&mut self, cmd: &Command) -> Result<Applied, MetaError> {
        let applied = self.check(cmd)?;
        self.install(&applied);
        Ok(applied)
    }

    /// What `apply(cmd)` would change, without changing anything: the dry run a
    /// proposer makes before it logs a command.
    pub fn check(&self, cmd: &Command) -> Result<Applied, MetaError> {
        match cmd {
            Command::CreateTopic(record) => {
                check_record(record)?;
                self.check_name_free(&record.name)?;
                // The proposer drew the id fresh against the state it read; a
                // topic created since may hold it (64 random bits: about never).
                if self.topics.contains_id(record.id) {
                    return Err(MetaError::Conflict(format!(
                        "incarnation id {} is taken; retry the create",
                        record.id
                    )));
                }
                if self.topics.len() >= TOPICS_MAX {
                    return Err(MetaError::Conflict(format!(
                        "topic limit reached: at most {TOPICS_MAX} topics; delete one first"
                    )));
                }
                Ok(Applied::Created(Arc::new(record.clone())))
            }
            Command::AlterTopic { name, id, changes } => {
                let old = self.current(name, *id)?;
                let new = altered(&old, changes)?;
                Ok(Applied::Altered {
                    old,
                    new: Arc::new(new),
                })
            }
            Command::DeleteTopic { name, id } => Ok(Applied::Deleted(self.current(name, *id)?)),
        }
    }

    /// Installs what [`check`](Self::check) found against this same state.
    pub(super) fn install(&mut self, applied: &Applied) {
        let topics_before = self.topics.len();
        match applied {
            Applied::Created(new) => {
                let previous = self.topics.insert(Arc::clone(new));
                assert!(previous.is_none(), "create over an existing topic");
                assert_eq!(self.topics.len(), topics_before + 1);
            }
            Applied::Altered { old, new } => {
                assert_eq!((&old.name, old.id), (&new.name, new.id));
                let previous = self.topics.insert(Arc::clone(new));
                assert_eq!(previous.as_ref(), Some(old), "alter of a changed topic");
            }
            Applied::Deleted(old) => {
                let previous = self.topics.remove(old.name.as_str());
                assert_eq!(previous.as_ref(), Some(old), "delete of a changed topic");
            }
        }
        self.version += 1;
    }

    /// The topic named exactly `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<TopicRecord>> {
        self.topics.get(name)
    }

    /// One page of topics in name order, after `page_token` ("" for the first
    /// page), and the token of the next page: the last name when the page is full
    /// and more topics follow, else "". `limit` is clamped to 1..=[`LIST_LIMIT_MAX`];
    /// routes refuse a limit below 1 before they get here.
    pub fn list(&self, limit: usize, page_token: &str) -> (Vec<Arc<TopicRecord>>, String) {
        let limit = limit.clamp(1, LIST_LIMIT_MAX);
        // "" sorts below every name, and is none.
        let mut rest = self.topics.values_after(page_token);
        let page: Vec<Arc<TopicRecord>> = rest.by_ref().take(limit).cloned().collect();
        let more = rest.next().is_some();
        let next_page_token = match page.last() {
            Some(last) if more => last.name.clone(),
            _ => String::new(),
        };
        assert!(page.len() <= limit);
        (page, next_page_token)
    }

    /// The live record of `name` if it is still incarnation `id`.
    fn current(&self, name: &str, id: IncarnationId) -> Result<Arc<TopicRecord>, MetaError> {
        let record = self
            .topics
            .get(name)
            .ok_or_else(|| MetaError::NotFound(format!("topic {name} not found")))?;
        if record.id != id {
            return Err(MetaError::Conflict(CHANGED_SINCE_READ.to_string()));
        }
        Ok(Arc::clone(record))
    }

    /// 409 when `name`, or a name that differs from it only in case, is taken.
    /// Topic names map to directories, and a case-insensitive file system would
    /// merge two such topics.
    fn check_name_free(&self, name: &str) -> Result<(), MetaError> {
        if self.topics.contains_key(name) {
            return Err(MetaError::Conflict(format!("topic {name} already exists")));
        }
        if let Some(other) = self.topics.case_twin(name) {
            return Err(MetaError::Conflict(format!(
                "topic name {name} differs only in case from the existing topic {other}"
            )));
        }
        Ok(())
    }
}

/// The invariants every stored record keeps, whatever its proposer checked: the
/// state machine does not trust a command to have come through a request parser.
/// Limits that come from the node's configuration (`topic.max_partitions`) are the
/// parser's to enforce.
pub(super) fn check_record(record: &TopicRecord) -> Result<(), MetaError> {
    validate_topic_name(&record.name)?;
    check_retention(record.retention_ms)?;
    for (field, value) in [
        ("partitions", u64::from(record.partitions)),
        ("visibility_timeout_ms", record.visibility_timeout_ms),
        (
            "max_in_flight_per_partition",
            u64::from(record.max_in_flight_per_partition),
        ),
        (
            "max_acked_ahead_per_partition",
            u64::from(record.max_acked_ahead_per_partition),
        ),
    ] {
        if value == 0 {
            return Err(MetaError::Invalid(format!(
                "{field} must be greater than 0"
            )));
        }
    }
    Ok(())
}

/// 0 (forever) or at least an hour.
pub(super) fn check_retention(retention_ms: u64) -> Result<(), MetaError> {
    if retention_ms != 0 && retention_ms < RETENTION_MS_MIN {
        return Err(MetaError::Invalid(format!(
            "retention_ms must be 0 (forever) or at least {RETENTION_MS_MIN}, got {retention_ms}"
        )));
    }
    Ok(())
}

/// `old` with `changes`; refuses an empty change, a partition count that does not
/// grow, and values a record may not hold. A request checks that its partition
/// count grows the topic as it read it (400 there), so one that does not grow
/// it here lost a race with another alter: 409, as the reference answers a
/// topic changed since it was read, which a client may read again and retry.
fn altered(old: &TopicRecord, changes: &TopicChanges) -> Result<TopicRecord, MetaError> {
    if *changes == TopicChanges::default() {
        return Err(MetaError::Invalid(
            "nothing to change: give at least one of retention_ms, max_in_flight_per_partition, max_acked_ahead_per_partition, partitions".to_string(),
        ));
    }
    let mut new = old.clone();
    if let Some(retention_ms) = changes.retention_ms {
        new.retention_ms = retention_ms;
    }
    if let Some(max) = changes.max_in_flight_per_partition {
        new.max_in_flight_per_partition = max;
    }
    if let Some(max) = changes.max_acked_ahead_per_partition {
        new.max_acked_ahead_per_partition = max;
    }
    if let Some(partitions) = changes.partitions {
        if partitions <= old.partitions {
            return Err(MetaError::Conflict(format!(
                "{CHANGED_SINCE_READ}: partitions is {} now, not below {partitions}",
                old.partitions
            )));
        }
        new.partitions = partitions;
    }
    check_record(&new)?;
    Ok(new)
}

/// An [`IncarnationId`] as its lowercase hex digits (see its `Display`), on
/// disk and on the wire.
pub(super) mod incarnation_hex {
    use narad_shards::ids::IncarnationId;
    use serde::{de, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(id: &IncarnationId, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(id)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<IncarnationId, D::Error> {
        let text = String::deserialize(d)?;
        parse(&text).ok_or_else(|| de::Error::custom(format!("bad incarnation id {text:?}")))
    }

    /// Exactly the text `Display` writes (16 lowercase hex digits, or 32 for an
    /// id past 64 bits); anything else is damage.
    pub fn parse(text: &str) -> Option<IncarnationId> {
        if !matches!(text.len(), 16 | 32)
            || !text
                .bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b'a'..=b'f'))
        {
            return None;
        }
        let id = IncarnationId(u128::from_str_radix(text, 16).ok()?);
        (id.to_string() == text).then_some(id)
    }
}
