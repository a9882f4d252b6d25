//! One shard's HTTP server: its accept loop, its connections, and their drain when
//! the node stops.
//!
//! Which cores: every shard runs one [`ShardServer`] on its own executor, over its
//! own `SO_REUSEPORT` socket; a connection is served start to finish by the shard
//! whose socket accepted it. The registry of connections below is shard-local
//! (`Rc`, `Cell`); only the node-wide connection count in [`NodeState`] is shared.
//!
//! Stopping happens in two phases, each a broadcast to every connection of the
//! shard:
//! 1. *Draining*: the accept loop takes the connections the kernel already
//!    queued (a close would reset them) and ends, and its socket closes, so the
//!    kernel sends new connections to no one; every request still arriving is
//!    answered 503 with
//!    `Retry-After: 1` and `Connection: close`, and any answer given from then on
//!    says `Connection: close`. A connection serving a request is told to shut
//!    down gracefully (hyper closes it after the response in flight). A connection
//!    between requests (one just accepted, or a kept-alive one) gets
//!    [`FRESH_CONNECTION_WINDOW`] to send its next request and hear the 503,
//!    instead of a silent close it could not tell from a crash, which a request
//!    already on its way would otherwise meet.
//! 2. *Closing*, once every connection is gone or `http.shutdown_grace` has passed:
//!    the connections left are dropped.
//!
//! A connection over `http.max_connections` is answered `503` with `Retry-After: 1`
//! and closed, rather than left in the kernel's queue, so the client learns at once
//! that the node is full.

use std::cell::{Cell, RefCell};
use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::Duration;

use futures_lite::future::or;
use futures_lite::io::AsyncWriteExt;
use hyper::server::conn::http1;
use narad_io::net::{Exchange, ExchangeCell, Linger, Listener, ReadLimits, ShardTimer, Stream};

use super::node::{ConnectionPermit, NodeState};
use super::routes::Routes;
use crate::config::HttpConfig;

mod phases;
use phases::{Phase, Phases};

/// How long a connection that has sent nothing yet may still send its first request
/// once the node stops (it is answered 503).
pub const FRESH_CONNECTION_WINDOW: Duration = Duration::from_secs(1);
/// A failed accept (out of descriptors, say) is retried after this pause rather
/// than in a busy loop.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);
/// Over-limit connections being answered at once per shard; past this they are
/// closed without an answer, so a flood cannot make the answers themselves a load.
const OVERFLOW_ANSWERS_MAX: usize = 64;
/// How long, and how many bytes, an over-limit connection is read after its 503 so
/// that closing it does not reset the connection before the client reads the answer.
const OVERFLOW_LINGER: Linger = Linger {
    within: Duration::from_millis(500),
    bytes_max: 64 << 10,
};
/// The same for a connection the server closes while its client may still be
/// sending (a request answered before its body was read: 413, 415, a 503 while
/// draining): a few times the single produce's 1 MiB cap, within the half
/// second other servers wait before they close.
const CLOSE_LINGER: Linger = Linger {
    within: Duration::from_millis(500),
    bytes_max: 4 << 20,
};
/// After the grace, how long to wait for dropped connections to finish unwinding.
const CLOSE_WAIT_MAX: Duration = Duration::from_secs(1);
/// hyper buffers at least this much per connection whatever the header limit.
const HYPER_BUF_BYTES_MIN: usize = 8 << 10;
/// Read buffer room beyond the header limit, so that a request whose headers are
/// just under the limit still has room for the start of its body.
const BODY_READ_AHEAD_BYTES: usize = 16 << 10;

/// The waiter id of the accept loop; connections count up from 1.
const ACCEPTOR_ID: u64 = 0;

/// The settings one shard's server needs, taken from `http.*`.
#[derive(Clone, Debug)]
pub struct HttpSettings {
    pub read_timeout: Duration,
    /// How long a keep-alive connection may wait for its next request.
    pub idle_timeout: Duration,
    pub write_timeout: Duration,
    pub shutdown_grace: Duration,
    pub max_header_bytes: usize,
    /// The longest long-poll a consume may ask for.
    pub max_consume_wait: Duration,
}

impl From<&HttpConfig> for HttpSettings {
    fn from(http: &HttpConfig) -> Self {
        HttpSettings {
            read_timeout: http.read_timeout,
            idle_timeout: http.idle_timeout,
            write_timeout: http.write_timeout,
            shutdown_grace: http.shutdown_grace,
            max_header_bytes: http.max_header_bytes,
            max_consume_wait: http.max_consume_wait,
        }
    }
}

/// One shard's HTTP server.
pub struct ShardServer {
    shared: Rc<Shared>,
}

/// Shard-local state shared by the accept loop and the connection tasks.
struct Shared {
    shard: usize,
    node: Arc<NodeState>,
    routes: Rc<Routes>,
    builder: http1::Builder,
    read_timeout: Duration,
    idle_timeout: Duration,
    write_timeout: Duration,
    shutdown_grace: Duration,
    /// The phase, and who to wake when it changes: the accept loop and every
    /// connection.
    phases: Phases,
    next_id: Cell<u64>,
    open: Cell<usize>,
    /// The accept loop runs (until it has taken what was queued at the stop).
    accepting: Cell<bool>,
    all_closed: RefCell<Option<Waker>>,
    overflow_answers: Cell<usize>,
}

impl ShardServer {
    /// Starts serving on `socket` (from `narad_io::net::bind_reuseport_group`).
    /// Call on the shard's executor.
    pub fn start(
        shard: usize,
        socket: std::net::TcpListener,
        node: Arc<NodeState>,
        routes: Rc<Routes>,
        settings: &HttpSettings,
    ) -> std::io::Result<ShardServer> {
        let mut builder = http1::Builder::new();
        builder
            .timer(ShardTimer)
            .keep_alive(true)
            // A client that sends its request and then shuts its writing side
            // still reads the answer; a long-poll watches for that end
            // itself (`Peer::end`) and stops waiting.
            .half_close(true)
            // hyper's header timer would start when it begins to wait for the
            // next request, so an idle connection would be cut at the read
            // timeout; the stream bounds both waits instead (`ReadLimits`).
            .header_read_timeout(None)
            .max_header_size(settings.max_header_bytes)
            .max_buf_size(
                (settings.max_header_bytes + BODY_READ_AHEAD_BYTES).max(HYPER_BUF_BYTES_MIN),
            );
        let shared = Rc::new(Shared {
            shard,
            routes,
            node,
            builder,
            read_timeout: settings.read_timeout,
            idle_timeout: settings.idle_timeout,
            write_timeout: settings.write_timeout,
            shutdown_grace: settings.shutdown_grace,
            phases: Phases::default(),
            next_id: Cell::new(ACCEPTOR_ID + 1),
            open: Cell::new(0),
            accepting: Cell::new(true),
            all_closed: RefCell::new(None),
            overflow_answers: Cell::new(0),
        });
        let listener = Listener::adopt(socket)?;
        narad_io::rt::spawn_local(accept_loop(shared.clone(), listener));
        Ok(ShardServer { shared })
    }

    /// Stops accepting, lets requests in flight finish within `http.shutdown_grace`,
    /// then drops the connections left.
    pub async fn drain(&self) {
        let shared = &self.shared;
        shared.broadcast(Phase::Draining);
        let grace = shared.shutdown_grace;
        let drained = or(
            async {
                shared.until_all_closed().await;
                true
            },
            async {
                narad_io::rt::sleep(grace).await;
                false
            },
        )
        .await;
        if !drained {
            tracing::warn!(
                shard = shared.shard,
                open = shared.open.get(),
                ?grace,
                "closing connections still busy at the end of the shutdown grace"
            );
        }
        shared.broadcast(Phase::Closing);
        or(
            shared.until_all_closed(),
            narad_io::rt::sleep(CLOSE_WAIT_MAX),
        )
        .await;
    }
}

impl Shared {
    /// A new waiter id: a connection's, or a drain's (each waits on its own).
    fn fresh_id(&self) -> u64 {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        id
    }

    fn broadcast(&self, phase: Phase) {
        self.phases.broadcast(phase);
    }

    /// Resolves once the shard reaches `phase`; `id` names the waiter.
    fn until(&self, id: u64, phase: Phase) -> impl Future<Output = ()> + '_ {
        self.phases.until(id, phase)
    }

    /// Resolves once the accept loop has ended and every connection closed.
    fn until_all_closed(&self) -> impl Future<Output = ()> + '_ {
        poll_fn(move |cx| {
            if self.open.get() == 0 && !self.accepting.get() {
                return Poll::Ready(());
            }
            *self.all_closed.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
    }
}

async fn accept_loop(shared: Rc<Shared>, listener: Listener) {
    loop {
        // The stop is looked at first: connections that keep arriving must not
        // keep a stopping shard accepting.
        let accepted = or(
            async {
                shared.until(ACCEPTOR_ID, Phase::Draining).await;
                None
            },
            async { Some(listener.accept().await) },
        )
        .await;
        match accepted {
            None => break,
            Some(Ok(stream)) => admit(&shared, stream),
            Some(Err(e)) => {
                tracing::warn!(shard = shared.shard, error = %e, "accept failed");
                or(
                    narad_io::rt::sleep(ACCEPT_ERROR_BACKOFF),
                    shared.until(ACCEPTOR_ID, Phase::Draining),
                )
                .await;
            }
        }
    }
    shared.phases.forget(ACCEPTOR_ID);
    // The close would reset the connections the kernel already queued on
    // this socket: they are taken first, and hear the stopping node's 503
    // like any connection open at the stop. At most a full queue's worth, so
    // that connections still arriving do not keep it taking.
    for _ in 0..narad_io::net::LISTEN_BACKLOG_MAX {
        match listener.accept_queued() {
            Ok(Some(stream)) => admit(&shared, stream),
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(shard = shared.shard, error = %e, "accept failed while stopping");
                break;
            }
        }
    }
    // Dropping the listener here closes this shard's socket: the kernel stops
    // handing it connections.
    drop(listener);
    shared.accepting.set(false);
    if let Some(waker) = shared.all_closed.borrow_mut().take() {
        waker.wake();
    }
    tracing::debug!(shard = shared.shard, "stopped accepting");
}

fn admit(shared: &Rc<Shared>, stream: Stream) {
    let Some(permit) = shared.node.try_open_connection() else {
        let answering = shared.overflow_answers.get();
        if answering < OVERFLOW_ANSWERS_MAX {
            shared.overflow_answers.set(answering + 1);
            narad_io::rt::spawn_local(answer_overflow(shared.clone(), stream));
        }
        return;
    };
    let id = shared.fresh_id();
    shared.open.set(shared.open.get() + 1);
    let slot = Slot {
        shared: shared.clone(),
        id,
        _permit: permit,
    };
    narad_io::rt::spawn_local(serve_connection(slot, stream));
}

/// A connection's place in its shard's registry and in the node's count; dropping
/// it (when the connection task ends or is dropped) gives both back.
struct Slot {
    shared: Rc<Shared>,
    id: u64,
    _permit: ConnectionPermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let shared = &self.shared;
        shared.phases.forget(self.id);
        let open = shared.open.get();
        assert!(open > 0, "shard connection count went below zero");
        shared.open.set(open - 1);
        if open == 1 {
            if let Some(waker) = shared.all_closed.borrow_mut().take() {
                waker.wake();
            }
        }
    }
}

/// Bodies up to this declared size that a handler answered without reading
/// whole are read to their end after the answer goes (within
/// `http.read_timeout`), and the connection is kept.
const DRAINED_BODY_BYTES_MAX: u64 = 64 << 10;

/// Whether the answer to a request with a body of `declared` bytes (`None`:
/// chunked) is one after which the connection closes, because the body was
/// left unread: a body refused as too large or too slow (413, 408) or sent
/// after an expectation the server refused (417), or any
/// error to a body too large to drain (an early 415 or 404, a full budget's
/// 503). Such answers say `Connection: close`, so that a client's pool does
/// not send its next request into a connection about to close; an error to a
/// small body is drained after it ([`HeldBody`]) and keeps the connection.
/// An answer that says `Connection: close` itself (a stopping node's 503)
/// closes whatever the body.
fn closes_after<B>(response: &hyper::Response<B>, declared: Option<u64>) -> bool {
    let says_close = response
        .headers()
        .get(hyper::header::CONNECTION)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
    let status = response.status();
    let has_body = declared != Some(0);
    // A 417's client may have held its body back and send its next request
    // instead (RFC 9110 asks it to retry without the expectation): a drain
    // would take that request for the body.
    let refused_body = matches!(status.as_u16(), 408 | 413 | 417);
    let undrainable = declared.is_none_or(|n| n > DRAINED_BODY_BYTES_MAX);
    says_close || (has_body && !status.is_success() && (refused_body || undrainable))
}

/// Whether a body this request's route left unread may be drained after the
/// answer. Not with `Expect: 100-continue`: hyper sends the 100 only when a
/// route reads, so a client that waits for it may give up on the body and
/// send its next request instead, which a drain would take for the body. Nor
/// when the connection closes after this request anyway (`Connection:
/// close`, or HTTP/1.0 without keep-alive): a drain would only hold it open.
fn may_drain(parts: &hyper::http::request::Parts) -> bool {
    let headers = &parts.headers;
    let expects_continue = headers
        .get(hyper::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let connection_says = |token: &str| {
        headers
            .get_all(hyper::header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    let keeps_alive = match parts.version {
        hyper::Version::HTTP_10 => connection_says("keep-alive"),
        _ => !connection_says("close"),
    };
    !expects_continue && keeps_alive
}

/// A request's body as the routes see it. A body small enough to drain is also
/// held by the connection, so that one a route answered without reading (an
/// early 404 or 415 to a body still on its way) is read to its end after the
/// answer went, and the connection serves the next request: hyper itself
/// reads on only what has already arrived when the body is dropped, and
/// otherwise closes the connection, which the answer did not announce. The
/// answer does not wait for the body: a client may wait for it before sending
/// the body, or never send it (then the connection closes at the read
/// timeout). Bodies that are empty, chunked or larger are the routes' alone.
enum HeldBody {
    Owned(hyper::body::Incoming),
    Shared(Rc<RefCell<hyper::body::Incoming>>),
}

impl HeldBody {
    /// The body of a request declaring `declared` bytes, and the connection's
    /// hold on it if it may need draining.
    fn new(
        body: hyper::body::Incoming,
        declared: Option<u64>,
    ) -> (HeldBody, Option<Rc<RefCell<hyper::body::Incoming>>>) {
        match declared {
            Some(n) if n > 0 && n <= DRAINED_BODY_BYTES_MAX => {
                let held = Rc::new(RefCell::new(body));
                (HeldBody::Shared(held.clone()), Some(held))
            }
            _ => (HeldBody::Owned(body), None),
        }
    }
}

impl hyper::body::Body for HeldBody {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        match self.get_mut() {
            HeldBody::Owned(body) => std::pin::Pin::new(body).poll_frame(cx),
            HeldBody::Shared(body) => std::pin::Pin::new(&mut *body.borrow_mut()).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            HeldBody::Owned(body) => body.is_end_stream(),
            HeldBody::Shared(body) => body.borrow().is_end_stream(),
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            HeldBody::Owned(body) => body.size_hint(),
            HeldBody::Shared(body) => body.borrow().size_hint(),
        }
    }
}

/// Reads what is left of a held body, its answer made, in a task of its own
/// while the answer goes out, dropping the bytes; a body that does not all
/// arrive within `timeout`, or before the shard begins to stop (the answer is
/// out: nothing is left to protect), is dropped, and hyper closes the
/// connection. The exchange ends (`answered_for`) once the body is in, not
/// when hyper next says the body ended (only when the next request comes):
/// bytes of the body must not count as the start of the next request, whose
/// head the stream would then time.
fn drain_after_answer(
    held: Rc<RefCell<hyper::body::Incoming>>,
    shared: Rc<Shared>,
    exchange: Rc<ExchangeCell>,
    request: u64,
) {
    use hyper::body::Body as _;
    if held.borrow().is_end_stream() {
        exchange.answered_for(request);
        return;
    }
    narad_io::rt::spawn_local(async move {
        let mut rest = HeldBody::Shared(held);
        let read = async {
            loop {
                match poll_fn(|cx| std::pin::Pin::new(&mut rest).poll_frame(cx)).await {
                    Some(Ok(_)) if !rest.is_end_stream() => {}
                    _ => return,
                }
            }
        };
        let id = shared.fresh_id();
        let stopping = shared.until(id, Phase::Draining);
        or(read, or(narad_io::rt::sleep(shared.read_timeout), stopping)).await;
        shared.phases.forget(id);
        exchange.answered_for(request);
    });
}

async fn serve_connection(slot: Slot, mut stream: Stream) {
    let shared = slot.shared.clone();
    let (shard, id) = (shared.shard, slot.id);
    // Best effort: a socket that refuses these options still serves.
    let _ = stream.set_nodelay();
    // `http.write_timeout` bounds both each stall of a write and the whole of one
    // response, so a client reading a byte now and then cannot keep a slot.
    let _ = stream.set_write_timeout(shared.write_timeout);
    stream.set_response_write_max(shared.write_timeout);
    stream.linger_on_close(CLOSE_LINGER);
    // `http.read_timeout` for the head of a request (from the accept for the
    // first, from its first byte for later ones), `http.idle_timeout` for the
    // wait between requests.
    let exchange = Rc::new(ExchangeCell::fresh());
    stream.set_read_limits(ReadLimits {
        idle: shared.idle_timeout,
        head: shared.read_timeout,
        exchange: exchange.clone(),
    });
    let requests_seen = Rc::new(Cell::new(0u64));
    let between_requests = exchange.clone();
    let peer = super::Peer {
        addr: stream.peer_addr().ok().map(|a| a.ip()),
        end: stream.peer_end(),
    };
    let service = {
        let (shared, requests_seen) = (shared.clone(), requests_seen.clone());
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            requests_seen.set(requests_seen.get() + 1);
            let request_number = exchange.busy();
            let declared = hyper::body::Body::size_hint(request.body()).exact();
            let (mut parts, body) = request.into_parts();
            parts.extensions.insert(peer.clone());
            let drainable = may_drain(&parts);
            let (body, held) = HeldBody::new(body, declared);
            let request = hyper::Request::from_parts(parts, body);
            let (shared, exchange) = (shared.clone(), exchange.clone());
            async move {
                let mut response = shared.routes.handle(request).await;
                let unread = held
                    .as_ref()
                    .is_some_and(|h| !hyper::body::Body::is_end_stream(&*h.borrow()));
                // An answer after which the connection closes drains nothing;
                // nor is a body drained that its client may never send. Once
                // the node drains, every answer closes its connection, so that
                // no client sends another request on it and hears nothing.
                let closes = closes_after(&response, declared)
                    || (unread && !drainable)
                    || shared.node.is_draining();
                match held.filter(|_| !closes) {
                    Some(held) => drain_after_answer(held, shared, exchange, request_number),
                    None => exchange.answered(),
                }
                if closes {
                    response.headers_mut().insert(
                        hyper::header::CONNECTION,
                        hyper::header::HeaderValue::from_static("close"),
                    );
                }
                Ok::<_, Infallible>(response)
            }
        })
    };
    let connection = shared.builder.serve_connection(stream, service);
    let mut connection = std::pin::pin!(connection);
    let served = or(async { Some(connection.as_mut().await) }, async {
        shared.until(id, Phase::Draining).await;
        None
    })
    .await;
    let result = match served {
        Some(result) => result,
        None => {
            if matches!(between_requests.get(), Exchange::Idle { .. }) {
                // Give a client that connected just before the stop, or whose
                // next request on a kept-alive connection may be on its way, the
                // chance to send it and hear the 503, rather than see a bare
                // close it could not tell from a crash. A connection serving a
                // request is told to close after its answer at once.
                let seen = requests_seen.get();
                let window = FRESH_CONNECTION_WINDOW.min(shared.shutdown_grace);
                let first = or(
                    poll_fn(|_| match requests_seen.get() == seen {
                        true => Poll::Pending,
                        false => Poll::Ready(()),
                    }),
                    narad_io::rt::sleep(window),
                );
                let finished = or(async { Some(connection.as_mut().await) }, async {
                    first.await;
                    None
                })
                .await;
                if let Some(result) = finished {
                    log_end(shard, result);
                    return;
                }
            }
            connection.as_mut().graceful_shutdown();
            or(async { Some(connection.as_mut().await) }, async {
                shared.until(id, Phase::Closing).await;
                None
            })
            .await
            .unwrap_or(Ok(()))
        }
    };
    log_end(shard, result);
    drop(slot);
}

fn log_end(shard: usize, result: Result<(), hyper::Error>) {
    if let Err(e) = result {
        tracing::debug!(shard, error = %e, "connection ended with an error");
    }
}

/// Answers a connection over `http.max_connections` with 503 and closes it.
async fn answer_overflow(shared: Rc<Shared>, mut stream: Stream) {
    let body = r#"{"error":"too many connections"}"#;
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.set_write_timeout(OVERFLOW_LINGER.within);
    if stream.write_all(answer.as_bytes()).await.is_ok() {
        stream.close_lingering(OVERFLOW_LINGER).await;
    }
    tracing::debug!(
        shard = shared.shard,
        "refused a connection over http.max_connections"
    );
    shared
        .overflow_answers
        .set(shared.overflow_answers.get() - 1);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, close: bool) -> hyper::Response<()> {
        let mut response = hyper::Response::new(());
        *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
        if close {
            response.headers_mut().insert(
                hyper::header::CONNECTION,
                hyper::header::HeaderValue::from_static("close"),
            );
        }
        response
    }

    #[test]
    fn which_answers_close_the_connection() {
        let small = Some(10);
        let large = Some(DRAINED_BODY_BYTES_MAX + 1);
        for (status, declared, closes) in [
            (202, small, false),
            (202, None, false),
            (404, Some(0), false),
            (404, small, false),
            (415, small, false),
            (404, large, true),
            (404, None, true),
            (413, small, true),
            (408, small, true),
            (417, small, true),
        ] {
            assert_eq!(
                closes_after(&answer(status, false), declared),
                closes,
                "{status} {declared:?}"
            );
        }
        // A stopping node's 503 says it closes: nothing is drained after it.
        assert!(closes_after(&answer(503, true), small));
        assert!(closes_after(&answer(200, true), Some(0)));
    }

    /// Connections the kernel queued before the stop, which the accept loop
    /// never took, are not reset by the socket's close: each request on them
    /// is answered 503.
    #[test]
    fn connections_queued_at_the_stop_hear_the_503() {
        use std::io::{Read, Write};
        let answers = narad_io::rt::run_local(None, async {
            let loopback = "127.0.0.1:0".parse().unwrap();
            let (mut sockets, addr) = narad_io::net::bind_reuseport_group(loopback, 1).unwrap();
            let node = Arc::new(NodeState::new(16));
            node.set_ready();
            let api = Rc::new(super::super::routes::Api {
                node: node.clone(),
                topic_defaults: crate::config::Config::default().topic,
                consume_wait_max: Duration::from_secs(10),
                body_read_timeout: Duration::from_secs(30),
                broker: RefCell::new(None),
            });
            let settings = HttpSettings::from(&crate::config::Config::default().http);
            let server = ShardServer::start(
                0,
                sockets.pop().unwrap(),
                node.clone(),
                Rc::new(Routes::new(api)),
                &settings,
            )
            .unwrap();
            // Connected and sent before the accept loop first runs: queued.
            let clients: Vec<std::net::TcpStream> = (0..3)
                .map(|_| {
                    let mut client = std::net::TcpStream::connect(addr).unwrap();
                    client
                        .write_all(b"GET /healthz HTTP/1.1\r\nhost: test\r\n\r\n")
                        .unwrap();
                    client
                })
                .collect();
            node.start_draining();
            server.drain().await;
            // The drain waited for them: each answer is there already.
            for client in &clients {
                client.set_nonblocking(true).unwrap();
                let mut byte = [0u8; 1];
                let peeked = client.peek(&mut byte);
                assert!(
                    matches!(peeked, Ok(1)),
                    "{peeked:?}: not answered within the drain"
                );
                client.set_nonblocking(false).unwrap();
            }
            clients
        });
        for mut client in answers {
            client
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let mut text = String::new();
            let read = client.read_to_string(&mut text);
            assert!(read.is_ok(), "{read:?}: reset instead of answered");
            assert!(text.starts_with("HTTP/1.1 503"), "{text}");
        }
    }
}
