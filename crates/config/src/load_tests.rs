//! Precedence, validation errors and the write/read round trip, through `load` as the binary
//! calls it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::duration::GoDuration;
use crate::file::write_config_file;

/// A scratch directory removed when the test ends, pass or fail.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("kpr-config-test-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn file(&self, name: &str, body: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, body).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const HEADER: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

fn run(args: &[&str]) -> Result<Settings, ConfigError> {
    load(std::iter::once("kube-proxy").chain(args.iter().copied()))
}

fn with_config(scratch: &Scratch, body: &str, args: &[&str]) -> Result<Settings, ConfigError> {
    let path = scratch.file("config.yaml", &format!("{HEADER}{body}"));
    let path = path.to_str().unwrap().to_string();
    let mut all = vec!["--config", path.as_str()];
    all.extend_from_slice(args);
    run(&all)
}

fn invalid_fields(err: ConfigError) -> Vec<FieldError> {
    match err {
        ConfigError::Invalid(errors) => errors,
        other => panic!("expected validation errors, got {other:?}"),
    }
}

#[test]
fn no_flags_gives_upstream_defaults() {
    let settings = run(&[]).unwrap();
    assert_eq!(settings.config, KubeProxyConfiguration::default());
    assert_eq!(settings.mode, ProxyMode::Iptables);
    assert_eq!(settings.local_mode, LocalMode::ClusterCidr);
    assert_eq!(settings.verbosity, 0);
    assert!(!settings.cleanup && !settings.init_only && !settings.dry_run);
    assert!(settings.manifests.is_empty() && settings.warnings.is_empty());
    assert_eq!(settings.kubeconfig(), None);
}

#[test]
fn file_overrides_defaults() {
    let scratch = Scratch::new();
    let body = "mode: ipvs\nmetricsBindAddress: 0.0.0.0:10249\niptables:\n  masqueradeAll: true\nconntrack:\n  min: 0\n\
                clientConnection:\n  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf\n";
    let settings = with_config(&scratch, body, &[]).unwrap();
    assert_eq!(settings.mode, ProxyMode::Ipvs);
    assert_eq!(settings.config.metrics_bind_address, "0.0.0.0:10249");
    assert!(settings.config.iptables.masquerade_all);
    assert_eq!(settings.config.conntrack.min, Some(0));
    assert_eq!(
        settings.config.conntrack.max_per_core,
        Some(32768),
        "untouched fields keep defaults"
    );
    assert_eq!(
        settings.kubeconfig(),
        Some(Path::new("/var/lib/kube-proxy/kubeconfig.conf"))
    );
}

#[test]
fn explicit_flag_overrides_file() {
    let scratch = Scratch::new();
    let body =
        "mode: ipvs\niptables:\n  masqueradeBit: 10\n  masqueradeAll: true\nconntrack:\n  maxPerCore: 100\n";
    let args = [
        "--proxy-mode=nftables",
        "--iptables-masquerade-bit=14",
        "--masquerade-all=false",
        "--conntrack-max-per-core",
        "0",
    ];
    let settings = with_config(&scratch, body, &args).unwrap();
    assert_eq!(settings.mode, ProxyMode::Nftables);
    assert_eq!(
        settings.config.iptables.masquerade_bit,
        Some(14),
        "a flag equal to the default still overrides the file"
    );
    assert!(!settings.config.masquerade_all());
    assert_eq!(settings.config.conntrack.max_per_core, Some(0));
}

#[test]
fn unset_flag_does_not_override_file() {
    let scratch = Scratch::new();
    let body = "iptables:\n  masqueradeAll: true\n  syncPeriod: 1m0s\nhealthzBindAddress: 127.0.0.1:9999\noomScoreAdj: -100\n";
    let settings = with_config(&scratch, body, &["--v=2", "--conntrack-min=5"]).unwrap();
    assert!(settings.config.iptables.masquerade_all);
    assert_eq!(settings.config.sync_period(), GoDuration::from_mins(1));
    assert_eq!(settings.config.healthz_bind_address, "127.0.0.1:9999");
    assert_eq!(settings.config.oom_score_adj, Some(-100));
    assert_eq!(settings.verbosity, 2);
}

#[test]
fn verbosity_comes_from_file_unless_flagged() {
    let scratch = Scratch::new();
    let body = "logging:\n  verbosity: 4\n  format: json\n";
    assert_eq!(with_config(&scratch, body, &[]).unwrap().verbosity, 4);
    let settings = with_config(&scratch, body, &["-v", "1"]).unwrap();
    assert_eq!(settings.verbosity, 1);
    assert_eq!(
        settings.config.logging["format"], "json",
        "other logging keys are kept"
    );
}

#[test]
fn log_format_comes_from_the_file_unless_flagged() {
    let scratch = Scratch::new();
    assert_eq!(run(&[]).unwrap().log_format, LogFormat::Text);
    let body = "logging:\n  format: json\n";
    assert_eq!(
        with_config(&scratch, body, &[]).unwrap().log_format,
        LogFormat::Json
    );
    let settings = with_config(&scratch, body, &["--logging-format=text"]).unwrap();
    assert_eq!(settings.log_format, LogFormat::Text);
    assert_eq!(settings.config.logging["format"], "text", "what /configz shows");
    assert_eq!(
        run(&["--logging-format", "json"]).unwrap().log_format,
        LogFormat::Json
    );
}

#[test]
fn a_bad_log_format_is_a_usage_error_naming_the_flag_or_the_file() {
    let err = run(&["--logging-format=xml"]).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    let text = err.to_string();
    assert!(
        text.contains("--logging-format") && text.contains("\"xml\""),
        "{text}"
    );
    assert!(text.contains("supported values: \"json\", \"text\""), "{text}");

    let scratch = Scratch::new();
    let err = with_config(&scratch, "logging:\n  format: yaml\n", &[]).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("logging.format") && text.contains("config.yaml"),
        "{text}"
    );
}

#[test]
fn zero_sync_period_in_file_takes_the_default_like_upstream() {
    let scratch = Scratch::new();
    let settings = with_config(&scratch, "iptables:\n  minSyncPeriod: 0s\n", &[]).unwrap();
    assert_eq!(settings.config.min_sync_period(), GoDuration::from_secs(1));
    // The flag, applied after defaulting, can set 0.
    let settings = run(&["--iptables-min-sync-period=0"]).unwrap();
    assert_eq!(settings.config.min_sync_period(), GoDuration::ZERO);
}

#[test]
fn iptables_sync_flags_drive_nftables_mode_too() {
    let settings = run(&[
        "--proxy-mode=nftables",
        "--iptables-sync-period=45s",
        "--masquerade-all",
    ])
    .unwrap();
    assert_eq!(settings.config.sync_period(), GoDuration::from_secs(45));
    assert!(settings.config.masquerade_all());
    assert_eq!(
        settings.config.node_port_addresses,
        Some(vec!["primary".to_string()])
    );
}

#[test]
fn server_address_flags() {
    let settings = run(&["--healthz-bind-address=127.0.0.1", "--metrics-bind-address="]).unwrap();
    assert_eq!(settings.config.healthz_bind_address, "127.0.0.1:10256");
    assert_eq!(
        settings.config.metrics_bind_address, "",
        "blank disables the metrics server"
    );
    let settings = run(&["--metrics-bind-address", "::"]).unwrap();
    assert_eq!(settings.config.metrics_bind_address, "[::]:10249");
}

#[test]
fn hostname_override_is_trimmed_and_lowercased() {
    let settings = run(&["--hostname-override", " Node-1 "]).unwrap();
    assert_eq!(settings.config.hostname_override, "node-1");
    let errors = invalid_fields(run(&["--hostname-override", "   "]).unwrap_err());
    assert_eq!(errors[0].origin, Origin::Flag("hostname-override"));
}

#[test]
fn run_options_are_passed_through() {
    let settings = run(&[
        "--cleanup",
        "--init-only=true",
        "--dry-run",
        "--manifests",
        "a.yaml",
        "--manifests=svc/",
        "--master=https://10.0.0.1:6443",
        "--kubeconfig=/etc/kubeconfig",
        "--write-config-to=/tmp/out.yaml",
    ])
    .unwrap();
    assert!(settings.cleanup && settings.init_only && settings.dry_run);
    assert_eq!(
        settings.manifests,
        [PathBuf::from("a.yaml"), PathBuf::from("svc/")]
    );
    assert_eq!(settings.master.as_deref(), Some("https://10.0.0.1:6443"));
    assert_eq!(settings.kubeconfig(), Some(Path::new("/etc/kubeconfig")));
    assert_eq!(settings.write_config_to, Some(PathBuf::from("/tmp/out.yaml")));
}

#[test]
fn feature_gates_from_flags_merge_over_file() {
    let scratch = Scratch::new();
    let body = "featureGates:\n  A: true\n  B: true\n";
    let settings = with_config(&scratch, body, &["--feature-gates=B=false,C=true"]).unwrap();
    let gates: Vec<(&str, bool)> = settings
        .config
        .feature_gates
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    assert_eq!(gates, [("A", true), ("B", false), ("C", true)]);
}

#[test]
fn validation_error_names_the_flag() {
    let err = run(&["--iptables-masquerade-bit=40"]).unwrap_err();
    assert!(err.is_usage());
    assert_eq!(err.exit_code(), 2);
    let text = err.to_string();
    assert!(text.contains("--iptables-masquerade-bit"), "{text}");
    assert!(text.contains("[0, 31]"), "{text}");
}

#[test]
fn validation_error_names_the_file_and_field() {
    let scratch = Scratch::new();
    let err = with_config(&scratch, "iptables:\n  masqueradeBit: 40\n", &[]).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("iptables.masqueradeBit") && text.contains("config.yaml"),
        "{text}"
    );
    let errors = invalid_fields(err);
    assert!(matches!(&errors[0].origin, Origin::File(p) if p.ends_with("config.yaml")));
}

#[test]
fn every_invalid_setting_is_reported() {
    let errors = invalid_fields(
        run(&[
            "--oom-score-adj=2000",
            "--cluster-cidr=10.0.0.0/8,10.1.0.0/16",
            "--nodeport-addresses=primary,10.0.0.0/8,eth0",
        ])
        .unwrap_err(),
    );
    let flags: Vec<Origin> = errors.iter().map(|e| e.origin.clone()).collect();
    assert_eq!(
        flags,
        [
            Origin::Flag("oom-score-adj"),
            Origin::Flag("nodeport-addresses"),
            Origin::Flag("cluster-cidr")
        ]
    );
}

#[test]
fn kernelspace_is_a_clear_usage_error() {
    let err = run(&["--proxy-mode=kernelspace"]).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(err.to_string().contains("Windows only"), "{err}");
}

#[test]
fn detect_local_mode_needs_its_companion_flag() {
    let err = run(&["--detect-local-mode=BridgeInterface"]).unwrap_err();
    assert!(err.to_string().contains("detectLocal.bridgeInterface"), "{err}");
    let settings = run(&[
        "--detect-local-mode=BridgeInterface",
        "--pod-bridge-interface=cbr0",
    ])
    .unwrap();
    assert_eq!(settings.local_mode, LocalMode::BridgeInterface);
}

#[test]
fn unknown_config_fields_become_warnings() {
    let scratch = Scratch::new();
    let settings = with_config(&scratch, "resourceContainer: /kube-proxy\n", &[]).unwrap();
    assert_eq!(settings.warnings.len(), 1);
    assert!(
        settings.warnings[0].contains("resourceContainer"),
        "{:?}",
        settings.warnings
    );
}

#[test]
fn bad_config_file_errors_name_the_file() {
    let scratch = Scratch::new();
    let err = with_config(&scratch, "iptables:\n  syncPeriod: soon\n", &[]).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("config.yaml") && text.contains("iptables.syncPeriod"),
        "{text}"
    );
    assert!(err.is_usage());
    let err = run(&["--config=/nonexistent/kube-proxy.yaml"]).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }));
    assert!(err.to_string().contains("/nonexistent/kube-proxy.yaml"));
}

#[test]
fn help_exits_zero() {
    let err = run(&["--help"]).unwrap_err();
    assert_eq!(err.exit_code(), 0);
    assert!(!err.is_usage());
    assert!(err.to_string().contains("--iptables-masquerade-bit"));
}

#[test]
fn written_config_reads_back_identically() {
    let scratch = Scratch::new();
    let settings = run(&[
        "--proxy-mode=nftables",
        "--cluster-cidr=10.0.0.0/8,fd00::/48",
        "--nodeport-addresses=10.0.0.0/8",
        "--iptables-sync-period=1m30s",
        "--iptables-min-sync-period=1.5s",
        "--conntrack-tcp-timeout-established=12h",
        "--conntrack-udp-timeout=30s",
        "--ipvs-exclude-cidrs=10.9.0.0/16",
        "--kube-api-qps=20.5",
        "--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true",
        "--hostname-override=node-a",
        "--metrics-bind-address=0.0.0.0:10249",
        "--oom-score-adj=-500",
        "--v=3",
        "--masquerade-all",
    ])
    .unwrap();
    let path = scratch.0.join("written.yaml");
    write_config_file(&settings.config, &path).unwrap();
    let yaml = std::fs::read_to_string(&path).unwrap();
    assert!(
        yaml.contains("apiVersion: kubeproxy.config.k8s.io/v1alpha1"),
        "{yaml}"
    );
    assert!(yaml.contains("kind: KubeProxyConfiguration"), "{yaml}");
    assert!(yaml.contains("syncPeriod: 1m30s"), "{yaml}");
    assert!(yaml.contains("tcpEstablishedTimeout: 12h0m0s"), "{yaml}");
    assert!(yaml.contains("configSyncPeriod: 15m0s"), "{yaml}");

    let reread = run(&["--config", path.to_str().unwrap()]).unwrap();
    assert_eq!(reread.config, settings.config);
    assert!(reread.warnings.is_empty(), "{:?}", reread.warnings);
    assert_eq!(reread.mode, ProxyMode::Nftables);
}

#[test]
fn written_defaults_read_back_identically() {
    let scratch = Scratch::new();
    let path = scratch.0.join("defaults.yaml");
    write_config_file(&KubeProxyConfiguration::default(), &path).unwrap();
    let reread = run(&["--config", path.to_str().unwrap()]).unwrap();
    assert_eq!(reread.config, KubeProxyConfiguration::default());
}

#[test]
fn manifest_source_limits_follow_their_flags() {
    // Unset: the manifest source applies its own defaults.
    let settings = run(&[]).unwrap();
    assert_eq!(settings.service_node_port_range, None);
    assert_eq!(settings.manifests_max_file_bytes, None);
    let settings = run(&[
        "--service-node-port-range=20000-20999",
        "--manifests-max-file-bytes=4096",
    ])
    .unwrap();
    assert_eq!(settings.service_node_port_range, Some(20000..=20999));
    assert_eq!(settings.manifests_max_file_bytes, Some(4096));
    // kube-proxy-rs-only settings: the upstream configuration file stays upstream's.
    assert_eq!(settings.config, KubeProxyConfiguration::default());
}

#[test]
fn a_bad_node_port_range_is_a_usage_error_naming_the_flag() {
    let err = run(&["--service-node-port-range=32767-30000"]).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    let message = err.to_string();
    assert!(message.contains("--service-node-port-range"), "{message}");
    assert!(message.contains("below start port"), "{message}");
}

#[test]
fn ebpf_settings_come_from_the_file_unless_flagged() {
    let scratch = Scratch::new();
    let body = "mode: ebpf\n\
                ebpf:\n  cgroupRoot: /sys/fs/cgroup/pods\n  pinRoot: /sys/fs/bpf/kpr\n  maxServiceAddresses: 1000\n";
    let settings = with_config(&scratch, body, &[]).unwrap();
    assert_eq!(settings.cgroup_root, Some(PathBuf::from("/sys/fs/cgroup/pods")));
    assert_eq!(settings.ebpf_pin_root, Some(PathBuf::from("/sys/fs/bpf/kpr")));
    assert_eq!(settings.config.ebpf.max_service_addresses, Some(1000));
    assert_eq!(settings.config.ebpf.max_endpoint_slots, None);
    let flagged = with_config(
        &scratch,
        body,
        &[
            "--ebpf-pin-root=/sys/fs/bpf/other",
            "--ebpf-max-endpoint-slots=64",
        ],
    )
    .unwrap();
    assert_eq!(flagged.ebpf_pin_root, Some(PathBuf::from("/sys/fs/bpf/other")));
    assert_eq!(flagged.cgroup_root, Some(PathBuf::from("/sys/fs/cgroup/pods")));
    assert_eq!(flagged.config.ebpf.max_endpoint_slots, Some(64));
    let zero = "ebpf:\n  maxServiceAddresses: 0\n";
    let fields = invalid_fields(with_config(&scratch, zero, &[]).unwrap_err());
    assert_eq!(fields[0].field, "ebpf.maxServiceAddresses");
    // An upstream configuration is written without the section.
    let plain = run(&[]).unwrap();
    assert!(!crate::file::to_yaml(&plain.config).unwrap().contains("ebpf"));
}
