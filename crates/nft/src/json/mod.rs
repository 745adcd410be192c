//! Reads `nft -j list table` back into the IR.
//!
//! The parser understands exactly the objects verdict writes (see
//! `crates/proxier/tests/golden`) as nftables v1.0.6 lists them, and refuses
//! everything else with [`NftError::Parse`] rather than guessing. What nft
//! does not report, or reports differently from how it was written:
//!
//! - Table and chain comments are not listed: they come back as `None`.
//! - A `typeof tcp dport` key field is listed as `inet_service`, so
//!   [`DataType::PortOf`] comes back as [`DataType::InetService`]
//!   ([`Set::same_type`] treats them as equal).
//! - `integer` (the type of a `typeof numgen …` field) is [`DataType::Numgen`].
//! - A dynamic set lists only the `timeout` flag; its default timeout becomes
//!   [`Set::timeout`].
//! - A host prefix in an interval set (`1.2.3.4/32`) is listed as a plain
//!   address. verdict's interval sets match an exact address in the leading
//!   field and networks after it (`firewall-allow`: service IP . protocol .
//!   port . source range), so a plain address becomes a host prefix except in
//!   the first field of a concatenation.
//! - nft folds `meta l4proto tcp … th dport` into `tcp dport` and drops the
//!   protocol match. A rule reading a `tcp`/`udp`/`sctp dport` without an
//!   explicit `meta l4proto` equality match gets the match back, placed just
//!   before the first expression that reads the port; the port is read as
//!   [`Selector::Dport`].
//! - nft 1.0.6 has no JSON form for `update @map { … : … }`: the statement is
//!   listed as its text, which is parsed here.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::{Map, Value as Json};

use crate::backend::{ChainState, Counter, SetState, TableState};

mod rules;

use crate::error::NftError;
use crate::ir::{
    BaseChain, Chain, ChainType, DataType, Element, ElementValue, Family, Hook, L4Proto, Set,
    Value, Verdict,
};
use rules::RuleParser;

/// Longest excerpt of an offending JSON value quoted in an error.
const EXCERPT_MAX: usize = 200;

pub(super) type Obj = Map<String, Json>;

/// Parses the JSON listing of one table (`nft -j list table FAMILY NAME`).
/// Objects of other tables are ignored.
pub fn parse_table(json: &str, family: Family, name: &str) -> Result<TableState, NftError> {
    let doc: Json = serde_json::from_str(json)
        .map_err(|e| NftError::Parse(format!("nft -j output is not JSON: {e}")))?;
    let items = doc
        .get("nftables")
        .and_then(Json::as_array)
        .ok_or_else(|| NftError::Parse("no \"nftables\" array in nft -j output".into()))?;
    let whole = format!("table {family} {name}");
    let err = |msg: String| NftError::Parse(format!("{whole}: {msg}"));

    let mut found = false;
    let mut chains: BTreeMap<String, ChainState> = BTreeMap::new();
    let mut set_objs: Vec<&Obj> = Vec::new();
    let mut rule_objs: Vec<&Obj> = Vec::new();
    for item in items {
        let (kind, body) =
            single(item).ok_or_else(|| err(format!("unexpected {}", excerpt(item))))?;
        if kind == "metainfo" {
            continue;
        }
        let body = body
            .as_object()
            .ok_or_else(|| err(format!("unexpected {}", excerpt(item))))?;
        if kind == "table" {
            if str_field(body, "family").ok() == Some(&family.to_string())
                && str_field(body, "name").ok() == Some(name)
            {
                found = true;
            }
            continue;
        }
        let ours = str_field(body, "family").ok() == Some(&family.to_string())
            && str_field(body, "table").ok() == Some(name);
        if !ours {
            continue;
        }
        match kind {
            "chain" => {
                let chain =
                    parse_chain(body).map_err(|m| err(format!("{m} in {}", excerpt(item))))?;
                chains.insert(
                    chain.name.clone(),
                    ChainState {
                        chain,
                        rules: Vec::new(),
                        counters: BTreeMap::new(),
                        handles: Vec::new(),
                    },
                );
            }
            "set" | "map" => set_objs.push(body),
            "rule" => rule_objs.push(body),
            other => {
                return Err(err(format!(
                    "unsupported object {other}: {}",
                    excerpt(item)
                )));
            }
        }
    }
    if !found {
        return Err(err("not in nft's output".into()));
    }

    let mut sets: BTreeMap<String, SetState> = BTreeMap::new();
    for body in set_objs {
        let s = parse_set(body).map_err(&err)?;
        sets.insert(s.set.name.clone(), s);
    }

    for body in rule_objs {
        let chain = str_field(body, "chain").map_err(|m| err(format!("rule: {m}")))?;
        let (rule, counter) = RuleParser::new(family, &sets)
            .parse(body)
            .map_err(|m| err(format!("chain {chain}: {m}")))?;
        let c = chains
            .get_mut(chain)
            .ok_or_else(|| err(format!("rule in unknown chain {chain}")))?;
        if let Some(counter) = counter {
            c.counters.insert(c.rules.len(), counter);
        }
        c.rules.push(rule);
    }

    Ok(TableState {
        comment: None,
        chains,
        sets,
    })
}

/// Parses the JSON listing of one set or map (`nft -j list map …`).
pub fn parse_set_listing(
    json: &str,
    family: Family,
    table: &str,
    set: &str,
) -> Result<SetState, NftError> {
    let doc: Json = serde_json::from_str(json)
        .map_err(|e| NftError::Parse(format!("nft -j output is not JSON: {e}")))?;
    let items = doc
        .get("nftables")
        .and_then(Json::as_array)
        .ok_or_else(|| NftError::Parse("no \"nftables\" array in nft -j output".into()))?;
    for item in items {
        let Some((kind, body)) = single(item) else {
            continue;
        };
        let Some(body) = body.as_object() else {
            continue;
        };
        if (kind == "set" || kind == "map")
            && str_field(body, "family").ok() == Some(&family.to_string())
            && str_field(body, "table").ok() == Some(table)
            && str_field(body, "name").ok() == Some(set)
        {
            return parse_set(body)
                .map_err(|m| NftError::Parse(format!("{family} {table} {set}: {m}")));
        }
    }
    Err(NftError::NotFound(format!(
        "set {set} in table {family} {table}"
    )))
}

// ---------------------------------------------------------------------------
// Small JSON helpers. Inner functions report a plain message; the caller adds
// where it happened.

/// The only key and value of a one-entry object (`{"accept": null}`).
pub(super) fn single(j: &Json) -> Option<(&str, &Json)> {
    let o = j.as_object()?;
    if o.len() != 1 {
        return None;
    }
    o.iter().next().map(|(k, v)| (k.as_str(), v))
}

/// Compact JSON text of a value, shortened for error messages.
pub(super) fn excerpt(j: &Json) -> String {
    let s = j.to_string();
    if s.len() <= EXCERPT_MAX {
        return s;
    }
    let mut end = EXCERPT_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

pub(super) fn str_field<'a>(o: &'a Obj, key: &str) -> Result<&'a str, String> {
    o.get(key)
        .and_then(Json::as_str)
        .ok_or_else(|| format!("missing string \"{key}\""))
}

pub(super) fn u32_of(j: &Json) -> Result<u32, String> {
    j.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| format!("{} is not a 32-bit number", excerpt(j)))
}

fn u32_field(o: &Obj, key: &str) -> Result<u32, String> {
    u32_of(
        o.get(key)
            .ok_or_else(|| format!("missing number \"{key}\""))?,
    )
}

/// A string or an array of strings (nft lists one-element lists either way).
pub(super) fn strings(j: &Json) -> Result<Vec<&str>, String> {
    match j {
        Json::String(s) => Ok(vec![s.as_str()]),
        Json::Array(a) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| format!("{} is not a string", excerpt(v)))
            })
            .collect(),
        _ => Err(format!("{} is not a string or list", excerpt(j))),
    }
}

/// `"@name"` → `name`.
pub(super) fn set_ref(j: &Json) -> Result<&str, String> {
    j.as_str().and_then(|s| s.strip_prefix('@')).ok_or_else(|| {
        format!(
            "{} is not a named set (anonymous sets are not supported)",
            excerpt(j)
        )
    })
}

// ---------------------------------------------------------------------------
// Chains and sets.

fn parse_chain(o: &Obj) -> Result<Chain, String> {
    let name = str_field(o, "name")?.to_owned();
    if let Some(dev) = o.get("dev") {
        return Err(format!("device {} is not supported", excerpt(dev)));
    }
    if !o.contains_key("hook") && !o.contains_key("type") && !o.contains_key("prio") {
        return Ok(Chain::regular(name));
    }
    let chain_type = match str_field(o, "type")? {
        "filter" => ChainType::Filter,
        "nat" => ChainType::Nat,
        t => return Err(format!("chain type {t} is not supported")),
    };
    let hook = match str_field(o, "hook")? {
        "prerouting" => Hook::Prerouting,
        "input" => Hook::Input,
        "forward" => Hook::Forward,
        "output" => Hook::Output,
        "postrouting" => Hook::Postrouting,
        h => return Err(format!("hook {h} is not supported")),
    };
    let priority = o
        .get("prio")
        .and_then(Json::as_i64)
        .and_then(|p| i32::try_from(p).ok())
        .ok_or("missing numeric \"prio\"")?;
    match o.get("policy").map(Json::as_str) {
        None | Some(Some("accept")) => {}
        Some(p) => return Err(format!("policy {p:?} is not supported")),
    }
    Ok(Chain {
        name,
        base: Some(BaseChain {
            chain_type,
            hook,
            priority,
        }),
        comment: None,
    })
}

pub(super) fn data_type(name: &str) -> Result<DataType, String> {
    Ok(match name {
        "ipv4_addr" => DataType::Ipv4Addr,
        "ipv6_addr" => DataType::Ipv6Addr,
        "inet_proto" => DataType::InetProto,
        "inet_service" => DataType::InetService,
        "integer" => DataType::Numgen,
        "verdict" => DataType::Verdict,
        t => return Err(format!("data type {t} is not supported")),
    })
}

/// `"ipv4_addr"`, `["ipv4_addr", "inet_service"]` or `"ipv4_addr . inet_service"`.
fn data_types(j: &Json) -> Result<Vec<DataType>, String> {
    let mut out = Vec::new();
    for s in strings(j)? {
        for t in s.split(" . ") {
            out.push(data_type(t.trim())?);
        }
    }
    Ok(out)
}

fn parse_set(o: &Obj) -> Result<SetState, String> {
    let name = str_field(o, "name")?;
    let inner = || -> Result<SetState, String> {
        let key = data_types(o.get("type").ok_or("missing \"type\"")?)?;
        let value = o.get("map").map(data_types).transpose()?;
        let mut set = Set {
            name: name.to_owned(),
            key,
            value,
            interval: false,
            timeout: None,
            size: None,
            counters: false,
            comment: o.get("comment").and_then(Json::as_str).map(str::to_owned),
        };
        // `"stmt": [{"counter": null}]`: every element has a counter.
        for stmt in o.get("stmt").and_then(Json::as_array).into_iter().flatten() {
            match stmt
                .as_object()
                .map(|s| s.keys().map(String::as_str).collect::<Vec<_>>())
            {
                Some(k) if k == ["counter"] => set.counters = true,
                _ => return Err(format!("set statement {} is not supported", excerpt(stmt))),
            }
        }
        if let Some(flags) = o.get("flags") {
            for f in strings(flags)? {
                match f {
                    "interval" => set.interval = true,
                    "timeout" => set.timeout = Some(0),
                    "dynamic" => {}
                    f => return Err(format!("flag {f} is not supported")),
                }
            }
        }
        if o.contains_key("timeout") {
            set.timeout = Some(u32_field(o, "timeout")?);
        }
        if o.contains_key("size") {
            set.size = Some(u32_field(o, "size")?);
        }
        let mut elements = BTreeMap::new();
        let mut counters = BTreeMap::new();
        if let Some(elems) = o.get("elem") {
            let elems = elems.as_array().ok_or("\"elem\" is not a list")?;
            for e in elems {
                let (element, counter) =
                    parse_element(&set, e).map_err(|m| format!("element {}: {m}", excerpt(e)))?;
                if let Some(c) = counter {
                    counters.insert(element.key.clone(), c);
                }
                elements.insert(element.key.clone(), element);
            }
        }
        Ok(SetState {
            set,
            elements,
            counters,
        })
    };
    inner().map_err(|m| format!("set {name}: {m}"))
}

/// `{"elem": {"val": X, "comment": …, "timeout": …, "counter": {…}}}` →
/// (X, comment, counter).
fn unwrap_elem(j: &Json) -> Result<(&Json, Option<String>, Option<Counter>), String> {
    match j.as_object().and_then(|o| o.get("elem")) {
        Some(inner) => {
            let val = inner.get("val").ok_or("element without \"val\"")?;
            let comment = inner
                .get("comment")
                .and_then(Json::as_str)
                .map(str::to_owned);
            let counter = match inner.get("counter").and_then(Json::as_object) {
                Some(c) => {
                    let n = |k: &str| {
                        c.get(k)
                            .and_then(Json::as_u64)
                            .ok_or_else(|| format!("counter without \"{k}\""))
                    };
                    Some(Counter {
                        packets: n("packets")?,
                        bytes: n("bytes")?,
                    })
                }
                None => None,
            };
            Ok((val, comment, counter))
        }
        None => Ok((j, None, None)),
    }
}

/// The fields of a (possibly concatenated) value of `n` fields.
pub(super) fn fields(j: &Json, n: usize) -> Result<Vec<&Json>, String> {
    let parts: Vec<&Json> = match j.as_object().and_then(|o| o.get("concat")) {
        Some(c) => c
            .as_array()
            .ok_or("\"concat\" is not a list")?
            .iter()
            .collect(),
        None => vec![j],
    };
    if parts.len() != n {
        return Err(format!("{} fields where the type has {n}", parts.len()));
    }
    Ok(parts)
}

fn parse_element(set: &Set, j: &Json) -> Result<(Element, Option<Counter>), String> {
    let (key_json, value_json) = match (&set.value, j) {
        (Some(_), Json::Array(pair)) if pair.len() == 2 => (&pair[0], Some(&pair[1])),
        (Some(_), _) => return Err("map element is not a [key, value] pair".into()),
        (None, _) => (j, None),
    };
    let (val, comment, counter) = unwrap_elem(key_json)?;
    let n = set.key.len();
    let key = fields(val, n)?
        .into_iter()
        .zip(&set.key)
        .enumerate()
        .map(|(i, (f, t))| constant(*t, f, set.interval && (n == 1 || i > 0)))
        .collect::<Result<Vec<_>, _>>()?;
    let value = match (&set.value, value_json) {
        (Some(types), Some(v)) if types.as_slice() == [DataType::Verdict] => {
            Some(ElementValue::Verdict(verdict(v)?))
        }
        (Some(types), Some(v)) => Some(ElementValue::Data(
            fields(v, types.len())?
                .into_iter()
                .zip(types)
                .map(|(f, t)| constant(*t, f, false))
                .collect::<Result<Vec<_>, _>>()?,
        )),
        _ => None,
    };
    Ok((
        Element {
            key: key.into(),
            value,
            comment: comment.map(String::into_boxed_str),
        },
        counter,
    ))
}

// ---------------------------------------------------------------------------
// Constants.

pub(super) fn addr_of_type(t: DataType, s: &str) -> Result<IpAddr, String> {
    let a: IpAddr = s.parse().map_err(|_| format!("{s:?} is not an address"))?;
    match (t, a) {
        (DataType::Ipv4Addr, IpAddr::V4(_)) | (DataType::Ipv6Addr, IpAddr::V6(_)) => Ok(a),
        _ => Err(format!("{s} is not a {}", t.type_name())),
    }
}

/// `{"prefix": {"addr": "10.0.0.0", "len": 8}}`.
fn prefix(t: DataType, j: &Json) -> Result<Option<IpNet>, String> {
    let Some(p) = j.as_object().and_then(|o| o.get("prefix")) else {
        return Ok(None);
    };
    let addr = p
        .get("addr")
        .and_then(Json::as_str)
        .ok_or("prefix without address")?;
    let len = p
        .get("len")
        .and_then(Json::as_u64)
        .and_then(|l| u8::try_from(l).ok())
        .ok_or("prefix without length")?;
    let net =
        IpNet::new(addr_of_type(t, addr)?, len).map_err(|e| format!("prefix {addr}/{len}: {e}"))?;
    Ok(Some(net))
}

pub(super) fn proto_name(s: &str) -> Option<L4Proto> {
    L4Proto::ALL
        .into_iter()
        .find(|p| p.to_string() == s || p.number().to_string() == s)
}

pub(super) fn proto(j: &Json) -> Result<L4Proto, String> {
    let p = match j {
        Json::String(s) => proto_name(s),
        Json::Number(n) => n.as_u64().and_then(|n| {
            L4Proto::ALL
                .into_iter()
                .find(|p| u64::from(p.number()) == n)
        }),
        _ => None,
    };
    p.ok_or_else(|| format!("{} is not tcp, udp or sctp", excerpt(j)))
}

pub(super) fn port(j: &Json) -> Result<u16, String> {
    let p = match j {
        Json::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
        Json::String(s) => s.parse().ok(),
        _ => None,
    };
    p.ok_or_else(|| format!("{} is not a port number", excerpt(j)))
}

/// A constant of type `t`. `host_prefix`: a plain address is a host network
/// (interval set fields that hold networks).
pub(super) fn constant(t: DataType, j: &Json, host_prefix: bool) -> Result<Value, String> {
    match t {
        DataType::Ipv4Addr | DataType::Ipv6Addr => {
            if let Some(net) = prefix(t, j)? {
                return Ok(Value::Prefix(net));
            }
            let s = j
                .as_str()
                .ok_or_else(|| format!("{} is not an address", excerpt(j)))?;
            let a = addr_of_type(t, s)?;
            Ok(if host_prefix {
                Value::Prefix(IpNet::from(a))
            } else {
                Value::Addr(a)
            })
        }
        DataType::InetProto => proto(j).map(Value::Proto),
        DataType::InetService | DataType::PortOf(_) => port(j).map(Value::Port),
        DataType::Numgen => u32_of(j).map(Value::Int),
        DataType::Verdict => Err("a verdict cannot be a key field".into()),
    }
}

/// `{"goto": {"target": "c"}}`, `{"accept": null}`, …
pub(super) fn verdict(j: &Json) -> Result<Verdict, String> {
    let (k, v) = single(j).ok_or_else(|| format!("{} is not a verdict", excerpt(j)))?;
    let target = || {
        v.get("target")
            .and_then(Json::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("{k} without target"))
    };
    Ok(match k {
        "accept" => Verdict::Accept,
        "drop" => Verdict::Drop,
        "return" => Verdict::Return,
        "jump" => Verdict::Jump(target()?),
        "goto" => Verdict::Goto(target()?),
        _ => return Err(format!("{} is not a supported verdict", excerpt(j))),
    })
}

/// Reads an nft duration: `3h`, `10m`, `1h2m3s`, `1d`, `100s`, `500ms`.
pub(super) fn duration_secs(s: &str) -> Result<u32, String> {
    let bad = || format!("{s:?} is not a duration");
    let mut total_ms: u64 = 0;
    let mut rest = s;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let ms_per = match &rest[..unit_len] {
            "d" => 86_400_000,
            "h" => 3_600_000,
            "m" => 60_000,
            "s" => 1_000,
            "ms" => 1,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        total_ms = n
            .checked_mul(ms_per)
            .and_then(|v| total_ms.checked_add(v))
            .ok_or_else(bad)?;
    }
    if !total_ms.is_multiple_of(1000) {
        return Err(format!("{s}: timeouts below a second are not supported"));
    }
    u32::try_from(total_ms / 1000).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{CmpOp, Expr, FibAddr, KeyPart, Rule, Selector};

    fn fixture(name: &str) -> TableState {
        let json = match name {
            "overall" => include_str!("../../tests/fixtures/overall.json"),
            "counted" => include_str!("../../tests/fixtures/counted.json"),
            "loadbalancer" => include_str!("../../tests/fixtures/loadbalancer.json"),
            "affinity-dynamic" => include_str!("../../tests/fixtures/affinity-dynamic.json"),
            "clusterip-ipv6" => include_str!("../../tests/fixtures/clusterip-ipv6.json"),
            "detector-prefix" => include_str!("../../tests/fixtures/detector-prefix.json"),
            "traffic-policy-local" => {
                include_str!("../../tests/fixtures/traffic-policy-local.json")
            }
            _ => panic!("no fixture {name}"),
        };
        let family = if name.contains("ipv6") {
            Family::Ip6
        } else {
            Family::Ip
        };
        parse_table(json, family, "verdict").unwrap()
    }

    fn addr(s: &str) -> Value {
        Value::Addr(s.parse().unwrap())
    }

    fn net(s: &str) -> Value {
        Value::Prefix(s.parse().unwrap())
    }

    fn l4(p: L4Proto) -> Expr {
        Expr::Cmp {
            selector: Selector::L4Proto,
            op: CmpOp::Eq,
            value: Value::Proto(p),
        }
    }

    #[test]
    fn reads_base_and_regular_chains() {
        let t = fixture("overall");
        assert_eq!(t.comment, None);
        assert_eq!(
            t.chains["nat-prerouting"].chain,
            Chain::base("nat-prerouting", ChainType::Nat, Hook::Prerouting, -100)
        );
        assert_eq!(
            t.chains["filter-output-pre-dnat"].chain,
            Chain::base(
                "filter-output-pre-dnat",
                ChainType::Filter,
                Hook::Output,
                -110
            )
        );
        // nft 1.0.6 does not list chain comments.
        assert_eq!(
            t.chains["reject-chain"].chain,
            Chain::regular("reject-chain")
        );
        // Each rejected connection is counted once, its retries not.
        let tuple = vec![
            Selector::Saddr,
            Selector::Daddr,
            Selector::L4Proto,
            Selector::Sport,
            Selector::Dport,
        ];
        assert_eq!(
            t.chains["reject-chain"].rules,
            vec![
                Rule::new(vec![
                    Expr::Lookup {
                        key: tuple.clone(),
                        set: "rejected-connections".into(),
                        negate: false,
                    },
                    Expr::Reject
                ])
                .with_comment("a retry of a connection already counted"),
                Rule::new(vec![
                    Expr::Update {
                        set: "rejected-connections".into(),
                        key: tuple.into_iter().map(KeyPart::Field).collect(),
                        timeout: None,
                        value: vec![],
                    },
                    Expr::Counter,
                    Expr::Reject
                ]),
                Rule::new(vec![Expr::Counter, Expr::Reject]).with_comment("the set is full"),
            ]
        );
    }

    #[test]
    fn reads_vmap_elements_with_comments() {
        let t = fixture("overall");
        let s = &t.sets["no-endpoint-services"];
        assert_eq!(
            s.set,
            Set::map(
                "no-endpoint-services",
                vec![
                    DataType::Ipv4Addr,
                    DataType::InetProto,
                    DataType::InetService
                ],
                vec![DataType::Verdict],
            )
            .with_comment("vmap to drop or reject packets to services with no endpoints")
        );
        let key = vec![
            addr("172.30.0.46"),
            Value::Proto(L4Proto::Tcp),
            Value::Port(80),
        ];
        assert_eq!(
            s.elements[key.as_slice()],
            Element::map(
                key.clone(),
                ElementValue::Verdict(Verdict::Goto("reject-chain".into()))
            )
            .with_comment("ns6/svc6:p80")
        );
        let key = vec![addr("1.2.3.4"), Value::Proto(L4Proto::Tcp), Value::Port(80)];
        assert_eq!(
            s.elements[key.as_slice()].value,
            Some(ElementValue::Verdict(Verdict::Goto(
                "drop-no-local-endpoint".into()
            )))
        );
        assert_eq!(s.elements.len(), 3);
        assert!(s.counters.is_empty());
    }

    #[test]
    fn reads_the_counters_of_counted_elements() {
        let t = fixture("counted");
        let s = &t.sets["service-connections"];
        assert!(s.set.counters);
        // Every element's counter is read (none has counted a packet in
        // the captured fixture).
        assert_eq!(s.elements.len(), 2);
        assert_eq!(s.counters.len(), 2);
        let key = vec![
            addr("172.30.0.44"),
            Value::Proto(L4Proto::Tcp),
            Value::Port(80),
        ];
        assert_eq!(s.counters[key.as_slice()], Counter::default());
        assert_eq!(t.sets["endpoint-connections"].counters.len(), 4);
    }

    #[test]
    fn reads_typeof_maps_with_numgen_slots() {
        let t = fixture("overall");
        let s = &t.sets["service-endpoints-tcp"];
        assert_eq!(
            s.set.key,
            vec![DataType::Ipv4Addr, DataType::InetService, DataType::Numgen]
        );
        assert_eq!(
            s.set.value,
            Some(vec![DataType::Ipv4Addr, DataType::InetService])
        );
        let declared = Set::map(
            "service-endpoints-tcp",
            vec![
                DataType::Ipv4Addr,
                DataType::PortOf(L4Proto::Tcp),
                DataType::Numgen,
            ],
            vec![DataType::Ipv4Addr, DataType::PortOf(L4Proto::Tcp)],
        );
        assert!(s.set.same_type(&declared));
        assert!(!s.set.same_type(&Set {
            counters: true,
            ..declared.clone()
        }));
        let key = vec![addr("172.30.0.44"), Value::Port(80), Value::Int(1)];
        assert_eq!(
            s.elements[key.as_slice()],
            Element::map(
                key.clone(),
                ElementValue::Data(vec![addr("10.180.0.5"), Value::Port(80)])
            )
        );
    }

    #[test]
    fn restores_the_protocol_match_nft_folds_into_the_port() {
        let t = fixture("overall");
        let rules = &t.chains["affinity-timeout-10800"].rules;
        assert_eq!(rules.len(), 3);
        assert_eq!(
            rules[0],
            Rule::new(vec![
                l4(L4Proto::Tcp),
                Expr::Update {
                    set: "affinity".into(),
                    key: vec![
                        KeyPart::Field(Selector::Saddr),
                        KeyPart::Field(Selector::CtOriginalDaddr),
                        KeyPart::Field(Selector::L4Proto),
                        KeyPart::Field(Selector::CtOriginalDport),
                    ],
                    timeout: Some(10800),
                    value: vec![
                        KeyPart::Field(Selector::Daddr),
                        KeyPart::Field(Selector::Dport)
                    ],
                },
            ])
        );
        assert_eq!(rules[2].exprs[0], l4(L4Proto::Sctp));
        let dnat = &t.chains["endpoints-2"].rules[1];
        assert_eq!(
            dnat.render(Family::Ip),
            "meta l4proto tcp dnat ip addr . port to ip daddr . th dport . numgen random mod 2 map @service-endpoints-tcp"
        );
        // An explicit match is kept as it is, and not doubled.
        let record = &t.chains["affinity-record"].rules[0];
        assert_eq!(
            record.render(Family::Ip),
            "meta l4proto tcp ct original ip daddr . meta l4proto . ct original proto-dst vmap @affinity-services"
        );
    }

    #[test]
    fn interval_elements_come_back_as_prefixes() {
        let t = fixture("loadbalancer");
        let s = &t.sets["firewall-allow"];
        assert!(s.set.interval);
        let host = vec![
            addr("1.2.3.4"),
            Value::Proto(L4Proto::Tcp),
            Value::Port(80),
            net("1.2.3.4/32"),
        ];
        assert!(
            s.elements.contains_key(host.as_slice()),
            "{:?}",
            s.elements.keys()
        );
        let range = vec![
            addr("5.6.7.8"),
            Value::Proto(L4Proto::Tcp),
            Value::Port(80),
            net("203.0.113.0/25"),
        ];
        assert!(s.elements.contains_key(range.as_slice()));
        assert_eq!(s.elements.len(), 8);
    }

    #[test]
    fn reads_dynamic_affinity_elements() {
        let t = fixture("affinity-dynamic");
        let s = &t.sets["affinity"];
        assert_eq!(s.set.timeout, Some(10800));
        assert_eq!(s.set.size, Some(1_048_576));
        assert_eq!(s.set.comment.as_deref(), Some("ClientIP session affinity"));
        let key = vec![
            addr("10.0.0.2"),
            addr("172.30.0.41"),
            Value::Proto(L4Proto::Tcp),
            Value::Port(80),
        ];
        assert_eq!(
            s.elements.values().collect::<Vec<_>>(),
            vec![&Element::map(
                key,
                ElementValue::Data(vec![addr("10.180.0.1"), Value::Port(80)])
            )]
        );
        // The timeout of a rule is read from its text form (`10m`).
        let Expr::Update { timeout, .. } = &t.chains["affinity-timeout-600"].rules[0].exprs[1]
        else {
            panic!("not an update");
        };
        assert_eq!(*timeout, Some(600));
    }

    #[test]
    fn reads_ipv6_and_interface_and_fib_matches() {
        let t = fixture("clusterip-ipv6");
        assert_eq!(
            t.chains["cluster-ips-check"].rules[1].render(Family::Ip6),
            "ip6 daddr fd00:10:96::/112 goto drop-unallocated comment \"Drop traffic to unallocated ClusterIPs\""
        );
        let t = fixture("detector-prefix");
        let found = t.chains.values().flat_map(|c| &c.rules).any(|r| {
            r.exprs.contains(&Expr::IifName {
                name: "veth*".into(),
                negate: true,
            })
        });
        assert!(found);
        let t = fixture("traffic-policy-local");
        let found = t
            .chains
            .values()
            .flat_map(|c| &c.rules)
            .any(|r| r.exprs.first() == Some(&Expr::FibLocal(FibAddr::Saddr)));
        assert!(found);
    }

    #[test]
    fn reads_other_shapes() {
        let json = include_str!("../../tests/fixtures/extra.json");
        let t = parse_table(json, Family::Ip, "x").unwrap();
        let rules: Vec<String> = t.chains["c"]
            .rules
            .iter()
            .map(|r| r.render(Family::Ip))
            .collect();
        assert_eq!(
            rules,
            [
                "meta l4proto tcp dnat to 10.1.1.1:80",
                "meta l4proto tcp th dport < 1024 accept",
                "ip daddr 10.0.0.1 meta l4proto udp th dport 53 return",
                "meta mark & 0x00004000 == 0x00000000 jump d",
                "ip daddr 10.0.0.1 meta l4proto sctp drop",
                "meta l4proto tcp update @affinity { ip saddr . 172.30.0.45 . 6 . 80 timeout 10800s : ip daddr . th dport }",
                "meta l4proto tcp update @affinity { ip saddr . ip daddr . meta l4proto . th dport timeout 3723s : 10.1.1.1 . 8080 }",
                "meta l4proto udp update @affinity { ip saddr . ip daddr . meta l4proto . th dport timeout 90000s : ip daddr . th dport }",
                "update @seen { ip saddr timeout 30s }",
                "update @seen { ip saddr }",
                "fib daddr type local drop",
                "ip saddr @iv accept",
                "ip saddr != @iv accept",
                "meta l4proto tcp ip daddr . th dport vmap @v",
            ]
        );
        let iv: Vec<&[Value]> = t.sets["iv"].elements.keys().map(|k| &k[..]).collect();
        assert_eq!(iv, [&vec![net("1.2.3.4/32")], &vec![net("10.0.0.0/8")]]);
        let v = &t.sets["v"].elements;
        assert_eq!(
            v[&[addr("10.0.0.1"), Value::Port(80)][..]]
                .comment
                .as_deref(),
            Some("it's a comment: with . dots")
        );
        assert_eq!(
            v[&[addr("10.0.0.3"), Value::Port(8443)][..]].value,
            Some(ElementValue::Verdict(Verdict::Jump("d".into())))
        );

        let json = include_str!("../../tests/fixtures/extra6.json");
        let t = parse_table(json, Family::Ip6, "x").unwrap();
        let rules: Vec<String> = t.chains["c"]
            .rules
            .iter()
            .map(|r| r.render(Family::Ip6))
            .collect();
        assert_eq!(
            rules,
            [
                "meta l4proto tcp dnat to [fd00::1]:80",
                "ip6 saddr fd00::/64 ip6 daddr fd00::1 reject",
                "ip6 daddr . meta l4proto . th dport . ip6 saddr @iv accept",
            ]
        );
        let iv: Vec<&[Value]> = t.sets["iv"].elements.keys().map(|k| &k[..]).collect();
        assert_eq!(iv[0][0], addr("fd00::1"));
        assert_eq!(iv[0][3], net("fd00::2/128"));
    }

    #[test]
    fn reads_durations() {
        for (s, secs) in [
            ("3h", 10800),
            ("10m", 600),
            ("1h2m3s", 3723),
            ("100s", 100),
            ("1d", 86400),
            ("1d1h", 90000),
            ("2000ms", 2),
        ] {
            assert_eq!(duration_secs(s), Ok(secs), "{s}");
        }
        for s in ["", "h", "3", "3x", "1500ms", "99999999d"] {
            assert!(duration_secs(s).is_err(), "{s}");
        }
    }

    fn table_with_rule(expr: &str) -> String {
        format!(
            r#"{{"nftables": [{{"metainfo": {{"version": "1.0.6"}}}},
            {{"table": {{"family": "ip", "name": "verdict", "handle": 1}}}},
            {{"chain": {{"family": "ip", "table": "verdict", "name": "c", "handle": 1}}}},
            {{"rule": {{"family": "ip", "table": "verdict", "chain": "c", "handle": 2, "expr": [{expr}]}}}}]}}"#
        )
    }

    #[test]
    fn a_log_statement_is_read_as_nft_lists_it() {
        // `nft -j list` of `log prefix "verdict dropped source-range" group 7331 drop`.
        let t = parse_table(
            &table_with_rule(
                r#"{"log": {"prefix": "verdict dropped source-range", "group": 7331}}, {"drop": null}"#,
            ),
            Family::Ip,
            "verdict",
        )
        .unwrap();
        let rule = &t.chains["c"].rules[0];
        assert_eq!(
            rule.exprs[0],
            Expr::Log {
                prefix: "verdict dropped source-range".into(),
                group: 7331
            }
        );
        assert_eq!(
            rule.render(Family::Ip),
            r#"log prefix "verdict dropped source-range" group 7331 drop"#
        );
    }

    #[test]
    fn a_limit_is_read_as_nft_lists_it() {
        // `nft -j list` of `limit rate 200/second burst 400 packets`, and of
        // `limit rate 10/second`, whose burst nft leaves at 5.
        for (json, rate, burst) in [
            (r#"{"rate": 200, "burst": 400, "per": "second"}"#, 200, 400),
            (r#"{"rate": 10, "per": "second"}"#, 10, 5),
        ] {
            let t = parse_table(
                &table_with_rule(&format!(r#"{{"limit": {json}}}, {{"drop": null}}"#)),
                Family::Ip,
                "verdict",
            )
            .unwrap();
            assert_eq!(t.chains["c"].rules[0].exprs[0], Expr::Limit { rate, burst });
        }
    }

    #[test]
    fn a_rules_counter_is_read_beside_the_rule() {
        let t = parse_table(
            &table_with_rule(r#"{"counter": {"packets": 7, "bytes": 420}}, {"drop": null}"#),
            Family::Ip,
            "verdict",
        )
        .unwrap();
        let c = &t.chains["c"];
        assert_eq!(
            c.rules[0].exprs,
            [Expr::Counter, Expr::Verdict(Verdict::Drop)]
        );
        assert_eq!(
            c.counters.get(&0),
            Some(&crate::backend::Counter {
                packets: 7,
                bytes: 420
            })
        );
        let mut other = c.clone();
        other.counters.clear();
        assert_eq!(*c, other, "what a rule counted is not what it is");
    }

    #[test]
    fn unknown_expressions_are_errors() {
        for (expr, why) in [
            (r#"{"log": null}"#, "log without a group"),
            (r#"{"log": {"group": 70000}}"#, "log without a group"),
            (
                r#"{"limit": {"rate": 1, "per": "minute"}}"#,
                "limit other than packets a second",
            ),
            (
                r#"{"limit": {"rate": 1, "rate_unit": "bytes"}}"#,
                "limit other than packets a second",
            ),
            (r#"{"limit": {"per": "second"}}"#, "limit without a rate"),
            (
                r#"{"vmap": {"key": {"meta": {"key": "l4proto"}}, "data": {"set": [["tcp", {"accept": null}]]}}}"#,
                "anonymous",
            ),
            (r#"{"masquerade": null}"#, "fully-random"),
            (r#""add @x { ip saddr }""#, "unsupported statement"),
            (r#""update @nope { ip saddr }""#, "unknown set nope"),
            (
                r#"{"match": {"op": "==", "left": {"payload": {"protocol": "ip6", "field": "daddr"}}, "right": "fd00::1"}}"#,
                "unsupported selector",
            ),
            (r#"{"continue": null}"#, "unsupported expression"),
        ] {
            let err = parse_table(&table_with_rule(expr), Family::Ip, "verdict").unwrap_err();
            let NftError::Parse(msg) = &err else {
                panic!("{err:?}");
            };
            assert!(msg.contains("chain c") && msg.contains(why), "{msg}");
        }
        assert!(matches!(
            parse_table("not json", Family::Ip, "verdict"),
            Err(NftError::Parse(_))
        ));
        assert!(matches!(
            parse_table(r#"{"nftables": []}"#, Family::Ip, "verdict"),
            Err(NftError::Parse(_))
        ));
    }
}
