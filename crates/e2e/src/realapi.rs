//! The real Kubernetes API server, and the real kube-proxy, inside a test's
//! network namespace: the judges of every protocol question our fake API
//! server (`apiserver.rs`) can only agree with.
//!
//! - [`RealApiServer`]: an etcd (Debian's `etcd-server`, 3.4.23, which has
//!   no RequestWatchProgress, so streaming lists fail; or the unmodified
//!   etcd 3.6 of `../shared/bin`, where they work) and the unmodified
//!   kube-apiserver 1.36 of `../shared/bin`, both on the namespace's
//!   loopback, with real authentication (a static token file), real
//!   authorization (`Node,RBAC`, so Kubernetes' bootstrap roles and
//!   bindings exist), TokenReviews and SubjectAccessReviews answered for
//!   real, and an audit log of every request with its query.
//! - [`KubeClient`]: an HTTPS client of it for the test itself, on a
//!   thread that has entered the namespace (its sockets live there).
//! - [`binaries`]: `../shared/bin` unpacked into `target/shared-bin`, once.
//!
//! Nothing is started outside the namespace given; everything stops when
//! its guard is dropped.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::netns::{Netns, Process};

/// Which etcd the API server stores in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Etcd {
    /// Debian's `etcd-server` package: etcd 3.4.23, without
    /// RequestWatchProgress (an API server 1.36 on it fails every
    /// streaming list after answering 200).
    V34,
    /// The etcd 3.6 of `../shared/bin`: streaming lists work.
    V36,
}

impl Etcd {
    /// Both, for tests that must pass on each.
    pub const BOTH: [Etcd; 2] = [Etcd::V34, Etcd::V36];

    /// `3.4` or `3.6`.
    pub fn version(self) -> &'static str {
        match self {
            Etcd::V34 => "3.4",
            Etcd::V36 => "3.6",
        }
    }
}

/// The workspace's root (this crate is `crates/e2e`).
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(Path::parent)
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

static UNPACKED: Mutex<Option<Result<PathBuf, String>>> = Mutex::new(None);

/// The directory holding `kube-apiserver`, `kube-proxy` and `etcd36`,
/// unpacked from `../shared/bin` (or `$VERDICT_SHARED_BIN`) into
/// `target/shared-bin` the first time it is asked for. `Err` says why
/// they are not there.
pub fn binaries() -> Result<PathBuf, String> {
    let mut done = UNPACKED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(r) = &*done {
        return r.clone();
    }
    let r = unpack();
    *done = Some(r.clone());
    r
}

fn unpack() -> Result<PathBuf, String> {
    let shared = std::env::var_os("VERDICT_SHARED_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("../shared/bin"));
    let script = shared.join("unpack");
    if !script.exists() {
        return Err(format!(
            "{} is missing (the real kube-apiserver, kube-proxy and etcd 3.6)",
            script.display()
        ));
    }
    let dest = workspace().join("target/shared-bin");
    let out = Command::new(&script)
        .arg(&dest)
        .args([
            "kube-apiserver",
            "kube-proxy",
            "etcd36",
            "hubble",
            "hubble-relay",
        ])
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(dest)
}

/// Debian's etcd 3.4 (`/usr/bin/etcd` of `etcd-server`), or why not.
pub fn etcd34() -> Result<PathBuf, String> {
    let path = PathBuf::from("/usr/bin/etcd");
    let out = Command::new(&path)
        .arg("--version")
        .output()
        .map_err(|e| format!("{}: {e} (apt-get install etcd-server)", path.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !text.contains("3.4.") {
        return Err(format!("{} is not etcd 3.4: {text}", path.display()));
    }
    Ok(path)
}

/// Whether the real-API tests can run here; `Err` says why not. With
/// `VERDICT_REQUIRE_REALAPI` set (CI sets it), a reason not to is a
/// failure instead.
pub fn available() -> Result<(), String> {
    let r = crate::netns::can_run()
        .and_then(|()| binaries().map(drop))
        .and_then(|()| etcd34().map(drop))
        .and_then(|()| which("openssl").ok_or_else(|| "openssl is not installed".to_owned()));
    if let Err(why) = &r
        && std::env::var_os("VERDICT_REQUIRE_REALAPI").is_some()
    {
        panic!("VERDICT_REQUIRE_REALAPI is set, but: {why}");
    }
    r
}

fn which(program: &str) -> Option<()> {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(drop)
}

/// A static token of the API server's token file.
#[derive(Clone, Debug)]
pub struct Token {
    /// The bearer token.
    pub token: String,
    /// Its user's name.
    pub user: String,
    /// Its groups (`system:authenticated` is added by the API server).
    pub groups: Vec<String>,
}

/// How to start the API server.
#[derive(Clone, Debug)]
pub struct Options {
    /// The API server's port on the namespace's loopback.
    pub port: u16,
    /// etcd's client port (its peer port is the next one).
    pub etcd_port: u16,
    /// `--watch-cache` (off: every watch goes to etcd, so a watch from a
    /// compacted version gets 410 Gone).
    pub watch_cache: bool,
    /// Tokens besides the admin's (`system:masters`).
    pub tokens: Vec<Token>,
    /// `--service-cluster-ip-range` (two, comma-separated, for dual stack).
    pub service_cidr: String,
    /// The address it binds (`127.0.0.1`; `0.0.0.0` to be reached from
    /// other namespaces through links of the test's own).
    pub bind: String,
    /// Addresses its serving certificate names besides 127.0.0.1.
    pub sans: Vec<String>,
    /// `--service-node-port-range`, if not the default.
    pub node_port_range: Option<String>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            port: 6443,
            etcd_port: 23790,
            watch_cache: true,
            tokens: Vec::new(),
            service_cidr: "10.96.0.0/16".into(),
            bind: "127.0.0.1".into(),
            sans: Vec::new(),
            node_port_range: None,
        }
    }
}

/// A real etcd and kube-apiserver in a namespace; both are killed when
/// dropped.
pub struct RealApiServer {
    /// Where its files are: certificates, tokens, logs, the audit log.
    pub dir: PathBuf,
    /// `https://127.0.0.1:PORT`, inside the namespace.
    pub url: String,
    /// The certificate authority of its serving certificate.
    pub ca: PathBuf,
    /// A `system:masters` token.
    pub admin_token: String,
    /// A token of the user `system:kube-proxy`, whom Kubernetes'
    /// bootstrap binding `system:node-proxier` covers.
    pub kube_proxy_token: String,
    /// The etcd it stores in.
    pub etcd: Etcd,
    ns: String,
    etcd_url: String,
    apiserver_args: Vec<String>,
    apiserver_bin: PathBuf,
    etcd_process: Option<Process>,
    apiserver_process: Option<Process>,
}

impl std::fmt::Debug for RealApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealApiServer")
            .field("url", &self.url)
            .field("etcd", &self.etcd)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A random hex token.
fn random_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::new();
    for i in 0..2u64 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(i);
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

/// Starts `program` inside `ns`, its output to `log`.
fn spawn_logged(ns: &str, program: &Path, args: &[String], log: &Path) -> Result<Child, String> {
    let file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = file.try_clone().map_err(|e| e.to_string())?;
    Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("{}: {e}", program.display()))
}

impl RealApiServer {
    /// Starts etcd and the API server in `ns`, keeping their files in
    /// `dir` (emptied first), and waits until `/readyz` answers 200.
    pub fn start(
        ns: &Netns,
        etcd: Etcd,
        dir: &Path,
        opts: &Options,
    ) -> Result<RealApiServer, String> {
        let bin = binaries()?;
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let d = |name: &str| dir.join(name).to_string_lossy().into_owned();
        // Certificates: a CA, the serving certificate, the service
        // account key pair.
        let ssl = |args: &[&str]| run("openssl", args);
        ssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &d("ca.key"),
            "-out",
            &d("ca.crt"),
            "-days",
            "2",
            "-subj",
            "/CN=verdict-test-ca",
        ])?;
        ssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &d("apiserver.key"),
            "-out",
            &d("apiserver.csr"),
            "-subj",
            "/CN=kube-apiserver",
        ])?;
        let mut sans = String::from("IP:127.0.0.1,DNS:localhost,DNS:kubernetes");
        for a in &opts.sans {
            sans.push_str(&format!(",IP:{a}"));
        }
        std::fs::write(
            dir.join("apiserver.ext"),
            format!("subjectAltName={sans}\nextendedKeyUsage=serverAuth\n"),
        )
        .map_err(|e| e.to_string())?;
        ssl(&[
            "x509",
            "-req",
            "-in",
            &d("apiserver.csr"),
            "-CA",
            &d("ca.crt"),
            "-CAkey",
            &d("ca.key"),
            "-CAcreateserial",
            "-out",
            &d("apiserver.crt"),
            "-days",
            "2",
            "-extfile",
            &d("apiserver.ext"),
        ])?;
        ssl(&["genrsa", "-out", &d("sa.key"), "2048"])?;
        ssl(&["rsa", "-in", &d("sa.key"), "-pubout", "-out", &d("sa.pub")])?;
        let admin_token = random_token();
        let kube_proxy_token = random_token();
        let mut tokens = format!(
            "{admin_token},verdict-test-admin,admin-uid,\"system:masters\"\n{kube_proxy_token},system:kube-proxy,kube-proxy-uid\n"
        );
        for (i, t) in opts.tokens.iter().enumerate() {
            tokens.push_str(&format!(
                "{},{},uid-{i},\"{}\"\n",
                t.token,
                t.user,
                t.groups.join(",")
            ));
        }
        std::fs::write(dir.join("tokens.csv"), tokens).map_err(|e| e.to_string())?;
        std::fs::write(
            dir.join("audit-policy.yaml"),
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\nrules:\n- level: Metadata\n",
        )
        .map_err(|e| e.to_string())?;

        let etcd_url = format!("http://127.0.0.1:{}", opts.etcd_port);
        let peer = format!("http://127.0.0.1:{}", opts.etcd_port + 1);
        let etcd_bin = match etcd {
            Etcd::V34 => etcd34()?,
            Etcd::V36 => bin.join("etcd36"),
        };
        let etcd_args: Vec<String> = [
            "--name",
            "verdict-test",
            "--data-dir",
            &d("etcd"),
            "--listen-client-urls",
            &etcd_url,
            "--advertise-client-urls",
            &etcd_url,
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster",
            &format!("verdict-test={peer}"),
            "--log-level",
            "warn",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let etcd_process = Process(spawn_logged(
            ns.name(),
            &etcd_bin,
            &etcd_args,
            &dir.join("etcd.log"),
        )?);
        let mut apiserver_args: Vec<String> = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--bind-address={}", opts.bind),
            format!("--secure-port={}", opts.port),
            "--advertise-address=127.0.0.1".into(),
            format!("--tls-cert-file={}", d("apiserver.crt")),
            format!("--tls-private-key-file={}", d("apiserver.key")),
            format!("--client-ca-file={}", d("ca.crt")),
            format!("--token-auth-file={}", d("tokens.csv")),
            "--authorization-mode=Node,RBAC".into(),
            format!("--service-account-key-file={}", d("sa.pub")),
            format!("--service-account-signing-key-file={}", d("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--service-cluster-ip-range={}", opts.service_cidr),
            "--endpoint-reconciler-type=none".into(),
            format!("--audit-log-path={}", d("audit.log")),
            format!("--audit-policy-file={}", d("audit-policy.yaml")),
            "--audit-log-maxsize=0".into(),
            format!("--watch-cache={}", opts.watch_cache),
        ];
        if let Some(r) = &opts.node_port_range {
            apiserver_args.push(format!("--service-node-port-range={r}"));
        }
        let mut server = RealApiServer {
            dir: dir.to_path_buf(),
            url: format!("https://127.0.0.1:{}", opts.port),
            ca: dir.join("ca.crt"),
            admin_token,
            kube_proxy_token,
            etcd,
            ns: ns.name().to_owned(),
            etcd_url,
            apiserver_args,
            apiserver_bin: bin.join("kube-apiserver"),
            etcd_process: Some(etcd_process),
            apiserver_process: None,
        };
        server.wait_for_etcd()?;
        server.start_apiserver()?;
        Ok(server)
    }

    fn wait_for_etcd(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.etcd_request("GET", "/version", "").is_ok() {
                return Ok(());
            }
            if let Some(p) = &mut self.etcd_process
                && let Ok(Some(status)) = p.0.try_wait()
            {
                return Err(format!("etcd exited ({status}): {}", self.log("etcd.log")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("etcd never answered: {}", self.log("etcd.log")))
    }

    /// Starts the API server (again, after [`RealApiServer::stop`]) and
    /// waits until `/readyz` answers 200.
    pub fn start_apiserver(&mut self) -> Result<(), String> {
        let log = self.dir.join("kube-apiserver.log");
        // Appended to, across restarts.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| e.to_string())?;
        let err = file.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(&self.apiserver_bin)
            .args(&self.apiserver_args)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("kube-apiserver: {e}"))?;
        self.apiserver_process = Some(Process(child));
        let client = self.admin()?;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok((200, _)) = client.get("/readyz") {
                return Ok(());
            }
            if let Some(p) = &mut self.apiserver_process
                && let Ok(Some(status)) = p.0.try_wait()
            {
                return Err(format!(
                    "kube-apiserver exited ({status}): {}",
                    self.log("kube-apiserver.log")
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "kube-apiserver not ready within 120 s: {}",
                    self.log("kube-apiserver.log")
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Kills the API server (etcd stays): an outage.
    pub fn stop_apiserver(&mut self) {
        self.apiserver_process = None;
    }

    /// The last 4 KiB of one of its logs.
    pub fn log(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
        let cut = text.len().saturating_sub(4096);
        let mut start = cut;
        while !text.is_char_boundary(start) {
            start += 1;
        }
        text[start..].to_owned()
    }

    /// Writes a kubeconfig for `token` as `dir/NAME.kubeconfig`; its path.
    pub fn kubeconfig(&self, name: &str, token: &str) -> Result<PathBuf, String> {
        self.kubeconfig_at(name, token, &self.url.clone())
    }

    /// The same for the API server reached at `server` (another of its
    /// addresses).
    pub fn kubeconfig_at(&self, name: &str, token: &str, server: &str) -> Result<PathBuf, String> {
        let path = self.dir.join(format!("{name}.kubeconfig"));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: {name}\n  user:\n    token: {token}\ncontexts:\n- name: {name}\n  context: {{cluster: test, user: {name}}}\ncurrent-context: {name}\n",
            self.ca.display()
        );
        std::fs::write(&path, text).map_err(|e| e.to_string())?;
        Ok(path)
    }

    /// A client as the admin.
    pub fn admin(&self) -> Result<KubeClient, String> {
        self.client_for("admin", &self.admin_token.clone())
    }

    /// A client with `token`.
    pub fn client_for(&self, name: &str, token: &str) -> Result<KubeClient, String> {
        let kc = self.kubeconfig(name, token)?;
        KubeClient::in_netns(&self.ns, &kc)
    }

    /// A request to etcd's HTTP gateway (`/v3/...`), from inside the
    /// namespace: the answer's body.
    pub fn etcd_request(&self, method: &str, path: &str, body: &str) -> Result<String, String> {
        let addr = self.etcd_url.trim_start_matches("http://").to_owned();
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let raw = in_netns_once(&self.ns, move || {
            let mut s = std::net::TcpStream::connect(&addr).map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(Duration::from_secs(10)))
                .map_err(|e| e.to_string())?;
            s.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
            let mut out = String::new();
            s.read_to_string(&mut out).map_err(|e| e.to_string())?;
            Ok(out)
        })?;
        let body = crate::http::unchunked(&raw);
        let (head, rest) = body.split_once("\r\n\r\n").unwrap_or((&body, ""));
        if !head.starts_with("HTTP/1.1 200") {
            return Err(format!("etcd {method} {path}: {head}"));
        }
        Ok(rest.to_owned())
    }

    /// etcd's current revision (the newest resourceVersion).
    pub fn revision(&self) -> Result<u64, String> {
        let text = self.etcd_request("POST", "/v3/kv/range", r#"{"key":"AA=="}"#)?;
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
        v["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| format!("no revision in {text}"))
    }

    /// Compacts etcd at its current revision: every older resourceVersion
    /// is gone (a watch from one gets 410 where the watch cache is off).
    pub fn compact(&self) -> Result<u64, String> {
        let rev = self.revision()?;
        self.etcd_request(
            "POST",
            "/v3/kv/compaction",
            &format!(r#"{{"revision":"{rev}","physical":true}}"#),
        )?;
        Ok(rev)
    }

    /// The audit log's events so far (`requestURI`, `verb`, `userAgent`,
    /// `responseStatus`, ...).
    pub fn audit(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join("audit.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for RealApiServer {
    fn drop(&mut self) {
        // The API server before its etcd.
        self.apiserver_process = None;
        self.etcd_process = None;
    }
}

/// An HTTP answer: the status code, the headers (names lower-case) and
/// the body (de-chunked).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The status code.
    pub code: u16,
    /// The headers, names lower-case.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: String,
}

impl Answer {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `GET path` on `addr` from inside `ns`, with `headers` (`Name: value`
/// lines); `None`: nothing answered.
pub fn http_request(
    ns: &str,
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<Answer> {
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    let raw = in_netns_once(ns, move || {
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1))
            .map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        s.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    })
    .ok()?;
    let raw = crate::http::unchunked(&raw);
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let code = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Some(Answer {
        code,
        headers,
        body: body.to_owned(),
    })
}

/// `GET path` on `addr` from inside `ns`: the status code and the body
/// (`None`: nothing answered).
pub fn http_get(ns: &str, addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    http_request(ns, addr, path, &[]).map(|a| (a.code, a.body))
}

/// The real kube-proxy 1.36 of `../shared/bin`, in nftables mode, in a
/// namespace; killed when dropped.
pub struct KubeProxy {
    /// Its log.
    pub log: PathBuf,
    /// Its configuration file (empty when started with flags only).
    pub config: PathBuf,
    _process: Process,
}

impl std::fmt::Debug for KubeProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeProxy")
            .field("log", &self.log)
            .finish_non_exhaustive()
    }
}

impl KubeProxy {
    /// Starts kube-proxy in `ns` against `api` as `system:kube-proxy`,
    /// with a `KubeProxyConfiguration` of nftables mode for node `node`
    /// and cluster CIDR `cluster_cidr`, plus the lines `extra` (YAML at
    /// the top level, such as `healthzBindAddress: 0.0.0.0:10266`); its
    /// files go into `dir`. Waits until its health server says it has
    /// synced (`healthz` below), or its tables are there.
    pub fn start(
        ns: &Netns,
        api: &RealApiServer,
        dir: &Path,
        node: &str,
        cluster_cidr: &str,
        extra: &str,
        healthz: std::net::SocketAddr,
    ) -> Result<KubeProxy, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let kubeconfig = api.kubeconfig("kube-proxy", &api.kube_proxy_token)?;
        let config = dir.join("kube-proxy.yaml");
        let mut text = format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\nclientConnection:\n  kubeconfig: {}\nhostnameOverride: {node}\nclusterCIDR: {cluster_cidr}\nconntrack:\n  maxPerCore: 0\n",
            kubeconfig.display()
        );
        text.push_str(extra);
        std::fs::write(&config, text).map_err(|e| e.to_string())?;
        let mut kp = KubeProxy::with_args(
            ns,
            dir,
            &[format!("--config={}", config.display()), "--v=2".into()],
            healthz,
        )?;
        kp.config = config;
        Ok(kp)
    }

    /// Starts kube-proxy in `ns` with the command line `args` (its
    /// kubeconfig among them), its log in `dir`; waits until its health
    /// server at `healthz` answers 200.
    pub fn with_args(
        ns: &Netns,
        dir: &Path,
        args: &[String],
        healthz: std::net::SocketAddr,
    ) -> Result<KubeProxy, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let log = dir.join("kube-proxy.log");
        let bin = binaries()?.join("kube-proxy");
        let child = spawn_logged(ns.name(), &bin, args, &log)?;
        let mut process = Process(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some((200, _)) = http_get(ns.name(), healthz, "/healthz") {
                break;
            }
            if let Ok(Some(status)) = process.0.try_wait() {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!("kube-proxy exited ({status}): {text}"));
            }
            if Instant::now() > deadline {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!("kube-proxy not healthy within 60 s: {text}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(KubeProxy {
            log,
            config: PathBuf::new(),
            _process: process,
        })
    }
}

/// The path of a named network namespace.
fn netns_path(ns: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(ns)
}

/// Moves the calling thread into the namespace `ns` (a thread of its
/// own: only its sockets live there).
fn enter(ns: &str) -> Result<(), String> {
    let file = std::fs::File::open(netns_path(ns)).map_err(|e| format!("netns {ns}: {e}"))?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("setns {ns}: {e}"))
}

/// Runs `f` on a new thread inside `ns`.
fn in_netns_once<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let ns = ns.to_owned();
    std::thread::spawn(move || {
        enter(&ns)?;
        f()
    })
    .join()
    .map_err(|_| "the namespace's thread panicked".to_owned())?
}

type Reply = mpsc::Sender<Result<(u16, String), String>>;

/// One request: method, path, content type and body.
struct Job {
    method: http::Method,
    path: String,
    content_type: &'static str,
    body: Vec<u8>,
    reply: Reply,
}

/// An HTTPS client of the API server for a test, as the kubeconfig it is
/// given says, on a thread inside the API server's namespace. Requests may
/// be sent from any thread; [`KubeClient::all`] sends many at once.
pub struct KubeClient {
    jobs: Mutex<mpsc::Sender<Job>>,
}

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClient").finish_non_exhaustive()
    }
}

impl KubeClient {
    /// A client inside `ns` for the kubeconfig `kubeconfig`.
    pub fn in_netns(ns: &str, kubeconfig: &Path) -> Result<KubeClient, String> {
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel();
        let ns = ns.to_owned();
        let kubeconfig = kubeconfig.to_path_buf();
        std::thread::spawn(move || {
            let setup = (|| {
                enter(&ns)?;
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                let client = rt.block_on(async {
                    let kc = kube::config::Kubeconfig::read_from(&kubeconfig)
                        .map_err(|e| e.to_string())?;
                    let config = kube::Config::from_custom_kubeconfig(
                        kc,
                        &kube::config::KubeConfigOptions::default(),
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                    kube::Client::try_from(config).map_err(|e| e.to_string())
                })?;
                Ok::<_, String>((rt, client))
            })();
            let (rt, client) = match setup {
                Ok(x) => {
                    let _ = ready_tx.send(Ok(()));
                    x
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            rt.block_on(async move {
                let (atx, mut arx) = tokio::sync::mpsc::unbounded_channel::<Job>();
                // Jobs from the std channel onto the runtime.
                std::thread::spawn(move || {
                    while let Ok(job) = rx.recv() {
                        if atx.send(job).is_err() {
                            return;
                        }
                    }
                });
                while let Some(job) = arx.recv().await {
                    let client = client.clone();
                    tokio::spawn(async move {
                        let answer =
                            send(&client, job.method, &job.path, job.content_type, job.body).await;
                        let _ = job.reply.send(answer);
                    });
                }
            });
        });
        ready_rx
            .recv()
            .map_err(|_| "the client's thread ended".to_owned())??;
        Ok(KubeClient {
            jobs: Mutex::new(tx),
        })
    }

    fn submit(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&Value>,
    ) -> mpsc::Receiver<Result<(u16, String), String>> {
        let (reply, rx) = mpsc::channel();
        let content_type = if method == http::Method::PATCH {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        let job = Job {
            method,
            path: path.to_owned(),
            content_type,
            body: body.map(|b| b.to_string().into_bytes()).unwrap_or_default(),
            reply,
        };
        let jobs = self
            .jobs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = jobs.send(job);
        rx
    }

    /// One request: its status code and body.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, String), String> {
        let method: http::Method = method.parse().map_err(|e| format!("{method}: {e}"))?;
        self.submit(method, path, body)
            .recv_timeout(Duration::from_secs(60))
            .map_err(|_| format!("no answer to {path} within 60 s"))?
    }

    /// `GET path`.
    pub fn get(&self, path: &str) -> Result<(u16, String), String> {
        self.request("GET", path, None)
    }

    /// `GET path`, which must answer 200 with JSON.
    pub fn get_json(&self, path: &str) -> Result<Value, String> {
        match self.get(path)? {
            (200, body) => serde_json::from_str(&body).map_err(|e| format!("{path}: {e}")),
            (code, body) => Err(format!("GET {path}: {code} {body}")),
        }
    }

    /// `POST path` of `obj`, which must answer 201 (or 200): the object
    /// the API server stored.
    pub fn create(&self, path: &str, obj: &Value) -> Result<Value, String> {
        match self.request("POST", path, Some(obj))? {
            (200 | 201, body) => serde_json::from_str(&body).map_err(|e| format!("{path}: {e}")),
            (code, body) => Err(format!("POST {path}: {code} {body}")),
        }
    }

    /// Many requests at once (at most 64 in flight); the first failure
    /// (a code other than 200 or 201), if any.
    pub fn all(&self, requests: &[(&str, String, Value)]) -> Result<(), String> {
        for chunk in requests.chunks(64) {
            let waiting: Vec<_> = chunk
                .iter()
                .map(|(m, path, body)| {
                    let method: http::Method = m.parse().unwrap_or(http::Method::POST);
                    (path, self.submit(method, path, Some(body)))
                })
                .collect();
            for (path, rx) in waiting {
                match rx.recv_timeout(Duration::from_secs(60)) {
                    Ok(Ok((200 | 201, _))) => {}
                    Ok(Ok((code, body))) => return Err(format!("{path}: {code} {body}")),
                    Ok(Err(e)) => return Err(format!("{path}: {e}")),
                    Err(_) => return Err(format!("{path}: no answer within 60 s")),
                }
            }
        }
        Ok(())
    }
}

async fn send(
    client: &kube::Client,
    method: http::Method,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> Result<(u16, String), String> {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(kube::client::Body::from(body))
        .map_err(|e| e.to_string())?;
    let response = client.send(request).await.map_err(|e| e.to_string())?;
    let code = response.status().as_u16();
    let bytes = response
        .into_body()
        .collect_bytes()
        .await
        .map_err(|e| e.to_string())?;
    Ok((code, String::from_utf8_lossy(&bytes).into_owned()))
}
