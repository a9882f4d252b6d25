//! A node with more partitions than its open-file limit allows logs: it closes
//! and reopens partition logs within a budget instead of running out of
//! descriptors, so pinned records land in their own partitions, every one is
//! consumed, and a graceful stop still persists every ack.
//!
//! Alone in its binary: it lowers this process's RLIMIT_NOFILE (soft and hard,
//! which the broker it starts inherits and cannot raise).

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// Low enough that 108 partition logs held open (two or three descriptors
/// each) with the `consumer.ahead` files would exhaust it.
const OPEN_FILES: u64 = 256;
const PARTITIONS: u32 = 108;
const PER_PARTITION: usize = 2;
const CLIENT: (&str, &str) = ("x-narad-client", "open-files-test");

fn lower_open_files_limit() {
    let limit = libc::rlimit {
        rlim_cur: OPEN_FILES,
        rlim_max: OPEN_FILES,
    };
    // SAFETY: setrlimit only reads the struct we pass.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
}

/// Leases and acks every message it can, batch by batch, until a consume
/// answers 204; returns the payloads it acked.
fn consume_and_ack_all(client: &mut Client, topic: &str) -> Vec<String> {
    let mut acked = Vec::new();
    loop {
        let path = format!("/v1/topics/{topic}/consume?max=100&wait=500ms");
        let response = client.request("GET", &path, &[CLIENT], "").unwrap();
        if response.status == 204 {
            return acked;
        }
        assert_eq!(response.status, 200, "{response:?}");
        let messages = json_of(&response)["messages"].as_array().unwrap().clone();
        let handles: Vec<&str> = messages
            .iter()
            .map(|m| m["receipt_handle"].as_str().unwrap())
            .collect();
        let body = json!({ "receipt_handles": handles }).to_string();
        let path = format!("/v1/topics/{topic}/ack");
        let response = client.request("POST", &path, &JSON, body).unwrap();
        assert_eq!(response.status, 200, "{response:?}");
        for result in json_of(&response)["results"].as_array().unwrap() {
            assert_eq!(result["status"], 204, "{result}");
        }
        acked.extend(payload_texts(&messages));
    }
}

#[test]
fn more_partitions_than_descriptors_keep_their_records_and_acks() {
    lower_open_files_limit();
    let mut node = Node::start_shards(2, &[]);
    let mut client = node.client();
    let body = json!({ "name": "wide", "partitions": PARTITIONS }).to_string();
    assert_eq!(post_topic(&mut client, &body).status, 201);
    let mut messages = Vec::new();
    for i in 0..PER_PARTITION {
        for p in 0..PARTITIONS {
            messages.push(json!({ "payload": format!("p{p}-{i}"), "partition": p }));
        }
    }
    let body = json!({ "messages": messages }).to_string();
    let response = client
        .request("POST", "/v1/topics/wide/produce/batch", &JSON, body)
        .unwrap();
    assert_eq!(response.status, 202, "{response:?}");
    let total = PARTITIONS as usize * PER_PARTITION;
    let seen = wait_for_total(
        &mut client,
        "wide",
        PARTITIONS,
        total,
        Duration::from_secs(60),
    );
    for (p, records) in seen.iter().enumerate() {
        let expected: Vec<String> = (0..PER_PARTITION).map(|i| format!("p{p}-{i}")).collect();
        assert_eq!(payload_texts(records), expected, "partition {p}");
    }
    let mut acked = consume_and_ack_all(&mut client, "wide");
    acked.sort();
    acked.dedup();
    assert_eq!(acked.len(), total, "every record was consumed and acked");
    // A graceful stop persists every ack, over more partitions than it may
    // hold files of at once: the restart delivers nothing again.
    node.sigterm();
    assert!(node.wait_for_exit(Duration::from_secs(30)).success());
    let data = node.data.clone();
    let mut restarted = Node::start_in(&data, 2, &[]);
    let mut client = restarted.client();
    let response = client
        .request("GET", "/v1/topics/wide/consume?wait=1s", &[], "")
        .unwrap();
    let again: Option<Value> = (response.status == 200).then(|| json_of(&response));
    assert_eq!(
        response.status, 204,
        "acked, then delivered again: {again:?}"
    );
    restarted.sigterm();
    assert!(restarted.wait_for_exit(Duration::from_secs(30)).success());
}
