//! The sparse offset index of one segment, and its small file next to the segment.
//!
//! Runs on the shard that owns the partition. The active segment's index is built
//! in memory as commits land; sealing a segment writes it to `<base>.index` (a
//! checksummed, versioned file, written to a temporary name, synced and renamed, so
//! a crash leaves either the old state or the whole new file). A sealed segment's
//! index is loaded lazily, on the first read or retention check that needs it; a
//! missing or corrupt file is rebuilt by one scan of the segment (see
//! `segment.rs`), so a bad index costs time once and never data.
//!
//! Memory: one 16-byte entry per [`LogConfig::index_interval_bytes`] of segment data
//! (default 128 KiB), so a 64 MiB segment holds at most ~512 entries, ~8 KiB. A
//! lookup lands at most one interval plus one frame before the wanted offset.
//!
//! Invariants: entries are strictly increasing in offset and in position, every
//! entry points at the start of a frame that was verified when it was indexed, and
//! an index never holds more than [`INDEX_ENTRIES_MAX`] entries.
//!
//! [`LogConfig::index_interval_bytes`]: super::LogConfig::index_interval_bytes

use std::io;

use narad_io::file::{join, OpenMode};
use narad_io::{align_up, BlockFile, Storage};

use crate::ids::Offset;

/// Magic of an index file.
const INDEX_MAGIC: [u8; 4] = *b"NIDX";
/// The version byte of index files written today.
const INDEX_VERSION: u8 = 1;
/// Fixed part of the file before the entries.
const INDEX_HEADER_BYTES: usize = 44;
/// One entry on disk: offset u64, position u32.
const INDEX_ENTRY_BYTES: usize = 12;

/// Most entries one segment's index may hold, whatever the configuration: bounds
/// both memory and what a forged count in a file can make a reader allocate.
pub const INDEX_ENTRIES_MAX: usize = 16 * 1024;

/// Largest index file a reader accepts.
pub const INDEX_FILE_BYTES_MAX: usize =
    INDEX_HEADER_BYTES + INDEX_ENTRIES_MAX * INDEX_ENTRY_BYTES + 4;

/// One index point: a frame starting at `pos` whose first record is `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    /// Offset of the frame's first record.
    pub offset: Offset,
    /// Byte position of the frame in the segment file.
    pub pos: u32,
}

/// The sparse index and summary of one segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SparseIndex {
    /// The segment's first offset (its file name).
    pub base: Offset,
    /// The offset after the last indexed record.
    pub end: Offset,
    /// Bytes of frames in the segment file.
    pub data_bytes: u64,
    /// Commit time of the newest record; retention compares against it.
    pub max_commit_ms: u64,
    entries: Vec<IndexEntry>,
}

impl SparseIndex {
    /// An empty index of a segment starting at `base`.
    pub fn new(base: Offset) -> Self {
        Self {
            base,
            end: base,
            data_bytes: 0,
            max_commit_ms: 0,
            entries: Vec::new(),
        }
    }

    /// Records a verified frame at `pos` holding `[first, end)`. An entry is added when the frame starts at least
    /// `interval_bytes` after the previous entry, or when `force` (the first frame
    /// after a corrupt gap, so a lookup never has to cross the gap).
    pub fn note_frame(
        &mut self,
        pos: u64,
        first: Offset,
        end: Offset,
        interval_bytes: u64,
        force: bool,
    ) {
        assert!(
            first >= self.end && end > first,
            "frames are indexed in offset order"
        );
        assert!(pos >= self.data_bytes, "frames are indexed in file order");
        let due = match self.entries.last() {
            None => true,
            Some(last) => force || pos >= u64::from(last.pos) + interval_bytes,
        };
        if due && self.entries.len() < INDEX_ENTRIES_MAX {
            let pos = u32::try_from(pos).expect("segment positions fit u32 (LogConfig::validate)");
            self.entries.push(IndexEntry { offset: first, pos });
        }
        self.end = end;
    }

    /// Moves the end past offsets that have no readable frame (a corrupt gap
    /// at the tail): the next frame noted starts at or after `end`.
    pub fn skip_to(&mut self, end: Offset) {
        assert!(end >= self.end, "the end never goes back");
        self.end = end;
    }

    /// Records the commit time of a record in the segment (commit times never go
    /// backwards, so the last commit's time is the maximum).
    pub fn note_commit_ms(&mut self, commit_ms: u64) {
        self.max_commit_ms = self.max_commit_ms.max(commit_ms);
    }

    /// Sets the data length after the last frame noted.
    pub fn set_data_bytes(&mut self, data_bytes: u64) {
        assert!(data_bytes >= self.data_bytes);
        self.data_bytes = data_bytes;
    }

    /// Where to start scanning for `offset`: the last entry at or before it, or
    /// the start of the segment.
    pub fn lookup(&self, offset: Offset) -> (Offset, u64) {
        let at = self.entries.partition_point(|e| e.offset <= offset);
        match at.checked_sub(1) {
            Some(i) => (self.entries[i].offset, u64::from(self.entries[i].pos)),
            None => (self.base, 0),
        }
    }

    /// Entries held.
    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }

    /// The file image, padded to a whole block for direct I/O.
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(INDEX_HEADER_BYTES + self.entries.len() * INDEX_ENTRY_BYTES + 4);
        self.encode_into(&mut out);
        out.resize(align_up(out.len() as u64) as usize, 0);
        out
    }

    /// Appends the image without its padding (the tail hint embeds it).
    pub(super) fn encode_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&INDEX_MAGIC);
        out.push(INDEX_VERSION);
        out.extend_from_slice(&[0, 0, 0]);
        out.extend_from_slice(&self.base.0.to_be_bytes());
        out.extend_from_slice(&self.end.0.to_be_bytes());
        out.extend_from_slice(&self.data_bytes.to_be_bytes());
        out.extend_from_slice(&self.max_commit_ms.to_be_bytes());
        out.extend_from_slice(&(self.entries.len() as u32).to_be_bytes());
        debug_assert_eq!(out.len() - start, INDEX_HEADER_BYTES);
        for entry in &self.entries {
            out.extend_from_slice(&entry.offset.0.to_be_bytes());
            out.extend_from_slice(&entry.pos.to_be_bytes());
        }
        let crc = crc32c::crc32c(&out[start..]);
        out.extend_from_slice(&crc.to_be_bytes());
    }

    /// The last entry, if any.
    pub(super) fn last_entry(&self) -> Option<IndexEntry> {
        self.entries.last().copied()
    }

    /// Decodes a file image (trailing padding allowed). Returns `None` for anything
    /// that is not an intact index of the segment starting at `base`.
    pub fn decode(bytes: &[u8], base: Offset) -> Option<Self> {
        let header = bytes.get(..INDEX_HEADER_BYTES)?;
        if header[..4] != INDEX_MAGIC || header[4] != INDEX_VERSION {
            return None;
        }
        let u64_at = |at: usize| -> u64 {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[at..at + 8]);
            u64::from_be_bytes(word)
        };
        let u32_at = |at: usize| -> u32 {
            let mut word = [0u8; 4];
            word.copy_from_slice(&bytes[at..at + 4]);
            u32::from_be_bytes(word)
        };
        let count = u32_at(40) as usize;
        if count > INDEX_ENTRIES_MAX {
            return None;
        }
        let body_end = INDEX_HEADER_BYTES + count * INDEX_ENTRY_BYTES;
        if bytes.len() < body_end + 4 || crc32c::crc32c(&bytes[..body_end]) != u32_at(body_end) {
            return None;
        }
        let mut index = SparseIndex {
            base: Offset(u64_at(8)),
            end: Offset(u64_at(16)),
            data_bytes: u64_at(24),
            max_commit_ms: u64_at(32),
            entries: Vec::with_capacity(count),
        };
        for i in 0..count {
            let at = INDEX_HEADER_BYTES + i * INDEX_ENTRY_BYTES;
            index.entries.push(IndexEntry {
                offset: Offset(u64_at(at)),
                pos: u32_at(at + 8),
            });
        }
        let ordered = index
            .entries
            .windows(2)
            .all(|w| w[0].offset < w[1].offset && w[0].pos < w[1].pos);
        let inside = index.entries.iter().all(|e| {
            e.offset >= index.base && e.offset < index.end && u64::from(e.pos) < index.data_bytes
        });
        (index.base == base && index.end >= base && ordered && inside).then_some(index)
    }
}

/// The index file's name for the segment starting at `base`.
pub fn index_file_name(base: Offset) -> String {
    format!("{:020}.index", base.0)
}

/// Writes the index of a sealed segment: temporary file, sync, rename.
pub async fn persist_index<S: Storage>(
    storage: &S,
    dir: &str,
    index: &SparseIndex,
) -> io::Result<()> {
    let name = index_file_name(index.base);
    let tmp = join(dir, &format!("{name}.tmp"));
    let image = index.encode();
    let file = storage.open(&tmp, OpenMode::CreateOrOpen).await?;
    let written = async {
        file.truncate(0).await?;
        file.write_at(0, &image).await?;
        file.sync_data().await
    }
    .await;
    file.close().await?;
    written?;
    storage.rename(&tmp, &join(dir, &name)).await
}

/// Reads the index of the segment starting at `base`; `Ok(None)` when the file is
/// missing, too large or not intact (the caller rebuilds it).
pub async fn load_index<S: Storage>(
    storage: &S,
    dir: &str,
    base: Offset,
) -> io::Result<Option<SparseIndex>> {
    let path = join(dir, &index_file_name(base));
    let file = match storage.open(&path, OpenMode::Existing).await {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let size = file.size().await?;
    let result = if size as usize > align_up(INDEX_FILE_BYTES_MAX as u64) as usize {
        None
    } else {
        let mut image = vec![0u8; align_up(size) as usize];
        file.read_at(0, &mut image).await?;
        SparseIndex::decode(&image, base)
    };
    file.close().await?;
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> SparseIndex {
        let mut index = SparseIndex::new(Offset(100));
        let mut pos = 0u64;
        for i in 0..50u64 {
            index.note_frame(pos, Offset(100 + i * 3), Offset(103 + i * 3), 4096, false);
            index.note_commit_ms(1000 + i);
            pos += 1500;
        }
        index.set_data_bytes(pos);
        index
    }

    #[test]
    fn lookup_lands_at_or_before_the_offset() {
        let index = sample();
        assert!(index.entry_count() < 50, "the index is sparse");
        for offset in 100..250u64 {
            let (at, pos) = index.lookup(Offset(offset));
            assert!(at.0 <= offset);
            assert!(
                offset - at.0 <= 3 * 4,
                "within one interval: {offset} -> {at:?}"
            );
            assert_eq!(pos, (at.0 - 100) / 3 * 1500);
        }
        assert_eq!(index.max_commit_ms, 1049);
    }

    #[test]
    fn file_round_trip_and_damage_is_refused() {
        let index = sample();
        let image = index.encode();
        assert_eq!(image.len() % 4096, 0);
        assert_eq!(
            SparseIndex::decode(&image, Offset(100)),
            Some(index.clone())
        );
        assert_eq!(
            SparseIndex::decode(&image, Offset(99)),
            None,
            "another segment's index"
        );
        for byte in [0, 5, 9, 41, 50, 60] {
            let mut bad = image.clone();
            bad[byte] ^= 0x10;
            assert_eq!(
                SparseIndex::decode(&bad, Offset(100)),
                None,
                "flip at {byte}"
            );
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = SparseIndex::decode(&bytes, Offset(0));
        }
    }
}
