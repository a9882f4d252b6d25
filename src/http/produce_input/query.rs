//! The single produce's query string (`key`, `partition`), its payload size, and
//! the batch route's query check.
//!
//! Rules, and where the reference leaves a choice, the one made here:
//! - The query is `application/x-www-form-urlencoded`, decoded by the
//!   `form_urlencoded` crate (`+` is a space, `%XX` a byte). Parameter names are
//!   case-sensitive. Unknown parameters are ignored: the reference names only
//!   `key` and `partition` and refuses nothing else.
//! - `key` or `partition` given twice is a 400, even with the same value: the
//!   reference refuses duplicates rather than picking one.
//! - `partition` is a non-negative decimal integer that fits a `u32` (digits
//!   only, leading zeros allowed); anything else, including an empty value, is a
//!   400. When both are given, `partition` wins over `key` (the key is still
//!   stored with the message). Whether it is in range for the topic is
//!   [`check_partition`]'s question, asked once the topic is known.
//! - An empty `key=` means no key, exactly as an absent one: the message is
//!   keyless and placed round-robin. The reference cannot tell the two apart (it
//!   reads the key as a string, and shows a message without key as one with no
//!   `key` field), so a client that sends `key=` expecting a key of 0 bytes,
//!   always hashing to the partition of `fnv1a32("")`, gets what the reference
//!   gives it: round-robin.
//! - A key is at most [`KEY_BYTES_MAX`] bytes after decoding, else 400.
//! - A key is the bytes its value decodes to, UTF-8 or not, as in the reference
//!   (whose keys are Go strings of bytes): `key=%FF%00` is the two-byte key
//!   `FF 00`, hashed as such, and shown base64 with `key_encoding` when read.
//!   The key is decoded from the raw query here, since a text decoder would
//!   replace such bytes with U+FFFD and hash the key to another partition.
//!
//! Which cores: every shard; pure functions.

use hyper::StatusCode;

use super::{KEY_BYTES_MAX, PAYLOAD_BYTES_MAX};
use crate::http::response::Refusal;

/// What a single produce's query string asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProduceQuery {
    /// The message's key; `None` when absent or empty (a keyless message).
    pub key: Option<Vec<u8>>,
    /// The partition the message is pinned to; wins over `key`.
    pub partition: Option<u32>,
}

/// Decodes the query string of `POST /v1/topics/{topic}/produce` (without the
/// `?`). An `Err` is the message of a 400.
pub fn parse_produce_query(query: Option<&str>) -> Result<ProduceQuery, String> {
    let mut produce_query = ProduceQuery::default();
    let mut key_seen = false;
    let mut partition_seen = false;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match &*form_decode(name) {
            b"key" => {
                if std::mem::replace(&mut key_seen, true) {
                    return Err("duplicate key parameter".to_string());
                }
                produce_query.key = query_key(form_decode(value).into_owned())?;
            }
            b"partition" => {
                if std::mem::replace(&mut partition_seen, true) {
                    return Err("duplicate partition parameter".to_string());
                }
                let value = form_decode(value);
                produce_query.partition = Some(query_partition(&String::from_utf8_lossy(&value))?);
            }
            _ => {}
        }
    }
    assert!(produce_query.key.as_ref().is_none_or(|key| !key.is_empty()));
    Ok(produce_query)
}

/// One name or value of an `application/x-www-form-urlencoded` query, as bytes:
/// `+` is a space, `%XX` a byte, anything else itself. Borrowed when there is
/// nothing to decode, as in most names and values (no allocation per produce).
fn form_decode(raw: &str) -> std::borrow::Cow<'_, [u8]> {
    if !raw.bytes().any(|b| b == b'+' || b == b'%') {
        return std::borrow::Cow::Borrowed(raw.as_bytes());
    }
    let spaced = raw.replace('+', " ");
    std::borrow::Cow::Owned(percent_encoding::percent_decode_str(&spaced).collect())
}

/// A decoded `key` value: `None` when empty.
fn query_key(value: Vec<u8>) -> Result<Option<Vec<u8>>, String> {
    if value.len() > KEY_BYTES_MAX {
        return Err(format!("key too long: at most {KEY_BYTES_MAX} bytes"));
    }
    Ok((!value.is_empty()).then_some(value))
}

/// A decoded `partition` value: decimal digits only, fitting a `u32`.
fn query_partition(value: &str) -> Result<u32, String> {
    match crate::http::decimal::<u32>(value) {
        Some(partition) => Ok(partition),
        None => Err(format!(
            "invalid partition {value:?}: want a non-negative integer"
        )),
    }
}

/// The range check of an explicit partition against the topic's partition count.
/// An `Err` is the message of a 400.
pub fn check_partition(partition: u32, partitions: u32) -> Result<(), String> {
    assert!(partitions > 0, "a topic has at least one partition");
    if partition < partitions {
        Ok(())
    } else {
        Err("partition out of range".to_string())
    }
}

/// The size rule of a single produce's payload (its whole body): 1 byte to
/// [`PAYLOAD_BYTES_MAX`]. The capped body reader already answers 413 past the
/// cap; this check keeps the rule true whoever read the body.
pub fn check_single_payload(body_len: usize) -> Result<(), Refusal> {
    if body_len == 0 {
        return Err(Refusal {
            status: StatusCode::BAD_REQUEST,
            message: "empty message",
        });
    }
    if body_len > PAYLOAD_BYTES_MAX {
        return Err(Refusal {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: "message too large",
        });
    }
    Ok(())
}

/// The batch route's query check: keys and partitions belong to each message in
/// the body, so `key` or `partition` in the query string is a 400 rather than
/// something silently ignored. Other parameters are ignored, as on the single
/// route. An `Err` is the message of a 400.
pub fn batch_query_check(query: Option<&str>) -> Result<(), String> {
    let misplaced = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .find(|(name, _)| name == "key" || name == "partition");
    match misplaced {
        Some((name, _)) => Err(format!(
            "{name} is not a query parameter of a batch: set it per message in the body"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(query: &str) -> ProduceQuery {
        parse_produce_query(Some(query)).unwrap_or_else(|e| panic!("{query}: {e}"))
    }

    fn refused(query: &str) -> String {
        parse_produce_query(Some(query)).expect_err(query)
    }

    #[test]
    fn no_query_is_keyless_and_unpinned() {
        assert_eq!(parse_produce_query(None).unwrap(), ProduceQuery::default());
        assert_eq!(parsed(""), ProduceQuery::default());
        assert_eq!(parsed("&&"), ProduceQuery::default());
    }

    #[test]
    fn key_and_partition_are_decoded() {
        assert_eq!(
            parsed("key=ord_123&partition=2"),
            ProduceQuery {
                key: Some(b"ord_123".to_vec()),
                partition: Some(2),
            }
        );
        assert_eq!(parsed("key=a%20b+c%2B%26").key.unwrap(), b"a b c+&");
        assert_eq!(parsed("key=%C3%A9t%C3%A9").key.unwrap(), "été".as_bytes());
        assert_eq!(parsed("partition=0").partition, Some(0));
        assert_eq!(parsed("partition=007").partition, Some(7));
        assert_eq!(parsed("partition=4294967295").partition, Some(u32::MAX));
    }

    #[test]
    fn an_empty_key_is_no_key() {
        assert_eq!(parsed("key=").key, None);
        assert_eq!(parsed("key").key, None);
        assert_eq!(parsed("key=&partition=1").partition, Some(1));
    }

    #[test]
    fn unknown_parameters_are_ignored() {
        assert_eq!(parsed("foo=bar&Key=x&PARTITION=y").key, None);
        assert_eq!(parsed("foo&key=k&x=1").key.unwrap(), b"k");
    }

    #[test]
    fn duplicate_parameters_are_refused() {
        assert_eq!(refused("key=a&key=b"), "duplicate key parameter");
        assert_eq!(refused("key=a&key=a"), "duplicate key parameter");
        assert_eq!(refused("key=&key="), "duplicate key parameter");
        assert_eq!(
            refused("partition=1&partition=1"),
            "duplicate partition parameter"
        );
        assert_eq!(
            refused("partition=1&key=a&partition=2"),
            "duplicate partition parameter"
        );
    }

    #[test]
    fn a_partition_must_be_a_non_negative_u32() {
        for bad in [
            "",
            "-1",
            "-0",
            "+1",
            "1.0",
            "1e3",
            "0x10",
            " 1",
            "1 ",
            "abc",
            "4294967296",
            "99999999999999999999",
        ] {
            let query = format!(
                "partition={}",
                form_urlencoded::byte_serialize(bad.as_bytes()).collect::<String>()
            );
            let message = refused(&query);
            assert!(
                message.starts_with("invalid partition"),
                "{bad:?}: {message}"
            );
        }
        assert!(refused("partition").starts_with("invalid partition"));
    }

    #[test]
    fn keys_are_capped_bytes_utf8_or_not() {
        let longest = "k".repeat(KEY_BYTES_MAX);
        assert_eq!(
            parsed(&format!("key={longest}")).key.unwrap().len(),
            KEY_BYTES_MAX
        );
        let message = refused(&format!("key={longest}k"));
        assert!(message.starts_with("key too long"), "{message}");
        let longest_binary = "%FF".repeat(KEY_BYTES_MAX);
        assert_eq!(
            parsed(&format!("key={longest_binary}")).key.unwrap(),
            vec![0xFF; KEY_BYTES_MAX]
        );
        let message = refused(&format!("key={longest_binary}%FF"));
        assert!(message.starts_with("key too long"), "{message}");
        assert_eq!(parsed("key=%FF%00a+b").key.unwrap(), b"\xFF\x00a b");
        // A real U+FFFD in the key is a key like any other.
        assert_eq!(parsed("key=%EF%BF%BD").key.unwrap(), "\u{FFFD}".as_bytes());
        // A `%` not followed by two hex digits stays as it is.
        assert_eq!(parsed("key=a%2").key.unwrap(), b"a%2");
    }

    #[test]
    fn partitions_are_checked_against_the_topic() {
        assert!(check_partition(0, 1).is_ok());
        assert!(check_partition(2, 3).is_ok());
        assert_eq!(check_partition(3, 3).unwrap_err(), "partition out of range");
        assert_eq!(
            check_partition(u32::MAX, 108).unwrap_err(),
            "partition out of range"
        );
    }

    #[test]
    fn a_single_payload_is_one_byte_to_one_mebibyte() {
        let empty = check_single_payload(0).unwrap_err();
        assert_eq!(empty.status, StatusCode::BAD_REQUEST);
        assert_eq!(empty.message, "empty message");
        assert!(check_single_payload(1).is_ok());
        assert!(check_single_payload(PAYLOAD_BYTES_MAX).is_ok());
        let large = check_single_payload(PAYLOAD_BYTES_MAX + 1).unwrap_err();
        assert_eq!(large.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(large.message, "message too large");
    }

    #[test]
    fn a_batch_query_may_not_carry_key_or_partition() {
        assert!(batch_query_check(None).is_ok());
        assert!(batch_query_check(Some("")).is_ok());
        assert!(batch_query_check(Some("foo=1&Key=2")).is_ok());
        for bad in ["key=a", "partition=1", "x=1&key=", "partition", "%6Bey=a"] {
            assert!(batch_query_check(Some(bad)).is_err(), "{bad}");
        }
        assert!(batch_query_check(Some("key=a"))
            .unwrap_err()
            .starts_with("key is not a query parameter"));
    }
}
