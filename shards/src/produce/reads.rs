//! Reads and stats of the partitions this shard owns: from the open log's
//! recent-frame cache without the partition's lock when it covers the offset,
//! else under the lock from the log, which is opened first if it is closed.
//! Stats of a closed log are the shape it closed with (nothing changes a closed
//! log's files without opening it first), so they never open one.
//!
//! Which cores: the owner's shard, as the rest of [`Owner`]. A read's caller may
//! go away half way (a consume whose client hung up): the log it took out of
//! its slot goes back when the read is dropped, and a log that had to be opened
//! is opened by a task of its own, so neither a use nor an open is ever cut
//! short with the log's writes (a chunk preparation) in flight.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use narad_io::Storage;

use super::combiner::{Owner, Slot};
use super::types::{PartitionStats, ReadError};
use crate::ids::{IncarnationId, PartitionId};
use crate::log::{read_cached, LogError, PartitionLog, ReadBatch, ReadRange};

/// A log taken out of its slot for one use by a caller that may go away half
/// way (a consume whose client hung up drops its read): dropped unfinished, it
/// puts the log back under the slot's lock, which the caller still holds, so
/// the slot never loses its open log (with a chunk preparation in flight) nor
/// the count of open logs its decrement.
struct Taken<'a, S: Storage> {
    owner: &'a Owner<S>,
    slot: &'a Slot<S>,
    log: Option<PartitionLog<S>>,
}

impl<'a, S: Storage> Taken<'a, S> {
    /// Runs `f` on `log`, taken out of `slot` (whose lock the caller holds),
    /// and hands the log back for the caller to put back or close; dropped
    /// half way, the log goes back to the slot.
    async fn run<T>(
        owner: &'a Owner<S>,
        slot: &'a Slot<S>,
        log: PartitionLog<S>,
        f: impl AsyncFnOnce(&mut PartitionLog<S>) -> T,
    ) -> (T, PartitionLog<S>) {
        let mut taken = Taken {
            owner,
            slot,
            log: Some(log),
        };
        let result = f(taken.log.as_mut().expect("taken above")).await;
        (result, taken.log.take().expect("taken above"))
    }
}

impl<S: Storage> Drop for Taken<'_, S> {
    fn drop(&mut self) {
        let Some(log) = self.log.take() else {
            return;
        };
        if let Some(poisoned) = self.owner.return_log(self.slot, log) {
            if narad_io::rt::can_spawn() {
                narad_io::rt::spawn_local(async move {
                    let _ = poisoned.close().await;
                });
            }
        }
    }
}

impl<S: Storage> Owner<S> {
    /// The partition's slot, for a use that must not start while the owner
    /// stops or once the partition is no longer live here.
    fn slot_for_use(
        &self,
        topic: &Arc<str>,
        incarnation: IncarnationId,
        partition: PartitionId,
    ) -> Result<Rc<Slot<S>>, ReadError> {
        if self.closing.get() {
            return Err(ReadError::Stopping);
        }
        if !self.is_live(topic, incarnation, partition) {
            return Err(ReadError::NotFound);
        }
        Ok(self.slot(topic, incarnation, partition))
    }

    /// Runs `f` on the partition's log under its lock.
    async fn with_log<T>(
        self: &Rc<Self>,
        topic: &Arc<str>,
        incarnation: IncarnationId,
        partition: PartitionId,
        f: impl AsyncFnOnce(&mut PartitionLog<S>) -> Result<T, ReadError>,
    ) -> Result<T, ReadError> {
        let slot = self.slot_for_use(topic, incarnation, partition)?;
        let _guard = loop {
            let guard = slot.lock.lock().await;
            // The stop retires every slot: that is not a deleted topic.
            if self.closing.get() {
                return Err(ReadError::Stopping);
            }
            if slot.retired.get() {
                return Err(ReadError::NotFound);
            }
            if slot.log.borrow().is_some() {
                break guard;
            }
            // A closed log is opened by a task of its own, which puts it in
            // the slot: an open dropped half way (its caller went away) would
            // leave a half-recovered log behind with writes in flight.
            drop(guard);
            let (owner, opening) = (self.clone(), slot.clone());
            let opened =
                narad_io::rt::spawn_local(async move { owner.open_into_slot(&opening).await })
                    .await;
            match opened {
                Some(Ok(())) => {}
                Some(Err(e)) => return Err(ReadError::Failed(e)),
                None => return Err(ReadError::Stopping),
            }
        };
        let log = slot
            .log
            .borrow_mut()
            .take()
            .expect("checked under the lock");
        slot.last_used.set(Instant::now());
        let (result, log) = Taken::run(self, &slot, log, f).await;
        self.put_back(&slot, log).await;
        result
    }

    /// Opens the slot's log into it, under its lock, unless it is open or the
    /// slot retired meanwhile.
    async fn open_into_slot(&self, slot: &Slot<S>) -> Result<(), String> {
        let _guard = slot.lock.lock().await;
        if slot.retired.get() || slot.log.borrow().is_some() {
            return Ok(());
        }
        let log = self.open_log(slot).await?;
        *slot.log.borrow_mut() = Some(log);
        // Used now: idle eviction must not close it before its caller runs.
        slot.last_used.set(Instant::now());
        Ok(())
    }

    /// Reads `range`, below the high watermark.
    pub async fn read(
        self: &Rc<Self>,
        topic: &Arc<str>,
        incarnation: IncarnationId,
        partition: PartitionId,
        range: ReadRange,
    ) -> Result<ReadBatch, ReadError> {
        if self.is_live(topic, incarnation, partition) {
            if let Some(batch) = self.read_cached(incarnation, partition, range) {
                self.note_read(incarnation, partition, 0);
                return Ok(batch);
            }
        }
        let (batch, device_bytes) = self
            .with_log(topic, incarnation, partition, async |log| {
                read_log(log, range).await
            })
            .await?;
        self.note_read(incarnation, partition, device_bytes);
        Ok(batch)
    }

    /// Tells the partition's observer, if any, that a read was answered.
    fn note_read(&self, incarnation: IncarnationId, partition: PartitionId, device_bytes: u64) {
        let slots = self.slots.borrow();
        if let Some(observer) = slots
            .get(&(incarnation, partition))
            .and_then(|slot| slot.observer.as_ref())
        {
            observer.read(device_bytes);
        }
    }

    /// A read served from the open log's recent-frame cache, without the lock;
    /// `None` when the cache does not cover `from` (or no log is open).
    fn read_cached(
        &self,
        incarnation: IncarnationId,
        partition: PartitionId,
        range: ReadRange,
    ) -> Option<ReadBatch> {
        let slot = self
            .slots
            .borrow()
            .get(&(incarnation, partition))
            .cloned()?;
        if slot.retired.get() {
            return None;
        }
        let cache = slot.cache.borrow().clone()?;
        let cache = cache.borrow();
        read_cached(&cache, range)
    }

    /// Runs `f` on the partition's log under its lock, as an observer: an
    /// open log is used without counting as a use (idle eviction still closes
    /// it on time), and a closed one is opened for `f` and closed again after,
    /// its shape remembered. For the metrics poller, which after a start must
    /// learn about partitions no client touched without keeping each log (its
    /// read window and cache) open until idle eviction.
    async fn with_log_sparing<T>(
        &self,
        topic: &Arc<str>,
        incarnation: IncarnationId,
        partition: PartitionId,
        f: impl AsyncFnOnce(&mut PartitionLog<S>) -> Result<T, ReadError>,
    ) -> Result<T, ReadError> {
        let slot = self.slot_for_use(topic, incarnation, partition)?;
        let _guard = slot.lock.lock().await;
        // The stop retires every slot: that is not a deleted topic.
        if self.closing.get() {
            return Err(ReadError::Stopping);
        }
        if slot.retired.get() {
            return Err(ReadError::NotFound);
        }
        let open = slot.log.borrow_mut().take();
        let was_open = open.is_some();
        let log = match open {
            Some(log) => log,
            None => self.open_log(&slot).await.map_err(ReadError::Failed)?,
        };
        let (result, log) = Taken::run(self, &slot, log, f).await;
        if was_open || log.is_poisoned() {
            self.put_back(&slot, log).await;
        } else if let Err(e) = self.close_log(&slot, log).await {
            tracing::warn!(topic = %slot.topic, partition = slot.partition.0, error = %e, "closing a log opened to observe it failed");
        }
        result
    }

    /// [`Owner::stats`] for an observer: a log closed before stays closed
    /// (see [`Owner::with_log_sparing`]).
    pub async fn stats_sparing(
        &self,
        topic: &Arc<str>,
        incarnation: IncarnationId,
        partition: PartitionId,
    ) -> Result<PartitionStats, ReadError> {
        if let Some(stats) = self.closed_shape(topic, incarnation, partition)? {
            return Ok(stats);
        }
        self.with_log_sparing(topic, incarnation, partition, async |log| {
            Ok(shape_of(partition, log))
        })
        .await
    }

    /// Reads like [`Owner::read`] for an observer such as the metrics poller:
    /// without counting as a use, and a closed log is opened for the read and
    /// closed again (see [`Owner::with_log_sparing`]).
    pub async fn peek_sparing(
        &self,
        topic: &Arc<str>,
        incarnation: IncarnationId,
        partition: PartitionId,
        range: ReadRange,
    ) -> Result<ReadBatch, ReadError> {
        if let Some(batch) = self.read_cached(incarnation, partition, range) {
            return Ok(batch);
        }
        self.with_log_sparing(topic, incarnation, partition, async |log| {
            read_log(log, range).await.map(|(batch, _)| batch)
        })
        .await
    }

    /// The shape remembered of a closed log, if any (checked live).
    fn closed_shape(
        &self,
        topic: &Arc<str>,
        incarnation: IncarnationId,
        partition: PartitionId,
    ) -> Result<Option<PartitionStats>, ReadError> {
        let closed = self
            .closed_shapes
            .borrow()
            .get(&(incarnation, partition))
            .cloned();
        let Some(stats) = closed else {
            return Ok(None);
        };
        if self.closing.get() {
            return Err(ReadError::Stopping);
        }
        if !self.is_live(topic, incarnation, partition) {
            return Err(ReadError::NotFound);
        }
        Ok(Some(stats))
    }

    /// The partition's shape.
    pub async fn stats(
        self: &Rc<Self>,
        topic: &Arc<str>,
        incarnation: IncarnationId,
        partition: PartitionId,
    ) -> Result<PartitionStats, ReadError> {
        // A closed log's shape is known without opening it (nor keeping it open
        // for another idle period).
        if let Some(stats) = self.closed_shape(topic, incarnation, partition)? {
            return Ok(stats);
        }
        self.with_log(topic, incarnation, partition, async |log| {
            Ok(shape_of(partition, log))
        })
        .await
    }
}

/// What [`Owner::stats`] says of an open log.
fn shape_of<S: Storage>(partition: PartitionId, log: &PartitionLog<S>) -> PartitionStats {
    let stats = log.stats();
    PartitionStats {
        partition,
        oldest_offset: stats.oldest_offset,
        next_offset: stats.next_offset,
        segments: stats.segment_count,
        size_bytes: stats.size_bytes,
        oldest_segment_ms: stats.oldest_segment_ms,
    }
}

/// Reads `range` in an open log; returns the batch and the bytes it read from
/// the device.
async fn read_log<S: Storage>(
    log: &mut PartitionLog<S>,
    range: ReadRange,
) -> Result<(ReadBatch, u64), ReadError> {
    let before = log.device_read_bytes();
    let batch = log
        .read(range.from, range.max_records, range.max_bytes)
        .await
        .map_err(|e| match e {
            LogError::AgedOut { oldest, .. } => ReadError::AgedOut { oldest },
            other => ReadError::Failed(other.to_string()),
        })?;
    Ok((batch, log.device_read_bytes() - before))
}
