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
    loop {
        let run = reaper::run(owner.clone(), config.clone(), owned_partitions(&shard));
        let outcome =
            futures_lite::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(run)).await;
        if outcome.is_ok() || owner.is_closing() {
            return;
        }
        ::metrics::counter!("narad_reaper_restarts").increment(1);
        tracing::error!(
            shard = shard.index,
            "the retention reaper panicked; it starts again in a second"
        );
        narad_io::rt::sleep(REAPER_RESTART_AFTER).await;
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
        for (name, record) in &snapshot.topics {
            let topic: Arc<str> = Arc::from(name.as_str());
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
