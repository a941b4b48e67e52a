//! A Service, seen as the list of its ports for one IP family.
//!
//! Mirrors upstream's `newBaseServiceInfo`: the cluster IP of the proxier's family, the
//! external IPs / load-balancer IPs / source ranges of that family, affinity, and the two
//! traffic policies reduced to booleans. Addresses are read as upstream reads them
//! (`ParseIPSloppy`: `172.30.0.041` is 172.30.0.41).
//!
//! What decides which rules exist (identity, cluster IP, ports, policies, affinity) must be
//! right, or the whole Service is rejected, as upstream skips such a Service. A malformed
//! entry of one of the address lists (`spec.externalIPs`, `status.loadBalancer.ingress`,
//! `spec.loadBalancerSourceRanges`) only drops that entry, as upstream does, and is
//! reported as an [`IgnoredValue`] next to the view. So is an external IP the API server
//! refuses (loopback, link-local, unspecified: see [`crate::syntax::endpoint_ip`]).
//!
//! An empty string in a field the API server defaults (`type`, `sessionAffinity`,
//! `externalTrafficPolicy`, a port's `protocol`) means that default, as the API server reads
//! it, not an invalid value.
//!
//! Names are checked with the API server's rules even for API objects: they end up in rule
//! comments and in the strings hashed into chain names, where `a/b` + `c` and `a` + `b/c`
//! would collide.

use std::collections::HashSet;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Service, ServiceSpec};

use crate::ident::{IpFamily, NamespacedName, ObjectKind, Protocol, ServicePortName};
use crate::ignored::{Converted, IgnoredValue};
use crate::rejection::{RejectReason, Rejecter, Rejection, shown};
use crate::syntax::{dns1035_label, dns1123_label, endpoint_ip, parse_cidr_sloppy, parse_ip_sloppy};

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
    /// `status.loadBalancer.ingress[].ip` of any Service type (as upstream), except
    /// ingresses whose `ipMode` is not `VIP`.
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

    /// Whether some traffic to this port is spread over endpoints on every node: internal
    /// traffic with policy Cluster, and any externally reachable port, because even with
    /// `externalTrafficPolicy: Local` traffic from pods and from the node itself to an
    /// external address is short-circuited to the cluster-wide endpoints (upstream's
    /// `UsesClusterEndpoints`).
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
    /// No cluster IP at all (empty or absent): upstream's `ShouldSkipService` skips it too.
    NoClusterIp,
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
/// List entries dropped on the way come back in [`Converted::ignored`].
pub fn service_view(service: &Service, family: IpFamily) -> Result<Converted<ServiceView>, Rejection> {
    let id = object_id(&service.metadata.namespace, &service.metadata.name);
    let rejecter = Rejecter::new(ObjectKind::Service, id.to_string());
    if id.name.is_empty() {
        return Err(rejecter.reject("metadata.name", RejectReason::MissingField, "required"));
    }
    rejecter.name("metadata.name", &id.name, dns1035_label)?;
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
        ignored: &mut Vec<IgnoredValue>,
    ) -> Result<Self, Rejection> {
        let affinity = affinity(spec, rejecter)?;
        let external_local = traffic_policy_local(
            spec.external_traffic_policy.as_deref(),
            "spec.externalTrafficPolicy",
            true,
            rejecter,
        )?;
        let internal_policy_local = traffic_policy_local(
            spec.internal_traffic_policy.as_deref(),
            "spec.internalTrafficPolicy",
            false,
            rejecter,
        )?;
        let needs_health_check = service_type == ServiceType::LoadBalancer && external_local;
        let health_check_node_port = if needs_health_check {
            rejecter.optional_port("spec.healthCheckNodePort", spec.health_check_node_port)?
        } else {
            None
        };
        // Upstream's `ExternalPolicyLocal` asks whether the Service *type* is externally
        // accessible (or a ClusterIP Service lists any external IP, valid or not); load-balancer
        // ingress IPs on a ClusterIP Service do not make its external policy Local.
        let listed_external_ips = !spec.external_ips.as_deref().unwrap_or_default().is_empty();
        let type_externally_accessible = service_type != ServiceType::ClusterIp || listed_external_ips;
        Ok(Self {
            external_ips: external_ips(spec, family, rejecter, ignored),
            load_balancer_ips: load_balancer_ips(service, family, rejecter, ignored),
            source_ranges: source_ranges(spec, family, rejecter, ignored),
            affinity,
            external_policy_local: type_externally_accessible && external_local,
            internal_policy_local,
            health_check_node_port,
        })
    }
}

const EXTERNAL_IPS: &str = "spec.externalIPs";
const INGRESS_IP: &str = "status.loadBalancer.ingress.ip";
const INGRESS_IP_MODE: &str = "status.loadBalancer.ingress.ipMode";
const SOURCE_RANGES: &str = "spec.loadBalancerSourceRanges";

/// `spec.externalIPs` of `family`, duplicates removed. Blank entries are skipped silently, as
/// upstream does (they are common and harmless); malformed ones are dropped and reported.
fn external_ips(
    spec: &ServiceSpec,
    family: IpFamily,
    rejecter: &Rejecter,
    ignored: &mut Vec<IgnoredValue>,
) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for (i, raw) in spec
        .external_ips
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        if raw.trim().is_empty() {
            continue;
        }
        match parse_ip_sloppy(raw) {
            Some(ip) if !family.matches(&ip) || out.contains(&ip) => {}
            // The API server refuses these as external IPs (`ValidateEndpointIP`): traffic
            // to the node's loopback or link-local addresses must not be captured.
            Some(ip) => match endpoint_ip(&ip) {
                Ok(()) => out.push(ip),
                Err(why) => ignored.push(rejecter.ignore(
                    EXTERNAL_IPS,
                    format!("{EXTERNAL_IPS}[{i}]"),
                    RejectReason::InvalidIp,
                    why,
                )),
            },
            None => ignored.push(rejecter.ignore(
                EXTERNAL_IPS,
                format!("{EXTERNAL_IPS}[{i}]"),
                RejectReason::InvalidIp,
                format!("{} is not an IP address", shown(raw)),
            )),
        }
    }
    out
}

/// The VIP-mode ingress IPs of `family`, whatever the Service type (upstream uses them for
/// any Service that carries them). Hostname-only ingresses have no IP and are skipped;
/// `ipMode: Proxy` ingresses are reached through the load balancer, not by their IP locally.
fn load_balancer_ips(
    service: &Service,
    family: IpFamily,
    rejecter: &Rejecter,
    ignored: &mut Vec<IgnoredValue>,
) -> Vec<IpAddr> {
    let ingress = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default();
    let mut out = Vec::new();
    for (i, entry) in ingress.iter().enumerate() {
        let Some(raw) = entry.ip.as_deref().filter(|ip| !ip.is_empty()) else {
            continue;
        };
        match entry.ip_mode.as_deref() {
            None | Some("VIP") => {}
            Some("Proxy") => continue,
            Some(other) => {
                ignored.push(rejecter.ignore(
                    INGRESS_IP_MODE,
                    format!("status.loadBalancer.ingress[{i}].ipMode"),
                    RejectReason::InvalidValue,
                    format!("{} is not one of VIP, Proxy", shown(other)),
                ));
                continue;
            }
        }
        match parse_ip_sloppy(raw) {
            Some(ip) if family.matches(&ip) && !out.contains(&ip) => out.push(ip),
            Some(_) => {}
            None => ignored.push(rejecter.ignore(
                INGRESS_IP,
                format!("status.loadBalancer.ingress[{i}].ip"),
                RejectReason::InvalidIp,
                format!("{} is not an IP address", shown(raw)),
            )),
        }
    }
    out
}

/// `spec.loadBalancerSourceRanges` of `family`. Surrounding blanks are trimmed (the API
/// server once let them through, and upstream trims them); blank entries are skipped.
fn source_ranges(
    spec: &ServiceSpec,
    family: IpFamily,
    rejecter: &Rejecter,
    ignored: &mut Vec<IgnoredValue>,
) -> Vec<IpNet> {
    let mut out = Vec::new();
    let listed = spec.load_balancer_source_ranges.as_deref().unwrap_or_default();
    for (i, raw) in listed.iter().enumerate() {
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            continue;
        }
        match parse_cidr_sloppy(trimmed) {
            Some(net) if family.matches(&net.addr()) => out.push(net),
            Some(_) => {}
            None => ignored.push(rejecter.ignore(
                SOURCE_RANGES,
                format!("{SOURCE_RANGES}[{i}]"),
                RejectReason::InvalidCidr,
                format!("{} is not a CIDR", shown(raw)),
            )),
        }
    }
    out
}

fn affinity(spec: &ServiceSpec, rejecter: &Rejecter) -> Result<Option<u32>, Rejection> {
    match spec.session_affinity.as_deref() {
        None | Some("" | "None") => Ok(None),
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
            format!("{} is not one of None, ClientIP", shown(other)),
        )),
    }
}

/// `Local` or not. An empty external policy is the API server's "unset" (it defaults it to
/// Cluster), while an empty internal one is refused there; callers pass `allow_empty`.
fn traffic_policy_local(
    value: Option<&str>,
    field: &str,
    allow_empty: bool,
    rejecter: &Rejecter,
) -> Result<bool, Rejection> {
    match value {
        None | Some("Cluster") => Ok(false),
        Some("") if allow_empty => Ok(false),
        Some("Local") => Ok(true),
        Some(other) => Err(rejecter.reject(
            field,
            RejectReason::InvalidValue,
            format!("{} is not one of Cluster, Local", shown(other)),
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
            (json!({"name": "1web"}), "metadata.name"),
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
}
