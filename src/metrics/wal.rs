//! The ingress WAL's series: how long each group commit took to become durable,
//! how many there were and how many records they carried, and the bytes the WAL
//! handed to the device. A produce is acknowledged when its group commit is
//! durable, so the first is most of what a produce waits for.
//!
//! Which cores: each shard's WAL reports on its own thread, once per group
//! commit, into that thread's cells (summed at the scrape like every series
//! here). The WALs a restart with fewer shards left behind only drain and
//! report nothing.

use std::time::Duration;

use ::metrics::{Counter, Histogram};
use narad_shards::wal::WalObserver;

/// One shard's WAL series.
pub struct WalSeries {
    sync_seconds: Histogram,
    syncs: Counter,
    records: Counter,
    device_bytes: Counter,
}

impl Default for WalSeries {
    fn default() -> Self {
        Self {
            sync_seconds: ::metrics::histogram!("narad_ingress_wal_sync_duration_seconds"),
            syncs: ::metrics::counter!("narad_ingress_wal_syncs_total"),
            records: ::metrics::counter!("narad_ingress_wal_synced_records_total"),
            device_bytes: ::metrics::counter!("narad_ingress_wal_device_bytes_total"),
        }
    }
}

impl WalObserver for WalSeries {
    fn synced(&self, took: Duration, records: u64, device_bytes_total: u64) {
        self.sync_seconds.record(took.as_secs_f64());
        self.syncs.increment(1);
        self.records.increment(records);
        self.device_bytes.absolute(device_bytes_total);
    }
}
