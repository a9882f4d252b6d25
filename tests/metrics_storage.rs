//! `GET /metrics` as a scraper sees it, for the partition logs: the storage
//! series follow the logs' commits, size and retention, and a deleted topic's
//! gauges go.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::prometheus::{scrape, sum};
use common::{get_topic, post_topic, produce_ok, wait_for_total, wait_until, Client, Node, JSON};
use serde_json::json;

/// The storage series of one partition, as scraped.
#[derive(Debug, PartialEq)]
struct Storage {
    fsync_count: f64,
    fsync_sum_seconds: f64,
    flush_count: f64,
    flush_bytes: f64,
    size_bytes: f64,
    segments: f64,
}

fn storage_of(samples: &BTreeMap<String, f64>, topic: &str, partition: u32) -> Storage {
    let topic = format!("topic=\"{topic}\"");
    let partition = format!("partition=\"{partition}\"");
    let labels = [topic.as_str(), partition.as_str()];
    Storage {
        fsync_count: sum(
            samples,
            "narad_storage_fsync_duration_seconds_count",
            &labels,
        ),
        fsync_sum_seconds: sum(samples, "narad_storage_fsync_duration_seconds_sum", &labels),
        flush_count: sum(
            samples,
            "narad_storage_flush_duration_seconds_count",
            &labels,
        ),
        flush_bytes: sum(samples, "narad_storage_flush_bytes_total", &labels),
        size_bytes: sum(samples, "narad_partition_size_bytes", &labels),
        segments: sum(samples, "narad_segments", &labels),
    }
}

/// `(size_bytes, segments)` of a partition as the topic API reports them.
fn api_shape(client: &mut Client, topic: &str, partition: usize) -> (f64, f64) {
    let stats = &get_topic(client, topic)["partition_stats"][partition];
    let field = |name: &str| stats[name].as_f64().unwrap_or_else(|| panic!("{stats}"));
    (field("size_bytes"), field("segments"))
}

#[test]
fn storage_series_follow_commits_and_are_zeroed_when_the_topic_goes() {
    let node = Node::start_shards(2, &[]);
    let mut client = node.client();
    let body = json!({ "name": "s", "partitions": 3 }).to_string();
    assert_eq!(post_topic(&mut client, &body).status, 201);
    let nothing = storage_of(&scrape(&mut client), "s", 0);
    assert_eq!(nothing.fsync_count, 0.0, "{nothing:?}");

    // Each produce is waited for, so each is its own commit.
    let payload = [b'x'; 100];
    for round in 1..=4usize {
        produce_ok(&mut client, "s", "partition=0", &payload);
        wait_for_total(&mut client, "s", 3, round, Duration::from_secs(20));
    }
    let first = storage_of(&scrape(&mut client), "s", 0);
    assert!(first.fsync_count >= 4.0, "{first:?}");
    assert_eq!(first.flush_count, first.fsync_count, "{first:?}");
    assert!(first.fsync_sum_seconds > 0.0, "{first:?}");
    assert!(
        first.flush_bytes >= 400.0,
        "frames hold the payloads: {first:?}"
    );
    // Nothing was deleted, so the log holds every byte commits wrote.
    assert_eq!(first.size_bytes, first.flush_bytes, "{first:?}");
    assert_eq!(first.segments, 1.0, "{first:?}");
    assert_eq!(
        api_shape(&mut client, "s", 0),
        (first.size_bytes, first.segments)
    );
    // The other partition got nothing, so no series.
    let idle = storage_of(&scrape(&mut client), "s", 1);
    assert_eq!(idle.flush_bytes, 0.0, "{idle:?}");

    // A batch of ten more records: the counters move by at least their bytes.
    let batch = json!({ "messages": (0..10)
        .map(|_| json!({ "payload": "y".repeat(100), "partition": 0 }))
        .collect::<Vec<_>>() });
    let response = client
        .request(
            "POST",
            "/v1/topics/s/produce/batch",
            &JSON,
            batch.to_string(),
        )
        .unwrap();
    assert_eq!(response.status, 202, "{response:?}");
    wait_for_total(&mut client, "s", 3, 14, Duration::from_secs(20));
    let second = storage_of(&scrape(&mut client), "s", 0);
    assert!(second.fsync_count > first.fsync_count, "{second:?}");
    assert!(second.flush_count > first.flush_count, "{second:?}");
    assert!(
        second.flush_bytes >= first.flush_bytes + 1000.0,
        "{first:?} {second:?}"
    );
    assert_eq!(second.size_bytes, second.flush_bytes, "{second:?}");
    assert_eq!(
        api_shape(&mut client, "s", 0),
        (second.size_bytes, second.segments)
    );

    // A replay right behind the head is answered from memory, not the device.
    let reads = |client: &mut Client, source: &str| {
        let source = format!("source=\"{source}\"");
        sum(
            &scrape(client),
            "narad_partition_reads_total",
            &["topic=\"s\"", "partition=\"0\"", source.as_str()],
        )
    };
    let (memory_before, device_before) =
        (reads(&mut client, "memory"), reads(&mut client, "device"));
    let replay = client
        .request("GET", "/v1/topics/s/consume?partition=0&offset=0", &[], "")
        .unwrap();
    assert_eq!(replay.status, 200, "{replay:?}");
    assert_eq!(reads(&mut client, "memory"), memory_before + 1.0);
    assert_eq!(reads(&mut client, "device"), device_before);
    let device_bytes = sum(
        &scrape(&mut client),
        "narad_partition_device_read_bytes_total",
        &["topic=\"s\"", "partition=\"0\""],
    );
    assert_eq!(
        device_bytes, 0.0,
        "nothing of this partition came from the device"
    );

    // The poller (every 5 s, and once at start) counts the open logs.
    let open = wait_until(Duration::from_secs(12), "open logs counted", || {
        let open = sum(&scrape(&mut client), "narad_open_partition_logs", &[]);
        (open >= 1.0).then_some(open)
    });
    assert!(open <= 3.0, "{open}");

    // After the delete the gauges read zero; the counters keep their values.
    let deleted = client.request("DELETE", "/v1/topics/s", &[], "").unwrap();
    assert_eq!(deleted.status, 204);
    let gone = storage_of(&scrape(&mut client), "s", 0);
    assert_eq!((gone.size_bytes, gone.segments), (0.0, 0.0), "{gone:?}");
    assert_eq!(gone.flush_bytes, second.flush_bytes, "{gone:?}");
    assert_eq!(gone.fsync_count, second.fsync_count, "{gone:?}");
}

#[test]
fn retention_counts_what_it_deletes() {
    // The debug hooks make every finite retention 1.5 s and check every 100 ms.
    let env = [
        ("NARAD_DEBUG_RETENTION_MS_OVERRIDE", "1500"),
        ("NARAD_DEBUG_RETENTION_CHECK_INTERVAL_MS", "100"),
    ];
    let node = Node::start(&env);
    let mut client = node.client();
    let body = json!({ "name": "r", "partitions": 3 }).to_string();
    assert_eq!(post_topic(&mut client, &body).status, 201);
    for i in 0..6 {
        produce_ok(
            &mut client,
            "r",
            "partition=0",
            format!("old-{i}").as_bytes(),
        );
    }
    wait_for_total(&mut client, "r", 3, 6, Duration::from_secs(20));
    let written = storage_of(&scrape(&mut client), "r", 0);
    assert!(written.size_bytes > 0.0, "{written:?}");

    // The reaper rolls the segment once it is old, then deletes it.
    let topic = "topic=\"r\"";
    let deleted = wait_until(Duration::from_secs(20), "retention deletes", || {
        let samples = scrape(&mut client);
        let messages = sum(
            &samples,
            "narad_storage_retention_messages_deleted_total",
            &[topic, "reason=\"age\""],
        );
        (messages > 0.0).then_some(samples)
    });
    let messages = sum(
        &deleted,
        "narad_storage_retention_messages_deleted_total",
        &[topic, "partition=\"0\""],
    );
    let bytes = sum(
        &deleted,
        "narad_storage_retention_bytes_deleted_total",
        &[topic, "partition=\"0\""],
    );
    assert_eq!(messages, 6.0);
    assert_eq!(bytes, written.size_bytes);
    // Every partition's runs are timed, whether they deleted anything or not.
    for p in 0..3 {
        let label = format!("partition=\"{p}\"");
        let runs = sum(
            &deleted,
            "narad_storage_retention_run_duration_seconds_count",
            &[topic, &label],
        );
        assert!(runs >= 1.0, "partition {p}: {runs} timed runs");
    }
    let after = storage_of(&deleted, "r", 0);
    assert_eq!(after.size_bytes, 0.0, "{after:?}");
    assert_eq!(
        after.segments, 1.0,
        "only the fresh active segment: {after:?}"
    );
}

/// A topic deleted and made again under its name shows its own size at once,
/// not the deleted topic's until the next poll (every 5 s by default).
#[test]
fn a_topic_made_again_shows_its_own_size_at_once() {
    let node = Node::start_shards(2, &[]);
    let mut client = node.client();
    let body = json!({ "name": "again", "partitions": 3 }).to_string();
    assert_eq!(post_topic(&mut client, &body).status, 201);
    for p in 0..3 {
        produce_ok(&mut client, "again", &format!("partition={p}"), b"record");
    }
    wait_for_total(&mut client, "again", 3, 3, Duration::from_secs(20));
    let topic = "topic=\"again\"";
    wait_until(Duration::from_secs(15), "the topic's size polled", || {
        (sum(&scrape(&mut client), "narad_topic_bytes", &[topic]) > 0.0).then_some(())
    });
    let deleted = client
        .request("DELETE", "/v1/topics/again", &[], "")
        .unwrap();
    assert_eq!(deleted.status, 204);
    assert_eq!(post_topic(&mut client, &body).status, 201);
    assert_eq!(
        sum(&scrape(&mut client), "narad_topic_bytes", &[topic]),
        0.0
    );
}
