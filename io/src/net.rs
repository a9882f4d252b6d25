//! Sockets for HTTP: listeners that share one port across shards, accepted
//! streams that hyper can drive, the timer hyper needs, and the wake-up that tells
//! a parked shard to stop.
//!
//! Which cores: the listening sockets are bound on the main thread, before any
//! shard starts, so that a bind failure (port in use, bad address) stops the node
//! at once with a clear message, and so that with port 0 one port is picked and
//! every shard then joins it. Each shard turns its own socket into a [`Listener`] on
//! its executor and owns it, and every [`Stream`] it accepts, outright: they are
//! `!Send` and never leave that core. The kernel spreads new connections over the
//! shards' sockets (`SO_REUSEPORT`), so no core hands connections to another.
//!
//! hyper is runtime-neutral: it reads and writes through its own `rt::Read` and
//! `rt::Write` traits and sleeps through `rt::Timer`. [`Stream`] implements the first
//! two over a non-blocking socket whose readiness comes from the shard's epoll set
//! ([`crate::readiness`], which says why not glommio's sockets), and [`ShardTimer`]
//! the third over the shard's timer wheel. hyper demands `Send + Sync` sleeps because it is written for work-stealing
//! runtimes; ours never move, and [`ShardTimer`] checks that they do not.
//!
//! [`stop_channel`] is how the main thread, which receives SIGINT and SIGTERM, wakes
//! every shard: one connected socket pair per shard. The shard awaits a read on its
//! end through glommio's reactor, so an idle shard sleeps until the
//! stop instead of polling a flag, and a main thread that dies also closes the pair
//! and so stops the shards.

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::io;
use std::mem::ManuallyDrop;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use crate::readiness::Registration;

mod exchange;
mod peer_end;
pub use exchange::{Exchange, ExchangeCell, ReadLimits};
pub use peer_end::PeerEnd;

use futures_lite::io::{AsyncRead, AsyncReadExt, AsyncWrite};

/// Pending connections the kernel queues per listening socket before it refuses.
pub const LISTEN_BACKLOG_MAX: i32 = 1024;

/// Binds `count` listening sockets on `addr`, all with `SO_REUSEPORT` so that the
/// kernel balances connections over them. With port 0 a free port is picked and
/// every socket binds it. Returns the sockets and the address they listen on.
///
/// `SO_REUSEPORT` would also let this group join the sockets of another process
/// of the same user already listening on the port (a second broker over another
/// data directory), and the kernel would then spread connections over two
/// brokers. So the port is first bound once without it: that bind fails with
/// `EADDRINUSE` if anything listens there, and, for port 0, picks the port.
pub fn bind_reuseport_group(
    addr: SocketAddr,
    count: usize,
) -> io::Result<(Vec<std::net::TcpListener>, SocketAddr)> {
    assert!(count > 0, "a node has at least one shard");
    match bind_group(addr, count) {
        // Every interface, on a host without IPv6: every IPv4 one.
        Err(e)
            if addr.ip() == std::net::Ipv6Addr::UNSPECIFIED
                && matches!(
                    e.raw_os_error(),
                    Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL)
                ) =>
        {
            let v4 = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), addr.port());
            bind_group(v4, count)
        }
        other => other,
    }
}

fn bind_group(
    addr: SocketAddr,
    count: usize,
) -> io::Result<(Vec<std::net::TcpListener>, SocketAddr)> {
    let bound = {
        let probe = new_socket(addr)?;
        // Only a listener of our own after a restart (TIME_WAIT) may be reused.
        probe.set_reuse_address(true)?;
        probe.bind(&addr.into())?;
        probe
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("bound a non-IP address"))?
    };
    let mut listeners = Vec::with_capacity(count);
    for _ in 0..count {
        listeners.push(bind_reuseport(bound)?);
    }
    assert_eq!(listeners.len(), count);
    Ok((listeners, bound))
}

fn new_socket(addr: SocketAddr) -> io::Result<socket2::Socket> {
    let domain = socket2::Domain::for_address(addr);
    let socket = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    if addr.ip() == std::net::Ipv6Addr::UNSPECIFIED {
        // `[::]` takes IPv4 connections too, whatever the host's default.
        socket.set_only_v6(false)?;
    }
    Ok(socket)
}

fn bind_reuseport(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = new_socket(addr)?;
    socket.set_reuse_port(true)?;
    // A restarted node must not wait for the previous one's TIME_WAIT sockets.
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG_MAX)?;
    Ok(socket.into())
}

/// One shard's listening socket, owned by that shard's executor.
pub struct Listener {
    // Declared before the socket: deregistered before the socket closes.
    registration: Registration,
    socket: OwnedFd,
}

impl Listener {
    /// Adopts a socket from [`bind_reuseport_group`]. Call on the shard's executor.
    pub fn adopt(socket: std::net::TcpListener) -> io::Result<Listener> {
        socket.set_nonblocking(true)?;
        let socket = OwnedFd::from(socket);
        let registration = Registration::new(socket.as_raw_fd())?;
        Ok(Listener {
            registration,
            socket,
        })
    }

    /// Waits for the next connection on this shard's socket.
    pub async fn accept(&self) -> io::Result<Stream> {
        let source = self.registration.source();
        let fd = poll_fn(|cx| loop {
            ready!(source.poll_readable(cx));
            match self.try_accept() {
                Ok(Some(fd)) => return Poll::Ready(Ok(fd)),
                Ok(None) => source.read_found_nothing(cx),
                Err(e) => return Poll::Ready(Err(e)),
            }
        })
        .await?;
        Stream::new(fd)
    }

    /// A connection the kernel has already queued on this socket, if any,
    /// without waiting: for a listener about to close, whose queued
    /// connections the close would reset.
    pub fn accept_queued(&self) -> io::Result<Option<Stream>> {
        self.try_accept()?.map(Stream::new).transpose()
    }

    /// One `accept4`: `None` when nothing is queued. A connection that failed
    /// before it was taken is passed over for the next.
    fn try_accept(&self) -> io::Result<Option<OwnedFd>> {
        loop {
            // SAFETY: null address pointers ask for no peer address; a
            // non-negative result is a new descriptor we own.
            let fd = unsafe {
                libc::accept4(
                    self.socket.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                )
            };
            if fd >= 0 {
                // SAFETY: see above.
                return Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }));
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => return Ok(None),
                // The connection was reset before we took it: take the next.
                io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted => {}
                _ if is_connection_error(&e) => {}
                _ => return Err(e),
            }
        }
    }
}

/// An error `accept` passes on from one pending connection, which accept(2)
/// says to retry like `EAGAIN`: it says nothing about the listening socket.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ENETDOWN
                | libc::EPROTO
                | libc::ENOPROTOOPT
                | libc::EHOSTDOWN
                | libc::ENONET
                | libc::EHOSTUNREACH
                | libc::EOPNOTSUPP
                | libc::ENETUNREACH
        )
    )
}

/// An accepted TCP connection, owned by the shard that accepted it. Its readiness
/// comes from the shard's epoll set ([`crate::readiness`]).
pub struct Stream {
    // Declared before the socket: deregistered before the socket closes.
    registration: Registration,
    socket: OwnedFd,
    /// See [`Stream::set_write_timeout`]; `None`: no bound.
    write_timeout: Cell<Option<Duration>>,
    /// Fires when a write that could not make progress has waited `write_timeout`.
    write_stall: Option<glommio::timer::Timer>,
    /// The most time one response may take to write, from its first byte (see
    /// [`Stream::set_response_write_max`]); `None`: no bound.
    response_write_max: Option<Duration>,
    /// When the bytes written since the peer last sent anything began.
    writing_since: Option<Instant>,
    /// See [`Stream::set_read_limits`]; `None`: reads wait for ever.
    read_limits: Option<ReadLimits>,
    /// When the bytes of the request now arriving began, if one is.
    request_started: Option<Instant>,
    /// Fires at the read deadline it was made for, which may be earlier than
    /// the deadline now (see [`Stream::read_timed_out`]).
    read_timer: Option<ReadTimer>,
    /// See [`Stream::linger_on_close`]; `None`: a drop closes at once.
    linger: Option<Linger>,
    /// The peer closed its side (a read or an edge saw the end) or the socket
    /// failed: nothing more will come to read, so a close need not linger. The
    /// handlers of this connection's requests watch it too.
    peer_end: PeerEnd,
}

/// The timer of a read waiting for the peer, with what it will wake.
struct ReadTimer {
    /// When it fires.
    at: Instant,
    timer: glommio::timer::Timer,
    /// The waker it was last polled with: the one it wakes.
    waker: Waker,
}

/// How long, and for how many bytes, a closed stream keeps reading.
#[derive(Clone, Copy, Debug)]
pub struct Linger {
    pub within: Duration,
    pub bytes_max: usize,
}

impl Stream {
    fn new(socket: OwnedFd) -> io::Result<Stream> {
        let registration = Registration::new(socket.as_raw_fd())?;
        let peer_end = PeerEnd::default();
        registration.source().watch_end(peer_end.clone());
        Ok(Stream {
            registration,
            socket,
            write_timeout: Cell::new(None),
            write_stall: None,
            response_write_max: None,
            writing_since: None,
            read_limits: None,
            request_started: None,
            read_timer: None,
            linger: None,
            peer_end,
        })
    }

    /// Says when the peer has stopped sending (see [`PeerEnd`]).
    pub fn peer_end(&self) -> PeerEnd {
        self.peer_end.clone()
    }

    fn note_peer_done(&mut self) {
        self.peer_end.set();
    }

    /// Bounds the waits between requests (see [`ReadLimits`]).
    pub fn set_read_limits(&mut self, limits: ReadLimits) {
        self.read_limits = Some(limits);
    }

    /// When a read that finds nothing must give up, if ever.
    fn read_deadline(&self) -> Option<Instant> {
        let limits = self.read_limits.as_ref()?;
        match limits.exchange.get() {
            Exchange::Busy => None,
            Exchange::Idle { since, fresh: true } => Some(since + limits.head),
            Exchange::Idle {
                since,
                fresh: false,
            } => match self.request_started {
                Some(started) if started >= since => Some(started + limits.head),
                _ => Some(since + limits.idle),
            },
        }
    }

    /// Notes bytes that arrived between requests: the next request began.
    fn note_request_bytes(&mut self) {
        let Some(limits) = &self.read_limits else {
            return;
        };
        if let Exchange::Idle { since, .. } = limits.exchange.get() {
            if self.request_started.is_none_or(|started| started < since) {
                self.request_started = Some(Instant::now());
            }
        }
    }

    /// Whether a read that found nothing has waited past its deadline; if not,
    /// the read timer will wake the task at the deadline.
    ///
    /// The timer is kept across requests: a keep-alive connection's deadline
    /// moves later with each request, and a timer that will fire no later than
    /// the deadline, registered with this task's waker, wakes the task in time.
    /// So a request costs one clock read here, not a timer (a glommio timer
    /// re-registers itself with the reactor on every poll); the timer is made
    /// again only when it fired before the deadline it now guards, or when the
    /// deadline moves earlier than it.
    fn read_timed_out(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(deadline) = self.read_deadline() else {
            // Busy: the timer stays for the next wait; firing now it only
            // wakes the task once for nothing.
            if let Some(limits) = &self.read_limits {
                limits.exchange.parked_read.set(Some(cx.waker().clone()));
            }
            return false;
        };
        let now = Instant::now();
        if now >= deadline {
            return true;
        }
        if let Some(armed) = &mut self.read_timer {
            if armed.at <= deadline && now < armed.at {
                if !armed.waker.will_wake(cx.waker()) {
                    let _ = Pin::new(&mut armed.timer).poll(cx);
                    armed.waker = cx.waker().clone();
                }
                return false;
            }
        }
        let mut timer = glommio::timer::Timer::new(deadline - now);
        let fired = Pin::new(&mut timer).poll(cx).is_ready();
        self.read_timer = Some(ReadTimer {
            at: deadline,
            timer,
            waker: cx.waker().clone(),
        });
        fired
    }

    /// Makes a drop of this stream a lingering close when the peer may still be
    /// sending: the write side is shut (the peer reads the whole answer, then
    /// the end), and a task on this shard reads and discards what still comes
    /// until the peer closes, `linger.within` passes or `linger.bytes_max`
    /// bytes came. Closed at once instead, a socket with unread bytes, or one
    /// that receives more, answers with a reset, and a client still sending a
    /// body (one answered early: 413, 415, 503) would see the reset instead of
    /// the answer. Call on the shard's executor; the drop spawns there.
    pub fn linger_on_close(&mut self, linger: Linger) {
        self.linger = Some(linger);
    }

    /// Closes the stream lingering as [`Stream::linger_on_close`] describes,
    /// on this task: returns once the socket is closed.
    pub async fn close_lingering(mut self, linger: Linger) {
        self.linger = None;
        let socket = self.socket.try_clone();
        drop(self);
        if let Ok(socket) = socket {
            linger_then_close(socket, linger).await;
        }
    }

    /// Bounds the time spent writing one response, from its first byte: a write
    /// after `max` fails with `TimedOut`. [`Stream::set_write_timeout`] bounds
    /// each stall, but a client that reads a byte now and then never stalls a
    /// write that long, and could hold the connection for hours. A response is
    /// what is written between two reads that brought the peer's bytes.
    pub fn set_response_write_max(&mut self, max: Duration) {
        self.response_write_max = Some(max);
    }

    /// Disables Nagle's algorithm: responses are written whole, and a small one
    /// must not wait for the client's delayed ACK.
    pub fn set_nodelay(&self) -> io::Result<()> {
        socket2::SockRef::from(&self.socket).set_nodelay(true)
    }

    /// Fails any write that cannot make progress for `timeout` (a client that stopped
    /// reading), so a stalled peer cannot pin a connection slot forever.
    pub fn set_write_timeout(&self, timeout: Duration) -> io::Result<()> {
        self.write_timeout.set(Some(timeout));
        Ok(())
    }

    /// The client's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        socket2::SockRef::from(&self.socket)
            .peer_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("the peer has a non-IP address"))
    }

    fn recv_some(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        // SAFETY: an initialised buffer is also a valid place for bytes to land,
        // and the read only writes it.
        let spare = unsafe { &mut *(buf as *mut [u8] as *mut [MaybeUninit<u8>]) };
        self.recv_uninit(cx, spare)
    }

    fn recv_uninit(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut [MaybeUninit<u8>],
    ) -> Poll<io::Result<usize>> {
        let polled = self
            .registration
            .source()
            .poll_recv_uninit(self.socket.as_raw_fd(), cx, buf);
        let filled = match polled {
            Poll::Ready(Ok(filled)) => filled,
            Poll::Ready(Err(e)) => {
                self.note_peer_done();
                return Poll::Ready(Err(e));
            }
            Poll::Pending if self.read_timed_out(cx) => {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no request within the read limits",
                )));
            }
            Poll::Pending => return Poll::Pending,
        };
        if filled > 0 {
            self.note_request_bytes();
        }
        if filled == 0 && !buf.is_empty() {
            self.note_peer_done();
        }
        if filled > 0 {
            // The peer sent something: the next write starts a response.
            self.writing_since = None;
        }
        Poll::Ready(Ok(filled))
    }

    fn send_some(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.send_some_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn send_some_vectored(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(max) = self.response_write_max {
            let now = Instant::now();
            match self.writing_since {
                None => self.writing_since = Some(now),
                Some(since) if now.duration_since(since) > max => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the response took longer than its write limit to write",
                    )));
                }
                Some(_) => {}
            }
        }
        let sent = self
            .registration
            .source()
            .poll_send_vectored(self.socket.as_raw_fd(), cx, bufs);
        if sent.is_ready() {
            self.write_stall = None;
            return sent;
        }
        let Some(timeout) = self.write_timeout.get() else {
            return Poll::Pending;
        };
        let stall = self
            .write_stall
            .get_or_insert_with(|| glommio::timer::Timer::new(timeout));
        if Pin::new(stall).poll(cx).is_ready() {
            self.write_stall = None;
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the peer took no bytes for longer than the write timeout",
            )));
        }
        Poll::Pending
    }

    fn shutdown(&self) -> Poll<io::Result<()>> {
        match socket2::SockRef::from(&self.socket).shutdown(std::net::Shutdown::Write) {
            Err(e) if e.kind() != io::ErrorKind::NotConnected => Poll::Ready(Err(e)),
            _ => Poll::Ready(Ok(())),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let Some(linger) = self.linger.filter(|_| !self.peer_end.has_ended()) else {
            return;
        };
        // A stream dropped with its executor's leftover tasks, after the
        // executor's main future ended, closes at once: no task can start.
        if !crate::rt::can_spawn() {
            return;
        }
        // The socket lives on in a second descriptor; this one closes with
        // its registration as usual.
        if let Ok(socket) = self.socket.try_clone() {
            crate::rt::spawn_local(linger_then_close(socket, linger));
        }
    }
}

/// Shuts the write side of `socket`, then reads and discards until the peer
/// closes or `linger` runs out; the socket closes when this returns.
async fn linger_then_close(socket: OwnedFd, linger: Linger) {
    let _ = socket2::SockRef::from(&socket).shutdown(std::net::Shutdown::Write);
    let Ok(registration) = Registration::new(socket.as_raw_fd()) else {
        return;
    };
    let discard = async {
        let mut buf = [0u8; 16 << 10];
        let mut read_bytes = 0;
        while read_bytes < linger.bytes_max {
            let fd = socket.as_raw_fd();
            match poll_fn(|cx| registration.source().poll_recv(fd, cx, &mut buf)).await {
                Ok(0) | Err(_) => break,
                Ok(n) => read_bytes += n,
            }
        }
    };
    futures_lite::future::or(discard, glommio::timer::sleep(linger.within)).await;
    // Deregistered before the socket closes.
    drop(registration);
}

impl hyper::rt::Read for Stream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        // hyper offers uninitialised spare capacity: the bytes land there
        // straight from the socket, with no scratch buffer and no copy.
        // SAFETY: the kernel only writes the memory, and `advance` below
        // covers exactly the bytes it wrote.
        let spare = unsafe { buf.as_mut() };
        let filled = ready!(self.recv_uninit(cx, spare))?;
        // SAFETY: the first `filled` bytes were written by the read above.
        unsafe { buf.advance(filled) };
        Poll::Ready(Ok(()))
    }
}

impl hyper::rt::Write for Stream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.send_some(cx, buf)
    }

    /// hyper then queues a response body beside the head instead of copying it
    /// into its write buffer: a batch consume's reply of up to 8 MiB leaves in
    /// one `sendmsg` of head and body, uncopied.
    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.send_some_vectored(cx, bufs)
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.shutdown()
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        self.recv_some(cx, buf)
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.send_some(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.shutdown()
    }
}

/// hyper's timer, backed by the timer wheel of the shard that polls it. Without a
/// timer hyper silently ignores its header-read timeout, which is the server's only
/// defence against a client that trickles headers forever.
#[derive(Clone, Copy, Debug, Default)]
pub struct ShardTimer;

impl hyper::rt::Timer for ShardTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(ShardSleep {
            timer: ManuallyDrop::new(glommio::timer::Timer::new(duration)),
            owner: std::thread::current().id(),
        })
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep(deadline.saturating_duration_since(Instant::now()))
    }
}

/// A sleep on one shard's timer wheel. hyper requires `Send + Sync`; the sleep is
/// only ever polled and dropped by the connection future that created it, and that
/// future owns a `!Send` socket, so it cannot leave its shard. Polling from another
/// thread panics and dropping there leaks, so a broken assumption cannot touch the
/// wheel from a foreign thread.
struct ShardSleep {
    timer: ManuallyDrop<glommio::timer::Timer>,
    owner: ThreadId,
}

// SAFETY: see the type's doc: the timer is only used on its owning thread, and
// `poll` and `drop` check that before touching it.
unsafe impl Send for ShardSleep {}
// SAFETY: a shared reference gives no access to the timer at all.
unsafe impl Sync for ShardSleep {}

impl hyper::rt::Sleep for ShardSleep {}

impl std::future::Future for ShardSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        assert_eq!(
            std::thread::current().id(),
            self.owner,
            "a shard's sleep was polled on another thread"
        );
        Pin::new(&mut *self.timer).poll(cx).map(|_| ())
    }
}

impl Drop for ShardSleep {
    fn drop(&mut self) {
        if std::thread::current().id() == self.owner {
            // SAFETY: dropped once, here, on the thread that owns the timer wheel.
            unsafe { ManuallyDrop::drop(&mut self.timer) };
        }
    }
}

/// Creates the stop wake-up for one shard: the main thread keeps the sender, the
/// shard takes the receiver.
pub fn stop_channel() -> io::Result<(StopSender, StopReceiver)> {
    let (sender, receiver) = StdUnixStream::pair()?;
    Ok((StopSender { _end: sender }, StopReceiver { end: receiver }))
}

/// Dropping it wakes the shard holding the matching [`StopReceiver`].
pub struct StopSender {
    _end: StdUnixStream,
}

impl StopSender {
    /// Wakes the shard.
    pub fn stop(self) {
        drop(self);
    }
}

/// The shard's end of the stop wake-up. It is `Send` until the shard awaits it.
pub struct StopReceiver {
    end: StdUnixStream,
}

impl StopReceiver {
    /// Resolves once the matching [`StopSender`] is dropped. Call on the shard.
    pub async fn wait(self) {
        // SAFETY: the descriptor is one end of a connected socket pair that we own and
        // give up here.
        let mut end = unsafe { glommio::net::UnixStream::from_raw_fd(self.end.into_raw_fd()) };
        let mut byte = [0u8; 1];
        // End of file (the sender closed its end), a byte or an error all mean stop.
        let _ = end.read(&mut byte).await;
    }
}

#[cfg(test)]
mod tests;
