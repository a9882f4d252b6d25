//! Starting commits and handling their outcomes.
//!
//! Starting: destinations are served oldest record first while fewer than
//! `commits_in_flight_max` commits count. A destination with fewer than the target
//! records lingers while other commits are in flight, until twice its owner's
//! moving-average latency has passed since its oldest queued record, at most the
//! linger cap; an idle dispatcher, an unmeasured owner and a probe go at once. A
//! remote commit carries at most the byte budget, and always one record. Records
//! whose incarnation was replaced meanwhile, and what queued behind them, go back to
//! the WAL just before the batch leaves.
//!
//! Outcomes: a commit that lands marks its records done. A failed one keeps its
//! first record as the probe (retried once per backoff on the probe budget) and
//! returns the rest to the WAL. An incarnation mismatch returns everything to the
//! WAL without marking the destination failing. A commit in flight past the hung
//! threshold stops counting and returns what queued behind it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::rc::Rc;
use std::time::Instant;

use super::destination::{Failing, Held};
use super::dispatcher::Commit;
use super::{Action, Cluster, CommitId, CommitOutcome, Dispatcher, OwnerId};
use crate::ids::{PartitionId, Seq};

/// What a ready destination does now.
enum Gate {
    Go(OwnerId),
    WaitUntil(Instant),
    /// Its owner is dead: its records went back to the WAL to be rerouted.
    Rerouted,
}

impl Dispatcher {
    /// Starts every commit that may start now.
    pub(super) fn pump(&mut self, now: Instant, cluster: &impl Cluster) {
        let commits_max = self.config.commits_in_flight_max + self.config.commits_hung_max;
        let slot_free = |d: &Dispatcher| {
            d.commits_counting < d.config.commits_in_flight_max && d.commits.len() < commits_max
        };
        // With every slot taken nothing can start: skip the walk over every
        // destination, which many partitions make the costly part.
        if !slot_free(self) {
            return;
        }
        let mut ready: BinaryHeap<Reverse<(Seq, Rc<str>, PartitionId)>> = self
            .topics
            .iter()
            .flat_map(|(topic, state)| {
                state.partitions.iter().filter_map(|(partition, d)| {
                    match (d.in_flight, d.queue.front()) {
                        (None, Some(front)) => {
                            Some(Reverse((front.seq, Rc::clone(topic), *partition)))
                        }
                        _ => None,
                    }
                })
            })
            .collect();
        // Oldest first, and only as far as the free slots reach (a lingering
        // destination takes none, so how many are looked at is not known ahead).
        while slot_free(self) {
            let Some(Reverse((_, topic, partition))) = ready.pop() else {
                break;
            };
            self.try_start(now, &topic, partition, cluster);
        }
    }

    fn try_start(
        &mut self,
        now: Instant,
        topic: &Rc<str>,
        partition: PartitionId,
        cluster: &impl Cluster,
    ) {
        match self.commit_gate(now, topic, partition, cluster) {
            Gate::Go(owner) => {
                let probe = self.dest_mut(topic, partition).failing.is_some();
                self.start(
                    now,
                    topic,
                    partition,
                    owner,
                    !cluster.is_local(owner),
                    probe,
                );
            }
            Gate::WaitUntil(at) => {
                assert!(at > now, "a destination waits for a time already past");
                self.dest_mut(topic, partition).retry_at = Some(at);
            }
            Gate::Rerouted => {}
        }
    }

    /// Whether a ready destination commits now, and to whom.
    fn commit_gate(
        &mut self,
        now: Instant,
        topic: &Rc<str>,
        partition: PartitionId,
        cluster: &impl Cluster,
    ) -> Gate {
        self.dest_mut(topic, partition).retry_at = None;
        // Records of another incarnation than the live one, or of a topic gone
        // from the metadata, go back to the WAL (with everything queued behind
        // them, to keep the partition's order): placement checks them again and
        // discards them once their incarnation is confirmed gone. Checked before
        // the owner, since a deleted topic has none: waiting for one would hold
        // them, and the checkpoint behind them, forever.
        let live = cluster.topic(topic).map(|m| m.incarnation);
        let d = self.dest_mut(topic, partition);
        if let Some(stale) = d.queue.iter().position(|h| Some(h.incarnation) != live) {
            let back: Vec<Held> = d.queue.drain(stale..).collect();
            let emptied = d.queue.is_empty();
            self.held_counting -= back.len();
            self.return_to_wal(now, topic, back);
            if emptied {
                return Gate::Rerouted;
            }
        }
        let Some(owner) = cluster.owner(topic, partition) else {
            return Gate::WaitUntil(now + self.config.owner_lookup_interval);
        };
        let others_in_flight = self.commits_counting > 0;
        let latency = self.latency.get(&owner).copied();
        let (target, linger_max) = (
            self.config.target_records_per_destination,
            self.config.linger_max,
        );
        let d = self.dest_mut(topic, partition);
        if !cluster.is_alive(owner) {
            // Membership says the owner is dead: reroute at once, through the WAL.
            let back: Vec<Held> = d.queue.drain(..).collect();
            self.held_counting -= back.len();
            self.return_to_wal(now, topic, back);
            self.rescan_wanted = true;
            return Gate::Rerouted;
        }
        if let Some(failing) = d.failing {
            if now < failing.next_probe_at {
                return Gate::WaitUntil(failing.next_probe_at);
            }
        } else if let (true, true, Some(latency)) =
            (others_in_flight, d.queue.len() < target, latency)
        {
            let oldest = d
                .queue
                .front()
                .expect("ready destinations hold records")
                .placed_at;
            let until = oldest + (latency * 2).min(linger_max);
            if now < until {
                return Gate::WaitUntil(until);
            }
        }
        Gate::Go(owner)
    }

    fn start(
        &mut self,
        now: Instant,
        topic: &Rc<str>,
        partition: PartitionId,
        owner: OwnerId,
        remote: bool,
        probe: bool,
    ) {
        let bytes_max = self.config.remote_commit_bytes_max;
        let cap = self.config.queue_records_max(self.window_records);
        let id = CommitId(self.commit_next);
        let d = self.dest_mut(topic, partition);
        if d.queue.is_empty() {
            return;
        }
        let mut bytes = 0u64;
        let mut count = 0;
        for held in &d.queue {
            let next = bytes + u64::from(held.encoded_bytes);
            if remote && count > 0 && next > bytes_max {
                break;
            }
            bytes = next;
            count += 1;
        }
        assert!(
            count >= 1 && (!probe || count == 1),
            "a probe carries one record"
        );
        let records: Vec<Held> = d.queue.drain(..count).collect();
        d.in_flight = Some(id);
        d.last_active = now;
        if d.turned_away && !d.turns_away(cap) {
            d.turned_away = false;
            self.rescan_wanted = true;
        }
        self.commit_next += 1;
        self.commits_counting += 1;
        self.actions.push_back(Action::StartCommit {
            commit: id,
            topic: Rc::clone(topic),
            partition,
            owner,
            seqs: records.iter().map(|h| h.seq).collect(),
            budget: if probe {
                self.config.probe_budget
            } else {
                self.config.commit_budget
            },
        });
        let commit = Commit {
            topic: Rc::clone(topic),
            partition,
            owner,
            records,
            started: now,
            hung: false,
        };
        assert!(self.commits.insert(id, commit).is_none());
    }

    /// A commit was answered (or ran out of budget). Unknown ids (answers to a
    /// commit already handled) are ignored.
    pub(super) fn commit_done(&mut self, now: Instant, id: CommitId, outcome: CommitOutcome) {
        let Some(commit) = self.commits.remove(&id) else {
            return;
        };
        let Commit {
            topic,
            partition,
            owner,
            records,
            started,
            hung,
        } = commit;
        if hung {
            self.commits_hung -= 1;
        } else {
            self.commits_counting -= 1;
            self.held_counting -= records.len();
        }
        let cap = self.config.queue_records_max(self.window_records);
        let backoff = self.config.failure_backoff;
        let d = self.dest_mut(&topic, partition);
        assert_eq!(d.in_flight, Some(id), "the destination's commit in flight");
        d.in_flight = None;
        d.hung = false;
        d.last_active = now;
        // Whether records this destination turned away can come back now.
        let mut rescan = d.turned_away && !d.turns_away(cap);
        if rescan {
            d.turned_away = false;
        }
        match outcome {
            CommitOutcome::Committed => {
                // A probe that lands ends the failure: what was turned away comes back.
                rescan |= d.failing.take().is_some();
                d.rerouting = false;
                for held in &records {
                    assert!(self.held.remove(&held.seq));
                }
                self.record_latency(owner, now.saturating_duration_since(started));
                self.mark_done(records.iter().map(|h| h.seq));
            }
            CommitOutcome::IncarnationMismatch => {
                let mut back = records;
                let queued: Vec<Held> = d.queue.drain(..).collect();
                self.held_counting -= queued.len();
                back.extend(queued);
                self.return_to_wal(now, &topic, back);
            }
            CommitOutcome::Failed | CommitOutcome::NotOwner => {
                let since = d.failing.map_or(started, |f| f.since);
                d.failing = Some(Failing {
                    since,
                    next_probe_at: now + backoff,
                });
                let mut back = records;
                let probe = back.remove(0);
                let queued: Vec<Held> = d.queue.drain(..).collect();
                d.queue.push_back(probe);
                self.held_counting += 1;
                self.held_counting -= queued.len();
                back.extend(queued);
                self.return_to_wal(now, &topic, back);
            }
        }
        self.rescan_wanted |= rescan;
    }

    /// Commits in flight past the hung threshold stop counting, and what queued
    /// behind them goes back to the WAL.
    pub(super) fn detect_hung(&mut self, now: Instant) {
        let hung_after = self.config.hung_after;
        let newly_hung: Vec<CommitId> = self
            .commits
            .iter()
            .filter(|(_, c)| !c.hung && now.saturating_duration_since(c.started) >= hung_after)
            .map(|(id, _)| *id)
            .collect();
        for id in newly_hung {
            let commit = self.commits.get_mut(&id).expect("listed above");
            commit.hung = true;
            let (topic, partition, count) = (
                Rc::clone(&commit.topic),
                commit.partition,
                commit.records.len(),
            );
            self.commits_counting -= 1;
            self.commits_hung += 1;
            self.held_counting -= count;
            let d = self.dest_mut(&topic, partition);
            d.hung = true;
            d.retry_at = None;
            let back: Vec<Held> = d.queue.drain(..).collect();
            self.held_counting -= back.len();
            self.return_to_wal(now, &topic, back);
        }
    }

    /// Held records go back to the WAL: they become skipped, counted against the
    /// partition they were accepted for, and the next rescan reads them again.
    /// The caller has already taken them out of the window's count.
    pub(super) fn return_to_wal(&mut self, now: Instant, topic: &Rc<str>, records: Vec<Held>) {
        if records.is_empty() {
            return;
        }
        for held in &records {
            assert!(
                self.held.remove(&held.seq),
                "record {} returned but not held",
                held.seq
            );
            self.ensure_dest(topic, held.origin, now);
            self.change_skips(topic, held.origin, |origin| {
                origin.skipped_records += 1;
                origin.blocked_in_pass = true;
            });
            self.skipped_total += 1;
            let seq = held.seq;
            self.rescan_from = Some(self.rescan_from.map_or(seq, |s| s.min(seq)));
        }
        self.actions.push_back(Action::Release {
            seqs: records.iter().map(|h| h.seq).collect(),
        });
    }
}
