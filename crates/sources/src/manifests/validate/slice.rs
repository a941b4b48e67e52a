//! The discovery API's EndpointSlice rules, with its limits: at most 1,000 endpoints of 1-100
//! addresses each, at most 20,000 ports (the API server's current limits). The text of each
//! address is not checked here: kpr-model drops a malformed address, as upstream's proxy does.

use std::collections::HashSet;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointHints, EndpointSlice};
use kpr_model::syntax;
use kpr_model::{Protocol, RejectReason, Rejection, SERVICE_NAME_LABEL};

use super::Check;

/// The discovery API's limits (`maxEndpoints`, `maxAddresses`, `maxPorts`, `maxZoneHints`).
pub(crate) const MAX_ENDPOINTS: usize = 1000;
const MAX_ADDRESSES: usize = 100;
const MAX_PORTS: usize = 20_000;
const MAX_HINTS: usize = 8;

pub(super) fn check(check: &Check<'_>, slice: &EndpointSlice) -> Result<(), Rejection> {
    check.name("metadata.name", syntax::dns1123_subdomain)?;
    check.namespace()?;
    service_name_label(check, slice)?;
    match slice.address_type.as_str() {
        "IPv4" | "IPv6" | "FQDN" => {}
        "" => return Err(check.fail("addressType", RejectReason::MissingField, "required")),
        other => {
            return Err(check.fail(
                "addressType",
                RejectReason::InvalidValue,
                format!("{other:?} is not one of IPv4, IPv6, FQDN"),
            ));
        }
    }
    let endpoints = slice.endpoints.as_deref().unwrap_or_default();
    check.at_most("endpoints", endpoints.len(), MAX_ENDPOINTS, "endpoints")?;
    for (i, endpoint) in endpoints.iter().enumerate() {
        self::endpoint(check, &format!("endpoints[{i}]"), endpoint)?;
    }
    ports(check, slice)
}

/// The Service a slice belongs to: a label value naming a Service (a DNS-1035 label). Its
/// absence is kpr-model's to reject: the API itself does not require the label.
fn service_name_label(check: &Check<'_>, slice: &EndpointSlice) -> Result<(), Rejection> {
    let labels = slice.metadata.labels.as_ref();
    let Some(service) = labels.and_then(|labels| labels.get(SERVICE_NAME_LABEL)) else {
        return Ok(());
    };
    let field = format!("metadata.labels[{SERVICE_NAME_LABEL:?}]");
    check.syntax(field.as_str(), service, syntax::label_value)?;
    if service.is_empty() {
        return Ok(());
    }
    check.syntax(field, service, syntax::service_name)
}

fn endpoint(check: &Check<'_>, field: &str, endpoint: &Endpoint) -> Result<(), Rejection> {
    let addresses = format!("{field}.addresses");
    if endpoint.addresses.is_empty() {
        return Err(check.fail(
            addresses,
            RejectReason::MissingField,
            "needs at least one address",
        ));
    }
    check.at_most(&addresses, endpoint.addresses.len(), MAX_ADDRESSES, "addresses")?;
    if let Some(node) = &endpoint.node_name {
        check.syntax(format!("{field}.nodeName"), node, syntax::dns1123_subdomain)?;
    }
    if let Some(hostname) = &endpoint.hostname {
        check.syntax(format!("{field}.hostname"), hostname, syntax::dns1123_label)?;
    }
    if let Some(hints) = &endpoint.hints {
        self::hints(check, &format!("{field}.hints"), hints)?;
    }
    Ok(())
}

/// Topology hints: at most 8 zones (label values) and 8 nodes (node names), none twice.
fn hints(check: &Check<'_>, field: &str, hints: &EndpointHints) -> Result<(), Rejection> {
    let zones = hints.for_zones.as_deref().unwrap_or_default();
    let zone_names: Vec<&str> = zones.iter().map(|zone| zone.name.as_str()).collect();
    unique_names(
        check,
        &format!("{field}.forZones"),
        &zone_names,
        syntax::label_value,
    )?;
    let nodes = hints.for_nodes.as_deref().unwrap_or_default();
    let node_names: Vec<&str> = nodes.iter().map(|node| node.name.as_str()).collect();
    unique_names(
        check,
        &format!("{field}.forNodes"),
        &node_names,
        syntax::dns1123_subdomain,
    )
}

fn unique_names(
    check: &Check<'_>,
    field: &str,
    names: &[&str],
    rule: fn(&str) -> Result<(), String>,
) -> Result<(), Rejection> {
    check.at_most(field, names.len(), MAX_HINTS, "hints")?;
    let mut seen = HashSet::new();
    for (i, name) in names.iter().enumerate() {
        let field = format!("{field}[{i}].name");
        check.syntax(field.as_str(), name, rule)?;
        if !seen.insert(*name) {
            return Err(check.fail(
                field,
                RejectReason::InvalidValue,
                format!("{name:?} is listed twice"),
            ));
        }
    }
    Ok(())
}

/// Port names are DNS-1123 labels, unique (two unnamed ports are a duplicate too).
fn ports(check: &Check<'_>, slice: &EndpointSlice) -> Result<(), Rejection> {
    let ports = slice.ports.as_deref().unwrap_or_default();
    check.at_most("ports", ports.len(), MAX_PORTS, "ports")?;
    let mut names = HashSet::new();
    for (i, port) in ports.iter().enumerate() {
        let field = format!("ports[{i}]");
        let name = port.name.as_deref().unwrap_or("");
        if !name.is_empty() {
            check.syntax(format!("{field}.name"), name, syntax::dns1123_label)?;
        }
        if !names.insert(name) {
            return Err(check.fail(
                format!("{field}.name"),
                RejectReason::DuplicatePort,
                format!("port name {name:?} is used twice"),
            ));
        }
        if Protocol::from_api(port.protocol.as_deref()).is_none() {
            return Err(check.fail(
                format!("{field}.protocol"),
                RejectReason::InvalidProtocol,
                format!(
                    "{:?} is not one of TCP, UDP, SCTP",
                    port.protocol.as_deref().unwrap_or("")
                ),
            ));
        }
        if let Some(number) = port.port {
            check.port(format!("{field}.port"), number)?;
        }
    }
    Ok(())
}
