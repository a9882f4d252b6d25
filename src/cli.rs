//! The command line. Flag names follow the reference broker's where one exists.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// A queue-first durable message broker.
#[derive(Parser, Debug)]
#[command(name = "narad", version, about)]
pub struct Cli {
    /// Log level: error, warn, info, debug or trace.
    #[arg(long, global = true, env = "NARAD_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Log format.
    #[arg(long, global = true, env = "NARAD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
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

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Development mode: security off, a local data directory, no further setup.
    #[arg(long)]
    pub dev: bool,
    /// Data directory (default `./data`).
    #[arg(long, env = "NARAD_DATA_DIR")]
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

/// Sets up logging to stderr from the global flags.
pub fn init_logging(cli: &Cli) {
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
