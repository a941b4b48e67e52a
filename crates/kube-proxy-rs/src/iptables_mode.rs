//! Turning the effective configuration into the iptables backend, and `--cleanup`.

use ipnet::IpNet;
use kpr_config::{LocalMode, NODE_PORT_ADDRESSES_PRIMARY, Settings};
use kpr_conntrack::Reconciler;
use kpr_iptables::{
    CleanupReport, ExecError, IptablesBackend, IptablesCli, IptablesOptions, LocalDetector,
    NodePortAddresses, Variant, cleanup,
};
use kpr_model::IpFamily;

use crate::fatal::Fatal;
use crate::node::local_addresses;

/// The backend's options, from the validated settings. Only IPv4 is proxied for now.
pub fn options(settings: &Settings) -> Result<IptablesOptions, Fatal> {
    let config = &settings.config;
    let family = IpFamily::V4;
    let node_ips = local_addresses(family);
    Ok(IptablesOptions {
        family,
        // Validation keeps the bit within 0..=31.
        masquerade_bit: u8::try_from(config.masquerade_bit()).unwrap_or(14),
        masquerade_all: config.masquerade_all(),
        masquerade_random_fully: true,
        local_detector: local_detector(settings)?,
        localhost_nodeports: config.localhost_node_ports(),
        nodeport_addresses: nodeport_addresses(config.node_port_addresses.as_deref().unwrap_or_default())?,
        node_ips,
        ..IptablesOptions::default()
    })
}

fn local_detector(settings: &Settings) -> Result<LocalDetector, Fatal> {
    let config = &settings.config;
    Ok(match settings.local_mode {
        LocalMode::ClusterCidr => {
            let cidrs = config.cluster_cidrs();
            if cidrs.is_empty() {
                tracing::info!(
                    "no --cluster-cidr: traffic to cluster IPs from outside the pod network is not masqueraded"
                );
                LocalDetector::None
            } else {
                LocalDetector::ClusterCidr(cidrs)
            }
        }
        LocalMode::BridgeInterface => {
            LocalDetector::BridgeInterface(config.detect_local.bridge_interface.clone())
        }
        LocalMode::InterfaceNamePrefix => {
            LocalDetector::InterfaceNamePrefix(config.detect_local.interface_name_prefix.clone())
        }
        LocalMode::NodeCidr => {
            return Err(Fatal::usage(
                "--detect-local-mode=NodeCIDR needs the Node's podCIDRs from the Kubernetes API, \
                 which this version does not read yet; use ClusterCIDR with --cluster-cidr",
            ));
        }
    })
}

fn nodeport_addresses(entries: &[String]) -> Result<NodePortAddresses, Fatal> {
    if entries.is_empty() {
        return Ok(NodePortAddresses::All);
    }
    let mut cidrs = Vec::with_capacity(entries.len());
    for entry in entries {
        if entry == NODE_PORT_ADDRESSES_PRIMARY {
            return Err(Fatal::usage(
                "nodePortAddresses \"primary\" needs the node IP from the Node object, which this version \
                 does not read yet; list the node's CIDRs instead",
            ));
        }
        // Validation already refused anything that is not a CIDR.
        let cidr: IpNet = entry
            .parse()
            .map_err(|e| Fatal::usage(format!("nodePortAddresses: {entry:?} is not a CIDR: {e}")))?;
        cidrs.push(cidr);
    }
    Ok(NodePortAddresses::Cidrs(cidrs))
}

/// The iptables backend on the host's binaries, with the variant chosen the way upstream's
/// iptables-wrapper chooses it (the one already holding kube rules, else the default).
pub fn backend(options: IptablesOptions) -> Result<IptablesBackend, Fatal> {
    let cli = IptablesCli::new(options.family, Variant::Auto);
    let family = options.family;
    let backend = IptablesBackend::new(options, Box::new(cli)).map_err(|e| Fatal::usage(e.to_string()))?;
    Ok(backend.with_conntrack(Box::new(Reconciler::netlink(family))))
}

/// `--cleanup`: removes what kube-proxy (ours or upstream's) left in iptables, for both
/// families and both iptables flavours, because either may hold rules from an earlier run.
pub fn cleanup_everything() -> Result<(), Fatal> {
    let mut failures = Vec::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        for variant in [Variant::Legacy, Variant::Nft] {
            let report = cleanup(&IptablesCli::new(family, variant));
            failures.extend(real_failures(family, variant, report));
        }
    }
    if failures.is_empty() {
        tracing::info!("cleanup done");
        Ok(())
    } else {
        Err(Fatal::runtime(format!(
            "cleanup incomplete: {}",
            failures.join("; ")
        )))
    }
}

/// Errors worth failing for: a flavour whose binaries are not installed holds no rules.
fn real_failures(family: IpFamily, variant: Variant, report: CleanupReport) -> Vec<String> {
    report
        .errors
        .into_iter()
        .filter(|e| !matches!(e.source, ExecError::Spawn { .. }))
        .map(|e| format!("{} {variant:?}: {e}", family.label()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodeport_addresses_from_config() {
        assert_eq!(nodeport_addresses(&[]).unwrap(), NodePortAddresses::All);
        let cidrs = nodeport_addresses(&["192.168.0.0/16".to_string()]).unwrap();
        assert_eq!(
            cidrs,
            NodePortAddresses::Cidrs(vec!["192.168.0.0/16".parse().unwrap()])
        );
        let err = nodeport_addresses(&["primary".to_string()]).unwrap_err();
        assert_eq!(err.code, 2);
        assert!(err.message.contains("primary"), "{}", err.message);
    }

    #[test]
    fn options_follow_flags() {
        let settings = kpr_config::load([
            "kube-proxy-rs",
            "--masquerade-all",
            "--iptables-masquerade-bit=12",
            "--cluster-cidr=10.244.0.0/16",
            "--manifests=x",
        ])
        .unwrap();
        let opts = options(&settings).unwrap();
        assert!(opts.masquerade_all);
        assert_eq!(opts.masquerade_bit, 12);
        assert_eq!(
            opts.local_detector,
            LocalDetector::ClusterCidr(vec!["10.244.0.0/16".parse().unwrap()])
        );
    }
}
