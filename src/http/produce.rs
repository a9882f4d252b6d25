//! Produce routes: `POST /v1/topics/{topic}/produce` and `.../produce/batch`.
//!
//! The accept stage of the produce path: validate, pick each record's partition
//! from this shard's metadata snapshot (explicit `partition`, else FNV-1a of the
//! key, else this shard's round-robin for the topic), stage into this shard's own
//! ingress WAL, and answer 202 once the group commit holding the record (the last
//! record, for a batch) is fsynced. Nothing here waits on a partition owner: the
//! dispatcher commits the records in the background.
//!
//! Errors: 400 bad input (nothing staged), 404 unknown topic, 413 too large, 415 bad
//! `Content-Encoding`, 500 when the WAL has latched after a disk failure (until
//! restart), 503 while stopping, when the node's batch body budget is full, or
//! while the disk is nearly full or has stopped answering.
//!
//! Which cores: the shard that accepted the connection; no cross-shard hop.

use bytes::Bytes;
use hyper::header::CONTENT_LENGTH;
use hyper::{Request, Response, StatusCode};
use narad_shards::ids::{DenseIdMap, PartitionId};
use narad_shards::lines::LineThrottle;
use narad_shards::wal::{IngressRecord, WalError};

use super::node::NodeState;
use super::produce_input::{self, BATCH_BODY_BYTES_MAX, PAYLOAD_BYTES_MAX};
use super::response::{self, read_body, Body};
use super::routes::Api;
use crate::broker::Shard;
use crate::meta::TopicRecord;

fn not_found(topic: &str) -> Response<Body> {
    response::error(StatusCode::NOT_FOUND, &format!("topic {topic:?} not found"))
}

fn accepted_empty() -> Response<Body> {
    let mut response = Response::new(Body::default());
    *response.status_mut() = StatusCode::ACCEPTED;
    response
}

/// The answer to a failed WAL append. Any failure but these three is the
/// WAL's latch, which makes the node unready (`/readyz`).
fn wal_error(node: &NodeState, topic: &str, e: &WalError) -> Response<Body> {
    match e {
        WalError::Invalid(why) => response::error(StatusCode::BAD_REQUEST, why),
        WalError::Closed => response::draining(),
        // No room for the WAL's next segment: nothing was staged.
        WalError::NoRoom { .. } => {
            if let Some(refused_since) =
                ROOM_REFUSALS.with(|lines| lines.due(std::time::Instant::now()))
            {
                tracing::warn!(topic, error = %e, refused_since, "produce refused for want of disk (logged at most every 10 s a shard)");
            }
            response::retry_later(StatusCode::SERVICE_UNAVAILABLE, &e.to_string(), "5")
        }
        other => {
            node.note_wal_failed();
            if let Some(refused_since) = refusal_log_due(std::time::Instant::now()) {
                tracing::error!(topic, error = %other, refused_since, "http server error: produce not accepted (logged at most every 10 s a shard; `refused_since` counts the others)");
            }
            response::error(StatusCode::INTERNAL_SERVER_ERROR, &other.to_string())
        }
    }
}

/// A latched WAL refuses every produce until the restart: one line a shard
/// every this long says so, rather than one a request.
const REFUSAL_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

thread_local! {
    /// This shard's lines for refused produces.
    static REFUSALS: LineThrottle = const { LineThrottle::new(REFUSAL_LOG_EVERY) };
    /// This shard's lines for produces its WAL refused for want of room.
    static ROOM_REFUSALS: LineThrottle = const { LineThrottle::new(REFUSAL_LOG_EVERY) };
}

/// Whether a refused produce at `now` gets a log line; if so, how many went
/// unlogged before it.
fn refusal_log_due(now: std::time::Instant) -> Option<u64> {
    REFUSALS.with(|lines| lines.due(now))
}

/// Picks the partition of one record.
fn choose(shard: &Shard, topic: &TopicRecord, explicit: Option<u32>, key: Option<&[u8]>) -> u32 {
    match (explicit, key) {
        (Some(p), _) => p,
        (None, Some(key)) => crate::partition::key_partition(key, topic.partitions),
        (None, None) => shard
            .round_robin
            .borrow_mut()
            .next(topic.id.0, topic.partitions),
    }
}

/// 429: the client has `http.max_produce_in_flight_per_identity` in flight.
/// 503 with `Retry-After: 1`: `http.max_batch_body_bytes_in_flight` is taken.
fn batch_budget_full() -> Response<Body> {
    response::retry_later(
        StatusCode::SERVICE_UNAVAILABLE,
        "batch produce budget full (http.max_batch_body_bytes_in_flight); retry shortly",
        "1",
    )
}

/// 429 with `Retry-After: 1`, so that a client's retry loop waits for its own
/// requests to finish instead of spinning on refusals.
fn produce_cap_full() -> Response<Body> {
    response::retry_later(
        StatusCode::TOO_MANY_REQUESTS,
        "too many produces in flight for this client (http.max_produce_in_flight_per_identity)",
        "1",
    )
}

/// 503 while the data directory's disk is nearly full (see
/// [`DiskGuard`](super::node::DiskGuard)); the client retries later.
fn disk_low() -> Response<Body> {
    response::retry_later(
        StatusCode::SERVICE_UNAVAILABLE,
        "the broker's disk is full or nearly full: produces are refused until space is freed",
        "5",
    )
}

/// 503 while this shard's ingress WAL has waited past
/// [`WAL_STALL_AFTER`](super::node::WAL_STALL_AFTER) for a disk that stopped
/// answering: a produce staged now would only wait with the others, its
/// client holding on with no answer; refused, it is retried once the disk
/// answers (or elsewhere).
fn wal_stalled() -> Response<Body> {
    response::retry_later(
        StatusCode::SERVICE_UNAVAILABLE,
        "the broker's disk has not completed a write for several seconds: produces are refused until it answers",
        "5",
    )
}

/// The 503 of a disk that cannot take produces now (nearly full, or not
/// answering), if it is so. A latched WAL answers its own 500 at the append:
/// a 503 would have the client retry what no retry on this shard can do
/// before a restart.
fn disk_refusal(api: &Api, shard: &Shard) -> Option<Response<Body>> {
    let low = api.node.disk_low();
    let stalled = shard.wal_stalled.get();
    if !(low || stalled) || shard.wal.is_latched() {
        return None;
    }
    Some(if low { disk_low() } else { wal_stalled() })
}

pub async fn single<B>(api: &Api, shard: &Shard, topic: &str, request: Request<B>) -> Response<Body>
where
    B: hyper::body::Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    crate::lifecycle::debug_panic_on_produce(topic);
    let snapshot = shard.meta.snapshot();
    let Some(record) = snapshot.topics.get(topic) else {
        return not_found(topic);
    };
    if let Some(refused) = disk_refusal(api, shard) {
        return refused;
    }
    let query = match produce_input::parse_produce_query(request.uri().query()) {
        Ok(query) => query,
        Err(message) => return response::error(StatusCode::BAD_REQUEST, &message),
    };
    if let Some(p) = query.partition {
        if let Err(message) = produce_input::check_partition(p, record.partitions) {
            return response::error(StatusCode::BAD_REQUEST, &message);
        }
    }
    let Some(_permit) = api.node.try_begin_produce(super::identity_of(&request), 1) else {
        return produce_cap_full();
    };
    let payload = match read_body(
        request.into_body(),
        PAYLOAD_BYTES_MAX,
        api.body_read_timeout,
    )
    .await
    {
        Ok(body) => body,
        Err(refusal) => return refusal.into_response(),
    };
    if payload.is_empty() {
        return response::error(StatusCode::BAD_REQUEST, "empty message");
    }
    // The topic may have been deleted, or deleted and created again, while the
    // body was read: the record goes to the topic as it is now, not to an
    // incarnation whose records the dispatcher would discard.
    let snapshot = shard.meta.snapshot();
    let Some(record) = snapshot.topics.get(topic) else {
        return not_found(topic);
    };
    if let Some(p) = query.partition {
        if let Err(message) = produce_input::check_partition(p, record.partitions) {
            return response::error(StatusCode::BAD_REQUEST, &message);
        }
    }
    let key = query.key.as_deref();
    let partition = choose(shard, record, query.partition, key);
    let ingress = IngressRecord {
        topic,
        incarnation: record.id,
        partition: PartitionId(partition),
        accept_time_ms: narad_io::rt::unix_ms(),
        key,
        payload: &payload,
    };
    match shard.wal.append(&ingress).await {
        Ok(_) => {
            let series = shard.traffic.partition(topic, record.id, ingress.partition);
            series.produced(1, payload.len() as u64);
            accepted_empty()
        }
        Err(e) => wal_error(&api.node, topic, &e),
    }
}

pub async fn batch<B>(api: &Api, shard: &Shard, topic: &str, request: Request<B>) -> Response<Body>
where
    B: hyper::body::Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    if !shard.meta.snapshot().topics.contains_key(topic) {
        return not_found(topic);
    }
    if let Some(refused) = disk_refusal(api, shard) {
        return refused;
    }
    if let Err(message) = produce_input::batch_query_check(request.uri().query()) {
        return response::error(StatusCode::BAD_REQUEST, &message);
    }
    let encoding = produce_input::content::request_encoding(request.headers());
    // An encoding this server cannot decode is refused before the body is read.
    if let Err(refusal) = produce_input::batch::check_content_encoding(encoding.as_deref()) {
        return response::error(StatusCode::UNSUPPORTED_MEDIA_TYPE, &refusal.message);
    }
    // The body's room in the node's budget is taken as the body arrives, so a
    // client that streams slowly, or not at all, holds only what it sent: idle
    // connections that declared large bodies cannot fill the budget. A
    // declared length that would not fit now is refused before it is sent.
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > BATCH_BODY_BYTES_MAX as u64) {
        return response::error(StatusCode::PAYLOAD_TOO_LARGE, "request body too large");
    }
    if declared.is_some_and(|n| !api.node.batch_bytes_would_fit(n)) {
        return batch_budget_full();
    }
    let Some(mut permit) = api.node.try_reserve_batch_bytes(0) else {
        return batch_budget_full();
    };
    let identity = super::identity_of(&request);
    let read = response::read_body_admitting(
        request.into_body(),
        BATCH_BODY_BYTES_MAX,
        api.body_read_timeout,
        |piece| permit.try_grow(piece as u64),
    )
    .await;
    let body: Bytes = match read {
        Ok(body) => body,
        Err(Some(refusal)) => return refusal.into_response(),
        Err(None) => return batch_budget_full(),
    };
    // As for a single produce: the topic as it is once the body is in.
    let snapshot = shard.meta.snapshot();
    let Some(record) = snapshot.topics.get(topic) else {
        return not_found(topic);
    };
    let records = match produce_input::decode_batch(body, encoding.as_deref(), record.partitions) {
        Ok(records) => records,
        Err(refusal) => {
            let status = StatusCode::from_u16(refusal.status).unwrap_or(StatusCode::BAD_REQUEST);
            return response::error(status, &refusal.message);
        }
    };
    // From here the budget holds the records (and the body they point into),
    // kept until they are durable: a compressed body decodes to more than it
    // took.
    let decoded = records.decoded_bytes() as u64;
    if !permit.try_resize(decoded) {
        return batch_budget_full();
    }
    let Some(_permit) = api.node.try_begin_produce(identity, records.len() as u64) else {
        return produce_cap_full();
    };
    let accept_time_ms = narad_io::rt::unix_ms();
    // The records with neither key nor partition take their round-robin turns
    // in one go.
    let turns = records
        .records()
        .filter(|r| r.partition.is_none() && r.key.is_none())
        .count() as u32;
    let first_turn = match turns {
        0 => 0,
        n => (shard.round_robin.borrow_mut()).take(record.id.0, record.partitions, n),
    };
    let mut turn = 0u32;
    let ingress: Vec<IngressRecord<'_>> = records
        .records()
        .map(|r| {
            let key = r.key;
            let partition = match (r.partition, key) {
                (None, None) => {
                    turn += 1;
                    (first_turn + turn - 1) % record.partitions
                }
                (explicit, key) => choose(shard, record, explicit, key),
            };
            IngressRecord {
                topic,
                incarnation: record.id,
                partition: PartitionId(partition),
                accept_time_ms,
                key,
                payload: r.payload,
            }
        })
        .collect();
    match shard.wal.append_many(&ingress).await {
        Ok(_) => {
            // One count per partition, not per record: a batch spans a few.
            let mut counted: DenseIdMap<PartitionId, (u64, u64)> = DenseIdMap::default();
            for r in &ingress {
                let (n, bytes) = counted.entry(r.partition).or_default();
                (*n, *bytes) = (*n + 1, *bytes + r.payload.len() as u64);
            }
            for (partition, (n, bytes)) in counted {
                let series = shard.traffic.partition(topic, record.id, partition);
                series.produced(n, bytes);
            }
            response::json(
                StatusCode::ACCEPTED,
                &serde_json::json!({ "accepted": ingress.len() }),
            )
        }
        Err(e) => wal_error(&api.node, topic, &e),
    }
}

#[cfg(test)]
mod tests {
    use super::wal_error;
    use crate::http::node::NodeState;
    use hyper::StatusCode;
    use narad_shards::wal::WalError;

    #[test]
    fn a_wal_without_room_for_its_next_segment_is_a_503_not_a_latch() {
        let node = NodeState::new(16);
        let needed_bytes = 128 << 20;
        let refused = wal_error(&node, "t", &WalError::NoRoom { needed_bytes });
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.headers()["retry-after"], "5");
        assert!(!node.wal_failed());
        let latched = wal_error(&node, "t", &WalError::Latched("No space left".into()));
        assert_eq!(latched.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(node.wal_failed());
    }
}
