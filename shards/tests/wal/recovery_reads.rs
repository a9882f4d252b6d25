//! What an open of the ingress WAL reads: an active segment that is a recycled
//! one holds stale frames past its valid tail, and the scan past that tail reads
//! each byte of the rest of it about once, not a chunk at every stale frame.

use crate::common::*;
use narad_io::rt::run_local;
use narad_io::sim::{SimDisk, SimFaults};
use narad_shards::ids::Seq;
use narad_shards::wal::{Wal, WalConfig};

const SEGMENT_BYTES: u64 = 4 << 20;

#[test]
fn reopening_a_recycled_segment_reads_it_about_once() {
    let disk = SimDisk::new(21, SimFaults::default());
    run_local(None, async move {
        let config = WalConfig {
            segment_bytes_max: SEGMENT_BYTES,
            spare_segments_max: 2,
            flush_bytes_target: 256 << 10,
            reader_cache_bytes_max: 1 << 20,
            ..small_config(true)
        };
        let wal = Wal::open(disk.clone(), "wal", config.clone())
            .await
            .unwrap();
        // Fill segments of 1 KiB frames, dispatched as they go, until a
        // compacted segment has come back as the active one.
        let payload = vec![9u8; 1024];
        while wal.stats().rolls < 4 {
            let seq = wal.append(&record(&payload, None)).await.unwrap();
            if seq.0 % 256 == 0 {
                wal.store_checkpoint(Seq(seq.0 + 1));
            }
        }
        for _ in 0..64 {
            let seq = wal.append(&record(&payload, None)).await.unwrap();
            wal.store_checkpoint(Seq(seq.0 + 1));
        }
        wait_until(|| wal.stats().compactions >= 2).await;
        assert!(wal.stats().compactions >= 2, "{:?}", wal.stats());
        wal.close().await;
        let before = disk.stats().bytes_read;
        let wal = Wal::open(disk.clone(), "wal", config).await.unwrap();
        let read = disk.stats().bytes_read - before;
        // The active segment once, and a chunk or two around its tail.
        assert!(
            read <= 2 * SEGMENT_BYTES,
            "the open read {read} bytes for segments of {SEGMENT_BYTES}"
        );
        wal.close().await;
    });
}
