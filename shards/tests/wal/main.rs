//! The ingress WAL: round trips, group commit, rolls and recycling, the
//! checkpoint, damage found at open, recovery under read faults, segment preparation, what an open
//! reads, and what the WAL reports to its observer. One test binary, so the
//! WAL's code is built once for all of them; the crash test (`wal_crash.rs`) stays apart, since the broken variants of
//! `tools/prove-tests-fail.sh` rebuild it on its own.

mod basic;
mod checkpoint;
#[path = "../wal_common/mod.rs"]
mod common;
mod damage;
mod faults;
mod observer;
mod prepare;
mod recovery_reads;
