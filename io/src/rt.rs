//! The runtime seam: executors, timers, task spawning and the wall clock.
//!
//! Storage code asks this module for time and for background tasks so that the
//! rest of the code base never names glommio. Protocol state machines do not use it
//! at all: they take the time as an argument.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use glommio::task::JoinHandle;
pub use glommio::TaskQueueHandle;
pub use std::time::Instant;

/// Sleeps on the current executor's timer wheel.
pub async fn sleep(duration: Duration) {
    glommio::timer::sleep(duration).await;
}

/// Spawns a task on the current shard's executor.
pub fn spawn_local<T: 'static>(future: impl Future<Output = T> + 'static) -> JoinHandle<T> {
    glommio::spawn_local(future).detach()
}

/// Returns once the executor has polled its reactor, which is when it hands
/// the I/O queued since its last poll to the kernel: work done after this
/// cannot delay a request queued before it. The executor polls its reactor
/// only after every runnable task has run, so a task that wakes others and
/// then queues a request would otherwise leave the device idle while they run.
///
/// A timer due in one microsecond: the reactor fires timers as it polls, in
/// the same step as it submits, and a task woken by one runs after both.
pub async fn after_reactor_poll() {
    glommio::timer::sleep(Duration::from_micros(1)).await;
}

/// Yields to other tasks of this executor.
pub async fn yield_now() {
    glommio::yield_if_needed().await;
}

/// Runs `futures` at once on the calling task (no task is spawned) and returns
/// their outputs in their order: for a batch of I/O the device may overlap, such
/// as syncs of many files.
pub async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut running: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = running.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all_done = true;
        for (future, output) in running.iter_mut().zip(&mut outputs) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => all_done = false,
                }
            }
        }
        if all_done {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|output| output.expect("every future finished"))
        .collect()
}

/// Monotonic now.
pub fn now() -> Instant {
    Instant::now()
}

/// Wall-clock milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Runs `future` to completion on a new single-core executor in this thread (for
/// tests, tools and benchmarks). `pin_cpu` pins the executor to one CPU.
pub fn run_local<T: 'static>(
    pin_cpu: Option<usize>,
    future: impl Future<Output = T> + 'static,
) -> T {
    try_run_local(pin_cpu, future)
        .expect("cannot start an io_uring executor (see README: locked memory)")
}

/// Like [`run_local`], but a failure to start the executor (a CPU this process may
/// not use, no io_uring, too little locked memory) is an error for the caller to
/// report rather than a panic: for tools whose user picked the CPU.
pub fn try_run_local<T: 'static>(
    pin_cpu: Option<usize>,
    future: impl Future<Output = T> + 'static,
) -> Result<T, String> {
    let memlock = raise_memlock_limit();
    let placement = match pin_cpu {
        Some(cpu) => glommio::Placement::Fixed(cpu),
        None => glommio::Placement::Unbound,
    };
    // With CAP_IPC_LOCK (root, usually) the limit does not apply.
    let memlock = if can_lock_any_memory() {
        u64::MAX
    } else {
        memlock
    };
    let io_memory = io_memory_bytes(memlock, EXECUTORS.load(Ordering::Relaxed));
    let executor = glommio::LocalExecutorBuilder::new(placement)
        .io_memory(io_memory)
        .make()
        .map_err(|e| format!("cannot start an io_uring executor: {e}"))?;
    Ok(executor.run(async move {
        RUNNING.with(|running| running.set(true));
        let _running = Running;
        glommio::spawn_local(reactor_tick()).detach();
        future.await
    }))
}

/// Executors this process runs at once, as [`plan_executors`] said (1 unless
/// told): they share the locked-memory limit.
static EXECUTORS: AtomicUsize = AtomicUsize::new(1);

/// Tells the runtime how many executors the process will run at once, before
/// it starts them, so that each registers a share of I/O buffers the
/// locked-memory limit holds (see [`io_memory_bytes`]).
pub fn plan_executors(executors: usize) {
    EXECUTORS.store(executors.max(1), Ordering::Relaxed);
}

/// The I/O buffer memory each executor registers with its rings: the
/// runtime's 10 MiB, or less where the locked-memory limit cannot hold that
/// for every executor. Each executor's buffers are registered with its three
/// rings, each registration counted against the limit, and the rings take
/// some too: a quarter of its share. Over the limit the registration fails,
/// and the runtime goes on without registered buffers (and logs a raw error
/// for each executor, as it did under the common 8 MiB limit of a non-root
/// user). At least the runtime's smallest pool, 64 KiB.
pub fn io_memory_bytes(memlock_limit: u64, executors: usize) -> usize {
    const RUNTIME_DEFAULT: u64 = 10 << 20;
    const RUNTIME_MIN: u64 = 64 << 10;
    let share = memlock_limit / executors.max(1) as u64 / 4;
    (share.min(RUNTIME_DEFAULT) / 4096 * 4096).max(RUNTIME_MIN) as usize
}

/// Whether this process holds CAP_IPC_LOCK in its effective set (bit 14 of
/// `CapEff` in `/proc/self/status`), which lifts the locked-memory limit.
fn can_lock_any_memory() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    (status.lines())
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// The longest an executor sleeps without looking at its rings and queues.
pub const REACTOR_TICK: Duration = Duration::from_millis(100);

/// Keeps a timer armed on the executor, so that it never sleeps longer than
/// [`REACTOR_TICK`]: glommio 0.9's reactor can sleep through the completion
/// a task waits for. Seen at startup with 48 shards on 2 CPUs: a shard asleep
/// in `io_uring_enter` in the middle of its WAL recovery, with nothing left to
/// wake it, until anything interrupted the sleep (a debugger attaching) and it
/// went on at once; the node never got ready and a stop waited for it for
/// ever. A sleep bounded by a timer is the fix from outside the runtime: the
/// next turn picks up whatever was missed. It costs a wakeup per tick on an
/// idle executor (10 a second).
async fn reactor_tick() {
    loop {
        glommio::timer::sleep(REACTOR_TICK).await;
    }
}

thread_local! {
    /// Set while this thread's executor runs its main future: tasks may be
    /// spawned. Tasks still alive when it ends are dropped after, where a
    /// spawn would panic.
    static RUNNING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Clears [`RUNNING`] when the main future ends, or unwinds.
struct Running;

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.with(|running| running.set(false));
    }
}

/// Whether [`spawn_local`] may be called here: this thread's executor is
/// running its main future (not dropping what was left when it ended).
pub fn can_spawn() -> bool {
    RUNNING.with(std::cell::Cell::get)
}

/// The soft limit on open file descriptors (RLIMIT_NOFILE), or 1024 when it cannot
/// be read.
pub fn open_files_soft_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 1024;
    }
    limit.rlim_cur
}

/// Raises RLIMIT_MEMLOCK's soft limit to its hard limit: io_uring registers its
/// buffers in locked memory and runs slower without. Returns the soft limit now in
/// force, in bytes.
pub fn raise_memlock_limit() -> u64 {
    raise_soft_limit(libc::RLIMIT_MEMLOCK)
}

/// Raises RLIMIT_NOFILE's soft limit to its hard limit: every connection is a
/// descriptor, and the common soft default (1024) is below the default
/// `http.max_connections`. Returns the soft limit now in force.
pub fn raise_open_files_limit() -> u64 {
    raise_soft_limit(libc::RLIMIT_NOFILE)
}

/// Raises `resource`'s soft limit to its hard limit; returns the soft limit now
/// in force (0 if it cannot be read).
fn raise_soft_limit(resource: libc::__rlimit_resource_t) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(resource, &mut limit) != 0 {
            return 0;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(resource, &raised) == 0 {
                limit = raised;
            }
        }
    }
    limit.rlim_cur
}

/// A one-slot wake-up between tasks of one shard: [`Notify::notify`] marks it and
/// wakes the task waiting, if any; [`Notify::wait`] returns once it is marked and
/// clears the mark. One waiter at a time.
#[derive(Default)]
pub struct Notify {
    set: std::cell::Cell<bool>,
    waker: std::cell::RefCell<Option<std::task::Waker>>,
}

impl Notify {
    pub fn notify(&self) {
        self.set.set(true);
        if let Some(waker) = self.waker.borrow_mut().take() {
            waker.wake();
        }
    }

    /// Waits until notified since the last wait returned.
    pub async fn wait(&self) {
        std::future::poll_fn(|cx| {
            if self.set.replace(false) {
                return std::task::Poll::Ready(());
            }
            *self.waker.borrow_mut() = Some(cx.waker().clone());
            std::task::Poll::Pending
        })
        .await
    }
}

/// An async semaphore for tasks of one shard, fair in arrival order.
pub struct LocalSemaphore {
    semaphore: glommio::sync::Semaphore,
}

/// Held while a permit (or the lock) is taken.
pub struct LocalGuard<'a> {
    _permit: glommio::sync::Permit<'a>,
}

impl LocalSemaphore {
    /// A semaphore of `permits` permits.
    pub fn new(permits: u64) -> Self {
        LocalSemaphore {
            semaphore: glommio::sync::Semaphore::new(permits),
        }
    }

    /// Waits for a permit, held until the guard is dropped.
    pub async fn acquire(&self) -> LocalGuard<'_> {
        let permit = self
            .semaphore
            .acquire_permit(1)
            .await
            .expect("a local semaphore is never closed");
        LocalGuard { _permit: permit }
    }

    /// A permit if one is free and nobody waits for one, without waiting.
    pub fn try_acquire(&self) -> Option<LocalGuard<'_>> {
        let permit = self.semaphore.try_acquire_permit(1).ok()?;
        Some(LocalGuard { _permit: permit })
    }
}

/// An async lock for tasks of one shard (a semaphore of one), fair in arrival order.
pub struct LocalLock {
    semaphore: LocalSemaphore,
}

impl Default for LocalLock {
    fn default() -> Self {
        LocalLock {
            semaphore: LocalSemaphore::new(1),
        }
    }
}

impl LocalLock {
    /// Waits for the lock.
    pub async fn lock(&self) -> LocalGuard<'_> {
        self.semaphore.acquire().await
    }

    /// The lock if it is free and nobody waits for it, without waiting.
    pub fn try_lock(&self) -> Option<LocalGuard<'_>> {
        self.semaphore.try_acquire()
    }
}

#[cfg(test)]
mod tests {
    use super::join_all;
    use futures_lite::future::{block_on, yield_now};

    #[test]
    fn each_executor_registers_what_the_locked_memory_limit_holds() {
        use super::io_memory_bytes;
        // Unlimited (or large): the runtime's 10 MiB.
        assert_eq!(io_memory_bytes(u64::MAX, 64), 10 << 20);
        assert_eq!(io_memory_bytes(1 << 30, 2), 10 << 20);
        // A non-root user's 8 MiB over two shards: 1 MiB each (a quarter of
        // the share), so three registrations and the rings fit.
        assert_eq!(io_memory_bytes(8 << 20, 2), 1 << 20);
        assert_eq!(io_memory_bytes(8 << 20, 1), 2 << 20);
        // Page-aligned, and never below the runtime's smallest pool.
        assert_eq!(io_memory_bytes(8 << 20, 3) % 4096, 0);
        assert_eq!(io_memory_bytes(8 << 20, 48), 64 << 10);
    }

    #[test]
    fn join_all_runs_every_future_at_once_and_keeps_their_order() {
        let order = std::cell::RefCell::new(Vec::new());
        // The first takes the most turns: it finishes last but answers first.
        let futures = (0..5u32).map(|i| {
            let order = &order;
            async move {
                for _ in 0..(5 - i) {
                    yield_now().await;
                }
                order.borrow_mut().push(i);
                i * 10
            }
        });
        assert_eq!(block_on(join_all(futures)), [0, 10, 20, 30, 40]);
        // They ran together: the one with fewest turns ended first.
        assert_eq!(*order.borrow(), [4, 3, 2, 1, 0]);
        let none: Vec<std::future::Ready<u8>> = Vec::new();
        assert!(block_on(join_all(none)).is_empty());
    }
}
