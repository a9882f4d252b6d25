//! The producer and consumer pools of one run: their plans, the producers run
//! to the end of the schedule, the consumers' drain, and the totals.
//!
//! Which cores: the generator's one event loop, as the rest of `bench`.

use super::*;

/// After the producers stop, consumers drain until no message has come for
/// this long (or every acknowledged record is consumed) ...
const DRAIN_IDLE: Duration = Duration::from_secs(2);
/// ... or for at most this long, or twice the producing time if that is longer
/// (consumers that fell behind get to finish the backlog they were measured on).
const DRAIN_MAX: Duration = Duration::from_secs(30);
/// ... but a `--verify` run that saw a consume or ack fail, with records still
/// outstanding, waits for the topic's visibility timeout and this much more
/// after the last failure: the records of a failed exchange stay leased until
/// then, and ending sooner would report them missing.
const LEASE_MARGIN: Duration = Duration::from_secs(5);
/// How often the run checks whether the consumers are done.
const CONTROL_TICK: Duration = Duration::from_millis(20);

/// Runs producers and consumers, drains, and sums up.
pub(super) async fn run_pools(
    s: &Settings,
    producer_conns: Vec<(Conn, Tally)>,
    consumer_conns: Vec<(Conn, ConsumeTally)>,
    live: &Rc<Live>,
    visibility: Duration,
) -> Result<Outcome, String> {
    let ledger = Rc::new(RefCell::new(Ledger::new()));
    let run_tag = run_tag();
    let start = live.start();
    let consume_plan = s.mode.consumes().then(|| {
        let own_run = (s.mode == Mode::Flow).then_some((run_tag, s.size_bytes));
        let plan = ConsumePlan::new(
            s.server.clone(),
            &s.topic,
            s.consume_max,
            own_run,
            ledger.clone(),
            live.clone(),
        );
        plan.last_progress.set(start);
        match (s.mode, s.length) {
            (Mode::Consume, Length::Records(records)) => Rc::new(plan.with_quota(records)),
            _ => Rc::new(plan),
        }
    });
    let consumers: Vec<_> = match &consume_plan {
        Some(plan) => consumer_conns
            .into_iter()
            .map(|(conn, tally)| evloop::spawn(consumer::consumer(plan.clone(), conn, tally)))
            .collect(),
        None => Vec::new(),
    };
    let mut abandoned = false;
    let mut topic_gone = false;
    let produce = if s.mode.produces() {
        let stamper = (s.mode == Mode::Flow).then(|| stamper(s, run_tag, ledger.clone()));
        let plan = Rc::new(plan(s, live.clone(), stamper));
        let record_bytes = if s.mode == Mode::Ping {
            0
        } else {
            s.size_bytes
        };
        let summary = produce(&plan, producer_conns, s.rate, record_bytes).await?;
        if let Length::Records(count) = s.length {
            if !plan.schedule.is_abandoned() && !plan.schedule.is_topic_gone() && !interrupted() {
                // Failed records were sent again (while within the count),
                // or used their share of it up.
                let retried = plan.schedule.retried();
                assert_eq!(summary.ok_records + summary.failed_records - retried, count);
            }
        }
        abandoned |= plan.schedule.is_abandoned();
        topic_gone |= plan.schedule.is_topic_gone();
        Some(summary)
    } else {
        None
    };
    let consume = match consume_plan {
        Some(plan) => {
            if topic_gone {
                // Nothing is left to drain.
                plan.stop.set(true);
            }
            let drain_cut_short = await_drained(s, &plan, start, visibility).await;
            plan.stop.set(true);
            let mut tally = ConsumeTally::new();
            for handle in consumers {
                tally.merge(&handle.await)?;
            }
            plan.hand_latencies_to(&mut tally)?;
            abandoned |= plan.abandoned.get();
            topic_gone |= plan.topic_gone.get();
            let ledger = ledger.borrow();
            let end = tally.last_consumed.unwrap_or_else(Instant::now);
            // In a flow, the consumers take what the producers sent over their
            // whole time: consumers that kept up with a slow open loop finish
            // with its last record, and their rate is over the same time, not
            // up to that record.
            let producing = produce.as_ref().map_or(Duration::ZERO, |p| p.elapsed);
            Some(ConsumeSummary {
                tally,
                elapsed: end.saturating_duration_since(start).max(producing),
                duplicate_records: ledger.duplicate_records(),
                verdict: s.verify.then(|| ledger.verdict()),
                drain_cut_short,
            })
        }
        None => None,
    };
    Ok(Outcome {
        produce,
        consume,
        abandoned,
        topic_gone,
        warnings: Vec::new(),
        series: Series::default(),
    })
}

/// Runs the producers to the end of the schedule and sums their tallies.
async fn produce(
    plan: &Rc<Plan>,
    conns: Vec<(Conn, Tally)>,
    rate: Option<f64>,
    record_bytes: usize,
) -> Result<Summary, String> {
    let start = plan.schedule.start();
    let handles: Vec<_> = conns
        .into_iter()
        .map(|(conn, tally)| evloop::spawn(workload::worker(plan.clone(), conn, tally)))
        .collect();
    let mut summary = Summary {
        ok_records: 0,
        failed_records: 0,
        elapsed: Duration::ZERO,
        latencies_us: report::latency_histogram(),
        target_rate: rate,
        errors: std::collections::BTreeMap::new(),
        record_bytes,
        send_lag: report::SendLag::default(),
    };
    for handle in handles {
        let tally: Tally = handle.await;
        summary.ok_records += tally.ok_records;
        summary.failed_records += tally.failed_records;
        summary.send_lag.merge(tally.send_lag);
        for (status, records) in tally.errors {
            *summary.errors.entry(status).or_default() += records;
        }
        summary.elapsed = summary
            .elapsed
            .max(tally.finished.saturating_duration_since(start));
    }
    // A timed run lasts its time, whenever its last answer came: an open loop
    // at a low rate sends its last request well before the end, and its rate
    // is the records over the whole time, not up to that answer. A run cut
    // short (interrupted, abandoned) lasts what it ran.
    if let Some(end) = plan.schedule.end() {
        if !super::interrupted() && !plan.schedule.is_abandoned() && !plan.schedule.is_topic_gone()
        {
            summary.elapsed = summary.elapsed.max(end.saturating_duration_since(start));
        }
    }
    // Every worker has ended: the histogram they shared is complete.
    summary.latencies_us = plan.latencies_us.replace(report::latency_histogram());
    let unsent = plan.schedule.unsent();
    if unsent > 0 {
        summary.failed_records += unsent;
        *summary.errors.entry(consumer::STATUS_UNSENT).or_default() += unsent;
    }
    Ok(summary)
}

/// How long the consumers may drain after producers that ran for
/// `producing` stopped, timed or counted alike.
fn drain_max(producing: Duration) -> Duration {
    DRAIN_MAX.max(producing * 2)
}

/// Waits until the consumers are done: in flow mode, once the producers have
/// stopped, when every acknowledged record is consumed or none came for
/// [`DRAIN_IDLE`] (at most [`drain_max`]); in consume mode at the end of the
/// run's length or after [`DRAIN_IDLE`] without a message. Returns the drain's
/// limit if a flow's drain ended there while the consumers were still acking.
async fn await_drained(
    s: &Settings,
    plan: &ConsumePlan,
    start: Instant,
    visibility: Duration,
) -> Option<Duration> {
    let from = Instant::now();
    let drain_max = drain_max(from.saturating_duration_since(start));
    loop {
        let now = Instant::now();
        let idle = now.saturating_duration_since(plan.last_progress.get().max(from));
        let outstanding = plan.ledger.borrow().outstanding_records();
        let leases_back = leases_back_at(
            s.verify,
            plan.live.last_consume_failure(),
            outstanding,
            visibility,
        );
        let idle_limit = match leases_back {
            Some(_) => visibility + LEASE_MARGIN,
            None => DRAIN_IDLE,
        };
        let (waiting_for_leases, cap) = lease_wait(from, drain_max, visibility, leases_back, now);
        let done = plan.stop.get()
            || interrupted()
            || (idle >= idle_limit && !waiting_for_leases)
            || match s.mode {
                Mode::Flow => outstanding == 0 || now >= cap,
                Mode::Consume => match s.length {
                    Length::Timed(d) => now.saturating_duration_since(start) >= d,
                    Length::Records(n) => plan.live.consumed_records() >= n,
                    Length::UntilIdle => false,
                },
                Mode::Produce | Mode::Ping => unreachable!("no consumers in this mode"),
            };
        if done {
            let cut_short =
                s.mode == Mode::Flow && outstanding > 0 && now >= cap && idle < idle_limit;
            return cut_short.then(|| cap.saturating_duration_since(from));
        }
        evloop::sleep(CONTROL_TICK).await;
    }
}

/// Whether the drain still waits at `now` for leases to come back, and when a
/// flow's drain ends at the latest: its own limit, moved out to the leases'
/// return, but never more than a visibility timeout past the limit (failures
/// that keep coming keep moving the leases' return).
fn lease_wait(
    from: Instant,
    drain_max: Duration,
    visibility: Duration,
    leases_back: Option<Instant>,
    now: Instant,
) -> (bool, Instant) {
    let hard_cap = from + drain_max + visibility + LEASE_MARGIN;
    let waiting = leases_back.is_some_and(|at| now < at) && now < hard_cap;
    let cap = (from + drain_max)
        .max(leases_back.unwrap_or(from))
        .min(hard_cap);
    (waiting, cap)
}

/// In a `--verify` run in which an exchange failed while records are still
/// outstanding: when the leases of the last failed exchange have lapsed and
/// their records come back (the visibility timeout after it, plus
/// [`LEASE_MARGIN`]), which the drain waits for. `None` otherwise.
fn leases_back_at(
    verify: bool,
    last_failure: Option<Instant>,
    outstanding: u64,
    visibility: Duration,
) -> Option<Instant> {
    match last_failure {
        Some(at) if verify && outstanding > 0 => Some(at + visibility + LEASE_MARGIN),
        _ => None,
    }
}

/// A tag that tells this run's records from an earlier run's on the topic.
fn run_tag() -> u32 {
    let mixed = stamp::unix_ns() ^ u64::from(std::process::id()).rotate_left(32);
    (mixed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32
}

/// The stamped bodies of a flow run.
fn stamper(s: &Settings, run_tag: u32, ledger: Rc<RefCell<Ledger>>) -> workload::Stamper {
    let payload = stamp::stamped_payload(s.size_bytes);
    let batch = s.batch_records.map(|batch| {
        let tail = match s.length {
            Length::Records(count) if count % batch != 0 => Some(count % batch),
            _ => None,
        };
        (batch, tail)
    });
    workload::Stamper::new(run_tag, &payload, batch, ledger)
}

/// The requests of the run, and its schedule from the start of `live`.
fn plan(s: &Settings, live: Rc<Live>, stamper: Option<workload::Stamper>) -> Plan {
    let start = live.start();
    let server: Server = s.server.clone();
    // Ping mode sends no payload (and refuses --size).
    let payload = || workload::payload(s.size_bytes);
    let (template, body, tail_body) = match s.batch_records {
        None if s.mode == Mode::Ping => (
            RequestTemplate::get(HEALTH_PATH, &server),
            Bytes::new(),
            None,
        ),
        None => {
            let path = client::topic_path(&s.topic, "/produce");
            let template =
                RequestTemplate::new(Method::Post, &path, &server, "application/octet-stream");
            (template, Bytes::from(payload()), None)
        }
        Some(batch) => {
            let path = client::topic_path(&s.topic, "/produce/batch");
            let template = RequestTemplate::new(Method::Post, &path, &server, "application/json");
            let payload = payload();
            let body = Bytes::from(workload::batch_body(&payload, batch));
            let tail = match s.length {
                Length::Records(count) if count % batch != 0 => {
                    Some(Bytes::from(workload::batch_body(&payload, count % batch)))
                }
                _ => None,
            };
            (template, body, tail)
        }
    };
    let batch = s.batch();
    let stop = match s.length {
        Length::Timed(d) => Stop::At(start + d),
        Length::Records(count) => Stop::Records(count),
        Length::UntilIdle => unreachable!("only consume mode runs until idle"),
    };
    Plan {
        server,
        template,
        body,
        tail_body,
        stamper,
        schedule: Schedule::at_rate(stop, batch, s.rate, start),
        accepts: match s.mode {
            Mode::Ping => |status| status == 200,
            // A produce is acknowledged by 202 and nothing else: a 200 or a
            // redirect from something that is not the broker stores nothing.
            _ => |status| status == 202,
        },
        reads_accepted: s.mode != Mode::Ping && s.batch_records.is_some(),
        to_topic: s.mode != Mode::Ping,
        live,
        // Made before the run's clock starts: a few hundred kilobytes.
        latencies_us: RefCell::new(report::latency_histogram()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verify_run_with_failed_exchanges_waits_out_their_leases() {
        let failed = Instant::now();
        let minute = Duration::from_secs(60);
        // The leases of the last failed exchange lapse a visibility timeout
        // after it, whatever the topic's.
        assert_eq!(
            leases_back_at(true, Some(failed), 5, minute),
            Some(failed + minute + LEASE_MARGIN)
        );
        // Nothing failed, nothing outstanding, or not verifying: no wait.
        assert_eq!(leases_back_at(true, None, 5, minute), None);
        assert_eq!(leases_back_at(true, Some(failed), 0, minute), None);
        assert_eq!(leases_back_at(false, Some(failed), 5, minute), None);
    }

    #[test]
    fn failures_that_keep_coming_do_not_hold_the_drain_for_ever() {
        let from = Instant::now();
        let (limit, visibility) = (Duration::from_secs(30), Duration::from_secs(60));
        let hard_cap = from + limit + visibility + LEASE_MARGIN;
        // A failure a moment ago: wait for its leases, past the drain's limit.
        let now = from + Duration::from_secs(40);
        let back = now + visibility + LEASE_MARGIN;
        let (waiting, cap) = lease_wait(from, limit, visibility, Some(back), now);
        assert!(waiting);
        assert!(cap > from + limit && cap <= hard_cap);
        // Failures still coming at the hard cap: the wait ends there.
        let now = hard_cap;
        let back = now + visibility + LEASE_MARGIN;
        assert_eq!(
            lease_wait(from, limit, visibility, Some(back), now),
            (false, hard_cap)
        );
        // No failure: the drain's own limit.
        assert_eq!(
            lease_wait(from, limit, visibility, None, from),
            (false, from + limit)
        );
    }
}
