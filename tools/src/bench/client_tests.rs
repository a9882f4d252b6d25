//! Tests of the client: server addresses, topic facts, request heads and what
//! a connection reads from a server's answers.

use super::*;

#[test]
fn a_topics_facts_are_read_from_its_json() {
    let topic = r#"{"name":"t","visibility_timeout_ms":120000,"partitions":3}"#;
    assert_eq!(
        facts_of(topic),
        TopicFacts {
            visibility: Duration::from_secs(120),
            partitions: Some(3)
        }
    );
    let bare = TopicFacts {
        visibility: VISIBILITY_DEFAULT,
        partitions: None,
    };
    assert_eq!(facts_of(r#"{"name":"t"}"#), bare);
    assert_eq!(facts_of("not json"), bare);
}

#[test]
fn server_accepts_ip_and_localhost_with_a_port() {
    let s = Server::parse("http://127.0.0.1:7942").unwrap();
    assert_eq!(s.addr, "127.0.0.1:7942".parse().unwrap());
    assert_eq!(s.authority, "127.0.0.1:7942");
    let s = Server::parse("http://localhost:80/").unwrap();
    assert_eq!(s.addr, "127.0.0.1:80".parse().unwrap());
    let s = Server::parse("http://[::1]:9000").unwrap();
    assert_eq!(s.addr, "[::1]:9000".parse().unwrap());
}

#[test]
fn server_refuses_anything_else() {
    for bad in [
        "https://127.0.0.1:7942",
        "127.0.0.1:7942",
        "http://127.0.0.1",
        "http://127.0.0.1:0",
        "http://example.com:7942",
        "http://127.0.0.1:7942/v1",
        "http://::1:7942",
        "http://[127.0.0.1]:7942",
        "http://u@127.0.0.1:7942",
    ] {
        assert!(Server::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn topic_path_encodes_reserved_bytes() {
    assert_eq!(
        topic_path("orders.v1", "/produce"),
        "/v1/topics/orders.v1/produce"
    );
    assert_eq!(topic_path("a b/c", ""), "/v1/topics/a%20b%2Fc");
}

fn head(request: Request<'_>) -> String {
    let mut out = Vec::new();
    request.render_head(&mut out);
    String::from_utf8(out).unwrap()
}

#[test]
fn heads_are_rendered_from_the_template() {
    let server = Server::parse("http://127.0.0.1:7942").unwrap();
    let produce = RequestTemplate::new(
        Method::Post,
        "/v1/topics/t/produce",
        &server,
        "application/octet-stream",
    );
    assert_eq!(
        head(produce.build(&[b'x'; 1024])),
        "POST /v1/topics/t/produce HTTP/1.1\r\nHost: 127.0.0.1:7942\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: 1024\r\n\r\n"
    );
    assert_eq!(
        head(produce.build(&[])),
        "POST /v1/topics/t/produce HTTP/1.1\r\nHost: 127.0.0.1:7942\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: 0\r\n\r\n"
    );
    let ping = RequestTemplate::get("/healthz", &server);
    assert_eq!(
        head(ping.build(&[])),
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:7942\r\n\r\n"
    );
    let ack = RequestTemplate::new(
        Method::Post,
        "/v1/topics/t/ack",
        &server,
        "application/json",
    )
    .with_client_header();
    assert_eq!(
        head(ack.build_to("/v1/topics/t/ack?receipt_handle=0:1:77", &[])),
        "POST /v1/topics/t/ack?receipt_handle=0:1:77 HTTP/1.1\r\nHost: 127.0.0.1:7942\r\n\
         Content-Type: application/json\r\nX-Narad-Client: narad-bench\r\n\
         Content-Length: 0\r\n\r\n"
    );
}

#[test]
fn lengths_print_in_decimal() {
    for n in [0, 7, 10, 1024, 16 << 20, u64::MAX] {
        let mut out = b"x".to_vec();
        push_decimal(&mut out, n);
        assert_eq!(out, format!("x{n}").into_bytes());
    }
}

#[test]
fn only_visible_origin_form_targets_pass() {
    assert!(is_request_target(
        "/v1/topics/a%20b/ack?receipt_handle=0:1:2"
    ));
    for bad in [
        "",
        "v1/topics",
        "/a b",
        "/a\r\nX: y",
        "/caf\u{e9}",
        "http://h/x",
    ] {
        assert!(!is_request_target(bad), "{bad:?}");
    }
}

/// Serves one connection on a loopback listener: reads each request
/// (head and `Content-Length` body), answers it with the next of
/// `answers`, and closes after the last. Returns the requests read.
fn serve_canned(answers: Vec<&'static [u8]>) -> (Server, std::thread::JoinHandle<Vec<String>>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = Server::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
    let handle = std::thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        let mut requests = Vec::new();
        let mut pending = Vec::new();
        for answer in answers {
            let request = loop {
                let text = String::from_utf8_lossy(&pending).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let length: usize = text[..end]
                        .lines()
                        .find_map(|l| l.strip_prefix("Content-Length: "))
                        .map_or(0, |n| n.parse().unwrap());
                    if pending.len() >= end + 4 + length {
                        let rest = pending.split_off(end + 4 + length);
                        break String::from_utf8(std::mem::replace(&mut pending, rest)).unwrap();
                    }
                }
                let mut buf = [0u8; 4096];
                let n = socket.read(&mut buf).unwrap();
                assert!(n > 0, "the client closed early");
                pending.extend_from_slice(&buf[..n]);
            };
            requests.push(request);
            socket.write_all(answer).unwrap();
        }
        requests
    });
    (server, handle)
}

#[test]
fn a_connection_reads_chunks_and_ends_when_the_server_closes() {
    let (server, handle) = serve_canned(vec![
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n",
        b"HTTP/1.1 202 Accepted\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
    ]);
    let template = RequestTemplate::new(Method::Post, "/p", &server, "text/plain");
    let outcome = super::super::evloop::run(async move {
        let mut conn = Conn::open(&server).await.unwrap();
        let mut body = Vec::new();
        let first = conn.send_into(template.build(b"abc"), &mut body).await;
        let second = conn.send(template.build_to("/q?x=1", &[])).await;
        let third = conn.send(template.build(b"abc")).await;
        (first, body, second, third)
    })
    .unwrap();
    let (first, body, second, third) = outcome;
    assert_eq!((first, &body[..]), (Ok(200), &b"hello"[..]));
    assert_eq!(second, Ok(202));
    assert_eq!(
        third,
        Err("the server ended the connection (Connection: close)".to_string())
    );
    let requests = handle.join().unwrap();
    assert_eq!(requests.len(), 2);
    assert!(
        requests[0].starts_with("POST /p HTTP/1.1\r\n"),
        "{requests:?}"
    );
    assert!(
        requests[0].ends_with("Content-Length: 3\r\n\r\nabc"),
        "{requests:?}"
    );
    assert!(
        requests[1].starts_with("POST /q?x=1 HTTP/1.1\r\n"),
        "{requests:?}"
    );
}

#[test]
fn a_link_never_hands_out_a_connection_the_server_ended() {
    let (server, handle) = serve_canned(vec![
        b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n",
    ]);
    let template = RequestTemplate::new(Method::Post, "/p", &server, "text/plain");
    let outcome = super::super::evloop::run(async move {
        let mut link = Link::new(Conn::open(&server).await.unwrap());
        let Opened::Ready(conn) = link.get(&server).await else {
            panic!("the first connection is ready");
        };
        let status = conn.send(template.build(b"abc")).await;
        // The listener is gone with its one connection: the link must try
        // to open a new one, not hand back the ended one.
        handle.join().unwrap();
        let again = matches!(link.get(&server).await, Opened::Retry);
        (status, again)
    })
    .unwrap();
    assert_eq!(outcome, (Ok(204), true));
}

#[test]
fn bytes_after_a_response_keep_its_answer_and_end_the_connection() {
    let (server, handle) =
        serve_canned(vec![b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\n"]);
    let template = RequestTemplate::get("/healthz", &server);
    let (first, second) = super::super::evloop::run(async move {
        let mut conn = Conn::open(&server).await.unwrap();
        let first = conn.send(template.build(&[])).await;
        let second = conn.send(template.build(&[])).await;
        (first, second)
    })
    .unwrap();
    assert_eq!(first, Ok(204), "the answer itself stands");
    let second = second.unwrap_err();
    assert!(
        second.contains("bytes after the end of a response"),
        "{second}"
    );
    assert_eq!(handle.join().unwrap().len(), 1);
}
