//! The load generator's side of the wire: the server address, one keep-alive
//! HTTP/1.1 connection per worker, and the two setup calls (create the topic,
//! check that it exists).
//!
//! Which cores: the generator's single executor. A [`Conn`] is `!Send`: its
//! socket and the task that drives hyper's connection state machine both live
//! on the executor that opened it.
//!
//! A connection carries one request at a time (no pipelining), as a real
//! request/response client does; concurrency comes from the number of workers.
//! Each response body is read to its end before the next request, because
//! hyper can only reuse a connection whose previous response was consumed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderValue, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode, Uri};

/// The most bytes of a setup response kept for an error message.
const SETUP_BODY_BYTES_MAX: usize = 64 << 10;
/// The largest response body [`Conn::send_into`] keeps: above the broker's
/// bound on a batch consume reply (8 MiB).
pub const REPLY_BYTES_MAX: usize = 16 << 20;
/// The `X-Narad-Client` header that batch consume and bodiless acks need.
pub const CLIENT_HEADER: &str = "x-narad-client";

/// Where the broker listens: `http://host:port`, with an IP address or
/// `localhost` as the host (no name resolution, no TLS).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    pub addr: SocketAddr,
    /// `host:port` as the user wrote it, sent as the `Host` header.
    pub authority: HeaderValue,
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
        let authority = HeaderValue::from_str(rest).map_err(|_| refuse("bad host"))?;
        Ok(Server {
            addr: SocketAddr::new(ip, port),
            authority,
        })
    }
}

/// Why a request got no HTTP answer.
pub type TransportError = String;

/// One keep-alive HTTP/1.1 connection.
pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
}

impl Conn {
    /// Connects and starts the task that drives the connection. The task ends
    /// when the server closes the connection or when this `Conn` is dropped.
    pub async fn open(server: &Server) -> Result<Conn, TransportError> {
        let stream = narad_io::net::connect(server.addr)
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", server.addr))?;
        let (sender, connection) = hyper::client::conn::http1::handshake(stream)
            .await
            .map_err(|e| format!("HTTP handshake with {} failed: {e}", server.addr))?;
        narad_io::rt::spawn_local(async move {
            // Its end is seen by the sender as a failed request; nothing to add.
            let _ = connection.await;
        });
        Ok(Conn { sender })
    }

    /// Sends one request once the connection is ready; the response's head.
    async fn start(
        &mut self,
        request: Request<Full<Bytes>>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, TransportError> {
        self.sender.ready().await.map_err(|e| e.to_string())?;
        self.sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())
    }

    /// Sends one request and reads its whole response, discarding the body.
    pub async fn send(
        &mut self,
        request: Request<Full<Bytes>>,
    ) -> Result<StatusCode, TransportError> {
        let response = self.start(request).await?;
        let status = response.status();
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            frame.map_err(|e| e.to_string())?;
        }
        Ok(status)
    }

    /// Sends one request and reads its body into `body` (cleared first), whose
    /// allocation is reused from one request to the next. A body above
    /// [`REPLY_BYTES_MAX`] is an error.
    pub async fn send_into(
        &mut self,
        request: Request<Full<Bytes>>,
        body: &mut Vec<u8>,
    ) -> Result<StatusCode, TransportError> {
        body.clear();
        let response = self.start(request).await?;
        let status = response.status();
        let mut incoming = response.into_body();
        let mut too_long = false;
        while let Some(frame) = incoming.frame().await {
            let frame = frame.map_err(|e| e.to_string())?;
            if let Some(data) = frame.data_ref() {
                too_long |= body.len() + data.len() > REPLY_BYTES_MAX;
                if !too_long {
                    body.extend_from_slice(data);
                }
            }
        }
        if too_long {
            return Err(format!("a reply exceeded {REPLY_BYTES_MAX} bytes"));
        }
        Ok(status)
    }

    /// Sends one request and returns the status and (the start of) the body.
    pub async fn send_collect(
        &mut self,
        request: Request<Full<Bytes>>,
    ) -> Result<(StatusCode, String), TransportError> {
        self.sender.ready().await.map_err(|e| e.to_string())?;
        let response = self
            .sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let mut body = response.into_body();
        let mut kept = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| e.to_string())?;
            if let Some(data) = frame.data_ref() {
                let room = SETUP_BODY_BYTES_MAX - kept.len();
                kept.extend_from_slice(&data[..data.len().min(room)]);
            }
        }
        assert!(kept.len() <= SETUP_BODY_BYTES_MAX);
        Ok((status, String::from_utf8_lossy(&kept).trim().to_string()))
    }
}

/// A request sent many times: everything but the body is built once, and the
/// body is a shared `Bytes`, so building a request copies no payload.
pub struct RequestTemplate {
    method: Method,
    uri: Uri,
    host: HeaderValue,
    content_type: Option<HeaderValue>,
    /// Sends `X-Narad-Client`.
    client: bool,
}

impl RequestTemplate {
    pub fn new(method: Method, path: &str, server: &Server, content_type: &'static str) -> Self {
        let uri: Uri = path.parse().expect("paths are built from encoded parts");
        assert!(uri.authority().is_none(), "requests use the origin form");
        RequestTemplate {
            method,
            uri,
            host: server.authority.clone(),
            content_type: Some(HeaderValue::from_static(content_type)),
            client: false,
        }
    }

    /// A bodiless `GET`.
    pub fn get(path: &str, server: &Server) -> Self {
        RequestTemplate {
            content_type: None,
            ..RequestTemplate::new(Method::GET, path, server, "text/plain")
        }
    }

    /// Also sends `X-Narad-Client`, as batch consume and bodiless acks need.
    pub fn with_client_header(self) -> Self {
        RequestTemplate {
            client: true,
            ..self
        }
    }

    pub fn build(&self, body: Bytes) -> Request<Full<Bytes>> {
        self.build_to(self.uri.clone(), body)
    }

    /// The request with another target (a query that changes per request).
    pub fn build_to(&self, uri: Uri, body: Bytes) -> Request<Full<Bytes>> {
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = uri;
        let headers = request.headers_mut();
        headers.insert(HOST, self.host.clone());
        if let Some(content_type) = &self.content_type {
            headers.insert(CONTENT_TYPE, content_type.clone());
        }
        if self.client {
            headers.insert(CLIENT_HEADER, HeaderValue::from_static("narad-bench"));
        }
        request
    }
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

/// Creates the topic; one that already exists (409) is fine.
pub async fn create_topic(
    conn: &mut Conn,
    server: &Server,
    topic: &str,
    partitions: u32,
) -> Result<(), String> {
    let body = serde_json::json!({"name": topic, "partitions": partitions}).to_string();
    let template = RequestTemplate::new(Method::POST, "/v1/topics", server, "application/json");
    let (status, text) = conn.send_collect(template.build(Bytes::from(body))).await?;
    match status {
        StatusCode::CREATED | StatusCode::CONFLICT => Ok(()),
        _ => Err(format!("cannot create topic {topic:?}: {status} {text}")),
    }
}

/// Checks that the topic exists, so that a typo fails at once instead of as a
/// run of 404s.
pub async fn check_topic(conn: &mut Conn, server: &Server, topic: &str) -> Result<(), String> {
    let template = RequestTemplate::get(&topic_path(topic, ""), server);
    let (status, text) = conn.send_collect(template.build(Bytes::new())).await?;
    match status {
        StatusCode::OK => Ok(()),
        StatusCode::NOT_FOUND => Err(format!(
            "topic {topic:?} does not exist (--create creates it)"
        )),
        _ => Err(format!("cannot read topic {topic:?}: {status} {text}")),
    }
}

/// Deletes the topic (a fresh one the run made).
pub async fn delete_topic(conn: &mut Conn, server: &Server, topic: &str) -> Result<(), String> {
    let template = RequestTemplate::new(
        Method::DELETE,
        &topic_path(topic, ""),
        server,
        "application/json",
    );
    let (status, text) = conn.send_collect(template.build(Bytes::new())).await?;
    match status {
        StatusCode::NO_CONTENT => Ok(()),
        _ => Err(format!("cannot delete topic {topic:?}: {status} {text}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_accepts_ip_and_localhost_with_a_port() {
        let s = Server::parse("http://127.0.0.1:7942").unwrap();
        assert_eq!(s.addr, "127.0.0.1:7942".parse().unwrap());
        assert_eq!(s.authority, "127.0.0.1:7942");
        let s = Server::parse("http://localhost:80/").unwrap();
        assert_eq!(s.addr, "127.0.0.1:80".parse().unwrap());
        let s = Server::parse("http://[::1]:9000").unwrap();
        assert_eq!(s.addr, "[::1]:9000".parse().unwrap());
    }

    #[test]
    fn server_refuses_anything_else() {
        for bad in [
            "https://127.0.0.1:7942",
            "127.0.0.1:7942",
            "http://127.0.0.1",
            "http://127.0.0.1:0",
            "http://example.com:7942",
            "http://127.0.0.1:7942/v1",
            "http://::1:7942",
            "http://[127.0.0.1]:7942",
            "http://u@127.0.0.1:7942",
        ] {
            assert!(Server::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn topic_path_encodes_reserved_bytes() {
        assert_eq!(
            topic_path("orders.v1", "/produce"),
            "/v1/topics/orders.v1/produce"
        );
        assert_eq!(topic_path("a b/c", ""), "/v1/topics/a%20b%2Fc");
    }
}
