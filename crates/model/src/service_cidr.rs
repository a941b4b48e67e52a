//! The cluster's Service CIDRs, from `networking.k8s.io/v1` ServiceCIDR objects.
//!
//! nftables mode drops traffic to an address inside a Service CIDR that no Service holds
//! (upstream's `OnServiceCIDRsChanged`). Upstream takes `spec.cidrs` of every ServiceCIDR
//! the informer holds, whatever its status conditions and including one being deleted (its
//! addresses may still be allocated), so this view reads `spec.cidrs` only.
//!
//! Entries are read as upstream reads them (`ParseCIDRSloppy`); a malformed one is dropped
//! and returned as an [`IgnoredValue`], the rest of the object is used. One more entry is
//! dropped where upstream would program it: a prefix of length 0 would make every address
//! of the family "unallocated" and drop all traffic of pods to anything but a Service.

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::ServiceCIDR;

use crate::ident::{IpFamily, ObjectKind};
use crate::ignored::Converted;
use crate::rejection::{RejectReason, Rejecter, Rejection, shown};
use crate::syntax::{dns1123_subdomain, parse_cidr_sloppy};

/// The metric label of dropped ServiceCIDR entries.
const CIDRS: &str = "spec.cidrs";

/// One ServiceCIDR: its name and its usable CIDRs (at most one per family from the API
/// server; whatever a stored object holds is kept, each family's entries used).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceCidrView {
    pub name: String,
    pub cidrs: Vec<IpNet>,
}

impl ServiceCidrView {
    /// The CIDRs of one family.
    pub fn of_family(&self, family: IpFamily) -> impl Iterator<Item = IpNet> + '_ {
        self.cidrs
            .iter()
            .copied()
            .filter(move |net| family.matches(&net.addr()))
    }
}

/// Converts a ServiceCIDR; malformed entries of `spec.cidrs` are dropped and returned in
/// [`Converted::ignored`]. Only a missing or malformed name rejects the object.
pub fn convert_service_cidr(object: &ServiceCIDR) -> Result<Converted<ServiceCidrView>, Rejection> {
    let name = object.metadata.name.clone().unwrap_or_default();
    let rejecter = Rejecter::new(ObjectKind::ServiceCidr, name.clone());
    if name.is_empty() {
        return Err(rejecter.reject("metadata.name", RejectReason::MissingField, "required"));
    }
    rejecter.name("metadata.name", &name, dns1123_subdomain)?;
    let listed = object
        .spec
        .as_ref()
        .and_then(|spec| spec.cidrs.as_deref())
        .unwrap_or_default();
    let mut cidrs = Vec::new();
    let mut ignored = Vec::new();
    for (i, entry) in listed.iter().enumerate() {
        match usable_cidr(entry) {
            Ok(net) => cidrs.push(net),
            Err((reason, why)) => {
                ignored.push(rejecter.ignore(CIDRS, format!("spec.cidrs[{i}]"), reason, why))
            }
        }
    }
    Ok(Converted {
        view: ServiceCidrView { name, cidrs },
        ignored,
    })
}

fn usable_cidr(entry: &str) -> Result<IpNet, (RejectReason, String)> {
    let net = parse_cidr_sloppy(entry).ok_or_else(|| {
        (
            RejectReason::InvalidCidr,
            format!("{} is not a CIDR", shown(entry)),
        )
    })?;
    if net.prefix_len() == 0 {
        return Err((
            RejectReason::InvalidCidr,
            format!(
                "{} covers every address of its family; dropping traffic to all of them is refused",
                shown(entry)
            ),
        ));
    }
    Ok(net)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service_cidr(value: serde_json::Value) -> ServiceCIDR {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn reads_both_families_sloppily() {
        let object = service_cidr(json!({
            "metadata": {"name": "kubernetes"},
            "spec": {"cidrs": ["10.96.000.0/16", "fd00:96::/112"]}
        }));
        let converted = convert_service_cidr(&object).unwrap();
        assert!(converted.ignored.is_empty());
        let view = converted.view;
        assert_eq!(view.name, "kubernetes");
        let v4: Vec<String> = view.of_family(IpFamily::V4).map(|n| n.to_string()).collect();
        let v6: Vec<String> = view.of_family(IpFamily::V6).map(|n| n.to_string()).collect();
        assert_eq!(v4, ["10.96.0.0/16"]);
        assert_eq!(v6, ["fd00:96::/112"]);
    }

    #[test]
    fn a_bad_or_all_covering_entry_is_dropped_and_the_rest_kept() {
        let object = service_cidr(json!({
            "metadata": {"name": "extra"},
            "spec": {"cidrs": ["nope\n", "10.100.0.0/16", "::/0", "10.0.0.0/33"]}
        }));
        let converted = convert_service_cidr(&object).unwrap();
        assert_eq!(
            converted.dropped(),
            [
                ("spec.cidrs[0]", RejectReason::InvalidCidr),
                ("spec.cidrs[2]", RejectReason::InvalidCidr),
                ("spec.cidrs[3]", RejectReason::InvalidCidr),
            ]
        );
        assert!(
            converted
                .ignored
                .iter()
                .all(|w| w.list == CIDRS && w.kind == ObjectKind::ServiceCidr)
        );
        assert!(!converted.ignored[0].to_string().contains('\n'));
        assert_eq!(converted.view.cidrs, ["10.100.0.0/16".parse::<IpNet>().unwrap()]);
    }

    #[test]
    fn host_bits_are_cleared() {
        let object = service_cidr(json!({"metadata": {"name": "x"}, "spec": {"cidrs": ["10.96.5.1/16"]}}));
        let view = convert_service_cidr(&object).unwrap().view;
        assert_eq!(view.cidrs, ["10.96.0.0/16".parse::<IpNet>().unwrap()]);
    }

    #[test]
    fn names_are_checked_and_an_empty_spec_is_no_cidr() {
        for bad in ["", "Kubernetes", "a_b", "x\ny"] {
            let object = service_cidr(json!({"metadata": {"name": bad}}));
            let rejection = convert_service_cidr(&object).unwrap_err();
            assert_eq!(rejection.field, "metadata.name", "{bad:?}");
            assert_eq!(rejection.kind, ObjectKind::ServiceCidr);
        }
        let bare = service_cidr(json!({"metadata": {"name": "bare"}}));
        assert!(convert_service_cidr(&bare).unwrap().view.cidrs.is_empty());
    }
}
