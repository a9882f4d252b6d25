//! What a partition log's open recovers from damage: a failed commit's frames
//! never completing a later torn one, frames forged inside payloads, rot in
//! the last commit with and without a tail hint, bad reads at open.

use futures_lite::future::block_on;
use narad_io::sim::{SimDisk, SimFaults};
use narad_io::Storage;
use narad_shards::ids::Offset;
use narad_shards::log::{
    acknowledged_end, LogConfig, LogError, PartitionLog, ReadItem, RecordRef, HINT_FILE,
};

#[path = "log_common/mod.rs"]
mod common;
use common::*;

/// Guards against the frames of a commit whose read-back failed outliving it.
/// The failed commit F wrote offsets 7..10 at bytes 3584..5120, one 512-byte
/// frame a record; its retry R is shorter (offset 7 alone) and succeeds; the
/// next commit C (offsets 8..10) starts where R ended, so its frames fall on
/// F's later ones, same offsets and positions. The power goes while C's write
/// is unsynced: where C's first sector survives and its second does not, F's
/// last frame (still on the disk had only the first block been repaired)
/// would complete C's, and recovery would return F's record at offset 9, one
/// never acknowledged there. Recovery must give back R, and C whole or not at
/// all. Every seed draws another fate for C's sectors.
#[test]
fn a_failed_commits_frames_never_complete_a_later_torn_commit() {
    use narad_shards::log::commit_bytes_bound;

    // One record of this payload is one frame of exactly one sector.
    let payload_len = 512 - commit_bytes_bound(None, 0);
    let record = |tag: u8, i: u64| {
        let mut payload = vec![tag; payload_len];
        payload[..8].copy_from_slice(&i.to_be_bytes());
        payload
    };
    let segment = format!("{DIR}/{:020}.log", 0);
    let mut exposed = 0;
    for prep_chunk_bytes in [0, 64 * 1024] {
        let cfg = LogConfig {
            prep_chunk_bytes,
            frame_area_bytes_target: 1,
            ..config()
        };
        for seed in 0..32u64 {
            block_on(async {
                let disk = SimDisk::new(seed, SimFaults::default());
                let mut log = PartitionLog::open(disk.clone(), DIR, cfg.clone())
                    .await
                    .unwrap();
                let commit = async |log: &mut PartitionLog<SimDisk>,
                                    tag: u8,
                                    offsets: std::ops::Range<u64>,
                                    now_ms: u64| {
                    let payloads: Vec<Vec<u8>> = offsets.map(|i| record(tag, i)).collect();
                    let records: Vec<RecordRef> = payloads
                        .iter()
                        .map(|p| RecordRef {
                            key: None,
                            payload: p,
                            mask: 0,
                        })
                        .collect();
                    log.commit_durable(&records, now_ms).await
                };
                // Seven frames: the last acknowledged commit ends inside block 0.
                assert_eq!(
                    commit(&mut log, b'p', 0..7, 1).await.unwrap(),
                    Offset(0)..Offset(7)
                );
                assert_eq!(log.stats().size_bytes, 3584);
                // F: frames at 3584, 4096 and 4608; its read-back sees a flipped
                // bit in block 1.
                disk.flip_next_read_at(&segment, 4096 + 100, 1);
                let failed = commit(&mut log, b'f', 7..10, 2).await;
                assert!(
                    matches!(failed, Err(LogError::ReadBackMismatch { .. })),
                    "seed {seed}: {failed:?}"
                );
                assert!(!log.is_poisoned(), "seed {seed}: the repair succeeded");
                // R, the shorter retry: acknowledged, it ends at 4096.
                assert_eq!(
                    commit(&mut log, b'r', 7..8, 3).await.unwrap(),
                    Offset(7)..Offset(8)
                );
                assert_eq!(log.stats().size_bytes, 4096);
                // C: its write lands, the power goes at its sync.
                disk.crash_at_op(disk.ops() + 2);
                let torn = commit(&mut log, b'c', 8..10, 4).await;
                assert!(torn.is_err() && disk.is_crashed(), "seed {seed}: {torn:?}");
                let written = disk.contents(&segment).unwrap();
                drop(log);
                disk.reboot();
                let kept = disk.contents(&segment).unwrap();
                let sector = |bytes: &[u8], s: usize| bytes[s * 512..(s + 1) * 512].to_vec();
                if sector(&kept, 8) == sector(&written, 8)
                    && sector(&kept, 9) != sector(&written, 9)
                {
                    exposed += 1;
                }
                let mut log = PartitionLog::open(disk.clone(), DIR, cfg.clone())
                    .await
                    .unwrap();
                let hwm = log.high_watermark().0;
                assert!(
                    hwm == 8 || hwm == 10,
                    "seed {seed}, prep {prep_chunk_bytes}: recovered up to {hwm}"
                );
                let items = read_all(&mut log, Offset(0)).await;
                let found: Vec<(u64, Vec<u8>)> = items
                    .into_iter()
                    .map(|item| match item {
                        ReadItem::Record(r) => (r.offset.0, r.payload.to_vec()),
                        other => panic!("seed {seed}, prep {prep_chunk_bytes}: {other:?}"),
                    })
                    .collect();
                let wanted: Vec<(u64, Vec<u8>)> = (0..7)
                    .map(|i| (i, record(b'p', i)))
                    .chain([(7, record(b'r', 7))])
                    .chain((8..hwm.max(8)).map(|i| (i, record(b'c', i))))
                    .collect();
                let tags = |records: &[(u64, Vec<u8>)]| -> String {
                    records.iter().map(|(_, p)| p[8] as char).collect()
                };
                assert!(
                    found == wanted,
                    "seed {seed}, prep {prep_chunk_bytes}: recovered the records of commits {:?}, acknowledged (and in flight) {:?}",
                    tags(&found),
                    tags(&wanted)
                );
            });
        }
    }
    assert!(
        exposed > 0,
        "no seed kept C's first sector and lost its second"
    );
}

/// A record whose payload is laid out as a valid frame (offsets near 2^62, a
/// commit time far ahead) stays a payload: when damage to its own commit's
/// header makes recovery search the bytes after it, the search finds nothing
/// there. After a crash (no tail hint) the damaged last commit is cut as a
/// torn tail; after a clean close it is kept as a corrupt gap.
#[test]
fn a_frame_forged_in_a_payload_is_never_recovered_as_one() {
    use narad_shards::log::envelope::{encode_envelope, envelope_len};
    use narad_shards::log::frame::{encode_unmasked_frame, push_record, Codec, FrameSpec};

    /// Three records, then one whose payload is a forged frame; closed cleanly.
    /// Returns the disk and where the forged record's commit starts.
    async fn forged_log() -> (SimDisk, usize) {
        let disk = SimDisk::new(18, SimFaults::default());
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        commit_n(&mut log, 0, 3, 1).await.unwrap();
        let forged_at = log.stats().size_bytes;
        let mut area = Vec::new();
        let payload = b"not from this log";
        push_record(&mut area, envelope_len(None, payload.len()), |out| {
            encode_envelope(out, None, u64::MAX / 2, payload)
        });
        let spec = FrameSpec {
            base_offset: Offset(1 << 62),
            record_count: 1,
            codec: Codec::None,
            first_of_commit: true,
            last_of_commit: true,
        };
        let forged = encode_unmasked_frame(spec, &area, 1);
        let record = RecordRef {
            key: None,
            payload: &forged,
            mask: 0,
        };
        log.commit_durable(&[record], 2).await.unwrap();
        log.close().await.unwrap();
        (disk, forged_at as usize)
    }

    block_on(async {
        let segment = format!("{DIR}/{:020}.log", 0);
        // The base offset in the header of the commit holding it rots. Closed
        // cleanly, the tail hint says offset 3 was committed: a corrupt gap.
        let (disk, forged_at) = forged_log().await;
        disk.rot(&segment, forged_at + 10, 2);
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        assert_eq!(log.high_watermark(), Offset(4));
        assert_eq!(log.corrupt_gaps(), &[Offset(3)..Offset(4)]);
        let items = read_all(&mut log, Offset(0)).await;
        assert_eq!(items.len(), 4, "{items:?}");
        assert_eq!(items[3], ReadItem::Corrupt(Offset(3)..Offset(4)));
        assert_eq!(
            commit_n(&mut log, 4, 1, 3).await.unwrap(),
            Offset(4)..Offset(5)
        );
        // The hint that did not hold is retired by that commit: it can never
        // be a later open's floor for a tail written since.
        let hint = disk
            .open(
                &format!("{DIR}/{HINT_FILE}"),
                narad_io::file::OpenMode::Existing,
            )
            .await
            .unwrap();
        let mut image = vec![0u8; 64 << 10];
        let read = narad_io::BlockFile::read_at(&hint, 0, &mut image)
            .await
            .unwrap();
        assert_eq!(acknowledged_end(&image[..read], Offset(0)), None);
        // The same rot with no hint, as after a crash: cut as a torn tail.
        let (disk, forged_at) = forged_log().await;
        disk.rot(&segment, forged_at + 10, 2);
        disk.remove(&format!("{DIR}/tail.hint")).await.unwrap();
        reopened_holds_and_goes_on(&disk, 3).await;
    });
}

/// Guards against an acknowledged commit lost to a transient read flip at open:
/// the tail scan saw the last commit fail its CRC, and because nothing non-zero
/// lay past the 4 KiB block where the verified tail ended, it cut that commit
/// without reading the segment again; the next commit then took its offsets and
/// overwrote it on the disk.
#[test]
fn a_read_flip_at_open_does_not_cut_the_last_commit() {
    block_on(async {
        let disk = SimDisk::new(8, SimFaults::default());
        let segment = format!("{DIR}/{:020}.log", 0);
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        commit_n(&mut log, 0, 3, 1).await.unwrap();
        let last_commit_pos = log.stats().size_bytes;
        commit_n(&mut log, 3, 2, 2).await.unwrap();
        let end = log.stats().size_bytes;
        assert!(
            end < narad_io::align_up(last_commit_pos + 1),
            "both commits end in the first block"
        );
        log.close().await.unwrap();
        // One bad read of a byte inside the last commit's records.
        disk.flip_next_read_at(&segment, last_commit_pos + (end - last_commit_pos) / 2, 5);
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        assert_holds(&mut log, 5).await;
        commit_n(&mut log, 5, 2, 3).await.unwrap();
        assert_holds(&mut log, 7).await;
        log.close().await.unwrap();
        let mut log = PartitionLog::open(disk, DIR, config()).await.unwrap();
        assert_holds(&mut log, 7).await;
    });
}

/// Guards: the reads of the active segment at open were a fixed budget, so a
/// few bad reads in a row, each at a later commit than the one before (every
/// read better than the last), ended the rereading with a bad read kept, and
/// the commits after its bad byte were cut.
#[test]
fn bad_reads_at_open_that_each_get_further_do_not_end_the_rereading() {
    block_on(async {
        let disk = SimDisk::new(9, SimFaults::default());
        let segment = format!("{DIR}/{:020}.log", 0);
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        let mut ends = Vec::new();
        for commit in 0..8u64 {
            commit_n(&mut log, commit * 2, 2, commit + 1).await.unwrap();
            ends.push(log.stats().size_bytes);
        }
        log.close().await.unwrap();
        // Each read of the segment is bad inside a later commit than the last.
        for commit in 1..7 {
            let (from, to) = (ends[commit - 1], ends[commit]);
            disk.flip_next_read_at(&segment, from + (to - from) / 2, 4);
        }
        let mut log = PartitionLog::open(disk.clone(), DIR, config())
            .await
            .unwrap();
        assert_holds(&mut log, 16).await;
        log.close().await.unwrap();
        let mut log = PartitionLog::open(disk, DIR, config()).await.unwrap();
        assert_holds(&mut log, 16).await;
    });
}
