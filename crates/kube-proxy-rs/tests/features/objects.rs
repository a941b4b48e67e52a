//! The objects upstream's e2e scenarios create, as the API server and the EndpointSlice
//! controller would leave them: Services with their allocated cluster IP (and NodePorts),
//! and slices whose endpoints carry the conditions, node names, zones and hints the
//! controller writes for the pods in question.
//!
//! Pods are the lab's ([`crate::stage`]): pod `i` has [`pod_ip`]`(i)`. Pods whose endpoint
//! names another node (`node2`) count as that node's, as in the feature examples.

use std::net::Ipv4Addr;

use kpr_netns::pod_ip;
use serde_json::{Value, json};

use crate::manifests::conditions;
use crate::stage::POD_PORT;
use crate::support::NODE_NAME;

/// The node other than this one, where "remote" endpoints live.
pub const OTHER_NODE: &str = "node2";

/// This node's Node object as a cluster holds it: its InternalIP is the node's address.
/// Without it the proxy's node IP falls back to loopback, as upstream's does.
pub fn this_node() -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": NODE_NAME, "labels": {"kubernetes.io/hostname": NODE_NAME}},
           "status": {"addresses": [{"type": "InternalIP", "address": kpr_netns::NODE_IP.to_string()}]}})
}

/// Service `name` with cluster IP `cluster_ip` and `spec` merged over it (`type`, `ports`,
/// policies...); `ClusterIP` unless `spec` says otherwise.
pub fn service(name: &str, cluster_ip: Ipv4Addr, spec: Value) -> Value {
    let mut service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"type": "ClusterIP", "clusterIP": cluster_ip.to_string(),
                 "clusterIPs": [cluster_ip.to_string()], "selector": {"app": name}},
    });
    merge(&mut service["spec"], spec);
    service
}

/// ExternalName Service `name`: a DNS alias, nothing for the proxy to program.
pub fn external_name_service(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"type": "ExternalName", "externalName": "db.example.com"},
    })
}

/// A TCP Service port `name`: `port` to the pods' [`POD_PORT`].
pub fn tcp_port(name: &str, port: u16) -> Value {
    json!({"name": name, "port": port, "protocol": "TCP", "targetPort": POD_PORT})
}

/// A UDP Service port `name`: `port` to the pods' [`POD_PORT`].
pub fn udp_port(name: &str, port: u16) -> Value {
    json!({"name": name, "port": port, "protocol": "UDP", "targetPort": POD_PORT})
}

/// `port` with NodePort `node_port`.
pub fn with_node_port(mut port: Value, node_port: u16) -> Value {
    port["nodePort"] = json!(node_port);
    port
}

/// A slice port: what the controller writes for a Service port `name` (the pods' port).
pub fn slice_port(name: &str, protocol: &str, port: u16) -> Value {
    json!({"name": name, "port": port, "protocol": protocol})
}

/// EndpointSlice `name` of Service `service`, with `ports` and `endpoints`.
pub fn named_slice(name: &str, service: &str, ports: Value, endpoints: Vec<Value>) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "default",
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": endpoints,
    })
}

/// The one EndpointSlice of Service `service` (named after it).
pub fn slice(service: &str, ports: Value, endpoints: Vec<Value>) -> Value {
    named_slice(&format!("{service}-abcde"), service, ports, endpoints)
}

/// Pod `pod`'s endpoint on `node` with `conditions` ([`crate::manifests::conditions`]).
pub fn endpoint(pod: usize, node: &str, conditions: Value) -> Value {
    json!({"addresses": [pod_ip(pod).to_string()], "conditions": conditions, "nodeName": node})
}

/// A ready pod on `node`.
pub fn ready(pod: usize, node: &str) -> Value {
    endpoint(pod, node, conditions(true, true, false))
}

/// A ready pod on this node.
pub fn ready_here(pod: usize) -> Value {
    ready(pod, NODE_NAME)
}

/// A pod on `node` shutting down within its grace period: still serving, no longer ready.
pub fn terminating(pod: usize, node: &str) -> Value {
    endpoint(pod, node, conditions(false, true, true))
}

/// Merges `patch` into `target`: objects key by key, anything else replaced.
pub fn merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(target), Value::Object(patch)) => {
            for (key, value) in patch {
                merge(target.entry(key).or_insert(Value::Null), value);
            }
        }
        (target, patch) => *target = patch,
    }
}
