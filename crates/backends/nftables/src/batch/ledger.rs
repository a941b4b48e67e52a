//! The [`Ledger`]: what the kernel holds beyond the bundles, counted, and the partial
//! sync's batch computed from it (see the parent module's docs).

use super::*;

/// What the kernel holds beyond the bundles themselves: who holds each destination, and
/// reference counts of what several owners share (cluster IPs of multi-port Services,
/// endpoint addresses in `hairpin`, shared chains, entry sets). Elements keyed by a
/// destination are written by its holder alone, so they need no count.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    claims: HashMap<Dest, Owner>,
    cluster_ips: IpCounts,
    hairpin: IpCounts,
    chains: HashMap<SharedChain, u32>,
    /// Owners with an entry in each entry set.
    entry_sets: HashMap<SetName, u32>,
    /// Owners that wanted a destination another owner holds.
    contested: HashSet<Owner>,
    owned_elements: usize,
    /// Service ports whose Local policy finds no local endpoint (metrics), kept up to date
    /// by every update so a sync never walks all bundles.
    pub no_local_internal: usize,
    pub no_local_external: usize,
}

/// Reference counts per IP address, kept per family: a `HashMap<IpAddr, u32>` bucket is 24
/// bytes (an `IpAddr` is 17), an IPv4 one 8. The hairpin counts hold one entry per endpoint
/// address: at 50k Services x 10 endpoints that table has 1M buckets, 25 MB with `IpAddr`
/// keys, 9 MB with IPv4 keys.
#[derive(Clone, Debug, Default)]
pub(super) struct IpCounts {
    v4: HashMap<Ipv4Addr, u32>,
    v6: HashMap<Ipv6Addr, u32>,
}

impl IpCounts {
    /// Counts one more holder; true for the first.
    pub(super) fn up(&mut self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(ip) => count_up(&mut self.v4, ip),
            IpAddr::V6(ip) => count_up(&mut self.v6, ip),
        }
    }

    pub(super) fn down(&mut self, ip: IpAddr) {
        match ip {
            IpAddr::V4(ip) => count_down(&mut self.v4, ip),
            IpAddr::V6(ip) => count_down(&mut self.v6, ip),
        };
    }

    pub(super) fn contains(&self, ip: &IpAddr) -> bool {
        match ip {
            IpAddr::V4(ip) => self.v4.contains_key(ip),
            IpAddr::V6(ip) => self.v6.contains_key(ip),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }
}

fn count_up<K: std::hash::Hash + Eq + Copy>(map: &mut HashMap<K, u32>, key: K) -> bool {
    let n = map.entry(key).or_default();
    *n += 1;
    *n == 1
}

fn count_down<K: std::hash::Hash + Eq + Copy>(map: &mut HashMap<K, u32>, key: K) -> bool {
    match map.get_mut(&key) {
        Some(n) if *n > 1 => {
            *n -= 1;
            false
        }
        Some(_) => {
            map.remove(&key);
            true
        }
        None => false,
    }
}

impl Ledger {
    /// The ledger of a freshly loaded `ruleset`.
    pub fn of(ruleset: &Ruleset) -> Self {
        let mut ledger = Self::default();
        for (owner, bundle) in &ruleset.bundles {
            ledger.hold(owner, bundle);
        }
        ledger
    }

    fn hold(&mut self, owner: &Owner, bundle: &Bundle) {
        for dest in &bundle.dests {
            self.claims.insert(*dest, owner.clone());
        }
        if bundle.contested {
            self.contested.insert(owner.clone());
        }
        if let Some(ip) = bundle.cluster_ip {
            self.cluster_ips.up(ip);
        }
        for ip in bundle.hairpin_ips() {
            self.hairpin.up(ip);
        }
        for chain in bundle.chains.iter() {
            count_up(&mut self.chains, *chain);
        }
        for set in bundle.entry_sets() {
            count_up(&mut self.entry_sets, set);
        }
        self.owned_elements +=
            bundle.entries.len() + bundle.slots.iter().map(|(_, e)| e.len()).sum::<usize>();
    }

    /// How many claims, counted keys and owned elements it holds (kpr_model::Sizes).
    pub fn footprint(&self) -> Sizes {
        Sizes::new()
            .with("claims", self.claims.len())
            .with("cluster_ips", self.cluster_ips.len())
            .with("hairpin", self.hairpin.len())
            .with("chains", self.chains.len())
            .with("entry_sets", self.entry_sets.len())
            .with("contested", self.contested.len())
            .with("owned_elements", self.owned_elements)
            .with("no_local_internal", self.no_local_internal)
            .with("no_local_external", self.no_local_external)
    }

    /// Whether `dest` is held by an owner other than `owner`.
    pub fn taken_by_other(&self, dest: &Dest, owner: &Owner) -> bool {
        self.claims.get(dest).is_some_and(|holder| holder != owner)
    }

    /// Elements in the table (shared ones once).
    pub fn element_count(&self) -> usize {
        self.owned_elements + self.cluster_ips.len() + self.hairpin.len()
    }

    pub fn has_chain(&self, chain: SharedChain) -> bool {
        self.chains.contains_key(&chain)
    }

    pub fn chains(&self) -> impl Iterator<Item = SharedChain> + '_ {
        self.chains.keys().copied()
    }

    /// The endpoint maps in use: those of the chains that own one.
    pub fn endpoint_maps(&self) -> impl Iterator<Item = SetName> + '_ {
        self.chains.keys().filter_map(|c| c.owned_map())
    }

    /// The entry sets in use (each has its dispatch rule), in name order.
    pub fn entry_sets(&self) -> BTreeSet<SetName> {
        self.entry_sets.keys().copied().collect()
    }

    /// Replaces the old bundles of some owners by their new ones; returns the batch that
    /// takes the kernel from the old to the new state, and whether a destination someone
    /// else wanted was released (a full sync then hands it over).
    pub fn update(
        &mut self,
        family: IpFamily,
        replaced: &[(Owner, Option<&Bundle>, Option<&Bundle>)],
        opts: &NftablesOptions,
    ) -> (Batch, bool) {
        let mut deletes: BTreeMap<SetName, Vec<ElemKey>> = BTreeMap::new();
        let mut adds: BTreeMap<SetName, Vec<ElementAdd>> = BTreeMap::new();
        let mut shared_before: HashMap<(SetName, IpAddr), bool> = HashMap::new();
        let mut chains_before: HashMap<SharedChain, bool> = HashMap::new();
        let mut sets_before: HashMap<SetName, bool> = HashMap::new();
        let mut released = false;
        for (owner, old, new) in replaced {
            for (bundle, up) in [(old, false), (new, true)] {
                let Some(bundle) = bundle else { continue };
                let (internal, external) = (
                    usize::from(bundle.no_local_internal),
                    usize::from(bundle.no_local_external),
                );
                if up {
                    self.no_local_internal += internal;
                    self.no_local_external += external;
                } else {
                    self.no_local_internal = self.no_local_internal.saturating_sub(internal);
                    self.no_local_external = self.no_local_external.saturating_sub(external);
                }
            }
            let old_elements = old.map(|b| b.owned_elements()).unwrap_or_default();
            let new_elements = new.map(|b| b.owned_elements()).unwrap_or_default();
            let (removed, added) = diff(&old_elements, &new_elements);
            self.owned_elements = (self.owned_elements + added.len()).saturating_sub(removed.len());
            for e in removed {
                deletes.entry(e.set).or_default().push(e.key.clone());
            }
            for e in added {
                adds.entry(e.set)
                    .or_default()
                    .push((e.key.clone(), e.value, e.comment.clone()));
            }
            // Shared elements and chains: counted, written on the first holder, deleted
            // with the last.
            let shared = |b: Option<&&Bundle>| -> (Option<IpAddr>, BTreeSet<IpAddr>, Vec<SharedChain>) {
                b.map_or_else(Default::default, |b| {
                    (b.cluster_ip, b.hairpin_ips(), b.chains.to_vec())
                })
            };
            let (old_vip, old_hairpin, old_chains) = shared(old.as_ref());
            let (new_vip, new_hairpin, new_chains) = shared(new.as_ref());
            for ip in new_vip.iter().chain(&old_vip) {
                shared_before
                    .entry((SetName::ClusterIps, *ip))
                    .or_insert(self.cluster_ips.contains(ip));
            }
            for ip in new_hairpin.iter().chain(&old_hairpin) {
                shared_before
                    .entry((SetName::Hairpin, *ip))
                    .or_insert(self.hairpin.contains(ip));
            }
            for chain in new_chains.iter().chain(&old_chains) {
                chains_before
                    .entry(*chain)
                    .or_insert(self.chains.contains_key(chain));
            }
            let entry_sets = |b: Option<&&Bundle>| b.map(|b| b.entry_sets()).unwrap_or_default();
            let (old_sets, new_sets) = (entry_sets(old.as_ref()), entry_sets(new.as_ref()));
            for set in new_sets.iter().chain(&old_sets) {
                sets_before
                    .entry(*set)
                    .or_insert(self.entry_sets.contains_key(set));
            }
            for set in new_sets {
                count_up(&mut self.entry_sets, set);
            }
            for set in old_sets {
                count_down(&mut self.entry_sets, set);
            }
            if let Some(ip) = new_vip {
                self.cluster_ips.up(ip);
            }
            for ip in &new_hairpin {
                self.hairpin.up(*ip);
            }
            for chain in &new_chains {
                count_up(&mut self.chains, *chain);
            }
            if let Some(ip) = old_vip {
                self.cluster_ips.down(ip);
            }
            for ip in &old_hairpin {
                self.hairpin.down(*ip);
            }
            for chain in &old_chains {
                count_down(&mut self.chains, *chain);
            }
            // Destinations.
            if let Some(old) = old {
                for dest in &old.dests {
                    if self.claims.get(dest) == Some(owner) {
                        self.claims.remove(dest);
                        released |= new.is_none_or(|n| !n.dests.contains(dest));
                    }
                }
            }
            self.contested.remove(owner);
            if let Some(new) = new {
                for dest in &new.dests {
                    self.claims.insert(*dest, owner.clone());
                }
                if new.contested {
                    self.contested.insert(owner.clone());
                }
            }
        }
        for ((set, ip), existed) in shared_before {
            let map = if set == SetName::ClusterIps {
                &self.cluster_ips
            } else {
                &self.hairpin
            };
            let key = if set == SetName::ClusterIps {
                ElemKey::Addr(ip)
            } else {
                ElemKey::AddrPair(ip, ip)
            };
            match (existed, map.contains(&ip)) {
                (true, false) => deletes.entry(set).or_default().push(key),
                (false, true) => adds.entry(set).or_default().push((key, None, None)),
                _ => {}
            }
        }
        let created = creation_order(
            chains_before
                .iter()
                .filter(|(c, existed)| !**existed && self.chains.contains_key(c))
                .map(|(c, _)| *c),
        );
        let mut gone = creation_order(
            chains_before
                .iter()
                .filter(|(c, existed)| **existed && !self.chains.contains_key(c))
                .map(|(c, _)| *c),
        );
        gone.reverse();
        let changed_sets = |existed: bool| -> BTreeSet<SetName> {
            sets_before
                .iter()
                .filter(|(set, before)| **before == existed && self.entry_sets.contains_key(set) != existed)
                .map(|(set, _)| *set)
                .collect()
        };
        let (new_sets, gone_sets) = (changed_sets(false), changed_sets(true));

        let mut batch = Batch::new(family);
        // A new chain's endpoint map first, empty: binding it walks no element.
        for map in created.iter().filter_map(|c| c.owned_map()) {
            batch.ops.push(Op::AddSet(map));
        }
        for chain in created {
            add_chain_ops(&mut batch.ops, chain, opts);
        }
        for set in &new_sets {
            batch.ops.push(Op::AddSet(*set));
        }
        let in_use = self.entry_sets();
        for kind in EntryKind::ALL {
            let of_kind = |set: &SetName| matches!(set, SetName::Entries { kind: k, .. } if *k == kind);
            if new_sets.iter().chain(&gone_sets).any(of_kind) {
                rewrite_dispatch(&mut batch.ops, kind, &in_use, opts);
            }
        }
        // Entries first, so nothing points at a slot while it is gone.
        let mut deletes: Vec<_> = deletes.into_iter().collect();
        deletes.sort_by_key(|(set, _)| (std::cmp::Reverse(load_rank(*set)), *set));
        for (set, mut keys) in deletes {
            keys.sort();
            batch.ops.push(Op::DeleteElements(set, keys));
        }
        let mut adds: Vec<_> = adds.into_iter().collect();
        adds.sort_by_key(|(set, _)| (load_rank(*set), *set));
        for (set, mut elements) in adds {
            elements.sort();
            batch.ops.push(Op::AddElements(set, elements));
        }
        for set in gone_sets {
            batch.ops.push(Op::DeleteSet(set));
        }
        for chain in &gone {
            batch.ops.push(Op::DeleteChain(ChainId::Shared(*chain)));
        }
        for map in gone.iter().filter_map(|c| c.owned_map()) {
            batch.ops.push(Op::DeleteSet(map));
        }
        (batch, released && !self.contested.is_empty())
    }
}

/// Replaces the rules of `kind`'s dispatch chain by those for `entry_sets`: flushing the
/// chain and adding all of them needs no rule handle. Rare (a new endpoint count, timeout
/// or policy shape), and cheap to validate since no large verdict map is left.
fn rewrite_dispatch(
    ops: &mut Vec<Op>,
    kind: EntryKind,
    entry_sets: &BTreeSet<SetName>,
    opts: &NftablesOptions,
) {
    let chain = ChainId::Fixed(kind.dispatch_chain());
    ops.push(Op::FlushChain(chain));
    for rule in dispatch_rules(kind, entry_sets, opts) {
        ops.push(Op::AddRule(chain, rule));
    }
}

/// Elements of `old` not in `new`, and of `new` not in `old` (both sorted).
fn diff<'a>(old: &'a [Element], new: &'a [Element]) -> (Vec<&'a Element>, Vec<&'a Element>) {
    let (mut removed, mut added) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j)) {
            (Some(a), Some(b)) if a == b => {
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a < b => {
                removed.push(a);
                i += 1;
            }
            (Some(_), Some(b)) => {
                added.push(b);
                j += 1;
            }
            (Some(a), None) => {
                removed.push(a);
                i += 1;
            }
            (None, Some(b)) => {
                added.push(b);
                j += 1;
            }
            (None, None) => break,
        }
    }
    (removed, added)
}
