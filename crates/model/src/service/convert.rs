//! A Service as a whole and its ports: whatever decides which rules exist (identity,
//! type, cluster IP, each port's name, protocol and number) is checked here, and a bad
//! value rejects the whole Service, as upstream skips such a Service rather than write
//! half of its rules.

use std::collections::HashSet;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Service, ServiceSpec};

use super::fields::SharedFields;
use super::{ServicePort, ServiceType, ServiceView, SkipReason};
use crate::ident::{IpFamily, NamespacedName, ObjectKind, Protocol, ServicePortName};
use crate::ignored::Converted;
use crate::rejection::{RejectReason, Rejecter, Rejection, shown};
use crate::syntax::{dns1123_label, service_name};

/// Converts a Service into its ports for `family`, or says why it is skipped or rejected.
/// List entries dropped on the way come back in [`Converted::ignored`].
pub fn service_view(service: &Service, family: IpFamily) -> Result<Converted<ServiceView>, Rejection> {
    let id = object_id(&service.metadata.namespace, &service.metadata.name);
    let rejecter = Rejecter::new(ObjectKind::Service, id.to_string());
    if id.name.is_empty() {
        return Err(rejecter.reject("metadata.name", RejectReason::MissingField, "required"));
    }
    rejecter.name("metadata.name", &id.name, service_name)?;
    rejecter.name("metadata.namespace", &id.namespace, dns1123_label)?;
    let Some(spec) = &service.spec else {
        return Err(rejecter.reject("spec", RejectReason::MissingField, "required"));
    };
    let service_type = match spec.type_.as_deref() {
        None | Some("" | "ClusterIP") => ServiceType::ClusterIp,
        Some("NodePort") => ServiceType::NodePort,
        Some("LoadBalancer") => ServiceType::LoadBalancer,
        Some("ExternalName") => return Ok(Converted::clean(ServiceView::Skipped(SkipReason::ExternalName))),
        Some(other) => {
            return Err(rejecter.reject(
                "spec.type",
                RejectReason::InvalidValue,
                format!(
                    "{} is not one of ClusterIP, NodePort, LoadBalancer, ExternalName",
                    shown(other)
                ),
            ));
        }
    };
    let cluster_ip = match cluster_ip_for_family(spec, family, &rejecter)? {
        ClusterIp::Absent => return Ok(Converted::clean(ServiceView::Skipped(SkipReason::NoClusterIp))),
        ClusterIp::Headless => return Ok(Converted::clean(ServiceView::Skipped(SkipReason::Headless))),
        ClusterIp::OtherFamily => return Ok(Converted::clean(ServiceView::Skipped(SkipReason::OtherFamily))),
        ClusterIp::Ip(ip) => ip,
    };
    let mut ignored = Vec::new();
    let shared = SharedFields::convert(service, spec, service_type, family, &rejecter, &mut ignored)?;
    let ports = convert_ports(&id, spec, service_type, cluster_ip, &shared, &rejecter)?;
    Ok(Converted {
        view: ServiceView::Proxied(ports),
        ignored,
    })
}

fn convert_ports(
    id: &NamespacedName,
    spec: &ServiceSpec,
    service_type: ServiceType,
    cluster_ip: IpAddr,
    shared: &SharedFields,
    rejecter: &Rejecter,
) -> Result<Vec<ServicePort>, Rejection> {
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
        if name.is_empty() {
            if ports.len() > 1 {
                return Err(rejecter.reject(
                    format!("{field}.name"),
                    RejectReason::MissingField,
                    "required when a Service has more than one port",
                ));
            }
        } else {
            // Service port names are DNS-1123 labels (upstream's validateServicePort); only
            // container ports and named targetPorts must be IANA service names.
            rejecter.name(&format!("{field}.name"), name, dns1123_label)?;
        }
        if !seen_names.insert(name) {
            return Err(rejecter.reject(
                format!("{field}.name"),
                RejectReason::DuplicatePort,
                format!("port name {name:?} is used twice"),
            ));
        }
        // The API server defaults an empty protocol to TCP, as an absent one.
        let listed_protocol = port.protocol.as_deref().filter(|p| !p.is_empty());
        let protocol = Protocol::from_api(listed_protocol).ok_or_else(|| {
            rejecter.reject(
                format!("{field}.protocol"),
                RejectReason::InvalidProtocol,
                format!(
                    "{} is not one of TCP, UDP, SCTP",
                    shown(port.protocol.as_deref().unwrap_or(""))
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
    Ok(out)
}

pub(crate) fn object_id(namespace: &Option<String>, name: &Option<String>) -> NamespacedName {
    let namespace = namespace
        .as_deref()
        .filter(|ns| !ns.is_empty())
        .unwrap_or("default");
    NamespacedName::new(namespace, name.as_deref().unwrap_or(""))
}

enum ClusterIp {
    /// Neither `clusterIPs` nor `clusterIP` holds an address.
    Absent,
    Headless,
    /// Cluster IPs exist, none of the proxier's family.
    OtherFamily,
    Ip(IpAddr),
}

/// The cluster IP of `family`. `clusterIPs` wins over `clusterIP` when it lists any address
/// (the API server keeps `clusterIP == clusterIPs[0]`; a manifest may give either). Empty
/// entries count as absent; a malformed one rejects the Service, as its rules cannot be
/// written without it.
fn cluster_ip_for_family(
    spec: &ServiceSpec,
    family: IpFamily,
    rejecter: &Rejecter,
) -> Result<ClusterIp, Rejection> {
    let mut listed: Vec<(String, &str)> = spec
        .cluster_ips
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
        .filter(|(_, ip)| !ip.is_empty())
        .map(|(i, ip)| (format!("spec.clusterIPs[{i}]"), ip.as_str()))
        .collect();
    if listed.is_empty()
        && let Some(ip) = spec.cluster_ip.as_deref().filter(|ip| !ip.is_empty())
    {
        listed.push(("spec.clusterIP".to_string(), ip));
    }
    let Some((_, first)) = listed.first() else {
        return Ok(ClusterIp::Absent);
    };
    if *first == "None" || spec.cluster_ip.as_deref() == Some("None") {
        return Ok(ClusterIp::Headless);
    }
    let mut found = None;
    for (field, raw) in &listed {
        let ip = rejecter.parse_ip(field, raw)?;
        if found.is_none() && family.matches(&ip) {
            found = Some(ip);
        }
    }
    Ok(found.map_or(ClusterIp::OtherFamily, ClusterIp::Ip))
}
