//! `narad inspect wal|log <dir>`: what is on disk, without changing it.
//!
//! Runs in the calling thread. It reads every segment of the directory with
//! the broker's own decoders and reports what recovery would find: the
//! checkpoint, each segment's sequence range, where its valid frames end, any
//! corruption, and the done-set a graceful stop left (and whether the next
//! start would use it).
//!
//! It reads through the page cache with files opened read-only
//! ([`ReadOnlyFile`]), not through the broker's O_DIRECT storage: that storage
//! opens files for writing and creates a probe file in the directory, so it
//! cannot read a read-only mount or a copy owned by another user, and an
//! inspector must not write where it looks. On a stopped node the page cache
//! holds what the file system holds.

use std::fmt::Write as _;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use futures_lite::future::block_on;
use narad_io::BlockFile;
use narad_shards::ids::{Offset, Seq};
use narad_shards::log::recovery::scan_tail_above;
use narad_shards::log::{acknowledged_end, HINT_FILE};
use narad_shards::wal::checkpoint::{decode as decode_checkpoint, CHECKPOINT_FILE};
use narad_shards::wal::dispatched::{decode as decode_dispatched, DISPATCHED_FILE};
use narad_shards::wal::key::{key_check_of, KEY_FILE};
use narad_shards::wal::segment::{
    parse_segment_name, scan_past_dispatched, ScanError, PREP_FILE, SPARE_PREFIX,
};

/// Index interval used only to drive the scan; the report does not use the index.
const SCAN_INDEX_INTERVAL_BYTES: u64 = 1 << 20;

/// A file opened for reading only. Every write, sync or truncate is refused:
/// nothing the inspector runs should try one.
struct ReadOnlyFile(std::fs::File);

fn read_only() -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, "the inspector only reads")
}

impl ReadOnlyFile {
    fn open(dir: &Path, name: &str) -> io::Result<ReadOnlyFile> {
        std::fs::File::open(dir.join(name)).map(ReadOnlyFile)
    }
}

impl BlockFile for ReadOnlyFile {
    async fn write_at(&self, _: u64, _: &[u8]) -> io::Result<()> {
        Err(read_only())
    }

    async fn write_with(&self, _: u64, _: usize, _: impl FnOnce(&mut [u8])) -> io::Result<()> {
        Err(read_only())
    }

    async fn write_durable_with(
        &self,
        _: u64,
        _: usize,
        _: impl FnOnce(&mut [u8]),
    ) -> io::Result<()> {
        Err(read_only())
    }

    async fn write_cached_at(&self, _: u64, _: &[u8]) -> io::Result<()> {
        Err(read_only())
    }

    /// Fills `buf` from `pos` up to the end of the file, zeroes the rest, and
    /// returns how much came from the file, as the broker's storage does.
    async fn read_at(&self, pos: u64, buf: &mut [u8]) -> io::Result<usize> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.0.read_at(&mut buf[filled..], pos + filled as u64) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        buf[filled..].fill(0);
        Ok(filled)
    }

    async fn read_with<R>(
        &self,
        pos: u64,
        len: usize,
        inspect: impl FnOnce(&[u8]) -> R,
    ) -> io::Result<R> {
        let mut buf = vec![0u8; len];
        self.read_at(pos, &mut buf).await?;
        Ok(inspect(&buf))
    }

    async fn sync_data(&self) -> io::Result<()> {
        Err(read_only())
    }

    async fn size(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    async fn truncate(&self, _: u64) -> io::Result<()> {
        Err(read_only())
    }

    async fn reserve(&self, _: u64) -> io::Result<()> {
        Err(read_only())
    }

    async fn close(self) -> io::Result<()> {
        Ok(())
    }
}

/// The names of the files in `dir`.
fn list(dir: &Path) -> Result<Vec<String>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    names.sort();
    Ok(names)
}

/// Describes the ingress WAL in `dir`.
pub fn inspect_wal(dir: &Path) -> Result<Report, String> {
    block_on(wal_report(dir.to_path_buf())).map(|report| noting_a_live_node(dir, report))
}

/// `report` with a first line saying so when a running node holds the data
/// directory `dir` lies in: its newest bytes may be a write in flight, so a
/// torn tail found there is not damage.
fn noting_a_live_node(dir: &Path, mut report: Report) -> Report {
    if let Some(data_dir) = held_data_dir(dir) {
        report.text.insert_str(
            0,
            &format!(
                "note: a running narad holds {}; the newest bytes may be a write in flight, so a torn tail below need not be damage (stop the node for an exact reading)\n",
                data_dir.display()
            ),
        );
    }
    report
}

/// The data directory `dir` lies in, if a process holds its `lock`: read from
/// `/proc/locks`, never by taking the lock, so that a node starting meanwhile
/// does not find it taken.
fn held_data_dir(dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let dir = std::fs::canonicalize(dir).ok()?;
    dir.ancestors().find_map(|ancestor| {
        let meta = std::fs::metadata(ancestor.join("lock")).ok()?;
        // glibc's encoding of a device number; /proc/locks writes it as
        // major:minor in hex, then the inode.
        let dev = meta.dev();
        let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
        let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
        let id = format!("{major:02x}:{minor:02x}:{}", meta.ino());
        let held = (locks.lines())
            .any(|line| line.contains("FLOCK") && line.split_whitespace().any(|f| f == id));
        held.then(|| ancestor.to_path_buf())
    })
}

/// What the inspector found: the text to print, and whether any of it is
/// damage (a corrupt or unreadable segment), which the command reports in
/// its exit status.
#[derive(Debug)]
pub struct Report {
    pub text: String,
    pub damaged: bool,
}

async fn wal_report(dir: PathBuf) -> Result<Report, String> {
    let names = list(&dir)?;
    // A WAL always holds its checkpoint and a segment: a directory with
    // neither is another one, and an empty report would read as an empty WAL.
    if !names
        .iter()
        .any(|n| n == CHECKPOINT_FILE || parse_segment_name(n).is_some())
    {
        return Err(format!(
            "{}: no ingress WAL here (no checkpoint, no segment); a shard's WAL is <data dir>/ingress/shard-<n>",
            dir.display()
        ));
    }
    let mut out = String::new();
    let mut damaged = false;
    let checkpoint = if names.iter().any(|n| n == CHECKPOINT_FILE) {
        let file = ReadOnlyFile::open(&dir, CHECKPOINT_FILE).map_err(|e| e.to_string())?;
        let mut block = vec![0u8; narad_io::BLOCK_BYTES];
        file.read_at(0, &mut block)
            .await
            .map_err(|e| e.to_string())?;
        decode_checkpoint(&block)
    } else {
        None
    };
    match checkpoint {
        Some(seq) => writeln!(out, "checkpoint: {seq}").ok(),
        None => writeln!(
            out,
            "checkpoint: absent or unreadable (dispatch would start at the oldest segment)"
        )
        .ok(),
    };
    let key_check = std::fs::read(dir.join(KEY_FILE))
        .ok()
        .and_then(|block| key_check_of(&block));
    let firsts: Vec<Seq> = names.iter().filter_map(|n| parse_segment_name(n)).collect();
    // Where the last segment's valid frames end: the next record's number.
    let mut next_seq = None;
    for (i, &first) in firsts.iter().enumerate() {
        let name = narad_shards::wal::segment::segment_name(first);
        let last_expected = firsts.get(i + 1).map(|next| Seq(next.0 - 1));
        let file = ReadOnlyFile::open(&dir, &name).map_err(|e| e.to_string())?;
        let size = file.size().await.map_err(|e| e.to_string())?;
        // As recovery scans: damage wholly below the checkpoint is stepped over
        // (and reported below), since its records were dispatched.
        let dispatched = checkpoint.unwrap_or(Seq(0));
        let scanned = scan_past_dispatched(&file, first, last_expected, dispatched, key_check);
        let line = match scanned.await {
            Ok(end) => {
                next_seq = Some(end.next_seq);
                let torn = end
                    .torn_until_bytes
                    .map(|until| format!(", torn write survives up to byte {until}"))
                    .unwrap_or_default();
                let mut skipped = String::new();
                for run in &end.skipped {
                    damaged = true;
                    skipped.push_str(&format!(
                        ", CORRUPT below the checkpoint (dispatched, stepped over): seqs {}..{}",
                        run.seqs.start, run.seqs.end
                    ));
                }
                format!(
                    "{name}: seqs {first}..{} ({} records), valid bytes {} of {size}{torn}{skipped}",
                    end.next_seq,
                    end.next_seq.0 - first.0,
                    end.end_bytes
                )
            }
            Err(ScanError::Corrupt {
                position_bytes,
                expected,
                why,
            }) => {
                damaged = true;
                format!(
                    "{name}: CORRUPT at byte {position_bytes} (expecting seq {expected}): {why}"
                )
            }
            Err(ScanError::Io(e)) => {
                damaged = true;
                format!("{name}: read error: {e}")
            }
        };
        writeln!(out, "{line}").ok();
    }
    if names.iter().any(|n| n == DISPATCHED_FILE) {
        let bytes = std::fs::read(dir.join(DISPATCHED_FILE)).map_err(|e| e.to_string())?;
        let checked = match (checkpoint, next_seq) {
            (Some(checkpoint), Some(next)) => decode_dispatched(&bytes, checkpoint, next),
            _ => Err("the checkpoint or the end of the WAL is unknown".into()),
        };
        let line = match checked {
            Ok(progress) => format!(
                "done-set: {} records above the checkpoint were committed before a graceful stop; the next start passes over them",
                progress.done_above().filter(|&d| d).count()
            ),
            Err(why) => format!("done-set: present, but the next start will not use it ({why})"),
        };
        writeln!(out, "{line}").ok();
    }
    let spares = names
        .iter()
        .filter(|n| n.starts_with(SPARE_PREFIX) || *n == PREP_FILE)
        .count();
    writeln!(
        out,
        "segments: {}, spare or prepared files: {spares}",
        firsts.len()
    )
    .ok();
    Ok(Report { text: out, damaged })
}

/// Describes the partition log in `dir`.
pub fn inspect_log(dir: &Path) -> Result<Report, String> {
    block_on(log_report(dir.to_path_buf())).map(|report| noting_a_live_node(dir, report))
}

fn parse_log_name(name: &str) -> Option<Offset> {
    let digits = name.strip_suffix(".log")?;
    (digits.len() == 20)
        .then(|| digits.parse().ok().map(Offset))
        .flatten()
}

async fn log_report(dir: PathBuf) -> Result<Report, String> {
    let names = list(&dir)?;
    let mut out = String::new();
    let mut damaged = false;
    let bases: Vec<Offset> = names.iter().filter_map(|n| parse_log_name(n)).collect();
    // An open log always keeps its active segment.
    if bases.is_empty() {
        return Err(format!(
            "{}: no partition log segments here; a partition's log is <data dir>/topics/<topic>/<incarnation id>/p<partition, 5 digits>",
            dir.display()
        ));
    }
    // A clean close's tail hint says where the active segment's data ended:
    // the open scans with it as a floor, and so does this report.
    let hint = std::fs::read(dir.join(HINT_FILE)).ok();
    let active = bases.last().copied();
    for base in &bases {
        let name = format!("{:020}.log", base.0);
        let file = ReadOnlyFile::open(&dir, &name).map_err(|e| e.to_string())?;
        let size = file.size().await.map_err(|e| e.to_string())?;
        let bytes = narad_io::append::read_exact_at(&file, 0, size as usize)
            .await
            .map_err(|e| e.to_string())?;
        let floor = hint
            .as_deref()
            .filter(|_| Some(*base) == active)
            .and_then(|image| acknowledged_end(image, *base));
        let scan = scan_tail_above(&bytes, *base, SCAN_INDEX_INTERVAL_BYTES, floor);
        let gaps = if scan.gaps.is_empty() {
            String::new()
        } else {
            damaged = true;
            format!(", CORRUPT ranges {:?}", scan.gaps)
        };
        writeln!(
            out,
            "{name}: offsets {}..{} ({} records), committed bytes {} of {size}{gaps}",
            base,
            scan.next_offset,
            scan.next_offset.0 - base.0,
            scan.data_bytes
        )
        .ok();
    }
    writeln!(out, "segments: {}", bases.len()).ok();
    Ok(Report { text: out, damaged })
}
