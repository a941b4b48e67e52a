//! `ValidateService`'s rules that matter to a proxy: identity, ports, node ports inside the
//! configured range, affinity, traffic policies and the dual-stack fields.
//!
//! Fields the API server defaults (`type`, `protocol`, `sessionAffinity`, `targetPort`,
//! the traffic policies) may be absent, as in a hand-written manifest; present, they must hold
//! a value the API server accepts.

use std::collections::HashSet;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kpr_model::syntax::{self, parse_ip_sloppy};
use kpr_model::{IpFamily, Protocol, RejectReason, Rejection};

use super::{Check, ValidationRules};

/// The API server's bounds for `sessionAffinityConfig.clientIP.timeoutSeconds`.
const AFFINITY_TIMEOUT_SECONDS: std::ops::RangeInclusive<i32> = 1..=86400;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Type {
    ClusterIp,
    NodePort,
    LoadBalancer,
    ExternalName,
}

impl Type {
    fn has_node_ports(self) -> bool {
        matches!(self, Self::NodePort | Self::LoadBalancer)
    }
}

pub(super) fn check(check: &Check<'_>, service: &Service, rules: &ValidationRules) -> Result<(), Rejection> {
    check.name("metadata.name", syntax::service_name)?;
    check.namespace()?;
    let Some(spec) = &service.spec else {
        return Err(check.fail("spec", RejectReason::MissingField, "required"));
    };
    let service_type = service_type(check, spec)?;
    let headless = if service_type == Type::ExternalName {
        external_name(check, spec)?;
        false
    } else {
        cluster_ips(check, spec, service_type)?
    };
    ports(check, spec, service_type, headless, rules)?;
    let external_local = traffic_policy(
        check,
        "spec.externalTrafficPolicy",
        spec.external_traffic_policy.as_deref(),
    )?;
    // A pointer in the API: only an absent value is defaulted, an empty one is refused.
    if spec.internal_traffic_policy.as_deref() == Some("") {
        return Err(check.fail(
            "spec.internalTrafficPolicy",
            RejectReason::InvalidValue,
            "\"\" is not one of Cluster, Local",
        ));
    }
    traffic_policy(
        check,
        "spec.internalTrafficPolicy",
        spec.internal_traffic_policy.as_deref(),
    )?;
    health_check_node_port(
        check,
        spec,
        service_type == Type::LoadBalancer && external_local,
        rules,
    )?;
    session_affinity(check, spec)
}

fn service_type(check: &Check<'_>, spec: &ServiceSpec) -> Result<Type, Rejection> {
    match spec.type_.as_deref() {
        None | Some("" | "ClusterIP") => Ok(Type::ClusterIp),
        Some("NodePort") => Ok(Type::NodePort),
        Some("LoadBalancer") => Ok(Type::LoadBalancer),
        Some("ExternalName") => Ok(Type::ExternalName),
        Some(other) => Err(check.fail(
            "spec.type",
            RejectReason::InvalidValue,
            format!("{other:?} is not one of ClusterIP, NodePort, LoadBalancer, ExternalName"),
        )),
    }
}

/// An ExternalName Service is a DNS alias: no cluster IPs, and a DNS name to point at.
fn external_name(check: &Check<'_>, spec: &ServiceSpec) -> Result<(), Rejection> {
    let forbidden = [
        (
            "spec.clusterIP",
            spec.cluster_ip.as_deref().is_some_and(|ip| !ip.is_empty()),
        ),
        (
            "spec.clusterIPs",
            spec.cluster_ips.as_ref().is_some_and(|ips| !ips.is_empty()),
        ),
        (
            "spec.ipFamilies",
            spec.ip_families.as_ref().is_some_and(|f| !f.is_empty()),
        ),
        ("spec.ipFamilyPolicy", spec.ip_family_policy.is_some()),
    ];
    if let Some((field, _)) = forbidden.iter().find(|(_, set)| *set) {
        return Err(check.fail(
            *field,
            RejectReason::InvalidValue,
            "must not be set for an ExternalName Service",
        ));
    }
    let name = spec.external_name.as_deref().unwrap_or("");
    if name.is_empty() {
        return Err(check.fail(
            "spec.externalName",
            RejectReason::MissingField,
            "required for an ExternalName Service",
        ));
    }
    // The API server accepts a fully qualified name with its trailing dot.
    check.syntax(
        "spec.externalName",
        name.strip_suffix('.').unwrap_or(name),
        syntax::dns1123_subdomain,
    )
}

/// `clusterIP`, `clusterIPs`, `ipFamilies` and `ipFamilyPolicy` agree with each other, as
/// the API server's dual-stack validation and allocator require. Returns whether the
/// Service is headless.
fn cluster_ips(check: &Check<'_>, spec: &ServiceSpec, service_type: Type) -> Result<bool, Rejection> {
    let ip = spec.cluster_ip.as_deref().unwrap_or("");
    let ips = spec.cluster_ips.as_deref().unwrap_or_default();
    match ips.first() {
        Some(first) if !ip.is_empty() && first != ip => {
            return Err(check.fail(
                "spec.clusterIPs[0]",
                RejectReason::InvalidValue,
                format!("{first:?} must match clusterIP {ip:?}"),
            ));
        }
        Some(_) if ip.is_empty() => {
            return Err(check.fail(
                "spec.clusterIPs",
                RejectReason::InvalidValue,
                "must be empty when clusterIP is not set",
            ));
        }
        _ => {}
    }
    let listed: Vec<(String, &str)> = if ips.is_empty() {
        (!ip.is_empty())
            .then(|| ("spec.clusterIP".to_owned(), ip))
            .into_iter()
            .collect()
    } else {
        ips.iter()
            .enumerate()
            .map(|(i, ip)| (format!("spec.clusterIPs[{i}]"), ip.as_str()))
            .collect()
    };
    if listed.len() > 2 {
        return Err(check.fail(
            "spec.clusterIPs",
            RejectReason::InvalidValue,
            format!("has {} values; at most 2 (one per IP family)", listed.len()),
        ));
    }
    let headless = listed.first().is_some_and(|(_, ip)| *ip == "None");
    let parsed = parse_cluster_ips(check, &listed, headless)?;
    if headless && service_type.has_node_ports() {
        return Err(check.fail(
            "spec.clusterIP",
            RejectReason::InvalidValue,
            "may not be \"None\" for NodePort and LoadBalancer Services",
        ));
    }
    let families = ip_families(check, spec)?;
    if !families.is_empty() {
        for ((field, raw), (ip, family)) in listed.iter().zip(parsed.iter().zip(&families)) {
            if !family.matches(ip) {
                return Err(check.fail(
                    field.as_str(),
                    RejectReason::WrongIpFamily,
                    format!("{raw} is not an {} address, as ipFamilies says", family.label()),
                ));
            }
        }
    }
    ip_family_policy(check, spec, &families, &parsed, headless)?;
    Ok(headless)
}

/// Parses the listed cluster IPs ("None" alone, or one or two IPs of different families).
fn parse_cluster_ips(
    check: &Check<'_>,
    listed: &[(String, &str)],
    headless: bool,
) -> Result<Vec<IpAddr>, Rejection> {
    if headless {
        if listed.len() > 1 {
            return Err(check.fail(
                "spec.clusterIPs",
                RejectReason::InvalidValue,
                "\"None\" must be the first and only value",
            ));
        }
        return Ok(Vec::new());
    }
    let mut parsed = Vec::with_capacity(listed.len());
    for (field, raw) in listed {
        if *raw == "None" {
            return Err(check.fail(
                field.as_str(),
                RejectReason::InvalidValue,
                "\"None\" must be the first and only value",
            ));
        }
        let ip = parse_ip_sloppy(raw).ok_or_else(|| {
            check.fail(
                field.as_str(),
                RejectReason::InvalidIp,
                format!("{raw:?} is not an IP address"),
            )
        })?;
        parsed.push(ip);
    }
    if let [a, b] = parsed.as_slice()
        && IpFamily::of(a) == IpFamily::of(b)
    {
        return Err(check.fail(
            "spec.clusterIPs",
            RejectReason::WrongIpFamily,
            "may hold at most one IP of each family",
        ));
    }
    Ok(parsed)
}

/// `ipFamilies`: IPv4 and/or IPv6, each at most once.
fn ip_families(check: &Check<'_>, spec: &ServiceSpec) -> Result<Vec<IpFamily>, Rejection> {
    let listed = spec.ip_families.as_deref().unwrap_or_default();
    check.at_most("spec.ipFamilies", listed.len(), 2, "IP families")?;
    let mut families = Vec::with_capacity(listed.len());
    for (i, name) in listed.iter().enumerate() {
        let family = match name.as_str() {
            "IPv4" => IpFamily::V4,
            "IPv6" => IpFamily::V6,
            other => {
                return Err(check.fail(
                    format!("spec.ipFamilies[{i}]"),
                    RejectReason::InvalidValue,
                    format!("{other:?} is not one of IPv4, IPv6"),
                ));
            }
        };
        if families.contains(&family) {
            return Err(check.fail(
                format!("spec.ipFamilies[{i}]"),
                RejectReason::InvalidValue,
                format!("{name} is listed twice"),
            ));
        }
        families.push(family);
    }
    Ok(families)
}

/// SingleStack: one family and at most one cluster IP. RequireDualStack: two families,
/// from `ipFamilies` or else from the cluster IPs (a headless Service without `ipFamilies`
/// has nothing to check).
fn ip_family_policy(
    check: &Check<'_>,
    spec: &ServiceSpec,
    families: &[IpFamily],
    ips: &[IpAddr],
    headless: bool,
) -> Result<(), Rejection> {
    let field = "spec.ipFamilyPolicy";
    let count = if families.is_empty() {
        ips.len()
    } else {
        families.len()
    };
    match spec.ip_family_policy.as_deref() {
        None | Some("PreferDualStack") => Ok(()),
        Some("SingleStack") if count <= 1 && ips.len() <= 1 => Ok(()),
        Some("SingleStack") => Err(check.fail(
            field,
            RejectReason::InvalidValue,
            "SingleStack allows one IP family and one cluster IP, but the Service has two",
        )),
        Some("RequireDualStack") if count == 2 || (headless && families.is_empty()) => Ok(()),
        Some("RequireDualStack") => Err(check.fail(
            field,
            RejectReason::InvalidValue,
            format!("RequireDualStack needs two IP families (in ipFamilies or clusterIPs); the Service has {count}"),
        )),
        Some(other) => Err(check.fail(
            field,
            RejectReason::InvalidValue,
            format!("{other:?} is not one of SingleStack, PreferDualStack, RequireDualStack"),
        )),
    }
}

/// Every port: name, number, protocol, targetPort, nodePort; names and (protocol, port)
/// pairs unique, as are (protocol, nodePort) pairs.
fn ports(
    check: &Check<'_>,
    spec: &ServiceSpec,
    service_type: Type,
    headless: bool,
    rules: &ValidationRules,
) -> Result<(), Rejection> {
    let ports = spec.ports.as_deref().unwrap_or_default();
    if ports.is_empty() && !headless && service_type != Type::ExternalName {
        return Err(check.fail(
            "spec.ports",
            RejectReason::MissingField,
            "required: at least one port",
        ));
    }
    let mut names = HashSet::new();
    let mut numbers = HashSet::new();
    let mut node_ports = HashSet::new();
    for (i, port) in ports.iter().enumerate() {
        let field = format!("spec.ports[{i}]");
        port_name(check, &field, port, ports.len() > 1, &mut names)?;
        let number = check.port(format!("{field}.port"), port.port)?;
        let protocol = protocol(check, &field, port.protocol.as_deref())?;
        if !numbers.insert((protocol, number)) {
            return Err(check.fail(
                format!("{field}.port"),
                RejectReason::DuplicatePort,
                format!("{number}/{protocol} is listed twice"),
            ));
        }
        target_port(check, &field, port.target_port.as_ref())?;
        if let Some(node_port) = node_port(check, &field, port.node_port, service_type, rules)?
            && !node_ports.insert((protocol, node_port))
        {
            return Err(check.fail(
                format!("{field}.nodePort"),
                RejectReason::DuplicatePort,
                format!("{node_port}/{protocol} is listed twice"),
            ));
        }
    }
    Ok(())
}

/// A DNS-1123 label, required when the Service has more than one port, unique.
fn port_name<'s>(
    check: &Check<'_>,
    field: &str,
    port: &'s ServicePort,
    required: bool,
    seen: &mut HashSet<&'s str>,
) -> Result<(), Rejection> {
    let field = format!("{field}.name");
    let name = port.name.as_deref().unwrap_or("");
    if name.is_empty() {
        if required {
            return Err(check.fail(
                field,
                RejectReason::MissingField,
                "required when a Service has more than one port",
            ));
        }
        return Ok(());
    }
    check.syntax(field.as_str(), name, syntax::dns1123_label)?;
    if !seen.insert(name) {
        return Err(check.fail(
            field,
            RejectReason::DuplicatePort,
            format!("port name {name:?} is used twice"),
        ));
    }
    Ok(())
}

fn protocol(check: &Check<'_>, field: &str, value: Option<&str>) -> Result<Protocol, Rejection> {
    // Absent or empty means TCP, as the API server defaults a Service port's protocol.
    Protocol::from_api(value.filter(|v| !v.is_empty())).ok_or_else(|| {
        check.fail(
            format!("{field}.protocol"),
            RejectReason::InvalidProtocol,
            format!("{:?} is not one of TCP, UDP, SCTP", value.unwrap_or("")),
        )
    })
}

/// A port number or an IANA service name (a named container port). 0 and "" mean "same as
/// port", as the API server defaults them.
fn target_port(check: &Check<'_>, field: &str, value: Option<&IntOrString>) -> Result<(), Rejection> {
    let field = format!("{field}.targetPort");
    match value {
        None | Some(IntOrString::Int(0)) => Ok(()),
        Some(IntOrString::Int(number)) => check.port(field, *number).map(|_| ()),
        Some(IntOrString::String(name)) if name.is_empty() => Ok(()),
        Some(IntOrString::String(name)) => check.syntax(field, name, syntax::iana_svc_name),
    }
}

/// Only NodePort and LoadBalancer Services have node ports, inside the configured range; 0 or
/// absent means none (the API server would allocate one; manifests have no allocator).
fn node_port(
    check: &Check<'_>,
    field: &str,
    value: Option<i32>,
    service_type: Type,
    rules: &ValidationRules,
) -> Result<Option<u16>, Rejection> {
    let field = format!("{field}.nodePort");
    let value = match value {
        None | Some(0) => return Ok(None),
        Some(value) => value,
    };
    if !service_type.has_node_ports() {
        return Err(check.fail(
            field,
            RejectReason::InvalidValue,
            "may only be set when type is NodePort or LoadBalancer",
        ));
    }
    in_node_port_range(check, field, value, rules).map(Some)
}

fn in_node_port_range(
    check: &Check<'_>,
    field: String,
    value: i32,
    rules: &ValidationRules,
) -> Result<u16, Rejection> {
    let range = &rules.node_port_range;
    u16::try_from(value)
        .ok()
        .filter(|port| range.contains(port))
        .ok_or_else(|| {
            check.fail(
                field,
                RejectReason::InvalidPort,
                format!(
                    "{value} is outside the node port range {}-{} (--service-node-port-range)",
                    range.start(),
                    range.end()
                ),
            )
        })
}

/// Only a LoadBalancer Service with `externalTrafficPolicy: Local` has one; inside the
/// node-port range, and not one of the Service's own nodePorts.
fn health_check_node_port(
    check: &Check<'_>,
    spec: &ServiceSpec,
    needs_health_check: bool,
    rules: &ValidationRules,
) -> Result<(), Rejection> {
    let field = "spec.healthCheckNodePort";
    let value = match spec.health_check_node_port {
        None | Some(0) => return Ok(()),
        Some(value) => value,
    };
    if !needs_health_check {
        return Err(check.fail(
            field,
            RejectReason::InvalidValue,
            "may only be set on a LoadBalancer Service with externalTrafficPolicy: Local",
        ));
    }
    let port = in_node_port_range(check, field.to_owned(), value, rules)?;
    let ports = spec.ports.as_deref().unwrap_or_default();
    if let Some(i) = ports.iter().position(|p| p.node_port == Some(i32::from(port))) {
        return Err(check.fail(
            field,
            RejectReason::Conflict,
            format!("{port} is already this Service's spec.ports[{i}].nodePort"),
        ));
    }
    Ok(())
}

/// `Cluster` or `Local`; true for `Local`.
fn traffic_policy(check: &Check<'_>, field: &str, value: Option<&str>) -> Result<bool, Rejection> {
    match value {
        None | Some("" | "Cluster") => Ok(false),
        Some("Local") => Ok(true),
        Some(other) => Err(check.fail(
            field,
            RejectReason::InvalidValue,
            format!("{other:?} is not one of Cluster, Local"),
        )),
    }
}

fn session_affinity(check: &Check<'_>, spec: &ServiceSpec) -> Result<(), Rejection> {
    match spec.session_affinity.as_deref() {
        None | Some("" | "None") => Ok(()),
        Some("ClientIP") => {
            let timeout = spec
                .session_affinity_config
                .as_ref()
                .and_then(|config| config.client_ip.as_ref())
                .and_then(|client_ip| client_ip.timeout_seconds);
            match timeout {
                Some(seconds) if !AFFINITY_TIMEOUT_SECONDS.contains(&seconds) => Err(check.fail(
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                    RejectReason::InvalidValue,
                    format!(
                        "{seconds} is outside {}-{}",
                        AFFINITY_TIMEOUT_SECONDS.start(),
                        AFFINITY_TIMEOUT_SECONDS.end()
                    ),
                )),
                _ => Ok(()),
            }
        }
        Some(other) => Err(check.fail(
            "spec.sessionAffinity",
            RejectReason::InvalidValue,
            format!("{other:?} is not one of None, ClientIP"),
        )),
    }
}
