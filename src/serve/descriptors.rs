//! The node's open-file budget: how the soft `RLIMIT_NOFILE` is shared between
//! the connections and the storage (WAL segments, partition logs, consumer
//! state files), so that neither can take the descriptors the other needs.

/// Descriptors the broker wants beyond its connections: segment files of open
/// partition logs (an active segment twice: its `O_DSYNC` descriptor too), WAL
/// segments, the metadata log, the runtime's rings and eventfds.
pub(super) const OPEN_FILES_MARGIN: u64 = 2048;

/// Descriptors an open partition log may hold: its active segment, that
/// segment's `O_DSYNC` descriptor, and one sealed segment kept for reads.
const DESCRIPTORS_PER_OPEN_LOG: u64 = 3;

/// Descriptors kept out of the partition logs' budget besides the connections
/// and the `consumer.ahead` files: WAL segments, the metadata log, the data
/// directory's lock, the runtime's rings and eventfds.
const DESCRIPTORS_RESERVED: u64 = 512;

/// The connections the node serves at once: `http.max_connections`, unless the
/// soft open-file limit cannot hold that many beside the margin the storage
/// needs. Then the node serves what the limit leaves past the margin, and at
/// least a quarter of the limit (one under the margin cannot hold the defaults
/// anyway), so that a flood of connections, refused past this cap with a 503,
/// never takes the descriptors the WAL and the partition logs open.
pub(super) fn connections_max(configured: usize, soft_limit: u64) -> usize {
    if soft_limit >= configured as u64 + OPEN_FILES_MARGIN {
        return configured;
    }
    let fit = soft_limit
        .saturating_sub(OPEN_FILES_MARGIN)
        .max(soft_limit / 4)
        .max(16);
    usize::try_from(fit).unwrap_or(usize::MAX).min(configured)
}

/// Partition logs each of `shards` shards keeps open at most: the soft
/// open-file limit less the connection cap, the `consumer.ahead` files' share
/// and a reserve, three descriptors a log, split evenly; at least 16 a shard,
/// whatever the limit.
pub(super) fn open_logs_max(soft_limit: u64, max_connections: usize, shards: usize) -> usize {
    let spare = soft_limit
        .saturating_sub(max_connections as u64)
        .saturating_sub(crate::consume::persist::held_files_descriptors(soft_limit))
        .saturating_sub(DESCRIPTORS_RESERVED);
    (spare / DESCRIPTORS_PER_OPEN_LOG / shards.max(1) as u64).max(16) as usize
}

#[cfg(test)]
mod tests {
    use super::{connections_max, open_logs_max};

    #[test]
    fn the_open_log_budget_is_what_the_descriptor_limit_leaves_three_a_log() {
        // 65,536: less 4,096 connections, 8,192 for consumer files, 512 kept.
        assert_eq!(
            open_logs_max(65_536, 4_096, 1),
            (65_536 - 4_096 - 8_192 - 512) / 3
        );
        assert_eq!(
            open_logs_max(65_536, 4_096, 2),
            (65_536 - 4_096 - 8_192 - 512) / 3 / 2
        );
        // 20,000: the consumer files take a quarter.
        assert_eq!(
            open_logs_max(20_000, 4_096, 2),
            (20_000 - 4_096 - 5_000 - 512) / 3 / 2
        );
        // A limit the connections alone exhaust still leaves a few a shard.
        assert_eq!(open_logs_max(1_024, 4_096, 4), 16);
    }

    #[test]
    fn connections_leave_the_storage_its_descriptors() {
        // A limit that holds the cap and the margin serves the cap.
        assert_eq!(connections_max(4_096, 65_536), 4_096);
        assert_eq!(connections_max(4_096, 4_096 + 2_048), 4_096);
        // Below it, what the limit leaves past the margin...
        assert_eq!(connections_max(4_096, 4_096), 2_048);
        assert_eq!(connections_max(4_096, 3_000), 952);
        // ... at least a quarter of a limit under the margin, and never more
        // than the cap asked for.
        assert_eq!(connections_max(4_096, 1_024), 256);
        assert_eq!(connections_max(100, 1_024), 100);
        assert_eq!(connections_max(4_096, 20), 16);
    }
}
