//! From command line to effective settings: defaults <- config file <- explicit flags.
//!
//! Note on precedence: upstream ignores most flags when `--config` is given (only `-v` and
//! `--hostname-override` still apply). We apply every flag that is explicitly on the command
//! line on top of the file instead, and a flag left alone never overrides the file, so any
//! command line upstream accepts gives the same result unless it combines both.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use clap::Parser;

use crate::defaults::{HEALTHZ_PORT, METRICS_PORT, apply_defaults, apply_platform_defaults};
use crate::error::{ConfigError, FieldError, Origin};
use crate::file::{Strictness, read_config_file};
use crate::flags::Flags;
use crate::gates::FeatureGates;
use crate::hostport::append_port_if_needed;
use crate::logging::LogFormat;
use crate::mode::{LocalMode, ProxyMode};
use crate::types::KubeProxyConfiguration;
use crate::validate::validate;

/// Everything the binary needs to run, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// The effective configuration (what `--write-config-to` writes and `/configz` shows).
    pub config: KubeProxyConfiguration,
    pub mode: ProxyMode,
    pub local_mode: LocalMode,
    /// `--config`, if given.
    pub config_file: Option<PathBuf>,
    pub write_config_to: Option<PathBuf>,
    pub cleanup: bool,
    pub init_only: bool,
    pub dry_run: bool,
    /// `--manifests` paths (files or directories), in command-line order.
    pub manifests: Vec<PathBuf>,
    /// `--service-node-port-range`: the nodePorts the manifest source accepts, as the API
    /// server's flag of that name; `None` leaves the source's default (30000-32767). Not part
    /// of `KubeProxyConfiguration`, like `--manifests`.
    pub service_node_port_range: Option<RangeInclusive<u16>>,
    /// `--manifests-max-file-bytes`: larger manifest files are rejected, their last good
    /// contents kept; `None` leaves the source's default (128 MiB).
    pub manifests_max_file_bytes: Option<u64>,
    /// `--userspace-max-connections` / `--userspace-max-udp-sessions`: userspace mode's
    /// bounds; `None` leaves the mode's defaults. Not part of `KubeProxyConfiguration`.
    pub userspace_max_connections: Option<u32>,
    pub userspace_max_udp_sessions: Option<u32>,
    /// `--cgroup-root` (else the file's `ebpf.cgroupRoot`): the cgroup v2 directory ebpf
    /// mode attaches to; `None` is the node's cgroup v2 root.
    pub cgroup_root: Option<PathBuf>,
    /// `--ebpf-pin-root` (else `ebpf.pinRoot`): where ebpf mode pins its maps and links;
    /// `None` is `/sys/fs/bpf/kube-proxy-rs`.
    pub ebpf_pin_root: Option<PathBuf>,
    /// `--master`: overrides the API server address from the kubeconfig.
    pub master: Option<String>,
    /// The `-v` level (from the flag, else the file's `logging.verbosity`).
    pub verbosity: u32,
    /// `--logging-format`, else the file's `logging.format`.
    pub log_format: LogFormat,
    /// Things worth logging once logging is up (e.g. unknown fields in the config file).
    pub warnings: Vec<String>,
    /// The feature gates, as configured.
    pub gates: FeatureGates,
    /// No mode was configured: upstream 1.37 warns that the default will change.
    pub mode_defaulted: bool,
}

impl Settings {
    /// `--kubeconfig` or `clientConnection.kubeconfig`; `None` when blank.
    pub fn kubeconfig(&self) -> Option<&Path> {
        let path = &self.config.client_connection.kubeconfig;
        (!path.is_empty()).then(|| Path::new(path))
    }
}

/// Parses `args` (program name first) and returns the validated settings.
pub fn load<I, T>(args: I) -> Result<Settings, ConfigError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let flags = Flags::try_parse_from(args)?;
    settings_from_flags(flags)
}

/// The same as [`load`] for flags already parsed.
pub fn settings_from_flags(flags: Flags) -> Result<Settings, ConfigError> {
    let (mut config, warnings) = match &flags.config {
        Some(path) => config_from_file(path)?,
        None => (KubeProxyConfiguration::zero(), Vec::new()),
    };
    apply_defaults(&mut config);
    let origins = apply_flags(&flags, &mut config)?;
    let mode_defaulted = config.mode.is_empty();
    apply_platform_defaults(&mut config);
    check(&config, &origins, flags.config.as_deref())?;
    // Validation guarantees these parse.
    let mode = config.proxy_mode().unwrap_or(ProxyMode::Iptables);
    let local_mode = config.local_mode().unwrap_or(LocalMode::ClusterCidr);
    let gates = FeatureGates::new(&config.feature_gates);
    let mut warnings = warnings;
    let cgroup_root = non_blank_path(&config.ebpf.cgroup_root);
    let ebpf_pin_root = non_blank_path(&config.ebpf.pin_root);
    warnings.extend(
        gates
            .ignored()
            .map(|name| format!("feature gate {name:?}: not one kube-proxy-rs acts on; ignored")),
    );
    Ok(Settings {
        gates,
        mode_defaulted,
        verbosity: config.verbosity(),
        log_format: config.log_format().unwrap_or_default(),
        config,
        mode,
        local_mode,
        config_file: flags.config,
        write_config_to: flags.write_config_to,
        cleanup: flags.cleanup.unwrap_or(false),
        init_only: flags.init_only.unwrap_or(false),
        dry_run: flags.dry_run.unwrap_or(false),
        manifests: flags.manifests,
        service_node_port_range: flags.service_node_port_range,
        manifests_max_file_bytes: flags.manifests_max_file_bytes,
        userspace_max_connections: flags.userspace_max_connections,
        userspace_max_udp_sessions: flags.userspace_max_udp_sessions,
        cgroup_root,
        ebpf_pin_root,
        master: flags.master.filter(|m| !m.is_empty()),
        warnings,
    })
}

fn non_blank_path(text: &str) -> Option<PathBuf> {
    (!text.trim().is_empty()).then(|| PathBuf::from(text))
}

fn config_from_file(path: &Path) -> Result<(KubeProxyConfiguration, Vec<String>), ConfigError> {
    let decoded = read_config_file(path, Strictness::Lenient)?;
    let warnings = if decoded.unknown_fields.is_empty() {
        Vec::new()
    } else {
        vec![format!(
            "config file {}: ignoring unknown field(s) {} (decoded leniently, as upstream does for v1alpha1)",
            path.display(),
            decoded.unknown_fields.join(", ")
        )]
    };
    Ok((decoded.config, warnings))
}

fn check(
    config: &KubeProxyConfiguration,
    origins: &FlagOrigins,
    file: Option<&Path>,
) -> Result<(), ConfigError> {
    let mut errors = validate(config);
    if errors.is_empty() {
        return Ok(());
    }
    for error in &mut errors {
        error.origin = match (origins.flag_for(error.base_field()), file) {
            (Some(flag), _) => Origin::Flag(flag),
            (None, Some(path)) => Origin::File(path.to_path_buf()),
            (None, None) => Origin::Default,
        };
    }
    Err(ConfigError::Invalid(errors))
}

/// Which config fields were set by which flag, so errors can name the flag.
#[derive(Debug, Default)]
struct FlagOrigins(Vec<(&'static str, &'static str)>);

impl FlagOrigins {
    /// Records that `flag` set `field` and hands the value through.
    fn given<T>(&mut self, value: Option<T>, flag: &'static str, fields: &[&'static str]) -> Option<T> {
        if value.is_some() {
            self.0.extend(fields.iter().map(|field| (*field, flag)));
        }
        value
    }

    fn flag_for(&self, field: &str) -> Option<&'static str> {
        self.0
            .iter()
            .rev()
            .find(|(f, _)| *f == field)
            .map(|(_, flag)| *flag)
    }
}

/// Applies the flags that are on the command line; the others leave `config` alone.
fn apply_flags(flags: &Flags, config: &mut KubeProxyConfiguration) -> Result<FlagOrigins, ConfigError> {
    let mut origins = FlagOrigins::default();
    apply_general_flags(flags, config, &mut origins)?;
    apply_client_and_server_flags(flags, config, &mut origins);
    apply_iptables_flags(flags, config, &mut origins);
    apply_ipvs_flags(flags, config, &mut origins);
    apply_local_traffic_flags(flags, config, &mut origins);
    apply_conntrack_flags(flags, config, &mut origins);
    apply_userspace_flags(flags, config, &mut origins);
    apply_ebpf_flags(flags, config, &mut origins);
    Ok(origins)
}

fn apply_general_flags(
    flags: &Flags,
    config: &mut KubeProxyConfiguration,
    origins: &mut FlagOrigins,
) -> Result<(), ConfigError> {
    let gates: BTreeMap<String, bool> = flags
        .feature_gates
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    config.feature_gates.extend(gates);
    if let Some(mode) = origins.given(flags.proxy_mode.clone(), "proxy-mode", &["mode"]) {
        config.mode = mode;
    }
    if let Some(mode) = origins.given(
        flags.detect_local_mode.clone(),
        "detect-local-mode",
        &["detectLocalMode"],
    ) {
        config.detect_local_mode = mode;
    }
    if let Some(name) = flags.hostname_override.as_deref().filter(|n| !n.is_empty()) {
        config.hostname_override = hostname_override(name)?;
    }
    if let Some(ip) = origins.given(flags.bind_address.clone(), "bind-address", &["bindAddress"]) {
        config.bind_address = ip;
    }
    if let Some(hard) = flags.bind_address_hard_fail {
        config.bind_address_hard_fail = hard;
    }
    if let Some(level) = origins.given(flags.v, "v", &["logging.verbosity"]) {
        config.logging.insert("verbosity".into(), level.into());
    }
    let format = flags.logging_format.clone();
    if let Some(format) = origins.given(format, "logging-format", &["logging.format"]) {
        config.logging.insert("format".into(), format.into());
    }
    if let Some(on) = flags.profiling {
        config.enable_profiling = on;
    }
    let version = flags.show_hidden_metrics_for_version.clone();
    let fields = ["showHiddenMetricsForVersion"];
    if let Some(version) = origins.given(version, "show-hidden-metrics-for-version", &fields) {
        config.show_hidden_metrics_for_version = version;
    }
    Ok(())
}

/// Upstream trims and lowercases the flag; a name of only spaces is an error.
fn hostname_override(name: &str) -> Result<String, ConfigError> {
    let trimmed = name.trim();
    if trimmed.is_empty() {
        let mut error = FieldError::new("hostnameOverride", name, "empty hostname-override is invalid");
        error.origin = Origin::Flag("hostname-override");
        return Err(ConfigError::Invalid(vec![error]));
    }
    Ok(trimmed.to_lowercase())
}

fn apply_client_and_server_flags(
    flags: &Flags,
    config: &mut KubeProxyConfiguration,
    origins: &mut FlagOrigins,
) {
    let client = &mut config.client_connection;
    if let Some(path) = flags.kubeconfig.clone() {
        client.kubeconfig = path;
    }
    let content_type = flags.kube_api_content_type.clone();
    if let Some(content_type) = origins.given(
        content_type,
        "kube-api-content-type",
        &["clientConnection.contentType"],
    ) {
        client.content_type = content_type;
    }
    if let Some(qps) = origins.given(flags.kube_api_qps, "kube-api-qps", &["clientConnection.qps"]) {
        client.qps = qps;
    }
    if let Some(burst) = origins.given(
        flags.kube_api_burst,
        "kube-api-burst",
        &["clientConnection.burst"],
    ) {
        client.burst = burst;
    }
    let period = flags.config_sync_period;
    if let Some(period) = origins.given(period, "config-sync-period", &["configSyncPeriod"]) {
        config.config_sync_period = period;
    }
    let healthz = flags.healthz_bind_address.as_deref();
    if let Some(address) = origins.given(healthz, "healthz-bind-address", &["healthzBindAddress"]) {
        config.healthz_bind_address = server_address(address, HEALTHZ_PORT);
    }
    let metrics = flags.metrics_bind_address.as_deref();
    if let Some(address) = origins.given(metrics, "metrics-bind-address", &["metricsBindAddress"]) {
        config.metrics_bind_address = server_address(address, METRICS_PORT);
    }
}

/// A bare IP gets the server's default port, as upstream; blank stays blank (no server).
fn server_address(address: &str, port: u16) -> String {
    match address.trim() {
        "" => String::new(),
        address => append_port_if_needed(address, port),
    }
}

fn apply_iptables_flags(flags: &Flags, config: &mut KubeProxyConfiguration, origins: &mut FlagOrigins) {
    let bit = flags.iptables_masquerade_bit;
    if let Some(bit) = origins.given(bit, "iptables-masquerade-bit", &["iptables.masqueradeBit"]) {
        config.iptables.masquerade_bit = Some(bit);
    }
    // Upstream keeps one masqueradeAll and one pair of sync periods for iptables and nftables
    // modes alike; setting both sections gives the same effective value whatever the mode.
    if let Some(all) = flags.masquerade_all {
        config.iptables.masquerade_all = all;
        config.nftables.masquerade_all = all;
    }
    if let Some(on) = flags.iptables_localhost_nodeports {
        config.iptables.localhost_node_ports = Some(on);
    }
    let fields = ["iptables.syncPeriod", "nftables.syncPeriod"];
    if let Some(period) = origins.given(flags.iptables_sync_period, "iptables-sync-period", &fields) {
        config.iptables.sync_period = period;
        config.nftables.sync_period = period;
    }
    let fields = [
        "iptables.minSyncPeriod",
        "nftables.minSyncPeriod",
        "iptables.syncPeriod",
        "nftables.syncPeriod",
    ];
    let min_period = flags.iptables_min_sync_period;
    if let Some(period) = origins.given(min_period, "iptables-min-sync-period", &fields) {
        config.iptables.min_sync_period = period;
        config.nftables.min_sync_period = period;
    }
}

fn apply_ipvs_flags(flags: &Flags, config: &mut KubeProxyConfiguration, origins: &mut FlagOrigins) {
    let ipvs = &mut config.ipvs;
    if let Some(period) = origins.given(flags.ipvs_sync_period, "ipvs-sync-period", &["ipvs.syncPeriod"]) {
        ipvs.sync_period = period;
    }
    let fields = ["ipvs.minSyncPeriod", "ipvs.syncPeriod"];
    if let Some(period) = origins.given(flags.ipvs_min_sync_period, "ipvs-min-sync-period", &fields) {
        ipvs.min_sync_period = period;
    }
    if let Some(scheduler) = flags.ipvs_scheduler.clone() {
        ipvs.scheduler = scheduler;
    }
    let cidrs = flags.ipvs_exclude_cidrs.as_ref().map(|c| non_blank(c));
    if let Some(cidrs) = origins.given(cidrs, "ipvs-exclude-cidrs", &["ipvs.excludeCIDRs"]) {
        ipvs.exclude_cidrs = Some(cidrs);
    }
    if let Some(strict) = flags.ipvs_strict_arp {
        ipvs.strict_arp = strict;
    }
    for (value, flag, field, target) in [
        (
            flags.ipvs_tcp_timeout,
            "ipvs-tcp-timeout",
            "ipvs.tcpTimeout",
            &mut ipvs.tcp_timeout,
        ),
        (
            flags.ipvs_tcpfin_timeout,
            "ipvs-tcpfin-timeout",
            "ipvs.tcpFinTimeout",
            &mut ipvs.tcp_fin_timeout,
        ),
        (
            flags.ipvs_udp_timeout,
            "ipvs-udp-timeout",
            "ipvs.udpTimeout",
            &mut ipvs.udp_timeout,
        ),
    ] {
        if let Some(timeout) = origins.given(value, flag, &[field]) {
            *target = timeout;
        }
    }
}

fn apply_local_traffic_flags(flags: &Flags, config: &mut KubeProxyConfiguration, origins: &mut FlagOrigins) {
    if let Some(cidrs) = origins.given(flags.cluster_cidr.clone(), "cluster-cidr", &["clusterCIDR"]) {
        config.cluster_cidr = cidrs;
    }
    let bridge = flags.pod_bridge_interface.clone();
    if let Some(bridge) = origins.given(bridge, "pod-bridge-interface", &["detectLocal.bridgeInterface"]) {
        config.detect_local.bridge_interface = bridge;
    }
    let prefix = flags.pod_interface_name_prefix.clone();
    let fields = ["detectLocal.interfaceNamePrefix"];
    if let Some(prefix) = origins.given(prefix, "pod-interface-name-prefix", &fields) {
        config.detect_local.interface_name_prefix = prefix;
    }
    let addresses = flags.nodeport_addresses.as_ref().map(|a| non_blank(a));
    if let Some(addresses) = origins.given(addresses, "nodeport-addresses", &["nodePortAddresses"]) {
        config.node_port_addresses = Some(addresses);
    }
    if let Some(adj) = origins.given(flags.oom_score_adj, "oom-score-adj", &["oomScoreAdj"]) {
        config.oom_score_adj = Some(adj);
    }
}

fn apply_userspace_flags(flags: &Flags, config: &mut KubeProxyConfiguration, origins: &mut FlagOrigins) {
    let range = flags.proxy_port_range.clone();
    if let Some(range) = origins.given(range, "proxy-port-range", &["portRange"]) {
        config.port_range = range;
    }
    let timeout = flags.udp_timeout;
    if let Some(timeout) = origins.given(timeout, "udp-timeout", &["udpIdleTimeout"]) {
        config.udp_idle_timeout = timeout;
    }
}

fn apply_ebpf_flags(flags: &Flags, config: &mut KubeProxyConfiguration, origins: &mut FlagOrigins) {
    let ebpf = &mut config.ebpf;
    let root = flags.cgroup_root.as_ref().map(|p| p.display().to_string());
    if let Some(root) = origins.given(root, "cgroup-root", &["ebpf.cgroupRoot"]) {
        ebpf.cgroup_root = root;
    }
    let pins = flags.ebpf_pin_root.as_ref().map(|p| p.display().to_string());
    if let Some(pins) = origins.given(pins, "ebpf-pin-root", &["ebpf.pinRoot"]) {
        ebpf.pin_root = pins;
    }
    let services = flags.ebpf_max_service_addresses;
    let field = ["ebpf.maxServiceAddresses"];
    if let Some(n) = origins.given(services, "ebpf-max-service-addresses", &field) {
        ebpf.max_service_addresses = Some(n);
    }
    let slots = flags.ebpf_max_endpoint_slots;
    if let Some(n) = origins.given(slots, "ebpf-max-endpoint-slots", &["ebpf.maxEndpointSlots"]) {
        ebpf.max_endpoint_slots = Some(n);
    }
}

fn apply_conntrack_flags(flags: &Flags, config: &mut KubeProxyConfiguration, origins: &mut FlagOrigins) {
    let ct = &mut config.conntrack;
    let per_core = flags.conntrack_max_per_core;
    if let Some(n) = origins.given(per_core, "conntrack-max-per-core", &["conntrack.maxPerCore"]) {
        ct.max_per_core = Some(n);
    }
    if let Some(n) = origins.given(flags.conntrack_min, "conntrack-min", &["conntrack.min"]) {
        ct.min = Some(n);
    }
    for (value, flag, field, target) in [
        (
            flags.conntrack_tcp_timeout_established,
            "conntrack-tcp-timeout-established",
            "conntrack.tcpEstablishedTimeout",
            &mut ct.tcp_established_timeout,
        ),
        (
            flags.conntrack_tcp_timeout_close_wait,
            "conntrack-tcp-timeout-close-wait",
            "conntrack.tcpCloseWaitTimeout",
            &mut ct.tcp_close_wait_timeout,
        ),
    ] {
        if let Some(timeout) = origins.given(value, flag, &[field]) {
            *target = Some(timeout);
        }
    }
    if let Some(liberal) = flags.conntrack_tcp_be_liberal {
        ct.tcp_be_liberal = liberal;
    }
    for (value, flag, field, target) in [
        (
            flags.conntrack_udp_timeout,
            "conntrack-udp-timeout",
            "conntrack.udpTimeout",
            &mut ct.udp_timeout,
        ),
        (
            flags.conntrack_udp_timeout_stream,
            "conntrack-udp-timeout-stream",
            "conntrack.udpStreamTimeout",
            &mut ct.udp_stream_timeout,
        ),
    ] {
        if let Some(timeout) = origins.given(value, flag, &[field]) {
            *target = timeout;
        }
    }
}

/// pflag's string slices turn `--flag=""` into an empty list, not a list of one blank.
fn non_blank(values: &[String]) -> Vec<String> {
    values
        .iter()
        .filter(|v| !v.trim().is_empty())
        .map(|v| v.trim().to_string())
        .collect()
}

#[cfg(test)]
#[path = "load_tests.rs"]
mod tests;
