//! Building responses and guarding requests, the same way on every route.
//!
//! The reference's conventions live here so that handlers cannot drift from them:
//! errors are `{"error":"…"}` JSON, except unknown routes (404) and wrong methods
//! (405), which are plain text; a request that changes state (POST, PUT, PATCH)
//! must say what it sends (`Content-Type: application/json` or
//! `application/octet-stream`) or carry `X-Narad-Client`, else 415, bodiless or not:
//! a browser form cannot set either, so this guard keeps cross-site form posts out;
//! a body is read only up to a cap, past which the answer is 413.
//!
//! Which cores: every shard, on every request; nothing here keeps state.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{
    HeaderMap, HeaderValue, ALLOW, CONNECTION, CONTENT_TYPE, EXPECT, HOST, RETRY_AFTER,
    TRANSFER_ENCODING,
};
use hyper::{Method, Response, StatusCode};

/// Every response body: whole, in memory. Responses are small JSON documents or
/// message payloads already bounded by the body cap.
pub type Body = Full<Bytes>;

/// The reference's request body cap (1 MiB).
pub const REQUEST_BODY_BYTES_MAX: usize = 1 << 20;

/// The header a client sets to pass the 415 guard whatever its Content-Type.
pub const CLIENT_HEADER: &str = "x-narad-client";

const JSON: &str = "application/json";
const TEXT: &str = "text/plain; charset=utf-8";

/// A JSON response.
pub fn json<T: serde::Serialize + ?Sized>(status: StatusCode, value: &T) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    with_type(status, JSON, Bytes::from(body))
}

/// A JSON response whose body is fixed.
pub fn json_static(status: StatusCode, body: &'static str) -> Response<Body> {
    with_type(status, JSON, Bytes::from_static(body.as_bytes()))
}

/// An error response: `{"error": message}`.
pub fn error(status: StatusCode, message: &str) -> Response<Body> {
    json(status, &serde_json::json!({ "error": message }))
}

/// An error the client should retry after `seconds`: `{"error": message}` with
/// `Retry-After`.
pub fn retry_later(status: StatusCode, message: &str, seconds: &'static str) -> Response<Body> {
    let mut response = error(status, message);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static(seconds));
    response
}

/// A plain-text response.
pub fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    with_type(status, TEXT, Bytes::from_static(body.as_bytes()))
}

/// 404 for a path no route has, in the reference's words.
pub fn not_found() -> Response<Body> {
    text(StatusCode::NOT_FOUND, "404 page not found\n")
}

/// 405 for a path that exists with other methods.
pub fn method_not_allowed(allow: &str) -> Response<Body> {
    let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n");
    if let Ok(value) = HeaderValue::from_str(allow) {
        response.headers_mut().insert(ALLOW, value);
    }
    response
}

/// 503 while the node stops: the client should retry (elsewhere) in a second, and
/// not on this connection, which closes after the answer.
pub fn draining() -> Response<Body> {
    let mut response = retry_later(StatusCode::SERVICE_UNAVAILABLE, "shutting down", "1");
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

/// 503 while the node recovers its storage: the client should retry in a second
/// (the connection stays open).
pub fn recovering() -> Response<Body> {
    retry_later(
        StatusCode::SERVICE_UNAVAILABLE,
        "not ready: storage recovery in progress",
        "1",
    )
}

fn with_type(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Body> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// A request refused before its endpoint runs: the status and message of its
/// `{"error": …}` answer. Kept small so that `Result`s carrying it stay cheap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub message: &'static str,
}

impl Refusal {
    pub fn into_response(self) -> Response<Body> {
        error(self.status, self.message)
    }
}

/// Whether `method` changes state and so must pass [`content_type_guard`].
pub fn needs_content_type(method: &Method) -> bool {
    matches!(*method, Method::POST | Method::PUT | Method::PATCH)
}

/// The 415 rule: `Ok` when the request declares JSON or octet-stream content (any
/// parameters, any case) or carries `X-Narad-Client`.
pub fn content_type_guard(headers: &HeaderMap) -> Result<(), Refusal> {
    if headers.contains_key(CLIENT_HEADER) {
        return Ok(());
    }
    let media_type = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim());
    match media_type {
        Some(t) if t.eq_ignore_ascii_case(JSON) || t.eq_ignore_ascii_case("application/octet-stream") => Ok(()),
        _ => Err(Refusal {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            message: "Content-Type must be application/json or application/octet-stream (or send X-Narad-Client)",
        }),
    }
}

/// A body sent in a transfer coding other than `chunked`, the only one the
/// server decodes, would be taken as its coded bytes: refused before the body
/// is read. RFC 9112 (6.1) suggests 501; it is the client's input that is
/// wrong, so it is a 400 here, as all bad input is, and stays out of the
/// node's 5xx errors.
pub fn transfer_coding_guard(headers: &HeaderMap) -> Result<(), Refusal> {
    const NOT_CHUNKED: Refusal = Refusal {
        status: StatusCode::BAD_REQUEST,
        message: "Transfer-Encoding other than chunked is not supported (use Content-Encoding on a batch)",
    };
    for value in headers.get_all(TRANSFER_ENCODING) {
        let codings = value.to_str().map_err(|_| NOT_CHUNKED)?;
        if codings
            .split(',')
            .any(|c| !c.trim().eq_ignore_ascii_case("chunked"))
        {
            return Err(NOT_CHUNKED);
        }
    }
    Ok(())
}

/// RFC 9112 (3.2): an HTTP/1.1 request without a `Host` header, or any
/// request with more than one, is refused 400. Proxies and virtual hosting
/// route on it, so a request whose target cannot be told is not served.
pub fn host_guard(version: hyper::Version, headers: &HeaderMap) -> Result<(), Refusal> {
    let mut hosts = headers.get_all(HOST).iter();
    match (hosts.next(), hosts.next()) {
        (None, _) if version == hyper::Version::HTTP_11 => Err(Refusal {
            status: StatusCode::BAD_REQUEST,
            message: "an HTTP/1.1 request needs a Host header",
        }),
        (Some(_), Some(_)) => Err(Refusal {
            status: StatusCode::BAD_REQUEST,
            message: "a request carries one Host header, not several",
        }),
        _ => Ok(()),
    }
}

/// RFC 9110 (10.1.1): an expectation the server cannot meet is answered 417
/// rather than ignored, as the reference's server does. `100-continue` is the
/// only one served (hyper sends the 100 when the body is first read); an empty
/// value asks for nothing.
pub fn expect_guard(headers: &HeaderMap) -> Result<(), Refusal> {
    let unmet = headers.get_all(EXPECT).iter().any(|value| {
        let value = value.as_bytes().trim_ascii();
        !value.is_empty() && !value.eq_ignore_ascii_case(b"100-continue")
    });
    if unmet {
        return Err(Refusal {
            status: StatusCode::EXPECTATION_FAILED,
            message: "the only expectation this server meets is Expect: 100-continue",
        });
    }
    Ok(())
}

/// A query whose percent-escapes do not decode (`%zz`, a `%` at the end) is
/// refused 400: read leniently, the escape would stand for itself, and a
/// `key=%zz` would place the record by bytes the client never meant.
pub fn query_guard(query: Option<&str>) -> Result<(), Refusal> {
    let Some(query) = query else {
        return Ok(());
    };
    let bytes = query.as_bytes();
    for at in memchr::memchr_iter(b'%', bytes) {
        let escape = bytes.get(at + 1..at + 3);
        if !escape.is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit)) {
            return Err(Refusal {
                status: StatusCode::BAD_REQUEST,
                message:
                    "the query holds a % not followed by two hex digits: percent-encode it as %25",
            });
        }
    }
    Ok(())
}

/// Reads a whole request body of at most `limit_bytes` within `timeout`
/// (`http.read_timeout`, which hyper applies to the headers only): 413 past the
/// cap, 408 past the time, 400 when the body cannot be read (the client went away
/// or sent a malformed chunk). Without the deadline a client that sends its
/// headers and then nothing would hold its connection, and whatever the handler
/// reserved for it (a batch's share of `http.max_batch_body_bytes_in_flight`),
/// for ever.
pub async fn read_body<B>(
    body: B,
    limit_bytes: usize,
    timeout: std::time::Duration,
) -> Result<Bytes, Refusal>
where
    B: hyper::body::Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    read_body_admitting(body, limit_bytes, timeout, |_| true)
        .await
        .map_err(|stop| stop.expect("every frame is admitted"))
}

/// [`read_body`], asking `admit` before keeping each piece of the body (its
/// length): `Err(None)` when `admit` said no, which stops the read at once.
/// A handler uses it to count a body whose length was not declared in a
/// budget as it arrives, rather than reserving the largest body up front.
///
/// A body that came in one piece is kept as it came; one that came in pieces
/// is joined into one buffer sized by its declared length, so a body is held
/// once, not once in pieces and once joined.
pub async fn read_body_admitting<B>(
    body: B,
    limit_bytes: usize,
    timeout: std::time::Duration,
    mut admit: impl FnMut(usize) -> bool,
) -> Result<Bytes, Option<Refusal>>
where
    B: hyper::body::Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    const TOO_LARGE: Refusal = Refusal {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        message: "request body too large",
    };
    let declared = body.size_hint().exact();
    // A declared length past the cap is refused before anything is read: the
    // client does not send the body for nothing, and one that asked
    // `Expect: 100-continue` is not told to go on (hyper sends the 100 only
    // when the body is first read).
    if declared.is_some_and(|n| n > limit_bytes as u64) {
        return Err(Some(TOO_LARGE));
    }
    let read = async {
        let mut body = std::pin::pin!(body);
        let mut first: Option<Bytes> = None;
        let mut joined = bytes::BytesMut::new();
        let mut len = 0usize;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else {
                return Err(Some(Refusal {
                    status: StatusCode::BAD_REQUEST,
                    message: "cannot read the request body",
                }));
            };
            // Trailers carry nothing a handler reads.
            let Ok(mut data) = frame.into_data() else {
                continue;
            };
            // Free for `Bytes` (hyper's), a copy for other bodies.
            let remaining = bytes::Buf::remaining(&data);
            let data = bytes::Buf::copy_to_bytes(&mut data, remaining);
            if data.is_empty() {
                continue;
            }
            len += data.len();
            if len > limit_bytes {
                return Err(Some(TOO_LARGE));
            }
            if !admit(data.len()) {
                return Err(None);
            }
            match first.take() {
                None if joined.is_empty() => first = Some(data),
                held => {
                    if let Some(held) = held {
                        let room = declared.map_or(len, |n| n as usize).clamp(len, limit_bytes);
                        joined.reserve(room);
                        joined.extend_from_slice(&held);
                    }
                    joined.extend_from_slice(&data);
                }
            }
        }
        Ok(first.unwrap_or_else(|| joined.freeze()))
    };
    let deadline = async {
        narad_io::rt::sleep(timeout).await;
        Err(Some(Refusal {
            status: StatusCode::REQUEST_TIMEOUT,
            message: "request body not received within http.read_timeout",
        }))
    };
    let bytes = futures_lite::future::or(read, deadline).await?;
    assert!(bytes.len() <= limit_bytes);
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn state_changing_requests_must_declare_their_content() {
        for ok in [
            &[("content-type", "application/json")][..],
            &[("content-type", "Application/JSON; charset=utf-8")],
            &[("content-type", "application/octet-stream")],
            &[("x-narad-client", "cli/1")],
            &[("x-narad-client", ""), ("content-type", "text/plain")],
        ] {
            assert!(content_type_guard(&headers(ok)).is_ok(), "{ok:?}");
        }
        for refused in [
            &[][..],
            &[("content-type", "text/plain")],
            &[("content-type", "application/x-www-form-urlencoded")],
            &[("content-type", "multipart/form-data; boundary=x")],
            &[("content-type", "application/jsonx")],
        ] {
            let response = content_type_guard(&headers(refused))
                .unwrap_err()
                .into_response();
            assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
            assert_eq!(response.headers()[CONTENT_TYPE], JSON);
        }
        assert!(needs_content_type(&Method::POST));
        assert!(needs_content_type(&Method::PATCH));
        assert!(needs_content_type(&Method::PUT));
        assert!(!needs_content_type(&Method::GET));
        assert!(!needs_content_type(&Method::DELETE));
    }

    #[test]
    fn bodies_past_the_cap_are_413() {
        narad_io::rt::run_local(None, async {
            let second = std::time::Duration::from_secs(1);
            let read = |len: usize| read_body(Full::new(Bytes::from(vec![7u8; len])), 16, second);
            assert_eq!(read(16).await.unwrap().len(), 16);
            assert_eq!(read(0).await.unwrap().len(), 0);
            assert_eq!(
                read(17).await.unwrap_err().status,
                StatusCode::PAYLOAD_TOO_LARGE
            );
        });
    }

    #[test]
    fn a_query_whose_escapes_do_not_decode_is_400() {
        for ok in [
            None,
            Some(""),
            Some("key=a%20b"),
            Some("key=%E2%82%ac&x=1"),
            Some("a=%25"),
        ] {
            assert!(query_guard(ok).is_ok(), "{ok:?}");
        }
        for bad in ["key=%zz", "key=%", "key=%4", "a=1&key=%g0", "%%41"] {
            let refusal = query_guard(Some(bad)).unwrap_err();
            assert_eq!(refusal.status, StatusCode::BAD_REQUEST, "{bad}");
        }
    }

    #[test]
    fn a_request_needs_one_host_header_from_http_1_1() {
        use hyper::Version;
        let host = headers(&[("host", "example")]);
        assert!(host_guard(Version::HTTP_11, &host).is_ok());
        assert!(host_guard(Version::HTTP_10, &HeaderMap::new()).is_ok());
        let refusal = host_guard(Version::HTTP_11, &HeaderMap::new()).unwrap_err();
        assert_eq!(refusal.status, StatusCode::BAD_REQUEST);
        let mut two = host.clone();
        two.append(HOST, HeaderValue::from_static("other"));
        for version in [Version::HTTP_10, Version::HTTP_11] {
            let refusal = host_guard(version, &two).unwrap_err();
            assert_eq!(refusal.status, StatusCode::BAD_REQUEST, "{version:?}");
        }
    }

    #[test]
    fn expectations_other_than_100_continue_are_417() {
        for ok in [
            &[][..],
            &[("expect", "100-continue")],
            &[("expect", " 100-Continue ")],
            &[("expect", "")],
        ] {
            assert!(expect_guard(&headers(ok)).is_ok(), "{ok:?}");
        }
        for refused in [
            &[("expect", "something-else")][..],
            &[("expect", "100-continue, x")],
        ] {
            let refusal = expect_guard(&headers(refused)).unwrap_err();
            assert_eq!(
                refusal.status,
                StatusCode::EXPECTATION_FAILED,
                "{refused:?}"
            );
        }
    }

    #[test]
    fn transfer_codings_other_than_chunked_are_400() {
        for ok in [
            &[][..],
            &[("transfer-encoding", "chunked")],
            &[("transfer-encoding", "Chunked")],
        ] {
            assert!(transfer_coding_guard(&headers(ok)).is_ok(), "{ok:?}");
        }
        for refused in [
            &[("transfer-encoding", "gzip, chunked")][..],
            &[("transfer-encoding", "chunked, ")],
        ] {
            let refusal = transfer_coding_guard(&headers(refused)).unwrap_err();
            assert_eq!(refusal.status, StatusCode::BAD_REQUEST, "{refused:?}");
        }
        // Two header lines are one list.
        let mut two = headers(&[("transfer-encoding", "gzip")]);
        two.append(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        assert!(transfer_coding_guard(&two).is_err());
    }

    /// A body that declares its `.0` bytes and must never be read.
    struct Declared(u64);

    impl hyper::body::Body for Declared {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
            panic!("a body declared past the cap was read");
        }

        fn size_hint(&self) -> hyper::body::SizeHint {
            hyper::body::SizeHint::with_exact(self.0)
        }
    }

    /// A declared length past the cap is refused before the body is read (and
    /// so before hyper answers an `Expect: 100-continue`).
    #[test]
    fn a_declared_length_past_the_cap_is_413_before_the_body_is_read() {
        narad_io::rt::run_local(None, async {
            let second = std::time::Duration::from_secs(1);
            let refused = read_body(Declared(17), 16, second).await.unwrap_err();
            assert_eq!(refused.status, StatusCode::PAYLOAD_TOO_LARGE);
            let refused = read_body(Declared(u64::MAX), 16, second).await.unwrap_err();
            assert_eq!(refused.status, StatusCode::PAYLOAD_TOO_LARGE);
        });
    }

    /// A body that arrives in the given pieces.
    struct Pieces(std::collections::VecDeque<Bytes>);

    impl hyper::body::Body for Pieces {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
            std::task::Poll::Ready(self.0.pop_front().map(|b| Ok(hyper::body::Frame::data(b))))
        }
    }

    #[test]
    fn a_body_is_joined_from_its_pieces_each_admitted_first() {
        narad_io::rt::run_local(None, async {
            let second = std::time::Duration::from_secs(1);
            let pieces = |parts: &[&'static [u8]]| {
                Pieces(parts.iter().map(|p| Bytes::from_static(p)).collect())
            };
            let mut seen = Vec::new();
            let whole = read_body_admitting(pieces(&[b"ab", b"", b"cde"]), 8, second, |n| {
                seen.push(n);
                true
            })
            .await
            .unwrap();
            assert_eq!((&whole[..], &seen[..]), (&b"abcde"[..], &[2, 3][..]));
            // One piece is kept as it came, not copied.
            let one = Bytes::from_static(b"xyz");
            let kept = read_body_admitting(Pieces([one.clone()].into()), 8, second, |_| true)
                .await
                .unwrap();
            assert_eq!(kept.as_ptr(), one.as_ptr());
            // A piece not admitted stops the read; one past the cap is 413.
            let mut admitted = 0;
            let stopped = read_body_admitting(pieces(&[b"ab", b"cd", b"ef"]), 8, second, |_| {
                admitted += 1;
                admitted < 2
            })
            .await;
            assert!(matches!(stopped, Err(None)));
            let capped = read_body_admitting(pieces(&[b"abcd", b"efghi"]), 8, second, |_| true)
                .await
                .unwrap_err()
                .unwrap();
            assert_eq!(capped.status, StatusCode::PAYLOAD_TOO_LARGE);
        });
    }

    /// A body whose client sent its headers and then nothing.
    struct Silent;

    impl hyper::body::Body for Silent {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
            std::task::Poll::Pending
        }
    }

    #[test]
    fn a_body_that_does_not_arrive_within_the_read_timeout_is_408() {
        narad_io::rt::run_local(None, async {
            let started = std::time::Instant::now();
            let timeout = std::time::Duration::from_millis(50);
            let refused = read_body(Silent, 1024, timeout).await.unwrap_err();
            assert_eq!(refused.status, StatusCode::REQUEST_TIMEOUT);
            assert!(started.elapsed() >= timeout);
        });
    }

    #[test]
    fn error_bodies_are_json_and_route_errors_plain_text() {
        let body = |r: Response<Body>| {
            let bytes = futures_lite::future::block_on(r.into_body().collect())
                .unwrap()
                .to_bytes();
            String::from_utf8(bytes.to_vec()).unwrap()
        };
        assert_eq!(
            body(error(StatusCode::BAD_REQUEST, "bad \"name\"")),
            r#"{"error":"bad \"name\""}"#
        );
        let response = method_not_allowed("GET, HEAD");
        assert_eq!(response.headers()[ALLOW], "GET, HEAD");
        assert_eq!(response.headers()[CONTENT_TYPE], TEXT);
        assert_eq!(body(not_found()), "404 page not found\n");
        let response = draining();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[RETRY_AFTER], "1");
        assert_eq!(body(response), r#"{"error":"shutting down"}"#);
    }
}
