//! `KubeProxyConfiguration` (kubeproxy.config.k8s.io/v1alpha1), field for field as upstream.
//!
//! Operators hand us the same ConfigMap they give upstream kube-proxy, so every field keeps
//! upstream's JSON name, its Go zero value when absent, and upstream's pointer-ness (`Option`
//! here: absent or `null` means "use the default", while an explicit 0 stays 0). The
//! [`Default`] of [`KubeProxyConfiguration`] is the fully defaulted configuration upstream
//! starts from; the section types' own `Default` is the Go zero value used while decoding.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

use crate::duration::GoDuration;

pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
pub const KIND: &str = "KubeProxyConfiguration";
/// The key `/configz` files the configuration under.
pub const GROUP_NAME: &str = "kubeproxy.config.k8s.io";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default = "KubeProxyConfiguration::zero", rename_all = "camelCase")]
pub struct KubeProxyConfiguration {
    pub api_version: String,
    pub kind: String,
    #[serde(
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub feature_gates: BTreeMap<String, bool>,
    pub client_connection: ClientConnectionConfiguration,
    /// Upstream's component-base logging options, kept as they came (we only read `verbosity`).
    #[serde(deserialize_with = "null_as_default")]
    pub logging: serde_json::Map<String, serde_json::Value>,
    pub hostname_override: String,
    pub bind_address: String,
    pub healthz_bind_address: String,
    pub metrics_bind_address: String,
    pub bind_address_hard_fail: bool,
    pub enable_profiling: bool,
    pub show_hidden_metrics_for_version: String,
    pub mode: String,
    pub iptables: KubeProxyIPTablesConfiguration,
    pub ipvs: KubeProxyIPVSConfiguration,
    pub nftables: KubeProxyNFTablesConfiguration,
    /// Windows only; accepted so upstream-written files load, otherwise unused.
    pub winkernel: KubeProxyWinkernelConfiguration,
    pub detect_local_mode: String,
    pub detect_local: DetectLocalConfiguration,
    /// One CIDR or a comma-separated dual-stack pair, as upstream.
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: String,
    pub node_port_addresses: Option<Vec<String>>,
    pub oom_score_adj: Option<i32>,
    pub conntrack: KubeProxyConntrackConfiguration,
    pub config_sync_period: GoDuration,
    /// Userspace mode: the host ports its listeners may use (`a-b`, `a`, `a+n`; blank: any
    /// port the kernel picks). See [`crate::proxy_port_range`].
    pub port_range: String,
    /// Userspace mode: how long a UDP session lives without traffic (upstream's
    /// `udpIdleTimeout`, default 250ms).
    pub udp_idle_timeout: GoDuration,
    /// Windows only; accepted so upstream-written files load.
    #[serde(skip_serializing_if = "is_false")]
    pub windows_run_as_service: bool,
    /// ebpf mode (kube-proxy-rs only, like the mode): left out of what is written while
    /// unset, so an upstream configuration round-trips unchanged.
    #[serde(skip_serializing_if = "KubeProxyEbpfConfiguration::is_unset")]
    pub ebpf: KubeProxyEbpfConfiguration,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ClientConnectionConfiguration {
    pub kubeconfig: String,
    pub accept_content_types: String,
    pub content_type: String,
    /// Negative disables client-side rate limiting (client-go semantics).
    pub qps: f32,
    pub burst: i32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct KubeProxyIPTablesConfiguration {
    pub masquerade_bit: Option<i32>,
    pub masquerade_all: bool,
    pub localhost_node_ports: Option<bool>,
    pub sync_period: GoDuration,
    pub min_sync_period: GoDuration,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct KubeProxyIPVSConfiguration {
    pub sync_period: GoDuration,
    pub min_sync_period: GoDuration,
    /// Empty means round robin ("rr").
    pub scheduler: String,
    #[serde(rename = "excludeCIDRs")]
    pub exclude_cidrs: Option<Vec<String>>,
    #[serde(rename = "strictARP")]
    pub strict_arp: bool,
    pub tcp_timeout: GoDuration,
    pub tcp_fin_timeout: GoDuration,
    pub udp_timeout: GoDuration,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct KubeProxyNFTablesConfiguration {
    pub masquerade_bit: Option<i32>,
    pub masquerade_all: bool,
    pub sync_period: GoDuration,
    pub min_sync_period: GoDuration,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct KubeProxyWinkernelConfiguration {
    pub network_name: String,
    pub source_vip: String,
    #[serde(rename = "enableDSR")]
    pub enable_dsr: bool,
    pub root_hns_endpoint_name: String,
    pub forward_health_check_vip: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct DetectLocalConfiguration {
    pub bridge_interface: String,
    pub interface_name_prefix: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct KubeProxyConntrackConfiguration {
    /// 0 leaves the limit as it is (and ignores `min`).
    pub max_per_core: Option<i32>,
    pub min: Option<i32>,
    pub tcp_established_timeout: Option<GoDuration>,
    pub tcp_close_wait_timeout: Option<GoDuration>,
    pub tcp_be_liberal: bool,
    /// 0 leaves the kernel's value.
    pub udp_timeout: GoDuration,
    pub udp_stream_timeout: GoDuration,
}

/// ebpf mode's section (kube-proxy-rs only; each field has a flag of its own, which wins).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct KubeProxyEbpfConfiguration {
    /// `--cgroup-root`: the cgroup v2 directory whose processes' connections are translated
    /// (blank: the node's cgroup v2 root).
    pub cgroup_root: String,
    /// `--ebpf-pin-root`: the bpffs directory the maps and links are pinned in (blank:
    /// `/sys/fs/bpf/kube-proxy-rs`).
    pub pin_root: String,
    /// `--ebpf-max-service-addresses`: entries of the Service map (cluster IPs, NodePorts on
    /// each node address, external and load-balancer IPs, per port and protocol); unset:
    /// 524288.
    pub max_service_addresses: Option<u32>,
    /// `--ebpf-max-endpoint-slots`: endpoint slots one sync may program (an endpoint once per
    /// Service address set it is in); the map holds twice as many, for an adopting restart.
    /// Unset: 1048576.
    pub max_endpoint_slots: Option<u32>,
}

impl KubeProxyEbpfConfiguration {
    pub fn is_unset(&self) -> bool {
        *self == Self::default()
    }
}

impl KubeProxyConfiguration {
    /// What decoding `{}` gives before defaulting: Go's zero value of every field.
    pub fn zero() -> Self {
        Self {
            api_version: String::new(),
            kind: String::new(),
            feature_gates: BTreeMap::new(),
            client_connection: ClientConnectionConfiguration::default(),
            logging: serde_json::Map::new(),
            hostname_override: String::new(),
            bind_address: String::new(),
            healthz_bind_address: String::new(),
            metrics_bind_address: String::new(),
            bind_address_hard_fail: false,
            enable_profiling: false,
            show_hidden_metrics_for_version: String::new(),
            mode: String::new(),
            iptables: KubeProxyIPTablesConfiguration::default(),
            ipvs: KubeProxyIPVSConfiguration::default(),
            nftables: KubeProxyNFTablesConfiguration::default(),
            winkernel: KubeProxyWinkernelConfiguration::default(),
            detect_local_mode: String::new(),
            detect_local: DetectLocalConfiguration::default(),
            cluster_cidr: String::new(),
            node_port_addresses: None,
            oom_score_adj: None,
            conntrack: KubeProxyConntrackConfiguration::default(),
            config_sync_period: GoDuration::ZERO,
            port_range: String::new(),
            udp_idle_timeout: GoDuration::ZERO,
            windows_run_as_service: false,
            ebpf: KubeProxyEbpfConfiguration::default(),
        }
    }

    /// The configuration as JSON, e.g. for `/configz`.
    pub fn to_json_value(&self) -> serde_json::Value {
        // Every field is a plain string, number, bool, list or map: this cannot fail.
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

impl Default for KubeProxyConfiguration {
    /// Upstream's defaults (v1alpha1 defaulting plus the Linux platform defaults).
    fn default() -> Self {
        let mut config = Self::zero();
        crate::defaults::apply_defaults(&mut config);
        crate::defaults::apply_platform_defaults(&mut config);
        config
    }
}

/// Go leaves a field at its zero value when the document says `null`; serde would reject it.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

fn is_false(value: &bool) -> bool {
    !value
}
