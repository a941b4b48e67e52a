//! `kube-proxy-rs explain` end to end, in both proxy modes: the real proxy programs the
//! node namespace of a lab this test builds, then `kube-proxy-rs explain` runs in that
//! namespace and reads the live kernel (nftables over netlink, iptables through
//! iptables-save). For a cluster IP, a NodePort, a Service without endpoints (REJECT), an
//! `externalTrafficPolicy: Local` Service without a pod on this node (DROP) and an address
//! nothing uses (exit 1), it asserts what an operator would read.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use kpr_netns::{NODE_IP, pod_ip};
use support::*;

/// `examples/features/external-traffic-policy-local.yaml`: `catalog` (ingress 203.0.113.41,
/// NodePort 30142) has its only pod on node2.
const ETP_LOCAL: &str = include_str!("../../../examples/features/external-traffic-policy-local.yaml");

struct Run {
    code: i32,
    out: String,
}

fn explain(cluster: &Cluster, address: &str) -> Run {
    let output = cluster
        .node()
        .command(proxy_binary())
        .args(["explain", address])
        .output()
        .expect("run kube-proxy-rs explain");
    // Shown with the test's output, so a failure (or `--no-capture`) shows what was read.
    eprintln!(
        "$ kube-proxy-rs explain {address}\n{}",
        String::from_utf8_lossy(&output.stdout)
    );
    Run {
        code: output.status.code().unwrap_or(-1),
        out: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}

fn start(mode: &str) -> Cluster {
    let mut cluster = Cluster::new(2);
    cluster.write("web.yaml", &web_yaml(&[0, 1], Some(30080)));
    cluster.write(
        "empty.yaml",
        &service("empty", "10.96.0.20", 80, 8080, "TCP", None),
    );
    cluster.write("etp-local.yaml", ETP_LOCAL);
    cluster.start_proxy(&[&format!("--proxy-mode={mode}")]);
    cluster
}

#[track_caller]
fn assert_has(run: &Run, code: i32, needles: &[&str]) {
    assert_eq!(run.code, code, "exit code; output:\n{}", run.out);
    for needle in needles {
        assert!(run.out.contains(needle), "{needle:?} missing from:\n{}", run.out);
    }
}

/// What holds in both modes.
fn common(cluster: &Cluster, mode_title: &str) {
    let (pod0, pod1) = (format!("{}:8080", pod_ip(0)), format!("{}:8080", pod_ip(1)));
    let web = explain(cluster, "10.96.0.10:80");
    assert_has(
        &web,
        0,
        &[
            mode_title,
            "10.96.0.10:80/tcp: cluster IP",
            &pod0,
            &pod1,
            "50.0 %",
        ],
    );
    assert!(
        !web.out.contains("REJECT") && !web.out.contains("DROP"),
        "{}",
        web.out
    );

    let node_port = explain(cluster, &format!("{NODE_IP}:30080"));
    assert_has(
        &node_port,
        0,
        &["NodePort 30080/tcp on node address", &pod0, &pod1],
    );

    let empty = explain(cluster, "10.96.0.20:80/tcp");
    assert_has(&empty, 0, &["REJECT", "no endpoints"]);

    for catalog in ["203.0.113.41:80", &format!("{NODE_IP}:30142")] {
        let run = explain(cluster, catalog);
        assert_has(
            &run,
            0,
            &["DROP", "externalTrafficPolicy Local", "no endpoint on this node"],
        );
    }

    let nothing = explain(cluster, "192.0.2.1:80");
    assert_has(&nothing, 1, &["nothing matches"]);
}

#[test]
fn explain_reads_the_nftables_table() {
    let cluster = start("nftables");
    common(&cluster, "nftables mode (table ip kube-proxy)");
    let web = explain(&cluster, "10.96.0.10:80");
    assert_has(
        &web,
        0,
        &[
            "set pick-service-endpoints-tcp-2-ips: 10.96.0.10 . tcp . 80",
            "chain service-dispatch: ip daddr . meta l4proto . th dport @pick-service-endpoints-tcp-2-ips goto pick-service-endpoints-tcp-2",
            "map service-endpoints-tcp-2: 10.96.0.10 . 80 . 0 : ",
            "slot 1 of 2",
        ],
    );
    assert!(
        !web.out.contains("iptables mode"),
        "only one mode's objects: {}",
        web.out
    );
    assert!(
        !web.out.contains("no rule looking up"),
        "the dispatch rules are read from the kernel too: {}",
        web.out
    );
    let empty = explain(&cluster, "10.96.0.20:80");
    assert_has(
        &empty,
        0,
        &[
            "set no-endpoint-reject-ips: 10.96.0.20 . tcp . 80",
            "chain service-endpoints-check: ip daddr . meta l4proto . th dport @no-endpoint-reject-ips goto reject-chain",
        ],
    );
    // nftables mode also rejects wrong ports of a cluster IP.
    let wrong_port = explain(&cluster, "10.96.0.10:81");
    assert_has(&wrong_port, 0, &["REJECT", "cluster-ips-check"]);
}

#[test]
fn explain_reads_the_iptables_rules() {
    let cluster = start("iptables");
    common(&cluster, "iptables mode (iptables nat/filter)");
    let web = explain(&cluster, "10.96.0.10:80");
    assert_has(
        &web,
        0,
        &[
            "of default/web:p",
            "-A KUBE-SERVICES",
            "-j KUBE-SVC-",
            "DNAT --to-destination",
        ],
    );
    assert!(
        !web.out.contains("nftables mode"),
        "only one mode's objects: {}",
        web.out
    );
    let catalog = explain(&cluster, "203.0.113.41:80");
    assert_has(&catalog, 0, &["default/catalog:http", "KUBE-EXTERNAL-SERVICES"]);
}

#[test]
fn explain_help_and_usage_errors() {
    let help = std::process::Command::new(proxy_binary())
        .args(["explain", "--help"])
        .output()
        .unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("Usage: kube-proxy-rs explain"));
    let bad = std::process::Command::new(proxy_binary())
        .args(["explain", "10.96.0.10"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("expected <ip>:<port>"));
}
