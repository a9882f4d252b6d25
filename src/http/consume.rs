//! `GET /v1/topics/{topic}/consume` and `POST /v1/topics/{topic}/ack`.
//!
//! Consume: `wait` (a Go duration, clamped to `http.max_consume_wait`, which the
//! `X-Narad-Wait-Clamped` header then reports), `partition` (pinned), `offset`
//! (replay: needs `partition`; read-only, no lease), `max` (batch consume, 1 to
//! 100, needs `X-Narad-Client`, not with `offset`). A single consume answers the
//! Message object with its `receipt_handle`; a batch answers
//! `{"messages":[...]}`; nothing within the wait is 204.
//!
//! Ack: `receipt_handle` and `extend` (absent, `false` or empty: ack; `true` or `1`:
//! extend; `0`: nack; anything else 400) answered 204; without a handle in the
//! query, a JSON body `{"receipt_handles":[...]}` (1 to 100) answered 200 with
//! one `{status, error?}` per handle, in order.
//!
//! Which cores: the accepting shard; the flows in [`crate::consume::flow`] reach
//! the owner shards.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use narad_shards::ids::PartitionId;
use serde::{Deserialize, Serialize};

use super::produce_input::content;
use super::response::{self, read_body, Body, CLIENT_HEADER};
use super::routes::Api;
use crate::broker::Shard;
use crate::config::parse_duration;
use crate::consume::acks;
use crate::consume::flow::{self, ConsumeRequest};
use crate::consume::{handle, ConsumeError, Delivered, Settle, SettleError, BATCH_RECORDS_MAX};
use crate::metrics::{TopicSeries, WaitOutcome};

/// Encoded records one batch reply carries at most; the rest are released.
const BATCH_REPLY_BYTES_MAX: usize = 8 << 20;

/// Largest batch ack body, as the reference's ack route: 100 handles of up to
/// about 40 characters each fit many times over, even written with escapes.
const ACK_BODY_BYTES_MAX: usize = 64 << 10;

/// Handles one batch ack carries at most.
const ACK_HANDLES_MAX: usize = 100;

fn bad_request(message: &str) -> Response<Body> {
    response::error(StatusCode::BAD_REQUEST, message)
}

fn not_found(topic: &str) -> Response<Body> {
    response::error(StatusCode::NOT_FOUND, &format!("topic {topic:?} not found"))
}

/// The consume query, parsed.
#[derive(Debug, Default, PartialEq)]
struct ConsumeQuery {
    wait: Option<String>,
    partition: Option<u64>,
    offset: Option<u64>,
    max: Option<u64>,
}

fn parse_query(query: Option<&str>) -> Result<ConsumeQuery, String> {
    let mut parsed = ConsumeQuery::default();
    for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        let number = match &*name {
            "wait" => {
                if parsed.wait.replace(value.to_string()).is_some() {
                    return Err("wait given more than once".into());
                }
                continue;
            }
            "partition" => &mut parsed.partition,
            "offset" => &mut parsed.offset,
            "max" => &mut parsed.max,
            _ => continue,
        };
        if number.is_some() {
            return Err(format!("{name} given more than once"));
        }
        match super::decimal::<u64>(&value) {
            Some(n) => *number = Some(n),
            None => return Err(format!("invalid {name}: {value:?}")),
        }
    }
    Ok(parsed)
}

/// Formats a duration the way the wait parameter takes it.
fn go_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

pub async fn consume<B>(
    api: &Api,
    shard: &Rc<Shard>,
    topic: &str,
    request: &Request<B>,
) -> Response<Body> {
    let query = match parse_query(request.uri().query()) {
        Ok(query) => query,
        Err(message) => return bad_request(&message),
    };
    let snapshot = shard.meta.snapshot();
    let Some(record) = snapshot.topics.get(topic) else {
        return not_found(topic);
    };
    if let Some(p) = query.partition {
        if p >= record.partitions as u64 {
            return bad_request(&format!(
                "partition {p} out of range: topic {topic:?} has {} partitions",
                record.partitions
            ));
        }
    }
    // Checked before replay too, which never waits: a bad `wait` is a 400 on
    // every consume, and a clamped one is reported on every consume.
    let mut clamped = None;
    let wait = match query.wait.as_deref() {
        None | Some("") => Duration::ZERO,
        Some(text) => match parse_duration(text) {
            Ok(wait) if wait > api.consume_wait_max => {
                clamped = Some(api.consume_wait_max);
                api.consume_wait_max
            }
            Ok(wait) => wait,
            Err(e) => return bad_request(&format!("invalid wait {text:?}: {e}")),
        },
    };
    if let Some(offset) = query.offset {
        if query.max.is_some() {
            return bad_request("max cannot be combined with offset");
        }
        let Some(p) = query.partition else {
            return bad_request("offset needs partition");
        };
        // Boxed: held beside the consume below, its state would double the
        // size of every consume's future.
        let partition = PartitionId(p as u32);
        let reply = Box::pin(super::replay::replay(
            shard, topic, record, partition, offset,
        ))
        .await;
        return with_clamped(reply, clamped);
    }
    if let Some(max) = query.max {
        if !(1..=BATCH_RECORDS_MAX as u64).contains(&max) {
            return bad_request(&format!("max must be 1 to {BATCH_RECORDS_MAX}"));
        }
        if !request.headers().contains_key(CLIENT_HEADER) {
            return bad_request("max needs the X-Narad-Client header");
        }
    }
    if request.method() == Method::HEAD {
        // A HEAD is checked like a GET but never leases: its receipt handle would
        // go nowhere and the record would stay hidden for a visibility timeout.
        // It never waits either. Replay above answers it as a GET (read-only).
        return with_clamped(no_content(), clamped);
    }
    let identity = super::identity_of(request);
    let weight = query.max.unwrap_or(1);
    let Some(_permit) = api.node.try_begin_consume(identity, weight) else {
        // `Retry-After: 1`: a retry loop waits for the client's own
        // long-polls to end instead of spinning on refusals.
        return response::retry_later(
            StatusCode::TOO_MANY_REQUESTS,
            "too many consumes in flight for this client (http.max_consume_in_flight_per_identity)",
            "1",
        );
    };
    let consume_request = ConsumeRequest {
        partition: query.partition.map(|p| PartitionId(p as u32)),
        max: query.max.unwrap_or(1) as usize,
        wait,
    };
    let name: Arc<str> = Arc::from(topic);
    // Dropped with the request if the client goes away while the consume waits.
    let mut watch = WaitWatch {
        series: shard.traffic.topic(topic, record.id),
        started: Instant::now(),
        outcome: None,
        failed: false,
    };
    let no_wait = wait.is_zero();
    // Pinned here, so that the race below holds a pointer to it rather than
    // a second copy of its state.
    let mut taken = std::pin::pin!(flow::consume(shard, &name, record, consume_request));
    // A client that stops sending is not waited for: the consume is dropped as
    // it would be were the connection gone (what it took meanwhile goes back),
    // and a client that only shut its writing side reads a 204.
    let result = match super::peer_end_of(request) {
        Some(end) => {
            let ended = async {
                end.ended().await;
                None
            };
            match futures_lite::future::or(async { Some(taken.as_mut().await) }, ended).await {
                Some(result) => result,
                None => {
                    let mut response = no_content();
                    response.extensions_mut().insert(super::routes::ClientGone);
                    return response;
                }
            }
        }
        None => taken.await,
    };
    watch.failed = result.is_err();
    let response = match result {
        Err(e) => consume_error(topic, e),
        Ok(got) if got.is_empty() => {
            watch.series.empty();
            watch.outcome = Some(if no_wait {
                WaitOutcome::NoWait
            } else {
                WaitOutcome::Timeout
            });
            no_content()
        }
        Ok(got) => {
            watch.outcome = Some(if no_wait {
                WaitOutcome::NoWait
            } else {
                WaitOutcome::Hit
            });
            let count = |d: &Delivered| {
                let series = shard.traffic.partition(topic, record.id, d.partition);
                series.consumed(1, d.record.payload.len() as u64);
            };
            let (body, left_out) = if query.max.is_some() {
                batch_body(&name, got, count)
            } else {
                let mut got = got;
                let rest = got.split_off(1);
                let d = &got[0];
                count(d);
                let body = super::replay::message_json(
                    topic,
                    d.partition,
                    &d.record,
                    Some(&d.receipt_handle()),
                );
                (body, rest)
            };
            // What the reply leaves out goes back: this shard's own records
            // before the reply is written, so the next consume takes them at
            // once; other shards' in a task of their own, which a client that
            // hangs up cannot stop. Only what the reply carries is counted.
            if !left_out.is_empty() {
                shard.queues_release_detached(record.id, &name, left_out);
            }
            json_body(body)
        }
    };
    with_clamped(response, clamped)
}

/// `response` with `X-Narad-Wait-Clamped` when the wait was clamped to `max`.
fn with_clamped(mut response: Response<Body>, clamped: Option<Duration>) -> Response<Body> {
    if let Some(max) = clamped {
        if let Ok(value) = HeaderValue::from_str(&go_duration(max)) {
            response.headers_mut().insert("x-narad-wait-clamped", value);
        }
    }
    response
}

fn no_content() -> Response<Body> {
    let mut response = Response::new(Body::default());
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}

fn json_body(body: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(Body::new(Bytes::from(body)));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// `{"messages":[...]}` up to the reply bound, and the records past it, which the
/// caller releases.
fn batch_body(
    topic: &Arc<str>,
    got: Vec<Delivered>,
    mut carried: impl FnMut(&Delivered),
) -> (Vec<u8>, Vec<Delivered>) {
    // About what the reply takes (JSON payloads go in as they are), so that the
    // body is not grown and copied message by message.
    let estimate: usize = got
        .iter()
        .map(|d| d.record.payload.len() + d.record.key.as_ref().map_or(0, |k| k.len()) + 192)
        .sum();
    let mut body = Vec::with_capacity(estimate.min(BATCH_REPLY_BYTES_MAX) + 16);
    body.extend_from_slice(b"{\"messages\":[");
    let mut left_out = Vec::new();
    let writer = super::replay::MessageWriter::new(topic);
    let mut handle = String::with_capacity(crate::consume::handle::HANDLE_BYTES_MAX);
    for (i, d) in got.into_iter().enumerate() {
        // Past the first record that does not fit, none goes: the reply carries
        // records in the order taken, without a gap.
        if !left_out.is_empty() {
            left_out.push(d);
            continue;
        }
        let before = body.len();
        if i > 0 {
            body.push(b',');
        }
        d.receipt_handle_into(&mut handle);
        writer.write(&mut body, d.partition, &d.record, Some(&handle));
        // The first message always goes; the closing `]}` must fit too.
        if i > 0 && body.len() + 2 > BATCH_REPLY_BYTES_MAX {
            body.truncate(before);
            left_out.push(d);
        } else {
            carried(&d);
        }
    }
    body.extend_from_slice(b"]}");
    (body, left_out)
}

/// Records one consume in `narad_consume_wait_seconds` when dropped: with the
/// outcome set once answered, or as cancelled if the request went away first.
struct WaitWatch {
    series: Rc<TopicSeries>,
    started: Instant,
    outcome: Option<WaitOutcome>,
    /// The consume failed (404, 500): it ended neither way the reference's
    /// outcomes name, and is not observed (the request counters have it).
    failed: bool,
}

impl Drop for WaitWatch {
    fn drop(&mut self) {
        if self.failed {
            return;
        }
        let outcome = self.outcome.unwrap_or(WaitOutcome::Cancelled);
        self.series
            .waited(outcome, self.started.elapsed().as_secs_f64());
    }
}

/// What the `extend` parameter asks for.
fn parse_extend(value: Option<&str>) -> Result<Settle, String> {
    match value {
        None | Some("") | Some("false") => Ok(Settle::Ack),
        Some("true") | Some("1") => Ok(Settle::Extend),
        Some("0") => Ok(Settle::Nack),
        Some(other) => Err(format!(
            "invalid extend {other:?}: want true or 1 (extend), 0 (nack), or false (ack)"
        )),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchAck<'a> {
    #[serde(borrow)]
    receipt_handles: Vec<Handle<'a>>,
}

/// A receipt handle's text, borrowed from the body unless it holds an escape
/// (serde borrows a `Cow` only as a field of its own, not inside a `Vec`).
#[derive(Deserialize)]
#[serde(transparent)]
struct Handle<'a>(#[serde(borrow)] Cow<'a, str>);

pub async fn ack<B>(
    api: &Api,
    shard: &Rc<Shard>,
    topic: &str,
    request: Request<B>,
) -> Response<Body>
where
    B: hyper::body::Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let (mut handle_text, mut extend) = (None, None);
    for (name, value) in form_urlencoded::parse(request.uri().query().unwrap_or("").as_bytes()) {
        let slot = match &*name {
            "receipt_handle" => &mut handle_text,
            "extend" => &mut extend,
            _ => continue,
        };
        if slot.replace(value.to_string()).is_some() {
            return bad_request(&format!("{name} given more than once"));
        }
    }
    let settle = match parse_extend(extend.as_deref()) {
        Ok(settle) => settle,
        Err(message) => return bad_request(&message),
    };
    let snapshot = shard.meta.snapshot();
    let Some(record) = snapshot.topics.get(topic) else {
        return not_found(topic);
    };
    let name: Arc<str> = Arc::from(topic);
    let Some(text) = handle_text else {
        return batch_ack(api, shard, &name, record, settle, request).await;
    };
    let handle = match handle::parse(&text) {
        Ok(handle) => handle,
        Err(message) => return bad_request(&message),
    };
    // A body beside the query's handle would be ignored, and the leases it names
    // left to lapse: refused, and nothing is settled.
    match has_body(request, api).await {
        Ok(false) => {}
        Ok(true) => return bad_request(HANDLE_IN_BOTH),
        Err(refusal) => return refusal,
    }
    match acks::settle(shard, &name, record, handle, settle).await {
        Ok(()) => {
            count_settle(topic, settle, 1);
            no_content()
        }
        Err(e) => {
            let (status, message) = settle_error(topic, &e);
            if status == StatusCode::SERVICE_UNAVAILABLE {
                // The owner shard stopped: the node is stopping.
                response::retry_later(status, &message, "1")
            } else {
                response::error(status, &message)
            }
        }
    }
}

const HANDLE_IN_BOTH: &str =
    "give one receipt_handle in the query or receipt_handles in the body, not both";

/// Whether a single ack came with a body. A request without one (no length, or
/// a length of 0) is answered without reading; any other is read up to the
/// batch cap.
async fn has_body<B>(request: Request<B>, api: &Api) -> Result<bool, Response<Body>>
where
    B: hyper::body::Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    if hyper::body::Body::size_hint(request.body()).exact() == Some(0) {
        return Ok(false);
    }
    match read_body(
        request.into_body(),
        ACK_BODY_BYTES_MAX,
        api.body_read_timeout,
    )
    .await
    {
        Ok(body) => Ok(!body.is_empty()),
        Err(refusal) => Err(refusal.into_response()),
    }
}

/// Counts extends and nacks by topic (acks are the consumed messages).
fn count_settle(topic: &str, settle: Settle, n: u64) {
    let name = match settle {
        Settle::Ack => return,
        Settle::Extend => "narad_ack_extended_total",
        Settle::Nack => "narad_nack_total",
    };
    ::metrics::counter!(name, "topic" => topic.to_string()).increment(n);
}

fn settle_error(topic: &str, e: &SettleError) -> (StatusCode, String) {
    match e {
        SettleError::Stale => (
            StatusCode::GONE,
            "receipt handle is no longer valid: the lease lapsed, was settled, or the message was redelivered".into(),
        ),
        SettleError::NotFound => (StatusCode::NOT_FOUND, format!("topic {topic:?} not found")),
        SettleError::Unavailable(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the partition's owner is unavailable: {why}"),
        ),
        SettleError::NoAnswer => (
            StatusCode::BAD_GATEWAY,
            "the partition's owner did not answer in time; retry (if it landed, the retry answers 410)".into(),
        ),
    }
}

fn content_refusal(refused: &content::ContentRefusal) -> Response<Body> {
    let (status, message) = refused.answer(ACK_BODY_BYTES_MAX);
    response::error(status, &message)
}

async fn batch_ack<B>(
    api: &Api,
    shard: &Rc<Shard>,
    topic: &Arc<str>,
    record: &crate::meta::TopicRecord,
    settle: Settle,
    request: Request<B>,
) -> Response<Body>
where
    B: hyper::body::Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    // A compressed body is decoded as a batch produce's is; an encoding this
    // server cannot decode is refused before the body is read.
    let encoding = content::request_encoding(request.headers());
    let encoding = match content::content_encoding(encoding.as_deref()) {
        Ok(encoding) => encoding,
        Err(refused) => return content_refusal(&refused),
    };
    let body = match read_body(
        request.into_body(),
        ACK_BODY_BYTES_MAX,
        api.body_read_timeout,
    )
    .await
    {
        Ok(body) => body,
        Err(refusal) => return refusal.into_response(),
    };
    let body = match content::decode_content(&body, encoding, ACK_BODY_BYTES_MAX) {
        Ok(body) => body,
        Err(refused) => return content_refusal(&refused),
    };
    if body.is_empty() {
        return bad_request("receipt_handle is missing: give it in the query, or a body {\"receipt_handles\":[...]}");
    }
    let batch: BatchAck<'_> = match serde_json::from_slice(&body) {
        Ok(batch) => batch,
        Err(e) => return bad_request(&format!("invalid JSON body: {e}")),
    };
    let count = batch.receipt_handles.len();
    if !(1..=ACK_HANDLES_MAX).contains(&count) {
        return bad_request(&format!(
            "receipt_handles must hold 1 to {ACK_HANDLES_MAX} handles"
        ));
    }
    // Handles this shard owns are settled on the spot; the others go to their
    // owners as one op per owner (per 64 handles), all owners at once, so a
    // batch pays one mesh round trip rather than one op per handle. Handles
    // for one owner reach it in batch order.
    let mut outcomes = Vec::with_capacity(count);
    let mut remote: BTreeMap<usize, Vec<(usize, handle::Handle)>> = BTreeMap::new();
    for text in &batch.receipt_handles {
        outcomes.push(match handle::parse(&text.0) {
            Err(message) => Err((StatusCode::BAD_REQUEST, message)),
            Ok(h) => match acks::settle_here(shard, record, h, settle) {
                Some(outcome) => outcome.map_err(|e| settle_error(topic, &e)),
                None => {
                    let owner = shard.owner_of(record.id, h.partition);
                    remote.entry(owner).or_default().push((outcomes.len(), h));
                    Ok(())
                }
            },
        });
    }
    let settled = settle_all(remote.iter().map(|(&owner, handles)| {
        let items = handles
            .iter()
            .map(|&(_, h)| acks::settle_item(topic, record, h, settle))
            .collect();
        crate::consume::acks::send_many(shard, owner, items)
    }))
    .await;
    for (handles, answers) in remote.values().zip(settled) {
        for (&(at, _), outcome) in handles.iter().zip(answers) {
            outcomes[at] = outcome.map_err(|e| settle_error(topic, &e));
        }
    }
    let results = outcomes
        .into_iter()
        .map(|outcome| match outcome {
            Ok(()) => {
                count_settle(topic, settle, 1);
                AckResult {
                    status: 204,
                    error: None,
                }
            }
            Err((status, error)) => AckResult {
                status: status.as_u16(),
                error: Some(error),
            },
        })
        .collect();
    response::json(StatusCode::OK, &AckResults { results })
}

/// Runs every future to completion concurrently and returns their outputs in
/// order. Each is polled first in the order given.
async fn settle_all<F: std::future::Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<std::pin::Pin<Box<F>>> = futures.map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut waiting = false;
        for (future, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => waiting = true,
                }
            }
        }
        if waiting {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|output| output.expect("every future finished"))
        .collect()
}

/// The answer to a batch ack, one result per handle in order.
#[derive(Serialize)]
struct AckResults {
    results: Vec<AckResult>,
}

#[derive(Serialize)]
struct AckResult {
    status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// The answer to a consume that failed, with the reference's statuses: 404
/// for a topic gone, 503 (retry) for an owner shard stopping, 502 (retry) for
/// one that did not answer in time, 500 for a partition that cannot be read.
fn consume_error(topic: &str, e: ConsumeError) -> Response<Body> {
    match e {
        ConsumeError::NotFound => not_found(topic),
        ConsumeError::Failed(why) => {
            tracing::error!(topic, error = %why, "consume failed");
            response::error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "consume failed: partition read failed",
            )
        }
        ConsumeError::Unavailable(why) => {
            tracing::warn!(topic, error = %why, "consume refused: owner unavailable");
            response::retry_later(
                StatusCode::SERVICE_UNAVAILABLE,
                "the partition's owner is stopping; retry",
                "1",
            )
        }
        ConsumeError::NoAnswer(why) => {
            tracing::warn!(topic, error = %why, "consume failed: owner silent");
            response::error(
                StatusCode::BAD_GATEWAY,
                "the partition's owner did not answer in time; retry",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed consume answers with the reference's status for its cause,
    /// and the two an owner shard causes say to retry.
    #[test]
    fn a_failed_consume_answers_with_its_causes_status() {
        let cases = [
            (ConsumeError::NotFound, StatusCode::NOT_FOUND, None),
            (
                ConsumeError::Failed("read".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
                None,
            ),
            (
                ConsumeError::Unavailable("stopping".into()),
                StatusCode::SERVICE_UNAVAILABLE,
                Some("1"),
            ),
            (
                ConsumeError::NoAnswer("silent".into()),
                StatusCode::BAD_GATEWAY,
                None,
            ),
        ];
        for (error, status, retry_after) in cases {
            let response = consume_error("t", error.clone());
            assert_eq!(response.status(), status, "{error:?}");
            assert_eq!(
                response
                    .headers()
                    .get(hyper::header::RETRY_AFTER)
                    .map(|v| v.to_str().unwrap()),
                retry_after,
                "{error:?}"
            );
        }
    }

    #[test]
    fn batch_ack_handles_borrow_from_the_body_unless_escaped() {
        let body = br#"{"receipt_handles":["0:1:abc","0:2:\u0064ef"]}"#;
        let batch: BatchAck<'_> = serde_json::from_slice(body).unwrap();
        assert!(matches!(
            batch.receipt_handles[0].0,
            Cow::Borrowed("0:1:abc")
        ));
        assert_eq!(batch.receipt_handles[1].0, "0:2:def");
    }

    #[test]
    fn consume_queries_parse_strictly() {
        let q = parse_query(Some("wait=5s&partition=2&max=10&other=x")).unwrap();
        assert_eq!(q.wait.as_deref(), Some("5s"));
        assert_eq!((q.partition, q.max, q.offset), (Some(2), Some(10), None));
        assert!(parse_query(Some("max=1&max=2")).is_err());
        assert!(parse_query(Some("wait=1s&wait=2s")).is_err());
        assert!(parse_query(Some("partition=-1")).is_err());
        assert!(parse_query(Some("offset=x")).is_err());
        // A sign or a space is refused, as the produce route refuses it.
        for bad in ["partition=%2B1", "offset=+0", "max=%201", "partition="] {
            assert!(parse_query(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn extend_values_follow_the_reference() {
        assert_eq!(parse_extend(None), Ok(Settle::Ack));
        assert_eq!(parse_extend(Some("")), Ok(Settle::Ack));
        assert_eq!(parse_extend(Some("false")), Ok(Settle::Ack));
        assert_eq!(parse_extend(Some("true")), Ok(Settle::Extend));
        assert_eq!(parse_extend(Some("1")), Ok(Settle::Extend));
        assert_eq!(parse_extend(Some("0")), Ok(Settle::Nack));
        for bad in ["yes", "2", "TRUE", "no"] {
            assert!(parse_extend(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_batch_reply_stops_at_the_first_record_past_its_bound() {
        let delivered = |offset: u64, size: usize| Delivered {
            partition: PartitionId(0),
            nonce: 1,
            record: narad_shards::log::Record {
                offset: narad_shards::ids::Offset(offset),
                key: None,
                commit_time_ms: 0,
                payload: Bytes::from(vec![b'a'; size]),
            },
        };
        let topic: Arc<str> = "t".into();
        let mut carried = Vec::new();
        let got = vec![
            delivered(0, 3 << 20),
            delivered(1, 6 << 20),
            delivered(2, 10),
        ];
        let (body, left_out) = batch_body(&topic, got, |d| carried.push(d.record.offset.0));
        assert_eq!(carried, vec![0]);
        let left: Vec<u64> = left_out.iter().map(|d| d.record.offset.0).collect();
        assert_eq!(left, vec![1, 2]);
        let reply: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(reply["messages"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn clamped_waits_are_reported_as_go_durations() {
        assert_eq!(go_duration(Duration::from_secs(10)), "10s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1500ms");
    }
}
