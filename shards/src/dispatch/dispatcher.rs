//! The [`Dispatcher`]: reader position, rescans, the checkpoint, ticks and
//! deadlines. Placement and commits are in `place` and `commit`.
//!
//! The reader is the driver's `WalReader`; this core tracks where it is
//! (`reader_pos`, moved by [`Dispatcher::visit`] and by [`Action::Seek`]) and how far
//! anything was ever read (`frontier`). A record below the frontier that is neither
//! held nor done is skipped, so a rescan needs no per-record mark beyond the held
//! set and the done-set: it seeks back to the lowest skipped record and the driver
//! passes over everything `visit` says needs no work.

use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::config::DESTINATIONS_MAX;
use super::destination::{Destination, Held};
use super::{Action, Cluster, CommitId, DispatchConfig, DispatchProgress, Event, OwnerId};
use crate::ids::{IncarnationId, PartitionId, Seq, SeqSet};

/// Per-topic state: its destinations and what the leader said about incarnations.
#[derive(Debug, Default)]
pub(super) struct TopicState {
    pub partitions: BTreeMap<PartitionId, Destination>,
    /// Incarnations the leader confirmed gone, newest last, each with when a
    /// record of it was last discarded (or the confirmation came). Forgotten after
    /// [`DispatchConfig::idle_forget_after`] unused: a record of it read later only
    /// asks the leader again, so a deleted name does not keep its state forever.
    pub gone: VecDeque<(IncarnationId, Instant)>,
    /// When each unanswered or unconfirmed question was last asked.
    pub asked: BTreeMap<IncarnationId, Instant>,
}

/// A commit in flight.
#[derive(Debug)]
pub(super) struct Commit {
    pub topic: Rc<str>,
    pub partition: PartitionId,
    pub owner: OwnerId,
    pub records: Vec<Held>,
    pub started: Instant,
    pub hung: bool,
}

/// The produce dispatcher of one ingress WAL. See the module docs.
#[derive(Debug)]
pub struct Dispatcher {
    pub(super) config: DispatchConfig,
    pub(super) progress: DispatchProgress,
    pub(super) checkpoint_stored: Seq,
    /// The sequence number the reader visits next.
    pub(super) reader_pos: Seq,
    /// The first sequence number never read.
    pub(super) frontier: Seq,
    /// The record `visit` asked for, and whether it is read again (below the frontier).
    pub(super) visiting: Option<(Seq, bool)>,
    pub(super) topics: BTreeMap<Rc<str>, TopicState>,
    pub(super) destinations: usize,
    pub(super) commits: BTreeMap<CommitId, Commit>,
    pub(super) commit_next: u64,
    /// Queued or in flight (hung included).
    pub(super) held: SeqSet,
    /// Queued, or in a commit in flight that is not hung: what the window bounds.
    pub(super) held_counting: usize,
    pub(super) commits_counting: usize,
    pub(super) commits_hung: usize,
    pub(super) window_records: usize,
    pub(super) skipped_total: u64,
    /// Every skipped record is at or above `min(rescan_from, reader_pos)`.
    pub(super) rescan_from: Option<Seq>,
    pub(super) rescan_wanted: bool,
    /// When the last pass started, moved on while it is moving: the backstop
    /// counts from the end of a pass, or from the last step of one that stalled.
    pub(super) rescan_last_at: Instant,
    /// Where the pass in progress was last seen; `None` when none is.
    pub(super) pass_seen_at: Option<Seq>,
    /// Destinations [`Destination::open_in_pass`]: once none is left, every record
    /// the pass has still to read would be skipped again, so the pass ends there.
    pub(super) open_in_pass: usize,
    /// A pass ended early inside a read: the reader is sent to `reader_pos` once
    /// the read is over.
    pub(super) seek_after_read: bool,
    /// The end of the records a graceful stop left done (see `resume`): the
    /// lookahead counts from here, not from the checkpoint, until the
    /// checkpoint passes it, so a long run of them above a checkpoint that
    /// still waits does not keep the reader from what follows.
    pub(super) resumed_end: Seq,
    /// Moving average of commit latency per owner.
    pub(super) latency: BTreeMap<OwnerId, Duration>,
    pub(super) actions: VecDeque<Action>,
}

/// Owners whose latency is tracked; an owner past this commits without lingering.
const OWNERS_TRACKED_MAX: usize = 4_096;

impl Dispatcher {
    /// A dispatcher resuming from the stored `checkpoint`: the reader starts there.
    pub fn new(config: DispatchConfig, checkpoint: Seq, now: Instant) -> Self {
        config.check();
        let window_records = config.window_base_records;
        Self {
            config,
            progress: DispatchProgress::new(checkpoint),
            checkpoint_stored: checkpoint,
            reader_pos: checkpoint,
            frontier: checkpoint,
            visiting: None,
            topics: BTreeMap::new(),
            destinations: 0,
            commits: BTreeMap::new(),
            commit_next: 0,
            held: SeqSet::default(),
            held_counting: 0,
            commits_counting: 0,
            commits_hung: 0,
            window_records,
            skipped_total: 0,
            rescan_from: None,
            rescan_wanted: false,
            rescan_last_at: now,
            pass_seen_at: None,
            open_in_pass: 0,
            seek_after_read: false,
            resumed_end: checkpoint,
            latency: BTreeMap::new(),
            actions: VecDeque::new(),
        }
    }

    /// A dispatcher resuming after a graceful stop from the progress it left
    /// ([`Dispatcher::progress_at_stop`]): the records above the checkpoint that
    /// were done before the stop are passed over as the reader meets them, not
    /// committed again.
    pub fn resume(config: DispatchConfig, progress: DispatchProgress, now: Instant) -> Self {
        let mut dispatcher = Self::new(config, progress.checkpoint(), now);
        dispatcher.resumed_end = Seq(progress.checkpoint().0 + progress.done_above().len() as u64);
        dispatcher.progress = progress;
        dispatcher
    }

    /// What a graceful stop leaves for the next start: the checkpoint and which
    /// records above it are done (committed, or discarded for good). Records
    /// held or skipped are not done: the next start commits them.
    #[cfg(not(feature = "broken-dispatched-skipped-as-done"))]
    pub fn progress_at_stop(&self) -> DispatchProgress {
        self.progress.clone()
    }

    /// Deliberately broken: records skipped (left in the WAL for a later pass)
    /// are left as done, as if passing over a record were finishing it. Exists
    /// only to show the simulations fail.
    #[cfg(feature = "broken-dispatched-skipped-as-done")]
    pub fn progress_at_stop(&self) -> DispatchProgress {
        let checkpoint = self.progress.checkpoint();
        let flags = (checkpoint.0..self.frontier.0).map(|s| {
            let seq = Seq(s);
            seq != checkpoint && (self.progress.is_done(seq) || !self.held.contains(&seq))
        });
        DispatchProgress::resume(checkpoint, flags).expect("within the read-ahead")
    }

    /// Feeds one event. Records do not start commits on their own: after a read
    /// batch the driver feeds a [`Event::Tick`], so one batch becomes one decision.
    pub fn handle(&mut self, now: Instant, event: Event<'_>, cluster: &impl Cluster) {
        match event {
            Event::Record(record) => {
                self.place(now, record, cluster);
                return self.end_pass_if_settled();
            }
            Event::CommitDone { commit, outcome } => self.commit_done(now, commit, outcome),
            Event::GoneAnswer {
                topic,
                incarnation,
                gone,
            } => self.gone_answer(now, topic, incarnation, gone),
            Event::Tick => self.tick(now),
        }
        self.end_pass_if_settled();
        if std::mem::take(&mut self.seek_after_read) {
            self.actions.push_back(Action::Seek(self.reader_pos));
        }
        self.pump(now, cluster);
        self.maybe_rescan(now);
    }

    /// The reader is at `seq`: whether the driver must decode it and feed it as an
    /// [`Event::Record`]. A record that is held or done needs no work. A visit below
    /// the reader's position belongs to a read that a seek made stale.
    pub fn visit(&mut self, seq: Seq) -> bool {
        assert!(
            self.visiting.is_none(),
            "record {seq} visited before the last was fed"
        );
        if seq < self.reader_pos {
            return false;
        }
        assert_eq!(seq, self.reader_pos, "the reader skipped records");
        let lookahead_max = self
            .config
            .lookahead_records(self.config.window_records_max);
        assert!(
            seq.0 < self.progress.checkpoint().0 + lookahead_max,
            "read past the lookahead"
        );
        self.reader_pos = seq.next();
        if seq >= self.frontier {
            self.frontier = seq.next();
            // Done before a graceful stop (see `resume`).
            if self.progress.is_done(seq) {
                return false;
            }
            self.visiting = Some((seq, false));
            return true;
        }
        let wanted = !self.held.contains(&seq) && !self.progress.is_done(seq);
        if wanted {
            self.visiting = Some((seq, true));
        }
        wanted
    }

    /// Whether `seq` is held: queued for, or in, a commit.
    pub fn is_held(&self, seq: Seq) -> bool {
        self.held.contains(&seq)
    }

    /// How many records the reader may visit now: room in the window, and no more
    /// than the lookahead past the checkpoint (or past the records a graceful
    /// stop left done, up to the largest lookahead).
    pub fn read_budget(&self) -> usize {
        let held_max = self.config.held_records_max(self.window_records);
        let room = held_max.saturating_sub(self.held_counting);
        let checkpoint = self.progress.checkpoint().0;
        let from = checkpoint.max(self.resumed_end.0);
        let limit = (from + self.config.lookahead_records(self.window_records)).min(
            checkpoint
                + self
                    .config
                    .lookahead_records(self.config.window_records_max),
        );
        let ahead = limit.saturating_sub(self.reader_pos.0);
        room.min(usize::try_from(ahead).unwrap_or(usize::MAX))
    }

    /// Takes the actions produced so far, in order.
    pub fn drain_actions(&mut self) -> impl Iterator<Item = Action> + '_ {
        self.actions.drain(..)
    }

    /// The latest time by which the driver must feed a [`Event::Tick`].
    pub fn next_deadline(&self) -> Option<Instant> {
        let mut deadline: Option<Instant> = None;
        let mut at = |t: Instant| deadline = Some(deadline.map_or(t, |d| d.min(t)));
        for commit in self.commits.values().filter(|c| !c.hung) {
            at(commit.started + self.config.hung_after);
        }
        // Probes and lingering batches wait for a commit slot when none is free: a
        // commit that lands frees one, so a past deadline must not spin the driver.
        let slot_free = self.commits_counting < self.config.commits_in_flight_max
            && self.commits.len()
                < self.config.commits_in_flight_max + self.config.commits_hung_max;
        for topic in self.topics.values().filter(|_| slot_free) {
            for d in topic.partitions.values() {
                if let (None, false, Some(t)) = (d.in_flight, d.queue.is_empty(), d.retry_at) {
                    at(t);
                }
            }
        }
        if self.skipped_total > 0 {
            at(self.rescan_last_at + self.config.rescan_interval);
        }
        deadline
    }

    /// The first sequence number not done: what the next stored checkpoint will be.
    pub fn checkpoint(&self) -> Seq {
        self.progress.checkpoint()
    }

    /// The sequence number the reader visits next.
    pub fn reader_position(&self) -> Seq {
        self.reader_pos
    }

    /// Records held against the window (queued, or in a commit that is not hung).
    pub fn held_records(&self) -> usize {
        self.held_counting
    }

    /// Records held in all, hung commits included.
    pub fn held_records_total(&self) -> usize {
        self.held.len()
    }

    /// The current window.
    pub fn window_records(&self) -> usize {
        self.window_records
    }

    /// Commits in flight, and how many of them are hung.
    pub fn commits_in_flight(&self) -> (usize, usize) {
        (self.commits.len(), self.commits_hung)
    }

    /// Records left in the WAL to be read again.
    pub fn skipped_records(&self) -> u64 {
        self.skipped_total
    }

    /// The records queued for a destination (tests and metrics).
    pub fn queued_records(&self, topic: &str, partition: PartitionId) -> usize {
        self.topics
            .get(topic)
            .and_then(|t| t.partitions.get(&partition))
            .map_or(0, |d| d.queue.len())
    }

    /// Applies `change` to a destination's skip state, keeping the count of
    /// destinations open in the pass.
    pub(super) fn change_skips(
        &mut self,
        topic: &str,
        partition: PartitionId,
        change: impl FnOnce(&mut Destination),
    ) {
        let d = self.dest_mut(topic, partition);
        let was = d.open_in_pass();
        change(d);
        let is = d.open_in_pass();
        match (was, is) {
            (false, true) => self.open_in_pass += 1,
            (true, false) => self.open_in_pass -= 1,
            _ => {}
        }
    }

    /// Ends the pass in progress once no destination is open in it: what it has
    /// left to read is all skipped, and would only be skipped again. So a hot
    /// partition's skipped backlog is read about once per pass, up to where its
    /// queue fills again, not to the frontier after each of its commits. Every
    /// record left unread is at or above where the pass stopped, which the next
    /// pass starts from at the latest.
    fn end_pass_if_settled(&mut self) {
        if self.open_in_pass > 0 || self.reader_pos >= self.frontier {
            return;
        }
        if self.skipped_total > 0 {
            // A rescan pass can fall behind the checkpoint (the records it has
            // yet to read again were committed meanwhile): everything below the
            // checkpoint is done, so the next pass need not start lower.
            let stop = self.reader_pos.max(self.progress.checkpoint());
            self.rescan_from = Some(self.rescan_from.map_or(stop, |s| s.min(stop)));
        }
        self.reader_pos = self.frontier;
        self.seek_after_read = true;
    }

    pub(super) fn dest_mut(&mut self, topic: &str, partition: PartitionId) -> &mut Destination {
        self.topics
            .get_mut(topic)
            .and_then(|t| t.partitions.get_mut(&partition))
            .expect("destination exists")
    }

    /// The destination entry, created when missing. Returns the interned topic name.
    pub(super) fn ensure_dest(
        &mut self,
        topic: &str,
        partition: PartitionId,
        now: Instant,
    ) -> Rc<str> {
        if !self.topics.contains_key(topic) {
            self.topics.insert(Rc::from(topic), TopicState::default());
        }
        let (name, _) = self.topics.get_key_value(topic).expect("inserted above");
        let name = Rc::clone(name);
        let state = self.topics.get_mut(topic).expect("inserted above");
        if let std::collections::btree_map::Entry::Vacant(slot) = state.partitions.entry(partition)
        {
            assert!(
                self.destinations < DESTINATIONS_MAX,
                "too many destinations"
            );
            slot.insert(Destination::new(now));
            self.destinations += 1;
        }
        name
    }

    /// Marks `seqs` done and stores the checkpoint if it moved.
    pub(super) fn mark_done(&mut self, seqs: impl Iterator<Item = Seq>) {
        for seq in seqs {
            assert!(seq < self.frontier, "seq {seq} done before it was read");
            self.progress.mark_done(seq);
        }
        let checkpoint = self.progress.checkpoint();
        // Records done before a graceful stop (see `resume`) can carry the
        // checkpoint past the frontier: everything below it is done, so the
        // reader goes on from there.
        self.frontier = self.frontier.max(checkpoint);
        // A record returned to the WAL ahead of the reader, during a rescan pass, is
        // read again in that same pass and may be done by now, leaving
        // `rescan_from` below the checkpoint. Every skipped record is not done, so
        // it lies at or above the checkpoint: raising the bound keeps it true.
        if let Some(from) = self.rescan_from.as_mut() {
            *from = (*from).max(checkpoint);
        }
        // A rescan pass can be left behind the checkpoint. Below it everything
        // is done, and once the checkpoint is synced the segments there may be
        // compacted away: a read from there would fail for good. Move up to it.
        if self.reader_pos < checkpoint {
            self.reader_pos = checkpoint;
            self.seek_after_read = true;
        }
        if checkpoint > self.checkpoint_stored {
            self.checkpoint_stored = checkpoint;
            self.actions.push_back(Action::StoreCheckpoint(checkpoint));
        }
    }

    pub(super) fn record_latency(&mut self, owner: OwnerId, sample: Duration) {
        if let Some(avg) = self.latency.get_mut(&owner) {
            *avg = (*avg * 7 + sample) / 8;
        } else if self.latency.len() < OWNERS_TRACKED_MAX {
            self.latency.insert(owner, sample);
        }
    }

    fn tick(&mut self, now: Instant) {
        self.resize_window(now);
        self.detect_hung(now);
        self.forget_idle(now);
    }

    fn resize_window(&mut self, now: Instant) {
        let recent = self.config.rescan_interval;
        let active = self
            .topics
            .values()
            .flat_map(|t| t.partitions.values())
            .filter(|d| {
                !d.queue.is_empty()
                    || d.in_flight.is_some()
                    || now.saturating_duration_since(d.last_active) < recent
            })
            .count();
        self.window_records = self.config.window_records(active);
    }

    fn forget_idle(&mut self, now: Instant) {
        let idle_after = self.config.idle_forget_after;
        let mut forgotten = 0;
        for state in self.topics.values_mut() {
            let before = state.partitions.len();
            state
                .partitions
                .retain(|_, d| !d.is_forgettable(now, idle_after));
            forgotten += before - state.partitions.len();
            let ttl = self.config.gone_answer_ttl;
            state
                .asked
                .retain(|_, at| now.saturating_duration_since(*at) < ttl);
            state
                .gone
                .retain(|(_, used)| now.saturating_duration_since(*used) < idle_after);
        }
        self.destinations -= forgotten;
        self.topics
            .retain(|_, s| !s.partitions.is_empty() || !s.gone.is_empty() || !s.asked.is_empty());
    }

    fn gone_answer(&mut self, now: Instant, topic: &str, incarnation: IncarnationId, gone: bool) {
        let Some(state) = self.topics.get_mut(topic) else {
            return;
        };
        if gone {
            state.asked.remove(&incarnation);
            match state.gone.iter_mut().find(|(i, _)| *i == incarnation) {
                Some((_, used)) => *used = now,
                None => {
                    if state.gone.len() == super::config::GONE_INCARNATIONS_MAX {
                        state.gone.pop_front();
                    }
                    state.gone.push_back((incarnation, now));
                }
            }
            self.rescan_wanted = true;
        } else {
            state.asked.insert(incarnation, now);
        }
    }

    /// Seeks back to the lowest skipped record when a destination can take records
    /// again or the backstop is due. One pass at a time, so a hot partition's
    /// backlog is read again about once per pass, not after each of its commits.
    /// The backstop interrupts only a pass that stopped moving: restarting one that
    /// merely takes longer than the interval (a large backlog of large records)
    /// would read the same span forever and never reach new records.
    fn maybe_rescan(&mut self, now: Instant) {
        if self.skipped_total == 0 {
            self.rescan_from = None;
            self.rescan_wanted = false;
            self.pass_seen_at = None;
            return;
        }
        let pass_done = self.reader_pos >= self.frontier;
        if self.pass_seen_at.is_some_and(|at| at != self.reader_pos) {
            self.rescan_last_at = now;
            self.pass_seen_at = (!pass_done).then_some(self.reader_pos);
        }
        let backstop = now >= self.rescan_last_at + self.config.rescan_interval;
        if !(backstop || (self.rescan_wanted && pass_done)) {
            return;
        }
        self.rescan_wanted = false;
        self.rescan_last_at = now;
        let Some(from) = self.rescan_from.take() else {
            return;
        };
        if from >= self.reader_pos {
            return;
        }
        assert!(
            from >= self.progress.checkpoint(),
            "a skipped record below the checkpoint"
        );
        self.reader_pos = from;
        self.pass_seen_at = Some(from);
        self.seek_after_read = false;
        self.open_in_pass = 0;
        for d in self
            .topics
            .values_mut()
            .flat_map(|t| t.partitions.values_mut())
        {
            d.blocked_in_pass = false;
            self.open_in_pass += usize::from(d.open_in_pass());
        }
        self.actions.push_back(Action::Seek(from));
    }

    /// Checks the bookkeeping against a recount. Costs O(lookahead); for tests.
    pub fn assert_invariants(&self) {
        let mut queued = 0;
        let mut skipped = 0;
        let mut in_flight_by_dest = 0;
        let mut open = 0;
        for d in self.topics.values().flat_map(|t| t.partitions.values()) {
            d.assert_invariants();
            open += usize::from(d.open_in_pass());
            queued += d.queue.len();
            skipped += d.skipped_records;
            in_flight_by_dest += usize::from(d.in_flight.is_some());
            assert!(d.queue.iter().all(|h| self.held.contains(&h.seq)));
        }
        assert_eq!(
            in_flight_by_dest,
            self.commits.len(),
            "one commit per destination"
        );
        let flying: usize = self
            .commits
            .values()
            .filter(|c| !c.hung)
            .map(|c| c.records.len())
            .sum();
        let hung: usize = self
            .commits
            .values()
            .filter(|c| c.hung)
            .map(|c| c.records.len())
            .sum();
        assert_eq!(self.held_counting, queued + flying);
        assert_eq!(self.held.len(), queued + flying + hung);
        assert_eq!(self.skipped_total, skipped);
        assert_eq!(self.open_in_pass, open, "destinations open in the pass");
        assert_eq!(
            self.commits_hung,
            self.commits.values().filter(|c| c.hung).count()
        );
        let checkpoint = self.progress.checkpoint();
        let done = (checkpoint.0..self.frontier.0)
            .filter(|&s| self.progress.is_done(Seq(s)))
            .count() as u64;
        let tracked = self.frontier.0 - checkpoint.0;
        assert_eq!(
            tracked,
            done + self.held.len() as u64 + skipped,
            "done + held + skipped"
        );
        assert!(self.reader_pos <= self.frontier);
        assert!(
            self.reader_pos >= checkpoint,
            "the reader is behind the checkpoint"
        );
        if let Some(from) = self.rescan_from {
            assert!(from >= checkpoint);
        }
    }
}
