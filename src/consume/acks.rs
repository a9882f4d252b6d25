//! Acks, extends and nacks. A handle whose partition this shard owns is settled
//! on the spot ([`settle_here`]); one another shard owns goes there ([`settle_remote`]):
//! one mesh op each
//! while fewer than [`ACK_WINDOW`] are in flight to that owner; past it they
//! queue, and the queue leaves as one batch op (at most [`ACK_BATCH_MAX`]
//! records) the moment an op to that owner completes. So batches form only when
//! more acks to one owner overlap than the window holds, and an ack never waits
//! longer than the op ahead of it. Each record is answered on its own, exactly as
//! its single op would have been. A batch ack's handles for one owner go
//! together ([`send_many`]): up to [`ACK_BATCH_MAX`] records per op, each op one
//! slot of the window.
//!
//! Which cores: one [`AckLanes`] per shard, for the acks that shard's requests
//! send; the owner applies a batch record by record, in order.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_channel::oneshot;
use narad_shards::ids::{IncarnationId, Offset, PartitionId};

use super::handle::Handle;
use super::{Settle, SettleError};
use crate::broker::ops::Op;
use crate::broker::Shard;
use crate::meta::TopicRecord;

/// Ack ops in flight to one owner before further acks queue.
pub const ACK_WINDOW: usize = 128;

/// Records one batch op carries at most.
pub const ACK_BATCH_MAX: usize = 64;

/// How long an ack sent to its owner waits for the answer, queued or not: a
/// queued ack gives up no later than a single one would. One that gives up
/// while queued is never sent; one already sent may still land.
pub const FORWARD_BUDGET: Duration = Duration::from_secs(2);

/// What a settle hears from an owner shard that dropped it: it stopped.
fn stopped() -> SettleError {
    SettleError::Unavailable("the owner shard stopped".into())
}

/// The answer to a forwarded settle, or [`SettleError::NoAnswer`] once
/// `deadline` passed.
async fn answer_by(
    answer: oneshot::Receiver<Result<(), SettleError>>,
    deadline: Instant,
) -> Result<(), SettleError> {
    let answered = async { answer.await.unwrap_or_else(|_| Err(stopped())) };
    futures_lite::future::or(answered, async {
        narad_io::rt::sleep(deadline.saturating_duration_since(Instant::now())).await;
        Err(SettleError::NoAnswer)
    })
    .await
}

/// One ack, extend or nack on its way to its owner, with its own answer.
pub struct SettleItem {
    pub topic: Arc<str>,
    pub incarnation: IncarnationId,
    pub partition: PartitionId,
    pub offset: Offset,
    pub nonce: u64,
    pub settle: Settle,
    pub reply: oneshot::Sender<Result<(), SettleError>>,
}

#[derive(Default)]
struct Lane {
    in_flight: usize,
    queued: VecDeque<SettleItem>,
}

/// The ack lanes of one shard, one per owner shard.
pub struct AckLanes {
    lanes: RefCell<Vec<Lane>>,
}

impl AckLanes {
    pub fn new(shards: usize) -> Self {
        AckLanes {
            lanes: RefCell::new((0..shards).map(|_| Lane::default()).collect()),
        }
    }

    /// An ack for `owner`: `Some` to send now on its own (it counts as in
    /// flight), `None` when the window is full and it was queued.
    fn admit(&self, owner: usize, item: SettleItem) -> Option<SettleItem> {
        let mut lanes = self.lanes.borrow_mut();
        let lane = &mut lanes[owner];
        if lane.in_flight < ACK_WINDOW {
            lane.in_flight += 1;
            return Some(item);
        }
        lane.queued.push_back(item);
        None
    }

    /// Several acks for `owner` (at most [`ACK_BATCH_MAX`]): `Some` to send now
    /// as one op (one slot), `None` when the window is full and they were queued
    /// in order.
    fn admit_many(&self, owner: usize, items: Vec<SettleItem>) -> Option<Vec<SettleItem>> {
        assert!((1..=ACK_BATCH_MAX).contains(&items.len()));
        let mut lanes = self.lanes.borrow_mut();
        let lane = &mut lanes[owner];
        if lane.in_flight < ACK_WINDOW {
            lane.in_flight += 1;
            return Some(items);
        }
        lane.queued.extend(items);
        None
    }

    /// An op to `owner` completed: the next batch to send in its place (which
    /// keeps the slot), or `None` (the slot is freed).
    fn completed(&self, owner: usize) -> Option<Vec<SettleItem>> {
        let mut lanes = self.lanes.borrow_mut();
        let lane = &mut lanes[owner];
        assert!(
            lane.in_flight > 0,
            "an ack op completed that was not in flight"
        );
        // Records whose requester gave up are not sent.
        lane.queued.retain(|item| !item.reply.is_canceled());
        if lane.queued.is_empty() {
            lane.in_flight -= 1;
            return None;
        }
        let take = lane.queued.len().min(ACK_BATCH_MAX);
        Some(lane.queued.drain(..take).collect())
    }
}

/// Sends an ack to its owner through the shard's lane and waits for its answer.
pub async fn send(shard: &Rc<Shard>, owner: usize, item: SettleItem) -> Result<(), SettleError> {
    let deadline = Instant::now() + FORWARD_BUDGET;
    let (reply, answer) = oneshot::channel();
    let item = SettleItem { reply, ..item };
    if let Some(item) = shard.acks.admit(owner, item) {
        narad_io::rt::spawn_local(run_lane(shard.clone(), owner, vec![item]));
    }
    answer_by(answer, deadline).await
}

/// Sends acks for one owner, in order, as ops of up to [`ACK_BATCH_MAX`]
/// records, and waits for every answer; the answers come in the items' order.
pub async fn send_many(
    shard: &Rc<Shard>,
    owner: usize,
    items: Vec<SettleItem>,
) -> Vec<Result<(), SettleError>> {
    let deadline = Instant::now() + FORWARD_BUDGET;
    let mut answers = Vec::with_capacity(items.len());
    let mut chunk = Vec::with_capacity(items.len().min(ACK_BATCH_MAX));
    let mut items = items.into_iter().peekable();
    while let Some(item) = items.next() {
        let (reply, answer) = oneshot::channel();
        chunk.push(SettleItem { reply, ..item });
        answers.push(answer);
        if chunk.len() == ACK_BATCH_MAX || items.peek().is_none() {
            let full = std::mem::replace(&mut chunk, Vec::with_capacity(ACK_BATCH_MAX));
            if let Some(full) = shard.acks.admit_many(owner, full) {
                narad_io::rt::spawn_local(run_lane(shard.clone(), owner, full));
            }
        }
    }
    answers_by(answers, deadline).await
}

/// [`answer_by`] for several answers under one deadline, and one timer.
async fn answers_by(
    mut answers: Vec<oneshot::Receiver<Result<(), SettleError>>>,
    deadline: Instant,
) -> Vec<Result<(), SettleError>> {
    let mut outcomes = vec![None; answers.len()];
    let gather = async {
        for (outcome, answer) in outcomes.iter_mut().zip(&mut answers) {
            *outcome = Some(answer.await.unwrap_or_else(|_| Err(stopped())));
        }
    };
    futures_lite::future::or(gather, async {
        narad_io::rt::sleep(deadline.saturating_duration_since(Instant::now())).await;
    })
    .await;
    // Answers that came in while an earlier one was awaited count too.
    outcomes
        .into_iter()
        .zip(&mut answers)
        .map(|(outcome, answer)| match outcome {
            Some(outcome) => outcome,
            None => match answer.try_recv() {
                Ok(Some(outcome)) => outcome,
                Ok(None) => Err(SettleError::NoAnswer),
                Err(_) => Err(stopped()),
            },
        })
        .collect()
}

/// Holds one slot of the lane to `owner`: sends `first`, then whatever queued
/// behind it, until nothing is queued.
async fn run_lane(shard: Rc<Shard>, owner: usize, first: Vec<SettleItem>) {
    let mut next = Some(first);
    while let Some(items) = next {
        let (done, finished) = oneshot::channel();
        shard.send(owner, Op::SettleBatch { items, done }).await;
        // A stopped owner drops the op, and with it every record's answer.
        let _ = finished.await;
        next = shard.acks.completed(owner);
    }
}

/// Acks, extends or nacks the lease a receipt handle names.
pub async fn settle(
    shard: &Rc<Shard>,
    topic: &Arc<str>,
    record: &TopicRecord,
    handle: Handle,
    settle: Settle,
) -> Result<(), SettleError> {
    match settle_here(shard, record, handle, settle) {
        Some(outcome) => outcome,
        None => settle_remote(shard, topic, record, handle, settle).await,
    }
}

/// Settles `handle` on the spot when this shard owns its partition (or the
/// handle names no partition of the topic); `None` when another shard owns it.
pub fn settle_here(
    shard: &Rc<Shard>,
    record: &TopicRecord,
    handle: Handle,
    settle: Settle,
) -> Option<Result<(), SettleError>> {
    if handle.partition.0 >= record.partitions {
        return Some(Err(SettleError::Stale));
    }
    if shard.owner_of(record.id, handle.partition) != shard.index {
        return None;
    }
    Some(
        shard
            .queues
            .settle(
                record,
                handle.partition,
                handle.offset,
                handle.nonce,
                settle,
            )
            .map_err(|_| SettleError::Stale),
    )
}

/// Settles `handle` on the shard that owns its partition, over the mesh.
pub async fn settle_remote(
    shard: &Rc<Shard>,
    topic: &Arc<str>,
    record: &TopicRecord,
    handle: Handle,
    settle: Settle,
) -> Result<(), SettleError> {
    let owner = shard.owner_of(record.id, handle.partition);
    let item = settle_item(topic, record, handle, settle);
    send(shard, owner, item).await
}

/// The op record that settles `handle` at its owner; its reply channel is a
/// placeholder the ack lane replaces.
pub fn settle_item(
    topic: &Arc<str>,
    record: &TopicRecord,
    handle: Handle,
    settle: Settle,
) -> SettleItem {
    let (reply, _) = futures_channel::oneshot::channel();
    SettleItem {
        topic: topic.clone(),
        incarnation: record.id,
        partition: handle.partition,
        offset: handle.offset,
        nonce: handle.nonce,
        settle,
        reply,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item() -> (SettleItem, oneshot::Receiver<Result<(), SettleError>>) {
        let (reply, answer) = oneshot::channel();
        let item = SettleItem {
            topic: Arc::from("t"),
            incarnation: IncarnationId(1),
            partition: PartitionId(0),
            offset: Offset(0),
            nonce: 1,
            settle: Settle::Ack,
            reply,
        };
        (item, answer)
    }

    /// A forwarded settle waits for its owner until the deadline and no
    /// longer (502 to the client); a stopped owner is told apart (503).
    #[test]
    fn a_forward_unanswered_by_its_deadline_is_no_answer() {
        narad_io::rt::run_local(None, async {
            let (reply, answer) = oneshot::channel();
            let started = Instant::now();
            let silent = answer_by(answer, started + Duration::from_millis(30)).await;
            assert_eq!(silent, Err(SettleError::NoAnswer));
            assert!(started.elapsed() >= Duration::from_millis(30));
            drop(reply);
            let (reply, answer) = oneshot::channel();
            reply.send(Ok(())).unwrap();
            let deadline = Instant::now() + Duration::from_secs(5);
            assert_eq!(answer_by(answer, deadline).await, Ok(()));
            let (reply, answer) = oneshot::channel();
            drop(reply);
            let stopped = answer_by(answer, deadline).await;
            assert!(
                matches!(stopped, Err(SettleError::Unavailable(_))),
                "{stopped:?}"
            );
        });
    }

    /// A batch's answers share one deadline: those in by then are kept (in
    /// order), the rest are no answer, and a dropped one is a stopped owner.
    #[test]
    fn a_batchs_answers_share_one_deadline() {
        narad_io::rt::run_local(None, async {
            let channels: Vec<_> = (0..4).map(|_| oneshot::channel()).collect();
            let (replies, answers): (Vec<_>, Vec<_>) = channels.into_iter().unzip();
            let mut replies = replies.into_iter();
            let (first, silent, dropped, last) = (
                replies.next().unwrap(),
                replies.next().unwrap(),
                replies.next().unwrap(),
                replies.next().unwrap(),
            );
            first.send(Err(SettleError::Stale)).unwrap();
            drop(dropped);
            last.send(Ok(())).unwrap();
            let outcomes = answers_by(answers, Instant::now() + Duration::from_millis(30)).await;
            assert_eq!(outcomes[0], Err(SettleError::Stale));
            assert_eq!(outcomes[1], Err(SettleError::NoAnswer));
            assert!(matches!(outcomes[2], Err(SettleError::Unavailable(_))));
            assert_eq!(outcomes[3], Ok(()), "answered behind the silent one");
            drop(silent);
        });
    }

    #[test]
    fn acks_go_alone_until_the_window_is_full_then_leave_in_batches() {
        let lanes = AckLanes::new(2);
        let mut answers = Vec::new();
        for _ in 0..ACK_WINDOW {
            let (i, a) = item();
            assert!(lanes.admit(1, i).is_some());
            answers.push(a);
        }
        // Another owner has its own window.
        assert!(lanes.admit(0, item().0).is_some());
        for _ in 0..ACK_BATCH_MAX + 10 {
            let (i, a) = item();
            assert!(lanes.admit(1, i).is_none(), "the window is full");
            answers.push(a);
        }
        // A freed slot carries the queue: a full batch, then the rest.
        assert_eq!(lanes.completed(1).map(|b| b.len()), Some(ACK_BATCH_MAX));
        assert_eq!(lanes.completed(1).map(|b| b.len()), Some(10));
        assert!(lanes.completed(1).is_none());
        assert_eq!(lanes.lanes.borrow()[1].in_flight, ACK_WINDOW - 1);
        // A queued ack whose requester gave up is not sent.
        assert!(lanes.admit(1, item().0).is_some());
        let (i, a) = item();
        assert!(lanes.admit(1, i).is_none());
        drop(a);
        assert!(lanes.completed(1).is_none());
    }

    #[test]
    fn a_batch_for_one_owner_takes_one_slot_or_queues_in_order() {
        let lanes = AckLanes::new(2);
        let batch = |n: u64| -> Vec<SettleItem> {
            (0..n)
                .map(|offset| SettleItem {
                    offset: Offset(offset),
                    ..item().0
                })
                .collect()
        };
        let sent = lanes.admit_many(1, batch(ACK_BATCH_MAX as u64)).unwrap();
        assert_eq!(sent.len(), ACK_BATCH_MAX);
        assert_eq!(lanes.lanes.borrow()[1].in_flight, 1);
        for _ in 1..ACK_WINDOW {
            assert!(lanes.admit(1, item().0).is_some());
        }
        // The window is full: the records queue, in order, behind single acks.
        let (single, _answer) = item();
        assert!(lanes.admit(1, single).is_none());
        assert!(lanes.admit_many(1, batch(3)).is_none());
        let queued: Vec<u64> = lanes.lanes.borrow()[1]
            .queued
            .iter()
            .map(|i| i.offset.0)
            .collect();
        assert_eq!(queued, vec![0, 0, 1, 2]);
    }
}
