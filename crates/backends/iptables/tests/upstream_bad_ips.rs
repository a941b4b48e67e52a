//! Upstream's `TestBadIPs` (pkg/proxy/iptables/proxier_test.go): a LoadBalancer Service whose
//! addresses use the legacy leading-zero IPv4 form older API servers accepted
//! (`clusterIP: 172.30.0.041`, external IP `192.168.099.022`, ingress `1.2.3.004`, source range
//! `203.0.113.000/025`, endpoint `10.180.00.001`) is programmed, every address read as
//! decimal. Same input as upstream (namespace `ns1`, Service `svc1`, port `p80`, NodePort
//! 3001), same fake-node settings (pod CIDR 10.0.0.0/8, node IP 192.168.0.2, no
//! `--random-fully`), so the chain names are upstream's: KUBE-SVC-/EXT-/FW-XPGD46QRK7WJZT7O
//! and KUBE-SEP-SXIVWICOYRO3J4NJ.
//!
//! The golden file was checked by hand against upstream's expected output: the same chains,
//! and per chain the same rules with the same matches and targets (cluster IP, external IP
//! and load-balancer IP captures, the NodePort and localhost NodePort jumps, the firewall
//! chain allowing 203.0.113.0/25 and the KUBE-PROXY-FIREWALL drop, the EXT masquerade, the
//! endpoint's DNAT to 10.180.0.1:80). It differs only where this renderer differs from
//! upstream everywhere: no nfacct accounting (upstream's fake proxier has nfacct, so its
//! expected output adds `-m nfacct` to the ctstate INVALID drop and a second, count-only
//! NodePort rule for `-d 127.0.0.0/8` that jumps to the same EXT chain), the mark written
//! 0x00004000, and the fixed chains declared in this renderer's order (plus
//! KUBE-PROXY-CANARY).
//!
//! A second case adds genuinely malformed entries next to upstream's: each is dropped and
//! reported, and the rules are byte-identical to the golden file.
//!
//! `UPDATE_GOLDEN=1 cargo nextest run -p kpr-iptables --test upstream_bad_ips` rewrites it.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns may panic: that fails the test

mod common;

use common::check_golden;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kpr_host::LocalDetector;
use kpr_iptables::{IptablesOptions, render_dry_run};
use kpr_model::{IgnoredValue, IpFamily, RejectReason};
use kpr_world::World;
use serde_json::{Value, json};

const GOLDEN: &str = "upstream_bad_ips";

/// Upstream's NewFakeProxier: pods in 10.0.0.0/8, node IP 192.168.0.2, and a fake iptables
/// without `--random-fully`.
fn upstream_fake_options() -> IptablesOptions {
    IptablesOptions {
        local_detector: LocalDetector::ClusterCidr(vec!["10.0.0.0/8".parse().unwrap()]),
        bind_address: Some("192.168.0.2".parse().unwrap()),
        masquerade_random_fully: false,
        ..IptablesOptions::default()
    }
}

fn svc1(external_ips: Value, source_ranges: Value, ingress: Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": "svc1", "namespace": "ns1"},
        "spec": {"type": "LoadBalancer", "clusterIP": "172.30.0.041",
                 "ports": [{"name": "p80", "port": 80, "protocol": "TCP", "nodePort": 3001}],
                 "externalIPs": external_ips,
                 "loadBalancerSourceRanges": source_ranges},
        "status": {"loadBalancer": {"ingress": ingress}}
    }))
    .unwrap()
}

fn svc1_slice(endpoints: Value) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"name": "svc1-1", "namespace": "ns1",
                     "labels": {"kubernetes.io/service-name": "svc1"}},
        "addressType": "IPv4",
        "ports": [{"name": "p80", "port": 80, "protocol": "TCP"}],
        "endpoints": endpoints
    }))
    .unwrap()
}

/// Feeds the objects through the real trackers, as the sync loop does, on upstream's fake
/// node, and renders a full sync; also returns what the conversions dropped.
fn render(service: &Service, slice: &EndpointSlice) -> (String, Vec<IgnoredValue>) {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "test-node"},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]}
    }))
    .unwrap();
    let mut world = World::on_node(IpFamily::V4, &node);
    let mut ignored = world.apply_service(service);
    ignored.extend(world.apply_slice(slice));
    (
        render_dry_run(&world.state(), &upstream_fake_options(), &[]),
        ignored,
    )
}

#[test]
fn upstream_bad_ips_input_is_programmed_with_decimal_addresses() {
    let service = svc1(
        json!(["192.168.099.022"]),
        json!(["203.0.113.000/025"]),
        json!([{"ip": "1.2.3.004"}]),
    );
    let slice = svc1_slice(json!([{"addresses": ["10.180.00.001"]}]));
    let (text, ignored) = render(&service, &slice);
    assert_eq!(ignored, [], "legacy addresses are valid, nothing is dropped");
    // Upstream's expected rules, in this renderer's spelling (see the module doc).
    for line in [
        r#"-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O"#,
        r#"-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 external IP" -m tcp -p tcp -d 192.168.99.22 --dport 80 -j KUBE-EXT-XPGD46QRK7WJZT7O"#,
        r#"-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 loadbalancer IP" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j KUBE-FW-XPGD46QRK7WJZT7O"#,
        r#"-A KUBE-FW-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 loadbalancer IP" -s 203.0.113.0/25 -j KUBE-EXT-XPGD46QRK7WJZT7O"#,
        r#"-A KUBE-FW-XPGD46QRK7WJZT7O -m comment --comment "other traffic to ns1/svc1:p80 will be dropped by KUBE-PROXY-FIREWALL""#,
        r#"-A KUBE-PROXY-FIREWALL -m comment --comment "ns1/svc1:p80 traffic not accepted by KUBE-FW-XPGD46QRK7WJZT7O" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j DROP"#,
        r#"-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ"#,
        r#"-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80"#,
        r#"-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -j KUBE-SEP-SXIVWICOYRO3J4NJ"#,
    ] {
        assert!(text.contains(line), "missing upstream's rule\n{line}\nin\n{text}");
    }
    assert!(!text.contains(".041") && !text.contains(".00"), "{text}");
    check_golden(GOLDEN, &text);
}

/// Next to upstream's entries, genuinely malformed ones: each is dropped (and reported with
/// its field path), the rest of the Service and slice is programmed exactly as before.
#[test]
fn malformed_entries_beside_them_are_dropped_and_change_no_rule() {
    let service = svc1(
        json!(["192.168.099.022", "192.168.99.300", "not-an-ip"]),
        json!(["203.0.113.000/025", "203.0.113.0/33"]),
        json!([{"ip": "1.2.3"}, {"ip": "1.2.3.004"}]),
    );
    let slice = svc1_slice(json!([
        {"addresses": ["10.180.0.x"]},
        {"addresses": ["10.180.00.001"]},
        {"addresses": []},
        {"addresses": ["fd00::1"]}
    ]));
    let (text, ignored) = render(&service, &slice);
    let found: Vec<_> = ignored
        .iter()
        .map(|w| (w.object.as_str(), w.field.as_str(), w.reason))
        .collect();
    assert_eq!(
        found,
        [
            ("ns1/svc1", "spec.externalIPs[1]", RejectReason::InvalidIp),
            ("ns1/svc1", "spec.externalIPs[2]", RejectReason::InvalidIp),
            (
                "ns1/svc1",
                "status.loadBalancer.ingress[0].ip",
                RejectReason::InvalidIp
            ),
            (
                "ns1/svc1",
                "spec.loadBalancerSourceRanges[1]",
                RejectReason::InvalidCidr
            ),
            ("ns1/svc1-1", "endpoints[0].addresses[0]", RejectReason::InvalidIp),
            ("ns1/svc1-1", "endpoints[2].addresses", RejectReason::MissingField),
            (
                "ns1/svc1-1",
                "endpoints[3].addresses[0]",
                RejectReason::WrongIpFamily
            ),
        ]
    );
    check_golden(GOLDEN, &text);
}
