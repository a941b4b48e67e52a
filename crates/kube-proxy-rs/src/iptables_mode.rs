//! iptables mode: the effective configuration and the node's facts turned into one
//! iptables backend per IP family (`iptables` for IPv4, `ip6tables` for IPv6), whether a
//! family can be programmed on this host at all, and `--cleanup`.

use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use kpr_config::{LocalMode, NODE_PORT_ADDRESSES_PRIMARY, Settings};
use kpr_conntrack::Reconciler;
use kpr_iptables::{
    Accounting, CT_STATE_INVALID_DROPPED, CleanupReport, ExecError, InterfaceAddresses, InterfaceName,
    Iptables, IptablesBackend, IptablesCli, IptablesOptions, LOCALHOST_NODEPORTS_ACCEPTED, LocalAddresses,
    LocalDetector, Modes, NetlinkAccounting, NodePortAddresses, ProcSysctl, Sysctl, Table, UnsafeText,
    Variant, cleanup_modes, conntrack_tcp_be_liberal, ensure_counters, render_dry_run,
};
use kpr_metrics::{IptablesCounter, PacketCounters};
use kpr_model::IpFamily;
use kpr_state::DesiredState;

use crate::fatal::Fatal;
use crate::node::NodeFacts;

/// Upstream's `Present()`: the family's iptables can list the nat table's POSTROUTING chain
/// (the tools are installed, the kernel has the family and its nat table).
pub fn supports(family: IpFamily) -> bool {
    let cli = IptablesCli::new(family, Variant::Auto);
    match cli.chain_exists(Table::Nat, "POSTROUTING") {
        Ok(true) => true,
        Ok(false) => {
            tracing::info!(
                ipFamily = family.label(),
                "No iptables support for family: no nat POSTROUTING chain"
            );
            false
        }
        Err(error) => {
            tracing::info!(ipFamily = family.label(), %error, "No iptables support for family");
            false
        }
    }
}

/// The options of `family`'s backend, from the validated settings and the node's facts.
pub fn options(settings: &Settings, family: IpFamily, node: &NodeFacts) -> Result<IptablesOptions, Fatal> {
    options_with(settings, family, node, &ProcSysctl::default())
}

/// Like [`options`], reading kernel settings from `sysctl`.
fn options_with(
    settings: &Settings,
    family: IpFamily,
    node: &NodeFacts,
    sysctl: &dyn Sysctl,
) -> Result<IptablesOptions, Fatal> {
    let config = &settings.config;
    Ok(IptablesOptions {
        family,
        // Validation keeps the bit within 0..=31.
        masquerade_bit: u8::try_from(config.masquerade_bit()).unwrap_or(14),
        masquerade_all: config.masquerade_all(),
        // Wanted; IptablesBackend::new keeps it only if the binary supports it.
        masquerade_random_fully: true,
        local_detector: local_detector(settings, node)?,
        localhost_nodeports: config.localhost_node_ports(),
        nodeport_addresses: nodeport_addresses(
            config.node_port_addresses.as_deref().unwrap_or_default(),
            node,
        )?,
        bind_address: specific_address(&config.bind_address),
        // Upstream reads the kernel's setting at start-up; the config sets it just after
        // options are made (and before the first sync).
        conntrack_tcp_be_liberal: config.conntrack.tcp_be_liberal || conntrack_tcp_be_liberal(sysctl),
        ..IptablesOptions::default()
    })
}

/// `--bind-address` when it names one address (not 0.0.0.0 or ::).
pub(crate) fn specific_address(bind_address: &str) -> Option<IpAddr> {
    bind_address
        .trim()
        .parse::<IpAddr>()
        .ok()
        .filter(|ip| !ip.is_unspecified())
}

/// What `--dry-run` prints for one family: the full sync's restore input, with this host's
/// addresses.
pub fn dry_run(state: &DesiredState, options: &IptablesOptions) -> Result<String, Fatal> {
    let addresses = if options.nodeport_addresses.needs_local_addresses(options.family) {
        InterfaceAddresses
            .addresses(options.family)
            .map_err(|e| Fatal::runtime(e.to_string()))?
    } else {
        Vec::new()
    };
    Ok(render_dry_run(state, options, &addresses))
}

fn interface(
    field: &str,
    name: &str,
    check: fn(&str) -> Result<InterfaceName, UnsafeText>,
) -> Result<InterfaceName, Fatal> {
    check(name).map_err(|e| {
        Fatal::usage(format!(
            "{field}: {name:?} is not a usable interface name: it {e}"
        ))
    })
}

/// Upstream's `getLocalDetectors`, for any family: a CIDR mode uses the first CIDR of the
/// backend's family (none of it: no detection for that family).
pub(crate) fn local_detector(settings: &Settings, node: &NodeFacts) -> Result<LocalDetector, Fatal> {
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

/// `nodePortAddresses` as the backends take it; `primary` (validation allows it only alone)
/// becomes the node IPs, as upstream rewrites it at start-up.
pub(crate) fn nodeport_addresses(entries: &[String], node: &NodeFacts) -> Result<NodePortAddresses, Fatal> {
    if entries.is_empty() {
        return Ok(NodePortAddresses::All);
    }
    if entries.iter().any(|e| e == NODE_PORT_ADDRESSES_PRIMARY) {
        let cidrs = node.ips.primary_cidrs();
        // No node IP known: an empty list, which upstream reads as every address.
        return Ok(if cidrs.is_empty() {
            NodePortAddresses::All
        } else {
            NodePortAddresses::Cidrs(cidrs)
        });
    }
    let mut cidrs = Vec::with_capacity(entries.len());
    for entry in entries {
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
/// Upstream's nfacct counters are created here (where the kernel has nfacct), so its
/// rules can count in them.
///
/// The whole UDP conntrack table is reconciled every `sync_period` (upstream reconciles it
/// after every sync; see kpr-conntrack for why ours looks only at changed services in between).
pub fn backend(mut options: IptablesOptions, sync_period: Duration) -> Result<IptablesBackend, Fatal> {
    options.nfacct = ensure_counters(&NetlinkAccounting);
    let cli = IptablesCli::new(options.family, Variant::Auto);
    let family = options.family;
    let backend = IptablesBackend::new(options, Box::new(cli)).map_err(|e| Fatal::usage(e.to_string()))?;
    let reconciler = Reconciler::netlink(family).with_full_period(sync_period);
    Ok(backend.with_conntrack(Box::new(reconciler)))
}

/// Upstream's `kubeproxy_iptables_*_packets_total` metrics, read from the nfacct counters
/// [`backend`] creates, at every scrape.
pub fn register_nfacct_metrics(registry: &mut prometheus_client::registry::Registry) {
    kpr_metrics::register_nfacct_metrics(registry, std::sync::Arc::new(NfacctCounters));
}

/// The kernel's nfacct counters behind upstream's two packet metrics.
struct NfacctCounters;

impl PacketCounters for NfacctCounters {
    fn packets(&self, counter: IptablesCounter) -> Result<Option<u64>, String> {
        let name = match counter {
            IptablesCounter::CtStateInvalidDropped => CT_STATE_INVALID_DROPPED,
            IptablesCounter::LocalhostNodeportsAccepted => LOCALHOST_NODEPORTS_ACCEPTED,
        };
        NetlinkAccounting
            .get(name)
            .map(|counter| counter.map(|c| c.packets))
            .map_err(|e| e.to_string())
    }
}

/// Start-up, as upstream's platform cleanup: removes what upstream's other modes left
/// (nftables mode's tables; IPVS mode's iptables chains and the rules using them or its
/// ipsets, its virtual services on `kube-ipvs0`, the link, its ipsets), so they cannot
/// answer or drop traffic next to our rules. Best effort: failures are logged, never
/// fatal. Both families and both iptables flavours are looked at, as `--cleanup` does: an
/// IPVS-mode run may have used either; a flavour that is not installed is skipped.
///
/// Upstream's iptables mode leaves IPVS mode's objects alone at start-up (its platform
/// cleanup removes them only when switching to nftables, and on `--cleanup`); we remove
/// them too, because IPVS mode's filter rules (KUBE-IPVS-FILTER rejects new connections
/// to addresses in its sets) and `kube-ipvs0`'s addresses keep acting on traffic after a
/// switch. The chains both modes share stay: our first sync rewrites them. Userspace mode's
/// portals go too: they would redirect Service traffic to listeners that are gone.
pub fn remove_other_modes_leftovers() {
    remove_iptables_leftovers(Modes::IPTABLES.others());
    crate::ipvs_mode::remove_node_port_servers();
    // Logs what it removed and what it could not.
    kpr_leftovers::remove_kernel_leftovers();
}

/// The iptables rules of `modes` in both families and both iptables flavours, best effort:
/// failures are logged; a flavour whose tools are not installed is skipped quietly.
pub fn remove_iptables_leftovers(modes: Modes) {
    for family in [IpFamily::V4, IpFamily::V6] {
        for variant in [Variant::Legacy, Variant::Nft] {
            let report = cleanup_modes(&IptablesCli::new(family, variant), modes);
            for error in report.errors {
                match &error.source {
                    ExecError::Spawn { command, .. } if is_save_tool(command) => {
                        tracing::debug!("{} {variant:?}: leftovers not checked: {error}", family.label());
                    }
                    _ => tracing::warn!(
                        "{} {variant:?}: leftovers of other modes: {error}",
                        family.label()
                    ),
                }
            }
        }
    }
}

/// `--cleanup`: removes what kube-proxy (ours or upstream's, in any mode) left: iptables
/// rules of iptables and IPVS mode, for both families and both iptables flavours (either
/// may hold rules from an earlier run), then nftables mode's tables and IPVS mode's
/// virtual services, `kube-ipvs0` and ipsets (see kpr-leftovers).
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
            let report = cleanup_modes(&IptablesCli::new(family, variant), Modes::ALL);
            match real_failures(family, variant, report) {
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
    // ipvs mode's NodePort virtual servers are found through its sets: before they go.
    if let Err(error) = kpr_ipvs::leftovers::remove_node_port_servers(&mut kpr_ipvs::IpsetNetlink::default())
    {
        failures.push(format!("IPVS NodePort services: {error}"));
    }
    // After the rules: a set still matched by a rule cannot be destroyed.
    let leftovers = kpr_leftovers::remove_kernel_leftovers();
    failures.extend(leftovers.failures.iter().map(ToString::to_string));
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
    use crate::node::NodeIps;

    /// A node whose Node object lists `addresses`, with `pod_cidrs`.
    fn node(addresses: &[&str], pod_cidrs: &[&str]) -> NodeFacts {
        let raw: Vec<IpAddr> = addresses.iter().map(|a| a.parse().unwrap()).collect();
        NodeFacts {
            name: "node1".into(),
            ips: NodeIps::detect(&raw, "0.0.0.0"),
            pod_cidrs: pod_cidrs.iter().map(|c| c.parse().unwrap()).collect(),
        }
    }

    fn unknown_node() -> NodeFacts {
        node(&[], &[])
    }

    #[test]
    fn nodeport_addresses_from_config() {
        let unknown = unknown_node();
        assert_eq!(nodeport_addresses(&[], &unknown).unwrap(), NodePortAddresses::All);
        let cidrs = nodeport_addresses(&["192.168.0.0/16".to_string()], &unknown).unwrap();
        assert_eq!(
            cidrs,
            NodePortAddresses::Cidrs(vec!["192.168.0.0/16".parse().unwrap()])
        );
    }

    /// Upstream rewrites `primary` into the node IPs: /32 and /128 of those known.
    #[test]
    fn primary_nodeport_addresses_are_the_node_ips() {
        let primary = ["primary".to_string()];
        let dual = node(&["192.168.77.1", "fd00:77::1"], &[]);
        assert_eq!(
            nodeport_addresses(&primary, &dual).unwrap(),
            NodePortAddresses::Cidrs(vec![
                "192.168.77.1/32".parse().unwrap(),
                "fd00:77::1/128".parse().unwrap()
            ])
        );
        assert_eq!(
            nodeport_addresses(&primary, &unknown_node()).unwrap(),
            NodePortAddresses::All,
            "no node IP known: every address, as upstream's empty list"
        );
    }

    fn settings(args: &[&str]) -> Settings {
        let mut all = vec!["kube-proxy-rs", "--manifests=x"];
        all.extend_from_slice(args);
        kpr_config::load(all).unwrap()
    }

    /// NodeCIDR: each family's detector is the node's pod CIDR of that family; a family
    /// without one detects nothing (upstream's no-op detector).
    #[test]
    fn node_cidr_mode_detects_pods_by_the_nodes_pod_cidrs() {
        let settings = settings(&["--detect-local-mode=NodeCIDR"]);
        let dual = node(&["192.168.77.1"], &["10.244.1.0/24", "fd00:10:244:1::/64"]);
        let (dir, sysctl) = sysctl_tree("0");
        let detector = |family, facts: &NodeFacts| {
            options_with(&settings, family, facts, &sysctl)
                .unwrap()
                .local_detector
        };
        assert_eq!(
            detector(IpFamily::V4, &dual).if_local(IpFamily::V4).unwrap(),
            ["-s", "10.244.1.0/24"]
        );
        assert_eq!(
            detector(IpFamily::V6, &dual).if_not_local(IpFamily::V6).unwrap(),
            ["!", "-s", "fd00:10:244:1::/64"]
        );
        let v4_only = node(&["192.168.77.1"], &["10.244.1.0/24"]);
        assert_eq!(detector(IpFamily::V6, &v4_only).if_local(IpFamily::V6), None);
        assert_eq!(detector(IpFamily::V4, &unknown_node()), LocalDetector::None);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A sysctl tree of its own (tests run in parallel threads) with only
    /// nf_conntrack_tcp_be_liberal, set to `value`.
    fn sysctl_tree(value: &str) -> (std::path::PathBuf, ProcSysctl) {
        static TREES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let serial = TREES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("kpr-mode-sysctl-{}-{serial}-{value}", std::process::id());
        let dir = std::env::temp_dir().join(name);
        let file = dir.join(kpr_iptables::TCP_BE_LIBERAL);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, format!("{value}\n")).unwrap();
        (dir.clone(), ProcSysctl::at(dir))
    }

    #[test]
    fn options_follow_flags() {
        let settings = kpr_config::load([
            "kube-proxy-rs",
            "--masquerade-all",
            "--iptables-masquerade-bit=12",
            "--cluster-cidr=10.244.0.0/16",
            "--bind-address=192.168.0.10",
            "--manifests=x",
        ])
        .unwrap();
        let (dir, sysctl) = sysctl_tree("0");
        let opts = options_with(&settings, IpFamily::V4, &unknown_node(), &sysctl).unwrap();
        assert!(opts.masquerade_all);
        assert_eq!(opts.masquerade_bit, 12);
        assert_eq!(
            opts.local_detector,
            LocalDetector::ClusterCidr(vec!["10.244.0.0/16".parse().unwrap()])
        );
        assert_eq!(opts.bind_address, Some("192.168.0.10".parse().unwrap()));
        assert!(!opts.conntrack_tcp_be_liberal);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn unspecified_bind_address_is_no_node_ip() {
        assert_eq!(specific_address("0.0.0.0"), None);
        assert_eq!(specific_address("::"), None);
        assert_eq!(specific_address("10.0.0.1"), Some("10.0.0.1".parse().unwrap()));
    }

    /// The INVALID drop goes when the config or the kernel makes conntrack liberal.
    #[test]
    fn tcp_be_liberal_comes_from_the_config_or_the_kernel() {
        let (off_dir, off) = sysctl_tree("0");
        let (on_dir, on) = sysctl_tree("1");
        let liberal = |args: &[&str], sysctl: &ProcSysctl| {
            options_with(&settings(args), IpFamily::V4, &unknown_node(), sysctl)
                .unwrap()
                .conntrack_tcp_be_liberal
        };
        assert!(!liberal(&[], &off));
        assert!(liberal(&["--conntrack-tcp-be-liberal"], &off));
        assert!(liberal(&[], &on), "the kernel's setting, as upstream reads it");
        std::fs::remove_dir_all(off_dir).unwrap();
        std::fs::remove_dir_all(on_dir).unwrap();
    }

    #[test]
    fn detect_local_interfaces_become_checked_names() {
        let opts = options(
            &settings(&[
                "--detect-local-mode=InterfaceNamePrefix",
                "--pod-interface-name-prefix=veth",
            ]),
            IpFamily::V4,
            &unknown_node(),
        )
        .unwrap();
        assert_eq!(
            opts.local_detector.if_local(IpFamily::V4).unwrap(),
            ["-i", "veth+"]
        );
        let bad = interface("detectLocal.bridgeInterface", "br\n0", InterfaceName::new).unwrap_err();
        assert_eq!(bad.code, 2);
        assert!(
            bad.message.contains("detectLocal.bridgeInterface"),
            "{}",
            bad.message
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
