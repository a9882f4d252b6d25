//! `narad serve`: loads the configuration, then starts one pinned executor per
//! shard over the data directory, each serving the HTTP API and owning its storage.
//!
//! Startup: the main thread loads and validates the configuration, locks the data
//! directory and binds one listening socket per shard on the API port (so a port in
//! use stops the node before anything else starts, and port 0 resolves to one port
//! for every shard). Each shard then starts its HTTP server at once (`/healthz`
//! answers from the start), opens and so recovers its ingress WAL under
//! `<data>/ingress/shard-<i>/`, and reports; when every shard has reported, the node
//! is ready (`/readyz` answers 200).
//!
//! Which threads: the main thread owns the data directory lock and waits for the
//! node's events (see [`crate::lifecycle`]): a stop signal, a shard that failed to
//! start, or one that panicked; each shard thread runs one glommio executor pinned
//! to its CPU and owns everything it opens. On any of them the main thread marks
//! the node as stopping and wakes every shard through its stop socket; each shard
//! drains its HTTP connections (within `http.shutdown_grace`), then closes its WAL.
//!
//! A fault hook, in debug builds only: `NARAD_DEBUG_WAL_WRITE_BUDGET_BYTES=<n>`
//! gives each shard's own ingress WAL a budget of `n` bytes written (segment
//! preparation and checkpoint stores included), past which its writes fail with
//! `ENOSPC` as on a full disk, so black-box tests can watch the WAL latch. The
//! partition logs, the metadata and the drain of leftover WALs use storage without
//! the budget. Release binaries have no hook: they never read the variable.
//!
//! Two more debug-only hooks make retention observable within seconds, for
//! black-box tests (the API refuses a retention under one hour, as the reference
//! does): `NARAD_DEBUG_RETENTION_MS_OVERRIDE=<ms>` makes every topic with a finite
//! retention keep its records for `ms` instead (topics that keep them forever
//! still do), and `NARAD_DEBUG_RETENTION_CHECK_INTERVAL_MS=<ms>` runs each shard's
//! retention reaper that often instead of every minute (the internal
//! `storage.retention_check_interval_ms`). The topic's `retention_ms` as the API
//! shows it does not change. Release binaries never read these variables either.
//! Likewise `NARAD_DEBUG_METRICS_POLL_MS=<ms>` refreshes the polled gauges that
//! often instead of every 5 s, and `NARAD_DEBUG_METRICS_QUEUE_LOADS=<n>` has a
//! poll load the consumer state of at most `n` untouched partitions instead of
//! 64 (0: none, so that their logs stay closed), and
//! `NARAD_DEBUG_CONSUMER_OFFSET_LEVEL_MS=<ms>` levels `consumer.offset` that
//! often at most instead of every 30 s.

use std::path::PathBuf;
use std::sync::Arc;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use narad_io::dma::DmaStorage;
use narad_io::mesh::MeshEnd;
use narad_io::net::StopReceiver;
use narad_shards::log::cache::CachePool;
use narad_shards::log::LogConfig;
use narad_shards::log::{ScanGate, FULL_SCANS_AT_ONCE};
use narad_shards::wal::{Wal, WalConfig};

use narad_io::rt::Notify;
use narad_shards::produce::{driver, DriverConfig, Mode};

use crate::broker::env::ShardEnv;
use crate::broker::ops::Op;
use crate::broker::shard::{receive_loop, Owner};
use crate::broker::Shard;
use crate::config::{Config, Flags, TopicDefaults};
use crate::control::{Control, ControlClient, MetaView, Published};
use crate::http::routes::{Api, Routes};
use crate::http::{HttpSettings, NodeState, ShardServer};
use crate::lifecycle::{self, Dispatching, NodeEvent};

mod descriptors;
mod retention;
mod start;
mod waits;

use descriptors::{connections_max, open_logs_max, OPEN_FILES_MARGIN};
use retention::{supervise_reaper, RetentionSettings};
use start::{lock_data_dir, StartGate};
use waits::{blocking_on_disk, waiting_on_disk};

/// Ops a shard's inbox from one peer holds before the peer waits.
const MESH_CHANNEL_CAPACITY: usize = 1_024;

/// Locked memory the runtime's io_uring rings need at least (it refuses below).
const MEMLOCK_BYTES_MIN: u64 = 512 << 10;

/// Runs the node until SIGINT or SIGTERM. `shards` defaults to every CPU this
/// process may run on.
pub fn run(flags: Flags, shards: Option<usize>) -> Result<(), String> {
    let booting = std::time::Instant::now();
    // First, before any thread starts (logging's included): every thread
    // inherits the mask, so from here on a stop signal is never taken by its
    // default action (death without a drain). One that comes before the
    // signal thread waits stays pending for it. One in the few milliseconds
    // before this line (loading, argument parsing) still ends the process as
    // the default action does, with nothing opened yet to drain.
    lifecycle::block_stop_signals();
    // A value that is not text would read as unset below: refuse it instead.
    if let Some((name, _)) = std::env::vars_os().find(|(name, value)| {
        name.to_str().is_some_and(|n| n.starts_with("NARAD_")) && value.to_str().is_none()
    }) {
        return Err(format!(
            "{} holds bytes that are not UTF-8 text",
            name.to_string_lossy()
        ));
    }
    let config = Config::load(&flags, &|name| std::env::var(name).ok())?;
    crate::cli::init_logging(&config.log);
    let names = std::env::vars_os().filter_map(|(name, _)| name.into_string().ok());
    for name in Config::unknown_env(names) {
        match Config::file_only_key(&name) {
            Some(key) => {
                tracing::warn!(variable = %name, "{name} is set but {key} is read from the configuration file only; ignored")
            }
            None => {
                tracing::warn!(variable = %name, "{name} is set but configures nothing; ignored (a misspelt key?)")
            }
        }
    }
    if config.security.enabled {
        return Err(
            "authentication is not available yet, so the broker serves only with security off: \
             run `narad serve --dev`, set NARAD_SECURITY_ENABLED=false, or set \
             security.enabled to false in the configuration file"
                .to_string(),
        );
    }
    let data_dir = config.storage.data_dir.clone();
    // A directory that cannot even be looked at (a disk failing its reads)
    // is not one to create.
    let found = data_dir
        .try_exists()
        .map_err(|e| format!("cannot read data directory {}: {e}", data_dir.display()))?;
    if found && !data_dir.is_dir() {
        return Err(format!(
            "data directory {} is not a directory (a file is there); point --data-dir elsewhere",
            data_dir.display()
        ));
    }
    crate::broker::layout::create_data_dir(&data_dir)
        .map_err(|e| format!("cannot create data directory {}: {e}", data_dir.display()))?;
    let data_dir = std::path::absolute(&data_dir)
        .map_err(|e| format!("cannot resolve data directory {}: {e}", data_dir.display()))?;
    let _lock = lock_data_dir(&data_dir)?;
    crate::broker::layout::check_writable(&data_dir)?;
    let cpus = allowed_cpus();
    let shards = shards.unwrap_or(cpus.len()).max(1);
    if shards > cpus.len() {
        tracing::warn!(
            shards,
            cpus = cpus.len(),
            "more shards than CPUs this process may run on: shards share CPUs, and each costs its own memory (about 20 MiB) and ingress WAL segments on disk; one shard per CPU (the default) serves best"
        );
    }
    // Before any shard records: handles taken earlier would count into nothing.
    crate::metrics::install();
    let memlock_bytes = narad_io::rt::raise_memlock_limit();
    narad_io::rt::plan_executors(shards);
    if memlock_bytes < MEMLOCK_BYTES_MIN {
        // The runtime refuses to start its io_uring rings below this: every
        // shard would fail, after the control plane had started.
        return Err(format!(
            "RLIMIT_MEMLOCK is {memlock_bytes} bytes even raised to its hard limit; io_uring needs at least 512 KiB of locked memory: raise the hard limit (ulimit -l 512 or more; systemd: LimitMEMLOCK=infinity)"
        ));
    }
    // Connections, segment files, WAL segments and the runtime's own: the
    // connection cap plus a margin for the rest.
    let open_files = narad_io::rt::raise_open_files_limit();
    let open_files_wanted = config.http.max_connections as u64 + OPEN_FILES_MARGIN;
    let max_connections = connections_max(config.http.max_connections, open_files);
    if open_files < open_files_wanted {
        tracing::warn!(
            open_files,
            wanted = open_files_wanted,
            max_connections,
            "RLIMIT_NOFILE is below http.max_connections plus the files the broker keeps open: the node serves at most max_connections connections at once, so that they leave the storage its descriptors, and refuses more with 503; raise it (systemd: LimitNOFILE=65536) or lower http.max_connections"
        );
    }
    let open_logs_max = open_logs_max(open_files, max_connections, shards);
    // Before the address is told: a script that stops the node as soon as it
    // reads it gets a graceful stop.
    let (events_tx, events) = std::sync::mpsc::channel();
    lifecycle::watch_stop_signals(events_tx.clone())
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    let requested = config.listen_addr()?;
    let (sockets, addr) = narad_io::net::bind_reuseport_group(requested, shards)
        .map_err(|e| start::listen_refusal(requested, &e))?;
    tracing::info!(%addr, shards, "listening");
    tracing::info!(
        open_files,
        open_logs_max_per_shard = open_logs_max,
        "open partition logs are bounded by RLIMIT_NOFILE"
    );
    // On stdout too, whatever the log level: with `--port 0` this is the only
    // place the chosen port is told.
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "narad listening on http://{addr}").and_then(|()| out.flush());
    }
    let control = {
        let events = events_tx.clone();
        blocking_on_disk("recovering the metadata store", || {
            Control::start(data_dir.join("metastore"), move || {
                let _ = events.send(NodeEvent::ControlPanicked);
            })
        })?
    };
    crate::broker::layout::remove_orphans(&data_dir, &control.published);
    let leftovers = crate::broker::layout::leftover_wals(&data_dir, shards);
    let dispatching = Arc::new(Dispatching::new(shards));
    let mut mesh = narad_io::mesh::full_mesh::<Op>(shards, MESH_CHANNEL_CAPACITY).into_iter();
    // Every shard's executor exists before any connects its mesh ends: a
    // connect spins until its peer connects too, and with more shards than
    // CPUs the spinning shards starved the ones still starting (48 shards on
    // 2 CPUs took 7 to 15 s to connect).
    let executors_up = Arc::new(StartGate::new(shards));
    let node = Arc::new(
        NodeState::new(max_connections)
            .with_batch_bytes_max(config.http.max_batch_body_bytes_in_flight)
            .with_consumes_max(config.http.max_consume_in_flight_per_identity)
            .with_produces_max(config.http.max_produce_in_flight_per_identity),
    );
    let settings = HttpSettings::from(&config.http);
    // The guard only: the gauges are the shard-0 watcher's alone.
    let _ = crate::metrics::note_disk_now(&node, &data_dir);
    let wal_config = WalConfig {
        prealloc: config.storage.ingress_wal_prealloc,
        disk_room: Some(node.disk_room()),
        ..WalConfig::default()
    };
    let wal_write_budget_bytes = debug_wal_write_budget_bytes()?;
    let retention = RetentionSettings::load(&config)?;
    let mut stops = Vec::with_capacity(shards);
    let mut threads = Vec::with_capacity(shards);
    for (shard, socket) in sockets.into_iter().enumerate() {
        let mesh_end = mesh.next().expect("one mesh end per shard");
        let departure = mesh_end.departure();
        let (stop_tx, stop_rx) = narad_io::net::stop_channel()
            .map_err(|e| format!("cannot create the stop socket of shard {shard}: {e}"))?;
        stops.push(stop_tx);
        let start = ShardStart {
            shard,
            data_dir: data_dir.clone(),
            wal_config: wal_config.clone(),
            wal_write_budget_bytes,
            retention: retention.clone(),
            socket,
            node: node.clone(),
            settings: settings.clone(),
            stop: stop_rx,
            events: events_tx.clone(),
            mesh: mesh_end,
            executors_up: executors_up.clone(),
            published: control.published.clone(),
            dispatching: dispatching.clone(),
            control: control.client.clone(),
            topic_defaults: config.topic.clone(),
            consumer_offset_interval: std::time::Duration::from_millis(
                config.storage.consumer_offset_commit_interval_ms,
            ),
            read_cache_bytes: config.storage.read_cache_bytes as usize,
            log_prealloc: config.storage.log_prealloc,
            zstd_level: config.storage.zstd_level(),
            open_logs_max,
            leftovers: leftovers
                .iter()
                .filter(|&&old| old % shards == shard)
                .copied()
                .collect(),
        };
        let cpu = cpus[shard % cpus.len()];
        let events = events_tx.clone();
        let dispatching = dispatching.clone();
        let gate = executors_up.clone();
        let thread = std::thread::Builder::new()
            .name(format!("shard-{shard}"))
            .spawn(move || {
                // Marks this shard gone from the mesh when the thread ends, by
                // return or by unwinding: sends to it then fail at once.
                let _departure = departure;
                let run = std::panic::AssertUnwindSafe(|| {
                    narad_io::rt::run_local(Some(cpu), run_shard(start))
                });
                let ended = std::panic::catch_unwind(run).unwrap_or_else(|panic| {
                    // The other shards must not wait for this one to start
                    // (its executor may be what failed), nor on its dispatcher.
                    gate.fail();
                    dispatching.finish(shard);
                    let _ = events.send(NodeEvent::Panicked { shard });
                    std::panic::resume_unwind(panic)
                });
                if ended.is_err() {
                    // A shard that failed before it reported must still be
                    // counted out and make the node stop; after a report, both
                    // are no-ops (the main thread has stopped reading).
                    dispatching.finish(shard);
                    let _ = events.send(NodeEvent::Started { shard, ok: false });
                }
                ended
            })
            .map_err(|e| format!("cannot start shard {shard}: {e}"))?;
        threads.push(thread);
    }
    drop(events_tx);
    // Every shard reports once, after recovering its storage (or failing to); the
    // node runs until a stop signal, a failed start, or a panicked shard.
    let mut started = 0;
    loop {
        match events.recv() {
            Ok(NodeEvent::Started { ok: true, .. }) => {
                started += 1;
                if started == shards {
                    ::metrics::gauge!("narad_boot_duration_seconds")
                        .set(booting.elapsed().as_secs_f64());
                    node.set_ready();
                    tracing::info!(shards, %addr, data_dir = %data_dir.display(), "narad storage engine running; stop with SIGINT or SIGTERM");
                }
            }
            Ok(NodeEvent::Started { ok: false, shard }) => {
                node.start_draining();
                tracing::error!(shard, "a shard failed to start: stopping");
                break;
            }
            Ok(NodeEvent::Signal(signal)) => {
                // Mark the node as stopping before saying so, so that anyone who
                // reads the log line and then sends a request is answered 503.
                node.start_draining();
                tracing::info!(signal, "stopping");
                break;
            }
            Ok(NodeEvent::Panicked { shard }) => {
                node.start_draining();
                tracing::error!(
                    shard,
                    "a shard panicked and serves nothing any more: stopping the node"
                );
                break;
            }
            Ok(NodeEvent::ControlPanicked) => {
                node.start_draining();
                tracing::error!(
                    "the control plane panicked: topics can no longer change; stopping the node"
                );
                break;
            }
            // The signal thread holds a sender for as long as the process runs.
            Err(_) => unreachable!("the signal thread never ends"),
        }
    }
    lifecycle::note_stopping();
    drop(stops);
    let mut failures = Vec::new();
    for (shard, thread) in threads.into_iter().enumerate() {
        match thread.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(format!("shard {shard}: {e}")),
            Err(_) => failures.push(format!("shard {shard} panicked")),
        }
    }
    if control.stop() {
        failures.push("the control plane panicked".to_string());
    }
    if failures.is_empty() {
        tracing::info!("stopped");
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

/// What a shard thread starts from; everything in it is moved to the shard.
struct ShardStart {
    shard: usize,
    data_dir: PathBuf,
    wal_config: WalConfig,
    /// The debug fault hook's budget for this shard's own WAL; always `None` in
    /// release builds.
    wal_write_budget_bytes: Option<u64>,
    retention: RetentionSettings,
    socket: std::net::TcpListener,
    node: Arc<NodeState>,
    settings: HttpSettings,
    stop: StopReceiver,
    /// Where the shard reports that it started.
    events: std::sync::mpsc::Sender<NodeEvent>,
    mesh: MeshEnd<Op>,
    /// Passed once every shard's executor runs, before the mesh connects.
    executors_up: Arc<StartGate>,
    published: Arc<Published>,
    control: ControlClient,
    topic_defaults: TopicDefaults,
    /// `storage.consumer_offset_commit_interval_ms`.
    consumer_offset_interval: std::time::Duration,
    /// `storage.read_cache_bytes`: the shard's pool of recent-frame cache.
    read_cache_bytes: usize,
    /// `storage.log_prealloc`: zero-fill ahead of each active log segment's commits.
    log_prealloc: bool,
    /// `storage.codec` and `storage.compression_level`: how new frames are stored.
    zstd_level: Option<i32>,
    /// Partition logs the shard keeps open at most (see [`open_logs_max`]).
    open_logs_max: usize,
    /// Indexes of WALs left by shards that no longer exist, for this shard to drain.
    leftovers: Vec<usize>,
    /// Shards whose dispatchers still run: owners close only when it reaches zero.
    dispatching: Arc<Dispatching>,
}

async fn run_shard(start: ShardStart) -> Result<(), String> {
    let ShardStart {
        shard: index,
        data_dir,
        wal_config,
        wal_write_budget_bytes,
        retention,
        socket,
        node,
        settings,
        stop,
        events,
        mesh,
        executors_up,
        published,
        control,
        topic_defaults,
        consumer_offset_interval,
        read_cache_bytes,
        log_prealloc,
        zstd_level,
        open_logs_max,
        leftovers,
        dispatching,
    } = start;
    let shards = mesh_size(&mesh);
    let api = Rc::new(Api {
        node: node.clone(),
        topic_defaults,
        consume_wait_max: settings.max_consume_wait,
        body_read_timeout: settings.read_timeout,
        broker: RefCell::new(None),
    });
    // Every shard connects its mesh end first: a peer that fails after this
    // cannot leave the others waiting to connect.
    if !executors_up.arrive() {
        // No peer connects now: a shard that would wait for this one's ends
        // is stopped by the same failure.
        return Err("another shard failed to start its executor".to_string());
    }
    let (link, receivers) = mesh.connect().await;
    let server = ShardServer::start(
        index,
        socket,
        node,
        Rc::new(Routes::new(api.clone())),
        &settings,
    )
    .map_err(|e| format!("shard {index} cannot watch its listening socket: {e}"))?;
    let storage = DmaStorage::new(&data_dir);
    // The WAL gets a storage value of its own, so that a debug write budget
    // charges its writes and nothing else.
    let wal_storage = match wal_write_budget_bytes {
        Some(bytes) => DmaStorage::new(&data_dir).with_write_budget(bytes),
        None => storage.clone(),
    };
    crate::lifecycle::debug_panic_at_start(index);
    crate::lifecycle::debug_recovery_delay(index).await;
    let dir = format!("ingress/shard-{index}");
    let opened = waiting_on_disk(
        index,
        "start: opening the ingress WAL",
        Wal::open(wal_storage, &dir, wal_config.clone()),
    )
    .await;
    let wal = match opened {
        Ok(wal) => wal,
        Err(e) => {
            let _ = events.send(NodeEvent::Started {
                shard: index,
                ok: false,
            });
            drop(events);
            dispatching.finish(index);
            // A shard whose storage failed still waits for the stop, which the main
            // thread sends at once, so that every shard stops the same way.
            stop.wait().await;
            server.drain().await;
            return Err(format!("opening {dir}: {e}"));
        }
    };
    wal.observe(Rc::new(crate::metrics::WalSeries::default()));
    tracing::info!(
        shard = index,
        next_seq = wal.next_seq().0,
        checkpoint = wal.checkpoint().0,
        backlog_records = wal.dispatch_backlog_records(),
        segments = wal.segment_count(),
        "ingress WAL recovered"
    );
    let meta = Rc::new(MetaView::new(published));
    let live = {
        let meta = meta.clone();
        Box::new(
            move |topic: &str, id, partition: narad_shards::ids::PartitionId| {
                meta.snapshot()
                    .topics
                    .get(topic)
                    .is_some_and(|t| t.id == id && partition.0 < t.partitions)
            },
        )
    };
    let log_defaults = LogConfig::default();
    let log_config = LogConfig {
        cache_pool: Some(CachePool::new(read_cache_bytes)),
        scan_gate: Some(ScanGate::new(FULL_SCANS_AT_ONCE)),
        zstd_level,
        prep_chunk_bytes: if log_prealloc {
            log_defaults.prep_chunk_bytes
        } else {
            0
        },
        ..log_defaults
    };
    let owner = Owner::new(storage.clone(), log_config, live);
    owner.set_open_logs_max(open_logs_max);
    owner.set_retention(retention.retention_of(meta.clone()));
    let storage_metrics = Rc::new(crate::metrics::StorageMetrics::default());
    owner.set_observer(storage_metrics.clone());
    let waiters = Rc::new(crate::consume::waiters::Waiters::default());
    let persister = Rc::new(crate::consume::persist::Persister::default());
    let queues = {
        let kicked = waiters.clone();
        let wake = Box::new(move |id, topic: &Arc<str>| kicked.kick(id, topic));
        let rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::from_os_rng();
        let queues = Rc::new(crate::consume::queues::Queues::new(
            owner.clone(),
            storage.clone(),
            rng,
            wake,
            persister.clone(),
        ));
        let later = waiters.clone();
        queues.set_wake_later(Box::new(move |id, topic: &Arc<str>| {
            later.kick_later(id, topic)
        }));
        queues
    };
    {
        let queues = Rc::downgrade(&queues);
        let waiters = waiters.clone();
        owner.set_on_visible(Box::new(move |topic, id, partition, hwm| {
            if let Some(queues) = queues.upgrade() {
                queues.on_visible(topic, id, partition, hwm, waiters.is_waited_on(id));
            }
        }));
    }
    {
        let queues = Rc::downgrade(&queues);
        owner.set_on_retained(Box::new(move |topic, id, partition, oldest| {
            if let Some(queues) = queues.upgrade() {
                queues.on_retained(topic, id, partition, oldest);
            }
        }));
    }
    let shard = Rc::new(Shard {
        index,
        shards,
        meta,
        control,
        wal: wal.clone(),
        leftover_wals: RefCell::new(Vec::new()),
        owner: owner.clone(),
        mesh: link,
        round_robin: RefCell::new(crate::partition::RoundRobin::new(rand::random())),
        storage: storage.clone(),
        data_dir: data_dir.clone(),
        stopping: Cell::new(false),
        http_drained: Cell::new(false),
        stop_notify: Notify::default(),
        drain_held_bytes: Rc::new(Cell::new(0)),
        queues,
        waiters,
        persister,
        consume_turn: Cell::new(index),
        wal_stalled: Cell::new(false),
        checkpoint_failing: Cell::new(false),
        node: api.node.clone(),
        traffic: crate::metrics::Traffic::default(),
        storage_metrics,
        acks: crate::consume::acks::AckLanes::new(shards),
    });
    let metrics_poll = debug_env_u64("NARAD_DEBUG_METRICS_POLL_MS")?
        .filter(|&ms| ms > 0)
        .map_or(
            crate::metrics::POLL_INTERVAL,
            std::time::Duration::from_millis,
        );
    let queue_loads = debug_env_u64("NARAD_DEBUG_METRICS_QUEUE_LOADS")?
        .map_or(crate::metrics::QUEUE_LOADS_PER_POLL, |n| n as usize);
    let level_every = debug_env_u64("NARAD_DEBUG_CONSUMER_OFFSET_LEVEL_MS")?
        .filter(|&ms| ms > 0)
        .map(std::time::Duration::from_millis);
    let committer =
        crate::consume::persist::committer_config(consumer_offset_interval, shards, level_every);
    let persister_task = narad_io::rt::spawn_local(crate::consume::persist::run_persister(
        shard.clone(),
        committer,
    ));
    let pump = narad_io::rt::spawn_local(crate::consume::flow::run_pump(shard.clone()));
    let reaper = narad_io::rt::spawn_local(supervise_reaper(
        owner.clone(),
        retention.reaper.clone(),
        shard.clone(),
    ));
    narad_io::rt::spawn_local(crate::consume::flow::run_purger(shard.clone()));
    for (_, receiver) in receivers {
        narad_io::rt::spawn_local(receive_loop(shard.clone(), receiver));
    }
    let env = Rc::new(ShardEnv(shard.clone()));
    let mut dispatchers = vec![narad_io::rt::spawn_local(driver::run(
        env.clone(),
        wal.clone(),
        dir.clone(),
        Mode::Own,
        DriverConfig::default(),
    ))];
    let mut failed = None;
    for old in leftovers {
        let old_dir = format!("ingress/shard-{old}");
        // A leftover is only read and drained, never appended to: no segment
        // is prepared for it.
        let drain_config = WalConfig {
            prealloc: false,
            ..wal_config.clone()
        };
        match Wal::open(storage.clone(), &old_dir, drain_config).await {
            Ok(old_wal) => {
                let env = env.clone();
                let shard = shard.clone();
                shard
                    .leftover_wals
                    .borrow_mut()
                    .push((old, old_wal.clone()));
                dispatchers.push(narad_io::rt::spawn_local(async move {
                    driver::run(
                        env,
                        old_wal.clone(),
                        old_dir,
                        Mode::Drain,
                        DriverConfig::default(),
                    )
                    .await;
                    shard.leftover_wals.borrow_mut().retain(|(i, _)| *i != old);
                    old_wal.close().await;
                    // Every record it held is committed and the checkpoint
                    // that says so is durable: its files only take disk now.
                    if old_wal.synced_checkpoint() >= old_wal.durable_next() {
                        crate::broker::layout::retire_drained_wal(&shard.data_dir, old);
                    }
                }));
            }
            Err(e) => failed = Some(format!("opening leftover {old_dir}: {e}")),
        }
    }
    // After the leftover WALs are registered: the first poll's dispatch
    // backlog counts them (a 0 there says a downgrade is safe).
    narad_io::rt::spawn_local(crate::broker::shard::watch_wal_stall(shard.clone()));
    narad_io::rt::spawn_local(crate::metrics::run_poller(
        shard.clone(),
        metrics_poll,
        queue_loads,
    ));
    *api.broker.borrow_mut() = Some(shard.clone());
    let _ = events.send(NodeEvent::Started {
        shard: index,
        ok: failed.is_none(),
    });
    drop(events);
    stop.wait().await;
    // Parked consumers are answered at once, so the drain does not wait out
    // their long-polls.
    shard.stopping.set(true);
    shard.waiters.pump.notify();
    pump.await;
    server.drain().await;
    shard.http_drained.set(true);
    shard.stop_notify.notify();
    for dispatcher in dispatchers {
        dispatcher.await;
    }
    // Owners keep serving until every shard's dispatchers are done, so commits
    // sent during the stop still land and no checkpoint is left behind them.
    dispatching.finish(index);
    while !dispatching.all_finished() {
        narad_io::rt::sleep(std::time::Duration::from_millis(5)).await;
    }
    // Every shard's HTTP is drained by now: no more acks arrive.
    shard.persister.close();
    let persisted = waiting_on_disk(index, "stop: persisting the acks", persister_task).await;
    if let Some(Err(e)) = persisted {
        tracing::error!(shard = index, error = %e, "the stop could not persist every ack");
        failed.get_or_insert(e);
    }
    waiting_on_disk(index, "stop: closing the partition logs", owner.close_all()).await;
    reaper.await;
    waiting_on_disk(index, "stop: flushing the ingress WAL", wal.close()).await;
    // A checkpoint left unsynced (a disk failing the stop's last sync) costs
    // no record, but the next start commits again what lies above the synced
    // one: the stop was not clean, and says so as an unsaved ack does.
    let (reached, synced) = (wal.checkpoint(), wal.synced_checkpoint());
    if synced < reached {
        let e = format!(
            "the ingress WAL's dispatch checkpoint could not be made durable at the stop (synced {}, reached {}): the next start commits those {} records again",
            synced.0,
            reached.0,
            reached.0 - synced.0
        );
        tracing::error!(shard = index, "{e}");
        failed.get_or_insert(e);
    }
    api.broker.borrow_mut().take();
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The debug fault hook's budget (see the module docs): the value of
/// `NARAD_DEBUG_WAL_WRITE_BUDGET_BYTES` in a debug build, else `None`.
fn debug_wal_write_budget_bytes() -> Result<Option<u64>, String> {
    let budget = debug_env_u64("NARAD_DEBUG_WAL_WRITE_BUDGET_BYTES")?;
    if let Some(bytes) = budget {
        tracing::warn!(
            budget_bytes = bytes,
            "debug fault hook: each shard's ingress WAL fails its writes with ENOSPC past this budget"
        );
    }
    Ok(budget)
}

/// The value of a debug hook's variable in a debug build; `None` when it is unset,
/// and always in a release build, which never reads it.
fn debug_env_u64(name: &str) -> Result<Option<u64>, String> {
    #[cfg(debug_assertions)]
    if let Ok(value) = std::env::var(name) {
        return value
            .parse::<u64>()
            .map(Some)
            .map_err(|e| format!("{name}={value:?} is not a non-negative integer: {e}"));
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
    Ok(None)
}

fn mesh_size(mesh: &MeshEnd<Op>) -> usize {
    mesh.shards()
}

/// The CPUs this process may run on, from its affinity mask.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it for this process.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let ok =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) }
            == 0;
    let cpus: Vec<usize> = if ok {
        // SAFETY: CPU_ISSET only reads the set filled above.
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
            .collect()
    } else {
        Vec::new()
    };
    if cpus.is_empty() {
        (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
    } else {
        cpus
    }
}
