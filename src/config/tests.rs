//! Tests of the configuration loader: precedence, refusals, durations, validation.

use super::*;
use std::collections::HashMap;

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

fn no_env(_: &str) -> Option<String> {
    None
}

fn file(json: &str) -> (tempfile::NamedTempFile, Flags) {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut file, json.as_bytes()).unwrap();
    let flags = Flags {
        config: Some(file.path().to_path_buf()),
        ..Flags::default()
    };
    (file, flags)
}

#[test]
fn defaults_follow_the_reference() {
    let config = Config::load(&Flags::default(), &no_env).unwrap();
    assert_eq!(config, Config::default());
    assert_eq!(config.http.addr, ":7942");
    assert_eq!(config.http.max_header_bytes, 65536);
    assert_eq!(config.http.max_connections, 4096);
    assert_eq!(config.storage.data_dir, PathBuf::from("data"));
    assert!(config.storage.ingress_wal_prealloc);
    assert!(config.security.enabled);
    assert_eq!(config.log.format, LogFormat::Json);
    assert_eq!(config.listen_addr().unwrap(), "[::]:7942".parse().unwrap());
}

#[test]
fn each_layer_overrides_the_one_below() {
    let (_file, mut flags) = file(
        r#"{"http": {"addr": "127.0.0.1:1000", "read_timeout": "3s", "max_connections": 7},
            "log": {"level": "debug"}}"#,
    );
    let env = env_of(&[
        ("NARAD_HTTP_ADDR", "127.0.0.1:2000"),
        ("NARAD_HTTP_MAX_CONNECTIONS", "8"),
    ]);
    let config = Config::load(&flags, &env).unwrap();
    // File over default.
    assert_eq!(config.http.read_timeout, Duration::from_secs(3));
    assert_eq!(config.log.level, "debug");
    // Environment over file.
    assert_eq!(config.http.addr, "127.0.0.1:2000");
    assert_eq!(config.http.max_connections, 8);
    // Flags over environment; `--port` keeps the host.
    flags.port = Some(3000);
    flags.log_level = Some("warn".to_string());
    let config = Config::load(&flags, &env).unwrap();
    assert_eq!(config.http.addr, "127.0.0.1:3000");
    assert_eq!(config.log.level, "warn");
    // A host without a port keeps its host: never `:port` (every interface).
    for (addr, want) in [
        ("10.0.0.5", "10.0.0.5:3000"),
        (":7942", ":3000"),
        ("[::1]:7942", "[::1]:3000"),
        ("::1", "[::1]:3000"),
        ("[::1]", "[::1]:3000"),
        ("localhost", "localhost:3000"),
    ] {
        let env = env_of(&[("NARAD_HTTP_ADDR", addr)]);
        assert_eq!(
            Config::load(&flags, &env).unwrap().http.addr,
            want,
            "{addr}"
        );
    }
    flags.addr = Some("127.0.0.2:4000".to_string());
    flags.port = None;
    assert_eq!(
        Config::load(&flags, &env).unwrap().http.addr,
        "127.0.0.2:4000"
    );
}

#[test]
fn dev_turns_security_off_and_listens_on_loopback() {
    let flags = Flags {
        dev: true,
        port: Some(0),
        ..Flags::default()
    };
    let env = env_of(&[("NARAD_SECURITY_ENABLED", "true")]);
    let config = Config::load(&flags, &env).unwrap();
    assert!(!config.security.enabled);
    assert_eq!(config.http.addr, "127.0.0.1:0");
    assert_eq!(config.storage.data_dir, PathBuf::from("data"));
    // No layer takes --dev off loopback.
    let everywhere = [
        ("NARAD_HTTP_ADDR", ":7942"),
        ("NARAD_HTTP_ADDR", "0.0.0.0:7942"),
    ];
    for (var, addr) in everywhere {
        let error = Config::load(&flags, &env_of(&[(var, addr)])).unwrap_err();
        assert!(error.contains("loopback only"), "{addr}: {error}");
    }
    let anywhere = Flags {
        addr: Some("0.0.0.0:7942".to_string()),
        ..flags.clone()
    };
    let error = Config::load(&anywhere, &env_of(&[])).unwrap_err();
    assert!(error.contains("loopback only"), "{error}");
    let ipv6 = Flags {
        addr: Some("[::1]:7942".to_string()),
        ..flags.clone()
    };
    assert_eq!(
        Config::load(&ipv6, &env_of(&[])).unwrap().http.addr,
        "[::1]:0"
    );
    // Without --dev, the environment turns security off.
    let env = env_of(&[("NARAD_SECURITY_ENABLED", "false")]);
    assert!(
        !Config::load(&Flags::default(), &env)
            .unwrap()
            .security
            .enabled
    );
}

/// An empty section configures nothing: accepted when the section exists
/// (or is the reference's and unsupported here), refused when its name is
/// unknown (`unknown_internal_and_unsupported_file_keys_refuse_naming_the_key`).
#[test]
fn an_empty_known_section_is_accepted() {
    for json in [r#"{"http": {}}"#, r#"{"storage": {}, "cluster": {}}"#] {
        let (_file, flags) = file(json);
        assert!(Config::load(&flags, &no_env).is_ok(), "{json}");
    }
}

#[test]
fn unknown_internal_and_unsupported_file_keys_refuse_naming_the_key() {
    for (json, needle) in [
        (r#"{"http": {"adr": ":1"}}"#, "unknown key `http.adr`"),
        (r#"{"htp": {"addr": ":1"}}"#, "unknown key `htp.addr`"),
        (r#"{"verbose": true}"#, "unknown key `verbose`"),
        (r#"{"metrics": {}}"#, "unknown key `metrics`"),
        (
            r#"{"storage": {"fsync": "always"}}"#,
            "`storage.fsync` is internal",
        ),
        (
            r#"{"cluster": {"peers": "a@b:1"}}"#,
            "`cluster.peers` is not supported",
        ),
        (r#"{"http": ":1"}"#, "`http` must be an object"),
        (r#"[1]"#, "top level must be a JSON object"),
        (r#"{"http": {"#, "invalid JSON"),
        (
            r#"{"http": {"addr": ":1", "addr": ":2"}}"#,
            "duplicate field \"addr\" in \"http\"",
        ),
        (
            r#"{"http": {"addr": ":1"}, "http": {"max_connections": 9}}"#,
            "duplicate field \"http\"",
        ),
    ] {
        let (_file, flags) = file(json);
        let error = Config::load(&flags, &no_env).unwrap_err();
        assert!(error.contains(needle), "{json}: {error}");
        assert!(error.starts_with("config file "), "{error}");
    }
}

#[test]
fn the_consumer_offset_interval_is_a_file_key_with_a_range() {
    assert_eq!(
        Config::load(&Flags::default(), &no_env)
            .unwrap()
            .storage
            .consumer_offset_commit_interval_ms,
        1000
    );
    let (_file, flags) = file(r#"{"storage": {"consumer_offset_commit_interval_ms": 250}}"#);
    let config = Config::load(&flags, &no_env).unwrap();
    assert_eq!(config.storage.consumer_offset_commit_interval_ms, 250);
    for bad in ["5", "60001"] {
        let json = format!(r#"{{"storage": {{"consumer_offset_commit_interval_ms": {bad}}}}}"#);
        let (_file, flags) = file(&json);
        let error = Config::load(&flags, &no_env).unwrap_err();
        assert!(
            error.contains(
                "storage.consumer_offset_commit_interval_ms must be between 10 and 60000"
            ),
            "{error}"
        );
    }
}

#[test]
fn wrongly_typed_values_name_the_key_or_variable() {
    let (_file, flags) = file(r#"{"http": {"read_timeout": 10}}"#);
    let error = Config::load(&flags, &no_env).unwrap_err();
    assert!(
        error.contains("`http.read_timeout`") && error.contains("duration"),
        "{error}"
    );
    let env = env_of(&[("NARAD_HTTP_MAX_CONNECTIONS", "many")]);
    let error = Config::load(&Flags::default(), &env).unwrap_err();
    assert!(error.contains("NARAD_HTTP_MAX_CONNECTIONS"), "{error}");
    let env = env_of(&[("NARAD_SECURITY_ENABLED", "no")]);
    let error = Config::load(&Flags::default(), &env).unwrap_err();
    assert!(error.contains("NARAD_SECURITY_ENABLED"), "{error}");
}

#[test]
fn validation_explains_what_is_wrong() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("NARAD_HTTP_WRITE_TIMEOUT", "5s")],
            "must be greater than http.max_consume_wait",
        ),
        (
            &[("NARAD_HTTP_SHUTDOWN_GRACE", "5s")],
            "must not exceed http.shutdown_grace",
        ),
        (
            &[("NARAD_HTTP_READ_TIMEOUT", "0")],
            "http.read_timeout must be greater than 0",
        ),
        (
            &[("NARAD_HTTP_MAX_HEADER_BYTES", "10")],
            "http.max_header_bytes must be between",
        ),
        (
            &[("NARAD_HTTP_MAX_CONNECTIONS", "0")],
            "http.max_connections must be between",
        ),
        (&[("NARAD_HTTP_ADDR", "nowhere")], "http.addr"),
        (
            &[("NARAD_TOPIC_DEFAULT_PARTITIONS", "200")],
            "topic.default_partitions must be between 3 and 108",
        ),
        (
            &[("NARAD_TOPIC_DEFAULT_PARTITIONS", "2")],
            "topic.default_partitions must be between 3 and 108",
        ),
        (
            &[("NARAD_TOPIC_DEFAULT_RETENTION_AGE_MS", "9223372036854775808")],
            "topic.default_retention_age_ms must be 0 (forever) or between 3600000 and 9223372036854775807",
        ),
        (
            &[("NARAD_TOPIC_DEFAULT_VISIBILITY_TIMEOUT_MS", "18446744073709551615")],
            "topic.default_visibility_timeout_ms must be between 1 and 9223372036854775807",
        ),
        (&[("NARAD_LOG_LEVEL", "warnig")], "`warnig` is not a level"),
        (
            &[("NARAD_LOG_LEVEL", "")],
            "NARAD_LOG_LEVEL is set but empty: give it a value or unset it",
        ),
        (
            &[("NARAD_HTTP_ADDR", "")],
            "NARAD_HTTP_ADDR is set but empty",
        ),
        (
            &[("NARAD_HTTP_MAX_CONNECTIONS", " ")],
            "NARAD_HTTP_MAX_CONNECTIONS is set but empty",
        ),
        (&[("NARAD_LOG_LEVEL", " , ")], "log.level is empty"),
        (
            &[("NARAD_HTTP_READ_TIMEOUT", "3000000000000000h")],
            "too large",
        ),
        (
            &[("NARAD_CLUSTER_PEERS", "10.0.0.2:7943")],
            "NARAD_CLUSTER_PEERS is set, but this version does not support",
        ),
        (
            &[("NARAD_HTTP_METRICS_ADDR", ":9100")],
            "NARAD_HTTP_METRICS_ADDR is set",
        ),
        (
            &[("NARAD_LOG_LEVEL", "info,hyper")],
            "`hyper` is not a level",
        ),
        (
            &[("NARAD_TOPIC_DEFAULT_RETENTION_AGE_MS", "1000")],
            "topic.default_retention_age_ms",
        ),
        (&[("NARAD_LOG_LEVEL", "narad=loud")], "log.level"),
        (&[("NARAD_LOG_FORMAT", "xml")], "NARAD_LOG_FORMAT"),
    ];
    for (env, needle) in cases {
        let error = Config::load(&Flags::default(), &env_of(env)).unwrap_err();
        assert!(error.contains(needle), "{env:?}: {error}");
    }
    for level in [
        "warn",
        "INFO",
        "off",
        "narad=debug,hyper=warn",
        "info,narad=trace",
    ] {
        let env = env_of(&[("NARAD_LOG_LEVEL", level)]);
        Config::load(&Flags::default(), &env).unwrap();
    }
    // The boundary the reference allows: the wait may equal the grace.
    let env = env_of(&[
        ("NARAD_HTTP_MAX_CONSUME_WAIT", "2s"),
        ("NARAD_HTTP_SHUTDOWN_GRACE", "2s"),
    ]);
    Config::load(&Flags::default(), &env).unwrap();
}

#[test]
fn retention_walk_and_idle_eviction_are_file_only_positive_milliseconds() {
    let defaults = Config::load(&Flags::default(), &no_env).unwrap();
    assert_eq!(defaults.storage.idle_log_eviction_ms, 1_800_000);
    assert_eq!(defaults.storage.cold_retention_walk_ms, 300_000);
    let (_file, flags) =
        file(r#"{"storage": {"idle_log_eviction_ms": 60000, "cold_retention_walk_ms": 1000}}"#);
    let config = Config::load(&flags, &no_env).unwrap();
    assert_eq!(config.storage.idle_log_eviction_ms, 60_000);
    assert_eq!(config.storage.cold_retention_walk_ms, 1_000);
    // File-only: no environment variable reaches them.
    let env = env_of(&[
        ("NARAD_STORAGE_IDLE_LOG_EVICTION_MS", "5"),
        ("NARAD_IDLE_LOG_EVICTION_MS", "5"),
    ]);
    assert_eq!(
        Config::load(&Flags::default(), &env)
            .unwrap()
            .storage
            .idle_log_eviction_ms,
        1_800_000
    );
    for (json, needle) in [
        (
            r#"{"storage": {"idle_log_eviction_ms": 0}}"#,
            "storage.idle_log_eviction_ms must be at least 1",
        ),
        (
            r#"{"storage": {"cold_retention_walk_ms": 0}}"#,
            "storage.cold_retention_walk_ms must be at least 1",
        ),
        (
            r#"{"storage": {"cold_retention_walk_ms": "5m"}}"#,
            "`storage.cold_retention_walk_ms`: expected a non-negative integer",
        ),
        (
            r#"{"storage": {"idle_log_eviction_ms": -1}}"#,
            "`storage.idle_log_eviction_ms`: expected a non-negative integer",
        ),
        // The check interval stays internal, as in the reference.
        (
            r#"{"storage": {"retention_check_interval_ms": 1000}}"#,
            "`storage.retention_check_interval_ms` is internal",
        ),
    ] {
        let (_file, flags) = file(json);
        let error = Config::load(&flags, &no_env).unwrap_err();
        assert!(error.contains(needle), "{json}: {error}");
    }
}

#[test]
fn log_prealloc_is_a_file_only_switch_on_by_default() {
    let defaults = Config::load(&Flags::default(), &no_env).unwrap();
    assert!(defaults.storage.log_prealloc);
    let (_file, flags) = file(r#"{"storage": {"log_prealloc": false}}"#);
    assert!(!Config::load(&flags, &no_env).unwrap().storage.log_prealloc);
    let env = env_of(&[("NARAD_STORAGE_LOG_PREALLOC", "false")]);
    assert!(
        Config::load(&Flags::default(), &env)
            .unwrap()
            .storage
            .log_prealloc,
        "file only"
    );
    let (_file, flags) = file(r#"{"storage": {"log_prealloc": "no"}}"#);
    let error = Config::load(&flags, &no_env).unwrap_err();
    assert!(error.contains("storage.log_prealloc"), "{error}");
}

#[test]
fn read_cache_bytes_is_a_file_only_bounded_byte_count() {
    let defaults = Config::load(&Flags::default(), &no_env).unwrap();
    assert_eq!(defaults.storage.read_cache_bytes, 64 << 20);
    for (json, want) in [
        (r#"{"storage": {"read_cache_bytes": 0}}"#, 0),
        (r#"{"storage": {"read_cache_bytes": 1073741824}}"#, 1 << 30),
    ] {
        let (_file, flags) = file(json);
        let config = Config::load(&flags, &no_env).unwrap();
        assert_eq!(config.storage.read_cache_bytes, want, "{json}");
    }
    let env = env_of(&[("NARAD_STORAGE_READ_CACHE_BYTES", "5")]);
    assert_eq!(
        Config::load(&Flags::default(), &env)
            .unwrap()
            .storage
            .read_cache_bytes,
        64 << 20,
        "file only"
    );
    for (json, needle) in [
        (
            r#"{"storage": {"read_cache_bytes": 68719476737}}"#,
            "storage.read_cache_bytes must be",
        ),
        (
            r#"{"storage": {"read_cache_bytes": "64MiB"}}"#,
            "`storage.read_cache_bytes`: expected a non-negative integer",
        ),
    ] {
        let (_file, flags) = file(json);
        let error = Config::load(&flags, &no_env).unwrap_err();
        assert!(error.contains(needle), "{json}: {error}");
    }
}

#[test]
fn codec_and_compression_level_are_file_keys_in_the_reference_words() {
    let defaults = Config::load(&Flags::default(), &no_env).unwrap();
    assert_eq!(defaults.storage.codec, Codec::None);
    assert_eq!(defaults.storage.zstd_level(), None);
    for (json, want) in [
        (r#"{"storage": {"codec": "none"}}"#, None),
        (r#"{"storage": {"codec": "zstd"}}"#, Some(1)),
        (
            r#"{"storage": {"codec": "zstd", "compression_level": "default"}}"#,
            Some(3),
        ),
        (
            r#"{"storage": {"codec": "zstd", "compression_level": "better"}}"#,
            Some(7),
        ),
        (
            r#"{"storage": {"codec": "zstd", "compression_level": "best"}}"#,
            Some(11),
        ),
        (
            r#"{"storage": {"codec": "none", "compression_level": "best"}}"#,
            None,
        ),
    ] {
        let (_file, flags) = file(json);
        let config = Config::load(&flags, &no_env).unwrap();
        assert_eq!(config.storage.zstd_level(), want, "{json}");
    }
    let env = env_of(&[("NARAD_STORAGE_CODEC", "zstd")]);
    assert_eq!(
        Config::load(&Flags::default(), &env).unwrap().storage.codec,
        Codec::None,
        "file only"
    );
    for (json, needle) in [
        (
            r#"{"storage": {"codec": "lz4"}}"#,
            "`storage.codec`: expected none or zstd, got `lz4`",
        ),
        (
            r#"{"storage": {"compression_level": 3}}"#,
            "`storage.compression_level`: expected a string",
        ),
        (
            r#"{"storage": {"compression_level": "max"}}"#,
            "expected fastest, default, better or best",
        ),
    ] {
        let (_file, flags) = file(json);
        let error = Config::load(&flags, &no_env).unwrap_err();
        assert!(error.contains(needle), "{json}: {error}");
    }
}

#[test]
fn narad_variables_that_configure_nothing_are_named() {
    let names = [
        "NARAD_HTTP_MAX_CONECTIONS",
        "NARAD_HTTP_MAX_CONNECTIONS",
        "NARAD_ADDR",
        "NARAD_SHARDS",
        "NARAD_NODE_ID",
        "NARAD_STORAGE_CODEC",
        "PATH",
        "NARAD_DATA_DIR",
        "NARAD_DEBUG_RETENTION_MS_OVERRIDE",
    ]
    .map(String::from);
    // A debug build's test hooks configure something there; a release build
    // reads none of them.
    let mut want = vec!["NARAD_HTTP_MAX_CONECTIONS", "NARAD_STORAGE_CODEC"];
    if !cfg!(debug_assertions) {
        want.insert(0, "NARAD_DEBUG_RETENTION_MS_OVERRIDE");
    }
    assert_eq!(Config::unknown_env(names), want);
    // A file-only key's spelling is told apart from a misspelling.
    assert_eq!(
        Config::file_only_key("NARAD_STORAGE_CODEC"),
        Some("storage.codec")
    );
    assert_eq!(
        Config::file_only_key("NARAD_STORAGE_READ_CACHE_BYTES"),
        Some("storage.read_cache_bytes")
    );
    assert_eq!(Config::file_only_key("NARAD_HTTP_MAX_CONECTIONS"), None);
    assert_eq!(Config::file_only_key("NARAD_HTTP_MAX_CONNECTIONS"), None);
}

#[test]
fn a_flat_dotted_key_in_the_file_is_told_to_nest() {
    let (_file, flags) = file(r#"{"http.addr":"127.0.0.1:0"}"#);
    let err = Config::load(&flags, &no_env).unwrap_err();
    assert!(err.contains(r#"{"http": {"addr": …}}"#), "{err}");
    let (_file, flags) = file(r#"{"nonsense.key":1}"#);
    let err = Config::load(&flags, &no_env).unwrap_err();
    assert!(
        err.contains("unknown key `nonsense.key`") && !err.contains("nested"),
        "{err}"
    );
}
