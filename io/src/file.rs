//! The persistence interface every durable structure is written against.
//!
//! The contract is deliberately the one O_DIRECT gives, and no more:
//!
//! - Writes and reads are positional, and both position and length are multiples of
//!   [`BLOCK_BYTES`]. Callers that append byte strings use [`crate::AppendFile`].
//! - A write that returned is *not* durable. Only a completed [`BlockFile::sync_data`]
//!   makes every write that returned before it durable. A crash may keep any subset
//!   of the 512-byte sectors written since the last completed sync, so a hole of
//!   zeros or stale bytes may sit in front of bytes that did survive.
//! - A failed `sync_data` says nothing about which of those writes survived.
//! - [`BlockFile::write_durable_with`] is a write and a sync in one device
//!   request (`O_DSYNC`): when it returns, its own bytes are durable, and
//!   nothing is said of other writes not yet synced (a device with FUA writes
//!   just these bytes through its cache).
//! - Directory operations ([`Storage::open`] with [`OpenMode::CreateOrOpen`],
//!   [`Storage::rename`], [`Storage::remove`]) sync the directory before they
//!   return: a file that was created is still there after a crash, and a rename is
//!   all or nothing.
//!
//! There is no default implementation of any method: each one states a durability
//! property that an implementation must decide to provide, not inherit.

use std::io;

/// Alignment and granularity of every device write and read, in bytes. 4 KiB is the
/// physical block size of the NVMe and virtio disks Narad targets; using it (rather
/// than the 512-byte logical size) means no read-modify-write inside the device.
pub const BLOCK_BYTES: usize = 4096;

/// The unit a crash keeps or loses atomically: a device sector.
pub const SECTOR_BYTES: usize = 512;

const _: () = assert!(BLOCK_BYTES % SECTOR_BYTES == 0);

/// An open file accessed with direct, block-aligned I/O.
#[allow(async_fn_in_trait)]
pub trait BlockFile {
    /// Writes `data` at `pos`. Both must be multiples of [`BLOCK_BYTES`]. The bytes
    /// are not durable until a later `sync_data` completes.
    async fn write_at(&self, pos: u64, data: &[u8]) -> io::Result<()>;

    /// Writes `len` bytes at `pos` that `fill` puts straight into the buffer the
    /// device reads from (whatever it held before is unspecified, so `fill` must
    /// set every byte): `write_at` of those bytes without first building them in
    /// a buffer of the caller's. Both aligned; durable like `write_at`.
    async fn write_with(
        &self,
        pos: u64,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> io::Result<()>;

    /// Writes `len` zero bytes at `pos` (both aligned), as `write_with` filling
    /// zeros would: the space a log prepares ahead of its appends. A file may
    /// serve it from zeroed buffers it keeps, rather than fill one per write.
    async fn write_zeros(&self, pos: u64, len: usize) -> io::Result<()> {
        self.write_with(pos, len, |zeros| zeros.fill(0)).await
    }

    /// [`BlockFile::write_with`] that returns only once these bytes are
    /// durable: one `O_DSYNC` write instead of a write and an `fdatasync`, so
    /// one device round trip. Only inside the file's size: a write that grows
    /// the file leaves the new size to the file system, which some kernels'
    /// ext4 did not make durable with it (`AppendFile` sends such a write as a
    /// write and a sync; see [`crate::append`]). Other writes not yet
    /// synced are not made durable by it. If it fails, which of its sectors
    /// survive is unknown, as after a failed `sync_data`, with one exception:
    /// a refusal for space ([`crate::out_of_space`]: a full file system or
    /// quota) means the write was refused before any byte of it was issued. (A device that reports a full
    /// disk once the write was issued gives an error of another kind.)
    async fn write_durable_with(
        &self,
        pos: u64,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> io::Result<()>;

    /// Writes `data` at `pos` (both aligned, as `write_at`) into the operating
    /// system's page cache rather than to the device: it returns once the kernel
    /// holds the bytes, so a crash of the process keeps them, and it costs no
    /// device request of its own. Durable, like `write_at`, only after a later
    /// `sync_data`, which writes them out; a crash of the machine before that
    /// may keep any subset of their sectors. For small records overwritten in
    /// place far more often than they are synced (the WAL's dispatch checkpoint,
    /// consumer state), where a device write per store would cost a device
    /// round trip that buys no durability.
    async fn write_cached_at(&self, pos: u64, data: &[u8]) -> io::Result<()>;

    /// Fills `buf` from the device at `pos`; both aligned. Bytes past the end of the
    /// file read as zeros. Returns the number of bytes that were inside the file.
    async fn read_at(&self, pos: u64, buf: &mut [u8]) -> io::Result<usize>;

    /// Reads `len` bytes at `pos` and hands them to `inspect` in the buffer the
    /// device filled, without copying them out; bytes past the end of the file
    /// read as zeros. Both aligned.
    async fn read_with<R>(
        &self,
        pos: u64,
        len: usize,
        inspect: impl FnOnce(&[u8]) -> R,
    ) -> io::Result<R>;

    /// `fdatasync`: makes every write that returned before this call durable.
    async fn sync_data(&self) -> io::Result<()>;

    /// The file's current size in bytes.
    async fn size(&self) -> io::Result<u64>;

    /// Sets the file's size. Growing fills with zeros. Durable after `sync_data`.
    async fn truncate(&self, len: u64) -> io::Result<()>;

    /// Allocates the file's blocks up to `len` bytes without changing its size
    /// (`fallocate` with `FALLOC_FL_KEEP_SIZE`), so that writes below `len`
    /// that grow the file cannot run out of space. A refusal for space
    /// ([`crate::out_of_space`]) means the file system or quota lacks the room;
    /// one of kind [`io::ErrorKind::Unsupported`], that it cannot reserve.
    async fn reserve(&self, len: u64) -> io::Result<()>;

    /// Closes the file; pending writes are not synced by closing.
    async fn close(self) -> io::Result<()>;

    /// Returns once the writes this task has issued so far are in the
    /// kernel's hands, not merely queued: the real disk's executor submits
    /// queued I/O only between rounds of its runnable tasks
    /// ([`crate::rt::after_reactor_poll`]). A file whose writes are done when
    /// issued has nothing to wait for.
    async fn issued_writes_submitted(&self) {}
}

/// A file shared between tasks of one shard: the partition log prepares the
/// space ahead of its appends from a task of its own. Closing closes the file
/// only through its last holder; the others just let go of it.
impl<F: BlockFile> BlockFile for std::rc::Rc<F> {
    async fn write_at(&self, pos: u64, data: &[u8]) -> io::Result<()> {
        (**self).write_at(pos, data).await
    }

    async fn write_with(
        &self,
        pos: u64,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> io::Result<()> {
        (**self).write_with(pos, len, fill).await
    }

    async fn write_zeros(&self, pos: u64, len: usize) -> io::Result<()> {
        (**self).write_zeros(pos, len).await
    }

    async fn write_durable_with(
        &self,
        pos: u64,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> io::Result<()> {
        (**self).write_durable_with(pos, len, fill).await
    }

    async fn write_cached_at(&self, pos: u64, data: &[u8]) -> io::Result<()> {
        (**self).write_cached_at(pos, data).await
    }

    async fn read_at(&self, pos: u64, buf: &mut [u8]) -> io::Result<usize> {
        (**self).read_at(pos, buf).await
    }

    async fn read_with<R>(
        &self,
        pos: u64,
        len: usize,
        inspect: impl FnOnce(&[u8]) -> R,
    ) -> io::Result<R> {
        (**self).read_with(pos, len, inspect).await
    }

    async fn sync_data(&self) -> io::Result<()> {
        (**self).sync_data().await
    }

    async fn size(&self) -> io::Result<u64> {
        (**self).size().await
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        (**self).truncate(len).await
    }

    async fn reserve(&self, len: u64) -> io::Result<()> {
        (**self).reserve(len).await
    }

    async fn issued_writes_submitted(&self) {
        (**self).issued_writes_submitted().await
    }

    async fn close(self) -> io::Result<()> {
        match std::rc::Rc::try_unwrap(self) {
            Ok(file) => file.close().await,
            Err(_) => Ok(()),
        }
    }
}

/// How [`Storage::open`] treats a missing or existing file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// The file must exist.
    Existing,
    /// Create the file if it is missing; keep it otherwise. Either way the
    /// directory is synced, since an earlier process may have created the file
    /// and died before its entry was durable.
    CreateOrOpen,
}

/// A namespace of files below one root directory, addressed by relative paths with
/// `/` separators. Cheap to clone: every clone addresses the same files.
#[allow(async_fn_in_trait)]
pub trait Storage: Clone + 'static {
    /// The file type this storage opens.
    type File: BlockFile + 'static;

    /// Opens a file for reading and writing.
    async fn open(&self, path: &str, mode: OpenMode) -> io::Result<Self::File>;

    /// The size in bytes of the file at `path`, without opening it (one
    /// `stat`): for files whose size is all a caller needs.
    async fn size_of(&self, path: &str) -> io::Result<u64>;

    /// Renames `from` to `to`, replacing `to`, and syncs the directory.
    async fn rename(&self, from: &str, to: &str) -> io::Result<()>;

    /// Removes a file and syncs its directory. A missing file is not an error.
    async fn remove(&self, path: &str) -> io::Result<()>;

    /// Syncs the directory `dir`: the changes made to its entries become
    /// durable. For a rename that was made and whose own sync then failed.
    async fn sync_dir(&self, dir: &str) -> io::Result<()>;

    /// Removes the files `names` of `dir` in order, then syncs `dir` once: a
    /// batch of deletions for one directory sync. A missing file is not an
    /// error; the first file that cannot be removed stops the batch. Returns how
    /// many were removed (or found missing) and the outcome: after a failed sync
    /// every one of them is gone from the directory, maybe not durably.
    async fn remove_in(&self, dir: &str, names: &[String]) -> (usize, io::Result<()>);

    /// Creates a directory and its parents, syncing each parent it changed.
    async fn create_dir_all(&self, path: &str) -> io::Result<()>;

    /// Removes a directory and everything below it, then syncs its parent.
    async fn remove_dir_all(&self, path: &str) -> io::Result<()>;

    /// Names of the entries directly inside `dir`, sorted. Missing dir: empty.
    async fn list(&self, dir: &str) -> io::Result<Vec<String>>;

    /// Bytes this storage may still allocate before writes fail with `ENOSPC`, when
    /// the implementation knows (the fault-injecting disk does; the real one says
    /// `None`).
    fn space_left_bytes(&self) -> Option<u64>;
}

/// Joins a directory and a name into a storage path.
pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}
