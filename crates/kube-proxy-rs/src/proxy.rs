//! Running the proxy: sources, sync loop, backend and HTTP servers, until SIGTERM.
//!
//! Rules stay in the kernel when the process exits, as upstream leaves them: a restart (or a
//! rolling update of the DaemonSet) must not interrupt traffic. `--cleanup` removes them.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kpr_config::{LocalMode, Settings};
use kpr_events::kube::KubeRecorder;
use kpr_host::{HostFacts, NodeFacts, NodeIps, ProcSysctl};
use kpr_metrics::{Metrics, ProxyHealth};
use kpr_mode::{Fatal, Mode, ModeContext};
use kpr_model::NodeView;
use kpr_runner::RunnerConfig;
use kpr_servers::{BindPolicy, HttpLimits, ServeError, ServerHandle, serve_healthz, serve_metrics};
use kpr_sources::{
    API_SOURCE, ApiSource, ClientOptions, EventSender, MANIFESTS_SOURCE, ManifestSource, build_client,
    event_channel,
};
use kpr_sync::ProxySettings;
use prometheus_client::registry::Registry;
use tokio::signal::unix::{SignalKind, signal};

use crate::events::{self, ProxyEvents};
use crate::families::{Support, check_config, choose_families};
use crate::mode::{self, ServiceHealthDeps};
use crate::node::{self, NodeWait, NodeWatch, node_name};

/// Upstream's oom_score_adj write, best effort: a proxy killed under memory pressure takes
/// every service on the node down with it.
fn adjust_oom_score(value: i32) {
    if let Err(error) = std::fs::write("/proc/self/oom_score_adj", value.to_string()) {
        tracing::warn!(%error, value, "cannot set oom_score_adj");
    }
}

fn set_conntrack_sysctls(settings: &Settings) {
    for failure in kpr_host::conntrack::apply(&settings.config.conntrack, &ProcSysctl::default()) {
        tracing::warn!("cannot apply conntrack setting {failure}");
    }
}

fn duration(value: kpr_config::GoDuration, what: &str) -> Result<Duration, Fatal> {
    value
        .to_std()
        .ok_or_else(|| Fatal::usage(format!("{what} must not be negative (got {value})")))
}

pub async fn run(settings: Settings) -> Result<(), Fatal> {
    let config = &settings.config;
    let node_name = node_name(&config.hostname_override).map_err(Fatal::runtime)?;
    let sync_period = duration(config.sync_period(), "syncPeriod")?;
    let mut proxy_settings = ProxySettings {
        node_name: node_name.clone(),
        runner: RunnerConfig {
            min_interval: duration(config.min_sync_period(), "minSyncPeriod")?,
            max_interval: sync_period,
        },
        sources: Vec::new(),
    };
    let rescan = duration(config.config_sync_period, "configSyncPeriod")?;
    let (events_tx, mut events) = event_channel();
    let chosen = mode::implementation(settings.mode);
    let (sources, api_recorder) = start_sources(&settings, chosen, &node_name, rescan).await?;
    let proxy_events = ProxyEvents::new(api_recorder, &node_name);
    proxy_events.start_up_warnings(&mode::start_up_warnings(chosen, &settings));
    for source in sources {
        proxy_settings.sources.push(source.name());
        tokio::spawn(source.run(events_tx.clone()));
    }
    drop(events_tx);

    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    chosen.register_metrics(&settings, &mut registry);
    // Upstream's healthTimeout: two sync periods without applying a queued change.
    let health = Arc::new(ProxyHealth::new(sync_period * 2));
    // Serving before the Node is read (upstream serves after): a proxy waiting for its Node
    // is starting, which is healthy, and probes should not restart it for that.
    let servers = if settings.dry_run || settings.init_only {
        None
    } else {
        Some(serve_http(&settings, &health, &metrics, registry, &proxy_events).await?)
    };

    // Upstream's start-up order: the Node (node IPs, pod CIDRs), the families the host can
    // serve, the configuration checked against them, then the proxiers.
    let waited = node::wait_for_node(&mut events, &node_wait(&settings, &proxy_settings))
        .await
        .map_err(|e| Fatal::runtime(e.to_string()))?;
    let facts = node_facts(&settings, node_name.clone(), waited.node.as_ref());
    let families = choose_families(chosen, facts.ips.primary_family, Support::of(chosen))?;
    check_config(&settings, &facts, &families)?;
    let host = HostFacts::read(&settings, &facts).map_err(|e| Fatal::usage(e.to_string()))?;
    let context = ModeContext {
        settings: &settings,
        node: &facts,
        host: &host,
        sync_period,
    };
    if settings.init_only {
        // Upstream's split: a privileged init container prepares the host, then the proxy
        // itself runs with only NET_ADMIN and NET_RAW.
        set_conntrack_sysctls(&settings);
        return mode::init_only(chosen, &context, &families);
    }
    let node_watch = NodeWatch {
        node_name: node_name.clone(),
        node_ips: waited.node.as_ref().map(node::node_host_ips).unwrap_or_default(),
        pod_cidrs: (settings.local_mode == LocalMode::NodeCidr).then(|| facts.pod_cidrs.clone()),
    };
    let (events, restart) = node::forward_events(events, waited.buffered, node_watch);
    if settings.dry_run {
        let states = kpr_sync::initial_states(&proxy_settings, &families, events, metrics, health).await;
        print!("{}", mode::dry_run(chosen, &context, &states)?);
        return Ok(());
    }
    let (healthz, metrics_server) = servers.unwrap_or_default();

    adjust_oom_score(config.oom_score_adj());
    set_conntrack_sysctls(&settings);
    let service_health = ServiceHealthDeps {
        health: health.clone(),
        metrics: metrics.clone(),
        recorder: proxy_events.recorder(),
    };
    let backends = mode::backends(chosen, &context, &families, &service_health)?;
    tracing::info!(node = %node_name, mode = %settings.mode, families = ?families, "kube-proxy-rs starting");
    proxy_events.started();
    let proxy = kpr_sync::run(proxy_settings, backends, events, metrics, health);
    tokio::select! {
        stopped = proxy => match stopped {
            kpr_sync::Stopped::Fatal(why) => {
                chosen.abandon_start(&settings);
                Err(Fatal::runtime(why))
            }
            kpr_sync::Stopped::SourcesEnded => Err(Fatal::runtime("the sync loop stopped: its event sources ended")),
        },
        result = shutdown_signal() => {
            chosen.on_shutdown(&families);
            result
        }
        error = server_failure(healthz, metrics_server) => {
            proxy_events.server_failed(&error).await;
            Err(Fatal::runtime(error.to_string()))
        }
        why = restart_needed(restart) => Err(Fatal::runtime(why)),
    }
}

/// What start-up waits for: the Node's addresses (as long as upstream retries when the API
/// source can bring the Node later; else the sources' initial state), and with NodeCIDR
/// local detection its pod CIDRs.
fn node_wait(settings: &Settings, proxy: &ProxySettings) -> NodeWait {
    NodeWait {
        node_name: proxy.node_name.clone(),
        sources: proxy.sources.iter().copied().collect(),
        node_ips_for: proxy.sources.contains(&API_SOURCE).then_some(node::NODE_IPS_WAIT),
        pod_cidrs_for: (settings.local_mode == LocalMode::NodeCidr).then_some(node::POD_CIDRS_WAIT),
    }
}

/// The node's facts from `--bind-address` and the Node object, if it came.
fn node_facts(settings: &Settings, name: String, node: Option<&NodeView>) -> NodeFacts {
    let raw = node.map(node::node_host_ips).unwrap_or_default();
    NodeFacts {
        name,
        ips: NodeIps::detect(&raw, &settings.config.bind_address),
        pod_cidrs: node.map(|n| n.pod_cidrs.clone()).unwrap_or_default(),
    }
}

/// Resolves with the reason when the node's facts changed in a way only a restart can
/// follow; never otherwise.
async fn restart_needed(restart: tokio::sync::oneshot::Receiver<String>) -> String {
    match restart.await {
        Ok(why) => why,
        Err(_) => std::future::pending().await,
    }
}

/// The healthz and metrics servers (either may be disabled with a blank address). A busy
/// port is retried every 5 s as upstream does, or is fatal with `--bind-address-hard-fail`.
/// Both hold their connections within [`HttpLimits`] (upstream's have no bounds).
async fn serve_http(
    settings: &Settings,
    health: &Arc<ProxyHealth>,
    metrics: &Metrics,
    registry: Registry,
    proxy_events: &ProxyEvents,
) -> Result<(Option<ServerHandle>, Option<ServerHandle>), Fatal> {
    let config = &settings.config;
    let policy = BindPolicy::upstream(config.bind_address_hard_fail);
    let healthz = serve_healthz(
        &config.healthz_bind_address,
        health.clone(),
        metrics.clone(),
        policy,
        HttpLimits::HEALTHZ,
    )
    .await;
    let healthz = reported(healthz, proxy_events).await?;
    let metrics_server = serve_metrics(
        &config.metrics_bind_address,
        Arc::new(registry),
        metrics,
        settings.mode.as_str(),
        config.to_json_value(),
        policy,
        HttpLimits::METRICS,
    )
    .await;
    let metrics_server = reported(metrics_server, proxy_events).await?;
    Ok((healthz, metrics_server))
}

/// A server that cannot start is fatal (under `--bind-address-hard-fail`): upstream records
/// an Event on the Node before it exits.
async fn reported(
    started: Result<Option<ServerHandle>, ServeError>,
    proxy_events: &ProxyEvents,
) -> Result<Option<ServerHandle>, Fatal> {
    match started {
        Ok(handle) => Ok(handle),
        Err(error) => {
            proxy_events.server_failed(&error).await;
            Err(server_fatal(error))
        }
    }
}

/// Upstream exits when a server cannot start under `--bind-address-hard-fail`; an address
/// that is not IP:port (validation normally catches it) is the operator's to fix.
fn server_fatal(error: ServeError) -> Fatal {
    match error {
        ServeError::InvalidAddress { .. } => Fatal::usage(error.to_string()),
        _ => Fatal::runtime(error.to_string()),
    }
}

/// The sources this configuration asks for: manifests when `--manifests` is given, the API
/// when a kubeconfig or `--master` is given, or, with neither, the API through the pod's
/// service account (upstream's in-cluster default). With the API comes the Event recorder
/// on the same client, as upstream's.
async fn start_sources(
    settings: &Settings,
    mode: &dyn Mode,
    node_name: &str,
    rescan: Duration,
) -> Result<(Vec<Source>, Option<KubeRecorder>), Fatal> {
    let mut sources = Vec::new();
    let mut api_recorder = None;
    if !settings.manifests.is_empty() {
        let mut manifests =
            ManifestSource::new(settings.manifests.clone(), Some(node_name.to_string()), rescan)
                .map_err(|e| Fatal::usage(e.to_string()))?;
        if let Some(range) = settings.service_node_port_range.clone() {
            manifests = manifests.node_port_range(range);
        }
        if let Some(bytes) = settings.manifests_max_file_bytes {
            manifests = manifests.max_file_bytes(bytes);
        }
        sources.push(Source::Manifests(manifests));
    }
    let api_asked = settings.kubeconfig().is_some() || settings.master.is_some();
    if api_asked || sources.is_empty() {
        let options = ClientOptions {
            kubeconfig: settings.kubeconfig().map(Path::to_path_buf),
            master: settings.master.clone(),
            content_type: settings.config.client_connection.content_type.clone(),
        };
        let client = build_client(&options)
            .await
            .map_err(|e| Fatal::usage(e.to_string()))?;
        api_recorder = Some(KubeRecorder::start(client.clone(), events::reporter()));
        let mut api = ApiSource::new(client, node_name);
        if mode.uses_service_cidrs() {
            api = api.with_service_cidrs();
        }
        sources.push(Source::Api(api));
    }
    Ok((sources, api_recorder))
}

enum Source {
    Manifests(ManifestSource),
    Api(ApiSource),
}

impl Source {
    fn name(&self) -> &'static str {
        match self {
            Self::Manifests(_) => MANIFESTS_SOURCE,
            Self::Api(_) => API_SOURCE,
        }
    }

    async fn run(self, events: EventSender) {
        match self {
            Self::Manifests(source) => source.run(events).await,
            Self::Api(source) => source.run(events).await,
        }
    }
}

/// SIGTERM (kubelet stopping the pod) or SIGINT ends the process cleanly, rules in place.
async fn shutdown_signal() -> Result<(), Fatal> {
    let mut term =
        signal(SignalKind::terminate()).map_err(|e| Fatal::runtime(format!("SIGTERM handler: {e}")))?;
    let mut int =
        signal(SignalKind::interrupt()).map_err(|e| Fatal::runtime(format!("SIGINT handler: {e}")))?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: exiting, rules stay in place"),
        _ = int.recv() => tracing::info!("SIGINT: exiting, rules stay in place"),
    }
    Ok(())
}

/// Resolves only if a running server stops with an error (with `--bind-address-hard-fail`;
/// otherwise servers retry on their own).
async fn server_failure(healthz: Option<ServerHandle>, metrics: Option<ServerHandle>) -> ServeError {
    let wait = |handle: Option<ServerHandle>| async move {
        match handle {
            Some(mut handle) => match handle.wait().await {
                Err(error) => error,
                Ok(()) => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        error = wait(healthz) => error,
        error = wait(metrics) => error,
    }
}
