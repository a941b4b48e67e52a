//! Every name in our table, as closed enums.
//!
//! No name in the table comes from an API object: sets, maps and chains are named from
//! literals of this file and numbers (endpoint counts, slots, timeouts). So no Service,
//! namespace or port name can ever reach nft text or a netlink attribute, and a name can be
//! lowered to netlink as the same string the text form uses. The longest name the
//! enums can spell (a `local-...-via-...` entry set with 5-digit counts and timeouts) stays
//! far below nf_tables' 255 bytes ([`NAME_MAX_BYTES`], checked by a test).

use std::fmt;

use kpr_model::Protocol;

/// The protocols a Service port can have, in a fixed order (maps exist for each).
pub const PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

/// What an endpoint map is keyed by, and which endpoints it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeySpace {
    /// `daddr . dport . slot`: cluster IPs (the internal policy's endpoints) and external
    /// addresses (external IPs, load-balancer IPs: the external policy's endpoints).
    Address,
    /// `daddr . dport . slot` for the external addresses of `externalTrafficPolicy: Local`
    /// Services: every cluster-wide endpoint, for pod and host traffic (the short-circuit).
    AddressShortcut,
    /// `dport . slot`: NodePorts (the external policy's endpoints). The node address is
    /// not part of the key, so any address that accepts NodePorts shares one element.
    NodePort,
    /// `dport . slot` for NodePorts of `externalTrafficPolicy: Local` Services: the
    /// cluster-wide endpoints for pod and host traffic.
    NodePortShortcut,
}

impl KeySpace {
    pub const ALL: [KeySpace; 4] = [
        Self::Address,
        Self::AddressShortcut,
        Self::NodePort,
        Self::NodePortShortcut,
    ];

    fn stem(self) -> &'static str {
        match self {
            Self::Address => "service-endpoints",
            Self::AddressShortcut => "service-shortcut",
            Self::NodePort => "nodeport-endpoints",
            Self::NodePortShortcut => "nodeport-shortcut",
        }
    }

    /// Whether the key starts with the destination address.
    pub fn keyed_by_address(self) -> bool {
        matches!(self, Self::Address | Self::AddressShortcut)
    }

    /// The short-circuit space belonging to this entry space.
    pub fn shortcut(self) -> Self {
        if self.keyed_by_address() {
            Self::AddressShortcut
        } else {
            Self::NodePortShortcut
        }
    }
}

/// A key space for one protocol: the layout of its endpoint maps and its affinity set (nft
/// 1.0.6 cannot reference a map typed with the protocol-independent `th dport` from a rule
/// added in a later transaction, so each protocol has its own maps and chains). The
/// endpoint maps themselves are per [`Choice`] (see [`SetName::Endpoints`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointMap {
    pub space: KeySpace,
    pub proto: Protocol,
}

impl fmt::Display for EndpointMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.space.stem(), self.proto.lower())
    }
}

/// nf_tables' limit on table, chain and set names (`NFT_NAME_MAXLEN` 256, with its NUL).
pub const NAME_MAX_BYTES: usize = 255;

/// What an entry is keyed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntryKind {
    /// `daddr . l4proto . dport`: cluster IPs, external IPs, load-balancer IPs.
    Address,
    /// `l4proto . dport`: NodePorts, on any node address that accepts them.
    NodePort,
}

impl EntryKind {
    pub const ALL: [EntryKind; 2] = [Self::Address, Self::NodePort];

    /// The last word of the kind's set names.
    pub fn suffix(self) -> &'static str {
        match self {
            Self::Address => "ips",
            Self::NodePort => "nodeports",
        }
    }

    /// The chain that looks entries of this kind up, one rule per target.
    pub fn dispatch_chain(self) -> FixedChain {
        match self {
            Self::Address => FixedChain::ServiceDispatch,
            Self::NodePort => FixedChain::NodePortDispatch,
        }
    }
}

/// What happens to new connections to a destination without usable endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    /// `goto reject-chain`: ICMP port unreachable (no endpoint anywhere).
    Reject,
    /// `drop` (a Local policy and no endpoint on this node).
    Drop,
}

impl Refusal {
    pub const ALL: [Refusal; 2] = [Self::Reject, Self::Drop];

    fn word(self) -> &'static str {
        match self {
            Self::Reject => "reject",
            Self::Drop => "drop",
        }
    }
}

/// Every set and map of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetName {
    /// Every cluster IP: traffic to one of them on a port no Service has is rejected.
    ClusterIps,
    /// The Service CIDRs: traffic to an address in them that no Service holds is dropped.
    ServiceCidrs,
    /// Node addresses accepting NodePorts (only with `--nodeport-addresses`).
    NodePortIps,
    /// `<target>-ips` (`addr . proto . port`) or `<target>-nodeports` (`proto . port`): the
    /// entries going to one shared chain. A plain set, not a verdict map: adding an
    /// element makes the kernel validate nothing (see the crate docs). It exists while
    /// some entry goes to `target`; its dispatch chain holds one rule looking it up.
    Entries { kind: EntryKind, target: SharedChain },
    /// `no-endpoint-<reject|drop>-<ips|nodeports>`: destinations without usable endpoints,
    /// refused before DNAT by the `*-endpoints-check` chains (fixed rules).
    NoEndpoint { kind: EntryKind, refusal: Refusal },
    /// Load-balancer destinations with source ranges.
    FirewallIps,
    /// `addr . proto . port . source-range`: the sources each of them accepts.
    FirewallAllow,
    /// `endpoint . endpoint`: a pod reaching itself through a Service is masqueraded.
    Hairpin,
    /// `<map>-<M>[-t<T>]`: `key . slot : endpoint address . port` for the entries that
    /// choose among M endpoints (with affinity timeout T). One map per choice, not one per
    /// key space: binding a map from a new rule makes the kernel walk every element of it
    /// (`nf_tables_bind_set`), so the chains binding a map (its pick chain, or its sticky
    /// chain's slot chains) are created with it, while it is empty. It exists while its
    /// chain does.
    Endpoints(Choice),
    /// Dynamic: `client . key . slot` remembered for ClientIP affinity.
    Affinity(EndpointMap),
    /// `proto . port` of every NodePort (only with localhost NodePorts on): a packet to a
    /// loopback address at one of them is counted and rejected for the protocols the
    /// localhost proxy does not serve (see [`RejectCounter`]).
    LocalhostNodePorts,
}

impl fmt::Display for SetName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fixed = match self {
            Self::ClusterIps => "cluster-ips",
            Self::ServiceCidrs => "service-cidrs",
            Self::NodePortIps => "nodeport-ips",
            Self::Entries { kind, target } => return write!(f, "{target}-{}", kind.suffix()),
            Self::NoEndpoint { kind, refusal } => {
                return write!(f, "no-endpoint-{}-{}", refusal.word(), kind.suffix());
            }
            Self::FirewallIps => "firewall-ips",
            Self::FirewallAllow => "firewall-allow",
            Self::Hairpin => "hairpin",
            Self::Endpoints(choice) => return write_choice(f, choice),
            Self::Affinity(map) => return write!(f, "affinity-{map}"),
            Self::LocalhostNodePorts => "localhost-nodeports",
        };
        f.write_str(fixed)
    }
}

/// A named counter of the table (an nf_tables object, not a set or chain): the packets to
/// a loopback NodePort of one protocol that were rejected (upstream's
/// `localhost-nodeport-rejected-<proto>`, read into
/// `kubeproxy_nftables_localhost_nodeport_rejected_packets_total` at each scrape).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RejectCounter(pub Protocol);

impl RejectCounter {
    /// Every counter this table may hold.
    pub const ALL: [RejectCounter; 3] = [Self(Protocol::Tcp), Self(Protocol::Udp), Self(Protocol::Sctp)];

    /// The counter of `name`, if it is one of ours.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.to_string() == name)
    }
}

impl fmt::Display for RejectCounter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "localhost-nodeport-rejected-{}", self.0.lower())
    }
}

/// The base chains (hooked into netfilter) and the fixed regular chains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FixedChain {
    FilterPreroutingPreDnat,
    FilterOutputPreDnat,
    FilterInput,
    FilterForward,
    FilterOutput,
    NatPrerouting,
    NatOutput,
    NatPostrouting,
    Services,
    ServiceDispatch,
    NodePortDispatch,
    MarkForMasquerade,
    Masquerading,
    ServiceEndpointsCheck,
    NodePortEndpointsCheck,
    FirewallCheck,
    ClusterIpsCheck,
    RejectChain,
}

impl FixedChain {
    pub const ALL: [FixedChain; 18] = [
        Self::FilterPreroutingPreDnat,
        Self::FilterOutputPreDnat,
        Self::FilterInput,
        Self::FilterForward,
        Self::FilterOutput,
        Self::NatPrerouting,
        Self::NatOutput,
        Self::NatPostrouting,
        Self::Services,
        Self::ServiceDispatch,
        Self::NodePortDispatch,
        Self::MarkForMasquerade,
        Self::Masquerading,
        Self::ServiceEndpointsCheck,
        Self::NodePortEndpointsCheck,
        Self::FirewallCheck,
        Self::ClusterIpsCheck,
        Self::RejectChain,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::FilterPreroutingPreDnat => "filter-prerouting-pre-dnat",
            Self::FilterOutputPreDnat => "filter-output-pre-dnat",
            Self::FilterInput => "filter-input",
            Self::FilterForward => "filter-forward",
            Self::FilterOutput => "filter-output",
            Self::NatPrerouting => "nat-prerouting",
            Self::NatOutput => "nat-output",
            Self::NatPostrouting => "nat-postrouting",
            Self::Services => "services",
            Self::ServiceDispatch => "service-dispatch",
            Self::NodePortDispatch => "nodeport-dispatch",
            Self::MarkForMasquerade => "mark-for-masquerade",
            Self::Masquerading => "masquerading",
            Self::ServiceEndpointsCheck => "service-endpoints-check",
            Self::NodePortEndpointsCheck => "nodeport-endpoints-check",
            Self::FirewallCheck => "firewall-check",
            Self::ClusterIpsCheck => "cluster-ips-check",
            Self::RejectChain => "reject-chain",
        }
    }

    /// The netfilter hook of a base chain, as upstream's nftables mode hooks them.
    pub fn hook(self) -> Option<Hook> {
        let (kind, hook, priority) = match self {
            Self::FilterPreroutingPreDnat => (ChainType::Filter, HookPoint::Prerouting, -110),
            Self::FilterOutputPreDnat => (ChainType::Filter, HookPoint::Output, -110),
            Self::FilterInput => (ChainType::Filter, HookPoint::Input, 0),
            Self::FilterForward => (ChainType::Filter, HookPoint::Forward, 0),
            Self::FilterOutput => (ChainType::Filter, HookPoint::Output, 0),
            Self::NatPrerouting => (ChainType::Nat, HookPoint::Prerouting, -100),
            Self::NatOutput => (ChainType::Nat, HookPoint::Output, -100),
            Self::NatPostrouting => (ChainType::Nat, HookPoint::Postrouting, 100),
            _ => return None,
        };
        Some(Hook { kind, hook, priority })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainType {
    Filter,
    Nat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookPoint {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hook {
    pub kind: ChainType,
    pub hook: HookPoint,
    pub priority: i32,
}

impl ChainType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Filter => "filter",
            Self::Nat => "nat",
        }
    }
}

impl HookPoint {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prerouting => "prerouting",
            Self::Input => "input",
            Self::Forward => "forward",
            Self::Output => "output",
            Self::Postrouting => "postrouting",
        }
    }
}

/// How one entry picks among `count` endpoints of one key space: at random, or sticky per
/// client for `affinity` seconds. Also names the endpoint map of those entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Choice {
    pub map: EndpointMap,
    pub count: u16,
    pub affinity: Option<u32>,
}

impl Choice {
    /// The endpoint map of the entries making this choice.
    pub fn endpoints(self) -> SetName {
        SetName::Endpoints(self)
    }

    /// The chain an entry goes to for this choice.
    pub fn chain(self) -> SharedChain {
        match self.affinity {
            None => SharedChain::Pick {
                map: self.map,
                count: self.count,
            },
            Some(timeout) => SharedChain::Sticky {
                map: self.map,
                count: self.count,
                timeout,
            },
        }
    }
}

/// Chains shared by every Service entry with the same shape: they exist while some entry
/// uses them, and their rules are a function of their name (and the options) alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SharedChain {
    /// `pick-<map>-<M>`: DNAT to slot `random mod M` of the entry's key in `map`.
    Pick { map: EndpointMap, count: u16 },
    /// `slot-<map>-<M>-t<T>-<k>`: remember slot `k` for this client, DNAT to it (in the
    /// endpoint map of its sticky chain, so per count too).
    Slot {
        map: EndpointMap,
        count: u16,
        timeout: u32,
        slot: u16,
    },
    /// `sticky-<map>-<M>-t<T>`: the client's remembered slot if any, else a random one.
    Sticky {
        map: EndpointMap,
        count: u16,
        timeout: u32,
    },
    /// `masq-<choice>`: external traffic with policy Cluster: masquerade, then choose.
    Masquerade { choice: Choice },
    /// `local-<...>`: external traffic with policy Local: pod and host traffic goes to
    /// every endpoint (`shortcut`, host traffic masqueraded), the rest to the node's own
    /// (`local`; none: it falls through and is dropped by `no-endpoint-*`).
    LocalPolicy {
        local: Option<Choice>,
        shortcut: Option<Choice>,
    },
}

impl SharedChain {
    /// Chains must be created after the chains they jump to and deleted before them.
    pub fn level(self) -> u8 {
        match self {
            Self::Pick { .. } | Self::Slot { .. } => 0,
            Self::Sticky { .. } => 1,
            Self::Masquerade { .. } | Self::LocalPolicy { .. } => 2,
        }
    }

    /// The endpoint map this chain owns: created just before it (empty, so binding it costs
    /// nothing) and deleted just after it. The slot chains bind their sticky chain's map.
    pub fn owned_map(self) -> Option<SetName> {
        match self {
            Self::Pick { map, count } => Some(
                Choice {
                    map,
                    count,
                    affinity: None,
                }
                .endpoints(),
            ),
            Self::Sticky { map, count, timeout } => Some(
                Choice {
                    map,
                    count,
                    affinity: Some(timeout),
                }
                .endpoints(),
            ),
            _ => None,
        }
    }

    /// The chains this one jumps to.
    pub fn targets(self) -> Vec<SharedChain> {
        match self {
            Self::Pick { .. } | Self::Slot { .. } => Vec::new(),
            Self::Sticky { map, count, timeout } => (0..count)
                .map(|slot| Self::Slot {
                    map,
                    count,
                    timeout,
                    slot,
                })
                .collect(),
            Self::Masquerade { choice } => vec![choice.chain()],
            Self::LocalPolicy { local, shortcut } => {
                local.into_iter().chain(shortcut).map(Choice::chain).collect()
            }
        }
    }
}

fn write_choice(f: &mut fmt::Formatter<'_>, choice: &Choice) -> fmt::Result {
    write!(f, "{}-{}", choice.map, choice.count)?;
    if let Some(timeout) = choice.affinity {
        write!(f, "-t{timeout}")?;
    }
    Ok(())
}

impl fmt::Display for SharedChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pick { map, count } => write!(f, "pick-{map}-{count}"),
            Self::Slot {
                map,
                count,
                timeout,
                slot,
            } => write!(f, "slot-{map}-{count}-t{timeout}-{slot}"),
            Self::Sticky { map, count, timeout } => write!(f, "sticky-{map}-{count}-t{timeout}"),
            Self::Masquerade { choice } => {
                f.write_str("masq-")?;
                write_choice(f, choice)
            }
            Self::LocalPolicy { local, shortcut } => {
                f.write_str("local-")?;
                match local {
                    Some(choice) => write_choice(f, choice)?,
                    None => f.write_str("none")?,
                }
                f.write_str("-via-")?;
                match shortcut {
                    Some(choice) => write_choice(f, choice),
                    None => f.write_str("none"),
                }
            }
        }
    }
}

/// Any chain of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChainId {
    Fixed(FixedChain),
    Shared(SharedChain),
}

impl fmt::Display for ChainId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fixed(c) => f.write_str(c.as_str()),
            Self::Shared(c) => c.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(space: KeySpace) -> EndpointMap {
        EndpointMap {
            space,
            proto: Protocol::Tcp,
        }
    }

    #[test]
    fn shared_chain_names_say_what_they_do() {
        let pick = Choice {
            map: map(KeySpace::Address),
            count: 3,
            affinity: None,
        };
        assert_eq!(pick.chain().to_string(), "pick-service-endpoints-tcp-3");
        let sticky = Choice {
            affinity: Some(10800),
            ..pick
        };
        assert_eq!(
            sticky.chain().to_string(),
            "sticky-service-endpoints-tcp-3-t10800"
        );
        assert_eq!(
            SharedChain::Masquerade { choice: pick }.to_string(),
            "masq-service-endpoints-tcp-3"
        );
        let shortcut = Choice {
            map: map(KeySpace::NodePortShortcut),
            count: 5,
            affinity: None,
        };
        assert_eq!(
            SharedChain::LocalPolicy {
                local: None,
                shortcut: Some(shortcut)
            }
            .to_string(),
            "local-none-via-nodeport-shortcut-tcp-5"
        );
        assert_eq!(
            SetName::Affinity(map(KeySpace::NodePort)).to_string(),
            "affinity-nodeport-endpoints-tcp"
        );
        assert_eq!(pick.endpoints().to_string(), "service-endpoints-tcp-3");
        assert_eq!(sticky.endpoints().to_string(), "service-endpoints-tcp-3-t10800");
        assert_eq!(
            SharedChain::Slot {
                map: map(KeySpace::Address),
                count: 3,
                timeout: 10800,
                slot: 2
            }
            .to_string(),
            "slot-service-endpoints-tcp-3-t10800-2"
        );
    }

    #[test]
    fn entry_sets_are_named_after_their_target_and_fit_nf_tables() {
        let most = |space| Choice {
            map: EndpointMap {
                space,
                proto: Protocol::Sctp,
            },
            count: u16::MAX,
            affinity: Some(u32::MAX),
        };
        let longest = SetName::Entries {
            kind: EntryKind::NodePort,
            target: SharedChain::LocalPolicy {
                local: Some(most(KeySpace::NodePort)),
                shortcut: Some(most(KeySpace::NodePortShortcut)),
            },
        };
        assert!(longest.to_string().len() <= NAME_MAX_BYTES, "{longest}");
        let pick = SetName::Entries {
            kind: EntryKind::Address,
            target: SharedChain::Pick {
                map: map(KeySpace::Address),
                count: 3,
            },
        };
        assert_eq!(pick.to_string(), "pick-service-endpoints-tcp-3-ips");
        let refused = SetName::NoEndpoint {
            kind: EntryKind::NodePort,
            refusal: Refusal::Drop,
        };
        assert_eq!(refused.to_string(), "no-endpoint-drop-nodeports");
        assert_eq!(SetName::LocalhostNodePorts.to_string(), "localhost-nodeports");
    }

    #[test]
    fn reject_counters_are_upstreams_names() {
        let names: Vec<String> = RejectCounter::ALL.iter().map(ToString::to_string).collect();
        assert_eq!(
            names,
            [
                "localhost-nodeport-rejected-tcp",
                "localhost-nodeport-rejected-udp",
                "localhost-nodeport-rejected-sctp"
            ]
        );
        assert_eq!(
            RejectCounter::parse("localhost-nodeport-rejected-udp"),
            Some(RejectCounter(Protocol::Udp))
        );
        assert_eq!(RejectCounter::parse("localhost-nodeport-rejected-UDP"), None);
    }

    #[test]
    fn sticky_chains_need_their_slot_chains_first() {
        let sticky = SharedChain::Sticky {
            map: map(KeySpace::Address),
            count: 2,
            timeout: 60,
        };
        assert_eq!(sticky.targets().len(), 2);
        assert!(sticky.targets().iter().all(|t| t.level() < sticky.level()));
        // Each map is owned by the one chain that creates it, and only its chains bind it.
        assert_eq!(
            sticky.owned_map().map(|m| m.to_string()).as_deref(),
            Some("service-endpoints-tcp-2-t60")
        );
        assert!(sticky.targets().iter().all(|t| t.owned_map().is_none()));
    }
}
