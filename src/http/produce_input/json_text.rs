//! The value of a JSON string token that the parser has already checked.
//!
//! Batch produce receives each payload and key as a raw JSON value, and a
//! payload is often a JSON document sent as a string, full of `\"`. The parser
//! validated the token while it split the batch; decoding it again through
//! `serde_json::from_str::<String>` scans it a second time byte by byte, which
//! was the largest single cost of decoding a batch. Here the text between
//! escapes is copied in runs found with memchr's vector search, and only the
//! escapes are decoded one by one. Written by hand because the parser offers
//! no decoder for a token it has already checked; the tests compare it with
//! serde_json on every kind of escape.

/// The value of the JSON string whose text between the quotes is `inner`, or
/// `None` when an escape is not valid JSON (a lone surrogate included), as
/// serde_json would refuse it.
pub fn unescape(inner: &str) -> Option<String> {
    let mut out = Vec::with_capacity(inner.len());
    unescape_into(inner, &mut out)?;
    Some(String::from_utf8(out).expect("an unescaped JSON string is UTF-8"))
}

/// Like [`unescape`], appending the value's UTF-8 bytes to `out` instead (a
/// batch decodes every payload into one buffer). On `None`, `out` holds part
/// of the value.
pub fn unescape_into(inner: &str, out: &mut Vec<u8>) -> Option<()> {
    let mut rest = inner;
    while let Some(at) = memchr::memchr(b'\\', rest.as_bytes()) {
        out.extend_from_slice(&rest.as_bytes()[..at]);
        let escape = &rest.as_bytes()[at + 1..];
        let (decoded, used) = match escape.first()? {
            b'"' => ('"', 1),
            b'\\' => ('\\', 1),
            b'/' => ('/', 1),
            b'b' => ('\u{8}', 1),
            b'f' => ('\u{c}', 1),
            b'n' => ('\n', 1),
            b'r' => ('\r', 1),
            b't' => ('\t', 1),
            b'u' => unicode_escape(&escape[1..])?,
            _ => return None,
        };
        let mut utf8 = [0u8; 4];
        out.extend_from_slice(decoded.encode_utf8(&mut utf8).as_bytes());
        rest = &rest[at + 1 + used..];
    }
    out.extend_from_slice(rest.as_bytes());
    Some(())
}

/// Whether some string in `json`, a JSON text the parser has accepted, holds an
/// escape that names no character (a lone UTF-16 surrogate such as `\ud800`),
/// which the parser lets through and stricter readers refuse. Only a text with
/// a `\u` in it is walked, escape by escape.
pub fn names_no_character(json: &str) -> bool {
    let bytes = json.as_bytes();
    if memchr::memmem::find(bytes, b"\\u").is_none() {
        return false;
    }
    let mut at = 0;
    while let Some(found) = memchr::memchr(b'\\', &bytes[at..]) {
        // Outside strings a JSON text has no backslash, so each one found from
        // the start begins an escape.
        let escape = &bytes[at + found + 1..];
        let used = match escape.first() {
            Some(b'u') => match unicode_escape(&escape[1..]) {
                Some((_, used)) => used,
                None => return true,
            },
            Some(_) => 1,
            None => return false,
        };
        at += found + 1 + used;
    }
    false
}

/// Decodes what follows `\u`: four hex digits, and for a high surrogate the
/// `\uXXXX` of its low half. Returns the character and the bytes used after the
/// backslash (`u` included).
fn unicode_escape(after_u: &[u8]) -> Option<(char, usize)> {
    let first = hex4(after_u)?;
    match first {
        0xD800..=0xDBFF => {
            let tail = after_u.get(4..)?;
            if tail.get(..2)? != b"\\u" {
                return None;
            }
            let second = hex4(&tail[2..])?;
            if !(0xDC00..=0xDFFF).contains(&second) {
                return None;
            }
            let code = 0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00);
            Some((char::from_u32(code)?, 11))
        }
        0xDC00..=0xDFFF => None,
        _ => Some((char::from_u32(first)?, 5)),
    }
}

fn hex4(bytes: &[u8]) -> Option<u32> {
    let digits = bytes.get(..4)?;
    digits.iter().try_fold(0u32, |value, &b| {
        let digit = (b as char).to_digit(16)?;
        Some(value << 4 | digit)
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What serde_json makes of the same token.
    fn reference(inner: &str) -> Option<String> {
        serde_json::from_str::<String>(&format!("\"{inner}\"")).ok()
    }

    #[test]
    fn every_escape_decodes_as_serde_json_does() {
        for inner in [
            "",
            "plain",
            r#"{\"id\":7,\"pad\":\"xx\"}"#,
            r"\\ \/ \b \f \n \r \t \u0041 \u00e9 \u20ac",
            r"\ud83d\ude00 after",
            r"\u0000",
            "caf\u{e9} \u{1f600}",
            r"trailing \\",
        ] {
            assert_eq!(unescape(inner), reference(inner), "{inner:?}");
            assert!(unescape(inner).is_some(), "{inner:?}");
        }
    }

    #[test]
    fn a_lone_surrogate_anywhere_in_a_json_text_is_found() {
        for (json, lone) in [
            (r#""\ud800""#, true),
            (r#"{"a":["x","\udc00"]}"#, true),
            (r#"{"\ud83d":1}"#, true),
            (r#""\ud83d\u0041""#, true),
            (r#""\ud83d\ude00""#, false),
            (r#""\\ud800""#, false),
            (r#""\"\\\u0041""#, false),
            (r#"{"a":"\u00e9","b":[1,2]}"#, false),
            (r#"{"plain":true}"#, false),
        ] {
            assert_eq!(names_no_character(json), lone, "{json}");
            // The parser that admitted the text agrees that it is JSON; a strict
            // decode of it agrees with the finding.
            assert!(serde_json::from_str::<&serde_json::value::RawValue>(json).is_ok());
            let strict = serde_json::from_str::<serde_json::Value>(json).is_ok();
            assert_eq!(strict, !lone, "{json}");
        }
    }

    #[test]
    fn invalid_escapes_are_refused_as_serde_json_refuses_them() {
        for inner in [
            r"\x",
            r"\u12",
            r"\u12g4",
            r"\ud83d",
            r"\ud83d\u0041",
            r"\ude00",
            r"\ud83dx",
            r"\ud83d\",
            r"\",
        ] {
            assert_eq!(unescape(inner), None, "{inner:?}");
            assert_eq!(reference(inner), None, "{inner:?}");
        }
    }

    proptest! {
        /// Any string, written by serde_json (with its escapes) and by hand with
        /// every character as `\uXXXX`, decodes back to itself.
        #[test]
        fn round_trips_any_string(text in any::<String>()) {
            let token = serde_json::to_string(&text).unwrap();
            let inner = &token[1..token.len() - 1];
            prop_assert_eq!(unescape(inner), Some(text.clone()));
            let mut all_escaped = String::new();
            for unit in text.encode_utf16() {
                all_escaped.push_str(&format!("\\u{unit:04x}"));
            }
            prop_assert_eq!(unescape(&all_escaped), Some(text));
        }
    }
}
