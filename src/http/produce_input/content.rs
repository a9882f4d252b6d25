//! A batch body's `Content-Encoding`: none, zstd or gzip, decompressed under a
//! hard cap.
//!
//! A compressed body is a promise the server has to check: 16 KiB of zstd can
//! claim gigabytes of zeros. So decompression streams into a buffer that grows
//! only up to the cap plus one byte, and stops there; the byte past the cap is
//! what tells "exactly at the cap" (accepted) from "past it" (413). Memory per
//! request is thus bounded by the compressed body plus
//! [`BATCH_BODY_BYTES_MAX`] + 1, whatever the body claims. For zstd the
//! decoder's window is bounded as well ([`ZSTD_WINDOW_LOG_MAX`]): a frame header
//! can ask for a window of up to 2 GiB, and the decoder would allocate it before
//! producing a byte.
//!
//! Which encodings, and the refusals: absent, empty or `identity` is no
//! compression; `zstd` and `gzip` (also `x-gzip`, case-insensitive) are decoded;
//! anything else, including a list of encodings, is a 415. Data that does not
//! decode is a 400, as is a zstd frame that wants a window past the bound. A gzip
//! body may hold several members, decoded one after the other, as Go's reader
//! (the reference) does; zstd likewise decodes every frame of the body.
//!
//! Which cores: every shard; pure functions over the body in memory.

use std::borrow::Cow;
use std::io::{self, Read};

use super::BATCH_BODY_BYTES_MAX;

/// The largest zstd window accepted: 2^24 = 16 MiB, the decompressed cap. zstd
/// compressors pick a window no larger than the content when they know its size,
/// and at most 8 MiB at levels up to 19 when they do not; only `--ultra` levels
/// streaming content of unknown size ask for more, and such bodies are refused.
pub const ZSTD_WINDOW_LOG_MAX: u32 = 24;

const _: () = assert!(1usize << ZSTD_WINDOW_LOG_MAX <= BATCH_BODY_BYTES_MAX);

/// The first buffer for a compressed body's output, before it doubles: most
/// batches are small, and doubling from here reaches the cap in 8 steps.
const DECOMPRESS_BUFFER_BYTES_MIN: usize = 64 << 10;

/// A `Content-Encoding` this server decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentEncoding {
    Identity,
    Zstd,
    Gzip,
}

/// Why a body could not be decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum ContentRefusal {
    /// The encoding is not one this server decodes (415).
    Unsupported(String),
    /// The body, compressed or decompressed, is past the cap (413).
    TooLarge,
    /// The compressed data is corrupt or truncated (400).
    Corrupt(String),
}

/// A request's `Content-Encoding`, `None` when it has none. Several header
/// lines are one list, as HTTP reads them, and a list of encodings is refused
/// by [`content_encoding`] like any other this server cannot decode.
pub fn request_encoding(headers: &hyper::HeaderMap) -> Option<String> {
    let encodings: Vec<&str> = headers
        .get_all(hyper::header::CONTENT_ENCODING)
        .iter()
        .map(|v| v.to_str().unwrap_or("\u{fffd}"))
        .collect();
    (!encodings.is_empty()).then(|| encodings.join(", "))
}

impl ContentRefusal {
    /// The answer's status and message, for a body of at most `cap_bytes`
    /// decompressed.
    pub fn answer(&self, cap_bytes: usize) -> (hyper::StatusCode, String) {
        use hyper::StatusCode;
        match self {
            ContentRefusal::Unsupported(encoding) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("unsupported content encoding {encoding:?}: send zstd, gzip or identity"),
            ),
            ContentRefusal::TooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body too large: at most {cap_bytes} bytes decompressed"),
            ),
            ContentRefusal::Corrupt(reason) => (
                StatusCode::BAD_REQUEST,
                format!("cannot decompress the request body: {reason}"),
            ),
        }
    }
}

/// The encoding a `Content-Encoding` header value names.
pub fn content_encoding(header: Option<&str>) -> Result<ContentEncoding, ContentRefusal> {
    let value = header.unwrap_or("").trim();
    if value.is_empty() || value.eq_ignore_ascii_case("identity") {
        Ok(ContentEncoding::Identity)
    } else if value.eq_ignore_ascii_case("zstd") {
        Ok(ContentEncoding::Zstd)
    } else if value.eq_ignore_ascii_case("gzip") || value.eq_ignore_ascii_case("x-gzip") {
        Ok(ContentEncoding::Gzip)
    } else {
        Err(ContentRefusal::Unsupported(value.to_string()))
    }
}

/// The body as the client meant it: borrowed when it was not compressed, else
/// decompressed into a buffer of at most `cap_bytes` (+1 while deciding).
pub fn decode_content(
    body: &[u8],
    encoding: ContentEncoding,
    cap_bytes: usize,
) -> Result<Cow<'_, [u8]>, ContentRefusal> {
    if body.len() > cap_bytes {
        return Err(ContentRefusal::TooLarge);
    }
    let mut out = Vec::new();
    let read = match encoding {
        ContentEncoding::Identity => return Ok(Cow::Borrowed(body)),
        ContentEncoding::Zstd => {
            let mut decoder = zstd::stream::read::Decoder::with_buffer(body)
                .map_err(|e| ContentRefusal::Corrupt(format!("zstd: {e}")))?;
            decoder
                .window_log_max(ZSTD_WINDOW_LOG_MAX)
                .map_err(|e| ContentRefusal::Corrupt(format!("zstd: {e}")))?;
            read_capped(decoder, body.len(), cap_bytes, &mut out).map_err(|e| match e {
                // The library's wording for a window past `window_log_max`.
                CappedReadError::Read(e) if e.to_string().contains("too much memory") => {
                    ContentRefusal::Corrupt(format!(
                        "zstd: the frame asks for a window over {} MiB; compress at level 19 or \
                         lower, without --long",
                        (1usize << ZSTD_WINDOW_LOG_MAX) >> 20
                    ))
                }
                e => e.named("zstd"),
            })
        }
        ContentEncoding::Gzip => {
            let decoder = flate2::bufread::MultiGzDecoder::new(body);
            read_capped(decoder, body.len(), cap_bytes, &mut out).map_err(|e| e.named("gzip"))
        }
    };
    read?;
    assert!(out.len() <= cap_bytes);
    Ok(Cow::Owned(out))
}

/// Why [`read_capped`] stopped early.
#[derive(Debug)]
enum CappedReadError {
    TooLarge,
    Read(io::Error),
}

impl CappedReadError {
    fn named(self, codec: &str) -> ContentRefusal {
        match self {
            CappedReadError::TooLarge => ContentRefusal::TooLarge,
            CappedReadError::Read(e) => ContentRefusal::Corrupt(format!("{codec}: {e}")),
        }
    }
}

/// Reads `reader` to its end into `out`, which never grows past `cap_bytes` + 1
/// bytes of capacity: reading the byte past the cap is the proof of "too large".
/// `input_len` sizes the first buffer.
fn read_capped(
    mut reader: impl Read,
    input_len: usize,
    cap_bytes: usize,
    out: &mut Vec<u8>,
) -> Result<(), CappedReadError> {
    assert!(out.is_empty());
    let limit = cap_bytes + 1;
    let mut filled = 0;
    let mut size = input_len
        .saturating_mul(4)
        .max(DECOMPRESS_BUFFER_BYTES_MIN)
        .min(limit);
    // `reserve_exact` before each `resize`: plain growth could double the
    // capacity past the cap.
    out.reserve_exact(size);
    out.resize(size, 0);
    // Each pass reads at least one byte or ends, and the buffer stops at `limit`,
    // so the loop is bounded by `limit` passes (in practice, a few per buffer).
    loop {
        if filled == size {
            if size == limit {
                out.clear();
                return Err(CappedReadError::TooLarge);
            }
            size = size.saturating_mul(2).min(limit);
            out.reserve_exact(size - out.len());
            out.resize(size, 0);
        }
        match reader.read(&mut out[filled..size]) {
            Ok(0) => break,
            Ok(n) => {
                assert!(n <= size - filled);
                filled += n;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                out.clear();
                return Err(CappedReadError::Read(e));
            }
        }
    }
    out.truncate(filled);
    assert!(out.len() <= cap_bytes);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn zstd_of(data: &[u8]) -> Vec<u8> {
        zstd::encode_all(data, 3).unwrap()
    }

    fn gzip_of(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn encodings_are_named_case_insensitively() {
        for (header, want) in [
            (None, ContentEncoding::Identity),
            (Some(""), ContentEncoding::Identity),
            (Some("identity"), ContentEncoding::Identity),
            (Some(" zstd "), ContentEncoding::Zstd),
            (Some("ZSTD"), ContentEncoding::Zstd),
            (Some("gzip"), ContentEncoding::Gzip),
            (Some("x-gzip"), ContentEncoding::Gzip),
        ] {
            assert_eq!(content_encoding(header), Ok(want), "{header:?}");
        }
        for bad in ["br", "deflate", "gzip, zstd", "zstd;q=1", "compress"] {
            assert_eq!(
                content_encoding(Some(bad)),
                Err(ContentRefusal::Unsupported(bad.to_string()))
            );
        }
    }

    #[test]
    fn plain_bodies_are_borrowed_and_capped() {
        let body = b"{\"messages\":[]}";
        let decoded = decode_content(body, ContentEncoding::Identity, 64).unwrap();
        assert!(matches!(decoded, Cow::Borrowed(_)));
        assert_eq!(
            decode_content(&[0; 65], ContentEncoding::Identity, 64),
            Err(ContentRefusal::TooLarge)
        );
        assert!(decode_content(&[0; 64], ContentEncoding::Identity, 64).is_ok());
    }

    #[test]
    fn zstd_and_gzip_round_trip_up_to_the_cap() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        for (encoding, compressed) in [
            (ContentEncoding::Zstd, zstd_of(&data)),
            (ContentEncoding::Gzip, gzip_of(&data)),
        ] {
            let decoded = decode_content(&compressed, encoding, data.len()).unwrap();
            assert_eq!(decoded.as_ref(), &data[..]);
            assert_eq!(
                decode_content(&compressed, encoding, data.len() - 1),
                Err(ContentRefusal::TooLarge),
                "{encoding:?}"
            );
            let empty = match encoding {
                ContentEncoding::Zstd => zstd_of(b""),
                _ => gzip_of(b""),
            };
            assert_eq!(decode_content(&empty, encoding, 64).unwrap().len(), 0);
        }
    }

    #[test]
    fn concatenated_members_and_frames_are_all_decoded() {
        for (encoding, mut body, second) in [
            (ContentEncoding::Zstd, zstd_of(b"abc"), zstd_of(b"def")),
            (ContentEncoding::Gzip, gzip_of(b"abc"), gzip_of(b"def")),
        ] {
            body.extend_from_slice(&second);
            assert_eq!(
                decode_content(&body, encoding, 100).unwrap().as_ref(),
                b"abcdef"
            );
        }
    }

    #[test]
    fn corrupt_or_truncated_data_is_refused() {
        let data = vec![b'x'; 10_000];
        for (encoding, compressed) in [
            (ContentEncoding::Zstd, zstd_of(&data)),
            (ContentEncoding::Gzip, gzip_of(&data)),
        ] {
            let truncated = &compressed[..compressed.len() / 2];
            assert!(matches!(
                decode_content(truncated, encoding, 1 << 20),
                Err(ContentRefusal::Corrupt(_))
            ));
            assert!(matches!(
                decode_content(b"not compressed at all", encoding, 1 << 20),
                Err(ContentRefusal::Corrupt(_))
            ));
            let mut flipped = compressed.clone();
            let last = flipped.len() - 1;
            flipped[last] ^= 0xff; // the checksum of zstd and gzip both end the data
            assert!(
                matches!(
                    decode_content(&flipped, encoding, 1 << 20),
                    Err(ContentRefusal::Corrupt(_))
                ),
                "{encoding:?}"
            );
        }
    }

    #[test]
    fn a_huge_zstd_window_is_refused_before_it_is_allocated() {
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        encoder.window_log(27).unwrap();
        encoder.write_all(b"small content, huge window").unwrap();
        let body = encoder.finish().unwrap();
        match decode_content(&body, ContentEncoding::Zstd, BATCH_BODY_BYTES_MAX) {
            Err(ContentRefusal::Corrupt(why)) => {
                assert!(why.contains("window over 16 MiB"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        // The largest window allowed passes.
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        encoder.window_log(ZSTD_WINDOW_LOG_MAX).unwrap();
        encoder.write_all(b"small content, largest window").unwrap();
        let body = encoder.finish().unwrap();
        let decoded = decode_content(&body, ContentEncoding::Zstd, BATCH_BODY_BYTES_MAX).unwrap();
        assert_eq!(&decoded[..], b"small content, largest window");
    }

    #[test]
    fn a_capped_read_never_grows_past_the_cap() {
        // An endless reader: only the cap stops it.
        let mut out = Vec::new();
        let result = read_capped(io::repeat(7), 10, 1_000_000, &mut out);
        assert!(matches!(result, Err(CappedReadError::TooLarge)));
        assert!(out.capacity() <= 1_000_001, "{}", out.capacity());

        let mut out = Vec::new();
        read_capped(&[1u8; 1000][..], 10, 1000, &mut out).unwrap();
        assert_eq!(out, vec![1u8; 1000]);
    }
}
