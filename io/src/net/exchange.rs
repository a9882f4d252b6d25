//! Where a server connection's exchange stands between its requests, which
//! its stream reads to bound each wait for the peer (see [`ReadLimits`]).

use std::cell::Cell;
use std::time::{Duration, Instant};

/// Where a connection's exchange stands, as its server tells the stream: a
/// read waits within the limits of [`ReadLimits`] only between requests.
#[derive(Clone, Copy, Debug)]
pub enum Exchange {
    /// No request is being served; the last one was answered at `since` (or
    /// the connection was accepted then: `fresh`).
    Idle { since: Instant, fresh: bool },
    /// A request's head was read and it is being served: its body's reads,
    /// and the wait of a long-poll, are bounded by the handler, not here.
    Busy,
}

/// A connection's [`Exchange`], moved by its server and read by its stream.
pub struct ExchangeCell {
    now: Cell<Exchange>,
    /// Requests begun on the connection: an end of one that comes late (a
    /// body drained after its answer) must not end a later one.
    begun: Cell<u64>,
    /// A read that found nothing while the connection was busy: it has no
    /// deadline yet, and must be polled again once one starts (hyper does not
    /// read again on its own after a read found nothing).
    pub(super) parked_read: Cell<Option<std::task::Waker>>,
}

impl ExchangeCell {
    /// A connection just accepted.
    pub fn fresh() -> ExchangeCell {
        ExchangeCell {
            now: Cell::new(Exchange::Idle {
                since: Instant::now(),
                fresh: true,
            }),
            begun: Cell::new(0),
            parked_read: Cell::new(None),
        }
    }

    /// A request's head was read: it is being served. Returns its number,
    /// for [`ExchangeCell::answered_for`].
    pub fn busy(&self) -> u64 {
        self.now.set(Exchange::Busy);
        self.begun.set(self.begun.get() + 1);
        self.begun.get()
    }

    /// [`ExchangeCell::answered`], if request `request` (as [`ExchangeCell::busy`]
    /// numbered it) is still the connection's latest: a later one that began
    /// meanwhile is being served, and its end is its own.
    pub fn answered_for(&self, request: u64) {
        if self.begun.get() == request {
            self.answered();
        }
    }

    /// The request was answered: the wait for the next one starts.
    pub fn answered(&self) {
        self.now.set(Exchange::Idle {
            since: Instant::now(),
            fresh: false,
        });
        if let Some(waker) = self.parked_read.take() {
            waker.wake();
        }
    }

    pub fn get(&self) -> Exchange {
        self.now.get()
    }
}

impl std::fmt::Debug for ExchangeCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ExchangeCell")
            .field(&self.now.get())
            .finish()
    }
}

/// The bounds on a server connection's reads between requests: the next
/// request must begin within `idle` of the last answer, and its head must be
/// read within `head` of its first byte (of the accept, for the first
/// request). A read past either fails with `TimedOut`, which ends the
/// connection.
#[derive(Clone, Debug)]
pub struct ReadLimits {
    pub idle: Duration,
    pub head: Duration,
    pub exchange: std::rc::Rc<ExchangeCell>,
}
