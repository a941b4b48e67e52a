//! NodePorts on the loopback address, TCP (upstream 1.37, KEP-6032; the gate
//! `KubeProxyNFTablesLocalhostNodePorts`): a listener on `127.0.0.1:<nodePort>` (or
//! `[::1]:<nodePort>`) per TCP NodePort with usable endpoints, carrying its connections in
//! this process to the endpoints the NodePort rules would choose.
//!
//! Why a proxy: nf_tables cannot send a packet addressed to the loopback address out of the
//! host (iptables mode does, with `route_localnet=1` and a DNAT that the kernel then
//! routes; that sysctl lets martian loopback traffic onto the wire, which upstream did not
//! carry over). So the NodePort rules leave loopback destinations alone, and a client on
//! the node connecting to `localhost:<nodePort>` finds this listener. UDP and SCTP get no
//! listener: the table counts and rejects them ([`crate::LocalhostNodePorts`]).
//!
//! The data path is kpr-relay's, the one userspace mode runs: a [`Relay`] keyed by the
//! NodePort number. What this module decides is upstream's:
//!
//! - **Which endpoints**: `externalTrafficPolicy: Cluster`, the cluster endpoints (ready,
//!   topology-filtered, serving-terminating as a fallback); `Local`, this node's endpoints
//!   only. No usable endpoint: no listener, so a client's connect is refused at once.
//! - **Reconciled after every sync**: only the NodePorts of changed Services (all of them
//!   when the rules were written in full); a kept listener gets its new endpoints in place
//!   (carried connections keep theirs), a listener no longer wanted is closed with its
//!   connections.
//! - **A listen failure** (someone else holds the address) is logged as upstream logs it
//!   (`Failed to create localhost nodeport proxy`), counted, and retried at the next sync;
//!   the other listeners are not affected.
//! - **Two Services claiming one NodePort** (the API refuses it; manifests may not): the
//!   first in name order is served, as a full sync of the rules decides.
//!
//! Deliberately unlike upstream (docs/configuration.md): the relay balances round robin with
//! its dial ladder (a failed connect is retried on the next endpoint, up to four, within
//! 3.75 s) and ClientIP affinity per client address, where upstream picks at random, dials
//! once with a 5 s timeout and pins one endpoint for every local client.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use kpr_metrics::FamilyLabels;
use kpr_model::{IpFamily, NamespacedName, Protocol, ServicePortName, Sizes};
use kpr_relay::{Budget, PortStats, Relay, RelayError, RelayOptions, Transport};
use kpr_state::{DesiredState, PortPlan, SyncRequest};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::runtime::Handle;

/// The proxy's metric handles (registered by [`crate::metrics::NftablesMetrics`]).
#[derive(Clone, Debug, Default)]
pub struct LocalhostMetrics {
    pub listeners: Family<FamilyLabels, Gauge>,
    pub creation_failures: Family<FamilyLabels, Counter>,
}

/// What one Service port wants served on its NodePort.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Wanted {
    endpoints: Vec<SocketAddr>,
    affinity: Option<Duration>,
}

/// One family's localhost NodePort proxy.
pub struct LocalhostProxy {
    family: IpFamily,
    loopback: IpAddr,
    relay: Relay<u16>,
    /// Per NodePort, the Service ports claiming it (in name order: the first is served).
    claims: BTreeMap<u16, BTreeMap<ServicePortName, Wanted>>,
    /// Per Service, the NodePorts its TCP ports claim, to find them when it changes.
    by_service: HashMap<NamespacedName, Vec<u16>>,
    /// NodePorts that should have a listener and have none: retried at every sync.
    failed: BTreeSet<u16>,
    synced: bool,
    metrics: Option<LocalhostMetrics>,
}

impl std::fmt::Debug for LocalhostProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalhostProxy")
            .field("family", &self.family)
            .field("listeners", &self.relay.len())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl LocalhostProxy {
    /// The proxy of `family`, its relay drawing on `budget` (shared with the other
    /// family's), UDP-less but built on `runtime` as every relay is. Its TCP thread starts
    /// with the first listener, in the calling thread's network namespace.
    pub fn new(family: IpFamily, budget: &Budget, runtime: Handle) -> Self {
        let options = RelayOptions {
            // Clients on this node only: one thread per family carries them (splice keeps
            // the bytes out of the process).
            tcp_threads: NonZeroUsize::MIN,
            ..RelayOptions::new(family.label())
        };
        Self {
            family,
            loopback: match family {
                IpFamily::V4 => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpFamily::V6 => IpAddr::V6(Ipv6Addr::LOCALHOST),
            },
            relay: Relay::new(options, budget, runtime),
            claims: BTreeMap::new(),
            by_service: HashMap::new(),
            failed: BTreeSet::new(),
            synced: false,
            metrics: None,
        }
    }

    /// Counts into `metrics`: the listeners gauge, set after every sync, and the listener
    /// creation failures.
    pub fn with_metrics(mut self, metrics: LocalhostMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Reconciles the listeners with `request`: the NodePorts of its changed Services, or
    /// of every Service with `all` (the first sync always looks at every Service), and the
    /// NodePorts whose listener failed before.
    pub fn sync(&mut self, request: &SyncRequest<'_>, all: bool) {
        let state = request.state;
        let mut touched: BTreeSet<u16> = std::mem::take(&mut self.failed);
        if all || !self.synced {
            touched.extend(self.relay.ports().map(|(port, _)| *port));
            self.claims.clear();
            self.by_service.clear();
            let services: Vec<&NamespacedName> = state.services.keys().collect();
            for service in services {
                touched.extend(self.claim(state, service));
            }
        } else {
            for service in request.changed {
                for port in self.by_service.remove(service).unwrap_or_default() {
                    if let Some(claims) = self.claims.get_mut(&port) {
                        claims.retain(|name, _| name.service != *service);
                        if claims.is_empty() {
                            self.claims.remove(&port);
                        }
                    }
                    touched.insert(port);
                }
                touched.extend(self.claim(state, service));
            }
        }
        self.synced = true;
        for port in touched {
            self.reconcile(port);
        }
        // Upstream forgets quiet ClientIP clients at every sync.
        self.relay.prune(Instant::now());
        if let Some(metrics) = &self.metrics {
            let listeners = i64::try_from(self.relay.len()).unwrap_or(i64::MAX);
            metrics.listeners.get_or_create(&self.labels()).set(listeners);
        }
    }

    /// Records the claims of `service`'s TCP NodePorts; returns the NodePorts.
    fn claim(&mut self, state: &DesiredState, service: &NamespacedName) -> Vec<u16> {
        let mut ports = Vec::new();
        for port in state.services.get(service).map(|ports| &ports[..]).unwrap_or(&[]) {
            let Some(node_port) = port.node_port else {
                continue;
            };
            if port.name.protocol != Protocol::Tcp {
                continue;
            }
            let wanted = wanted(&state.plan(port));
            self.claims
                .entry(node_port)
                .or_default()
                .insert(port.name.clone(), wanted);
            ports.push(node_port);
        }
        if !ports.is_empty() {
            ports.shrink_to_fit();
            self.by_service.insert(service.clone(), ports.clone());
        }
        ports
    }

    /// Makes the listener of `port` what its first claim wants.
    fn reconcile(&mut self, port: u16) {
        let first = self
            .claims
            .get(&port)
            .and_then(|claims| claims.iter().next())
            .filter(|(_, wanted)| !wanted.endpoints.is_empty())
            .map(|(name, wanted)| (name.clone(), wanted.clone()));
        let Some((name, wanted)) = first else {
            if self.relay.close(&port).is_some() {
                tracing::info!(
                    ipFamily = self.family.label(),
                    protocol = "TCP",
                    port,
                    "Removing localhost nodeport proxy"
                );
            }
            return;
        };
        let address = SocketAddr::new(self.loopback, port);
        if self.relay.port(&port).is_none() {
            let opened = self
                .relay
                .room_for_listener()
                .map_err(|e| e.to_string())
                .and_then(|()| {
                    self.relay
                        .bind(Transport::Tcp, address)
                        .map_err(|e| e.to_string())
                })
                .and_then(|bound| {
                    self.relay
                        .open(port, bound, name.to_string(), PortStats::default())
                        .map_err(|e| e.to_string())
                });
            if let Err(cause) = opened {
                self.failed_to_create(port, format!("failed to listen on {address}: {cause}"));
                return;
            }
        }
        let count = wanted.endpoints.len();
        match self.relay.set_endpoints(&port, wanted.endpoints, wanted.affinity) {
            Ok(()) => tracing::debug!(
                ipFamily = self.family.label(),
                protocol = "TCP",
                port,
                endpoints = count,
                service = %name,
                "Created localhost nodeport proxy"
            ),
            // Held, refusing, until descriptors are spared: not listening, so failed.
            Err(error @ RelayError::Descriptors { .. }) => {
                self.failed_to_create(port, format!("failed to listen on {address}: {error}"));
            }
            Err(error) => {
                self.relay.close(&port);
                self.failed_to_create(port, format!("failed to listen on {address}: {error}"));
            }
        }
    }

    fn failed_to_create(&mut self, port: u16, error: String) {
        tracing::error!(
            ipFamily = self.family.label(),
            err = %error,
            protocol = "TCP",
            port,
            "Failed to create localhost nodeport proxy"
        );
        if let Some(metrics) = &self.metrics {
            metrics.creation_failures.get_or_create(&self.labels()).inc();
        }
        self.failed.insert(port);
    }

    fn labels(&self) -> FamilyLabels {
        FamilyLabels {
            ip_family: self.family.label(),
        }
    }

    /// Listeners open now (the gauge's value).
    pub fn listeners(&self) -> usize {
        self.relay.len()
    }

    /// The NodePorts that have a listener, in order.
    pub fn ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self.relay.ports().map(|(port, _)| *port).collect();
        ports.sort_unstable();
        ports
    }

    /// TCP connections carried now.
    pub fn active_connections(&self) -> usize {
        self.relay.active_connections()
    }

    /// What the proxy keeps between syncs (kpr_model::Sizes).
    pub fn footprint(&self) -> Sizes {
        Sizes::new()
            .with("claims", self.claims.values().map(BTreeMap::len).sum())
            .with("claimed_ports", self.claims.len())
            .with("services", self.by_service.len())
            .with("listeners", self.relay.len())
            .with("failed", self.failed.len())
            .with("sticky_clients", self.relay.sticky_clients())
    }
}

/// The endpoints the NodePort rules choose for `plan`'s NodePort, and its affinity.
fn wanted(plan: &PortPlan<'_>) -> Wanted {
    let port = plan.port;
    let endpoints = if plan.external_unreachable.is_some() {
        Vec::new()
    } else if port.external_policy_local {
        plan.endpoints.local.iter().map(|ep| ep.addr).collect()
    } else {
        plan.endpoints.cluster.iter().map(|ep| ep.addr).collect()
    };
    Wanted {
        endpoints,
        affinity: port
            .session_affinity_seconds
            .map(|seconds| Duration::from_secs(u64::from(seconds))),
    }
}
