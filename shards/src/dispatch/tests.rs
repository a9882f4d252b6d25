//! Unit tests of single dispatcher rules, each driven by hand with explicit time.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::*;

const INC: IncarnationId = IncarnationId(7);

struct TestCluster {
    partitions: u32,
    incarnation: IncarnationId,
    owners: BTreeMap<u32, OwnerId>,
    dead: Vec<u32>,
    /// The topic was deleted: its name resolves to nothing.
    deleted: bool,
}

impl TestCluster {
    fn new(partitions: u32) -> Self {
        let owners = (0..partitions)
            .map(|p| (p, OwnerId { node: p, shard: 0 }))
            .collect();
        Self {
            partitions,
            incarnation: INC,
            owners,
            dead: Vec::new(),
            deleted: false,
        }
    }
}

impl Cluster for TestCluster {
    fn topic(&self, name: &str) -> Option<TopicMeta> {
        (name == "t" && !self.deleted).then_some(TopicMeta {
            incarnation: self.incarnation,
            partitions: self.partitions,
        })
    }
    fn owner(&self, _: &str, partition: PartitionId) -> Option<OwnerId> {
        if self.deleted {
            return None;
        }
        self.owners.get(&partition.0).copied()
    }
    fn is_alive(&self, owner: OwnerId) -> bool {
        !self.dead.contains(&owner.node)
    }
    fn is_local(&self, owner: OwnerId) -> bool {
        owner.node == 0
    }
}

struct Harness {
    d: Dispatcher,
    c: TestCluster,
    t0: Instant,
    wal: Vec<(u32, IncarnationId)>,
    reader: Seq,
    /// Records the dispatcher asked to be fed, ever.
    fed: usize,
}

impl Harness {
    fn new(partitions: u32) -> Self {
        let t0 = Instant::now();
        Self {
            d: Dispatcher::new(DispatchConfig::default(), Seq(0), t0),
            c: TestCluster::new(partitions),
            t0,
            wal: Vec::new(),
            reader: Seq(0),
            fed: 0,
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    /// Appends records and reads everything readable, then ticks; returns actions.
    fn produce(&mut self, ms: u64, partitions: &[u32]) -> Vec<Action> {
        self.wal.extend(partitions.iter().map(|&p| (p, INC)));
        self.read(ms)
    }

    fn read(&mut self, ms: u64) -> Vec<Action> {
        let mut actions = Vec::new();
        loop {
            let new = self.step(ms, usize::MAX);
            let seek = new.iter().find_map(|a| match a {
                Action::Seek(s) => Some(*s),
                _ => None,
            });
            actions.extend(new);
            if seek.is_none() {
                return actions;
            }
        }
    }

    /// Reads at most `n` records at `ms`, then ticks; follows a seek and returns
    /// where it went.
    fn read_some(&mut self, ms: u64, n: usize) -> Option<Seq> {
        self.step(ms, n).into_iter().find_map(|a| match a {
            Action::Seek(s) => Some(s),
            _ => None,
        })
    }

    /// Visits at most `n` records at `ms` (fewer if the budget runs out), ticks,
    /// moves the reader to any seek, and returns the actions.
    fn step(&mut self, ms: u64, n: usize) -> Vec<Action> {
        let now = self.at(ms);
        let mut visited = 0;
        while visited < n && (self.reader.0 as usize) < self.wal.len() && self.d.read_budget() > 0 {
            visited += 1;
            let seq = self.reader;
            self.reader = seq.next();
            if self.d.visit(seq) {
                self.fed += 1;
                let (p, incarnation) = self.wal[seq.0 as usize];
                let record = RecordRead {
                    seq,
                    topic: "t",
                    incarnation,
                    partition: PartitionId(p),
                    encoded_bytes: 100,
                };
                self.d.handle(now, Event::Record(record), &self.c);
            }
        }
        self.d.handle(now, Event::Tick, &self.c);
        let actions: Vec<Action> = self.d.drain_actions().collect();
        if let Some(s) = actions.iter().find_map(|a| match a {
            Action::Seek(s) => Some(*s),
            _ => None,
        }) {
            self.reader = s;
        }
        actions
    }

    /// The leader confirms incarnation `INC` gone at `ms`; follows the rescan
    /// that brings and returns its actions.
    fn confirm_gone(&mut self, ms: u64) -> Vec<Action> {
        let gone = Event::GoneAnswer {
            topic: "t",
            incarnation: INC,
            gone: true,
        };
        self.d.handle(self.at(ms), gone, &self.c);
        let seek = self.d.drain_actions().find_map(|a| match a {
            Action::Seek(s) => Some(s),
            _ => None,
        });
        self.reader = seek.expect("confirmation brings a rescan");
        self.read(ms)
    }

    fn answer(&mut self, ms: u64, commit: CommitId, outcome: CommitOutcome) -> Vec<Action> {
        let now = self.at(ms);
        self.d
            .handle(now, Event::CommitDone { commit, outcome }, &self.c);
        let mut actions: Vec<Action> = self.d.drain_actions().collect();
        if actions.iter().any(|a| matches!(a, Action::Seek(_))) || self.d.read_budget() > 0 {
            if let Some(Action::Seek(s)) = actions.iter().find(|a| matches!(a, Action::Seek(_))) {
                self.reader = *s;
            }
            actions.extend(self.read(ms));
        }
        self.d.assert_invariants();
        actions
    }
}

fn commits(actions: &[Action]) -> Vec<(CommitId, u32, Vec<u64>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::StartCommit {
                commit,
                partition,
                seqs,
                ..
            } => Some((*commit, partition.0, seqs.iter().map(|s| s.0).collect())),
            _ => None,
        })
        .collect()
}

#[test]
fn one_commit_in_flight_per_destination_and_batching_by_queueing() {
    let mut h = Harness::new(2);
    let first = commits(&h.produce(0, &[0, 0]));
    assert_eq!(first.len(), 1, "an idle dispatcher commits at once");
    assert_eq!(first[0].2, vec![0, 1]);
    assert!(
        commits(&h.produce(1, &[0, 0, 0])).is_empty(),
        "one commit in flight per partition"
    );
    let next = commits(&h.answer(5, first[0].0, CommitOutcome::Committed));
    assert_eq!(
        next[0].2,
        vec![2, 3, 4],
        "what queued meanwhile goes as the next batch"
    );
    assert_eq!(h.d.checkpoint(), Seq(2));
}

#[test]
fn small_batch_lingers_while_other_commits_run() {
    let mut h = Harness::new(2);
    // Measure partition 1's owner at 10 ms, then keep partition 0 busy.
    let c1 = commits(&h.produce(0, &[1]))[0].0;
    h.answer(10, c1, CommitOutcome::Committed);
    let busy = commits(&h.produce(10, &[0]));
    assert_eq!(busy.len(), 1);
    assert!(
        commits(&h.produce(11, &[1])).is_empty(),
        "lingers: another commit is in flight"
    );
    assert_eq!(
        h.d.next_deadline(),
        Some(h.at(31)),
        "twice the owner's 10 ms latency"
    );
    let late = commits(&h.read(31));
    assert_eq!(late.len(), 1, "the linger ends at twice the latency");
}

#[test]
fn linger_is_capped() {
    let mut h = Harness::new(2);
    let c1 = commits(&h.produce(0, &[1]))[0].0;
    h.answer(400, c1, CommitOutcome::Committed);
    commits(&h.produce(400, &[0]));
    assert!(commits(&h.produce(400, &[1])).is_empty());
    assert_eq!(
        h.d.next_deadline(),
        Some(h.at(450)),
        "never longer than 50 ms"
    );
}

#[test]
fn window_sizes_itself_to_the_fan_out() {
    let config = DispatchConfig::default();
    assert_eq!(config.window_records(1), 4_096);
    assert_eq!(config.window_records(100), 6_400);
    assert_eq!(config.window_records(10_000), 65_536);
    assert_eq!(config.queue_records_max(4_096), 4_096);
    assert_eq!(config.queue_records_max(65_536), 16_384);
    assert_eq!(
        config.held_records_max(4_096),
        16_384,
        "at least four destinations' worth"
    );
    let mut h = Harness::new(1);
    let c = commits(&h.produce(0, &[0]))[0].0;
    h.produce(1, &vec![0; 20_000]);
    assert_eq!(
        h.d.queued_records("t", PartitionId(0)),
        4_096,
        "the queue cap"
    );
    assert!(h.d.skipped_records() > 0);
    assert!(h.d.held_records() <= 16_384);
    h.answer(5, c, CommitOutcome::Committed);
}

#[test]
fn hung_commit_stops_counting_and_returns_what_queued_behind() {
    let mut h = Harness::new(2);
    let c = commits(&h.produce(0, &[0]))[0].0;
    h.produce(10, &[0, 0]);
    assert_eq!(h.d.queued_records("t", PartitionId(0)), 2);
    let actions = h.read(1_000);
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::Release { seqs } if seqs == &[Seq(1), Seq(2)])));
    assert_eq!(h.d.commits_in_flight(), (1, 1));
    assert!(
        commits(&h.produce(1_001, &[0])).is_empty(),
        "a hung destination takes nothing"
    );
    let after = h.answer(1_500, c, CommitOutcome::Committed);
    assert_eq!(
        commits(&after)[0].2,
        vec![1, 2, 3],
        "re-read in WAL order once it lands"
    );
}

/// Records that arrive for a hung destination are skipped; when its commit
/// lands they are read again at once, not at the next backstop.
#[test]
fn records_skipped_behind_a_hung_commit_come_back_as_it_lands() {
    let mut h = Harness::new(2);
    let c = commits(&h.produce(0, &[0]))[0].0;
    h.produce(10, &[0]);
    h.read(1_000);
    assert_eq!(h.d.commits_in_flight(), (1, 1), "in flight, hung");
    assert!(commits(&h.produce(1_001, &[0, 0])).is_empty());
    let after = h.answer(1_050, c, CommitOutcome::Committed);
    assert_eq!(
        commits(&after).first().map(|c| c.2.clone()),
        Some(vec![1, 2, 3]),
        "re-read as the hung commit landed"
    );
}

#[test]
fn failed_commit_keeps_a_probe_and_retries_it_once_a_second() {
    let mut h = Harness::new(2);
    let c = commits(&h.produce(0, &[0, 0, 0]))[0].0;
    let actions = h.answer(10, c, CommitOutcome::Failed);
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::Release { seqs } if seqs == &[Seq(1), Seq(2)])));
    assert!(commits(&actions).is_empty());
    let probe = commits(&h.read(1_010));
    assert_eq!(probe.len(), 1);
    assert_eq!(probe[0].2, vec![0], "the probe is one record");
    assert!(h.d.drain_actions().next().is_none());
    let back = h.answer(1_020, probe[0].0, CommitOutcome::Committed);
    assert_eq!(
        commits(&back)[0].2,
        vec![1, 2],
        "recovered: the rest comes back in order"
    );
}

#[test]
fn reroutes_to_the_next_live_sibling_after_three_seconds_of_failures() {
    let mut h = Harness::new(3);
    let c = commits(&h.produce(0, &[1]))[0].0;
    h.answer(10, c, CommitOutcome::Failed);
    let p = commits(&h.read(1_010))[0].0;
    h.answer(1_020, p, CommitOutcome::Failed);
    assert!(
        commits(&h.produce(2_000, &[1])).is_empty(),
        "before the grace: skipped"
    );
    let p = commits(&h.read(2_020))[0].0;
    let mut all = h.answer(2_999, p, CommitOutcome::Failed);
    assert!(
        commits(&all).is_empty(),
        "2.999 s after the first failed attempt: not yet"
    );
    // The next rescan (at most a second later) reroutes; the probe stays on 1.
    all.extend(h.read(4_000));
    let started = commits(&all);
    assert!(
        started
            .iter()
            .any(|(_, part, seqs)| *part == 2 && seqs == &vec![1]),
        "{started:?}"
    );
    assert!(
        started
            .iter()
            .any(|(_, part, seqs)| *part == 1 && seqs == &vec![0]),
        "{started:?}"
    );
}

#[test]
fn dead_owner_reroutes_at_once_wrapping_around() {
    let mut h = Harness::new(3);
    h.c.dead.push(2);
    let moved = commits(&h.produce(0, &[2]));
    assert_eq!(moved.len(), 1);
    assert_eq!(
        moved[0].1, 0,
        "the next partition, counting up and wrapping"
    );
}

#[test]
fn incarnation_mismatch_returns_records_without_failing_or_rerouting() {
    let mut h = Harness::new(2);
    let c = commits(&h.produce(0, &[0]))[0].0;
    h.produce(1, &[0]);
    let actions = h.answer(5, c, CommitOutcome::IncarnationMismatch);
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::Release { seqs } if seqs == &[Seq(0), Seq(1)])));
    assert!(
        commits(&actions).is_empty(),
        "waits for the rescan, not rerouted"
    );
    let again = commits(&h.read(1_005));
    assert_eq!(again[0].1, 0, "same partition, not failing");
    assert_eq!(again[0].2, vec![0, 1]);
}

#[test]
fn replaced_incarnation_is_discarded_only_after_confirmation() {
    let mut h = Harness::new(1);
    h.c.incarnation = IncarnationId(8);
    let actions = h.produce(0, &[0]);
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::AskGone { incarnation, .. } if *incarnation == INC)));
    assert_eq!(h.d.checkpoint(), Seq(0));
    h.d.handle(
        h.at(5),
        Event::GoneAnswer {
            topic: "t",
            incarnation: INC,
            gone: false,
        },
        &h.c,
    );
    assert!(
        !h.read(6)
            .iter()
            .any(|a| matches!(a, Action::Discard { .. })),
        "unconfirmed: kept"
    );
    let actions = h.confirm_gone(10);
    assert!(actions.iter().any(|a| matches!(a, Action::Discard { .. })));
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::StoreCheckpoint(Seq(1)))));
}

#[test]
fn records_queued_for_a_deleted_topic_go_back_and_are_discarded_once_confirmed() {
    let mut h = Harness::new(1);
    let first = commits(&h.produce(0, &[0, 0]));
    assert_eq!(first[0].2, vec![0, 1]);
    assert!(commits(&h.produce(1, &[0, 0])).is_empty(), "queued behind");
    // The topic is deleted while 2 and 3 wait; the commit in flight lands.
    h.c.deleted = true;
    let mut actions = h.answer(5, first[0].0, CommitOutcome::Committed);
    for ms in [20, 40, 1_100] {
        actions.extend(h.read(ms));
    }
    assert!(
        commits(&actions).is_empty(),
        "nothing commits to a deleted topic"
    );
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::AskGone { incarnation, .. } if *incarnation == INC)),
        "the queued records go back to be checked: {actions:?}"
    );
    let actions = h.confirm_gone(1_200);
    let discarded: Vec<u64> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Discard { seqs, .. } => Some(seqs.iter().map(|s| s.0)),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(discarded, vec![2, 3]);
    assert_eq!(h.d.checkpoint(), Seq(4), "the checkpoint moves past them");
}

#[test]
fn skipped_records_come_back_in_wal_order() {
    let mut h = Harness::new(2);
    let c = commits(&h.produce(0, &[0, 0, 1, 0]))[0].0;
    h.answer(10, c, CommitOutcome::Failed);
    // 1 and 3 went back to the WAL; 4 must wait behind them even though it is new.
    h.produce(20, &[0]);
    let probe = commits(&h.read(1_010));
    let p0 = probe.iter().find(|(_, part, _)| *part == 0).expect("probe");
    let back = commits(&h.answer(1_020, p0.0, CommitOutcome::Committed));
    let p0 = back
        .iter()
        .find(|(_, part, _)| *part == 0)
        .expect("recovered");
    assert_eq!(p0.2, vec![1, 3, 4]);
}

#[test]
fn checkpoint_never_passes_a_record_in_flight() {
    let mut h = Harness::new(2);
    let a = commits(&h.produce(0, &[0, 1]));
    assert_eq!(a.len(), 2);
    let later = h.answer(5, a[1].0, CommitOutcome::Committed);
    assert!(!later
        .iter()
        .any(|x| matches!(x, Action::StoreCheckpoint(_))));
    assert_eq!(h.d.checkpoint(), Seq(0));
    let done = h.answer(6, a[0].0, CommitOutcome::Committed);
    assert!(done
        .iter()
        .any(|x| matches!(x, Action::StoreCheckpoint(Seq(2)))));
}

#[test]
fn a_deleted_topic_is_forgotten_once_idle_and_asked_about_again_if_seen() {
    let mut h = Harness::new(1);
    h.c.deleted = true;
    h.produce(0, &[0]);
    let discarded = h
        .confirm_gone(10)
        .iter()
        .any(|a| matches!(a, Action::Discard { .. }));
    assert!(discarded);
    // Still in use while its records keep coming.
    h.produce(9_000, &[0]);
    h.read(12_000);
    assert!(h.d.topics.contains_key("t"), "used 3 s ago: remembered");
    h.read(19_100);
    assert!(
        h.d.topics.is_empty(),
        "idle past the forget interval: nothing kept for the name"
    );
    // A record of it read later is asked about again, never passed on unasked.
    let actions = h.produce(20_000, &[0]);
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::AskGone { incarnation, .. } if *incarnation == INC)));
    assert!(!actions.iter().any(|a| matches!(a, Action::Discard { .. })));
}

#[test]
fn the_backstop_never_restarts_a_pass_that_is_moving() {
    // Ten records of partitions the topic does not have: skipped on every pass,
    // each a partition of its own, so a pass has one to place up to its end.
    let mut h = Harness::new(1);
    h.produce(0, &[5, 6, 7, 8, 9, 10, 11, 12, 13, 14]);
    assert_eq!(h.read_some(1_000, 0), Some(Seq(0)), "the backstop is due");
    // A pass slower than the backstop interval, one record every 300 ms.
    for (i, ms) in (1_000..4_000).step_by(300).take(10).enumerate() {
        assert_eq!(
            h.read_some(ms, 1),
            None,
            "record {i} at {ms} ms: a moving pass is not restarted"
        );
    }
    assert_eq!(h.reader, Seq(10), "the pass reached the frontier");
    // The next pass is due an interval after this one ended (at 3,700 ms).
    assert_eq!(h.read_some(4_600, 0), None);
    assert_eq!(h.read_some(4_700, 0), Some(Seq(0)));
    // A pass that stops moving is restarted an interval after its last step.
    assert_eq!(h.read_some(4_800, 3), None);
    assert_eq!(h.read_some(5_700, 0), None);
    assert_eq!(h.read_some(5_800, 0), Some(Seq(0)));
}

#[test]
fn a_rescan_ends_once_every_partition_it_could_place_for_is_blocked_again() {
    // Partition 0's commit fails: its 1,000 records go back to the WAL.
    let mut h = Harness::new(2);
    let first = commits(&h.produce(0, &[0; 1_000]));
    h.answer(10, first[0].0, CommitOutcome::Failed);
    h.d.assert_invariants();
    // The failed commit kept its first record as the probe. The backstop pass
    // skips the second, which blocks partition 0 again: nothing past it can be
    // placed, so the pass reads no further.
    let fed = h.fed;
    let probe = commits(&h.read(1_010));
    assert_eq!(probe.len(), 1);
    assert_eq!(probe[0].2, vec![0]);
    assert_eq!(h.fed - fed, 1, "the pass stops at the record it skipped");
    assert_eq!(h.reader, Seq(1_000), "the reader goes back to the frontier");
    h.d.assert_invariants();
    // New records of the other partition are read at once.
    let other = commits(&h.produce(1_020, &[1]));
    assert_eq!(other.len(), 1);
    assert_eq!(other[0].2, vec![1_000]);
    h.answer(1_025, other[0].0, CommitOutcome::Committed);
    // The probe lands: a pass brings partition 0's records back, in WAL order.
    let mut next = commits(&h.answer(1_030, probe[0].0, CommitOutcome::Committed));
    let mut placed = vec![0];
    let mut ms = 1_040;
    while let Some((commit, partition, seqs)) = next.pop() {
        if partition == 0 {
            placed.extend(seqs);
        }
        next.extend(commits(&h.answer(ms, commit, CommitOutcome::Committed)));
        ms += 10;
    }
    assert_eq!(placed, (0..1_000).collect::<Vec<u64>>());
    assert_eq!(h.d.checkpoint(), Seq(1_001));
    assert_eq!(h.d.skipped_records(), 0);
}

/// A dispatcher resumed with `done` records left done above checkpoint 0 (whose
/// own record is not done).
fn resumed(partitions: u32, done: u64) -> Harness {
    let mut h = Harness::new(partitions);
    let progress = DispatchProgress::resume(Seq(0), (0..=done).map(|i| i != 0)).expect("valid");
    h.d = Dispatcher::resume(DispatchConfig::default(), progress, h.t0);
    h
}

#[test]
fn a_resumed_checkpoint_jumps_past_the_frontier_once_its_record_lands() {
    let n = 200_000u64;
    let mut h = resumed(2, n);
    h.wal.extend((0..n + 3).map(|i| ((i % 2) as u32, INC)));
    // Only the checkpoint's record is read before its commit lands.
    let first = commits(&h.step(0, 1));
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].2, [0]);
    let landed = Event::CommitDone {
        commit: first[0].0,
        outcome: CommitOutcome::Committed,
    };
    h.d.handle(h.at(1), landed, &h.c);
    assert_eq!(
        h.d.checkpoint(),
        Seq(n + 1),
        "every record left done is passed"
    );
    // Before the reader moves: the frontier is not left below the checkpoint.
    h.d.assert_invariants();
    let mut rest = commits(&h.read(1));
    rest.extend(commits(&h.step(1_000, usize::MAX)));
    let mut sent: Vec<u64> = rest.into_iter().flat_map(|c| c.2).collect();
    sent.sort_unstable();
    assert_eq!(sent, [n + 1, n + 2], "only the records after them are sent");
    assert_eq!(h.fed, 3);
}

/// A run of records left done longer than the base window's lookahead, above
/// a checkpoint whose partition keeps failing: the reader goes past it to
/// what was produced after, as it would after committing them again.
#[test]
fn a_long_run_left_done_does_not_hold_the_reader_back() {
    let (partitions, n) = (64u32, 100_000u64);
    let mut h = resumed(partitions, n);
    h.wal.push((0, INC));
    let after = 20_000;
    h.wal.extend(
        (1..n + after)
            .map(|i| (1 + (i % u64::from(partitions - 1))) as u32)
            .map(|p| (p, INC)),
    );
    let mut actions = h.read(0);
    for ms in (5..6_000).step_by(5) {
        let mut next = Vec::new();
        for (id, p, _) in commits(&actions) {
            let outcome = match p {
                0 => CommitOutcome::Failed,
                _ => CommitOutcome::Committed,
            };
            next.extend(h.answer(ms, id, outcome));
        }
        next.extend(h.step(ms, usize::MAX));
        actions = next;
    }
    assert_eq!(h.d.reader_position(), Seq(n + after));
    assert_eq!(h.d.checkpoint(), Seq(0), "partition 0 still fails");
    assert_eq!(h.fed as u64, after, "records left done are not fed");
}
