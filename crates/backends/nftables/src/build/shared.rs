//! The shared chains (endpoint picks, affinity, masquerading, the Local policy): named
//! after what they do, not after a Service, so any number of Service ports use one, and
//! its rules are a function of its name and the options alone.

use super::fixed::{jump, pod_match};
use crate::model::{Key, Match, Rule, Slot, Stmt};
use crate::names::{ChainId, Choice, FixedChain, SetName, SharedChain};
use crate::options::NftablesOptions;

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
