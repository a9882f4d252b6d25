//! `GET /metrics` as a scraper sees it: after a known sequence of requests the
//! counters say exactly what happened, summed over the shards that served them;
//! the queue and housekeeping gauges follow the node (the storage series are
//! in `metrics_storage.rs`).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::prometheus::{scrape, sum};
use common::{json_of, post_topic, produce_ok, wait_for_total, wait_until, Client, Node, JSON};
use serde_json::json;

#[test]
fn counters_follow_a_known_sequence_of_requests() {
    let node = Node::start_shards(2, &[]);
    let mut client = node.client();
    // Counters of rare events are there, at 0, before any of them happened.
    let fresh = scrape(&mut client);
    for series in [
        "narad_reaper_restarts",
        "narad_idle_logs_evicted_total",
        "narad_cold_retention_panics_total",
        "narad_ack_rejected_total",
        "narad_ingress_wal_syncs_total",
        "narad_ingress_wal_synced_records_total",
        r#"narad_errors_total{component="storage",kind="fsync_poisoned"}"#,
        r#"narad_errors_total{component="storage",kind="retention_unlink"}"#,
        r#"narad_errors_total{component="storage",kind="retention_panic"}"#,
    ] {
        assert_eq!(fresh.get(series), Some(&0.0), "{series} in {fresh:?}");
    }
    // (The readiness probes before recovery ended may have counted 503s here.)
    assert!(fresh.contains_key(r#"narad_errors_total{component="http",kind="5xx"}"#));
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
    // The ingress WALs made each record durable once, in group commits that
    // each wrote at least a block.
    let wal = |name: &str| sum(&samples, name, &[]);
    assert_eq!(wal("narad_ingress_wal_synced_records_total"), 15.0);
    let syncs = wal("narad_ingress_wal_syncs_total");
    assert!((2.0..=15.0).contains(&syncs), "{syncs} group commits");
    assert_eq!(wal("narad_ingress_wal_sync_duration_seconds_count"), syncs);
    assert!(wal("narad_ingress_wal_device_bytes_total") >= 4096.0 * syncs);
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
    assert_eq!(
        sum(
            &samples,
            "narad_http_request_bytes_in_total",
            &[produce_route]
        ),
        10.0,
        "five bodies of 2 bytes"
    );
    assert_eq!(
        sum(
            &samples,
            "narad_http_response_bytes_out_total",
            &[produce_route]
        ),
        0.0,
        "202s are empty"
    );
    assert!(
        sum(
            &samples,
            "narad_http_response_bytes_out_total",
            &["route=\"/v1/topics/{topic}/consume\""]
        ) > 0.0
    );
    assert_eq!(
        sum(&samples, "narad_http_requests_in_flight", &[]),
        1.0,
        "the scrape itself"
    );
    assert!(sum(&samples, "narad_data_dir_available_bytes", &[]) > 0.0);
    assert!(sum(&samples, "narad_produce_to_committed_seconds_count", &[]) >= 15.0);
    // Every committed record was dispatched first.
    let dispatched = sum(&samples, "narad_produce_to_dispatched_seconds_count", &[]);
    assert!(dispatched >= 15.0, "{dispatched}");
    assert!(
        samples.contains_key("narad_ingress_wal_failed"),
        "{samples:?}"
    );
    assert_eq!(sum(&samples, "narad_ingress_wal_failed", &[]), 0.0);
    assert!(
        samples.contains_key("narad_ingress_wal_stalled"),
        "{samples:?}"
    );
    assert_eq!(sum(&samples, "narad_ingress_wal_stalled", &[]), 0.0);
    // The only 5xx answers are /readyz's 503s while the node started: the
    // node's state, not errors.
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
        0.0
    );

    // Counters keep counting after the topic is deleted.
    let deleted = client.request("DELETE", "/v1/topics/m", &[], "").unwrap();
    assert_eq!(deleted.status, 204);
    let after = scrape(&mut client);
    assert_eq!(sum(&after, "narad_messages_produced_total", &[topic]), 15.0);
}

#[test]
fn consume_outcomes_are_counted_by_how_each_consume_ended() {
    let node = Node::start_shards(2, &[]);
    let mut client = node.client();
    let body = json!({ "name": "w", "partitions": 3 }).to_string();
    assert_eq!(post_topic(&mut client, &body).status, 201);
    let consume = |client: &mut Client, query: &str| {
        let path = format!("/v1/topics/w/consume?{query}");
        client
            .request("GET", &path, &[("x-narad-client", "test")], "")
            .unwrap()
    };
    assert_eq!(consume(&mut client, "").status, 204);
    assert_eq!(consume(&mut client, "wait=200ms").status, 204);

    // A long-poll whose client goes away is counted as cancelled.
    let mut gone = std::net::TcpStream::connect(node.addr).unwrap();
    std::io::Write::write_all(
        &mut gone,
        b"GET /v1/topics/w/consume?wait=5s HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(gone);
    let outcome = |samples: &BTreeMap<String, f64>, outcome: &str| {
        let label = format!("outcome=\"{outcome}\"");
        sum(
            samples,
            "narad_consume_wait_seconds_count",
            &["topic=\"w\"", &label],
        )
    };
    wait_until(Duration::from_secs(4), "a cancelled consume", || {
        (outcome(&scrape(&mut client), "cancelled") == 1.0).then_some(())
    });
    // The request itself is counted too, under 499 (client gone), as proxies do.
    let gone_requests = sum(
        &scrape(&mut client),
        "narad_http_requests_total",
        &["route=\"/v1/topics/{topic}/consume\"", "status=\"499\""],
    );
    assert_eq!(gone_requests, 1.0);

    produce_ok(&mut client, "w", "partition=0", b"one");
    assert_eq!(consume(&mut client, "wait=5s").status, 200);
    for i in 0..3 {
        produce_ok(&mut client, "w", "partition=1", format!("b{i}").as_bytes());
    }
    wait_for_total(&mut client, "w", 3, 4, Duration::from_secs(20));
    let batch = consume(&mut client, "max=10");
    assert_eq!(batch.status, 200, "{batch:?}");
    assert_eq!(json_of(&batch)["messages"].as_array().unwrap().len(), 3);

    let samples = scrape(&mut client);
    assert_eq!(outcome(&samples, "no_wait"), 2.0, "{samples:#?}");
    assert_eq!(outcome(&samples, "timeout"), 1.0);
    assert_eq!(outcome(&samples, "cancelled"), 1.0);
    assert_eq!(outcome(&samples, "hit"), 1.0);
    assert_eq!(
        sum(&samples, "narad_consume_empty_total", &["topic=\"w\""]),
        2.0
    );
    assert_eq!(
        sum(&samples, "narad_messages_consumed_total", &["topic=\"w\""]),
        4.0
    );
    // The queue gauges come with the next poll (every 5 s): nothing was dropped
    // by retention or skipped as corrupt.
    let polled = wait_until(Duration::from_secs(8), "the queue gauges", || {
        let samples = scrape(&mut client);
        samples
            .keys()
            .any(|k| k.starts_with("narad_consumer_dropped_messages{") && k.contains("topic=\"w\""))
            .then_some(samples)
    });
    for name in [
        "narad_consumer_dropped_messages",
        "narad_consumer_corrupt_skipped_total",
    ] {
        assert_eq!(sum(&polled, name, &["topic=\"w\""]), 0.0, "{name}");
    }
    // Every polled partition shows its corrupt-skip counter, at 0, before any
    // skip: `increase()` needs the series before its first event.
    let labels_of = |name: &str| -> Vec<String> {
        let prefix = format!("{name}{{");
        polled
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix))
            .filter(|labels| labels.contains("topic=\"w\""))
            .map(String::from)
            .collect()
    };
    assert_eq!(
        labels_of("narad_consumer_corrupt_skipped_total"),
        labels_of("narad_consumer_dropped_messages"),
    );
}

#[test]
fn topic_size_data_dir_size_and_the_oldest_unacked_age_are_polled() {
    let node = Node::start_shards(2, &[("NARAD_DEBUG_METRICS_POLL_MS", "100")]);
    let mut client = node.client();
    let body = json!({ "name": "aged", "partitions": 3 }).to_string();
    assert_eq!(post_topic(&mut client, &body).status, 201);
    for i in 0..6 {
        produce_ok(&mut client, "aged", "", format!("record {i}").as_bytes());
    }
    wait_for_total(&mut client, "aged", 3, 6, Duration::from_secs(20));
    let topic = "topic=\"aged\"";

    // The topic's size is the sum of its partitions', over both shards.
    let samples = wait_until(Duration::from_secs(10), "topic bytes", || {
        let samples = scrape(&mut client);
        let partitions = sum(&samples, "narad_partition_size_bytes", &[topic]);
        (partitions > 0.0 && sum(&samples, "narad_topic_bytes", &[topic]) == partitions)
            .then_some(samples)
    });
    // One topic of three partitions exists, counted once over both shards.
    assert_eq!(sum(&samples, "narad_topics_total", &[]), 1.0);
    assert_eq!(sum(&samples, "narad_partitions_total", &[]), 3.0);
    // Set once, when every shard had recovered its storage.
    let boot = sum(&samples, "narad_boot_duration_seconds", &[]);
    assert!(boot > 0.0 && boot < 30.0, "boot took {boot} s");
    let data_dir = sum(&samples, "narad_data_dir_size_bytes", &[]);
    assert!(
        data_dir >= sum(&samples, "narad_topic_bytes", &[topic]),
        "the data directory holds the topic: {data_dir}"
    );

    // Nothing acked: the oldest record's age grows with the time since commit.
    // A partition's consumer state is loaded by the first consume that asks
    // for it: one pinned consume per partition, nacked at once.
    for p in 0..3 {
        let handle = common::lease_one(&mut client, "aged", p);
        let path = format!("/v1/topics/aged/ack?receipt_handle={handle}&extend=0");
        assert_eq!(
            client.request("POST", &path, &JSON, "").unwrap().status,
            204
        );
    }
    std::thread::sleep(Duration::from_millis(1_500));
    let oldest = wait_until(Duration::from_secs(10), "an age past 1 s", || {
        let samples = scrape(&mut client);
        let ages: Vec<f64> = (0..3)
            .map(|p| {
                let label = format!("partition=\"{p}\"");
                sum(
                    &samples,
                    "narad_oldest_unconsumed_message_age_seconds",
                    &[topic, &label],
                )
            })
            .collect();
        ages.iter().all(|&a| a >= 1.0).then_some(ages)
    });
    assert!(oldest.iter().all(|&a| a < 60.0), "{oldest:?}");

    // Consume and ack everything: every partition's age is 0.
    let mut acked = 0;
    while acked < 6 {
        let response = client
            .request("GET", "/v1/topics/aged/consume?wait=2s", &[], "")
            .unwrap();
        assert_eq!(response.status, 200, "{response:?}");
        let handle = json_of(&response)["receipt_handle"]
            .as_str()
            .unwrap()
            .to_string();
        let path = format!("/v1/topics/aged/ack?receipt_handle={handle}");
        assert_eq!(
            client.request("POST", &path, &JSON, "").unwrap().status,
            204
        );
        acked += 1;
    }
    wait_until(Duration::from_secs(10), "ages back to 0", || {
        let samples = scrape(&mut client);
        let ages = sum(
            &samples,
            "narad_oldest_unconsumed_message_age_seconds",
            &[topic],
        );
        (ages == 0.0).then_some(())
    });

    // A deleted topic's size reads 0.
    let deleted = client
        .request("DELETE", "/v1/topics/aged", &[], "")
        .unwrap();
    assert_eq!(deleted.status, 204);
    wait_until(Duration::from_secs(10), "topic bytes zeroed", || {
        let samples = scrape(&mut client);
        (sum(&samples, "narad_topic_bytes", &[topic]) == 0.0).then_some(())
    });
}

#[test]
fn queue_gauges_of_a_deleted_topic_go_back_to_zero() {
    let node = Node::start_shards(2, &[("NARAD_DEBUG_METRICS_POLL_MS", "100")]);
    let mut client = node.client();
    let body = json!({ "name": "gone", "partitions": 4 }).to_string();
    assert_eq!(post_topic(&mut client, &body).status, 201);
    for p in 0..4 {
        produce_ok(&mut client, "gone", &format!("partition={p}"), b"record");
    }
    wait_for_total(&mut client, "gone", 4, 4, Duration::from_secs(20));
    // One record of each partition leased and kept: in flight, lagging, aging.
    for p in 0..4 {
        common::lease_one(&mut client, "gone", p);
    }
    let topic = "topic=\"gone\"";
    let gauges = |samples: &BTreeMap<String, f64>| {
        [
            "narad_inflight_size",
            "narad_consumer_lag_messages",
            "narad_oldest_unconsumed_message_age_seconds",
        ]
        .map(|name| sum(samples, name, &[topic]))
    };
    wait_until(Duration::from_secs(10), "the queue gauges set", || {
        let samples = scrape(&mut client);
        let [in_flight, lag, age] = gauges(&samples);
        let size = sum(&samples, "narad_topic_bytes", &[topic]);
        (in_flight == 4.0 && lag == 4.0 && age > 0.0 && size > 0.0).then_some(())
    });
    let deleted = client
        .request("DELETE", "/v1/topics/gone", &[], "")
        .unwrap();
    assert_eq!(deleted.status, 204);
    // Several polls later, nothing is left of them: the deleted topic's
    // gauges are not even shown, so topics that come and go do not pile up
    // in the scrape; its counters stay.
    std::thread::sleep(Duration::from_millis(500));
    let after = scrape(&mut client);
    assert_eq!(gauges(&after), [0.0; 3]);
    // Counters and histograms aside.
    let is_gauge = |series: &&String| {
        let name = series.split('{').next().unwrap();
        ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .all(|suffix| !name.ends_with(suffix))
    };
    let gauges_left: Vec<&String> = (after.keys())
        .filter(|series| series.contains(topic))
        .filter(is_gauge)
        .collect();
    assert!(gauges_left.is_empty(), "{gauges_left:#?}");
    assert_eq!(sum(&after, "narad_messages_produced_total", &[topic]), 4.0);
    // Made again under the name, with fewer partitions, the topic shows its
    // gauges again: its own values (not the deleted topic's size), for the
    // partitions it has.
    let body = json!({ "name": "gone", "partitions": 3 }).to_string();
    assert_eq!(post_topic(&mut client, &body).status, 201);
    let again = scrape(&mut client);
    assert_eq!(sum(&again, "narad_topic_bytes", &[topic]), 0.0);
    let past_the_end: Vec<&String> = (again.keys())
        .filter(|series| series.contains(topic) && series.contains("partition=\"3\""))
        .filter(is_gauge)
        .collect();
    assert!(past_the_end.is_empty(), "{past_the_end:#?}");
    wait_until(Duration::from_secs(10), "the gauges shown again", || {
        let samples = scrape(&mut client);
        let shown = samples
            .keys()
            .filter(|s| s.starts_with("narad_consumer_lag_messages{") && s.contains(topic))
            .count();
        (shown == 3).then_some(())
    });
}

/// After a restart, a backlog nobody consumes shows in the lag and age
/// gauges: the poller loads the consumer state of partitions no consumer has
/// touched, and leaves their logs closed.
#[test]
fn a_backlog_nobody_consumes_shows_its_lag_after_a_restart() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    let env = [("NARAD_DEBUG_METRICS_POLL_MS", "100")];
    let mut node = Node::start_in(&data, 2, &env);
    let mut client = node.client();
    let body = json!({ "name": "backlog", "partitions": 3 }).to_string();
    assert_eq!(post_topic(&mut client, &body).status, 201);
    for i in 0..7 {
        produce_ok(&mut client, "backlog", "", format!("record {i}").as_bytes());
    }
    wait_for_total(&mut client, "backlog", 3, 7, Duration::from_secs(20));
    node.sigterm();
    assert!(node.wait_for_exit(Duration::from_secs(30)).success());
    drop(node);

    let node = Node::start_in(&data, 2, &env);
    let mut client = node.client();
    let topic = "topic=\"backlog\"";
    wait_until(
        Duration::from_secs(10),
        "the lag of every partition",
        || {
            let samples = scrape(&mut client);
            let lag = sum(&samples, "narad_consumer_lag_messages", &[topic]);
            let age = sum(
                &samples,
                "narad_oldest_unconsumed_message_age_seconds",
                &[topic],
            );
            (lag == 7.0 && age > 0.0).then_some(())
        },
    );
    // Learning that took no log kept open: each was opened for its load or
    // its peek and closed again, not held with its read window and cache
    // until idle eviction (a restarted node with thousands of partitions
    // grew by hundreds of megabytes so).
    wait_until(Duration::from_secs(5), "no log left open", || {
        let open = sum(&scrape(&mut client), "narad_open_partition_logs", &[]);
        (open == 0.0).then_some(())
    });
}

#[test]
fn the_age_poll_lets_a_lagging_partition_close_when_idle() {
    // Logs idle for 300 ms close at the reaper's next check (every 100 ms); the
    // gauges are polled every 50 ms.
    let node = Node::start_with_config(
        1,
        r#"{"storage": {"idle_log_eviction_ms": 300}}"#,
        &[
            ("NARAD_DEBUG_METRICS_POLL_MS", "50"),
            ("NARAD_DEBUG_RETENTION_CHECK_INTERVAL_MS", "100"),
        ],
    );
    let mut client = node.client();
    let body = json!({ "name": "left", "partitions": 3 }).to_string();
    assert_eq!(post_topic(&mut client, &body).status, 201);
    produce_ok(&mut client, "left", "", b"never acked");
    wait_for_total(&mut client, "left", 3, 1, Duration::from_secs(20));
    // A consumer takes the record and leaves it: the partition lags.
    let response = client
        .request("GET", "/v1/topics/left/consume?wait=2s", &[], "")
        .unwrap();
    assert_eq!(response.status, 200, "{response:?}");
    let topic = "topic=\"left\"";
    let open_logs = |client: &mut Client| sum(&scrape(client), "narad_open_partition_logs", &[]);
    wait_until(Duration::from_secs(10), "the idle logs closed", || {
        (open_logs(&mut client) == 0.0).then_some(())
    });
    let age = |client: &mut Client| {
        sum(
            &scrape(client),
            "narad_oldest_unconsumed_message_age_seconds",
            &[topic],
        )
    };
    let closed_at = age(&mut client);
    // A second of polls later, the logs are still closed, and the age of the
    // record nobody acked still grows.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(open_logs(&mut client), 0.0);
    let later = age(&mut client);
    assert!(later >= closed_at + 0.5, "{closed_at} then {later}");
}

#[test]
fn housekeeping_series_count_the_cold_walk_quarantine_and_each_loops_last_success() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    // Finite retentions are 2 s; the reaper checks every 100 ms. The gauge
    // poller leaves the logs closed (it would open them to load their
    // consumer state, and the hot retention check would then reap them).
    let env = [
        ("NARAD_DEBUG_RETENTION_MS_OVERRIDE", "2000"),
        ("NARAD_DEBUG_RETENTION_CHECK_INTERVAL_MS", "100"),
        ("NARAD_DEBUG_METRICS_POLL_MS", "100"),
        ("NARAD_DEBUG_METRICS_QUEUE_LOADS", "0"),
    ];
    let mut node = Node::start_in(&data, 1, &env);
    let mut client = node.client();
    let body = json!({ "name": "cold", "partitions": 3 }).to_string();
    assert_eq!(post_topic(&mut client, &body).status, 201);
    for i in 0..6 {
        produce_ok(&mut client, "cold", "", format!("record {i}").as_bytes());
    }
    wait_for_total(&mut client, "cold", 3, 6, Duration::from_secs(20));
    node.sigterm();
    assert!(node.wait_for_exit(Duration::from_secs(30)).success());
    drop(node);
    // Data no topic owns, which the next start moves to quarantine.
    let ghost = data
        .join("topics")
        .join("ghost")
        .join("0123456789abcdef0123456789abcdef")
        .join("p00000");
    std::fs::create_dir_all(&ghost).unwrap();
    std::fs::write(ghost.join("00000000000000000000.log"), vec![7u8; 8192]).unwrap();
    // The records age past the retention while the node is down: after the
    // restart every log is closed, and only the cold walk can reap them.
    std::thread::sleep(Duration::from_millis(2_500));

    let started = common::unix_now_s() as f64;
    let node = Node::start_in(&data, 1, &env);
    let mut client = node.client();
    let samples = wait_until(Duration::from_secs(20), "the cold walk swept", || {
        let samples = scrape(&mut client);
        (sum(&samples, "narad_cold_retention_swept_total", &[]) >= 1.0).then_some(samples)
    });
    assert_eq!(sum(&samples, "narad_quarantined_copies", &[]), 1.0);
    assert!(sum(&samples, "narad_quarantined_bytes", &[]) >= 8192.0);
    assert_eq!(sum(&samples, "narad_orphan_topic_dirs", &[]), 0.0);
    let samples = wait_until(Duration::from_secs(20), "every loop succeeded", || {
        let samples = scrape(&mut client);
        let loops = ["gauges", "data_dir", "retention", "cold_retention"];
        let at: Vec<f64> = loops
            .iter()
            .map(|name| {
                let label = format!("loop=\"{name}\"");
                sum(
                    &samples,
                    "narad_poller_last_success_timestamp_seconds",
                    &[&label],
                )
            })
            .collect();
        at.iter().all(|&t| t >= started - 1.0).then_some(at)
    });
    let now = common::unix_now_s() as f64;
    assert!(samples.iter().all(|&t| t <= now + 1.0), "{samples:?}");
}
