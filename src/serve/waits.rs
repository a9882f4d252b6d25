//! Steps of a start or a stop that wait on the disk say so while they wait:
//! a disk that stops answering otherwise shows as a node gone silent.
//!
//! Which cores: [`waiting_on_disk`] runs on the shard whose step it is;
//! [`blocking_on_disk`] on the main thread, with a thread of its own for the
//! lines.

/// How often a start or stop step that waits on the disk says it is still
/// waiting.
const DISK_WAIT_LINE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs `step` of shard `shard`'s start or stop, a step whose reads, writes
/// and syncs a disk that stopped answering holds up, with a warning every
/// [`DISK_WAIT_LINE_EVERY`] while it waits: a hung device otherwise shows as
/// a node that goes silent.
pub async fn waiting_on_disk<T>(
    shard: usize,
    step: &str,
    step_done: impl std::future::Future<Output = T>,
) -> T {
    let started = std::time::Instant::now();
    let mut step_done = std::pin::pin!(step_done);
    loop {
        let waited = async {
            narad_io::rt::sleep(DISK_WAIT_LINE_EVERY).await;
            None
        };
        let done = async { Some((&mut step_done).await) };
        if let Some(out) = futures_lite::future::or(done, waited).await {
            return out;
        }
        tracing::warn!(
            shard,
            step,
            waited = ?started.elapsed(),
            "still waiting for the disk (a read, write or sync that has not completed)"
        );
    }
}

/// [`waiting_on_disk`] for a blocking `step` of the node's start, run on the
/// calling thread while another one says every [`DISK_WAIT_LINE_EVERY`]
/// that it still waits.
pub fn blocking_on_disk<T>(step: &str, run: impl FnOnce() -> T) -> T {
    let started = std::time::Instant::now();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                finished.recv_timeout(DISK_WAIT_LINE_EVERY)
            {
                tracing::warn!(
                    step,
                    waited = ?started.elapsed(),
                    "still waiting for the disk (a read, write or sync that has not completed)"
                );
            }
        });
        let out = run();
        drop(done);
        out
    })
}
