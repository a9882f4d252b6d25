//! The gauge poller: every few seconds each shard sets the gauges that no event
//! moves (WAL backlog and latch, open logs, consumer state and the age of the
//! oldest unacked record, topic sizes), and shard 0 starts the thread that
//! measures the data directory.
//!
//! Which cores: each shard's own poller task, on that shard; the data directory
//! walk on a thread of its own.

use std::collections::HashMap;
use std::rc::Rc;

use narad_shards::ids::{IncarnationId, Offset, PartitionId};

/// How often a shard refreshes its gauges.
pub const POLL_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Sets the shard's gauges every few seconds: its WAL's backlog and latch, its
/// open logs, the consumer state of the partitions it has loaded and the age
/// of their oldest unacked records, and the size of its topics. Shard 0 also
/// starts the thread that measures the data directory.
/// `queue_loads` bounds the partitions a poll loads the consumer state of
/// ([`QUEUE_LOADS_PER_POLL`] unless a test says otherwise).
pub async fn run_poller(
    shard: Rc<crate::broker::Shard>,
    every: std::time::Duration,
    queue_loads: usize,
) {
    if shard.index == 0 {
        start_data_dir_walker(shard.data_dir.clone(), every, shard.meta.published());
        narad_io::rt::spawn_local(watch_disk(shard.clone(), every.min(DISK_CHECK_EVERY)));
    }
    let mut known = FrontierTimes::new();
    let mut series = QueueSeries::new();
    while !shard.stopping.get() {
        let behind = poll_once(&shard, &mut series);
        set_oldest_unconsumed_ages(&shard, behind, &mut known, &series).await;
        load_unwatched_queues(&shard, queue_loads).await;
        narad_shards::produce::reaper::note_success("gauges");
        narad_io::rt::sleep(every).await;
    }
}

/// Partitions whose consumer state a poll loads at most, so that a node with
/// many partitions opens their logs over a few polls rather than all at once.
pub const QUEUE_LOADS_PER_POLL: usize = 64;

/// Loads the consumer state of up to `budget` partitions this shard owns that
/// no consumer has touched since the node started, so that their lag and the
/// age of their oldest record are exported too: an alert on a backlog nobody
/// consumes must not stay silent because nobody consumes it. A loaded queue
/// follows its partition's high watermark from then on with no further read
/// (loading it reads where the log ends; a closed log is opened for that
/// and closed again, so a start does not leave every log open until idle
/// eviction).
async fn load_unwatched_queues(shard: &crate::broker::Shard, budget: usize) {
    let snapshot = shard.meta.snapshot();
    let mut left = budget;
    for (name, record) in snapshot.topics.iter() {
        if left == 0 {
            return;
        }
        let unloaded: Vec<PartitionId> = (0..record.partitions)
            .map(PartitionId)
            .filter(|&p| shard.owner_of(record.id, p) == shard.index)
            .filter(|&p| shard.queues.loaded((record.id, p)).is_none())
            .take(left)
            .collect();
        if unloaded.is_empty() {
            continue;
        }
        left -= unloaded.len();
        let topic: std::sync::Arc<str> = name.clone();
        shard
            .queues
            .load_for_gauges(&topic, record, &unloaded)
            .await;
    }
}

/// How often shard 0 checks the data directory's free space (one `statvfs`):
/// often enough that a fast writer cannot fill the margin the disk guard keeps
/// between two checks.
const DISK_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Sets `narad_data_dir_available_bytes` and the disk guard
/// ([`DiskGuard`](crate::http::node::DiskGuard)) every `every`, until the node
/// stops.
async fn watch_disk(shard: Rc<crate::broker::Shard>, every: std::time::Duration) {
    while !shard.stopping.get() {
        if let Some((available, low)) = note_disk_now(&shard.node, &shard.data_dir) {
            // Only this task sets the two gauges: the recorder sums a gauge
            // over the threads that set it.
            ::metrics::gauge!("narad_data_dir_available_bytes").set(available as f64);
            ::metrics::gauge!("narad_data_dir_low").set(if low { 1.0 } else { 0.0 });
        }
        narad_io::rt::sleep(every).await;
    }
}

/// Measures the data directory's free space once and tells the disk guard;
/// returns the bytes available and whether the guard holds produces back. The
/// start does it before any WAL opens, so that none prepares a segment the disk
/// has no room for.
pub fn note_disk_now(
    node: &crate::http::node::NodeState,
    data_dir: &std::path::Path,
) -> Option<(u64, bool)> {
    let (available, total) = disk_space(data_dir)?;
    Some((available, node.note_disk(available, total)))
}

/// The gauges of one loaded partition's consumer state, registered once: a
/// registration builds the labels and looks the series up under the
/// registry's lock, and a shard with ten thousand partitions spent most of a
/// 60-90 ms stall of its poll every 5 s doing that for each.
struct QueueGauges {
    in_flight: ::metrics::Gauge,
    acked_ahead: ::metrics::Gauge,
    lag: ::metrics::Gauge,
    age: ::metrics::Gauge,
    dropped: ::metrics::Gauge,
}

impl QueueGauges {
    fn register(topic: &str, partition: PartitionId) -> Self {
        let labels = [
            ("topic", topic.to_string()),
            ("partition", partition.0.to_string()),
        ];
        // The counter is raised where records are skipped; here it is only
        // made to exist, at 0 until then, so that `increase()` sees the first
        // skip.
        ::metrics::counter!("narad_consumer_corrupt_skipped_total", &labels).increment(0);
        QueueGauges {
            in_flight: ::metrics::gauge!("narad_inflight_size", &labels),
            acked_ahead: ::metrics::gauge!("narad_acked_ahead_size", &labels),
            lag: ::metrics::gauge!("narad_consumer_lag_messages", &labels),
            age: ::metrics::gauge!("narad_oldest_unconsumed_message_age_seconds", &labels),
            dropped: ::metrics::gauge!("narad_consumer_dropped_messages", &labels),
        }
    }
}

/// The queue gauges of the partitions loaded at the last poll.
pub struct QueueSeries {
    gauges: HashMap<(IncarnationId, PartitionId), (u64, QueueGauges)>,
    polls: u64,
}

impl QueueSeries {
    pub fn new() -> Self {
        QueueSeries {
            gauges: HashMap::new(),
            polls: 0,
        }
    }
}

impl Default for QueueSeries {
    fn default() -> Self {
        Self::new()
    }
}

/// The commit time (Unix ms) of the record at each lagging partition's
/// frontier, as last read: while a frontier stays put its age needs no read.
type FrontierTimes = HashMap<(IncarnationId, PartitionId), (Offset, u64)>;

/// A loaded partition with unacked records: its topic and where they start.
pub struct Behind {
    topic: std::sync::Arc<str>,
    incarnation: narad_shards::ids::IncarnationId,
    partition: narad_shards::ids::PartitionId,
    frontier: narad_shards::ids::Offset,
}

/// Sets `narad_oldest_unconsumed_message_age_seconds` of each partition with
/// unacked records: the age of the record at its frontier (the lowest unacked
/// offset), from its commit time. A frontier that moved since the last poll
/// costs one peek at one record, which the recent-frame cache or the read
/// window usually answers. The peek does not count as a use, so a partition
/// its consumers left is still closed when idle; a closed log is opened for
/// the peek and closed again (once per frontier: after a start, or when the
/// frontier moved while it was closed). A partition whose read failed keeps
/// its last value.
async fn set_oldest_unconsumed_ages(
    shard: &crate::broker::Shard,
    behind: Vec<Behind>,
    known: &mut FrontierTimes,
    series: &QueueSeries,
) {
    use narad_shards::log::{ReadItem, ReadRange};
    let lagging: std::collections::HashSet<(IncarnationId, PartitionId)> = behind
        .iter()
        .map(|b| (b.incarnation, b.partition))
        .collect();
    known.retain(|key, _| lagging.contains(key));
    for b in behind {
        if shard.stopping.get() {
            return;
        }
        let key = (b.incarnation, b.partition);
        let commit_time_ms = match known.get(&key) {
            Some(&(frontier, time_ms)) if frontier == b.frontier => time_ms,
            _ => {
                // A frontier not seen before (after a start, or once it
                // moved) is read even from a closed log, which is opened for
                // it and closed again: a backlog nobody consumes must show
                // its age too. Once per frontier.
                let peeked = shard
                    .owner
                    .peek_sparing(
                        &b.topic,
                        b.incarnation,
                        b.partition,
                        ReadRange::new(b.frontier, 1, 1),
                    )
                    .await;
                let Ok(batch) = peeked else { continue };
                let Some(ReadItem::Record(record)) = batch.items.first() else {
                    continue;
                };
                if record.offset != b.frontier {
                    // The frontier record is gone (retention, or a corrupt run):
                    // the next one is the oldest unacked, but its time says
                    // nothing about this frontier; look again next poll.
                    known.remove(&key);
                } else {
                    known.insert(key, (b.frontier, record.commit_time_ms));
                }
                record.commit_time_ms
            }
        };
        // The topic may have been deleted while an earlier peek waited: its
        // gauges were cleared then, and stay so.
        if shard.queues.loaded(key).is_none() {
            continue;
        }
        let age_ms = narad_io::rt::unix_ms().saturating_sub(commit_time_ms);
        if let Some((_, gauges)) = series.gauges.get(&key) {
            gauges.age.set(age_ms as f64 / 1000.0);
        }
    }
}

/// Starts a thread that every `every` sets `narad_data_dir_size_bytes` to the
/// bytes the data directory's files occupy on disk (allocated blocks, as `du`),
/// and the housekeeping gauges of what sits there beside the live data
/// ([`set_leftover_gauges`]). A thread of its own, not a shard's poller: a walk
/// over thousands of files would stall the shard's reactor meanwhile. It lives
/// as long as the process.
fn start_data_dir_walker(
    dir: std::path::PathBuf,
    every: std::time::Duration,
    published: std::sync::Arc<crate::control::Published>,
) {
    let spawned = std::thread::Builder::new()
        .name("narad-du".into())
        .spawn(move || loop {
            let started = std::time::Instant::now();
            ::metrics::gauge!("narad_data_dir_size_bytes").set(disk_usage(&dir) as f64);
            set_leftover_gauges(&dir, &published);
            narad_shards::produce::reaper::note_success("data_dir");
            std::thread::sleep(walk_pause(every, started.elapsed()));
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the data directory size thread; narad_data_dir_size_bytes stays unset");
    }
}

/// How long the data directory walker rests after a walk that took `took`:
/// `every`, or [`WALK_REST_PER_WALK`] times the walk when that is longer. A
/// walk stats every file; on a node with tens of thousands of partitions it
/// took half a second, and every 5 s that was a tenth of a core, the most of
/// what an idle node spent.
fn walk_pause(every: std::time::Duration, took: std::time::Duration) -> std::time::Duration {
    every.max(took.saturating_mul(WALK_REST_PER_WALK))
}

/// See [`walk_pause`]: the walker keeps to about 2% of a core.
const WALK_REST_PER_WALK: u32 = 50;

/// What the data directory holds beside the live topics' data:
/// - `narad_orphan_topic_dirs`: incarnation directories under `topics/` that no
///   live topic owns (a deleted topic's data not yet removed; a start moves any
///   left over to `quarantine/` or removes it);
/// - `narad_quarantined_copies` and `narad_quarantined_bytes`: the entries under
///   `quarantine/` (topic data a start found that no topic owned) and the bytes
///   they occupy. Nothing removes them: an operator decides.
fn set_leftover_gauges(dir: &std::path::Path, published: &crate::control::Published) {
    let live: std::collections::HashSet<String> = published
        .load()
        .topics
        .values()
        .map(|t| t.id.to_string())
        .collect();
    let mut orphans = 0u64;
    for topic in std::fs::read_dir(dir.join("topics"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let incarnations = std::fs::read_dir(topic.path())
            .into_iter()
            .flatten()
            .flatten();
        orphans += incarnations
            .filter(|i| !live.contains(i.file_name().to_string_lossy().as_ref()))
            .count() as u64;
    }
    ::metrics::gauge!("narad_orphan_topic_dirs").set(orphans as f64);
    let quarantine = dir.join("quarantine");
    let copies = std::fs::read_dir(&quarantine)
        .map(|entries| entries.flatten().count())
        .unwrap_or(0);
    ::metrics::gauge!("narad_quarantined_copies").set(copies as f64);
    ::metrics::gauge!("narad_quarantined_bytes").set(disk_usage(&quarantine) as f64);
}

/// Bytes allocated to the files under `dir`, symbolic links not followed; what
/// cannot be read (a file deleted during the walk) counts nothing.
pub fn disk_usage(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            total += meta.blocks() * 512;
            if meta.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    total
}

/// Bytes an unprivileged writer may still use on the file system holding `dir`
/// (`statvfs`: available blocks times the fragment size); `None` if it fails.
/// The bytes free to an unprivileged writer on the data directory's file system
/// and its size. In a debug build, `NARAD_DEBUG_DISK_AVAILABLE_BYTES` stands in
/// for the free bytes, for the tests of the disk guard.
fn disk_space(dir: &std::path::Path) -> Option<(u64, u64)> {
    let (available, total) = statvfs_bytes(dir)?;
    #[cfg(debug_assertions)]
    if let Some(fake) = std::env::var("NARAD_DEBUG_DISK_AVAILABLE_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return Some((fake, total));
    }
    Some((available, total))
}

fn statvfs_bytes(dir: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is a NUL-terminated string and `stat` is writable memory of
    // the right type, which statvfs fills when it returns 0.
    let stat = unsafe {
        if libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) != 0 {
            return None;
        }
        stat.assume_init()
    };
    Some((
        stat.f_bavail.saturating_mul(stat.f_frsize),
        stat.f_blocks.saturating_mul(stat.f_frsize),
    ))
}

/// One refresh of the shard's gauges; returns the partitions with unacked
/// records, whose oldest record's age needs a read.
pub fn poll_once(shard: &crate::broker::Shard, series: &mut QueueSeries) -> Vec<Behind> {
    // Records still to dispatch include those of WALs left by shards that no
    // longer exist: the gauge reading 0 is what says a downgrade is safe.
    let leftovers = shard.leftover_wals.borrow();
    let backlog = shard.wal.dispatch_backlog_records()
        + leftovers
            .iter()
            .map(|(_, wal)| wal.dispatch_backlog_records())
            .sum::<u64>();
    drop(leftovers);
    ::metrics::gauge!("narad_ingress_dispatch_backlog_records").set(backlog as f64);
    let latched = shard.wal.is_latched();
    ::metrics::gauge!("narad_ingress_wal_failed").set(if latched { 1.0 } else { 0.0 });
    // A latch whose producers all went away before their answer is seen here,
    // not by a produce: `/readyz` learns of it all the same.
    if latched {
        shard.node.note_wal_failed();
    }
    ::metrics::gauge!("narad_open_partition_logs").set(shard.owner.open_log_count() as f64);
    // One shard speaks for the node's file system and its metadata (gauges sum
    // over shards).
    if shard.index == 0 {
        let meta = shard.meta.snapshot();
        let partitions: u64 = meta.topics.values().map(|t| u64::from(t.partitions)).sum();
        ::metrics::gauge!("narad_topics_total").set(meta.topics.len() as f64);
        ::metrics::gauge!("narad_partitions_total").set(partitions as f64);
    }
    shard.storage_metrics.set_topic_bytes();
    let mut behind = Vec::new();
    series.polls += 1;
    let poll = series.polls;
    shard
        .queues
        .for_each_loaded(|incarnation, partition, queue| {
            let (seen, gauges) = series
                .gauges
                .entry((incarnation, partition))
                .or_insert_with(|| (poll, QueueGauges::register(&queue.topic, partition)));
            *seen = poll;
            let table = &queue.table;
            gauges.in_flight.set(table.in_flight() as f64);
            gauges.acked_ahead.set(table.acked_ahead_len() as f64);
            let lag = queue.hwm.0.saturating_sub(table.frontier().0);
            gauges.lag.set(lag as f64);
            if lag == 0 {
                gauges.age.set(0.0);
            } else {
                behind.push(Behind {
                    topic: queue.topic.clone(),
                    incarnation,
                    partition,
                    frontier: table.frontier(),
                });
            }
            gauges.dropped.set(table.dropped_total() as f64);
        });
    // Partitions no longer loaded (their topic deleted, or their queue
    // dropped) let go of their handles; a later load registers them again.
    series.gauges.retain(|_, (seen, _)| *seen == poll);
    behind
}

/// Sets a partition's queue gauges back to 0 when its topic is deleted here:
/// the poller sets them only for partitions still loaded, so they would keep
/// their last values for good, and a topic made again under the name (whose
/// partition may land on another shard) would show them added to its own.
pub fn clear_queue_gauges(topic: &str, partition: PartitionId) {
    let labels = [
        ("topic", topic.to_string()),
        ("partition", partition.0.to_string()),
    ];
    for name in [
        "narad_inflight_size",
        "narad_acked_ahead_size",
        "narad_consumer_lag_messages",
        "narad_oldest_unconsumed_message_age_seconds",
        "narad_consumer_dropped_messages",
    ] {
        ::metrics::gauge!(name, &labels).set(0.0);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::walk_pause;

    /// A quick walk keeps the interval; a slow one rests fifty times its length.
    #[test]
    fn a_slow_walk_rests_in_proportion() {
        let every = Duration::from_secs(5);
        assert_eq!(walk_pause(every, Duration::from_millis(20)), every);
        assert_eq!(
            walk_pause(every, Duration::from_millis(550)),
            Duration::from_millis(27_500)
        );
    }
}
