//! The harness the black-box tests share: a `narad serve` child process on
//! loopback with a temporary data directory, and a minimal HTTP/1.1 client that
//! checks the bytes on the wire.
//!
//! Each test binary includes this module and uses what it needs.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Every wait in these tests ends by this deadline.
pub const WAIT_MAX: Duration = Duration::from_secs(20);

/// A running node; killed (if still running) when dropped.
pub struct Node {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: Receiver<String>,
    /// The data directory.
    pub data: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    /// Starts `narad serve --dev --port 0 --shards 2` with extra environment in a
    /// new temporary data directory, and waits until it is ready.
    pub fn start(env: &[(&str, &str)]) -> Node {
        Node::start_shards(2, env)
    }

    /// Like [`Node::start`] with `shards` shards.
    pub fn start_shards(shards: usize, env: &[(&str, &str)]) -> Node {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let data = dir.path().join("data");
        let mut node = Node::spawn(&data, shards, env);
        node._dir = Some(dir);
        node.await_ready();
        node
    }

    /// Starts a node over an existing data directory (a restart), and waits until
    /// it is ready. The caller keeps the directory.
    pub fn start_in(data: &Path, shards: usize, env: &[(&str, &str)]) -> Node {
        let mut node = Node::spawn(data, shards, env);
        node.await_ready();
        node
    }

    /// Starts the process without waiting for it.
    pub fn spawn(data: &Path, shards: usize, env: &[(&str, &str)]) -> Node {
        let mut command = Command::new(env!("CARGO_BIN_EXE_narad"));
        command
            .args(["serve", "--dev", "--port", "0", "--shards"])
            .arg(shards.to_string())
            .args(["--log-format", "text", "--data-dir"])
            .arg(data)
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
        Node {
            child,
            addr: "127.0.0.1:1".parse().unwrap(),
            log,
            data: data.to_path_buf(),
            _dir: None,
        }
    }

    /// Reads the address from the `listening` line and waits until ready.
    fn await_ready(&mut self) {
        let node = self;
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
    }

    pub fn wait_for_log(&mut self, needle: &str) -> String {
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

    pub fn wait_until_ready(&self) {
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

    pub fn client(&self) -> Client {
        Client::connect(self.addr).unwrap()
    }

    /// A connection that has been served once. A connection slot is given back
    /// when the server notices the close, a moment after the client's: a refused
    /// attempt is retried until the deadline.
    pub fn served_client(&self) -> Client {
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

    /// Kills the process with SIGKILL and reaps it.
    pub fn sigkill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn sigterm(&self) {
        // SAFETY: sends SIGTERM to the child this test started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
    }

    pub fn wait_for_exit(&mut self, within: Duration) -> std::process::ExitStatus {
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
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// The body as sent.
    pub bytes: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A minimal HTTP/1.1 client: one connection, requests in turn, bodies framed by
/// Content-Length (all this server sends).
pub struct Client {
    pub stream: TcpStream,
    buffered: Vec<u8>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> std::io::Result<Client> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Client {
            stream,
            buffered: Vec::new(),
        })
    }

    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: impl AsRef<[u8]>,
    ) -> std::io::Result<Response> {
        let body = body.as_ref();
        let mut head = format!("{method} {path} HTTP/1.1\r\nhost: test\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if !body.is_empty() {
            head.push_str(&format!("content-length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        let mut wire = head.into_bytes();
        wire.extend_from_slice(body);
        self.stream.write_all(&wire)?;
        self.read_response(method == "HEAD")
    }

    pub fn read_response(&mut self, head_only: bool) -> std::io::Result<Response> {
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
        let bytes: Vec<u8> = self.buffered.drain(..length).collect();
        Ok(Response {
            status,
            headers,
            body: String::from_utf8_lossy(&bytes).to_string(),
            bytes,
        })
    }

    pub fn fill(&mut self) -> std::io::Result<()> {
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
    pub fn is_closed_by_server(&mut self) -> bool {
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

/// Where `needle` first occurs in `haystack`.
pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
