//! Background upkeep of one WAL: the lazy checkpoint flush, compaction behind the
//! durable checkpoint, rotation of a dispatched active segment, and preparation of
//! the next segment.
//!
//! Runs on the WAL's shard. The checkpoint block is written when a new value is
//! stored, at most once per `checkpoint_store_interval` (the newest value of the
//! interval; a process crash keeps it, so a restart replays at most an interval
//! of dispatched records more), and synced once the sync delay has passed since
//! the first unsynced store, so many stores share one `fdatasync`, or at once
//! when the stored value has passed the start of a segment (see
//! `sync_deadline`). Segments are removed (or kept as spares) only behind a
//! checkpoint value that is already durable: every sequence number below the
//! oldest segment left on disk was committed.

use std::future::poll_fn;
use std::io;
use std::task::Poll;
use std::time::Instant;

use futures_lite::future;
use narad_io::file::{join, OpenMode};
use narad_io::{BlockFile, Storage};

use super::checkpoint::CheckpointFile;
use super::segment::{segment_name, PREP_FILE, SPARE_PREFIX};
use super::Wal;
use crate::ids::Seq;
use crate::lines::LineThrottle;

/// Where a zero-filled segment is made before it is renamed `PREP_FILE`.
const PREP_TMP_FILE: &str = "next-segment.tmp";
/// Zero-filling writes this many bytes per device write.
const ZERO_FILL_CHUNK_BYTES: usize = 1 << 20;
/// Pause after a failed checkpoint store or sync before trying again.
const RETRY_DELAY: std::time::Duration = std::time::Duration::from_secs(1);
/// Pause after a failed segment preparation: on a full disk, each attempt would
/// write up to a segment of zeros again, competing with the appends' syncs.
const PREP_RETRY_DELAY: std::time::Duration = std::time::Duration::from_secs(10);
/// At most one line this often for checkpoint and compaction failures, which a
/// failing disk repeats every [`RETRY_DELAY`] for as long as it fails.
const ERROR_LINE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

thread_local! {
    /// One throttle per kind of failure, for every WAL of the thread (a shard's
    /// own and the leftover ones it drains fail together on one disk).
    static STORE_ERRORS: LineThrottle = const { LineThrottle::new(ERROR_LINE_EVERY) };
    static SYNC_ERRORS: LineThrottle = const { LineThrottle::new(ERROR_LINE_EVERY) };
    static COMPACT_ERRORS: LineThrottle = const { LineThrottle::new(ERROR_LINE_EVERY) };
}

/// Whether a failure counted by `lines` gets its line now (always while the
/// WAL closes: the last word matters then), and how many went without one.
fn error_line_due(
    lines: &'static std::thread::LocalKey<LineThrottle>,
    closing: bool,
) -> Option<u64> {
    if closing {
        // Outside the throttle: the line is the stop's, and counts nothing.
        return Some(0);
    }
    lines.with(|l| l.due(Instant::now()))
}

async fn signalled<S: Storage>(wal: &Wal<S>) {
    poll_fn(|cx| {
        let mut sh = wal.inner.shared.borrow_mut();
        if std::mem::take(&mut sh.upkeep_signal) {
            return Poll::Ready(());
        }
        sh.upkeep = Some(cx.waker().clone());
        Poll::Pending
    })
    .await
}

/// The upkeep task; ends when the WAL closes, after a last checkpoint sync.
pub(super) async fn upkeep_loop<S: Storage>(wal: Wal<S>, file: CheckpointFile<S::File>) {
    let delay = wal.inner.config.checkpoint_sync_delay;
    let store_interval = wal.inner.config.checkpoint_store_interval;
    let mut sync_due: Option<Instant> = None;
    // When the checkpoint block may next be written.
    let mut next_store_at: Option<Instant> = None;
    // The recovered checkpoint was synced at open: segments wholly behind it go
    // now, not when the checkpoint next moves, which on an idle node is never.
    let mut compaction_failed = !compact_logged(&wal).await;
    loop {
        let (wanted, mut written, synced, closing) = {
            let sh = wal.inner.shared.borrow();
            (
                sh.checkpoint_wanted,
                sh.checkpoint_written,
                sh.checkpoint_synced,
                sh.closing,
            )
        };
        // Stored now (`Some(now)`), or held back until the store interval ends
        // (`None`); a sync that falls due meanwhile goes first, of the value
        // written before.
        let store_now = if wanted > written {
            let now = Instant::now();
            match next_store_at.filter(|at| !closing && now < *at) {
                None => Some(now),
                Some(at) => {
                    let sync_is_due = written > synced && sync_due.is_some_and(|due| now >= due);
                    if !sync_is_due {
                        let wake = match sync_due.filter(|_| written > synced) {
                            Some(due) => at.min(due),
                            None => at,
                        };
                        narad_io::rt::sleep(wake - now).await;
                        continue;
                    }
                    None
                }
            }
        } else {
            None
        };
        if let Some(now) = store_now {
            // Overwrite now, so that a process crash keeps the newest value.
            next_store_at = Some(now + store_interval);
            if let Err(e) = file.store(wanted).await {
                wal.inner.shared.borrow_mut().checkpoint_failing = true;
                if let Some(held_back) = error_line_due(&STORE_ERRORS, closing) {
                    tracing::error!(error = %e, held_back, retry_in = ?RETRY_DELAY, "ingress WAL: cannot store the dispatch checkpoint (a restart replays what was committed since it last moved: duplicates, no loss)");
                }
                // A checkpoint left behind only replays (duplicates) what was already
                // committed; a closing WAL must not wait for a disk that fails.
                if closing {
                    break;
                }
                narad_io::rt::sleep(RETRY_DELAY).await;
                continue;
            }
            wal.inner.shared.borrow_mut().checkpoint_written = wanted;
            written = wanted;
            // A dispatcher that moves the checkpoint during every store must not
            // hold the sync off: once it is due, it comes before the next store.
            let due = sync_deadline(&wal, &mut sync_due, delay, written);
            if !closing && Instant::now() < due {
                continue;
            }
        }
        if written > synced {
            let due = sync_deadline(&wal, &mut sync_due, delay, written);
            let now = Instant::now();
            if !closing && now < due {
                future::or(narad_io::rt::sleep(due - now), signalled(&wal)).await;
                continue;
            }
            if let Err(e) = file.sync().await {
                wal.inner.shared.borrow_mut().checkpoint_failing = true;
                if let Some(held_back) = error_line_due(&SYNC_ERRORS, closing) {
                    tracing::error!(error = %e, held_back, retry_in = ?RETRY_DELAY, "ingress WAL: cannot sync the dispatch checkpoint");
                }
                // A failed sync may have dropped the stored value from the
                // device: store it again before the next sync vouches for it.
                wal.inner.shared.borrow_mut().checkpoint_written = synced;
                if closing {
                    break;
                }
                narad_io::rt::sleep(RETRY_DELAY).await;
                continue;
            }
            sync_due = None;
            {
                let mut sh = wal.inner.shared.borrow_mut();
                sh.checkpoint_synced = written;
                sh.stats.checkpoint_syncs += 1;
                sh.checkpoint_failing = false;
            }
            compaction_failed = !compact_logged(&wal).await;
            continue;
        }
        if closing {
            break;
        }
        if compaction_failed {
            // Tried again on its own: on an idle node the checkpoint, which
            // would bring the next attempt, may never move again. A signal
            // (a checkpoint to store) goes first, without an attempt.
            let retry = future::or(
                async {
                    narad_io::rt::sleep(RETRY_DELAY).await;
                    true
                },
                async {
                    signalled(&wal).await;
                    false
                },
            )
            .await;
            if retry {
                compaction_failed = !compact_logged(&wal).await;
            }
            continue;
        }
        signalled(&wal).await;
    }
}

/// When the stored checkpoint `written` is to be synced: `delay` after the
/// first store the last sync did not cover, or at once if it has passed the
/// start of a segment the last sync had not, so compaction can free that
/// segment now. A busy WAL fills a segment in well under `delay` (64 MiB
/// take about 60 ms at 1 GB/s); waiting would leave several segments behind
/// the checkpoint at each sync, more than are kept as spares, and the rolls
/// that follow would wait on zero-filled new files instead of recycled ones.
/// This adds at most one sync per segment.
fn sync_deadline<S: Storage>(
    wal: &Wal<S>,
    sync_due: &mut Option<Instant>,
    delay: std::time::Duration,
    written: Seq,
) -> Instant {
    let now = Instant::now();
    let due = *sync_due.get_or_insert(now + delay);
    let sh = wal.inner.shared.borrow();
    // The first segment start past the synced value (the oldest segment's own
    // start is no boundary: nothing before it is on disk).
    let first_unsynced = sh
        .segments
        .partition_point(|&start| start <= sh.checkpoint_synced);
    let frees_a_segment = sh
        .segments
        .get(first_unsynced.max(1))
        .is_some_and(|&next| next <= written);
    if frees_a_segment && due > now {
        *sync_due = Some(now);
        return now;
    }
    due
}

/// [`compact`], logging a failure; returns whether it succeeded.
async fn compact_logged<S: Storage>(wal: &Wal<S>) -> bool {
    match compact(wal).await {
        Ok(()) => true,
        Err(e) => {
            if let Some(held_back) = error_line_due(&COMPACT_ERRORS, false) {
                tracing::error!(error = %e, held_back, retry_in = ?RETRY_DELAY, "ingress WAL: compaction failed");
            }
            false
        }
    }
}

/// Removes (or keeps as spares) the segments wholly behind the durable
/// checkpoint, and asks for a rotation of a fully dispatched active segment.
async fn compact<S: Storage>(wal: &Wal<S>) -> io::Result<()> {
    let inner = &wal.inner;
    loop {
        let first = {
            let sh = inner.shared.borrow();
            match (sh.segments.front(), sh.segments.get(1)) {
                (Some(&first), Some(&next)) if next <= sh.checkpoint_synced => first,
                _ => break,
            }
        };
        let name = join(&inner.dir, &segment_name(first));
        let keep = inner.config.prealloc
            && inner.shared.borrow().spares.len() < inner.config.spare_segments_max
            && match full_size(wal, &name).await {
                Ok(full) => full,
                // An earlier attempt renamed it (so it was full size), then
                // failed to sync the directory: the rename below finds it gone.
                Err(e) if e.kind() == io::ErrorKind::NotFound => true,
                Err(e) => return Err(e),
            };
        if keep {
            let spare = join(
                &inner.dir,
                &format!("{SPARE_PREFIX}{}", segment_name(first)),
            );
            match inner.storage.rename(&name, &spare).await {
                Ok(()) => {}
                // An earlier attempt renamed it, then failed to sync the
                // directory: the segment is a spare already.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            inner.shared.borrow_mut().spares.push(spare);
        } else {
            inner.storage.remove(&name).await?;
        }
        let mut sh = inner.shared.borrow_mut();
        sh.segments.pop_front();
        sh.stats.compactions += 1;
    }
    let mut sh = inner.shared.borrow_mut();
    let dispatched = sh.checkpoint_synced == sh.next_seq;
    if dispatched && sh.active_bytes > inner.config.rotate_dispatched_bytes_min {
        sh.roll_requested = true;
    }
    drop(sh);
    if inner.config.prealloc {
        start_preparation(wal);
    }
    Ok(())
}

/// Whether the file at `path` is as large as a segment, so that recycling it
/// never grows it again (a segment that grew and was rolled away early is not).
async fn full_size<S: Storage>(wal: &Wal<S>, path: &str) -> io::Result<bool> {
    let file = wal.inner.storage.open(path, OpenMode::Existing).await?;
    let bytes = file.size().await;
    file.close().await?;
    Ok(bytes? >= narad_io::align_up(wal.inner.config.segment_bytes_max))
}

/// Starts preparing the next segment in the background unless one is ready or
/// being prepared.
pub(super) fn start_preparation<S: Storage>(wal: &Wal<S>) {
    {
        let mut sh = wal.inner.shared.borrow_mut();
        if sh.prep_ready || sh.prep_running || sh.closing || sh.latched.is_some() {
            return;
        }
        // The pause holds zero-filling back; a spare is renamed into place,
        // which takes no space.
        if sh.spares.is_empty() && sh.prep_retry_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        // Asked again at the next roll or compaction: the check costs nothing.
        if sh.spares.is_empty() && !super::room::room_for_segments(&wal.inner.config, 1) {
            sh.stats.preparations_held += 1;
            tracing::debug!(
                "ingress WAL: no room to prepare a segment; rolls create empty segments"
            );
            return;
        }
        sh.prep_running = true;
    }
    let wal = wal.clone();
    narad_io::rt::spawn_local(async move {
        let result = prepare(&wal).await;
        if result.is_err() {
            // A partial file only holds space a full disk lacks.
            let tmp = join(&wal.inner.dir, PREP_TMP_FILE);
            let _ = wal.inner.storage.remove(&tmp).await;
        }
        let mut sh = wal.inner.shared.borrow_mut();
        sh.prep_running = false;
        match result {
            Ok(true) => {
                sh.prep_ready = true;
                sh.prep_retry_at = None;
                sh.roll_onto_prepared_if_growing();
            }
            // Given up for the close: there is no prepared segment, and a
            // roll the close still flushes creates its segment instead.
            Ok(false) => {}
            Err(e) => {
                sh.prep_retry_at = Some(Instant::now() + PREP_RETRY_DELAY);
                sh.stats.preparations_failed += 1;
                tracing::warn!(error = %e, retry_in = ?PREP_RETRY_DELAY, "ingress WAL: segment preparation failed; rolls create empty segments")
            }
        }
    });
}

/// Makes `next-segment.prep`: a recycled spare if there is one (its old frames
/// carry old sequence numbers and are never taken for new ones), else a new file
/// zero-filled to the full segment size and synced. A spare smaller than a
/// segment (one that grew and was rolled away early) is removed, not recycled:
/// writes past its end would grow it again. Returns whether it made it (`false`:
/// the WAL began closing during the zero-fill, which it gave up).
async fn prepare<S: Storage>(wal: &Wal<S>) -> io::Result<bool> {
    let inner = &wal.inner;
    let prep = join(&inner.dir, PREP_FILE);
    loop {
        let Some(spare) = inner.shared.borrow_mut().spares.pop() else {
            break;
        };
        // Compaction keeps only full-size spares; one found at open may not be.
        if !full_size(wal, &spare).await? {
            inner.storage.remove(&spare).await?;
            continue;
        }
        inner.storage.rename(&spare, &prep).await?;
        inner.shared.borrow_mut().stats.segments_recycled += 1;
        return Ok(true);
    }
    let tmp = join(&inner.dir, PREP_TMP_FILE);
    let file = inner.storage.open(&tmp, OpenMode::CreateOrOpen).await?;
    let zeros = vec![0u8; ZERO_FILL_CHUNK_BYTES];
    let size = narad_io::align_up(inner.config.segment_bytes_max);
    let mut pos = 0;
    while pos < size {
        if inner.shared.borrow().closing {
            file.close().await?;
            inner.storage.remove(&tmp).await?;
            return Ok(false);
        }
        let len = ((size - pos) as usize).min(zeros.len());
        file.write_at(pos, &zeros[..len]).await?;
        pos += len as u64;
    }
    file.sync_data().await?;
    file.close().await?;
    inner.storage.rename(&tmp, &prep).await?;
    inner.shared.borrow_mut().stats.segments_zero_filled += 1;
    Ok(true)
}
