//! Helpers shared by the WAL tests (included with `mod`).
#![allow(dead_code)]

use narad_io::Storage;
use narad_shards::ids::{IncarnationId, PartitionId, Seq};
use narad_shards::wal::{IngressRecord, Wal, WalConfig};

#[allow(unused_imports)]
pub use narad_shards::testkit::payload_for;

/// Checks a payload read back and returns its id.
pub fn check_payload(payload: &[u8]) -> u64 {
    narad_shards::testkit::check_payload(payload)
        .unwrap_or_else(|| panic!("payload of {} bytes is corrupt", payload.len()))
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
        // Small, so that bursts become pipelines of several batches.
        flush_bytes_target: 8 << 10,
        checkpoint_sync_delay: std::time::Duration::from_millis(2),
        checkpoint_store_interval: std::time::Duration::from_millis(1),
        spare_segments_max: 2,
        rotate_dispatched_bytes_min: 16 << 10,
        reader_cache_bytes_max: 64 << 10,
        durable_writes: true,
        disk_room: None,
    }
}

/// [`small_config`] whose every batch is written and then synced beside the
/// next one's write: the pipeline, which with durable writes only batches too
/// large for one write run (or that roll a segment) take.
pub fn pipeline_config(prealloc: bool) -> WalConfig {
    WalConfig {
        durable_writes: false,
        ..small_config(prealloc)
    }
}

/// Reads every durable record from `from` and returns (seq, id) pairs.
pub async fn read_all<S: Storage>(wal: &Wal<S>, from: Seq) -> Vec<(Seq, u64)> {
    let mut reader = wal.reader(from);
    let mut out = Vec::new();
    loop {
        let n = reader
            .read(1024, |seq, rec| {
                out.push((seq, check_payload(&rec.payload_vec())))
            })
            .await
            .expect("durable records read back");
        if n == 0 {
            return out;
        }
    }
}

/// Closes `wal`, opens the WAL on `disk` again (`small_config(prealloc)`),
/// and checks that it resumes at `next`.
pub async fn reopens_at(
    wal: narad_shards::wal::Wal<narad_io::sim::SimDisk>,
    disk: &narad_io::sim::SimDisk,
    prealloc: bool,
    next: narad_shards::ids::Seq,
) {
    wal.close().await;
    let reopened = narad_shards::wal::Wal::open(disk.clone(), "wal", small_config(prealloc))
        .await
        .unwrap();
    assert_eq!(reopened.next_seq(), next, "where the reopened WAL resumes");
    reopened.close().await;
}

/// Waits, polling every 2 ms, until `cond` holds; panics after about 4 s.
pub async fn wait_until(mut cond: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if cond() {
            return;
        }
        narad_io::rt::sleep(std::time::Duration::from_millis(2)).await;
    }
    panic!("condition not reached within 4 s");
}

/// Whether the `wal` directory of `disk` holds a file named `name`.
pub fn disk_names_contain(disk: &narad_io::sim::SimDisk, name: &str) -> bool {
    futures_lite::future::block_on(disk.list("wal"))
        .unwrap()
        .iter()
        .any(|n| n == name)
}
