//! Storage engine benchmarks on a real disk: the ingress WAL and the partition log
//! through `DmaStorage` (O_DIRECT files on io_uring).
//!
//! What is measured and why. A produce is acknowledged once the WAL made it
//! durable, so the WAL's durable records per second, how many records share one
//! `fdatasync` (group commit), and the bytes it writes per payload byte bound the
//! broker's ingest. The model dispatcher runs alongside so that checkpointing,
//! compaction and segment recycling are paid for inside the measurement, and the
//! segments left on disk show whether disk use stays bounded. The partition log is
//! measured one commit at a time, the path a single partition's consumers wait on,
//! and for reads both from its recent-frame cache and from the device. Each figure
//! is meant to be set beside the fio baseline of the same machine and session
//! (`benches/fio/`), which says what the disk alone gives.
//!
//! How. Every run gets a fresh directory and a fresh executor pinned to one CPU
//! (a shard is one core), in its own thread. Runs are repeated and the median and
//! the min–max spread are reported, because a shared virtual machine is noisy.
//!
//! Usage: `cargo bench --bench storage -- [--quick] [--only NAME] [--dir PATH]
//! [--seconds S] [--runs N] [--json FILE] [--cpu N] [--no-dispatch]`. `--only`
//! takes a name or a group (`wal`, `wal-batch`, `log`, `log-read`, `acks`,
//! `pipeline`).
//!
//! The consumer-offset committer is measured too (`acks-…`): the syncs of
//! acks across many partitions, one at a time and many at once. And the
//! produce path below HTTP as a whole (`pipeline-…`): WAL staging, the real
//! dispatch task, the commit combiner and partition logs, with the core's CPU
//! time per committed record.
//!
//! Files: `storage/measure.rs` (samples, histograms, memory), `storage/wal.rs`,
//! `storage/log.rs`, `storage/acks.rs`, `storage/pipeline.rs` (the benchmarks), `storage/report.rs`
//! (medians and output).

#[path = "storage/acks.rs"]
mod acks;
#[path = "storage/log.rs"]
mod log;
#[path = "storage/measure.rs"]
mod measure;
#[path = "storage/pipeline.rs"]
mod pipeline;
#[path = "storage/report.rs"]
mod report;
#[path = "storage/wal.rs"]
mod wal;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use clap::Parser;

use measure::{Ctx, RunResult};
use report::Summary;

/// Runs, at most, a user may ask for: each one is a full measured phase.
const RUNS_MAX: usize = 100;

#[derive(Parser, Debug)]
#[command(about = "Narad storage engine benchmarks (WAL, partition log) on a real disk")]
struct Args {
    /// Smoke check: 3 s per benchmark, one run, small preparation phases.
    #[arg(long)]
    quick: bool,
    /// Run only this benchmark or group (e.g. `wal-256`, `wal`, `log-read`).
    #[arg(long)]
    only: Option<String>,
    /// Directory for the benchmark data; each run's subdirectory is removed first.
    #[arg(long, default_value = "target/bench-data")]
    dir: PathBuf,
    /// Seconds of each measured phase (default 30, or 3 with --quick).
    #[arg(long)]
    seconds: Option<f64>,
    /// Runs per benchmark (default 3, or 1 with --quick).
    #[arg(long)]
    runs: Option<usize>,
    /// Also write every run's figures to this JSON file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// CPU the executor is pinned to.
    #[arg(long, default_value_t = 1)]
    cpu: usize,
    /// Diagnosis only: run the WAL benchmarks without their model dispatcher, to
    /// see the writer alone (no compaction: disk use grows with the run).
    #[arg(long)]
    no_dispatch: bool,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

type BenchFuture = Pin<Box<dyn Future<Output = RunResult>>>;

/// One benchmark: a name and the run it starts on the pinned executor.
struct Bench {
    name: &'static str,
    start: fn(Ctx) -> BenchFuture,
}

fn wal_load(appenders: usize, batch_records: usize) -> wal::Load {
    wal::Load {
        appenders,
        batch_records,
    }
}

const BENCHES: &[Bench] = &[
    Bench {
        name: "wal-1",
        start: |ctx| Box::pin(wal::run(ctx, wal_load(1, 1))),
    },
    Bench {
        name: "wal-16",
        start: |ctx| Box::pin(wal::run(ctx, wal_load(16, 1))),
    },
    Bench {
        name: "wal-256",
        start: |ctx| Box::pin(wal::run(ctx, wal_load(256, 1))),
    },
    Bench {
        name: "wal-batch-1",
        start: |ctx| Box::pin(wal::run(ctx, wal_load(1, 100))),
    },
    Bench {
        name: "wal-batch-16",
        start: |ctx| Box::pin(wal::run(ctx, wal_load(16, 100))),
    },
    Bench {
        name: "log-commit",
        start: |ctx| Box::pin(log::run_commit(ctx)),
    },
    Bench {
        name: "log-read-cache",
        start: |ctx| Box::pin(log::run_read_cache(ctx)),
    },
    Bench {
        name: "log-read-disk",
        start: |ctx| Box::pin(log::run_read_disk(ctx)),
    },
    Bench {
        name: "pipeline-batch-64",
        start: |ctx| Box::pin(pipeline::run(ctx, 64)),
    },
    Bench {
        name: "acks-2000-serial",
        start: |ctx| Box::pin(acks::run(ctx, 2000, 1)),
    },
    Bench {
        name: "acks-2000",
        start: |ctx| {
            Box::pin(acks::run(
                ctx,
                2000,
                narad_shards::consume::state::SYNCS_AT_ONCE,
            ))
        },
    },
];

/// Whether `name` is selected by `--only`: the exact name, or a group prefix
/// ending at a dash (`wal-batch` selects `wal-batch-1`, not `wal-batchy`).
fn selected(name: &str, only: Option<&str>) -> bool {
    only.is_none_or(|only| {
        name == only
            || name
                .strip_prefix(only)
                .is_some_and(|rest| rest.starts_with('-'))
    })
}

/// One run of `bench` in its own thread with an executor pinned to `cpu`.
fn run_once(bench: &Bench, ctx: Ctx, cpu: usize) -> RunResult {
    if ctx.dir.exists() {
        std::fs::remove_dir_all(&ctx.dir)?;
    }
    std::fs::create_dir_all(&ctx.dir)?;
    let start = bench.start;
    let dir = ctx.dir.clone();
    let result = std::thread::spawn(move || {
        let usage = measure::thread_usage();
        let started = std::time::Instant::now();
        let sample = narad_io::rt::run_local(Some(cpu), start(ctx));
        sample
            .map(|mut sample| {
                measure::add_thread_usage(&mut sample, usage, started.elapsed());
                sample
            })
            .map_err(|e| e.to_string())
    })
    .join()
    .map_err(|_| format!("{}: the run panicked", bench.name))?;
    // Leave no gigabytes behind: a later run or another user needs the space.
    std::fs::remove_dir_all(&dir)?;
    Ok(result?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = Args::parse();
    // glommio opens directories by absolute path only.
    std::fs::create_dir_all(&args.dir)?;
    args.dir = args.dir.canonicalize()?;
    let seconds = args.seconds.unwrap_or(if args.quick { 3.0 } else { 30.0 });
    let runs = args.runs.unwrap_or(if args.quick { 1 } else { 3 });
    if !(seconds > 0.0 && (1..=RUNS_MAX).contains(&runs)) {
        return Err(format!("need --seconds > 0 and --runs within 1..={RUNS_MAX}").into());
    }
    println!(
        "storage benchmarks: {seconds} s per phase, {runs} run(s), cpu {}, data in {}",
        args.cpu,
        args.dir.display()
    );
    for (name, value) in report::memory_bounds() {
        println!("  bound {name:<44} {value}");
    }
    let mut summaries = Vec::new();
    for bench in BENCHES
        .iter()
        .filter(|b| selected(b.name, args.only.as_deref()))
    {
        let mut samples = Vec::with_capacity(runs);
        for run in 0..runs {
            let ctx = Ctx {
                dir: args.dir.join(bench.name),
                duration: Duration::from_secs_f64(seconds),
                quick: args.quick,
                dispatch: !args.no_dispatch,
            };
            let sample = run_once(bench, ctx, args.cpu)?;
            eprintln!(
                "  {} run {}/{}: {}",
                bench.name,
                run + 1,
                runs,
                report::one_line(&sample)
            );
            samples.push(sample);
        }
        let summary = Summary::of(bench.name, samples);
        summary.print();
        summaries.push(summary);
    }
    if summaries.is_empty() {
        return Err(format!("--only {:?} selects no benchmark", args.only).into());
    }
    println!(
        "  process peak RSS (VmHWM): {:.1} MiB",
        measure::mib(measure::proc_status_bytes("VmHWM"))
    );
    if let Some(path) = &args.json {
        std::fs::write(path, report::json(&summaries, seconds, runs, args.cpu))?;
    }
    Ok(())
}
