//! The owner side of consumption: one in-flight table per owned partition, the
//! reservation-before-read of records, settling receipt handles, and the delivery
//! tokens other shards leave here.
//!
//! Which cores: one [`Queues`] per shard, for the partitions that shard owns. Every
//! method that touches a table is synchronous and holds its `RefCell` borrow for
//! the call only; the one await, the log read, happens with the offsets already
//! reserved, so two consumers can never be handed the same live copy.
//!
//! Reservation before read: offsets are leased first (with a nonce from the shard's
//! ChaCha8 stream and an expiry), then read. A read that comes back without a
//! reserved offset (its byte budget ran out) releases it at once and wakes the
//! topic's consumers. A take whose caller goes away (its future is dropped, as
//! when a client disconnects) releases what it reserved or took, at once, rather
//! than leaving it leased until the visibility timeout. A read below the
//! oldest retained offset makes the frontier jump there in one step; a corrupt
//! range is skipped (settled, counted, logged) so it never blocks the queue.
//!
//! Tokens: a shard with parked consumers and no local record leaves a token here
//! (see [`super::waiters`]). A token reserves nothing. When records are available
//! and no consumer parked on this shard takes them, the pump spends one token per
//! available record ([`Queues::spend_tokens`]) and tells that shard, which then
//! claims. The bookkeeping is the sans-IO [`Tokens`] core: an outstanding
//! notification counts against the available records until its claim arrives or
//! its deadline passes, so one record is never promised to two shards.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use narad_io::dma::DmaStorage;
use narad_shards::consume::inflight::{Caps, HandleError, InFlight, Reserve};
use narad_shards::consume::state;
use narad_shards::consume::tokens::Tokens;
use narad_shards::ids::{DenseIdMap, DenseIdSet, IncarnationId, Offset, PartitionId};
use narad_shards::log::{ReadItem, ReadRange};
use rand::RngCore;
use rand_chacha::ChaCha8Rng;

use super::persist::Persister;
use super::{now_ms, ConsumeError, Delivered, Settle};
use crate::broker::ops::ReadError;
use crate::broker::partition_dir;
use crate::broker::shard::Owner;
use crate::meta::TopicRecord;

mod tokens;

/// Reads that find their reservations overtaken (retention, corruption) are tried
/// again at most this often per call.
const TAKE_ATTEMPTS_MAX: usize = 4;

/// Whether loading a queue leaves the partition's log open (a consumer
/// reads it next) or as it found it (the gauges' loads).
#[derive(Clone, Copy)]
enum Opening {
    Keep,
    Spare,
}

/// A take's reservations in one partition span at most this many offsets per
/// record it wants. A read covers the whole span, and the offsets between
/// that others lease or settled count against its byte budget too: after
/// expiries or nacks scatter free offsets far below new ones, a batch would
/// otherwise read megabytes to hand over a few records. Contiguous
/// reservations (the usual case) never come near it.
const RESERVED_SPAN_PER_RECORD: u64 = 4;

type Key = (IncarnationId, PartitionId);

/// Tells the shard's pump that a topic's records became available here.
pub type Wake = Box<dyn Fn(IncarnationId, &Arc<str>)>;

/// One owned partition's consumer state.
pub struct PartitionQueue {
    pub topic: Arc<str>,
    pub table: InFlight,
    /// The log's high watermark as last seen; commits move it forward.
    pub hwm: Offset,
}

/// The partitions of one shard, as consumers see them.
pub struct Queues {
    owner: Rc<Owner>,
    parts: RefCell<DenseIdMap<Key, Rc<RefCell<PartitionQueue>>>>,
    /// Delivery tokens other shards left here, and the notifications promised.
    tokens: RefCell<Tokens>,
    rng: RefCell<ChaCha8Rng>,
    /// Partitions whose settled state changed since the persister last looked.
    settled_changed: RefCell<DenseIdSet<Key>>,
    /// Called with a topic whose records became available here.
    wake: Wake,
    /// Called with a topic one of whose reads failed, to serve its consumers
    /// again after a pause (see [`Queues::set_wake_later`]).
    wake_later: RefCell<Option<Wake>>,
    storage: DmaStorage,
    persister: Rc<Persister>,
}

impl Queues {
    pub fn new(
        owner: Rc<Owner>,
        storage: DmaStorage,
        rng: ChaCha8Rng,
        wake: Wake,
        persister: Rc<Persister>,
    ) -> Self {
        Queues {
            storage,
            persister,
            owner,
            parts: RefCell::new(DenseIdMap::default()),
            tokens: RefCell::new(Tokens::default()),
            rng: RefCell::new(rng),
            settled_changed: RefCell::new(DenseIdSet::default()),
            wake,
            wake_later: RefCell::new(None),
        }
    }

    /// Sets what a failed read calls: a delayed wake of the topic's consumers
    /// (a parked consumer whose record a failed read held would otherwise wait
    /// for the next commit, ack or its deadline, whoever made the read).
    pub fn set_wake_later(&self, wake_later: Wake) {
        *self.wake_later.borrow_mut() = Some(wake_later);
    }

    /// A commit made records visible: moves the cached high watermark and wakes
    /// the topic's consumers, if any wait for records of it: `waited_on` says
    /// whether some are parked on this shard, and tokens other shards left
    /// here stand for theirs. A topic nobody waits on costs a commit nothing
    /// more (no pump task, no look at the topic); whoever comes later parks,
    /// and the parking wakes the pump.
    pub fn on_visible(
        &self,
        topic: &Arc<str>,
        incarnation: IncarnationId,
        partition: PartitionId,
        hwm: Offset,
        waited_on: bool,
    ) {
        if let Some(queue) = self.parts.borrow().get(&(incarnation, partition)) {
            let mut queue = queue.borrow_mut();
            queue.hwm = queue.hwm.max(hwm);
        }
        if waited_on || self.has_tokens(incarnation) {
            (self.wake)(incarnation, topic);
        }
    }

    /// Retention deleted the partition's records below `oldest`: a loaded
    /// queue's frontier jumps there at once (counting what no consumer acked
    /// as dropped), so its lag, oldest age and dropped count say so without
    /// waiting for a consumer to trip over the gap.
    pub fn on_retained(
        &self,
        topic: &Arc<str>,
        incarnation: IncarnationId,
        partition: PartitionId,
        oldest: Offset,
    ) {
        let key = (incarnation, partition);
        let Some(queue) = self.parts.borrow().get(&key).cloned() else {
            return;
        };
        let mut queue = queue.borrow_mut();
        if !queue.table.jump_to(oldest) {
            return;
        }
        tracing::warn!(topic = %topic, partition = partition.0, oldest = oldest.0, dropped = queue.table.dropped_total(), "retention outran the consumers: frontier jumped to the oldest retained offset");
        drop(queue);
        self.note_settled(key);
        // Leases below it are gone: consumers held at a cap may have room.
        (self.wake)(incarnation, topic);
    }

    /// The partition's queue, loaded on first touch.
    async fn queue(
        &self,
        topic: &Arc<str>,
        record: &TopicRecord,
        partition: PartitionId,
    ) -> Result<Rc<RefCell<PartitionQueue>>, ConsumeError> {
        self.queue_opening(topic, record, partition, Opening::Keep)
            .await
    }

    /// [`Queues::queue`], leaving the log as it found it when `opening` says
    /// so (see [`Opening`]).
    async fn queue_opening(
        &self,
        topic: &Arc<str>,
        record: &TopicRecord,
        partition: PartitionId,
        opening: Opening,
    ) -> Result<Rc<RefCell<PartitionQueue>>, ConsumeError> {
        let key = (record.id, partition);
        if let Some(queue) = self.parts.borrow().get(&key) {
            return Ok(queue.clone());
        }
        let dir = partition_dir(topic, record.id, partition);
        let persisted = state::load(&self.storage, &dir).await.map_err(|e| {
            ConsumeError::Failed(format!("reading the consumer state of {dir}: {e}"))
        })?;
        // `consumer.offset` trails the acked state by up to its levelling
        // interval; after a crash it may stay behind for as long as nobody acks
        // here. Marked changed, the partition is levelled like any other, at the
        // latest when the node stops, so readers of that file (older releases,
        // operators) see the frontier too.
        let offset_file_behind = state::read_offset_file(&self.storage, &dir)
            .await
            .ok()
            .flatten()
            .is_some_and(|levelled| levelled < persisted.frontier);
        // The log's stats come last, and the queue is installed in the same poll
        // that gets them: a commit that becomes visible after this read finds the
        // queue in place and moves its high watermark. Read before an await, the
        // watermark of a commit landing during that await would be lost, and its
        // records left undelivered until the partition's next commit.
        let stats = match opening {
            Opening::Keep => self.owner.stats(topic, record.id, partition).await,
            Opening::Spare => self.owner.stats_sparing(topic, record.id, partition).await,
        }
        .map_err(read_failure)?;
        if let Some(queue) = self.parts.borrow().get(&key) {
            // Another consume loaded it meanwhile.
            let mut loaded = queue.borrow_mut();
            loaded.hwm = loaded.hwm.max(stats.next_offset);
            drop(loaded);
            return Ok(queue.clone());
        }
        // Deleted during the reads above: its purge may have run already, and
        // nothing would drop a queue installed after it. The metadata loses the
        // topic before any purge starts, so a topic still live here is purged
        // later, queue included.
        if !self.owner.is_live(topic, record.id, partition) {
            return Err(ConsumeError::NotFound);
        }
        let mut table = InFlight::new(persisted.frontier, persisted.ahead);
        if table.jump_to(stats.oldest_offset) {
            tracing::warn!(topic = %topic, partition = partition.0, oldest = stats.oldest_offset.0, dropped = table.dropped_total(), "retention outran the consumers: frontier jumped to the oldest retained offset");
            self.note_settled(key);
        }
        if table.frontier() > stats.next_offset {
            tracing::warn!(%dir, frontier = table.frontier().0, next_offset = stats.next_offset.0, "persisted consumer frontier is past the end of the log");
        }
        let loaded = Rc::new(RefCell::new(PartitionQueue {
            topic: topic.clone(),
            table,
            hwm: stats.next_offset,
        }));
        self.parts.borrow_mut().insert(key, loaded.clone());
        if offset_file_behind {
            self.note_settled(key);
        }
        Ok(loaded)
    }

    /// Takes up to `max` records from `partitions` in order, staying on a
    /// partition until it runs dry, within about `budget_bytes` of keys and
    /// payloads (the first record is always taken). Never waits for a record.
    pub async fn take(
        &self,
        topic: &Arc<str>,
        record: &TopicRecord,
        partitions: &[PartitionId],
        max: usize,
        budget_bytes: usize,
    ) -> Result<Vec<Delivered>, ConsumeError> {
        assert!(max > 0);
        // Records taken from one partition are given back if the caller goes
        // away while a later partition is read.
        let mut out = Taken {
            queues: self,
            incarnation: record.id,
            topic,
            delivered: Vec::new(),
        };
        let mut failure = None;
        let mut bytes = 0usize;
        for &partition in partitions {
            if out.delivered.len() >= max || bytes >= budget_bytes {
                break;
            }
            let left = budget_bytes - bytes;
            match self
                .take_from(topic, record, partition, max - out.delivered.len(), left)
                .await
            {
                Ok(got) => {
                    bytes += got.iter().map(Delivered::weight_bytes).sum::<usize>();
                    out.delivered.extend(got);
                }
                Err(ConsumeError::NotFound) => return Err(ConsumeError::NotFound),
                Err(e) => failure = Some(e),
            }
        }
        let out = std::mem::take(&mut out.delivered);
        match failure {
            Some(e) if out.is_empty() => Err(e),
            _ => Ok(out),
        }
    }

    /// [`Queues::take`] for one partition.
    async fn take_from(
        &self,
        topic: &Arc<str>,
        record: &TopicRecord,
        partition: PartitionId,
        want: usize,
        budget_bytes: usize,
    ) -> Result<Vec<Delivered>, ConsumeError> {
        let queue = self.queue(topic, record, partition).await?;
        let caps = caps_of(record);
        // Whether an attempt moved the frontier past records nobody can have
        // (aged out, or corrupt on disk).
        let mut overtaken = false;
        for _ in 0..TAKE_ATTEMPTS_MAX {
            let reserved =
                self.reserve(record.id, &queue, &caps, record.visibility_timeout_ms, want);
            let (Some(&(first, _)), Some(&(last, _))) = (reserved.first(), reserved.last()) else {
                return Ok(Vec::new());
            };
            let span = (last.0 - first.0 + 1) as usize;
            // The reservations are given back if the caller goes away during the
            // read, rather than held until their visibility timeout.
            let mut held = Reserved {
                queues: self,
                incarnation: record.id,
                queue: &queue,
                offsets: reserved,
            };
            let read = self
                .owner
                .read(
                    topic,
                    record.id,
                    partition,
                    ReadRange::new(first, span, budget_bytes),
                )
                .await;
            let reserved = std::mem::take(&mut held.offsets);
            let batch = match read {
                Ok(batch) => batch,
                Err(ReadError::AgedOut { oldest }) => {
                    let mut queue = queue.borrow_mut();
                    if queue.table.jump_to(oldest) {
                        tracing::warn!(topic = %topic, partition = partition.0, oldest = oldest.0, "retention outran the consumers: frontier jumped to the oldest retained offset");
                        self.note_settled((record.id, partition));
                    }
                    // Leases that lapsed meanwhile are free now: announced, as
                    // nobody else would (a rare path: a wake too many is cheap).
                    if release(&mut queue.table, &reserved) > 0 {
                        (self.wake)(record.id, topic);
                    }
                    overtaken = true;
                    continue;
                }
                Err(e) => {
                    // Released without a wake now: the records cannot be read,
                    // and a wake would bring the pump straight back to the same
                    // failing read. Whoever made this read, the topic's
                    // consumers are served again after a pause, or one parked
                    // while this read held its record would wait for the next
                    // commit, ack or its deadline.
                    release(&mut queue.borrow_mut().table, &reserved);
                    if let Some(wake_later) = &*self.wake_later.borrow() {
                        wake_later(record.id, topic);
                    }
                    return Err(read_failure(e));
                }
            };
            let mut got = Vec::with_capacity(reserved.len());
            let mut skipped = false;
            let mut part = queue.borrow_mut();
            for item in batch.items {
                match item {
                    ReadItem::Record(r) => {
                        let Ok(i) = reserved.binary_search_by_key(&r.offset, |&(o, _)| o) else {
                            continue;
                        };
                        let nonce = reserved[i].1;
                        // Delivered even if the lease lapsed during the read, as
                        // long as nobody else took it meanwhile: with a timeout
                        // of a few milliseconds a re-check would drop every
                        // record whose read crossed a tick (an ack of it is 410).
                        if part.table.holds(r.offset, nonce) {
                            got.push(Delivered {
                                partition,
                                nonce,
                                record: r,
                            });
                        }
                    }
                    ReadItem::Corrupt(range) => {
                        let count = part.table.skip_corrupt(range.clone());
                        // Counted as it happens: a total the poller read from the
                        // table would start again at 0 for a topic made again
                        // under the name, which a counter cannot show.
                        ::metrics::counter!(
                            "narad_consumer_corrupt_skipped_total",
                            "topic" => topic.to_string(),
                            "partition" => partition.0.to_string()
                        )
                        .increment(count);
                        tracing::error!(topic = %topic, partition = partition.0, from = range.start.0, to = range.end.0, count, "skipping unreadable records (corrupt on disk)");
                        self.note_settled((record.id, partition));
                        skipped = true;
                    }
                }
            }
            // Reserved offsets the read did not return (its budget ran out) go back.
            // Both lists ascend by offset (the read is contiguous), so one pass.
            let mut delivered = got.iter().map(|d| d.record.offset).peekable();
            let left_out: Vec<(Offset, u64)> = reserved
                .iter()
                .filter(|(o, _)| {
                    let handed = delivered.peek() == Some(o);
                    if handed {
                        delivered.next();
                    }
                    !handed
                })
                .copied()
                .collect();
            debug_assert!(
                delivered.next().is_none(),
                "delivered offsets were reserved"
            );
            drop(part);
            // Consumers parked here may have found these reserved a moment ago.
            self.give_back(record.id, &queue, &left_out);
            if got.is_empty() && skipped {
                overtaken = true;
                continue;
            }
            if skipped {
                // The skip moved the frontier and dropped leases: consumers
                // parked at a cap may have room now, and no ack will say so.
                (self.wake)(record.id, topic);
            }
            return Ok(got);
        }
        if overtaken {
            // Every attempt met records nobody can have, and more may follow
            // them. No commit or release will announce what lies past them, so
            // this take does: the pump comes back for it after the caller parks.
            (self.wake)(record.id, topic);
        }
        Ok(Vec::new())
    }

    /// Leases up to `want` offsets, lowest first. Leases that expired are purged
    /// first, and their records announced: a purge on a touch is as much a wake
    /// as one by the background purger.
    fn reserve(
        &self,
        incarnation: IncarnationId,
        queue: &RefCell<PartitionQueue>,
        caps: &Caps,
        visibility_ms: u64,
        want: usize,
    ) -> Vec<(Offset, u64)> {
        let mut queue = queue.borrow_mut();
        let mut rng = self.rng.borrow_mut();
        let now = now_ms();
        let purged = queue.table.purge_expired(now);
        let hwm = queue.hwm;
        let mut reserved: Vec<(Offset, u64)> = Vec::new();
        let span_max = (want as u64).saturating_mul(RESERVED_SPAN_PER_RECORD);
        while reserved.len() < want {
            let nonce = rng.next_u64();
            match queue.table.reserve(now, hwm, caps, visibility_ms, nonce) {
                Reserve::Reserved { offset, .. } => {
                    if reserved
                        .first()
                        .is_some_and(|&(first, _)| offset.0 - first.0 >= span_max)
                    {
                        // Too far from the first: the read would pass over
                        // the records between, others' leases, for this one.
                        // It stays free for the next take.
                        let released = queue.table.nack(offset, nonce, now);
                        assert!(released.is_ok(), "a lease just taken is held");
                        break;
                    }
                    reserved.push((offset, nonce));
                }
                Reserve::Empty | Reserve::Full => break,
            }
        }
        assert!(reserved.windows(2).all(|w| w[0].0 < w[1].0));
        let topic = queue.topic.clone();
        drop(queue);
        if purged > 0 {
            (self.wake)(incarnation, &topic);
        }
        reserved
    }

    /// Applies an ack, extend or nack.
    pub fn settle(
        &self,
        record: &TopicRecord,
        partition: PartitionId,
        offset: Offset,
        nonce: u64,
        settle: Settle,
    ) -> Result<(), HandleError> {
        let key = (record.id, partition);
        let Some(queue) = self.parts.borrow().get(&key).cloned() else {
            // Not loaded since the start: every lease it could name is gone.
            return Err(HandleError::Stale);
        };
        let now = now_ms();
        let mut queue = queue.borrow_mut();
        // Leases that lapsed are released before the handle is checked; their
        // records are announced like a nack's.
        let purged = queue.table.purge_expired(now);
        // A consumer that found the partition at its caps parked with records
        // waiting: an ack that makes room under them is a wake too.
        let caps = caps_of(record);
        let capped = settle == Settle::Ack && queue.table.available_under(queue.hwm, &caps) == 0;
        let outcome = match settle {
            Settle::Ack => queue.table.ack(offset, nonce, now).map(|()| {
                self.note_settled(key);
            }),
            Settle::Extend => queue
                .table
                .extend(offset, nonce, now, record.visibility_timeout_ms)
                .map(|_| ()),
            Settle::Nack => queue.table.nack(offset, nonce, now),
        };
        let uncapped =
            capped && outcome.is_ok() && queue.table.available_under(queue.hwm, &caps) > 0;
        let topic = queue.topic.clone();
        drop(queue);
        let released = settle == Settle::Nack && outcome.is_ok();
        if purged > 0 || released || uncapped {
            (self.wake)(record.id, &topic);
        }
        outcome
    }

    /// Releases reservations nobody received and, if any was still held, wakes
    /// the topic's consumers: one parked here may have found them reserved.
    fn give_back(
        &self,
        incarnation: IncarnationId,
        queue: &RefCell<PartitionQueue>,
        reserved: &[(Offset, u64)],
    ) {
        if reserved.is_empty() {
            return;
        }
        let mut part = queue.borrow_mut();
        let released = release(&mut part.table, reserved);
        let topic = part.topic.clone();
        drop(part);
        if released > 0 {
            (self.wake)(incarnation, &topic);
        }
    }

    /// Gives records handed out to nobody (their request was cancelled) back.
    pub fn release_delivered(
        &self,
        incarnation: IncarnationId,
        topic: &Arc<str>,
        delivered: &[Delivered],
    ) {
        if delivered.is_empty() {
            return;
        }
        let now = now_ms();
        for d in delivered {
            if let Some(queue) = self.parts.borrow().get(&(incarnation, d.partition)) {
                let _ = queue.borrow_mut().table.nack(d.record.offset, d.nonce, now);
            }
        }
        (self.wake)(incarnation, topic);
    }

    fn note_settled(&self, key: Key) {
        let mut changed = self.settled_changed.borrow_mut();
        if changed.insert(key) && changed.len() == 1 {
            self.persister.wake.notify();
        }
    }

    /// The partitions whose settled state changed since the last call.
    pub fn take_settled_changed(&self) -> Vec<Key> {
        self.settled_changed.borrow_mut().drain().collect()
    }

    /// Releases expired leases everywhere (the background purger); wakes the
    /// topics that got records back.
    pub fn purge_expired(&self) {
        let now = now_ms();
        let mut woken: Vec<(IncarnationId, Arc<str>)> = Vec::new();
        for ((incarnation, _), queue) in self.parts.borrow().iter() {
            let mut queue = queue.borrow_mut();
            if queue.table.purge_expired(now) > 0 && !woken.iter().any(|(id, _)| id == incarnation)
            {
                woken.push((*incarnation, queue.topic.clone()));
            }
        }
        for (incarnation, topic) in woken {
            (self.wake)(incarnation, &topic);
        }
    }

    /// Records of the topic's loaded partitions here that a consume could take
    /// now, within the topic's caps.
    pub fn available(&self, record: &TopicRecord, partitions: &[PartitionId]) -> u64 {
        let caps = caps_of(record);
        let parts = self.parts.borrow();
        partitions
            .iter()
            .filter_map(|&p| parts.get(&(record.id, p)))
            .map(|q| {
                let q = q.borrow();
                q.table.available_under(q.hwm, &caps)
            })
            .sum()
    }

    /// Loads every partition of the topic this shard owns, so that
    /// [`Queues::spend_tokens`] sees their records.
    pub async fn load_all(
        &self,
        topic: &Arc<str>,
        record: &TopicRecord,
        partitions: &[PartitionId],
    ) {
        for &p in partitions {
            if let Err(e) = self.queue(topic, record, p).await {
                tracing::debug!(topic = %topic, partition = p.0, error = ?e, "partition not loadable for tokens");
            }
        }
    }

    /// Loads the consumer state of partitions no consumer asked for, for
    /// their gauges: a log closed before stays closed (no read window or
    /// cache held for it until idle eviction).
    pub async fn load_for_gauges(
        &self,
        topic: &Arc<str>,
        record: &TopicRecord,
        partitions: &[PartitionId],
    ) {
        for &p in partitions {
            if let Err(e) = self.queue_opening(topic, record, p, Opening::Spare).await {
                tracing::debug!(topic = %topic, partition = p.0, error = ?e, "partition not loadable for its gauges");
            }
        }
    }

    /// Forgets a deleted incarnation's consumer state.
    pub fn drop_incarnation(&self, incarnation: IncarnationId) {
        self.parts.borrow_mut().retain(|&(id, partition), queue| {
            if id == incarnation {
                crate::metrics::clear_queue_gauges(&queue.borrow().topic, partition);
            }
            id != incarnation
        });
        self.tokens.borrow_mut().drop_incarnation(incarnation);
        self.settled_changed
            .borrow_mut()
            .retain(|(id, _)| *id != incarnation);
    }

    /// Calls `f` with every loaded partition queue (the metrics poller).
    pub fn for_each_loaded(&self, mut f: impl FnMut(IncarnationId, PartitionId, &PartitionQueue)) {
        for ((incarnation, partition), queue) in self.parts.borrow().iter() {
            let queue = queue.borrow();
            f(*incarnation, *partition, &queue);
        }
    }

    /// The loaded queue of a partition, for the persister.
    pub fn loaded(&self, key: Key) -> Option<Rc<RefCell<PartitionQueue>>> {
        self.parts.borrow().get(&key).cloned()
    }
}

/// Releases the leases of `reserved` still held; returns how many records that
/// and the expiry purge it starts with made free again. The purge is counted
/// (a nack would run it anyway, silently): a lease that lapsed meanwhile is a
/// record someone parked may take, and nobody else would wake them for it.
fn release(table: &mut InFlight, reserved: &[(Offset, u64)]) -> usize {
    let now = now_ms();
    let lapsed = table.purge_expired(now);
    lapsed
        + reserved
            .iter()
            .filter(|&&(offset, nonce)| table.nack(offset, nonce, now).is_ok())
            .count()
}

/// Offsets reserved for a read in progress: released if the read's caller goes
/// away (the future is dropped) before the read returns.
struct Reserved<'a> {
    queues: &'a Queues,
    incarnation: IncarnationId,
    queue: &'a RefCell<PartitionQueue>,
    offsets: Vec<(Offset, u64)>,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.queues
            .give_back(self.incarnation, self.queue, &self.offsets);
    }
}

/// Records a take has handed over so far: released if its caller goes away
/// before the take returns them.
struct Taken<'a> {
    queues: &'a Queues,
    incarnation: IncarnationId,
    topic: &'a Arc<str>,
    delivered: Vec<Delivered>,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.queues
            .release_delivered(self.incarnation, self.topic, &self.delivered);
    }
}

fn read_failure(e: ReadError) -> ConsumeError {
    match e {
        ReadError::NotFound => ConsumeError::NotFound,
        ReadError::AgedOut { oldest } => {
            ConsumeError::Failed(format!("aged out below offset {}", oldest.0))
        }
        ReadError::Failed(why) => ConsumeError::Failed(why),
        ReadError::Stopping => ConsumeError::Unavailable("the owner is stopping".into()),
    }
}

/// The topic's per-partition caps.
fn caps_of(record: &TopicRecord) -> Caps {
    Caps {
        in_flight_max: record.max_in_flight_per_partition as usize,
        acked_ahead_max: record.max_acked_ahead_per_partition as usize,
    }
}

#[cfg(test)]
mod tests;
