//! `narad serve`: starts one pinned executor per shard over the data directory.
//!
//! What runs today is the storage engine: every shard opens (and so recovers) its
//! ingress WAL under `<data>/ingress/shard-<i>/`, then waits. The HTTP API, the
//! dispatcher and the consume path are built on top of this startup.
//!
//! Which threads: the main thread owns the data directory lock and waits for
//! SIGINT/SIGTERM; each shard thread runs one glommio executor pinned to its CPU
//! and owns everything it opens. A stop is one shared flag, read by each shard on
//! its own timer; nothing else is shared.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use narad_io::dma::DmaStorage;
use narad_shards::wal::{Wal, WalConfig};

use crate::cli::ServeArgs;

/// How often an idle shard looks at the stop flag.
const STOP_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Runs the node until SIGINT or SIGTERM.
pub fn run(args: ServeArgs) -> Result<(), String> {
    let security_off = std::env::var("NARAD_SECURITY_ENABLED").is_ok_and(|v| v == "false");
    if !args.dev && !security_off {
        return Err(
            "authentication is not available yet, so the broker serves only with security off: \
             run `narad serve --dev` or set NARAD_SECURITY_ENABLED=false"
                .to_string(),
        );
    }
    let data_dir = args.data_dir.unwrap_or_else(|| PathBuf::from("data"));
    std::fs::create_dir_all(&data_dir)
        .map_err(|e| format!("cannot create data directory {}: {e}", data_dir.display()))?;
    let _lock = lock_data_dir(&data_dir)?;
    let cpus = allowed_cpus();
    let shards = args.shards.unwrap_or(cpus.len()).max(1);
    let memlock_bytes = narad_io::rt::raise_memlock_limit();
    if memlock_bytes < 512 << 10 {
        tracing::warn!(
            memlock_bytes,
            "RLIMIT_MEMLOCK is below 512 KiB: io_uring may fail to start; raise it (systemd: LimitMEMLOCK=infinity)"
        );
    }
    block_stop_signals();
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let mut threads = Vec::new();
    for shard in 0..shards {
        let cpu = cpus[shard % cpus.len()];
        let (stop, data_dir, ready) = (stop.clone(), data_dir.clone(), ready_tx.clone());
        let thread = std::thread::Builder::new()
            .name(format!("shard-{shard}"))
            .spawn(move || {
                narad_io::rt::run_local(Some(cpu), run_shard(shard, data_dir, stop, ready))
            })
            .map_err(|e| format!("cannot start shard {shard}: {e}"))?;
        threads.push(thread);
    }
    drop(ready_tx);
    // Every shard reports once, after recovering its storage (or failing to).
    let started = (0..shards).all(|_| ready_rx.recv() == Ok(true));
    if started {
        tracing::info!(shards, data_dir = %data_dir.display(), "narad storage engine running; stop with SIGINT or SIGTERM");
        let signal = wait_for_stop_signal();
        tracing::info!(signal, "stopping");
    }
    stop.store(true, Ordering::Release);
    let mut failures = Vec::new();
    for (shard, thread) in threads.into_iter().enumerate() {
        match thread.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(format!("shard {shard}: {e}")),
            Err(_) => failures.push(format!("shard {shard} panicked")),
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

async fn run_shard(
    shard: usize,
    data_dir: PathBuf,
    stop: Arc<AtomicBool>,
    ready: std::sync::mpsc::Sender<bool>,
) -> Result<(), String> {
    let storage = DmaStorage::new(&data_dir);
    let dir = format!("ingress/shard-{shard}");
    let opened = Wal::open(storage, &dir, WalConfig::default()).await;
    if let Ok(wal) = &opened {
        tracing::info!(
            shard,
            next_seq = wal.next_seq().0,
            checkpoint = wal.checkpoint().0,
            backlog_records = wal.dispatch_backlog_records(),
            segments = wal.segment_count(),
            "ingress WAL recovered"
        );
    }
    let _ = ready.send(opened.is_ok());
    let wal = opened.map_err(|e| format!("opening {dir}: {e}"))?;
    while !stop.load(Ordering::Acquire) {
        narad_io::rt::sleep(STOP_POLL_INTERVAL).await;
    }
    wal.close().await;
    Ok(())
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

/// Takes an exclusive lock on `<data>/lock`, held until the process exits.
fn lock_data_dir(data_dir: &Path) -> Result<std::fs::File, String> {
    let path = data_dir.join("lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(format!(
            "data directory {} is in use by another narad process (lock held on {})",
            data_dir.display(),
            path.display()
        ));
    }
    Ok(file)
}

fn stop_signal_set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

/// Blocks SIGINT and SIGTERM in this thread and the threads it starts, so that only
/// [`wait_for_stop_signal`] receives them.
fn block_stop_signals() {
    let set = stop_signal_set();
    // SAFETY: changes this thread's signal mask only.
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

fn wait_for_stop_signal() -> &'static str {
    let set = stop_signal_set();
    let mut signal = 0;
    // SAFETY: waits for one of the blocked signals in `set`.
    unsafe {
        libc::sigwait(&set, &mut signal);
    }
    if signal == libc::SIGTERM {
        "SIGTERM"
    } else {
        "SIGINT"
    }
}
