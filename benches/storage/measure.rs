//! What every benchmark shares: the context a run gets, the sample it returns, the
//! latency histogram, payloads, process memory and directory usage.
//!
//! Runs on the benchmark's one pinned core. Nothing here does I/O through the
//! storage interface: the helpers only read `/proc` and directory metadata, which
//! the measured code never touches, so they cannot distort what is measured.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hdrhistogram::Histogram;

/// Payload bytes of every record the benchmarks write.
pub const PAYLOAD_BYTES: usize = 1024;

/// Longest latency the histograms track, in nanoseconds (a minute).
const LATENCY_NS_MAX: u64 = 60_000_000_000;

/// Everything one run of one benchmark needs.
#[derive(Clone, Debug)]
pub struct Ctx {
    /// The run's own directory, empty when the run starts.
    pub dir: PathBuf,
    /// How long the measured phase lasts.
    pub duration: Duration,
    /// Whether this is a smoke check: smaller preparation phases.
    pub quick: bool,
    /// Whether the WAL benchmarks run their model dispatcher (off only to isolate
    /// the writer when looking for a bottleneck; disk use then grows).
    pub dispatch: bool,
}

/// One named figure of a run.
#[derive(Clone, Debug)]
pub struct Metric {
    pub name: &'static str,
    pub value: f64,
}

/// The figures of one run, in the order they are printed.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub metrics: Vec<Metric>,
}

impl Sample {
    /// Appends a figure.
    pub fn add(&mut self, name: &'static str, value: f64) {
        assert!(
            self.metrics.iter().all(|m| m.name != name),
            "metric {name} reported twice"
        );
        self.metrics.push(Metric { name, value });
    }

    /// Appends the p50 and p99 of a latency histogram, in microseconds.
    pub fn add_latency(&mut self, prefix: Prefix, latency: &Histogram<u64>) {
        let us = |q: f64| latency.value_at_quantile(q) as f64 / 1_000.0;
        self.add(prefix.p50, us(0.50));
        self.add(prefix.p99, us(0.99));
    }
}

/// Names of the two latency figures a histogram yields.
#[derive(Clone, Copy, Debug)]
pub struct Prefix {
    pub p50: &'static str,
    pub p99: &'static str,
}

/// The outcome of one run.
pub type RunResult = Result<Sample, Box<dyn Error>>;

/// An empty latency histogram in nanoseconds, three significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3).expect("constant histogram bounds are valid")
}

/// Records `elapsed` in `latency`, clamping what lies beyond its range.
pub fn record_latency(latency: &mut Histogram<u64>, elapsed: Duration) {
    let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
    latency.saturating_record(ns.clamp(1, LATENCY_NS_MAX));
}

/// A payload of [`PAYLOAD_BYTES`] that differs per writer, built once per writer
/// and reused for every record it writes.
pub fn payload(writer: usize) -> Vec<u8> {
    let mut x = (writer as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(PAYLOAD_BYTES);
    while out.len() < PAYLOAD_BYTES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push(x as u8);
    }
    out
}

/// A field of `/proc/self/status` in bytes (`VmRSS`, `VmHWM`), 0 if unreadable.
pub fn proc_status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// A counter of `/proc/self/io` (`read_bytes`: bytes the process's threads, the
/// kernel's io_uring workers among them, asked the block layer to read), 0 if
/// unreadable.
pub fn proc_io_bytes(field: &str) -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    io.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().parse::<u64>().ok())
        .unwrap_or(0)
}

/// Files directly in `dir` and the bytes they occupy on disk (allocated blocks,
/// so preallocated segments count in full).
pub fn dir_usage(dir: &Path) -> std::io::Result<(usize, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut files = 0;
    let mut bytes = 0;
    for entry in std::fs::read_dir(dir)? {
        let meta = entry?.metadata()?;
        if meta.is_file() {
            files += 1;
            bytes += meta.blocks() * 512;
        }
    }
    Ok((files, bytes))
}

/// Bytes to mebibytes, for printing.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Bytes per second to MB/s (10^6 bytes, as fio reports).
pub fn mb_per_s(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / 1e6 / elapsed.as_secs_f64()
}

/// CPU time and involuntary context switches of the calling thread so far.
#[derive(Clone, Copy, Debug)]
pub struct ThreadUsage {
    pub cpu: Duration,
    pub involuntary_switches: u64,
}

/// The calling thread's resource usage (zero if the kernel refuses).
pub fn thread_usage() -> ThreadUsage {
    // SAFETY: an all-zero `rusage` is a valid value; getrusage only writes into it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, exclusively borrowed `rusage` for the call.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    if rc != 0 {
        return ThreadUsage {
            cpu: Duration::ZERO,
            involuntary_switches: 0,
        };
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1_000);
    ThreadUsage {
        cpu: tv(usage.ru_utime) + tv(usage.ru_stime),
        involuntary_switches: usage.ru_nivcsw as u64,
    }
}

/// Adds how busy the run's thread was and how often the kernel preempted it: on a
/// shared machine, a run that lost its core to a neighbour shows it here.
pub fn add_thread_usage(sample: &mut Sample, before: ThreadUsage, wall: Duration) {
    let after = thread_usage();
    let cpu = after.cpu.saturating_sub(before.cpu);
    let switches = after.involuntary_switches - before.involuntary_switches;
    sample.add(
        "thread_cpu_%",
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64(),
    );
    sample.add("preempted/s", switches as f64 / wall.as_secs_f64());
}
