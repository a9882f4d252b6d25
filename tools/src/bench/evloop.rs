//! The generator's event loop: one thread, one edge-triggered epoll set, a
//! timer map, and a run queue of tasks.
//!
//! Why not the broker's runtime (glommio): the generator must cost less CPU
//! per request than `wrk`, and nearly all of a request's cost is system calls.
//! glommio waits for a readable socket by arming an io_uring poll for every
//! read: one submission per request, and a completion delivered as task work
//! that interrupts whatever the thread is doing (an inter-processor interrupt
//! and a signal-return path per request), besides reading the clock on each
//! submission. Profiles of `narad bench --mode ping` put a quarter of the
//! generator's time there. Why not tokio either: it keeps a socket readable
//! until a read fails with `EAGAIN`, so each request pays a failed read.
//!
//! What this loop does per request instead: the request's `send`, the
//! response's `recv`, and a share of one `epoll_wait` that reports every
//! connection that became readable meanwhile. The sockets' readiness is the
//! broker's own (`narad_io::readiness`, whose doc has the rules): registered
//! once, edge-triggered, and a short read means drained. `wrk` makes the same
//! `write` and `read` plus two `epoll_ctl` calls per request.
//!
//! Timers are a map ordered by deadline; the loop sleeps in `epoll_pwait2`
//! with a nanosecond timeout (falling back to `epoll_wait`, rounded up to the
//! next millisecond, on kernels without it), so an open-loop schedule sends
//! on time.
//!
//! Tasks are `!Send` futures in a slab, polled on the calling thread. A
//! task's waker is built once, when it is spawned; waking it puts the task's
//! slot on the run queue once until it is polled. The queue sits behind a
//! mutex only because a `Waker` must be `Send`: nothing here wakes from
//! another thread, so the lock is never contended.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use futures_lite::io::{AsyncRead, AsyncWrite};
use narad_io::readiness::{EpollSet, Source};

/// Events taken from the kernel per wait.
const EVENTS_PER_WAIT: usize = 256;

thread_local! {
    static CORE: RefCell<Option<Rc<Core>>> = const { RefCell::new(None) };
}

fn core() -> Rc<Core> {
    CORE.with(|c| {
        c.borrow()
            .clone()
            .expect("called outside the generator's event loop (evloop::run)")
    })
}

type Task = Pin<Box<dyn Future<Output = ()>>>;

struct Slot {
    /// `None` while the task is being polled, or once it finished.
    future: Option<Task>,
    waker: Arc<TaskWaker>,
    live: bool,
}

/// Slots woken since the loop last took them.
#[derive(Default)]
struct RunQueue {
    slots: Mutex<Vec<usize>>,
}

struct TaskWaker {
    slot: usize,
    queued: AtomicBool,
    queue: Arc<RunQueue>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.queue
                .slots
                .lock()
                .expect("nothing panics holding it")
                .push(self.slot);
        }
    }
}

struct Core {
    sockets: EpollSet,
    tasks: RefCell<Vec<Slot>>,
    free_tasks: RefCell<Vec<usize>>,
    queue: Arc<RunQueue>,
    /// Each timer's waker, and whether a Ctrl-C cuts it short ([`pause`]).
    timers: RefCell<BTreeMap<(Instant, u64), (Waker, bool)>>,
    timer_seq: Cell<u64>,
    /// When the loop first saw the run interrupted, the timers registered
    /// by then, and whether their grace ran out ([`Core::on_interrupt`]).
    interrupt: Cell<Option<(Instant, u64, bool)>>,
    /// Cleared when the kernel has no `epoll_pwait2`.
    precise_wait: Cell<bool>,
}

impl Core {
    fn new() -> io::Result<Core> {
        Ok(Core {
            sockets: EpollSet::new()?,
            tasks: RefCell::new(Vec::new()),
            free_tasks: RefCell::new(Vec::new()),
            queue: Arc::new(RunQueue::default()),
            timers: RefCell::new(BTreeMap::new()),
            timer_seq: Cell::new(0),
            interrupt: Cell::new(None),
            precise_wait: Cell::new(true),
        })
    }

    fn spawn(&self, future: Task) {
        let slot = self.free_tasks.borrow_mut().pop();
        let mut tasks = self.tasks.borrow_mut();
        let slot = slot.unwrap_or_else(|| {
            let waker = Arc::new(TaskWaker {
                slot: tasks.len(),
                queued: AtomicBool::new(false),
                queue: self.queue.clone(),
            });
            tasks.push(Slot {
                future: None,
                waker,
                live: false,
            });
            tasks.len() - 1
        });
        let entry = &mut tasks[slot];
        entry.future = Some(future);
        entry.live = true;
        entry.waker.wake_by_ref();
    }

    /// Polls every task woken so far; returns whether any was.
    fn run_woken(&self, woken: &mut Vec<usize>) -> bool {
        std::mem::swap(
            &mut *self.queue.slots.lock().expect("nothing panics holding it"),
            woken,
        );
        let any = !woken.is_empty();
        for &slot in woken.iter() {
            let (future, waker) = {
                let mut tasks = self.tasks.borrow_mut();
                let entry = &mut tasks[slot];
                entry.waker.queued.store(false, Ordering::Release);
                match entry.future.take() {
                    Some(future) => (future, entry.waker.clone()),
                    // Finished, or a stale wake of a reused slot.
                    None => continue,
                }
            };
            let mut future = future;
            let waker = Waker::from(waker);
            let done = future
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_ready();
            let mut tasks = self.tasks.borrow_mut();
            if done {
                tasks[slot].live = false;
                self.free_tasks.borrow_mut().push(slot);
            } else {
                tasks[slot].future = Some(future);
            }
        }
        woken.clear();
        any
    }

    /// Wakes the timers that are due; returns the next deadline.
    fn fire_timers(&self, now: Instant) -> Option<Instant> {
        let mut timers = self.timers.borrow_mut();
        while let Some(entry) = timers.first_entry() {
            if entry.key().0 > now {
                return Some(entry.key().0);
            }
            entry.remove().0.wake();
        }
        None
    }

    /// A Ctrl-C ends a run early (`super::interrupted`): at once, the waits of
    /// the schedule ([`pause`]) end; after [`INTERRUPT_GRACE`], so do the
    /// timeouts of requests still unanswered then (they fail as transport
    /// errors), so a server that does not answer cannot hold the run for the
    /// whole `--timeout`. Timers registered after the interrupt (the requests
    /// that delete a fresh topic) keep their time. Returns the grace's end
    /// while it runs, for the loop's wait.
    fn on_interrupt(&self, now: Instant) -> Option<Instant> {
        if !super::interrupted() {
            return None;
        }
        let mut timers = self.timers.borrow_mut();
        match self.interrupt.get() {
            None => {
                self.interrupt.set(Some((now, self.timer_seq.get(), false)));
                timers.retain(|_, (waker, cut_short)| {
                    if *cut_short {
                        waker.wake_by_ref();
                    }
                    !*cut_short
                });
                Some(now + INTERRUPT_GRACE)
            }
            Some((at, _, false)) if now < at + INTERRUPT_GRACE => Some(at + INTERRUPT_GRACE),
            Some((at, before, false)) => {
                self.interrupt.set(Some((at, before, true)));
                timers.retain(|&(_, seq), (waker, _)| {
                    if seq < before {
                        waker.wake_by_ref();
                    }
                    seq >= before
                });
                None
            }
            Some((_, _, true)) => None,
        }
    }

    /// Waits for socket events until `deadline` (`None`: until one comes;
    /// a past deadline: just looks) and marks the sockets ready; `now` is the
    /// current time.
    fn wait(
        &self,
        events: &mut [libc::epoll_event],
        deadline: Option<Instant>,
        now: Instant,
    ) -> io::Result<()> {
        let timeout = deadline.map(|d| d.saturating_duration_since(now));
        let n = self.epoll_wait(events, timeout)?;
        self.sockets.dispatch(&events[..n]);
        Ok(())
    }

    fn epoll_wait(
        &self,
        events: &mut [libc::epoll_event],
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        let fd = self.sockets.fd();
        let max = events.len() as i32;
        loop {
            let n = if self.precise_wait.get() {
                let spec = timeout.map(|t| libc::timespec {
                    tv_sec: t.as_secs() as libc::time_t,
                    tv_nsec: t.subsec_nanos() as libc::c_long,
                });
                let spec_ptr = spec.as_ref().map_or(std::ptr::null(), |s| s as *const _);
                // SAFETY: `events` is writable for `max` entries, `spec_ptr`
                // is null or points at a live timespec, and a null sigmask
                // leaves the mask alone.
                unsafe {
                    libc::epoll_pwait2(fd, events.as_mut_ptr(), max, spec_ptr, std::ptr::null())
                }
            } else {
                let ms = timeout.map_or(-1, |t| {
                    // Rounded up: waking early would spin until the deadline.
                    i32::try_from(t.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX)
                });
                // SAFETY: `events` is writable for `max` entries.
                unsafe { libc::epoll_wait(fd, events.as_mut_ptr(), max, ms) }
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => return Ok(0),
                Some(libc::ENOSYS) if self.precise_wait.get() => self.precise_wait.set(false),
                _ => return Err(e),
            }
        }
    }
}

/// Runs `future` to completion on a new event loop in this thread and
/// returns its output. Tasks it spawned and left running are dropped with the
/// loop.
pub fn run<T: 'static>(future: impl Future<Output = T> + 'static) -> Result<T, String> {
    let core = Rc::new(Core::new().map_err(|e| format!("cannot create an epoll set: {e}"))?);
    let previous = CORE.with(|c| c.borrow_mut().replace(core.clone()));
    assert!(previous.is_none(), "one event loop per thread at a time");
    let result = drive(&core, future);
    CORE.with(|c| c.borrow_mut().take());
    // Drop the tasks left (and the sockets and wakers they hold) before the loop.
    let tasks = std::mem::take(&mut *core.tasks.borrow_mut());
    drop(tasks);
    result
}

fn drive<T: 'static>(core: &Core, future: impl Future<Output = T> + 'static) -> Result<T, String> {
    let main = spawn(future);
    let mut woken = Vec::new();
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS_PER_WAIT];
    loop {
        core.run_woken(&mut woken);
        if let Some(output) = main.state.borrow_mut().output.take() {
            return Ok(output);
        }
        // One clock read a turn: firing the timers takes no time to speak of,
        // so the wait's timeout counts from the same instant.
        let now = Instant::now();
        let grace = core.on_interrupt(now);
        let next_timer = match (core.fire_timers(now), grace) {
            (Some(timer), Some(grace)) => Some(timer.min(grace)),
            (timer, grace) => timer.or(grace),
        };
        let busy = !core.queue.slots.lock().expect("not poisoned").is_empty();
        let deadline = if busy { Some(now) } else { next_timer };
        core.wait(&mut events, deadline, now)
            .map_err(|e| format!("epoll_wait failed: {e}"))?;
    }
}

/// Refuses a CPU the process may not run on (one the machine lacks, or
/// outside its `taskset` or cgroup), naming the ones it may.
pub fn may_run_on(cpus: &[usize]) -> Result<(), String> {
    let set_bytes = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes `set_bytes`
    // bytes of it, and CPU_ISSET reads within it after the bound check.
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, set_bytes, &mut allowed) != 0 {
            return Err(format!(
                "cannot read the CPUs this process may run on: {}",
                io::Error::last_os_error()
            ));
        }
        let allowed_cpu = |cpu: usize| cpu < 8 * set_bytes && libc::CPU_ISSET(cpu, &allowed);
        if let Some(&cpu) = cpus.iter().find(|&&cpu| !allowed_cpu(cpu)) {
            let listed: Vec<String> = (0..8 * set_bytes)
                .filter(|&c| allowed_cpu(c))
                .map(|c| c.to_string())
                .collect();
            return Err(format!(
                "CPU {cpu} is not one this process may run on (it may run on {})",
                listed.join(",")
            ));
        }
    }
    Ok(())
}

/// Pins the calling thread to `cpu`, one [`may_run_on`] allows.
pub fn pin_thread_to(cpu: usize) -> Result<(), String> {
    may_run_on(&[cpu])?;
    // SAFETY: cpu_set_t is plain data; CPU_SET writes within it (the CPU was
    // found in the allowed set, so it is in bounds), and sched_setaffinity
    // reads `size_of` bytes of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(format!(
                "cannot pin to CPU {cpu}: {}",
                io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

struct JoinState<T> {
    output: Option<T>,
    waiter: Option<Waker>,
}

/// A spawned task's output, awaited.
pub struct JoinHandle<T> {
    state: Rc<RefCell<JoinState<T>>>,
}

impl<T> Future for JoinHandle<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let mut state = self.state.borrow_mut();
        match state.output.take() {
            Some(output) => Poll::Ready(output),
            None => {
                state.waiter = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Spawns a task on this thread's event loop.
pub fn spawn<T: 'static>(future: impl Future<Output = T> + 'static) -> JoinHandle<T> {
    let state = Rc::new(RefCell::new(JoinState {
        output: None,
        waiter: None,
    }));
    let done = state.clone();
    core().spawn(Box::pin(async move {
        let output = future.await;
        let mut done = done.borrow_mut();
        done.output = Some(output);
        if let Some(waiter) = done.waiter.take() {
            waiter.wake();
        }
    }));
    JoinHandle { state }
}

/// How long a Ctrl-C leaves requests in flight to be answered.
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);

/// Sleeps for `duration`, from the first poll (an `.await` right away, as
/// every caller does).
pub fn sleep(duration: Duration) -> Sleep {
    Sleep {
        duration,
        key: None,
        cut_short: false,
    }
}

/// [`sleep`] in a wait of the schedule (an open loop's next request), which
/// a Ctrl-C ends at once: the run stops without waiting for a request it will
/// not send.
pub fn pause(duration: Duration) -> Sleep {
    Sleep {
        duration,
        key: None,
        cut_short: true,
    }
}

/// The future [`sleep`] returns. It reads the clock once, at its first poll:
/// a request's timeout is polled at every wake of the request, and the timer
/// it registers leaves the map only when it fires (or the sleep is dropped),
/// so a later poll that finds it gone knows the deadline passed.
pub struct Sleep {
    duration: Duration,
    key: Option<(Instant, u64)>,
    /// Ended by a Ctrl-C ([`pause`]).
    cut_short: bool,
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let core = core();
        let mut timers = core.timers.borrow_mut();
        let key = match self.key {
            Some(key) => {
                // A wake removes the entry; a spurious poll finds it still there.
                match timers.get(&key) {
                    None => return Poll::Ready(()),
                    Some((w, _)) if w.will_wake(cx.waker()) => return Poll::Pending,
                    Some(_) => key,
                }
            }
            None => {
                if self.duration.is_zero() || (self.cut_short && super::interrupted()) {
                    return Poll::Ready(());
                }
                let seq = core.timer_seq.get();
                core.timer_seq.set(seq + 1);
                (Instant::now() + self.duration, seq)
            }
        };
        timers.insert(key, (cx.waker().clone(), self.cut_short));
        drop(timers);
        self.key = Some(key);
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            CORE.with(|c| {
                if let Some(core) = c.borrow().as_ref() {
                    core.timers.borrow_mut().remove(&key);
                }
            });
        }
    }
}

/// A TCP connection on the event loop, with Nagle's algorithm off.
pub struct Stream {
    socket: OwnedFd,
    source: Rc<Source>,
    token: usize,
}

/// Opens a TCP connection to `addr`.
pub async fn connect(addr: SocketAddr) -> io::Result<Stream> {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(addr),
        Type::STREAM.nonblocking().cloexec(),
        Some(Protocol::TCP),
    )?;
    socket.set_nodelay(true)?;
    let (token, source) = core().sockets.register(socket.as_raw_fd())?;
    let stream = Stream {
        socket: socket.into(),
        source,
        token,
    };
    let fd = stream.socket.as_raw_fd();
    let socket = socket2::SockRef::from(&stream.socket);
    match socket.connect(&SockAddr::from(addr)) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {
            // An empty send waits while the connection is being made, and
            // fails if it could not be.
            std::future::poll_fn(|cx| stream.source.poll_send(fd, cx, &[])).await?;
            if let Some(e) = socket.take_error()? {
                return Err(e);
            }
        }
        Err(e) => return Err(e),
    }
    Ok(stream)
}

impl Drop for Stream {
    fn drop(&mut self) {
        CORE.with(|c| {
            if let Some(core) = c.borrow().as_ref() {
                core.sockets.deregister(self.token);
            }
        });
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        self.source.poll_recv(self.socket.as_raw_fd(), cx, buf)
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.source.poll_send(self.socket.as_raw_fd(), cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        let socket = socket2::SockRef::from(&self.socket);
        Poll::Ready(socket.shutdown(std::net::Shutdown::Write))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::io::{AsyncReadExt, AsyncWriteExt};
    use std::io::{Read, Write};

    #[test]
    fn tasks_run_and_sleeps_end_in_deadline_order() {
        let order = run(async {
            let order = Rc::new(RefCell::new(Vec::new()));
            let started = Instant::now();
            let handles: Vec<_> = [30u64, 10, 20]
                .into_iter()
                .map(|ms| {
                    let order = order.clone();
                    spawn(async move {
                        sleep(Duration::from_millis(ms)).await;
                        order.borrow_mut().push(ms);
                        ms
                    })
                })
                .collect();
            let mut sum = 0;
            for handle in handles {
                sum += handle.await;
            }
            assert_eq!(sum, 60);
            let elapsed = started.elapsed();
            assert!(elapsed >= Duration::from_millis(30), "{elapsed:?}");
            assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
            let order = order.borrow().clone();
            order
        })
        .unwrap();
        assert_eq!(order, vec![10, 20, 30]);
    }

    #[test]
    fn a_dropped_sleep_leaves_no_timer_behind() {
        run(async {
            let long = sleep(Duration::from_secs(3600));
            let short = sleep(Duration::from_millis(5));
            let mut long = Box::pin(long);
            // Poll the long one once so it registers, then drop it.
            std::future::poll_fn(|cx| {
                let _ = long.as_mut().poll(cx);
                Poll::Ready(())
            })
            .await;
            assert_eq!(core().timers.borrow().len(), 1);
            drop(long);
            assert_eq!(core().timers.borrow().len(), 0);
            short.await;
        })
        .unwrap();
    }

    #[test]
    fn a_stream_carries_bytes_both_ways_past_a_full_send_buffer() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // Echoes back 8 MiB, far more than the socket buffers hold, so both
        // directions block and resume on their edges.
        const TOTAL: usize = 8 << 20;
        let echo = std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let mut buf = vec![0u8; 64 << 10];
            let mut seen = 0;
            while seen < TOTAL {
                let n = socket.read(&mut buf).unwrap();
                assert!(n > 0);
                socket.write_all(&buf[..n]).unwrap();
                seen += n;
            }
        });
        let received = run(async move {
            let stream = Rc::new(RefCell::new(connect(addr).await.unwrap()));
            let data: Vec<u8> = (0..TOTAL).map(|i| (i % 251) as u8).collect();
            let reader = {
                let stream = stream.clone();
                spawn(async move {
                    let mut got = Vec::with_capacity(TOTAL);
                    let mut buf = vec![0u8; 16 << 10];
                    while got.len() < TOTAL {
                        let n = std::future::poll_fn(|cx| {
                            Pin::new(&mut *stream.borrow_mut()).poll_read(cx, &mut buf)
                        })
                        .await
                        .unwrap();
                        assert!(n > 0, "early end after {} bytes", got.len());
                        got.extend_from_slice(&buf[..n]);
                    }
                    got
                })
            };
            let mut sent = 0;
            while sent < TOTAL {
                let n = std::future::poll_fn(|cx| {
                    Pin::new(&mut *stream.borrow_mut()).poll_write(cx, &data[sent..])
                })
                .await
                .unwrap();
                sent += n;
            }
            let got = reader.await;
            assert!(got == data, "the echo came back different");
            got.len()
        })
        .unwrap();
        echo.join().unwrap();
        assert_eq!(received, TOTAL);
    }

    #[test]
    fn a_closed_peer_reads_as_the_end_and_a_refused_connect_fails() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let closed = {
            let unused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            unused.local_addr().unwrap()
        };
        let server = std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let mut hi = [0u8; 2];
            socket.read_exact(&mut hi).unwrap();
            socket.write_all(b"bye").unwrap();
        });
        let (read, refused) = run(async move {
            let mut stream = connect(addr).await.unwrap();
            stream.write_all(b"hi").await.unwrap();
            let mut all = Vec::new();
            stream.read_to_end(&mut all).await.unwrap();
            (all, connect(closed).await)
        })
        .unwrap();
        server.join().unwrap();
        assert_eq!(read, b"bye");
        let e = refused.err().expect("nobody listens there");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
    }
}
