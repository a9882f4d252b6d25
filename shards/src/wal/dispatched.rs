//! What a graceful stop leaves for the next start: which records above the
//! checkpoint were already committed.
//!
//! The checkpoint stops at the first record not committed, so records committed
//! above it (to healthy partitions, while one partition's commits keep failing)
//! would be committed again after a restart: duplicates, acknowledged ones among
//! them. A graceful stop writes the dispatcher's done-set beside the checkpoint,
//! and the next open hands it back, once.
//!
//! Stored in the file `dispatched`: a 32-byte header `magic "NWDS" | version u8 |
//! 3 zero bytes | checkpoint u64 | next_seq u64 | flags u32 | crc32c u32`, then
//! `ceil(flags / 8)` bytes of flags (bit `i % 8` of byte `i / 8` says whether
//! `checkpoint + i` is done), zero-padded to whole blocks; the checksum covers the
//! 28 header bytes before it and the flag bytes. It is written to
//! `dispatched.tmp`, synced and renamed into place after the WAL's last flush and
//! the checkpoint's last sync.
//!
//! The open trusts it only when its checkpoint and `next_seq` are exactly what
//! recovery found (so no record was appended, lost or compacted since, and every
//! flag names the record it was written for), and removes it whatever it holds:
//! a crash after the start replays from the checkpoint as always. Trusting a
//! wrong flag would lose a record, so anything doubtful (a bad checksum, a
//! mismatch, a read error) is dropped with a warning, which costs only the
//! duplicates this file exists to avoid.

use narad_io::file::{join, OpenMode};
use narad_io::{BlockFile, Storage, BLOCK_BYTES};

use super::progress::{DispatchProgress, TRACKED_SEQS_MAX};
use super::Wal;
use crate::ids::Seq;

/// File name of the done-set inside a WAL directory.
pub const DISPATCHED_FILE: &str = "dispatched";
const MAGIC: [u8; 4] = *b"NWDS";
const VERSION: u8 = 1;
const HEADER_BYTES: usize = 32;

/// Encodes `progress` for a WAL whose next record will be `next_seq`, padded to
/// whole blocks.
pub fn encode(progress: &DispatchProgress, next_seq: Seq) -> Vec<u8> {
    let flags = progress.done_above();
    let count = flags.len();
    let bytes = HEADER_BYTES + count.div_ceil(8);
    let mut out = vec![0u8; bytes.div_ceil(BLOCK_BYTES) * BLOCK_BYTES];
    out[..4].copy_from_slice(&MAGIC);
    out[4] = VERSION;
    out[8..16].copy_from_slice(&progress.checkpoint().0.to_be_bytes());
    out[16..24].copy_from_slice(&next_seq.0.to_be_bytes());
    out[24..28].copy_from_slice(&(count as u32).to_be_bytes());
    for (i, done) in flags.enumerate() {
        out[HEADER_BYTES + i / 8] |= u8::from(done) << (i % 8);
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out[..28]), &out[HEADER_BYTES..bytes]);
    out[28..32].copy_from_slice(&crc.to_be_bytes());
    out
}

/// Decodes a done-set written for a WAL recovered at `checkpoint` with
/// `next_seq`; `Err` says why it cannot be trusted.
pub fn decode(bytes: &[u8], checkpoint: Seq, next_seq: Seq) -> Result<DispatchProgress, String> {
    if bytes.len() < HEADER_BYTES || bytes[..4] != MAGIC || bytes[4] != VERSION {
        return Err("not a done-set of this version".into());
    }
    let word = |at: usize| u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let (stored_checkpoint, stored_next) = (Seq(word(8)), Seq(word(16)));
    let count = u32::from_be_bytes(bytes[24..28].try_into().expect("4 bytes")) as u64;
    let end = HEADER_BYTES as u64 + count.div_ceil(8);
    if count > TRACKED_SEQS_MAX || end > bytes.len() as u64 {
        return Err(format!("{count} flags do not fit the file"));
    }
    let flag_bytes = &bytes[HEADER_BYTES..end as usize];
    let crc = u32::from_be_bytes(bytes[28..32].try_into().expect("4 bytes"));
    if crc32c::crc32c_append(crc32c::crc32c(&bytes[..28]), flag_bytes) != crc {
        return Err("checksum mismatch".into());
    }
    if (stored_checkpoint, stored_next) != (checkpoint, next_seq) {
        return Err(format!(
            "written at checkpoint {stored_checkpoint} and next record {stored_next}, but the WAL \
             recovered {checkpoint} and {next_seq}"
        ));
    }
    if checkpoint.0 + count > next_seq.0 {
        return Err(format!("{count} flags reach past the end of the WAL"));
    }
    let flags = (0..count as usize).map(|i| flag_bytes[i / 8] & (1 << (i % 8)) != 0);
    DispatchProgress::resume(checkpoint, flags)
        .ok_or_else(|| "the checkpoint's own record is flagged done".into())
}

/// Reads and removes the done-set of the WAL in `dir`, if it has one, and
/// returns it if it can be trusted for a WAL recovered at `checkpoint` with
/// `next_seq` (see the module docs). Only listing the directory can fail.
pub async fn take<S: Storage>(
    storage: &S,
    dir: &str,
    checkpoint: Seq,
    next_seq: Seq,
) -> std::io::Result<Option<DispatchProgress>> {
    if !storage
        .list(dir)
        .await?
        .iter()
        .any(|n| n == DISPATCHED_FILE)
    {
        return Ok(None);
    }
    let path = join(dir, DISPATCHED_FILE);
    let read = async {
        let file = storage.open(&path, OpenMode::Existing).await?;
        let size = file.size().await?;
        let mut bytes = vec![0u8; (size as usize).div_ceil(BLOCK_BYTES) * BLOCK_BYTES];
        let read = file.read_at(0, &mut bytes).await;
        file.close().await?;
        bytes.truncate(read?);
        std::io::Result::Ok(bytes)
    };
    let progress = match read.await {
        Ok(bytes) => decode(&bytes, checkpoint, next_seq).map_err(|why| {
            tracing::warn!(wal = dir, reason = %why, "ingress WAL: the done-set a graceful stop left is not used; records committed above the checkpoint before the stop may be committed again");
        }),
        Err(e) => {
            tracing::warn!(wal = dir, error = %e, "ingress WAL: cannot read the done-set a graceful stop left; records committed above the checkpoint before the stop may be committed again");
            Err(())
        }
    };
    // Taken once: a file left behind would be checked again at the next open,
    // and trusted only if nothing moved since, so a failed removal costs no
    // record, but it is not trusted now either.
    if let Err(e) = storage.remove(&path).await {
        tracing::warn!(wal = dir, error = %e, "ingress WAL: cannot remove the done-set a graceful stop left; it is not used");
        return Ok(None);
    }
    Ok(progress.ok())
}

/// Writes `progress` as the done-set of the WAL in `dir`, whose next record
/// will be `next_seq`: through a synced temporary file renamed into place.
pub async fn store<S: Storage>(
    storage: &S,
    dir: &str,
    progress: &DispatchProgress,
    next_seq: Seq,
) -> std::io::Result<()> {
    let tmp = join(dir, "dispatched.tmp");
    let file = storage.open(&tmp, OpenMode::CreateOrOpen).await?;
    let written = async {
        file.write_at(0, &encode(progress, next_seq)).await?;
        file.sync_data().await
    }
    .await;
    file.close().await?;
    written?;
    storage.rename(&tmp, &join(dir, DISPATCHED_FILE)).await
}

impl<S: Storage> Wal<S> {
    /// The done-set the last graceful stop left (see the module docs), if the
    /// open could trust it: for the dispatcher, once.
    pub fn take_dispatched(&self) -> Option<DispatchProgress> {
        self.inner.dispatched.borrow_mut().take()
    }

    /// Leaves the dispatcher's progress at its stop for [`Wal::close`] to write,
    /// so that the next start does not commit again what it says is done.
    pub fn leave_dispatched(&self, progress: DispatchProgress) {
        *self.inner.dispatched.borrow_mut() = Some(progress);
    }

    /// Writes the done-set [`Wal::leave_dispatched`] left, if it is worth
    /// writing and its checkpoint is the durable one: at the close, once the
    /// flush loop and the checkpoint's last sync are over.
    pub(super) async fn store_dispatched(&self) {
        let Some(progress) = self.inner.dispatched.borrow_mut().take() else {
            return;
        };
        let (synced, next_seq) = {
            let sh = self.inner.shared.borrow();
            (sh.checkpoint_synced, sh.durable_next)
        };
        // Only a progress whose checkpoint is the durable one says something
        // the next open can check (it also checks `next_seq`, which records
        // written but not durable here would change).
        let done = progress.done_above().filter(|&d| d).count();
        if done == 0 || progress.checkpoint() != synced {
            return;
        }
        let dir = &self.inner.dir;
        match store(&self.inner.storage, dir, &progress, next_seq).await {
            Ok(()) => {
                tracing::info!(wal = %dir, checkpoint = synced.0, done, "ingress WAL: left the records committed above the checkpoint for the next start")
            }
            Err(e) => {
                tracing::warn!(wal = %dir, error = %e, done, "ingress WAL: cannot write the done-set; the next start may commit again records committed above the checkpoint")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress() -> DispatchProgress {
        let mut p = DispatchProgress::new(Seq(100));
        for s in [101, 102, 108, 150] {
            p.mark_done(Seq(s));
        }
        p
    }

    #[test]
    fn round_trip() {
        let bytes = encode(&progress(), Seq(200));
        assert_eq!(bytes.len() % BLOCK_BYTES, 0);
        let back = decode(&bytes, Seq(100), Seq(200)).expect("trusted");
        assert_eq!(
            back.done_above().collect::<Vec<_>>(),
            progress().done_above().collect::<Vec<_>>()
        );
        assert!(back.is_done(Seq(150)) && !back.is_done(Seq(103)));
    }

    #[test]
    fn a_done_set_is_refused_unless_it_matches_the_recovered_wal() {
        let bytes = encode(&progress(), Seq(200));
        assert!(decode(&bytes, Seq(99), Seq(200)).is_err(), "checkpoint");
        assert!(decode(&bytes, Seq(100), Seq(201)).is_err(), "next_seq");
        // Flags past the end of the WAL.
        assert!(decode(&encode(&progress(), Seq(120)), Seq(100), Seq(120)).is_err());
        for bit in 0..(HEADER_BYTES + 7) * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(&damaged, Seq(100), Seq(200)).is_err(), "bit {bit}");
        }
        assert!(decode(&[0u8; BLOCK_BYTES], Seq(0), Seq(0)).is_err());
        assert!(decode(&bytes[..20], Seq(100), Seq(200)).is_err());
    }
}
