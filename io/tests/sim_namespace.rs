//! Tests of the simulated disk's namespace: files and directories made,
//! renamed and removed, and what a crash that falls on one of those changes
//! leaves. Seeds are swept, so a failure names the seed that replays it.

use futures_lite::future::block_on;
use narad_io::file::OpenMode;
use narad_io::sim::SimDisk;
use narad_io::{BlockFile, Storage, BLOCK_BYTES};

mod sim_common;
use sim_common::{new_disk, open, pattern, SEEDS_MAX};

#[test]
fn a_crash_on_creating_directories_keeps_the_outer_levels_or_none() {
    let mut kept = std::collections::BTreeSet::new();
    for seed in 0..SEEDS_MAX {
        block_on(async {
            let disk = new_disk(seed);
            disk.crash_at_op(1);
            assert!(disk.create_dir_all("a/b/c").await.is_err());
            disk.reboot();
            let levels = ["a", "a/b", "a/b/c"].map(|dir| {
                let parent = dir.rsplit_once('/').map_or("", |(p, _)| p);
                let name = dir.rsplit('/').next().unwrap().to_string();
                block_on(disk.list(parent)).unwrap().contains(&name)
            });
            let depth = levels.iter().take_while(|&&there| there).count();
            assert!(
                levels[depth..].iter().all(|&there| !there),
                "seed {seed}: {levels:?}"
            );
            kept.insert(depth);
        });
    }
    assert_eq!(kept.len(), 4, "every depth seen: {kept:?}");
}

#[test]
fn a_renamed_file_keeps_its_contents_across_a_crash() {
    block_on(async {
        let disk = new_disk(10);
        let data = pattern(BLOCK_BYTES, 10);
        let file = open(&disk, "segment.tmp").await;
        file.write_at(0, &data).await.unwrap();
        file.sync_data().await.unwrap();
        disk.rename("segment.tmp", "segment").await.unwrap();
        let missing = disk.open("segment.tmp", OpenMode::Existing).await;
        assert_eq!(
            missing.err().and_then(|e| e.raw_os_error()),
            Some(libc::ENOENT)
        );
        disk.crash();
        disk.reboot();
        let renamed = disk.open("segment", OpenMode::Existing).await.unwrap();
        let mut buf = vec![0u8; BLOCK_BYTES];
        renamed.read_at(0, &mut buf).await.unwrap();
        assert_eq!(buf, data);
        assert_eq!(disk.list("").await.unwrap(), vec!["segment"]);
        assert_eq!(disk.size_of("segment").await.unwrap(), BLOCK_BYTES as u64);
        assert_eq!(
            disk.size_of("segment.tmp").await.err().map(|e| e.kind()),
            Some(std::io::ErrorKind::NotFound)
        );
    });
}

/// Runs `change` with the crash set on its first operation, on a fresh disk
/// holding a synced file `d/f0`..`d/f3` each, for every seed; returns, per
/// seed, which of the paths `watched` exist after the reboot.
fn after_a_crash_on(
    change: impl Fn(SimDisk) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool>>>,
    watched: &[&str],
) -> Vec<Vec<bool>> {
    (0..SEEDS_MAX)
        .map(|seed| {
            block_on(async {
                let disk = new_disk(seed);
                disk.create_dir_all("d").await.unwrap();
                for i in 0..4 {
                    let file = open(&disk, &format!("d/f{i}")).await;
                    file.write_at(0, &pattern(BLOCK_BYTES, i)).await.unwrap();
                    file.sync_data().await.unwrap();
                }
                disk.crash_at_op(disk.ops() + 1);
                assert!(
                    !change(disk.clone()).await,
                    "seed {seed}: the change returned Ok through the crash"
                );
                assert!(disk.is_crashed(), "seed {seed}");
                disk.reboot();
                for i in 0..4 {
                    if let Some(bytes) = disk.contents(&format!("d/f{i}")) {
                        assert_eq!(bytes, pattern(BLOCK_BYTES, i), "seed {seed}");
                    }
                }
                watched
                    .iter()
                    .map(|path| disk.contents(path).is_some())
                    .collect()
            })
        })
        .collect()
}

/// Whether every path of the outcomes was seen both present and missing.
fn each_seen_both_ways(outcomes: &[Vec<bool>]) -> bool {
    (0..outcomes[0].len()).all(|i| outcomes.iter().any(|o| o[i]) && outcomes.iter().any(|o| !o[i]))
}

#[test]
fn a_crash_on_a_rename_leaves_it_done_or_not() {
    let outcomes = after_a_crash_on(
        |disk| Box::pin(async move { disk.rename("d/f0", "d/g").await.is_ok() }),
        &["d/f0", "d/g"],
    );
    assert!(
        outcomes.iter().all(|o| o[0] != o[1]),
        "one name, never both"
    );
    assert!(each_seen_both_ways(&outcomes));
}

#[test]
fn a_crash_on_a_creating_open_leaves_the_file_there_or_not() {
    let outcomes = after_a_crash_on(
        |disk| Box::pin(async move { disk.open("d/new", OpenMode::CreateOrOpen).await.is_ok() }),
        &["d/new"],
    );
    assert!(each_seen_both_ways(&outcomes));
}

#[test]
fn a_crash_inside_a_batch_removal_leaves_each_removal_so_far_done_or_not() {
    let outcomes = after_a_crash_on(
        |disk| {
            Box::pin(async move {
                // The crash falls on the third removal; the fourth never starts.
                disk.crash_at_op(disk.ops() + 3);
                let names: Vec<String> = (0..4).map(|i| format!("f{i}")).collect();
                let (removed, outcome) = disk.remove_in("d", &names).await;
                assert_eq!(removed, 2);
                outcome.is_ok()
            })
        },
        &["d/f0", "d/f1", "d/f2", "d/f3"],
    );
    assert!(outcomes.iter().all(|o| o[3]), "the removal never reached");
    assert!(each_seen_both_ways(
        &outcomes[..]
            .iter()
            .map(|o| o[..3].to_vec())
            .collect::<Vec<_>>()
    ));
}

#[test]
fn a_crash_on_removing_a_directory_leaves_it_gone_or_partly_removed() {
    let outcomes = after_a_crash_on(
        |disk| Box::pin(async move { disk.remove_dir_all("d").await.is_ok() }),
        &["d/f0", "d/f1", "d/f2", "d/f3"],
    );
    assert!(each_seen_both_ways(&outcomes));
    assert!(outcomes.iter().any(|o| o.iter().all(|&present| !present)));
    assert!(outcomes
        .iter()
        .any(|o| o.iter().any(|&p| p) && o.iter().any(|&p| !p)));
}

#[test]
fn list_returns_sorted_direct_children() {
    block_on(async {
        let disk = new_disk(11);
        disk.create_dir_all("topics/orders/0").await.unwrap();
        disk.create_dir_all("topics/audit").await.unwrap();
        for path in [
            "wal",
            "topics/zeta",
            "topics/alpha",
            "topics/orders/0/00000000.log",
            "topics/orders/meta",
        ] {
            open(&disk, path).await;
        }
        assert_eq!(disk.list("").await.unwrap(), vec!["topics", "wal"]);
        assert_eq!(
            disk.list("topics").await.unwrap(),
            vec!["alpha", "audit", "orders", "zeta"]
        );
        assert_eq!(disk.list("topics/orders").await.unwrap(), vec!["0", "meta"]);
        assert!(disk.list("missing").await.unwrap().is_empty());

        disk.remove("topics/zeta").await.unwrap();
        disk.remove("topics/zeta")
            .await
            .expect("a missing file is fine");
        disk.remove_dir_all("topics/orders").await.unwrap();
        assert_eq!(disk.list("topics").await.unwrap(), vec!["alpha", "audit"]);
    });
}

#[test]
fn a_file_needs_its_parent_directory() {
    block_on(async {
        let disk = new_disk(12);
        let err = disk
            .open("no/such/dir/f", OpenMode::CreateOrOpen)
            .await
            .err()
            .expect("the parent is missing");
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
    });
}
