//! Service health-check node ports (reference §6.3): for every
//! LoadBalancer with `externalTrafficPolicy: Local`, an HTTP server on its
//! `healthCheckNodePort` tells the load balancer whether this node has a
//! ready local endpoint. Any path and method; 200 iff the node has at
//! least one and the proxy is healthy, else 503; the count is also in the
//! `X-Load-Balancing-Endpoint-Weight` header.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use crate::health::Response;
use crate::http::{Handler, Routes, Stopper, serve_until_dropped};

/// A service, as `(namespace, name)`.
pub type ServiceKey = (String, String);

/// Whether the proxy is healthy (kube-proxy's `Health().Healthy`, without
/// node eligibility).
pub type Healthy = Arc<dyn Fn() -> bool + Send + Sync>;

/// kube-proxy's answer: a tab-indented JSON body without a final newline.
pub fn answer(namespace: &str, name: &str, local_endpoints: usize, healthy: bool) -> Response {
    let body = format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {local_endpoints},\n\t\"serviceProxyHealthy\": {healthy}\n}}",
        quote(namespace),
        quote(name)
    );
    let mut r = Response::json(
        if local_endpoints > 0 && healthy {
            200
        } else {
            503
        },
        body,
    );
    r.headers.push((
        "X-Load-Balancing-Endpoint-Weight",
        local_endpoints.to_string(),
    ));
    r
}

/// A JSON string (Kubernetes names need no escapes, but be safe).
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

struct Server {
    port: u16,
    _stoppers: Vec<Stopper>,
}

/// A health-check node port that could not be opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenFailure {
    /// The service.
    pub service: ServiceKey,
    /// Its health-check node port.
    pub port: u16,
    /// The address it was to listen on.
    pub address: IpAddr,
    /// Why it could not.
    pub error: String,
}

/// The health-check servers of one IP family.
pub struct ServiceHealthServers {
    addresses: Vec<IpAddr>,
    healthy: Healthy,
    local: Arc<Mutex<BTreeMap<ServiceKey, usize>>>,
    servers: BTreeMap<ServiceKey, Server>,
}

impl ServiceHealthServers {
    /// Servers listening on `addresses` (an unspecified address listens on
    /// all of the family's).
    pub fn new(addresses: Vec<IpAddr>, healthy: Healthy) -> ServiceHealthServers {
        ServiceHealthServers {
            addresses,
            healthy,
            local: Arc::new(Mutex::new(BTreeMap::new())),
            servers: BTreeMap::new(),
        }
    }

    /// Where the servers listen.
    pub fn addresses(&self) -> &[IpAddr] {
        &self.addresses
    }

    /// Opens a server for every wanted service (closing and reopening it
    /// if its port changed) and closes the others. Returns one message per
    /// port that could not be opened; it is tried again on the next call.
    pub fn sync_services(&mut self, wanted: &BTreeMap<ServiceKey, u16>) -> Vec<ListenFailure> {
        self.servers
            .retain(|k, s| wanted.get(k).is_some_and(|p| *p == s.port));
        let mut errors = Vec::new();
        for (key, port) in wanted {
            if self.servers.contains_key(key) {
                continue;
            }
            let (ns, name) = key.clone();
            let (local, healthy) = (self.local.clone(), self.healthy.clone());
            let handler: Handler = Arc::new(move |_: &crate::http::Request| {
                let n = local
                    .lock()
                    .ok()
                    .and_then(|m| m.get(&(ns.clone(), name.clone())).copied())
                    .unwrap_or(0);
                Some(answer(&ns, &name, n, healthy()))
            });
            let mut stoppers = Vec::new();
            for ip in &self.addresses {
                match serve_until_dropped(
                    SocketAddr::new(*ip, *port),
                    Routes::fast(handler.clone()),
                ) {
                    Ok((_, s)) => stoppers.push(s),
                    Err(e) => errors.push(ListenFailure {
                        service: key.clone(),
                        port: *port,
                        address: *ip,
                        error: e.to_string(),
                    }),
                }
            }
            if stoppers.len() == self.addresses.len() {
                self.servers.insert(
                    key.clone(),
                    Server {
                        port: *port,
                        _stoppers: stoppers,
                    },
                );
            }
        }
        errors
    }

    /// Sets the number of ready local endpoints (distinct IPs) per service.
    pub fn sync_endpoints(&self, local: BTreeMap<ServiceKey, usize>) {
        if let Ok(mut m) = self.local.lock() {
            *m = local;
        }
    }

    /// The services served, with their ports.
    pub fn served(&self) -> BTreeMap<ServiceKey, u16> {
        self.servers
            .iter()
            .map(|(k, s)| (k.clone(), s.port))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn answers_as_kube_proxy() {
        let r = answer("ns1", "svc1", 1, true);
        assert_eq!(r.code, 200);
        assert_eq!(
            r.text_body(),
            "{\n\t\"service\": {\n\t\t\"namespace\": \"ns1\",\n\t\t\"name\": \"svc1\"\n\t},\n\t\"localEndpoints\": 1,\n\t\"serviceProxyHealthy\": true\n}"
        );
        assert_eq!(
            r.headers,
            vec![("X-Load-Balancing-Endpoint-Weight", "1".to_owned())]
        );
        assert_eq!(answer("ns1", "svc1", 0, true).code, 503);
        assert_eq!(answer("ns1", "svc1", 2, false).code, 503);
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn get(port: u16) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
        write!(
            s,
            "GET /whatever HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    }

    #[test]
    fn servers_follow_services_and_endpoints() {
        let mut h =
            ServiceHealthServers::new(vec!["127.0.0.1".parse().unwrap()], Arc::new(|| true));
        let (p1, p2) = (free_port(), free_port());
        let key = ("ns1".to_owned(), "svc1".to_owned());
        let wanted = BTreeMap::from([(key.clone(), p1)]);
        assert!(h.sync_services(&wanted).is_empty());
        let r = get(p1).unwrap();
        assert!(r.starts_with("HTTP/1.1 503"), "{r}");
        assert!(r.contains("\"localEndpoints\": 0"), "{r}");

        h.sync_endpoints(BTreeMap::from([(key.clone(), 2)]));
        let r = get(p1).unwrap();
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        assert!(r.contains("X-Load-Balancing-Endpoint-Weight: 2\r\n"), "{r}");

        // The port moves: the old one closes.
        assert!(
            h.sync_services(&BTreeMap::from([(key.clone(), p2)]))
                .is_empty()
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(get(p1).is_none());
        assert!(get(p2).unwrap().starts_with("HTTP/1.1 200"));

        // The service goes away.
        assert!(h.sync_services(&BTreeMap::new()).is_empty());
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(get(p2).is_none());
        assert!(h.served().is_empty());
    }

    #[test]
    fn a_port_in_use_is_reported_and_retried() {
        let busy = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = busy.local_addr().unwrap().port();
        let mut h =
            ServiceHealthServers::new(vec!["127.0.0.1".parse().unwrap()], Arc::new(|| true));
        let wanted = BTreeMap::from([(("ns1".to_owned(), "svc1".to_owned()), port)]);
        let errors = h.sync_services(&wanted);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].service.1, "svc1", "{errors:?}");
        assert_eq!(errors[0].port, port);
        drop(busy);
        assert!(h.sync_services(&wanted).is_empty());
        assert_eq!(h.served(), wanted);
    }
}
