//! The response reader against in-memory streams that hand out their bytes in
//! chosen pieces, so every split a socket could produce is exercised.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures_lite::future::block_on;

use super::*;

/// A stream over `data` whose reads end at each of `cuts` (increasing
/// offsets) and at the end, whatever room the reader offers.
struct Pieces {
    data: Vec<u8>,
    at: usize,
    cuts: Vec<usize>,
}

impl Pieces {
    fn new(data: &[u8], cuts: Vec<usize>) -> Pieces {
        assert!(cuts.windows(2).all(|w| w[0] < w[1]));
        Pieces {
            data: data.to_vec(),
            at: 0,
            cuts,
        }
    }

    fn whole(data: &[u8]) -> Pieces {
        Pieces::new(data, Vec::new())
    }

    /// One byte per read.
    fn bytewise(data: &[u8]) -> Pieces {
        Pieces::new(data, (1..data.len()).collect())
    }
}

impl AsyncRead for Pieces {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let len = this.data.len();
        let until = this
            .cuts
            .iter()
            .copied()
            .find(|&cut| cut > this.at)
            .unwrap_or(len)
            .min(len);
        let n = (until - this.at).min(buf.len());
        buf[..n].copy_from_slice(&this.data[this.at..this.at + n]);
        this.at += n;
        Poll::Ready(Ok(n))
    }
}

/// Reads one response, keeping its body.
fn read_one(
    reader: &mut ResponseReader,
    io: &mut Pieces,
    body_bytes_max: usize,
) -> Result<(Response, Vec<u8>), ResponseError> {
    let mut body = Vec::new();
    let response = block_on(reader.read(io, &mut Sink::keep(&mut body, body_bytes_max)))?;
    Ok((response, body))
}

fn read_all(data: &[u8]) -> Result<(Response, Vec<u8>), ResponseError> {
    read_one(
        &mut ResponseReader::new(),
        &mut Pieces::whole(data),
        1 << 20,
    )
}

const SIZED: &[u8] = b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\n\
Content-Length: 16\r\n\r\n{\"offset\":12345}";

const CHUNKED: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
5;name=value\r\nhello\r\n6 ; a=\"b;c\"\r\n world\r\n0;last\r\nX-Sum: 11\r\nY: z\r\n\r\n";

#[test]
fn a_sized_response_gives_its_status_and_body() {
    let (response, body) = read_all(SIZED).unwrap();
    assert_eq!(
        response,
        Response {
            status: 202,
            close: false
        }
    );
    assert_eq!(body, b"{\"offset\":12345}");
}

#[test]
fn a_chunked_body_skips_extensions_and_trailers() {
    let (response, body) = read_all(CHUNKED).unwrap();
    assert_eq!(response.status, 200);
    assert!(!response.close);
    assert_eq!(body, b"hello world");
    let upper =
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n";
    assert_eq!(read_all(upper).unwrap().1, b"0123456789");
}

#[test]
fn responses_in_a_row_leave_nothing_behind() {
    let stream = [SIZED, CHUNKED, SIZED].concat();
    let mut reader = ResponseReader::new();
    let mut io = Pieces::whole(&stream);
    let expected: [(u16, &[u8]); 2] = [(202, &SIZED[SIZED.len() - 16..]), (200, b"hello world")];
    for (status, body) in expected {
        let (response, got) = read_one(&mut reader, &mut io, 1 << 20).unwrap();
        assert_eq!((response.status, &got[..]), (status, body));
    }
    let (response, _) = read_one(&mut reader, &mut io, 1 << 20).unwrap();
    assert_eq!(response.status, 202);
    assert!(reader.buffered().is_empty());
    assert!(matches!(
        read_one(&mut reader, &mut io, 1 << 20),
        Err(ResponseError::Closed)
    ));
}

#[test]
fn a_response_split_at_any_byte_reads_the_same() {
    let stream = [SIZED, CHUNKED].concat();
    let expected: [(u16, &[u8]); 2] = [(202, b"{\"offset\":12345}"), (200, b"hello world")];
    let check = |mut io: Pieces, what: &str| {
        let mut reader = ResponseReader::new();
        for (status, body) in expected {
            let (response, got) =
                read_one(&mut reader, &mut io, 1 << 20).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!((response.status, &got[..]), (status, body), "{what}");
        }
        assert!(reader.buffered().is_empty(), "{what}");
    };
    for split in 1..stream.len() {
        check(
            Pieces::new(&stream, vec![split]),
            &format!("split at {split}"),
        );
        check(
            Pieces::new(&stream, vec![split, split + 1, split + 3]),
            &format!("splits from {split}"),
        );
    }
    check(Pieces::bytewise(&stream), "a byte per read");
}

#[test]
fn a_long_kept_body_is_read_straight_into_place() {
    let body: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let mut stream =
        format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
    stream.extend_from_slice(&body);
    let cuts = vec![40, 5000, 40_000, 70_001];
    let (_, got) = read_one(
        &mut ResponseReader::new(),
        &mut Pieces::new(&stream, cuts),
        1 << 20,
    )
    .unwrap();
    assert_eq!(got, body);
    // The same long body, chunked and read a kilobyte at a time.
    let mut chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for piece in body.chunks(30_000) {
        chunked.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        chunked.extend_from_slice(piece);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let cuts = (1..chunked.len() / 1024).map(|i| i * 1024).collect();
    let (_, got) = read_one(
        &mut ResponseReader::new(),
        &mut Pieces::new(&chunked, cuts),
        1 << 20,
    )
    .unwrap();
    assert_eq!(got, body);
}

#[test]
fn a_discarded_or_prefixed_body_is_still_read_to_its_end() {
    let stream = [CHUNKED, SIZED].concat();
    let mut reader = ResponseReader::new();
    let mut io = Pieces::bytewise(&stream);
    let response = block_on(reader.read(&mut io, &mut Sink::discard(1 << 20))).unwrap();
    assert_eq!(response.status, 200);
    let mut kept = Vec::new();
    let response =
        block_on(reader.read(&mut io, &mut Sink::keep_prefix(&mut kept, 4, 1 << 20))).unwrap();
    assert_eq!((response.status, &kept[..]), (202, &b"{\"of"[..]));
}

#[test]
fn a_body_above_the_bound_is_refused() {
    let err = read_one(&mut ResponseReader::new(), &mut Pieces::whole(SIZED), 15).unwrap_err();
    assert!(matches!(err, ResponseError::TooLarge("body", 15)), "{err}");
    let err = read_one(&mut ResponseReader::new(), &mut Pieces::whole(CHUNKED), 10).unwrap_err();
    assert!(matches!(err, ResponseError::TooLarge("body", 10)), "{err}");
    // The bound is checked before a declared length is read.
    let huge = b"HTTP/1.1 200 OK\r\nContent-Length: 9999999999999999999\r\n\r\n";
    let err = read_all(huge).unwrap_err();
    assert!(matches!(err, ResponseError::TooLarge("body", _)), "{err}");
    assert_eq!(err.to_string(), "the response's body exceeds 1048576 bytes");
}

#[test]
fn oversized_heads_are_refused() {
    let mut long = b"HTTP/1.1 200 OK\r\nX-Long: ".to_vec();
    long.resize(HEAD_BYTES_MAX + 100, b'a');
    long.extend_from_slice(b"\r\nContent-Length: 0\r\n\r\n");
    for io in [Pieces::whole(&long), Pieces::new(&long, vec![1000, 9000])] {
        let err = read_one(&mut ResponseReader::new(), &mut { io }, 1 << 20).unwrap_err();
        assert!(matches!(err, ResponseError::TooLarge("head", _)), "{err}");
    }
    // An unfinished head that fills the bound is refused without waiting for more.
    let err = read_all(&long[..HEAD_BYTES_MAX]).unwrap_err();
    assert!(matches!(err, ResponseError::TooLarge("head", _)), "{err}");
    let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
    for i in 0..=HEADERS_MAX {
        many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    let err = read_all(&many).unwrap_err();
    assert!(
        matches!(err, ResponseError::TooLarge("header count", _)),
        "{err}"
    );
}

#[test]
fn bad_chunk_framing_is_refused() {
    let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    for body in [
        "zz\r\nhello\r\n0\r\n\r\n",
        "\r\n",
        "-5\r\nhello\r\n0\r\n\r\n",
        "5\nhello\r\n0\r\n\r\n",
        "5\r\nhelloXX0\r\n\r\n",
        "11111111111111111\r\n",
        "5 6\r\nhello\r\n0\r\n\r\n",
        "0\r\nbad trailer\r\n\r\n",
    ] {
        let err = read_all(format!("{head}{body}").as_bytes()).unwrap_err();
        assert!(
            matches!(err, ResponseError::Malformed(_)),
            "{body:?}: {err}"
        );
    }
    let mut endless = head.as_bytes().to_vec();
    endless.extend_from_slice(b"5;");
    endless.resize(endless.len() + RECV_BUFFER_BYTES, b'x');
    let err = read_all(&endless).unwrap_err();
    assert!(
        matches!(err, ResponseError::TooLarge("chunk size line", _)),
        "{err}"
    );
}

#[test]
fn a_stream_that_ends_early_names_where() {
    assert!(matches!(read_all(b""), Err(ResponseError::Closed)));
    let chunk_data_end = CHUNKED.len() - 30;
    for (data, part) in [
        (&SIZED[..10], "head"),
        (&SIZED[..SIZED.len() - 1], "body"),
        (&CHUNKED[..CHUNKED.len() - 45], "chunk size line"),
        (&CHUNKED[..chunk_data_end], "chunk"),
        (&CHUNKED[..CHUNKED.len() - 2], "trailers"),
    ] {
        match read_all(data) {
            Err(ResponseError::Truncated(got)) => assert_eq!(got, part, "{data:?}"),
            other => panic!("{data:?}: {other:?}"),
        }
    }
    // A long kept body that ends early, on the direct path.
    let stream = b"HTTP/1.1 200 OK\r\nContent-Length: 50000\r\n\r\nshort";
    assert!(matches!(
        read_all(stream),
        Err(ResponseError::Truncated("body"))
    ));
}

#[test]
fn informational_heads_are_skipped_and_a_protocol_switch_refused() {
    let stream = [
        b"HTTP/1.1 100 Continue\r\n\r\n".as_slice(),
        b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n",
        SIZED,
    ]
    .concat();
    for io in [Pieces::whole(&stream), Pieces::bytewise(&stream)] {
        let (response, body) = read_one(&mut ResponseReader::new(), &mut { io }, 1 << 20).unwrap();
        assert_eq!((response.status, body.len()), (202, 16));
    }
    let switching = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n";
    assert!(matches!(
        read_all(switching),
        Err(ResponseError::Unsupported(_))
    ));
}

#[test]
fn close_and_framing_follow_the_headers() {
    let close =
        b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 2\r\n\r\nno";
    assert_eq!(
        read_all(close).unwrap(),
        (
            Response {
                status: 503,
                close: true
            },
            b"no".to_vec()
        )
    );
    let old = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok";
    assert!(read_all(old).unwrap().0.close);
    let old_kept = b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nok";
    assert!(!read_all(old_kept).unwrap().0.close);
    // Neither a length nor chunks: the body runs to the end of the stream.
    let unframed = b"HTTP/1.1 200 OK\r\n\r\nuntil the end";
    let (response, body) = read_all(unframed).unwrap();
    assert!(response.close);
    assert_eq!(body, b"until the end");
    // No body for 204 and 304, whatever the headers say.
    let empty = [
        b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n".as_slice(),
        SIZED,
    ]
    .concat();
    let mut reader = ResponseReader::new();
    let mut io = Pieces::whole(&empty);
    assert_eq!(read_one(&mut reader, &mut io, 100).unwrap().0.status, 204);
    assert_eq!(read_one(&mut reader, &mut io, 100).unwrap().0.status, 202);
    // A transfer coding overrides a length.
    let both = b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n";
    assert_eq!(read_all(both).unwrap().1, b"ok");
}

#[test]
fn header_values_that_cannot_be_trusted_are_refused() {
    for (head, malformed) in [
        ("Content-Length: 5\r\nContent-Length: 6", true),
        ("Content-Length: -1", true),
        ("Content-Length: 5x", true),
        ("Content-Length: ", true),
        ("Transfer-Encoding: gzip, chunked", false),
    ] {
        let response = format!("HTTP/1.1 200 OK\r\n{head}\r\n\r\nhello");
        let err = read_all(response.as_bytes()).unwrap_err();
        if malformed {
            assert!(matches!(err, ResponseError::Malformed(_)), "{head}: {err}");
        } else {
            assert!(
                matches!(err, ResponseError::Unsupported(_)),
                "{head}: {err}"
            );
        }
    }
    let same_twice = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok";
    assert_eq!(read_all(same_twice).unwrap().1, b"ok");
    assert!(matches!(
        read_all(b"HTTP/1.1 2000 OK\r\n\r\n"),
        Err(ResponseError::Malformed(_))
    ));
    assert!(matches!(
        read_all(b"SMTP ready\r\n\r\n"),
        Err(ResponseError::Malformed(_))
    ));
}

#[test]
fn a_head_that_straddles_the_buffer_end_is_moved_to_the_front() {
    // The first response ends 10 bytes before the end of one full buffer, so
    // the second one's head arrives split across the buffer's end.
    let head = "HTTP/1.1 200 OK\r\nContent-Length: ";
    let body_bytes = RECV_BUFFER_BYTES - 10 - head.len() - "16306\r\n\r\n".len();
    let first = format!("{head}{body_bytes}\r\n\r\n{}", "b".repeat(body_bytes));
    assert_eq!(first.len(), RECV_BUFFER_BYTES - 10);
    let stream = [first.as_bytes(), SIZED].concat();
    let mut reader = ResponseReader::new();
    let mut io = Pieces::whole(&stream);
    let response = block_on(reader.read(&mut io, &mut Sink::discard(1 << 20))).unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(reader.buffered(), &SIZED[..10]);
    let (response, body) = read_one(&mut reader, &mut io, 1 << 20).unwrap();
    assert_eq!(
        (response.status, &body[..]),
        (202, &b"{\"offset\":12345}"[..])
    );
}
