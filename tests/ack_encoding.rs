//! A batch ack's body may be compressed as a batch produce's may: zstd and
//! gzip are decoded, any other `Content-Encoding` is 415 before the body is
//! read, and data that does not decode is 400; a refused ack settles nothing.

mod common;

use std::io::Write;

use common::{create_topic, error_of, json_of, lease_one, produce_ok, Client, Node};

const JSON: (&str, &str) = ("content-type", "application/json");

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn ack_body(handles: &[&str]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "receipt_handles": handles })).unwrap()
}

fn batch_ack(client: &mut Client, encoding: &str, body: &[u8]) -> common::Response {
    let headers = [JSON, ("content-encoding", encoding)];
    client
        .request("POST", "/v1/topics/enc/ack", &headers, body)
        .unwrap()
}

#[test]
fn a_compressed_batch_ack_is_decoded_and_an_unknown_encoding_is_415() {
    let node = Node::start(&[]);
    let mut client = node.client();
    create_topic(&mut client, "enc");
    for i in 0..3 {
        produce_ok(
            &mut client,
            "enc",
            "partition=0",
            format!("m{i}").as_bytes(),
        );
    }
    let handles: Vec<String> = (0..3).map(|_| lease_one(&mut client, "enc", 0)).collect();

    // Refused: nothing settled.
    let refused = batch_ack(&mut client, "br", &ack_body(&[&handles[0]]));
    assert_eq!(refused.status, 415, "{refused:?}");
    assert!(error_of(&refused).contains("br"), "{refused:?}");
    let corrupt = batch_ack(&mut client, "gzip", b"\x1f\x8b not gzip");
    assert_eq!(corrupt.status, 400, "{corrupt:?}");
    assert!(error_of(&corrupt).contains("decompress"), "{corrupt:?}");
    let plain_as_gzip = batch_ack(&mut client, "gzip", &ack_body(&[&handles[0]]));
    assert_eq!(plain_as_gzip.status, 400, "{plain_as_gzip:?}");

    // Decoded: gzip, then zstd, then identity.
    let bodies = [
        ("gzip", gzip(&ack_body(&[&handles[0]]))),
        (
            "zstd",
            zstd::encode_all(&ack_body(&[&handles[1]])[..], 3).unwrap(),
        ),
        ("identity", ack_body(&[&handles[2]])),
    ];
    for (encoding, body) in bodies {
        let acked = batch_ack(&mut client, encoding, &body);
        assert_eq!(acked.status, 200, "{encoding}: {acked:?}");
        let results = json_of(&acked)["results"].clone();
        assert_eq!(results[0]["status"], 204, "{encoding}: {results}");
    }
    // All three are settled: nothing is left to lease.
    let empty = client
        .request("GET", "/v1/topics/enc/consume?partition=0", &[], "")
        .unwrap();
    assert_eq!(empty.status, 204, "{empty:?}");
}
