//! The API server's rules, applied to every decoded object before it can become an event.
//!
//! Objects from the API reached it through `ValidateService` and the discovery validation;
//! objects from a manifest never met an API server, and their names end up in kernel rule
//! comments and in chain-name hashes. So the manifest source checks what the API server would
//! (`service` and `slice`: names, ports, protocols, node-port range, affinity, traffic
//! policies, the dual-stack fields, EndpointSlice limits; `service_cidr`: ServiceCIDRs'
//! names and CIDRs) and then converts the object with
//! kpr-model for both IP families, so that whatever the proxy itself would refuse is refused
//! here, where the catalog can keep the object's last good version.
//!
//! Deliberately not reasons to reject: a malformed entry of `externalIPs`,
//! `status.loadBalancer.ingress[].ip`, `loadBalancerSourceRanges` or an EndpointSlice's
//! addresses (upstream's proxy drops just that entry, and so does kpr-model), and an empty
//! `clusterIP` (the API server would allocate one). IP syntax is upstream's sloppy one:
//! legacy leading-zero IPv4 (`172.30.0.041`) is accepted, as stored objects may hold it.
//!
//! Pure: each check returns the first problem as a [`Rejection`] naming the object, the field
//! and why. Conflicts between objects (a nodePort or cluster IP used twice) are the
//! catalog's, see `claims`.

use std::ops::RangeInclusive;
use std::path::Path;

use kpr_model::{
    IpFamily, RejectReason, Rejection, convert_service_cidr, node_view, service_view, slice_view, syntax,
};

use super::object::{ManifestObject, ObjectKey, printable, shown_path};
use super::parse::{FileObjects, Placement};

mod service;
mod service_cidr;
mod slice;

/// The API server's default `--service-node-port-range`.
pub const DEFAULT_NODE_PORT_RANGE: RangeInclusive<u16> = 30000..=32767;

/// The tunable part of the rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationRules {
    /// NodePorts (and healthCheckNodePorts) a Service may use, as the API server's
    /// `--service-node-port-range`.
    pub node_port_range: RangeInclusive<u16>,
}

impl Default for ValidationRules {
    fn default() -> Self {
        Self {
            node_port_range: DEFAULT_NODE_PORT_RANGE,
        }
    }
}

/// Checks one object: the API server's rules, then kpr-model's conversion for IPv4 and IPv6.
pub fn validate_object(
    key: &ObjectKey,
    object: &ManifestObject,
    rules: &ValidationRules,
) -> Result<(), Rejection> {
    let check = Check { key };
    match object {
        ManifestObject::Service(service) => {
            service::check(&check, service, rules)?;
            for family in [IpFamily::V4, IpFamily::V6] {
                service_view(service, family)?;
            }
        }
        ManifestObject::EndpointSlice(slice) => {
            slice::check(&check, slice)?;
            for family in [IpFamily::V4, IpFamily::V6] {
                slice_view(slice, family)?;
            }
        }
        ManifestObject::Node(node) => {
            check.name("metadata.name", syntax::dns1123_subdomain)?;
            node_view(node)?;
        }
        ManifestObject::ServiceCidr(object) => {
            service_cidr::check(&check, object)?;
            convert_service_cidr(object)?;
        }
    }
    Ok(())
}

/// Moves every object of `file` that breaks the rules to `failed` (so the catalog keeps its
/// previous version), with a rejection that also says where in `path` it was defined.
pub fn validate_file(path: &Path, file: &mut FileObjects, rules: &ValidationRules) {
    let invalid: Vec<(ObjectKey, Rejection)> = file
        .objects
        .iter()
        .filter_map(|(key, object)| {
            let rejection = validate_object(key, object, rules).err()?;
            Some((key.clone(), rejection))
        })
        .collect();
    for (key, rejection) in invalid {
        file.objects.remove(&key);
        let placement = file.placements.remove(&key);
        file.rejections
            .push(with_place(rejection, path, placement.as_ref()));
        file.failed.insert(key);
    }
}

/// A rule's rejection, saying where in `path` the object was defined.
pub(crate) fn with_place(mut rejection: Rejection, path: &Path, placement: Option<&Placement>) -> Rejection {
    let file_name = shown_path(path);
    rejection.detail = match placement {
        Some(placement) => format!("{} (in {file_name}, {})", rejection.detail, placement.label),
        None => format!("{} (in {file_name})", rejection.detail),
    };
    rejection
}

/// Builds the rejections of one object, so rules name only the field and the reason.
pub(crate) struct Check<'a> {
    key: &'a ObjectKey,
}

impl Check<'_> {
    pub(crate) fn fail(
        &self,
        field: impl Into<String>,
        reason: RejectReason,
        detail: impl Into<String>,
    ) -> Rejection {
        Rejection::new(self.key.kind, self.key.display_name(), field, reason, detail)
    }

    /// A syntax rule of `kpr_model::syntax` on one string field.
    pub(crate) fn syntax(
        &self,
        field: impl Into<String>,
        value: &str,
        rule: fn(&str) -> Result<(), String>,
    ) -> Result<(), Rejection> {
        rule(value).map_err(|why| self.fail(field, RejectReason::InvalidValue, printable(&why)))
    }

    /// The object's own name.
    pub(crate) fn name(&self, field: &str, rule: fn(&str) -> Result<(), String>) -> Result<(), Rejection> {
        self.syntax(field, &self.key.id.name, rule)
    }

    /// The object's namespace: a DNS-1123 label, as for every namespaced kind.
    pub(crate) fn namespace(&self) -> Result<(), Rejection> {
        self.syntax(
            "metadata.namespace",
            &self.key.id.namespace,
            syntax::dns1123_label,
        )
    }

    /// A port number field: 1-65535.
    pub(crate) fn port(&self, field: impl Into<String>, value: i32) -> Result<u16, Rejection> {
        u16::try_from(value)
            .ok()
            .filter(|port| *port != 0)
            .ok_or_else(|| {
                self.fail(
                    field,
                    RejectReason::InvalidPort,
                    format!("{value} is outside 1-65535"),
                )
            })
    }

    /// A list that may hold at most `max` items.
    pub(crate) fn at_most(&self, field: &str, len: usize, max: usize, what: &str) -> Result<(), Rejection> {
        if len <= max {
            return Ok(());
        }
        Err(self.fail(
            field,
            RejectReason::TooLarge,
            format!("has {len} {what}; the API allows at most {max}"),
        ))
    }
}

#[cfg(test)]
mod tests;
