//! What the WAL reports to its observer (the node's WAL metrics): one report
//! per group commit that became durable, with the records it made durable and
//! the device bytes written so far; nothing for a batch whose write or sync
//! failed.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::common::*;
use narad_io::rt::run_local;
use narad_io::sim::{SimDisk, SimFaults};
use narad_shards::wal::{Wal, WalConfig, WalObserver};

#[derive(Default)]
struct Reports(RefCell<Vec<(Duration, u64, u64)>>);

impl WalObserver for Reports {
    fn synced(&self, took: Duration, records: u64, device_bytes_total: u64) {
        self.0
            .borrow_mut()
            .push((took, records, device_bytes_total));
    }
}

/// Appends `appenders` x `each` records at once, from as many tasks, and
/// returns how long it took.
async fn append_concurrently(wal: &Wal<SimDisk>, appenders: u64, each: u64) -> Duration {
    let started = Instant::now();
    let tasks: Vec<_> = (0..appenders)
        .map(|a| {
            let wal = wal.clone();
            narad_io::rt::spawn_local(async move {
                for i in 0..each {
                    let payload = payload_for(a * 1_000 + i, 200);
                    wal.append(&record(&payload, None)).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    started.elapsed()
}

fn reports_add_up(config: WalConfig) {
    let disk = SimDisk::new(5, SimFaults::default());
    disk.set_slow_writes(true);
    run_local(None, async move {
        let wal = Wal::open(disk.clone(), "wal", config).await.unwrap();
        let reports = Rc::new(Reports::default());
        wal.observe(reports.clone());
        let before = wal.stats();
        let elapsed = append_concurrently(&wal, 16, 20).await;
        let after = wal.stats();
        let reports = reports.0.borrow().clone();
        let records: u64 = reports.iter().map(|r| r.1).sum();
        assert_eq!(records, 320, "every durable record reported once");
        assert_eq!(
            reports.len() as u64,
            after.flushes - before.flushes,
            "one report per group commit"
        );
        assert!(
            reports.len() < 320,
            "concurrent appends shared group commits ({} for 320 records)",
            reports.len()
        );
        assert!(reports.iter().all(|r| r.1 > 0 && r.0 <= elapsed));
        assert!(
            reports.windows(2).all(|w| w[0].2 <= w[1].2),
            "device bytes only grow"
        );
        assert_eq!(reports.last().unwrap().2, after.device_bytes);
        wal.close().await;
    });
}

#[test]
fn each_durable_group_commit_is_reported_once_with_its_records() {
    reports_add_up(small_config(true));
}

#[test]
fn pipelined_group_commits_are_reported_once_with_their_records() {
    reports_add_up(pipeline_config(true));
}

#[test]
fn a_batch_whose_sync_failed_is_not_reported() {
    let disk = SimDisk::new(9, SimFaults::default());
    run_local(None, async move {
        let wal = Wal::open(disk.clone(), "wal", pipeline_config(false))
            .await
            .unwrap();
        let reports = Rc::new(Reports::default());
        wal.observe(reports.clone());
        let payload = payload_for(1, 100);
        wal.append(&record(&payload, None)).await.unwrap();
        assert_eq!(reports.0.borrow().len(), 1, "the good batch");
        disk.fail_next_syncs(1);
        assert!(wal.append(&record(&payload, None)).await.is_err());
        assert!(wal.is_latched());
        assert_eq!(reports.0.borrow().len(), 1, "the failed batch was reported");
        wal.close().await;
    });
}

/// `Wal::stalled_for` is how long records have waited for a disk that does
/// not answer: none while everything is durable, the time since the first
/// waiting record was staged while its sync is out, none again once it lands,
/// and none for a latched WAL (which says so by itself).
#[test]
fn records_waiting_for_the_disk_show_how_long_they_waited() {
    let disk = SimDisk::new(11, SimFaults::default());
    run_local(None, async move {
        let wal = Wal::open(disk.clone(), "wal", pipeline_config(false))
            .await
            .unwrap();
        let payload = payload_for(1, 100);
        wal.append(&record(&payload, None)).await.unwrap();
        assert_eq!(wal.stalled_for(Instant::now()), None, "all durable");

        disk.set_sync_turns(50);
        let staged_at = Instant::now();
        let done = Rc::new(std::cell::Cell::new(false));
        let appending = {
            let (wal, payload, done) = (wal.clone(), payload.clone(), done.clone());
            narad_io::rt::spawn_local(async move {
                wal.append(&record(&payload, None)).await.unwrap();
                done.set(true);
            })
        };
        for _ in 0..10 {
            narad_io::sim::yield_once().await;
        }
        assert!(!done.get(), "its sync is still out");
        // Staged between `staged_at` and now.
        let later = staged_at + Duration::from_secs(30);
        let waited = wal.stalled_for(later).expect("a record waits for the disk");
        assert!(
            waited <= later - staged_at && waited >= later - Instant::now(),
            "{waited:?}"
        );
        appending.await.unwrap();
        assert_eq!(wal.stalled_for(later), None, "durable again");

        disk.set_sync_turns(1);
        disk.fail_next_syncs(1);
        assert!(wal.append(&record(&payload, None)).await.is_err());
        assert!(wal.is_latched());
        assert_eq!(wal.stalled_for(later), None, "a latch is no stall");
        wal.close().await;
    });
}
