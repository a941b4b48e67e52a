//! Batches: the ordered operations one atomic nf_tables transaction carries, and how a
//! sync computes them.
//!
//! - A **full** sync deletes and recreates the table (removing whatever others added to
//!   it), declares every set (the entry sets and endpoint maps in use too, all empty
//!   until the chains binding them exist), writes the fixed chains, every
//!   shared chain in use and then the fixed rules (the dispatch rules go to shared
//!   chains, which must exist first), then the elements. Large loads are split by element
//!   count ([`full_batches`]): the first batch holds the table, the chains and the first
//!   elements; each further batch only
//!   elements, endpoint maps before the entries that lead to them, so a Service becomes
//!   reachable only once its endpoints are in.
//! - A **partial** sync diffs the old and new bundles of the changed owners; the
//!   [`Ledger`] counts what owners share (cluster IPs, hairpin addresses, shared chains,
//!   entry sets): chains that become used are created first, then the entry sets that
//!   become used and, when the entry sets in use changed, the dispatch chains rewritten
//!   (flushed, one rule per set: no rule handle is ever needed); then element deletes,
//!   element adds (a changed value, an entry moving to another target's set, or a slot
//!   moving to another endpoint map when the count changes, is a delete and an add), and
//!   last the entry sets, chains and endpoint maps no longer used. A new Service whose
//!   target chain exists is element adds to plain sets and data maps only, which the
//!   kernel commits without validating the table; a new chain binding an endpoint map
//!   comes with that map, created empty just before it, so the kernel's walk of the map's
//!   elements on binding (`nf_tables_bind_set`) has nothing to walk.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kpr_model::{IpFamily, Sizes};

use crate::build::{Bundle, Dest, Owner, Ruleset, dispatch_rules, shared_rules};
use crate::model::{ElemKey, ElemValue, Element, Rule};
use crate::names::{ChainId, EntryKind, RejectCounter, SetName, SharedChain};
use crate::options::NftablesOptions;
use crate::render::{TABLE, chain_hook, element_text, family_word, rule_text, set_body};
use crate::transport::Listing;

/// One element to add: key, map data, comment.
pub type ElementAdd = (ElemKey, Option<ElemValue>, Option<kpr_naming::text::Comment>);

/// One operation of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Create the table if missing (never fails).
    AddTable,
    /// Delete the table (and everything in it, also what others added).
    DeleteTable,
    AddSet(SetName),
    AddChain(ChainId),
    AddRule(ChainId, Rule),
    /// Flush and delete a chain no element points at any more.
    DeleteChain(ChainId),
    /// Delete an entry set no entry is in any more (its dispatch rule is gone first), or
    /// an endpoint map whose chain is gone.
    DeleteSet(SetName),
    /// Remove every rule of one of our chains (full syncs in place).
    FlushChain(ChainId),
    /// Remove every element of one of our sets (full syncs in place).
    FlushSet(SetName),
    /// Delete a chain or set that should not be in our table, by the kernel's handle.
    DeleteChainByHandle(u64),
    DeleteSetByHandle(u64),
    /// Create a named counter (one that exists keeps its numbers).
    AddCounter(RejectCounter),
    /// Delete a stateful object (a counter, a quota, ...) that should not be in our table,
    /// by its type and the kernel's handle.
    DeleteObjectByHandle(kpr_nfnetlink::ObjectType, u64),
    /// Elements with their data and comment (see [`crate::Element::comment`]).
    AddElements(SetName, Vec<ElementAdd>),
    DeleteElements(SetName, Vec<ElemKey>),
}

/// The operations of one atomic transaction on one family's table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub family: IpFamily,
    pub ops: Vec<Op>,
}

impl Batch {
    pub fn new(family: IpFamily) -> Self {
        Self {
            family,
            ops: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Elements added and deleted, rules written (for metrics and tests).
    pub fn counts(&self) -> BatchCounts {
        let mut c = BatchCounts::default();
        for op in &self.ops {
            match op {
                Op::AddElements(_, e) => c.elements_added += e.len(),
                Op::DeleteElements(_, e) => c.elements_deleted += e.len(),
                Op::AddRule(..) => c.rules_written += 1,
                Op::AddChain(_) => c.chains_added += 1,
                Op::DeleteChain(_) => c.chains_deleted += 1,
                _ => {}
            }
        }
        c
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchCounts {
    pub elements_added: usize,
    pub elements_deleted: usize,
    pub rules_written: usize,
    pub chains_added: usize,
    pub chains_deleted: usize,
}

/// Sets in the order their elements are loaded: what entries lead to first.
fn load_rank(set: SetName) -> u8 {
    match set {
        SetName::Endpoints(_) | SetName::Hairpin | SetName::Affinity(_) => 0,
        SetName::ServiceCidrs | SetName::NodePortIps | SetName::FirewallIps | SetName::FirewallAllow => 1,
        SetName::ClusterIps | SetName::NoEndpoint { .. } | SetName::LocalhostNodePorts => 2,
        SetName::Entries { .. } => 3,
    }
}

/// Shared chains sorted so that a chain comes after the chains it jumps to.
fn creation_order(chains: impl IntoIterator<Item = SharedChain>) -> Vec<SharedChain> {
    let mut v: Vec<SharedChain> = chains.into_iter().collect();
    v.sort_by_key(|c| (c.level(), *c));
    v
}

fn add_chain_ops(ops: &mut Vec<Op>, chain: SharedChain, opts: &NftablesOptions) {
    let id = ChainId::Shared(chain);
    ops.push(Op::AddChain(id));
    for rule in shared_rules(chain, opts) {
        ops.push(Op::AddRule(id, rule));
    }
}

/// The batches of a full sync, none holding more than `max_elements` elements (the first
/// also holds the table and its chains).
pub fn full_batches(ruleset: &Ruleset, opts: &NftablesOptions, max_elements: usize) -> Vec<Batch> {
    let mut batches = Vec::new();
    let _ = stream_full(ruleset, opts, FullStart::Recreate, max_elements, &mut |batch| {
        batches.push(batch);
        Ok::<(), std::convert::Infallible>(())
    });
    batches
}

/// Hands the batches of a full sync to `sink` one at a time, so only one batch is ever
/// built in memory. Elements go in by `load_rank`; within a set in owner order (shared
/// ones, cluster IPs and hairpin addresses, once).
pub fn stream_full<E>(
    ruleset: &Ruleset,
    opts: &NftablesOptions,
    start: FullStart<'_>,
    max_elements: usize,
    sink: &mut dyn FnMut(Batch) -> Result<(), E>,
) -> Result<(), E> {
    let family = ruleset.family;
    let max = max_elements.max(1);
    let shared: BTreeSet<SharedChain> = ruleset
        .bundles
        .values()
        .flat_map(|b| b.chains.iter().copied())
        .collect();
    let mut batch = Batch::new(family);
    batch.ops.push(Op::AddTable);
    match start {
        FullStart::Recreate => {
            batch.ops.push(Op::DeleteTable);
            batch.ops.push(Op::AddTable);
        }
        FullStart::InPlace(listing) => clear_in_place(&mut batch.ops, ruleset, opts, &shared, listing),
    }
    for set in &ruleset.sets {
        batch.ops.push(Op::AddSet(*set));
    }
    // Before the rules that count into them; kept with their numbers by an in-place sync.
    for counter in counters(opts) {
        batch.ops.push(Op::AddCounter(counter));
    }
    for (chain, _) in &ruleset.fixed {
        batch.ops.push(Op::AddChain(ChainId::Fixed(*chain)));
    }
    for chain in creation_order(shared) {
        add_chain_ops(&mut batch.ops, chain, opts);
    }
    for (chain, rules) in &ruleset.fixed {
        for rule in rules {
            batch.ops.push(Op::AddRule(ChainId::Fixed(*chain), rule.clone()));
        }
    }
    let mut pending = Pending::new();
    let mut room = max;
    for rank in 0..=3u8 {
        // Shared elements go out once. Counted per family, not as a set of
        // (SetName, IpAddr): at 50k Services x 10 endpoints that set held every endpoint
        // address, ~40 MB for the length of the cold load.
        let (mut cluster_ips, mut hairpin) = (IpCounts::default(), IpCounts::default());
        for bundle in ruleset.bundles.values() {
            for e in bundle.all_elements() {
                if load_rank(e.set) != rank {
                    continue;
                }
                let first = match e.key {
                    ElemKey::Addr(ip) if e.set == SetName::ClusterIps => cluster_ips.up(ip),
                    ElemKey::AddrPair(ip, _) if e.set == SetName::Hairpin => hairpin.up(ip),
                    _ => true,
                };
                if !first {
                    continue;
                }
                pending
                    .entry((rank, e.set))
                    .or_default()
                    .push((e.key, e.value, e.comment));
                room -= 1;
                if room == 0 {
                    flush(&mut batch, &mut pending);
                    sink(std::mem::replace(&mut batch, Batch::new(family)))?;
                    room = max;
                }
            }
        }
    }
    flush(&mut batch, &mut pending);
    if !batch.is_empty() {
        sink(batch)?;
    }
    Ok(())
}

/// How a full sync begins.
#[derive(Clone, Copy, Debug)]
pub enum FullStart<'a> {
    /// Delete the table and create it anew (first sync, after a failure, table missing).
    Recreate,
    /// Keep the table and the dynamic affinity sets (so sticky clients stay sticky):
    /// flush our chains and sets, delete whatever else `listing` shows, load everything.
    InPlace(&'a Listing),
}

/// The named counters of a table with `opts` (the loopback NodePorts' rejected packets).
pub fn counters(opts: &NftablesOptions) -> impl Iterator<Item = RejectCounter> {
    opts.localhost_nodeports
        .rejected()
        .iter()
        .map(|&p| RejectCounter(p))
}

/// The start of an in-place full sync: our chains and non-dynamic sets emptied, every
/// other chain, set and object of the table deleted (by handle). Our counters are kept,
/// with their numbers.
fn clear_in_place(
    ops: &mut Vec<Op>,
    ruleset: &Ruleset,
    opts: &NftablesOptions,
    shared: &BTreeSet<SharedChain>,
    listing: &Listing,
) {
    let chains: HashMap<String, ChainId> = ruleset
        .fixed
        .iter()
        .map(|(c, _)| ChainId::Fixed(*c))
        .chain(shared.iter().map(|c| ChainId::Shared(*c)))
        .map(|c| (c.to_string(), c))
        .collect();
    let sets: HashMap<String, SetName> = ruleset.sets.iter().map(|s| (s.to_string(), *s)).collect();
    for name in listing.chains.keys() {
        if let Some(chain) = chains.get(name) {
            ops.push(Op::FlushChain(*chain));
        }
    }
    for name in &listing.sets {
        match sets.get(name) {
            Some(SetName::Affinity(_)) => {}
            Some(set) => ops.push(Op::FlushSet(*set)),
            None => {}
        }
    }
    for (name, handle) in &listing.chain_handles {
        if !chains.contains_key(name) {
            ops.push(Op::DeleteChainByHandle(*handle));
        }
    }
    for (name, handle) in &listing.set_handles {
        if !sets.contains_key(name) {
            ops.push(Op::DeleteSetByHandle(*handle));
        }
    }
    // After the chains: a foreign rule counting into a foreign object is gone by now.
    let ours: BTreeSet<String> = counters(opts).map(|c| c.to_string()).collect();
    for ((kind, name), handle) in &listing.objects {
        if *kind != kpr_nfnetlink::ObjectType::COUNTER || !ours.contains(name) {
            ops.push(Op::DeleteObjectByHandle(*kind, *handle));
        }
    }
}

type Pending = BTreeMap<(u8, SetName), Vec<ElementAdd>>;

fn flush(batch: &mut Batch, pending: &mut Pending) {
    for ((_, set), elements) in std::mem::take(pending) {
        batch.ops.push(Op::AddElements(set, elements));
    }
}

// === the ledger: what the kernel holds ===

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
struct IpCounts {
    v4: HashMap<Ipv4Addr, u32>,
    v6: HashMap<Ipv6Addr, u32>,
}

impl IpCounts {
    /// Counts one more holder; true for the first.
    fn up(&mut self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(ip) => count_up(&mut self.v4, ip),
            IpAddr::V6(ip) => count_up(&mut self.v6, ip),
        }
    }

    fn down(&mut self, ip: IpAddr) {
        match ip {
            IpAddr::V4(ip) => count_down(&mut self.v4, ip),
            IpAddr::V6(ip) => count_down(&mut self.v6, ip),
        };
    }

    fn contains(&self, ip: &IpAddr) -> bool {
        match ip {
            IpAddr::V4(ip) => self.v4.contains_key(ip),
            IpAddr::V6(ip) => self.v6.contains_key(ip),
        }
    }

    fn len(&self) -> usize {
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

// === text ===

fn set_kind(set: SetName) -> &'static str {
    match set {
        SetName::Endpoints(_) => "map",
        _ => "set",
    }
}

/// `nft -f` text for one batch.
pub fn batch_text(batch: &Batch, affinity_capacity: u32) -> String {
    let fam = family_word(batch.family);
    let table = format!("{fam} {TABLE}");
    let mut out = String::new();
    for op in &batch.ops {
        match op {
            Op::AddTable => {
                let _ = writeln!(out, "add table {table} {{ comment \"rules for kube-proxy\" ; }}");
            }
            Op::DeleteTable => {
                let _ = writeln!(out, "delete table {table}");
            }
            Op::AddSet(set) => {
                let body = set_body(batch.family, *set, affinity_capacity);
                let _ = writeln!(out, "add {} {table} {set} {{ {body} }}", set_kind(*set));
            }
            Op::FlushChain(chain) => {
                let _ = writeln!(out, "flush chain {table} {chain}");
            }
            Op::FlushSet(set) => {
                let _ = writeln!(out, "flush {} {table} {set}", set_kind(*set));
            }
            Op::DeleteChainByHandle(handle) => {
                let _ = writeln!(out, "delete chain {table} handle {handle}");
            }
            Op::DeleteSetByHandle(handle) => {
                // `delete set ... handle` deletes maps too.
                let _ = writeln!(out, "delete set {table} handle {handle}");
            }
            Op::AddCounter(counter) => {
                let _ = writeln!(out, "add counter {table} {counter}");
            }
            Op::DeleteObjectByHandle(kind, handle) => match kind.keyword() {
                Some(keyword) => {
                    let _ = writeln!(out, "delete {keyword} {table} handle {handle}");
                }
                // nft names no such type, so its listing shows no such object either.
                None => {
                    let _ = writeln!(out, "# {kind} handle {handle}: not deleted through nft");
                }
            },
            Op::AddChain(chain) => match chain_hook(*chain) {
                Some(hook) => {
                    let _ = writeln!(out, "add chain {table} {chain} {{ {hook} }}");
                }
                None => {
                    let _ = writeln!(out, "add chain {table} {chain}");
                }
            },
            Op::AddRule(chain, rule) => {
                let _ = writeln!(out, "add rule {table} {chain} {}", rule_text(batch.family, rule));
            }
            Op::DeleteChain(chain) => {
                let _ = writeln!(out, "flush chain {table} {chain}");
                let _ = writeln!(out, "delete chain {table} {chain}");
            }
            Op::DeleteSet(set) => {
                let _ = writeln!(out, "delete {} {table} {set}", set_kind(*set));
            }
            Op::AddElements(set, elements) => {
                for chunk in elements.chunks(256) {
                    let _ = write!(out, "add element {table} {set} {{ ");
                    for (i, (key, value, comment)) in chunk.iter().enumerate() {
                        if i > 0 {
                            out.push_str(", ");
                        }
                        element_text(&mut out, key, value.as_ref(), comment.as_ref());
                    }
                    out.push_str(" }\n");
                }
            }
            Op::DeleteElements(set, keys) => {
                for chunk in keys.chunks(256) {
                    let _ = write!(out, "delete element {table} {set} {{ ");
                    for (i, key) in chunk.iter().enumerate() {
                        if i > 0 {
                            out.push_str(", ");
                        }
                        element_text(&mut out, key, None, None);
                    }
                    out.push_str(" }\n");
                }
            }
        }
    }
    out
}
