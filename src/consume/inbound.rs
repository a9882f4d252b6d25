//! Leased records on their way to a request that may be cancelled.
//!
//! A consume receives its records through a oneshot channel: from the pump, or
//! from another owner shard. A sender whose receiver is already gone sees its send
//! fail and releases the records itself. What is left is the instant in between:
//! the records were sent, and the request was cancelled before it looked. An
//! [`Inbound`] covers it: dropped with records waiting in it, it gives them back
//! to their owners at once instead of leaving them leased until their visibility
//! timeout.
//!
//! Which cores: the shard running the request.

use std::rc::Rc;
use std::sync::Arc;

use futures_channel::oneshot;
use narad_shards::ids::IncarnationId;

use super::Delivered;
use crate::broker::Shard;

/// The receiving end of a delivery, which releases what it holds when dropped
/// unread.
pub struct Inbound<T> {
    rx: Option<oneshot::Receiver<T>>,
    shard: Rc<Shard>,
    topic: Arc<str>,
    incarnation: IncarnationId,
    records: fn(T) -> Vec<Delivered>,
}

impl<T> Inbound<T> {
    pub fn new(
        rx: oneshot::Receiver<T>,
        shard: &Rc<Shard>,
        topic: &Arc<str>,
        incarnation: IncarnationId,
        records: fn(T) -> Vec<Delivered>,
    ) -> Self {
        Inbound {
            rx: Some(rx),
            shard: shard.clone(),
            topic: topic.clone(),
            incarnation,
            records,
        }
    }

    /// Waits for the value; `None` when the sender was dropped.
    pub async fn recv(&mut self) -> Option<T> {
        let rx = self.rx.as_mut().expect("an inbound is received once");
        let value = rx.await.ok();
        self.rx = None;
        value
    }

    /// The value if it was sent already; afterwards nothing is left to release.
    pub fn try_recv(&mut self) -> Option<T> {
        let rx = self.rx.as_mut()?;
        // Closed first: a send racing this either lands before the close, and is
        // taken here, or fails, and its sender releases what it held. Without the
        // close a value stored but not yet marked complete would be dropped with
        // the receiver while the sender believed it delivered.
        rx.close();
        let value = rx.try_recv().ok().flatten();
        self.rx = None;
        value
    }
}

impl<T> Drop for Inbound<T> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        // See `try_recv` for why it is closed first.
        rx.close();
        let Ok(Some(value)) = rx.try_recv() else {
            return;
        };
        let delivered = (self.records)(value);
        if delivered.is_empty() {
            return;
        }
        let (shard, topic, incarnation) =
            (self.shard.clone(), self.topic.clone(), self.incarnation);
        narad_io::rt::spawn_local(async move {
            shard.queues_release(incarnation, &topic, delivered).await;
        });
    }
}
