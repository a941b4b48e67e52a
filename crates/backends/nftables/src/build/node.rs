//! The node's own elements (the Service CIDRs, the addresses accepting NodePorts): a
//! bundle of their own, redone when the node's addresses or the ServiceCIDRs change rather
//! than with any Service.

use ipnet::IpNet;
use kpr_host::{NodePortAddresses, NodePortTargets};

use super::{Bundle, Context};
use crate::model::{ElemKey, Element};
use crate::names::SetName;
use crate::options::NftablesOptions;

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
