//! The consumers of the consume and flow modes: each a closed loop of one
//! long-poll consume and the ack of what it returned, on its own connection.
//!
//! Which cores: every consumer is a task on the generator's one executor; the
//! shared [`ConsumePlan`] is `Cell`s and a `RefCell` borrowed for one call at a
//! time, never across an `.await`.
//!
//! A message counts as consumed only once its ack is acknowledged (204, alone or
//! in a batch ack's results): a message whose ack fails will be delivered again,
//! and counting it twice would inflate the rate. With `--max` above 1 a consumer
//! asks for up to that many messages and acks the whole reply in one request.
//!
//! Replies are read into a buffer each consumer reuses and parsed in place: the
//! payload as raw JSON (the broker returns a JSON payload verbatim), the receipt
//! handle as a borrowed string.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use hdrhistogram::Histogram;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::client::{self, Conn, Link, Method, Opened, RequestTemplate, Server};
use super::live::Live;
use super::report;
use super::stamp::{self, Ledger, Reading};

/// How long a consume request may wait for a message.
pub const CONSUME_WAIT: &str = "1s";
/// The pause after a refused or failed request, so that a broker in trouble is
/// not hammered by a hot loop.
pub const ERROR_BACKOFF: Duration = Duration::from_millis(10);
/// The error key of a request that got no HTTP answer.
pub const STATUS_TRANSPORT: u16 = 0;
/// The error key of a success reply that could not be read, or that did not
/// acknowledge what was sent (a batch produce's `accepted`).
pub const STATUS_UNREADABLE: u16 = 1;
/// The error key of open-loop requests due before the end and never sent.
pub const STATUS_UNSENT: u16 = 2;

/// What the consumers share.
pub struct ConsumePlan {
    pub server: Server,
    consume: RequestTemplate,
    ack_single: RequestTemplate,
    ack_batch: RequestTemplate,
    ack_path: String,
    /// The consume path without its query, for a request that asks for fewer
    /// than `max` messages.
    consume_path: String,
    /// Messages per consume request; above 1, batch consume and batch ack.
    pub max: u32,
    /// In a counted run, the messages no consumer has claimed yet: a consume
    /// asks for at most these, and gives back what it did not get acked, so
    /// the run acks no more messages than it was told to. `None`: uncounted.
    quota: Option<Cell<u64>>,
    /// This run's tag, and the payload size of its records (flow mode).
    pub own_run: Option<(u32, usize)>,
    pub ledger: Rc<RefCell<Ledger>>,
    /// Set by the run: no new consume request after this.
    pub stop: Cell<bool>,
    /// Set by a consumer that cannot reach the server.
    pub abandoned: Cell<bool>,
    /// Set by a consumer answered 404: the topic was deleted under the run.
    pub topic_gone: Cell<bool>,
    /// When a consumer last had a message acknowledged.
    pub last_progress: Cell<Instant>,
    /// The run's running tallies, among them the messages consumed so far.
    pub live: Rc<Live>,
    /// Consume-to-ack latency per reply and end-to-end latency per message,
    /// all consumers together: one histogram each, kept warm in the cache by
    /// every consumer's records, where one per consumer would be cold (see
    /// `workload::Plan::latencies_us`). The run moves them into its merged
    /// tally at the end.
    pub cycle_latencies_us: RefCell<Histogram<u64>>,
    pub e2e_latencies_us: RefCell<Histogram<u64>>,
}

impl ConsumePlan {
    pub fn new(
        server: Server,
        topic: &str,
        max: u32,
        own_run: Option<(u32, usize)>,
        ledger: Rc<RefCell<Ledger>>,
        live: Rc<Live>,
    ) -> ConsumePlan {
        assert!((1..=super::config::CONSUME_MAX_RECORDS).contains(&max));
        let query = match max {
            1 => format!("/consume?wait={CONSUME_WAIT}"),
            n => format!("/consume?max={n}&wait={CONSUME_WAIT}"),
        };
        let consume =
            RequestTemplate::get(&client::topic_path(topic, &query), &server).with_client_header();
        let consume_path = client::topic_path(topic, "/consume");
        let ack_path = client::topic_path(topic, "/ack");
        let ack_single = RequestTemplate::new(Method::Post, &ack_path, &server, "application/json")
            .with_client_header();
        let ack_batch = RequestTemplate::new(Method::Post, &ack_path, &server, "application/json");
        ConsumePlan {
            server,
            consume,
            ack_single,
            ack_batch,
            ack_path,
            consume_path,
            max,
            quota: None,
            own_run,
            ledger,
            stop: Cell::new(false),
            abandoned: Cell::new(false),
            topic_gone: Cell::new(false),
            last_progress: Cell::new(Instant::now()),
            live,
            cycle_latencies_us: RefCell::new(report::latency_histogram()),
            e2e_latencies_us: RefCell::new(report::latency_histogram()),
        }
    }

    /// Moves the latencies the consumers recorded into `tally`, the run's
    /// merged one, once every consumer has ended.
    pub fn hand_latencies_to(&self, tally: &mut ConsumeTally) -> Result<(), String> {
        let merge_error = |e| format!("cannot merge latencies: {e}");
        tally
            .cycle_latencies_us
            .add(&*self.cycle_latencies_us.borrow())
            .map_err(merge_error)?;
        tally
            .e2e_latencies_us
            .add(&*self.e2e_latencies_us.borrow())
            .map_err(merge_error)?;
        self.cycle_latencies_us.borrow_mut().reset();
        self.e2e_latencies_us.borrow_mut().reset();
        Ok(())
    }

    /// Makes the run ack at most `records` messages.
    pub fn with_quota(mut self, records: u64) -> ConsumePlan {
        self.quota = Some(Cell::new(records));
        self
    }

    /// Claims the messages the next consume asks for: `max`, or fewer near the
    /// end of a counted run (0 while the rest is claimed by others).
    fn claim(&self) -> u32 {
        match &self.quota {
            None => self.max,
            Some(quota) => {
                let claimed = quota.get().min(u64::from(self.max));
                quota.set(quota.get() - claimed);
                claimed as u32
            }
        }
    }

    /// Gives back claimed messages that were not acked.
    fn unclaim(&self, records: u64) {
        if let Some(quota) = &self.quota {
            quota.set(quota.get() + records);
        }
    }
}

/// One consumer's totals.
pub struct ConsumeTally {
    /// Messages the broker delivered.
    pub received_records: u64,
    /// Messages whose ack was acknowledged.
    pub consumed_records: u64,
    /// Consume requests answered 204.
    pub empty_polls: u64,
    /// Messages another run or writer produced.
    pub foreign_records: u64,
    /// Messages whose payload is not what was sent.
    pub damaged_records: u64,
    /// Failed consume and ack requests (or ack results), by status.
    pub consume_errors: BTreeMap<u16, u64>,
    pub ack_errors: BTreeMap<u16, u64>,
    /// From sending a consume request to its ack's answer, per reply.
    pub cycle_latencies_us: Histogram<u64>,
    /// From a record's send time to its delivery, per message.
    pub e2e_latencies_us: Histogram<u64>,
    /// When its last acknowledged ack came back.
    pub last_consumed: Option<Instant>,
}

impl ConsumeTally {
    pub fn new() -> ConsumeTally {
        ConsumeTally {
            received_records: 0,
            consumed_records: 0,
            empty_polls: 0,
            foreign_records: 0,
            damaged_records: 0,
            consume_errors: BTreeMap::new(),
            ack_errors: BTreeMap::new(),
            cycle_latencies_us: report::latency_histogram(),
            e2e_latencies_us: report::latency_histogram(),
            last_consumed: None,
        }
    }

    /// Adds another consumer's totals to these.
    pub fn merge(&mut self, other: &ConsumeTally) -> Result<(), String> {
        self.received_records += other.received_records;
        self.consumed_records += other.consumed_records;
        self.empty_polls += other.empty_polls;
        self.foreign_records += other.foreign_records;
        self.damaged_records += other.damaged_records;
        for (status, n) in &other.consume_errors {
            *self.consume_errors.entry(*status).or_default() += n;
        }
        for (status, n) in &other.ack_errors {
            *self.ack_errors.entry(*status).or_default() += n;
        }
        let merge_error = |e| format!("cannot merge latencies: {e}");
        self.cycle_latencies_us
            .add(&other.cycle_latencies_us)
            .map_err(merge_error)?;
        self.e2e_latencies_us
            .add(&other.e2e_latencies_us)
            .map_err(merge_error)?;
        self.last_consumed = self.last_consumed.max(other.last_consumed);
        Ok(())
    }

    /// Answers of 500 or more, to consumes and acks.
    pub fn server_errors(&self) -> u64 {
        let fives = |m: &BTreeMap<u16, u64>| m.range(500..).map(|(_, n)| n).sum::<u64>();
        fives(&self.consume_errors) + fives(&self.ack_errors)
    }
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    payload: &'a RawValue,
    /// `base64` when the payload came back as base64 (it was not UTF-8).
    #[serde(borrow, default)]
    payload_encoding: Option<&'a str>,
    #[serde(borrow)]
    receipt_handle: &'a str,
}

#[derive(Deserialize)]
struct Batch<'a> {
    #[serde(borrow)]
    messages: Vec<Message<'a>>,
}

#[derive(Deserialize)]
struct AckResult {
    status: u16,
}

#[derive(Deserialize)]
struct AckResults {
    results: Vec<AckResult>,
}

/// The messages of one reply, waiting for their ack.
struct Pending {
    /// This run's record id of each message, if it is one.
    ids: Vec<Option<u64>>,
    /// Each message's end-to-end latency (µs), if it tells one: recorded once
    /// its ack succeeds, so a delivery whose ack fails (and the record comes
    /// again) is not counted twice.
    e2e_us: Vec<Option<u64>>,
    /// The single ack's target, or the batch ack's body.
    ack_query: String,
    ack_body: BytesMut,
}

/// Consumes over `conn` until the plan says stop.
pub async fn consumer(plan: Rc<ConsumePlan>, conn: Conn, mut tally: ConsumeTally) -> ConsumeTally {
    let mut cycle = Cycle {
        link: Link::new(conn),
        reply: Vec::new(),
        pending: Pending {
            ids: Vec::with_capacity(plan.max as usize),
            e2e_us: Vec::with_capacity(plan.max as usize),
            ack_query: String::new(),
            ack_body: BytesMut::new(),
        },
        target: String::new(),
    };
    while !plan.stop.get() {
        let want = plan.claim();
        if want == 0 {
            super::evloop::sleep(QUOTA_RECHECK).await;
            continue;
        }
        let before = tally.consumed_records;
        let go_on = cycle.run(&plan, want, &mut tally).await;
        plan.unclaim(u64::from(want) - (tally.consumed_records - before));
        if !go_on {
            break;
        }
    }
    tally
}

/// How often a consumer of a counted run whose rest is claimed by others
/// looks whether some of it was given back.
const QUOTA_RECHECK: Duration = Duration::from_millis(5);

/// A consumer's connection and the buffers it reuses from cycle to cycle.
struct Cycle {
    link: Link,
    reply: Vec<u8>,
    pending: Pending,
    /// The target of a consume that asks for fewer than the plan's `max`.
    target: String,
}

impl Cycle {
    /// One consume of up to `want` messages and the ack of what it returned.
    /// False when the server cannot be reached.
    async fn run(&mut self, plan: &ConsumePlan, want: u32, tally: &mut ConsumeTally) -> bool {
        let open = match self.link.get(&plan.server).await {
            Opened::Ready(open) => open,
            Opened::Retry => return true,
            Opened::GiveUp => {
                plan.abandoned.set(true);
                plan.stop.set(true);
                return false;
            }
        };
        let started = Instant::now();
        let request = if want == plan.max {
            plan.consume.build(&[])
        } else {
            self.target.clear();
            let _ = write!(
                self.target,
                "{}?max={want}&wait={CONSUME_WAIT}",
                plan.consume_path
            );
            plan.consume.build_to(&self.target, &[])
        };
        let status = match open.send_into(request, &mut self.reply).await {
            Ok(status) => status,
            Err(_) => {
                count(&plan.live, &mut tally.consume_errors, STATUS_TRANSPORT);
                self.link.drop_conn();
                return true;
            }
        };
        match status {
            200 => {}
            204 => {
                tally.empty_polls += 1;
                return true;
            }
            404 => {
                // The run checked the topic before it started: it was deleted.
                count(&plan.live, &mut tally.consume_errors, 404);
                plan.topic_gone.set(true);
                plan.stop.set(true);
                return false;
            }
            other => {
                count(&plan.live, &mut tally.consume_errors, other);
                super::evloop::sleep(ERROR_BACKOFF).await;
                return true;
            }
        }
        if let Err(()) = take_reply(plan, want, &self.reply, &mut self.pending, tally) {
            count(&plan.live, &mut tally.consume_errors, STATUS_UNREADABLE);
            return true;
        }
        if self.pending.ids.is_empty() {
            return true;
        }
        // An ack that got no answer is sent again on a fresh connection (as
        // the reference client does, up to five times): given up, its records
        // would stay leased for the visibility timeout, past the drain.
        let (reply, pending) = (&mut self.reply, &mut self.pending);
        let mut acked = ack(plan, open, reply, pending, tally, false).await;
        // Retried after the drain's stop too: an ack the broker applied but
        // whose answer was lost would otherwise count its records missing.
        for _ in 1..ACK_ATTEMPTS {
            if acked.is_ok() {
                break;
            }
            self.link.drop_conn();
            let Opened::Ready(fresh) = self.link.get(&plan.server).await else {
                continue;
            };
            acked = ack(plan, fresh, reply, pending, tally, true).await;
        }
        if acked.is_err() {
            self.link.drop_conn();
            return true;
        }
        let now = Instant::now();
        let cycle_us = u64::try_from(now.duration_since(started).as_micros()).unwrap_or(u64::MAX);
        plan.cycle_latencies_us
            .borrow_mut()
            .saturating_record(cycle_us.max(1));
        true
    }
}

/// Times an ack is sent before its records are left to their lease.
const ACK_ATTEMPTS: usize = 5;

/// Counts a failed request (or batch ack result) by its status.
fn count(live: &Live, errors: &mut BTreeMap<u16, u64>, status: u16) {
    *errors.entry(status).or_default() += 1;
    live.consume_failed();
}

/// Reads a consume reply of at most `want` messages: checks each payload,
/// notes its end-to-end latency, and prepares the ack of every message in
/// `pending`.
fn take_reply(
    plan: &ConsumePlan,
    want: u32,
    reply: &[u8],
    pending: &mut Pending,
    tally: &mut ConsumeTally,
) -> Result<(), ()> {
    let delivered_unix_ns = stamp::unix_ns();
    pending.ids.clear();
    pending.e2e_us.clear();
    pending.ack_query.clear();
    pending.ack_body.clear();
    let mut take = |message: &Message, pending: &mut Pending| {
        tally.received_records += 1;
        let mut e2e_us = None;
        let id = match read_message_payload(message) {
            Reading::Stamped { stamp, len } => match plan.own_run {
                Some((run, size)) if stamp.run == run => {
                    if len == size {
                        e2e_us = Some(e2e_micros(delivered_unix_ns, stamp.sent_unix_ns));
                        Some(stamp.id)
                    } else {
                        tally.damaged_records += 1;
                        None
                    }
                }
                Some(_) => {
                    tally.foreign_records += 1;
                    None
                }
                None => {
                    // Consume mode: any run's records tell their age.
                    e2e_us = Some(e2e_micros(delivered_unix_ns, stamp.sent_unix_ns));
                    None
                }
            },
            // A produce-mode run's record: intact, but another run's in flow mode.
            Reading::Plain if plan.own_run.is_none() => None,
            Reading::Plain | Reading::Foreign => {
                tally.foreign_records += 1;
                None
            }
            Reading::Damaged => {
                tally.damaged_records += 1;
                None
            }
        };
        pending.ids.push(id);
        pending.e2e_us.push(e2e_us);
    };
    if plan.max == 1 {
        let message: Message = serde_json::from_slice(reply).map_err(|_| ())?;
        take(&message, pending);
        let _ = write!(
            pending.ack_query,
            "{}?receipt_handle={}",
            plan.ack_path, message.receipt_handle
        );
        return Ok(());
    }
    let batch: Batch = serde_json::from_slice(reply).map_err(|_| ())?;
    if batch.messages.len() > want as usize {
        return Err(());
    }
    pending.ack_body.put_slice(b"{\"receipt_handles\":[");
    for (i, message) in batch.messages.iter().enumerate() {
        take(message, pending);
        if i > 0 {
            pending.ack_body.put_u8(b',');
        }
        // A handle is `partition:offset:nonce`: nothing in it needs escaping.
        if message
            .receipt_handle
            .bytes()
            .any(|b| b == b'"' || b == b'\\')
        {
            return Err(());
        }
        pending.ack_body.put_u8(b'"');
        pending
            .ack_body
            .put_slice(message.receipt_handle.as_bytes());
        pending.ack_body.put_u8(b'"');
    }
    pending.ack_body.put_slice(b"]}");
    Ok(())
}

/// A delivery's end-to-end latency in µs (at least 1).
fn e2e_micros(delivered_unix_ns: u64, sent_unix_ns: u64) -> u64 {
    (delivered_unix_ns.saturating_sub(sent_unix_ns) / 1000).max(1)
}

/// Acks the messages of `pending`; counts those acknowledged. An error means
/// the connection broke.
/// Acks the records of `pending`. A `retry` follows an attempt that got no
/// answer, which the broker may have applied: a handle it calls settled (410)
/// then was acked by that attempt. (A lease cannot have lapsed meanwhile: the
/// retries take far less than a visibility timeout.)
async fn ack(
    plan: &ConsumePlan,
    conn: &mut Conn,
    reply: &mut Vec<u8>,
    pending: &mut Pending,
    tally: &mut ConsumeTally,
    retry: bool,
) -> Result<(), ()> {
    let request = if plan.max == 1 {
        assert_eq!(pending.ids.len(), 1);
        // The handle came from the server: one that cannot stand in a
        // request line is a reply this client cannot act on.
        if !client::is_request_target(&pending.ack_query) {
            count(&plan.live, &mut tally.ack_errors, STATUS_UNREADABLE);
            return Ok(());
        }
        plan.ack_single.build_to(&pending.ack_query, &[])
    } else {
        plan.ack_batch.build(&pending.ack_body)
    };
    let status = match conn.send_into(request, reply).await {
        Ok(status) => status,
        Err(_) => {
            count(&plan.live, &mut tally.ack_errors, STATUS_TRANSPORT);
            return Err(());
        }
    };
    let now = Instant::now();
    let before = tally.consumed_records;
    let acked = |i: usize, tally: &mut ConsumeTally| {
        tally.consumed_records += 1;
        if let Some(id) = pending.ids[i] {
            plan.ledger.borrow_mut().consumed(id);
        }
        if let Some(us) = pending.e2e_us[i] {
            plan.e2e_latencies_us.borrow_mut().saturating_record(us);
            plan.live.delivered(us);
        }
    };
    match (plan.max, status) {
        (1, 204) => acked(0, tally),
        (1, 410) if retry => acked(0, tally),
        (1, other) => count(&plan.live, &mut tally.ack_errors, other),
        (_, 200) => {
            let results: AckResults = match serde_json::from_slice(reply) {
                Ok(results) => results,
                Err(_) => {
                    count(&plan.live, &mut tally.ack_errors, STATUS_UNREADABLE);
                    return Ok(());
                }
            };
            if results.results.len() != pending.ids.len() {
                count(&plan.live, &mut tally.ack_errors, STATUS_UNREADABLE);
                return Ok(());
            }
            for (i, result) in results.results.iter().enumerate() {
                match result.status {
                    204 => acked(i, tally),
                    410 if retry => acked(i, tally),
                    other => count(&plan.live, &mut tally.ack_errors, other),
                }
            }
        }
        (_, other) => count(&plan.live, &mut tally.ack_errors, other),
    }
    let newly = tally.consumed_records - before;
    assert!(newly <= pending.ids.len() as u64);
    if newly > 0 {
        tally.last_consumed = Some(now);
        plan.last_progress.set(now);
        plan.live.consumed(newly);
    }
    Ok(())
}

/// Reads a consumed message's payload. The broker returns a payload verbatim
/// only when it is JSON, as every stamped payload is; one that comes back as a
/// JSON string or as base64 and starts like a stamped payload is a stamped
/// payload that is no longer JSON, so damaged, not another writer's.
fn read_message_payload(message: &Message<'_>) -> Reading {
    let raw = message.payload.get().as_bytes();
    if raw.first() != Some(&b'"') {
        return stamp::read_payload(raw);
    }
    let Ok(text) = serde_json::from_slice::<std::borrow::Cow<'_, str>>(raw) else {
        return Reading::Foreign;
    };
    let stamped_head = |bytes: &[u8]| bytes.starts_with(stamp::PAYLOAD_HEAD);
    let damaged = match message.payload_encoding {
        Some("base64") => {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD
                .decode(text.as_bytes())
                .is_ok_and(|bytes| stamped_head(&bytes))
        }
        _ => stamped_head(text.as_bytes()),
    };
    if damaged {
        Reading::Damaged
    } else {
        Reading::Foreign
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(max: u32) -> ConsumePlan {
        let server = Server::parse("http://127.0.0.1:7942").unwrap();
        let ledger = Rc::new(RefCell::new(Ledger::new()));
        let live = Rc::new(Live::new(Instant::now()));
        ConsumePlan::new(server, "t", max, Some((5, 70)), ledger, live)
    }

    fn message(payload: &str, handle: &str) -> String {
        format!(
            r#"{{"topic":"t","partition":0,"offset":1,"payload":{payload},"timestamp":1,"timestamp_ms":1000,"receipt_handle":"{handle}"}}"#
        )
    }

    fn own_payload(id: u64) -> String {
        let mut p = stamp::stamped_payload(70);
        let s = stamp::Stamp {
            run: 5,
            id,
            sent_unix_ns: stamp::unix_ns(),
        };
        stamp::write_stamp(&mut p[stamp::PAYLOAD_HEAD.len()..][..stamp::STAMP_BYTES], s);
        String::from_utf8(p).unwrap()
    }

    fn pending() -> Pending {
        Pending {
            ids: Vec::new(),
            e2e_us: Vec::new(),
            ack_query: String::new(),
            ack_body: BytesMut::new(),
        }
    }

    #[test]
    fn a_single_reply_is_read_and_its_ack_targeted() {
        let plan = plan(1);
        let mut tally = ConsumeTally::new();
        let mut pending = pending();
        let reply = message(&own_payload(3), "0:1:77");
        take_reply(&plan, plan.max, reply.as_bytes(), &mut pending, &mut tally).unwrap();
        assert_eq!(pending.ids, [Some(3)]);
        assert_eq!(pending.ack_query, "/v1/topics/t/ack?receipt_handle=0:1:77");
        // Its end-to-end latency counts once its ack succeeds, not before.
        assert!(pending.e2e_us[0].is_some_and(|us| us >= 1));
        assert_eq!(tally.e2e_latencies_us.len(), 0);
        assert!(take_reply(&plan, plan.max, b"{}", &mut pending, &mut tally).is_err());
    }

    #[test]
    fn a_batch_reply_sorts_own_foreign_and_damaged_records() {
        let plan = plan(10);
        let mut tally = ConsumeTally::new();
        let mut pending = pending();
        let damaged = own_payload(4).replace("xx", "xy");
        let reply = format!(
            r#"{{"messages":[{},{},{}]}}"#,
            message(&own_payload(9), "1:2:3"),
            message(r#""plain text""#, "1:3:4"),
            message(&damaged, "1:4:5"),
        );
        take_reply(&plan, plan.max, reply.as_bytes(), &mut pending, &mut tally).unwrap();
        assert_eq!(pending.ids, [Some(9), None, None]);
        assert_eq!(
            &pending.ack_body[..],
            br#"{"receipt_handles":["1:2:3","1:3:4","1:4:5"]}"#
        );
        assert_eq!(tally.received_records, 3);
        assert_eq!((tally.foreign_records, tally.damaged_records), (1, 1));
    }

    /// A stamped payload damaged so that it is no longer JSON comes back as a
    /// JSON string, or as base64 when it is no longer UTF-8 either: damaged,
    /// not another writer's.
    #[test]
    fn a_stamped_payload_returned_as_text_or_base64_is_damaged() {
        use base64::Engine;
        let plan = plan(10);
        let mut tally = ConsumeTally::new();
        let mut pending = pending();
        let torn = own_payload(4);
        let torn = serde_json::to_string(&torn[..torn.len() - 1]).unwrap();
        let mut flipped = own_payload(5).into_bytes();
        flipped[20] = 0xff;
        let flipped = base64::engine::general_purpose::STANDARD.encode(flipped);
        let other = base64::engine::general_purpose::STANDARD.encode([0xffu8, 1, 2]);
        let base64_message = |payload: &str, handle: &str| {
            message(&format!("\"{payload}\""), handle).replace(
                r#","timestamp":"#,
                r#","payload_encoding":"base64","timestamp":"#,
            )
        };
        let reply = format!(
            r#"{{"messages":[{},{},{},{}]}}"#,
            message(&torn, "1:2:3"),
            base64_message(&flipped, "1:3:4"),
            base64_message(&other, "1:4:5"),
            message(r#""{\"bench\" but text""#, "1:5:6"),
        );
        take_reply(&plan, plan.max, reply.as_bytes(), &mut pending, &mut tally).unwrap();
        assert_eq!(pending.ids, [None, None, None, None]);
        assert_eq!((tally.damaged_records, tally.foreign_records), (2, 2));
    }

    #[test]
    fn a_counted_run_claims_no_more_than_its_quota() {
        let plan = plan(10).with_quota(23);
        assert_eq!([plan.claim(), plan.claim(), plan.claim()], [10, 10, 3]);
        assert_eq!(plan.claim(), 0);
        plan.unclaim(2);
        assert_eq!([plan.claim(), plan.claim()], [2, 0]);
        // Uncounted, every consume asks for the plan's max.
        let uncounted = self::plan(10);
        assert_eq!([uncounted.claim(), uncounted.claim()], [10, 10]);
    }

    #[test]
    fn a_batch_reply_longer_than_asked_for_is_refused() {
        let plan = plan(10);
        let mut tally = ConsumeTally::new();
        let mut pending = pending();
        let reply = format!(
            r#"{{"messages":[{},{}]}}"#,
            message(&own_payload(1), "1:2:3"),
            message(&own_payload(2), "1:3:4"),
        );
        assert!(take_reply(&plan, 1, reply.as_bytes(), &mut pending, &mut tally).is_err());
        take_reply(&plan, 2, reply.as_bytes(), &mut pending, &mut tally).unwrap();
        assert_eq!(pending.ids, [Some(1), Some(2)]);
    }
}
