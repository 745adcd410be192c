//! The threads that tell the loop about the kernel: the node's address
//! changes (rtnetlink) and other processes' changes to verdict's tables
//! (the nftables announcements).

use super::*;

/// Starts the thread that says when the node's addresses change (`None`
/// if the kernel does not let us listen: then they are read again at each
/// full sync only).
pub(super) fn watch_addresses() -> Option<Receiver<()>> {
    let mut monitor = match verdict_nft::addresses::AddressMonitor::open() {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for address changes; the node's addresses are read again at each full sync (syncPeriod)");
            return None;
        }
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("addr-monitor".into())
        .spawn(move || {
            loop {
                if let Err(e) = monitor.wait() {
                    tracing::error!(error = %e, "the address monitor stopped; the node's addresses are read again at each full sync only");
                    return;
                }
                if tx.send(()).is_err() {
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the address monitor");
        return None;
    }
    Some(rx)
}

/// A commit by another process that touched verdict's tables, or lost
/// announcements.
#[derive(Debug)]
pub(super) enum Foreign {
    Commit {
        pid: u32,
        process: String,
        changes: Vec<verdict_nft::monitor::Change>,
    },
    Overflow,
}

/// The (family, table) names of verdict's tables, as the ruleset
/// monitor names them.
pub(super) fn our_tables(proxiers: &[Proxier]) -> Vec<(&'static str, String)> {
    proxiers
        .iter()
        .map(|p| {
            let fam = match p.config().nft_family() {
                Family::Ip => "ip",
                Family::Ip6 => "ip6",
            };
            (fam, p.config().table.clone())
        })
        .collect()
}

/// Starts the thread that listens to the kernel's ruleset announcements
/// and passes on the commits of other processes that touched verdict's
/// tables. `None` if the kernel does not let us listen (then only the
/// periodic resync repairs).
pub(super) fn watch_foreign_changes(
    ours: Vec<(&'static str, String)>,
) -> Option<Receiver<Foreign>> {
    use verdict_nft::monitor::{Event, Monitor};
    let mut monitor = match Monitor::open() {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for changes other processes make to the ruleset; only the periodic resync (syncPeriod) repairs them");
            return None;
        }
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("nft-monitor".into())
        .spawn(move || {
            loop {
                let event = match monitor.next_event() {
                    Ok(Event::Overflow) => Foreign::Overflow,
                    Ok(Event::Commit {
                        pid,
                        process,
                        changes,
                        ..
                    }) => {
                        if verdict_nft::process::is_ours(pid) {
                            continue;
                        }
                        let changes: Vec<_> = changes
                            .into_iter()
                            .filter(|c| ours.iter().any(|(f, t)| c.family == *f && c.table == *t))
                            .collect();
                        if changes.is_empty() {
                            continue;
                        }
                        Foreign::Commit {
                            pid,
                            process,
                            changes,
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "the ruleset monitor stopped; only the periodic resync repairs foreign changes now");
                        return;
                    }
                };
                if tx.send(event).is_err() {
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the ruleset monitor");
        return None;
    }
    Some(rx)
}
