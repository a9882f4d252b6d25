//! A run of commit batches past the log's commit limit (a backlog of large records
//! drained at once) commits whole, cut into pieces the log takes, with each batch
//! answered its own consecutive offsets; a single batch past the limit too.

use std::rc::Rc;
use std::sync::Arc;

use futures_channel::oneshot;
use narad_io::rt::run_local;
use narad_io::sim::{SimDisk, SimFaults};
use narad_shards::ids::{IncarnationId, Offset, PartitionId};
use narad_shards::log::{LogConfig, ReadItem, ReadRange};
use narad_shards::produce::{OwnedRecord, Owner};

const TOPIC: &str = "big";
const ID: IncarnationId = IncarnationId(0xb16);
const COMMIT_BYTES_MAX: usize = 64 << 10;

fn owner(disk: &SimDisk) -> Rc<Owner<SimDisk>> {
    let config = LogConfig {
        segment_bytes_max: 128 << 10,
        prep_chunk_bytes: 16 << 10,
        index_interval_bytes: 2048,
        frame_area_bytes_target: 8192,
        commit_bytes_max: COMMIT_BYTES_MAX,
        ..LogConfig::default()
    };
    let live = Box::new(|topic: &str, id: IncarnationId, p: PartitionId| {
        topic == TOPIC && id == ID && p.0 == 0
    });
    Owner::new(disk.clone(), config, live)
}

/// `count` payloads of `size` bytes, each starting with its tag and index.
fn payloads(tag: &str, count: usize, size: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| {
            let mut p = format!("{tag}-{i}-").into_bytes();
            p.resize(size, tag.as_bytes()[0]);
            p
        })
        .collect()
}

#[test]
fn a_run_past_the_commit_limit_commits_whole_in_order() {
    let disk = SimDisk::new(7, SimFaults::default());
    run_local(None, async move {
        let owner = owner(&disk);
        // Queued before the cycle runs, so they make one run of about 300 KiB;
        // "c" alone is past the limit, "b" is one record under it.
        let batches = [
            payloads("a", 10, 5_000),
            payloads("b", 1, 60_000),
            payloads("c", 40, 3_000),
            payloads("d", 5, 100),
            payloads("e", 20, 4_000),
        ];
        let total: usize = batches.iter().flatten().map(Vec::len).sum();
        assert!(
            total > 4 * COMMIT_BYTES_MAX,
            "the run must need several commits"
        );
        let mut answers = Vec::new();
        for batch in &batches {
            let records = batch
                .iter()
                .map(|p| OwnedRecord {
                    key: None,
                    payload: p.clone().into(),
                    mask: 0,
                })
                .collect();
            let (reply, answer) = oneshot::channel();
            owner.commit(Arc::from(TOPIC), ID, PartitionId(0), records, reply);
            answers.push(answer);
        }
        let mut next = 0u64;
        for (answer, batch) in answers.into_iter().zip(&batches) {
            let range = answer.await.expect("answered").expect("committed");
            assert_eq!(range, Offset(next)..Offset(next + batch.len() as u64));
            next = range.end.0;
        }

        let expected: Vec<&Vec<u8>> = batches.iter().flatten().collect();
        let mut read = Vec::new();
        let mut at = Offset(0);
        while read.len() < expected.len() {
            let batch = owner
                .read(
                    &Arc::from(TOPIC),
                    ID,
                    PartitionId(0),
                    ReadRange::new(at, 16, 1 << 20),
                )
                .await
                .expect("read");
            assert!(!batch.items.is_empty(), "the log ends early at {at:?}");
            for item in batch.items {
                match item {
                    ReadItem::Record(r) => read.push((r.offset.0, r.payload.to_vec())),
                    ReadItem::Corrupt(range) => panic!("corrupt {range:?}"),
                }
            }
            at = batch.next_offset;
        }
        assert_eq!(read.len(), expected.len());
        for (i, ((offset, payload), want)) in read.iter().zip(expected).enumerate() {
            assert_eq!(*offset, i as u64);
            assert!(payload == want, "record {i} differs");
        }
        let stats = owner
            .stats(&Arc::from(TOPIC), ID, PartitionId(0))
            .await
            .expect("stats");
        assert_eq!(stats.next_offset, Offset(next));
    });
}
