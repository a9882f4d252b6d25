//! The command line. Flag names follow the reference broker's where one exists.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

pub use crate::config::LogFormat;
use crate::config::{Flags, LogConfig};

/// A queue-first durable message broker.
#[derive(Parser, Debug)]
#[command(name = "narad", version, about)]
pub struct Cli {
    /// Log level: error, warn, info, debug or trace (`log.level`, NARAD_LOG_LEVEL;
    /// default info).
    #[arg(long, global = true)]
    pub log_level: Option<String>,
    /// Log format (`log.format`, NARAD_LOG_FORMAT; default json).
    #[arg(long, global = true, value_enum)]
    pub log_format: Option<LogFormat>,
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
    #[arg(long)]
    pub port: Option<u16>,
    /// Data directory (`storage.data_dir`; default `./data`).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Shards (one pinned executor each); default: every CPU this process may use.
    #[arg(long, env = "NARAD_SHARDS")]
    pub shards: Option<usize>,
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
