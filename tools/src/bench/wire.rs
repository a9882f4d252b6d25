//! The generator's HTTP/1.1 on the wire: reading one response (status line,
//! headers, and a body framed by `Content-Length`, by chunks, or by the end of
//! the stream) out of a connection's reused receive buffer.
//!
//! Which cores: the generator's one executor. A [`ResponseReader`] belongs to
//! one connection and is driven by the task that sent the request.
//!
//! Why this is hand-written rather than hyper's client: a load generator must
//! cost less than the server it measures, or it measures itself. hyper's client
//! is general: each request crosses a channel to a connection task and comes
//! back over a oneshot, and its headers are built into and parsed out of header
//! maps. Here the task that sends a request reads its response from the socket
//! itself, the status line and headers are parsed in place by `httparse`, and
//! only the three headers the generator acts on are looked at
//! (`Content-Length`, `Transfer-Encoding`, `Connection`).
//!
//! What it does not support, because the broker never needs it of a client:
//! TLS, pipelining (one request in flight per connection), HTTP/2, transfer
//! codings other than `chunked`, and informational (1xx) responses other than
//! `100 Continue`, which is skipped.
//!
//! Invariants: every byte the reader holds lies in `buf[start..end]`; a head
//! takes at most [`HEAD_BYTES_MAX`] bytes and a body at most the caller's
//! bound, so a misbehaving server costs a bounded buffer and a clear error,
//! never unbounded memory.

use std::fmt;
use std::io;

use futures_lite::io::{AsyncRead, AsyncReadExt};

/// The most bytes of a response head: status line, headers and blank line.
pub const HEAD_BYTES_MAX: usize = 8 << 10;
/// The most header lines in a head or a chunked body's trailer section.
pub const HEADERS_MAX: usize = 32;
/// A connection's receive buffer. A head, a chunk-size line and a trailer
/// section must each fit in it; body bytes only pass through it.
pub const RECV_BUFFER_BYTES: usize = 16 << 10;
/// The most informational heads (`100 Continue`, `103`) skipped before a final
/// response.
const CONTINUES_MAX: u32 = 4;

const _: () = assert!(HEAD_BYTES_MAX <= RECV_BUFFER_BYTES);
const _: () = assert!(HEADERS_MAX >= 8);

/// Why a response could not be read. After any of these the connection is in
/// an unknown state and must be closed.
#[derive(Debug)]
pub enum ResponseError {
    Io(io::Error),
    /// The stream ended before the first byte of a response.
    Closed,
    /// The stream ended inside the named part of a response.
    Truncated(&'static str),
    /// The named part outgrew its bound.
    TooLarge(&'static str, usize),
    /// The response is not valid HTTP/1.1.
    Malformed(String),
    /// Valid HTTP that this client does not speak.
    Unsupported(&'static str),
}

impl fmt::Display for ResponseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResponseError::Io(e) => write!(f, "connection failed: {e}"),
            ResponseError::Closed => write!(f, "the server closed the connection"),
            ResponseError::Truncated(part) => {
                write!(f, "the server closed the connection inside the {part}")
            }
            ResponseError::TooLarge(part, max) => {
                write!(f, "the response's {part} exceeds {max} bytes")
            }
            ResponseError::Malformed(why) => write!(f, "malformed response: {why}"),
            ResponseError::Unsupported(what) => write!(f, "unsupported response: {what}"),
        }
    }
}

impl From<io::Error> for ResponseError {
    fn from(e: io::Error) -> Self {
        ResponseError::Io(e)
    }
}

/// What became of a response's body.
pub struct Sink<'a> {
    /// Where kept bytes go; `None` drops them.
    out: Option<&'a mut Vec<u8>>,
    /// Bytes past this many are read but not kept.
    keep_bytes_max: usize,
    /// A body above this many bytes is an error.
    body_bytes_max: usize,
    /// Body bytes seen so far.
    seen_bytes: usize,
}

impl<'a> Sink<'a> {
    /// Reads the body and drops it.
    pub fn discard(body_bytes_max: usize) -> Sink<'static> {
        Sink {
            out: None,
            keep_bytes_max: 0,
            body_bytes_max,
            seen_bytes: 0,
        }
    }

    /// Keeps the whole body in `out` (cleared first).
    pub fn keep(out: &'a mut Vec<u8>, body_bytes_max: usize) -> Sink<'a> {
        Sink::keep_prefix(out, body_bytes_max, body_bytes_max)
    }

    /// Keeps the first `keep_bytes_max` bytes of the body in `out` (cleared
    /// first) and drops the rest.
    pub fn keep_prefix(
        out: &'a mut Vec<u8>,
        keep_bytes_max: usize,
        body_bytes_max: usize,
    ) -> Sink<'a> {
        assert!(keep_bytes_max <= body_bytes_max);
        out.clear();
        Sink {
            out: Some(out),
            keep_bytes_max,
            body_bytes_max,
            seen_bytes: 0,
        }
    }

    /// Counts `bytes` more of the body, before reading them.
    fn expect(&mut self, bytes: u64) -> Result<(), ResponseError> {
        let total = (self.seen_bytes as u64).saturating_add(bytes);
        if total > self.body_bytes_max as u64 {
            return Err(ResponseError::TooLarge("body", self.body_bytes_max));
        }
        self.seen_bytes = total as usize;
        Ok(())
    }

    /// Takes body bytes already counted by [`Sink::expect`].
    fn take(&mut self, bytes: &[u8]) {
        if let Some(out) = self.out.as_deref_mut() {
            let room = self.keep_bytes_max - out.len();
            out.extend_from_slice(&bytes[..bytes.len().min(room)]);
            assert!(out.len() <= self.keep_bytes_max);
        }
    }

    /// Room to read `bytes` body bytes straight into, when every one of them
    /// is to be kept.
    fn direct(&mut self, bytes: usize) -> Option<&mut Vec<u8>> {
        let out = self.out.as_deref_mut()?;
        (out.len() + bytes <= self.keep_bytes_max).then_some(out)
    }
}

/// A response's status and what it says about the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// The server will close the connection: no request may follow.
    pub close: bool,
}

/// How the body of a response is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    Empty,
    Length(u64),
    Chunked,
    /// Until the server closes the connection.
    ToEnd,
}

/// A parsed head, copied out of the buffer it was parsed from.
struct Head {
    status: u16,
    framing: Framing,
    close: bool,
}

/// Reads responses from one connection, through a receive buffer it reuses.
pub struct ResponseReader {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Default for ResponseReader {
    fn default() -> Self {
        ResponseReader::new()
    }
}

impl ResponseReader {
    pub fn new() -> ResponseReader {
        ResponseReader {
            buf: vec![0; RECV_BUFFER_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// Bytes received and not yet read as part of a response.
    pub fn buffered(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Reads one whole response, its body into `sink`.
    pub async fn read<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        sink: &mut Sink<'_>,
    ) -> Result<Response, ResponseError> {
        assert!(self.start <= self.end && self.end <= self.buf.len());
        let mut continues = 0;
        let head = loop {
            let head = self.read_head(io).await?;
            match head.status {
                // A switch of protocol is a response this client cannot go on
                // reading; other informational heads (100 Continue, 103 Early
                // Hints) come before the final answer, which is read after them.
                101 => return Err(ResponseError::Unsupported("101 Switching Protocols")),
                100..=199 if continues < CONTINUES_MAX => continues += 1,
                100..=199 => {
                    return Err(ResponseError::Unsupported("too many informational heads"))
                }
                _ => break head,
            }
        };
        let mut close = head.close;
        match head.framing {
            Framing::Empty => {}
            Framing::Length(bytes) => {
                sink.expect(bytes)?;
                self.read_body_bytes(io, bytes, sink, "body").await?;
            }
            Framing::Chunked => self.read_chunked(io, sink).await?,
            Framing::ToEnd => {
                self.read_to_end(io, sink).await?;
                close = true;
            }
        }
        assert!(self.start <= self.end);
        Ok(Response {
            status: head.status,
            close,
        })
    }

    /// Reads and parses the status line and headers.
    async fn read_head<R: AsyncRead + Unpin>(&mut self, io: &mut R) -> Result<Head, ResponseError> {
        loop {
            let buffered = &self.buf[self.start..self.end];
            if !buffered.is_empty() {
                if let Some((head, len)) = parse_head(buffered)? {
                    self.start += len;
                    return Ok(head);
                }
                if buffered.len() >= HEAD_BYTES_MAX {
                    return Err(ResponseError::TooLarge("head", HEAD_BYTES_MAX));
                }
            }
            let was_empty = buffered.is_empty();
            if self.fill(io, "head").await? == 0 {
                return Err(if was_empty {
                    ResponseError::Closed
                } else {
                    ResponseError::Truncated("head")
                });
            }
        }
    }

    /// Reads a chunked body and its trailer section.
    async fn read_chunked<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        sink: &mut Sink<'_>,
    ) -> Result<(), ResponseError> {
        // Every round but the last takes a chunk of at least one byte, which
        // the sink counts against its bound, so the loop ends within
        // `body_bytes_max` rounds.
        loop {
            let size = loop {
                let buffered = self.buffered();
                if !buffered.is_empty() && !buffered[0].is_ascii_hexdigit() {
                    return Err(ResponseError::Malformed("bad chunk size".into()));
                }
                match httparse::parse_chunk_size(buffered) {
                    Ok(httparse::Status::Complete((len, size))) => {
                        assert!(len > 0);
                        self.start += len;
                        break size;
                    }
                    Ok(httparse::Status::Partial) => {
                        self.fill_more(io, "chunk size line").await?;
                    }
                    Err(httparse::InvalidChunkSize) => {
                        return Err(ResponseError::Malformed("bad chunk size".into()))
                    }
                }
            };
            if size == 0 {
                return self.read_trailers(io).await;
            }
            sink.expect(size)?;
            self.read_body_bytes(io, size, sink, "chunk").await?;
            while self.end - self.start < 2 {
                self.fill_more(io, "chunk").await?;
            }
            if self.buffered()[..2] != *b"\r\n" {
                return Err(ResponseError::Malformed(
                    "a chunk's data does not end with CRLF".into(),
                ));
            }
            self.start += 2;
        }
    }

    /// Skips the trailer section after the last chunk, up to its blank line.
    async fn read_trailers<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
    ) -> Result<(), ResponseError> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
            match httparse::parse_headers(self.buffered(), &mut headers) {
                Ok(httparse::Status::Complete((len, _))) => {
                    self.start += len;
                    return Ok(());
                }
                Ok(httparse::Status::Partial) => self.fill_more(io, "trailers").await?,
                Err(httparse::Error::TooManyHeaders) => {
                    return Err(ResponseError::TooLarge("trailers", HEADERS_MAX))
                }
                Err(e) => return Err(ResponseError::Malformed(format!("trailers: {e}"))),
            }
        }
    }

    /// Reads `bytes` body bytes (already counted by the sink) into it.
    async fn read_body_bytes<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        bytes: u64,
        sink: &mut Sink<'_>,
        part: &'static str,
    ) -> Result<(), ResponseError> {
        let mut left = usize::try_from(bytes).expect("the sink bounds the body below usize");
        let from_buffer = left.min(self.end - self.start);
        sink.take(&self.buf[self.start..self.start + from_buffer]);
        self.start += from_buffer;
        left -= from_buffer;
        // A long body that is kept whole is read straight into its place,
        // sparing a copy and letting one read take all the socket holds.
        if left > RECV_BUFFER_BYTES {
            if let Some(out) = sink.direct(left) {
                assert_eq!(self.start, self.end);
                let at = out.len();
                out.resize(at + left, 0);
                let mut filled = at;
                while filled < out.len() {
                    let read = io.read(&mut out[filled..]).await?;
                    if read == 0 {
                        out.truncate(filled);
                        return Err(ResponseError::Truncated(part));
                    }
                    filled += read;
                }
                return Ok(());
            }
        }
        while left > 0 {
            self.fill_more(io, part).await?;
            let take = left.min(self.end - self.start);
            sink.take(&self.buf[self.start..self.start + take]);
            self.start += take;
            left -= take;
        }
        Ok(())
    }

    /// Reads until the server closes the connection.
    async fn read_to_end<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        sink: &mut Sink<'_>,
    ) -> Result<(), ResponseError> {
        loop {
            let buffered = self.end - self.start;
            sink.expect(buffered as u64)?;
            sink.take(&self.buf[self.start..self.end]);
            self.start = self.end;
            if self.fill(io, "body").await? == 0 {
                return Ok(());
            }
        }
    }

    /// Reads more bytes after the buffered ones; the end of the stream is an
    /// error, as a response needs more.
    async fn fill_more<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        part: &'static str,
    ) -> Result<(), ResponseError> {
        match self.fill(io, part).await? {
            0 => Err(ResponseError::Truncated(part)),
            _ => Ok(()),
        }
    }

    /// Reads more bytes after the buffered ones, moving those to the front
    /// first if the buffer has no room at its end. Returns 0 at the end of the
    /// stream. A buffer full of one unfinished `part` is an error.
    async fn fill<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        part: &'static str,
    ) -> Result<usize, ResponseError> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            return Err(ResponseError::TooLarge(part, self.buf.len()));
        }
        let read = io.read(&mut self.buf[self.end..]).await?;
        assert!(self.end + read <= self.buf.len());
        self.end += read;
        Ok(read)
    }
}

/// Parses a head from the start of `bytes`: `None` while it is incomplete.
fn parse_head(bytes: &[u8]) -> Result<Option<(Head, usize)>, ResponseError> {
    let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut response = httparse::Response::new(&mut headers);
    let len = match response.parse(bytes) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(ResponseError::TooLarge("header count", HEADERS_MAX))
        }
        Err(e) => return Err(ResponseError::Malformed(e.to_string())),
    };
    if len > HEAD_BYTES_MAX {
        return Err(ResponseError::TooLarge("head", HEAD_BYTES_MAX));
    }
    let status = response
        .code
        .ok_or_else(|| ResponseError::Malformed("no status".into()))?;
    let http_1_0 = response.version == Some(0);
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut close = http_1_0;
    for header in response.headers.iter() {
        let value = header.value.trim_ascii();
        if header.name.eq_ignore_ascii_case("content-length") {
            let parsed = parse_content_length(value)?;
            if length.is_some_and(|seen| seen != parsed) {
                return Err(ResponseError::Malformed(
                    "Content-Length headers disagree".into(),
                ));
            }
            length = Some(parsed);
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            if !value.eq_ignore_ascii_case(b"chunked") {
                return Err(ResponseError::Unsupported(
                    "a transfer coding other than chunked",
                ));
            }
            chunked = true;
        } else if header.name.eq_ignore_ascii_case("connection") {
            for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && http_1_0 {
                    close = false;
                }
            }
        }
    }
    // RFC 9112 §6.3: these statuses have no body whatever the headers say,
    // and a transfer coding overrides a length.
    let framing = match (status, chunked, length) {
        (100..=199 | 204 | 304, _, _) => Framing::Empty,
        (_, true, _) => Framing::Chunked,
        (_, false, Some(0)) => Framing::Empty,
        (_, false, Some(bytes)) => Framing::Length(bytes),
        (_, false, None) => Framing::ToEnd,
    };
    Ok(Some((
        Head {
            status,
            framing,
            close,
        },
        len,
    )))
}

/// A `Content-Length` value: decimal digits only.
fn parse_content_length(value: &[u8]) -> Result<u64, ResponseError> {
    let bad = || ResponseError::Malformed("bad Content-Length".into());
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    Ok(value
        .iter()
        .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0')))
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
