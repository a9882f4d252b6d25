//! The load generator's side of the wire: the server address, one keep-alive
//! HTTP/1.1 connection per worker, and the setup calls (create, check and
//! delete the topic).
//!
//! Which cores: the generator's single executor. A [`Conn`] is `!Send`: its
//! socket lives on the executor that opened it, and the task that sends a
//! request is the one that writes it and reads its answer. There is no
//! connection task and no channel between the two (see `wire` for why the
//! client is hand-written rather than hyper's).
//!
//! A connection carries one request at a time (no pipelining), as a real
//! request/response client does; concurrency comes from the number of workers.
//! A request is rendered into a buffer the connection reuses: its head comes
//! pre-rendered from a [`RequestTemplate`] (method, path, `Host`,
//! `Content-Type`, `X-Narad-Client`), and only `Content-Length` and, for a
//! target that changes per request, the request line are written each time. A
//! small body is copied behind the head so the request leaves in one write; a
//! large one follows the head in a second write rather than being copied.
//!
//! After a failed exchange, or a response that says `Connection: close`, the
//! connection refuses further requests with an error: the caller opens a new
//! one.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use futures_lite::io::AsyncWriteExt;

use super::wire::{ResponseError, ResponseReader, Sink};

/// The most bytes of a setup response kept for an error message.
const SETUP_BODY_BYTES_MAX: usize = 64 << 10;
/// The largest response body a connection reads: above the broker's bound on
/// a batch consume reply (8 MiB).
pub const REPLY_BYTES_MAX: usize = 16 << 20;
/// The largest body copied behind its head into one write; a larger one is
/// written on its own, as copying it would cost more than the second call.
const INLINE_BODY_BYTES_MAX: usize = 16 << 10;
/// How long one request may wait for its whole answer by default (a consume
/// long-polls for at most a second): past it the request counts as a transport
/// error and its connection is dropped, so a server that stops answering cannot
/// hang a run.
pub const EXCHANGE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long a connect may take.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// The `X-Narad-Client` header line that batch consume and bodiless acks need.
const CLIENT_HEADER_LINE: &str = "X-Narad-Client: narad-bench\r\n";

const _: () = assert!(SETUP_BODY_BYTES_MAX <= REPLY_BYTES_MAX);

/// Where the broker listens: `http://host:port`, with an IP address or
/// `localhost` as the host (no name resolution, no TLS).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    pub addr: SocketAddr,
    /// `host:port` as the user wrote it, sent as the `Host` header.
    pub authority: String,
    /// How long one request may wait for its whole answer (`--timeout`).
    pub timeout: std::time::Duration,
}

impl Server {
    /// Parses `http://host:port` (a trailing `/` is allowed).
    pub fn parse(url: &str) -> Result<Server, String> {
        let refuse = |why: &str| format!("--server {url:?}: {why} (expected http://host:port)");
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| refuse("only http:// is supported"))?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '@', '?', '#']) {
            return Err(refuse("a path, query or user name is not allowed"));
        }
        let (host, port) = match rest.strip_prefix('[') {
            Some(bracketed) => bracketed
                .split_once("]:")
                .ok_or_else(|| refuse("missing port"))?,
            None => rest
                .rsplit_once(':')
                .ok_or_else(|| refuse("missing port"))?,
        };
        let port: u16 = port
            .parse()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| refuse("bad port"))?;
        let ip: IpAddr = if host.eq_ignore_ascii_case("localhost") {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            host.parse()
                .map_err(|_| refuse("the host must be an IP address or localhost"))?
        };
        let bracketed = rest.starts_with('[');
        if bracketed != ip.is_ipv6() {
            return Err(refuse("an IPv6 address goes in brackets"));
        }
        if !rest.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(refuse("bad host"));
        }
        Ok(Server {
            addr: SocketAddr::new(ip, port),
            authority: rest.to_string(),
            timeout: EXCHANGE_TIMEOUT,
        })
    }
}

/// How long a worker tries to open a connection again before it gives up and
/// the run stops (the server is gone), at most: long enough for a broker to
/// restart, so that a run (`--verify` above all) goes on across it. A shorter
/// `--timeout` shortens it.
pub const RECONNECT_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);
/// The pause between two reconnection attempts.
const RECONNECT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);

/// A worker's connection, opened again after it failed: a failed open is
/// followed by a pause, and once opens have failed for [`RECONNECT_WINDOW`]
/// (or the server's timeout, if shorter) the worker gives up.
pub struct Link {
    conn: Option<Conn>,
    /// Since when opens have failed in a row.
    failing_since: Option<std::time::Instant>,
}

/// What [`Link::get`] found.
pub enum Opened<'a> {
    Ready(&'a mut Conn),
    /// The open failed and the pause is over: count the failure and try again.
    Retry,
    /// Too many opens failed in a row.
    GiveUp,
}

impl Link {
    pub fn new(conn: Conn) -> Link {
        Link {
            conn: Some(conn),
            failing_since: None,
        }
    }

    /// The open connection, opening a new one if the last one was dropped, was
    /// ended by the server (`Connection: close`), or sat idle long enough that
    /// the server may have closed it: a request written to a connection the
    /// server has closed fails without having been read.
    pub async fn get(&mut self, server: &Server) -> Opened<'_> {
        if self
            .conn
            .as_ref()
            .is_some_and(|c| c.ended.is_some() || c.idle_since.elapsed() >= IDLE_REOPEN_AFTER)
        {
            self.conn = None;
        }
        if self.conn.is_none() {
            match Conn::open(server).await {
                Ok(fresh) => {
                    self.failing_since = None;
                    self.conn = Some(fresh);
                }
                Err(_) => {
                    let since = *self
                        .failing_since
                        .get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() >= RECONNECT_WINDOW.min(server.timeout) {
                        return Opened::GiveUp;
                    }
                    // A Ctrl-C does not wait for the server to come back.
                    super::evloop::pause(RECONNECT_BACKOFF).await;
                    return Opened::Retry;
                }
            }
        }
        Opened::Ready(self.conn.as_mut().expect("opened just above"))
    }

    /// Drops the connection after a failure; the next [`Link::get`] opens anew.
    pub fn drop_conn(&mut self) {
        self.conn = None;
    }
}

/// Why a request got no HTTP answer.
pub type TransportError = String;

/// A connection idle this long is opened anew before its next request: the
/// broker closes connections that send nothing for `http.read_timeout` (10 s
/// by default), so an open-loop worker at a low rate would otherwise write
/// into closed connections.
const IDLE_REOPEN_AFTER: std::time::Duration = std::time::Duration::from_secs(4);

/// One keep-alive HTTP/1.1 connection.
pub struct Conn {
    stream: super::evloop::Stream,
    /// The request being written: its head, and its body when small.
    tx: Vec<u8>,
    reader: ResponseReader,
    /// Set once no request may follow: why.
    ended: Option<&'static str>,
    /// When the last exchange ended (or the connection opened).
    idle_since: std::time::Instant,
    /// [`Server::timeout`].
    timeout: std::time::Duration,
}

impl Conn {
    /// Connects to the server.
    pub async fn open(server: &Server) -> Result<Conn, TransportError> {
        let timed_out = async {
            super::evloop::sleep(CONNECT_TIMEOUT).await;
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no connection within {CONNECT_TIMEOUT:?}"),
            ))
        };
        let stream = futures_lite::future::or(super::evloop::connect(server.addr), timed_out)
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", server.addr))?;
        Ok(Conn {
            stream,
            tx: Vec::with_capacity(1024),
            reader: ResponseReader::new(),
            ended: None,
            idle_since: std::time::Instant::now(),
            timeout: server.timeout,
        })
    }

    /// Sends one request and reads its whole response, discarding the body.
    pub async fn send(&mut self, request: Request<'_>) -> Result<u16, TransportError> {
        self.exchange(request, &mut Sink::discard(REPLY_BYTES_MAX))
            .await
    }

    /// Sends one request and reads its body into `body` (cleared first), whose
    /// allocation is reused from one request to the next. A body above
    /// [`REPLY_BYTES_MAX`] is an error.
    pub async fn send_into(
        &mut self,
        request: Request<'_>,
        body: &mut Vec<u8>,
    ) -> Result<u16, TransportError> {
        self.exchange(request, &mut Sink::keep(body, REPLY_BYTES_MAX))
            .await
    }

    /// Sends one request and returns the status and (the start of) the body.
    pub async fn send_collect(
        &mut self,
        request: Request<'_>,
    ) -> Result<(u16, String), TransportError> {
        let mut kept = Vec::new();
        let mut sink = Sink::keep_prefix(&mut kept, SETUP_BODY_BYTES_MAX, REPLY_BYTES_MAX);
        let status = self.exchange(request, &mut sink).await?;
        assert!(kept.len() <= SETUP_BODY_BYTES_MAX);
        Ok((status, String::from_utf8_lossy(&kept).trim().to_string()))
    }

    /// Writes the request and reads its response; ends the connection when
    /// the server says it closes it or when anything failed.
    async fn exchange(
        &mut self,
        request: Request<'_>,
        sink: &mut Sink<'_>,
    ) -> Result<u16, TransportError> {
        if let Some(why) = self.ended {
            return Err(why.to_string());
        }
        let timeout = self.timeout;
        let timed_out = async move {
            super::evloop::sleep(timeout).await;
            // A Ctrl-C cuts the wait short (`evloop::Core::on_interrupt`).
            let why = match super::interrupted() {
                true => "no answer before the run was interrupted".to_string(),
                false => format!("no answer within {timeout:?}"),
            };
            Err(ResponseError::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                why,
            )))
        };
        let result = futures_lite::future::or(self.write_and_read(request, sink), timed_out).await;
        self.idle_since = std::time::Instant::now();
        match &result {
            Ok(response) if response.close => {
                self.ended = Some("the server ended the connection (Connection: close)")
            }
            Ok(_) => {}
            Err(_) => self.ended = Some("an earlier request on this connection failed"),
        }
        result
            .map(|response| response.status)
            .map_err(|e| e.to_string())
    }

    async fn write_and_read(
        &mut self,
        request: Request<'_>,
        sink: &mut Sink<'_>,
    ) -> Result<super::wire::Response, ResponseError> {
        self.tx.clear();
        request.render_head(&mut self.tx);
        if request.body.len() <= INLINE_BODY_BYTES_MAX {
            self.tx.extend_from_slice(request.body);
            self.stream.write_all(&self.tx).await?;
        } else {
            self.stream.write_all(&self.tx).await?;
            self.stream.write_all(request.body).await?;
        }
        let response = self.reader.read(&mut self.stream, sink).await?;
        // One request is in flight at a time, so anything after the response
        // is a server speaking out of turn: the answer stands (a 202 was
        // given), but the connection is not used again.
        if !self.reader.buffered().is_empty() {
            self.ended = Some("the server sent bytes after the end of a response");
        }
        Ok(response)
    }
}

/// The methods the generator sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Delete,
}

impl Method {
    fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Delete => "DELETE",
        }
    }
}

/// A request sent many times: its head is rendered once, and each request
/// adds only its `Content-Length` (and, with [`RequestTemplate::build_to`],
/// its own target).
pub struct RequestTemplate {
    method: Method,
    /// The request line and fixed headers for the template's own path.
    head: Vec<u8>,
    /// The fixed headers alone, after the request line's target:
    /// ` HTTP/1.1\r\nHost: …\r\n…`.
    headers: Vec<u8>,
}

impl RequestTemplate {
    pub fn new(method: Method, path: &str, server: &Server, content_type: &'static str) -> Self {
        RequestTemplate::render(method, path, server, Some(content_type))
    }

    /// A bodiless `GET`.
    pub fn get(path: &str, server: &Server) -> Self {
        RequestTemplate::render(Method::Get, path, server, None)
    }

    /// Also sends `X-Narad-Client`, as batch consume and bodiless acks need.
    pub fn with_client_header(self) -> Self {
        let mut headers = self.headers;
        headers.extend_from_slice(CLIENT_HEADER_LINE.as_bytes());
        let mut head = self.head;
        head.extend_from_slice(CLIENT_HEADER_LINE.as_bytes());
        RequestTemplate {
            method: self.method,
            head,
            headers,
        }
    }

    fn render(method: Method, path: &str, server: &Server, content_type: Option<&str>) -> Self {
        assert!(
            is_request_target(path),
            "requests use the origin form: {path:?}"
        );
        let mut headers = format!(" HTTP/1.1\r\nHost: {}\r\n", server.authority);
        if let Some(content_type) = content_type {
            headers += &format!("Content-Type: {content_type}\r\n");
        }
        let head = format!("{} {path}{headers}", method.as_str());
        RequestTemplate {
            method,
            head: head.into_bytes(),
            headers: headers.into_bytes(),
        }
    }

    /// The request to the template's own path.
    pub fn build<'a>(&'a self, body: &'a [u8]) -> Request<'a> {
        Request {
            template: self,
            target: None,
            body,
        }
    }

    /// The request with another target (a query that changes per request),
    /// which must pass [`is_request_target`].
    pub fn build_to<'a>(&'a self, target: &'a str, body: &'a [u8]) -> Request<'a> {
        assert!(
            is_request_target(target),
            "requests use the origin form: {target:?}"
        );
        Request {
            template: self,
            target: Some(target),
            body,
        }
    }
}

/// One request, borrowing its template and body.
#[derive(Clone, Copy)]
pub struct Request<'a> {
    template: &'a RequestTemplate,
    target: Option<&'a str>,
    body: &'a [u8],
}

impl Request<'_> {
    /// Appends the head: the request line, the fixed headers, the length and
    /// the blank line. A bodiless `GET` sends no `Content-Length`.
    fn render_head(&self, out: &mut Vec<u8>) {
        let template = self.template;
        match self.target {
            None => out.extend_from_slice(&template.head),
            Some(target) => {
                out.extend_from_slice(template.method.as_str().as_bytes());
                out.push(b' ');
                out.extend_from_slice(target.as_bytes());
                out.extend_from_slice(&template.headers);
            }
        }
        if template.method != Method::Get || !self.body.is_empty() {
            out.extend_from_slice(b"Content-Length: ");
            push_decimal(out, self.body.len() as u64);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
    }
}

/// Appends `n` in decimal.
fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// Whether `target` can stand in a request line as an origin-form target: a
/// path (and query) of visible ASCII, so no byte can end the line early.
pub fn is_request_target(target: &str) -> bool {
    target.starts_with('/') && target.bytes().all(|b| b.is_ascii_graphic())
}

/// The topic's path segment: bytes outside RFC 3986's unreserved set are
/// percent-encoded, so any name the user types reaches the server as typed.
pub fn topic_path(topic: &str, suffix: &str) -> String {
    let mut path = String::from("/v1/topics/");
    for byte in topic.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            path.push(byte as char);
        } else {
            path.push_str(&format!("%{byte:02X}"));
        }
    }
    path.push_str(suffix);
    path
}

/// The visibility timeout a broker gives a topic it does not set one for.
pub const VISIBILITY_DEFAULT: Duration = Duration::from_secs(30);

/// What a run needs to know of its topic, read from a Topic object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopicFacts {
    /// `visibility_timeout_ms` ([`VISIBILITY_DEFAULT`] if the answer has none).
    pub visibility: Duration,
    /// `partitions`, if the answer has it.
    pub partitions: Option<u32>,
}

/// The [`TopicFacts`] of a Topic object.
pub fn facts_of(topic_json: &str) -> TopicFacts {
    let topic = serde_json::from_str::<serde_json::Value>(topic_json).ok();
    let field = |name: &str| topic.as_ref().and_then(|t| t[name].as_u64());
    TopicFacts {
        visibility: field("visibility_timeout_ms")
            .map_or(VISIBILITY_DEFAULT, Duration::from_millis),
        partitions: field("partitions").and_then(|p| u32::try_from(p).ok()),
    }
}

/// Creates the topic and returns its facts; one that already exists (409) is
/// fine, and gives `None`.
pub async fn create_topic(
    conn: &mut Conn,
    server: &Server,
    topic: &str,
    partitions: u32,
    existing_ok: bool,
) -> Result<Option<TopicFacts>, String> {
    let body = serde_json::json!({"name": topic, "partitions": partitions}).to_string();
    let template = RequestTemplate::new(Method::Post, "/v1/topics", server, "application/json");
    let (status, text) = conn.send_collect(template.build(body.as_bytes())).await?;
    match status {
        201 => Ok(Some(facts_of(&text))),
        409 if existing_ok => Ok(None),
        _ => Err(format!("cannot create topic {topic:?}: {status} {text}")),
    }
}

/// Checks that the topic exists, so that a typo fails at once instead of as a
/// run of 404s, and returns its facts.
pub async fn check_topic(
    conn: &mut Conn,
    server: &Server,
    topic: &str,
) -> Result<TopicFacts, String> {
    let template = RequestTemplate::get(&topic_path(topic, ""), server);
    let (status, text) = conn.send_collect(template.build(&[])).await?;
    match status {
        200 => Ok(facts_of(&text)),
        404 => Err(format!(
            "topic {topic:?} does not exist (--create creates it)"
        )),
        _ => Err(format!("cannot read topic {topic:?}: {status} {text}")),
    }
}

/// Deletes the topic (a fresh one the run made).
pub async fn delete_topic(conn: &mut Conn, server: &Server, topic: &str) -> Result<(), String> {
    let template = RequestTemplate::new(
        Method::Delete,
        &topic_path(topic, ""),
        server,
        "application/json",
    );
    let (status, text) = conn.send_collect(template.build(&[])).await?;
    match status {
        204 => Ok(()),
        _ => Err(format!("cannot delete topic {topic:?}: {status} {text}")),
    }
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
