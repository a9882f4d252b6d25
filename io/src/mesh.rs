//! The cross-shard mesh: one bounded, lock-free single-producer single-consumer
//! channel for every ordered pair of shards.
//!
//! Built on glommio's shared channels (a lock-free ring per pair; waking a parked
//! receiver goes through its executor's eventfd). glommio's own channel mesh numbers
//! its peers by executor id, not by the index the caller chose, so the mesh is laid
//! out here instead: [`full_mesh`] runs on the main thread before the shards start
//! and hands shard `i` exactly the senders `i → j` and the receivers `j → i`.
//!
//! Back-pressure: a channel holds at most `capacity` messages; a sender to a full
//! channel waits. Messages are the caller's typed ops; heavy traffic batches many
//! records into one message, so one hop costs one ring slot, not one per record.
//!
//! A shard whose thread ended (it stopped, or panicked) is marked gone through
//! its [`Departure`]. A send to it then fails at once, and one waiting for room
//! gives up within [`GONE_POLL`]: nothing would ever drain its channel again, and
//! glommio's wait for room does not notice a receiver that went away (it wakes on
//! every turn of the reactor instead, so a node stopping after a shard's panic
//! would spin on it forever).
//!
//! Which cores: every end is moved to its shard's thread and connected there; after
//! that nothing here is shared but the rings themselves.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use glommio::channels::shared_channel::{
    self, ConnectedReceiver, ConnectedSender, SharedReceiver, SharedSender,
};

/// How often a send waiting for room checks whether its receiver is gone.
pub const GONE_POLL: Duration = Duration::from_millis(10);

/// One shard's unconnected ends, built by [`full_mesh`]; `Send`, so the main thread
/// can move it to the shard's thread.
pub struct MeshEnd<T: Send + 'static> {
    me: usize,
    senders: Vec<Option<SharedSender<T>>>,
    receivers: Vec<Option<SharedReceiver<T>>>,
    gone: Arc<[AtomicBool]>,
}

/// One shard's connected ends.
pub struct MeshLink<T: Send + 'static> {
    me: usize,
    senders: Vec<Option<ConnectedSender<T>>>,
    gone: Arc<[AtomicBool]>,
}

/// Marks its shard gone from the mesh when dropped: keep it in the shard's
/// thread, so that both its return and its unwinding mark it.
pub struct Departure {
    shard: usize,
    gone: Arc<[AtomicBool]>,
}

impl Drop for Departure {
    fn drop(&mut self) {
        self.gone[self.shard].store(true, Ordering::Release);
    }
}

/// Why a message did not leave.
#[derive(Debug)]
pub enum SendError<T> {
    /// The target shard index is this shard or out of range.
    BadTarget(T),
    /// The receiving shard has stopped.
    Closed(T),
    /// The receiving shard went away while the send waited for room; the
    /// message was dropped with the wait.
    Gone,
}

/// Builds the channels of a full mesh of `shards` shards, `capacity` messages each;
/// element `i` belongs to shard `i`.
pub fn full_mesh<T: Send + 'static>(shards: usize, capacity: usize) -> Vec<MeshEnd<T>> {
    assert!(shards > 0 && capacity > 0);
    let gone: Arc<[AtomicBool]> = (0..shards).map(|_| AtomicBool::new(false)).collect();
    let mut ends: Vec<MeshEnd<T>> = (0..shards)
        .map(|me| MeshEnd {
            me,
            senders: (0..shards).map(|_| None).collect(),
            receivers: (0..shards).map(|_| None).collect(),
            gone: gone.clone(),
        })
        .collect();
    for from in 0..shards {
        for to in 0..shards {
            if from != to {
                let (sender, receiver) = shared_channel::new_bounded(capacity);
                ends[from].senders[to] = Some(sender);
                ends[to].receivers[from] = Some(receiver);
            }
        }
    }
    ends
}

impl<T: Send + 'static> MeshEnd<T> {
    /// This end's shard.
    pub fn shard(&self) -> usize {
        self.me
    }

    /// Shards in the mesh, this one included.
    pub fn shards(&self) -> usize {
        self.senders.len()
    }

    /// The handle that marks this end's shard gone when dropped.
    pub fn departure(&self) -> Departure {
        Departure {
            shard: self.me,
            gone: self.gone.clone(),
        }
    }

    /// Connects the ends on the calling shard's executor. Returns the senders and one
    /// receiver per peer shard, tagged with the peer's index.
    pub async fn connect(self) -> (MeshLink<T>, Vec<(usize, ConnectedReceiver<T>)>) {
        // A sender's connection completes only once its receiver connects, on the
        // peer's executor, so every end is connected at once, never one by one.
        let senders: Vec<Option<glommio::Task<ConnectedSender<T>>>> = self
            .senders
            .into_iter()
            .map(|s| s.map(|s| glommio::spawn_local(s.connect())))
            .collect();
        let receivers: Vec<(usize, glommio::Task<ConnectedReceiver<T>>)> = self
            .receivers
            .into_iter()
            .enumerate()
            .filter_map(|(from, r)| r.map(|r| (from, glommio::spawn_local(r.connect()))))
            .collect();
        let mut connected = Vec::with_capacity(senders.len());
        for sender in senders {
            connected.push(match sender {
                Some(task) => Some(task.await),
                None => None,
            });
        }
        let mut inboxes = Vec::with_capacity(receivers.len());
        for (from, task) in receivers {
            inboxes.push((from, task.await));
        }
        (
            MeshLink {
                me: self.me,
                senders: connected,
                gone: self.gone,
            },
            inboxes,
        )
    }
}

impl<T: Send + 'static> MeshLink<T> {
    /// This shard's index.
    pub fn shard(&self) -> usize {
        self.me
    }

    /// Shards in the mesh, this one included.
    pub fn shards(&self) -> usize {
        self.senders.len()
    }

    /// Whether shard `to` is gone (see the module docs).
    pub fn is_gone(&self, to: usize) -> bool {
        self.gone.get(to).is_some_and(|g| g.load(Ordering::Acquire))
    }

    /// Sends `message` to shard `to`, waiting while its channel is full, unless
    /// that shard is gone (see the module docs).
    pub async fn send(&self, to: usize, message: T) -> Result<(), SendError<T>> {
        let Some(Some(sender)) = self.senders.get(to) else {
            return Err(SendError::BadTarget(message));
        };
        if self.is_gone(to) {
            return Err(SendError::Closed(message));
        }
        let sent = async { Some(sender.send(message).await) };
        let watch = async {
            loop {
                crate::rt::sleep(GONE_POLL).await;
                if self.is_gone(to) {
                    return None;
                }
            }
        };
        match futures_lite::future::or(sent, watch).await {
            Some(Ok(())) => Ok(()),
            Some(Err(glommio::GlommioError::Closed(glommio::ResourceType::Channel(m))))
            | Some(Err(glommio::GlommioError::WouldBlock(glommio::ResourceType::Channel(m)))) => {
                Err(SendError::Closed(m))
            }
            Some(Err(other)) => panic!("unexpected channel error: {other:?}"),
            None => Err(SendError::Gone),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two ends of a mesh of two shards whose channels hold `capacity`.
    fn two_shards(capacity: usize) -> (MeshEnd<u32>, MeshEnd<u32>) {
        let mut ends = full_mesh::<u32>(2, capacity).into_iter();
        (ends.next().unwrap(), ends.next().unwrap())
    }

    type Receivers = Vec<(usize, ConnectedReceiver<u32>)>;

    /// Runs shard `end` on a thread of its own: it connects, says so, waits for
    /// the word and then runs `then` over its receivers. Returns the thread,
    /// where it says it connected, and where the word goes.
    fn on_its_own_thread<R, F>(
        end: MeshEnd<u32>,
        then: impl FnOnce(Receivers) -> F + Send + 'static,
    ) -> (
        std::thread::JoinHandle<R>,
        std::sync::mpsc::Receiver<()>,
        std::sync::mpsc::Sender<()>,
    )
    where
        R: Send + 'static,
        F: std::future::Future<Output = R>,
    {
        let (connected_tx, connected_rx) = std::sync::mpsc::channel();
        let (word_tx, word_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            crate::rt::run_local(None, async move {
                let (_link, receivers) = end.connect().await;
                connected_tx.send(()).unwrap();
                word_rx.recv().unwrap();
                then(receivers).await
            })
        });
        (thread, connected_rx, word_tx)
    }

    /// Connects shard 0 once shard 1 has, and fills its channel to shard 1
    /// (of 2) with 1 and 2.
    async fn connect_and_fill(
        end: MeshEnd<u32>,
        peer_connected: std::sync::mpsc::Receiver<()>,
    ) -> (MeshLink<u32>, Receivers) {
        let (link, receivers) = end.connect().await;
        peer_connected.recv().unwrap();
        link.send(1, 1).await.unwrap();
        link.send(1, 2).await.unwrap();
        (link, receivers)
    }

    /// What `future` gives, or `None` if it takes more than 5 s.
    async fn within_5s<T>(future: impl std::future::Future<Output = T>) -> Option<T> {
        let late = async {
            crate::rt::sleep(Duration::from_secs(5)).await;
            None
        };
        futures_lite::future::or(async { Some(future.await) }, late).await
    }

    #[test]
    fn every_pair_talks_in_order() {
        let shards = 3;
        let ends = full_mesh::<(usize, u32)>(shards, 4);
        let threads: Vec<_> = ends
            .into_iter()
            .map(|end| {
                std::thread::spawn(move || {
                    crate::rt::run_local(None, async move {
                        let me = end.shard();
                        let (link, receivers) = end.connect().await;
                        assert_eq!(link.shards(), 3);
                        assert!(matches!(
                            link.send(me, (me, 0)).await,
                            Err(SendError::BadTarget(_))
                        ));
                        let sends = async {
                            for to in (0..shards).filter(|&to| to != me) {
                                for n in 0..10 {
                                    link.send(to, (me, n)).await.unwrap();
                                }
                            }
                        };
                        let recvs = async {
                            let mut got = Vec::new();
                            for (from, receiver) in &receivers {
                                for n in 0..10 {
                                    assert_eq!(receiver.recv().await, Some((*from, n)));
                                }
                                got.push(*from);
                            }
                            got
                        };
                        let ((), got) = futures_lite::future::zip(sends, recvs).await;
                        assert_eq!(got.len(), shards - 1);
                    })
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
    }

    /// Back-pressure: a send to a full channel waits, and goes on once the
    /// receiver takes a message; nothing is dropped or reordered.
    #[test]
    fn a_full_channel_holds_its_sender_until_the_receiver_makes_room() {
        let (sender_end, receiver_end) = two_shards(2);
        // Reads only when told, then everything.
        let (receiver, connected, read) = on_its_own_thread(receiver_end, |receivers| async move {
            let (from, channel) = &receivers[0];
            assert_eq!(*from, 0);
            let mut got = Vec::new();
            for _ in 0..3 {
                got.push(channel.recv().await.expect("open"));
            }
            got
        });
        crate::rt::run_local(None, async move {
            let (link, _receivers) = connect_and_fill(sender_end, connected).await;
            let waiting = link.send(1, 3);
            futures_lite::pin!(waiting);
            for _ in 0..10 {
                assert!(
                    futures_lite::future::poll_once(waiting.as_mut())
                        .await
                        .is_none(),
                    "a send to a full channel went through"
                );
                crate::rt::yield_now().await;
            }
            read.send(()).unwrap();
            assert!(
                matches!(within_5s(waiting).await, Some(Ok(()))),
                "the send did not go on once the receiver made room"
            );
        });
        assert_eq!(receiver.join().unwrap(), [1, 2, 3]);
    }

    /// A send waiting for room in the channel of a shard that went away gives up
    /// once it is marked gone, and later sends to it fail at once; before, the
    /// wait never ended.
    #[test]
    fn a_send_to_a_gone_shard_gives_up() {
        let (sender_end, idle_end) = two_shards(2);
        let departure = idle_end.departure();
        // Shard 1 connects, never reads, and leaves when told.
        let (idle, connected, leave) = on_its_own_thread(idle_end, |receivers| async move {
            drop(departure);
            drop(receivers);
        });
        crate::rt::run_local(None, async move {
            let (link, _receivers) = connect_and_fill(sender_end, connected).await;
            // Full: this send waits for room nobody will make.
            let waiting = link.send(1, 3);
            futures_lite::pin!(waiting);
            assert!(futures_lite::future::poll_once(waiting.as_mut())
                .await
                .is_none());
            leave.send(()).unwrap();
            let outcome = within_5s(waiting).await;
            assert!(
                matches!(outcome, Some(Err(SendError::Gone))),
                "still waiting after 5 s: {}",
                outcome.is_none()
            );
            assert!(matches!(link.send(1, 4).await, Err(SendError::Closed(4))));
        });
        idle.join().unwrap();
    }
}
