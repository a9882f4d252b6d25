//! A smoke test of the real disk: O_DIRECT files on io_uring through `DmaStorage`.
//!
//! It cannot crash the machine, so it checks only what a single process can see:
//! bytes appended and synced read back through O_DIRECT after the file is closed and
//! reopened, and the directory operations do what the `Storage` contract says. The
//! files live under the build's temporary directory rather than `/tmp`, because
//! `/tmp` is often tmpfs, which may refuse O_DIRECT.

use std::io;

use narad_io::append::read_exact_at;
use narad_io::dma::DmaStorage;
use narad_io::file::OpenMode;
use narad_io::{rt, AppendFile, BlockFile, Storage, BLOCK_BYTES};

fn record(i: usize) -> Vec<u8> {
    // Lengths that are not multiples of anything, so appends straddle blocks.
    let len = 1 + (i * 977) % 9000;
    (0..len).map(|j| (i * 31 + j) as u8).collect()
}

async fn append_sync_reopen_read(storage: DmaStorage) -> io::Result<()> {
    storage.create_dir_all("topics/orders").await?;
    let path = "topics/orders/00000000.log";
    let mut expected = Vec::new();
    let mut file =
        AppendFile::open_at(storage.open(path, OpenMode::CreateOrOpen).await?, 0).await?;
    for i in 0..20 {
        let bytes = record(i);
        let (head, rest) = bytes.split_at(bytes.len() / 2);
        file.append(&[head, rest]).await?;
        expected.extend_from_slice(&bytes);
        if i % 5 == 4 {
            file.sync().await?;
        }
    }
    file.sync().await?;
    assert_eq!(file.len(), expected.len() as u64);
    file.into_file().close().await?;

    let reopened = storage.open(path, OpenMode::Existing).await?;
    let size = reopened.size().await?;
    assert_eq!(
        size % BLOCK_BYTES as u64,
        0,
        "the device saw only whole blocks"
    );
    assert!(size >= expected.len() as u64);
    assert_eq!(read_exact_at(&reopened, 0, expected.len()).await?, expected);
    // An unaligned read in the middle exercises the skip and truncate of the helper.
    assert_eq!(
        read_exact_at(&reopened, 5000, 3000).await?,
        expected[5000..8000]
    );

    // Carry on appending after the reopen, from the logical length.
    let mut file = AppendFile::open_at(reopened, expected.len() as u64).await?;
    file.append(&[b"tail"]).await?;
    file.sync().await?;
    expected.extend_from_slice(b"tail");
    assert_eq!(
        read_exact_at(file.file(), 0, expected.len()).await?,
        expected
    );
    file.into_file().close().await?;

    // Reads past the end come back as zeros and report only the bytes inside.
    let file = storage.open(path, OpenMode::Existing).await?;
    let mut buf = vec![0xAAu8; 2 * BLOCK_BYTES];
    let inside = file.read_at(size + BLOCK_BYTES as u64, &mut buf).await?;
    assert!(inside <= buf.len());
    assert!(buf[inside..].iter().all(|&b| b == 0));
    file.close().await?;
    Ok(())
}

async fn rename_remove_list(storage: DmaStorage) -> io::Result<()> {
    storage.create_dir_all("state").await?;
    let tmp = storage
        .open("state/offset.tmp", OpenMode::CreateOrOpen)
        .await?;
    let block = vec![7u8; BLOCK_BYTES];
    tmp.write_at(0, &block).await?;
    tmp.sync_data().await?;
    tmp.close().await?;
    storage.rename("state/offset.tmp", "state/offset").await?;
    assert_eq!(storage.list("state").await?, vec!["offset"]);
    // A directory is synced on its own (a rename's sync done again).
    storage.sync_dir("state").await?;
    assert_eq!(
        storage.sync_dir("nowhere").await.err().map(|e| e.kind()),
        Some(io::ErrorKind::NotFound)
    );
    assert_eq!(storage.size_of("state/offset").await?, BLOCK_BYTES as u64);
    assert_eq!(
        storage.size_of("state/none").await.err().map(|e| e.kind()),
        Some(io::ErrorKind::NotFound)
    );

    let renamed = storage.open("state/offset", OpenMode::Existing).await?;
    let mut buf = vec![0u8; BLOCK_BYTES];
    assert_eq!(renamed.read_at(0, &mut buf).await?, BLOCK_BYTES);
    assert_eq!(buf, block);
    renamed.close().await?;

    for name in ["b", "a", "c"] {
        storage
            .open(&format!("state/{name}"), OpenMode::CreateOrOpen)
            .await?
            .close()
            .await?;
    }
    assert_eq!(storage.list("state").await?, vec!["a", "b", "c", "offset"]);
    storage.remove("state/b").await?;
    storage.remove("state/b").await?;
    assert_eq!(storage.list("state").await?, vec!["a", "c", "offset"]);
    let missing = storage.open("state/b", OpenMode::Existing).await;
    assert_eq!(
        missing.err().map(|e| e.kind()),
        Some(io::ErrorKind::NotFound)
    );

    storage.remove_dir_all("state").await?;
    storage.remove_dir_all("state").await?;
    assert!(storage.list("state").await?.is_empty());
    assert!(storage.space_left_bytes().is_none());
    Ok(())
}

/// Regression: glommio probed iopoll support with the first file opened on a
/// device; a new, empty file made the probe pass on a disk without poll queues, and
/// every later O_DIRECT read failed with EOPNOTSUPP.
async fn first_open_is_a_new_empty_file(storage: DmaStorage) -> io::Result<()> {
    let file = storage.open("fresh", OpenMode::CreateOrOpen).await?;
    let block = vec![3u8; BLOCK_BYTES];
    file.write_at(0, &block).await?;
    file.sync_data().await?;
    // An overwrite of a written block, then a read: the two operations that took
    // the polled path and failed.
    let block = vec![4u8; BLOCK_BYTES];
    file.write_at(0, &block).await?;
    let mut buf = vec![0u8; BLOCK_BYTES];
    assert_eq!(file.read_at(0, &mut buf).await?, BLOCK_BYTES);
    assert_eq!(buf, block);
    file.close().await?;
    // The file that settled the probe is gone and was never listed.
    assert_eq!(storage.list("").await?, vec!["fresh"]);
    Ok(())
}

/// The write budget refuses the write that would cross it, with `ENOSPC`, and that
/// write leaves the file as it was; clones and every file they open share it.
async fn write_budget_refuses_the_crossing_write(storage: DmaStorage) -> io::Result<()> {
    let budgeted = storage.clone().with_write_budget(3 * BLOCK_BYTES as u64);
    let file = budgeted.open("a", OpenMode::CreateOrOpen).await?;
    let other = budgeted.clone().open("b", OpenMode::CreateOrOpen).await?;
    file.write_at(0, &vec![1u8; 2 * BLOCK_BYTES]).await?;
    let two_blocks = vec![2u8; 2 * BLOCK_BYTES];
    let crossing = file.write_at(2 * BLOCK_BYTES as u64, &two_blocks).await;
    let refused = crossing.expect_err("the write crossing the budget fails");
    assert_eq!(refused.raw_os_error(), Some(libc::ENOSPC), "{refused}");
    assert_eq!(
        file.size().await?,
        2 * BLOCK_BYTES as u64,
        "nothing written"
    );
    // What is left (one block) is shared: a clone's file may take it, then nothing.
    other.write_at(0, &vec![3u8; BLOCK_BYTES]).await?;
    let one_block = vec![4u8; BLOCK_BYTES];
    let spent = file.write_at(2 * BLOCK_BYTES as u64, &one_block).await;
    let refused = spent.expect_err("the budget is spent");
    assert_eq!(refused.raw_os_error(), Some(libc::ENOSPC));
    // Reads and syncs still work, and a storage without the budget writes freely.
    file.sync_data().await?;
    let mut buf = vec![0u8; 2 * BLOCK_BYTES];
    assert_eq!(file.read_at(0, &mut buf).await?, 2 * BLOCK_BYTES);
    assert!(buf.iter().all(|&b| b == 1));
    file.close().await?;
    other.close().await?;
    let free = storage.open("a", OpenMode::Existing).await?;
    free.write_at(2 * BLOCK_BYTES as u64, &vec![5u8; 4 * BLOCK_BYTES])
        .await?;
    free.close().await?;
    Ok(())
}

/// Durable appends go out through the file's `O_DSYNC` descriptor, which is
/// opened through the first one, so a file renamed after it was opened still
/// gets its own bytes. The file is prepared (zeros written and synced) first:
/// a durable append that grows a file is a write and a sync instead.
async fn durable_appends_after_a_rename(storage: DmaStorage) -> io::Result<()> {
    let prepared = storage.open("a", OpenMode::CreateOrOpen).await?;
    prepared.write_at(0, &vec![0u8; 2 << 20]).await?;
    prepared.sync_data().await?;
    let mut file = AppendFile::open_at(prepared, 0).await?;
    file.append_durable(&[b"first "]).await?;
    assert!(
        file.file().has_durable_descriptor(),
        "O_DSYNC descriptor in use"
    );
    storage.rename("a", "b").await?;
    let large = vec![7u8; 1 << 20];
    file.append_durable(&[b"second ", &large]).await?;
    file.into_file().close().await?;
    let reopened = storage.open("b", OpenMode::Existing).await?;
    let mut expected = b"first second ".to_vec();
    expected.extend_from_slice(&large);
    assert_eq!(read_exact_at(&reopened, 0, expected.len()).await?, expected);
    reopened.close().await?;
    assert!(storage.list("").await?.iter().all(|name| name != "a"));
    Ok(())
}

/// Zeros written over data, at several sizes and again at one already used (a
/// kept buffer), read back as zeros, and leave the bytes around them alone;
/// the write budget counts them as any write.
async fn zeros_overwrite_what_was_there(storage: DmaStorage) -> io::Result<()> {
    let file = storage.open("z", OpenMode::CreateOrOpen).await?;
    let block = BLOCK_BYTES as u64;
    let data: Vec<u8> = (0..64 * BLOCK_BYTES).map(|i| (i % 251) as u8 + 1).collect();
    for (pos, len) in [(1, 4), (8, 16), (30, 4), (40, 16)] {
        file.write_at(0, &data).await?;
        file.write_zeros(pos * block, len * BLOCK_BYTES).await?;
        file.sync_data().await?;
        let read = read_exact_at(&file, 0, data.len()).await?;
        let (start, end) = (
            pos as usize * BLOCK_BYTES,
            (pos as usize + len) * BLOCK_BYTES,
        );
        assert!(read[start..end].iter().all(|&b| b == 0), "zeros at {pos}");
        assert_eq!(read[..start], data[..start], "before {pos}");
        assert_eq!(read[end..], data[end..], "after {pos}");
    }
    file.close().await?;
    let budgeted = storage.with_write_budget(2 * block);
    let file = budgeted.open("y", OpenMode::CreateOrOpen).await?;
    let refused = file
        .write_zeros(0, 4 * BLOCK_BYTES)
        .await
        .expect_err("over the budget");
    assert_eq!(refused.raw_os_error(), Some(libc::ENOSPC));
    file.write_zeros(0, 2 * BLOCK_BYTES).await?;
    file.close().await?;
    Ok(())
}

fn temp_root() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("create a temporary directory")
}

#[test]
fn dma_files_read_back_what_was_appended() {
    let root = temp_root();
    let storage = DmaStorage::new(root.path());
    rt::run_local(None, append_sync_reopen_read(storage)).expect("real disk I/O");
}

#[test]
fn dma_directory_operations() {
    let root = temp_root();
    let storage = DmaStorage::new(root.path());
    rt::run_local(None, rename_remove_list(storage)).expect("real disk I/O");
    assert!(!root.path().join("state").exists());
}

#[test]
fn dma_reads_work_when_the_first_file_opened_is_empty() {
    // Each test runs on its own thread, and glommio caches the probe per thread, so
    // this really is the first open on the device for this executor.
    let root = temp_root();
    let storage = DmaStorage::new(root.path());
    rt::run_local(None, first_open_is_a_new_empty_file(storage)).expect("real disk I/O");
    let mut names: Vec<_> = std::fs::read_dir(root.path())
        .expect("read the temporary directory")
        .map(|entry| entry.expect("a directory entry").file_name())
        .collect();
    names.sort();
    // The probe file stays (a later start opens it without writing); nothing
    // else is left behind.
    assert_eq!(names, vec![".iopoll-probe", "fresh"]);
}

#[test]
fn a_later_start_probes_the_device_without_writing() {
    let root = temp_root();
    let first = DmaStorage::new(root.path());
    rt::run_local(None, async move {
        first
            .open("kept", OpenMode::CreateOrOpen)
            .await?
            .close()
            .await
    })
    .expect("real disk I/O");
    let probe = root.path().join(".iopoll-probe");
    let modified = |path: &std::path::Path| std::fs::metadata(path).unwrap().modified().unwrap();
    let (root_before, probe_before) = (modified(root.path()), modified(&probe));
    assert_eq!(std::fs::metadata(&probe).unwrap().len(), BLOCK_BYTES as u64);
    std::thread::sleep(std::time::Duration::from_millis(20));
    // A new thread: its executor has probed nothing yet.
    let path = root.path().to_path_buf();
    std::thread::spawn(move || {
        let later = DmaStorage::new(&path);
        rt::run_local(None, async move {
            later.open("kept", OpenMode::Existing).await?.close().await
        })
        .expect("real disk I/O");
    })
    .join()
    .unwrap();
    assert_eq!(
        modified(root.path()),
        root_before,
        "a file was made or removed"
    );
    assert_eq!(modified(&probe), probe_before, "the probe file was written");
}

#[test]
fn dma_write_budget_refuses_the_write_that_crosses_it() {
    let root = temp_root();
    let storage = DmaStorage::new(root.path());
    rt::run_local(None, write_budget_refuses_the_crossing_write(storage)).expect("real disk I/O");
}

#[test]
fn dma_zero_writes_overwrite_with_zeros() {
    // Twice on one thread, each under an executor (and ring) of its own: the
    // second must not write from buffers the first one's ring registered.
    for _ in 0..2 {
        let root = temp_root();
        let storage = DmaStorage::new(root.path());
        rt::run_local(None, zeros_overwrite_what_was_there(storage)).expect("real disk I/O");
    }
}

#[test]
fn dma_durable_appends_reach_a_renamed_file() {
    let root = temp_root();
    let storage = DmaStorage::new(root.path());
    rt::run_local(None, durable_appends_after_a_rename(storage)).expect("real disk I/O");
}

#[test]
fn a_files_size_is_its_own_after_a_rename() {
    let root = temp_root();
    let storage = DmaStorage::new(root.path());
    rt::run_local(None, async move {
        let moved = storage.open("a", OpenMode::CreateOrOpen).await?;
        moved.write_at(0, &vec![1u8; 2 * BLOCK_BYTES]).await?;
        storage.rename("a", "b").await?;
        let other = storage.open("a", OpenMode::CreateOrOpen).await?;
        other.write_at(0, &vec![2u8; BLOCK_BYTES]).await?;
        assert_eq!(moved.size().await?, 2 * BLOCK_BYTES as u64);
        assert_eq!(other.size().await?, BLOCK_BYTES as u64);
        storage.remove("b").await?;
        assert_eq!(moved.size().await?, 2 * BLOCK_BYTES as u64);
        io::Result::Ok(())
    })
    .expect("real disk I/O");
}

/// A reservation allocates the blocks and leaves the size: a growing WAL
/// segment holds its space from the start, and is still known to grow.
#[test]
fn a_reservation_allocates_blocks_and_keeps_the_size() {
    use std::os::unix::fs::MetadataExt;

    let root = temp_root();
    let storage = DmaStorage::new(root.path());
    let path = root.path().join("r");
    rt::run_local(None, async move {
        let file = storage.open("r", OpenMode::CreateOrOpen).await?;
        file.write_at(0, &vec![1u8; BLOCK_BYTES]).await?;
        let reserved = 1u64 << 20;
        match file.reserve(reserved).await {
            // A file system without `fallocate` says so: the WAL goes on
            // without the reservation.
            Err(e) if e.kind() == io::ErrorKind::Unsupported => return Ok(()),
            result => result?,
        }
        assert_eq!(file.size().await?, BLOCK_BYTES as u64);
        let allocated = std::fs::metadata(&path)?.blocks() * 512;
        assert!(allocated >= reserved, "{allocated} bytes allocated");
        file.write_at(BLOCK_BYTES as u64, &vec![2u8; BLOCK_BYTES])
            .await?;
        assert_eq!(file.size().await?, 2 * BLOCK_BYTES as u64);
        io::Result::Ok(())
    })
    .expect("real disk I/O");
}

#[test]
fn removing_what_is_gone_is_not_an_error_and_renames_cross_directories() {
    let root = temp_root();
    let storage = DmaStorage::new(root.path());
    rt::run_local(None, async move {
        // Gone already (its directory's sync is still made), or never there
        // with its directory gone too.
        storage.remove("missing").await?;
        storage.remove("no-dir/missing").await?;
        storage.remove_dir_all("no-dir").await?;
        storage.create_dir_all("x").await?;
        storage.create_dir_all("y").await?;
        storage
            .open("x/f", OpenMode::CreateOrOpen)
            .await?
            .close()
            .await?;
        storage.rename("x/f", "y/f").await?;
        assert!(storage.list("x").await?.is_empty());
        assert_eq!(storage.list("y").await?, ["f"]);
        io::Result::Ok(())
    })
    .expect("real disk I/O");
}

/// Whether the first page of the file at `path` sits in the page cache
/// (`mincore` of a mapping of it).
fn first_page_cached(path: &std::path::Path) -> bool {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).expect("open the file to map it");
    // SAFETY: a read-only shared mapping of one page of an open file, unmapped
    // below; `mincore` writes one byte per page into `resident`.
    unsafe {
        let map = libc::mmap(
            std::ptr::null_mut(),
            BLOCK_BYTES,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        assert_ne!(map, libc::MAP_FAILED, "{}", io::Error::last_os_error());
        let mut resident = 0u8;
        let done = libc::mincore(map, BLOCK_BYTES, &mut resident);
        libc::munmap(map, BLOCK_BYTES);
        assert_eq!(done, 0, "{}", io::Error::last_os_error());
        resident & 1 == 1
    }
}

/// `write_cached_at` lands in the page cache where `write_at` goes around it;
/// a direct read sees the cached bytes, `sync_data` writes them out, and they
/// follow the file through a rename (the cached descriptor is the file's, not
/// its name's).
#[test]
fn cached_writes_land_in_the_page_cache_and_direct_reads_see_them() {
    let root = temp_root();
    let storage = DmaStorage::new(root.path());
    let path = root.path().join("b");
    rt::run_local(None, async move {
        let file = storage.open("a", OpenMode::CreateOrOpen).await?;
        file.write_at(0, &vec![1u8; BLOCK_BYTES]).await?;
        file.sync_data().await?;
        storage.rename("a", "b").await?;
        assert!(
            !first_page_cached(&path),
            "a direct write went through the cache"
        );
        file.write_cached_at(0, &vec![2u8; BLOCK_BYTES]).await?;
        assert!(
            first_page_cached(&path),
            "the cached write is not in the cache"
        );
        let mut read = vec![0u8; BLOCK_BYTES];
        file.read_at(0, &mut read).await?;
        assert!(read.iter().all(|&b| b == 2), "the direct read missed it");
        file.sync_data().await?;
        file.close().await?;
        let reopened = storage.open("b", OpenMode::Existing).await?;
        reopened.read_at(0, &mut read).await?;
        assert!(read.iter().all(|&b| b == 2), "lost across the reopen");
        reopened.close().await?;
        io::Result::Ok(())
    })
    .expect("real disk I/O");
    assert_eq!(
        std::fs::read(root.path().join("b")).unwrap(),
        vec![2u8; BLOCK_BYTES]
    );
}

/// Reads leave the access time alone (`O_NOATIME`): with `relatime`, a read
/// after a write would move it, dirtying the inode for the next sync to write
/// out, and the partition log reads back every commit. The access time is set
/// in the past first, so a file system mounted `relatime` (the default) would
/// move it on the read.
#[test]
fn reads_leave_the_access_time_alone() {
    use std::os::unix::fs::MetadataExt;
    let root = temp_root();
    let storage = DmaStorage::new(root.path());
    let path = root.path().join("read");
    let path2 = path.clone();
    rt::run_local(None, async move {
        let file = storage.open("read", OpenMode::CreateOrOpen).await?;
        file.write_at(0, &vec![7u8; BLOCK_BYTES]).await?;
        file.sync_data().await?;
        let day_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(86_400);
        std::fs::File::options()
            .write(true)
            .open(&path2)?
            .set_times(std::fs::FileTimes::new().set_accessed(day_ago))?;
        let before = std::fs::metadata(&path2)?.atime();
        let mut buf = vec![0u8; BLOCK_BYTES];
        file.read_at(0, &mut buf).await?;
        file.close().await?;
        assert_eq!(
            std::fs::metadata(&path2)?.atime(),
            before,
            "the read moved the access time"
        );
        io::Result::Ok(())
    })
    .expect("real disk I/O");
    assert!(path.exists());
}

#[test]
fn errors_of_the_second_descriptors_name_the_file() {
    let root = temp_root();
    let storage = DmaStorage::new(root.path());
    let (from_link, elsewhere) = rt::run_local(None, async move {
        let file = storage.open("seg.wal", OpenMode::CreateOrOpen).await?;
        let from_link = io::Error::new(
            io::ErrorKind::StorageFull,
            "No space left on device (os error 28), op: Writing path: Some(\"/proc/self/fd/40\") with fd: Some(47)",
        );
        let elsewhere = io::Error::other("Input/output error (os error 5)");
        let named = (file.named(from_link), file.named(elsewhere));
        file.close().await?;
        Ok::<_, io::Error>(named)
    })
    .expect("real disk I/O");
    assert_eq!(from_link.kind(), io::ErrorKind::StorageFull);
    let text = from_link.to_string();
    assert!(
        text.starts_with("No space left on device (os error 28), op: "),
        "{text}"
    );
    let suffix = format!(
        "(a second descriptor of {})",
        root.path().join("seg.wal").display()
    );
    assert!(text.ends_with(&suffix), "{text}");
    assert_eq!(elsewhere.to_string(), "Input/output error (os error 5)");
}
