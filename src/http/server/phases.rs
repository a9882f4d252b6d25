//! A shard server's phase (serving, draining, closing) and the tasks waiting
//! for it to move: the accept loop and every connection.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::task::{Poll, Waker};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Phase {
    Serving,
    Draining,
    Closing,
}

/// A shard server's phase and the tasks waiting for it to move.
pub(super) struct Phases {
    now: Cell<Phase>,
    waiters: RefCell<HashMap<u64, Waker>>,
}

impl Default for Phases {
    fn default() -> Phases {
        Phases {
            now: Cell::new(Phase::Serving),
            waiters: RefCell::new(HashMap::new()),
        }
    }
}

impl Phases {
    /// Moves to `phase` and wakes every waiter (each looks again, and waits on
    /// for a later phase if it wants one).
    pub(super) fn broadcast(&self, phase: Phase) {
        assert!(phase > self.now.get(), "phases only move forward");
        self.now.set(phase);
        let waiters: Vec<Waker> = self.waiters.borrow_mut().drain().map(|(_, w)| w).collect();
        for waker in waiters {
            waker.wake();
        }
    }

    /// Resolves once the phase reaches `phase`; `id` names the waiter.
    pub(super) fn until(&self, id: u64, phase: Phase) -> impl Future<Output = ()> + '_ {
        // Polled on every wake of its connection: the map is touched only when
        // the waker changed or a phase change (which empties the map) came
        // since this waiter registered.
        let mut registered: Option<(Phase, Waker)> = None;
        poll_fn(move |cx| {
            let now = self.now.get();
            if now >= phase {
                return Poll::Ready(());
            }
            if let Some((at, waker)) = &registered {
                if *at == now && waker.will_wake(cx.waker()) {
                    return Poll::Pending;
                }
            }
            self.waiters.borrow_mut().insert(id, cx.waker().clone());
            registered = Some((now, cx.waker().clone()));
            Poll::Pending
        })
    }

    /// Drops the waker of `id`, whose wait ended or was given up.
    pub(super) fn forget(&self, id: u64) {
        self.waiters.borrow_mut().remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Context;

    struct Count(AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A waker that counts its wakes.
    fn counting_waker() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

    /// A waiter for a phase two steps on is woken by the first step, and must
    /// be woken again by the second: the first emptied the map it was in.
    #[test]
    fn a_waiter_for_a_later_phase_is_woken_by_each_step_until_it_arrives() {
        let (count, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        let phases = Phases::default();
        let mut closing = std::pin::pin!(phases.until(7, Phase::Closing));
        for _ in 0..3 {
            assert!(closing.as_mut().poll(&mut cx).is_pending());
        }
        phases.broadcast(Phase::Draining);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(closing.as_mut().poll(&mut cx).is_pending());
        phases.broadcast(Phase::Closing);
        assert_eq!(count.0.load(Ordering::SeqCst), 2, "woken for Closing too");
        assert!(closing.as_mut().poll(&mut cx).is_ready());
    }

    /// A waiter forgotten is not woken.
    #[test]
    fn a_forgotten_waiter_is_not_woken() {
        let (count, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        let phases = Phases::default();
        let mut draining = std::pin::pin!(phases.until(3, Phase::Draining));
        assert!(draining.as_mut().poll(&mut cx).is_pending());
        phases.forget(3);
        phases.broadcast(Phase::Draining);
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
    }
}
