//! The `process_*` metrics Prometheus' Go client exports for every
//! process, read from `/proc/self` at each scrape: CPU time and start time
//! in clock ticks of 1/100 s (`USER_HZ`), resident memory from `VmRSS`
//! (whatever the page size), and the soft limits for the maxima.

use std::fmt::Write as _;

/// What `/proc/self` says now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Process {
    /// User and system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Virtual memory size, in bytes.
    pub virtual_bytes: f64,
    /// Resident memory, in bytes.
    pub resident_bytes: f64,
    /// Start time, in seconds since the epoch.
    pub start_time: f64,
    /// Open file descriptors.
    pub open_fds: f64,
    /// The soft limit of open files.
    pub max_fds: f64,
    /// The soft limit of the address space.
    pub max_virtual_bytes: f64,
}

/// `USER_HZ`, as procfs assumes it.
const TICKS: f64 = 100.0;

/// The fields of `/proc/self/stat` after the command's name, from the
/// state (field 3) on.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let after = &stat[stat.rfind(')')? + 1..];
    Some(after.split_whitespace().collect())
}

/// The user and system CPU time in a process's or thread's `stat`, in
/// seconds.
pub fn cpu_seconds(stat: &str) -> Option<f64> {
    let f = stat_fields(stat)?;
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    Some((ticks(11)? + ticks(12)?) / TICKS)
}

/// A soft limit of `/proc/self/limits` ("unlimited" is 2^64 - 1).
fn soft_limit(limits: &str, name: &str) -> Option<f64> {
    let line = limits.lines().find(|l| l.starts_with(name))?;
    let soft = line[name.len()..].split_whitespace().next()?;
    Some(if soft == "unlimited" {
        u64::MAX as f64
    } else {
        soft.parse().ok()?
    })
}

impl Process {
    /// Parses the texts of `/proc/self/stat`, `/proc/self/status`,
    /// `/proc/stat` and `/proc/self/limits`, with the count of open
    /// descriptors.
    pub fn parse(
        stat: &str,
        status: &str,
        system_stat: &str,
        limits: &str,
        open_fds: usize,
    ) -> Option<Process> {
        // Field numbers of proc(5), minus 3 (the state is index 0).
        let f = stat_fields(stat)?;
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
        let boot: f64 = system_stat
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        Some(Process {
            cpu_seconds: cpu_seconds(stat)?,
            start_time: boot + num(19)? / TICKS,
            virtual_bytes: num(20)?,
            resident_bytes: status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse::<f64>()
                .ok()?
                * 1024.0,
            open_fds: open_fds as f64,
            max_fds: soft_limit(limits, "Max open files").unwrap_or(0.0),
            max_virtual_bytes: soft_limit(limits, "Max address space").unwrap_or(0.0),
        })
    }

    /// This process, now (`None` if `/proc` cannot be read).
    pub fn now() -> Option<Process> {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        let fds = std::fs::read_dir("/proc/self/fd").ok()?.count();
        Process::parse(
            &read("/proc/self/stat")?,
            &read("/proc/self/status")?,
            &read("/proc/stat")?,
            &read("/proc/self/limits")?,
            fds,
        )
    }

    /// `process_start_time_seconds` as component-base registers it in
    /// every registry, `/metrics/slis`'s too.
    pub fn render_start_time(&self) -> String {
        format!(
            "# HELP process_start_time_seconds [ALPHA] Start time of the process since unix epoch in seconds.\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {}\n",
            self.start_time
        )
    }

    /// The metrics, in the text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, kind, help, v) in [
            (
                "process_cpu_seconds_total",
                "counter",
                "Total user and system CPU time spent in seconds.",
                self.cpu_seconds,
            ),
            (
                "process_max_fds",
                "gauge",
                "Maximum number of open file descriptors.",
                self.max_fds,
            ),
            (
                "process_open_fds",
                "gauge",
                "Number of open file descriptors.",
                self.open_fds,
            ),
            (
                "process_resident_memory_bytes",
                "gauge",
                "Resident memory size in bytes.",
                self.resident_bytes,
            ),
            (
                "process_start_time_seconds",
                "gauge",
                "Start time of the process since unix epoch in seconds.",
                self.start_time,
            ),
            (
                "process_virtual_memory_bytes",
                "gauge",
                "Virtual memory size in bytes.",
                self.virtual_bytes,
            ),
            (
                "process_virtual_memory_max_bytes",
                "gauge",
                "Maximum amount of virtual memory available in bytes.",
                self.max_virtual_bytes,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}",
                crate::metrics::number(v)
            );
        }
        out
    }
}

/// Raises the soft limit of open files to the hard limit, as Go's runtime
/// does for kube-proxy: the admin servers hold a descriptor per client
/// (up to [`crate::http::MAX_CONNECTIONS`] each), and 1,024, a common
/// soft limit, is less than that. Returns the limit now in force.
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(getrlimit(Resource::RLIMIT_NOFILE)?.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (verdict (x)) S 1 4242 4242 0 -1 4194560 2000 0 0 0 150 50 0 0 20 0 8 0 1234 987654321 5000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";

    #[test]
    fn reads_proc_as_the_go_client() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1048576              1048576              files\nMax address space         unlimited            unlimited            bytes\n";
        let status = "Name:\tverdict\nVmRSS:\t   20000 kB\nThreads:\t8\n";
        let p = Process::parse(STAT, status, "cpu 1 2 3\nbtime 1700000000\n", limits, 12).unwrap();
        assert_eq!(p.cpu_seconds, 2.0, "(150 + 50) ticks");
        assert!(
            (p.start_time - 1_700_000_012.34).abs() < 1e-3,
            "{}",
            p.start_time
        );
        assert_eq!(p.virtual_bytes, 987_654_321.0);
        assert_eq!(p.resident_bytes, 20000.0 * 1024.0);
        assert_eq!(p.open_fds, 12.0);
        assert_eq!(p.max_fds, 1_048_576.0);
        assert_eq!(p.max_virtual_bytes, u64::MAX as f64);
        let text = p.render();
        assert!(
            text.contains(
                "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 2\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn this_process_can_be_read() {
        let p = Process::now().unwrap();
        assert!(p.resident_bytes > 0.0 && p.open_fds > 0.0, "{p:?}");
        assert!(p.start_time > 1.6e9, "{p:?}");
    }
}
