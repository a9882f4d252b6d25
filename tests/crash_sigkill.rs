//! SIGKILL of a real writer process under load.
//!
//! `narad debug wal-writer` appends to an ingress WAL from 64 concurrent appenders
//! and commits to a partition log behind it. This test, not the writer, records
//! every id the writer printed as acknowledged, kills it with SIGKILL at a random
//! moment, restarts it on the same directory (which recovers the WAL and the log),
//! and repeats. One partition commits slowly, so commits land out of order and
//! the checkpoint has records in flight below it at any moment. Runs alternate
//! between logs that write zeros ahead of their commits and logs that do not.
//! At the end every acknowledged id must be in the partition log or
//! still in the WAL from its checkpoint on, with an intact payload.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use narad::devtools::{check_payload, log_dir, writer_log_config, WAL_DIR, WRITER_PARTITIONS};
use narad_io::dma::DmaStorage;
use narad_shards::log::{PartitionLog, ReadItem};
use narad_shards::wal::Wal;
use rand::Rng;

/// Writer runs, each ended by SIGKILL.
const KILL_CYCLES: u64 = 5;

/// Kills the child when the test ends, whatever way it ends.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the writer for `run_for`, SIGKILLs it, and returns the ids it acknowledged.
fn run_and_kill(dir: &Path, id_base: u64, prep_chunk_bytes: u64, run_for: Duration) -> Vec<u64> {
    let stderr = std::fs::File::create(dir.join(format!("writer-{id_base}.log"))).unwrap();
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_narad"))
            .args([
                "debug",
                "wal-writer",
                "--appenders",
                "64",
                "--size",
                "1024",
                "--seconds",
                "60",
            ])
            .arg("--dir")
            .arg(dir)
            .args([
                "--id-base",
                &id_base.to_string(),
                "--segment-bytes",
                "1048576",
                // Partition 0 commits slowly, so the other partitions' commits
                // overtake its records at every moment.
                "--log-prep-chunk-bytes",
                &prep_chunk_bytes.to_string(),
                "--slow-commit-ms",
                "20",
            ])
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("the narad binary starts"),
    );
    let stdout = child.0.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut ids = Vec::new();
        let mut reader = BufReader::new(stdout);
        let mut line = Vec::new();
        // Only whole lines count: a line cut by the kill was never fully printed.
        while reader.read_until(b'\n', &mut line).unwrap_or(0) > 0 {
            if line.ends_with(b"\n") {
                let text = std::str::from_utf8(&line).unwrap().trim();
                ids.push(text.strip_prefix("a ").unwrap().parse::<u64>().unwrap());
            }
            line.clear();
        }
        ids
    });
    std::thread::sleep(run_for);
    // Child::kill sends SIGKILL.
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    reader.join().unwrap()
}

/// Ids in the partition log and in the WAL from its checkpoint on, after recovery.
fn recovered_ids(dir: &Path) -> (HashSet<u64>, usize) {
    let storage = DmaStorage::new(dir);
    narad_io::rt::run_local(None, async move {
        let mut ids = HashSet::new();
        let mut corrupt = 0;
        let wal = Wal::open(storage.clone(), WAL_DIR, Default::default())
            .await
            .expect("WAL recovers");
        let mut reader = wal.reader(wal.checkpoint());
        while reader
            .read(4096, |_, rec| match check_payload(&rec.payload_vec()) {
                Some(id) => {
                    ids.insert(id);
                }
                None => corrupt += 1,
            })
            .await
            .expect("WAL reads")
            > 0
        {}
        wal.close().await;
        for partition in 0..WRITER_PARTITIONS {
            let dir = log_dir(partition);
            let log = PartitionLog::open(storage.clone(), &dir, writer_log_config(0)).await;
            corrupt += read_log(log.expect("log recovers"), &mut ids).await;
        }
        (ids, corrupt)
    })
}

async fn read_log(mut log: PartitionLog<DmaStorage>, ids: &mut HashSet<u64>) -> usize {
    let mut corrupt = 0;
    let mut offset = log.oldest_offset();
    while offset < log.high_watermark() {
        let batch = log.read(offset, 4096, 16 << 20).await.expect("log reads");
        for item in &batch.items {
            match item {
                ReadItem::Record(r) => match check_payload(&r.payload) {
                    Some(id) => {
                        ids.insert(id);
                    }
                    None => corrupt += 1,
                },
                ReadItem::Corrupt(range) => corrupt += (range.end.0 - range.start.0) as usize,
            }
        }
        assert!(batch.next_offset > offset, "log read makes progress");
        offset = batch.next_offset;
    }
    assert_eq!(offset, log.high_watermark());
    corrupt
}

#[test]
fn sigkill_under_load_loses_no_acknowledged_record() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut rng = rand::rng();
    let mut acked = Vec::new();
    for cycle in 0..KILL_CYCLES {
        let run_for = Duration::from_millis(rng.random_range(500..1200));
        // Every other run writes no zeros ahead of the log's commits (the
        // broker's `storage.log_prealloc` off), over logs the run before grew
        // the other way.
        let prep_chunk_bytes = if cycle % 2 == 0 { 1 << 20 } else { 0 };
        let ids = run_and_kill(dir.path(), cycle * 1_000_000_000, prep_chunk_bytes, run_for);
        assert!(
            !ids.is_empty(),
            "cycle {cycle}: the writer acknowledged nothing in {run_for:?}"
        );
        acked.extend(ids);
    }
    let (recovered, corrupt) = recovered_ids(dir.path());
    assert_eq!(corrupt, 0, "recovered records with corrupt payloads");
    let lost: Vec<u64> = acked
        .iter()
        .filter(|id| !recovered.contains(id))
        .copied()
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged records lost after SIGKILL, e.g. {:?}",
        lost.len(),
        acked.len(),
        &lost[..lost.len().min(10)]
    );
    eprintln!(
        "{} acknowledged records across {KILL_CYCLES} SIGKILLs, all recovered",
        acked.len()
    );
}
