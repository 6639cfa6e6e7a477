//! See `recast::fuzzing::mapping_bounds`. This harness also holds the mapping to its bounds of
//! memory and time: it counts the bytes the process holds while the input is mapped (every
//! allocation goes through the counter below), and times the mapping, whose work the step
//! budget bounds to a few milliseconds.
#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The system allocator, counting the bytes held and the most held since the last reset.
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let held = HELD.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(held, Ordering::Relaxed);
}

// SAFETY: every call is passed on to the system allocator unchanged; only counts are kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, layout, size) };
        if !q.is_null() {
            HELD.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(size);
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Far more than the step budget lets a mapping take (a few milliseconds): an input past it has
/// work the steps do not count.
const TIME: Duration = Duration::from_millis(500);

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // Compiling the rules is not mapping: only the mapping is measured.
    let prepared = match recast::fuzzing::bounds::prepare(data) {
        Ok(prepared) => prepared,
        Err(_) => return,
    };
    let before = HELD.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let started = Instant::now();
    let reached = prepared.map();
    let took = started.elapsed();
    let held = PEAK.load(Ordering::Relaxed).saturating_sub(before);
    let bound = recast::fuzzing::bounds::memory_bound(data.len(), prepared.patterns);
    assert!(held <= bound, "{reached:?}: held {held} bytes at most, more than {bound}");
    assert!(took <= TIME, "{reached:?}: took {took:?}");
});
