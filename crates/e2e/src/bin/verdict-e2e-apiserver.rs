//! Runs the fake Kubernetes API server (`verdict_e2e::apiserver`), e.g.
//! inside a test namespace: `verdict-e2e-apiserver --listen 127.0.0.1:6443
//! [--bookmark-ms 1000]`. Prints `listening ADDR`, then takes one JSON
//! command per line on stdin and answers each with one line on stdout
//! (see `FakeApiServer::command`); exits when stdin closes.

use std::io::{BufRead, Write};
use std::time::Duration;

use verdict_e2e::apiserver::FakeApiServer;

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let listen = value("--listen").unwrap_or_else(|| "127.0.0.1:0".into());
    let bookmark_ms = value("--bookmark-ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let addr = match listen.parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("verdict-e2e-apiserver: --listen {listen}: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let server = match FakeApiServer::start(addr, Duration::from_millis(bookmark_ms)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("verdict-e2e-apiserver: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout();
    if writeln!(out, "listening {}", server.addr())
        .and_then(|()| out.flush())
        .is_err()
    {
        return std::process::ExitCode::FAILURE;
    }
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let answer = server.command(&line);
        if writeln!(out, "{answer}")
            .and_then(|()| out.flush())
            .is_err()
        {
            break;
        }
    }
    std::process::ExitCode::SUCCESS
}
