//! The run as it goes: running tallies that producers and consumers add to,
//! a per-second series that `--report` plots, and the status line redrawn on
//! a terminal.
//!
//! Which cores: the generator's one executor. Producers, consumers and the
//! ticker are tasks on it, so [`Live`] is `Cell`s and `RefCell`s borrowed for
//! one call at a time, never across an `.await`: no locks, no atomics.
//!
//! Each latency is recorded twice: into its worker's own histogram, which the
//! final table sums as before, and into the current window's histogram here.
//! Recording into a histogram is an increment in a preallocated array, so the
//! hot path allocates nothing more. Once a second the ticker closes the window
//! into a [`SecondRow`] (counts and three percentiles, a few dozen bytes), adds
//! it to the running totals that give "p99 so far", and clears it. Memory is
//! thus bounded by the run's length, not by its messages, and the series by
//! [`SERIES_ROWS_MAX`] whatever the length.

use std::cell::{Cell, RefCell};
use std::io::Write as _;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::config::Mode;
use super::report::{self, go_duration, histogram_percentile, round_latency};

/// The length of one row of the series.
pub const WINDOW: Duration = Duration::from_secs(1);
/// How often the ticker wakes to see whether the run is over: the most a run
/// waits for the ticker to finish.
const POLL: Duration = Duration::from_millis(100);
/// Rows the series keeps: two days, a day-long run (the longest `--duration`)
/// and its longest drain. Later rows are counted but not kept.
pub const SERIES_ROWS_MAX: usize = 2 * 24 * 3600;

const _: () = assert!(POLL.as_nanos() < WINDOW.as_nanos());

/// Count and percentiles of one window's latencies, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyRow {
    pub count: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

impl LatencyRow {
    fn of(histogram: &Histogram<u64>) -> LatencyRow {
        LatencyRow {
            count: histogram.len(),
            p50_us: histogram_percentile(histogram, 0.50),
            p99_us: histogram_percentile(histogram, 0.99),
            max_us: histogram.max(),
        }
    }
}

/// What one window of the run measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SecondRow {
    /// When the window ended, from the start of the run.
    pub end: Duration,
    /// How long it lasted: one [`WINDOW`], give or take a late tick; the last
    /// window of a run is shorter.
    pub span: Duration,
    /// Records acknowledged by the broker in the window.
    pub produced_records: u64,
    /// Records of produce requests that failed in the window.
    pub failed_records: u64,
    /// Records whose ack was acknowledged in the window.
    pub consumed_records: u64,
    /// Consume and ack requests (or batch ack results) that failed.
    pub consume_errors: u64,
    /// Produce-ack latency of the window's successful requests.
    pub produce: LatencyRow,
    /// End-to-end latency of the window's delivered records.
    pub e2e: LatencyRow,
}

impl SecondRow {
    /// Records per second over the window.
    pub fn per_second(&self, records: u64) -> f64 {
        let seconds = self.span.as_secs_f64();
        if seconds > 0.0 {
            records as f64 / seconds
        } else {
            0.0
        }
    }
}

/// The run's series of windows, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Series {
    pub rows: Vec<SecondRow>,
    /// Windows past [`SERIES_ROWS_MAX`], not kept.
    pub dropped_rows: u64,
}

impl Series {
    fn push(&mut self, row: SecondRow) {
        if self.rows.len() < SERIES_ROWS_MAX {
            self.rows.push(row);
        } else {
            self.dropped_rows += 1;
        }
        assert!(self.rows.len() <= SERIES_ROWS_MAX);
    }
}

/// The counts a window starts from, to tell its own share of the totals.
#[derive(Clone, Copy)]
struct Marks {
    at: Instant,
    produced_records: u64,
    failed_records: u64,
    consumed_records: u64,
    consume_errors: u64,
}

/// The current window's latencies.
struct Window {
    produce_us: Histogram<u64>,
    e2e_us: Histogram<u64>,
}

/// The running tallies of a run, shared by every task of the generator.
pub struct Live {
    start: Instant,
    produced_records: Cell<u64>,
    failed_records: Cell<u64>,
    consumed_records: Cell<u64>,
    consume_errors: Cell<u64>,
    last_consume_error: Cell<Option<Instant>>,
    window: RefCell<Window>,
    marks: Cell<Marks>,
    /// Every closed window's latencies: the figures "so far".
    total: RefCell<Window>,
    series: RefCell<Series>,
    /// Set at the end of the run: the ticker closes the last window and stops.
    finished: Cell<bool>,
}

impl Live {
    pub fn new(start: Instant) -> Live {
        let window = || Window {
            produce_us: report::latency_histogram(),
            e2e_us: report::latency_histogram(),
        };
        Live {
            start,
            produced_records: Cell::new(0),
            failed_records: Cell::new(0),
            consumed_records: Cell::new(0),
            consume_errors: Cell::new(0),
            last_consume_error: Cell::new(None),
            window: RefCell::new(window()),
            marks: Cell::new(Marks {
                at: start,
                produced_records: 0,
                failed_records: 0,
                consumed_records: 0,
                consume_errors: 0,
            }),
            total: RefCell::new(window()),
            series: RefCell::new(Series::default()),
            finished: Cell::new(false),
        }
    }

    /// When the run started: the origin of the series.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// A produce request of `records` records was acknowledged after
    /// `latency_us`.
    pub fn produced(&self, records: u64, latency_us: u64) {
        add(&self.produced_records, records);
        self.window
            .borrow_mut()
            .produce_us
            .saturating_record(latency_us.max(1));
    }

    /// A produce request of `records` records failed.
    pub fn failed(&self, records: u64) {
        add(&self.failed_records, records);
    }

    /// A record reached a consumer `latency_us` after it was sent.
    pub fn delivered(&self, latency_us: u64) {
        self.window
            .borrow_mut()
            .e2e_us
            .saturating_record(latency_us.max(1));
    }

    /// `records` records had their ack acknowledged.
    pub fn consumed(&self, records: u64) {
        add(&self.consumed_records, records);
    }

    /// A consume or ack request, or one result of a batch ack, failed.
    pub fn consume_failed(&self) {
        add(&self.consume_errors, 1);
        self.last_consume_error.set(Some(Instant::now()));
    }

    /// When the last consume or ack failure happened, if any did.
    pub fn last_consume_failure(&self) -> Option<Instant> {
        self.last_consume_error.get()
    }

    /// Records consumed so far, by every consumer.
    pub fn consumed_records(&self) -> u64 {
        self.consumed_records.get()
    }

    /// Closes the current window at `now` into a row of the series, adds its
    /// latencies to the totals and opens the next window.
    pub fn close_window(&self, now: Instant) -> SecondRow {
        let marks = self.marks.get();
        assert!(now >= marks.at, "windows close in order");
        let mut window = self.window.borrow_mut();
        let row = SecondRow {
            end: now.saturating_duration_since(self.start),
            span: now.saturating_duration_since(marks.at),
            produced_records: self.produced_records.get() - marks.produced_records,
            failed_records: self.failed_records.get() - marks.failed_records,
            consumed_records: self.consumed_records.get() - marks.consumed_records,
            consume_errors: self.consume_errors.get() - marks.consume_errors,
            produce: LatencyRow::of(&window.produce_us),
            e2e: LatencyRow::of(&window.e2e_us),
        };
        let mut total = self.total.borrow_mut();
        // Both histograms have the same bounds, so adding cannot fail.
        total
            .produce_us
            .add(&window.produce_us)
            .expect("windows share the histogram bounds");
        total
            .e2e_us
            .add(&window.e2e_us)
            .expect("windows share the histogram bounds");
        window.produce_us.reset();
        window.e2e_us.reset();
        self.marks.set(Marks {
            at: now,
            produced_records: self.produced_records.get(),
            failed_records: self.failed_records.get(),
            consumed_records: self.consumed_records.get(),
            consume_errors: self.consume_errors.get(),
        });
        self.series.borrow_mut().push(row);
        row
    }

    /// The status line after `row`: elapsed time, the window's rates, errors
    /// so far and p99 so far (of produce-ack latency when the run produces,
    /// of end-to-end latency when it consumes).
    pub fn status_line(&self, row: &SecondRow, mode: Mode) -> String {
        let (produces, consumes) = (mode.produces(), mode.consumes());
        let words = mode.sender_words();
        let total = self.total.borrow();
        let p99 = |h: &Histogram<u64>| match h.is_empty() {
            true => "-".to_string(),
            false => go_duration(round_latency(histogram_percentile(h, 0.99))),
        };
        let mut line = format!("{:>6.1}s", row.end.as_secs_f64());
        if produces {
            line += &format!(
                "  {} {:.0} {}/s",
                words.verb,
                row.per_second(row.produced_records),
                words.unit
            );
        }
        if consumes {
            line += &format!(
                "  consume {:.0} msg/s",
                row.per_second(row.consumed_records)
            );
        }
        let errors = self.failed_records.get() + self.consume_errors.get();
        line += &format!("  errors {errors}");
        if produces {
            line += &format!("  p99 {}", p99(&total.produce_us));
        }
        if consumes {
            line += &format!("  e2e p99 {}", p99(&total.e2e_us));
        }
        line
    }

    /// Marks the run over: the ticker closes the last window and returns.
    pub fn finish(&self) {
        self.finished.set(true);
    }

    /// The series so far.
    pub fn take_series(&self) -> Series {
        std::mem::take(&mut self.series.borrow_mut())
    }
}

fn add(cell: &Cell<u64>, n: u64) {
    cell.set(cell.get() + n);
}

/// Closes a window every [`WINDOW`] until [`Live::finish`], then the last,
/// shorter one if anything happened in it. With `show`, redraws the status
/// line on standard error after each window and erases it at the end, so the
/// final lines print on a clean line.
pub async fn ticker(live: std::rc::Rc<Live>, show: bool, mode: Mode) {
    let mut next = live.start + WINDOW;
    let mut drawn = false;
    while !live.finished.get() {
        super::evloop::sleep(POLL).await;
        let now = Instant::now();
        if now < next {
            continue;
        }
        // Windows end on whole seconds from the start; a late tick does not
        // shift the ones after it.
        while next <= now {
            next += WINDOW;
        }
        let row = live.close_window(now);
        if show {
            redraw(&live.status_line(&row, mode));
            drawn = true;
        }
    }
    let now = Instant::now();
    let marks = live.marks.get();
    let anything = live.produced_records.get() > marks.produced_records
        || live.failed_records.get() > marks.failed_records
        || live.consumed_records.get() > marks.consumed_records
        || !live.window.borrow().e2e_us.is_empty();
    if anything {
        live.close_window(now);
    }
    if drawn {
        redraw("");
    }
}

/// Replaces the terminal's current line with `line`: carriage return, erase
/// the line, write. A closed stream loses it rather than panicking.
fn redraw(line: &str) {
    let _ = write!(std::io::stderr(), "\r\x1b[2K{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_counts_its_own_share_and_the_totals_grow() {
        let start = Instant::now();
        let live = Live::new(start);
        for us in [100, 200, 300, 400] {
            live.produced(10, us);
        }
        live.failed(5);
        live.consumed(30);
        live.delivered(1000);
        live.consume_failed();
        let first = live.close_window(start + WINDOW);
        assert_eq!(first.end, WINDOW);
        assert_eq!(first.span, WINDOW);
        assert_eq!((first.produced_records, first.failed_records), (40, 5));
        assert_eq!((first.consumed_records, first.consume_errors), (30, 1));
        assert_eq!(
            first.produce,
            LatencyRow {
                count: 4,
                p50_us: 200,
                p99_us: 300,
                max_us: 400
            }
        );
        assert_eq!(first.e2e.count, 1);
        assert_eq!(first.per_second(first.produced_records), 40.0);
        assert_eq!(
            live.status_line(&first, Mode::Flow),
            "   1.0s  produce 40 msg/s  consume 30 msg/s  errors 6  p99 300µs  e2e p99 1ms"
        );

        live.produced(1, 5000);
        let second = live.close_window(start + WINDOW + WINDOW / 2);
        assert_eq!(second.span, WINDOW / 2);
        assert_eq!((second.produced_records, second.failed_records), (1, 0));
        // The histogram's highest value equivalent to 5000 at three digits.
        assert_eq!(second.produce.max_us, 5003);
        assert_eq!(second.e2e, LatencyRow::default());
        assert_eq!(second.per_second(1), 2.0);
        // p99 so far is over all five latencies: int(0.99·4) = 3, 400 µs.
        assert_eq!(
            live.status_line(&second, Mode::Produce),
            "   1.5s  produce 2 msg/s  errors 6  p99 400µs"
        );
        assert_eq!(
            live.status_line(&second, Mode::Ping),
            "   1.5s  ping 2 req/s  errors 6  p99 400µs"
        );
        let series = live.take_series();
        assert_eq!(series.rows, [first, second]);
        assert_eq!(series.dropped_rows, 0);
    }

    #[test]
    fn the_series_keeps_a_bounded_number_of_rows() {
        let mut series = Series::default();
        let row = SecondRow {
            end: WINDOW,
            span: WINDOW,
            produced_records: 1,
            failed_records: 0,
            consumed_records: 0,
            consume_errors: 0,
            produce: LatencyRow::default(),
            e2e: LatencyRow::default(),
        };
        for _ in 0..SERIES_ROWS_MAX + 3 {
            series.push(row);
        }
        assert_eq!(series.rows.len(), SERIES_ROWS_MAX);
        assert_eq!(series.dropped_rows, 3);
    }
}
