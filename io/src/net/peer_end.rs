//! Whether a connection's client has stopped sending: its end of the stream
//! came (it closed, or shut its writing side), or the connection failed.
//!
//! The server keeps a connection open for writing after its client's end, so
//! that a client which sends its request and then shuts its writing side still
//! reads the answer. A handler that would wait for long (a long-poll) watches
//! this instead, and stops waiting once it comes: the client may be gone, and a
//! record handed to it then would stay leased to no one.
//!
//! Set from the socket's readiness (the edge that brings the peer's end, or a
//! failure, whether or not anyone reads then: the server does not read past a
//! request while it answers it) and from a read that finds the end.
//!
//! Shared with the request's handler through the request's extensions, which
//! require `Send + Sync`; both sides run on the connection's shard, so the lock
//! is never contended.

use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

/// See the module documentation. Clones watch the same connection.
#[derive(Clone, Debug, Default)]
pub struct PeerEnd(Arc<State>);

#[derive(Debug, Default)]
struct State {
    ended: AtomicBool,
    waiting: Mutex<Option<Waker>>,
}

impl PeerEnd {
    /// Whether the client's end has come.
    pub fn has_ended(&self) -> bool {
        self.0.ended.load(Ordering::Acquire)
    }

    /// Returns once the client's end has come.
    pub async fn ended(&self) {
        poll_fn(|cx| {
            if self.has_ended() {
                return Poll::Ready(());
            }
            let mut waiting = self.0.waiting.lock().unwrap_or_else(|e| e.into_inner());
            *waiting = Some(cx.waker().clone());
            drop(waiting);
            // Set between the check and the park: its wake found no one.
            if self.has_ended() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }

    /// Records the client's end and wakes whoever waits for it.
    pub(crate) fn set(&self) {
        if self.0.ended.swap(true, Ordering::AcqRel) {
            return;
        }
        let waiting = self
            .0
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(waker) = waiting {
            waker.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_is_woken_by_the_end_and_a_late_one_returns_at_once() {
        crate::rt::run_local(None, async {
            let end = PeerEnd::default();
            assert!(!end.has_ended());
            let waiter = crate::rt::spawn_local({
                let end = end.clone();
                async move { end.ended().await }
            });
            crate::sim::yield_once().await;
            end.set();
            waiter.await;
            assert!(end.has_ended());
            end.ended().await;
            end.set();
        });
    }
}
