//! The scenarios' manifests: a file of `examples/features/`, written to the proxy's manifest
//! directory as users would copy it, then edited the way the cluster would change it (an
//! endpoint starts terminating, the Node moves to another zone).
//!
//! Edits work on the parsed documents and write them back as YAML; the example's comments
//! only survive until the first edit, which the proxy does not mind. Upstream's e2e
//! scenarios build their own objects instead ([`Manifests::new`], [`crate::objects`]), as
//! each of upstream's tests creates its own Services.

use std::net::Ipv4Addr;

use serde::Deserialize;
use serde_json::Value;

/// One example file and its current state.
pub struct Manifests {
    file: &'static str,
    original: String,
    docs: Vec<Value>,
    edited: bool,
}

impl Manifests {
    /// `examples/features/<file>`.
    pub fn example(file: &'static str) -> Self {
        let original = EXAMPLES
            .iter()
            .find(|(name, _)| *name == file)
            .map(|(_, text)| (*text).to_owned())
            .unwrap_or_else(|| panic!("examples/features/{file} is not in EXAMPLES"));
        let docs = serde_yaml_ng::Deserializer::from_str(&original)
            .map(|doc| Value::deserialize(doc).unwrap_or_else(|err| panic!("{file}: {err}")))
            .collect();
        Self {
            file,
            original,
            docs,
            edited: false,
        }
    }

    /// A file of the scenario's own, `docs` as the cluster's objects (see [`crate::objects`]):
    /// for upstream's e2e scenarios, which each build their own Services.
    pub fn new(file: &'static str, docs: Vec<Value>) -> Self {
        Self {
            file,
            original: String::new(),
            docs,
            edited: true,
        }
    }

    /// The file name it is written under.
    pub fn file(&self) -> &'static str {
        self.file
    }

    /// The file's text: the example itself until the first edit.
    pub fn yaml(&self) -> String {
        if !self.edited {
            return self.original.clone();
        }
        self.docs
            .iter()
            .map(|doc| serde_yaml_ng::to_string(doc).unwrap())
            .collect::<Vec<_>>()
            .join("---\n")
    }

    /// Service `name`, as the example states it (read only: reading is no edit).
    pub fn service(&self, name: &str) -> &Value {
        self.docs
            .iter()
            .find(|doc| doc["kind"] == "Service" && doc["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{} has no Service {name}", self.file))
    }

    /// Service `name`, to edit.
    pub fn service_mut(&mut self, name: &str) -> &mut Value {
        let file = self.file;
        self.find(|doc| doc["kind"] == "Service" && doc["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{file} has no Service {name}"))
    }

    /// EndpointSlice `name` (for Services with more than one slice).
    pub fn slice_named(&mut self, name: &str) -> &mut Value {
        let file = self.file;
        self.find(|doc| doc["kind"] == "EndpointSlice" && doc["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{file} has no EndpointSlice {name}"))
    }

    /// Adds `doc` (a Service or an EndpointSlice) to the file.
    pub fn add(&mut self, doc: Value) {
        self.docs.push(doc);
        self.edited = true;
    }

    /// Deletes Service `name` and its EndpointSlices, as deleting a Service does (the
    /// slices go with their owner).
    pub fn delete_service(&mut self, name: &str) {
        let before = self.docs.len();
        self.docs.retain(|doc| {
            let service = doc["kind"] == "Service" && doc["metadata"]["name"] == name;
            let slice = doc["kind"] == "EndpointSlice"
                && doc["metadata"]["labels"]["kubernetes.io/service-name"] == name;
            !(service || slice)
        });
        assert!(self.docs.len() < before, "{} has no Service {name}", self.file);
        self.edited = true;
    }

    /// Deletes EndpointSlice `name`.
    pub fn delete_slice(&mut self, name: &str) {
        let before = self.docs.len();
        self.docs
            .retain(|doc| !(doc["kind"] == "EndpointSlice" && doc["metadata"]["name"] == name));
        assert!(
            self.docs.len() < before,
            "{} has no EndpointSlice {name}",
            self.file
        );
        self.edited = true;
    }

    /// The EndpointSlice of Service `service` (the example has one per Service).
    pub fn slice(&mut self, service: &str) -> &mut Value {
        self.find(|doc| {
            doc["kind"] == "EndpointSlice"
                && doc["metadata"]["labels"]["kubernetes.io/service-name"] == service
        })
        .unwrap_or_else(|| panic!("no EndpointSlice for Service {service}"))
    }

    /// Replaces the endpoints of Service `service`'s slice.
    pub fn set_endpoints(&mut self, service: &str, endpoints: Vec<Value>) {
        *endpoints_of(self.slice(service)) = endpoints;
    }

    /// The endpoint with address `ip` in Service `service`'s slice.
    pub fn endpoint(&mut self, service: &str, ip: Ipv4Addr) -> &mut Value {
        let ip = ip.to_string();
        endpoints_of(self.slice(service))
            .iter_mut()
            .find(|ep| ep["addresses"][0] == ip.as_str())
            .unwrap_or_else(|| panic!("Service {service} has no endpoint {ip}"))
    }

    /// Adds the endpoint `endpoint` (as a slice lists it) to Service `service`'s slice.
    pub fn add_endpoint(&mut self, service: &str, endpoint: Value) {
        endpoints_of(self.slice(service)).push(endpoint);
    }

    /// Removes the endpoint with address `ip` from Service `service`'s slice.
    pub fn remove_endpoint(&mut self, service: &str, ip: Ipv4Addr) {
        let ip = ip.to_string();
        let list = endpoints_of(self.slice(service));
        let before = list.len();
        list.retain(|ep| ep["addresses"][0] != ip.as_str());
        assert_eq!(list.len() + 1, before, "Service {service} has no endpoint {ip}");
    }

    /// The Node object.
    pub fn node(&mut self) -> &mut Value {
        let file = self.file;
        self.find(|doc| doc["kind"] == "Node")
            .unwrap_or_else(|| panic!("{file} has no Node"))
    }

    /// The first document matching `wanted`, marked as edited.
    fn find(&mut self, wanted: impl Fn(&Value) -> bool) -> Option<&mut Value> {
        let doc = self.docs.iter_mut().find(|doc| wanted(doc))?;
        self.edited = true;
        Some(doc)
    }
}

/// Endpoint conditions in a slice: `{ready, serving, terminating}`.
pub fn conditions(ready: bool, serving: bool, terminating: bool) -> Value {
    serde_json::json!({"ready": ready, "serving": serving, "terminating": terminating})
}

fn endpoints_of(slice: &mut Value) -> &mut Vec<Value> {
    slice["endpoints"]
        .as_array_mut()
        .expect("the slice lists its endpoints")
}

/// The example files, built into the test binary: ipvs mode's scenarios run it inside a
/// guest, where the repository is not.
const EXAMPLES: &[(&str, &str)] = &[
    (
        "external-ips.yaml",
        include_str!("../../../../examples/features/external-ips.yaml"),
    ),
    (
        "external-traffic-policy-local.yaml",
        include_str!("../../../../examples/features/external-traffic-policy-local.yaml"),
    ),
    (
        "internal-traffic-policy-local.yaml",
        include_str!("../../../../examples/features/internal-traffic-policy-local.yaml"),
    ),
    (
        "load-balancer.yaml",
        include_str!("../../../../examples/features/load-balancer.yaml"),
    ),
    (
        "session-affinity.yaml",
        include_str!("../../../../examples/features/session-affinity.yaml"),
    ),
    (
        "terminating-endpoints.yaml",
        include_str!("../../../../examples/features/terminating-endpoints.yaml"),
    ),
    (
        "topology.yaml",
        include_str!("../../../../examples/features/topology.yaml"),
    ),
];
