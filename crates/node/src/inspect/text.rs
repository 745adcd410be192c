//! The introspection answers as text for a terminal. Each function reads
//! the JSON the API serves, so what an operator reads is what a script
//! gets with `-o json`.

use std::fmt::Write as _;

use serde_json::Value as Json;

fn s(v: &Json) -> &str {
    v.as_str().unwrap_or("")
}

/// The strings of a JSON list (nothing if it is not one).
fn strs(v: &Json) -> Vec<&str> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Json::as_str)
        .collect()
}

fn p(v: &Json) -> String {
    format!("p={:.2}", v.as_f64().unwrap_or(0.0))
}

fn origin(from: &str) -> &str {
    match from {
        "pod" => "a pod",
        "node" => "the node",
        _ => "an external client",
    }
}

fn source(doc: &Json) -> String {
    match s(&doc["source"]) {
        "kernel" => format!(
            "read back from the kernel in {:.1} ms{}",
            doc["read_ms"].as_f64().unwrap_or(0.0),
            if doc["read"] == "targeted" {
                ", the elements the packet met only"
            } else {
                ""
            }
        ),
        "memory" => "built in memory from the manifests (offline)".into(),
        other => other.to_owned(),
    }
}

/// One line per outcome: `DNAT to … (p=0.50), masqueraded`.
fn outcomes(doc: &Json) -> Vec<String> {
    doc["outcomes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            let passed = !matches!(s(&o["output"]), "DROP" | "REJECT");
            let masq = match (passed, o["masquerade"] == true) {
                (false, _) => "",
                (true, true) => ", masqueraded",
                (true, false) => ", not masqueraded",
            };
            format!("{} ({}){masq}", s(&o["reason"]), p(&o["probability"]))
        })
        .collect()
}

/// `verdict trace`.
pub fn trace(doc: &Json) -> String {
    let mut out = String::new();
    let pkt = &doc["packet"];
    let sport = pkt["sport"]
        .as_u64()
        .map(|p| format!(":{p}"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "trace: {} {}{sport} → {} port {} from {}",
        s(&pkt["proto"]),
        s(&pkt["src"]),
        s(&pkt["dst"]),
        pkt["dport"],
        origin(s(&pkt["from"])),
    );
    let _ = writeln!(
        out,
        "table: {} {}, {}",
        s(&doc["family"]),
        s(&doc["table"]),
        source(doc)
    );
    if let Some(svc) = doc["service"].as_str() {
        let _ = writeln!(out, "service: {svc}");
    }
    let outs = outcomes(doc);
    let _ = writeln!(out, "verdict: {}", outs.join("\n         "));
    let paths = doc["paths"].as_array().cloned().unwrap_or_default();
    let mut first: Vec<String> = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let _ = writeln!(
            out,
            "\npath {} of {}, {}: {}",
            i + 1,
            paths.len(),
            p(&path["probability"]),
            s(&path["reason"])
        );
        let steps: Vec<String> = path["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .map(step)
            .collect();
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
        if path["masquerade"] == true {
            let _ = writeln!(out, "      masqueraded in postrouting");
        }
        for u in path["updates"].as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "      records @{} {{ {} }}",
                s(&u["set"]),
                s(&u["element"])
            );
        }
        if i == 0 {
            first = steps;
        }
    }
    out
}

fn step(st: &Json) -> String {
    let mut line = format!(
        "{:<11} {:<28} {}\n",
        s(&st["hook"]),
        s(&st["chain"]),
        s(&st["rule"])
    );
    for l in st["lookups"].as_array().into_iter().flatten() {
        let found = match (l["found"].as_bool(), l["value"].as_str()) {
            (Some(true), Some(v)) => format!("→ {v}"),
            (Some(true), None) => "found".into(),
            _ => "not found".into(),
        };
        let owner = l["service"]
            .as_str()
            .map(|o| format!("  [{o}]"))
            .unwrap_or_default();
        let _ = writeln!(
            line,
            "      {:<40} @{} {} {found}{owner}",
            "",
            s(&l["set"]),
            s(&l["key"])
        );
    }
    line
}

/// `verdict explain`.
pub fn explain(doc: &Json) -> String {
    let mut out = String::new();
    let name = format!("{}/{}", s(&doc["namespace"]), s(&doc["name"]));
    if doc["found"] != true {
        let _ = writeln!(
            out,
            "Service {name}: not known to verdict (no such Service, or it has no proxied port)"
        );
        return out;
    }
    let _ = writeln!(out, "Service {name}");
    for fam in doc["families"].as_array().into_iter().flatten() {
        let src = match fam["source"].as_str() {
            Some("kernel") => format!(
                "kernel read back in {:.1} ms{}",
                fam["read_ms"].as_f64().unwrap_or(0.0),
                if fam["read"] == "targeted" {
                    ", the Service's elements only"
                } else {
                    ""
                }
            ),
            Some(other) => other.to_owned(),
            None => "kernel not read".into(),
        };
        let _ = writeln!(
            out,
            "\n{} (table {} {}, {src})",
            s(&fam["family"]),
            s(&fam["family"]),
            s(&fam["table"])
        );
        for port in fam["ports"].as_array().into_iter().flatten() {
            let pname = match s(&port["port"]) {
                "" => "(unnamed)".to_owned(),
                n => n.to_owned(),
            };
            let _ = writeln!(
                out,
                "  port {pname} {} {}",
                s(&port["protocol"]),
                port["service_port"]
            );
            if let Some(q) = port["quarantined"].as_str() {
                let _ = writeln!(
                    out,
                    "    QUARANTINED: the kernel refused it ({q}); it is left out until it changes"
                );
            }
            if port.get("entry_points").is_none() {
                continue;
            }
            let _ = writeln!(out, "    entry points:");
            for e in port["entry_points"].as_array().into_iter().flatten() {
                let at = match s(&e["kind"]) {
                    "NodePort" => {
                        let addrs: Vec<&str> = strs(&e["addresses"]);
                        format!(
                            "NodePort {} on {}",
                            e["port"],
                            if addrs.is_empty() {
                                "no address".to_owned()
                            } else {
                                addrs.join(", ")
                            }
                        )
                    }
                    kind => format!("{kind} {}", s(&e["address"])),
                };
                let ranges: Vec<&str> = strs(&e["source_ranges"]);
                let ranges = if ranges.is_empty() {
                    String::new()
                } else {
                    format!(", only from {}", ranges.join(", "))
                };
                let _ = writeln!(
                    out,
                    "      {at}{ranges}\n        policy {}: {}",
                    s(&e["traffic_policy"]),
                    s(&e["masquerade"])
                );
            }
            match port["session_affinity_seconds"].as_u64() {
                Some(t) => {
                    let _ = writeln!(out, "    session affinity: ClientIP, {t} s");
                }
                None => {
                    let _ = writeln!(out, "    session affinity: none");
                }
            }
            if let Some(hc) = port["health_check_node_port"].as_object() {
                let _ = writeln!(
                    out,
                    "    health-check node port {}: answers {} (localEndpoints {})",
                    hc["port"], hc["code"], hc["local_endpoints"]
                );
            }
            let eps = port["endpoints"].as_array().cloned().unwrap_or_default();
            if eps.is_empty() {
                let _ = writeln!(out, "    endpoints: none");
            } else {
                let _ = writeln!(out, "    endpoints:");
            }
            for ep in &eps {
                let mut state = Vec::new();
                for (k, word) in [
                    ("ready", "ready"),
                    ("serving", "serving"),
                    ("terminating", "terminating"),
                    ("local", "local"),
                ] {
                    if ep[k] == true {
                        state.push(word.to_owned());
                    }
                }
                if let Some(z) = ep["zone"].as_str() {
                    state.push(format!("zone {z}"));
                }
                let used: Vec<&str> = strs(&ep["used_by"]);
                let used = if used.is_empty() {
                    "UNUSED".to_owned()
                } else {
                    format!("used by the {} list", used.join(" and "))
                };
                let _ = writeln!(
                    out,
                    "      {:<24} {:<32} {used}: {}",
                    s(&ep["address"]),
                    state.join(" "),
                    s(&ep["why"])
                );
            }
            let _ = writeln!(out, "    kernel elements:");
            for el in port["elements"].as_array().into_iter().flatten() {
                let _ = writeln!(
                    out,
                    "      {:<22} {:<56} {}",
                    s(&el["set"]),
                    s(&el["element"]),
                    s(&el["kernel"])
                );
            }
            let chains: Vec<&str> = strs(&port["chains"]);
            if !chains.is_empty() {
                let _ = writeln!(out, "    shared chains: {}", chains.join(", "));
            }
        }
    }
    let d = &doc["drift"];
    let n = |k: &str| d[k].as_u64().unwrap_or(0);
    let unchecked = d["extra"].is_null();
    if unchecked && n("missing") + n("differs") == 0 {
        let _ = writeln!(
            out,
            "\ndrift: none in the elements verdict intends for this Service (elements it does not want are looked for with --full, which reads the whole table)"
        );
    } else if unchecked {
        let _ = writeln!(
            out,
            "\ndrift: {} missing, {} differing (the next full sync repairs it; one runs at once after a foreign change; --full also looks for unwanted elements)",
            n("missing"),
            n("differs"),
        );
    } else if n("missing") + n("differs") + n("extra") == 0 {
        let _ = writeln!(
            out,
            "\ndrift: none (the kernel holds what verdict intends for this Service)"
        );
    } else {
        let _ = writeln!(
            out,
            "\ndrift: {} missing, {} differing, {} extra (the next full sync repairs it; one runs at once after a foreign change)",
            n("missing"),
            n("differs"),
            n("extra")
        );
    }
    out
}

/// `verdict services`.
pub fn services(doc: &Json) -> String {
    let mut out = format!(
        "{:<48} {:<5} {:<12} {:<6} {:<40} {:<9} {}\n",
        "SERVICE", "FAM", "PORT", "PROTO", "CLUSTER-IP:PORT", "NODEPORT", "ENDPOINTS"
    );
    for item in doc["items"].as_array().into_iter().flatten() {
        let name = format!("{}/{}", s(&item["namespace"]), s(&item["name"]));
        for port in item["ports"].as_array().into_iter().flatten() {
            let np = port["node_port"]
                .as_u64()
                .map(|n| n.to_string())
                .unwrap_or_else(|| "-".into());
            let mut eps = format!(
                "{}/{} ready, {} local",
                port["ready"], port["endpoints"], port["local"]
            );
            if port["quarantined"] == true {
                eps.push_str(", QUARANTINED");
            }
            let pname = match s(&port["port"]) {
                "" => "-",
                n => n,
            };
            let _ = writeln!(
                out,
                "{name:<48} {:<5} {pname:<12} {:<6} {:<40} {np:<9} {eps}",
                s(&port["family"]),
                s(&port["protocol"]),
                format!("{}:{}", s(&port["cluster_ip"]), port["service_port"]),
            );
        }
    }
    let shown = doc["items"].as_array().map_or(0, Vec::len);
    let _ = writeln!(
        out,
        "{shown} of {} Services (offset {})",
        doc["total"], doc["offset"]
    );
    out
}

/// `verdict syncs`.
pub fn syncs(doc: &Json) -> String {
    let mut out = format!(
        "{:<28} {:<4} {:<8} {:<30} {:>9} {:>6} {:>8}  {}\n",
        "AT", "FAM", "KIND", "TRIGGER", "MS", "OPS", "SERVICES", "ERROR / SERVICES"
    );
    for r in doc["items"].as_array().into_iter().flatten() {
        let kind = if r["full"] == true { "full" } else { "partial" };
        let detail = match r["error"].as_str() {
            Some(e) => format!("FAILED: {e}"),
            None => strs(&r["sample"]).join(", "),
        };
        let _ = writeln!(
            out,
            "{:<28} {:<4} {kind:<8} {:<30} {:>9.2} {:>6} {:>8}  {detail}",
            s(&r["at"]),
            s(&r["family"]),
            s(&r["trigger"]),
            r["ms"].as_f64().unwrap_or(0.0),
            r["operations"],
            r["services"],
        );
    }
    let _ = writeln!(out, "{} syncs since start", doc["total"]);
    out
}

/// The foreign changes part of `verdict syncs`.
pub fn foreign(doc: &Json) -> String {
    let items = doc["items"].as_array().cloned().unwrap_or_default();
    let mut out = format!(
        "\n{} foreign changes to verdict's tables since start{}\n",
        doc["total"],
        if items.is_empty() { "" } else { ":" }
    );
    for r in &items {
        let who = if r["lost"] == true {
            "announcements were lost (the kernel's buffer overflowed)".to_owned()
        } else {
            format!(
                "{} (pid {}) changed {} objects: {}",
                s(&r["process"]),
                r["pid"],
                r["changes"],
                strs(&r["sample"]).join("; ")
            )
        };
        let _ = writeln!(out, "{:<28} {who}", s(&r["at"]));
    }
    out
}

/// `verdict connections`.
pub fn connections(doc: &Json) -> String {
    let mut out = String::new();
    let services = doc["services"].as_array().cloned().unwrap_or_default();
    let _ = writeln!(
        out,
        "{} connections to Services in the conntrack table ({} other DNATed connections)",
        doc["total"], doc["not_services"]
    );
    for svc in &services {
        let stale = svc["stale"].as_u64().unwrap_or(0);
        let _ = writeln!(
            out,
            "\n{}:{} {}: {} connections{}",
            s(&svc["service"]),
            s(&svc["port"]),
            s(&svc["protocol"]),
            svc["flows"],
            if stale > 0 {
                format!(", {stale} STALE")
            } else {
                String::new()
            }
        );
        for ep in svc["endpoints"].as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "  {:<28} {:>6}{}",
                s(&ep["endpoint"]),
                ep["flows"],
                if ep["stale"] == true {
                    "  STALE: the endpoint is gone"
                } else {
                    ""
                }
            );
        }
    }
    let flows = doc["flows"].as_array().cloned().unwrap_or_default();
    if !flows.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<5} {:<12} {:<28} {:<28} {:<28} {:>8}  SERVICE",
            "PROTO", "STATE", "CLIENT", "ENTRY", "ENDPOINT", "EXPIRES"
        );
    }
    let mut policies = std::collections::BTreeSet::new();
    for f in &flows {
        let _ = writeln!(
            out,
            "{:<5} {:<12} {:<28} {:<28} {:<28} {:>7}s  {}{}",
            s(&f["proto"]),
            s(&f["state"]),
            s(&f["client"]),
            s(&f["entry"]),
            s(&f["endpoint"]),
            f["expires_in"],
            s(&f["service"]),
            if f["stale"] == true { "  STALE" } else { "" }
        );
        if let Some(p) = f["what_verdict_does"].as_str() {
            policies.insert((s(&f["proto"]).to_owned(), p.to_owned()));
        }
    }
    if flows.len() < doc["total"].as_u64().unwrap_or(0) as usize {
        let _ = writeln!(out, "(the first {} listed)", flows.len());
    }
    for (proto, p) in policies {
        let _ = writeln!(out, "\nstale {proto} connections: {p}");
    }
    out
}

/// `verdict trace --live`: the kernel's own trace beside the typed one.
pub fn live(doc: &Json) -> String {
    let live = &doc["live"];
    if live.is_null() {
        return String::new();
    }
    let mut out = String::from("\nthe kernel's own trace of one real packet (nftrace):\n");
    for (i, st) in live["kernel"]["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let _ = writeln!(
            out,
            "  {:>2}. {:<28} {}{}",
            i + 1,
            s(&st["chain"]),
            s(&st["rule"]),
            st["verdict"]
                .as_str()
                .map(|v| format!("  ({v})"))
                .unwrap_or_default()
        );
    }
    match live["kernel"]["dnat"].as_str() {
        Some(d) => {
            let _ = writeln!(out, "  the kernel sent it to {d}");
        }
        None => {
            let _ = writeln!(out, "  the kernel did not rewrite its destination");
        }
    }
    if live["agree"] == true {
        let _ = writeln!(
            out,
            "verdict's trace and the kernel's agree: the same chains, in order, to the same place"
        );
    } else {
        let typed: Vec<&str> = strs(&live["typed_chains"]);
        let _ = writeln!(
            out,
            "verdict's trace and the kernel's DISAGREE: verdict expects chains {}",
            typed.join(" → ")
        );
    }
    out
}
