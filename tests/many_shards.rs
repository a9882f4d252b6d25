//! A node with far more shards than CPUs (48 on the 2-core CI machine): it gets
//! ready, and a stop signal ends it whether it comes before or after that. Each
//! shard's executor sleeps at most a reactor tick, and the shards connect their
//! mesh only once every executor runs; without them, such a node stalled in its
//! WAL recovery most times, never ready, and a SIGTERM waited for it for ever.

mod common;

use std::time::Duration;

use common::Node;

const SHARDS: usize = 48;

#[test]
fn a_node_with_far_more_shards_than_cpus_gets_ready_and_stops() {
    for round in 0..3 {
        let mut node = Node::start_shards(SHARDS, &[]);
        node.sigterm();
        let status = node.wait_for_exit(Duration::from_secs(30));
        assert!(status.success(), "round {round}: {status}");
    }
}

#[test]
fn a_stop_while_many_shards_recover_ends_the_node() {
    for round in 0..3 {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let mut node = Node::spawn(&dir.path().join("data"), SHARDS, &[]);
        node.wait_for_log("listening");
        std::thread::sleep(Duration::from_millis(100 + 300 * round));
        node.sigterm();
        let status = node.wait_for_exit(Duration::from_secs(30));
        assert!(status.success(), "round {round}: {status}");
    }
}
