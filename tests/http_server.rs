//! The HTTP server of `narad serve` as a client sees it, over loopback: health and
//! readiness, route errors, keep-alive, the header limit, the header-read timeout,
//! the connection limit, and the graceful stop.
//!
//! Each test starts the real binary with two shards on a free port, reads the
//! address from its `listening` log line and talks plain HTTP/1.1 over
//! `std::net::TcpStream`, so what is checked is the bytes on the wire.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Every wait in these tests ends by this deadline.
const WAIT_MAX: Duration = Duration::from_secs(20);

/// A running node; killed (if still running) when dropped.
struct Node {
    child: Child,
    addr: SocketAddr,
    log: Receiver<String>,
    _dir: tempfile::TempDir,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    /// Starts `narad serve --dev --port 0 --shards 2` with extra environment, and
    /// waits until it is ready.
    fn start(env: &[(&str, &str)]) -> Node {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_narad"));
        command
            .args(["serve", "--dev", "--port", "0", "--shards", "2"])
            .args(["--log-format", "text", "--data-dir"])
            .arg(dir.path().join("data"))
            .env_remove("NARAD_SECURITY_ENABLED")
            .env_remove("NARAD_HTTP_ADDR")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, log) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut node = Node {
            child,
            addr: "127.0.0.1:1".parse().unwrap(),
            log,
            _dir: dir,
        };
        let line = node.wait_for_log("listening");
        let addr = line
            .split_whitespace()
            .find_map(|field| field.strip_prefix("addr="))
            .unwrap_or_else(|| panic!("no addr= in {line:?}"));
        node.addr = addr.parse().unwrap();
        assert!(
            node.addr.ip().is_loopback(),
            "--dev listens on loopback: {line}"
        );
        assert_ne!(node.addr.port(), 0);
        node.wait_until_ready();
        node
    }

    fn wait_for_log(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + WAIT_MAX;
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            match self.log.recv_timeout(Duration::from_millis(100)) {
                Ok(line) if line.contains(needle) => return line,
                Ok(line) => seen.push(line),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        panic!("no log line containing {needle:?}; saw {seen:#?}");
    }

    fn wait_until_ready(&self) {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            let status = Client::connect(self.addr)
                .and_then(|mut c| c.request("GET", "/readyz", &[], ""))
                .map(|r| r.status);
            if let Ok(200) = status {
                return;
            }
            assert!(Instant::now() < deadline, "not ready in time: {status:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn client(&self) -> Client {
        Client::connect(self.addr).unwrap()
    }

    /// A connection that has been served once. A connection slot is given back
    /// when the server notices the close, a moment after the client's: a refused
    /// attempt is retried until the deadline.
    fn served_client(&self) -> Client {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            let mut client = self.client();
            let status = client.request("GET", "/healthz", &[], "").map(|r| r.status);
            if let Ok(200) = status {
                return client;
            }
            assert!(
                Instant::now() < deadline,
                "no free connection slot: {status:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn sigterm(&self) {
        // SAFETY: sends SIGTERM to the child this test started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
    }

    fn wait_for_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "no exit within {within:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[derive(Debug)]
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A minimal HTTP/1.1 client: one connection, requests in turn, bodies framed by
/// Content-Length (all this server sends).
struct Client {
    stream: TcpStream,
    buffered: Vec<u8>,
}

impl Client {
    fn connect(addr: SocketAddr) -> std::io::Result<Client> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Client {
            stream,
            buffered: Vec::new(),
        })
    }

    fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> std::io::Result<Response> {
        let mut head = format!("{method} {path} HTTP/1.1\r\nhost: test\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if !body.is_empty() {
            head.push_str(&format!("content-length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        head.push_str(body);
        self.stream.write_all(head.as_bytes())?;
        self.read_response(method == "HEAD")
    }

    fn read_response(&mut self, head_only: bool) -> std::io::Result<Response> {
        let end = loop {
            if let Some(at) = find(&self.buffered, b"\r\n\r\n") {
                break at;
            }
            self.fill()?;
        };
        let head = String::from_utf8_lossy(&self.buffered[..end]).to_string();
        self.buffered.drain(..end + 4);
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
            .collect();
        let length: usize = match head_only {
            true => 0,
            false => headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
                .map_or(0, |(_, v)| v.parse().unwrap()),
        };
        while self.buffered.len() < length {
            self.fill()?;
        }
        let body = String::from_utf8_lossy(&self.buffered[..length]).to_string();
        self.buffered.drain(..length);
        Ok(Response {
            status,
            headers,
            body,
        })
    }

    fn fill(&mut self) -> std::io::Result<()> {
        let mut chunk = [0u8; 16 << 10];
        let n = self.stream.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.buffered.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    /// Whether the server closed the connection: a read ends with end of file (or a
    /// reset) rather than data or a timeout.
    fn is_closed_by_server(&mut self) -> bool {
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[test]
fn health_readiness_and_route_errors_share_one_keep_alive_connection() {
    let node = Node::start(&[]);
    let mut client = node.client();

    let health = client.request("GET", "/healthz", &[], "").unwrap();
    assert_eq!(
        (health.status, health.body.as_str()),
        (200, r#"{"status":"ok"}"#)
    );
    assert_eq!(health.header("content-type"), Some("application/json"));

    let ready = client.request("GET", "/readyz", &[], "").unwrap();
    assert_eq!(
        (ready.status, ready.body.as_str()),
        (200, r#"{"status":"ready"}"#)
    );

    let missing = client.request("GET", "/v1/nothing", &[], "").unwrap();
    assert_eq!(missing.status, 404);
    assert!(missing
        .header("content-type")
        .unwrap()
        .starts_with("text/plain"));
    assert_eq!(missing.body, "404 page not found\n");

    let wrong = client
        .request(
            "POST",
            "/healthz",
            &[("content-type", "application/json")],
            "{}",
        )
        .unwrap();
    assert_eq!(wrong.status, 405);
    assert_eq!(wrong.header("allow"), Some("GET, HEAD"));
    assert!(wrong
        .header("content-type")
        .unwrap()
        .starts_with("text/plain"));

    let head = client.request("HEAD", "/healthz", &[], "").unwrap();
    assert_eq!(head.status, 200);

    // Keep-alive: every answer above came over the one connection, and it still
    // serves.
    for _ in 0..5 {
        assert_eq!(
            client.request("GET", "/healthz", &[], "").unwrap().status,
            200
        );
    }
}

#[test]
fn headers_over_the_limit_are_431() {
    let node = Node::start(&[]);
    let mut client = node.client();
    let big = "a".repeat(70 << 10);
    let response = client
        .request("GET", "/healthz", &[("x-big", &big)], "")
        .unwrap();
    assert_eq!(response.status, 431);
    // Headers under the limit still pass.
    let mut client = node.client();
    let fair = "a".repeat(60 << 10);
    let response = client
        .request("GET", "/healthz", &[("x-fair", &fair)], "")
        .unwrap();
    assert_eq!(response.status, 200);
}

#[test]
fn a_client_that_trickles_its_headers_is_cut_off_after_the_read_timeout() {
    let node = Node::start(&[("NARAD_HTTP_READ_TIMEOUT", "1s")]);
    let mut client = node.client();
    client
        .stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: test\r\n")
        .unwrap();
    let started = Instant::now();
    // hyper answers 408 or just closes; either way the connection ends.
    let mut rest = Vec::new();
    let _ = client.stream.read_to_end(&mut rest);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(800) && waited < Duration::from_secs(8),
        "closed after {waited:?}"
    );
    let rest = String::from_utf8_lossy(&rest);
    assert!(
        rest.is_empty() || rest.starts_with("HTTP/1.1 408"),
        "{rest}"
    );
}

#[test]
fn connections_over_the_node_limit_are_answered_503_and_closed() {
    let node = Node::start(&[("NARAD_HTTP_MAX_CONNECTIONS", "2")]);
    // Two connections hold both slots (each has been served, so both are open).
    let first = node.served_client();
    let mut second = node.served_client();

    let mut third = node.client();
    let refused = third.request("GET", "/healthz", &[], "").unwrap();
    assert_eq!(refused.status, 503);
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(refused.body, r#"{"error":"too many connections"}"#);
    assert!(third.is_closed_by_server());

    // A freed slot is taken again.
    drop(first);
    node.served_client();
    assert_eq!(
        second.request("GET", "/healthz", &[], "").unwrap().status,
        200
    );
}

#[test]
fn sigterm_drains_connections_and_exits_zero_within_the_grace() {
    let grace = Duration::from_secs(3);
    let mut node = Node::start(&[
        ("NARAD_HTTP_SHUTDOWN_GRACE", "3s"),
        ("NARAD_HTTP_MAX_CONSUME_WAIT", "1s"),
    ]);
    // One connection has been served and sits idle; one has connected and has not
    // sent anything yet.
    let mut served = node.client();
    assert_eq!(
        served.request("GET", "/healthz", &[], "").unwrap().status,
        200
    );
    let mut fresh = node.client();
    // Let the node accept the fresh connection before the stop.
    std::thread::sleep(Duration::from_millis(200));

    let stopped_at = Instant::now();
    node.sigterm();
    node.wait_for_log("stopping");
    // A request arriving while the node drains is told to go elsewhere.
    let answer = fresh.request("GET", "/healthz", &[], "").unwrap();
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.header("retry-after"), Some("1"));
    assert_eq!(answer.body, r#"{"error":"shutting down"}"#);
    assert!(fresh.is_closed_by_server());
    // The idle connection is closed rather than kept to the end of the grace.
    assert!(served.is_closed_by_server());

    let status = node.wait_for_exit(grace + Duration::from_secs(5));
    assert!(status.success(), "graceful stop exits 0, got {status}");
    assert!(
        stopped_at.elapsed() < grace + Duration::from_secs(5),
        "stop took {:?}",
        stopped_at.elapsed()
    );
    node.wait_for_log("stopped");
    assert!(TcpStream::connect_timeout(&node.addr, Duration::from_secs(1)).is_err());
}
