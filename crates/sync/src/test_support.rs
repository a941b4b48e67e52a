//! Test support shared by the intake tests and the sync-loop tests: the settings both run
//! with, API objects (from kpr-world) as a source reports them, and the metrics as text.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kpr_model::{IpFamily, NamespacedName};
use kpr_runner::RunnerConfig;
use kpr_sources::Event;
use prometheus_client::registry::Registry;
use serde_json::Value;

use crate::ProxySettings;

/// The node every test's proxy runs on.
pub(crate) const NODE_NAME: &str = "node1";

/// The family of a single-stack test proxy.
pub(crate) const FAMILY: IpFamily = IpFamily::V4;

/// On [`NODE_NAME`], at most one sync per 20 ms (none forced by the period), waiting for
/// `sources`.
pub(crate) fn settings(sources: Vec<&'static str>) -> ProxySettings {
    ProxySettings {
        node_name: NODE_NAME.into(),
        runner: RunnerConfig {
            min_interval: Duration::from_millis(20),
            max_interval: Duration::from_secs(3600),
        },
        sources,
    }
}

/// Service `default/<name>` with `spec`, as a source reports it.
pub(crate) fn service_event(name: &str, spec: Value) -> Event {
    Event::Service {
        id: NamespacedName::new(kpr_world::NAMESPACE, name),
        object: Some(Arc::new(kpr_world::service_object(name, spec))),
    }
}

/// `slice`, as a source reports it.
pub(crate) fn slice_event(slice: EndpointSlice) -> Event {
    let namespace = slice
        .metadata
        .namespace
        .as_deref()
        .unwrap_or(kpr_world::NAMESPACE);
    let name = slice.metadata.name.as_deref().unwrap_or_default();
    Event::EndpointSlice {
        id: NamespacedName::new(namespace, name),
        object: Some(Arc::new(slice)),
    }
}

/// This proxy's Node, as the API source reports it.
pub(crate) fn node_event(node: Node) -> Event {
    Event::Node {
        object: Some(Arc::new(node)),
    }
}

/// Everything in `registry`, in Prometheus' text format.
pub(crate) fn metrics_text(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("text encoding into a String");
    text
}
