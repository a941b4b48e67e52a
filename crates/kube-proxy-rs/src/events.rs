//! The Events this process records about itself, and where they go.
//!
//! With an API server configured, Events go through kpr-events' `KubeRecorder` as upstream's
//! broadcaster writes them (reporting instance `kube-proxy-<host name>`); on manifests only,
//! to the log (`LogOnly`). Either way recording never waits. The recorder is handed on to
//! whoever else records (the Service health-check servers).

use std::sync::Arc;
use std::time::Duration;

use kpr_events::kube::{KubeRecorder, Reporter, upstream_reporter};
use kpr_events::{LogOnly, ProxyEvent, Recorder};
use kpr_servers::ServeError;

/// How long a process that is about to exit waits for the Event saying why.
const FLUSH_BEFORE_EXIT: Duration = Duration::from_secs(5);

pub struct ProxyEvents {
    recorder: Recorder,
    api: Option<KubeRecorder>,
    node_name: String,
}

impl ProxyEvents {
    /// Events to `api` when an API client is configured, to the log otherwise.
    pub fn new(api: Option<KubeRecorder>, node_name: &str) -> Self {
        let recorder: Recorder = match &api {
            Some(api) => Arc::new(api.clone()),
            None => Arc::new(LogOnly),
        };
        Self {
            recorder,
            api,
            node_name: node_name.to_string(),
        }
    }

    /// The shared recorder, for the other parts of the proxy that record Events (the Service
    /// health-check servers).
    pub fn recorder(&self) -> Recorder {
        Arc::clone(&self.recorder)
    }

    /// The start-up warnings (a deprecated mode, a defaulted one) as Warning Events on the
    /// Node, as upstream records them.
    pub fn start_up_warnings(&self, warnings: &[(&'static str, &'static str)]) {
        for (reason, message) in warnings {
            self.recorder
                .record(ProxyEvent::start_up_warning(&self.node_name, reason, message));
        }
    }

    /// Upstream's "birth cry": `Starting` on the Node once the proxy is up.
    pub fn started(&self) {
        self.recorder.record(ProxyEvent::starting(&self.node_name));
    }

    /// A server failed under `--bind-address-hard-fail` and the process is about to exit:
    /// records upstream's Event for it and gives it a moment to reach the API server.
    pub async fn server_failed(&self, error: &ServeError) {
        let Some(event) = server_failure_event(&self.node_name, error) else {
            return;
        };
        self.recorder.record(event);
        if let Some(api) = &self.api
            && !api.flush(FLUSH_BEFORE_EXIT).await
        {
            tracing::warn!("exiting before the API server took the event");
        }
    }
}

/// The reporter upstream's broadcaster uses, with this host's name (not the node name:
/// upstream takes `os.Hostname()`, blank when it cannot be read).
pub fn reporter() -> Reporter {
    let host = nix::unistd::gethostname()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    upstream_reporter(&host)
}

/// Upstream's Event for a server that cannot run. An invalid address is a configuration
/// error upstream's validation reports before anything starts: no Event.
fn server_failure_event(node_name: &str, error: &ServeError) -> Option<ProxyEvent> {
    let server = match error {
        ServeError::InvalidAddress { .. } => return None,
        ServeError::Bind { server, .. }
        | ServeError::Serve { server, .. }
        | ServeError::Task { server, .. } => *server,
    };
    match server {
        "healthz" => Some(ProxyEvent::healthz_server_failed(node_name, &error.to_string())),
        "metrics" => Some(ProxyEvent::metrics_server_failed(node_name, &error.to_string())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use kpr_metrics::{Metrics, ProxyHealth};
    use kpr_servers::{BindPolicy, HttpLimits, serve_healthz, serve_metrics};
    use prometheus_client::registry::Registry;

    use super::*;

    /// A port someone else holds, so a hard-failing server cannot bind it.
    fn taken_port() -> (TcpListener, String) {
        let holder = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = holder.local_addr().unwrap().to_string();
        (holder, address)
    }

    #[tokio::test]
    async fn a_server_that_cannot_bind_gets_upstreams_event() {
        let (_holder, address) = taken_port();
        let policy = BindPolicy::upstream(true);
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)));
        let error = serve_healthz(&address, health, metrics.clone(), policy, HttpLimits::HEALTHZ)
            .await
            .unwrap_err();
        let event = server_failure_event("node1", &error).unwrap();
        assert_eq!(event.reason, "FailedToStartProxierHealthcheck");
        assert_eq!(event.action, "StartKubeProxy");
        assert!(event.note.contains(&address), "{}", event.note);

        let config = serde_json::json!({});
        let error = serve_metrics(
            &address,
            Arc::new(registry),
            &metrics,
            "iptables",
            config,
            policy,
            HttpLimits::METRICS,
        )
        .await
        .unwrap_err();
        let event = server_failure_event("node1", &error).unwrap();
        assert_eq!(event.reason, "FailedToStartMetricServer");
    }

    #[test]
    fn an_invalid_address_is_a_usage_error_not_an_event() {
        let error = ServeError::InvalidAddress {
            server: "healthz",
            address: "nope".into(),
            reason: "not IP:port".into(),
        };
        assert_eq!(server_failure_event("node1", &error), None);
    }
}
