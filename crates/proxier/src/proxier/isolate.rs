//! The isolation of refused elements: when the kernel refuses a sync's
//! transaction, dry runs of parts of it find the element additions it
//! refuses and the service ports they belong to, which are then left out
//! (quarantined) until they change, while everything else is programmed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use verdict_nft::{Backend, Transaction, Value};

use super::ledger::{Owner, holder};
use super::{Proxier, Quarantine, own_sets, static_set_name};
use crate::error::ProxierError;
use crate::layout;

/// Why the main transaction of a sync failed, with what is needed to find
/// the service ports responsible.
pub(super) struct Failure {
    pub(super) error: ProxierError,
    /// The transaction that failed, and the owner of each of its
    /// operations (element additions only).
    pub(super) attempt: Option<Box<(Transaction, Vec<Option<Owner>>)>>,
}

impl From<ProxierError> for Failure {
    fn from(error: ProxierError) -> Failure {
        Failure {
            error,
            attempt: None,
        }
    }
}

impl From<verdict_nft::NftError> for Failure {
    fn from(e: verdict_nft::NftError) -> Failure {
        Failure::from(ProxierError::from(e))
    }
}

/// How many times one sync quarantines and tries again before it gives up.
pub(super) const MAX_ISOLATION_ROUNDS: usize = 8;
/// The most service ports one isolation blames for conflicts between them.
const MAX_CONFLICTS: usize = 64;

/// The first line of an error, at most 300 bytes: enough to say why,
/// short enough for a log line, a metric label or an Event.
fn brief(e: &verdict_nft::NftError) -> String {
    let text = e.to_string();
    let mut line = text.lines().next().unwrap_or_default().to_owned();
    if line.len() > 300 {
        let mut cut = 300;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
        line.push('…');
    }
    line
}

/// Whether the backend's refusal may be the fault of some service port's
/// elements (and not, say, a missing `nft`).
pub(super) fn isolatable(e: &ProxierError) -> bool {
    use verdict_nft::NftError as E;
    matches!(
        e,
        ProxierError::Nft(
            E::Invalid(_) | E::NotFound(_) | E::AlreadyExists(_) | E::Busy(_) | E::Refused(_)
        )
    )
}

/// Element additions of one service port the backend refused.
pub(super) struct Refused {
    pub(super) owner: Owner,
    /// Indices in the transaction of the refused additions.
    ops: Vec<usize>,
    /// The backend's reason.
    reason: String,
}

impl Refused {
    /// Leaves the refused elements out (in `q`) and says which they were
    /// and why. A destination whose `firewall-ips` element is refused is
    /// not forwarded either: it would be open to every source.
    pub(super) fn quarantine(&self, tx: &Transaction, q: &mut Quarantine) -> String {
        let mut named = Vec::new();
        for &i in &self.ops {
            let Some(verdict_nft::Op::AddElement(set, e)) = tx.ops().get(i) else {
                continue;
            };
            let name = tx.set_name(*set);
            let Some(set) = static_set_name(name).or_else(|| layout::map_of_staging(name)) else {
                continue;
            };
            let key: Arc<[Value]> = e.key.clone();
            if set == layout::FIREWALL_IPS {
                q.elements
                    .entry(layout::SERVICE_IPS)
                    .or_default()
                    .insert(key.clone());
            }
            q.elements.entry(set).or_default().insert(key);
            let mut text = e
                .key
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" . ");
            if let Some(v) = &e.value {
                text.push_str(&format!(" : {v}"));
            }
            named.push(format!("{set} element {text}"));
        }
        let shown = named.len().min(3);
        let mut what = named[..shown].join(", ");
        if named.len() > shown {
            what.push_str(&format!(" and {} more", named.len() - shown));
        }
        let reason = format!("the kernel refused {what}: {}", self.reason);
        if q.reason.is_empty() {
            q.reason = reason.clone();
        } else {
            q.reason = format!("{}; {reason}", q.reason);
        }
        reason
    }
}

/// Finds the element additions that make `tx` fail, and the service ports
/// they belong to, with dry runs (`Backend::check`) of parts of it.
/// Everything that is not an element addition of some port (chains,
/// rules, deletions) is always kept; if that alone fails, no port is to
/// blame and the error is returned. First the ports (each port's additions
/// as one unit), then, for each port found, its additions one by one with
/// everything of the other ports that is not refused: only the elements
/// that fail are left out, so the port's other addresses and node port
/// keep working.
pub(super) fn isolate<B: Backend + ?Sized>(
    backend: &mut B,
    tx: &Transaction,
    owners: &[Option<Owner>],
) -> Result<Vec<Refused>, verdict_nft::NftError> {
    let mut by_owner: BTreeMap<&Owner, Vec<usize>> = BTreeMap::new();
    for (i, o) in owners.iter().enumerate() {
        if let Some(o) = o {
            by_owner.entry(o).or_default().push(i);
        }
    }
    let (ports, units): (Vec<&Owner>, Vec<Vec<usize>>) = by_owner.into_iter().unzip();
    let mut check = |allowed: &dyn Fn(usize) -> bool| {
        let part = tx.filtered(|i, _| owners[i].is_none() || allowed(i));
        backend.check(&part)
    };
    check(&|_| false)?;

    let bad_ports = refused_units(&mut check, &BTreeSet::new(), &units);
    let bad: BTreeSet<usize> = bad_ports.iter().map(|(u, _)| *u).collect();
    let mut base: BTreeSet<usize> = units
        .iter()
        .enumerate()
        .filter(|(u, _)| !bad.contains(u))
        .flat_map(|(_, ops)| ops.iter().copied())
        .collect();
    let mut out = Vec::new();
    for (u, reason) in bad_ports {
        let singles: Vec<Vec<usize>> = units[u].iter().map(|&i| vec![i]).collect();
        let refused = refused_units(&mut check, &base, &singles);
        let (ops, reason) = match refused.first() {
            // Refused only as a whole (it should not be): all of it.
            None => (units[u].clone(), reason),
            Some((_, first)) => (
                refused.iter().map(|(j, _)| singles[*j][0]).collect(),
                first.clone(),
            ),
        };
        base.extend(units[u].iter().filter(|i| !ops.contains(i)));
        out.push(Refused {
            owner: ports[u].clone(),
            ops,
            reason,
        });
    }
    Ok(out)
}

/// A dry run of the failed transaction with the element additions a
/// predicate allows (everything else is always in it).
type DryRun<'a> = dyn FnMut(&dyn Fn(usize) -> bool) -> Result<(), verdict_nft::NftError> + 'a;

/// Which of `units` (groups of operations, in name order) the backend
/// refuses when added to the operations of `base`, with its reason. A unit
/// refused on its own is found by bisection (about 2·log₂ n dry runs
/// each); units that are refused only together are resolved in order, the
/// later one losing, as `Owners` decides.
fn refused_units(
    check: &mut DryRun<'_>,
    base: &BTreeSet<usize>,
    units: &[Vec<usize>],
) -> Vec<(usize, String)> {
    let unit_of: BTreeMap<usize, usize> = units
        .iter()
        .enumerate()
        .flat_map(|(u, ops)| ops.iter().map(move |&i| (i, u)))
        .collect();
    let mut attempt = |picked: &BTreeSet<usize>| {
        check(&|i| base.contains(&i) || unit_of.get(&i).is_some_and(|u| picked.contains(u)))
    };

    // Refused on their own.
    let all: Vec<usize> = (0..units.len()).collect();
    let mut bad: Vec<(usize, String)> = Vec::new();
    let mut pending: Vec<&[usize]> = vec![&all];
    while let Some(part) = pending.pop() {
        let Err(e) = attempt(&part.iter().copied().collect()) else {
            continue;
        };
        match part {
            [] => {}
            [one] => bad.push((*one, brief(&e))),
            _ => {
                let (a, b) = part.split_at(part.len() / 2);
                pending.push(b);
                pending.push(a);
            }
        }
    }

    // Refused only together with others: the shortest failing prefix ends
    // with one to blame.
    let rest: Vec<usize> = all
        .iter()
        .copied()
        .filter(|u| !bad.iter().any(|(b, _)| b == u))
        .collect();
    let mut blamed: BTreeSet<usize> = BTreeSet::new();
    let prefix = |end: usize, blamed: &BTreeSet<usize>| -> BTreeSet<usize> {
        rest[..end]
            .iter()
            .copied()
            .filter(|u| !blamed.contains(u))
            .collect()
    };
    let mut start = 0;
    while blamed.len() < MAX_CONFLICTS {
        if start >= rest.len() || attempt(&prefix(rest.len(), &blamed)).is_ok() {
            break;
        }
        // prefix(hi) fails, prefix(start) passes.
        let (mut lo, mut hi) = (start + 1, rest.len());
        let mut reason = String::new();
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match attempt(&prefix(mid, &blamed)) {
                Err(e) => {
                    hi = mid;
                    reason = brief(&e);
                }
                Ok(()) => lo = mid + 1,
            }
        }
        if reason.is_empty()
            && let Err(e) = attempt(&prefix(hi, &blamed))
        {
            reason = brief(&e);
        }
        let culprit = rest[hi - 1];
        blamed.insert(culprit);
        bad.push((culprit, format!("refused together with others: {reason}")));
        start = hi;
    }
    bad
}

impl Proxier {
    /// The service port that wants each operation of `tx`: for an element
    /// addition, the holder of its key (as the diff chose it); none for
    /// the rest (deletions, chains, node-owned elements).
    pub(super) fn blame(&self, tx: &Transaction) -> Vec<Option<Owner>> {
        let own = own_sets(tx);
        tx.ops()
            .iter()
            .map(|op| {
                let verdict_nft::Op::AddElement(id, e) = op else {
                    return None;
                };
                // A staged key's owner is its map's.
                let set = own(*id).or_else(|| layout::map_of_staging(tx.set_name(*id)))?;
                let slot = self.slots.get(set)?.get(&e.key[..])?;
                holder(&self.slots, set, &e.key, &slot.owners).map(|(o, _)| o.clone())
            })
            .collect()
    }
}
