//! `ValidateServiceCIDR`'s rules: a DNS-1123 subdomain name, one or two CIDRs, at most one
//! per IP family, each a valid CIDR in canonical form.
//!
//! The API server refuses a new ServiceCIDR whose CIDR is written sloppily (leading zeros,
//! host bits set, an IPv4-mapped IPv6 network), so a manifest must write it canonically;
//! kpr-model's sloppy reading is for objects the API server stored long ago. A prefix of
//! length 0 is refused too: it would make every address of the family "unallocated".

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kpr_model::{RejectReason, Rejection, syntax};

use super::super::object::printable;
use super::Check;

/// The API server's limit: one CIDR per family.
const MAX_CIDRS: usize = 2;

pub(super) fn check(check: &Check<'_>, object: &ServiceCIDR) -> Result<(), Rejection> {
    check.name("metadata.name", syntax::dns1123_subdomain)?;
    let cidrs = object
        .spec
        .as_ref()
        .and_then(|spec| spec.cidrs.as_deref())
        .unwrap_or_default();
    if cidrs.is_empty() {
        return Err(check.fail(
            "spec.cidrs",
            RejectReason::MissingField,
            "at least one CIDR required",
        ));
    }
    check.at_most("spec.cidrs", cidrs.len(), MAX_CIDRS, "CIDRs")?;
    let mut parsed = Vec::with_capacity(cidrs.len());
    for (i, value) in cidrs.iter().enumerate() {
        parsed.push(canonical_cidr(check, &format!("spec.cidrs[{i}]"), value)?);
    }
    let same_family =
        matches!(parsed[..], [first, second] if first.addr().is_ipv4() == second.addr().is_ipv4());
    if same_family {
        return Err(check.fail(
            "spec.cidrs",
            RejectReason::InvalidCidr,
            "may hold no more than one CIDR per IP family, e.g. 10.96.0.0/16 and fd00:96::/112",
        ));
    }
    Ok(())
}

fn canonical_cidr(check: &Check<'_>, field: &str, value: &str) -> Result<IpNet, Rejection> {
    let shown = printable(value);
    let invalid = |why: String| check.fail(field, RejectReason::InvalidCidr, why);
    let net = strict_cidr(value).ok_or_else(|| {
        invalid(format!(
            "{shown:?} is not a valid CIDR, e.g. 10.96.0.0/16 or fd00:96::/112"
        ))
    })?;
    if matches!(net.addr(), IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some()) {
        return Err(invalid(format!(
            "{shown:?} is an IPv4-mapped IPv6 network; write it as IPv4"
        )));
    }
    if net != net.trunc() {
        return Err(invalid(format!(
            "{shown:?} has bits set beyond the prefix length; the network is {}",
            net.trunc()
        )));
    }
    if net.prefix_len() == 0 {
        return Err(invalid(format!("{shown:?} covers every address of its family")));
    }
    Ok(net)
}

/// `address/prefix` with the address in the standard library's strict syntax (no leading
/// zeros) and the prefix length in plain decimal.
fn strict_cidr(value: &str) -> Option<IpNet> {
    let (address, prefix) = value.split_once('/')?;
    let canonical_digits = !prefix.is_empty()
        && prefix.bytes().all(|b| b.is_ascii_digit())
        && (prefix == "0" || !prefix.starts_with('0'));
    if !canonical_digits {
        return None;
    }
    IpNet::new(address.parse().ok()?, prefix.parse().ok()?).ok()
}
