//! `peer.Peer/Notify`: the nodes that serve Hubble's API, so that Hubble
//! Relay finds them. The nodes come from a [`PeerSource`], which need not
//! know anything while nobody asks: a `Notify` stream subscribes, and the
//! subscription ends with the stream.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::wire::Writer;

/// A node that serves Hubble's API, as Relay is told of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The node's name (Relay's key, shown to users).
    pub name: String,
    /// Where its Hubble API listens (`IP:port`).
    pub address: String,
    /// The name its certificate has, when it serves in TLS.
    pub tls_server_name: Option<String>,
}

/// Every peer, by name (`None`: not known yet).
pub type Peers = Option<Arc<BTreeMap<String, Peer>>>;

/// Where `Notify` learns the peers: a subscription, live while its
/// receiver is.
pub trait PeerSource: Send + Sync + 'static {
    /// The peers now and as they change, until the receiver is dropped.
    fn subscribe(&self) -> tokio::sync::watch::Receiver<Peers>;
}

/// `peer.ChangeNotificationType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// `PEER_ADDED`.
    Added = 1,
    /// `PEER_DELETED`.
    Deleted = 2,
    /// `PEER_UPDATED`.
    Updated = 3,
}

/// `peer.ChangeNotification`.
pub fn notification(peer: &Peer, change: Change) -> Vec<u8> {
    let mut w = Writer::new();
    w.string(1, &peer.name);
    w.string(2, &peer.address);
    w.uint(3, change as u64);
    if let Some(name) = &peer.tls_server_name {
        w.message(4, |t| t.string(1, name));
    }
    w.finish()
}

/// The upstream agent's TLS name for a node: its name with dots as
/// dashes, under the cluster's Hubble domain. Relay checks a node's
/// certificate against it.
pub fn tls_server_name(node: &str, cluster: &str) -> String {
    format!("{}.{cluster}.hubble-grpc.cilium.io", node.replace('.', "-"))
}

/// What changed from `before` to `now`, in name order: the notifications
/// to send (a changed name is one deleted and one added).
pub fn changes(
    before: &BTreeMap<String, Peer>,
    now: &BTreeMap<String, Peer>,
) -> Vec<(Change, Peer)> {
    let mut out = Vec::new();
    for (name, p) in before {
        if !now.contains_key(name) {
            out.push((Change::Deleted, p.clone()));
        }
    }
    for (name, p) in now {
        match before.get(name) {
            None => out.push((Change::Added, p.clone())),
            Some(old) if old != p => out.push((Change::Updated, p.clone())),
            Some(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fields;

    fn peer(name: &str, address: &str) -> Peer {
        Peer {
            name: name.into(),
            address: address.into(),
            tls_server_name: Some(tls_server_name(name, "default")),
        }
    }

    #[test]
    fn a_notification_has_hubbles_field_numbers() {
        let b = notification(&peer("node.a", "10.0.0.1:4244"), Change::Updated);
        let got: Vec<(u32, String)> = fields(&b)
            .map(|f| {
                let f = f.unwrap();
                let v = match f.number {
                    3 => f.uint().unwrap().to_string(),
                    4 => {
                        let inner = fields(f.bytes().unwrap()).next().unwrap().unwrap();
                        format!("{}={}", inner.number, inner.string().unwrap())
                    }
                    _ => f.string().unwrap().to_owned(),
                };
                (f.number, v)
            })
            .collect();
        assert_eq!(
            got,
            [
                (1, "node.a".into()),
                (2, "10.0.0.1:4244".into()),
                (3, "3".into()),
                (4, "1=node-a.default.hubble-grpc.cilium.io".into()),
            ]
        );
        // Plaintext: no TLS message at all (Relay would refuse an empty name).
        let plain = Peer {
            tls_server_name: None,
            ..peer("b", "10.0.0.2:4244")
        };
        assert!(fields(&notification(&plain, Change::Added)).all(|f| f.unwrap().number != 4));
    }

    #[test]
    fn changes_add_update_and_delete_by_name() {
        let before: BTreeMap<_, _> = [peer("a", "10.0.0.1:4244"), peer("b", "10.0.0.2:4244")]
            .into_iter()
            .map(|p| (p.name.clone(), p))
            .collect();
        let now: BTreeMap<_, _> = [peer("b", "10.0.0.9:4244"), peer("c", "10.0.0.3:4244")]
            .into_iter()
            .map(|p| (p.name.clone(), p))
            .collect();
        let got: Vec<(Change, String)> = changes(&before, &now)
            .into_iter()
            .map(|(c, p)| (c, p.name))
            .collect();
        assert_eq!(
            got,
            [
                (Change::Deleted, "a".into()),
                (Change::Updated, "b".into()),
                (Change::Added, "c".into()),
            ]
        );
        assert!(changes(&now, &now).is_empty());
    }
}
