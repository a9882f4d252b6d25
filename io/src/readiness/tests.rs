//! Tests of the socket readiness set.

use super::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

fn nonblocking_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().unwrap();
    server.set_nonblocking(true).unwrap();
    (server, client)
}

async fn recv(source: &Source, fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    poll_fn(|cx| source.poll_recv(fd, cx, buf)).await
}

/// A socket a second descriptor keeps open (as a lingering close does) sends
/// nothing under its old token, which the next socket registered gets.
#[test]
fn a_duplicated_socket_leaves_the_set_with_its_registration() {
    let set = EpollSet::new().unwrap();
    let (old, mut old_peer) = nonblocking_pair();
    let _lingering = old.try_clone().unwrap();
    let (token, _) = set.register(old.as_raw_fd()).unwrap();
    set.remove(token, old.as_raw_fd());
    drop(old);
    let (new, _new_peer) = nonblocking_pair();
    let (reused, _) = set.register(new.as_raw_fd()).unwrap();
    assert_eq!(reused, token, "the token is reused");
    old_peer.write_all(b"late bytes").unwrap();
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 8];
    // SAFETY: `events` is valid for its length.
    let n = unsafe { libc::epoll_wait(set.fd(), events.as_mut_ptr(), 8, 200) };
    assert!(n >= 0);
    let told = events[..n as usize]
        .iter()
        .any(|e| e.u64 == reused as u64 && e.events & libc::EPOLLIN as u32 != 0);
    assert!(!told, "the new socket heard of the old one's bytes");
}

#[test]
fn bytes_sent_later_wake_the_reader_and_a_close_reads_as_the_end() {
    crate::rt::run_local(None, async {
        let (server, mut client) = nonblocking_pair();
        let reg = Registration::new(server.as_raw_fd()).unwrap();
        let writer = std::thread::spawn(move || {
            for chunk in [&b"hello"[..], b" world"] {
                std::thread::sleep(Duration::from_millis(30));
                client.write_all(chunk).unwrap();
            }
            std::thread::sleep(Duration::from_millis(30));
            drop(client);
        });
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        loop {
            let n = recv(reg.source(), server.as_raw_fd(), &mut buf)
                .await
                .unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        writer.join().unwrap();
        assert_eq!(got, b"hello world");
    });
}

#[test]
fn a_full_send_buffer_waits_for_room_and_every_byte_arrives() {
    crate::rt::run_local(None, async {
        let (server, mut client) = nonblocking_pair();
        let reg = Registration::new(server.as_raw_fd()).unwrap();
        let total = 8 << 20;
        let reader = std::thread::spawn(move || {
            let mut sum = 0usize;
            let mut buf = vec![0u8; 64 << 10];
            std::thread::sleep(Duration::from_millis(50));
            while sum < total {
                let n = client.read(&mut buf).unwrap();
                assert!(n > 0, "closed after {sum} bytes");
                assert!(buf[..n].iter().all(|b| *b == 7));
                sum += n;
            }
            sum
        });
        let data = vec![7u8; total];
        let mut sent = 0;
        let mut parked = 0;
        while sent < total {
            let n = poll_fn(|cx| {
                let r = reg
                    .source()
                    .poll_send(server.as_raw_fd(), cx, &data[sent..]);
                if r.is_pending() {
                    parked += 1;
                }
                r
            })
            .await
            .unwrap();
            sent += n;
        }
        assert_eq!(reader.join().unwrap(), total);
        assert!(
            parked > 0,
            "8 MiB fit in the send buffer: the test proves nothing"
        );
    });
}

#[test]
fn a_vectored_send_of_more_slices_than_one_call_takes_arrives_in_order() {
    crate::rt::run_local(None, async {
        let (server, mut client) = nonblocking_pair();
        let reg = Registration::new(server.as_raw_fd()).unwrap();
        // Slices of varied lengths and contents, more of them than one
        // sendmsg takes and more bytes than the send buffer holds.
        let slices: Vec<Vec<u8>> = (0..3 * IOV_MAX)
            .map(|i| vec![(i % 251) as u8; 1 + (i * 7919) % 6000])
            .collect();
        let expected: Vec<u8> = slices.concat();
        let total = expected.len();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::with_capacity(total);
            let mut buf = vec![0u8; 64 << 10];
            std::thread::sleep(Duration::from_millis(50));
            while got.len() < total {
                let n = client.read(&mut buf).unwrap();
                assert!(n > 0, "closed after {} bytes", got.len());
                got.extend_from_slice(&buf[..n]);
            }
            got
        });
        let (mut slice, mut within) = (0, 0);
        let mut parked = 0;
        while slice < slices.len() {
            let mut bufs = vec![io::IoSlice::new(&slices[slice][within..])];
            bufs.extend(slices[slice + 1..].iter().map(|s| io::IoSlice::new(s)));
            let mut n = poll_fn(|cx| {
                let r = reg
                    .source()
                    .poll_send_vectored(server.as_raw_fd(), cx, &bufs);
                if r.is_pending() {
                    parked += 1;
                }
                r
            })
            .await
            .unwrap();
            assert!(n > 0);
            while n > 0 {
                let left = slices[slice].len() - within;
                if n < left {
                    within += n;
                    n = 0;
                } else {
                    n -= left;
                    slice += 1;
                    within = 0;
                }
            }
        }
        assert!(reader.join().unwrap() == expected, "bytes out of order");
        assert!(parked > 0, "everything fit in the send buffer");
    });
}

#[test]
fn the_driver_sleeps_while_nothing_is_ready() {
    crate::rt::run_local(None, async {
        let (server, mut client) = nonblocking_pair();
        let reg = Registration::new(server.as_raw_fd()).unwrap();
        // Let the driver settle into its wait, then idle.
        glommio::timer::sleep(Duration::from_millis(20)).await;
        let before = waits();
        glommio::timer::sleep(Duration::from_millis(200)).await;
        let idle = waits() - before;
        assert!(
            idle <= 2,
            "the driver went round {idle} times with nothing ready"
        );
        // And it still wakes for a byte.
        client.write_all(b"x").unwrap();
        let mut buf = [0u8; 8];
        let n = recv(reg.source(), server.as_raw_fd(), &mut buf)
            .await
            .unwrap();
        assert_eq!(&buf[..n], b"x");
    });
}

/// Reads `expected` from a socket whose peer writes it only after the
/// reader has parked, so that only the driver can wake it; bounded.
async fn read_written_later(expected: &'static [u8]) {
    let (server, mut client) = nonblocking_pair();
    let reg = Registration::new(server.as_raw_fd()).unwrap();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        client.write_all(expected).unwrap();
        client
    });
    let mut buf = [0u8; 16];
    let read = futures_lite::future::or(
        async { Some(recv(reg.source(), server.as_raw_fd(), &mut buf).await) },
        async {
            glommio::timer::sleep(Duration::from_secs(5)).await;
            None
        },
    )
    .await;
    let n = read
        .expect("a byte written after the reader parked never woke it")
        .unwrap();
    assert_eq!(&buf[..n], expected);
    drop(writer.join().unwrap());
}

#[test]
fn a_second_executor_on_the_thread_gets_a_driver_of_its_own() {
    for _ in 0..2 {
        crate::rt::run_local(None, read_written_later(b"ping"));
    }
}

#[test]
fn the_driver_ends_with_the_last_registration_and_a_new_one_starts_it_again() {
    crate::rt::run_local(None, async {
        read_written_later(b"one").await;
        // The registration above is gone: the driver ends.
        for _ in 0..100 {
            if !SET.with(|s| s.borrow().as_ref().unwrap().driven.get()) {
                break;
            }
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            !SET.with(|s| s.borrow().as_ref().unwrap().driven.get()),
            "the driver kept running with nothing registered"
        );
        read_written_later(b"two").await;
    });
}
