//! The keys a configuration file or the environment may set: how each value is
//! parsed and where it lands in [`Config`], and the reference's keys this version
//! refuses (internal tuning, features not implemented yet) with their
//! environment variables.

use serde_json::Value;

use super::*;

/// A value from one layer: JSON from the file, text from the environment.
#[derive(Clone, Copy)]
pub(super) enum Raw<'a> {
    Json(&'a Value),
    Text(&'a str),
}

impl Raw<'_> {
    fn string(self) -> Result<String, String> {
        match self {
            Raw::Json(Value::String(s)) => Ok(s.clone()),
            Raw::Text(s) => Ok(s.to_string()),
            Raw::Json(other) => Err(format!("expected a string, got {other}")),
        }
    }

    fn duration(self) -> Result<Duration, String> {
        match self {
            Raw::Json(Value::String(s)) => parse_duration(s),
            Raw::Text(s) => parse_duration(s),
            Raw::Json(other) => Err(format!(
                "expected a duration string such as \"10s\", got {other}"
            )),
        }
    }

    fn u64(self) -> Result<u64, String> {
        match self {
            Raw::Json(Value::Number(n)) => n
                .as_u64()
                .ok_or_else(|| format!("expected a non-negative integer, got {n}")),
            Raw::Text(s) => s
                .trim()
                .parse()
                .map_err(|_| format!("expected a non-negative integer, got `{s}`")),
            Raw::Json(other) => Err(format!("expected a non-negative integer, got {other}")),
        }
    }

    fn u32(self) -> Result<u32, String> {
        let value = self.u64()?;
        u32::try_from(value).map_err(|_| format!("{value} is too large"))
    }

    fn usize(self) -> Result<usize, String> {
        let value = self.u64()?;
        usize::try_from(value).map_err(|_| format!("{value} is too large"))
    }

    fn bool(self) -> Result<bool, String> {
        match self {
            Raw::Json(Value::Bool(b)) => Ok(*b),
            // The spellings Go's strconv.ParseBool accepts, as the reference does.
            Raw::Text("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Raw::Text("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Raw::Text(s) => Err(format!("expected true or false, got `{s}`")),
            Raw::Json(other) => Err(format!("expected true or false, got {other}")),
        }
    }

    fn path(self) -> Result<PathBuf, String> {
        self.string().map(PathBuf::from)
    }

    fn codec(self) -> Result<Codec, String> {
        match self.string()?.as_str() {
            "none" => Ok(Codec::None),
            "zstd" => Ok(Codec::Zstd),
            other => Err(format!("expected none or zstd, got `{other}`")),
        }
    }

    fn compression_level(self) -> Result<CompressionLevel, String> {
        match self.string()?.as_str() {
            "fastest" => Ok(CompressionLevel::Fastest),
            "default" => Ok(CompressionLevel::Default),
            "better" => Ok(CompressionLevel::Better),
            "best" => Ok(CompressionLevel::Best),
            other => Err(format!(
                "expected fastest, default, better or best, got `{other}`"
            )),
        }
    }

    fn log_format(self) -> Result<LogFormat, String> {
        match self.string()?.as_str() {
            "json" => Ok(LogFormat::Json),
            "text" => Ok(LogFormat::Text),
            other => Err(format!("expected json or text, got `{other}`")),
        }
    }
}

type Setter = fn(&mut Config, Raw<'_>) -> Result<(), String>;

/// One operator-facing key: its file name, its environment variable, if any, and
/// how a value lands in [`Config`].
pub(super) struct Key {
    pub(super) name: &'static str,
    pub(super) env: Option<&'static str>,
    pub(super) set: Setter,
}

/// `key!(name, env, field.path = parser)`: a [`Key`] whose setter parses the raw
/// value with `Raw::parser` and stores it in `Config::field.path`.
macro_rules! key {
    ($name:literal, $env:expr, $($field:ident).+ = $parse:ident) => {
        Key {
            name: $name,
            env: $env,
            set: |config, raw| {
                config.$($field).+ = raw.$parse()?;
                Ok(())
            },
        }
    };
}

/// Every key a file or the environment may set.
pub(super) static KEYS: &[Key] = &[
    key!("http.addr", Some("NARAD_HTTP_ADDR"), http.addr = string),
    key!(
        "http.read_timeout",
        Some("NARAD_HTTP_READ_TIMEOUT"),
        http.read_timeout = duration
    ),
    key!(
        "http.write_timeout",
        Some("NARAD_HTTP_WRITE_TIMEOUT"),
        http.write_timeout = duration
    ),
    key!(
        "http.idle_timeout",
        Some("NARAD_HTTP_IDLE_TIMEOUT"),
        http.idle_timeout = duration
    ),
    key!(
        "http.shutdown_grace",
        Some("NARAD_HTTP_SHUTDOWN_GRACE"),
        http.shutdown_grace = duration
    ),
    key!(
        "http.max_consume_wait",
        Some("NARAD_HTTP_MAX_CONSUME_WAIT"),
        http.max_consume_wait = duration
    ),
    key!(
        "http.max_header_bytes",
        Some("NARAD_HTTP_MAX_HEADER_BYTES"),
        http.max_header_bytes = usize
    ),
    key!(
        "http.max_connections",
        Some("NARAD_HTTP_MAX_CONNECTIONS"),
        http.max_connections = usize
    ),
    key!(
        "http.max_consume_in_flight_per_identity",
        Some("NARAD_HTTP_MAX_CONSUME_IN_FLIGHT_PER_IDENTITY"),
        http.max_consume_in_flight_per_identity = u64
    ),
    key!(
        "http.max_produce_in_flight_per_identity",
        Some("NARAD_HTTP_MAX_PRODUCE_IN_FLIGHT_PER_IDENTITY"),
        http.max_produce_in_flight_per_identity = u64
    ),
    key!(
        "http.max_batch_body_bytes_in_flight",
        Some("NARAD_HTTP_MAX_BATCH_BODY_BYTES_IN_FLIGHT"),
        http.max_batch_body_bytes_in_flight = u64
    ),
    key!(
        "storage.data_dir",
        Some("NARAD_DATA_DIR"),
        storage.data_dir = path
    ),
    // File-only, as in the reference.
    key!(
        "storage.ingress_wal_prealloc",
        None,
        storage.ingress_wal_prealloc = bool
    ),
    key!("storage.log_prealloc", None, storage.log_prealloc = bool),
    key!(
        "storage.consumer_offset_commit_interval_ms",
        None,
        storage.consumer_offset_commit_interval_ms = u64
    ),
    key!(
        "storage.idle_log_eviction_ms",
        None,
        storage.idle_log_eviction_ms = u64
    ),
    key!(
        "storage.read_cache_bytes",
        None,
        storage.read_cache_bytes = u64
    ),
    key!(
        "storage.cold_retention_walk_ms",
        None,
        storage.cold_retention_walk_ms = u64
    ),
    key!("storage.codec", None, storage.codec = codec),
    key!(
        "storage.compression_level",
        None,
        storage.compression_level = compression_level
    ),
    key!(
        "topic.default_partitions",
        Some("NARAD_TOPIC_DEFAULT_PARTITIONS"),
        topic.default_partitions = u32
    ),
    key!(
        "topic.max_partitions",
        Some("NARAD_TOPIC_MAX_PARTITIONS"),
        topic.max_partitions = u32
    ),
    key!(
        "topic.default_retention_age_ms",
        Some("NARAD_TOPIC_DEFAULT_RETENTION_AGE_MS"),
        topic.default_retention_age_ms = u64
    ),
    key!(
        "topic.default_visibility_timeout_ms",
        Some("NARAD_TOPIC_DEFAULT_VISIBILITY_TIMEOUT_MS"),
        topic.default_visibility_timeout_ms = u64
    ),
    key!(
        "topic.default_max_in_flight_per_partition",
        Some("NARAD_TOPIC_DEFAULT_MAX_IN_FLIGHT_PER_PARTITION"),
        topic.default_max_in_flight_per_partition = u32
    ),
    key!(
        "topic.default_max_acked_ahead_per_partition",
        Some("NARAD_TOPIC_DEFAULT_MAX_ACKED_AHEAD_PER_PARTITION"),
        topic.default_max_acked_ahead_per_partition = u32
    ),
    key!("log.level", Some("NARAD_LOG_LEVEL"), log.level = string),
    key!(
        "log.format",
        Some("NARAD_LOG_FORMAT"),
        log.format = log_format
    ),
    key!(
        "security.enabled",
        Some("NARAD_SECURITY_ENABLED"),
        security.enabled = bool
    ),
];

/// Storage tuning the reference keeps internal: a file that sets one is refused.
const INTERNAL_KEYS: &[&str] = &[
    "storage.fsync",
    "storage.flush_bytes",
    "storage.flush_records",
    "storage.flush_interval_ms",
    "storage.sync_interval_ms",
    "storage.sync_bytes",
    "storage.ingress_wal_sync_interval_ms",
    "storage.segment_bytes",
    "storage.retention_check_interval_ms",
];

/// Reference keys (or whole sections, ending in `.`) that this version does not
/// implement yet.
const UNSUPPORTED_KEYS: &[&str] = &[
    "cluster.",
    "fanout.",
    "http.metrics_addr",
    "http.metrics_unauthenticated",
    "http.pprof_addr",
    "security.cluster_tls_cert_file",
    "security.cluster_tls_key_file",
    "security.cluster_tls_ca_file",
    "security.allow_plaintext_raft",
    "security.allow_insecure_cluster",
    "security.allow_legacy_cluster_auth",
];

/// The reference's environment variables for what [`UNSUPPORTED_KEYS`] names:
/// set, they refuse the start, as those keys in a file do, rather than leave an
/// operator believing a node joined a cluster it never heard of.
pub(super) const UNSUPPORTED_ENV: &[&str] = &[
    "NARAD_NODE_ID",
    "NARAD_CLUSTER_ADDR",
    "NARAD_CLUSTER_PEERS",
    "NARAD_CLUSTER_ADVERTISE_ADDR",
    "NARAD_CLUSTER_INITIAL_MEMBERS",
    "NARAD_CLUSTER_SECRET",
    "NARAD_CLUSTER_TLS_CERT_FILE",
    "NARAD_CLUSTER_TLS_KEY_FILE",
    "NARAD_CLUSTER_TLS_CA_FILE",
    "NARAD_FANOUT_MAX_BATCH_RECORDS",
    "NARAD_FANOUT_MAX_BATCH_BYTES",
    "NARAD_FANOUT_LINGER_MS",
    "NARAD_HTTP_METRICS_ADDR",
    "NARAD_HTTP_METRICS_UNAUTHENTICATED",
    "NARAD_HTTP_PPROF_ADDR",
];

pub(super) fn known_key(name: &str) -> Result<&'static Key, String> {
    if let Some(key) = KEYS.iter().find(|k| k.name == name) {
        return Ok(key);
    }
    if INTERNAL_KEYS.contains(&name) {
        return Err(format!("`{name}` is internal and cannot be set"));
    }
    if UNSUPPORTED_KEYS
        .iter()
        .any(|k| name == *k || (k.ends_with('.') && name.starts_with(k)))
    {
        return Err(format!("`{name}` is not supported by this version"));
    }
    Err(format!("unknown key `{name}`"))
}

/// Whether `section` is the name of a section that holds keys.
pub(super) fn is_section(section: &str) -> bool {
    let prefix = format!("{section}.");
    KEYS.iter().any(|k| k.name.starts_with(&prefix))
        || INTERNAL_KEYS.iter().any(|k| k.starts_with(&prefix))
        || UNSUPPORTED_KEYS.iter().any(|k| k.starts_with(&prefix))
}
