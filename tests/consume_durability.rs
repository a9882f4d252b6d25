//! Acks across restarts: a graceful stop persists every ack, so a restart
//! redelivers nothing that was acked; after SIGKILL, acks older than the write
//! tick (100 ms, documented) are kept too, since they sit in the page cache the
//! killed process leaves behind. Unacked records are delivered again in both.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{json_of, post_topic, produce_ok, wait_for_total, Client, Node, JSON};
use serde_json::json;

const CLIENT: (&str, &str) = ("x-narad-client", "durability-tests");

/// Consumes (and acks when `ack` says so) until a consume waits 1 s in vain;
/// returns the payloads seen.
fn drain(client: &mut Client, topic: &str, ack: impl Fn(&str) -> bool) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let path = format!("/v1/topics/{topic}/consume?max=50&wait=1s");
        let response = client.request("GET", &path, &[CLIENT], "").unwrap();
        if response.status == 204 {
            return seen;
        }
        assert_eq!(response.status, 200, "{response:?}");
        let mut handles = Vec::new();
        for m in json_of(&response)["messages"].as_array().unwrap() {
            let payload = m["payload"].as_str().unwrap().to_string();
            if ack(&payload) {
                handles.push(m["receipt_handle"].as_str().unwrap().to_string());
            }
            seen.push(payload);
        }
        if !handles.is_empty() {
            let body = json!({ "receipt_handles": handles }).to_string();
            let acked = client
                .request("POST", &format!("/v1/topics/{topic}/ack"), &JSON, body)
                .unwrap();
            assert_eq!(acked.status, 200, "{acked:?}");
            for r in json_of(&acked)["results"].as_array().unwrap() {
                assert_eq!(r["status"], 204, "{r}");
            }
        }
    }
}

fn setup(node: &Node, topic: &str, count: usize) -> Client {
    let mut client = node.client();
    let body = json!({ "name": topic, "partitions": 4, "visibility_timeout_ms": 600_000 });
    assert_eq!(post_topic(&mut client, &body.to_string()).status, 201);
    for i in 0..count {
        produce_ok(&mut client, topic, "", format!("m{i:04}").as_bytes());
    }
    wait_for_total(&mut client, topic, 4, count, Duration::from_secs(20));
    client
}

/// Acked: the even payloads. What a restart must deliver: exactly the odd ones.
fn odd(payload: &str) -> bool {
    payload[1..].parse::<u32>().unwrap() % 2 == 1
}

fn check_redelivery(client: &mut Client, topic: &str, count: usize) {
    let again: BTreeSet<String> = drain(client, topic, |_| true).into_iter().collect();
    let expected: BTreeSet<String> = (0..count)
        .map(|i| format!("m{i:04}"))
        .filter(|p| odd(p))
        .collect();
    let acked_again: Vec<&String> = again.iter().filter(|p| !odd(p)).collect();
    assert!(
        acked_again.is_empty(),
        "acked records redelivered: {acked_again:?}"
    );
    assert_eq!(again, expected, "every unacked record is delivered again");
}

#[test]
fn a_graceful_restart_redelivers_nothing_that_was_acked() {
    let mut node = Node::start_shards(2, &[]);
    let count = 300;
    let mut client = setup(&node, "grace", count);
    let seen = drain(&mut client, "grace", |p| !odd(p));
    assert_eq!(seen.len(), count);
    drop(client);
    node.sigterm();
    assert!(node.wait_for_exit(Duration::from_secs(20)).success());
    let data = node.data.clone();
    let restarted = Node::start_in(&data, 2, &[]);
    let mut client = restarted.client();
    check_redelivery(&mut client, "grace", count);
}

#[test]
fn acks_older_than_the_write_tick_survive_sigkill() {
    let mut node = Node::start_shards(2, &[]);
    let count = 300;
    let mut client = setup(&node, "killed", count);
    let seen = drain(&mut client, "killed", |p| !odd(p));
    assert_eq!(seen.len(), count);
    // The write tick is 100 ms; the drain's last empty wait took 1 s already.
    node.sigkill();
    let data = node.data.clone();
    let restarted = Node::start_in(&data, 2, &[]);
    let mut client = restarted.client();
    check_redelivery(&mut client, "killed", count);
}

/// Consumes one message of partition 0 of `topic` and acks it.
fn consume_and_ack_one(client: &mut Client, topic: &str) {
    let handle = common::lease_one(client, topic, 0);
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("receipt_handle", &handle)
        .finish();
    let path = format!("/v1/topics/{topic}/ack?{query}");
    let acked = client.request("POST", &path, &JSON, "").unwrap();
    assert_eq!(acked.status, 204, "{acked:?}");
}

/// Acks whose consumer state cannot be written are still answered (they are
/// durable only within the write interval, by design), but each failed write
/// counts in `narad_errors_total{component="storage",kind="consumer_state"}`
/// and is logged, so that an operator can alert on it. A directory where the
/// partition's `consumer.ahead` file goes makes its writes fail, for root too.
#[test]
fn acks_whose_state_cannot_be_written_are_counted_and_logged() {
    let mut node = Node::start_shards(1, &[]);
    let mut client = node.client();
    let failed = r#"narad_errors_total{component="storage",kind="consumer_state"}"#;
    let count = |client: &mut Client| -> f64 {
        let metrics = client.request("GET", "/metrics", &[], "").unwrap();
        metrics
            .body
            .lines()
            .find_map(|l| l.strip_prefix(failed)?.strip_prefix(' '))
            .map(|v| v.trim().parse().unwrap())
            .expect("the series is there from the start")
    };
    post_topic(&mut client, r#"{"name":"stuck","partitions":3}"#);
    produce_ok(&mut client, "stuck", "partition=0", b"one");
    wait_for_total(&mut client, "stuck", 1, 1, Duration::from_secs(10));
    // Leased: the partition's consumer state is loaded (with no file yet);
    // the ack's write will create the file, where a directory now is.
    let handle = common::lease_one(&mut client, "stuck", 0);
    let state = common::partition_dir(&node.data, "stuck", 0).join("consumer.ahead");
    std::fs::create_dir(&state).unwrap();
    assert_eq!(count(&mut client), 0.0);
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("receipt_handle", &handle)
        .finish();
    let acked = client
        .request("POST", &format!("/v1/topics/stuck/ack?{query}"), &JSON, "")
        .unwrap();
    assert_eq!(acked.status, 204, "{acked:?}");
    common::wait_until(Duration::from_secs(10), "a failed write counted", || {
        (count(&mut client) >= 1.0).then_some(())
    });
    node.wait_for_log("consumer offsets not persisted");
}

/// `consumer.offset` of a quiet partition catches up with its durable frontier
/// while the node runs, with no further ack to prompt it (levelled every 3 s
/// here through a debug hook, every 30 s by default).
#[test]
fn a_quiet_partitions_consumer_offset_is_levelled_without_another_ack() {
    let node = Node::start_shards(1, &[("NARAD_DEBUG_CONSUMER_OFFSET_LEVEL_MS", "3000")]);
    let mut client = node.client();
    let body = json!({ "name": "quiet", "partitions": 3, "visibility_timeout_ms": 600_000 });
    let created = post_topic(&mut client, &body.to_string());
    assert_eq!(created.status, 201, "{created:?}");
    let id = json_of(&created)["id"].as_str().unwrap().to_string();
    for i in 0..2 {
        produce_ok(
            &mut client,
            "quiet",
            "partition=0",
            format!("m{i}").as_bytes(),
        );
    }
    let file = node
        .data
        .join("topics")
        .join("quiet")
        .join(&id)
        .join("p00000")
        .join("consumer.offset");
    let frontier = || {
        std::fs::read(&file)
            .ok()
            .filter(|bytes| bytes.len() >= 8)
            .map(|bytes| u64::from_le_bytes(bytes[..8].try_into().unwrap()))
    };
    // The first ack is synced and levelled at once (nothing was levelled yet).
    consume_and_ack_one(&mut client, "quiet");
    common::wait_until(Duration::from_secs(10), "the first level", || {
        (frontier() == Some(1)).then_some(())
    });
    // The second is synced within the second, but its level is not due for
    // another 3 s; nothing else happens on the node meanwhile.
    consume_and_ack_one(&mut client, "quiet");
    common::wait_until(Duration::from_secs(15), "the second level", || {
        (frontier() == Some(2)).then_some(())
    });
}

/// A topic made again under a deleted one's name starts with no consumer
/// state: the old incarnation's acks, made durable by a graceful stop, settle
/// nothing of the new one, whose records are all delivered, whether the
/// delete and the new records come after a restart or the new ones are read
/// after another.
#[test]
fn a_topic_made_again_carries_none_of_the_old_ones_acks() {
    let mut node = Node::start_shards(2, &[]);
    let count = 40;
    let mut client = setup(&node, "again", count);
    assert_eq!(drain(&mut client, "again", |_| true).len(), count);
    drop(client);
    node.sigterm();
    assert!(node.wait_for_exit(Duration::from_secs(20)).success());
    let data = node.data.clone();

    let mut restarted = Node::start_in(&data, 2, &[]);
    let mut client = restarted.client();
    let deleted = client
        .request("DELETE", "/v1/topics/again", &[], "")
        .unwrap();
    assert_eq!(deleted.status, 204, "{deleted:?}");
    let fresh = 12;
    let body = json!({ "name": "again", "partitions": 4, "visibility_timeout_ms": 600_000 });
    assert_eq!(post_topic(&mut client, &body.to_string()).status, 201);
    for i in 0..fresh {
        produce_ok(&mut client, "again", "", format!("n{i:04}").as_bytes());
    }
    wait_for_total(&mut client, "again", 4, fresh, Duration::from_secs(20));
    let expected: BTreeSet<String> = (0..fresh).map(|i| format!("n{i:04}")).collect();
    // Read, not acked: a restart must deliver them all again.
    let seen: BTreeSet<String> = drain(&mut client, "again", |_| false).into_iter().collect();
    assert_eq!(seen, expected, "the new topic's records, each once");
    drop(client);
    restarted.sigterm();
    assert!(restarted.wait_for_exit(Duration::from_secs(20)).success());

    let again = Node::start_in(&data, 2, &[]);
    let mut client = again.client();
    let seen: BTreeSet<String> = drain(&mut client, "again", |_| true).into_iter().collect();
    assert_eq!(seen, expected, "after a restart, still none settled");
}
