//! Handing the memory a full sync freed back to the system.
//!
//! A full sync, and the source's objects the node applied before it, free
//! millions of small allocations. glibc keeps them in the free lists of
//! the arena of the thread that made them (the parse workers, the watch
//! thread, the run loop) and merges them on that arena's next large
//! request: whatever the thread does next waits for it (13 ms added to the
//! first manifest edit after a cold start at 30,000 Services), and the
//! pages stay resident. [`trim`] merges every arena's free chunks and
//! returns their free pages at once.

/// Merges the free chunks of every allocator arena and returns the free
/// pages to the system (glibc's `malloc_trim`). Call after a full sync,
/// once its result has been used; it takes some milliseconds at 30,000
/// Services and nothing is waiting for the run loop then. Elsewhere than
/// with glibc it does nothing.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // The one call into C in verdict. SAFETY: `malloc_trim` takes no
    // pointer and has no precondition; it walks the allocator's own free
    // lists under their locks, and any thread may call it at any time.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
}
