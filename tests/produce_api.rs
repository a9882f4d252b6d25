//! The produce routes of `narad serve` as a client sees them: where single and
//! batch records land (explicit partition, key hash, round-robin), the Message
//! object replay gives back, compressed batches, every refusal (and that a
//! refused batch leaves nothing behind), no loss under concurrent producers, and
//! records across a restart.
//!
//! A 202 means the record is in the accepting shard's WAL; the dispatcher commits
//! it to its partition in the background, so every check of what a partition
//! holds polls replay until a deadline instead of sleeping.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::Write;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use common::{
    batch_doc, batch_ok, create_topic, error_of, gzip, next_offsets, payload_texts, post_batch,
    post_topic, produce, produce_ok, unix_now_s, wait_for_payloads, wait_for_records,
    wait_for_total, wait_until, Client, Node, Response, JSON, OCTET, VISIBLE_WAIT_MAX,
};
use serde_json::{json, Value};

/// How long 500 concurrently produced records may take to all become visible.
const CONCURRENT_WAIT_MAX: Duration = Duration::from_secs(20);

/// FNV-1a 32-bit, written out here so that the test does not trust the broker's.
fn fnv1a32(bytes: &[u8]) -> u32 {
    let mut hash: u32 = 2_166_136_261;
    for &byte in bytes {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(16_777_619);
    }
    hash
}

fn key_partition(key: &str, partitions: u32) -> u32 {
    fnv1a32(key.as_bytes()) % partitions
}

/// `value` percent-encoded for a query string.
fn encoded(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

fn field_names(message: &Value) -> BTreeSet<&str> {
    message
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect()
}

#[test]
fn single_records_land_by_partition_key_or_rotation() {
    let node = Node::start(&[]);
    let mut client = node.client();

    // An explicit partition: the record takes the next offset there.
    create_topic(&mut client, "pinned");
    let mut counts = [0usize; 3];
    for (i, partition) in [2u32, 0, 1, 2, 2, 0].into_iter().enumerate() {
        let (query, payload) = (format!("partition={partition}"), format!("pin-{i}"));
        produce_ok(&mut client, "pinned", &query, payload.as_bytes());
        counts[partition as usize] += 1;
        let count = counts[partition as usize];
        let records = wait_for_records(&mut client, "pinned", partition, count);
        assert_eq!(records.len(), count);
        assert_eq!(records.last().unwrap()["payload"], payload.as_str());
    }
    assert_eq!(next_offsets(&mut client, "pinned"), [2, 1, 3]);

    // A key: always fnv1a32(key) % partitions, from either shard.
    create_topic(&mut client, "keyed");
    let keys: Vec<String> = (0..12)
        .map(|i| format!("user-{i}"))
        .chain(["a b".to_string(), "été".to_string(), "x&y=z".to_string()])
        .collect();
    let mut expected = [0usize; 3];
    for round in 0..2 {
        for key in &keys {
            let (query, payload) = (format!("key={}", encoded(key)), format!("{key}/{round}"));
            produce_ok(&mut node.client(), "keyed", &query, payload.as_bytes());
            expected[key_partition(key, 3) as usize] += 1;
        }
    }
    let total = expected.iter().sum();
    let partitions = wait_for_total(&mut client, "keyed", 3, total, VISIBLE_WAIT_MAX);
    for (partition, records) in partitions.iter().enumerate() {
        assert_eq!(records.len(), expected[partition], "partition {partition}");
        for record in records {
            let key = record["key"].as_str().unwrap();
            assert_eq!(key_partition(key, 3), partition as u32, "{record}");
            assert!(record["payload"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{key}/")));
        }
    }

    // `partition` wins over `key`; the key is still stored.
    produce_ok(&mut client, "pinned", "key=user-1&partition=1", b"both");
    let records = wait_for_records(&mut client, "pinned", 1, 2);
    assert_eq!(
        (&records[1]["payload"], &records[1]["key"]),
        (&json!("both"), &json!("user-1"))
    );

    // A binary key, percent-encoded, is its bytes: hashed as such, read back
    // base64 with key_encoding.
    create_topic(&mut client, "binary");
    let binary_key = [0xFFu8, 0x00, 0xC3];
    let query: String = format!(
        "key={}",
        form_urlencoded::byte_serialize(&binary_key).collect::<String>()
    );
    produce_ok(&mut client, "binary", &query, b"bin");
    let partition = fnv1a32(&binary_key) % 3;
    let records = wait_for_records(&mut client, "binary", partition, 1);
    assert_eq!(
        (&records[0]["key"], &records[0]["key_encoding"]),
        (&json!(BASE64.encode(binary_key)), &json!("base64")),
        "{records:?}"
    );

    // Keyless records rotate over every partition and carry no key; an empty
    // `key=` is no key.
    create_topic(&mut client, "spread");
    for i in 0..30 {
        let query = if i % 2 == 0 { "" } else { "key=" };
        produce_ok(&mut client, "spread", query, format!("free-{i}").as_bytes());
    }
    let partitions = wait_for_total(&mut client, "spread", 3, 30, VISIBLE_WAIT_MAX);
    for (partition, records) in partitions.iter().enumerate() {
        assert!(
            !records.is_empty(),
            "partition {partition} got no keyless record"
        );
        for record in records {
            assert_eq!(record.get("key"), None, "{record}");
        }
    }
    // A batch's keyless records (numbers here) take consecutive turns, whatever
    // lies between them: 30 among 10 pinned to partition 0 land 10 on each.
    let messages: Vec<Value> = (0..40)
        .map(|i| match i % 4 {
            3 => json!({"payload": "pin", "partition": 0}),
            _ => json!({"payload": i}),
        })
        .collect();
    batch_ok(&mut client, "spread", &JSON, batch_doc(&messages), 40);
    let partitions = wait_for_total(&mut client, "spread", 3, 70, VISIBLE_WAIT_MAX);
    let turns = |records: &Vec<Value>| records.iter().filter(|r| r["payload"].is_number()).count();
    let counts: Vec<usize> = partitions.iter().map(turns).collect();
    assert_eq!(counts, [10, 10, 10]);
}

#[test]
fn replay_shows_json_text_and_binary_payloads_as_the_reference_does() {
    let node = Node::start(&[]);
    let mut client = node.client();
    create_topic(&mut client, "shapes");
    let binary = [0u8, 0x9f, 0xff, 0x10];
    let sent: [(&str, &[u8]); 7] = [
        ("", br#"{"a": [1, 2.5, "x"], "b": null}"#),
        ("key=k1", b"hello, world"),
        ("", &binary),
        ("", b"42"),
        ("key=k2", "ünïcode text".as_bytes()),
        // JSON whose string names no character (a lone surrogate) goes out as
        // the text it is, so strict parsers (this test's) can read the reply;
        // a proper surrogate pair stays a JSON value.
        ("", br#""\ud800""#),
        ("", br#"["\ud83d\ude00"]"#),
    ];
    for (query, payload) in sent {
        let query = match query {
            "" => "partition=0".to_string(),
            key => format!("{key}&partition=0"),
        };
        produce_ok(&mut client, "shapes", &query, payload);
    }
    let records = wait_for_records(&mut client, "shapes", 0, sent.len());
    let now_s = unix_now_s();
    for record in &records {
        assert_eq!(record["topic"], "shapes");
        assert_eq!(record["partition"], 0);
        let timestamp = record["timestamp"].as_u64().unwrap();
        assert!(timestamp <= now_s && timestamp + 60 > now_s, "{record}");
        assert_eq!(record.get("receipt_handle"), None, "no lease on replay");
    }
    let base = [
        "topic",
        "partition",
        "offset",
        "payload",
        "timestamp",
        "timestamp_ms",
    ];
    let with =
        |extra: &[&'static str]| -> BTreeSet<&str> { base.iter().chain(extra).copied().collect() };
    assert_eq!(field_names(&records[0]), with(&[]));
    assert_eq!(
        records[0]["payload"],
        json!({"a": [1, 2.5, "x"], "b": null})
    );
    assert_eq!(field_names(&records[1]), with(&["key"]));
    assert_eq!(
        (&records[1]["key"], &records[1]["payload"]),
        (&json!("k1"), &json!("hello, world"))
    );
    assert_eq!(field_names(&records[2]), with(&["payload_encoding"]));
    assert_eq!(records[2]["payload_encoding"], "base64");
    assert_eq!(
        BASE64
            .decode(records[2]["payload"].as_str().unwrap())
            .unwrap(),
        binary
    );
    assert_eq!(records[3]["payload"], 42);
    assert_eq!(records[4]["payload"], "ünïcode text");
    assert_eq!(records[4]["key"], "k2");
    assert_eq!(records[5]["payload"], json!("\"\\ud800\""));
    assert_eq!(records[6]["payload"], json!(["\u{1f600}"]));
}

#[test]
fn every_invalid_single_produce_is_refused() {
    let node = Node::start(&[]);
    let mut client = node.client();
    create_topic(&mut client, "strict");

    let refusals: [(&str, &str, &[u8], u16, &str); 9] = [
        ("missing", "", b"x", 404, "not found"),
        ("strict", "", b"", 400, "empty"),
        ("strict", "partition=0", b"", 400, "empty"),
        ("strict", "partition=3", b"x", 400, "out of range"),
        ("strict", "partition=abc", b"x", 400, "partition"),
        ("strict", "partition=-1", b"x", 400, "partition"),
        ("strict", "partition=", b"x", 400, "partition"),
        ("strict", "partition=1&partition=1", b"x", 400, "duplicate"),
        ("strict", "key=a&key=b", b"x", 400, "duplicate"),
    ];
    for (topic, query, payload, status, reason) in refusals {
        let response = produce(&mut client, topic, query, payload);
        assert_eq!(response.status, status, "{topic}?{query}: {response:?}");
        let message = error_of(&response);
        assert!(
            message.contains(reason),
            "{query}: {message:?} lacks {reason:?}"
        );
    }
    let too_large = vec![b'x'; (1 << 20) + 1];
    let response = produce(&mut node.client(), "strict", "partition=1", &too_large);
    assert_eq!(response.status, 413, "{:?}", response.status);
    error_of(&response);
    for headers in [&[][..], &[("content-type", "text/plain")][..]] {
        let response = client
            .request(
                "POST",
                "/v1/topics/strict/produce?partition=2",
                headers,
                b"x",
            )
            .unwrap();
        assert_eq!(response.status, 415, "{headers:?}: {response:?}");
        error_of(&response);
    }

    // What is accepted at the edges: exactly 1 MiB, and X-Narad-Client in place of
    // a Content-Type.
    let largest = vec![b'y'; 1 << 20];
    produce_ok(&mut client, "strict", "partition=1", &largest);
    let response = client
        .request(
            "POST",
            "/v1/topics/strict/produce?partition=2",
            &[("x-narad-client", "t")],
            b"z",
        )
        .unwrap();
    assert_eq!(
        (response.status, response.bytes.len()),
        (202, 0),
        "{response:?}"
    );
    produce_ok(&mut client, "strict", "partition=0", b"marker");

    // Only the three accepted records ever become visible.
    let records = wait_for_total(&mut client, "strict", 3, 3, VISIBLE_WAIT_MAX);
    assert_eq!(records[0][0]["payload"], "marker");
    assert_eq!(records[1][0]["payload"].as_str().unwrap().len(), 1 << 20);
    assert_eq!(records[2][0]["payload"], "z");
    assert_eq!(next_offsets(&mut client, "strict"), [1, 1, 1]);
}

#[test]
fn batches_are_accepted_whole_in_order_and_compressed() {
    let node = Node::start(&[]);
    let mut client = node.client();

    // Three keys on three different partitions; each key's records land in batch
    // order at consecutive offsets.
    create_topic(&mut client, "ordered");
    let mut key_of_partition: BTreeMap<u32, String> = BTreeMap::new();
    for i in 0..100 {
        let key = format!("key-{i}");
        key_of_partition
            .entry(key_partition(&key, 3))
            .or_insert(key);
    }
    let keys: Vec<&String> = key_of_partition.values().collect();
    assert_eq!(keys.len(), 3);
    let messages: Vec<Value> = (0..50)
        .map(|i| json!({"payload": format!("m-{i}"), "key": keys[i % 3]}))
        .collect();
    batch_ok(&mut client, "ordered", &JSON, batch_doc(&messages), 50);
    let partitions = wait_for_total(&mut client, "ordered", 3, 50, VISIBLE_WAIT_MAX);
    for (partition, key) in &key_of_partition {
        let records = &partitions[*partition as usize];
        let slot = keys.iter().position(|k| *k == key).unwrap();
        let want: Vec<String> = (0..50)
            .filter(|i| i % 3 == slot)
            .map(|i| format!("m-{i}"))
            .collect();
        assert_eq!(payload_texts(records), want, "partition {partition}");
        assert!(records.iter().all(|r| r["key"] == key.as_str()));
    }

    // Per-record partition, key and base64 encodings.
    create_topic(&mut client, "fields");
    let binary_key = [0xffu8, 0x00];
    let messages = [
        json!({"payload": "plain", "partition": 2}),
        json!({"payload": BASE64.encode([0u8, 255, 1]), "payload_encoding": "base64",
               "key": BASE64.encode(binary_key), "key_encoding": "base64", "partition": 1}),
        json!({"payload": {"j": [1, 2]}, "key": "k"}),
        json!({"payload": 17, "partition": 0}),
        json!({"payload": BASE64.encode("text"), "payload_encoding": "base64", "key": "kk", "partition": 0}),
    ];
    batch_ok(&mut client, "fields", &JSON, batch_doc(&messages), 5);
    let partitions = wait_for_total(&mut client, "fields", 3, 5, VISIBLE_WAIT_MAX);
    // Where each message must land, in batch order, with its key as replay shows it.
    let placed = [
        (2, json!("plain"), None),
        (1, json!("AP8B"), Some(BASE64.encode(binary_key))),
        (
            key_partition("k", 3),
            json!({"j": [1, 2]}),
            Some("k".to_string()),
        ),
        (0, json!(17), None),
        (0, json!("text"), Some("kk".to_string())),
    ];
    for (partition, records) in partitions.iter().enumerate() {
        let want: Vec<(&Value, Option<&str>)> = placed
            .iter()
            .filter(|(p, ..)| *p as usize == partition)
            .map(|(_, payload, key)| (payload, key.as_deref()))
            .collect();
        let got: Vec<(&Value, Option<&str>)> = records
            .iter()
            .map(|r| (&r["payload"], r.get("key").map(|k| k.as_str().unwrap())))
            .collect();
        assert_eq!(got, want, "partition {partition}");
    }
    let binary = &partitions[1][0];
    let encodings = (&binary["payload_encoding"], &binary["key_encoding"]);
    assert_eq!(encodings, (&json!("base64"), &json!("base64")));
    let text = partitions[0]
        .iter()
        .find(|r| r["payload"] == "text")
        .unwrap();
    assert_eq!(text.get("payload_encoding"), None, "base64 of text is text");

    // zstd and gzip bodies.
    create_topic(&mut client, "packed");
    let doc = |tag: &str| {
        let messages: Vec<Value> = (0..20)
            .map(|i| json!({"payload": format!("{tag}-{i}"), "partition": i % 3}))
            .collect();
        batch_doc(&messages)
    };
    let zstd_body = zstd::encode_all(doc("z").as_bytes(), 3).unwrap();
    let gzip_body = gzip(doc("g").as_bytes());
    let zstd_headers = [JSON[0], ("content-encoding", "zstd")];
    let gzip_headers = [JSON[0], ("content-encoding", "gzip")];
    batch_ok(&mut client, "packed", &zstd_headers, zstd_body, 20);
    batch_ok(&mut client, "packed", &gzip_headers, gzip_body, 20);
    let partitions = wait_for_total(&mut client, "packed", 3, 40, VISIBLE_WAIT_MAX);
    for (partition, records) in partitions.iter().enumerate() {
        let want: Vec<String> = ["z", "g"]
            .iter()
            .flat_map(|tag| {
                (0..20)
                    .filter(move |i| i % 3 == partition)
                    .map(move |i| format!("{tag}-{i}"))
            })
            .collect();
        assert_eq!(payload_texts(records), want, "partition {partition}");
    }
}

#[test]
fn an_invalid_batch_is_refused_whole_and_leaves_nothing_behind() {
    let node = Node::start(&[]);
    let mut client = node.client();
    create_topic(&mut client, "strict");
    let ok = |i: usize| json!({"payload": format!("ok-{i}")});
    let over = |count: usize| batch_doc(&(0..count).map(ok).collect::<Vec<_>>());
    let middle = |bad: Value| batch_doc(&[ok(0), bad, ok(2)]);
    let gzip_header = [JSON[0], ("content-encoding", "gzip")];
    let br_header = [JSON[0], ("content-encoding", "br")];
    // Two header lines are the list "gzip, zstd", which nothing decodes.
    let two_headers = [
        JSON[0],
        ("content-encoding", "gzip"),
        ("content-encoding", "zstd"),
    ];

    let refusals = [
        ("", &JSON[..], batch_doc(&[]), 400, "none"),
        ("", &JSON[..], over(1001), 400, "at most 1000"),
        ("?key=a", &JSON[..], over(1), 400, "key"),
        ("?partition=1", &JSON[..], over(1), 400, "partition"),
        ("", &JSON[..], "not json".to_string(), 400, "invalid batch"),
        (
            "",
            &JSON[..],
            r#"{"messages":[],"x":1}"#.to_string(),
            400,
            "",
        ),
        ("", &br_header[..], over(1), 415, "br"),
        ("", &two_headers[..], over(1), 415, "gzip, zstd"),
        ("", &gzip_header[..], over(1), 400, "decompress"),
        ("", &[], over(1), 415, "Content-Type"),
    ];
    for (query, headers, body, status, reason) in refusals {
        let response = post_batch(&mut node.client(), "strict", query, headers, &body);
        assert_eq!(response.status, status, "{query} {headers:?}: {response:?}");
        let message = error_of(&response);
        assert!(message.contains(reason), "{message:?} lacks {reason:?}");
    }
    let response = post_batch(&mut client, "missing", "", &JSON, over(1));
    assert_eq!(response.status, 404, "{response:?}");
    // One bad message between two good ones refuses the batch, naming it.
    let bad_messages = [
        (
            json!({"payload": "x", "partition": 3}),
            400,
            "partition out of range",
        ),
        (json!({"payload": "x", "partition": -1}), 400, "partition"),
        (json!({"payload": "x", "partition": "1"}), 400, "partition"),
        (json!({"payload": ""}), 400, "empty message"),
        (json!({"key": "no payload"}), 400, "payload"),
        (
            json!({"payload": "!", "payload_encoding": "base64"}),
            400,
            "base64",
        ),
        (
            json!({"payload": "x", "payload_encoding": "hex"}),
            400,
            "hex",
        ),
        (json!({"payload": "x", "extra": 1}), 400, "extra"),
        (
            json!({"payload": "x".repeat((1 << 20) + 1)}),
            413,
            "message too large",
        ),
    ];
    for (bad, status, reason) in bad_messages {
        let response = post_batch(&mut node.client(), "strict", "", &JSON, middle(bad));
        assert_eq!(response.status, status, "{response:?}");
        let message = error_of(&response);
        assert!(message.starts_with("message 1: "), "{message}");
        assert!(message.contains(reason), "{message:?} lacks {reason:?}");
    }
    let truncated = gzip(over(10).as_bytes());
    let response = post_batch(
        &mut client,
        "strict",
        "",
        &gzip_header,
        &truncated[..truncated.len() / 2],
    );
    assert_eq!(response.status, 400, "{response:?}");
    error_of(&response);

    // A marker produced after every refusal, on the same connection, is the only
    // record the topic ever shows.
    let marker = batch_doc(&[json!({"payload": "marker", "partition": 0})]);
    batch_ok(&mut client, "strict", &OCTET, marker, 1);
    let partitions = wait_for_total(&mut client, "strict", 3, 1, VISIBLE_WAIT_MAX);
    assert_eq!(payload_texts(&partitions[0]), ["marker"]);
    assert_eq!(next_offsets(&mut client, "strict"), [1, 0, 0]);

    // The largest batch is accepted whole.
    create_topic(&mut client, "thousand");
    batch_ok(&mut client, "thousand", &JSON, over(1000), 1000);
    wait_until(VISIBLE_WAIT_MAX, "1000 records committed", || {
        (next_offsets(&mut client, "thousand").iter().sum::<u64>() == 1000).then_some(())
    });
}

#[test]
fn every_record_accepted_from_concurrent_producers_reaches_its_partition() {
    let node = Node::start(&[]);
    let mut client = node.client();
    create_topic(&mut client, "busy");
    let producers = 5;
    let per_producer = 100;
    let threads: Vec<_> = (0..producers)
        .map(|t| {
            let addr = node.addr;
            std::thread::spawn(move || {
                let mut client = Client::connect(addr).unwrap();
                for i in 0..per_producer {
                    // Keyless, keyed and pinned records, so that all three choices run.
                    let query = match t % 3 {
                        0 => String::new(),
                        1 => format!("key=k{}", i % 7),
                        _ => format!("partition={}", i % 3),
                    };
                    produce_ok(&mut client, "busy", &query, format!("w{t}-{i}").as_bytes());
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let total = producers * per_producer;
    let partitions = wait_for_total(&mut client, "busy", 3, total, CONCURRENT_WAIT_MAX);
    let mut seen = BTreeSet::new();
    for (partition, records) in partitions.iter().enumerate() {
        for record in records {
            let payload = record["payload"].as_str().unwrap().to_string();
            if let Some(key) = record["key"].as_str() {
                assert_eq!(key_partition(key, 3), partition as u32, "{record}");
            }
            assert!(seen.insert(payload), "duplicate {record}");
        }
    }
    let want: BTreeSet<String> = (0..producers)
        .flat_map(|t| (0..per_producer).map(move |i| format!("w{t}-{i}")))
        .collect();
    assert_eq!(seen, want);
    let counts: Vec<u64> = partitions.iter().map(|r| r.len() as u64).collect();
    assert_eq!(next_offsets(&mut client, "busy"), counts);
}

#[test]
fn a_restarted_node_serves_every_record_accepted_before_the_stop() {
    let mut first = Node::start(&[]);
    let mut client = first.client();
    let topic = post_topic(&mut client, r#"{"name":"durable","partitions":4}"#);
    assert_eq!(topic.status, 201, "{topic:?}");
    for i in 0..20 {
        produce_ok(&mut client, "durable", "", format!("early-{i}").as_bytes());
    }
    let early = wait_for_total(&mut client, "durable", 4, 20, VISIBLE_WAIT_MAX);
    // These are only acknowledged (in the WAL) when the stop begins.
    for i in 0..20 {
        let (query, payload) = (format!("key=late-{i}"), format!("late-{i}"));
        produce_ok(&mut client, "durable", &query, payload.as_bytes());
    }
    let messages: Vec<Value> = (0..20)
        .map(|i| json!({"payload": format!("batch-{i}")}))
        .collect();
    batch_ok(&mut client, "durable", &JSON, batch_doc(&messages), 20);
    drop(client);
    first.sigterm();
    assert!(first.wait_for_exit(Duration::from_secs(15)).success());

    let second = Node::start_in(&first.data, 2, &[]);
    let mut client = second.client();
    let after = wait_for_total(&mut client, "durable", 4, 60, VISIBLE_WAIT_MAX);
    // The records visible before the stop kept their offsets and contents.
    for (partition, records) in early.iter().enumerate() {
        assert_eq!(
            &after[partition][..records.len()],
            &records[..],
            "partition {partition}"
        );
    }
    let mut seen: Vec<String> = after.iter().flat_map(|r| payload_texts(r)).collect();
    seen.sort();
    let mut want: Vec<String> = ["early", "late", "batch"]
        .iter()
        .flat_map(|tag| (0..20).map(move |i| format!("{tag}-{i}")))
        .collect();
    want.sort();
    assert_eq!(seen, want);
    // And the node takes new ones after them.
    produce_ok(&mut client, "durable", "partition=3", b"after");
    let count = after[3].len() + 1;
    let records = wait_for_records(&mut client, "durable", 3, count);
    assert_eq!(records[count - 1]["payload"], "after");
}

/// With `storage.codec` zstd, compressible payloads take a fraction of their size
/// on disk and read back byte for byte; without it, at least their size.
#[test]
fn zstd_codec_stores_compressible_payloads_smaller_and_reads_them_back() {
    let sizes: Vec<(bool, f64, Vec<String>)> = [false, true]
        .into_iter()
        .map(|zstd| {
            let config = if zstd {
                r#"{"storage": {"codec": "zstd", "compression_level": "default"}}"#
            } else {
                r#"{"storage": {"codec": "none"}}"#
            };
            let node = Node::start_with_config(1, config, &[]);
            let mut client = node.client();
            let body = json!({ "name": "z", "partitions": 3 }).to_string();
            assert_eq!(post_topic(&mut client, &body).status, 201);
            let payloads: Vec<String> = (0..40)
                .map(|i| format!("record {i}: {}", "the same words again ".repeat(200)))
                .collect();
            for payload in &payloads {
                produce_ok(&mut client, "z", "partition=0", payload.as_bytes());
            }
            let read = payload_texts(&wait_for_records(&mut client, "z", 0, payloads.len()));
            let topic = common::get_topic(&mut client, "z");
            let size = topic["partition_stats"][0]["size_bytes"].as_f64().unwrap();
            assert_eq!(read, payloads, "zstd={zstd}");
            (zstd, size, payloads)
        })
        .collect();
    let raw: usize = sizes[0].2.iter().map(String::len).sum();
    let (plain, packed) = (sizes[0].1, sizes[1].1);
    assert!(
        plain >= raw as f64,
        "uncompressed log {plain} < payloads {raw}"
    );
    assert!(
        packed * 5.0 < plain,
        "zstd log {packed} not much smaller than {plain}"
    );
}

/// Sends the head of a single produce to `topic`, then runs `meanwhile`, then
/// the body; returns the answer.
fn produce_with_a_pause(
    node: &Node,
    topic: &str,
    body: &str,
    meanwhile: impl FnOnce(),
) -> Response {
    let mut slow = Client::connect(node.addr).unwrap();
    let head = format!(
        "POST /v1/topics/{topic}/produce HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    slow.stream.write_all(head.as_bytes()).unwrap();
    // The head is read and the handler waits for the body.
    std::thread::sleep(Duration::from_millis(200));
    meanwhile();
    slow.stream.write_all(body.as_bytes()).unwrap();
    slow.read_response(false).unwrap()
}

#[test]
fn a_produce_whose_topic_changes_while_its_body_arrives_goes_to_the_topic_as_it_is_then() {
    let node = Node::start(&[]);
    let mut client = node.client();
    create_topic(&mut client, "moving");
    // Deleted while the body is on its way: 404, nothing accepted.
    let gone = produce_with_a_pause(&node, "moving", "lost?", || {
        let deleted = client
            .request("DELETE", "/v1/topics/moving", &[], "")
            .unwrap();
        assert_eq!(deleted.status, 204);
    });
    assert_eq!(gone.status, 404, "{gone:?}");
    // Deleted and created again: the record is the new topic's.
    create_topic(&mut client, "moving");
    let moved = produce_with_a_pause(&node, "moving", "kept", || {
        let deleted = client
            .request("DELETE", "/v1/topics/moving", &[], "")
            .unwrap();
        assert_eq!(deleted.status, 204);
        create_topic(&mut client, "moving");
    });
    assert_eq!(moved.status, 202, "{moved:?}");
    wait_for_total(&mut client, "moving", 3, 1, VISIBLE_WAIT_MAX);
}

#[test]
fn a_nearly_full_disk_refuses_produces_with_503_and_keeps_serving_consumers() {
    // The debug hook makes the data directory's disk look nearly full; the
    // gauges (and the guard) are polled every 50 ms.
    let node = Node::start(&[
        ("NARAD_DEBUG_DISK_AVAILABLE_BYTES", "1000"),
        ("NARAD_DEBUG_METRICS_POLL_MS", "50"),
    ]);
    let mut client = node.client();
    create_topic(&mut client, "full");
    let refused = wait_until(Duration::from_secs(10), "produces refused", || {
        let response = produce(&mut client, "full", "", b"one more");
        (response.status == 503).then_some(response)
    });
    assert_eq!(refused.header("retry-after"), Some("5"), "{refused:?}");
    assert!(
        error_of(&refused).contains("disk is full or nearly full"),
        "{refused:?}"
    );
    let body = batch_doc(&[json!({"payload": "b"})]);
    let batch = post_batch(&mut client, "full", "", &JSON, body);
    assert_eq!(batch.status, 503, "{batch:?}");
    // Reads and consumes go on.
    let consume = client
        .request("GET", "/v1/topics/full/consume?wait=0s", &[], "")
        .unwrap();
    assert_eq!(consume.status, 204, "{consume:?}");
    assert_eq!(next_offsets(&mut client, "full"), vec![0, 0, 0]);
    // The gauges read what the disk says, once (not summed with the start's
    // measure).
    let metrics = client.request("GET", "/metrics", &[], "").unwrap();
    let text = metrics.body;
    assert!(
        text.lines()
            .any(|l| l == "narad_data_dir_available_bytes 1000"),
        "{text}"
    );
    assert!(text.lines().any(|l| l == "narad_data_dir_low 1"), "{text}");
}

/// The size of the one `.log` file of partition 0 of `topic` under `data`.
fn active_log_bytes(data: &std::path::Path, topic: &str) -> u64 {
    let logs = common::log_segments(&common::partition_dir(data, topic, 0));
    assert_eq!(logs.len(), 1, "{logs:?}");
    std::fs::metadata(&logs[0]).unwrap().len()
}

/// `storage.log_prealloc`: on (the default), the active segment is grown by
/// zeros written ahead of the commits; off, commits extend it themselves and it
/// holds their blocks only. Either way every record survives a SIGKILL, and a
/// restart with the switch flipped reads them all back and commits more.
#[test]
fn log_prealloc_decides_whether_zeros_are_written_ahead_of_the_commits() {
    for prealloc in [true, false] {
        let config = format!(r#"{{"storage": {{"log_prealloc": {prealloc}}}}}"#);
        let mut node = Node::start_with_config(1, &config, &[]);
        let mut client = node.client();
        let body = json!({ "name": "z", "partitions": 3 }).to_string();
        let created = post_topic(&mut client, &body);
        assert_eq!(created.status, 201, "{}", error_of(&created));
        let payloads: Vec<String> = (0..30).map(|i| format!("record {i}")).collect();
        for payload in &payloads {
            produce_ok(&mut client, "z", "partition=0", payload.as_bytes());
        }
        let read = payload_texts(&wait_for_records(&mut client, "z", 0, payloads.len()));
        assert_eq!(read, payloads, "prealloc={prealloc}");
        let bytes = active_log_bytes(&node.data, "z");
        if prealloc {
            // Zeros ahead as large as the little data held: 128 KiB, not a
            // whole 1 MiB chunk.
            assert!(
                (128 << 10..=256 << 10).contains(&bytes),
                "prepared segment of {bytes} bytes"
            );
        } else {
            assert!(bytes <= 64 << 10, "segment of {bytes} bytes, zeros ahead?");
        }
        // Restart with the switch flipped: a log written either way opens the other.
        node.sigkill();
        let flipped = tempfile::NamedTempFile::new_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let config = format!(r#"{{"storage": {{"log_prealloc": {}}}}}"#, !prealloc);
        std::fs::write(flipped.path(), config).unwrap();
        let data = node.data.clone();
        let mut restarted = Node::spawn_with(
            &data,
            1,
            &[],
            &[OsStr::new("--config"), flipped.path().as_os_str()],
        );
        restarted.await_ready();
        let mut client = restarted.client();
        // A SIGKILL may beat the lazily synced WAL checkpoint, so the restart
        // can commit the last records again: duplicates, never loss.
        let read = wait_for_payloads(&mut client, "z", 0, &payloads);
        assert_eq!(read, payloads, "after the restart, prealloc={prealloc}");
        let more: Vec<String> = (30..40).map(|i| format!("record {i}")).collect();
        for payload in &more {
            produce_ok(&mut client, "z", "partition=0", payload.as_bytes());
        }
        let all: Vec<String> = payloads.iter().chain(&more).cloned().collect();
        let read = wait_for_payloads(&mut client, "z", 0, &all);
        assert_eq!(read, all, "prealloc={} after a restart", !prealloc);
    }
}
