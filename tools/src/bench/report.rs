//! What a run measured and how it is printed: the reference's human line on
//! standard error and, with `--json`, one machine-readable line on standard out.
//!
//! Percentiles follow the reference's definition, the element at index
//! `int(p·(n−1))` of the sorted latencies, rather than hdrhistogram's own
//! quantile (which rounds the rank up), so that figures compare with the
//! reference's. The latencies are held in an hdrhistogram at three significant
//! digits instead of a sorted vector: a long run records millions of them, and
//! the error this adds (under 0.1 %) vanishes in the human line's rounding to
//! 100 µs.
//!
//! The consume and flow modes add the reference's consume line (messages
//! consumed, that is acknowledged), a consume figures line (messages received;
//! the latency of a consume and its ack), an
//! end-to-end line (a record's send time to its delivery), a line of errors by
//! status when there are any, and with `--verify` the ledger's verdict.
//!
//! Which cores: the caller's thread, after the run; pure functions.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;

use super::config::Settings;
use super::consumer::{ConsumeTally, STATUS_TRANSPORT, STATUS_UNREADABLE, STATUS_UNSENT};
use super::stamp::Verdict;

/// The largest latency recorded exactly; longer ones are recorded as this.
pub const LATENCY_US_MAX: u64 = 3_600_000_000;

/// The human line's latency resolution.
const LATENCY_ROUNDING_US: u64 = 100;

/// A new latency histogram, in microseconds.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("the bounds are valid")
}

/// How well an open-loop run kept its schedule: requests written to their
/// connection later than [`SendLag::LATE`] after they were due, and the
/// latest. A generator that falls behind its own schedule measures itself, so
/// a run that shows many late writes says more about the generator than about
/// the server.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SendLag {
    pub late_requests: u64,
    pub max_us: u64,
}

impl SendLag {
    /// Later than this after its due time, a request counts as late.
    pub const LATE: Duration = Duration::from_millis(1);

    /// Notes a request written `lag` after it was due.
    pub fn note(&mut self, lag: Duration) {
        if lag > Self::LATE {
            self.late_requests += 1;
        }
        let us = u64::try_from(lag.as_micros()).unwrap_or(u64::MAX);
        self.max_us = self.max_us.max(us);
    }

    pub fn merge(&mut self, other: SendLag) {
        self.late_requests += other.late_requests;
        self.max_us = self.max_us.max(other.max_us);
    }
}

/// The totals of one run.
pub struct Summary {
    /// Records the server accepted.
    pub ok_records: u64,
    /// Records of requests that failed (transport error or status ≥ 400).
    pub failed_records: u64,
    /// From the first request to the end of the last response.
    pub elapsed: Duration,
    /// Latency of each successful request, in microseconds.
    pub latencies_us: Histogram<u64>,
    /// The requested rate of an open-loop run, in records per second.
    pub target_rate: Option<f64>,
    /// Failed records by status ([`STATUS_TRANSPORT`] for no answer).
    pub errors: BTreeMap<u16, u64>,
    /// Payload bytes of one record (0 for pings).
    pub record_bytes: usize,
    /// How late requests were written after their due time (open loop only).
    pub send_lag: SendLag,
}

impl Summary {
    /// Accepted records per second.
    pub fn rate(&self) -> f64 {
        let seconds = self.elapsed.as_secs_f64();
        if seconds > 0.0 {
            self.ok_records as f64 / seconds
        } else {
            0.0
        }
    }

    /// The latency at percentile `p` (0 to 1), in microseconds; 0 if none.
    pub fn percentile_us(&self, p: f64) -> u64 {
        histogram_percentile(&self.latencies_us, p)
    }

    /// `produce: <ok> ok, <fail> failed in <t> — <rate> msg/s; latency p50=… p95=… p99=…`,
    /// or the same for other requests than produces: `ping: … req/s; …`.
    pub fn human_line_named(&self, name: &str, unit: &str) -> String {
        let target = match self.target_rate {
            Some(rate) => format!(" (target {})", rate_figure(rate)),
            None => String::new(),
        };
        let pct = |p| go_duration(round_latency(self.percentile_us(p)));
        format!(
            "{name}: {} ok, {} failed in {} — {:.0} {unit}/s{target}; latency p50={} p95={} p99={}",
            self.ok_records,
            self.failed_records,
            go_duration(round_to_ms(self.elapsed)),
            self.rate(),
            pct(0.50),
            pct(0.95),
            pct(0.99),
        )
    }

    /// For an open-loop run, how well the generator kept its schedule:
    /// `open loop: N of M requests written more than 1ms after they were due (latest …)`.
    pub fn schedule_line(&self) -> Option<String> {
        self.target_rate?;
        let requests = self.latencies_us.len() + self.failed_records;
        Some(format!(
            "open loop: {} of {requests} requests written more than {} after they were due (latest {})",
            self.send_lag.late_requests,
            go_duration(SendLag::LATE),
            go_duration(round_latency(self.send_lag.max_us)),
        ))
    }

    /// Accepted payload megabytes (10^6 bytes) per second.
    pub fn megabytes_per_second(&self) -> f64 {
        self.rate() * self.record_bytes as f64 / 1e6
    }

    /// The line after the reference's: rate, bandwidth, the whole latency
    /// spread and the errors by status:
    /// `produce figures: R msg/s, B MB/s; latency p50=… p90=… p99=… p99.9=… max=…; errors: none`
    pub fn figures_line(&self, name: &str, unit: &str) -> String {
        let pct = |p| go_duration(round_latency(self.percentile_us(p)));
        format!(
            "{name} figures: {:.0} {unit}/s, {:.1} MB/s; latency p50={} p90={} p99={} p99.9={} max={}; errors: {}",
            self.rate(),
            self.megabytes_per_second(),
            pct(0.50),
            pct(0.90),
            pct(0.99),
            pct(0.999),
            go_duration(round_latency(self.latencies_us.max())),
            errors_text(&self.errors),
        )
    }

    /// The produce fields of the `--json` line.
    fn json_value(&self) -> serde_json::Value {
        serde_json::json!({
            "ok": self.ok_records,
            "failed": self.failed_records,
            "errors": errors_json(&self.errors),
            "seconds": self.elapsed.as_secs_f64(),
            "rate": self.rate(),
            "mb_per_s": self.megabytes_per_second(),
            "p50_us": self.percentile_us(0.50),
            "p90_us": self.percentile_us(0.90),
            "p95_us": self.percentile_us(0.95),
            "p99_us": self.percentile_us(0.99),
            "p999_us": self.percentile_us(0.999),
            "max_us": self.latencies_us.max(),
            "late_sends": self.send_lag.late_requests,
            "max_send_lag_us": self.send_lag.max_us,
        })
    }
}

/// What the consumers of a run measured.
pub struct ConsumeSummary {
    pub tally: ConsumeTally,
    /// From the start of the run to the last acknowledged ack.
    pub elapsed: Duration,
    /// Records consumed more than once (flow mode).
    pub duplicate_records: u64,
    /// With `--verify`: the ledger's verdict.
    pub verdict: Option<Verdict>,
    /// When the drain ended at its time limit with records outstanding while
    /// the consumers were still acking: that limit. Records not consumed then
    /// were not drained, which says nothing about their loss.
    pub drain_cut_short: Option<Duration>,
}

impl ConsumeSummary {
    fn per_second(&self, records: u64) -> f64 {
        let seconds = self.elapsed.as_secs_f64();
        if seconds > 0.0 {
            records as f64 / seconds
        } else {
            0.0
        }
    }

    /// Consumed (acknowledged) messages per second.
    pub fn consumed_rate(&self) -> f64 {
        self.per_second(self.tally.consumed_records)
    }

    pub fn received_rate(&self) -> f64 {
        self.per_second(self.tally.received_records)
    }

    /// The human lines.
    pub fn human_lines(&self) -> Vec<String> {
        let t = &self.tally;
        let pct = |h: &Histogram<u64>, p| go_duration(round_latency(histogram_percentile(h, p)));
        // The reference's line, then the figures it lacks.
        let mut lines = vec![
            format!(
                "consume: {} msgs in {} ({:.0} msg/s)",
                t.consumed_records,
                go_duration(round_to_ms(self.elapsed)),
                self.consumed_rate(),
            ),
            format!(
                "consume figures: {} consumed, {} received ({:.0} msg/s); \
                 consume+ack latency p50={} p95={} p99={}; {} duplicates",
                t.consumed_records,
                t.received_records,
                self.received_rate(),
                pct(&t.cycle_latencies_us, 0.50),
                pct(&t.cycle_latencies_us, 0.95),
                pct(&t.cycle_latencies_us, 0.99),
                self.duplicate_records,
            ),
        ];
        let e2e = &t.e2e_latencies_us;
        if !e2e.is_empty() {
            lines.push(format!(
                "end-to-end: p50={} p95={} p99={} p99.9={} max={}",
                pct(e2e, 0.50),
                pct(e2e, 0.95),
                pct(e2e, 0.99),
                pct(e2e, 0.999),
                go_duration(round_latency(e2e.max())),
            ));
        }
        if !t.consume_errors.is_empty() || !t.ack_errors.is_empty() {
            lines.push(format!(
                "errors: consume {}; ack {}",
                errors_text(&t.consume_errors),
                errors_text(&t.ack_errors)
            ));
        }
        if t.foreign_records > 0 || t.damaged_records > 0 {
            lines.push(format!(
                "payloads: {} from elsewhere, {} damaged",
                t.foreign_records, t.damaged_records
            ));
        }
        if let Some(v) = &self.verdict {
            lines.push(format!(
                "verify: {} produced, {} missing, {} duplicates, {} damaged, {} unknown ids{}",
                v.produced_ok_records,
                v.missing_records,
                v.duplicate_records,
                t.damaged_records,
                v.unknown_records,
                match v.untracked_records {
                    0 => String::new(),
                    n => format!(", {n} past the tracked range"),
                }
            ));
        }
        lines
    }

    /// The consume fields of the `--json` line.
    fn json_fields(&self, out: &mut serde_json::Map<String, serde_json::Value>) {
        let t = &self.tally;
        let mut put = |key: &str, value: serde_json::Value| {
            out.insert(key.to_string(), value);
        };
        put("consumed", t.consumed_records.into());
        put("received", t.received_records.into());
        put("consume_seconds", self.elapsed.as_secs_f64().into());
        put("consumed_rate", self.consumed_rate().into());
        put("received_rate", self.received_rate().into());
        put("empty_polls", t.empty_polls.into());
        put("consume_latency", latency_json(&t.cycle_latencies_us));
        put("e2e_latency", latency_json(&t.e2e_latencies_us));
        put("consume_errors", errors_json(&t.consume_errors));
        put("ack_errors", errors_json(&t.ack_errors));
        put("server_errors", t.server_errors().into());
        put("foreign", t.foreign_records.into());
        put("damaged", t.damaged_records.into());
        put("duplicates", self.duplicate_records.into());
        match &self.verdict {
            Some(v) => {
                put("produced_ok", v.produced_ok_records.into());
                put("missing", v.missing_records.into());
                put("unknown", v.unknown_records.into());
                put("untracked", v.untracked_records.into());
            }
            None => put("missing", serde_json::Value::Null),
        }
    }
}

/// How a run ended. The figures of a run cut short cover only its time, so a
/// script reading the `--json` line, or a reader of the report, must be told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Its count or its time ran out.
    Completed,
    /// Ctrl-C or SIGTERM.
    Interrupted,
    /// The server stopped accepting connections.
    ServerGone,
    /// The topic was deleted during the run.
    TopicGone,
}

impl Ended {
    /// The `ended` field of the `--json` line.
    pub fn name(self) -> &'static str {
        match self {
            Ended::Completed => "completed",
            Ended::Interrupted => "interrupted",
            Ended::ServerGone => "server_gone",
            Ended::TopicGone => "topic_gone",
        }
    }

    /// Why the run ended early, for people; `None` when it did not. The
    /// figures cover the run until then.
    pub fn early_reason(self) -> Option<&'static str> {
        match self {
            Ended::Completed => None,
            Ended::Interrupted => Some("interrupted"),
            Ended::ServerGone => Some("the server stopped accepting connections"),
            Ended::TopicGone => Some("the topic was deleted during the run (answered 404)"),
        }
    }
}

/// The `--json` line of a run: the produce fields (as before) and the consume
/// fields, whichever the mode has, and the settings that produced them.
pub fn json_line(
    settings: &Settings,
    ended: Ended,
    produce: Option<&Summary>,
    consume: Option<&ConsumeSummary>,
) -> String {
    let mut out = serde_json::Map::new();
    out.insert("mode".into(), settings.mode.name().into());
    out.insert("topic".into(), settings.topic.as_str().into());
    out.insert("ended".into(), ended.name().into());
    out.insert("settings".into(), settings.json_value());
    if let Some(produce) = produce {
        if let serde_json::Value::Object(fields) = produce.json_value() {
            out.extend(fields);
        }
    }
    if let Some(consume) = consume {
        consume.json_fields(&mut out);
    }
    serde_json::Value::Object(out).to_string()
}

fn status_name(status: u16) -> String {
    match status {
        STATUS_TRANSPORT => "transport".into(),
        STATUS_UNREADABLE => "unreadable".into(),
        STATUS_UNSENT => "unsent".into(),
        other => other.to_string(),
    }
}

fn errors_text(errors: &BTreeMap<u16, u64>) -> String {
    if errors.is_empty() {
        return "none".into();
    }
    let parts: Vec<String> = errors
        .iter()
        .map(|(status, n)| format!("{}×{n}", status_name(*status)))
        .collect();
    parts.join(" ")
}

fn errors_json(errors: &BTreeMap<u16, u64>) -> serde_json::Value {
    errors
        .iter()
        .map(|(status, n)| (status_name(*status), serde_json::Value::from(*n)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn latency_json(h: &Histogram<u64>) -> serde_json::Value {
    serde_json::json!({
        "count": h.len(),
        "p50_us": histogram_percentile(h, 0.50),
        "p90_us": histogram_percentile(h, 0.90),
        "p95_us": histogram_percentile(h, 0.95),
        "p99_us": histogram_percentile(h, 0.99),
        "p999_us": histogram_percentile(h, 0.999),
        "max_us": h.max(),
    })
}

/// The reference's rank: index `int(p·(n−1))` into the sorted values.
pub fn rank(p: f64, n: u64) -> u64 {
    assert!((0.0..=1.0).contains(&p), "a percentile is within 0..=1");
    assert!(n > 0);
    let index = (p * (n - 1) as f64) as u64;
    assert!(index < n);
    index
}

/// The reference's percentile over sorted values: the definition the
/// histogram's reading is tested against.
/// An open loop's target as the line prints it: whole units from 10 up,
/// else with two decimals (a target of 0.2 records a second is not 0). The
/// achieved rate keeps the reference's whole units.
pub(super) fn rate_figure(rate: f64) -> String {
    if rate >= 10.0 || rate == 0.0 {
        format!("{rate:.0}")
    } else {
        format!("{rate:.2}")
    }
}

#[cfg(test)]
pub fn sorted_percentile(sorted: &[u64], p: f64) -> Option<u64> {
    debug_assert!(sorted.is_sorted());
    let n = sorted.len() as u64;
    (n > 0).then(|| sorted[rank(p, n) as usize])
}

/// The same percentile read from a histogram: the value holding rank
/// `int(p·(n−1))`.
pub fn histogram_percentile(histogram: &Histogram<u64>, p: f64) -> u64 {
    let n = histogram.len();
    if n == 0 {
        return 0;
    }
    let index = rank(p, n);
    let mut below = 0;
    for bucket in histogram.iter_recorded() {
        below += bucket.count_at_value();
        if below > index {
            return histogram.highest_equivalent(bucket.value_iterated_to());
        }
    }
    unreachable!("the ranks of a histogram of {n} values end at {below}")
}

/// Rounds microseconds to the nearest 100 µs, halves away from zero (as Go's
/// `Duration.Round`).
pub fn round_latency(us: u64) -> Duration {
    let rounded = us.saturating_add(LATENCY_ROUNDING_US / 2) / LATENCY_ROUNDING_US;
    Duration::from_micros(rounded * LATENCY_ROUNDING_US)
}

fn round_to_ms(d: Duration) -> Duration {
    Duration::from_millis(((d.as_micros() + 500) / 1000) as u64)
}

/// Formats a duration as Go's `time.Duration.String` does (`0s`, `300µs`,
/// `1.2ms`, `2.5s`, `1m1s`), the form the reference prints.
pub fn go_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    if ns < 1_000 {
        return format!("{ns}ns");
    }
    if ns < 1_000_000 {
        return format!("{}µs", decimal(ns, 1_000));
    }
    if ns < 1_000_000_000 {
        return format!("{}ms", decimal(ns, 1_000_000));
    }
    let total_s = ns / 1_000_000_000;
    let (h, m) = (total_s / 3600, (total_s / 60) % 60);
    let s = decimal(ns % 60_000_000_000, 1_000_000_000);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

/// `value / unit` with the fraction's trailing zeros dropped.
fn decimal(value: u128, unit: u128) -> String {
    let (whole, fraction) = (value / unit, value % unit);
    if fraction == 0 {
        return whole.to_string();
    }
    let width = unit.ilog10() as usize;
    let digits = format!("{fraction:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_the_reference_rank() {
        let sorted: Vec<u64> = (1..=100).collect();
        // int(0.5·99) = 49, int(0.95·99) = 94, int(0.99·99) = 98.
        assert_eq!(sorted_percentile(&sorted, 0.50), Some(50));
        assert_eq!(sorted_percentile(&sorted, 0.95), Some(95));
        assert_eq!(sorted_percentile(&sorted, 0.99), Some(99));
        assert_eq!(sorted_percentile(&sorted, 1.0), Some(100));
        assert_eq!(sorted_percentile(&sorted, 0.0), Some(1));
        assert_eq!(sorted_percentile(&[7], 0.99), Some(7));
        assert_eq!(sorted_percentile(&[], 0.5), None);
        // Two values: int(0.99·1) = 0, the smaller one.
        assert_eq!(sorted_percentile(&[3, 9], 0.99), Some(3));
    }

    #[test]
    fn histogram_percentile_matches_the_sorted_one() {
        // Values under 2048 are exact at three significant digits.
        let values: Vec<u64> = (0..1000u64).map(|i| (i * 7919) % 2000 + 1).collect();
        let mut sorted = values.clone();
        sorted.sort_unstable();
        let mut histogram = latency_histogram();
        for v in &values {
            histogram.record(*v).unwrap();
        }
        for p in [0.0, 0.1, 0.5, 0.95, 0.99, 0.999, 1.0] {
            assert_eq!(
                Some(histogram_percentile(&histogram, p)),
                sorted_percentile(&sorted, p),
                "p={p}"
            );
        }
        assert_eq!(histogram_percentile(&latency_histogram(), 0.5), 0);
    }

    #[test]
    fn latency_rounds_to_100_microseconds() {
        assert_eq!(round_latency(0), Duration::ZERO);
        assert_eq!(round_latency(49), Duration::ZERO);
        assert_eq!(round_latency(50), Duration::from_micros(100));
        assert_eq!(round_latency(149), Duration::from_micros(100));
        assert_eq!(round_latency(1250), Duration::from_micros(1300));
        assert_eq!(round_latency(u64::MAX), round_latency(u64::MAX - 1));
    }

    #[test]
    fn durations_print_as_go_does() {
        let us = Duration::from_micros;
        assert_eq!(go_duration(Duration::ZERO), "0s");
        assert_eq!(go_duration(us(300)), "300µs");
        assert_eq!(go_duration(us(1300)), "1.3ms");
        assert_eq!(go_duration(us(1000)), "1ms");
        assert_eq!(go_duration(Duration::from_millis(2500)), "2.5s");
        assert_eq!(go_duration(Duration::from_millis(1234)), "1.234s");
        assert_eq!(go_duration(Duration::from_secs(61)), "1m1s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(go_duration(Duration::from_nanos(5)), "5ns");
    }

    #[test]
    fn lines_carry_the_totals() {
        let mut latencies_us = latency_histogram();
        for v in [100, 200, 300, 400] {
            latencies_us.record(v).unwrap();
        }
        let summary = Summary {
            ok_records: 4,
            failed_records: 1,
            elapsed: Duration::from_millis(2000),
            latencies_us,
            target_rate: None,
            errors: BTreeMap::from([(503, 1)]),
            record_bytes: 1_000_000,
            send_lag: SendLag::default(),
        };
        assert_eq!(
            summary.schedule_line(),
            None,
            "a closed loop has no schedule"
        );
        assert_eq!(
            summary.human_line_named("produce", "msg"),
            "produce: 4 ok, 1 failed in 2s — 2 msg/s; latency p50=200µs p95=300µs p99=300µs"
        );
        assert_eq!(
            summary.figures_line("produce", "msg"),
            "produce figures: 2 msg/s, 2.0 MB/s; latency p50=200µs p90=300µs p99=300µs p99.9=300µs max=400µs; errors: 503×1"
        );
        let settings = Settings::resolve(&super::super::config::Config {
            count: Some(5),
            batch_records: Some(10),
            ..super::super::config::tests::config()
        })
        .unwrap();
        let line = json_line(&settings, Ended::Completed, Some(&summary), None);
        let json: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(json["mode"], "produce");
        // The settings that produced the figures, every default applied.
        let run = &json["settings"];
        assert_eq!(run["server"], "http://127.0.0.1:7942");
        assert_eq!(run["topic"], "t");
        assert_eq!(
            (run["count"].clone(), run["duration_s"].clone()),
            (5.into(), serde_json::Value::Null)
        );
        assert_eq!(
            (run["producers"].clone(), run["consumers"].clone()),
            (8.into(), 0.into())
        );
        assert_eq!(
            (run["batch"].clone(), run["size_bytes"].clone()),
            (10.into(), 256.into())
        );
        assert_eq!(
            run["partitions"],
            serde_json::Value::Null,
            "the topic was not created"
        );
        assert_eq!(json["ok"], 4);
        assert_eq!(json["failed"], 1);
        assert_eq!(json["p50_us"], 200);
        assert_eq!(json["max_us"], 400);
        assert_eq!(json["rate"], 2.0);
        assert_eq!(json["mb_per_s"], 2.0);
        assert_eq!(json["p90_us"], 300);
        assert_eq!(json["errors"]["503"], 1);
        assert_eq!(json["late_sends"], 0);
    }

    #[test]
    fn the_consume_line_is_the_references_then_the_figures() {
        let mut tally = ConsumeTally::new();
        tally.consumed_records = 30;
        tally.received_records = 32;
        for v in [1_000, 2_000, 3_000] {
            tally.cycle_latencies_us.record(v).unwrap();
        }
        let summary = ConsumeSummary {
            tally,
            elapsed: Duration::from_millis(1500),
            duplicate_records: 2,
            verdict: None,
            drain_cut_short: None,
        };
        let lines = summary.human_lines();
        assert_eq!(lines[0], "consume: 30 msgs in 1.5s (20 msg/s)");
        assert_eq!(
            lines[1],
            "consume figures: 30 consumed, 32 received (21 msg/s); \
             consume+ack latency p50=2ms p95=2ms p99=2ms; 2 duplicates"
        );
        assert_eq!(
            lines.len(),
            2,
            "no end-to-end line without stamps: {lines:?}"
        );
    }

    #[test]
    fn an_open_loop_run_says_how_late_its_requests_were_written() {
        let mut lag = SendLag::default();
        for ms in [0, 1, 2, 40] {
            lag.note(Duration::from_millis(ms));
        }
        let mut other = SendLag::default();
        other.note(Duration::from_micros(1500));
        lag.merge(other);
        assert_eq!(
            lag,
            SendLag {
                late_requests: 3,
                max_us: 40_000
            }
        );
        let mut latencies_us = latency_histogram();
        for _ in 0..5 {
            latencies_us.record(100).unwrap();
        }
        let summary = Summary {
            ok_records: 5,
            failed_records: 0,
            elapsed: Duration::from_secs(1),
            latencies_us,
            target_rate: Some(5.0),
            errors: BTreeMap::new(),
            record_bytes: 10,
            send_lag: lag,
        };
        assert_eq!(
            summary.schedule_line().unwrap(),
            "open loop: 3 of 5 requests written more than 1ms after they were due (latest 40ms)"
        );
        let settings = Settings::resolve(&super::super::config::tests::config()).unwrap();
        let line = json_line(&settings, Ended::Completed, Some(&summary), None);
        let json: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(json["late_sends"], 3);
        assert_eq!(json["max_send_lag_us"], 40_000);
    }
}
