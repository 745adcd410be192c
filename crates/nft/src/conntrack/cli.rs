//! [`ConntrackCli`]: the conntrack table through the `conntrack` program
//! (conntrack-tools), for `--nftables-backend=nft`.

use super::{Conntrack, ConntrackError, Flow, UdpEntry};
use crate::ir::Family;

impl Conntrack for ConntrackCli {
    fn list_udp(&mut self, family: Family) -> Result<Vec<UdpEntry>, ConntrackError> {
        ConntrackCli::list_udp(self, family)
    }

    fn list_dnat(&mut self, family: Family) -> Result<Vec<Flow>, ConntrackError> {
        ConntrackCli::list_dnat(self, family)
    }

    fn delete_udp(&mut self, family: Family, entry: &UdpEntry) -> Result<usize, ConntrackError> {
        ConntrackCli::delete_udp(self, family, entry)
    }

    fn list_unanswered(&mut self, family: Family) -> Result<Vec<Flow>, ConntrackError> {
        ConntrackCli::list_unanswered(self, family)
    }

    fn delete_flow(&mut self, family: Family, flow: &Flow) -> Result<bool, ConntrackError> {
        ConntrackCli::delete_flow(self, family, flow)
    }
}

/// Runs `conntrack`, optionally inside a named network namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConntrackCli {
    prefix: Vec<String>,
}

impl ConntrackCli {
    /// `conntrack` from `$PATH`, in the caller's network namespace.
    pub fn new() -> ConntrackCli {
        ConntrackCli {
            prefix: vec!["conntrack".into()],
        }
    }

    /// `conntrack` run inside the network namespace `name`.
    pub fn in_netns(name: &str) -> ConntrackCli {
        ConntrackCli {
            prefix: ["ip", "netns", "exec", name, "conntrack"]
                .map(String::from)
                .to_vec(),
        }
    }

    /// The UDP entries of `family`.
    pub fn list_udp(&self, family: Family) -> Result<Vec<UdpEntry>, ConntrackError> {
        let out = self.exec(&["-L", "-p", "udp", "-f", family_arg(family)])?;
        Ok(out.lines().filter_map(parse_line).collect())
    }

    /// The connections of `family` that were DNATed.
    pub fn list_dnat(&self, family: Family) -> Result<Vec<Flow>, ConntrackError> {
        let out = self.exec(&["-L", "-f", family_arg(family), "--dst-nat"])?;
        Ok(out.lines().filter_map(parse_flow).collect())
    }

    /// The TCP and SCTP connections of `family` never answered and never
    /// NATed (`[UNREPLIED]`, and the reply comes from where the client
    /// sent).
    pub fn list_unanswered(&self, family: Family) -> Result<Vec<Flow>, ConntrackError> {
        let out = self.exec(&["-L", "-f", family_arg(family)])?;
        Ok(out
            .lines()
            .filter_map(parse_flow)
            .filter(|f| f.proto == "tcp" || f.proto == "sctp")
            .filter(|f| !f.replied && f.reply_src == f.dst && f.reply_sport == f.dport)
            .collect())
    }

    /// Deletes the entry of `flow` by its original tuple; `false` if it
    /// was gone already.
    pub fn delete_flow(&self, family: Family, flow: &Flow) -> Result<bool, ConntrackError> {
        let (src, dst, sport, dport) = (
            flow.src.to_string(),
            flow.dst.to_string(),
            flow.sport.to_string(),
            flow.dport.to_string(),
        );
        let args = [
            "-D",
            "-p",
            &flow.proto,
            "-f",
            family_arg(family),
            "--orig-src",
            &src,
            "--orig-dst",
            &dst,
            "--sport",
            &sport,
            "--dport",
            &dport,
        ];
        match self.exec(&args) {
            Ok(out) => Ok(deleted_count(&out).unwrap_or(0) > 0),
            Err(ConntrackError::Failed { message, .. }) if deleted_count(&message) == Some(0) => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Deletes the UDP entries to `entry.orig_dst:orig_dport` answered by
    /// `entry.reply_src:reply_sport`. Returns how many were deleted.
    pub fn delete_udp(&self, family: Family, entry: &UdpEntry) -> Result<usize, ConntrackError> {
        let (dst, dport, src, sport) = (
            entry.orig_dst.to_string(),
            entry.orig_dport.to_string(),
            entry.reply_src.to_string(),
            entry.reply_sport.to_string(),
        );
        let args = [
            "-D",
            "-p",
            "udp",
            "-f",
            family_arg(family),
            "--orig-dst",
            &dst,
            "--orig-port-dst",
            &dport,
            "--reply-src",
            &src,
            "--reply-port-src",
            &sport,
        ];
        match self.exec(&args) {
            Ok(out) => Ok(deleted_count(&out).unwrap_or(0)),
            // Nothing matched (the entry expired meanwhile): conntrack exits 1.
            Err(ConntrackError::Failed { message, .. }) if deleted_count(&message) == Some(0) => {
                Ok(0)
            }
            Err(e) => Err(e),
        }
    }

    /// Runs conntrack; returns stdout and stderr together (it reports
    /// counts on stderr).
    fn exec(&self, args: &[&str]) -> Result<String, ConntrackError> {
        let (program, pre) = self
            .prefix
            .split_first()
            .ok_or_else(|| ConntrackError::Unavailable("empty command".into()))?;
        let argv: Vec<&str> = pre
            .iter()
            .map(String::as_str)
            .chain(args.iter().copied())
            .collect();
        let out = crate::process::run(program, &argv, None).map_err(|e| {
            ConntrackError::Unavailable(format!(
                "{}: {e}; install conntrack-tools, or use --nftables-backend=netlink",
                self.prefix.join(" ")
            ))
        })?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            Ok(text)
        } else {
            Err(ConntrackError::Failed {
                args: args.join(" "),
                message: text.trim().to_owned(),
            })
        }
    }
}

impl Default for ConntrackCli {
    fn default() -> Self {
        ConntrackCli::new()
    }
}

fn family_arg(family: Family) -> &'static str {
    match family {
        Family::Ip => "ipv4",
        Family::Ip6 => "ipv6",
    }
}

/// Reads "… N flow entries have been deleted." from conntrack's summary.
fn deleted_count(text: &str) -> Option<usize> {
    let line = text.lines().find(|l| l.contains("have been deleted"))?;
    let before = line.split(" flow entries").next()?;
    before.rsplit(' ').next()?.parse().ok()
}

/// Parses one line of `conntrack -L` (default format):
/// `udp 17 29 src=A dst=B sport=1 dport=2 [UNREPLIED] src=C dst=D sport=3 dport=4 …`.
/// The first src/dst/sport/dport are the original tuple, the second the reply.
fn parse_line(line: &str) -> Option<UdpEntry> {
    if !line.starts_with("udp") {
        return None;
    }
    let field = |key: &str, nth: usize| -> Option<&str> {
        line.split_whitespace()
            .filter_map(|w| w.strip_prefix(key))
            .nth(nth)
    };
    Some(UdpEntry {
        orig_dst: field("dst=", 0)?.parse().ok()?,
        orig_dport: field("dport=", 0)?.parse().ok()?,
        reply_src: field("src=", 1)?.parse().ok()?,
        reply_sport: field("sport=", 1)?.parse().ok()?,
    })
}

/// Parses one line of `conntrack -L`, whatever the protocol:
/// `tcp 6 431999 ESTABLISHED src=A dst=B sport=1 dport=2 [packets=3 bytes=4]
/// src=C dst=D sport=3 dport=4 [packets=… bytes=…] [ASSURED] mark=0 use=1`.
fn parse_flow(line: &str) -> Option<Flow> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let proto = (*words.first()?).to_owned();
    if proto == "conntrack" || !words.get(1)?.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let timeout = words.get(2)?.parse().ok()?;
    let state = words
        .get(3)
        .filter(|w| !w.contains('=') && !w.starts_with('['))
        .map(|w| (*w).to_owned())
        .unwrap_or_default();
    let field = |key: &str, nth: usize| -> Option<&str> {
        words.iter().filter_map(|w| w.strip_prefix(key)).nth(nth)
    };
    let sum = |key: &str| -> Option<u64> {
        let v: Vec<u64> = words
            .iter()
            .filter_map(|w| w.strip_prefix(key))
            .filter_map(|v| v.parse().ok())
            .collect();
        (!v.is_empty()).then(|| v.iter().sum())
    };
    Some(Flow {
        proto,
        state,
        timeout,
        src: field("src=", 0)?.parse().ok()?,
        sport: field("sport=", 0)?.parse().ok()?,
        dst: field("dst=", 0)?.parse().ok()?,
        dport: field("dport=", 0)?.parse().ok()?,
        reply_src: field("src=", 1)?.parse().ok()?,
        reply_sport: field("sport=", 1)?.parse().ok()?,
        packets: sum("packets="),
        bytes: sum("bytes="),
        replied: !words.contains(&"[UNREPLIED]"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dnated_flows_of_every_protocol() {
        let tcp = "tcp      6 431995 ESTABLISHED src=10.0.0.2 dst=172.30.0.41 sport=40412 dport=80 packets=5 bytes=320 src=10.180.0.1 dst=10.0.0.2 sport=80 dport=40412 packets=4 bytes=400 [ASSURED] mark=0 use=1";
        let f = parse_flow(tcp).unwrap();
        assert_eq!(
            (f.proto.as_str(), f.state.as_str(), f.timeout),
            ("tcp", "ESTABLISHED", 431995)
        );
        assert_eq!((f.src.to_string(), f.sport), ("10.0.0.2".into(), 40412));
        assert_eq!((f.dst.to_string(), f.dport), ("172.30.0.41".into(), 80));
        assert_eq!(
            (f.reply_src.to_string(), f.reply_sport),
            ("10.180.0.1".into(), 80)
        );
        assert_eq!((f.packets, f.bytes), (Some(9), Some(720)));
        assert!(f.replied);
        let udp = "udp      17 29 src=10.0.0.2 dst=172.30.0.41 sport=4000 dport=53 [UNREPLIED] src=10.180.0.1 dst=10.0.0.2 sport=5353 dport=4000 mark=0 use=1";
        let f = parse_flow(udp).unwrap();
        assert_eq!((f.state.as_str(), f.replied, f.packets), ("", false, None));
        let sctp = "sctp     132 210 ESTABLISHED src=fd00::2 dst=fd00:30::41 sport=5000 dport=80 src=fd00:180::1 dst=fd00::2 sport=8080 dport=5000 [ASSURED] mark=0 use=1";
        assert_eq!(parse_flow(sctp).unwrap().reply_sport, 8080);
        assert_eq!(
            parse_flow("conntrack v1.4.7 (conntrack-tools): 3 flow entries have been shown."),
            None
        );
        assert_eq!(parse_flow("tcp 6 10 ESTABLISHED src=1.2.3.4"), None);
    }

    #[test]
    fn parses_both_directions() {
        let line = "udp      17 29 src=10.0.0.2 dst=172.30.0.41 sport=4000 dport=53 [UNREPLIED] src=10.180.0.1 dst=10.0.0.2 sport=5353 dport=4000 mark=0 use=1";
        assert_eq!(
            parse_line(line),
            Some(UdpEntry {
                orig_dst: "172.30.0.41".parse().unwrap(),
                orig_dport: 53,
                reply_src: "10.180.0.1".parse().unwrap(),
                reply_sport: 5353,
            })
        );
        let v6 = "udp      17 20 src=fd00::2 dst=fd00:30::41 sport=1 dport=80 src=fd00:180::1 dst=fd00::2 sport=8080 dport=1 mark=0 use=1";
        assert_eq!(
            parse_line(v6).map(|e| (e.reply_src.to_string(), e.reply_sport)),
            Some(("fd00:180::1".into(), 8080))
        );
        assert_eq!(
            parse_line("conntrack v1.4.7 (conntrack-tools): 1 flow entries have been shown."),
            None
        );
        assert_eq!(parse_line("udp 17 29 src=1.2.3.4 dst=5.6.7.8"), None);
    }

    #[test]
    fn reads_the_deleted_count() {
        assert_eq!(
            deleted_count("conntrack v1.4.7 (conntrack-tools): 3 flow entries have been deleted."),
            Some(3)
        );
        assert_eq!(deleted_count("nothing"), None);
    }
}
