//! The node's configuration: typed settings, loaded in layers.
//!
//! Precedence, lowest first: built-in defaults, the `--dev` profile, the JSON file
//! named by `--config`, `NARAD_*` environment variables, command-line flags. Key
//! names, environment names and defaults follow the reference broker, so an
//! operator's file and environment carry over.
//!
//! A file is refused, naming the key, when it holds a key this version does not
//! know, a key the reference keeps internal (tuning that is not the operator's to
//! change), or a reference key this version does not implement yet: a setting that
//! is silently ignored is worse than a node that does not start. Durations are Go
//! duration strings (`10s`, `500ms`, `1m30s`).
//!
//! Which cores: the main thread loads and validates the configuration once, before
//! any shard starts; each shard receives the plain values it needs. Nothing here is
//! read or changed after startup.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

mod duration;
mod keys;
pub use duration::parse_duration;
use keys::{is_section, known_key, Raw, KEYS, UNSUPPORTED_ENV};

/// The reference's `http.addr` default: every interface, port 7942.
pub const HTTP_ADDR_DEFAULT: &str = ":7942";
/// `--dev` listens on loopback only: a development node is not reachable from the
/// network, since it runs with security off.
pub const HTTP_ADDR_DEV: &str = "127.0.0.1:7942";
/// The bounds on `http.max_header_bytes`.
pub const MAX_HEADER_BYTES_MIN: usize = 4 << 10;
pub const MAX_HEADER_BYTES_MAX: usize = 16 << 20;
/// The bound on `http.max_connections`.
pub const MAX_CONNECTIONS_MAX: usize = 1 << 20;
/// A configuration file larger than this is refused unread.
pub const FILE_BYTES_MAX: u64 = 1 << 20;
/// The shortest non-zero topic retention the reference accepts (one hour).
pub const RETENTION_MS_MIN: u64 = 3_600_000;
/// `storage.read_cache_bytes` by default: 64 MiB per shard, about half a second
/// of one shard's produce rate at 1 KiB messages.
pub const READ_CACHE_BYTES_DEFAULT: u64 = 64 << 20;
/// The largest `storage.read_cache_bytes` accepted: 64 GiB per shard.
pub const READ_CACHE_BYTES_MAX: u64 = 64 << 30;

/// Everything `narad serve` is configured with.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub http: HttpConfig,
    pub storage: StorageConfig,
    pub topic: TopicDefaults,
    pub log: LogConfig,
    pub security: SecurityConfig,
}

/// `http.*`: the API listener.
#[derive(Clone, Debug, PartialEq)]
pub struct HttpConfig {
    /// `host:port`, or `:port` for every interface.
    pub addr: String,
    /// Longest wait for a request's headers, and for the next request on an idle
    /// keep-alive connection.
    pub read_timeout: Duration,
    /// Longest a response write may make no progress.
    pub write_timeout: Duration,
    /// How long a keep-alive connection may wait for its next request.
    pub idle_timeout: Duration,
    /// How long a stopping node lets in-flight requests finish.
    pub shutdown_grace: Duration,
    /// The longest long-poll a consume may ask for.
    pub max_consume_wait: Duration,
    /// Request line and headers larger than this are answered 431.
    pub max_header_bytes: usize,
    /// Open connections per node; more are answered 503.
    pub max_connections: usize,
    pub max_consume_in_flight_per_identity: u64,
    /// 0 = no cap.
    pub max_produce_in_flight_per_identity: u64,
    pub max_batch_body_bytes_in_flight: u64,
}

/// `storage.codec`: how partition log frames are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    None,
    Zstd,
}

/// `storage.compression_level`, in the reference's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompressionLevel {
    Fastest,
    Default,
    Better,
    Best,
}

impl StorageConfig {
    /// The zstd level partition logs compress frames with; `None`: uncompressed.
    /// The named efforts map onto zstd's levels as fastest 1, default 3, better 7,
    /// best 11 (higher levels cost far more CPU per byte for little more gain on
    /// message payloads).
    pub fn zstd_level(&self) -> Option<i32> {
        match self.codec {
            Codec::None => None,
            Codec::Zstd => Some(match self.compression_level {
                CompressionLevel::Fastest => 1,
                CompressionLevel::Default => 3,
                CompressionLevel::Better => 7,
                CompressionLevel::Best => 11,
            }),
        }
    }
}

/// `storage.*`.
#[derive(Clone, Debug, PartialEq)]
pub struct StorageConfig {
    pub data_dir: PathBuf,
    /// Prepare (recycle or zero-fill) the next ingress WAL segment off the append
    /// path.
    pub ingress_wal_prealloc: bool,
    /// Grow each partition's active log segment by writing zeros ahead of its
    /// commits, so only about one commit per chunk carries a size change in its
    /// fdatasync; off, commits extend the file and each fdatasync commits the
    /// new size through the file system journal, and the log's bytes are
    /// written once instead of about twice.
    pub log_prealloc: bool,
    /// Durability interval of consumer acks: each partition acked since is
    /// fdatasynced once per interval (10 to 60000).
    pub consumer_offset_commit_interval_ms: u64,
    /// A partition log no commit or read used for this long is closed.
    pub idle_log_eviction_ms: u64,
    /// Bytes of recent frames each shard may cache past the 1 MiB every open
    /// partition log keeps of its own, so consumers a little behind the head
    /// read from memory, not the disk.
    pub read_cache_bytes: u64,
    /// Between two walks that apply retention to the partitions whose log is not
    /// open.
    pub cold_retention_walk_ms: u64,
    /// How partition log frames are stored: `none` or `zstd`. Applies to frames
    /// written from then on; every reader takes both.
    pub codec: Codec,
    /// The zstd effort when `codec` is `zstd`.
    pub compression_level: CompressionLevel,
}

/// `topic.*`: defaults for topics created without these fields.
#[derive(Clone, Debug, PartialEq)]
pub struct TopicDefaults {
    pub default_partitions: u32,
    pub max_partitions: u32,
    pub default_retention_age_ms: u64,
    pub default_visibility_timeout_ms: u64,
    pub default_max_in_flight_per_partition: u32,
    pub default_max_acked_ahead_per_partition: u32,
}

/// `log.*`.
#[derive(Clone, Debug, PartialEq)]
pub struct LogConfig {
    /// A level (`error` … `trace`) or a `tracing` filter directive.
    pub level: String,
    pub format: LogFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `security.*`.
#[derive(Clone, Debug, PartialEq)]
pub struct SecurityConfig {
    pub enabled: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            http: HttpConfig {
                addr: HTTP_ADDR_DEFAULT.to_string(),
                read_timeout: Duration::from_secs(10),
                write_timeout: Duration::from_secs(30),
                idle_timeout: Duration::from_secs(60),
                shutdown_grace: Duration::from_secs(10),
                max_consume_wait: Duration::from_secs(10),
                max_header_bytes: 64 << 10,
                max_connections: 4096,
                max_consume_in_flight_per_identity: 1024,
                max_produce_in_flight_per_identity: 0,
                max_batch_body_bytes_in_flight: 256 << 20,
            },
            storage: StorageConfig {
                data_dir: PathBuf::from("data"),
                // On, unlike the reference: recycled, pre-zeroed segments make
                // group commits about twice as fast on ext4 and XFS.
                ingress_wal_prealloc: true,
                log_prealloc: true,
                consumer_offset_commit_interval_ms: 1000,
                idle_log_eviction_ms: 1_800_000,
                read_cache_bytes: READ_CACHE_BYTES_DEFAULT,
                cold_retention_walk_ms: 300_000,
                codec: Codec::None,
                compression_level: CompressionLevel::Fastest,
            },
            topic: TopicDefaults {
                default_partitions: 3,
                max_partitions: 108,
                default_retention_age_ms: 604_800_000,
                default_visibility_timeout_ms: 30_000,
                default_max_in_flight_per_partition: 1024,
                default_max_acked_ahead_per_partition: 1024,
            },
            log: LogConfig {
                level: "info".to_string(),
                format: LogFormat::Json,
            },
            security: SecurityConfig { enabled: true },
        }
    }
}

/// What the command line contributes: the highest layer.
#[derive(Clone, Debug, Default)]
pub struct Flags {
    pub dev: bool,
    pub config: Option<PathBuf>,
    pub addr: Option<String>,
    pub port: Option<u16>,
    pub data_dir: Option<PathBuf>,
    pub log_level: Option<String>,
    pub log_format: Option<LogFormat>,
}

impl Config {
    /// Builds the configuration from every layer and validates it. `env` reads one
    /// environment variable (tests pass a map).
    pub fn load(flags: &Flags, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, String> {
        let mut config = Config::default();
        if flags.dev {
            config.http.addr = HTTP_ADDR_DEV.to_string();
        }
        if let Some(path) = &flags.config {
            config.apply_file(path)?;
        }
        config.apply_env(env)?;
        config.apply_flags(flags);
        config.validate()?;
        if flags.dev {
            check_dev_loopback(&config.http.addr)?;
        }
        Ok(config)
    }

    /// The `NARAD_*` names among `names` that configure nothing: not a key's
    /// variable, not one this version refuses, not one of the command line's
    /// (`NARAD_SHARDS`, and the client's `NARAD_ADDR`, `NARAD_USER`,
    /// `NARAD_PASS`), not a debug build's `NARAD_DEBUG_*` test hook. A misspelt
    /// variable is otherwise ignored without a word.
    pub fn unknown_env(names: impl IntoIterator<Item = String>) -> Vec<String> {
        // NARAD_ADMIN_PASSWORD is the reference's, read once authentication
        // exists; with security off it has nothing to protect.
        const COMMAND_LINE_ENV: [&str; 5] = [
            "NARAD_SHARDS",
            "NARAD_ADDR",
            "NARAD_USER",
            "NARAD_PASS",
            "NARAD_ADMIN_PASSWORD",
        ];
        let mut unknown: Vec<String> = names
            .into_iter()
            .filter(|name| name.starts_with("NARAD_"))
            .filter(|name| {
                // The test hooks a debug build reads (a release build reads
                // none, and says so).
                let debug_hook = cfg!(debug_assertions) && name.starts_with("NARAD_DEBUG_");
                let known = KEYS.iter().any(|key| key.env == Some(name.as_str()))
                    || UNSUPPORTED_ENV.contains(&name.as_str())
                    || COMMAND_LINE_ENV.contains(&name.as_str());
                !known && !debug_hook
            })
            .collect();
        unknown.sort();
        unknown
    }

    /// The file-only key a `NARAD_*` name would spell (`NARAD_STORAGE_CODEC`
    /// for `storage.codec`), so that its warning can say where the key is set.
    pub fn file_only_key(env_name: &str) -> Option<&'static str> {
        KEYS.iter()
            .filter(|key| key.env.is_none())
            .map(|key| key.name)
            .find(|name| format!("NARAD_{}", name.replace('.', "_")).eq_ignore_ascii_case(env_name))
    }

    fn apply_file(&mut self, path: &Path) -> Result<(), String> {
        let context = |e: String| format!("config file {}: {e}", path.display());
        let bytes = read_file_bounded(path).map_err(context)?;
        let value: Value =
            serde_json::from_slice(&bytes).map_err(|e| context(format!("invalid JSON: {e}")))?;
        // A key set twice is ambiguous: refused, as the API refuses it.
        crate::json::refuse_duplicate_keys(&bytes).map_err(context)?;
        self.apply_json(&value).map_err(context)
    }

    /// Applies a parsed configuration file: an object of sections, each an object of
    /// keys.
    pub fn apply_json(&mut self, value: &Value) -> Result<(), String> {
        let Value::Object(sections) = value else {
            return Err("the top level must be a JSON object of sections".to_string());
        };
        for (section, keys) in sections {
            let Value::Object(keys) = keys else {
                return Err(if is_section(section) {
                    format!("`{section}` must be an object of keys")
                } else if let Some((outer, inner)) = section
                    .split_once('.')
                    .filter(|_| known_key(section).is_ok())
                {
                    format!(
                        "unknown key `{section}`: keys are nested by section, write {{\"{outer}\": {{\"{inner}\": …}}}}"
                    )
                } else {
                    format!("unknown key `{section}`")
                });
            };
            // An empty object configures nothing, but a misspelt or foreign
            // section name is as wrong empty as it is full.
            if keys.is_empty() && !is_section(section) {
                return Err(format!("unknown key `{section}`"));
            }
            for (key, value) in keys {
                let name = format!("{section}.{key}");
                let key = known_key(&name)?;
                (key.set)(self, Raw::Json(value)).map_err(|e| format!("`{name}`: {e}"))?;
            }
        }
        Ok(())
    }

    fn apply_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
        if let Some(var) = UNSUPPORTED_ENV.iter().find(|var| env(var).is_some()) {
            return Err(format!(
                "{var} is set, but this version does not support what it configures (a cluster, fan-out, or a separate metrics or profiling listener); unset it"
            ));
        }
        for key in KEYS {
            let Some(var) = key.env else { continue };
            if let Some(text) = env(var) {
                // Empty is neither "unset" nor a value: which one was meant is
                // a guess, and a wrong one would start a broker the operator
                // did not configure.
                if text.trim().is_empty() {
                    return Err(format!(
                        "{var} is set but empty: give it a value or unset it"
                    ));
                }
                (key.set)(self, Raw::Text(&text)).map_err(|e| format!("{var}: {e}"))?;
            }
        }
        Ok(())
    }

    fn apply_flags(&mut self, flags: &Flags) {
        if let Some(addr) = &flags.addr {
            self.http.addr = addr.clone();
        }
        if let Some(port) = flags.port {
            self.http.addr = with_port(&self.http.addr, port);
        }
        if let Some(dir) = &flags.data_dir {
            self.storage.data_dir = dir.clone();
        }
        if let Some(level) = &flags.log_level {
            self.log.level = level.clone();
        }
        if let Some(format) = flags.log_format {
            self.log.format = format;
        }
        // `--dev` exists to run without authentication; it wins over any layer.
        if flags.dev {
            self.security.enabled = false;
        }
    }

    /// Checks the values against each other and against their bounds.
    pub fn validate(&self) -> Result<(), String> {
        let http = &self.http;
        resolve_listen_addr(&http.addr).map_err(|e| format!("http.addr: {e}"))?;
        for (name, value) in [
            ("http.read_timeout", http.read_timeout),
            ("http.write_timeout", http.write_timeout),
            ("http.idle_timeout", http.idle_timeout),
            ("http.shutdown_grace", http.shutdown_grace),
        ] {
            if value.is_zero() {
                return Err(format!("{name} must be greater than 0"));
            }
        }
        // A long-poll must be able to answer before the write deadline cuts it, and a
        // stopping node must be able to wait out every long-poll it holds.
        if http.write_timeout <= http.max_consume_wait {
            return Err(format!(
                "http.write_timeout ({:?}) must be greater than http.max_consume_wait ({:?})",
                http.write_timeout, http.max_consume_wait
            ));
        }
        if http.max_consume_wait > http.shutdown_grace {
            return Err(format!(
                "http.max_consume_wait ({:?}) must not exceed http.shutdown_grace ({:?})",
                http.max_consume_wait, http.shutdown_grace
            ));
        }
        check_range(
            "http.max_header_bytes",
            http.max_header_bytes as u64,
            MAX_HEADER_BYTES_MIN as u64,
            MAX_HEADER_BYTES_MAX as u64,
        )?;
        check_range(
            "http.max_connections",
            http.max_connections as u64,
            1,
            MAX_CONNECTIONS_MAX as u64,
        )?;
        check_range(
            "http.max_consume_in_flight_per_identity",
            http.max_consume_in_flight_per_identity,
            1,
            u64::MAX,
        )?;
        check_range(
            "http.max_batch_body_bytes_in_flight",
            http.max_batch_body_bytes_in_flight,
            1,
            u64::MAX,
        )?;
        self.validate_topic()?;
        check_range(
            "storage.consumer_offset_commit_interval_ms",
            self.storage.consumer_offset_commit_interval_ms,
            10,
            60_000,
        )?;
        check_range(
            "storage.read_cache_bytes",
            self.storage.read_cache_bytes,
            0,
            READ_CACHE_BYTES_MAX,
        )?;
        if self.storage.data_dir.as_os_str().is_empty() {
            return Err("storage.data_dir must not be empty".to_string());
        }
        for (name, value) in [
            (
                "storage.idle_log_eviction_ms",
                self.storage.idle_log_eviction_ms,
            ),
            (
                "storage.cold_retention_walk_ms",
                self.storage.cold_retention_walk_ms,
            ),
        ] {
            check_range(name, value, 1, u64::MAX)?;
        }
        // No directive at all would be a filter that lets nothing through.
        if self.log.level.split(',').all(|d| d.trim().is_empty()) {
            return Err(
                "log.level is empty: name a level (error, warn, info, debug, trace or off)"
                    .to_string(),
            );
        }
        tracing_subscriber::EnvFilter::try_new(&self.log.level)
            .map_err(|e| format!("log.level `{}`: {e}", self.log.level))?;
        // A bare word that is no level parses as a target at trace, which would
        // silence every line, errors included: a typo must not do that.
        for directive in self.log.level.split(',').map(str::trim) {
            if !directive.is_empty()
                && !directive.contains('=')
                && directive
                    .parse::<tracing_subscriber::filter::LevelFilter>()
                    .is_err()
            {
                return Err(format!(
                    "log.level `{}`: `{directive}` is not a level (error, warn, info, debug, trace or off; `target=level` for one target)",
                    self.log.level
                ));
            }
        }
        Ok(())
    }

    fn validate_topic(&self) -> Result<(), String> {
        let topic = &self.topic;
        // Below the API's smallest partition count, no create could name one.
        let min = crate::meta::PARTITIONS_MIN.into();
        check_range(
            "topic.max_partitions",
            topic.max_partitions.into(),
            min,
            100_000,
        )?;
        check_range(
            "topic.default_partitions",
            topic.default_partitions.into(),
            min,
            topic.max_partitions.into(),
        )?;
        // The API takes both durations up to 2^63-1 ms (clients read them as
        // signed 64-bit numbers): a default past that would be a value a topic
        // could never be given back.
        let ms_max = i64::MAX as u64;
        let retention = topic.default_retention_age_ms;
        if retention != 0 && !(RETENTION_MS_MIN..=ms_max).contains(&retention) {
            return Err(format!(
                "topic.default_retention_age_ms must be 0 (forever) or between {RETENTION_MS_MIN} and {ms_max}, got {retention}"
            ));
        }
        check_range(
            "topic.default_visibility_timeout_ms",
            topic.default_visibility_timeout_ms,
            1,
            ms_max,
        )?;
        for (name, value) in [
            (
                "topic.default_max_in_flight_per_partition",
                topic.default_max_in_flight_per_partition.into(),
            ),
            (
                "topic.default_max_acked_ahead_per_partition",
                topic.default_max_acked_ahead_per_partition.into(),
            ),
        ] {
            check_range(name, value, 1, u64::MAX)?;
        }
        Ok(())
    }

    /// The socket address `http.addr` names (`:port` means every interface,
    /// IPv6 and IPv4: `[::]:port`, dual-stack where the host has IPv6).
    pub fn listen_addr(&self) -> Result<std::net::SocketAddr, String> {
        resolve_listen_addr(&self.http.addr).map_err(|e| format!("http.addr: {e}"))
    }
}

/// `addr` with its port replaced by `port`: the host of `host:port`, `:port`,
/// `[v6]:port`, a bare host, `[v6]` or a bare IPv6 address is kept (a bare host
/// must not turn into `:port`, which listens on every interface).
fn with_port(addr: &str, port: u16) -> String {
    if addr.starts_with('[') && addr.ends_with(']') {
        return format!("{addr}:{port}");
    }
    let host = match addr.rsplit_once(':') {
        None => addr.to_string(),
        Some((host, _)) if !host.contains(':') || host.ends_with(']') => host.to_string(),
        // More than one colon and no brackets: a bare IPv6 address.
        Some(_) => format!("[{addr}]"),
    };
    format!("{host}:{port}")
}

/// Resolves `host:port` or `:port`.
pub fn resolve_listen_addr(addr: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let full = match addr.strip_prefix(':') {
        Some(port) => format!("[::]:{port}"),
        None => addr.to_string(),
    };
    full.to_socket_addrs()
        .map_err(|e| format!("`{addr}` is not a listen address (host:port or :port): {e}"))?
        .next()
        .ok_or_else(|| format!("`{addr}` resolves to no address"))
}

/// `--dev` serves without authentication, so only on a loopback address, whatever
/// a file, the environment or `--addr` asked for.
fn check_dev_loopback(addr: &str) -> Result<(), String> {
    let resolved = resolve_listen_addr(addr).map_err(|e| format!("http.addr: {e}"))?;
    if resolved.ip().is_loopback() {
        return Ok(());
    }
    Err(format!(
        "--dev serves without authentication, so it listens on loopback only, and http.addr `{addr}` is not a loopback address; to serve other hosts without authentication, leave out --dev and set NARAD_SECURITY_ENABLED=false"
    ))
}

fn check_range(name: &str, value: u64, min: u64, max: u64) -> Result<(), String> {
    if value < min || value > max {
        return Err(if max == u64::MAX {
            format!("{name} must be at least {min}, got {value}")
        } else {
            format!("{name} must be between {min} and {max}, got {value}")
        });
    }
    Ok(())
}

fn read_file_bounded(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let mut bytes = Vec::new();
    file.take(FILE_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > FILE_BYTES_MAX {
        return Err(format!("larger than {FILE_BYTES_MAX} bytes"));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests;
