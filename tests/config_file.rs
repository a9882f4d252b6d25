//! `narad serve --config <file>` as an operator meets it: a file with a key the
//! node does not know, or an internal one, stops it before it starts, naming the
//! key; a valid file configures the node (here: listen address, security, logs).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;

use common::KillOnDrop;

fn serve_with_file(json: &str) -> (Command, tempfile::TempDir) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let file = dir.path().join("narad.json");
    std::fs::write(&file, json).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_narad"));
    command
        .arg("serve")
        .arg("--config")
        .arg(&file)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env_remove("NARAD_SECURITY_ENABLED")
        .env_remove("NARAD_HTTP_ADDR")
        .stdin(Stdio::null());
    (command, dir)
}

/// Runs a node that must refuse to start, for at most 20 s; returns whether it
/// succeeded and what it printed on stderr.
fn refused(mut command: Command) -> (bool, String) {
    let (status, message) = common::run_to_refusal(&mut command);
    (status.success(), message)
}

#[test]
fn a_file_with_an_unknown_or_internal_key_refuses_to_start_naming_it() {
    for (json, key) in [
        (r#"{"http": {"adr": "127.0.0.1:0"}}"#, "`http.adr`"),
        (
            r#"{"storage": {"segment_bytes": 1024}}"#,
            "`storage.segment_bytes`",
        ),
    ] {
        let (mut command, _dir) = serve_with_file(json);
        command.arg("--dev");
        let (success, message) = refused(command);
        assert!(!success);
        assert!(message.contains(key), "{json}: {message}");
        assert!(message.contains("narad.json"), "{message}");
    }
}

#[test]
fn an_invalid_duration_in_the_environment_refuses_to_start() {
    let (mut command, _dir) = serve_with_file("{}");
    command
        .arg("--dev")
        .env("NARAD_HTTP_SHUTDOWN_GRACE", "ten seconds");
    let (success, message) = refused(command);
    assert!(!success);
    assert!(message.contains("NARAD_HTTP_SHUTDOWN_GRACE"), "{message}");
}

#[test]
fn a_valid_file_configures_the_node() {
    let (mut command, _dir) = serve_with_file(
        r#"{"http": {"addr": "127.0.0.1:0", "shutdown_grace": "2s", "max_consume_wait": "1s"},
            "security": {"enabled": false},
            "log": {"format": "text"}}"#,
    );
    let mut child = KillOnDrop(
        command
            .args(["--shards", "1"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = child.0.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the node logged nothing");
    // Plain-text logs, and the file's loopback address with a picked port.
    assert!(line.contains("listening addr=127.0.0.1:"), "{line}");
    assert!(!line.contains("addr=127.0.0.1:0 "), "{line}");
}
