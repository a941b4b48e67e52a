//! This host's addresses as the ipvs mode needs them, read before every sync: which are on
//! `kube-ipvs0` (bound by an earlier sync), which are on other interfaces (an external or
//! load-balancer IP there is served but not bound), and which serve NodePorts
//! (`UPSTREAM.md` §3.1). Reading is I/O ([`read_interface_addresses`]); the rest is pure.

use std::collections::BTreeSet;
use std::net::IpAddr;

use kpr_host::{NodePortAddresses, NodePortTargets};
use kpr_ipvs_netlink::IPVS_LINK;
use kpr_model::IpFamily;

/// One address and the interface holding it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct InterfaceAddress {
    pub interface: String,
    pub address: IpAddr,
}

/// Every address on every interface of the calling thread's network namespace.
pub fn read_interface_addresses() -> std::io::Result<Vec<InterfaceAddress>> {
    let interfaces = nix::ifaddrs::getifaddrs().map_err(std::io::Error::from)?;
    Ok(interfaces
        .filter_map(|interface| {
            let address = interface.address?;
            let ip = match (address.as_sockaddr_in(), address.as_sockaddr_in6()) {
                (Some(v4), _) => IpAddr::V4(v4.ip()),
                (_, Some(v6)) => IpAddr::V6(v6.ip()),
                _ => return None,
            };
            Some(InterfaceAddress {
                interface: interface.interface_name,
                address: ip,
            })
        })
        .collect())
}

/// This family's addresses, split as a sync needs them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostAddresses {
    /// On `kube-ipvs0`.
    pub bound: BTreeSet<IpAddr>,
    /// On any other interface.
    pub others: BTreeSet<IpAddr>,
    /// Where NodePorts are served.
    pub node_ports: Vec<IpAddr>,
}

impl HostAddresses {
    pub fn new(all: &[InterfaceAddress], family: IpFamily, node_port_addresses: &NodePortAddresses) -> Self {
        let of_family = || all.iter().filter(|a| family.matches(&a.address));
        let usable = |a: &&InterfaceAddress| !a.address.is_loopback() && !is_link_local_v6(a.address);
        let bound = of_family()
            .filter(usable)
            .filter(|a| a.interface == IPVS_LINK)
            .map(|a| a.address)
            .collect();
        let others: BTreeSet<IpAddr> = of_family()
            .filter(usable)
            .filter(|a| a.interface != IPVS_LINK)
            .map(|a| a.address)
            .collect();
        let node_ports = match node_port_addresses.targets(family, &[]) {
            NodePortTargets::AllLocal => others.iter().copied().collect(),
            NodePortTargets::Ips(_) => {
                // Upstream keeps kube-ipvs0's and link-local addresses inside the CIDRs here.
                let candidates: BTreeSet<IpAddr> = of_family()
                    .map(|a| a.address)
                    .filter(|ip| !ip.is_loopback())
                    .collect();
                let candidates: Vec<IpAddr> = candidates.into_iter().collect();
                match node_port_addresses.targets(family, &candidates) {
                    NodePortTargets::Ips(ips) => ips,
                    NodePortTargets::AllLocal => candidates,
                }
            }
        };
        Self {
            bound,
            others,
            node_ports,
        }
    }
}

fn is_link_local_v6(address: IpAddr) -> bool {
    matches!(address, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(interface: &str, address: &str) -> InterfaceAddress {
        InterfaceAddress {
            interface: interface.to_string(),
            address: address.parse().unwrap(),
        }
    }

    fn host() -> Vec<InterfaceAddress> {
        vec![
            at("lo", "127.0.0.1"),
            at("lo", "::1"),
            at("eth0", "192.168.0.10"),
            at("eth0", "fe80::1"),
            at("eth0", "fd00:1::10"),
            at("cni0", "10.244.0.1"),
            at(IPVS_LINK, "10.96.0.10"),
            at(IPVS_LINK, "fd00:96::10"),
        ]
    }

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|ip| ip.parse().unwrap()).collect()
    }

    #[test]
    fn by_default_node_ports_are_served_on_every_other_interface_address() {
        let v4 = HostAddresses::new(&host(), IpFamily::V4, &NodePortAddresses::All);
        assert_eq!(v4.bound.iter().copied().collect::<Vec<_>>(), ips(&["10.96.0.10"]));
        assert_eq!(v4.node_ports, ips(&["10.244.0.1", "192.168.0.10"]));
        assert_eq!(v4.others.len(), 2);
        let v6 = HostAddresses::new(&host(), IpFamily::V6, &NodePortAddresses::All);
        assert_eq!(v6.node_ports, ips(&["fd00:1::10"]), "no loopback, no link-local");
    }

    #[test]
    fn node_port_cidrs_pick_addresses_inside_them_even_on_kube_ipvs0() {
        let cidrs = NodePortAddresses::Cidrs(vec![
            "192.168.0.0/24".parse().unwrap(),
            "10.96.0.0/16".parse().unwrap(),
        ]);
        let v4 = HostAddresses::new(&host(), IpFamily::V4, &cidrs);
        assert_eq!(v4.node_ports, ips(&["10.96.0.10", "192.168.0.10"]));
        let v6 = HostAddresses::new(&host(), IpFamily::V6, &cidrs);
        assert_eq!(
            v6.node_ports,
            ips(&["fd00:1::10"]),
            "no IPv6 CIDR: every address off kube-ipvs0"
        );
    }
}
