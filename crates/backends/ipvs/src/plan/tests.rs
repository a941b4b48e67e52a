//! Each case of `UPSTREAM.md` §2-§3 as a golden plan (`tests/golden/<name>.plan`).
//! `UPDATE_GOLDEN=1` rewrites the files; review the diff before committing it.

use kpr_world::{World, ep};
use serde_json::json;

use super::*;
use crate::test_support::{
    check, ipv6_plan_of, ipv6_web, nodeport, plan_of, spec, two_load_balancers_with_source_ranges, web,
};

#[test]
fn a_cluster_ip_is_a_bound_virtual_server_with_every_ready_endpoint() {
    let mut world = web(
        spec(json!({})),
        vec![ep("10.244.1.5"), ep("10.244.2.6"), ep("10.244.3.7 notready")],
    );
    let plan = plan_of(&mut world, "rr");
    let server = &plan.virtual_servers[&service_key(Protocol::Tcp, "10.96.0.10".parse().unwrap(), 80)];
    assert_eq!(
        server.real_servers.len(),
        2,
        "the unready endpoint is not a real server"
    );
    assert_eq!(plan.bound, ["10.96.0.10".parse().unwrap()].into());
    check("clusterip.plan", &plan.to_string());
}

#[test]
fn no_endpoints_keep_the_virtual_server_without_real_servers() {
    let mut world = web(spec(json!({})), vec![]);
    let plan = plan_of(&mut world, "rr");
    assert_eq!(plan.virtual_servers.len(), 1);
    assert!(plan.virtual_servers.values().all(|s| s.real_servers.is_empty()));
    check("no_endpoints.plan", &plan.to_string());
}

#[test]
fn terminating_endpoints_serve_only_when_nothing_is_ready() {
    let mut world = web(spec(json!({})), vec![ep("10.244.1.5 serving terminating")]);
    assert_eq!(
        plan_of(&mut world, "rr")
            .virtual_servers
            .values()
            .next()
            .unwrap()
            .real_servers
            .len(),
        1
    );
    let mut world = web(
        spec(json!({})),
        vec![ep("10.244.1.5 serving terminating"), ep("10.244.2.6")],
    );
    let plan = plan_of(&mut world, "rr");
    let reals: Vec<String> = plan
        .virtual_servers
        .values()
        .next()
        .unwrap()
        .real_servers
        .iter()
        .map(|r| r.to_string())
        .collect();
    assert_eq!(reals, ["10.244.2.6:8080"]);
}

#[test]
fn client_ip_affinity_is_persistence_with_the_timeout() {
    let mut world = web(
        spec(
            json!({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}}}),
        ),
        vec![ep("10.244.1.5")],
    );
    let plan = plan_of(&mut world, "rr");
    let service = &plan.virtual_servers.values().next().unwrap().service;
    assert_eq!((service.flags, service.timeout), (FLAG_PERSISTENT, 600));
    check("affinity.plan", &plan.to_string());
}

#[test]
fn the_mh_scheduler_hashes_the_source_port_too() {
    let mut world = web(spec(json!({})), vec![ep("10.244.1.5")]);
    let plan = plan_of(&mut world, "mh");
    assert_eq!(
        plan.virtual_servers.values().next().unwrap().service.flags,
        FLAG_MH_PORT
    );
}

#[test]
fn a_node_port_is_a_virtual_server_per_node_address_never_bound() {
    let mut world = web(
        nodeport(json!({})),
        vec![ep("10.244.1.5 local"), ep("10.244.2.6")],
    );
    let plan = plan_of(&mut world, "rr");
    assert_eq!(plan.virtual_servers.len(), 3, "cluster IP + two node addresses");
    assert_eq!(plan.bound.len(), 1, "only the cluster IP");
    check("nodeport.plan", &plan.to_string());
}

#[test]
fn no_node_port_address_leaves_node_ports_and_health_checks_out() {
    let mut world = web(nodeport(json!({})), vec![ep("10.244.1.5")]);
    let scheduler = Scheduler::new("rr").unwrap();
    let none = BTreeSet::new();
    let inputs = PlanInputs {
        family: IpFamily::V4,
        scheduler: &scheduler,
        node_port_addresses: &[],
        other_interface_addresses: &none,
        node_ip: None,
    };
    let plan = plan(&world.state(), &inputs);
    assert_eq!(plan.virtual_servers.len(), 1);
    assert!(plan.sets.is_empty("KUBE-NODE-PORT-TCP"));
}

#[test]
fn external_local_uses_local_endpoints_and_falls_back_to_all_without_them() {
    let local = json!({"externalTrafficPolicy": "Local"});
    let mut world = web(
        nodeport(local.clone()),
        vec![ep("10.244.1.5 local"), ep("10.244.2.6")],
    );
    let plan = plan_of(&mut world, "rr");
    check("external_local.plan", &plan.to_string());
    let node_port =
        &plan.virtual_servers[&service_key(Protocol::Tcp, "192.168.0.10".parse().unwrap(), 30080)];
    assert_eq!(node_port.real_servers.len(), 1, "local only");
    assert!(plan.no_local_external.is_empty(), "a local endpoint exists");
    assert!(
        plan.sets
            .members("KUBE-NODE-PORT-LOCAL-TCP")
            .is_some_and(|m| m.len() == 1)
    );

    let mut world = web(nodeport(local), vec![ep("10.244.2.6")]);
    let plan = plan_of(&mut world, "rr");
    let node_port =
        &plan.virtual_servers[&service_key(Protocol::Tcp, "192.168.0.10".parse().unwrap(), 30080)];
    assert_eq!(
        node_port.real_servers.len(),
        1,
        "upstream's ipvs mode falls back to the cluster's endpoints"
    );
    let service = NamespacedName::new("default", "web");
    assert_eq!(
        plan.no_local_external,
        [service].into(),
        "counted although it falls back"
    );
    assert!(plan.no_local_internal.is_empty());

    let mut world = web(nodeport(json!({"externalTrafficPolicy": "Local"})), vec![]);
    let plan = plan_of(&mut world, "rr");
    assert!(
        plan.no_local_external.is_empty(),
        "no endpoints at all is not 'no local endpoints'"
    );
}

#[test]
fn internal_local_cluster_ip_without_local_endpoints_has_no_real_server() {
    let mut world = web(
        spec(json!({"internalTrafficPolicy": "Local"})),
        vec![ep("10.244.2.6")],
    );
    let plan = plan_of(&mut world, "rr");
    assert!(
        plan.virtual_servers
            .values()
            .next()
            .unwrap()
            .real_servers
            .is_empty()
    );
    assert_eq!(plan.no_local_internal.len(), 1);
    assert!(plan.no_local_external.is_empty());
    check("internal_local_no_local.plan", &plan.to_string());
}

#[test]
fn external_ips_are_bound_unless_another_interface_has_them() {
    let mut world = web(
        spec(json!({"externalIPs": ["198.51.100.7", "203.0.113.50"]})),
        vec![ep("10.244.1.5")],
    );
    let plan = plan_of(&mut world, "rr");
    assert!(plan.bound.contains(&"198.51.100.7".parse().unwrap()));
    assert!(
        !plan.bound.contains(&"203.0.113.50".parse().unwrap()),
        "on another interface"
    );
    assert_eq!(plan.virtual_servers.len(), 3, "both are served");
    check("external_ips.plan", &plan.to_string());
}

#[test]
fn load_balancer_source_ranges_fill_the_firewall_sets() {
    let mut world = World::new();
    two_load_balancers_with_source_ranges(&mut world);
    world.slice(
        "web",
        json!([{"name": "http", "port": 8080}]),
        vec![ep("10.244.1.5 local")],
    );
    let plan = plan_of(&mut world, "rr");
    let source_ip = plan.sets.members("KUBE-LOAD-BALANCER-SOURCE-IP");
    assert!(
        source_ip.is_some_and(|m| m.len() == 1),
        "web's ranges hold the node"
    );
    assert_eq!(plan.out_filter.len(), 1, "other's ranges leave the node out");
    check("load_balancer_source_ranges.plan", &plan.to_string());
}

#[test]
fn udp_and_sctp_node_ports_use_their_sets() {
    let mut world = World::new();
    world.service("dns", {
        let mut spec = nodeport(json!({}));
        spec["ports"] = json!([
            {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP", "nodePort": 30053},
            {"name": "sig", "port": 2905, "protocol": "SCTP", "nodePort": 30905}]);
        spec
    });
    let plan = plan_of(&mut world, "rr");
    assert!(
        plan.sets
            .members("KUBE-NODE-PORT-UDP")
            .is_some_and(|m| m.len() == 1)
    );
    assert_eq!(
        plan.sets.members("KUBE-NODE-PORT-SCTP-HASH").map(|m| m.len()),
        Some(2),
        "one per node address"
    );
    check("udp_sctp_node_ports.plan", &plan.to_string());
}

#[test]
fn an_ipv6_plan_uses_the_ipv6_set_names() {
    let mut world = World::with_family(IpFamily::V6);
    ipv6_web(&mut world).slice(
        "web",
        json!([{"name": "http", "port": 8080}]),
        vec![ep("fd00:244::5 local")],
    );
    let plan = ipv6_plan_of(&mut world);
    check("ipv6.plan", &plan.to_string());
    assert!(
        plan.sets
            .members("KUBE-6-CLUSTER-IP")
            .is_some_and(|m| m.len() == 1)
    );
}
