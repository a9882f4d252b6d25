//! The produce dispatcher (in progress).
