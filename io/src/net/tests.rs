//! Tests of the sockets: binding a port group, accepting, and what accepted
//! streams carry and when their writes give up.

mod bind_tests {
    use super::super::*;

    #[test]
    fn a_port_another_group_listens_on_is_refused() {
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let (first, addr) = bind_reuseport_group(loopback, 2).unwrap();
        assert_eq!(first.len(), 2);
        assert_ne!(addr.port(), 0);
        let second = bind_reuseport_group(addr, 2).map(|_| ());
        assert_eq!(
            second.unwrap_err().kind(),
            io::ErrorKind::AddrInUse,
            "a second group joined the first one's port"
        );
        // Once the first group is gone the port is free again.
        drop(first);
        let (again, same) = bind_reuseport_group(addr, 1).unwrap();
        assert_eq!((again.len(), same), (1, addr));
    }

    /// Every interface is IPv6 and IPv4 at once (as the reference's `:port`),
    /// or IPv4 alone on a host without IPv6.
    #[test]
    fn every_interface_takes_ipv4_and_ipv6_connections() {
        let any: SocketAddr = "[::]:0".parse().unwrap();
        let (listeners, addr) = bind_reuseport_group(any, 1).unwrap();
        let v4 = SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port());
        std::net::TcpStream::connect(v4).expect("an IPv4 connection");
        if addr.is_ipv6() {
            let v6 = SocketAddr::new(std::net::Ipv6Addr::LOCALHOST.into(), addr.port());
            // A host may have IPv6 sockets but no ::1 (loopback without IPv6).
            if std::net::TcpListener::bind("[::1]:0").is_ok() {
                std::net::TcpStream::connect(v6).expect("an IPv6 connection");
            }
        }
        drop(listeners);
    }
}

mod stream_tests {
    use super::super::*;
    use futures_lite::io::{AsyncReadExt, AsyncWriteExt};
    use std::io::Write;

    /// A listener on a free loopback port, adopted on the current executor.
    fn listen() -> (Listener, SocketAddr) {
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let (mut sockets, addr) = bind_reuseport_group(loopback, 1).unwrap();
        (Listener::adopt(sockets.pop().unwrap()).unwrap(), addr)
    }

    #[test]
    fn errors_of_one_pending_connection_do_not_stop_accepting() {
        for errno in [libc::EPROTO, libc::ENETUNREACH, libc::EHOSTUNREACH] {
            assert!(is_connection_error(&io::Error::from_raw_os_error(errno)));
        }
        for errno in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS] {
            assert!(!is_connection_error(&io::Error::from_raw_os_error(errno)));
        }
    }

    #[test]
    fn connections_already_queued_are_taken_without_waiting() {
        crate::rt::run_local(None, async {
            let (listener, addr) = listen();
            assert!(listener.accept_queued().unwrap().is_none());
            // The kernel completes these handshakes before anyone accepts.
            let clients: Vec<_> = (0..3)
                .map(|_| std::net::TcpStream::connect(addr).unwrap())
                .collect();
            let mut taken = 0;
            let started = Instant::now();
            while taken < clients.len() {
                match listener.accept_queued().unwrap() {
                    Some(_) => taken += 1,
                    // A handshake the kernel has not finished queueing yet.
                    None => assert!(started.elapsed() < Duration::from_secs(5), "{taken}"),
                }
            }
            assert!(listener.accept_queued().unwrap().is_none());
        });
    }

    #[test]
    fn a_lingering_stream_left_when_its_executor_ends_closes_at_once() {
        // The stream's task is still waiting when the main future ends: the
        // executor drops it afterwards, where no task can be spawned.
        let client = crate::rt::run_local(None, async move {
            let (listener, addr) = listen();
            let client = std::net::TcpStream::connect(addr).unwrap();
            let mut stream = listener.accept().await.unwrap();
            stream.linger_on_close(Linger {
                within: Duration::from_secs(5),
                bytes_max: 1 << 20,
            });
            crate::rt::spawn_local(async move {
                let _held = stream;
                std::future::pending::<()>().await;
            });
            client
        });
        // Closed: the peer sees the end.
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut byte = [0u8; 1];
        assert_eq!(std::io::Read::read(&mut &client, &mut byte).unwrap(), 0);
    }

    #[test]
    fn a_peer_that_stops_reading_fails_the_write_after_the_write_timeout() {
        crate::rt::run_local(None, async {
            let (listener, addr) = listen();
            // Connected, and never read from.
            let _client = std::net::TcpStream::connect(addr).unwrap();
            let mut stream = listener.accept().await.unwrap();
            let timeout = Duration::from_millis(300);
            stream.set_write_timeout(timeout).unwrap();
            let chunk = vec![1u8; 1 << 20];
            let started = Instant::now();
            let failed = futures_lite::future::or(
                async {
                    loop {
                        if let Err(e) = stream.write_all(&chunk).await {
                            return Some(e);
                        }
                    }
                },
                async {
                    crate::rt::sleep(Duration::from_secs(10)).await;
                    None
                },
            )
            .await
            .expect("a write to a peer that never reads was still waiting after 10 s");
            assert_eq!(failed.kind(), io::ErrorKind::TimedOut, "{failed}");
            assert!(started.elapsed() >= timeout);
        });
    }

    #[test]
    fn accepted_streams_carry_requests_and_answers_and_see_the_peer_close() {
        crate::rt::run_local(None, async {
            let (listener, addr) = listen();
            let client = std::thread::spawn(move || {
                let mut client = std::net::TcpStream::connect(addr).unwrap();
                client.write_all(b"ping").unwrap();
                let mut answer = [0u8; 4];
                std::io::Read::read_exact(&mut client, &mut answer).unwrap();
                answer
            });
            let mut stream = listener.accept().await.unwrap();
            assert_eq!(stream.peer_addr().unwrap().ip(), addr.ip());
            let mut request = [0u8; 4];
            stream.read_exact(&mut request).await.unwrap();
            assert_eq!(&request, b"ping");
            stream.write_all(b"pong").await.unwrap();
            assert_eq!(&client.join().unwrap(), b"pong");
            // The client is gone: the stream reads its end.
            let mut rest = Vec::new();
            stream.read_to_end(&mut rest).await.unwrap();
            assert!(rest.is_empty());
        });
    }
}

mod exchange_tests {
    use super::super::*;

    /// The late end of a request (its body drained after the answer) ends it
    /// only while no later request has begun on the connection.
    #[test]
    fn a_late_end_of_a_request_never_ends_a_later_one() {
        let exchange = ExchangeCell::fresh();
        let first = exchange.busy();
        let second = exchange.busy();
        assert_ne!(first, second);
        exchange.answered_for(first);
        assert!(matches!(exchange.get(), Exchange::Busy));
        exchange.answered_for(second);
        assert!(matches!(
            exchange.get(),
            Exchange::Idle { fresh: false, .. }
        ));
    }
}
