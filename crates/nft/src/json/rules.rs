//! Rules as nft 1.0.6 lists them in JSON, back into [`Expr`]s: the folded
//! protocol matches, `update` statements listed as text, and every other
//! quirk described in the parent module.

use std::collections::BTreeMap;

use serde_json::Value as Json;

use ipnet::IpNet;

use super::{
    Obj, addr_of_type, constant, duration_secs, excerpt, fields, port, proto, proto_name, set_ref,
    single, str_field, strings, u32_of, verdict,
};
use crate::backend::SetState;
use crate::ir::{
    CmpOp, DataType, DnatTarget, Expr, Family, FibAddr, KeyPart, L4Proto, Rule, Selector, Set,
    Value,
};

pub(super) struct RuleParser<'a> {
    family: Family,
    sets: &'a BTreeMap<String, SetState>,
    exprs: Vec<Expr>,
    /// A protocol nft folded into a `tcp|udp|sctp dport` selector, and where
    /// in the rule it was first read.
    folded: Option<(L4Proto, usize)>,
    /// What the rule's `counter` says.
    counter: Option<crate::backend::Counter>,
}

impl<'a> RuleParser<'a> {
    pub(super) fn new(family: Family, sets: &'a BTreeMap<String, SetState>) -> RuleParser<'a> {
        RuleParser {
            family,
            sets,
            exprs: Vec::new(),
            folded: None,
            counter: None,
        }
    }

    /// The rule, and what its `counter` says if it has one.
    pub(super) fn parse(
        mut self,
        o: &Obj,
    ) -> Result<(Rule, Option<crate::backend::Counter>), String> {
        let list = o
            .get("expr")
            .and_then(Json::as_array)
            .ok_or("rule without \"expr\" list")?;
        if list.is_empty() {
            return Err("empty rule".into());
        }
        for e in list {
            let expr = self
                .expr(e)
                .map_err(|m| format!("cannot read {}: {m}", excerpt(e)))?;
            self.exprs.push(expr);
        }
        let mut exprs = self.exprs;
        if let Some((p, at)) = self.folded {
            let explicit = exprs.iter().any(|e| {
                matches!(
                    e,
                    Expr::Cmp {
                        selector: Selector::L4Proto,
                        op: CmpOp::Eq,
                        ..
                    }
                )
            });
            if !explicit {
                exprs.insert(
                    at,
                    Expr::Cmp {
                        selector: Selector::L4Proto,
                        op: CmpOp::Eq,
                        value: Value::Proto(p),
                    },
                );
            }
        }
        let rule = Rule {
            exprs,
            comment: o.get("comment").and_then(Json::as_str).map(str::to_owned),
        };
        Ok((rule, self.counter))
    }

    /// Records that a `tcp|udp|sctp dport` selector stands for
    /// `meta l4proto P … th dport`.
    fn fold(&mut self, p: L4Proto) -> Result<(), String> {
        match self.folded {
            None => {
                self.folded = Some((p, self.exprs.len()));
                Ok(())
            }
            Some((q, _)) if q == p => Ok(()),
            Some((q, _)) => Err(format!("reads both {q} dport and {p} dport")),
        }
    }

    fn set(&self, name: &str) -> Result<&'a Set, String> {
        self.sets
            .get(name)
            .map(|s| &s.set)
            .ok_or_else(|| format!("unknown set {name}"))
    }

    fn expr(&mut self, j: &Json) -> Result<Expr, String> {
        if let Json::String(text) = j {
            return self.update_text(text);
        }
        let (k, v) = single(j).ok_or("not a single-key object")?;
        match k {
            "match" => self.matching(v.as_object().ok_or("match is not an object")?),
            "mangle" => mangle(v),
            "accept" | "drop" | "return" | "jump" | "goto" => verdict(j).map(Expr::Verdict),
            "vmap" => {
                let key = self.key(v.get("key").ok_or("vmap without key")?)?;
                let map = set_ref(v.get("data").ok_or("vmap without data")?)?.to_owned();
                Ok(Expr::Vmap { key, map })
            }
            "reject" => reject(v),
            "counter" => {
                let n = |k: &str| v.get(k).and_then(Json::as_u64).unwrap_or(0);
                self.counter = Some(crate::backend::Counter {
                    packets: n("packets"),
                    bytes: n("bytes"),
                });
                Ok(Expr::Counter)
            }
            "log" => {
                let group = v
                    .get("group")
                    .and_then(Json::as_u64)
                    .and_then(|g| u16::try_from(g).ok())
                    .ok_or("log without a group")?;
                let prefix = v.get("prefix").and_then(Json::as_str).unwrap_or_default();
                Ok(Expr::Log {
                    prefix: prefix.to_owned(),
                    group,
                })
            }
            "limit" => {
                let n = |k: &str| {
                    v.get(k)
                        .and_then(Json::as_u64)
                        .and_then(|n| u32::try_from(n).ok())
                };
                let per = v.get("per").and_then(Json::as_str).unwrap_or("second");
                let unit = v
                    .get("rate_unit")
                    .and_then(Json::as_str)
                    .unwrap_or("packets");
                if per != "second" || unit != "packets" || v.get("inv").is_some() {
                    return Err(format!("limit other than packets a second: {v}"));
                }
                Ok(Expr::Limit {
                    rate: n("rate").ok_or("limit without a rate")?,
                    // nft leaves out the default burst of 5 packets.
                    burst: n("burst").unwrap_or(5),
                })
            }
            "masquerade" => masquerade(v),
            "dnat" => self.dnat(v.as_object().ok_or("dnat is not an object")?),
            "set" | "map" => self.update_json(k, v.as_object().ok_or("not an object")?),
            _ => Err("unsupported expression".into()),
        }
    }

    /// A packet field.
    fn selector(&mut self, j: &Json) -> Result<Selector, String> {
        let fam = self.family.to_string();
        let (k, v) = single(j).ok_or("not a selector")?;
        let field = |name: &str| v.get(name).and_then(Json::as_str).unwrap_or_default();
        match (
            k,
            field("protocol"),
            field("field"),
            field("key"),
            field("dir"),
        ) {
            ("payload", p, "saddr", _, _) if p == fam => Ok(Selector::Saddr),
            ("payload", p, "daddr", _, _) if p == fam => Ok(Selector::Daddr),
            ("payload", "th", "dport", _, _) => Ok(Selector::Dport),
            ("payload", "th", "sport", _, _) => Ok(Selector::Sport),
            ("payload", p, "dport", _, _) if proto_name(p).is_some() => {
                if let Some(p) = proto_name(p) {
                    self.fold(p)?;
                }
                Ok(Selector::Dport)
            }
            ("meta", _, _, "l4proto", _) => Ok(Selector::L4Proto),
            ("ct", _, _, key, "original") if key == format!("{fam} daddr") => {
                Ok(Selector::CtOriginalDaddr)
            }
            ("ct", _, _, "proto-dst", "original") => Ok(Selector::CtOriginalDport),
            ("ct", _, _, key, "reply") if key == format!("{fam} saddr") => {
                Ok(Selector::CtReplySaddr)
            }
            ("ct", _, _, "proto-src", "reply") => Ok(Selector::CtReplySport),
            ("numgen", _, _, _, _) => {
                if field("mode") != "random" {
                    return Err("only numgen random is supported".into());
                }
                let modulus = u32_of(v.get("mod").ok_or("numgen without mod")?)?;
                let offset = v.get("offset").map(u32_of).transpose()?.unwrap_or(0);
                Ok(Selector::Numgen { modulus, offset })
            }
            _ => Err(format!("unsupported selector {}", excerpt(j))),
        }
    }

    /// A lookup key: one selector or a concatenation.
    fn key(&mut self, j: &Json) -> Result<Vec<Selector>, String> {
        match j.as_object().and_then(|o| o.get("concat")) {
            Some(c) => c
                .as_array()
                .ok_or("\"concat\" is not a list")?
                .iter()
                .map(|s| self.selector(s))
                .collect(),
            None => Ok(vec![self.selector(j)?]),
        }
    }

    fn matching(&mut self, m: &Obj) -> Result<Expr, String> {
        let op = str_field(m, "op")?;
        let left = m.get("left").ok_or("match without left")?;
        let right = m.get("right").ok_or("match without right")?;
        let eq = matches!(op, "==" | "in");
        let negate = match op {
            "==" | "in" => false,
            "!=" => true,
            "<" => false,
            _ => return Err(format!("operator {op} is not supported")),
        };
        let one_of = |want: &str| match right {
            Json::String(s) => s == want,
            Json::Array(a) => a.len() == 1 && a[0].as_str() == Some(want),
            _ => false,
        };
        if let Json::String(s) = right
            && let Some(set) = s.strip_prefix('@')
            && op != "<"
        {
            let key = self.key(left)?;
            return Ok(Expr::Lookup {
                key,
                set: set.to_owned(),
                negate,
            });
        }
        if let Some((k, v)) = single(left) {
            let key = v.get("key").and_then(Json::as_str);
            match (k, key) {
                ("meta", Some("iifname")) if op != "<" => {
                    let name = right.as_str().ok_or("interface name is not a string")?;
                    return Ok(Expr::IifName {
                        name: name.to_owned(),
                        negate,
                    });
                }
                ("ct", Some("state")) if eq && one_of("new") => return Ok(Expr::CtStateNew),
                ("ct", Some("status")) if eq && one_of("dnat") => return Ok(Expr::CtStatusDnat),
                ("ct", Some("state" | "status")) => {
                    return Err("unsupported ct state/status match".into());
                }
                ("fib", _) => {
                    let flags = strings(v.get("flags").ok_or("fib without flags")?)?;
                    let addr = match flags.as_slice() {
                        ["saddr"] => FibAddr::Saddr,
                        ["daddr"] => FibAddr::Daddr,
                        _ => return Err("unsupported fib flags".into()),
                    };
                    if op == "=="
                        && v.get("result").and_then(Json::as_str) == Some("type")
                        && one_of("local")
                    {
                        return Ok(Expr::FibLocal(addr));
                    }
                    return Err("unsupported fib match".into());
                }
                ("&", _) => {
                    let mask = mark_operand(v)?;
                    if op == "<" || u32_of(right)? != 0 {
                        return Err("only meta mark & MASK ==|!= 0 is supported".into());
                    }
                    return Ok(Expr::MarkAnd {
                        mask,
                        nonzero: negate,
                    });
                }
                _ => {}
            }
        }
        let selector = self.selector(left)?;
        let op = match op {
            "==" => CmpOp::Eq,
            "!=" => CmpOp::Ne,
            "<" => CmpOp::Lt,
            _ => return Err(format!("operator {op} is not supported here")),
        };
        let value = match selector {
            Selector::Saddr
            | Selector::Daddr
            | Selector::CtOriginalDaddr
            | Selector::CtReplySaddr => constant(self.family.addr_type(), right, false)?,
            Selector::L4Proto => Value::Proto(proto(right)?),
            Selector::Dport
            | Selector::Sport
            | Selector::CtOriginalDport
            | Selector::CtReplySport => Value::Port(port(right)?),
            Selector::Numgen { .. } => Value::Int(u32_of(right)?),
        };
        Ok(Expr::Cmp {
            selector,
            op,
            value,
        })
    }

    fn dnat(&mut self, d: &Obj) -> Result<Expr, String> {
        for k in d.keys() {
            if !matches!(k.as_str(), "family" | "addr" | "port") {
                return Err(format!("dnat option {k} is not supported"));
            }
        }
        if let Some(f) = d.get("family")
            && f.as_str() != Some(&self.family.to_string())
        {
            return Err(format!("dnat family {}", excerpt(f)));
        }
        let addr = d.get("addr").ok_or("dnat without address")?;
        if let Some(m) = addr.as_object().and_then(|o| o.get("map")) {
            if d.contains_key("port") {
                return Err("dnat map with a separate port".into());
            }
            let key = self.key(m.get("key").ok_or("dnat map without key")?)?;
            let map = set_ref(m.get("data").ok_or("dnat map without data")?)?.to_owned();
            return Ok(Expr::Dnat(DnatTarget::Map { key, map }));
        }
        let s = addr
            .as_str()
            .ok_or_else(|| format!("unsupported dnat address {}", excerpt(addr)))?;
        let a = addr_of_type(self.family.addr_type(), s)?;
        let p = port(d.get("port").ok_or("dnat without port")?)?;
        Ok(Expr::Dnat(DnatTarget::Addr(a, p)))
    }

    /// The JSON form of `update @set { … }` (`{"set": {"op": "update", …}}`),
    /// and the `{"map": …}` form newer nft versions print for maps.
    fn update_json(&mut self, kind: &str, u: &Obj) -> Result<Expr, String> {
        if str_field(u, "op")? != "update" {
            return Err("only update is supported".into());
        }
        let name = set_ref(u.get(kind).ok_or("update without set")?)?;
        let set = self.set(name)?;
        let elem = u.get("elem").ok_or("update without elem")?;
        let (val, timeout) = match elem.as_object().and_then(|o| o.get("elem")) {
            Some(inner) => (
                inner.get("val").ok_or("element without \"val\"")?,
                inner.get("timeout").map(u32_of).transpose()?,
            ),
            None => (elem, None),
        };
        let key = fields(val, set.key.len())?
            .into_iter()
            .zip(&set.key)
            .map(|(f, t)| self.part_json(*t, f))
            .collect::<Result<Vec<_>, _>>()?;
        let value = match (u.get("data"), &set.value) {
            (None, None) => Vec::new(),
            (Some(d), Some(types)) => fields(d, types.len())?
                .into_iter()
                .zip(types)
                .map(|(f, t)| self.part_json(*t, f))
                .collect::<Result<Vec<_>, _>>()?,
            _ => return Err(format!("update does not fit {name}")),
        };
        Ok(Expr::Update {
            set: name.to_owned(),
            key,
            timeout,
            value,
        })
    }

    fn part_json(&mut self, t: DataType, j: &Json) -> Result<KeyPart, String> {
        let is_const = match j {
            Json::Object(o) => o.contains_key("prefix"),
            _ => true,
        };
        if is_const {
            constant(t, j, false).map(KeyPart::Const)
        } else {
            self.selector(j).map(KeyPart::Field)
        }
    }

    /// `update @affinity { ip saddr . 1.2.3.4 . tcp . 80 timeout 3h : ip daddr . tcp dport }`.
    fn update_text(&mut self, text: &str) -> Result<Expr, String> {
        let bad = || "unsupported statement".to_owned();
        let rest = text.trim().strip_prefix("update @").ok_or_else(bad)?;
        let (name, rest) = rest.split_once(' ').ok_or_else(bad)?;
        let body = rest
            .trim()
            .strip_prefix('{')
            .and_then(|b| b.strip_suffix('}'))
            .ok_or_else(bad)?
            .trim();
        let set = self.set(name)?;
        let (key_text, value_text) = match body.split_once(" : ") {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (body, None),
        };
        let (key_text, timeout) = match key_text.rsplit_once(" timeout ") {
            Some((k, d)) => (k.trim(), Some(duration_secs(d.trim())?)),
            None => (key_text, None),
        };
        let key = self.parts_text(key_text, &set.key)?;
        let value = match (value_text, &set.value) {
            (None, None) => Vec::new(),
            (Some(v), Some(types)) => self.parts_text(v, types)?,
            _ => return Err(format!("update does not fit {name}")),
        };
        Ok(Expr::Update {
            set: name.to_owned(),
            key,
            timeout,
            value,
        })
    }

    fn parts_text(&mut self, text: &str, types: &[DataType]) -> Result<Vec<KeyPart>, String> {
        let parts: Vec<&str> = text.split(" . ").map(str::trim).collect();
        if parts.len() != types.len() {
            return Err(format!(
                "{} fields in {text:?} where the set has {}",
                parts.len(),
                types.len()
            ));
        }
        parts
            .into_iter()
            .zip(types)
            .map(|(p, t)| match self.selector_text(p)? {
                Some(s) => Ok(KeyPart::Field(s)),
                None => constant_text(*t, p).map(KeyPart::Const),
            })
            .collect()
    }

    /// A packet field in nft's text syntax, or `None` for a constant.
    fn selector_text(&mut self, s: &str) -> Result<Option<Selector>, String> {
        let fam = self.family;
        Ok(Some(match s {
            _ if s == format!("{fam} saddr") => Selector::Saddr,
            _ if s == format!("{fam} daddr") => Selector::Daddr,
            _ if s == format!("ct original {fam} daddr") => Selector::CtOriginalDaddr,
            "ct original proto-dst" => Selector::CtOriginalDport,
            _ if s == format!("ct reply {fam} saddr") => Selector::CtReplySaddr,
            "ct reply proto-src" => Selector::CtReplySport,
            "meta l4proto" => Selector::L4Proto,
            "th dport" => Selector::Dport,
            "th sport" => Selector::Sport,
            _ => {
                if let Some(p) = s.strip_suffix(" dport").and_then(proto_name) {
                    self.fold(p)?;
                    Selector::Dport
                } else if let Some(n) = s.strip_prefix("numgen random mod ") {
                    let (m, o) = match n.split_once(" offset ") {
                        Some((m, o)) => (m, Some(o)),
                        None => (n, None),
                    };
                    let num = |x: &str| {
                        x.trim()
                            .parse::<u32>()
                            .map_err(|_| format!("bad numgen {s:?}"))
                    };
                    Selector::Numgen {
                        modulus: num(m)?,
                        offset: o.map(num).transpose()?.unwrap_or(0),
                    }
                } else {
                    return Ok(None);
                }
            }
        }))
    }
}

/// A constant of type `t` in nft's text syntax.
fn constant_text(t: DataType, s: &str) -> Result<Value, String> {
    match t {
        DataType::Ipv4Addr | DataType::Ipv6Addr => {
            if let Some((a, len)) = s.split_once('/') {
                let len: u8 = len.parse().map_err(|_| format!("bad prefix {s:?}"))?;
                let net = IpNet::new(addr_of_type(t, a)?, len).map_err(|e| format!("{s}: {e}"))?;
                Ok(Value::Prefix(net))
            } else {
                addr_of_type(t, s).map(Value::Addr)
            }
        }
        DataType::InetProto => proto_name(s)
            .map(Value::Proto)
            .ok_or_else(|| format!("{s:?} is not a field or tcp, udp or sctp")),
        DataType::InetService | DataType::PortOf(_) => s
            .parse()
            .map(Value::Port)
            .map_err(|_| format!("{s:?} is not a field or a port")),
        DataType::Numgen => s
            .parse()
            .map(Value::Int)
            .map_err(|_| format!("{s:?} is not a field or a number")),
        DataType::Verdict => Err(format!("{s:?}: a verdict cannot be a key field")),
    }
}

/// `[{"meta": {"key": "mark"}}, N]` → N.
fn mark_operand(v: &Json) -> Result<u32, String> {
    match v.as_array().map(Vec::as_slice) {
        Some([m, n]) if is_mark(m) => u32_of(n),
        _ => Err("only meta mark operations are supported".into()),
    }
}

fn is_mark(j: &Json) -> bool {
    j.get("meta")
        .and_then(|m| m.get("key"))
        .and_then(Json::as_str)
        == Some("mark")
}

/// `meta mark set meta mark | N` / `^ N`.
fn mangle(v: &Json) -> Result<Expr, String> {
    let nftrace = v
        .get("key")
        .and_then(|k| k.get("meta"))
        .and_then(|m| m.get("key"))
        .and_then(Json::as_str)
        == Some("nftrace");
    if nftrace && v.get("value").and_then(Json::as_u64) == Some(1) {
        return Ok(Expr::NftraceOn);
    }
    if !v.get("key").is_some_and(is_mark) {
        return Err("only meta mark can be set".into());
    }
    let (op, args) =
        single(v.get("value").ok_or("mangle without value")?).ok_or("unsupported mark value")?;
    let bits = mark_operand(args)?;
    match op {
        "|" => Ok(Expr::MarkOr(bits)),
        "^" => Ok(Expr::MarkXor(bits)),
        _ => Err(format!("mark operator {op} is not supported")),
    }
}

/// `reject` (nft lists the default as `icmp|icmpv6 port-unreachable`).
fn reject(v: &Json) -> Result<Expr, String> {
    match v {
        Json::Null => Ok(Expr::Reject),
        Json::Object(o) => {
            let ty = o.get("type").and_then(Json::as_str);
            let what = o.get("expr").and_then(Json::as_str);
            let known = o.keys().all(|k| k == "type" || k == "expr");
            if known
                && matches!(ty, None | Some("icmp" | "icmpv6" | "icmpx"))
                && matches!(what, None | Some("port-unreachable"))
            {
                Ok(Expr::Reject)
            } else {
                Err("only reject with port-unreachable is supported".into())
            }
        }
        _ => Err("unsupported reject".into()),
    }
}

/// `masquerade fully-random` (the only masquerade verdict writes).
fn masquerade(v: &Json) -> Result<Expr, String> {
    let flags = v
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.get("flags"))
        .ok_or("only masquerade fully-random is supported")?;
    if strings(flags)? == ["fully-random"] {
        Ok(Expr::Masquerade)
    } else {
        Err("only masquerade fully-random is supported".into())
    }
}
