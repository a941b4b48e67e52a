//! A counting global allocator: live heap bytes and their peak, for the stage table.
//!
//! RSS cannot say which stage holds what (freed memory stays resident, the allocator keeps
//! arenas), so the stage benchmark counts the bytes the program itself asks for. It lives in
//! kpr-bench's binary only: the product keeps the system allocator untouched. Two relaxed
//! atomic operations per allocation; the figures are exact for a single-threaded stretch.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting.
pub struct Counting;

impl Counting {
    fn grew(by: usize) {
        let live = LIVE.fetch_add(by, Ordering::Relaxed) + by;
        PEAK.fetch_max(live, Ordering::Relaxed);
    }

    fn shrank(by: usize) {
        LIVE.fetch_sub(by, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded to `System` unchanged; only counters are updated beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            Self::grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            Self::grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `alloc`.
        unsafe { System.dealloc(ptr, layout) };
        Self::shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let moved = unsafe { System.realloc(ptr, layout, new_size) };
        if !moved.is_null() {
            match new_size.checked_sub(layout.size()) {
                Some(grown) => Self::grew(grown),
                None => Self::shrank(layout.size() - new_size),
            }
        }
        moved
    }
}

/// Heap bytes allocated and not yet freed, process-wide.
pub fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Starts a new peak at the current live bytes.
pub fn reset_peak() {
    PEAK.store(live(), Ordering::Relaxed);
}

/// The most live bytes since the last [`reset_peak`].
pub fn peak() -> usize {
    PEAK.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_live_bytes_and_their_peak() {
        // Tests run on several threads: allow for what others allocate meanwhile, but a
        // 64 MiB block must show in both figures.
        let before = live();
        reset_peak();
        let block = vec![1u8; 64 << 20];
        std::hint::black_box(&block);
        assert!(
            live() >= before + (64 << 20) - (8 << 20),
            "live {} before {before}",
            live()
        );
        drop(block);
        assert!(
            peak() >= before + (64 << 20) - (8 << 20),
            "peak {} before {before}",
            peak()
        );
        assert!(
            live() < before + (32 << 20),
            "64 MiB freed but live is {}",
            live()
        );
    }
}
