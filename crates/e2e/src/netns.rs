//! Network namespaces owned by a test: created on demand, deleted on drop.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A failed command, with what it printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmdError(pub String);

impl std::fmt::Display for CmdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CmdError {}

/// Runs a command and returns its standard output.
pub fn run(program: &str, args: &[&str]) -> Result<String, CmdError> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| CmdError(format!("{program} {}: {e}", args.join(" "))))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(CmdError(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Whether this process can build namespaces and program nftables.
pub fn can_run() -> Result<(), String> {
    let uid = run("id", &["-u"]).map_err(|e| e.to_string())?;
    if uid.trim() != "0" {
        return Err("needs root (network namespaces and nftables)".into());
    }
    run("ip", &["-V"]).map_err(|e| format!("needs iproute2: {e}"))?;
    run("nft", &["--version"]).map_err(|e| format!("needs nftables: {e}"))?;
    Ok(())
}

/// A prefix no other test of this process (or another process) uses.
pub fn unique_prefix() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "vt{}-{}",
        std::process::id() % 100_000,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A network namespace, deleted (with everything in it) when dropped.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates the namespace and brings its loopback up.
    pub fn create(name: &str) -> Result<Netns, CmdError> {
        run("ip", &["netns", "add", name])?;
        let ns = Netns {
            name: name.to_owned(),
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        // No duplicate address detection: a tentative IPv6 link-local
        // address delays neighbour discovery of the pods' gateway.
        ns.exec(
            "sh",
            &["-c", "echo 0 > /proc/sys/net/ipv6/conf/all/accept_dad; echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad"],
        )?;
        Ok(ns)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n NAME …`.
    pub fn ip(&self, args: &[&str]) -> Result<String, CmdError> {
        let mut a = vec!["-n", self.name.as_str()];
        a.extend_from_slice(args);
        run("ip", &a)
    }

    /// Runs a program inside the namespace.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<String, CmdError> {
        let mut a = vec!["netns", "exec", self.name.as_str(), program];
        a.extend_from_slice(args);
        run("ip", &a)
    }

    /// Sets a sysctl of this namespace (`/proc/sys/…` seen from inside it).
    pub fn sysctl(&self, key: &str, value: &str) -> Result<(), CmdError> {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        self.exec("sh", &["-c", &format!("echo {value} > {path}")])
            .map(|_| ())
    }

    /// Starts a long-running program inside the namespace.
    pub fn spawn(&self, program: &str, args: &[&str]) -> Result<Child, CmdError> {
        Command::new("ip")
            .args(["netns", "exec", self.name.as_str(), program])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| CmdError(format!("spawn {program} in {}: {e}", self.name)))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Processes still inside would keep it alive; the bed kills its own
        // servers first. Deleting removes every interface in it.
        let _ = run("ip", &["netns", "del", &self.name]);
    }
}

/// Connects two namespaces with a veth pair and brings both ends up. The
/// pair is created directly inside the namespaces; nothing appears in the
/// machine's own namespace.
pub fn veth(a: &Netns, a_if: &str, b: &Netns, b_if: &str) -> Result<(), CmdError> {
    run(
        "ip",
        &[
            "link",
            "add",
            a_if,
            "netns",
            a.name(),
            "type",
            "veth",
            "peer",
            "name",
            b_if,
            "netns",
            b.name(),
        ],
    )?;
    a.ip(&["link", "set", a_if, "up"])?;
    b.ip(&["link", "set", b_if, "up"])?;
    Ok(())
}

/// Waits until a server started with [`Netns::spawn`] prints `ready`.
pub fn wait_ready(mut child: Child, what: &str) -> Result<Process, CmdError> {
    use std::io::{BufRead, BufReader, Read};
    let ready = child.stdout.take().map(|out| {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        line
    });
    if ready.as_deref().map(str::trim) == Some("ready") {
        return Ok(Process(child));
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let _ = child.kill();
    let _ = child.wait();
    Err(CmdError(format!("{what} did not start: {}", err.trim())))
}

/// A child process killed when dropped.
#[derive(Debug)]
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
