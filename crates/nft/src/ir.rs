//! The typed nftables objects verdict writes: tables, chains, sets and maps,
//! elements and rules. Every type renders itself as `nft` script text; the
//! tracer interprets the same values, so nothing is ever parsed back from text.

use std::cmp::Ordering;
use std::fmt::{self, Display, Formatter};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

/// Longest object name the kernel accepts (`NFT_NAME_MAXLEN`).
pub const NAME_LENGTH_MAX: usize = 256;
/// Longest comment nft stores, in bytes (`NFTNL_UDATA_COMMENT_MAXLEN`).
pub const COMMENT_LENGTH_MAX: usize = 128;

/// A comment that fits [`COMMENT_LENGTH_MAX`]: returned as is when it fits,
/// else cut at a character boundary and ended with `~` and eight hex digits
/// of a hash of the whole text. The result is deterministic, valid UTF-8,
/// and two different long comments stay different (unless their hashes
/// collide), so a comment still names its owner.
pub fn fit_comment(comment: impl Into<String>) -> String {
    let mut s: String = comment.into();
    if s.len() <= COMMENT_LENGTH_MAX {
        return s;
    }
    // FNV-1a, 64 bits, folded to 32: stable across builds and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let tag = format!("~{:08x}", (h ^ (h >> 32)) as u32);
    let mut cut = COMMENT_LENGTH_MAX - tag.len();
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    s.push_str(&tag);
    s
}

/// An nftables address family. verdict uses one table per IP family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// `ip`: IPv4.
    Ip,
    /// `ip6`: IPv6.
    Ip6,
}

impl Family {
    /// The family an address belongs to.
    pub fn of(addr: IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::Ip,
            IpAddr::V6(_) => Family::Ip6,
        }
    }

    /// The address data type of this family (`ipv4_addr` / `ipv6_addr`).
    pub fn addr_type(self) -> DataType {
        match self {
            Family::Ip => DataType::Ipv4Addr,
            Family::Ip6 => DataType::Ipv6Addr,
        }
    }

    /// The loopback network, which NodePorts never accept.
    pub fn loopback(self) -> IpNet {
        match self {
            Family::Ip => IpNet::V4(ipnet::Ipv4Net::new_assert([127, 0, 0, 0].into(), 8)),
            Family::Ip6 => IpNet::V6(ipnet::Ipv6Net::new_assert(
                std::net::Ipv6Addr::LOCALHOST,
                128,
            )),
        }
    }
}

impl Display for Family {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
        })
    }
}

impl Family {
    /// How nft names the family.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
        }
    }
}

/// One nftables table: its family and its name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Table {
    /// Its family.
    pub family: Family,
    /// Its name.
    pub name: String,
}

impl Table {
    /// The table `name` of `family`.
    pub fn new(family: Family, name: impl Into<String>) -> Table {
        Table {
            family,
            name: name.into(),
        }
    }

    /// Whether a table named by nft's spelling of its family (`ip`,
    /// `inet`, ...) and its name is this one.
    pub fn is(&self, family: &str, name: &str) -> bool {
        self.family.as_str() == family && self.name == name
    }
}

impl Display for Table {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.family, self.name)
    }
}

/// A netfilter hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Hook {
    /// Incoming packets before routing.
    Prerouting,
    /// Packets for a local socket.
    Input,
    /// Routed packets.
    Forward,
    /// Locally generated packets.
    Output,
    /// Every outgoing packet after routing.
    Postrouting,
}

impl Display for Hook {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Hook::Prerouting => "prerouting",
            Hook::Input => "input",
            Hook::Forward => "forward",
            Hook::Output => "output",
            Hook::Postrouting => "postrouting",
        })
    }
}

/// The type of a base chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChainType {
    /// `type filter`.
    Filter,
    /// `type nat`: only sees the first packet of a connection.
    Nat,
}

impl Display for ChainType {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
        })
    }
}

/// Hook, type and numeric priority of a base chain. Priorities are written as
/// numbers (nft rejects some named priorities in some hooks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BaseChain {
    /// Chain type.
    pub chain_type: ChainType,
    /// Hook the chain is attached to.
    pub hook: Hook,
    /// Lower runs first.
    pub priority: i32,
}

/// A chain definition.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Chain {
    /// Chain name.
    pub name: String,
    /// `Some` for base chains.
    pub base: Option<BaseChain>,
    /// Optional comment.
    pub comment: Option<String>,
}

impl Chain {
    /// A regular chain.
    pub fn regular(name: impl Into<String>) -> Chain {
        Chain {
            name: name.into(),
            base: None,
            comment: None,
        }
    }

    /// A base chain.
    pub fn base(
        name: impl Into<String>,
        chain_type: ChainType,
        hook: Hook,
        priority: i32,
    ) -> Chain {
        Chain {
            name: name.into(),
            base: Some(BaseChain {
                chain_type,
                hook,
                priority,
            }),
            comment: None,
        }
    }

    /// Sets the comment (cut to fit the kernel, see [`fit_comment`]).
    #[must_use]
    pub fn with_comment(mut self, comment: impl Into<String>) -> Chain {
        self.comment = Some(fit_comment(comment));
        self
    }
}

/// The data types verdict uses in set keys and map values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DataType {
    /// An IPv4 address.
    Ipv4Addr,
    /// An IPv6 address.
    Ipv6Addr,
    /// A layer-4 protocol.
    InetProto,
    /// A port.
    InetService,
    /// A port of one protocol: declared with `typeof tcp dport` (nft cannot
    /// use a `typeof … th dport` map from rules added in later runs).
    PortOf(L4Proto),
    /// A 32-bit integer produced by `numgen` (declared with `typeof`).
    Numgen,
    /// A verdict (only as a map value).
    Verdict,
}

impl DataType {
    /// The nft name of the type (`ipv4_addr`, `inet_service`, …).
    pub fn type_name(self) -> &'static str {
        match self {
            DataType::Ipv4Addr => "ipv4_addr",
            DataType::Ipv6Addr => "ipv6_addr",
            DataType::InetProto => "inet_proto",
            DataType::InetService | DataType::PortOf(_) => "inet_service",
            DataType::Numgen => "integer",
            DataType::Verdict => "verdict",
        }
    }

    /// The expression nft derives the type from in a `typeof` declaration.
    fn typeof_expr(self) -> &'static str {
        match self {
            DataType::Ipv4Addr => "ip daddr",
            DataType::Ipv6Addr => "ip6 daddr",
            DataType::InetProto => "meta l4proto",
            DataType::InetService => "th dport",
            DataType::PortOf(L4Proto::Tcp) => "tcp dport",
            DataType::PortOf(L4Proto::Udp) => "udp dport",
            DataType::PortOf(L4Proto::Sctp) => "sctp dport",
            DataType::Numgen => "numgen random mod 1",
            DataType::Verdict => "verdict",
        }
    }
}

/// A named set (no value type) or map (with a value type).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Set {
    /// Set name.
    pub name: String,
    /// Key fields, concatenated with ` . `.
    pub key: Vec<DataType>,
    /// `Some` for maps: the value fields.
    pub value: Option<Vec<DataType>>,
    /// Elements may be prefixes (`flags interval`).
    pub interval: bool,
    /// Elements are added by the data path and expire (`flags dynamic,timeout`).
    pub timeout: Option<u32>,
    /// Maximum number of elements (dynamic sets).
    pub size: Option<u32>,
    /// Every element counts the packets that matched it (`counter`).
    pub counters: bool,
    /// Optional comment.
    pub comment: Option<String>,
}

impl Set {
    /// A set with the given key.
    #[allow(clippy::self_named_constructors)]
    pub fn set(name: impl Into<String>, key: Vec<DataType>) -> Set {
        Set {
            name: name.into(),
            key,
            value: None,
            interval: false,
            timeout: None,
            size: None,
            counters: false,
            comment: None,
        }
    }

    /// A map from `key` to `value`.
    pub fn map(name: impl Into<String>, key: Vec<DataType>, value: Vec<DataType>) -> Set {
        Set {
            value: Some(value),
            ..Set::set(name, key)
        }
    }

    /// Sets the comment (cut to fit the kernel, see [`fit_comment`]).
    #[must_use]
    pub fn with_comment(mut self, comment: impl Into<String>) -> Set {
        self.comment = Some(fit_comment(comment));
        self
    }

    /// Marks the set as an interval set.
    #[must_use]
    pub fn with_interval(mut self) -> Set {
        self.interval = true;
        self
    }

    /// Gives every element a packet and byte counter.
    #[must_use]
    pub fn with_counters(mut self) -> Set {
        self.counters = true;
        self
    }

    /// Marks the set as dynamic with a default timeout and a size limit.
    #[must_use]
    pub fn with_timeout(mut self, seconds: u32, size: u32) -> Set {
        self.timeout = Some(seconds);
        self.size = Some(size);
        self
    }

    /// Whether `other` has the same key and value types and flags, ignoring
    /// comment and size, and how a port type was declared (nft lists a
    /// `typeof tcp dport` field as plain `inet_service`).
    pub fn same_type(&self, other: &Set) -> bool {
        let names = |t: &[DataType]| t.iter().map(|d| d.type_name()).collect::<Vec<_>>();
        names(&self.key) == names(&other.key)
            && self.value.as_deref().map(names) == other.value.as_deref().map(names)
            && self.interval == other.interval
            && self.timeout.is_some() == other.timeout.is_some()
            && self.counters == other.counters
    }

    /// Whether this is a map.
    pub fn is_map(&self) -> bool {
        self.value.is_some()
    }

    /// Whether this is a verdict map.
    pub fn is_vmap(&self) -> bool {
        matches!(self.value.as_deref(), Some([DataType::Verdict]))
    }

    /// `set` or `map`.
    pub fn kind(&self) -> &'static str {
        if self.is_map() { "map" } else { "set" }
    }

    fn uses_typeof(&self) -> bool {
        self.key.contains(&DataType::Numgen)
            || self
                .value
                .as_ref()
                .is_some_and(|v| v.contains(&DataType::Numgen))
    }

    /// The body of the declaration: `type … ; flags … ;`.
    pub(crate) fn spec(&self) -> String {
        let mut s = String::new();
        if self.uses_typeof() {
            s.push_str("typeof ");
            s.push_str(&join(self.key.iter().map(|t| t.typeof_expr()), " . "));
            if let Some(v) = &self.value {
                s.push_str(" : ");
                s.push_str(&join(v.iter().map(|t| t.typeof_expr()), " . "));
            }
        } else {
            s.push_str("type ");
            s.push_str(&join(self.key.iter().map(|t| t.type_name()), " . "));
            if let Some(v) = &self.value {
                s.push_str(" : ");
                s.push_str(&join(v.iter().map(|t| t.type_name()), " . "));
            }
        }
        s.push_str(" ;");
        let mut flags = Vec::new();
        if self.interval {
            flags.push("interval");
        }
        if self.timeout.is_some() {
            flags.push("dynamic");
            flags.push("timeout");
        }
        if !flags.is_empty() {
            s.push_str(&format!(" flags {} ;", flags.join(",")));
        }
        if let Some(t) = self.timeout {
            s.push_str(&format!(" timeout {t}s ;"));
        }
        if let Some(size) = self.size {
            s.push_str(&format!(" size {size} ;"));
        }
        if self.counters {
            s.push_str(" counter ;");
        }
        if let Some(c) = &self.comment {
            s.push_str(&format!(" comment {} ;", quote(c)));
        }
        s
    }
}

/// A layer-4 protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum L4Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl L4Proto {
    /// All protocols verdict proxies.
    pub const ALL: [L4Proto; 3] = [L4Proto::Tcp, L4Proto::Udp, L4Proto::Sctp];

    /// IANA protocol number.
    pub fn number(self) -> u8 {
        match self {
            L4Proto::Tcp => 6,
            L4Proto::Udp => 17,
            L4Proto::Sctp => 132,
        }
    }
}

impl Display for L4Proto {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            L4Proto::Tcp => "tcp",
            L4Proto::Udp => "udp",
            L4Proto::Sctp => "sctp",
        })
    }
}

/// A constant in a key, a value or a comparison. Ordered by kind (in the
/// order below), then by value: addresses as numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Value {
    /// An address.
    Addr(IpAddr),
    /// A network (interval sets and prefix matches).
    Prefix(IpNet),
    /// A protocol.
    Proto(L4Proto),
    /// A port.
    Port(u16),
    /// An integer (numgen slots, marks).
    Int(u32),
}

impl Ord for Value {
    /// The order a derived `Ord` would give, with an address compared as
    /// one number: the proxier sorts and searches keys of addresses by
    /// the hundreds of thousands, and std compares an address's octets
    /// through `memcmp`.
    fn cmp(&self, other: &Value) -> Ordering {
        match (self, other) {
            (Value::Addr(IpAddr::V4(a)), Value::Addr(IpAddr::V4(b))) => {
                u32::from(*a).cmp(&u32::from(*b))
            }
            (Value::Addr(IpAddr::V6(a)), Value::Addr(IpAddr::V6(b))) => {
                u128::from(*a).cmp(&u128::from(*b))
            }
            (Value::Addr(a), Value::Addr(b)) => a.cmp(b),
            (Value::Prefix(a), Value::Prefix(b)) => a.cmp(b),
            (Value::Proto(a), Value::Proto(b)) => a.cmp(b),
            (Value::Port(a), Value::Port(b)) => a.cmp(b),
            (Value::Int(a), Value::Int(b)) => a.cmp(b),
            _ => self.kind().cmp(&other.kind()),
        }
    }
}

impl PartialOrd for Value {
    fn partial_cmp(&self, other: &Value) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Value {
    /// The kind's place in the order of values.
    fn kind(&self) -> u8 {
        match self {
            Value::Addr(_) => 0,
            Value::Prefix(_) => 1,
            Value::Proto(_) => 2,
            Value::Port(_) => 3,
            Value::Int(_) => 4,
        }
    }

    /// Whether a packet-derived value matches this element field.
    pub fn matches(&self, packet: &Value) -> bool {
        match (self, packet) {
            (Value::Prefix(net), Value::Addr(a)) => net.contains(a),
            _ => self == packet,
        }
    }

    /// Renders the value; `in_dynset` spells protocols by number, because nft
    /// reads a bare `tcp` inside `update @set { … }` as a protocol keyword.
    fn render(&self, in_dynset: bool) -> String {
        match self {
            Value::Addr(a) => a.to_string(),
            Value::Prefix(n) => n.to_string(),
            Value::Proto(p) if in_dynset => p.number().to_string(),
            Value::Proto(p) => p.to_string(),
            Value::Port(p) => p.to_string(),
            Value::Int(i) => i.to_string(),
        }
    }
}

impl Display for Value {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(false))
    }
}

/// A rule or element verdict.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// Accept (in this base chain).
    Accept,
    /// Drop.
    Drop,
    /// Return to the calling chain.
    Return,
    /// Call a chain and come back.
    Jump(String),
    /// Continue in a chain and do not come back.
    Goto(String),
}

impl Verdict {
    /// The chain this verdict refers to, if any.
    pub fn target(&self) -> Option<&str> {
        match self {
            Verdict::Jump(c) | Verdict::Goto(c) => Some(c),
            _ => None,
        }
    }
}

impl Display for Verdict {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Accept => f.write_str("accept"),
            Verdict::Drop => f.write_str("drop"),
            Verdict::Return => f.write_str("return"),
            Verdict::Jump(c) => write!(f, "jump {c}"),
            Verdict::Goto(c) => write!(f, "goto {c}"),
        }
    }
}

/// The value side of a map element.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ElementValue {
    /// A verdict (verdict maps).
    Verdict(Verdict),
    /// Data fields (e.g. `10.0.0.1 . 80`).
    Data(Vec<Value>),
}

impl Display for ElementValue {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            ElementValue::Verdict(v) => v.fmt(f),
            ElementValue::Data(d) => f.write_str(&join(d.iter().map(|v| v.to_string()), " . ")),
        }
    }
}

/// A set or map element.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Element {
    /// Key fields, shared: the proxier keys its maps of elements by the
    /// same allocation.
    pub key: Arc<[Value]>,
    /// Value, for maps.
    pub value: Option<ElementValue>,
    /// Optional comment (not compared by the kernel). Boxed, without
    /// spare room: that keeps an element at 64 bytes, so a shared one
    /// (`Arc<Element>`) takes an 80-byte block, not a 96-byte one
    /// (180,000 of them at 30,000 Services).
    pub comment: Option<Box<str>>,
}

impl Element {
    /// A set element.
    pub fn key(key: impl Into<Arc<[Value]>>) -> Element {
        Element {
            key: key.into(),
            value: None,
            comment: None,
        }
    }

    /// A map element.
    pub fn map(key: impl Into<Arc<[Value]>>, value: ElementValue) -> Element {
        Element {
            key: key.into(),
            value: Some(value),
            comment: None,
        }
    }

    /// Sets the comment (cut to fit the kernel, see [`fit_comment`]).
    #[must_use]
    pub fn with_comment(mut self, comment: impl Into<String>) -> Element {
        self.comment = Some(fit_comment(comment).into_boxed_str());
        self
    }
}

impl Display for Element {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(&join(self.key.iter().map(|v| v.to_string()), " . "))?;
        if let Some(c) = &self.comment {
            write!(f, " comment {}", quote(c))?;
        }
        if let Some(v) = &self.value {
            write!(f, " : {v}")?;
        }
        Ok(())
    }
}

/// A packet field a rule reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Selector {
    /// `ip saddr` / `ip6 saddr`.
    Saddr,
    /// `ip daddr` / `ip6 daddr`.
    Daddr,
    /// `meta l4proto`.
    L4Proto,
    /// `th dport`.
    Dport,
    /// `th sport`.
    Sport,
    /// `ct original ip daddr`: the destination before NAT.
    CtOriginalDaddr,
    /// `ct original proto-dst`: the destination port before NAT (needs a
    /// `meta l4proto` match earlier in the rule).
    CtOriginalDport,
    /// `ct reply ip saddr`: the source of the connection's replies, which
    /// after DNAT is the endpoint.
    CtReplySaddr,
    /// `ct reply proto-src`: the source port of the replies (the
    /// endpoint's port after DNAT; needs a `meta l4proto` match earlier in
    /// the rule).
    CtReplySport,
    /// `numgen random mod N offset O`: a random number in `[O, O+N)`.
    Numgen {
        /// Modulus (> 0).
        modulus: u32,
        /// Offset added to the result.
        offset: u32,
    },
}

impl Selector {
    fn render(self, family: Family) -> String {
        match self {
            Selector::Saddr => format!("{family} saddr"),
            Selector::Daddr => format!("{family} daddr"),
            Selector::L4Proto => "meta l4proto".into(),
            Selector::Dport => "th dport".into(),
            Selector::Sport => "th sport".into(),
            Selector::CtOriginalDaddr => format!("ct original {family} daddr"),
            Selector::CtOriginalDport => "ct original proto-dst".into(),
            Selector::CtReplySaddr => format!("ct reply {family} saddr"),
            Selector::CtReplySport => "ct reply proto-src".into(),
            Selector::Numgen { modulus, offset: 0 } => format!("numgen random mod {modulus}"),
            Selector::Numgen { modulus, offset } => {
                format!("numgen random mod {modulus} offset {offset}")
            }
        }
    }
}

/// One part of a dynamic-set key or value: a packet field or a constant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KeyPart {
    /// Read from the packet.
    Field(Selector),
    /// A constant.
    Const(Value),
}

/// A comparison operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CmpOp {
    /// Equal (or inside a prefix).
    Eq,
    /// Not equal (or outside a prefix).
    Ne,
    /// Less than (integers).
    Lt,
}

/// Which address `fib … type local` checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FibAddr {
    /// `fib saddr type local`.
    Saddr,
    /// `fib daddr type local`.
    Daddr,
}

/// Where a DNAT sends the packet.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DnatTarget {
    /// `dnat to ADDR:PORT`.
    Addr(IpAddr, u16),
    /// `dnat ip addr . port to KEY map @MAP`: the map yields address . port.
    Map {
        /// Key fields.
        key: Vec<Selector>,
        /// Map name.
        map: String,
    },
}

/// One match or statement of a rule.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Expr {
    /// `SELECTOR [!=|<] VALUE`.
    Cmp {
        /// Field.
        selector: Selector,
        /// Operator.
        op: CmpOp,
        /// Constant.
        value: Value,
    },
    /// `KEY [!=] @SET`.
    Lookup {
        /// Key fields.
        key: Vec<Selector>,
        /// Set name.
        set: String,
        /// `!=`: matches when the key is absent.
        negate: bool,
    },
    /// `fib saddr|daddr type local`.
    FibLocal(FibAddr),
    /// `iifname [!=] NAME` (a trailing `*` is a prefix wildcard).
    IifName {
        /// Interface name or prefix with `*`.
        name: String,
        /// `!=`.
        negate: bool,
    },
    /// `ct state new`.
    CtStateNew,
    /// `ct status dnat`.
    CtStatusDnat,
    /// `meta mark & MASK != 0` (`nonzero`) or `== 0`.
    MarkAnd {
        /// Mask.
        mask: u32,
        /// Match when the masked mark is non-zero.
        nonzero: bool,
    },
    /// `meta mark set meta mark | BITS`.
    MarkOr(u32),
    /// `meta mark set meta mark ^ BITS`.
    MarkXor(u32),
    /// `meta nftrace set 1`: the kernel reports every rule the packet
    /// meets from here on (`verdict trace --live` marks its probe so).
    NftraceOn,
    /// A verdict.
    Verdict(Verdict),
    /// `KEY vmap @MAP`.
    Vmap {
        /// Key fields.
        key: Vec<Selector>,
        /// Verdict map name.
        map: String,
    },
    /// `reject`.
    Reject,
    /// `counter`: counts the packets and bytes that reach it (read back
    /// into [`ChainState::counters`](crate::ChainState::counters), not
    /// into the rule, so that a rule compares equal whatever it counted).
    Counter,
    /// `log prefix "PREFIX" group GROUP`: a copy of the packet's headers
    /// goes to the nfnetlink_log group, with the prefix (the flow stream
    /// reads why a connection was rejected or dropped from it).
    Log {
        /// Up to 127 bytes, without quotes.
        prefix: String,
        /// The nfnetlink_log group.
        group: u16,
    },
    /// `limit rate RATE/second burst BURST packets`: matches while the
    /// packets that reached it stay within the rate (a token bucket of
    /// BURST packets, refilled at RATE a second); past it, the rule stops
    /// here and the packet goes on to the next rule. Its state lives in
    /// the rule: writing the rule again starts a full bucket.
    Limit {
        /// Packets a second.
        rate: u32,
        /// The bucket's size, in packets.
        burst: u32,
    },
    /// `masquerade fully-random`.
    Masquerade,
    /// DNAT (the rule must match `meta l4proto` first).
    Dnat(DnatTarget),
    /// `update @SET { KEY [timeout Ns] [: VALUE] }` from the data path.
    Update {
        /// Dynamic set or map.
        set: String,
        /// Key parts.
        key: Vec<KeyPart>,
        /// Per-element timeout.
        timeout: Option<u32>,
        /// Value parts for maps.
        value: Vec<KeyPart>,
    },
}

impl Expr {
    /// Names of the sets and maps this expression refers to.
    pub fn set_refs(&self) -> Option<&str> {
        match self {
            Expr::Lookup { set, .. } | Expr::Vmap { map: set, .. } | Expr::Update { set, .. } => {
                Some(set)
            }
            Expr::Dnat(DnatTarget::Map { map, .. }) => Some(map),
            _ => None,
        }
    }

    /// The chain this expression jumps to, if any.
    pub fn chain_ref(&self) -> Option<&str> {
        match self {
            Expr::Verdict(v) => v.target(),
            _ => None,
        }
    }

    fn render(&self, family: Family) -> String {
        let keys = |key: &[Selector]| join(key.iter().map(|s| s.render(family)), " . ");
        let parts = |parts: &[KeyPart]| {
            join(
                parts.iter().map(|p| match p {
                    KeyPart::Field(s) => s.render(family),
                    KeyPart::Const(v) => v.render(true),
                }),
                " . ",
            )
        };
        match self {
            Expr::Cmp {
                selector,
                op,
                value,
            } => {
                let op = match op {
                    CmpOp::Eq => "",
                    CmpOp::Ne => "!= ",
                    CmpOp::Lt => "< ",
                };
                format!("{} {op}{value}", selector.render(family))
            }
            Expr::Lookup { key, set, negate } => {
                format!("{} {}@{set}", keys(key), if *negate { "!= " } else { "" })
            }
            Expr::FibLocal(FibAddr::Saddr) => "fib saddr type local".into(),
            Expr::FibLocal(FibAddr::Daddr) => "fib daddr type local".into(),
            Expr::IifName { name, negate } => {
                format!("iifname {}{name}", if *negate { "!= " } else { "" })
            }
            Expr::CtStateNew => "ct state new".into(),
            Expr::CtStatusDnat => "ct status dnat".into(),
            Expr::MarkAnd { mask, nonzero } => format!(
                "meta mark & {mask:#010x} {} 0x00000000",
                if *nonzero { "!=" } else { "==" }
            ),
            Expr::MarkOr(bits) => format!("meta mark set meta mark | {bits:#010x}"),
            Expr::MarkXor(bits) => format!("meta mark set meta mark ^ {bits:#010x}"),
            Expr::NftraceOn => "meta nftrace set 1".into(),
            Expr::Verdict(v) => v.to_string(),
            Expr::Vmap { key, map } => format!("{} vmap @{map}", keys(key)),
            Expr::Reject => "reject".into(),
            Expr::Counter => "counter".into(),
            Expr::Log { prefix, group } => format!("log prefix \"{prefix}\" group {group}"),
            Expr::Limit { rate, burst } => {
                format!("limit rate {rate}/second burst {burst} packets")
            }
            Expr::Masquerade => "masquerade fully-random".into(),
            Expr::Dnat(DnatTarget::Addr(IpAddr::V4(a), port)) => format!("dnat to {a}:{port}"),
            Expr::Dnat(DnatTarget::Addr(IpAddr::V6(a), port)) => format!("dnat to [{a}]:{port}"),
            Expr::Dnat(DnatTarget::Map { key, map }) => {
                format!("dnat {family} addr . port to {} map @{map}", keys(key))
            }
            Expr::Update {
                set,
                key,
                timeout,
                value,
            } => {
                let mut s = format!("update @{set} {{ {}", parts(key));
                if let Some(t) = timeout {
                    s.push_str(&format!(" timeout {t}s"));
                }
                if !value.is_empty() {
                    s.push_str(&format!(" : {}", parts(value)));
                }
                s.push_str(" }");
                s
            }
        }
    }
}

/// A rule: matches and statements evaluated left to right, with an optional
/// comment.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rule {
    /// Expressions in order.
    pub exprs: Vec<Expr>,
    /// Optional comment.
    pub comment: Option<String>,
}

impl Rule {
    /// A rule from expressions.
    pub fn new(exprs: Vec<Expr>) -> Rule {
        Rule {
            exprs,
            comment: None,
        }
    }

    /// Sets the comment (cut to fit the kernel, see [`fit_comment`]).
    #[must_use]
    pub fn with_comment(mut self, comment: impl Into<String>) -> Rule {
        self.comment = Some(fit_comment(comment));
        self
    }

    /// The rule's text in `family`, as `nft` reads it.
    pub fn render(&self, family: Family) -> String {
        let mut s = join(self.exprs.iter().map(|e| e.render(family)), " ");
        if let Some(c) = &self.comment {
            s.push_str(&format!(" comment {}", quote(c)));
        }
        s
    }
}

/// Quotes a comment for nft.
pub(crate) fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "'"))
}

pub(crate) fn join<I, S>(items: I, sep: &str) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut out = String::new();
    for (i, s) in items.into_iter().enumerate() {
        if i > 0 {
            out.push_str(sep);
        }
        out.push_str(s.as_ref());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_its_family_and_name() {
        let t = Table::new(Family::Ip6, "verdict");
        assert_eq!(t.to_string(), "ip6 verdict");
        assert!(t.is("ip6", "verdict"));
        assert!(!t.is("ip", "verdict") && !t.is("inet", "verdict") && !t.is("ip6", "kube-proxy"));
        assert!(
            Table::new(Family::Ip, "verdict") < t,
            "ordered by family first"
        );
    }

    /// Values ordered by kind, then as std orders each kind (an address
    /// by its octets, a network as ipnet does): the derived order.
    #[test]
    fn values_order_as_a_derived_order_would() {
        fn reference(a: &Value, b: &Value) -> Ordering {
            let kind = |v: &Value| match v {
                Value::Addr(_) => 0,
                Value::Prefix(_) => 1,
                Value::Proto(_) => 2,
                Value::Port(_) => 3,
                Value::Int(_) => 4,
            };
            match (a, b) {
                (Value::Addr(x), Value::Addr(y)) => x.cmp(y),
                (Value::Prefix(x), Value::Prefix(y)) => x.cmp(y),
                (Value::Proto(x), Value::Proto(y)) => x.cmp(y),
                (Value::Port(x), Value::Port(y)) => x.cmp(y),
                (Value::Int(x), Value::Int(y)) => x.cmp(y),
                _ => kind(a).cmp(&kind(b)),
            }
        }
        let addr = |s: &str| Value::Addr(s.parse().unwrap());
        let net = |s: &str| Value::Prefix(s.parse().unwrap());
        let values = [
            addr("0.0.0.0"),
            addr("9.255.255.255"),
            addr("10.0.0.1"),
            addr("10.0.0.10"),
            addr("10.0.1.0"),
            addr("255.255.255.255"),
            addr("::"),
            addr("::1"),
            addr("fd00::1"),
            addr("fd00::1:0"),
            addr("ffff::"),
            net("10.0.0.0/8"),
            net("10.0.0.0/16"),
            net("10.1.0.0/16"),
            net("fd00::/64"),
            Value::Proto(L4Proto::Tcp),
            Value::Proto(L4Proto::Udp),
            Value::Proto(L4Proto::Sctp),
            Value::Port(0),
            Value::Port(80),
            Value::Port(65535),
            Value::Int(0),
            Value::Int(7),
            Value::Int(u32::MAX),
        ];
        for a in &values {
            for b in &values {
                assert_eq!(a.cmp(b), reference(a, b), "{a:?} against {b:?}");
                assert_eq!(a.partial_cmp(b), Some(reference(a, b)));
                assert_eq!(a.cmp(b) == Ordering::Equal, a == b);
            }
        }
    }

    fn v4(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn renders_rules_per_family() {
        let rule = Rule::new(vec![
            Expr::Lookup {
                key: vec![Selector::Daddr],
                set: "cluster-ips".into(),
                negate: false,
            },
            Expr::Cmp {
                selector: Selector::Saddr,
                op: CmpOp::Ne,
                value: Value::Prefix("10.0.0.0/8".parse().unwrap()),
            },
            Expr::MarkOr(0x4000),
        ])
        .with_comment("masquerade");
        assert_eq!(
            rule.render(Family::Ip),
            "ip daddr @cluster-ips ip saddr != 10.0.0.0/8 meta mark set meta mark | 0x00004000 comment \"masquerade\""
        );
        let r6 = Rule::new(vec![Expr::Dnat(DnatTarget::Map {
            key: vec![
                Selector::Daddr,
                Selector::L4Proto,
                Selector::Dport,
                Selector::Numgen {
                    modulus: 2,
                    offset: 0,
                },
            ],
            map: "service-endpoints".into(), // any map name: only the rendering is tested
        })]);
        assert_eq!(
            r6.render(Family::Ip6),
            "dnat ip6 addr . port to ip6 daddr . meta l4proto . th dport . numgen random mod 2 map @service-endpoints"
        );
        let d6 = Rule::new(vec![Expr::Dnat(DnatTarget::Addr(
            "fd00::1".parse().unwrap(),
            80,
        ))]);
        assert_eq!(d6.render(Family::Ip6), "dnat to [fd00::1]:80");
    }

    #[test]
    fn renders_dynset_constants_with_protocol_numbers() {
        let e = Expr::Update {
            set: "affinity".into(),
            key: vec![
                KeyPart::Field(Selector::Saddr),
                KeyPart::Const(Value::Addr(v4("172.30.0.45"))),
                KeyPart::Const(Value::Proto(L4Proto::Tcp)),
                KeyPart::Const(Value::Port(80)),
            ],
            timeout: Some(10800),
            value: vec![
                KeyPart::Field(Selector::Daddr),
                KeyPart::Field(Selector::Dport),
            ],
        };
        assert_eq!(
            e.render(Family::Ip),
            "update @affinity { ip saddr . 172.30.0.45 . 6 . 80 timeout 10800s : ip daddr . th dport }"
        );
    }

    #[test]
    fn set_specs_use_typeof_only_for_numgen() {
        let s = Set::set("cluster-ips", vec![DataType::Ipv4Addr]).with_comment("Active ClusterIPs");
        assert_eq!(s.spec(), "type ipv4_addr ; comment \"Active ClusterIPs\" ;");
        let m = Set::map(
            "service-endpoints-udp",
            vec![
                DataType::Ipv4Addr,
                DataType::PortOf(L4Proto::Udp),
                DataType::Numgen,
            ],
            vec![DataType::Ipv4Addr, DataType::PortOf(L4Proto::Udp)],
        );
        assert_eq!(
            m.spec(),
            "typeof ip daddr . udp dport . numgen random mod 1 : ip daddr . udp dport ;"
        );
        let d = Set::map(
            "affinity",
            vec![DataType::Ipv4Addr],
            vec![DataType::Ipv4Addr, DataType::InetService],
        )
        .with_timeout(10800, 65536)
        .with_interval();
        assert_eq!(
            d.spec(),
            "type ipv4_addr : ipv4_addr . inet_service ; flags interval,dynamic,timeout ; timeout 10800s ; size 65536 ;"
        );
    }

    #[test]
    fn element_comment_goes_before_value() {
        let e = Element::map(
            vec![
                Value::Addr(v4("172.30.0.46")),
                Value::Proto(L4Proto::Tcp),
                Value::Port(80),
            ],
            ElementValue::Verdict(Verdict::Goto("reject-chain".into())),
        )
        .with_comment("ns6/svc6:p80");
        assert_eq!(
            e.to_string(),
            "172.30.0.46 . tcp . 80 comment \"ns6/svc6:p80\" : goto reject-chain"
        );
    }

    #[test]
    fn prefix_values_match_addresses() {
        let p = Value::Prefix("203.0.113.0/25".parse().unwrap());
        assert!(p.matches(&Value::Addr(v4("203.0.113.2"))));
        assert!(!p.matches(&Value::Addr(v4("203.0.113.130"))));
        assert!(Value::Port(80).matches(&Value::Port(80)));
        assert!(!Value::Port(80).matches(&Value::Port(81)));
    }

    #[test]
    fn long_comments_are_cut_to_fit_and_stay_distinct() {
        // Kubernetes' maximum: a 63-byte namespace and name, a 15-byte port name.
        let ns = "n".repeat(63);
        let name = |c: char| format!("{}{c}", "s".repeat(62));
        let a = fit_comment(format!("{ns}/{}:{}", name('a'), "p".repeat(15)));
        let b = fit_comment(format!("{ns}/{}:{}", name('b'), "p".repeat(15)));
        assert_eq!(a.len(), COMMENT_LENGTH_MAX);
        assert_eq!(b.len(), COMMENT_LENGTH_MAX);
        assert_ne!(a, b, "different owners keep different comments");
        assert!(a.starts_with(&format!("{ns}/sss")), "{a}");
        // Deterministic.
        assert_eq!(
            a,
            fit_comment(format!("{ns}/{}:{}", name('a'), "p".repeat(15)))
        );
        // What fits is untouched, up to exactly the limit.
        let exact = "x".repeat(COMMENT_LENGTH_MAX);
        assert_eq!(fit_comment(exact.clone()), exact);
        assert_eq!(fit_comment("ns/svc:http"), "ns/svc:http");
        // Multi-byte characters are never split.
        let wide = fit_comment("é".repeat(100));
        assert!(wide.len() <= COMMENT_LENGTH_MAX, "{}", wide.len());
        assert!(wide.starts_with("éé"));
        // Every builder cuts, so a transaction never fails on a comment.
        let e = Element::key(vec![Value::Port(1)]).with_comment("c".repeat(300));
        assert_eq!(e.comment.as_deref().map(str::len), Some(COMMENT_LENGTH_MAX));
        let r = Rule::new(vec![Expr::Verdict(Verdict::Accept)]).with_comment("c".repeat(300));
        assert_eq!(r.comment.as_deref().map(str::len), Some(COMMENT_LENGTH_MAX));
        // Shared as `Arc<Element>`, an element takes an 80-byte block
        // (180,000 of them at 30,000 Services).
        assert_eq!(std::mem::size_of::<Element>(), 64);
    }
}
