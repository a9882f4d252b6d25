//! A shard's retention housekeeping as `narad serve` runs it: the reaper's
//! settings (with the debug retention hooks the parent module describes), the
//! supervisor that starts a panicked reaper again, and the partitions the shard
//! owns, for the cold walk.
//!
//! Which cores: every shard runs its own reaper over the partitions it owns.

use std::rc::Rc;
use std::sync::Arc;

use narad_io::dma::DmaStorage;
use narad_shards::produce::{reaper, OwnedPartition, ReaperConfig, Retention};

use super::debug_env_u64;
use crate::broker::Shard;
use crate::config::Config;
use crate::control::MetaView;

/// The reference's internal `storage.retention_check_interval_ms`.
const RETENTION_CHECK_INTERVAL_MS: u64 = 60_000;

/// How each shard's reaper runs, and the debug retention override (see the
/// module docs). Plain values, copied to every shard.
#[derive(Clone, Debug)]
pub(super) struct RetentionSettings {
    pub(super) reaper: ReaperConfig,
    /// Always `None` in release builds.
    retention_override: Option<std::time::Duration>,
}

impl RetentionSettings {
    pub(super) fn load(config: &Config) -> Result<RetentionSettings, String> {
        let ms = std::time::Duration::from_millis;
        let check_interval_ms = debug_env_u64("NARAD_DEBUG_RETENTION_CHECK_INTERVAL_MS")?
            .unwrap_or(RETENTION_CHECK_INTERVAL_MS);
        let retention_override = debug_env_u64("NARAD_DEBUG_RETENTION_MS_OVERRIDE")?;
        if check_interval_ms == 0 || retention_override == Some(0) {
            return Err(
                "NARAD_DEBUG_RETENTION_CHECK_INTERVAL_MS and NARAD_DEBUG_RETENTION_MS_OVERRIDE must be positive"
                    .to_string(),
            );
        }
        if check_interval_ms != RETENTION_CHECK_INTERVAL_MS || retention_override.is_some() {
            tracing::warn!(
                check_interval_ms,
                retention_override_ms = retention_override,
                "debug hook: retention runs on test settings"
            );
        }
        Ok(RetentionSettings {
            reaper: ReaperConfig {
                check_interval: ms(check_interval_ms),
                cold_walk_interval: ms(config.storage.cold_retention_walk_ms),
                idle_eviction: ms(config.storage.idle_log_eviction_ms),
            },
            retention_override: retention_override.map(ms),
        })
    }

    /// Each topic's current retention, read from the shard's metadata snapshot at
    /// every call, so an alter applies at the reaper's next run.
    pub(super) fn retention_of(&self, meta: Rc<MetaView>) -> narad_shards::produce::RetentionOf {
        let retention_override = self.retention_override;
        Box::new(move |topic: &str, id| {
            crate::lifecycle::debug_panic_on_retention(topic);
            let snapshot = meta.snapshot();
            let record = snapshot.topics.get(topic).filter(|t| t.id == id)?;
            Some(
                match (Retention::from_ms(record.retention_ms), retention_override) {
                    (Retention::Age(_), Some(age)) => Retention::Age(age),
                    (retention, _) => retention,
                },
            )
        })
    }
}

/// How long a reaper that panicked waits before it starts again.
const REAPER_RESTART_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs the shard's reaper, and starts it again after a panic (counted in
/// `narad_reaper_restarts`), as the reference does: housekeeping that failed on
/// one partition must not stop the node, nor retention on every other one.
pub(super) async fn supervise_reaper(
    owner: Rc<narad_shards::produce::Owner<DmaStorage>>,
    config: ReaperConfig,
    shard: Rc<Shard>,
) {
    let index = shard.index;
    restart_after_panics(
        || reaper::run(owner.clone(), config.clone(), owned_partitions(&shard)),
        || owner.is_closing(),
        REAPER_RESTART_AFTER,
        || {
            ::metrics::counter!("narad_reaper_restarts").increment(1);
            tracing::error!(
                shard = index,
                "the retention reaper panicked; it starts again in a second"
            );
        },
    )
    .await
}

/// Runs what `start` makes until it returns, or panics while `closing` says
/// so; after any other panic calls `restarted` and, `after` later, starts it
/// again.
async fn restart_after_panics<F: std::future::Future<Output = ()>>(
    mut start: impl FnMut() -> F,
    closing: impl Fn() -> bool,
    after: std::time::Duration,
    mut restarted: impl FnMut(),
) {
    loop {
        let outcome =
            futures_lite::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(start())).await;
        if outcome.is_ok() || closing() {
            return;
        }
        restarted();
        narad_io::rt::sleep(after).await;
    }
}

/// The partitions of live topics the shard owns now, for the reaper's cold walk.
fn owned_partitions(shard: &Rc<Shard>) -> narad_shards::produce::OwnedPartitions {
    let shard = Rc::downgrade(shard);
    Box::new(move || {
        let Some(shard) = shard.upgrade() else {
            return Vec::new();
        };
        let snapshot = shard.meta.snapshot();
        let mut owned = Vec::new();
        for (name, record) in snapshot.topics.iter() {
            let topic: Arc<str> = name.clone();
            for p in 0..record.partitions {
                let partition = narad_shards::ids::PartitionId(p);
                if shard.owner_of(record.id, partition) == shard.index {
                    owned.push(OwnedPartition {
                        topic: topic.clone(),
                        incarnation: record.id,
                        partition,
                    });
                }
            }
        }
        owned
    })
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;
    use std::time::Duration;

    use super::restart_after_panics;

    /// Runs `restart_after_panics` over a run that panics `panics` times and
    /// then returns; `closing_after` makes `closing` true from that start on.
    /// Returns (starts, restarts).
    fn supervise(panics: u32, closing_after: Option<u32>) -> (u32, u32) {
        let (starts, restarts) = (Rc::new(Cell::new(0)), Rc::new(Cell::new(0)));
        let (s, r) = (starts.clone(), restarts.clone());
        narad_io::rt::run_local(None, async move {
            let started = s.clone();
            restart_after_panics(
                move || {
                    started.set(started.get() + 1);
                    let n = started.get();
                    async move {
                        if n <= panics {
                            panic!("run {n} panics, as the test asks");
                        }
                    }
                },
                move || closing_after.is_some_and(|from| s.get() >= from),
                Duration::from_millis(1),
                move || r.set(r.get() + 1),
            )
            .await
        });
        (starts.get(), restarts.get())
    }

    #[test]
    fn a_panicked_run_starts_again_and_each_restart_is_counted() {
        assert_eq!(supervise(0, None), (1, 0));
        assert_eq!(supervise(2, None), (3, 2));
    }

    #[test]
    fn a_run_that_panics_while_closing_is_not_started_again() {
        assert_eq!(supervise(5, Some(2)), (2, 1));
    }
}
