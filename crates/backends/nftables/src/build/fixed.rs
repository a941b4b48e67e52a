//! The fixed chains, upstream's nftables layout: the same for every Service, so their
//! rules depend on the options only, except the dispatch chains, which hold one rule per
//! entry set in use and are rewritten when a target chain comes or goes.

use std::collections::BTreeSet;

use kpr_host::{LocalDetector, NodePortTargets};

use crate::model::{Key, Match, Rule, Stmt};
use crate::names::{ChainId, EntryKind, FixedChain, Refusal, RejectCounter, SetName};
use crate::options::NftablesOptions;

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

pub(super) fn jump(chain: FixedChain) -> Stmt {
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
                F::NodePortEndpointsCheck => {
                    let mut rules = refusal_rules(EntryKind::NodePort, nodeport_destination(opts));
                    rules.extend(localhost_rules(opts));
                    rules
                }
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

/// With localhost NodePorts on: a new connection to a loopback address at a NodePort,
/// of a protocol the localhost proxy does not serve, is counted in that protocol's named
/// counter and rejected (the NodePort rules never match loopback destinations, so it would
/// otherwise meet the kernel's own refusal, uncounted).
fn localhost_rules(opts: &NftablesOptions) -> Vec<Rule> {
    opts.localhost_nodeports
        .rejected()
        .iter()
        .map(|&proto| {
            Rule::new(
                vec![
                    Match::DestNet(opts.loopback_net()),
                    Match::L4Proto(proto),
                    entry_lookup(EntryKind::NodePort, SetName::LocalhostNodePorts),
                ],
                Stmt::CountReject(RejectCounter(proto)),
            )
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
