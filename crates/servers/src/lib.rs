//! The proxy's own HTTP endpoints, answering as upstream kube-proxy does.
//!
//! Load balancers, kubelet probes and Prometheus already point at upstream's ports and paths,
//! so the healthz server (default `0.0.0.0:10256`: `/healthz`, `/livez`) and the metrics
//! server (default `127.0.0.1:10249`: `/metrics`, `/metrics/slis`, `/proxyMode`, `/configz`,
//! `/healthz`) keep upstream's paths, status codes, headers and bodies. The metrics are
//! written in the Prometheus text format, as upstream writes them, unless a scraper asks for
//! OpenMetrics ([`Format`]). A port that is busy is retried every
//! 5 s as upstream does ([`BindPolicy`]), or, with `--bind-address-hard-fail`, reported as an
//! error before serving starts; serving runs on a spawned task until its [`ServerHandle`] is
//! shut down or dropped.
//!
//! The Service health-check servers ([`ServiceHealthServers`]) come and go with the Services
//! that need them, on the same listening and serving machinery.
//!
//! Every server holds its connections within [`HttpLimits`]: a cap on connections where a
//! newcomer evicts the oldest connection without a complete request, a short timeout for a
//! request head, an idle timeout for kept-alive connections, and bounded request heads and
//! bodies. What the servers refuse or close is counted
//! (`kubeproxy_http_connections_rejected_total{server,reason}`), never logged per connection.

mod connection;
mod connections;
mod exposition;
mod handle;
mod healthz;
mod limits;
mod listen;
mod metrics_server;
mod ping;
mod service_health;
mod slis;

pub use exposition::{Format, OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, encode as encode_metrics};
pub use handle::{ServeError, ServerHandle};
pub use healthz::serve_healthz;
pub use limits::HttpLimits;
pub use listen::{BindPolicy, UPSTREAM_RETRY_INTERVAL};
pub use metrics_server::{CONFIGZ_GROUP, serve_metrics};
pub use service_health::{
    FAILED_EVENT_ACTION, FAILED_EVENT_REASON, HealthCheckAddresses, OpenError, ServiceHealthConfig,
    ServiceHealthServers,
};

#[cfg(test)]
mod test_client;
