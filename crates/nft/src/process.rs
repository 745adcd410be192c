//! Running the kernel tools (`nft`, `conntrack`, `iptables-*`): one process,
//! optional standard input, output captured.

use std::io::Write;
use std::process::{Command, Output, Stdio};

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
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())?;
    }
    child.wait_with_output()
}
