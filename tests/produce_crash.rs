//! Produce under failure, checked against what was acknowledged: every payload
//! answered 202 must be replayable after a restart. Duplicates are allowed (a
//! produce that got no answer, or a 500, may still be delivered); loss is not.
//!
//! - A two-shard node is killed with SIGKILL under produce load and restarted over
//!   the same data directory with one shard, so shard 1's ingress WAL is a leftover
//!   that the restart must drain into the partition logs.
//! - A node whose ingress WALs run out of disk (the debug build's write budget
//!   hook, `NARAD_DEBUG_WAL_WRITE_BUDGET_BYTES`) answers 500 and keeps answering
//!   500 until restarted, while topic reads and replay go on; a restart without
//!   the budget keeps every record it acknowledged.
//! - A node with one partition that cannot commit is stopped gracefully and
//!   restarted healed: every record is committed exactly once (the done-set the
//!   stop leaves; without it, nearly all were committed again).
//!
//! Payloads identify themselves (`p-<thread>-<n>`, or `w-<n>` padded with dots),
//! so a replayed record names the produce it came from.
//!
//! What SIGKILL hardly shows: a write the WAL has handed to the kernel survives
//! the death of the process, and by the time a 202 leaves the node the write
//! behind it has normally been handed over already. So a node that answers 202
//! before its fdatasync (the `broken-ack-before-fsync` variant) lost nothing here
//! in three of three runs; a power cut is what loses such a write, and
//! `wal_crash`'s simulated disk is where that is shown.

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{wait_until, Client, Node, Response, WAIT_MAX};
use serde_json::Value;

const TOPIC: &str = "crash";
const PARTITIONS: u32 = 6;
/// Producer threads of the SIGKILL test, each with its own keep-alive connection.
const PRODUCERS: usize = 8;
/// How long the producers run before the SIGKILL, at least.
const LOAD_BEFORE_KILL: Duration = Duration::from_millis(1_500);
/// Produces acknowledged before the kill, at least (unless [`LOAD_MAX`] passes).
const ACKED_BEFORE_KILL: usize = 150;
const LOAD_MAX: Duration = Duration::from_secs(20);
/// How long the restarted node may take to make every acknowledged record
/// replayable (it drains WALs in the background after it is ready).
const REPLAY_DEADLINE: Duration = Duration::from_secs(30);

/// Size of each record of the disk failure test.
const RECORD_BYTES: usize = 64 << 10;
/// Bytes each shard's WAL may write in the disk failure test. At open the WAL
/// zero-fills a spare 64 MiB segment (`storage.ingress_wal_prealloc`, on by
/// default and settable only in a config file), which the budget must pay for;
/// appends and checkpoint stores then run out after about 4 MiB. If preparation
/// loses the race for the budget instead, appends run out sooner: either way
/// appends fail.
const WAL_WRITE_BUDGET_BYTES: u64 = (64 << 20) + (4 << 20);
/// Keep-alive connections the disk failure test produces over. A connection
/// stays on the shard that accepted it, and the kernel spreads new connections
/// over the shards, so 16 of them reach both shards but for a 2^-15 chance.
const POOL_CLIENTS: usize = 16;
/// Produces of the disk failure test at most: both budgets run out well before.
const DISK_PRODUCES_MAX: usize = 4_000;

fn create_topic(node: &Node) {
    let body = format!(r#"{{"name":"{TOPIC}","partitions":{PARTITIONS}}}"#);
    let headers = [("content-type", "application/json")];
    let created = node
        .served_client()
        .request("POST", "/v1/topics", &headers, body)
        .unwrap();
    assert_eq!(created.status, 201, "create topic: {}", created.body);
}

fn produce(client: &mut Client, query: &str, payload: &[u8]) -> std::io::Result<Response> {
    let path = format!("/v1/topics/{TOPIC}/produce{query}");
    let headers = [("content-type", "application/octet-stream")];
    client.request("POST", &path, &headers, payload)
}

/// The produce's own id: the payload up to its padding.
fn payload_id(payload: &str) -> &str {
    payload.split('.').next().unwrap_or_default()
}

/// Asserts that a 500 carries the reference's error document, `{"error": "..."}`.
fn assert_error_body(response: &Response) {
    let body: Value = serde_json::from_str(&response.body)
        .unwrap_or_else(|e| panic!("500 body is not JSON ({e}): {:?}", response.body));
    let object = body.as_object().expect("500 body is a JSON object");
    assert!(
        object.len() == 1 && object.get("error").is_some_and(Value::is_string),
        "500 body is not {{\"error\": ...}}: {body}"
    );
}

/// Replays every partition from offset 0, picking up where the previous pass ended,
/// and collects the ids of the payloads it reads.
struct Replay {
    client: Client,
    next_offsets: Vec<u64>,
    seen: HashSet<String>,
    records: u64,
}

impl Replay {
    fn new(node: &Node) -> Replay {
        Replay {
            client: node.served_client(),
            next_offsets: vec![0; PARTITIONS as usize],
            seen: HashSet::new(),
            records: 0,
        }
    }

    /// Reads each partition up to its end (the first 204).
    fn pass(&mut self) {
        for partition in 0..PARTITIONS {
            let offset = &mut self.next_offsets[partition as usize];
            loop {
                let path =
                    format!("/v1/topics/{TOPIC}/consume?partition={partition}&offset={offset}");
                let r = self.client.request("GET", &path, &[], "").unwrap();
                match r.status {
                    204 => break,
                    200 => {}
                    other => panic!("replay {path}: {other} {}", r.body),
                }
                let message: Value = serde_json::from_str(&r.body).unwrap();
                assert_eq!(message["partition"], partition, "{}", r.body);
                assert_eq!(message["offset"], *offset, "{}", r.body);
                let payload = message["payload"].as_str().expect("a text payload");
                self.seen.insert(payload_id(payload).to_string());
                self.records += 1;
                *offset += 1;
            }
        }
    }

    /// Replays until every id in `acked` has been read, or fails at the deadline
    /// naming what is missing.
    fn until_all_seen(&mut self, acked: &HashSet<String>) {
        let deadline = Instant::now() + REPLAY_DEADLINE;
        loop {
            self.pass();
            let missing: Vec<&String> =
                acked.iter().filter(|id| !self.seen.contains(*id)).collect();
            if missing.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {} acknowledged records are not replayable {REPLAY_DEADLINE:?} after \
                 the restart ({} records replayed), e.g. {:?}",
                missing.len(),
                acked.len(),
                self.records,
                &missing[..missing.len().min(10)]
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// What one producer thread saw.
#[derive(Default)]
struct Produced {
    acked: Vec<String>,
    /// Produces that ended without an answer: unknown, since the kill.
    unanswered: u64,
}

/// Produces unique payloads as fast as one connection allows until `stop` is set or
/// the connection breaks (the kill), mixing keyless, keyed and explicit-partition
/// produces. Every complete answer before the kill must be 202.
fn produce_until_killed(
    addr: SocketAddr,
    thread: usize,
    stop: &AtomicBool,
    acked_total: &AtomicUsize,
) -> Produced {
    let mut produced = Produced::default();
    let Ok(mut client) = Client::connect(addr) else {
        return produced;
    };
    for n in 0.. {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let id = format!("p-{thread}-{n}");
        let query = match n % 3 {
            0 => String::new(),
            1 => format!("?key=k-{}", n % 17),
            _ => format!("?partition={}", n % u64::from(PARTITIONS)),
        };
        match produce(&mut client, &query, id.as_bytes()) {
            Ok(r) => {
                assert_eq!(r.status, 202, "produce {id}{query}: {}", r.body);
                produced.acked.push(id);
                acked_total.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                produced.unanswered += 1;
                break;
            }
        }
    }
    produced
}

/// Log lines of `node` up to and including the first containing `needle`.
fn log_until(node: &Node, needle: &str) -> Vec<String> {
    let deadline = Instant::now() + common::WAIT_MAX;
    let mut lines = Vec::new();
    while Instant::now() < deadline {
        if let Ok(line) = node.log.recv_timeout(Duration::from_millis(100)) {
            let found = line.contains(needle);
            lines.push(line);
            if found {
                return lines;
            }
        }
    }
    panic!("no log line containing {needle:?}; saw {lines:#?}");
}

/// Waits for the node to exit; on timeout fails with the log lines it wrote meanwhile.
fn exit_within(node: &mut Node, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    let mut lines = Vec::new();
    while Instant::now() < deadline {
        if let Some(status) = node.child.try_wait().unwrap() {
            return status;
        }
        lines.extend(node.log.try_iter());
        std::thread::sleep(Duration::from_millis(20));
    }
    let tail = &lines[lines.len().saturating_sub(30)..];
    panic!("no exit within {within:?} of SIGTERM; last log lines: {tail:#?}");
}

/// Produces from [`PRODUCERS`] connections for [`LOAD_BEFORE_KILL`] (longer,
/// up to [`LOAD_MAX`], until [`ACKED_BEFORE_KILL`] were acknowledged, on a
/// machine whose fsyncs are slow just then), kills the node, and returns the
/// ids it acknowledged and the produces left unanswered.
fn load_then_kill(node: &mut Node) -> (HashSet<String>, u64) {
    let addr = node.addr;
    let stop = AtomicBool::new(false);
    let acked_total = AtomicUsize::new(0);
    let produced: Vec<Produced> = std::thread::scope(|scope| {
        let (stop, acked_total) = (&stop, &acked_total);
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|thread| {
                scope.spawn(move || produce_until_killed(addr, thread, stop, acked_total))
            })
            .collect();
        let started = Instant::now();
        std::thread::sleep(LOAD_BEFORE_KILL);
        while acked_total.load(Ordering::Relaxed) < ACKED_BEFORE_KILL
            && started.elapsed() < LOAD_MAX
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        node.sigkill();
        stop.store(true, Ordering::Relaxed);
        producers.into_iter().map(|p| p.join().unwrap()).collect()
    });
    let acked: HashSet<String> = produced.iter().flat_map(|p| p.acked.clone()).collect();
    let unanswered: u64 = produced.iter().map(|p| p.unanswered).sum();
    assert!(
        acked.len() > 100,
        "only {} produces acknowledged",
        acked.len()
    );
    (acked, unanswered)
}

#[test]
fn sigkill_two_shards_restart_with_one_loses_no_acknowledged_record() {
    let mut node = Node::start_shards(2, &[]);
    create_topic(&node);
    let (acked, unanswered) = load_then_kill(&mut node);

    let restarted = Node::start_in(&node.data, 1, &[]);
    let started = Instant::now();
    let mut replay = Replay::new(&restarted);
    replay.until_all_seen(&acked);
    let lines = log_until(&restarted, "leftover ingress WAL drained");
    assert!(
        lines.last().unwrap().contains("ingress/shard-1"),
        "{lines:#?}"
    );
    // Drained, the leftover WAL's directory goes: it only takes disk now.
    let ingress = restarted.data.join("ingress");
    wait_until(WAIT_MAX, "the drained WAL removed", || {
        let names: Vec<String> = std::fs::read_dir(&ingress)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        (names == ["shard-0"]).then_some(())
    });
    let leftover = lines
        .iter()
        .find(|l| l.contains("dispatcher started") && l.contains("ingress/shard-1"));
    eprintln!(
        "{} produces acknowledged, {unanswered} unanswered at the kill; all replayable \
         {:?} after the restart ({} records replayed); leftover WAL: {}",
        acked.len(),
        started.elapsed(),
        replay.records,
        leftover.map_or("(no dispatcher line)", String::as_str)
    );
}

#[test]
fn wal_disk_failure_answers_500_latches_and_keeps_what_was_acked() {
    let budget = WAL_WRITE_BUDGET_BYTES.to_string();
    let mut node = Node::start_shards(2, &[("NARAD_DEBUG_WAL_WRITE_BUDGET_BYTES", &budget)]);
    create_topic(&node);
    let mut pool: Vec<Client> = (0..POOL_CLIENTS).map(|_| node.served_client()).collect();
    let mut latched = [false; POOL_CLIENTS];
    let mut acked = HashSet::new();
    let mut produces = 0;
    let mut server_errors = 0;
    // Round-robin over the pool until every connection's shard has failed: a
    // connection that saw a 500 must never see a 202 again.
    while !latched.iter().all(|&l| l) {
        assert!(
            produces < DISK_PRODUCES_MAX,
            "{produces} produces and the WAL budget never ran out on every shard"
        );
        let i = produces % POOL_CLIENTS;
        let id = format!("w-{produces}.");
        let mut payload = id.clone().into_bytes();
        payload.resize(RECORD_BYTES, b'.');
        let r = produce(&mut pool[i], "", &payload).unwrap();
        produces += 1;
        match r.status {
            202 => {
                assert!(!latched[i], "connection {i}: 202 after a 500 ({id})");
                acked.insert(payload_id(&id).to_string());
            }
            500 => {
                assert_error_body(&r);
                latched[i] = true;
                server_errors += 1;
            }
            other => panic!("produce {id}: {other} {}", r.body),
        }
    }
    assert!(!acked.is_empty(), "the first produce already failed");
    // The node is no longer ready: a load balancer takes it out.
    let ready = node
        .served_client()
        .request("GET", "/readyz", &[], "")
        .unwrap();
    assert_eq!(ready.status, 503, "/readyz after the latch: {}", ready.body);
    assert!(ready.body.contains("ingress WAL failed"), "{}", ready.body);
    // Later produces keep failing, on the pool and on new connections.
    for (i, client) in pool.iter_mut().enumerate() {
        let r = produce(client, "?key=after", b"after the failure").unwrap();
        assert_eq!(r.status, 500, "connection {i} after the latch: {}", r.body);
        assert_error_body(&r);
        server_errors += 1;
    }
    drop(pool);
    for attempt in 0..32 {
        let mut client = node.served_client();
        let r = produce(&mut client, "", b"on a new connection").unwrap();
        assert_eq!(r.status, 500, "new connection {attempt}: {}", r.body);
        assert_error_body(&r);
        server_errors += 1;
    }
    // Every 500 is counted as an error, and nothing else (not /readyz's 503).
    let metrics = node
        .served_client()
        .request("GET", "/metrics", &[], "")
        .unwrap();
    let counted = metrics
        .body
        .lines()
        .find_map(|l| l.strip_prefix(r#"narad_errors_total{component="http",kind="5xx"} "#))
        .expect("the 5xx error series");
    assert_eq!(counted.parse::<f64>().unwrap(), server_errors as f64);
    // Reads are unaffected by the latch.
    let mut client = node.served_client();
    let topic = client
        .request("GET", &format!("/v1/topics/{TOPIC}"), &[], "")
        .unwrap();
    assert_eq!(
        topic.status, 200,
        "topic GET after the latch: {}",
        topic.body
    );
    let mut replay = Replay::new(&node);
    replay.pass();
    let before_restart = replay.records;

    node.sigterm();
    let status = exit_within(&mut node, common::WAIT_MAX);
    assert!(status.success(), "graceful stop after the latch: {status}");
    let restarted = Node::start_in(&node.data, 2, &[]);
    let started = Instant::now();
    Replay::new(&restarted).until_all_seen(&acked);
    let replayed_after = started.elapsed();
    // The restart cleared the latch.
    let r = produce(&mut restarted.served_client(), "", b"after the restart").unwrap();
    assert_eq!(r.status, 202, "produce after the restart: {}", r.body);
    let ready = restarted
        .served_client()
        .request("GET", "/readyz", &[], "")
        .unwrap();
    assert_eq!(
        ready.status, 200,
        "/readyz after the restart: {}",
        ready.body
    );
    eprintln!(
        "{produces} produces of {RECORD_BYTES} bytes, {} acknowledged; {before_restart} \
         records replayable before the restart, all acknowledged ones {replayed_after:?} after it",
        acked.len()
    );
}

/// Killed with three shards, killed again with two as soon as it is ready
/// (its leftover WAL perhaps half drained), restarted with four (the WAL of
/// shard 2, once a leftover, is its own again): every acknowledged record is
/// there.
#[test]
fn shard_counts_changing_across_kills_lose_no_acknowledged_record() {
    let mut node = Node::start_shards(3, &[]);
    create_topic(&node);
    let (acked, _) = load_then_kill(&mut node);
    let mut fewer = Node::start_in(&node.data, 2, &[]);
    fewer.sigkill();
    let more = Node::start_in(&node.data, 4, &[]);
    let mut replay = Replay::new(&more);
    replay.until_all_seen(&acked);
}

/// While one partition cannot commit (its directory is taken by a file), the
/// WAL's checkpoint waits at its first record and the other partitions'
/// records are committed above it. A graceful stop leaves which, and the
/// restart, with the partition healed, commits every record exactly once
/// (before the done-set, it committed nearly all of them again).
#[test]
fn a_graceful_restart_after_a_failing_partition_commits_nothing_twice() {
    const RECORDS: u64 = 300;
    let node = Node::start_shards(1, &[]);
    let mut client = node.served_client();
    let created = client
        .request(
            "POST",
            "/v1/topics",
            &[("content-type", "application/json")],
            r#"{"name":"stuck","partitions":3}"#,
        )
        .unwrap();
    assert_eq!(created.status, 201, "{}", created.body);
    let id = common::json_of(&created)["id"]
        .as_str()
        .unwrap()
        .to_string();
    let incarnation = node.data.join("topics").join("stuck").join(id);
    std::fs::create_dir_all(&incarnation).unwrap();
    let blocker = incarnation.join("p00001");
    std::fs::write(&blocker, "not a partition directory").unwrap();
    for batch in 0..RECORDS / 100 {
        let messages: Vec<String> = (0..100)
            .map(|i| {
                let n = batch * 100 + i;
                format!(r#"{{"payload":"r{n}","partition":{}}}"#, n % 3)
            })
            .collect();
        let body = format!(r#"{{"messages":[{}]}}"#, messages.join(","));
        let answer = client
            .request(
                "POST",
                "/v1/topics/stuck/produce/batch",
                &[("content-type", "application/json")],
                body,
            )
            .unwrap();
        assert_eq!(answer.status, 202, "{}", answer.body);
    }
    // Partition 1 shows no offsets while it cannot be opened.
    let total = |client: &mut Client| -> u64 {
        let topic = common::get_topic(client, "stuck");
        let stats = topic["partition_stats"].as_array().unwrap().clone();
        stats.iter().filter_map(|s| s["next_offset"].as_u64()).sum()
    };
    wait_until(WAIT_MAX, "partitions 0 and 2 committed", || {
        (total(&mut client) >= 2 * RECORDS / 3).then_some(())
    });
    node.sigterm();
    let mut node = node;
    assert!(exit_within(&mut node, Duration::from_secs(30)).success());
    std::fs::remove_file(&blocker).unwrap();

    let restarted = Node::start_in(&node.data, 1, &[]);
    log_until(&restarted, "resuming dispatch past the records");
    let mut client = restarted.served_client();
    wait_until(WAIT_MAX, "every record committed", || {
        (total(&mut client) >= RECORDS).then_some(())
    });
    // Records committed twice would follow at once.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(total(&mut client), RECORDS);
}
