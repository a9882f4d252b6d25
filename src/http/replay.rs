//! `GET /v1/topics/{topic}/consume?partition=P&offset=O`: replay, a read of one
//! committed record by offset, without a lease.
//!
//! Until the consume path lands this is the only consume form served; it reads
//! through the partition log's read path, so nothing at or above the high
//! watermark is ever returned. 204 when the offset is at or past the end, 410 when
//! it is below the oldest retained offset or its bytes are unreadable.
//!
//! The Message object follows the reference: `payload` is the JSON value itself
//! when the payload is valid JSON, a JSON string when it is other UTF-8 text, else
//! base64 with `payload_encoding: "base64"`; `key` is a string when it is UTF-8,
//! else base64 with `key_encoding: "base64"`, and absent for a keyless record;
//! `timestamp` is the commit time in Unix seconds; no `receipt_handle` on replay.
//!
//! Which cores: the accepting shard, which asks the partition's owner shard.

use std::sync::Arc;

use base64::Engine;
use hyper::{Response, StatusCode};
use narad_shards::ids::{Offset, PartitionId};
use narad_shards::log::{ReadItem, ReadRange, Record};
use serde_json::value::RawValue;

use super::produce_input::json_text::strict_readers_refuse;
use super::response::{self, Body};
use crate::broker::Shard;
use crate::meta::TopicRecord;

/// Payload bytes one replay reads at most (one record is always returned).
const REPLAY_BYTES_MAX: usize = 1 << 20;

/// The reference's Message object for a committed record; `receipt_handle` is
/// absent on replay.
pub fn message_json(
    topic: &str,
    partition: PartitionId,
    record: &Record,
    receipt_handle: Option<&str>,
) -> Vec<u8> {
    let mut out = Vec::new();
    MessageWriter::new(topic).write(&mut out, partition, record, receipt_handle);
    out
}

/// Writes Message objects of one topic straight into a body, fields in the
/// reference's order. Written by hand rather than derived: a batch reply writes
/// a hundred of them, and the derived serializer escaped the topic and the
/// receipt handle of every one and made a `String` of every converted payload.
/// The tests hold the derived form as the oracle.
pub struct MessageWriter {
    /// `{"topic":"<escaped name>","partition":`, the same for every message.
    head: Vec<u8>,
}

impl MessageWriter {
    pub fn new(topic: &str) -> MessageWriter {
        let mut head = b"{\"topic\":".to_vec();
        write_json_string(&mut head, topic);
        head.extend_from_slice(b",\"partition\":");
        MessageWriter { head }
    }

    /// Appends the Message object of `record` to `out`. A receipt handle is
    /// digits and colons, so it goes in as it is.
    pub fn write(
        &self,
        out: &mut Vec<u8>,
        partition: PartitionId,
        record: &Record,
        receipt_handle: Option<&str>,
    ) {
        let mut digits = itoa::Buffer::new();
        out.extend_from_slice(&self.head);
        out.extend_from_slice(digits.format(partition.0).as_bytes());
        out.extend_from_slice(b",\"offset\":");
        out.extend_from_slice(digits.format(record.offset.0).as_bytes());
        if let Some(key) = &record.key {
            out.extend_from_slice(b",\"key\":");
            if write_text_or_base64(out, key) {
                out.extend_from_slice(b",\"key_encoding\":\"base64\"");
            }
        }
        out.extend_from_slice(b",\"payload\":");
        if write_payload(out, &record.payload) {
            out.extend_from_slice(b",\"payload_encoding\":\"base64\"");
        }
        out.extend_from_slice(b",\"timestamp\":");
        out.extend_from_slice(digits.format(record.commit_time_ms / 1000).as_bytes());
        out.extend_from_slice(b",\"timestamp_ms\":");
        out.extend_from_slice(digits.format(record.commit_time_ms).as_bytes());
        if let Some(handle) = receipt_handle {
            debug_assert!(handle.bytes().all(|b| b.is_ascii_digit() || b == b':'));
            out.extend_from_slice(b",\"receipt_handle\":\"");
            out.extend_from_slice(handle.as_bytes());
            out.push(b'"');
        }
        out.push(b'}');
    }
}

/// A payload: the JSON value itself when it is valid JSON, a JSON string when
/// it is other UTF-8 text, else base64 (returns true). JSON that strict
/// readers refuse (an escape that names no character, `"\ud800"`; a number
/// past a double, `1e999`; nesting past `VERBATIM_DEPTH_MAX`) goes as text:
/// written verbatim it would make the whole reply unreadable, and the message
/// impossible to ack.
fn write_payload(out: &mut Vec<u8>, payload: &[u8]) -> bool {
    if let Ok(text) = std::str::from_utf8(payload) {
        // The value without the white space around it.
        if let Ok(raw) = serde_json::from_str::<&RawValue>(text) {
            if !strict_readers_refuse(raw.get()) {
                out.extend_from_slice(raw.get().as_bytes());
                return false;
            }
        }
    }
    write_text_or_base64(out, payload)
}

/// A JSON string of the bytes when they are UTF-8, else of their base64
/// (returns true).
fn write_text_or_base64(out: &mut Vec<u8>, bytes: &[u8]) -> bool {
    match std::str::from_utf8(bytes) {
        Ok(text) => {
            write_json_string(out, text);
            false
        }
        Err(_) => {
            // Base64 needs no escaping.
            out.push(b'"');
            let start = out.len();
            out.resize(start + bytes.len().div_ceil(3) * 4, 0);
            let written = base64::engine::general_purpose::STANDARD
                .encode_slice(bytes, &mut out[start..])
                .expect("room for the encoding");
            out.truncate(start + written);
            out.push(b'"');
            true
        }
    }
}

fn write_json_string(out: &mut Vec<u8>, text: &str) {
    serde_json::to_writer(out, text).expect("a string serializes into memory");
}

/// Reads the record at `offset` of a partition (already checked in range).
pub async fn replay(
    shard: &Shard,
    topic: &str,
    record: &TopicRecord,
    partition: PartitionId,
    offset: u64,
) -> Response<Body> {
    let name: Arc<str> = Arc::from(topic);
    let read = shard
        .read(
            name,
            record.id,
            partition,
            ReadRange::new(Offset(offset), 1, REPLAY_BYTES_MAX),
        )
        .await;
    let batch = match read {
        Ok(batch) => batch,
        Err(e) => return super::topics::read_error(topic, partition, &e),
    };
    match batch.items.into_iter().next() {
        None => {
            let mut response = Response::new(Body::default());
            *response.status_mut() = StatusCode::NO_CONTENT;
            response
        }
        Some(ReadItem::Corrupt(range)) => {
            let offsets = match range.end.0 - range.start.0 {
                1 => format!("offset {} of partition {} is", range.start.0, partition.0),
                _ => format!(
                    "offsets {} to {} of partition {} are",
                    range.start.0,
                    range.end.0 - 1,
                    partition.0
                ),
            };
            response::error(
                StatusCode::GONE,
                &format!("{offsets} unreadable (corrupt on disk)"),
            )
        }
        Some(ReadItem::Record(r)) => {
            let body = message_json(topic, partition, &r, None);
            let mut response = Response::new(Body::new(bytes::Bytes::from(body)));
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::produce_input::json_text::strict_in_a_batch_reply;
    use super::*;
    use bytes::Bytes;

    fn record(key: Option<&[u8]>, payload: &[u8]) -> Record {
        Record {
            offset: Offset(7),
            key: key.map(Bytes::copy_from_slice),
            commit_time_ms: 1_700_000_000_123,
            payload: Bytes::copy_from_slice(payload),
        }
    }

    fn json(r: &Record) -> String {
        String::from_utf8(message_json("t", PartitionId(2), r, None)).unwrap()
    }

    /// The Message object as serde derives it: the oracle of the hand-written
    /// writer.
    #[derive(serde::Serialize)]
    struct Message<'a> {
        topic: &'a str,
        partition: u32,
        offset: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        key_encoding: Option<&'static str>,
        payload: Box<RawValue>,
        #[serde(skip_serializing_if = "Option::is_none")]
        payload_encoding: Option<&'static str>,
        timestamp: u64,
        timestamp_ms: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        receipt_handle: Option<&'a str>,
    }

    fn derived(topic: &str, partition: u32, r: &Record, handle: Option<&str>) -> Vec<u8> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let (key, key_encoding) = match &r.key {
            None => (None, None),
            Some(k) => match std::str::from_utf8(k) {
                Ok(text) => (Some(text.to_string()), None),
                Err(_) => (Some(b64.encode(k)), Some("base64")),
            },
        };
        let quoted = |text: &str| RawValue::from_string(serde_json::to_string(text).unwrap());
        let (payload, payload_encoding) = match std::str::from_utf8(&r.payload) {
            // Verbatim only what a strict parser reads.
            Ok(text) => match serde_json::from_str::<&RawValue>(text) {
                Ok(raw) if strict_in_a_batch_reply(raw.get()) => (raw.to_owned(), None),
                _ => (quoted(text).unwrap(), None),
            },
            Err(_) => (quoted(&b64.encode(&r.payload)).unwrap(), Some("base64")),
        };
        serde_json::to_vec(&Message {
            topic,
            partition,
            offset: r.offset.0,
            key,
            key_encoding,
            payload,
            payload_encoding,
            timestamp: r.commit_time_ms / 1000,
            timestamp_ms: r.commit_time_ms,
            receipt_handle: handle,
        })
        .unwrap()
    }

    fn bytes_like() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        prop_oneof![
            // Arbitrary bytes: mostly not UTF-8.
            proptest::collection::vec(any::<u8>(), 0..40),
            // Text with characters JSON escapes.
            "[a-z\\\\\"\\n\\t\u{1}\u{7f}é😀 ]{0,20}".prop_map(String::into_bytes),
            // JSON values, with the white space they came with.
            Just(br#"{"a": [1, 2.5, "x\"y"], "b": null}"#.to_vec()),
            Just(b" 42 ".to_vec()),
            Just(b"\"quoted\"".to_vec()),
            Just(b"{\"unterminated\"".to_vec()),
            // JSON with surrogate escapes: lone ones, a pair, an escaped backslash.
            Just(br#" "\ud800" "#.to_vec()),
            Just(br#"{"k": ["\ud83d\ude00", "\\ud800", "\udc00x"]}"#.to_vec()),
            Just(br#"["\ud83d\ude00"]"#.to_vec()),
            // JSON that strict readers refuse: a number past a double, deep
            // nesting, and one level less.
            Just(b"1e999".to_vec()),
            Just(br#"{"n": [-2E+400]}"#.to_vec()),
            Just(("[".repeat(125) + &"]".repeat(125)).into_bytes()),
            Just(("[".repeat(124) + &"]".repeat(124)).into_bytes()),
        ]
    }

    proptest::proptest! {
        #[test]
        fn the_writer_writes_what_the_derived_serializer_did(
            topic in "[a-zA-Z0-9._\"\\\\-]{1,12}",
            partition in proptest::prelude::any::<u32>(),
            offset in proptest::prelude::any::<u64>(),
            commit_time_ms in proptest::prelude::any::<u64>(),
            key in proptest::option::of(bytes_like()),
            payload in bytes_like(),
            handle in proptest::option::of((0u32..100, proptest::prelude::any::<u64>(), proptest::prelude::any::<u64>())),
        ) {
            let r = Record {
                offset: Offset(offset),
                key: key.map(Bytes::from),
                commit_time_ms,
                payload: Bytes::from(payload),
            };
            let handle = handle.map(|(p, o, n)| format!("{p}:{o}:{n}"));
            let mut out = b"[".to_vec();
            MessageWriter::new(&topic).write(&mut out, PartitionId(partition), &r, handle.as_deref());
            let expected = derived(&topic, partition, &r, handle.as_deref());
            proptest::prop_assert_eq!(
                String::from_utf8_lossy(&out[1..]),
                String::from_utf8_lossy(&expected)
            );
            // What was there before is kept.
            proptest::prop_assert_eq!(out[0], b'[');
        }
    }

    #[test]
    fn payloads_are_json_text_or_base64() {
        assert_eq!(
            json(&record(None, br#"{"b": [1, 2]}"#)),
            r#"{"topic":"t","partition":2,"offset":7,"payload":{"b": [1, 2]},"timestamp":1700000000,"timestamp_ms":1700000000123}"#
        );
        assert_eq!(
            json(&record(Some(b"k1"), b"hello")),
            r#"{"topic":"t","partition":2,"offset":7,"key":"k1","payload":"hello","timestamp":1700000000,"timestamp_ms":1700000000123}"#
        );
        assert_eq!(
            json(&record(Some(&[0xff]), &[0, 0xfe])),
            r#"{"topic":"t","partition":2,"offset":7,"key":"/w==","key_encoding":"base64","payload":"AP4=","payload_encoding":"base64","timestamp":1700000000,"timestamp_ms":1700000000123}"#
        );
        // JSON that names no character goes as the text it is, so the reply
        // stays readable to strict parsers; a proper pair stays verbatim.
        let lone = json(&record(None, br#" "\ud800" "#));
        assert_eq!(
            lone,
            r#"{"topic":"t","partition":2,"offset":7,"payload":" \"\\ud800\" ","timestamp":1700000000,"timestamp_ms":1700000000123}"#
        );
        assert!(serde_json::from_str::<serde_json::Value>(&lone).is_ok());
        assert!(
            json(&record(None, br#"["\ud83d\ude00"]"#)).contains(r#""payload":["\ud83d\ude00"]"#)
        );
    }
}
