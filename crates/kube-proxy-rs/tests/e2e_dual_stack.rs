//! Dual-stack end to end, with real IPv4 and IPv6 traffic in network namespaces: one
//! kube-proxy-rs runs both families (the lab's node can program both, so it runs dual-stack
//! as upstream would), IPv6-only Services and dual-stack Services answer on their cluster IPs
//! and on the node's IPv6 NodePort, and each family is synced, reported and cleaned up on
//! its own. Deadlines are ceilings against hangs, not speed checks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use kpr_netns::{CLIENT_IP_V6, NODE_IP, NODE_IP_V6, POD_GATEWAY_V6, eventually, spread_udp};
use support::families::{
    DUAL_STACK_CLUSTER_CIDR, Family, ip6tables_save, peers, service, slice, tcp_backends, udp_backends,
};
use support::*;

/// The IPv6 cluster IP of the tests' `web` Service (in kind's fd00:10:96::/112).
const WEB_VIP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x10);
/// The IPv4 cluster IP of the dual-stack `web` Service (as support's [`WEB_VIP`]).
const WEB_VIP_V4: &str = "10.96.0.10";
/// The IPv6 cluster IP of the UDP `dns` Service.
const DNS_VIP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x53);
const NODE_PORT: u16 = 30080;

fn at(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

fn sources(addresses: &[IpAddr]) -> BTreeSet<IpAddr> {
    addresses.iter().copied().collect()
}

#[test]
fn an_ipv6_only_service_answers_on_its_cluster_ip_and_on_the_nodes_ipv6_node_port() {
    // Pods 0-2 serve over IPv6; pod 3 is a client.
    let mut cluster = Cluster::new(4);
    let backends = tcp_backends(&cluster, Family::V6, &[0, 1, 2], 8080);
    let web = service("web", &[WEB_VIP_V6.into()], 80, 8080, "TCP", Some(NODE_PORT))
        + &slice("web", Family::V6, &[0, 1, 2], 8080, "TCP");
    cluster.write("web.yaml", &web);
    cluster.start_proxy(&[DUAL_STACK_CLUSTER_CIDR]);
    let all = ["pod0", "pod1", "pod2"];

    let vip = at(WEB_VIP_V6, 80);
    assert_fair(&wait_spread(cluster.lab.pod(3), vip, 150, &all));
    assert_fair(&wait_spread(cluster.node(), vip, 150, &all));
    let node_port = at(NODE_IP_V6, NODE_PORT);
    assert_fair(&wait_spread(cluster.lab.client(), node_port, 150, &all));

    // externalTrafficPolicy Cluster: the client's connections were masqueraded to the node's
    // bridge address, so replies return through the node.
    let seen = sources(&peers(&backends));
    assert!(!seen.contains(&IpAddr::from(CLIENT_IP_V6)), "{seen:?}");
    assert!(seen.contains(&IpAddr::from(POD_GATEWAY_V6)), "{seen:?}");

    // The Service lives in ip6tables only.
    let v6_rules = ip6tables_save(&cluster);
    assert!(v6_rules.contains("-d fd00:10:96::10/128"), "{v6_rules}");
    assert!(!cluster.iptables_save().contains("fd00:10:96::10"));
}

#[test]
fn udp_over_an_ipv6_cluster_ip_spreads_over_its_pods() {
    let mut cluster = Cluster::new(3);
    let _backends = udp_backends(&cluster, Family::V6, &[0, 1], 5353);
    let dns = service("dns", &[DNS_VIP_V6.into()], 53, 5353, "UDP", None)
        + &slice("dns", Family::V6, &[0, 1], 5353, "UDP");
    cluster.write("dns.yaml", &dns);
    cluster.start_proxy(&[DUAL_STACK_CLUSTER_CIDR]);
    let counts = eventually(CONVERGE, POLL, || {
        let counts = spread_udp(cluster.lab.pod(2), at(DNS_VIP_V6, 53), 150);
        let keys: Vec<&str> = counts.keys().map(String::as_str).collect();
        (keys == ["pod0", "pod1"])
            .then_some(counts.clone())
            .ok_or(format!("{counts:?}"))
    });
    assert_fair(&counts);
}

#[test]
fn a_dual_stack_service_answers_on_both_cluster_ips_and_both_node_ips() {
    let mut cluster = Cluster::new(3);
    let v4 = tcp_backends(&cluster, Family::V4, &[0, 1], 8080);
    let v6 = tcp_backends(&cluster, Family::V6, &[0, 1], 8080);
    let ips: [IpAddr; 2] = [WEB_VIP_V4.parse().unwrap(), WEB_VIP_V6.into()];
    let web = service("web", &ips, 80, 8080, "TCP", Some(NODE_PORT))
        + &slice("web", Family::V4, &[0, 1], 8080, "TCP")
        + &slice("web", Family::V6, &[0, 1], 8080, "TCP");
    cluster.write("web.yaml", &web);
    cluster.start_proxy(&[DUAL_STACK_CLUSTER_CIDR]);
    let both = ["pod0", "pod1"];

    for vip in [at(ips[0], 80), at(ips[1], 80)] {
        assert_fair(&wait_spread(cluster.lab.pod(2), vip, 100, &both));
    }
    for node_ip in [IpAddr::from(NODE_IP), IpAddr::from(NODE_IP_V6)] {
        assert_fair(&wait_spread(
            cluster.lab.client(),
            at(node_ip, NODE_PORT),
            100,
            &both,
        ));
    }
    // Each family's backends were reached over their own family only.
    assert!(peers(&v4).iter().all(IpAddr::is_ipv4), "{:?}", peers(&v4));
    assert!(peers(&v6).iter().all(IpAddr::is_ipv6), "{:?}", peers(&v6));
    assert!(!peers(&v6).is_empty());
}

#[test]
fn a_pod_reaches_itself_through_its_ipv6_service_masqueraded() {
    let mut cluster = Cluster::new(1);
    let backends = tcp_backends(&cluster, Family::V6, &[0], 8080);
    let web = service("web", &[WEB_VIP_V6.into()], 80, 8080, "TCP", None)
        + &slice("web", Family::V6, &[0], 8080, "TCP");
    cluster.write("web.yaml", &web);
    cluster.start_proxy(&[DUAL_STACK_CLUSTER_CIDR]);
    // Hairpin: without SNAT the reply would go pod -> pod directly and the client would
    // drop it, so the request would time out instead of being answered.
    wait_spread(cluster.lab.pod(0), at(WEB_VIP_V6, 80), 20, &["pod0"]);
    assert_eq!(
        sources(&peers(&backends)),
        [IpAddr::from(POD_GATEWAY_V6)].into(),
        "hairpin traffic not masqueraded"
    );
}

/// One sync loop per family: each reports under its own `ip_family` label, and `--cleanup`
/// removes what both left, in iptables and ip6tables.
#[test]
fn each_family_syncs_and_reports_on_its_own_and_cleanup_removes_both() {
    let mut cluster = Cluster::new(2);
    let _v4 = tcp_backends(&cluster, Family::V4, &[0], 8080);
    let _v6 = tcp_backends(&cluster, Family::V6, &[0], 8080);
    let ips: [IpAddr; 2] = [WEB_VIP_V4.parse().unwrap(), WEB_VIP_V6.into()];
    let web = service("web", &ips, 80, 8080, "TCP", None)
        + &slice("web", Family::V4, &[0], 8080, "TCP")
        + &slice("web", Family::V6, &[0], 8080, "TCP");
    cluster.write("web.yaml", &web);
    cluster.start_proxy(&[DUAL_STACK_CLUSTER_CIDR]);
    wait_spread(cluster.lab.pod(1), at(ips[1], 80), 5, &["pod0"]);

    for family in ["IPv4", "IPv6"] {
        let last_sync =
            format!("kubeproxy_sync_proxy_rules_last_timestamp_seconds{{ip_family=\"{family}\"}}");
        let rules =
            format!("kubeproxy_sync_proxy_rules_iptables_total{{ip_family=\"{family}\",table=\"nat\"}}");
        assert!(cluster.metric(&last_sync).unwrap_or(0.0) > 0.0, "{last_sync}");
        assert!(cluster.metric(&rules).unwrap_or(0.0) > 0.0, "{rules}");
    }
    let (status, body) = cluster.get(HEALTHZ, "/healthz").unwrap();
    assert_eq!(status, 200, "{body}");
    let logs = cluster.proxy_logs();
    assert!(logs.contains("kube-proxy running in dual-stack mode"), "{logs}");

    cluster.proxy.take().unwrap().stop().unwrap();
    let status = cluster
        .node()
        .command(proxy_binary())
        .arg("--cleanup")
        .status()
        .unwrap();
    assert!(status.success());
    let after = ip6tables_save(&cluster) + &cluster.node().sh("ip6tables-legacy-save").unwrap();
    assert!(!after.contains("KUBE-"), "left behind in ip6tables:\n{after}");
    assert!(!cluster.iptables_save().contains("KUBE-"));
}
