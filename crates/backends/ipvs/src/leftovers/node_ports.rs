//! Upstream's NodePort virtual servers, which kpr-leftovers cannot tell from anyone else's:
//! they sit on the node's own addresses, not on `kube-ipvs0`. They are the mode's when
//! their port is one the mode's NodePort sets hold (`KUBE-NODE-PORT-TCP` and friends, both
//! families), so they are found through the sets before the sets are destroyed, and
//! removed on `--cleanup` and when another mode starts.

use std::collections::BTreeSet;

use kpr_ipvs_netlink::{Ipvs, Protocol, ServiceKey};

use crate::addresses::read_interface_addresses;
use crate::ipset::{Family, Ipset, Member, SetSpec, Sets};
use crate::sets::SetId;

/// The NodePort sets, with the protocol of the ports they hold.
fn node_port_sets() -> Vec<(SetSpec, Protocol)> {
    let mut sets = Vec::new();
    for family in [Family::V4, Family::V6] {
        for (id, protocol) in [
            (SetId::NodePortTcp, Protocol::Tcp),
            (SetId::NodePortUdp, Protocol::Udp),
            (SetId::NodePortSctp, Protocol::Sctp),
        ] {
            sets.push((id.spec(family), protocol));
        }
    }
    sets
}

/// The NodePort sets' specs, to read them.
pub fn node_port_specs() -> Vec<SetSpec> {
    node_port_sets().into_iter().map(|(spec, _)| spec).collect()
}

/// (protocol, port) of every NodePort the sets in `parsed` (read with [`node_port_specs`])
/// hold.
pub fn node_ports(parsed: &Sets) -> BTreeSet<(Protocol, u16)> {
    let mut ports = BTreeSet::new();
    for (spec, protocol) in node_port_sets() {
        for member in parsed.members(spec.name).into_iter().flatten() {
            match member {
                Member::Port(port) | Member::IpPort(_, _, port) => {
                    ports.insert((protocol, *port));
                }
                _ => {}
            }
        }
    }
    ports
}

/// Deletes the virtual servers on this host's addresses at a NodePort of the mode's sets;
/// the ones deleted. Nothing to do without IPVS or without such sets.
pub fn remove_node_port_servers(ipset: &mut dyn Ipset) -> Result<Vec<ServiceKey>, String> {
    // A kernel without ipset has no such sets.
    let Ok(parsed) = ipset.read(&node_port_specs()) else {
        return Ok(Vec::new());
    };
    let ports = node_ports(&parsed);
    if ports.is_empty() {
        return Ok(Vec::new());
    }
    let Some(mut ipvs) = Ipvs::open().map_err(|e| e.to_string())? else {
        return Ok(Vec::new());
    };
    let local: BTreeSet<_> = read_interface_addresses()
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|a| a.address)
        .collect();
    let listed = ipvs.services().map_err(|e| e.to_string())?;
    let mut removed = Vec::new();
    for service in listed.objects {
        let key = service.key;
        if local.contains(&key.address) && ports.contains(&(key.protocol, key.port)) {
            ipvs.delete_service(&key)
                .map_err(|e| format!("IPVS service {key}: {e}"))?;
            removed.push(key);
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ports_come_from_both_families_and_every_protocol() {
        let saved = "create KUBE-NODE-PORT-TCP bitmap:port range 0-65535\n\
                     add KUBE-NODE-PORT-TCP 30080\n\
                     create KUBE-6-NODE-PORT-UDP bitmap:port range 0-65535\n\
                     add KUBE-6-NODE-PORT-UDP 30053\n\
                     create KUBE-NODE-PORT-SCTP-HASH hash:ip,port family inet hashsize 1024 maxelem 65536\n\
                     add KUBE-NODE-PORT-SCTP-HASH 192.168.0.10,sctp:30905\n\
                     create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n\
                     add KUBE-CLUSTER-IP 10.96.0.10,tcp:80\n";
        let parsed = crate::ipset::parse_save(saved, &node_port_specs()).unwrap();
        let ports = node_ports(&parsed);
        assert_eq!(
            ports,
            [
                (Protocol::Tcp, 30080),
                (Protocol::Udp, 30053),
                (Protocol::Sctp, 30905)
            ]
            .into()
        );
    }
}
