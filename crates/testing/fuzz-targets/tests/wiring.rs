//! The targets really carry input to the rules: if a target silently dropped every object,
//! its payload checks would pass on nothing, so these tests pin that accepted objects come
//! out as rules and refused ones do not.

use std::path::Path;

use kpr_fuzz_targets::scenario::{
    Address, AddressType, BindChoice, Change, Detector, EndpointInput, NodeInput, NodePortChoice, Number,
    OptionChoices, Pick, PortInput, Scenario, ServiceInput, ServiceRef, SliceInput, SlicePortInput,
    Threshold,
};
use kpr_fuzz_targets::{manifest_payloads, render_scenario};

fn repo_file(path: &str) -> Vec<u8> {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..").join(path);
    std::fs::read(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// Payloads come per path (.yaml, .json), then per family (IPv4, IPv6).
const YAML_V4: usize = 0;
const YAML_V6: usize = 1;
const JSON_V4: usize = 2;

#[test]
fn a_manifest_example_becomes_rules() {
    let payloads = manifest_payloads(&repo_file("examples/web.yaml"));
    assert_eq!(payloads.len(), 4);
    let v4 = &payloads[YAML_V4];
    assert!(v4.contains("--comment \"default/web:http cluster IP\""), "{v4}");
    assert!(v4.contains("-A KUBE-NODEPORTS"), "{v4}");
    assert!(v4.contains("-j KUBE-SEP-"), "{v4}");
    assert!(
        !payloads[YAML_V6].contains("default/web"),
        "an IPv4 service has no IPv6 rules"
    );
    assert!(!payloads[JSON_V4].contains("default/web"), "YAML is not JSON");
}

#[test]
fn a_json_stream_becomes_rules() {
    let payloads = manifest_payloads(&repo_file("fuzz/seeds/manifest/stream.json"));
    assert!(
        payloads[JSON_V4].contains("default/j1:http cluster IP"),
        "{}",
        payloads[JSON_V4]
    );
}

#[test]
fn hostile_names_are_refused_and_a_valid_neighbour_kept() {
    let payloads = manifest_payloads(&repo_file("fuzz/seeds/manifest/hostile-names.yaml"));
    let v4 = &payloads[YAML_V4];
    assert!(
        !v4.contains("evil") && !v4.contains("a/b/a") && !v4.contains("b/c"),
        "{v4}"
    );
    assert!(!v4.contains("-A KUBE-SERVICES -j ACCEPT"), "{v4}");
    assert!(
        v4.contains("\"default/good:http has no endpoints\""),
        "a valid neighbour is still programmed: {v4}"
    );
}

fn web_scenario() -> Scenario {
    Scenario {
        ipv6: false,
        then: None,
        options: OptionChoices {
            masquerade_all: true,
            masquerade_bit: 14,
            random_fully: true,
            detector: Detector::ClusterCidr,
            localhost_nodeports: true,
            nodeport_addresses: NodePortChoice::All,
            large_cluster_threshold: Threshold::Default,
            bind_address: BindChoice::Unset,
            tcp_be_liberal: false,
        },
        node: NodeInput {
            zone: None,
            addresses: vec![Address::raw("192.168.0.10")],
            going_away: false,
        },
        services: vec![ServiceInput {
            namespace: None,
            name: Pick::raw("web"),
            type_: Some(Pick::raw("NodePort")),
            cluster_ip: Address::raw("10.96.0.10"),
            cluster_ips: None,
            ports: (
                PortInput {
                    name: Pick::raw("http"),
                    protocol: None,
                    port: Number::Any(80),
                    node_port: Some(Number::Any(30080)),
                    target_port: Some(Number::Any(8080)),
                },
                vec![],
            ),
            external_ips: Some(vec![Address::raw("192.0.2.1"), Address::raw("bad")]),
            ingress: None,
            source_ranges: None,
            external_policy: None,
            internal_policy: None,
            affinity: Some(Pick::raw("ClientIP")),
            affinity_timeout: None,
            health_check_node_port: None,
            ip_families: None,
            ip_family_policy: None,
        }],
        slices: vec![SliceInput {
            name: Pick::raw("web-1"),
            service: ServiceRef::Index(0),
            address_type: AddressType::Matching,
            ports: Some(vec![SlicePortInput::Like {
                index: 0,
                port: Some(Number::Any(8080)),
            }]),
            endpoints: (
                EndpointInput {
                    addresses: (Address::raw("10.244.1.5"), vec![]),
                    ready: Some(true),
                    serving: None,
                    terminating: None,
                    node_name: Some(Pick::raw("node-b")),
                    zone: None,
                    zone_hints: None,
                    node_hints: None,
                },
                vec![],
            ),
        }],
    }
}

#[test]
fn a_scenario_becomes_rules() {
    let payload = render_scenario(&web_scenario());
    assert!(payload.contains("default/web:http cluster IP"), "{payload}");
    assert!(
        payload.contains("-d 192.0.2.1 --dport 80"),
        "the good external IP: {payload}"
    );
    assert!(payload.contains("--dport 30080"), "{payload}");
    assert!(
        payload.contains("-m recent --name KUBE-SEP-"),
        "ClientIP affinity: {payload}"
    );
    assert!(
        payload.contains("-j DNAT --to-destination 10.244.1.5:8080"),
        "{payload}"
    );
}

#[test]
fn a_scenario_with_a_hostile_name_renders_without_it() {
    let mut scenario = web_scenario();
    scenario.services[0].name = Pick::raw("web\n-A KUBE-SERVICES -j ACCEPT");
    let payload = render_scenario(&scenario);
    assert!(!payload.contains("default/web"), "{payload}");
    assert!(!payload.contains("-A KUBE-SERVICES -j ACCEPT"), "{payload}");
}

/// The next state drops `web` and adds `db` with an endpoint: the backend's partial sync
/// into the model kernel must leave what a fresh full sync of that state leaves.
#[test]
fn a_change_is_synced_into_the_model_kernel() {
    let mut scenario = web_scenario();
    let mut db = web_scenario();
    let mut db_service = db.services.remove(0);
    db_service.name = Pick::raw("db");
    db_service.cluster_ip = Address::raw("10.96.0.11");
    let mut db_slice = db.slices.remove(0);
    db_slice.name = Pick::raw("db-1");
    scenario.then = Some(Change {
        drop_services: 1,
        drop_slices: 1,
        services: vec![db_service],
        slices: vec![db_slice],
    });
    let payload = render_scenario(&scenario);
    assert!(payload.contains("default/web:http cluster IP"), "{payload}");
}

#[test]
#[should_panic(expected = "an update left other rules than a fresh sync")]
fn kernels_that_differ_fail_the_sequence_check() {
    use kpr_fuzz_targets::{ModelKernel, Tables};
    let (a, b) = (ModelKernel::default(), ModelKernel::default());
    use kpr_iptables::Iptables;
    b.restore(b"*nat\n:KUBE-SVC-X - [0:0]\nCOMMIT\n").unwrap();
    let (a, b): (Tables, Tables) = (a.tables(), b.tables());
    kpr_fuzz_targets::assert_tables_eq(&a, &b, "an update left other rules than a fresh sync");
}
