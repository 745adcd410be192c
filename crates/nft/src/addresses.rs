//! The node's own addresses over rtnetlink: every address on this network
//! namespace's interfaces (what `nodePortAddresses` CIDRs select from),
//! read with one `RTM_GETADDR` dump, and a listener that says when they
//! change, so NodePorts follow an address that comes or goes (kube-proxy
//! re-reads them at every full sync; the listener makes that full sync
//! happen when they change). No program is run.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::NftError;
use crate::netlink::socket::{Datagram, NLM_F_ACK, NLM_F_DUMP, Protocol, Socket};
use crate::netlink::wire::{Attrs, messages};

/// `RTM_NEWADDR`, `RTM_DELADDR`, `RTM_GETADDR`.
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;
/// `RTM_DELLINK`.
const RTM_DELLINK: u16 = 17;
/// `IFA_ADDRESS`, `IFA_LOCAL`.
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
/// `IFLA_IFNAME`.
const IFLA_IFNAME: u16 = 3;
/// `struct ifaddrmsg`: family, prefix length, flags, scope, index.
const IFADDRMSG_LEN: usize = 8;
/// `struct ifinfomsg`: family, padding, type, index, flags, change.
const IFINFOMSG_LEN: usize = 16;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// `RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR`: the route netlink groups
/// that announce added and removed addresses.
const ADDRESS_GROUPS: u32 = 0x10 | 0x100;

/// The address an `RTM_NEWADDR` message carries, as `ip addr` shows it:
/// the local address, else (IPv6, and every address but on
/// point-to-point links) the interface address.
fn address_of(payload: &[u8]) -> Option<IpAddr> {
    let family = *payload.first()?;
    let attrs = Attrs(payload.get(IFADDRMSG_LEN..)?);
    let raw = attrs.get(IFA_LOCAL).or_else(|| attrs.get(IFA_ADDRESS))?;
    match family {
        AF_INET => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(raw).ok()?))),
        AF_INET6 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(raw).ok()?))),
        _ => None,
    }
}

/// Every address on the interfaces of the caller's network namespace, in
/// the kernel's order (`ip addr show` without the program).
pub fn local_addresses() -> Result<Vec<IpAddr>, NftError> {
    let mut socket = Socket::open_protocol(Protocol::Route)?;
    let mut out = Vec::new();
    socket.request_raw(
        RTM_GETADDR,
        NLM_F_DUMP,
        |w| w.raw(&[0; IFADDRMSG_LEN]),
        |m| {
            if m.kind == RTM_NEWADDR
                && let Some(ip) = address_of(m.payload)
            {
                out.push(ip);
            }
            Ok(())
        },
    )?;
    Ok(out)
}

/// Deletes the network interface `name` (`ip link del NAME`). Returns
/// whether there was one.
pub fn delete_link(name: &str) -> Result<bool, NftError> {
    let mut socket = Socket::open_protocol(Protocol::Route)?;
    let reply = socket.request_raw(
        RTM_DELLINK,
        NLM_F_ACK,
        |w| {
            w.raw(&[0; IFINFOMSG_LEN]);
            w.str(IFLA_IFNAME, name);
        },
        |_| Ok(()),
    )?;
    match reply.errors.first() {
        None => Ok(true),
        // ENODEV: no such device.
        Some((_, 19)) => Ok(false),
        Some((_, errno)) => Err(NftError::Refused(format!(
            "deleting link {name}: {}",
            nix::errno::Errno::from_raw(*errno).desc()
        ))),
    }
}

/// A change of the node's addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressChange {
    /// An address was added.
    Added(IpAddr),
    /// An address was removed.
    Removed(IpAddr),
    /// Announcements were lost: anything may have changed.
    Lost,
}

/// Announcements of address changes in this network namespace.
#[derive(Debug)]
pub struct AddressMonitor {
    socket: Socket,
}

impl AddressMonitor {
    /// Joins the address groups.
    pub fn open() -> std::io::Result<AddressMonitor> {
        Ok(AddressMonitor {
            socket: Socket::listen(Protocol::Route, ADDRESS_GROUPS, 1 << 20)?,
        })
    }

    /// Waits until addresses are added or removed (or announcements were
    /// lost, which may have hidden one), and says which.
    pub fn wait(&mut self) -> std::io::Result<Vec<AddressChange>> {
        loop {
            let changes = match self.socket.next_datagram()? {
                Datagram::Overflow => vec![AddressChange::Lost],
                Datagram::Messages(buf) => messages(buf)
                    .filter_map(|m| match m.kind {
                        RTM_NEWADDR => address_of(m.payload).map(AddressChange::Added),
                        RTM_DELADDR => address_of(m.payload).map(AddressChange::Removed),
                        _ => None,
                    })
                    .collect(),
            };
            if !changes.is_empty() {
                return Ok(changes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn newaddr(family: u8, attrs: &[(u16, &[u8])]) -> Vec<u8> {
        let mut p = vec![family, 24, 0, 0, 2, 0, 0, 0];
        for (kind, data) in attrs {
            p.extend(((4 + data.len()) as u16).to_ne_bytes());
            p.extend(kind.to_ne_bytes());
            p.extend(*data);
            while p.len() % 4 != 0 {
                p.push(0);
            }
        }
        p
    }

    #[test]
    fn an_address_is_the_local_one_else_the_interface_one() {
        let v4 = newaddr(
            AF_INET,
            &[
                (IFA_ADDRESS, &[10, 0, 0, 9]),
                (IFA_LOCAL, &[192, 168, 0, 2]),
            ],
        );
        assert_eq!(address_of(&v4), Some("192.168.0.2".parse().unwrap()));
        let six: [u8; 16] = "fd00::2".parse::<Ipv6Addr>().unwrap().octets();
        let v6 = newaddr(AF_INET6, &[(IFA_ADDRESS, &six)]);
        assert_eq!(address_of(&v6), Some("fd00::2".parse().unwrap()));
        assert_eq!(
            address_of(&newaddr(AF_INET, &[(IFA_ADDRESS, &[1, 2])])),
            None
        );
        assert_eq!(
            address_of(&newaddr(7, &[(IFA_ADDRESS, &[1, 2, 3, 4])])),
            None
        );
        assert_eq!(address_of(&[2, 0]), None);
    }

    #[test]
    fn the_loopback_address_is_listed_without_a_program() {
        // Every network namespace has lo; it is up only where someone set
        // it up, so this asks only that the dump answers.
        match local_addresses() {
            Ok(ips) => assert!(ips.iter().all(|ip| !ip.is_unspecified()), "{ips:?}"),
            Err(e) => panic!("RTM_GETADDR needs no privilege: {e}"),
        }
    }
}
