//! The per-identity caps (`http.max_consume_in_flight_per_identity`,
//! `http.max_produce_in_flight_per_identity`): counted per node across
//! connections of one client, answered 429 past the cap, given back when the
//! request ends.

mod common;

use std::io::Write;
use std::time::Duration;

use common::{error_of, post_topic, produce_ok, Node, JSON, OCTET};

#[test]
fn a_client_past_its_consume_cap_is_answered_429() {
    let node = Node::start_shards(2, &[("NARAD_HTTP_MAX_CONSUME_IN_FLIGHT_PER_IDENTITY", "1")]);
    let mut client = node.client();
    assert_eq!(post_topic(&mut client, r#"{"name":"c"}"#).status, 201);
    // A parked long-poll holds the client's one slot.
    let mut parked = node.client();
    parked
        .stream
        .write_all(b"GET /v1/topics/c/consume?wait=3s HTTP/1.1\r\nhost: t\r\n\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        let refused = node
            .client()
            .request("GET", "/v1/topics/c/consume", &[], "")
            .unwrap();
        assert_eq!(refused.status, 429, "{refused:?}");
        assert_eq!(refused.header("retry-after"), Some("1"), "{refused:?}");
        assert!(error_of(&refused).contains("max_consume_in_flight_per_identity"));
    }
    assert_eq!(parked.read_response(false).unwrap().status, 204);
    // Given back: the next consume is served.
    let served = client
        .request("GET", "/v1/topics/c/consume", &[], "")
        .unwrap();
    assert_eq!(served.status, 204, "{served:?}");
}

#[test]
fn a_client_past_its_produce_cap_is_answered_429() {
    let node = Node::start_shards(2, &[("NARAD_HTTP_MAX_PRODUCE_IN_FLIGHT_PER_IDENTITY", "1")]);
    let mut client = node.client();
    assert_eq!(post_topic(&mut client, r#"{"name":"p"}"#).status, 201);
    // A produce whose body is still arriving holds the client's one slot.
    let mut slow = node.client();
    slow.stream
        .write_all(
            b"POST /v1/topics/p/produce HTTP/1.1\r\nhost: t\r\ncontent-type: application/octet-stream\r\ncontent-length: 4\r\n\r\nab",
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let refused = node
        .client()
        .request("POST", "/v1/topics/p/produce", &OCTET, "x")
        .unwrap();
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.header("retry-after"), Some("1"), "{refused:?}");
    assert!(error_of(&refused).contains("max_produce_in_flight_per_identity"));
    let batch = r#"{"messages":[{"payload":"a"}]}"#;
    let refused = node
        .client()
        .request("POST", "/v1/topics/p/produce/batch", &JSON, batch)
        .unwrap();
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.header("retry-after"), Some("1"), "{refused:?}");
    slow.stream.write_all(b"cd").unwrap();
    assert_eq!(slow.read_response(false).unwrap().status, 202);
    produce_ok(&mut client, "p", "", b"after");
}
