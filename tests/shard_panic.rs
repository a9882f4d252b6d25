//! A shard that panics stops the node instead of leaving it half alive: the
//! process exits (non-zero) within bounded time, whether the panic comes before
//! the shard has started or while it serves, and a restart over the same data
//! keeps every acknowledged record. Uses the debug-build-only hook
//! `NARAD_DEBUG_PANIC` (see `src/lifecycle.rs`). And a delete whose metadata
//! sync failed, settled by the next start (`NARAD_DEBUG_META_SYNC_FAIL`).

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;

/// How long a node may take to stop after a shard panics.
const STOP_MAX: Duration = Duration::from_secs(30);

#[test]
fn a_shard_that_panics_at_its_start_stops_the_node() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut node = Node::spawn(
        &dir.path().join("data"),
        2,
        &[("NARAD_DEBUG_PANIC", "start:1")],
    );
    let status = node.wait_for_exit(STOP_MAX);
    assert!(!status.success(), "exit status {status:?}");
    node.wait_for_log("shard 1 panicked");
}

#[test]
fn a_shard_that_panics_while_serving_stops_the_node_and_loses_no_acknowledged_record() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    let mut node = Node::start_in(&data, 2, &[("NARAD_DEBUG_PANIC", "produce:boom")]);
    let mut client = node.client();
    let created = post_topic(&mut client, r#"{"name":"kept","partitions":4}"#);
    assert_eq!(created.status, 201, "{created:?}");
    create_topic(&mut client, "boom");
    let mut acked = HashSet::new();
    for i in 0..60 {
        // A fresh connection each time, so both shards accept some.
        let payload = format!("record-{i}");
        produce_ok(&mut node.client(), "kept", "", payload.as_bytes());
        acked.insert(payload);
    }
    // Whichever shard accepts this produce panics.
    let mut doomed = node.client();
    let answer = doomed.request("POST", "/v1/topics/boom/produce", &OCTET, "x");
    assert!(answer.is_err(), "the panicking shard answered: {answer:?}");
    let status = node.wait_for_exit(STOP_MAX);
    assert!(!status.success(), "exit status {status:?}");
    node.wait_for_log("panicked and serves nothing");
    drop(node);

    let node = Node::start_in(&data, 2, &[]);
    let mut client = node.client();
    let mut seen = HashSet::new();
    wait_until(
        STOP_MAX,
        "every acknowledged record visible after the restart",
        || {
            seen.clear();
            for partition in 0..4 {
                for message in replay_all(&mut client, "kept", partition) {
                    seen.insert(message["payload"].as_str().unwrap().to_string());
                }
            }
            (seen == acked).then_some(())
        },
    );
}

/// After a panic stopped the node (here the control plane's, which leaves
/// every shard draining), one stop signal ends the drain at once: the
/// operator's first SIGTERM is not taken for the one that began the stop.
#[test]
fn a_stop_signal_while_a_panic_drains_the_node_exits_at_once() {
    use std::io::Write;
    let mut node = Node::start_shards(
        1,
        &[
            ("NARAD_DEBUG_PANIC", "create:boom"),
            ("NARAD_HTTP_SHUTDOWN_GRACE", "60s"),
            ("NARAD_HTTP_READ_TIMEOUT", "60s"),
        ],
    );
    let mut client = node.client();
    create_topic(&mut client, "slow");
    // A request whose body never finishes keeps the drain going for the grace.
    let mut slow = node.client();
    slow.stream
        .write_all(
            b"POST /v1/topics/slow/produce HTTP/1.1\r\nhost: test\r\n\
              content-type: application/octet-stream\r\ncontent-length: 1000\r\n\r\nab",
        )
        .unwrap();
    let answer = post_topic(&mut client, r#"{"name":"boom"}"#);
    assert_eq!(answer.status, 500, "{answer:?}");
    node.wait_for_log("the control plane panicked");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        node.child.try_wait().unwrap().is_none(),
        "the drain waits for the unfinished request"
    );
    let signalled = std::time::Instant::now();
    node.sigterm();
    let status = node.wait_for_exit(Duration::from_secs(10));
    assert!(!status.success(), "exit status {status:?}");
    assert!(signalled.elapsed() < Duration::from_secs(5));
    node.wait_for_log("stop signal while the node already stops");
    drop(slow);
}

/// The control thread (the metadata's single writer) that panics stops the
/// node too: without it no topic can be created, altered or deleted, and a
/// node left "ready" would answer every such request 500 for good.
#[test]
fn a_control_plane_that_panics_stops_the_node() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    let mut node = Node::start_in(&data, 1, &[("NARAD_DEBUG_PANIC", "create:boom")]);
    let mut client = node.client();
    create_topic(&mut client, "kept");
    let answer = post_topic(&mut client, r#"{"name":"boom"}"#);
    assert_eq!(answer.status, 500, "{answer:?}");
    let status = node.wait_for_exit(STOP_MAX);
    assert!(!status.success(), "exit status {status:?}");
    node.wait_for_log("the control plane panicked");
    drop(node);

    let node = Node::start_in(&data, 1, &[]);
    let mut client = node.client();
    let kept = client.request("GET", "/v1/topics/kept", &[], "").unwrap();
    assert_eq!(kept.status, 200, "{kept:?}");
    let boom = client.request("GET", "/v1/topics/boom", &[], "").unwrap();
    assert_eq!(boom.status, 404, "the create never applied: {boom:?}");
}

#[test]
fn a_delete_cut_short_after_it_applied_is_finished_at_the_next_start() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    let mut node = Node::start_in(&data, 1, &[("NARAD_DEBUG_PANIC", "delete:doomed")]);
    let mut client = node.client();
    topic_with_records(&mut client, "doomed");
    // The shard panics after the delete is applied, before the data is set aside.
    let answer = client.request("DELETE", "/v1/topics/doomed", &[], "");
    assert!(answer.is_err(), "the panicking shard answered: {answer:?}");
    let status = node.wait_for_exit(STOP_MAX);
    assert!(!status.success(), "exit status {status:?}");
    drop(node);
    restart_finds_the_delete_done(&data, "doomed");
}

/// Creates `topic` and commits a few records to each of its partitions.
fn topic_with_records(client: &mut Client, topic: &str) {
    create_topic(client, topic);
    for i in 0..9 {
        produce_ok(client, topic, "", format!("record-{i}").as_bytes());
    }
    wait_for_total(client, topic, 3, 9, STOP_MAX);
}

/// Starts a node over `data`, which a stopped node left holding the data of
/// `topic`, deleted: the topic is gone, and so is its data, removed rather than
/// kept as data of unknown origin in quarantine.
fn restart_finds_the_delete_done(data: &std::path::Path, topic: &str) {
    let topic_dir = data.join("topics").join(topic);
    assert!(topic_dir.exists(), "the data was left in place");
    let node = Node::start_in(data, 1, &[]);
    let mut client = node.client();
    let gone = client
        .request("GET", &format!("/v1/topics/{topic}"), &[], "")
        .unwrap();
    assert_eq!(gone.status, 404, "{gone:?}");
    assert!(
        !topic_dir.exists(),
        "{} is still there",
        topic_dir.display()
    );
    assert!(
        !data.join("quarantine").exists(),
        "the data went to quarantine"
    );
}

/// A delete whose metadata sync failed has an unknown outcome: its bytes may
/// be on disk. The node answers 500 and keeps the topic; the restart replays
/// the delete and removes the data, which kept its delete marker for that
/// (without it, the start would take the data for unknown and quarantine it).
/// Uses the debug-build-only hook `NARAD_DEBUG_META_SYNC_FAIL`.
#[test]
fn a_delete_whose_metadata_sync_failed_is_settled_at_the_next_start() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    let mut node = Node::start_in(&data, 1, &[("NARAD_DEBUG_META_SYNC_FAIL", "shaky")]);
    let mut client = node.client();
    topic_with_records(&mut client, "shaky");
    let failed = client
        .request("DELETE", "/v1/topics/shaky", &[], "")
        .unwrap();
    assert_eq!(failed.status, 500, "{failed:?}");
    let kept = client.request("GET", "/v1/topics/shaky", &[], "").unwrap();
    assert_eq!(kept.status, 200, "not applied before the restart: {kept:?}");
    // The store refuses topic changes until the restart, and says so: once in
    // the log, in a gauge, and in `/readyz` (ready: the data plane goes on).
    let create = client
        .request("POST", "/v1/topics", &JSON, r#"{"name":"later"}"#)
        .unwrap();
    assert_eq!(create.status, 500, "{create:?}");
    assert!(create.body.contains("restart the node"), "{create:?}");
    node.wait_for_log("the metadata store failed");
    let ready = client.request("GET", "/readyz", &[], "").unwrap();
    assert_eq!(
        (ready.status, ready.body.as_str()),
        (200, r#"{"status":"ready","degraded":["metastore_failed"]}"#)
    );
    let metrics = client.request("GET", "/metrics", &[], "").unwrap();
    assert!(
        metrics.body.contains("\nnarad_metastore_apply_stopped 1\n"),
        "{}",
        metrics.body
    );
    produce_ok(&mut client, "shaky", "", b"still served");
    node.sigkill();
    drop(node);
    restart_finds_the_delete_done(&data, "shaky");
}

#[test]
fn a_shard_that_fails_before_it_reports_stops_the_node() {
    // Every shard reads this debug hook after its mesh connects and before it
    // reports its start; a value that does not parse fails the shard there.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut node = Node::spawn(
        &dir.path().join("data"),
        2,
        &[("NARAD_DEBUG_METRICS_POLL_MS", "soon")],
    );
    let status = node.wait_for_exit(STOP_MAX);
    assert!(!status.success(), "exit status {status:?}");
    node.wait_for_log("NARAD_DEBUG_METRICS_POLL_MS");
}

/// A reaper whose run panics on a partition does not stop the node, nor
/// retention: it skips that partition (counted in
/// `narad_errors_total{component="storage",kind="retention_panic"}`) run after
/// run, without a restart, while the shard goes on serving.
#[test]
fn a_reaper_that_panics_on_a_partition_skips_it_and_the_node_serves_on() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    let env = [
        ("NARAD_DEBUG_PANIC", "retention:doomed"),
        ("NARAD_DEBUG_RETENTION_CHECK_INTERVAL_MS", "100"),
    ];
    let mut node = Node::start_in(&data, 1, &env);
    let mut client = node.client();
    create_topic(&mut client, "doomed");
    produce_ok(&mut client, "doomed", "", b"first");
    let counter = |client: &mut Client, series: &str| -> f64 {
        let response = client.request("GET", "/metrics", &[], "").unwrap();
        assert_eq!(response.status, 200);
        response
            .body
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map_or(0.0, |v| v.trim().parse().unwrap())
    };
    let panics = r#"narad_errors_total{component="storage",kind="retention_panic"}"#;
    wait_until(STOP_MAX, "two retention runs skipped the partition", || {
        (counter(&mut client, panics) >= 2.0).then_some(())
    });
    assert_eq!(counter(&mut client, "narad_reaper_restarts"), 0.0);
    node.wait_for_log("retention panicked on a partition; skipped");
    produce_ok(&mut client, "doomed", "", b"second");
    let health = client.request("GET", "/healthz", &[], "").unwrap();
    assert_eq!(health.status, 200, "{health:?}");
    assert_eq!(
        replay_all(&mut client, "doomed", 0).len()
            + replay_all(&mut client, "doomed", 1).len()
            + replay_all(&mut client, "doomed", 2).len(),
        2
    );
}
