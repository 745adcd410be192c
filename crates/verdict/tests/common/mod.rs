//! Helpers shared by the namespace tests of the `verdict` binary.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use verdict_e2e::apiserver::ApiServerProcess;
use verdict_e2e::bed::TestBed;
use verdict_e2e::netns::{Process, can_run};

/// An address literal.
pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Who answers the pod's connection to the service ("" if nobody).
pub fn who(bed: &TestBed) -> String {
    who_at(bed, "172.30.0.41")
}

/// Who answers the pod's connection to `service`:80 ("" if nobody).
pub fn who_at(bed: &TestBed, service: &str) -> String {
    let line = bed
        .connect(ip("10.0.0.2"), ip(service), "tcp", 80, 500)
        .unwrap_or_default();
    line.split_whitespace().nth(1).unwrap_or("").to_string()
}

/// Polls until the pod reaches `want` (or 10 s pass); returns the last answer.
pub fn wait_for(bed: &TestBed, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = who(bed);
        if got == want || Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An HTTP GET to verdict's health port, from inside the node.
pub fn http(bed: &TestBed, path: &str) -> String {
    http_on(bed, 10256, path)
}

/// The value of one sample of `/metrics` (`None` if it is not there).
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// An HTTP GET to `port` on the node's loopback.
pub fn http_on(bed: &TestBed, port: u16, path: &str) -> String {
    http_at(bed, "127.0.0.1", port, path)
}

/// An HTTP GET to `host:port`, from the node: the answer, its body
/// decoded if chunked (`/metrics` is streamed).
pub fn http_at(bed: &TestBed, host: &str, port: u16, path: &str) -> String {
    let script = format!(
        "exec 3<>/dev/tcp/{host}/{port} && printf 'GET {path} HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n' >&3 && cat <&3"
    );
    let raw = bed
        .node
        .exec("bash", &["-c", &script])
        .unwrap_or_else(|e| e.to_string());
    verdict_e2e::http::unchunked(&raw)
}

/// The fake API server, inside the node's namespace on its loopback at
/// `port` (bookmarks every 500 ms).
pub fn fake_api_server(bed: &TestBed, port: u16) -> ApiServerProcess {
    ApiServerProcess::spawn(
        &bed.node,
        &e2e_bin("verdict-e2e-apiserver"),
        &format!("127.0.0.1:{port}"),
        Duration::from_millis(500),
    )
    .unwrap()
}

/// A kubeconfig for the fake API server at `port`, written into `dir`;
/// its path.
pub fn fake_kubeconfig(dir: &std::path::Path, port: u16) -> String {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        verdict_e2e::apiserver::kubeconfig(&format!("http://127.0.0.1:{port}")),
    )
    .unwrap();
    path.to_string_lossy().into_owned()
}

/// A fresh test bed, or `None` (with the reason printed) where namespace
/// tests cannot run.
pub fn bed() -> Option<TestBed> {
    if let Err(why) = can_run() {
        println!("skipped: {why}");
        return None;
    }
    Some(TestBed::new(PathBuf::from(verdict_e2e_echo())).unwrap())
}

/// Writes a manifest as editors and kubectl do, write then rename:
/// readers never see half a file.
pub fn write(dir: &std::path::Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

/// An empty directory for one test's manifests. Those of earlier runs of
/// the same test whose process is gone (a test that failed before its
/// cleanup, or one that leaves its directory to its last look) are removed
/// first, so that runs do not pile them up.
pub fn scratch_dir(tag: &str) -> PathBuf {
    let prefix = format!("verdict-{tag}-e2e-");
    for entry in std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let dir = std::env::temp_dir().join(format!("verdict-{tag}-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The echo tool of the test bed, built by the e2e crate.
pub fn verdict_e2e_echo() -> String {
    e2e_bin("verdict-e2e-echo")
}

/// A program of the e2e crate (`cargo test --workspace` builds them).
pub fn e2e_bin(name: &str) -> String {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace (cargo test --workspace)",
        path.display()
    );
    path.to_string_lossy().into_owned()
}

/// `verdict ARGS` inside the node's namespace, its log written to `log`
/// (so that a long log never blocks it), with `path` as its PATH if given.
pub fn spawn_verdict<I, S>(
    bed: &TestBed,
    args: I,
    log: &std::path::Path,
    path: Option<&str>,
) -> Process
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    spawn_verdict_in(&bed.node, args, log, path)
}

/// [`spawn_verdict`] in another namespace of the bed (the second node).
pub fn spawn_verdict_in<I, S>(
    ns: &verdict_e2e::netns::Netns,
    args: I,
    log: &std::path::Path,
    path: Option<&str>,
) -> Process
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = std::process::Command::new("ip");
    cmd.args(["netns", "exec", ns.name(), env!("CARGO_BIN_EXE_verdict")])
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    if let Some(p) = path {
        cmd.env("PATH", p);
    }
    Process(cmd.spawn().unwrap())
}

/// Chromium, if installed (CI installs it and sets VERDICT_REQUIRE_CHROMIUM).
pub fn chromium() -> Option<String> {
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| {
            std::process::Command::new("sh")
                .args(["-c", &format!("command -v {b}")])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(str::to_owned);
    if found.is_none() {
        assert!(
            std::env::var_os("VERDICT_REQUIRE_CHROMIUM").is_none(),
            "chromium is required here (VERDICT_REQUIRE_CHROMIUM) but not installed"
        );
        println!("skipped: no chromium");
    }
    found
}

/// Loads `url` in headless Chromium inside the node and returns the DOM
/// once the page's script has run; with `shot`, also saves a screenshot.
pub fn browse(bed: &TestBed, browser: &str, url: &str, shot: Option<&std::path::Path>) -> String {
    browse_with(bed, browser, url, shot, Duration::from_secs(6))
}

/// As [`browse`], the page left open for `budget` of its own time (its
/// timers run, its requests are answered) before its DOM is taken.
#[allow(dead_code)]
pub fn browse_for(bed: &TestBed, browser: &str, url: &str, budget: Duration) -> String {
    browse_with(bed, browser, url, None, budget)
}

fn browse_with(
    bed: &TestBed,
    browser: &str,
    url: &str,
    shot: Option<&std::path::Path>,
    budget: Duration,
) -> String {
    let profile = scratch_dir("chromium-profile");
    let profile_flag = format!("--user-data-dir={}", profile.display());
    let mut args = vec![
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--window-size=1280,900",
    ];
    let budget_flag = format!("--virtual-time-budget={}", budget.as_millis());
    args.push(&budget_flag);
    args.push(profile_flag.as_str());
    let shot_flag = shot.map(|p| format!("--screenshot={}", p.display()));
    if let Some(s) = &shot_flag {
        args.push(s);
    } else {
        args.push("--dump-dom");
    }
    args.push(url);
    bed.node
        .exec(browser, &args)
        .unwrap_or_else(|e| panic!("chromium {url}: {e}"))
}

/// The test node's flags on the manifests in `dir`, for the daemon and
/// for the offline commands.
pub fn node_flags(dir: &str) -> Vec<String> {
    [
        "--manifests",
        dir,
        "--hostname-override",
        "test-node",
        "--bind-address",
        "192.168.0.2",
        "--cluster-cidr",
        "10.0.0.0/8",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// `GET path` on `host:port` from `ns`, with a bearer token if given: the
/// status code and the body.
pub fn get_from(
    ns: &verdict_e2e::netns::Netns,
    host: &str,
    port: u16,
    path: &str,
    token: Option<&str>,
) -> (u16, String) {
    let auth = token.map_or(String::new(), |t| {
        format!("Authorization: Bearer {t}\\r\\n")
    });
    let script = format!(
        "exec 3<>/dev/tcp/{host}/{port} && printf 'GET {path} HTTP/1.1\\r\\nHost: x\\r\\n{auth}Connection: close\\r\\n\\r\\n' >&3 && cat <&3"
    );
    let out = ns
        .exec("bash", &["-c", &script])
        .unwrap_or_else(|e| e.to_string());
    let out = verdict_e2e::http::unchunked(&out);
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (code, body)
}

/// Runs promtool, where it is installed (CI installs it, and sets
/// `VERDICT_REQUIRE_PROMTOOL=1` so that its absence fails). Returns its
/// output, or `None` when it is not installed.
pub fn promtool(args: &[&str], dir: &std::path::Path) -> Option<String> {
    let out = match std::process::Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            assert!(
                std::env::var_os("VERDICT_REQUIRE_PROMTOOL").is_none(),
                "promtool: {e}"
            );
            println!("promtool is not installed: skipped");
            return None;
        }
    };
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{said}");
    Some(said)
}
