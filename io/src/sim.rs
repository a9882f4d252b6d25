//! A fault-injecting in-memory disk for crash and fault tests.
//!
//! The model keeps, per file, the bytes a reader sees (`current`) apart from the
//! bytes that a completed `sync_data` made durable (`durable`), plus the set of
//! 512-byte sectors written since that sync. A crash ([`SimDisk::crash`]) stops
//! every open handle; [`SimDisk::reboot`] then decides the fate of every unsynced
//! sector independently, from the seeded generator: it either carries its new bytes
//! or keeps what the durable image had there (stale bytes of a recycled file, or
//! zeros past the durable end); a sector written more than once since its last
//! sync may come back with one of its last few unsynced versions instead of the
//! newest. So a torn write can leave a hole in front of sectors
//! that did survive, which is what a real disk with a volatile cache is allowed to
//! do. Directory operations are durable when they return, as the
//! [`Storage`](crate::file::Storage) contract says (each syncs its directory
//! before it returns); a crash that falls on one, between its change and that
//! sync, leaves the change on the disk or not, by the seeded generator: a
//! rename done or not, a created file there or not, each file of a batch
//! removal ([`Storage::remove_in`](crate::file::Storage::remove_in)) or of a
//! removed directory gone or back.
//!
//! Faults, all drawn from the one seed so a failing test replays exactly:
//! - `fdatasync`, or the sync half of a durable write, fails with `EIO`
//!   ([`SimFaults::sync_eio_ppm`], or [`SimDisk::fail_next_syncs`]); each
//!   sector it covered is then durable, still pending, or lost.
//! - writes fail with `ENOSPC` once the disk's capacity is used
//!   ([`SimDisk::set_capacity`]), or `EDQUOT` once a quota is
//!   ([`SimDisk::set_quota`]); nothing of a refused write is applied.
//! - reads flip one bit of the returned bytes ([`SimFaults::read_flip_ppm`],
//!   [`SimDisk::flip_next_reads`], or at a chosen byte of a file with
//!   [`SimDisk::flip_next_read_at`]); the stored bytes stay intact.
//! - reads of a chosen file fail with `EIO`, as a medium error would
//!   ([`SimDisk::set_unreadable`]).
//! - a crash at the N-th write, sync, truncate or change of a directory
//!   ([`SimDisk::crash_at_op`]).
//!
//! A `sync_data` is in flight for one turn of the executor: it covers the writes
//! that returned before it was called, lets every other ready task run (which may
//! write more, even over the sectors it covers), and only then completes, so code
//! that writes beside a sync in flight is tested as a device would run it.
//!
//! Lives on one core: `Rc<RefCell<_>>` inside, `!Send`, never awaited on I/O.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::rc::Rc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::file::{OpenMode, Storage, SECTOR_BYTES};
use crate::{align_up, BLOCK_BYTES};

/// Probabilities of spontaneous faults, in parts per million of operations.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimFaults {
    /// Chance that one `sync_data`, or the sync half of one durable write, fails
    /// with `EIO`.
    pub sync_eio_ppm: u32,
    /// Chance that one read returns a flipped bit.
    pub read_flip_ppm: u32,
}

/// Counters a test can assert on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Completed `sync_data` calls (successful ones).
    pub syncs: u64,
    /// Calls to `write_at` that were applied.
    pub writes: u64,
    /// Writes through `write_durable_with`, durable when they returned except
    /// past the file's old end when they grew it; each is also one of `writes`.
    pub durable_writes: u64,
    /// Writes that went to the page cache (`write_cached_at`); each is also
    /// one of `writes`: until a sync covers them their sectors may survive a
    /// crash or not, and a failed sync leaves each durable or lost, not pending.
    pub cached_writes: u64,
    /// Bytes handed to `write_at` (what the device would write).
    pub bytes_written: u64,
    /// Bytes read through `read_at`.
    pub bytes_read: u64,
    /// The most `sync_data` calls that were in flight at once (on any file).
    pub syncs_in_flight_max: u64,
}

#[derive(Default)]
struct FileData {
    current: Vec<u8>,
    durable: Vec<u8>,
    dirty_sectors: BTreeSet<u64>,
    /// Sectors whose newest write went to the page cache (`write_cached_at`):
    /// a failed sync cannot leave them pending, since the kernel marks a page
    /// whose writeback failed clean and no later sync writes it again.
    cached_sectors: BTreeSet<u64>,
    /// Sectors under a write still in flight ([`SimDisk::set_slow_writes`]):
    /// a sync issued meanwhile covers only the bytes they held before it.
    in_flight: BTreeMap<u64, InFlightSector>,
    /// Earlier unsynced contents of dirty sectors that were written again
    /// before a sync, oldest first, at most [`VERSIONS_MAX`] each: a device's
    /// cache may write any of them out before a crash, not only the newest.
    /// (Each with its number from `version_seq`, which only grows.)
    versions: BTreeMap<u64, Vec<(u64, Vec<u8>)>>,
    version_seq: u64,
    length_dirty: bool,
    /// Bytes allocated from the start whatever the length
    /// ([`crate::BlockFile::reserve`]): writes below it never run out of space.
    reserved: u64,
}

impl FileData {
    /// The bytes the file occupies: its blocks, or its reservation if larger.
    fn allocated_bytes(&self) -> u64 {
        align_up(self.current.len() as u64).max(self.reserved)
    }
}

/// Earlier unsynced versions a sector keeps at most (the newest ones).
const VERSIONS_MAX: usize = 3;

/// A sector under writes still in flight.
struct InFlightSector {
    /// How many.
    writes: u32,
    /// The sector's bytes before the first of them (shorter, or empty, at the
    /// end of the file): what a sync issued while they are out may make
    /// durable, since the device holds either these or the new ones.
    completed: Vec<u8>,
    /// The newest version number when they went out: versions up to it are
    /// `completed` or older, the later ones newer.
    versions_upto: u64,
}

struct Inner {
    rng: ChaCha8Rng,
    faults: SimFaults,
    names: BTreeMap<String, u64>,
    dirs: BTreeSet<String>,
    inodes: BTreeMap<u64, FileData>,
    next_inode: u64,
    generation: u64,
    crashed: bool,
    ops: u64,
    crash_at_op: Option<u64>,
    fail_next_syncs: u32,
    fail_create_of: Option<String>,
    fail_rename_of: Option<(String, i32)>,
    /// The next opens that fail, and with which `errno`.
    fail_next_opens: Option<(u32, i32)>,
    fail_remove_of: Option<String>,
    fail_dir_sync_of: Option<String>,
    flip_next_reads: u32,
    /// (inode, byte position, bit, longest read): the next read of that inode
    /// covering the position, and asking for at most that many bytes, returns the
    /// bit flipped. Queued: only the first is armed; once taken, the next is.
    flip_at: std::collections::VecDeque<(u64, u64, u8, usize)>,
    /// The next write covering (inode, byte) stores that bit flipped.
    flip_write_at: Option<(u64, u64, u8)>,
    /// Every write stays in flight for one turn of the executor.
    slow_writes: bool,
    /// Turns of the executor a sync stays in flight.
    sync_turns: u32,
    syncs_in_flight: u64,
    capacity_bytes: Option<u64>,
    /// What a write past the capacity fails with: `ENOSPC`, or `EDQUOT` for
    /// a capacity that is the user's quota ([`SimDisk::set_quota`]).
    refusal_errno: i32,
    /// [`crate::BlockFile::reserve`] fails as on a file system without
    /// `fallocate` ([`SimDisk::set_reserve_unsupported`]).
    reserve_unsupported: bool,
    /// A write past the capacity writes the blocks that fit first
    /// ([`SimDisk::set_short_writes`]).
    short_writes: bool,
    /// Inodes whose reads fail with `EIO`.
    unreadable: BTreeSet<u64>,
    stats: SimStats,
}

/// The simulated disk. Clones share it.
#[derive(Clone)]
pub struct SimDisk {
    inner: Rc<RefCell<Inner>>,
}

/// A handle to one simulated file; dead after a crash.
pub struct SimFile {
    disk: SimDisk,
    inode: u64,
    generation: u64,
}

fn crashed_error() -> io::Error {
    io::Error::other("simulated crash: the process is gone")
}

impl SimDisk {
    /// An empty disk whose every random choice comes from `seed`.
    pub fn new(seed: u64, faults: SimFaults) -> Self {
        let mut dirs = BTreeSet::new();
        dirs.insert(String::new());
        Self {
            inner: Rc::new(RefCell::new(Inner {
                rng: ChaCha8Rng::seed_from_u64(seed),
                faults,
                names: BTreeMap::new(),
                dirs,
                inodes: BTreeMap::new(),
                next_inode: 1,
                generation: 0,
                crashed: false,
                ops: 0,
                crash_at_op: None,
                fail_next_syncs: 0,
                fail_create_of: None,
                fail_rename_of: None,
                fail_next_opens: None,
                fail_remove_of: None,
                fail_dir_sync_of: None,
                flip_next_reads: 0,
                flip_at: std::collections::VecDeque::new(),
                flip_write_at: None,
                slow_writes: false,
                sync_turns: 1,
                syncs_in_flight: 0,
                unreadable: BTreeSet::new(),
                capacity_bytes: None,
                refusal_errno: libc::ENOSPC,
                reserve_unsupported: false,
                short_writes: false,
                stats: SimStats::default(),
            })),
        }
    }

    /// Crashes when the operation counter (writes, syncs, truncates and
    /// changes of a directory) reaches `op`: that operation and everything after it fail
    /// until [`SimDisk::reboot`].
    pub fn crash_at_op(&self, op: u64) {
        self.inner.borrow_mut().crash_at_op = Some(op);
    }

    /// Writes, syncs, truncates and changes of a directory performed so far.
    pub fn ops(&self) -> u64 {
        self.inner.borrow().ops
    }

    /// Whether the disk has crashed and awaits a reboot.
    pub fn is_crashed(&self) -> bool {
        self.inner.borrow().crashed
    }

    /// Stops the process now: every handle fails from here on.
    pub fn crash(&self) {
        self.inner.borrow_mut().crashed = true;
    }

    /// Power comes back: each unsynced sector keeps its new bytes or loses them, by
    /// the seeded generator, and old handles stay dead.
    pub fn reboot(&self) {
        let mut inner = self.inner.borrow_mut();
        let Inner { rng, inodes, .. } = &mut *inner;
        for data in inodes.values_mut() {
            settle_after_crash(data, rng);
        }
        inner.crashed = false;
        inner.crash_at_op = None;
        inner.generation += 1;
    }

    /// The process dies but the machine stays up: every handle fails from here
    /// on, while written bytes stay readable (and unsynced) as they would in the
    /// device's cache. A later [`SimDisk::crash`] and [`SimDisk::reboot`] (power
    /// loss) still decides the fate of those unsynced sectors.
    pub fn restart_process(&self) {
        let mut inner = self.inner.borrow_mut();
        inner.crashed = false;
        inner.crash_at_op = None;
        inner.generation += 1;
        // The dead process's writes in flight land, or not, as the device
        // decides; none of them returns to anyone.
        for data in inner.inodes.values_mut() {
            data.in_flight.clear();
        }
    }

    /// The next `n` successful-looking syncs fail with `EIO` instead.
    pub fn fail_next_syncs(&self, n: u32) {
        self.inner.borrow_mut().fail_next_syncs = n;
    }

    /// The next open that creates `path` creates it and then fails with `EIO`,
    /// as a real create whose directory sync failed: the file is left behind.
    pub fn fail_next_create_of(&self, path: &str) {
        self.inner.borrow_mut().fail_create_of = Some(path.to_string());
    }

    /// The next rename of `from` renames it and then fails with `EIO`, as a real
    /// rename whose directory sync failed.
    pub fn fail_next_rename_of(&self, from: &str) {
        self.fail_next_rename_of_with(from, libc::EIO);
    }

    /// [`SimDisk::fail_next_rename_of`] with another `errno`: `EMFILE` is a
    /// rename whose directory could not be opened to be synced.
    pub fn fail_next_rename_of_with(&self, from: &str, errno: i32) {
        self.inner.borrow_mut().fail_rename_of = Some((from.to_string(), errno));
    }

    /// The next `n` opens fail with `errno` (`EMFILE`: a process out of
    /// descriptors) and change nothing.
    pub fn fail_next_opens_with(&self, n: u32, errno: i32) {
        self.inner.borrow_mut().fail_next_opens = (n > 0).then_some((n, errno));
    }

    /// Whether a rename fault set by [`SimDisk::fail_next_rename_of`] is still
    /// waiting for its rename.
    pub fn rename_fault_armed(&self) -> bool {
        self.inner.borrow().fail_rename_of.is_some()
    }

    /// The next remove of `path` fails with `EIO` and leaves the file in place.
    pub fn fail_next_remove_of(&self, path: &str) {
        self.inner.borrow_mut().fail_remove_of = Some(path.to_string());
    }

    /// The next batch removal in `dir` ([`Storage::remove_in`]) removes its
    /// files and then fails with `EIO`, as a real one whose directory sync failed.
    pub fn fail_next_dir_sync_of(&self, dir: &str) {
        self.inner.borrow_mut().fail_dir_sync_of = Some(dir.to_string());
    }

    /// Every read of `path` fails with `EIO` (`true`) until set back.
    pub fn set_unreadable(&self, path: &str, unreadable: bool) {
        let mut inner = self.inner.borrow_mut();
        let inode = inner.names[path];
        if unreadable {
            inner.unreadable.insert(inode);
        } else {
            inner.unreadable.remove(&inode);
        }
    }

    /// The next `n` reads each return one flipped bit.
    pub fn flip_next_reads(&self, n: u32) {
        self.inner.borrow_mut().flip_next_reads = n;
    }

    /// The next read of `path` that covers byte `pos` returns bit `bit` of that
    /// byte flipped (once); the stored bytes stay intact. For tests that need a
    /// flip at one exact place, such as inside the last commit of a log. Flips
    /// asked for while one waits queue behind it: each is armed once the one
    /// before it was taken, so that successive reads go bad one after another.
    pub fn flip_next_read_at(&self, path: &str, pos: u64, bit: u8) {
        let mut inner = self.inner.borrow_mut();
        let inode = inner.names[path];
        inner.flip_at.push_back((inode, pos, bit % 8, usize::MAX));
    }

    /// [`SimDisk::flip_next_read_at`], but only a read of one block takes the
    /// flip: larger reads of the same byte (a scan) pass it by. For tests that aim
    /// at a read-modify-write of a single block.
    pub fn flip_next_block_read_at(&self, path: &str, pos: u64, bit: u8) {
        let mut inner = self.inner.borrow_mut();
        let inode = inner.names[path];
        inner.flip_at.push_back((inode, pos, bit % 8, BLOCK_BYTES));
    }

    /// The next write to `path` that covers byte `pos` stores bit `bit` of that
    /// byte flipped (once), as a device that wrote wrong bytes and reported
    /// success: the damage is what a later sync makes durable.
    pub fn flip_next_write_at(&self, path: &str, pos: u64, bit: u8) {
        let mut inner = self.inner.borrow_mut();
        let inode = inner.names[path];
        inner.flip_write_at = Some((inode, pos, bit % 8));
    }

    /// Every write from now on stays in flight for one turn of the executor
    /// before it returns (applied when issued, as a device may), so other
    /// tasks run while it is out: as on a real disk, where a write is a round
    /// trip. A sync issued while it is out covers what its sectors held
    /// before it, not its own bytes; one its caller stops waiting for still
    /// lands. Off by default, writes return at once.
    pub fn set_slow_writes(&self, slow: bool) {
        self.inner.borrow_mut().slow_writes = slow;
    }

    /// Every sync from now on stays in flight for `turns` turns of the executor
    /// (at least one; one by default), so that other writes and syncs can be
    /// issued while it is out.
    pub fn set_sync_turns(&self, turns: u32) {
        self.inner.borrow_mut().sync_turns = turns.max(1);
    }

    /// The bytes all files occupy now (what [`SimDisk::set_capacity`] limits).
    pub fn allocated_bytes(&self) -> u64 {
        SimDisk::used_bytes(&self.inner.borrow())
    }

    /// Limits the bytes all files may occupy; writes past it fail with `ENOSPC`.
    pub fn set_capacity(&self, capacity_bytes: Option<u64>) {
        let mut inner = self.inner.borrow_mut();
        inner.capacity_bytes = capacity_bytes;
        inner.refusal_errno = libc::ENOSPC;
    }

    /// As [`SimDisk::set_capacity`], for a limit that is the user's disk
    /// quota: writes past it fail with `EDQUOT`.
    pub fn set_quota(&self, quota_bytes: Option<u64>) {
        let mut inner = self.inner.borrow_mut();
        inner.capacity_bytes = quota_bytes;
        inner.refusal_errno = libc::EDQUOT;
    }

    /// A write that runs past the capacity from now on writes the blocks that
    /// fit and then fails as a short write (`WriteZero`, as the real disk's
    /// layer reports a direct write that returned fewer bytes), as ext4 does
    /// when the disk fills in the middle of one; off (the default), it is
    /// refused whole.
    pub fn set_short_writes(&self, short: bool) {
        self.inner.borrow_mut().short_writes = short;
    }

    /// Makes every reservation fail as on a file system that cannot reserve
    /// space (`EOPNOTSUPP`), or succeed again.
    pub fn set_reserve_unsupported(&self, unsupported: bool) {
        self.inner.borrow_mut().reserve_unsupported = unsupported;
    }

    /// Changes the spontaneous fault rates.
    pub fn set_faults(&self, faults: SimFaults) {
        self.inner.borrow_mut().faults = faults;
    }

    /// Counters so far.
    pub fn stats(&self) -> SimStats {
        self.inner.borrow().stats
    }

    /// Flips bit `bit` of the byte at `offset` of a file, durably: bit rot.
    pub fn rot(&self, path: &str, offset: usize, bit: u8) {
        let mut inner = self.inner.borrow_mut();
        let inode = inner.names[path];
        let data = inner.inodes.get_mut(&inode).expect("named inode exists");
        data.current[offset] ^= 1 << bit;
        if offset < data.durable.len() {
            data.durable[offset] ^= 1 << bit;
        }
    }

    /// The bytes a reader sees in a file now (for assertions).
    pub fn contents(&self, path: &str) -> Option<Vec<u8>> {
        let inner = self.inner.borrow();
        let inode = inner.names.get(path)?;
        Some(inner.inodes[inode].current.clone())
    }

    fn used_bytes(inner: &Inner) -> u64 {
        inner
            .names
            .values()
            .map(|inode| inner.inodes[inode].allocated_bytes())
            .sum()
    }

    /// Counts an operation and crashes if its number was drawn.
    fn tick(inner: &mut Inner) -> io::Result<()> {
        if inner.crashed {
            return Err(crashed_error());
        }
        inner.ops += 1;
        if inner.crash_at_op.is_some_and(|op| inner.ops >= op) {
            inner.crashed = true;
            return Err(crashed_error());
        }
        Ok(())
    }

    /// Counts a change of a directory as an operation. If the crash falls on
    /// it, `Err` says whether the change reached the disk before the power
    /// went (it was made, its directory sync was not): the caller makes it
    /// or not, then fails with the crash.
    fn tick_namespace(inner: &mut Inner) -> Result<(), bool> {
        match Self::tick(inner) {
            Ok(()) => Ok(()),
            Err(_) => Err(inner.rng.random_bool(0.5)),
        }
    }

    fn check_handle(inner: &Inner, generation: u64) -> io::Result<()> {
        if inner.crashed || generation != inner.generation {
            return Err(crashed_error());
        }
        Ok(())
    }

    fn parent_exists(inner: &Inner, path: &str) -> bool {
        let parent = path.rsplit_once('/').map_or("", |(dir, _)| dir);
        inner.dirs.contains(parent)
    }
}

fn settle_after_crash(data: &mut FileData, rng: &mut ChaCha8Rng) {
    let mut image = data.durable.clone();
    // A truncate not yet synced may or may not have reached the disk.
    if data.length_dirty && rng.random_bool(0.5) && data.current.len() < image.len() {
        image.truncate(data.current.len());
    }
    let sector = SECTOR_BYTES as u64;
    for &s in &data.dirty_sectors {
        let start = (s * sector) as usize;
        if start >= data.current.len() || !rng.random_bool(0.5) {
            continue;
        }
        let end = (start + SECTOR_BYTES).min(data.current.len());
        if image.len() < end {
            image.resize(end, 0);
        }
        // The newest bytes, or an earlier unsynced version of the same length.
        let earlier = data.versions.get(&s).map_or(&[][..], Vec::as_slice);
        let pick = rng.random_range(0..=earlier.len());
        match earlier.get(pick) {
            Some((_, version)) if version.len() == end - start => {
                image[start..end].copy_from_slice(version);
            }
            _ => image[start..end].copy_from_slice(&data.current[start..end]),
        }
    }
    data.current = image.clone();
    data.durable = image;
    data.dirty_sectors.clear();
    data.cached_sectors.clear();
    data.in_flight.clear();
    data.versions.clear();
    data.length_dirty = false;
}

/// The bytes of sector `s` inside `bytes` (shorter at the end of the file).
fn sector_bytes(bytes: &[u8], s: u64) -> &[u8] {
    let start = (s as usize * SECTOR_BYTES).min(bytes.len());
    let end = (start + SECTOR_BYTES).min(bytes.len());
    &bytes[start..end]
}

/// Lets every other ready task run once, on any executor: what a write or
/// sync in flight does here, and what a test does to let tasks it spawned
/// reach a point (glommio's own yield only yields when a turn is due).
pub async fn yield_once() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return std::task::Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await
}

/// Writes, syncs and reads of one file.
mod file;
/// The namespace side (open, rename, remove, list).
mod storage;
