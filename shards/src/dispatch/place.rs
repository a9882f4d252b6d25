//! Placing a record read from the WAL: held on a destination's queue, skipped
//! (left in the WAL for a later rescan), or discarded after confirmation.
//!
//! The checks run in the seed's order: the incarnation first (before anything
//! resolves or reroutes the record by name), then partition order (an earlier record
//! of the same partition still skipped), then the route (a failing partition without
//! its probe takes the record as its probe; a dead owner or 3 s of failures reroutes
//! to a live sibling), then whether the destination can take it (hung, probe held,
//! full queue).

use std::rc::Rc;
use std::time::Instant;

use super::config::GONE_INCARNATIONS_MAX;
use super::destination::Held;
use super::{Action, Cluster, DiscardReason, Dispatcher, RecordRead};
use crate::ids::{IncarnationId, PartitionId};

/// Where a record goes.
enum Route {
    Hold(PartitionId),
    Skip,
    Discard,
}

impl Dispatcher {
    pub(super) fn place(&mut self, now: Instant, record: RecordRead<'_>, cluster: &impl Cluster) {
        let (seq, reread) = self
            .visiting
            .take()
            .expect("a record is fed only after visit");
        assert_eq!(seq, record.seq, "the record fed is not the one visited");
        let topic = self.ensure_dest(record.topic, record.partition, now);
        let route = self.route(now, &topic, &record, reread, cluster);
        if reread && !matches!(route, Route::Skip) {
            self.change_skips(&topic, record.partition, |origin| {
                assert!(
                    origin.skipped_records > 0,
                    "a record read again was not counted skipped"
                );
                origin.skipped_records -= 1;
            });
            self.skipped_total -= 1;
        }
        match route {
            Route::Hold(partition) => {
                let cap = self.config.queue_records_max(self.window_records);
                let d = self.dest_mut(&topic, partition);
                assert!(
                    d.queue.len() < cap && !d.hung,
                    "queued past the destination's bounds"
                );
                d.queue.push_back(Held {
                    seq,
                    encoded_bytes: record.encoded_bytes,
                    incarnation: record.incarnation,
                    origin: record.partition,
                    placed_at: now,
                });
                d.last_active = now;
                assert!(self.held.insert(seq), "record {seq} held twice");
                self.held_counting += 1;
            }
            Route::Skip => {
                self.change_skips(&topic, record.partition, |origin| {
                    origin.blocked_in_pass = true;
                    if !reread {
                        origin.skipped_records += 1;
                    }
                });
                if !reread {
                    self.skipped_total += 1;
                }
                self.rescan_from = Some(self.rescan_from.map_or(seq, |s| s.min(seq)));
            }
            Route::Discard => {
                self.actions.push_back(Action::Discard {
                    topic: Rc::clone(&topic),
                    incarnation: record.incarnation,
                    partition: record.partition,
                    seqs: vec![seq],
                    reason: DiscardReason::IncarnationGone,
                });
                self.mark_done(std::iter::once(seq));
            }
        }
    }

    fn route(
        &mut self,
        now: Instant,
        topic: &Rc<str>,
        record: &RecordRead<'_>,
        reread: bool,
        cluster: &impl Cluster,
    ) -> Route {
        let meta = cluster.topic(topic);
        if meta.map(|m| m.incarnation) != Some(record.incarnation) {
            return self.incarnation_replaced(now, topic, record.incarnation);
        }
        let partitions = meta.map_or(0, |m| m.partitions);
        let origin = self.dest_mut(topic, record.partition);
        let blocked = if reread {
            origin.blocked_in_pass
        } else {
            origin.skipped_records > 0
        };
        if blocked || record.partition.0 >= partitions {
            return Route::Skip;
        }
        let failing = origin.failing;
        let holds_probe = origin.holds_probe();
        let owner = cluster.owner(topic, record.partition);
        let dead = owner.is_some_and(|o| !cluster.is_alive(o));
        if failing.is_some() && !holds_probe && !dead {
            // The record becomes the probe that keeps trying the original partition.
            return self.hold_if_room(topic, record.partition);
        }
        let failed_long = failing
            .is_some_and(|f| now.saturating_duration_since(f.since) >= self.config.reroute_after);
        if !(dead || failed_long) {
            return self.hold_if_room(topic, record.partition);
        }
        match self.sibling(now, topic, record.partition, partitions, cluster) {
            Some(sibling) => {
                let origin = self.dest_mut(topic, record.partition);
                if !std::mem::replace(&mut origin.rerouting, true) {
                    tracing::warn!(topic = %topic, partition = record.partition.0, sibling = sibling.0, owner_dead = dead, "a partition's commits keep failing: its records go to a sibling partition until it recovers (records produced with a key or a partition land elsewhere meanwhile)");
                }
                self.hold_if_room(topic, sibling)
            }
            None => Route::Skip,
        }
    }

    fn hold_if_room(&mut self, topic: &str, partition: PartitionId) -> Route {
        let cap = self.config.queue_records_max(self.window_records);
        let d = self.dest_mut(topic, partition);
        if d.turns_away(cap) {
            d.turned_away = true;
            Route::Skip
        } else {
            Route::Hold(partition)
        }
    }

    /// The record's incarnation is not the live one under its name: discard once the
    /// leader confirmed it gone, else leave it in the WAL and ask (at most once per
    /// answer TTL per incarnation).
    fn incarnation_replaced(
        &mut self,
        now: Instant,
        topic: &Rc<str>,
        incarnation: IncarnationId,
    ) -> Route {
        let ttl = self.config.gone_answer_ttl;
        let state = self.topics.get_mut(topic).expect("destination created");
        if let Some((_, used)) = state.gone.iter_mut().find(|(i, _)| *i == incarnation) {
            *used = now;
            return Route::Discard;
        }
        let recent = state
            .asked
            .get(&incarnation)
            .is_some_and(|at| now.saturating_duration_since(*at) < ttl);
        if !recent {
            if state.asked.len() >= GONE_INCARNATIONS_MAX {
                let oldest = state
                    .asked
                    .iter()
                    .min_by_key(|(_, at)| **at)
                    .map(|(i, _)| *i);
                state.asked.remove(&oldest.expect("not empty"));
            }
            state.asked.insert(incarnation, now);
            self.actions.push_back(Action::AskGone {
                topic: Rc::clone(topic),
                incarnation,
            });
        }
        Route::Skip
    }
}
