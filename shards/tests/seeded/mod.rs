//! The seed handling the seeded simulations share: which seeds to run, and a run
//! that names the failing seed and the command that replays it.
//!
//! `NARAD_TEST_SEED=<n>` runs that one seed; otherwise `NARAD_SIM_SEEDS` seeds
//! (or the simulation's default) from a random base.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use rand::Rng;

/// The seeds to run.
pub fn seeds(default_count: u64) -> Vec<u64> {
    if let Ok(seed) = std::env::var("NARAD_TEST_SEED") {
        return vec![seed.parse().expect("NARAD_TEST_SEED is a number")];
    }
    let count: u64 = std::env::var("NARAD_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_count);
    let base: u64 = rand::rng().random_range(0..1 << 40);
    (base..base + count).collect()
}

/// Runs `simulate` for every seed, summing the counters each returns; a failing
/// seed is printed with the command that replays it (`test_target` is the test
/// binary's name), then the failure goes on.
pub fn run(
    what: &str,
    test_target: &str,
    default_count: u64,
    simulate: impl Fn(u64) -> BTreeMap<&'static str, u64>,
) {
    let mut totals: BTreeMap<&'static str, u64> = BTreeMap::new();
    for seed in seeds(default_count) {
        match catch_unwind(AssertUnwindSafe(|| simulate(seed))) {
            Ok(stats) => {
                for (k, v) in stats {
                    *totals.entry(k).or_default() += v;
                }
            }
            Err(panic) => {
                eprintln!("{what} failed: seed={seed}");
                eprintln!(
                    "replay with NARAD_TEST_SEED={seed} cargo test -p narad-shards --test {test_target}"
                );
                std::panic::resume_unwind(panic);
            }
        }
    }
    eprintln!("{what} totals: {totals:?}");
}
