//! One Service port's bundle: its entries, endpoint slots, firewall elements and the
//! shared chains they lead to, from kpr-state's `PortPlan`. Independent of every other
//! port's, so a sync redoes only the bundles of changed Services.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use ipnet::IpNet;
use kpr_model::{Endpoint, Protocol};
use kpr_naming::text::Comment;
use kpr_state::{PortPlan, Unreachable};

use super::{Bundle, Context, Dest, GroupKey, SlotGroup};
use crate::model::{ElemKey, Element, element_comment};
use crate::names::{Choice, EndpointMap, EntryKind, KeySpace, Refusal, SetName, SharedChain};
use crate::slots::{self, SlotOrder};

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
            b.entry(refused(EntryKind::NodePort, u), key.clone());
        }
        // Every NodePort, whatever its endpoints: on the loopback address the rules reject
        // the protocols the localhost proxy does not serve.
        if ctx.opts.localhost_nodeports.is_on() {
            b.entry(SetName::LocalhostNodePorts, key);
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
