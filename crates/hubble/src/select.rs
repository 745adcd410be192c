//! Which flows a `GetFlows` request selects, as Hubble means its fields:
//! a flow must match one whitelist filter (if any) and no blacklist
//! filter; within a filter every field set must match, and a field
//! matches if any of its values does.

use std::net::IpAddr;

use crate::proto::{Flow, FlowFilter, GetFlowsRequest, Timestamp};

/// A request's selection.
#[derive(Clone, Debug)]
pub struct Selection {
    whitelist: Vec<FlowFilter>,
    blacklist: Vec<FlowFilter>,
    since: Option<Timestamp>,
    until: Option<Timestamp>,
    number: u64,
    first: bool,
    follow: bool,
}

impl Selection {
    /// What `request` selects.
    pub fn of(request: &GetFlowsRequest) -> Selection {
        Selection {
            whitelist: request.whitelist.clone(),
            blacklist: request.blacklist.clone(),
            since: request.since,
            until: request.until,
            number: request.number,
            first: request.first,
            follow: request.follow,
        }
    }

    /// Whether `f` passes the filters and the time window.
    pub fn admits(&self, f: &Flow) -> bool {
        self.since.is_none_or(|s| f.time >= s)
            && self.until.is_none_or(|u| f.time <= u)
            && (self.whitelist.is_empty() || self.whitelist.iter().any(|w| matches(w, f)))
            && !self.blacklist.iter().any(|b| matches(b, f))
    }

    /// The stored flows (oldest first) to send before following: the last
    /// `number` admitted, or the first with `first`; with `number` 0, all
    /// of them, or none when following (only new flows).
    pub fn stored<'f>(&self, stored: impl Iterator<Item = &'f Flow>) -> Vec<&'f Flow> {
        let admitted: Vec<&Flow> = stored.filter(|f| self.admits(f)).collect();
        let n = usize::try_from(self.number).unwrap_or(usize::MAX);
        match (n, self.first) {
            (0, _) if self.follow && self.since.is_none() => Vec::new(),
            (0, _) => admitted,
            (n, true) => admitted.into_iter().take(n).collect(),
            (n, false) => {
                let skip = admitted.len().saturating_sub(n);
                admitted.into_iter().skip(skip).collect()
            }
        }
    }
}

/// Whether one filter matches `f`.
fn matches(filter: &FlowFilter, f: &Flow) -> bool {
    if !filter.unsupported.is_empty() {
        return false;
    }
    let any = |values: &[String], test: &dyn Fn(&str) -> bool| {
        values.is_empty() || values.iter().any(|v| test(v))
    };
    any(&filter.source_ip, &|v| ip_matches(v, f.source_ip))
        && any(&filter.destination_ip, &|v| ip_matches(v, f.destination_ip))
        && any(&filter.source_pod, &|v| {
            pod_matches(v, &f.source.namespace, &f.source.pod_name)
        })
        && any(&filter.destination_pod, &|v| {
            pod_matches(v, &f.destination.namespace, &f.destination.pod_name)
        })
        && (filter.verdict.is_empty() || filter.verdict.contains(&(f.verdict as u64)))
        && any(&filter.protocol, &|v| v.eq_ignore_ascii_case(f.l4.name()))
        && any(&filter.source_port, &|v| v == f.source_port.to_string())
        && any(&filter.destination_port, &|v| {
            v == f.destination_port.to_string()
        })
        // Every flow is a connection's first packet, from its client.
        && (filter.reply.is_empty() || filter.reply.contains(&false))
        && any(&filter.destination_service, &|v| match &f.destination_service {
            Some((ns, name)) => pod_matches(v, ns, name),
            None => false,
        })
        && any(&filter.source_label, &|v| f.source.labels.iter().any(|l| l == v))
        && any(&filter.destination_label, &|v| {
            f.destination.labels.iter().any(|l| l == v)
        })
        && any(&filter.node_name, &|v| node_matches(v, &f.node_name))
}

/// An address, or a CIDR holding it.
fn ip_matches(filter: &str, ip: IpAddr) -> bool {
    match filter.split_once('/') {
        None => filter.parse::<IpAddr>().is_ok_and(|a| a == ip),
        Some((net, len)) => {
            let (Ok(net), Ok(len)) = (net.parse::<IpAddr>(), len.parse::<u32>()) else {
                return false;
            };
            match (net, ip) {
                (IpAddr::V4(n), IpAddr::V4(a)) if len <= 32 => {
                    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
                    u32::from(n) & mask == u32::from(a) & mask
                }
                (IpAddr::V6(n), IpAddr::V6(a)) if len <= 128 => {
                    let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
                    u128::from(n) & mask == u128::from(a) & mask
                }
                _ => false,
            }
        }
    }
}

/// `namespace/` (every pod of it), `namespace/prefix`, or `prefix` (in
/// `default`), as Hubble reads a pod or a Service filter.
fn pod_matches(filter: &str, namespace: &str, name: &str) -> bool {
    let (ns, prefix) = filter.split_once('/').unwrap_or(("default", filter));
    !namespace.is_empty() && ns == namespace && (prefix.is_empty() || name.starts_with(prefix))
}

/// A node's name, or a pattern with `*` (Hubble's filter also takes a
/// `cluster/` before the name).
fn node_matches(filter: &str, node: &str) -> bool {
    let pattern = filter.rsplit_once('/').map_or(filter, |(_, n)| n);
    match pattern.split_once('*') {
        None => pattern == node,
        Some((head, tail)) => {
            node.len() >= head.len() + tail.len() && node.starts_with(head) && node.ends_with(tail)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Endpoint, L4, Verdict};

    fn flow(seconds: i64, client: &str, verdict: Verdict) -> Flow {
        Flow {
            time: Timestamp { seconds, nanos: 0 },
            verdict,
            drop_reason: None,
            source_ip: client.parse().unwrap(),
            destination_ip: "10.180.0.1".parse().unwrap(),
            l4: L4::Tcp,
            source_port: 40000,
            destination_port: 8080,
            source: Endpoint {
                namespace: "shop".into(),
                pod_name: "client-7f9".into(),
                ..Endpoint::default()
            },
            destination: Endpoint {
                namespace: "shop".into(),
                pod_name: "web-1".into(),
                ..Endpoint::default()
            },
            node_name: "node-a".into(),
            destination_service: Some(("shop".into(), "web".into())),
            summary: String::new(),
        }
    }

    fn select(r: GetFlowsRequest, flows: &[Flow]) -> Vec<i64> {
        Selection::of(&r)
            .stored(flows.iter())
            .iter()
            .map(|f| f.time.seconds)
            .collect()
    }

    #[test]
    fn the_last_or_first_n_in_time_order_and_none_stored_when_only_following() {
        let flows: Vec<Flow> = (1..=5)
            .map(|s| flow(s, "10.77.0.1", Verdict::Forwarded))
            .collect();
        let last = GetFlowsRequest {
            number: 2,
            ..GetFlowsRequest::default()
        };
        assert_eq!(select(last, &flows), [4, 5]);
        let first = GetFlowsRequest {
            number: 2,
            first: true,
            ..GetFlowsRequest::default()
        };
        assert_eq!(select(first, &flows), [1, 2]);
        let follow = GetFlowsRequest {
            follow: true,
            ..GetFlowsRequest::default()
        };
        assert!(select(follow, &flows).is_empty());
        let since = GetFlowsRequest {
            since: Some(Timestamp {
                seconds: 4,
                nanos: 0,
            }),
            ..GetFlowsRequest::default()
        };
        assert_eq!(select(since, &flows), [4, 5]);
    }

    #[test]
    fn filters_select_as_hubble_means_them() {
        let a = flow(1, "10.77.0.1", Verdict::Forwarded);
        let mut b = flow(2, "192.0.2.7", Verdict::Dropped);
        b.source = Endpoint::default();
        b.l4 = L4::Udp;
        let flows = [a, b];
        let only = |f: FlowFilter| GetFlowsRequest {
            whitelist: vec![f],
            number: 10,
            ..GetFlowsRequest::default()
        };
        let by = |f: FlowFilter| select(only(f), &flows);
        assert_eq!(
            by(FlowFilter {
                verdict: vec![Verdict::Dropped as u64],
                ..FlowFilter::default()
            }),
            [2]
        );
        assert_eq!(
            by(FlowFilter {
                source_ip: vec!["10.0.0.0/8".into()],
                ..FlowFilter::default()
            }),
            [1]
        );
        assert_eq!(
            by(FlowFilter {
                source_pod: vec!["shop/".into()],
                ..FlowFilter::default()
            }),
            [1]
        );
        assert_eq!(
            by(FlowFilter {
                protocol: vec!["UDP".into()],
                ..FlowFilter::default()
            }),
            [2]
        );
        assert_eq!(
            by(FlowFilter {
                destination_port: vec!["8080".into()],
                destination_service: vec!["shop/w".into()],
                reply: vec![false],
                node_name: vec!["node-*".into()],
                ..FlowFilter::default()
            }),
            [1, 2]
        );
        // Two fields of one filter: both must match.
        assert!(
            by(FlowFilter {
                verdict: vec![Verdict::Dropped as u64],
                protocol: vec!["tcp".into()],
                ..FlowFilter::default()
            })
            .is_empty()
        );
        // A reply, a label verdict does not know, or a field it does not
        // evaluate: nothing.
        for f in [
            FlowFilter {
                reply: vec![true],
                ..FlowFilter::default()
            },
            FlowFilter {
                source_label: vec!["k8s:app=web".into()],
                ..FlowFilter::default()
            },
            FlowFilter {
                unsupported: vec![18],
                ..FlowFilter::default()
            },
        ] {
            assert!(by(f).is_empty());
        }
        // The blacklist takes away what it matches.
        let r = GetFlowsRequest {
            blacklist: vec![FlowFilter {
                source_ip: vec!["192.0.2.7".into()],
                ..FlowFilter::default()
            }],
            number: 10,
            ..GetFlowsRequest::default()
        };
        assert_eq!(select(r, &flows), [1]);
    }

    #[test]
    fn addresses_pods_and_nodes_match_like_hubbles() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(ip_matches("10.0.0.0/8", ip("10.1.2.3")));
        assert!(!ip_matches("10.0.0.0/8", ip("11.1.2.3")));
        assert!(ip_matches("fd00::/64", ip("fd00::1")));
        assert!(ip_matches("0.0.0.0/0", ip("1.2.3.4")));
        assert!(!ip_matches("10.0.0.0/8", ip("fd00::1")));
        assert!(!ip_matches("junk", ip("10.0.0.1")));
        assert!(pod_matches("web", "default", "web-1"));
        assert!(!pod_matches("web", "shop", "web-1"));
        assert!(pod_matches("shop/", "shop", "anything"));
        assert!(!pod_matches("shop/", "", ""));
        assert!(node_matches("default/node-a", "node-a"));
        assert!(node_matches("*-a", "node-a"));
        assert!(!node_matches("node-b", "node-a"));
    }
}
