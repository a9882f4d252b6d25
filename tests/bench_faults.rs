//! `narad bench` against servers that misbehave, and how a run ends: a server
//! that never answers, one that answers anything but 202, one that goes away
//! and comes back (a restarting broker), and a run told to stop (Ctrl-C,
//! SIGTERM). The servers here are scripted in the test; the runs beside a
//! real node are in `bench_cli.rs`.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{Node, WAIT_MAX};

fn stderr_lines(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Waits for `child` to exit within `within` of `started`; kills it and fails,
/// saying it still `does`, past that.
fn exit_within(
    child: &mut std::process::Child,
    started: Instant,
    within: Duration,
    does: &str,
) -> std::process::ExitStatus {
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the run still {does} after {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A server that accepts connections and reads what comes, and never answers.
fn silent_server() -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let thread = std::thread::spawn(move || {
        listener.set_nonblocking(true).unwrap();
        let started = std::time::Instant::now();
        let mut held = Vec::new();
        // Bounded: the test is over well before this.
        while started.elapsed() < Duration::from_secs(60) {
            match listener.accept() {
                Ok((conn, _)) => held.push(conn),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    });
    (addr, thread)
}

#[test]
fn a_server_that_never_answers_cannot_hang_a_run() {
    let (addr, _server) = silent_server();
    let started = std::time::Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["bench", "-s", &format!("http://{addr}"), "orders"])
        .args(["--duration", "1", "--workers", "2", "--timeout", "2"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = exit_within(
        &mut child,
        started,
        Duration::from_secs(30),
        "waits for an answer",
    );
    assert!(!status.success(), "a run with no answer cannot succeed");
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no answer within"), "{stderr}");
}

/// A Ctrl-C ends a run at once, whatever it waits for: an open loop's next
/// request (due seconds later), or the answers of a server that never
/// answers (the requests in flight get a short grace, not the whole
/// `--timeout`).
#[test]
fn a_ctrl_c_ends_a_run_waiting_for_its_schedule_or_a_silent_server() {
    let node = Node::start(&[]);
    let (silent, _server) = silent_server();
    let cases: [(String, &[&str]); 2] = [
        (
            format!("http://{}", node.addr),
            &["slow", "--create", "--rate", "0.1", "--duration", "60"],
        ),
        (
            format!("http://{silent}"),
            &["orders", "--duration", "60", "--workers", "2"],
        ),
    ];
    for (server, args) in cases {
        let mut child = Command::new(env!("CARGO_BIN_EXE_narad"))
            .args(["bench", "-s", &server])
            .args(args)
            .env_remove("NARAD_ADDR")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1_500));
        // SAFETY: sends SIGINT to the child this test started.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let started = Instant::now();
        exit_within(
            &mut child,
            started,
            Duration::from_secs(6),
            &format!("runs on after SIGINT ({args:?})"),
        );
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("interrupted"), "{args:?}: {stderr}");
    }
}

/// A server that answers every request `200 OK` with an empty JSON object, as
/// something other than the broker listening on the port might.
fn always_200_server() -> std::net::SocketAddr {
    scripted_server(|_| ("200 OK", "{}"))
}

/// The status line and the JSON body of the `n`th request's answer (from 0,
/// over all connections).
type Script = fn(usize) -> (&'static str, &'static str);

/// A server that answers each request as `script` says.
fn scripted_server(script: Script) -> std::net::SocketAddr {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || {
        for conn in listener.incoming().take(8) {
            let Ok(conn) = conn else { return };
            let served = served.clone();
            std::thread::spawn(move || answer_requests(conn, script, &served));
        }
    });
    addr
}

/// Answers each request on `conn` as `script(n)` says (`n` counting the
/// requests of every connection), until the connection ends.
fn answer_requests(
    mut conn: std::net::TcpStream,
    script: Script,
    served: &std::sync::atomic::AtomicUsize,
) {
    use std::io::{Read, Write};
    let mut buf = vec![0u8; 1 << 16];
    let mut pending = Vec::new();
    loop {
        let Ok(n) = conn.read(&mut buf) else { return };
        if n == 0 {
            return;
        }
        pending.extend_from_slice(&buf[..n]);
        // One answer per request head; the generator's bodies are small and
        // carry no blank line of their own.
        while let Some(end) = common::find(&pending, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end]).to_lowercase();
            let body = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |v| v.trim().parse::<usize>().unwrap());
            if pending.len() < end + 4 + body {
                break;
            }
            pending.drain(..end + 4 + body);
            let (line, body) = script(served.fetch_add(1, std::sync::atomic::Ordering::SeqCst));
            let reply = format!(
                "HTTP/1.1 {line}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            if conn.write_all(reply.as_bytes()).is_err() {
                return;
            }
        }
    }
}

/// A server that reads the topic (200) and takes produces (202) for half a
/// second, then goes away, refusing connections for `gap`, as a restarting
/// broker does, and then takes produces on the same port again.
fn server_that_goes_away_for(gap: Duration) -> std::net::SocketAddr {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    let script: Script = |n| match n {
        0 => ("200 OK", "{}"),
        _ => ("202 Accepted", "{}"),
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || {
        listener.set_nonblocking(true).unwrap();
        let started = Instant::now();
        let mut open = Vec::new();
        while started.elapsed() < Duration::from_millis(500) {
            match listener.accept() {
                Ok((conn, _)) => {
                    conn.set_nonblocking(false).unwrap();
                    open.push(conn.try_clone().unwrap());
                    let served = served.clone();
                    std::thread::spawn(move || answer_requests(conn, script, &served));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        drop(listener);
        for conn in open {
            let _ = conn.shutdown(std::net::Shutdown::Both);
        }
        std::thread::sleep(gap);
        let listener = std::net::TcpListener::bind(addr).unwrap();
        for conn in listener.incoming().take(16) {
            let Ok(conn) = conn else { return };
            let served = served.clone();
            std::thread::spawn(move || answer_requests(conn, script, &served));
        }
    });
    addr
}

/// A server that goes away for two seconds (a broker restarting) does not end
/// the run: the workers open connections again until it is back, and a
/// counted run gets its whole count acknowledged.
#[test]
fn a_run_goes_on_across_a_server_that_restarts() {
    let addr = server_that_goes_away_for(Duration::from_secs(2));
    let output = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["bench", "-s", &format!("http://{addr}"), "orders"])
        .args([
            "--count",
            "400",
            "--rate",
            "200",
            "--workers",
            "2",
            "--timeout",
            "5",
        ])
        .env_remove("NARAD_ADDR")
        .output()
        .unwrap();
    let lines = stderr_lines(&output);
    assert!(
        !lines.iter().any(|l| l.contains("ended early")),
        "{lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("produce: 400 ok")),
        "{lines:#?}"
    );
}

#[test]
fn a_counted_run_sends_failed_records_again_until_its_count_is_acknowledged() {
    // The topic is read first; then every third produce is refused.
    let addr = scripted_server(|n| {
        if n == 0 {
            ("200 OK", "{}")
        } else if n % 3 == 0 {
            ("503 Service Unavailable", "{}")
        } else {
            ("202 Accepted", "{}")
        }
    });
    let output = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["bench", "-s", &format!("http://{addr}"), "orders"])
        .args(["--count", "30", "--workers", "1", "--timeout", "5"])
        .env_remove("NARAD_ADDR")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("produce: 30 ok, 14 failed"), "{stderr}");
    assert!(stderr.contains("errors: 503×14"), "{stderr}");
}

#[test]
fn a_batch_is_acknowledged_only_by_a_202_that_accepts_all_its_records() {
    // The topic is read first; then the odd batches are answered for fewer
    // records than they carried (or with no count at all), the even ones in
    // full.
    let addr = scripted_server(|n| match n {
        0 => ("200 OK", "{}"),
        n if n % 4 == 1 => ("202 Accepted", r#"{"accepted":4}"#),
        n if n % 4 == 3 => ("202 Accepted", "{}"),
        _ => ("202 Accepted", r#"{"accepted":5}"#),
    });
    let output = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["bench", "-s", &format!("http://{addr}"), "orders"])
        .args(["--count", "20", "--batch", "5", "--workers", "1"])
        .args(["--timeout", "5"])
        .env_remove("NARAD_ADDR")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    // Which records of a short answer were stored is unknown: the whole
    // batch failed, and was sent again.
    assert!(stderr.contains("produce: 20 ok, 20 failed"), "{stderr}");
    assert!(stderr.contains("errors: unreadable×20"), "{stderr}");
}

#[test]
fn only_a_202_counts_as_an_acknowledged_produce() {
    let addr = always_200_server();
    let output = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["bench", "-s", &format!("http://{addr}"), "orders"])
        .args(["--count", "20", "--workers", "2", "--timeout", "5"])
        .env_remove("NARAD_ADDR")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    // The 20 records failed, were sent again and failed again: the failures
    // reached the count, and the run ended.
    assert!(stderr.contains("produce: 0 ok, 40 failed"), "{stderr}");
    assert!(stderr.contains("errors: 200×40"), "{stderr}");
}

#[test]
fn an_interrupted_run_reports_and_deletes_its_fresh_topic() {
    let node = Node::start(&[]);
    let mut client = node.client();
    let listed = |client: &mut common::Client| {
        let response = client.request("GET", "/v1/topics", &[], "").unwrap();
        common::json_of(&response)["topics"]
            .as_array()
            .unwrap()
            .len()
    };
    let dir = tempfile::tempdir().unwrap();
    // Ctrl-C, and a `kill` or `timeout` alike.
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let json = dir.path().join(format!("{signal}.json"));
        let report = dir.path().join(format!("{signal}.html"));
        // No topic: a flow on a fresh one, which the run must delete however
        // it ends; counted, so that the interrupt cuts the count short (a
        // counted run once panicked there and left the topic behind).
        let mut child = Command::new(env!("CARGO_BIN_EXE_narad"))
            .args(["bench", "-s", &format!("http://{}", node.addr)])
            .args(["--count", "100000000", "--workers", "4"])
            .arg("--json")
            .arg(&json)
            .arg("--report")
            .arg(&report)
            .env_remove("NARAD_ADDR")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        common::wait_until(WAIT_MAX, "the fresh topic created", || {
            (listed(&mut client) == 1).then_some(())
        });
        std::thread::sleep(Duration::from_millis(500));
        // SAFETY: sends a signal to the child this test started.
        unsafe { libc::kill(child.id() as i32, signal) };
        let started = Instant::now();
        let status = exit_within(
            &mut child,
            started,
            Duration::from_secs(20),
            "runs on after the signal",
        );
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!status.success(), "{signal}: {stderr}");
        assert!(stderr.contains("produce: "), "{signal}: {stderr}");
        assert!(stderr.contains("interrupted"), "{signal}: {stderr}");
        // Its files say so too: their figures cover only part of the run.
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        assert_eq!(summary["ended"], "interrupted", "{signal}: {summary}");
        let page = std::fs::read_to_string(&report).unwrap();
        assert!(
            page.contains("The run ended early (interrupted)"),
            "{signal}: the report does not say the run was cut short"
        );
        assert_eq!(
            listed(&mut client),
            0,
            "{signal}: the fresh topic is gone: {stderr}"
        );
    }
}

/// A topic deleted under a run ends it at once (`topic_gone`), whether it is a
/// counted produce (whose failed records used to be sent again, 404 after
/// 404, until the count's worth had failed: minutes) or a verified flow (whose
/// drain used to wait for leases that would never come back).
#[test]
fn a_topic_deleted_during_a_run_ends_it() {
    let node = Node::start(&[]);
    let mut client = node.client();
    let dir = tempfile::tempdir().unwrap();
    let runs: [&[&str]; 2] = [
        &["--count", "100000000", "--workers", "4"],
        &[
            "--mode",
            "flow",
            "--duration",
            "30s",
            "--verify",
            "--workers",
            "4",
        ],
    ];
    for (i, args) in runs.into_iter().enumerate() {
        let topic = format!("doomed{i}");
        common::create_topic(&mut client, &topic);
        let json = dir.path().join(format!("{topic}.json"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_narad"))
            .args(["bench", "-s", &format!("http://{}", node.addr), &topic])
            .args(args)
            .arg("--json")
            .arg(&json)
            .env_remove("NARAD_ADDR")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let deleted = client
            .request("DELETE", &format!("/v1/topics/{topic}"), &[], "")
            .unwrap();
        assert_eq!(deleted.status, 204, "{deleted:?}");
        let status = exit_within(
            &mut child,
            Instant::now(),
            Duration::from_secs(15),
            "runs on against a deleted topic",
        );
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("the topic was deleted during the run"),
            "{args:?}: {stderr}"
        );
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        assert_eq!(summary["ended"], "topic_gone", "{args:?}: {summary}");
    }
}

/// A run that fails before it measures anything leaves a `--json` file that
/// says so, never an earlier run's figures or an empty file.
#[test]
fn a_run_that_measured_nothing_says_so_in_its_json_file() {
    let node = Node::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    std::fs::write(&json, "{\"stale\":1}\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["bench", "-s", &format!("http://{}", node.addr), "nosuch"])
        .args(["--count", "10", "--json"])
        .arg(&json)
        .env_remove("NARAD_ADDR")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(summary["ended"], "failed", "{summary}");
    assert!(summary.get("stale").is_none(), "{summary}");
    assert!(
        summary["error"].as_str().unwrap().contains("nosuch"),
        "{summary}"
    );
}
