//! Decoding what a produce request asks for, before anything is staged.
//!
//! Two routes feed the ingress: `POST /v1/topics/{topic}/produce` (one message:
//! the raw body, with `key` and `partition` in the query string) and
//! `POST /v1/topics/{topic}/produce/batch` (a JSON document of up to
//! [`BATCH_MESSAGES_MAX`] messages, optionally zstd or gzip compressed). This
//! module turns the bytes and strings of such a request into checked values, or
//! into the refusal the reference gives. It does no I/O and keeps no state, so
//! every rule is a unit test, and the handlers only glue it to hyper and the WAL.
//!
//! Which cores: every shard, on the request's own core.
//!
//! Invariants of what it returns: a payload is 1 byte to [`PAYLOAD_BYTES_MAX`]; a
//! key is 1 byte to [`KEY_BYTES_MAX`] (an empty key means no key, see
//! [`query`]); a batch partition is below the topic's partition count; a batch
//! is all or nothing, each refusal naming the 0-based index of the first bad
//! message (`message <i>: …`).
//!
//! Map:
//! - [`query`]: the single produce's query string and payload size, and the
//!   batch's query check.
//! - [`content`]: the batch body's `Content-Encoding`, decompressed under a hard
//!   cap.
//! - [`batch`]: the batch document: strict JSON, payload and key encodings, the
//!   per-message rules.
//! - `batch_tests`: the batch rules end to end, compressed bodies included.

pub mod batch;
pub mod content;
pub(crate) mod json_text;
pub mod query;

#[cfg(test)]
mod batch_tests;

pub use batch::{decode_batch, BatchRecord, BatchRefusal};
pub use query::{
    batch_query_check, check_partition, check_single_payload, parse_produce_query, ProduceQuery,
};

use super::response::REQUEST_BODY_BYTES_MAX;

/// The largest payload of one message, single or in a batch (1 MiB). A single
/// produce's body is its payload, so this is also that route's body cap.
pub const PAYLOAD_BYTES_MAX: usize = 1 << 20;

/// The largest batch body (16 MiB), before and after decompression.
pub const BATCH_BODY_BYTES_MAX: usize = 16 << 20;

/// The most messages one batch may carry (from v3.2 of the reference).
pub const BATCH_MESSAGES_MAX: usize = 1000;

/// The longest key (64 KiB, after percent- or base64-decoding). The reference
/// names no key limit, but its single produce cannot carry a longer one: the key
/// rides in the query string, and request headers past 64 KiB are refused (431).
/// The same cap on batch keys keeps one key from passing for a whole payload.
pub const KEY_BYTES_MAX: usize = 64 << 10;

const _: () = assert!(PAYLOAD_BYTES_MAX == REQUEST_BODY_BYTES_MAX);
const _: () = assert!(PAYLOAD_BYTES_MAX <= BATCH_BODY_BYTES_MAX);
const _: () = assert!(KEY_BYTES_MAX <= PAYLOAD_BYTES_MAX);
const _: () = assert!(BATCH_MESSAGES_MAX > 0);
