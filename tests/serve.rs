//! `narad serve` as a process: it starts one shard per requested core over the
//! data directory, refuses a second process on the same directory, refuses to run
//! with security on (no authentication exists yet), runs without transparent huge
//! pages, and stops cleanly on SIGTERM and SIGINT.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{run_to_refusal, wait_for_exit, KillOnDrop};

fn narad(args: &[&str], data_dir: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_narad"));
    command
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .env_remove("NARAD_SECURITY_ENABLED");
    command
}

/// Whether the process may use transparent huge pages, from its
/// `/proc/PID/status` (`None` on a kernel that does not say).
fn thp_enabled(pid: u32) -> Option<bool> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let value = status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))?;
    Some(value.trim() != "0")
}

/// Waits for a line containing `needle` on the child's stderr, for at most 20 s.
fn wait_for_log(child: &mut Child, needle: &str) -> Vec<String> {
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) {
            let done = line.contains(needle);
            seen.push(line);
            if done {
                return seen;
            }
        }
    }
    panic!("no log line containing {needle:?} within 20 s; saw {seen:#?}");
}

#[test]
fn serve_dev_runs_locks_its_directory_and_stops_on_sigterm() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    // A relative data directory, as the README's run command uses (a regression:
    // relative paths once failed to open with EBADF). A port of its own, not the
    // default one: a broker someone runs on this machine must not fail the test.
    let mut first = KillOnDrop(
        narad(
            &["serve", "--dev", "--port", "0", "--shards", "2"],
            std::path::Path::new("data"),
        )
        .current_dir(dir.path())
        // The client commands' broker address, as a shell may keep it: no
        // listen address, and no reason to refuse.
        .env("NARAD_ADDR", "http://127.0.0.1:9")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap(),
    );
    let lines = wait_for_log(&mut first.0, "storage engine running");
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains("ingress WAL recovered"))
            .count(),
        2,
        "{lines:#?}"
    );
    assert!(dir.path().join("data/ingress/shard-1").is_dir());
    // A fresh allocator page must not fault in a whole huge page on a shard
    // (a stall of milliseconds): the process runs without them.
    assert_ne!(thp_enabled(first.0.id()), Some(true), "huge pages are on");

    let second = narad(&["serve", "--dev", "--port", "0"], &dir.path().join("data"))
        .output()
        .unwrap();
    assert!(!second.status.success());
    let message = String::from_utf8_lossy(&second.stderr);
    assert!(
        message.contains("in use by another narad process"),
        "{message}"
    );

    // SAFETY: sends SIGTERM to the child this test started.
    unsafe { libc::kill(first.0.id() as i32, libc::SIGTERM) };
    let status = wait_for_exit(&mut first.0, Duration::from_secs(10));
    assert!(status.success(), "graceful stop exits 0, got {status}");
}

/// A stop signal, SIGTERM or SIGINT (Ctrl-C), sent the moment the address is
/// printed (as a script that starts a node, reads its address and stops it
/// would) is a graceful stop, not death by the signal's default action.
#[test]
fn a_stop_signal_as_soon_as_the_address_is_printed_stops_gracefully() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for round in 0..6 {
        let mut node = KillOnDrop(
            narad(
                &["serve", "--dev", "--port", "0", "--shards", "1"],
                &dir.path().join("data"),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
        );
        let mut line = String::new();
        BufReader::new(node.0.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("narad listening on"), "{line:?}");
        let signal = [libc::SIGTERM, libc::SIGINT][round % 2];
        // SAFETY: sends a stop signal to the child this test started.
        unsafe { libc::kill(node.0.id() as i32, signal) };
        let status = wait_for_exit(&mut node.0, Duration::from_secs(20));
        assert!(
            status.success(),
            "round {round}, signal {signal}: graceful stop exits 0, got {status}"
        );
    }
}

#[test]
fn serve_refuses_to_start_with_security_on() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let output = narad(&["serve"], dir.path()).output().unwrap();
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(
        message.contains("--dev") && message.contains("NARAD_SECURITY_ENABLED=false"),
        "{message}"
    );
}

#[test]
fn serve_refuses_a_data_directory_that_is_a_file() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let file = dir.path().join("afile");
    std::fs::write(&file, b"not a directory").unwrap();
    let output = narad(&["serve", "--dev", "--port", "0"], &file)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(message.contains("is not a directory"), "{message}");
    assert_eq!(std::fs::read(&file).unwrap(), b"not a directory");
}

/// A data directory that cannot even be looked up (here a path through a
/// file; on a failing disk, an I/O error) is reported as unreadable, not as
/// one the node failed to create.
#[test]
fn serve_reports_a_data_directory_it_cannot_look_up() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let file = dir.path().join("afile");
    std::fs::write(&file, b"not a directory").unwrap();
    let output = narad(&["serve", "--dev", "--port", "0"], &file.join("data"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(message.contains("cannot read data directory"), "{message}");
    assert!(!message.contains("cannot create"), "{message}");
}

/// A data directory whose `topics` the process cannot create files in is
/// refused at the start, naming it, instead of a node that answers ready and
/// accepts produces it can never commit.
#[test]
fn serve_refuses_a_data_directory_it_cannot_create_topic_files_in() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    // A file where the topics directory goes: refused as an unwritable one is
    // (this test may run as root, whom permissions do not stop).
    std::fs::write(data.join("topics"), b"in the way").unwrap();
    let (status, message) = run_to_refusal(&mut narad(&["serve", "--dev", "--port", "0"], &data));
    assert!(!status.success());
    assert!(
        message.contains("cannot create files in") && message.contains("topics"),
        "{message}"
    );
    assert!(message.contains("write access"), "{message}");
}

/// A port another process listens on is refused with what to do about it.
#[test]
fn serve_refuses_a_port_in_use_and_says_what_to_do() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let data = dir.path().join("data");
    let (status, message) = run_to_refusal(&mut narad(&["serve", "--dev", "--port", &port], &data));
    assert!(!status.success());
    assert!(
        message.contains("cannot listen on") && message.contains("another process listens there"),
        "{message}"
    );
}

/// A shard count outside 1..=1024 is refused before anything starts, naming
/// the flag or the variable.
#[test]
fn serve_refuses_a_shard_count_out_of_range_and_the_reference_flags_it_lacks() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for shards in ["0", "1025", "many"] {
        let output = narad(
            &["serve", "--dev", "--port", "0", "--shards", shards],
            dir.path(),
        )
        .output()
        .unwrap();
        assert_eq!(output.status.code(), Some(2), "--shards {shards}");
        let message = String::from_utf8_lossy(&output.stderr);
        assert!(
            message.contains("--shards") && message.contains("1 to 1024"),
            "{message}"
        );
    }
    // The reference's flags for a cluster or a profiling listener are refused
    // with their reason, not as unknown arguments.
    for (flag, value) in [
        ("--node-id", "a"),
        ("--cluster-port", "7943"),
        ("--pprof-addr", ":6060"),
    ] {
        let output = narad(&["serve", "--dev", "--port", "0", flag, value], dir.path())
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(1), "{flag}");
        let message = String::from_utf8_lossy(&output.stderr);
        assert!(
            message.contains(flag) && message.contains("does not support"),
            "{message}"
        );
    }
    // The client's broker address is no listen address: given on the command
    // line (before or after `serve`) it is refused; in the environment, where
    // shells keep it for the client commands, it is left alone (the node
    // starting with it set is `serve_dev_runs_locks_its_directory_and_stops_on_sigterm`).
    for args in [
        &[
            "serve",
            "--dev",
            "--port",
            "0",
            "--server",
            "http://127.0.0.1:9",
        ][..],
        &["-s", "http://127.0.0.1:9", "serve", "--dev", "--port", "0"][..],
    ] {
        let output = narad(args, dir.path()).output().unwrap();
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        let message = String::from_utf8_lossy(&output.stderr);
        assert!(
            message.contains("--server") && message.contains("--addr"),
            "{message}"
        );
    }
    for shards in ["0", ""] {
        let output = narad(&["serve", "--dev", "--port", "0"], dir.path())
            .env("NARAD_SHARDS", shards)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "NARAD_SHARDS={shards}");
        let message = String::from_utf8_lossy(&output.stderr);
        assert!(
            message.contains("1 to 1024") && message.contains("NARAD_SHARDS"),
            "{message}"
        );
    }
}

/// `narad version` prints what `--version` does; `narad completion SHELL`
/// prints a script that names the subcommands.
#[test]
fn version_and_completion_print_and_exit() {
    let run = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_narad"))
            .args(args)
            .output()
            .unwrap();
        assert!(output.status.success(), "{args:?}: {output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    let version = run(&["version"]);
    assert_eq!(version, run(&["--version"]));
    assert!(
        version.starts_with("narad ") && version.trim_end().len() > 6,
        "{version:?}"
    );
    for shell in ["bash", "zsh", "fish"] {
        let script = run(&["completion", shell]);
        assert!(
            script.contains("serve") && script.contains("bench"),
            "{shell}"
        );
    }
    let refused = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["completion", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
}

/// A broker started under a low soft open-files limit raises it to the hard
/// limit itself, and says so when the hard limit is below what its connection
/// cap needs.
#[test]
fn serve_raises_its_open_files_limit_and_warns_when_the_hard_limit_is_low() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut command = narad(
        &["serve", "--dev", "--port", "0", "--shards", "1"],
        dir.path(),
    );
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 256,
                rlim_max: 2048,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = KillOnDrop(command.stderr(Stdio::piped()).spawn().unwrap());
    let lines = wait_for_log(&mut child.0, "storage engine running");
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.0.id())).unwrap();
    let open_files: Vec<&str> = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        &open_files[3..5],
        ["2048", "2048"],
        "soft and hard: {limits}"
    );
    assert!(
        lines.iter().any(|l| l.contains("RLIMIT_NOFILE")),
        "no warning about the open-files limit: {lines:#?}"
    );
}

#[test]
fn serve_refuses_an_environment_value_that_is_not_text() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut child = narad(&["serve", "--dev", "--port", "0"], dir.path())
        .env(
            "NARAD_HTTP_MAX_CONNECTIONS",
            std::ffi::OsStr::from_bytes(b"12\xff"),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A node that took the value for unset would serve: bounded wait.
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the node started with a value that is not text");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(
        message.contains("NARAD_HTTP_MAX_CONNECTIONS holds bytes that are not UTF-8"),
        "{message}"
    );
}

/// Under a locked-memory limit io_uring cannot start with, the broker refuses
/// with one actionable line before anything starts, rather than letting every
/// shard panic.
#[test]
fn serve_refuses_to_start_when_locked_memory_is_too_low() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut command = narad(&["serve", "--dev", "--port", "0"], dir.path());
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 64 << 10,
                rlim_max: 64 << 10,
            };
            if libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (status, message) = run_to_refusal(&mut command);
    assert_eq!(status.code(), Some(1), "{status}");
    assert!(
        message.contains("RLIMIT_MEMLOCK") && message.contains("LimitMEMLOCK"),
        "{message}"
    );
    assert!(!message.contains("panicked"), "{message}");
    assert!(
        !dir.path().join("metastore").exists(),
        "nothing started: {:?}",
        std::fs::read_dir(dir.path()).unwrap().collect::<Vec<_>>()
    );
}

/// The address a `--port 0` broker chose is printed on stdout whatever the log
/// level, and it answers there.
#[test]
fn serve_prints_the_address_it_listens_on_at_any_log_level() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut child = KillOnDrop(
        narad(
            &[
                "serve",
                "--dev",
                "--port",
                "0",
                "--shards",
                "1",
                "--log-level",
                "error",
            ],
            dir.path(),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    let addr = line
        .trim()
        .strip_prefix("narad listening on http://")
        .unwrap_or_else(|| panic!("{line:?}"));
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    assert_ne!(addr.port(), 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        use std::io::{Read, Write};
        if let Ok(mut stream) = std::net::TcpStream::connect(addr) {
            stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut reply = String::new();
            let _ = stream.read_to_string(&mut reply);
            if reply.starts_with("HTTP/1.1 200") {
                break;
            }
        }
        assert!(Instant::now() < deadline, "no answer at {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
