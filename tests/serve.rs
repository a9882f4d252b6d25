//! `narad serve` as a process: it starts one shard per requested core over the
//! data directory, refuses a second process on the same directory, refuses to run
//! with security on (no authentication exists yet), and stops cleanly on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn narad(args: &[&str], data_dir: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_narad"));
    command
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .env_remove("NARAD_SECURITY_ENABLED");
    command
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
    // relative paths once failed to open with EBADF).
    let mut first = KillOnDrop(
        narad(
            &["serve", "--dev", "--shards", "2"],
            std::path::Path::new("data"),
        )
        .current_dir(dir.path())
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

    let second = narad(&["serve", "--dev"], &dir.path().join("data"))
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
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = first.0.try_wait().unwrap() {
            assert!(status.success(), "graceful stop exits 0, got {status}");
            break;
        }
        assert!(Instant::now() < deadline, "no exit within 10 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
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
