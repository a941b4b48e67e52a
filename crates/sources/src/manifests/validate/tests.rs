//! Every rule, table-driven: an otherwise valid object with one field changed must be refused
//! on exactly that field, for exactly that reason; and the inputs the API server accepts
//! must pass.

use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kpr_model::{ObjectKind, RejectReason};
use serde_json::{Value, json};

use super::{Check, ValidationRules, validate_file, validate_object};
use crate::manifests::object::{ManifestObject, ObjectKey};
use crate::manifests::parse::{FileObjects, Placement};

/// JSON merge patch (RFC 7386): objects merge, `null` removes, anything else replaces.
fn patched(mut base: Value, patch: &Value) -> Value {
    merge(&mut base, patch);
    base
}

fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(target), Value::Object(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    target.remove(key);
                } else {
                    merge(target.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        (target, patch) => *target = patch.clone(),
    }
}

fn key_of(kind: ObjectKind, value: &Value) -> ObjectKey {
    let name = value["metadata"]["name"].as_str().unwrap_or("");
    let namespace = match kind {
        ObjectKind::Node | ObjectKind::ServiceCidr => "",
        _ => value["metadata"]["namespace"].as_str().unwrap_or("default"),
    };
    ObjectKey::new(kind, namespace, name)
}

fn base_service() -> Value {
    json!({
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "10.96.0.10",
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]
        }
    })
}

fn node_port_service() -> Value {
    patched(
        base_service(),
        &json!({"spec": {"type": "NodePort", "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}}),
    )
}

fn base_slice() -> Value {
    json!({
        "metadata": {"name": "web-abc12", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.244.1.10"], "nodeName": "node-1.example", "hostname": "web-0"}]
    })
}

/// The API server's rules alone (without kpr-model's conversion), for one Service.
fn service_rules(value: &Value, rules: &ValidationRules) -> Result<(), kpr_model::Rejection> {
    let key = key_of(ObjectKind::Service, value);
    let service: Service = serde_json::from_value(value.clone()).unwrap();
    super::service::check(&Check { key: &key }, &service, rules)
}

/// [`service_rules`] with the default rules (node-port range 30000-32767).
fn default_service_rules(value: &Value) -> Result<(), kpr_model::Rejection> {
    service_rules(value, &ValidationRules::default())
}

fn slice_rules(value: &Value) -> Result<(), kpr_model::Rejection> {
    let key = key_of(ObjectKind::EndpointSlice, value);
    let slice: EndpointSlice = serde_json::from_value(value.clone()).unwrap();
    super::slice::check(&Check { key: &key }, &slice)
}

/// The whole check, API rules and kpr-model, as the catalog runs it.
fn validate(kind: ObjectKind, value: &Value) -> Result<(), kpr_model::Rejection> {
    let key = key_of(kind, value);
    let object = match kind {
        ObjectKind::Service => {
            ManifestObject::Service(Arc::new(serde_json::from_value(value.clone()).unwrap()))
        }
        ObjectKind::EndpointSlice => {
            ManifestObject::EndpointSlice(Arc::new(serde_json::from_value(value.clone()).unwrap()))
        }
        _ => ManifestObject::Node(Arc::new(serde_json::from_value::<Node>(value.clone()).unwrap())),
    };
    validate_object(&key, &object, &ValidationRules::default())
}

/// Each case: the patch, the field it must be refused on, and why.
fn assert_refused(
    cases: &[(Value, &str, RejectReason)],
    base: fn() -> Value,
    check: impl Fn(&Value) -> Result<(), kpr_model::Rejection>,
) {
    for (patch, field, reason) in cases {
        let object = patched(base(), patch);
        let rejection = check(&object).expect_err(&format!("accepted: {patch}"));
        assert_eq!(
            (rejection.field.as_str(), rejection.reason),
            (*field, *reason),
            "for {patch}: {rejection}"
        );
    }
}

fn assert_accepted(
    patches: &[Value],
    base: fn() -> Value,
    check: impl Fn(&Value) -> Result<(), kpr_model::Rejection>,
) {
    for patch in patches {
        let object = patched(base(), patch);
        if let Err(rejection) = check(&object) {
            panic!("refused {patch}: {rejection}");
        }
    }
}

// === Services ===

#[test]
fn service_names_and_namespaces() {
    use RejectReason::InvalidValue;
    let cases = [
        (
            json!({"metadata": {"name": "evil\n-A KUBE-SERVICES -j ACCEPT\n#"}}),
            "metadata.name",
            InvalidValue,
        ),
        (
            json!({"metadata": {"name": "a/b"}}),
            "metadata.name",
            InvalidValue,
        ),
        (
            json!({"metadata": {"name": "-web"}}),
            "metadata.name",
            InvalidValue,
        ),
        (
            json!({"metadata": {"name": "Web"}}),
            "metadata.name",
            InvalidValue,
        ),
        (
            json!({"metadata": {"name": "web.shop"}}),
            "metadata.name",
            InvalidValue,
        ),
        (
            json!({"metadata": {"name": "a".repeat(64)}}),
            "metadata.name",
            InvalidValue,
        ),
        (
            json!({"metadata": {"namespace": "b/c"}}),
            "metadata.namespace",
            InvalidValue,
        ),
        (
            json!({"metadata": {"namespace": "Shop"}}),
            "metadata.namespace",
            InvalidValue,
        ),
        (
            json!({"metadata": {"namespace": "shop\u{1b}[2J"}}),
            "metadata.namespace",
            InvalidValue,
        ),
    ];
    assert_refused(&cases, base_service, default_service_rules);
    assert_accepted(
        &[
            json!({}),
            json!({"metadata": {"name": "a".repeat(63), "namespace": "1-team"}}),
            // Since 1.37 a Service name may start with a digit (KEP-5311).
            json!({"metadata": {"name": "1web"}}),
        ],
        base_service,
        default_service_rules,
    );
}

#[test]
fn service_ports() {
    use RejectReason::*;
    let two = |a: Value, b: Value| json!({"spec": {"ports": [a, b]}});
    let cases = [
        (json!({"spec": null}), "spec", MissingField),
        (json!({"spec": {"type": "Internal"}}), "spec.type", InvalidValue),
        (json!({"spec": {"ports": []}}), "spec.ports", MissingField),
        (json!({"spec": {"ports": null}}), "spec.ports", MissingField),
        (
            two(json!({"port": 80}), json!({"name": "b", "port": 81})),
            "spec.ports[0].name",
            MissingField,
        ),
        (
            json!({"spec": {"ports": [{"name": "HTTP", "port": 80}]}}),
            "spec.ports[0].name",
            InvalidValue,
        ),
        (
            json!({"spec": {"ports": [{"name": "a/b", "port": 80}]}}),
            "spec.ports[0].name",
            InvalidValue,
        ),
        (
            two(json!({"name": "a", "port": 80}), json!({"name": "a", "port": 81})),
            "spec.ports[1].name",
            DuplicatePort,
        ),
        (
            json!({"spec": {"ports": [{"port": 0}]}}),
            "spec.ports[0].port",
            InvalidPort,
        ),
        (
            json!({"spec": {"ports": [{"port": 70000}]}}),
            "spec.ports[0].port",
            InvalidPort,
        ),
        (
            json!({"spec": {"ports": [{"port": -1}]}}),
            "spec.ports[0].port",
            InvalidPort,
        ),
        (
            json!({"spec": {"ports": [{"port": 80, "protocol": "tcp"}]}}),
            "spec.ports[0].protocol",
            InvalidProtocol,
        ),
        (
            json!({"spec": {"ports": [{"port": 80, "protocol": "ICMP"}]}}),
            "spec.ports[0].protocol",
            InvalidProtocol,
        ),
        (
            two(
                json!({"name": "a", "port": 80}),
                json!({"name": "b", "port": 80, "protocol": "TCP"}),
            ),
            "spec.ports[1].port",
            DuplicatePort,
        ),
        (
            json!({"spec": {"ports": [{"port": 80, "targetPort": 70000}]}}),
            "spec.ports[0].targetPort",
            InvalidPort,
        ),
        (
            json!({"spec": {"ports": [{"port": 80, "targetPort": "8080"}]}}),
            "spec.ports[0].targetPort",
            InvalidValue,
        ),
        (
            json!({"spec": {"ports": [{"port": 80, "targetPort": "a-very-long-port-name"}]}}),
            "spec.ports[0].targetPort",
            InvalidValue,
        ),
        (
            json!({"spec": {"ports": [{"port": 80, "nodePort": 30080}]}}),
            "spec.ports[0].nodePort",
            InvalidValue,
        ),
    ];
    assert_refused(&cases, base_service, default_service_rules);
    let accepted = [
        two(
            json!({"name": "dns", "port": 53, "protocol": "UDP"}),
            json!({"name": "dns-tcp", "port": 53}),
        ),
        json!({"spec": {"ports": [{"port": 80, "targetPort": "http"}]}}),
        json!({"spec": {"ports": [{"port": 80, "targetPort": 0}]}}),
        json!({"spec": {"ports": [{"port": 80, "targetPort": ""}]}}),
        json!({"spec": {"ports": [{"name": "a-long-port-name-for-metrics", "port": 9090}]}}),
        json!({"spec": {"ports": [{"port": 80, "protocol": "SCTP"}]}}),
        json!({"spec": {"type": null, "ports": [{"port": 80, "nodePort": 0}]}}),
    ];
    assert_accepted(&accepted, base_service, default_service_rules);
}

#[test]
fn node_ports_stay_inside_the_node_port_range() {
    use RejectReason::*;
    let port =
        |node_port: i64| json!({"spec": {"ports": [{"name": "http", "port": 80, "nodePort": node_port}]}});
    let cases = [
        (port(22), "spec.ports[0].nodePort", InvalidPort),
        (port(29999), "spec.ports[0].nodePort", InvalidPort),
        (port(32768), "spec.ports[0].nodePort", InvalidPort),
        (port(-30080), "spec.ports[0].nodePort", InvalidPort),
        (port(100_000), "spec.ports[0].nodePort", InvalidPort),
        (
            json!({"spec": {"ports": [{"name": "a", "port": 80, "nodePort": 30080}, {"name": "b", "port": 81, "nodePort": 30080}]}}),
            "spec.ports[1].nodePort",
            DuplicatePort,
        ),
        (
            json!({"spec": {"clusterIP": "None", "clusterIPs": null}}),
            "spec.clusterIP",
            InvalidValue,
        ),
    ];
    assert_refused(&cases, node_port_service, default_service_rules);
    let rejection = service_rules(
        &patched(node_port_service(), &port(22)),
        &ValidationRules::default(),
    )
    .unwrap_err();
    assert!(
        rejection
            .detail
            .contains("22 is outside the node port range 30000-32767 (--service-node-port-range)"),
        "{rejection}"
    );
    assert_accepted(
        &[
            port(30000),
            port(32767),
            json!({"spec": {"ports": [{"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053},
                                      {"name": "dns-tcp", "port": 53, "nodePort": 30053}]}}),
            json!({"spec": {"type": "LoadBalancer"}}),
        ],
        node_port_service,
        default_service_rules,
    );
    // The range follows --service-node-port-range.
    let wide = ValidationRules {
        node_port_range: 20000..=40000,
    };
    assert!(service_rules(&patched(node_port_service(), &port(39000)), &wide).is_ok());
    assert!(
        service_rules(
            &patched(node_port_service(), &port(39000)),
            &ValidationRules::default()
        )
        .is_err()
    );
    let narrow = ValidationRules {
        node_port_range: 30080..=30080,
    };
    assert!(service_rules(&node_port_service(), &narrow).is_ok());
    assert!(service_rules(&patched(node_port_service(), &port(30081)), &narrow).is_err());
}

#[test]
fn health_check_node_ports_only_where_upstream_allows_them() {
    use RejectReason::*;
    let local_lb = || {
        patched(
            node_port_service(),
            &json!({"spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local", "healthCheckNodePort": 30100}}),
        )
    };
    let cases = [
        (
            json!({"spec": {"externalTrafficPolicy": "Cluster"}}),
            "spec.healthCheckNodePort",
            InvalidValue,
        ),
        (
            json!({"spec": {"type": "NodePort"}}),
            "spec.healthCheckNodePort",
            InvalidValue,
        ),
        (
            json!({"spec": {"healthCheckNodePort": 10256}}),
            "spec.healthCheckNodePort",
            InvalidPort,
        ),
        (
            json!({"spec": {"healthCheckNodePort": 30080}}),
            "spec.healthCheckNodePort",
            Conflict,
        ),
    ];
    assert_refused(&cases, local_lb, default_service_rules);
    assert_accepted(
        &[json!({}), json!({"spec": {"healthCheckNodePort": 0}})],
        local_lb,
        default_service_rules,
    );
}

#[test]
fn affinity_and_traffic_policies() {
    use RejectReason::InvalidValue;
    let client_ip = |timeout: i64| json!({"spec": {"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": timeout}}}});
    let timeout = "spec.sessionAffinityConfig.clientIP.timeoutSeconds";
    let cases = [
        (
            json!({"spec": {"sessionAffinity": "Sticky"}}),
            "spec.sessionAffinity",
            InvalidValue,
        ),
        (client_ip(0), timeout, InvalidValue),
        (client_ip(86401), timeout, InvalidValue),
        (
            json!({"spec": {"externalTrafficPolicy": "Nearest"}}),
            "spec.externalTrafficPolicy",
            InvalidValue,
        ),
        (
            json!({"spec": {"internalTrafficPolicy": "local"}}),
            "spec.internalTrafficPolicy",
            InvalidValue,
        ),
        // Unlike externalTrafficPolicy, a pointer: the API server does not default "".
        (
            json!({"spec": {"internalTrafficPolicy": ""}}),
            "spec.internalTrafficPolicy",
            InvalidValue,
        ),
    ];
    assert_refused(&cases, base_service, default_service_rules);
    assert_accepted(
        &[
            client_ip(1),
            client_ip(86400),
            json!({"spec": {"sessionAffinity": "ClientIP"}}),
            json!({"spec": {"sessionAffinity": "None", "internalTrafficPolicy": "Local"}}),
            json!({"spec": {"externalTrafficPolicy": "Cluster"}}),
            json!({"spec": {"externalTrafficPolicy": ""}}),
            json!({"spec": {"sessionAffinity": ""}}),
            // The API server defaults an empty port protocol to TCP.
            json!({"spec": {"ports": [{"port": 80, "protocol": ""}]}}),
        ],
        base_service,
        default_service_rules,
    );
}

#[test]
fn cluster_ips_and_ip_families_agree() {
    use RejectReason::*;
    let ips = |list: Value| json!({"spec": {"clusterIPs": list}});
    let cases = [
        (ips(json!(["10.96.0.11"])), "spec.clusterIPs[0]", InvalidValue),
        (
            json!({"spec": {"clusterIP": null, "clusterIPs": ["10.96.0.10"]}}),
            "spec.clusterIPs",
            InvalidValue,
        ),
        (
            json!({"spec": {"clusterIP": "10.96.0.1O"}}),
            "spec.clusterIP",
            InvalidIp,
        ),
        (
            json!({"spec": {"clusterIP": "10.96.0.256"}}),
            "spec.clusterIP",
            InvalidIp,
        ),
        (
            ips(json!(["10.96.0.10", "fd00::bad::1"])),
            "spec.clusterIPs[1]",
            InvalidIp,
        ),
        (
            ips(json!(["10.96.0.10", "fd00::10", "10.96.0.12"])),
            "spec.clusterIPs",
            InvalidValue,
        ),
        (
            ips(json!(["10.96.0.10", "10.96.0.11"])),
            "spec.clusterIPs",
            WrongIpFamily,
        ),
        (
            ips(json!(["10.96.0.10", "None"])),
            "spec.clusterIPs[1]",
            InvalidValue,
        ),
        (
            json!({"spec": {"clusterIP": "None", "clusterIPs": ["None", "10.96.0.10"]}}),
            "spec.clusterIPs",
            InvalidValue,
        ),
        (
            json!({"spec": {"ipFamilies": ["IPv5"]}}),
            "spec.ipFamilies[0]",
            InvalidValue,
        ),
        (
            json!({"spec": {"ipFamilies": ["IPv4", "IPv4"]}}),
            "spec.ipFamilies[1]",
            InvalidValue,
        ),
        (
            json!({"spec": {"ipFamilies": ["IPv4", "IPv6", "IPv4"]}}),
            "spec.ipFamilies",
            TooLarge,
        ),
        (
            json!({"spec": {"ipFamilies": ["IPv6"]}}),
            "spec.clusterIP",
            WrongIpFamily,
        ),
        (
            json!({"spec": {"clusterIPs": ["10.96.0.10", "fd00::10"], "ipFamilies": ["IPv4", "IPv4"]}}),
            "spec.ipFamilies[1]",
            InvalidValue,
        ),
        (
            json!({"spec": {"clusterIPs": ["10.96.0.10", "fd00::10"], "ipFamilyPolicy": "SingleStack"}}),
            "spec.ipFamilyPolicy",
            InvalidValue,
        ),
        (
            json!({"spec": {"ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "SingleStack"}}),
            "spec.ipFamilyPolicy",
            InvalidValue,
        ),
        (
            json!({"spec": {"ipFamilyPolicy": "RequireDualStack"}}),
            "spec.ipFamilyPolicy",
            InvalidValue,
        ),
        (
            json!({"spec": {"ipFamilyPolicy": "DualStack"}}),
            "spec.ipFamilyPolicy",
            InvalidValue,
        ),
    ];
    assert_refused(&cases, base_service, default_service_rules);
    let accepted = [
        json!({"spec": {"clusterIPs": ["10.96.0.10"], "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack"}}),
        json!({"spec": {"clusterIPs": ["10.96.0.10", "fd00::10"], "ipFamilies": ["IPv4", "IPv6"],
                        "ipFamilyPolicy": "RequireDualStack"}}),
        json!({"spec": {"clusterIP": "fd00::10", "clusterIPs": ["fd00::10", "10.96.0.10"], "ipFamilyPolicy": "PreferDualStack"}}),
        json!({"spec": {"clusterIP": "None", "ports": null}}),
        json!({"spec": {"clusterIP": "None", "clusterIPs": ["None"], "ipFamilyPolicy": "RequireDualStack"}}),
        // Upstream's TestBadIPs: the legacy leading-zero form the API once stored.
        json!({"spec": {"clusterIP": "172.30.0.041"}}),
        // No cluster IP at all: the API server would allocate one; kpr-model decides.
        json!({"spec": {"clusterIP": null}}),
        json!({"spec": {"clusterIP": ""}}),
    ];
    assert_accepted(&accepted, base_service, default_service_rules);
}

#[test]
fn malformed_list_entries_are_not_reasons_to_refuse_a_service() {
    // Upstream's proxy drops just the bad entry (kpr-model does the same); the API rules
    // here must not refuse the Service for it.
    let lists = json!({
        "spec": {
            "type": "LoadBalancer",
            "ports": [{"name": "http", "port": 80, "nodePort": 30080}],
            "externalIPs": ["10.1.0.1", "nonsense", "10.1.0.0/24"],
            "loadBalancerSourceRanges": ["203.0.113.0/24", "not-a-cidr", "10.0.0.1"]
        },
        "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}, {"ip": "192.0.2.999"}, {"hostname": "lb.example"}]}}
    });
    assert_accepted(&[lists], base_service, default_service_rules);
}

#[test]
fn external_name_services() {
    use RejectReason::*;
    let external = || {
        json!({
            "metadata": {"name": "db", "namespace": "shop"},
            "spec": {"type": "ExternalName", "externalName": "db.example.com"}
        })
    };
    let cases = [
        (
            json!({"spec": {"clusterIP": "10.96.0.10"}}),
            "spec.clusterIP",
            InvalidValue,
        ),
        (
            json!({"spec": {"ipFamilyPolicy": "SingleStack"}}),
            "spec.ipFamilyPolicy",
            InvalidValue,
        ),
        (
            json!({"spec": {"externalName": null}}),
            "spec.externalName",
            MissingField,
        ),
        (
            json!({"spec": {"externalName": "db example"}}),
            "spec.externalName",
            InvalidValue,
        ),
        (
            json!({"spec": {"ports": [{"port": 70000}]}}),
            "spec.ports[0].port",
            InvalidPort,
        ),
    ];
    assert_refused(&cases, external, default_service_rules);
    assert_accepted(
        &[json!({}), json!({"spec": {"externalName": "db.example.com."}})],
        external,
        default_service_rules,
    );
}

// === EndpointSlices ===

#[test]
fn slice_identity_and_service_label() {
    use RejectReason::*;
    let label = r#"metadata.labels["kubernetes.io/service-name"]"#;
    let service = |name: &str| json!({"metadata": {"labels": {"kubernetes.io/service-name": name}}});
    let cases = [
        (
            json!({"metadata": {"name": "web/abc"}}),
            "metadata.name",
            InvalidValue,
        ),
        (
            json!({"metadata": {"name": "Web-abc"}}),
            "metadata.name",
            InvalidValue,
        ),
        (
            json!({"metadata": {"name": "web..abc"}}),
            "metadata.name",
            InvalidValue,
        ),
        (
            json!({"metadata": {"namespace": "a.b"}}),
            "metadata.namespace",
            InvalidValue,
        ),
        (
            service("evil\n-A KUBE-SERVICES -j ACCEPT\n#"),
            label,
            InvalidValue,
        ),
        (service("a/b"), label, InvalidValue),
        (service("web_1"), label, InvalidValue),
        (service("-web"), label, InvalidValue),
        (service(&"w".repeat(64)), label, InvalidValue),
        (json!({"addressType": ""}), "addressType", MissingField),
        (json!({"addressType": "IP"}), "addressType", InvalidValue),
    ];
    assert_refused(&cases, base_slice, slice_rules);
    assert_accepted(
        &[
            json!({}),
            json!({"metadata": {"name": "web.abc-12"}}),
            json!({"addressType": "FQDN"}),
            // Since 1.37 a Service name may start with a digit (KEP-5311).
            json!({"metadata": {"labels": {"kubernetes.io/service-name": "1web"}}}),
            // Optional since the 1.37 API.
            json!({"endpoints": null}),
        ],
        base_slice,
        slice_rules,
    );
}

#[test]
fn slice_endpoints_and_their_limits() {
    use RejectReason::*;
    let endpoints = |list: Value| json!({"endpoints": list});
    let addresses = |n: usize| endpoints(json!([{"addresses": vec!["10.244.1.10"; n]}]));
    let many = |n: usize| endpoints(Value::Array(vec![json!({"addresses": ["10.244.1.10"]}); n]));
    let zones = |names: &[&str]| {
        let zones: Vec<Value> = names.iter().map(|z| json!({"name": z})).collect();
        endpoints(json!([{"addresses": ["10.244.1.10"], "hints": {"forZones": zones}}]))
    };
    let cases = [
        (many(1001), "endpoints", TooLarge),
        (addresses(0), "endpoints[0].addresses", MissingField),
        (addresses(101), "endpoints[0].addresses", TooLarge),
        (
            endpoints(json!([{"addresses": ["10.244.1.10"], "nodeName": "Node 1"}])),
            "endpoints[0].nodeName",
            InvalidValue,
        ),
        (
            endpoints(json!([{"addresses": ["10.244.1.10"], "hostname": "web.0"}])),
            "endpoints[0].hostname",
            InvalidValue,
        ),
        (zones(&["a"; 9]), "endpoints[0].hints.forZones", TooLarge),
        (
            zones(&["a", "a"]),
            "endpoints[0].hints.forZones[1].name",
            InvalidValue,
        ),
        (
            zones(&["zone a"]),
            "endpoints[0].hints.forZones[0].name",
            InvalidValue,
        ),
        (
            endpoints(json!([{"addresses": ["10.244.1.10"], "hints": {"forNodes": [{"name": "Node_1"}]}}])),
            "endpoints[0].hints.forNodes[0].name",
            InvalidValue,
        ),
    ];
    assert_refused(&cases, base_slice, slice_rules);
    let rejection = slice_rules(&patched(base_slice(), &many(1001))).unwrap_err();
    assert_eq!(
        rejection.detail,
        "has 1001 endpoints; the API allows at most 1000"
    );
    assert_accepted(
        &[
            many(1000),
            addresses(100),
            zones(&["zone-a", "zone-b"]),
            endpoints(json!([])),
            // The text of an address is kpr-model's to judge (it drops a malformed one).
            endpoints(json!([{"addresses": ["10.244.1.999"]}])),
        ],
        base_slice,
        slice_rules,
    );
}

#[test]
fn slice_ports() {
    use RejectReason::*;
    let ports = |list: Value| json!({"ports": list});
    let cases = [
        (
            ports(Value::Array(vec![json!({"port": 80}); 20_001])),
            "ports",
            TooLarge,
        ),
        (
            ports(json!([{"name": "HTTP", "port": 80}])),
            "ports[0].name",
            InvalidValue,
        ),
        (
            ports(json!([{"name": "a", "port": 80}, {"name": "a", "port": 81}])),
            "ports[1].name",
            DuplicatePort,
        ),
        (
            ports(json!([{"port": 80}, {"port": 81}])),
            "ports[1].name",
            DuplicatePort,
        ),
        (
            ports(json!([{"name": "a", "port": 80, "protocol": "udp"}])),
            "ports[0].protocol",
            InvalidProtocol,
        ),
        (
            ports(json!([{"name": "a", "port": 0}])),
            "ports[0].port",
            InvalidPort,
        ),
        (
            ports(json!([{"name": "a", "port": 65536}])),
            "ports[0].port",
            InvalidPort,
        ),
    ];
    assert_refused(&cases, base_slice, slice_rules);
    assert_accepted(
        &[
            ports(json!([])),
            ports(json!([{"port": 53, "protocol": "UDP"}])),
            ports(json!([{"name": "a-long-port-name-too", "port": 53}])),
        ],
        base_slice,
        slice_rules,
    );
}

// === Nodes, kpr-model, files ===

#[test]
fn node_names_are_dns_subdomains() {
    let node = |name: &str| json!({"metadata": {"name": name}});
    assert!(validate(ObjectKind::Node, &node("node-1.example")).is_ok());
    for bad in ["Node_1", "node 1", "node\n1"] {
        let rejection = validate(ObjectKind::Node, &node(bad)).expect_err(bad);
        assert_eq!(rejection.field, "metadata.name", "{bad:?}");
        assert!(!rejection.object.contains('\n'), "{rejection:?}");
    }
}

#[test]
fn kpr_models_own_checks_run_too() {
    // The API allows a slice without the service-name label; kpr-model (which must know the
    // slice's Service) does not. (A port without a number is no such case: upstream's proxy
    // skips just that port, and so does kpr-model, reporting it.)
    let unlabelled = patched(base_slice(), &json!({"metadata": {"labels": null}}));
    assert!(slice_rules(&unlabelled).is_ok());
    let rejection = validate(ObjectKind::EndpointSlice, &unlabelled).unwrap_err();
    assert_eq!(
        (rejection.field.as_str(), rejection.reason),
        (
            "metadata.labels[\"kubernetes.io/service-name\"]",
            RejectReason::MissingField
        )
    );
    let portless = patched(base_slice(), &json!({"ports": [{"name": "http"}]}));
    assert!(validate(ObjectKind::EndpointSlice, &portless).is_ok());
    // And the API-rule failure comes first, with the same shape.
    let rejection = validate(
        ObjectKind::Service,
        &patched(base_service(), &json!({"spec": {"type": "Internal"}})),
    );
    assert_eq!(rejection.unwrap_err().field, "spec.type");
    assert!(validate(ObjectKind::Service, &base_service()).is_ok());
    assert!(validate(ObjectKind::EndpointSlice, &base_slice()).is_ok());
}

#[test]
fn the_evil_name_is_refused_and_shown_escaped() {
    let evil = patched(
        base_service(),
        &json!({"metadata": {"name": "evil\n-A KUBE-SERVICES -j ACCEPT\n#"}}),
    );
    let rejection = validate(ObjectKind::Service, &evil).unwrap_err();
    assert_eq!(rejection.field, "metadata.name");
    assert_eq!(rejection.object, "shop/evil\\n-A KUBE-SERVICES -j ACCEPT\\n#");
    assert!(!rejection.to_string().contains('\n'), "{rejection}");
}

#[test]
fn validate_file_moves_bad_objects_to_failed_and_says_where() {
    let good_key = key_of(ObjectKind::Service, &base_service());
    let bad_value = patched(
        base_service(),
        &json!({"metadata": {"name": "db"}, "spec": {"clusterIP": "10.96.0.1O"}}),
    );
    let bad_key = key_of(ObjectKind::Service, &bad_value);
    let mut file = FileObjects::default();
    for (i, (key, value)) in [(&good_key, base_service()), (&bad_key, bad_value)]
        .into_iter()
        .enumerate()
    {
        let service: Service = serde_json::from_value(value).unwrap();
        file.objects
            .insert(key.clone(), ManifestObject::Service(Arc::new(service)));
        let placement = Placement {
            ordinal: i,
            label: format!("document {}", i + 1),
        };
        file.placements.insert(key.clone(), placement);
    }
    validate_file(Path::new("/m/shop.yaml"), &mut file, &ValidationRules::default());
    assert_eq!(file.objects.keys().collect::<Vec<_>>(), [&good_key]);
    assert!(file.failed.contains(&bad_key));
    assert_eq!(file.rejections.len(), 1);
    let rejection = &file.rejections[0];
    assert_eq!(
        (rejection.object.as_str(), rejection.field.as_str()),
        ("shop/db", "spec.clusterIP")
    );
    assert_eq!(rejection.reason, RejectReason::InvalidIp);
    assert!(
        rejection.detail.ends_with("(in /m/shop.yaml, document 2)"),
        "{}",
        rejection.detail
    );
}

// === ServiceCIDRs ===

fn base_service_cidr() -> Value {
    json!({"metadata": {"name": "kubernetes"}, "spec": {"cidrs": ["10.96.0.0/16", "fd00:96::/112"]}})
}

fn service_cidr_rules(value: &Value) -> Result<(), kpr_model::Rejection> {
    let key = key_of(ObjectKind::ServiceCidr, value);
    let object = ManifestObject::ServiceCidr(Arc::new(serde_json::from_value(value.clone()).unwrap()));
    validate_object(&key, &object, &ValidationRules::default())
}

#[test]
fn service_cidrs_follow_the_api_servers_rules() {
    use RejectReason::{InvalidCidr, InvalidValue, MissingField, TooLarge};
    assert_accepted(
        &[
            json!({}),
            json!({"spec": {"cidrs": ["10.96.0.0/12"]}}),
            json!({"spec": {"cidrs": ["fd00:96::/112", "10.96.0.0/16"]}}),
            json!({"metadata": {"name": "extra.cidrs-2"}}),
        ],
        base_service_cidr,
        service_cidr_rules,
    );
    let cases = [
        (
            json!({"metadata": {"name": "Kubernetes"}}),
            "metadata.name",
            InvalidValue,
        ),
        (
            json!({"metadata": {"name": "a\nb"}}),
            "metadata.name",
            InvalidValue,
        ),
        (json!({"spec": {"cidrs": []}}), "spec.cidrs", MissingField),
        (json!({"spec": null}), "spec.cidrs", MissingField),
        (
            json!({"spec": {"cidrs": ["10.96.0.0/16", "fd00::/112", "10.97.0.0/16"]}}),
            "spec.cidrs",
            TooLarge,
        ),
        (
            json!({"spec": {"cidrs": ["10.96.0.0/16", "10.97.0.0/16"]}}),
            "spec.cidrs",
            InvalidCidr,
        ),
        (
            json!({"spec": {"cidrs": ["fd00::/112", "fd01::/112"]}}),
            "spec.cidrs",
            InvalidCidr,
        ),
        (
            json!({"spec": {"cidrs": ["10.96.0.0"]}}),
            "spec.cidrs[0]",
            InvalidCidr,
        ),
        (
            json!({"spec": {"cidrs": ["nope", "fd00::/112"]}}),
            "spec.cidrs[0]",
            InvalidCidr,
        ),
        (
            json!({"spec": {"cidrs": ["10.96.0.0/33"]}}),
            "spec.cidrs[0]",
            InvalidCidr,
        ),
        (
            json!({"spec": {"cidrs": ["010.96.0.0/16"]}}),
            "spec.cidrs[0]",
            InvalidCidr,
        ),
        (
            json!({"spec": {"cidrs": ["10.96.0.0/016"]}}),
            "spec.cidrs[0]",
            InvalidCidr,
        ),
        (
            json!({"spec": {"cidrs": ["10.96.0.0/+16"]}}),
            "spec.cidrs[0]",
            InvalidCidr,
        ),
        (
            json!({"spec": {"cidrs": ["10.96.0.1/16"]}}),
            "spec.cidrs[0]",
            InvalidCidr,
        ),
        (
            json!({"spec": {"cidrs": ["10.96.0.0/16", "::ffff:10.0.0.0/104"]}}),
            "spec.cidrs[1]",
            InvalidCidr,
        ),
        (
            json!({"spec": {"cidrs": ["0.0.0.0/0"]}}),
            "spec.cidrs[0]",
            InvalidCidr,
        ),
        (
            json!({"spec": {"cidrs": ["10.96.0.0/16", "::/0"]}}),
            "spec.cidrs[1]",
            InvalidCidr,
        ),
    ];
    assert_refused(&cases, base_service_cidr, service_cidr_rules);
}

#[test]
fn a_refused_service_cidr_names_the_object_and_shows_the_value_escaped() {
    let value = patched(
        base_service_cidr(),
        &json!({"spec": {"cidrs": ["10.96.0.0/16\n-A X"]}}),
    );
    let rejection = service_cidr_rules(&value).unwrap_err();
    assert_eq!(rejection.kind, ObjectKind::ServiceCidr);
    assert_eq!(rejection.object, "kubernetes");
    assert!(!rejection.to_string().contains('\n'), "{rejection}");
}
