//! Putting the next segment in place at a roll, with the waits a process short
//! of a resource needs.
//!
//! Runs on the WAL's shard, inside the flush loop's roll. By then the old
//! segment is sealed and synced, and nothing of the new one is written: a step
//! that fails here for want of a resource (descriptors: `EMFILE`, `ENFILE`;
//! memory: `ENOMEM`) loses nothing and leaves nothing half done that cannot be
//! finished later. Latching the WAL for it would refuse every produce until a
//! restart over what is most often a passing shortage (a flood of connections,
//! another process's files), so the step is tried again, with growing pauses,
//! for up to [`RETRY_FOR`]; the appenders wait meanwhile, as they would for a
//! slow device. Any other error, or one that outlasts the retries, fails the
//! roll as before, and the WAL latches.
//!
//! The one step that can fail half done is the prepared spare's rename: the
//! rename may be made and its directory sync fail (the directory could not be
//! opened). The spare's name is then gone and the segment's is there, so the
//! retry syncs the directory instead of renaming again; until that sync, a
//! crash could bring the old name back, and recovery would take the segment's
//! records for a spare's zeros.

use std::io;
use std::time::{Duration, Instant};

use narad_io::file::{join, OpenMode};
use narad_io::Storage;

use super::segment::PREP_FILE;

/// How long a roll waits out a shortage of descriptors or memory.
pub const RETRY_FOR: Duration = Duration::from_secs(5);
const PAUSE_FIRST: Duration = Duration::from_millis(10);
const PAUSE_MAX: Duration = Duration::from_millis(500);

/// Makes `name` (in `dir`) the next segment, `prepared`: the prepared spare
/// renamed to it, else a new empty file; and opens it.
pub async fn place_segment<S: Storage>(
    storage: &S,
    dir: &str,
    name: &str,
    prepared: bool,
) -> io::Result<S::File> {
    let prep = join(dir, PREP_FILE);
    let mut rename_left = prepared;
    let mut sync_left = false;
    let mut pause = PAUSE_FIRST;
    let give_up = Instant::now() + RETRY_FOR;
    loop {
        let attempt = async {
            if rename_left {
                if let Err(e) = storage.rename(&prep, name).await {
                    // Made, and then its sync failed: only the sync is left.
                    let gone = storage.size_of(&prep).await.is_err_and(|e| is_missing(&e));
                    if gone && storage.size_of(name).await.is_ok() {
                        rename_left = false;
                        sync_left = true;
                    }
                    return Err(e);
                }
                rename_left = false;
            }
            if sync_left {
                storage.sync_dir(dir).await?;
                sync_left = false;
            }
            storage.open(name, OpenMode::CreateOrOpen).await
        };
        let e = match attempt.await {
            Ok(file) => return Ok(file),
            Err(e) => e,
        };
        if !short_of_resources(&e) || Instant::now() + pause > give_up {
            return Err(e);
        }
        tracing::warn!(segment = name, error = %e, ?pause, "ingress WAL cannot put its next segment in place for want of a resource; trying again");
        narad_io::rt::sleep(pause).await;
        pause = (pause * 2).min(PAUSE_MAX);
    }
}

fn is_missing(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
}

/// `ENOMEM`, `ENFILE` and `EMFILE` on Linux.
const SHORTAGES: [i32; 3] = [12, 23, 24];

/// Whether `e` is a shortage that passes: descriptors or memory. The
/// runtime's I/O errors keep the system's error only in their text
/// ("Too many open files (os error 24)", then the operation and path).
pub fn short_of_resources(e: &io::Error) -> bool {
    if let Some(code) = e.raw_os_error() {
        return SHORTAGES.contains(&code);
    }
    let text = e.to_string();
    SHORTAGES
        .iter()
        .any(|code| text.contains(&format!("(os error {code})")))
}

#[cfg(test)]
mod tests {
    use super::short_of_resources;
    use std::io;

    #[test]
    fn shortages_are_told_apart_from_failures() {
        for code in [12, 23, 24] {
            assert!(short_of_resources(&io::Error::from_raw_os_error(code)));
            let wrapped: io::Error = glommio::GlommioError::<()>::EnhancedIoError {
                source: io::Error::from_raw_os_error(code),
                op: "Opening directory",
                path: Some("/data/ingress/shard-0".into()),
                fd: None,
            }
            .into();
            assert!(short_of_resources(&wrapped), "{wrapped}");
        }
        for code in [5, 28, 2] {
            assert!(!short_of_resources(&io::Error::from_raw_os_error(code)));
        }
        assert!(!short_of_resources(&io::Error::other("short write")));
    }
}
