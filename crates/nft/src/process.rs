//! Running the kernel tools (`nft`, `conntrack`, `iptables-*`): one process,
//! optional standard input, output captured.
//!
//! The pids of recent children are remembered, so that a commit the
//! [`monitor`](crate::monitor) sees can be told apart from another
//! process's: the kernel names the committing process by pid.

use std::collections::VecDeque;
use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;

/// How many recent children are remembered: enough for every process a
/// sync runs before the monitor thread reads their commits.
const REMEMBERED: usize = 256;

static SPAWNED: Mutex<VecDeque<u32>> = Mutex::new(VecDeque::new());

/// Runs `program` with `args`, writing `stdin` to it if given, and waits.
pub fn run(program: &str, args: &[&str], stdin: Option<&str>) -> std::io::Result<Output> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Recorded before the child reads its input, so before it can commit.
    if let Ok(mut s) = SPAWNED.lock() {
        if s.len() == REMEMBERED {
            s.pop_front();
        }
        s.push_back(child.id());
    }
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())?;
    }
    child.wait_with_output()
}

/// How a kernel tool is run: [`System`] runs it; tests put a fake in its
/// place (as knftables fakes its exec), so that what a backend sends and
/// how it reads the answer are tested without the program.
pub trait Runner: Send + Sync + std::fmt::Debug {
    /// Runs `program` with `args`, writing `stdin` to it if given.
    fn run(&self, program: &str, args: &[&str], stdin: Option<&str>) -> std::io::Result<Output>;
}

/// Runs programs for real ([`run`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct System;

impl Runner for System {
    fn run(&self, program: &str, args: &[&str], stdin: Option<&str>) -> std::io::Result<Output> {
        run(program, args, stdin)
    }
}

/// Whether `pid` is this process, one of its threads (the kernel names a
/// netlink commit by the committing thread's id), or one of its recent
/// children.
pub fn is_ours(pid: u32) -> bool {
    pid == std::process::id()
        || SPAWNED.lock().is_ok_and(|s| s.contains(&pid))
        || std::path::Path::new(&format!("/proc/self/task/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_are_remembered() {
        let out = run("sh", &["-c", "echo $$"], None).unwrap();
        let pid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert!(is_ours(pid));
        assert!(is_ours(std::process::id()));
        assert!(!is_ours(u32::MAX));
        // A thread's id, as the kernel reports a commit from a thread.
        let running = std::thread::spawn(|| {
            let tid = std::fs::read_link("/proc/thread-self")
                .ok()
                .and_then(|p| p.file_name()?.to_str()?.parse::<u32>().ok())
                .unwrap();
            (tid, is_ours(tid))
        })
        .join()
        .unwrap();
        assert_ne!(running.0, std::process::id());
        assert!(running.1, "thread {} is ours", running.0);
    }
}
