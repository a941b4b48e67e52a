//! The API objects themselves, from JSON as the API would show them.

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kpr_model::{IpFamily, SERVICE_NAME_LABEL};
use serde_json::{Value, json};

use crate::{NAMESPACE, NODE, NODE_IP};

/// Service `default/<name>` with this `spec`. A `"status"` key in `spec` becomes the
/// Service's status, so a test writes a LoadBalancer's ingress next to its ports.
pub fn service_object(name: &str, spec: Value) -> Service {
    let mut spec = spec;
    let status = spec
        .as_object_mut()
        .expect("a Service spec is a JSON object")
        .remove("status");
    let mut object = json!({"metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec});
    if let Some(status) = status {
        object["status"] = status;
    }
    from_json("Service", object)
}

/// EndpointSlice `default/<name>` of Service `service`: `address_type` `"IPv4"` or
/// `"IPv6"`, `ports` like `[{"name": "http", "port": 8080}]`, endpoints from [`crate::ep`].
pub fn slice_object(
    name: &str,
    service: &str,
    address_type: &str,
    ports: Value,
    endpoints: Vec<Value>,
) -> EndpointSlice {
    from_json(
        "EndpointSlice",
        json!({
            "metadata": {"name": name, "namespace": NAMESPACE,
                         "labels": {SERVICE_NAME_LABEL: service}},
            "addressType": address_type,
            "ports": ports,
            "endpoints": endpoints,
        }),
    )
}

/// A slice's `addressType` for `family`.
pub(crate) fn address_type(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "IPv4",
        IpFamily::V6 => "IPv6",
    }
}

/// The proxy's Node ([`NODE`], InternalIP [`NODE_IP`]), in `zone` if one is given.
pub fn node_object(zone: Option<&str>) -> Node {
    let labels = match zone {
        Some(zone) => json!({kpr_model::ZONE_LABEL: zone}),
        None => json!({}),
    };
    from_json(
        "Node",
        json!({
            "metadata": {"name": NODE, "labels": labels},
            "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]}
        }),
    )
}

fn from_json<T: serde::de::DeserializeOwned>(kind: &str, object: Value) -> T {
    serde_json::from_value(object.clone())
        .unwrap_or_else(|e| panic!("the test's {kind} does not fit the API's schema: {e}\n{object:#}"))
}
