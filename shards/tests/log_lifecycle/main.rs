//! Partition log lifecycle: bit rot in the active and sealed segments, failed
//! rolls, index rebuilds, the recent-frame cache, what the preparation scheme
//! costs on disk (`damage.rs`), and time-based roll and retention, also over
//! damaged segments and indexes (`retention.rs`). The helpers below are theirs.

mod damage;
#[path = "../log_common/mod.rs"]
mod log_common;
mod retention;

pub use log_common::fresh_log;

use narad_io::sim::SimDisk;
use narad_shards::ids::Offset;
use narad_shards::log::{LogConfig, PartitionLog, ReadItem, RecordRef};

pub const DIR: &str = "topics/t/p00001";

pub fn config() -> LogConfig {
    LogConfig {
        segment_bytes_max: 64 * 1024,
        prep_chunk_bytes: 16 * 1024,
        index_interval_bytes: 2048,
        frame_area_bytes_target: 2048,
        commit_bytes_max: 64 * 1024,
        segment_ms: 1000,
        retention_ms: 5000,
        ..LogConfig::default()
    }
}

pub fn segment_path(base: u64) -> String {
    format!("{DIR}/{base:020}.log")
}

pub fn payload(offset: u64) -> Vec<u8> {
    format!("record {offset} ")
        .repeat(1 + (offset % 5) as usize)
        .into_bytes()
}

/// Commits `n` records, offsets `hwm..hwm+n`, with payloads that name their offset.
pub async fn commit(
    log: &mut PartitionLog<SimDisk>,
    n: u64,
    now_ms: u64,
) -> std::ops::Range<Offset> {
    let first = log.high_watermark().0;
    let payloads: Vec<Vec<u8>> = (first..first + n).map(payload).collect();
    let records: Vec<RecordRef> = payloads
        .iter()
        .map(|p| RecordRef {
            key: Some(b"k"),
            payload: p,
            mask: 0,
        })
        .collect();
    log.commit_durable(&records, now_ms).await.expect("commit")
}

/// Reads `from..hwm` and returns the items.
pub async fn read_all(log: &mut PartitionLog<SimDisk>, from: u64) -> Vec<ReadItem> {
    log_common::read_all(log, Offset(from)).await
}

/// Checks that `items` are exactly the records of `offsets`, in order.
pub fn assert_records(items: &[ReadItem], offsets: impl Iterator<Item = u64>) {
    let offsets: Vec<u64> = offsets.collect();
    assert_eq!(items.len(), offsets.len(), "{items:?}");
    for (item, offset) in items.iter().zip(offsets) {
        let ReadItem::Record(r) = item else {
            panic!("offset {offset}: {item:?}")
        };
        assert_eq!(r.offset, Offset(offset));
        assert_eq!(r.payload.as_ref(), payload(offset).as_slice());
    }
}
