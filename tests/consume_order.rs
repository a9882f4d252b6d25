//! Consumers take records in the order they came: a consumer parked in a
//! long-poll is handed the next record that commits, even when another
//! consumer asks for it in the instant between its commit and the moment the
//! parked one is served, whichever shard each of them reached.

mod common;

use std::time::{Duration, Instant};

use common::{create_topic, json_of, produce_ok, Node};

#[test]
fn a_parked_consumer_gets_the_record_before_a_later_poll() {
    let node = Node::start_shards(2, &[]);
    let mut admin = node.client();
    create_topic(&mut admin, "order");
    for trial in 0..40u32 {
        // The parked consumer, on a connection (and so a shard) of its own.
        let mut parked = node.client();
        let waiting = std::thread::spawn(move || {
            let response = parked
                .request("GET", "/v1/topics/order/consume?wait=5s", &[], "")
                .unwrap();
            (parked, response)
        });
        std::thread::sleep(Duration::from_millis(50));
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
        let handle = json_of(&response)["receipt_handle"]
            .as_str()
            .unwrap()
            .to_string();
        let path = format!("/v1/topics/order/ack?receipt_handle={handle}");
        let acked = parked
            .request("POST", &path, &[("content-type", "application/json")], "")
            .unwrap();
        assert_eq!(acked.status, 204, "trial {trial}: {acked:?}");
    }
}
