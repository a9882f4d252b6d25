//! Tests of the recorder: merging over threads, the text format, descriptions.

use super::describe::{describe_all, register_zeroes};
use super::*;

#[test]
fn a_flag_gauge_reads_the_largest_value_of_any_thread_and_a_timestamp_the_smallest() {
    let recorder = ShardedRecorder::default();
    for (failed, success) in [(1.0, 300.0), (0.0, 200.0), (1.0, 400.0)] {
        let recorder = recorder.clone();
        std::thread::spawn(move || {
            ::metrics::with_local_recorder(&recorder, || {
                ::metrics::gauge!("narad_ingress_wal_failed").set(failed);
                ::metrics::gauge!("narad_ingress_dispatch_backlog_records").set(5.0);
                ::metrics::gauge!("narad_poller_last_success_timestamp_seconds", "loop" => "x")
                    .set(success);
            });
        })
        .join()
        .unwrap();
    }
    let text = recorder.render();
    assert!(text.contains("narad_ingress_wal_failed 1\n"), "{text}");
    assert!(
        text.contains("narad_poller_last_success_timestamp_seconds{loop=\"x\"} 200\n"),
        "{text}"
    );
    assert!(
        text.contains("narad_ingress_dispatch_backlog_records 15\n"),
        "{text}"
    );
}

#[test]
fn series_are_summed_over_threads_and_rendered_as_prometheus_text() {
    let recorder = ShardedRecorder::default();
    let record = |n: u64| {
        let recorder = recorder.clone();
        std::thread::spawn(move || {
            ::metrics::with_local_recorder(&recorder, || {
                ::metrics::counter!("narad_x_total", "topic" => "a\"b").increment(n);
                ::metrics::gauge!("narad_g").set(n as f64);
                ::metrics::histogram!("narad_h_seconds").record(0.003);
                ::metrics::histogram!("narad_h_seconds").record(20.0);
            });
        })
        .join()
        .unwrap();
    };
    record(2);
    record(5);
    let text = recorder.render();
    assert!(text.contains("# TYPE narad_x_total counter\n"), "{text}");
    assert!(
        text.contains("narad_x_total{topic=\"a\\\"b\"} 7\n"),
        "{text}"
    );
    assert!(text.contains("narad_g 7\n"), "{text}");
    assert!(
        text.contains("narad_h_seconds_bucket{le=\"0.0025\"} 0\n"),
        "{text}"
    );
    assert!(
        text.contains("narad_h_seconds_bucket{le=\"0.005\"} 2\n"),
        "{text}"
    );
    assert!(
        text.contains("narad_h_seconds_bucket{le=\"10\"} 2\n"),
        "{text}"
    );
    assert!(
        text.contains("narad_h_seconds_bucket{le=\"+Inf\"} 4\n"),
        "{text}"
    );
    assert!(text.contains("narad_h_seconds_count 4\n"), "{text}");
    // 20 s is past 10 s, not past the buckets.
    assert!(
        text.contains("narad_h_seconds_bucket{le=\"15\"} 2\n"),
        "{text}"
    );
    assert!(
        text.contains("narad_h_seconds_bucket{le=\"30\"} 4\n"),
        "{text}"
    );
}

#[test]
fn many_observations_of_one_value_count_each() {
    let recorder = ShardedRecorder::default();
    ::metrics::with_local_recorder(&recorder, || {
        let h = ::metrics::histogram!("narad_h_seconds");
        h.record_many(0.003, 100);
        h.record_many(20.0, 0);
        h.record(0.003);
    });
    let text = recorder.render();
    assert!(
        text.contains("narad_h_seconds_bucket{le=\"0.005\"} 101\n"),
        "{text}"
    );
    assert!(text.contains("narad_h_seconds_count 101\n"), "{text}");
    assert!(text.contains("narad_h_seconds_sum 0.303"), "{text}");
}

#[test]
fn infinities_are_written_as_the_text_format_spells_them() {
    let recorder = ShardedRecorder::default();
    ::metrics::with_local_recorder(&recorder, || {
        ::metrics::gauge!("narad_up").set(f64::INFINITY);
        ::metrics::gauge!("narad_down").set(f64::NEG_INFINITY);
    });
    let text = recorder.render();
    assert!(text.contains("narad_up +Inf\n"), "{text}");
    assert!(text.contains("narad_down -Inf\n"), "{text}");
}

#[test]
fn the_housekeeping_series_are_described() {
    let recorder = ShardedRecorder::default();
    let names = [
        "narad_data_dir_low",
        "narad_orphan_topic_dirs",
        "narad_quarantined_copies",
        "narad_quarantined_bytes",
        "narad_poller_last_success_timestamp_seconds",
    ];
    ::metrics::with_local_recorder(&recorder, || {
        describe_all();
        for name in names {
            ::metrics::gauge!(name).set(1.0);
        }
        ::metrics::counter!("narad_cold_retention_swept_total").increment(1);
    });
    let text = recorder.render();
    for name in names.iter().chain(&["narad_cold_retention_swept_total"]) {
        assert!(text.contains(&format!("# HELP {name} ")), "{name}: {text}");
    }
}

#[test]
fn every_series_registered_at_zero_is_described() {
    let recorder = ShardedRecorder::default();
    ::metrics::with_local_recorder(&recorder, || {
        describe_all();
        register_zeroes();
    });
    let text = recorder.render();
    let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(samples.len() >= 5, "{text}");
    for line in samples {
        let name = line
            .split(['{', ' '])
            .next()
            .expect("a sample names its series");
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "{name} has no HELP line: {text}"
        );
    }
}

#[test]
fn one_thread_reuses_its_cell() {
    let recorder = ShardedRecorder::default();
    ::metrics::with_local_recorder(&recorder, || {
        for _ in 0..3 {
            ::metrics::counter!("narad_once_total").increment(1);
        }
    });
    assert_eq!(recorder.registry.lock().unwrap().cells.len(), 1);
    assert!(recorder.render().contains("narad_once_total 3\n"));
}

#[test]
fn deleting_a_topic_keeps_the_sizes_of_its_namesake_on_the_same_shard() {
    use narad_shards::ids::{IncarnationId, Offset, PartitionId};
    use narad_shards::log::LogStats;
    use narad_shards::produce::StorageObserver;

    let stats = |size_bytes: u64, segment_count: usize| LogStats {
        oldest_offset: Offset(0),
        next_offset: Offset(1),
        segment_count,
        size_bytes,
        corrupt_gap_count: 0,
        cache_bytes: 0,
        oldest_segment_ms: None,
    };
    let recorder = ShardedRecorder::default();
    ::metrics::with_local_recorder(&recorder, || {
        let storage = StorageMetrics::default();
        let (old, new) = (IncarnationId(1), IncarnationId(2));
        storage
            .partition("t", old, PartitionId(0))
            .reshaped(&stats(100, 3));
        storage
            .partition("t", old, PartitionId(1))
            .reshaped(&stats(9, 1));
        // Made again under the name, its partition 0 on this shard too.
        storage
            .partition("t", new, PartitionId(0))
            .reshaped(&stats(7, 1));
        storage.purged(old);
    });
    let text = recorder.render();
    for line in [
        "narad_partition_size_bytes{partition=\"0\",topic=\"t\"} 7\n",
        "narad_segments{partition=\"0\",topic=\"t\"} 1\n",
        // The new topic has no partition 1 here: the old one's is zero.
        "narad_partition_size_bytes{partition=\"1\",topic=\"t\"} 0\n",
    ] {
        assert!(text.contains(line), "{line}: {text}");
    }
}

#[test]
fn a_gone_topics_gauges_are_left_out_and_its_counters_kept() {
    let recorder = ShardedRecorder::default();
    ::metrics::with_local_recorder(&recorder, || {
        for topic in ["kept", "gone"] {
            ::metrics::gauge!("narad_consumer_lag_messages", "topic" => topic, "partition" => "0")
                .set(3.0);
            ::metrics::counter!("narad_messages_produced_total", "topic" => topic).increment(4);
            ::metrics::histogram!("narad_storage_fsync_duration_seconds", "topic" => topic)
                .record(0.001);
        }
        ::metrics::gauge!("narad_open_partition_logs").set(2.0);
        // A partition the topic no longer has (made again with fewer).
        ::metrics::gauge!("narad_consumer_lag_messages", "topic" => "kept", "partition" => "1")
            .set(0.0);
    });
    let text = recorder.render_where(&|topic, partition| topic == "kept" && partition < Some(1));
    assert!(
        text.contains("narad_consumer_lag_messages{partition=\"0\",topic=\"kept\"} 3\n"),
        "{text}"
    );
    assert!(
        !text.contains("narad_consumer_lag_messages{partition=\"0\",topic=\"gone\"}"),
        "{text}"
    );
    for topic in ["kept", "gone"] {
        let counter = format!("narad_messages_produced_total{{topic=\"{topic}\"}} 4\n");
        assert!(text.contains(&counter), "{text}");
        let histogram =
            format!("narad_storage_fsync_duration_seconds_count{{topic=\"{topic}\"}} 1\n");
        assert!(text.contains(&histogram), "{text}");
    }
    assert!(text.contains("narad_open_partition_logs 2\n"), "{text}");
    assert!(!text.contains("partition=\"1\""), "{text}");
    // Without a list of topics, everything.
    assert!(recorder.render().contains("topic=\"gone\"} 3\n"));
}

#[test]
fn series_past_one_chunk_of_cells_are_all_rendered_and_summed() {
    let recorder = ShardedRecorder::default();
    let series = 2 * CELL_CHUNK + 5;
    // Two threads: every series has a cell in each, in chunks registered
    // while an earlier render holds the first ones.
    let mut renders = Vec::new();
    for _ in 0..2 {
        let shared = recorder.clone();
        std::thread::spawn(move || {
            ::metrics::with_local_recorder(&shared, || {
                for i in 0..series {
                    ::metrics::counter!("narad_t_total", "i" => i.to_string()).increment(1);
                }
            });
        })
        .join()
        .unwrap();
        renders.push(recorder.render());
    }
    let lines = |text: &str, value: &str| {
        text.lines()
            .filter(|l| l.starts_with("narad_t_total{") && l.ends_with(value))
            .count()
    };
    assert_eq!(lines(&renders[0], " 1"), series);
    assert_eq!(lines(&renders[1], " 2"), series, "both threads' cells");
}

#[test]
fn a_deleted_incarnations_cached_handles_are_let_go() {
    let recorder = ShardedRecorder::default();
    ::metrics::with_local_recorder(&recorder, || {
        let traffic = Traffic::default();
        let (gone, kept) = (IncarnationId(1), IncarnationId(2));
        for incarnation in [gone, kept] {
            traffic.topic("t", incarnation);
            for p in 0..3 {
                traffic.partition("t", incarnation, PartitionId(p));
            }
        }
        assert_eq!(traffic.cached(), (2, 6));
        traffic.forget(gone);
        assert_eq!(traffic.cached(), (1, 3));
        // A request that looked the topic up before the delete and counts
        // after it does not cache it again.
        traffic.topic("t", gone);
        traffic.partition("t", gone, PartitionId(0));
        assert_eq!(traffic.cached(), (1, 3));
    });
}
