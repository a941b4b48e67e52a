//! Generation: the desired state, the options and the node's addresses in; the fixed part
//! of the table and one [`Bundle`] per Service port (plus one for the node) out.
//!
//! A bundle is everything one Service port adds to the kernel: elements of the shared
//! sets and maps, and the shared chains its entries lead to (an entry is an element of
//! the set of its target chain, `<chain>-ips` or `<chain>-nodeports`; the dispatch chains
//! hold one rule per such set in use, see [`dispatch_rules`]). Bundles are independent of each
//! other, so a sync recomputes only the bundles of changed Services and sends the
//! difference ([`crate::batch`]). The per-port decisions (which endpoints, REJECT or DROP)
//! come from kpr-state's `PortPlan`, exactly as the iptables mode takes them.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use kpr_host::{LocalDetector, NodePortAddresses, NodePortTargets};
use kpr_model::{Endpoint, IpFamily, Protocol, ServicePortName};
use kpr_state::{DesiredState, PortPlan, Unreachable};

use kpr_naming::text::Comment;

use crate::model::{ElemKey, ElemValue, Element, Key, Match, Rule, Slot, Stmt, element_comment};
use crate::names::{
    ChainId, Choice, EndpointMap, EntryKind, FixedChain, KeySpace, PROTOCOLS, Refusal, SetName, SharedChain,
};
use crate::options::NftablesOptions;
use crate::slots::{self, SlotOrder};

/// Who put an element or a shared chain into the table.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    /// Node-level elements: the Service CIDRs and the addresses accepting NodePorts.
    Node,
    Port(ServicePortName),
}

/// The endpoints of one entry in one key space, by slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupKey {
    Address(IpAddr, u16),
    Port(u16),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotGroup {
    pub map: EndpointMap,
    pub key: GroupKey,
    /// The entry's ClientIP affinity timeout: with the slot count, names the endpoint map
    /// the slots are written to ([`SlotGroup::choice`]).
    pub affinity: Option<u32>,
}

impl SlotGroup {
    /// The choice (so the endpoint map) of this group when it has `count` slots.
    pub fn choice(&self, count: usize) -> Choice {
        Choice {
            map: self.map,
            count: u16::try_from(count).unwrap_or(u16::MAX),
            affinity: self.affinity,
        }
    }

    /// Whether `other` is this group, whatever its affinity: slots are kept across an
    /// affinity change as across a count change.
    fn same_key(&self, other: &SlotGroup) -> bool {
        self.map == other.map && self.key == other.key
    }
}

/// A destination one Service port owns: its entry and everything keyed by it (endpoint
/// slots, firewall elements) are written by that port alone. Two ports claiming the same
/// destination (e.g. one external IP and port in two Services) is user error; the first in
/// name order keeps it, as a full sync decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dest {
    Address(IpAddr, Protocol, u16),
    NodePort(Protocol, u16),
}

/// What one owner contributes to the table, kept compact: endpoint-map elements are stored
/// as slot orders and expanded only when a sync needs them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bundle {
    /// Elements only this owner writes, other than endpoint slots and the shared
    /// `cluster-ips`/`hairpin` elements; sorted.
    pub entries: Vec<Element>,
    /// The slot order of each endpoint group (see the `slots` module).
    pub slots: Vec<(SlotGroup, SlotOrder)>,
    /// Shared chains used, each once (including the chains they jump to).
    pub chains: Box<[SharedChain]>,
    /// The cluster IP (an element shared by every port of the Service).
    pub cluster_ip: Option<IpAddr>,
    /// Destinations this owner holds.
    pub dests: Vec<Dest>,
    /// Some destination it wanted is held by another owner.
    pub contested: bool,
    /// internalTrafficPolicy Local without a local endpoint (a metric).
    pub no_local_internal: bool,
    /// externalTrafficPolicy Local without a local endpoint (a metric).
    pub no_local_external: bool,
}

impl Bundle {
    pub fn slots_of(&self, group: &SlotGroup) -> Option<&SlotOrder> {
        self.slots
            .iter()
            .find(|(g, _)| g.same_key(group))
            .map(|(_, eps)| eps)
    }

    /// The elements only this owner writes (entries and endpoint slots), sorted.
    pub fn owned_elements(&self) -> Vec<Element> {
        let mut out = self.entries.clone();
        for (group, endpoints) in &self.slots {
            for (slot, ep) in (0u16..).zip(endpoints.iter()) {
                let key = match group.key {
                    GroupKey::Address(addr, port) => ElemKey::AddrPortSlot(addr, port, slot),
                    GroupKey::Port(port) => ElemKey::PortSlot(port, slot),
                };
                out.push(Element::map(
                    group.choice(endpoints.len()).endpoints(),
                    key,
                    ElemValue::Endpoint(ep),
                ));
            }
        }
        out.sort();
        out
    }

    /// Endpoint addresses (each once): a pod reaching itself through them is masqueraded.
    pub fn hairpin_ips(&self) -> BTreeSet<IpAddr> {
        self.slots
            .iter()
            .flat_map(|(_, eps)| eps.iter().map(|ep| ep.ip()))
            .collect()
    }

    /// The entry sets (`<chain>-ips`, `<chain>-nodeports`) this owner's entries are in.
    pub fn entry_sets(&self) -> BTreeSet<SetName> {
        self.entries
            .iter()
            .map(|e| e.set)
            .filter(|set| matches!(set, SetName::Entries { .. }))
            .collect()
    }

    /// Every element this owner needs in the table, shared ones included.
    pub fn all_elements(&self) -> Vec<Element> {
        let mut out = self.owned_elements();
        out.extend(
            self.cluster_ip
                .map(|ip| Element::new(SetName::ClusterIps, ElemKey::Addr(ip))),
        );
        out.extend(
            self.hairpin_ips()
                .into_iter()
                .map(|ip| Element::new(SetName::Hairpin, ElemKey::AddrPair(ip, ip))),
        );
        out
    }
}

/// The whole table as a full sync writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ruleset {
    pub family: IpFamily,
    /// The fixed chains, the dispatch chains with a rule per entry set in use.
    pub fixed: Vec<(FixedChain, Vec<Rule>)>,
    /// The declared sets, then the entry sets in use.
    pub sets: Vec<SetName>,
    pub bundles: BTreeMap<Owner, Bundle>,
}

/// What generation needs besides the desired state.
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    pub opts: &'a NftablesOptions,
    /// This host's addresses of the family (used with `--nodeport-addresses`).
    pub local_addresses: &'a [IpAddr],
    /// Upstream's node IP: decides whether source ranges admit the node itself.
    pub node_ip: IpAddr,
    /// The desired state's Service CIDRs (from ServiceCIDR objects), beside the options'.
    pub state_service_cidrs: &'a [IpNet],
}

impl<'a> Context<'a> {
    pub fn new(opts: &'a NftablesOptions, state: &'a DesiredState, local_addresses: &'a [IpAddr]) -> Self {
        Self {
            opts,
            local_addresses,
            node_ip: opts.primary_node_ip(&state.node.addresses),
            state_service_cidrs: &state.service_cidrs,
        }
    }
}

/// The complete table for `state`, with endpoints in their given order (no history).
/// Ports are taken in name order, so the first claims a contested destination.
pub fn build(state: &DesiredState, opts: &NftablesOptions, local_addresses: &[IpAddr]) -> Ruleset {
    build_from(state, opts, local_addresses, None)
}

/// Like [`build`], keeping each port's endpoints in the slots `history` gave them.
pub fn build_from(
    state: &DesiredState,
    opts: &NftablesOptions,
    local_addresses: &[IpAddr],
    history: Option<&HashMap<Owner, Bundle>>,
) -> Ruleset {
    let ctx = Context::new(opts, state, local_addresses);
    let mut bundles = BTreeMap::new();
    bundles.insert(Owner::Node, node_bundle(&ctx));
    let mut claimed: HashSet<Dest> = HashSet::new();
    for port in state.ports() {
        let owner = Owner::Port(port.name.clone());
        let previous = history.and_then(|h| h.get(&owner));
        let bundle = port_bundle(&state.plan(port), &ctx, previous, &|dest| claimed.contains(dest));
        claimed.extend(bundle.dests.iter().copied());
        bundles.insert(owner, bundle);
    }
    let entry_sets: BTreeSet<SetName> = bundles.values().flat_map(Bundle::entry_sets).collect();
    let mut fixed = fixed_chains(opts);
    for (chain, rules) in &mut fixed {
        if let Some(kind) = EntryKind::ALL.into_iter().find(|k| k.dispatch_chain() == *chain) {
            *rules = dispatch_rules(kind, &entry_sets, opts);
        }
    }
    let maps: BTreeSet<SetName> = bundles
        .values()
        .flat_map(|b| b.chains.iter().filter_map(|c| c.owned_map()))
        .collect();
    let mut sets = declared_sets();
    sets.extend(maps);
    sets.extend(entry_sets);
    Ruleset {
        family: opts.family,
        fixed,
        sets,
        bundles,
    }
}

/// Every set whatever the Services, declared by every full sync (empty ones cost nothing
/// per Service). The entry sets come and go with their target chains, the endpoint maps
/// with the chains that own them ([`SharedChain::owned_map`]).
pub fn declared_sets() -> Vec<SetName> {
    let mut sets = vec![SetName::ClusterIps, SetName::ServiceCidrs, SetName::NodePortIps];
    for kind in EntryKind::ALL {
        for refusal in Refusal::ALL {
            sets.push(SetName::NoEndpoint { kind, refusal });
        }
    }
    sets.extend([SetName::FirewallIps, SetName::FirewallAllow, SetName::Hairpin]);
    for proto in PROTOCOLS {
        for space in KeySpace::ALL {
            sets.push(SetName::Affinity(EndpointMap { space, proto }));
        }
    }
    sets
}

// === fixed chains ===

/// "Comes from a pod" (negated: "does not"), or `None` without local detection.
pub fn pod_match(opts: &NftablesOptions, negate: bool) -> Option<Match> {
    match &opts.local_detector {
        LocalDetector::None => None,
        LocalDetector::ClusterCidr(_) => opts.local_detector.cidr(opts.family).map(|net| Match::SourceNet {
            net: net.trunc(),
            negate,
        }),
        LocalDetector::BridgeInterface(name) => Some(Match::InputInterface {
            name: name.clone(),
            prefix: false,
            negate,
        }),
        LocalDetector::InterfaceNamePrefix(name) => Some(Match::InputInterface {
            name: name.clone(),
            prefix: true,
            negate,
        }),
    }
}

/// "Addressed to a node address that accepts NodePorts".
fn nodeport_destination(opts: &NftablesOptions) -> Vec<Match> {
    match opts.nodeport_addresses.targets(opts.family, &[]) {
        NodePortTargets::AllLocal => vec![Match::DestIsLocal, Match::DestNotNet(opts.loopback_net())],
        NodePortTargets::Ips(_) => vec![Match::DestIn(SetName::NodePortIps)],
    }
}

fn jump(chain: FixedChain) -> Stmt {
    Stmt::Jump(ChainId::Fixed(chain))
}

/// The fixed chains and their rules, upstream's nftables layout (hooks and priorities).
pub fn fixed_chains(opts: &NftablesOptions) -> Vec<(FixedChain, Vec<Rule>)> {
    use FixedChain as F;
    let new = || vec![Match::CtStateNew];
    let mark = opts.mark();
    FixedChain::ALL
        .iter()
        .map(|&chain| {
            let rules = match chain {
                F::FilterPreroutingPreDnat | F::FilterOutputPreDnat => {
                    vec![Rule::new(new(), jump(F::FirewallCheck))]
                }
                F::FilterInput => vec![
                    Rule::new(new(), jump(F::NodePortEndpointsCheck)),
                    Rule::new(new(), jump(F::ServiceEndpointsCheck)),
                ],
                F::FilterForward => {
                    let mut rules = Vec::new();
                    // INVALID packets would reach pods un-NATed and reset connections; with
                    // tcp_be_liberal the kernel marks only out-of-window RSTs INVALID.
                    if !opts.conntrack_tcp_be_liberal {
                        rules.push(Rule::new(vec![Match::CtStateInvalid], Stmt::Drop));
                    }
                    rules.push(Rule::new(new(), jump(F::ServiceEndpointsCheck)));
                    rules.push(Rule::new(new(), jump(F::ClusterIpsCheck)));
                    rules
                }
                F::FilterOutput => vec![
                    Rule::new(new(), jump(F::ServiceEndpointsCheck)),
                    Rule::new(new(), jump(F::ClusterIpsCheck)),
                ],
                F::NatPrerouting | F::NatOutput => vec![Rule::always(jump(F::Services))],
                F::NatPostrouting => vec![
                    Rule::always(jump(F::Masquerading)),
                    // A pod reaching itself through a Service: without SNAT its reply would
                    // bypass the DNAT's reverse translation.
                    Rule::new(
                        vec![
                            Match::CtStatusDnat,
                            Match::Lookup {
                                key: Key::SourceDest,
                                set: SetName::Hairpin,
                                negate: false,
                            },
                        ],
                        Stmt::Masquerade,
                    ),
                ],
                F::Services => services_rules(opts),
                F::MarkForMasquerade => vec![Rule::always(Stmt::MarkOr(mark))],
                F::Masquerading => vec![
                    Rule::new(vec![Match::MarkClear(mark)], Stmt::Return),
                    // Cleared so a packet that traverses the stack again is not SNATed twice.
                    Rule::always(Stmt::MarkXor(mark)),
                    Rule::always(Stmt::Masquerade),
                ],
                // Rewritten by each sync with the entry sets in use (see `dispatch_rules`).
                F::ServiceDispatch => dispatch_rules(EntryKind::Address, &BTreeSet::new(), opts),
                F::NodePortDispatch => dispatch_rules(EntryKind::NodePort, &BTreeSet::new(), opts),
                F::ServiceEndpointsCheck => refusal_rules(EntryKind::Address, Vec::new()),
                F::NodePortEndpointsCheck => refusal_rules(EntryKind::NodePort, nodeport_destination(opts)),
                F::FirewallCheck => vec![Rule::new(
                    vec![
                        Match::Lookup {
                            key: Key::DestProtoPort,
                            set: SetName::FirewallIps,
                            negate: false,
                        },
                        Match::Lookup {
                            key: Key::DestProtoPortSource,
                            set: SetName::FirewallAllow,
                            negate: true,
                        },
                    ],
                    Stmt::Drop,
                )],
                F::ClusterIpsCheck => vec![
                    // Still addressed to a cluster IP after DNAT: no Service has this port.
                    Rule::new(vec![Match::DestIn(SetName::ClusterIps)], Stmt::Reject),
                    Rule::new(vec![Match::DestIn(SetName::ServiceCidrs)], Stmt::Drop),
                ],
                F::RejectChain => vec![Rule::always(Stmt::Reject)],
            };
            (chain, rules)
        })
        .collect()
}

/// The key of an entry of `kind`, as the packet spells it.
fn entry_key(kind: EntryKind) -> Key {
    match kind {
        EntryKind::Address => Key::DestProtoPort,
        EntryKind::NodePort => Key::ProtoPort,
    }
}

fn entry_lookup(kind: EntryKind, set: SetName) -> Match {
    Match::Lookup {
        key: entry_key(kind),
        set,
        negate: false,
    }
}

/// The `*-endpoints-check` rules: destinations of `kind` without usable endpoints are
/// rejected or dropped (the set lookup first: it is cheaper than `fib`).
fn refusal_rules(kind: EntryKind, conditions: Vec<Match>) -> Vec<Rule> {
    Refusal::ALL
        .into_iter()
        .map(|refusal| {
            let mut matches = vec![entry_lookup(kind, SetName::NoEndpoint { kind, refusal })];
            matches.extend(conditions.iter().cloned());
            let stmt = match refusal {
                Refusal::Reject => Stmt::Goto(ChainId::Fixed(FixedChain::RejectChain)),
                Refusal::Drop => Stmt::Drop,
            };
            Rule::new(matches, stmt)
        })
        .collect()
}

/// The rules of `kind`'s dispatch chain: one per entry set of that kind in `entry_sets`
/// (`<key> @<chain>-<suffix> goto <chain>`), in name order (entries are disjoint, so any
/// order finds the same one). `service-dispatch` ends by handing NodePort candidates to
/// `nodeport-dispatch`: `services` goes (not jumps) here, so a target chain falling
/// through returns to the base chain exactly as the verdict maps it replaces did.
pub fn dispatch_rules(kind: EntryKind, entry_sets: &BTreeSet<SetName>, opts: &NftablesOptions) -> Vec<Rule> {
    let mut rules: Vec<Rule> = entry_sets
        .iter()
        .filter_map(|set| match set {
            SetName::Entries { kind: k, target } if *k == kind => Some(Rule::new(
                vec![entry_lookup(kind, *set)],
                Stmt::Goto(ChainId::Shared(*target)),
            )),
            _ => None,
        })
        .collect();
    if kind == EntryKind::Address {
        rules.push(Rule::new(
            nodeport_destination(opts),
            Stmt::Goto(ChainId::Fixed(FixedChain::NodePortDispatch)),
        ));
    }
    rules
}

fn services_rules(opts: &NftablesOptions) -> Vec<Rule> {
    let mut rules = Vec::new();
    // Cluster-IP traffic from outside the pod network is masqueraded so replies come back
    // through this node (or all of it, with masqueradeAll). Marking traffic that is then
    // rejected is harmless: the mark only matters to packets that leave.
    let to_cluster_ip = Match::DestIn(SetName::ClusterIps);
    if opts.masquerade_all {
        rules.push(Rule::new(
            vec![to_cluster_ip],
            jump(FixedChain::MarkForMasquerade),
        ));
    } else if let Some(not_pod) = pod_match(opts, true) {
        rules.push(Rule::new(
            vec![to_cluster_ip, not_pod],
            jump(FixedChain::MarkForMasquerade),
        ));
    }
    rules.push(Rule::always(Stmt::Goto(ChainId::Fixed(
        FixedChain::ServiceDispatch,
    ))));
    rules
}

// === shared chains ===

/// The rules of a shared chain: a function of its name and the options only.
pub fn shared_rules(chain: SharedChain, opts: &NftablesOptions) -> Vec<Rule> {
    let goto = |c: SharedChain| Stmt::Goto(ChainId::Shared(c));
    match chain {
        SharedChain::Pick { map, count } => {
            let choice = Choice {
                map,
                count,
                affinity: None,
            };
            vec![Rule::always(Stmt::DnatMap {
                choice,
                slot: Slot::Random(count),
            })]
        }
        SharedChain::Slot {
            map,
            count,
            timeout,
            slot,
        } => vec![
            Rule::always(Stmt::RememberSlot { map, slot, timeout }),
            Rule::always(Stmt::DnatMap {
                choice: Choice {
                    map,
                    count,
                    affinity: Some(timeout),
                },
                slot: Slot::Fixed(slot),
            }),
        ],
        SharedChain::Sticky { map, count, timeout } => {
            let slot_chain = |slot| SharedChain::Slot {
                map,
                count,
                timeout,
                slot,
            };
            let mut rules: Vec<Rule> = (0..count)
                .map(|slot| {
                    Rule::new(
                        vec![Match::Lookup {
                            key: Key::AffinityEntry { map, slot },
                            set: SetName::Affinity(map),
                            negate: false,
                        }],
                        goto(slot_chain(slot)),
                    )
                })
                .collect();
            let targets = (0..count).map(|slot| ChainId::Shared(slot_chain(slot))).collect();
            rules.push(Rule::always(Stmt::RandomGoto(targets)));
            rules
        }
        SharedChain::Masquerade { choice } => vec![
            Rule::always(jump(FixedChain::MarkForMasquerade)),
            Rule::always(goto(choice.chain())),
        ],
        SharedChain::LocalPolicy { local, shortcut } => {
            let mut rules = Vec::new();
            if let Some(shortcut) = shortcut {
                // Pods and the node itself reach every endpoint, as if they had gone out to
                // the load balancer and come back; the node's traffic has the external
                // address as source, so it must be masqueraded.
                if let Some(pod) = pod_match(opts, false) {
                    rules.push(Rule::new(vec![pod], goto(shortcut.chain())));
                }
                rules.push(Rule::new(
                    vec![Match::SourceIsLocal],
                    jump(FixedChain::MarkForMasquerade),
                ));
                rules.push(Rule::new(vec![Match::SourceIsLocal], goto(shortcut.chain())));
            }
            if let Some(local) = local {
                rules.push(Rule::always(goto(local.chain())));
            }
            rules
        }
    }
}

// === node-level elements ===

pub fn node_bundle(ctx: &Context<'_>) -> Bundle {
    let opts = ctx.opts;
    let state_cidrs = ctx
        .state_service_cidrs
        .iter()
        .filter(|net| opts.family.matches(&net.addr()))
        .map(IpNet::trunc);
    let cidrs: Vec<IpNet> = opts.service_cidrs().chain(state_cidrs).collect();
    let mut elements: Vec<Element> = outermost(&cidrs)
        .map(|net| Element::new(SetName::ServiceCidrs, ElemKey::Net(net)))
        .collect();
    if let NodePortTargets::Ips(ips) = opts.nodeport_addresses.targets(opts.family, ctx.local_addresses) {
        let loopback = opts.loopback_net();
        elements.extend(
            ips.into_iter()
                .filter(|ip| !loopback.contains(ip))
                .map(|ip| Element::new(SetName::NodePortIps, ElemKey::Addr(ip))),
        );
    }
    elements.sort();
    elements.dedup();
    Bundle {
        entries: elements,
        ..Bundle::default()
    }
}

/// The networks of `nets` that no other one contains. ServiceCIDRs may overlap (the API
/// server allows it, e.g. while a range is being widened), and an interval set refuses an
/// element that overlaps another ("conflicting intervals"), which would fail every sync.
/// Two prefixes either nest or are disjoint, so dropping the contained ones is exact.
fn outermost(nets: &[IpNet]) -> impl Iterator<Item = IpNet> + '_ {
    nets.iter()
        .enumerate()
        .filter(|&(i, net)| {
            !nets
                .iter()
                .enumerate()
                .any(|(j, other)| other.contains(net) && (other != net || j < i))
        })
        .map(|(_, net)| *net)
}

/// Whether the node's addresses matter to generation (to re-read them before a sync).
pub fn needs_local_addresses(opts: &NftablesOptions) -> bool {
    !matches!(opts.nodeport_addresses, NodePortAddresses::All)
        && opts.nodeport_addresses.needs_local_addresses(opts.family)
}

// === per service port ===

/// The set of destinations of `kind` refused as `u` says.
fn refused(kind: EntryKind, u: Unreachable) -> SetName {
    let refusal = match u {
        Unreachable::Reject => Refusal::Reject,
        Unreachable::Drop => Refusal::Drop,
    };
    SetName::NoEndpoint { kind, refusal }
}

/// The set of the entries of `kind` going to `target`.
fn entries_to(kind: EntryKind, target: SharedChain) -> SetName {
    SetName::Entries { kind, target }
}

struct PortBuilder<'h> {
    proto: Protocol,
    port: u16,
    affinity: Option<u32>,
    history: Option<&'h Bundle>,
    taken: &'h dyn Fn(&Dest) -> bool,
    /// `ns/svc:port`, on every entry element.
    comment: Option<Comment>,
    out: Bundle,
    chains: BTreeSet<SharedChain>,
}

impl PortBuilder<'_> {
    fn element(&mut self, set: SetName, key: ElemKey) {
        self.out.entries.push(Element::new(set, key));
    }

    /// An entry element (an entry or its `no-endpoint-*` twin), named after the port.
    fn entry(&mut self, set: SetName, key: ElemKey) {
        let element = Element::new(set, key).with_comment(self.comment.clone());
        self.out.entries.push(element);
    }

    /// Takes `dest` for this port, unless another port (or this one already) holds it.
    fn claim(&mut self, dest: Dest) -> bool {
        if (self.taken)(&dest) || self.out.dests.contains(&dest) {
            tracing::warn!(
                ?dest,
                "two Service ports claim one destination; the first keeps it"
            );
            self.out.contested = true;
            return false;
        }
        self.out.dests.push(dest);
        true
    }

    fn use_chain(&mut self, chain: SharedChain) {
        if self.chains.insert(chain) {
            for target in chain.targets() {
                self.use_chain(target);
            }
        }
    }

    /// Puts `endpoints` into the slots of `key` in `space`'s map; returns how to choose.
    fn endpoints(&mut self, space: KeySpace, key: GroupKey, endpoints: &[&Endpoint]) -> Option<Choice> {
        let map = EndpointMap {
            space,
            proto: self.proto,
        };
        let group = SlotGroup {
            map,
            key,
            affinity: self.affinity,
        };
        let mut current: Vec<SocketAddr> = endpoints.iter().map(|ep| ep.addr).collect();
        current.truncate(usize::from(u16::MAX));
        if current.is_empty() {
            return None;
        }
        let previous = self
            .history
            .and_then(|h| h.slots_of(&group))
            .map(SlotOrder::to_vec);
        let order = slots::assign(previous.as_deref(), &current);
        let count = u16::try_from(order.len()).unwrap_or(u16::MAX);
        self.out.slots.push((group, SlotOrder::new(&order)));
        let choice = Choice {
            map,
            count,
            affinity: self.affinity,
        };
        self.use_chain(choice.chain());
        Some(choice)
    }

    /// The entry chain for external traffic (NodePort, external IP, load-balancer IP).
    fn external_entry(&mut self, plan: &PortPlan<'_>, space: KeySpace, key: GroupKey) -> Option<SharedChain> {
        let chain = if !plan.port.external_policy_local {
            let choice = self.endpoints(space, key, &plan.endpoints.cluster)?;
            SharedChain::Masquerade { choice }
        } else {
            let local = if plan.external_unreachable.is_none() {
                self.endpoints(space, key, &plan.endpoints.local)
            } else {
                None
            };
            let shortcut = if plan.uses_cluster_chain {
                self.endpoints(space.shortcut(), key, &plan.endpoints.cluster)
            } else {
                None
            };
            if local.is_none() && shortcut.is_none() {
                return None;
            }
            SharedChain::LocalPolicy { local, shortcut }
        };
        self.use_chain(chain);
        Some(chain)
    }
}

/// Everything one service port puts into the table. `history` is the port's bundle from
/// the previous sync: endpoints keep their slots.
/// `taken` says which destinations other ports hold.
pub fn port_bundle(
    plan: &PortPlan<'_>,
    ctx: &Context<'_>,
    history: Option<&Bundle>,
    taken: &dyn Fn(&Dest) -> bool,
) -> Bundle {
    let port = plan.port;
    let proto = port.name.protocol;
    let mut b = PortBuilder {
        proto,
        port: port.port,
        affinity: port.session_affinity_seconds,
        history,
        taken,
        comment: element_comment(&port.name.to_string()),
        out: Bundle::default(),
        chains: BTreeSet::new(),
    };
    if plan.has_endpoints() {
        b.out.no_local_internal = plan.internal_unreachable == Some(Unreachable::Drop);
        b.out.no_local_external = plan.external_unreachable == Some(Unreachable::Drop);
    }
    let vip = port.cluster_ip;
    b.out.cluster_ip = Some(vip);
    let port_number = port.port;
    let dest = |addr| ElemKey::AddrProtoPort(addr, proto, port_number);
    let claimed_vip = b.claim(Dest::Address(vip, proto, port_number));
    match plan.internal_unreachable {
        _ if !claimed_vip => {}
        None => {
            let endpoints = if port.internal_policy_local {
                &plan.endpoints.local
            } else {
                &plan.endpoints.cluster
            };
            if let Some(choice) = b.endpoints(KeySpace::Address, GroupKey::Address(vip, port.port), endpoints)
            {
                b.entry(entries_to(EntryKind::Address, choice.chain()), dest(vip));
            }
        }
        Some(u) => b.entry(refused(EntryKind::Address, u), dest(vip)),
    }
    for &addr in port.external_ips.iter().chain(&port.load_balancer_ips) {
        if !b.claim(Dest::Address(addr, proto, port_number)) {
            continue;
        }
        if plan.uses_external_chain
            && let Some(entry) = b.external_entry(plan, KeySpace::Address, GroupKey::Address(addr, port.port))
        {
            b.entry(entries_to(EntryKind::Address, entry), dest(addr));
        }
        if let Some(u) = plan.external_unreachable {
            b.entry(refused(EntryKind::Address, u), dest(addr));
        }
    }
    if plan.uses_firewall_chain {
        firewall(&mut b, plan, ctx);
    }
    if let Some(node_port) = port.node_port.filter(|np| b.claim(Dest::NodePort(proto, *np))) {
        let key = ElemKey::ProtoPort(proto, node_port);
        if plan.uses_external_chain
            && let Some(entry) = b.external_entry(plan, KeySpace::NodePort, GroupKey::Port(node_port))
        {
            b.entry(entries_to(EntryKind::NodePort, entry), key.clone());
        }
        if let Some(u) = plan.external_unreachable {
            b.entry(refused(EntryKind::NodePort, u), key);
        }
    }
    b.out.entries.sort();
    b.out.entries.dedup();
    // A bundle is kept until its Service changes: no spare capacity from growing the lists.
    b.out.entries.shrink_to_fit();
    b.out.dests.shrink_to_fit();
    b.out.slots.shrink_to_fit();
    b.out.chains = b.chains.into_iter().collect();
    b.out
}

/// loadBalancerSourceRanges: the load-balancer destinations and the sources they accept;
/// `firewall-check` drops the rest before DNAT. NodePorts are not subject to them.
fn firewall(b: &mut PortBuilder<'_>, plan: &PortPlan<'_>, ctx: &Context<'_>) {
    let port = plan.port;
    let family = ctx.opts.family;
    let ranges: Vec<IpNet> = port
        .load_balancer_source_ranges
        .iter()
        .filter(|range| family.matches(&range.addr()))
        .map(IpNet::trunc)
        .collect();
    // A VIP that is also a local address loops node-originated requests back with the VIP
    // as source: allowed when the ranges admit this node's primary IP, as upstream.
    let node_allowed = ranges.iter().any(|range| range.contains(&ctx.node_ip));
    for &lb in &port.load_balancer_ips {
        if !b.out.dests.contains(&Dest::Address(lb, b.proto, b.port)) {
            continue;
        }
        b.element(SetName::FirewallIps, ElemKey::AddrProtoPort(lb, b.proto, b.port));
        let sources = ranges.iter().copied().chain(
            port.load_balancer_ips
                .iter()
                .filter(|_| node_allowed)
                .map(|ip| IpNet::from(*ip)),
        );
        for source in sources {
            b.element(
                SetName::FirewallAllow,
                ElemKey::AddrProtoPortNet(lb, b.proto, b.port, source),
            );
        }
    }
}
