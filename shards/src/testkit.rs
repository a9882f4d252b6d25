//! Payloads that check themselves, for crash tests and the processes they kill.
//!
//! A payload starts with its record id and continues with bytes derived from it,
//! so a checker can tell an intact payload from a torn or corrupt one without a
//! table of what was written. Used by the shards' crash tests and by the
//! `narad debug wal-writer` process that the SIGKILL test kills; it costs nothing
//! at run time otherwise.

/// The payload of record `id`, `len` bytes long (at least 8).
pub fn payload_for(id: u64, len: usize) -> Vec<u8> {
    let mut out = id.to_le_bytes().to_vec();
    let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < len.max(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push(x as u8);
    }
    out
}

/// The id of an intact payload, or `None` if its bytes are not what
/// [`payload_for`] writes.
pub fn check_payload(payload: &[u8]) -> Option<u64> {
    let id = u64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
    (payload == payload_for(id, payload.len()).as_slice()).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flipped_byte_is_caught() {
        let mut p = payload_for(42, 100);
        assert_eq!(check_payload(&p), Some(42));
        p[50] ^= 1;
        assert_eq!(check_payload(&p), None);
        assert_eq!(check_payload(&[1, 2, 3]), None);
    }
}
