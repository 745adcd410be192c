//! Recomputing the contributions of the service ports that changed.

use std::collections::BTreeSet;
use std::sync::Arc;

use verdict_model::ServicePortName;

use crate::layout;
use crate::proxier::ledger::{Key, Owners, SetKey, with_prefix};
use crate::proxier::{Proxier, SyncResult};

impl Proxier {
    /// Recomputes the contributions of the service ports of the Services
    /// that changed (every port on a `rebuild`) and records them in the
    /// ledger. Returns, on a partial sync, the keys they touched (a full
    /// sync diffs every key anyway).
    pub(super) fn recompute(
        &mut self,
        full: bool,
        rebuild: bool,
        result: &mut SyncResult,
    ) -> Option<BTreeSet<SetKey>> {
        let ports = self.ports_to_recompute(rebuild, result);
        let node_port_ips = self.cfg.node_port_ips();
        let mut touched: Option<BTreeSet<SetKey>> = (!full).then(BTreeSet::new);
        if rebuild {
            // Every port is recomputed: start from nothing rather than
            // withdraw each one. A key many services share (a hairpin entry
            // of an endpoint they all use) keeps its owners in a sorted
            // list, and withdrawing then re-adding them one by one shifts
            // that list once per owner: quadratic at 30,000 services.
            self.contributions.clear();
            // What the kernel has is kept.
            for m in self.slots.values_mut() {
                m.retain(|_, s| {
                    s.owners = Owners::default();
                    s.programmed.is_some()
                });
            }
            self.chain_refs.clear();
            self.affinity_allowed.clear();
            self.no_local = (0, 0);
            // Every port's contribution is computed up front, on as many
            // threads as there are cores (each is a pure function of the
            // port, its endpoints and the configuration), then recorded
            // in one piece on this thread.
            let computed = self.compute_all(&ports, &node_port_ips);
            self.contribute_all(&ports, computed);
        } else {
            for port in &ports {
                if let Some(old) = self.contributions.remove(port) {
                    self.withdraw(port, &old, touched.as_mut());
                }
                if let Some(new) = self.compute(port, &node_port_ips) {
                    let stored = self.contribute(Arc::new(port.clone()), new, touched.as_mut());
                    self.contributions.insert(port.clone(), stored);
                }
            }
        }
        if let Some(t) = touched.as_mut() {
            self.touch_source_ranges(t);
        }
        self.need_rebuild = false;
        result.recomputed_ports = ports.len();
        result.rebuilt |= rebuild;
        result.no_local_endpoints_internal = self.no_local.0;
        result.no_local_endpoints_external = self.no_local.1;
        touched
    }

    /// The ports to recompute. On a rebuild every contribution is dropped
    /// and computed again, so the ports are the services' (in order,
    /// without a set to sort them into). Otherwise only those of the
    /// Services that changed, a range per Service (a full sync that is not
    /// a rebuild, a repair or a periodic check, diffs every key but
    /// computes only what changed).
    fn ports_to_recompute(&self, rebuild: bool, result: &SyncResult) -> Vec<ServicePortName> {
        if rebuild {
            return self.services.keys().cloned().collect();
        }
        let mut ports = BTreeSet::new();
        for svc in &result.updated_services {
            let of = |p: &&ServicePortName| p.service == *svc;
            let from = ServicePortName::first_of(svc);
            ports.extend(
                self.services
                    .range(from.clone()..)
                    .map(|(k, _)| k)
                    .take_while(of)
                    .cloned(),
            );
            ports.extend(
                self.contributions
                    .range(from..)
                    .map(|(k, _)| k)
                    .take_while(of)
                    .cloned(),
            );
        }
        ports.into_iter().collect()
    }

    /// Which source ranges a firewalled destination allows follows whoever
    /// holds it: when that may have changed (its `firewall-ips` key was
    /// touched), every range anyone wants there is looked at again.
    fn touch_source_ranges(&self, touched: &mut BTreeSet<SetKey>) {
        let entries: Vec<Key> = touched
            .iter()
            .filter(|(set, _)| *set == layout::FIREWALL_IPS)
            .map(|(_, k)| k.clone())
            .collect();
        let allow = layout::FIREWALL_ALLOW;
        for entry in entries {
            if let Some(m) = self.slots.get(allow) {
                touched.extend(with_prefix(m, &entry).map(|k| (allow, k.clone())));
            }
        }
    }
}
