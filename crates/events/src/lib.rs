//! Kubernetes Events the proxy records, behind one small trait.
//!
//! Upstream kube-proxy records a handful of Events (its start-up on the Node, a Service
//! health-check node port it cannot open, ...). Whoever notices such a moment (the binary,
//! the service health-check servers) only describes it as a [`ProxyEvent`] and hands it to an
//! [`EventRecorder`]; how it reaches the API server (kube-rs' recorder, or nowhere when the
//! proxy runs on manifests only) is the recorder's business. Recording never blocks the
//! caller and never fails it: an Event is a courtesy to the operator, not part of the
//! dataplane.
//!
//! Which Events upstream records today, and so which we record: `Starting` on the Node when
//! the proxy is up ([`ProxyEvent::starting`]); `FailedToStartProxierHealthcheck` /
//! `FailedToStartMetricServer` on the Node when a server cannot run under
//! `--bind-address-hard-fail`; `FailedToStartServiceHealthcheck` on a Service whose
//! health-check node port cannot be opened. Upstream no longer records
//! `KubeProxyIncorrectIPVersion` for objects of the other IP family (its trackers drop them
//! quietly per family since dual-stack became the default), so neither do we.

pub mod kube;

use std::fmt;
use std::sync::Arc;

/// `Normal` or `Warning`, as the Events API spells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The object an Event is about (its `regarding` / `involvedObject`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ObjectRef {
    /// `Node`, `Service`, ...
    pub kind: &'static str,
    /// `v1` for core kinds; empty where upstream leaves it out (its Node reference).
    pub api_version: &'static str,
    /// Empty for cluster-scoped objects (Nodes).
    pub namespace: String,
    pub name: String,
    /// The object's UID when known; upstream puts the node name there for Nodes.
    pub uid: Option<String>,
}

impl ObjectRef {
    /// This proxy's Node, as upstream refers to it: the node name doubles as UID (kubelet
    /// does the same, and `kubectl describe node` looks Events up that way), no apiVersion.
    pub fn node(name: &str) -> Self {
        Self {
            kind: "Node",
            api_version: "",
            namespace: String::new(),
            name: name.to_string(),
            uid: Some(name.to_string()),
        }
    }

    /// A Service by namespace and name.
    pub fn service(namespace: &str, name: &str) -> Self {
        Self {
            kind: "Service",
            api_version: "v1",
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: None,
        }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// One Event: what happened to which object, in upstream's words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyEvent {
    pub regarding: ObjectRef,
    pub event_type: EventType,
    /// Upstream's reason, e.g. `Starting`, `FailedToStartServiceHealthcheck`.
    pub reason: &'static str,
    /// Upstream's action, e.g. `StartKubeProxy`, `Listen`.
    pub action: &'static str,
    /// Human-readable text.
    pub note: String,
}

/// Upstream's action for the Events about the proxy's own start-up.
const START_KUBE_PROXY: &str = "StartKubeProxy";

impl ProxyEvent {
    /// Upstream's "birth cry" once sources, servers and the sync loop are started.
    pub fn starting(node_name: &str) -> Self {
        Self {
            regarding: ObjectRef::node(node_name),
            event_type: EventType::Normal,
            reason: "Starting",
            action: START_KUBE_PROXY,
            note: String::new(),
        }
    }

    /// The healthz server cannot run and `--bind-address-hard-fail` makes that fatal.
    pub fn healthz_server_failed(node_name: &str, error: &str) -> Self {
        Self::start_up_failure(node_name, "FailedToStartProxierHealthcheck", error)
    }

    /// The metrics server cannot run and `--bind-address-hard-fail` makes that fatal.
    pub fn metrics_server_failed(node_name: &str, error: &str) -> Self {
        Self::start_up_failure(node_name, "FailedToStartMetricServer", error)
    }

    /// A warning about how the proxy was started (a deprecated mode, a defaulted one).
    pub fn start_up_warning(node_name: &str, reason: &'static str, note: &str) -> Self {
        Self::start_up_failure(node_name, reason, note)
    }

    fn start_up_failure(node_name: &str, reason: &'static str, error: &str) -> Self {
        Self {
            regarding: ObjectRef::node(node_name),
            event_type: EventType::Warning,
            reason,
            action: START_KUBE_PROXY,
            note: error.to_string(),
        }
    }
}

/// Where Events go. Implementations must return at once (queue, then send elsewhere).
pub trait EventRecorder: Send + Sync + fmt::Debug {
    fn record(&self, event: ProxyEvent);
}

/// Shared handle to a recorder.
pub type Recorder = Arc<dyn EventRecorder>;

/// Records nothing but a log line: for proxies without an API server (manifests only).
#[derive(Clone, Copy, Debug, Default)]
pub struct LogOnly;

impl EventRecorder for LogOnly {
    fn record(&self, event: ProxyEvent) {
        tracing::debug!(
            object = %event.regarding,
            r#type = %event.event_type,
            reason = event.reason,
            action = event.action,
            "event (not recorded: no API server): {}",
            event.note
        );
    }
}

/// A recorder that keeps what it is given, for tests of the code that records.
#[derive(Debug, Default)]
pub struct Collected(std::sync::Mutex<Vec<ProxyEvent>>);

impl Collected {
    pub fn events(&self) -> Vec<ProxyEvent> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl EventRecorder for Collected {
    fn record(&self, event: ProxyEvent) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_refs_name_themselves_like_kubectl() {
        assert_eq!(ObjectRef::node("worker-1").to_string(), "Node worker-1");
        assert_eq!(ObjectRef::node("worker-1").uid.as_deref(), Some("worker-1"));
        assert_eq!(ObjectRef::node("worker-1").api_version, "");
        assert_eq!(ObjectRef::service("shop", "web").to_string(), "Service shop/web");
    }

    #[test]
    fn start_up_events_are_upstreams() {
        let start = ProxyEvent::starting("worker-1");
        assert_eq!(
            (start.event_type, start.reason, start.action, start.note.as_str()),
            (EventType::Normal, "Starting", "StartKubeProxy", "")
        );
        assert_eq!(start.regarding, ObjectRef::node("worker-1"));
        let healthz = ProxyEvent::healthz_server_failed("worker-1", "address in use");
        assert_eq!(
            (healthz.event_type, healthz.reason, healthz.action),
            (
                EventType::Warning,
                "FailedToStartProxierHealthcheck",
                "StartKubeProxy"
            )
        );
        assert_eq!(healthz.note, "address in use");
        let metrics = ProxyEvent::metrics_server_failed("worker-1", "address in use");
        assert_eq!(metrics.reason, "FailedToStartMetricServer");
    }

    #[test]
    fn collected_keeps_events_in_order() {
        let recorder = Collected::default();
        for reason in ["Starting", "FailedToStartServiceHealthcheck"] {
            recorder.record(ProxyEvent {
                regarding: ObjectRef::node("n"),
                event_type: EventType::Normal,
                reason,
                action: "Test",
                note: String::new(),
            });
        }
        let reasons: Vec<_> = recorder.events().iter().map(|e| e.reason).collect();
        assert_eq!(reasons, ["Starting", "FailedToStartServiceHealthcheck"]);
    }
}
