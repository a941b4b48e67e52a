//! Test support: desired states built from Service / EndpointSlice JSON through the real
//! conversions and trackers, and golden-file comparison.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kpr_iptables::Variant;
use kpr_model::{IpFamily, NamespacedName, NodeView, node_view};
use kpr_state::{DesiredState, PendingSync};
use kpr_tracking::{EndpointsTracker, ServiceTracker};
use serde_json::{Value, json};

pub const NODE: &str = "node-a";
pub const NODE_IP: &str = "192.168.0.10";

/// Services and slices as the API would show them, fed through the trackers.
pub struct World {
    services: ServiceTracker,
    endpoints: EndpointsTracker,
    node: Arc<NodeView>,
}

impl Default for World {
    fn default() -> Self {
        Self::new()
    }
}

impl World {
    pub fn new() -> Self {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": NODE, "labels": {"topology.kubernetes.io/zone": "z1"}},
            "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]}
        }))
        .unwrap();
        Self {
            services: ServiceTracker::new(IpFamily::V4),
            endpoints: EndpointsTracker::new(IpFamily::V4, NODE),
            node: Arc::new(node_view(&node).unwrap()),
        }
    }

    /// Adds or replaces Service `default/<name>`; `extra` is merged into `spec` (and a
    /// `"status"` key, if present, becomes the status).
    pub fn service(&mut self, name: &str, spec: Value) -> &mut Self {
        let mut spec = spec;
        let status = spec.as_object_mut().unwrap().remove("status");
        let mut obj = json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec});
        if let Some(status) = status {
            obj["status"] = status;
        }
        let svc: Service = serde_json::from_value(obj).unwrap();
        self.services
            .update(NamespacedName::new("default", name), Some(&svc))
            .unwrap();
        self
    }

    pub fn delete_service(&mut self, name: &str) -> &mut Self {
        self.services
            .update(NamespacedName::new("default", name), None)
            .unwrap();
        self.endpoints
            .update(NamespacedName::new("default", &format!("{name}-1")), None)
            .unwrap();
        self
    }

    /// Sets the one slice of `service` (`<service>-1`): `ports` like
    /// `[{"name": "http", "port": 8080}]`, endpoints from [`ep`].
    pub fn slice(&mut self, service: &str, ports: Value, endpoints: Vec<Value>) -> &mut Self {
        let name = format!("{service}-1");
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "ports": ports,
            "endpoints": endpoints,
        }))
        .unwrap();
        self.endpoints
            .update(NamespacedName::new("default", &name), Some(&slice))
            .unwrap();
        self
    }

    /// The desired state after the pending changes, and the services they touched.
    pub fn take(&mut self) -> (DesiredState, BTreeSet<NamespacedName>) {
        let pending = self.pending();
        (pending.state, pending.changed)
    }

    /// Everything the next sync hands to a backend, taken from the trackers the way the
    /// sync loop (crates/sync) takes it.
    pub fn pending(&mut self) -> Pending {
        PendingSync::new(self.services.take(), self.endpoints.take(), self.node.clone())
    }

    pub fn state(&mut self) -> DesiredState {
        self.take().0
    }
}

/// The input of one sync (the product's own type).
pub type Pending = PendingSync;

/// An endpoint: `"10.244.1.5"` on another node, ready; words after the IP: `local`
/// (on this node), `terminating` (serving, terminating, not ready), `notready`.
pub fn ep(spec: &str) -> Value {
    let mut words = spec.split_whitespace();
    let ip = words.next().unwrap();
    let mut node = "node-b";
    let (mut ready, mut serving, mut terminating) = (true, true, false);
    for w in words {
        match w {
            "local" => node = NODE,
            "terminating" => (ready, serving, terminating) = (false, true, true),
            "notready" => (ready, serving, terminating) = (false, false, false),
            other => panic!("unknown endpoint word {other}"),
        }
    }
    json!({
        "addresses": [ip],
        "nodeName": node,
        "conditions": {"ready": ready, "serving": serving, "terminating": terminating}
    })
}

pub fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Compares `actual` with `tests/golden/<name>.txt` byte for byte, or rewrites the file
/// when `UPDATE_GOLDEN=1`.
pub fn check_golden(name: &str, actual: &str) {
    let path = golden_dir().join(format!("{name}.txt"));
    if std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, actual).unwrap();
        // Not a pass: nothing was compared. Say so, so a stray UPDATE_GOLDEN is noticed.
        eprintln!("UPDATED (not compared): {}", path.display());
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}; run with UPDATE_GOLDEN=1 to create it",
            path.display()
        )
    });
    if let Some(diff) = golden_diff(&path.display().to_string(), &expected, actual) {
        panic!("golden mismatch for {name} (UPDATE_GOLDEN=1 to accept):\n{diff}");
    }
}

/// A unified diff from the golden file's content to `actual`, or `None` when they are
/// byte-identical.
pub fn golden_diff(golden: &str, expected: &str, actual: &str) -> Option<String> {
    if expected == actual {
        return None;
    }
    let diff = similar::TextDiff::from_lines(expected, actual)
        .unified_diff()
        .context_radius(3)
        .header(&format!("{golden} (expected)"), "rendered (actual)")
        .to_string();
    Some(diff)
}

/// Names the iptables variants this machine may skip (comma-separated: `legacy`, `nft`).
/// CI never sets it: there, a variant that does not work fails its tests.
pub const SKIP_VARIANTS_ENV: &str = "KPR_SKIP_IPTABLES_VARIANTS";

pub fn variant_name(variant: Variant) -> &'static str {
    match variant {
        Variant::Legacy => "legacy",
        Variant::Nft => "nft",
        other => panic!("tests pick a variant explicitly, not {other:?}"),
    }
}

/// Whether `KPR_SKIP_IPTABLES_VARIANTS` names `variant`; prints the skip when it does.
pub fn skip_requested(variant: Variant) -> bool {
    let listed = std::env::var(SKIP_VARIANTS_ENV).unwrap_or_default();
    let skip = listed.split(',').any(|name| name.trim() == variant_name(variant));
    if skip {
        eprintln!(
            "SKIPPED: iptables variant {} ({SKIP_VARIANTS_ENV} names it)",
            variant_name(variant)
        );
    }
    skip
}
