//! Socket readiness for one shard: one edge-triggered epoll set per thread, read
//! in batches by a driver task, instead of one io_uring poll per socket read.
//!
//! Why: glommio waits for a readable socket by arming an io_uring poll each time a
//! read comes back short. When the peer's bytes arrive (on the core that runs the
//! peer, for a loopback client, or that takes the NIC's interrupt), the poll's
//! completion is queued as task work for the shard's thread, and the kernel sends
//! that core an inter-processor interrupt to run it. That is one submission and
//! one interrupt per request: a produce run on one shard counted about one
//! rescheduling interrupt per message, and a profile put an eighth of the shard's
//! time in taking them.
//!
//! How: every socket of the shard is registered once in the thread's epoll set,
//! edge-triggered, for both directions, and never modified. A [`Source`] keeps
//! what the last edges said (readable, writable, ended) and the task waiting on
//! each direction. A read shorter than its buffer drained the socket's queue (TCP
//! hands over everything it holds), so the socket is marked not readable without a
//! failing read; the next byte raises a new edge. The peer's close is the
//! exception: once an edge said it came, the socket stays readable, since the end
//! of the stream may sit behind a short read's bytes with no edge left to come.
//!
//! The driver task takes the events with `epoll_wait` and a zero timeout, marks
//! the sources and wakes their tasks. When the set has nothing ready it waits for
//! the epoll descriptor itself to become readable, through the shard's reactor:
//! that is one io_uring poll per burst of activity instead of one per read, and
//! while the shard is busy the kernel only appends to the epoll set's ready list,
//! which interrupts nobody. glommio 0.9 has no public way to poll an arbitrary
//! descriptor, so [`epoll_readable`] borrows its stream type for that: a stream
//! made from a descriptor arms a poll on it at once, and its first read waits for
//! that poll without touching the descriptor. The unit test
//! `the_driver_sleeps_while_nothing_is_ready` fails if a glommio upgrade changes
//! this into a busy loop.
//!
//! Tasks are woken through their own wakers; nothing here is shared between
//! threads. A set belongs to one executor: the first registration on an executor
//! makes it and starts its driver, and the driver ends when the last registration
//! is dropped (an eventfd in the set wakes it to see that), so a later
//! registration starts a new one. An executor that ends with registrations still
//! alive (in tasks it never finished) leaves its set behind; the next executor on
//! the thread makes its own.
//!
//! Known limit: TCP stops a read at urgent data, so a peer that sends `MSG_OOB`
//! can have its read come back short with bytes still queued, and its connection
//! then waits for its next byte or for the server's read timeout. Only that peer
//! is affected.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use futures_lite::io::AsyncRead;

/// Events taken from the kernel per `epoll_wait`.
const EVENTS_PER_WAIT: usize = 256;

/// The most slices one `sendmsg` takes on Linux (`UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

thread_local! {
    static SET: RefCell<Option<Rc<Set>>> = const { RefCell::new(None) };
}

/// A registered socket's readiness and the tasks waiting on it.
#[derive(Default)]
pub struct Source {
    readable: Cell<bool>,
    /// The peer closed or the connection failed: what is left to read ends
    /// without a new edge, so the socket stays readable from now on.
    ended: Cell<bool>,
    writable: Cell<bool>,
    reader: RefCell<Option<Waker>>,
    writer: RefCell<Option<Waker>>,
    /// Told when the end comes, whether or not anyone is reading then.
    end_watch: RefCell<Option<crate::net::PeerEnd>>,
}

impl Source {
    fn park(waiting: &RefCell<Option<Waker>>, cx: &Context<'_>) {
        let mut waiting = waiting.borrow_mut();
        match waiting.as_ref() {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => *waiting = Some(cx.waker().clone()),
        }
    }

    fn wake(waiting: &RefCell<Option<Waker>>) {
        let waker = waiting.borrow_mut().take();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Applies one epoll event's flags.
    fn mark(&self, events: u32) {
        let ended = (libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32;
        if events & (libc::EPOLLIN as u32 | ended) != 0 {
            self.readable.set(true);
            if events & ended != 0 {
                self.ended.set(true);
                if let Some(end) = self.end_watch.borrow().as_ref() {
                    end.set();
                }
            }
            Source::wake(&self.reader);
        }
        if events & (libc::EPOLLOUT | libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
            self.writable.set(true);
            Source::wake(&self.writer);
        }
    }

    /// Waits until the socket may have something to read (a connection to accept,
    /// for a listening socket). Call again after a read that found nothing.
    pub fn poll_readable(&self, cx: &Context<'_>) -> Poll<()> {
        if self.readable.get() {
            Poll::Ready(())
        } else {
            Source::park(&self.reader, cx);
            Poll::Pending
        }
    }

    /// Has `end` told when the peer's end (or a failure) comes, from the edge
    /// that says so: a reader need not be waiting.
    pub fn watch_end(&self, end: crate::net::PeerEnd) {
        if self.ended.get() {
            end.set();
        }
        *self.end_watch.borrow_mut() = Some(end);
    }

    /// Records that a read found nothing: the next edge will say when to try again.
    pub fn read_found_nothing(&self, cx: &Context<'_>) {
        self.readable.set(false);
        Source::park(&self.reader, cx);
    }

    /// Reads from `fd` into `buf` when the last edges say there may be bytes.
    pub fn poll_recv(
        &self,
        fd: RawFd,
        cx: &Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        // SAFETY: an initialised buffer is also a valid place for bytes to land.
        let spare = unsafe { &mut *(buf as *mut [u8] as *mut [MaybeUninit<u8>]) };
        self.poll_recv_uninit(fd, cx, spare)
    }

    /// Like [`Source::poll_recv`], into memory that need not be initialised: the
    /// kernel only writes it. The first `n` bytes of `buf` are initialised when
    /// this returns `Ready(Ok(n))`.
    pub fn poll_recv_uninit(
        &self,
        fd: RawFd,
        cx: &Context<'_>,
        buf: &mut [MaybeUninit<u8>],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if !self.readable.get() {
            Source::park(&self.reader, cx);
            return Poll::Pending;
        }
        // SAFETY: `buf` is writable for its length; recv writes at most that
        // many bytes and reads none.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                self.read_found_nothing(cx);
                return Poll::Pending;
            }
            return Poll::Ready(Err(e));
        }
        let n = n as usize;
        if n > 0 && n < buf.len() && !self.ended.get() {
            // The queue is drained: the next byte (or the peer's close) raises a
            // new edge. A close that came with these bytes raised its edge
            // already, hence `ended`.
            self.readable.set(false);
        }
        Poll::Ready(Ok(n))
    }

    /// Writes `buf` to `fd` when the last edges say there may be room.
    pub fn poll_send(&self, fd: RawFd, cx: &Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_send_vectored(fd, cx, &[io::IoSlice::new(buf)])
    }

    /// Like [`Source::poll_send`], gathering `bufs` in order into one `sendmsg`,
    /// so that a response's head and its body leave in one system call without
    /// first being copied together.
    pub fn poll_send_vectored(
        &self,
        fd: RawFd,
        cx: &Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if !self.writable.get() {
            Source::park(&self.writer, cx);
            return Poll::Pending;
        }
        // More than IOV_MAX slices would fail with EINVAL; the caller gets a
        // short write and sends the rest next.
        let bufs = &bufs[..bufs.len().min(IOV_MAX)];
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        // SAFETY: an all-zero msghdr is valid (no name, no control data).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        // IoSlice is ABI-compatible with iovec, and the kernel only reads them.
        msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = bufs.len() as _;
        // SAFETY: `msg` points at `bufs`, which are readable for their lengths
        // and outlive the call.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                self.writable.set(false);
                Source::park(&self.writer, cx);
                return Poll::Pending;
            }
            return Poll::Ready(Err(e));
        }
        let n = n as usize;
        if n < len {
            // The send buffer is full: wait for the edge that says it has room.
            self.writable.set(false);
        }
        Poll::Ready(Ok(n))
    }
}

/// A socket's place in its thread's epoll set. Dropping it takes the socket out
/// of the set; drop it before the socket's descriptor closes.
pub struct Registration {
    source: Rc<Source>,
    token: usize,
    fd: RawFd,
    set: Rc<Set>,
}

impl Registration {
    /// Registers `fd` (a non-blocking socket) in this thread's set, edge-triggered
    /// for both directions. Call on a glommio executor: the first registration of
    /// an executor starts its driver task.
    pub fn new(fd: RawFd) -> io::Result<Registration> {
        let set = Set::current()?;
        let (token, source) = set.sources.register(fd)?;
        set.registered.set(set.registered.get() + 1);
        // Counted first: a driver finding nothing registered ends.
        set.ensure_driven();
        Ok(Registration {
            source,
            token,
            fd,
            set,
        })
    }

    /// The socket's readiness.
    pub fn source(&self) -> &Source {
        &self.source
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.set.sources.remove(self.token, self.fd);
        let left = self.set.registered.get() - 1;
        self.set.registered.set(left);
        if left == 0 {
            self.set.kick();
        }
    }
}

/// An epoll set and the sources registered in it, for any event loop that takes
/// its events: the shard's driver task below, or a thread of its own.
pub struct EpollSet {
    epoll: OwnedFd,
    sources: RefCell<Vec<Option<Rc<Source>>>>,
    free: RefCell<Vec<usize>>,
}

impl EpollSet {
    /// A new, empty set.
    pub fn new() -> io::Result<EpollSet> {
        // SAFETY: epoll_create1 takes no pointers; a non-negative result is a
        // descriptor we now own.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(EpollSet {
            // SAFETY: see above.
            epoll: unsafe { OwnedFd::from_raw_fd(fd) },
            sources: RefCell::new(Vec::new()),
            free: RefCell::new(Vec::new()),
        })
    }

    /// The epoll descriptor, to wait on.
    pub fn fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Registers `fd` (a non-blocking socket), edge-triggered for both
    /// directions, and returns its token and its readiness.
    pub fn register(&self, fd: RawFd) -> io::Result<(usize, Rc<Source>)> {
        // Optimistic: an accepted socket usually holds its first request, and has
        // room to answer it. A read or write that finds otherwise corrects this.
        let source = Rc::new(Source {
            readable: Cell::new(true),
            writable: Cell::new(true),
            ..Source::default()
        });
        let token = match self.free.borrow_mut().pop() {
            Some(token) => {
                self.sources.borrow_mut()[token] = Some(source.clone());
                token
            }
            None => {
                let mut sources = self.sources.borrow_mut();
                sources.push(Some(source.clone()));
                sources.len() - 1
            }
        };
        let mut event = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32,
            u64: token as u64,
        };
        // SAFETY: `event` is a valid epoll_event for the duration of the call.
        let rc = unsafe { libc::epoll_ctl(self.fd(), libc::EPOLL_CTL_ADD, fd, &mut event) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            self.deregister(token);
            return Err(e);
        }
        Ok((token, source))
    }

    /// Takes `fd` (as `token`) out of the set and forgets its source: a socket
    /// kept open by a dup'd descriptor (a lingering close) stays in the set
    /// after this one closes, its events going to the next owner of the token.
    pub fn remove(&self, token: usize, fd: RawFd) {
        // SAFETY: DEL ignores the event pointer; a missing `fd` fails harmlessly.
        unsafe { libc::epoll_ctl(self.fd(), libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
        self.deregister(token);
    }

    /// Forgets the source of `token`, whose socket is about to close: only for
    /// a socket no other descriptor holds open (else see [`EpollSet::remove`]).
    pub fn deregister(&self, token: usize) {
        self.sources.borrow_mut()[token] = None;
        self.free.borrow_mut().push(token);
    }

    /// Marks the sources of `events` (from a wait on [`EpollSet::fd`]) and wakes
    /// their tasks.
    pub fn dispatch(&self, events: &[libc::epoll_event]) {
        for event in events {
            let flags = event.events;
            let source = self
                .sources
                .borrow()
                .get(event.u64 as usize)
                .cloned()
                .flatten();
            if let Some(source) = source {
                source.mark(flags);
            }
        }
    }
}

/// The token of the set's own eventfd, which no socket gets.
const KICK_TOKEN: u64 = u64::MAX;

/// How long the driver sleeps before trying again when it cannot make its wait
/// (no descriptor left for it): a degraded poll, not a failure.
const WAIT_RETRY: std::time::Duration = std::time::Duration::from_millis(1);

/// An executor's set, and whether a driver task takes its events.
struct Set {
    sources: EpollSet,
    /// The executor whose driver takes the events.
    executor: usize,
    /// Written when the last registration goes, so that the driver wakes and ends.
    kick: OwnedFd,
    /// Live registrations.
    registered: Cell<usize>,
    /// Whether a driver task runs; cleared when it ends or is dropped.
    driven: Cell<bool>,
    /// Times the driver armed a wait on the epoll descriptor (for tests).
    waits: Cell<u64>,
}

impl Set {
    /// The current executor's set.
    fn current() -> io::Result<Rc<Set>> {
        let executor = glommio::executor().id();
        SET.with(|slot| {
            let mut slot = slot.borrow_mut();
            match slot.as_ref() {
                Some(set) if set.executor == executor => Ok(set.clone()),
                _ => {
                    let set = Rc::new(Set::new(executor)?);
                    *slot = Some(set.clone());
                    Ok(set)
                }
            }
        })
    }

    /// Starts a driver unless one runs. The driver may run before this returns.
    fn ensure_driven(self: &Rc<Self>) {
        if !self.driven.replace(true) {
            glommio::spawn_local(drive(Driven(self.clone()))).detach();
        }
    }

    fn new(executor: usize) -> io::Result<Set> {
        let sources = EpollSet::new()?;
        // SAFETY: eventfd takes no pointers; a non-negative result is a
        // descriptor we now own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: see above.
        let kick = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut event = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLET) as u32,
            u64: KICK_TOKEN,
        };
        // SAFETY: `event` is a valid epoll_event for the duration of the call.
        let rc = unsafe {
            libc::epoll_ctl(
                sources.fd(),
                libc::EPOLL_CTL_ADD,
                kick.as_raw_fd(),
                &mut event,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Set {
            sources,
            executor,
            kick,
            registered: Cell::new(0),
            driven: Cell::new(false),
            waits: Cell::new(0),
        })
    }

    /// Wakes the driver (each write raises a new edge on the eventfd).
    fn kick(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: `one` is readable for 8 bytes. A failure (the counter full,
        // after 2^64 kicks) leaves an edge pending anyway.
        let _ = unsafe { libc::write(self.kick.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Takes the events ready now, marks their sources and wakes their tasks.
    /// Returns how many were taken.
    fn take_ready(&self, events: &mut [libc::epoll_event]) -> usize {
        let n = loop {
            // SAFETY: `events` is writable for `events.len()` entries.
            let n = unsafe {
                libc::epoll_wait(
                    self.sources.fd(),
                    events.as_mut_ptr(),
                    events.len() as i32,
                    0,
                )
            };
            if n >= 0 {
                break n as usize;
            }
            let e = io::Error::last_os_error();
            assert_eq!(
                e.kind(),
                io::ErrorKind::Interrupted,
                "epoll_wait on the shard's own set failed: {e}"
            );
        };
        self.sources.dispatch(&events[..n]);
        n
    }
}

/// Clears [`Set::driven`] when the driver task ends or is dropped.
struct Driven(Rc<Set>);

impl Drop for Driven {
    fn drop(&mut self) {
        self.0.driven.set(false);
    }
}

async fn drive(driven: Driven) {
    let set = &driven.0;
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS_PER_WAIT];
    loop {
        while set.take_ready(&mut events) == events.len() {
            // A flood: let the tasks just woken run before taking more.
            futures_lite::future::yield_now().await;
        }
        if set.registered.get() == 0 {
            return;
        }
        set.waits.set(set.waits.get() + 1);
        if let Err(e) = epoll_readable(set.sources.fd()).await {
            // Out of descriptors for the wait: the accept loop backs off, and
            // the sockets that exist are served by looking again shortly.
            tracing::warn!(error = %e, "cannot arm the wait on the socket set; polling it");
            glommio::timer::sleep(WAIT_RETRY).await;
        }
    }
}

/// Resolves once the epoll set `epoll` has something ready (or on a spurious
/// wake-up, which costs one empty `epoll_wait`).
async fn epoll_readable(epoll: RawFd) -> io::Result<()> {
    // SAFETY: F_DUPFD_CLOEXEC takes no pointers; a non-negative result is a new
    // descriptor we own. It refers to the same epoll set, and closing it leaves
    // the set and its registrations alone.
    let dup = unsafe { libc::fcntl(epoll, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `dup` is ours and given up here. glommio arms an io_uring poll for
    // readability on it when the stream is made; the stream is never read from,
    // only polled once to wait for that poll (see the module doc).
    let mut bell = unsafe { glommio::net::UnixStream::from_raw_fd(dup) };
    let mut waited = false;
    poll_fn(|cx| {
        if waited {
            return Poll::Ready(());
        }
        waited = true;
        match Pin::new(&mut bell).poll_read(cx, &mut []) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(_) => Poll::Ready(()),
        }
    })
    .await;
    Ok(())
}

/// How many times this thread's driver has gone to sleep on its set (for tests).
#[cfg(test)]
fn waits() -> u64 {
    SET.with(|s| s.borrow().as_ref().map_or(0, |s| s.waits.get()))
}

#[cfg(test)]
mod tests;
