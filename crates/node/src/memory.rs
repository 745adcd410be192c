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
//! [`tune_allocator`] keeps the arenas few (one per CPU verdict may run
//! on, not glibc's eight) and maps large buffers of their own.

/// Merges the free chunks of every allocator arena and returns the free
/// pages to the system (glibc's `malloc_trim`). Call after a full sync,
/// once its result has been used; it takes some milliseconds at 30,000
/// Services and nothing is waiting for the run loop then. Elsewhere than
/// with glibc it does nothing.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` takes no pointer and has no precondition; it
    // walks the allocator's own free lists under their locks, and any
    // thread may call it at any time.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// How [`tune_allocator`] set glibc's allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tuning {
    /// The arena cap set (none where the operator chose one).
    pub arenas: Option<usize>,
    /// The fixed mmap threshold set, in bytes (likewise).
    pub mmap_threshold: Option<usize>,
}

/// Allocations this large or larger get pages of their own, returned when
/// they are freed.
pub const MMAP_THRESHOLD: usize = 1 << 20;

/// Sets glibc's allocator for a daemon that keeps a large heap of small,
/// long-lived objects and makes large buffers now and then; call first
/// thing in `main`, before any other thread allocates (glibc reads the
/// arena cap when a thread first needs an arena). A setting the operator
/// made (`MALLOC_ARENA_MAX`, `MALLOC_MMAP_THRESHOLD_`, or the same in
/// `GLIBC_TUNABLES`) is left alone.
///
/// - **One arena per CPU** this process may run on, not glibc's eight.
///   The threads that parse manifests each took an arena of their own,
///   and the long-lived objects they make (names, a Service's record) sat
///   between the parser's freed documents in pages no trim can return: at
///   30,000 Services, 43 of the arenas' 60 MiB. With one arena per CPU the
///   threads reuse each other's free space.
/// - **A fixed mmap threshold of 1 MiB.** glibc raises its threshold to
///   the size of each mapped buffer freed, up to 32 MiB, so after the
///   first large buffer (a manifest file's text, a transaction, a netlink
///   batch) the next ones come from the heap, and the holes they leave
///   between long-lived objects stay resident.
///
/// Peak RSS at 30,000 Services: 219 -> 198 MiB from manifests and 239 ->
/// 202-216 MiB from the API server with the arena cap; then, with the
/// threshold, 175 -> 167 MiB and 187-188 -> 174-179 MiB. The cold start
/// is as fast (`docs/bench/memory.md`).
pub fn tune_allocator() -> Tuning {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let tunables = std::env::var("GLIBC_TUNABLES").ok();
    let want = tuning(
        std::env::var_os("MALLOC_ARENA_MAX").is_some(),
        std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some(),
        tunables.as_deref(),
        cpus,
    );
    Tuning {
        arenas: want.arenas.and_then(set_arena_max),
        mmap_threshold: want.mmap_threshold.and_then(set_mmap_threshold),
    }
}

/// What to set, given whether the operator set `MALLOC_ARENA_MAX` and
/// `MALLOC_MMAP_THRESHOLD_`, `GLIBC_TUNABLES`, and the CPUs.
fn tuning(arena_env: bool, mmap_env: bool, tunables: Option<&str>, cpus: usize) -> Tuning {
    let tuned = |name: &str| {
        tunables.is_some_and(|t| t.split(':').any(|kv| kv.split('=').next() == Some(name)))
    };
    let arenas = arena_env || tuned("glibc.malloc.arena_max");
    let mmap = mmap_env || tuned("glibc.malloc.mmap_threshold");
    Tuning {
        arenas: (!arenas).then_some(cpus.max(1)),
        mmap_threshold: (!mmap).then_some(MMAP_THRESHOLD),
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn mallopt(param: libc::c_int, n: usize) -> Option<usize> {
    let value = libc::c_int::try_from(n).ok()?;
    // SAFETY: `mallopt` takes two integers and no pointer. M_ARENA_MAX
    // sets the limit glibc reads when a thread next needs an arena, and
    // M_MMAP_THRESHOLD the size from which later requests are mapped;
    // neither changes memory already handed out.
    #[allow(unsafe_code)]
    let ok = unsafe { libc::mallopt(param, value) };
    (ok == 1).then_some(n)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_arena_max(n: usize) -> Option<usize> {
    mallopt(libc::M_ARENA_MAX, n)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_mmap_threshold(n: usize) -> Option<usize> {
    mallopt(libc::M_MMAP_THRESHOLD, n)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_arena_max(_: usize) -> Option<usize> {
    None
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_mmap_threshold(_: usize) -> Option<usize> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_setting_is_made_unless_the_operator_made_it() {
        let both = Tuning {
            arenas: Some(2),
            mmap_threshold: Some(MMAP_THRESHOLD),
        };
        assert_eq!(tuning(false, false, None, 2), both);
        assert_eq!(tuning(false, false, None, 0).arenas, Some(1));
        let other = Some("glibc.malloc.trim_threshold=1");
        assert_eq!(tuning(false, false, other, 2), both);
        // MALLOC_ARENA_MAX, MALLOC_MMAP_THRESHOLD_.
        let t = tuning(true, false, None, 4);
        assert_eq!((t.arenas, t.mmap_threshold), (None, Some(MMAP_THRESHOLD)));
        let t = tuning(false, true, None, 4);
        assert_eq!((t.arenas, t.mmap_threshold), (Some(4), None));
        // The same in GLIBC_TUNABLES, among others.
        let arenas = Some("glibc.malloc.mmap_max=0:glibc.malloc.arena_max=8");
        let t = tuning(false, false, arenas, 4);
        assert_eq!((t.arenas, t.mmap_threshold), (None, Some(MMAP_THRESHOLD)));
        let mmap = Some("glibc.malloc.mmap_threshold=65536");
        let t = tuning(false, false, mmap, 4);
        assert_eq!((t.arenas, t.mmap_threshold), (Some(4), None));
    }
}
