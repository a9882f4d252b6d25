//! The consumer side of one shard: parked consumers in FIFOs, the topics to pump,
//! the notifications owners sent, and the registrations (tokens) this shard left
//! with other owners.
//!
//! Which cores: one [`Waiters`] per shard; the pump task of that shard
//! ([`super::flow::run_pump`]) is its only reader of work.
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
//! Registrations: one per (topic, owner shard), shared by every consumer parked
//! here. A consumer parking within [`SHARE_WINDOW`] of a registration whose token
//! outlives its deadline shares it; a notification spends the owner's token, so
//! the registration is forgotten at once.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_channel::oneshot;
use narad_io::rt::Notify;
use narad_shards::ids::{IncarnationId, PartitionId};

use super::Delivered;

/// A registration younger than this is shared by consumers that park after it.
pub const SHARE_WINDOW: Duration = Duration::from_millis(250);

/// A FIFO is swept of dead entries when it reaches a power of two at least this.
const SWEEP_FROM_ENTRIES: usize = 64;

/// One parked consumer.
pub struct Waiter {
    pub max: usize,
    reply: RefCell<Option<oneshot::Sender<Vec<Delivered>>>>,
}

impl Waiter {
    pub fn new(max: usize) -> (Rc<Waiter>, oneshot::Receiver<Vec<Delivered>>) {
        assert!(max > 0);
        let (reply, answer) = oneshot::channel();
        let waiter = Rc::new(Waiter {
            max,
            reply: RefCell::new(Some(reply)),
        });
        (waiter, answer)
    }

    /// Still waiting: not delivered to, not timed out, request not cancelled.
    pub fn is_live(&self) -> bool {
        self.reply
            .borrow()
            .as_ref()
            .is_some_and(|reply| !reply.is_canceled())
    }

    /// Hands records over; gives them back if the consumer is gone.
    pub fn deliver(&self, records: Vec<Delivered>) -> Result<(), Vec<Delivered>> {
        match self.reply.borrow_mut().take() {
            Some(reply) => reply.send(records),
            None => Err(records),
        }
    }

    /// The consumer stops waiting (its deadline passed).
    pub fn close(&self) {
        self.reply.borrow_mut().take();
    }
}

/// When this shard registered with an owner, and when that token lapses.
#[derive(Clone, Copy)]
struct Registration {
    sent_at: Instant,
    expires_at: Instant,
}

struct TopicWait {
    topic: Arc<str>,
    queue: VecDeque<Rc<Waiter>>,
    pinned: HashMap<PartitionId, VecDeque<Rc<Waiter>>>,
    registered: HashMap<usize, Registration>,
}

/// A topic with something to do for the pump.
pub struct Kick {
    pub incarnation: IncarnationId,
    pub topic: Arc<str>,
}

/// An owner told this shard a record is there for it.
pub struct Notification {
    pub incarnation: IncarnationId,
    pub topic: Arc<str>,
    pub owner: usize,
}

/// One shard's parked consumers.
#[derive(Default)]
pub struct Waiters {
    topics: RefCell<HashMap<IncarnationId, TopicWait>>,
    kicked: RefCell<Vec<Kick>>,
    notifications: RefCell<Vec<Notification>>,
    /// Wakes the pump.
    pub pump: Notify,
    /// Whether the registration keeper task runs.
    pub keeper_running: Cell<bool>,
}

impl Waiters {
    fn topic_entry<'a>(
        topics: &'a mut HashMap<IncarnationId, TopicWait>,
        incarnation: IncarnationId,
        topic: &Arc<str>,
    ) -> &'a mut TopicWait {
        topics.entry(incarnation).or_insert_with(|| TopicWait {
            topic: topic.clone(),
            queue: VecDeque::new(),
            pinned: HashMap::new(),
            registered: HashMap::new(),
        })
    }

    /// Parks a consumer and kicks the pump (a consumer that arrives after the data
    /// must not wait for a wake that already happened).
    pub fn park(
        &self,
        incarnation: IncarnationId,
        topic: &Arc<str>,
        pinned: Option<PartitionId>,
        waiter: Rc<Waiter>,
    ) {
        let mut topics = self.topics.borrow_mut();
        let entry = Self::topic_entry(&mut topics, incarnation, topic);
        let fifo = match pinned {
            Some(p) => entry.pinned.entry(p).or_default(),
            None => &mut entry.queue,
        };
        if fifo.len() >= SWEEP_FROM_ENTRIES && fifo.len().is_power_of_two() {
            fifo.retain(|w| w.is_live());
        }
        fifo.push_back(waiter);
        drop(topics);
        self.kick(incarnation, topic);
    }

    /// Asks the pump to look at a topic.
    pub fn kick(&self, incarnation: IncarnationId, topic: &Arc<str>) {
        let mut kicked = self.kicked.borrow_mut();
        if !kicked.iter().any(|k| k.incarnation == incarnation) {
            kicked.push(Kick {
                incarnation,
                topic: topic.clone(),
            });
        }
        drop(kicked);
        self.pump.notify();
    }

    /// An owner spent this shard's token: forget the registration, wake the pump.
    pub fn notified(&self, incarnation: IncarnationId, topic: &Arc<str>, owner: usize) {
        if let Some(entry) = self.topics.borrow_mut().get_mut(&incarnation) {
            entry.registered.remove(&owner);
        }
        self.notifications.borrow_mut().push(Notification {
            incarnation,
            topic: topic.clone(),
            owner,
        });
        self.pump.notify();
    }

    pub fn take_kicked(&self) -> Vec<Kick> {
        std::mem::take(&mut *self.kicked.borrow_mut())
    }

    pub fn take_notifications(&self) -> Vec<Notification> {
        std::mem::take(&mut *self.notifications.borrow_mut())
    }

    /// The first live consumer of a FIFO, taken off it.
    pub fn pop_live(
        &self,
        incarnation: IncarnationId,
        pinned: Option<PartitionId>,
    ) -> Option<Rc<Waiter>> {
        let mut topics = self.topics.borrow_mut();
        let entry = topics.get_mut(&incarnation)?;
        let fifo = match pinned {
            Some(p) => entry.pinned.get_mut(&p)?,
            None => &mut entry.queue,
        };
        while let Some(waiter) = fifo.pop_front() {
            if waiter.is_live() {
                return Some(waiter);
            }
        }
        None
    }

    /// Puts a consumer the pump could not serve back at the head of its FIFO.
    pub fn push_front(
        &self,
        incarnation: IncarnationId,
        topic: &Arc<str>,
        pinned: Option<PartitionId>,
        waiter: Rc<Waiter>,
    ) {
        let mut topics = self.topics.borrow_mut();
        let entry = Self::topic_entry(&mut topics, incarnation, topic);
        match pinned {
            Some(p) => entry.pinned.entry(p).or_default().push_front(waiter),
            None => entry.queue.push_front(waiter),
        }
    }

    /// Partitions with a pinned consumer parked.
    pub fn pinned_partitions(&self, incarnation: IncarnationId) -> Vec<PartitionId> {
        let mut topics = self.topics.borrow_mut();
        let Some(entry) = topics.get_mut(&incarnation) else {
            return Vec::new();
        };
        entry.pinned.retain(|_, fifo| {
            fifo.retain(|w| w.is_live());
            !fifo.is_empty()
        });
        entry.pinned.keys().copied().collect()
    }

    /// Whether a live unpinned consumer is parked on the topic.
    pub fn has_parked(&self, incarnation: IncarnationId) -> bool {
        self.topics
            .borrow()
            .get(&incarnation)
            .is_some_and(|e| e.queue.iter().any(|w| w.is_live()))
    }

    /// Of `owners`, those this shard must (re)register with for a consumer that
    /// waits until `deadline`; marks them registered until `deadline` plus the
    /// share window.
    pub fn registrations_needed(
        &self,
        incarnation: IncarnationId,
        topic: &Arc<str>,
        owners: &[usize],
        deadline: Instant,
        now: Instant,
    ) -> Vec<usize> {
        let mut topics = self.topics.borrow_mut();
        let entry = Self::topic_entry(&mut topics, incarnation, topic);
        let mut needed = Vec::new();
        for &owner in owners {
            let shared = entry.registered.get(&owner).is_some_and(|r| {
                now.duration_since(r.sent_at) < SHARE_WINDOW && r.expires_at >= deadline
            });
            if !shared {
                entry.registered.insert(
                    owner,
                    Registration {
                        sent_at: now,
                        expires_at: deadline + SHARE_WINDOW,
                    },
                );
                needed.push(owner);
            }
        }
        needed
    }

    /// The keeper's view: per topic with live unpinned consumers, its name, the
    /// latest deadline to cover, and the owners whose registration is missing,
    /// lapsing before `until`, or older than `renew_after`.
    pub fn stale_registrations(
        &self,
        now: Instant,
        renew_after: Duration,
        owners_of: impl Fn(IncarnationId, &str) -> Vec<usize>,
    ) -> Vec<(IncarnationId, Arc<str>, Vec<usize>)> {
        let mut out = Vec::new();
        let mut topics = self.topics.borrow_mut();
        for (&incarnation, entry) in topics.iter_mut() {
            if !entry.queue.iter().any(|w| w.is_live()) {
                continue;
            }
            let mut stale = Vec::new();
            for owner in owners_of(incarnation, &entry.topic) {
                let fresh = entry.registered.get(&owner).is_some_and(|r| {
                    r.expires_at > now + SHARE_WINDOW && now.duration_since(r.sent_at) < renew_after
                });
                if !fresh {
                    stale.push(owner);
                }
            }
            if !stale.is_empty() {
                out.push((incarnation, entry.topic.clone(), stale));
            }
        }
        out
    }

    /// Records that a registration was sent now, lasting `ttl`.
    pub fn note_registered(&self, incarnation: IncarnationId, owner: usize, ttl: Duration) {
        let now = Instant::now();
        if let Some(entry) = self.topics.borrow_mut().get_mut(&incarnation) {
            entry.registered.insert(
                owner,
                Registration {
                    sent_at: now,
                    expires_at: now + ttl,
                },
            );
        }
    }

    /// Whether any consumer is parked on this shard at all.
    pub fn any_parked(&self) -> bool {
        self.topics
            .borrow()
            .values()
            .any(|e| e.queue.iter().any(|w| w.is_live()))
    }

    /// Forgets a deleted topic: its parked consumers get nothing (answered 204).
    pub fn drop_incarnation(&self, incarnation: IncarnationId) {
        self.topics.borrow_mut().remove(&incarnation);
    }

    /// Empties every FIFO (the node is stopping): parked consumers are answered at
    /// once.
    pub fn release_all(&self) {
        let topics = std::mem::take(&mut *self.topics.borrow_mut());
        for entry in topics.into_values() {
            for w in entry.queue.iter().chain(entry.pinned.values().flatten()) {
                w.close();
            }
        }
    }

    /// Forgets dead topic entries (nothing parked, no registration alive).
    pub fn sweep(&self, now: Instant) {
        self.topics.borrow_mut().retain(|_, e| {
            e.queue.retain(|w| w.is_live());
            e.pinned.retain(|_, f| {
                f.retain(|w| w.is_live());
                !f.is_empty()
            });
            e.registered.retain(|_, r| r.expires_at > now);
            !(e.queue.is_empty() && e.pinned.is_empty() && e.registered.is_empty())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_waiters_are_skipped_and_swept() {
        let waiters = Waiters::default();
        let topic: Arc<str> = Arc::from("t");
        let id = IncarnationId(1);
        let mut answers = Vec::new();
        for i in 0..200 {
            let (w, answer) = Waiter::new(1);
            waiters.park(id, &topic, None, w);
            if i % 2 == 0 {
                answers.push(answer); // kept: live
            }
        }
        let len = waiters.topics.borrow()[&id].queue.len();
        assert!(len < 200, "swept while parking: {len}");
        let mut live = 0;
        while let Some(w) = waiters.pop_live(id, None) {
            assert!(w.is_live());
            live += 1;
        }
        assert_eq!(live, 100);
    }

    #[test]
    fn registrations_are_shared_inside_the_window_only() {
        let waiters = Waiters::default();
        let topic: Arc<str> = Arc::from("t");
        let id = IncarnationId(1);
        let now = Instant::now();
        let deadline = now + Duration::from_secs(5);
        assert_eq!(
            waiters.registrations_needed(id, &topic, &[1, 2], deadline, now),
            vec![1, 2]
        );
        let soon = now + Duration::from_millis(100);
        assert!(waiters
            .registrations_needed(id, &topic, &[1, 2], deadline, soon)
            .is_empty());
        // A later deadline is not covered by the token.
        let later = deadline + Duration::from_secs(1);
        assert_eq!(
            waiters.registrations_needed(id, &topic, &[1], later, soon),
            vec![1]
        );
        // Past the share window a consumer registers again.
        let late = now + SHARE_WINDOW + Duration::from_millis(1);
        assert_eq!(
            waiters.registrations_needed(id, &topic, &[2], deadline, late),
            vec![2]
        );
        // A notification spends the token.
        waiters.notified(id, &topic, 2);
        assert_eq!(
            waiters.registrations_needed(id, &topic, &[2], deadline, late),
            vec![2]
        );
    }
}
