//! The one place that knows the proxy modes: whether a mode is available, which IP families
//! it can program on this host, one backend per family, and the mode's `--dry-run`,
//! `--init-only`, `--cleanup` and the leftovers of the other modes. A new mode plugs in here; the rest of the binary only
//! sees [`FamilyBackend`]s.
//!
//! Families follow upstream's decision (`platformCheckSupported` and the dual-stack
//! proxier): a proxy runs both families whenever the host can program both, whatever the
//! node's addresses, and only its primary family (the node IP's, see
//! [`crate::node::NodeIps`]) otherwise; a host that cannot program the primary family is an
//! error. Upstream's checks of the configuration against the families come with it
//! ([`check_config`]).

use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use kpr_config::{LocalMode, ProxyMode, Settings};
use kpr_events::Recorder;
use kpr_iptables::{NodePortAddresses, ProcSysctl};
use kpr_metrics::{Metrics, ProxyHealth};
use kpr_model::IpFamily;
use kpr_state::{Backend, DesiredState};
use kpr_sync::FamilyBackend;
use prometheus_client::registry::Registry;

use crate::fatal::Fatal;
use crate::health_check_servers;
use crate::iptables_mode;
use crate::ipvs_mode;
use crate::nftables_mode;
use crate::node::NodeFacts;
use crate::userspace_mode;

/// Upstream's order of the families a dual-stack proxy serves: the primary one first.
const BOTH: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

/// Fails, before anything is changed, when this host cannot run the mode at all: ipvs mode
/// needs IPVS and ipset in the kernel (upstream's `CanUseIPVSProxier`). The other modes'
/// needs are per family ([`supported_families`]). `--dry-run` changes nothing and needs
/// nothing.
pub fn ensure_available(settings: &Settings) -> Result<(), Fatal> {
    if settings.mode == ProxyMode::Ipvs && !settings.dry_run {
        ipvs_mode::check_ipvs(settings)?;
    }
    Ok(())
}

/// Which IP families the mode can program on this host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Support {
    pub ipv4: bool,
    pub ipv6: bool,
}

impl Support {
    fn has(self, family: IpFamily) -> bool {
        match family {
            IpFamily::V4 => self.ipv4,
            IpFamily::V6 => self.ipv6,
        }
    }
}

/// Whether `mode` uses ServiceCIDR objects (to drop traffic to unallocated cluster IPs), so
/// the API source must watch them: nftables only, as upstream starts that informer only for
/// its nftables mode (the iptables mode ignores ServiceCIDRs from manifests too).
pub fn uses_service_cidrs(mode: ProxyMode) -> bool {
    mode == ProxyMode::Nftables
}

/// Upstream's `platformCheckSupported` for `mode`.
pub fn supported_families(mode: ProxyMode) -> Support {
    let supports = match mode {
        ProxyMode::Nftables => nftables_mode::supports,
        ProxyMode::Userspace => userspace_mode::supports,
        ProxyMode::Ipvs => ipvs_mode::supports,
        _ => iptables_mode::supports,
    };
    Support {
        ipv4: supports(IpFamily::V4),
        ipv6: supports(IpFamily::V6),
    }
}

/// What `mode` needs from the host, for error messages.
fn requirement(mode: ProxyMode) -> &'static str {
    match mode {
        ProxyMode::Nftables => {
            "nf_tables with every feature nftables mode uses (the log names the missing one)"
        }
        ProxyMode::Ipvs => "its iptables can list the nat table (IPVS itself is checked next)",
        _ => "its iptables can list the nat table",
    }
}

/// The families to run, the primary one first: both when the host supports both, else the
/// primary family alone; an error when it cannot program the primary family.
pub fn choose_families(mode: ProxyMode, primary: IpFamily, support: Support) -> Result<Vec<IpFamily>, Fatal> {
    if !support.ipv4 && !support.ipv6 {
        return Err(Fatal::runtime(format!(
            "{mode} mode is not available on this host: for neither IP family {}",
            requirement(mode)
        )));
    }
    if !support.has(primary) {
        return Err(Fatal::runtime(format!(
            "no support for primary IP family {:?} in {mode} mode: not on this host: {}",
            primary.label(),
            requirement(mode)
        )));
    }
    if support.ipv4 && support.ipv6 {
        tracing::info!(
            primaryIPFamily = primary.label(),
            "kube-proxy running in dual-stack mode"
        );
        let mut families = BOTH.to_vec();
        families.sort_by_key(|family| *family != primary);
        Ok(families)
    } else {
        tracing::info!(
            ipFamily = primary.label(),
            "kube-proxy running in single-stack mode"
        );
        Ok(vec![primary])
    }
}

/// Upstream's `checkBadConfig` and `checkBadIPConfig`: settings that do not fit the
/// families are logged, and the two that have always been fatal (a CIDR local-detection
/// mode with CIDRs only of the family that is not served) stop start-up.
pub fn check_config(settings: &Settings, node: &NodeFacts, families: &[IpFamily]) -> Result<(), Fatal> {
    let checked = Checked::of(settings, node, families);
    if checked.fatal {
        return Err(Fatal::usage(format!(
            "kube-proxy configuration is incorrect: {}",
            checked.errors.join("; ")
        )));
    }
    for error in &checked.errors {
        tracing::error!("Kube-proxy configuration may be incomplete or incorrect: {error}");
    }
    Ok(())
}

/// What [`check_config`] found.
#[derive(Debug, Default, PartialEq, Eq)]
struct Checked {
    errors: Vec<String>,
    fatal: bool,
}

impl Checked {
    fn of(settings: &Settings, node: &NodeFacts, families: &[IpFamily]) -> Self {
        let config = &settings.config;
        let primary = node.ips.primary_family;
        let other = other_family(primary);
        let dual_stack = families.len() > 1;
        let cluster_cidrs = config.cluster_cidrs();
        let node_port_cidrs = node_port_cidrs(settings, node);
        let mut checked = Self::default();

        // checkBadConfig: does nodePortAddresses limit every family that seems in use?
        let any_dual_stack = [&cluster_cidrs, &node_port_cidrs, &node.pod_cidrs]
            .iter()
            .any(|cidrs| is_dual_stack(cidrs));
        let of_primary = node_port_cidrs.iter().filter(|c| family_of(c) == primary).count();
        if node_port_cidrs.is_empty() {
            checked.errors.push(
                "nodePortAddresses is unset; NodePort connections will be accepted on all local IPs. \
                 Consider using `--nodeport-addresses primary`"
                    .into(),
            );
        } else if any_dual_stack && of_primary == node_port_cidrs.len() {
            checked.errors.push(format!(
                "cluster appears to be dual-stack but nodePortAddresses contains only {} addresses; \
                 NodePort connections will be accepted on all local {} IPs",
                primary.label(),
                other.label()
            ));
        } else if of_primary == 0 {
            checked.errors.push(format!(
                "cluster appears to be {}-primary but nodePortAddresses contains only {} addresses; \
                 NodePort connections will be accepted on all local {} IPs",
                primary.label(),
                other.label(),
                primary.label()
            ));
        }

        // checkBadIPConfig: settings only of the family that is not primary.
        let cluster_type = if dual_stack {
            format!("{}-primary", primary.label())
        } else {
            format!("{}-only", primary.label())
        };
        if only_of(&cluster_cidrs, other) {
            checked.errors.push(format!(
                "cluster is {cluster_type} but clusterCIDRs contains only {} addresses",
                other.label()
            ));
            checked.fatal |= settings.local_mode == LocalMode::ClusterCidr && !dual_stack;
        }
        if only_of(&node.pod_cidrs, other) {
            checked.errors.push(format!(
                "cluster is {cluster_type} but node.spec.podCIDRs contains only {} addresses",
                other.label()
            ));
            checked.fatal |= settings.local_mode == LocalMode::NodeCidr;
        }
        if !dual_stack {
            for (field, address) in [
                ("healthzBindAddress", &config.healthz_bind_address),
                ("metricsBindAddress", &config.metrics_bind_address),
            ] {
                if bind_address_family(address) == Some(other) {
                    checked.errors.push(format!(
                        "cluster is {cluster_type} but {field} is {}",
                        other.label()
                    ));
                }
            }
        }
        checked
    }
}

fn other_family(family: IpFamily) -> IpFamily {
    match family {
        IpFamily::V4 => IpFamily::V6,
        IpFamily::V6 => IpFamily::V4,
    }
}

fn family_of(cidr: &IpNet) -> IpFamily {
    IpFamily::of(&cidr.addr())
}

fn is_dual_stack(cidrs: &[IpNet]) -> bool {
    BOTH.iter()
        .all(|family| cidrs.iter().any(|c| family_of(c) == *family))
}

/// A non-empty list whose every CIDR is of `family`.
fn only_of(cidrs: &[IpNet], family: IpFamily) -> bool {
    !cidrs.is_empty() && cidrs.iter().all(|c| family_of(c) == family)
}

/// The family of an `IP:port` bind address's host, unless it is unspecified.
fn bind_address_family(address: &str) -> Option<IpFamily> {
    let host = address.rsplit_once(':')?.0;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ip: std::net::IpAddr = host.parse().ok()?;
    (!ip.is_unspecified()).then(|| IpFamily::of(&ip))
}

/// `nodePortAddresses` as CIDRs, `primary` resolved as the backends resolve it.
fn node_port_cidrs(settings: &Settings, node: &NodeFacts) -> Vec<IpNet> {
    let entries = settings.config.node_port_addresses.as_deref().unwrap_or_default();
    if entries
        .iter()
        .any(|e| e == kpr_config::NODE_PORT_ADDRESSES_PRIMARY)
    {
        return node.ips.primary_cidrs();
    }
    entries.iter().filter_map(|e| e.parse().ok()).collect()
}

/// The primary family's detector of local traffic detects nothing: logged as upstream does.
fn log_missing_primary_detector(settings: &Settings, node: &NodeFacts) {
    let primary = node.ips.primary_family;
    let has = |cidrs: &[IpNet]| cidrs.iter().any(|c| family_of(c) == primary);
    match settings.local_mode {
        LocalMode::ClusterCidr if !has(&settings.config.cluster_cidrs()) => tracing::info!(
            ipFamily = primary.label(),
            clusterCIDRs = %settings.config.cluster_cidr,
            "Detect-local-mode set to ClusterCIDR, but no cluster CIDR specified for primary IP family"
        ),
        LocalMode::NodeCidr if !has(&node.pod_cidrs) => tracing::info!(
            ipFamily = primary.label(),
            podCIDRs = ?node.pod_cidrs,
            "Detect-local-mode set to NodeCIDR, but no PodCIDR defined at node for primary IP family"
        ),
        _ => {}
    }
}

/// What each family's Service health-check servers report to.
pub struct ServiceHealthDeps {
    pub health: Arc<ProxyHealth>,
    pub metrics: Metrics,
    pub recorder: Recorder,
}

/// Metrics only `mode` has, registered next to the common ones.
pub fn register_metrics(mode: ProxyMode, registry: &mut Registry) {
    match mode {
        ProxyMode::Iptables => iptables_mode::register_nfacct_metrics(registry),
        ProxyMode::Userspace => userspace_mode::register_metrics(registry),
        _ => {}
    }
}

/// One backend per family, each ready to sync (host settings it needs already applied),
/// with that family's Service health-check servers following its syncs.
pub fn backends(
    settings: &Settings,
    node: &NodeFacts,
    families: &[IpFamily],
    sync_period: Duration,
    service_health: &ServiceHealthDeps,
) -> Result<Vec<FamilyBackend>, Fatal> {
    log_missing_primary_detector(settings, node);
    families
        .iter()
        .map(|&family| {
            let (backend, nodeport_addresses) = family_backend(settings, node, family, sync_period)?;
            let health_check_servers = health_check_servers::start(
                family,
                &nodeport_addresses,
                &node.name,
                service_health.health.clone(),
                service_health.metrics.clone(),
                service_health.recorder.clone(),
            );
            Ok(FamilyBackend::new(family, backend).observed_by(health_check_servers))
        })
        .collect()
}

/// `family`'s backend of the chosen mode, and the addresses it serves NodePorts on (the
/// Service health-check servers listen there too).
fn family_backend(
    settings: &Settings,
    node: &NodeFacts,
    family: IpFamily,
    sync_period: Duration,
) -> Result<(Box<dyn Backend>, NodePortAddresses), Fatal> {
    if settings.mode == ProxyMode::Nftables {
        let options = nftables_mode::options(settings, family, node)?;
        let nodeport_addresses = options.nodeport_addresses.clone();
        let backend = nftables_mode::backend(options, sync_period)?;
        return Ok((Box::new(backend), nodeport_addresses));
    }
    if settings.mode == ProxyMode::Ipvs {
        ipvs_mode::prepare_host(settings)?;
        let options = ipvs_mode::options(settings, family, node, ipvs_mode::scheduler(settings)?)?;
        let nodeport_addresses = options.node_port_addresses.clone();
        return Ok((
            Box::new(ipvs_mode::backend(options, sync_period)),
            nodeport_addresses,
        ));
    }
    if settings.mode == ProxyMode::Userspace {
        let options = userspace_mode::options(settings, family, node)?;
        let backend = userspace_mode::backend(options)?;
        // The Service health-check servers listen where iptables mode would serve NodePorts.
        let entries = settings.config.node_port_addresses.as_deref().unwrap_or_default();
        let nodeport_addresses = iptables_mode::nodeport_addresses(entries, node)?;
        return Ok((Box::new(backend), nodeport_addresses));
    }
    let options = iptables_mode::options(settings, family, node)?;
    let nodeport_addresses = options.nodeport_addresses.clone();
    let backend = iptables_mode::backend(options, sync_period)?;
    if let Err(error) = backend.init(&ProcSysctl::default()) {
        tracing::error!(%error, "host setting for localhost NodePorts failed; they may not answer");
    }
    Ok((Box::new(backend), nodeport_addresses))
}

/// `--init-only`: the host settings every family's backend needs, nothing else.
pub fn init_only(settings: &Settings, node: &NodeFacts, families: &[IpFamily]) -> Result<(), Fatal> {
    if matches!(settings.mode, ProxyMode::Nftables | ProxyMode::Userspace) {
        // Upstream's nftables and userspace modes need no host settings beyond conntrack's
        // (applied by the caller): no localhost NodePorts, so no route_localnet.
        return Ok(());
    }
    if settings.mode == ProxyMode::Ipvs {
        ipvs_mode::check_ipvs(settings)?;
        return ipvs_mode::prepare_host(settings);
    }
    for &family in families {
        let options = iptables_mode::options(settings, family, node)?;
        kpr_iptables::prepare_host(&options, &ProcSysctl::default())
            .map_err(|e| Fatal::runtime(format!("--init-only: {e}")))?;
    }
    Ok(())
}

/// `--dry-run`: each family's full ruleset, in the order given, under a comment line saying
/// which family it is and which tool would read it (the lines are valid restore input).
pub fn dry_run(
    settings: &Settings,
    node: &NodeFacts,
    states: &[(IpFamily, DesiredState)],
) -> Result<String, Fatal> {
    let mut out = String::new();
    for (family, state) in states {
        if settings.mode == ProxyMode::Nftables {
            let options = nftables_mode::options(settings, *family, node)?;
            out.push_str(&format!("# {} rules (nft -f input)\n", family.label()));
            out.push_str(&nftables_mode::dry_run(state, &options)?);
            continue;
        }
        if settings.mode == ProxyMode::Ipvs {
            let options = ipvs_mode::options(settings, *family, node, ipvs_mode::scheduler(settings)?)?;
            let tool = match family {
                IpFamily::V4 => "iptables-restore",
                IpFamily::V6 => "ip6tables-restore",
            };
            out.push_str(&format!(
                "# {} IPVS plan and rules (plan as comments, then {tool} input)\n",
                family.label()
            ));
            out.push_str(&ipvs_mode::dry_run(state, &options)?);
            continue;
        }
        if settings.mode == ProxyMode::Userspace {
            let options = userspace_mode::options(settings, *family, node)?;
            let tool = match family {
                IpFamily::V4 => "iptables-restore",
                IpFamily::V6 => "ip6tables-restore",
            };
            out.push_str(&format!(
                "# {} portals ({tool} input; port 0 stands for each listener's port)\n",
                family.label()
            ));
            out.push_str(&userspace_mode::dry_run(state, &options));
            continue;
        }
        let options = iptables_mode::options(settings, *family, node)?;
        let tool = match family {
            IpFamily::V4 => "iptables-restore",
            IpFamily::V6 => "ip6tables-restore",
        };
        out.push_str(&format!("# {} rules ({tool} input)\n", family.label()));
        out.push_str(&iptables_mode::dry_run(state, &options)?);
    }
    Ok(out)
}

/// Start-up, before the first sync: removes what the modes other than `mode` left behind
/// (upstream's platform cleanup). Best effort: logged, never fatal.
pub fn remove_other_modes_leftovers(mode: ProxyMode) {
    match mode {
        ProxyMode::Nftables => nftables_mode::remove_other_modes_leftovers(),
        ProxyMode::Userspace => userspace_mode::remove_other_modes_leftovers(),
        ProxyMode::Ipvs => ipvs_mode::remove_other_modes_leftovers(),
        _ => iptables_mode::remove_other_modes_leftovers(),
    }
}

/// A clean shutdown (SIGTERM): what the mode must not leave behind. Only userspace mode's
/// portals: the other modes' rules keep serving without the process, as upstream's do.
pub fn on_shutdown(mode: ProxyMode, families: &[IpFamily]) {
    if mode == ProxyMode::Userspace {
        userspace_mode::remove_portals(families);
    }
}

/// `--cleanup`: what every mode (ours or upstream's, both families and iptables flavours) left.
pub fn cleanup() -> Result<(), Fatal> {
    iptables_mode::cleanup_everything()
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::node::NodeIps;

    const BOTH_SUPPORTED: Support = Support {
        ipv4: true,
        ipv6: true,
    };

    #[test]
    fn both_families_run_whenever_the_host_supports_both() {
        assert_eq!(
            choose_families(ProxyMode::Iptables, IpFamily::V4, BOTH_SUPPORTED).unwrap(),
            [IpFamily::V4, IpFamily::V6]
        );
        assert_eq!(
            choose_families(ProxyMode::Iptables, IpFamily::V6, BOTH_SUPPORTED).unwrap(),
            [IpFamily::V6, IpFamily::V4],
            "the primary family first"
        );
    }

    #[test]
    fn a_host_without_one_family_runs_the_primary_one_alone() {
        let no_ipv6 = Support {
            ipv4: true,
            ipv6: false,
        };
        assert_eq!(
            choose_families(ProxyMode::Iptables, IpFamily::V4, no_ipv6).unwrap(),
            [IpFamily::V4]
        );
        let error = choose_families(ProxyMode::Iptables, IpFamily::V6, no_ipv6).unwrap_err();
        assert!(
            error.message.contains("no support for primary IP family"),
            "{}",
            error.message
        );
        let neither = Support {
            ipv4: false,
            ipv6: false,
        };
        assert_eq!(
            choose_families(ProxyMode::Iptables, IpFamily::V4, neither)
                .unwrap_err()
                .code,
            1
        );
    }

    fn settings(args: &[&str]) -> Settings {
        let mut all = vec!["kube-proxy-rs", "--manifests=x"];
        all.extend_from_slice(args);
        kpr_config::load(all).unwrap()
    }

    fn node(addresses: &[&str], pod_cidrs: &[&str]) -> NodeFacts {
        let raw: Vec<IpAddr> = addresses.iter().map(|a| a.parse().unwrap()).collect();
        NodeFacts {
            name: "node1".into(),
            ips: NodeIps::detect(&raw, "0.0.0.0"),
            pod_cidrs: pod_cidrs.iter().map(|c| c.parse().unwrap()).collect(),
        }
    }

    fn check(args: &[&str], node: &NodeFacts, families: &[IpFamily]) -> Checked {
        Checked::of(&settings(args), node, families)
    }

    #[test]
    fn cluster_cidrs_only_of_the_other_family_are_fatal_single_stack_only() {
        let v4_node = node(&["10.0.0.5"], &[]);
        let args = [
            "--cluster-cidr=fd00:10:244::/56",
            "--nodeport-addresses=10.0.0.0/8",
        ];
        let single = check(&args, &v4_node, &[IpFamily::V4]);
        assert!(single.fatal, "{single:?}");
        assert_eq!(
            single.errors,
            ["cluster is IPv4-only but clusterCIDRs contains only IPv6 addresses"]
        );
        let dual = check(&args, &v4_node, &[IpFamily::V4, IpFamily::V6]);
        assert!(!dual.fatal, "logged only: {dual:?}");
        assert_eq!(
            dual.errors,
            ["cluster is IPv4-primary but clusterCIDRs contains only IPv6 addresses"]
        );
    }

    #[test]
    fn pod_cidrs_only_of_the_other_family_are_fatal_in_node_cidr_mode() {
        let v4_node = node(&["10.0.0.5"], &["fd00:10:244:1::/64"]);
        let both = [IpFamily::V4, IpFamily::V6];
        let node_cidr = check(
            &["--detect-local-mode=NodeCIDR", "--nodeport-addresses=primary"],
            &v4_node,
            &both,
        );
        assert!(node_cidr.fatal, "{node_cidr:?}");
        let cluster_cidr = check(&["--nodeport-addresses=primary"], &v4_node, &both);
        assert!(!cluster_cidr.fatal);
        assert_eq!(
            cluster_cidr.errors,
            ["cluster is IPv4-primary but node.spec.podCIDRs contains only IPv6 addresses"]
        );
    }

    #[test]
    fn node_port_addresses_that_leave_a_family_open_are_logged() {
        let dual_node = node(&["10.0.0.5", "fd00::5"], &[]);
        let both = [IpFamily::V4, IpFamily::V6];
        let unset = check(&[], &dual_node, &both);
        assert!(
            unset.errors[0].starts_with("nodePortAddresses is unset"),
            "{unset:?}"
        );
        assert!(
            check(&["--nodeport-addresses=primary"], &dual_node, &both)
                .errors
                .is_empty()
        );
        let v4_only = check(
            &[
                "--nodeport-addresses=10.0.0.0/8",
                "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56",
            ],
            &dual_node,
            &both,
        );
        assert_eq!(
            v4_only.errors,
            [
                "cluster appears to be dual-stack but nodePortAddresses contains only IPv4 addresses; \
              NodePort connections will be accepted on all local IPv6 IPs"
            ]
        );
        let wrong = check(&["--nodeport-addresses=fd00::/64"], &dual_node, &both);
        assert!(
            wrong.errors[0].starts_with("cluster appears to be IPv4-primary"),
            "{wrong:?}"
        );
        assert!(!wrong.fatal);
    }

    #[test]
    fn server_addresses_of_the_missing_family_are_logged_single_stack() {
        let v4_node = node(&["10.0.0.5"], &[]);
        let args = [
            "--nodeport-addresses=primary",
            "--healthz-bind-address=[fd00::5]:10256",
        ];
        let single = check(&args, &v4_node, &[IpFamily::V4]);
        assert_eq!(
            single.errors,
            ["cluster is IPv4-only but healthzBindAddress is IPv6"]
        );
        assert!(
            check(&args, &v4_node, &[IpFamily::V4, IpFamily::V6])
                .errors
                .is_empty()
        );
        assert_eq!(bind_address_family("[::]:10256"), None);
        assert_eq!(bind_address_family("127.0.0.1:10249"), Some(IpFamily::V4));
    }

    #[test]
    fn only_nftables_uses_service_cidrs() {
        assert!(!uses_service_cidrs(ProxyMode::Userspace) && !uses_service_cidrs(ProxyMode::Ipvs));
        assert!(uses_service_cidrs(ProxyMode::Nftables) && !uses_service_cidrs(ProxyMode::Iptables));
    }
}
