//! Log lines for events that can come thousands at a time (every partition of
//! a full disk failing its commits, a latched WAL refusing every produce): one
//! line a period, saying how many were held back since the last.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// At most one line every `every`, on the thread that owns it.
#[derive(Debug)]
pub struct LineThrottle {
    every: Duration,
    /// When the last line went out, and the events since without one.
    state: Cell<(Option<Instant>, u64)>,
}

impl LineThrottle {
    pub const fn new(every: Duration) -> LineThrottle {
        LineThrottle {
            every,
            state: Cell::new((None, 0)),
        }
    }

    /// Whether the event at `now` gets its line: if so, how many events went
    /// without one since the last line.
    pub fn due(&self, now: Instant) -> Option<u64> {
        let (last, held) = self.state.get();
        if last.is_some_and(|at| now.saturating_duration_since(at) < self.every) {
            self.state.set((last, held + 1));
            None
        } else {
            self.state.set((Some(now), 0));
            Some(held)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LineThrottle;
    use std::time::{Duration, Instant};

    #[test]
    fn one_line_a_period_counts_the_events_held_back() {
        let every = Duration::from_secs(10);
        let lines = LineThrottle::new(every);
        let start = Instant::now();
        assert_eq!(lines.due(start), Some(0));
        for i in 1..=5 {
            assert_eq!(lines.due(start + Duration::from_millis(i)), None);
        }
        assert_eq!(lines.due(start + every), Some(5));
        assert_eq!(lines.due(start + every), None);
        assert_eq!(lines.due(start + 2 * every), Some(1));
    }
}
