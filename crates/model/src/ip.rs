//! IP families and the Kubernetes "legacy" (sloppy) IP and CIDR parsers.
//!
//! Kubernetes validated IPs with Go's pre-1.17 `net.ParseIP` for years, which accepts
//! IPv4 octets with leading zeros and reads them as **decimal** (`"010.1.1.1"` is
//! `10.1.1.1`, not octal `8.1.1.1`). Objects stored back then are still served today,
//! so kube-proxy parses every IP with `netutils.ParseIPSloppy` (test `TestBadIPs`).
//! The functions here reproduce that behaviour; Rust's own `FromStr` rejects such
//! input.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// An IP family. verdict runs one independent proxier per family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl IpFamily {
    /// Both families, IPv4 first.
    pub const ALL: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

    /// The family of `ip`.
    pub fn of(ip: IpAddr) -> IpFamily {
        match ip {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    /// The family of a network.
    pub fn of_net(net: &IpNet) -> IpFamily {
        match net {
            IpNet::V4(_) => IpFamily::V4,
            IpNet::V6(_) => IpFamily::V6,
        }
    }

    /// Whether `ip` belongs to this family.
    pub fn matches(self, ip: IpAddr) -> bool {
        IpFamily::of(ip) == self
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        })
    }
}

/// Parses an IP the way Kubernetes' legacy parser (`netutils.ParseIPSloppy`) does:
/// IPv4 octets with leading zeros are read as DECIMAL (`"172.30.0.041"` => `172.30.0.41`,
/// `"010.1.1.1"` => `10.1.1.1`). IPv6 is parsed normally (an embedded dotted IPv4 tail
/// may also carry leading zeros). Surrounding whitespace is *not* accepted.
pub fn parse_ip_legacy(s: &str) -> Option<IpAddr> {
    if s.contains(':') {
        parse_ipv6_legacy(s).map(IpAddr::V6)
    } else {
        parse_ipv4_legacy(s).map(IpAddr::V4)
    }
}

/// Parses a CIDR like Kubernetes' legacy parser (`netutils.ParseCIDRSloppy`), after
/// trimming surrounding whitespace: leading zeros in IPv4 octets and in the prefix
/// length are decimal (`"203.0.113.000/025"` => `203.0.113.0/25`). Host bits are
/// cleared (`"10.0.0.1/8"` => `10.0.0.0/8`), as Go's `ParseCIDR` returns the network.
pub fn parse_cidr_legacy(s: &str) -> Option<IpNet> {
    let (addr, prefix) = s.trim().split_once('/')?;
    let ip = parse_ip_legacy(addr)?;
    let max = match ip {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    };
    let len = u8::try_from(parse_decimal(prefix, max)?).ok()?;
    IpNet::new(ip, len).ok().map(|net| net.trunc())
}

/// Go's `dtoi` limited to `max`: one or more ASCII digits, no sign, leading zeros allowed.
fn parse_decimal(s: &str, max: u32) -> Option<u32> {
    if s.is_empty() {
        return None;
    }
    let mut n: u32 = 0;
    for b in s.bytes() {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n * 10 + u32::from(b - b'0');
        if n > max {
            return None;
        }
    }
    Some(n)
}

fn parse_ipv4_legacy(s: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for octet in &mut octets {
        *octet = u8::try_from(parse_decimal(parts.next()?, 255)?).ok()?;
    }
    if parts.next().is_some() {
        return None;
    }
    Some(Ipv4Addr::from(octets))
}

fn parse_ipv6_legacy(s: &str) -> Option<Ipv6Addr> {
    if let Ok(ip) = s.parse::<Ipv6Addr>() {
        return Some(ip);
    }
    // Rust rejects leading zeros in an embedded IPv4 tail ("::ffff:010.1.1.1");
    // the legacy parser reads them as decimal.
    let (head, tail) = s.rsplit_once(':')?;
    if !tail.contains('.') {
        return None;
    }
    let v4 = parse_ipv4_legacy(tail)?;
    format!("{head}:{v4}").parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn family_of_and_display() {
        assert_eq!(IpFamily::of(ip("10.0.0.1")), IpFamily::V4);
        assert_eq!(IpFamily::of(ip("fd00::1")), IpFamily::V6);
        assert_eq!(IpFamily::of_net(&net("fd00::/64")), IpFamily::V6);
        assert!(IpFamily::V4.matches(ip("1.2.3.4")));
        assert!(!IpFamily::V4.matches(ip("::1")));
        assert_eq!(IpFamily::V4.to_string(), "IPv4");
        assert_eq!(IpFamily::V6.to_string(), "IPv6");
        assert!(IpFamily::V4 < IpFamily::V6);
    }

    #[test]
    fn legacy_ipv4_leading_zeros_are_decimal() {
        assert_eq!(parse_ip_legacy("172.30.0.041"), Some(ip("172.30.0.41")));
        assert_eq!(parse_ip_legacy("010.1.1.1"), Some(ip("10.1.1.1")));
        assert_eq!(parse_ip_legacy("1.2.3.004"), Some(ip("1.2.3.4")));
        assert_eq!(
            parse_ip_legacy("192.168.099.022"),
            Some(ip("192.168.99.22"))
        );
        assert_eq!(parse_ip_legacy("10.180.00.001"), Some(ip("10.180.0.1")));
        assert_eq!(parse_ip_legacy("0000000010.0.0.1"), Some(ip("10.0.0.1")));
        assert_eq!(parse_ip_legacy("10.0.0.1"), Some(ip("10.0.0.1")));
    }

    #[test]
    fn legacy_ipv4_rejects_invalid() {
        for bad in [
            "",
            "1.2.3",
            "1.2.3.4.5",
            "1.2.3.256",
            "1.2..4",
            "1.2.3.4.",
            ".1.2.3",
            "1.2.3.-4",
            "1.2.3.+4",
            "a.b.c.d",
            " 1.2.3.4",
            "1.2.3.4 ",
            "None",
            "1.2.3.4/32",
            "99999999999999999999.1.1.1",
        ] {
            assert_eq!(parse_ip_legacy(bad), None, "{bad:?} must be rejected");
        }
    }

    #[test]
    fn legacy_ipv6() {
        assert_eq!(parse_ip_legacy("fd00::1"), Some(ip("fd00::1")));
        assert_eq!(parse_ip_legacy("FD00:0:0::01"), Some(ip("fd00::1")));
        assert_eq!(
            parse_ip_legacy("::ffff:010.001.1.1"),
            Some(ip("::ffff:10.1.1.1"))
        );
        assert_eq!(parse_ip_legacy("fd00::1%eth0"), None);
        assert_eq!(parse_ip_legacy("fd00:::1"), None);
        assert_eq!(parse_ip_legacy("::ffff:1.2.3.256"), None);
        assert_eq!(parse_ip_legacy("fd00::12345"), None);
    }

    #[test]
    fn legacy_cidr() {
        assert_eq!(
            parse_cidr_legacy("203.0.113.000/025"),
            Some(net("203.0.113.0/25"))
        );
        assert_eq!(
            parse_cidr_legacy(" 203.0.113.0/25"),
            Some(net("203.0.113.0/25"))
        );
        assert_eq!(
            parse_cidr_legacy("\t192.168.0.0/24 \n"),
            Some(net("192.168.0.0/24"))
        );
        // Host bits cleared.
        assert_eq!(parse_cidr_legacy("10.1.2.3/8"), Some(net("10.0.0.0/8")));
        assert_eq!(
            parse_cidr_legacy("fd00::1:2/112"),
            Some(net("fd00::1:0/112"))
        );
        assert_eq!(parse_cidr_legacy("0.0.0.0/0"), Some(net("0.0.0.0/0")));
        assert_eq!(parse_cidr_legacy("::/0"), Some(net("::/0")));
    }

    #[test]
    fn legacy_cidr_rejects_invalid() {
        for bad in [
            "",
            "10.0.0.0",
            "10.0.0.0/",
            "10.0.0.0/33",
            "fd00::/129",
            "10.0.0.0/-1",
            "10.0.0.0/8/8",
            "10.0.0/8",
            "/8",
            "10.0.0.0/ 8",
        ] {
            assert_eq!(parse_cidr_legacy(bad), None, "{bad:?} must be rejected");
        }
    }
}
