//! The control plane of one node: the metadata state machine, its durable store,
//! and the snapshot every shard reads.
//!
//! Which threads: one control thread owns the [`MetaStore`] and the
//! [`MetaState`]. Shards send it commands ([`ControlClient::propose`]) and await
//! the answer; the thread logs each command durably (blocking file I/O, which is
//! why it is not on a shard's executor), applies it, publishes the new state as an
//! immutable snapshot, and only then answers.
//!
//! Publishing: the snapshot sits behind an `RwLock` next to an atomic version.
//! A shard keeps its own `Arc` of the snapshot ([`MetaView`]) and compares one
//! atomic load against its copy's version on each use; only when the version moved
//! does it take the read lock, once, to install the new snapshot. So the per-request
//! cost is one uncontended atomic load, and the lock is touched once per metadata
//! change per shard, never per message.
//!
//! Read your writes: the control thread publishes before it answers, and every
//! shard checks the version at the start of every use, so once a create, alter or
//! delete has been answered, the next request on any connection of any shard sees
//! it. A delete also purges the topic on every shard over the mesh before it is
//! answered (see `broker::topics`).
//!
//! The cluster issue puts the command log under Raft: the state machine
//! ([`MetaState::apply`]) is already separate from its storage.

use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use futures_channel::oneshot;

use crate::meta::{Applied, Command, MetaError, MetaState, MetaStore};

/// What the shards read: the latest applied state.
#[derive(Debug)]
pub struct Published {
    version: AtomicU64,
    state: RwLock<Arc<MetaState>>,
    /// The store refuses writes (it latched after a failed write) until the
    /// node restarts.
    store_failed: AtomicBool,
}

impl Published {
    pub(crate) fn new(state: MetaState) -> Self {
        Published {
            version: AtomicU64::new(state.version),
            state: RwLock::new(Arc::new(state)),
            store_failed: AtomicBool::new(false),
        }
    }

    fn publish(&self, state: MetaState) {
        let version = state.version;
        *self.state.write().expect("metadata lock poisoned") = Arc::new(state);
        self.version.store(version, Ordering::Release);
    }

    /// Whether the metadata store refuses topic creates, alters and deletes
    /// until the node restarts.
    pub fn store_failed(&self) -> bool {
        self.store_failed.load(Ordering::Relaxed)
    }

    /// Notes a store that latched: said once, in the log and in
    /// `narad_metastore_apply_stopped` (set on the control thread alone).
    fn note_store(&self, store: &MetaStore) {
        let Some(reason) = store.latched() else {
            return;
        };
        if !self.store_failed.swap(true, Ordering::Relaxed) {
            ::metrics::gauge!("narad_metastore_apply_stopped").set(1.0);
            tracing::error!(reason, "the metadata store failed: topic creates, alters and deletes answer 500 until the node restarts (produce, consume and ack go on)");
        }
    }

    /// The latest published state.
    pub fn load(&self) -> Arc<MetaState> {
        self.state.read().expect("metadata lock poisoned").clone()
    }
}

/// A shard's handle on one published state: an `Rc` of the shared `Arc`.
pub type Snapshot = Rc<Arc<MetaState>>;

/// One shard's view of the metadata: its own handle on the latest snapshot.
///
/// The handle is the shard's own (`Rc`), taken once per published version:
/// handing out the shared `Arc` on every request would make every shard write
/// the same reference count, a cache line bouncing between cores on the hot
/// path. The state itself is shared, not copied: every shard reads the same
/// immutable map, so a change costs a shard one reference, not a copy of every
/// topic (which made creating N topics cost each shard O(N²)).
pub struct MetaView {
    published: Arc<Published>,
    current: std::cell::RefCell<Snapshot>,
}

impl MetaView {
    pub fn new(published: Arc<Published>) -> Self {
        let current = std::cell::RefCell::new(Rc::new(published.load()));
        MetaView { published, current }
    }

    /// What this view reads from, for a thread that is not a shard.
    pub fn published(&self) -> Arc<Published> {
        self.published.clone()
    }

    /// See [`Published::store_failed`].
    pub fn store_failed(&self) -> bool {
        self.published.store_failed()
    }

    /// The latest published snapshot.
    pub fn snapshot(&self) -> Snapshot {
        let version = self.published.version.load(Ordering::Acquire);
        let mut current = self.current.borrow_mut();
        if current.version != version {
            *current = Rc::new(self.published.load());
        }
        current.clone()
    }
}

type Reply = oneshot::Sender<Result<Applied, MetaError>>;

enum Request {
    Propose(Command, Reply),
    Stop,
}

/// A handle the shards use to propose commands. Clones share the thread.
#[derive(Clone)]
pub struct ControlClient {
    requests: std::sync::mpsc::Sender<Request>,
}

impl ControlClient {
    /// Logs and applies `command`; answers after every shard can see the result.
    pub async fn propose(&self, command: Command) -> Result<Applied, MetaError> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send(Request::Propose(command, tx))
            .map_err(|_| MetaError::Io("the control plane has stopped".into()))?;
        rx.await
            .map_err(|_| MetaError::Io("the control plane has stopped".into()))?
    }
}

/// The running control plane.
pub struct Control {
    pub published: Arc<Published>,
    pub client: ControlClient,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Control {
    /// Opens (and so recovers) the store in `dir` and starts the control thread.
    /// `on_panic` runs on that thread if it panics: the node can no longer
    /// create, alter or delete a topic, and must not go on as if healthy.
    pub fn start(
        dir: PathBuf,
        on_panic: impl FnOnce() + Send + 'static,
    ) -> Result<Control, String> {
        let (mut store, state) = MetaStore::open(&dir)
            .map_err(|e| format!("cannot open the metadata store in {}: {e}", dir.display()))?;
        tracing::info!(
            topics = state.topics.len(),
            version = state.version,
            "metadata recovered"
        );
        let published = Arc::new(Published::new(state.clone()));
        let (tx, rx) = std::sync::mpsc::channel::<Request>();
        let thread = {
            let published = published.clone();
            let mut state = state;
            std::thread::Builder::new()
                .name("control".into())
                .spawn(move || {
                    let serve = std::panic::AssertUnwindSafe(|| {
                        ::metrics::gauge!("narad_metastore_apply_stopped").set(0.0);
                        while let Ok(Request::Propose(command, reply)) = rx.recv() {
                            crate::lifecycle::debug_panic_on_propose(&command);
                            let outcome = store.propose(&mut state, command);
                            if outcome.is_ok() {
                                published.publish(state.clone());
                            }
                            published.note_store(&store);
                            let _ = reply.send(outcome);
                        }
                    });
                    if let Err(panic) = std::panic::catch_unwind(serve) {
                        on_panic();
                        std::panic::resume_unwind(panic);
                    }
                })
                .map_err(|e| format!("cannot start the control thread: {e}"))?
        };
        Ok(Control {
            published,
            client: ControlClient { requests: tx },
            thread: Some(thread),
        })
    }

    /// Stops the control thread; later proposals fail. Returns whether the
    /// thread had panicked.
    pub fn stop(mut self) -> bool {
        let _ = self.client.requests.send(Request::Stop);
        self.thread
            .take()
            .is_some_and(|thread| thread.join().is_err())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(name: &str, id: u128) -> Command {
        Command::CreateTopic(crate::meta::sample_record(name, id))
    }

    #[test]
    fn every_view_reads_the_one_published_state_as_soon_as_a_change_is_answered() {
        let dir = tempfile::tempdir().unwrap();
        let control = Control::start(dir.path().to_path_buf(), || {}).unwrap();
        let (a, b) = (
            MetaView::new(control.published.clone()),
            MetaView::new(control.published.clone()),
        );
        assert!(a.snapshot().topics.is_empty());
        for (i, name) in ["t1", "t2"].into_iter().enumerate() {
            futures_lite::future::block_on(control.client.propose(create(name, i as u128 + 1)))
                .unwrap();
            // Read your writes: the next look of any view sees the change ...
            let (seen_a, seen_b) = (a.snapshot(), b.snapshot());
            assert!(seen_a.topics.contains_key(name) && seen_b.topics.contains_key(name));
            // ... and every view shares the published state rather than
            // copying every topic on each change.
            let published = control.published.load();
            assert!(Arc::ptr_eq(&seen_a, &published) && Arc::ptr_eq(&seen_b, &published));
            // Between changes, a view hands out its own handle again.
            assert!(Rc::ptr_eq(&seen_a, &a.snapshot()));
        }
        assert!(!control.stop());
    }
}
