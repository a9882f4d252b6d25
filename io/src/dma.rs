//! The real disk: O_DIRECT files on io_uring through glommio's `DmaFile`.
//!
//! Runs on every shard; each shard opens its own files and nothing is shared across
//! cores. glommio takes ownership of a write's buffer for the duration of the
//! I/O, so every write goes out of a DMA buffer allocated for it: `write_with`
//! lets the caller lay its bytes out there directly (the appender copies its
//! tail, frames and padding in once per group commit, not per record), and
//! `write_at` copies a caller's buffer in. `read_with` likewise shows the caller
//! the DMA buffer a read filled. Directory operations go through glommio's
//! `Directory` so the directory `fsync` also runs on the ring; renames and
//! removals go to glommio's blocking thread pool (an unlink of a 64 MiB segment
//! may take milliseconds in the file system, which would stall every partition of
//! the shard if it ran on the reactor).
//!
//! glommio decides once per device and thread whether O_DIRECT I/O may use its
//! polled ring, by reading the first sector of the first file opened there, and
//! caches the answer. [`DmaStorage::open`] settles that probe with a file that
//! holds a block (see `settle_iopoll_probe`) before it opens anything else.
//!
//! A fault hook for black-box tests: [`DmaStorage::with_write_budget`] gives a
//! storage (and its clones, and the files they open) a number of bytes it may
//! write in total; the write that would cross it fails with `ENOSPC` and writes
//! nothing, as a full disk would. It lets a test of the real binary fail one
//! durable structure's writes while the rest of the node runs on the real disk.
//! Without a budget a write costs one `Option` check.

use std::cell::{Cell, OnceCell, RefCell};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use glommio::io::{BufferedFile, DmaFile, OpenOptions};

use crate::file::{join, BlockFile, OpenMode, Storage, BLOCK_BYTES};
use crate::is_aligned;

/// Files below a root directory on a real file system.
#[derive(Clone, Debug)]
pub struct DmaStorage {
    root: Rc<PathBuf>,
    /// Bytes writes may still take before they fail with `ENOSPC`; `None` is no
    /// limit. Shared by every clone and every file opened through them.
    write_budget_left_bytes: Option<Rc<Cell<u64>>>,
}

impl DmaStorage {
    /// Addresses the files below `root`, which must exist.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        // glommio opens files relative to no directory descriptor, so a relative
        // path fails with EBADF: anchor the root at the working directory once.
        let root = root.into();
        let root = std::path::absolute(&root).unwrap_or(root);
        Self {
            root: Rc::new(root),
            write_budget_left_bytes: None,
        }
    }

    /// A fault hook: writes through this storage, its later clones and the files
    /// they open may take `bytes` in total. The write that would cross the budget
    /// fails with `ENOSPC` and writes nothing, and so does every later write
    /// larger than what is left. Reads, syncs and directory operations are free.
    pub fn with_write_budget(self, bytes: u64) -> Self {
        Self {
            write_budget_left_bytes: Some(Rc::new(Cell::new(bytes))),
            ..self
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        assert!(!rel.starts_with('/'), "storage paths are relative: {rel}");
        self.root.join(rel)
    }

    /// [`Self::sync_parent`], and nothing when the parent is gone too.
    async fn sync_parent_if_present(&self, rel: &str) -> io::Result<()> {
        match self.sync_parent(rel).await {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            synced => synced,
        }
    }

    async fn sync_parent(&self, rel: &str) -> io::Result<()> {
        let full = self.path(rel);
        let parent = full.parent().unwrap_or(&full).to_path_buf();
        let dir = glommio::io::Directory::open(&parent).await?;
        dir.sync().await?;
        dir.close().await?;
        Ok(())
    }
}

/// One O_DIRECT file.
#[derive(Debug)]
pub struct DmaBlockFile {
    file: DmaFile,
    /// The same file opened again with `O_DSYNC`, on its first durable write:
    /// glommio takes no per-write flags, so `RWF_DSYNC` is had through a second
    /// descriptor. `Err` once opening it failed: durable writes then fall back
    /// to a write and an `fdatasync`.
    durable: OnceCell<Result<DmaFile, ()>>,
    /// The same file opened again without `O_DIRECT`, on its first cached write
    /// (`write_cached_at`), whose writes land in the page cache. `Err` once
    /// opening it failed: cached writes then go to the device as `write_at`.
    cached: OnceCell<Result<BufferedFile, ()>>,
    /// The budget of the storage that opened it, if any.
    write_budget_left_bytes: Option<Rc<Cell<u64>>>,
}

impl DmaBlockFile {
    /// `fstat` of the open file, by its descriptor (answered from the inode
    /// without the device): glommio's `file_size` asks by path, which after a
    /// rename or remove names another file or none.
    fn stat(&self) -> io::Result<libc::stat> {
        let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&self.file);
        // SAFETY: `stat` is valid for writes of a `struct stat`, which fstat
        // fills on success; it is read only then.
        let done = unsafe { libc::fstat(fd, stat.as_mut_ptr()) };
        if done != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fstat succeeded, so it initialised `stat`.
        Ok(unsafe { stat.assume_init() })
    }

    /// The raw file descriptor, for benchmarks that count syscalls.
    pub fn inner(&self) -> &DmaFile {
        &self.file
    }

    /// Whether durable writes go out through an `O_DSYNC` descriptor (rather
    /// than falling back to a write and an `fdatasync`).
    pub fn has_durable_descriptor(&self) -> bool {
        matches!(self.durable.get(), Some(Ok(_)))
    }

    /// Checks a write's alignment and takes its `len` bytes from the write
    /// budget, or fails as a full disk would; `false` for an empty write, which
    /// goes nowhere. Charged before the write is issued, so that writes in
    /// flight at once on this thread cannot together overrun the budget.
    fn admit(&self, pos: u64, len: usize) -> io::Result<bool> {
        assert!(is_aligned(pos) && is_aligned(len as u64));
        if len == 0 {
            return Ok(false);
        }
        if let Some(left) = &self.write_budget_left_bytes {
            if len as u64 > left.get() {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            left.set(left.get() - len as u64);
        }
        Ok(true)
    }

    /// The `O_DSYNC` descriptor, opened on first use through `/proc/self/fd`
    /// (the file may have been renamed since it was opened). `None` if that
    /// cannot be opened here.
    async fn durable_file(&self) -> Option<&DmaFile> {
        if self.durable.get().is_none() {
            use std::os::fd::AsRawFd;
            let path = format!("/proc/self/fd/{}", self.file.as_raw_fd());
            let opened = OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DSYNC)
                .dma_open(&path)
                .await;
            let opened = opened.map_err(|e| {
                tracing::warn!(error = %e, "cannot open a file again with O_DSYNC; durable writes fall back to write and fdatasync");
            });
            if let Err(Ok(lost)) = self.durable.set(opened) {
                // Another write of this file opened it first.
                let _ = lost.close().await;
            }
        }
        self.durable.get().and_then(|d| d.as_ref().ok())
    }

    /// The page-cache descriptor, opened on first use through `/proc/self/fd`
    /// as the `O_DSYNC` one is. `None` if that cannot be opened here.
    async fn cached_file(&self) -> Option<&BufferedFile> {
        if self.cached.get().is_none() {
            use std::os::fd::AsRawFd;
            let path = format!("/proc/self/fd/{}", self.file.as_raw_fd());
            let opened = OpenOptions::new()
                .read(true)
                .write(true)
                .buffered_open(&path)
                .await;
            let opened = opened.map_err(|e| {
                tracing::warn!(error = %e, "cannot open a file again for page-cache writes; they go to the device");
            });
            if let Err(Ok(lost)) = self.cached.set(opened) {
                // Another write of this file opened it first.
                let _ = lost.close().await;
            }
        }
        self.cached.get().and_then(|c| c.as_ref().ok())
    }

    /// `e` from the `O_DSYNC` or page-cache descriptor, which the runtime
    /// names by the `/proc/self/fd` link it was opened through, with the path
    /// this file was opened by added (its name then: a rename since leaves it
    /// stale, still more use to an operator than a descriptor number). Kind
    /// and text are kept, so callers that sort errors still can.
    pub fn named(&self, e: io::Error) -> io::Error {
        let text = e.to_string();
        if !text.contains("/proc/self/fd/") {
            return e;
        }
        match self.file.path() {
            Some(path) => io::Error::new(
                e.kind(),
                format!("{text} (a second descriptor of {})", path.display()),
            ),
            None => e,
        }
    }

    async fn write_on(
        file: &DmaFile,
        pos: u64,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> io::Result<()> {
        let mut buf = file.alloc_dma_buffer(len);
        fill(buf.as_bytes_mut());
        let written = file.write_at(buf, pos).await?;
        if written != len {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write: {written} of {len} bytes"),
            ));
        }
        Ok(())
    }
}

/// Zeroed buffers a shard writes again and again (each only ever read by the
/// device): the partition logs prepare their space in chunks of a few sizes
/// (powers of two from a sixteenth of `prep_chunk_bytes` to all of it, under
/// 2 MiB together by default), so each size is allocated and zeroed once per
/// shard instead of once per chunk. At most [`ZERO_BUFFERS_MAX`] are kept.
/// They belong to the executor that allocated them (a buffer may be one its
/// ring registered, which no other ring can write from), so a thread that runs
/// a new executor starts over.
const ZERO_BUFFERS_MAX: usize = 8;

/// The executor the buffers were allocated under, and the buffers.
type ZeroBuffers = (usize, Vec<Rc<glommio::io::DmaBuffer>>);

thread_local! {
    static ZERO_BUFFERS: RefCell<ZeroBuffers> = const { RefCell::new((0, Vec::new())) };
}

/// A zeroed buffer of `len` bytes, shared with the writes before it.
fn zero_buffer(file: &DmaFile, len: usize) -> Rc<glommio::io::DmaBuffer> {
    let executor = glommio::executor().id();
    ZERO_BUFFERS.with(|kept| {
        let mut kept = kept.borrow_mut();
        let (owner, kept) = &mut *kept;
        if *owner != executor {
            kept.clear();
            *owner = executor;
        }
        if let Some(found) = kept.iter().find(|b| b.len() == len) {
            return found.clone();
        }
        let mut buffer = file.alloc_dma_buffer(len);
        buffer.as_bytes_mut().fill(0);
        let buffer = Rc::new(buffer);
        if kept.len() == ZERO_BUFFERS_MAX {
            kept.remove(0);
        }
        kept.push(buffer.clone());
        buffer
    })
}

impl BlockFile for DmaBlockFile {
    async fn write_at(&self, pos: u64, data: &[u8]) -> io::Result<()> {
        self.write_with(pos, data.len(), |buf| buf.copy_from_slice(data))
            .await
    }

    async fn write_with(
        &self,
        pos: u64,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> io::Result<()> {
        if !self.admit(pos, len)? {
            return Ok(());
        }
        Self::write_on(&self.file, pos, len, fill).await
    }

    async fn write_zeros(&self, pos: u64, len: usize) -> io::Result<()> {
        if !self.admit(pos, len)? {
            return Ok(());
        }
        let zeros = zero_buffer(&self.file, len);
        let written = self.file.write_rc_at(zeros, pos).await?;
        if written != len {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write: {written} of {len} bytes"),
            ));
        }
        Ok(())
    }

    async fn write_durable_with(
        &self,
        pos: u64,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> io::Result<()> {
        if !self.admit(pos, len)? {
            return Ok(());
        }
        let issued = match self.durable_file().await {
            Some(durable) => Self::write_on(durable, pos, len, fill).await,
            None => {
                // A plain write refused for space was refused whole: its error
                // stays what it is. Only the sync's errors are ambiguous.
                Self::write_on(&self.file, pos, len, fill).await?;
                self.file.fdatasync().await.map_err(io::Error::from)
            }
        };
        // The kernel may report a full disk after the write went out (the sync
        // half, or a file system that allocates late): not a clean refusal.
        issued
            .map_err(|e| self.named(e))
            .map_err(|e| match crate::out_of_space(&e) {
                true => io::Error::other(format!(
                    "durable write of {len} bytes at {pos} failed after it was issued: {e}"
                )),
                false => e,
            })
    }

    /// A write on the page-cache descriptor, through the ring like every other
    /// I/O here: a buffered write may wait (on the file system's journal for
    /// the time update, on dirty-page throttling, on reclaim), which the ring
    /// hands to one of its worker threads rather than stall the shard. The
    /// `fdatasync` of `sync_data` (on either descriptor: both share the inode's
    /// cache) writes the bytes out, and a direct read of the range writes them
    /// out before it reads.
    async fn write_cached_at(&self, pos: u64, data: &[u8]) -> io::Result<()> {
        if !self.admit(pos, data.len())? {
            return Ok(());
        }
        match self.cached_file().await {
            Some(file) => {
                let written = file
                    .write_at(data.to_vec(), pos)
                    .await
                    .map_err(|e| self.named(e.into()))?;
                if written != data.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!("short cached write: {written} of {} bytes", data.len()),
                    ));
                }
                Ok(())
            }
            None => {
                Self::write_on(&self.file, pos, data.len(), |buf| buf.copy_from_slice(data)).await
            }
        }
    }

    async fn read_with<R>(
        &self,
        pos: u64,
        len: usize,
        inspect: impl FnOnce(&[u8]) -> R,
    ) -> io::Result<R> {
        assert!(is_aligned(pos) && is_aligned(len as u64));
        let got = self.file.read_at_aligned(pos, len).await?;
        if got.len() == len {
            return Ok(inspect(&got));
        }
        // Short: the file ends inside the range (or the read stopped early).
        // Rare, so the general path copies and zero-fills.
        let mut buf = vec![0u8; len];
        self.read_at(pos, &mut buf).await?;
        Ok(inspect(&buf))
    }

    async fn read_at(&self, pos: u64, buf: &mut [u8]) -> io::Result<usize> {
        assert!(is_aligned(pos) && is_aligned(buf.len() as u64));
        fill_by_reads(pos, buf, async |at, want| {
            Ok(self.file.read_at_aligned(at, want).await?)
        })
        .await
    }

    async fn sync_data(&self) -> io::Result<()> {
        self.file.fdatasync().await?;
        Ok(())
    }

    /// The open file's size, by its descriptor ([`DmaBlockFile::stat`]).
    async fn size(&self) -> io::Result<u64> {
        Ok(self.stat()?.st_size as u64)
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        self.file.truncate(len).await?;
        Ok(())
    }

    /// `fallocate(FALLOC_FL_KEEP_SIZE)`, then a check that the blocks are
    /// there: some file systems (ZFS) answer it with a check of free space and
    /// allocate nothing, which guarantees no later write. Those say
    /// [`io::ErrorKind::Unsupported`].
    async fn reserve(&self, len: u64) -> io::Result<()> {
        self.file.pre_allocate(len, true).await?;
        let allocated = self.stat()?.st_blocks as u64 * 512;
        if allocated < len {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("the file system allocated {allocated} of the {len} bytes reserved"),
            ));
        }
        Ok(())
    }

    async fn issued_writes_submitted(&self) {
        crate::rt::after_reactor_poll().await;
    }

    async fn close(self) -> io::Result<()> {
        let durable = match self.durable.into_inner() {
            Some(Ok(durable)) => durable.close().await,
            _ => Ok(()),
        };
        if let Some(Ok(cached)) = self.cached.into_inner() {
            // Its writes are the inode's, synced through either descriptor:
            // closing it loses nothing.
            let _ = cached.close().await;
        }
        self.file.close().await?;
        durable?;
        Ok(())
    }
}

const _: () = assert!(BLOCK_BYTES >= 512);

/// Fills `buf` from `pos` by reads of `read(at, want)`, and zeroes what is past
/// the end of the file; returns the bytes read. A read may return short without
/// the file ending (an interrupted or split request), so only an empty read, or
/// one that ends off a block boundary (the file ends inside that block), is the
/// end: taking any short read for it would make a recovery scan see a file end
/// early and truncate acknowledged records after it.
async fn fill_by_reads<B: std::ops::Deref<Target = [u8]>>(
    pos: u64,
    buf: &mut [u8],
    mut read: impl AsyncFnMut(u64, usize) -> io::Result<B>,
) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        let want = buf.len() - filled;
        let got = read(pos + filled as u64, want).await?;
        let n = got.len().min(want);
        buf[filled..filled + n].copy_from_slice(&got[..n]);
        filled += n;
        if n == 0 || !is_aligned(n as u64) {
            break;
        }
    }
    buf[filled..].fill(0);
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A "file" of `len` bytes of `0xAB` whose reads return at most `cap` bytes.
    fn reader(len: u64, cap: usize) -> impl AsyncFnMut(u64, usize) -> io::Result<Vec<u8>> {
        async move |at: u64, want: usize| {
            let left = len.saturating_sub(at) as usize;
            Ok(vec![0xAB; want.min(left).min(cap)])
        }
    }

    fn run(f: impl std::future::Future<Output = io::Result<usize>>) -> usize {
        futures_lite::future::block_on(f).unwrap()
    }

    #[test]
    fn short_reads_inside_the_file_are_continued() {
        let mut buf = vec![0u8; 4 * BLOCK_BYTES];
        let filled = run(fill_by_reads(0, &mut buf, reader(1 << 20, BLOCK_BYTES)));
        assert_eq!(filled, buf.len());
        assert!(buf.iter().all(|&b| b == 0xAB));
    }

    #[test]
    fn the_end_of_the_file_stops_the_fill_and_zeroes_the_rest() {
        // Ends on a block boundary: the next read is empty.
        let mut buf = vec![0xFFu8; 4 * BLOCK_BYTES];
        let filled = run(fill_by_reads(
            0,
            &mut buf,
            reader(2 * BLOCK_BYTES as u64, usize::MAX),
        ));
        assert_eq!(filled, 2 * BLOCK_BYTES);
        assert!(buf[..filled].iter().all(|&b| b == 0xAB));
        assert!(buf[filled..].iter().all(|&b| b == 0));
        // Ends inside a block: that short read is the end.
        let mut buf = vec![0xFFu8; 4 * BLOCK_BYTES];
        let end = BLOCK_BYTES as u64 + 100;
        let filled = run(fill_by_reads(0, &mut buf, reader(end, usize::MAX)));
        assert_eq!(filled as u64, end);
        assert!(buf[filled..].iter().all(|&b| b == 0));
    }

    /// A file of another user refuses `O_NOATIME` with EPERM, which glommio's
    /// open reports wrapped: the open must still be retried without it.
    #[test]
    fn a_refused_no_atime_is_recognised_however_it_is_wrapped() {
        let eperm = || io::Error::from_raw_os_error(libc::EPERM);
        let wrapped: glommio::GlommioError<()> = glommio::GlommioError::EnhancedIoError {
            source: eperm(),
            op: "Opening",
            path: Some("segment".into()),
            fd: None,
        };
        assert!(no_atime_refused(&wrapped));
        assert!(no_atime_refused(&glommio::GlommioError::<()>::IoError(
            eperm()
        )));
        let missing: glommio::GlommioError<()> = glommio::GlommioError::EnhancedIoError {
            source: io::Error::from_raw_os_error(libc::ENOENT),
            op: "Opening",
            path: None,
            fd: None,
        };
        assert!(!no_atime_refused(&missing));
    }
}

impl Storage for DmaStorage {
    type File = DmaBlockFile;

    async fn open(&self, path: &str, mode: OpenMode) -> io::Result<DmaBlockFile> {
        settle_iopoll_probe(&self.root).await?;
        let full = self.path(path);
        let open = async |flags| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(mode == OpenMode::CreateOrOpen)
                .custom_flags(flags)
                .dma_open(&full)
                .await
        };
        // No access time: every commit's read-back, and every consumer read
        // from the disk, would otherwise move it after each write moved the
        // modification time (relatime), dirtying the inode for the next sync
        // to write out (a journal handle per read where there is a journal).
        // Only the file's owner may ask; a file of another user is opened
        // without it.
        let file = match open(libc::O_NOATIME).await {
            Err(e) if no_atime_refused(&e) => open(0).await?,
            opened => opened?,
        };
        // Sync the directory even when the file already existed: an earlier life
        // may have created it and died before its directory entry was durable.
        if mode == OpenMode::CreateOrOpen {
            self.sync_parent(path).await?;
        }
        Ok(DmaBlockFile {
            file,
            durable: OnceCell::new(),
            cached: OnceCell::new(),
            write_budget_left_bytes: self.write_budget_left_bytes.clone(),
        })
    }

    async fn size_of(&self, path: &str) -> io::Result<u64> {
        Ok(std::fs::metadata(self.path(path))?.len())
    }

    async fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        glommio::io::rename(self.path(from), self.path(to)).await?;
        self.sync_parent(to).await?;
        // Across directories the source's entry must be gone durably too.
        if Path::new(from).parent() != Path::new(to).parent() {
            self.sync_parent(from).await?;
        }
        Ok(())
    }

    /// A file already gone still gets its directory synced: an earlier
    /// attempt may have removed it and then failed that sync.
    async fn remove(&self, path: &str) -> io::Result<()> {
        match glommio::io::remove(self.path(path))
            .await
            .map_err(io::Error::from)
        {
            Ok(()) => self.sync_parent(path).await,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.sync_parent_if_present(path).await
            }
            Err(e) => Err(e),
        }
    }

    async fn remove_in(&self, dir: &str, names: &[String]) -> (usize, io::Result<()>) {
        let mut removed = 0;
        let mut outcome = Ok(());
        for name in names {
            match glommio::io::remove(self.path(&join(dir, name)))
                .await
                .map_err(io::Error::from)
            {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => removed += 1,
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        if removed > 0 {
            let synced = async {
                let dir = glommio::io::Directory::open(self.path(dir)).await?;
                dir.sync().await?;
                dir.close().await?;
                Ok::<(), io::Error>(())
            }
            .await;
            outcome = outcome.and(synced);
        }
        (removed, outcome)
    }

    async fn create_dir_all(&self, path: &str) -> io::Result<()> {
        std::fs::create_dir_all(self.path(path))?;
        // Sync every level that may have gained an entry, innermost last, even
        // when the directory existed: an earlier life may have died before its
        // entry was durable.
        let mut rel = String::new();
        for part in path.split('/') {
            rel = crate::file::join(&rel, part);
            self.sync_parent(&rel).await?;
        }
        Ok(())
    }

    async fn remove_dir_all(&self, path: &str) -> io::Result<()> {
        match std::fs::remove_dir_all(self.path(path)) {
            Ok(()) => self.sync_parent(path).await,
            // As for `remove`: the sync an earlier attempt failed.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.sync_parent_if_present(path).await
            }
            Err(e) => Err(e),
        }
    }

    async fn sync_dir(&self, dir: &str) -> io::Result<()> {
        let dir = glommio::io::Directory::open(self.path(dir)).await?;
        dir.sync().await?;
        dir.close().await?;
        Ok(())
    }

    async fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let full = self.path(dir);
        let entries = match std::fs::read_dir(&full) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut names = Vec::new();
        for entry in entries {
            let name = entry?.file_name().to_string_lossy().into_owned();
            // Another task of this shard may be between creating and removing a
            // probe file; it is never part of the namespace callers see.
            if !name.starts_with(IOPOLL_PROBE_PREFIX) {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    fn space_left_bytes(&self) -> Option<u64> {
        None
    }
}

/// Whether an open failed only because `O_NOATIME` was asked for a file of
/// another user (EPERM), however glommio wrapped the error (its opens report
/// an `EnhancedIoError`).
fn no_atime_refused<T>(error: &glommio::GlommioError<T>) -> bool {
    error.raw_os_error() == Some(libc::EPERM)
}

/// Name prefix of the files that settle glommio's iopoll probe.
const IOPOLL_PROBE_PREFIX: &str = ".iopoll-probe";
/// The probe file kept in a storage root (see [`settle_iopoll_probe`]).
const IOPOLL_PROBE_FILE: &str = ".iopoll-probe";

/// Probe files made by this process, so that shards probing the same directory
/// at once never write one file.
static IOPOLL_PROBE_FILES_CREATED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Devices (`st_dev`) on which this thread's glommio has cached a true answer.
    /// A process sees a handful of devices, so a list is enough.
    static IOPOLL_PROBED_DEVICES: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Makes glommio's iopoll probe for `root`'s device read real bytes from the device.
///
/// The probe's read of an empty file ends at end-of-file without reaching the
/// device, so it succeeds even where the device has no poll queues (a virtio disk,
/// for one). glommio then caches "pollable" for the device and every
/// later read on it fails with `EOPNOTSUPP`. A new segment is exactly such an empty
/// file, so before the first open on a device this opens a synced one-block file
/// instead, which lets the probe see the device's true answer. Files below `root`
/// are assumed to live on `root`'s device.
///
/// The file ([`IOPOLL_PROBE_FILE`]) stays in `root` from one start to the next:
/// a node restarted on a full (or read-only) disk finds it and opens it without
/// writing a byte, where having to write one first would stop every open, the
/// recovery that could free space included. It is made under a name of its own
/// and renamed into place whole, so shards probing at once never open a file
/// another is still writing.
async fn settle_iopoll_probe(root: &Path) -> io::Result<()> {
    let device = std::fs::metadata(root)?.dev();
    if IOPOLL_PROBED_DEVICES.with(|devices| devices.borrow().contains(&device)) {
        return Ok(());
    }
    let probe = root.join(IOPOLL_PROBE_FILE);
    let ready = std::fs::metadata(&probe).is_ok_and(|m| m.len() >= BLOCK_BYTES as u64);
    if !ready {
        let serial = IOPOLL_PROBE_FILES_CREATED.fetch_add(1, Ordering::Relaxed);
        let making = root.join(format!(
            "{IOPOLL_PROBE_PREFIX}.{}.{serial}",
            std::process::id()
        ));
        let made = (|| {
            std::fs::write(&making, [0u8; BLOCK_BYTES])?;
            // Synced so that the block is allocated and written: a read of a
            // delayed or unwritten extent would again be answered without the
            // device.
            std::fs::File::open(&making)?.sync_data()?;
            std::fs::rename(&making, &probe)
        })();
        if made.is_err() {
            let _ = std::fs::remove_file(&making);
        }
        made?;
    }
    DmaFile::open(&probe).await?.close().await?;
    IOPOLL_PROBED_DEVICES.with(|devices| devices.borrow_mut().push(device));
    Ok(())
}
