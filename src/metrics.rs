//! Prometheus metrics: recorded through the `metrics` crate's handles, kept per
//! shard, summed when `/metrics` is scraped.
//!
//! Which cores: every shard records into cells only it writes; the scrape (on
//! whichever shard serves `GET /metrics`) reads them all. The stock exporter keeps
//! one atomic per series shared by every core, so two cores counting the same
//! series bounce its cache line on every message; here each thread registers its
//! own cell (aligned to a cache line) the first time it touches a series, and the
//! hot path is a thread-local map lookup plus a relaxed add to memory no other
//! core writes. Registration takes the registry's lock once per (thread, series);
//! the scrape takes it once.
//!
//! Counters and histograms sum across shards; gauges sum too, so a gauge that
//! several shards set (a WAL backlog per shard) reads as the node's total, and
//! one only a partition's owner sets reads as that owner's value. A flag gauge
//! ([`MAX_GAUGES`]: `narad_ingress_wal_failed`) takes the largest value instead,
//! so it reads 1 when any shard's WAL failed, not the number of shards; a
//! timestamp ([`MIN_GAUGES`]: `narad_poller_last_success_timestamp_seconds`)
//! takes the smallest, so it reads the success of the shard that is furthest
//! behind.
//!
//! Series are never removed: a deleted topic's counters keep their last value
//! until the process restarts, as Prometheus expects of counters. Its gauges
//! are left out of the scrape ([`ShardedRecorder::render_where`]).
//!
//! Map: this file holds the recorder and the traffic counters; [`describe`]
//! the help texts and the counters at 0 from the start; [`poller`] sets
//! the gauges every few seconds; [`storage`] holds the partition logs' series,
//! fed by the owner's storage events; [`wal`] the ingress WAL's, fed by its
//! group commits; [`shared_render`] lets concurrent scrapes share one render.

mod describe;
mod poller;
mod shared_render;
mod storage;
mod wal;
pub use poller::{
    clear_queue_gauges, note_disk_now, poll_once, run_poller, Behind, QueueSeries, POLL_INTERVAL,
    QUEUE_LOADS_PER_POLL,
};
pub use shared_render::{SharedText, SHARED_RENDER};
pub use storage::StorageMetrics;
pub use wal::WalSeries;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use narad_shards::ids::{DenseIdMap, IncarnationId, PartitionId};

use ::metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};

/// Upper bounds of the histogram buckets, in seconds (latencies from 100 µs to
/// a minute: a long-poll that waits out a 10 s wait lands past 10 s, and
/// `http.max_consume_wait` may be raised).
pub const BUCKETS_SECONDS: [f64; 19] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 15.0, 30.0, 60.0,
];

/// Gauges that read as the largest value any thread set rather than the sum.
const MAX_GAUGES: &[&str] = &["narad_ingress_wal_failed", "narad_ingress_wal_stalled"];

/// Gauges that read as the smallest value any thread set rather than the sum.
const MIN_GAUGES: &[&str] = &["narad_poller_last_success_timestamp_seconds"];

/// How the threads' cells of one gauge series combine.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Merge {
    Sum,
    Max,
    Min,
}

impl Merge {
    fn of(name: &str) -> Merge {
        if MAX_GAUGES.contains(&name) {
            Merge::Max
        } else if MIN_GAUGES.contains(&name) {
            Merge::Min
        } else {
            Merge::Sum
        }
    }
}

#[repr(align(64))]
#[derive(Default)]
struct CounterCell(AtomicU64);

impl CounterFn for CounterCell {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }

    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Ordering::Relaxed);
    }
}

#[repr(align(64))]
#[derive(Default)]
struct GaugeCell(AtomicU64);

impl GaugeCell {
    fn update(&self, f: impl Fn(f64) -> f64) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some(f(f64::from_bits(bits)).to_bits())
            });
    }

    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

impl GaugeFn for GaugeCell {
    fn increment(&self, value: f64) {
        self.update(|v| v + value);
    }

    fn decrement(&self, value: f64) {
        self.update(|v| v - value);
    }

    fn set(&self, value: f64) {
        self.0.store(value.to_bits(), Ordering::Relaxed);
    }
}

/// The count is the buckets' total, read at the scrape, so `_count` always
/// equals the `+Inf` bucket however the scrape interleaves with recording.
#[repr(align(64))]
#[derive(Default)]
struct HistogramCell {
    /// Observations at or below each bound; the last slot is `+Inf`.
    buckets: [AtomicU64; BUCKETS_SECONDS.len() + 1],
    sum: GaugeCell,
}

impl HistogramFn for HistogramCell {
    fn record(&self, value: f64) {
        self.record_many(value, 1);
    }

    /// One bucket increment and one sum update for `count` observations of
    /// one value: the produce path records the records of a commit, which
    /// share their acceptance time when one batch request brought them.
    fn record_many(&self, value: f64, count: usize) {
        if count == 0 {
            return;
        }
        let slot = BUCKETS_SECONDS
            .iter()
            .position(|&bound| value <= bound)
            .unwrap_or(BUCKETS_SECONDS.len());
        self.buckets[slot].fetch_add(count as u64, Ordering::Relaxed);
        self.sum.increment(value * count as f64);
    }
}

#[derive(Clone)]
enum Cell {
    Counter(Arc<CounterCell>),
    Gauge(Arc<GaugeCell>),
    Histogram(Arc<HistogramCell>),
}

/// Every cell of every thread, and the descriptions. Entries are shared, so a
/// scrape copies the list under the lock (pointers only) and does the rest
/// without it: a shard registering a series never waits for a scrape.
#[derive(Default)]
struct Registry {
    /// Every thread's cell of every series, in chunks of [`CELL_CHUNK`]: a
    /// scrape takes the chunks while it holds the lock (an `Arc` each), not
    /// every cell, so a shard registering a series meanwhile waits for a few
    /// hundred reference counts, not millions (a node of 10,000 partitions has
    /// over a million cells). A registration into the chunk a scrape still
    /// reads copies that chunk first.
    cells: Vec<Arc<Vec<Entry>>>,
    help: Arc<HashMap<String, String>>,
}

/// One thread's cell of one series.
type Entry = Arc<(Key, Cell)>;

/// Cells a chunk of [`Registry::cells`] holds.
const CELL_CHUNK: usize = 4096;

impl Registry {
    fn push(&mut self, entry: Entry) {
        match self.cells.last_mut() {
            Some(chunk) if chunk.len() < CELL_CHUNK => Arc::make_mut(chunk).push(entry),
            _ => {
                let mut chunk = Vec::with_capacity(CELL_CHUNK);
                chunk.push(entry);
                self.cells.push(Arc::new(chunk));
            }
        }
    }
}

thread_local! {
    /// This thread's cells, by series.
    static LOCAL: RefCell<HashMap<(usize, Key), Cell>> = RefCell::new(HashMap::new());
}

/// The node's recorder; [`install`] makes it the global one.
#[derive(Clone, Default)]
pub struct ShardedRecorder {
    registry: Arc<Mutex<Registry>>,
}

impl ShardedRecorder {
    /// This recorder's identity in the thread-local maps, so that two recorders
    /// (tests) never share cells.
    fn id(&self) -> usize {
        Arc::as_ptr(&self.registry) as usize
    }

    fn cell(&self, key: &Key, make: impl FnOnce() -> Cell) -> Cell {
        let local_key = (self.id(), key.clone());
        if let Some(cell) = LOCAL.with(|local| local.borrow().get(&local_key).cloned()) {
            return cell;
        }
        let cell = make();
        self.registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::new((key.clone(), cell.clone())));
        LOCAL.with(|local| local.borrow_mut().insert(local_key, cell.clone()));
        cell
    }

    fn describe(&self, key: KeyName, description: SharedString) {
        let mut registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        Arc::make_mut(&mut registry.help).insert(key.as_str().to_string(), description.to_string());
    }

    /// The Prometheus text exposition of every series, summed over threads.
    pub fn render(&self) -> String {
        self.render_where(&|_, _| true)
    }

    /// [`ShardedRecorder::render`] without the gauges labelled with a topic,
    /// or a topic's partition, that `live` says is gone. A deleted topic's
    /// gauges read 0 and mean nothing, and a node whose topics come and go
    /// would otherwise show more of them at every scrape; its counters and
    /// histograms stay, as Prometheus expects of counters. A topic made again
    /// under the name shows its gauges again, for the partitions it has.
    pub fn render_where(&self, live: &dyn Fn(&str, Option<u32>) -> bool) -> String {
        let (cells, help) = {
            let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
            (registry.cells.clone(), registry.help.clone())
        };
        let mut series: BTreeMap<String, BTreeMap<String, Sum>> = BTreeMap::new();
        for entry in cells.iter().flat_map(|chunk| chunk.iter()) {
            let (key, cell) = &**entry;
            let gone = || {
                let (mut topic, mut partition) = (None, None);
                for label in key.labels() {
                    match label.key() {
                        "topic" => topic = Some(label.value()),
                        "partition" => partition = label.value().parse().ok(),
                        _ => {}
                    }
                }
                topic.is_some_and(|topic| !live(topic, partition))
            };
            if matches!(cell, Cell::Gauge(_)) && gone() {
                continue;
            }
            let labels = render_labels(key);
            let merge = Merge::of(key.name());
            let entry = series
                .entry(key.name().to_string())
                .or_default()
                .entry(labels)
                .or_insert_with(|| Sum::new(cell, merge));
            entry.add(cell, merge);
        }
        let mut out = String::with_capacity(4096);
        for (name, by_labels) in &series {
            if let Some(help) = help.get(name) {
                let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
            }
            let kind = by_labels.values().next().map_or("untyped", Sum::kind);
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, sum) in by_labels {
                sum.write(&mut out, name, labels);
            }
        }
        out
    }
}

/// One series summed over the threads that recorded it.
enum Sum {
    Counter(u64),
    Gauge(f64),
    Histogram {
        buckets: [u64; BUCKETS_SECONDS.len() + 1],
        sum: f64,
    },
}

impl Sum {
    fn new(cell: &Cell, merge: Merge) -> Sum {
        match cell {
            Cell::Counter(_) => Sum::Counter(0),
            // The smallest of no value yet: the first cell sets it, as
            // `NAN.min(x)` is `x`.
            Cell::Gauge(_) if merge == Merge::Min => Sum::Gauge(f64::NAN),
            Cell::Gauge(_) => Sum::Gauge(0.0),
            Cell::Histogram(_) => Sum::Histogram {
                buckets: [0; BUCKETS_SECONDS.len() + 1],
                sum: 0.0,
            },
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Sum::Counter(_) => "counter",
            Sum::Gauge(_) => "gauge",
            Sum::Histogram { .. } => "histogram",
        }
    }

    /// Adds one thread's cell; a gauge keeps the sum, the largest or the
    /// smallest value, as `merge` says.
    fn add(&mut self, cell: &Cell, merge: Merge) {
        match (self, cell) {
            (Sum::Counter(total), Cell::Counter(c)) => *total += c.0.load(Ordering::Relaxed),
            (Sum::Gauge(total), Cell::Gauge(g)) => match merge {
                Merge::Sum => *total += g.get(),
                Merge::Max => *total = total.max(g.get()),
                Merge::Min => *total = total.min(g.get()),
            },
            (Sum::Histogram { buckets, sum }, Cell::Histogram(h)) => {
                for (total, bucket) in buckets.iter_mut().zip(&h.buckets) {
                    *total += bucket.load(Ordering::Relaxed);
                }
                *sum += h.sum.get();
            }
            // A name registered as two kinds: the first kind wins.
            _ => {}
        }
    }

    fn write(&self, out: &mut String, name: &str, labels: &str) {
        let braced = |extra: &str| -> String {
            match (labels.is_empty(), extra.is_empty()) {
                (true, true) => String::new(),
                (true, false) => format!("{{{extra}}}"),
                (false, true) => format!("{{{labels}}}"),
                (false, false) => format!("{{{labels},{extra}}}"),
            }
        };
        match self {
            Sum::Counter(v) => {
                let _ = writeln!(out, "{name}{} {v}", braced(""));
            }
            Sum::Gauge(v) => {
                let _ = writeln!(out, "{name}{} {}", braced(""), float_text(*v));
            }
            Sum::Histogram { buckets, sum } => {
                let mut cumulative = 0;
                for (i, bound) in BUCKETS_SECONDS.iter().enumerate() {
                    cumulative += buckets[i];
                    let le = format!("le=\"{bound}\"");
                    let _ = writeln!(out, "{name}_bucket{} {cumulative}", braced(&le));
                }
                cumulative += buckets[BUCKETS_SECONDS.len()];
                let _ = writeln!(out, "{name}_bucket{} {cumulative}", braced("le=\"+Inf\""));
                let _ = writeln!(out, "{name}_sum{} {}", braced(""), float_text(*sum));
                let _ = writeln!(out, "{name}_count{} {cumulative}", braced(""));
            }
        }
    }
}

fn render_labels(key: &Key) -> String {
    let mut labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
    labels.sort_unstable();
    let mut out = String::new();
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{k}=\"{}\"", escape_label(v));
    }
    out
}

fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

impl Recorder for ShardedRecorder {
    fn describe_counter(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn describe_gauge(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn describe_histogram(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn register_counter(&self, key: &Key, _metadata: &Metadata<'_>) -> Counter {
        match self.cell(key, || Cell::Counter(Arc::default())) {
            Cell::Counter(c) => Counter::from_arc(c),
            _ => Counter::noop(),
        }
    }

    fn register_gauge(&self, key: &Key, _metadata: &Metadata<'_>) -> Gauge {
        match self.cell(key, || Cell::Gauge(Arc::default())) {
            Cell::Gauge(g) => Gauge::from_arc(g),
            _ => Gauge::noop(),
        }
    }

    fn register_histogram(&self, key: &Key, _metadata: &Metadata<'_>) -> Histogram {
        match self.cell(key, || Cell::Histogram(Arc::default())) {
            Cell::Histogram(h) => Histogram::from_arc(h),
            _ => Histogram::noop(),
        }
    }
}

/// Makes a [`ShardedRecorder`] the process's recorder (once) and returns it, for
/// the scrape.
pub fn install() -> ShardedRecorder {
    static INSTALLED: std::sync::OnceLock<ShardedRecorder> = std::sync::OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            let recorder = ShardedRecorder::default();
            if ::metrics::set_global_recorder(recorder.clone()).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics stays empty");
            }
            describe::describe_all();
            describe::register_zeroes();
            recorder
        })
        .clone()
}

/// A sample value as the text format writes it: `+Inf`, `-Inf` and `NaN`
/// rather than Rust's `inf`.
fn float_text(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else {
        v.to_string()
    }
}

/// One partition's traffic counters.
pub struct PartitionSeries {
    produced: Counter,
    produced_bytes: Counter,
    consumed: Counter,
    consumed_bytes: Counter,
}

impl PartitionSeries {
    pub fn produced(&self, messages: u64, bytes: u64) {
        self.produced.increment(messages);
        self.produced_bytes.increment(bytes);
    }

    pub fn consumed(&self, messages: u64, bytes: u64) {
        self.consumed.increment(messages);
        self.consumed_bytes.increment(bytes);
    }
}

/// One topic's consume series.
pub struct TopicSeries {
    /// `narad_consume_wait_seconds` by outcome: hit, timeout, cancelled, no_wait.
    wait: [Histogram; 4],
    empty: Counter,
}

/// How a consume ended, the `outcome` label of `narad_consume_wait_seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    Hit,
    Timeout,
    Cancelled,
    NoWait,
}

impl WaitOutcome {
    const ALL: [WaitOutcome; 4] = [
        WaitOutcome::Hit,
        WaitOutcome::Timeout,
        WaitOutcome::Cancelled,
        WaitOutcome::NoWait,
    ];

    fn label(self) -> &'static str {
        match self {
            WaitOutcome::Hit => "hit",
            WaitOutcome::Timeout => "timeout",
            WaitOutcome::Cancelled => "cancelled",
            WaitOutcome::NoWait => "no_wait",
        }
    }
}

impl TopicSeries {
    /// A consume that took `seconds` and ended as `outcome`.
    pub fn waited(&self, outcome: WaitOutcome, seconds: f64) {
        self.wait[outcome as usize].record(seconds);
    }

    /// A consume answered 204.
    pub fn empty(&self) {
        self.empty.increment(1);
    }
}

/// One shard's per-partition traffic counters, registered once per partition so
/// that counting a message costs a map lookup and no allocation; and its
/// per-topic consume series, likewise.
#[derive(Default)]
pub struct Traffic {
    series: RefCell<DenseIdMap<(IncarnationId, PartitionId), Rc<PartitionSeries>>>,
    topics: RefCell<HashMap<IncarnationId, Rc<TopicSeries>>>,
    /// Incarnations deleted lately: a request that looked one up before the
    /// delete and counts after it gets handles that are not cached again.
    forgotten: RefCell<VecDeque<IncarnationId>>,
}

/// Partitions one shard keeps counters cached for; past it the cache starts over
/// (the series themselves live on in the recorder).
const TRAFFIC_CACHED_MAX: usize = 65_536;

/// Deleted incarnations a shard remembers not to cache again.
const TRAFFIC_FORGOTTEN_MAX: usize = 64;

impl Traffic {
    /// The consume series of a topic.
    pub fn topic(&self, topic: &str, incarnation: IncarnationId) -> Rc<TopicSeries> {
        if let Some(series) = self.topics.borrow().get(&incarnation) {
            return series.clone();
        }
        let series = Rc::new(TopicSeries {
            wait: WaitOutcome::ALL.map(|outcome| {
                ::metrics::histogram!(
                    "narad_consume_wait_seconds",
                    "topic" => topic.to_string(),
                    "outcome" => outcome.label()
                )
            }),
            empty: ::metrics::counter!("narad_consume_empty_total", "topic" => topic.to_string()),
        });
        if self.forgotten.borrow().contains(&incarnation) {
            return series;
        }
        let mut cached = self.topics.borrow_mut();
        if cached.len() >= TRAFFIC_CACHED_MAX {
            cached.clear();
        }
        cached.insert(incarnation, series.clone());
        series
    }

    pub fn partition(
        &self,
        topic: &str,
        incarnation: IncarnationId,
        partition: PartitionId,
    ) -> Rc<PartitionSeries> {
        let key = (incarnation, partition);
        if let Some(series) = self.series.borrow().get(&key) {
            return series.clone();
        }
        let labels = [
            ("topic", topic.to_string()),
            ("partition", partition.0.to_string()),
        ];
        let series = Rc::new(PartitionSeries {
            produced: ::metrics::counter!("narad_messages_produced_total", &labels),
            produced_bytes: ::metrics::counter!("narad_bytes_produced_total", &labels),
            consumed: ::metrics::counter!("narad_messages_consumed_total", &labels),
            consumed_bytes: ::metrics::counter!("narad_bytes_consumed_total", &labels),
        });
        if self.forgotten.borrow().contains(&incarnation) {
            return series;
        }
        let mut cached = self.series.borrow_mut();
        if cached.len() >= TRAFFIC_CACHED_MAX {
            cached.clear();
        }
        cached.insert(key, series.clone());
        series
    }

    /// Lets go of a deleted incarnation's cached handles (its series stay in
    /// the recorder): under topic churn the caches would otherwise fill with
    /// incarnations that never come back, up to their bound.
    pub fn forget(&self, incarnation: IncarnationId) {
        let mut forgotten = self.forgotten.borrow_mut();
        if forgotten.len() == TRAFFIC_FORGOTTEN_MAX {
            forgotten.pop_front();
        }
        forgotten.push_back(incarnation);
        self.topics.borrow_mut().remove(&incarnation);
        self.series
            .borrow_mut()
            .retain(|(cached, _), _| *cached != incarnation);
    }

    /// Handles cached: topics, partitions.
    #[cfg(test)]
    pub fn cached(&self) -> (usize, usize) {
        (self.topics.borrow().len(), self.series.borrow().len())
    }
}

#[cfg(test)]
mod tests;
