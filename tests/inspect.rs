//! `narad inspect` over the data of a stopped node: what it reports of the
//! ingress WAL and a partition log, and that it changes nothing where it looks.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use common::{create_topic, produce_ok, wait_for_total, Node};
use narad_shards::ids::Seq;
use narad_shards::wal::checkpoint::{self, CHECKPOINT_FILE};
use narad_shards::wal::{dispatched, DispatchProgress};

fn inspect(what: &str, dir: &Path) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["inspect", what])
        .arg(dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The names and modification times under `dir` (itself included).
fn listing(dir: &Path) -> Vec<(String, SystemTime)> {
    let mut out = vec![(".".to_string(), dir.metadata().unwrap().modified().unwrap())];
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        out.push((name, entry.metadata().unwrap().modified().unwrap()));
    }
    out.sort();
    out
}

#[test]
fn inspect_reports_a_stopped_nodes_wal_and_log_and_writes_nothing() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    let mut node = Node::start_in(&data, 1, &[]);
    let mut client = node.client();
    create_topic(&mut client, "seen");
    for i in 0..5 {
        produce_ok(
            &mut client,
            "seen",
            "partition=0",
            format!("r{i}").as_bytes(),
        );
    }
    wait_for_total(&mut client, "seen", 3, 5, Duration::from_secs(20));
    // While the node runs, the report says its reading may be of bytes in
    // flight; once it stopped (below), it does not.
    let live = inspect("wal", &data.join("ingress").join("shard-0"));
    assert!(live.starts_with("note: a running narad holds"), "{live}");
    node.sigterm();
    assert!(node.wait_for_exit(Duration::from_secs(30)).success());
    drop(node);

    let wal = data.join("ingress").join("shard-0");
    let topic = data.join("topics").join("seen");
    let incarnation = std::fs::read_dir(&topic)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let log = incarnation.join("p00000");
    let (wal_before, log_before) = (listing(&wal), listing(&log));
    // A file system's times are coarse: a write within the same tick as the
    // stop would not show.
    std::thread::sleep(Duration::from_millis(50));

    let report = inspect("wal", &wal);
    assert!(report.starts_with("checkpoint: "), "{report}");
    // The records end in the last segment; the first ones may sit in a short
    // first segment the WAL left for a prepared one, or be compacted with it.
    let segments: Vec<&str> = report
        .lines()
        .filter(|l| l.contains(".wal: seqs "))
        .collect();
    assert!(matches!(segments.len(), 1 | 2), "{report}");
    assert!(segments.last().unwrap().contains("..5 ("), "{report}");
    assert!(
        report.contains(&format!("segments: {},", segments.len())),
        "{report}"
    );
    assert!(!report.contains("CORRUPT"), "{report}");
    let report = inspect("log", &log);
    assert!(report.contains(": offsets 0..5 (5 records)"), "{report}");
    assert!(report.ends_with("segments: 1\n"), "{report}");

    assert_eq!(listing(&wal), wal_before);
    assert_eq!(listing(&log), log_before);

    // A done-set a graceful stop left is reported, with whether the next
    // start would use it. Made here over a checkpoint moved back to record 3,
    // with record 4 committed above it.
    std::fs::write(wal.join(CHECKPOINT_FILE), checkpoint::encode(Seq(3))).unwrap();
    let mut progress = DispatchProgress::new(Seq(3));
    progress.mark_done(Seq(4));
    let done_set = |next: u64| dispatched::encode(&progress, Seq(next));
    std::fs::write(wal.join(dispatched::DISPATCHED_FILE), done_set(5)).unwrap();
    let report = inspect("wal", &wal);
    assert!(
        report.contains("done-set: 1 records above the checkpoint were committed"),
        "{report}"
    );
    std::fs::write(wal.join(dispatched::DISPATCHED_FILE), done_set(6)).unwrap();
    let report = inspect("wal", &wal);
    assert!(
        report.contains("done-set: present, but the next start will not use it"),
        "{report}"
    );
    assert!(wal.join(dispatched::DISPATCHED_FILE).exists(), "read only");

    // Pointed at the wrong directory, it says so and fails, rather than
    // reporting an empty WAL or log.
    for (what, dir) in [("wal", data.as_path()), ("log", incarnation.as_path())] {
        let output = Command::new(env!("CARGO_BIN_EXE_narad"))
            .args(["inspect", what])
            .arg(dir)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success(),
            "{what} {}: {stderr}",
            dir.display()
        );
        assert!(
            stderr.contains(if what == "wal" {
                "no ingress WAL here"
            } else {
                "no partition log segments here"
            }),
            "{stderr}"
        );
    }
}

/// Damage on disk is reported, and told apart in the exit status (2) from a
/// failure to look (1) and from a clean report (0).
#[test]
fn inspect_exits_2_on_a_corrupt_log() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    let mut node = Node::start_in(&data, 1, &[]);
    let mut client = node.client();
    create_topic(&mut client, "hurt");
    // One commit (one frame) each: the damage below sits before valid frames.
    for i in 0..3usize {
        produce_ok(
            &mut client,
            "hurt",
            "partition=0",
            format!("r{i}").as_bytes(),
        );
        wait_for_total(&mut client, "hurt", 3, i + 1, Duration::from_secs(20));
    }
    node.sigterm();
    assert!(node.wait_for_exit(Duration::from_secs(30)).success());
    drop(node);
    let log_dir = common::partition_dir(&data, "hurt", 0);
    let segment = common::log_segments(&log_dir).remove(0);
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[40] ^= 0x5a;
    std::fs::write(&segment, &bytes).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["inspect", "log"])
        .arg(&log_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(2), "{stdout}");
    assert!(stdout.contains("CORRUPT ranges"), "{stdout}");
}
