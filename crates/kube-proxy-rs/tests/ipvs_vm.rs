//! ipvs mode end to end, in a throw-away guest booting Debian's kernel (this host's kernel
//! has no IPVS): the lab's namespaces, backends and the real binary inside the guest, real
//! TCP through the Service addresses, as the other modes' end-to-end tests do on the host.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use kpr_netns::{NODE_IP, NODE_IP_V6, eventually, pod_ip};
use kpr_vm::{Guest, squeeze_columns};
use support::families::{DUAL_STACK_CLUSTER_CIDR, Family, peers, service, slice, tcp_backends};
use support::*;

const IPVS: &str = "--proxy-mode=ipvs";

/// Runs `body` in a guest that has the binary under test.
fn in_guest(test: &str, body: impl FnOnce()) {
    Guest::new()
        .binary(env!("CARGO_BIN_EXE_kube-proxy-rs"))
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
fn scaling_down_to_zero_and_up_again_follows_the_endpoints() {
    in_guest("scaling_down_to_zero_and_up_again_follows_the_endpoints", || {
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
        cluster.write("web.yaml", &web_yaml(&[0, 1], None));
        assert_fair(&wait_spread(
            cluster.lab.pod(2),
            sock(WEB_VIP),
            100,
            &["pod0", "pod1"],
        ));
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

/// pod1 holds one connection made through the cluster IP when it leaves the Service: its
/// real server stays at weight 0 (new connections go to pod0) and the held connection keeps
/// carrying bytes; once that connection is gone, the real server is deleted.
#[test]
fn a_removed_pod_drains_at_weight_zero_until_its_connection_ends() {
    in_guest(
        "a_removed_pod_drains_at_weight_zero_until_its_connection_ends",
        || {
            let mut cluster = web_cluster(&[0], 3, None);
            cluster.write("web.yaml", &web_yaml(&[1], None));
            cluster.start_proxy(&[IPVS, "--ipvs-sync-period=1s"]);
            let listener = cluster
                .lab
                .pod(1)
                .run(|| TcpListener::bind((pod_ip(1), 8080)))
                .unwrap();
            let mut client = eventually(CONVERGE, POLL, || {
                let pod = cluster.lab.pod(2);
                pod.run(|| TcpStream::connect_timeout(&sock(WEB_VIP), Duration::from_secs(2)))
                    .map_err(|e| format!("{e}\n{}", ipvsadm(&cluster)))
            });
            let (mut served, _) = listener.accept().unwrap();
            exchange(&mut client, &mut served);

            cluster.write("web.yaml", &web_yaml(&[0], None));
            let draining = format!("-> {}:8080 Masq 0 ", pod_ip(1));
            eventually(CONVERGE, POLL, || {
                let listed = ipvsadm(&cluster);
                listed.contains(&draining).then_some(()).ok_or(listed)
            });
            assert_eq!(
                wait_spread(cluster.lab.pod(2), sock(WEB_VIP), 20, &["pod0"]).len(),
                1
            );
            exchange(&mut client, &mut served);

            // A reset ends the connection at once (a FIN would leave it in TIME_WAIT for two
            // minutes, which still counts): the next syncs find the real server idle.
            for end in [&client, &served] {
                reset_on_close(end);
            }
            drop((client, served));
            let gone = format!("{}:8080", pod_ip(1));
            eventually(Duration::from_secs(90), POLL, || {
                let listed = ipvsadm(&cluster);
                (!listed.contains(&gone)).then_some(()).ok_or(listed)
            });
            assert!(ipvsadm(&cluster).contains(&format!("-> {}:8080 Masq 1 ", pod_ip(0))));
        },
    );
}

/// One round trip each way over a held connection.
fn exchange(client: &mut TcpStream, served: &mut TcpStream) {
    let mut got = [0u8; 4];
    client.write_all(b"ping").unwrap();
    served.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ping");
    served.write_all(b"pong").unwrap();
    client.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"pong");
}

/// Makes closing `stream` send a reset instead of a FIN.
fn reset_on_close(stream: &TcpStream) {
    let linger = nix::libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    nix::sys::socket::setsockopt(stream, nix::sys::socket::sockopt::Linger, &linger).unwrap();
}

/// A dual-stack Service in ipvs mode: one proxy runs both families, each with its own
/// virtual servers (an IPv6 cluster IP on kube-ipvs0 too), both cluster IPs and both node
/// addresses' NodePorts spread over the pods, each family's pods reached over their own.
#[test]
fn a_dual_stack_service_answers_on_both_families_in_ipvs_mode() {
    in_guest(
        "a_dual_stack_service_answers_on_both_families_in_ipvs_mode",
        || {
            let mut cluster = Cluster::new(3);
            let v4 = tcp_backends(&cluster, Family::V4, &[0, 1], 8080);
            let v6 = tcp_backends(&cluster, Family::V6, &[0, 1], 8080);
            let vip_v6: IpAddr = "fd00:10:96::10".parse().unwrap();
            let ips: [IpAddr; 2] = [sock(WEB_VIP).ip(), vip_v6];
            let web = service("web", &ips, 80, 8080, "TCP", Some(30080))
                + &slice("web", Family::V4, &[0, 1], 8080, "TCP")
                + &slice("web", Family::V6, &[0, 1], 8080, "TCP");
            cluster.write("web.yaml", &web);
            cluster.start_proxy(&[IPVS, DUAL_STACK_CLUSTER_CIDR]);
            let both = ["pod0", "pod1"];
            for vip in ips {
                assert_fair(&wait_spread(
                    cluster.lab.pod(2),
                    SocketAddr::new(vip, 80),
                    100,
                    &both,
                ));
            }
            for node_ip in [IpAddr::from(NODE_IP), IpAddr::from(NODE_IP_V6)] {
                let node_port = SocketAddr::new(node_ip, 30080);
                assert_fair(&wait_spread(cluster.lab.client(), node_port, 100, &both));
            }
            assert!(peers(&v4).iter().all(IpAddr::is_ipv4), "{:?}", peers(&v4));
            assert!(peers(&v6).iter().all(IpAddr::is_ipv6), "{:?}", peers(&v6));
            let listed = ipvsadm(&cluster);
            assert!(listed.contains("TCP [fd00:10:96::10]:80 rr"), "{listed}");
            let link = cluster.node().sh("ip -6 addr show dev kube-ipvs0").unwrap();
            assert!(link.contains("inet6 fd00:10:96::10/128"), "{link}");
        },
    );
}

/// pod0 keeps answering but leaves the UDP Service: the same flow (one source port, polled
/// so its entries never expire) must reach pod1. In ipvs mode the kernel does most of this
/// itself (`expire_nodest_conn` drops the IPVS connection to a deleted real server; the flow
/// moved in a run without the conntrack cleanup too), so this is the user's view of the
/// semantics, not a test of the cleanup that runs after every sync as upstream's does.
#[test]
fn a_udp_flow_moves_when_its_endpoint_leaves_the_service_in_ipvs_mode() {
    in_guest(
        "a_udp_flow_moves_when_its_endpoint_leaves_the_service_in_ipvs_mode",
        || assert_a_udp_flow_moves_off_a_removed_pod(&[IPVS]),
    );
}

/// nftables -> ipvs -> nftables: each start removes the other mode's objects (the
/// `kube-proxy` table; kube-ipvs0, the virtual servers, sets and rules), and the Service
/// answers from both pods in each.
#[test]
fn switching_between_nftables_and_ipvs_leaves_only_the_running_mode() {
    in_guest(
        "switching_between_nftables_and_ipvs_leaves_only_the_running_mode",
        || {
            let mut cluster = web_cluster(&[0, 1], 3, None);
            cluster.start_proxy(&["--proxy-mode=nftables"]);
            wait_spread(cluster.lab.pod(2), sock(WEB_VIP), 40, &["pod0", "pod1"]);
            assert!(
                nft_tables(&cluster).contains("kube-proxy"),
                "{}",
                nft_tables(&cluster)
            );
            drop(cluster.proxy.take());

            cluster.start_proxy(&[IPVS]);
            wait_spread(cluster.lab.pod(2), sock(WEB_VIP), 40, &["pod0", "pod1"]);
            assert!(
                !nft_tables(&cluster).contains("kube-proxy"),
                "{}",
                nft_tables(&cluster)
            );
            assert!(ipvsadm(&cluster).contains("TCP 10.96.0.10:80 rr"));
            drop(cluster.proxy.take());

            cluster.start_proxy(&["--proxy-mode=nftables"]);
            wait_spread(cluster.lab.pod(2), sock(WEB_VIP), 40, &["pod0", "pod1"]);
            let node = cluster.node();
            assert!(
                node.ip(&["link", "show", "kube-ipvs0"]).is_err(),
                "kube-ipvs0 stays"
            );
            assert!(!ipvsadm(&cluster).contains("10.96.0.10"));
            let sets = node.sh("ipset list -n").unwrap();
            assert!(!sets.contains("KUBE-"), "{sets}");
            assert!(!cluster.iptables_save().contains("KUBE-IPVS-FILTER"));
        },
    );
}

fn nft_tables(cluster: &Cluster) -> String {
    cluster.node().sh("nft list tables").unwrap()
}

/// Someone deletes the Service's virtual server and flushes the cluster-IP set behind the
/// proxy's back: the next full sync (every `--ipvs-sync-period`) finds and repairs both,
/// with no change to the Services.
#[test]
fn a_deleted_virtual_server_and_a_flushed_set_are_repaired_within_a_sync_period() {
    in_guest(
        "a_deleted_virtual_server_and_a_flushed_set_are_repaired_within_a_sync_period",
        || {
            let mut cluster = web_cluster(&[0, 1], 3, None);
            cluster.start_proxy(&[IPVS, "--ipvs-sync-period=2s"]);
            wait_spread(cluster.lab.pod(2), sock(WEB_VIP), 40, &["pod0", "pod1"]);
            let node = cluster.node();
            // Both succeed only on what exists (a sync may repair them at any moment after).
            node.sh("ipvsadm -D -t 10.96.0.10:80 && ipset flush KUBE-CLUSTER-IP")
                .unwrap();
            eventually(CONVERGE, POLL, || {
                let listed = ipvsadm(&cluster);
                let members = node.sh("ipset list KUBE-CLUSTER-IP").unwrap();
                let repaired =
                    listed.contains("TCP 10.96.0.10:80 rr") && members.contains("10.96.0.10,tcp:80");
                repaired.then_some(()).ok_or(format!("{listed}\n{members}"))
            });
            assert_fair(&wait_spread(
                cluster.lab.pod(2),
                sock(WEB_VIP),
                100,
                &["pod0", "pod1"],
            ));
        },
    );
}
