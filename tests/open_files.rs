//! A node whose open-file limit cannot hold `http.max_connections` beside what
//! its storage opens serves fewer connections at once, so that a flood of them
//! never takes the descriptors the WAL and the partition logs need: the
//! connections past that cap are answered 503 and closed, and every produce on
//! a served connection still commits.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

use common::{post_topic, produce_ok, wait_for_records, Node};

const PARTITIONS: u32 = 64;

#[test]
fn a_flood_of_connections_leaves_the_storage_its_descriptors() {
    // A limit of 600 holds neither the default 4,096 connections nor the
    // storage's margin: the node serves a quarter of it, 150, at once.
    let node = Node::start_with_open_files(600, 1, &[]);
    let mut client = node.client();
    let body = format!(r#"{{"name":"fds","partitions":{PARTITIONS}}}"#);
    assert_eq!(post_topic(&mut client, &body).status, 201);

    // Far more idle connections than the limit leaves for them.
    let flood: Vec<TcpStream> = (0..560)
        .map(|_| TcpStream::connect(node.addr).expect("the kernel queues the connection"))
        .collect();
    std::thread::sleep(Duration::from_millis(500));

    // Every partition's log is opened to commit (more than a shard keeps
    // open at this limit, so some are closed and opened again).
    for partition in 0..PARTITIONS {
        produce_ok(&mut client, "fds", &format!("partition={partition}"), b"x");
    }
    for partition in 0..PARTITIONS {
        wait_for_records(&mut client, "fds", partition, 1);
    }

    // Connections past the cap are told so (a few at a time: the rest wait in
    // the kernel's queue, holding no descriptor of the node's).
    let refused = flood
        .into_iter()
        .filter(|stream| {
            let mut stream = stream;
            stream.set_nonblocking(true).unwrap();
            let mut head = [0u8; 12];
            matches!(stream.read(&mut head), Ok(12) if &head == b"HTTP/1.1 503")
        })
        .count();
    assert!(refused > 0, "none of 560 connections was refused");
    let short: Vec<String> = node
        .log
        .try_iter()
        .filter(|line| line.contains("Too many open files"))
        .collect();
    assert!(
        short.is_empty(),
        "the node ran out of descriptors: {short:#?}"
    );
}
