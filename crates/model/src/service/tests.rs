use super::fields::{EXTERNAL_IPS, INGRESS_IP, INGRESS_IP_MODE, SOURCE_RANGES};
use super::*;
use crate::ident::{IpFamily, ObjectKind, Protocol};
use crate::ignored::Converted;
use crate::rejection::{RejectReason, Rejection};
use k8s_openapi::api::core::v1::Service;
use serde_json::json;

fn service(value: serde_json::Value) -> Service {
    serde_json::from_value(value).expect("test fixture is a Service")
}

fn convert(value: serde_json::Value) -> Converted<ServiceView> {
    service_view(&service(value), IpFamily::V4).expect("should convert")
}

fn ports(converted: Converted<ServiceView>) -> Vec<ServicePort> {
    match converted.view {
        ServiceView::Proxied(p) => p,
        ServiceView::Skipped(r) => panic!("skipped: {r:?}"),
    }
}

fn skipped(value: serde_json::Value) -> SkipReason {
    match convert(value).view {
        ServiceView::Skipped(r) => r,
        ServiceView::Proxied(p) => panic!("proxied: {p:?}"),
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// Since 1.37 the API server stores Service names that start with a digit (KEP-5311).
#[test]
fn a_service_name_may_start_with_a_digit() {
    let view = service_view(
        &service(json!({"metadata": {"name": "1web", "namespace": "default"},
                       "spec": {"clusterIP": "10.0.0.1", "ports": [{"port": 80}]}})),
        IpFamily::V4,
    );
    assert!(view.is_ok(), "{view:?}");
}

#[test]
fn cluster_ip_service_converts_each_port() {
    let converted = convert(json!({
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"clusterIP": "10.96.0.10", "ports": [
            {"name": "http", "port": 80, "targetPort": 8080},
            {"name": "dns", "port": 53, "protocol": "UDP"}
        ]}
    }));
    assert!(converted.ignored.is_empty());
    let ports = ports(converted);
    assert_eq!(ports.len(), 2);
    assert_eq!(ports[0].name.to_string(), "shop/web:http");
    assert_eq!(ports[0].name.protocol, Protocol::Tcp);
    assert_eq!(ports[1].name.protocol, Protocol::Udp);
    assert_eq!(ports[0].cluster_ip, ip("10.96.0.10"));
    assert!(!ports[0].externally_accessible());
}

#[test]
fn nodeport_and_local_policy() {
    let p = &ports(convert(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.10",
                 "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000,
                 "sessionAffinity": "ClientIP",
                 "ports": [{"port": 80, "nodePort": 30080}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}, {"ip": "203.0.113.8", "ipMode": "Proxy"}]}}
    })))[0];
    assert_eq!(p.node_port, Some(30080));
    assert!(p.external_policy_local);
    assert_eq!(p.health_check_node_port, Some(31000));
    assert_eq!(p.load_balancer_ips, vec![ip("203.0.113.7")]);
    assert_eq!(p.session_affinity_seconds, Some(DEFAULT_AFFINITY_TIMEOUT_SECONDS));
    assert!(p.uses_local_endpoints());
    assert!(
        p.uses_cluster_endpoints(),
        "internal traffic still uses cluster endpoints"
    );
}

#[test]
fn headless_external_name_other_family_and_ip_less_services_are_skipped() {
    let cases = [
        (
            json!({"metadata": {"name": "h"}, "spec": {"clusterIP": "None", "ports": [{"port": 80}]}}),
            SkipReason::Headless,
        ),
        (
            json!({"metadata": {"name": "h"}, "spec": {"clusterIPs": ["None"], "ports": [{"port": 80}]}}),
            SkipReason::Headless,
        ),
        (
            json!({"metadata": {"name": "e"}, "spec": {"type": "ExternalName", "externalName": "x.example"}}),
            SkipReason::ExternalName,
        ),
        (
            json!({"metadata": {"name": "v6"}, "spec": {"clusterIPs": ["fd00::1"], "ports": [{"port": 80}]}}),
            SkipReason::OtherFamily,
        ),
        // Upstream's ShouldSkipService: an empty cluster IP is skipped like "None".
        (
            json!({"metadata": {"name": "a"}, "spec": {"ports": [{"port": 80}]}}),
            SkipReason::NoClusterIp,
        ),
        (
            json!({"metadata": {"name": "a"}, "spec": {"clusterIP": "", "ports": [{"port": 80}]}}),
            SkipReason::NoClusterIp,
        ),
        (
            json!({"metadata": {"name": "a"}, "spec": {"clusterIP": "", "clusterIPs": [""], "ports": [{"port": 80}]}}),
            SkipReason::NoClusterIp,
        ),
    ];
    for (value, reason) in cases {
        assert_eq!(skipped(value.clone()), reason, "for {value}");
    }
}

#[test]
fn empty_cluster_ips_entries_count_as_absent() {
    let p = &ports(convert(json!({
        "metadata": {"name": "a"},
        "spec": {"clusterIP": "10.0.0.1", "clusterIPs": ["", "10.0.0.1"], "ports": [{"port": 80}]}
    })))[0];
    assert_eq!(p.cluster_ip, ip("10.0.0.1"));
}

#[test]
fn dual_stack_picks_the_family() {
    let svc = service(
        json!({"metadata": {"name": "d"}, "spec": {"clusterIPs": ["fd00::1", "10.0.0.1"], "ports": [{"port": 80}]}}),
    );
    let v4 = ports(service_view(&svc, IpFamily::V4).unwrap());
    assert_eq!(v4[0].cluster_ip, ip("10.0.0.1"));
    let v6 = ports(service_view(&svc, IpFamily::V6).unwrap());
    assert_eq!(v6[0].cluster_ip, ip("fd00::1"));
}

/// Upstream's TestBadIPs input: the legacy leading-zero form the API once accepted is read
/// as decimal everywhere, and nothing is dropped.
#[test]
fn legacy_leading_zero_addresses_are_read_as_decimal() {
    let converted = convert(json!({
        "metadata": {"name": "svc1", "namespace": "ns1"},
        "spec": {"type": "LoadBalancer", "clusterIP": "172.30.0.041",
                 "externalIPs": ["192.168.099.022"],
                 "loadBalancerSourceRanges": ["203.0.113.000/025"],
                 "ports": [{"name": "p80", "port": 80, "nodePort": 3001}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "1.2.3.004"}]}}
    }));
    assert_eq!(converted.ignored, []);
    let p = &ports(converted)[0];
    assert_eq!(p.cluster_ip, ip("172.30.0.41"));
    assert_eq!(p.external_ips, [ip("192.168.99.22")]);
    assert_eq!(p.load_balancer_ips, [ip("1.2.3.4")]);
    assert_eq!(
        p.load_balancer_source_ranges,
        ["203.0.113.0/25".parse::<IpNet>().unwrap()]
    );
}

/// A malformed entry of an address list drops that entry only; the rest of the Service is
/// converted and the dropped entry is reported with its field path.
#[test]
fn bad_list_entries_are_dropped_and_reported() {
    let converted = convert(json!({
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"type": "LoadBalancer", "clusterIP": "10.0.0.1",
                 "externalIPs": ["192.0.2.1", "not-an-ip", "", " ", "192.0.2.300", "fd00::5", "192.0.2.2"],
                 "loadBalancerSourceRanges": [" 198.51.100.0/24 ", "10.0.0.0/33", "", "fd00::/64", "10.1.0.0"],
                 "ports": [{"name": "http", "port": 80, "nodePort": 30080}, {"name": "https", "port": 443, "nodePort": 30443}]},
        "status": {"loadBalancer": {"ingress": [
            {"ip": "203.0.113.1"}, {"ip": "203.0.113"}, {"hostname": "lb.example"},
            {"ip": "203.0.113.2", "ipMode": "Proxy"}, {"ip": "203.0.113.3", "ipMode": "Magic"},
            {"ip": "203.0.113.4", "ipMode": "VIP"}
        ]}}
    }));
    let found: Vec<_> = converted
        .ignored
        .iter()
        .map(|w| (w.field.as_str(), w.list, w.reason))
        .collect();
    assert_eq!(
        found,
        [
            ("spec.externalIPs[1]", EXTERNAL_IPS, RejectReason::InvalidIp),
            ("spec.externalIPs[4]", EXTERNAL_IPS, RejectReason::InvalidIp),
            (
                "status.loadBalancer.ingress[1].ip",
                INGRESS_IP,
                RejectReason::InvalidIp
            ),
            (
                "status.loadBalancer.ingress[4].ipMode",
                INGRESS_IP_MODE,
                RejectReason::InvalidValue
            ),
            (
                "spec.loadBalancerSourceRanges[1]",
                SOURCE_RANGES,
                RejectReason::InvalidCidr
            ),
            (
                "spec.loadBalancerSourceRanges[4]",
                SOURCE_RANGES,
                RejectReason::InvalidCidr
            ),
        ]
    );
    for w in &converted.ignored {
        assert_eq!((w.kind, w.object.as_str()), (ObjectKind::Service, "shop/web"));
    }
    assert!(converted.ignored[0].detail.contains("\"not-an-ip\""));
    let ports = ports(converted);
    assert_eq!(ports.len(), 2, "every port is still programmed");
    for p in &ports {
        assert_eq!(p.external_ips, [ip("192.0.2.1"), ip("192.0.2.2")]);
        assert_eq!(p.load_balancer_ips, [ip("203.0.113.1"), ip("203.0.113.4")]);
        assert_eq!(
            p.load_balancer_source_ranges,
            ["198.51.100.0/24".parse::<IpNet>().unwrap()]
        );
    }
}

/// The API server refuses loopback, link-local and unspecified external IPs: such an
/// entry is dropped, so no Service can capture traffic to the node's own addresses.
#[test]
fn external_ips_the_api_server_refuses_are_dropped() {
    let converted = convert(json!({
        "metadata": {"name": "a"},
        "spec": {"clusterIP": "10.0.0.1",
                 "externalIPs": ["127.0.0.1", "169.254.169.254", "0.0.0.0", "192.0.2.1"],
                 "ports": [{"port": 80}]}
    }));
    let fields = converted.dropped();
    assert_eq!(
        fields,
        [
            ("spec.externalIPs[0]", RejectReason::InvalidIp),
            ("spec.externalIPs[1]", RejectReason::InvalidIp),
            ("spec.externalIPs[2]", RejectReason::InvalidIp),
        ]
    );
    assert_eq!(ports(converted)[0].external_ips, [ip("192.0.2.1")]);
}

#[test]
fn warnings_do_not_repeat_the_offending_value_at_length() {
    let long = "x".repeat(100_000);
    let converted = convert(json!({
        "metadata": {"name": "a"},
        "spec": {"clusterIP": "10.0.0.1", "externalIPs": [long], "ports": [{"port": 80}]}
    }));
    assert!(converted.ignored[0].detail.len() < 200);
}

/// Upstream reads `status.loadBalancer.ingress` for every Service type; only `ipMode`
/// other than VIP keeps an IP out.
#[test]
fn load_balancer_ingress_ips_are_used_for_any_service_type() {
    for service_type in ["ClusterIP", "NodePort", "LoadBalancer"] {
        let p = &ports(convert(json!({
            "metadata": {"name": "a"},
            "spec": {"type": service_type, "clusterIP": "10.0.0.1", "ports": [{"port": 80, "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.9"}, {"ip": "203.0.113.10", "ipMode": "Proxy"}]}}
        })))[0];
        assert_eq!(p.load_balancer_ips, [ip("203.0.113.9")], "{service_type}");
        assert!(p.externally_accessible(), "{service_type}");
    }
}

/// Upstream: `ExternalPolicyLocal` needs an externally accessible *type* (or a ClusterIP
/// Service with externalIPs); `NeedsHealthCheck` needs type LoadBalancer as well.
#[test]
fn external_policy_and_health_check_follow_the_service_type() {
    let cases = [
        // (type, externalIPs, ingress, expected external_policy_local, health check port)
        (
            "ClusterIP",
            json!([]),
            json!([{"ip": "203.0.113.9"}]),
            false,
            None,
        ),
        ("ClusterIP", json!(["192.0.2.1"]), json!([]), true, None),
        // Upstream looks at the listed externalIPs, even if none is of this family.
        ("ClusterIP", json!(["fd00::1"]), json!([]), true, None),
        ("NodePort", json!([]), json!([{"ip": "203.0.113.9"}]), true, None),
        (
            "LoadBalancer",
            json!([]),
            json!([{"ip": "203.0.113.9"}]),
            true,
            Some(31000),
        ),
    ];
    for (service_type, external_ips, ingress, local, health_check) in cases {
        let p = &ports(convert(json!({
            "metadata": {"name": "a"},
            "spec": {"type": service_type, "clusterIP": "10.0.0.1", "externalIPs": external_ips,
                     "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000,
                     "ports": [{"port": 80, "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": ingress}}
        })))[0];
        assert_eq!(
            (p.external_policy_local, p.health_check_node_port),
            (local, health_check),
            "{service_type} {external_ips} {ingress}"
        );
    }
}

/// Upstream's `UsesClusterEndpoints` (`!internalPolicyLocal || ExternallyAccessible()`)
/// and `UsesLocalEndpoints`, over both policies and both kinds of reachability.
#[test]
fn which_endpoint_sets_a_port_uses() {
    let cases = [
        // (type, internalTrafficPolicy, externalTrafficPolicy, uses cluster, uses local)
        ("ClusterIP", "Cluster", "Cluster", true, false),
        ("ClusterIP", "Local", "Cluster", false, true),
        ("NodePort", "Cluster", "Cluster", true, false),
        ("NodePort", "Cluster", "Local", true, true),
        ("NodePort", "Local", "Cluster", true, true),
        // Pod and host traffic to the NodePort is short-circuited to cluster endpoints.
        ("NodePort", "Local", "Local", true, true),
    ];
    for (service_type, internal, external, cluster, local) in cases {
        let p = &ports(convert(json!({
            "metadata": {"name": "a"},
            "spec": {"type": service_type, "clusterIP": "10.0.0.1",
                     "internalTrafficPolicy": internal, "externalTrafficPolicy": external,
                     "ports": [{"port": 80, "nodePort": 30080}]}
        })))[0];
        assert_eq!(
            (p.uses_cluster_endpoints(), p.uses_local_endpoints()),
            (cluster, local),
            "{service_type} internal={internal} external={external}"
        );
    }
}

/// The API server reads an empty `type`, `sessionAffinity`, `externalTrafficPolicy` or
/// port `protocol` as unset and fills in the default; an empty `internalTrafficPolicy` it
/// refuses.
#[test]
fn empty_strings_mean_the_api_servers_defaults() {
    let p = &ports(convert(json!({
        "metadata": {"name": "a"},
        "spec": {"type": "", "clusterIP": "10.0.0.1", "sessionAffinity": "",
                 "externalTrafficPolicy": "", "ports": [{"port": 80, "protocol": ""}]}
    })))[0];
    assert_eq!(p.service_type, ServiceType::ClusterIp);
    assert_eq!(p.name.protocol, Protocol::Tcp);
    assert_eq!(p.session_affinity_seconds, None);
    assert!(!p.external_policy_local && !p.internal_policy_local);
    let r = rejection(json!({"metadata": {"name": "a"},
        "spec": {"clusterIP": "10.0.0.1", "internalTrafficPolicy": "", "ports": [{"port": 80}]}}));
    assert_eq!(
        (r.field.as_str(), r.reason),
        ("spec.internalTrafficPolicy", RejectReason::InvalidValue)
    );
}

fn rejection(value: serde_json::Value) -> Rejection {
    service_view(&service(value), IpFamily::V4).expect_err("should be rejected")
}

#[test]
fn malformed_fields_are_rejected_with_the_field_path() {
    let cases = [
        (
            json!({"metadata": {"name": "a"}, "spec": {"clusterIP": "10.0.0.300", "ports": [{"port": 80}]}}),
            "spec.clusterIP",
            RejectReason::InvalidIp,
        ),
        (
            json!({"metadata": {"name": "a"}, "spec": {"clusterIP": " 10.0.0.1", "ports": [{"port": 80}]}}),
            "spec.clusterIP",
            RejectReason::InvalidIp,
        ),
        (
            json!({"metadata": {"name": "a"}, "spec": {"clusterIPs": ["10.0.0.1", "fd00::x"], "ports": [{"port": 80}]}}),
            "spec.clusterIPs[1]",
            RejectReason::InvalidIp,
        ),
        (
            json!({"metadata": {"name": "a"}, "spec": {"clusterIP": "10.0.0.1", "ports": [{"port": 70000}]}}),
            "spec.ports[0].port",
            RejectReason::InvalidPort,
        ),
        (
            json!({"metadata": {"name": "a"}, "spec": {"clusterIP": "10.0.0.1", "ports": [{"port": 80, "protocol": "ICMP"}]}}),
            "spec.ports[0].protocol",
            RejectReason::InvalidProtocol,
        ),
        (
            json!({"metadata": {"name": "a"}, "spec": {"clusterIP": "10.0.0.1", "ports": [{"name": "a", "port": 80}, {"port": 81}]}}),
            "spec.ports[1].name",
            RejectReason::MissingField,
        ),
        (
            json!({"metadata": {"name": "a"}, "spec": {"clusterIP": "10.0.0.1", "ports": [{"name": "a", "port": 80}, {"name": "a", "port": 81}]}}),
            "spec.ports[1].name",
            RejectReason::DuplicatePort,
        ),
        (
            json!({"metadata": {"name": "a"}, "spec": {"clusterIP": "10.0.0.1", "type": "Magic", "ports": [{"port": 80}]}}),
            "spec.type",
            RejectReason::InvalidValue,
        ),
        (
            json!({"metadata": {"name": "a"}, "spec": {"clusterIP": "10.0.0.1", "externalTrafficPolicy": "Global", "ports": [{"port": 80}]}}),
            "spec.externalTrafficPolicy",
            RejectReason::InvalidValue,
        ),
        (
            json!({"metadata": {"name": "a"}, "spec": {"clusterIP": "10.0.0.1", "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 0}}, "ports": [{"port": 80}]}}),
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
            RejectReason::InvalidValue,
        ),
        (
            json!({"metadata": {"name": "a"}, "spec": {"clusterIP": "10.0.0.1", "type": "NodePort", "ports": [{"port": 80, "nodePort": -1}]}}),
            "spec.ports[0].nodePort",
            RejectReason::InvalidPort,
        ),
        (
            json!({"metadata": {"name": "a"}, "spec": {"clusterIP": "10.0.0.1"}}),
            "spec.ports",
            RejectReason::MissingField,
        ),
        (
            json!({"metadata": {"name": "a"}}),
            "spec",
            RejectReason::MissingField,
        ),
    ];
    for (value, field, reason) in cases {
        let r = rejection(value.clone());
        assert_eq!((r.field.as_str(), r.reason), (field, reason), "for {value}");
        assert_eq!(r.object, "default/a");
        assert_eq!(r.kind, ObjectKind::Service);
    }
}

/// Names reach rule comments and chain-name hashes: they follow the API server's rules,
/// whatever the source.
#[test]
fn names_that_could_inject_or_collide_are_rejected() {
    let spec = json!({"clusterIP": "10.0.0.1", "ports": [{"port": 80}]});
    let cases = [
        (
            json!({"name": "evil\n-A KUBE-SERVICES -j ACCEPT\n#"}),
            "metadata.name",
        ),
        (json!({"name": "a/b", "namespace": "c"}), "metadata.name"),
        (json!({"name": "c", "namespace": "a/b"}), "metadata.namespace"),
        (json!({"name": "Web"}), "metadata.name"),
        (json!({"name": "-web"}), "metadata.name"),
        (json!({"name": "web", "namespace": "Shop"}), "metadata.namespace"),
        (
            json!({"name": "web", "namespace": "shop.v1"}),
            "metadata.namespace",
        ),
        (json!({"name": "a".repeat(64)}), "metadata.name"),
    ];
    for (metadata, field) in cases {
        let r = rejection(json!({"metadata": metadata, "spec": spec}));
        assert_eq!(
            (r.field.as_str(), r.reason),
            (field, RejectReason::InvalidValue),
            "for {metadata}"
        );
        assert!(!r.to_string().contains('\n'), "{r}");
    }
    let port_names = [
        ("HTTP", "spec.ports[0].name"),
        ("-http", "spec.ports[0].name"),
        ("http:80", "spec.ports[0].name"),
        ("http_alt", "spec.ports[0].name"),
        ("a/b", "spec.ports[0].name"),
    ];
    for (name, field) in port_names {
        let r = rejection(json!({"metadata": {"name": "web"},
            "spec": {"clusterIP": "10.0.0.1", "ports": [{"name": name, "port": 80}]}}));
        assert_eq!(
            (r.field.as_str(), r.reason),
            (field, RejectReason::InvalidValue),
            "for {name}"
        );
    }
}

#[test]
fn service_port_names_are_dns_labels_not_iana_names() {
    // Upstream validates Service port names as DNS-1123 labels: longer and digit-only
    // names that are not IANA service names are real and must keep working.
    for name in ["http-metrics-port", "8080", "dns--tcp"] {
        let svc = service(json!({"metadata": {"name": "web"},
            "spec": {"clusterIP": "10.0.0.1", "ports": [{"name": name, "port": 80}]}}));
        let converted = service_view(&svc, IpFamily::V4).expect("accepted");
        assert_eq!(&*ports(converted)[0].name.port, name);
    }
}
