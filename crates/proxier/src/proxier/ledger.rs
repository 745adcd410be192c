//! The slot ledger: for every element key of verdict's sets, the service
//! ports that want it (in name order, the first one winning) and the
//! element the kernel has there. What is wanted and what is programmed
//! share one entry, and every element and key is stored once, shared by
//! the slot, the contribution that names it and the transaction that
//! writes it.

use std::collections::BTreeMap;
use std::sync::Arc;

use verdict_model::ServicePortName;
use verdict_nft::{Element, Value};

use crate::layout;

/// A service port, shared by every element it owns.
pub(super) type Owner = Arc<ServicePortName>;

/// An element's key, kept once and shared by its slot, the elements that
/// have it and the contribution that names it.
pub(super) type Key = Arc<[Value]>;

/// A set and one of its keys.
pub(super) type SetKey = (&'static str, Key);

/// The owners of one element key and what each wants there. The first
/// owner in name order wins, so the outcome never depends on event order.
/// The winner's element is the same allocation as the one recorded as
/// programmed, once it is. Nearly every key has one owner, kept inline:
/// only a second one allocates, and the list of others is one pointer
/// while there is none (the map has an entry per element: 180,000 at
/// 30,000 Services).
#[derive(Debug, Default)]
pub(super) struct Owners {
    /// The first in name order (`None` only when there is none).
    pub(super) first: Option<Claim>,
    /// The others, in name order; never an empty list.
    /// A box, so that the usual absence is one word, not a `Vec`'s three.
    #[allow(clippy::box_collection)]
    pub(super) rest: Option<Box<Vec<Claim>>>,
}

/// An owner and the element it wants.
pub(super) type Claim = (Owner, Arc<Element>);

impl Owners {
    /// Records `owner`'s claim; returns whether it replaced a claim of
    /// the same owner (a port that wants one key twice).
    pub(super) fn insert(&mut self, owner: Owner, e: Arc<Element>) -> bool {
        let Some(first) = &mut self.first else {
            self.first = Some((owner, e));
            return false;
        };
        match owner.as_ref().cmp(first.0.as_ref()) {
            std::cmp::Ordering::Equal => {
                first.1 = e;
                true
            }
            std::cmp::Ordering::Less => {
                let was = std::mem::replace(first, (owner, e));
                self.rest.get_or_insert_default().insert(0, was);
                false
            }
            std::cmp::Ordering::Greater => {
                let rest = self.rest.get_or_insert_default();
                match rest.binary_search_by(|(o, _)| o.as_ref().cmp(&owner)) {
                    Ok(i) => {
                        rest[i].1 = e;
                        true
                    }
                    Err(i) => {
                        rest.insert(i, (owner, e));
                        false
                    }
                }
            }
        }
    }

    /// `owner`'s claim.
    pub(super) fn claim_of(&self, owner: &ServicePortName) -> Option<&Arc<Element>> {
        self.iter()
            .find(|(o, _)| o.as_ref() == owner)
            .map(|(_, e)| e)
    }

    pub(super) fn remove(&mut self, owner: &ServicePortName) {
        if self
            .first
            .as_ref()
            .is_some_and(|(o, _)| o.as_ref() == owner)
        {
            self.first = self.rest.as_mut().map(|r| r.remove(0));
        } else if let Some(rest) = &mut self.rest
            && let Ok(i) = rest.binary_search_by(|(o, _)| o.as_ref().cmp(owner))
        {
            rest.remove(i);
        }
        if self.rest.as_ref().is_some_and(|r| r.is_empty()) {
            self.rest = None;
        }
    }

    /// Every owner, in name order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Claim> {
        self.first
            .iter()
            .chain(self.rest.iter().flat_map(|r| r.iter()))
    }

    pub(super) fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.as_ref().map_or(0, |r| r.len())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    pub(super) fn winner(&self) -> Option<&Arc<Element>> {
        self.first.as_ref().map(|(_, e)| e)
    }

    pub(super) fn winner_owner(&self) -> Option<&Owner> {
        self.first.as_ref().map(|(o, _)| o)
    }
}

/// One key of a set: the service ports that want it, and the element the
/// kernel has there. What is wanted and what is programmed share one
/// entry, so each of the 180,000 keys at 30,000 Services is one entry of
/// one map, not one in a map of what is wanted and one more in a record
/// of the kernel. The programmed element is the winner's own allocation
/// whenever that is what the kernel has (nearly always).
#[derive(Debug, Default)]
pub(super) struct Slot {
    pub(super) owners: Owners,
    /// The element the kernel has for the key (`None`: none).
    pub(super) programmed: Option<Arc<Element>>,
}

impl Slot {
    /// Nobody wants the key and the kernel has nothing there: the entry
    /// can go.
    pub(super) fn is_unused(&self) -> bool {
        self.owners.is_empty() && self.programmed.is_none()
    }

    pub(super) fn of_kernel(e: Arc<Element>) -> Slot {
        Slot {
            owners: Owners::default(),
            programmed: Some(e),
        }
    }
}

/// Set → key → who wants it and what the kernel has.
pub(super) type Slots = BTreeMap<&'static str, BTreeMap<Key, Slot>>;

/// The owner whose element of `key` is programmed: the first in name
/// order, except in `firewall-allow`, where a source range is programmed
/// only for the service port that holds the firewalled destination (the
/// first in name order in `firewall-ips`). Two LoadBalancers on one address
/// and port thus never add up their ranges, and never overlap in the
/// interval set (which the kernel would refuse).
pub(super) fn holder<'a>(
    slots: &'a Slots,
    set: &str,
    key: &[Value],
    owners: &'a Owners,
) -> Option<&'a (Owner, Arc<Element>)> {
    if set != layout::FIREWALL_ALLOW {
        return owners.first.as_ref();
    }
    let entry = key.get(..key.len().saturating_sub(1))?;
    let winner = slots
        .get(layout::FIREWALL_IPS)?
        .get(entry)?
        .owners
        .winner_owner()?;
    owners.iter().find(|(o, _)| o == winner)
}

/// The keys of `m` that begin with `prefix`, in order.
pub(super) fn with_prefix<'a, V>(
    m: &'a BTreeMap<Key, V>,
    prefix: &'a [Value],
) -> impl Iterator<Item = &'a Key> {
    use std::ops::Bound;
    m.range::<[Value], _>((Bound::Included(prefix), Bound::Unbounded))
        .map(|(k, _)| k)
        .take_while(move |k| k.starts_with(prefix))
}

/// The slots of one set rebuilt: `kept` (only what the kernel has) joined
/// with the wanted `entries`, both in key order, into a map built in one
/// piece (a B-tree built from sorted entries fills its nodes). A kept
/// element equal to its new winner is replaced by the winner's allocation,
/// so that it is stored once.
pub(super) fn merged(
    kept: BTreeMap<Key, Slot>,
    entries: Vec<(Key, Owners)>,
) -> BTreeMap<Key, Slot> {
    if kept.is_empty() {
        return entries
            .into_iter()
            .map(|(k, owners)| {
                let slot = Slot {
                    owners,
                    programmed: None,
                };
                (k, slot)
            })
            .collect();
    }
    let mut kept = kept.into_iter().peekable();
    let mut out: Vec<(Key, Slot)> = Vec::with_capacity(entries.len());
    for (k, owners) in entries {
        while let Some(old) = kept.next_if(|(ok, _)| *ok < k) {
            out.push(old);
        }
        let programmed = kept
            .next_if(|(ok, _)| *ok == k)
            .and_then(|(_, s)| s.programmed);
        let programmed = match (programmed, owners.winner()) {
            (Some(p), Some(w)) if *p == **w => Some(w.clone()),
            (p, _) => p,
        };
        out.push((k, Slot { owners, programmed }));
    }
    out.extend(kept);
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use verdict_model::Protocol;

    fn owner(name: &str) -> Owner {
        Arc::new(ServicePortName::new("ns", name, "p", Protocol::Tcp))
    }

    fn element(port: u16) -> Arc<Element> {
        Arc::new(Element::key(vec![Value::Port(port)]))
    }

    fn names(o: &Owners) -> Vec<String> {
        o.iter().map(|(o, _)| o.service.name.to_string()).collect()
    }

    /// The first owner in name order wins, whatever the order they came
    /// in; one owner is kept without a list.
    #[test]
    fn owners_stay_in_name_order() {
        let mut o = Owners::default();
        assert!(o.is_empty() && o.winner().is_none());
        o.insert(owner("m"), element(1));
        assert_eq!((o.len(), o.rest.is_none()), (1, true));
        o.insert(owner("z"), element(2));
        o.insert(owner("a"), element(3));
        o.insert(owner("q"), element(4));
        assert_eq!(names(&o), ["a", "m", "q", "z"]);
        assert_eq!(o.winner(), Some(&element(3)));
        // Again: replaced in place.
        o.insert(owner("q"), element(5));
        assert_eq!(o.len(), 4);
        assert_eq!(o.iter().nth(2).map(|(_, e)| e), Some(&element(5)));
        // The winner goes: the next in name order wins.
        o.remove(&owner("a"));
        assert_eq!(names(&o), ["m", "q", "z"]);
        assert_eq!(
            o.winner_owner().map(|w| w.service.name.to_string()),
            Some("m".into())
        );
        o.remove(&owner("q"));
        o.remove(&owner("nobody"));
        assert_eq!(names(&o), ["m", "z"]);
        o.remove(&owner("m"));
        // One left: the list of others is gone.
        assert_eq!((names(&o), o.rest.is_none()), (vec!["z".to_string()], true));
        o.remove(&owner("z"));
        assert!(o.is_empty());
        assert_eq!(std::mem::size_of::<Owners>(), 24);
        // A key's owners and what the kernel has, one entry of one map.
        assert_eq!(std::mem::size_of::<Slot>(), 32);
    }

    fn key(port: u16) -> Key {
        Arc::from(vec![Value::Port(port)])
    }

    /// A rebuild joins what the kernel has with what is wanted: every key
    /// of either is kept, a kernel element equal to its new winner becomes
    /// the winner's own allocation, and a different one stays as the
    /// kernel has it (for the diff to replace).
    #[test]
    fn a_rebuild_keeps_what_the_kernel_has_beside_what_is_wanted() {
        let kernel = |port: u16| Slot::of_kernel(element(port));
        let kept: BTreeMap<Key, Slot> = [
            (key(1), kernel(1)),
            (key(2), kernel(2)),
            (
                key(3),
                Slot::of_kernel(Arc::new(Element::key(vec![Value::Int(3)]))),
            ),
        ]
        .into_iter()
        .collect();
        let wanted = |port: u16| {
            let mut o = Owners::default();
            o.insert(owner("a"), element(port));
            o
        };
        let entries = vec![
            (key(1), wanted(1)),
            (key(3), wanted(3)),
            (key(4), wanted(4)),
        ];
        let winner_1 = entries[0].1.winner().cloned().unwrap();
        let m = merged(kept, entries);
        assert_eq!(m.keys().cloned().collect::<Vec<_>>(), [1, 2, 3, 4].map(key));
        // Equal: shared with the winner.
        let s1 = &m[&key(1)];
        assert!(Arc::ptr_eq(s1.programmed.as_ref().unwrap(), &winner_1));
        // Nobody wants it: the kernel's, for the diff to delete.
        assert!(m[&key(2)].owners.is_empty() && m[&key(2)].programmed.is_some());
        // Different: the kernel's stays.
        assert_eq!(
            m[&key(3)].programmed.as_deref(),
            Some(&Element::key(vec![Value::Int(3)]))
        );
        assert_eq!(m[&key(3)].owners.len(), 1);
        // New: not programmed yet.
        assert!(m[&key(4)].programmed.is_none() && !m[&key(4)].is_unused());
    }
}
