//! SCTP Services, golden-tested only.
//!
//! The feature suite (`crates/kube-proxy-rs/tests/features`) proves every other protocol
//! path with real packets, but the kernel the project's machines and CI run has no SCTP
//! sockets (`socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP)` fails with "Protocol not
//! supported"), so no SCTP client or server can run in a namespace lab, and its `xt_sctp`
//! match may be missing too. What can be checked is the rule text: the exact
//! `iptables-restore` input for SCTP Services, read against upstream's iptables mode, which
//! writes SCTP like TCP and UDP (`-m sctp -p sctp`, lower-case protocol for both the match
//! module and `-p`) in every chain: cluster IP, NodePort, load-balancer ingress with source
//! ranges, external IP, the REJECT of a port without endpoints, and each endpoint's DNAT.
//!
//! `UPDATE_GOLDEN=1 cargo nextest run -p kpr-iptables --test sctp` rewrites the files;
//! review the diff before committing it.

#![allow(clippy::unwrap_used)] // a panic fails the test

mod common;

use common::check_golden;
use kpr_host::LocalDetector;
use kpr_iptables::{IptablesOptions, render_dry_run};
use kpr_world::{World, ep};
use serde_json::{Value, json};

/// Pod traffic detected by the cluster CIDR, as in the other golden tests.
fn cluster_cidr_options() -> IptablesOptions {
    IptablesOptions {
        local_detector: LocalDetector::ClusterCidr(vec!["10.244.0.0/16".parse().unwrap()]),
        ..IptablesOptions::default()
    }
}

/// An SCTP port `diameter` 3868 -> 3868, as a Diameter signalling Service would have it.
fn sctp_port(node_port: Option<u16>) -> Value {
    let mut port = json!({"name": "diameter", "port": 3868, "targetPort": 3868, "protocol": "SCTP"});
    if let Some(node_port) = node_port {
        port["nodePort"] = json!(node_port);
    }
    port
}

fn sctp_slice_ports() -> Value {
    json!([{"name": "diameter", "port": 3868, "protocol": "SCTP"}])
}

/// The lines of `text` that mention `what`.
fn lines_with<'a>(text: &'a str, what: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.contains(what)).collect()
}

/// A LoadBalancer Service over SCTP with every frontend upstream programs (cluster IP,
/// NodePort, ingress IP with source ranges, external IP), two endpoints; and an SCTP
/// ClusterIP Service without endpoints. Every rule that matches a port matches it as SCTP,
/// never as TCP or UDP.
#[test]
fn sctp_services_match_sctp_in_every_chain() {
    let mut world = World::new();
    world
        .service(
            "diameter",
            json!({"type": "LoadBalancer", "clusterIP": "10.96.0.80",
                   "externalIPs": ["192.168.99.80"],
                   "loadBalancerSourceRanges": ["203.0.113.0/24"],
                   "ports": [sctp_port(Some(30868))],
                   "status": {"loadBalancer": {"ingress": [{"ip": "5.6.7.80"}]}}}),
        )
        .slice(
            "diameter",
            sctp_slice_ports(),
            vec![ep("10.244.1.5"), ep("10.244.2.7 local")],
        )
        .service(
            "idle",
            json!({"type": "ClusterIP", "clusterIP": "10.96.0.81", "ports": [sctp_port(None)]}),
        );
    let text = render_dry_run(&world.state(), &cluster_cidr_options(), &[]);

    let port_matches = lines_with(&text, " -p ");
    assert!(!port_matches.is_empty(), "{text}");
    for line in &port_matches {
        assert!(line.contains("-m sctp -p sctp"), "not matched as SCTP: {line}");
    }
    // Each frontend's entry rule, in the chain upstream puts it in.
    for (chain, frontend) in [
        (
            "KUBE-SERVICES",
            "cluster IP\" -m sctp -p sctp -d 10.96.0.80 --dport 3868 -j KUBE-SVC-",
        ),
        (
            "KUBE-SERVICES",
            "external IP\" -m sctp -p sctp -d 192.168.99.80 --dport 3868 -j KUBE-EXT-",
        ),
        (
            "KUBE-SERVICES",
            "loadbalancer IP\" -m sctp -p sctp -d 5.6.7.80 --dport 3868 -j KUBE-FW-",
        ),
        (
            "KUBE-NODEPORTS",
            "diameter -m sctp -p sctp --dport 30868 -j KUBE-EXT-",
        ),
    ] {
        let entries: Vec<&str> = lines_with(&text, frontend)
            .into_iter()
            .filter(|line| line.starts_with(&format!("-A {chain} ")))
            .collect();
        assert_eq!(entries.len(), 1, "one {chain} rule for {frontend}:\n{text}");
    }
    for pod in ["10.244.1.5", "10.244.2.7"] {
        assert_eq!(
            lines_with(
                &text,
                &format!("-m sctp -p sctp -j DNAT --to-destination {pod}:3868")
            )
            .len(),
            1,
            "{text}"
        );
    }
    assert!(
        text.contains(
            r#"-A KUBE-SERVICES -m comment --comment "default/idle:diameter has no endpoints" -m sctp -p sctp -d 10.96.0.81 --dport 3868 -j REJECT"#
        ),
        "{text}"
    );
    check_golden("sctp_services", &text);
}
