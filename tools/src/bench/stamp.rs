//! The stamped payload of the consume and flow modes, and the ledger that
//! checks every acknowledged record comes back.
//!
//! A stamped payload is
//! `{"bench":"RRRRRRRR:IIIIIIIIIIIIIIII:NNNNNNNNNNNNNNNN:CCCCCCCC:x…"}` padded
//! with x's to `--size` bytes: the run's tag, the record's id, its send time in
//! Unix nanoseconds, and a CRC-32C of those three, each in fixed-width lowercase
//! hex. The checksum and the exact padding together are the payload's hash: any
//! changed byte reads as damage. Fixed widths keep every record of a run the same
//! size and put the stamp at a known offset, so a producer patches 52 bytes of a
//! prebuilt body instead of formatting a payload, and a consumer reads the stamp
//! without parsing JSON.
//! The tag tells this run's records from those an earlier run left on the
//! topic.
//!
//! Which cores: the generator's one executor. The [`Ledger`] is shared by every
//! producer and consumer task through an `Rc<RefCell<_>>`; each borrow lasts one
//! call and is never held across an `.await`.
//!
//! The ledger keeps one byte per record id: two bits for the produce outcome and
//! six for the times the record was consumed (saturating). Ids past
//! [`LEDGER_IDS_MAX`] are counted but not tracked, which bounds its memory.

use std::time::{SystemTime, UNIX_EPOCH};

/// `{"bench":"`: what a payload starts with.
pub const PAYLOAD_HEAD: &[u8] = b"{\"bench\":\"";
/// `"}`: what a payload ends with.
pub const PAYLOAD_TAIL: &[u8] = b"\"}";
/// The tag, the id, the send time, their checksum and the separators.
pub const STAMP_BYTES: usize = 8 + 1 + 16 + 1 + 16 + 1 + 8 + 1;
/// The bytes of the stamp its checksum covers: tag, id and send time.
const CHECKED_BYTES: usize = 42;
/// The smallest stamped payload.
pub const STAMPED_PAYLOAD_BYTES_MIN: usize = PAYLOAD_HEAD.len() + STAMP_BYTES + PAYLOAD_TAIL.len();
/// Record ids the ledger tracks (one byte each).
pub const LEDGER_IDS_MAX: u64 = 1 << 27;

const _: () = assert!(STAMP_BYTES == 52 && STAMPED_PAYLOAD_BYTES_MIN == 64);

/// What a stamp says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub run: u32,
    pub id: u64,
    pub sent_unix_ns: u64,
}

/// How a consumed payload reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reading {
    /// A well-formed stamped payload of `len` bytes.
    Stamped { stamp: Stamp, len: usize },
    /// The unstamped payload of a produce-mode run (`{"bench":"x…"}`), intact:
    /// it carries no send time and no id.
    Plain,
    /// Not a bench payload at all: some other writer's record.
    Foreign,
    /// Starts as a bench payload but its stamp or padding is damaged.
    Damaged,
}

/// Unix time in nanoseconds (0 if the clock is before 1970).
pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A stamped payload of `size` bytes with a zero stamp, for patching.
pub fn stamped_payload(size: usize) -> Vec<u8> {
    assert!(size >= STAMPED_PAYLOAD_BYTES_MIN);
    let mut payload = Vec::with_capacity(size);
    payload.extend_from_slice(PAYLOAD_HEAD);
    payload.resize(size - PAYLOAD_TAIL.len(), b'x');
    payload.extend_from_slice(PAYLOAD_TAIL);
    let zero = Stamp {
        run: 0,
        id: 0,
        sent_unix_ns: 0,
    };
    write_stamp(&mut payload[PAYLOAD_HEAD.len()..][..STAMP_BYTES], zero);
    assert_eq!(payload.len(), size);
    payload
}

/// Writes the stamp's 52 bytes into `out`.
pub fn write_stamp(out: &mut [u8], stamp: Stamp) {
    assert_eq!(out.len(), STAMP_BYTES);
    write_hex(&mut out[0..8], u64::from(stamp.run));
    out[8] = b':';
    write_hex(&mut out[9..25], stamp.id);
    out[25] = b':';
    write_hex(&mut out[26..42], stamp.sent_unix_ns);
    let crc = crc32c::crc32c(&out[..CHECKED_BYTES]);
    out[42] = b':';
    write_hex(&mut out[43..51], u64::from(crc));
    out[51] = b':';
}

fn write_hex(out: &mut [u8], mut value: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in out.iter_mut().rev() {
        *byte = DIGITS[(value & 0xf) as usize];
        value >>= 4;
    }
    assert_eq!(value, 0, "the value fits its width");
}

fn read_hex(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 16 {
        return None;
    }
    let mut value = 0u64;
    for &byte in text {
        let digit = match byte {
            b'0'..=b'9' => byte - b'0',
            b'a'..=b'f' => byte - b'a' + 10,
            _ => return None,
        };
        value = (value << 4) | u64::from(digit);
    }
    Some(value)
}

/// Reads a consumed payload: its stamp, and whether the rest is intact.
pub fn read_payload(payload: &[u8]) -> Reading {
    let Some(rest) = payload.strip_prefix(PAYLOAD_HEAD) else {
        return Reading::Foreign;
    };
    if rest
        .strip_suffix(PAYLOAD_TAIL)
        .is_some_and(|padding| padding.iter().all(|&b| b == b'x'))
    {
        return Reading::Plain;
    }
    if rest.len() < STAMP_BYTES + PAYLOAD_TAIL.len() {
        return Reading::Damaged;
    }
    let (stamp, rest) = rest.split_at(STAMP_BYTES);
    let Some(padding) = rest.strip_suffix(PAYLOAD_TAIL) else {
        return Reading::Damaged;
    };
    let separators = [stamp[8], stamp[25], stamp[42], stamp[51]] == [b':'; 4];
    let checked = read_hex(&stamp[43..51])
        .is_some_and(|crc| crc == u64::from(crc32c::crc32c(&stamp[..CHECKED_BYTES])));
    let fields = (
        read_hex(&stamp[0..8]),
        read_hex(&stamp[9..25]),
        read_hex(&stamp[26..42]),
    );
    match fields {
        (Some(run), Some(id), Some(sent_unix_ns))
            if separators && checked && padding.iter().all(|&b| b == b'x') =>
        {
            Reading::Stamped {
                stamp: Stamp {
                    run: run as u32,
                    id,
                    sent_unix_ns,
                },
                len: payload.len(),
            }
        }
        _ => Reading::Damaged,
    }
}

const PRODUCED_OK: u8 = 0b01;
const PRODUCED_FAILED: u8 = 0b10;
const OUTCOME_MASK: u8 = 0b11;
const CONSUMED_ONE: u8 = 0b100;
const CONSUMED_MAX: u8 = 63;

/// Every record id of this run: whether its produce was acknowledged, and how
/// many times it was consumed.
pub struct Ledger {
    /// One byte per id below `cap`.
    ids: Vec<u8>,
    /// Ids tracked: [`LEDGER_IDS_MAX`] but in tests.
    cap: u64,
    /// The next id to hand out.
    next_id: u64,
    produced_ok_records: u64,
    /// Ids below `cap` produced OK.
    tracked_ok_records: u64,
    /// Ids produced OK and consumed at least once.
    consumed_ok_records: u64,
    /// Acknowledged consumes of an id already consumed.
    duplicate_records: u64,
    /// Acknowledged consumes of an id this run never handed out.
    unknown_records: u64,
}

/// The ledger's verdict at the end of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub produced_ok_records: u64,
    pub missing_records: u64,
    pub duplicate_records: u64,
    pub unknown_records: u64,
    /// Ids past the tracked range (their fate is unknown).
    pub untracked_records: u64,
}

impl Ledger {
    pub fn new() -> Ledger {
        Ledger::tracking(LEDGER_IDS_MAX)
    }

    fn tracking(cap: u64) -> Ledger {
        Ledger {
            ids: Vec::new(),
            cap,
            next_id: 0,
            produced_ok_records: 0,
            tracked_ok_records: 0,
            consumed_ok_records: 0,
            duplicate_records: 0,
            unknown_records: 0,
        }
    }

    /// Hands out `records` consecutive ids and returns the first.
    pub fn claim(&mut self, records: u64) -> u64 {
        assert!(records > 0);
        let first = self.next_id;
        self.next_id += records;
        let tracked = self.next_id.min(self.cap) as usize;
        if tracked > self.ids.len() {
            self.ids.resize(tracked, 0);
        }
        first
    }

    /// The produce of ids `first..first + records` was answered.
    pub fn produced(&mut self, first: u64, records: u64, ok: bool) {
        assert!(first + records <= self.next_id, "ids are claimed first");
        for id in first..(first + records).min(self.cap) {
            let entry = &mut self.ids[id as usize];
            assert_eq!(*entry & OUTCOME_MASK, 0, "one produce outcome per id");
            *entry |= if ok { PRODUCED_OK } else { PRODUCED_FAILED };
            if ok {
                self.tracked_ok_records += 1;
                if *entry >= CONSUMED_ONE {
                    self.consumed_ok_records += 1;
                }
            }
        }
        if ok {
            self.produced_ok_records += records;
        }
    }

    /// Id `id` of this run was consumed and its ack acknowledged.
    pub fn consumed(&mut self, id: u64) {
        if id >= self.next_id {
            self.unknown_records += 1;
            return;
        }
        let Some(entry) = self.ids.get_mut(id as usize) else {
            return;
        };
        let times = *entry >> 2;
        if times > 0 {
            self.duplicate_records += 1;
        } else if *entry & PRODUCED_OK != 0 {
            self.consumed_ok_records += 1;
        }
        if times < CONSUMED_MAX {
            *entry += CONSUMED_ONE;
        }
    }

    /// Produced OK and not consumed yet.
    pub fn outstanding_records(&self) -> u64 {
        assert!(self.consumed_ok_records <= self.tracked_ok_records);
        self.tracked_ok_records - self.consumed_ok_records
    }

    pub fn duplicate_records(&self) -> u64 {
        self.duplicate_records
    }

    pub fn verdict(&self) -> Verdict {
        let missing = self
            .ids
            .iter()
            .filter(|&&entry| entry & OUTCOME_MASK == PRODUCED_OK && entry < CONSUMED_ONE)
            .count() as u64;
        assert_eq!(missing, self.outstanding_records());
        Verdict {
            produced_ok_records: self.produced_ok_records,
            missing_records: missing,
            duplicate_records: self.duplicate_records,
            unknown_records: self.unknown_records,
            untracked_records: self.next_id.saturating_sub(self.cap),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_round_trips_through_a_payload() {
        let mut payload = stamped_payload(100);
        let stamp = Stamp {
            run: 0xdead_beef,
            id: 42,
            sent_unix_ns: 1_700_000_000_123_456_789,
        };
        let at = PAYLOAD_HEAD.len();
        write_stamp(&mut payload[at..at + STAMP_BYTES], stamp);
        assert_eq!(payload.len(), 100);
        let value: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        assert!(value["bench"].as_str().unwrap().starts_with("deadbeef:"));
        assert_eq!(read_payload(&payload), Reading::Stamped { stamp, len: 100 });
        assert_eq!(stamped_payload(64).len(), 64);
    }

    #[test]
    fn damage_and_strangers_are_told_apart() {
        let good = stamped_payload(80);
        assert!(matches!(read_payload(&good), Reading::Stamped { .. }));
        assert_eq!(read_payload(b"{\"other\":1}"), Reading::Foreign);
        assert_eq!(read_payload(b"hello"), Reading::Foreign);
        let plain = super::super::workload::payload(64);
        assert_eq!(read_payload(&plain), Reading::Plain);
        let mut torn_plain = plain.clone();
        torn_plain[20] = b'y';
        assert_eq!(read_payload(&torn_plain), Reading::Damaged);
        let mut flipped = good.clone();
        flipped[70] = b'y';
        assert_eq!(read_payload(&flipped), Reading::Damaged);
        let mut bad_hex = good.clone();
        bad_hex[12] = b'g';
        assert_eq!(read_payload(&bad_hex), Reading::Damaged);
        // A digit changed for another still reads as hex: the checksum tells.
        let at = PAYLOAD_HEAD.len();
        for field in [0, 9, 26, 43] {
            let mut other_digit = good.clone();
            other_digit[at + field + 3] = if good[at + field + 3] == b'7' {
                b'3'
            } else {
                b'7'
            };
            assert_eq!(
                read_payload(&other_digit),
                Reading::Damaged,
                "field at {field}"
            );
        }
        assert_eq!(read_payload(&good[..60]), Reading::Damaged);
    }

    #[test]
    fn the_ledger_counts_missing_and_duplicates_in_any_order() {
        let mut ledger = Ledger::new();
        let first = ledger.claim(4);
        assert_eq!(first, 0);
        // A consumer can see a record before its producer sees the 202.
        ledger.consumed(1);
        ledger.produced(0, 4, true);
        ledger.consumed(2);
        ledger.consumed(2);
        ledger.consumed(99);
        let failed = ledger.claim(1);
        ledger.produced(failed, 1, false);
        assert_eq!(ledger.outstanding_records(), 2);
        assert_eq!(
            ledger.verdict(),
            Verdict {
                produced_ok_records: 4,
                missing_records: 2,
                duplicate_records: 1,
                unknown_records: 1,
                untracked_records: 0,
            }
        );
    }

    #[test]
    fn ids_past_the_tracked_range_are_counted_and_failures_below_it_kept_apart() {
        let mut ledger = Ledger::tracking(4);
        let first = ledger.claim(3);
        ledger.produced(first, 3, true);
        let failed = ledger.claim(1);
        ledger.produced(failed, 1, false);
        let past = ledger.claim(2);
        ledger.produced(past, 2, true);
        for id in 0..3 {
            ledger.consumed(id);
        }
        assert_eq!(ledger.outstanding_records(), 0);
        let verdict = ledger.verdict();
        assert_eq!((verdict.missing_records, verdict.untracked_records), (0, 2));
    }
}
