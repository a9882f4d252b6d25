//! Tests of [`Queues`](super::Queues) over real O_DIRECT storage.

use std::cell::Cell;
use std::time::Duration;

use futures_channel::oneshot;
use narad_shards::log::LogConfig;
use narad_shards::produce::OwnedRecord;
use rand::SeedableRng;

use super::*;

const ID: IncarnationId = IncarnationId(0x5eed);

fn topic_record() -> TopicRecord {
    TopicRecord {
        name: "t".to_string(),
        id: ID,
        partitions: 2,
        retention_ms: 0,
        visibility_timeout_ms: 60_000,
        max_in_flight_per_partition: 1_000,
        max_acked_ahead_per_partition: 1_000,
        created_at: 0,
    }
}

async fn commit(owner: &Rc<Owner>, topic: &Arc<str>, partition: u32, n: usize) {
    let records = (0..n)
        .map(|i| OwnedRecord {
            key: None,
            // Large enough that the first records sit in whole blocks on the
            // device, not in the log's in-memory tail block.
            payload: vec![b'a' + i as u8; 3_000].into(),
            mask: 0,
        })
        .collect();
    let (reply, answer) = oneshot::channel();
    owner.commit(topic.clone(), ID, PartitionId(partition), records, reply);
    answer.await.unwrap().unwrap();
}

fn in_flight(queues: &Queues, partition: u32) -> usize {
    queues
        .loaded((ID, PartitionId(partition)))
        .map_or(0, |q| q.borrow().table.in_flight())
}

/// An owner in `path` with no recent-frame cache: every read goes to the
/// device, so it suspends.
fn uncached_owner(path: &std::path::Path) -> (Rc<Owner>, DmaStorage) {
    let storage = DmaStorage::new(path);
    let config = LogConfig {
        cache_bytes_max: 0,
        ..LogConfig::default()
    };
    let owner = Owner::new(storage.clone(), config, Box::new(|_, _, _| true));
    (owner, storage)
}

/// Queues over `owner`, and the count of wakes they have made.
fn counting_wakes(owner: Rc<Owner>, storage: DmaStorage) -> (Queues, Rc<Cell<usize>>) {
    let wakes = Rc::new(Cell::new(0));
    let wake = {
        let wakes = wakes.clone();
        Box::new(move |_, _: &Arc<str>| wakes.set(wakes.get() + 1))
    };
    let queues = Queues::new(
        owner,
        storage,
        ChaCha8Rng::seed_from_u64(7),
        wake,
        Rc::new(Persister::default()),
    );
    (queues, wakes)
}

/// Queues over an uncached owner in `path` whose partitions 0 and 1 of the
/// topic hold three records each, and the count of wakes they have made.
async fn with_records(path: &std::path::Path) -> (Queues, Rc<Cell<usize>>) {
    let (owner, storage) = uncached_owner(path);
    let topic: Arc<str> = Arc::from("t");
    commit(&owner, &topic, 0, 3).await;
    commit(&owner, &topic, 1, 3).await;
    counting_wakes(owner, storage)
}

/// Runs `test` on an executor over [`with_records`] in a fresh directory.
fn run_with_records<F: std::future::Future<Output = ()> + 'static>(
    test: impl FnOnce(Queues, Rc<Cell<usize>>) -> F + 'static,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    narad_io::rt::run_local(None, async move {
        let (queues, wakes) = with_records(&path).await;
        test(queues, wakes).await;
    });
}

/// A consume whose request goes away while the take reads its second
/// partition: the records already taken from the first, and those reserved
/// in the second, are released at once, not held for the visibility timeout.
#[test]
fn a_take_dropped_during_a_read_releases_what_it_held() {
    run_with_records(|queues, wakes| async move {
        let topic: Arc<str> = Arc::from("t");
        let record = topic_record();
        let partitions = [PartitionId(0), PartitionId(1)];

        let mut take = Box::pin(queues.take(&topic, &record, &partitions, 10, 1 << 20));
        let mut caught = false;
        for _ in 0..10_000 {
            let polled = futures_lite::future::poll_once(take.as_mut()).await;
            assert!(
                polled.is_none(),
                "the take finished before it was caught in its second read"
            );
            if in_flight(&queues, 1) > 0 {
                caught = true;
                break;
            }
            narad_io::rt::sleep(Duration::from_micros(100)).await;
        }
        assert!(caught, "the take never reserved in the second partition");
        assert_eq!((in_flight(&queues, 0), in_flight(&queues, 1)), (3, 3));
        let wakes_before = wakes.get();
        drop(take);
        assert_eq!((in_flight(&queues, 0), in_flight(&queues, 1)), (0, 0));
        assert!(wakes.get() > wakes_before, "parked consumers are told");

        let got = queues
            .take(&topic, &record, &partitions, 10, 1 << 20)
            .await
            .unwrap();
        assert_eq!(got.len(), 6);
    });
}

/// Commits `n` records of 100 KB to partition 0, one frame each, payload `i`
/// filled with `'a' + i`: too large for the log's read window to serve a
/// corrupted one from memory.
async fn commit_large(owner: &Rc<Owner>, topic: &Arc<str>, n: u8) {
    for i in 0..n {
        let (reply, answer) = oneshot::channel();
        let records = vec![OwnedRecord {
            key: None,
            payload: vec![b'a' + i; 100_000].into(),
            mask: 0,
        }];
        owner.commit(topic.clone(), ID, PartitionId(0), records, reply);
        answer.await.unwrap().unwrap();
    }
}

/// Every record of partition 0 of the topic in the log files under `path`
/// whose payload starts with `byte` repeated gets one byte of its frame's
/// stored payload flipped. Frames are found by walking the segment files,
/// since payloads reach the disk masked.
fn corrupt_payload(path: &std::path::Path, byte: u8) {
    use narad_shards::log::frame::{check_frame, decode_header, records_area};

    let run = vec![byte; 3_000];
    let mut found = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap().path();
            if entry.is_dir() {
                stack.push(entry);
                continue;
            }
            if entry.extension().is_none_or(|e| e != "log") {
                continue;
            }
            let mut bytes = std::fs::read(&entry).unwrap();
            let mut at = 0;
            // Frames corrupted before are passed over by their (intact) header.
            while let Ok(header) = decode_header(&bytes[at..]) {
                let len = header.frame_bytes();
                if let Ok((header, stored)) = check_frame(&bytes[at..]) {
                    let area = records_area(&header, stored).unwrap();
                    if area.windows(run.len()).any(|w| w == run.as_slice()) {
                        bytes[at + len / 2] ^= 0x40;
                        found += 1;
                    }
                }
                at += len;
            }
            std::fs::write(&entry, &bytes).unwrap();
        }
    }
    assert_eq!(found, 1, "payload {byte} found in {found} frames");
}

/// A take that spends all its attempts skipping corrupt records comes back
/// empty, and wakes the topic's consumers: records past the corrupt ones
/// are there, and nothing else would announce them. Corrupt runs are
/// skipped whole, so it takes runs apart, with records between them leased
/// to someone else: offsets 1, 3, 5 and 7 corrupt, 0, 2, 4, 6, 8, 10 and 11
/// leased, 9 free. Records of 100 KB, so that the log's read window, which
/// holds the last 256 KiB read, cannot serve the corrupted ones from memory.
#[test]
fn a_take_that_only_skips_corrupt_records_wakes_the_consumers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    narad_io::rt::run_local(None, async move {
        let (owner, storage) = uncached_owner(&path);
        let topic: Arc<str> = Arc::from("t");
        // Offsets 0 to 11, payloads 'a' to 'l'.
        commit_large(&owner, &topic, 12).await;
        let (queues, wakes) = counting_wakes(owner, storage);
        let record = topic_record();
        let partitions = [PartitionId(0)];

        let all = queues
            .take(&topic, &record, &partitions, 12, 4 << 20)
            .await
            .unwrap();
        assert_eq!(all.len(), 12);
        let (free, _leased): (Vec<Delivered>, Vec<Delivered>) = all
            .into_iter()
            .partition(|d| d.record.offset.0 % 2 == 1 && d.record.offset.0 < 10);
        queues.release_delivered(ID, &topic, &free);
        let runs = TAKE_ATTEMPTS_MAX as u8;
        for i in 0..runs {
            corrupt_payload(&path, b'a' + 2 * i + 1);
        }
        let wakes_before = wakes.get();
        let recorder = crate::metrics::ShardedRecorder::default();
        let recording = ::metrics::set_default_local_recorder(&recorder);

        let got = queues
            .take(&topic, &record, &partitions, 1, 1 << 20)
            .await
            .unwrap();
        assert!(got.is_empty(), "each attempt met a corrupt run");
        drop(recording);
        let text = recorder.render();
        let skipped = text
            .lines()
            .find(|l| l.starts_with("narad_consumer_corrupt_skipped_total{"))
            .unwrap_or_else(|| panic!("no corrupt-skip series: {text}"));
        assert!(skipped.ends_with(&format!(" {runs}")), "{skipped}");
        assert_eq!(
            wakes.get(),
            wakes_before + 1,
            "the consumers were not told to come back"
        );

        let got = queues
            .take(&topic, &record, &partitions, 1, 1 << 20)
            .await
            .unwrap();
        let offsets: Vec<u64> = got.iter().map(|d| d.record.offset.0).collect();
        assert_eq!(offsets, [2 * u64::from(runs) + 1]);
    });
}

/// A take that skips corrupt records and still returns others wakes the
/// topic's consumers: the skip moved the frontier and dropped the leases on
/// the skipped offsets, so consumers parked at a cap may have room, and no
/// ack will announce it.
#[test]
fn a_take_that_skips_corrupt_records_and_returns_others_wakes_the_consumers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    narad_io::rt::run_local(None, async move {
        let (owner, storage) = uncached_owner(&path);
        let topic: Arc<str> = Arc::from("t");
        commit_large(&owner, &topic, 3).await;
        let (queues, wakes) = counting_wakes(owner, storage);
        corrupt_payload(&path, b'a');
        let record = topic_record();
        let wakes_before = wakes.get();

        let got = queues
            .take(&topic, &record, &[PartitionId(0)], 3, 4 << 20)
            .await
            .unwrap();
        let offsets: Vec<u64> = got.iter().map(|d| d.record.offset.0).collect();
        assert_eq!(offsets, [1, 2]);
        assert!(
            wakes.get() > wakes_before,
            "the consumers were not told the skip made room"
        );
    });
}

/// Records reserved for a take and left out of it by its byte budget go
/// back, and consumers parked here are told: they may have found them
/// reserved a moment before.
#[test]
fn records_left_out_by_the_budget_are_released_with_a_wake() {
    run_with_records(|queues, wakes| async move {
        let topic: Arc<str> = Arc::from("t");
        let record = topic_record();
        let wakes_before = wakes.get();
        // A budget of one byte: the first record is always taken, no more.
        let got = queues
            .take(&topic, &record, &[PartitionId(0)], 10, 1)
            .await
            .unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(in_flight(&queues, 0), 1);
        assert!(wakes.get() > wakes_before, "parked consumers are told");
    });
}

/// A take whose read fails gives its reservations back without a wake: the
/// same read would fail again at once, and a wake would bring the pump
/// straight back to it, a loop that never yields while the fault lasts.
#[test]
fn a_failed_read_gives_its_reservations_back_and_asks_for_a_later_wake() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    narad_io::rt::run_local(None, async move {
        let (queues, wakes) = with_records(&path).await;
        let topic: Arc<str> = Arc::from("t");
        let record = topic_record();
        let partition = [PartitionId(0)];
        let got = queues
            .take(&topic, &record, &partition, 1, 1 << 20)
            .await
            .unwrap();
        queues.release_delivered(ID, &topic, &got);
        // The log is closed as idle, and its directory can no longer be opened:
        // every read now fails (until the directory comes back).
        let later = std::time::Instant::now() + Duration::from_secs(3600);
        assert_eq!(queues.owner.evict_idle(later, Duration::ZERO).await, 2);
        let mut dirs = vec![];
        let mut stack = vec![path.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let entry = entry.unwrap().path();
                if entry.ends_with("p00000") {
                    dirs.push(entry);
                } else if entry.is_dir() {
                    stack.push(entry);
                }
            }
        }
        assert_eq!(dirs.len(), 1, "{dirs:?}");
        std::fs::rename(&dirs[0], path.join("moved")).unwrap();
        std::fs::write(&dirs[0], b"not a directory").unwrap();
        let later_wakes = Rc::new(Cell::new(0));
        let counted = later_wakes.clone();
        queues.set_wake_later(Box::new(move |_, _: &Arc<str>| {
            counted.set(counted.get() + 1)
        }));
        let before = wakes.get();
        let failed = queues.take(&topic, &record, &partition, 1, 1 << 20).await;
        assert!(matches!(failed, Err(ConsumeError::Failed(_))), "{failed:?}");
        assert_eq!(in_flight(&queues, 0), 0, "the reservation went back");
        assert_eq!(wakes.get(), before, "no wake for records nobody can read");
        // But a wake after a pause, whoever made the read: a consumer parked
        // while it held the record would otherwise wait for its deadline.
        assert_eq!(later_wakes.get(), 1);
    });
}

/// A partition at its in-flight cap turns consumers away with records waiting;
/// the ack that makes room wakes them. An ack with no one capped, or a stale
/// one, does not.
#[test]
fn an_ack_that_makes_room_under_the_caps_wakes_the_consumers() {
    run_with_records(|queues, wakes| async move {
        let topic: Arc<str> = Arc::from("t");
        let record = TopicRecord {
            max_in_flight_per_partition: 1,
            ..topic_record()
        };
        let partition = [PartitionId(0)];
        let got = queues
            .take(&topic, &record, &partition, 1, 1 << 20)
            .await
            .unwrap();
        assert_eq!(got.len(), 1);
        let capped = queues
            .take(&topic, &record, &partition, 1, 1 << 20)
            .await
            .unwrap();
        assert!(capped.is_empty(), "at the cap with two records waiting");
        let settle = |d: &Delivered, nonce: u64| {
            queues.settle(&record, d.partition, d.record.offset, nonce, Settle::Ack)
        };
        let before = wakes.get();
        assert!(settle(&got[0], got[0].nonce ^ 1).is_err(), "a stale handle");
        assert_eq!(wakes.get(), before, "a refused ack makes no room");
        settle(&got[0], got[0].nonce).unwrap();
        assert_eq!(
            wakes.get(),
            before + 1,
            "the ack made room: consumers are told"
        );
        // Not capped (room for more under a cap of 1,000): an ack is no wake.
        let record = topic_record();
        let got = queues
            .take(&topic, &record, &[PartitionId(1)], 1, 1 << 20)
            .await
            .unwrap();
        let before = wakes.get();
        queues
            .settle(
                &record,
                got[0].partition,
                got[0].record.offset,
                got[0].nonce,
                Settle::Ack,
            )
            .unwrap();
        assert_eq!(wakes.get(), before);
    });
}

/// A partition whose `consumer.offset` trails its acked state (a crash before
/// the levelling) is marked changed when it loads, so the committer levels the
/// file even if nobody acks there again; a partition whose files agree is not.
#[test]
fn a_trailing_offset_file_is_levelled_after_the_load() {
    use narad_io::{BlockFile, Storage, BLOCK_BYTES};
    use narad_shards::consume::state::{AckedState, Committer, CommitterConfig, OFFSET_FILE};
    run_with_records(|queues, _| async move {
        let topic: Arc<str> = Arc::from("t");
        let record = topic_record();
        let mut committer = Committer::new(queues.storage.clone(), CommitterConfig::default());
        let both = (0..2)
            .map(|p| {
                let dir = partition_dir(&topic, ID, PartitionId(p));
                let state = AckedState {
                    frontier: Offset(2),
                    ahead: Vec::new(),
                };
                ((ID, PartitionId(p)), dir, state)
            })
            .collect();
        let report = committer.close(std::time::Instant::now(), both).await;
        assert!(report.errors.is_empty(), "{report:?}");
        // Partition 0's consumer.offset is set back to 1, as a crash before
        // its levelling would leave it.
        let dir = partition_dir(&topic, ID, PartitionId(0));
        let file = queues
            .storage
            .open(
                &format!("{dir}/{OFFSET_FILE}"),
                narad_io::file::OpenMode::Existing,
            )
            .await
            .unwrap();
        let mut block = vec![0u8; BLOCK_BYTES];
        block[..8].copy_from_slice(&1u64.to_le_bytes());
        file.write_at(0, &block).await.unwrap();
        file.sync_data().await.unwrap();
        file.close().await.unwrap();

        for p in 0..2 {
            let got = queues
                .take(&topic, &record, &[PartitionId(p)], 1, 1 << 20)
                .await
                .unwrap();
            assert_eq!(got[0].record.offset, Offset(2), "the frontier loaded");
        }
        assert_eq!(queues.take_settled_changed(), vec![(ID, PartitionId(0))]);
    });
}

/// A release counts the leases its expiry purge freed: a lease that lapsed
/// while a read was in flight is a record someone parked may take now, and the
/// purge inside the release would otherwise free it without anyone told.
#[test]
fn a_release_counts_the_leases_that_lapsed_meanwhile() {
    let mut table = InFlight::new(Offset(0), []);
    let caps = Caps {
        in_flight_max: 10,
        acked_ahead_max: 10,
    };
    let held = table.reserve(now_ms(), Offset(2), &caps, 60_000, 2);
    assert!(
        matches!(
            held,
            Reserve::Reserved {
                offset: Offset(0),
                ..
            }
        ),
        "{held:?}"
    );
    let lapsed = table.reserve(now_ms(), Offset(2), &caps, 1, 1);
    assert!(
        matches!(
            lapsed,
            Reserve::Reserved {
                offset: Offset(1),
                ..
            }
        ),
        "{lapsed:?}"
    );
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(release(&mut table, &[]), 1, "the lapsed lease");
    assert_eq!(release(&mut table, &[(Offset(0), 2)]), 1, "the held one");
    assert_eq!(table.in_flight(), 0);
}

/// With a visibility timeout of one millisecond, a record whose read outlasted
/// its lease is still handed out (its ack would be 410), not dropped: dropping
/// it left such a topic's records undeliverable whenever a read crossed a
/// millisecond tick.
#[test]
fn a_lease_that_lapses_during_its_read_is_still_delivered() {
    run_with_records(|queues, _wakes| async move {
        let topic: Arc<str> = Arc::from("t");
        let record = TopicRecord {
            visibility_timeout_ms: 1,
            ..topic_record()
        };
        let partition = [PartitionId(0)];
        let mut take = Box::pin(queues.take(&topic, &record, &partition, 1, 1 << 20));
        let mut reading = false;
        for _ in 0..10_000 {
            if let Some(got) = futures_lite::future::poll_once(take.as_mut()).await {
                panic!("the take finished before it was caught reading: {got:?}");
            }
            if in_flight(&queues, 0) > 0 {
                reading = true;
                break;
            }
            narad_io::rt::sleep(Duration::from_micros(100)).await;
        }
        assert!(reading, "the take never reserved");
        // The lease lapses while the read is in flight.
        std::thread::sleep(Duration::from_millis(3));
        let got = take.await.unwrap();
        assert_eq!(got.len(), 1, "the record was dropped");
    });
}

/// A commit wakes the pump only for a topic someone waits for: consumers
/// parked on this shard (the caller says), or tokens other shards left here.
#[test]
fn a_commit_wakes_only_a_topic_someone_waits_for() {
    run_with_records(|queues, wakes| async move {
        let topic: Arc<str> = Arc::from("t");
        queues.on_visible(&topic, ID, PartitionId(0), Offset(4), false);
        assert_eq!(wakes.get(), 0, "nobody waits");
        queues.on_visible(&topic, ID, PartitionId(0), Offset(5), true);
        assert_eq!(wakes.get(), 1, "consumers parked here");
        queues.register(&topic, ID, 1, Duration::from_secs(10));
        let registered = wakes.get();
        queues.on_visible(&topic, ID, PartitionId(0), Offset(6), false);
        assert_eq!(wakes.get(), registered + 1, "another shard's token");
    });
}

/// A batch does not lease free offsets far apart: after a nack frees one
/// far below the others' leases, a take of two gets that one alone (its read
/// would otherwise span every leased record between), and the next take
/// gets the one left free.
#[test]
fn a_take_leases_no_offsets_far_apart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    narad_io::rt::run_local(None, async move {
        let (owner, storage) = uncached_owner(&path);
        let topic: Arc<str> = Arc::from("t");
        commit(&owner, &topic, 0, 50).await;
        let (queues, _wakes) = counting_wakes(owner, storage);
        let record = topic_record();
        let p0 = [PartitionId(0)];
        let held = queues
            .take(&topic, &record, &p0, 40, 1 << 30)
            .await
            .unwrap();
        assert_eq!(held.len(), 40);
        let first = &held[0];
        assert_eq!(first.record.offset, Offset(0));
        queues
            .settle(
                &record,
                PartitionId(0),
                Offset(0),
                first.nonce,
                Settle::Nack,
            )
            .unwrap();
        let offsets = |got: &[Delivered]| got.iter().map(|d| d.record.offset.0).collect::<Vec<_>>();
        let got = queues.take(&topic, &record, &p0, 2, 1 << 30).await.unwrap();
        assert_eq!(offsets(&got), [0], "offset 40 is 40 past offset 0");
        let got = queues.take(&topic, &record, &p0, 2, 1 << 30).await.unwrap();
        assert_eq!(offsets(&got), [40, 41]);
    });
}
