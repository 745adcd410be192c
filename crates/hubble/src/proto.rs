//! Hubble's messages, wire-compatible with its protocol definitions
//! (packages `flow`, `observer`, `grpc.health.v1`): the field numbers are
//! Hubble's, the types are verdict's own and hold only what verdict
//! sends or reads. `docs/flows.md` says what each field means for a
//! Service proxy.

use std::time::{Duration, SystemTime};

use crate::wire::{DecodeError, Writer, fields};

/// `google.protobuf.Timestamp`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp {
    /// Seconds since the Unix epoch.
    pub seconds: i64,
    /// Nanoseconds into the second.
    pub nanos: i32,
}

impl Timestamp {
    /// The time `t`.
    pub fn of(t: SystemTime) -> Timestamp {
        match t.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(d) => Timestamp {
                seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                nanos: d.subsec_nanos() as i32,
            },
            Err(_) => Timestamp::default(),
        }
    }

    /// As a time (before the epoch: the epoch).
    pub fn time(self) -> SystemTime {
        let secs = u64::try_from(self.seconds).unwrap_or(0);
        let nanos = u32::try_from(self.nanos).unwrap_or(0).min(999_999_999);
        SystemTime::UNIX_EPOCH + Duration::new(secs, nanos)
    }

    fn write(self, w: &mut Writer) {
        w.int(1, self.seconds);
        w.int(2, i64::from(self.nanos));
    }

    fn read(b: &[u8]) -> Result<Timestamp, DecodeError> {
        let mut t = Timestamp::default();
        for f in fields(b) {
            let f = f?;
            match f.number {
                1 => t.seconds = f.int()?,
                2 => t.nanos = f.int()? as i32,
                _ => {}
            }
        }
        Ok(t)
    }
}

/// `flow.Verdict`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// `FORWARDED` (1).
    Forwarded = 1,
    /// `DROPPED` (2).
    Dropped = 2,
}

/// `flow.DropReason`: the codes verdict's refusals map to, Cilium's
/// datapath numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// `POLICY_DENIED` (133): the client is outside
    /// `loadBalancerSourceRanges`.
    PolicyDenied = 133,
    /// `STALE_OR_UNROUTABLE_IP` (151): an address of the service CIDRs no
    /// Service has.
    StaleOrUnroutableIp = 151,
    /// `SERVICE_BACKEND_NOT_FOUND` (158): no usable endpoint, none on
    /// this node under the Local policy, or a port of a ClusterIP that its
    /// Service does not have.
    ServiceBackendNotFound = 158,
}

/// `flow.Layer4`'s protocols verdict proxies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum L4 {
    /// `TCP` (field 1).
    Tcp,
    /// `UDP` (field 2).
    Udp,
    /// `SCTP` (field 5).
    Sctp,
}

impl L4 {
    fn field(self) -> u32 {
        match self {
            L4::Tcp => 1,
            L4::Udp => 2,
            L4::Sctp => 5,
        }
    }

    /// Hubble's name in a filter's `protocol` (lower-case).
    pub fn name(self) -> &'static str {
        match self {
            L4::Tcp => "tcp",
            L4::Udp => "udp",
            L4::Sctp => "sctp",
        }
    }
}

/// `flow.Workload`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Workload {
    /// Its name.
    pub name: String,
    /// Its kind (`Deployment`, ...).
    pub kind: String,
}

/// `flow.Endpoint`: one side of a flow.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Endpoint {
    /// Its numeric identity (0: unknown; 2: world).
    pub identity: u32,
    /// Its pod's namespace, when known.
    pub namespace: String,
    /// Its labels, `source:key=value`.
    pub labels: Vec<String>,
    /// Its pod, when known.
    pub pod_name: String,
    /// Its workloads.
    pub workloads: Vec<Workload>,
}

impl Endpoint {
    fn write(&self, w: &mut Writer, mask: &Mask<'_>) {
        if mask.keeps("identity") {
            w.uint(2, u64::from(self.identity));
        }
        if mask.keeps("namespace") {
            w.string(3, &self.namespace);
        }
        if mask.keeps("labels") {
            w.strings(4, self.labels.iter().map(String::as_str));
        }
        if mask.keeps("pod_name") {
            w.string(5, &self.pod_name);
        }
        if mask.keeps("workloads") {
            for wl in &self.workloads {
                w.message(6, |m| {
                    m.string(1, &wl.name);
                    m.string(2, &wl.kind);
                });
            }
        }
    }
}

/// `GetFlowsRequest.field_mask`: the fields of a flow a client wants, by
/// their names in Hubble's definitions (`time`, `IP`, `source.pod_name`,
/// ...); no paths is every field. Names verdict does not fill are kept
/// as asked and simply absent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldMask {
    /// The paths, dot-separated.
    pub paths: Vec<String>,
}

impl FieldMask {
    fn read(b: &[u8]) -> Result<FieldMask, DecodeError> {
        let mut m = FieldMask::default();
        for f in fields(b) {
            let f = f?;
            if f.number == 1 {
                m.paths.push(f.string()?.to_owned());
            }
        }
        Ok(m)
    }

    /// The mask at the top of a flow.
    pub fn top(&self) -> Mask<'_> {
        Mask {
            paths: &self.paths,
            under: "",
        }
    }
}

/// A field mask seen from one message of a flow.
#[derive(Clone, Copy, Debug)]
pub struct Mask<'a> {
    paths: &'a [String],
    /// The path of this message, with its trailing dot (`source.`), or
    /// nothing at the top.
    under: &'a str,
}

impl<'a> Mask<'a> {
    /// Whether the field `name` of this message is sent: no mask, a path
    /// naming it or a part of it, or a path naming a message around it.
    pub fn keeps(&self, name: &str) -> bool {
        if self.paths.is_empty() {
            return true;
        }
        self.paths.iter().any(|p| {
            let Some(rest) = p.strip_prefix(self.under) else {
                // A path naming a message around this one keeps it whole.
                return self
                    .under
                    .strip_prefix(p.as_str())
                    .is_some_and(|r| r.starts_with('.'));
            };
            rest == name || rest.strip_prefix(name).is_some_and(|r| r.starts_with('.'))
        })
    }

    /// The mask inside the field `name` (a message), whose path
    /// `under` spells with its trailing dot.
    fn inside(&self, under: &'a str) -> Mask<'a> {
        Mask {
            paths: self.paths,
            under,
        }
    }
}

/// `flow.Flow`: the fields verdict fills.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flow {
    /// When it was seen.
    pub time: Timestamp,
    /// Forwarded or dropped.
    pub verdict: Verdict,
    /// Why it was dropped.
    pub drop_reason: Option<DropReason>,
    /// Source address.
    pub source_ip: std::net::IpAddr,
    /// Destination address: the endpoint's once DNATed, else the one
    /// the client asked for.
    pub destination_ip: std::net::IpAddr,
    /// The protocol and ports.
    pub l4: L4,
    /// Source port.
    pub source_port: u16,
    /// Destination port.
    pub destination_port: u16,
    /// The client.
    pub source: Endpoint,
    /// The endpoint (or the address asked for).
    pub destination: Endpoint,
    /// The node that saw it.
    pub node_name: String,
    /// The Service it went to: (namespace, name).
    pub destination_service: Option<(String, String)>,
    /// `Summary`: what verdict says of it in words.
    pub summary: String,
}

/// `CiliumEventType.type` of a trace and of a drop.
const EVENT_DROP: i64 = 1;
const EVENT_TRACE: i64 = 4;
/// `TraceObservationPoint` / the trace's `sub_type`: to-endpoint is 0 in
/// the datapath's numbering, `TO_ENDPOINT` (101) in the enum.
const TO_ENDPOINT_SUB_TYPE: i64 = 0;
const TO_ENDPOINT_POINT: u64 = 101;
/// `TrafficDirection.INGRESS`: towards the Service's endpoint.
const INGRESS: u64 = 1;
/// `FlowType.L3_L4`.
const L3_L4: u64 = 1;

impl Flow {
    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        self.write(&mut w, &FieldMask::default().top());
        w.finish()
    }

    fn write(&self, w: &mut Writer, mask: &Mask<'_>) {
        let keeps = |name| mask.keeps(name);
        if keeps("time") {
            w.message(1, |m| self.time.write(m));
        }
        if keeps("verdict") {
            w.uint(2, self.verdict as u64);
        }
        if let Some(r) = self.drop_reason
            && keeps("drop_reason")
        {
            w.uint(3, r as u64);
        }
        if keeps("IP") {
            w.message(5, |m| {
                m.string(1, &self.source_ip.to_string());
                m.string(2, &self.destination_ip.to_string());
                m.uint(3, if self.source_ip.is_ipv4() { 1 } else { 2 });
            });
        }
        if keeps("l4") {
            w.message(6, |m| {
                m.message(self.l4.field(), |p| {
                    p.uint(1, u64::from(self.source_port));
                    p.uint(2, u64::from(self.destination_port));
                })
            });
        }
        if keeps("source") {
            w.message(8, |m| self.source.write(m, &mask.inside("source.")));
        }
        if keeps("destination") {
            w.message(9, |m| {
                self.destination.write(m, &mask.inside("destination."))
            });
        }
        if keeps("Type") {
            w.uint(10, L3_L4);
        }
        if keeps("node_name") {
            w.string(11, &self.node_name);
        }
        if keeps("event_type") {
            w.message(19, |m| match self.drop_reason {
                Some(r) => {
                    m.int(1, EVENT_DROP);
                    m.int(2, r as i64);
                }
                None => {
                    m.int(1, EVENT_TRACE);
                    m.int(2, TO_ENDPOINT_SUB_TYPE);
                }
            });
        }
        if let Some((ns, name)) = &self.destination_service
            && keeps("destination_service")
        {
            w.message(21, |m| {
                m.string(1, name);
                m.string(2, ns);
            });
        }
        if keeps("traffic_direction") {
            w.uint(22, INGRESS);
        }
        if self.drop_reason.is_none() && keeps("trace_observation_point") {
            w.uint(24, TO_ENDPOINT_POINT);
        }
        if let Some(r) = self.drop_reason
            && keeps("drop_reason_desc")
        {
            w.uint(25, r as u64);
        }
        // is_reply: a BoolValue, false (an empty message): the first
        // packet, from the client.
        if keeps("is_reply") {
            w.message(26, |_| {});
        }
        if keeps("Summary") {
            w.string(100_000, &self.summary);
        }
    }
}

/// `observer.GetFlowsResponse` carrying a flow, its fields as `mask`
/// says (the response's own `node_name` and `time` always: Relay orders
/// the nodes' flows by them).
pub fn flows_response(flow: &Flow, mask: &FieldMask) -> Vec<u8> {
    let mut w = Writer::new();
    w.message(1, |m| flow.write(m, &mask.top()));
    w.string(1000, &flow.node_name);
    w.message(1001, |m| flow.time.write(m));
    w.finish()
}

/// `flow.FlowFilter`: the fields verdict evaluates. A filter that sets a
/// field about what verdict's flows do not carry (DNS, HTTP, a label
/// verdict does not know, ...) matches no flow.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowFilter {
    /// `source_ip` (1): addresses or CIDRs.
    pub source_ip: Vec<String>,
    /// `source_pod` (2): `ns/` or `ns/pod-prefix`.
    pub source_pod: Vec<String>,
    /// `destination_ip` (3).
    pub destination_ip: Vec<String>,
    /// `destination_pod` (4).
    pub destination_pod: Vec<String>,
    /// `verdict` (5).
    pub verdict: Vec<u64>,
    /// `protocol` (12).
    pub protocol: Vec<String>,
    /// `source_port` (13).
    pub source_port: Vec<String>,
    /// `destination_port` (14).
    pub destination_port: Vec<String>,
    /// `reply` (15).
    pub reply: Vec<bool>,
    /// `destination_service` (17): `ns/` or `ns/name-prefix`.
    pub destination_service: Vec<String>,
    /// `source_label` (10).
    pub source_label: Vec<String>,
    /// `destination_label` (11).
    pub destination_label: Vec<String>,
    /// `node_name` (24).
    pub node_name: Vec<String>,
    /// Field numbers set that verdict does not evaluate: the filter
    /// matches nothing.
    pub unsupported: Vec<u32>,
}

impl FlowFilter {
    fn read(b: &[u8]) -> Result<FlowFilter, DecodeError> {
        let mut f = FlowFilter::default();
        for field in fields(b) {
            let field = field?;
            let s = || field.string().map(str::to_owned);
            match field.number {
                1 => f.source_ip.push(s()?),
                2 => f.source_pod.push(s()?),
                3 => f.destination_ip.push(s()?),
                4 => f.destination_pod.push(s()?),
                5 => field.uints(&mut f.verdict)?,
                10 => f.source_label.push(s()?),
                11 => f.destination_label.push(s()?),
                12 => f.protocol.push(s()?),
                13 => f.source_port.push(s()?),
                14 => f.destination_port.push(s()?),
                15 => {
                    let mut v = Vec::new();
                    field.uints(&mut v)?;
                    f.reply.extend(v.into_iter().map(|x| x != 0));
                }
                17 => f.destination_service.push(s()?),
                24 => f.node_name.push(s()?),
                n => f.unsupported.push(n),
            }
        }
        Ok(f)
    }
}

/// `observer.GetFlowsRequest`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GetFlowsRequest {
    /// `number` (1): how many flows.
    pub number: u64,
    /// `follow` (3).
    pub follow: bool,
    /// `blacklist` (5).
    pub blacklist: Vec<FlowFilter>,
    /// `whitelist` (6).
    pub whitelist: Vec<FlowFilter>,
    /// `since` (7).
    pub since: Option<Timestamp>,
    /// `until` (8).
    pub until: Option<Timestamp>,
    /// `first` (9): the oldest `number` flows instead of the newest.
    pub first: bool,
    /// `field_mask` (10): the fields of each flow to send.
    pub field_mask: FieldMask,
}

impl GetFlowsRequest {
    /// Reads the request (extensions are ignored).
    pub fn decode(b: &[u8]) -> Result<GetFlowsRequest, DecodeError> {
        let mut r = GetFlowsRequest::default();
        for f in fields(b) {
            let f = f?;
            match f.number {
                1 => r.number = f.uint()?,
                3 => r.follow = f.bool()?,
                5 => r.blacklist.push(FlowFilter::read(f.bytes()?)?),
                6 => r.whitelist.push(FlowFilter::read(f.bytes()?)?),
                7 => r.since = Some(Timestamp::read(f.bytes()?)?),
                8 => r.until = Some(Timestamp::read(f.bytes()?)?),
                9 => r.first = f.bool()?,
                10 => r.field_mask = FieldMask::read(f.bytes()?)?,
                _ => {}
            }
        }
        Ok(r)
    }
}

/// `observer.ServerStatusResponse`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServerStatus {
    /// Flows held now.
    pub num_flows: u64,
    /// The most held.
    pub max_flows: u64,
    /// Flows seen since start.
    pub seen_flows: u64,
    /// Since start.
    pub uptime_ns: u64,
    /// The server's version.
    pub version: String,
    /// Flows a second, lately.
    pub flows_rate: f64,
}

impl ServerStatus {
    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.uint(1, self.num_flows);
        w.uint(2, self.max_flows);
        w.uint(3, self.seen_flows);
        w.uint(4, self.uptime_ns);
        w.string(8, &self.version);
        w.double(9, self.flows_rate);
        w.finish()
    }
}

/// `observer.GetNodesResponse` of one node, connected: its name, its
/// Hubble address, whether it speaks TLS, and its counts.
pub fn nodes_response(name: &str, address: &str, tls: bool, status: &ServerStatus) -> Vec<u8> {
    let mut w = Writer::new();
    w.message(1, |n| {
        n.string(1, name);
        n.string(2, &status.version);
        n.string(3, address);
        // relay.NodeState NODE_CONNECTED.
        n.uint(4, 1);
        n.message(5, |t| t.bool(1, tls));
        n.uint(6, status.uptime_ns);
        n.uint(7, status.num_flows);
        n.uint(8, status.max_flows);
        n.uint(9, status.seen_flows);
    });
    w.finish()
}

/// `observer.GetNamespacesResponse`: `namespaces`, each in no cluster
/// name (verdict knows none).
pub fn namespaces_response<'a>(namespaces: impl IntoIterator<Item = &'a str>) -> Vec<u8> {
    let mut w = Writer::new();
    for ns in namespaces {
        w.message(1, |n| n.string(2, ns));
    }
    w.finish()
}

/// `grpc.health.v1.HealthCheckRequest`'s `service`.
pub fn health_service(b: &[u8]) -> Result<String, DecodeError> {
    let mut service = String::new();
    for f in fields(b) {
        let f = f?;
        if f.number == 1 {
            service = f.string()?.to_owned();
        }
    }
    Ok(service)
}

/// `grpc.health.v1.HealthCheckResponse` saying `SERVING` (1).
pub fn health_serving() -> Vec<u8> {
    let mut w = Writer::new();
    w.uint(1, 1);
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow() -> Flow {
        Flow {
            time: Timestamp {
                seconds: 1_796_534_732,
                nanos: 5,
            },
            verdict: Verdict::Dropped,
            drop_reason: Some(DropReason::ServiceBackendNotFound),
            source_ip: "10.0.0.2".parse().unwrap(),
            destination_ip: "172.30.0.41".parse().unwrap(),
            l4: L4::Tcp,
            source_port: 40000,
            destination_port: 80,
            source: Endpoint {
                namespace: "front".into(),
                pod_name: "ui-0".into(),
                labels: vec!["k8s:app=ui".into()],
                ..Endpoint::default()
            },
            destination: Endpoint::default(),
            node_name: "node-a".into(),
            destination_service: Some(("shop".into(), "web".into())),
            summary: "shop/web".into(),
        }
    }

    /// The field numbers of a message.
    fn numbers(b: &[u8]) -> Vec<u32> {
        fields(b).map(|f| f.unwrap().number).collect()
    }

    fn field(b: &[u8], n: u32) -> Vec<u8> {
        fields(b)
            .map(Result::unwrap)
            .find(|f| f.number == n)
            .map(|f| f.bytes().unwrap().to_vec())
            .unwrap_or_default()
    }

    #[test]
    fn a_field_mask_keeps_what_it_names_by_hubbles_names() {
        // What `hubble observe` sends for its compact output.
        let cli = FieldMask {
            paths: [
                "time",
                "verdict",
                "ethernet",
                "IP",
                "l4",
                "source.identity",
                "source.namespace",
                "source.pod_name",
                "destination.identity",
                "destination.namespace",
                "destination.pod_name",
                "Type",
                "node_name",
                "l7",
                "event_type",
                "source_service",
                "destination_service",
                "is_reply",
                "Summary",
                "ip_trace_id",
            ]
            .map(str::to_owned)
            .to_vec(),
        };
        let response = flows_response(&flow(), &cli);
        assert_eq!(numbers(&response), [1, 1000, 1001], "node and time always");
        let f = field(&response, 1);
        assert_eq!(
            numbers(&f),
            [1, 2, 5, 6, 8, 9, 10, 11, 19, 21, 26, 100_000],
            "no drop_reason (3), traffic_direction (22), drop_reason_desc (25)"
        );
        // Identity 0 is the default, left out as proto3 does.
        assert_eq!(numbers(&field(&f, 8)), [3, 5], "source without labels");

        // No mask: every field; a path naming a message keeps it whole.
        let whole = field(&flows_response(&flow(), &FieldMask::default()), 1);
        assert_eq!(
            numbers(&whole),
            [1, 2, 3, 5, 6, 8, 9, 10, 11, 19, 21, 22, 25, 26, 100_000]
        );
        let source = FieldMask {
            paths: vec!["source".into()],
        };
        let f = field(&flows_response(&flow(), &source), 1);
        assert_eq!(numbers(&f), [8]);
        assert_eq!(numbers(&field(&f, 8)), [3, 4, 5]);
        // A name that only starts like a field is not that field.
        let near = FieldMask {
            paths: vec!["source_service".into(), "times".into()],
        };
        assert!(numbers(&field(&flows_response(&flow(), &near), 1)).is_empty());
    }

    #[test]
    fn a_request_carries_its_field_mask() {
        let mut w = Writer::new();
        w.uint(1, 20);
        w.message(10, |m| {
            m.string(1, "time");
            m.string(1, "source.pod_name");
        });
        let r = GetFlowsRequest::decode(&w.finish()).unwrap();
        assert_eq!(r.number, 20);
        assert_eq!(r.field_mask.paths, ["time", "source.pod_name"]);
    }
}
