//! The consume and ack routes of `narad serve` as a client sees them: leases and
//! receipt handles, ack / extend / nack, redelivery after the visibility timeout,
//! batch consume and batch ack, long-polls that wait their whole `wait` and wake
//! on a produce, and many consumers sharing a topic without sharing a lease.
//!
//! Produced records become visible when the dispatcher commits them, so tests
//! that need records wait for them with replay (or a long-poll) first.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{
    error_of, json_of, post_topic, produce_ok, wait_for_total, wait_until, Client, Node, Response,
    JSON,
};
use serde_json::{json, Value};

/// The header batch consume needs.
const CLIENT: (&str, &str) = ("x-narad-client", "consume-tests");

fn create(client: &mut Client, name: &str, extra: Value) -> Value {
    let mut body = json!({ "name": name, "partitions": 3 });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let response = post_topic(client, &body.to_string());
    assert_eq!(response.status, 201, "{response:?}");
    json_of(&response)
}

fn consume(client: &mut Client, topic: &str, query: &str) -> Response {
    let path = format!("/v1/topics/{topic}/consume?{query}");
    client.request("GET", &path, &[CLIENT], "").unwrap()
}

fn ack(client: &mut Client, topic: &str, handle: &str, extend: Option<&str>) -> Response {
    let mut path = format!("/v1/topics/{topic}/ack?receipt_handle={handle}");
    if let Some(extend) = extend {
        path.push_str(&format!("&extend={extend}"));
    }
    client.request("POST", &path, &JSON, "").unwrap()
}

/// Produces `count` text payloads `m-i` and waits until all are visible.
fn produce_visible(client: &mut Client, topic: &str, partitions: u32, count: usize) {
    for i in 0..count {
        produce_ok(client, topic, "", format!("m-{i}").as_bytes());
    }
    wait_for_total(client, topic, partitions, count, Duration::from_secs(20));
}

fn handle_of(message: &Value) -> String {
    message["receipt_handle"]
        .as_str()
        .unwrap_or_else(|| panic!("no receipt_handle: {message}"))
        .to_string()
}

#[test]
fn consume_and_ack_refuse_bad_input_with_the_reference_statuses() {
    let node = Node::start(&[("NARAD_HTTP_MAX_CONSUME_WAIT", "1s")]);
    let mut client = node.client();
    create(&mut client, "errs", json!({}));
    let bad = |client: &mut Client, query: &str| {
        let response = consume(client, "errs", query);
        assert_eq!(response.status, 400, "{query}: {response:?}");
        error_of(&response)
    };
    assert!(bad(&mut client, "offset=0").contains("partition"));
    assert!(bad(&mut client, "partition=3").contains("out of range"));
    assert!(bad(&mut client, "partition=0&offset=0&max=2").contains("max"));
    assert!(bad(&mut client, "max=0").contains("max"));
    assert!(bad(&mut client, "max=101").contains("max"));
    assert!(bad(&mut client, "wait=soon").contains("wait"));
    assert!(bad(&mut client, "wait=1s&wait=2s").contains("more than once"));
    assert!(bad(&mut client, "partition=0&offset=0&wait=soon").contains("wait"));
    let no_client = client
        .request("GET", "/v1/topics/errs/consume?max=2", &[], "")
        .unwrap();
    assert_eq!(no_client.status, 400, "{no_client:?}");
    assert!(error_of(&no_client).contains("X-Narad-Client"));
    let missing = consume(&mut client, "nope", "");
    assert_eq!(missing.status, 404, "{missing:?}");
    error_of(&missing);

    // Nothing to consume: 204 at once without a wait; a long wait is clamped.
    assert_eq!(consume(&mut client, "errs", "").status, 204);
    let started = Instant::now();
    let clamped = consume(&mut client, "errs", "wait=1h");
    assert_eq!(clamped.status, 204);
    assert_eq!(clamped.header("x-narad-wait-clamped"), Some("1s"));
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    // Replay never waits, but reports the clamp as any consume does.
    let replay = consume(&mut client, "errs", "partition=0&offset=0&wait=1h");
    assert_eq!(replay.status, 204, "{replay:?}");
    assert_eq!(replay.header("x-narad-wait-clamped"), Some("1s"));

    // Acks: malformed 400, unknown lease 410, unknown topic 404, bad extend 400.
    for (handle, status) in [("x", 400), ("1:2", 400), ("0:0:1", 410), ("9:0:1", 410)] {
        let response = ack(&mut client, "errs", handle, None);
        assert_eq!(response.status, status, "{handle}: {response:?}");
        error_of(&response);
    }
    assert_eq!(ack(&mut client, "nope", "0:0:1", None).status, 404);
    assert_eq!(ack(&mut client, "errs", "0:0:1", Some("yes")).status, 400);
    let no_handle = client
        .request("POST", "/v1/topics/errs/ack", &JSON, "")
        .unwrap();
    assert_eq!(no_handle.status, 400, "{no_handle:?}");
    let too_many: Vec<String> = (0..101).map(|i| format!("0:{i}:1")).collect();
    let body = json!({ "receipt_handles": too_many }).to_string();
    let response = client
        .request("POST", "/v1/topics/errs/ack", &JSON, body)
        .unwrap();
    assert_eq!(response.status, 400, "{response:?}");
    // The body cap is the reference's 64 KiB for acks: a padded body under it is
    // parsed, one byte over is 413.
    let shell = r#"{"receipt_handles":["0:0:1"]}"#.len();
    let padded = format!(
        r#"{{"receipt_handles":["0:0:1"]{}}}"#,
        " ".repeat((64 << 10) - shell)
    );
    let response = client
        .request("POST", "/v1/topics/errs/ack", &JSON, padded)
        .unwrap();
    assert_eq!(response.status, 200, "{response:?}");
    let huge = format!(
        r#"{{"receipt_handles":["0:0:1"]{}}}"#,
        " ".repeat((64 << 10) - shell + 1)
    );
    let response = client
        .request("POST", "/v1/topics/errs/ack", &JSON, huge)
        .unwrap();
    assert_eq!(response.status, 413, "{response:?}");
    // Refused before its body was read, so the server closes the connection.
    assert_eq!(response.header("connection"), Some("close"));
    let mut client = node.client();
    let unknown = client
        .request(
            "POST",
            "/v1/topics/errs/ack",
            &JSON,
            r#"{"receipt_handles":["0:0:1"],"x":1}"#,
        )
        .unwrap();
    assert_eq!(unknown.status, 400, "{unknown:?}");
    let bodiless = client
        .request("POST", "/v1/topics/errs/ack?receipt_handle=0:0:1", &[], "")
        .unwrap();
    assert_eq!(bodiless.status, 415, "{bodiless:?}");
}

#[test]
fn a_lease_hides_a_message_until_it_is_acked_nacked_or_lapses() {
    let node = Node::start(&[]);
    let mut client = node.client();
    create(
        &mut client,
        "lease",
        json!({ "visibility_timeout_ms": 1500 }),
    );
    produce_ok(&mut client, "lease", "partition=1", b"only");
    wait_for_total(&mut client, "lease", 3, 1, Duration::from_secs(20));

    let first = consume(&mut client, "lease", "wait=5s");
    assert_eq!(first.status, 200, "{first:?}");
    let message = json_of(&first);
    assert_eq!(
        (&message["topic"], &message["partition"], &message["offset"]),
        (&json!("lease"), &json!(1), &json!(0))
    );
    assert_eq!(message["payload"], "only");
    assert!(message["timestamp_ms"].as_u64().unwrap() / 1000 == message["timestamp"]);
    let handle = handle_of(&message);
    assert!(handle.starts_with("1:0:"), "{handle}");
    // Leased: nobody else gets it.
    assert_eq!(consume(&mut client, "lease", "").status, 204);

    // Extend twice, well past the first expiry: still invisible.
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(900));
        assert_eq!(ack(&mut client, "lease", &handle, Some("true")).status, 204);
        assert_eq!(consume(&mut client, "lease", "").status, 204);
    }
    // Nack: delivered again at once, with a new handle; the old one is stale.
    assert_eq!(ack(&mut client, "lease", &handle, Some("0")).status, 204);
    let again = consume(&mut client, "lease", "wait=2s");
    assert_eq!(again.status, 200, "{again:?}");
    let second = handle_of(&json_of(&again));
    assert_ne!(second, handle);
    assert_eq!(ack(&mut client, "lease", &handle, None).status, 410);

    // Not acked: it lapses after the visibility timeout and comes back.
    let started = Instant::now();
    let lapsed = consume(&mut client, "lease", "wait=5s");
    assert_eq!(lapsed.status, 200, "{lapsed:?}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(1000) && waited < Duration::from_millis(4000),
        "redelivered after {waited:?}"
    );
    let third = handle_of(&json_of(&lapsed));
    assert_eq!(ack(&mut client, "lease", &second, None).status, 410);

    // Ack: gone for good; acking twice is 410.
    assert_eq!(ack(&mut client, "lease", &third, None).status, 204);
    assert_eq!(ack(&mut client, "lease", &third, None).status, 410);
    assert_eq!(consume(&mut client, "lease", "wait=2s").status, 204);
}

#[test]
fn head_checks_a_consume_but_never_leases() {
    let node = Node::start(&[]);
    let mut client = node.client();
    create(&mut client, "head", json!({}));
    produce_ok(&mut client, "head", "partition=0", b"only");
    wait_for_total(&mut client, "head", 3, 1, Duration::from_secs(20));
    let head =
        |client: &mut Client, path: &str| client.request("HEAD", path, &[CLIENT], "").unwrap();
    let checked = head(&mut client, "/v1/topics/head/consume?wait=1h");
    assert_eq!(checked.status, 204, "{checked:?}");
    assert!(
        checked.header("x-narad-wait-clamped").is_some(),
        "{checked:?}"
    );
    assert_eq!(
        head(&mut client, "/v1/topics/head/consume?max=0").status,
        400
    );
    assert_eq!(head(&mut client, "/v1/topics/nope/consume").status, 404);
    // Replay is read-only: HEAD answers it as GET would.
    assert_eq!(
        head(&mut client, "/v1/topics/head/consume?partition=0&offset=0").status,
        200
    );
    // Nothing was leased: the record is there for the next GET.
    let got = consume(&mut client, "head", "");
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(json_of(&got)["payload"], "only");
}

#[test]
fn raising_a_topics_caps_serves_the_consumers_parked_at_them() {
    let node = Node::start_shards(2, &[]);
    let mut client = node.client();
    create(
        &mut client,
        "capped",
        json!({ "max_in_flight_per_partition": 1 }),
    );
    produce_ok(&mut client, "capped", "partition=0", b"one");
    produce_ok(&mut client, "capped", "partition=0", b"two");
    wait_for_total(&mut client, "capped", 3, 2, Duration::from_secs(20));
    assert_eq!(consume(&mut client, "capped", "").status, 200);
    // At its cap with a record waiting: a second consumer parks.
    let mut parked = node.client();
    let waiting = std::thread::spawn(move || {
        let started = Instant::now();
        let got = consume(&mut parked, "capped", "wait=8s");
        (got.status, started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(500));
    let raised = client
        .request(
            "PATCH",
            "/v1/topics/capped",
            &JSON,
            r#"{"max_in_flight_per_partition":2}"#,
        )
        .unwrap();
    assert_eq!(raised.status, 200, "{raised:?}");
    let (status, waited) = waiting.join().unwrap();
    assert_eq!(status, 200, "the parked consumer got nothing in {waited:?}");
    assert!(waited < Duration::from_secs(4), "served after {waited:?}");
}

#[test]
fn batch_consume_and_batch_ack_answer_per_message() {
    let node = Node::start(&[]);
    let mut client = node.client();
    create(&mut client, "batch", json!({}));
    produce_visible(&mut client, "batch", 3, 30);

    let response = consume(&mut client, "batch", "max=20");
    assert_eq!(response.status, 200, "{response:?}");
    let messages = json_of(&response)["messages"].as_array().unwrap().clone();
    assert!(
        !messages.is_empty() && messages.len() <= 20,
        "{}",
        messages.len()
    );
    let mut handles: Vec<String> = messages.iter().map(handle_of).collect();
    let mut seen: Vec<String> = messages
        .iter()
        .map(|m| m["payload"].as_str().unwrap().to_string())
        .collect();
    // Drain the rest with batches.
    while seen.len() < 30 {
        let response = consume(&mut client, "batch", "max=100&wait=2s");
        assert_eq!(
            response.status,
            200,
            "only {} of 30: {response:?}",
            seen.len()
        );
        for m in json_of(&response)["messages"].as_array().unwrap() {
            handles.push(handle_of(m));
            seen.push(m["payload"].as_str().unwrap().to_string());
        }
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 30, "every record once");

    let mut batch: Vec<String> = handles[..3].to_vec();
    batch.push("garbage".into());
    batch.push(handles[0].clone());
    let body = json!({ "receipt_handles": batch }).to_string();
    let response = client
        .request("POST", "/v1/topics/batch/ack", &JSON, body)
        .unwrap();
    assert_eq!(response.status, 200, "{response:?}");
    let results = json_of(&response)["results"].as_array().unwrap().clone();
    let statuses: Vec<u64> = results
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, vec![204, 204, 204, 400, 410], "{results:?}");
    assert!(results[3]["error"].is_string() && results[0].get("error").is_none());

    // A batch nack gives the rest back at once.
    let body = json!({ "receipt_handles": handles[3..].to_vec() }).to_string();
    let response = client
        .request("POST", "/v1/topics/batch/ack?extend=0", &JSON, body)
        .unwrap();
    assert_eq!(response.status, 200, "{response:?}");
    let mut again = 0;
    while again < 27 {
        let response = consume(&mut client, "batch", "max=100&wait=2s");
        assert_eq!(response.status, 200, "{again} of 27 back: {response:?}");
        again += json_of(&response)["messages"].as_array().unwrap().len();
    }
    assert_eq!(again, 27);
}

/// An ack with a handle in the query and handles in the body is refused, and
/// settles neither: the body's leases would otherwise be left to lapse.
#[test]
fn an_ack_naming_handles_in_both_the_query_and_the_body_is_refused() {
    let node = Node::start(&[]);
    let mut client = node.client();
    create(&mut client, "both", json!({}));
    produce_visible(&mut client, "both", 3, 2);
    let response = consume(&mut client, "both", "max=2&wait=2s");
    let messages = json_of(&response)["messages"].as_array().unwrap().clone();
    let mut handles: Vec<String> = messages.iter().map(handle_of).collect();
    if handles.len() < 2 {
        let response = consume(&mut client, "both", "wait=2s");
        assert_eq!(response.status, 200, "{response:?}");
        handles.push(handle_of(&json_of(&response)));
    }
    let body = json!({ "receipt_handles": [handles[1]] }).to_string();
    let path = format!("/v1/topics/both/ack?receipt_handle={}", handles[0]);
    let response = client.request("POST", &path, &JSON, body).unwrap();
    assert_eq!(response.status, 400, "{response:?}");
    assert!(error_of(&response).contains("not both"), "{response:?}");
    // Neither lease was settled: each handle still acks once, then is stale.
    for handle in &handles {
        assert_eq!(ack(&mut client, "both", handle, None).status, 204);
        assert_eq!(ack(&mut client, "both", handle, None).status, 410);
    }
}

/// A batch ack on a node of three shards: most handles belong to partitions
/// another shard owns, and they are settled together, yet every result comes
/// back in the order of the handles (a handle given twice is 204 then 410), and
/// every acked message is gone for good.
#[test]
fn batch_ack_across_shards_answers_in_order() {
    let node = Node::start_shards(3, &[]);
    let mut client = node.client();
    create(&mut client, "spread", json!({ "partitions": 6 }));
    produce_visible(&mut client, "spread", 6, 60);
    let mut messages = Vec::new();
    while messages.len() < 60 {
        let response = consume(&mut client, "spread", "max=100&wait=2s");
        assert_eq!(
            response.status,
            200,
            "{} of 60: {response:?}",
            messages.len()
        );
        messages.extend(json_of(&response)["messages"].as_array().unwrap().clone());
    }
    let partitions: std::collections::BTreeSet<u64> = messages
        .iter()
        .map(|m| m["partition"].as_u64().unwrap())
        .collect();
    assert_eq!(
        partitions.len(),
        6,
        "every partition, so every shard, served"
    );
    let handles: Vec<String> = messages.iter().map(handle_of).collect();
    let mut batch = handles[..40].to_vec();
    batch.insert(20, "garbage".to_string());
    batch.push(handles[7].clone());
    batch.push(handles[33].clone());
    let body = json!({ "receipt_handles": batch }).to_string();
    let response = client
        .request("POST", "/v1/topics/spread/ack", &JSON, body)
        .unwrap();
    assert_eq!(response.status, 200, "{response:?}");
    let statuses: Vec<u64> = json_of(&response)["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    let mut want = vec![204u64; 40];
    want.insert(20, 400);
    want.extend([410, 410]);
    assert_eq!(statuses, want);
    let body = json!({ "receipt_handles": handles[40..].to_vec() }).to_string();
    let response = client
        .request("POST", "/v1/topics/spread/ack", &JSON, body)
        .unwrap();
    assert_eq!(response.status, 200, "{response:?}");
    assert!(
        json_of(&response)["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["status"] == 204),
        "{response:?}"
    );
    let response = consume(&mut client, "spread", "max=100&wait=500ms");
    assert_eq!(
        response.status, 204,
        "acked messages came back: {response:?}"
    );
}

/// A batch consume stops at its 4 MiB key+payload budget, and the records it
/// reserved but left out go back at once: the next consume gets them, not a
/// 204 until their leases lapse, and nothing handed out is handed out twice.
#[test]
fn records_a_batch_leaves_out_are_released_at_once() {
    let node = Node::start(&[]);
    let mut client = node.client();
    create(&mut client, "big", json!({}));
    for i in 0..6 {
        let mut payload = format!("{i}-").into_bytes();
        payload.resize(1_000_000, b'x');
        // One partition: one read serves the whole batch.
        produce_ok(&mut client, "big", "partition=0", &payload);
    }
    wait_for_total(&mut client, "big", 3, 6, Duration::from_secs(20));
    let ids = |response: &Response| -> Vec<String> {
        json_of(response)["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["payload"].as_str().unwrap()[..2].to_string())
            .collect()
    };
    let first = consume(&mut client, "big", "max=10&wait=1s");
    assert_eq!(first.status, 200, "{first:?}");
    let mut got = ids(&first);
    assert!(got.len() < 6, "the budget held {} MB", got.len());
    let second = consume(&mut client, "big", "max=10&wait=1s");
    assert_eq!(
        second.status, 200,
        "left-out records still leased: {second:?}"
    );
    got.extend(ids(&second));
    got.sort();
    assert_eq!(
        got,
        ["0-", "1-", "2-", "3-", "4-", "5-"],
        "each record once"
    );
}

/// A consumer that parks: answered 204 after its wait, not before.
#[test]
fn a_parked_consumer_is_held_for_its_wait() {
    let node = Node::start_shards(3, &[]);
    let mut client = node.client();
    create(&mut client, "idle", json!({}));
    for wait_ms in [300u64, 1200] {
        let started = Instant::now();
        let response = consume(&mut client, "idle", &format!("wait={wait_ms}ms"));
        let waited = started.elapsed();
        assert_eq!(response.status, 204, "{response:?}");
        assert!(
            waited >= Duration::from_millis(wait_ms - 20)
                && waited < Duration::from_millis(wait_ms + 1500),
            "wait={wait_ms}ms answered after {waited:?}"
        );
    }
}

/// CPU seconds (user + system) the process has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Records exist but every partition is at its in-flight cap: a consumer parked
/// meanwhile waits quietly. Owners must not call it in for records it cannot
/// take, which would have two shards claim and notify each other in a loop for
/// the whole wait.
#[test]
fn a_consumer_parked_while_every_partition_is_at_its_cap_costs_nothing() {
    let node = Node::start_shards(2, &[]);
    let mut client = node.client();
    create(
        &mut client,
        "capped",
        json!({ "max_in_flight_per_partition": 1 }),
    );
    produce_visible(&mut client, "capped", 3, 9);
    for _ in 0..3 {
        let leased = consume(&mut client, "capped", "");
        assert_eq!(leased.status, 200, "{leased:?}");
    }
    assert_eq!(
        consume(&mut client, "capped", "").status,
        204,
        "all at the cap"
    );
    let pid = node.child.id();
    let before = cpu_seconds(pid);
    let started = Instant::now();
    let parked = consume(&mut client, "capped", "wait=2s");
    let waited = started.elapsed();
    let used = cpu_seconds(pid) - before;
    assert_eq!(parked.status, 204, "{parked:?}");
    assert!(
        waited >= Duration::from_millis(1900),
        "answered after {waited:?}"
    );
    assert!(
        used < 0.5,
        "the node used {used:.2} s of CPU while one consumer waited {waited:?}"
    );
}

/// One produce wakes one of many parked consumers, quickly, whichever shard they
/// are parked on; the others keep waiting until their own wait ends. "Quickly" is
/// the issue's 100 ms from the produce's 202 to the consumer's answer, as the
/// median of five rounds (a shared CI disk can stretch one commit, not most);
/// no round may take as long as a fallback timer would.
#[test]
fn one_produce_wakes_exactly_one_of_many_parked_consumers() {
    let node = Node::start_shards(3, &[]);
    let mut client = node.client();
    create(&mut client, "wake", json!({}));
    let consumers = 8;
    let mut latencies = Vec::new();
    for round in 0..5 {
        let results = Arc::new(Mutex::new(Vec::new()));
        let threads: Vec<_> = (0..consumers)
            .map(|_| {
                let results = results.clone();
                let mut c = node.client();
                std::thread::spawn(move || {
                    let response = consume(&mut c, "wake", "wait=2s");
                    results.lock().unwrap().push((response, Instant::now()));
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(400)); // all parked
        produce_ok(&mut client, "wake", "", format!("r{round}").as_bytes());
        let accepted_at = Instant::now();
        for t in threads {
            t.join().unwrap();
        }
        let results = results.lock().unwrap();
        let served: Vec<_> = results.iter().filter(|(r, _)| r.status == 200).collect();
        assert_eq!(
            served.len(),
            1,
            "round {round}: exactly one consumer gets it"
        );
        let latency = served[0].1.saturating_duration_since(accepted_at);
        assert!(
            latency < Duration::from_millis(450),
            "round {round}: woken {latency:?} after the produce was accepted"
        );
        latencies.push(latency);
        assert!(results
            .iter()
            .all(|(r, _)| r.status == 200 || r.status == 204));
        let handle = handle_of(&json_of(&served[0].0));
        assert_eq!(ack(&mut client, "wake", &handle, None).status, 204);
    }
    latencies.sort();
    assert!(
        latencies[2] < Duration::from_millis(100),
        "median wake {:?} (all: {latencies:?})",
        latencies[2]
    );
}

/// Many consumers on one topic: every record is delivered, none to two
/// consumers at once, and every ack lands.
#[test]
fn concurrent_consumers_never_share_a_lease() {
    let node = Node::start_shards(3, &[]);
    let mut client = node.client();
    create(&mut client, "shared", json!({ "partitions": 6 }));
    let total = 400;
    produce_visible(&mut client, "shared", 6, total);
    let seen = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let seen = seen.clone();
            let mut c = node.client();
            std::thread::spawn(move || {
                let query = if i % 2 == 0 {
                    "wait=500ms"
                } else {
                    "wait=500ms&max=7"
                };
                let mut empty = 0;
                while empty < 2 {
                    let response = consume(&mut c, "shared", query);
                    if response.status == 204 {
                        empty += 1;
                        continue;
                    }
                    assert_eq!(response.status, 200, "{response:?}");
                    let body = json_of(&response);
                    let messages = match body.get("messages") {
                        Some(list) => list.as_array().unwrap().clone(),
                        None => vec![body],
                    };
                    for m in messages {
                        let payload = m["payload"].as_str().unwrap().to_string();
                        *seen.lock().unwrap().entry(payload).or_default() += 1;
                        let acked = ack(&mut c, "shared", &handle_of(&m), None);
                        assert_eq!(acked.status, 204, "{acked:?}");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), total, "every record delivered");
    let twice: Vec<_> = seen.iter().filter(|(_, &n)| n > 1).collect();
    assert!(twice.is_empty(), "delivered twice: {twice:?}");
    wait_until(Duration::from_secs(1), "nothing left", || {
        (consume(&mut client, "shared", "").status == 204).then_some(())
    });
}

/// Deleting a topic answers the consumers parked on it at once, whichever shard
/// they wait on and whether or not they are pinned to a partition, rather than
/// at the end of their wait; and a topic made again under the same name hands
/// none of them anything.
#[test]
fn deleting_a_topic_answers_its_parked_consumers_at_once() {
    let node = Node::start_shards(3, &[]);
    let mut client = node.client();
    create(&mut client, "doomed", json!({ "partitions": 6 }));
    let queries: Vec<String> = (0..8)
        .map(|_| "wait=20s".to_string())
        .chain([0, 4].map(|p| format!("wait=20s&partition={p}")))
        .collect();
    let threads: Vec<_> = queries
        .into_iter()
        .map(|query| {
            let mut c = node.client();
            std::thread::spawn(move || {
                let response = consume(&mut c, "doomed", &query);
                (query, response, Instant::now())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500)); // all parked
    let deleted = client
        .request("DELETE", "/v1/topics/doomed", &[], "")
        .unwrap();
    assert_eq!(deleted.status, 204, "{deleted:?}");
    let deleted_at = Instant::now();
    // The same name again, with a record in every partition.
    create(&mut client, "doomed", json!({ "partitions": 6 }));
    for p in 0..6 {
        produce_ok(&mut client, "doomed", &format!("partition={p}"), b"new");
    }
    for t in threads {
        let (query, response, answered_at) = t.join().unwrap();
        let after = answered_at.saturating_duration_since(deleted_at);
        assert!(
            after < Duration::from_secs(5),
            "{query}: answered {after:?} after the delete"
        );
        assert!(
            matches!(response.status, 404 | 204),
            "{query}: {response:?}"
        );
    }
    // Every record of the new topic is still there for its own consumers.
    let mut got = 0;
    while got < 6 {
        let response = consume(&mut client, "doomed", "wait=2s&max=6");
        assert_eq!(response.status, 200, "after {got}: {response:?}");
        got += json_of(&response)["messages"].as_array().unwrap().len();
    }
    assert_eq!(got, 6);
}

/// Consumers that hang up while parked, on every shard and pinned or not, take
/// nothing with them: records produced after they left go to the consumers
/// still there, at once, not after a visibility timeout.
#[test]
fn consumers_that_hang_up_while_parked_take_no_records_with_them() {
    let node = Node::start_shards(3, &[]);
    let mut client = node.client();
    create(&mut client, "fickle", json!({ "partitions": 6 }));
    // Parked, then gone: their connections close with the requests unanswered.
    let mut leavers = Vec::new();
    for i in 0..12 {
        let mut c = node.client();
        let query = if i % 3 == 0 {
            format!("wait=20s&partition={}", i % 6)
        } else {
            "wait=20s".to_string()
        };
        let request = format!(
            "GET /v1/topics/fickle/consume?{query} HTTP/1.1\r\nhost: test\r\nx-narad-client: t\r\n\r\n"
        );
        std::io::Write::write_all(&mut c.stream, request.as_bytes()).unwrap();
        leavers.push(c);
    }
    std::thread::sleep(Duration::from_millis(500));
    drop(leavers);
    std::thread::sleep(Duration::from_millis(300));
    for p in 0..6 {
        produce_ok(&mut client, "fickle", &format!("partition={p}"), b"kept");
    }
    let started = Instant::now();
    let mut got = 0;
    while got < 6 {
        let response = consume(&mut client, "fickle", "wait=2s&max=6");
        assert_eq!(
            response.status,
            200,
            "after {got} in {:?}: {response:?}",
            started.elapsed()
        );
        got += json_of(&response)["messages"].as_array().unwrap().len();
    }
    assert_eq!(got, 6);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}
