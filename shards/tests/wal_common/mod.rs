//! Helpers shared by the WAL tests (included with `mod`).
#![allow(dead_code)]

use narad_io::Storage;
use narad_shards::ids::{IncarnationId, PartitionId, Seq};
use narad_shards::wal::{IngressRecord, Wal, WalConfig};

/// The payload the tests write for record `id`: its id, then bytes derived from it,
/// so a reader can check any record it gets back without a table.
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

/// Checks a payload read back and returns its id.
pub fn check_payload(payload: &[u8]) -> u64 {
    assert!(payload.len() >= 8, "payload too short: {}", payload.len());
    let id = u64::from_le_bytes(payload[..8].try_into().unwrap());
    assert_eq!(
        payload,
        payload_for(id, payload.len()).as_slice(),
        "payload of id {id} is corrupt"
    );
    id
}

pub fn record<'a>(payload: &'a [u8], key: Option<&'a [u8]>) -> IngressRecord<'a> {
    IngressRecord {
        topic: "orders",
        incarnation: IncarnationId(7),
        partition: PartitionId((payload[0] % 4) as u32),
        accept_time_ms: 1_700_000_000_000,
        key,
        payload,
    }
}

pub fn small_config(prealloc: bool) -> WalConfig {
    WalConfig {
        segment_bytes_max: 64 << 10,
        prealloc,
        staging_bytes_max: 256 << 10,
        checkpoint_sync_delay: std::time::Duration::from_millis(2),
        spare_segments_max: 2,
        rotate_dispatched_bytes_min: 16 << 10,
        reader_cache_bytes_max: 64 << 10,
    }
}

/// Reads every durable record from `from` and returns (seq, id) pairs.
pub async fn read_all<S: Storage>(wal: &Wal<S>, from: Seq) -> Vec<(Seq, u64)> {
    let mut reader = wal.reader(from);
    let mut out = Vec::new();
    loop {
        let n = reader
            .read(1024, |seq, rec| out.push((seq, check_payload(rec.payload))))
            .await
            .expect("durable records read back");
        if n == 0 {
            return out;
        }
    }
}
