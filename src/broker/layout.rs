//! The data directory as startup finds it: ingress WALs of shards that no longer
//! exist, and topic data no live topic owns.
//!
//! Layout: `ingress/shard-<i>/` (one WAL per shard), `metastore/` (the metadata
//! store), `topics/<name>/<incarnation id>/p<NNNNN>/` (one log per partition). An
//! incarnation directory is bound to its topic's id, so a topic deleted and created
//! again under the same name never opens the old data.
//!
//! Which thread: the main thread, before the shards start; plain blocking file
//! operations on a handful of directories.

use std::path::Path;

use crate::control::{MetaView, Published};

/// Indexes of `ingress/shard-<i>` directories with `i >= shards`: WALs of shards
/// that no longer exist, which must be drained like any other.
pub fn leftover_wals(data_dir: &Path, shards: usize) -> Vec<usize> {
    let Ok(entries) = std::fs::read_dir(data_dir.join("ingress")) else {
        return Vec::new();
    };
    let mut found: Vec<usize> = entries
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("shard-")?
                .parse::<usize>()
                .ok()
        })
        .filter(|&i| i >= shards)
        .collect();
    found.sort_unstable();
    if !found.is_empty() {
        tracing::info!(
            ?found,
            shards,
            "ingress WALs of shards that no longer exist will be drained"
        );
    }
    found
}

/// Moves aside topic data that no live topic owns. Interrupted removals of deleted
/// topics (`<id>.deleted`) are finished. Any other incarnation directory the
/// metadata does not know is moved to `quarantine/` rather than removed: a lost or
/// replaced metadata store must never cost the data itself.
pub fn remove_orphans(data_dir: &Path, published: &std::sync::Arc<Published>) {
    let snapshot = MetaView::new(published.clone()).snapshot();
    let Ok(topics) = std::fs::read_dir(data_dir.join("topics")) else {
        return;
    };
    for topic in topics.flatten() {
        let name = topic.file_name().to_string_lossy().into_owned();
        let live = snapshot.topics.get(&name).map(|t| t.id.to_string());
        let Ok(incarnations) = std::fs::read_dir(topic.path()) else {
            continue;
        };
        for incarnation in incarnations.flatten() {
            let id = incarnation.file_name().to_string_lossy().into_owned();
            let path = incarnation.path();
            if live.as_deref() == Some(id.as_str()) {
                continue;
            }
            if id.ends_with(".deleted") {
                if let Err(e) = std::fs::remove_dir_all(&path) {
                    tracing::error!(dir = %path.display(), error = %e, "cannot remove a deleted topic's data");
                }
                continue;
            }
            let quarantine = data_dir.join("quarantine");
            let target = quarantine.join(format!("{name}.{id}"));
            let moved =
                std::fs::create_dir_all(&quarantine).and_then(|()| std::fs::rename(&path, &target));
            match moved {
                Ok(()) => {
                    tracing::warn!(from = %path.display(), to = %target.display(), "topic data no live topic owns was moved to quarantine")
                }
                Err(e) => {
                    tracing::error!(dir = %path.display(), error = %e, "cannot quarantine topic data no live topic owns")
                }
            }
        }
        let _ = std::fs::remove_dir(topic.path());
    }
}
