//! Turning runs into figures: the median and min–max spread of each metric, the
//! printed lines, the JSON file, and the memory bounds the configurations promise.
//!
//! Runs on the main thread, after the pinned runs have ended. The median rather
//! than the mean, because one run disturbed by a neighbour on a shared machine
//! should not move the figure; the spread shows how much the runs disagreed.

use narad_shards::log::index::{INDEX_ENTRIES_MAX, INDEX_FILE_BYTES_MAX};
use narad_shards::log::LogConfig;
use narad_shards::wal::progress::TRACKED_SEQS_MAX;
use narad_shards::wal::segment::WRITE_RUN_BYTES_MAX;
use narad_shards::wal::{WalConfig, STAGING_KEEP_BYTES};

use crate::measure::Sample;

/// Median and spread of one metric over the runs.
#[derive(Clone, Debug)]
pub struct Spread {
    pub name: &'static str,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: Vec<f64>,
}

/// Every metric of one benchmark over its runs.
#[derive(Clone, Debug)]
pub struct Summary {
    pub bench: &'static str,
    pub spreads: Vec<Spread>,
}

impl Summary {
    /// Summarises runs that all report the same metrics in the same order.
    pub fn of(bench: &'static str, samples: Vec<Sample>) -> Self {
        assert!(!samples.is_empty(), "{bench}: no runs to summarise");
        let names: Vec<_> = samples[0].metrics.iter().map(|m| m.name).collect();
        let spreads = names
            .iter()
            .enumerate()
            .map(|(i, &name)| {
                let mut runs: Vec<f64> = samples
                    .iter()
                    .map(|s| {
                        assert_eq!(s.metrics[i].name, name, "runs report the same metrics");
                        s.metrics[i].value
                    })
                    .collect();
                let in_order = runs.clone();
                runs.sort_by(f64::total_cmp);
                let mid = runs.len() / 2;
                let median = if runs.len() % 2 == 1 {
                    runs[mid]
                } else {
                    (runs[mid - 1] + runs[mid]) / 2.0
                };
                Spread {
                    name,
                    median,
                    min: runs[0],
                    max: runs[runs.len() - 1],
                    runs: in_order,
                }
            })
            .collect();
        Self { bench, spreads }
    }

    /// Prints one line per metric: median [min – max].
    pub fn print(&self) {
        println!("{}", self.bench);
        for s in &self.spreads {
            println!(
                "  {:<20} {:>14} [{} – {}]",
                s.name,
                figure(s.median),
                figure(s.min),
                figure(s.max)
            );
        }
    }
}

/// One run's figures on one line, for progress output.
pub fn one_line(sample: &Sample) -> String {
    let parts: Vec<String> = sample
        .metrics
        .iter()
        .map(|m| format!("{}={}", m.name, figure(m.value)))
        .collect();
    parts.join(" ")
}

/// A figure with as many decimals as its size deserves.
fn figure(value: f64) -> String {
    match value.abs() {
        v if v >= 1000.0 => format!("{value:.0}"),
        v if v >= 10.0 => format!("{value:.1}"),
        _ => format!("{value:.3}"),
    }
}

/// Every run's figures as JSON, with the medians and spreads.
pub fn json(summaries: &[Summary], seconds: f64, runs: usize, cpu: usize) -> String {
    let mut out = format!(
        "{{\"seconds\":{seconds},\"runs\":{runs},\"cpu\":{cpu},\"unix_ms\":{},\"benchmarks\":[",
        narad_io::rt::unix_ms()
    );
    for (i, summary) in summaries.iter().enumerate() {
        let metrics: Vec<String> = summary
            .spreads
            .iter()
            .map(|s| {
                let runs: Vec<String> = s.runs.iter().map(|v| format!("{v}")).collect();
                format!(
                    "\"{}\":{{\"median\":{},\"min\":{},\"max\":{},\"runs\":[{}]}}",
                    s.name,
                    s.median,
                    s.min,
                    s.max,
                    runs.join(",")
                )
            })
            .collect();
        let comma = if i == 0 { "" } else { "," };
        out += &format!(
            "{comma}{{\"name\":\"{}\",\"metrics\":{{{}}}}}",
            summary.bench,
            metrics.join(",")
        );
    }
    out + "]}\n"
}

/// The memory bounds the default configurations and constants set, as printed
/// lines: what the storage engine may hold, whatever the load.
pub fn memory_bounds() -> Vec<(&'static str, String)> {
    let wal = WalConfig::default();
    let log = LogConfig::default();
    let mib = |bytes: usize| format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0));
    vec![
        (
            "WAL staging buffers (2 x staging_bytes_max)",
            mib(2 * wal.staging_bytes_max),
        ),
        (
            "WAL staging kept between batches (2 x)",
            mib(2 * STAGING_KEEP_BYTES),
        ),
        (
            "WAL write run (one DMA buffer per flush)",
            mib(WRITE_RUN_BYTES_MAX),
        ),
        (
            "WAL dispatch progress (tracked seqs, 1 B each)",
            mib(TRACKED_SEQS_MAX as usize),
        ),
        ("WAL segment_bytes_max", mib(wal.segment_bytes_max as usize)),
        ("WAL spare_segments_max", wal.spare_segments_max.to_string()),
        (
            "log cache_bytes_max (per partition)",
            mib(log.cache_bytes_max),
        ),
        (
            "log index entries max (per segment)",
            INDEX_ENTRIES_MAX.to_string(),
        ),
        (
            "log index file bytes max (per segment)",
            mib(INDEX_FILE_BYTES_MAX),
        ),
        (
            "log index_interval_bytes",
            format!("{} KiB", log.index_interval_bytes / 1024),
        ),
        ("log commit_bytes_max", mib(log.commit_bytes_max)),
    ]
}
