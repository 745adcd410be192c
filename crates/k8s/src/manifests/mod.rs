//! Services, EndpointSlices and Nodes from YAML (or JSON) files: a file, or
//! every `*.yaml`, `*.yml` and `*.json` file of a directory (in name
//! order). A file may hold several documents (`---`) and `kind: List`
//! documents as `kubectl get -o yaml` writes them. A document that is not
//! valid is reported with its file and object and skipped; the rest loads.
//!
//! - [`load`] reads everything once (`verdict plan`, tests).
//! - [`Manifests`] keeps what each file defined and, when files change,
//!   parses only those and turns the difference into [`Update`]s, as the
//!   API source does: the daemon's source.
//!
//! Parsing is parallel: the files, and the documents of a big file, are
//! shared among the machine's cores. A file over a [`Limits`] (size,
//! documents, nesting) is refused whole, with the limit named, before it is
//! parsed; the daemon's source parses each file on its own, so that a slow
//! one never holds the others back.
//!
//! [`Update`]: crate::watch::Update

mod fast;
mod parse;
mod source;

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use verdict_model::{EndpointSlice, Service};

use crate::convert::NodeInfo;

pub use parse::Limits;
pub use source::{Manifests, Refresh};

/// A document that could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ManifestError {
    /// The file.
    pub file: PathBuf,
    /// Which object: `Service ns/name`, or `document N` when it has no name.
    pub object: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}: {}",
            self.file.display(),
            self.object,
            self.message
        )
    }
}

/// Everything loaded from a path.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Loaded {
    /// Services.
    pub services: Vec<Service>,
    /// EndpointSlices.
    pub slices: Vec<EndpointSlice>,
    /// Nodes.
    pub nodes: Vec<NodeInfo>,
    /// The ranges of every ServiceCIDR object (sorted, without repeats).
    pub service_cidrs: Vec<ipnet::IpNet>,
    /// Documents that were skipped, and why.
    pub errors: Vec<ManifestError>,
    /// The files read.
    pub files: Vec<PathBuf>,
}

/// What one file defines, in document order. A Service or EndpointSlice
/// defined twice in the file is kept once (the first), with an error.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parsed {
    /// Services.
    pub services: Vec<Service>,
    /// EndpointSlices.
    pub slices: Vec<EndpointSlice>,
    /// Nodes.
    pub nodes: Vec<NodeInfo>,
    /// The ranges of its ServiceCIDR objects.
    pub service_cidrs: Vec<ipnet::IpNet>,
    /// Documents that were skipped, and why.
    pub errors: Vec<ManifestError>,
}

/// The files a path stands for.
pub fn files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    if path.is_dir() {
        // Every entry with a manifest's extension is listed, whatever it
        // is: one that is not a readable regular file (a dangling link, a
        // link loop, a FIFO) is reported by `load`, not skipped in silence.
        let mut v: Vec<PathBuf> = std::fs::read_dir(path)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| is_manifest(p))
            .collect();
        v.sort();
        Ok(v)
    } else {
        std::fs::metadata(path)?;
        Ok(vec![path.to_path_buf()])
    }
}

/// Whether a directory entry is read as a manifest (by its extension).
pub(crate) fn is_manifest(p: &Path) -> bool {
    matches!(
        p.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    )
}

/// Parses each file (in parallel), within [`Limits::DEFAULT`].
pub fn parse_files(files: &[PathBuf]) -> Vec<Parsed> {
    parse::files(files, Limits::DEFAULT)
}

/// Loads every object under `path`. An object defined in several files is
/// taken from the first (in name order), with an error for the others.
pub fn load(path: &Path) -> Loaded {
    let mut out = Loaded::default();
    let files = match files(path) {
        Ok(files) => files,
        Err(e) => {
            out.errors.push(ManifestError {
                file: path.to_path_buf(),
                object: "path".into(),
                message: e.to_string(),
            });
            return out;
        }
    };
    let mut seen = FirstDefinitions::default();
    for (file, parsed) in files.iter().zip(parse_files(&files)) {
        out.errors.extend(parsed.errors);
        for s in parsed.services {
            if seen.first(file, "Service", &s.namespace, &s.name, &mut out.errors) {
                out.services.push(s);
            }
        }
        for s in parsed.slices {
            if seen.first(
                file,
                "EndpointSlice",
                &s.namespace,
                &s.name,
                &mut out.errors,
            ) {
                out.slices.push(s);
            }
        }
        out.nodes.extend(parsed.nodes);
        out.service_cidrs.extend(parsed.service_cidrs);
        out.files.push(file.clone());
    }
    out.service_cidrs.sort();
    out.service_cidrs.dedup();
    out
}

/// The Services and EndpointSlices defined so far, to refuse a second
/// definition of one: the first, in file and document order, is used.
#[derive(Default)]
pub(crate) struct FirstDefinitions(BTreeSet<(&'static str, String, String)>);

impl FirstDefinitions {
    /// Whether this is the first definition of the object; if not, the
    /// error naming `file` is added to `errors`.
    pub(crate) fn first(
        &mut self,
        file: &Path,
        kind: &'static str,
        namespace: &str,
        name: &str,
        errors: &mut Vec<ManifestError>,
    ) -> bool {
        let new = self.0.insert((kind, namespace.to_owned(), name.to_owned()));
        if !new {
            errors.push(duplicate(file, kind, namespace, name));
        }
        new
    }
}

/// The error for a second definition of an object.
pub(crate) fn duplicate(file: &Path, kind: &str, namespace: &str, name: &str) -> ManifestError {
    ManifestError {
        file: file.to_path_buf(),
        object: format!("{kind} {namespace}/{name}"),
        message: "defined more than once; the first definition is used".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// A scratch directory, removed with everything in it when dropped.
    struct Scratch(PathBuf);

    impl std::ops::Deref for Scratch {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tmpdir(tag: &str) -> Scratch {
        let d =
            std::env::temp_dir().join(format!("verdict-manifests-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    const SERVICE: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.20
  clusterIPs: [10.96.0.20]
  externalTrafficPolicy: Local
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}
  loadBalancerSourceRanges: [203.0.113.0/24]
  ports:
  - {name: http, port: 80, protocol: TCP, nodePort: 30080}
status:
  loadBalancer:
    ingress: [{ip: 203.0.113.50}, {ip: 203.0.113.51, ipMode: Proxy}]
"#;

    const SLICE: &str = r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: demo
  labels: {kubernetes.io/service-name: web}
  annotations: {endpoints.kubernetes.io/last-change-trigger-time: "2026-11-29T10:00:00Z"}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.244.0.7]
  nodeName: node-a
  zone: z1
  conditions: {ready: true}
  hints: {forZones: [{name: z1}]}
- addresses: [10.244.1.5]
  conditions: {ready: false, serving: true, terminating: true}
"#;

    #[test]
    fn reads_services_slices_and_nodes() {
        let d = tmpdir("read");
        write(&d, "a.yaml", &format!("{SERVICE}---{SLICE}"));
        write(
            &d,
            "b.yml",
            "apiVersion: v1\nkind: Node\nmetadata: {name: node-a, labels: {topology.kubernetes.io/zone: z1}}\nspec: {podCIDRs: [10.244.0.0/24]}\nstatus: {addresses: [{type: Hostname, address: node-a}, {type: InternalIP, address: 192.168.0.10}]}\n",
        );
        write(&d, "ignored.txt", "not yaml at all: [");
        let l = load(&d);
        assert!(l.errors.is_empty(), "{:?}", l.errors);
        assert_eq!(l.files.len(), 2);
        let s = &l.services[0];
        assert_eq!((s.namespace.as_str(), s.name.as_str()), ("demo", "web"));
        assert_eq!(s.cluster_ips, ["10.96.0.20"]);
        assert_eq!(s.ports[0].node_port, Some(30080));
        assert_eq!(s.session_affinity_timeout_seconds, Some(600));
        assert_eq!(
            s.external_traffic_policy,
            verdict_model::TrafficPolicy::Local
        );
        assert_eq!(s.load_balancer_ingress.len(), 2);
        assert_eq!(
            s.load_balancer_ingress[1].ip_mode,
            Some(verdict_model::LoadBalancerIpMode::Proxy)
        );
        let sl = &l.slices[0];
        assert_eq!(sl.service_name.as_deref(), Some("web"));
        assert_eq!(sl.endpoints.len(), 2);
        assert_eq!(sl.endpoints[1].terminating, Some(true));
        assert_eq!(sl.endpoints[0].hints.as_ref().unwrap().for_zones, ["z1"]);
        assert_eq!(
            sl.last_change_trigger_time.as_deref(),
            Some("2026-11-29T10:00:00Z")
        );
        let n = &l.nodes[0];
        assert_eq!(n.addresses, ["192.168.0.10"]);
        assert_eq!(n.pod_cidrs, ["10.244.0.0/24"]);
        assert_eq!(n.zone.as_deref(), Some("z1"));
        assert!(!n.being_deleted);
    }

    #[test]
    fn a_node_being_deleted_is_marked() {
        let d = tmpdir("deleting");
        let f = write(
            &d,
            "n.yaml",
            "apiVersion: v1\nkind: Node\nmetadata: {name: a}\nspec: {taints: [{key: ToBeDeletedByClusterAutoscaler, effect: NoSchedule}]}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: b, deletionTimestamp: \"2026-11-29T10:00:00Z\"}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: c}\n",
        );
        let l = load(&f);
        assert!(l.errors.is_empty(), "{:?}", l.errors);
        let deleting: Vec<bool> = l.nodes.iter().map(|n| n.being_deleted).collect();
        assert_eq!(deleting, [true, true, false]);
    }

    #[test]
    fn reads_service_cidrs() {
        let d = tmpdir("servicecidr");
        let f = write(
            &d,
            "c.yaml",
            "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: kubernetes}\nspec: {cidrs: [10.96.0.0/16, \"fd00:10:96::/112\"]}\n---\napiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: extra}\nspec: {cidrs: [10.96.0.0/16, 10.97.0.0/16, nonsense]}\n",
        );
        let l = load(&f);
        let cidrs: Vec<String> = l.service_cidrs.iter().map(ToString::to_string).collect();
        // Like the API server, an object with one invalid field is refused
        // whole: "extra" contributes nothing, not its two good ranges.
        assert_eq!(cidrs, ["10.96.0.0/16", "fd00:10:96::/112"]);
        assert_eq!(l.errors.len(), 1, "{:?}", l.errors);
        assert!(
            l.errors[0]
                .to_string()
                .contains("ServiceCIDR extra: spec.cidrs: Too many"),
            "{}",
            l.errors[0]
        );
    }

    #[test]
    fn reads_kubectl_lists() {
        let d = tmpdir("list");
        let f = write(
            &d,
            "list.yaml",
            "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: a, namespace: ns1}\n  spec: {clusterIP: 10.96.0.1, ports: [{port: 53, protocol: UDP}]}\n- apiVersion: v1\n  kind: Service\n  metadata: {name: b, namespace: ns1}\n  spec: {clusterIP: 10.96.0.2, ports: [{port: 80}]}\n",
        );
        let l = load(&f);
        assert!(l.errors.is_empty(), "{:?}", l.errors);
        assert_eq!(l.services.len(), 2);
        assert_eq!(
            l.services[0].ports[0].protocol,
            verdict_model::Protocol::Udp
        );
    }

    #[test]
    fn bad_documents_are_reported_and_the_rest_loads() {
        let d = tmpdir("bad");
        let f = write(
            &d,
            "mixed.yaml",
            &format!(
                "{SERVICE}---\napiVersion: v1\nkind: Service\nmetadata: {{name: broken, namespace: demo}}\nspec: {{ports: [{{port: not-a-number}}]}}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: d, namespace: demo}}\n---\nkind: EndpointSlice\napiVersion: discovery.k8s.io/v1\nmetadata: {{name: orphan, namespace: demo}}\naddressType: IPv4\nendpoints: []\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: nons}}\nspec: {{clusterIP: 10.96.0.3}}\n"
            ),
        );
        let l = load(&f);
        assert_eq!(l.services.len(), 1, "the good Service still loads");
        let msgs: Vec<String> = l.errors.iter().map(ToString::to_string).collect();
        assert_eq!(msgs.len(), 4, "{msgs:#?}");
        assert!(
            msgs[0].contains("mixed.yaml: Service demo/broken: not a valid Service"),
            "{}",
            msgs[0]
        );
        assert!(
            msgs[1].contains("Deployment demo/d: kind Deployment is not used"),
            "{}",
            msgs[1]
        );
        assert!(
            msgs[2].contains("EndpointSlice demo/orphan:")
                && msgs[2].contains("has no kubernetes.io/service-name label"),
            "{}",
            msgs[2]
        );
        assert!(
            msgs[3].contains("Service nons: metadata.namespace"),
            "{}",
            msgs[3]
        );
    }

    #[test]
    fn syntax_errors_name_the_file_and_keep_earlier_documents() {
        let d = tmpdir("syntax");
        write(
            &d,
            "a.yaml",
            &format!("{SERVICE}---\nkind: Service\nmetadata: [unclosed\n"),
        );
        write(&d, "b.yaml", SLICE);
        let l = load(&d);
        assert_eq!(l.services.len(), 1);
        assert_eq!(l.slices.len(), 1, "other files still load");
        assert_eq!(l.errors.len(), 1);
        assert!(
            l.errors[0]
                .to_string()
                .contains("a.yaml: document 2: not valid YAML"),
            "{}",
            l.errors[0]
        );
    }

    #[test]
    fn duplicates_and_missing_paths_are_errors() {
        let d = tmpdir("dup");
        write(&d, "a.yaml", SERVICE);
        write(&d, "b.yaml", SERVICE);
        let l = load(&d);
        assert_eq!(l.services.len(), 1);
        assert!(
            l.errors[0]
                .to_string()
                .contains("Service demo/web: defined more than once")
        );
        let l = load(&d.join("nope.yaml"));
        assert_eq!(l.errors.len(), 1);
        assert!(l.errors[0].to_string().contains("nope.yaml"));
    }
}
