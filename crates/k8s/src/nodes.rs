//! Every Node, watched only while someone looks: Hubble's peer service
//! tells Relay which nodes serve flows, and nothing else needs the other
//! nodes. The watch starts with the first subscriber and stops, its map
//! dropped, when the last one goes; it costs nothing in between.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::{Notify, watch};

use crate::convert::{NodeInfo, node_info};
use crate::objects;
use crate::reflector::{Collection, Event, Reflector, Sink};
use crate::watch::{ApiSource, SourceError};

/// Every Node's `T`, by name (`None`: not listed yet, or not watched).
pub type NodeMap<T> = Option<Arc<BTreeMap<String, T>>>;

/// What a Node is to the subscribers (`None`: not one of them).
type Convert<T> = Box<dyn Fn(&NodeInfo) -> Option<T> + Send>;

/// The watch of every Node, on a thread of its own.
pub struct NodeWatch<T> {
    tx: watch::Sender<NodeMap<T>>,
    wanted: Arc<Notify>,
}

impl<T: Clone + PartialEq + Send + Sync + 'static> NodeWatch<T> {
    /// A watch of `src`'s Nodes, each turned into a `T` by `convert`,
    /// that starts with the first [`NodeWatch::subscribe`].
    pub fn start(
        src: &ApiSource,
        convert: impl Fn(&NodeInfo) -> Option<T> + Send + 'static,
    ) -> Result<NodeWatch<T>, SourceError> {
        let (rt, client) = crate::client::on_own_runtime(src)?;
        let (tx, _) = watch::channel(None);
        let wanted = Arc::new(Notify::new());
        let (publish, woken) = (tx.clone(), wanted.clone());
        let convert: Convert<T> = Box::new(convert);
        std::thread::Builder::new()
            .name("kube-nodes".into())
            .spawn(move || rt.block_on(on_demand(client, publish, woken, convert)))
            .map_err(|e| SourceError::Client(e.to_string()))?;
        Ok(NodeWatch { tx, wanted })
    }

    /// The Nodes now and as they change, for as long as the receiver
    /// lives.
    pub fn subscribe(&self) -> watch::Receiver<NodeMap<T>> {
        let rx = self.tx.subscribe();
        self.wanted.notify_one();
        rx
    }
}

/// Watches the Nodes whenever `tx` has a receiver.
async fn on_demand<T: Clone + PartialEq + Send + Sync + 'static>(
    client: kube::Client,
    tx: watch::Sender<NodeMap<T>>,
    wanted: Arc<Notify>,
    convert: Convert<T>,
) {
    let nodes = Collection {
        what: "Nodes (for Hubble's peers)",
        path: "/api/v1/nodes",
        labels: None,
        fields: None,
    };
    loop {
        wanted.notified().await;
        if tx.receiver_count() == 0 {
            continue;
        }
        tracing::info!("watching every Node while Hubble Relay asks for peers");
        let sink = Publish {
            tx: &tx,
            convert: &convert,
            now: BTreeMap::new(),
            listing: None,
        };
        let run = std::pin::pin!(Reflector::new(client.clone(), nodes.clone()).run(sink));
        let closed = std::pin::pin!(tx.closed());
        futures::future::select(run, closed).await;
        tx.send_replace(None);
        tracing::info!("no one asks for Hubble's peers: the Node watch stopped");
    }
}

/// Keeps the map of Nodes and publishes it when it changes.
struct Publish<'a, T> {
    tx: &'a watch::Sender<NodeMap<T>>,
    convert: &'a Convert<T>,
    now: BTreeMap<String, T>,
    /// A list under way: what it has listed so far.
    listing: Option<BTreeMap<String, T>>,
}

impl<T: Clone + PartialEq> Publish<'_, T> {
    fn publish(&self) {
        self.tx.send_replace(Some(Arc::new(self.now.clone())));
    }

    /// Takes one event; whether the map changed.
    fn take(&mut self, e: Event<objects::Node>) -> bool {
        match e {
            Event::ListStart => {
                self.listing = Some(BTreeMap::new());
                false
            }
            Event::Listed(n) => {
                let info = node_info(n);
                if let (Some(l), Some(v)) = (&mut self.listing, (self.convert)(&info)) {
                    l.insert(info.name, v);
                }
                false
            }
            Event::ListDone => {
                self.now = self.listing.take().unwrap_or_default();
                true
            }
            Event::Applied(n) => {
                let info = node_info(n);
                match (self.convert)(&info) {
                    Some(v) if self.now.get(&info.name) == Some(&v) => false,
                    Some(v) => {
                        self.now.insert(info.name, v);
                        true
                    }
                    None => self.now.remove(&info.name).is_some(),
                }
            }
            Event::Deleted((_, name)) => self.now.remove(&name).is_some(),
            Event::Skipped { .. } => false,
        }
    }
}

impl<T: Clone + PartialEq> Sink<objects::Node> for Publish<'_, T> {
    async fn send(&mut self, e: Event<objects::Node>) -> Result<(), ()> {
        if self.tx.is_closed() {
            return Err(());
        }
        let listed = self.listing.is_none();
        if self.take(e) && (listed || self.listing.is_none()) {
            self.publish();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, ip: &str) -> objects::Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "resourceVersion": "1"},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}]}
        }))
        .unwrap()
    }

    fn address(n: &NodeInfo) -> Option<String> {
        n.addresses.first().cloned()
    }

    #[test]
    fn the_map_follows_lists_and_changes_and_is_published_when_it_changes() {
        let (tx, mut rx) = watch::channel(None);
        let convert: Convert<String> = Box::new(address);
        let mut sink = Publish {
            tx: &tx,
            convert: &convert,
            now: BTreeMap::new(),
            listing: None,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let send = |sink: &mut Publish<'_, String>, e| {
            rt.block_on(sink.send(e)).unwrap();
        };
        send(&mut sink, Event::ListStart);
        send(&mut sink, Event::Listed(node("a", "10.0.0.1")));
        assert!(
            !rx.has_changed().unwrap(),
            "nothing before the list is whole"
        );
        send(&mut sink, Event::ListDone);
        let map = rx.borrow_and_update().clone().unwrap();
        assert_eq!(map.get("a").map(String::as_str), Some("10.0.0.1"));
        // The same again (a status heartbeat): not published.
        send(&mut sink, Event::Applied(node("a", "10.0.0.1")));
        assert!(!rx.has_changed().unwrap());
        send(&mut sink, Event::Applied(node("b", "10.0.0.2")));
        assert_eq!(rx.borrow_and_update().clone().unwrap().len(), 2);
        send(&mut sink, Event::Deleted((String::new(), "a".into())));
        let map = rx.borrow_and_update().clone().unwrap();
        assert_eq!(map.keys().collect::<Vec<_>>(), ["b"]);
        // A relist replaces the map whole, once complete.
        send(&mut sink, Event::ListStart);
        send(&mut sink, Event::Listed(node("c", "10.0.0.3")));
        send(&mut sink, Event::Applied(node("d", "10.0.0.4")));
        assert!(
            !rx.has_changed().unwrap(),
            "not while a relist is under way"
        );
        send(&mut sink, Event::ListDone);
        let map = rx.borrow_and_update().clone().unwrap();
        assert_eq!(map.keys().collect::<Vec<_>>(), ["c"]);
        // Nobody subscribed any more: the reflector is told to stop.
        drop(rx);
        assert!(rt.block_on(sink.send(Event::ListStart)).is_err());
    }
}
