//! The Service-wide fields every port shares, each read as upstream reads it. Two kinds
//! of field, two kinds of failure: affinity and the traffic policies change what every
//! rule does, so a bad value rejects the Service; the address lists (external IPs,
//! load-balancer ingress, source ranges) are lists of independent entries, so a bad entry
//! is dropped and reported as an [`IgnoredValue`], and the rest still get their rules.

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Service, ServiceSpec};

use super::ServiceType;
use crate::ident::IpFamily;
use crate::ignored::IgnoredValue;
use crate::rejection::{RejectReason, Rejecter, Rejection, shown};
use crate::syntax::{endpoint_ip, parse_cidr_sloppy, parse_ip_sloppy};

/// Upstream's default `sessionAffinityConfig.clientIP.timeoutSeconds` (3 hours).
pub const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10800;
/// The API server's upper bound for the affinity timeout (1 day).
const MAX_AFFINITY_TIMEOUT_SECONDS: i32 = 86400;

/// The Service-wide fields every port shares.
pub(super) struct SharedFields {
    pub(super) external_ips: Vec<IpAddr>,
    pub(super) load_balancer_ips: Vec<IpAddr>,
    pub(super) source_ranges: Vec<IpNet>,
    pub(super) affinity: Option<u32>,
    pub(super) external_policy_local: bool,
    pub(super) internal_policy_local: bool,
    pub(super) health_check_node_port: Option<u16>,
}

impl SharedFields {
    pub(super) fn convert(
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

pub(super) const EXTERNAL_IPS: &str = "spec.externalIPs";
pub(super) const INGRESS_IP: &str = "status.loadBalancer.ingress.ip";
pub(super) const INGRESS_IP_MODE: &str = "status.loadBalancer.ingress.ipMode";
pub(super) const SOURCE_RANGES: &str = "spec.loadBalancerSourceRanges";

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
