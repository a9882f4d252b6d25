//! The harness the black-box tests share: a `narad serve` child process on
//! loopback with a temporary data directory, and a minimal HTTP/1.1 client that
//! checks the bytes on the wire.
//!
//! Each test binary includes this module and uses what it needs. The API
//! helpers at the end (topics, produce, replay, polling with a deadline) serve
//! the topic and produce tests.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub mod prometheus;

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

    /// Like [`Node::start_shards`] with a `--config` file holding `json`.
    pub fn start_with_config(shards: usize, json: &str, env: &[(&str, &str)]) -> Node {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let file = dir.path().join("narad.json");
        std::fs::write(&file, json).unwrap();
        let data = dir.path().join("data");
        let mut node = Node::spawn_with(
            &data,
            shards,
            env,
            &[OsStr::new("--config"), file.as_os_str()],
        );
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
        Node::spawn_with(data, shards, env, &[])
    }

    /// Like [`Node::start_shards`], the process's open-file limit (soft and
    /// hard) set to `limit`.
    #[allow(dead_code)]
    pub fn start_with_open_files(limit: u64, shards: usize, env: &[(&str, &str)]) -> Node {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let data = dir.path().join("data");
        let mut node = Node::spawn_limited(&data, shards, env, &[], Some(limit));
        node._dir = Some(dir);
        node.await_ready();
        node
    }

    /// Like [`Node::spawn`] with more arguments to `narad serve`.
    pub fn spawn_with(data: &Path, shards: usize, env: &[(&str, &str)], args: &[&OsStr]) -> Node {
        Node::spawn_limited(data, shards, env, args, None)
    }

    fn spawn_limited(
        data: &Path,
        shards: usize,
        env: &[(&str, &str)],
        args: &[&OsStr],
        open_files: Option<u64>,
    ) -> Node {
        let mut command = Command::new(env!("CARGO_BIN_EXE_narad"));
        if let Some(limit) = open_files {
            use std::os::unix::process::CommandExt;
            let limit = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            // SAFETY: between fork and exec only `setrlimit`, which is
            // async-signal-safe, runs; nothing is allocated.
            unsafe {
                command.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        command
            .args(["serve", "--dev", "--port", "0", "--shards"])
            .arg(shards.to_string())
            .args(args)
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
    pub fn await_ready(&mut self) {
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
            if Instant::now() >= deadline {
                // What the node said meanwhile tells a stall from a slow start.
                let said: Vec<String> = self.log.try_iter().collect();
                panic!(
                    "not ready in time: {status:?}; the node's log since it listened: {said:#?}"
                );
            }
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
        wait_for_exit(&mut self.child, within)
    }
}

/// Waits for `child` to exit, at most `within` (the test fails past it).
pub fn wait_for_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "no exit within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child process killed (and reaped) when dropped.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `command`, a node that must refuse to start, until it ends: at most
/// 20 s, past which it is killed and the test fails (it started). Returns its
/// exit status and what it wrote on standard error.
pub fn run_to_refusal(command: &mut Command) -> (std::process::ExitStatus, String) {
    let mut child = KillOnDrop(
        command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // A node still running at the deadline did not refuse to start.
    let status = wait_for_exit(&mut child.0, WAIT_MAX);
    let mut message = String::new();
    let stderr = child.0.stderr.take().unwrap();
    std::io::BufReader::new(stderr)
        .read_to_string(&mut message)
        .unwrap();
    (status, message)
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

/// How long a 202'd record may take to become visible to replay. The dispatcher
/// usually commits it within milliseconds; the bound only keeps a failing test
/// from hanging.
pub const VISIBLE_WAIT_MAX: Duration = Duration::from_secs(10);

/// The header that passes the 415 guard with a JSON body.
pub const JSON: [(&str, &str); 1] = [("content-type", "application/json")];
/// The header that passes the 415 guard with a raw body.
pub const OCTET: [(&str, &str); 1] = [("content-type", "application/octet-stream")];

/// Calls `probe` every 20 ms until it returns `Some`, and panics naming `what`
/// when `within` has passed first.
pub fn wait_until<T>(within: Duration, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The body as JSON; panics with the body when it is not.
pub fn json_of(response: &Response) -> serde_json::Value {
    serde_json::from_slice(&response.bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {response:?}"))
}

/// The message of an error answer, checking that the body is exactly
/// `{"error": "..."}` with the JSON content type.
pub fn error_of(response: &Response) -> String {
    assert_eq!(
        response.header("content-type"),
        Some("application/json"),
        "{response:?}"
    );
    let body = json_of(response);
    let object = body.as_object().unwrap_or_else(|| panic!("{body}"));
    assert_eq!(object.len(), 1, "an error body has one field: {body}");
    let message = object["error"].as_str().unwrap_or_else(|| panic!("{body}"));
    assert!(!message.is_empty(), "{body}");
    message.to_string()
}

/// `POST /v1/topics` with a JSON body.
pub fn post_topic(client: &mut Client, body: &str) -> Response {
    client.request("POST", "/v1/topics", &JSON, body).unwrap()
}

/// Creates `name` with the defaults and returns the Topic object.
pub fn create_topic(client: &mut Client, name: &str) -> serde_json::Value {
    let response = post_topic(client, &serde_json::json!({ "name": name }).to_string());
    assert_eq!(response.status, 201, "create {name}: {response:?}");
    json_of(&response)
}

/// `GET /v1/topics/{topic}`, answered 200, as JSON.
pub fn get_topic(client: &mut Client, topic: &str) -> serde_json::Value {
    let response = client
        .request("GET", &format!("/v1/topics/{topic}"), &[], "")
        .unwrap();
    assert_eq!(response.status, 200, "get {topic}: {response:?}");
    json_of(&response)
}

/// The `next_offset` of every partition of `topic`, in partition order.
pub fn next_offsets(client: &mut Client, topic: &str) -> Vec<u64> {
    let topic = get_topic(client, topic);
    topic["partition_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|stats| stats["next_offset"].as_u64().unwrap())
        .collect()
}

/// `POST /v1/topics/{topic}/produce?{query}` with a raw body.
pub fn produce(client: &mut Client, topic: &str, query: &str, payload: &[u8]) -> Response {
    let path = match query {
        "" => format!("/v1/topics/{topic}/produce"),
        query => format!("/v1/topics/{topic}/produce?{query}"),
    };
    client.request("POST", &path, &OCTET, payload).unwrap()
}

/// Like [`produce`], checking the 202 with an empty body.
pub fn produce_ok(client: &mut Client, topic: &str, query: &str, payload: &[u8]) {
    let response = produce(client, topic, query, payload);
    assert_eq!(
        (response.status, response.bytes.len()),
        (202, 0),
        "produce to {topic}?{query}: {response:?}"
    );
}

/// Leases one message of `partition` (waiting up to 2 s for one) and returns
/// its receipt handle.
pub fn lease_one(client: &mut Client, topic: &str, partition: u32) -> String {
    let path = format!("/v1/topics/{topic}/consume?partition={partition}&wait=2s");
    let response = client.request("GET", &path, &[], "").unwrap();
    assert_eq!(response.status, 200, "{response:?}");
    json_of(&response)["receipt_handle"]
        .as_str()
        .unwrap()
        .to_string()
}

/// `GET /v1/topics/{topic}/consume?partition=P&offset=O`.
pub fn replay(client: &mut Client, topic: &str, partition: u32, offset: u64) -> Response {
    let path = format!("/v1/topics/{topic}/consume?partition={partition}&offset={offset}");
    client.request("GET", &path, &[], "").unwrap()
}

/// The records of a partition visible now from offset `from`, up to the first 204.
/// Panics on any other answer, and when a message is not the one asked for.
pub fn replay_from(
    client: &mut Client,
    topic: &str,
    partition: u32,
    from: u64,
) -> Vec<serde_json::Value> {
    let mut messages = Vec::new();
    for offset in from.. {
        let response = replay(client, topic, partition, offset);
        match response.status {
            204 => return messages,
            200 => {
                let message = json_of(&response);
                assert_eq!(message["topic"], topic, "{message}");
                assert_eq!(message["partition"], partition, "{message}");
                assert_eq!(message["offset"], offset, "{message}");
                messages.push(message);
            }
            _ => panic!("replay {topic}/{partition}@{offset}: {response:?}"),
        }
    }
    unreachable!("offsets do not run out")
}

/// Every record of a partition visible now.
pub fn replay_all(client: &mut Client, topic: &str, partition: u32) -> Vec<serde_json::Value> {
    replay_from(client, topic, partition, 0)
}

/// Polls a partition until at least `count` records are visible, and returns them.
pub fn wait_for_records(
    client: &mut Client,
    topic: &str,
    partition: u32,
    count: usize,
) -> Vec<serde_json::Value> {
    let mut seen = Vec::new();
    let what = format!("{count} records visible in {topic}/{partition}");
    wait_until(VISIBLE_WAIT_MAX, &what, || {
        let more = replay_from(client, topic, partition, seen.len() as u64);
        seen.extend(more);
        (seen.len() >= count).then_some(())
    });
    seen
}

/// Polls a partition until every one of `expected` is visible, and returns
/// the distinct payloads in the order they first appear (a record committed
/// twice counts once; anything not expected is kept and fails the caller).
pub fn wait_for_payloads(
    client: &mut Client,
    topic: &str,
    partition: u32,
    expected: &[String],
) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    let what = format!("{} distinct records in {topic}/{partition}", expected.len());
    wait_until(VISIBLE_WAIT_MAX, &what, || {
        let texts = payload_texts(&replay_all(client, topic, partition));
        seen.clear();
        for text in texts {
            if !seen.contains(&text) {
                seen.push(text);
            }
        }
        expected.iter().all(|e| seen.contains(e)).then_some(())
    });
    seen
}

/// Polls every partition of `topic` until `total` records are visible in all
/// (more is a failure), and returns each partition's records.
pub fn wait_for_total(
    client: &mut Client,
    topic: &str,
    partitions: u32,
    total: usize,
    within: Duration,
) -> Vec<Vec<serde_json::Value>> {
    let mut seen = vec![Vec::new(); partitions as usize];
    let what = format!("{total} records visible in {topic}");
    wait_until(within, &what, || {
        for (partition, records) in seen.iter_mut().enumerate() {
            let from = records.len() as u64;
            records.extend(replay_from(client, topic, partition as u32, from));
        }
        let visible: usize = seen.iter().map(Vec::len).sum();
        assert!(visible <= total, "more than {total} records in {topic}");
        (visible == total).then_some(())
    });
    seen
}

/// The text payloads of replayed messages; panics on any other payload.
pub fn payload_texts(messages: &[serde_json::Value]) -> Vec<String> {
    let text = |m: &serde_json::Value| m["payload"].as_str().map(str::to_string);
    messages
        .iter()
        .map(|m| text(m).unwrap_or_else(|| panic!("not a text payload: {m}")))
        .collect()
}

/// Now, in Unix seconds (the unit of `created_at` and `timestamp`).
pub fn unix_now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Posts a batch document to `topic` with `query` (`?…` or empty).
pub fn post_batch(
    client: &mut Client,
    topic: &str,
    query: &str,
    headers: &[(&str, &str)],
    body: impl AsRef<[u8]>,
) -> Response {
    let path = format!("/v1/topics/{topic}/produce/batch{query}");
    client.request("POST", &path, headers, body).unwrap()
}

/// `data` gzip-compressed.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

/// A batch produce document of `messages`.
pub fn batch_doc(messages: &[Value]) -> String {
    json!({ "messages": messages }).to_string()
}

/// Posts a batch of `count` messages, checking the 202 `{"accepted": count}`.
pub fn batch_ok(
    client: &mut Client,
    topic: &str,
    headers: &[(&str, &str)],
    body: impl AsRef<[u8]>,
    count: usize,
) {
    let response = post_batch(client, topic, "", headers, body);
    assert_eq!(response.status, 202, "{response:?}");
    assert_eq!(json_of(&response), json!({ "accepted": count }));
}

/// The directory of partition `partition` of the one incarnation of `topic`
/// under the data directory `data`.
pub fn partition_dir(data: &Path, topic: &str, partition: u32) -> std::path::PathBuf {
    let incarnations: Vec<_> = std::fs::read_dir(data.join("topics").join(topic))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    assert_eq!(incarnations.len(), 1, "{incarnations:?}");
    incarnations[0].join(format!("p{partition:05}"))
}

/// The `.log` segment files of a partition directory.
pub fn log_segments(partition: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(partition)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "log"))
        .collect()
}

/// What the node sends before it closes the connection, which must happen
/// after about the 1 s read timeout the test configured.
pub fn rest_after_one_second_timeout(client: &mut Client) -> String {
    let started = Instant::now();
    let mut rest = Vec::new();
    let _ = client.stream.read_to_end(&mut rest);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(800) && waited < Duration::from_secs(8),
        "closed after {waited:?}"
    );
    String::from_utf8_lossy(&rest).into_owned()
}
