//! Upstream's configuration validation, with errors that name the field and the reason.
//!
//! The rules follow upstream's `pkg/proxy/apis/config/validation`: mode-specific sections are
//! only checked for the active mode, an empty healthz or metrics address disables that
//! server, and a negative QPS is allowed (client-go reads it as "no client-side limit").
//! Feature-gate names are not checked: we do not carry upstream's list of gates.

use std::net::IpAddr;

use ipnet::IpNet;
use kpr_model::text::InterfaceName;

use crate::defaults::NODE_PORT_ADDRESS_KEYWORDS;
use crate::duration::GoDuration;
use crate::effective::{Section, split_list};
use crate::error::FieldError;
use crate::hostport::check_ip_port;
use crate::logging::{SUPPORTED, UnknownLogFormat};
use crate::mode::{LocalMode, ProxyMode};
use crate::types::KubeProxyConfiguration;

/// Every problem found, in field order; empty when the configuration is valid.
pub fn validate(config: &KubeProxyConfiguration) -> Vec<FieldError> {
    let mut errors = Errors::default();
    validate_mode(config, &mut errors);
    validate_sync_periods(config, &mut errors);
    validate_masquerade_bits(config, &mut errors);
    if config.proxy_mode() == Ok(ProxyMode::Ipvs) {
        validate_ipvs(config, &mut errors);
    }
    validate_conntrack(config, &mut errors);
    validate_process_and_client(config, &mut errors);
    validate_addresses(config, &mut errors);
    validate_node_port_addresses(config, &mut errors);
    validate_detect_local(config, &mut errors);
    validate_misc(config, &mut errors);
    validate_ebpf(config, &mut errors);
    errors.0
}

/// ebpf mode's map sizes: at least one entry; endpoint slots below 2^30 (the map holds
/// twice as many, and the kernel's limit is a u32).
fn validate_ebpf(config: &KubeProxyConfiguration, errors: &mut Errors) {
    let ebpf = &config.ebpf;
    if let Some(n) = ebpf.max_service_addresses {
        errors.check(n >= 1, "ebpf.maxServiceAddresses", n, "must be at least 1");
    }
    if let Some(n) = ebpf.max_endpoint_slots {
        let ok = (1..1 << 30).contains(&n);
        errors.check(ok, "ebpf.maxEndpointSlots", n, "must be between 1 and 1073741823");
    }
}

#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn check(&mut self, ok: bool, field: impl Into<String>, value: impl std::fmt::Display, reason: &str) {
        if !ok {
            self.0.push(FieldError::new(field, value, reason));
        }
    }

    fn non_negative(&mut self, field: &str, value: GoDuration) {
        self.check(
            !value.is_negative(),
            field,
            value,
            "must be greater than or equal to 0",
        );
    }
}

fn validate_mode(config: &KubeProxyConfiguration, errors: &mut Errors) {
    if let Err(e) = config.proxy_mode() {
        errors.check(false, "mode", &config.mode, &e.to_string());
    }
    if let Err(e) = config.local_mode() {
        errors.check(
            false,
            "detectLocalMode",
            &config.detect_local_mode,
            &e.to_string(),
        );
    }
}

fn validate_sync_periods(config: &KubeProxyConfiguration, errors: &mut Errors) {
    let section = config.section().name();
    let (sync, min_sync) = (config.sync_period(), config.min_sync_period());
    let sync_field = format!("{section}.syncPeriod");
    let min_field = format!("{section}.minSyncPeriod");
    errors.check(sync.as_nanos() > 0, &sync_field, sync, "must be greater than 0");
    errors.non_negative(&min_field, min_sync);
    let reason = format!("must be greater than or equal to {min_field} ({min_sync})");
    errors.check(min_sync <= sync, &sync_field, sync, &reason);
    let period = config.config_sync_period;
    errors.check(
        period.as_nanos() > 0,
        "configSyncPeriod",
        period,
        "must be greater than 0",
    );
}

fn validate_masquerade_bits(config: &KubeProxyConfiguration, errors: &mut Errors) {
    let in_range = |bit: Option<i32>| bit.is_none_or(|b| (0..=31).contains(&b));
    let reason = "must be within the range [0, 31]";
    let shown = |bit: Option<i32>| bit.map_or_else(|| "null".to_string(), |b| b.to_string());
    let iptables_bit = config.iptables.masquerade_bit;
    errors.check(
        in_range(iptables_bit),
        "iptables.masqueradeBit",
        shown(iptables_bit),
        reason,
    );
    if config.section() == Section::Nftables {
        let nftables_bit = config.nftables.masquerade_bit;
        errors.check(
            in_range(nftables_bit),
            "nftables.masqueradeBit",
            shown(nftables_bit),
            reason,
        );
    }
}

fn validate_ipvs(config: &KubeProxyConfiguration, errors: &mut Errors) {
    let ipvs = &config.ipvs;
    errors.non_negative("ipvs.tcpTimeout", ipvs.tcp_timeout);
    errors.non_negative("ipvs.tcpFinTimeout", ipvs.tcp_fin_timeout);
    errors.non_negative("ipvs.udpTimeout", ipvs.udp_timeout);
    for (i, cidr) in ipvs.exclude_cidrs.iter().flatten().enumerate() {
        let ok = cidr.parse::<IpNet>().is_ok();
        errors.check(
            ok,
            format!("ipvs.excludeCIDRs[{i}]"),
            cidr,
            "must be a valid CIDR",
        );
    }
}

fn validate_conntrack(config: &KubeProxyConfiguration, errors: &mut Errors) {
    let ct = &config.conntrack;
    let reason = "must be greater than or equal to 0";
    for (field, value) in [
        ("conntrack.maxPerCore", ct.max_per_core),
        ("conntrack.min", ct.min),
    ] {
        if let Some(value) = value {
            errors.check(value >= 0, field, value, reason);
        }
    }
    if let Some(timeout) = ct.tcp_established_timeout {
        errors.non_negative("conntrack.tcpEstablishedTimeout", timeout);
    }
    if let Some(timeout) = ct.tcp_close_wait_timeout {
        errors.non_negative("conntrack.tcpCloseWaitTimeout", timeout);
    }
    errors.non_negative("conntrack.udpTimeout", ct.udp_timeout);
    errors.non_negative("conntrack.udpStreamTimeout", ct.udp_stream_timeout);
}

fn validate_process_and_client(config: &KubeProxyConfiguration, errors: &mut Errors) {
    if let Some(adj) = config.oom_score_adj {
        let ok = (-1000..=1000).contains(&adj);
        errors.check(ok, "oomScoreAdj", adj, "must be within the range [-1000, 1000]");
    }
    let client = &config.client_connection;
    let burst_reason = "must be greater than or equal to 0";
    errors.check(
        client.burst >= 0,
        "clientConnection.burst",
        client.burst,
        burst_reason,
    );
    let qps_reason = "must be a finite number (negative disables client-side rate limiting)";
    errors.check(
        client.qps.is_finite(),
        "clientConnection.qps",
        client.qps,
        qps_reason,
    );
    match config.logging.get("verbosity") {
        Some(v) if v.as_u64().and_then(|v| u32::try_from(v).ok()).is_none() => {
            errors.check(false, "logging.verbosity", v, "must be a non-negative integer");
        }
        _ => {}
    }
    if let Err(UnknownLogFormat(name)) = config.log_format() {
        let reason = format!("unsupported value; {SUPPORTED}");
        errors.check(false, "logging.format", name, &reason);
    }
}

fn validate_addresses(config: &KubeProxyConfiguration, errors: &mut Errors) {
    let bind_ok = config.bind_address.parse::<IpAddr>().is_ok();
    let reason = "not a valid textual representation of an IP address";
    errors.check(bind_ok, "bindAddress", &config.bind_address, reason);
    for (field, address) in [
        ("healthzBindAddress", &config.healthz_bind_address),
        ("metricsBindAddress", &config.metrics_bind_address),
    ] {
        // Blank disables the server.
        if let Err(reason) = check_ip_port(address)
            .map(|_| ())
            .or_else(|e| blank_ok(address, e))
        {
            errors.check(false, field, address, &reason);
        }
    }
}

fn blank_ok(address: &str, error: String) -> Result<(), String> {
    if address.is_empty() { Ok(()) } else { Err(error) }
}

/// Upstream 1.37 (#138427): CIDRs and the keywords `primary`, `localhost` and `all`, in any
/// mix.
fn validate_node_port_addresses(config: &KubeProxyConfiguration, errors: &mut Errors) {
    let addresses = config.node_port_addresses.as_deref().unwrap_or_default();
    for (i, address) in addresses.iter().enumerate() {
        let ok = NODE_PORT_ADDRESS_KEYWORDS.contains(&address.as_str()) || address.parse::<IpNet>().is_ok();
        errors.check(
            ok,
            format!("nodePortAddresses[{i}]"),
            address,
            "must be a valid CIDR or one of the keywords 'primary', 'localhost' and 'all'",
        );
    }
}

fn validate_detect_local(config: &KubeProxyConfiguration, errors: &mut Errors) {
    let detect = &config.detect_local;
    match config.local_mode() {
        Ok(LocalMode::BridgeInterface) => {
            let reason = "must not be empty when detectLocalMode is BridgeInterface";
            let ok = !detect.bridge_interface.is_empty();
            errors.check(
                ok,
                "detectLocal.bridgeInterface",
                &detect.bridge_interface,
                reason,
            );
            if ok {
                let check = InterfaceName::new(&detect.bridge_interface);
                check_interface(
                    errors,
                    "detectLocal.bridgeInterface",
                    &detect.bridge_interface,
                    check,
                );
            }
        }
        Ok(LocalMode::InterfaceNamePrefix) => {
            let reason = "must not be empty when detectLocalMode is InterfaceNamePrefix";
            let prefix = &detect.interface_name_prefix;
            errors.check(
                !prefix.is_empty(),
                "detectLocal.interfaceNamePrefix",
                prefix,
                reason,
            );
            if !prefix.is_empty() {
                let check = InterfaceName::prefix(prefix);
                check_interface(errors, "detectLocal.interfaceNamePrefix", prefix, check);
            }
        }
        Ok(LocalMode::ClusterCidr) if !config.cluster_cidr.is_empty() => {
            if let Err(reason) = check_cluster_cidrs(&config.cluster_cidr) {
                errors.check(false, "clusterCIDR", &config.cluster_cidr, &reason);
            }
        }
        _ => {}
    }
}

/// The names end up in rule text (`-i <name>`): kpr-naming's check, the one every such
/// string passes, refuses what the kernel or iptables-restore would not take.
fn check_interface(
    errors: &mut Errors,
    field: &str,
    value: &str,
    check: Result<InterfaceName, kpr_model::text::UnsafeText>,
) {
    if let Err(why) = check {
        errors.check(
            false,
            field,
            value.escape_debug(),
            &format!("is not a usable interface name: it {why}"),
        );
    }
}

/// One CIDR, or a dual-stack pair with one CIDR of each family.
fn check_cluster_cidrs(text: &str) -> Result<(), String> {
    let parts: Vec<&str> = split_list(text).collect();
    if parts.len() > 2 {
        return Err(
            "must be a single CIDR or a dual-stack pair (e.g. 10.100.0.0/16,fde4:8dba:82e1::/48)".into(),
        );
    }
    let mut cidrs = Vec::with_capacity(parts.len());
    for part in parts {
        let cidr: IpNet = part
            .parse()
            .map_err(|_| format!("{part:?} is not a valid CIDR block (e.g. 10.100.0.0/16)"))?;
        cidrs.push(cidr);
    }
    if let [a, b] = cidrs.as_slice()
        && matches!(a, IpNet::V4(_)) == matches!(b, IpNet::V4(_))
    {
        return Err("two CIDRs must be one IPv4 and one IPv6 (at most one per family)".into());
    }
    Ok(())
}

fn validate_misc(config: &KubeProxyConfiguration, errors: &mut Errors) {
    let range_ok = crate::flags::proxy_port_range(&config.port_range).is_ok();
    let reason = "must be a valid port range (e.g. 300-2000)";
    errors.check(range_ok, "portRange", &config.port_range, reason);
    let udp = config.udp_idle_timeout;
    let positive = !udp.is_negative() && !udp.is_zero();
    errors.check(positive, "udpIdleTimeout", udp, "must be greater than 0");
    let version = &config.show_hidden_metrics_for_version;
    let reason = "must be <major>.<minor>, e.g. 1.34";
    errors.check(
        valid_minor_version(version),
        "showHiddenMetricsForVersion",
        version,
        reason,
    );
}

fn valid_minor_version(text: &str) -> bool {
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    text.is_empty()
        || text
            .split_once('.')
            .is_some_and(|(major, minor)| numeric(major) && numeric(minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors_for(change: impl FnOnce(&mut KubeProxyConfiguration)) -> Vec<FieldError> {
        let mut config = KubeProxyConfiguration::default();
        change(&mut config);
        validate(&config)
    }

    /// Asserts exactly one error, on `field`, whose reason contains `reason`.
    fn assert_single(errors: &[FieldError], field: &str, reason: &str) {
        assert_eq!(errors.len(), 1, "expected one error on {field}, got {errors:?}");
        assert_eq!(errors[0].field, field);
        assert!(errors[0].reason.contains(reason), "{:?}", errors[0]);
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(validate(&KubeProxyConfiguration::default()), vec![]);
    }

    #[test]
    fn masquerade_bit_range() {
        assert_single(
            &errors_for(|c| c.iptables.masquerade_bit = Some(32)),
            "iptables.masqueradeBit",
            "[0, 31]",
        );
        assert_single(
            &errors_for(|c| c.iptables.masquerade_bit = Some(-1)),
            "iptables.masqueradeBit",
            "[0, 31]",
        );
        assert!(errors_for(|c| c.iptables.masquerade_bit = Some(31)).is_empty());
        assert!(
            errors_for(|c| c.nftables.masquerade_bit = Some(40)).is_empty(),
            "only checked in nftables mode"
        );
        let errors = errors_for(|c| {
            c.mode = "nftables".into();
            c.nftables.masquerade_bit = Some(40);
        });
        assert_single(&errors, "nftables.masqueradeBit", "[0, 31]");
    }

    #[test]
    fn sync_periods_of_the_active_mode() {
        let errors = errors_for(|c| c.iptables.sync_period = GoDuration::ZERO);
        assert_eq!(errors[0].field, "iptables.syncPeriod");
        assert!(errors[0].reason.contains("greater than 0"));
        let errors = errors_for(|c| c.iptables.min_sync_period = GoDuration::from_secs(-1));
        assert_single(&errors, "iptables.minSyncPeriod", "greater than or equal to 0");
        let errors = errors_for(|c| c.iptables.min_sync_period = GoDuration::from_secs(31));
        assert_single(&errors, "iptables.syncPeriod", "iptables.minSyncPeriod");
        assert!(errors_for(|c| c.iptables.min_sync_period = GoDuration::ZERO).is_empty());
        let errors = errors_for(|c| {
            c.mode = "ipvs".into();
            c.ipvs.sync_period = GoDuration::from_secs(-5);
        });
        assert_eq!(errors[0].field, "ipvs.syncPeriod");
        assert!(errors_for(|c| c.ipvs.sync_period = GoDuration::from_secs(-5)).is_empty());
        let errors = errors_for(|c| c.config_sync_period = GoDuration::ZERO);
        assert_single(&errors, "configSyncPeriod", "greater than 0");
    }

    #[test]
    fn ipvs_settings_in_ipvs_mode() {
        let errors = errors_for(|c| {
            c.mode = "ipvs".into();
            c.ipvs.tcp_timeout = GoDuration::from_secs(-1);
            c.ipvs.exclude_cidrs = Some(vec!["10.0.0.0/8".into(), "10.0.0.0/33".into()]);
        });
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(errors[0].field, "ipvs.tcpTimeout");
        assert_eq!(errors[1].field, "ipvs.excludeCIDRs[1]");
    }

    #[test]
    fn conntrack_values_not_negative() {
        let errors = errors_for(|c| {
            c.conntrack.max_per_core = Some(-1);
            c.conntrack.min = Some(-1);
            c.conntrack.tcp_established_timeout = Some(GoDuration::from_secs(-1));
            c.conntrack.tcp_close_wait_timeout = Some(GoDuration::from_secs(-1));
            c.conntrack.udp_timeout = GoDuration::from_secs(-1);
            c.conntrack.udp_stream_timeout = GoDuration::from_secs(-1);
        });
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "conntrack.maxPerCore",
                "conntrack.min",
                "conntrack.tcpEstablishedTimeout",
                "conntrack.tcpCloseWaitTimeout",
                "conntrack.udpTimeout",
                "conntrack.udpStreamTimeout"
            ]
        );
        assert!(errors_for(|c| c.conntrack.max_per_core = Some(0)).is_empty());
    }

    #[test]
    fn oom_score_adj_range() {
        assert_single(
            &errors_for(|c| c.oom_score_adj = Some(1001)),
            "oomScoreAdj",
            "[-1000, 1000]",
        );
        assert_single(
            &errors_for(|c| c.oom_score_adj = Some(-1001)),
            "oomScoreAdj",
            "[-1000, 1000]",
        );
        assert!(errors_for(|c| c.oom_score_adj = Some(-1000)).is_empty());
    }

    #[test]
    fn client_connection_limits() {
        assert_single(
            &errors_for(|c| c.client_connection.burst = -1),
            "clientConnection.burst",
            "greater than or equal to 0",
        );
        assert_single(
            &errors_for(|c| c.client_connection.qps = f32::NAN),
            "clientConnection.qps",
            "finite",
        );
        assert!(
            errors_for(|c| c.client_connection.qps = -1.0).is_empty(),
            "negative QPS means unlimited"
        );
    }

    #[test]
    fn bind_addresses() {
        assert_single(
            &errors_for(|c| c.bind_address = "node1".into()),
            "bindAddress",
            "IP address",
        );
        assert_single(
            &errors_for(|c| c.healthz_bind_address = "0.0.0.0".into()),
            "healthzBindAddress",
            "IP:port",
        );
        assert_single(
            &errors_for(|c| c.metrics_bind_address = "localhost:10249".into()),
            "metricsBindAddress",
            "valid IP",
        );
        assert_single(
            &errors_for(|c| c.metrics_bind_address = "[::1]:0".into()),
            "metricsBindAddress",
            "valid port",
        );
        assert!(
            errors_for(|c| c.healthz_bind_address = String::new()).is_empty(),
            "blank disables"
        );
        assert!(
            errors_for(|c| c.metrics_bind_address = String::new()).is_empty(),
            "blank disables"
        );
        assert!(errors_for(|c| c.metrics_bind_address = "[::]:10249".into()).is_empty());
    }

    #[test]
    fn cluster_cidr_entries() {
        assert!(errors_for(|c| c.cluster_cidr = "10.0.0.0/8".into()).is_empty());
        assert!(errors_for(|c| c.cluster_cidr = "10.0.0.0/8,fd00::/48".into()).is_empty());
        assert_single(
            &errors_for(|c| c.cluster_cidr = "10.0.0.0/8,10.1.0.0/16".into()),
            "clusterCIDR",
            "one per family",
        );
        assert_single(
            &errors_for(|c| c.cluster_cidr = "10.0.0.0".into()),
            "clusterCIDR",
            "not a valid CIDR",
        );
        assert_single(
            &errors_for(|c| c.cluster_cidr = "a/8,b/8,c/8".into()),
            "clusterCIDR",
            "dual-stack pair",
        );
    }

    #[test]
    fn node_port_addresses() {
        let set = |list: &[&str]| {
            let list: Vec<String> = list.iter().map(|s| s.to_string()).collect();
            errors_for(move |c| c.node_port_addresses = Some(list))
        };
        assert!(set(&["primary"]).is_empty());
        assert!(set(&["10.0.0.0/8", "fd00::/64"]).is_empty());
        for mix in [
            &["primary", "localhost"][..],
            &["all", "localhost"],
            &["primary", "10.0.0.0/8"],
            &["0.0.0.0/0", "127.0.0.1/32", "localhost"],
        ] {
            assert!(set(mix).is_empty(), "{mix:?}");
        }
        assert_single(
            &set(&["10.0.0.0/8", "10.0.0.1"]),
            "nodePortAddresses[1]",
            "valid CIDR or one of the keywords",
        );
        let wrong_case = set(&["primary", "Localhost"]);
        assert_single(&wrong_case, "nodePortAddresses[1]", "keywords");
        assert_eq!(wrong_case[0].value, "Localhost");
    }

    #[test]
    fn detect_local_modes_need_their_setting() {
        assert_single(
            &errors_for(|c| c.detect_local_mode = "Bogus".into()),
            "detectLocalMode",
            "ClusterCIDR",
        );
        let errors = errors_for(|c| c.detect_local_mode = "BridgeInterface".into());
        assert_single(&errors, "detectLocal.bridgeInterface", "must not be empty");
        let errors = errors_for(|c| c.detect_local_mode = "InterfaceNamePrefix".into());
        assert_single(&errors, "detectLocal.interfaceNamePrefix", "must not be empty");
        assert!(
            errors_for(|c| {
                c.detect_local_mode = "BridgeInterface".into();
                c.detect_local.bridge_interface = "cbr0".into();
            })
            .is_empty()
        );
        assert!(errors_for(|c| c.detect_local_mode = "NodeCIDR".into()).is_empty());
    }

    #[test]
    fn detect_local_interface_names_must_be_usable_in_rules() {
        let bridge = |name: &str| {
            let name = name.to_string();
            errors_for(move |c| {
                c.detect_local_mode = "BridgeInterface".into();
                c.detect_local.bridge_interface = name;
            })
        };
        assert_single(
            &bridge("br0\n-A X"),
            "detectLocal.bridgeInterface",
            "control character",
        );
        assert_single(&bridge("br 0"), "detectLocal.bridgeInterface", "interface name");
        assert_single(
            &bridge("a-very-long-bridge"),
            "detectLocal.bridgeInterface",
            "at most 15",
        );
        assert!(bridge("cni0").is_empty());
        let prefix = |name: &str| {
            let name = name.to_string();
            errors_for(move |c| {
                c.detect_local_mode = "InterfaceNamePrefix".into();
                c.detect_local.interface_name_prefix = name;
            })
        };
        assert_single(&prefix("veth\""), "detectLocal.interfaceNamePrefix", "quoting");
        assert_single(
            &prefix("fifteen-chars-x"),
            "detectLocal.interfaceNamePrefix",
            "at most 14",
        );
        assert!(prefix("veth").is_empty());
    }

    #[test]
    fn proxy_mode_names() {
        assert_single(
            &errors_for(|c| c.mode = "kernelspace".into()),
            "mode",
            "Windows only",
        );
        assert_single(&errors_for(|c| c.mode = "bpf".into()), "mode", "must be iptables");
        for mode in ["", "iptables", "nftables", "ipvs", "userspace", "ebpf"] {
            assert!(errors_for(|c| c.mode = mode.into()).is_empty(), "{mode}");
        }
    }

    #[test]
    fn misc_formats() {
        assert_single(
            &errors_for(|c| c.port_range = "2000-300".into()),
            "portRange",
            "port range",
        );
        assert!(errors_for(|c| c.port_range = "300-2000".into()).is_empty());
        assert!(errors_for(|c| c.port_range = "300+10".into()).is_empty());
        assert!(!errors_for(|c| c.port_range = "65000+1000".into()).is_empty());
        assert!(!errors_for(|c| c.udp_idle_timeout = GoDuration::ZERO).is_empty());
        assert_single(
            &errors_for(|c| c.show_hidden_metrics_for_version = "v1.3".into()),
            "showHiddenMetricsForVersion",
            "<major>.<minor>",
        );
        assert!(errors_for(|c| c.show_hidden_metrics_for_version = "1.34".into()).is_empty());
        let errors = errors_for(|c| {
            c.logging.insert("verbosity".into(), serde_json::Value::from(-1));
        });
        assert_single(&errors, "logging.verbosity", "non-negative integer");
    }

    #[test]
    fn log_format_is_text_or_json() {
        for good in ["text", "json"] {
            assert!(
                errors_for(|c| {
                    c.logging.insert("format".into(), good.into());
                })
                .is_empty()
            );
        }
        for bad in [
            serde_json::json!("JSON"),
            serde_json::json!("xml"),
            serde_json::json!(1),
        ] {
            let errors = errors_for(|c| {
                c.logging.insert("format".into(), bad);
            });
            assert_single(&errors, "logging.format", "supported values: \"json\", \"text\"");
        }
    }
}
