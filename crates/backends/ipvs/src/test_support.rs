//! Shared by the crate's unit tests: Services as the API shows them (through kpr-world's
//! real conversions), the plan of a typical node, golden files.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::PathBuf;

use k8s_openapi::api::core::v1 as core_v1;
use kpr_ipvs_netlink::Scheduler;
use kpr_model::IpFamily;
use kpr_world::World;
use serde_json::{Value, json};

use crate::{IpvsPlan, PlanInputs, plan};

pub const NODE_ADDRESSES: [&str; 2] = ["192.168.0.10", "172.17.0.1"];

pub fn check(name: &str, text: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/{name}"));
    kpr_world::golden::check(&path, text);
}

pub fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|ip| ip.parse().unwrap()).collect()
}

pub fn plan_of(world: &mut World, scheduler: &str) -> IpvsPlan {
    let node_ports = ips(&NODE_ADDRESSES);
    let others: BTreeSet<IpAddr> = node_ports.iter().copied().chain(ips(&["203.0.113.50"])).collect();
    let scheduler = Scheduler::new(scheduler).unwrap();
    let inputs = PlanInputs {
        family: IpFamily::V4,
        scheduler: &scheduler,
        node_port_addresses: &node_ports,
        other_interface_addresses: &others,
        node_ip: Some("192.168.0.10".parse().unwrap()),
    };
    plan(&world.state(), &inputs)
}

pub fn web(spec: Value, endpoints: Vec<Value>) -> World {
    let mut world = World::new();
    world
        .service("web", spec)
        .slice("web", json!([{"name": "http", "port": 8080}]), endpoints);
    world
}

pub fn spec(extra: Value) -> Value {
    let mut spec = json!({"type": "ClusterIP", "clusterIP": "10.96.0.10",
        "ports": [{"name": "http", "port": 80, "targetPort": 8080}]});
    for (key, value) in extra.as_object().unwrap() {
        spec[key] = value.clone();
    }
    spec
}

pub fn nodeport(extra: Value) -> Value {
    let mut spec = spec(extra);
    spec["type"] = json!("NodePort");
    spec["ports"][0]["nodePort"] = json!(30080);
    spec
}

/// A LoadBalancer Service `name` (Local policy) whose load balancer gave it `ingress_ip`.
pub fn load_balancer(
    name: &str,
    cluster_ip: &str,
    node_port: u16,
    ranges: Value,
    ingress_ip: &str,
) -> core_v1::Service {
    let mut spec = nodeport(json!({
        "externalTrafficPolicy": "Local", "healthCheckNodePort": 32000, "loadBalancerSourceRanges": ranges}));
    spec["type"] = json!("LoadBalancer");
    spec["clusterIP"] = json!(cluster_ip);
    spec["ports"][0]["nodePort"] = json!(node_port);
    let mut object = kpr_world::service_object(name, spec);
    object.status =
        serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": ingress_ip}]}})).unwrap();
    object
}

/// The plan of an IPv6-only node without NodePort addresses for `world`.
/// LoadBalancers `web` (10.96.0.10, NodePort 30080, ingress 203.0.113.1, ranges 192.0.2.0/24
/// and 192.168.0.0/24) and `other` (10.96.0.11, 30081, 203.0.113.2, 192.0.2.0/24).
pub fn two_load_balancers_with_source_ranges(world: &mut World) {
    let web = load_balancer(
        "web",
        "10.96.0.10",
        30080,
        json!(["192.0.2.0/24", "192.168.0.0/24"]),
        "203.0.113.1",
    );
    let other = load_balancer(
        "other",
        "10.96.0.11",
        30081,
        json!(["192.0.2.0/24"]),
        "203.0.113.2",
    );
    assert!(world.apply_service(&web).is_empty() && world.apply_service(&other).is_empty());
}

pub fn ipv6_plan_of(world: &mut World) -> IpvsPlan {
    let scheduler = Scheduler::new("rr").unwrap();
    let none = BTreeSet::new();
    let inputs = PlanInputs {
        family: IpFamily::V6,
        scheduler: &scheduler,
        node_port_addresses: &[],
        other_interface_addresses: &none,
        node_ip: None,
    };
    plan(&world.state(), &inputs)
}

/// Service `web` on cluster IP fd00:96::10 (IPv6 only), port `http` 80 -> 8080.
pub fn ipv6_web(world: &mut World) -> &mut World {
    world.service(
        "web",
        json!({"type": "ClusterIP", "clusterIP": "fd00:96::10", "ipFamilies": ["IPv6"],
               "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}),
    )
}
