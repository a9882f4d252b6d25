//! Unit tests of single in-flight table rules, each driven by hand with explicit
//! time, offsets and nonces.

use super::*;

const CAPS: Caps = Caps {
    in_flight_max: 16,
    acked_ahead_max: 16,
};
const VIS_MS: u64 = 1_000;

fn o(offset: u64) -> Offset {
    Offset(offset)
}

/// Reserves and returns the offset, panicking on anything but `Reserved`.
fn lease(t: &mut InFlight, now_ms: u64, hwm: u64, nonce: u64) -> Offset {
    match t.reserve(now_ms, o(hwm), &CAPS, VIS_MS, nonce) {
        Reserve::Reserved { offset, expiry_ms } => {
            assert_eq!(expiry_ms, now_ms + VIS_MS);
            t.assert_invariants();
            offset
        }
        other => panic!("expected a lease, got {other:?}"),
    }
}

fn acked(t: &InFlight) -> Vec<u64> {
    t.acked_ahead().map(|o| o.0).collect()
}

#[test]
fn reserves_lowest_free_offset_in_order() {
    let mut t = InFlight::new(o(0), []);
    for expected in 0..5 {
        assert_eq!(lease(&mut t, 0, 10, 100 + expected), o(expected));
    }
    assert_eq!(t.in_flight(), 5);
    assert_eq!(t.frontier(), o(0));
}

#[test]
fn nothing_below_hwm_is_empty() {
    let mut t = InFlight::new(o(0), []);
    assert_eq!(t.reserve(0, o(0), &CAPS, VIS_MS, 1), Reserve::Empty);
    assert_eq!(lease(&mut t, 0, 2, 1), o(0));
    assert_eq!(lease(&mut t, 0, 2, 2), o(1));
    assert_eq!(t.reserve(0, o(2), &CAPS, VIS_MS, 3), Reserve::Empty);
    assert_eq!(lease(&mut t, 0, 3, 3), o(2));
}

#[test]
fn two_reserves_never_get_the_same_offset() {
    let mut t = InFlight::new(o(0), []);
    let mut seen = std::collections::BTreeSet::new();
    for nonce in 0..16 {
        assert!(seen.insert(lease(&mut t, 0, 100, nonce)));
    }
    // A released offset is handed out once, to one of the next two reserves.
    t.nack(o(3), 3, 1).unwrap();
    assert_eq!(lease(&mut t, 1, 100, 50), o(3));
    t.ack(o(0), 0, 1).unwrap();
    assert_eq!(lease(&mut t, 1, 100, 51), o(16));
}

#[test]
fn ack_advances_frontier_over_contiguous_run() {
    let mut t = InFlight::new(o(0), []);
    for nonce in 0..4 {
        lease(&mut t, 0, 10, nonce);
    }
    t.ack(o(0), 0, 1).unwrap();
    assert_eq!(t.frontier(), o(1));
    t.ack(o(1), 1, 1).unwrap();
    assert_eq!(t.frontier(), o(2));
    assert!(acked(&t).is_empty());
    t.assert_invariants();
}

#[test]
fn out_of_order_acks_park_then_collapse() {
    let mut t = InFlight::new(o(0), []);
    for nonce in 0..5 {
        lease(&mut t, 0, 10, nonce);
    }
    t.ack(o(3), 3, 1).unwrap();
    t.ack(o(1), 1, 1).unwrap();
    t.ack(o(2), 2, 1).unwrap();
    assert_eq!(t.frontier(), o(0));
    assert_eq!(acked(&t), vec![1, 2, 3]);
    t.ack(o(0), 0, 1).unwrap();
    assert_eq!(t.frontier(), o(4));
    assert!(acked(&t).is_empty());
    assert_eq!(t.in_flight(), 1);
    t.assert_invariants();
}

#[test]
fn stale_handle_after_expiry_and_release_is_refused() {
    let mut t = InFlight::new(o(0), []);
    assert_eq!(lease(&mut t, 0, 10, 7), o(0));
    // Expired but not purged: stale already, and the check purges it.
    assert!(!t.is_leased(o(0), 7, VIS_MS));
    assert_eq!(t.ack(o(0), 7, VIS_MS), Err(HandleError::Stale));
    assert_eq!(t.in_flight(), 0);
    assert_eq!(lease(&mut t, VIS_MS, 10, 8), o(0));
    assert_eq!(t.ack(o(0), 7, VIS_MS + 1), Err(HandleError::Stale));
    assert_eq!(
        t.extend(o(0), 7, VIS_MS + 1, VIS_MS),
        Err(HandleError::Stale)
    );
    assert_eq!(t.nack(o(0), 7, VIS_MS + 1), Err(HandleError::Stale));
    assert_eq!(t.frontier(), o(0));
    assert!(t.is_leased(o(0), 8, VIS_MS + 1));
    t.ack(o(0), 8, VIS_MS + 1).unwrap();
    assert_eq!(t.frontier(), o(1));
    // Settled: the holder's second ack is stale too.
    assert_eq!(t.ack(o(0), 8, VIS_MS + 2), Err(HandleError::Stale));
    t.assert_invariants();
}

#[test]
fn never_leased_offsets_are_stale() {
    let mut t = InFlight::new(o(0), []);
    assert_eq!(t.ack(o(0), 0, 0), Err(HandleError::Stale));
    assert_eq!(t.nack(o(5), 0, 0), Err(HandleError::Stale));
    assert_eq!(t.extend(o(5), 0, 0, VIS_MS), Err(HandleError::Stale));
    assert!(!t.take_settled_changed());
}

#[test]
fn extend_outlives_the_superseded_deadline() {
    let mut t = InFlight::new(o(0), []);
    lease(&mut t, 0, 1, 7);
    assert_eq!(t.extend(o(0), 7, 500, 5 * VIS_MS), Ok(5_500));
    assert_eq!(t.next_expiry_ms(), Some(5_500));
    // The old deadline (1000) passes: the purger must not evict the lease.
    assert_eq!(t.purge_expired(1_000), 0);
    assert_eq!(t.purge_expired(5_499), 0);
    assert!(t.is_leased(o(0), 7, 5_499));
    assert_eq!(t.reserve(2_000, o(1), &CAPS, VIS_MS, 9), Reserve::Empty);
    t.assert_invariants();
    assert_eq!(t.purge_expired(5_500), 1);
    assert_eq!(t.next_expiry_ms(), None);
    t.assert_invariants();
}

#[test]
fn extend_can_shorten_and_then_expires_at_the_new_deadline() {
    let mut t = InFlight::new(o(0), []);
    lease(&mut t, 0, 10, 7);
    assert_eq!(t.extend(o(0), 7, 100, 200), Ok(300));
    assert_eq!(t.next_expiry_ms(), Some(300));
    assert_eq!(t.purge_expired(300), 1);
    assert_eq!(t.purge_expired(VIS_MS), 0);
    t.assert_invariants();
}

#[test]
fn nack_frees_at_once() {
    let mut t = InFlight::new(o(0), []);
    lease(&mut t, 0, 10, 1);
    lease(&mut t, 0, 10, 2);
    assert_eq!(t.available(o(10)), 8);
    t.nack(o(0), 1, 5).unwrap();
    assert_eq!(t.available(o(10)), 9);
    assert_eq!(t.in_flight(), 1);
    assert!(!t.take_settled_changed(), "a nack settles nothing");
    assert_eq!(lease(&mut t, 5, 10, 3), o(0));
    t.assert_invariants();
}

#[test]
fn in_flight_cap_answers_full() {
    let caps = Caps {
        in_flight_max: 2,
        acked_ahead_max: 16,
    };
    let mut t = InFlight::new(o(0), []);
    assert!(matches!(
        t.reserve(0, o(10), &caps, VIS_MS, 1),
        Reserve::Reserved { .. }
    ));
    assert!(matches!(
        t.reserve(0, o(10), &caps, VIS_MS, 2),
        Reserve::Reserved { .. }
    ));
    assert_eq!(t.reserve(0, o(10), &caps, VIS_MS, 3), Reserve::Full);
    t.ack(o(1), 2, 1).unwrap();
    assert_eq!(
        t.reserve(1, o(10), &caps, VIS_MS, 3),
        Reserve::Reserved {
            offset: o(2),
            expiry_ms: 1 + VIS_MS
        }
    );
    // Expiry frees the cap on the next touch.
    assert!(matches!(
        t.reserve(VIS_MS, o(10), &caps, VIS_MS, 4),
        Reserve::Reserved { .. }
    ));
}

#[test]
fn acked_ahead_cap_leases_only_the_frontier_hole() {
    let caps = Caps {
        in_flight_max: 16,
        acked_ahead_max: 2,
    };
    let mut t = InFlight::new(o(0), []);
    for nonce in 0..4 {
        assert!(matches!(
            t.reserve(0, o(10), &caps, VIS_MS, nonce),
            Reserve::Reserved { .. }
        ));
    }
    t.ack(o(1), 1, 1).unwrap();
    t.ack(o(2), 2, 1).unwrap();
    // At the cap with the frontier hole leased: nothing above it is handed out.
    assert_eq!(t.reserve(1, o(10), &caps, VIS_MS, 9), Reserve::Full);
    // Acks of leased offsets are accepted past the cap.
    t.ack(o(3), 3, 1).unwrap();
    assert_eq!(acked(&t), vec![1, 2, 3]);
    // The frontier hole comes free: it, and only it, may be leased.
    t.nack(o(0), 0, 2).unwrap();
    assert_eq!(
        t.reserve(2, o(10), &caps, VIS_MS, 10),
        Reserve::Reserved {
            offset: o(0),
            expiry_ms: 2 + VIS_MS
        }
    );
    assert_eq!(t.reserve(2, o(10), &caps, VIS_MS, 11), Reserve::Full);
    t.ack(o(0), 10, 3).unwrap();
    assert_eq!(t.frontier(), o(4));
    assert!(matches!(
        t.reserve(3, o(10), &caps, VIS_MS, 12),
        Reserve::Reserved { .. }
    ));
    t.assert_invariants();
}

#[test]
fn acked_ahead_cap_with_nothing_free_is_empty() {
    let caps = Caps {
        in_flight_max: 16,
        acked_ahead_max: 1,
    };
    let mut t = InFlight::new(o(0), []);
    t.reserve(0, o(2), &caps, VIS_MS, 0);
    t.reserve(0, o(2), &caps, VIS_MS, 1);
    t.ack(o(1), 1, 0).unwrap();
    assert_eq!(t.reserve(0, o(2), &caps, VIS_MS, 2), Reserve::Empty);
}

#[test]
fn skip_corrupt_settles_and_counts() {
    let mut t = InFlight::new(o(0), []);
    for nonce in 0..6 {
        lease(&mut t, 0, 20, nonce);
    }
    t.ack(o(4), 4, 1).unwrap();
    // Above the frontier: 2, 3 and 5 leased, 4 already settled, 6 and 7 fresh.
    assert_eq!(t.skip_corrupt(o(2)..o(8)), 5);
    assert_eq!(acked(&t), vec![2, 3, 4, 5, 6, 7]);
    assert_eq!(
        t.ack(o(3), 3, 1),
        Err(HandleError::Stale),
        "its lease was dropped"
    );
    assert_eq!(t.in_flight(), 2);
    assert!(t.take_settled_changed());
    // From the frontier: 0 and 1 leased, 2..8 settled already, 8 and 9 fresh.
    assert_eq!(t.skip_corrupt(o(0)..o(10)), 4);
    assert_eq!(t.frontier(), o(10));
    assert_eq!(t.in_flight(), 0);
    assert_eq!(t.next_expiry_ms(), None);
    assert_eq!(t.corrupt_skipped_total(), 9);
    // Below the frontier: nothing.
    assert_eq!(t.skip_corrupt(o(0)..o(10)), 0);
    assert!(t.take_settled_changed());
    assert!(!t.take_settled_changed());
    assert_eq!(lease(&mut t, 1, 20, 99), o(10));
    t.assert_invariants();
}

#[test]
fn skip_corrupt_fresh_offsets_are_stepped_over() {
    let mut t = InFlight::new(o(0), []);
    assert_eq!(t.skip_corrupt(o(2)..o(4)), 2);
    assert_eq!(lease(&mut t, 0, 10, 1), o(0));
    assert_eq!(lease(&mut t, 0, 10, 2), o(1));
    assert_eq!(lease(&mut t, 0, 10, 3), o(4));
    t.ack(o(0), 1, 1).unwrap();
    t.ack(o(1), 2, 1).unwrap();
    assert_eq!(t.frontier(), o(4));
    t.assert_invariants();
}

#[test]
fn jump_to_drops_everything_below_oldest() {
    let mut t = InFlight::new(o(0), []);
    for nonce in 0..8 {
        lease(&mut t, 0, 20, nonce);
    }
    t.ack(o(2), 2, 1).unwrap();
    t.ack(o(6), 6, 1).unwrap();
    t.nack(o(3), 3, 1).unwrap();
    let _ = t.take_settled_changed();
    assert!(t.jump_to(o(5)));
    assert!(t.take_settled_changed());
    assert_eq!(t.frontier(), o(5));
    assert_eq!(t.dropped_total(), 4, "0, 1, 3 and 4: 2 was acked");
    assert_eq!(acked(&t), vec![6]);
    assert_eq!(t.in_flight(), 2, "5 and 7 remain");
    assert_eq!(t.ack(o(4), 4, 2), Err(HandleError::Stale));
    t.assert_invariants();
    // Not below: no move.
    assert!(!t.jump_to(o(5)));
    assert!(!t.jump_to(o(1)));
    assert!(!t.take_settled_changed());
    // The jump lands on an acked run and collapses it; past next_fresh too.
    t.ack(o(7), 7, 2).unwrap();
    assert!(t.jump_to(o(6)));
    assert_eq!(t.frontier(), o(8));
    assert!(t.jump_to(o(30)));
    assert_eq!(t.frontier(), o(30));
    assert_eq!(t.dropped_total(), 4 + 1 + 22, "then 5, then 8 to 29");
    assert_eq!(t.in_flight(), 0);
    assert_eq!(t.reserve(2, o(30), &CAPS, VIS_MS, 50), Reserve::Empty);
    assert_eq!(lease(&mut t, 2, 31, 51), o(30));
    t.assert_invariants();
}

#[test]
fn new_with_acked_ahead_set() {
    let mut t = InFlight::new(o(10), [o(3), o(12), o(13), o(15), o(20)]);
    assert_eq!(t.frontier(), o(10));
    assert_eq!(acked(&t), vec![12, 13, 15, 20]);
    assert!(
        t.take_settled_changed(),
        "an offset below the frontier was dropped"
    );
    t.assert_invariants();
    assert_eq!(t.available(o(22)), 12 - 4);
    let got: Vec<Offset> = (0..5).map(|n| lease(&mut t, 0, 22, n)).collect();
    assert_eq!(got, vec![o(10), o(11), o(14), o(16), o(17)]);
    t.ack(o(10), 0, 1).unwrap();
    t.ack(o(11), 1, 1).unwrap();
    assert_eq!(t.frontier(), o(14));
    t.ack(o(14), 2, 1).unwrap();
    assert_eq!(t.frontier(), o(16));
    t.assert_invariants();
}

#[test]
fn new_collapses_a_contiguous_set() {
    let mut t = InFlight::new(o(5), [o(5), o(6), o(7), o(9)]);
    assert_eq!(t.frontier(), o(8));
    assert_eq!(acked(&t), vec![9]);
    assert!(t.take_settled_changed());
    assert_eq!(lease(&mut t, 0, 20, 1), o(8));
    assert_eq!(lease(&mut t, 0, 20, 2), o(10));
    t.assert_invariants();
    let mut clean = InFlight::new(o(5), [o(7)]);
    assert!(!clean.take_settled_changed());
}

#[test]
fn new_with_frontier_above_hwm_is_empty() {
    let mut t = InFlight::new(o(50), [o(52)]);
    assert_eq!(t.reserve(0, o(10), &CAPS, VIS_MS, 1), Reserve::Empty);
    assert_eq!(t.available(o(10)), 0);
    assert_eq!(t.available(o(53)), 2);
    t.assert_invariants();
}

#[test]
fn available_counts_free_offsets() {
    let mut t = InFlight::new(o(0), [o(8), o(30)]);
    assert_eq!(t.available(o(10)), 9);
    lease(&mut t, 0, 10, 1);
    lease(&mut t, 0, 10, 2);
    assert_eq!(t.available(o(10)), 7);
    t.ack(o(1), 2, 1).unwrap();
    assert_eq!(t.available(o(10)), 7);
    t.ack(o(0), 1, 1).unwrap();
    assert_eq!(t.frontier(), o(2));
    assert_eq!(t.available(o(10)), 7);
    assert_eq!(t.available(o(40)), 36);
    // An expired lease still counts as taken until it is purged.
    lease(&mut t, 1, 10, 3);
    assert_eq!(t.available(o(10)), 6);
    t.purge_expired(1 + VIS_MS);
    assert_eq!(t.available(o(10)), 7);
}

#[test]
fn settled_changed_tracks_frontier_and_acked_ahead() {
    let mut t = InFlight::new(o(0), []);
    assert!(!t.take_settled_changed());
    lease(&mut t, 0, 10, 1);
    lease(&mut t, 0, 10, 2);
    assert!(!t.take_settled_changed(), "a lease is not settled state");
    t.extend(o(0), 1, 1, VIS_MS).unwrap();
    assert!(!t.take_settled_changed());
    t.ack(o(1), 2, 1).unwrap();
    assert!(t.take_settled_changed());
    assert!(!t.take_settled_changed());
    t.ack(o(0), 1, 1).unwrap();
    assert!(t.take_settled_changed());
    t.purge_expired(10 * VIS_MS);
    assert!(!t.take_settled_changed());
}

#[test]
fn next_expiry_skips_settled_and_superseded_deadlines() {
    let mut t = InFlight::new(o(0), []);
    lease(&mut t, 0, 10, 1);
    lease(&mut t, 10, 10, 2);
    assert_eq!(t.next_expiry_ms(), Some(VIS_MS));
    t.ack(o(0), 1, 20).unwrap();
    assert_eq!(t.next_expiry_ms(), Some(10 + VIS_MS));
    t.extend(o(1), 2, 20, VIS_MS).unwrap();
    assert_eq!(t.next_expiry_ms(), Some(20 + VIS_MS));
}

#[test]
fn deadlines_stay_bounded_under_repeated_extends() {
    let mut t = InFlight::new(o(0), []);
    lease(&mut t, 0, 10, 1);
    lease(&mut t, 0, 10, 2);
    for now_ms in 1..10_000 {
        t.extend(o(1), 2, now_ms, VIS_MS).unwrap();
        t.extend(o(0), 1, now_ms, VIS_MS).unwrap();
        assert!(t.deadlines.len() <= 2 * 2 + DEADLINES_STALE_SLACK);
    }
    t.assert_invariants();
    assert_eq!(t.purge_expired(9_999 + VIS_MS), 2);
}

#[test]
#[should_panic(expected = "high watermark went backwards")]
fn hwm_going_backwards_is_a_bug() {
    let mut t = InFlight::new(o(0), []);
    t.reserve(0, o(10), &CAPS, VIS_MS, 1);
    t.reserve(0, o(9), &CAPS, VIS_MS, 2);
}

#[test]
fn available_under_the_caps_is_what_reserve_could_hand_out() {
    let caps = Caps {
        in_flight_max: 3,
        acked_ahead_max: 2,
    };
    let reserve = |t: &mut InFlight, nonce: u64| t.reserve(0, o(100), &caps, VIS_MS, nonce);
    let mut t = InFlight::new(o(0), []);
    assert_eq!(t.available(o(100)), 100);
    assert_eq!(
        t.available_under(o(100), &caps),
        3,
        "room under the in-flight cap"
    );
    for nonce in 1..=3 {
        assert!(matches!(reserve(&mut t, nonce), Reserve::Reserved { .. }));
    }
    // At the in-flight cap: records exist, but none can be handed out.
    assert_eq!(t.available(o(100)), 97);
    assert_eq!(t.available_under(o(100), &caps), 0);
    assert_eq!(reserve(&mut t, 4), Reserve::Full);
    // Offsets 1 and 2 acked ahead: the acked-ahead cap leaves the frontier hole,
    // which is leased.
    t.ack(o(1), 2, 0).unwrap();
    t.ack(o(2), 3, 0).unwrap();
    assert_eq!(t.available_under(o(100), &caps), 0, "only the hole, leased");
    assert_eq!(reserve(&mut t, 5), Reserve::Full);
    // Nacked, the hole is the one record that can go.
    t.nack(o(0), 1, 0).unwrap();
    assert_eq!(t.available_under(o(100), &caps), 1);
    assert!(matches!(
        reserve(&mut t, 6),
        Reserve::Reserved { offset, .. } if offset == o(0)
    ));
    t.assert_invariants();
}
