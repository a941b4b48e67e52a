//! The node-local facts every mode is built from, read once at start-up from the effective
//! configuration, the node's facts and the kernel.
//!
//! Upstream computes these in each proxier's constructor from the same settings; reading them
//! here, once, means no two modes can read the configuration differently, and no mode owns
//! what is the node's.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use kpr_config::{
    LocalMode, NODE_PORT_ADDRESSES_ALL, NODE_PORT_ADDRESSES_LOCALHOST, NODE_PORT_ADDRESSES_PRIMARY, Settings,
};
use kpr_model::text::{InterfaceName, UnsafeText};

use crate::local::LocalDetector;
use crate::node::NodeFacts;
use crate::node_ports::NodePortAddresses;
use crate::sysctl::{ProcSysctl, Sysctl, conntrack_tcp_be_liberal};

/// A setting that cannot be turned into a node fact; the message names the field and why.
/// Validation refuses most of these earlier; this is the second line of defence.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSetting(pub String);

/// What every mode's options are built from, beside the mode's own settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostFacts {
    /// Upstream's `getLocalDetectors`, for any family.
    pub local_detector: LocalDetector,
    /// `nodePortAddresses` as the backends (and the Service health-check servers) take it.
    pub nodeport_addresses: NodePortAddresses,
    /// `--bind-address` when it names one address (not 0.0.0.0 or ::).
    pub bind_address: Option<IpAddr>,
    /// The kernel's `nf_conntrack_tcp_be_liberal` is on, or `conntrack.tcpBeLiberal` turns
    /// it on (the config sets it before the first sync): the modes then leave out the rule
    /// dropping ctstate INVALID packets, as upstream's.
    pub conntrack_tcp_be_liberal: bool,
}

impl HostFacts {
    /// Reads the facts, the kernel's settings from `/proc/sys`.
    pub fn read(settings: &Settings, node: &NodeFacts) -> Result<Self, InvalidSetting> {
        Self::read_with(settings, node, &ProcSysctl::default())
    }

    /// Like [`HostFacts::read`], reading kernel settings from `sysctl`.
    pub fn read_with(
        settings: &Settings,
        node: &NodeFacts,
        sysctl: &dyn Sysctl,
    ) -> Result<Self, InvalidSetting> {
        let config = &settings.config;
        Ok(Self {
            local_detector: local_detector(settings, node)?,
            nodeport_addresses: nodeport_addresses(
                config.node_port_addresses.as_deref().unwrap_or_default(),
                node,
            )?,
            bind_address: specific_address(&config.bind_address),
            // Upstream reads the kernel's setting at start-up.
            conntrack_tcp_be_liberal: config.conntrack.tcp_be_liberal || conntrack_tcp_be_liberal(sysctl),
        })
    }
}

/// `--bind-address` when it names one address (not 0.0.0.0 or ::).
pub fn specific_address(bind_address: &str) -> Option<IpAddr> {
    bind_address
        .trim()
        .parse::<IpAddr>()
        .ok()
        .filter(|ip| !ip.is_unspecified())
}

fn interface(
    field: &str,
    name: &str,
    check: fn(&str) -> Result<InterfaceName, UnsafeText>,
) -> Result<InterfaceName, InvalidSetting> {
    check(name).map_err(|e| {
        InvalidSetting(format!(
            "{field}: {name:?} is not a usable interface name: it {e}"
        ))
    })
}

/// Upstream's `getLocalDetectors`, for any family: a CIDR mode uses the first CIDR of the
/// backend's family (none of it: no detection for that family).
fn local_detector(settings: &Settings, node: &NodeFacts) -> Result<LocalDetector, InvalidSetting> {
    let config = &settings.config;
    Ok(match settings.local_mode {
        LocalMode::ClusterCidr => {
            let cidrs = config.cluster_cidrs();
            if cidrs.is_empty() {
                LocalDetector::None
            } else {
                LocalDetector::ClusterCidr(cidrs)
            }
        }
        // The node's pod CIDRs play the cluster CIDRs' part (start-up waited for them).
        LocalMode::NodeCidr if node.pod_cidrs.is_empty() => LocalDetector::None,
        LocalMode::NodeCidr => LocalDetector::ClusterCidr(node.pod_cidrs.clone()),
        LocalMode::BridgeInterface => LocalDetector::BridgeInterface(interface(
            "detectLocal.bridgeInterface",
            &config.detect_local.bridge_interface,
            InterfaceName::new,
        )?),
        LocalMode::InterfaceNamePrefix => LocalDetector::InterfaceNamePrefix(interface(
            "detectLocal.interfaceNamePrefix",
            &config.detect_local.interface_name_prefix,
            InterfaceName::prefix,
        )?),
    })
}

/// `nodePortAddresses` as the backends take it, its keywords expanded as upstream expands
/// them at start-up (1.37, freely mixed with CIDRs): `primary` is the node IPs (a /32 or
/// /128 of each one known), `localhost` the loopback ranges, `all` the catch-all ranges. An
/// empty result means every address, as upstream reads an empty list.
pub fn nodeport_addresses(entries: &[String], node: &NodeFacts) -> Result<NodePortAddresses, InvalidSetting> {
    let mut cidrs = Vec::with_capacity(entries.len());
    for entry in entries {
        match entry.as_str() {
            NODE_PORT_ADDRESSES_PRIMARY => cidrs.extend(node.ips.primary_cidrs()),
            NODE_PORT_ADDRESSES_LOCALHOST => cidrs.extend(LOCALHOST),
            NODE_PORT_ADDRESSES_ALL => cidrs.extend(ALL),
            // Validation already refused anything else that is not a CIDR.
            _ => cidrs.push(entry.parse().map_err(|e| {
                InvalidSetting(format!(
                    "nodePortAddresses: {entry:?} is neither a CIDR nor a keyword: {e}"
                ))
            })?),
        }
    }
    cidrs.dedup();
    Ok(if cidrs.is_empty() {
        NodePortAddresses::All
    } else {
        NodePortAddresses::Cidrs(cidrs)
    })
}

/// What `localhost` stands for.
const LOCALHOST: [IpNet; 2] = [
    IpNet::new_assert(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)), 8),
    IpNet::new_assert(IpAddr::V6(Ipv6Addr::LOCALHOST), 128),
];
/// What `all` stands for.
const ALL: [IpNet; 2] = [
    IpNet::new_assert(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
    IpNet::new_assert(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0),
];

#[cfg(test)]
mod tests;
