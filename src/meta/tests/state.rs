//! The state machine: conflict rules, refusals that change nothing, pagination,
//! and the serialized form of commands.

use std::sync::Arc;

use super::*;

fn state_with(names: &[&str]) -> MetaState {
    let mut state = MetaState::default();
    for (i, name) in names.iter().enumerate() {
        state.apply(&create(name, i as u128 + 1)).unwrap();
    }
    state
}

/// Applies `cmd`, which must be refused with `status`, and checks that the state
/// (records and version) did not move.
#[track_caller]
fn assert_refused_unchanged(state: &mut MetaState, cmd: Command, status: u16, words: &[&str]) {
    let before = state.clone();
    assert_refused(state.check(&cmd), status, words);
    assert_refused(state.apply(&cmd), status, words);
    assert_eq!(*state, before);
}

#[test]
fn create_alter_delete_report_what_changed() {
    let mut state = MetaState::default();
    let created = state.apply(&create("orders", 7)).unwrap();
    assert_eq!(created, Applied::Created(Arc::new(record("orders", 7))));
    assert_eq!(state.version, 1);

    let changes = TopicChanges {
        partitions: Some(5),
        retention_ms: Some(0),
        max_in_flight_per_partition: Some(1),
        max_acked_ahead_per_partition: Some(2),
    };
    let Applied::Altered { old, new } = state.apply(&alter("orders", 7, changes)).unwrap() else {
        panic!("not an alter");
    };
    assert_eq!(*old, record("orders", 7));
    let expected = TopicRecord {
        partitions: 5,
        retention_ms: 0,
        max_in_flight_per_partition: 1,
        max_acked_ahead_per_partition: 2,
        ..record("orders", 7)
    };
    assert_eq!(*new, expected);
    assert_eq!(**state.get("orders").unwrap(), expected);
    assert_eq!(state.version, 2);

    let deleted = state.apply(&delete("orders", 7)).unwrap();
    assert_eq!(deleted, Applied::Deleted(Arc::new(expected)));
    assert!(state.get("orders").is_none());
    assert_eq!(state.version, 3);

    // The name is free again; a new incarnation takes it.
    state.apply(&create("orders", 8)).unwrap();
    assert_eq!(state.get("orders").unwrap().id, IncarnationId(8));
}

#[test]
fn create_refuses_a_taken_name_or_a_case_only_clash() {
    let mut state = state_with(&["Orders"]);
    assert_refused_unchanged(&mut state, create("Orders", 9), 409, &["already exists"]);
    for clash in ["orders", "ORDERS", "oRdErS"] {
        assert_refused_unchanged(
            &mut state,
            create(clash, 9),
            409,
            &["only in case", "Orders"],
        );
    }
    state.apply(&create("Orders2", 9)).unwrap();
    // An incarnation id another topic holds (the proposer drew it against an
    // older state) is refused too, and a retry with a fresh one goes through.
    assert_refused_unchanged(
        &mut state,
        create("Payments", 9),
        409,
        &["incarnation id", "retry"],
    );
    state.apply(&create("Payments", 10)).unwrap();
}

#[test]
fn alter_and_delete_need_the_topic_and_its_incarnation() {
    let mut state = state_with(&["t"]);
    assert_refused_unchanged(
        &mut state,
        alter("u", 1, retention(0)),
        404,
        &["u", "not found"],
    );
    assert_refused_unchanged(&mut state, delete("u", 1), 404, &["not found"]);
    // Names are exact: a case variant is another, missing, topic.
    assert_refused_unchanged(&mut state, delete("T", 1), 404, &["not found"]);
    assert_refused_unchanged(
        &mut state,
        alter("t", 2, retention(0)),
        409,
        &[CHANGED_SINCE_READ],
    );
    assert_refused_unchanged(&mut state, delete("t", 2), 409, &[CHANGED_SINCE_READ]);
}

#[test]
fn a_command_validated_against_an_older_state_fails_cleanly() {
    // Two requests read topic t (incarnation 1); one deletes and recreates it, and
    // the other's alter then arrives.
    let mut state = state_with(&["t"]);
    state.apply(&delete("t", 1)).unwrap();
    state.apply(&create("t", 2)).unwrap();
    assert_refused_unchanged(
        &mut state,
        alter("t", 1, retention(0)),
        409,
        &[CHANGED_SINCE_READ],
    );
    // Two creates of one name, both valid when parsed.
    assert_refused_unchanged(&mut state, create("t", 3), 409, &["already exists"]);
}

#[test]
fn alter_refuses_empty_shrinking_and_invalid_changes() {
    let mut state = state_with(&["t"]);
    let partitions = |p| TopicChanges {
        partitions: Some(p),
        ..TopicChanges::default()
    };
    assert_refused_unchanged(
        &mut state,
        alter("t", 1, TopicChanges::default()),
        400,
        &["nothing"],
    );
    // The request refused these against the topic it read (400); here they
    // mean another alter grew it first.
    assert_refused_unchanged(
        &mut state,
        alter("t", 1, partitions(3)),
        409,
        &[CHANGED_SINCE_READ, "partitions is 3 now"],
    );
    assert_refused_unchanged(
        &mut state,
        alter("t", 1, partitions(2)),
        409,
        &[CHANGED_SINCE_READ],
    );
    assert_refused_unchanged(
        &mut state,
        alter("t", 1, retention(5)),
        400,
        &["retention_ms"],
    );
    let zero_limit = TopicChanges {
        max_in_flight_per_partition: Some(0),
        partitions: Some(4),
        ..TopicChanges::default()
    };
    // One bad change refuses the whole command: nothing of it is applied.
    assert_refused_unchanged(
        &mut state,
        alter("t", 1, zero_limit),
        400,
        &["max_in_flight"],
    );
    state.apply(&alter("t", 1, partitions(4))).unwrap();
}

#[test]
fn create_refuses_records_that_break_the_invariants() {
    let mut state = MetaState::default();
    let mut bad = vec![
        (
            TopicRecord {
                partitions: 0,
                ..record("t", 1)
            },
            "partitions",
        ),
        (
            TopicRecord {
                retention_ms: 1,
                ..record("t", 1)
            },
            "retention_ms",
        ),
        (
            TopicRecord {
                visibility_timeout_ms: 0,
                ..record("t", 1)
            },
            "visibility",
        ),
        (
            TopicRecord {
                max_acked_ahead_per_partition: 0,
                ..record("t", 1)
            },
            "acked",
        ),
    ];
    bad.push((record("..", 1), "name"));
    bad.push((record("a/b", 1), "name"));
    for (record, word) in bad {
        assert_refused_unchanged(&mut state, Command::CreateTopic(record), 400, &[word]);
    }
    assert_eq!(state.version, 0);
}

#[test]
fn list_pages_by_name_with_the_last_name_as_token() {
    let state = state_with(&["d", "b", "e", "a", "c"]);
    let names = |page: &[Arc<TopicRecord>]| page.iter().map(|r| r.name.clone()).collect::<Vec<_>>();

    let (page, token) = state.list(2, "");
    assert_eq!(
        (names(&page), token.as_str()),
        (vec!["a".into(), "b".into()], "b")
    );
    let (page, token) = state.list(2, &token);
    assert_eq!(
        (names(&page), token.as_str()),
        (vec!["c".into(), "d".into()], "d")
    );
    let (page, token) = state.list(2, &token);
    assert_eq!((names(&page), token.as_str()), (vec!["e".into()], ""));

    // A page that ends exactly at the last topic says there is no next page.
    assert_eq!(state.list(5, "").1, "");
    assert_eq!(state.list(4, "a").1, "");
    assert_eq!(names(&state.list(100, "").0).len(), 5);
    // The token is a position, not a topic: one that names no topic (deleted since,
    // or between two names) still pages on from where it sorts.
    assert_eq!(names(&state.list(10, "bb").0), vec!["c", "d", "e"]);
    assert!(state.list(10, "z").0.is_empty());
    assert_eq!(state.list(10, "z").1, "");
    // Limits are clamped into 1..=LIST_LIMIT_MAX.
    assert_eq!(state.list(0, "").0.len(), 1);
    assert!(MetaState::default().list(10, "").0.is_empty());
}

#[test]
fn list_clamps_a_page_to_the_maximum() {
    let mut state = MetaState::default();
    for i in 0..LIST_LIMIT_MAX + 1 {
        state
            .apply(&create(&format!("t{i:05}"), i as u128))
            .unwrap();
    }
    let (page, token) = state.list(usize::MAX, "");
    assert_eq!(page.len(), LIST_LIMIT_MAX);
    assert_eq!(token, page.last().unwrap().name);
    let (rest, token) = state.list(usize::MAX, &token);
    assert_eq!((rest.len(), token.as_str()), (1, ""));
}

#[test]
fn commands_serialize_with_hex_ids_and_refuse_unknown_fields() {
    let commands = [
        create("t", u128::MAX),
        alter("t", 1, retention(0)),
        delete("t", 0xfeed),
    ];
    for cmd in &commands {
        let text = serde_json::to_string(cmd).unwrap();
        assert_eq!(serde_json::from_str::<Command>(&text).unwrap(), *cmd);
    }
    let text = serde_json::to_string(&delete("t", 0xfeed)).unwrap();
    assert_eq!(
        text,
        r#"{"op":"delete_topic","name":"t","id":"000000000000feed"}"#
    );
    // An id past 64 bits keeps its 32 digits.
    let old = delete("t", 0x1_0000_0000_0000_feed);
    let text = serde_json::to_string(&old).unwrap();
    assert!(
        text.contains(r#""id":"0000000000000001000000000000feed""#),
        "{text}"
    );
    assert_eq!(serde_json::from_str::<Command>(&text).unwrap(), old);
    for bad in [
        r#"{"op":"delete_topic","name":"t","id":"feed"}"#,
        r#"{"op":"delete_topic","name":"t","id":"000000000000feeg"}"#,
        r#"{"op":"delete_topic","name":"t","id":"000000000000FEED"}"#,
        // Not as written: a 64-bit id in 32 digits.
        r#"{"op":"delete_topic","name":"t","id":"0000000000000000000000000000feed"}"#,
        r#"{"op":"delete_topic","name":"t","id":"000000000000feed","x":1}"#,
        r#"{"op":"purge_topic","name":"t","id":"000000000000feed"}"#,
    ] {
        assert!(serde_json::from_str::<Command>(bad).is_err(), "{bad}");
    }
    let mut created = serde_json::to_value(create("t", 1)).unwrap();
    created["schema"] = serde_json::json!({});
    assert!(serde_json::from_value::<Command>(created).is_err());
}

#[test]
fn errors_map_to_the_reference_statuses() {
    let cases = [
        (MetaError::Invalid("a".into()), 400),
        (MetaError::NotFound("b".into()), 404),
        (MetaError::Conflict("c".into()), 409),
        (MetaError::Io("d".into()), 500),
    ];
    for (error, status) in cases {
        assert_eq!(error.status(), status);
        assert_eq!(error.to_string(), error.message());
    }
}

/// The topic cap: a create past it is refused (and changes nothing), a delete
/// makes room again.
#[test]
fn creates_stop_at_the_topic_cap() {
    let mut state = MetaState::default();
    for i in 0..TOPICS_MAX {
        let applied = Applied::Created(Arc::new(record(&format!("t{i}"), i as u128 + 1)));
        state.install(&applied);
    }
    assert_refused_unchanged(
        &mut state,
        create("one-more", u128::MAX),
        409,
        &["topic limit"],
    );
    state.apply(&delete("t0", 1)).unwrap();
    state.apply(&create("one-more", u128::MAX)).unwrap();
}
