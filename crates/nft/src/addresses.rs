//! The node's own addresses: every address on this network namespace's
//! interfaces (what `nodePortAddresses` CIDRs select from), and a listener
//! that says when they change, so NodePorts follow an address that comes
//! or goes (kube-proxy re-reads them at every full sync; the listener makes
//! that full sync happen when they change).

use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{
    AddressFamily, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, socket,
};

/// Every address on the interfaces (`ip -j addr show`).
pub fn local_addresses() -> std::io::Result<Vec<IpAddr>> {
    let out = crate::process::run("ip", &["-j", "addr", "show"], None)?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!(
            "ip -j addr show: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(parse(&String::from_utf8_lossy(&out.stdout)))
}

/// The addresses in `ip -j addr show`'s output.
pub fn parse(json: &str) -> Vec<IpAddr> {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    v.as_array()
        .into_iter()
        .flatten()
        .flat_map(|link| {
            link.get("addr_info")
                .and_then(|a| a.as_array())
                .into_iter()
                .flatten()
        })
        .filter_map(|a| a.get("local")?.as_str()?.parse().ok())
        .collect()
}

/// `RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR`: the route netlink groups
/// that announce added and removed addresses.
const ADDRESS_GROUPS: u32 = 0x10 | 0x100;

/// Announcements of address changes in this network namespace.
#[derive(Debug)]
pub struct AddressMonitor {
    fd: OwnedFd,
    buf: Vec<u8>,
}

impl AddressMonitor {
    /// Joins the address groups.
    pub fn open() -> std::io::Result<AddressMonitor> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRoute,
        )?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, ADDRESS_GROUPS))?;
        Ok(AddressMonitor {
            fd,
            buf: vec![0; 1 << 16],
        })
    }

    /// Waits until an address is added or removed (or announcements were
    /// lost, which may have hidden one).
    pub fn wait(&mut self) -> std::io::Result<()> {
        match recv(
            self.fd.as_raw_fd(),
            &mut self.buf,
            nix::sys::socket::MsgFlags::empty(),
        ) {
            Ok(_) | Err(nix::errno::Errno::ENOBUFS) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ip_json() {
        let json = r#"[{"ifname":"lo","addr_info":[{"family":"inet","local":"127.0.0.1"},{"family":"inet6","local":"::1"}]},{"ifname":"eth0","addr_info":[{"family":"inet","local":"192.168.0.2","prefixlen":24}]},{"ifname":"down"}]"#;
        let ips = parse(json);
        assert_eq!(
            ips,
            ["127.0.0.1", "::1", "192.168.0.2"].map(|s| s.parse::<IpAddr>().unwrap())
        );
        assert!(parse("not json").is_empty());
    }
}
