//! kube-proxy's command-line flags, named as upstream, plus our `--manifests` and `--dry-run`.
//!
//! Every setting flag is an `Option`: `None` means "not on the command line", so a flag left
//! alone never overrides the config file. Booleans follow Go's pflag: `--masquerade-all`,
//! `--masquerade-all=true` and `--masquerade-all=false` all work, and a bare boolean flag
//! never swallows the next argument. Lists are comma-separated and may be repeated.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::path::PathBuf;

use clap::{ArgAction, Parser};

use crate::duration::GoDuration;

#[derive(Clone, Debug, Default, Parser)]
#[command(
    name = "kube-proxy",
    version,
    about = "The Kubernetes network proxy (kube-proxy-rs): programs Services into the node's packet filter."
)]
pub struct Flags {
    // === General ===
    /// The path to the configuration file (KubeProxyConfiguration, YAML or JSON).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Write the effective configuration to this file and exit.
    #[arg(long, value_name = "FILE")]
    pub write_config_to: Option<PathBuf>,
    /// Clean up iptables, ipvs and nftables rules left by kube-proxy, then exit.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub cleanup: Option<bool>,
    /// Do the initialization that needs full root privileges, then exit.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub init_only: Option<bool>,
    /// Feature gates as key=value pairs, comma-separated (e.g. "A=true,B=false").
    #[arg(long, value_name = "KEY=BOOL,...", action = ArgAction::Append, value_parser = parse_feature_gates)]
    pub feature_gates: Vec<BTreeMap<String, bool>>,
    /// Path to a kubeconfig file with authorization and API server location.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<String>,
    /// The address of the Kubernetes API server (overrides any value in kubeconfig).
    #[arg(long, value_name = "URL")]
    pub master: Option<String>,
    /// The name of this Node, instead of the hostname.
    #[arg(long, value_name = "NAME")]
    pub hostname_override: Option<String>,
    /// Overrides the node's primary IP (no socket is bound to it). [default: 0.0.0.0]
    #[arg(long, value_name = "IP")]
    pub bind_address: Option<String>,
    /// Treat a failure to bind the healthz or metrics port as fatal.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub bind_address_hard_fail: Option<bool>,
    /// Which proxy mode to use: iptables (default), nftables, ipvs or userspace.
    #[arg(long, value_name = "MODE")]
    pub proxy_mode: Option<String>,
    /// How to detect local traffic: ClusterCIDR (default), NodeCIDR, BridgeInterface, InterfaceNamePrefix.
    #[arg(long, value_name = "MODE")]
    pub detect_local_mode: Option<String>,
    /// Log verbosity level.
    #[arg(short = 'v', long = "v", value_name = "LEVEL")]
    pub v: Option<u32>,
    /// Sets the log format: "text" (default) or "json" (component-base's JSON lines).
    #[arg(long, value_name = "FORMAT")]
    pub logging_format: Option<String>,
    /// Enable profiling on the metrics server (/debug/pprof).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub profiling: Option<bool>,
    /// The previous minor version (e.g. 1.34) for which to show hidden metrics.
    #[arg(long, value_name = "VERSION")]
    pub show_hidden_metrics_for_version: Option<String>,

    // === API client ===
    /// Content type of requests sent to the API server. [default: application/vnd.kubernetes.protobuf]
    #[arg(long, value_name = "TYPE")]
    pub kube_api_content_type: Option<String>,
    /// QPS to use while talking with the API server. [default: 5]
    #[arg(long, value_name = "QPS", allow_negative_numbers = true)]
    pub kube_api_qps: Option<f32>,
    /// Burst to use while talking with the API server. [default: 10]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub kube_api_burst: Option<i32>,
    /// How often configuration from the API server is refreshed. [default: 15m0s]
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub config_sync_period: Option<GoDuration>,

    // === Servers ===
    /// IP:port of the health check server; empty disables it. [default: 0.0.0.0:10256]
    #[arg(long, value_name = "IP:PORT")]
    pub healthz_bind_address: Option<String>,
    /// IP:port of the metrics server; empty disables it. [default: 127.0.0.1:10249]
    #[arg(long, value_name = "IP:PORT")]
    pub metrics_bind_address: Option<String>,

    // === iptables ===
    /// The fwmark bit marking packets that need SNAT, 0-31. [default: 14]
    #[arg(long, value_name = "BIT", allow_negative_numbers = true)]
    pub iptables_masquerade_bit: Option<i32>,
    /// SNAT all traffic sent to Service cluster IPs.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub masquerade_all: Option<bool>,
    /// Allow NodePorts on localhost (iptables mode, IPv4 only). [default: true]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub iptables_localhost_nodeports: Option<bool>,
    /// Interval of full resyncs (iptables and nftables modes). [default: 30s]
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub iptables_sync_period: Option<GoDuration>,
    /// Minimum interval between syncs; 0 syncs on every change (iptables and nftables modes). [default: 1s]
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub iptables_min_sync_period: Option<GoDuration>,

    // === ipvs ===
    /// Interval of full resyncs in ipvs mode. [default: 30s]
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub ipvs_sync_period: Option<GoDuration>,
    /// Minimum interval between syncs in ipvs mode.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub ipvs_min_sync_period: Option<GoDuration>,
    /// The ipvs scheduler. [default: rr]
    #[arg(long, value_name = "NAME")]
    pub ipvs_scheduler: Option<String>,
    /// CIDRs the ipvs proxier must not touch when cleaning up, comma-separated.
    #[arg(long = "ipvs-exclude-cidrs", value_name = "CIDR,...", action = ArgAction::Append, value_delimiter = ',')]
    pub ipvs_exclude_cidrs: Option<Vec<String>>,
    /// Set arp_ignore=1 and arp_announce=2.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub ipvs_strict_arp: Option<bool>,
    /// Idle timeout of ipvs TCP connections; 0 leaves it as is.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub ipvs_tcp_timeout: Option<GoDuration>,
    /// Timeout of ipvs TCP connections after a FIN; 0 leaves it as is.
    #[arg(
        long = "ipvs-tcpfin-timeout",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub ipvs_tcpfin_timeout: Option<GoDuration>,
    /// Timeout of ipvs UDP packets; 0 leaves it as is.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub ipvs_udp_timeout: Option<GoDuration>,

    // === Local traffic ===
    /// The pods' CIDR range, or a comma-separated dual-stack pair.
    #[arg(long = "cluster-cidr", value_name = "CIDR[,CIDR]")]
    pub cluster_cidr: Option<String>,
    /// Bridge interface whose traffic is local (detect-local-mode BridgeInterface).
    #[arg(long, value_name = "NAME")]
    pub pod_bridge_interface: Option<String>,
    /// Interface name prefix whose traffic is local (detect-local-mode InterfaceNamePrefix).
    #[arg(long, value_name = "PREFIX")]
    pub pod_interface_name_prefix: Option<String>,

    // === NodePorts and process ===
    /// CIDRs of node IPs that accept NodePorts, or 'primary'; comma-separated.
    #[arg(long = "nodeport-addresses", value_name = "CIDR,...", action = ArgAction::Append, value_delimiter = ',')]
    pub nodeport_addresses: Option<Vec<String>>,
    /// The oom-score-adj of the process, -1000..1000. [default: -999]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub oom_score_adj: Option<i32>,

    // === conntrack ===
    /// Conntrack entries per CPU core; 0 leaves the limit as is. [default: 32768]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub conntrack_max_per_core: Option<i32>,
    /// Minimum conntrack entries, whatever conntrack-max-per-core says. [default: 131072]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub conntrack_min: Option<i32>,
    /// Idle timeout of established TCP connections; 0 leaves it as is. [default: 24h0m0s]
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub conntrack_tcp_timeout_established: Option<GoDuration>,
    /// NAT timeout of TCP connections in CLOSE_WAIT. [default: 1h0m0s]
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub conntrack_tcp_timeout_close_wait: Option<GoDuration>,
    /// Set nf_conntrack_tcp_be_liberal to 1.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub conntrack_tcp_be_liberal: Option<bool>,
    /// Idle timeout of UNREPLIED UDP entries; 0 leaves it as is.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub conntrack_udp_timeout: Option<GoDuration>,
    /// Idle timeout of ASSURED UDP entries; 0 leaves it as is.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub conntrack_udp_timeout_stream: Option<GoDuration>,

    // === userspace ===
    /// Host ports the userspace proxy's listeners may use: "MIN-MAX", "PORT" or "BASE+OFFSET" (inclusive); blank lets the kernel pick.
    #[arg(long, value_name = "RANGE")]
    pub proxy_port_range: Option<String>,
    /// How long an idle UDP session is kept open (userspace mode). [default: 250ms]
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub udp_timeout: Option<GoDuration>,

    // === kube-proxy-rs only ===
    /// Read Services and EndpointSlices from this file or directory instead of the API server (repeatable).
    #[arg(long, value_name = "PATH", action = ArgAction::Append)]
    pub manifests: Vec<PathBuf>,
    /// Print the ruleset that would be applied, then exit.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub dry_run: Option<bool>,
    /// NodePorts a manifest may use, as the API server's flag: "MIN-MAX" or one port (manifest source only). [default: 30000-32767]
    #[arg(long, value_name = "MIN-MAX", value_parser = parse_port_range)]
    pub service_node_port_range: Option<RangeInclusive<u16>>,
    /// Userspace mode: TCP connections carried at once (both IP families together); more are refused (logged once, counted). [default: 32000, lowered to fit the open-file limit]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub userspace_max_connections: Option<u32>,
    /// Userspace mode: UDP client sessions held at once (both IP families together); datagrams that would open more are dropped. [default: 16000, lowered to fit the open-file limit]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub userspace_max_udp_sessions: Option<u32>,
    /// ebpf mode: the cgroup v2 directory whose processes' connections the socket programs translate. [default: the node's cgroup v2 root, mounted at /run/kube-proxy-rs/cgroupv2 when none is]
    #[arg(long, value_name = "PATH")]
    pub cgroup_root: Option<PathBuf>,
    /// ebpf mode: the bpffs directory its maps and links are pinned in (a restart adopts them there). [default: /sys/fs/bpf/kube-proxy-rs]
    #[arg(long, value_name = "PATH")]
    pub ebpf_pin_root: Option<PathBuf>,
    /// ebpf mode: how many Service addresses (cluster IPs, NodePorts on each node address, external and load-balancer IPs, per port) its map holds; a cluster needing more is refused at start-up. [default: 524288]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub ebpf_max_service_addresses: Option<u32>,
    /// ebpf mode: how many endpoint slots (each endpoint once per Service port) a sync may program; the map holds twice as many, for an adopting restart. [default: 1048576]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..(1 << 30)))]
    pub ebpf_max_endpoint_slots: Option<u32>,
    /// Largest manifest file read; a larger one is rejected and what it defined before is kept. [default: 134217728 (128 MiB)]
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    pub manifests_max_file_bytes: Option<u64>,
}

/// Go's `strconv.ParseBool`, which pflag uses for boolean flags.
pub fn parse_go_bool(text: &str) -> Result<bool, String> {
    match text {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("{text:?} is not a boolean (use true or false)")),
    }
}

/// The API server's `--service-node-port-range` syntax (apimachinery's `PortRange`):
/// "MIN-MAX", inclusive at both ends, or a single port; surrounding spaces are ignored. Unlike
/// upstream, a blank range is refused: it would make every nodePort invalid.
pub fn parse_port_range(text: &str) -> Result<RangeInclusive<u16>, String> {
    let text = text.trim();
    let port = |part: &str| {
        part.trim()
            .parse::<u16>()
            .map_err(|_| format!("{part:?} is not a port number (0-65535); use MIN-MAX, e.g. 30000-32767"))
    };
    if text.is_empty() {
        return Err("must not be empty; use MIN-MAX, e.g. 30000-32767".into());
    }
    let Some((low, high)) = text.split_once('-') else {
        let single = port(text)?;
        return Ok(single..=single);
    };
    let (low, high) = (port(low)?, port(high)?);
    if high < low {
        return Err(format!("end port {high} is below start port {low}"));
    }
    Ok(low..=high)
}

/// `portRange` / `--proxy-port-range` as upstream's userspace proxy read it (apimachinery's
/// `PortRange`): "MIN-MAX" or "BASE+OFFSET", both inclusive at both ends, or one port;
/// blank (`None`) leaves the choice to the kernel.
pub fn proxy_port_range(text: &str) -> Result<Option<RangeInclusive<u16>>, String> {
    let port = |part: &str| {
        part.trim()
            .parse::<u16>()
            .map_err(|_| format!("{part:?} is not a port number (0-65535)"))
    };
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let (low, high) = if let Some((low, high)) = text.split_once('-') {
        (port(low)?, port(high)?)
    } else if let Some((base, offset)) = text.split_once('+') {
        let base = port(base)?;
        let high = base
            .checked_add(port(offset)?)
            .ok_or_else(|| format!("{text:?} goes beyond port 65535"))?;
        (base, high)
    } else {
        let single = port(text)?;
        (single, single)
    };
    if high < low {
        return Err(format!("end port {high} is below start port {low}"));
    }
    Ok(Some(low..=high))
}

/// Upstream's `MapStringBool` flag value: "A=true,B=false"; blank is an empty map.
pub fn parse_feature_gates(text: &str) -> Result<BTreeMap<String, bool>, String> {
    let mut gates = BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("missing bool value for {pair:?} (use {pair}=true)"))?;
        let value = parse_go_bool(value.trim()).map_err(|e| format!("invalid value of {name}: {e}"))?;
        gates.insert(name.trim().to_string(), value);
    }
    Ok(gates)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Flags {
        Flags::try_parse_from(std::iter::once("kube-proxy").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn command_definition_is_consistent() {
        use clap::CommandFactory;
        Flags::command().debug_assert();
    }

    #[test]
    fn go_style_booleans() {
        assert_eq!(parse(&["--masquerade-all"]).masquerade_all, Some(true));
        assert_eq!(parse(&["--masquerade-all=true"]).masquerade_all, Some(true));
        assert_eq!(parse(&["--masquerade-all=false"]).masquerade_all, Some(false));
        assert_eq!(parse(&["--masquerade-all=0"]).masquerade_all, Some(false));
        assert_eq!(parse(&[]).masquerade_all, None);
        // A bare boolean does not take the next argument as its value.
        let flags = parse(&["--cleanup", "--v=4"]);
        assert_eq!((flags.cleanup, flags.v), (Some(true), Some(4)));
        assert!(Flags::try_parse_from(["kube-proxy", "--masquerade-all=yes"]).is_err());
    }

    #[test]
    fn verbosity_short_and_long() {
        assert_eq!(parse(&["-v", "3"]).v, Some(3));
        assert_eq!(parse(&["-v=3"]).v, Some(3));
        assert_eq!(parse(&["--v=5"]).v, Some(5));
        assert_eq!(parse(&["--v", "2"]).v, Some(2));
    }

    #[test]
    fn lists_are_comma_separated_and_repeatable() {
        let flags = parse(&[
            "--nodeport-addresses",
            "10.0.0.0/8,fd00::/64",
            "--nodeport-addresses=192.168.0.0/16",
        ]);
        assert_eq!(
            flags.nodeport_addresses.unwrap(),
            ["10.0.0.0/8", "fd00::/64", "192.168.0.0/16"]
        );
        let flags = parse(&["--cluster-cidr", "10.0.0.0/8,fd00::/48"]);
        assert_eq!(flags.cluster_cidr.as_deref(), Some("10.0.0.0/8,fd00::/48"));
        let flags = parse(&["--ipvs-exclude-cidrs=10.1.0.0/16,10.2.0.0/16"]);
        assert_eq!(flags.ipvs_exclude_cidrs.unwrap().len(), 2);
    }

    #[test]
    fn durations_numbers_and_negative_values() {
        let flags = parse(&[
            "--iptables-sync-period=1m",
            "--conntrack-tcp-timeout-established",
            "12h",
            "--oom-score-adj",
            "-500",
            "--iptables-min-sync-period",
            "-1s",
        ]);
        assert_eq!(flags.iptables_sync_period, Some(GoDuration::from_mins(1)));
        assert_eq!(
            flags.conntrack_tcp_timeout_established,
            Some(GoDuration::from_hours(12))
        );
        assert_eq!(flags.oom_score_adj, Some(-500));
        assert_eq!(flags.iptables_min_sync_period, Some(GoDuration::from_secs(-1)));
        let err = Flags::try_parse_from(["kube-proxy", "--iptables-sync-period=30"]).unwrap_err();
        assert!(err.to_string().contains("iptables-sync-period"), "{err}");
    }

    #[test]
    fn feature_gates_merge_across_repeats() {
        let flags = parse(&["--feature-gates=A=true,B=false", "--feature-gates", "C=1"]);
        let merged: BTreeMap<_, _> = flags.feature_gates.into_iter().flatten().collect();
        assert_eq!(merged.len(), 3);
        assert!(!merged["B"]);
        assert!(parse_feature_gates("A").is_err());
        assert!(parse_feature_gates("A=maybe").is_err());
        assert!(parse_feature_gates("").unwrap().is_empty());
    }

    #[test]
    fn our_own_flags() {
        let flags = parse(&["--manifests", "a.yaml", "--manifests=dir/", "--dry-run"]);
        assert_eq!(flags.manifests, [PathBuf::from("a.yaml"), PathBuf::from("dir/")]);
        assert_eq!(flags.dry_run, Some(true));
    }

    #[test]
    fn proxy_port_range_as_upstreams_userspace_proxy_reads_it() {
        assert_eq!(proxy_port_range(" "), Ok(None));
        assert_eq!(proxy_port_range("30000-30010"), Ok(Some(30000..=30010)));
        assert_eq!(proxy_port_range("30000+10"), Ok(Some(30000..=30010)));
        assert_eq!(proxy_port_range("30000"), Ok(Some(30000..=30000)));
        assert!(proxy_port_range("30010-30000").is_err());
        assert!(proxy_port_range("65535+1").is_err());
        assert!(proxy_port_range("a-b").is_err());
        let flags = parse(&["--proxy-port-range=40000-40100", "--udp-timeout=1s"]);
        assert_eq!(flags.proxy_port_range.as_deref(), Some("40000-40100"));
        assert_eq!(flags.udp_timeout, Some(GoDuration::from_secs(1)));
    }

    #[test]
    fn node_port_range_as_the_api_server_reads_it() {
        assert_eq!(
            parse(&["--service-node-port-range=20000-22767"]).service_node_port_range,
            Some(20000..=22767)
        );
        assert_eq!(
            parse(&["--service-node-port-range", " 30080 "]).service_node_port_range,
            Some(30080..=30080)
        );
        assert_eq!(parse(&[]).service_node_port_range, None);
        for (bad, why) in [
            ("32767-30000", "below start port"),
            ("30000-70000", "not a port number"),
            ("abc", "not a port number"),
            ("30000-", "not a port number"),
            ("", "must not be empty"),
        ] {
            assert!(parse_port_range(bad).unwrap_err().contains(why), "{bad:?}");
            let err = Flags::try_parse_from(["kube-proxy", &format!("--service-node-port-range={bad}")])
                .unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad:?}");
            assert!(err.to_string().contains("--service-node-port-range"), "{err}");
        }
    }

    #[test]
    fn manifest_file_cap_is_a_positive_byte_count() {
        let flags = parse(&["--manifests-max-file-bytes=1048576"]);
        assert_eq!(flags.manifests_max_file_bytes, Some(1_048_576));
        for bad in ["0", "-1", "1MiB", ""] {
            let err = Flags::try_parse_from(["kube-proxy", &format!("--manifests-max-file-bytes={bad}")])
                .unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad:?}");
            assert!(err.to_string().contains("--manifests-max-file-bytes"), "{err}");
        }
    }

    #[test]
    fn unknown_flag_is_a_usage_error() {
        let err = Flags::try_parse_from(["kube-proxy", "--proxy-mod=iptables"]).unwrap_err();
        assert!(err.use_stderr());
        assert_eq!(err.exit_code(), 2);
    }
}
