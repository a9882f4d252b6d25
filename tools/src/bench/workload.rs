//! What the workers send and when: the payload, the request bodies, the
//! schedule of requests (tickets) and the worker loop.
//!
//! Which cores: every worker is a task on the generator's one executor, so the
//! shared [`Schedule`] is plain `Cell`s: no atomics, no locks, no contention.
//!
//! A ticket is one request. Workers claim tickets in order from the schedule,
//! so a worker whose connection is slow does not hold back a fixed share of the
//! run. In an open-loop run (`--rate`) ticket `i` is due at
//! `start + i·interval`; its latency is measured from that due time, not from
//! when a worker got round to sending it, so a server that makes requests queue
//! shows it in the percentiles instead of silently lowering the sending rate
//! (coordinated omission).
//!
//! Latencies are recorded for successful requests only: a refused request that
//! comes back at once would otherwise pull the percentiles down.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use hdrhistogram::Histogram;

use super::client::{Conn, Link, Opened, RequestTemplate, Server};
use super::live::Live;
use super::report;
use super::stamp::{self, Ledger, Stamp, STAMP_BYTES};

/// The payload's fixed part around the padding: `{"bench":"` and `"}`.
pub const PAYLOAD_FRAME_BYTES: usize = 12;

/// `{"bench":"x…"}`, padded with x's to `size` bytes.
pub fn payload(size: usize) -> Vec<u8> {
    assert!(size >= PAYLOAD_FRAME_BYTES);
    let mut payload = Vec::with_capacity(size);
    payload.extend_from_slice(b"{\"bench\":\"");
    payload.resize(size - 2, b'x');
    payload.extend_from_slice(b"\"}");
    assert_eq!(payload.len(), size);
    payload
}

/// A batch document of `records` copies of `payload`, a JSON object, each
/// sent as the JSON value it is: `{"messages":[{"payload":{"bench":"x…"}},…]}`,
/// as a client with JSON payloads sends them. The broker stores a JSON value's
/// text verbatim, so a record holds the same bytes as one sent alone.
pub fn batch_body(payload: &[u8], records: u64) -> Vec<u8> {
    assert!(records > 0);
    let text = std::str::from_utf8(payload).expect("the payload is ASCII");
    assert!(
        serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| v.is_object()),
        "the payload is a JSON object"
    );
    let message = format!(r#"{{"payload":{text}}}"#);
    let mut body = Vec::with_capacity(16 + (message.len() + 1) * records as usize);
    body.extend_from_slice(b"{\"messages\":[");
    for i in 0..records {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(message.as_bytes());
    }
    body.extend_from_slice(b"]}");
    body
}

/// Stamps each record of a request with its id and send time (flow mode).
///
/// The bodies are built once with zero stamps; a request copies its template
/// into the worker's reused buffer and patches the stamps at known offsets.
pub struct Stamper {
    run: u32,
    /// The body of a full request, and of the shorter last batch, if any.
    full: Vec<u8>,
    tail: Option<Vec<u8>>,
    /// Where record `i`'s stamp starts, in either body.
    offsets: Vec<usize>,
    ledger: Rc<RefCell<Ledger>>,
}

impl Stamper {
    /// For single produces of `payload` (a stamped payload), or batches of
    /// `batch` records of it with a last batch of `tail` records.
    pub fn new(
        run: u32,
        payload: &[u8],
        batch: Option<(u64, Option<u64>)>,
        ledger: Rc<RefCell<Ledger>>,
    ) -> Stamper {
        assert!(payload.starts_with(stamp::PAYLOAD_HEAD));
        let Some((records, tail)) = batch else {
            return Stamper {
                run,
                full: payload.to_vec(),
                tail: None,
                offsets: vec![stamp::PAYLOAD_HEAD.len()],
                ledger,
            };
        };
        let full = batch_body(payload, records);
        // Every record of a batch body is the same message text after
        // `{"messages":[`, one comma apart.
        let message_bytes = batch_body(payload, 1).len() - b"{\"messages\":[]}".len();
        let zero = &payload[stamp::PAYLOAD_HEAD.len()..][..STAMP_BYTES];
        let first = b"{\"messages\":[".len()
            + full[13..13 + message_bytes]
                .windows(STAMP_BYTES)
                .position(|w| w == zero)
                .expect("the message holds the stamp as it is");
        let offsets: Vec<usize> = (0..records as usize)
            .map(|i| first + i * (message_bytes + 1))
            .collect();
        for &at in &offsets {
            assert_eq!(&full[at..at + STAMP_BYTES], zero);
        }
        Stamper {
            run,
            full,
            tail: tail.map(|n| batch_body(payload, n)),
            offsets,
            ledger,
        }
    }

    /// Claims ids for `records` records and builds their body in `buf`, stamped
    /// as sent at `sent_unix_ns`. Returns the body and the first id.
    fn body(&self, buf: &mut BytesMut, records: u64, sent_unix_ns: u64) -> (Bytes, u64) {
        let template = match &self.tail {
            Some(tail) if records < self.offsets.len() as u64 => tail,
            _ => &self.full,
        };
        assert!(records as usize <= self.offsets.len());
        let first = self.ledger.borrow_mut().claim(records);
        // Dropping the last request's body gave the buffer back to `buf`, so
        // this reuses its allocation.
        buf.reserve(template.len());
        buf.extend_from_slice(template);
        for (i, &at) in self.offsets[..records as usize].iter().enumerate() {
            let stamp = Stamp {
                run: self.run,
                id: first + i as u64,
                sent_unix_ns,
            };
            stamp::write_stamp(&mut buf[at..at + STAMP_BYTES], stamp);
        }
        (buf.split().freeze(), first)
    }
}

/// How long an open-loop run goes on sending the requests that were due
/// before its end (a server that fell behind); those still unsent then are
/// reported as such rather than dropped from the latencies unseen.
pub const LATE_GRACE: Duration = Duration::from_secs(5);

/// When the run ends.
#[derive(Clone, Copy, Debug)]
pub enum Stop {
    /// After this many records were acknowledged. A failed request's records
    /// are sent again, until as many records as the count have failed; past
    /// that, a failure uses its records up, so a run against a failing server
    /// still ends.
    Records(u64),
    /// No new request after this instant.
    At(Instant),
}

/// One request to send.
#[derive(Clone, Copy, Debug)]
pub struct Ticket {
    pub records: u64,
    /// In an open-loop run, when the request is due.
    pub due: Option<Instant>,
}

/// The run's shared plan: which request comes next and whether to stop.
pub struct Schedule {
    stop: Stop,
    batch_records: u64,
    /// Open-loop: nanoseconds between two consecutive requests, unrounded, so
    /// that the rate does not drift by a rounded interval times the count.
    interval_ns: Option<f64>,
    start: Instant,
    issued: Cell<u64>,
    /// [`Stop::Records`]: records not claimed yet (given back ones included).
    unclaimed: Cell<u64>,
    /// [`Stop::Records`]: failed records that may still be given back.
    retries_left: Cell<u64>,
    /// Records sent again after a failure.
    retried: Cell<u64>,
    /// Open loop: records due before the end but not sent by its grace.
    unsent: Cell<u64>,
    /// Open loop: the grace after the end ran out.
    cut: Cell<bool>,
    abandoned: Cell<bool>,
    topic_gone: Cell<bool>,
}

impl Schedule {
    /// A schedule with a fixed interval between requests (tests).
    #[cfg(test)]
    pub fn new(stop: Stop, batch_records: u64, interval: Option<Duration>, start: Instant) -> Self {
        let interval_ns = interval.map(|i| i.as_nanos() as f64);
        Self::with_interval_ns(stop, batch_records, interval_ns, start)
    }

    /// An open loop at `rate` records a second (a closed loop without one).
    pub fn at_rate(stop: Stop, batch_records: u64, rate: Option<f64>, start: Instant) -> Self {
        let interval_ns = rate.map(|rate| batch_records as f64 * 1e9 / rate);
        Self::with_interval_ns(stop, batch_records, interval_ns, start)
    }

    fn with_interval_ns(
        stop: Stop,
        batch_records: u64,
        interval_ns: Option<f64>,
        start: Instant,
    ) -> Self {
        assert!(batch_records > 0);
        assert!(interval_ns.is_none_or(|i| i.is_finite() && i > 0.0));
        Schedule {
            stop,
            batch_records,
            interval_ns,
            start,
            issued: Cell::new(0),
            unclaimed: Cell::new(match stop {
                Stop::Records(total) => total,
                Stop::At(_) => 0,
            }),
            retries_left: Cell::new(match stop {
                Stop::Records(total) => total,
                Stop::At(_) => 0,
            }),
            retried: Cell::new(0),
            unsent: Cell::new(0),
            cut: Cell::new(false),
            abandoned: Cell::new(false),
            topic_gone: Cell::new(false),
        }
    }

    /// The next request, or `None` once the run is over.
    pub fn claim(&self, now: Instant) -> Option<Ticket> {
        if self.abandoned.get() || self.topic_gone.get() || self.cut.get() || super::interrupted() {
            return None;
        }
        let index = self.issued.get();
        // Each due time from the start, not from the one before: rounding
        // to whole nanoseconds never accumulates.
        let due = self.interval_ns.map(|interval| {
            let offset = (interval * index as f64).round();
            self.start
                + Duration::from_nanos(if offset < u64::MAX as f64 {
                    offset as u64
                } else {
                    u64::MAX
                })
        });
        let records = match self.stop {
            Stop::Records(_) => {
                let unclaimed = self.unclaimed.get();
                if unclaimed == 0 {
                    return None;
                }
                let records = unclaimed.min(self.batch_records);
                self.unclaimed.set(unclaimed - records);
                records
            }
            Stop::At(end) => match due {
                None if now >= end => return None,
                None => self.batch_records,
                Some(due) if due >= end => return None,
                // An open loop the server could not keep up with sends what
                // was due before the end for a grace after it (their latency
                // counts from when they were due); what is left then is
                // counted unsent, and the run ends.
                Some(due) if now >= end + LATE_GRACE => {
                    let interval = self.interval_ns.expect("an open loop has an interval");
                    let left = end.saturating_duration_since(due).as_nanos() as f64;
                    let tickets = (left / interval).ceil() as u64;
                    let records = tickets.saturating_mul(self.batch_records);
                    self.unsent.set(records);
                    self.cut.set(true);
                    return None;
                }
                Some(_) => self.batch_records,
            },
        };
        assert!(records > 0 && records <= self.batch_records);
        self.issued.set(index + 1);
        Some(Ticket { records, due })
    }

    /// A request of `records` failed: in a counted run its records are sent
    /// again while the failures stay within the count. Returns whether they
    /// will be.
    pub fn failed(&self, records: u64) -> bool {
        if !matches!(self.stop, Stop::Records(_)) || self.retries_left.get() < records {
            return false;
        }
        self.retries_left.set(self.retries_left.get() - records);
        self.unclaimed.set(self.unclaimed.get() + records);
        self.retried.set(self.retried.get() + records);
        true
    }

    /// Records sent again after a failure.
    pub fn retried(&self) -> u64 {
        self.retried.get()
    }

    /// Open loop: records that were due before the end and never sent.
    pub fn unsent(&self) -> u64 {
        self.unsent.get()
    }

    /// Stops the run: a worker could not reach the server.
    pub fn abandon(&self) {
        self.abandoned.set(true);
    }

    /// Stops the run: the topic was deleted under it (a 404 mid-run), so no
    /// request can succeed again, and retrying them would only spin.
    pub fn topic_gone(&self) {
        self.topic_gone.set(true);
    }

    pub fn is_topic_gone(&self) -> bool {
        self.topic_gone.get()
    }

    /// When the run started.
    /// A timed schedule's end; `None` for a counted one.
    pub fn end(&self) -> Option<Instant> {
        match self.stop {
            Stop::At(end) => Some(end),
            Stop::Records(_) => None,
        }
    }

    pub fn start(&self) -> Instant {
        self.start
    }

    /// Records in a full request.
    pub fn batch_records(&self) -> u64 {
        self.batch_records
    }

    pub fn is_abandoned(&self) -> bool {
        self.abandoned.get()
    }
}

/// What the workers share, read-only but for the schedule.
pub struct Plan {
    pub server: Server,
    pub template: RequestTemplate,
    /// The body of a full request.
    pub body: Bytes,
    /// The body of the last, shorter batch of a counted run, if any.
    pub tail_body: Option<Bytes>,
    /// Flow mode: per-request bodies with stamped records instead.
    pub stamper: Option<Stamper>,
    pub schedule: Schedule,
    /// Whether a response status counts the request as a success.
    pub accepts: fn(u16) -> bool,
    /// Batch produce: a 202 acknowledges the batch only if its body says it
    /// accepted every record ([`batch_status`]).
    pub reads_accepted: bool,
    /// The requests go to a topic the run checked before it started, so a 404
    /// means it was deleted since ([`Schedule::topic_gone`]).
    pub to_topic: bool,
    /// The run's running tallies, for the status line and the series.
    pub live: Rc<Live>,
    /// Produce latency of every acknowledged request, all workers together:
    /// one histogram that the requests of every connection keep warm in the
    /// cache, where one per worker (a few hundred kilobytes each) would have
    /// each record touch a cold one.
    pub latencies_us: RefCell<Histogram<u64>>,
}

/// One worker's totals.
pub struct Tally {
    pub ok_records: u64,
    pub failed_records: u64,
    /// Failed records by the status that failed them (`STATUS_TRANSPORT` for
    /// no answer).
    pub errors: std::collections::BTreeMap<u16, u64>,
    /// How late its open-loop requests were written.
    pub send_lag: report::SendLag,
    /// When its last response ended.
    pub finished: Instant,
}

impl Tally {
    /// An empty tally.
    pub fn new() -> Tally {
        Tally {
            ok_records: 0,
            failed_records: 0,
            errors: std::collections::BTreeMap::new(),
            send_lag: report::SendLag::default(),
            finished: Instant::now(),
        }
    }
}

/// Sends requests over `conn` until the schedule runs out, counting into `tally`.
pub async fn worker(plan: Rc<Plan>, conn: Conn, mut tally: Tally) -> Tally {
    let mut link = Link::new(conn);
    tally.finished = Instant::now();
    let mut buf = BytesMut::new();
    let mut reply = Vec::new();
    // The end of the last acknowledged response, which is now as far as the
    // schedule can tell: one clock read fewer per request.
    let mut answered = None;
    while let Some(ticket) = plan
        .schedule
        .claim(answered.take().unwrap_or_else(Instant::now))
    {
        if let Some(due) = ticket.due {
            let now = Instant::now();
            if due > now {
                super::evloop::pause(due - now).await;
            }
        }
        let open = match link.get(&plan.server).await {
            Opened::Ready(open) => open,
            failed => {
                tally.failed_records += ticket.records;
                *tally
                    .errors
                    .entry(super::consumer::STATUS_TRANSPORT)
                    .or_default() += ticket.records;
                plan.live.failed(ticket.records);
                plan.schedule.failed(ticket.records);
                if matches!(failed, Opened::GiveUp) {
                    plan.schedule.abandon();
                    break;
                }
                continue;
            }
        };
        let stamped;
        let (body, first_id) = match (&plan.stamper, &plan.tail_body) {
            (Some(stamper), _) => {
                let first;
                // In an open loop a record counts as sent when it was due, so
                // that its end-to-end latency includes the wait for a free
                // connection, as its produce latency does.
                let now_unix_ns = stamp::unix_ns();
                let late_ns = ticket.due.map_or(0, |due| {
                    u64::try_from(Instant::now().saturating_duration_since(due).as_nanos())
                        .unwrap_or(u64::MAX)
                });
                let sent_unix_ns = now_unix_ns.saturating_sub(late_ns);
                (stamped, first) = stamper.body(&mut buf, ticket.records, sent_unix_ns);
                (&stamped[..], Some(first))
            }
            (None, Some(tail)) if ticket.records < plan.schedule.batch_records() => {
                (&tail[..], None)
            }
            (None, _) => (&plan.body[..], None),
        };
        let sent = match ticket.due {
            Some(due) => {
                tally
                    .send_lag
                    .note(Instant::now().saturating_duration_since(due));
                due
            }
            None => Instant::now(),
        };
        let request = plan.template.build(body);
        let result = match plan.reads_accepted {
            false => open.send(request).await,
            true => open
                .send_into(request, &mut reply)
                .await
                .map(|status| batch_status(status, &reply, ticket.records)),
        };
        let now = Instant::now();
        if let (Some(stamper), Some(first)) = (&plan.stamper, first_id) {
            let ok = matches!(&result, Ok(status) if (plan.accepts)(*status));
            stamper
                .ledger
                .borrow_mut()
                .produced(first, ticket.records, ok);
        }
        match result {
            Ok(status) if (plan.accepts)(status) => {
                tally.ok_records += ticket.records;
                let latency_us = u64::try_from(now.duration_since(sent).as_micros())
                    .unwrap_or(u64::MAX)
                    .max(1);
                plan.latencies_us.borrow_mut().saturating_record(latency_us);
                plan.live.produced(ticket.records, latency_us);
                answered = Some(now);
            }
            Ok(status) => {
                tally.failed_records += ticket.records;
                *tally.errors.entry(status).or_default() += ticket.records;
                plan.live.failed(ticket.records);
                if status == 404 && plan.to_topic {
                    plan.schedule.topic_gone();
                } else {
                    plan.schedule.failed(ticket.records);
                    super::evloop::sleep(super::consumer::ERROR_BACKOFF).await;
                }
            }
            Err(_) => {
                // The server closed the connection or it broke: open a new one
                // for the next request.
                tally.failed_records += ticket.records;
                *tally
                    .errors
                    .entry(super::consumer::STATUS_TRANSPORT)
                    .or_default() += ticket.records;
                plan.live.failed(ticket.records);
                plan.schedule.failed(ticket.records);
                link.drop_conn();
                // A server that takes connections and drops them at once
                // must not make this a hot loop of connects.
                super::evloop::sleep(super::consumer::ERROR_BACKOFF).await;
            }
        }
        tally.finished = now;
    }
    tally
}

/// A batch produce's answer as the tallies count it: a 202 acknowledges the
/// batch only if it says it accepted all `records`. One that says fewer, or
/// nothing readable, leaves unknown which records were stored, so the whole
/// batch fails as [`STATUS_UNREADABLE`](super::consumer::STATUS_UNREADABLE).
fn batch_status(status: u16, reply: &[u8], records: u64) -> u16 {
    #[derive(serde::Deserialize)]
    struct Accepted {
        accepted: u64,
    }
    match (status, serde_json::from_slice::<Accepted>(reply)) {
        (202, Ok(Accepted { accepted })) if accepted == records => 202,
        (202, _) => super::consumer::STATUS_UNREADABLE,
        (other, _) => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_counts_only_when_every_record_was_accepted() {
        assert_eq!(batch_status(202, br#"{"accepted":100}"#, 100), 202);
        let unreadable = super::super::consumer::STATUS_UNREADABLE;
        for short in [&br#"{"accepted":99}"#[..], b"{}", b"", b"accepted"] {
            assert_eq!(batch_status(202, short, 100), unreadable);
        }
        // Other statuses keep theirs, whatever the body.
        assert_eq!(batch_status(503, br#"{"accepted":100}"#, 100), 503);
    }

    #[test]
    fn payload_is_json_padded_to_size() {
        let p = payload(128);
        assert_eq!(p.len(), 128);
        assert!(p.starts_with(b"{\"bench\":\""));
        assert!(p.ends_with(b"\"}"));
        assert_eq!(p.iter().filter(|&&b| b == b'x').count(), 128 - 12);
        let value: serde_json::Value = serde_json::from_slice(&p).unwrap();
        assert_eq!(value["bench"].as_str().unwrap().len(), 116);
        assert_eq!(payload(12), b"{\"bench\":\"\"}");
    }

    #[test]
    fn batch_body_holds_the_payload_text() {
        let p = payload(40);
        let body = batch_body(&p, 50);
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let messages = value["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 50);
        for m in messages {
            assert_eq!(serde_json::to_vec(&m["payload"]).unwrap(), p);
            assert_eq!(m.as_object().unwrap().len(), 1);
        }
        // The payload's text, verbatim, which is what the broker stores.
        let text = std::str::from_utf8(&p).unwrap();
        assert!(std::str::from_utf8(&body)
            .unwrap()
            .contains(&format!(r#"{{"payload":{text}}}"#)));
    }

    #[test]
    fn stamped_batches_carry_consecutive_ids() {
        let ledger = Rc::new(RefCell::new(Ledger::new()));
        let payload = stamp::stamped_payload(80);
        let stamper = Stamper::new(7, &payload, Some((5, Some(2))), ledger.clone());
        let mut buf = BytesMut::new();
        for (records, first) in [(5, 0), (2, 5)] {
            let (body, got) = stamper.body(&mut buf, records, 1_700_000_000_000_000_000);
            assert_eq!(got, first);
            let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let messages = value["messages"].as_array().unwrap();
            assert_eq!(messages.len() as u64, records);
            for (i, m) in messages.iter().enumerate() {
                let text = serde_json::to_vec(&m["payload"]).unwrap();
                let text = &text[..];
                match stamp::read_payload(text) {
                    stamp::Reading::Stamped { stamp, len } => {
                        assert_eq!((stamp.run, stamp.id, len), (7, first + i as u64, 80));
                        assert_eq!(stamp.sent_unix_ns, 1_700_000_000_000_000_000);
                        assert!(stamp.sent_unix_ns > 0);
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
        let single = Stamper::new(9, &payload, None, ledger);
        let (body, first) = single.body(&mut buf, 1, 1_700_000_000_000_000_000);
        assert_eq!(first, 7);
        assert!(matches!(
            stamp::read_payload(&body),
            stamp::Reading::Stamped {
                stamp: Stamp { run: 9, id: 7, .. },
                len: 80
            }
        ));
    }

    #[test]
    fn counted_schedule_ends_with_a_short_batch() {
        let start = Instant::now();
        let schedule = Schedule::new(Stop::Records(120), 50, None, start);
        let records: Vec<u64> = std::iter::from_fn(|| schedule.claim(start))
            .map(|t| t.records)
            .collect();
        assert_eq!(records, [50, 50, 20]);
    }

    #[test]
    fn a_rate_whose_interval_is_not_whole_nanoseconds_does_not_drift() {
        let start = Instant::now();
        // 3 million a second: 333.33 ns apart, so the millionth is due at
        // 333,333,333 ns (a rounded 333 ns interval would put it at 333 ms).
        let schedule = Schedule::at_rate(
            Stop::At(start + Duration::from_secs(1)),
            1,
            Some(3e6),
            start,
        );
        let mut last = None;
        for _ in 0..1_000_001 {
            last = schedule.claim(start).and_then(|t| t.due);
        }
        assert_eq!(last, Some(start + Duration::from_nanos(333_333_333)));
    }

    #[test]
    fn open_loop_tickets_are_due_at_fixed_intervals() {
        let start = Instant::now();
        let interval = Duration::from_millis(10);
        let end = start + Duration::from_millis(35);
        let schedule = Schedule::new(Stop::At(end), 1, Some(interval), start);
        let dues: Vec<Instant> = std::iter::from_fn(|| schedule.claim(start))
            .map(|t| t.due.unwrap())
            .collect();
        assert_eq!(
            dues,
            [0, 10, 20, 30].map(|ms| start + Duration::from_millis(ms))
        );
        schedule.abandon();
        assert!(schedule.claim(start).is_none());
    }

    #[test]
    fn an_open_loop_behind_its_schedule_sends_late_for_a_grace_then_counts_the_rest_unsent() {
        let start = Instant::now();
        let end = start + Duration::from_millis(45);
        let schedule = Schedule::new(Stop::At(end), 2, Some(Duration::from_millis(10)), start);
        assert!(schedule.claim(start).is_some());
        // The request due at 10 ms is sent at the end, late (its latency
        // counts from 10 ms); those due at 20, 30 and 40 ms are still unsent
        // when the grace runs out.
        let late = schedule.claim(end).expect("due before the end");
        assert_eq!(late.due, Some(start + Duration::from_millis(10)));
        assert!(schedule.claim(end + LATE_GRACE).is_none());
        assert_eq!(schedule.unsent(), 3 * 2);
        assert!(schedule.claim(end + LATE_GRACE).is_none());
        assert_eq!(schedule.unsent(), 3 * 2, "counted once");
        assert!(!schedule.is_abandoned());
    }

    #[test]
    fn a_counted_run_sends_failed_records_again_until_failures_reach_the_count() {
        let start = Instant::now();
        let schedule = Schedule::new(Stop::Records(120), 50, None, start);
        let first = schedule.claim(start).unwrap();
        assert_eq!(first.records, 50);
        assert!(schedule.failed(50), "within the count: sent again");
        let records: Vec<u64> = std::iter::from_fn(|| schedule.claim(start))
            .map(|t| t.records)
            .collect();
        assert_eq!(
            records,
            [50, 50, 20],
            "120 records are still to be acknowledged"
        );
        // 50 failed so far; 70 more may fail and be sent again, not 71.
        assert!(schedule.failed(50));
        assert!(
            !schedule.failed(50),
            "past the count, a failure uses its records up"
        );
        assert_eq!(schedule.claim(start).unwrap().records, 50);
        assert!(schedule.claim(start).is_none());
        assert_eq!(schedule.retried(), 100);
        // A timed run never sends again.
        let timed = Schedule::new(Stop::At(start + Duration::from_secs(1)), 1, None, start);
        assert!(!timed.failed(1));
    }
}
