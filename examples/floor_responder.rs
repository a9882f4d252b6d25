//! The least a request/response over loopback TCP can cost on a machine: one
//! thread, one edge-triggered epoll set, nonblocking sockets, and a fixed
//! `200 OK` written for every request head read. No parsing beyond finding
//! `\r\n\r\n`, no allocation, no timers.
//!
//! `benches/generator.py --floor` runs it pinned beside the broker's
//! `GET /healthz` and reads its CPU per request: what the kernel's loopback
//! TCP and two system calls per request cost here, which no HTTP server on
//! this machine can go below.
//!
//! It serves clients that send one small request at a time and read each
//! answer (`wrk`, `narad bench`): a request head split across two reads is not
//! answered, and a reply that does not fit the send buffer ends its connection.
//!
//! Usage: `floor_responder PORT` (listens on 127.0.0.1:PORT and prints
//! `listening 127.0.0.1:PORT`; `PORT` 0 picks a free one).

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;

const REPLY: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok";

fn main() -> std::io::Result<()> {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let listener = TcpListener::bind(("127.0.0.1", port))?;
    listener.set_nonblocking(true)?;
    println!("listening {}", listener.local_addr()?);

    // SAFETY: plain system calls on descriptors this process owns.
    let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if epoll < 0 {
        return Err(std::io::Error::last_os_error());
    }
    watch(epoll, listener.as_raw_fd(), libc::EPOLLIN as u32)?;

    let mut conns: Vec<Option<TcpStream>> = Vec::new();
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    let mut buf = vec![0u8; 64 * 1024];
    let listen_key = u64::MAX;
    loop {
        // SAFETY: `events` outlives the call and its length is passed.
        let ready = unsafe { libc::epoll_wait(epoll, events.as_mut_ptr(), 256, -1) };
        if ready < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        for event in &events[..ready as usize] {
            let key = event.u64;
            if key == listen_key {
                while let Ok((stream, _)) = listener.accept() {
                    stream.set_nonblocking(true)?;
                    stream.set_nodelay(true)?;
                    let slot = conns.iter().position(Option::is_none).unwrap_or_else(|| {
                        conns.push(None);
                        conns.len() - 1
                    });
                    watch_key(
                        epoll,
                        stream.as_raw_fd(),
                        (libc::EPOLLIN | libc::EPOLLET) as u32,
                        slot as u64,
                    )?;
                    conns[slot] = Some(stream);
                }
                continue;
            }
            let slot = key as usize;
            if !serve(conns[slot].as_mut(), &mut buf) {
                conns[slot] = None;
            }
        }
    }
}

/// Answers every complete request head that can be read now; false once the
/// connection is done.
fn serve(stream: Option<&mut TcpStream>, buf: &mut [u8]) -> bool {
    let Some(stream) = stream else { return false };
    loop {
        match stream.read(buf) {
            Ok(0) => return false,
            Ok(n) => {
                let heads = buf[..n].windows(4).filter(|w| w == b"\r\n\r\n").count();
                for _ in 0..heads {
                    if stream.write_all(REPLY).is_err() {
                        return false;
                    }
                }
                if n < buf.len() {
                    return true;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

fn watch(epoll: i32, fd: i32, events: u32) -> std::io::Result<()> {
    watch_key(epoll, fd, events, u64::MAX)
}

fn watch_key(epoll: i32, fd: i32, events: u32, key: u64) -> std::io::Result<()> {
    let mut event = libc::epoll_event { events, u64: key };
    // SAFETY: `event` is valid for the call; the kernel copies it.
    if unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, fd, &mut event) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
