//! Consume path (stub while the real modules land).
pub mod inflight;
