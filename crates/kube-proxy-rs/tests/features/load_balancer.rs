//! LoadBalancer Services, on `examples/features/load-balancer.yaml`: the ingress IP a cloud
//! load balancer sends traffic to, `loadBalancerSourceRanges`, and ingresses in `ipMode:
//! Proxy`, which the node must leave to the load balancer.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use kpr_netns::POD_GATEWAY;

use crate::Mode;
use crate::manifests::Manifests;
use crate::stage::Stage;
use crate::support::assert_fair;
use crate::traffic::at;

const FILE: &str = "load-balancer.yaml";
/// shop's VIP-mode ingress.
const SHOP_INGRESS: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
/// shop's `ipMode: Proxy` ingress.
const PROXY_INGRESS: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 11);
/// shop-admin's ingress, open to 192.168.77.2/32 only.
const ADMIN_INGRESS: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 20);
const BOTH_PODS: [&str; 2] = ["pod0", "pod1"];

kernel_modes!(
    the_ingress_ip_is_reached_from_the_outside_client,
    source_ranges_let_the_allowed_client_in_and_drop_the_other,
    an_ingress_in_proxy_mode_is_left_to_the_load_balancer,
);
// Userspace without source ranges: upstream's userspace proxy never implemented
// loadBalancerSourceRanges, and neither does ours (its portals match the destination only).
in_mode!(userspace, crate::Mode::Userspace;
    the_ingress_ip_is_reached_from_the_outside_client,
    an_ingress_in_proxy_mode_is_left_to_the_load_balancer
);

/// The outside client sends to the ingress IP (its route points at the node, as a cloud
/// load balancer's would) and both pods answer, about equally often. With
/// `externalTrafficPolicy: Cluster` the pods see the node's address, so replies go back
/// through the node.
fn the_ingress_ip_is_reached_from_the_outside_client(mode: Mode) {
    let stage = Stage::start(mode, 2, &Manifests::example(FILE));
    // 200 connections: a serving pod is left out by chance with odds of 2^-199.
    let outcome = stage
        .client()
        .wait_answered_by(at(SHOP_INGRESS, 80), 200, &BOTH_PODS);
    assert_fair(&outcome.answers);
    assert_eq!(
        outcome.seen,
        BTreeSet::from([IpAddr::from(POD_GATEWAY)]),
        "masqueraded to the node's pod-bridge address: {outcome}"
    );
}

/// shop-admin admits 192.168.77.2/32. The client from that address is served; from
/// 192.168.77.100 it is dropped (times out: no answer, no reset), although that address
/// reaches shop's ingress, which has no ranges.
fn source_ranges_let_the_allowed_client_in_and_drop_the_other(mode: Mode) {
    let stage = Stage::start(mode, 2, &Manifests::example(FILE));
    let [outsider] = stage.add_client_addresses(1)[..] else {
        unreachable!("one address asked for")
    };
    let admin = at(ADMIN_INGRESS, 80);
    // Answered: shop-admin's rules are in place, so what follows is their verdict.
    stage.client().wait_answered_by(admin, 50, &BOTH_PODS);
    stage
        .client_from(outsider)
        .wait_answered_by(at(SHOP_INGRESS, 80), 50, &BOTH_PODS);
    stage.client_from(outsider).assert_dropped(admin);
}

/// shop's second ingress has `ipMode: Proxy`: the load balancer (here in the client's
/// namespace, holding that address) proxies itself, so the node must not take traffic for
/// it. From a pod and from the node, the Proxy-mode address reaches the load balancer while
/// the VIP-mode address of the same Service reaches the pods, and no rule names the
/// Proxy-mode address.
fn an_ingress_in_proxy_mode_is_left_to_the_load_balancer(mode: Mode) {
    let stage = Stage::start(mode, 3, &Manifests::example(FILE));
    let load_balancer = stage.lab().client();
    load_balancer
        .ip(&["addr", "add", &format!("{PROXY_INGRESS}/32"), "dev", "lo"])
        .unwrap();
    let _load_balancer = load_balancer
        .tcp_backend_telling_peer(at(PROXY_INGRESS, 80), "load-balancer")
        .unwrap();

    for sender in [stage.pod(2), stage.node()] {
        sender.wait_answered_by(at(SHOP_INGRESS, 80), 100, &BOTH_PODS);
        let outcome = sender.requests(at(PROXY_INGRESS, 80), 20);
        assert!(
            outcome.answered_by_exactly(&["load-balancer"]),
            "{} to the Proxy-mode ingress: {outcome}",
            sender.label
        );
    }
    // The VIP-mode ingress in the dump shows it is the proxy's ruleset, so the absence
    // of the other one means something.
    let rules = stage.ruleset();
    assert!(
        rules.contains(&SHOP_INGRESS.to_string()),
        "the dump lacks the VIP-mode ingress, so it is not the proxy's:\n{rules}"
    );
    assert!(
        !rules.contains(&PROXY_INGRESS.to_string()),
        "a rule names the Proxy-mode ingress:\n{rules}"
    );
}
