//! The Service health-check servers: one small HTTP server per Service with
//! `externalTrafficPolicy: Local`, on its `healthCheckNodePort`, as upstream's
//! `ServiceHealthServer` runs them.
//!
//! A cloud load balancer sends such a Service's traffic only to nodes whose health-check
//! port answers 200, since a node without a local endpoint drops that traffic. Without these
//! servers every node looks unhealthy and the Service is down. What each server answers is
//! decided by [`kpr_state::health_checks`] from the state the last sync programmed; the
//! servers follow it after every successful sync ([`SyncObserver`]), as upstream's
//! `SyncServices`/`SyncEndpoints` do at the end of `syncProxyRules`.
//!
//! One set runs per IP family, as upstream's proxiers each have theirs. Each listens on
//! the family's own sockets (`0.0.0.0`, or `[::]` for IPv6 only) or, with
//! `nodePortAddresses`, on the family's matching node addresses, so the IPv4 and IPv6 sets
//! can both hold a dual-stack Service's single port (upstream's fix for kubernetes#114702).
//!
//! Opening a port can fail: another program holds it, or two Services claim it (the API
//! server prevents that, but a deletion and a re-use can arrive in one sync). Such a
//! Service is reported (an error log line, a Warning Event `FailedToStartServiceHealthcheck`
//! / `Listen` as upstream records it, and `kubeproxy_service_healthcheck_failures_total`)
//! and tried again on the next sync, which comes at least every sync period; the other
//! Services' servers are untouched. Of two claimants, the one already serving keeps the
//! port (a new one is refused), and among new ones the first by namespace/name gets it.
//! Binding and serving are kpr-servers' own machinery ([`crate::listen`]); a server that
//! stopped on an error is reopened at the next sync. The ports are reachable from the
//! network, so one connection budget ([`ServiceHealthConfig::limits`]) bounds all of a
//! family's ports together: a flood on one port evicts its own half-sent requests first,
//! and the descriptors and memory held stay within the one cap however many Services there
//! are. Per-port caps would multiply the bound by the number of Services, which the
//! cluster's users, not the node's operator, decide.

mod answer;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use kpr_events::{EventType, ObjectRef, ProxyEvent, Recorder};
use kpr_metrics::{HealthCheckFailureLabels, Metrics, ProxyHealth};
use kpr_model::{IpFamily, NamespacedName};
use kpr_state::{DesiredState, HealthCheck, HealthChecks, SyncObserver, health_checks, update_health_checks};
use tokio::sync::watch;

use crate::connections::Budget;
use crate::handle::{ServeError, ServerHandle};
use crate::limits::HttpLimits;
use crate::listen::{BindPolicy, ListenOn, UPSTREAM_RETRY_INTERVAL, start_on};
use answer::Probe;

/// The server name in logs and errors.
const SERVER: &str = "service-healthcheck";

/// Upstream's Event for a port that cannot be opened.
pub const FAILED_EVENT_REASON: &str = "FailedToStartServiceHealthcheck";
pub const FAILED_EVENT_ACTION: &str = "Listen";

/// A failed bind is the manager's to report and retry (on the next sync), never the
/// server task's: the task would retry silently and nobody would hear of it.
const BIND_ONCE: BindPolicy = BindPolicy {
    hard_fail: true,
    retry_interval: UPSTREAM_RETRY_INTERVAL,
};

/// Where the health-check servers listen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HealthCheckAddresses {
    /// Every address of the family (upstream's default): `0.0.0.0`, or `[::]` (IPv6 only).
    Any,
    /// These node addresses (upstream: the node's IPs inside `nodePortAddresses`). Addresses
    /// of the other family are ignored; none at all means nothing listens, as upstream.
    Ips(Vec<IpAddr>),
}

/// What one family's set of health-check servers needs to know about the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceHealthConfig {
    pub family: IpFamily,
    /// This node's name, for the Events' text.
    pub node_name: String,
    pub addresses: HealthCheckAddresses,
    /// One budget for every port of the set ([`HttpLimits::SERVICE_HEALTH`] in production):
    /// the connections it holds do not grow with the number of Services.
    pub limits: HttpLimits,
}

/// Why a Service's health-check port is not open.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("port {port} already serves the health check of Service {holder}")]
    ClaimedTwice { port: u16, holder: NamespacedName },
    #[error(transparent)]
    Listen(#[from] ServeError),
}

impl OpenError {
    /// The metric's `reason` label.
    fn reason(&self) -> &'static str {
        match self {
            Self::ClaimedTwice { .. } => "port_claimed_twice",
            Self::Listen(ServeError::Bind { source, .. })
                if source.kind() == std::io::ErrorKind::AddrInUse =>
            {
                "port_in_use"
            }
            Self::Listen(_) => "listen_error",
        }
    }
}

/// One family's health-check servers, following the synced state from a task of their own
/// (so a sync never waits for a socket). Dropping the last handle closes every server.
#[derive(Debug)]
pub struct ServiceHealthServers {
    wanted: watch::Sender<Option<Arc<HealthChecks>>>,
    /// What the last sync asked for, updated in place by the next one.
    checks: std::sync::Mutex<HealthChecks>,
}

impl ServiceHealthServers {
    /// Starts the (still empty) set on the current tokio runtime.
    pub fn start(
        config: ServiceHealthConfig,
        health: Arc<ProxyHealth>,
        metrics: Metrics,
        recorder: Recorder,
    ) -> Self {
        let (wanted, updates) = watch::channel(None);
        let manager = Manager::new(config, health, metrics, recorder);
        tokio::spawn(manager.follow(updates));
        Self {
            wanted,
            checks: std::sync::Mutex::default(),
        }
    }

    /// Makes `checks` the wanted set: the task opens, closes and updates servers to match,
    /// and retries the ports that failed. Returns at once.
    fn update(&self, checks: HealthChecks) {
        self.wanted.send_replace(Some(Arc::new(checks)));
    }
}

impl SyncObserver for ServiceHealthServers {
    /// Derives the checks here, on the sync's thread, so only the small map travels and
    /// the state's snapshots are not kept alive; after a partial sync from the changed
    /// Services only. Sent after every sync, changed or not: each one retries the ports
    /// that failed to open, as upstream's.
    fn synced(&self, state: &DesiredState, changed: Option<&BTreeSet<NamespacedName>>) {
        let mut checks = self.checks.lock().unwrap_or_else(|p| p.into_inner());
        match changed {
            None => *checks = health_checks(state),
            Some(changed) => {
                update_health_checks(&mut checks, state, changed);
            }
        }
        self.update(checks.clone());
    }
}

/// The servers of one Service.
#[derive(Debug)]
struct Open {
    port: u16,
    probe: Arc<Probe>,
    servers: Vec<ServerHandle>,
}

impl Open {
    /// A server stopped on an error (its task ended): the Service must be opened again.
    fn broken(&self) -> bool {
        self.servers.iter().any(|server| server.local_addr().is_none())
    }

    async fn close(self) {
        self.probe.close();
        for server in self.servers {
            server.close().await;
        }
    }
}

/// The set's state, owned by its task.
struct Manager {
    config: ServiceHealthConfig,
    health: Arc<ProxyHealth>,
    metrics: Metrics,
    recorder: Recorder,
    /// Shared by every server of the set.
    budget: Arc<Budget>,
    open: BTreeMap<NamespacedName, Open>,
}

impl Manager {
    fn new(
        config: ServiceHealthConfig,
        health: Arc<ProxyHealth>,
        metrics: Metrics,
        recorder: Recorder,
    ) -> Self {
        if let HealthCheckAddresses::Ips(ips) = &config.addresses
            && !ips.iter().any(|ip| config.family.matches(ip))
        {
            tracing::warn!(
                ip_family = config.family.label(),
                "no node address matches nodePortAddresses: Service health-check ports will not listen"
            );
        }
        let budget = Budget::new(SERVER, config.limits, &metrics);
        Self {
            config,
            health,
            metrics,
            recorder,
            budget,
            open: BTreeMap::new(),
        }
    }

    /// The Services with open servers and the servers themselves (kpr_model::Sizes). Only
    /// the churn test asks: the manager lives inside its own task.
    #[cfg(test)]
    fn footprint(&self) -> kpr_model::Sizes {
        kpr_model::Sizes::new()
            .with("open", self.open.len())
            .with("servers", self.open.values().map(|o| o.servers.len()).sum())
    }

    /// Applies every update until the sender goes away, then closes everything.
    async fn follow(mut self, mut updates: watch::Receiver<Option<Arc<HealthChecks>>>) {
        while updates.changed().await.is_ok() {
            let wanted = updates.borrow_and_update().clone();
            if let Some(wanted) = wanted {
                self.apply(&wanted).await;
            }
        }
        self.close_all().await;
    }

    /// Upstream's `SyncServices` then `SyncEndpoints`: close what is no longer wanted (or
    /// moved, or broke), open what is missing (reporting failures), update the counts.
    async fn apply(&mut self, wanted: &HealthChecks) {
        self.close_unwanted(wanted).await;
        for (service, check) in wanted {
            match self.open.get(service) {
                Some(open) => open.probe.set_local_endpoints(check.local_endpoints),
                None => self.open_or_report(service, check).await,
            }
        }
    }

    async fn close_unwanted(&mut self, wanted: &HealthChecks) {
        let closing: Vec<NamespacedName> = self
            .open
            .iter()
            .filter(|(service, open)| {
                let moved = wanted.get(*service).is_none_or(|check| check.node_port != open.port);
                if open.broken() && !moved {
                    tracing::warn!(service = %service, port = open.port, "health check server stopped; reopening");
                }
                moved || open.broken()
            })
            .map(|(service, _)| service.clone())
            .collect();
        for service in closing {
            if let Some(open) = self.open.remove(&service) {
                tracing::debug!(service = %service, port = open.port, "closing health check");
                open.close().await;
            }
        }
    }

    async fn open_or_report(&mut self, service: &NamespacedName, check: &HealthCheck) {
        match self.open_one(service, check).await {
            Ok(open) => {
                tracing::debug!(service = %service, port = check.node_port, "opened health check");
                self.open.insert(service.clone(), open);
            }
            Err(error) => self.report(service, check.node_port, &error),
        }
    }

    /// Listens on every address, or on none: a partly open Service is closed again so the
    /// next attempt starts clean (upstream's `closeAll` on failure).
    async fn open_one(&self, service: &NamespacedName, check: &HealthCheck) -> Result<Open, OpenError> {
        if let Some(holder) = self.holder_of(check.node_port) {
            return Err(OpenError::ClaimedTwice {
                port: check.node_port,
                holder: holder.clone(),
            });
        }
        let probe = Arc::new(Probe::new(
            service.clone(),
            check.local_endpoints,
            self.health.clone(),
        ));
        let mut servers = Vec::new();
        for on in self.listen_on(check.node_port) {
            let budget = self.budget.clone();
            match start_on(on, answer::router(probe.clone()), BIND_ONCE, budget).await {
                Ok(server) => servers.push(server),
                Err(error) => {
                    for server in servers {
                        server.close().await;
                    }
                    return Err(error.into());
                }
            }
        }
        Ok(Open {
            port: check.node_port,
            probe,
            servers,
        })
    }

    fn holder_of(&self, port: u16) -> Option<&NamespacedName> {
        self.open
            .iter()
            .find(|(_, open)| open.port == port)
            .map(|(service, _)| service)
    }

    fn listen_on(&self, port: u16) -> Vec<ListenOn> {
        let family = self.config.family;
        let ips = match &self.config.addresses {
            HealthCheckAddresses::Any => vec![match family {
                IpFamily::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                IpFamily::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            }],
            HealthCheckAddresses::Ips(ips) => ips.iter().copied().filter(|ip| family.matches(ip)).collect(),
        };
        ips.into_iter()
            .map(|ip| ListenOn {
                addr: SocketAddr::new(ip, port),
                v6_only: true,
            })
            .collect()
    }

    /// A log line, upstream's Warning Event and the metric; retried at the next sync.
    fn report(&self, service: &NamespacedName, port: u16, error: &OpenError) {
        let node = &self.config.node_name;
        tracing::error!(%node, service = %service, port, "failed to start health check (retried at the next sync): {error}");
        self.recorder.record(ProxyEvent {
            regarding: ObjectRef {
                // Upstream puts namespace/name where the UID goes.
                uid: Some(service.to_string()),
                ..ObjectRef::service(&service.namespace, &service.name)
            },
            event_type: EventType::Warning,
            reason: FAILED_EVENT_REASON,
            action: FAILED_EVENT_ACTION,
            note: format!(
                "node {node} failed to start healthcheck {:?} on port {port}: {error}",
                service.to_string()
            ),
        });
        self.metrics
            .service_healthcheck_failures_total
            .get_or_create(&HealthCheckFailureLabels {
                ip_family: self.config.family.label(),
                reason: error.reason(),
            })
            .inc();
    }

    async fn close_all(&mut self) {
        for (_, open) in std::mem::take(&mut self.open) {
            open.close().await;
        }
    }
}
