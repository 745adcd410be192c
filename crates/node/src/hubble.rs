//! The node's flows as Hubble's API serves them ([`verdict_hubble`]): each
//! recorded connection as a `flow.Flow`, the store's counts as
//! `ServerStatus`. Asking for flows through Hubble counts as a reader's
//! ask, as `/api/v1/flows` does, so forwarded connections are followed
//! while a Hubble client reads.

use std::sync::Arc;
use std::time::Instant;

use verdict_hubble::grpc::FlowSource;
use verdict_hubble::proto::{
    DropReason, Endpoint, Flow, L4, ServerStatus, Timestamp, Verdict, Workload,
};
use verdict_model::Pod;

use crate::flows::{self, FlowFilter, FlowRecord, FlowStore, FlowVerdict};
use crate::view::NodeHandle;

/// The node's flow store, for Hubble's API.
pub struct HubbleFlows {
    store: Arc<FlowStore>,
    node: NodeHandle,
    node_name: String,
    started: Instant,
}

impl HubbleFlows {
    /// `store`'s flows, seen by `node_name`, the pods' labels and
    /// workloads from `node` (with `--watch-pods`).
    pub fn new(store: Arc<FlowStore>, node: NodeHandle, node_name: &str) -> HubbleFlows {
        HubbleFlows {
            store,
            node,
            node_name: node_name.to_owned(),
            started: Instant::now(),
        }
    }

    /// A flow with what the watch of Pods knows of either end.
    fn described(&self, r: &FlowRecord) -> Option<Flow> {
        let mut f = flow(r, &self.node_name)?;
        if let Some(p) = self.node.pod(f.source_ip) {
            describe(&mut f.source, &p);
        }
        if r.endpoint.is_some()
            && let Some(p) = self.node.pod(f.destination_ip)
        {
            describe(&mut f.destination, &p);
        }
        Some(f)
    }
}

/// Hubble's label source for Kubernetes labels, and the label Cilium
/// gives every pod for its namespace.
const K8S: &str = "k8s:";
const NAMESPACE_LABEL: &str = "k8s:io.kubernetes.pod.namespace=";

/// One end of a flow as the pod there is: its name, labels (as Hubble
/// writes them, `k8s:key=value`) and workload.
fn describe(e: &mut Endpoint, p: &Pod) {
    e.namespace = p.name.namespace.to_string();
    e.pod_name = p.name.name.to_string();
    e.labels = p
        .labels
        .iter()
        .map(|l| format!("{K8S}{l}"))
        .chain(std::iter::once(format!(
            "{NAMESPACE_LABEL}{}",
            p.name.namespace
        )))
        .collect();
    e.labels.sort();
    e.workloads = p
        .workload
        .iter()
        .map(|w| Workload {
            name: w.name.to_string(),
            kind: w.kind.to_string(),
        })
        .collect();
}

impl FlowSource for HubbleFlows {
    fn flows_after(&self, after: u64) -> Vec<(u64, Flow)> {
        let filter = FlowFilter {
            after: Some(after),
            ..FlowFilter::default()
        };
        let answer = self.store.query(&filter, usize::MAX);
        answer
            .flows
            .iter()
            .rev()
            .filter_map(|r| Some((r.seq, self.described(r)?)))
            .collect()
    }

    fn status(&self) -> ServerStatus {
        let answer = self.store.query(&FlowFilter::default(), 0);
        ServerStatus {
            num_flows: answer.matched as u64,
            max_flows: answer.capacity as u64,
            seen_flows: answer.last_seq,
            uptime_ns: u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX),
            version: format!("verdict {}", env!("CARGO_PKG_VERSION")),
            flows_rate: 0.0,
        }
    }

    fn node_name(&self) -> String {
        self.node_name.clone()
    }

    fn newest(&self) -> u64 {
        self.store.query(&FlowFilter::default(), 0).last_seq
    }
}

/// Hubble's drop reason for a refusal's reason (one of
/// [`crate::flows::reason_of`]'s).
fn drop_reason(reason: Option<&str>) -> DropReason {
    match reason {
        Some(flows::SOURCE_RANGE) => DropReason::PolicyDenied,
        Some(flows::UNALLOCATED) => DropReason::StaleOrUnroutableIp,
        _ => DropReason::ServiceBackendNotFound,
    }
}

/// One recorded connection as a Hubble flow (`None`: a protocol Hubble's
/// layer 4 has no field for here).
pub fn flow(r: &FlowRecord, node_name: &str) -> Option<Flow> {
    let l4 = match r.protocol.as_str() {
        "tcp" => L4::Tcp,
        "udp" => L4::Udp,
        "sctp" => L4::Sctp,
        _ => return None,
    };
    let time = verdict_admin::time::parse_rfc3339(&r.first_seen)
        .map(Timestamp::of)
        .unwrap_or_default();
    let service = r
        .service
        .as_deref()
        .and_then(|s| s.split_once('/'))
        .map(|(ns, n)| (ns.to_owned(), n.to_owned()));
    let to = r.endpoint.unwrap_or(r.destination);
    let (verdict, drop) = match r.verdict {
        FlowVerdict::Forwarded => (Verdict::Forwarded, None),
        FlowVerdict::Rejected | FlowVerdict::Dropped => {
            (Verdict::Dropped, Some(drop_reason(r.reason.as_deref())))
        }
    };
    let destination = Endpoint {
        namespace: match (&service, &r.pod) {
            (Some((ns, _)), Some(_)) => ns.clone(),
            _ => String::new(),
        },
        pod_name: r.pod.clone().unwrap_or_default(),
        ..Endpoint::default()
    };
    let entry = r
        .entry
        .map_or("an unallocated service address".to_owned(), |e| {
            format!("{e:?} {}", r.destination)
        });
    let summary = match (r.verdict, &r.service) {
        (FlowVerdict::Forwarded, Some(s)) => format!("{s} via {entry}"),
        (v, Some(s)) => format!(
            "{s} via {entry}: {} ({})",
            v.as_str(),
            r.reason.as_deref().unwrap_or("")
        ),
        (v, None) => format!(
            "{entry}: {} ({})",
            v.as_str(),
            r.reason.as_deref().unwrap_or("")
        ),
    };
    Some(Flow {
        time,
        verdict,
        drop_reason: drop,
        source_ip: r.client.ip(),
        destination_ip: to.ip(),
        l4,
        source_port: r.client.port(),
        destination_port: to.port(),
        source: match r.client_pod.as_deref().and_then(|p| p.split_once('/')) {
            Some((namespace, pod)) => Endpoint {
                namespace: namespace.to_owned(),
                pod_name: pod.to_owned(),
                ..Endpoint::default()
            },
            None => Endpoint::default(),
        },
        destination,
        node_name: node_name.to_owned(),
        destination_service: service,
        summary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flows::EntryKind;

    fn record(verdict: FlowVerdict, reason: Option<&str>) -> FlowRecord {
        FlowRecord {
            seq: 7,
            first_seen: "2026-12-06T05:25:32.842000Z".into(),
            last_seen: "2026-12-06T05:25:32.842000Z".into(),
            protocol: "tcp".into(),
            client: "10.0.0.2:40000".parse().unwrap(),
            client_pod: Some("front/shop-ui-0".into()),
            client_workload: None,
            entry: Some(EntryKind::ClusterIP),
            destination: "172.30.0.41:80".parse().unwrap(),
            service: Some("shop/web".into()),
            port: Some("http".into()),
            endpoint: (verdict == FlowVerdict::Forwarded)
                .then(|| "10.180.0.1:8080".parse().unwrap()),
            pod: (verdict == FlowVerdict::Forwarded).then(|| "web-1".into()),
            workload: None,
            masqueraded: false,
            packets: None,
            bytes: None,
            verdict,
            reason: reason.map(str::to_owned),
            open: true,
            retries: 0,
        }
    }

    #[test]
    fn a_recorded_connection_is_a_hubble_flow() {
        let f = flow(&record(FlowVerdict::Forwarded, None), "node-a").unwrap();
        assert_eq!(f.verdict, Verdict::Forwarded);
        assert_eq!(f.drop_reason, None);
        assert_eq!(f.destination_ip.to_string(), "10.180.0.1");
        assert_eq!(f.destination_port, 8080);
        assert_eq!(
            (f.source_ip.to_string(), f.source_port),
            ("10.0.0.2".into(), 40000)
        );
        assert_eq!(
            (f.source.namespace.as_str(), f.source.pod_name.as_str()),
            ("front", "shop-ui-0")
        );
        assert_eq!(f.destination.pod_name, "web-1");
        assert_eq!(f.destination.namespace, "shop");
        assert_eq!(f.destination_service, Some(("shop".into(), "web".into())));
        assert_eq!(f.time.seconds, 1_796_534_732);
        assert_eq!(f.time.nanos, 842_000_000);
        assert_eq!(f.summary, "shop/web via ClusterIP 172.30.0.41:80");

        // Refused: to the address asked for, with the closest drop reason.
        let cases = [
            ("no endpoints", DropReason::ServiceBackendNotFound),
            (
                "a port the Service does not have",
                DropReason::ServiceBackendNotFound,
            ),
            (
                "no local endpoint for a Local traffic policy",
                DropReason::ServiceBackendNotFound,
            ),
            (
                "source outside loadBalancerSourceRanges",
                DropReason::PolicyDenied,
            ),
            ("unallocated ClusterIP", DropReason::StaleOrUnroutableIp),
        ];
        for (reason, want) in cases {
            let f = flow(&record(FlowVerdict::Rejected, Some(reason)), "node-a").unwrap();
            assert_eq!(
                (f.verdict, f.drop_reason),
                (Verdict::Dropped, Some(want)),
                "{reason}"
            );
            assert_eq!(f.destination_ip.to_string(), "172.30.0.41");
            assert!(f.destination.namespace.is_empty(), "no pod: no namespace");
        }
        let mut icmp = record(FlowVerdict::Dropped, Some("no endpoints"));
        icmp.protocol = "1".into();
        assert!(flow(&icmp, "node-a").is_none());
    }

    #[test]
    fn the_watch_of_pods_gives_either_end_its_labels_and_workload() {
        let node = NodeHandle::new(
            Arc::new(std::sync::Mutex::new(verdict_admin::Health::new(
                std::time::Duration::from_secs(60),
            ))),
            Arc::new(std::sync::Mutex::new(verdict_admin::Metrics::new())),
        );
        let pod = |ns: &str, name: &str, ip: &str, labels: &[&str], w: Option<(&str, &str)>| Pod {
            name: verdict_model::NamespacedName::new(ns, name),
            ips: Box::new([ip.parse().unwrap()]),
            labels: labels
                .iter()
                .map(|l| verdict_model::Name::from(*l))
                .collect(),
            workload: w.map(|(kind, name)| {
                Arc::new(verdict_model::Workload {
                    kind: kind.into(),
                    name: name.into(),
                })
            }),
        };
        node.publish_pod(
            "front",
            "ui-0",
            Some(pod(
                "front",
                "ui-0",
                "10.0.0.2",
                &["app=ui"],
                Some(("Deployment", "ui")),
            )),
        );
        node.publish_pod(
            "shop",
            "web-1",
            Some(pod(
                "shop",
                "web-1",
                "10.180.0.1",
                &["app=web", "tier=back"],
                None,
            )),
        );
        let h = HubbleFlows::new(FlowStore::new(16), node.clone(), "node-a");
        let f = h.described(&record(FlowVerdict::Forwarded, None)).unwrap();
        assert_eq!(
            f.source.labels,
            ["k8s:app=ui", "k8s:io.kubernetes.pod.namespace=front"]
        );
        assert_eq!(
            (
                f.source.workloads[0].kind.as_str(),
                f.source.workloads[0].name.as_str()
            ),
            ("Deployment", "ui")
        );
        assert_eq!(f.destination.labels.len(), 3);
        assert!(f.destination.workloads.is_empty());
        // Refused: the address asked for is a Service's, no pod's.
        let r = h
            .described(&record(FlowVerdict::Rejected, Some("no endpoints")))
            .unwrap();
        assert!(r.destination.labels.is_empty());
        assert_eq!(r.source.pod_name, "ui-0");
        // Gone from the watch: gone from the flows.
        node.publish_pod("front", "ui-0", None);
        let f = h.described(&record(FlowVerdict::Forwarded, None)).unwrap();
        assert!(f.source.labels.is_empty());
        assert_eq!(node.pod_count(), 1);
    }
}
