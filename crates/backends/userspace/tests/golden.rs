//! Golden tests of the portals: the exact `iptables-restore` input a sync writes, byte for
//! byte, for the service shapes userspace mode serves. Each file was read against
//! upstream's userspace proxier (chains, match order, REDIRECT for pods and the outside,
//! DNAT to the node's address for the node's own traffic, the NON-LOCAL accept).
//!
//! `UPDATE_GOLDEN=1 cargo nextest run -p kpr-userspace --test golden` rewrites the files;
//! review the diff before committing it.

#![allow(clippy::unwrap_used)]

use std::net::IpAddr;
use std::path::PathBuf;

use kpr_iptables::restore_syntax;
use kpr_model::IpFamily;
use kpr_userspace::portals::{Portal, PortalTargets, jump_rules, render};
use kpr_world::{World, ep};
use serde_json::{Value, json};

fn check_golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/{name}.txt"));
    kpr_world::golden::check(&path, actual);
}

const NODE_IP: &str = "192.168.1.10";

fn any_address() -> PortalTargets {
    PortalTargets {
        listen_ip: None,
        host_ip: NODE_IP.parse().unwrap(),
    }
}

/// The payload for every port of `world`, the listener ports given in port-name order.
fn payload(world: &mut World, listeners: &[u16], targets: PortalTargets) -> String {
    let state = world.state();
    let ports = state.ports();
    assert_eq!(ports.len(), listeners.len(), "one listener port per service port");
    let portals: Vec<Portal<'_>> = ports
        .iter()
        .zip(listeners)
        .map(|(port, &proxy_port)| Portal { port, proxy_port })
        .collect();
    let ruleset = render(&portals, targets);
    assert!(ruleset.refused.is_empty(), "{:?}", ruleset.refused);
    let text = ruleset.render_full().text;
    // Whatever the golden says, iptables-restore must read it.
    restore_syntax::check_payload(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
    text
}

fn http(spec: Value) -> World {
    let mut world = World::new();
    world.service("web", spec).slice(
        "web",
        json!([{"name": "http", "port": 8080}]),
        vec![ep("10.244.1.5")],
    );
    world
}

#[test]
fn cluster_ip() {
    let mut world = http(json!({"clusterIP": "10.96.0.10",
        "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}));
    check_golden("cluster_ip", &payload(&mut world, &[40001], any_address()));
}

#[test]
fn node_port_external_ip_and_load_balancer() {
    let mut world = http(json!({"type": "LoadBalancer", "clusterIP": "10.96.0.10",
        "externalIPs": ["198.51.100.10"],
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}],
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}}));
    check_golden(
        "node_port_external_ip_and_load_balancer",
        &payload(&mut world, &[40002], any_address()),
    );
}

#[test]
fn udp_and_tcp_ports_of_one_service() {
    let mut world = World::new();
    world
        .service(
            "dns",
            json!({"clusterIP": "10.96.0.53", "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 5353}]}),
        )
        .slice(
            "dns",
            json!([{"name": "dns", "port": 5353, "protocol": "UDP"},
                   {"name": "dns-tcp", "port": 5353, "protocol": "TCP"}]),
            vec![ep("10.244.1.5")],
        );
    check_golden(
        "udp_and_tcp",
        &payload(&mut world, &[40003, 40004], any_address()),
    );
}

#[test]
fn listeners_bound_to_one_address_are_reached_by_dnat() {
    let mut world = http(json!({"type": "NodePort", "clusterIP": "10.96.0.10",
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}));
    let bound = PortalTargets {
        listen_ip: Some("192.168.1.11".parse().unwrap()),
        host_ip: NODE_IP.parse().unwrap(),
    };
    let text = payload(&mut world, &[40005], bound);
    assert!(!text.contains("REDIRECT"), "{text}");
    check_golden("bound_address", &text);
}

#[test]
fn ipv6() {
    let mut world = World::with_family(IpFamily::V6);
    world
        .service(
            "web",
            json!({"type": "NodePort", "clusterIP": "fd00:10:96::10", "ipFamilies": ["IPv6"],
                   "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}),
        )
        .slice(
            "web",
            json!([{"name": "http", "port": 8080}]),
            vec![ep("fd00:10:244::5")],
        );
    let targets = PortalTargets {
        listen_ip: None,
        host_ip: "fd00::10".parse::<IpAddr>().unwrap(),
    };
    check_golden("ipv6", &payload(&mut world, &[40006], targets));
}

#[test]
fn no_services_leave_the_chains_empty_but_written() {
    let mut world = World::new();
    check_golden("empty", &payload(&mut world, &[], any_address()));
}

#[test]
fn jumps_put_the_portals_above_the_node_ports() {
    let jumps: Vec<String> = jump_rules()
        .iter()
        .map(|j| format!("{} {} {}", j.table, j.chain, j.args.join(" ")))
        .collect();
    assert_eq!(
        jumps,
        [
            "nat PREROUTING -m addrtype --dst-type LOCAL -m comment --comment handle service NodePorts -j KUBE-NODEPORT-CONTAINER",
            "nat OUTPUT -m addrtype --dst-type LOCAL -m comment --comment handle service NodePorts -j KUBE-NODEPORT-HOST",
            "nat PREROUTING -m comment --comment handle ClusterIPs -j KUBE-PORTALS-CONTAINER",
            "nat OUTPUT -m comment --comment handle ClusterIPs -j KUBE-PORTALS-HOST",
            "filter INPUT -m conntrack --ctstate NEW -m comment --comment Ensure that non-local NodePort traffic can flow -j KUBE-NODEPORT-NON-LOCAL",
        ],
        "each is inserted at the top in this order: the last ones end up first"
    );
}
