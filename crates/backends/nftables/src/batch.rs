//! Batches: the ordered operations one atomic nf_tables transaction carries, and how a
//! sync computes them.
//!
//! - A **full** sync deletes and recreates the table (removing whatever others added to
//!   it), declares every set, writes the fixed chains and every shared chain in use, then
//!   the elements. Large loads are split by element count ([`full_batches`]): the first
//!   batch holds the table, the chains and the first elements; each further batch only
//!   elements, endpoint maps before the entries that lead to them, so a Service becomes
//!   reachable only once its endpoints are in.
//! - A **partial** sync diffs the old and new bundles of the changed owners against the
//!   [`Ledger`] (reference counts of every element and shared chain): chains that become
//!   used are created first, then element deletes, element adds (a changed value is a
//!   delete and an add of the same key), and last the chains no longer used.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use kpr_model::IpFamily;

use crate::build::{Bundle, Ruleset, shared_rules};
use crate::model::{ElemKey, ElemValue, Element, Rule};
use crate::names::{ChainId, SetName, SharedChain};
use crate::options::NftablesOptions;
use crate::render::{TABLE, chain_hook, element_text, family_word, rule_text, set_body};

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
    AddElements(SetName, Vec<(ElemKey, Option<ElemValue>)>),
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
        SetName::ClusterIps | SetName::NoEndpointServices | SetName::NoEndpointNodePorts => 2,
        SetName::ServiceIps | SetName::ServiceNodePorts => 3,
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

/// Every element of the ruleset once, grouped by set (the first owner wins a key).
fn all_elements(ruleset: &Ruleset) -> BTreeMap<SetName, BTreeMap<ElemKey, Option<ElemValue>>> {
    let mut sets: BTreeMap<SetName, BTreeMap<ElemKey, Option<ElemValue>>> = BTreeMap::new();
    for bundle in ruleset.bundles.values() {
        for e in &bundle.elements {
            sets.entry(e.set)
                .or_default()
                .entry(e.key.clone())
                .or_insert(e.value);
        }
    }
    sets
}

/// The batches of a full sync, none holding more than `max_elements` elements (the first
/// also holds the table and its chains).
pub fn full_batches(ruleset: &Ruleset, opts: &NftablesOptions, max_elements: usize) -> Vec<Batch> {
    let family = ruleset.family;
    let mut first = Batch::new(family);
    first.ops.push(Op::AddTable);
    first.ops.push(Op::DeleteTable);
    first.ops.push(Op::AddTable);
    for set in &ruleset.sets {
        first.ops.push(Op::AddSet(*set));
    }
    for (chain, _) in &ruleset.fixed {
        first.ops.push(Op::AddChain(ChainId::Fixed(*chain)));
    }
    for (chain, rules) in &ruleset.fixed {
        for rule in rules {
            first.ops.push(Op::AddRule(ChainId::Fixed(*chain), rule.clone()));
        }
    }
    let shared: BTreeSet<SharedChain> = ruleset
        .bundles
        .values()
        .flat_map(|b| b.chains.iter().copied())
        .collect();
    for chain in creation_order(shared) {
        add_chain_ops(&mut first.ops, chain, opts);
    }
    let mut sets: Vec<_> = all_elements(ruleset).into_iter().collect();
    sets.sort_by_key(|(set, _)| (load_rank(*set), *set));
    let mut batches = vec![first];
    let mut room = max_elements.max(1);
    for (set, elements) in sets {
        let mut elements: Vec<_> = elements.into_iter().collect();
        while !elements.is_empty() {
            if room == 0 {
                batches.push(Batch::new(family));
                room = max_elements.max(1);
            }
            let rest = elements.split_off(room.min(elements.len()));
            room -= elements.len();
            if let Some(batch) = batches.last_mut() {
                batch.ops.push(Op::AddElements(set, elements));
            }
            elements = rest;
        }
    }
    batches
}

// === the ledger: what the kernel holds, with reference counts ===

#[derive(Clone, Debug)]
struct Held {
    value: Option<ElemValue>,
    owners: u32,
}

/// Every element and shared chain in the kernel, with the number of owners using it.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    elements: HashMap<(SetName, ElemKey), Held>,
    chains: HashMap<SharedChain, u32>,
    /// Keys two owners wanted with different values (the first value stays); removing an
    /// owner of such a key calls for a full sync, which resolves it in a fixed order.
    pub conflicts: usize,
}

impl Ledger {
    /// The ledger of a freshly loaded `ruleset`.
    pub fn of(ruleset: &Ruleset) -> Self {
        let mut ledger = Self::default();
        let mut scratch = Changes::default();
        for bundle in ruleset.bundles.values() {
            ledger.add(bundle, &mut scratch);
        }
        ledger
    }

    pub fn element_count(&self) -> usize {
        self.elements.len()
    }

    pub fn chain_count(&self) -> usize {
        self.chains.len()
    }

    pub fn has_chain(&self, chain: SharedChain) -> bool {
        self.chains.contains_key(&chain)
    }

    pub fn value(&self, set: SetName, key: &ElemKey) -> Option<Option<ElemValue>> {
        self.elements.get(&(set, key.clone())).map(|h| h.value)
    }

    pub fn chains(&self) -> impl Iterator<Item = SharedChain> + '_ {
        self.chains.keys().copied()
    }

    fn remove_elements<'a>(&mut self, elements: impl Iterator<Item = &'a Element>, changes: &mut Changes) {
        for e in elements {
            let slot = (e.set, e.key.clone());
            let Some(held) = self.elements.get_mut(&slot) else {
                continue;
            };
            changes.touch(&slot, Some(held.value));
            if held.value != e.value {
                // Was a conflicting second owner: the kernel keeps the first value.
                changes.conflict_released = true;
            }
            held.owners = held.owners.saturating_sub(1);
            if held.owners == 0 {
                self.elements.remove(&slot);
            }
        }
    }

    fn add_elements<'a>(&mut self, elements: impl Iterator<Item = &'a Element>, changes: &mut Changes) {
        for e in elements {
            let slot = (e.set, e.key.clone());
            match self.elements.get_mut(&slot) {
                Some(held) => {
                    changes.touch(&slot, Some(held.value));
                    if held.value != e.value {
                        self.conflicts += 1;
                        tracing::warn!(
                            "two Service ports claim the same {} element; the first one keeps it",
                            e.set
                        );
                    }
                    held.owners += 1;
                }
                None => {
                    changes.touch(&slot, None);
                    self.elements.insert(
                        slot,
                        Held {
                            value: e.value,
                            owners: 1,
                        },
                    );
                }
            }
        }
    }

    fn add(&mut self, bundle: &Bundle, changes: &mut Changes) {
        self.add_elements(bundle.elements.iter(), changes);
        for chain in &bundle.chains {
            changes.touch_chain(*chain, self.chains.contains_key(chain));
            *self.chains.entry(*chain).or_default() += 1;
        }
    }

    fn remove_chains<'a>(&mut self, chains: impl Iterator<Item = &'a SharedChain>, changes: &mut Changes) {
        for chain in chains {
            changes.touch_chain(*chain, self.chains.contains_key(chain));
            if let Some(n) = self.chains.get_mut(chain) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.chains.remove(chain);
                }
            }
        }
    }

    /// Replaces the `old` bundles of some owners by their `new` ones; returns the batch that
    /// takes the kernel from the old to the new state.
    pub fn update(
        &mut self,
        family: IpFamily,
        replaced: &[(Option<&Bundle>, Option<&Bundle>)],
        opts: &NftablesOptions,
    ) -> (Batch, bool) {
        let mut changes = Changes::default();
        // Removals of every owner first, then additions: an element moving between owners
        // in one sync is then a no-op, not a delete.
        for (old, new) in replaced {
            let (removed, _) = diff(*old, *new);
            self.remove_elements(removed.into_iter(), &mut changes);
        }
        for (old, new) in replaced {
            let (_, added) = diff(*old, *new);
            self.add_elements(added.into_iter(), &mut changes);
        }
        for (old, new) in replaced {
            if let Some(new) = new {
                for chain in &new.chains {
                    changes.touch_chain(*chain, self.chains.contains_key(chain));
                    *self.chains.entry(*chain).or_default() += 1;
                }
            }
            if let Some(old) = old {
                self.remove_chains(old.chains.iter(), &mut changes);
            }
        }
        let conflict = changes.conflict_released;
        (changes.into_batch(self, family, opts), conflict)
    }
}

/// Elements of `old` not in `new`, and of `new` not in `old` (both sorted).
fn diff<'a>(old: Option<&'a Bundle>, new: Option<&'a Bundle>) -> (Vec<&'a Element>, Vec<&'a Element>) {
    let empty: &[Element] = &[];
    let old = old.map_or(empty, |b| b.elements.as_slice());
    let new = new.map_or(empty, |b| b.elements.as_slice());
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

/// What a sync touched: the state of each touched element and chain before it.
#[derive(Default)]
struct Changes {
    elements: HashMap<(SetName, ElemKey), Option<Option<ElemValue>>>,
    chains: HashMap<SharedChain, bool>,
    conflict_released: bool,
}

impl Changes {
    fn touch(&mut self, slot: &(SetName, ElemKey), before: Option<Option<ElemValue>>) {
        self.elements.entry(slot.clone()).or_insert(before);
    }

    fn touch_chain(&mut self, chain: SharedChain, existed: bool) {
        self.chains.entry(chain).or_insert(existed);
    }

    fn into_batch(self, ledger: &Ledger, family: IpFamily, opts: &NftablesOptions) -> Batch {
        let mut deletes: BTreeMap<SetName, Vec<ElemKey>> = BTreeMap::new();
        let mut adds: BTreeMap<SetName, Vec<(ElemKey, Option<ElemValue>)>> = BTreeMap::new();
        for ((set, key), before) in self.elements {
            let after = ledger.elements.get(&(set, key.clone())).map(|h| h.value);
            if before == after {
                continue;
            }
            if before.is_some() {
                deletes.entry(set).or_default().push(key.clone());
            }
            if let Some(value) = after {
                adds.entry(set).or_default().push((key, value));
            }
        }
        let created = creation_order(
            self.chains
                .iter()
                .filter(|(c, existed)| !**existed && ledger.chains.contains_key(c))
                .map(|(c, _)| *c),
        );
        let mut gone = creation_order(
            self.chains
                .iter()
                .filter(|(c, existed)| **existed && !ledger.chains.contains_key(c))
                .map(|(c, _)| *c),
        );
        gone.reverse();

        let mut batch = Batch::new(family);
        for chain in created {
            add_chain_ops(&mut batch.ops, chain, opts);
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
        for chain in gone {
            batch.ops.push(Op::DeleteChain(ChainId::Shared(chain)));
        }
        batch
    }
}

// === text ===

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
                let kind = match set {
                    SetName::ServiceIps
                    | SetName::ServiceNodePorts
                    | SetName::NoEndpointServices
                    | SetName::NoEndpointNodePorts
                    | SetName::Endpoints(_) => "map",
                    _ => "set",
                };
                let body = set_body(batch.family, *set, affinity_capacity);
                let _ = writeln!(out, "add {kind} {table} {set} {{ {body} }}");
            }
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
            Op::AddElements(set, elements) => {
                for chunk in elements.chunks(256) {
                    let _ = write!(out, "add element {table} {set} {{ ");
                    for (i, (key, value)) in chunk.iter().enumerate() {
                        if i > 0 {
                            out.push_str(", ");
                        }
                        element_text(&mut out, key, value.as_ref());
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
                        element_text(&mut out, key, None);
                    }
                    out.push_str(" }\n");
                }
            }
        }
    }
    out
}
