//! Untrusted manifest input, end to end: the real binary in a namespace lab, fed files that
//! try to take over the node's firewall, break a working Service, or exhaust memory. Each
//! test shows the bad input refused (logged and counted) while valid Services keep carrying
//! real traffic. Deadlines are ceilings against hangs, not speed checks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;

use kpr_netns::{NODE_IP, eventually};
use support::*;

/// `kubeproxy_rejected_objects_total{kind,reason}` once it reaches `at_least`.
fn wait_rejected(cluster: &Cluster, kind: &str, reason: &str, at_least: f64) -> f64 {
    let sample = format!("kubeproxy_rejected_objects_total{{kind=\"{kind}\",reason=\"{reason}\"}}");
    eventually(CONVERGE, POLL, || match cluster.metric(&sample) {
        Some(n) if n >= at_least => Ok(n),
        other => Err(format!("{sample} = {other:?}\n{}", cluster.proxy_logs())),
    })
}

/// A Service document with a hand-picked name and namespace (YAML double-quoted).
fn named_service(namespace: &str, name: &str, cluster_ip: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: \"{name}\"\n  namespace: \"{namespace}\"\nspec:\n  \
         clusterIP: {cluster_ip}\n  ports:\n  - port: 80\n"
    )
}

/// The repro in one file: a name that would inject iptables-restore lines, a
/// NodePort on the node's SSH port with no endpoints (which would REJECT the node's own
/// SSH), and two names that would hash to the same chain; next to a valid Service.
fn hostile_file() -> String {
    web_yaml(&[0, 1], None)
        + &named_service("default", "evil\\n-A KUBE-SERVICES -j ACCEPT\\n#", "10.96.0.66")
        + "---\n"
        + &service("ssh", "10.96.0.22", 22, 22, "TCP", Some(22))
        + &named_service("a", "b/c", "10.96.0.71")
        + &named_service("a/b", "c", "10.96.0.72")
}

#[test]
fn hostile_names_and_a_node_port_on_ssh_are_refused_while_a_valid_neighbour_serves() {
    let mut cluster = Cluster::new(3);
    cluster.tcp_backends(&[0, 1], 8080);
    // The node's own SSH daemon, as the outside client reaches it.
    let ssh = cluster
        .node()
        .tcp_backend(SocketAddr::new(NODE_IP.into(), 22), "node-ssh")
        .unwrap();
    cluster.write("hostile.yaml", &hostile_file());
    cluster.start_proxy(&[]);

    wait_spread(cluster.lab.pod(2), sock(WEB_VIP), 100, &["pod0", "pod1"]);
    // Name rules refuse the injected name and both slashed names; the range refuses port 22.
    wait_rejected(&cluster, "Service", "invalid_value", 3.0);
    wait_rejected(&cluster, "Service", "invalid_port", 1.0);

    let reply = cluster.lab.client().tcp_request(
        SocketAddr::new(NODE_IP.into(), 22),
        std::time::Duration::from_secs(5),
    );
    assert_eq!(
        reply.unwrap(),
        "node-ssh",
        "the node's SSH port must stay reachable"
    );
    assert_eq!(ssh.served(), 1);

    let rules = cluster.iptables_save();
    for absent in [
        "evil",
        "-A KUBE-SERVICES -j ACCEPT",
        "default/ssh",
        "--dport 22 ",
        "b/c",
        "a/b",
    ] {
        assert!(!rules.contains(absent), "{absent:?} reached the kernel:\n{rules}");
    }
    let logs = cluster.proxy_logs();
    assert!(
        logs.contains("evil\\\\n-A KUBE-SERVICES") || logs.contains("evil\\n-A KUBE-SERVICES"),
        "{logs}"
    );
    assert!(
        !logs.lines().any(|line| line.starts_with("-A KUBE-SERVICES")),
        "the name forged a log line:\n{logs}"
    );
    assert!(logs.contains("outside the node port range 30000-32767"), "{logs}");
}

#[test]
fn dry_run_of_a_hostile_file_prints_only_the_valid_service() {
    let cluster = Cluster::new(2);
    cluster.write("hostile.yaml", &hostile_file());
    let text = cluster.dry_run();
    assert!(text.contains("default/web:p"), "{text}");
    assert!(!text.contains("evil"), "{text}");
    assert!(
        !text
            .lines()
            .any(|line| line == "-A KUBE-SERVICES -j ACCEPT" || line == "#"),
        "{text}"
    );
    assert!(!text.contains("default/ssh"), "{text}");
}

#[test]
fn an_ip_typo_keeps_the_old_version_serving() {
    let mut cluster = Cluster::new(3);
    cluster.tcp_backends(&[0, 1], 8080);
    cluster.write("web.yaml", &web_yaml(&[0], None));
    cluster.start_proxy(&[]);
    let client = cluster.lab.pod(2);
    wait_spread(client, sock(WEB_VIP), 20, &["pod0"]);

    // The same file, the Service's cluster IP mistyped, the endpoints moved to pod1: the
    // Service is refused and keeps its last good version; the valid slice is applied.
    let typo = service("web", "10.96.0.1O", 80, 8080, "TCP", None) + &slice("web", &[1], 8080, "TCP");
    cluster.write("web.yaml", &typo);
    wait_rejected(&cluster, "Service", "invalid_ip", 1.0);
    wait_spread(client, sock(WEB_VIP), 50, &["pod1"]);
    let logs = cluster.proxy_logs();
    assert!(
        logs.contains("default/web") && logs.contains("10.96.0.1O"),
        "{logs}"
    );
    assert!(
        cluster.iptables_save().contains("10.96.0.10/32"),
        "the last good cluster IP stays programmed"
    );
}

#[test]
fn an_oversized_manifest_keeps_its_last_good_contents() {
    let mut cluster = Cluster::new(3);
    cluster.tcp_backends(&[0, 1], 8080);
    cluster.write("web.yaml", &web_yaml(&[0], None));
    cluster.start_proxy(&["--manifests-max-file-bytes=4096"]);
    let client = cluster.lab.pod(2);
    wait_spread(client, sock(WEB_VIP), 20, &["pod0"]);

    let padded = format!("{}# {}\n", web_yaml(&[1], None), "x".repeat(8192));
    cluster.write("web.yaml", &padded);
    wait_rejected(&cluster, "Manifest", "too_large", 1.0);
    let logs = cluster.proxy_logs();
    assert!(logs.contains("over the limit of 4096 bytes"), "{logs}");
    // Nothing of the oversized version was applied: still pod0 only.
    wait_spread(client, sock(WEB_VIP), 50, &["pod0"]);

    cluster.write("web.yaml", &web_yaml(&[1], None));
    wait_spread(client, sock(WEB_VIP), 20, &["pod1"]);
}

#[test]
fn a_node_port_taken_by_another_service_is_refused_until_the_holder_goes() {
    let mut cluster = Cluster::new(2);
    cluster.tcp_backends(&[0], 8080);
    cluster.tcp_backends(&[1], 9090);
    cluster.write("web.yaml", &web_yaml(&[0], Some(30080)));
    cluster.start_proxy(&[]);
    let node_port = SocketAddr::new(NODE_IP.into(), 30080);
    wait_spread(cluster.lab.client(), node_port, 20, &["pod0"]);

    let api = service("api", "10.96.0.20", 90, 9090, "TCP", Some(30080)) + &slice("api", &[1], 9090, "TCP");
    cluster.write("api.yaml", &api);
    wait_rejected(&cluster, "Service", "conflict", 1.0);
    wait_spread(cluster.lab.client(), node_port, 50, &["pod0"]);

    // The holder goes away: the refused Service is programmed without another edit.
    cluster.remove("web.yaml");
    wait_spread(cluster.lab.client(), node_port, 20, &["pod1"]);
}

#[test]
fn the_node_port_range_flag_is_honoured_and_checked() {
    let mut cluster = Cluster::new(1);
    cluster.tcp_backends(&[0], 8080);
    cluster.write("web.yaml", &web_yaml(&[0], Some(8081)));
    cluster.start_proxy(&["--service-node-port-range=8000-8999"]);
    wait_spread(
        cluster.lab.client(),
        SocketAddr::new(NODE_IP.into(), 8081),
        10,
        &["pod0"],
    );

    let out = std::process::Command::new(proxy_binary())
        .args([
            "--service-node-port-range=32767-30000",
            "--manifests=/nonexistent",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--service-node-port-range"), "{stderr}");
}
