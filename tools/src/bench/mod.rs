//! `narad bench <topic>`: the load generator users benchmark a broker with.
//!
//! As the reference: W workers, each with its own keep-alive HTTP/1.1
//! connection, send `POST /v1/topics/<topic>/produce` with the payload
//! `{"bench":"x…"}` padded to `--size` bytes, one request in flight per
//! connection, and report the totals and latency percentiles on standard
//! error. Beyond the reference: a timed run (`--duration`), batch produce
//! (`--batch`), an open-loop rate (`--rate`), topic creation (`--create`), a
//! pinned CPU (`--cpu`) and a JSON summary (`--json`).
//!
//! Which cores: one. Every worker is a task on a single glommio executor in the
//! calling thread (pinned with `--cpu`), and so is every connection's hyper
//! state machine. A generator that spread itself over cores would compete with
//! the broker it measures on a small machine; one core that pushes well over
//! 100,000 requests a second is enough to saturate a broker shard, and its
//! figures are not blurred by cross-thread handoffs.
//!
//! Map:
//! - [`client`]: the server address, the keep-alive connection, topic setup.
//! - `workload`: the payload and bodies, the schedule of requests, the worker.
//! - `report`: percentiles, the human line and the `--json` line.
//!
//! The body of a request is built once as `Bytes` and shared by every request,
//! so the hot loop copies no payload.

pub mod client;
mod report;
mod workload;

use std::io::Write as _;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::Method;

use client::{Conn, RequestTemplate, Server};
use report::Summary;
use workload::{Plan, Schedule, Stop, Tally};

/// The most workers (connections) one run opens.
pub const WORKERS_MAX: usize = 4096;
/// The largest payload the broker accepts.
pub const PAYLOAD_BYTES_MAX: usize = 1 << 20;
/// The most records in one batch request, and the largest batch body, as the
/// broker's batch route allows.
pub const BATCH_RECORDS_MAX: u64 = 1000;
pub const BATCH_BODY_BYTES_MAX: usize = 16 << 20;
/// The longest timed run.
pub const DURATION_MAX: Duration = Duration::from_secs(24 * 3600);
/// The highest open-loop rate, in records per second.
pub const RATE_MAX: f64 = 1e8;

/// What the command line asked for.
#[derive(Clone, Debug)]
pub struct Config {
    /// `http://host:port`.
    pub server: String,
    pub topic: String,
    /// Records to send (ignored with `duration`).
    pub count: u64,
    pub duration: Option<Duration>,
    pub size_bytes: usize,
    pub workers: usize,
    /// Records per `produce/batch` request; `None` sends single produces.
    pub batch_records: Option<u64>,
    /// Open-loop rate in records per second.
    pub rate: Option<f64>,
    pub cpu: Option<usize>,
    pub create: bool,
    pub partitions: u32,
    pub consume: bool,
    pub json: bool,
}

/// Why a run did not succeed, and the exit code that says so.
#[derive(Debug, PartialEq, Eq)]
pub enum BenchError {
    /// Asked for something this build does not do yet, or bad arguments: 2.
    Usage(String),
    /// The run could not start, or some requests failed: 1.
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

/// Runs the benchmark, printing progress and results.
pub fn run(config: &Config) -> Result<(), BenchError> {
    if config.consume {
        return Err(BenchError::Usage(
            "bench --consume: consuming is not available yet in this build; \
             run without --consume to measure produce"
                .into(),
        ));
    }
    let server = Server::parse(&config.server).map_err(BenchError::Usage)?;
    validate(config).map_err(BenchError::Usage)?;
    say_err(&start_line(config));
    let setup = config.clone();
    let outcome = narad_io::rt::try_run_local(config.cpu, drive(setup, server))
        .map_err(BenchError::Failed)?;
    let (summary, abandoned) = outcome.map_err(BenchError::Failed)?;
    say_err(&summary.human_line());
    if config.json {
        // Not `println!`, which panics when standard output is closed.
        let _ = writeln!(std::io::stdout(), "{}", summary.json_line());
    }
    if abandoned {
        return Err(BenchError::Failed(
            "the server stopped accepting connections; the run ended early".into(),
        ));
    }
    if summary.failed_records > 0 {
        return Err(BenchError::Failed(format!(
            "{} of {} records failed",
            summary.failed_records,
            summary.failed_records + summary.ok_records
        )));
    }
    Ok(())
}

/// One line on standard error; a closed stream loses it rather than panicking.
fn say_err(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn validate(config: &Config) -> Result<(), String> {
    let frame = workload::PAYLOAD_FRAME_BYTES;
    if !(frame..=PAYLOAD_BYTES_MAX).contains(&config.size_bytes) {
        return Err(format!(
            "--size must be {frame} to {PAYLOAD_BYTES_MAX} bytes"
        ));
    }
    if !(1..=WORKERS_MAX).contains(&config.workers) {
        return Err(format!("--workers must be 1 to {WORKERS_MAX}"));
    }
    if config.count == 0 && config.duration.is_none() {
        return Err("--count must be at least 1".into());
    }
    if let Some(d) = config.duration {
        if d.is_zero() || d > DURATION_MAX {
            return Err(format!(
                "--duration must be 1 to {} s",
                DURATION_MAX.as_secs()
            ));
        }
    }
    if let Some(batch) = config.batch_records {
        if !(1..=BATCH_RECORDS_MAX).contains(&batch) {
            return Err(format!("--batch must be 1 to {BATCH_RECORDS_MAX}"));
        }
        // Each record costs its payload plus at most `{"payload":""},` and two
        // escapes per quote of the frame.
        let record_bytes = config.size_bytes + 32;
        if record_bytes * batch as usize > BATCH_BODY_BYTES_MAX {
            return Err(format!(
                "--batch × --size exceeds the {BATCH_BODY_BYTES_MAX}-byte batch body limit"
            ));
        }
    }
    if let Some(rate) = config.rate {
        if !(rate.is_finite() && rate > 0.0 && rate <= RATE_MAX) {
            return Err(format!("--rate must be above 0 and at most {RATE_MAX}"));
        }
    }
    if config.topic.is_empty() {
        return Err("the topic name is empty".into());
    }
    Ok(())
}

/// `producing N × SB with W workers...`, with the extensions in between.
fn start_line(config: &Config) -> String {
    let what = match config.duration {
        Some(d) => format!("for {}", report::go_duration(d)),
        None => config.count.to_string(),
    };
    let batch = match config.batch_records {
        Some(n) => format!(" in batches of {n}"),
        None => String::new(),
    };
    let rate = match config.rate {
        Some(r) => format!(" at {r:.0} msg/s"),
        None => String::new(),
    };
    format!(
        "producing {what} × {}B{batch}{rate} with {} workers...",
        config.size_bytes,
        workers_used(config)
    )
}

/// A counted run needs no more connections than it has requests.
fn workers_used(config: &Config) -> usize {
    let batch = config.batch_records.unwrap_or(1);
    match config.duration {
        Some(_) => config.workers,
        None => {
            let requests = config.count.div_ceil(batch);
            config
                .workers
                .min(usize::try_from(requests).unwrap_or(usize::MAX))
        }
    }
}

/// Sets up the topic and the connections, runs the workers, and sums their
/// tallies. Returns the summary and whether the run was cut short.
async fn drive(config: Config, server: Server) -> Result<(Summary, bool), String> {
    let mut first = Conn::open(&server).await?;
    if config.create {
        client::create_topic(&mut first, &server, &config.topic, config.partitions).await?;
    } else {
        client::check_topic(&mut first, &server, &config.topic).await?;
    }
    let workers = workers_used(&config);
    let mut conns = vec![first];
    while conns.len() < workers {
        conns.push(Conn::open(&server).await?);
    }
    let plan = Rc::new(plan(&config, server));
    let start = plan.schedule.start();
    let handles: Vec<_> = conns
        .into_iter()
        .map(|conn| narad_io::rt::spawn_local(workload::worker(plan.clone(), conn)))
        .collect();
    let mut tallies: Vec<Tally> = Vec::with_capacity(handles.len());
    for handle in handles {
        tallies.push(handle.await.ok_or("a worker task was cancelled")?);
    }
    let mut summary = Summary {
        ok_records: 0,
        failed_records: 0,
        elapsed: Duration::ZERO,
        latencies_us: report::latency_histogram(),
        target_rate: config.rate,
    };
    for tally in &tallies {
        summary.ok_records += tally.ok_records;
        summary.failed_records += tally.failed_records;
        summary.elapsed = summary
            .elapsed
            .max(tally.finished.saturating_duration_since(start));
        summary
            .latencies_us
            .add(&tally.latencies_us)
            .map_err(|e| format!("cannot merge latencies: {e}"))?;
    }
    if config.duration.is_none() && !plan.schedule.is_abandoned() {
        assert_eq!(summary.ok_records + summary.failed_records, config.count);
    }
    Ok((summary, plan.schedule.is_abandoned()))
}

/// The requests of the run, and its schedule starting now.
fn plan(config: &Config, server: Server) -> Plan {
    let payload = workload::payload(config.size_bytes);
    let (template, body, tail_body) = match config.batch_records {
        None => {
            let path = client::topic_path(&config.topic, "/produce");
            let template =
                RequestTemplate::new(Method::POST, &path, &server, "application/octet-stream");
            (template, Bytes::from(payload), None)
        }
        Some(batch) => {
            let path = client::topic_path(&config.topic, "/produce/batch");
            let template = RequestTemplate::new(Method::POST, &path, &server, "application/json");
            let body = Bytes::from(workload::batch_body(&payload, batch));
            let tail = match config.duration {
                None if config.count % batch != 0 => Some(Bytes::from(workload::batch_body(
                    &payload,
                    config.count % batch,
                ))),
                _ => None,
            };
            (template, body, tail)
        }
    };
    let batch = config.batch_records.unwrap_or(1);
    let interval = config
        .rate
        .map(|rate| Duration::from_secs_f64(batch as f64 / rate).max(Duration::from_nanos(1)));
    let start = Instant::now();
    let stop = match config.duration {
        Some(d) => Stop::At(start + d),
        None => Stop::Records(config.count),
    };
    Plan {
        server,
        template,
        body,
        tail_body,
        schedule: Schedule::new(stop, batch, interval, start),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config {
            server: "http://127.0.0.1:7942".into(),
            topic: "t".into(),
            count: 10_000,
            duration: None,
            size_bytes: 256,
            workers: 8,
            batch_records: None,
            rate: None,
            cpu: None,
            create: false,
            partitions: 3,
            consume: false,
            json: false,
        }
    }

    #[test]
    fn start_line_matches_the_reference() {
        assert_eq!(
            start_line(&config()),
            "producing 10000 × 256B with 8 workers..."
        );
        let timed = Config {
            duration: Some(Duration::from_secs(5)),
            batch_records: Some(50),
            rate: Some(1000.0),
            ..config()
        };
        assert_eq!(
            start_line(&timed),
            "producing for 5s × 256B in batches of 50 at 1000 msg/s with 8 workers..."
        );
    }

    #[test]
    fn consume_is_refused_with_exit_code_2() {
        let err = run(&Config {
            consume: true,
            ..config()
        })
        .unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.message().contains("not available yet"));
    }

    #[test]
    fn bad_arguments_are_usage_errors() {
        let changes: [fn(&mut Config); 5] = [
            |c| c.size_bytes = 11,
            |c| c.workers = 0,
            |c| c.batch_records = Some(1001),
            |c| c.rate = Some(0.0),
            |c| c.server = "http://example.com:1".into(),
        ];
        for change in changes {
            let mut bad = config();
            change(&mut bad);
            assert_eq!(run(&bad).unwrap_err().exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn few_requests_use_few_workers() {
        let small = Config {
            count: 3,
            ..config()
        };
        assert_eq!(workers_used(&small), 3);
        let batched = Config {
            count: 1000,
            batch_records: Some(50),
            workers: 64,
            ..config()
        };
        assert_eq!(workers_used(&batched), 20);
    }
}
