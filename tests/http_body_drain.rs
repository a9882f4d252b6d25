//! A request's body that its route answered without reading (an early 404,
//! 415 or 400): read to its end after the answer so that the connection
//! serves the next request, except where the client may never send it
//! (`Expect: 100-continue`) or the connection closes anyway, and never past
//! the start of a stop.

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::{create_topic, rest_after_one_second_timeout, Client, Node};

/// An error answered before a small body arrived (an unknown topic, an
/// unsupported media type, a bad query) keeps the connection, as the answer
/// says by not saying `Connection: close`: the server reads the rest of the
/// body after answering, and a client's pool that reuses the connection has
/// its next request served. A body that does not come within the read
/// timeout has its answer at once all the same, and then the connection
/// closes.
#[test]
fn an_error_to_a_body_still_on_its_way_keeps_the_connection() {
    let node = Node::start(&[("NARAD_HTTP_READ_TIMEOUT", "1s")]);
    let mut client = node.client();
    create_topic(&mut client, "late");
    let cases = [
        (
            "/v1/topics/nothing/produce",
            "application/octet-stream",
            404,
        ),
        ("/v1/topics/late/produce", "text/plain", 415),
        (
            "/v1/topics/late/produce?partition=9",
            "application/octet-stream",
            400,
        ),
    ];
    for (path, media, status) in cases {
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: test\r\ncontent-type: {media}\r\n\
             content-length: 10\r\n\r\n"
        );
        client.stream.write_all(head.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        client.stream.write_all(b"0123456789").unwrap();
        let answer = client.read_response(false).unwrap();
        assert_eq!(answer.status, status, "{path}: {answer:?}");
        assert_eq!(answer.header("connection"), None, "{path}: {answer:?}");
        if status == 404 {
            // Idle past the read timeout: the body's bytes did not start a
            // next request whose head the server would time.
            std::thread::sleep(Duration::from_millis(1_500));
        }
        let next = client.request("GET", "/healthz", &[], "").unwrap();
        assert_eq!(next.status, 200, "{path}: the connection serves on");
    }

    // Half the body, then nothing: answered at once, closed at the read timeout.
    let took = answered_before_the_body(&mut client, b"01234");
    assert!(took < Duration::from_millis(800), "answered at once");
    assert_eq!(rest_after_one_second_timeout(&mut client), "");
}

/// A body drained after its early answer ends the request as soon as its last
/// byte is in: the idle timeout runs from there, not from the read timeout.
#[test]
fn a_drained_body_starts_the_idle_wait_once_it_is_in() {
    let node = Node::start(&[
        ("NARAD_HTTP_READ_TIMEOUT", "8s"),
        ("NARAD_HTTP_IDLE_TIMEOUT", "1s"),
    ]);
    let mut client = node.client();
    answered_before_the_body(&mut client, b"");
    client.stream.write_all(b"0123456789").unwrap();
    let sent = Instant::now();
    let mut rest = Vec::new();
    let _ = client.stream.read_to_end(&mut rest);
    let closed = sent.elapsed();
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    assert!(
        closed >= Duration::from_millis(800) && closed < Duration::from_secs(4),
        "closed {closed:?} after the body: the idle timeout is 1 s"
    );
}

/// Sends the head of a produce of 10 bytes to an unknown topic and `sent`
/// of its body, and reads its 404, answered before the rest; returns how long
/// the answer took.
fn answered_before_the_body(client: &mut Client, sent: &[u8]) -> Duration {
    let head = b"POST /v1/topics/nothing/produce HTTP/1.1\r\nhost: test\r\n\
                 content-type: application/octet-stream\r\ncontent-length: 10\r\n\r\n";
    client
        .stream
        .write_all(&[&head[..], sent].concat())
        .unwrap();
    let started = Instant::now();
    let answer = client.read_response(false).unwrap();
    assert_eq!(answer.status, 404, "{answer:?}");
    started.elapsed()
}

/// How long until the node closes the connection, and what it sent before.
fn closed_after(client: &mut Client) -> (Duration, String) {
    let started = Instant::now();
    let mut rest = Vec::new();
    let _ = client.stream.read_to_end(&mut rest);
    (
        started.elapsed(),
        String::from_utf8_lossy(&rest).into_owned(),
    )
}

/// A client that sent `Expect: 100-continue` hears no 100 when the route
/// answers without reading: it may never send the body, and send its next
/// request instead. The answer says the connection closes, and nothing of
/// what follows is taken for the body.
#[test]
fn an_early_answer_to_a_request_expecting_100_continue_closes_the_connection() {
    let node = Node::start(&[]);
    let mut client = node.client();
    let next = "GET /healthz HTTP/1.1\r\nhost: test\r\n\r\n";
    let head = format!(
        "POST /v1/topics/nothing/produce HTTP/1.1\r\nhost: test\r\n\
         content-type: application/octet-stream\r\nexpect: 100-continue\r\n\
         content-length: {}\r\n\r\n",
        next.len()
    );
    client.stream.write_all(head.as_bytes()).unwrap();
    let answer = client.read_response(false).unwrap();
    assert_eq!(answer.status, 404, "{answer:?}");
    assert_eq!(answer.header("connection"), Some("close"), "{answer:?}");
    // A client that reuses the connection anyway is not answered as if its
    // request were a body: the connection is closed.
    let _ = client.stream.write_all(next.as_bytes());
    let (waited, rest) = closed_after(&mut client);
    assert!(waited < Duration::from_secs(3), "closed after {waited:?}");
    assert!(!rest.contains("200"), "{rest:?}");
}

/// A request after which the connection closes anyway (`Connection: close`,
/// or HTTP/1.0 without keep-alive) is not held open for a body its route
/// did not read.
#[test]
fn a_connection_closing_after_its_request_is_not_held_for_the_body() {
    let node = Node::start(&[("NARAD_HTTP_READ_TIMEOUT", "10s")]);
    for (version, connection) in [("1.1", "connection: close\r\n"), ("1.0", "")] {
        let mut client = node.client();
        let head = format!(
            "POST /v1/topics/nothing/produce HTTP/{version}\r\nhost: test\r\n{connection}\
             content-type: application/octet-stream\r\ncontent-length: 10\r\n\r\n"
        );
        client.stream.write_all(head.as_bytes()).unwrap();
        let (waited, rest) = closed_after(&mut client);
        assert!(rest.contains(" 404 "), "HTTP/{version}: {rest:?}");
        assert!(
            waited < Duration::from_secs(3),
            "HTTP/{version}: closed after {waited:?}, not at once"
        );
    }
}

/// A stop does not wait for a body nobody needs any more: its answer went
/// out, so a client that never sends it does not hold the node for the read
/// timeout.
#[test]
fn a_stop_does_not_wait_for_a_drained_body() {
    let mut node = Node::start(&[
        ("NARAD_HTTP_READ_TIMEOUT", "10s"),
        ("NARAD_HTTP_SHUTDOWN_GRACE", "10s"),
    ]);
    let mut client = node.client();
    answered_before_the_body(&mut client, b"");
    let stopped = Instant::now();
    node.sigterm();
    assert!(node.wait_for_exit(Duration::from_secs(30)).success());
    let took = stopped.elapsed();
    assert!(took < Duration::from_secs(5), "the stop took {took:?}");
}
