//! The introspection answers as text for a terminal, from the same typed
//! answers the API serves as JSON: what an operator reads is what a script
//! gets with `-o json`.

use std::fmt::Write as _;

use super::answers::{
    ConnectionsAnswer, ExplainAnswer, ExplainPortDetail, ForeignAnswer, Origin, OtherPort,
    PortCounts, ReadFrom, ReadHow, ServicesPage, SyncsAnswer, TraceAnswer, TraceStep,
};

fn p(v: f64) -> String {
    format!("p={v:.2}")
}

fn origin(from: Origin) -> &'static str {
    match from {
        Origin::Pod => "a pod",
        Origin::Node => "the node",
        Origin::External => "an external client",
    }
}

fn source(doc: &TraceAnswer) -> String {
    match doc.source {
        ReadFrom::Kernel => format!(
            "read back from the kernel in {:.1} ms{}",
            doc.read_ms,
            if doc.read == ReadHow::Targeted {
                ", the elements the packet met only"
            } else {
                ""
            }
        ),
        ReadFrom::Memory => "built in memory from the manifests (offline)".into(),
    }
}

/// One line per outcome: `DNAT to … (p=0.50), masqueraded`.
fn outcomes(doc: &TraceAnswer) -> Vec<String> {
    doc.outcomes
        .iter()
        .map(|o| {
            let passed = !matches!(o.output.as_str(), "DROP" | "REJECT");
            let masq = match (passed, o.masquerade) {
                (false, _) => "",
                (true, true) => ", masqueraded",
                (true, false) => ", not masqueraded",
            };
            format!("{} ({}){masq}", o.reason, p(o.probability))
        })
        .collect()
}

/// `verdict trace`.
pub fn trace(doc: &TraceAnswer) -> String {
    let mut out = String::new();
    let pkt = &doc.packet;
    let sport = pkt.sport.map(|p| format!(":{p}")).unwrap_or_default();
    let _ = writeln!(
        out,
        "trace: {} {}{sport} → {} port {} from {}",
        pkt.proto,
        pkt.src,
        pkt.dst,
        pkt.dport,
        origin(pkt.from),
    );
    let _ = writeln!(out, "table: {} {}, {}", doc.family, doc.table, source(doc));
    if let Some(svc) = &doc.service {
        let _ = writeln!(out, "service: {svc}");
    }
    let outs = outcomes(doc);
    let _ = writeln!(out, "verdict: {}", outs.join("\n         "));
    let mut first: Vec<String> = Vec::new();
    for (i, path) in doc.paths.iter().enumerate() {
        let _ = writeln!(
            out,
            "\npath {} of {}, {}: {}",
            i + 1,
            doc.paths.len(),
            p(path.probability),
            path.reason
        );
        let steps: Vec<String> = path.steps.iter().map(step).collect();
        // Later paths differ from the first only after a random choice:
        // what they share is said once.
        let shared = if i == 0 {
            0
        } else {
            steps.iter().zip(&first).take_while(|(a, b)| a == b).count()
        };
        if shared > 0 {
            let _ = writeln!(out, "  (steps 1-{shared} as in path 1)");
        }
        for (n, st) in steps.iter().enumerate().skip(shared) {
            let _ = write!(out, "  {:>2}. {st}", n + 1);
        }
        if path.masquerade {
            let _ = writeln!(out, "      masqueraded in postrouting");
        }
        for u in &path.updates {
            let _ = writeln!(out, "      records @{} {{ {} }}", u.set, u.element);
        }
        if i == 0 {
            first = steps;
        }
    }
    out
}

fn step(st: &TraceStep) -> String {
    let mut line = format!("{:<11} {:<28} {}\n", st.hook, st.chain, st.rule);
    for l in &st.lookups {
        let found = match (l.found, &l.value) {
            (true, Some(v)) => format!("→ {v}"),
            (true, None) => "found".into(),
            _ => "not found".into(),
        };
        let owner = l
            .service
            .as_ref()
            .map(|o| format!("  [{o}]"))
            .unwrap_or_default();
        let _ = writeln!(line, "      {:<40} @{} {} {found}{owner}", "", l.set, l.key);
    }
    line
}

/// The part of `explain` about one port the Service has.
fn port_detail(out: &mut String, d: &ExplainPortDetail) {
    let _ = writeln!(out, "    entry points:");
    for e in &d.entry_points {
        let at = match e.kind.as_str() {
            "NodePort" => {
                let addrs = e.addresses.clone().unwrap_or_default();
                format!(
                    "NodePort {} on {}",
                    e.port.unwrap_or(0),
                    if addrs.is_empty() {
                        "no address".to_owned()
                    } else {
                        addrs.join(", ")
                    }
                )
            }
            kind => format!("{kind} {}", e.address.as_deref().unwrap_or("")),
        };
        let ranges = match &e.source_ranges {
            Some(r) if !r.is_empty() => format!(", only from {}", r.join(", ")),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "      {at}{ranges}\n        policy {}: {}",
            e.traffic_policy, e.masquerade
        );
    }
    match d.session_affinity_seconds {
        Some(t) => {
            let _ = writeln!(out, "    session affinity: ClientIP, {t} s");
        }
        None => {
            let _ = writeln!(out, "    session affinity: none");
        }
    }
    if let Some(hc) = &d.health_check_node_port {
        let _ = writeln!(
            out,
            "    health-check node port {}: answers {} (localEndpoints {})",
            hc.port, hc.code, hc.local_endpoints
        );
    }
    if d.endpoints.is_empty() {
        let _ = writeln!(out, "    endpoints: none");
    } else {
        let _ = writeln!(out, "    endpoints:");
    }
    for ep in &d.endpoints {
        let mut state: Vec<String> = [
            (ep.ready, "ready"),
            (ep.serving, "serving"),
            (ep.terminating, "terminating"),
            (ep.local, "local"),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, w)| w.to_owned())
        .collect();
        if let Some(z) = &ep.zone {
            state.push(format!("zone {z}"));
        }
        let used = if ep.used_by.is_empty() {
            "UNUSED".to_owned()
        } else {
            format!(
                "used by the {} list",
                ep.used_by
                    .iter()
                    .map(|l| l.as_str())
                    .collect::<Vec<_>>()
                    .join(" and ")
            )
        };
        let counted = ep
            .connections
            .map(|c| format!("  [{c} connections, {} bytes]", ep.bytes.unwrap_or(0)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "      {:<24} {:<32} {used}: {}{counted}",
            ep.address,
            state.join(" "),
            ep.why
        );
    }
    if let Some(c) = &d.counts {
        counts(out, c);
    }
    let _ = writeln!(out, "    kernel elements:");
    for el in &d.elements {
        let _ = writeln!(out, "      {:<22} {:<56} {}", el.set, el.element, el.kernel);
    }
    if !d.chains.is_empty() {
        let _ = writeln!(out, "    shared chains: {}", d.chains.join(", "));
    }
}

/// What the kernel counted for a port, as `explain` shows it.
fn counts(out: &mut String, c: &PortCounts) {
    match c.connections {
        Some(n) => {
            let _ = writeln!(
                out,
                "    counted ({} level): {n} connections, {} packets, {} bytes",
                c.level,
                c.packets.unwrap_or(0),
                c.bytes.unwrap_or(0)
            );
        }
        None => {
            let _ = writeln!(
                out,
                "    counted: rejects and drops only (choose it with --service-metrics for its connections)"
            );
        }
    }
    if c.problems.is_empty() {
        let _ = writeln!(out, "    rejected or dropped: none");
    }
    for p in &c.problems {
        let _ = writeln!(
            out,
            "    {} {}: {} connections ({}; last clients {})",
            p.verdict.as_str().to_uppercase(),
            p.reason,
            p.connections,
            p.what,
            if p.recent_clients.is_empty() {
                "-".to_owned()
            } else {
                p.recent_clients.join(", ")
            }
        );
    }
}

/// The ports of a Service's ClusterIP it does not have that clients
/// asked for.
fn other_ports(out: &mut String, ports: &[OtherPort]) {
    if ports.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nports it does not have, asked for at its ClusterIP:");
    for o in ports {
        let p = &o.problem;
        let _ = writeln!(
            out,
            "  {} port {} {}: {} {}: {} connections (last clients {})",
            o.family,
            o.port,
            o.protocol,
            p.verdict.as_str().to_uppercase(),
            p.reason,
            p.connections,
            if p.recent_clients.is_empty() {
                "-".to_owned()
            } else {
                p.recent_clients.join(", ")
            }
        );
    }
}

/// `verdict explain`.
pub fn explain(doc: &ExplainAnswer) -> String {
    let mut out = String::new();
    let name = format!("{}/{}", doc.namespace, doc.name);
    if !doc.found {
        let _ = writeln!(
            out,
            "Service {name}: not known to verdict (no such Service, or it has no proxied port)"
        );
        return out;
    }
    let _ = writeln!(out, "Service {name}");
    for fam in &doc.families {
        let src = match fam.source {
            Some(ReadFrom::Kernel) => format!(
                "kernel read back in {:.1} ms{}",
                fam.read_ms.unwrap_or(0.0),
                if fam.read == Some(ReadHow::Targeted) {
                    ", the Service's elements only"
                } else {
                    ""
                }
            ),
            Some(ReadFrom::Memory) => "built in memory".into(),
            None => "kernel not read".into(),
        };
        let _ = writeln!(
            out,
            "\n{} (table {} {}, {src})",
            fam.family, fam.family, fam.table
        );
        for port in &fam.ports {
            let pname = match port.port.as_str() {
                "" => "(unnamed)",
                n => n,
            };
            let service_port = port
                .detail
                .as_ref()
                .map(|d| format!(" {}", d.service_port))
                .unwrap_or_default();
            let _ = writeln!(out, "  port {pname} {}{service_port}", port.protocol);
            if let Some(q) = &port.quarantined {
                let _ = writeln!(
                    out,
                    "    QUARANTINED: the kernel refused it ({q}); it is left out until it changes"
                );
            }
            if let Some(d) = &port.detail {
                port_detail(&mut out, d);
            }
        }
    }
    other_ports(&mut out, &doc.other_ports);
    let d = &doc.drift;
    match d.extra {
        None if d.missing + d.differs == 0 => {
            let _ = writeln!(
                out,
                "\ndrift: none in the elements verdict intends for this Service (elements it does not want are looked for with --full, which reads the whole table)"
            );
        }
        None => {
            let _ = writeln!(
                out,
                "\ndrift: {} missing, {} differing (the next full sync repairs it; one runs at once after a foreign change; --full also looks for unwanted elements)",
                d.missing, d.differs,
            );
        }
        Some(0) if d.missing + d.differs == 0 => {
            let _ = writeln!(
                out,
                "\ndrift: none (the kernel holds what verdict intends for this Service)"
            );
        }
        Some(extra) => {
            let _ = writeln!(
                out,
                "\ndrift: {} missing, {} differing, {extra} extra (the next full sync repairs it; one runs at once after a foreign change)",
                d.missing, d.differs,
            );
        }
    }
    out
}

/// `verdict services`.
pub fn services(doc: &ServicesPage) -> String {
    let mut out = format!(
        "{:<48} {:<5} {:<12} {:<6} {:<40} {:<9} {:<24} {}\n",
        "SERVICE", "FAM", "PORT", "PROTO", "CLUSTER-IP:PORT", "NODEPORT", "ENDPOINTS", "COUNTED"
    );
    for item in &doc.items {
        let name = format!("{}/{}", item.namespace, item.name);
        for port in &item.ports {
            let np = port
                .node_port
                .map(|n| n.to_string())
                .unwrap_or_else(|| "-".into());
            let mut eps = format!(
                "{}/{} ready, {} local",
                port.ready, port.endpoints, port.local
            );
            if port.quarantined {
                eps.push_str(", QUARANTINED");
            }
            let pname = match port.port.as_str() {
                "" => "-",
                n => n,
            };
            let counted = match &port.counts {
                None => "-".to_owned(),
                Some(c) => {
                    let mut parts = Vec::new();
                    if let Some(n) = c.connections {
                        parts.push(format!("{n} connections"));
                    }
                    for p in &c.problems {
                        parts.push(format!("{} {} {}", p.connections, p.verdict, p.reason));
                    }
                    if parts.is_empty() {
                        "no rejects or drops".to_owned()
                    } else {
                        parts.join(", ")
                    }
                }
            };
            let _ = writeln!(
                out,
                "{name:<48} {:<5} {pname:<12} {:<6} {:<40} {np:<9} {eps:<24} {counted}",
                port.family,
                port.protocol,
                format!("{}:{}", port.cluster_ip, port.service_port),
            );
        }
        for o in &item.other_ports {
            let _ = writeln!(
                out,
                "{name:<48} {:<5} {:<12} {:<6} {:<40} {:<9} {:<24} {} {} {}",
                o.family,
                format!("({})", o.port),
                o.protocol,
                "not a port of it",
                "-",
                "-",
                o.problem.connections,
                o.problem.verdict,
                o.problem.reason,
            );
        }
    }
    let _ = writeln!(
        out,
        "{} of {} Services (offset {})",
        doc.items.len(),
        doc.total,
        doc.offset
    );
    out
}

/// `verdict syncs`.
pub fn syncs(doc: &SyncsAnswer) -> String {
    let mut out = format!(
        "{:<28} {:<4} {:<8} {:<30} {:>9} {:>6} {:>8}  {}\n",
        "AT", "FAM", "KIND", "TRIGGER", "MS", "OPS", "SERVICES", "ERROR / SERVICES"
    );
    for r in &doc.items {
        let kind = if r.full { "full" } else { "partial" };
        let detail = match &r.error {
            Some(e) => format!("FAILED: {e}"),
            None => r.sample.join(", "),
        };
        let _ = writeln!(
            out,
            "{:<28} {:<4} {kind:<8} {:<30} {:>9.2} {:>6} {:>8}  {detail}",
            r.at, r.family, r.trigger, r.ms, r.operations, r.services,
        );
    }
    let _ = writeln!(out, "{} syncs since start", doc.total);
    out
}

/// The foreign changes part of `verdict syncs`.
pub fn foreign(doc: &ForeignAnswer) -> String {
    let mut out = format!(
        "\n{} foreign changes to verdict's tables since start{}\n",
        doc.total,
        if doc.items.is_empty() { "" } else { ":" }
    );
    for r in &doc.items {
        let who = if r.lost {
            "announcements were lost (the kernel's buffer overflowed)".to_owned()
        } else {
            format!(
                "{} (pid {}) changed {} objects: {}",
                r.process.as_deref().unwrap_or(""),
                r.pid.unwrap_or(0),
                r.changes,
                r.sample.join("; ")
            )
        };
        let _ = writeln!(out, "{:<28} {who}", r.at);
    }
    out
}

/// `verdict connections`.
pub fn connections(doc: &ConnectionsAnswer) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} connections to Services in the conntrack table ({} other DNATed connections)",
        doc.total, doc.not_services
    );
    for svc in &doc.services {
        let _ = writeln!(
            out,
            "\n{}:{} {}: {} connections{}",
            svc.service,
            svc.port,
            svc.protocol,
            svc.flows,
            if svc.stale > 0 {
                format!(", {} STALE", svc.stale)
            } else {
                String::new()
            }
        );
        if svc.closed_to_gone > 0 {
            let _ = writeln!(
                out,
                "  and {} closed (TIME_WAIT, …) to endpoints that are gone, which conntrack still lists",
                svc.closed_to_gone
            );
        }
        for ep in &svc.endpoints {
            let _ = writeln!(
                out,
                "  {:<28} {:>6}{}",
                ep.endpoint,
                ep.flows,
                if ep.stale {
                    "  GONE: the endpoint is no longer the Service's"
                } else {
                    ""
                }
            );
        }
    }
    if !doc.flows.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<5} {:<12} {:<28} {:<28} {:<28} {:>8}  SERVICE",
            "PROTO", "STATE", "CLIENT", "ENTRY", "ENDPOINT", "EXPIRES"
        );
    }
    let mut policies = std::collections::BTreeSet::new();
    for f in &doc.flows {
        let _ = writeln!(
            out,
            "{:<5} {:<12} {:<28} {:<28} {:<28} {:>7}s  {}{}",
            f.proto,
            f.state,
            f.client,
            f.entry,
            f.endpoint,
            f.expires_in,
            f.service,
            if f.stale { "  STALE" } else { "" }
        );
        if let Some(p) = &f.what_verdict_does {
            policies.insert((f.proto, p.clone()));
        }
    }
    if doc.flows.len() < doc.total {
        let _ = writeln!(out, "(the first {} listed)", doc.flows.len());
    }
    for (proto, p) in policies {
        let _ = writeln!(out, "\nstale {proto} connections: {p}");
    }
    out
}

/// `verdict trace --live`: the kernel's own trace beside the typed one.
pub fn live(doc: &TraceAnswer) -> String {
    let Some(live) = &doc.live else {
        return String::new();
    };
    let mut out = String::from("\nthe kernel's own trace of one real packet (nftrace):\n");
    for (i, st) in live.kernel.steps.iter().enumerate() {
        let _ = writeln!(
            out,
            "  {:>2}. {:<28} {}{}",
            i + 1,
            st.chain,
            st.rule,
            st.verdict
                .as_ref()
                .map(|v| format!("  ({v})"))
                .unwrap_or_default()
        );
    }
    match &live.kernel.dnat {
        Some(d) => {
            let _ = writeln!(out, "  the kernel sent it to {d}");
        }
        None => {
            let _ = writeln!(out, "  the kernel did not rewrite its destination");
        }
    }
    if live.agree {
        let _ = writeln!(
            out,
            "verdict's trace and the kernel's agree: the same chains, in order, to the same place"
        );
    } else {
        let _ = writeln!(
            out,
            "verdict's trace and the kernel's DISAGREE: verdict expects chains {}",
            live.typed_chains.join(" → ")
        );
    }
    out
}
