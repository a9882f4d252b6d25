//! The ingress WAL's dispatch checkpoint under load and faults: its stores go
//! to the page cache, not each to the device; a checkpoint the dispatcher moves
//! during every store is still synced once due; and a failed sync has the value
//! stored again before a retry vouches for it. The done-set a graceful stop
//! leaves beside it is taken once, and only by the WAL it describes.

use std::time::Duration;

use crate::common::*;
use narad_io::file::OpenMode;
use narad_io::rt::run_local;
use narad_io::sim::{SimDisk, SimFaults};
use narad_io::{BlockFile, Storage};
use narad_shards::ids::Seq;
use narad_shards::wal::dispatched::DISPATCHED_FILE;
use narad_shards::wal::{DispatchProgress, Wal, WalConfig};

/// Opens the small test WAL on `disk` with its checkpoint syncs held back an
/// hour, so that a test decides when one is due (`dsync`: see `small_config`).
async fn open_with_syncs_held(disk: &SimDisk, dsync: bool) -> Wal<SimDisk> {
    let config = WalConfig {
        checkpoint_sync_delay: Duration::from_secs(3600),
        ..small_config(dsync)
    };
    Wal::open(disk.clone(), "wal", config).await.unwrap()
}

/// Opens a WAL of 100 records on `disk`, moves its checkpoint to each of them
/// in turn, `pause` apart, and waits until the last is synced; the disk's
/// counts before the moves and after the sync.
async fn move_checkpoint_100_times(
    disk: &SimDisk,
    config: WalConfig,
    pause: Duration,
) -> (narad_io::sim::SimStats, narad_io::sim::SimStats) {
    let wal = Wal::open(disk.clone(), "wal", config).await.unwrap();
    let payload = payload_for(1, 16);
    let records: Vec<_> = (0..100).map(|_| record(&payload, None)).collect();
    wal.append_many(&records).await.unwrap();
    let before = disk.stats();
    for seq in 1..=100 {
        wal.store_checkpoint(Seq(seq));
        narad_io::rt::sleep(pause).await;
    }
    let started = std::time::Instant::now();
    while wal.synced_checkpoint() < Seq(100) {
        assert!(started.elapsed() < Duration::from_secs(10), "never synced");
        narad_io::rt::sleep(Duration::from_millis(5)).await;
    }
    let after = disk.stats();
    wal.close().await;
    (before, after)
}

/// The backlog counts records not yet committed, not those whose commit is
/// only waiting for the checkpoint's lazy sync: a busy node would otherwise
/// show a quarter second of its rate there with nothing waiting.
#[test]
fn the_dispatch_backlog_is_what_the_checkpoint_has_not_passed() {
    let disk = SimDisk::new(5, SimFaults::default());
    run_local(None, async move {
        let wal = open_with_syncs_held(&disk, false).await;
        let payload = payload_for(1, 16);
        let records: Vec<_> = (0..10).map(|_| record(&payload, None)).collect();
        wal.append_many(&records).await.unwrap();
        assert_eq!(wal.dispatch_backlog_records(), 10);
        wal.store_checkpoint(Seq(4));
        assert_eq!(wal.dispatch_backlog_records(), 6);
        wal.store_checkpoint(Seq(10));
        assert_eq!(wal.dispatch_backlog_records(), 0);
        assert!(wal.synced_checkpoint() < Seq(10), "synced already");
        wal.close().await;
    });
}

/// A checkpoint stored past the start of a segment is synced at once, not
/// after the sync delay: a busy WAL fills a segment well within the delay, and
/// only a synced checkpoint lets compaction turn the segments behind it into
/// spares for the next rolls. A checkpoint that frees no segment still waits.
#[test]
fn a_checkpoint_past_a_segment_start_is_synced_at_once() {
    let disk = SimDisk::new(31, SimFaults::default());
    run_local(None, async move {
        let wal = open_with_syncs_held(&disk, true).await;
        let payload = payload_for(1, 1024);
        let records: Vec<_> = (0..8).map(|_| record(&payload, None)).collect();
        // Within the first segment: nothing to free, so the sync waits.
        wal.append_many(&records).await.unwrap();
        wal.store_checkpoint(wal.durable_next());
        narad_io::rt::sleep(Duration::from_millis(50)).await;
        assert_eq!(wal.synced_checkpoint(), Seq(0), "synced before its delay");
        // Three segments and more, each dispatched as it is written.
        while wal.stats().rolls < 3 {
            wal.append_many(&records).await.unwrap();
            wal.store_checkpoint(wal.durable_next());
        }
        wait_until(|| wal.stats().compactions >= 2).await;
        // The segments behind the checkpoint became spares: the preparations
        // for the next rolls rename one rather than zero-fill a new file.
        while wal.stats().rolls < 6 {
            wal.append_many(&records).await.unwrap();
            wal.store_checkpoint(wal.durable_next());
        }
        wait_until(|| wal.stats().segments_recycled >= 1).await;
        let stats = wal.stats();
        assert_eq!(stats.prepared_rolls, stats.rolls, "{stats:?}");
        assert!(stats.checkpoint_syncs <= stats.rolls + 1, "{stats:?}");
        wal.close().await;
    });
}

/// The sync a segment boundary brings forward can fail like any other: the
/// segment behind it is then not compacted until a later sync succeeds.
#[test]
fn a_failed_early_sync_compacts_nothing() {
    let disk = SimDisk::new(32, SimFaults::default());
    run_local(None, async move {
        let wal = open_with_syncs_held(&disk, false).await;
        let payload = payload_for(1, 1024);
        let records: Vec<_> = (0..8).map(|_| record(&payload, None)).collect();
        while wal.segment_count() < 3 {
            wal.append_many(&records).await.unwrap();
        }
        assert!(!wal.checkpoint_failing());
        disk.fail_next_syncs(1);
        wal.store_checkpoint(wal.durable_next());
        narad_io::rt::sleep(Duration::from_millis(100)).await;
        assert_eq!(wal.synced_checkpoint(), Seq(0), "the sync failed");
        assert_eq!(wal.segment_count(), 3, "nothing compacted behind it");
        assert!(wal.checkpoint_failing(), "and says so");
        // The retry (a second later) stores the value again and syncs it.
        let target = wal.durable_next();
        wait_until(|| wal.synced_checkpoint() == target).await;
        wait_until(|| wal.segment_count() == 1).await;
        assert!(!wal.checkpoint_failing(), "synced since");
        wal.close().await;
    });
}

/// The checkpoint moves with every commit that lands, at low rates once a
/// record: each store is a page-cache write, and only the lazy sync reaches the
/// device, so a move costs no device write of its own.
#[test]
fn checkpoint_stores_are_page_cache_writes_until_the_sync() {
    let disk = SimDisk::new(7, SimFaults::default());
    run_local(None, async move {
        let config = WalConfig {
            checkpoint_sync_delay: Duration::from_millis(50),
            ..small_config(false)
        };
        let (before, after) =
            move_checkpoint_100_times(&disk, config, Duration::from_micros(100)).await;
        let device_writes = |s: &narad_io::sim::SimStats| s.writes - s.cached_writes;
        assert!(
            after.cached_writes > before.cached_writes,
            "no store landed"
        );
        assert_eq!(
            device_writes(&after),
            device_writes(&before),
            "checkpoint stores wrote to the device ({} stores)",
            after.cached_writes - before.cached_writes
        );
        assert!(after.syncs > before.syncs, "the sync made them durable");
    });
}

/// Moves within one store interval go out as one write of the newest value:
/// under load the dispatcher moves the checkpoint with every commit, and each
/// write is work for a thread on the shard's core.
#[test]
fn checkpoint_moves_within_a_store_interval_share_one_write() {
    let disk = SimDisk::new(9, SimFaults::default());
    run_local(None, async move {
        let config = WalConfig {
            checkpoint_sync_delay: Duration::from_millis(20),
            checkpoint_store_interval: Duration::from_millis(200),
            ..small_config(false)
        };
        // 100 moves within about 20 ms: the first is written at once, the
        // rest wait for the interval's end and go out as one write.
        let (before, after) =
            move_checkpoint_100_times(&disk, config, Duration::from_micros(200)).await;
        let stores = after.cached_writes - before.cached_writes;
        assert!(
            (1..=3).contains(&stores),
            "100 checkpoint moves within one interval took {stores} writes"
        );
    });
}

/// A dispatcher that moves the checkpoint during every store of it (commits
/// landing faster than one device write) must not keep the checkpoint from
/// being synced: compaction waits for that sync, so the WAL would grow without
/// bound. Writes here take a turn of the executor, and the task below moves the
/// checkpoint on every turn.
#[test]
fn a_checkpoint_moved_during_every_store_is_still_synced() {
    let disk = SimDisk::new(24, SimFaults::default());
    run_local(None, async move {
        let config = WalConfig {
            checkpoint_sync_delay: Duration::from_millis(1),
            // Every move stored at once, back to back (the case the throttle
            // below would otherwise hide).
            checkpoint_store_interval: Duration::ZERO,
            ..small_config(false)
        };
        let wal = Wal::open(disk.clone(), "wal", config).await.unwrap();
        let payload = payload_for(1, 16);
        let records: Vec<_> = (0..1000).map(|_| record(&payload, None)).collect();
        for _ in 0..100 {
            wal.append_many(&records).await.unwrap();
        }
        disk.set_slow_writes(true);
        let end = wal.durable_next();
        let started = std::time::Instant::now();
        let mut next = 1;
        while wal.synced_checkpoint() == Seq(0) && next < end.0 {
            wal.store_checkpoint(Seq(next));
            next += 1;
            futures_lite::future::yield_now().await;
        }
        assert!(
            wal.synced_checkpoint() > Seq(0),
            "no sync in {:?} of {} stores",
            started.elapsed(),
            next
        );
        wal.close().await;
    });
}

/// A checkpoint sync that fails may have dropped the stored value from the
/// device (reads then show the old one). The retry must store it again before
/// its sync vouches for it: else compaction trusts a checkpoint a power loss
/// takes back. The seed is one whose failed sync drops the sector.
#[test]
fn a_failed_checkpoint_sync_stores_the_value_again_before_the_retry() {
    let disk = SimDisk::new(SEED_DROPPING_A_FAILED_SYNC, SimFaults::default());
    let disk2 = disk.clone();
    run_local(None, async move {
        let wal = Wal::open(disk.clone(), "wal", small_config(false))
            .await
            .unwrap();
        let payload = payload_for(1, 16);
        let records: Vec<_> = (0..100).map(|_| record(&payload, None)).collect();
        wal.append_many(&records).await.unwrap();
        let head = |disk: &SimDisk| disk.contents("wal/checkpoint").unwrap()[..32].to_vec();
        let stored_before = head(&disk);
        disk.fail_next_syncs(1);
        wal.store_checkpoint(Seq(60));
        // The failed sync, then the retry a second later.
        let started = std::time::Instant::now();
        while wal.synced_checkpoint() < Seq(60) {
            assert!(started.elapsed() < Duration::from_secs(10), "never synced");
            narad_io::rt::sleep(Duration::from_millis(5)).await;
        }
        assert_ne!(head(&disk), stored_before, "the device holds the new value");
        disk.crash();
    });
    disk2.reboot();
    run_local(None, async move {
        let wal = Wal::open(disk2, "wal", small_config(false)).await.unwrap();
        assert_eq!(wal.checkpoint(), Seq(60), "the synced checkpoint survived");
        wal.close().await;
    });
}

/// A seed of [`SimDisk`] whose first failed sync drops the sector it covered.
const SEED_DROPPING_A_FAILED_SYNC: u64 = 26;

/// The done-set a stop leaves: written at the close when the checkpoint is
/// durable, handed back once by the next open (which removes the file), and
/// dropped when the WAL no longer is what it was written for.
#[test]
fn the_done_set_a_stop_leaves_is_taken_once_and_only_by_the_wal_it_describes() {
    let disk = SimDisk::new(11, SimFaults::default());
    run_local(None, async move {
        let open = || Wal::open(disk.clone(), "wal", small_config(false));
        let payload = payload_for(1, 16);
        let records: Vec<_> = (0..10).map(|_| record(&payload, None)).collect();
        let wal = open().await.unwrap();
        wal.append_many(&records).await.unwrap();
        wal.store_checkpoint(Seq(2));
        let mut progress = DispatchProgress::new(Seq(2));
        progress.mark_done(Seq(4));
        progress.mark_done(Seq(7));
        wal.leave_dispatched(progress);
        wal.close().await;
        assert!(disk_names_contain(&disk, DISPATCHED_FILE));
        let bytes = read_file(&disk, DISPATCHED_FILE).await;

        let wal = open().await.unwrap();
        assert!(!disk_names_contain(&disk, DISPATCHED_FILE), "taken once");
        let taken = wal.take_dispatched().expect("trusted");
        assert_eq!(taken.checkpoint(), Seq(2));
        let done: Vec<u64> = (2..10).filter(|&s| taken.is_done(Seq(s))).collect();
        assert_eq!(done, [4, 7]);
        assert!(wal.take_dispatched().is_none());
        // A stop with nothing done above the checkpoint writes nothing.
        wal.leave_dispatched(DispatchProgress::new(Seq(2)));
        wal.append_many(&records[..1]).await.unwrap();
        wal.close().await;
        assert!(!disk_names_contain(&disk, DISPATCHED_FILE));

        // The same file put back after the WAL took another record: its
        // flags may name records it was not written for, so it is dropped.
        write_file(&disk, DISPATCHED_FILE, &bytes).await;
        let wal = open().await.unwrap();
        assert!(wal.take_dispatched().is_none(), "next_seq moved");
        assert!(!disk_names_contain(&disk, DISPATCHED_FILE));
        // Nor is a done-set written over a checkpoint that is not durable.
        wal.store_checkpoint(Seq(3));
        let mut progress = DispatchProgress::new(Seq(3));
        progress.mark_done(Seq(5));
        wal.leave_dispatched(progress.clone());
        wal.close().await;
        assert!(disk_names_contain(&disk, DISPATCHED_FILE));
        let wal = open().await.unwrap();
        wal.store_checkpoint(Seq(4));
        wal.leave_dispatched(progress);
        wal.close().await;
        assert!(
            !disk_names_contain(&disk, DISPATCHED_FILE),
            "written for checkpoint 3 with 4 durable"
        );
    });
}

async fn read_file(disk: &SimDisk, name: &str) -> Vec<u8> {
    let file = disk
        .open(&format!("wal/{name}"), OpenMode::Existing)
        .await
        .unwrap();
    let mut bytes = vec![0u8; file.size().await.unwrap() as usize];
    file.read_at(0, &mut bytes).await.unwrap();
    file.close().await.unwrap();
    bytes
}

async fn write_file(disk: &SimDisk, name: &str, bytes: &[u8]) {
    let file = disk
        .open(&format!("wal/{name}"), OpenMode::CreateOrOpen)
        .await
        .unwrap();
    file.write_at(0, bytes).await.unwrap();
    file.sync_data().await.unwrap();
    file.close().await.unwrap();
}

/// A close whose last checkpoint sync fails does not wait for the disk, and
/// leaves the checkpoint it could not make durable visible, so that the node
/// can say its stop was not clean (a restart replays what lies between).
#[test]
fn a_close_whose_checkpoint_sync_fails_shows_the_checkpoint_left_behind() {
    let disk = SimDisk::new(33, SimFaults::default());
    run_local(None, async move {
        let wal = open_with_syncs_held(&disk, false).await;
        let payload = payload_for(1, 256);
        let records: Vec<_> = (0..8).map(|_| record(&payload, None)).collect();
        wal.append_many(&records).await.unwrap();
        wal.store_checkpoint(wal.durable_next());
        disk.fail_next_syncs(1);
        wal.close().await;
        assert_eq!(wal.checkpoint(), Seq(8));
        assert_eq!(wal.synced_checkpoint(), Seq(0), "its sync failed");
    });
}
