//! What the main thread of `narad serve` waits for, and how shards that end early
//! (by a storage failure or a panic) still let the node stop.
//!
//! The main thread reads one channel of [`NodeEvent`]s: each shard's report that
//! it started (or failed to), a stop signal from the signal thread, or a shard
//! that panicked. A panicked shard stops the whole node the way a signal does:
//! its partitions are no longer served, so the node must not keep answering as if
//! healthy, and a supervisor restarts it over the same data (the ingress WALs hold
//! every acknowledged record). A second stop signal while the node drains exits at
//! once, for an operator who will not wait out `http.shutdown_grace`.
//!
//! [`Dispatching`] counts the shards whose dispatchers still run; owners keep
//! serving until it reaches zero. Each shard is counted out exactly once, by
//! itself or, if it panicked, by the thread wrapper, so the other shards never
//! wait on a dead one.
//!
//! A fault hook, in debug builds only: `NARAD_DEBUG_PANIC=start:<shard>` panics
//! that shard before it opens its storage, and `NARAD_DEBUG_PANIC=produce:<topic>`
//! panics the shard that accepts a produce to that topic, for the tests of the
//! above; `NARAD_DEBUG_PANIC=delete:<topic>` panics the shard that deletes that
//! topic once the delete is applied and before its data is set aside, for the
//! test of an interrupted delete; `NARAD_DEBUG_PANIC=create:<topic>` panics the
//! control thread when a create of that topic is proposed, which stops the node
//! like a shard's panic; `NARAD_DEBUG_PANIC=retention:<topic>` panics the reaper
//! whenever it asks for that topic's retention, for the test that it skips the
//! topic's partitions and goes on.
//! Release binaries never read it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;

/// One thing the main thread of a serving node learns.
#[derive(Debug)]
pub enum NodeEvent {
    /// A shard recovered its storage (`true`) or failed to (`false`).
    Started { shard: usize, ok: bool },
    /// SIGINT or SIGTERM.
    Signal(&'static str),
    /// A shard's thread panicked; it serves nothing any more.
    Panicked { shard: usize },
    /// The control thread panicked: topics can no longer be created, altered
    /// or deleted.
    ControlPanicked,
}

/// The shards whose dispatchers may still commit to owners.
pub struct Dispatching {
    left: AtomicUsize,
    done: Vec<AtomicBool>,
}

impl Dispatching {
    pub fn new(shards: usize) -> Dispatching {
        Dispatching {
            left: AtomicUsize::new(shards),
            done: (0..shards).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Counts `shard` out; later calls for the same shard do nothing.
    pub fn finish(&self, shard: usize) {
        if !self.done[shard].swap(true, Ordering::AcqRel) {
            self.left.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Whether every shard is counted out.
    pub fn all_finished(&self) -> bool {
        self.left.load(Ordering::Acquire) == 0
    }
}

/// Set once the node stops for any reason (a signal, a panicked shard, a
/// failed start): a stop signal then exits at once.
static STOPPING: AtomicBool = AtomicBool::new(false);

/// The node has begun to stop, whatever the cause.
pub fn note_stopping() {
    STOPPING.store(true, Ordering::Release);
}

/// Starts the thread that turns SIGINT and SIGTERM into [`NodeEvent::Signal`]s.
/// The signals must already be blocked in every thread ([`block_stop_signals`]).
/// A signal that comes while the node already stops (the second one, or the
/// first after a panicked shard stopped it) exits the process at once.
pub fn watch_stop_signals(events: Sender<NodeEvent>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("signals".to_string())
        .spawn(move || {
            let first = wait_for_stop_signal();
            if STOPPING.load(Ordering::Acquire) {
                exit_now(first, "stop signal while the node already stops");
            }
            let _ = events.send(NodeEvent::Signal(first));
            let second = wait_for_stop_signal();
            exit_now(second, "second stop signal");
        })
        .map(|_| ())
}

fn exit_now(signal: &'static str, why: &'static str) -> ! {
    tracing::warn!(
        signal,
        "{why}: exiting without finishing the drain; acknowledged records are safe \
         in the ingress WAL, acks since the last consumer-state write are redelivered"
    );
    std::process::exit(1);
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
/// the signal thread receives them.
pub fn block_stop_signals() {
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

/// Whether `NARAD_DEBUG_PANIC` is `<kind>:<name>`; never in release builds.
fn debug_panic_names(kind: &str, name: &str) -> bool {
    #[cfg(debug_assertions)]
    {
        static HOOK: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        let hook = HOOK.get_or_init(|| std::env::var("NARAD_DEBUG_PANIC").ok());
        hook.as_deref()
            .and_then(|hook| hook.split_once(':'))
            .is_some_and(|(k, n)| k == kind && n == name)
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = (kind, name);
        false
    }
}

/// The debug hook at a shard's start: panics if it names `shard`.
pub fn debug_panic_at_start(shard: usize) {
    if debug_panic_names("start", &shard.to_string()) {
        panic!("NARAD_DEBUG_PANIC: shard {shard} panics at its start");
    }
}

/// The debug hook `NARAD_DEBUG_RECOVERY_DELAY_MS=<shard>:<ms>` (debug builds
/// only): that shard waits this long before it recovers its storage, so tests
/// can see a node whose shards are not all recovered yet.
pub async fn debug_recovery_delay(shard: usize) {
    #[cfg(debug_assertions)]
    {
        let hook = std::env::var("NARAD_DEBUG_RECOVERY_DELAY_MS").ok();
        let delay = hook.as_deref().and_then(|hook| {
            let (which, ms) = hook.split_once(':')?;
            (which.parse::<usize>().ok()? == shard).then_some(ms.parse::<u64>().ok()?)
        });
        if let Some(ms) = delay {
            tracing::warn!(shard, ms, "debug hook: this shard's recovery waits");
            narad_io::rt::sleep(std::time::Duration::from_millis(ms)).await;
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = shard;
}

/// The debug hook at a produce: panics if it names `topic`.
pub fn debug_panic_on_produce(topic: &str) {
    if debug_panic_names("produce", topic) {
        panic!("NARAD_DEBUG_PANIC: a produce to {topic:?}");
    }
}

/// The debug hook in the control thread, before a proposed create is logged:
/// panics if `create:<topic>` names the topic created.
pub fn debug_panic_on_propose(command: &crate::meta::Command) {
    if let crate::meta::Command::CreateTopic(record) = command {
        if debug_panic_names("create", &record.name) {
            panic!("NARAD_DEBUG_PANIC: a create of {:?}", record.name);
        }
    }
}

/// The debug hook in the reaper's retention lookup: panics if it names `topic`.
pub fn debug_panic_on_retention(topic: &str) {
    if debug_panic_names("retention", topic) {
        panic!("NARAD_DEBUG_PANIC: the retention of {topic:?}");
    }
}

/// The debug hook in a delete, between the applied delete and setting its data
/// aside: panics if it names `topic`.
pub fn debug_panic_on_delete(topic: &str) {
    if debug_panic_names("delete", topic) {
        panic!("NARAD_DEBUG_PANIC: a delete of {topic:?}");
    }
}
