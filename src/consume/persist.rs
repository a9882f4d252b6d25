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
use narad_shards::consume::state::{
    AckedState, Committer, CommitterConfig, PartitionKey, LEVEL_ERROR_PREFIX, SYNCS_AT_ONCE,
};
use narad_shards::ids::IncarnationId;
use narad_shards::lines::LineThrottle;

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
    let budget = descriptor_budget(narad_io::rt::open_files_soft_limit(), shards);
    CommitterConfig {
        durability_interval,
        open_files_max: budget.held_files,
        syncs_at_once: budget.syncs_at_once,
        level_every: level_every.unwrap_or(default.level_every),
        ..default
    }
}

/// Descriptors a `consumer.ahead` file takes, held or opened for one sync:
/// its own, and the one its page-cache writes go through (`write_cached_at`).
/// A `consumer.offset` opened for a levelling takes no more.
const DESCRIPTORS_PER_FILE: u64 = 2;

/// How one shard spends its share of the node's descriptors for consumer state.
#[derive(Debug, PartialEq, Eq)]
struct DescriptorBudget {
    /// `consumer.ahead` files kept open.
    held_files: usize,
    /// Syncs (or levellings) in flight together, each through a file opened for
    /// it when the partition's is not held; at most a quarter of the share.
    syncs_at_once: usize,
}

/// One shard's share of the node's descriptors for consumer state (a quarter
/// of the soft open-file limit, 32 to 8,192, split evenly over the shards):
/// the files opened for the syncs or levellings in flight first, up to
/// [`SYNCS_AT_ONCE`] and a quarter of the share, then held files with the rest
/// (at least 2; one of each on the tightest limits).
fn descriptor_budget(soft_limit: u64, shards: usize) -> DescriptorBudget {
    let share = held_files_descriptors(soft_limit) / shards.max(1) as u64;
    let syncs_at_once = (share / 4 / DESCRIPTORS_PER_FILE).clamp(1, SYNCS_AT_ONCE as u64);
    let held_files = (share / DESCRIPTORS_PER_FILE).saturating_sub(syncs_at_once);
    DescriptorBudget {
        held_files: held_files.max(2) as usize,
        syncs_at_once: syncs_at_once as usize,
    }
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
    let error_lines = LineThrottle::new(ERROR_LOG_EVERY);
    let slow_tick_lines = LineThrottle::new(LAG_WARNING_EVERY);
    let late_sync_lines = LineThrottle::new(LAG_WARNING_EVERY);
    // Ticks start `tick` apart, start to start: a pass's own time is not added
    // to the wait, and a pass slower than a tick is followed at once.
    let mut next_tick: Option<Instant> = None;
    // Partitions whose state failed a write or sync (a levelling that fails
    // leaves the acks durable) and has not settled since (durable, levelled,
    // not stranded): counted node-wide for `/readyz` while any is. A pass
    // without errors proves nothing by itself: most passes only write to the
    // page cache, and only the sync a durability interval brings finds a
    // failing disk.
    let mut failing: HashSet<PartitionKey> = HashSet::new();
    let was_failing = std::cell::Cell::new(false);
    let note_failing = |now_failing: bool| {
        if now_failing != was_failing.replace(now_failing) {
            shard.node.note_consumer_state_failing(now_failing);
            if !now_failing {
                tracing::info!(shard = shard.index, "consumer offsets persisted again");
            }
        }
    };
    loop {
        let idle = committer.pending_sync() == 0;
        failing.retain(|key| committer.unsettled(key));
        note_failing(!failing.is_empty());
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
                failing.remove(&key);
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
        if !closing
            && took > tick
            && report.primed == 0
            && slow_tick_lines.due(Instant::now()).is_some()
        {
            tracing::warn!(
                written = partitions,
                flush_took = ?took,
                interval = ?tick,
                "a pass of consumer offset writes took longer than its interval (its writes of `written` partitions and the syncs due with it; a slow disk): acks reach the disk about that much later"
            );
        }
        if let Some((waiting, oldest)) = committer.oldest_unsynced(Instant::now()) {
            if oldest > durability_interval * 2 && late_sync_lines.due(Instant::now()).is_some() {
                tracing::warn!(
                    partitions = waiting,
                    oldest = ?oldest,
                    durability_interval = ?durability_interval,
                    "consumer offsets wait longer than their durability interval for a device flush: a power loss would redeliver more acks than it promises"
                );
            }
        }
        // Durable in this pass: well again, unless this pass failed it anew
        // (a levelling after its sync, say).
        for key in &report.durable {
            failing.remove(key);
        }
        failing.extend(
            report
                .errors
                .iter()
                .filter(|(_, error)| !error.starts_with(LEVEL_ERROR_PREFIX))
                .map(|(key, _)| *key),
        );
        failing.retain(|key| committer.unsettled(key));
        note_failing(!failing.is_empty());
        if !report.errors.is_empty() {
            ::metrics::counter!("narad_errors_total", "component" => "storage", "kind" => "consumer_state")
                .increment(report.errors.len() as u64);
        }
        if !report.errors.is_empty() && (closing || error_lines.due(Instant::now()).is_some()) {
            for (key, error) in report.errors.iter().take(8) {
                // The levelled file trails the durable window; a start reads
                // both and takes the larger frontier, so nothing is redelivered
                // for it alone.
                if error.starts_with(LEVEL_ERROR_PREFIX) {
                    tracing::warn!(partition = key.1 .0, %error, "consumer.offset not brought level (the acks are durable in consumer.ahead); tried again at the next levelling");
                } else {
                    tracing::error!(partition = key.1 .0, %error, "consumer offsets not persisted; acks will be redelivered after a crash until this clears");
                }
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
    use super::{
        descriptor_budget, drop_deleted_topics, held_files_descriptors, DescriptorBudget,
        DESCRIPTORS_PER_FILE,
    };
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
        let budget = |held_files, syncs_at_once| DescriptorBudget {
            held_files,
            syncs_at_once,
        };
        // 8,192 descriptors (a quarter of the limit, at most 8,192) a shard,
        // two a file: 32 files for the syncs in flight, the rest held.
        assert_eq!(descriptor_budget(1 << 20, 1), budget(4096 - 32, 32));
        assert_eq!(descriptor_budget(1 << 20, 8), budget(512 - 32, 32));
        // A smaller share gives the syncs a quarter of it.
        assert_eq!(descriptor_budget(4096, 8), budget(64 - 16, 16));
        assert_eq!(descriptor_budget(1024, 1), budget(128 - 32, 32));
        assert_eq!(descriptor_budget(1024, 4), budget(32 - 8, 8));
        // Never none, even on a tiny limit or a very wide node.
        assert_eq!(descriptor_budget(64, 2), budget(8 - 2, 2));
        assert_eq!(descriptor_budget(1 << 20, 10_000), budget(2, 1));
        assert_eq!(descriptor_budget(1024, 128), budget(2, 1));
        // Held files and the syncs' files together keep to the share, on
        // every limit a share holds three files on.
        for limit in [128, 1024, 4096, 20_000, 65_536, 1 << 20] {
            for shards in [1, 2, 3, 8, 64] {
                let share = held_files_descriptors(limit) / shards as u64;
                let b = descriptor_budget(limit, shards);
                let files = (b.held_files + b.syncs_at_once) as u64;
                if share >= 3 * DESCRIPTORS_PER_FILE {
                    assert!(
                        files * DESCRIPTORS_PER_FILE <= share,
                        "{limit} {shards}: {b:?}"
                    );
                }
            }
        }
    }
}
