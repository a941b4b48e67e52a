//! Golden tests: what `explain` prints for a cluster of every Service shape, in both modes,
//! from the objects the real renderers produce (kpr-nftables' generation, kpr-iptables'
//! restore payload read back as `iptables-save` output). The kernel path is covered by the
//! binary's e2e test (crates/kube-proxy-rs/tests/e2e_explain.rs).
//!
//! `UPDATE_GOLDEN=1 cargo nextest run -p kpr-explain --test golden` rewrites the files;
//! review the diff before committing it.

#![allow(clippy::unwrap_used)]

use std::net::IpAddr;
use std::path::PathBuf;

use kpr_explain::{Explanation, Outcome, Query, Section, Weight, render};
use kpr_host::LocalDetector;
use kpr_iptables::IptablesOptions;
use kpr_iptables::explain as ipt;
use kpr_model::IpFamily;
use kpr_nftables::NftablesOptions;
use kpr_nftables::explain::{self as nft, NftTable};
use kpr_state::DesiredState;
use kpr_world::{World, ep};
use serde_json::{Value, json};

const NODE_IP: &str = "192.168.0.10";

fn http() -> Value {
    json!([{"name": "http", "port": 80, "targetPort": 8080}])
}

fn slice_port() -> Value {
    json!([{"name": "http", "port": 8080}])
}

fn nodeport(extra: Value, node_port: u16) -> Value {
    let mut spec = json!({"type": "NodePort",
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": node_port}]});
    for (k, v) in extra.as_object().unwrap() {
        spec.as_object_mut().unwrap().insert(k.clone(), v.clone());
    }
    spec
}

/// One Service of each shape the command explains.
fn cluster() -> DesiredState {
    let mut world = World::new();
    world
        .service(
            "web",
            json!({"type": "ClusterIP", "clusterIP": "10.96.0.10", "ports": http()}),
        )
        .slice(
            "web",
            slice_port(),
            vec![ep("10.244.1.5 local"), ep("10.244.2.6"), ep("10.244.3.7")],
        );
    world.service(
        "empty",
        json!({"type": "ClusterIP", "clusterIP": "10.96.0.20", "ports": http()}),
    );
    world
        .service(
            "away",
            nodeport(
                json!({"clusterIP": "10.96.0.30", "externalTrafficPolicy": "Local", "externalIPs": ["203.0.113.9"]}),
                30030,
            ),
        )
        .slice("away", slice_port(), vec![ep("10.244.2.6"), ep("10.244.3.7")]);
    world
        .service(
            "here",
            nodeport(
                json!({"clusterIP": "10.96.0.40", "externalTrafficPolicy": "Local"}),
                30040,
            ),
        )
        .slice(
            "here",
            slice_port(),
            vec![ep("10.244.1.5 local"), ep("10.244.2.6")],
        );
    world
        .service(
            "lb",
            json!({"type": "LoadBalancer", "clusterIP": "10.96.0.50",
                   "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30050}],
                   "loadBalancerSourceRanges": ["192.0.2.0/24", "198.51.100.7/32"],
                   "status": {"loadBalancer": {"ingress": [{"ip": "5.6.7.8"}]}}}),
        )
        .slice("lb", slice_port(), vec![ep("10.244.2.6")]);
    world
        .service(
            "sticky",
            json!({"type": "ClusterIP", "clusterIP": "10.96.0.60", "ports": http(),
                   "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}),
        )
        .slice("sticky", slice_port(), vec![ep("10.244.1.5"), ep("10.244.2.6")]);
    world.state()
}

fn queries() -> Vec<Query> {
    [
        "10.96.0.10:80",
        "10.96.0.20:80/tcp",
        "10.96.0.30:80",
        "203.0.113.9:80",
        "192.168.0.10:30030",
        "192.168.0.10:30040",
        "5.6.7.8:80",
        "10.96.0.60:80",
        "10.96.0.10:81",
        "10.96.0.10:80/udp",
        "10.96.7.7:80",
        "192.0.2.99:80",
    ]
    .iter()
    .map(|q| Query::parse(q).unwrap())
    .collect()
}

fn local_addresses() -> Vec<IpAddr> {
    vec![NODE_IP.parse().unwrap()]
}

fn nft_explanations(state: &DesiredState) -> Vec<Explanation> {
    let opts = NftablesOptions {
        local_detector: LocalDetector::ClusterCidr(vec!["10.244.0.0/16".parse().unwrap()]),
        service_cidrs: vec!["10.96.0.0/16".parse().unwrap()],
        ..NftablesOptions::default()
    };
    let table = NftTable::from_ruleset(&kpr_nftables::build(state, &opts, &local_addresses()));
    queries()
        .into_iter()
        .map(|query| Explanation {
            query,
            sections: vec![Section {
                title: nft::title(IpFamily::V4),
                family: IpFamily::V4,
                findings: nft::explain(&table, &local_addresses(), &query),
            }],
            problems: Vec::new(),
            looked_for: Vec::new(),
            add_ons: 0,
        })
        .collect()
}

/// The payload's `*nat` and `*filter` parts, as `iptables-save -t <table>` prints them.
fn table_of(payload: &str, table: &str) -> String {
    let start = payload.find(&format!("*{table}\n")).unwrap();
    let rest = &payload[start..];
    rest[..rest.find("COMMIT\n").unwrap()].to_string()
}

fn ipt_explanations(state: &DesiredState) -> Vec<Explanation> {
    let opts = IptablesOptions {
        local_detector: LocalDetector::ClusterCidr(vec!["10.244.0.0/16".parse().unwrap()]),
        ..IptablesOptions::default()
    };
    let payload = kpr_iptables::render_dry_run(state, &opts, &local_addresses());
    let (nat, filter) = (table_of(&payload, "nat"), table_of(&payload, "filter"));
    queries()
        .into_iter()
        .map(|query| Explanation {
            query,
            sections: vec![Section {
                title: ipt::title(IpFamily::V4),
                family: IpFamily::V4,
                findings: ipt::explain(&nat, &filter, &local_addresses(), &query),
            }],
            problems: Vec::new(),
            looked_for: Vec::new(),
            add_ons: 0,
        })
        .collect()
}

fn check_golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/explain/{name}.txt"));
    kpr_world::golden::check(&path, actual);
}

fn all_text(explanations: &[Explanation]) -> String {
    explanations.iter().map(render).collect::<Vec<_>>().join("\n")
}

fn outcome(e: &Explanation) -> Option<&Outcome> {
    e.sections[0].findings.first().map(|f| &f.outcome)
}

/// What both modes must agree on, whatever the wording.
fn check_semantics(explanations: &[Explanation]) {
    let by = |q: &str| {
        let q = Query::parse(q).unwrap();
        explanations.iter().find(|e| e.query == q).unwrap()
    };
    let web = &by("10.96.0.10:80").sections[0].findings[0];
    assert_eq!(web.service.as_deref(), Some("default/web:http"));
    assert_eq!(web.outcome, Outcome::Forwarded);
    let eps: Vec<String> = web.groups[0]
        .endpoints
        .iter()
        .map(|e| e.addr.to_string())
        .collect();
    assert_eq!(eps, ["10.244.1.5:8080", "10.244.2.6:8080", "10.244.3.7:8080"]);
    let total: f64 = web.groups[0]
        .endpoints
        .iter()
        .map(|e| match e.weight {
            Weight::Slot { count, .. } => 1.0 / f64::from(count),
            Weight::Share(s) => s,
        })
        .sum();
    assert!((total - 1.0).abs() < 1e-6, "shares add up to {total}");
    assert!(matches!(outcome(by("10.96.0.20:80")), Some(Outcome::Rejected(_))));
    assert!(matches!(outcome(by("203.0.113.9:80")), Some(Outcome::Dropped(_))));
    assert!(matches!(
        outcome(by("192.168.0.10:30030")),
        Some(Outcome::Dropped(_))
    ));
    let here = &by("192.168.0.10:30040").sections[0].findings[0];
    assert_eq!(here.outcome, Outcome::Forwarded);
    let local: Vec<String> = here
        .groups
        .iter()
        .flat_map(|g| g.endpoints.iter().filter(|e| e.local).map(|e| e.addr.to_string()))
        .collect();
    assert!(
        local.iter().all(|a| a == "10.244.1.5:8080") && !local.is_empty(),
        "{local:?}"
    );
    let lb = &by("5.6.7.8:80").sections[0].findings[0];
    assert!(lb.decisions.iter().any(|d| d.contains("192.0.2.0/24")), "{lb:?}");
    let sticky = &by("10.96.0.60:80").sections[0].findings[0];
    assert!(
        sticky
            .decisions
            .iter()
            .any(|d| d.contains("ClientIP, timeout 60 s")),
        "{sticky:?}"
    );
    assert!(!by("192.0.2.99:80").found());
    assert!(
        !by("10.96.0.10:80/udp").found() || outcome(by("10.96.0.10:80/udp")) != Some(&Outcome::Forwarded)
    );
}

#[test]
fn nftables_explanations() {
    let explanations = nft_explanations(&cluster());
    check_semantics(&explanations);
    let by = |q: &str| {
        explanations
            .iter()
            .find(|e| e.query == Query::parse(q).unwrap())
            .unwrap()
    };
    // nftables mode also knows the Service CIDRs and every cluster IP.
    assert!(
        matches!(outcome(by("10.96.0.10:81")), Some(Outcome::Rejected(r)) if r.contains("cluster-ips-check"))
    );
    assert!(matches!(outcome(by("10.96.7.7:80")), Some(Outcome::Dropped(r)) if r.contains("service-cidrs")));
    check_golden("nftables", &all_text(&explanations));
}

/// An entry counts only through its dispatch rule: one that no rule looks up is said to
/// decide nothing (a foreign edit the next reconcile repairs).
#[test]
fn an_entry_without_its_dispatch_rule_is_reported() {
    let opts = NftablesOptions::default();
    let mut table = NftTable::from_ruleset(&kpr_nftables::build(&cluster(), &opts, &local_addresses()));
    let query = Query::parse("10.96.0.10:80").unwrap();
    let said = |table: &NftTable| {
        let findings = nft::explain(table, &local_addresses(), &query);
        findings[0].decisions.join("\n")
    };
    assert!(!said(&table).contains("no rule looking up"), "{}", said(&table));
    let dispatch = (
        "service-dispatch".to_string(),
        "pick-service-endpoints-tcp-3-ips".to_string(),
    );
    assert!(table.lookups.remove(&dispatch), "{:?}", table.lookups);
    assert!(
        said(&table)
            .contains("chain service-dispatch has no rule looking up set pick-service-endpoints-tcp-3-ips"),
        "{}",
        said(&table)
    );
}

#[test]
fn iptables_explanations() {
    let explanations = ipt_explanations(&cluster());
    check_semantics(&explanations);
    check_golden("iptables", &all_text(&explanations));
}

#[test]
fn nothing_matching_is_said_plainly() {
    let query = Query::parse("192.0.2.99:80").unwrap();
    let explanation = Explanation {
        query,
        sections: Vec::new(),
        problems: Vec::new(),
        looked_for: Vec::new(),
        add_ons: 0,
    };
    assert!(!explanation.found());
    assert!(render(&explanation).contains("no kube-proxy rules"));
}

#[test]
fn both_modes_are_explained_and_said_so() {
    let state = cluster();
    let (nft, ipt) = (nft_explanations(&state), ipt_explanations(&state));
    let both = Explanation {
        query: nft[0].query,
        sections: vec![nft[0].sections[0].clone(), ipt[0].sections[0].clone()],
        problems: vec!["reading the iptables filter table: example".into()],
        looked_for: Vec::new(),
        add_ons: 0,
    };
    let text = render(&both);
    assert!(text.starts_with("warning: reading the iptables filter table: example\nnote: objects of more than one proxy mode exist here"), "{text}");
    assert!(
        text.contains(
            "nftables mode (table ip kube-proxy):\n  10.96.0.10:80/tcp: cluster IP of default/web:http"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "iptables mode (iptables nat/filter):\n  10.96.0.10:80/tcp: cluster IP of default/web:http"
        ),
        "{text}"
    );
}

#[test]
fn ipv6_destinations_are_explained_from_the_ip6_table() {
    let mut world = World::with_family(IpFamily::V6);
    world
        .service(
            "web",
            json!({"type": "NodePort", "clusterIP": "fd00:96::10", "ipFamilies": ["IPv6"],
                   "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}),
        )
        .slice("web", slice_port(), vec![ep("fd00:10:244:1::5")]);
    let opts = NftablesOptions {
        family: IpFamily::V6,
        local_detector: LocalDetector::ClusterCidr(vec!["fd00:10:244::/56".parse().unwrap()]),
        service_cidrs: vec!["fd00:96::/112".parse().unwrap()],
        ..NftablesOptions::default()
    };
    let node: Vec<IpAddr> = vec!["fd00:77::1".parse().unwrap()];
    let table = NftTable::from_ruleset(&kpr_nftables::build(&world.state(), &opts, &node));
    for (address, destination) in [
        ("[fd00:96::10]:80", "cluster IP"),
        (
            "[fd00:77::1]:30080/tcp",
            "NodePort 30080/tcp on node address fd00:77::1",
        ),
    ] {
        let query = Query::parse(address).unwrap();
        let findings = nft::explain(&table, &node, &query);
        assert_eq!(findings.len(), 1, "{address}: {findings:?}");
        assert_eq!(findings[0].destination, destination);
        assert_eq!(findings[0].service.as_deref(), Some("default/web:http"));
        let eps: Vec<String> = findings[0].groups[0]
            .endpoints
            .iter()
            .map(|e| e.addr.to_string())
            .collect();
        assert_eq!(eps, ["[fd00:10:244:1::5]:8080"]);
        let text = render(&Explanation {
            query,
            sections: vec![Section {
                title: nft::title(IpFamily::V6),
                family: IpFamily::V6,
                findings,
            }],
            problems: Vec::new(),
            looked_for: Vec::new(),
            add_ons: 0,
        });
        assert!(
            text.starts_with("nftables mode (table ip6 kube-proxy):"),
            "{text}"
        );
    }
    let unallocated = Query::parse("[fd00:96::77]:80").unwrap();
    assert!(matches!(
        &nft::explain(&table, &node, &unallocated)[0].outcome,
        Outcome::Dropped(why) if why.contains("service-cidrs")
    ));
}
