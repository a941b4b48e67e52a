//! ipvs mode end to end, in a throw-away guest booting Debian's kernel (this host's kernel
//! has no IPVS): the lab's namespaces, backends and the real binary inside the guest, real
//! TCP through the Service addresses, as the other modes' end-to-end tests do on the host.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::ErrorKind;
use std::time::Duration;

use kpr_netns::{NODE_IP, eventually};
use kpr_vm::{Guest, squeeze_columns};
use support::*;

const IPVS: &str = "--proxy-mode=ipvs";

/// Runs `body` in a guest that has the binary under test.
fn in_guest(test: &str, body: impl FnOnce()) {
    Guest::new()
        .binary(env!("CARGO_BIN_EXE_kube-proxy-rs"))
        .timeout(Duration::from_secs(300))
        .in_guest(test, body);
}

fn web_cluster(pods: &[usize], total_pods: usize, node_port: Option<u16>) -> Cluster {
    let mut cluster = Cluster::new(total_pods);
    cluster.tcp_backends(pods, 8080);
    cluster.write("web.yaml", &web_yaml(pods, node_port));
    cluster
}

fn ipvsadm(cluster: &Cluster) -> String {
    squeeze_columns(&cluster.node().sh("ipvsadm -Ln").unwrap())
}

#[test]
fn cluster_ip_and_node_port_spread_through_ipvs() {
    in_guest("cluster_ip_and_node_port_spread_through_ipvs", || {
        let mut cluster = web_cluster(&[0, 1, 2], 4, Some(30080));
        cluster.start_proxy(&[IPVS]);
        let all = ["pod0", "pod1", "pod2"];
        assert_fair(&wait_spread(cluster.lab.pod(3), sock(WEB_VIP), 300, &all));
        assert_fair(&wait_spread(cluster.node(), sock(WEB_VIP), 300, &all));
        let node_port = std::net::SocketAddr::new(NODE_IP.into(), 30080);
        assert_fair(&wait_spread(cluster.lab.client(), node_port, 300, &all));
        let listed = ipvsadm(&cluster);
        assert!(listed.contains("TCP 10.96.0.10:80 rr"), "{listed}");
        assert!(listed.contains(&format!("TCP {NODE_IP}:30080 rr")), "{listed}");
        let link = cluster.node().sh("ip addr show dev kube-ipvs0").unwrap();
        assert!(link.contains("inet 10.96.0.10/32"), "{link}");

        let mut explain = cluster.node().command(proxy_binary());
        let output = explain.args(["explain", WEB_VIP]).output().unwrap();
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{text}");
        assert!(text.contains("ipvs mode (IPVS, kube-ipvs0, IPv4):"), "{text}");
        assert!(
            !text.contains("iptables mode"),
            "ipvs mode's own chains are not iptables mode's:\n{text}"
        );
        assert_eq!(text.matches("33.3 %").count(), 3, "{text}");
        assert!(
            text.contains("IPVS virtual server TCP 10.96.0.10:80 (rr)"),
            "{text}"
        );
    });
}

#[test]
fn scaling_down_and_to_zero_follows_the_endpoints() {
    in_guest("scaling_down_and_to_zero_follows_the_endpoints", || {
        let mut cluster = web_cluster(&[0, 1], 3, None);
        cluster.start_proxy(&[IPVS]);
        wait_spread(cluster.lab.pod(2), sock(WEB_VIP), 40, &["pod0", "pod1"]);
        cluster.write("web.yaml", &web_yaml(&[0], None));
        wait_spread(cluster.lab.pod(2), sock(WEB_VIP), 20, &["pod0"]);
        cluster.write("web.yaml", &web_yaml(&[], None));
        let pod = cluster.lab.pod(2);
        // A virtual server without real servers: the kernel refuses new connections.
        eventually(CONVERGE, POLL, || {
            match pod.tcp_request(sock(WEB_VIP), Duration::from_secs(3)) {
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => Ok(()),
                other => Err(format!("{other:?}\n{}", ipvsadm(&cluster))),
            }
        });
        assert!(
            ipvsadm(&cluster).contains("TCP 10.96.0.10:80 rr"),
            "the virtual server stays"
        );
    });
}

#[test]
fn cleanup_removes_kube_ipvs0_the_virtual_servers_sets_and_rules() {
    in_guest(
        "cleanup_removes_kube_ipvs0_the_virtual_servers_sets_and_rules",
        || {
            let mut cluster = web_cluster(&[0], 2, Some(30080));
            cluster.start_proxy(&[IPVS]);
            wait_spread(cluster.lab.pod(1), sock(WEB_VIP), 10, &["pod0"]);
            drop(cluster.proxy.take());
            let mut cleanup = cluster.node().command(proxy_binary());
            let status = cleanup.arg("--cleanup").status().unwrap();
            assert!(status.success(), "--cleanup failed");
            let node = cluster.node();
            assert!(
                node.ip(&["link", "show", "kube-ipvs0"]).is_err(),
                "kube-ipvs0 stays"
            );
            let listed = ipvsadm(&cluster);
            assert!(!listed.contains("TCP"), "{listed}");
            let sets = node.sh("ipset list -n").unwrap();
            assert!(!sets.contains("KUBE-"), "{sets}");
            let rules = cluster.iptables_save();
            assert!(
                !rules.contains("KUBE-IPVS-FILTER") && !rules.contains("KUBE-SERVICES"),
                "{rules}"
            );
        },
    );
}

#[test]
fn switching_from_iptables_to_ipvs_and_back_leaves_only_the_running_mode() {
    in_guest(
        "switching_from_iptables_to_ipvs_and_back_leaves_only_the_running_mode",
        || {
            let mut cluster = web_cluster(&[0, 1], 3, None);
            cluster.start_proxy(&[]);
            wait_spread(cluster.lab.pod(2), sock(WEB_VIP), 40, &["pod0", "pod1"]);
            assert!(cluster.iptables_save().contains("KUBE-SVC-"));
            drop(cluster.proxy.take());

            cluster.start_proxy(&[IPVS]);
            wait_spread(cluster.lab.pod(2), sock(WEB_VIP), 40, &["pod0", "pod1"]);
            let rules = cluster.iptables_save();
            assert!(
                !rules.contains("KUBE-SVC-") && !rules.contains("KUBE-SEP-"),
                "{rules}"
            );
            assert!(ipvsadm(&cluster).contains("TCP 10.96.0.10:80 rr"));
            drop(cluster.proxy.take());

            cluster.start_proxy(&[]);
            wait_spread(cluster.lab.pod(2), sock(WEB_VIP), 40, &["pod0", "pod1"]);
            assert!(
                cluster.node().ip(&["link", "show", "kube-ipvs0"]).is_err(),
                "kube-ipvs0 stays"
            );
            assert!(!ipvsadm(&cluster).contains("10.96.0.10"));
            assert!(!cluster.iptables_save().contains("KUBE-IPVS-FILTER"));
        },
    );
}

#[test]
fn ipvs_flags_reach_the_kernel_and_excluded_virtual_servers_stay() {
    in_guest(
        "ipvs_flags_reach_the_kernel_and_excluded_virtual_servers_stay",
        || {
            let mut cluster = web_cluster(&[0], 2, None);
            cluster
            .node()
            .sh("modprobe ip_vs && ipvsadm -A -t 192.0.2.9:80 -s rr && ipvsadm -A -t 198.51.100.9:80 -s rr")
            .unwrap();
            cluster.start_proxy(&[
                IPVS,
                "--ipvs-strict-arp",
                "--ipvs-exclude-cidrs=192.0.2.0/24",
                "--ipvs-tcp-timeout=900s",
                "--ipvs-scheduler=lc",
            ]);
            wait_spread(cluster.lab.pod(1), sock(WEB_VIP), 10, &["pod0"]);
            let listed = ipvsadm(&cluster);
            assert!(listed.contains("TCP 10.96.0.10:80 lc"), "{listed}");
            // Upstream deletes every virtual server of its family it did not make, except those
            // in --ipvs-exclude-cidrs.
            assert!(
                listed.contains("TCP 192.0.2.9:80 rr"),
                "excluded: stays\n{listed}"
            );
            assert!(
                !listed.contains("198.51.100.9"),
                "not excluded: deleted\n{listed}"
            );
            let node = cluster.node();
            assert_eq!(node.sysctl("net.ipv4.conf.all.arp_ignore").unwrap().trim(), "1");
            assert_eq!(node.sysctl("net.ipv4.conf.all.arp_announce").unwrap().trim(), "2");
            let timeouts = node.sh("ipvsadm -L --timeout").unwrap();
            assert!(timeouts.contains("900 "), "{timeouts}");
        },
    );
}
