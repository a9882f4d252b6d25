//! What comes before the shards run: the data directory's lock, the refusal of
//! a listen that failed (with what to do about it), and the gate the shards
//! pass together before they connect their mesh.

use std::os::fd::AsRawFd;
use std::path::Path;

/// Takes an exclusive lock on `<data>/lock`, held until the process exits.
pub(super) fn lock_data_dir(data_dir: &Path) -> Result<std::fs::File, String> {
    let path = data_dir.join("lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(format!(
            "data directory {} is in use by another narad process (lock held on {})",
            data_dir.display(),
            path.display()
        ));
    }
    Ok(file)
}

/// The refusal of a listen on `requested` that failed with `e`, saying what
/// to do about the usual causes.
pub(super) fn listen_refusal(requested: std::net::SocketAddr, e: &std::io::Error) -> String {
    let hint = match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            ": another process listens there; stop it, or give this node another --port (0 picks a free one)"
        }
        std::io::ErrorKind::AddrNotAvailable => {
            ": no interface of this machine has that address; give --addr one it has"
        }
        std::io::ErrorKind::PermissionDenied => {
            ": ports below 1024 need privileges; give --port 1024 or above"
        }
        _ => "",
    };
    format!("cannot listen on {requested}: {e}{hint}")
}

/// Where the shards wait until every shard's executor runs, before they
/// connect their mesh; a shard that fails before it gets there opens it for
/// the others, who then stop instead of waiting for it.
pub(super) struct StartGate {
    shards: usize,
    /// Shards arrived, and whether one failed.
    state: std::sync::Mutex<(usize, bool)>,
    changed: std::sync::Condvar,
}

impl StartGate {
    pub(super) fn new(shards: usize) -> Self {
        StartGate {
            shards,
            state: std::sync::Mutex::new((0, false)),
            changed: std::sync::Condvar::new(),
        }
    }

    /// Blocks this thread until every shard arrived (true) or one failed
    /// before that (false).
    pub(super) fn arrive(&self) -> bool {
        let mut state = self.state.lock().expect("start gate poisoned");
        state.0 += 1;
        self.changed.notify_all();
        while state.0 < self.shards && !state.1 {
            state = self.changed.wait(state).expect("start gate poisoned");
        }
        state.0 == self.shards
    }

    /// A shard failed: whoever waits, or comes later, goes on without it.
    pub(super) fn fail(&self) {
        self.state.lock().expect("start gate poisoned").1 = true;
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::StartGate;

    #[test]
    fn the_start_gate_opens_when_all_arrive_or_one_fails() {
        let gate = Arc::new(StartGate::new(3));
        let waiting: Vec<_> = (0..2)
            .map(|_| {
                let gate = gate.clone();
                std::thread::spawn(move || gate.arrive())
            })
            .collect();
        assert!(gate.arrive());
        assert!(waiting.into_iter().all(|t| t.join().unwrap()));

        // One fails before the others arrive: they go on, told so, and so
        // does one that arrives after.
        let gate = Arc::new(StartGate::new(3));
        let waiting = {
            let gate = gate.clone();
            std::thread::spawn(move || gate.arrive())
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        gate.fail();
        assert!(!waiting.join().unwrap());
        assert!(!gate.arrive());
    }
}
