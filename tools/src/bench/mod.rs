//! `narad bench [TOPIC]`: the load generator users benchmark a broker with.
//!
//! As the reference: W workers, each with its own keep-alive HTTP/1.1
//! connection, send `POST /v1/topics/<topic>/produce` with the payload
//! `{"bench":"x…"}` padded to `--size` bytes, one request in flight per
//! connection, and report the totals and latency percentiles on standard
//! error. Beyond the reference: a timed run (`--duration`), batch produce
//! (`--batch`), an open-loop rate (`--rate`), topic creation (`--create`), a
//! pinned CPU (`--cpus`), a JSON summary (`--json`), an HTML report with
//! plots (`--report`) and, on a terminal, a status line redrawn every second.
//!
//! `--mode ping` sends `GET /healthz` from the producer pool, with no topic:
//! it measures the generator and the broker's HTTP layer on its cheapest route.
//!
//! `--mode consume` drains a topic with a pool of consumers; `--mode flow` (the
//! reference's `--consume`, and the default without a TOPIC) runs producers and
//! consumers at once. In flow mode each payload carries its record's id and
//! send time, so consumers measure the end-to-end latency and a ledger checks,
//! with `--verify`, that every acknowledged record was consumed. Without a
//! TOPIC the run creates a fresh topic, runs a 10-second flow and deletes it.
//!
//! Which cores: one. Every worker is a task on one event loop in the calling
//! thread (`evloop`, edge-triggered epoll; pinned with `--cpus`), and drives
//! its own connection: it writes each request and reads each response itself.
//! A generator that spread itself over cores would compete with
//! the broker it measures on a small machine; one core that pushes well over
//! 100,000 requests a second is enough to saturate a broker shard, and its
//! figures are not blurred by cross-thread handoffs.
//!
//! Map:
//! - [`client`]: the server address, the keep-alive connection, topic setup.
//! - `evloop`: the event loop, timers and sockets; why not glommio or tokio.
//! - `wire`: reading an HTTP/1.1 response; why the client is hand-written.
//! - `config`: flags, defaults and the refusals of bad combinations.
//! - `workload`: the payload and bodies, the schedule of requests, the producer.
//! - `stamp`: the flow mode's stamped payload and the ledger of record ids.
//! - `consumer`: the consume-and-ack loop and how it reads replies.
//! - `pools`: the producer and consumer pools of one run, and the drain.
//! - `live`: the running tallies, the per-second series and the status line.
//! - `report`: percentiles, the human lines and the `--json` line.
//! - `html`: the `--report` page; `svg`: the line charts it draws.
//!
//! The body of a produce request is built once and borrowed by every request;
//! the connection copies a small one behind the head so that the request
//! leaves in one write. In flow mode each request copies its template into a
//! reused buffer to write the stamps.

pub mod client;
mod config;
mod consumer;
mod evloop;
mod html;
mod live;
mod pools;
mod report;
mod stamp;
mod svg;
mod verdict;
mod wire;
mod workload;

use std::cell::RefCell;
use std::fs::File;
use std::io::{IsTerminal as _, Write as _};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use client::{Conn, Method, RequestTemplate, Server};
pub use config::{
    parse_cpu_list, Config, JsonTarget, Length, Mode, Settings, BATCH_BODY_BYTES_MAX,
    BATCH_RECORDS_MAX, CONSUME_MAX_RECORDS, CPU_ID_LIMIT, DURATION_MAX, PAYLOAD_BYTES_MAX,
    RATE_MAX, WORKERS_MAX,
};
use consumer::{ConsumePlan, ConsumeTally};
use live::{Live, Series};
use report::{ConsumeSummary, Summary};
use stamp::Ledger;
use workload::{Plan, Schedule, Stop, Tally};

/// The route ping mode sends `GET` to: the broker's cheapest.
const HEALTH_PATH: &str = "/healthz";

/// Why a run did not succeed, and the exit code that says so.
#[derive(Debug, PartialEq, Eq)]
pub enum BenchError {
    /// Bad arguments: 2.
    Usage(String),
    /// The run could not start, some requests failed, or a check failed: 1.
    Failed(String),
}

impl BenchError {
    pub fn exit_code(&self) -> u8 {
        match self {
            BenchError::Usage(_) => 2,
            BenchError::Failed(_) => 1,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            BenchError::Usage(m) | BenchError::Failed(m) => m,
        }
    }
}

/// What a run measured.
struct Outcome {
    produce: Option<Summary>,
    consume: Option<ConsumeSummary>,
    /// The server stopped accepting connections.
    abandoned: bool,
    /// The topic was deleted during the run (a 404 after the start).
    topic_gone: bool,
    /// Things that went wrong around the measurement (deleting the topic).
    warnings: Vec<String>,
    /// The run second by second.
    series: Series,
}

impl Outcome {
    fn ended(&self) -> report::Ended {
        if interrupted() {
            report::Ended::Interrupted
        } else if self.abandoned {
            report::Ended::ServerGone
        } else if self.topic_gone {
            report::Ended::TopicGone
        } else {
            report::Ended::Completed
        }
    }
}

/// Set by the first SIGINT (or SIGTERM): the run ends as if its time were up
/// (producers stop, consumers stop draining), prints what it measured and
/// deletes its fresh topic. A second one ends the process at once.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the user interrupted the run.
pub fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::Relaxed)
}

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: `signal` is async-signal-safe; the next SIGINT or SIGTERM gets
    // the default action, which ends the process.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
    }
}

/// Ctrl-C, and a `kill` or `timeout` (SIGTERM) alike: a run told to stop
/// stops as the user asked, reporting and deleting its fresh topic.
fn catch_sigint() {
    // SAFETY: installs a handler that only stores to an atomic and resets the
    // dispositions, all async-signal-safe.
    unsafe {
        for signal in [libc::SIGINT, libc::SIGTERM] {
            libc::signal(
                signal,
                on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    };
}

/// Runs the benchmark, printing progress and results.
pub fn run(config: &Config) -> Result<(), BenchError> {
    let settings = Settings::resolve(config).map_err(BenchError::Usage)?;
    catch_sigint();
    // Pinned before anything is created or printed: a CPU it may not run on
    // is a mistake in the command.
    // Every CPU listed is checked, though the generator runs on the first.
    let pinned = evloop::may_run_on(&settings.cpus)
        .and_then(|()| settings.pin_cpu().map_or(Ok(()), evloop::pin_thread_to));
    if let Err(why) = pinned {
        return Err(BenchError::Usage(format!(
            "--cpus {:?}: {why}",
            config.cpus.as_deref().unwrap_or_default()
        )));
    }
    let report_file = open_report(&settings).map_err(BenchError::Usage)?;
    check_json_target(&settings).map_err(BenchError::Usage)?;
    let start = start_line(&settings);
    say_err(&start);
    // Tests and pipelines read standard error: the status line is for people.
    let show_progress = std::io::stderr().is_terminal();
    let drive = drive(settings.clone(), show_progress);
    let outcome = match evloop::run(drive) {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(why)) | Err(why) => {
            // A run that measured nothing leaves no empty report behind.
            if let (Some(file), Some(path)) = (report_file, &settings.report) {
                drop(file);
                let _ = std::fs::remove_file(path);
            }
            // The `--json` target says so too, rather than keep what an
            // earlier run left there (or nothing) for a script to misread.
            let line = serde_json::json!({
                "mode": settings.mode.name(),
                "topic": settings.topic,
                "ended": "failed",
                "error": why,
                "settings": settings.json_value(),
            });
            let _ = emit_json(&settings, &line.to_string());
            return Err(BenchError::Failed(why));
        }
    };
    let mut lines = vec![start];
    if let Some(produce) = &outcome.produce {
        let (name, unit) = match settings.mode {
            Mode::Ping => ("ping", "req"),
            _ => ("produce", "msg"),
        };
        lines.push(produce.human_line_named(name, unit));
        lines.push(produce.figures_line(name, unit));
        lines.extend(produce.schedule_line());
    }
    if let Some(consume) = &outcome.consume {
        lines.extend(consume.human_lines());
    }
    lines.extend(outcome.warnings.iter().map(|w| format!("warning: {w}")));
    for line in &lines[1..] {
        say_err(line);
    }
    write_json(&settings, &outcome)?;
    if let Some(file) = report_file {
        write_report(file, &settings, &outcome, &lines)?;
    }
    verdict::judge(&settings, &outcome).map_err(BenchError::Failed)
}

/// The `--json` line, to standard output or its file.
fn write_json(settings: &Settings, outcome: &Outcome) -> Result<(), BenchError> {
    if settings.json.is_none() {
        return Ok(());
    }
    let line = report::json_line(
        settings,
        outcome.ended(),
        outcome.produce.as_ref(),
        outcome.consume.as_ref(),
    );
    emit_json(settings, &line)
}

/// One `--json` line, to standard output or the file; nothing without `--json`.
fn emit_json(settings: &Settings, line: &str) -> Result<(), BenchError> {
    match &settings.json {
        None => Ok(()),
        // Not `println!`, which panics when standard output is closed.
        Some(JsonTarget::Stdout) => {
            let _ = writeln!(std::io::stdout(), "{line}");
            Ok(())
        }
        Some(JsonTarget::File(path)) => std::fs::write(path, format!("{line}\n"))
            .map_err(|e| BenchError::Failed(format!("cannot write {}: {e}", path.display()))),
    }
}

/// The `--report` page, into the file created before the run.
fn write_report(
    mut file: File,
    settings: &Settings,
    outcome: &Outcome,
    lines: &[String],
) -> Result<(), BenchError> {
    let path = settings.report.as_ref().expect("a report file has a path");
    let page = html::page(&html::Run {
        command: &command_line(),
        settings,
        ended: outcome.ended(),
        produce: outcome.produce.as_ref(),
        consume: outcome.consume.as_ref(),
        series: &outcome.series,
        lines,
    });
    file.write_all(page.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| BenchError::Failed(format!("cannot write {}: {e}", path.display())))
}

/// Opens the `--json` file for writing before the run (it is written whole at
/// the end), so that a path that cannot be written is refused at once rather
/// than after a long run.
fn check_json_target(settings: &Settings) -> Result<(), String> {
    let Some(JsonTarget::File(path)) = &settings.json else {
        return Ok(());
    };
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(drop)
        .map_err(|e| format!("--json {}: cannot write the file: {e}", path.display()))
}

/// Creates the `--report` file before the run, so that a path that cannot be
/// written is refused at once rather than after a long run.
fn open_report(settings: &Settings) -> Result<Option<File>, String> {
    let Some(path) = &settings.report else {
        return Ok(None);
    };
    File::create(path)
        .map(Some)
        .map_err(|e| format!("--report {}: cannot create the file: {e}", path.display()))
}

/// The command line as typed, each argument quoted when the shell would need
/// it, for the report.
fn command_line() -> String {
    let args: Vec<String> = std::env::args()
        .map(|arg| {
            let plain = !arg.is_empty()
                && arg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_=./:,@%+".contains(&b));
            if plain {
                arg
            } else {
                format!("'{}'", arg.replace('\'', "'\\''"))
            }
        })
        .collect();
    args.join(" ")
}

/// One line on standard error; a closed stream loses it rather than panicking.
fn say_err(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// `producing N × SB with W workers...` in produce mode, as the reference;
/// the other modes name both pools.
fn start_line(s: &Settings) -> String {
    let what = match s.length {
        Length::Timed(d) => format!("for {}", report::go_duration(d)),
        Length::Records(n) => n.to_string(),
        Length::UntilIdle => "until idle".into(),
    };
    let batch = match s.batch_records {
        Some(n) => format!(" in batches of {n}"),
        None => String::new(),
    };
    let rate = match s.rate {
        Some(r) => format!(" at {} msg/s", report::rate_figure(r)),
        None => String::new(),
    };
    let topic = if s.fresh_topic {
        format!("fresh topic {} (deleted after): ", s.topic)
    } else {
        String::new()
    };
    let consuming = format!(
        "consuming with {} ({} per request)",
        counted(s.consumers, "consumer"),
        s.consume_max
    );
    match s.mode {
        Mode::Produce => format!(
            "{topic}producing {what} × {}B{batch}{rate} with {}...",
            s.size_bytes,
            counted(producers_used(s), "worker")
        ),
        Mode::Flow => format!(
            "{topic}producing {what} × {}B{batch}{rate} with {}, {consuming}...",
            s.size_bytes,
            counted(producers_used(s), "producer")
        ),
        Mode::Consume => match s.length {
            Length::Records(n) => format!("{consuming}: {n} messages..."),
            _ => format!("{consuming} {what}..."),
        },
        Mode::Ping => {
            let times = match s.length {
                Length::Records(n) => format!("{n} times"),
                _ => what,
            };
            format!(
                "pinging {HEALTH_PATH} {times} with {}...",
                counted(producers_used(s), "worker")
            )
        }
    }
}

/// `1 worker`, `8 workers`.
fn counted(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// A counted run needs no more connections than it has requests.
fn producers_used(s: &Settings) -> usize {
    match s.length {
        Length::Records(count) => {
            let requests = count.div_ceil(s.batch());
            s.producers
                .min(usize::try_from(requests).unwrap_or(usize::MAX))
        }
        Length::Timed(_) | Length::UntilIdle => s.producers,
    }
}

/// Sets up the topic, measures, and deletes a fresh topic.
async fn drive(s: Settings, show_progress: bool) -> Result<Outcome, String> {
    let mut visibility = client::VISIBILITY_DEFAULT;
    let mut warnings = Vec::new();
    if s.mode.uses_topic() {
        let mut setup = Conn::open(&s.server).await?;
        let created = if s.create {
            // A fresh topic must be new: the run deletes it afterwards.
            let existing_ok = !s.fresh_topic;
            client::create_topic(&mut setup, &s.server, &s.topic, s.partitions, existing_ok).await?
        } else {
            None
        };
        let facts = match created {
            Some(facts) => facts,
            None => client::check_topic(&mut setup, &s.server, &s.topic).await?,
        };
        visibility = facts.visibility;
        if created.is_none() {
            warnings.extend(partitions_warning(&s, facts.partitions));
        }
    }
    let mut outcome = measure(&s, show_progress, visibility).await;
    if let Ok(outcome) = outcome.as_mut() {
        warnings.extend(saturation_warning(outcome));
        warnings.extend(foreign_warning(outcome));
        outcome.warnings.splice(0..0, warnings);
    }
    if s.fresh_topic {
        let deleted = match Conn::open(&s.server).await {
            Ok(mut conn) => client::delete_topic(&mut conn, &s.server, &s.topic).await,
            Err(e) => Err(e),
        };
        if let (Err(why), Ok(outcome)) = (deleted, outcome.as_mut()) {
            outcome.warnings.push(why);
        }
    }
    outcome
}

/// A warning when a latency went past the histograms' bound, where it was
/// recorded as the bound: the percentiles at the top are then floors.
fn saturation_warning(outcome: &Outcome) -> Option<String> {
    let mut highest = outcome.produce.as_ref().map_or(0, |p| p.latencies_us.max());
    if let Some(c) = &outcome.consume {
        highest = highest
            .max(c.tally.e2e_latencies_us.max())
            .max(c.tally.cycle_latencies_us.max());
    }
    (highest >= report::LATENCY_US_MAX).then(|| {
        format!(
            "some latencies were longer than {}, the longest the histograms hold, and count as that: the top percentiles are at least what they show",
            report::go_duration(Duration::from_micros(report::LATENCY_US_MAX))
        )
    })
}

/// A warning when `--create --partitions P` found the topic there already
/// with another partition count: the run used the topic as it is.
fn partitions_warning(s: &Settings, existing: Option<u32>) -> Option<String> {
    let asked = s.partitions_given.then_some(s.partitions)?;
    let found = existing?;
    (found != asked).then(|| {
        format!(
            "topic {:?} already existed with {found} partitions: the run used it as it is, \
             not with --partitions {asked}",
            s.topic
        )
    })
}

/// A warning when the consumers took messages this run did not produce (the
/// topic held them before it started, or another client produced them): they
/// are acked like the run's own, and counted in the consumed rate.
fn foreign_warning(outcome: &Outcome) -> Option<String> {
    let c = outcome.consume.as_ref()?;
    let foreign = c.tally.foreign_records;
    (foreign > 0).then(|| {
        format!(
            "{foreign} messages received were not produced by this run (the topic held them \
             before it started, or another client produced them); they were acked like its \
             own and count in the consumed rate"
        )
    })
}

/// Opens the pools and runs them, with the ticker closing a window of the
/// series every second until the last consumer is done.
async fn measure(
    s: &Settings,
    show_progress: bool,
    visibility: Duration,
) -> Result<Outcome, String> {
    // Each connection comes with its tally, made now: their histograms take
    // tens of megabytes together, and allocating them once the clock ran made
    // an open-loop run's first requests late by up to about 100 ms.
    let mut producer_conns = Vec::with_capacity(producers_used(s));
    while producer_conns.len() < producers_used(s) {
        producer_conns.push((Conn::open(&s.server).await?, workload::Tally::new()));
    }
    let mut consumer_conns = Vec::with_capacity(s.consumers);
    while consumer_conns.len() < s.consumers {
        consumer_conns.push((Conn::open(&s.server).await?, consumer::ConsumeTally::new()));
    }
    let start = Instant::now();
    let live = Rc::new(Live::new(start));
    let ticker = live::ticker(live.clone(), show_progress, s.mode);
    let ticker = evloop::spawn(ticker);
    let outcome = pools::run_pools(s, producer_conns, consumer_conns, &live, visibility).await;
    live.finish();
    // The ticker closes the last window and erases the status line.
    ticker.await;
    let mut outcome = outcome?;
    outcome.series = live.take_series();
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::config::tests::config;
    use super::*;

    fn settings(config: Config) -> Settings {
        Settings::resolve(&config).unwrap()
    }

    #[test]
    fn start_line_matches_the_reference() {
        assert_eq!(
            start_line(&settings(config())),
            "producing 10000 × 256B with 8 workers..."
        );
        let timed = Config {
            duration: Some(Duration::from_secs(5)),
            batch_records: Some(50),
            rate: Some(1000.0),
            ..config()
        };
        assert_eq!(
            start_line(&settings(timed)),
            "producing for 5s × 256B in batches of 50 at 1000 msg/s with 8 workers..."
        );
        let flow = Config {
            mode: Some(Mode::Flow),
            duration: Some(Duration::from_secs(2)),
            consumers: Some(4),
            consume_max: Some(100),
            ..config()
        };
        assert_eq!(
            start_line(&settings(flow)),
            "producing for 2s × 256B with 8 producers, consuming with 4 consumers (100 per request)..."
        );
        let consume = Config {
            mode: Some(Mode::Consume),
            ..config()
        };
        assert_eq!(
            start_line(&settings(consume.clone())),
            "consuming with 8 consumers (1 per request) until idle..."
        );
        let counted = Config {
            count: Some(5),
            ..consume
        };
        assert_eq!(
            start_line(&settings(counted)),
            "consuming with 8 consumers (1 per request): 5 messages..."
        );
        let ping = Config {
            topic: None,
            mode: Some(Mode::Ping),
            workers: 64,
            ..config()
        };
        assert_eq!(
            start_line(&settings(ping.clone())),
            "pinging /healthz 10000 times with 64 workers..."
        );
        let timed = Config {
            duration: Some(Duration::from_secs(5)),
            ..ping
        };
        assert_eq!(
            start_line(&settings(timed)),
            "pinging /healthz for 5s with 64 workers..."
        );
        // One of a pool is singular, and a rate below 10 a second keeps its fraction.
        let slow = Config {
            workers: 1,
            rate: Some(0.5),
            duration: Some(Duration::from_secs(4)),
            ..config()
        };
        assert_eq!(
            start_line(&settings(slow)),
            "producing for 4s × 256B at 0.50 msg/s with 1 worker..."
        );
    }

    #[test]
    fn bad_arguments_are_usage_errors() {
        let changes: [fn(&mut Config); 12] = [
            |c| c.mode = Some(Mode::Ping),
            |c| {
                c.topic = None;
                c.mode = Some(Mode::Ping);
                c.consume = true
            },
            |c| c.size_bytes = Some(11),
            |c| c.workers = 0,
            |c| c.batch_records = Some(1001),
            |c| c.rate = Some(0.0),
            |c| c.server = "http://example.com:1".into(),
            |c| {
                c.mode = Some(Mode::Flow);
                c.consume_max = Some(101)
            },
            |c| {
                c.consume = true;
                c.mode = Some(Mode::Consume)
            },
            |c| c.verify = true,
            |c| c.cpus = Some("3-1".into()),
            |c| c.report = Some("/nonexistent-narad-dir/report.html".into()),
        ];
        for change in changes {
            let mut bad = config();
            change(&mut bad);
            assert_eq!(run(&bad).unwrap_err().exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn a_report_path_that_cannot_be_written_is_refused_before_the_run() {
        let dir = std::env::temp_dir().join(format!("narad-bench-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (path, why) in [
            (
                dir.join("absent").join("r.html"),
                "No such file or directory",
            ),
            (dir.clone(), "Is a directory"),
        ] {
            let bad = Config {
                report: Some(path.clone()),
                ..config()
            };
            let err = run(&bad).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{err:?}");
            let expected = format!("--report {}: cannot create the file: ", path.display());
            assert!(err.message().starts_with(&expected), "{err:?}");
            assert!(err.message().contains(why), "{err:?}");
        }
        // A writable path is created (empty) before the run starts.
        let fine = dir.join("r.html");
        let settings = settings(Config {
            report: Some(fine.clone()),
            ..config()
        });
        assert!(open_report(&settings).unwrap().is_some());
        assert_eq!(std::fs::metadata(&fine).unwrap().len(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn few_requests_use_few_workers() {
        let small = Config {
            count: Some(3),
            ..config()
        };
        assert_eq!(producers_used(&settings(small)), 3);
        let batched = Config {
            count: Some(1000),
            batch_records: Some(50),
            workers: 64,
            ..config()
        };
        assert_eq!(producers_used(&settings(batched)), 20);
    }

    #[test]
    fn latencies_past_the_histograms_bound_are_warned_of() {
        let tally = || {
            let mut tally = ConsumeTally::new();
            tally.e2e_latencies_us.record(5_000).unwrap();
            tally
        };
        let outcome = |tally| Outcome {
            produce: None,
            consume: Some(ConsumeSummary {
                tally,
                elapsed: Duration::from_secs(1),
                duplicate_records: 0,
                verdict: None,
                drain_cut_short: None,
            }),
            abandoned: false,
            topic_gone: false,
            warnings: Vec::new(),
            series: Series::default(),
        };
        assert_eq!(saturation_warning(&outcome(tally())), None);
        let mut tally = tally();
        tally
            .e2e_latencies_us
            .saturating_record(10 * report::LATENCY_US_MAX);
        let warning = saturation_warning(&outcome(tally)).unwrap();
        assert!(warning.contains("longer than 1h0m0s"), "{warning}");
        // Messages of other runs taken in a flow are counted, and said to be.
        assert_eq!(foreign_warning(&outcome(ConsumeTally::new())), None);
        let mut tally = ConsumeTally::new();
        tally.foreign_records = 7;
        let warning = foreign_warning(&outcome(tally)).unwrap();
        assert!(
            warning.starts_with("7 messages received were not produced by this run"),
            "{warning}"
        );
    }

    #[test]
    fn a_partition_count_the_run_could_not_apply_is_warned_of() {
        let create = |partitions| Config {
            create: true,
            partitions,
            ..config()
        };
        let asked = settings(create(Some(4)));
        let warning = partitions_warning(&asked, Some(6)).unwrap();
        assert_eq!(
            warning,
            "topic \"t\" already existed with 6 partitions: the run used it as it is, not with --partitions 4"
        );
        assert_eq!(partitions_warning(&asked, Some(4)), None, "as asked");
        assert_eq!(partitions_warning(&asked, None), None, "not known");
        // Not asked for: the default is no promise.
        assert_eq!(partitions_warning(&settings(create(None)), Some(6)), None);
    }
}
