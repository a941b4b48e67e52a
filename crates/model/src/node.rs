//! The proxy's own Node: its zone for topology hints, its addresses, and whether it is going away.
//!
//! Addresses are read as upstream reads them (`ParseIPSloppy`); a malformed one rejects the
//! Node update, so the proxy keeps the last good view of its node.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;

use crate::ident::ObjectKind;
use crate::rejection::{RejectReason, Rejecter, Rejection};
use crate::syntax::dns1123_subdomain;

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

pub fn node_view(node: &Node) -> Result<NodeView, Rejection> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let rejecter = Rejecter::new(ObjectKind::Node, name.clone());
    if name.is_empty() {
        return Err(rejecter.reject("metadata.name", RejectReason::MissingField, "required"));
    }
    rejecter.name("metadata.name", &name, dns1123_subdomain)?;
    let mut addresses = Vec::new();
    let listed = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default();
    for wanted in ["InternalIP", "ExternalIP"] {
        for (i, addr) in listed.iter().enumerate().filter(|(_, a)| a.type_ == wanted) {
            addresses.push(rejecter.parse_ip(&format!("status.addresses[{i}].address"), &addr.address)?);
        }
    }
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
        .iter()
        .any(|t| t.key == TO_BE_DELETED_TAINT);
    Ok(NodeView {
        name,
        labels: node.metadata.labels.clone().unwrap_or_default(),
        addresses,
        going_away: tainted || node.metadata.deletion_timestamp.is_some(),
    })
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

    #[test]
    fn bad_address_is_rejected() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "node1"},
            "status": {"addresses": [{"type": "InternalIP", "address": "nope"}]}
        }))
        .unwrap();
        let r = node_view(&node).unwrap_err();
        assert_eq!(r.field, "status.addresses[0].address");
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
