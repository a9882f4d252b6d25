//! Consumes of a topic one of whose partitions cannot be read: the others are
//! served all the same.

mod common;

use std::time::Duration;

use common::{json_of, post_topic, produce_ok, wait_for_total, Node};

/// Two shards, a topic of three partitions: 0 and 2 on one shard, 1 on the
/// other (`(hash + p) mod 2`). Partition 0's directory is replaced by a
/// file, so its consumer state cannot be read; partition 2 is empty and
/// partition 1 holds records. Every unpinned consume is answered with one of
/// partition 1's records, whichever shard takes it: the shard of partitions 0
/// and 2 asks the other one rather than answer 500 for its own.
#[test]
fn an_unreadable_partition_does_not_fail_consumes_the_other_shards_can_serve() {
    let node = Node::start_shards(2, &[]);
    let mut client = node.client();
    let created = post_topic(&mut client, r#"{"name":"ft","partitions":3}"#);
    assert_eq!(created.status, 201, "{created:?}");
    // Partition 0's directory exists once a record is committed to it.
    produce_ok(&mut client, "ft", "partition=0", b"first");
    wait_for_total(&mut client, "ft", 3, 1, Duration::from_secs(20));
    let dir = common::partition_dir(&node.data, "ft", 0);
    std::fs::rename(&dir, dir.with_file_name("moved")).unwrap();
    std::fs::write(&dir, b"not a directory").unwrap();

    for i in 0..40 {
        produce_ok(&mut client, "ft", "partition=1", format!("r{i}").as_bytes());
    }
    wait_for_total(&mut client, "ft", 3, 41, Duration::from_secs(20));

    // New connections spread over both shards (one listener each).
    for attempt in 0..20 {
        let mut consumer = node.client();
        let got = consumer
            .request("GET", "/v1/topics/ft/consume", &[], "")
            .unwrap();
        assert_eq!(got.status, 200, "consume {attempt}: {got:?}");
        assert_eq!(json_of(&got)["partition"], 1, "{got:?}");
    }
}
