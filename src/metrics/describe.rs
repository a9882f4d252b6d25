//! What the node tells a scrape before anything happened: the help text of
//! every series it records, and the counters of rare events registered at 0.
//!
//! Which cores: run once, by [`super::install`], on the thread that installs
//! the recorder.

/// Counters of rare events, registered at 0 from the start: a series that first
/// appears at 1 hides that event from `increase()` and `rate()`, and an absent
/// series cannot be told from one that never moved. Counters labelled by topic
/// appear with their topic's first event.
pub(super) fn register_zeroes() {
    for name in [
        "narad_reaper_restarts",
        "narad_idle_logs_evicted_total",
        "narad_cold_retention_panics_total",
        "narad_cold_retention_swept_total",
        // The reference exports it and never counts anything into it; kept for
        // dashboards built on the reference.
        "narad_ack_rejected_total",
    ] {
        ::metrics::counter!(name).absolute(0);
    }
    for (component, kind) in [
        ("http", "5xx"),
        ("storage", "fsync_poisoned"),
        ("storage", "retention_unlink"),
        ("storage", "retention_panic"),
        ("storage", "consumer_state"),
    ] {
        ::metrics::counter!("narad_errors_total", "component" => component, "kind" => kind)
            .absolute(0);
    }
}

/// Help texts of the series the node records.
pub(super) fn describe_all() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "narad_messages_produced_total",
        "Messages accepted (202) by produce routes."
    );
    describe_counter!(
        "narad_bytes_produced_total",
        "Payload bytes accepted by produce routes."
    );
    describe_counter!(
        "narad_messages_consumed_total",
        "Messages leased to consumers (redeliveries included, replays not)."
    );
    describe_counter!(
        "narad_bytes_consumed_total",
        "Payload bytes leased to consumers."
    );
    describe_counter!(
        "narad_http_requests_total",
        "HTTP requests by route, method and status."
    );
    describe_histogram!(
        "narad_http_request_duration_seconds",
        "HTTP request handling time by route, method and status."
    );
    describe_counter!("narad_errors_total", "Errors by component and kind.");
    describe_gauge!(
        "narad_ingress_wal_failed",
        "1 while any ingress WAL of the node is latched after a disk failure (its appends fail until restart), else 0."
    );
    describe_gauge!(
        "narad_ingress_wal_stalled",
        "1 while any ingress WAL of the node has waited 5 s or more for the disk to complete a write (its shard refuses produces until it does), else 0."
    );
    describe_gauge!(
        "narad_ingress_dispatch_backlog_records",
        "Records durable in the ingress WALs and not yet committed to their partitions (behind the dispatch checkpoint)."
    );
    describe_histogram!(
        "narad_ingress_wal_sync_duration_seconds",
        "Time from a group commit's write to its durability in the ingress WAL."
    );
    describe_counter!(
        "narad_ingress_wal_syncs_total",
        "Group commits made durable in the ingress WAL."
    );
    describe_counter!(
        "narad_ingress_wal_synced_records_total",
        "Records made durable in the ingress WAL."
    );
    describe_counter!(
        "narad_ingress_wal_device_bytes_total",
        "Bytes the ingress WAL wrote to its segments (padding and rewritten tail blocks included)."
    );
    describe_histogram!(
        "narad_produce_to_committed_seconds",
        "Time from a record's acceptance to its durable commit on the owner."
    );
    describe_histogram!(
        "narad_produce_to_dispatched_seconds",
        "Time from a record's acceptance to the sending of its commit to the owner."
    );
    describe_gauge!(
        "narad_inflight_size",
        "Leased, unsettled messages per partition."
    );
    describe_gauge!(
        "narad_acked_ahead_size",
        "Acks above the lowest unacked offset per partition."
    );
    describe_gauge!(
        "narad_consumer_lag_messages",
        "Committed messages at or above the lowest unacked offset per partition (those acked ahead of it included)."
    );
    describe_gauge!(
        "narad_consumer_dropped_messages",
        "Messages retention deleted before any consumer acked them, per partition, since the partition's consumer state was loaded."
    );
    describe_counter!(
        "narad_consumer_corrupt_skipped_total",
        "Records skipped because their frame failed its checksum, per partition, since the partition's consumer state was loaded."
    );
    describe_histogram!(
        "narad_consume_wait_seconds",
        "Time a consume took, by outcome: hit (messages returned), timeout (a long-poll that ended empty), cancelled (the client went away), no_wait (no wait asked)."
    );
    describe_counter!(
        "narad_consume_empty_total",
        "Consumes answered 204 with nothing to deliver."
    );
    describe_gauge!(
        "narad_oldest_unconsumed_message_age_seconds",
        "Age of the oldest unacked message per partition, from its commit time (0 when every message is acked)."
    );
    describe_gauge!(
        "narad_topic_bytes",
        "Bytes of the partition logs of a topic."
    );
    describe_gauge!(
        "narad_data_dir_size_bytes",
        "Bytes the data directory's files occupy on disk."
    );
    describe_gauge!(
        "narad_data_dir_available_bytes",
        "Bytes still available to the broker on the file system of the data directory."
    );
    describe_gauge!(
        "narad_http_requests_in_flight",
        "HTTP requests being answered (long-polls included)."
    );
    describe_counter!(
        "narad_http_request_bytes_in_total",
        "Request body bytes by route, as declared by Content-Length."
    );
    describe_counter!(
        "narad_http_response_bytes_out_total",
        "Response body bytes by route."
    );
    describe_counter!("narad_ack_extended_total", "Leases extended.");
    describe_counter!("narad_nack_total", "Leases given back (nack).");
    describe_storage();
}

/// Help texts of the storage series.
fn describe_storage() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_histogram!(
        "narad_storage_fsync_duration_seconds",
        "Partition log time per commit to make its frames durable (one O_DSYNC write: the write and its sync)."
    );
    describe_histogram!(
        "narad_storage_flush_duration_seconds",
        "Partition log time per commit to prepare space before its durable write (zero when space was prepared ahead)."
    );
    describe_counter!(
        "narad_storage_flush_bytes_total",
        "Frame bytes written to partition logs by commits."
    );
    describe_gauge!(
        "narad_partition_size_bytes",
        "Bytes of frames in a partition's segments, as of its last open, commit or retention run."
    );
    describe_gauge!(
        "narad_segments",
        "Segment files of a partition, the active one included."
    );
    describe_counter!(
        "narad_storage_retention_bytes_deleted_total",
        "Frame bytes deleted by retention."
    );
    describe_counter!(
        "narad_storage_retention_messages_deleted_total",
        "Offsets deleted by retention."
    );
    describe_histogram!(
        "narad_storage_retention_run_duration_seconds",
        "Time one retention run over a partition took (rolling and deleting included)."
    );
    describe_gauge!(
        "narad_open_partition_logs",
        "Partition logs open on the node."
    );
    describe_gauge!("narad_topics_total", "Topics that exist.");
    describe_gauge!(
        "narad_boot_duration_seconds",
        "Seconds from the process start to every shard serving (storage recovered)."
    );
    describe_gauge!(
        "narad_partitions_total",
        "Partitions of all the topics that exist."
    );
    describe_counter!(
        "narad_partition_reads_total",
        "Reads of a partition's records by where they were answered from: source=memory (the recent-frame cache) or source=device (segment bytes fetched from disk)."
    );
    describe_counter!(
        "narad_partition_device_read_bytes_total",
        "Bytes reads of a partition's records fetched from the device (O_DIRECT windows of 256 KiB or more)."
    );
    describe_counter!(
        "narad_idle_logs_evicted_total",
        "Partition logs closed after going unused for storage.idle_log_eviction_ms."
    );
    describe_gauge!(
        "narad_metastore_apply_stopped",
        "1 once the metadata store has failed a write: topic creates, alters and deletes answer 500 until the node restarts."
    );
    describe_gauge!(
        "narad_data_dir_low",
        "1 while the data directory's free space is below the disk guard's floor (produces answered 503)."
    );
    describe_counter!(
        "narad_cold_retention_swept_total",
        "Segments the cold retention walk (over closed logs) deleted."
    );
    describe_counter!(
        "narad_cold_retention_panics_total",
        "Partitions the cold retention walk skipped because their visit panicked."
    );
    describe_counter!(
        "narad_reaper_restarts",
        "Times a shard's retention reaper panicked outside any one partition's run and started again."
    );
    describe_counter!(
        "narad_ack_rejected_total",
        "Kept at 0, as the reference exports it (ack refusals are in http_requests_total by status)."
    );
    describe_gauge!(
        "narad_orphan_topic_dirs",
        "Topic data directories under topics/ that no live topic owns."
    );
    describe_gauge!(
        "narad_quarantined_copies",
        "Entries set aside under quarantine/ (never deleted by the node)."
    );
    describe_gauge!("narad_quarantined_bytes", "Bytes held under quarantine/.");
    describe_gauge!(
        "narad_poller_last_success_timestamp_seconds",
        "Unix time of each background loop's last successful run (the shard furthest behind)."
    );
}
