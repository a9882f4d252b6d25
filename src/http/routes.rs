//! The API's route table and the request pipeline every request goes through:
//! stopping check, routing (404/405), the 415 guard, then the endpoint.
//!
//! `GET /healthz` answers 200 as soon as the listener is up, and `GET /readyz` 200
//! once every shard has recovered its storage. The `/v1` endpoints need this
//! shard's broker, which exists once its storage is recovered; before that they
//! answer 503. Handlers live in [`super::topics`], [`super::produce`],
//! [`super::consume`] and [`super::replay`].
//!
//! Which cores: every shard builds its own [`Routes`] and serves its own
//! connections with it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use hyper::{Method, Request, Response, StatusCode};

use super::node::NodeState;
use super::response::{self, Body};
use super::router::{Match, Router};
use crate::broker::Shard;
use crate::config::TopicDefaults;

/// What a request asks for, once routed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Healthz,
    Readyz,
    TopicCreate,
    TopicList,
    TopicGet,
    TopicAlter,
    TopicDelete,
    Produce,
    ProduceBatch,
    Consume,
    Ack,
    Metrics,
    /// A route of the reference for a feature this version lacks: 501 naming
    /// it, rather than a 404 a client could take for "already gone".
    NotSupported(Feature),
}

/// The reference's features whose routes this version answers 501.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Feature {
    Users,
    Cluster,
    Schemas,
    Children,
}

impl Feature {
    /// The routes of the feature, as the reference has them.
    const ROUTES: [(Method, &'static str, Feature); 16] = [
        (Method::GET, "/v1/users", Feature::Users),
        (Method::POST, "/v1/users", Feature::Users),
        (Method::GET, "/v1/users/{user}", Feature::Users),
        (Method::DELETE, "/v1/users/{user}", Feature::Users),
        (Method::PUT, "/v1/users/{user}/grants", Feature::Users),
        (Method::PUT, "/v1/users/{user}/password", Feature::Users),
        (Method::GET, "/v1/cluster/members", Feature::Cluster),
        (
            Method::POST,
            "/v1/cluster/members/{id}/decommission",
            Feature::Cluster,
        ),
        (
            Method::DELETE,
            "/v1/cluster/members/{id}/decommission",
            Feature::Cluster,
        ),
        (
            Method::POST,
            "/v1/cluster/members/{id}/forget",
            Feature::Cluster,
        ),
        (Method::GET, "/v1/cluster/moves", Feature::Cluster),
        (
            Method::POST,
            "/v1/cluster/moves/{topic}/{partition}/abort",
            Feature::Cluster,
        ),
        (Method::GET, "/v1/topics/{topic}/schema", Feature::Schemas),
        (
            Method::GET,
            "/v1/topics/{topic}/children",
            Feature::Children,
        ),
        (
            Method::POST,
            "/v1/topics/{topic}/children",
            Feature::Children,
        ),
        (
            Method::DELETE,
            "/v1/topics/{topic}/children/{child}",
            Feature::Children,
        ),
    ];

    fn pattern(self) -> &'static str {
        match self {
            Feature::Users => "/v1/users",
            Feature::Cluster => "/v1/cluster",
            Feature::Schemas => "/v1/topics/{topic}/schema",
            Feature::Children => "/v1/topics/{topic}/children",
        }
    }

    fn refusal(self) -> &'static str {
        match self {
            Feature::Users => {
                "users and grants are not supported by this version (it serves with security off)"
            }
            Feature::Cluster => {
                "clusters are not supported by this version (it runs as a single node)"
            }
            Feature::Schemas => "topic schemas are not supported by this version",
            Feature::Children => "fan-out child topics are not supported by this version",
        }
    }
}

impl Endpoint {
    /// `/healthz` or `/readyz`, whose answers report the node's state.
    fn is_probe(self) -> bool {
        matches!(self, Endpoint::Healthz | Endpoint::Readyz)
    }

    /// Whether a 5xx of this route is a server error: not a probe's 503 (the
    /// node's state, answered as designed) nor the 501 of a feature this
    /// version lacks (the client's choice of route).
    fn fails_as_server(self) -> bool {
        !self.is_probe() && !matches!(self, Endpoint::NotSupported(_))
    }

    /// The route pattern, the `route` label of the HTTP metrics.
    pub fn pattern(self) -> &'static str {
        match self {
            Endpoint::Healthz => "/healthz",
            Endpoint::Readyz => "/readyz",
            Endpoint::Metrics => "/metrics",
            Endpoint::TopicCreate | Endpoint::TopicList => "/v1/topics",
            Endpoint::TopicGet | Endpoint::TopicAlter | Endpoint::TopicDelete => {
                "/v1/topics/{topic}"
            }
            Endpoint::Produce => "/v1/topics/{topic}/produce",
            Endpoint::ProduceBatch => "/v1/topics/{topic}/produce/batch",
            Endpoint::Consume => "/v1/topics/{topic}/consume",
            Endpoint::Ack => "/v1/topics/{topic}/ack",
            Endpoint::NotSupported(feature) => feature.pattern(),
        }
    }
}

/// What the `/v1` handlers need besides the request.
pub struct Api {
    pub node: Arc<NodeState>,
    pub topic_defaults: TopicDefaults,
    /// `http.max_consume_wait`: longer waits are clamped to it.
    pub consume_wait_max: std::time::Duration,
    /// `http.read_timeout`: a request body must arrive whole within it.
    pub body_read_timeout: std::time::Duration,
    /// Set once this shard's storage is recovered.
    pub broker: RefCell<Option<Rc<Shard>>>,
}

/// One shard's request handler.
pub struct Routes {
    router: Router<Endpoint>,
    api: Rc<Api>,
    /// The HTTP series this shard has recorded into, by (route, method, status):
    /// looking a series up by its labels builds and hashes a key, which cost
    /// about as much as answering `GET /healthz` itself.
    series: RefCell<HashMap<SeriesLabels, Rc<HttpSeries>>>,
    /// `narad_http_requests_in_flight`: this shard's part (the shards' sum is the
    /// node's), registered on first use.
    in_flight: std::cell::OnceCell<::metrics::Gauge>,
}

/// A path segment as the name it spells: percent-decoded, as every route reads
/// it (`t%31` is topic `t1`). Bytes that decode to no UTF-8 stay as they came,
/// and name no topic.
fn path_segment(raw: &str) -> String {
    if !raw.contains('%') {
        return raw.to_string();
    }
    match percent_encoding::percent_decode_str(raw).decode_utf8() {
        Ok(decoded) => decoded.into_owned(),
        Err(_) => raw.to_string(),
    }
}

/// A request whose future was dropped before it answered, because its client
/// went away (a long-poll it gave up on, a body it never finished): counted with
/// status 499, as proxies log it, so the request totals and durations see it.
struct Unanswered<'r> {
    routes: &'r Routes,
    labels: (Option<Endpoint>, &'static str),
    started: std::time::Instant,
    bytes_in: u64,
    armed: bool,
}

/// The status a request whose client went away is counted under.
const CLIENT_GONE: u16 = 499;

/// Marks an answer given because the client stopped sending while its request
/// waited (a long-poll ended early): written for a client that only shut its
/// writing side, and counted with status 499 like a request whose client went
/// away.
#[derive(Clone, Copy, Debug)]
pub struct ClientGone;

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let status = StatusCode::from_u16(CLIENT_GONE).expect("a valid status code");
        let series = self.routes.series((self.labels.0, self.labels.1, status));
        series.requests.increment(1);
        series.duration.record(self.started.elapsed().as_secs_f64());
        series.bytes_in.increment(self.bytes_in);
    }
}

/// The labels of one request's HTTP series; no endpoint is the `unmatched` route.
type SeriesLabels = (Option<Endpoint>, &'static str, u16);

/// The handles of one (route, method, status)'s series.
struct HttpSeries {
    requests: ::metrics::Counter,
    duration: ::metrics::Histogram,
    /// `narad_errors_total{component="http",kind="5xx"}` for a 5xx status, but
    /// for the health and readiness probes.
    server_errors: Option<::metrics::Counter>,
    /// `narad_http_request_bytes_in_total` and `_response_bytes_out_total` of the
    /// route.
    bytes_in: ::metrics::Counter,
    bytes_out: ::metrics::Counter,
}

/// Counts a request in `narad_http_requests_in_flight` until dropped, whether it
/// was answered or its client went away.
struct InFlight(::metrics::Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// Where routing sent a request.
enum Routed {
    Found {
        endpoint: Endpoint,
        /// The `{topic}` of the path, if the route has one.
        topic: Option<String>,
    },
    MethodNotAllowed {
        allow: String,
    },
    NotFound,
}

impl Routes {
    pub fn new(api: Rc<Api>) -> Self {
        let mut router = Router::new();
        router
            .add(Method::GET, "/healthz", Endpoint::Healthz)
            .add(Method::GET, "/readyz", Endpoint::Readyz)
            .add(Method::GET, "/metrics", Endpoint::Metrics)
            .add(Method::POST, "/v1/topics", Endpoint::TopicCreate)
            .add(Method::GET, "/v1/topics", Endpoint::TopicList)
            .add(Method::GET, "/v1/topics/{topic}", Endpoint::TopicGet)
            .add(Method::PATCH, "/v1/topics/{topic}", Endpoint::TopicAlter)
            .add(Method::DELETE, "/v1/topics/{topic}", Endpoint::TopicDelete)
            .add(
                Method::POST,
                "/v1/topics/{topic}/produce",
                Endpoint::Produce,
            )
            .add(
                Method::POST,
                "/v1/topics/{topic}/produce/batch",
                Endpoint::ProduceBatch,
            )
            .add(Method::GET, "/v1/topics/{topic}/consume", Endpoint::Consume)
            .add(Method::POST, "/v1/topics/{topic}/ack", Endpoint::Ack);
        for (method, pattern, feature) in Feature::ROUTES {
            router.add(method, pattern, Endpoint::NotSupported(feature));
        }
        Routes {
            router,
            api,
            series: RefCell::new(HashMap::new()),
            in_flight: std::cell::OnceCell::new(),
        }
    }

    /// Answers one request and records it in the HTTP metrics. Generic over the
    /// body so that tests can drive it without a socket.
    pub async fn handle<B>(&self, request: Request<B>) -> Response<Body>
    where
        B: hyper::body::Body,
        B::Error: std::error::Error + Send + Sync + 'static,
    {
        let started = std::time::Instant::now();
        let in_flight = self
            .in_flight
            .get_or_init(|| ::metrics::gauge!("narad_http_requests_in_flight"))
            .clone();
        in_flight.increment(1.0);
        let _in_flight = InFlight(in_flight);
        // The declared body size: a chunked body without a length counts 0.
        let bytes_in = hyper::body::Body::size_hint(request.body())
            .exact()
            .unwrap_or(0);
        let method = method_label(request.method());
        let routed = match self.router.find(request.method(), request.uri().path()) {
            Match::Found { endpoint, params } => Routed::Found {
                endpoint,
                topic: params.get("topic").map(path_segment),
            },
            Match::MethodNotAllowed { allow } => Routed::MethodNotAllowed { allow },
            Match::NotFound => Routed::NotFound,
        };
        let endpoint = match &routed {
            Routed::Found { endpoint, .. } => Some(*endpoint),
            _ => None,
        };
        let mut unanswered = Unanswered {
            routes: self,
            labels: (endpoint, method),
            started,
            bytes_in,
            armed: true,
        };
        let response = self.answer(request, routed).await;
        unanswered.armed = false;
        let status = match response.extensions().get::<ClientGone>() {
            Some(_) => StatusCode::from_u16(CLIENT_GONE).expect("a valid status"),
            None => response.status(),
        };
        let series = self.series((endpoint, method, status));
        series.requests.increment(1);
        series.duration.record(started.elapsed().as_secs_f64());
        if let Some(errors) = &series.server_errors {
            errors.increment(1);
        }
        series.bytes_in.increment(bytes_in);
        let bytes_out = hyper::body::Body::size_hint(response.body()).exact();
        series.bytes_out.increment(bytes_out.unwrap_or(0));
        response
    }

    /// The handles of one (route, method, status)'s series, registered on first use.
    fn series(
        &self,
        (endpoint, method, status): (Option<Endpoint>, &'static str, StatusCode),
    ) -> Rc<HttpSeries> {
        let labels = (endpoint, method, status.as_u16());
        if let Some(series) = self.series.borrow().get(&labels) {
            return series.clone();
        }
        let route = endpoint.map_or("unmatched", Endpoint::pattern);
        let key = [
            ("route", route),
            ("method", method),
            ("status", status_label(status)),
        ];
        let series = Rc::new(HttpSeries {
            requests: ::metrics::counter!("narad_http_requests_total", &key),
            duration: ::metrics::histogram!("narad_http_request_duration_seconds", &key),
            // A probe's 503 (not ready while starting, stopping) is the
            // node's state, answered as designed, not an error: counted, a
            // restart would trip every alert on this series. Nor is a 501.
            server_errors: (status.is_server_error()
                && endpoint.is_none_or(Endpoint::fails_as_server))
                .then(|| {
                ::metrics::counter!("narad_errors_total", "component" => "http", "kind" => "5xx")
            }),
            bytes_in: ::metrics::counter!("narad_http_request_bytes_in_total", "route" => route),
            bytes_out: ::metrics::counter!("narad_http_response_bytes_out_total", "route" => route),
        });
        self.series.borrow_mut().insert(labels, series.clone());
        series
    }

    async fn answer<B>(&self, request: Request<B>, routed: Routed) -> Response<Body>
    where
        B: hyper::body::Body,
        B::Error: std::error::Error + Send + Sync + 'static,
    {
        // A stopping node takes no new work, health checks included: load balancers
        // must see it leave.
        if self.api.node.is_draining() {
            return response::draining();
        }
        if let Err(refusal) = response::host_guard(request.version(), request.headers()) {
            return refusal.into_response();
        }
        if let Err(refusal) = response::expect_guard(request.headers()) {
            return refusal.into_response();
        }
        let (endpoint, topic) = match routed {
            Routed::Found { endpoint, topic } => (endpoint, topic),
            Routed::MethodNotAllowed { allow } => return response::method_not_allowed(&allow),
            Routed::NotFound => return response::not_found(),
        };
        if let Endpoint::NotSupported(feature) = endpoint {
            return response::error(StatusCode::NOT_IMPLEMENTED, feature.refusal());
        }
        if response::needs_content_type(request.method()) {
            if let Err(refusal) = response::content_type_guard(request.headers()) {
                return refusal.into_response();
            }
        }
        if let Err(refusal) = response::query_guard(request.uri().query()) {
            return refusal.into_response();
        }
        if let Err(refusal) = response::transfer_coding_guard(request.headers()) {
            return refusal.into_response();
        }
        match endpoint {
            Endpoint::Healthz => {
                return response::json_static(StatusCode::OK, r#"{"status":"ok"}"#)
            }
            Endpoint::Readyz => return self.readyz(),
            Endpoint::Metrics => {
                // While the node recovers there is no topic list yet: every
                // series is shown.
                let live = self.api.broker.borrow().as_ref().map(|shard| {
                    let snapshot = shard.meta.snapshot();
                    (snapshot.topics.iter())
                        .map(|(name, topic)| (name.to_string(), topic.partitions))
                        .collect()
                });
                return metrics_text(live).await;
            }
            _ => {}
        }
        let shard = match self.api.broker.borrow().clone() {
            Some(shard) if self.api.node.has_recovered() => shard,
            _ => return response::recovering(),
        };
        let api = &self.api;
        let topic = topic.unwrap_or_default();
        match endpoint {
            Endpoint::Healthz
            | Endpoint::Readyz
            | Endpoint::Metrics
            | Endpoint::NotSupported(_) => {
                unreachable!("answered above")
            }
            // Each route's future is boxed on its own: the future of this
            // function (which hyper moves on every request) then holds a pointer
            // rather than the largest route's state, about 7 KB.
            Endpoint::TopicCreate => Box::pin(super::topics::create(api, &shard, request)).await,
            Endpoint::TopicList => super::topics::list(&shard, request.uri().query()),
            Endpoint::TopicGet => {
                Box::pin(super::topics::get(&shard, &topic, request.uri().query())).await
            }
            Endpoint::TopicAlter => {
                Box::pin(super::topics::alter(api, &shard, &topic, request)).await
            }
            Endpoint::TopicDelete => Box::pin(super::topics::delete(&shard, &topic)).await,
            Endpoint::Produce => {
                Box::pin(super::produce::single(api, &shard, &topic, request)).await
            }
            Endpoint::ProduceBatch => {
                Box::pin(super::produce::batch(api, &shard, &topic, request)).await
            }
            Endpoint::Consume => {
                Box::pin(super::consume::consume(api, &shard, &topic, &request)).await
            }
            Endpoint::Ack => Box::pin(super::consume::ack(api, &shard, &topic, request)).await,
        }
    }

    /// `GET /readyz`: 503 until storage recovery is done, for good once an
    /// ingress WAL has latched (its shard refuses every produce until the node
    /// restarts), and while an ingress WAL waits on a disk that stopped
    /// answering (its shard refuses produces until it answers); ready but
    /// `degraded` while produces are refused for want of disk, which passes
    /// by itself (`data_dir_low`), while consumer offsets fail to persist
    /// (`consumer_offsets_failing`: acks are answered, but a crash would
    /// redeliver them), while an ingress WAL cannot make its dispatch
    /// checkpoint durable (`wal_checkpoint_failing`: a restart would commit
    /// again what was committed since, and the WAL does not compact), and
    /// once the metadata store has failed, which lasts
    /// until a restart (`metastore_failed`: topic changes answer 500;
    /// produce, consume and ack go on).
    fn readyz(&self) -> Response<Body> {
        let node = &self.api.node;
        if !node.is_ready() {
            response::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: storage recovery in progress",
            )
        } else if node.wal_failed() {
            response::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: an ingress WAL failed after a disk error and refuses produces until the node restarts",
            )
        } else if node.wal_stalled() {
            response::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: an ingress WAL has waited several seconds for the disk to complete a write; produces are refused until it answers",
            )
        } else {
            let metastore_failed = self
                .api
                .broker
                .borrow()
                .as_ref()
                .is_some_and(|shard| shard.meta.store_failed());
            let degraded: Vec<&str> = [
                (node.disk_low(), "data_dir_low"),
                (metastore_failed, "metastore_failed"),
                (node.consumer_state_failing(), "consumer_offsets_failing"),
                (node.checkpoint_failing(), "wal_checkpoint_failing"),
            ]
            .into_iter()
            .filter_map(|(on, name)| on.then_some(name))
            .collect();
            if degraded.is_empty() {
                response::json_static(StatusCode::OK, r#"{"status":"ready"}"#)
            } else {
                #[derive(serde::Serialize)]
                struct Degraded<'a> {
                    status: &'a str,
                    degraded: Vec<&'a str>,
                }
                let body = Degraded {
                    status: "ready",
                    degraded,
                };
                response::json(StatusCode::OK, &body)
            }
        }
    }
}

/// `GET /metrics`: the Prometheus text exposition of the node, without the
/// gauges of topics, or partitions, not in `live` (topic names and their
/// partition counts) when it is given. It is rendered on a thread of its own:
/// with many partitions a render takes long enough to stall every other
/// request of the shard that serves the scrape.
async fn metrics_text(live: Option<std::collections::BTreeMap<String, u32>>) -> Response<Body> {
    let recorder = crate::metrics::install();
    let asked = std::time::Instant::now();
    // Renders take turns node-wide, and scrapes that waited share one (see
    // `metrics::shared_render`).
    let render = move |recorder: &crate::metrics::ShardedRecorder| {
        crate::metrics::SHARED_RENDER.text(asked, || match &live {
            Some(live) => recorder.render_where(&|topic, partition| {
                live.get(topic)
                    .is_some_and(|&partitions| partition.is_none_or(|p| p < partitions))
            }),
            None => recorder.render(),
        })
    };
    let (sender, rendered) = futures_channel::oneshot::channel();
    let on_thread = {
        let recorder = recorder.clone();
        let render = render.clone();
        std::thread::Builder::new()
            .name("metrics-render".into())
            .spawn(move || {
                let _ = sender.send(render(&recorder));
            })
    };
    let text = match on_thread {
        Ok(_) => match rendered.await {
            Ok(text) => text,
            Err(_) => {
                return response::error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "rendering the metrics failed",
                )
            }
        },
        // No thread to be had (a process at its limit): render here.
        Err(_) => render(&recorder),
    };
    let text = bytes::Bytes::from_owner(crate::metrics::SharedText(text));
    let mut response = Response::new(Body::new(text));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::PUT => "PUT",
        Method::HEAD => "HEAD",
        _ => "OTHER",
    }
}

/// The status as a label without an allocation for the codes this API answers.
fn status_label(status: StatusCode) -> &'static str {
    match status.as_u16() {
        200 => "200",
        201 => "201",
        202 => "202",
        204 => "204",
        400 => "400",
        401 => "401",
        403 => "403",
        404 => "404",
        405 => "405",
        408 => "408",
        409 => "409",
        410 => "410",
        413 => "413",
        415 => "415",
        417 => "417",
        422 => "422",
        429 => "429",
        431 => "431",
        CLIENT_GONE => "499",
        500 => "500",
        501 => "501",
        502 => "502",
        503 => "503",
        504 => "504",
        _ => "other",
    }
}

#[cfg(test)]
mod tests;
