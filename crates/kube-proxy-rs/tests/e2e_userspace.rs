//! kube-proxy-rs in userspace mode, end to end on the real kernel: the lab's node, pods and
//! outside client in namespaces this test creates, the real binary with
//! `--proxy-mode=userspace` in the node, manifests it watches, and real TCP/UDP through the
//! Service addresses, which the proxy process itself now carries. The Service features
//! that apply to this mode (affinity, external IPs, load balancers) run in the feature
//! suite (`tests/features`); this file has the mode's own stories. Deadlines are ceilings
//! against hangs, not speed checks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::ErrorKind;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use kpr_netns::{NODE_IP, eventually, spread_udp};
use support::*;

const USERSPACE: &str = "--proxy-mode=userspace";

fn web_cluster(pods: &[usize], total_pods: usize, node_port: Option<u16>) -> Cluster {
    let mut cluster = Cluster::new(total_pods);
    cluster.tcp_backends(pods, 8080);
    cluster.write("web.yaml", &web_yaml(pods, node_port));
    cluster
}

#[test]
fn cluster_ip_from_a_pod_and_the_node_and_node_port_from_outside() {
    let mut cluster = web_cluster(&[0, 1, 2], 4, Some(30080));
    cluster.start_proxy(&[USERSPACE]);
    let all = ["pod0", "pod1", "pod2"];
    assert_fair(&wait_spread(cluster.lab.pod(3), sock(WEB_VIP), 300, &all));
    assert_fair(&wait_spread(cluster.node(), sock(WEB_VIP), 300, &all));
    let node_port = std::net::SocketAddr::new(NODE_IP.into(), 30080);
    assert_fair(&wait_spread(cluster.lab.client(), node_port, 300, &all));
    let (status, mode) = cluster.get(METRICS, "/proxyMode").unwrap();
    assert_eq!((status, mode.as_str()), (200, "userspace"));
    let carried = cluster
        .metric(
            "kubeproxy_userspace_connections_total{ip_family=\"IPv4\",protocol=\"TCP\",service_port=\"default/web:p\"}",
        )
        .unwrap_or_default();
    assert!(
        carried >= 900.0,
        "the proxy carried the connections itself: {carried}"
    );
    let rules = cluster.iptables_save();
    assert!(
        rules.contains("-j KUBE-PORTALS-CONTAINER") && !rules.contains("KUBE-SERVICES"),
        "{rules}"
    );
}

#[test]
fn udp_cluster_ip_spreads_over_its_pods() {
    let mut cluster = Cluster::new(3);
    cluster.udp_backends(&[0, 1], 5353);
    cluster.write(
        "dns.yaml",
        &(service("dns", "10.96.0.53", 53, 5353, "UDP", None) + &slice("dns", &[0, 1], 5353, "UDP")),
    );
    cluster.start_proxy(&[USERSPACE]);
    let counts = eventually(CONVERGE, POLL, || {
        let counts = spread_udp(cluster.lab.pod(2), sock("10.96.0.53:53"), 200);
        let keys: Vec<&str> = counts.keys().map(String::as_str).collect();
        (keys == ["pod0", "pod1"])
            .then_some(counts.clone())
            .ok_or(format!("{counts:?}"))
    });
    assert_fair(&counts);
}

#[test]
fn no_endpoints_is_refused_and_a_deleted_service_stops_answering() {
    let mut cluster = web_cluster(&[0], 2, None);
    cluster.start_proxy(&[USERSPACE]);
    wait_spread(cluster.lab.pod(1), sock(WEB_VIP), 10, &["pod0"]);

    cluster.write("web.yaml", &web_yaml(&[], None));
    let pod = cluster.lab.pod(1);
    eventually(CONVERGE, POLL, || {
        match pod.tcp_request(sock(WEB_VIP), Duration::from_secs(5)) {
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });

    cluster.remove("web.yaml");
    eventually(CONVERGE, POLL, || {
        let rules = cluster.iptables_save();
        (!rules.contains("default/web")).then_some(()).ok_or(rules)
    });
    let gone = pod.tcp_request(sock(WEB_VIP), Duration::from_secs(1));
    assert!(gone.is_err(), "{gone:?}");
}

/// Endpoints move while a pod sends requests back to back: not one request fails, since an
/// endpoint change only changes where new connections go.
#[test]
fn endpoint_changes_under_load_fail_no_request() {
    let mut cluster = web_cluster(&[0, 1], 4, None);
    cluster.tcp_backends(&[2], 8080);
    cluster.start_proxy(&[USERSPACE]);
    let client = cluster.lab.pod(3);
    wait_spread(client, sock(WEB_VIP), 20, &["pod0", "pod1"]);

    let stop = AtomicBool::new(false);
    let sent = AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    if let Err(e) = client.tcp_request(sock(WEB_VIP), Duration::from_secs(5)) {
                        failures.lock().unwrap().push(e.to_string());
                    }
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        for pods in [&[1, 2][..], &[2], &[0, 2], &[0], &[0, 1, 2], &[1]] {
            cluster.write("web.yaml", &web_yaml(pods, None));
            std::thread::sleep(Duration::from_millis(700));
        }
        stop.store(true, Ordering::Relaxed);
    });
    let failures = failures.into_inner().unwrap();
    let sent = sent.into_inner();
    assert!(sent > 100, "only {sent} requests");
    assert!(
        failures.is_empty(),
        "{} of {sent} failed: {failures:?}",
        failures.len()
    );
    wait_spread(client, sock(WEB_VIP), 20, &["pod1"]);
}

/// The jump into `KUBE-NODEPORT-NON-LOCAL` takes new connections only; the jump of an
/// earlier version, which sent every packet through the chain, is replaced at start, and
/// NodePort traffic from outside still comes in.
#[test]
fn an_earlier_versions_jump_for_every_packet_is_replaced() {
    let mut cluster = web_cluster(&[0], 1, Some(30080));
    cluster
        .node()
        .sh("iptables -N KUBE-NODEPORT-NON-LOCAL && iptables -I INPUT -m comment --comment 'Ensure that non-local NodePort traffic can flow' -j KUBE-NODEPORT-NON-LOCAL")
        .unwrap();
    cluster.start_proxy(&[USERSPACE]);
    let node_port = std::net::SocketAddr::new(NODE_IP.into(), 30080);
    wait_spread(cluster.lab.client(), node_port, 5, &["pod0"]);
    let rules = cluster.iptables_save();
    let jumps: Vec<&str> = rules
        .lines()
        .filter(|l| l.starts_with("-A INPUT") && l.contains("KUBE-NODEPORT-NON-LOCAL"))
        .collect();
    assert_eq!(
        jumps,
        [
            "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"Ensure that non-local NodePort traffic can flow\" -j KUBE-NODEPORT-NON-LOCAL"
        ],
        "{rules}"
    );
}

#[test]
fn sigterm_and_cleanup_remove_the_portals() {
    let mut cluster = web_cluster(&[0], 1, Some(30080));
    cluster.start_proxy(&[USERSPACE]);
    wait_spread(cluster.node(), sock(WEB_VIP), 5, &["pod0"]);
    assert!(cluster.iptables_save().contains("KUBE-NODEPORT-NON-LOCAL"));
    let status = cluster.proxy.as_mut().unwrap().stop().unwrap();
    assert!(status.success(), "{status:?}\n{}", cluster.proxy_logs());
    let rules = cluster.iptables_save();
    assert!(!rules.contains("KUBE-"), "portals left after SIGTERM:\n{rules}");

    // A run killed without a chance to clean up: --cleanup takes its portals.
    cluster.start_proxy(&[USERSPACE]);
    wait_spread(cluster.node(), sock(WEB_VIP), 5, &["pod0"]);
    let pid = cluster.proxy.as_ref().unwrap().pid();
    cluster.node().sh(&format!("kill -9 {pid}")).unwrap();
    assert!(cluster.iptables_save().contains("KUBE-PORTALS-HOST"));
    let out = cluster
        .node()
        .command(proxy_binary())
        .arg("--cleanup")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rules = cluster.iptables_save();
    assert!(!rules.contains("KUBE-"), "portals left after --cleanup:\n{rules}");
}

#[test]
fn sctp_ports_are_left_out_and_said_so() {
    let mut cluster = web_cluster(&[0], 1, None);
    cluster.write(
        "sctp.yaml",
        &(service("sig", "10.96.0.77", 3868, 3868, "SCTP", None) + &slice("sig", &[0], 3868, "SCTP")),
    );
    cluster.start_proxy(&[USERSPACE]);
    wait_spread(cluster.lab.pod(0), sock(WEB_VIP), 5, &["pod0"]);
    let unsupported = "kubeproxy_userspace_unsupported_service_ports{ip_family=\"IPv4\",protocol=\"SCTP\"}";
    assert_eq!(cluster.metric(unsupported), Some(1.0));
    let logs = cluster.proxy_logs();
    assert!(logs.contains("userspace mode does not support SCTP"), "{logs}");
    assert!(logs.contains("default/sig"), "{logs}");
    assert!(!cluster.iptables_save().contains("10.96.0.77"));
}

#[test]
fn dry_run_prints_the_portals_and_programs_nothing() {
    let cluster = web_cluster(&[0], 1, Some(30080));
    let out = cluster
        .node()
        .command(proxy_binary())
        .args([
            USERSPACE,
            "--dry-run",
            &format!("--hostname-override={NODE_NAME}"),
        ])
        .arg(format!("--manifests={}", cluster.manifest_path().display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(
            "# IPv4 portals (iptables-restore input; port 0 stands for each listener's port)\n*filter\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("-A KUBE-PORTALS-CONTAINER -m comment --comment default/web:p -p tcp -m tcp --dport 80 -d 10.96.0.10/32 -j REDIRECT --to-ports 0"),
        "{text}"
    );
    assert!(text.contains("-A KUBE-NODEPORT-HOST"), "{text}");
    let rules = cluster.iptables_save();
    assert!(
        !rules.contains("KUBE-"),
        "dry run programmed the kernel:\n{rules}"
    );
}
