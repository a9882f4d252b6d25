//! The rules of create and alter bodies (reference section B), and the Topic
//! object.

use super::*;
use serde_json::json;

const ID: IncarnationId = IncarnationId(0xabc);
const NOW_S: u64 = 1_700_000_123;

fn create_body(body: &str) -> Result<TopicRecord, MetaError> {
    match parse_create(body.as_bytes(), &defaults(), ID, NOW_S)? {
        Command::CreateTopic(record) => Ok(record),
        other => panic!("not a create: {other:?}"),
    }
}

fn create_json(value: serde_json::Value) -> Result<TopicRecord, MetaError> {
    create_body(&value.to_string())
}

fn alter_json(current: &TopicRecord, value: serde_json::Value) -> Result<TopicChanges, MetaError> {
    match parse_alter(value.to_string().as_bytes(), current, &defaults())? {
        Command::AlterTopic { name, id, changes } => {
            assert_eq!((name.as_str(), id), (current.name.as_str(), current.id));
            Ok(changes)
        }
        other => panic!("not an alter: {other:?}"),
    }
}

#[test]
fn create_with_only_a_name_takes_the_defaults() {
    let record = create_json(json!({"name": "orders"})).unwrap();
    assert_eq!(
        record,
        TopicRecord {
            name: "orders".to_string(),
            id: ID,
            partitions: 3,
            retention_ms: 604_800_000,
            visibility_timeout_ms: 30_000,
            max_in_flight_per_partition: 1024,
            max_acked_ahead_per_partition: 1024,
            created_at: NOW_S,
        }
    );
}

#[test]
fn create_takes_every_field_given() {
    let record = create_json(json!({
        "name": "a.B_c-9",
        "partitions": 108,
        "retention_ms": 3_600_000,
        "visibility_timeout_ms": 1,
        "max_in_flight_per_partition": 7,
        "max_acked_ahead_per_partition": 4_294_967_295u64,
        "owner": "alice",
    }))
    .unwrap();
    assert_eq!(record.name, "a.B_c-9");
    assert_eq!(record.partitions, 108);
    assert_eq!(record.retention_ms, 3_600_000);
    assert_eq!(record.visibility_timeout_ms, 1);
    assert_eq!(record.max_in_flight_per_partition, 7);
    assert_eq!(record.max_acked_ahead_per_partition, u32::MAX);
}

/// A field given twice is refused, on create and on alter, whatever the
/// values: the request is ambiguous.
#[test]
fn a_field_given_twice_is_refused() {
    assert_refused(
        create_body(r#"{"name":"a","name":"b"}"#),
        400,
        &["duplicate field \"name\""],
    );
    assert_refused(
        create_body(r#"{"name":"a","partitions":3,"partitions":3}"#),
        400,
        &["duplicate field"],
    );
    assert!(create_body(r#"{"name":"a","partitions":3}"#).is_ok());
    let current = create_json(json!({"name": "t"})).unwrap();
    let alter = parse_alter(
        br#"{"retention_ms":3600000,"retention_ms":0}"#,
        &current,
        &defaults(),
    );
    assert_refused(alter, 400, &["duplicate field \"retention_ms\""]);
}

/// Durations in milliseconds are 64-bit signed in the reference: past
/// `i64::MAX` is bad input, at it is taken.
#[test]
fn millisecond_fields_stop_at_i64_max() {
    let max = i64::MAX as u64;
    for field in ["retention_ms", "visibility_timeout_ms"] {
        let record = create_json(json!({"name": "t", field: max})).unwrap();
        assert_eq!(
            serde_json::to_value(&record).unwrap()[field].as_u64(),
            Some(max)
        );
        assert_refused(
            create_json(json!({"name": "t", field: max + 1})),
            400,
            &[field, "at most 9223372036854775807"],
        );
        assert_refused(
            create_json(json!({"name": "t", field: u64::MAX})),
            400,
            &[field],
        );
    }
    let current = create_json(json!({"name": "t"})).unwrap();
    assert_eq!(
        alter_json(&current, json!({"retention_ms": max}))
            .unwrap()
            .retention_ms,
        Some(max)
    );
    assert_refused(
        alter_json(&current, json!({"retention_ms": max + 1})),
        400,
        &["retention_ms", "at most"],
    );
}

#[test]
fn topic_names_follow_the_reference() {
    for good in [
        "a",
        "...",
        "A.b-c_d",
        "0",
        &"x".repeat(TOPIC_NAME_CHARS_MAX),
    ] {
        assert!(validate_topic_name(good).is_ok(), "{good}");
        assert_eq!(create_json(json!({ "name": good })).unwrap().name, good);
    }
    for bad in [
        "",
        ".",
        "..",
        "a/b",
        "a b",
        "é",
        "a\0",
        "a:b",
        &"x".repeat(201),
    ] {
        assert_refused(validate_topic_name(bad), 400, &["name"]);
        assert_refused(create_json(json!({ "name": bad })), 400, &["name"]);
    }
    assert_refused(create_json(json!({})), 400, &["name is required"]);
    assert_refused(
        create_json(json!({"name": null})),
        400,
        &["name is required"],
    );
    assert_refused(
        create_json(json!({"name": 7})),
        400,
        &["name must be a string"],
    );
    assert_refused(create_json(json!({"name": null})), 400, &["name"]);
}

#[test]
fn partitions_are_3_to_max_partitions() {
    for ok in [3, 4, 108] {
        assert_eq!(
            create_json(json!({"name": "t", "partitions": ok}))
                .unwrap()
                .partitions,
            ok
        );
    }
    for bad in [0, 1, 2, 109, 1000] {
        assert_refused(
            create_json(json!({"name": "t", "partitions": bad})),
            400,
            &["partitions", "between 3 and 108"],
        );
    }
}

#[test]
fn numbers_must_be_non_negative_integers_in_range() {
    let fields = [
        "partitions",
        "retention_ms",
        "visibility_timeout_ms",
        "max_in_flight_per_partition",
        "max_acked_ahead_per_partition",
    ];
    for field in fields {
        for bad in [
            "-1",
            "3.0",
            "3.5",
            "\"3\"",
            "true",
            "[3]",
            "{}",
            "1e40",
            "18446744073709551616",
        ] {
            let body = format!(r#"{{"name":"t","{field}":{bad}}}"#);
            assert_refused(create_body(&body), 400, &[field]);
        }
    }
    for field in [
        "partitions",
        "max_in_flight_per_partition",
        "max_acked_ahead_per_partition",
    ] {
        assert_refused(
            create_json(json!({"name": "t", field: 4_294_967_296u64})),
            400,
            &[field, "at most"],
        );
    }
}

#[test]
fn retention_is_forever_or_at_least_an_hour() {
    let retention = |v: serde_json::Value| create_json(json!({"name": "t", "retention_ms": v}));
    assert_eq!(retention(json!(0)).unwrap().retention_ms, 0);
    assert_eq!(retention(json!(3_600_000)).unwrap().retention_ms, 3_600_000);
    let max = i64::MAX as u64;
    assert_eq!(retention(json!(max)).unwrap().retention_ms, max);
    for bad in [1, 1000, 3_599_999] {
        assert_refused(retention(json!(bad)), 400, &["retention_ms", "3600000"]);
    }
}

#[test]
fn limits_and_timeout_must_be_positive() {
    for field in [
        "visibility_timeout_ms",
        "max_in_flight_per_partition",
        "max_acked_ahead_per_partition",
    ] {
        assert_refused(
            create_json(json!({"name": "t", field: 0})),
            400,
            &[field, "greater than 0"],
        );
    }
}

#[test]
fn owner_is_accepted_and_ignored() {
    for owner in [json!("bob"), json!(null), json!(7), json!({"x": 1})] {
        let record = create_json(json!({"name": "t", "owner": owner})).unwrap();
        assert_eq!(record, create_json(json!({"name": "t"})).unwrap());
    }
}

#[test]
fn null_and_the_standalone_values_mean_not_given() {
    let plain = create_json(json!({"name": "t"})).unwrap();
    for field in CREATE_FIELDS_BUT_NAME {
        let with_null = create_json(json!({"name": "t", field: null})).unwrap();
        assert_eq!(with_null, plain, "{field}: null");
    }
    let standalone = json!({"name": "t", "parent": "", "fanout_delay_ms": 0, "schema": null});
    assert_eq!(create_json(standalone).unwrap(), plain);
    // A null name is still no name.
    assert_refused(create_json(json!({"name": null})), 400, &["name"]);
    let current = record("t", 1);
    for field in [
        "retention_ms",
        "max_in_flight_per_partition",
        "max_acked_ahead_per_partition",
        "schema_base_version",
    ] {
        assert_eq!(
            alter_json(&current, json!({ field: null, "partitions": 4 })).unwrap(),
            alter_json(&current, json!({"partitions": 4})).unwrap(),
            "{field}: null"
        );
    }
    assert_refused(
        alter_json(&current, json!({"retention_ms": null})),
        400,
        &["nothing to change"],
    );
}

const CREATE_FIELDS_BUT_NAME: [&str; 9] = [
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

#[test]
fn unsupported_and_unknown_create_fields_are_400() {
    for (field, values) in [
        ("schema", vec![json!(true), json!("p"), json!(0), json!({})]),
        ("parent", vec![json!(true), json!("p"), json!(0)]),
        ("fanout_delay_ms", vec![json!(true), json!("p"), json!(1)]),
    ] {
        for value in values {
            assert_refused(
                create_json(json!({"name": "t", field: value})),
                400,
                &[&format!("{field} is not supported yet")],
            );
        }
    }
    for field in ["Name", "partition", "id", "created_at", "role", ""] {
        assert_refused(
            create_json(json!({"name": "t", field: 1})),
            400,
            &["unknown field", &format!("\"{field}\"")],
        );
    }
}

#[test]
fn bodies_that_are_not_json_objects_are_400() {
    for body in [
        "",
        "{",
        "nope",
        "[]",
        "\"t\"",
        "null",
        "3",
        "{\"name\":\"t\"} x",
    ] {
        assert_refused(create_body(body), 400, &["request body"]);
        assert_refused(
            parse_alter(body.as_bytes(), &record("t", 1), &defaults()),
            400,
            &["request body"],
        );
    }
}

#[test]
fn alter_needs_at_least_one_change() {
    let current = record("t", 1);
    assert_refused(alter_json(&current, json!({})), 400, &["nothing to change"]);
    assert_refused(
        parse_alter(b"{}", &current, &defaults()),
        400,
        &["at least one"],
    );
}

#[test]
fn alter_takes_each_change_zero_caps_mean_the_default_and_zero_retention_forever() {
    let mut current = record("t", 1);
    current.retention_ms = 0;
    current.max_in_flight_per_partition = 5;
    current.max_acked_ahead_per_partition = 6;
    assert_eq!(
        alter_json(
            &current,
            json!({
                "retention_ms": 7_200_000,
                "max_in_flight_per_partition": 9,
                "max_acked_ahead_per_partition": 10,
                "partitions": 4,
            })
        )
        .unwrap(),
        TopicChanges {
            retention_ms: Some(7_200_000),
            max_in_flight_per_partition: Some(9),
            max_acked_ahead_per_partition: Some(10),
            partitions: Some(4),
        }
    );
    let reset = json!({
        "retention_ms": 0,
        "max_in_flight_per_partition": 0,
        "max_acked_ahead_per_partition": 0,
    });
    assert_eq!(
        alter_json(&current, reset).unwrap(),
        TopicChanges {
            // Forever, as at create: never the node's default.
            retention_ms: Some(0),
            max_in_flight_per_partition: Some(1024),
            max_acked_ahead_per_partition: Some(1024),
            partitions: None,
        }
    );
}

#[test]
fn alter_partitions_only_grow_up_to_the_maximum() {
    let mut current = record("t", 1);
    current.partitions = 10;
    for bad in [0, 3, 9, 10] {
        assert_refused(
            alter_json(&current, json!({ "partitions": bad })),
            400,
            &["partitions", "not larger than the current 10"],
        );
    }
    assert_refused(
        alter_json(&current, json!({"partitions": 109})),
        400,
        &["partitions", "between 11 and 108"],
    );
    let grown = alter_json(&current, json!({"partitions": 108})).unwrap();
    assert_eq!(grown.partitions, Some(108));
    // Created under a larger maximum than the node's now: it cannot grow.
    current.partitions = 108;
    let mut lower = defaults();
    lower.max_partitions = 10;
    let body = json!({"partitions": 109}).to_string();
    assert_refused(
        parse_alter(body.as_bytes(), &current, &lower),
        400,
        &["cannot grow past topic.max_partitions (10), got 109"],
    );
}

#[test]
fn alter_checks_values_like_create() {
    let current = record("t", 1);
    assert_refused(
        alter_json(&current, json!({"retention_ms": 60_000})),
        400,
        &["retention_ms"],
    );
    for field in [
        "retention_ms",
        "max_in_flight_per_partition",
        "max_acked_ahead_per_partition",
        "partitions",
    ] {
        for bad in [json!(-1), json!(1.5), json!("4"), json!(1e40)] {
            assert_refused(alter_json(&current, json!({ field: bad })), 400, &[field]);
        }
    }
}

#[test]
fn alter_refuses_unsupported_fixed_and_unknown_fields() {
    let current = record("t", 1);
    for (field, value) in [("schema", json!(null)), ("schema_base_version", json!(1))] {
        assert_refused(
            alter_json(&current, json!({ field: value, "partitions": 4 })),
            400,
            &[&format!("{field} is not supported yet")],
        );
    }
    for field in ["name", "visibility_timeout_ms"] {
        assert_refused(
            alter_json(&current, json!({ field: 1, "partitions": 4 })),
            400,
            &[&format!("{field} cannot be changed")],
        );
    }
    for field in ["owner", "parent", "fanout_delay_ms", "retention"] {
        assert_refused(
            alter_json(&current, json!({ field: 1, "partitions": 4 })),
            400,
            &["unknown field", field],
        );
    }
}

#[test]
fn topic_json_is_the_reference_topic_object() {
    let mut record = record("orders", 0x0123_4567_89ab_cdef_0011_2233_4455_6677);
    record.retention_ms = 0;
    assert_eq!(
        topic_json(&record),
        json!({
            "name": "orders",
            "id": "0123456789abcdef0011223344556677",
            "partitions": 3,
            "retention_ms": 0,
            "visibility_timeout_ms": 30_000,
            "max_in_flight_per_partition": 1024,
            "max_acked_ahead_per_partition": 1024,
            "created_at": 1_700_000_000,
            "owner": "",
            "role": "standalone",
            "children": [],
            "parent": "",
            "attach_epoch": "",
            "fanout_delay_ms": 0,
            "attach_offsets": [],
        })
    );
    assert_eq!(topic_json(&self::record("t", 1))["id"], "0000000000000001");
}
