//! Consumers take records in the order they came: a consumer parked in a
//! long-poll is handed the next record that commits, even when another
//! consumer asks for it in the instant between its commit and the moment the
//! parked one is served, whichever shard each of them reached, and whichever
//! partitions the others have records in.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::prometheus::{scrape, sum};
use common::{
    batch_doc, batch_ok, create_topic, json_of, produce_ok, wait_until, Client, Node, Response,
};
use serde_json::json;

#[test]
fn a_parked_consumer_gets_the_record_before_a_later_poll() {
    let node = Node::start_shards(2, &[]);
    let mut admin = node.client();
    create_topic(&mut admin, "order");
    // Every shard opens its partitions of the topic now: a first consume
    // opens them on its way to parking (their files made and synced), and
    // on a loaded machine that outlasts any pause, while a consumer not yet
    // parked is not yet first in line.
    let warm = admin
        .request("GET", "/v1/topics/order/consume", &[], "")
        .unwrap();
    assert_eq!(warm.status, 204, "{warm:?}");
    for trial in 0..40u32 {
        // The parked consumer, on a connection (and so a shard) of its own.
        let mut parked = node.client();
        let waiting = std::thread::spawn(move || {
            let response = parked
                .request("GET", "/v1/topics/order/consume?wait=5s", &[], "")
                .unwrap();
            (parked, response)
        });
        wait_parked(&mut admin);
        let mut poller = node.client();
        produce_ok(
            &mut admin,
            "order",
            &format!("partition={}", trial % 3),
            b"r",
        );
        // Polls without waiting, right after the produce and until the
        // record is surely committed: each must leave it to the consumer
        // that waited first.
        let polling = Instant::now();
        while polling.elapsed() < Duration::from_millis(60) {
            let poll = poller
                .request("GET", "/v1/topics/order/consume", &[], "")
                .unwrap();
            assert_eq!(
                poll.status, 204,
                "trial {trial}: a later poll took the record: {poll:?}"
            );
        }
        let (mut parked, response) = waiting.join().unwrap();
        assert_eq!(response.status, 200, "trial {trial}: {response:?}");
        settle_ok(&mut parked, "order", &response, "");
    }
}

/// Waits until the one consumer sent off has parked: its request in flight
/// beside the scrape, and a moment more to reach its wait. On a loaded
/// machine a fixed pause alone can pass before the request reached the node.
fn wait_parked(client: &mut Client) {
    wait_until(Duration::from_secs(4), "the consumer in flight", || {
        (sum(&scrape(client), "narad_http_requests_in_flight", &[]) >= 2.0).then_some(())
    });
    std::thread::sleep(Duration::from_millis(50));
}

/// Settles the lease `leased` (a consume's 200) with `extend` (`""` acks,
/// `"0"` nacks), checking the 204.
fn settle_ok(client: &mut Client, topic: &str, leased: &Response, extend: &str) {
    let handle = json_of(leased)["receipt_handle"]
        .as_str()
        .unwrap()
        .to_string();
    let path = format!("/v1/topics/{topic}/ack?receipt_handle={handle}&extend={extend}");
    let settled = client.request("POST", &path, &common::JSON, "").unwrap();
    assert_eq!(settled.status, 204, "{path}: {settled:?}");
}

/// One consumer waits on partition 0 while partition 1 of the same shard holds
/// a backlog. The record that commits on partition 0 is the waiting
/// consumer's: a later consumer pinned to partition 0 gets nothing, and an
/// unpinned one takes partition 1's backlog, never partition 0's record.
#[test]
fn a_pinned_consumer_keeps_its_record_while_another_partition_has_a_backlog() {
    let node = Node::start_shards(1, &[]);
    let mut admin = node.client();
    create_topic(&mut admin, "pinned");
    let backlog: Vec<_> = (0..50)
        .map(|i| json!({ "payload": format!("b{i}"), "partition": 1 }))
        .collect();
    batch_ok(&mut admin, "pinned", &common::JSON, batch_doc(&backlog), 50);
    for trial in 0..10u32 {
        let mut parked = node.client();
        let waiting = std::thread::spawn(move || {
            let response = parked
                .request(
                    "GET",
                    "/v1/topics/pinned/consume?partition=0&wait=5s",
                    &[],
                    "",
                )
                .unwrap();
            (parked, response)
        });
        wait_parked(&mut admin);
        let mut poller = node.client();
        produce_ok(&mut admin, "pinned", "partition=0", b"r");
        let polling = Instant::now();
        while polling.elapsed() < Duration::from_millis(60) {
            // Pinned polls sent in a burst, so one is always at hand as
            // the record commits.
            let burst = "GET /v1/topics/pinned/consume?partition=0 HTTP/1.1\r\nhost: t\r\n\r\n";
            poller
                .stream
                .write_all(burst.repeat(16).as_bytes())
                .unwrap();
            for _ in 0..16 {
                let pinned = poller.read_response(false).unwrap();
                assert_eq!(
                    pinned.status, 204,
                    "trial {trial}: a later pinned poll took the record: {pinned:?}"
                );
            }
            let any = poller
                .request("GET", "/v1/topics/pinned/consume", &[], "")
                .unwrap();
            assert_eq!(
                any.status, 200,
                "trial {trial}: the backlog is gone: {any:?}"
            );
            assert_eq!(
                json_of(&any)["partition"],
                1,
                "trial {trial}: a later poll took the pinned consumer's record: {any:?}"
            );
            // Given back at once, so the backlog stays.
            settle_ok(&mut poller, "pinned", &any, "0");
        }
        let (mut parked, response) = waiting.join().unwrap();
        assert_eq!(response.status, 200, "trial {trial}: {response:?}");
        assert_eq!(
            json_of(&response)["partition"],
            0,
            "trial {trial}: {response:?}"
        );
        settle_ok(&mut parked, "pinned", &response, "");
    }
}
