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
//!
//! [`limit_arenas`] keeps the arenas few: one per CPU verdict may run on,
//! not glibc's eight.

/// Merges the free chunks of every allocator arena and returns the free
/// pages to the system (glibc's `malloc_trim`). Call after a full sync,
/// once its result has been used; it takes some milliseconds at 30,000
/// Services and nothing is waiting for the run loop then. Elsewhere than
/// with glibc it does nothing.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` takes no
    // pointer and has no precondition; it walks the allocator's own free
    // lists under their locks, and any thread may call it at any time.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Caps glibc's allocator arenas at one per CPU this process may run on
/// (glibc's default is eight per CPU), unless the operator set the cap
/// (`MALLOC_ARENA_MAX`, or `arena_max` in `GLIBC_TUNABLES`). Call first
/// thing in `main`, before any other thread allocates: glibc reads the cap
/// when a thread first needs an arena.
///
/// Why: the threads that parse manifests or compute a full sync's elements
/// each take an arena of their own, and the long-lived objects they make
/// (a Service, an element) sit between the short-lived ones (the parser's
/// documents) in pages that stay resident after those are freed. At 30,000
/// Services, 43 MiB of the arenas' 60 MiB was such free space, in pages no
/// trim can return. With one arena per CPU the threads reuse each other's
/// free space: 219 -> 199 MiB peak RSS from manifests and 239 -> 202-216
/// MiB from the API server, with the cold start as fast
/// (`docs/bench/memory.md`). Returns the cap set, if any.
pub fn limit_arenas() -> Option<usize> {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let tunables = std::env::var("GLIBC_TUNABLES").ok();
    let cap = arena_cap(
        std::env::var_os("MALLOC_ARENA_MAX").is_some(),
        tunables.as_deref(),
        cpus,
    )?;
    set_arena_max(cap)
}

/// The arena cap to set: none where the operator chose one.
fn arena_cap(malloc_arena_max: bool, tunables: Option<&str>, cpus: usize) -> Option<usize> {
    let in_tunables = tunables.is_some_and(|t| {
        t.split(':')
            .any(|kv| kv.split('=').next() == Some("glibc.malloc.arena_max"))
    });
    (!malloc_arena_max && !in_tunables).then_some(cpus.max(1))
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_arena_max(n: usize) -> Option<usize> {
    let value = libc::c_int::try_from(n).ok()?;
    // SAFETY: `mallopt` takes two integers and no pointer; M_ARENA_MAX only
    // sets the limit glibc reads when a thread next needs an arena, and
    // changes no arena that exists.
    #[allow(unsafe_code)]
    let ok = unsafe { libc::mallopt(libc::M_ARENA_MAX, value) };
    (ok == 1).then_some(n)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_arena_max(_: usize) -> Option<usize> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arena_cap_is_one_per_cpu_unless_the_operator_set_one() {
        assert_eq!(arena_cap(false, None, 2), Some(2));
        assert_eq!(arena_cap(false, None, 0), Some(1));
        assert_eq!(
            arena_cap(false, Some("glibc.malloc.trim_threshold=1"), 4),
            Some(4)
        );
        assert_eq!(arena_cap(true, None, 4), None);
        assert_eq!(
            arena_cap(
                false,
                Some("glibc.malloc.mmap_max=0:glibc.malloc.arena_max=8"),
                4
            ),
            None
        );
    }
}
