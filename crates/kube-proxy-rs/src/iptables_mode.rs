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
///
/// Upstream skips a family whose iptables cannot be run and still exits 0. We never claim
/// success for rules nobody looked at: a family that no flavour's tools could check fails
/// the cleanup (exit 1) with a message naming the tools. A single flavour that is not
/// installed next to one that is (only `iptables-nft-*`, say) is logged, naming the tool,
/// and skipped: upstream only ever checks one flavour per family.
pub fn cleanup_everything() -> Result<(), Fatal> {
    let mut failures = Vec::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        let mut unrunnable = Vec::new();
        for variant in [Variant::Legacy, Variant::Nft] {
            match real_failures(family, variant, cleanup(&IptablesCli::new(family, variant))) {
                Ok(errors) => failures.extend(errors),
                Err(tool) => {
                    tracing::warn!(
                        "--cleanup: {} {variant:?} rules not checked: {tool}",
                        family.label()
                    );
                    unrunnable.push(tool);
                }
            }
        }
        if unrunnable.len() == 2 {
            failures.push(format!(
                "{} rules could not be checked at all: {}",
                family.label(),
                unrunnable.join("; ")
            ));
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

/// The errors worth failing for, or `Err(why)` when this flavour's save tool could not be
/// run for any table: then nothing was checked (the flavour is most likely not installed).
/// Once anything was checked, every error counts, a missing restore tool included.
fn real_failures(family: IpFamily, variant: Variant, report: CleanupReport) -> Result<Vec<String>, String> {
    let unsaved: Vec<String> = report
        .errors
        .iter()
        .filter_map(|e| match &e.source {
            ExecError::Spawn { command, source } if is_save_tool(command) => {
                Some(format!("cannot run {}: {source}", program(command)))
            }
            _ => None,
        })
        .collect();
    if unsaved.len() == kpr_iptables::CLEANUP_TABLES.len() {
        let mut reasons = unsaved;
        reasons.dedup();
        return Err(reasons.join("; "));
    }
    Ok(report
        .errors
        .into_iter()
        .map(|e| format!("{} {variant:?}: {e}", family.label()))
        .collect())
}

/// The program of a command line as ExecError records it ("iptables-nft-save -t nat").
fn program(command: &str) -> &str {
    command.split_whitespace().next().unwrap_or(command)
}

fn is_save_tool(command: &str) -> bool {
    program(command).ends_with("-save")
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

    fn spawn_error(table: kpr_iptables::Table, command: &str) -> kpr_iptables::CleanupError {
        kpr_iptables::CleanupError {
            table,
            source: ExecError::Spawn {
                command: command.to_string(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            },
        }
    }

    #[test]
    fn a_flavour_whose_save_tool_never_ran_checked_nothing() {
        let report = CleanupReport {
            applied: Vec::new(),
            errors: kpr_iptables::CLEANUP_TABLES
                .iter()
                .map(|&t| spawn_error(t, &format!("iptables-legacy-save -t {t}")))
                .collect(),
        };
        let why = real_failures(IpFamily::V4, Variant::Legacy, report).unwrap_err();
        assert!(why.starts_with("cannot run iptables-legacy-save: "), "{why}");
        assert_eq!(why.matches("cannot run").count(), 1, "{why}");
    }

    #[test]
    fn a_missing_restore_tool_after_a_successful_save_is_a_failure() {
        let report = CleanupReport {
            applied: Vec::new(),
            errors: kpr_iptables::CLEANUP_TABLES
                .iter()
                .map(|&t| spawn_error(t, "iptables-nft-restore --noflush --counters"))
                .collect(),
        };
        let failures = real_failures(IpFamily::V4, Variant::Nft, report).unwrap();
        assert_eq!(failures.len(), kpr_iptables::CLEANUP_TABLES.len());
        assert!(failures[0].contains("iptables-nft-restore"), "{failures:?}");
    }

    #[test]
    fn a_clean_run_has_no_failures() {
        let failures = real_failures(IpFamily::V6, Variant::Nft, CleanupReport::default()).unwrap();
        assert!(failures.is_empty());
    }
}
