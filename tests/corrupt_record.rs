//! A record whose bytes rot on disk after it was committed: a replay of its
//! offset is 410 with what is unreadable, a consume skips it (counted), and
//! the records around it are served as before.

mod common;

use std::time::Duration;

use common::{create_topic, error_of, json_of, produce_ok, replay, wait_for_total, Node};

#[test]
fn a_rotten_record_is_410_on_replay_and_skipped_by_consumers() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    let mut node = Node::start_in(&data, 1, &[]);
    let mut client = node.client();
    create_topic(&mut client, "rot");
    // Equal payloads, one commit each (each waits for the one before it):
    // three frames of one size, back to back.
    for i in 0..3 {
        produce_ok(
            &mut client,
            "rot",
            "partition=0",
            format!("record-{i}-{}", "x".repeat(200)).as_bytes(),
        );
        wait_for_total(&mut client, "rot", 3, i + 1, Duration::from_secs(20));
    }
    node.sigterm();
    assert!(node.wait_for_exit(Duration::from_secs(30)).success());
    drop(node);

    // Flip one byte in the middle of the middle frame.
    let segments = common::log_segments(&common::partition_dir(&data, "rot", 0));
    let segment = segments.first().expect("a segment");
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
    let mut consumed = Vec::new();
    for _ in 0..3 {
        let path = "/v1/topics/rot/consume?partition=0&wait=500ms";
        let response = client.request("GET", path, &[], "").unwrap();
        match response.status {
            200 => consumed.push(json_of(&response)["offset"].as_u64().unwrap()),
            204 => break,
            _ => panic!("{response:?}"),
        }
    }
    consumed.sort_unstable();
    assert_eq!(consumed, [0, 2]);
    let metrics = client.request("GET", "/metrics", &[], "").unwrap().body;
    let skipped = metrics
        .lines()
        .find(|l| l.starts_with("narad_consumer_corrupt_skipped_total{") && l.contains("\"rot\""))
        .unwrap_or_else(|| panic!("no skip counted:\n{metrics}"));
    assert!(skipped.ends_with(" 1"), "{skipped}");
}
