//! The command line. Flag names follow the reference broker's where one exists.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

pub use crate::config::LogFormat;
use crate::config::{Flags, LogConfig};

/// A queue-first durable message broker.
#[derive(Parser, Debug)]
#[command(name = "narad", version, about)]
pub struct Cli {
    /// Log level: off, error, warn, info, debug or trace, or `target=level`
    /// directives such as `info,hyper=warn` (`log.level`, NARAD_LOG_LEVEL;
    /// default info).
    #[arg(long, global = true)]
    pub log_level: Option<String>,
    /// Log format (`log.format`, NARAD_LOG_FORMAT; default json).
    #[arg(long, global = true, value_enum)]
    pub log_format: Option<LogFormat>,
    /// The broker the client commands talk to, `http://host:port` with an IP
    /// address or `localhost` as the host (`serve` refuses it: it listens on
    /// `--addr` / `--port`).
    #[arg(
        short = 's',
        long,
        global = true,
        env = "NARAD_ADDR",
        default_value = "http://127.0.0.1:7942"
    )]
    pub server: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a broker node.
    Serve(ServeArgs),
    /// Describe on-disk data without changing it (offline).
    #[command(subcommand)]
    Inspect(InspectCommand),
    /// Load a broker with produce and consume requests and report throughput and
    /// latency.
    Bench(BenchArgs),
    /// Print the version.
    Version,
    /// Print a shell completion script (bash, zsh, fish, elvish or powershell),
    /// e.g. `narad completion bash > /etc/bash_completion.d/narad`.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Developer tools used by the test suite.
    #[command(subcommand, hide = true)]
    Debug(DebugCommand),
}

/// `narad serve`. Each flag overrides the configuration file and the environment
/// (see `crate::config`).
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Development mode: security off, listen on 127.0.0.1 only, data in `./data`.
    #[arg(long)]
    pub dev: bool,
    /// A JSON configuration file (keys such as `http.addr`, `storage.data_dir`).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// API listen address, `host:port` or `:port` (`http.addr`; default `:7942`).
    #[arg(long)]
    pub addr: Option<String>,
    /// API port, keeping the address's host; 0 picks a free port.
    #[arg(allow_negative_numbers = true, long)]
    pub port: Option<u16>,
    /// Data directory (`storage.data_dir`; default `./data`).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Shards (one pinned executor each), 1 to 1024; default: every CPU this
    /// process may use.
    #[arg(allow_negative_numbers = true, long, env = "NARAD_SHARDS", value_parser = parse_shards)]
    pub shards: Option<usize>,
    /// The reference's flags for what this version lacks (a cluster, a profiling
    /// listener): refused with the reason rather than as unknown.
    #[arg(long, hide = true)]
    pub node_id: Option<String>,
    #[arg(long, hide = true)]
    pub cluster_port: Option<String>,
    #[arg(long, hide = true)]
    pub pprof_addr: Option<String>,
}

impl ServeArgs {
    /// Why the command line asks for something this version cannot do, if it does.
    pub fn unsupported(&self) -> Option<String> {
        let (flag, what) = if self.node_id.is_some() {
            ("--node-id", "a cluster")
        } else if self.cluster_port.is_some() {
            ("--cluster-port", "a cluster")
        } else if self.pprof_addr.is_some() {
            ("--pprof-addr", "a profiling listener")
        } else {
            return None;
        };
        Some(format!(
            "{flag} configures {what}, which this version does not support; leave it out"
        ))
    }
}

/// Why `serve` refuses `-s/--server` given on its command line: it is the
/// client commands' broker address, and a node that took it for its own
/// listen address would quietly listen elsewhere. (`NARAD_ADDR` in the
/// environment is left alone: shells set it for the clients.)
pub const SERVER_FLAG_ON_SERVE: &str =
    "--server (-s) names the broker the client commands talk to; \
     serve listens on --addr / --port (http.addr, NARAD_HTTP_ADDR): leave --server out";

/// The most shards a node runs: each holds a listener, a WAL and its rings, and
/// more shards than CPUs only share them.
pub const SHARDS_MAX: usize = 1024;

fn parse_shards(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if (1..=SHARDS_MAX).contains(&n) => Ok(n),
        // clap names the flag even for a value from the environment.
        _ => Err(format!(
            "want a number of shards from 1 to {SHARDS_MAX} (from --shards or NARAD_SHARDS)"
        )),
    }
}

/// `narad bench [TOPIC]`.
///
/// W workers, each with its own keep-alive HTTP/1.1 connection and one request
/// in flight, send `POST /v1/topics/<topic>/produce` with the payload
/// `{"bench":"x…"}` padded with x's to --size bytes. A request fails on a
/// transport error or a status of 400 or more; a connection the server closes is
/// reopened. Standard error gets `producing N × SB with W workers...` and then
/// `produce: <ok> ok, <fail> failed in <t> — <rate> msg/s; latency p50=… p95=…
/// p99=…` (latency of successful requests, rounded to 100 µs). All workers run
/// on one core.
///
/// --mode consume drains the topic with --consumers connections, each a loop
/// of `GET .../consume?wait=1s` and the ack of what it returned; a message
/// counts as consumed once its ack is answered 204. --mode flow (also
/// --consume) runs --producers and --consumers at once; each payload carries
/// its id and send time, so the report adds end-to-end latency, and --verify
/// checks that every acknowledged record was consumed. Without TOPIC the run
/// creates a fresh topic, runs a 10-second flow and deletes the topic.
///
/// --mode ping takes no TOPIC: the --workers connections send `GET /healthz`
/// in a closed loop and count each 200 as ok, which measures the generator and
/// the broker's HTTP layer on its cheapest route (`ping: <ok> ok, … req/s`).
/// --count and --duration bound it; --size does not apply, and --batch,
/// --rate, --create, --partitions and the consume flags are refused.
///
/// On a terminal, a status line on standard error is redrawn every second
/// (elapsed time, rates, errors and p99 so far); piped, standard error gets
/// only the lines above.
///
/// Beyond the reference: --mode, --producers, --consumers, --max, --verify,
/// --duration, --batch, --rate, --create/--partitions, --cpus, --json and
/// --report. Exit code 1 if any record failed, a consume or ack was answered
/// 5xx, a payload came back changed or (--verify) a record is missing; 2 for
/// bad arguments.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The topic to use; without it, a fresh topic that the run deletes.
    pub topic: Option<String>,
    /// Records to produce (default 10000; in consume mode, records to consume).
    #[arg(allow_negative_numbers = true, long)]
    pub count: Option<u64>,
    /// Payload bytes per record (default 256; at least 12, the JSON frame
    /// around the x's; 64 in flow mode, whose payload also carries an id and a
    /// send time).
    #[arg(allow_negative_numbers = true, long)]
    pub size: Option<usize>,
    /// Concurrent workers, each with its own connection (the default size of
    /// each pool).
    #[arg(allow_negative_numbers = true, long, default_value_t = 8)]
    pub workers: usize,
    /// Measure consuming too: the same as --mode flow.
    #[arg(long)]
    pub consume: bool,
    /// (Extension) produce, consume (drain the topic), flow (both at once) or
    /// ping (`GET /healthz`, no TOPIC); default produce, or flow without a
    /// TOPIC.
    #[arg(long, value_parser = ["produce", "consume", "flow", "ping"])]
    pub mode: Option<String>,
    /// (Extension) Producer connections (default --workers).
    #[arg(allow_negative_numbers = true, long, value_name = "N")]
    pub producers: Option<usize>,
    /// (Extension) Consumer connections (default --workers).
    #[arg(allow_negative_numbers = true, long, value_name = "N")]
    pub consumers: Option<usize>,
    /// (Extension) Messages per consume request (1–100); above 1, batch
    /// consume and one batch ack per reply.
    #[arg(allow_negative_numbers = true, long, value_name = "N")]
    pub max: Option<u32>,
    /// (Extension) Flow mode: check that every acknowledged record is consumed
    /// and that payloads come back as sent; report missing and duplicates.
    #[arg(long)]
    pub verify: bool,
    /// (Extension) Run this long instead of --count records: whole seconds
    /// (`30`) or a Go duration (`30s`, `2m`, `1m30s`).
    #[arg(long, value_name = "DURATION", conflicts_with = "count", value_parser = seconds_or_duration)]
    pub duration: Option<std::time::Duration>,
    /// (Extension) Send `POST .../produce/batch` requests of this many records
    /// (1–1000) instead of single produces; counts and rates stay in records.
    #[arg(allow_negative_numbers = true, long, value_name = "N")]
    pub batch: Option<u64>,
    /// (Extension) Open loop: send requests at fixed intervals that add up to
    /// this many records per second, whatever the latency. Latency is measured
    /// from each request's scheduled time, so queueing shows instead of being
    /// hidden; the line reports the achieved rate next to the target.
    #[arg(allow_negative_numbers = true, long, value_name = "MSGS_PER_SEC")]
    pub rate: Option<f64>,
    /// (Extension) Pin the generator to the first CPU of LIST (`1`, `0,2`,
    /// `2-3`): it runs on one executor, so it uses one CPU whatever the list.
    /// --cpu N is an alias.
    #[arg(long, value_name = "LIST", visible_alias = "cpu")]
    pub cpus: Option<String>,
    /// (Extension) Create the topic first if it does not exist.
    #[arg(long)]
    pub create: bool,
    /// (Extension) Partitions of a topic the run creates (default 3).
    #[arg(allow_negative_numbers = true, long)]
    pub partitions: Option<u32>,
    /// (Extension) Also write a JSON summary line to FILE, or to standard output
    /// without FILE (or with `-`): mode, topic, ok, failed, seconds, rate,
    /// p50_us…max_us, and with consumers consumed, received, consumed_rate,
    /// e2e_latency, consume_errors, ack_errors, duplicates, missing.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// (Extension) Write an HTML report to FILE: settings, figures, latency
    /// (p50, p99, max) and throughput second by second, and latency by
    /// percentile. Self-contained (inline SVG): it loads nothing. The file is
    /// created before the run, so a path that cannot be written is refused at
    /// once.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// (Extension) Count a request with no whole answer after this long as a
    /// transport error, and reconnect (default 30 s; whole seconds or a Go
    /// duration such as `5s` or `1m`), so a server that stops answering
    /// cannot hang a run.
    #[arg(long, value_name = "DURATION", value_parser = seconds_or_duration)]
    pub timeout: Option<std::time::Duration>,
}

/// A bench length: a bare whole number is seconds (the form these flags took
/// first), anything else a Go duration string, as the broker's configuration
/// and the consume route's `wait` take them.
fn seconds_or_duration(text: &str) -> Result<std::time::Duration, String> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse()
            .map(std::time::Duration::from_secs)
            .map_err(|e| format!("`{text}`: {e}"));
    }
    crate::config::parse_duration(text)
}

impl BenchArgs {
    /// The load generator's settings.
    pub fn config(&self, server: &str) -> narad_tools::bench::Config {
        use narad_tools::bench::{JsonTarget, Mode};
        narad_tools::bench::Config {
            server: server.to_string(),
            topic: self.topic.clone(),
            count: self.count,
            duration: self.duration,
            timeout: self.timeout,
            size_bytes: self.size,
            workers: self.workers,
            producers: self.producers,
            consumers: self.consumers,
            mode: self
                .mode
                .as_deref()
                .map(|m| Mode::parse(m).expect("clap admits only the modes")),
            consume: self.consume,
            consume_max: self.max,
            verify: self.verify,
            batch_records: self.batch,
            rate: self.rate,
            cpus: self.cpus.clone(),
            create: self.create,
            partitions: self.partitions,
            json: self.json.as_ref().map(|path| match path.to_str() {
                Some("-") => JsonTarget::Stdout,
                _ => JsonTarget::File(path.clone()),
            }),
            report: self.report.clone(),
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum InspectCommand {
    /// An ingress WAL directory (`<data>/ingress/shard-<i>`).
    Wal { dir: PathBuf },
    /// A partition log directory.
    Log { dir: PathBuf },
}

#[derive(Subcommand, Debug)]
pub enum DebugCommand {
    /// Append to a WAL under load, commit to a partition log, print acked ids.
    WalWriter(WalWriterArgs),
}

#[derive(Args, Debug)]
pub struct WalWriterArgs {
    /// Directory holding `wal/` and `log/`.
    #[arg(long)]
    pub dir: PathBuf,
    /// Concurrent appenders.
    #[arg(long, default_value_t = 64)]
    pub appenders: u64,
    /// Payload bytes per record.
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// First record id (ids must not repeat across runs on one directory).
    #[arg(long, default_value_t = 0)]
    pub id_base: u64,
    /// Stop after this long (the crash tests kill it sooner).
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Delay before each commit of partition 0: a slow owner, so commits of the
    /// other partitions overtake it and land out of order.
    #[arg(long, default_value_t = 0)]
    pub slow_commit_ms: u64,
    /// WAL segment size, small to exercise rolls and recycling.
    #[arg(long, default_value_t = 1 << 20)]
    pub segment_bytes: u64,
    /// Zeros the partition logs write ahead of their commits, in bytes per
    /// chunk; 0 writes none (the broker's `storage.log_prealloc` off).
    #[arg(long, default_value_t = 1 << 20)]
    pub log_prep_chunk_bytes: u64,
}

impl Cli {
    /// The configuration layers the command line sets for `narad serve`.
    pub fn serve_flags(&self, args: &ServeArgs) -> Flags {
        Flags {
            dev: args.dev,
            config: args.config.clone(),
            addr: args.addr.clone(),
            port: args.port,
            data_dir: args.data_dir.clone(),
            log_level: self.log_level.clone(),
            log_format: self.log_format,
        }
    }

    /// Logging for the subcommands other than `serve` (which takes it from its
    /// configuration): flag, else environment, else the default.
    pub fn tool_logging(&self) -> LogConfig {
        let defaults = crate::config::Config::default().log;
        let env_format = std::env::var("NARAD_LOG_FORMAT").ok();
        let env_format = match env_format.as_deref() {
            Some("text") => Some(LogFormat::Text),
            Some("json") => Some(LogFormat::Json),
            _ => None,
        };
        LogConfig {
            level: self
                .log_level
                .clone()
                .or_else(|| std::env::var("NARAD_LOG_LEVEL").ok())
                .unwrap_or(defaults.level),
            format: self.log_format.or(env_format).unwrap_or(defaults.format),
        }
    }
}

/// Sets up logging to stderr.
pub fn init_logging(log: &LogConfig) {
    let filter = tracing_subscriber::EnvFilter::try_new(&log.level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(|| LossyStderr);
    match log.format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Standard error that never fails. If whoever reads the logs goes away (a closed
/// pipe), log lines are dropped: the logger would otherwise report the failed write
/// on the same closed stream and panic, and a broker must not stop because nobody
/// reads its logs.
struct LossyStderr;

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::Cli;

    #[test]
    fn a_negative_number_is_refused_as_a_value_not_taken_for_a_flag() {
        for (args, says) in [
            (&["serve", "--shards", "-1"][..], "want a number of shards"),
            (&["serve", "--port", "-1"], "not in 0..=65535"),
            (&["bench", "--workers", "-3"], "invalid digit"),
            (&["bench", "--batch", "-3"], "invalid digit"),
        ] {
            let argv = std::iter::once("narad").chain(args.iter().copied());
            let error = Cli::try_parse_from(argv).unwrap_err().to_string();
            assert!(
                error.contains(&format!("invalid value '{}'", args[2])) && error.contains(says),
                "{args:?}: {error}"
            );
        }
    }
}
