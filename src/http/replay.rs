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

use std::borrow::Cow;
use std::sync::Arc;

use base64::Engine;
use hyper::{Response, StatusCode};
use narad_shards::ids::{Offset, PartitionId};
use narad_shards::log::{ReadItem, Record};
use serde::Serialize;
use serde_json::value::RawValue;

use super::response::{self, Body};
use crate::broker::Shard;
use crate::meta::TopicRecord;

/// Payload bytes one replay reads at most (one record is always returned).
const REPLAY_BYTES_MAX: usize = 1 << 20;

#[derive(Serialize)]
struct Message<'a> {
    topic: &'a str,
    partition: u32,
    offset: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_encoding: Option<&'static str>,
    payload: Payload<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_encoding: Option<&'static str>,
    timestamp: u64,
    timestamp_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    receipt_handle: Option<&'a str>,
}

/// A payload as it goes into a Message: a JSON payload is written as it is
/// stored, without a copy; other payloads become a JSON string.
enum Payload<'a> {
    Json(&'a RawValue),
    Converted(Box<RawValue>),
}

impl Serialize for Payload<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Payload::Json(raw) => raw.serialize(serializer),
            Payload::Converted(raw) => raw.serialize(serializer),
        }
    }
}

/// The reference's Message object for a committed record; `receipt_handle` is
/// absent on replay.
pub fn message_json(
    topic: &str,
    partition: PartitionId,
    record: &Record,
    receipt_handle: Option<&str>,
) -> Vec<u8> {
    let mut out = Vec::new();
    write_message_json(&mut out, topic, partition, record, receipt_handle);
    out
}

/// [`message_json`], appended to `out`: a batch reply writes every message
/// straight into its body.
pub fn write_message_json(
    out: &mut Vec<u8>,
    topic: &str,
    partition: PartitionId,
    record: &Record,
    receipt_handle: Option<&str>,
) {
    let b64 = base64::engine::general_purpose::STANDARD;
    let (key, key_encoding) = match &record.key {
        None => (None, None),
        Some(key) => match std::str::from_utf8(key) {
            Ok(text) => (Some(Cow::Borrowed(text)), None),
            Err(_) => (Some(Cow::Owned(b64.encode(key))), Some("base64")),
        },
    };
    let (payload, payload_encoding) = payload_value(&record.payload);
    let message = Message {
        topic,
        partition: partition.0,
        offset: record.offset.0,
        key,
        key_encoding,
        payload,
        payload_encoding,
        timestamp: record.commit_time_ms / 1000,
        timestamp_ms: record.commit_time_ms,
        receipt_handle,
    };
    serde_json::to_writer(out, &message).expect("a message serializes");
}

fn payload_value(payload: &[u8]) -> (Payload<'_>, Option<&'static str>) {
    if let Ok(text) = std::str::from_utf8(payload) {
        if let Ok(raw) = serde_json::from_str::<&RawValue>(text) {
            return (Payload::Json(raw), None);
        }
        let quoted = serde_json::to_string(text).expect("a string serializes");
        let raw = RawValue::from_string(quoted).expect("valid JSON");
        return (Payload::Converted(raw), None);
    }
    let encoded = base64::engine::general_purpose::STANDARD.encode(payload);
    let quoted = serde_json::to_string(&encoded).expect("a string serializes");
    (
        Payload::Converted(RawValue::from_string(quoted).expect("valid JSON")),
        Some("base64"),
    )
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
            Offset(offset),
            1,
            REPLAY_BYTES_MAX,
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
        Some(ReadItem::Corrupt(range)) => response::error(
            StatusCode::GONE,
            &format!(
                "offsets {}..{} of partition {} are unreadable (corrupt on disk)",
                range.start.0, range.end.0, partition.0
            ),
        ),
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
    }
}
