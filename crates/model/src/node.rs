//! The proxy's own Node: its zone for topology hints, its addresses, and whether it is going away.
//!
//! Addresses are read as upstream's `GetNodeHostIPs` reads them (`ParseIPSloppy`, InternalIP
//! before ExternalIP): a malformed one is skipped, and the rest of the Node (its zone, its
//! taints, its other addresses) is used. The skipped address comes back as an
//! [`IgnoredValue`] for the caller to log and count. Only a Node whose name is wrong is
//! rejected.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;

use crate::ident::ObjectKind;
use crate::ignored::{Converted, IgnoredValue};
use crate::rejection::{RejectReason, Rejecter, Rejection, shown};
use crate::syntax::{dns1123_subdomain, parse_ip_sloppy};

/// The metric label of dropped Node addresses.
const ADDRESSES: &str = "status.addresses";

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
}
