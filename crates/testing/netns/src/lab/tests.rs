//! The lab on the real kernel: wiring, traffic, processes, and cleanup in every way a test
//! can end.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::*;
use crate::shell::ip;
use crate::sweep::NETNS_DIR;
use crate::{eventually, spread};

const TIMEOUT: Duration = Duration::from_secs(5);

fn at(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::from((ip, port))
}

fn names(lab: &Lab) -> Vec<String> {
    let mut all = vec![lab.node().name().to_owned(), lab.client().name().to_owned()];
    all.extend(lab.pods().iter().map(|pod| pod.name().to_owned()));
    all
}

fn listed(name: &str) -> bool {
    ip(&["netns", "list"])
        .unwrap()
        .lines()
        .any(|line| line.split_whitespace().next() == Some(name))
}

#[test]
fn pods_reach_each_other_and_the_node_by_ip() {
    let lab = Lab::new(2).unwrap();
    let pod1 = lab.pod(1).tcp_backend(at(pod_ip(1), 8080), "pod-1").unwrap();
    let pod0 = lab.pod(0).tcp_backend(at(pod_ip(0), 8080), "pod-0").unwrap();
    let node = lab
        .node()
        .tcp_backend(at(Ipv4Addr::UNSPECIFIED, 8081), "node")
        .unwrap();

    assert_eq!(
        lab.pod(0).tcp_request(at(pod_ip(1), 8080), TIMEOUT).unwrap(),
        "pod-1"
    );
    assert_eq!(
        lab.pod(1).tcp_request(at(pod_ip(0), 8080), TIMEOUT).unwrap(),
        "pod-0"
    );
    assert_eq!(
        lab.pod(0).tcp_request(at(POD_GATEWAY, 8081), TIMEOUT).unwrap(),
        "node"
    );
    assert_eq!(
        lab.pod(1).tcp_request(at(NODE_IP, 8081), TIMEOUT).unwrap(),
        "node"
    );
    assert_eq!(
        lab.node().tcp_request(at(pod_ip(1), 8080), TIMEOUT).unwrap(),
        "pod-1"
    );

    // Nothing in between rewrites addresses.
    assert_eq!(pod1.peers()[0].ip(), pod_ip(0));
    assert_eq!(pod0.peers()[0].ip(), pod_ip(1));
    assert_eq!(node.served(), 2);
}

#[test]
fn the_client_reaches_the_node_ip_and_pods_through_the_node() {
    let lab = Lab::new(1).unwrap();
    let node = lab.node().tcp_backend(at(NODE_IP, 8080), "node").unwrap();
    let pod = lab.pod(0).tcp_backend(at(pod_ip(0), 8080), "pod-0").unwrap();

    assert_eq!(
        lab.client().tcp_request(at(NODE_IP, 8080), TIMEOUT).unwrap(),
        "node"
    );
    assert_eq!(
        lab.client().tcp_request(at(pod_ip(0), 8080), TIMEOUT).unwrap(),
        "pod-0"
    );
    assert_eq!(node.peers()[0].ip(), CLIENT_IP);
    assert_eq!(pod.peers()[0].ip(), CLIENT_IP);
}

/// Every lab is dual-stack: the same paths work over IPv6, with nothing rewriting addresses.
#[test]
fn the_same_paths_work_over_ipv6() {
    let lab = Lab::new(2).unwrap();
    let v6 = |ip: std::net::Ipv6Addr, port| SocketAddr::from((ip, port));
    let pod1 = lab.pod(1).tcp_backend(v6(pod_ip_v6(1), 8080), "pod-1").unwrap();
    let node = lab
        .node()
        .tcp_backend(v6(std::net::Ipv6Addr::UNSPECIFIED, 8081), "node")
        .unwrap();
    let udp = lab
        .pod(1)
        .udp_backend(v6(pod_ip_v6(1), 5353), "pod-1 udp")
        .unwrap();

    let pod0 = lab.pod(0);
    assert_eq!(
        pod0.tcp_request(v6(pod_ip_v6(1), 8080), TIMEOUT).unwrap(),
        "pod-1"
    );
    assert_eq!(
        pod0.tcp_request(v6(POD_GATEWAY_V6, 8081), TIMEOUT).unwrap(),
        "node"
    );
    assert_eq!(
        lab.client().tcp_request(v6(NODE_IP_V6, 8081), TIMEOUT).unwrap(),
        "node"
    );
    assert_eq!(
        lab.client().tcp_request(v6(pod_ip_v6(1), 8080), TIMEOUT).unwrap(),
        "pod-1",
        "the node forwards IPv6"
    );
    assert_eq!(
        lab.node().udp_request(v6(pod_ip_v6(1), 5353), TIMEOUT).unwrap(),
        "pod-1 udp"
    );
    let peers: Vec<_> = pod1.peers().iter().map(SocketAddr::ip).collect();
    let expected: [std::net::IpAddr; 2] = [pod_ip_v6(0).into(), CLIENT_IP_V6.into()];
    assert_eq!(peers, expected);
    assert_eq!(node.served(), 2);
    assert_eq!(udp.peers()[0].ip(), std::net::IpAddr::from(POD_GATEWAY_V6));
}

#[test]
fn tcp_and_udp_backends_in_a_pod_answer_a_client_in_the_node() {
    let lab = Lab::new(1).unwrap();
    let tcp = lab.pod(0).tcp_backend(at(pod_ip(0), 8080), "pod-0 tcp").unwrap();
    let udp = lab.pod(0).udp_backend(at(pod_ip(0), 5353), "pod-0 udp").unwrap();

    assert_eq!(
        lab.node().tcp_request(at(pod_ip(0), 8080), TIMEOUT).unwrap(),
        "pod-0 tcp"
    );
    assert_eq!(
        lab.node().udp_request(at(pod_ip(0), 5353), TIMEOUT).unwrap(),
        "pod-0 udp"
    );
    assert_eq!(tcp.served(), 1);
    assert_eq!(udp.served(), 1);
    assert_eq!(udp.peers()[0].ip(), POD_GATEWAY);
}

#[test]
fn spread_counts_replies_per_backend() {
    let lab = Lab::new(1).unwrap();
    let backend = lab.pod(0).tcp_backend(at(pod_ip(0), 8080), "pod-0").unwrap();
    let counts = spread(lab.node(), at(pod_ip(0), 8080), 5);
    assert_eq!(counts, [("pod-0".to_owned(), 5)].into());
    assert_eq!(backend.served(), 5);
    let refused = spread(lab.node(), at(pod_ip(0), 9), 2);
    assert_eq!(refused, [("error: connection refused".to_owned(), 2)].into());
}

#[test]
fn http_get_returns_status_and_body() {
    let lab = Lab::new(0).unwrap();
    let response =
        "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot ready";
    let server = lab
        .node()
        .tcp_backend(at(Ipv4Addr::LOCALHOST, 10256), response)
        .unwrap();
    let got = lab
        .node()
        .http_get(at(Ipv4Addr::LOCALHOST, 10256), "/healthz", TIMEOUT)
        .unwrap();
    assert_eq!(got, (503, "not ready".to_owned()));
    assert_eq!(server.served(), 1);
    // The node's loopback is its own: nothing listens there from the client's view.
    let err = lab
        .client()
        .http_get(at(Ipv4Addr::LOCALHOST, 10256), "/healthz", TIMEOUT)
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
}

#[test]
fn a_closed_port_is_refused_and_a_silent_one_times_out() {
    let lab = Lab::new(1).unwrap();
    let tcp = lab.node().tcp_request(at(pod_ip(0), 9), TIMEOUT).unwrap_err();
    assert_eq!(tcp.kind(), io::ErrorKind::ConnectionRefused, "{tcp}");
    let udp = lab.node().udp_request(at(pod_ip(0), 9), TIMEOUT).unwrap_err();
    assert_eq!(udp.kind(), io::ErrorKind::ConnectionRefused, "{udp}");

    // Bound but never answering: the datagram arrives, nothing comes back.
    let _silent = lab.pod(0).run(|| UdpSocket::bind(at(pod_ip(0), 5300)).unwrap());
    let quiet = lab
        .node()
        .udp_request(at(pod_ip(0), 5300), Duration::from_millis(300))
        .unwrap_err();
    assert_eq!(quiet.kind(), io::ErrorKind::TimedOut, "{quiet}");
}

#[test]
fn a_backend_that_cannot_bind_reports_why() {
    let lab = Lab::new(1).unwrap();
    // The client namespace does not own the pod's address.
    let err = lab.client().tcp_backend(at(pod_ip(0), 8080), "nope").unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::AddrNotAvailable, "{err}");
}

#[test]
fn the_node_forwards_filters_bridged_traffic_and_hairpins() {
    let lab = Lab::new(1).unwrap();
    assert_eq!(lab.node().sysctl("net.ipv4.ip_forward").unwrap(), "1");
    assert_eq!(
        lab.node().sysctl("net.bridge.bridge-nf-call-iptables").unwrap(),
        "1"
    );
    let port = lab.node().ip(&["-d", "link", "show", "vp0"]).unwrap();
    assert!(port.contains("master kbr0"), "{port}");
    assert!(port.contains("hairpin on"), "{port}");
    let routes = lab.node().ip(&["route", "show", "default"]).unwrap();
    assert!(routes.contains(&format!("via {CLIENT_IP}")), "{routes}");
}

/// The two paths a Service VIP takes between pods, with DNAT rules standing in for the
/// proxy: to another pod on the bridge, whose reply is bridged straight back and must be
/// un-DNATed (bridge netfilter), and to the client pod itself (hairpin mode, masquerade).
#[test]
fn pods_reach_pods_and_themselves_through_dnat_vips() {
    let lab = Lab::new(2).unwrap();
    let (me, other) = (pod_ip(0), pod_ip(1));
    lab.node()
        .sh(&format!(
            "iptables -t nat -A PREROUTING -d 10.96.0.10 -p tcp --dport 80 -j DNAT --to-destination {other}:8080 && \
             iptables -t nat -A PREROUTING -d 10.96.0.11 -p tcp --dport 80 -j DNAT --to-destination {me}:8080 && \
             iptables -t nat -A POSTROUTING -s {me} -d {me} -j MASQUERADE"
        ))
        .unwrap();
    let to_other = lab.pod(1).tcp_backend(at(other, 8080), "pod-1").unwrap();
    let to_me = lab.pod(0).tcp_backend(at(me, 8080), "pod-0").unwrap();

    let reply = lab
        .pod(0)
        .tcp_request(at(Ipv4Addr::new(10, 96, 0, 10), 80), TIMEOUT)
        .unwrap();
    assert_eq!(reply, "pod-1");
    assert_eq!(
        to_other.peers()[0].ip(),
        me,
        "pod-to-pod VIP traffic keeps its source"
    );
    let reply = lab
        .pod(0)
        .tcp_request(at(Ipv4Addr::new(10, 96, 0, 11), 80), TIMEOUT)
        .unwrap();
    assert_eq!(reply, "pod-0");
    assert_eq!(
        to_me.peers()[0].ip(),
        POD_GATEWAY,
        "hairpin traffic is masqueraded"
    );
}

/// The node's own traffic to a VIP (DNATed in OUTPUT, so it needs a route first: the
/// default route) and the client's traffic to a NodePort on the node IP.
#[test]
fn the_node_and_the_client_reach_a_pod_through_dnat() {
    let lab = Lab::new(1).unwrap();
    let pod = pod_ip(0);
    lab.node()
        .sh(&format!(
            "iptables -t nat -A OUTPUT -d 10.96.0.12 -p tcp --dport 80 -j DNAT --to-destination {pod}:8080 && \
             iptables -t nat -A PREROUTING -d {NODE_IP} -p tcp --dport 30080 -j DNAT --to-destination {pod}:8080"
        ))
        .unwrap();
    let backend = lab.pod(0).tcp_backend(at(pod, 8080), "pod-0").unwrap();

    assert_eq!(
        lab.node()
            .tcp_request(at(Ipv4Addr::new(10, 96, 0, 12), 80), TIMEOUT)
            .unwrap(),
        "pod-0"
    );
    assert_eq!(
        lab.client().tcp_request(at(NODE_IP, 30080), TIMEOUT).unwrap(),
        "pod-0"
    );
    assert_eq!(
        backend.peers()[1].ip(),
        CLIENT_IP,
        "the pod routes replies to the client via the node"
    );
}

#[test]
fn nothing_is_created_in_the_root_namespace() {
    let lab = Lab::new(2).unwrap();
    let root = ip(&["-o", "link", "show"]).unwrap();
    for ours in ["kbr0", "vp0", "vp1"] {
        assert!(
            !root.contains(&format!(": {ours}")),
            "{ours} in the root namespace:\n{root}"
        );
    }
    drop(lab);
}

#[test]
fn dropping_the_lab_deletes_all_its_namespaces() {
    let lab = Lab::new(2).unwrap();
    let created = names(&lab);
    assert_eq!(created.len(), 4);
    assert!(created.iter().all(|name| listed(name)), "{created:?}");
    drop(lab);
    let left: Vec<_> = created.iter().filter(|name| listed(name)).collect();
    assert!(left.is_empty(), "still listed: {left:?}");
}

#[test]
fn a_panic_inside_a_test_still_cleans_up() {
    let mut created = Vec::new();
    let mut pid = 0;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let lab = Lab::new(1).unwrap();
        created = names(&lab);
        let mut sleeper = Command::new("sleep");
        sleeper.arg("600");
        let guard = lab.spawn(lab.node(), sleeper).unwrap();
        pid = guard.pid();
        let _backend = lab.pod(0).tcp_backend(at(pod_ip(0), 8080), "pod-0").unwrap();
        panic!("the test failed");
    }));
    assert!(outcome.is_err());
    assert_eq!(created.len(), 3);
    let left: Vec<_> = created.iter().filter(|name| listed(name)).collect();
    assert!(left.is_empty(), "still listed: {left:?}");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "sleep {pid} survived the panic"
    );
}

/// A namespace named like the harness's, owned by a pid that cannot be alive.
struct StaleNamespace(String);

impl StaleNamespace {
    fn create() -> Self {
        let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max").unwrap();
        let name = format!("{NAME_PREFIX}{}x{}-node", pid_max.trim(), std::process::id());
        ip(&["netns", "add", &name]).unwrap();
        Self(name)
    }
}

impl Drop for StaleNamespace {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.0]);
    }
}

#[test]
fn the_sweep_deletes_namespaces_of_dead_processes_only() {
    // The live namespace first: its creation runs this process's one-off sweep, which would
    // otherwise remove the stale namespace before the sweep under test gets to it.
    let live = Netns::new("live").unwrap();
    let stale = StaleNamespace::create();
    let lab = Lab::new(0).unwrap();
    assert!(!listed(&stale.0), "{} survived the sweep", stale.0);
    assert!(
        listed(live.name()),
        "the sweep deleted {}, whose owner is alive",
        live.name()
    );
    assert!(listed(lab.node().name()));
}

#[test]
fn the_sweep_reports_what_it_deleted() {
    let stale = StaleNamespace::create();
    let deleted = sweep_stale_namespaces();
    // A parallel test's sweep may have taken it first; either way it is gone.
    assert!(deleted.contains(&stale.0) || !Path::new(NETNS_DIR).join(&stale.0).exists());
    assert!(!listed(&stale.0));
}

#[test]
fn the_sweep_deletes_log_directories_of_dead_processes_only() {
    let tmp = std::env::temp_dir();
    let stale = tmp.join(format!(
        "{NAME_PREFIX}{}x{}{}test",
        crate::sweep::tests::dead_pid(),
        std::process::id(),
        crate::sweep::LOG_DIR_MARKER
    ));
    std::fs::create_dir_all(stale.join("inner")).unwrap();
    let lab = Lab::new(0).unwrap();
    let stale_left = stale.exists();
    let _ = std::fs::remove_dir_all(&stale);
    assert!(!stale_left, "{} survived the sweep", stale.display());
    assert!(lab.log_dir().exists(), "the sweep deleted a live lab's logs");
    let log_dir = lab.log_dir().to_owned();
    drop(lab);
    assert!(!log_dir.exists(), "the lab left its logs behind");
}

#[test]
fn too_many_pods_are_refused() {
    let err = Lab::new(MAX_PODS + 1).unwrap_err();
    assert!(matches!(err, Error::TooManyPods { .. }), "{err}");
}

#[test]
fn spawned_programs_run_in_their_namespace_and_log() {
    let lab = Lab::new(0).unwrap();
    let mut script = Command::new("sh");
    script.args([
        "-c",
        "echo started; ip -o addr show; echo oops >&2; exec sleep 600",
    ]);
    let mut guard = lab.spawn(lab.node(), script).unwrap();
    let logs = eventually(TIMEOUT, Duration::from_millis(20), || {
        let logs = guard.logs();
        if logs.contains("oops") {
            Ok(logs)
        } else {
            Err(format!("logs so far: {logs:?}"))
        }
    });
    assert!(logs.contains("started"), "{logs}");
    assert!(
        logs.contains(&NODE_IP.to_string()),
        "not in the node namespace:\n{logs}"
    );
    assert!(guard.log_path().starts_with(lab.log_dir()));
    assert_eq!(guard.try_wait().unwrap(), None);
    let status = guard.stop().unwrap();
    assert_eq!(status.signal(), Some(libc_sigterm()), "{status}");
    assert_eq!(
        guard.stop().unwrap(),
        status,
        "stopping twice returns the same status"
    );
}

#[test]
fn a_program_ignoring_sigterm_is_killed() {
    let lab = Lab::new(0).unwrap();
    let mut stubborn = Command::new("sh");
    stubborn.args(["-c", "trap '' TERM; echo ready; while :; do sleep 1; done"]);
    let mut guard = lab.spawn(lab.node(), stubborn).unwrap();
    eventually(TIMEOUT, Duration::from_millis(20), || {
        if guard.logs().contains("ready") {
            Ok(())
        } else {
            Err("not ready".to_owned())
        }
    });
    let status = guard.stop().unwrap();
    assert_eq!(
        status.signal(),
        Some(nix::sys::signal::Signal::SIGKILL as i32),
        "{status}"
    );
}

#[test]
fn dropping_the_lab_kills_programs_whose_guards_leaked() {
    let lab = Lab::new(0).unwrap();
    let mut sleeper = Command::new("sleep");
    sleeper.arg("600");
    let guard = lab.spawn(lab.node(), sleeper).unwrap();
    let pid = guard.pid();
    let log_dir = lab.log_dir().to_owned();
    std::mem::forget(guard);
    drop(lab);
    // The leaked guard kept the log directory alive.
    std::fs::remove_dir_all(log_dir).unwrap();
    // Never reaped (its guard is gone), so it stays a zombie: dead, not running.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit(')').next().unwrap_or("").split_whitespace().next();
    assert!(
        matches!(state, None | Some("Z") | Some("X")),
        "sleep {pid} still runs: {stat}"
    );
}

fn libc_sigterm() -> i32 {
    nix::sys::signal::Signal::SIGTERM as i32
}
