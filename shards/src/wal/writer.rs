//! The group-commit flush loop with its segment rolls.
//!
//! Runs on the WAL's shard only. The flush loop is the single writer of the active
//! segment: it owns the [`AppendFile`] outright, so no state around the device
//! write is shared with appenders except the staging buffers.
//!
//! The pipeline. A batch that fits one write run, taken when nothing is in
//! flight, goes out as one durable (`O_DSYNC`) write: write and sync in one
//! device round trip, and the batch staged meanwhile goes next (a large one
//! handed to the kernel before the callers of the one before it are released,
//! who would otherwise run first while it waits in the executor's queue). Such a batch
//! staged while a sync is in flight waits for that sync and then goes out the
//! same way, rather than being written beside it and synced after: the sync is
//! handed by the ring to a worker thread that runs on the shard's core (a wake-up
//! and two context switches each), where a durable write completes inline, and
//! once written beside a sync, every batch after it would be too for as long as
//! batches keep coming. Other batches
//! (several runs, a segment roll, or a write that grows the file) are written
//! and then synced while the next batch, if one is staged by then, is written: at most one sync and one write
//! are in flight, the write is issued only after the previous write completed
//! (both rewrite the partial block between them), and a batch is released only
//! by a sync issued after its own write completed. So at most two write runs are
//! ever unsynced at once, which is what the torn window of recovery allows for;
//! and once a sync has failed, no further run or roll is written (a later sync
//! succeeding says nothing of the failed one's lost sectors).
//! A batch that starts a segment waits for the sync in flight: the old segment
//! is sealed only whole. So does a batch of more than one run, whose runs are
//! synced one by one: its first sync would otherwise run beside the one in
//! flight.

use std::cell::Cell;
use std::future::poll_fn;
use std::io;
use std::rc::Rc;
use std::task::{Context, Poll};

use futures_lite::future::zip;

use narad_io::file::join;
use narad_io::{AppendFile, BlockFile, Storage};

use super::frame::{encoded_frame_len, FRAME_HEADER_BYTES};
use super::segment::{segment_name, WRITE_RUN_BYTES_MAX};
use super::{Job, Wal, STAGING_KEEP_BYTES};
use crate::ids::Seq;

/// The flush loop: takes whatever is staged, writes and syncs it, releases its
/// callers, and repeats until the WAL closes or latches. Each sync overlaps the
/// write of the batch staged next (see the module doc).
pub(super) async fn flush_loop<S: Storage>(
    wal: Wal<S>,
    active: AppendFile<Rc<S::File>>,
    active_first: Seq,
) {
    let mut writer = Writer {
        wal: wal.clone(),
        active,
        active_first,
        device_bytes_sealed: 0,
        reserve_tried: false,
    };
    // A batch written whose last run is not synced yet.
    let mut written: Option<Job> = None;
    // A batch taken but not written yet.
    let mut taken: Option<Job> = None;
    loop {
        let job = match written.take() {
            Some(job) => job,
            None => {
                let job = match taken.take() {
                    Some(job) => job,
                    None => match take_job(&wal).await {
                        Some(job) => job,
                        None => break,
                    },
                };
                // A write that grows the file (a segment made empty because
                // nothing was prepared, a batch that runs past the end of a
                // prepared one, a recycled segment shorter than the segment
                // size now configured) is a write and a sync either way (see
                // `narad_io::append`): the pipeline below overlaps the sync
                // with the next batch's write.
                if writer.takes_durable_write(&job) {
                    // Nothing in flight and one run: write it durably, in one
                    // round trip rather than a write and a sync.
                    match writer.write_durably(job).await {
                        Ok(next) => {
                            taken = next;
                            continue;
                        }
                        Err(()) => break,
                    }
                }
                if let Err(e) = writer.write_job(&job).await {
                    finish(&wal, job, Err(e), writer.device_bytes());
                    break;
                }
                job
            }
        };
        let file = writer.active.file().clone();
        let device_bytes = writer.device_bytes();
        let synced = Cell::new(false);
        let sync = async {
            let result = file.sync_data().await;
            wal.inner.shared.borrow_mut().stats.syncs += 1;
            synced.set(true);
            // Released at once, not after the write running beside it.
            finish(&wal, job, result, device_bytes)
        };
        let writer = &mut writer;
        let next = async {
            let next = poll_fn(|cx| {
                if synced.get() {
                    return Poll::Ready(None);
                }
                poll_take_job(&wal, cx)
            })
            .await?;
            // A batch that starts a segment, or that takes more than one run
            // (each run but the last is synced before the next), waits for the
            // sync in flight: a second sync must not run beside it, since one
            // that succeeded before the first one failed would let a further
            // run through.
            if !next.roll_points.is_empty()
                || next.buf.len() > WRITE_RUN_BYTES_MAX
                || writer.takes_durable_write(&next)
            {
                return Some((next, None));
            }
            let result = writer.write_job(&next).await;
            Some((next, Some(result)))
        };
        let (synced_ok, next) = zip(sync, next).await;
        // Let go of the file before a roll closes it.
        drop(file);
        let Some((next, result)) = next else {
            if synced_ok {
                continue;
            }
            break;
        };
        let result = match result {
            Some(result) => result,
            // One durable write, now that nothing is in flight.
            None if synced_ok && writer.takes_durable_write(&next) => {
                match writer.write_durably(next).await {
                    Ok(next) => {
                        taken = next;
                        continue;
                    }
                    Err(()) => break,
                }
            }
            // Starts a segment: written only now that the sync is done.
            None if synced_ok => writer.write_job(&next).await,
            None => Ok(()),
        };
        match result {
            // A failed sync latched the WAL: the callers of `next`, written
            // or not, see the latch.
            Ok(()) if !synced_ok => break,
            Ok(()) => written = Some(next),
            Err(e) => {
                finish(&wal, next, Err(e), writer.device_bytes());
                break;
            }
        }
    }
    let _ = writer.active.into_file().close().await;
}

/// Settles a batch: on success keeps its frames for readers and releases its
/// callers; on failure latches the WAL. Returns whether it succeeded.
fn finish<S: Storage>(
    wal: &Wal<S>,
    mut job: Job,
    result: io::Result<()>,
    device_bytes: u64,
) -> bool {
    // Durable frames go to the readers' memory before the release makes them
    // readable, so a dispatcher that keeps up never reads the device.
    let reusable = match &result {
        Ok(()) => keep_for_readers(wal, &mut job),
        Err(_) => None,
    };
    #[cfg(not(feature = "broken-ack-before-fsync"))]
    release(wal, &job, &result, device_bytes);
    if result.is_ok() {
        if let Some(observer) = wal.inner.observer.borrow().as_ref() {
            let records = job.end_seq.0 - job.first_seq.0;
            observer.synced(job.taken.elapsed(), records, device_bytes);
        }
    }
    if let Err(e) = &result {
        tracing::error!(error = %e, "ingress WAL write failed; refusing appends until restart");
        // The first failure is the cause; later ones follow from the latch.
        wal.inner
            .shared
            .borrow_mut()
            .latched
            .get_or_insert_with(|| Rc::from(latch_reason(e)));
        wake_all(wal);
    }
    if let Some(mut buf) = reusable {
        buf.clear();
        if buf.capacity() > STAGING_KEEP_BYTES {
            buf.shrink_to(STAGING_KEEP_BYTES);
        }
        let mut sh = wal.inner.shared.borrow_mut();
        if sh.spare.capacity() < buf.capacity() {
            sh.spare = buf;
        }
    }
    result.is_ok()
}

/// Why the WAL latched, as every later append reports it, to clients too: the
/// operating system's error ("No space left on device (os error 28)"),
/// without the operation, path and descriptor the I/O layer appends to it
/// (`…, op: Writing path: Some(…) with fd: Some(…)`); the log line above has
/// those.
fn latch_reason(e: &io::Error) -> String {
    if let Some(code) = e.raw_os_error() {
        return io::Error::from_raw_os_error(code).to_string();
    }
    let text = e.to_string();
    match text.split_once(", op: ") {
        Some((system, _)) => system.to_string(),
        None => text,
    }
}

/// Hands a flushed batch to the readers' memory; returns an evicted buffer to
/// reuse for staging.
fn keep_for_readers<S: Storage>(wal: &Wal<S>, job: &mut Job) -> Option<Vec<u8>> {
    let frames = bytes::Bytes::from(std::mem::take(&mut job.buf));
    let batch = super::RecentBatch {
        first: job.first_seq,
        end: job.end_seq,
        frames,
    };
    let bytes_max = wal.inner.config.reader_cache_bytes_max;
    wal.inner.shared.borrow_mut().keep_recent(batch, bytes_max)
}

async fn take_job<S: Storage>(wal: &Wal<S>) -> Option<Job> {
    poll_fn(|cx| poll_take_job(wal, cx)).await
}

/// The oldest staged batch if there is one, without waiting for one. The flush
/// loop calls [`take_job`] again before it next waits, and registers itself
/// then.
fn try_take_job<S: Storage>(wal: &Wal<S>) -> Option<Job> {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match poll_take_job(wal, &mut cx) {
        Poll::Ready(job) => job,
        Poll::Pending => None,
    }
}

/// The oldest staged batch, or `Ready(None)` when the WAL closes or latches with
/// nothing staged.
fn poll_take_job<S: Storage>(wal: &Wal<S>, cx: &mut Context<'_>) -> Poll<Option<Job>> {
    let mut guard = wal.inner.shared.borrow_mut();
    let sh = &mut *guard;
    let job = if let Some(mut job) = sh.sealed.pop_front() {
        sh.sealed_bytes -= job.buf.len();
        job.taken = std::time::Instant::now();
        job
    } else if !sh.staging.is_empty() {
        // Without a spare (the kept batch it would have been is still shared
        // by records on their way to a partition), the next staging buffer
        // starts at this one's size instead of doubling its way there.
        let spare = match std::mem::take(&mut sh.spare) {
            spare if spare.capacity() > 0 => spare,
            _ => Vec::with_capacity(sh.staging.len().min(STAGING_KEEP_BYTES)),
        };
        Job {
            buf: std::mem::replace(&mut sh.staging, spare),
            roll_points: std::mem::take(&mut sh.roll_points),
            first_seq: sh.inflight_end,
            end_seq: sh.next_seq,
            taken: std::time::Instant::now(),
        }
    } else {
        if sh.closing || sh.latched.is_some() {
            return Poll::Ready(None);
        }
        sh.flusher = Some(cx.waker().clone());
        return Poll::Pending;
    };
    debug_assert_eq!(job.first_seq, sh.inflight_end);
    sh.inflight_end = job.end_seq;
    // Waiters of later batches come along and wait again after a spurious wake.
    let staging_waiters = std::mem::take(&mut sh.staging_waiters);
    sh.inflight_waiters.extend(staging_waiters);
    drop(guard);
    #[cfg(feature = "broken-ack-before-fsync")]
    release(wal, &job, &Ok(()), 0);
    Poll::Ready(Some(job))
}

/// Publishes the outcome of a flush and wakes everyone it concerns.
fn release<S: Storage>(wal: &Wal<S>, job: &Job, result: &io::Result<()>, device_bytes: u64) {
    let mut sh = wal.inner.shared.borrow_mut();
    if result.is_ok() && job.end_seq > sh.durable_next {
        sh.durable_next = job.end_seq;
        sh.stats.flushes += 1;
        sh.waiting_since = (sh.next_seq > sh.durable_next).then(std::time::Instant::now);
    }
    sh.stats.device_bytes = sh.stats.device_bytes.max(device_bytes);
    drop(sh);
    wake_all(wal);
}

fn wake_all<S: Storage>(wal: &Wal<S>) {
    let mut guard = wal.inner.shared.borrow_mut();
    let sh = &mut *guard;
    let mut wakers: Vec<_> = sh.inflight_waiters.drain(..).collect();
    wakers.append(&mut sh.durable_listeners);
    // Appenders waiting for staging room wait on the next flush: wake them too.
    let staging: Vec<_> = if sh.latched.is_some() {
        sh.staging_waiters.drain(..).collect()
    } else {
        Vec::new()
    };
    drop(guard);
    for waker in wakers.into_iter().chain(staging) {
        waker.wake();
    }
}

/// A durable batch whose callers wait for the next write's submission
/// ([`Writer::write_durably`]). Released there, or when dropped unreleased
/// (the flush loop's future dropped with the write pending, as when the
/// executor goes away): its write completed, so its callers learn it is
/// durable rather than wait for a release that never comes.
struct HeldRelease<S: Storage> {
    wal: Wal<S>,
    job: Option<Job>,
    device_bytes: u64,
}

impl<S: Storage> HeldRelease<S> {
    fn release(mut self) {
        self.wal
            .inner
            .shared
            .borrow_mut()
            .stats
            .releases_after_next_write += 1;
        self.settle();
    }

    fn settle(&mut self) {
        if let Some(job) = self.job.take() {
            finish(&self.wal, job, Ok(()), self.device_bytes);
        }
    }
}

impl<S: Storage> Drop for HeldRelease<S> {
    fn drop(&mut self) {
        // Dropped while unwinding, or with the WAL's state borrowed: leave it
        // be (a drop runs where the runtime turns a panic into an abort).
        let free = self.wal.inner.shared.try_borrow_mut().is_ok();
        if free && !std::thread::panicking() {
            self.settle();
        }
    }
}

/// Whether the last run [`Writer::write_runs`] writes is durable when it returns.
#[derive(Clone, Copy)]
enum Durability {
    /// Synced by the caller, beside the next write.
    Later,
    /// An `O_DSYNC` write.
    Now,
}

struct Writer<S: Storage> {
    wal: Wal<S>,
    active: AppendFile<Rc<S::File>>,
    /// First sequence number of the active segment.
    active_first: Seq,
    /// Device bytes written to segments before the active one.
    device_bytes_sealed: u64,
    /// A reservation of the active segment's blocks was asked for (it grows).
    reserve_tried: bool,
}

impl<S: Storage> Writer<S> {
    /// Whether `job` goes out as one durable (`O_DSYNC`) write once nothing is
    /// in flight: one run that starts no segment and grows no file, with
    /// durable writes on. A write that grows the file is a write and a sync
    /// either way (see `narad_io::append`).
    fn takes_durable_write(&self, job: &Job) -> bool {
        self.wal.inner.config.durable_writes
            && job.roll_points.is_empty()
            && job.buf.len() <= WRITE_RUN_BYTES_MAX
            && !self.active.would_grow(job.buf.len() as u64)
    }

    /// Writes `job` as one durable write and settles it, then each batch
    /// staged meanwhile that also takes one, until none is staged; returns a
    /// batch it took that takes another kind of write, or an error once the
    /// WAL has latched (the flush loop ends).
    ///
    /// When the next batch's write is large (it goes out in pieces), the
    /// callers of the batch just written are released only once that write
    /// is in the kernel's hands ([`AppendFile::append_durable_then`]):
    /// released first, they would run (and stage their next appends) while it
    /// waited in the executor's queue, and the device sat idle. A small write
    /// is not held for them: the device is not what limits small batches, and
    /// the sooner a group commit goes out the less it carries (in the broker,
    /// 11% more WAL writes per message and 2% more CPU when every one was).
    async fn write_durably(&mut self, mut job: Job) -> Result<Option<Job>, ()> {
        let mut result = self.write_runs(&job.buf, Durability::Now).await;
        loop {
            if result.is_err() {
                finish(&self.wal, job, result, self.device_bytes());
                return Err(());
            }
            self.wal.inner.shared.borrow_mut().stats.syncs += 1;
            let device_bytes = self.device_bytes();
            let next = match try_take_job(&self.wal) {
                Some(next) if self.takes_durable_write(&next) => next,
                other => {
                    finish(&self.wal, job, result, device_bytes);
                    return Ok(other);
                }
            };
            self.mark_position(&next.buf);
            if !self.active.goes_in_pieces(next.buf.len()) {
                // Quick to copy: held back, its callers would only make the
                // next group commit start sooner and hold less.
                finish(&self.wal, job, Ok(()), device_bytes);
                result = self.active.append_durable(&[&next.buf]).await;
                job = next;
                continue;
            }
            let held = HeldRelease {
                wal: self.wal.clone(),
                job: Some(job),
                device_bytes,
            };
            result = self
                .active
                .append_durable_then(&[&next.buf], move || held.release())
                .await;
            job = next;
        }
    }

    fn device_bytes(&self) -> u64 {
        self.device_bytes_sealed + self.active.device_bytes_written()
    }

    /// Writes a batch: each stretch between roll points goes to its segment in runs
    /// of at most [`WRITE_RUN_BYTES_MAX`], each run but the last synced before the
    /// next; the caller syncs the last.
    async fn write_job(&mut self, job: &Job) -> io::Result<()> {
        let mut start = 0;
        for &roll_at in job
            .roll_points
            .iter()
            .chain(std::iter::once(&job.buf.len()))
        {
            self.reserve_if_growing().await;
            self.write_runs(&job.buf[start..roll_at], Durability::Later)
                .await?;
            if roll_at < job.buf.len() {
                let first = Seq(u64::from_be_bytes(
                    job.buf[roll_at + 8..roll_at + 16]
                        .try_into()
                        .expect("8 bytes"),
                ));
                self.check_latch()?;
                self.roll(first).await?;
            }
            start = roll_at;
        }
        Ok(())
    }

    /// An error once the WAL has latched: a sync that ran beside this batch's
    /// write failed, and may have lost sectors of the batch before it. Nothing
    /// more may then reach the segment (no further run, no roll): recovery
    /// takes frames after a hole for a torn write only within two runs of it
    /// (the module doc), so a third would make the segment unrecoverable.
    fn check_latch(&self) -> io::Result<()> {
        match &self.wal.inner.shared.borrow().latched {
            Some(why) => Err(io::Error::other(format!(
                "the WAL latched while this batch was written: {why}"
            ))),
            None => Ok(()),
        }
    }

    /// Records where the frames of `bytes`, about to be appended, start: the
    /// readers find a sequence number's frame by these.
    fn mark_position(&self, bytes: &[u8]) {
        if bytes.len() >= FRAME_HEADER_BYTES {
            let seq = Seq(u64::from_be_bytes(
                bytes[8..16].try_into().expect("8 bytes"),
            ));
            self.wal
                .inner
                .shared
                .borrow_mut()
                .add_mark(super::PositionMark {
                    seq,
                    segment: self.active_first,
                    pos: self.active.len(),
                });
        }
    }

    /// Writes `bytes` in runs, each but the last synced before the next; the
    /// last is durable when this returns only with [`Durability::Now`], which
    /// takes one run at most.
    async fn write_runs(&mut self, bytes: &[u8], durability: Durability) -> io::Result<()> {
        self.mark_position(bytes);
        let mut run_start = 0;
        while run_start < bytes.len() {
            if run_start > 0 {
                self.active.sync().await?;
                self.wal.inner.shared.borrow_mut().stats.syncs += 1;
                // That sync succeeding says nothing of one that failed beside
                // this write (an fsync reports an error once).
                self.check_latch()?;
            }
            let mut run_end = run_start;
            while run_end < bytes.len() {
                let len = encoded_frame_len(&bytes[run_end..]);
                if run_end > run_start && run_end + len - run_start > WRITE_RUN_BYTES_MAX {
                    break;
                }
                run_end += len;
            }
            let run = &bytes[run_start..run_end];
            match durability {
                Durability::Now => {
                    assert_eq!(run.len(), bytes.len(), "a durable write is one run");
                    self.active.append_durable(&[run]).await?;
                }
                Durability::Later => self.active.append(&[run]).await?,
            }
            run_start = run_end;
        }
        Ok(())
    }

    /// Before the first write into a segment that grows, reserves its blocks
    /// up to a full segment ([`super::room::reserve_growing`]): the appends
    /// staged for it were admitted by a measure of free space up to a second
    /// old, and from then on no write to it can run out of space. Asked once
    /// a segment: one the file system refused grows under the measure alone.
    async fn reserve_if_growing(&mut self) {
        let inner = &self.wal.inner;
        let wanted = {
            let sh = inner.shared.borrow();
            sh.active_grows && !sh.active_reserved
        };
        if !wanted || std::mem::replace(&mut self.reserve_tried, true) {
            return;
        }
        let file_bytes = self.active.file_bytes();
        let reserved =
            super::room::reserve_growing(self.active.file(), file_bytes, &inner.config).await;
        inner.shared.borrow_mut().active_reserved = reserved;
    }

    /// Seals the active segment (synced here) and starts the one beginning at
    /// `first`: the prepared spare if one is ready, else a new empty file.
    async fn roll(&mut self, first: Seq) -> io::Result<()> {
        let inner = &self.wal.inner;
        let name = join(&inner.dir, &segment_name(first));
        // Seal only what is durable.
        self.active.sync().await?;
        inner.shared.borrow_mut().stats.syncs += 1;
        // What the appenders stage from now on goes to the new segment: it
        // grows unless prepared (a prepared file is a full segment; a shorter
        // recycled one is found below).
        let (prepared, left_growing) = {
            let mut sh = inner.shared.borrow_mut();
            sh.rolls_pending -= 1;
            let prepared = std::mem::replace(&mut sh.prep_ready, false);
            // Not reserved until its first write (`reserve_if_growing`).
            sh.active_reserved = false;
            (prepared, std::mem::replace(&mut sh.active_grows, !prepared))
        };
        // Waits out a shortage of descriptors or memory rather than latch.
        let file = super::place::place_segment(&inner.storage, &inner.dir, &name, prepared).await?;
        let file = Rc::new(file);
        self.device_bytes_sealed += self.active.device_bytes_written();
        let old = std::mem::replace(&mut self.active, AppendFile::open_at(file, 0).await?);
        // A recycled segment may be shorter than the segment size now set.
        let file_bytes = self.active.file_bytes();
        let grows = !prepared || file_bytes < narad_io::align_up(inner.config.segment_bytes_max);
        self.reserve_tried = false;
        self.active_first = first;
        old.into_file().close().await?;
        {
            let mut sh = inner.shared.borrow_mut();
            sh.stats.rolls += 1;
            sh.stats.prepared_rolls += u64::from(prepared);
            sh.stats.early_rolls += u64::from(prepared && left_growing);
            sh.active_grows = grows;
            // A preparation that finished during this roll saw the old segment.
            sh.roll_onto_prepared_if_growing();
        }
        if inner.config.prealloc {
            super::upkeep::start_preparation(&self.wal);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::latch_reason;
    use std::io;

    #[test]
    fn a_latch_reason_is_the_systems_error_without_the_io_layers_wrapping() {
        let wrapped: io::Error = glommio::GlommioError::<()>::EnhancedIoError {
            source: io::Error::from_raw_os_error(ENOSPC),
            op: "Writing",
            path: Some("/data/ingress/shard-0/00000001.seg".into()),
            fd: Some(17),
        }
        .into();
        assert!(wrapped.to_string().contains("fd"), "{wrapped}");
        let reason = latch_reason(&wrapped);
        assert!(reason.contains("os error 28"), "{reason}");
        assert!(
            !reason.contains("shard-0") && !reason.contains("17"),
            "{reason}"
        );
        // An error of the WAL's own keeps its words.
        let short = io::Error::other("short write: 4096 of 28672 bytes");
        assert_eq!(latch_reason(&short), "short write: 4096 of 28672 bytes");
    }

    /// `ENOSPC` on Linux.
    const ENOSPC: i32 = 28;
}
