//! What the partition log tests share: a small configuration, payloads
//! derived from record indexes, and committing, reading and checking them.
#![allow(dead_code)]

use narad_io::sim::{SimDisk, SimFaults};
use narad_io::Storage;
use narad_shards::ids::Offset;
use narad_shards::log::{LogConfig, LogError, PartitionLog, ReadItem, RecordRef};

pub const DIR: &str = "topics/t/p00000";

pub fn config() -> LogConfig {
    LogConfig {
        segment_bytes_max: 256 * 1024,
        prep_chunk_bytes: 64 * 1024,
        index_interval_bytes: 4096,
        frame_area_bytes_target: 8 * 1024,
        commit_bytes_max: 1024 * 1024,
        ..LogConfig::default()
    }
}

pub fn payload(i: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i as usize * 31 + j) as u8).collect()
}

/// A simulated disk of `seed` with no faults, and a log opened in `dir` on it.
pub async fn fresh_log(
    seed: u64,
    dir: &str,
    config: LogConfig,
) -> (SimDisk, PartitionLog<SimDisk>) {
    let disk = SimDisk::new(seed, SimFaults::default());
    let log = (PartitionLog::open(disk.clone(), dir, config).await).expect("a fresh log opens");
    (disk, log)
}

/// Commits `n` records with payloads derived from their index `first..first+n`.
pub async fn commit_n<S: Storage>(
    log: &mut PartitionLog<S>,
    first: u64,
    n: u64,
    now_ms: u64,
) -> Result<std::ops::Range<Offset>, LogError> {
    let payloads: Vec<Vec<u8>> = (first..first + n)
        .map(|i| payload(i, 100 + (i % 7) as usize * 50))
        .collect();
    let keys: Vec<Vec<u8>> = (first..first + n)
        .map(|i| format!("key-{i}").into_bytes())
        .collect();
    let records: Vec<RecordRef> = payloads
        .iter()
        .zip(&keys)
        .enumerate()
        .map(|(j, (p, k))| RecordRef {
            key: (j % 3 != 0).then_some(k.as_slice()),
            payload: p,
            mask: 0,
        })
        .collect();
    log.commit_durable(&records, now_ms).await
}

/// Reads everything from `from` to the high watermark.
pub async fn read_all<S: Storage>(log: &mut PartitionLog<S>, from: Offset) -> Vec<ReadItem> {
    let mut items = Vec::new();
    let mut at = from;
    for _ in 0..100_000 {
        if at >= log.high_watermark() {
            break;
        }
        let batch = log.read(at, 37, 64 * 1024).await.expect("read");
        assert!(batch.next_offset > at, "reads make progress");
        at = batch.next_offset;
        items.extend(batch.items);
    }
    items
}

/// Checks that the log holds exactly the records `0..n` written by `commit_n`.
pub async fn assert_holds<S: Storage>(log: &mut PartitionLog<S>, n: u64) {
    assert_eq!(log.high_watermark(), Offset(n));
    let items = read_all(log, Offset(0)).await;
    assert_eq!(items.len() as u64, n);
    for (i, item) in items.iter().enumerate() {
        let i = i as u64;
        let ReadItem::Record(record) = item else {
            panic!("offset {i} unreadable: {item:?}")
        };
        assert_eq!(record.offset, Offset(i));
        assert_eq!(
            record.payload.as_ref(),
            payload(i, 100 + (i % 7) as usize * 50).as_slice(),
            "offset {i}"
        );
        // Records were committed in batches; the key rule is per position in its
        // batch, so only check that a present key is the right one.
        if let Some(key) = &record.key {
            assert_eq!(key.as_ref(), format!("key-{i}").as_bytes());
        }
    }
}

/// Reopens the log on `disk`: it holds exactly records `0..n`, and takes two
/// more after them.
pub async fn reopened_holds_and_goes_on(disk: &SimDisk, n: u64) {
    let mut log = PartitionLog::open(disk.clone(), DIR, config())
        .await
        .unwrap();
    assert_holds(&mut log, n).await;
    commit_n(&mut log, n, 2, 3).await.unwrap();
    assert_holds(&mut log, n + 2).await;
}
