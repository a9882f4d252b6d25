//! Transparent huge pages for the I/O buffers only, never for the heap.
//!
//! Why: with huge pages on the heap, the allocator's first touch of fresh memory
//! faulted in a whole 2 MiB page and zeroed it on the spot, and a shard stalled
//! for 5-9 ms a few times a second while its caches grew: most of the produce
//! p99 at half the closed-loop rate. With no huge pages at all, the buffers the
//! device reads and writes (glommio's registered I/O area and its larger DMA
//! buffers, all page-aligned) came in 4 KiB pages, each a segment of its own
//! for the device, and large writes took about a third longer: batch produce
//! lost 10-15%. (benches/RESULTS.md, "Huge pages and the produce tail".)
//!
//! How: mimalloc is built without its own huge page advice (`no_thp`); the
//! process asks the kernel for huge pages only where advised
//! (`PR_THP_DISABLE_EXCEPT_ADVISED`, Linux 6.18; on older kernels huge pages are
//! turned off for the whole process instead, which keeps the tail and gives up
//! the batch bandwidth); and [`Allocator`] advises huge pages on the 2 MiB-aligned
//! inside of every page-aligned allocation of 2 MiB or more.

use std::alloc::{GlobalAlloc, Layout};

/// The huge page size the advice is aligned to.
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// `PR_THP_DISABLE_EXCEPT_ADVISED` (Linux 6.18 uapi), not in `libc` yet.
const PR_THP_DISABLE_EXCEPT_ADVISED: libc::c_ulong = 1 << 1;

/// How the process was set up by [`limit_to_advised`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Huge pages only where advised.
    ExceptAdvised,
    /// No huge pages anywhere (a kernel before 6.18).
    Off,
    /// The kernel refused both; its own policy applies.
    Unchanged,
}

/// Asks the kernel for huge pages only where advised, or for none where it
/// cannot do that. The kernel checks the flags at each fault, so memory mapped
/// before the call is covered too.
pub fn limit_to_advised() -> Mode {
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only.
    let except_advised = unsafe {
        libc::prctl(
            libc::PR_SET_THP_DISABLE,
            1 as libc::c_ulong,
            PR_THP_DISABLE_EXCEPT_ADVISED,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if except_advised == 0 {
        return Mode::ExceptAdvised;
    }
    // SAFETY: as above.
    let off = unsafe {
        libc::prctl(
            libc::PR_SET_THP_DISABLE,
            1 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if off == 0 {
        Mode::Off
    } else {
        Mode::Unchanged
    }
}

/// mimalloc, advising huge pages for large page-aligned allocations (the I/O
/// buffers). A freed one's advice stays with its range, which mimalloc may hand
/// out again for small objects: these buffers are few and long-lived.
pub struct Allocator;

impl Allocator {
    fn advise(ptr: *mut u8, layout: Layout) {
        if ptr.is_null() || layout.align() < 4096 || layout.size() < HUGE_PAGE_BYTES {
            return;
        }
        let start = (ptr as usize).next_multiple_of(HUGE_PAGE_BYTES);
        let end = (ptr as usize + layout.size()) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
        if end > start {
            // SAFETY: the range lies inside the allocation just made; advice
            // changes how its pages are backed, never their contents. A
            // failure leaves them in small pages.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
}

// SAFETY: every call is passed to mimalloc unchanged; the advice only changes
// how pages are backed.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let ptr = unsafe { mimalloc::MiMalloc.alloc(layout) };
        Self::advise(ptr, layout);
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let ptr = unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) };
        Self::advise(ptr, layout);
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the kernel would back the mapping holding `addr` with huge
    /// pages (`THPeligible` of its entry in `/proc/self/smaps`).
    fn eligible(addr: usize) -> Option<bool> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().unwrap_or("");
            if let Some((from, to)) = range.split_once('-') {
                if let (Ok(from), Ok(to)) = (
                    usize::from_str_radix(from, 16),
                    usize::from_str_radix(to, 16),
                ) {
                    inside = (from..to).contains(&addr);
                    continue;
                }
            }
            if inside {
                if let Some(value) = line.strip_prefix("THPeligible:") {
                    return Some(value.trim() == "1");
                }
            }
        }
        None
    }

    fn thp_policy() -> String {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default()
    }

    #[test]
    fn only_large_page_aligned_allocations_may_get_huge_pages() {
        if !thp_policy().contains("[always]") && !thp_policy().contains("[madvise]") {
            eprintln!("transparent huge pages are off on this host; nothing to check");
            return;
        }
        let mode = limit_to_advised();
        let big = Layout::from_size_align(8 << 20, 4096).unwrap();
        let small = Layout::from_size_align(64 << 10, 8).unwrap();
        // SAFETY: non-zero sizes; freed below with the same layouts.
        let (big_ptr, small_ptr) = unsafe { (Allocator.alloc(big), Allocator.alloc(small)) };
        assert!(!big_ptr.is_null() && !small_ptr.is_null());
        let inside_big = (big_ptr as usize).next_multiple_of(HUGE_PAGE_BYTES);
        let small_eligible = eligible(small_ptr as usize);
        let big_eligible = eligible(inside_big);
        // SAFETY: allocated above with these layouts.
        unsafe {
            Allocator.dealloc(big_ptr, big);
            Allocator.dealloc(small_ptr, small);
        }
        assert_ne!(
            small_eligible,
            Some(true),
            "the heap may get huge pages ({mode:?})"
        );
        if mode == Mode::ExceptAdvised {
            assert_eq!(big_eligible, Some(true), "an I/O buffer gets no huge pages");
        }
    }
}
