//! The batch document of `POST /v1/topics/{topic}/produce/batch`:
//! `{"messages":[{"payload": …, "payload_encoding": "base64", "key": "…",
//! "key_encoding": "base64", "partition": n}]}`.
//!
//! Rules (reference v3.2), and the choices made where it is silent:
//! - Strict JSON: an unknown field, at the top or in a message, a duplicated
//!   field, or anything after the document is a 400. `null` is the same as an
//!   absent field (as in the reference's decoder), so a `null` payload is a
//!   missing payload.
//! - 1 to [`BATCH_MESSAGES_MAX`] messages, else 400. Parsing stops at the first
//!   message past the limit, so an oversized array is refused without being
//!   held in memory.
//! - `payload` is required. With `payload_encoding: "base64"` it must be a JSON
//!   string of standard, padded base64, and its decoded bytes are the payload
//!   (read as Go's standard decoder reads it: line breaks skipped, the unused
//!   bits of the last symbol unchecked).
//!   Without it, a JSON string's text (unescaped, UTF-8) is the payload, and any
//!   other JSON value (object, array, number, boolean) is stored as its JSON
//!   text, verbatim: the bytes between its first and last character exactly as
//!   the client sent them. The reference's Message shows a JSON payload
//!   "verbatim"; re-serialising instead would cost a parse tree per message and
//!   could change numbers that do not fit an `f64`, which a client would see as
//!   a different payload from the one it sent.
//! - A payload is 1 byte to [`PAYLOAD_BYTES_MAX`]: empty → 400
//!   `message <i>: empty message`; larger → 413 `message <i>: message too large`.
//! - `key` is a JSON string (its UTF-8 text), or standard base64 with
//!   `key_encoding: "base64"`. An empty key is no key, as on the single route.
//!   At most [`KEY_BYTES_MAX`] bytes once decoded.
//! - `partition` is a JSON integer in `0..partitions`; out of range (negative
//!   included) → 400 `message <i>: partition out of range`; a non-integer → 400.
//! - An encoding field other than `"base64"` (or `""`, meaning none) → 400.
//! - A payload or key string with an escape that names no character (a lone
//!   UTF-16 surrogate such as `"\ud800"`, which the JSON grammar lets through)
//!   → 400 `message <i>: payload is not a valid JSON string: …` (or `key`).
//! - Every message is checked before any record is returned, and the first
//!   failure refuses the batch, its message prefixed `message <i>: ` with `i` the
//!   0-based index of the message in the array; a document malformed between
//!   messages (cut short after one, a missing comma) is `invalid batch: …`.
//!
//! Allocation and copies: an uncompressed body is parsed in place; a compressed
//! one is decompressed once. Fields borrow from that buffer (the document). A
//! payload or key whose text is its value (a string without escapes, a JSON
//! value kept verbatim: the common case) is not copied: its record points into
//! the document, which the batch keeps. Only what must be decoded (escapes,
//! base64) is written into one buffer sized to the document (decoding never
//! makes text longer). So a batch of any size costs a fixed handful of
//! allocations, and its usual payloads no copy at all before the WAL's. When the
//! records point at less than half of the document (tiny messages in much
//! JSON), they are copied out and the document let go, so that what the batch
//! holds stays within twice what its records need.
//!
//! Which cores: every shard; pure functions.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Range;

use base64::engine::{GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use bytes::Bytes;
use hyper::StatusCode;
use serde::de::value::MapAccessDeserializer;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::content::{self, ContentRefusal};
use super::{BATCH_BODY_BYTES_MAX, BATCH_MESSAGES_MAX, KEY_BYTES_MAX, PAYLOAD_BYTES_MAX};

/// One checked message of a batch, ready to be staged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchRecord<'a> {
    /// `None` for a keyless message; never an empty key.
    pub key: Option<&'a [u8]>,
    /// 1 byte to [`PAYLOAD_BYTES_MAX`].
    pub payload: &'a [u8],
    /// An explicit partition, below the topic's partition count.
    pub partition: Option<u32>,
}

/// A checked batch: every message's key and payload, in the document as sent
/// or decoded into a buffer of the batch's.
#[derive(Debug)]
pub struct DecodedBatch {
    /// The (decompressed) body; empty once no record points into it.
    document: Bytes,
    decoded: Vec<u8>,
    records: Vec<Spans>,
}

/// Where one message's key and payload sit.
#[derive(Debug)]
struct Spans {
    key: Option<Span>,
    payload: Span,
    partition: Option<u32>,
}

/// Bytes of a key or payload: in [`DecodedBatch::document`], or in
/// [`DecodedBatch::decoded`].
#[derive(Clone, Debug, PartialEq, Eq)]
enum Span {
    Document(Range<usize>),
    Decoded(Range<usize>),
}

impl Span {
    fn len(&self) -> usize {
        match self {
            Span::Document(range) | Span::Decoded(range) => range.len(),
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl DecodedBatch {
    /// The messages, in batch order.
    pub fn records(&self) -> impl ExactSizeIterator<Item = BatchRecord<'_>> + '_ {
        self.records.iter().map(|spans| BatchRecord {
            key: spans.key.as_ref().map(|key| self.bytes(key)),
            payload: self.bytes(&spans.payload),
            partition: spans.partition,
        })
    }

    fn bytes(&self, span: &Span) -> &[u8] {
        match span {
            Span::Document(range) => &self.document[range.clone()],
            Span::Decoded(range) => &self.decoded[range.clone()],
        }
    }

    /// Copies what points into the document out of it, and lets the document
    /// go, when the records point at less than half of it.
    fn let_go_of_a_sparse_document(&mut self) {
        let in_document: usize = self
            .records
            .iter()
            .flat_map(|r| r.key.iter().chain([&r.payload]))
            .filter(|span| matches!(span, Span::Document(_)))
            .map(Span::len)
            .sum();
        if in_document * 2 >= self.document.len() {
            return;
        }
        self.decoded.reserve_exact(in_document);
        let Self {
            document,
            decoded,
            records,
        } = self;
        for span in records
            .iter_mut()
            .flat_map(|r| r.key.iter_mut().chain([&mut r.payload]))
        {
            if let Span::Document(range) = span {
                let start = decoded.len();
                decoded.extend_from_slice(&document[range.clone()]);
                *span = Span::Decoded(start..decoded.len());
            }
        }
        *document = Bytes::new();
    }

    /// How many messages the batch holds (at least one).
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Always false: a batch without messages is refused.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Bytes that were copied or decoded into the batch's own buffer, rather
    /// than pointed at in the document.
    #[cfg(test)]
    pub fn copied_bytes(&self) -> usize {
        self.decoded.len()
    }

    /// The memory the batch holds for its keys and payloads, in bytes: the
    /// document while records point into it, and the decoded buffer's room (at
    /// most a quarter more than it fills); at most about twice what the records
    /// need.
    pub fn decoded_bytes(&self) -> usize {
        self.document.len() + self.decoded.capacity()
    }
}

/// Why a batch was refused: the HTTP status and the message of its
/// `{"error": …}` answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchRefusal {
    pub status: u16,
    pub message: String,
}

/// Refuses (415) a `Content-Encoding` this server cannot decode, so that a
/// handler can answer before reading the body.
pub fn check_content_encoding(content_encoding: Option<&str>) -> Result<(), BatchRefusal> {
    content::content_encoding(content_encoding)
        .map(|_| ())
        .map_err(content_refusal)
}

/// Decodes and checks a whole batch for a topic of `partitions` partitions.
/// `content_encoding` is the request's `Content-Encoding` header, if any.
pub fn decode_batch(
    body: Bytes,
    content_encoding: Option<&str>,
    partitions: u32,
) -> Result<DecodedBatch, BatchRefusal> {
    assert!(partitions > 0, "a topic has at least one partition");
    let encoding = content::content_encoding(content_encoding).map_err(content_refusal)?;
    let document = match content::decode_content(&body, encoding, BATCH_BODY_BYTES_MAX)
        .map_err(content_refusal)?
    {
        Cow::Borrowed(_) => body,
        Cow::Owned(decompressed) => Bytes::from(decompressed),
    };
    assert!(document.len() <= BATCH_BODY_BYTES_MAX);

    let Object(batch): Object<WireBatch<'_>> =
        serde_json::from_slice(&document).map_err(json_refusal)?;
    let messages = batch.messages.0;
    if messages.is_empty() {
        return Err(refusal(
            StatusCode::BAD_REQUEST,
            format!("a batch holds 1 to {BATCH_MESSAGES_MAX} messages; this one has none"),
        ));
    }
    let mut sink = Sink {
        document: &document,
        decoded: Vec::new(),
    };
    let mut records = Vec::with_capacity(messages.len());
    for (index, message) in messages.iter().enumerate() {
        let record = check_message(message, partitions, &mut sink)
            .map_err(|(status, message)| refusal(status, format!("message {index}: {message}")))?;
        records.push(record);
    }
    assert!(records.len() == messages.len() && records.len() <= BATCH_MESSAGES_MAX);
    let mut decoded = sink.decoded;
    drop(messages);
    // Room left over past a quarter goes back, so that the budget, which
    // counts the room, holds what the records need.
    if decoded.capacity() - decoded.len() > decoded.len() / 4 {
        decoded.shrink_to_fit();
    }
    let mut batch = DecodedBatch {
        document,
        decoded,
        records,
    };
    batch.let_go_of_a_sparse_document();
    Ok(batch)
}

/// Where [`check_message`] puts keys and payloads: text that is its own value
/// is pointed at where it sits in the document; decoded bytes are appended to
/// `decoded`, which is sized to the document the first time it is needed.
struct Sink<'d> {
    document: &'d [u8],
    decoded: Vec<u8>,
}

impl Sink<'_> {
    /// The span of `text`, a slice of the document.
    fn in_document(&self, text: &str) -> Span {
        let start = (text.as_ptr() as usize)
            .checked_sub(self.document.as_ptr() as usize)
            .expect("text of the document");
        assert!(
            start + text.len() <= self.document.len(),
            "text of the document"
        );
        Span::Document(start..start + text.len())
    }

    /// Runs `decode` appending to the decoded buffer, and returns its result and
    /// the span of what it appended.
    fn decode<R>(&mut self, decode: impl FnOnce(&mut Vec<u8>) -> R) -> (R, Span) {
        if self.decoded.capacity() == 0 {
            self.decoded.reserve_exact(self.document.len());
        }
        let start = self.decoded.len();
        let result = decode(&mut self.decoded);
        (result, Span::Decoded(start..self.decoded.len()))
    }
}

/// The document, as parsed: fields borrow from the (decompressed) body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireBatch<'a> {
    #[serde(borrow)]
    messages: Messages<'a>,
}

/// One message, as parsed. Payload, key and partition stay raw JSON text until
/// [`check_message`] reads them, so a string payload without escapes is copied
/// once, into its record, and a JSON-valued one is kept verbatim.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireMessage<'a> {
    #[serde(borrow)]
    payload: Option<&'a RawValue>,
    payload_encoding: Option<Cow<'a, str>>,
    #[serde(borrow)]
    key: Option<&'a RawValue>,
    key_encoding: Option<Cow<'a, str>>,
    #[serde(borrow)]
    partition: Option<&'a RawValue>,
}

/// The `messages` array, parsed element by element so that a failure names its
/// index and the array stops at one element past the limit.
struct Messages<'a>(Vec<WireMessage<'a>>);

/// Messages the parsed array has room for before it grows (a `WireMessage` is
/// about 100 bytes).
const MESSAGES_ROOM_FIRST: usize = 128;

/// Why the array had to stop: the message of the 400.
const TOO_MANY_MESSAGES: &str = "a batch holds at most 1000 messages";
const _: () = assert!(BATCH_MESSAGES_MAX == 1000, "update TOO_MANY_MESSAGES");

impl<'de: 'a, 'a> Deserialize<'de> for Messages<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(MessagesVisitor(PhantomData))
    }
}

struct MessagesVisitor<'a>(PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for MessagesVisitor<'a> {
    type Value = Messages<'a>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an array of messages")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error;
        // Room for a common batch up front; a larger one grows a few times.
        let mut messages = Vec::with_capacity(MESSAGES_ROOM_FIRST);
        // Bounded: one pass per element, and at most BATCH_MESSAGES_MAX + 1 passes.
        loop {
            let index = messages.len();
            if index == BATCH_MESSAGES_MAX {
                return match seq.next_element::<IgnoredAny>()? {
                    None => Ok(Messages(messages)),
                    Some(_) => Err(A::Error::custom(TOO_MANY_MESSAGES)),
                };
            }
            // The message's index prefixes only failures inside a message: a
            // document cut off or malformed between messages is the list's.
            match seq.next_element_seed(Indexed::<WireMessage<'a>>(index, PhantomData))? {
                Some(message) => messages.push(message),
                None => return Ok(Messages(messages)),
            }
        }
    }
}

/// A message (an [`Object`]) at index `.0` of the array: its failures carry
/// `message <i>: `.
struct Indexed<T>(usize, PhantomData<T>);

impl<'de, T: Deserialize<'de>> DeserializeSeed<'de> for Indexed<T> {
    type Value = T;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<T, D::Error> {
        use serde::de::Error;
        Object::<T>::deserialize(deserializer)
            .map(|Object(value)| value)
            .map_err(|e| D::Error::custom(format_args!("message {}: {e}", self.0)))
    }
}

/// A value that must be a JSON object. Derived `Deserialize` also accepts a
/// struct written as an array of its fields in order (`["p", null, "k"]`), which
/// strict JSON has no business accepting; this wrapper asks for a map only.
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(ObjectVisitor(PhantomData))
    }
}

struct ObjectVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
    type Value = Object<T>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map)).map(Object)
    }
}

/// A refusal of one message, before it is prefixed with the message's index.
type MessageRefusal = (StatusCode, String);

fn bad(message: impl Into<String>) -> MessageRefusal {
    (StatusCode::BAD_REQUEST, message.into())
}

fn too_large() -> MessageRefusal {
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        "message too large".to_string(),
    )
}

/// Checks one parsed message, placing its payload and key in `sink`.
fn check_message(
    message: &WireMessage<'_>,
    partitions: u32,
    sink: &mut Sink<'_>,
) -> Result<Spans, MessageRefusal> {
    let payload_base64 = base64_encoding("payload_encoding", &message.payload_encoding)?;
    let key_base64 = base64_encoding("key_encoding", &message.key_encoding)?;
    let payload = message_payload(message.payload, payload_base64, sink)?;
    let key = message
        .key
        .map(|raw| message_key(raw, key_base64, sink))
        .transpose()?
        .flatten();
    let partition = message
        .partition
        .map(|raw| message_partition(raw, partitions))
        .transpose()?;

    assert!(!payload.is_empty() && payload.len() <= PAYLOAD_BYTES_MAX);
    assert!(partition.is_none_or(|partition| partition < partitions));
    Ok(Spans {
        key,
        payload,
        partition,
    })
}

/// Whether an encoding field asks for base64: absent, `null` or `""` is no
/// encoding, `"base64"` is base64, anything else is refused.
fn base64_encoding(field: &str, value: &Option<Cow<'_, str>>) -> Result<bool, MessageRefusal> {
    match value.as_deref() {
        None | Some("") => Ok(false),
        Some("base64") => Ok(true),
        Some(other) => Err(bad(format!(
            "unsupported {field} {other:?}: the only encoding is \"base64\""
        ))),
    }
}

/// Places the decoded payload in `sink`, returning where it sits.
fn message_payload(
    raw: Option<&RawValue>,
    base64: bool,
    sink: &mut Sink<'_>,
) -> Result<Span, MessageRefusal> {
    let Some(raw) = raw else {
        return Err(bad("payload is required"));
    };
    let payload = if base64 {
        let text = json_string(raw, "payload")?
            .ok_or_else(|| bad("a base64 payload must be a JSON string"))?;
        let (decoded, span) = sink.decode(|out| decode_base64(&text, out));
        decoded.map_err(|e| bad(format!("payload is not valid base64: {e}")))?;
        span
    } else {
        // A JSON value other than a string is stored as its own text.
        json_string_span(raw, sink, "payload")?.unwrap_or_else(|| sink.in_document(raw.get()))
    };
    if payload.is_empty() {
        return Err(bad("empty message"));
    }
    if payload.len() > PAYLOAD_BYTES_MAX {
        return Err(too_large());
    }
    Ok(payload)
}

/// Standard, padded base64 as the reference's decoder (Go's standard
/// encoding) reads it, which its clients were written against: line breaks
/// are skipped (MIME-wrapped text), and the unused low bits of the last
/// symbol need not be zero.
fn decode_base64(text: &str, out: &mut Vec<u8>) -> Result<(), base64::DecodeError> {
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
    );
    if text.bytes().any(|b| b == b'\r' || b == b'\n') {
        let unwrapped: Vec<u8> = text.bytes().filter(|&b| b != b'\r' && b != b'\n').collect();
        return LENIENT.decode_vec(unwrapped, out);
    }
    LENIENT.decode_vec(text, out)
}

/// Places a message's decoded key in `sink`, returning where it sits: `None`
/// when it is empty (no key).
fn message_key(
    raw: &RawValue,
    base64: bool,
    sink: &mut Sink<'_>,
) -> Result<Option<Span>, MessageRefusal> {
    let key = if base64 {
        let text = json_string(raw, "key")?.ok_or_else(|| bad("key must be a JSON string"))?;
        let (decoded, span) = sink.decode(|out| decode_base64(&text, out));
        decoded.map_err(|e| bad(format!("key is not valid base64: {e}")))?;
        span
    } else {
        json_string_span(raw, sink, "key")?.ok_or_else(|| bad("key must be a JSON string"))?
    };
    if key.len() > KEY_BYTES_MAX {
        return Err(bad(format!("key too long: at most {KEY_BYTES_MAX} bytes")));
    }
    Ok((!key.is_empty()).then_some(key))
}

/// A message's partition: a JSON integer below `partitions`.
fn message_partition(raw: &RawValue, partitions: u32) -> Result<u32, MessageRefusal> {
    let text = raw.get();
    let (negative, digits) = match text.strip_prefix('-') {
        Some(digits) => (true, digits),
        None => (false, text),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(format!("invalid partition {text}: want an integer")));
    }
    let value = match negative {
        // JSON's -0 is the integer 0; every other negative is out of range.
        true if digits.bytes().all(|b| b == b'0') => Some(0),
        true => None,
        false => digits.parse::<u32>().ok(),
    };
    match value {
        Some(partition) if partition < partitions => Ok(partition),
        _ => Err(bad("partition out of range")),
    }
}

/// Where the text of a JSON string value sits once unescaped: in the document
/// when it has no escape, else decoded into `sink`; `None` (nothing placed)
/// when `raw` is not a string. The parser checks an escape's form but lets a
/// lone UTF-16 surrogate (`"\ud800"`) through, which is no character: that
/// string is refused, naming `field`.
fn json_string_span(
    raw: &RawValue,
    sink: &mut Sink<'_>,
    field: &str,
) -> Result<Option<Span>, MessageRefusal> {
    let Some(inner) = raw
        .get()
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
    else {
        return Ok(None);
    };
    if memchr::memchr(b'\\', inner.as_bytes()).is_none() {
        // The parser has validated the string: without escapes, the text
        // between the quotes is its value.
        return Ok(Some(sink.in_document(inner)));
    }
    match sink.decode(|out| super::json_text::unescape_into(inner, out)) {
        (Some(()), span) => Ok(Some(span)),
        (None, _) => Err(not_a_character(field)),
    }
}

fn not_a_character(field: &str) -> MessageRefusal {
    bad(format!(
        "{field} is not a valid JSON string: an escape names no character (a lone surrogate)"
    ))
}

/// The text of a JSON string value, unescaped; `None` when `raw` is not a
/// string. Borrows when the string has no escapes, which is the common case.
/// A string whose escapes name no character is refused, as in
/// [`json_string_span`].
fn json_string<'a>(raw: &'a RawValue, field: &str) -> Result<Option<Cow<'a, str>>, MessageRefusal> {
    let text = raw.get();
    let Some(inner) = text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) else {
        return Ok(None);
    };
    if !inner.contains('\\') {
        // The parser has validated the string: without escapes, the text between
        // the quotes is its value.
        return Ok(Some(Cow::Borrowed(inner)));
    }
    match super::json_text::unescape(inner) {
        Some(text) => Ok(Some(Cow::Owned(text))),
        None => Err(not_a_character(field)),
    }
}

fn refusal(status: StatusCode, message: String) -> BatchRefusal {
    BatchRefusal {
        status: status.as_u16(),
        message,
    }
}

fn content_refusal(refused: ContentRefusal) -> BatchRefusal {
    let (status, message) = refused.answer(BATCH_BODY_BYTES_MAX);
    refusal(status, message)
}

/// A parse failure as a 400. Failures inside a message already name it (and where
/// in the body it failed); the position serde_json appends again, of the array
/// that held it, is dropped from those.
fn json_refusal(e: serde_json::Error) -> BatchRefusal {
    let text = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    match text.strip_suffix(&position) {
        Some(ours) if ours.starts_with("message ") || ours == TOO_MANY_MESSAGES => {
            refusal(StatusCode::BAD_REQUEST, ours.to_string())
        }
        _ => refusal(StatusCode::BAD_REQUEST, format!("invalid batch: {text}")),
    }
}
