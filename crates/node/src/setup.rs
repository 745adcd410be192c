//! The privileged settings kube-proxy applies at start (its
//! `platformSetup`): conntrack sysctls and the process's OOM score. With
//! `--init-only` they are all verdict does.

use std::io::ErrorKind;
use std::path::Path;

use crate::error::NodeError;
use crate::settings::ConntrackSettings as Conntrack;

const NETFILTER: &str = "/proc/sys/net/netfilter";
const HASHSIZE: &str = "/sys/module/nf_conntrack/parameters/hashsize";

/// What one conntrack setting asks for: `(sysctl, value)`.
pub fn conntrack_sysctls(c: &Conntrack, cpus: u32) -> Vec<(&'static str, u64)> {
    let mut out = Vec::new();
    let max = conntrack_max(c, cpus);
    if max > 0 {
        out.push(("nf_conntrack_max", max));
    }
    for (name, d) in [
        (
            "nf_conntrack_tcp_timeout_established",
            c.tcp_established_timeout,
        ),
        (
            "nf_conntrack_tcp_timeout_close_wait",
            c.tcp_close_wait_timeout,
        ),
        ("nf_conntrack_udp_timeout", c.udp_timeout),
        ("nf_conntrack_udp_timeout_stream", c.udp_stream_timeout),
    ] {
        if !d.is_zero() {
            out.push((name, d.as_secs()));
        }
    }
    if c.tcp_be_liberal {
        out.push(("nf_conntrack_tcp_be_liberal", 1));
    }
    out
}

/// kube-proxy's `nf_conntrack_max`: max(maxPerCore × CPUs, min), or 0
/// (leave alone) when maxPerCore is 0.
pub fn conntrack_max(c: &Conntrack, cpus: u32) -> u64 {
    if c.max_per_core == 0 {
        return 0;
    }
    (u64::from(c.max_per_core) * u64::from(cpus)).max(u64::from(c.min))
}

/// The CPUs this process may run on, as Go's `runtime.NumCPU` (which
/// kube-proxy uses) counts them: the affinity mask, not a cgroup CPU quota,
/// so that a CPU limit on the DaemonSet does not shrink the node's
/// conntrack table.
fn cpu_count() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .and_then(|list| count_cpu_list(list.trim()))
        })
        .filter(|n| *n > 0)
        .unwrap_or(1)
}

/// Counts a kernel CPU list such as `0-3,8,10-11`.
fn count_cpu_list(list: &str) -> Option<u32> {
    let mut n = 0u32;
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<u32>().ok()?, hi.parse::<u32>().ok()?),
            None => {
                let one = part.parse::<u32>().ok()?;
                (one, one)
            }
        };
        n = n.checked_add(hi.checked_sub(lo)?.checked_add(1)?)?;
    }
    Some(n)
}

fn read_number(path: &Path) -> std::io::Result<u64> {
    let text = std::fs::read_to_string(path)?;
    text.trim()
        .parse()
        .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, format!("{e}")))
}

/// Sets the conntrack sysctls of this network namespace. A value already in
/// place is not written. `nf_conntrack_max` and the hash size can only be
/// changed from the host's network namespace; elsewhere that is a warning,
/// as kube-proxy's read-only sysfs case. Any other failure is an error.
pub fn apply_conntrack(c: &Conntrack) -> Result<(), NodeError> {
    let cpus = cpu_count();
    for (name, value) in conntrack_sysctls(c, cpus) {
        let path = Path::new(NETFILTER).join(name);
        let current = read_number(&path).map_err(|e| {
            NodeError::Startup(format!(
                "conntrack settings: reading {} (is the nf_conntrack module loaded?): {e}",
                path.display()
            ))
        })?;
        if current == value {
            continue;
        }
        tracing::info!(
            sysctl = name,
            from = current,
            to = value,
            "setting conntrack sysctl"
        );
        match std::fs::write(&path, value.to_string()) {
            Ok(()) => {}
            Err(e)
                if name == "nf_conntrack_max"
                    && matches!(
                        e.kind(),
                        ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem
                    ) =>
            {
                tracing::warn!(
                    sysctl = name,
                    wanted = value,
                    current,
                    error = %e,
                    "cannot set nf_conntrack_max here (only the host network namespace can); problems may arise later"
                );
                continue;
            }
            Err(e) => {
                return Err(NodeError::Startup(format!(
                    "conntrack settings: setting {} to {value}: {e}",
                    path.display()
                )));
            }
        }
        if name == "nf_conntrack_max" {
            raise_hashsize(value);
        }
    }
    Ok(())
}

/// kube-proxy also grows the conntrack hash table to a quarter of the new
/// maximum; the kernel allows that only from the host network namespace.
fn raise_hashsize(max: u64) {
    let want = max / 4;
    match read_number(Path::new(HASHSIZE)) {
        Ok(size) if size >= want => {}
        Ok(size) => {
            if let Err(e) = std::fs::write(HASHSIZE, want.to_string()) {
                tracing::warn!(from = size, to = want, error = %e, "cannot grow the conntrack hash table");
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read the conntrack hash size"),
    }
}

/// Sets this process's OOM score, as kube-proxy (failure is logged only).
pub fn apply_oom_score_adj(adj: Option<i32>) {
    let Some(adj) = adj else {
        return;
    };
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", adj.to_string()) {
        tracing::warn!(oom_score_adj = adj, error = %e, "cannot set the OOM score");
    }
}

/// Everything of the platform setup.
pub fn apply(conntrack: &Conntrack, oom_score_adj: Option<i32>) -> Result<(), NodeError> {
    apply_conntrack(conntrack)?;
    apply_oom_score_adj(oom_score_adj);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn cpu_lists_count_like_the_kernel_writes_them() {
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpu_list("0-63"), Some(64));
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("x"), None);
        assert!(cpu_count() >= 1);
    }

    #[test]
    fn max_is_per_core_with_a_floor_and_zero_leaves_it_alone() {
        let c = Conntrack::default();
        assert_eq!(conntrack_max(&c, 2), 131072, "the floor wins on 2 CPUs");
        assert_eq!(conntrack_max(&c, 8), 262144);
        let off = Conntrack {
            max_per_core: 0,
            ..c
        };
        assert_eq!(conntrack_max(&off, 8), 0);
    }

    #[test]
    fn defaults_set_the_tcp_timeouts_only() {
        let got = conntrack_sysctls(&Conntrack::default(), 2);
        assert_eq!(
            got,
            [
                ("nf_conntrack_max", 131072),
                ("nf_conntrack_tcp_timeout_established", 86400),
                ("nf_conntrack_tcp_timeout_close_wait", 3600),
            ]
        );
        let c = Conntrack {
            max_per_core: 0,
            tcp_established_timeout: Duration::ZERO,
            tcp_close_wait_timeout: Duration::ZERO,
            tcp_be_liberal: true,
            udp_timeout: Duration::from_secs(45),
            udp_stream_timeout: Duration::from_secs(90),
            ..Conntrack::default()
        };
        assert_eq!(
            conntrack_sysctls(&c, 2),
            [
                ("nf_conntrack_udp_timeout", 45),
                ("nf_conntrack_udp_timeout_stream", 90),
                ("nf_conntrack_tcp_be_liberal", 1),
            ]
        );
    }
}
