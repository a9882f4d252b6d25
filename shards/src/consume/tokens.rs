//! Delivery tokens other shards left with this owner, and the notifications it
//! sent and not yet saw claimed (sans-IO).
//!
//! Which cores: one [`Tokens`] per shard, for the topics whose partitions that shard
//! owns; touched by the mesh handlers (register, claim, pass) and the pump. Nothing
//! here reads a clock: the caller passes `now_ms` (milliseconds of a monotonic
//! clock), and the records available (the sum of its in-flight tables'
//! [`available`](super::inflight::InFlight::available)).
//!
//! A token reserves nothing: it says "a consumer is parked on shard `from`; tell it
//! when records show up". When records are available and no consumer parked on the
//! owner takes them, the owner spends one token per available record not already
//! promised ([`Tokens::spend`]) and notifies that shard, which then claims.
//!
//! Invariant: an outstanding notification (a promise) counts against the available
//! records until its claim or pass arrives ([`Tokens::retire_notification`]) or its
//! [`CLAIM_DEADLINE`] passes, so one record is never promised to two shards: a
//! spend never makes more promises than `available - outstanding`. Each promise
//! has an id that its notification, claim and pass carry, so a claim that comes
//! after its promise lapsed retires nothing, even when a newer promise went to
//! the same shard.
//!
//! One token per (requesting shard, topic): a registration replaces the shard's
//! token rather than stacking one, and a spent token is gone (single use), so a
//! stale token costs at most one notification.
//!
//! Tokens and the owner's own parked consumers share one order, by arrival: a
//! token stands where its latest registration put it, and the pump spends the
//! tokens registered before its longest-parked consumer arrived first
//! ([`Tokens::spend_registered_before`]). A record promised is held for its
//! claim: the pump serves its own consumers only from the records not promised
//! ([`Tokens::outstanding`]), until the claim, the pass or the deadline.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::ids::IncarnationId;

/// How long a notified shard has to claim before the record may be offered again.
pub const CLAIM_DEADLINE: Duration = Duration::from_millis(500);

/// Tokens one topic holds at most: one per requesting shard.
pub const TOKENS_PER_TOPIC_MAX: usize = 1024;

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The tokens and promises of one topic.
#[derive(Default, Debug)]
struct TopicTokens {
    /// (requesting shard, expiry in ms, registered at in ms), oldest
    /// registration first.
    held: Vec<(usize, u64, u64)>,
    /// (notified shard, deadline in ms, promise id) of notifications sent and
    /// not yet claimed or passed, oldest first.
    outstanding: Vec<(usize, u64, PromiseId)>,
}

/// Names one promise of one owner shard (see [`Tokens::spend`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PromiseId(pub u64);

/// The delivery tokens of one owner shard, per topic incarnation. See the module doc.
#[derive(Default, Debug)]
pub struct Tokens {
    topics: BTreeMap<IncarnationId, TopicTokens>,
    next_promise: u64,
}

impl Tokens {
    /// Shard `from` left (or renewed) its token for the topic, for `ttl` from now.
    /// The caller then wakes its pump: registering marks the topic.
    pub fn register(
        &mut self,
        incarnation: IncarnationId,
        from: usize,
        ttl: Duration,
        now_ms: u64,
    ) {
        let entry = self.topics.entry(incarnation).or_default();
        let until = now_ms.saturating_add(ms(ttl));
        // A renewal of a live token keeps its place: the consumers it stands
        // for have waited since it was registered.
        if let Some(live) = entry
            .held
            .iter_mut()
            .find(|(s, expiry, _)| *s == from && *expiry > now_ms)
        {
            live.1 = until;
            return;
        }
        entry.held.retain(|(s, _, _)| *s != from);
        if entry.held.len() < TOKENS_PER_TOPIC_MAX {
            entry.held.push((from, until, now_ms));
        }
        assert!(entry.held.len() <= TOKENS_PER_TOPIC_MAX);
    }

    /// Whether any shard holds a live token for the topic here.
    pub fn has_tokens(&self, incarnation: IncarnationId, now_ms: u64) -> bool {
        self.topics
            .get(&incarnation)
            .is_some_and(|t| t.held.iter().any(|&(_, until, _)| until > now_ms))
    }

    /// Live tokens of the topic not yet spent: each a shard whose parked
    /// consumers the pump notifies of the next record.
    pub fn held(&self, incarnation: IncarnationId, now_ms: u64) -> u64 {
        self.topics.get(&incarnation).map_or(0, |t| {
            t.held
                .iter()
                .filter(|&&(_, until, _)| until > now_ms)
                .count() as u64
        })
    }

    /// The earliest deadline, after `now_ms`, of the topic's promises still
    /// outstanding: when its consumers held back from them are served again.
    pub fn next_deadline(&self, incarnation: IncarnationId, now_ms: u64) -> Option<u64> {
        let topic = self.topics.get(&incarnation)?;
        topic
            .outstanding
            .iter()
            .map(|&(_, deadline, _)| deadline)
            .filter(|&d| d > now_ms)
            .min()
    }

    /// Notifications of the topic sent and neither claimed, passed nor lapsed.
    pub fn outstanding(&self, incarnation: IncarnationId, now_ms: u64) -> u64 {
        self.topics.get(&incarnation).map_or(0, |t| {
            t.outstanding
                .iter()
                .filter(|&&(_, d, _)| d > now_ms)
                .count() as u64
        })
    }

    /// Spends one token per record of `available` not already promised; returns
    /// the shards to notify, each once, oldest registration first, with the id
    /// of the promise their notification carries.
    pub fn spend(
        &mut self,
        incarnation: IncarnationId,
        available: u64,
        now_ms: u64,
    ) -> Vec<(usize, PromiseId)> {
        self.spend_registered_before(incarnation, available, now_ms, u64::MAX)
    }

    /// [`Tokens::spend`], of the tokens registered before `before_ms` only
    /// (those that arrived before the owner's longest-parked consumer).
    pub fn spend_registered_before(
        &mut self,
        incarnation: IncarnationId,
        available: u64,
        now_ms: u64,
        before_ms: u64,
    ) -> Vec<(usize, PromiseId)> {
        let Some(entry) = self.topics.get_mut(&incarnation) else {
            return Vec::new();
        };
        entry.held.retain(|&(_, until, _)| until > now_ms);
        entry
            .outstanding
            .retain(|&(_, deadline, _)| deadline > now_ms);
        let promised = entry.outstanding.len() as u64;
        let mut spare = available.saturating_sub(promised);
        let mut notify = Vec::new();
        // Bounded by the tokens held: every iteration removes one.
        while spare > 0 && entry.held.first().is_some_and(|&(_, _, at)| at < before_ms) {
            let (shard, _, _) = entry.held.remove(0);
            let promise = PromiseId(self.next_promise);
            self.next_promise += 1;
            let deadline = now_ms.saturating_add(ms(CLAIM_DEADLINE));
            entry.outstanding.push((shard, deadline, promise));
            notify.push((shard, promise));
            spare -= 1;
        }
        assert!(notify.len() as u64 <= available.saturating_sub(promised));
        if entry.held.is_empty() && entry.outstanding.is_empty() {
            self.topics.remove(&incarnation);
        }
        notify
    }

    /// Shard `from` claimed or passed `promise`: that promise is retired. A
    /// claim that comes after its promise lapsed retires nothing, so a promise
    /// made in its place, to another shard or to `from` again, still counts.
    pub fn retire_notification(
        &mut self,
        incarnation: IncarnationId,
        from: usize,
        promise: PromiseId,
    ) {
        if let Some(entry) = self.topics.get_mut(&incarnation) {
            let found = entry
                .outstanding
                .iter()
                .position(|&(s, _, id)| s == from && id == promise);
            if let Some(at) = found {
                entry.outstanding.remove(at);
            }
        }
    }

    /// Forgets a deleted incarnation's tokens and promises.
    pub fn drop_incarnation(&mut self, incarnation: IncarnationId) {
        self.topics.remove(&incarnation);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: IncarnationId = IncarnationId(7);

    fn spent(tokens: &mut Tokens, available: u64, now_ms: u64) -> Vec<(usize, PromiseId)> {
        tokens.spend(T, available, now_ms)
    }

    fn shards(spent: &[(usize, PromiseId)]) -> Vec<usize> {
        spent.iter().map(|&(shard, _)| shard).collect()
    }

    #[test]
    fn one_record_is_promised_to_one_shard() {
        let mut tokens = Tokens::default();
        let ttl = Duration::from_secs(5);
        tokens.register(T, 1, ttl, 1_000);
        tokens.register(T, 2, ttl, 1_000);
        assert!(tokens.has_tokens(T, 1_000));
        let first = spent(&mut tokens, 1, 1_000);
        assert_eq!(shards(&first), vec![1]);
        assert_eq!(tokens.outstanding(T, 1_000), 1);
        // Still one record: promised already.
        assert!(tokens.spend(T, 1, 1_010).is_empty());
        // A pass retires the promise; the record goes to the next holder.
        tokens.retire_notification(T, 1, first[0].1);
        assert_eq!(shards(&spent(&mut tokens, 1, 1_020)), vec![2]);
        assert!(!tokens.has_tokens(T, 1_020), "tokens are single use");
    }

    #[test]
    fn promises_lapse_at_the_claim_deadline_and_tokens_at_their_ttl() {
        let mut tokens = Tokens::default();
        tokens.register(T, 1, Duration::from_secs(5), 1_000);
        tokens.register(T, 2, Duration::from_millis(100), 1_000);
        assert_eq!(shards(&spent(&mut tokens, 1, 1_000)), vec![1]);
        let lapsed = 1_000 + ms(CLAIM_DEADLINE);
        assert_eq!(tokens.outstanding(T, lapsed), 0);
        // Shard 2's token lapsed at 1.1 s.
        assert!(tokens.spend(T, 1, lapsed).is_empty());
        assert!(!tokens.has_tokens(T, lapsed));
    }

    #[test]
    fn a_late_claim_retires_its_own_promise_not_the_one_made_in_its_place() {
        let mut tokens = Tokens::default();
        let ttl = Duration::from_secs(5);
        for shard in [1, 2, 3] {
            tokens.register(T, shard, ttl, 1_000);
        }
        let first = spent(&mut tokens, 1, 1_000);
        assert_eq!(shards(&first), vec![1]);
        // Shard 1's promise lapses; the record is promised to shard 2.
        let lapsed = 1_000 + ms(CLAIM_DEADLINE);
        let second = spent(&mut tokens, 1, lapsed);
        assert_eq!(shards(&second), vec![2]);
        // Shard 1's claim arrives late: shard 2's promise still stands, so the
        // record is not promised a third time.
        tokens.retire_notification(T, 1, first[0].1);
        assert_eq!(tokens.outstanding(T, lapsed + 1), 1);
        assert!(tokens.spend(T, 1, lapsed + 1).is_empty());
        tokens.retire_notification(T, 2, second[0].1);
        assert_eq!(shards(&spent(&mut tokens, 1, lapsed + 2)), vec![3]);
    }

    #[test]
    fn a_late_claim_does_not_retire_a_newer_promise_to_the_same_shard() {
        let mut tokens = Tokens::default();
        let ttl = Duration::from_secs(5);
        tokens.register(T, 1, ttl, 1_000);
        tokens.register(T, 2, ttl, 1_000);
        let first = spent(&mut tokens, 1, 1_000);
        assert_eq!(shards(&first), vec![1]);
        // Shard 1's promise lapses unclaimed; shard 1 registers again and is
        // promised the record anew.
        let lapsed = 1_000 + ms(CLAIM_DEADLINE);
        tokens.register(T, 1, ttl, lapsed);
        let newer = spent(&mut tokens, 1, lapsed);
        assert_eq!(shards(&newer), vec![2]);
        tokens.retire_notification(T, 2, newer[0].1);
        let again = spent(&mut tokens, 1, lapsed + 1);
        assert_eq!(shards(&again), vec![1]);
        // The first claim arrives now: the newer promise to shard 1 still
        // counts, so the one record is not promised to anyone else.
        tokens.register(T, 3, ttl, lapsed + 2);
        tokens.retire_notification(T, 1, first[0].1);
        assert_eq!(tokens.outstanding(T, lapsed + 2), 1);
        assert!(tokens.spend(T, 1, lapsed + 2).is_empty());
        tokens.retire_notification(T, 1, again[0].1);
        assert_eq!(shards(&spent(&mut tokens, 1, lapsed + 3)), vec![3]);
    }

    #[test]
    fn only_tokens_registered_before_the_given_time_are_spent() {
        let mut tokens = Tokens::default();
        let ttl = Duration::from_secs(5);
        tokens.register(T, 1, ttl, 1_000);
        tokens.register(T, 2, ttl, 1_200);
        tokens.register(T, 3, ttl, 1_400);
        let early = tokens.spend_registered_before(T, 3, 1_500, 1_300);
        assert_eq!(shards(&early), vec![1, 2]);
        // The one left arrived after: it waits for a spend without the bound.
        assert!(tokens
            .spend_registered_before(T, 3, 1_500, 1_400)
            .is_empty());
        assert_eq!(shards(&spent(&mut tokens, 3, 1_500)), vec![3]);
        // A renewal of a live token keeps its place; one registered after
        // its token lapsed (or was spent) goes to the back.
        tokens.register(T, 1, ttl, 2_000);
        tokens.register(T, 2, Duration::from_millis(50), 2_100);
        tokens.register(T, 1, ttl, 2_200);
        tokens.register(T, 2, ttl, 2_300);
        assert_eq!(
            shards(&tokens.spend_registered_before(T, 2, 2_400, 2_250)),
            vec![1]
        );
        assert_eq!(shards(&spent(&mut tokens, 2, 2_400)), vec![2]);
    }

    #[test]
    fn a_registration_replaces_the_shards_token() {
        let mut tokens = Tokens::default();
        for i in 0..10 {
            tokens.register(T, 3, Duration::from_secs(1), 1_000 + i);
        }
        assert_eq!(shards(&spent(&mut tokens, 10, 1_100)), vec![3]);
    }
}
