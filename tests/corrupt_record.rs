//! A record whose bytes rot on disk after it was committed: a replay of its
//! offset is 410 with what is unreadable, a consume skips it (counted), and
//! the records around it are served as before.

mod common;

use std::time::Duration;

use common::{
    create_topic, error_of, json_of, next_offsets, produce_ok, replay, wait_for_total, Node,
};

/// Commits three records to partition 0 of `topic`, one frame each, and stops
/// the node cleanly; returns the active segment's path.
fn three_frames_then_stop(data: &std::path::Path, topic: &str) -> std::path::PathBuf {
    let mut node = Node::start_in(data, 1, &[]);
    let mut client = node.client();
    create_topic(&mut client, topic);
    // Equal payloads, one commit each (each waits for the one before it):
    // three frames of one size, back to back.
    for i in 0..3 {
        produce_ok(
            &mut client,
            topic,
            "partition=0",
            format!("record-{i}-{}", "x".repeat(200)).as_bytes(),
        );
        wait_for_total(&mut client, topic, 3, i + 1, Duration::from_secs(20));
    }
    node.sigterm();
    assert!(node.wait_for_exit(Duration::from_secs(30)).success());
    drop(node);
    let segments = common::log_segments(&common::partition_dir(data, topic, 0));
    segments.first().expect("a segment").clone()
}

#[test]
fn a_rotten_record_is_410_on_replay_and_skipped_by_consumers() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    let segment = &three_frames_then_stop(&data, "rot");
    // Flip one byte in the middle of the middle frame.
    let mut bytes = std::fs::read(segment).unwrap();
    let used = bytes.iter().rposition(|&b| b != 0).expect("records") + 1;
    let frame = used / 3;
    assert!(
        frame > 200,
        "three frames of about 250 bytes, {used} bytes used"
    );
    bytes[frame + frame / 2] ^= 0x55;
    std::fs::write(segment, &bytes).unwrap();

    let node = Node::start_in(&data, 1, &[]);
    let mut client = node.client();
    let rotten = replay(&mut client, "rot", 0, 1);
    assert_eq!(rotten.status, 410, "{rotten:?}");
    assert_eq!(
        error_of(&rotten),
        "offset 1 of partition 0 is unreadable (corrupt on disk)"
    );
    for offset in [0, 2] {
        let served = replay(&mut client, "rot", 0, offset);
        assert_eq!(served.status, 200, "{served:?}");
        let payload = json_of(&served)["payload"].as_str().unwrap().to_string();
        assert!(
            payload.starts_with(&format!("record-{offset}-")),
            "{payload}"
        );
    }
    // Consumers get the two others, and nothing more.
    assert_eq!(consume_partition_0(&mut client, "rot", "500ms", 3), [0, 2]);
    assert_one_skip_counted(&mut client, "rot");
}

/// The offsets consumers get from partition 0 of `topic`, sorted, in at most
/// `tries` consumes that each wait up to `wait`.
fn consume_partition_0(
    client: &mut common::Client,
    topic: &str,
    wait: &str,
    tries: usize,
) -> Vec<u64> {
    let mut consumed = Vec::new();
    for _ in 0..tries {
        let path = format!("/v1/topics/{topic}/consume?partition=0&wait={wait}");
        let response = client.request("GET", &path, &[], "").unwrap();
        match response.status {
            200 => consumed.push(json_of(&response)["offset"].as_u64().unwrap()),
            204 => break,
            _ => panic!("{response:?}"),
        }
    }
    consumed.sort_unstable();
    consumed
}

fn assert_one_skip_counted(client: &mut common::Client, topic: &str) {
    let metrics = client.request("GET", "/metrics", &[], "").unwrap().body;
    let label = format!("\"{topic}\"");
    let skipped = metrics
        .lines()
        .find(|l| l.starts_with("narad_consumer_corrupt_skipped_total{") && l.contains(&label))
        .unwrap_or_else(|| panic!("no skip counted:\n{metrics}"));
    assert!(skipped.ends_with(" 1"), "{skipped}");
}

/// Rot in the last commit before a clean stop is no torn write: the restart
/// keeps its offset as a corrupt gap (skipped, counted) rather than cutting it
/// and giving its offset to the next produce.
#[test]
fn rot_in_the_last_commit_is_a_gap_not_a_cut_tail() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    let segment = &three_frames_then_stop(&data, "tail");
    let mut bytes = std::fs::read(segment).unwrap();
    let used = bytes.iter().rposition(|&b| b != 0).expect("records") + 1;
    // Into the last frame's payload.
    bytes[used - 100] ^= 0x55;
    std::fs::write(segment, &bytes).unwrap();
    // The offline inspector reads the hint as the open does: damage, not a
    // shorter log.
    let inspected = std::process::Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["inspect", "log"])
        .arg(common::partition_dir(&data, "tail", 0))
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&inspected.stdout);
    assert_eq!(inspected.status.code(), Some(2), "{report}");
    assert!(report.contains("offsets 0..3 (3 records)"), "{report}");
    assert!(
        report.contains("CORRUPT ranges [Offset(2)..Offset(3)]"),
        "{report}"
    );

    let node = Node::start_in(&data, 1, &[]);
    let mut client = node.client();
    assert_eq!(next_offsets(&mut client, "tail")[0], 3);
    let rotten = replay(&mut client, "tail", 0, 2);
    assert_eq!(rotten.status, 410, "{rotten:?}");
    produce_ok(&mut client, "tail", "partition=0", b"after");
    assert_eq!(consume_partition_0(&mut client, "tail", "2s", 4), [0, 1, 3]);
    let after = replay(&mut client, "tail", 0, 3);
    assert_eq!(json_of(&after)["payload"], "after");
    assert_one_skip_counted(&mut client, "tail");
}
