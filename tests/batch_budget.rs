//! The batch produce budget (`http.max_batch_body_bytes_in_flight`) as a client
//! sees it: what a batch holds in it while its body arrives and until its
//! records are durable, and when a batch is refused 503 for it; and the 16 MiB
//! a compressed batch may decode to.

mod common;

use std::io::Write;
use std::time::Duration;

use common::{
    batch_doc, batch_ok, create_topic, error_of, gzip, next_offsets, post_batch, wait_for_total,
    Node, JSON, VISIBLE_WAIT_MAX,
};
use serde_json::json;

/// A well-formed batch, each payload under the message limit, small on the
/// wire but past the 16 MiB body limit once decompressed, is a 413 in either
/// encoding and leaves nothing behind.
#[test]
fn a_batch_past_16_mib_once_decompressed_is_413() {
    let node = Node::start(&[]);
    let mut client = node.client();
    create_topic(&mut client, "inflated");
    let inflated = batch_doc(
        &(0..20)
            .map(|i| json!({"payload": format!("{i}-{}", "y".repeat(900 << 10))}))
            .collect::<Vec<_>>(),
    );
    assert!(inflated.len() > 16 << 20);
    let packed = [
        ("zstd", zstd::encode_all(inflated.as_bytes(), 3).unwrap()),
        ("gzip", gzip(inflated.as_bytes())),
    ];
    for (encoding, body) in packed {
        assert!(body.len() < 1 << 20, "{encoding}: {} bytes", body.len());
        let headers = [JSON[0], ("content-encoding", encoding)];
        let response = post_batch(&mut node.client(), "inflated", "", &headers, &body);
        assert_eq!(response.status, 413, "{encoding}: {response:?}");
        let message = error_of(&response);
        assert!(message.contains("too large"), "{message:?}");
    }
    assert_eq!(next_offsets(&mut client, "inflated"), [0, 0, 0]);
}

/// The batch budget (`http.max_batch_body_bytes_in_flight`) holds what a batch
/// decodes to, not only its compressed body: records wait in memory until they
/// are durable.
#[test]
fn a_compressed_batch_counts_what_it_decodes_to_in_the_batch_budget() {
    let node = Node::start(&[
        ("NARAD_HTTP_MAX_BATCH_BODY_BYTES_IN_FLIGHT", "2097152"),
        ("NARAD_HTTP_READ_TIMEOUT", "5s"),
    ]);
    let mut client = node.client();
    create_topic(&mut client, "packed");
    let big = "a".repeat(1_000_000);
    let doc = batch_doc(&[json!({ "payload": big }), json!({ "payload": big })]);
    let packed = gzip(doc.as_bytes());
    assert!(packed.len() < 64 << 10);
    let headers = [
        ("content-type", "application/json"),
        ("content-encoding", "gzip"),
    ];
    // Alone, it fits: about 2 MB decoded within 2 MiB.
    let alone = post_batch(&mut client, "packed", "", &headers, &packed);
    assert_eq!(alone.status, 202, "{alone:?}");
    // With 1 MiB of the budget held by a batch still being sent, it does not.
    let mut holder = node.client();
    holder
        .stream
        .write_all(
            b"POST /v1/topics/packed/produce/batch HTTP/1.1\r\nhost: test\r\n\
              content-type: application/json\r\ncontent-length: 1572864\r\n\r\n",
        )
        .unwrap();
    holder.stream.write_all(&vec![b' '; 1 << 20]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let squeezed = post_batch(&mut client, "packed", "", &headers, &packed);
    assert_eq!(squeezed.status, 503, "{squeezed:?}");
    assert_eq!(squeezed.header("retry-after"), Some("1"));
    drop(holder);
}

/// A batch holds in the budget what it has sent, not the largest body: a
/// chunked body that stalls holds its few bytes, and so do bodies declared
/// large whose clients send nothing; a batch alone in the budget is let
/// through even when it decodes to more than the budget; and an encoding the
/// server cannot decode is refused before the body is sent.
#[test]
fn the_batch_budget_holds_what_batches_sent_and_lets_a_lone_one_through() {
    let node = Node::start(&[
        ("NARAD_HTTP_MAX_BATCH_BODY_BYTES_IN_FLIGHT", "2097152"),
        ("NARAD_HTTP_READ_TIMEOUT", "5s"),
    ]);
    let mut client = node.client();
    create_topic(&mut client, "held");
    let json = [("content-type", "application/json")];

    // A chunked batch whose sender stalls after a few bytes.
    let mut stalled = node.client();
    stalled
        .stream
        .write_all(
            b"POST /v1/topics/held/produce/batch HTTP/1.1\r\nhost: test\r\n\
              content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n\
              a\r\n{\"messages\"\r\n",
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let big = "b".repeat(1_000_000);
    let doc = batch_doc(&[json!({ "payload": big })]);
    batch_ok(&mut client, "held", &json, &doc, 1);
    drop(stalled);

    // Connections that declared the largest bodies and send nothing hold
    // nothing: a batch that fits goes through beside them.
    let idle: Vec<_> = (0..4)
        .map(|_| {
            let mut idle = node.client();
            idle.stream
                .write_all(
                    b"POST /v1/topics/held/produce/batch HTTP/1.1\r\nhost: test\r\n\
                      content-type: application/json\r\ncontent-length: 16777216\r\n\r\n",
                )
                .unwrap();
            idle
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    batch_ok(&mut client, "held", &json, &doc, 1);
    drop(idle);

    // Alone, a batch decoding to 3 MB passes a 2 MiB budget.
    let doc = batch_doc(&[
        json!({ "payload": big }),
        json!({ "payload": big }),
        json!({ "payload": big }),
    ]);
    let gzipped = [
        ("content-type", "application/json"),
        ("content-encoding", "gzip"),
    ];
    batch_ok(&mut client, "held", &gzipped, gzip(doc.as_bytes()), 3);

    // An encoding it cannot decode: 415 at once, the body never sent.
    let mut unsent = node.client();
    unsent
        .stream
        .write_all(
            b"POST /v1/topics/held/produce/batch HTTP/1.1\r\nhost: test\r\n\
              content-type: application/json\r\ncontent-encoding: br\r\n\
              content-length: 1000\r\n\r\n",
        )
        .unwrap();
    let started = std::time::Instant::now();
    let refused = unsent.read_response(false).unwrap();
    assert_eq!(refused.status, 415, "{refused:?}");
    assert!(started.elapsed() < Duration::from_secs(4));
    wait_for_total(&mut client, "held", 3, 5, VISIBLE_WAIT_MAX);
}
