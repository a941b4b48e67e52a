//! What an operator sees of a running proxy besides its rules: the Events it records in the
//! API (read back from the in-repo test API server, written by the real kube-rs client) and
//! its log lines in upstream's JSON shape. The proxy runs in a namespace lab as everywhere
//! else, so nothing here touches the host's firewall.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event as ApiEvent;
use kpr_netns::eventually;
use serde_json::{Value, json};
use support::api::ApiCluster;
use support::*;

/// The shared API lab (`support::api`), holding Service `web`.
struct ApiLab(ApiCluster);

impl std::ops::Deref for ApiLab {
    type Target = ApiCluster;
    fn deref(&self) -> &ApiCluster {
        &self.0
    }
}

impl std::ops::DerefMut for ApiLab {
    fn deref_mut(&mut self) -> &mut ApiCluster {
        &mut self.0
    }
}

impl ApiLab {
    fn new() -> Self {
        let lab = ApiCluster::new(1);
        let web: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                     "ports": [{"name": "p", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
        }))
        .unwrap();
        lab.api.apply(&web).unwrap();
        Self(lab)
    }

    /// The events.k8s.io Events with this reason, once there is at least one.
    fn wait_events(&self, reason: &str) -> Vec<ApiEvent> {
        eventually(CONVERGE, POLL, || {
            let events: Vec<ApiEvent> = self
                .api
                .list::<ApiEvent>()
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some(reason))
                .collect();
            if events.is_empty() {
                Err(format!("no {reason} event yet\n{}", self.cluster.proxy_logs()))
            } else {
                Ok(events)
            }
        })
    }
}

fn host_name() -> String {
    nix::unistd::gethostname().unwrap().to_string_lossy().into_owned()
}

#[test]
fn the_proxy_announces_its_start_on_its_node_as_upstream_does() {
    let mut lab = ApiLab::new();
    lab.start_proxy(&[]);

    let events = lab.wait_events("Starting");
    assert_eq!(events.len(), 1, "one start, one Event: {events:#?}");
    let event = &events[0];
    assert_eq!(event.type_.as_deref(), Some("Normal"));
    assert_eq!(event.action.as_deref(), Some("StartKubeProxy"));
    assert_eq!(event.reporting_controller.as_deref(), Some("kube-proxy"));
    let instance = format!("kube-proxy-{}", host_name());
    assert_eq!(event.reporting_instance.as_deref(), Some(instance.as_str()));
    // A Node is cluster-scoped: the Event lives in "default", regarding the Node by name
    // (its name doubling as UID, which `kubectl describe node` looks for).
    assert_eq!(event.metadata.namespace.as_deref(), Some("default"));
    let regarding = event.regarding.as_ref().unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("Node"));
    assert_eq!(regarding.name.as_deref(), Some(NODE_NAME));
    assert_eq!(regarding.uid.as_deref(), Some(NODE_NAME));
    assert!(event.event_time.is_some());
}

#[test]
fn a_health_port_it_cannot_bind_under_hard_fail_is_recorded_before_it_exits() {
    let mut lab = ApiLab::new();
    // Someone else holds the healthz port on the node.
    let holder = lab
        .cluster
        .node()
        .run(|| std::net::TcpListener::bind(HEALTHZ))
        .unwrap();
    let kubeconfig = format!("--kubeconfig={}", lab.kubeconfig.path().display());
    lab.cluster
        .spawn_proxy(&[&kubeconfig, "--bind-address-hard-fail"], false);
    let status = eventually(CONVERGE, POLL, || {
        match lab.cluster.proxy.as_mut().unwrap().try_wait().unwrap() {
            Some(status) => Ok(status),
            None => Err("still running".to_string()),
        }
    });
    assert_eq!(status.code(), Some(1), "{}", lab.cluster.proxy_logs());

    let events = lab.wait_events("FailedToStartProxierHealthcheck");
    let event = &events[0];
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.action.as_deref(), Some("StartKubeProxy"));
    let note = event.note.as_deref().unwrap();
    assert!(note.contains(HEALTHZ), "{note}");
    let regarding = event.regarding.as_ref().unwrap();
    assert_eq!(regarding.name.as_deref(), Some(NODE_NAME));
    // It never got as far as starting.
    assert!(
        lab.api
            .list::<ApiEvent>()
            .iter()
            .all(|e| e.reason.as_deref() != Some("Starting"))
    );
    drop(holder);
}

/// Every line `logs` holds, parsed; panics naming the first line that is not a JSON object
/// with component-base's keys (`ts` number, `caller` and `msg` strings, `v` a number when
/// present).
fn parse_json_lines(logs: &str) -> Vec<Value> {
    logs.lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {line}\n--- all:\n{logs}"));
            assert!(value["ts"].is_number(), "ts: {line}");
            assert!(value["caller"].is_string(), "caller: {line}");
            assert!(value["msg"].is_string(), "msg: {line}");
            assert!(value.get("v").is_none_or(Value::is_u64), "v: {line}");
            value
        })
        .collect()
}

#[test]
fn json_logging_makes_every_line_one_upstream_json_object() {
    let mut lab = ApiLab::new();
    // -v=4 and the harness' RUST_LOG=debug: kube-rs' own debug lines go through it too.
    lab.start_proxy(&["--logging-format=json", "--v=4"]);
    lab.cluster.wait_first_sync();
    lab.wait_events("Starting");
    let status = lab.cluster.proxy.as_mut().unwrap().stop().unwrap();
    assert!(status.success(), "{status:?}\n{}", lab.cluster.proxy_logs());

    let lines = parse_json_lines(&lab.cluster.proxy_logs());
    let starting = lines
        .iter()
        .find(|l| l["msg"] == "kube-proxy-rs starting")
        .expect("the start-up line");
    assert_eq!(starting["v"], 0);
    assert_eq!(starting["node"], NODE_NAME);
    assert!(
        starting["caller"]
            .as_str()
            .unwrap()
            .starts_with("kube-proxy-rs/proxy.rs:"),
        "{starting}"
    );
    assert!(
        lines.iter().any(|l| l["v"] == 2),
        "debug lines are v 2: {lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["msg"] == "SIGTERM: exiting, rules stay in place"),
        "{lines:#?}"
    );
}

#[test]
fn the_config_files_logging_format_is_honoured_and_the_flag_wins() {
    let mut cluster = Cluster::new(1);
    cluster.write("web.yaml", &web_yaml(&[0], None));
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nlogging:\n  format: json\n",
    )
    .unwrap();
    let config_flag = format!("--config={}", config.path().display());

    cluster.start_proxy(&[&config_flag]);
    // Stopped first, so no line is read half-written.
    cluster.proxy.as_mut().unwrap().stop().unwrap();
    let lines = parse_json_lines(&cluster.proxy_logs());
    assert!(
        lines.iter().any(|l| l["msg"] == "kube-proxy-rs starting"),
        "{lines:#?}"
    );

    // --logging-format=text on top of the file: text again.
    cluster.start_proxy(&[&config_flag, "--logging-format=text"]);
    let logs = cluster.proxy_logs();
    let text_start = logs.rfind("kube-proxy-rs starting").expect("the start-up line");
    let line_start = logs[..text_start].rfind('\n').map_or(0, |i| i + 1);
    assert!(!logs[line_start..].starts_with('{'), "{logs}");
}

#[test]
fn a_bad_logging_format_exits_2_naming_the_flag() {
    let cluster = Cluster::new(1);
    // In the node namespace: were the flag ignored, the proxy would start there, not on the host.
    let out = cluster
        .node()
        .command(proxy_binary())
        .args(["--logging-format=xml", "--hostname-override=node1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--logging-format"), "{stderr}");
    assert!(
        stderr.contains("supported values: \"json\", \"text\""),
        "{stderr}"
    );
}

/// Upstream 1.37 warns, in its log and with an Event on the Node, when the mode was left to
/// its default (k/k #139957); a mode given explicitly is not warned about.
#[test]
fn a_mode_left_to_its_default_is_warned_of_in_the_log_and_an_event() {
    let mut lab = ApiLab::new();
    lab.start_proxy(&[]);
    let events = lab.wait_events("ProxyModeDefaulted");
    let event = &events[0];
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.action.as_deref(), Some("StartKubeProxy"));
    let note = event.note.as_deref().unwrap();
    assert!(note.contains("nftables the default in 1.40"), "{note}");
    assert!(
        lab.cluster.proxy_logs().contains("No proxy mode was configured"),
        "{}",
        lab.cluster.proxy_logs()
    );

    let mut explicit = ApiLab::new();
    explicit.start_proxy(&["--proxy-mode=iptables"]);
    explicit.wait_events("Starting");
    assert!(
        explicit
            .api
            .list::<ApiEvent>()
            .iter()
            .all(|e| e.reason.as_deref() != Some("ProxyModeDefaulted")),
        "an explicit mode is not warned about"
    );
}

/// The binary run in the node namespace of a fresh lab on a manifest, with `args`.
fn run_once(args: &[&str]) -> std::process::Output {
    let cluster = Cluster::new(1);
    let manifests = format!("--manifests={}", cluster.manifest_path().display());
    cluster
        .node()
        .command(proxy_binary())
        .args(["--hostname-override=node1", &manifests])
        .args(args)
        .output()
        .unwrap()
}

/// ipvs mode's gate (1.37, KEP-5495): off, the mode is refused as upstream's validation
/// refuses it, with status 1, before anything is checked or changed.
#[test]
fn ipvs_mode_is_refused_when_its_feature_gate_is_off() {
    let out = run_once(&["--proxy-mode=ipvs", "--feature-gates=KubeProxyIPVS=false"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(
        logs.contains("failed validate: KubeProxyConfiguration.Mode.ProxyMode: Invalid value: \"ipvs\""),
        "{logs}"
    );
    assert!(logs.contains("feature gate KubeProxyIPVS is false"), "{logs}");
    assert!(
        !logs.contains("can't use the IPVS proxier"),
        "refused before the kernel check: {logs}"
    );
}

/// ipvs mode says it is deprecated first thing, before the kernel check that fails on this
/// host (no ip_vs), so even a node that cannot run it learns why it should move.
#[test]
fn ipvs_mode_warns_of_its_deprecation_before_the_kernel_check() {
    let out = run_once(&["--proxy-mode=ipvs"]);
    let logs = String::from_utf8_lossy(&out.stderr);
    let warned = logs
        .find("The ipvs proxier has been deprecated and will be disabled by default in Kubernetes 1.40")
        .unwrap_or_else(|| panic!("no deprecation warning: {logs}"));
    let refused = logs
        .find("can't use the IPVS proxier")
        .unwrap_or_else(|| panic!("this host has no IPVS: {logs}"));
    assert!(warned < refused, "{logs}");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}
