//! The partition owner: its open-log budget, the commit combiner, large commit
//! runs, the events it reports to its observer, and the retention reaper with
//! idle eviction. One test binary, so the owner's code is built once for all
//! of them.

mod budget;
mod combine;
mod common;
mod large_runs;
mod observer;
mod reaper;
mod sizes;
