//! Topic routes: `POST /v1/topics`, `GET /v1/topics`, and `GET`, `PATCH`, `DELETE`
//! on `/v1/topics/{topic}`.
//!
//! Validation is `crate::meta`'s (the reference's rules); this module reads bodies,
//! proposes commands to the control plane and shapes the answers. Every change is
//! answered after the control plane published it, so the next request on any shard
//! sees it. A delete is answered after every shard closed the topic's logs and its
//! data directory was set aside; the directory is then removed in the background.
//!
//! Which cores: any shard; reads come from the shard's own metadata snapshot, stats
//! from the shards that own the partitions.

use std::rc::Rc;
use std::sync::Arc;

use hyper::{Request, Response, StatusCode};
use narad_shards::ids::{IncarnationId, PartitionId};

use super::response::{self, read_body, Body, REQUEST_BODY_BYTES_MAX};
use super::routes::Api;
use crate::broker::ops::ReadError;
use crate::broker::{layout, Shard};
use crate::meta::{self, Applied, Command, MetaError};

/// The most topics one page lists.
const LIST_LIMIT_MAX: usize = 1_000;
const LIST_LIMIT_DEFAULT: usize = 100;

pub fn meta_error(e: &MetaError) -> Response<Body> {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response::error(status, &e.to_string())
}

fn not_found(topic: &str) -> Response<Body> {
    response::error(StatusCode::NOT_FOUND, &format!("topic {topic:?} not found"))
}

pub async fn create<B>(api: &Api, shard: &Shard, request: Request<B>) -> Response<Body>
where
    B: hyper::body::Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let body = match read_body(
        request.into_body(),
        REQUEST_BODY_BYTES_MAX,
        api.body_read_timeout,
    )
    .await
    {
        Ok(body) => body,
        Err(refusal) => return refusal.into_response(),
    };
    // 64 random bits meet a live topic's id about never; a fresh draw if so.
    let id = loop {
        let id = IncarnationId::fresh();
        if !shard.meta.snapshot().topics.contains_id(id) {
            break id;
        }
    };
    let now_s = narad_io::rt::unix_ms() / 1000;
    let command = match meta::parse_create(&body, &api.topic_defaults, id, now_s) {
        Ok(command) => command,
        Err(e) => return meta_error(&e),
    };
    match shard.control.propose(command).await {
        Ok(Applied::Created(record)) => {
            tracing::info!(topic = %record.name, id = %record.id, partitions = record.partitions, "topic created");
            response::json(StatusCode::CREATED, &meta::topic_json(&record))
        }
        Ok(other) => unexpected(&other),
        Err(e) => meta_error(&e),
    }
}

fn unexpected(applied: &Applied) -> Response<Body> {
    tracing::error!(
        ?applied,
        "the control plane answered another change than asked"
    );
    response::error(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
}

pub fn list(shard: &Shard, query: Option<&str>) -> Response<Body> {
    let mut limit = LIST_LIMIT_DEFAULT;
    let mut token = String::new();
    let (mut limit_seen, mut token_seen) = (false, false);
    for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        // As on every other route: a parameter given twice is refused rather
        // than one of its values picked.
        let seen = match &*name {
            "limit" => &mut limit_seen,
            "page_token" => &mut token_seen,
            _ => continue,
        };
        if std::mem::replace(seen, true) {
            return response::error(
                StatusCode::BAD_REQUEST,
                &format!("{name} given more than once"),
            );
        }
        match &*name {
            "limit" => match value.parse::<i64>() {
                Ok(n) if n > 0 => limit = (n as usize).min(LIST_LIMIT_MAX),
                _ => {
                    return response::error(
                        StatusCode::BAD_REQUEST,
                        "limit must be a positive integer",
                    )
                }
            },
            "page_token" => token = value.into_owned(),
            _ => {}
        }
    }
    let snapshot = shard.meta.snapshot();
    let (topics, next) = snapshot.list(limit, &token);
    let topics: Vec<serde_json::Value> = topics.iter().map(|t| meta::topic_json(t)).collect();
    response::json(
        StatusCode::OK,
        &serde_json::json!({ "topics": topics, "next_page_token": next }),
    )
}

pub async fn get(shard: &Shard, topic: &str, query: Option<&str>) -> Response<Body> {
    if let Err(e) = meta::validate_topic_name(topic) {
        return meta_error(&e);
    }
    let mut only: Option<u32> = None;
    for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if name == "partition" {
            match super::decimal::<u32>(&value) {
                Some(p) if only.is_none() => only = Some(p),
                _ => {
                    return response::error(
                        StatusCode::BAD_REQUEST,
                        "partition must be one non-negative integer",
                    )
                }
            }
        }
    }
    let snapshot = shard.meta.snapshot();
    let Some(record) = snapshot.topics.get(topic).cloned() else {
        return not_found(topic);
    };
    if let Some(p) = only {
        if p >= record.partitions {
            return response::error(StatusCode::BAD_REQUEST, "partition out of range");
        }
    }
    let name: Arc<str> = Arc::from(topic);
    let asked: Vec<PartitionId> = match only {
        Some(p) => vec![PartitionId(p)],
        None => (0..record.partitions).map(PartitionId).collect(),
    };
    let stats = shard.stats(name, record.id, asked).await;
    // Deleted since the snapshot was read: the topic is gone, not partial.
    if stats
        .iter()
        .any(|(_, s)| matches!(s, Err(ReadError::NotFound)))
    {
        return not_found(topic);
    }
    let mut partial = false;
    let mut partition_stats = Vec::with_capacity(stats.len());
    for (partition, stat) in stats {
        partition_stats.push(match stat {
            Ok(s) => {
                let mut stats = serde_json::json!({
                    "index": partition.0,
                    "segments": s.segments,
                    "oldest_offset": s.oldest_offset.0,
                    "next_offset": s.next_offset.0,
                    "high_watermark": s.next_offset.0,
                    "size_bytes": s.size_bytes,
                    "owner_node": "local",
                    "status": "ok",
                });
                // Unix seconds, as `created_at`; left out while unknown.
                if let Some(ms) = s.oldest_segment_ms {
                    stats["oldest_segment_at"] = (ms / 1000).into();
                }
                stats
            }
            Err(e) => {
                partial = true;
                tracing::warn!(topic, partition = partition.0, error = ?e, "partition stats unavailable");
                serde_json::json!({
                    "index": partition.0,
                    "owner_node": "local",
                    "status": "owner_unavailable",
                    "owner_liveness": "unknown",
                })
            }
        });
    }
    let mut body = meta::topic_json(&record);
    if let Some(object) = body.as_object_mut() {
        object.insert("schema_version".into(), 0.into());
        object.insert("schema".into(), serde_json::Value::Null);
        object.insert("partition_stats".into(), partition_stats.into());
        object.insert("partial".into(), partial.into());
    }
    response::json(StatusCode::OK, &body)
}

pub async fn alter<B>(api: &Api, shard: &Shard, topic: &str, request: Request<B>) -> Response<Body>
where
    B: hyper::body::Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    if let Err(e) = meta::validate_topic_name(topic) {
        return meta_error(&e);
    }
    let body = match read_body(
        request.into_body(),
        REQUEST_BODY_BYTES_MAX,
        api.body_read_timeout,
    )
    .await
    {
        Ok(body) => body,
        Err(refusal) => return refusal.into_response(),
    };
    let snapshot = shard.meta.snapshot();
    let Some(current) = snapshot.topics.get(topic).cloned() else {
        return not_found(topic);
    };
    let command = match meta::parse_alter(&body, &current, &api.topic_defaults) {
        Ok(command) => command,
        Err(e) => return meta_error(&e),
    };
    match shard.control.propose(command).await {
        Ok(Applied::Altered { new, .. }) => {
            tracing::info!(topic, "topic altered");
            // Raised caps let consumers parked at the old ones take records.
            shard.kick_everywhere(&Arc::from(topic), new.id).await;
            response::json(StatusCode::OK, &meta::topic_json(&new))
        }
        Ok(other) => unexpected(&other),
        Err(e) => meta_error(&e),
    }
}

pub async fn delete(shard: &Rc<Shard>, topic: &str) -> Response<Body> {
    // The reference's delete has no 400: a name no topic can have is not found,
    // as for produce and consume.
    if meta::validate_topic_name(topic).is_err() {
        return not_found(topic);
    }
    let snapshot = shard.meta.snapshot();
    let Some(current) = snapshot.topics.get(topic).cloned() else {
        return not_found(topic);
    };
    let command = Command::DeleteTopic {
        name: topic.to_string(),
        id: current.id,
    };
    // The change and what follows it run on a task of their own: a client that
    // goes away while the change is applied must not leave the topic deleted
    // with its logs open, its data in place and its consumers' state kept.
    // The marker goes first: a node that stops between the delete and the
    // removal of the data finishes the removal at its next start.
    if let Err(e) = layout::mark_deleting(&shard.data_dir, topic, current.id) {
        tracing::error!(topic, error = %e, "cannot mark a topic's data for deletion");
        return response::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot mark the topic's data for deletion",
        );
    }
    let work = {
        let shard = shard.clone();
        let topic = topic.to_string();
        narad_io::rt::spawn_local(async move {
            let applied = shard.control.propose(command).await;
            match &applied {
                Ok(Applied::Deleted(record)) => {
                    crate::lifecycle::debug_panic_on_delete(&topic);
                    shard
                        .purge_everywhere(Arc::from(topic.as_str()), record.id)
                        .await;
                    if let Err(e) = layout::set_aside(&shard.data_dir, &topic, record.id) {
                        tracing::error!(topic, error = %e, "cannot set a deleted topic's data aside; it is removed at the next start");
                    }
                    tracing::info!(topic, id = %record.id, "topic deleted");
                }
                // A failed store may have made the delete durable all the
                // same (its bytes written, their sync failed): the marker stays,
                // so that the next start removes the data if the delete is
                // replayed, and only the marker if it is not.
                Err(MetaError::Io(e)) => {
                    tracing::warn!(topic, error = %e, "a delete's outcome is unknown until the next start; its data keeps the delete marker");
                }
                // The marker goes only while the topic is still this
                // incarnation: a delete that lost to another one (a retry)
                // must not take away the winner's marker.
                _ if shard
                    .meta
                    .snapshot()
                    .topics
                    .get(topic.as_str())
                    .is_some_and(|t| t.id == current.id) =>
                {
                    layout::unmark_deleting(&shard.data_dir, &topic, current.id)
                }
                _ => layout::drop_bare_marker(&shard.data_dir, &topic, current.id),
            }
            applied
        })
    };
    let Some(applied) = work.await else {
        return response::retry_later(StatusCode::SERVICE_UNAVAILABLE, "the node is stopping", "1");
    };
    match applied {
        Ok(Applied::Deleted(_)) => {
            let mut response = response::json(StatusCode::NO_CONTENT, &serde_json::Value::Null);
            *response.body_mut() = Body::default();
            response.headers_mut().remove(hyper::header::CONTENT_TYPE);
            response
        }
        Ok(other) => unexpected(&other),
        Err(e) => meta_error(&e),
    }
}

/// Maps a read failure of one partition to an answer.
pub fn read_error(topic: &str, partition: PartitionId, e: &ReadError) -> Response<Body> {
    match e {
        ReadError::NotFound => not_found(topic),
        ReadError::AgedOut { oldest } => response::error(
            StatusCode::GONE,
            &format!(
                "offset is below the oldest retained offset {} of partition {}",
                oldest.0, partition.0
            ),
        ),
        ReadError::Stopping => response::draining(),
        ReadError::Failed(why) => {
            tracing::error!(topic, partition = partition.0, error = %why, "partition read failed");
            response::error(StatusCode::INTERNAL_SERVER_ERROR, "partition read failed")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_refused_because_the_owner_stops_is_a_503_to_retry_and_a_failure_a_500() {
        let p = PartitionId(2);
        let stopping = read_error("t", p, &ReadError::Stopping);
        assert_eq!(stopping.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(stopping.headers()[hyper::header::RETRY_AFTER], "1");
        let failed = read_error("t", p, &ReadError::Failed("EIO".into()));
        assert_eq!(failed.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let aged = read_error(
            "t",
            p,
            &ReadError::AgedOut {
                oldest: narad_shards::ids::Offset(7),
            },
        );
        assert_eq!(aged.status(), StatusCode::GONE);
        assert_eq!(
            read_error("t", p, &ReadError::NotFound).status(),
            StatusCode::NOT_FOUND
        );
    }
}
