//! What the proxy reports about itself.
//!
//! [`Metrics`] registers every metric under upstream's names (prefix `kubeproxy_`), so
//! dashboards and alerts written for upstream kube-proxy keep working. [`ProxyHealth`] is
//! the state behind `/healthz` and `/livez`. Both are plain shared state: the sync loop and
//! the sources write them, the HTTP servers read them.

mod health;
mod nfacct;
mod registry;

pub use health::{HealthReport, ProxyHealth};
pub use nfacct::{IptablesCounter, PacketCounters, register_nfacct_metrics};
pub use registry::{
    CodeLabels, FamilyLabels, HealthCheckFailureLabels, Metrics, RejectedLabels, TableLabels, TrafficLabels,
};
