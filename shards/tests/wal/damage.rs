//! Damage found at open: a corrupt sealed segment, damage below the dispatch
//! checkpoint (stepped over) and across it (refused), frames that are not
//! the WAL's own (in a legacy payload, in a recycled segment), a lost key.

use std::time::Duration;

use crate::common::*;
use narad_io::rt::run_local;
use narad_io::sim::{SimDisk, SimFaults};
use narad_io::Storage;
use narad_shards::ids::Seq;
use narad_shards::wal::segment::segment_name;
use narad_shards::wal::{Wal, WalConfig, WalError};

#[test]
fn corruption_in_a_sealed_segment_fails_loudly() {
    let disk = SimDisk::new(7, SimFaults::default());
    run_local(None, async move {
        let wal = Wal::open(disk.clone(), "wal", small_config(false))
            .await
            .unwrap();
        for id in 0..200u64 {
            wal.append(&record(&payload_for(id, 1000), None))
                .await
                .unwrap();
        }
        wal.close().await;
        let first_segment = disk
            .list("wal")
            .await
            .unwrap()
            .into_iter()
            .find(|n| n.ends_with(".wal"))
            .unwrap();
        disk.rot(&format!("wal/{first_segment}"), 5000, 3);
        match Wal::open(disk.clone(), "wal", small_config(false)).await {
            Err(WalError::Corrupt(why)) => assert!(why.contains(&first_segment), "{why}"),
            Err(other) => panic!("expected corruption, got {other:?}"),
            Ok(_) => panic!("expected corruption, the WAL opened"),
        }
    });
}

/// Writes 200 records of 1,000 bytes, stores the checkpoint at 150 and closes.
async fn two_hundred_dispatched_to_150(disk: &SimDisk, config: WalConfig) {
    let wal = Wal::open(disk.clone(), "wal", config).await.unwrap();
    for id in 0..200u64 {
        wal.append(&record(&payload_for(id, 1000), None))
            .await
            .unwrap();
    }
    wal.store_checkpoint(Seq(150));
    wal.close().await;
}

/// The segment holding `seq`, by name.
async fn segment_holding(disk: &SimDisk, seq: u64) -> String {
    let mut firsts: Vec<u64> = disk
        .list("wal")
        .await
        .unwrap()
        .into_iter()
        .filter_map(|n| n.strip_suffix(".wal").and_then(|d| d.parse().ok()))
        .collect();
    firsts.sort_unstable();
    let first = *firsts.iter().rev().find(|&&f| f <= seq).unwrap();
    segment_name(Seq(first))
}

/// Damage to records below the dispatch checkpoint loses nothing (they are in
/// their partitions already): the WAL steps over it, in the last segment and in
/// a sealed one, and every record from the checkpoint on reads back. In the
/// last segment the damage sits where a torn write could, which used to erase
/// every frame after it, undispatched ones included.
#[test]
fn damage_below_the_checkpoint_is_stepped_over() {
    let one_segment = WalConfig {
        segment_bytes_max: 4 << 20,
        ..small_config(false)
    };
    for (seed, config) in [(31, one_segment), (32, small_config(false))] {
        let disk = SimDisk::new(seed, SimFaults::default());
        run_local(None, {
            let disk = disk.clone();
            async move {
                two_hundred_dispatched_to_150(&disk, config.clone()).await;
                // Inside the frame of seq 140 (about 1,050 bytes a frame).
                let name = segment_holding(&disk, 140).await;
                let first: u64 = name.strip_suffix(".wal").unwrap().parse().unwrap();
                let pos = (140 - first) as usize * 1_050 + 500;
                disk.rot(&format!("wal/{name}"), pos, 3);
                let wal = Wal::open(disk.clone(), "wal", config).await.unwrap();
                assert_eq!(wal.checkpoint(), Seq(150));
                assert_eq!(wal.next_seq(), Seq(200));
                let ids: Vec<u64> = read_all(&wal, Seq(150))
                    .await
                    .into_iter()
                    .map(|(_, id)| id)
                    .collect();
                assert_eq!(ids, (150..200).collect::<Vec<_>>(), "{name}");
                wal.close().await;
            }
        });
    }
}

/// Damage that reaches records at or past the checkpoint still fails the open
/// of a sealed segment loudly.
#[test]
fn damage_across_the_checkpoint_in_a_sealed_segment_fails_loudly() {
    let disk = SimDisk::new(33, SimFaults::default());
    run_local(None, async move {
        two_hundred_dispatched_to_150(&disk, small_config(false)).await;
        let name = segment_holding(&disk, 160).await;
        assert_ne!(name, segment_holding(&disk, 199).await, "a sealed segment");
        let first: u64 = name.strip_suffix(".wal").unwrap().parse().unwrap();
        disk.rot(
            &format!("wal/{name}"),
            (160 - first) as usize * 1_050 + 500,
            3,
        );
        match Wal::open(disk.clone(), "wal", small_config(false)).await {
            Err(WalError::Corrupt(why)) => assert!(why.contains(&name), "{why}"),
            Err(other) => panic!("expected corruption, got {other:?}"),
            Ok(wal) => panic!(
                "expected corruption, the WAL opened at {:?}",
                wal.next_seq()
            ),
        }
    });
}

/// Stepping over damage below the checkpoint resumes only at a frame of this
/// WAL's key. The search starts inside the damaged frame, and a format 1
/// record (written before payloads were masked) stores its payload as the
/// client sent it: here that payload is a run of valid frames 2..=9. Were
/// those taken for the segment's own, the dispatcher would read them in place
/// of the real, undispatched records 5..9.
#[test]
fn frames_inside_a_legacy_payload_never_stand_in_for_damaged_ones() {
    use narad_io::file::OpenMode;
    use narad_io::BlockFile;
    let disk = SimDisk::new(77, SimFaults::default());
    run_local(None, async move {
        let frame = |seq: u64, payload: &[u8], out: &mut Vec<u8>| {
            record(payload, None).encode_frame(Seq(seq), None, out)
        };
        // The payload of record 1: frames 2..=9 carrying ids 1002..=1009.
        let mut chain = Vec::new();
        for seq in 2..=9u64 {
            frame(seq, &payload_for(1000 + seq, 64), &mut chain);
        }
        let mut sealed = Vec::new();
        let mut header_of_1 = 0;
        for seq in 0..=9u64 {
            if seq == 1 {
                header_of_1 = sealed.len();
                frame(1, &chain, &mut sealed);
            } else {
                frame(seq, &payload_for(seq, 64), &mut sealed);
            }
        }
        let mut last = Vec::new();
        for seq in 10..=11u64 {
            frame(seq, &payload_for(seq, 64), &mut last);
        }
        disk.create_dir_all("wal").await.unwrap();
        for (name, mut bytes) in [
            (segment_name(Seq(0)), sealed),
            (segment_name(Seq(10)), last),
        ] {
            bytes.resize(bytes.len().div_ceil(4096) * 4096, 0);
            let f = disk
                .open(&format!("wal/{name}"), OpenMode::CreateOrOpen)
                .await
                .unwrap();
            f.write_at(0, &bytes).await.unwrap();
            f.sync_data().await.unwrap();
        }
        let ck = disk
            .open("wal/checkpoint", OpenMode::CreateOrOpen)
            .await
            .unwrap();
        let mut block = narad_shards::wal::checkpoint::encode(Seq(5));
        block.resize(4096, 0);
        ck.write_at(0, &block).await.unwrap();
        ck.sync_data().await.unwrap();
        // Sanity: intact, the WAL reads the real records from the checkpoint.
        let wal = Wal::open(disk.clone(), "wal", small_config(false))
            .await
            .unwrap();
        let ids: Vec<u64> = read_all(&wal, Seq(5))
            .await
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        assert_eq!(ids, (5..=11).collect::<Vec<_>>());
        wal.close().await;
        // Rot: one bit of record 1's seq field (a dispatched record).
        disk.rot(
            &format!("wal/{}", segment_name(Seq(0))),
            header_of_1 + 15,
            0,
        );
        match Wal::open(disk.clone(), "wal", small_config(false)).await {
            // Refused loudly, as before the step existed: nothing is lost.
            Err(e) => assert!(matches!(e, WalError::Corrupt(_)), "{e:?}"),
            Ok(wal) => {
                let ids: Vec<u64> = read_all(&wal, wal.checkpoint())
                    .await
                    .into_iter()
                    .map(|(_, id)| id)
                    .collect();
                assert_eq!(
                    ids,
                    (5..=11).collect::<Vec<_>>(),
                    "undispatched records replaced"
                );
                wal.close().await;
            }
        }
    });
}

/// A produce payload can hold bytes that form a valid WAL frame (a client can
/// compute one: the format is public). Once its segment is recycled, those bytes
/// sit past the new data, far beyond any torn write, where recovery looks for
/// frames that would mean corruption. The WAL masks every key and payload with
/// its secret key, so the bytes on disk are never the frame the client wrote,
/// and a restart opens. Without the mask the open fails ("bad frame followed by
/// valid seq ... beyond any torn write"), and a client could stop a node from
/// restarting.
#[test]
fn a_forged_frame_in_a_recycled_segment_does_not_stop_a_restart() {
    const PAYLOAD_BYTES: usize = 512 << 10;
    let config = WalConfig {
        segment_bytes_max: 48 << 20,
        prealloc: true,
        spare_segments_max: 1,
        rotate_dispatched_bytes_min: 16 << 10,
        checkpoint_sync_delay: Duration::from_millis(2),
        ..WalConfig::default()
    };
    let disk = SimDisk::new(5, SimFaults::default());
    run_local(None, async move {
        let wal = Wal::open(disk.clone(), "wal", config.clone())
            .await
            .unwrap();
        // A frame of a sequence number the WAL will expect later, inside a
        // payload about 40 MiB into the first segment.
        let mut forged = Vec::new();
        record(b"forged", None).encode_frame(Seq(100_000), None, &mut forged);
        let mut appended = 0usize;
        while wal.segment_count() < 2 {
            let mut payload = vec![0u8; PAYLOAD_BYTES];
            if appended == 78 {
                payload[..forged.len()].copy_from_slice(&forged);
            }
            wal.append(&record(&payload, None)).await.unwrap();
            appended += 1;
        }
        // Everything dispatched: the first segment is compacted into a spare.
        wal.store_checkpoint(wal.durable_next());
        let target = wal.durable_next();
        wait_until(|| wal.synced_checkpoint() == target).await;
        wait_until(|| wal.stats().compactions >= 1).await;
        // Append until the spare has been prepared and rolled into place (two
        // rolls: the segment prepared before the compaction goes first).
        let rolls = wal.stats().rolls;
        let payload = vec![1u8; PAYLOAD_BYTES];
        while wal.stats().rolls < rolls + 2 {
            wal.append(&record(&payload, None)).await.unwrap();
        }
        assert!(wal.stats().prepared_rolls >= 3, "{:?}", wal.stats());
        wal.append(&record(&payload, None)).await.unwrap();
        let next = wal.next_seq();
        wal.close().await;
        let wal = Wal::open(disk.clone(), "wal", config)
            .await
            .expect("a forged frame in old payload bytes stopped the WAL from opening");
        assert_eq!(wal.next_seq(), next);
        wal.close().await;
    });
}

/// A WAL whose records are masked refuses to open without its key, rather than
/// make a new one that would leave them unreadable.
#[test]
fn a_lost_frame_key_is_refused_not_replaced() {
    let disk = SimDisk::new(6, SimFaults::default());
    run_local(None, async move {
        let wal = Wal::open(disk.clone(), "wal", small_config(true))
            .await
            .unwrap();
        let payload = payload_for(1, 100);
        wal.append(&record(&payload, None)).await.unwrap();
        wal.close().await;
        disk.remove("wal/frame-key").await.unwrap();
        let refused = Wal::open(disk.clone(), "wal", small_config(true)).await;
        let why = refused.err().expect("opened without its key").to_string();
        assert!(why.contains("frame-key is missing"), "{why}");
        // A directory that never held a masked record makes its key.
        let fresh = Wal::open(disk.clone(), "other", small_config(true))
            .await
            .unwrap();
        fresh.close().await;
    });
}
