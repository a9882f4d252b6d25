//! A seeded simulation of the consume path across the shards of one node: the real
//! cores ([`InFlight`], [`Waiters`], [`Tokens`]) driven through the protocol steps of
//! the broker's `src/consume/flow.rs`, with a mesh between shards that delivers
//! FIFO per ordered pair after random delays, and a clock that only moves between
//! events (nothing here reads a clock, so a seed replays exactly).
//!
//! The world: 3 or 4 shards, one or two topics, partition `p` of a topic owned by
//! shard `(p + h) % shards`. A partition is just a high watermark (the log) and
//! the settled state the ack persister last wrote (`consumer.ahead`); producers
//! move high watermarks, and a shard crash forgets that shard's in-flight tables,
//! parked consumers, claims, tokens and in-flight mesh traffic, and rebuilds its
//! tables from the persisted settled state only, on first touch.
//!
//! Each step mirrors a broker function:
//! - [`Sim::arrive`]: `flow::consume` / `consume_queue` (local take, then a probe
//!   of each other owner in turn, then park, `registrations_needed`, `register`,
//!   `ensure_keeper`) and `consume_pinned_here`; a pinned consume of a partition
//!   another shard owns is forwarded as `Op::Consume` and parks there.
//! - [`Sim::take`]: `Queues::take` / `take_from` / `reserve` (reservation before the
//!   read; the read may return only a prefix, its byte budget spent, and the rest
//!   is released at once; a read that fails releases all and asks for a wake
//!   later). The log read itself takes no simulated time.
//! - [`Sim::serve_consume`]: `flow::serve_consume_op` (a claim retires a promise
//!   and takes beyond its own record only records not promised to another
//!   shard; a probe, as every consumer arriving, only what those waiting before
//!   it leave, `Sim::newcomer_share`; a reply nobody receives is released,
//!   `Queues::release_delivered`).
//! - [`Sim::pump`] / [`Sim::pump_topic`] / [`Sim::serve_fifo`]: `run_pump`,
//!   `pump_topic` (pinned FIFOs first, then the topic's FIFO, then, with nobody
//!   parked here and a live token, `load_all` and `spend_tokens`, one `Op::Notify`
//!   each) and `serve_fifo`.
//! - [`Sim::claim_start`] / [`Sim::claim_answered`]: `flow::claim` (pass when
//!   nobody is parked; deliver to the head, or the next live one, or `Op::Release`;
//!   push the waiter back on an empty claim; register again while anyone is
//!   parked).
//! - [`Sim::keeper`]: `flow::keeper`; [`Sim::purge`]: `run_purger` with
//!   `Queues::purge_expired`; [`Sim::settle`]: `flow::settle` and `Queues::settle`;
//!   [`Sim::on_mesh`]: `broker::ops::serve_consume_op`; [`Sim::produce`]:
//!   `Queues::on_visible`.
//!
//! Checked after every event:
//! - no offset has two live leases held by two consumers, and no lease (offset and
//!   nonce) is ever handed to two consumers;
//! - a partition's frontier never regresses within a life of its owner, and never
//!   falls below the persisted one;
//! - every loaded in-flight table's own invariants;
//! - a spend of tokens never notifies more shards than the records available minus
//!   the promises outstanding, counted by the simulation's own ledger;
//! - no lost wake: a live consumer stays parked no longer than the keeper interval
//!   plus a register-notify-claim round trip while a record it could take is
//!   available on some shard and nobody parked beside it is being served (after a
//!   crash, tokens are rebuilt by the keeper's renewal, so the bound is relaxed by
//!   the renewal period for that long; the same after a mesh stall).
//!
//! One topic in three has small caps (`max_in_flight_per_partition` and
//! `max_acked_ahead_per_partition` of 1 to 6), so reservations find tables full
//! while records wait; the availability every step and check counts is the
//! broker's, under the topic's caps (`InFlight::available_under`).
//!
//! Now and then a mesh pair stalls for up to 1.5 s (longer than a promise's
//! claim deadline), so claims and passes also arrive after their promise
//! lapsed, sometimes beside a newer promise to the same shard. Now and then a
//! partition's reads fail for up to 1.5 s (a faulty disk): what was reserved
//! for the read is released without a wake, the consume, probe or claim that
//! read gets the error, and the topic is served again a second later
//! (`kick_later`); a failed claim leaves the renewal to the keeper. The
//! lost-wake bound is relaxed, for the topic's consumers, by that second from
//! the end of a fault. A
//! third of the seeds are calm (no crash, no stall, no read fault), so the
//! lost-wake bound also holds unrelaxed through a whole workload.
//!
//! At the end producers, crashes and cancellations stop, consumers that ack
//! everything keep arriving, and every record below every high watermark must be
//! settled, each by an ack of a lease that was delivered: every committed record
//! is delivered until it is acked.
//!
//! `NARAD_TEST_SEED=<n>` replays one seed; `NARAD_SIM_SEEDS=<n>` runs more seeds
//! (default 200) from a random base.
//!
//! A second test runs a fixed scenario instead of the random workload
//! (`Sim::fair`): records at a steady pace, consumers always waiting on every
//! shard, one shard owning none of the topic's partitions. Its consumers must
//! get a fair part of the records: tokens take their turn beside an owner's own
//! consumers. Two more add consumers that do not wait, arriving every tick:
//! on one owner (its probes of the other owners) or pinned to each owner's
//! partition; they take only what those waiting before them leave, so the
//! shares stay fair. A fourth runs the pollers on one owner with batches
//! (each consumer's `max` and each commit's records drawn up to 4), where a
//! claim takes more than its own record. Every record promised to a claim must be held for it:
//! in these calm runs no claim comes back empty.
//!
//! Files:
//! - `world.rs`: the simulated node (topics, disk, shards, consumers, claims, mesh
//!   messages, events) and the plumbing of every step (scheduling, the mesh, the
//!   pump's wake-up).
//! - `events.rs`: the random workload (produce, arrive, cancel, crash, a
//!   consumer's acts on its records) and the event loop.
//! - `flows.rs`: the request flows of `src/consume/flow.rs` (consume routing,
//!   pinned consumes, the owner's side of `Op::Consume`, waiting).
//! - `pump.rs`: the pump, claims after a notification and the keeper.
//! - `queues.rs`: the owner side, `Queues` (reserve then read, settle, purge,
//!   persist).
//! - `checks.rs`: the invariants after every event, the drain's end, the failure
//!   report.

mod checks;
mod events;
mod flows;
mod pump;
mod queues;
mod world;

#[path = "../seeded/mod.rs"]
mod seeded;

use std::time::Duration;

use narad_shards::consume::inflight::Caps;

use world::{Pollers, Sim};

const SEEDS_DEFAULT: u64 = 200;

/// The broker's cadences (`src/consume/flow.rs`).
const KEEPER_INTERVAL_MS: u64 = 500;
const PURGE_INTERVAL_MS: u64 = 1_000;
/// `READ_RETRY_AFTER` (`src/consume/waiters.rs`): a failed read's topic is
/// served again after this long.
const READ_RETRY_AFTER_MS: u64 = 1_000;
const RENEW_AFTER: Duration = Duration::from_secs(5);
/// The persister writes changed partitions about once per tick.
const PERSIST_INTERVAL_MS: u64 = 100;

/// One way across the mesh, and the wait of a woken task for its turn.
const MESH_DELAY_MAX_MS: u64 = 15;
const TASK_DELAY_MAX_MS: u64 = 2;
/// One seed in this many is calm: no crash and no mesh stall, so the lost-wake
/// bound, relaxed for seconds after either, holds throughout.
const CALM_ONE_IN: u32 = 3;
/// Ticks in this many, per mille, start a read fault on a random partition
/// (not in calm seeds): its reads fail for a time drawn from
/// [`READ_FAULT_MS`].
const READ_FAULT_PER_MILLE: u32 = 1;
const READ_FAULT_MS: std::ops::Range<u64> = 50..1_500;
/// One mesh message in this many stalls its pair, for a delay drawn from
/// [`MESH_STALL_MS`]: beyond the claim deadline (500 ms) and back.
const MESH_STALL_ONE_IN: u32 = 100;
const MESH_STALL_MS: std::ops::Range<u64> = 200..1_500;
/// Events a failure prints, the latest.
const TRACE_EVENTS_MAX: usize = 200;
/// The workload generator's step.
const TICK_MS: u64 = 10;

/// Simulated time with producers and crashes, then the drain's limit.
const RUN_MS: u64 = 12_000;
const DRAIN_MS_MAX: u64 = 120_000;
const RECORDS_PER_PARTITION_MAX: u64 = 80;
const WAIT_MS_MAX: u64 = 9_000;
/// Ticks of the drain that bring a consumer, per mille.
const DRAIN_ARRIVE_PER_MILLE: u32 = 60;

/// How long a parked consumer may wait for a record that is available somewhere:
/// the keeper's interval plus register, pump, notify, pump, claim and answer,
/// where a pump may wait for its topic's task before it (a pump, the task that
/// ends, a pump, the task that serves).
const NO_LOST_WAKE_MS: u64 = KEEPER_INTERVAL_MS + 4 * MESH_DELAY_MAX_MS + 8 * TASK_DELAY_MAX_MS;
/// After a crash, the keeper renews every registration within this long; the
/// same after a mesh stall ends (a notification stuck in it spent the token
/// while its shard still counted the registration as live).
const AFTER_CRASH_MS: u64 = 5_000 + KEEPER_INTERVAL_MS + 500;

/// Caps no workload reaches: every record of a partition can be leased at once.
const CAPS_LARGE: Caps = Caps {
    in_flight_max: 4_096,
    acked_ahead_max: 4_096,
};
const _: () = assert!(CAPS_LARGE.in_flight_max as u64 > 2 * 6 * RECORDS_PER_PARTITION_MAX);
/// One topic in this many has small caps (a few leases, a few acks ahead), so
/// consumers find tables full with records waiting, and an ack that makes room
/// must wake them (`Queues::settle`).
const SMALL_CAPS_ONE_IN: u32 = 3;
const SMALL_CAPS_MAX: usize = 6;

/// Seeds of the fairness scenario by default.
const FAIR_SEEDS_DEFAULT: u64 = 20;

/// Consumers parked on a shard that owns none of the topic's partitions take
/// their turn beside the owners' own consumers: the tokens their shard left
/// stand in the owners' order by arrival, and a record promised to their claim
/// is held for it. Four shards, two consumers always waiting on each: every
/// shard, the one without partitions too, gets at least half of its fair
/// quarter.
#[test]
fn consumers_on_a_shard_without_partitions_get_their_turn() {
    seeded::run(
        "fair consume simulation",
        "consume_sim",
        FAIR_SEEDS_DEFAULT,
        |seed| fair_shares(seed, None, 1),
    );
}

/// Consumers that do not wait (`wait=0`), arriving on an owner every few
/// milliseconds, take from its partitions and probe the other owners: each
/// takes only what the consumers waiting before it leave (parked on the
/// owner, or on other shards through their tokens and promises), so the
/// pollers' shard gets no more than its turn, and every other shard its own.
#[test]
fn polling_consumers_wait_their_turn() {
    seeded::run(
        "fair consume simulation with pollers",
        "consume_sim",
        FAIR_SEEDS_DEFAULT,
        |seed| fair_shares(seed, Some(Pollers::On(0)), 1),
    );
}

/// The same with pinned pollers on every owner, each pinned to its shard's
/// partition: the waiting and the promises are the topic's, so a pinned
/// consumer takes only what leaves enough on the shard for them.
#[test]
fn pinned_pollers_wait_their_turn() {
    seeded::run(
        "fair consume simulation with pinned pollers",
        "consume_sim",
        FAIR_SEEDS_DEFAULT,
        |seed| fair_shares(seed, Some(Pollers::PinnedOnOwners), 1),
    );
}

/// The same with batches: consumers asking for up to 4 records each (the
/// pollers on one owner too), and records committed up to 4 at a time. A
/// claim takes its own record and what is not promised to other claims.
#[test]
fn batch_consumers_take_their_turn() {
    seeded::run(
        "fair consume simulation with batches",
        "consume_sim",
        FAIR_SEEDS_DEFAULT,
        |seed| fair_shares(seed, Some(Pollers::On(0)), 4),
    );
}

/// Runs the fairness scenario: every shard, the one without partitions (3)
/// too, gets at least half of its fair quarter, pollers or not; the owners'
/// own consumers must not be starved in its favour either; and no claim
/// comes back empty.
fn fair_shares(
    seed: u64,
    pollers: Option<Pollers>,
    batch_max: usize,
) -> std::collections::BTreeMap<&'static str, u64> {
    let mut sim = Sim::fair(seed, pollers, batch_max);
    sim.run();
    let per_shard = sim.delivered_per_shard.clone();
    let total: u64 = per_shard.iter().sum();
    assert!(total >= 100, "seed {seed}: only {total} records delivered");
    // Consumers take records in the order they came: pollers, arriving
    // between a commit and the pump, take only what the consumers waiting
    // before them leave, so they tip no shard's share.
    for (s, &got) in per_shard.iter().enumerate() {
        assert!(
            got * 8 >= total,
            "seed {seed}: shard {s} got {got} of {total} records ({per_shard:?})"
        );
    }
    // A record promised to a claim is held for it: in a calm run (no crash,
    // no mesh stall) every claim arrives well before its deadline and finds
    // its record.
    let empty = sim.stats.get("empty claims").copied().unwrap_or(0);
    assert_eq!(empty, 0, "seed {seed}: claims came back empty");
    sim.stats.insert("delivered before the drain", total);
    sim.stats
        .insert("delivered on the shard without partitions", per_shard[3]);
    sim.stats
}

/// Parked consumers whose records could not be read (a faulty disk) are
/// served again once the reads work: the failed read asked for a retry,
/// and in this scenario nothing else (no produce, no arrival) comes to
/// wake them.
#[test]
fn a_failed_read_serves_its_consumers_again_after_the_pause() {
    seeded::run(
        "read fault consume simulation",
        "consume_sim",
        FAIR_SEEDS_DEFAULT,
        |seed| {
            let mut sim = Sim::faulty_reads(seed);
            sim.run();
            assert!(
                sim.stats.get("failed reads").is_some_and(|&n| n > 0),
                "seed {seed}: no read failed"
            );
            sim.stats
        },
    );
}

#[test]
fn parked_consumers_get_every_record_across_shards() {
    seeded::run("consume simulation", "consume_sim", SEEDS_DEFAULT, |seed| {
        let mut sim = Sim::new(seed);
        sim.run();
        sim.stats
    });
}
