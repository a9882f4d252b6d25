//! [`MetaStore`]: the durable local home of the metadata state, a command log with
//! periodic snapshots in one directory (`<data>/metastore/`).
//!
//! Files:
//! - `commands.log`: the commands applied since the snapshot, one framed entry
//!   each (see `frame`), each synced before its command is applied.
//! - `snapshot`: the whole state as of some index; absent until the first.
//! - `snapshot.prev`, `commands.log.prev`: the snapshot before the last one, and
//!   the log that led from it to the last one. Together they hold the same state
//!   as `snapshot`, so a snapshot lost to the medium (unreadable, damaged, or gone
//!   while the log still follows it) costs nothing: recovery falls back to them,
//!   says so at warning level, and writes `snapshot` again.
//! - `snapshot.tmp`, `commands.log.tmp`, `commands.log.prev.tmp`: a snapshot
//!   being taken; removed at open.
//!
//! Recovery loads the snapshot, then replays the log's entries above its version.
//! Only the log's last entry can be torn by a crash, since every append is synced
//! before the next begins; so a damaged entry with nothing valid after it is cut
//! off, and a damaged entry followed by a valid one is corruption the store refuses
//! to open over, naming the file and byte offset, rather than silently lose the
//! commands behind it.
//!
//! I/O is plain blocking `std::fs`. The store lives on the control-plane thread
//! and is written only when topics are created, altered or deleted; blocking that
//! thread for an fsync is cheaper to reason about than an asynchronous design.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::frame::{
    decode_entry, decode_snapshot, encode_entry, encode_snapshot, next_valid_entry,
    snapshot_format_is_newer, EntryRead,
};
use super::state::{Applied, Command, MetaError, MetaState};

/// How many log entries make the store take a snapshot and start a new log.
pub const SNAPSHOT_EVERY_ENTRIES: u64 = 1024;

const LOG_FILE: &str = "commands.log";
const LOG_TMP_FILE: &str = "commands.log.tmp";
const SNAPSHOT_FILE: &str = "snapshot";
const SNAPSHOT_TMP_FILE: &str = "snapshot.tmp";
const SNAPSHOT_PREV_FILE: &str = "snapshot.prev";
const LOG_PREV_FILE: &str = "commands.log.prev";
const LOG_PREV_TMP_FILE: &str = "commands.log.prev.tmp";

/// The command log and snapshots of one node's metadata. Single owner: the
/// control-plane thread.
#[derive(Debug)]
pub struct MetaStore {
    dir: PathBuf,
    /// `commands.log`, opened for appending.
    log: File,
    /// The index of the last command made durable (in the log or the snapshot).
    last_index: u64,
    /// Entries in `commands.log`, stale ones included: the snapshot trigger.
    log_entries: u64,
    snapshot_every_entries: u64,
    /// Why the store refuses writes, after a failed write or sync. Like a WAL's:
    /// after a failed fsync the kernel may have dropped the unwritten pages and
    /// cleared the error, so the file's contents are unknown until it is read
    /// again, which reopening does.
    latched: Option<String>,
}

impl MetaStore {
    /// Opens (or creates) the store in `dir` and recovers the state it holds.
    pub fn open(dir: &Path) -> Result<(MetaStore, MetaState), MetaError> {
        create_dir(dir)?;
        for stale in [SNAPSHOT_TMP_FILE, LOG_TMP_FILE, LOG_PREV_TMP_FILE] {
            let path = dir.join(stale);
            match fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(io_error(&path, "cannot remove", e))
                }
                _ => {}
            }
        }
        let mut state = recover_snapshot(dir)?;
        let log_path = dir.join(LOG_FILE);
        let log_entries = replay_log(&log_path, &mut state, Tail::MayBeTorn)?;
        let log = open_append(&log_path).map_err(|e| io_error(&log_path, "cannot open", e))?;
        sync_dir(dir).map_err(|e| io_error(dir, "cannot sync", e))?;
        let mut store = MetaStore {
            dir: dir.to_path_buf(),
            log,
            last_index: state.version,
            log_entries,
            snapshot_every_entries: SNAPSHOT_EVERY_ENTRIES,
            latched: None,
        };
        if log_entries > 0 {
            store.settle_replayed(&state)?;
        }
        Ok((store, state))
    }

    /// What the log replayed may be in the page cache only: after a failed
    /// fsync (the store latched, the node was restarted) the kernel keeps the
    /// pages it could not write, marked clean, so no later sync writes them,
    /// and a power loss would leave a hole in the middle of the log, which
    /// recovery refuses. Writing the state afresh as a snapshot, with a new
    /// log, settles it on the disk.
    ///
    /// On a full disk there is no room for the snapshot, and a node must be
    /// able to start there (to serve its data, and to be given room): then the
    /// log's own bytes are written again over themselves, which takes no new
    /// space, and synced. The snapshot's first step is tried alone so that a
    /// full disk is found before any file was renamed.
    fn settle_replayed(&mut self, state: &MetaState) -> Result<(), MetaError> {
        let tmp = self.dir.join(SNAPSHOT_TMP_FILE);
        match write_synced_or_full(&tmp, &encode_snapshot(state))? {
            Ok(()) => self.snapshot(state),
            Err(Full) => {
                let _ = fs::remove_file(&tmp);
                let log_path = self.dir.join(LOG_FILE);
                rewrite_in_place(&log_path)
                    .map_err(|e| io_error(&log_path, "cannot write again", e))?;
                tracing::warn!(
                    dir = %self.dir.display(),
                    "no space for a metadata snapshot at open: the command log was written again in place instead"
                );
                Ok(())
            }
        }
    }

    /// The index of the last durable command.
    pub fn last_index(&self) -> u64 {
        self.last_index
    }

    /// Makes `cmd` durable as entry `index`, which must follow the last one. The
    /// caller applies `cmd` to its state only after this returns `Ok`. After an
    /// `Err` the outcome is unknown, as for any failed write: the entry may have
    /// reached the disk, and then the command is applied when the store reopens.
    pub fn append(&mut self, cmd: &Command, index: u64) -> Result<(), MetaError> {
        self.check_not_latched()?;
        assert_eq!(index, self.last_index + 1, "metadata log indexes are dense");
        let frame = encode_entry(cmd, index);
        let written = self.log.write_all(&frame).and_then(|()| {
            if debug_sync_fails(cmd) {
                return Err(io::Error::other(
                    "NARAD_DEBUG_META_SYNC_FAIL: an injected fdatasync failure",
                ));
            }
            self.log.sync_data()
        });
        if let Err(e) = written {
            let path = self.dir.join(LOG_FILE);
            return Err(self.latch(io_error(&path, "cannot append to", e)));
        }
        self.last_index = index;
        self.log_entries += 1;
        Ok(())
    }

    /// Checks `cmd` against `state`, makes it durable, applies it, and takes a
    /// snapshot when one is due. A command `state` refuses is never logged.
    ///
    /// A failed snapshot does not fail the command, which is already durable and
    /// applied: it latches the store, so the next write fails and a restart
    /// recovers from the log.
    pub fn propose(&mut self, state: &mut MetaState, cmd: Command) -> Result<Applied, MetaError> {
        let applied = state.check(&cmd)?;
        self.append(&cmd, state.version + 1)?;
        state.install(&applied);
        assert_eq!(state.version, self.last_index);
        if let Err(e) = self.maybe_snapshot(state) {
            tracing::error!(error = %e, "metadata snapshot failed; the store refuses writes until restart");
        }
        Ok(applied)
    }

    /// Takes a snapshot of `state` once the log holds [`SNAPSHOT_EVERY_ENTRIES`]
    /// entries; says whether it did.
    pub fn maybe_snapshot(&mut self, state: &MetaState) -> Result<bool, MetaError> {
        if self.log_entries < self.snapshot_every_entries {
            return Ok(false);
        }
        self.snapshot(state)?;
        Ok(true)
    }

    /// Writes `state` (which must be the store's last index) as the snapshot and
    /// starts an empty log, keeping the old pair as the fallback. Each step leaves
    /// files that recover to `state`, from `snapshot` and from the fallback:
    ///
    /// 1. `snapshot.tmp` written and synced: not yet read by recovery.
    /// 2. the old `snapshot` renamed to `snapshot.prev` (renamed, not linked: one
    ///    file under both names would be one copy, not two): `snapshot` is
    ///    missing, so recovery takes the fallback, the old snapshot, the older
    ///    `commands.log.prev` (all at or below its version) and `commands.log`.
    /// 3. `snapshot.tmp` renamed over `snapshot`, directory synced: recovery loads
    ///    it and skips the old log's entries, which are all at or below its version.
    /// 4. `commands.log` linked as `commands.log.prev`, directory synced.
    /// 5. an empty `commands.log.tmp` synced and renamed over `commands.log`,
    ///    directory synced: the old entries are only in the fallback.
    pub fn snapshot(&mut self, state: &MetaState) -> Result<(), MetaError> {
        self.check_not_latched()?;
        assert_eq!(state.version, self.last_index, "snapshot of another state");
        if let Err(e) = self.replace_snapshot_and_log(state) {
            return Err(self.latch(e));
        }
        assert_eq!(self.log_entries, 0);
        Ok(())
    }

    fn replace_snapshot_and_log(&mut self, state: &MetaState) -> Result<(), MetaError> {
        let dir = &self.dir;
        let sync_dir = || sync_dir(dir).map_err(|e| io_error(dir, "cannot sync", e));
        let snapshot_tmp = dir.join(SNAPSHOT_TMP_FILE);
        let snapshot = dir.join(SNAPSHOT_FILE);
        let log_path = dir.join(LOG_FILE);
        write_synced(&snapshot_tmp, &encode_snapshot(state))?;
        if snapshot.exists() {
            rename(&snapshot, &dir.join(SNAPSHOT_PREV_FILE))?;
        }
        rename(&snapshot_tmp, &snapshot)?;
        sync_dir()?;
        keep_as(
            &log_path,
            &dir.join(LOG_PREV_TMP_FILE),
            &dir.join(LOG_PREV_FILE),
        )?;
        sync_dir()?;
        let log_tmp = dir.join(LOG_TMP_FILE);
        write_synced(&log_tmp, &[])?;
        rename(&log_tmp, &log_path)?;
        sync_dir()?;
        self.log = open_append(&log_path).map_err(|e| io_error(&log_path, "cannot open", e))?;
        self.log_entries = 0;
        Ok(())
    }

    /// Why the store refuses writes until the node restarts, once it does.
    pub fn latched(&self) -> Option<&str> {
        self.latched.as_deref()
    }

    fn check_not_latched(&self) -> Result<(), MetaError> {
        match &self.latched {
            None => Ok(()),
            Some(reason) => Err(MetaError::Io(format!(
                "metadata store refuses writes after an earlier failure ({reason}); restart the node"
            ))),
        }
    }

    fn latch(&mut self, error: MetaError) -> MetaError {
        if self.latched.is_none() {
            self.latched = Some(error.message().to_string());
        }
        error
    }

    /// Takes snapshots every `entries` log entries instead of
    /// [`SNAPSHOT_EVERY_ENTRIES`], so tests reach them quickly.
    #[cfg(test)]
    pub(super) fn set_snapshot_every(&mut self, entries: u64) {
        assert!(entries > 0);
        self.snapshot_every_entries = entries;
    }

    /// Swaps the log's handle for a read-only one, so the next append fails.
    #[cfg(test)]
    pub(super) fn break_log(&mut self) {
        self.log = File::open(self.dir.join(LOG_FILE)).expect("reopen the log read-only");
    }
}

/// The state the snapshot holds, from `snapshot` or else from the fallback pair;
/// the empty state when there has never been a snapshot.
///
/// The fallback is taken only when `snapshot` is unreadable, damaged, or missing
/// while `snapshot.prev` or `commands.log.prev` shows one was taken; never for a
/// snapshot of a format this version does not know, which a newer version wrote
/// and which an older fallback would silently roll back.
fn recover_snapshot(dir: &Path) -> Result<MetaState, MetaError> {
    let path = dir.join(SNAPSHOT_FILE);
    let snapshot_prev = dir.join(SNAPSHOT_PREV_FILE);
    let log_prev = dir.join(LOG_PREV_FILE);
    let taken_before = snapshot_prev.exists() || log_prev.exists();
    let why = match read_snapshot(&path) {
        Ok(Some(state)) => return Ok(state),
        Ok(None) if !taken_before => return Ok(MetaState::default()),
        Ok(None) => MetaError::Io(format!("metadata snapshot {} is missing", path.display())),
        Err(SnapshotError::Newer(e)) => return Err(e),
        Err(SnapshotError::Damaged(e)) if !taken_before => return Err(e),
        Err(SnapshotError::Damaged(e)) => e,
    };
    let fallback = || -> Result<MetaState, MetaError> {
        let mut state = match read_snapshot(&snapshot_prev) {
            Ok(state) => state.unwrap_or_default(),
            Err(SnapshotError::Newer(e) | SnapshotError::Damaged(e)) => return Err(e),
        };
        // Absent only when a store that kept no fallback log (an older
        // version's) stopped inside its first snapshot taken by this one.
        if log_prev.exists() {
            replay_log(&log_prev, &mut state, Tail::Synced)?;
        }
        Ok(state)
    };
    let state = fallback().map_err(|e| {
        MetaError::Io(format!(
            "{}; the previous snapshot cannot stand in for it: {}",
            why.message(),
            e.message()
        ))
    })?;
    tracing::warn!(
        error = why.message(),
        version = state.version,
        "metadata snapshot lost; recovered from the previous snapshot and its log, writing it again"
    );
    let snapshot_tmp = dir.join(SNAPSHOT_TMP_FILE);
    write_synced(&snapshot_tmp, &encode_snapshot(&state))?;
    rename(&snapshot_tmp, &path)?;
    sync_dir(dir).map_err(|e| io_error(dir, "cannot sync", e))?;
    Ok(state)
}

/// Why a snapshot file could not be loaded.
enum SnapshotError {
    /// Written by a newer version: refused, never worked around.
    Newer(MetaError),
    /// Unreadable or damaged.
    Damaged(MetaError),
}

/// The state in the snapshot file at `path`, if there is one.
fn read_snapshot(path: &Path) -> Result<Option<MetaState>, SnapshotError> {
    let file = match fs::read(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(SnapshotError::Damaged(io_error(path, "cannot read", e))),
    };
    decode_snapshot(&file).map(Some).map_err(|reason| {
        let error = MetaError::Io(format!(
            "damaged metadata snapshot {}: {reason}",
            path.display()
        ));
        if snapshot_format_is_newer(&file) {
            SnapshotError::Newer(error)
        } else {
            SnapshotError::Damaged(error)
        }
    })
}

/// The debug hook `NARAD_DEBUG_META_SYNC_FAIL=<topic>`, in debug builds only:
/// the sync of the entry that deletes `<topic>` fails after its bytes were
/// written, which leaves the delete's outcome unknown until the next start (the
/// bytes are in the page cache, so a restart replays it).
fn debug_sync_fails(cmd: &Command) -> bool {
    #[cfg(debug_assertions)]
    {
        static HOOK: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        let hook = HOOK.get_or_init(|| std::env::var("NARAD_DEBUG_META_SYNC_FAIL").ok());
        matches!((cmd, hook), (Command::DeleteTopic { name, .. }, Some(topic)) if name == topic)
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = cmd;
        false
    }
}

/// How a log may end.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tail {
    /// The live log: its last append may have been torn by a crash.
    MayBeTorn,
    /// The fallback log: kept only once every entry in it was synced, so damage
    /// at its end is corruption too, and cutting it off would drop an
    /// acknowledged command.
    Synced,
}

/// Applies the log's entries above `state.version` to `state`, cutting off a torn
/// tail if `tail` allows one; returns how many entries the log holds. Creates an
/// empty log if there is none.
fn replay_log(path: &Path, state: &mut MetaState, tail: Tail) -> Result<u64, MetaError> {
    let buf = match fs::read(path) {
        Ok(buf) => buf,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            write_synced(path, &[])?;
            return Ok(0);
        }
        Err(e) => return Err(io_error(path, "cannot read", e)),
    };
    let mut at = 0;
    let mut entries = 0u64;
    let mut previous_index: Option<u64> = None;
    while at < buf.len() {
        let (index, body, len) = match decode_entry(&buf[at..]) {
            EntryRead::Entry { index, body, len } => (index, body, len),
            EntryRead::UnknownFormat(format) => {
                let what = format!("unknown entry format {format} (written by a newer version?)");
                return Err(damaged(path, at, &what));
            }
            EntryRead::Incomplete if tail == Tail::Synced => {
                return Err(damaged(path, at, "incomplete entry"));
            }
            EntryRead::Bad(reason) if tail == Tail::Synced => {
                return Err(damaged(path, at, reason));
            }
            EntryRead::Incomplete => {
                end_at_damage(path, &buf, at, "incomplete entry")?;
                break;
            }
            EntryRead::Bad(reason) => {
                end_at_damage(path, &buf, at, reason)?;
                break;
            }
        };
        if index == u64::MAX {
            return Err(damaged(path, at, "index out of range"));
        }
        if let Some(previous) = previous_index {
            if index != previous + 1 {
                let what = format!("index {index} follows index {previous}");
                return Err(damaged(path, at, &what));
            }
        }
        if index > state.version {
            if index != state.version + 1 {
                let what = format!(
                    "index {index} does not follow the state's version {}",
                    state.version
                );
                return Err(damaged(path, at, &what));
            }
            let cmd: Command = serde_json::from_slice(body)
                .map_err(|e| damaged(path, at, &format!("undecodable command: {e}")))?;
            state
                .apply(&cmd)
                .map_err(|e| damaged(path, at, &format!("command {index} does not apply: {e}")))?;
        }
        previous_index = Some(index);
        entries += 1;
        at += len;
    }
    assert!(state.version >= previous_index.unwrap_or(0));
    Ok(entries)
}

/// The end of the log at a damaged entry at `at`: a torn tail, cut off, when no
/// valid entry follows; else corruption, refused.
fn end_at_damage(path: &Path, buf: &[u8], at: usize, reason: &str) -> Result<(), MetaError> {
    if let Some(valid_at) = next_valid_entry(buf, at) {
        let what = format!("{reason}, followed by a valid entry at byte offset {valid_at}");
        return Err(damaged(path, at, &what));
    }
    truncate_torn_tail(path, at, buf.len(), reason)
}

fn damaged(path: &Path, at: usize, what: &str) -> MetaError {
    MetaError::Io(format!(
        "damaged metadata log {} at byte offset {at}: {what}; refusing to open",
        path.display()
    ))
}

fn truncate_torn_tail(path: &Path, at: usize, len: usize, reason: &str) -> Result<(), MetaError> {
    tracing::warn!(
        path = %path.display(),
        offset = at,
        bytes = len - at,
        reason,
        "cutting off the torn tail of the metadata log"
    );
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| io_error(path, "cannot open", e))?;
    file.set_len(at as u64)
        .and_then(|()| file.sync_all())
        .map_err(|e| io_error(path, "cannot truncate", e))
}

/// Creates `dir` if needed, and makes its entry in the parent durable.
fn create_dir(dir: &Path) -> Result<(), MetaError> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::create_dir_all(dir).map_err(|e| io_error(dir, "cannot create", e))?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent).map_err(|e| io_error(parent, "cannot sync", e))?;
    }
    Ok(())
}

/// [`write_synced`] that tells a full file system apart: `Err(Full)` when it
/// has no room, any other failure as the error it is.
fn write_synced_or_full(path: &Path, bytes: &[u8]) -> Result<Result<(), Full>, MetaError> {
    #[cfg(test)]
    if tests_hooks::SNAPSHOT_DISK_FULL.with(std::cell::Cell::get) {
        return Ok(Err(Full));
    }
    match create_synced(path, bytes) {
        Ok(()) => Ok(Ok(())),
        // A full disk, or a full quota.
        Err((_, e)) if narad_io::out_of_space(&e) => Ok(Err(Full)),
        Err((what, e)) => Err(io_error(path, what, e)),
    }
}

/// The file system had no room for a write.
struct Full;

/// Writes the file's bytes again over themselves and syncs them: makes durable
/// what may be in the page cache only, with no new space.
fn rewrite_in_place(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let bytes = fs::read(path)?;
    let file = OpenOptions::new().write(true).open(path)?;
    file.write_all_at(&bytes, 0)?;
    file.sync_data()
}

/// Writes `bytes` as the whole of `path` and syncs it.
fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), MetaError> {
    create_synced(path, bytes).map_err(|(what, e)| io_error(path, what, e))
}

/// Creates `path` holding `bytes`, synced; on failure, which step failed.
fn create_synced(path: &Path, bytes: &[u8]) -> Result<(), (&'static str, io::Error)> {
    let mut file = File::create(path).map_err(|e| ("cannot create", e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| ("cannot write", e))
}

/// Makes `to` a second name of `from`'s current contents (through a hard link at
/// `tmp`, renamed over `to`), so `from` can be replaced without copying it.
fn keep_as(from: &Path, tmp: &Path, to: &Path) -> Result<(), MetaError> {
    match fs::remove_file(tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(io_error(tmp, "cannot remove", e))
        }
        _ => {}
    }
    fs::hard_link(from, tmp).map_err(|e| {
        MetaError::Io(format!(
            "cannot link {} as {}: {e}",
            from.display(),
            tmp.display()
        ))
    })?;
    rename(tmp, to)
}

fn rename(from: &Path, to: &Path) -> Result<(), MetaError> {
    fs::rename(from, to).map_err(|e| {
        MetaError::Io(format!(
            "cannot rename {} to {}: {e}",
            from.display(),
            to.display()
        ))
    })
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new().append(true).open(path)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn io_error(path: &Path, what: &str, e: io::Error) -> MetaError {
    MetaError::Io(format!("{what} {}: {e}", path.display()))
}

/// Test-only switches.
#[cfg(test)]
pub(super) mod tests_hooks {
    thread_local! {
        /// The open's snapshot finds the file system full.
        pub static SNAPSHOT_DISK_FULL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
}
