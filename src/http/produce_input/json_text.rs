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

/// How deep a payload sent verbatim may nest. serde_json, the strictest
/// common reader, refuses a document nested 128 deep, and a payload sits three
/// levels down in a batch consume's reply (`{"messages":[{"payload":…`).
pub const VERBATIM_DEPTH_MAX: usize = 124;

/// Whether a strict reader would refuse `json`, a JSON text the parser has
/// accepted, although the grammar allows it: a string escape that names no
/// character (a lone UTF-16 surrogate such as `\ud800`), a number too large for
/// a double (`1e999`), or nesting deeper than [`VERBATIM_DEPTH_MAX`]. A payload
/// sent verbatim with any of these would make the whole reply unreadable, and
/// its message impossible to ack. One pass: strings are skipped with memchr's
/// vector search, stopping only at their escapes.
pub fn strict_readers_refuse(json: &str) -> bool {
    let bytes = json.as_bytes();
    let mut depth = 0usize;
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'"' => {
                at += 1;
                loop {
                    let Some(found) = memchr::memchr2(b'"', b'\\', &bytes[at..]) else {
                        return false; // unterminated: not a text the parser accepted
                    };
                    at += found;
                    if bytes[at] == b'"' {
                        at += 1;
                        break;
                    }
                    // An escape: `\u` is checked, any other is two bytes.
                    at += match bytes.get(at + 1) {
                        Some(b'u') => match unicode_escape(&bytes[at + 2..]) {
                            Some((_, used)) => 1 + used,
                            None => return true,
                        },
                        _ => 2,
                    };
                }
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > VERBATIM_DEPTH_MAX {
                    return true;
                }
                at += 1;
            }
            b']' | b'}' => {
                depth = depth.saturating_sub(1);
                at += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = at;
                while at < bytes.len()
                    && matches!(bytes[at], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
                {
                    at += 1;
                }
                let number = &json[start..at];
                // Only an exponent or over 300 digits can pass f64::MAX.
                let may_overflow = number.len() > 300 || number.bytes().any(|b| b | 0x20 == b'e');
                if may_overflow && !number.parse::<f64>().is_ok_and(f64::is_finite) {
                    return true;
                }
            }
            _ => at += 1,
        }
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

/// Whether serde_json reads `json` where a batch consume's reply puts a
/// payload, three levels down: the tests' oracle of [`strict_readers_refuse`].
#[cfg(test)]
pub fn strict_in_a_batch_reply(json: &str) -> bool {
    let reply = format!(r#"{{"messages":[{{"payload":{json}}}]}}"#);
    serde_json::from_str::<serde_json::Value>(&reply).is_ok()
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
            assert_eq!(strict_readers_refuse(json), lone, "{json}");
            // The parser that admitted the text agrees that it is JSON; a strict
            // decode of it agrees with the finding.
            assert!(serde_json::from_str::<&serde_json::value::RawValue>(json).is_ok());
            let strict = serde_json::from_str::<serde_json::Value>(json).is_ok();
            assert_eq!(strict, !lone, "{json}");
        }
    }

    #[test]
    fn deep_nesting_and_huge_numbers_are_found_as_serde_json_finds_them() {
        let nested = |depth: usize| "[".repeat(depth) + &"]".repeat(depth);
        let objects = |depth: usize| r#"{"a":"#.repeat(depth) + "1" + &"}".repeat(depth);
        let long_integer = "9".repeat(400);
        for json in [
            nested(VERBATIM_DEPTH_MAX - 1),
            nested(VERBATIM_DEPTH_MAX),
            nested(VERBATIM_DEPTH_MAX + 1),
            nested(300),
            objects(VERBATIM_DEPTH_MAX),
            objects(VERBATIM_DEPTH_MAX + 1),
            format!(r#"["[[[[", {}, "]]]]"]"#, nested(VERBATIM_DEPTH_MAX - 1)),
            "1e999".into(),
            "-1e999".into(),
            "1E400".into(),
            "1e308".into(),
            "1.7976931348623157e308".into(),
            "1.7976931348623159e308".into(),
            "1e-999".into(),
            "[0.5e+2, -0, 12345678901234567890123]".into(),
            long_integer.clone(),
            format!("[\"{long_integer}e999\", 1]"),
            r#"{"e": "1e999", "n": 2e9}"#.into(),
        ] {
            assert!(serde_json::from_str::<&serde_json::value::RawValue>(&json).is_ok());
            assert_eq!(
                strict_readers_refuse(&json),
                !strict_in_a_batch_reply(&json),
                "{}",
                &json[..json.len().min(80)]
            );
        }
        assert!(!strict_readers_refuse(&nested(VERBATIM_DEPTH_MAX)));
        assert!(strict_readers_refuse(&nested(VERBATIM_DEPTH_MAX + 1)));
        assert!(strict_readers_refuse("1e999"));
        assert!(strict_readers_refuse(&long_integer));
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

    /// JSON texts made of the parts that matter: nesting, numbers of every
    /// size, strings with escapes (surrogates among them).
    fn json_like() -> impl Strategy<Value = String> {
        let number = prop_oneof![
            "-?[0-9]{1,3}(\\.[0-9]{1,3})?([eE][-+]?[0-9]{1,3})?",
            "[1-9][0-9]{290,320}",
        ];
        let string = "\"([a-z\\[\\]{}e1 ]|\\\\[nt\"\\\\]|\\\\u[dD][89abcAB][0-9a-f]{2}){0,6}\"";
        let leaf = prop_oneof![number.boxed(), string.boxed(), Just("true".to_string())];
        leaf.prop_recursive(140, 400, 3, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 1..3)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                proptest::collection::vec(inner, 1..3).prop_map(|v| {
                    let fields: Vec<String> = v
                        .iter()
                        .enumerate()
                        .map(|(i, x)| format!("\"k{i}\":{x}"))
                        .collect();
                    format!("{{{}}}", fields.join(","))
                }),
            ]
        })
    }

    proptest! {
        /// Whatever serde_json reads where a batch reply puts a payload is
        /// sent verbatim, and nothing else.
        #[test]
        fn refuses_what_serde_json_refuses(json in json_like()) {
            prop_assume!(serde_json::from_str::<&serde_json::value::RawValue>(&json).is_ok());
            prop_assert_eq!(strict_readers_refuse(&json), !strict_in_a_batch_reply(&json), "{}", json);
        }

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
