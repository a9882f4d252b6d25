//! The data directory as startup finds it: ingress WALs of shards that no longer
//! exist, and topic data no live topic owns.
//!
//! Layout: `ingress/shard-<i>/` (one WAL per shard), `metastore/` (the metadata
//! store), `topics/<name>/<incarnation id>/p<NNNNN>/` (one log per partition). An
//! incarnation directory is bound to its topic's id, so a topic deleted and created
//! again under the same name never opens the old data.
//!
//! Deleting a topic's data, crash-safe: before the delete is proposed, a
//! [`DELETING_MARKER`] file is made durable in the incarnation directory. Once the
//! delete is applied, the directory is renamed to `<id>.deleted` (the parent synced)
//! and removed by one background thread. A start finds any step interrupted:
//! a `.deleted` directory is removed, and so is a marked one no live topic owns,
//! after it is set aside the same way (so that a stop halfway through never leaves
//! unmarked data to be taken for unknown); a marked
//! one whose topic is live (the delete was never applied) loses its marker. Only
//! data no live topic owns *and* nobody marked goes to `quarantine/`.
//!
//! Which thread: [`remove_orphans`] runs on the main thread before the shards
//! start; the marker and the rename run on the shard that answers the delete
//! (plain blocking calls on one directory, as rare as deletes); removals run on
//! the `remove-topic` thread.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock};

use narad_shards::ids::IncarnationId;

use crate::control::{MetaView, Published};

/// The file whose presence in an incarnation directory says that a delete of its
/// topic was proposed.
pub const DELETING_MARKER: &str = "DELETING";

/// Creates the data directory `dir` and whatever of its ancestors is missing,
/// and makes each new entry durable in its parent: a crash soon after the first
/// acknowledged produce must not take the whole directory with it.
pub fn create_data_dir(dir: &Path) -> std::io::Result<()> {
    let mut missing = Vec::new();
    let mut at = dir;
    while !at.try_exists()? {
        missing.push(at);
        match at.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => at = parent,
            _ => break,
        }
    }
    std::fs::create_dir_all(dir)?;
    for created in missing {
        match created.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent)?,
            _ => sync_dir(Path::new("."))?,
        }
    }
    Ok(())
}

/// Checks that the process may create files in the data directory and in its
/// `topics` directory (made here if missing), by creating and removing a file
/// in each. A topic's files are made at its first commit, long after the
/// start: a directory the process may only read (a `chown` forgotten after a
/// copy) would otherwise let a node start, answer ready, accept produces into
/// its WAL and commit none of them, saying so only in its log.
pub fn check_writable(data_dir: &Path) -> Result<(), String> {
    let topics = data_dir.join("topics");
    for dir in [data_dir, topics.as_path()] {
        let probe = dir.join(".write-check");
        let written = std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&probe, b""))
            .and_then(|()| std::fs::remove_file(&probe));
        if let Err(e) = written {
            // A read-only mount (ext4 remounts so after errors) or a failing
            // disk is no matter of the user's rights.
            let remedy = if e.kind() == std::io::ErrorKind::ReadOnlyFilesystem {
                "its file system is mounted read-only (after disk errors: check it and mount it again)"
            } else if e.raw_os_error() == Some(libc::EIO) {
                "the disk failed the write: check the disk and the file system it is on"
            } else {
                "give the user it runs as write access to the data directory and everything in it"
            };
            return Err(format!(
                "cannot create files in {} ({e}): narad keeps its topics and their consumer state there; {remedy}",
                dir.display()
            ));
        }
    }
    Ok(())
}

/// Takes away the directory of leftover WAL `index`, fully drained: renamed
/// first (durably), so that a start never finds half of it under its WAL name,
/// then removed in the background.
pub fn retire_drained_wal(data_dir: &Path, index: usize) {
    let ingress = data_dir.join("ingress");
    let from = ingress.join(format!("shard-{index}"));
    let to = ingress.join(format!("{DRAINED_PREFIX}shard-{index}"));
    let renamed = std::fs::rename(&from, &to).and_then(|()| sync_dir(&ingress));
    match renamed {
        Ok(()) => {
            tracing::info!(dir = %from.display(), "drained leftover ingress WAL removed");
            remove_in_background(to);
        }
        Err(e) => {
            tracing::warn!(dir = %from.display(), error = %e, "cannot retire a drained ingress WAL; it is drained again at the next start");
        }
    }
}

/// Makes durable, before a delete of `topic` is proposed, the marker that lets
/// a start finish the removal of its data if the node stops before it is set aside.
pub fn mark_deleting(data_dir: &Path, topic: &str, id: IncarnationId) -> std::io::Result<()> {
    let root = data_dir.join(super::incarnation_dir(topic, id));
    let created = !root.exists();
    std::fs::create_dir_all(&root)?;
    let marker = root.join(DELETING_MARKER);
    std::fs::File::create(&marker)?.sync_all()?;
    sync_dir(&root)?;
    if created {
        // The new directory's entry, and the topic's if that was new too.
        let parent = root
            .parent()
            .expect("an incarnation directory has a parent");
        sync_dir(parent)?;
        sync_dir(parent.parent().expect("a topic directory has a parent"))?;
    }
    Ok(())
}

/// Takes the marker away again: the delete was not applied.
pub fn unmark_deleting(data_dir: &Path, topic: &str, id: IncarnationId) {
    let marker = data_dir
        .join(super::incarnation_dir(topic, id))
        .join(DELETING_MARKER);
    if let Err(e) = std::fs::remove_file(&marker) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(file = %marker.display(), error = %e, "cannot remove a delete marker; the next start removes it");
        }
    }
}

/// After a delete that lost to another delete of the same incarnation:
/// removes the incarnation's directory if it holds nothing but the marker.
/// The winner set the data aside before this delete marked it again, and
/// that marker, left alone, would keep an empty directory (counted as an
/// orphan) until the next start. A directory with data in it is the winner's,
/// still to be set aside: its marker stays.
pub fn drop_bare_marker(data_dir: &Path, topic: &str, id: IncarnationId) {
    let root = data_dir.join(super::incarnation_dir(topic, id));
    let only_marker = std::fs::read_dir(&root).is_ok_and(|entries| {
        let names: Vec<_> = entries
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        names == [DELETING_MARKER]
    });
    if only_marker {
        let _ = std::fs::remove_file(root.join(DELETING_MARKER));
        if std::fs::remove_dir(&root).is_ok() {
            if let Some(parent) = root.parent() {
                let _ = sync_dir(parent);
            }
        }
    }
}

/// Renames a deleted incarnation's directory out of the way (durably), then
/// hands it to the background remover: it may hold gigabytes.
pub fn set_aside(data_dir: &Path, topic: &str, id: IncarnationId) -> std::io::Result<()> {
    let root = data_dir.join(super::incarnation_dir(topic, id));
    if !root.exists() {
        return Ok(());
    }
    remove_in_background(set_aside_marked(&root)?);
    Ok(())
}

/// Renames the marked incarnation directory `dir` to `<id>.deleted` (the parent
/// synced) and answers the new path. Removing files one by one takes the marker
/// with them in whatever order the directory lists them; a stop halfway through
/// would otherwise leave unmarked data that the next start takes for unknown
/// and quarantines instead of removing.
fn set_aside_marked(dir: &Path) -> std::io::Result<PathBuf> {
    let aside = dir.with_extension("deleted");
    if aside.exists() {
        // Set aside by an earlier delete and not yet removed; this directory
        // is a later, losing delete's marker (see [`drop_bare_marker`]).
        std::fs::remove_dir_all(&aside)?;
    }
    std::fs::rename(dir, &aside)?;
    sync_dir(dir.parent().expect("an incarnation directory has a parent"))?;
    Ok(aside)
}

/// Queues `dir` (a deleted topic's data, a drained WAL) for the one
/// `remove-topic` thread, started on first use. If the
/// thread cannot start, the directory stays for the next start to remove.
fn remove_in_background(dir: PathBuf) {
    static REMOVER: OnceLock<Option<Mutex<Sender<PathBuf>>>> = OnceLock::new();
    let remover = REMOVER.get_or_init(|| {
        let (send, receive) = channel::<PathBuf>();
        let started = std::thread::Builder::new()
            .name("remove-topic".into())
            .spawn(move || {
                for dir in receive {
                    if let Err(e) = std::fs::remove_dir_all(&dir) {
                        tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a directory set aside for removal; the next start tries again");
                        continue;
                    }
                    // A deleted topic's `topics/<name>/`, if no other
                    // incarnation is in it (a recreate's makes it stay).
                    if dir.extension().is_some_and(|e| e == "deleted") {
                        if let Some(topic) = dir.parent() {
                            let _ = std::fs::remove_dir(topic);
                        }
                    }
                }
            });
        match started {
            Ok(_) => Some(Mutex::new(send)),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the thread that removes deleted topics' data; the next start removes it");
                None
            }
        }
    });
    if let Some(send) = remover {
        let _ = send.lock().expect("the remover's sender").send(dir);
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// What a drained leftover WAL's directory is renamed to before its removal.
const DRAINED_PREFIX: &str = "drained-";

/// Indexes of `ingress/shard-<i>` directories with `i >= shards`: WALs of shards
/// that no longer exist, which must be drained like any other. Removes the
/// directories of drained WALs whose removal a stop interrupted.
pub fn leftover_wals(data_dir: &Path, shards: usize) -> Vec<usize> {
    let Ok(entries) = std::fs::read_dir(data_dir.join("ingress")) else {
        return Vec::new();
    };
    let entries: Vec<std::fs::DirEntry> = entries.flatten().collect();
    for entry in &entries {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(DRAINED_PREFIX)
        {
            if let Err(e) = std::fs::remove_dir_all(entry.path()) {
                tracing::warn!(dir = %entry.path().display(), error = %e, "cannot remove a drained ingress WAL");
            }
        }
    }
    let mut found: Vec<usize> = entries
        .iter()
        .filter_map(|e| shard_dir_index(e.file_name().to_str()?))
        .filter(|&i| i >= shards)
        .collect();
    found.sort_unstable();
    found.dedup();
    if !found.is_empty() {
        tracing::info!(
            ?found,
            shards,
            "ingress WALs of shards that no longer exist will be drained"
        );
    }
    found
}

/// The index `i` of a directory named exactly `shard-<i>` (as the WAL of shard
/// `i` is named: no sign, no leading zero), so that the directory drained is
/// the one found. Anything else in `ingress/` is not a WAL of this broker's.
fn shard_dir_index(name: &str) -> Option<usize> {
    let index: usize = name.strip_prefix("shard-")?.parse().ok()?;
    (name == format!("shard-{index}")).then_some(index)
}

/// Moves aside topic data that no live topic owns. Interrupted removals of deleted
/// topics (`<id>.deleted`, or a directory holding a [`DELETING_MARKER`]) are
/// finished. Any other incarnation directory the metadata does not know is moved
/// to `quarantine/` rather than removed: a lost or replaced metadata store must
/// never cost the data itself. A directory whose name is a live incarnation id is
/// kept under whatever topic directory holds it (a file system that folds case
/// may have put a recreated topic's data under its predecessor's spelling).
pub fn remove_orphans(data_dir: &Path, published: &std::sync::Arc<Published>) {
    remove_orphans_with(data_dir, published, &|dir| std::fs::remove_dir_all(dir));
}

/// [`remove_orphans`] with the removal of a whole directory given, so that a
/// test can stop one halfway.
fn remove_orphans_with(
    data_dir: &Path,
    published: &std::sync::Arc<Published>,
    remove_all: &dyn Fn(&Path) -> std::io::Result<()>,
) {
    let snapshot = MetaView::new(published.clone()).snapshot();
    let live: HashSet<String> = snapshot.topics.values().map(|t| t.id.to_string()).collect();
    let Ok(topics) = std::fs::read_dir(data_dir.join("topics")) else {
        return;
    };
    for topic in topics.flatten() {
        let name = topic.file_name().to_string_lossy().into_owned();
        let Ok(incarnations) = std::fs::read_dir(topic.path()) else {
            continue;
        };
        for incarnation in incarnations.flatten() {
            let id = incarnation.file_name().to_string_lossy().into_owned();
            let path = incarnation.path();
            let marked = path.join(DELETING_MARKER).exists();
            if live.contains(&id) {
                if marked {
                    tracing::info!(dir = %path.display(), "a delete of this topic was proposed and not applied; its marker is removed");
                    let _ = std::fs::remove_file(path.join(DELETING_MARKER));
                }
                continue;
            }
            if id.ends_with(".deleted") || marked {
                let removed = if id.ends_with(".deleted") {
                    remove_all(&path)
                } else {
                    tracing::info!(dir = %path.display(), "finishing the removal of a deleted topic's data");
                    set_aside_marked(&path).and_then(|aside| remove_all(&aside))
                };
                if let Err(e) = removed {
                    tracing::error!(dir = %path.display(), error = %e, "cannot remove a deleted topic's data");
                }
                continue;
            }
            let quarantine = data_dir.join("quarantine");
            let target = quarantine_target(&quarantine, &name, &id);
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

/// Where unowned data of topic `name`, incarnation `id`, goes in `quarantine`:
/// `<name>.<id>`, or `<name>.<id>.<n>` for the first `n` free when the same
/// directory was quarantined before (quarantine is never emptied by the node).
fn quarantine_target(quarantine: &Path, name: &str, id: &str) -> PathBuf {
    let first = quarantine.join(format!("{name}.{id}"));
    if !first.exists() {
        return first;
    }
    (1u64..)
        .map(|n| quarantine.join(format!("{name}.{id}.{n}")))
        .find(|target| !target.exists())
        .expect("a free name")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::meta::{Command, MetaState};

    fn live(topics: &[(&str, u128)]) -> Arc<Published> {
        let mut state = MetaState::default();
        for &(name, id) in topics {
            let record = crate::meta::sample_record(name, id);
            state.apply(&Command::CreateTopic(record)).unwrap();
        }
        Arc::new(Published::new(state))
    }

    /// An incarnation directory holding one partition with one file.
    fn incarnation(data: &Path, topic: &str, id: &str, marked: bool) -> PathBuf {
        let dir = data.join("topics").join(topic).join(id);
        std::fs::create_dir_all(dir.join("p00000")).unwrap();
        std::fs::write(dir.join("p00000").join("segment"), b"records").unwrap();
        if marked {
            std::fs::write(dir.join(DELETING_MARKER), b"").unwrap();
        }
        dir
    }

    #[test]
    fn a_start_finishes_deletes_clears_stale_markers_and_quarantines_only_the_unknown() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path();
        let id = |n: u128| IncarnationId(n).to_string();
        // Live, with the marker of a delete that was never applied.
        let kept = incarnation(data, "kept", &id(1), true);
        // Live, under a spelling a case-folding file system may have kept.
        let folded = incarnation(data, "Folded", &id(2), false);
        // Deleted: marked, or already set aside.
        let marked = incarnation(data, "gone", &id(3), true);
        let aside = incarnation(data, "gone", &format!("{}.deleted", id(4)), false);
        // Nobody knows it: quarantined, never removed.
        let unknown = incarnation(data, "unknown", &id(5), false);

        remove_orphans(data, &live(&[("kept", 1), ("folded", 2)]));

        assert!(kept.join("p00000").join("segment").exists());
        assert!(!kept.join(DELETING_MARKER).exists());
        assert!(folded.join("p00000").join("segment").exists());
        assert!(!marked.exists() && !aside.exists());
        assert!(!data.join("topics").join("gone").exists());
        assert!(!unknown.exists());
        let quarantined = data
            .join("quarantine")
            .join(format!("unknown.{}", id(5)))
            .join("p00000")
            .join("segment");
        assert!(quarantined.exists());

        // The same unknown directory again at a later start: quarantined
        // beside the first, not left in place.
        let again = incarnation(data, "unknown", &id(5), false);
        remove_orphans(data, &live(&[("kept", 1), ("folded", 2)]));
        assert!(!again.exists());
        assert!(quarantined.exists());
        let second = data
            .join("quarantine")
            .join(format!("unknown.{}.1", id(5)))
            .join("p00000")
            .join("segment");
        assert!(second.exists());
    }

    /// The background removal of a deleted topic's data takes its
    /// `topics/<name>/` with it, unless a newer incarnation lives there.
    #[test]
    fn removing_a_set_aside_topic_takes_its_empty_name_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path();
        let gone = incarnation(data, "gone", &IncarnationId(3).to_string(), true);
        let again = incarnation(data, "again", &IncarnationId(4).to_string(), true);
        let recreated = incarnation(data, "again", &IncarnationId(5).to_string(), false);
        set_aside(data, "gone", IncarnationId(3)).unwrap();
        set_aside(data, "again", IncarnationId(4)).unwrap();
        let removed = |dir: PathBuf| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while dir.exists() {
                assert!(std::time::Instant::now() < deadline, "{dir:?} stays");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        };
        removed(data.join("topics").join("gone"));
        assert!(!gone.exists());
        removed(again.with_extension("deleted"));
        assert!(recreated.join("p00000").join("segment").exists());
    }

    #[test]
    fn a_start_stopped_halfway_through_removing_a_marked_topic_removes_it_at_the_next() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path();
        let marked = incarnation(data, "gone", &IncarnationId(3).to_string(), true);
        // Set aside by one delete, marked again by a second that lost.
        let earlier = incarnation(
            data,
            "gone",
            &format!("{}.deleted", IncarnationId(4)),
            false,
        );
        let remarked = incarnation(data, "gone", &IncarnationId(4).to_string(), true);
        let stopped_halfway = |dir: &Path| {
            if !dir.join(DELETING_MARKER).exists() {
                return std::fs::remove_dir_all(dir);
            }
            // The marker goes first, then the stop.
            std::fs::remove_file(dir.join(DELETING_MARKER))?;
            Err(std::io::Error::other("stopped"))
        };
        remove_orphans_with(data, &live(&[]), &stopped_halfway);
        remove_orphans(data, &live(&[]));

        assert!(!marked.exists() && !earlier.exists() && !remarked.exists());
        assert!(!data.join("topics").join("gone").exists());
        assert!(
            !data.join("quarantine").exists(),
            "a deleted topic's data was quarantined"
        );
    }

    #[test]
    fn a_data_directory_is_created_with_its_missing_ancestors_and_found_again() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a").join("b").join("data");
        create_data_dir(&dir).unwrap();
        assert!(dir.is_dir());
        create_data_dir(&dir).unwrap();
        std::fs::write(tmp.path().join("file"), b"").unwrap();
        assert!(create_data_dir(&tmp.path().join("file").join("data")).is_err());
    }

    #[test]
    fn leftover_wals_are_the_shard_directories_past_the_shard_count() {
        let tmp = tempfile::tempdir().unwrap();
        let ingress = tmp.path().join("ingress");
        for name in [
            "shard-0",
            "shard-1",
            "shard-3",
            "shard-05",
            "shard-+6",
            "drained-shard-7",
        ] {
            std::fs::create_dir_all(ingress.join(name)).unwrap();
        }
        assert_eq!(leftover_wals(tmp.path(), 1), [1, 3]);
        assert_eq!(leftover_wals(tmp.path(), 4), Vec::<usize>::new());
        assert!(!ingress.join("drained-shard-7").exists());
    }

    #[test]
    fn a_marked_topic_set_aside_is_removed_in_the_background() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path();
        let id = IncarnationId(7);
        // A topic with no data yet gets a directory for its marker.
        mark_deleting(data, "empty", id).unwrap();
        let root = data.join(super::super::incarnation_dir("empty", id));
        assert!(root.join(DELETING_MARKER).exists());
        unmark_deleting(data, "empty", id);
        assert!(!root.join(DELETING_MARKER).exists());

        let root = incarnation(data, "doomed", &id.to_string(), false);
        mark_deleting(data, "doomed", id).unwrap();
        // A delete that lost the race leaves the winner's marked data alone ...
        drop_bare_marker(data, "doomed", id);
        assert!(root.join(DELETING_MARKER).exists());
        set_aside(data, "doomed", id).unwrap();
        // ... and takes away the directory its own marker made again.
        mark_deleting(data, "doomed", id).unwrap();
        drop_bare_marker(data, "doomed", id);
        assert!(!root.exists());
        assert!(!root.exists());
        let aside = root.with_extension("deleted");
        for _ in 0..1000 {
            if !aside.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("{} was not removed", aside.display());
    }
}
