//! Retention as a client sees it: with the debug hooks making a finite retention
//! three seconds and the reaper's check interval 100 ms, produced records age out,
//! `oldest_offset` in `partition_stats` moves forward, the queue gauges count the
//! records dropped at once, a replay below it answers 410, a queue consumer
//! whose backlog aged out is served only retained records,
//! and a topic kept forever keeps everything.

mod common;

use std::time::Duration;

use common::{
    error_of, get_topic, json_of, post_topic, produce_ok, replay, wait_for_total, wait_until,
    Client, Node, JSON,
};
use serde_json::{json, Value};

/// What the debug hook makes every finite retention.
const RETENTION_MS: u64 = 3_000;

fn hooks() -> [(&'static str, String); 4] {
    [
        (
            "NARAD_DEBUG_RETENTION_MS_OVERRIDE",
            RETENTION_MS.to_string(),
        ),
        ("NARAD_DEBUG_RETENTION_CHECK_INTERVAL_MS", "100".to_string()),
        ("NARAD_HTTP_MAX_CONSUME_WAIT", "1s".to_string()),
        // The gauge poller every 100 ms: it loads every partition's consumer
        // state long before the records age out.
        ("NARAD_DEBUG_METRICS_POLL_MS", "100".to_string()),
    ]
}

/// The sum over the topic's partitions of a queue gauge, from `/metrics`.
fn queue_gauge(client: &mut Client, name: &str, topic: &str) -> f64 {
    let text = client.request("GET", "/metrics", &[], "").unwrap().body;
    let prefix = format!("{name}{{");
    let label = format!("topic=\"{topic}\"");
    text.lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(&label))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

fn create(client: &mut Client, body: Value) {
    let response = post_topic(client, &body.to_string());
    assert_eq!(response.status, 201, "{response:?}");
}

/// `(oldest_offset, next_offset)` of every partition, in partition order.
fn offsets(client: &mut Client, topic: &str) -> Vec<(u64, u64)> {
    get_topic(client, topic)["partition_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let field = |name: &str| s[name].as_u64().unwrap_or_else(|| panic!("{s}"));
            (field("oldest_offset"), field("next_offset"))
        })
        .collect()
}

/// One queue consume with a short wait: the message, or `None` on 204.
fn consume_one(client: &mut Client, topic: &str) -> Option<Value> {
    let path = format!("/v1/topics/{topic}/consume?wait=200ms");
    let response = client.request("GET", &path, &[], "").unwrap();
    match response.status {
        200 => Some(json_of(&response)),
        204 => None,
        _ => panic!("consume {topic}: {response:?}"),
    }
}

fn ack(client: &mut Client, topic: &str, message: &Value) {
    let handle = message["receipt_handle"].as_str().unwrap();
    let path = format!("/v1/topics/{topic}/ack?receipt_handle={handle}");
    let response = client.request("POST", &path, &JSON, "").unwrap();
    assert_eq!(response.status, 204, "{response:?}");
}

#[test]
fn aged_records_are_deleted_replay_answers_410_and_consumers_get_only_retained_records() {
    let env = hooks();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let node = Node::start(&env);
    let mut client = node.client();
    create(&mut client, json!({ "name": "aging", "partitions": 3 }));
    create(
        &mut client,
        json!({ "name": "kept", "partitions": 3, "retention_ms": 0 }),
    );
    // The API still shows (and enforces) the real retention.
    assert_eq!(get_topic(&mut client, "aging")["retention_ms"], 604_800_000);
    for i in 0..9 {
        produce_ok(&mut client, "aging", "", format!("old-{i}").as_bytes());
        produce_ok(&mut client, "kept", "", format!("kept-{i}").as_bytes());
    }
    wait_for_total(&mut client, "aging", 3, 9, Duration::from_secs(20));
    wait_for_total(&mut client, "kept", 3, 9, Duration::from_secs(20));
    // A consumer takes and acks one record before the rest age out.
    let first = consume_one(&mut client, "aging").expect("a record to consume");
    ack(&mut client, "aging", &first);

    let before = offsets(&mut client, "aging");
    assert!(before.iter().all(|&(oldest, _)| oldest == 0), "{before:?}");
    let trimmed = wait_until(Duration::from_secs(20), "retention trims aging", || {
        let now = offsets(&mut client, "aging");
        let all_gone = now
            .iter()
            .zip(&before)
            .all(|(&(oldest, next), &(_, was))| oldest == was && next == was);
        all_gone.then_some(now)
    });
    assert!(trimmed.iter().any(|&(oldest, _)| oldest > 0), "{trimmed:?}");
    // The consumer state follows at once, with no consume to trip over the
    // gap: the 8 records nobody acked count as dropped, nothing lags, and no
    // age is left behind.
    wait_until(
        Duration::from_secs(5),
        "queue gauges count the drop",
        || {
            let dropped = queue_gauge(&mut client, "narad_consumer_dropped_messages", "aging");
            let lag = queue_gauge(&mut client, "narad_consumer_lag_messages", "aging");
            let age = queue_gauge(
                &mut client,
                "narad_oldest_unconsumed_message_age_seconds",
                "aging",
            );
            (dropped == 8.0 && lag == 0.0 && age == 0.0).then_some(())
        },
    );

    // Replay below the oldest retained offset answers 410 and names it.
    let (partition, &(oldest, _)) = trimmed
        .iter()
        .enumerate()
        .find(|(_, &(oldest, _))| oldest > 0)
        .unwrap();
    let gone = replay(&mut client, "aging", partition as u32, 0);
    assert_eq!(gone.status, 410, "{gone:?}");
    assert!(error_of(&gone).contains(&oldest.to_string()), "{gone:?}");
    // At the oldest offset there is nothing yet: 204, not 410.
    let at_end = replay(&mut client, "aging", partition as u32, oldest);
    assert_eq!(at_end.status, 204, "{at_end:?}");

    // New records are retained; the queue consumer jumps over the aged-out
    // backlog and is served only them.
    for i in 0..3 {
        produce_ok(&mut client, "aging", "", format!("new-{i}").as_bytes());
    }
    let mut delivered = Vec::new();
    wait_until(Duration::from_secs(10), "3 new records consumed", || {
        while let Some(message) = consume_one(&mut client, "aging") {
            ack(&mut client, "aging", &message);
            delivered.push(message["payload"].as_str().unwrap().to_string());
        }
        (delivered.len() >= 3).then_some(())
    });
    delivered.sort();
    assert_eq!(delivered, ["new-0", "new-1", "new-2"]);

    // The topic kept forever lost nothing.
    let kept = offsets(&mut client, "kept");
    assert!(kept.iter().all(|&(oldest, _)| oldest == 0), "{kept:?}");
    assert_eq!(kept.iter().map(|&(_, next)| next).sum::<u64>(), 9);
    assert_eq!(replay(&mut client, "kept", 0, 0).status, 200);
}
