//! A Service, seen as the list of its ports for one IP family.
//!
//! Mirrors upstream's `newBaseServiceInfo`: the cluster IP of the proxier's family, the
//! external IPs / load-balancer IPs / source ranges of that family, affinity, and the two
//! traffic policies reduced to booleans. Unlike upstream, which logs and ignores a bad IP in
//! a list, any malformed field rejects the whole Service: half-programming a Service hides
//! the mistake, refusing it with a precise error does not.

use std::collections::HashSet;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Service, ServiceSpec};

use crate::ident::{IpFamily, NamespacedName, ObjectKind, Protocol, ServicePortName};
use crate::rejection::{RejectReason, Rejecter, Rejection};

/// Upstream's default `sessionAffinityConfig.clientIP.timeoutSeconds` (3 hours).
pub const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10800;
/// The API server's upper bound for the affinity timeout (1 day).
const MAX_AFFINITY_TIMEOUT_SECONDS: i32 = 86400;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServiceType {
    ClusterIp,
    NodePort,
    LoadBalancer,
}

/// One port of a Service, for one IP family: everything rule generation needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub name: ServicePortName,
    pub service_type: ServiceType,
    pub cluster_ip: IpAddr,
    pub port: u16,
    /// Only for NodePort and LoadBalancer services that have one allocated.
    pub node_port: Option<u16>,
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip`, except ingresses with `ipMode: Proxy`.
    pub load_balancer_ips: Vec<IpAddr>,
    pub load_balancer_source_ranges: Vec<IpNet>,
    /// ClientIP affinity timeout in seconds; `None` means no affinity.
    pub session_affinity_seconds: Option<u32>,
    /// `externalTrafficPolicy: Local` on an externally reachable service.
    pub external_policy_local: bool,
    /// `internalTrafficPolicy: Local`.
    pub internal_policy_local: bool,
    /// Only for LoadBalancer services with `externalTrafficPolicy: Local`.
    pub health_check_node_port: Option<u16>,
}

impl ServicePort {
    /// Reachable from outside the cluster through a NodePort, an external IP or a load balancer.
    pub fn externally_accessible(&self) -> bool {
        self.node_port.is_some() || !self.external_ips.is_empty() || !self.load_balancer_ips.is_empty()
    }

    /// Whether some traffic to this port is spread over endpoints on every node.
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local || self.externally_accessible()
    }

    /// Whether some traffic to this port goes only to endpoints on this node.
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local || (self.externally_accessible() && self.external_policy_local)
    }
}

/// Why a valid Service gets no rules from this proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    Headless,
    ExternalName,
    /// The Service has no cluster IP of this proxier's family (e.g. IPv6-only on an IPv4 proxier).
    OtherFamily,
}

/// The outcome of converting a Service for one IP family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceView {
    Proxied(Vec<ServicePort>),
    Skipped(SkipReason),
}

/// Converts a Service into its ports for `family`, or says why it is skipped or rejected.
pub fn service_view(service: &Service, family: IpFamily) -> Result<ServiceView, Rejection> {
    let id = object_id(&service.metadata.namespace, &service.metadata.name);
    let rejecter = Rejecter::new(ObjectKind::Service, id.to_string());
    if service.metadata.name.as_deref().unwrap_or("").is_empty() {
        return Err(rejecter.reject("metadata.name", RejectReason::MissingField, "required"));
    }
    let Some(spec) = &service.spec else {
        return Err(rejecter.reject("spec", RejectReason::MissingField, "required"));
    };
    let service_type = match spec.type_.as_deref() {
        None | Some("ClusterIP") => ServiceType::ClusterIp,
        Some("NodePort") => ServiceType::NodePort,
        Some("LoadBalancer") => ServiceType::LoadBalancer,
        Some("ExternalName") => return Ok(ServiceView::Skipped(SkipReason::ExternalName)),
        Some(other) => {
            return Err(rejecter.reject(
                "spec.type",
                RejectReason::InvalidValue,
                format!("{other:?} is not one of ClusterIP, NodePort, LoadBalancer, ExternalName"),
            ));
        }
    };
    let Some(cluster_ip) = cluster_ip_for_family(spec, family, &rejecter)? else {
        return Ok(ServiceView::Skipped(SkipReason::OtherFamily));
    };
    let cluster_ip = match cluster_ip {
        ClusterIp::None => return Ok(ServiceView::Skipped(SkipReason::Headless)),
        ClusterIp::Ip(ip) => ip,
    };
    let shared = SharedFields::convert(service, spec, service_type, family, &rejecter)?;
    let ports = spec.ports.as_deref().unwrap_or_default();
    if ports.is_empty() {
        return Err(rejecter.reject(
            "spec.ports",
            RejectReason::MissingField,
            "a Service with a cluster IP needs at least one port",
        ));
    }
    let mut seen_names = HashSet::new();
    let mut seen_ports = HashSet::new();
    let mut out = Vec::with_capacity(ports.len());
    for (i, port) in ports.iter().enumerate() {
        let field = format!("spec.ports[{i}]");
        let name = port.name.as_deref().unwrap_or("");
        if ports.len() > 1 && name.is_empty() {
            return Err(rejecter.reject(
                format!("{field}.name"),
                RejectReason::MissingField,
                "required when a Service has more than one port",
            ));
        }
        if !seen_names.insert(name) {
            return Err(rejecter.reject(
                format!("{field}.name"),
                RejectReason::DuplicatePort,
                format!("port name {name:?} is used twice"),
            ));
        }
        let protocol = Protocol::from_api(port.protocol.as_deref()).ok_or_else(|| {
            rejecter.reject(
                format!("{field}.protocol"),
                RejectReason::InvalidProtocol,
                format!(
                    "{:?} is not one of TCP, UDP, SCTP",
                    port.protocol.as_deref().unwrap_or("")
                ),
            )
        })?;
        let number = rejecter.port(&format!("{field}.port"), port.port)?;
        if !seen_ports.insert((number, protocol)) {
            return Err(rejecter.reject(
                format!("{field}.port"),
                RejectReason::DuplicatePort,
                format!("{number}/{protocol} is used twice"),
            ));
        }
        let node_port = rejecter.optional_port(&format!("{field}.nodePort"), port.node_port)?;
        out.push(ServicePort {
            name: ServicePortName {
                service: id.clone(),
                port: name.into(),
                protocol,
            },
            service_type,
            cluster_ip,
            port: number,
            // A nodePort on a ClusterIP service would be refused by the API server; ignore it.
            node_port: node_port.filter(|_| service_type != ServiceType::ClusterIp),
            external_ips: shared.external_ips.clone(),
            load_balancer_ips: shared.load_balancer_ips.clone(),
            load_balancer_source_ranges: shared.source_ranges.clone(),
            session_affinity_seconds: shared.affinity,
            external_policy_local: shared.external_policy_local,
            internal_policy_local: shared.internal_policy_local,
            health_check_node_port: shared.health_check_node_port,
        });
    }
    Ok(ServiceView::Proxied(out))
}

pub(crate) fn object_id(namespace: &Option<String>, name: &Option<String>) -> NamespacedName {
    let namespace = namespace
        .as_deref()
        .filter(|ns| !ns.is_empty())
        .unwrap_or("default");
    NamespacedName::new(namespace, name.as_deref().unwrap_or(""))
}

enum ClusterIp {
    None,
    Ip(IpAddr),
}

/// The cluster IP of `family`: `Ok(None)` when the Service has none of that family.
fn cluster_ip_for_family(
    spec: &ServiceSpec,
    family: IpFamily,
    rejecter: &Rejecter,
) -> Result<Option<ClusterIp>, Rejection> {
    let (field, ips): (&str, Vec<&str>) = match (&spec.cluster_ips, &spec.cluster_ip) {
        (Some(ips), _) if !ips.is_empty() => ("spec.clusterIPs", ips.iter().map(String::as_str).collect()),
        (_, Some(ip)) if !ip.is_empty() => ("spec.clusterIP", vec![ip.as_str()]),
        _ => {
            return Err(rejecter.reject(
                "spec.clusterIP",
                RejectReason::MissingField,
                "required (kube-proxy-rs does not allocate cluster IPs; set one, or \"None\" for a headless Service)",
            ));
        }
    };
    if ips[0] == "None" {
        return Ok(Some(ClusterIp::None));
    }
    let mut found = None;
    for (i, raw) in ips.iter().enumerate() {
        let field = if field == "spec.clusterIPs" {
            format!("{field}[{i}]")
        } else {
            field.to_string()
        };
        let ip = rejecter.parse_ip(&field, raw)?;
        if found.is_none() && family.matches(&ip) {
            found = Some(ip);
        }
    }
    Ok(found.map(ClusterIp::Ip))
}

/// The Service-wide fields every port shares.
struct SharedFields {
    external_ips: Vec<IpAddr>,
    load_balancer_ips: Vec<IpAddr>,
    source_ranges: Vec<IpNet>,
    affinity: Option<u32>,
    external_policy_local: bool,
    internal_policy_local: bool,
    health_check_node_port: Option<u16>,
}

impl SharedFields {
    fn convert(
        service: &Service,
        spec: &ServiceSpec,
        service_type: ServiceType,
        family: IpFamily,
        rejecter: &Rejecter,
    ) -> Result<Self, Rejection> {
        let external_ips = ips_of_family(spec.external_ips.as_deref(), "spec.externalIPs", family, rejecter)?;
        let load_balancer_ips = if service_type == ServiceType::LoadBalancer {
            load_balancer_ips(service, family, rejecter)?
        } else {
            Vec::new()
        };
        let source_ranges = source_ranges(spec, family, rejecter)?;
        let affinity = affinity(spec, rejecter)?;
        let externally_accessible = service_type != ServiceType::ClusterIp || !external_ips.is_empty();
        let external_local = traffic_policy_local(
            spec.external_traffic_policy.as_deref(),
            "spec.externalTrafficPolicy",
            rejecter,
        )?;
        let internal_policy_local = traffic_policy_local(
            spec.internal_traffic_policy.as_deref(),
            "spec.internalTrafficPolicy",
            rejecter,
        )?;
        let needs_health_check = service_type == ServiceType::LoadBalancer && external_local;
        let health_check_node_port = if needs_health_check {
            rejecter.optional_port("spec.healthCheckNodePort", spec.health_check_node_port)?
        } else {
            None
        };
        Ok(Self {
            external_ips,
            load_balancer_ips,
            source_ranges,
            affinity,
            external_policy_local: externally_accessible && external_local,
            internal_policy_local,
            health_check_node_port,
        })
    }
}

fn ips_of_family(
    raw: Option<&[String]>,
    field: &str,
    family: IpFamily,
    rejecter: &Rejecter,
) -> Result<Vec<IpAddr>, Rejection> {
    let mut out = Vec::new();
    for (i, value) in raw.unwrap_or_default().iter().enumerate() {
        let ip = rejecter.parse_ip(&format!("{field}[{i}]"), value)?;
        if family.matches(&ip) && !out.contains(&ip) {
            out.push(ip);
        }
    }
    Ok(out)
}

fn load_balancer_ips(
    service: &Service,
    family: IpFamily,
    rejecter: &Rejecter,
) -> Result<Vec<IpAddr>, Rejection> {
    let ingress = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default();
    let mut out = Vec::new();
    for (i, entry) in ingress.iter().enumerate() {
        // An ingress in Proxy mode is reached through the load balancer, not by its IP locally.
        if entry.ip_mode.as_deref() == Some("Proxy") {
            continue;
        }
        let Some(raw) = entry.ip.as_deref().filter(|ip| !ip.is_empty()) else {
            continue;
        };
        let ip = rejecter.parse_ip(&format!("status.loadBalancer.ingress[{i}].ip"), raw)?;
        if family.matches(&ip) && !out.contains(&ip) {
            out.push(ip);
        }
    }
    Ok(out)
}

fn source_ranges(spec: &ServiceSpec, family: IpFamily, rejecter: &Rejecter) -> Result<Vec<IpNet>, Rejection> {
    let mut out = Vec::new();
    for (i, raw) in spec
        .load_balancer_source_ranges
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let net: IpNet = raw.trim().parse().map_err(|_| {
            rejecter.reject(
                format!("spec.loadBalancerSourceRanges[{i}]"),
                RejectReason::InvalidCidr,
                format!("{raw:?} is not a CIDR"),
            )
        })?;
        if family.matches(&net.addr()) {
            out.push(net.trunc());
        }
    }
    Ok(out)
}

fn affinity(spec: &ServiceSpec, rejecter: &Rejecter) -> Result<Option<u32>, Rejection> {
    match spec.session_affinity.as_deref() {
        None | Some("None") => Ok(None),
        Some("ClientIP") => {
            let timeout = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            match timeout {
                None => Ok(Some(DEFAULT_AFFINITY_TIMEOUT_SECONDS)),
                Some(t) if (1..=MAX_AFFINITY_TIMEOUT_SECONDS).contains(&t) => Ok(Some(t as u32)),
                Some(t) => Err(rejecter.reject(
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                    RejectReason::InvalidValue,
                    format!("{t} is outside 1-{MAX_AFFINITY_TIMEOUT_SECONDS}"),
                )),
            }
        }
        Some(other) => Err(rejecter.reject(
            "spec.sessionAffinity",
            RejectReason::InvalidValue,
            format!("{other:?} is not one of None, ClientIP"),
        )),
    }
}

fn traffic_policy_local(value: Option<&str>, field: &str, rejecter: &Rejecter) -> Result<bool, Rejection> {
    match value {
        None | Some("Cluster") => Ok(false),
        Some("Local") => Ok(true),
        Some(other) => Err(rejecter.reject(
            field,
            RejectReason::InvalidValue,
            format!("{other:?} is not one of Cluster, Local"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(value: serde_json::Value) -> Service {
        serde_json::from_value(value).expect("test fixture is a Service")
    }

    fn ports(view: ServiceView) -> Vec<ServicePort> {
        match view {
            ServiceView::Proxied(p) => p,
            ServiceView::Skipped(r) => panic!("skipped: {r:?}"),
        }
    }

    #[test]
    fn cluster_ip_service_converts_each_port() {
        let svc = service(json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [
                {"name": "http", "port": 80, "targetPort": 8080},
                {"name": "dns", "port": 53, "protocol": "UDP"}
            ]}
        }));
        let ports = ports(service_view(&svc, IpFamily::V4).unwrap());
        assert_eq!(ports.len(), 2);
        assert_eq!(ports[0].name.to_string(), "shop/web:http");
        assert_eq!(ports[0].name.protocol, Protocol::Tcp);
        assert_eq!(ports[1].name.protocol, Protocol::Udp);
        assert_eq!(ports[0].cluster_ip, "10.96.0.10".parse::<IpAddr>().unwrap());
        assert!(!ports[0].externally_accessible());
    }

    #[test]
    fn nodeport_and_local_policy() {
        let svc = service(json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.10",
                     "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000,
                     "sessionAffinity": "ClientIP",
                     "ports": [{"port": 80, "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}, {"ip": "203.0.113.8", "ipMode": "Proxy"}]}}
        }));
        let p = &ports(service_view(&svc, IpFamily::V4).unwrap())[0];
        assert_eq!(p.node_port, Some(30080));
        assert!(p.external_policy_local);
        assert_eq!(p.health_check_node_port, Some(31000));
        assert_eq!(
            p.load_balancer_ips,
            vec!["203.0.113.7".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(p.session_affinity_seconds, Some(DEFAULT_AFFINITY_TIMEOUT_SECONDS));
        assert!(p.uses_local_endpoints());
        assert!(
            p.uses_cluster_endpoints(),
            "internal traffic still uses cluster endpoints"
        );
    }

    #[test]
    fn headless_external_name_and_other_family_are_skipped() {
        let headless = service(
            json!({"metadata": {"name": "h"}, "spec": {"clusterIP": "None", "ports": [{"port": 80}]}}),
        );
        assert_eq!(
            service_view(&headless, IpFamily::V4),
            Ok(ServiceView::Skipped(SkipReason::Headless))
        );
        let ext = service(
            json!({"metadata": {"name": "e"}, "spec": {"type": "ExternalName", "externalName": "x.example"}}),
        );
        assert_eq!(
            service_view(&ext, IpFamily::V4),
            Ok(ServiceView::Skipped(SkipReason::ExternalName))
        );
        let v6 = service(
            json!({"metadata": {"name": "v6"}, "spec": {"clusterIPs": ["fd00::1"], "ports": [{"port": 80}]}}),
        );
        assert_eq!(
            service_view(&v6, IpFamily::V4),
            Ok(ServiceView::Skipped(SkipReason::OtherFamily))
        );
    }

    #[test]
    fn dual_stack_picks_the_family() {
        let svc = service(
            json!({"metadata": {"name": "d"}, "spec": {"clusterIPs": ["fd00::1", "10.0.0.1"], "ports": [{"port": 80}]}}),
        );
        assert_eq!(
            ports(service_view(&svc, IpFamily::V4).unwrap())[0]
                .cluster_ip
                .to_string(),
            "10.0.0.1"
        );
        assert_eq!(
            ports(service_view(&svc, IpFamily::V6).unwrap())[0]
                .cluster_ip
                .to_string(),
            "fd00::1"
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
                json!({"metadata": {"name": "a"}, "spec": {"ports": [{"port": 80}]}}),
                "spec.clusterIP",
                RejectReason::MissingField,
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
                json!({"metadata": {"name": "a"}, "spec": {"clusterIP": "10.0.0.1", "externalIPs": ["x"], "ports": [{"port": 80}]}}),
                "spec.externalIPs[0]",
                RejectReason::InvalidIp,
            ),
            (
                json!({"metadata": {"name": "a"}, "spec": {"clusterIP": "10.0.0.1", "loadBalancerSourceRanges": ["10.0.0.0/33"], "ports": [{"port": 80}]}}),
                "spec.loadBalancerSourceRanges[0]",
                RejectReason::InvalidCidr,
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
}
