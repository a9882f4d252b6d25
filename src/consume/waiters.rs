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
use std::collections::HashSet;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use narad_io::rt::Notify;
use narad_shards::consume::tokens::PromiseId;
use narad_shards::consume::waiters as core;
use narad_shards::ids::{IncarnationId, PartitionId};

pub use narad_shards::consume::waiters::{Kick, Notification, Renewal, SHARE_WINDOW};

use super::Delivered;

/// One parked consumer; it receives the records leased for it.
pub type Waiter = core::Waiter<Vec<Delivered>>;

/// After a failed read the topic's consumers are served again this much later
/// (a failed log is opened again after a second too), not at once.
pub const READ_RETRY_AFTER: Duration = Duration::from_secs(1);

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
    /// Topics whose promise deadline timer runs (see
    /// [`Waiters::kick_at_claim_deadlines`]).
    pub promised: RefCell<HashSet<IncarnationId>>,
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

    /// Serves the topic again at each deadline of its outstanding promises:
    /// the consumers parked here are held back from promised records until
    /// their claim, pass or deadline, and a promise whose notified shard never
    /// answers is retired by nothing but the clock. One timer task per topic,
    /// running while promises are outstanding; `next_deadline` answers the
    /// earliest deadline still ahead (the tokens keep the deadlines).
    pub fn kick_at_claim_deadlines(
        self: &Rc<Self>,
        incarnation: IncarnationId,
        topic: &Arc<str>,
        next_deadline: Box<dyn Fn(IncarnationId) -> Option<u64>>,
    ) {
        if !self.promised.borrow_mut().insert(incarnation) {
            return;
        }
        let (waiters, topic) = (self.clone(), topic.clone());
        narad_io::rt::spawn_local(async move {
            // Deadlines only grow (each is its promise's time plus one fixed
            // delay), so one made while this sleeps is found after it wakes.
            while let Some(due) = next_deadline(incarnation) {
                let wait = due.saturating_sub(super::now_ms()) + 1;
                narad_io::rt::sleep(Duration::from_millis(wait)).await;
                waiters.kick(incarnation, &topic);
            }
            waiters.promised.borrow_mut().remove(&incarnation);
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

    /// See [`core::Waiters::waiting_demand`].
    pub fn waiting_demand(
        &self,
        incarnation: IncarnationId,
        limit: u64,
        available_in: impl Fn(PartitionId) -> u64,
    ) -> u64 {
        self.core
            .borrow()
            .waiting_demand(incarnation, limit, available_in)
    }

    /// See [`core::Waiters::pinned_demand`].
    pub fn pinned_demand(
        &self,
        incarnation: IncarnationId,
        partition: PartitionId,
        available: u64,
    ) -> u64 {
        self.core
            .borrow()
            .pinned_demand(incarnation, partition, available)
    }

    /// See [`core::Waiters::any_parked_on`].
    pub fn any_parked_on(&self, incarnation: IncarnationId) -> bool {
        self.core.borrow().any_parked_on(incarnation)
    }

    /// Whether a live unpinned consumer is parked on the topic.
    pub fn has_parked(&self, incarnation: IncarnationId) -> bool {
        self.core.borrow().has_parked(incarnation)
    }

    /// See [`core::Waiters::is_waited_on`].
    pub fn is_waited_on(&self, incarnation: IncarnationId) -> bool {
        self.core.borrow().is_waited_on(incarnation)
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
        use narad_shards::consume::tokens::Tokens;

        narad_io::rt::run_local(None, async {
            let waiters = Rc::new(Waiters::default());
            let tokens = Rc::new(RefCell::new(Tokens::default()));
            let topic: Arc<str> = Arc::from("t");
            let id = IncarnationId(1);
            let kicked = |waiters: &Waiters| {
                let n = waiters.take_kicked().len();
                if n > 0 {
                    waiters.pumped(id);
                }
                n
            };
            // A promise to shard `to`, and the pump's call to the timer.
            let promise = |to: usize| {
                let now = super::super::now_ms();
                let mut t = tokens.borrow_mut();
                t.register(id, to, Duration::from_secs(5), now);
                let available = t.outstanding(id, now) + 1;
                assert_eq!(t.spend(id, available, now).len(), 1);
                drop(t);
                let tokens = tokens.clone();
                let next = move |id| tokens.borrow().next_deadline(id, super::super::now_ms());
                waiters.kick_at_claim_deadlines(id, &topic, Box::new(next));
            };
            let start = super::super::now_ms();
            promise(1);
            narad_io::rt::sleep(Duration::from_millis(300)).await;
            // Two more promises, 300 ms later, while the timer sleeps.
            promise(2);
            promise(3);
            // Checks fall 150 ms or more from every deadline (500 and 800 ms).
            narad_io::rt::sleep(Duration::from_millis(50)).await;
            assert_eq!(kicked(&waiters), 0, "no deadline has passed");
            narad_io::rt::sleep(Duration::from_millis(300)).await;
            assert_eq!(kicked(&waiters), 1, "the first promise's deadline");
            narad_io::rt::sleep(Duration::from_millis(350)).await;
            assert_eq!(kicked(&waiters), 1, "the later promises' deadline");
            assert!(waiters.promised.borrow().is_empty(), "the timer ended");
            // A promise after the timer ended starts one again.
            promise(4);
            narad_io::rt::sleep(Duration::from_millis(550)).await;
            assert_eq!(kicked(&waiters), 1);
            assert!(super::super::now_ms() - start >= 1_500);
        });
    }
}
