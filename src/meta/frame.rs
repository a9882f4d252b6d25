//! The on-disk frames of the metadata store: one command-log entry, and the
//! snapshot file. Pure encoding and decoding; the store does the I/O.
//!
//! Log entry (big-endian, like the WAL and the partition log):
//!
//! ```text
//! magic "NMET" | format u8 = 1 | body_len u32 | crc32c u32 | index u64 | body
//! ```
//!
//! The CRC covers the index and the body, so a flipped index is caught like a
//! flipped body. The body is the JSON of one [`Command`].
//!
//! Snapshot file:
//!
//! ```text
//! magic "NMSN" | format u8 = 1 | body_len u32 | crc32c u32 | body
//! ```
//!
//! The body is the JSON of every topic record and the state's version. JSON keeps
//! the files readable with ordinary tools; the state is small and rarely written,
//! so its size and parse time do not matter.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::state::{check_record, Command, MetaState, TopicRecord};

pub(super) const ENTRY_MAGIC: [u8; 4] = *b"NMET";
pub(super) const SNAPSHOT_MAGIC: [u8; 4] = *b"NMSN";
pub(super) const FORMAT: u8 = 1;
pub(super) const ENTRY_HEADER_BYTES: usize = 4 + 1 + 4 + 4 + 8;
const SNAPSHOT_HEADER_BYTES: usize = 4 + 1 + 4 + 4;
/// The largest command body. A command holds one topic record, a few hundred
/// bytes; a header claiming more is damage, not a command.
pub(super) const ENTRY_BODY_BYTES_MAX: usize = 64 << 10;
/// The largest snapshot body: room for about a million topics.
pub(super) const SNAPSHOT_BODY_BYTES_MAX: usize = 1 << 30;

const _: () = assert!(ENTRY_BODY_BYTES_MAX <= u32::MAX as usize);
const _: () = assert!(SNAPSHOT_BODY_BYTES_MAX <= u32::MAX as usize);

/// The first entry found at the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum EntryRead<'a> {
    /// A whole entry whose CRC matches, `len` bytes long with its header.
    Entry {
        index: u64,
        body: &'a [u8],
        len: usize,
    },
    /// The buffer ends inside the entry: a write cut short.
    Incomplete,
    /// Not an entry: wrong magic, an impossible length, or a CRC mismatch.
    Bad(&'static str),
    /// An entry's magic with a format this version does not know: written by a
    /// newer version. Never mistaken for a torn write.
    UnknownFormat(u8),
}

/// One log entry holding `cmd` at `index`.
pub(super) fn encode_entry(cmd: &Command, index: u64) -> Vec<u8> {
    // A `Command` is plain data with string keys: serializing it cannot fail.
    let body = serde_json::to_vec(cmd).expect("a command serializes");
    assert!(body.len() <= ENTRY_BODY_BYTES_MAX, "command body too large");
    let index_be = index.to_be_bytes();
    let crc = crc32c::crc32c_append(crc32c::crc32c(&index_be), &body);
    let mut frame = Vec::with_capacity(ENTRY_HEADER_BYTES + body.len());
    frame.extend_from_slice(&ENTRY_MAGIC);
    frame.push(FORMAT);
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&crc.to_be_bytes());
    frame.extend_from_slice(&index_be);
    frame.extend_from_slice(&body);
    assert_eq!(frame.len(), ENTRY_HEADER_BYTES + body.len());
    frame
}

/// Reads the entry at the start of `buf`.
pub(super) fn decode_entry(buf: &[u8]) -> EntryRead<'_> {
    if buf.len() < ENTRY_MAGIC.len() {
        return if ENTRY_MAGIC.starts_with(buf) {
            EntryRead::Incomplete
        } else {
            EntryRead::Bad("bad magic")
        };
    }
    if buf[..4] != ENTRY_MAGIC {
        return EntryRead::Bad("bad magic");
    }
    if buf.len() < ENTRY_HEADER_BYTES {
        return EntryRead::Incomplete;
    }
    // A zero format byte is no format at all: the rest of a header whose magic
    // reached the disk and whose other bytes did not (a torn append reads back
    // as zeros past what was written), so recovery may cut it off as a tail.
    if buf[4] == 0 {
        return EntryRead::Bad("format byte 0 (a torn entry)");
    }
    if buf[4] != FORMAT {
        return EntryRead::UnknownFormat(buf[4]);
    }
    let body_len = u32::from_be_bytes(buf[5..9].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_be_bytes(buf[9..13].try_into().expect("4 bytes"));
    let index_be: [u8; 8] = buf[13..21].try_into().expect("8 bytes");
    if body_len > ENTRY_BODY_BYTES_MAX {
        return EntryRead::Bad("body length past the maximum");
    }
    let len = ENTRY_HEADER_BYTES + body_len;
    if buf.len() < len {
        return EntryRead::Incomplete;
    }
    let body = &buf[ENTRY_HEADER_BYTES..len];
    if crc32c::crc32c_append(crc32c::crc32c(&index_be), body) != crc {
        return EntryRead::Bad("checksum mismatch");
    }
    EntryRead::Entry {
        index: u64::from_be_bytes(index_be),
        body,
        len,
    }
}

/// The offset of the first whole, checksummed entry that starts after `from`, if
/// any. Recovery asks this after a bad entry: a valid entry behind it means the
/// damage is not a torn tail.
pub(super) fn next_valid_entry(buf: &[u8], from: usize) -> Option<usize> {
    let mut at = from + 1;
    while at + ENTRY_MAGIC.len() <= buf.len() {
        let found = buf[at..]
            .windows(ENTRY_MAGIC.len())
            .position(|w| w == ENTRY_MAGIC)?;
        at += found;
        if matches!(decode_entry(&buf[at..]), EntryRead::Entry { .. }) {
            return Some(at);
        }
        at += 1;
    }
    None
}

/// The snapshot body: what the file holds, apart from its frame.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotBody {
    version: u64,
    topics: Vec<TopicRecord>,
}

/// The snapshot file of `state`.
pub(super) fn encode_snapshot(state: &MetaState) -> Vec<u8> {
    encode_snapshot_of(state.version, state.topics.values().map(|r| &**r))
}

/// The snapshot file of these topics at `version`, whether or not a state
/// could hold them (tests write impossible ones).
pub(super) fn encode_snapshot_of<'a>(
    version: u64,
    topics: impl Iterator<Item = &'a TopicRecord>,
) -> Vec<u8> {
    let body = SnapshotBody {
        version,
        topics: topics.cloned().collect(),
    };
    let body = serde_json::to_vec(&body).expect("a snapshot serializes");
    assert!(body.len() <= SNAPSHOT_BODY_BYTES_MAX, "snapshot too large");
    let mut file = Vec::with_capacity(SNAPSHOT_HEADER_BYTES + body.len());
    file.extend_from_slice(&SNAPSHOT_MAGIC);
    file.push(FORMAT);
    file.extend_from_slice(&(body.len() as u32).to_be_bytes());
    file.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
    file.extend_from_slice(&body);
    file
}

/// Whether `file` is a snapshot frame of a format this version does not know
/// (written by a newer version), as opposed to a damaged one: a higher format
/// byte, with a length and body checksum that hold. The format byte is outside
/// the checksum, so damage to it alone cannot be told from a newer version's
/// file, and is refused as one (the safe side: a fallback could roll back).
pub(super) fn snapshot_format_is_newer(file: &[u8]) -> bool {
    if file.len() < SNAPSHOT_HEADER_BYTES || file[..4] != SNAPSHOT_MAGIC || file[4] <= FORMAT {
        return false;
    }
    let body_len = u32::from_be_bytes(file[5..9].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_be_bytes(file[9..13].try_into().expect("4 bytes"));
    let body = &file[SNAPSHOT_HEADER_BYTES..];
    body.len() == body_len && crc32c::crc32c(body) == crc
}

/// The state a snapshot file holds, or why the file is not a sound snapshot. Every
/// record must keep the invariants `apply` keeps, so a snapshot cannot bring in a
/// state no sequence of commands could make.
pub(super) fn decode_snapshot(file: &[u8]) -> Result<MetaState, String> {
    if file.len() < SNAPSHOT_HEADER_BYTES {
        return Err(format!("{} bytes, shorter than a header", file.len()));
    }
    if file[..4] != SNAPSHOT_MAGIC {
        return Err("bad magic".to_string());
    }
    if file[4] != FORMAT {
        return Err(format!(
            "unknown format {} (written by a newer version?)",
            file[4]
        ));
    }
    let body_len = u32::from_be_bytes(file[5..9].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_be_bytes(file[9..13].try_into().expect("4 bytes"));
    let body = &file[SNAPSHOT_HEADER_BYTES..];
    if body.len() != body_len {
        return Err(format!(
            "header says {body_len} body bytes, the file holds {}",
            body.len()
        ));
    }
    if crc32c::crc32c(body) != crc {
        return Err("checksum mismatch".to_string());
    }
    let body: SnapshotBody =
        serde_json::from_slice(body).map_err(|e| format!("undecodable body: {e}"))?;
    // No command could follow it: the next index would wrap to 0.
    if body.version == u64::MAX {
        return Err(format!("version {} is out of range", body.version));
    }
    let mut state = MetaState {
        version: body.version,
        ..MetaState::default()
    };
    for record in body.topics {
        check_record(&record).map_err(|e| format!("topic {}: {e}", record.name))?;
        if state.topics.case_twin(&record.name).is_some() {
            return Err(format!(
                "topic {} is there twice, or twice in different case",
                record.name
            ));
        }
        if state.topics.contains_id(record.id) {
            return Err(format!(
                "topic {}: its incarnation id {} is another topic's too",
                record.name, record.id
            ));
        }
        state.topics.insert(Arc::new(record));
    }
    Ok(state)
}
