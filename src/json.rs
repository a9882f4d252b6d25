//! JSON read strictly: a key given twice in one object is refused, at any depth.
//!
//! serde_json keeps the last of two equal keys without a word; a request body
//! or a configuration file that names a field twice is ambiguous, so the
//! broker refuses it rather than guess which one was meant.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// Checks that no object in the JSON text `bytes` names a key twice. Says
/// which key when one does; JSON that does not parse is left to the caller's
/// own parse, which says why.
pub fn refuse_duplicate_keys(bytes: &[u8]) -> Result<(), String> {
    match serde_json::from_slice::<UniqueKeys>(bytes) {
        Err(e) if e.is_data() => Err(e.to_string()),
        _ => Ok(()),
    }
}

/// Any JSON value, read only to refuse a key given twice in one of its objects.
struct UniqueKeys;

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Walk)
    }
}

struct Walk;

impl<'de> Visitor<'de> for Walk {
    type Value = UniqueKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UniqueKeys, A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format!("duplicate field \"{key}\"")));
            }
            map.next_value::<UniqueKeys>()?;
        }
        Ok(UniqueKeys)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<UniqueKeys, A::Error> {
        while seq.next_element::<UniqueKeys>()?.is_some() {}
        Ok(UniqueKeys)
    }

    fn visit_bool<E>(self, _: bool) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_i64<E>(self, _: i64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_u64<E>(self, _: u64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_f64<E>(self, _: f64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_str<E>(self, _: &str) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_unit<E>(self) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
}

#[cfg(test)]
mod tests {
    use super::refuse_duplicate_keys;

    #[test]
    fn a_key_given_twice_is_refused_at_any_depth() {
        for (text, refused) in [
            (r#"{"a":1,"b":2}"#, None),
            (r#"{"a":1,"a":2}"#, Some("a")),
            (r#"{"s":{"x":1,"x":2}}"#, Some("x")),
            (r#"{"s":{"x":1},"t":{"x":1}}"#, None),
            (r#"[{"k":1},{"k":2,"k":3}]"#, Some("k")),
            (r#"{"a":[1,"two",null,true,-3,4.5,{"b":{}}]}"#, None),
            ("not json", None),
        ] {
            match (refuse_duplicate_keys(text.as_bytes()), refused) {
                (Ok(()), None) => {}
                (Err(e), Some(key)) => {
                    assert!(
                        e.contains(&format!("duplicate field \"{key}\"")),
                        "{text}: {e}"
                    )
                }
                (outcome, _) => panic!("{text}: {outcome:?}"),
            }
        }
    }
}
