//! Operator tools bundled with the `narad` binary.
//!
//! - [`inspect`]: an offline, read-only inspector of ingress WAL directories and
//!   partition log directories. It never repairs, truncates or rewrites anything, so
//!   it is safe to run against the data of a stopped (or crashed) broker before
//!   deciding what to do.
//! - [`bench`]: `narad bench`, the load generator: many keep-alive HTTP
//!   connections driven from one core, with latency percentiles.

pub mod bench;
pub mod inspect;
