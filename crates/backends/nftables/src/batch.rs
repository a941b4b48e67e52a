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

mod ledger;
use ledger::IpCounts;
pub use ledger::Ledger;

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
