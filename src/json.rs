//! JSON read strictly: a key given twice in one object is refused, at any depth.
//!
//! serde_json keeps the last of two equal keys without a word; a request body
//! or a configuration file that names a field twice is ambiguous, so the
//! broker refuses it rather than guess which one was meant.

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// Checks that no object in the JSON text `bytes` names a key twice. Says
/// which key when one does, and where below the top level (`duplicate field
/// "addr" in "http"`); JSON that does not parse is left to the caller's own
/// parse, which says why.
pub fn refuse_duplicate_keys(bytes: &[u8]) -> Result<(), String> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    match (Walk { at: "" }).deserialize(&mut deserializer) {
        Err(e) if e.is_data() => Err(e.to_string()),
        _ => Ok(()),
    }
}

/// Walks one JSON value found at `at` (a dotted path of keys and `[i]`
/// indexes; empty at the top level), refusing a key given twice in any of
/// its objects.
#[derive(Clone, Copy)]
struct Walk<'p> {
    at: &'p str,
}

impl Walk<'_> {
    /// Where the value of `key` in this object is.
    fn key(&self, key: &str) -> String {
        if self.at.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.at)
        }
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if seen.contains(&key) {
                return Err(de::Error::custom(if self.at.is_empty() {
                    format!("duplicate field \"{key}\"")
                } else {
                    format!("duplicate field \"{key}\" in \"{}\"", self.at)
                }));
            }
            let at = self.key(&key);
            map.next_value_seed(Walk { at: &at })?;
            seen.insert(key);
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut index = 0usize;
        loop {
            let at = format!("{}[{index}]", self.at);
            if seq.next_element_seed(Walk { at: &at })?.is_none() {
                return Ok(());
            }
            index += 1;
        }
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::refuse_duplicate_keys;

    #[test]
    fn a_key_given_twice_is_refused_at_any_depth() {
        for (text, refused) in [
            (r#"{"a":1,"b":2}"#, None),
            (r#"{"a":1,"a":2}"#, Some(r#"duplicate field "a""#)),
            (
                r#"{"s":{"x":1,"x":2}}"#,
                Some(r#"duplicate field "x" in "s""#),
            ),
            (r#"{"s":{"x":1},"t":{"x":1}}"#, None),
            (
                r#"[{"k":1},{"k":2,"k":3}]"#,
                Some(r#"duplicate field "k" in "[1]""#),
            ),
            (
                r#"{"r":[{},{"a":{"b":1,"b":1}}]}"#,
                Some(r#"duplicate field "b" in "r[1].a""#),
            ),
            (r#"{"a.b":1,"a.b":2}"#, Some(r#"duplicate field "a.b""#)),
            (r#"{"a":[1,"two",null,true,-3,4.5,{"b":{}}]}"#, None),
            ("not json", None),
        ] {
            match (refuse_duplicate_keys(text.as_bytes()), refused) {
                (Ok(()), None) => {}
                (Err(e), Some(said)) => assert!(e.starts_with(said), "{text}: {e}"),
                (outcome, _) => panic!("{text}: {outcome:?}"),
            }
        }
    }
}
