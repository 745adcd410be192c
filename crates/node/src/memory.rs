//! The allocator: mimalloc, set to hand freed pages back at once.
//!
//! verdict keeps millions of small, long-lived objects (at 30,000
//! Services about two million, 75 bytes on average) and makes large,
//! short-lived ones now and then: a parse of a manifest file, a full
//! sync's transaction, a read of the whole table. With glibc's allocator
//! each small object paid a header and was rounded up (about 20 MiB at
//! 30,000 Services), and the threads that parse or compute left their
//! long-lived objects between freed ones in pages no trim returns (about
//! 17 MB). mimalloc keeps objects of one size class together in pages of
//! their own, with no header; with its purge delay at 0 a page freed
//! whole goes back to the system at once, not a second later, and with
//! arenas committed as they are used (not up front) what was never used
//! is never resident. Measured at 30,000 Services (`docs/bench/memory.md`):
//! peak RSS 160 -> 147 MiB from manifests and 177 -> 150 MiB from the API
//! server, and the cold start as fast or faster.
//!
//! The binary installs [`Allocator`] as its global allocator and calls
//! [`tune_allocator`] when the process loads.

/// The global allocator the `verdict` binary installs.
pub use mimalloc::MiMalloc as Allocator;

/// mimalloc's option numbers (`mi_option_e` in `mimalloc.h` of the
/// version `libmimalloc-sys` builds, v3), which the Rust bindings do not
/// name. A test reads each back from the environment to prove the number.
mod option {
    /// `mi_option_arena_eager_commit`.
    pub const ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
    /// `mi_option_purge_delay`, in milliseconds.
    pub const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
}

/// The purge delay set: freed pages are returned at once.
pub const PURGE_DELAY_MS: libc::c_long = 0;

/// Arenas committed as they are used, not when reserved.
const ARENA_EAGER_COMMIT: libc::c_long = 0;

/// The settings [`tune_allocator`] made, each `None` where the operator
/// made it (`MIMALLOC_PURGE_DELAY`, `MIMALLOC_ARENA_EAGER_COMMIT`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tuning {
    /// The purge delay set, in milliseconds.
    pub purge_delay_ms: Option<libc::c_long>,
    /// Whether arenas are committed up front (0: as they are used).
    pub arena_eager_commit: Option<libc::c_long>,
}

/// Sets mimalloc for a daemon that keeps a large heap of small objects
/// and makes large buffers now and then: freed pages go back to the
/// system at once, and arenas are committed as they are used. mimalloc
/// reserves its first arena at the first allocation, before `main`, so
/// the binary calls this from an `.init_array` entry, before the Rust
/// runtime allocates; it allocates nothing itself. A setting the operator
/// made in the environment (`MIMALLOC_PURGE_DELAY`,
/// `MIMALLOC_ARENA_EAGER_COMMIT`) wins, whether mimalloc reads it before
/// or after this call.
pub extern "C" fn tune_allocator() {
    for (option, value) in [
        (option::PURGE_DELAY, PURGE_DELAY_MS),
        (option::ARENA_EAGER_COMMIT, ARENA_EAGER_COMMIT),
    ] {
        // SAFETY: `mi_option_set_default` takes two integers and no
        // pointer, and only stores the value in mimalloc's static table of
        // options, unless the environment has already set the option;
        // mimalloc reads it when it next reserves an arena or purges. It
        // may be called before mimalloc has initialised.
        #[allow(unsafe_code)]
        unsafe {
            libmimalloc_sys::mi_option_set_default(option, value);
        }
    }
}

/// What [`tune_allocator`] set: each setting is `None` where the operator
/// made it in the environment.
pub fn tuning() -> Tuning {
    let ours = |env: &str, value: libc::c_long| std::env::var_os(env).is_none().then_some(value);
    Tuning {
        purge_delay_ms: ours("MIMALLOC_PURGE_DELAY", PURGE_DELAY_MS),
        arena_eager_commit: ours("MIMALLOC_ARENA_EAGER_COMMIT", ARENA_EAGER_COMMIT),
    }
}

/// Returns the calling thread's freed pages to the system, and those of
/// threads that ended (mimalloc's `mi_collect(true)`). Call after a full
/// sync or a whole-table read, once its result has been used.
pub fn trim() {
    // SAFETY: `mi_collect` takes a boolean and no pointer; it walks the
    // calling thread's own heap and the abandoned pages under their
    // locks, and any thread may call it at any time.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
}

/// mimalloc's current value of `option`.
#[cfg(test)]
fn option_value(option: libmimalloc_sys::mi_option_t) -> libc::c_long {
    // SAFETY: `mi_option_get` takes an integer and returns one.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_get(option)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run as a child with the environment under test: prints the two
    /// options as mimalloc read them at load, then as tuned.
    #[test]
    fn child_prints_options() {
        if std::env::var_os("VERDICT_TEST_MIMALLOC_CHILD").is_none() {
            return;
        }
        let before = (
            option_value(option::PURGE_DELAY),
            option_value(option::ARENA_EAGER_COMMIT),
        );
        tune_allocator();
        let t = tuning();
        let after = (
            option_value(option::PURGE_DELAY),
            option_value(option::ARENA_EAGER_COMMIT),
        );
        println!("OPTIONS {before:?} {after:?} {t:?}");
    }

    fn child(env: &[(&str, &str)]) -> String {
        let exe = std::env::current_exe().expect("test binary");
        let mut cmd = std::process::Command::new(exe);
        cmd.args([
            "--exact",
            "memory::tests::child_prints_options",
            "--nocapture",
        ])
        .env("VERDICT_TEST_MIMALLOC_CHILD", "1")
        .env_remove("MIMALLOC_PURGE_DELAY")
        .env_remove("MIMALLOC_ARENA_EAGER_COMMIT");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run the test binary");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find_map(|l| l.strip_prefix("OPTIONS ").map(str::to_owned))
            .unwrap_or_else(|| panic!("no OPTIONS line in {text}"))
    }

    #[test]
    fn the_option_numbers_are_the_ones_mimalloc_reads_from_the_environment() {
        // The numbers name the options the environment variables set.
        let line = child(&[
            ("MIMALLOC_PURGE_DELAY", "1234"),
            ("MIMALLOC_ARENA_EAGER_COMMIT", "7"),
        ]);
        assert!(line.starts_with("(1234, 7) (1234, 7) "), "{line}");
        // The operator's settings are left alone.
        assert!(
            line.ends_with("Tuning { purge_delay_ms: None, arena_eager_commit: None }"),
            "{line}"
        );
    }

    #[test]
    fn each_setting_is_made_unless_the_operator_made_it() {
        // mimalloc's defaults (1 s, commit up front on Linux) become ours.
        let line = child(&[]);
        assert!(line.starts_with("(1000, 2) (0, 0) "), "{line}");
        assert!(
            line.ends_with("Tuning { purge_delay_ms: Some(0), arena_eager_commit: Some(0) }"),
            "{line}"
        );
        let line = child(&[("MIMALLOC_PURGE_DELAY", "10")]);
        assert!(line.starts_with("(10, 2) (10, 0) "), "{line}");
        assert!(
            line.ends_with("Tuning { purge_delay_ms: None, arena_eager_commit: Some(0) }"),
            "{line}"
        );
    }
}
