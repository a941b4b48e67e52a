//! IPVS virtual services of upstream's IPVS mode, through the `IPVS` generic-netlink
//! family.
//!
//! IPVS marks no owner on a service. Upstream's IPVS mode binds every address it serves
//! (cluster, external and load-balancer IPs) to `kube-ipvs0`, so a service whose address
//! sits there is upstream's; that is what is removed. NodePort services on the node's own
//! addresses cannot be told apart from other software's (keepalived, say) and stay; once
//! iptables mode runs they see no traffic, since its NAT rules send NodePort traffic to
//! the pods before IPVS (at local input) would. Services with a firewall mark have no
//! address and are never upstream's.
//!
//! A kernel without `ip_vs` has no `IPVS` family: the controller lookup answers ENOENT,
//! and there is nothing to remove.

use std::net::IpAddr;

use kpr_ipvs_netlink::{Ipvs, NetlinkError, ServiceKey};
use kpr_mode::Leftovers;

/// The services among `services` that upstream's IPVS mode made: those whose address is
/// one of `kube-ipvs0`'s.
pub fn upstreams_services<'a>(services: &'a [ServiceKey], link_addresses: &[IpAddr]) -> Vec<&'a ServiceKey> {
    services
        .iter()
        .filter(|service| link_addresses.contains(&service.address))
        .collect()
}

/// Deletes the virtual services at `link_addresses` (`kube-ipvs0`'s).
pub(super) fn remove_services_on(link_addresses: &[IpAddr], leftovers: &mut Leftovers) {
    let failed = |leftovers: &mut Leftovers, error: &NetlinkError| {
        leftovers
            .failures
            .push(format!("IPVS services on kube-ipvs0: {error}"));
    };
    let mut ipvs = match Ipvs::open() {
        Ok(Some(ipvs)) => ipvs,
        Ok(None) => {
            tracing::debug!("no IPVS in this kernel: no IPVS services to remove");
            return;
        }
        Err(error) => return failed(leftovers, &error),
    };
    let listed = match ipvs.services() {
        Ok(listed) => listed,
        Err(error) => return failed(leftovers, &error),
    };
    for reason in &listed.unreadable {
        tracing::warn!(%reason, "unreadable IPVS service in the kernel's list; left alone");
    }
    let keys: Vec<ServiceKey> = listed.objects.iter().map(|service| service.key).collect();
    for key in upstreams_services(&keys, link_addresses) {
        let object = format!("IPVS service {key}");
        match ipvs.delete_service(key) {
            Ok(())
            | Err(NetlinkError::Kernel {
                errno: kpr_netlink::ESRCH,
            }) => super::removed(leftovers, object),
            Err(error) => leftovers.failures.push(format!("{object}: {error}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use kpr_ipvs_netlink::Protocol;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn service(address: &str, port: u16) -> ServiceKey {
        ServiceKey {
            protocol: Protocol::Tcp,
            address: ip(address),
            port,
        }
    }

    #[test]
    fn only_services_at_kube_ipvs0_addresses_are_upstreams() {
        let services = [
            service("10.96.0.1", 443),
            service("192.168.1.5", 30080), // a NodePort on the node's address
            service("10.0.0.100", 80),     // keepalived's VIP
            service("fd00::10", 53),
        ];
        let chosen = upstreams_services(&services, &[ip("10.96.0.1"), ip("fd00::10")]);
        assert_eq!(chosen, [&services[0], &services[3]]);
        assert!(upstreams_services(&services, &[]).is_empty());
    }
}
