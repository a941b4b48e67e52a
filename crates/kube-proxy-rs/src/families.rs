//! Which IP families a proxy serves, and the configuration checked against them.
//!
//! Families follow upstream's decision (`platformCheckSupported` and the dual-stack
//! proxier): a proxy runs both families whenever the host can program both, whatever the
//! node's addresses, and only its primary family (the node IP's, see kpr-host's `NodeIps`)
//! otherwise; a host that cannot program the primary family is an error. Upstream's checks
//! of the configuration against the families come with it ([`check_config`]).

use ipnet::IpNet;
use kpr_config::{LocalMode, Settings};
use kpr_host::{NodeFacts, NodePortAddresses};
use kpr_mode::{Fatal, Mode};
use kpr_model::IpFamily;

/// Upstream's order of the families a dual-stack proxy serves: the primary one first.
const BOTH: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

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

impl Support {
    /// What `mode` can program on this host.
    pub fn of(mode: &dyn Mode) -> Self {
        Self {
            ipv4: mode.supports(IpFamily::V4),
            ipv6: mode.supports(IpFamily::V6),
        }
    }
}

/// The families to run, the primary one first: both when the host supports both, else the
/// primary family alone; an error when it cannot program the primary family.
pub fn choose_families(mode: &dyn Mode, primary: IpFamily, support: Support) -> Result<Vec<IpFamily>, Fatal> {
    if !support.ipv4 && !support.ipv6 {
        return Err(Fatal::runtime(format!(
            "{} mode is not available on this host: for neither IP family {}",
            mode.name(),
            mode.requirement()
        )));
    }
    if !support.has(primary) {
        return Err(Fatal::runtime(format!(
            "no support for primary IP family {:?} in {} mode: not on this host: {}",
            primary.label(),
            mode.name(),
            mode.requirement()
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

/// `nodePortAddresses` as CIDRs, its keywords expanded as the backends expand them (empty:
/// every address).
fn node_port_cidrs(settings: &Settings, node: &NodeFacts) -> Vec<IpNet> {
    let entries = settings.config.node_port_addresses.as_deref().unwrap_or_default();
    match kpr_host::nodeport_addresses(entries, node) {
        Ok(NodePortAddresses::Cidrs(cidrs)) => cidrs,
        Ok(NodePortAddresses::All) | Err(_) => Vec::new(),
    }
}

/// The primary family's detector of local traffic detects nothing: logged as upstream does.
pub fn log_missing_primary_detector(settings: &Settings, node: &NodeFacts) {
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

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use kpr_host::NodeIps;

    const BOTH_SUPPORTED: Support = Support {
        ipv4: true,
        ipv6: true,
    };

    #[test]
    fn both_families_run_whenever_the_host_supports_both() {
        assert_eq!(
            choose_families(&kpr_iptables::IptablesMode, IpFamily::V4, BOTH_SUPPORTED).unwrap(),
            [IpFamily::V4, IpFamily::V6]
        );
        assert_eq!(
            choose_families(&kpr_iptables::IptablesMode, IpFamily::V6, BOTH_SUPPORTED).unwrap(),
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
            choose_families(&kpr_iptables::IptablesMode, IpFamily::V4, no_ipv6).unwrap(),
            [IpFamily::V4]
        );
        let error = choose_families(&kpr_iptables::IptablesMode, IpFamily::V6, no_ipv6).unwrap_err();
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
            choose_families(&kpr_iptables::IptablesMode, IpFamily::V4, neither)
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
}
