//! Upstream's defaulting, applied after decoding a file and before flags.
//!
//! Upstream fills a field when it is absent (pointer fields) or still at its Go zero value
//! (plain fields). That has visible consequences we keep on purpose: `iptables.minSyncPeriod:
//! 0s` in a file becomes 1s, and an empty `healthzBindAddress` in a file becomes the default
//! address (only the flag can disable the server). The platform defaults (mode, detect-local
//! mode, nftables NodePort addresses) run last, after flags, as upstream's Linux build does.

use std::net::IpAddr;

use crate::duration::GoDuration;
use crate::hostport::{append_port_if_needed, is_ipv4_like};
use crate::mode::ProxyMode;
use crate::types::{API_VERSION, KIND, KubeProxyConfiguration};

pub const HEALTHZ_PORT: u16 = 10256;
pub const METRICS_PORT: u16 = 10249;
/// `qos.KubeProxyOOMScoreAdj`.
pub const OOM_SCORE_ADJ: i32 = -999;
pub const MASQUERADE_BIT: i32 = 14;
/// nftables mode's default `minSyncPeriod`: upstream's is 1 s, inherited from iptables mode,
/// whose every sync rewrites the whole ruleset. Here a sync after a change writes only what
/// changed (about 0.1 ms of kernel time), so a 1 s window only delays every change by up
/// to a second. 10 ms still coalesces a rollout's bursts (at most 100 syncs a second)
/// while a change is programmed within milliseconds (BENCHMARKS.md, churn). A deliberate
/// difference (docs/configuration.md); a value set in the file or by flag is used as given.
pub const NFTABLES_MIN_SYNC_PERIOD: GoDuration = GoDuration::from_millis(10);
pub const PROTOBUF_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// The `nodePortAddresses` keyword for the node's primary IPs.
pub const NODE_PORT_ADDRESSES_PRIMARY: &str = "primary";
/// The `nodePortAddresses` keyword for the loopback addresses (1.37).
pub const NODE_PORT_ADDRESSES_LOCALHOST: &str = "localhost";
/// The `nodePortAddresses` keyword for every address (1.37).
pub const NODE_PORT_ADDRESSES_ALL: &str = "all";
/// Every `nodePortAddresses` keyword; each may be mixed with the others and with CIDRs.
pub const NODE_PORT_ADDRESS_KEYWORDS: [&str; 3] = [
    NODE_PORT_ADDRESSES_PRIMARY,
    NODE_PORT_ADDRESSES_LOCALHOST,
    NODE_PORT_ADDRESSES_ALL,
];

/// upstream's `SetDefaults_KubeProxyConfiguration`.
pub fn apply_defaults(config: &mut KubeProxyConfiguration) {
    config.api_version = API_VERSION.to_string();
    config.kind = KIND.to_string();
    default_addresses(config);
    config.oom_score_adj.get_or_insert(OOM_SCORE_ADJ);
    default_iptables(config);
    default_if_zero(&mut config.ipvs.sync_period, GoDuration::from_secs(30));
    default_nftables(config);
    default_conntrack(config);
    default_if_zero(&mut config.config_sync_period, GoDuration::from_mins(15));
    default_if_zero(&mut config.udp_idle_timeout, GoDuration::from_millis(250));
    default_client_connection(config);
    default_logging(&mut config.logging);
}

/// upstream's Linux `platformApplyDefaults`, run after flags.
pub fn apply_platform_defaults(config: &mut KubeProxyConfiguration) {
    if config.mode.is_empty() {
        config.mode = "iptables".to_string();
    }
    let no_node_port_addresses = config.node_port_addresses.as_ref().is_none_or(Vec::is_empty);
    let mode_default = ProxyMode::parse(&config.mode)
        .ok()
        .and_then(ProxyMode::default_node_port_addresses);
    if let Some(default) = mode_default.filter(|_| no_node_port_addresses) {
        config.node_port_addresses = Some(vec![default.to_string()]);
    }
    if config.detect_local_mode.is_empty() {
        config.detect_local_mode = "ClusterCIDR".to_string();
    }
}

fn default_addresses(config: &mut KubeProxyConfiguration) {
    if config.bind_address.is_empty() {
        config.bind_address = "0.0.0.0".to_string();
    }
    // Upstream picks IPv6 defaults for anything that is not IPv4, invalid text included.
    let ipv4 = config.bind_address.parse::<IpAddr>().is_ok_and(is_ipv4_like);
    let (healthz_host, metrics_host) = if ipv4 {
        ("0.0.0.0", "127.0.0.1")
    } else {
        ("::", "::1")
    };
    default_bind_address(&mut config.healthz_bind_address, healthz_host, HEALTHZ_PORT);
    default_bind_address(&mut config.metrics_bind_address, metrics_host, METRICS_PORT);
}

fn default_bind_address(address: &mut String, default_host: &str, port: u16) {
    let current = if address.is_empty() {
        default_host
    } else {
        address.as_str()
    };
    *address = append_port_if_needed(current, port);
}

fn default_iptables(config: &mut KubeProxyConfiguration) {
    let iptables = &mut config.iptables;
    iptables.masquerade_bit.get_or_insert(MASQUERADE_BIT);
    iptables.localhost_node_ports.get_or_insert(true);
    default_if_zero(&mut iptables.sync_period, GoDuration::from_secs(30));
    default_if_zero(&mut iptables.min_sync_period, GoDuration::from_secs(1));
}

fn default_nftables(config: &mut KubeProxyConfiguration) {
    let nftables = &mut config.nftables;
    nftables.masquerade_bit.get_or_insert(MASQUERADE_BIT);
    default_if_zero(&mut nftables.sync_period, GoDuration::from_secs(30));
    default_if_zero(&mut nftables.min_sync_period, NFTABLES_MIN_SYNC_PERIOD);
}

fn default_conntrack(config: &mut KubeProxyConfiguration) {
    let conntrack = &mut config.conntrack;
    conntrack.max_per_core.get_or_insert(32 * 1024);
    conntrack.min.get_or_insert(128 * 1024);
    conntrack
        .tcp_established_timeout
        .get_or_insert(GoDuration::from_hours(24));
    conntrack
        .tcp_close_wait_timeout
        .get_or_insert(GoDuration::from_hours(1));
}

fn default_client_connection(config: &mut KubeProxyConfiguration) {
    let client = &mut config.client_connection;
    if client.content_type.is_empty() {
        client.content_type = PROTOBUF_CONTENT_TYPE.to_string();
    }
    if client.qps == 0.0 {
        client.qps = 5.0;
    }
    if client.burst == 0 {
        client.burst = 10;
    }
}

/// component-base's recommended logging settings, for the keys the file left out.
fn default_logging(logging: &mut serde_json::Map<String, serde_json::Value>) {
    logging
        .entry("format")
        .or_insert_with(|| serde_json::Value::from("text"));
    logging
        .entry("flushFrequency")
        .or_insert_with(|| serde_json::Value::from("5s"));
    logging
        .entry("verbosity")
        .or_insert_with(|| serde_json::Value::from(0));
}

fn default_if_zero(value: &mut GoDuration, default: GoDuration) {
    if value.is_zero() {
        *value = default;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_upstream() {
        let c = KubeProxyConfiguration::default();
        assert_eq!(c.api_version, "kubeproxy.config.k8s.io/v1alpha1");
        assert_eq!(c.kind, "KubeProxyConfiguration");
        assert_eq!(c.bind_address, "0.0.0.0");
        assert_eq!(c.healthz_bind_address, "0.0.0.0:10256");
        assert_eq!(c.metrics_bind_address, "127.0.0.1:10249");
        assert_eq!(c.oom_score_adj, Some(-999));
        assert_eq!(c.iptables.masquerade_bit, Some(14));
        assert!(!c.iptables.masquerade_all);
        assert_eq!(c.iptables.localhost_node_ports, Some(true));
        assert_eq!(c.iptables.sync_period.to_string(), "30s");
        assert_eq!(c.iptables.min_sync_period.to_string(), "1s");
        assert_eq!(c.ipvs.sync_period.to_string(), "30s");
        assert_eq!(c.ipvs.min_sync_period, GoDuration::ZERO);
        assert_eq!(c.ipvs.scheduler, "");
        assert_eq!(c.nftables.masquerade_bit, Some(14));
        assert_eq!(c.nftables.sync_period.to_string(), "30s");
        assert_eq!(c.nftables.min_sync_period.to_string(), "10ms");
        assert_eq!(c.conntrack.max_per_core, Some(32768));
        assert_eq!(c.conntrack.min, Some(131072));
        assert_eq!(
            c.conntrack.tcp_established_timeout.unwrap().to_string(),
            "24h0m0s"
        );
        assert_eq!(c.conntrack.tcp_close_wait_timeout.unwrap().to_string(), "1h0m0s");
        assert_eq!(c.conntrack.udp_timeout, GoDuration::ZERO);
        assert!(!c.conntrack.tcp_be_liberal);
        assert_eq!(c.config_sync_period.to_string(), "15m0s");
        assert_eq!(
            c.udp_idle_timeout.to_string(),
            "250ms",
            "upstream's udpIdleTimeout"
        );
        assert_eq!(
            c.client_connection.content_type,
            "application/vnd.kubernetes.protobuf"
        );
        assert_eq!(c.client_connection.qps, 5.0);
        assert_eq!(c.client_connection.burst, 10);
        assert_eq!(c.mode, "iptables");
        assert_eq!(c.detect_local_mode, "ClusterCIDR");
        assert_eq!(c.node_port_addresses, None);
        assert_eq!(c.cluster_cidr, "");
        assert!(c.feature_gates.is_empty());
        assert_eq!(c.logging["verbosity"], 0);
    }

    #[test]
    fn ipv6_bind_address_moves_server_defaults_to_ipv6() {
        let mut c = KubeProxyConfiguration::zero();
        c.bind_address = "fd00::1".to_string();
        apply_defaults(&mut c);
        assert_eq!(c.healthz_bind_address, "[::]:10256");
        assert_eq!(c.metrics_bind_address, "[::1]:10249");
    }

    #[test]
    fn bare_ip_server_addresses_get_default_ports() {
        let mut c = KubeProxyConfiguration::zero();
        c.healthz_bind_address = "127.0.0.1".to_string();
        c.metrics_bind_address = "0.0.0.0".to_string();
        apply_defaults(&mut c);
        assert_eq!(c.healthz_bind_address, "127.0.0.1:10256");
        assert_eq!(c.metrics_bind_address, "0.0.0.0:10249");
    }

    #[test]
    fn explicit_zero_pointer_fields_stay_zero() {
        let mut c = KubeProxyConfiguration::zero();
        c.conntrack.max_per_core = Some(0);
        c.iptables.masquerade_bit = Some(0);
        c.iptables.localhost_node_ports = Some(false);
        apply_defaults(&mut c);
        assert_eq!(c.conntrack.max_per_core, Some(0));
        assert_eq!(c.iptables.masquerade_bit, Some(0));
        assert_eq!(c.iptables.localhost_node_ports, Some(false));
    }

    #[test]
    fn nftables_mode_defaults_node_ports_to_primary() {
        let mut c = KubeProxyConfiguration::zero();
        c.mode = "nftables".to_string();
        apply_defaults(&mut c);
        apply_platform_defaults(&mut c);
        assert_eq!(c.node_port_addresses, Some(vec!["primary".to_string()]));
    }
}
