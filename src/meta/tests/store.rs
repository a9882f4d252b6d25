//! The store's durability: round trips, torn tails, corruption, snapshots and the
//! crash windows of taking one, and the write latch.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::*;
use crate::meta::frame::{encode_entry, encode_snapshot, encode_snapshot_of, ENTRY_HEADER_BYTES};

fn open(dir: &Path) -> (MetaStore, MetaState) {
    MetaStore::open(dir).expect("open the metadata store")
}

fn log_path(dir: &Path) -> PathBuf {
    dir.join("commands.log")
}

fn append_bytes(path: &Path, bytes: &[u8]) {
    let mut file = OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(bytes).unwrap();
}

/// A store in a fresh directory holding topics a, b (altered) and c (deleted).
fn populated() -> (tempfile::TempDir, MetaStore, MetaState) {
    let tmp = tempfile::tempdir().unwrap();
    let (mut store, mut state) = open(&tmp.path().join("metastore"));
    for cmd in [
        create("a", 1),
        create("b", 2),
        create("c", 3),
        alter("b", 2, retention(0)),
        delete("c", 3),
    ] {
        store.propose(&mut state, cmd).unwrap();
    }
    (tmp, store, state)
}

fn dir(tmp: &tempfile::TempDir) -> PathBuf {
    tmp.path().join("metastore")
}

/// What an open replays from the log may sit in the page cache only (a failed
/// fsync leaves the pages it could not write in memory, marked clean): the open
/// writes the state afresh as a snapshot and starts an empty log, so a later
/// power loss cannot leave a hole before entries appended after it.
#[test]
fn an_open_that_replayed_entries_writes_them_afresh() {
    let (tmp, store, state) = populated();
    drop(store);
    assert!(!dir(&tmp).join("snapshot").exists());
    let (store, reopened) = open(&dir(&tmp));
    assert_eq!(reopened, state);
    assert_eq!(store.last_index(), 5);
    assert!(dir(&tmp).join("snapshot").exists());
    assert_eq!(fs::metadata(log_path(&dir(&tmp))).unwrap().len(), 0);
    drop(store);
    // With nothing to replay, an open writes nothing.
    let snapshot_written = fs::metadata(dir(&tmp).join("snapshot"))
        .unwrap()
        .modified()
        .unwrap();
    let (_, again) = open(&dir(&tmp));
    assert_eq!(again, state);
    assert_eq!(
        fs::metadata(dir(&tmp).join("snapshot"))
            .unwrap()
            .modified()
            .unwrap(),
        snapshot_written
    );
}

/// On a full disk the open has no room for the snapshot: it writes the log's
/// bytes again in place instead, renames nothing, and the node starts; the
/// store takes commands as before, and the next open with room takes the
/// snapshot.
#[test]
fn an_open_on_a_full_disk_settles_the_log_in_place() {
    use crate::meta::store::tests_hooks::SNAPSHOT_DISK_FULL;
    let (tmp, store, state) = populated();
    drop(store);
    let log_before = fs::read(log_path(&dir(&tmp))).unwrap();
    SNAPSHOT_DISK_FULL.with(|full| full.set(true));
    let opened = MetaStore::open(&dir(&tmp));
    SNAPSHOT_DISK_FULL.with(|full| full.set(false));
    let (mut store, mut reopened) = opened.expect("a full disk does not stop the open");
    assert_eq!(reopened, state);
    let names: Vec<String> = fs::read_dir(dir(&tmp))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        ["commands.log"],
        "nothing renamed, nothing left behind"
    );
    assert_eq!(fs::read(log_path(&dir(&tmp))).unwrap(), log_before);
    store.propose(&mut reopened, create("d", 4)).unwrap();
    drop(store);
    let (_, again) = open(&dir(&tmp));
    assert_eq!(again.version, 6);
    assert!(dir(&tmp).join("snapshot").exists());
}

#[test]
fn commands_survive_a_reopen() {
    let (tmp, store, state) = populated();
    assert_eq!((state.version, store.last_index()), (5, 5));
    drop(store);
    let (mut store, mut reopened) = open(&dir(&tmp));
    assert_eq!(reopened, state);
    assert_eq!(reopened.get("b").unwrap().retention_ms, 0);
    assert!(reopened.get("c").is_none());
    store.propose(&mut reopened, create("d", 4)).unwrap();
    drop(store);
    assert_eq!(open(&dir(&tmp)).1.version, 6);
}

#[test]
fn an_empty_directory_opens_empty() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, state) = open(&tmp.path().join("a/b/metastore"));
    assert_eq!(state, MetaState::default());
    assert_eq!(store.last_index(), 0);
    assert!(log_path(&tmp.path().join("a/b/metastore")).exists());
}

#[test]
fn a_refused_command_is_never_logged() {
    let (tmp, mut store, mut state) = populated();
    let log_bytes = fs::metadata(log_path(&dir(&tmp))).unwrap().len();
    assert_refused(store.propose(&mut state, create("A", 9)), 409, &["case"]);
    assert_refused(store.propose(&mut state, delete("zz", 9)), 404, &[]);
    assert_eq!(fs::metadata(log_path(&dir(&tmp))).unwrap().len(), log_bytes);
    assert_eq!(state.version, 5);
    store.propose(&mut state, create("z", 9)).unwrap();
    assert_eq!(state.version, 6);
}

#[test]
fn a_torn_tail_is_cut_off_and_appends_go_on() {
    let whole = encode_entry(&create("torn", 99), 6);
    let tails: Vec<Vec<u8>> = vec![
        vec![0; 1],
        vec![0; 4096],
        b"garbage after the last entry".to_vec(),
        whole[..2].to_vec(),
        whole[..ENTRY_HEADER_BYTES - 1].to_vec(),
        whole[..ENTRY_HEADER_BYTES].to_vec(),
        whole[..whole.len() - 1].to_vec(),
        {
            // Whole, but its last byte never made it to the disk.
            let mut flipped = whole.clone();
            *flipped.last_mut().unwrap() ^= 0x01;
            flipped
        },
        [whole[..30].to_vec(), vec![0; 500]].concat(),
        // Only the magic reached the disk: the format byte reads as zero.
        [whole[..4].to_vec(), vec![0; ENTRY_HEADER_BYTES - 4]].concat(),
        [whole[..4].to_vec(), vec![0; 500]].concat(),
    ];
    for tail in tails {
        let (tmp, store, state) = populated();
        drop(store);
        let log = log_path(&dir(&tmp));
        let good_len = fs::metadata(&log).unwrap().len();
        append_bytes(&log, &tail);

        let (mut store, mut reopened) = open(&dir(&tmp));
        assert_eq!(reopened, state, "tail {tail:?}");
        // Cut, then kept as the fallback log behind the snapshot the open
        // wrote; the log goes on empty.
        let kept = dir(&tmp).join("commands.log.prev");
        assert_eq!(
            fs::metadata(&kept).unwrap().len(),
            good_len,
            "tail {tail:?}"
        );
        assert_eq!(fs::metadata(&log).unwrap().len(), 0, "tail {tail:?}");
        store.propose(&mut reopened, create("after", 7)).unwrap();
        drop(store);
        let (_, after) = open(&dir(&tmp));
        assert_eq!(after, reopened);
        assert_eq!(after.version, 6);
    }
}

/// The byte offsets at which the log's entries start.
fn entry_offsets(log: &[u8]) -> Vec<usize> {
    let mut offsets = vec![];
    let mut at = 0;
    while at < log.len() {
        offsets.push(at);
        let body_len = u32::from_be_bytes(log[at + 5..at + 9].try_into().unwrap()) as usize;
        at += ENTRY_HEADER_BYTES + body_len;
    }
    offsets
}

/// Damages the log (first argument) at the entry starting at the second.
type Damage = fn(&mut [u8], usize);

#[test]
fn damage_before_a_valid_entry_refuses_to_open() {
    // Each case damages the second of five entries: its body, its index (which the
    // checksum covers), its length, its magic, or all of it.
    let damages: [(&str, Damage); 5] = [
        ("body", |log, at| log[at + ENTRY_HEADER_BYTES + 3] ^= 0x20),
        ("index", |log, at| log[at + 20] ^= 0x01),
        ("length", |log, at| {
            log[at + 8] = log[at + 8].wrapping_add(1)
        }),
        ("magic", |log, at| log[at] = b'X'),
        ("zeroed", |log, at| log[at..at + 40].fill(0)),
    ];
    for (what, damage) in damages {
        let (tmp, store, _) = populated();
        drop(store);
        let path = log_path(&dir(&tmp));
        let mut log = fs::read(&path).unwrap();
        let second = entry_offsets(&log)[1];
        damage(&mut log, second);
        fs::write(&path, &log).unwrap();

        let error = MetaStore::open(&dir(&tmp)).expect_err(what);
        assert_eq!(error.status(), 500);
        let message = error.message();
        assert!(message.contains("commands.log"), "{what}: {message}");
        assert!(
            message.contains(&format!("byte offset {second}")),
            "{what}: {message}"
        );
        // The store refuses without touching the file.
        assert_eq!(fs::read(&path).unwrap(), log, "{what}");
    }
}

#[test]
fn an_entry_of_an_unknown_format_refuses_to_open() {
    let (tmp, store, _) = populated();
    drop(store);
    let mut entry = encode_entry(&create("new", 9), 6);
    entry[4] = 2;
    append_bytes(&log_path(&dir(&tmp)), &entry);
    assert_refused(
        MetaStore::open(&dir(&tmp)),
        500,
        &["unknown entry format 2"],
    );
}

#[test]
fn a_log_that_skips_an_index_refuses_to_open() {
    let (tmp, store, _) = populated();
    drop(store);
    append_bytes(&log_path(&dir(&tmp)), &encode_entry(&create("skip", 9), 7));
    assert_refused(
        MetaStore::open(&dir(&tmp)),
        500,
        &["index 7 follows index 5"],
    );
}

#[test]
fn snapshots_replace_the_log_and_reopen_to_the_same_state() {
    let (tmp, mut store, mut state) = populated();
    store.set_snapshot_every(4);
    // Five entries are in the log already: the next proposal takes a snapshot.
    store.propose(&mut state, create("d", 4)).unwrap();
    assert_eq!(fs::metadata(log_path(&dir(&tmp))).unwrap().len(), 0);
    assert!(dir(&tmp).join("snapshot").exists());
    for cmd in [
        create("e", 5),
        alter("d", 4, retention(7_200_000)),
        delete("a", 1),
    ] {
        store.propose(&mut state, cmd).unwrap();
    }
    drop(store);
    let (mut store, mut reopened) = open(&dir(&tmp));
    assert_eq!(reopened, state);
    assert_eq!(reopened.version, 9);
    // And again past a second snapshot.
    store.set_snapshot_every(2);
    store.propose(&mut reopened, create("f", 6)).unwrap();
    store.propose(&mut reopened, delete("b", 2)).unwrap();
    drop(store);
    assert_eq!(open(&dir(&tmp)).1, reopened);
}

#[test]
fn a_crash_between_the_snapshot_rename_and_the_log_reset_recovers() {
    // The snapshot at version 5 is in place; the old log, all at or below 5, is too.
    let (tmp, store, state) = populated();
    drop(store);
    fs::write(dir(&tmp).join("snapshot"), encode_snapshot(&state)).unwrap();
    let (mut store, mut reopened) = open(&dir(&tmp));
    assert_eq!(reopened, state);
    store.propose(&mut reopened, create("next", 8)).unwrap();
    drop(store);
    assert_eq!(open(&dir(&tmp)).1, reopened);
}

#[test]
fn a_crash_before_the_snapshot_rename_recovers() {
    let (tmp, store, state) = populated();
    drop(store);
    // A half-written snapshot.tmp and an empty commands.log.tmp are left behind.
    let snapshot = encode_snapshot(&state);
    fs::write(
        dir(&tmp).join("snapshot.tmp"),
        &snapshot[..snapshot.len() / 2],
    )
    .unwrap();
    fs::write(dir(&tmp).join("commands.log.tmp"), b"").unwrap();
    assert_eq!(open(&dir(&tmp)).1, state);
    assert!(!dir(&tmp).join("snapshot.tmp").exists());
    assert!(!dir(&tmp).join("commands.log.tmp").exists());
}

#[test]
fn a_damaged_snapshot_refuses_to_open() {
    let (tmp, store, state) = populated();
    drop(store);
    let snapshot = encode_snapshot(&state);
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("shorter than a header", snapshot[..5].to_vec()),
        ("header says", snapshot[..snapshot.len() - 1].to_vec()),
        ("bad magic", [b"X".as_slice(), &snapshot[1..]].concat()),
        (
            "unknown format",
            [&snapshot[..4], &[9u8], &snapshot[5..]].concat(),
        ),
    ];
    let mut flipped = snapshot.clone();
    *flipped.last_mut().unwrap() ^= 0x01;
    cases.push(("checksum", flipped));
    for (words, bytes) in cases {
        fs::write(dir(&tmp).join("snapshot"), &bytes).unwrap();
        assert_refused(MetaStore::open(&dir(&tmp)), 500, &["snapshot", words]);
    }
}

#[test]
fn a_snapshot_of_an_impossible_state_refuses_to_open() {
    let tmp = tempfile::tempdir().unwrap();
    let mut state = MetaState::default();
    state.apply(&create("t", 1)).unwrap();
    fs::create_dir_all(dir(&tmp)).unwrap();
    // A name twice in different case, and an incarnation id twice.
    for (twin, words) in [
        (record("T", 2), "twice"),
        (record("u", 1), "another topic's"),
    ] {
        let clash = state.topics.values().map(|r| &**r).chain([&twin]);
        let snapshot = encode_snapshot_of(state.version, clash);
        fs::write(dir(&tmp).join("snapshot"), snapshot).unwrap();
        assert_refused(MetaStore::open(&dir(&tmp)), 500, &["snapshot", words]);
    }
}

/// A version or index no command can follow (the next would wrap to 0 and be
/// skipped as old at the next open) is refused, in a snapshot and in the log.
#[test]
fn a_version_at_the_end_of_the_range_refuses_to_open() {
    let tmp = tempfile::tempdir().unwrap();
    let mut state = MetaState::default();
    state.apply(&create("t", 1)).unwrap();
    state.version = u64::MAX;
    fs::create_dir_all(dir(&tmp)).unwrap();
    fs::write(dir(&tmp).join("snapshot"), encode_snapshot(&state)).unwrap();
    assert_refused(
        MetaStore::open(&dir(&tmp)),
        500,
        &["snapshot", "out of range"],
    );

    // One below is a snapshot, but the entry that follows it is not.
    let tmp = tempfile::tempdir().unwrap();
    state.version = u64::MAX - 1;
    fs::create_dir_all(dir(&tmp)).unwrap();
    fs::write(dir(&tmp).join("snapshot"), encode_snapshot(&state)).unwrap();
    fs::write(
        log_path(&dir(&tmp)),
        encode_entry(&create("u", 2), u64::MAX),
    )
    .unwrap();
    assert_refused(MetaStore::open(&dir(&tmp)), 500, &["index out of range"]);
}

#[test]
fn a_failed_append_latches_the_store_until_reopened() {
    let (tmp, mut store, mut state) = populated();
    let before = state.clone();
    store.break_log();
    assert_refused(
        store.propose(&mut state, create("x", 9)),
        500,
        &["commands.log"],
    );
    assert_eq!(state, before);
    assert_refused(
        store.propose(&mut state, create("y", 10)),
        500,
        &["refuses writes"],
    );
    assert_refused(store.snapshot(&state), 500, &["refuses writes"]);
    drop(store);
    let (mut store, mut reopened) = open(&dir(&tmp));
    assert_eq!(reopened, before);
    store.propose(&mut reopened, create("x", 9)).unwrap();
}

/// The files of the store directory, by name, for a test to lay out exactly.
type Files = Vec<(&'static str, Vec<u8>)>;

fn lay_out(dir: &Path, files: &Files) {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).unwrap();
    for (name, bytes) in files {
        fs::write(dir.join(name), bytes).unwrap();
    }
}

fn read(dir: &Path, name: &str) -> Vec<u8> {
    fs::read(dir.join(name)).unwrap()
}

/// Ways a snapshot file is lost: each must be recovered from the fallback.
fn lose_snapshot(dir: &Path, how: &str) {
    let path = dir.join("snapshot");
    match how {
        "bit flip" => {
            let mut bytes = fs::read(&path).unwrap();
            *bytes.last_mut().unwrap() ^= 0x10;
            fs::write(&path, bytes).unwrap();
        }
        "cut short" => {
            let bytes = fs::read(&path).unwrap();
            fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        }
        "gone" => fs::remove_file(&path).unwrap(),
        // A read through a link to itself fails (ELOOP), as a read of a bad
        // sector does, and a rename still replaces it.
        "unreadable" => {
            fs::remove_file(&path).unwrap();
            std::os::unix::fs::symlink("snapshot", &path).unwrap();
        }
        _ => unreachable!(),
    }
}

const LOSSES: [&str; 4] = ["bit flip", "cut short", "gone", "unreadable"];

#[test]
fn every_step_of_taking_a_snapshot_recovers_with_or_without_the_snapshot() {
    // The first snapshot at version 6, then two more commands: version 8.
    let (tmp, mut store, mut state) = populated();
    let d = dir(&tmp);
    store.propose(&mut state, create("d", 4)).unwrap();
    store.snapshot(&state).unwrap();
    let (s6, log_to_6) = (read(&d, "snapshot"), read(&d, "commands.log.prev"));
    assert!(
        !d.join("snapshot.prev").exists(),
        "the first has none before it"
    );
    store.propose(&mut state, create("e", 5)).unwrap();
    store
        .propose(&mut state, alter("d", 4, retention(0)))
        .unwrap();
    let log_7_8 = read(&d, "commands.log");
    // The second snapshot, for real: what its last step leaves.
    store.snapshot(&state).unwrap();
    drop(store);
    let s8 = encode_snapshot(&state);
    let done: Files = vec![
        ("snapshot", s8.clone()),
        ("snapshot.prev", s6.clone()),
        ("commands.log.prev", log_7_8.clone()),
        ("commands.log", Vec::new()),
    ];
    let mut on_disk: Files = done
        .iter()
        .map(|(name, _)| (*name, read(&d, name)))
        .collect();
    on_disk.sort();
    let mut expected = done.clone();
    expected.sort();
    assert_eq!(on_disk, expected, "the last step's files");
    let steps: Vec<(&str, Files)> = vec![
        (
            "before",
            vec![
                ("snapshot", s6.clone()),
                ("commands.log.prev", log_to_6.clone()),
                ("commands.log", log_7_8.clone()),
            ],
        ),
        (
            "old snapshot set aside",
            vec![
                ("snapshot.prev", s6.clone()),
                ("commands.log.prev", log_to_6.clone()),
                ("commands.log", log_7_8.clone()),
            ],
        ),
        (
            "new snapshot in place",
            vec![
                ("snapshot", s8.clone()),
                ("snapshot.prev", s6.clone()),
                ("commands.log.prev", log_to_6.clone()),
                ("commands.log", log_7_8.clone()),
            ],
        ),
        (
            "old log kept",
            vec![
                ("snapshot", s8.clone()),
                ("snapshot.prev", s6.clone()),
                ("commands.log.prev", log_7_8.clone()),
                ("commands.log", log_7_8.clone()),
            ],
        ),
        ("done", done),
    ];
    for (step, files) in &steps {
        lay_out(&d, files);
        assert_eq!(open(&d).1, state, "step {step}");
        if !files.iter().any(|(name, _)| *name == "snapshot") {
            continue;
        }
        for how in LOSSES {
            lay_out(&d, files);
            lose_snapshot(&d, how);
            let (_, recovered) =
                MetaStore::open(&d).unwrap_or_else(|e| panic!("step {step}, snapshot {how}: {e}"));
            assert_eq!(recovered, state, "step {step}, snapshot {how}");
            // Written again: it no longer needs the fallback.
            fs::remove_file(d.join("snapshot.prev")).ok();
            fs::remove_file(d.join("commands.log.prev")).unwrap();
            assert_eq!(open(&d).1, state, "step {step}, snapshot {how}, rewritten");
        }
    }
}

/// A closed store that took two snapshots, the create of `d` between them: the
/// fallback pair is the first snapshot and a log holding that create.
fn closed_after_two_snapshots() -> (tempfile::TempDir, PathBuf) {
    let (tmp, mut store, mut state) = populated();
    store.snapshot(&state).unwrap();
    store.propose(&mut state, create("d", 4)).unwrap();
    store.snapshot(&state).unwrap();
    let d = dir(&tmp);
    (tmp, d)
}

#[test]
fn a_lost_snapshot_with_a_lost_fallback_refuses_to_open_naming_both() {
    let (_tmp, d) = closed_after_two_snapshots();
    lose_snapshot(&d, "bit flip");
    let mut prev = read(&d, "snapshot.prev");
    prev[20] ^= 0x01;
    fs::write(d.join("snapshot.prev"), prev).unwrap();
    assert_refused(
        MetaStore::open(&d),
        500,
        &["snapshot ", "checksum", "snapshot.prev", "cannot stand in"],
    );
    // The damaged files are left as they were, for the operator.
    assert!(d.join("snapshot.prev").exists());
}

/// The fallback log holds only synced entries: damage at its end is not a torn
/// write, and cutting it off would roll back an acknowledged command.
#[test]
fn a_damaged_end_of_the_fallback_log_refuses_to_open_rather_than_roll_back() {
    for how in ["bit flip", "cut short"] {
        let (_tmp, d) = closed_after_two_snapshots();
        lose_snapshot(&d, "bit flip");
        let mut prev = read(&d, "commands.log.prev");
        assert!(!prev.is_empty(), "the fallback log holds the create");
        match how {
            "bit flip" => *prev.last_mut().unwrap() ^= 0x01,
            _ => prev.truncate(prev.len() - 3),
        }
        fs::write(d.join("commands.log.prev"), &prev).unwrap();
        assert_refused(
            MetaStore::open(&d),
            500,
            &["commands.log.prev", "cannot stand in"],
        );
        assert_eq!(read(&d, "commands.log.prev"), prev, "{how}: left as it was");
    }
}

#[test]
fn a_snapshot_of_a_newer_format_is_refused_not_rolled_back() {
    let (_tmp, d) = closed_after_two_snapshots();
    let mut snapshot = read(&d, "snapshot");
    snapshot[4] = 2;
    fs::write(d.join("snapshot"), &snapshot).unwrap();
    assert_refused(MetaStore::open(&d), 500, &["unknown format", "newer"]);
    assert_eq!(read(&d, "snapshot"), snapshot, "left as it was");
}

/// A store that kept no fallback log (written before there was one) and
/// stopped inside its first snapshot here, with its old snapshot set aside and
/// the new one not yet in place, opens from the one set aside and its log.
#[test]
fn a_store_without_a_fallback_log_survives_a_stop_inside_its_first_snapshot_here() {
    let (tmp, mut store, mut state) = populated();
    let d = dir(&tmp);
    fs::write(d.join("snapshot"), encode_snapshot(&state)).unwrap();
    store.propose(&mut state, create("d", 4)).unwrap();
    store.propose(&mut state, create("e", 5)).unwrap();
    drop(store);
    fs::rename(d.join("snapshot"), d.join("snapshot.prev")).unwrap();
    assert!(!d.join("commands.log.prev").exists());
    assert_eq!(open(&d).1, state);
}
