//! Golden tests: the exact `nft -f` script a full sync loads (`render_dry_run`), for each
//! Service feature, byte for byte. The kernel tests load these shapes for real.
//!
//! `UPDATE_GOLDEN=1 cargo nextest run -p kpr-nftables --test golden` rewrites the files;
//! review the diff before committing it.

#![allow(clippy::unwrap_used)]

mod common;

use common::{check_golden, clusterip, http_port, http_slice_port, nodeport_web, options, web};
use kpr_host::NodePortAddresses;
use kpr_model::IpFamily;
use kpr_nftables::{LocalhostNodePorts, NftablesOptions, render_dry_run};
use kpr_world::{World, ep};
use serde_json::json;

fn render(world: &mut World, opts: &NftablesOptions) -> String {
    render_dry_run(&world.state(), opts, &[])
}

/// The lines of `text` that carry elements of `set`, joined.
fn elements_of(text: &str, set: &str) -> String {
    let prefix = format!(" {set} {{ ");
    text.lines()
        .filter(|l| l.starts_with("add element") && l.contains(&prefix))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn clusterip_without_endpoints_rejects() {
    let mut world = World::new();
    world.service("web", clusterip("10.96.0.10", http_port()));
    let text = render(&mut world, &options());
    assert!(text.contains(
        "add element ip kube-proxy no-endpoint-reject-ips { 10.96.0.10 . tcp . 80 comment \"default/web:http\" }"
    ));
    assert!(
        !text.contains("add chain ip kube-proxy pick-"),
        "no shared chain without endpoints"
    );
    check_golden("clusterip_0_endpoints", &text);
}

#[test]
fn clusterip_with_three_endpoints_is_elements_only() {
    let mut world = web(vec![ep("10.244.1.5"), ep("10.244.2.6"), ep("10.244.3.7")]);
    let text = render(&mut world, &options());
    assert!(
        text.contains(
            "pick-service-endpoints-tcp-3-ips { 10.96.0.10 . tcp . 80 comment \"default/web:http\" }"
        )
    );
    assert!(text.contains(
        "add rule ip kube-proxy pick-service-endpoints-tcp-3 dnat to ip daddr . tcp dport . numgen random mod 3 map @service-endpoints-tcp-3"
    ));
    assert_eq!(
        elements_of(&text, "service-endpoints-tcp-3"),
        "add element ip kube-proxy service-endpoints-tcp-3 { 10.96.0.10 . 80 . 0 : 10.244.1.5 . 8080, 10.96.0.10 . 80 . 1 : 10.244.2.6 . 8080, 10.96.0.10 . 80 . 2 : 10.244.3.7 . 8080 }"
    );
    check_golden("clusterip_3_endpoints", &text);
}

/// Many Services with the same endpoint count share one chain: chains do not grow with
/// the number of Services.
#[test]
fn services_with_the_same_count_share_one_chain() {
    let mut world = World::new();
    for i in 0..20 {
        let name = format!("svc{i}");
        world
            .service(&name, clusterip(&format!("10.96.1.{i}"), http_port()))
            .slice(
                &name,
                http_slice_port(),
                vec![ep(&format!("10.244.1.{i}")), ep(&format!("10.244.2.{i}"))],
            );
    }
    let text = render(&mut world, &options());
    let chains = text.lines().filter(|l| l.starts_with("add chain")).count();
    let sets = text
        .lines()
        .filter(|l| l.starts_with("add set") || l.starts_with("add map"))
        .count();
    let mut one = web(vec![ep("10.244.1.5"), ep("10.244.2.6")]);
    let one = render(&mut one, &options());
    assert_eq!(chains, one.lines().filter(|l| l.starts_with("add chain")).count());
    assert_eq!(
        sets,
        one.lines()
            .filter(|l| l.starts_with("add set") || l.starts_with("add map"))
            .count()
    );
}

#[test]
fn nodeport_with_cluster_policy_masquerades() {
    let mut world = World::new();
    world.service("web", nodeport_web(json!({}))).slice(
        "web",
        http_slice_port(),
        vec![ep("10.244.1.5"), ep("10.244.2.6")],
    );
    let text = render(&mut world, &options());
    assert!(
        text.contains("masq-nodeport-endpoints-tcp-2-nodeports { tcp . 30080 comment \"default/web:http\" }")
    );
    assert!(text.contains("add rule ip kube-proxy masq-nodeport-endpoints-tcp-2 jump mark-for-masquerade"));
    assert!(text.contains(
        "nodeport-endpoints-tcp-2 { 30080 . 0 : 10.244.1.5 . 8080, 30080 . 1 : 10.244.2.6 . 8080 }"
    ));
    assert!(text.contains("add rule ip kube-proxy service-dispatch fib daddr type local ip daddr != 127.0.0.0/8 goto nodeport-dispatch"));
    assert!(text.contains("add rule ip kube-proxy nodeport-dispatch meta l4proto . th dport @masq-nodeport-endpoints-tcp-2-nodeports goto masq-nodeport-endpoints-tcp-2"));
    check_golden("nodeport", &text);
}

#[test]
fn nodeport_addresses_use_the_nodeport_ips_set() {
    let mut world = World::new();
    world
        .service("web", nodeport_web(json!({})))
        .slice("web", http_slice_port(), vec![ep("10.244.1.5")]);
    let opts = NftablesOptions {
        nodeport_addresses: NodePortAddresses::Cidrs(vec!["192.168.77.0/24".parse().unwrap()]),
        ..options()
    };
    let locals = [
        "192.168.77.1".parse().unwrap(),
        "10.0.0.1".parse().unwrap(),
        "127.0.0.1".parse().unwrap(),
    ];
    let text = render_dry_run(&world.state(), &opts, &locals);
    assert_eq!(
        elements_of(&text, "nodeport-ips"),
        "add element ip kube-proxy nodeport-ips { 192.168.77.1 }"
    );
    assert!(
        text.contains(
            "add rule ip kube-proxy service-dispatch ip daddr @nodeport-ips goto nodeport-dispatch"
        )
    );
    check_golden("nodeport_addresses", &text);
}

#[test]
fn external_traffic_policy_local() {
    let mut world = World::new();
    world
        .service(
            "web",
            nodeport_web(json!({"externalTrafficPolicy": "Local", "externalIPs": ["203.0.113.9"]})),
        )
        .slice(
            "web",
            http_slice_port(),
            vec![ep("10.244.1.5 local"), ep("10.244.2.6"), ep("10.244.3.7")],
        );
    let text = render(&mut world, &options());
    let chain = "local-nodeport-endpoints-tcp-1-via-nodeport-shortcut-tcp-3";
    assert!(text.contains(&format!(
        "{chain}-nodeports {{ tcp . 30080 comment \"default/web:http\" }}"
    )));
    assert!(text.contains(&format!(
        "add rule ip kube-proxy {chain} ip saddr 10.244.0.0/16 goto pick-nodeport-shortcut-tcp-3"
    )));
    assert!(text.contains(&format!(
        "add rule ip kube-proxy {chain} fib saddr type local jump mark-for-masquerade"
    )));
    assert!(text.contains(&format!(
        "add rule ip kube-proxy {chain} goto pick-nodeport-endpoints-tcp-1"
    )));
    assert!(
        text.contains(
            "local-service-endpoints-tcp-1-via-service-shortcut-tcp-3-ips { 203.0.113.9 . tcp . 80 comment \"default/web:http\" }"
        )
    );
    check_golden("external_traffic_policy_local", &text);
}

#[test]
fn external_traffic_policy_local_without_local_endpoints_drops_outside_traffic() {
    let mut world = World::new();
    world
        .service("web", nodeport_web(json!({"externalTrafficPolicy": "Local"})))
        .slice("web", http_slice_port(), vec![ep("10.244.2.6")]);
    let text = render(&mut world, &options());
    assert!(text.contains("no-endpoint-drop-nodeports { tcp . 30080 comment \"default/web:http\" }"));
    // Pods and the node still reach the Service through the NodePort.
    assert!(text.contains(
        "local-none-via-nodeport-shortcut-tcp-1-nodeports { tcp . 30080 comment \"default/web:http\" }"
    ));
    check_golden("external_traffic_policy_local_no_local", &text);
}

#[test]
fn internal_traffic_policy_local() {
    let mut world = World::new();
    world
        .service("web", json!({"type": "ClusterIP", "clusterIP": "10.96.0.10", "internalTrafficPolicy": "Local", "ports": http_port()}))
        .slice("web", http_slice_port(), vec![ep("10.244.1.5 local"), ep("10.244.2.6")]);
    let text = render(&mut world, &options());
    assert_eq!(
        elements_of(&text, "service-endpoints-tcp-1"),
        "add element ip kube-proxy service-endpoints-tcp-1 { 10.96.0.10 . 80 . 0 : 10.244.1.5 . 8080 }"
    );
    check_golden("internal_traffic_policy_local", &text);

    let mut none = World::new();
    none.service("web", json!({"type": "ClusterIP", "clusterIP": "10.96.0.10", "internalTrafficPolicy": "Local", "ports": http_port()}))
        .slice("web", http_slice_port(), vec![ep("10.244.2.6")]);
    let text = render(&mut none, &options());
    assert!(text.contains("no-endpoint-drop-ips { 10.96.0.10 . tcp . 80 comment \"default/web:http\" }"));
}

#[test]
fn loadbalancer_with_source_ranges() {
    let mut world = World::new();
    world
        .service(
            "web",
            json!({"type": "LoadBalancer", "clusterIP": "10.96.0.10",
                   "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}],
                   "loadBalancerSourceRanges": ["192.0.2.0/24", "198.51.100.7/32"],
                   "status": {"loadBalancer": {"ingress": [{"ip": "5.6.7.8"}]}}}),
        )
        .slice("web", http_slice_port(), vec![ep("10.244.1.5")]);
    let text = render(&mut world, &options());
    assert_eq!(
        elements_of(&text, "firewall-ips"),
        "add element ip kube-proxy firewall-ips { 5.6.7.8 . tcp . 80 }"
    );
    assert_eq!(
        elements_of(&text, "firewall-allow"),
        "add element ip kube-proxy firewall-allow { 5.6.7.8 . tcp . 80 . 192.0.2.0/24, 5.6.7.8 . tcp . 80 . 198.51.100.7 }"
    );
    assert!(text.contains("add rule ip kube-proxy firewall-check ip daddr . meta l4proto . th dport @firewall-ips ip daddr . meta l4proto . th dport . ip saddr != @firewall-allow drop"));
    check_golden("loadbalancer_source_ranges", &text);
}

#[test]
fn clientip_affinity() {
    let mut world = World::new();
    world
        .service(
            "web",
            json!({"type": "ClusterIP", "clusterIP": "10.96.0.10", "ports": http_port(),
                   "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}),
        )
        .slice("web", http_slice_port(), vec![ep("10.244.1.5"), ep("10.244.2.6")]);
    let text = render(&mut world, &options());
    assert!(text.contains(
        "sticky-service-endpoints-tcp-2-t60-ips { 10.96.0.10 . tcp . 80 comment \"default/web:http\" }"
    ));
    assert!(text.contains("add rule ip kube-proxy slot-service-endpoints-tcp-2-t60-1 update @affinity-service-endpoints-tcp { ip saddr . ip daddr . tcp dport . numgen random mod 1 offset 1 timeout 60s }"));
    check_golden("clientip_affinity", &text);
}

#[test]
fn udp_and_sctp_use_their_own_maps() {
    let mut world = World::new();
    world
        .service(
            "dns",
            json!({"type": "ClusterIP", "clusterIP": "10.96.0.53",
                   "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                             {"name": "s", "port": 9, "protocol": "SCTP"}]}),
        )
        .slice(
            "dns",
            json!([{"name": "dns", "port": 5353, "protocol": "UDP"}, {"name": "dns-tcp", "port": 5353}, {"name": "s", "port": 99, "protocol": "SCTP"}]),
            vec![ep("10.244.1.5")],
        );
    let text = render(&mut world, &options());
    assert!(
        text.contains(
            "pick-service-endpoints-udp-1-ips { 10.96.0.53 . udp . 53 comment \"default/dns:dns\" }"
        )
    );
    assert!(text.contains("service-endpoints-sctp-1 { 10.96.0.53 . 9 . 0 : 10.244.1.5 . 99 }"));
    assert_eq!(
        elements_of(&text, "cluster-ips"),
        "add element ip kube-proxy cluster-ips { 10.96.0.53 }"
    );
    check_golden("udp_sctp", &text);
}

#[test]
fn masquerade_all_and_other_detectors() {
    let mut world = web(vec![ep("10.244.1.5")]);
    let opts = NftablesOptions {
        masquerade_all: true,
        ..options()
    };
    let text = render(&mut world, &opts);
    assert!(text.contains("add rule ip kube-proxy services ip daddr @cluster-ips jump mark-for-masquerade"));
    let opts = NftablesOptions {
        local_detector: kpr_host::LocalDetector::InterfaceNamePrefix(
            kpr_model::text::InterfaceName::prefix("veth").unwrap(),
        ),
        ..options()
    };
    let text = render(&mut world, &opts);
    assert!(text.contains(
        "add rule ip kube-proxy services ip daddr @cluster-ips iifname != \"veth*\" jump mark-for-masquerade"
    ));
    check_golden(
        "masquerade_all",
        &render(
            &mut world,
            &NftablesOptions {
                masquerade_all: true,
                ..options()
            },
        ),
    );
}

#[test]
fn ipv6_uses_the_ip6_table() {
    let mut world = World::with_family(IpFamily::V6);
    world
        .service(
            "web",
            nodeport_web(json!({"clusterIP": "fd00:96::10", "ipFamilies": ["IPv6"]})),
        )
        .slice("web", http_slice_port(), vec![ep("fd00:10:244:1::5")]);
    let opts = NftablesOptions {
        family: IpFamily::V6,
        local_detector: kpr_host::LocalDetector::ClusterCidr(vec!["fd00:10:244::/56".parse().unwrap()]),
        ..options()
    };
    let text = render(&mut world, &opts);
    assert!(text.contains(
        "pick-service-endpoints-tcp-1-ips { fd00:96::10 . tcp . 80 comment \"default/web:http\" }"
    ));
    assert!(text.contains("add element ip6 kube-proxy service-cidrs { fd00:96::/112 }"));
    assert!(text.contains("ip6 daddr != ::1 goto nodeport-dispatch"));
    check_golden("ipv6_nodeport", &text);
}

#[test]
fn terminating_endpoints_are_a_fallback() {
    let mut world = web(vec![
        ep("10.244.1.5 serving terminating"),
        ep("10.244.2.6 serving terminating"),
    ]);
    let text = render(&mut world, &options());
    assert!(text.contains("goto pick-service-endpoints-tcp-2"));
    let mut world = web(vec![ep("10.244.1.5 serving terminating"), ep("10.244.2.6")]);
    let text = render(&mut world, &options());
    assert!(
        text.contains("goto pick-service-endpoints-tcp-1"),
        "ready endpoints win"
    );
}

#[test]
fn topology_hints_narrow_the_cluster_slots() {
    let mut world = web(vec![
        ep("10.244.1.5 hint-zone=z1"),
        ep("10.244.2.6 hint-zone=z2"),
        ep("10.244.3.7 hint-zone=z1"),
    ]);
    let text = render(&mut world, &options());
    assert_eq!(
        elements_of(&text, "service-endpoints-tcp-2"),
        "add element ip kube-proxy service-endpoints-tcp-2 { 10.96.0.10 . 80 . 0 : 10.244.1.5 . 8080, 10.96.0.10 . 80 . 1 : 10.244.3.7 . 8080 }"
    );
    assert!(text.contains("goto pick-service-endpoints-tcp-2"));
    check_golden("topology_hints", &text);
}

#[test]
fn both_traffic_policies_local() {
    let mut world = World::new();
    world
        .service(
            "web",
            nodeport_web(json!({"externalTrafficPolicy": "Local", "internalTrafficPolicy": "Local"})),
        )
        .slice(
            "web",
            http_slice_port(),
            vec![ep("10.244.1.5 local"), ep("10.244.2.6")],
        );
    let text = render(&mut world, &options());
    // The cluster IP reaches the local endpoint only; pods and the node reach both through
    // the NodePort's short-circuit.
    assert!(
        text.contains(
            "pick-service-endpoints-tcp-1-ips { 10.96.0.10 . tcp . 80 comment \"default/web:http\" }"
        )
    );
    assert!(text.contains("local-nodeport-endpoints-tcp-1-via-nodeport-shortcut-tcp-2-nodeports { tcp . 30080 comment \"default/web:http\" }"));
    check_golden("both_traffic_policies_local", &text);
}

#[test]
fn nodeport_without_endpoints_rejects_everywhere() {
    let mut world = World::new();
    world.service("web", nodeport_web(json!({"externalIPs": ["203.0.113.9"]})));
    let text = render(&mut world, &options());
    assert!(text.contains("no-endpoint-reject-nodeports { tcp . 30080 comment \"default/web:http\" }"));
    assert!(text.contains("no-endpoint-reject-ips { 10.96.0.10 . tcp . 80 comment \"default/web:http\", 203.0.113.9 . tcp . 80 comment \"default/web:http\" }"));
    assert!(
        !text.contains(" goto pick-") && !text.contains(" goto masq-"),
        "no entry set, no dispatch rule without endpoints:\n{text}"
    );
    check_golden("nodeport_0_endpoints", &text);
}

/// NodePorts of every protocol, one without endpoints: the shape the localhost NodePort
/// goldens share.
fn nodeports_of_every_protocol(family: IpFamily) -> World {
    let (vip, empty_vip, endpoint) = match family {
        IpFamily::V4 => ("10.96.0.53", "10.96.0.10", "10.244.1.5"),
        IpFamily::V6 => ("fd00:96::53", "fd00:96::10", "fd00:10:244:1::5"),
    };
    let mut world = World::with_family(family);
    world
        .service(
            "multi",
            json!({"type": "NodePort", "clusterIP": vip, "ipFamilies": [family.label()],
                   "ports": [{"name": "web", "port": 80, "targetPort": 8080, "nodePort": 30080},
                             {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053},
                             {"name": "s", "port": 9, "protocol": "SCTP", "nodePort": 30009}]}),
        )
        .slice(
            "multi",
            json!([{"name": "web", "port": 8080}, {"name": "dns", "port": 5353, "protocol": "UDP"},
                   {"name": "s", "port": 99, "protocol": "SCTP"}]),
            vec![ep(endpoint)],
        )
        .service(
            "empty",
            json!({"type": "NodePort", "clusterIP": empty_vip, "ipFamilies": [family.label()],
                   "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30081}]}),
        );
    world
}

/// Localhost NodePorts with the proxy running (the gate on, `localhost` among the NodePort
/// addresses): every NodePort is an element of `localhost-nodeports`, and UDP and SCTP to
/// a loopback NodePort are counted and rejected; TCP is left to the proxy's listeners.
#[test]
fn localhost_nodeports_with_the_proxy_reject_udp_and_sctp() {
    let mut world = nodeports_of_every_protocol(IpFamily::V4);
    let opts = NftablesOptions {
        localhost_nodeports: LocalhostNodePorts::Proxied,
        ..options()
    };
    let text = render(&mut world, &opts);
    assert!(text.contains("add counter ip kube-proxy localhost-nodeport-rejected-udp\n"));
    assert!(text.contains("add counter ip kube-proxy localhost-nodeport-rejected-sctp\n"));
    assert!(!text.contains("localhost-nodeport-rejected-tcp"), "{text}");
    assert!(text.contains("add set ip kube-proxy localhost-nodeports { type inet_proto . inet_service ; }"));
    assert!(text.contains(
        "add rule ip kube-proxy nodeport-endpoints-check ip daddr 127.0.0.0/8 meta l4proto udp meta l4proto . th dport @localhost-nodeports counter name \"localhost-nodeport-rejected-udp\" reject"
    ));
    assert_eq!(
        elements_of(&text, "localhost-nodeports"),
        "add element ip kube-proxy localhost-nodeports { tcp . 30081 comment \"default/empty:http\", udp . 30053 comment \"default/multi:dns\", sctp . 30009 comment \"default/multi:s\", tcp . 30080 comment \"default/multi:web\" }"
    );
    // The counters exist before the rules that count into them.
    let counter = text.find("add counter").unwrap();
    assert!(counter < text.find("add rule").unwrap());
    check_golden("localhost_nodeports_proxied", &text);
}

/// The gate on without a loopback NodePort address: TCP is counted and rejected as well.
#[test]
fn localhost_nodeports_without_the_proxy_reject_every_protocol() {
    let mut world = nodeports_of_every_protocol(IpFamily::V4);
    let opts = NftablesOptions {
        localhost_nodeports: LocalhostNodePorts::Rejected,
        ..options()
    };
    let text = render(&mut world, &opts);
    for proto in ["tcp", "udp", "sctp"] {
        assert!(text.contains(&format!(
            "add rule ip kube-proxy nodeport-endpoints-check ip daddr 127.0.0.0/8 meta l4proto {proto} meta l4proto . th dport @localhost-nodeports counter name \"localhost-nodeport-rejected-{proto}\" reject"
        )), "{proto}: {text}");
    }
    check_golden("localhost_nodeports_rejected", &text);

    let mut world = nodeports_of_every_protocol(IpFamily::V6);
    let opts = NftablesOptions {
        family: IpFamily::V6,
        local_detector: kpr_host::LocalDetector::ClusterCidr(vec!["fd00:10:244::/56".parse().unwrap()]),
        localhost_nodeports: LocalhostNodePorts::Proxied,
        ..options()
    };
    let text = render(&mut world, &opts);
    assert!(text.contains(
        "add rule ip6 kube-proxy nodeport-endpoints-check ip6 daddr ::1 meta l4proto sctp meta l4proto . th dport @localhost-nodeports counter name \"localhost-nodeport-rejected-sctp\" reject"
    ));
    check_golden("localhost_nodeports_ipv6", &text);
}

/// The gate off (the default): none of it, whatever the NodePort addresses say.
#[test]
fn localhost_nodeports_off_add_nothing() {
    let mut world = nodeports_of_every_protocol(IpFamily::V4);
    let opts = NftablesOptions {
        nodeport_addresses: NodePortAddresses::Cidrs(vec!["127.0.0.0/8".parse().unwrap()]),
        ..options()
    };
    let text = render(&mut world, &opts);
    assert!(!text.contains("localhost"), "{text}");
    assert!(!text.contains("counter"), "{text}");
}
