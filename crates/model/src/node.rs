//! The proxy's own Node: its zone for topology hints, its addresses, its pod CIDRs, and
//! whether it is going away.
//!
//! Addresses are read as upstream's `GetNodeHostIPs` reads them (`ParseIPSloppy`, InternalIP
//! before ExternalIP): a malformed one is skipped, and the rest of the Node (its zone, its
//! taints, its other addresses) is used. The skipped address comes back as an
//! [`IgnoredValue`] for the caller to log and count. Only a Node whose name is wrong is
//! rejected.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

use crate::ident::ObjectKind;
use crate::ignored::{Converted, IgnoredValue};
use crate::rejection::{RejectReason, Rejecter, Rejection, shown};
use crate::syntax::{dns1123_subdomain, parse_cidr_sloppy, parse_ip_sloppy};

/// The metric label of dropped Node addresses.
const ADDRESSES: &str = "status.addresses";
/// The metric label of dropped pod CIDRs.
const POD_CIDRS: &str = "spec.podCIDRs";

pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The taint cluster-autoscaler puts on a node it is about to remove.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// InternalIP addresses first, then ExternalIP, as upstream picks the node IP.
    pub addresses: Vec<IpAddr>,
    /// Being deleted, or marked for deletion by the cluster autoscaler: `/healthz` then
    /// reports the node ineligible so load balancers drain it.
    pub going_away: bool,
    /// `spec.podCIDRs` (at most one per family): `--detect-local-mode=NodeCIDR` tells this
    /// node's pods by them.
    pub pod_cidrs: Vec<IpNet>,
}

impl NodeView {
    pub fn zone(&self) -> Option<&str> {
        self.labels.get(ZONE_LABEL).map(String::as_str)
    }
}

/// Converts a Node; malformed addresses are dropped and returned in [`Converted::ignored`].
pub fn convert_node(node: &Node) -> Result<Converted<NodeView>, Rejection> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let rejecter = Rejecter::new(ObjectKind::Node, name.clone());
    if name.is_empty() {
        return Err(rejecter.reject("metadata.name", RejectReason::MissingField, "required"));
    }
    rejecter.name("metadata.name", &name, dns1123_subdomain)?;
    let mut ignored = Vec::new();
    let addresses = node_addresses(node, &rejecter, &mut ignored);
    let pod_cidrs = pod_cidrs(node, &rejecter, &mut ignored);
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
        .iter()
        .any(|t| t.key == TO_BE_DELETED_TAINT);
    Ok(Converted {
        view: NodeView {
            name,
            labels: node.metadata.labels.clone().unwrap_or_default(),
            addresses,
            going_away: tainted || node.metadata.deletion_timestamp.is_some(),
            pod_cidrs,
        },
        ignored,
    })
}

/// [`convert_node`] for callers that do not report dropped addresses (tests, benchmarks).
pub fn node_view(node: &Node) -> Result<NodeView, Rejection> {
    convert_node(node).map(|converted| converted.view)
}

/// InternalIP addresses, then ExternalIP ones; malformed ones are dropped and reported.
fn node_addresses(node: &Node, rejecter: &Rejecter, ignored: &mut Vec<IgnoredValue>) -> Vec<IpAddr> {
    let listed = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default();
    let mut out = Vec::new();
    for wanted in ["InternalIP", "ExternalIP"] {
        for (i, entry) in listed.iter().enumerate().filter(|(_, a)| a.type_ == wanted) {
            match parse_ip_sloppy(&entry.address) {
                Some(ip) => out.push(ip),
                None => ignored.push(rejecter.ignore(
                    ADDRESSES,
                    format!("status.addresses[{i}].address"),
                    RejectReason::InvalidIp,
                    format!("{} is not an IP address", shown(&entry.address)),
                )),
            }
        }
    }
    out
}

/// `spec.podCIDRs`, or `spec.podCIDR` alone when the list is missing (the API server fills
/// the list from it on write; a manifest may carry only the old field). Read as upstream's
/// `ParseCIDRSloppy`; a malformed entry is dropped and reported.
fn pod_cidrs(node: &Node, rejecter: &Rejecter, ignored: &mut Vec<IgnoredValue>) -> Vec<IpNet> {
    let Some(spec) = node.spec.as_ref() else {
        return Vec::new();
    };
    let (listed, field): (Vec<&String>, fn(usize) -> String) = match &spec.pod_cidrs {
        Some(list) if !list.is_empty() => (list.iter().collect(), |i| format!("spec.podCIDRs[{i}]")),
        _ => (spec.pod_cidr.iter().collect(), |_| "spec.podCIDR".to_string()),
    };
    let mut out = Vec::new();
    for (i, entry) in listed.into_iter().enumerate() {
        match parse_cidr_sloppy(entry) {
            Some(cidr) => out.push(cidr),
            None => ignored.push(rejecter.ignore(
                POD_CIDRS,
                field(i),
                RejectReason::InvalidCidr,
                format!("{} is not a CIDR", shown(entry)),
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_zone_addresses_and_autoscaler_taint() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "node1", "labels": {"topology.kubernetes.io/zone": "z1"}},
            "spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]},
            "status": {"addresses": [{"type": "ExternalIP", "address": "203.0.113.1"}, {"type": "InternalIP", "address": "10.0.0.5"}, {"type": "Hostname", "address": "node1"}]}
        }))
        .unwrap();
        let view = node_view(&node).unwrap();
        assert_eq!(view.zone(), Some("z1"));
        assert_eq!(
            view.addresses,
            vec![
                "10.0.0.5".parse::<IpAddr>().unwrap(),
                "203.0.113.1".parse().unwrap()
            ]
        );
        assert!(view.going_away);
    }

    /// Upstream's `GetNodeHostIPs` skips an address it cannot parse: the Node's other
    /// addresses, its zone and its taints are still used.
    #[test]
    fn a_bad_address_is_dropped_and_the_rest_of_the_node_kept() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "node1", "labels": {"topology.kubernetes.io/zone": "z1"}},
            "spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]},
            "status": {"addresses": [
                {"type": "InternalIP", "address": "nope\n-A X"},
                {"type": "InternalIP", "address": "10.0.0.5"},
                {"type": "ExternalIP", "address": ""},
                {"type": "Hostname", "address": "not an ip, not read"}
            ]}
        }))
        .unwrap();
        let converted = convert_node(&node).unwrap();
        let found: Vec<_> = converted
            .ignored
            .iter()
            .map(|w| (w.kind, w.object.as_str(), w.field.as_str(), w.list, w.reason))
            .collect();
        assert_eq!(
            found,
            [
                (
                    ObjectKind::Node,
                    "node1",
                    "status.addresses[0].address",
                    ADDRESSES,
                    RejectReason::InvalidIp
                ),
                (
                    ObjectKind::Node,
                    "node1",
                    "status.addresses[2].address",
                    ADDRESSES,
                    RejectReason::InvalidIp
                ),
            ]
        );
        assert!(!converted.ignored[0].to_string().contains('\n'));
        let view = converted.view;
        assert_eq!(view.addresses, ["10.0.0.5".parse::<IpAddr>().unwrap()]);
        assert_eq!(view.zone(), Some("z1"));
        assert!(view.going_away);
        assert_eq!(node_view(&node).unwrap(), view);
    }

    #[test]
    fn addresses_are_read_sloppily_and_names_checked() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "node-1.example"},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.168.000.010"}]}
        }))
        .unwrap();
        assert_eq!(
            node_view(&node).unwrap().addresses,
            ["192.168.0.10".parse::<IpAddr>().unwrap()]
        );
        for name in ["Node1", "node_1", "a/b", "node\n1"] {
            let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
            let r = node_view(&node).unwrap_err();
            assert_eq!(
                (r.field.as_str(), r.reason),
                ("metadata.name", RejectReason::InvalidValue),
                "{name:?}"
            );
        }
    }

    #[test]
    fn pod_cidrs_are_read_sloppily_and_a_bad_one_dropped() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "node1"},
            "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24", "fd00:10:244:1::/64", "nope"]}
        }))
        .unwrap();
        let converted = convert_node(&node).unwrap();
        let cidrs: Vec<String> = converted.view.pod_cidrs.iter().map(ToString::to_string).collect();
        assert_eq!(cidrs, ["10.244.1.0/24", "fd00:10:244:1::/64"]);
        let dropped: Vec<_> = converted
            .ignored
            .iter()
            .map(|w| (w.field.as_str(), w.list, w.reason))
            .collect();
        assert_eq!(
            dropped,
            [("spec.podCIDRs[2]", POD_CIDRS, RejectReason::InvalidCidr)]
        );
    }

    #[test]
    fn the_old_single_pod_cidr_counts_when_the_list_is_missing() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "node1"},
            "spec": {"podCIDR": "10.244.001.0/24"}
        }))
        .unwrap();
        let view = node_view(&node).unwrap();
        assert_eq!(view.pod_cidrs, ["10.244.1.0/24".parse::<IpNet>().unwrap()]);
        let bare: Node = serde_json::from_value(json!({"metadata": {"name": "node1"}})).unwrap();
        assert!(node_view(&bare).unwrap().pod_cidrs.is_empty());
    }
}
