//! Start-up check: does this kernel and nft take everything the nftables mode writes?
//!
//! Each step adds one kind of object to a probe batch that the kernel validates and then
//! throws away (`Transport::check`, `nft --check`): nothing is committed, no table is
//! touched. Steps are cumulative, so the first one refused names the missing feature in
//! the start-up error, instead of a first sync failing on line 4711 of a batch.

use kpr_model::Protocol;

use crate::batch::{Batch, Op};
use std::collections::BTreeSet;

use crate::build::{declared_sets, dispatch_rules, fixed_chains, shared_rules};
use crate::model::Stmt;
use crate::names::{
    ChainId, EndpointMap, EntryKind, FixedChain, KeySpace, RejectCounter, SetName, SharedChain,
};
use crate::options::{LocalhostNodePorts, NftablesOptions};
use crate::transport::{Transport, TransportError};

#[derive(Debug, thiserror::Error)]
#[error("the nftables mode needs {feature}, which this kernel or nft does not support: {source}")]
pub struct MissingFeature {
    pub feature: &'static str,
    #[source]
    pub source: TransportError,
}

fn shared(ops: &mut Vec<Op>, chain: SharedChain, opts: &NftablesOptions) {
    ops.push(Op::AddChain(ChainId::Shared(chain)));
    for rule in shared_rules(chain, opts) {
        ops.push(Op::AddRule(ChainId::Shared(chain), rule));
    }
}

/// The probe steps: (feature, operations it adds).
fn steps(opts: &NftablesOptions) -> Vec<(&'static str, Vec<Op>)> {
    let fixed = fixed_chains(opts);
    let sets = declared_sets(opts);
    let pick = |set: &SetName, f: fn(&SetName) -> bool| f(set);
    let of = |f: fn(&SetName) -> bool| {
        sets.iter()
            .filter(|s| pick(s, f))
            .map(|s| Op::AddSet(*s))
            .collect::<Vec<_>>()
    };
    let plain: fn(&SetName) -> bool = |s| {
        !matches!(
            s,
            SetName::FirewallAllow | SetName::Endpoints(_) | SetName::Affinity(_)
        )
    };
    let mut dnat = Vec::new();
    let mut sticky = Vec::new();
    // The endpoint maps of the probe's pick and sticky chains.
    let mut maps = Vec::new();
    let mut entry_sets = BTreeSet::new();
    for proto in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
        for (space, kind) in [
            (KeySpace::Address, EntryKind::Address),
            (KeySpace::NodePort, EntryKind::NodePort),
        ] {
            let map = EndpointMap { space, proto };
            let pick = SharedChain::Pick { map, count: 2 };
            maps.extend(pick.owned_map().map(Op::AddSet));
            shared(&mut dnat, pick, opts);
            entry_sets.insert(SetName::Entries { kind, target: pick });
            for slot in 0..2 {
                shared(
                    &mut sticky,
                    SharedChain::Slot {
                        map,
                        count: 2,
                        timeout: 10,
                        slot,
                    },
                    opts,
                );
            }
            let sticky_chain = SharedChain::Sticky {
                map,
                count: 2,
                timeout: 10,
            };
            maps.extend(sticky_chain.owned_map().map(Op::AddSet));
            shared(&mut sticky, sticky_chain, opts);
        }
    }
    let mut dispatch: Vec<Op> = entry_sets.iter().map(|set| Op::AddSet(*set)).collect();
    for kind in EntryKind::ALL {
        let chain = ChainId::Fixed(kind.dispatch_chain());
        // The target rules only: the fixed ones were probed with the fixed chains.
        dispatch.extend(
            dispatch_rules(kind, &entry_sets, opts)
                .into_iter()
                .filter(|rule| matches!(rule.stmt, Stmt::Goto(ChainId::Shared(_))))
                .map(|rule| Op::AddRule(chain, rule)),
        );
    }
    // Localhost NodePorts' counters and rules, probed whether or not the options have them
    // (the rules are among the fixed ones when they do).
    let mut counters: Vec<Op> = RejectCounter::ALL.into_iter().map(Op::AddCounter).collect();
    let mut counting = Vec::new();
    if !opts.localhost_nodeports.is_on() {
        counters.push(Op::AddSet(SetName::LocalhostNodePorts));
        let on = NftablesOptions {
            localhost_nodeports: LocalhostNodePorts::Rejected,
            ..opts.clone()
        };
        let chain = FixedChain::NodePortEndpointsCheck;
        let (_, all) = fixed_chains(&on)
            .into_iter()
            .find(|(c, _)| *c == chain)
            .unwrap_or((chain, Vec::new()));
        counting.extend(
            all.into_iter()
                .filter(|rule| matches!(rule.stmt, Stmt::CountReject(_)))
                .map(|rule| Op::AddRule(ChainId::Fixed(chain), rule)),
        );
    }
    vec![
        (
            "nf_tables with nat and filter base chains (kernel >= 5.13, nft >= 1.0)",
            std::iter::once(Op::AddTable)
                .chain(fixed.iter().map(|(c, _)| Op::AddChain(ChainId::Fixed(*c))))
                .collect(),
        ),
        ("sets with concatenated keys", of(plain)),
        ("named counters (localhost NodePorts)", counters),
        (
            "concatenated interval sets (loadBalancerSourceRanges)",
            vec![Op::AddSet(SetName::FirewallAllow)],
        ),
        ("typeof maps keyed by numgen (endpoint maps)", maps),
        (
            "dynamic sets with timeouts (ClientIP affinity)",
            of(|s| matches!(s, SetName::Affinity(_))),
        ),
        (
            "ct, fib, mark, reject and masquerade fully-random rules",
            fixed
                .iter()
                .flat_map(|(c, rules)| rules.iter().map(|r| Op::AddRule(ChainId::Fixed(*c), r.clone())))
                .collect(),
        ),
        (
            "rules counting into named counters (localhost NodePorts)",
            counting,
        ),
        ("DNAT to a concatenation looked up in a map", dnat),
        ("a goto per set of entries (dispatch rules)", dispatch),
        ("set updates from the packet path (ClientIP affinity)", sticky),
    ]
}

/// Checks every feature the mode uses, in order; the first missing one is the error.
pub fn check_support(transport: &mut dyn Transport, opts: &NftablesOptions) -> Result<(), MissingFeature> {
    let mut batch = Batch::new(opts.family);
    for (feature, ops) in steps(opts) {
        batch.ops.extend(ops);
        transport
            .check(&batch)
            .map_err(|source| MissingFeature { feature, source })?;
    }
    Ok(())
}
