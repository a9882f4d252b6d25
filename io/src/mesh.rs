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
//! Which cores: every end is moved to its shard's thread and connected there; after
//! that nothing here is shared but the rings themselves.

use glommio::channels::shared_channel::{
    self, ConnectedReceiver, ConnectedSender, SharedReceiver, SharedSender,
};

/// One shard's unconnected ends, built by [`full_mesh`]; `Send`, so the main thread
/// can move it to the shard's thread.
pub struct MeshEnd<T: Send + 'static> {
    me: usize,
    senders: Vec<Option<SharedSender<T>>>,
    receivers: Vec<Option<SharedReceiver<T>>>,
}

/// One shard's connected ends.
pub struct MeshLink<T: Send + 'static> {
    me: usize,
    senders: Vec<Option<ConnectedSender<T>>>,
}

/// Why a message did not leave.
#[derive(Debug)]
pub enum SendError<T> {
    /// The target shard index is this shard or out of range.
    BadTarget(T),
    /// The receiving shard has stopped.
    Closed(T),
}

/// Builds the channels of a full mesh of `shards` shards, `capacity` messages each;
/// element `i` belongs to shard `i`.
pub fn full_mesh<T: Send + 'static>(shards: usize, capacity: usize) -> Vec<MeshEnd<T>> {
    assert!(shards > 0 && capacity > 0);
    let mut ends: Vec<MeshEnd<T>> = (0..shards)
        .map(|me| MeshEnd {
            me,
            senders: (0..shards).map(|_| None).collect(),
            receivers: (0..shards).map(|_| None).collect(),
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

    /// Sends `message` to shard `to`, waiting while its channel is full.
    pub async fn send(&self, to: usize, message: T) -> Result<(), SendError<T>> {
        match self.senders.get(to) {
            Some(Some(sender)) => sender.send(message).await.map_err(|e| match e {
                glommio::GlommioError::Closed(glommio::ResourceType::Channel(m)) => {
                    SendError::Closed(m)
                }
                glommio::GlommioError::WouldBlock(glommio::ResourceType::Channel(m)) => {
                    SendError::Closed(m)
                }
                other => panic!("unexpected channel error: {other:?}"),
            }),
            _ => Err(SendError::BadTarget(message)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
