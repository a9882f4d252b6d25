//! Whether a run passed, and every reason it did not: what `narad bench`
//! prints last and exits 1 on.

use super::config::{Length, Mode, Settings};
use super::{stamp, Outcome};

/// Whether the run succeeded: every produce accepted, no server error, every
/// payload intact and, with `--verify`, every acknowledged record consumed.
pub(super) fn judge(settings: &Settings, outcome: &Outcome) -> Result<(), String> {
    let failures = failures(settings, outcome);
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

/// Everything that makes a run fail, in the order a reader needs it.
fn failures(settings: &Settings, outcome: &Outcome) -> Vec<String> {
    let mut failures = Vec::new();
    if let Some(reason) = outcome.ended().early_reason() {
        failures.push(format!(
            "{reason}; the run ended early, and the figures above cover it until then"
        ));
    }
    if let Some(p) = &outcome.produce {
        if p.failed_records > 0 {
            failures.push(format!(
                "{} of {} records failed",
                p.failed_records,
                p.failed_records + p.ok_records
            ));
        }
    }
    let Some(c) = &outcome.consume else {
        return failures;
    };
    let server_errors = c.tally.server_errors();
    if server_errors > 0 {
        failures.push(format!(
            "{server_errors} consume or ack requests were answered 5xx"
        ));
    }
    if c.tally.damaged_records > 0 {
        failures.push(format!(
            "{} consumed payloads differ from what was sent",
            c.tally.damaged_records
        ));
    }
    // A counted consume run acks its count, unless the topic ran dry first.
    if let (Mode::Consume, Length::Records(count)) = (settings.mode, settings.length) {
        if c.tally.consumed_records < count {
            failures.push(format!(
                "{} of {count} messages consumed: the topic had no more",
                c.tally.consumed_records
            ));
        }
    }
    if let Some(v) = &c.verdict {
        assert!(settings.verify);
        if v.missing_records > 0 {
            if let Some(limit) = c.drain_cut_short {
                failures.push(format!(
                    "{} of {} acknowledged records were not consumed within the drain's limit \
                     ({:.0} s after the producers stopped) while the consumers were still \
                     acking: nothing shows them lost, but the run could not verify them; \
                     add consumers or shorten the run",
                    v.missing_records,
                    v.produced_ok_records,
                    limit.as_secs_f64()
                ));
            } else {
                failures.push(format!(
                    "{} of {} acknowledged records were never consumed (delivered and acked: a \
                     delivery whose ack failed, and that did not come again, does not count)",
                    v.missing_records, v.produced_ok_records
                ));
            }
        }
        if v.unknown_records > 0 {
            failures.push(format!(
                "{} consumed records carry ids this run never sent",
                v.unknown_records
            ));
        }
        if v.untracked_records > 0 {
            failures.push(format!(
                "{} records past the first {} ids were not verified: --verify tracks that many, shorten the run",
                v.untracked_records,
                stamp::LEDGER_IDS_MAX
            ));
        }
    }
    failures
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::config::tests::config;
    use super::super::config::Config;
    use super::super::consumer::ConsumeTally;
    use super::super::live::Series;
    use super::super::report::ConsumeSummary;
    use super::*;

    fn settings(config: Config) -> Settings {
        Settings::resolve(&config).unwrap()
    }

    /// A verified flow that found 3 of 10 acknowledged records missing.
    fn three_of_ten_missing(drain_cut_short: Option<Duration>, topic_gone: bool) -> Outcome {
        Outcome {
            produce: None,
            consume: Some(ConsumeSummary {
                tally: ConsumeTally::new(),
                elapsed: Duration::from_secs(1),
                duplicate_records: 0,
                verdict: Some(stamp::Verdict {
                    produced_ok_records: 10,
                    missing_records: 3,
                    duplicate_records: 0,
                    unknown_records: 0,
                    untracked_records: 0,
                }),
                drain_cut_short,
            }),
            abandoned: false,
            topic_gone,
            warnings: Vec::new(),
            series: Series::default(),
        }
    }

    /// A verify run whose drain hit its limit while consumers still acked
    /// says so, rather than calling the records it did not reach lost; both
    /// fail the run.
    #[test]
    fn a_drain_cut_short_is_not_reported_as_loss() {
        let verify = settings(Config {
            mode: Some(Mode::Flow),
            verify: true,
            ..config()
        });
        let outcome = |drain_cut_short| three_of_ten_missing(drain_cut_short, false);
        let lost = judge(&verify, &outcome(None)).unwrap_err();
        assert!(
            lost.contains("3 of 10 acknowledged records were never consumed"),
            "{lost}"
        );
        let cut = judge(&verify, &outcome(Some(Duration::from_secs(40)))).unwrap_err();
        assert!(cut.contains("within the drain's limit (40 s"), "{cut}");
        assert!(!cut.contains("never consumed"), "{cut}");
    }

    /// A run that failed several ways names every one: an early end does not
    /// hide the records it found missing.
    #[test]
    fn every_reason_a_run_failed_is_named() {
        let verify = settings(Config {
            mode: Some(Mode::Flow),
            verify: true,
            ..config()
        });
        let why = judge(&verify, &three_of_ten_missing(None, true)).unwrap_err();
        assert!(
            why.contains("the topic was deleted during the run"),
            "{why}"
        );
        assert!(
            why.contains("3 of 10 acknowledged records were never consumed"),
            "{why}"
        );
    }
}
