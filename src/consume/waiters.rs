//! The consumer side of one shard: the sans-IO core
//! ([`narad_shards::consume::waiters`]: waiter FIFOs, kicks, notifications,
//! registrations) plus the two things only a running shard has: the [`Notify`]
//! that wakes its pump, and whether its registration keeper task runs.
//!
//! Which cores: one [`Waiters`] per shard; the pump task of that shard
//! ([`super::flow::run_pump`]) is its only reader of work. Every method borrows
//! the core for the call only, so no borrow is held across an `.await`.
//!
//! Time: the core takes milliseconds of [`super::now_ms`], the clock lease
//! expiries live on, so every consume-path deadline on a shard reads one clock.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use narad_io::rt::Notify;
use narad_shards::consume::tokens::{PromiseId, CLAIM_DEADLINE};
use narad_shards::consume::waiters as core;
use narad_shards::ids::{IncarnationId, PartitionId};

pub use narad_shards::consume::waiters::{Kick, Notification, Renewal, SHARE_WINDOW};

use super::Delivered;

/// One parked consumer; it receives the records leased for it.
pub type Waiter = core::Waiter<Vec<Delivered>>;

/// After a failed read the topic's consumers are served again this much later
/// (a failed log is opened again after a second too), not at once.
pub const READ_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Promise deadlines closer than this share one kick of the topic.
pub const PROMISE_KICKS_APART: Duration = Duration::from_millis(10);

/// One shard's parked consumers, and the wake-up of its pump.
#[derive(Default)]
pub struct Waiters {
    core: RefCell<core::Waiters<Vec<Delivered>>>,
    /// Wakes the pump.
    pub pump: Notify,
    /// Whether the registration keeper task runs.
    pub keeper_running: Cell<bool>,
    /// Topics whose consumers are served again after a pause, because a read
    /// of one of their partitions failed.
    pub retrying: RefCell<HashSet<IncarnationId>>,
    /// Per topic, the deadlines of promises made, in order, while its timer
    /// runs (see [`Waiters::kick_at_claim_deadline`]).
    pub promised: RefCell<HashMap<IncarnationId, VecDeque<u64>>>,
}

impl Waiters {
    /// Parks a consumer and wakes the pump (a consumer that arrives after the data
    /// must not wait for a wake that already happened).
    pub fn park(
        &self,
        incarnation: IncarnationId,
        topic: &Arc<str>,
        pinned: Option<PartitionId>,
        waiter: Rc<Waiter>,
    ) {
        self.core
            .borrow_mut()
            .park(incarnation, topic, pinned, waiter);
        self.pump.notify();
    }

    /// Asks the pump to look at a topic.
    pub fn kick(&self, incarnation: IncarnationId, topic: &Arc<str>) {
        self.core.borrow_mut().kick(incarnation, topic);
        self.pump.notify();
    }

    /// Serves the topic's consumers again after [`READ_RETRY_AFTER`], once
    /// however many reads failed meanwhile. A failed read wakes nobody (a wake
    /// would bring the pump straight back to the same failing read), so
    /// without this a parked consumer would wait for the next produce, ack or
    /// its deadline once the fault is gone.
    pub fn kick_later(self: &Rc<Self>, incarnation: IncarnationId, topic: &Arc<str>) {
        if !self.retrying.borrow_mut().insert(incarnation) {
            return;
        }
        let (waiters, topic) = (self.clone(), topic.clone());
        narad_io::rt::spawn_local(async move {
            narad_io::rt::sleep(READ_RETRY_AFTER).await;
            waiters.retrying.borrow_mut().remove(&incarnation);
            waiters.kick(incarnation, &topic);
        });
    }

    /// Serves the topic again at the deadline of a promise made now: the
    /// consumers parked here are held back from promised records until their
    /// claim, pass or deadline, and a promise whose notified shard never
    /// answers is retired by nothing but the clock. One timer task per topic
    /// walks the deadlines in order, kicking at each (deadlines less than
    /// [`PROMISE_KICKS_APART`] apart share one kick, at the later).
    pub fn kick_at_claim_deadline(self: &Rc<Self>, incarnation: IncarnationId, topic: &Arc<str>) {
        let due = super::now_ms() + CLAIM_DEADLINE.as_millis() as u64 + 1;
        let mut promised = self.promised.borrow_mut();
        if let Some(dues) = promised.get_mut(&incarnation) {
            // The running timer serves this deadline after the earlier ones.
            match dues.back_mut() {
                Some(last) if due - *last < PROMISE_KICKS_APART.as_millis() as u64 => *last = due,
                _ => dues.push_back(due),
            }
            return;
        }
        promised.insert(incarnation, VecDeque::from([due]));
        drop(promised);
        let (waiters, topic) = (self.clone(), topic.clone());
        narad_io::rt::spawn_local(async move {
            loop {
                let next = waiters
                    .promised
                    .borrow()
                    .get(&incarnation)
                    .and_then(|dues| dues.front().copied());
                let Some(next) = next else {
                    return;
                };
                let now = super::now_ms();
                if now < next {
                    narad_io::rt::sleep(Duration::from_millis(next - now)).await;
                    continue;
                }
                let done = {
                    let mut promised = waiters.promised.borrow_mut();
                    let dues = promised
                        .get_mut(&incarnation)
                        .expect("a timer's deadlines stay until it ends");
                    while dues.front().is_some_and(|&d| d <= now) {
                        dues.pop_front();
                    }
                    let done = dues.is_empty();
                    if done {
                        promised.remove(&incarnation);
                    }
                    done
                };
                waiters.kick(incarnation, &topic);
                if done {
                    return;
                }
            }
        });
    }

    /// An owner spent this shard's token: forget the registration, wake the pump.
    pub fn notified(
        &self,
        incarnation: IncarnationId,
        topic: &Arc<str>,
        owner: usize,
        promise: PromiseId,
    ) {
        self.core
            .borrow_mut()
            .notified(incarnation, topic, owner, promise);
        self.pump.notify();
    }

    /// The kicked topics nobody pumps now; each is the caller's to pump until
    /// it calls [`Waiters::pumped`].
    pub fn take_kicked(&self) -> Vec<Kick> {
        self.core.borrow_mut().take_kicked()
    }

    /// The pump is done with a topic: wakes it again if the topic was kicked
    /// meanwhile.
    pub fn pumped(&self, incarnation: IncarnationId) {
        if self.core.borrow_mut().pumped(incarnation) {
            self.pump.notify();
        }
    }

    pub fn take_notifications(&self) -> Vec<Notification> {
        self.core.borrow_mut().take_notifications()
    }

    /// The first live consumer of a FIFO, taken off it.
    pub fn pop_live(
        &self,
        incarnation: IncarnationId,
        pinned: Option<PartitionId>,
    ) -> Option<Rc<Waiter>> {
        self.core.borrow_mut().pop_live(incarnation, pinned)
    }

    /// Puts a consumer the pump could not serve back at the head of its FIFO.
    pub fn push_front(
        &self,
        incarnation: IncarnationId,
        topic: &Arc<str>,
        pinned: Option<PartitionId>,
        waiter: Rc<Waiter>,
    ) {
        self.core
            .borrow_mut()
            .push_front(incarnation, topic, pinned, waiter);
    }

    /// Partitions with a pinned consumer parked.
    pub fn pinned_partitions(&self, incarnation: IncarnationId) -> Vec<PartitionId> {
        self.core.borrow_mut().pinned_partitions(incarnation)
    }

    /// Whether a live unpinned consumer is parked on the topic.
    pub fn has_parked(&self, incarnation: IncarnationId) -> bool {
        self.core.borrow().has_parked(incarnation)
    }

    /// See [`core::Waiters::head_parked_ms`].
    pub fn head_parked_ms(&self, incarnation: IncarnationId) -> Option<u64> {
        self.core.borrow().head_parked_ms(incarnation)
    }

    /// See [`core::Waiters::registrations_needed`].
    pub fn registrations_needed(
        &self,
        incarnation: IncarnationId,
        topic: &Arc<str>,
        owners: &[usize],
        deadline_ms: u64,
        now_ms: u64,
    ) -> Vec<usize> {
        self.core
            .borrow_mut()
            .registrations_needed(incarnation, topic, owners, deadline_ms, now_ms)
    }

    /// See [`core::Waiters::stale_registrations`].
    pub fn stale_registrations(
        &self,
        now_ms: u64,
        renew_after: Duration,
        owners_of: impl Fn(IncarnationId, &str) -> Vec<usize>,
    ) -> Vec<Renewal> {
        self.core
            .borrow()
            .stale_registrations(now_ms, renew_after, owners_of)
    }

    /// See [`core::Waiters::stale_registrations_of`].
    pub fn stale_registrations_of(
        &self,
        incarnation: IncarnationId,
        now_ms: u64,
        renew_after: Duration,
        owners_of: impl Fn(IncarnationId, &str) -> Vec<usize>,
    ) -> Option<Renewal> {
        self.core
            .borrow()
            .stale_registrations_of(incarnation, now_ms, renew_after, owners_of)
    }

    /// See [`core::Waiters::renewal_ttl`].
    pub fn renewal_ttl(
        &self,
        incarnation: IncarnationId,
        now_ms: u64,
        renew_after: Duration,
    ) -> Option<Duration> {
        self.core
            .borrow()
            .renewal_ttl(incarnation, now_ms, renew_after)
    }

    /// See [`core::Waiters::registration_unsent`].
    pub fn registration_unsent(&self, incarnation: IncarnationId, owner: usize) {
        self.core
            .borrow_mut()
            .registration_unsent(incarnation, owner);
    }

    /// Records that a registration was sent at `now_ms`, lasting `ttl`.
    pub fn note_registered(
        &self,
        incarnation: IncarnationId,
        owner: usize,
        ttl: Duration,
        now_ms: u64,
    ) {
        self.core
            .borrow_mut()
            .note_registered(incarnation, owner, ttl, now_ms);
    }

    /// Whether any consumer is parked on this shard at all.
    pub fn any_parked(&self) -> bool {
        self.core.borrow().any_parked()
    }

    /// Forgets a deleted topic: its parked consumers get nothing (answered 204).
    pub fn drop_incarnation(&self, incarnation: IncarnationId) {
        self.core.borrow_mut().drop_incarnation(incarnation);
    }

    /// Empties every FIFO (the node is stopping): parked consumers are answered at
    /// once.
    pub fn release_all(&self) {
        self.core.borrow_mut().release_all();
    }

    /// Forgets dead topic entries (nothing parked, no registration alive).
    pub fn sweep(&self, now_ms: u64) {
        self.core.borrow_mut().sweep(now_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future::{block_on, poll_once};

    /// Whether the pump was woken since it last looked (and clears it).
    fn woken(waiters: &Waiters) -> bool {
        block_on(poll_once(waiters.pump.wait())).is_some()
    }

    #[test]
    fn a_topic_kicked_while_it_is_pumped_wakes_the_pump_once_it_is_done() {
        let waiters = Waiters::default();
        let topic: Arc<str> = Arc::from("t");
        let id = IncarnationId(1);
        waiters.kick(id, &topic);
        assert!(woken(&waiters));
        assert_eq!(waiters.take_kicked().len(), 1);
        // Kicked again while its task runs: the pump wakes, finds nothing to
        // hand out, and is woken again when the task ends.
        waiters.kick(id, &topic);
        assert!(woken(&waiters));
        assert!(waiters.take_kicked().is_empty());
        assert!(!woken(&waiters));
        waiters.pumped(id);
        assert!(woken(&waiters), "the kick held back wakes the pump");
        assert_eq!(waiters.take_kicked().len(), 1);
        waiters.pumped(id);
        assert!(!woken(&waiters), "nothing held back: no wake");
    }

    /// Every promise's deadline kicks its topic, also one made while the
    /// timer for an earlier promise already ran: a promise nobody answers
    /// holds the consumers parked here back until its own deadline only.
    #[test]
    fn each_promise_deadline_kicks_the_topic_even_one_made_while_a_timer_runs() {
        narad_io::rt::run_local(None, async {
            let waiters = Rc::new(Waiters::default());
            let topic: Arc<str> = Arc::from("t");
            let id = IncarnationId(1);
            let kicked = |waiters: &Waiters| {
                let n = waiters.take_kicked().len();
                if n > 0 {
                    waiters.pumped(id);
                }
                n
            };
            let start = super::super::now_ms();
            waiters.kick_at_claim_deadline(id, &topic);
            narad_io::rt::sleep(Duration::from_millis(300)).await;
            // A second promise, 300 ms later, and a third that shares its kick.
            waiters.kick_at_claim_deadline(id, &topic);
            waiters.kick_at_claim_deadline(id, &topic);
            // Checks fall 150 ms or more from every deadline (501 and 801 ms).
            narad_io::rt::sleep(Duration::from_millis(50)).await;
            assert_eq!(kicked(&waiters), 0, "no deadline has passed");
            narad_io::rt::sleep(Duration::from_millis(300)).await;
            assert_eq!(kicked(&waiters), 1, "the first promise's deadline");
            narad_io::rt::sleep(Duration::from_millis(350)).await;
            assert_eq!(kicked(&waiters), 1, "the later promises' deadline");
            assert!(waiters.promised.borrow().is_empty(), "the timer ended");
            // A promise after the timer ended starts one again.
            waiters.kick_at_claim_deadline(id, &topic);
            narad_io::rt::sleep(Duration::from_millis(550)).await;
            assert_eq!(kicked(&waiters), 1);
            assert!(super::super::now_ms() - start >= 1_500);
        });
    }
}
