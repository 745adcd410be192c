//! verdict's protocol definitions (`crates/hubble/proto/*.proto`) are the
//! judge of its hand-written protocol code: every field the encoder
//! writes is one the definitions declare, at that number and with that
//! wire type, in every nested message; every field name a field mask may
//! use selects the number the definitions give it; and every filter field
//! the definitions declare is read by the decoder. The definitions'
//! names and numbers are Hubble's (../shared/reference/hubble-api.md).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use verdict_hubble::peer::{self, Change, Peer};
use verdict_hubble::proto::{
    self, DropReason, Endpoint, FieldMask, Flow, GetFlowsRequest, L4, ServerStatus, Timestamp,
    Verdict, Workload,
};
use verdict_hubble::wire::{Writer, fields};

/// A field as declared: its name, its type (qualified) and whether it is
/// repeated.
#[derive(Clone, Debug)]
struct Declared {
    name: String,
    ty: String,
    repeated: bool,
}

/// Every message of the definitions by qualified name, its fields by
/// number; and every enum's qualified name.
struct Definitions {
    messages: BTreeMap<String, BTreeMap<u32, Declared>>,
    enums: BTreeSet<String>,
}

const SCALARS_VARINT: [&str; 6] = ["uint32", "uint64", "int32", "int64", "bool", "sint32"];

impl Definitions {
    /// Reads every `.proto` file of `dir`; a line it cannot read fails.
    fn read(dir: &Path) -> Definitions {
        let mut d = Definitions {
            messages: BTreeMap::new(),
            enums: BTreeSet::new(),
        };
        // The well-known types verdict uses, as Google defines them.
        let wkt = [
            (
                "google.protobuf.Timestamp",
                vec![(1, "seconds", "int64", false), (2, "nanos", "int32", false)],
            ),
            (
                "google.protobuf.BoolValue",
                vec![(1, "value", "bool", false)],
            ),
            (
                "google.protobuf.FieldMask",
                vec![(1, "paths", "string", true)],
            ),
        ];
        for (name, fs) in wkt {
            d.messages.insert(
                name.to_owned(),
                fs.into_iter()
                    .map(|(n, f, t, r)| {
                        (
                            n,
                            Declared {
                                name: f.into(),
                                ty: t.into(),
                                repeated: r,
                            },
                        )
                    })
                    .collect(),
            );
        }
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "proto"))
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no .proto in {}", dir.display());
        let mut pending = Vec::new();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            let mut package = String::new();
            // What the enclosing braces are: a message (its name), or
            // something else (an enum, a oneof, a service).
            let mut scopes: Vec<Option<String>> = Vec::new();
            for (i, line) in text.lines().enumerate() {
                let line = line.split("//").next().unwrap().trim();
                let at = || format!("{}:{}: {line}", f.display(), i + 1);
                if line.is_empty()
                    || line.starts_with("syntax")
                    || line.starts_with("import")
                    || line.starts_with("rpc ")
                {
                    continue;
                }
                if let Some(p) = line.strip_prefix("package ") {
                    package = p.trim_end_matches(';').to_owned();
                    continue;
                }
                let words: Vec<&str> = line.split_whitespace().collect();
                match words.as_slice() {
                    ["message", name, "{}"] => {
                        d.messages
                            .insert(format!("{package}.{name}"), BTreeMap::new());
                    }
                    ["message", name, "{"] => {
                        let full = format!("{package}.{name}");
                        d.messages.insert(full.clone(), BTreeMap::new());
                        scopes.push(Some(full));
                    }
                    ["enum", name, "{"] => {
                        d.enums.insert(format!("{package}.{name}"));
                        scopes.push(None);
                    }
                    ["oneof", _, "{"] | ["service", _, "{"] => scopes.push(None),
                    ["}"] => {
                        scopes
                            .pop()
                            .unwrap_or_else(|| panic!("unmatched: {}", at()));
                    }
                    _ => {
                        // A field of the innermost message, or an enum value.
                        let message = scopes.iter().rev().find_map(|s| s.clone());
                        // An enum's value: `NAME = N;`.
                        if words.get(1) == Some(&"=") {
                            continue;
                        }
                        let (repeated, rest) = match words.as_slice() {
                            ["repeated", rest @ ..] => (true, rest),
                            rest => (false, rest),
                        };
                        let [ty, name, "=", number] = rest else {
                            panic!("cannot read {}", at());
                        };
                        let number: u32 = number
                            .trim_end_matches(';')
                            .parse()
                            .unwrap_or_else(|_| panic!("{}", at()));
                        let message = message
                            .unwrap_or_else(|| panic!("a field outside a message: {}", at()));
                        pending.push((
                            message,
                            number,
                            (*ty).to_owned(),
                            (*name).to_owned(),
                            repeated,
                            package.clone(),
                            at(),
                        ));
                    }
                }
            }
            assert!(scopes.is_empty(), "{}: unclosed braces", f.display());
        }
        // Types resolve once every file is read: qualified, the field's
        // own package, or a scalar.
        for (message, number, ty, name, repeated, package, at) in pending {
            let local = format!("{package}.{ty}");
            let scalar = SCALARS_VARINT.contains(&ty.as_str()) || ty == "string" || ty == "double";
            let known = |t: &str| d.messages.contains_key(t) || d.enums.contains(t);
            let ty = if scalar || known(&ty) {
                ty
            } else if known(&local) {
                local
            } else {
                panic!("unknown type {ty}: {at}");
            };
            let old = d
                .messages
                .get_mut(&message)
                .unwrap()
                .insert(number, Declared { name, ty, repeated });
            assert!(old.is_none(), "number {number} twice: {at}");
        }
        d
    }

    /// Checks every field of `bytes` against the message `message`,
    /// recursively; the paths of the fields seen (`source.pod_name`).
    fn check(&self, message: &str, bytes: &[u8], under: &str, seen: &mut BTreeSet<String>) {
        let declared = self
            .messages
            .get(message)
            .unwrap_or_else(|| panic!("no message {message} in the definitions"));
        let mut once = BTreeSet::new();
        for f in fields(bytes) {
            let f = f.unwrap();
            let d = declared.get(&f.number).unwrap_or_else(|| {
                panic!("{message} has no field {} in the definitions", f.number)
            });
            assert!(
                d.repeated || once.insert(f.number),
                "{message}.{} is not repeated but sent twice",
                d.name
            );
            let path = format!("{under}{}", d.name);
            let ty = d.ty.as_str();
            let ok = if SCALARS_VARINT.contains(&ty) || self.enums.contains(ty) {
                f.uint().is_ok()
            } else if ty == "double" {
                f.double().is_ok()
            } else if ty == "string" {
                f.string().is_ok()
            } else {
                let inner = f
                    .bytes()
                    .unwrap_or_else(|_| panic!("{path}: not a message"));
                self.check(ty, inner, &format!("{path}."), seen);
                true
            };
            assert!(
                ok,
                "{message}.{} (#{}) has the wrong wire type for {ty}",
                d.name, f.number
            );
            seen.insert(path);
        }
    }

    fn fields_of(&self, message: &str) -> &BTreeMap<u32, Declared> {
        &self.messages[message]
    }
}

fn definitions() -> Definitions {
    Definitions::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("proto"))
}

/// A flow with every field verdict can fill set.
fn full_flow(drop: Option<DropReason>) -> Flow {
    let end = |pod: &str| Endpoint {
        identity: 7,
        namespace: "shop".into(),
        labels: vec!["k8s:app=web".into()],
        pod_name: pod.into(),
        workloads: vec![Workload {
            name: "web".into(),
            kind: "Deployment".into(),
        }],
    };
    Flow {
        time: Timestamp {
            seconds: 1_796_534_732,
            nanos: 5,
        },
        verdict: if drop.is_some() {
            Verdict::Dropped
        } else {
            Verdict::Forwarded
        },
        drop_reason: drop,
        source_ip: "10.0.0.2".parse().unwrap(),
        destination_ip: "10.180.0.1".parse().unwrap(),
        l4: L4::Tcp,
        source_port: 40000,
        destination_port: 8080,
        source: end("ui-0"),
        destination: end("web-0"),
        node_name: "node-a".into(),
        destination_service: Some(("shop".into(), "web".into())),
        summary: "shop/web".into(),
    }
}

#[test]
fn every_field_sent_is_declared_at_its_number_and_wire_type() {
    let d = definitions();
    let mut seen = BTreeSet::new();
    for drop in [None, Some(DropReason::ServiceBackendNotFound)] {
        for l4 in [L4::Tcp, L4::Udp, L4::Sctp] {
            let flow = Flow {
                l4,
                ..full_flow(drop)
            };
            let response = proto::flows_response(&flow, &FieldMask::default());
            d.check("observer.GetFlowsResponse", &response, "", &mut seen);
        }
    }
    // Every field of flow.proto's Flow is one verdict fills.
    let flow_fields: BTreeSet<String> = d
        .fields_of("flow.Flow")
        .values()
        .map(|f| format!("flow.{}", f.name))
        .collect();
    let sent: BTreeSet<String> = seen
        .iter()
        .filter(|p| p.starts_with("flow.") && p.matches('.').count() == 1)
        .cloned()
        .collect();
    assert_eq!(
        sent, flow_fields,
        "a declared field verdict never sends, or the reverse"
    );

    let status = ServerStatus {
        num_flows: 1,
        max_flows: 2,
        seen_flows: 3,
        uptime_ns: 4,
        version: "verdict".into(),
        flows_rate: 0.5,
    };
    let mut s = BTreeSet::new();
    d.check(
        "observer.ServerStatusResponse",
        &status.encode(),
        "",
        &mut s,
    );
    assert_eq!(s.len(), d.fields_of("observer.ServerStatusResponse").len());
    d.check(
        "observer.GetNodesResponse",
        &proto::nodes_response("node-a", "10.0.0.1:4244", true, &status),
        "",
        &mut s,
    );
    d.check(
        "observer.GetNamespacesResponse",
        &proto::namespaces_response(["shop"]),
        "",
        &mut s,
    );
    d.check(
        "grpc.health.v1.HealthCheckResponse",
        &proto::health_serving(),
        "",
        &mut s,
    );
    let p = Peer {
        name: "node-a".into(),
        address: "10.0.0.1:4244".into(),
        tls_server_name: Some("node-a.default.hubble-grpc.cilium.io".into()),
    };
    let mut n = BTreeSet::new();
    d.check(
        "peer.ChangeNotification",
        &peer::notification(&p, Change::Updated),
        "",
        &mut n,
    );
    assert_eq!(
        n.into_iter().collect::<Vec<_>>(),
        ["address", "name", "tls", "tls.server_name", "type"]
    );
}

#[test]
fn each_name_a_field_mask_may_use_selects_its_declared_number() {
    let d = definitions();
    let masked = |flow: &Flow, path: &str| -> Vec<u8> {
        let mask = FieldMask {
            paths: vec![path.to_owned()],
        };
        let response = proto::flows_response(flow, &mask);
        fields(&response)
            .map(Result::unwrap)
            .find(|x| x.number == 1)
            .unwrap()
            .bytes()
            .unwrap()
            .to_vec()
    };
    let numbers = |b: &[u8]| -> Vec<u32> { fields(b).map(|x| x.unwrap().number).collect() };
    // A forwarded flow and a dropped one: between them, every field.
    let flows = [full_flow(None), full_flow(Some(DropReason::PolicyDenied))];
    for (number, f) in d.fields_of("flow.Flow") {
        let mut got = BTreeSet::new();
        for flow in &flows {
            let n = numbers(&masked(flow, &f.name));
            assert!(n.iter().all(|x| x == number), "mask {:?}: {n:?}", f.name);
            got.extend(n);
        }
        assert_eq!(
            got.into_iter().collect::<Vec<_>>(),
            [*number],
            "mask {:?}",
            f.name
        );
    }
    let flow = &flows[1];
    for (number, f) in d.fields_of("flow.Endpoint") {
        let outer = masked(flow, &format!("source.{}", f.name));
        let source = fields(&outer)
            .map(Result::unwrap)
            .find(|x| x.number == 8)
            .unwrap();
        assert_eq!(
            numbers(source.bytes().unwrap()),
            [*number],
            "mask source.{}",
            f.name
        );
    }
}

#[test]
fn every_declared_request_field_is_read() {
    let d = definitions();
    // Each field of a filter, set alone at its declared number, is read
    // into the field of that name (not left as "unsupported").
    for (number, f) in d.fields_of("flow.FlowFilter") {
        let mut filter = Writer::new();
        if f.ty == "string" {
            filter.string(*number, "x");
        } else {
            filter.uint(*number, 1);
        }
        let mut request = Writer::new();
        let filter = filter.finish();
        request.bytes(6, &filter);
        let r = GetFlowsRequest::decode(&request.finish()).unwrap();
        let read = format!("{:?}", r.whitelist[0]);
        assert!(
            read.contains(&format!("{}: [", f.name))
                && !read.contains(&format!("{}: []", f.name))
                && read.contains("unsupported: []"),
            "{}: {read}",
            f.name
        );
    }
    // The request's own fields, at their declared numbers.
    let number_of = |name: &str| {
        d.fields_of("observer.GetFlowsRequest")
            .iter()
            .find(|(_, f)| f.name == name)
            .map(|(n, _)| *n)
            .unwrap()
    };
    let mut w = Writer::new();
    w.uint(number_of("number"), 20);
    w.bool(number_of("follow"), true);
    w.bool(number_of("first"), true);
    w.message(number_of("since"), |t| t.int(1, 10));
    w.message(number_of("until"), |t| t.int(1, 20));
    w.message(number_of("field_mask"), |m| m.string(1, "time"));
    w.message(number_of("blacklist"), |f| f.string(1, "10.0.0.1"));
    let r = GetFlowsRequest::decode(&w.finish()).unwrap();
    assert_eq!((r.number, r.follow, r.first), (20, true, true));
    assert_eq!(r.since.map(|t| t.seconds), Some(10));
    assert_eq!(r.until.map(|t| t.seconds), Some(20));
    assert_eq!(r.field_mask.paths, ["time"]);
    assert_eq!(r.blacklist.len(), 1);
    let mut h = Writer::new();
    h.string(1, "hubble.server.Observer");
    assert_eq!(
        proto::health_service(&h.finish()).unwrap(),
        "hubble.server.Observer"
    );
    let _ = d.fields_of("grpc.health.v1.HealthCheckRequest");
}
