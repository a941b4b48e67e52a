//! What the proxy reports about itself.
//!
//! [`Metrics`] registers every metric all modes share under upstream's names (prefix
//! `kubeproxy_`; a mode registers the ones only it has, as upstream's `RegisterMetrics`), so
//! dashboards and alerts written for upstream kube-proxy keep working. Histogram buckets are
//! upstream's too; `network_programming_duration_seconds` adds finer bounds below upstream's
//! first (0.25 s) and keeps all of upstream's, so a p99 of tens of milliseconds can be read
//! while upstream's queries still see the series they expect. [`ProxyHealth`] is
//! the state behind `/healthz` and `/livez`. Both are plain shared state: the sync loop and
//! the sources write them, the HTTP servers read them.

mod health;
mod registry;

pub use health::{HealthReport, ProxyHealth};
pub use registry::{
    CodeLabels, FamilyLabels, HealthCheckFailureLabels, HttpRejectedLabels, HttpServerLabels, Metrics,
    RejectedLabels, TrafficLabels,
};
