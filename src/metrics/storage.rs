//! The storage series: the partition logs' device time, size and retention, fed
//! by the owner's [`StorageObserver`] events.
//!
//! Which cores: every shard's owner gets its own [`StorageMetrics`], and records
//! into its own cells like every other series here. A partition's series are
//! registered (labels allocated) once, when its owner starts tracking it; a
//! commit then records through handles held by the partition's observer.
//!
//! The size and segment gauges are set when a log's shape changes (an open, a
//! commit, a roll or retention), so they are current without a poller walking
//! the logs, and a log closed while idle keeps showing its last size, which is
//! still its size on disk. Reads count by where they were answered from: memory
//! (the recent-frame cache, or the window a previous read fetched), or the device
//! (with the bytes fetched), which tells an operator whether consumers run behind
//! what `storage.read_cache_bytes` holds. A deleted topic's gauges are set to zero on every
//! shard that ever tracked its partitions.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use ::metrics::{Counter, Gauge, Histogram};
use narad_shards::ids::{IncarnationId, PartitionId};
use narad_shards::log::{CommitIo, LogStats, RetentionOutcome};
use narad_shards::produce::{PartitionObserver, StorageObserver};

/// Partitions one shard keeps series for; past it the map starts over (the
/// series live on in the recorder and in the owner's slots, but a topic deleted
/// after that is not zeroed for the partitions forgotten).
const STORAGE_TRACKED_MAX: usize = 65_536;

/// One partition's storage series.
pub struct PartitionStorageSeries {
    topic: Rc<str>,
    partition: PartitionId,
    /// The log's size as last set, summed per topic by the poller.
    size: std::cell::Cell<u64>,
    /// Its segments as last set.
    segment_count: std::cell::Cell<u64>,
    fsync_seconds: Histogram,
    flush_seconds: Histogram,
    flush_bytes: Counter,
    size_bytes: Gauge,
    segments: Gauge,
    retention_bytes: Counter,
    retention_messages: Counter,
    retention_seconds: Histogram,
    reads_from_memory: Counter,
    reads_from_device: Counter,
    device_read_bytes: Counter,
}

impl PartitionStorageSeries {
    fn new(topic: &str, partition: PartitionId) -> Self {
        let labels = [
            ("topic", topic.to_string()),
            ("partition", partition.0.to_string()),
        ];
        let aged = [
            ("topic", topic.to_string()),
            ("partition", partition.0.to_string()),
            ("reason", "age".to_string()),
        ];
        let read_from = |source: &str| {
            let labels = [
                ("topic", topic.to_string()),
                ("partition", partition.0.to_string()),
                ("source", source.to_string()),
            ];
            ::metrics::counter!("narad_partition_reads_total", &labels)
        };
        PartitionStorageSeries {
            topic: topic.into(),
            partition,
            size: std::cell::Cell::new(0),
            segment_count: std::cell::Cell::new(0),
            reads_from_memory: read_from("memory"),
            reads_from_device: read_from("device"),
            device_read_bytes: ::metrics::counter!(
                "narad_partition_device_read_bytes_total",
                &labels
            ),
            fsync_seconds: ::metrics::histogram!("narad_storage_fsync_duration_seconds", &labels),
            flush_seconds: ::metrics::histogram!("narad_storage_flush_duration_seconds", &labels),
            flush_bytes: ::metrics::counter!("narad_storage_flush_bytes_total", &labels),
            size_bytes: ::metrics::gauge!("narad_partition_size_bytes", &labels),
            segments: ::metrics::gauge!("narad_segments", &labels),
            retention_bytes: ::metrics::counter!(
                "narad_storage_retention_bytes_deleted_total",
                &aged
            ),
            retention_messages: ::metrics::counter!(
                "narad_storage_retention_messages_deleted_total",
                &aged
            ),
            retention_seconds: ::metrics::histogram!(
                "narad_storage_retention_run_duration_seconds",
                &labels
            ),
        }
    }

    fn zero_gauges(&self) {
        self.size.set(0);
        self.size_bytes.set(0.0);
        self.segments.set(0.0);
    }

    /// Sets the gauges again from what this series last set: another
    /// incarnation under the same labels on this shard shares the cells.
    fn republish(&self) {
        self.size_bytes.set(self.size.get() as f64);
        self.segments.set(self.segment_count.get() as f64);
    }
}

impl PartitionObserver for PartitionStorageSeries {
    fn committed(&self, io: &CommitIo, stats: &LogStats) {
        self.flush_seconds.record(io.write.as_secs_f64());
        self.fsync_seconds.record(io.sync.as_secs_f64());
        self.flush_bytes.increment(io.bytes);
        self.reshaped(stats);
    }

    fn reshaped(&self, stats: &LogStats) {
        self.size.set(stats.size_bytes);
        self.segment_count.set(stats.segment_count as u64);
        self.size_bytes.set(stats.size_bytes as f64);
        self.segments.set(stats.segment_count as f64);
    }

    fn retained(&self, deleted: &RetentionOutcome) {
        self.retention_bytes.increment(deleted.bytes_deleted);
        self.retention_messages.increment(deleted.records_deleted);
    }

    fn retention_ran(&self, took: std::time::Duration) {
        self.retention_seconds.record(took.as_secs_f64());
    }

    fn read(&self, device_bytes: u64) {
        if device_bytes == 0 {
            self.reads_from_memory.increment(1);
        } else {
            self.reads_from_device.increment(1);
            self.device_read_bytes.increment(device_bytes);
        }
    }
}

/// One shard's storage observer: hands each partition its series and remembers
/// them, so a deleted topic's gauges can be zeroed.
#[derive(Default)]
pub struct StorageMetrics {
    tracked: RefCell<HashMap<(IncarnationId, PartitionId), Rc<PartitionStorageSeries>>>,
    /// Topics whose `narad_topic_bytes` this shard set last time.
    topics_set: RefCell<Vec<Rc<str>>>,
}

impl StorageMetrics {
    /// Sets `narad_topic_bytes{topic}` to the summed size of this shard's
    /// partitions of each topic (the scrape sums the shards), and to 0 for a
    /// topic set before that has no partition here any more (deleted).
    pub fn set_topic_bytes(&self) {
        let mut sums: HashMap<Rc<str>, u64> = HashMap::new();
        for series in self.tracked.borrow().values() {
            *sums.entry(series.topic.clone()).or_default() += series.size.get();
        }
        let mut topics_set = self.topics_set.borrow_mut();
        for gone in topics_set.iter().filter(|t| !sums.contains_key(*t)) {
            ::metrics::gauge!("narad_topic_bytes", "topic" => gone.to_string()).set(0.0);
        }
        topics_set.clear();
        for (topic, bytes) in sums {
            ::metrics::gauge!("narad_topic_bytes", "topic" => topic.to_string()).set(bytes as f64);
            topics_set.push(topic);
        }
    }
}

impl StorageObserver for StorageMetrics {
    fn partition(
        &self,
        topic: &str,
        incarnation: IncarnationId,
        partition: PartitionId,
    ) -> Rc<dyn PartitionObserver> {
        let key = (incarnation, partition);
        if let Some(series) = self.tracked.borrow().get(&key) {
            return series.clone();
        }
        let series = Rc::new(PartitionStorageSeries::new(topic, partition));
        let mut tracked = self.tracked.borrow_mut();
        if tracked.len() >= STORAGE_TRACKED_MAX {
            tracked.clear();
        }
        tracked.insert(key, series.clone());
        series
    }

    fn idle_evicted(&self, logs: usize) {
        ::metrics::counter!("narad_idle_logs_evicted_total").increment(logs as u64);
    }

    /// Zeroes the deleted incarnation's gauges, and its topic's size. A topic
    /// made again under the same name whose partition landed on this shard
    /// shares their cells (the labels are the name and the partition), so its
    /// values are set again.
    fn purged(&self, incarnation: IncarnationId) {
        let mut tracked = self.tracked.borrow_mut();
        let mut zeroed = Vec::new();
        tracked.retain(|(id, _), series| {
            if *id == incarnation {
                series.zero_gauges();
                zeroed.push((series.topic.clone(), series.partition));
            }
            *id != incarnation
        });
        for series in tracked.values() {
            if zeroed.contains(&(series.topic.clone(), series.partition)) {
                series.republish();
            }
        }
        drop(tracked);
        // At once rather than at the next poll: a topic made again under the
        // name would show the deleted one's size until then.
        self.set_topic_bytes();
    }
}
