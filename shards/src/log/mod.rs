//! The partition log (in progress).
