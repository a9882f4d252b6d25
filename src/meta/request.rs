//! Topic requests in, topic objects out: strict parsing of the JSON bodies of
//! `POST /v1/topics` and `PATCH /v1/topics/{topic}` into [`Command`]s, and the
//! reference's Topic object.
//!
//! Strict means a body that is not a JSON object, an unknown field, a value of the
//! wrong type, a float, a negative number or one past its field's range is 400,
//! and the message names the field: a client whose typo is silently ignored
//! believes it set something it did not. The rules are the reference's topic
//! configuration (section B), with this node's `topic.*` defaults.
//!
//! Which cores: whichever shard received the request; nothing here keeps state.

use narad_shards::ids::IncarnationId;
use serde_json::{json, Map, Value};

use super::state::{check_retention, Command, MetaError, TopicChanges, TopicRecord};
use crate::config::TopicDefaults;

/// The longest topic name, in characters (all ASCII, so also bytes).
pub const TOPIC_NAME_CHARS_MAX: usize = 200;
/// The fewest partitions a request may ask for, as the reference's "3..108".
pub const PARTITIONS_MIN: u32 = 3;

/// Fields of the reference that this version refuses rather than ignores.
const CREATE_UNSUPPORTED: [&str; 3] = ["schema", "parent", "fanout_delay_ms"];
const ALTER_UNSUPPORTED: [&str; 2] = ["schema", "schema_base_version"];
/// Create fields an alter may not change; named so, rather than called unknown.
const ALTER_FIXED: [&str; 2] = ["name", "visibility_timeout_ms"];

/// Every field a create body may hold.
const CREATE_FIELDS: [&str; 10] = [
    "name",
    "partitions",
    "retention_ms",
    "visibility_timeout_ms",
    "max_in_flight_per_partition",
    "max_acked_ahead_per_partition",
    "owner",
    "schema",
    "parent",
    "fanout_delay_ms",
];

/// Alter fields whose `null` means "not given". A `null` schema stays a 400 on
/// an alter, as in the reference: a schema is never removed.
const ALTER_NULLABLE: [&str; 5] = [
    "retention_ms",
    "max_in_flight_per_partition",
    "max_acked_ahead_per_partition",
    "partitions",
    "schema_base_version",
];

/// Every field an alter body may hold.
const ALTER_FIELDS: [&str; 6] = [
    "retention_ms",
    "max_in_flight_per_partition",
    "max_acked_ahead_per_partition",
    "partitions",
    "schema",
    "schema_base_version",
];

/// 400 unless `name` is 1–200 of `A-Za-z0-9._-` and not `.` or `..` (which would
/// name a directory other than the topic's own).
pub fn validate_topic_name(name: &str) -> Result<(), MetaError> {
    if name.is_empty() || name.len() > TOPIC_NAME_CHARS_MAX {
        return Err(MetaError::Invalid(format!(
            "name must be 1 to {TOPIC_NAME_CHARS_MAX} characters, got {}",
            name.chars().count()
        )));
    }
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    if !name.bytes().all(allowed) {
        return Err(MetaError::Invalid(
            "name may contain only A-Z, a-z, 0-9, '.', '_' and '-'".to_string(),
        ));
    }
    if name == "." || name == ".." {
        return Err(MetaError::Invalid(
            "name must not be \".\" or \"..\"".to_string(),
        ));
    }
    Ok(())
}

/// The create command for a `POST /v1/topics` body. The proposer picks the new
/// incarnation `id` and the creation time `now_s` (Unix seconds), so that applying
/// the command stays deterministic.
pub fn parse_create(
    body: &[u8],
    defaults: &TopicDefaults,
    id: IncarnationId,
    now_s: u64,
) -> Result<Command, MetaError> {
    let fields = parse_object(
        body,
        &CREATE_FIELDS[1..],
        &CREATE_FIELDS,
        &CREATE_UNSUPPORTED,
        &[],
    )?;
    let name = match fields.get("name") {
        // A `null` is a field not given, as for every other field.
        None | Some(Value::Null) => return Err(MetaError::Invalid("name is required".to_string())),
        Some(Value::String(name)) => name.clone(),
        Some(other) => return Err(wrong_type("name", "a string", other)),
    };
    validate_topic_name(&name)?;
    let partitions = match field_u32(&fields, "partitions")? {
        None => defaults.default_partitions,
        Some(p) => check_partitions(p, PARTITIONS_MIN, defaults)?,
    };
    let retention_ms = match field_ms(&fields, "retention_ms")? {
        None => defaults.default_retention_age_ms,
        Some(r) => {
            check_retention(r)?;
            r
        }
    };
    let visibility_timeout_ms = field_ms(&fields, "visibility_timeout_ms")?
        .map(|v| positive("visibility_timeout_ms", v))
        .transpose()?
        .unwrap_or(defaults.default_visibility_timeout_ms);
    let max_in_flight_per_partition = field_u32(&fields, "max_in_flight_per_partition")?
        .map(|v| positive("max_in_flight_per_partition", v))
        .transpose()?
        .unwrap_or(defaults.default_max_in_flight_per_partition);
    let max_acked_ahead_per_partition = field_u32(&fields, "max_acked_ahead_per_partition")?
        .map(|v| positive("max_acked_ahead_per_partition", v))
        .transpose()?
        .unwrap_or(defaults.default_max_acked_ahead_per_partition);
    // `owner` is accepted, whatever it holds, and ignored, as in the reference.
    Ok(Command::CreateTopic(TopicRecord {
        name,
        id,
        partitions,
        retention_ms,
        visibility_timeout_ms,
        max_in_flight_per_partition,
        max_acked_ahead_per_partition,
        created_at: now_s,
    }))
}

/// The alter command for a `PATCH /v1/topics/{topic}` body against the topic as
/// the request read it. A cap of 0 resets it to this node's default;
/// `retention_ms` follows the same rule as at create (0 keeps records
/// forever, as the reference's field rules say, so a PATCH of 0 never gives
/// a topic asked to keep everything the node's finite default); `partitions` may only
/// grow, up to `topic.max_partitions`.
pub fn parse_alter(
    body: &[u8],
    current: &TopicRecord,
    defaults: &TopicDefaults,
) -> Result<Command, MetaError> {
    let fields = parse_object(
        body,
        &ALTER_NULLABLE,
        &ALTER_FIELDS,
        &ALTER_UNSUPPORTED,
        &ALTER_FIXED,
    )?;
    let retention_ms = field_ms(&fields, "retention_ms")?
        .map(|r| check_retention(r).map(|()| r))
        .transpose()?;
    let or_default = |v: Option<u32>, default: u32| v.map(|v| if v == 0 { default } else { v });
    let max_in_flight_per_partition = or_default(
        field_u32(&fields, "max_in_flight_per_partition")?,
        defaults.default_max_in_flight_per_partition,
    );
    let max_acked_ahead_per_partition = or_default(
        field_u32(&fields, "max_acked_ahead_per_partition")?,
        defaults.default_max_acked_ahead_per_partition,
    );
    let partitions = match field_u32(&fields, "partitions")? {
        None => None,
        Some(p) if p <= current.partitions => {
            return Err(MetaError::Invalid(format!(
                "partitions can only grow: {p} is not larger than the current {}",
                current.partitions
            )))
        }
        Some(p) => Some(check_partitions(
            p,
            current.partitions.saturating_add(1),
            defaults,
        )?),
    };
    let changes = TopicChanges {
        retention_ms,
        max_in_flight_per_partition,
        max_acked_ahead_per_partition,
        partitions,
    };
    if changes == TopicChanges::default() {
        return Err(MetaError::Invalid(
            "nothing to change: give at least one of retention_ms, max_in_flight_per_partition, max_acked_ahead_per_partition, partitions".to_string(),
        ));
    }
    Ok(Command::AlterTopic {
        name: current.name.clone(),
        id: current.id,
        changes,
    })
}

/// The reference's Topic object. Roles, children and schemas do not exist yet, so
/// every topic is a standalone one with none.
pub fn topic_json(record: &TopicRecord) -> Value {
    json!({
        "name": record.name,
        "id": record.id.to_string(),
        "partitions": record.partitions,
        "retention_ms": record.retention_ms,
        "visibility_timeout_ms": record.visibility_timeout_ms,
        "max_in_flight_per_partition": record.max_in_flight_per_partition,
        "max_acked_ahead_per_partition": record.max_acked_ahead_per_partition,
        "created_at": record.created_at,
        "owner": "",
        "role": "standalone",
        "children": [],
        "parent": "",
        "attach_epoch": "",
        "fanout_delay_ms": 0,
        "attach_offsets": [],
    })
}

/// The body as a JSON object whose every field is in `known`, none in
/// `unsupported` (reference fields not implemented yet) or `fixed` (fields set at
/// creation only). A field of `nullable` that holds its "not given" value is
/// dropped first, as the reference's decoder reads it: `null`, and for the
/// fan-out fields of a standalone topic `"parent": ""` and `"fanout_delay_ms": 0`
/// (clients that always send every field send these).
fn parse_object(
    body: &[u8],
    nullable: &[&str],
    known: &[&str],
    unsupported: &[&str],
    fixed: &[&str],
) -> Result<Map<String, Value>, MetaError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| MetaError::Invalid(format!("request body is not valid JSON: {e}")))?;
    let Value::Object(mut fields) = value else {
        return Err(MetaError::Invalid(
            "request body must be a JSON object".to_string(),
        ));
    };
    // A field given twice is ambiguous: refused, as a batch produce refuses
    // it, rather than the last one taken.
    crate::json::refuse_duplicate_keys(body)
        .map_err(|e| MetaError::Invalid(format!("request body: {e}")))?;
    fields.retain(|field, value| {
        let not_given = match (field.as_str(), &*value) {
            (_, Value::Null) => true,
            ("parent", Value::String(parent)) => parent.is_empty(),
            ("fanout_delay_ms", Value::Number(delay)) => delay.as_u64() == Some(0),
            _ => false,
        };
        !(not_given && nullable.contains(&field.as_str()))
    });
    for field in fields.keys() {
        if unsupported.contains(&field.as_str()) {
            return Err(MetaError::Invalid(format!("{field} is not supported yet")));
        }
        if fixed.contains(&field.as_str()) {
            return Err(MetaError::Invalid(format!(
                "{field} cannot be changed after creation"
            )));
        }
        if !known.contains(&field.as_str()) {
            return Err(MetaError::Invalid(format!("unknown field \"{field}\"")));
        }
    }
    Ok(fields)
}

/// `field` as a non-negative integer, if present (a `null` was dropped as not
/// given before).
fn field_u64(fields: &Map<String, Value>, field: &str) -> Result<Option<u64>, MetaError> {
    match fields.get(field) {
        None => Ok(None),
        // A float (even `3.0`), a negative number, or one past u64 (which JSON
        // parsing turns into a float) has no u64 value.
        Some(value) => value
            .as_u64()
            .map(Some)
            .ok_or_else(|| wrong_type(field, "a non-negative integer", value)),
    }
}

/// A duration in milliseconds: at most `i64::MAX`, as the reference's
/// 64-bit signed fields hold (and a client's clock arithmetic expects).
fn field_ms(fields: &Map<String, Value>, field: &str) -> Result<Option<u64>, MetaError> {
    let Some(value) = field_u64(fields, field)? else {
        return Ok(None);
    };
    if value > i64::MAX as u64 {
        return Err(MetaError::Invalid(format!(
            "{field} must be at most {}, got {value}",
            i64::MAX
        )));
    }
    Ok(Some(value))
}

fn field_u32(fields: &Map<String, Value>, field: &str) -> Result<Option<u32>, MetaError> {
    let Some(value) = field_u64(fields, field)? else {
        return Ok(None);
    };
    u32::try_from(value).map(Some).map_err(|_| {
        MetaError::Invalid(format!("{field} must be at most {}, got {value}", u32::MAX))
    })
}

fn wrong_type(field: &str, expected: &str, got: &Value) -> MetaError {
    let got = match got {
        Value::Null => "null".to_string(),
        Value::Bool(_) => "a boolean".to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(_) => "a string".to_string(),
        Value::Array(_) => "an array".to_string(),
        Value::Object(_) => "an object".to_string(),
    };
    MetaError::Invalid(format!("{field} must be {expected}, got {got}"))
}

fn positive<T: PartialEq + Default>(field: &str, value: T) -> Result<T, MetaError> {
    if value == T::default() {
        return Err(MetaError::Invalid(format!(
            "{field} must be greater than 0"
        )));
    }
    Ok(value)
}

fn check_partitions(partitions: u32, min: u32, defaults: &TopicDefaults) -> Result<u32, MetaError> {
    let max = defaults.max_partitions;
    if min > max {
        // A topic created under a larger `topic.max_partitions` than now.
        return Err(MetaError::Invalid(format!(
            "partitions cannot grow past topic.max_partitions ({max}), got {partitions}"
        )));
    }
    if !(min..=max).contains(&partitions) {
        return Err(MetaError::Invalid(format!(
            "partitions must be between {min} and {max} (topic.max_partitions), got {partitions}"
        )));
    }
    Ok(partitions)
}
