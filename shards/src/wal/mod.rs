//! The ingress WAL (in progress).
