//! Receipt handles: `partition:offset:nonce`, all three decimal.
//!
//! The nonce is drawn from the owner shard's ChaCha8 stream when the offset is
//! leased, so a handle cannot be guessed, and a handle of an earlier lease of the
//! same offset never settles a later one.

use narad_shards::ids::{Offset, PartitionId};

/// Longest handle accepted: three u64-sized decimals and two colons.
pub const HANDLE_BYTES_MAX: usize = 3 * 20 + 2;

/// A parsed receipt handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    pub partition: PartitionId,
    pub offset: Offset,
    pub nonce: u64,
}

pub fn format(partition: PartitionId, offset: Offset, nonce: u64) -> String {
    let mut out = String::with_capacity(HANDLE_BYTES_MAX);
    write(&mut out, partition, offset, nonce);
    out
}

/// Appends the handle to `out`.
pub fn write(out: &mut String, partition: PartitionId, offset: Offset, nonce: u64) {
    let mut digits = itoa::Buffer::new();
    out.push_str(digits.format(partition.0));
    out.push(':');
    out.push_str(digits.format(offset.0));
    out.push(':');
    out.push_str(digits.format(nonce));
}

/// Parses a handle; the error says what is wrong with it (a 400).
pub fn parse(text: &str) -> Result<Handle, String> {
    if text.is_empty() {
        return Err("receipt_handle is empty".into());
    }
    if text.len() > HANDLE_BYTES_MAX {
        return Err("receipt_handle is malformed".into());
    }
    let mut parts = text.split(':');
    let (Some(p), Some(o), Some(n), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("receipt_handle is malformed: want partition:offset:nonce".into());
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !(digits(p) && digits(o) && digits(n)) {
        return Err("receipt_handle is malformed: want partition:offset:nonce".into());
    }
    let bad = |_| "receipt_handle is malformed: a number is out of range".to_string();
    Ok(Handle {
        partition: PartitionId(p.parse().map_err(bad)?),
        offset: Offset(o.parse().map_err(bad)?),
        nonce: n.parse().map_err(bad)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_bad_ones_are_refused() {
        let h = parse(&format(PartitionId(3), Offset(17), u64::MAX)).unwrap();
        assert_eq!(
            h,
            Handle {
                partition: PartitionId(3),
                offset: Offset(17),
                nonce: u64::MAX
            }
        );
        for bad in [
            "",
            "1:2",
            "1:2:3:4",
            "a:2:3",
            "1::3",
            "-1:2:3",
            "1:2:3 ",
            "+1:2:3",
            "4294967296:1:1",
            "1:2:18446744073709551616",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
