//! The delivery tokens other shards leave with [`Queues`]: registering them,
//! spending them on the records available here, and the shares of those
//! records that parked consumers, tokens and newcomers may each take.

use std::sync::Arc;
use std::time::Duration;

use narad_shards::consume::tokens::PromiseId;
use narad_shards::ids::{IncarnationId, PartitionId};

use super::{now_ms, Queues};
use crate::meta::TopicRecord;

impl Queues {
    /// A shard left (or renewed) its token for the topic.
    pub fn register(
        &self,
        topic: &Arc<str>,
        incarnation: IncarnationId,
        from: usize,
        ttl: Duration,
    ) {
        self.tokens
            .borrow_mut()
            .register(incarnation, from, ttl, now_ms());
        (self.wake)(incarnation, topic);
    }

    /// Whether any shard holds a live token for the topic here.
    pub fn has_tokens(&self, incarnation: IncarnationId) -> bool {
        self.tokens.borrow().has_tokens(incarnation, now_ms())
    }

    /// Spends one token per available record not already promised, of the
    /// tokens registered before `before_ms`; returns the shards to notify,
    /// each once.
    pub fn spend_tokens(
        &self,
        record: &TopicRecord,
        partitions: &[PartitionId],
        before_ms: u64,
    ) -> Vec<(usize, PromiseId)> {
        let available = self.available(record, partitions);
        self.tokens
            .borrow_mut()
            .spend_registered_before(record.id, available, now_ms(), before_ms)
    }

    /// How many of `max` records a consumer of this shard may take now from
    /// `partitions`: records promised to other shards' claims are held for
    /// them, so only those beyond the promises outstanding; `None` when every
    /// available record is promised (take nothing, wait for the claim, the
    /// pass or the deadline).
    pub fn own_share(
        &self,
        record: &TopicRecord,
        partitions: &[PartitionId],
        max: usize,
    ) -> Option<usize> {
        let outstanding = self.tokens.borrow().outstanding(record.id, now_ms());
        if outstanding == 0 {
            return Some(max);
        }
        let spare = self
            .available(record, partitions)
            .saturating_sub(outstanding);
        (spare > 0).then(|| max.min(usize::try_from(spare).unwrap_or(usize::MAX)))
    }

    /// Whether records may be held here for consumers elsewhere: promises
    /// outstanding, or live tokens.
    pub fn holds_for_others(&self, incarnation: IncarnationId) -> bool {
        let (tokens, now) = (self.tokens.borrow(), now_ms());
        tokens.outstanding(incarnation, now) > 0 || tokens.held(incarnation, now) > 0
    }

    /// How many of `max` records a consumer arriving now may take from
    /// `partitions` (the shard's partitions of the topic): those beyond the
    /// promises outstanding (see [`Queues::own_share`]), beyond one for each
    /// live token other shards left (the pump notifies them next), and beyond
    /// what the consumers already parked here will take (`waiting`, given
    /// the records left and the records of one partition). Consumers take
    /// records in the order they came, whoever reaches a record first
    /// between its commit and the pump. `None` when nothing is left. The
    /// partitions must be loaded ([`Queues::load_all`]): one not loaded
    /// counts as empty.
    pub fn newcomer_share(
        &self,
        record: &TopicRecord,
        partitions: &[PartitionId],
        max: usize,
        waiting: impl FnOnce(u64, &dyn Fn(PartitionId) -> u64) -> u64,
    ) -> Option<usize> {
        let now = now_ms();
        let held = {
            let tokens = self.tokens.borrow();
            tokens.outstanding(record.id, now) + tokens.held(record.id, now)
        };
        let available = self.available(record, partitions);
        let left = available.saturating_sub(held);
        let in_one = |p: PartitionId| self.available(record, &[p]);
        let spare = left.saturating_sub(waiting(left, &in_one));
        (spare > 0).then(|| max.min(usize::try_from(spare).unwrap_or(usize::MAX)))
    }

    /// When the next of the topic's promises lapses (see
    /// [`Tokens::next_deadline`]).
    pub fn next_promise_deadline(&self, incarnation: IncarnationId) -> Option<u64> {
        self.tokens.borrow().next_deadline(incarnation, now_ms())
    }

    /// A notified shard claimed or passed: that promise is retired.
    pub fn retire_notification(&self, incarnation: IncarnationId, from: usize, promise: PromiseId) {
        self.tokens
            .borrow_mut()
            .retire_notification(incarnation, from, promise);
    }
}
