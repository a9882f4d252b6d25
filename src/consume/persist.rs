//! The shard's ack persister: hands the settled state of every partition acked
//! since the last tick to the consumer-offset committer
//! (`narad_shards::consume::state::Committer`), which writes it into the page
//! cache every tick and makes it durable once per
//! `storage.consumer_offset_commit_interval_ms`.
//!
//! Which cores: one task per shard, the only owner of that shard's committer.
//! Other code reaches it through [`Persister`]: acks mark partitions (the
//! [`super::queues::Queues`] list plus a wake), a deleted topic queues a forget,
//! and the stop asks for the final close, which writes and syncs everything and
//! levels every `consumer.offset`, so a graceful restart redelivers nothing that
//! was acked.
//!
//! An idle shard costs nothing: with no partition changed and nothing waiting
//! for its writeout the task sleeps until the next ack.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::rc::Rc;
use std::time::{Duration, Instant};

use narad_io::rt::Notify;
use narad_shards::consume::state::{AckedState, Committer, CommitterConfig, PartitionKey};
use narad_shards::ids::IncarnationId;

use crate::broker::{partition_dir, Shard};

/// Failures logged at most once per this long (they repeat every tick).
const ERROR_LOG_EVERY: Duration = Duration::from_secs(10);
/// The two lag warnings are logged at most this often.
const LAG_WARNING_EVERY: Duration = Duration::from_secs(60);

/// What the rest of the shard tells the persister task.
#[derive(Default)]
pub struct Persister {
    /// Wakes the task: something was acked, forgotten, or the node stops.
    pub wake: Notify,
    forgets: RefCell<Vec<IncarnationId>>,
    closing: Cell<bool>,
}

impl Persister {
    /// A deleted topic: nothing more is written for its partitions.
    pub fn forget(&self, incarnation: IncarnationId) {
        self.forgets.borrow_mut().push(incarnation);
        self.wake.notify();
    }

    /// The node stops: write, sync and level everything, then end.
    pub fn close(&self) {
        self.closing.set(true);
        self.wake.notify();
    }
}

/// The committer config of one of a node's `shards` shards; `level_every`
/// replaces the 30 s between levellings of `consumer.offset` (a debug hook).
pub fn committer_config(
    durability_interval: Duration,
    shards: usize,
    level_every: Option<Duration>,
) -> CommitterConfig {
    let default = CommitterConfig::default();
    CommitterConfig {
        durability_interval,
        open_files_max: open_files_max(narad_io::rt::open_files_soft_limit(), shards),
        level_every: level_every.unwrap_or(default.level_every),
        ..default
    }
}

/// Descriptors a held `consumer.ahead` file takes: its own, and the one its
/// page-cache writes go through (`write_cached_at`).
const DESCRIPTORS_PER_HELD_FILE: u64 = 2;

/// One shard's share of the node's descriptor budget for `consumer.ahead` files:
/// a quarter of the soft open-file limit in descriptors (32 to 8,192), two a
/// file, split evenly over its shards (at least 2 files each).
fn open_files_max(soft_limit: u64, shards: usize) -> usize {
    let shards = shards.max(1) as u64;
    (held_files_descriptors(soft_limit) / DESCRIPTORS_PER_HELD_FILE / shards).max(2) as usize
}

/// The node's descriptors for held `consumer.ahead` files: a quarter of the
/// soft open-file limit, 32 to 8,192.
pub fn held_files_descriptors(soft_limit: u64) -> u64 {
    (soft_limit / 4).clamp(32, 8192)
}

/// Passes a stop makes over partitions whose final write or sync failed.
const CLOSE_ATTEMPTS: usize = 3;

/// Runs the shard's committer until [`Persister::close`]; an error says which
/// acks the stop could not persist (they are delivered again after the restart).
pub async fn run_persister(shard: Rc<Shard>, config: CommitterConfig) -> Result<(), String> {
    let tick = config.tick.min(config.durability_interval);
    let durability_interval = config.durability_interval;
    let mut committer = Committer::new(shard.storage.clone(), config);
    let mut known: HashSet<PartitionKey> = HashSet::new();
    let mut last_error_log: Option<Instant> = None;
    let mut last_slow_tick_log: Option<Instant> = None;
    let mut last_late_sync_log: Option<Instant> = None;
    // Ticks start `tick` apart, start to start: a pass's own time is not added
    // to the wait, and a pass slower than a tick is followed at once.
    let mut next_tick: Option<Instant> = None;
    loop {
        let idle = committer.pending_sync() == 0;
        if idle && !shard.persister.closing.get() {
            // Acks after a quiet spell gather for a whole tick.
            next_tick = None;
            // Nothing to write, but a level may still be owed: wait for it
            // (or the next ack), not only for the next ack.
            match committer.next_level_at(Instant::now()) {
                None => shard.persister.wake.wait().await,
                Some(at) => {
                    let wait = at.saturating_duration_since(Instant::now());
                    futures_lite::future::or(shard.persister.wake.wait(), narad_io::rt::sleep(wait))
                        .await
                }
            }
        }
        if !shard.persister.closing.get() {
            let at = *next_tick.get_or_insert_with(|| Instant::now() + tick);
            narad_io::rt::sleep(at.saturating_duration_since(Instant::now())).await;
        }
        let forgets = std::mem::take(&mut *shard.persister.forgets.borrow_mut());
        for incarnation in forgets {
            let keys: Vec<PartitionKey> = known
                .iter()
                .filter(|(id, _)| *id == incarnation)
                .copied()
                .collect();
            for key in keys {
                committer.forget(key).await;
                known.remove(&key);
            }
        }
        let changed = changed_states(&shard);
        known.extend(changed.iter().map(|(key, _, _)| *key));
        let closing = shard.persister.closing.get();
        let partitions = changed.len();
        let started = Instant::now();
        next_tick = Some(started + tick);
        let mut report = if closing {
            committer.close(started, changed).await
        } else {
            committer.tick(started, changed).await
        };
        drop_deleted_topics(&mut report.errors, |id| shard_has_topic(&shard, id));
        // A failed final write or sync is tried again: the next pass rewrites
        // the window and syncs it.
        for _ in 1..CLOSE_ATTEMPTS {
            if !closing || report.errors.is_empty() {
                break;
            }
            narad_io::rt::sleep(tick).await;
            report = committer.close(Instant::now(), Vec::new()).await;
            drop_deleted_topics(&mut report.errors, |id| shard_has_topic(&shard, id));
        }
        let took = started.elapsed();
        // A tick that primed partitions read their files first: not a lag.
        if !closing && took > tick && report.primed == 0 && due(&mut last_slow_tick_log) {
            tracing::warn!(
                written = partitions,
                flush_took = ?took,
                interval = ?tick,
                "a pass of consumer offset writes took longer than its interval (its writes of `written` partitions and the syncs due with it; a slow disk): acks reach the disk about that much later"
            );
        }
        if let Some((waiting, oldest)) = committer.oldest_unsynced(Instant::now()) {
            if oldest > durability_interval * 2 && due(&mut last_late_sync_log) {
                tracing::warn!(
                    partitions = waiting,
                    oldest = ?oldest,
                    durability_interval = ?durability_interval,
                    "consumer offsets wait longer than their durability interval for a device flush: a power loss would redeliver more acks than it promises"
                );
            }
        }
        if !report.errors.is_empty()
            && (closing || last_error_log.is_none_or(|at| at.elapsed() >= ERROR_LOG_EVERY))
        {
            last_error_log = Some(Instant::now());
            for (key, error) in report.errors.iter().take(8) {
                tracing::error!(partition = key.1 .0, %error, "consumer offsets not persisted; acks will be redelivered after a crash until this clears");
            }
        }
        if closing {
            if !report.errors.is_empty() {
                return Err(format!(
                    "the consumer offsets of {} partitions were not persisted at the stop; their acks since the last durable write will be delivered again",
                    report.errors.len()
                ));
            }
            tracing::info!(
                shard = shard.index,
                written = report.written,
                synced = report.synced,
                "consumer offsets persisted"
            );
            return Ok(());
        }
    }
}

/// Whether `incarnation` is a topic of the shard's metadata snapshot and not
/// waiting to be forgotten here.
fn shard_has_topic(shard: &Shard, incarnation: IncarnationId) -> bool {
    !shard.persister.forgets.borrow().contains(&incarnation)
        && shard.meta.snapshot().topics.contains_id(incarnation)
}

/// Drops the failures of partitions whose topic was deleted while their state
/// was being written (its directory went away under the write): their acks
/// have nothing left to be redelivered from, so they are no error to report.
fn drop_deleted_topics(
    errors: &mut Vec<(PartitionKey, String)>,
    mut live: impl FnMut(IncarnationId) -> bool,
) {
    errors.retain(|((incarnation, partition), error)| {
        let keep = live(*incarnation);
        if !keep {
            tracing::debug!(partition = partition.0, %error, "consumer offsets of a deleted topic not written");
        }
        keep
    });
}

/// Whether a warning last logged at `last` may be logged again (at most once a
/// minute); if so, notes that it is.
fn due(last: &mut Option<Instant>) -> bool {
    if last.is_some_and(|at| at.elapsed() < LAG_WARNING_EVERY) {
        return false;
    }
    *last = Some(Instant::now());
    true
}

/// The settled state of every partition acked since the last call.
fn changed_states(shard: &Shard) -> Vec<(PartitionKey, String, AckedState)> {
    let mut changed = Vec::new();
    for key in shard.queues.take_settled_changed() {
        let Some(queue) = shard.queues.loaded(key) else {
            continue;
        };
        let queue = queue.borrow();
        let state = AckedState {
            frontier: queue.table.frontier(),
            ahead: queue.table.acked_ahead().collect(),
        };
        let dir = partition_dir(&queue.topic, key.0, key.1);
        changed.push((key, dir, state));
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::{drop_deleted_topics, open_files_max};
    use narad_shards::ids::{IncarnationId, PartitionId};

    #[test]
    fn failures_of_deleted_topics_are_not_reported() {
        let live = IncarnationId(7);
        let deleted = IncarnationId(9);
        let mut errors = vec![
            (
                (deleted, PartitionId(1)),
                "consumer.offset: No such file".to_string(),
            ),
            ((live, PartitionId(0)), "EIO".to_string()),
            (
                (deleted, PartitionId(0)),
                "consumer.ahead: No such file".to_string(),
            ),
            ((live, PartitionId(2)), "ENOSPC".to_string()),
        ];
        drop_deleted_topics(&mut errors, |id| id == live);
        assert_eq!(
            errors,
            vec![
                ((live, PartitionId(0)), "EIO".to_string()),
                ((live, PartitionId(2)), "ENOSPC".to_string()),
            ]
        );
    }

    #[test]
    fn the_descriptor_budget_is_the_nodes_split_over_its_shards() {
        assert_eq!(open_files_max(1 << 20, 1), 4096);
        assert_eq!(open_files_max(1 << 20, 8), 512);
        // Two descriptors a file: a quarter of the limit is half as many files.
        assert_eq!(open_files_max(4096, 8), 64);
        assert_eq!(open_files_max(1024, 1), 128);
        // Never none, even on a tiny limit or a very wide node.
        assert_eq!(open_files_max(64, 2), 8);
        assert_eq!(open_files_max(1 << 20, 10_000), 2);
        // A wide node on a small limit keeps its files to half the limit.
        assert_eq!(open_files_max(1024, 128), 2);
    }
}
