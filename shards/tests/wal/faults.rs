//! Ingress WAL recovery on a device whose reads return a flipped bit now and then
//! (the stored bytes stay intact): opening must never cut or overwrite an
//! acknowledged record because of one bad read. And the writer's side of
//! recovery's torn window: nothing is written once a sync has failed, and no
//! second sync runs beside the one in flight.

use crate::common::*;
use narad_io::rt::run_local;
use narad_io::sim::{yield_once, SimDisk, SimFaults};
use narad_io::{align_down, BLOCK_BYTES};
use narad_shards::ids::Seq;
use narad_shards::wal::segment::segment_name;
use narad_shards::wal::{Wal, WalConfig};

const DIR: &str = "wal";

fn config() -> WalConfig {
    small_config(false)
}

fn segment_path(first: u64) -> String {
    format!("{DIR}/{}", segment_name(Seq(first)))
}

/// Appends records `ids` one by one (each acknowledged after its fdatasync) and
/// returns the byte position of each frame in the active segment, and its end,
/// given the segment started empty at `start_bytes`.
async fn append_ids(
    wal: &Wal<SimDisk>,
    ids: std::ops::Range<u64>,
    start_bytes: u64,
) -> (Vec<u64>, u64) {
    let mut positions = Vec::new();
    let mut pos = start_bytes;
    for id in ids {
        let payload = payload_for(id, 200 + (id as usize * 53) % 300);
        let rec = record(&payload, None);
        assert_eq!(wal.append(&rec).await.unwrap(), Seq(id));
        positions.push(pos);
        pos += rec.frame_len() as u64;
    }
    (positions, pos)
}

async fn assert_holds(wal: &Wal<SimDisk>, count: u64) {
    assert_eq!(wal.next_seq(), Seq(count), "records after recovery");
    let expected: Vec<_> = (0..count).map(|id| (Seq(id), id)).collect();
    assert_eq!(read_all(wal, Seq(0)).await, expected);
}

#[test]
fn a_read_flip_at_open_does_not_cut_acknowledged_records() {
    // Guards: the open-time scan of the last WAL segment stopped at the first frame
    // one bad read made undecodable, took the acknowledged records after it for a
    // torn write and zeroed them.
    run_local(None, async {
        let disk = SimDisk::new(11, SimFaults::default());
        let wal = Wal::open(disk.clone(), DIR, config()).await.unwrap();
        let (positions, _) = append_ids(&wal, 0..40, 0).await;
        assert_eq!(wal.segment_count(), 1);
        wal.close().await;
        // One bad read of a byte inside the body of record 20.
        disk.flip_next_read_at(&segment_path(0), positions[20] + 30, 3);
        let wal = Wal::open(disk.clone(), DIR, config()).await.unwrap();
        assert_holds(&wal, 40).await;
        append_ids(&wal, 40..45, 0).await;
        assert_holds(&wal, 45).await;
        wal.close().await;
        let wal = Wal::open(disk, DIR, config()).await.unwrap();
        assert_holds(&wal, 45).await;
        wal.close().await;
    });
}

#[test]
fn bad_reads_at_several_frames_of_one_scan_each_get_their_own_second_read() {
    // Guards: the scan's budget of reads of a bad frame counted over the whole
    // segment, so after a few bad reads that a second read each cleared, the
    // next bad read ended the scan unread again, and the acknowledged records
    // after it were taken for a torn write and zeroed.
    run_local(None, async {
        let disk = SimDisk::new(15, SimFaults::default());
        let wal = Wal::open(disk.clone(), DIR, config()).await.unwrap();
        let (positions, _) = append_ids(&wal, 0..40, 0).await;
        assert_eq!(wal.segment_count(), 1);
        wal.close().await;
        // Each read that gets past one bad frame meets the next.
        for record in [5, 10, 15, 20, 25, 30] {
            disk.flip_next_read_at(&segment_path(0), positions[record] + 30, 2);
        }
        let wal = Wal::open(disk.clone(), DIR, config()).await.unwrap();
        assert_holds(&wal, 40).await;
        wal.close().await;
    });
}

#[test]
fn a_read_flip_in_the_last_frame_header_at_open_keeps_it() {
    // Guards: a bad read of the last acknowledged frame's header at open made the
    // scan end in front of it, and the next append took its sequence number.
    for prealloc in [false, true] {
        run_local(None, async move {
            let disk = SimDisk::new(12, SimFaults::default());
            let config = small_config(prealloc);
            let wal = Wal::open(disk.clone(), DIR, config.clone()).await.unwrap();
            let (positions, _) = append_ids(&wal, 0..10, 0).await;
            // The process dies with everything acknowledged (and so synced).
            drop(wal);
            disk.restart_process();
            // A bit of the length field of the last frame.
            disk.flip_next_read_at(&segment_path(0), positions[9] + 6, 1);
            let wal = Wal::open(disk.clone(), DIR, config.clone()).await.unwrap();
            assert_holds(&wal, 10).await;
            append_ids(&wal, 10..12, 0).await;
            wal.close().await;
            let wal = Wal::open(disk, DIR, config).await.unwrap();
            assert_holds(&wal, 12).await;
            wal.close().await;
        });
    }
}

#[test]
fn a_read_flip_in_a_sealed_segment_at_open_does_not_fail_recovery() {
    // Guards: a bad read of a sealed segment that dispatch still needs made the
    // open fail, as if the segment were corrupt on the disk.
    run_local(None, async {
        let disk = SimDisk::new(13, SimFaults::default());
        let wal = Wal::open(disk.clone(), DIR, config()).await.unwrap();
        append_ids(&wal, 0..400, 0).await;
        assert!(wal.segment_count() > 2, "64 KiB segments must have rolled");
        wal.close().await;
        disk.flip_next_read_at(&segment_path(0), 1000, 6);
        let wal = Wal::open(disk, DIR, config()).await.unwrap();
        assert_holds(&wal, 400).await;
        wal.close().await;
    });
}

#[test]
fn a_read_flip_while_erasing_a_torn_run_is_not_written_back() {
    // Guards: erasing a torn run read the block holding the end of the acknowledged
    // frames once and wrote it back, so a bad read of that block became a durable
    // flip inside an acknowledged record.
    run_local(None, async {
        let disk = SimDisk::new(14, SimFaults::default());
        let wal = Wal::open(disk.clone(), DIR, config()).await.unwrap();
        let (acked_positions, acked_end) = append_ids(&wal, 0..20, 0).await;
        // Records 20.. stand for a write the process never saw acknowledged: its
        // first frame went bad (a lost sector) and the frames after it survived.
        let (torn_positions, _) = append_ids(&wal, 20..30, acked_end).await;
        wal.close().await;
        let segment = segment_path(0);
        disk.rot(&segment, torn_positions[0] as usize + 25, 2);
        // The last acknowledged frame shares its block with the torn run: aim one
        // bad read at a byte of it inside that block.
        let target = acked_positions[19].max(align_down(acked_end)) + 1;
        assert!(target < acked_end && align_down(target) == align_down(acked_end));
        assert!(acked_end % BLOCK_BYTES as u64 != 0);
        disk.flip_next_block_read_at(&segment, target, 4);
        let wal = Wal::open(disk.clone(), DIR, config()).await.unwrap();
        assert_holds(&wal, 20).await;
        append_ids(&wal, 20..25, acked_end).await;
        assert_holds(&wal, 25).await;
        wal.close().await;
        let wal = Wal::open(disk, DIR, config()).await.unwrap();
        assert_holds(&wal, 25).await;
        wal.close().await;
    });
}

/// A torn run's surviving frames are reported with the last sequence number
/// among them, which recovery logs as what is lost if the bad frame was rot.
#[test]
fn a_torn_run_is_reported_with_its_last_surviving_seq() {
    run_local(None, async {
        let disk = SimDisk::new(15, SimFaults::default());
        let wal = Wal::open(disk.clone(), DIR, config()).await.unwrap();
        let (_, acked_end) = append_ids(&wal, 0..20, 0).await;
        let (torn_positions, torn_end) = append_ids(&wal, 20..30, acked_end).await;
        wal.close().await;
        let segment = segment_path(0);
        disk.rot(&segment, torn_positions[0] as usize + 25, 2);
        let file = narad_io::Storage::open(&disk, &segment, narad_io::file::OpenMode::Existing)
            .await
            .unwrap();
        let end = narad_shards::wal::segment::scan(&file, Seq(0), None)
            .await
            .unwrap();
        assert_eq!(end.next_seq, Seq(20));
        assert_eq!(end.torn_until_bytes, Some(torn_end));
        assert_eq!(end.torn_last_seq, Some(Seq(29)));
    });
}

/// Recovery tells a torn tail from corruption by a window of two write runs
/// past the first bad frame, which holds only if no run is written once a
/// sync has failed. Here batch A's sync fails while batch B, two runs long, is
/// being written beside it; the sync between B's runs succeeds (a later
/// fsync does not report an earlier error again), and B's second run must not
/// follow: A's lost sectors, B's first run and its second would be three runs.
/// B is staged after a varying number of executor turns, so that one of the
/// runs takes it while A's sync is in flight.
/// A WAL whose every batch is written and then synced beside the next one's
/// write (the pipeline), into segments nothing was prepared for.
fn pipelined_unprepared() -> WalConfig {
    WalConfig {
        segment_bytes_max: 64 << 20,
        prealloc: false,
        durable_writes: false,
        ..WalConfig::default()
    }
}

/// Payloads of a one-block batch A, then of a batch B of two `run_bytes`
/// records, which takes two write runs.
fn one_block_then_two_runs(run_bytes: usize) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    (
        payload_for(0, 4096),
        payload_for(1, run_bytes),
        payload_for(2, run_bytes),
    )
}

#[test]
fn no_run_is_written_after_a_failed_sync() {
    let run_bytes = 10 << 20;
    for turns in 0..6 {
        let disk = SimDisk::new(41, SimFaults::default());
        disk.set_slow_writes(true);
        run_local(None, {
            let disk = disk.clone();
            async move {
                let wal = Wal::open(disk.clone(), DIR, pipelined_unprepared())
                    .await
                    .unwrap();
                let (a, b1, b2) = one_block_then_two_runs(run_bytes);
                let written_before = disk.stats().bytes_written;
                disk.fail_next_syncs(1);
                let first = narad_io::rt::spawn_local({
                    let wal = wal.clone();
                    async move { wal.append(&record(&a, None)).await }
                });
                for _ in 0..turns {
                    yield_once().await;
                }
                let second = wal
                    .append_many(&[record(&b1, None), record(&b2, None)])
                    .await;
                assert!(first.await.unwrap().is_err(), "A's sync failed");
                assert!(second.is_err(), "B was written beside a failed sync");
                // The flush loop has stopped once the close returns.
                wal.close().await;
                let written = disk.stats().bytes_written - written_before;
                assert!(
                    written < 2 * run_bytes as u64,
                    "B's second run was written after the WAL latched ({turns} turns): \
                     {written} bytes in all"
                );
            }
        });
    }
}

/// A batch of several runs, staged while the previous batch's sync is in
/// flight, is written only once that sync is done: each of its runs but the
/// last is synced before the next, and a second sync beside the first could
/// succeed before the first fails and let a further run through (past what
/// recovery's torn window allows for). So no two syncs are ever in flight.
#[test]
fn a_batch_of_several_runs_waits_for_the_sync_in_flight() {
    let run_bytes = 10 << 20;
    for turns in 0..4 {
        let disk = SimDisk::new(43, SimFaults::default());
        disk.set_slow_writes(true);
        disk.set_sync_turns(8);
        run_local(None, {
            let disk = disk.clone();
            async move {
                let wal = Wal::open(disk.clone(), DIR, pipelined_unprepared())
                    .await
                    .unwrap();
                let (a, b1, b2) = one_block_then_two_runs(run_bytes);
                let first = narad_io::rt::spawn_local({
                    let wal = wal.clone();
                    async move { wal.append(&record(&a, None)).await }
                });
                for _ in 0..turns {
                    yield_once().await;
                }
                wal.append_many(&[record(&b1, None), record(&b2, None)])
                    .await
                    .unwrap();
                first.await.unwrap().unwrap();
                assert_eq!(read_all(&wal, Seq(0)).await.len(), 3);
                assert_eq!(
                    disk.stats().syncs_in_flight_max,
                    1,
                    "two syncs were in flight at once ({turns} turns)"
                );
                wal.close().await;
            }
        });
    }
}
