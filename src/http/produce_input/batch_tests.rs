//! The batch rules end to end, through [`decode_batch`]: each rule accepted and
//! refused, compressed bodies, and the bounds.

use std::io::{self, Read, Write};

use base64::engine::general_purpose::{STANDARD, URL_SAFE};
use base64::Engine;
use serde_json::json;

use super::batch::DecodedBatch;
use super::*;

const PARTITIONS: u32 = 3;

/// A request body holding `bytes`.
fn body_of(bytes: impl AsRef<[u8]>) -> bytes::Bytes {
    bytes::Bytes::copy_from_slice(bytes.as_ref())
}

/// A decoded message, owning its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Owned {
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    partition: Option<u32>,
}

fn owned(batch: &DecodedBatch) -> Vec<Owned> {
    batch
        .records()
        .map(|r| Owned {
            key: r.key.map(<[u8]>::to_vec),
            payload: r.payload.to_vec(),
            partition: r.partition,
        })
        .collect()
}

fn decode(document: &str) -> Result<Vec<Owned>, BatchRefusal> {
    decode_batch(body_of(document.as_bytes()), None, PARTITIONS).map(|batch| owned(&batch))
}

fn accepted(document: &str) -> Vec<Owned> {
    decode(document).unwrap_or_else(|e| panic!("{document}: {e:?}"))
}

fn one(message: serde_json::Value) -> String {
    json!({ "messages": [message] }).to_string()
}

fn record(document: &str) -> Owned {
    let mut records = accepted(document);
    assert_eq!(records.len(), 1);
    records.remove(0)
}

/// The status and message of a refused document.
fn refused(document: &str) -> (u16, String) {
    let refusal = decode(document).expect_err(document);
    (refusal.status, refusal.message)
}

fn assert_refused(document: &str, status: u16, message_start: &str) {
    let (got_status, message) = refused(document);
    assert_eq!(got_status, status, "{document}: {message}");
    assert!(message.starts_with(message_start), "{document}: {message}");
}

fn messages(count: usize) -> String {
    let message = json!({ "payload": "m" });
    json!({ "messages": vec![message; count] }).to_string()
}

fn zstd_of(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 3).unwrap()
}

fn gzip_of(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

#[test]
fn a_batch_decodes_in_order() {
    let records = accepted(
        r#"{"messages":[
            {"payload":"first","key":"ord_123"},
            {"payload":"second","partition":2},
            {"payload":"third","key":"k","partition":0}
        ]}"#,
    );
    assert_eq!(
        records,
        vec![
            Owned {
                key: Some(b"ord_123".to_vec()),
                payload: b"first".to_vec(),
                partition: None,
            },
            Owned {
                key: None,
                payload: b"second".to_vec(),
                partition: Some(2),
            },
            Owned {
                key: Some(b"k".to_vec()),
                payload: b"third".to_vec(),
                partition: Some(0),
            },
        ]
    );
}

#[test]
fn string_payloads_are_their_unescaped_text() {
    let payload = record(r#"{"messages":[{"payload":"a\"b\\c\u00e9\n"}]}"#).payload;
    assert_eq!(payload, "a\"b\\cé\n".as_bytes());
    assert_eq!(
        record(&one(json!({"payload": "été"}))).payload,
        "été".as_bytes()
    );
}

#[test]
fn json_payloads_are_kept_verbatim() {
    for (text, stored) in [
        (r#"{ "a" : [1, 2] }"#, r#"{ "a" : [1, 2] }"#),
        ("[true,null]", "[true,null]"),
        (
            "123456789012345678901234567890",
            "123456789012345678901234567890",
        ),
        ("1.50e3", "1.50e3"),
        ("-0", "-0"),
        ("false", "false"),
        ("  {}  ", "{}"),
    ] {
        let document = format!(r#"{{"messages":[{{"payload":{text}}}]}}"#);
        assert_eq!(record(&document).payload, stored.as_bytes(), "{text}");
    }
}

#[test]
fn deeply_nested_json_payloads_are_accepted() {
    let depth = 5000;
    let payload = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let document = format!(r#"{{"messages":[{{"payload":{payload}}}]}}"#);
    assert_eq!(record(&document).payload, payload.as_bytes());
}

#[test]
fn a_payload_is_required() {
    assert_refused(
        &one(json!({"key": "k"})),
        400,
        "message 0: payload is required",
    );
    assert_refused(
        &one(json!({"payload": null})),
        400,
        "message 0: payload is required",
    );
}

#[test]
fn base64_payloads_are_decoded() {
    let bytes = [0u8, 159, 146, 150, 255];
    let message = json!({"payload": STANDARD.encode(bytes), "payload_encoding": "base64"});
    assert_eq!(record(&one(message)).payload, bytes);
    // As Go's standard decoder reads it: line breaks skipped, the unused bits
    // of the last symbol not checked.
    for (text, expected) in [
        ("QR==", &b"A"[..]),
        ("QQ==", b"A"),
        ("aGVs\r\nbG8=", b"hello"),
        ("aGVs\nbG8=\n", b"hello"),
    ] {
        let message = json!({"payload": text, "payload_encoding": "base64"});
        assert_eq!(record(&one(message)).payload, expected, "{text}");
    }
    // An encoding of "" or null is no encoding.
    for encoding in [json!(""), json!(null)] {
        let message = json!({"payload": "aGk=", "payload_encoding": encoding});
        assert_eq!(record(&one(message)).payload, b"aGk=");
    }
}

#[test]
fn bad_base64_payloads_are_refused() {
    for bad in [
        "not base64!",
        "aGk",
        "aGk=aGk=",
        &URL_SAFE.encode([251u8, 255]),
    ] {
        let message = json!({"payload": bad, "payload_encoding": "base64"});
        assert_refused(&one(message), 400, "message 0: payload is not valid base64");
    }
    let message = json!({"payload": {"a": 1}, "payload_encoding": "base64"});
    assert_refused(
        &one(message),
        400,
        "message 0: a base64 payload must be a JSON string",
    );
}

#[test]
fn unknown_encodings_are_refused() {
    for (field, value) in [
        ("payload_encoding", "hex"),
        ("payload_encoding", "BASE64"),
        ("key_encoding", "utf8"),
    ] {
        let message = json!({"payload": "p", "key": "k", field: value});
        assert_refused(
            &one(message),
            400,
            &format!("message 0: unsupported {field}"),
        );
    }
}

#[test]
fn keys_are_text_or_base64() {
    let message = json!({"payload": "p", "key": "été"});
    assert_eq!(record(&one(message)).key.unwrap(), "été".as_bytes());
    let message =
        json!({"payload": "p", "key": STANDARD.encode([0u8, 255]), "key_encoding": "base64"});
    assert_eq!(record(&one(message)).key.unwrap(), [0u8, 255]);
    let message = json!({"payload": "p", "key": "%%%", "key_encoding": "base64"});
    assert_refused(&one(message), 400, "message 0: key is not valid base64");
    let message = json!({"payload": "p", "key": 42});
    assert_refused(&one(message), 400, "message 0: key must be a JSON string");
}

#[test]
fn an_empty_or_null_key_is_no_key() {
    for key in [json!(""), json!(null)] {
        let message = json!({"payload": "p", "key": key});
        assert_eq!(record(&one(message)).key, None);
    }
    let message = json!({"payload": "p", "key": "", "key_encoding": "base64"});
    assert_eq!(record(&one(message)).key, None);
}

#[test]
fn keys_are_capped() {
    let message = json!({"payload": "p", "key": "k".repeat(KEY_BYTES_MAX)});
    assert_eq!(record(&one(message)).key.unwrap().len(), KEY_BYTES_MAX);
    let message = json!({"payload": "p", "key": "k".repeat(KEY_BYTES_MAX + 1)});
    assert_refused(&one(message), 400, "message 0: key too long");
}

#[test]
fn partitions_are_integers_in_range() {
    let partition = |value: &str| {
        let document = format!(r#"{{"messages":[{{"payload":"p","partition":{value}}}]}}"#);
        decode(&document).map(|mut records| records.remove(0).partition)
    };
    assert_eq!(partition("0"), Ok(Some(0)));
    assert_eq!(partition("2"), Ok(Some(2)));
    assert_eq!(partition("-0"), Ok(Some(0)));
    assert_eq!(partition("null"), Ok(None));
    for out_of_range in ["3", "-1", "4294967296", "99999999999999999999999"] {
        let refusal = partition(out_of_range).unwrap_err();
        assert_eq!(refusal.status, 400);
        assert_eq!(
            refusal.message, "message 0: partition out of range",
            "{out_of_range}"
        );
    }
    for invalid in ["1.5", "1.0", "1e0", "\"1\"", "true", "[1]"] {
        let refusal = partition(invalid).unwrap_err();
        assert_eq!(refusal.status, 400);
        assert!(
            refusal.message.starts_with("message 0: invalid partition"),
            "{invalid}: {}",
            refusal.message
        );
    }
}

#[test]
fn payload_sizes_are_one_byte_to_one_mebibyte() {
    assert_refused(
        &one(json!({"payload": ""})),
        400,
        "message 0: empty message",
    );
    let message = json!({"payload": "", "payload_encoding": "base64"});
    assert_refused(&one(message), 400, "message 0: empty message");

    let largest = "x".repeat(PAYLOAD_BYTES_MAX);
    assert_eq!(
        record(&one(json!({"payload": largest}))).payload.len(),
        PAYLOAD_BYTES_MAX
    );
    let (status, message) = refused(&one(json!({"payload": format!("{largest}x")})));
    assert_eq!(
        (status, message.as_str()),
        (413, "message 0: message too large")
    );

    let encoded = STANDARD.encode(vec![7u8; PAYLOAD_BYTES_MAX + 1]);
    let message = json!({"payload": encoded, "payload_encoding": "base64"});
    assert_refused(&one(message), 413, "message 0: message too large");

    let array = format!("[{}0]", "0,".repeat(PAYLOAD_BYTES_MAX / 2));
    let document = format!(r#"{{"messages":[{{"payload":{array}}}]}}"#);
    assert_refused(&document, 413, "message 0: message too large");
}

#[test]
fn unknown_and_duplicate_fields_are_refused() {
    let message = json!({"payload": "p", "colour": "red"});
    assert_refused(&one(message), 400, "message 0: unknown field `colour`");
    assert_refused(
        r#"{"messages":[{"payload":"p"}],"extra":1}"#,
        400,
        "invalid batch: unknown field `extra`",
    );
    assert_refused(
        r#"{"messages":[{"payload":"p","payload":"q"}]}"#,
        400,
        "message 0: duplicate field `payload`",
    );
    assert_refused(
        r#"{"messages":[{"payload":"p"}],"messages":[]}"#,
        400,
        "invalid batch: duplicate field `messages`",
    );
}

#[test]
fn malformed_documents_are_refused() {
    for document in [
        "",
        "null",
        "[]",
        "{}",
        r#"{"messages":{}}"#,
        r#"{"messages":null}"#,
        r#"{"messages":[{"payload":"p"}]} trailing"#,
        r#"[[{"payload":"p"}]]"#,
    ] {
        assert_refused(document, 400, "invalid batch: ");
    }
    // A body cut short between messages is the list's fault, not a message's
    // (see `a_document_cut_between_messages_names_no_message`).
    assert_refused(r#"{"messages":[{"payload":"p"}"#, 400, "invalid batch: EOF");
    assert_refused(r#"{"messages":["p"]}"#, 400, "message 0: invalid type");
    // A message written as an array of its fields is not an object.
    assert_refused(r#"{"messages":[["p"]]}"#, 400, "message 0: invalid type");
    assert_refused(
        r#"{"messages":[{"payload":"p"},{"payload":tru}]}"#,
        400,
        "message 1: ",
    );
    assert_refused("\u{feff}{}", 400, "invalid batch: ");
    let not_utf8 = b"{\"messages\":[{\"payload\":\"\xff\"}]}";
    let refusal = decode_batch(body_of(not_utf8), None, PARTITIONS).unwrap_err();
    assert_eq!(refusal.status, 400);
}

#[test]
fn a_batch_holds_1_to_1000_messages() {
    assert_refused(
        r#"{"messages":[]}"#,
        400,
        "a batch holds 1 to 1000 messages",
    );
    assert_eq!(accepted(&messages(1)).len(), 1);
    assert_eq!(
        accepted(&messages(BATCH_MESSAGES_MAX)).len(),
        BATCH_MESSAGES_MAX
    );
    let (status, message) = refused(&messages(BATCH_MESSAGES_MAX + 1));
    assert_eq!(
        (status, message.as_str()),
        (400, "a batch holds at most 1000 messages")
    );
}

#[test]
fn the_first_bad_message_refuses_the_whole_batch_by_index() {
    let document = json!({"messages": [
        {"payload": "ok"},
        {"payload": "ok", "partition": 1},
        {"payload": "ok", "partition": 9},
        {"payload": ""},
    ]})
    .to_string();
    let (status, message) = refused(&document);
    assert_eq!(
        (status, message.as_str()),
        (400, "message 2: partition out of range")
    );
    // Parse errors name their message too, past the 999th.
    let mut document = messages(BATCH_MESSAGES_MAX - 1);
    document.insert_str(document.len() - 2, r#",{"payload":"p","x":1}"#);
    assert_refused(&document, 400, "message 999: unknown field `x`");
}

#[test]
fn compressed_batches_decode_like_plain_ones() {
    let document = json!({"messages": [
        {"payload": "a", "key": "k"},
        {"payload": {"n": 1}, "partition": 2},
    ]})
    .to_string();
    let plain = accepted(&document);
    for (header, body) in [
        ("zstd", zstd_of(document.as_bytes())),
        ("gzip", gzip_of(document.as_bytes())),
        ("GZIP", gzip_of(document.as_bytes())),
    ] {
        assert_eq!(
            decode_batch(body_of(&body), Some(header), PARTITIONS).map(|b| owned(&b)),
            Ok(plain.clone())
        );
    }
    assert_eq!(
        decode_batch(body_of(document.as_bytes()), Some("identity"), PARTITIONS).map(|b| owned(&b)),
        Ok(plain)
    );
}

#[test]
fn unsupported_content_encodings_are_415() {
    for header in ["br", "deflate", "gzip, zstd", "compress"] {
        let refusal = decode_batch(body_of(b"{}"), Some(header), PARTITIONS).unwrap_err();
        assert_eq!(refusal.status, 415, "{header}");
        assert!(refusal.message.starts_with("unsupported content encoding"));
    }
}

#[test]
fn corrupt_compressed_bodies_are_400() {
    let document = messages(10);
    for (header, mut body) in [
        ("zstd", zstd_of(document.as_bytes())),
        ("gzip", gzip_of(document.as_bytes())),
    ] {
        body.truncate(body.len() - 3);
        let refusal = decode_batch(body_of(&body), Some(header), PARTITIONS).unwrap_err();
        assert_eq!(refusal.status, 400, "{header}: {}", refusal.message);
        assert!(refusal
            .message
            .starts_with("cannot decompress the request body"));
        // A plain body labelled as compressed is corrupt data too.
        let refusal =
            decode_batch(body_of(document.as_bytes()), Some(header), PARTITIONS).unwrap_err();
        assert_eq!(refusal.status, 400, "{header}");
    }
}

#[test]
fn zip_bombs_are_413_without_being_inflated() {
    let zeros = || io::repeat(0).take(100 << 20);
    let mut zstd_bomb = Vec::new();
    zstd::stream::copy_encode(zeros(), &mut zstd_bomb, 1).unwrap();
    let mut gzip_bomb = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    io::copy(&mut zeros(), &mut gzip_bomb).unwrap();
    let gzip_bomb = gzip_bomb.finish().unwrap();
    for (header, bomb) in [("zstd", zstd_bomb), ("gzip", gzip_bomb)] {
        assert!(bomb.len() < 1 << 20, "{header}: {}", bomb.len());
        let refusal = decode_batch(body_of(&bomb), Some(header), PARTITIONS).unwrap_err();
        assert_eq!(refusal.status, 413, "{header}: {}", refusal.message);
        assert!(refusal.message.starts_with("request body too large"));
    }
}

#[test]
fn bodies_past_the_batch_cap_are_413() {
    let body = vec![b' '; BATCH_BODY_BYTES_MAX + 1];
    let refusal = decode_batch(body_of(&body), None, PARTITIONS).unwrap_err();
    assert_eq!(refusal.status, 413);
}

#[test]
fn a_lone_surrogate_in_a_payload_or_key_string_is_refused() {
    assert_refused(
        r#"{"messages":[{"payload":"ok"},{"payload":"a\ud800b"}]}"#,
        400,
        "message 1: payload is not a valid JSON string",
    );
    assert_refused(
        r#"{"messages":[{"payload":"ok","key":"\udc00"}]}"#,
        400,
        "message 0: key is not a valid JSON string",
    );
    assert_refused(
        r#"{"messages":[{"payload":"\udc00","payload_encoding":"base64"}]}"#,
        400,
        "message 0: payload is not a valid JSON string",
    );
    assert_refused(
        r#"{"messages":[{"payload":"aGk=","key":"\ud800","key_encoding":"base64"}]}"#,
        400,
        "message 0: key is not a valid JSON string",
    );
    // A pair is one character.
    assert_eq!(
        record(r#"{"messages":[{"payload":"\ud83d\ude00"}]}"#).payload,
        "😀".as_bytes()
    );
}

#[test]
fn every_kind_of_payload_and_key_keeps_its_own_bytes_in_a_mixed_batch() {
    let records = accepted(&json!({"messages": [
        {"payload": "plain", "key": "k1"},
        {"payload": "esc\"aped\n", "key": STANDARD.encode([0u8, 1, 2]), "key_encoding": "base64"},
        {"payload": {"json": [1, 2]}},
        {"payload": STANDARD.encode([9u8; 5]), "payload_encoding": "base64", "key": "ké"},
        {"payload": 42, "partition": 1},
    ]})
    .to_string());
    assert_eq!(
        records,
        vec![
            Owned {
                key: Some(b"k1".to_vec()),
                payload: b"plain".to_vec(),
                partition: None
            },
            Owned {
                key: Some(vec![0, 1, 2]),
                payload: b"esc\"aped\n".to_vec(),
                partition: None
            },
            Owned {
                key: None,
                payload: br#"{"json":[1,2]}"#.to_vec(),
                partition: None
            },
            Owned {
                key: Some("ké".as_bytes().to_vec()),
                payload: vec![9; 5],
                partition: None
            },
            Owned {
                key: None,
                payload: b"42".to_vec(),
                partition: Some(1)
            },
        ]
    );
}

#[test]
fn the_decoded_buffer_holds_little_more_room_than_its_records_need() {
    // Many one-byte messages: the document is mostly JSON around them.
    let document =
        json!({ "messages": vec![json!({"payload": "m", "key": "k"}); 1000] }).to_string();
    let batch = decode_batch(body_of(document.as_bytes()), None, PARTITIONS).unwrap();
    assert_eq!(batch.len(), 1000);
    // The records point at a fifteenth of the document: copied out of it, and
    // the document let go.
    assert_eq!(batch.copied_bytes(), 2000);
    assert!(batch
        .records()
        .all(|r| r.key == Some(&b"k"[..]) && r.payload == b"m"));
    assert!(
        batch.decoded_bytes() <= 2000 + 2000 / 4,
        "{} bytes of room for 2000 bytes of keys and payloads",
        batch.decoded_bytes()
    );
}

#[test]
fn text_that_is_its_own_value_is_not_copied() {
    let plain = "p".repeat(4000);
    let object = format!(r#"{{"a":"{}"}}"#, "o".repeat(3000));
    let document = format!(
        r#"{{"messages":[{{"payload":"{plain}","key":"k1"}},{{"payload":{object}}},{{"payload":"a\"b","key":"k\u0032"}},{{"payload":"aGk=","payload_encoding":"base64"}}]}}"#
    );
    let batch = decode_batch(body_of(&document), None, PARTITIONS).unwrap();
    let expected = [
        (Some(&b"k1"[..]), plain.as_bytes()),
        (None, object.as_bytes()),
        (Some(&b"k2"[..]), &b"a\"b"[..]),
        (None, &b"hi"[..]),
    ];
    let got: Vec<_> = batch.records().map(|r| (r.key, r.payload)).collect();
    assert_eq!(got, expected);
    // Only the escaped payload and key and the base64 payload were decoded.
    assert_eq!(batch.copied_bytes(), 3 + 2 + 2);
    assert!(
        batch.decoded_bytes() >= document.len(),
        "the document is kept"
    );
}

#[test]
fn a_document_cut_between_messages_names_no_message() {
    // Cut after the only message: the list is unfinished, no message is bad.
    let (status, message) = refused(r#"{"messages":[{"payload":"a"}"#);
    assert_eq!(status, 400);
    assert!(message.contains("EOF while parsing a list"), "{message}");
    assert!(!message.contains("message 1"), "{message}");
    let (_, message) = refused(r#"{"messages":[{"payload":"a"} {"payload":"b"}]}"#);
    assert!(!message.contains("message 1"), "{message}");
    // Cut inside the second message: that message is named.
    assert_refused(
        r#"{"messages":[{"payload":"a"},{"payload":"#,
        400,
        "message 1: ",
    );
}
