//! Append-only files over block-aligned I/O.
//!
//! O_DIRECT accepts only whole aligned blocks, while logs append byte strings of
//! any length. [`AppendFile`] bridges the two in one place: it keeps the bytes of the
//! last, partial block in memory and writes them again, followed by the new bytes
//! and zero padding to the next block boundary, with every append. The device thus
//! rewrites at most one block per append; the rewritten prefix is byte-for-byte what
//! the block already held, so a torn rewrite cannot damage bytes that an earlier
//! sync made durable (a sector is written whole or not at all).
//!
//! A durable append that grows the file is never one `O_DSYNC` write: such a
//! direct write leaves the file's new size to the file system, which some
//! kernels' ext4 did not make durable with it, while an `fdatasync` after the
//! write makes it durable on every one. [`AppendFile`] knows the file's size
//! (from its opening, its own writes, and what the caller tells it of writes
//! made beside it) and sends such an append as a write and a sync, the write
//! whole, never in concurrent pieces: pieces that each extend the file only
//! queue behind each other in the file system (the comment where the write
//! is issued has the measurement).
//!
//! A write that fails leaves the logical length where it was: the caller decides
//! whether the file is still usable (the partition log rewinds to its high
//! watermark with [`AppendFile::rewind`]; the WAL latches).

use std::io;

use futures_lite::future::zip;

use crate::file::{BlockFile, BLOCK_BYTES};
use crate::{align_down, align_up};

/// A position in an [`AppendFile`] to rewind to: the logical length and the bytes
/// of its partial last block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendMark {
    len: u64,
    tail: Vec<u8>,
}

impl AppendMark {
    /// The logical length at the mark.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the mark is at the start of the file.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// An append-only view of a [`BlockFile`].
pub struct AppendFile<F> {
    file: F,
    len: u64,
    tail: Vec<u8>,
    /// The previous tail's allocation, reused for the next one.
    scratch: Vec<u8>,
    device_bytes_written: u64,
    /// The file's size as far as this handle knows: an append whose blocks
    /// end past it grows the file.
    file_bytes: u64,
}

impl<F: BlockFile> AppendFile<F> {
    /// Starts appending at `len`, reading the partial block before it from the
    /// device, and the file's size. Bytes past `len` are ignored and will be
    /// overwritten.
    ///
    /// Every later append rewrites that block, so a bad read here would write a
    /// flipped bit over durable data: the block is read until two reads in a row
    /// agree, and an error is returned if the device never gives the same bytes
    /// twice.
    pub async fn open_at(file: F, len: u64) -> io::Result<Self> {
        const READS_MAX: usize = 4;
        let tail_len = (len - align_down(len)) as usize;
        let mut tail = Vec::with_capacity(BLOCK_BYTES);
        if tail_len > 0 {
            let mut block = vec![0u8; BLOCK_BYTES];
            let mut previous = vec![0u8; BLOCK_BYTES];
            file.read_at(align_down(len), &mut previous).await?;
            let mut stable = false;
            for _ in 1..READS_MAX {
                file.read_at(align_down(len), &mut block).await?;
                if block == previous {
                    stable = true;
                    break;
                }
                std::mem::swap(&mut block, &mut previous);
            }
            if !stable {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the device returns different bytes on every read of the last block",
                ));
            }
            tail.extend_from_slice(&block[..tail_len]);
        }
        let file_bytes = file.size().await?;
        Ok(Self {
            file,
            len,
            tail,
            scratch: Vec::new(),
            device_bytes_written: 0,
            file_bytes,
        })
    }

    /// Logical length: every byte appended so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was appended.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes handed to the device by this handle so far, padding and rewritten tail
    /// blocks included: the numerator of write amplification.
    pub fn device_bytes_written(&self) -> u64 {
        self.device_bytes_written
    }

    /// The file's size as far as this handle knows.
    pub fn file_bytes(&self) -> u64 {
        self.file_bytes
    }

    /// Says that writes made beside this handle (zeros prepared ahead of the
    /// appends) grew the file to at least `bytes`.
    pub fn grew_to(&mut self, bytes: u64) {
        self.file_bytes = self.file_bytes.max(bytes);
    }

    /// Says that the file was cut to `bytes` beside this handle (a sealed
    /// segment trimmed to its data).
    pub fn truncated_to(&mut self, bytes: u64) {
        self.file_bytes = self.file_bytes.min(bytes);
    }

    /// Whether appending `added` bytes would grow the file, so that a durable
    /// append of them would be a write and a sync.
    pub fn would_grow(&self, added: u64) -> bool {
        self.grows_to(align_up(self.len + added))
    }

    /// Whether blocks ending at `end` grow the file.
    fn grows_to(&self, end: u64) -> bool {
        cfg!(not(feature = "broken-growing-dsync")) && end > self.file_bytes
    }

    /// The underlying file, for reads and syncs.
    pub fn file(&self) -> &F {
        &self.file
    }

    /// Gives the file back.
    pub fn into_file(self) -> F {
        self.file
    }

    /// Writes `parts` after the current end, as one device write. Not durable
    /// until [`AppendFile::sync`]. The rewritten tail, the parts and the zero
    /// padding are laid out straight in the device's buffer: each byte is
    /// copied once.
    pub async fn append(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        self.append_as(parts, Durability::Later, NOTHING).await
    }

    /// [`AppendFile::append`] that returns only once the appended bytes are
    /// durable, each device write an `O_DSYNC` one
    /// ([`BlockFile::write_durable_with`]): a commit in one device round trip
    /// instead of two. Earlier appends not yet synced are not made durable by it,
    /// unless the append grows the file: then it is plain writes and an
    /// `fdatasync` (see the module doc), which makes them durable too. A
    /// refusal for space ([`crate::out_of_space`]) means nothing of the append was
    /// written (its device writes were refused before they were issued, or
    /// never issued), so the blocks before and after the end are as they
    /// were; after any other error the blocks the append covered, the
    /// rewritten partial block among them, are unknown.
    pub async fn append_durable(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        self.append_as(parts, Durability::Now, NOTHING).await
    }

    /// [`AppendFile::append_durable`] that calls `submitted` as soon as every
    /// device write of the append is in the kernel's hands, while they run:
    /// work that would delay their submission if done first (waking the
    /// callers of an earlier append, who then run before the executor submits)
    /// goes there instead. Called whatever the outcome.
    pub async fn append_durable_then(
        &mut self,
        parts: &[&[u8]],
        submitted: impl FnOnce(),
    ) -> io::Result<()> {
        self.append_as(parts, Durability::Now, Some(submitted))
            .await
    }

    /// Whether a durable append of `added` bytes goes to the device in several
    /// pieces, submitted one executor round apart while the next is copied: a
    /// write long enough to copy that work which can wait
    /// ([`AppendFile::append_durable_then`]) is worth holding back until it
    /// was all submitted. One that grows the file goes whole.
    pub fn goes_in_pieces(&self, added: usize) -> bool {
        let start = align_down(self.len);
        !self.would_grow(added as u64)
            && pieces(align_up(self.len + added as u64 - start) as usize) > 1
    }

    /// [`AppendFile::append_durable`] of bytes that `source` produces as they
    /// are copied into the device's buffer, so a caller that builds them from
    /// other bytes (masking them, say) never lays them out in memory first.
    pub async fn append_durable_from<P: AppendSource + ?Sized>(
        &mut self,
        source: &P,
    ) -> io::Result<()> {
        self.append_as(source, Durability::Now, NOTHING).await
    }

    async fn append_as<P: AppendSource + ?Sized>(
        &mut self,
        parts: &P,
        durability: Durability,
        submitted: Option<impl FnOnce()>,
    ) -> io::Result<()> {
        let added = parts.len();
        if added == 0 {
            if let Some(submitted) = submitted {
                submitted();
            }
            return Ok(());
        }
        let start = align_down(self.len);
        let end = self.len + added as u64;
        let data = Concat {
            head: &self.tail,
            parts,
        };
        let padded_len = align_up(end - start) as usize;
        let result = if durability == Durability::Now && self.grows_to(start + padded_len as u64) {
            // One device write, however large: concurrent pieces that each
            // extend the file are serialized by the file system anyway (ext4
            // holds the inode's lock for an extending direct write), and each
            // is one the kernel cannot issue without blocking, so io_uring
            // hands every piece to a worker thread of its own. Measured on a
            // batch produce whose commits grow the file (about 550 KiB each):
            // commits in 3.5 ms instead of 3.5-5.6, broker CPU 4% lower. A
            // refusal for space is then whole: a clean one.
            let written = write_pieces(
                &self.file,
                start,
                padded_len,
                &data,
                Durability::Later,
                submitted,
                1,
            );
            match written.await {
                // Whatever the sync reports came after the write went out:
                // never a clean refusal.
                Ok(()) => self.file.sync_data().await.map_err(|e| {
                    io::Error::other(format!("sync after a growing write failed: {e}"))
                }),
                Err(e) => Err(e),
            }
        } else {
            write_pieces(
                &self.file,
                start,
                padded_len,
                &data,
                durability,
                submitted,
                pieces(padded_len),
            )
            .await
        };
        if result.is_ok() {
            self.file_bytes = self.file_bytes.max(start + padded_len as u64);
            let new_tail_start = (align_down(end) - start) as usize;
            let mut tail = std::mem::take(&mut self.scratch);
            tail.clear();
            tail.resize((end - align_down(end)) as usize, 0);
            data.copy_to(new_tail_start, &mut tail);
            self.scratch = std::mem::replace(&mut self.tail, tail);
            self.len = end;
            self.device_bytes_written += padded_len as u64;
        }
        debug_assert_eq!(self.tail.len() as u64, self.len - align_down(self.len));
        result
    }

    /// Writes the partial last block again from memory, then zeros up to
    /// `through` rounded up to a block: repairs the blocks an append wrote
    /// before it was rewound, which may hold a damaged copy of the partial
    /// block and bytes past the end that the next append need not cover.
    /// Writes nothing when the end is block-aligned and `through` at most the
    /// end. Not durable until [`AppendFile::sync`].
    pub async fn rewrite_tail_zeroed_to(&mut self, through: u64) -> io::Result<()> {
        let start = align_down(self.len);
        let end = align_up(through.max(self.len));
        if end == start {
            return Ok(());
        }
        let data = Concat {
            head: &self.tail,
            parts: &[0u8; 0][..],
        };
        let len = (end - start) as usize;
        write_pieces(
            &self.file,
            start,
            len,
            &data,
            Durability::Later,
            NOTHING,
            pieces(len),
        )
        .await?;
        self.device_bytes_written += end - start;
        self.file_bytes = self.file_bytes.max(end);
        Ok(())
    }

    /// The bytes of the partial last block (from its start to the end).
    pub fn tail(&self) -> &[u8] {
        &self.tail
    }

    /// `fdatasync` of the file.
    pub async fn sync(&self) -> io::Result<()> {
        self.file.sync_data().await
    }

    /// The current position, to [`AppendFile::rewind`] to after a failure.
    pub fn mark(&self) -> AppendMark {
        AppendMark {
            len: self.len,
            tail: self.tail.clone(),
        }
    }

    /// Forgets everything appended after `mark`; the next append overwrites it.
    pub fn rewind(&mut self, mark: &AppendMark) {
        assert!(mark.len <= self.len, "rewind only moves backwards");
        self.len = mark.len;
        self.tail.clear();
        self.tail.extend_from_slice(&mark.tail);
    }
}

/// No work to do once an append's writes are submitted.
const NOTHING: Option<fn()> = None;

/// Whether an append's device writes are durable when they return.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// Plain writes, durable after a later sync.
    Later,
    /// `O_DSYNC` writes.
    Now,
}

/// A write at least twice this large goes to the device as several concurrent
/// writes, each at least this large.
const PIECE_BYTES_MIN: usize = 256 << 10;
/// The most writes one append has in flight at once.
const PIECES_MAX: usize = 4; // the four futures joined in `write_pieces`

/// How many device writes a write of `len` bytes goes out as.
fn pieces(len: usize) -> usize {
    (len / PIECE_BYTES_MIN).clamp(1, PIECES_MAX)
}

/// The bytes one append adds, produced on demand: [`AppendFile`] asks for them
/// piece by piece, straight into the buffers the device reads from.
pub trait AppendSource {
    /// How many bytes the append adds.
    fn len(&self) -> usize;

    /// Whether it adds none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fills `out` with the bytes from `from` on; `from + out.len()` is at
    /// most [`AppendSource::len`].
    fn copy_to(&self, from: usize, out: &mut [u8]);
}

impl AppendSource for [u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }

    fn copy_to(&self, from: usize, out: &mut [u8]) {
        out.copy_from_slice(&self[from..from + out.len()]);
    }
}

impl<T: AppendSource + ?Sized> AppendSource for &T {
    fn len(&self) -> usize {
        (**self).len()
    }

    fn copy_to(&self, from: usize, out: &mut [u8]) {
        (**self).copy_to(from, out)
    }
}

/// Sources appended one after another (byte strings, say).
impl<T: AppendSource> AppendSource for [T] {
    fn len(&self) -> usize {
        self.iter().map(AppendSource::len).sum()
    }

    fn copy_to(&self, from: usize, out: &mut [u8]) {
        let mut skip = from;
        let mut filled = 0;
        for piece in self {
            if filled == out.len() {
                return;
            }
            if skip >= piece.len() {
                skip -= piece.len();
                continue;
            }
            let n = (piece.len() - skip).min(out.len() - filled);
            piece.copy_to(skip, &mut out[filled..filled + n]);
            filled += n;
            skip = 0;
        }
        assert_eq!(filled, out.len(), "copied past the end of the parts");
    }
}

/// The bytes of one append: the rewritten head of the first block, then the
/// parts, then (implicitly) zeros up to the block boundary.
struct Concat<'a, P: ?Sized> {
    head: &'a [u8],
    parts: &'a P,
}

impl<P: AppendSource + ?Sized> Concat<'_, P> {
    /// Fills `out` with the bytes from `from` on, zeros past the last part.
    fn copy_to(&self, from: usize, out: &mut [u8]) {
        let mut filled = 0;
        if from < self.head.len() {
            filled = (self.head.len() - from).min(out.len());
            out[..filled].copy_from_slice(&self.head[from..from + filled]);
        }
        let at = (from + filled).saturating_sub(self.head.len());
        let parts = (self.parts.len().saturating_sub(at)).min(out.len() - filled);
        if parts > 0 {
            self.parts.copy_to(at, &mut out[filled..filled + parts]);
            filled += parts;
        }
        out[filled..].fill(0);
    }
}

/// Writes `len` aligned bytes of `data` at `pos`, as up to [`PIECES_MAX`]
/// concurrent writes of disjoint blocks when it is large: a device keeps several
/// requests busy where one large request leaves it idle between its parts (fio
/// here: 1.58 GB/s for 2 MiB writes one at a time, 1.89 GB/s for 512 KiB writes
/// four at a time). The pieces share no block, so their order on the device does
/// not matter; the result is an error if any piece failed.
///
/// The real disk's executor hands queued I/O to the kernel only between
/// rounds of its runnable tasks ([`BlockFile::issued_writes_submitted`]), so
/// pieces filled one after another in one round would all wait for the last
/// copy: each piece after the first is filled only once the one before it
/// was submitted, and goes to the device while the next one is copied (a
/// 1 MiB write: the device starts after a quarter of the copy rather than all
/// of it). `submitted` runs once the last piece was submitted. `count` is how
/// many pieces: [`pieces`] of the length, or 1 for a write that must go whole.
async fn write_pieces<F: BlockFile, P: AppendSource + ?Sized>(
    file: &F,
    pos: u64,
    len: usize,
    data: &Concat<'_, P>,
    durability: Durability,
    submitted: Option<impl FnOnce()>,
    count: usize,
) -> io::Result<()> {
    let write = async |at: usize, to: usize| {
        let fill = |out: &mut [u8]| data.copy_to(at, out);
        match durability {
            Durability::Later => file.write_with(pos + at as u64, to - at, fill).await,
            Durability::Now => {
                file.write_durable_with(pos + at as u64, to - at, fill)
                    .await
            }
        }
    };
    assert!((1..=PIECES_MAX).contains(&count));
    // Polled after the pieces (`zip` polls in order), so in step with them:
    // piece `i` is queued after `i` waits and submitted by the next, the
    // last one by the `count`th, which this waits for.
    let handed = async {
        if let Some(submitted) = submitted {
            for _ in 0..count {
                file.issued_writes_submitted().await;
            }
            submitted();
        }
    };
    if count == 1 {
        return zip(write(0, len), handed).await.0;
    }
    let piece_bytes = align_up(len.div_ceil(count) as u64) as usize;
    // Set by a piece that failed: the pieces not issued yet are not issued at
    // all. The append has failed whatever they do, and each one written would
    // only leave more of its bytes past the end the caller rewinds to.
    let failed = &std::cell::Cell::new(false);
    // Set by a piece that was written.
    let written = &std::cell::Cell::new(false);
    let piece = |i: usize| {
        let from = (i * piece_bytes).min(len);
        let to = ((i + 1) * piece_bytes).min(len);
        async move {
            if from == to {
                return Ok(());
            }
            for _ in 0..i {
                file.issued_writes_submitted().await;
            }
            if failed.get() {
                return Ok(());
            }
            let result = write(from, to).await;
            failed.set(failed.get() || result.is_err());
            written.set(written.get() || result.is_ok());
            result
        }
    };
    let writes = zip(zip(piece(0), piece(1)), zip(piece(2), piece(3)));
    let (((a, b), (c, d)), ()) = zip(writes, handed).await;
    // A refusal for space leaves what its piece covered untouched; any other
    // failure leaves its piece unknown, which is what the caller must hear.
    let mut failures: Vec<io::Error> = [a, b, c, d].into_iter().filter_map(Result::err).collect();
    failures.sort_by_key(crate::out_of_space);
    match failures.into_iter().next() {
        None => Ok(()),
        // Refused, but other pieces were written: the append's bytes lie on
        // the device past the end the caller goes back to, which a refusal
        // promises they do not.
        Some(e) if crate::out_of_space(&e) && written.get() => Err(io::Error::other(
            format!("a write of {len} bytes at {pos} was refused in part, after other parts were written: {e}"),
        )),
        Some(e) => Err(e),
    }
}

/// Reads `len` bytes at the unaligned position `pos`, with aligned device reads.
pub async fn read_exact_at<F: BlockFile>(file: &F, pos: u64, len: usize) -> io::Result<Vec<u8>> {
    let start = align_down(pos);
    let end = align_up(pos + len as u64);
    let mut buf = vec![0u8; (end - start) as usize];
    file.read_at(start, &mut buf).await?;
    let skip = (pos - start) as usize;
    buf.drain(..skip);
    buf.truncate(len);
    Ok(buf)
}

#[cfg(test)]
mod tests;
