//! The proxy's own HTTP endpoints, answering as upstream kube-proxy does.
//!
//! Load balancers, kubelet probes and Prometheus already point at upstream's ports and paths,
//! so the healthz server (default `0.0.0.0:10256`: `/healthz`, `/livez`) and the metrics
//! server (default `127.0.0.1:10249`: `/metrics`, `/proxyMode`, `/configz`, `/healthz`) keep
//! upstream's paths, status codes, headers and bodies. Binding is its own step with its own
//! error, so the binary can honour `--bind-address-hard-fail`; serving then runs on a spawned
//! task until its [`ServerHandle`] is shut down or dropped.

mod handle;
mod healthz;
mod listen;
mod metrics_server;

pub use handle::{ServeError, ServerHandle};
pub use healthz::bind_healthz;
pub use metrics_server::{CONFIGZ_GROUP, OPENMETRICS_CONTENT_TYPE, bind_metrics};

#[cfg(test)]
mod test_client;
