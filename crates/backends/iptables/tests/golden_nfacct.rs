//! Golden test for upstream's nfacct rules: where nfnetlink_acct has the counters, the
//! ctstate INVALID drop counts in `ct_state_invalid_dropped_pkts` and each NodePort gets
//! a first jump for 127.0.0.0/8 that counts in `localhost_nps_accepted_pkts`, in the
//! spelling upstream's iptables mode writes them. Without the counters the rules are the
//! plain ones (see golden.rs).
//!
//! `UPDATE_GOLDEN=1 cargo nextest run -p kpr-iptables --test golden_nfacct` rewrites the
//! file; review the diff before committing it.

#![allow(clippy::unwrap_used)]

mod common;

use common::check_golden;
use kpr_host::{LocalDetector, NodePortAddresses};
use kpr_iptables::{IptablesOptions, NfacctCounters, render_dry_run};
use kpr_model::IpFamily;
use kpr_world::{World, ep};
use serde_json::json;

/// A NodePort Service `web` (NodePort 30080) with two endpoints.
fn nodeport_world(cluster_ip: &str, endpoints: &[&str]) -> World {
    let mut world = World::new();
    world
        .service(
            "web",
            json!({"type": "NodePort", "clusterIP": cluster_ip,
                   "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}),
        )
        .slice(
            "web",
            json!([{"name": "http", "port": 8080}]),
            endpoints.iter().map(|ip| ep(ip)).collect(),
        );
    world
}

fn counted() -> IptablesOptions {
    IptablesOptions {
        local_detector: LocalDetector::ClusterCidr(vec!["10.244.0.0/16".parse().unwrap()]),
        nfacct: NfacctCounters::ALL,
        ..IptablesOptions::default()
    }
}

const INVALID_DROP: &str = "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP";

#[test]
fn nfacct_counters_are_matched_as_upstream_writes_them() {
    let mut world = nodeport_world("10.96.0.10", &["10.244.1.5", "10.244.2.7"]);
    let text = render_dry_run(&world.state(), &counted(), &[]);
    assert!(text.lines().any(|l| l == INVALID_DROP), "{text}");
    let nodeports: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("-A KUBE-NODEPORTS"))
        .collect();
    assert_eq!(nodeports.len(), 2, "{nodeports:?}");
    assert!(
        nodeports[0].starts_with(
            "-A KUBE-NODEPORTS -m comment --comment default/web:http -m tcp -p tcp -d 127.0.0.0/8 --dport 30080 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-"
        ),
        "the counted localhost jump comes first: {nodeports:?}"
    );
    check_golden("nfacct_counters", &text);
}

#[test]
fn only_existing_counters_are_matched() {
    let mut world = nodeport_world("10.96.0.10", &["10.244.1.5"]);
    let only_invalid = IptablesOptions {
        nfacct: NfacctCounters {
            ct_state_invalid_dropped: true,
            localhost_nodeports_accepted: false,
        },
        ..counted()
    };
    let text = render_dry_run(&world.state(), &only_invalid, &[]);
    assert!(text.contains(INVALID_DROP));
    assert!(!text.contains("localhost_nps_accepted_pkts"), "{text}");
    let text = render_dry_run(&world.state(), &IptablesOptions::default(), &[]);
    assert!(!text.contains("nfacct"), "no counters, no matches:\n{text}");
}

#[test]
fn no_localhost_count_where_localhost_nodeports_do_not_work() {
    // Turned off, excluded by --nodeport-addresses, or IPv6 (never on loopback).
    let mut world = nodeport_world("10.96.0.10", &["10.244.1.5"]);
    for opts in [
        IptablesOptions {
            localhost_nodeports: false,
            ..counted()
        },
        IptablesOptions {
            nodeport_addresses: NodePortAddresses::Cidrs(vec!["192.168.0.0/16".parse().unwrap()]),
            ..counted()
        },
    ] {
        let text = render_dry_run(&world.state(), &opts, &["192.168.1.5".parse().unwrap()]);
        assert!(!text.contains("localhost_nps_accepted_pkts"), "{text}");
        assert!(text.contains(INVALID_DROP));
    }
    let mut v6 = World::with_family(IpFamily::V6);
    v6.service(
        "web",
        json!({"type": "NodePort", "clusterIP": "fd00:10:96::10", "ipFamilies": ["IPv6"],
               "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}),
    )
    .slice(
        "web",
        json!([{"name": "http", "port": 8080}]),
        vec![ep("fd00:10:244:1::5")],
    );
    let opts = IptablesOptions {
        family: IpFamily::V6,
        ..counted()
    };
    let text = render_dry_run(&v6.state(), &opts, &[]);
    assert!(!text.contains("localhost_nps_accepted_pkts"), "{text}");
    assert!(
        text.contains("--nfacct-name ct_state_invalid_dropped_pkts"),
        "IPv6 counts INVALID drops too"
    );
    assert!(text.contains("KUBE-EXT-"), "the v6 NodePort is rendered:\n{text}");
}
