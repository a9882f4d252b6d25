//! The consumer side of one shard (sans-IO): parked consumers in FIFOs, the topics
//! to pump, the notifications owners sent, and the registrations (tokens) this
//! shard left with other owners.
//!
//! Which cores: one [`Waiters`] per shard, touched only by that shard's tasks (the
//! consume requests that park, the pump, the claims, the registration keeper).
//! Nothing here reads a clock or wakes a task: the caller passes the time in
//! (`now_ms`, milliseconds of a monotonic clock) and, after [`Waiters::park`],
//! [`Waiters::kick`] or [`Waiters::notified`], wakes its pump itself. So a seeded
//! simulation drives this core exactly as the broker does.
//!
//! A consumer that found nothing parks: it joins its topic's FIFO (or, pinned to a
//! partition, that partition's FIFO) holding the sending end of a oneshot. Nothing
//! is reserved for it. The pump takes the head of a FIFO, reserves for exactly that
//! consumer, and sends; a consumer whose request was cancelled has dropped the
//! receiving end, so the send fails and the records are released at once.
//!
//! Dead entries (timed out, cancelled) stay where they stand and are skipped when
//! popped; a FIFO is swept once it doubles past 64 entries, so a re-park costs
//! O(1) amortized and a FIFO never holds more than about twice its live entries.
//!
//! Topics are pumped concurrently, each by one task at a time: [`Waiters::take_kicked`]
//! hands out only topics not being pumped and marks them, and a kick for a topic
//! being pumped waits until [`Waiters::pumped`]. So a topic whose read stalls (a
//! slow disk under its cold records) holds up only its own consumers.
//!
//! Registrations: one per (topic, owner shard), shared by every consumer parked
//! here. A consumer parking within [`SHARE_WINDOW`] of a registration whose token
//! outlives its deadline shares it; a notification spends the owner's token, so
//! the registration is forgotten at once.
//!
//! The delivered item type `D` is the broker's (leased records); the core only
//! moves it through the oneshot.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_channel::oneshot;

use super::tokens::PromiseId;
use crate::ids::{IncarnationId, PartitionId};

/// A registration younger than this is shared by consumers that park after it.
pub const SHARE_WINDOW: Duration = Duration::from_millis(250);

/// A FIFO is swept of dead entries when it reaches a power of two at least this.
const SWEEP_FROM_ENTRIES: usize = 64;

/// The TTL of a renewal sent at `now_ms` for consumers waiting until
/// `latest_deadline_ms` at most.
fn renewal_ttl(latest_deadline_ms: u64, now_ms: u64, renew_after: Duration) -> Duration {
    let wait = Duration::from_millis(latest_deadline_ms.saturating_sub(now_ms));
    wait.min(renew_after) + SHARE_WINDOW
}

/// Milliseconds of a duration, for arithmetic on the caller's millisecond clock.
/// What the live consumers of `fifo` would take, each its `max`, counted up to
/// `limit`.
fn wanted<D>(fifo: &VecDeque<Rc<Waiter<D>>>, limit: u64) -> u64 {
    let mut wanted = 0u64;
    for waiter in fifo.iter().filter(|w| w.is_live()) {
        if wanted >= limit {
            break;
        }
        wanted += waiter.max as u64;
    }
    wanted.min(limit)
}

/// Of a newcomer's `share` of the shard, what it may take without the
/// records consumers pinned to a partition wait for (`pinned_wait`: a
/// partition's available records and how many of them its pinned consumers
/// would take). Pinned itself, to `pinned`, it takes only what they leave;
/// unpinned, it takes from their partitions last: `local` is reordered, the
/// other partitions first, each group in partition order turned by `turn`
/// (a counter that moves on every consume), so every partition of a group
/// comes first as often as the others.
pub fn leave_to_pinned(
    share: usize,
    pinned: Option<PartitionId>,
    local: &mut [PartitionId],
    turn: usize,
    pinned_wait: impl Fn(PartitionId) -> (u64, u64),
) -> Option<usize> {
    if let Some(p) = pinned {
        let (available, wanted) = pinned_wait(p);
        let spare = usize::try_from(available.saturating_sub(wanted)).unwrap_or(usize::MAX);
        return (spare > 0).then(|| share.min(spare));
    }
    let (mut free, mut held): (Vec<PartitionId>, Vec<PartitionId>) =
        local.iter().partition(|&&p| pinned_wait(p).1 == 0);
    if held.is_empty() {
        // The caller's order stands.
        return Some(share);
    }
    for group in [&mut free, &mut held] {
        group.sort_unstable();
        if !group.is_empty() {
            let by = turn % group.len();
            group.rotate_left(by);
        }
    }
    for (slot, p) in local.iter_mut().zip(free.into_iter().chain(held)) {
        *slot = p;
    }
    Some(share)
}

/// Gives claimed records to parked consumers in FIFO order, each at most its own
/// `max`: the claim was sized for the head consumer, and if it has gone the
/// records go on to the next ones. Returns what nobody took, for release.
pub fn hand_out<T>(
    mut got: Vec<T>,
    mut next: impl FnMut() -> Option<Rc<Waiter<Vec<T>>>>,
) -> Vec<T> {
    while !got.is_empty() {
        let Some(w) = next() else { break };
        let rest = got.split_off(w.max.clamp(1, got.len()));
        got = match w.deliver(got) {
            Ok(()) => rest,
            Err(mut back) => {
                back.extend(rest);
                back
            }
        };
    }
    got
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// One parked consumer.
pub struct Waiter<D> {
    pub max: usize,
    /// When it stops waiting, on the caller's millisecond clock: the
    /// registrations kept for it last no longer.
    pub deadline_ms: u64,
    /// When it parked, on the same clock: its place beside the tokens other
    /// shards left (see [`Waiters::head_parked_ms`]).
    pub parked_ms: u64,
    reply: RefCell<Option<oneshot::Sender<D>>>,
}

impl<D> Waiter<D> {
    /// A consumer that parks at `parked_ms` and waits until `deadline_ms`.
    pub fn new_at(
        max: usize,
        parked_ms: u64,
        deadline_ms: u64,
    ) -> (Rc<Waiter<D>>, oneshot::Receiver<D>) {
        assert!(max > 0, "a consumer asks for at least one record");
        let (reply, answer) = oneshot::channel();
        let waiter = Rc::new(Waiter {
            max,
            deadline_ms,
            parked_ms,
            reply: RefCell::new(Some(reply)),
        });
        (waiter, answer)
    }

    /// A consumer parked since the clock's start: ahead of every token.
    pub fn new(max: usize, deadline_ms: u64) -> (Rc<Waiter<D>>, oneshot::Receiver<D>) {
        Self::new_at(max, 0, deadline_ms)
    }

    /// Still waiting: not delivered to, not timed out, request not cancelled.
    pub fn is_live(&self) -> bool {
        self.reply
            .borrow()
            .as_ref()
            .is_some_and(|reply| !reply.is_canceled())
    }

    /// Hands records over; gives them back if the consumer is gone.
    pub fn deliver(&self, records: D) -> Result<(), D> {
        let result = match self.reply.borrow_mut().take() {
            Some(reply) => reply.send(records),
            None => Err(records),
        };
        // Delivered or not, a waiter answers at most once.
        assert!(self.reply.borrow().is_none());
        result
    }

    /// The consumer stops waiting (its deadline passed).
    pub fn close(&self) {
        self.reply.borrow_mut().take();
    }
}

/// When this shard registered with an owner, and when that token lapses, both on
/// this shard's clock.
#[derive(Clone, Copy, Debug)]
struct Registration {
    sent_at_ms: u64,
    expires_at_ms: u64,
}

struct TopicWait<D> {
    topic: Arc<str>,
    queue: VecDeque<Rc<Waiter<D>>>,
    pinned: BTreeMap<PartitionId, VecDeque<Rc<Waiter<D>>>>,
    registered: BTreeMap<usize, Registration>,
}

/// Registrations one topic needs again: the keeper's or a renewal's work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Renewal {
    pub incarnation: IncarnationId,
    pub topic: Arc<str>,
    /// The owners to register with.
    pub owners: Vec<usize>,
    /// What the tokens should last: the remaining wait of the topic's
    /// longest-waiting parked consumer, at most the renewal period, plus the
    /// share window; a peer that stops leaves nothing behind for longer.
    pub ttl: Duration,
}

/// A topic with something to do for the pump.
#[derive(Clone, Debug)]
pub struct Kick {
    pub incarnation: IncarnationId,
    pub topic: Arc<str>,
}

/// An owner told this shard a record is there for it.
#[derive(Clone, Debug)]
pub struct Notification {
    pub incarnation: IncarnationId,
    pub topic: Arc<str>,
    pub owner: usize,
    /// The owner's promise, which the claim or pass answering it names.
    pub promise: PromiseId,
}

/// One shard's parked consumers. See the module doc.
pub struct Waiters<D> {
    topics: BTreeMap<IncarnationId, TopicWait<D>>,
    kicked: Vec<Kick>,
    /// Topics handed to the pump and not yet reported pumped.
    pumping: Vec<IncarnationId>,
    notifications: Vec<Notification>,
}

impl<D> Default for Waiters<D> {
    fn default() -> Self {
        Waiters {
            topics: BTreeMap::new(),
            kicked: Vec::new(),
            pumping: Vec::new(),
            notifications: Vec::new(),
        }
    }
}

impl<D> Waiters<D> {
    fn topic_entry<'a>(
        topics: &'a mut BTreeMap<IncarnationId, TopicWait<D>>,
        incarnation: IncarnationId,
        topic: &Arc<str>,
    ) -> &'a mut TopicWait<D> {
        topics.entry(incarnation).or_insert_with(|| TopicWait {
            topic: topic.clone(),
            queue: VecDeque::new(),
            pinned: BTreeMap::new(),
            registered: BTreeMap::new(),
        })
    }

    /// Parks a consumer and kicks its topic (a consumer that arrives after the data
    /// must not wait for a wake that already happened); the caller wakes the pump.
    pub fn park(
        &mut self,
        incarnation: IncarnationId,
        topic: &Arc<str>,
        pinned: Option<PartitionId>,
        waiter: Rc<Waiter<D>>,
    ) {
        let entry = Self::topic_entry(&mut self.topics, incarnation, topic);
        let fifo = match pinned {
            Some(p) => entry.pinned.entry(p).or_default(),
            None => &mut entry.queue,
        };
        if fifo.len() >= SWEEP_FROM_ENTRIES && fifo.len().is_power_of_two() {
            fifo.retain(|w| w.is_live());
        }
        fifo.push_back(waiter);
        self.kick(incarnation, topic);
    }

    /// Asks the pump to look at a topic; the caller wakes the pump.
    pub fn kick(&mut self, incarnation: IncarnationId, topic: &Arc<str>) {
        if !self.kicked.iter().any(|k| k.incarnation == incarnation) {
            self.kicked.push(Kick {
                incarnation,
                topic: topic.clone(),
            });
        }
        assert!(!self.kicked.is_empty());
    }

    /// An owner spent this shard's token: forget the registration and queue the
    /// notification for the pump; the caller wakes the pump.
    pub fn notified(
        &mut self,
        incarnation: IncarnationId,
        topic: &Arc<str>,
        owner: usize,
        promise: PromiseId,
    ) {
        if let Some(entry) = self.topics.get_mut(&incarnation) {
            entry.registered.remove(&owner);
        }
        self.notifications.push(Notification {
            incarnation,
            topic: topic.clone(),
            owner,
            promise,
        });
    }

    /// The kicked topics nobody pumps now, marked as pumped from here until
    /// [`Waiters::pumped`]; a kick for a topic being pumped stays until then.
    pub fn take_kicked(&mut self) -> Vec<Kick> {
        let pumping = &mut self.pumping;
        let mut taken = Vec::new();
        self.kicked.retain(|kick| {
            if pumping.contains(&kick.incarnation) {
                return true;
            }
            pumping.push(kick.incarnation);
            taken.push(kick.clone());
            false
        });
        taken
    }

    /// The pump is done with a topic [`Waiters::take_kicked`] handed out.
    /// Returns whether it was kicked meanwhile: then the caller wakes the pump.
    pub fn pumped(&mut self, incarnation: IncarnationId) -> bool {
        let at = self.pumping.iter().position(|&i| i == incarnation);
        let at = at.expect("a topic reported pumped was handed to the pump");
        self.pumping.swap_remove(at);
        self.kicked.iter().any(|k| k.incarnation == incarnation)
    }

    /// Topics being pumped now.
    pub fn pumping_len(&self) -> usize {
        self.pumping.len()
    }

    pub fn take_notifications(&mut self) -> Vec<Notification> {
        std::mem::take(&mut self.notifications)
    }

    /// The first live consumer of a FIFO, taken off it.
    pub fn pop_live(
        &mut self,
        incarnation: IncarnationId,
        pinned: Option<PartitionId>,
    ) -> Option<Rc<Waiter<D>>> {
        let entry = self.topics.get_mut(&incarnation)?;
        let fifo = match pinned {
            Some(p) => entry.pinned.get_mut(&p)?,
            None => &mut entry.queue,
        };
        // Bounded by the FIFO's length: every iteration pops one entry.
        while let Some(waiter) = fifo.pop_front() {
            if waiter.is_live() {
                return Some(waiter);
            }
        }
        None
    }

    /// Puts a consumer the pump could not serve back at the head of its FIFO.
    pub fn push_front(
        &mut self,
        incarnation: IncarnationId,
        topic: &Arc<str>,
        pinned: Option<PartitionId>,
        waiter: Rc<Waiter<D>>,
    ) {
        let entry = Self::topic_entry(&mut self.topics, incarnation, topic);
        match pinned {
            Some(p) => entry.pinned.entry(p).or_default().push_front(waiter),
            None => entry.queue.push_front(waiter),
        }
    }

    /// Partitions with a pinned consumer parked.
    pub fn pinned_partitions(&mut self, incarnation: IncarnationId) -> Vec<PartitionId> {
        let Some(entry) = self.topics.get_mut(&incarnation) else {
            return Vec::new();
        };
        entry.pinned.retain(|_, fifo| {
            fifo.retain(|w| w.is_live());
            !fifo.is_empty()
        });
        entry.pinned.keys().copied().collect()
    }

    /// When the first live unpinned consumer of the topic's FIFO parked: the
    /// owner's pump serves the tokens registered before it first. `None`
    /// when nobody is parked.
    pub fn head_parked_ms(&self, incarnation: IncarnationId) -> Option<u64> {
        let entry = self.topics.get(&incarnation)?;
        entry
            .queue
            .iter()
            .find(|w| w.is_live())
            .map(|w| w.parked_ms)
    }

    /// How many of the records available now the consumers parked on the
    /// topic would take, counted up to `limit`: those of the topic's FIFO (each
    /// its `max`), and those of each pinned FIFO, at most what its partition
    /// holds (`available_in`). A consumer arriving now leaves these to them:
    /// the pump, which the event that made them available woke, serves them
    /// next. Costs at most one look at each consumer parked on the topic.
    pub fn waiting_demand(
        &self,
        incarnation: IncarnationId,
        limit: u64,
        available_in: impl Fn(PartitionId) -> u64,
    ) -> u64 {
        let Some(entry) = self.topics.get(&incarnation) else {
            return 0;
        };
        let mut demand = wanted(&entry.queue, limit);
        for (&partition, fifo) in &entry.pinned {
            if demand >= limit {
                break;
            }
            demand += wanted(fifo, available_in(partition).min(limit - demand));
        }
        demand
    }

    /// How many of the `available` records of `partition` the consumers
    /// parked pinned to it would take.
    pub fn pinned_demand(
        &self,
        incarnation: IncarnationId,
        partition: PartitionId,
        available: u64,
    ) -> u64 {
        self.topics
            .get(&incarnation)
            .and_then(|entry| entry.pinned.get(&partition))
            .map_or(0, |fifo| wanted(fifo, available))
    }

    /// Whether a live consumer is parked on the topic, pinned or not.
    pub fn any_parked_on(&self, incarnation: IncarnationId) -> bool {
        self.topics.get(&incarnation).is_some_and(|e| {
            (e.queue.iter().chain(e.pinned.values().flatten())).any(|w| w.is_live())
        })
    }

    /// Whether records made available for the topic must wake the pump: a
    /// consumer is on its FIFOs (pinned or not; live or gone, which the pump
    /// drops), or the pump is at the topic now and may hold a consumer off
    /// its FIFO, whose look for records may have missed these. One look,
    /// whatever the FIFOs hold. A consumer that parks later wakes the pump
    /// itself ([`Waiters::park`]).
    pub fn is_waited_on(&self, incarnation: IncarnationId) -> bool {
        self.pumping.contains(&incarnation)
            || self
                .topics
                .get(&incarnation)
                .is_some_and(|e| !e.queue.is_empty() || e.pinned.values().any(|f| !f.is_empty()))
    }

    /// Whether a live unpinned consumer is parked on the topic.
    pub fn has_parked(&self, incarnation: IncarnationId) -> bool {
        self.topics
            .get(&incarnation)
            .is_some_and(|e| e.queue.iter().any(|w| w.is_live()))
    }

    /// Of `owners`, those this shard must (re)register with for a consumer that
    /// waits until `deadline_ms`; marks them registered until `deadline_ms` plus
    /// the share window.
    pub fn registrations_needed(
        &mut self,
        incarnation: IncarnationId,
        topic: &Arc<str>,
        owners: &[usize],
        deadline_ms: u64,
        now_ms: u64,
    ) -> Vec<usize> {
        let entry = Self::topic_entry(&mut self.topics, incarnation, topic);
        let mut needed = Vec::new();
        for &owner in owners {
            let shared = entry.registered.get(&owner).is_some_and(|r| {
                now_ms.saturating_sub(r.sent_at_ms) < ms(SHARE_WINDOW)
                    && r.expires_at_ms >= deadline_ms
            });
            if !shared {
                entry.registered.insert(
                    owner,
                    Registration {
                        sent_at_ms: now_ms,
                        expires_at_ms: deadline_ms.saturating_add(ms(SHARE_WINDOW)),
                    },
                );
                needed.push(owner);
            }
        }
        assert!(needed.len() <= owners.len());
        needed
    }

    /// The keeper's view: per topic with live unpinned consumers, the owners
    /// whose registration is missing, lapsing within the share window, older
    /// than `renew_after`, or shorter than a renewal sent when it was would have
    /// been for the consumers parked now (one that was off the FIFO while it was
    /// being served, with a later deadline than those left, is back).
    pub fn stale_registrations(
        &self,
        now_ms: u64,
        renew_after: Duration,
        owners_of: impl Fn(IncarnationId, &str) -> Vec<usize>,
    ) -> Vec<Renewal> {
        self.topics
            .keys()
            .filter_map(|&incarnation| {
                self.stale_registrations_of(incarnation, now_ms, renew_after, &owners_of)
            })
            .collect()
    }

    /// [`Waiters::stale_registrations`] for one topic incarnation.
    pub fn stale_registrations_of(
        &self,
        incarnation: IncarnationId,
        now_ms: u64,
        renew_after: Duration,
        owners_of: impl Fn(IncarnationId, &str) -> Vec<usize>,
    ) -> Option<Renewal> {
        let entry = self.topics.get(&incarnation)?;
        let latest_deadline_ms = Self::latest_deadline_ms(entry)?;
        let mut stale = Vec::new();
        for owner in owners_of(incarnation, &entry.topic) {
            let fresh = entry.registered.get(&owner).is_some_and(|r| {
                let covers = latest_deadline_ms.min(r.sent_at_ms.saturating_add(ms(renew_after)));
                r.expires_at_ms > now_ms.saturating_add(ms(SHARE_WINDOW))
                    && now_ms.saturating_sub(r.sent_at_ms) < ms(renew_after)
                    && r.expires_at_ms >= covers
            });
            if !fresh {
                stale.push(owner);
            }
        }
        (!stale.is_empty()).then(|| Renewal {
            incarnation,
            topic: entry.topic.clone(),
            owners: stale,
            ttl: renewal_ttl(latest_deadline_ms, now_ms, renew_after),
        })
    }

    /// What a renewal of the topic's tokens sent now should last (see
    /// [`Renewal::ttl`]); `None` when no live consumer is parked on it. A
    /// renewal that waited for room on the mesh asks again before each send.
    pub fn renewal_ttl(
        &self,
        incarnation: IncarnationId,
        now_ms: u64,
        renew_after: Duration,
    ) -> Option<Duration> {
        let latest = Self::latest_deadline_ms(self.topics.get(&incarnation)?)?;
        Some(renewal_ttl(latest, now_ms, renew_after))
    }

    /// The latest deadline of a live unpinned consumer of the topic.
    fn latest_deadline_ms(entry: &TopicWait<D>) -> Option<u64> {
        entry
            .queue
            .iter()
            .filter(|w| w.is_live())
            .map(|w| w.deadline_ms)
            .max()
    }

    /// A registration [`Waiters::registrations_needed`] marked was never sent
    /// (its consumer went away first): forget it, so that the next consumer or
    /// the keeper sends one rather than trusting a token the owner never got.
    pub fn registration_unsent(&mut self, incarnation: IncarnationId, owner: usize) {
        if let Some(entry) = self.topics.get_mut(&incarnation) {
            entry.registered.remove(&owner);
        }
    }

    /// Records that a registration was sent at `now_ms`, lasting `ttl`.
    pub fn note_registered(
        &mut self,
        incarnation: IncarnationId,
        owner: usize,
        ttl: Duration,
        now_ms: u64,
    ) {
        if let Some(entry) = self.topics.get_mut(&incarnation) {
            entry.registered.insert(
                owner,
                Registration {
                    sent_at_ms: now_ms,
                    expires_at_ms: now_ms.saturating_add(ms(ttl)),
                },
            );
        }
    }

    /// Whether any consumer is parked on this shard at all.
    pub fn any_parked(&self) -> bool {
        self.topics
            .values()
            .any(|e| e.queue.iter().any(|w| w.is_live()))
    }

    /// Forgets a deleted topic: its parked consumers get nothing (answered 204).
    pub fn drop_incarnation(&mut self, incarnation: IncarnationId) {
        // Closed, not just forgotten: the requests hold their waiters too, and
        // would otherwise wait out their whole long-poll.
        if let Some(entry) = self.topics.remove(&incarnation) {
            for w in entry.queue.iter().chain(entry.pinned.values().flatten()) {
                w.close();
            }
        }
    }

    /// Empties every FIFO (the node is stopping): parked consumers are answered at
    /// once.
    pub fn release_all(&mut self) {
        let topics = std::mem::take(&mut self.topics);
        for entry in topics.into_values() {
            for w in entry.queue.iter().chain(entry.pinned.values().flatten()) {
                w.close();
            }
        }
    }

    /// Forgets dead topic entries (nothing parked, no registration alive).
    pub fn sweep(&mut self, now_ms: u64) {
        self.topics.retain(|_, e| {
            e.queue.retain(|w| w.is_live());
            e.pinned.retain(|_, f| {
                f.retain(|w| w.is_live());
                !f.is_empty()
            });
            e.registered.retain(|_, r| r.expires_at_ms > now_ms);
            !(e.queue.is_empty() && e.pinned.is_empty() && e.registered.is_empty())
        });
    }

    /// Entries (live or dead) in the topic's unpinned FIFO; for tests.
    pub fn queued_len(&self, incarnation: IncarnationId) -> usize {
        self.topics.get(&incarnation).map_or(0, |e| e.queue.len())
    }
}

#[cfg(test)]
mod tests;
