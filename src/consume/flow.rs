//! The request flows and tasks of consumption on one shard.
//!
//! A queue consume ([`consume`]) tries, in order: this shard's partitions of the
//! topic (0 hops); a non-blocking probe of each other owner shard (1 hop); then,
//! if it may wait, it parks on this shard's FIFO and registers a delivery token
//! with every other owner. An owner whose records nobody on it takes spends one
//! token per record and notifies; the notified shard's pump ([`run_pump`]) takes
//! the head consumer and claims the record for it ([`claim`]) (2 hops).
//!
//! A pinned consume (`partition=N`) goes to that partition's owner and parks
//! there, on the partition's own FIFO.
//!
//! Which cores: every shard runs one pump task and, while consumers are parked on
//! it, one keeper task; the flows run in the tasks of the requests.

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use narad_shards::consume::tokens::PromiseId;
use narad_shards::consume::waiters;
use narad_shards::ids::{IncarnationId, PartitionId};

use super::inbound::Inbound;
use super::waiters::{Kick, Notification, Renewal, Waiter, SHARE_WINDOW};
use super::{now_ms, ConsumeError, Delivered, TAKE_BYTES_MAX};
use crate::broker::ops::Op;
use crate::broker::Shard;
use crate::meta::TopicRecord;

/// How often the keeper checks this shard's registrations.
const KEEPER_INTERVAL: Duration = Duration::from_millis(500);

/// Cadence of the background expiry purge.
const PURGE_INTERVAL: Duration = Duration::from_secs(1);

/// A registration is sent again after this long, whatever its expiry.
const RENEW_AFTER: Duration = Duration::from_secs(5);

/// How long a probe or a claim waits for the owner shard's answer, and how
/// much longer than its wait a pinned consume waits for it: an owner whose
/// partition read stalls (a hung disk) must not hold the topic's consumers on
/// every shard. Records an owner sends after the wait ended go back at once
/// (see [`Inbound`]).
const OWNER_ANSWER_WAIT: Duration = Duration::from_secs(2);

/// What one consume asks for.
#[derive(Clone, Copy, Debug)]
pub struct ConsumeRequest {
    pub partition: Option<PartitionId>,
    pub max: usize,
    pub wait: Duration,
}

/// Serves one leased consume accepted on this shard.
pub async fn consume(
    shard: &Rc<Shard>,
    topic: &Arc<str>,
    record: &TopicRecord,
    request: ConsumeRequest,
) -> Result<Vec<Delivered>, ConsumeError> {
    let Some(partition) = request.partition else {
        return consume_queue(shard, topic, record, request).await;
    };
    let owner = shard.owner_of(record.id, partition);
    if owner == shard.index {
        return consume_pinned_here(shard, topic, record, partition, request).await;
    }
    let op = |reply| Op::Consume {
        topic: topic.clone(),
        incarnation: record.id,
        partition: Some(partition),
        max: request.max,
        claim: None,
        wait: request.wait,
        reply,
    };
    let (reply, answer) = futures_channel::oneshot::channel();
    shard.send(owner, op(reply)).await;
    let mut answer = Inbound::new(answer, shard, topic, record.id, |r| r.unwrap_or_default());
    within(request.wait + OWNER_ANSWER_WAIT, async {
        answer
            .recv()
            .await
            .unwrap_or_else(|| Err(ConsumeError::Unavailable("the owner shard stopped".into())))
    })
    .await
}

/// How many of `max` records a consumer arriving now may take from the
/// shard's partitions `local`: those the consumers waiting before it (parked
/// here, or holding tokens or promises from other shards) leave
/// ([`super::queues::Queues::newcomer_share`]). Nothing to count when nobody
/// waits; else the partitions are loaded first, so that each counts.
///
/// The count is the shard's, so the consumers pinned to one partition are
/// also kept their records: one pinned to it (`pinned`) takes only what they
/// leave of that partition, and an unpinned one takes from their partitions
/// last (`local` is reordered), after the other partitions ran dry.
async fn newcomer_share(
    shard: &Rc<Shard>,
    topic: &Arc<str>,
    record: &TopicRecord,
    local: &mut [PartitionId],
    pinned: Option<PartitionId>,
    max: usize,
) -> Option<usize> {
    let (queues, waiters) = (&shard.queues, &shard.waiters);
    if !queues.holds_for_others(record.id) && !waiters.any_parked_on(record.id) {
        return Some(max);
    }
    queues.load_all(topic, record, local).await;
    let share = queues.newcomer_share(record, local, max, |left, in_one| {
        waiters.waiting_demand(record.id, left, in_one)
    })?;
    waiters::leave_to_pinned(share, pinned, local, shard.next_turn(), |p| {
        let available = queues.available(record, &[p]);
        (available, waiters.pinned_demand(record.id, p, available))
    })
}

/// `answer`, or a failure once `limit` has passed without it.
async fn within<T>(
    limit: Duration,
    answer: impl std::future::Future<Output = Result<T, ConsumeError>>,
) -> Result<T, ConsumeError> {
    futures_lite::future::or(answer, async {
        narad_io::rt::sleep(limit).await;
        Err(ConsumeError::NoAnswer(format!(
            "the owner shard did not answer within {limit:?}"
        )))
    })
    .await
}

async fn consume_queue(
    shard: &Rc<Shard>,
    topic: &Arc<str>,
    record: &TopicRecord,
    request: ConsumeRequest,
) -> Result<Vec<Delivered>, ConsumeError> {
    let deadline = Instant::now() + request.wait;
    let deadline_ms = now_ms().saturating_add(request.wait.as_millis() as u64);
    let mut local = shard.local_partitions(record);
    // A consumer that arrives now takes only what those waiting before it
    // (here or on other shards) leave.
    let share = newcomer_share(shard, topic, record, &mut local, None, request.max).await;
    // A local partition that cannot be read (a failing disk, say) does not
    // fail a consume the topic's other shards can serve: it answers 500 only
    // if nothing else has a record for it now and it will not wait.
    let mut local_failure = None;
    if let (false, Some(max)) = (local.is_empty(), share) {
        match shard
            .queues
            .take(topic, record, &local, max, TAKE_BYTES_MAX)
            .await
        {
            Ok(got) if !got.is_empty() => return Ok(got),
            Ok(_) => {}
            Err(ConsumeError::NotFound) => return Err(ConsumeError::NotFound),
            Err(e) => {
                tracing::warn!(topic = %topic, error = ?e, "this shard's partitions could not be read; asking the topic's other shards");
                local_failure = Some(e);
            }
        }
    }
    let remote = shard.remote_owners(record);
    for &owner in &remote {
        match probe(shard, owner, topic, record.id, request.max, None).await {
            Ok(got) if !got.is_empty() => return Ok(got),
            Ok(_) => {}
            Err(ConsumeError::NotFound) => return Err(ConsumeError::NotFound),
            Err(e) => {
                tracing::warn!(topic = %topic, owner, error = ?e, "probe of an owner shard failed")
            }
        }
    }
    if request.wait.is_zero() || shard.stopping.get() {
        return match local_failure {
            Some(e) => Err(e),
            None => Ok(Vec::new()),
        };
    }
    let (waiter, answer) = Waiter::new_at(request.max, now_ms(), deadline_ms);
    // Guarded from the moment it is parked: the pump may hand it records while
    // the registrations below wait for room on the mesh, and a request dropped
    // then must release them, not take them away until their leases lapse.
    let answer = Inbound::new(answer, shard, topic, record.id, |v| v);
    shard.waiters.park(record.id, topic, None, waiter.clone());
    let now = now_ms();
    let mut unsent = Unsent {
        shard,
        incarnation: record.id,
        owners: shard
            .waiters
            .registrations_needed(record.id, topic, &remote, deadline_ms, now),
    };
    while let Some(&owner) = unsent.owners.last() {
        let ttl = Duration::from_millis(deadline_ms.saturating_sub(now)) + SHARE_WINDOW;
        register(shard, owner, topic, record.id, ttl).await;
        unsent.owners.pop();
    }
    ensure_keeper(shard);
    Ok(wait_for(&waiter, answer, deadline).await)
}

/// Registrations marked as sent and not sent yet: if the consume is dropped
/// while a send waits for room on the mesh, the marks are taken back, so other
/// consumers do not share tokens the owners never received.
struct Unsent<'a> {
    shard: &'a Shard,
    incarnation: IncarnationId,
    owners: Vec<usize>,
}

impl Drop for Unsent<'_> {
    fn drop(&mut self) {
        for &owner in &self.owners {
            self.shard
                .waiters
                .registration_unsent(self.incarnation, owner);
        }
    }
}

/// A pinned consume of a partition this shard owns.
async fn consume_pinned_here(
    shard: &Rc<Shard>,
    topic: &Arc<str>,
    record: &TopicRecord,
    partition: PartitionId,
    request: ConsumeRequest,
) -> Result<Vec<Delivered>, ConsumeError> {
    let deadline = Instant::now() + request.wait;
    let deadline_ms = now_ms().saturating_add(request.wait.as_millis() as u64);
    // What those waiting before it leave (the promises and tokens are the
    // topic's, counted over the shard).
    let mut local = shard.local_partitions(record);
    let share = newcomer_share(
        shard,
        topic,
        record,
        &mut local,
        Some(partition),
        request.max,
    );
    let got = match share.await {
        Some(max) => {
            shard
                .queues
                .take(topic, record, &[partition], max, TAKE_BYTES_MAX)
                .await?
        }
        None => Vec::new(),
    };
    if !got.is_empty() || request.wait.is_zero() || shard.stopping.get() {
        return Ok(got);
    }
    let (waiter, answer) = Waiter::new_at(request.max, now_ms(), deadline_ms);
    shard
        .waiters
        .park(record.id, topic, Some(partition), waiter.clone());
    Ok(wait_for(
        &waiter,
        Inbound::new(answer, shard, topic, record.id, |v| v),
        deadline,
    )
    .await)
}

/// Waits for the pump to deliver, until `deadline`.
async fn wait_for(
    waiter: &Waiter,
    mut answer: Inbound<Vec<Delivered>>,
    deadline: Instant,
) -> Vec<Delivered> {
    let delivered = futures_lite::future::or(async { Some(answer.recv().await) }, async {
        glommio::timer::sleep(deadline.saturating_duration_since(Instant::now())).await;
        None
    })
    .await;
    match delivered {
        Some(records) => records.unwrap_or_default(),
        None => {
            waiter.close();
            // The pump may have sent in the same instant the deadline passed.
            answer.try_recv().unwrap_or_default()
        }
    }
}

/// Asks another owner shard for records without waiting.
async fn probe(
    shard: &Rc<Shard>,
    owner: usize,
    topic: &Arc<str>,
    incarnation: IncarnationId,
    max: usize,
    claim: Option<(usize, PromiseId)>,
) -> Result<Vec<Delivered>, ConsumeError> {
    let op = |reply| Op::Consume {
        topic: topic.clone(),
        incarnation,
        partition: None,
        max,
        claim,
        wait: Duration::ZERO,
        reply,
    };
    let (reply, answer) = futures_channel::oneshot::channel();
    shard.send(owner, op(reply)).await;
    let mut answer = Inbound::new(answer, shard, topic, incarnation, |r| r.unwrap_or_default());
    within(OWNER_ANSWER_WAIT, async {
        answer
            .recv()
            .await
            .unwrap_or_else(|| Err(ConsumeError::Unavailable("the owner shard stopped".into())))
    })
    .await
}

async fn register(
    shard: &Rc<Shard>,
    owner: usize,
    topic: &Arc<str>,
    incarnation: IncarnationId,
    ttl: Duration,
) {
    let op = Op::Register {
        topic: topic.clone(),
        incarnation,
        from: shard.index,
        ttl,
    };
    shard.send(owner, op).await;
}

/// The owner side of [`Op::Consume`]: serves from this shard's partitions and
/// releases what nobody receives.
pub async fn serve_consume_op(
    shard: Rc<Shard>,
    topic: Arc<str>,
    incarnation: IncarnationId,
    partition: Option<PartitionId>,
    request: ConsumeRequest,
    claim: Option<(usize, PromiseId)>,
    mut reply: futures_channel::oneshot::Sender<Result<Vec<Delivered>, ConsumeError>>,
) {
    if let Some((from, promise)) = claim {
        shard.queues.retire_notification(incarnation, from, promise);
    }
    let Some(record) = shard.live_topic(&topic, incarnation) else {
        let _ = reply.send(Err(ConsumeError::NotFound));
        return;
    };
    let result = match partition {
        Some(p) => {
            // A forwarded long-poll whose requester went away (its client
            // disconnected) stops waiting here too, rather than holding a place
            // in the partition's FIFO for the rest of its wait.
            let consume =
                async { Some(consume_pinned_here(&shard, &topic, &record, p, request).await) };
            let gone = async {
                reply.cancellation().await;
                None
            };
            match futures_lite::future::or(consume, gone).await {
                Some(result) => result,
                None => return,
            }
        }
        None => {
            // A claim takes its own record (its promise retired above) and
            // what is not promised to other claims; a plain probe, a consumer
            // arriving on another shard, only what those waiting before it
            // leave.
            let mut local = shard.local_partitions(&record);
            let share = match claim {
                Some(_) => shard.queues.own_share(&record, &local, request.max),
                None => {
                    newcomer_share(&shard, &topic, &record, &mut local, None, request.max).await
                }
            };
            match share {
                Some(max) => {
                    shard
                        .queues
                        .take(&topic, &record, &local, max, TAKE_BYTES_MAX)
                        .await
                }
                None => Ok(Vec::new()),
            }
        }
    };
    if let Err(Ok(unreceived)) = reply.send(result) {
        shard
            .queues
            .release_delivered(incarnation, &topic, &unreceived);
    }
    // Consumers parked here were held back from the record this claim took:
    // what is left is theirs now.
    if claim.is_some() {
        shard.waiters.kick(incarnation, &topic);
    }
}

/// The shard's pump: serves parked consumers when records arrive or consumers
/// park, and claims what other owners notify. Ends when the node stops.
pub async fn run_pump(shard: Rc<Shard>) {
    loop {
        shard.waiters.pump.wait().await;
        if shard.stopping.get() {
            shard.waiters.release_all();
            return;
        }
        for notification in shard.waiters.take_notifications() {
            narad_io::rt::spawn_local(claim(shard.clone(), notification));
        }
        // Each topic in a task of its own, so a topic whose read stalls holds up
        // only its own consumers; a kick that arrives while a topic is pumped is
        // kept until that task ends, so no wake is lost.
        for kick in shard.waiters.take_kicked() {
            narad_io::rt::spawn_local(pump_topic_task(shard.clone(), kick));
        }
    }
}

/// Pumps one topic, then reports it pumped however the pumping ended (a panic
/// included), so the topic's next kick is served.
async fn pump_topic_task(shard: Rc<Shard>, kick: Kick) {
    struct Pumping {
        shard: Rc<Shard>,
        incarnation: IncarnationId,
    }
    impl Drop for Pumping {
        fn drop(&mut self) {
            self.shard.waiters.pumped(self.incarnation);
            // The pump answered the parked consumers when the node began to
            // stop; one this task put back on its FIFO since is answered now.
            if self.shard.stopping.get() {
                self.shard.waiters.release_all();
            }
        }
    }
    let _pumping = Pumping {
        shard: shard.clone(),
        incarnation: kick.incarnation,
    };
    pump_topic(&shard, kick).await;
}

async fn pump_topic(shard: &Rc<Shard>, kick: Kick) {
    let Kick { incarnation, topic } = kick;
    let Some(record) = shard.live_topic(&topic, incarnation) else {
        shard.waiters.drop_incarnation(incarnation);
        return;
    };
    let local = shard.local_partitions(&record);
    // Pinned consumers first: they can take only from their own partition.
    for p in shard.waiters.pinned_partitions(incarnation) {
        if local.contains(&p) {
            serve_fifo(shard, &topic, &record, Some(p), &local).await;
        }
    }
    if local.is_empty() {
        return;
    }
    // Tokens and this shard's own consumers take turns by arrival: the tokens
    // other shards registered before the longest-parked consumer here arrived
    // are spent first (all of them when nobody is parked here), one record
    // each; the consumers here then take what is not promised.
    if shard.queues.has_tokens(incarnation) {
        let before = shard.waiters.head_parked_ms(incarnation);
        spend_tokens(shard, &topic, &record, &local, before.unwrap_or(u64::MAX)).await;
    }
    serve_fifo(shard, &topic, &record, None, &local).await;
    if !shard.waiters.has_parked(incarnation) && shard.queues.has_tokens(incarnation) {
        spend_tokens(shard, &topic, &record, &local, u64::MAX).await;
    }
}

/// Spends the topic's tokens registered before `before_ms` on the records
/// available here, one `Op::Notify` each, and serves the topic again once
/// the promises lapse.
async fn spend_tokens(
    shard: &Rc<Shard>,
    topic: &Arc<str>,
    record: &TopicRecord,
    local: &[PartitionId],
    before_ms: u64,
) {
    shard.queues.load_all(topic, record, local).await;
    let notify = shard.queues.spend_tokens(record, local, before_ms);
    if !notify.is_empty() {
        let queues = Rc::downgrade(&shard.queues);
        let next = move |id| queues.upgrade().and_then(|q| q.next_promise_deadline(id));
        shard
            .waiters
            .kick_at_claim_deadlines(record.id, topic, Box::new(next));
    }
    for (to, promise) in notify {
        let op = Op::Notify {
            topic: topic.clone(),
            incarnation: record.id,
            owner: shard.index,
            promise,
        };
        shard.send(to, op).await;
    }
}

/// Hands records to the FIFO's consumers, head first, until one finds
/// nothing. A FIFO, a partition's too, takes only records not promised to
/// another shard's claim; the claim, its pass, or the promise's deadline
/// serves it again. `local` is the topic's partitions on this shard; the
/// FIFO of `pinned` takes from that partition only.
async fn serve_fifo(
    shard: &Rc<Shard>,
    topic: &Arc<str>,
    record: &TopicRecord,
    pinned: Option<PartitionId>,
    local: &[PartitionId],
) {
    let one;
    let partitions = match pinned {
        Some(p) => {
            one = [p];
            &one[..]
        }
        None => local,
    };
    loop {
        // Promises are the topic's, not a partition's: a pinned consumer may
        // take from its partition what leaves enough on the shard for them.
        let share = shard.queues.own_share(record, local, usize::MAX);
        let Some(share) = share else {
            return;
        };
        let Some(waiter) = shard.waiters.pop_live(record.id, pinned) else {
            return;
        };
        let max = waiter.max.min(share);
        let taken = shard
            .queues
            .take(topic, record, partitions, max, TAKE_BYTES_MAX)
            .await;
        match taken {
            Ok(got) if !got.is_empty() => {
                if let Err(back) = waiter.deliver(got) {
                    shard.queues.release_delivered(record.id, topic, &back);
                }
            }
            Ok(_) => {
                shard.waiters.push_front(record.id, topic, pinned, waiter);
                // The keeper may have stopped while this consumer was off the
                // FIFO, finding nobody parked: its tokens elsewhere need it.
                ensure_keeper(shard);
                return;
            }
            // The topic was deleted while this consumer was off the FIFO, so
            // the delete could not close it: answer it now, not at its deadline.
            Err(ConsumeError::NotFound) => {
                waiter.close();
                return;
            }
            Err(e) => {
                tracing::warn!(topic = %topic, error = ?e, "the pump could not take records");
                shard.waiters.push_front(record.id, topic, pinned, waiter);
                ensure_keeper(shard);
                shard.waiters.kick_later(record.id, topic);
                return;
            }
        }
    }
}

/// An owner notified this shard: claim the record for the head consumer.
async fn claim(shard: Rc<Shard>, n: Notification) {
    let Notification {
        incarnation,
        topic,
        owner,
        promise,
    } = n;
    let Some(waiter) = shard.waiters.pop_live(incarnation, None) else {
        let from = shard.index;
        let op = Op::Pass {
            topic,
            incarnation,
            from,
            promise,
        };
        shard.send(owner, op).await;
        return;
    };
    let claimed = probe(
        &shard,
        owner,
        &topic,
        incarnation,
        waiter.max,
        Some((shard.index, promise)),
    )
    .await;
    // A claim that failed on the owner (its partition could not be read) leaves
    // the renewal to the keeper: renewing at once would draw the same
    // notification straight back and spin both shards while the fault lasts.
    let failed = claimed.is_err();
    match claimed {
        Ok(got) if !got.is_empty() => {
            let mut next = Some(waiter);
            let unclaimed = waiters::hand_out(got, || {
                next.take()
                    .or_else(|| shard.waiters.pop_live(incarnation, None))
            });
            if !unclaimed.is_empty() {
                let op = Op::Release {
                    topic: topic.clone(),
                    incarnation,
                    delivered: unclaimed,
                };
                shard.send(owner, op).await;
            }
        }
        // The node stops: the pump has answered the parked consumers already, so
        // this one is answered now rather than parked again for its whole wait.
        _ if shard.stopping.get() => waiter.close(),
        _ => {
            shard.waiters.push_front(incarnation, &topic, None, waiter);
            // A record of this shard's own partitions may have arrived while this
            // consumer was off the FIFO: the pump found nobody to give it to.
            shard.waiters.kick(incarnation, &topic);
            // The keeper may have stopped while this consumer was off the FIFO.
            ensure_keeper(&shard);
        }
    }
    // The notification spent this shard's token there: leave a fresh one at once
    // if anyone is still parked, so the next record finds it; and with every
    // other owner whose token is spent too (one this shard passed on while
    // this consumer was off the FIFO), rather than wait for the keeper.
    if !failed {
        renew_registrations(&shard, incarnation).await;
    }
}

/// Registers again, at once, with each owner of the topic's partitions whose
/// token from this shard is spent or about to lapse, if anyone is parked here.
async fn renew_registrations(shard: &Rc<Shard>, incarnation: IncarnationId) {
    let owners_of = |incarnation, name: &str| match shard.live_topic(name, incarnation) {
        Some(record) => shard.remote_owners(&record),
        None => Vec::new(),
    };
    let stale = shard
        .waiters
        .stale_registrations_of(incarnation, now_ms(), RENEW_AFTER, owners_of);
    if let Some(renewal) = stale {
        send_renewal(shard, renewal).await;
    }
}

/// Registers with each owner a [`Renewal`] names. Each send may wait for room
/// on the mesh, so the TTL is taken again before each from the consumers
/// parked then, and nothing more is sent once none is.
async fn send_renewal(shard: &Rc<Shard>, renewal: Renewal) {
    let Renewal {
        incarnation,
        topic,
        owners,
        ..
    } = renewal;
    for owner in owners {
        let Some(ttl) = shard
            .waiters
            .renewal_ttl(incarnation, now_ms(), RENEW_AFTER)
        else {
            return;
        };
        register(shard, owner, &topic, incarnation, ttl).await;
        shard
            .waiters
            .note_registered(incarnation, owner, ttl, now_ms());
    }
}

/// Releases expired leases every second, so a consumer that died has its
/// records redelivered after the visibility timeout even if nobody consumes.
pub async fn run_purger(shard: Rc<Shard>) {
    while !shard.stopping.get() {
        narad_io::rt::sleep(PURGE_INTERVAL).await;
        shard.queues.purge_expired();
    }
}

fn ensure_keeper(shard: &Rc<Shard>) {
    if !shard.waiters.keeper_running.replace(true) {
        narad_io::rt::spawn_local(keeper(shard.clone()));
    }
}

/// While consumers are parked here, keeps a live token from this shard with every
/// other owner of their topics.
async fn keeper(shard: Rc<Shard>) {
    loop {
        narad_io::rt::sleep(KEEPER_INTERVAL).await;
        let now = now_ms();
        if shard.stopping.get() || !shard.waiters.any_parked() {
            shard.waiters.sweep(now);
            shard.waiters.keeper_running.set(false);
            return;
        }
        let owners_of = |incarnation, name: &str| match shard.live_topic(name, incarnation) {
            Some(record) => shard.remote_owners(&record),
            None => Vec::new(),
        };
        let stale = shard
            .waiters
            .stale_registrations(now, RENEW_AFTER, owners_of);
        for renewal in stale {
            send_renewal(&shard, renewal).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An owner shard that does not answer within the limit is told apart
    /// from one that stopped (502 and 503 to the client).
    #[test]
    fn an_owner_silent_past_the_limit_is_no_answer() {
        narad_io::rt::run_local(None, async {
            let silent = within(
                Duration::from_millis(20),
                std::future::pending::<Result<(), ConsumeError>>(),
            )
            .await;
            assert!(
                matches!(silent, Err(ConsumeError::NoAnswer(_))),
                "{silent:?}"
            );
            let answered = within(Duration::from_secs(5), async { Ok(7) }).await;
            assert_eq!(answered, Ok(7));
        });
    }
}
