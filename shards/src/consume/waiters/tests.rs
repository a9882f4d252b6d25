//! Unit tests of the parked-consumer core, each driven by hand with explicit time.

use super::*;

#[test]
fn a_deleted_topics_parked_consumers_are_answered_at_once() {
    let mut waiters = Waiters::<u32>::default();
    let topic: Arc<str> = Arc::from("t");
    let id = IncarnationId(1);
    // The request keeps its own handle on each waiter, as the consume path does.
    let (queued, mut queued_answer) = Waiter::new(1, 5_000);
    let (pinned, mut pinned_answer) = Waiter::new(1, 5_000);
    waiters.park(id, &topic, None, queued.clone());
    waiters.park(id, &topic, Some(PartitionId(2)), pinned.clone());
    waiters.drop_incarnation(id);
    assert!(!queued.is_live() && !pinned.is_live());
    assert!(matches!(queued_answer.try_recv(), Err(oneshot::Canceled)));
    assert!(matches!(pinned_answer.try_recv(), Err(oneshot::Canceled)));
}

#[test]
fn a_topic_is_pumped_by_one_task_at_a_time_and_keeps_its_kicks_meanwhile() {
    let mut waiters = Waiters::<u32>::default();
    let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
    let (ia, ib) = (IncarnationId(1), IncarnationId(2));
    let names =
        |kicks: Vec<Kick>| -> Vec<String> { kicks.iter().map(|k| k.topic.to_string()).collect() };
    waiters.kick(ia, &a);
    waiters.kick(ia, &a);
    assert_eq!(names(waiters.take_kicked()), ["a"], "one kick per topic");
    assert!(waiters.take_kicked().is_empty());
    // Kicked while it is pumped: held back, and the other topic goes ahead.
    waiters.kick(ia, &a);
    waiters.kick(ib, &b);
    assert_eq!(names(waiters.take_kicked()), ["b"]);
    assert!(waiters.take_kicked().is_empty());
    assert_eq!(waiters.pumping_len(), 2);
    assert!(
        waiters.pumped(ia),
        "kicked meanwhile: the pump must run again"
    );
    assert_eq!(names(waiters.take_kicked()), ["a"]);
    assert!(!waiters.pumped(ib), "not kicked meanwhile");
    assert!(!waiters.pumped(ia));
    assert_eq!(waiters.pumping_len(), 0);
    // Done with, a topic is handed out again at its next kick.
    waiters.kick(ib, &b);
    assert_eq!(names(waiters.take_kicked()), ["b"]);
}

#[test]
fn dead_waiters_are_skipped_and_swept() {
    let mut waiters = Waiters::<u32>::default();
    let topic: Arc<str> = Arc::from("t");
    let id = IncarnationId(1);
    let mut answers = Vec::new();
    for i in 0..200 {
        let (w, answer) = Waiter::new(1, 5_000);
        waiters.park(id, &topic, None, w);
        if i % 2 == 0 {
            answers.push(answer); // kept: live
        }
    }
    let len = waiters.queued_len(id);
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
    let mut waiters = Waiters::<u32>::default();
    let topic: Arc<str> = Arc::from("t");
    let id = IncarnationId(1);
    let now = 1_000;
    let deadline = now + 5_000;
    assert_eq!(
        waiters.registrations_needed(id, &topic, &[1, 2], deadline, now),
        vec![1, 2]
    );
    let soon = now + 100;
    assert!(waiters
        .registrations_needed(id, &topic, &[1, 2], deadline, soon)
        .is_empty());
    // A later deadline is not covered by the token.
    let later = deadline + 1_000;
    assert_eq!(
        waiters.registrations_needed(id, &topic, &[1], later, soon),
        vec![1]
    );
    // Past the share window a consumer registers again.
    let late = now + ms(SHARE_WINDOW) + 1;
    assert_eq!(
        waiters.registrations_needed(id, &topic, &[2], deadline, late),
        vec![2]
    );
    // A notification spends the token.
    waiters.notified(id, &topic, 2, crate::consume::tokens::PromiseId(0));
    assert_eq!(
        waiters.registrations_needed(id, &topic, &[2], deadline, late),
        vec![2]
    );
}

#[test]
fn a_registration_never_sent_is_not_shared() {
    let mut waiters = Waiters::<u32>::default();
    let topic: Arc<str> = Arc::from("t");
    let id = IncarnationId(1);
    let (now, deadline) = (1_000, 6_000);
    let mut waiter_a = waiters.registrations_needed(id, &topic, &[1, 2], deadline, now);
    assert_eq!(waiter_a, vec![1, 2]);
    // The first consumer sent to owner 1 and went away before owner 2.
    waiter_a.remove(0);
    for owner in waiter_a {
        waiters.registration_unsent(id, owner);
    }
    assert_eq!(
        waiters.registrations_needed(id, &topic, &[1, 2], deadline, now + 100),
        vec![2],
        "the next consumer shares owner 1's token and sends owner 2's"
    );
}

#[test]
fn the_keeper_renews_missing_lapsing_and_old_registrations() {
    let mut waiters = Waiters::<u32>::default();
    let topic: Arc<str> = Arc::from("t");
    let id = IncarnationId(1);
    let renew_after = Duration::from_secs(5);
    let owners = |_, _: &str| vec![1, 2];
    // Nobody parked: nothing to keep.
    assert!(waiters
        .stale_registrations(0, renew_after, owners)
        .is_empty());
    let now = 1_000;
    let (w, _answer) = Waiter::new(1, now + 30_000);
    waiters.park(id, &topic, None, w);
    waiters.note_registered(id, 1, Duration::from_secs(10), now);
    let stale = waiters.stale_registrations(now, renew_after, owners);
    assert_eq!(stale.len(), 1);
    assert_eq!(
        stale[0].owners,
        vec![2],
        "owner 2 was never registered with"
    );
    let old = now + ms(renew_after);
    let stale = waiters.stale_registrations(old, renew_after, owners);
    assert_eq!(
        stale[0].owners,
        vec![1, 2],
        "a registration is renewed after 5 s"
    );
}

#[test]
fn a_renewed_token_lasts_the_longest_remaining_wait_at_most_the_renewal_period() {
    let mut waiters = Waiters::<u32>::default();
    let topic: Arc<str> = Arc::from("t");
    let id = IncarnationId(1);
    let renew_after = Duration::from_secs(5);
    let owners = |_, _: &str| vec![1];
    let now = 1_000;
    let (short, _a) = Waiter::new(1, now + 1_200);
    let (shorter, _b) = Waiter::new(1, now + 300);
    waiters.park(id, &topic, None, short.clone());
    waiters.park(id, &topic, None, shorter);
    let ttl = |w: &Waiters<u32>, at| w.stale_registrations(at, renew_after, owners)[0].ttl;
    assert_eq!(
        ttl(&waiters, now),
        Duration::from_millis(1_200) + SHARE_WINDOW
    );
    // The longest wait is what the token covers, however it is queued.
    let (long, _c) = Waiter::new(1, now + 60_000);
    waiters.park(id, &topic, None, long.clone());
    assert_eq!(ttl(&waiters, now), renew_after + SHARE_WINDOW);
    // Gone consumers do not count.
    long.close();
    assert_eq!(
        ttl(&waiters, now + 200),
        Duration::from_millis(1_000) + SHARE_WINDOW
    );
    short.close();
    assert_eq!(
        ttl(&waiters, now + 200),
        Duration::from_millis(100) + SHARE_WINDOW
    );
    // A renewal covers the waits parked when it was sent; a consumer back on
    // the FIFO with a later deadline makes it stale, once, not at every tick.
    let mut waiters = Waiters::<u32>::default();
    let (short, _e) = Waiter::new(1, now + 300);
    waiters.park(id, &topic, None, short);
    let renewal = waiters
        .stale_registrations(now, renew_after, owners)
        .remove(0);
    waiters.note_registered(id, 1, renewal.ttl, now);
    assert!(waiters
        .stale_registrations(now + 10, renew_after, owners)
        .is_empty());
    let (back, _f) = Waiter::new(1, now + 20_000);
    waiters.park(id, &topic, None, back);
    let renewal = waiters
        .stale_registrations(now + 20, renew_after, owners)
        .remove(0);
    assert_eq!(renewal.ttl, renew_after + SHARE_WINDOW);
    waiters.note_registered(id, 1, renewal.ttl, now + 20);
    assert!(waiters
        .stale_registrations(now + 30, renew_after, owners)
        .is_empty());
    assert_eq!(
        waiters.renewal_ttl(id, now + 30, renew_after),
        Some(renew_after + SHARE_WINDOW)
    );
    // Nothing is renewed for a topic nobody waits on.
    let mut empty = Waiters::<u32>::default();
    let (gone, _d) = Waiter::new(1, now + 10_000);
    empty.park(id, &topic, None, gone.clone());
    gone.close();
    assert!(empty
        .stale_registrations(now, renew_after, owners)
        .is_empty());
}

#[test]
fn demand_counts_live_consumers_up_to_what_is_there() {
    let mut waiters = Waiters::<u32>::default();
    let topic: Arc<str> = Arc::from("t");
    let id = IncarnationId(1);
    let mut answers = Vec::new();
    for (max, pinned) in [
        (3, None),
        (2, Some(PartitionId(1))),
        (4, Some(PartitionId(1))),
    ] {
        let (w, answer) = Waiter::new(max, 5_000);
        waiters.park(id, &topic, pinned, w);
        answers.push(answer);
    }
    let (gone, gone_answer) = Waiter::new(10, 5_000);
    waiters.park(id, &topic, Some(PartitionId(1)), gone);
    drop(gone_answer);
    assert_eq!(waiters.pinned_demand(id, PartitionId(1), 100), 6);
    assert_eq!(waiters.pinned_demand(id, PartitionId(1), 5), 5);
    assert_eq!(waiters.pinned_demand(id, PartitionId(0), 100), 0);
    assert_eq!(
        waiters.pinned_demand(IncarnationId(2), PartitionId(1), 100),
        0
    );
    // The topic's FIFO wants 3; partition 1's consumers as many as it holds.
    assert_eq!(waiters.waiting_demand(id, 100, |_| 4), 7);
    assert_eq!(waiters.waiting_demand(id, 5, |_| 4), 5);
}

#[test]
fn a_newcomer_leaves_pinned_consumers_their_partitions_records() {
    // Partition 1 holds 3 records and its pinned consumers want 2 of them;
    // partitions 0, 2 and 3 hold 5 each and have no pinned consumer.
    let wait = |p: PartitionId| match p.0 {
        1 => (3, 2),
        _ => (5, 0),
    };
    let mut local = [
        PartitionId(1),
        PartitionId(2),
        PartitionId(3),
        PartitionId(0),
    ];
    let pinned_one = leave_to_pinned(4, Some(PartitionId(1)), &mut local, 0, wait);
    assert_eq!(pinned_one, Some(1));
    let pinned_two = leave_to_pinned(4, Some(PartitionId(2)), &mut local, 0, wait);
    assert_eq!(pinned_two, Some(4));
    // Every record of the partition is wanted: a newcomer pinned there
    // takes none.
    let wanted_all = |_| (2, 2);
    let none = leave_to_pinned(4, Some(PartitionId(1)), &mut local, 0, wanted_all);
    assert_eq!(none, None);
    // Unpinned: partition 1 comes last, and each of the others comes first
    // as often as the others, whatever order the caller turned them to.
    let mut firsts = std::collections::BTreeMap::new();
    for turn in 0..12 {
        let mut local = [0, 1, 2, 3].map(PartitionId);
        local.rotate_left(turn % 4);
        assert_eq!(leave_to_pinned(4, None, &mut local, turn, wait), Some(4));
        assert_eq!(local[3], PartitionId(1), "turn {turn}: {local:?}");
        *firsts.entry(local[0].0).or_insert(0) += 1;
    }
    assert_eq!(
        firsts.into_iter().collect::<Vec<_>>(),
        [(0, 4), (2, 4), (3, 4)]
    );
    // Nobody pinned: the caller's order stands.
    let mut local = [2, 0, 1].map(PartitionId);
    assert_eq!(leave_to_pinned(4, None, &mut local, 5, |_| (5, 0)), Some(4));
    assert_eq!(local, [2, 0, 1].map(PartitionId));
}

#[test]
fn claimed_records_go_to_later_consumers_each_within_its_max() {
    // The head consumer (max 100) has gone; the next asks for 2, the one
    // after for 1; what is left over is released.
    let (gone, rx) = Waiter::<Vec<u32>>::new(100, u64::MAX);
    drop(rx);
    let (two, mut rx2) = Waiter::new(2, u64::MAX);
    let (one, mut rx1) = Waiter::new(1, u64::MAX);
    let mut queue = vec![gone, two, one].into_iter();
    let left = hand_out((0..5).collect(), || queue.next());
    assert_eq!(rx2.try_recv().unwrap(), Some(vec![0, 1]));
    assert_eq!(rx1.try_recv().unwrap(), Some(vec![2]));
    assert_eq!(left, vec![3, 4]);
}

#[test]
fn nothing_is_released_when_the_head_consumer_takes_all() {
    let (head, mut rx) = Waiter::new(10, u64::MAX);
    let mut queue = vec![head].into_iter();
    assert!(hand_out(vec![7, 8], || queue.next()).is_empty());
    assert_eq!(rx.try_recv().unwrap(), Some(vec![7, 8]));
}

/// Records made available wake the pump only for a topic someone waits on:
/// a consumer on a FIFO (pinned or not, gone ones too, which the pump drops),
/// or the pump at the topic now, which may hold a consumer off its FIFO.
#[test]
fn a_topic_is_waited_on_while_a_consumer_is_parked_or_the_pump_is_at_it() {
    let mut waiters = Waiters::<u32>::default();
    let topic: Arc<str> = Arc::from("t");
    let id = IncarnationId(1);
    assert!(!waiters.is_waited_on(id), "nobody ever came");
    let (queued, _queued_answer) = Waiter::new(1, 5_000);
    waiters.park(id, &topic, None, queued);
    assert!(waiters.is_waited_on(id));
    // The pump takes the topic and the consumer off its FIFO.
    assert_eq!(waiters.take_kicked().len(), 1);
    assert!(waiters.pop_live(id, None).is_some());
    assert!(waiters.is_waited_on(id), "the pump holds the consumer");
    assert!(!waiters.pumped(id));
    assert!(!waiters.is_waited_on(id), "served and pumped");
    let (pinned, pinned_answer) = Waiter::new(1, 5_000);
    waiters.park(id, &topic, Some(PartitionId(3)), pinned);
    assert!(waiters.is_waited_on(id), "a pinned consumer");
    drop(pinned_answer);
    assert!(waiters.is_waited_on(id), "gone, until the pump drops it");
    assert!(!waiters.is_waited_on(IncarnationId(2)), "another topic");
}
