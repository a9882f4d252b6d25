//! `GET /metrics` as a scraper sees it: after a known sequence of requests the
//! counters say exactly what happened, summed over the shards that served them.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{json_of, post_topic, produce_ok, wait_for_total, Client, Node, JSON};
use serde_json::json;

/// Every sample of the exposition: `name{labels}` -> value.
fn scrape(client: &mut Client) -> BTreeMap<String, f64> {
    let response = client.request("GET", "/metrics", &[], "").unwrap();
    assert_eq!(response.status, 200, "{response:?}");
    assert!(
        response
            .header("content-type")
            .is_some_and(|t| t.starts_with("text/plain")),
        "{response:?}"
    );
    let mut samples = BTreeMap::new();
    for line in response.body.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap();
        samples.insert(series.to_string(), value.parse().unwrap());
    }
    samples
}

/// The sum of a metric's samples whose labels contain every one of `labels`.
fn sum(samples: &BTreeMap<String, f64>, name: &str, labels: &[&str]) -> f64 {
    samples
        .iter()
        .filter(|(series, _)| {
            series.split('{').next() == Some(name) && labels.iter().all(|l| series.contains(l))
        })
        .map(|(_, v)| v)
        .sum()
}

#[test]
fn counters_follow_a_known_sequence_of_requests() {
    let node = Node::start_shards(2, &[]);
    let mut client = node.client();
    let body = json!({ "name": "m", "partitions": 3 }).to_string();
    assert_eq!(post_topic(&mut client, &body).status, 201);
    for i in 0..5 {
        produce_ok(&mut client, "m", "partition=1", format!("p{i}").as_bytes());
    }
    let batch = json!({ "messages": (0..10).map(|i| json!({ "payload": format!("b{i}") })).collect::<Vec<_>>() });
    let response = client
        .request(
            "POST",
            "/v1/topics/m/produce/batch",
            &JSON,
            batch.to_string(),
        )
        .unwrap();
    assert_eq!(response.status, 202, "{response:?}");
    wait_for_total(&mut client, "m", 3, 15, Duration::from_secs(20));

    // Three leases: ack one, nack one, extend one.
    let mut handles = Vec::new();
    for _ in 0..3 {
        let response = client
            .request("GET", "/v1/topics/m/consume?wait=2s", &[], "")
            .unwrap();
        assert_eq!(response.status, 200, "{response:?}");
        handles.push(
            json_of(&response)["receipt_handle"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    for (handle, extend) in handles.iter().zip(["false", "0", "true"]) {
        let path = format!("/v1/topics/m/ack?receipt_handle={handle}&extend={extend}");
        assert_eq!(
            client.request("POST", &path, &JSON, "").unwrap().status,
            204
        );
    }
    let missing = client.request("GET", "/v1/topics/nope", &[], "").unwrap();
    assert_eq!(missing.status, 404);

    let samples = scrape(&mut client);
    let topic = "topic=\"m\"";
    assert_eq!(
        sum(&samples, "narad_messages_produced_total", &[topic]),
        15.0
    );
    assert!(
        sum(
            &samples,
            "narad_messages_produced_total",
            &[topic, "partition=\"1\""]
        ) >= 5.0
    );
    assert_eq!(sum(&samples, "narad_bytes_produced_total", &[topic]), 30.0);
    assert_eq!(
        sum(&samples, "narad_messages_consumed_total", &[topic]),
        3.0
    );
    assert_eq!(sum(&samples, "narad_bytes_consumed_total", &[topic]), 6.0);
    assert_eq!(sum(&samples, "narad_nack_total", &[topic]), 1.0);
    assert_eq!(sum(&samples, "narad_ack_extended_total", &[topic]), 1.0);
    let produce_route = "route=\"/v1/topics/{topic}/produce\"";
    assert_eq!(
        sum(
            &samples,
            "narad_http_requests_total",
            &[produce_route, "status=\"202\""]
        ),
        5.0
    );
    assert_eq!(
        sum(
            &samples,
            "narad_http_request_duration_seconds_count",
            &[produce_route]
        ),
        5.0
    );
    assert_eq!(
        sum(
            &samples,
            "narad_http_requests_total",
            &["route=\"/v1/topics/{topic}\"", "status=\"404\""]
        ),
        1.0
    );
    assert!(sum(&samples, "narad_produce_to_committed_seconds_count", &[]) >= 15.0);
    assert!(
        samples.contains_key("narad_ingress_wal_failed"),
        "{samples:?}"
    );
    assert_eq!(sum(&samples, "narad_ingress_wal_failed", &[]), 0.0);
    // The only 5xx answers are /readyz's 503s while the node started.
    let server_errors = sum(&samples, "narad_http_requests_total", &["status=\"5"]);
    assert_eq!(
        sum(
            &samples,
            "narad_http_requests_total",
            &["status=\"5", "route=\"/readyz\""]
        ),
        server_errors
    );
    assert_eq!(
        sum(
            &samples,
            "narad_errors_total",
            &["component=\"http\"", "kind=\"5xx\""]
        ),
        server_errors
    );

    // Counters keep counting after the topic is deleted.
    let deleted = client.request("DELETE", "/v1/topics/m", &[], "").unwrap();
    assert_eq!(deleted.status, 204);
    let after = scrape(&mut client);
    assert_eq!(sum(&after, "narad_messages_produced_total", &[topic]), 15.0);
}
