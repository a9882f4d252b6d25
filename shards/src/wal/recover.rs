//! Recovery at open: the segments dispatch will replay verified, the end of the
//! last one found and a torn run erased, and the checkpoint settled.

use std::collections::VecDeque;
use std::io;
use std::rc::Rc;

use narad_io::file::{join, OpenMode};
use narad_io::{AppendFile, BlockFile, Storage};

use super::checkpoint::CheckpointFile;
use super::segment::{self, parse_segment_name, segment_name, ScanError, PREP_FILE, SPARE_PREFIX};
use super::WalError;
use crate::ids::Seq;

/// What recovery hands to the running WAL.
pub(super) struct Recovered<F> {
    pub active: AppendFile<Rc<F>>,
    pub segments: VecDeque<Seq>,
    pub next_seq: Seq,
    pub checkpoint: Seq,
    pub checkpoint_file: CheckpointFile<F>,
    pub spares: Vec<String>,
    pub prep_ready: bool,
    /// Where the scans resumed past damage below the checkpoint: (segment,
    /// sequence number, byte position of its frame).
    pub resumed: Vec<(Seq, Seq, u64)>,
}

fn corrupt(name: &str, e: ScanError) -> WalError {
    match e {
        ScanError::Io(e) => WalError::Io(format!("{name}: {e}").into()),
        ScanError::Corrupt {
            position_bytes,
            expected,
            why,
        } => WalError::Corrupt(
            format!("{name} at byte {position_bytes} (expecting seq {expected}): {why}").into(),
        ),
    }
}

/// Scans the WAL directory: verifies the segments that dispatch will replay,
/// recovers the end of the last one and erases a torn run, and settles the
/// checkpoint.
pub(super) async fn recover<S: Storage>(
    storage: &S,
    dir: &str,
) -> Result<Recovered<S::File>, WalError> {
    let mut segments = VecDeque::new();
    let mut spares = Vec::new();
    let mut prep_ready = false;
    for name in storage.list(dir).await? {
        if let Some(first) = parse_segment_name(&name) {
            segments.push_back(first);
        } else if name.starts_with(SPARE_PREFIX) {
            spares.push(join(dir, &name));
        } else if name == PREP_FILE {
            prep_ready = true;
        } else if name.ends_with(".tmp") {
            storage.remove(&join(dir, &name)).await?;
        }
    }
    let (checkpoint_file, stored) = CheckpointFile::open(storage, dir).await?;
    if segments.is_empty() {
        // Sequence numbers may restart here (no checkpoint survived), so spare
        // files could hold frames with the very numbers about to be written: drop
        // them rather than recycle them.
        for spare in spares.drain(..) {
            storage.remove(&spare).await?;
        }
        if prep_ready {
            storage.remove(&join(dir, PREP_FILE)).await?;
            prep_ready = false;
        }
        let start = stored.unwrap_or_default();
        segments.push_back(start);
        let file = storage
            .open(&join(dir, &segment_name(start)), OpenMode::CreateOrOpen)
            .await?;
        checkpoint_file.store(start).await?;
        checkpoint_file.sync().await?;
        return Ok(Recovered {
            active: AppendFile::open_at(Rc::new(file), 0).await?,
            segments,
            next_seq: start,
            checkpoint: start,
            checkpoint_file,
            spares,
            prep_ready,
            resumed: Vec::new(),
        });
    }
    let oldest = segments[0];
    let checkpoint = match stored {
        Some(seq) if seq >= oldest => seq,
        Some(seq) => {
            tracing::warn!(
                checkpoint = seq.0,
                oldest_segment = oldest.0,
                "ingress dispatch checkpoint was below the oldest WAL segment; dispatch starts at that segment"
            );
            oldest
        }
        None => oldest,
    };
    // Sealed segments that hold records at or past the checkpoint must be whole
    // from the checkpoint on; damage wholly below it is stepped over, resuming
    // only at a frame of this WAL's key (`segment::scan_past_dispatched`).
    let mut resumed = Vec::new();
    let key_check = super::key::load_existing(storage, dir)
        .await?
        .map(|key| key.check());
    for pair in segments
        .iter()
        .zip(segments.iter().skip(1))
        .collect::<Vec<_>>()
    {
        let (&first, &next_first) = pair;
        if next_first <= checkpoint || next_first <= first {
            continue;
        }
        let name = join(dir, &segment_name(first));
        let file = storage.open(&name, OpenMode::Existing).await?;
        let end = segment::scan_past_dispatched(
            &file,
            first,
            Some(Seq(next_first.0 - 1)),
            checkpoint,
            key_check,
        )
        .await
        .map_err(|e| corrupt(&name, e))?;
        note_resumed(&mut resumed, first, &end);
        file.close().await?;
    }
    let last = *segments.back().expect("at least one segment");
    let name = join(dir, &segment_name(last));
    let file = storage.open(&name, OpenMode::Existing).await?;
    let end = segment::scan_past_dispatched(&file, last, None, checkpoint, key_check)
        .await
        .map_err(|e| corrupt(&name, e))?;
    note_resumed(&mut resumed, last, &end);
    let resume_bytes = erase_torn_run(&file, &end).await?;
    // Frames a killed process wrote but never synced are readable and valid, and
    // the scan took them: make them durable before they count as such (before
    // the dispatcher reads them and before a roll can seal this segment).
    file.sync_data().await?;
    let checkpoint = if checkpoint > end.next_seq {
        tracing::error!(
            checkpoint = checkpoint.0,
            durable_end = end.next_seq.0,
            "ingress dispatch checkpoint is past the end of the WAL; using the end"
        );
        // Bytes the checkpoint vouched for are gone, so sequence numbers the
        // recycled files may hold could be written again: drop them rather
        // than recycle them, as when no segment survives.
        for spare in spares.drain(..) {
            storage.remove(&spare).await?;
        }
        if prep_ready {
            storage.remove(&join(dir, PREP_FILE)).await?;
            prep_ready = false;
        }
        end.next_seq
    } else {
        checkpoint
    };
    // The recovered value is made durable before anything compacts behind it.
    checkpoint_file.store(checkpoint).await?;
    checkpoint_file.sync().await?;
    Ok(Recovered {
        active: AppendFile::open_at(Rc::new(file), resume_bytes).await?,
        segments,
        next_seq: end.next_seq,
        checkpoint,
        checkpoint_file,
        spares,
        prep_ready,
        resumed,
    })
}

/// Adds where segment `first`'s scan resumed past damage (`end.skipped`) to
/// `resumed`, as (segment, first seq after the run, byte to resume at).
fn note_resumed(resumed: &mut Vec<(Seq, Seq, u64)>, first: Seq, end: &segment::ScanEnd) {
    resumed.extend(
        end.skipped
            .iter()
            .map(|run| (first, run.seqs.end, run.resume_bytes)),
    );
}

/// Zeroes the frames of a torn run that survived past a hole, so that no frame of
/// an unacknowledged write can be read as part of the new run written over it.
/// Returns the byte position appends resume at.
#[cfg(not(feature = "broken-no-torn-truncation"))]
async fn erase_torn_run<F: BlockFile>(file: &F, end: &segment::ScanEnd) -> io::Result<u64> {
    if let Some(torn_until) = end.torn_until_bytes {
        // Normally the survivors of a write that was never acknowledged; but bit
        // rot inside the window looks the same, so say loudly what goes.
        tracing::error!(
            position_bytes = end.end_bytes,
            torn_until_bytes = torn_until,
            from_seq = end.next_seq.0,
            to_seq = end.torn_last_seq.map_or(end.next_seq.0, |s| s.0),
            "ingress WAL: erasing frames found past a bad frame in the last segment (a torn write; were the bad frame rot instead, seqs from_seq..=to_seq are lost)"
        );
        let start = narad_io::align_down(end.end_bytes);
        let stop = narad_io::align_up(torn_until);
        // Keep the good bytes of the first block; zero everything after them.
        let mut block = read_stable_block(file, start).await?;
        block[(end.end_bytes - start) as usize..].fill(0);
        file.write_at(start, &block).await?;
        let zeros = vec![0u8; 1 << 20];
        let mut pos = start + narad_io::BLOCK_BYTES as u64;
        while pos < stop {
            let len = ((stop - pos) as usize).min(zeros.len());
            file.write_at(pos, &zeros[..len]).await?;
            pos += len as u64;
        }
        file.sync_data().await?;
    }
    Ok(end.end_bytes)
}

/// Reads of a block about to be written back, at most, while they disagree.
#[cfg(not(feature = "broken-no-torn-truncation"))]
const BLOCK_READS_MAX: usize = 4;

/// Reads the block at `pos` until two reads in a row agree: its bytes are written
/// back, so a bit one bad read flipped would become a durable flip inside
/// acknowledged frames. Fails if the device never gives the same bytes twice.
#[cfg(not(feature = "broken-no-torn-truncation"))]
async fn read_stable_block<F: BlockFile>(file: &F, pos: u64) -> io::Result<Vec<u8>> {
    let mut previous = vec![0u8; narad_io::BLOCK_BYTES];
    let mut block = vec![0u8; narad_io::BLOCK_BYTES];
    file.read_at(pos, &mut previous).await?;
    for _ in 1..BLOCK_READS_MAX {
        file.read_at(pos, &mut block).await?;
        if block == previous {
            return Ok(block);
        }
        tracing::warn!(
            position_bytes = pos,
            "ingress WAL: two reads of a block differ: the device returned unstable data"
        );
        std::mem::swap(&mut block, &mut previous);
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the device returns different bytes on every read of the block at {pos}"),
    ))
}

/// Deliberately broken: resumes after the surviving frames of a torn run instead of
/// at the hole in front of them. Exists only to show the crash tests fail.
#[cfg(feature = "broken-no-torn-truncation")]
async fn erase_torn_run<F: BlockFile>(_file: &F, end: &segment::ScanEnd) -> io::Result<u64> {
    Ok(end.torn_until_bytes.unwrap_or(end.end_bytes))
}
