//! Rules as the kernel holds them: lists of expressions working on
//! registers. [`encode`] writes a [`Rule`]'s expressions exactly as nft
//! 1.0.6 writes the same rule, so that `nft list` shows the same text
//! whichever backend wrote it and either backend reads what the other
//! wrote. [`decode`] turns such a list back into [`Expr`]s by following
//! what each register holds; anything verdict does not write is refused.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use super::wire::{Attrs, Writer};
use crate::error::NftError;
use crate::ir::{
    CmpOp, DataType, DnatTarget, Expr, Family, FibAddr, KeyPart, L4Proto, Selector, Value, Verdict,
};

// Expression attributes (include/uapi/linux/netfilter/nf_tables.h).
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
pub(crate) const NFTA_DATA_VALUE: u16 = 1;
pub(crate) const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

const NF_DROP: i32 = 0;
const NF_ACCEPT: i32 = 1;
const NFT_JUMP: i32 = -3;
const NFT_GOTO: i32 = -4;
const NFT_RETURN: i32 = -5;

const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_REG_2: u32 = 2;

const PAYLOAD_NETWORK: u32 = 1;
const PAYLOAD_TRANSPORT: u32 = 2;

const META_MARK: u32 = 3;
const META_IIFNAME: u32 = 6;
const META_L4PROTO: u32 = 16;
const META_NFTRACE: u32 = 12;

const CT_STATE: u32 = 0;
const CT_STATUS: u32 = 2;
const CT_PROTO_SRC: u32 = 11;
const CT_PROTO_DST: u32 = 12;
const CT_SRC_IP: u32 = 19;
const CT_DST_IP: u32 = 20;
const CT_SRC_IP6: u32 = 21;
const CT_DST_IP6: u32 = 22;
const CT_DIR_ORIGINAL: u8 = 0;
const CT_DIR_REPLY: u8 = 1;
/// `NF_CT_STATE_BIT(IP_CT_NEW)`.
const CT_STATE_NEW: u32 = 8;
/// `IPS_DST_NAT`.
const CT_STATUS_DNAT: u32 = 0x20;

const CMP_EQ: u32 = 0;
const CMP_NEQ: u32 = 1;
const CMP_LT: u32 = 2;

const LOOKUP_F_INV: u32 = 1;
const NG_RANDOM: u32 = 1;
const NAT_DNAT: u32 = 1;
const NFPROTO_IPV4: u32 = 2;
const NFPROTO_IPV6: u32 = 10;
/// `NF_NAT_RANGE_PROTO_SPECIFIED`.
const NAT_PROTO_SPECIFIED: u32 = 0x2;
/// `NF_NAT_RANGE_PROTO_RANDOM_FULLY`.
const NAT_RANDOM_FULLY: u32 = 0x10;
const REJECT_ICMP_UNREACH: u32 = 0;
/// `NFTA_LOG_GROUP` and `NFTA_LOG_PREFIX`.
const LOG_GROUP: u16 = 1;
const LOG_PREFIX: u16 = 2;
/// `NFTA_LIMIT_RATE`, `_UNIT`, `_BURST`, `_TYPE` and `_FLAGS`.
const LIMIT_RATE: u16 = 1;
const LIMIT_UNIT: u16 = 2;
const LIMIT_BURST: u16 = 3;
const LIMIT_TYPE: u16 = 4;
const LIMIT_FLAGS: u16 = 5;
/// `NFT_LIMIT_PKTS`: the rate counts packets (not bytes).
const LIMIT_PACKETS: u32 = 0;
/// ICMP and ICMPv6 "port unreachable".
const ICMP_PORT_UNREACH: u8 = 3;
const ICMPV6_PORT_UNREACH: u8 = 4;
const FIB_RESULT_ADDRTYPE: u32 = 3;
const FIB_F_SADDR: u32 = 1;
const FIB_F_DADDR: u32 = 2;
/// `RTN_LOCAL`.
const RTN_LOCAL: u32 = 2;
const DYNSET_OP_UPDATE: u32 = 1;
const BYTEORDER_HTON: u32 = 1;
const IFNAMSIZ: usize = 16;

/// The register a value at `word` (32-bit units from the start of the
/// register file) is addressed by, as nft numbers them: a 16-byte register
/// where one starts, a 32-bit one otherwise.
fn reg(word: u32) -> u32 {
    if word.is_multiple_of(4) {
        word / 4 + NFT_REG_1
    } else {
        8 + word
    }
}

/// The word a register number starts at (`None` for the verdict register
/// or a number out of range).
fn word(reg: u32) -> Option<u32> {
    match reg {
        1..=4 => Some((reg - 1) * 4),
        8..=23 => Some(reg - 8),
        _ => None,
    }
}

fn words(len: usize) -> u32 {
    len.div_ceil(4) as u32
}

fn addr_len(family: Family) -> usize {
    match family {
        Family::Ip => 4,
        Family::Ip6 => 16,
    }
}

/// Bytes a selector loads.
pub(crate) fn selector_len(family: Family, s: Selector) -> usize {
    match s {
        Selector::Saddr | Selector::Daddr | Selector::CtOriginalDaddr | Selector::CtReplySaddr => {
            addr_len(family)
        }
        Selector::L4Proto => 1,
        Selector::Dport | Selector::Sport | Selector::CtOriginalDport | Selector::CtReplySport => 2,
        Selector::Numgen { .. } => 4,
    }
}

/// A constant's bytes as a register or set element holds them.
pub(crate) fn value_bytes(v: &Value) -> Result<Vec<u8>, NftError> {
    Ok(match v {
        Value::Addr(IpAddr::V4(a)) => a.octets().to_vec(),
        Value::Addr(IpAddr::V6(a)) => a.octets().to_vec(),
        Value::Proto(p) => vec![p.number()],
        Value::Port(p) => p.to_be_bytes().to_vec(),
        Value::Int(i) => i.to_ne_bytes().to_vec(),
        Value::Prefix(n) => {
            return Err(NftError::Invalid(format!(
                "the network {n} cannot be a single value"
            )));
        }
    })
}

/// Writes the rule's expressions (`NFTA_RULE_EXPRESSIONS`' contents).
/// `interval` says whether a set is an interval set: nft converts the
/// protocol field's byte order for lookups in those.
pub(crate) fn encode(
    w: &mut Writer,
    family: Family,
    exprs: &[Expr],
    interval: &dyn Fn(&str) -> bool,
) -> Result<(), NftError> {
    let mut e = Encoder { w, family };
    for x in exprs {
        e.expr(x, interval)?;
    }
    Ok(())
}

struct Encoder<'w> {
    w: &'w mut Writer,
    family: Family,
}

impl Encoder<'_> {
    fn kernel(&mut self, name: &str, body: impl FnOnce(&mut Writer)) -> Result<(), NftError> {
        let elem = self.w.open(NFTA_LIST_ELEM);
        self.w.str(NFTA_EXPR_NAME, name);
        let data = self.w.open(NFTA_EXPR_DATA);
        body(self.w);
        self.close(data)?;
        self.close(elem)
    }

    fn close(&mut self, at: usize) -> Result<(), NftError> {
        self.w
            .close(at)
            .map_err(|n| NftError::Invalid(format!("an expression of {n} bytes is too long")))
    }

    fn payload(&mut self, dreg: u32, base: u32, offset: u32, len: usize) -> Result<(), NftError> {
        self.kernel("payload", |w| {
            w.u32_be(1, dreg);
            w.u32_be(2, base);
            w.u32_be(3, offset);
            w.u32_be(4, len as u32);
        })
    }

    fn meta_load(&mut self, dreg: u32, key: u32) -> Result<(), NftError> {
        self.kernel("meta", |w| {
            w.u32_be(1, dreg);
            w.u32_be(2, key);
        })
    }

    fn ct_load(&mut self, dreg: u32, key: u32, dir: Option<u8>) -> Result<(), NftError> {
        self.kernel("ct", |w| {
            w.u32_be(1, dreg);
            w.u32_be(2, key);
            if let Some(d) = dir {
                w.u8(3, d);
            }
        })
    }

    fn cmp(&mut self, sreg: u32, op: u32, data: &[u8]) -> Result<(), NftError> {
        self.kernel("cmp", |w| {
            w.u32_be(1, sreg);
            w.u32_be(2, op);
            let d = w.open(3);
            w.attr(NFTA_DATA_VALUE, data);
            let _ = w.close(d);
        })
    }

    fn bitwise(&mut self, reg: u32, mask: &[u8], xor: &[u8]) -> Result<(), NftError> {
        self.kernel("bitwise", |w| {
            w.u32_be(1, reg);
            w.u32_be(2, reg);
            w.u32_be(3, mask.len() as u32);
            let m = w.open(4);
            w.attr(NFTA_DATA_VALUE, mask);
            let _ = w.close(m);
            let x = w.open(5);
            w.attr(NFTA_DATA_VALUE, xor);
            let _ = w.close(x);
        })
    }

    fn immediate_value(&mut self, dreg: u32, data: &[u8]) -> Result<(), NftError> {
        self.kernel("immediate", |w| {
            w.u32_be(1, dreg);
            let d = w.open(2);
            w.attr(NFTA_DATA_VALUE, data);
            let _ = w.close(d);
        })
    }

    /// Loads a selector into the register at `at`.
    fn load(&mut self, s: Selector, at: u32) -> Result<(), NftError> {
        let r = reg(at);
        let fam = self.family;
        match s {
            Selector::Saddr => match fam {
                Family::Ip => self.payload(r, PAYLOAD_NETWORK, 12, 4),
                Family::Ip6 => self.payload(r, PAYLOAD_NETWORK, 8, 16),
            },
            Selector::Daddr => match fam {
                Family::Ip => self.payload(r, PAYLOAD_NETWORK, 16, 4),
                Family::Ip6 => self.payload(r, PAYLOAD_NETWORK, 24, 16),
            },
            Selector::L4Proto => self.meta_load(r, META_L4PROTO),
            Selector::Dport => self.payload(r, PAYLOAD_TRANSPORT, 2, 2),
            Selector::Sport => self.payload(r, PAYLOAD_TRANSPORT, 0, 2),
            Selector::CtOriginalDaddr => {
                let key = match fam {
                    Family::Ip => CT_DST_IP,
                    Family::Ip6 => CT_DST_IP6,
                };
                self.ct_load(r, key, Some(CT_DIR_ORIGINAL))
            }
            Selector::CtOriginalDport => self.ct_load(r, CT_PROTO_DST, Some(CT_DIR_ORIGINAL)),
            Selector::CtReplySaddr => {
                let key = match fam {
                    Family::Ip => CT_SRC_IP,
                    Family::Ip6 => CT_SRC_IP6,
                };
                self.ct_load(r, key, Some(CT_DIR_REPLY))
            }
            Selector::CtReplySport => self.ct_load(r, CT_PROTO_SRC, Some(CT_DIR_REPLY)),
            Selector::Numgen { modulus, offset } => self.kernel("numgen", |w| {
                w.u32_be(1, r);
                w.u32_be(2, modulus);
                w.u32_be(3, NG_RANDOM);
                if offset != 0 {
                    w.u32_be(4, offset);
                }
            }),
        }
    }

    /// Loads key fields into consecutive registers from word `at`; returns
    /// the word after them. `hton_proto` adds nft's byte-order conversion
    /// of the protocol field (lookups in interval sets).
    fn load_key(&mut self, key: &[KeyPart], at: u32, hton_proto: bool) -> Result<u32, NftError> {
        let mut at = at;
        for part in key {
            let len = match part {
                KeyPart::Field(s) => {
                    self.load(*s, at)?;
                    selector_len(self.family, *s)
                }
                KeyPart::Const(v) => {
                    let b = value_bytes(v)?;
                    self.immediate_value(reg(at), &b)?;
                    b.len()
                }
            };
            if hton_proto && *part == KeyPart::Field(Selector::L4Proto) {
                let r = reg(at);
                self.kernel("byteorder", |w| {
                    w.u32_be(1, r);
                    w.u32_be(2, r);
                    w.u32_be(3, BYTEORDER_HTON);
                    w.u32_be(4, 1);
                    w.u32_be(5, 2);
                })?;
            }
            at += words(len);
        }
        Ok(at)
    }

    fn fields(key: &[Selector]) -> Vec<KeyPart> {
        key.iter().copied().map(KeyPart::Field).collect()
    }

    fn lookup(&mut self, set: &str, dreg: Option<u32>, invert: bool) -> Result<(), NftError> {
        self.kernel("lookup", |w| {
            w.str(1, set);
            w.u32_be(2, NFT_REG_1);
            if let Some(d) = dreg {
                w.u32_be(3, d);
            }
            if invert {
                w.u32_be(5, LOOKUP_F_INV);
            }
        })
    }

    fn verdict(&mut self, v: &Verdict) -> Result<(), NftError> {
        self.kernel("immediate", |w| {
            w.u32_be(1, NFT_REG_VERDICT);
            let d = w.open(2);
            verdict_data(w, v);
            let _ = w.close(d);
        })
    }

    fn nat_family(&self) -> u32 {
        match self.family {
            Family::Ip => NFPROTO_IPV4,
            Family::Ip6 => NFPROTO_IPV6,
        }
    }

    fn mark_set(&mut self, mask: u32, xor: u32) -> Result<(), NftError> {
        self.meta_load(NFT_REG_1, META_MARK)?;
        self.bitwise(NFT_REG_1, &mask.to_ne_bytes(), &xor.to_ne_bytes())?;
        self.kernel("meta", |w| {
            w.u32_be(2, META_MARK);
            w.u32_be(3, NFT_REG_1);
        })
    }

    /// `REG & mask != 0` (or `== 0`).
    fn flag_test(&mut self, mask: u32, nonzero: bool) -> Result<(), NftError> {
        self.bitwise(NFT_REG_1, &mask.to_ne_bytes(), &[0; 4])?;
        self.cmp(NFT_REG_1, if nonzero { CMP_NEQ } else { CMP_EQ }, &[0; 4])
    }

    fn expr(&mut self, x: &Expr, interval: &dyn Fn(&str) -> bool) -> Result<(), NftError> {
        match x {
            Expr::Cmp {
                selector,
                op,
                value,
            } => {
                let op = match op {
                    CmpOp::Eq => CMP_EQ,
                    CmpOp::Ne => CMP_NEQ,
                    CmpOp::Lt => CMP_LT,
                };
                match value {
                    Value::Prefix(net) => self.prefix(*selector, op, net),
                    v => {
                        self.load(*selector, 0)?;
                        let mut b = value_bytes(v)?;
                        if matches!(v, Value::Int(_)) && selector_len(self.family, *selector) < 4 {
                            return Err(NftError::Invalid(format!(
                                "an integer cannot be compared with {selector:?}"
                            )));
                        }
                        b.truncate(selector_len(self.family, *selector));
                        self.cmp(NFT_REG_1, op, &b)
                    }
                }
            }
            Expr::Lookup { key, set, negate } => {
                let hton = key.len() > 1 && interval(set);
                self.load_key(&Self::fields(key), 0, hton)?;
                self.lookup(set, None, *negate)
            }
            Expr::FibLocal(a) => {
                let flags = match a {
                    FibAddr::Saddr => FIB_F_SADDR,
                    FibAddr::Daddr => FIB_F_DADDR,
                };
                self.kernel("fib", |w| {
                    w.u32_be(1, NFT_REG_1);
                    w.u32_be(2, FIB_RESULT_ADDRTYPE);
                    w.u32_be(3, flags);
                })?;
                self.cmp(NFT_REG_1, CMP_EQ, &RTN_LOCAL.to_ne_bytes())
            }
            Expr::IifName { name, negate } => {
                self.meta_load(NFT_REG_1, META_IIFNAME)?;
                let data = match name.strip_suffix('*') {
                    Some(prefix) => prefix.as_bytes().to_vec(),
                    None => {
                        let mut b = name.as_bytes().to_vec();
                        b.resize(IFNAMSIZ.max(b.len()), 0);
                        b
                    }
                };
                if data.len() > IFNAMSIZ {
                    return Err(NftError::Invalid(format!(
                        "interface name {name:?} is longer than {IFNAMSIZ} bytes"
                    )));
                }
                self.cmp(NFT_REG_1, if *negate { CMP_NEQ } else { CMP_EQ }, &data)
            }
            Expr::CtStateNew => {
                self.ct_load(NFT_REG_1, CT_STATE, None)?;
                self.flag_test(CT_STATE_NEW, true)
            }
            Expr::CtStatusDnat => {
                self.ct_load(NFT_REG_1, CT_STATUS, None)?;
                self.flag_test(CT_STATUS_DNAT, true)
            }
            Expr::MarkAnd { mask, nonzero } => {
                self.meta_load(NFT_REG_1, META_MARK)?;
                self.flag_test(*mask, *nonzero)
            }
            Expr::MarkOr(bits) => self.mark_set(!bits, *bits),
            Expr::MarkXor(bits) => self.mark_set(u32::MAX, *bits),
            Expr::NftraceOn => {
                // As nft writes it: the one byte of the 1-bit field.
                self.immediate_value(NFT_REG_1, &[1])?;
                self.kernel("meta", |w| {
                    w.u32_be(2, META_NFTRACE);
                    w.u32_be(3, NFT_REG_1);
                })
            }
            Expr::Verdict(v) => self.verdict(v),
            Expr::Vmap { key, map } => {
                self.load_key(&Self::fields(key), 0, false)?;
                self.lookup(map, Some(NFT_REG_VERDICT), false)
            }
            Expr::Reject => {
                let code = match self.family {
                    Family::Ip => ICMP_PORT_UNREACH,
                    Family::Ip6 => ICMPV6_PORT_UNREACH,
                };
                self.kernel("reject", |w| {
                    w.u32_be(1, REJECT_ICMP_UNREACH);
                    w.u8(2, code);
                })
            }
            Expr::Counter => self.kernel("counter", |w| {
                w.u64_be(1, 0);
                w.u64_be(2, 0);
            }),
            // As nft writes it: the prefix, then the group.
            Expr::Log { prefix, group } => self.kernel("log", |w| {
                w.str(LOG_PREFIX, prefix);
                w.attr(LOG_GROUP, &group.to_be_bytes());
            }),
            // As nft writes `limit rate N/second burst B packets`.
            Expr::Limit { rate, burst } => self.kernel("limit", |w| {
                w.u64_be(LIMIT_RATE, u64::from(*rate));
                w.u64_be(LIMIT_UNIT, 1);
                w.u32_be(LIMIT_BURST, *burst);
                w.u32_be(LIMIT_TYPE, LIMIT_PACKETS);
                w.u32_be(LIMIT_FLAGS, 0);
            }),
            Expr::Masquerade => self.kernel("masq", |w| w.u32_be(1, NAT_RANDOM_FULLY)),
            Expr::Dnat(DnatTarget::Addr(addr, port)) => {
                if Family::of(*addr) != self.family {
                    return Err(NftError::Invalid(format!(
                        "dnat to {addr} in an {} table",
                        self.family
                    )));
                }
                self.immediate_value(NFT_REG_1, &value_bytes(&Value::Addr(*addr))?)?;
                self.immediate_value(NFT_REG_2, &port.to_be_bytes())?;
                let family = self.nat_family();
                self.kernel("nat", |w| {
                    w.u32_be(1, NAT_DNAT);
                    w.u32_be(2, family);
                    w.u32_be(3, NFT_REG_1);
                    w.u32_be(5, NFT_REG_2);
                    w.u32_be(7, NAT_PROTO_SPECIFIED);
                })
            }
            Expr::Dnat(DnatTarget::Map { key, map }) => {
                self.load_key(&Self::fields(key), 0, false)?;
                self.lookup(map, Some(NFT_REG_1), false)?;
                let family = self.nat_family();
                let port = reg(words(addr_len(self.family)));
                self.kernel("nat", |w| {
                    w.u32_be(1, NAT_DNAT);
                    w.u32_be(2, family);
                    w.u32_be(3, NFT_REG_1);
                    w.u32_be(5, port);
                })
            }
            Expr::Update {
                set,
                key,
                timeout,
                value,
            } => {
                let after = self.load_key(key, 0, false)?;
                let data = if value.is_empty() {
                    None
                } else {
                    self.load_key(value, after, false)?;
                    Some(reg(after))
                };
                self.kernel("dynset", |w| {
                    w.str(1, set);
                    w.u32_be(3, DYNSET_OP_UPDATE);
                    w.u32_be(4, NFT_REG_1);
                    if let Some(d) = data {
                        w.u32_be(5, d);
                    }
                    if let Some(t) = timeout {
                        w.u64_be(6, u64::from(*t) * 1000);
                    }
                })
            }
        }
    }

    /// `SELECTOR [!=] NET`, as nft compiles it: a whole-byte prefix loads
    /// only its bytes; any other is masked.
    fn prefix(&mut self, s: Selector, op: u32, net: &IpNet) -> Result<(), NftError> {
        let full = selector_len(self.family, s);
        let bytes = match net.network() {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        };
        if bytes.len() != full {
            return Err(NftError::Invalid(format!(
                "{net} does not match an {} address",
                self.family
            )));
        }
        let bits = usize::from(net.prefix_len());
        let header = match (s, self.family) {
            (Selector::Saddr, Family::Ip) => Some(12),
            (Selector::Daddr, Family::Ip) => Some(16),
            (Selector::Saddr, Family::Ip6) => Some(8),
            (Selector::Daddr, Family::Ip6) => Some(24),
            _ => None,
        };
        if let Some(offset) = header
            && bits % 8 == 0
            && bits > 0
        {
            let n = bits / 8;
            self.payload(NFT_REG_1, PAYLOAD_NETWORK, offset, n)?;
            return self.cmp(NFT_REG_1, op, &bytes[..n]);
        }
        self.load(s, 0)?;
        let mask = match net.netmask() {
            IpAddr::V4(m) => m.octets().to_vec(),
            IpAddr::V6(m) => m.octets().to_vec(),
        };
        self.bitwise(NFT_REG_1, &mask, &vec![0; full])?;
        self.cmp(NFT_REG_1, op, &bytes)
    }
}

/// Writes a verdict (`NFTA_DATA_VERDICT`) into an open data attribute.
pub(crate) fn verdict_data(w: &mut Writer, v: &Verdict) {
    let n = w.open(NFTA_DATA_VERDICT);
    let (code, chain) = match v {
        Verdict::Accept => (NF_ACCEPT, None),
        Verdict::Drop => (NF_DROP, None),
        Verdict::Return => (NFT_RETURN, None),
        Verdict::Jump(c) => (NFT_JUMP, Some(c)),
        Verdict::Goto(c) => (NFT_GOTO, Some(c)),
    };
    w.u32_be(NFTA_VERDICT_CODE, code as u32);
    if let Some(c) = chain {
        w.str(NFTA_VERDICT_CHAIN, c);
    }
    let _ = w.close(n);
}

/// Reads a verdict from `NFTA_DATA_VERDICT`'s contents.
pub(crate) fn read_verdict(a: Attrs<'_>) -> Result<Verdict, NftError> {
    let code = a
        .i32_be(NFTA_VERDICT_CODE)
        .ok_or_else(|| NftError::Parse("a verdict without a code".into()))?;
    let chain = || {
        a.str(NFTA_VERDICT_CHAIN)
            .map(str::to_owned)
            .ok_or_else(|| NftError::Parse("a jump without a chain".into()))
    };
    Ok(match code {
        NF_ACCEPT => Verdict::Accept,
        NF_DROP => Verdict::Drop,
        NFT_RETURN => Verdict::Return,
        NFT_JUMP => Verdict::Jump(chain()?),
        NFT_GOTO => Verdict::Goto(chain()?),
        other => return Err(NftError::Parse(format!("verdict code {other}"))),
    })
}

/// The type of the value a selector reads.
pub(crate) fn selector_type(family: Family, s: Selector) -> DataType {
    match s {
        Selector::Saddr | Selector::Daddr | Selector::CtOriginalDaddr | Selector::CtReplySaddr => {
            family.addr_type()
        }
        Selector::L4Proto => DataType::InetProto,
        Selector::Dport | Selector::Sport | Selector::CtOriginalDport | Selector::CtReplySport => {
            DataType::InetService
        }
        Selector::Numgen { .. } => DataType::Numgen,
    }
}

/// Bytes one field of a type takes in a key or value.
pub(crate) fn type_len(t: DataType) -> usize {
    match t {
        DataType::Ipv4Addr | DataType::Numgen => 4,
        DataType::Ipv6Addr => 16,
        DataType::InetProto => 1,
        DataType::InetService | DataType::PortOf(_) => 2,
        DataType::Verdict => 0,
    }
}

/// A value of type `t` from its bytes.
pub(crate) fn value_of(t: DataType, b: &[u8]) -> Result<Value, NftError> {
    let short = || NftError::Parse(format!("{} bytes for a {}", b.len(), t.type_name()));
    Ok(match t {
        DataType::Ipv4Addr => {
            let o: [u8; 4] = b
                .get(..4)
                .and_then(|s| s.try_into().ok())
                .ok_or_else(short)?;
            Value::Addr(IpAddr::V4(Ipv4Addr::from(o)))
        }
        DataType::Ipv6Addr => {
            let o: [u8; 16] = b
                .get(..16)
                .and_then(|s| s.try_into().ok())
                .ok_or_else(short)?;
            Value::Addr(IpAddr::V6(Ipv6Addr::from(o)))
        }
        DataType::InetProto => {
            let n = *b.first().ok_or_else(short)?;
            Value::Proto(
                L4Proto::ALL
                    .into_iter()
                    .find(|p| p.number() == n)
                    .ok_or_else(|| NftError::Parse(format!("protocol {n}")))?,
            )
        }
        DataType::InetService | DataType::PortOf(_) => {
            let o: [u8; 2] = b
                .get(..2)
                .and_then(|s| s.try_into().ok())
                .ok_or_else(short)?;
            Value::Port(u16::from_be_bytes(o))
        }
        DataType::Numgen => {
            let o: [u8; 4] = b
                .get(..4)
                .and_then(|s| s.try_into().ok())
                .ok_or_else(short)?;
            Value::Int(u32::from_ne_bytes(o))
        }
        DataType::Verdict => return Err(NftError::Parse("a verdict is not a key".into())),
    })
}

/// What a register holds while a rule is read.
#[derive(Clone, Debug, PartialEq)]
enum Held {
    /// A packet field; `len` is shorter than the field for a prefix load.
    Field(Selector, usize),
    Const(Vec<u8>),
    Fib(FibAddr),
    IifName,
    CtState,
    CtStatus,
    Mark,
    Masked(Box<Held>, Vec<u8>, Vec<u8>),
    /// The value a data-map lookup produced.
    Found(String, Vec<Selector>),
}

/// What the reader needs to know of a set: its definition.
pub(crate) type SetLookup<'a> = &'a dyn Fn(&str) -> Option<&'a crate::ir::Set>;

/// Reads a rule's expressions (`NFTA_RULE_EXPRESSIONS`' contents), and
/// what its `counter` says if it has one.
pub(crate) fn decode(
    family: Family,
    list: Attrs<'_>,
    sets: SetLookup<'_>,
) -> Result<(Vec<Expr>, Option<crate::backend::Counter>), NftError> {
    let mut d = Decoder {
        family,
        regs: std::collections::HashMap::new(),
        out: Vec::new(),
        sets,
        counter: None,
    };
    for (kind, elem) in list.iter() {
        if kind != NFTA_LIST_ELEM {
            continue;
        }
        let elem = Attrs(elem);
        let name = elem
            .str(NFTA_EXPR_NAME)
            .ok_or_else(|| NftError::Parse("an expression without a name".into()))?;
        let data = elem.nested(NFTA_EXPR_DATA).unwrap_or(Attrs(&[]));
        d.expr(name, data)
            .map_err(|e| e.context(&format!("{name} expression")))?;
    }
    Ok((d.out, d.counter))
}

struct Decoder<'a> {
    family: Family,
    regs: std::collections::HashMap<u32, Held>,
    out: Vec<Expr>,
    sets: SetLookup<'a>,
    counter: Option<crate::backend::Counter>,
}

fn need<T>(v: Option<T>, what: &str) -> Result<T, NftError> {
    v.ok_or_else(|| NftError::Parse(format!("no {what}")))
}

fn data_value(a: Attrs<'_>, kind: u16) -> Option<&[u8]> {
    a.nested(kind)?.get(NFTA_DATA_VALUE)
}

impl Decoder<'_> {
    fn reg_word(&self, a: Attrs<'_>, kind: u16) -> Result<u32, NftError> {
        let r = need(a.u32_be(kind), "register")?;
        word(r).ok_or_else(|| NftError::Parse(format!("register {r}")))
    }

    fn held(&self, w: u32) -> Result<&Held, NftError> {
        self.regs
            .get(&w)
            .ok_or_else(|| NftError::Parse(format!("register word {w} read before written")))
    }

    fn set(&self, name: &str) -> Result<&crate::ir::Set, NftError> {
        (self.sets)(name).ok_or_else(|| NftError::Parse(format!("unknown set {name}")))
    }

    /// The key parts held from word `at` for the fields `types`.
    fn parts(&self, at: u32, types: &[DataType]) -> Result<Vec<KeyPart>, NftError> {
        let mut at = at;
        let mut out = Vec::new();
        for t in types {
            let part = match self.held(at)? {
                Held::Field(s, len) if *len == selector_len(self.family, *s) => KeyPart::Field(*s),
                Held::Const(b) => KeyPart::Const(value_of(*t, b)?),
                other => return Err(NftError::Parse(format!("{other:?} in a key"))),
            };
            out.push(part);
            at += words(type_len(*t));
        }
        Ok(out)
    }

    fn fields(&self, at: u32, types: &[DataType]) -> Result<Vec<Selector>, NftError> {
        self.parts(at, types)?
            .into_iter()
            .map(|p| match p {
                KeyPart::Field(s) => Ok(s),
                KeyPart::Const(v) => Err(NftError::Parse(format!("constant {v} in a lookup key"))),
            })
            .collect()
    }

    fn expr(&mut self, name: &str, a: Attrs<'_>) -> Result<(), NftError> {
        let fam = self.family;
        match name {
            "payload" => {
                if a.get(5).is_some() {
                    return Err(NftError::Parse("payload writes".into()));
                }
                let w = self.reg_word(a, 1)?;
                let base = need(a.u32_be(2), "base")?;
                let offset = need(a.u32_be(3), "offset")?;
                let len = need(a.u32_be(4), "length")? as usize;
                let sel = match (base, offset, fam) {
                    (PAYLOAD_NETWORK, 12, Family::Ip) | (PAYLOAD_NETWORK, 8, Family::Ip6) => {
                        Selector::Saddr
                    }
                    (PAYLOAD_NETWORK, 16, Family::Ip) | (PAYLOAD_NETWORK, 24, Family::Ip6) => {
                        Selector::Daddr
                    }
                    (PAYLOAD_TRANSPORT, 2, _) if len == 2 => Selector::Dport,
                    (PAYLOAD_TRANSPORT, 0, _) if len == 2 => Selector::Sport,
                    _ => {
                        return Err(NftError::Parse(format!(
                            "load of {len} bytes at {offset} of header {base}"
                        )));
                    }
                };
                if len == 0 || len > selector_len(fam, sel) {
                    return Err(NftError::Parse(format!("load of {len} bytes")));
                }
                self.regs.insert(w, Held::Field(sel, len));
            }
            "meta" => {
                let key = need(a.u32_be(2), "key")?;
                if let Some(sreg) = a.u32_be(3) {
                    let w =
                        word(sreg).ok_or_else(|| NftError::Parse(format!("register {sreg}")))?;
                    if key == META_NFTRACE
                        && matches!(self.held(w)?, Held::Const(v) if v.first() == Some(&1))
                    {
                        self.out.push(Expr::NftraceOn);
                        return Ok(());
                    }
                    if key != META_MARK {
                        return Err(NftError::Parse(format!("meta set of key {key}")));
                    }
                    let Held::Masked(inner, mask, xor) = self.held(w)? else {
                        return Err(NftError::Parse("meta mark set without a mask".into()));
                    };
                    if **inner != Held::Mark {
                        return Err(NftError::Parse("meta mark set from another value".into()));
                    }
                    let (mask, xor) = (u32_ne(mask)?, u32_ne(xor)?);
                    self.out.push(if mask == u32::MAX {
                        Expr::MarkXor(xor)
                    } else if mask == !xor {
                        Expr::MarkOr(xor)
                    } else {
                        return Err(NftError::Parse(format!("mark & {mask:#x} ^ {xor:#x}")));
                    });
                    return Ok(());
                }
                let w = self.reg_word(a, 1)?;
                let held = match key {
                    META_L4PROTO => Held::Field(Selector::L4Proto, 1),
                    META_MARK => Held::Mark,
                    META_IIFNAME => Held::IifName,
                    other => return Err(NftError::Parse(format!("meta key {other}"))),
                };
                self.regs.insert(w, held);
            }
            "ct" => {
                if a.get(4).is_some() {
                    return Err(NftError::Parse("ct writes".into()));
                }
                let w = self.reg_word(a, 1)?;
                let key = need(a.u32_be(2), "key")?;
                let dir = a.u8(3);
                let held = match (key, dir, fam) {
                    (CT_STATE, None, _) => Held::CtState,
                    (CT_STATUS, None, _) => Held::CtStatus,
                    (CT_DST_IP, Some(CT_DIR_ORIGINAL), Family::Ip)
                    | (CT_DST_IP6, Some(CT_DIR_ORIGINAL), Family::Ip6) => {
                        Held::Field(Selector::CtOriginalDaddr, addr_len(fam))
                    }
                    (CT_PROTO_DST, Some(CT_DIR_ORIGINAL), _) => {
                        Held::Field(Selector::CtOriginalDport, 2)
                    }
                    (CT_SRC_IP, Some(CT_DIR_REPLY), Family::Ip)
                    | (CT_SRC_IP6, Some(CT_DIR_REPLY), Family::Ip6) => {
                        Held::Field(Selector::CtReplySaddr, addr_len(fam))
                    }
                    (CT_PROTO_SRC, Some(CT_DIR_REPLY), _) => Held::Field(Selector::CtReplySport, 2),
                    _ => return Err(NftError::Parse(format!("ct key {key} direction {dir:?}"))),
                };
                self.regs.insert(w, held);
            }
            "numgen" => {
                let w = self.reg_word(a, 1)?;
                if a.u32_be(3) != Some(NG_RANDOM) {
                    return Err(NftError::Parse("numgen other than random".into()));
                }
                let modulus = need(a.u32_be(2), "modulus")?;
                let offset = a.u32_be(4).unwrap_or(0);
                self.regs
                    .insert(w, Held::Field(Selector::Numgen { modulus, offset }, 4));
            }
            "fib" => {
                let w = self.reg_word(a, 1)?;
                let addr = match (a.u32_be(2), a.u32_be(3)) {
                    (Some(FIB_RESULT_ADDRTYPE), Some(FIB_F_SADDR)) => FibAddr::Saddr,
                    (Some(FIB_RESULT_ADDRTYPE), Some(FIB_F_DADDR)) => FibAddr::Daddr,
                    (r, f) => return Err(NftError::Parse(format!("fib result {r:?} flags {f:?}"))),
                };
                self.regs.insert(w, Held::Fib(addr));
            }
            "bitwise" => {
                let s = self.reg_word(a, 1)?;
                let d = self.reg_word(a, 2)?;
                if a.u32_be(6).is_some_and(|op| op != 0) {
                    return Err(NftError::Parse("bitwise shift".into()));
                }
                let mask = need(data_value(a, 4), "mask")?.to_vec();
                let xor = need(data_value(a, 5), "xor")?.to_vec();
                let inner = self.held(s)?.clone();
                self.regs
                    .insert(d, Held::Masked(Box::new(inner), mask, xor));
            }
            "byteorder" => {
                let s = self.reg_word(a, 1)?;
                let d = self.reg_word(a, 2)?;
                let inner = self.held(s)?.clone();
                self.regs.insert(d, inner);
            }
            "immediate" => {
                let r = need(a.u32_be(1), "register")?;
                let data = need(a.nested(2), "data")?;
                if r == NFT_REG_VERDICT {
                    let v = read_verdict(need(data.nested(NFTA_DATA_VERDICT), "verdict")?)?;
                    self.out.push(Expr::Verdict(v));
                } else {
                    let w = word(r).ok_or_else(|| NftError::Parse(format!("register {r}")))?;
                    let v = need(data.get(NFTA_DATA_VALUE), "value")?.to_vec();
                    self.regs.insert(w, Held::Const(v));
                }
            }
            "cmp" => self.cmp(a)?,
            "lookup" => {
                let set_name = need(a.str(1), "set")?.to_owned();
                let set = self.set(&set_name)?.clone();
                let at = self.reg_word(a, 2)?;
                let key = self.fields(at, &set.key)?;
                let inv = a.u32_be(5).unwrap_or(0) & LOOKUP_F_INV != 0;
                match a.u32_be(3) {
                    None => self.out.push(Expr::Lookup {
                        key,
                        set: set_name,
                        negate: inv,
                    }),
                    Some(NFT_REG_VERDICT) if set.is_vmap() => {
                        self.out.push(Expr::Vmap { key, map: set_name })
                    }
                    Some(r) if set.is_map() && !set.is_vmap() => {
                        let w = word(r).ok_or_else(|| NftError::Parse(format!("register {r}")))?;
                        self.regs.insert(w, Held::Found(set_name, key));
                    }
                    Some(r) => return Err(NftError::Parse(format!("lookup into register {r}"))),
                }
            }
            "nat" => {
                if a.u32_be(1) != Some(NAT_DNAT) {
                    return Err(NftError::Parse("nat other than dnat".into()));
                }
                let addr = self.reg_word(a, 3)?;
                let port = self.reg_word(a, 5)?;
                // The kernel lists a single address and port as a range of
                // one.
                if a.u32_be(4).is_some_and(|r| word(r) != Some(addr))
                    || a.u32_be(6).is_some_and(|r| word(r) != Some(port))
                {
                    return Err(NftError::Parse("nat to a range".into()));
                }
                let target = match (self.held(addr)?, self.held(port)?) {
                    (Held::Found(map, key), _) if port == addr + words(addr_len(fam)) => {
                        DnatTarget::Map {
                            key: key.clone(),
                            map: map.clone(),
                        }
                    }
                    (Held::Const(a), Held::Const(p)) => {
                        let Value::Addr(ip) = value_of(fam.addr_type(), a)? else {
                            return Err(NftError::Parse("dnat address".into()));
                        };
                        let Value::Port(port) = value_of(DataType::InetService, p)? else {
                            return Err(NftError::Parse("dnat port".into()));
                        };
                        DnatTarget::Addr(ip, port)
                    }
                    (x, y) => return Err(NftError::Parse(format!("dnat to {x:?} {y:?}"))),
                };
                self.out.push(Expr::Dnat(target));
            }
            "masq" => {
                if a.u32_be(1) != Some(NAT_RANDOM_FULLY) || a.get(2).is_some() || a.get(3).is_some()
                {
                    return Err(NftError::Parse(format!(
                        "masquerade flags {:?}",
                        a.u32_be(1)
                    )));
                }
                self.out.push(Expr::Masquerade);
            }
            "reject" => {
                let want = match fam {
                    Family::Ip => ICMP_PORT_UNREACH,
                    Family::Ip6 => ICMPV6_PORT_UNREACH,
                };
                if a.u32_be(1) != Some(REJECT_ICMP_UNREACH) || a.u8(2) != Some(want) {
                    return Err(NftError::Parse(format!(
                        "reject type {:?} code {:?}",
                        a.u32_be(1),
                        a.u8(2)
                    )));
                }
                self.out.push(Expr::Reject);
            }
            "log" => {
                let group = a
                    .get(LOG_GROUP)
                    .and_then(|g| Some(u16::from_be_bytes(g.get(..2)?.try_into().ok()?)));
                let Some(group) = group else {
                    return Err(NftError::Parse("log without a group".into()));
                };
                self.out.push(Expr::Log {
                    prefix: a.str(LOG_PREFIX).unwrap_or_default().to_owned(),
                    group,
                });
            }
            "limit" => {
                let rate = a.u64_be(LIMIT_RATE).and_then(|r| u32::try_from(r).ok());
                let (Some(rate), Some(1), Some(burst)) =
                    (rate, a.u64_be(LIMIT_UNIT), a.u32_be(LIMIT_BURST))
                else {
                    return Err(NftError::Parse("limit other than packets a second".into()));
                };
                if a.u32_be(LIMIT_TYPE).unwrap_or(LIMIT_PACKETS) != LIMIT_PACKETS
                    || a.u32_be(LIMIT_FLAGS).unwrap_or(0) != 0
                {
                    return Err(NftError::Parse("limit of bytes, or inverted".into()));
                }
                self.out.push(Expr::Limit { rate, burst });
            }
            "counter" => {
                self.counter = Some(crate::backend::Counter {
                    bytes: a.u64_be(1).unwrap_or(0),
                    packets: a.u64_be(2).unwrap_or(0),
                });
                self.out.push(Expr::Counter);
            }
            "dynset" => {
                let set_name = need(a.str(1), "set")?.to_owned();
                if a.u32_be(3) != Some(DYNSET_OP_UPDATE)
                    || a.get(7).is_some()
                    || a.get(10).is_some()
                {
                    return Err(NftError::Parse("dynset other than a plain update".into()));
                }
                let set = self.set(&set_name)?.clone();
                let key = self.parts(self.reg_word(a, 4)?, &set.key)?;
                let value = match (a.u32_be(5), &set.value) {
                    (Some(r), Some(types)) => {
                        let w = word(r).ok_or_else(|| NftError::Parse(format!("register {r}")))?;
                        self.parts(w, types)?
                    }
                    (None, None) => Vec::new(),
                    _ => return Err(NftError::Parse("dynset value and map disagree".into())),
                };
                // The kernel reports 0 for a rule that leaves the timeout
                // to the set's own.
                let timeout = match a.u64_be(6) {
                    Some(0) | None => None,
                    Some(ms) if ms % 1000 == 0 => Some(
                        u32::try_from(ms / 1000)
                            .map_err(|_| NftError::Parse(format!("timeout {ms} ms")))?,
                    ),
                    Some(ms) => return Err(NftError::Parse(format!("timeout {ms} ms"))),
                };
                self.out.push(Expr::Update {
                    set: set_name,
                    key,
                    timeout,
                    value,
                });
            }
            other => {
                return Err(NftError::Parse(format!(
                    "{other} is not an expression verdict writes"
                )));
            }
        }
        Ok(())
    }

    fn cmp(&mut self, a: Attrs<'_>) -> Result<(), NftError> {
        let fam = self.family;
        let w = self.reg_word(a, 1)?;
        let op = match need(a.u32_be(2), "operator")? {
            CMP_EQ => CmpOp::Eq,
            CMP_NEQ => CmpOp::Ne,
            CMP_LT => CmpOp::Lt,
            other => return Err(NftError::Parse(format!("operator {other}"))),
        };
        let data = need(data_value(a, 3), "data")?;
        let zero = data.iter().all(|b| *b == 0);
        let held = self.held(w)?.clone();
        let x = match held {
            Held::Field(s, len) if len < selector_len(fam, s) => {
                let mut b = data.to_vec();
                b.resize(selector_len(fam, s), 0);
                Expr::Cmp {
                    selector: s,
                    op,
                    value: Value::Prefix(net_of(fam, &b, len * 8)?),
                }
            }
            Held::Field(s, _) => Expr::Cmp {
                selector: s,
                op,
                value: value_of(selector_type(fam, s), data)?,
            },
            Held::Masked(inner, mask, xor) if xor.iter().all(|b| *b == 0) => match *inner {
                Held::CtState if op == CmpOp::Ne && zero && u32_ne(&mask)? == CT_STATE_NEW => {
                    Expr::CtStateNew
                }
                Held::CtStatus if op == CmpOp::Ne && zero && u32_ne(&mask)? == CT_STATUS_DNAT => {
                    Expr::CtStatusDnat
                }
                Held::Mark if zero && op != CmpOp::Lt => Expr::MarkAnd {
                    mask: u32_ne(&mask)?,
                    nonzero: op == CmpOp::Ne,
                },
                Held::Field(s, len) if len == selector_len(fam, s) => {
                    let bits = mask_bits(&mask)?;
                    Expr::Cmp {
                        selector: s,
                        op,
                        value: Value::Prefix(net_of(fam, data, bits)?),
                    }
                }
                other => return Err(NftError::Parse(format!("comparison of masked {other:?}"))),
            },
            Held::Fib(addr) if op == CmpOp::Eq && u32_ne(data)? == RTN_LOCAL => {
                Expr::FibLocal(addr)
            }
            Held::IifName if op != CmpOp::Lt => {
                let end = data.iter().position(|b| *b == 0).unwrap_or(data.len());
                let name = std::str::from_utf8(&data[..end])
                    .map_err(|_| NftError::Parse("interface name".into()))?;
                let name = if data.len() < IFNAMSIZ && end == data.len() {
                    format!("{name}*")
                } else {
                    name.to_owned()
                };
                Expr::IifName {
                    name,
                    negate: op == CmpOp::Ne,
                }
            }
            other => return Err(NftError::Parse(format!("comparison of {other:?}"))),
        };
        self.out.push(x);
        Ok(())
    }
}

fn u32_ne(b: &[u8]) -> Result<u32, NftError> {
    Ok(u32::from_ne_bytes(
        b.get(..4)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| NftError::Parse(format!("{} bytes for a 32-bit value", b.len())))?,
    ))
}

/// The prefix length of a contiguous network mask.
fn mask_bits(mask: &[u8]) -> Result<usize, NftError> {
    let ones: usize = mask.iter().map(|b| b.count_ones() as usize).sum();
    let contiguous = mask
        .iter()
        .flat_map(|b| (0..8).rev().map(move |i| b >> i & 1))
        .skip(ones)
        .all(|bit| bit == 0);
    if !contiguous {
        return Err(NftError::Parse(format!("mask {mask:02x?} is not a prefix")));
    }
    Ok(ones)
}

fn net_of(family: Family, b: &[u8], bits: usize) -> Result<IpNet, NftError> {
    let Value::Addr(a) = value_of(family.addr_type(), b)? else {
        return Err(NftError::Parse("address".into()));
    };
    IpNet::new(a, bits as u8).map_err(|e| NftError::Parse(format!("{a}/{bits}: {e}")))
}
