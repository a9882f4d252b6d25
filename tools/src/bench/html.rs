//! The `--report` page: one self-contained HTML file with the run's settings,
//! its final figures and four charts: produce-ack latency over time, end-to-end
//! latency over time (when records were consumed), throughput over time, and
//! the percentile distribution of each latency.
//!
//! Which cores: the caller's thread, after the run; pure functions.
//!
//! The page loads nothing: the charts are inline SVG ([`super::svg`]) and the
//! style sheet is in the page, so it opens the same on a machine with no
//! network, years later. The percentile plot follows HdrHistogram's: the x
//! axis is `1/(1−p)` on a log scale, so 90 %, 99 %, 99.9 %… are evenly spaced
//! and the tail gets as much room as the median.
//!
//! A long run's series is drawn with at most [`PLOT_POINTS_MAX`] points per
//! line: consecutive seconds are merged, their rates averaged over the time
//! they cover and their latencies taken at the highest of the group, so that
//! a spike is never smoothed away.

use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;

use super::config::{Length, Mode, Settings};
use super::live::{LatencyRow, SecondRow, Series};
use super::report::{go_duration, histogram_percentile, ConsumeSummary, Ended, Summary};
use super::svg::{escape, Axis, Chart, Line};

/// The most points a line of an over-time chart has.
pub const PLOT_POINTS_MAX: usize = 1200;
/// The percentile plot's reach: `1/(1−p)` up to 10^5, that is p = 99.999 %.
const PERCENTILE_DECADES: u32 = 5;
/// Points per decade of the percentile plot.
const PERCENTILE_STEPS_PER_DECADE: u32 = 20;

const _: () = assert!(PLOT_POINTS_MAX >= 2 && PERCENTILE_DECADES >= 1);

/// The line colours, in the order lines are drawn.
const P50: &str = "#1f77b4";
const P99: &str = "#ff7f0e";
const MAX: &str = "#d62728";
const PRODUCED: &str = "#2ca02c";
const CONSUMED: &str = "#9467bd";

/// The percentiles of the figures table.
const TABLE_PERCENTILES: [(f64, &str); 4] = [
    (0.50, "p50"),
    (0.90, "p90"),
    (0.99, "p99"),
    (0.999, "p99.9"),
];

/// Everything the page shows.
pub struct Run<'a> {
    /// The command line as typed.
    pub command: &'a str,
    pub settings: &'a Settings,
    pub ended: Ended,
    pub produce: Option<&'a Summary>,
    pub consume: Option<&'a ConsumeSummary>,
    pub series: &'a Series,
    /// The lines the run printed on standard error.
    pub lines: &'a [String],
}

/// The page.
pub fn page(run: &Run) -> String {
    let s = run.settings;
    let mut out = String::with_capacity(64 * 1024);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>narad bench: {} ({})</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>narad bench</h1>\n<p><code>{}</code></p>\n",
        escape(&s.topic),
        s.mode.name(),
        escape(run.command)
    );
    out.push_str("<h2>Settings</h2>\n");
    table(&mut out, &["setting", "value"], &settings_rows(s));
    out.push_str("<h2>Results</h2>\n");
    if let Some(reason) = run.ended.early_reason() {
        let _ = writeln!(
            out,
            "<p class=\"early\"><strong>The run ended early ({}):</strong> the figures cover it until then.</p>",
            escape(reason)
        );
    }
    out.push_str("<pre>");
    for line in run.lines {
        out.push_str(&escape(line));
        out.push('\n');
    }
    out.push_str("</pre>\n");
    figures(&mut out, run);
    charts(&mut out, run);
    out.push_str("</body>\n</html>\n");
    out
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}\
h1{font-size:22px}h2{font-size:17px;margin-top:28px}\
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 9px;text-align:right}\
td:first-child,th:first-child{text-align:left}\
pre,code{background:#f5f5f5;padding:6px;white-space:pre-wrap}\
svg.chart{display:block;margin:12px 0;font-size:11px}svg .title{font-size:13px;font-weight:bold}";

/// The settings the run used, after defaults.
fn settings_rows(s: &Settings) -> Vec<Vec<String>> {
    // Ping mode has no topic and no payload, and counts requests.
    let ping = s.mode == Mode::Ping;
    let mut rows = vec![vec![
        "server".into(),
        format!("http://{}", s.server.authority),
    ]];
    if !ping {
        rows.push(vec![
            "topic".into(),
            match s.fresh_topic {
                true => format!("{} (created and deleted by the run)", s.topic),
                false => s.topic.clone(),
            },
        ]);
    }
    rows.push(vec!["mode".into(), s.mode.name().into()]);
    rows.push(vec![
        "length".into(),
        match s.length {
            Length::Records(n) if ping => format!("{n} requests"),
            Length::Records(n) => format!("{n} records"),
            Length::Timed(d) => go_duration(d),
            Length::UntilIdle => "until idle".into(),
        },
    ]);
    if !ping {
        rows.push(vec!["payload".into(), format!("{} bytes", s.size_bytes)]);
    }
    let mut put = |name: &str, value: String| rows.push(vec![name.into(), value]);
    if s.mode.produces() {
        put(
            if ping { "workers" } else { "producers" },
            s.producers.to_string(),
        );
        if !ping {
            put("records per request", s.batch().to_string());
        }
        put(
            "rate",
            match s.rate {
                Some(rate) => format!("{rate:.0} msg/s (open loop)"),
                None => "closed loop".into(),
            },
        );
    }
    if s.mode.consumes() {
        put("consumers", s.consumers.to_string());
        put("messages per consume", s.consume_max.to_string());
        put("verify", s.verify.to_string());
    }
    if s.create {
        put("partitions (created)", s.partitions.to_string());
    }
    put(
        "cpu",
        match s.pin_cpu() {
            Some(cpu) if s.cpus.len() > 1 => format!("{cpu} (first of {:?})", s.cpus),
            Some(cpu) => cpu.to_string(),
            None => "not pinned".into(),
        },
    );
    rows
}

/// The final figures: rates, latency percentiles, errors.
fn figures(out: &mut String, run: &Run) {
    let words = run.settings.mode.sender_words();
    let mut rates = Vec::new();
    if let Some(p) = run.produce {
        rates.push(vec![
            words.done.into(),
            p.ok_records.to_string(),
            format!("{:.0}", p.rate()),
            format!("{:.2}", p.megabytes_per_second()),
            go_duration(round_to_ms(p.elapsed)),
        ]);
    }
    if let Some(c) = run.consume {
        // Only a flow knows the size of what it consumes: it sent it.
        let mb = match run.settings.mode {
            Mode::Flow => format!(
                "{:.2}",
                c.consumed_rate() * run.settings.size_bytes as f64 / 1e6
            ),
            _ => "–".into(),
        };
        rates.push(vec![
            "consumed (ack acknowledged)".into(),
            c.tally.consumed_records.to_string(),
            format!("{:.0}", c.consumed_rate()),
            mb,
            go_duration(round_to_ms(c.elapsed)),
        ]);
    }
    out.push_str("<h2>Figures</h2>\n");
    table(out, &["", "messages", "msg/s", "MB/s", "time"], &rates);
    let mut latencies = Vec::new();
    if let Some(p) = run.produce {
        latencies.push(latency_row(words.latency, &p.latencies_us));
    }
    if let Some(c) = run.consume {
        latencies.push(latency_row("consume+ack", &c.tally.cycle_latencies_us));
        if !c.tally.e2e_latencies_us.is_empty() {
            latencies.push(latency_row("end-to-end", &c.tally.e2e_latencies_us));
        }
    }
    out.push_str("<p>Latency:</p>\n");
    let mut head = vec!["", "count"];
    head.extend(TABLE_PERCENTILES.iter().map(|(_, name)| *name));
    head.push("max");
    table(out, &head, &latencies);
    let mut errors = Vec::new();
    if let Some(p) = run.produce {
        errors.push(vec![words.failed.into(), p.failed_records.to_string()]);
    }
    if let Some(c) = run.consume {
        let by_status = |m: &std::collections::BTreeMap<u16, u64>| {
            let parts: Vec<String> = m.iter().map(|(s, n)| format!("{s}×{n}")).collect();
            match parts.is_empty() {
                true => "0".to_string(),
                false => parts.join(" "),
            }
        };
        errors.push(vec![
            "consume (by status)".into(),
            by_status(&c.tally.consume_errors),
        ]);
        errors.push(vec![
            "ack (by status)".into(),
            by_status(&c.tally.ack_errors),
        ]);
    }
    out.push_str("<p>Errors (status 0: no answer; 1: an unreadable reply):</p>\n");
    table(out, &["", "failed"], &errors);
}

fn latency_row(name: &str, h: &Histogram<u64>) -> Vec<String> {
    let mut row = vec![name.to_string(), h.len().to_string()];
    for (p, _) in TABLE_PERCENTILES {
        row.push(latency_text(histogram_percentile(h, p)));
    }
    row.push(latency_text(h.max()));
    row
}

/// A latency to three significant digits, the histogram's precision.
fn latency_text(us: u64) -> String {
    let digits = us.checked_ilog10().unwrap_or(0);
    let unit = 10u64.pow(digits.saturating_sub(2));
    let rounded = us.saturating_add(unit / 2) / unit * unit;
    go_duration(Duration::from_micros(rounded))
}

fn round_to_ms(d: Duration) -> Duration {
    Duration::from_millis(((d.as_micros() + 500) / 1000) as u64)
}

/// A table with a header row; every cell escaped.
fn table<S: AsRef<str>>(out: &mut String, head: &[&str], rows: &[Vec<S>]) {
    out.push_str("<table>\n<tr>");
    for cell in head {
        let _ = write!(out, "<th>{}</th>", escape(cell));
    }
    out.push_str("</tr>\n");
    for row in rows {
        assert_eq!(row.len(), head.len(), "a row has a cell per column");
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{}</td>", escape(cell.as_ref()));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");
}

/// The over-time charts and the percentile plot.
fn charts(out: &mut String, run: &Run) {
    let words = run.settings.mode.sender_words();
    let rows = merge_rows(&run.series.rows, PLOT_POINTS_MAX);
    let per_point = match (rows.len(), run.series.rows.len()) {
        (0, _) => 1,
        (merged, all) => all.div_ceil(merged),
    };
    out.push_str("<h2>Over time</h2>\n");
    if rows.is_empty() {
        out.push_str("<p>The run was too short for a second of series.</p>\n");
    }
    if per_point > 1 {
        let _ = writeln!(
            out,
            "<p>Each point covers about {per_point} seconds: rates are averaged over \
             them, latencies are the highest of the group.</p>"
        );
    }
    if run.series.dropped_rows > 0 {
        let _ = writeln!(
            out,
            "<p>The last {} seconds of the run are not in the series.</p>",
            run.series.dropped_rows
        );
    }
    if !rows.is_empty() && run.produce.is_some() {
        let chart = latency_over_time(words.chart, &rows, |r| r.produce);
        out.push_str(&chart.render());
    }
    if !rows.is_empty() && rows.iter().any(|r| r.e2e.count > 0) {
        let chart = latency_over_time("End-to-end latency", &rows, |r| r.e2e);
        out.push_str(&chart.render());
    }
    if !rows.is_empty() {
        out.push_str(&throughput(run, &rows).render());
    }
    out.push_str("<h2>Percentile distribution</h2>\n");
    let mut histograms: Vec<(&str, &'static str, &Histogram<u64>)> = Vec::new();
    if let Some(p) = run.produce {
        histograms.push((words.latency, P50, &p.latencies_us));
    }
    if let Some(c) = run.consume {
        histograms.push(("consume+ack", CONSUMED, &c.tally.cycle_latencies_us));
        histograms.push(("end-to-end", P99, &c.tally.e2e_latencies_us));
    }
    histograms.retain(|(_, _, h)| !h.is_empty());
    if histograms.is_empty() {
        out.push_str("<p>No latency was recorded.</p>\n");
    } else {
        out.push_str(&percentile_plot(&histograms).render());
    }
}

/// Consecutive rows merged so that at most `points_max` remain.
fn merge_rows(rows: &[SecondRow], points_max: usize) -> Vec<SecondRow> {
    assert!(points_max > 0);
    let group = rows.len().div_ceil(points_max).max(1);
    let merged: Vec<SecondRow> = rows
        .chunks(group)
        .map(|chunk| {
            let highest = |f: fn(&SecondRow) -> LatencyRow| LatencyRow {
                count: chunk.iter().map(|r| f(r).count).sum(),
                p50_us: chunk.iter().map(|r| f(r).p50_us).max().unwrap_or(0),
                p99_us: chunk.iter().map(|r| f(r).p99_us).max().unwrap_or(0),
                max_us: chunk.iter().map(|r| f(r).max_us).max().unwrap_or(0),
            };
            let last = chunk[chunk.len() - 1];
            SecondRow {
                end: last.end,
                span: chunk.iter().map(|r| r.span).sum(),
                produced_records: chunk.iter().map(|r| r.produced_records).sum(),
                failed_records: chunk.iter().map(|r| r.failed_records).sum(),
                consumed_records: chunk.iter().map(|r| r.consumed_records).sum(),
                consume_errors: chunk.iter().map(|r| r.consume_errors).sum(),
                produce: highest(|r| r.produce),
                e2e: highest(|r| r.e2e),
            }
        })
        .collect();
    assert!(merged.len() <= points_max);
    merged
}

/// Seconds from the start of the run, to the last row's end.
fn time_axis(rows: &[SecondRow]) -> Axis {
    let end = rows.last().map_or(1.0, |r| r.end.as_secs_f64());
    Axis::linear_from_zero("seconds since the start", end, |v| format!("{v}"))
}

/// A latency axis over `low..=high` microseconds.
fn latency_axis(low_us: u64, high_us: u64) -> Axis {
    Axis::log_decades("latency", low_us as f64, high_us as f64, |us| {
        latency_text(us as u64)
    })
}

/// p50, p99 and max of one latency, second by second; windows without a
/// sample leave no point.
fn latency_over_time(title: &str, rows: &[SecondRow], of: fn(&SecondRow) -> LatencyRow) -> Chart {
    let measured: Vec<(f64, LatencyRow)> = rows
        .iter()
        .filter(|r| of(r).count > 0)
        .map(|r| (r.end.as_secs_f64(), of(r)))
        .collect();
    let low = measured.iter().map(|(_, l)| l.p50_us).min().unwrap_or(1);
    let high = measured.iter().map(|(_, l)| l.max_us).max().unwrap_or(1);
    let line = |name: &str, color, pick: fn(&LatencyRow) -> u64| Line {
        name: name.into(),
        color,
        points: measured.iter().map(|(t, l)| (*t, pick(l) as f64)).collect(),
    };
    Chart {
        title: format!("{title}, per second"),
        x: time_axis(rows),
        y: latency_axis(low, high),
        lines: vec![
            line("p50", P50, |l| l.p50_us),
            line("p99", P99, |l| l.p99_us),
            line("max", MAX, |l| l.max_us),
        ],
    }
}

/// Records produced and consumed per second.
fn throughput(run: &Run, rows: &[SecondRow]) -> Chart {
    let words = run.settings.mode.sender_words();
    let mut lines = Vec::new();
    let rate_line = |name: &str, color, records: fn(&SecondRow) -> u64| Line {
        name: name.into(),
        color,
        points: rows
            .iter()
            .map(|r| (r.end.as_secs_f64(), r.per_second(records(r))))
            .collect(),
    };
    if run.produce.is_some() {
        lines.push(rate_line(words.series, PRODUCED, |r| r.produced_records));
    }
    if run.consume.is_some() {
        lines.push(rate_line("consumed", CONSUMED, |r| r.consumed_records));
    }
    let top = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(0.0, f64::max);
    Chart {
        title: "Throughput, per second".into(),
        x: time_axis(rows),
        y: Axis::linear_from_zero("messages per second", top, rate_text),
        lines,
    }
}

/// `950`, `12k`, `1.5M`.
fn rate_text(v: f64) -> String {
    match v {
        v if v >= 1e6 => format!("{}M", v / 1e6),
        v if v >= 1e3 => format!("{}k", v / 1e3),
        v => format!("{v}"),
    }
}

/// Latency against percentile, the x axis `log10(1/(1−p))` from 0 (p = 0)
/// to [`PERCENTILE_DECADES`] (p = 99.999 %).
fn percentile_plot(histograms: &[(&str, &'static str, &Histogram<u64>)]) -> Chart {
    let steps = PERCENTILE_DECADES * PERCENTILE_STEPS_PER_DECADE;
    let x_of = |i: u32| f64::from(i) / f64::from(PERCENTILE_STEPS_PER_DECADE);
    let lines: Vec<Line> = histograms
        .iter()
        .map(|(name, color, h)| Line {
            name: name.to_string(),
            color,
            points: (0..=steps)
                .map(|i| {
                    let p = 1.0 - 10f64.powf(-x_of(i));
                    (x_of(i), histogram_percentile(h, p.clamp(0.0, 1.0)) as f64)
                })
                .collect(),
        })
        .collect();
    let low = histograms
        .iter()
        .map(|(_, _, h)| h.min())
        .min()
        .unwrap_or(1);
    let high = histograms
        .iter()
        .map(|(_, _, h)| h.max())
        .max()
        .unwrap_or(1);
    let ticks = (0..=PERCENTILE_DECADES)
        .map(|d| (f64::from(d), percentile_name(d)))
        .collect();
    let x = Axis {
        label: "percentile".into(),
        scale: super::svg::Scale::Linear,
        min: 0.0,
        max: f64::from(PERCENTILE_DECADES),
        ticks,
    };
    Chart {
        title: "Latency by percentile".into(),
        x,
        y: latency_axis(low, high),
        lines,
    }
}

/// The percentile `1 − 10^−decades`: `0%`, `90%`, `99%`, `99.9%`…
fn percentile_name(decades: u32) -> String {
    match decades {
        0 => "0%".into(),
        1 => "90%".into(),
        d => {
            let nines = "9".repeat(d as usize);
            format!("99{}{}%", if d > 2 { "." } else { "" }, &nines[2..])
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::config::tests::config;
    use super::super::config::{Config, Mode};
    use super::super::consumer::ConsumeTally;
    use super::super::live::{Live, WINDOW};
    use super::super::report::latency_histogram;
    use super::*;

    /// A flow run of three seconds with known latencies: produce-ack 1 ms to
    /// 100 ms, end-to-end 2 ms to 300 ms.
    fn flow_run() -> (Settings, Summary, ConsumeSummary, Series) {
        let settings = Settings::resolve(&Config {
            mode: Some(Mode::Flow),
            duration: Some(Duration::from_secs(3)),
            cpus: Some("2-3".into()),
            ..config()
        })
        .unwrap();
        let start = Instant::now();
        let live = Live::new(start);
        let mut produce_us = latency_histogram();
        let mut tally = ConsumeTally::new();
        for second in 1..=3u32 {
            for i in 1..=100u64 {
                let us = 1000 * i * u64::from(second);
                if second < 3 {
                    live.produced(1, us);
                    produce_us.record(us).unwrap();
                }
                live.delivered(2 * us);
                tally.e2e_latencies_us.record(2 * us).unwrap();
                tally.cycle_latencies_us.record(500).unwrap();
            }
            live.consumed(100);
            live.close_window(start + WINDOW * second);
        }
        tally.consumed_records = 300;
        tally.received_records = 300;
        tally.ack_errors.insert(503, 2);
        let produce = Summary {
            ok_records: 200,
            failed_records: 0,
            elapsed: Duration::from_secs(2),
            latencies_us: produce_us,
            target_rate: None,
            send_lag: crate::bench::report::SendLag::default(),
            errors: std::collections::BTreeMap::new(),
            // Not the settings' size: a ping's records carry none, and the
            // page shows the bytes the producers sent.
            record_bytes: 512,
        };
        let consume = ConsumeSummary {
            tally,
            elapsed: Duration::from_secs(3),
            duplicate_records: 0,
            verdict: None,
            drain_cut_short: None,
        };
        (settings, produce, consume, live.take_series())
    }

    #[test]
    fn the_page_holds_the_settings_figures_and_charts() {
        let (settings, produce, consume, series) = flow_run();
        assert_eq!(series.rows.len(), 3);
        let lines = vec!["producing <for 3s>".to_string()];
        let html = page(&Run {
            ended: Ended::Completed,
            command: "narad bench --report 'r.html'",
            settings: &settings,
            produce: Some(&produce),
            consume: Some(&consume),
            series: &series,
            lines: &lines,
        });
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.ends_with("</html>\n"));
        assert!(html.contains("<code>narad bench --report &#39;r.html&#39;</code>"));
        assert!(
            html.contains("<pre>producing &lt;for 3s&gt;\n</pre>"),
            "{html}"
        );
        assert!(html.contains("<td>2 (first of [2, 3])</td>"), "{html}");
        // Produce-ack: 200 values, 1, 2 … 100 ms and 2, 4 … 200 ms. The
        // reference rank int(0.5·199) = 99 is the 100th smallest: 67 of the
        // first and 33 of the second are at most 67 ms.
        assert!(
            html.contains(
                "<tr><td>produce-ack</td><td>200</td><td>67ms</td>\
                 <td>160ms</td><td>196ms</td><td>198ms</td><td>200ms</td></tr>"
            ),
            "{html}"
        );
        assert!(html.contains("<td>end-to-end</td><td>300</td>"), "{html}");
        assert!(html.contains("<td>ack (by status)</td><td>503×2</td>"));
        // 200 records in 2 s of 512 bytes: 100 msg/s, 0.05 MB/s.
        assert!(
            html.contains("<td>produced (acknowledged)</td><td>200</td><td>100</td><td>0.05</td>"),
            "{html}"
        );
        // Latency over time twice (produce-ack, end-to-end), throughput and
        // the percentile plot; three lines each but for throughput's two.
        assert_eq!(html.matches("<svg ").count(), 4, "{html}");
        assert_eq!(html.matches("<polyline ").count(), 3 + 3 + 2 + 3);
        assert!(html.contains(">Produce-ack latency, per second</text>"));
        assert!(html.contains(">End-to-end latency, per second</text>"));
        assert!(html.contains(">99.999%</text>"));
        assert!(
            html.contains(">100ms</text>"),
            "a decade tick of the latency axis"
        );
    }

    #[test]
    fn the_page_loads_nothing_from_the_network() {
        let (settings, produce, consume, series) = flow_run();
        let html = page(&Run {
            ended: Ended::Completed,
            command: "narad bench -s http://127.0.0.1:7942",
            settings: &settings,
            produce: Some(&produce),
            consume: Some(&consume),
            series: &series,
            lines: &[],
        });
        for banned in [
            "<script", "<link", "<img", "<iframe", "src=", "href=", "url(", "@import",
        ] {
            assert!(!html.contains(banned), "{banned}");
        }
        assert!(!html.contains("https://"));
        // The only address is the server's, as text.
        let addresses = html.matches("http://").count();
        assert_eq!(addresses, html.matches("http://127.0.0.1:7942").count());
        assert_eq!(addresses, 2, "the command line and the settings");
    }

    #[test]
    fn a_run_without_a_full_second_still_renders() {
        let settings = Settings::resolve(&config()).unwrap();
        let mut latencies_us = latency_histogram();
        latencies_us.record(700).unwrap();
        let produce = Summary {
            ok_records: 1,
            failed_records: 0,
            elapsed: Duration::from_millis(3),
            latencies_us,
            target_rate: None,
            send_lag: crate::bench::report::SendLag::default(),
            errors: std::collections::BTreeMap::new(),
            record_bytes: 100,
        };
        let html = page(&Run {
            ended: Ended::Completed,
            command: "narad bench t --count 1",
            settings: &settings,
            produce: Some(&produce),
            consume: None,
            series: &Series::default(),
            lines: &[],
        });
        assert!(html.contains("too short for a second of series"));
        assert_eq!(html.matches("<svg ").count(), 1, "the percentile plot");
        assert!(!html.contains("consume+ack"));
    }

    #[test]
    fn a_ping_run_names_requests_not_produced_records() {
        let settings = Settings::resolve(&Config {
            topic: None,
            mode: Some(Mode::Ping),
            duration: Some(Duration::from_secs(2)),
            ..config()
        })
        .unwrap();
        let start = Instant::now();
        let live = Live::new(start);
        let mut latencies_us = latency_histogram();
        for second in 1..=2u32 {
            for _ in 0..50 {
                live.produced(1, 90);
                latencies_us.record(90).unwrap();
            }
            live.close_window(start + WINDOW * second);
        }
        let produce = Summary {
            ok_records: 100,
            failed_records: 0,
            elapsed: Duration::from_secs(2),
            latencies_us,
            target_rate: None,
            send_lag: crate::bench::report::SendLag::default(),
            errors: std::collections::BTreeMap::new(),
            record_bytes: 100,
        };
        let series = live.take_series();
        let html = page(&Run {
            ended: Ended::Completed,
            command: "narad bench --mode ping",
            settings: &settings,
            produce: Some(&produce),
            consume: None,
            series: &series,
            lines: &[],
        });
        assert!(
            html.contains("<td>pinged (200 OK)</td><td>100</td><td>50</td>"),
            "{html}"
        );
        assert!(html.contains("<tr><td>request</td><td>100</td>"), "{html}");
        assert!(
            html.contains(">Request latency, per second</text>"),
            "{html}"
        );
        assert!(html.contains("<td>ping (requests)</td>"), "{html}");
        assert!(html.contains(">pinged</text>"), "{html}");
        assert!(!html.to_lowercase().contains("produce"), "{html}");
    }

    #[test]
    fn long_series_are_merged_keeping_the_spikes() {
        let row = |second: u64, max_us: u64| SecondRow {
            end: Duration::from_secs(second),
            span: Duration::from_secs(1),
            produced_records: 10,
            failed_records: 0,
            consumed_records: 0,
            consume_errors: 0,
            produce: LatencyRow {
                count: 10,
                p50_us: 100,
                p99_us: 200,
                max_us,
            },
            e2e: LatencyRow::default(),
        };
        let rows: Vec<SecondRow> = (1..=10)
            .map(|s| row(s, if s == 4 { 9000 } else { 300 }))
            .collect();
        let merged = merge_rows(&rows, 4);
        assert_eq!(merged.len(), 4);
        assert_eq!(merged[1].end, Duration::from_secs(6));
        assert_eq!(merged[1].span, Duration::from_secs(3));
        assert_eq!(merged[1].produced_records, 30);
        assert_eq!(merged[1].per_second(30), 10.0);
        assert_eq!(merged[1].produce.max_us, 9000);
        assert_eq!(merged[3].end, Duration::from_secs(10));
        assert_eq!(merge_rows(&rows, 20), rows);
        assert_eq!(
            (0..=5).map(percentile_name).collect::<Vec<_>>(),
            ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%"]
        );
    }
}
