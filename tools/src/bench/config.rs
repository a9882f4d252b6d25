//! What the command line asked for ([`Config`]) and what a run does with it
//! ([`Settings`]): the mode, the two pools of connections, the stop condition.
//!
//! Which cores: the caller's thread, before the run; pure functions.
//!
//! Every refusal here is a usage error (exit code 2) with a message that names
//! the flag, so a bad command line never reaches the broker.

use std::path::PathBuf;
use std::time::Duration;

use super::client::Server;
use super::stamp::STAMPED_PAYLOAD_BYTES_MIN;
use super::workload::PAYLOAD_FRAME_BYTES;

/// The most workers (connections) in one pool.
pub const WORKERS_MAX: usize = 4096;
/// The largest payload the broker accepts.
pub const PAYLOAD_BYTES_MAX: usize = 1 << 20;
/// Payload bytes per record when `--size` is not given (the reference's default).
pub const SIZE_BYTES_DEFAULT: usize = 256;
/// The most records in one batch request, and the largest batch body, as the
/// broker's batch route allows.
pub const BATCH_RECORDS_MAX: u64 = 1000;
pub const BATCH_BODY_BYTES_MAX: usize = 16 << 20;
/// The most messages one batch consume asks for, as the broker allows.
pub const CONSUME_MAX_RECORDS: u32 = 100;
/// The longest timed run.
pub const DURATION_MAX: Duration = Duration::from_secs(24 * 3600);
/// The highest open-loop rate, in records per second.
pub const RATE_MAX: f64 = 1e8;
/// The lowest open-loop rate, in records per second.
pub const RATE_MIN: f64 = 1e-3;
/// How long a run on a fresh topic lasts unless told otherwise.
pub const FRESH_TOPIC_DURATION: Duration = Duration::from_secs(10);
/// Records a counted run sends unless told otherwise (the reference's default).
pub const COUNT_DEFAULT: u64 = 10_000;
/// Partitions of a topic the run creates, unless told otherwise.
pub const PARTITIONS_DEFAULT: u32 = 3;
/// The fewest partitions a broker takes for a topic.
pub const PARTITIONS_MIN: u32 = 3;
/// CPU numbers `--cpus` accepts are below this, far above the machines the
/// generator runs on; it also bounds the length of the list.
pub const CPU_ID_LIMIT: usize = 4096;

/// What a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Producers only: the reference's bench.
    Produce,
    /// Consumers only, draining what the topic holds.
    Consume,
    /// Producers and consumers at once, with end-to-end latency.
    Flow,
    /// `GET /healthz` from the producer pool: the generator and the HTTP
    /// layer against the broker's cheapest route, no topic involved.
    Ping,
}

impl Mode {
    pub fn parse(text: &str) -> Result<Mode, String> {
        match text {
            "produce" => Ok(Mode::Produce),
            "consume" => Ok(Mode::Consume),
            "flow" => Ok(Mode::Flow),
            "ping" => Ok(Mode::Ping),
            other => Err(format!(
                "--mode {other:?}: want produce, consume, flow or ping"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Produce => "produce",
            Mode::Consume => "consume",
            Mode::Flow => "flow",
            Mode::Ping => "ping",
        }
    }

    /// Runs the producer pool (ping mode's requests are sent from it too).
    pub fn produces(self) -> bool {
        self != Mode::Consume
    }

    pub fn consumes(self) -> bool {
        matches!(self, Mode::Consume | Mode::Flow)
    }

    /// Needs a topic: every mode but ping.
    pub fn uses_topic(self) -> bool {
        self != Mode::Ping
    }

    /// What the producer pool's requests are called in the status line and the
    /// report: records produced, or pings answered.
    pub fn sender_words(self) -> SenderWords {
        match self {
            Mode::Ping => SenderWords {
                verb: "ping",
                unit: "req",
                done: "pinged (200 OK)",
                latency: "request",
                chart: "Request latency",
                failed: "ping (requests)",
                series: "pinged",
            },
            _ => SenderWords {
                verb: "produce",
                unit: "msg",
                done: "produced (acknowledged)",
                latency: "produce-ack",
                chart: "Produce-ack latency",
                failed: "produce (records)",
                series: "produced",
            },
        }
    }
}

/// Labels of the producer pool's figures; see [`Mode::sender_words`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SenderWords {
    /// Status line rate: `produce 40 msg/s`.
    pub verb: &'static str,
    pub unit: &'static str,
    /// Figures table row of acknowledged requests.
    pub done: &'static str,
    /// Latency table row and percentile plot series.
    pub latency: &'static str,
    /// Title of the latency-over-time chart.
    pub chart: &'static str,
    /// Errors table row.
    pub failed: &'static str,
    /// Throughput chart series.
    pub series: &'static str,
}

/// Where `--json` writes its summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JsonTarget {
    Stdout,
    File(PathBuf),
}

/// What the command line asked for, before defaults that depend on each other.
#[derive(Clone, Debug)]
pub struct Config {
    /// `http://host:port`.
    pub server: String,
    /// `None`: a fresh topic, created and deleted by the run.
    pub topic: Option<String>,
    /// Records to send (to consume, in consume mode).
    pub count: Option<u64>,
    pub duration: Option<Duration>,
    /// `None`: [`SIZE_BYTES_DEFAULT`].
    pub size_bytes: Option<usize>,
    /// The size of each pool unless `producers` or `consumers` says otherwise.
    pub workers: usize,
    pub producers: Option<usize>,
    pub consumers: Option<usize>,
    pub mode: Option<Mode>,
    /// The reference's `--consume`: an alias of `--mode flow`.
    pub consume: bool,
    /// Messages per consume request (`--max`).
    pub consume_max: Option<u32>,
    pub verify: bool,
    /// Records per `produce/batch` request; `None` sends single produces.
    pub batch_records: Option<u64>,
    /// Open-loop rate in records per second.
    pub rate: Option<f64>,
    /// `--cpus LIST` as written (`1`, `0,2`, `2-3`).
    pub cpus: Option<String>,
    pub create: bool,
    pub partitions: Option<u32>,
    pub json: Option<JsonTarget>,
    /// Where `--report` writes its HTML page.
    pub report: Option<PathBuf>,
    /// `--timeout`: how long one request may wait for its answer.
    pub timeout: Option<Duration>,
}

/// How the run ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Length {
    /// After this many records (produced, or consumed in consume mode).
    Records(u64),
    /// After this long.
    Timed(Duration),
    /// Consume mode without either: when the topic has been empty for a while.
    UntilIdle,
}

/// What the run does: every default applied, every relation checked.
#[derive(Clone, Debug)]
pub struct Settings {
    pub server: Server,
    pub topic: String,
    /// The run created the topic under a random name and deletes it at the end.
    pub fresh_topic: bool,
    pub mode: Mode,
    pub length: Length,
    pub size_bytes: usize,
    /// 0 in consume mode.
    pub producers: usize,
    /// 0 in produce mode.
    pub consumers: usize,
    pub consume_max: u32,
    pub verify: bool,
    pub batch_records: Option<u64>,
    pub rate: Option<f64>,
    /// The CPUs `--cpus` named, in order; empty when the run is not pinned.
    pub cpus: Vec<usize>,
    pub create: bool,
    pub partitions: u32,
    /// `--partitions` was given, not defaulted.
    pub partitions_given: bool,
    pub json: Option<JsonTarget>,
    pub report: Option<PathBuf>,
}

impl Settings {
    /// The run's settings, every default applied: the `settings` object of the
    /// `--json` line, so that a result file says what produced it.
    pub fn json_value(&self) -> serde_json::Value {
        let (count, duration_s) = match self.length {
            Length::Records(n) => (Some(n), None),
            Length::Timed(d) => (None, Some(d.as_secs_f64())),
            Length::UntilIdle => (None, None),
        };
        serde_json::json!({
            "server": format!("http://{}", self.server.authority),
            "mode": self.mode.name(),
            "topic": self.topic,
            "fresh_topic": self.fresh_topic,
            "count": count,
            "duration_s": duration_s,
            "size_bytes": self.size_bytes,
            "producers": self.producers,
            "consumers": self.consumers,
            "batch": self.batch_records,
            "max": self.consume_max,
            "rate": self.rate,
            "verify": self.verify,
            "partitions": self.create.then_some(self.partitions),
            "cpus": self.cpus,
            "timeout_s": self.server.timeout.as_secs_f64(),
        })
    }

    /// Applies the defaults and refuses what does not fit together.
    pub fn resolve(config: &Config) -> Result<Settings, String> {
        let mut server = Server::parse(&config.server)?;
        if let Some(timeout) = config.timeout {
            // A consume long-polls for a second: a deadline as short would
            // end idle polls as failures.
            if timeout < Duration::from_secs(2) {
                return Err("--timeout must be at least 2 seconds".into());
            }
            server.timeout = timeout;
        }
        let mode = resolve_mode(config)?;
        refuse_flags_of_other_modes(config, mode)?;
        if mode == Mode::Ping && config.topic.is_some() {
            return Err("--mode ping takes no TOPIC: it sends GET /healthz".into());
        }
        let fresh_topic = config.topic.is_none() && mode.uses_topic();
        if fresh_topic && mode == Mode::Consume {
            return Err(
                "--mode consume needs a TOPIC: a fresh topic has nothing to consume".into(),
            );
        }
        if !fresh_topic && !config.create && config.partitions.is_some() {
            return Err("--partitions applies to a topic the run creates (--create)".into());
        }
        // The broker's floor; its ceiling (`topic.max_partitions`) is its own
        // configuration, which only it can judge.
        if let Some(p) = config.partitions.filter(|&p| p < PARTITIONS_MIN) {
            return Err(format!(
                "--partitions must be at least {PARTITIONS_MIN}, got {p}"
            ));
        }
        let topic = match &config.topic {
            Some(topic) if topic.is_empty() => return Err("the topic name is empty".into()),
            Some(topic) => topic.clone(),
            None if fresh_topic => fresh_topic_name(),
            None => String::new(),
        };
        let length = match (config.count, config.duration) {
            (Some(_), Some(_)) => return Err("--count and --duration exclude each other".into()),
            (Some(0), None) => return Err("--count must be at least 1".into()),
            (Some(n), None) => Length::Records(n),
            (None, Some(d)) if d < Duration::from_secs(1) || d > DURATION_MAX => {
                return Err(format!(
                    "--duration must be 1 to {} s",
                    DURATION_MAX.as_secs()
                ))
            }
            (None, Some(d)) => Length::Timed(d),
            (None, None) if fresh_topic => Length::Timed(FRESH_TOPIC_DURATION),
            (None, None) if mode == Mode::Consume => Length::UntilIdle,
            (None, None) => Length::Records(COUNT_DEFAULT),
        };
        let pool = |flag: &str, size: Option<usize>, used: bool| -> Result<usize, String> {
            // A pool not given takes --workers, and an error names that flag.
            let flag = if size.is_some() { flag } else { "workers" };
            let size = size.unwrap_or(config.workers);
            if !(1..=WORKERS_MAX).contains(&size) {
                return Err(format!("--{flag} must be 1 to {WORKERS_MAX}"));
            }
            Ok(if used { size } else { 0 })
        };
        let settings = Settings {
            server,
            topic,
            fresh_topic,
            mode,
            length,
            size_bytes: config.size_bytes.unwrap_or(SIZE_BYTES_DEFAULT),
            producers: pool("producers", config.producers, mode.produces())?,
            consumers: pool("consumers", config.consumers, mode.consumes())?,
            consume_max: config.consume_max.unwrap_or(1),
            verify: config.verify,
            batch_records: config.batch_records,
            rate: config.rate,
            cpus: match &config.cpus {
                Some(list) => parse_cpu_list(list)?,
                None => Vec::new(),
            },
            create: config.create || fresh_topic,
            partitions: config.partitions.unwrap_or(PARTITIONS_DEFAULT),
            partitions_given: config.partitions.is_some(),
            json: config.json.clone(),
            report: config.report.clone(),
        };
        settings.validate(config.workers)?;
        Ok(settings)
    }

    fn validate(&self, workers: usize) -> Result<(), String> {
        self.validate_size()?;
        if !(1..=WORKERS_MAX).contains(&workers) {
            return Err(format!("--workers must be 1 to {WORKERS_MAX}"));
        }
        if !(1..=CONSUME_MAX_RECORDS).contains(&self.consume_max) {
            return Err(format!(
                "--max must be 1 to {CONSUME_MAX_RECORDS} (messages per consume request)"
            ));
        }
        self.validate_batch_and_rate()?;
        assert!(self.mode.produces() == (self.producers > 0));
        assert!(self.mode.consumes() == (self.consumers > 0));
        assert!(self.mode.uses_topic() != self.topic.is_empty());
        Ok(())
    }

    /// `--size` fits the payload's frame; ping mode sends no payload (and
    /// refuses `--size`).
    fn validate_size(&self) -> Result<(), String> {
        if self.mode == Mode::Ping {
            return Ok(());
        }
        let frame = if self.mode == Mode::Flow {
            STAMPED_PAYLOAD_BYTES_MIN
        } else {
            PAYLOAD_FRAME_BYTES
        };
        if !(frame..=PAYLOAD_BYTES_MAX).contains(&self.size_bytes) {
            let why = if self.mode == Mode::Flow {
                " in flow mode (the payload carries an id and a send time)"
            } else {
                ""
            };
            return Err(format!(
                "--size must be {frame} to {PAYLOAD_BYTES_MAX} bytes{why}"
            ));
        }
        Ok(())
    }

    fn validate_batch_and_rate(&self) -> Result<(), String> {
        if let Some(batch) = self.batch_records {
            if !(1..=BATCH_RECORDS_MAX).contains(&batch) {
                return Err(format!("--batch must be 1 to {BATCH_RECORDS_MAX}"));
            }
            // Each record costs its payload plus at most `{"payload":""},` and
            // two escapes per quote of the frame.
            let record_bytes = self.size_bytes + 32;
            if record_bytes * batch as usize > BATCH_BODY_BYTES_MAX {
                return Err(format!(
                    "--batch × --size exceeds the {BATCH_BODY_BYTES_MAX}-byte batch body limit"
                ));
            }
        }
        if let Some(rate) = self.rate {
            if !(rate.is_finite() && (RATE_MIN..=RATE_MAX).contains(&rate)) {
                return Err(format!("--rate must be {RATE_MIN} to {RATE_MAX}"));
            }
        }
        Ok(())
    }

    /// Records per produce request.
    pub fn batch(&self) -> u64 {
        self.batch_records.unwrap_or(1)
    }

    /// The CPU the generator's one executor is pinned to: the first of
    /// `--cpus`. The generator runs on one core (see the module map), so the
    /// rest of the list goes unused.
    pub fn pin_cpu(&self) -> Option<usize> {
        self.cpus.first().copied()
    }
}

/// Parses a CPU list as `taskset -c` writes it: numbers and inclusive ranges,
/// comma-separated (`1`, `0,2`, `2-3`, `0,4-5`). Refuses an empty entry, a
/// range that runs backwards, a CPU listed twice and a number at or above
/// [`CPU_ID_LIMIT`], so the list holds fewer than [`CPU_ID_LIMIT`] entries.
pub fn parse_cpu_list(text: &str) -> Result<Vec<usize>, String> {
    let refuse = |why: String| {
        format!("--cpus {text:?}: {why}; want CPU numbers or ranges like 1, 0,2 or 2-3")
    };
    let number = |part: &str| -> Result<usize, String> {
        match part.trim().parse::<usize>() {
            Ok(cpu) if cpu < CPU_ID_LIMIT => Ok(cpu),
            Ok(cpu) => Err(refuse(format!("CPU {cpu} is not below {CPU_ID_LIMIT}"))),
            Err(_) => Err(refuse(format!("{:?} is not a CPU number", part.trim()))),
        }
    };
    let mut seen = vec![false; CPU_ID_LIMIT];
    let mut cpus = Vec::new();
    for part in text.split(',') {
        let (first, last) = match part.split_once('-') {
            Some((first, last)) => (number(first)?, number(last)?),
            None => {
                let cpu = number(part)?;
                (cpu, cpu)
            }
        };
        if first > last {
            return Err(refuse(format!("the range {first}-{last} runs backwards")));
        }
        for (cpu, listed) in seen.iter_mut().enumerate().take(last + 1).skip(first) {
            if std::mem::replace(listed, true) {
                return Err(refuse(format!("CPU {cpu} is listed twice")));
            }
            cpus.push(cpu);
        }
    }
    assert!(!cpus.is_empty() && cpus.len() <= CPU_ID_LIMIT);
    Ok(cpus)
}

/// `--mode`, or `--consume` (its alias for flow), or produce.
fn resolve_mode(config: &Config) -> Result<Mode, String> {
    match (config.mode, config.consume) {
        (Some(mode), true) if mode != Mode::Flow => Err(format!(
            "--consume means --mode flow; it conflicts with --mode {}",
            mode.name()
        )),
        (Some(mode), _) => Ok(mode),
        (None, true) => Ok(Mode::Flow),
        (None, false) if config.topic.is_none() => Ok(Mode::Flow),
        (None, false) => Ok(Mode::Produce),
    }
}

fn refuse_flags_of_other_modes(config: &Config, mode: Mode) -> Result<(), String> {
    let refuse = |flag: &str, wants: &str| {
        Err(format!(
            "{flag} applies to {wants}, not to --mode {}",
            mode.name()
        ))
    };
    match mode {
        Mode::Produce => {
            if config.consumers.is_some() {
                return refuse("--consumers", "--mode consume or flow");
            }
            if config.consume_max.is_some() {
                return refuse("--max", "--mode consume or flow");
            }
            if config.verify {
                return refuse("--verify", "--mode flow");
            }
        }
        Mode::Consume => {
            if config.producers.is_some() {
                return refuse("--producers", "--mode produce or flow");
            }
            if config.batch_records.is_some() {
                return refuse("--batch", "--mode produce or flow");
            }
            if config.rate.is_some() {
                return refuse("--rate", "--mode produce or flow");
            }
            // Consumers take whatever the topic holds: there is nothing to size.
            if config.size_bytes.is_some() {
                return refuse("--size", "--mode produce or flow");
            }
            if config.verify {
                return refuse("--verify", "--mode flow");
            }
        }
        Mode::Flow => {}
        Mode::Ping => {
            // A closed loop of bodiless requests to a route with no topic.
            let set = [
                ("--consumers", config.consumers.is_some()),
                ("--max", config.consume_max.is_some()),
                ("--verify", config.verify),
                ("--batch", config.batch_records.is_some()),
                ("--rate", config.rate.is_some()),
                ("--create", config.create),
                ("--partitions", config.partitions.is_some()),
                ("--size", config.size_bytes.is_some()),
            ];
            if let Some((flag, _)) = set.iter().find(|(_, set)| *set) {
                return Err(format!("{flag} does not apply to --mode ping"));
            }
        }
    }
    Ok(())
}

/// `bench-` and 16 hex digits from the clock and the process id: unique
/// enough that two runs never share a topic.
fn fresh_topic_name() -> String {
    let nanos = super::stamp::unix_ns();
    let mixed = nanos ^ (u64::from(std::process::id()) << 40);
    format!("bench-{:016x}", mixed.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

#[cfg(test)]
#[path = "config_tests.rs"]
pub(super) mod tests;
