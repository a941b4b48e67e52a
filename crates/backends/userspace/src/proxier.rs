//! [`UserspaceBackend`]: the userspace mode's [`Backend`], one per IP family.
//!
//! Each sync compares the desired service ports with the open ones: a new port gets a
//! listener on a port from the allocator, a removed one is closed (its listener, its
//! connections and sessions end, its port and metric series are released), and a kept one
//! only gets its new endpoints and affinity in its balancer, so established connections
//! are never touched by endpoint changes. A port whose protocol changed is closed and
//! opened again. Then the portal chains whose rules changed are written in one
//! `iptables-restore` (none when only endpoints changed: they live in the balancers, not in
//! rules). When the iptables mode would do a full sync (first, after a failure, forced,
//! hourly) every portal chain is written whatever it holds, repairing changes made behind
//! the proxy's back, and the jumps into them are ensured (checking them reads the whole
//! nat table).
//!
//! The listeners, their connections and UDP sessions are the backend's [`Relay`]
//! (kpr-relay): `sync` runs on a blocking thread of the sync loop, and the relay binds its
//! sockets synchronously, so a sync that returns has every listener it wrote a portal for.
//! UDP listeners run on the proxy's tokio runtime, reached through a [`Handle`], TCP ones on
//! the relay's own threads, started in the syncing thread's network namespace.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroUsize;
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::metrics::{LimitsReached, PortLabels, ProtocolLabels, UserspaceMetrics};
use kpr_conntrack::{ConntrackTable, Scope};
use kpr_iptables::{ChainHashes, ExecError, FULL_SYNC_PERIOD, Iptables, RefusedPort, cleanup_footprint};
use kpr_model::{IpFamily, Protocol, ServicePort, ServicePortName, Sizes};
use kpr_relay::{Budget, CopyMethod, Limits, PortStats, Relay, RelayError, RelayOptions, Transport, workers};
use kpr_state::{
    Backend, BackendError, DesiredState, FailedStep, ObjectCount, SyncKind, SyncReport, SyncRequest,
};
use tokio::runtime::Handle;

use crate::conntrack::remove_stale;
use crate::portals::PortalFootprint;
use crate::portals::{Portal, PortalTargets, checked_name, jump_rules, render, superseded_jump_rules};
use crate::ports::{AllocError, PortAllocator, PortSource};

/// Service ports a sync logs one by one when it leaves them out; the rest are counted in
/// one line (past a descriptor limit, thousands fail at every retry).
const LOGGED_LEFT_OUT: usize = 10;

/// How a family's userspace backend listens and where its portals point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserspaceOptions {
    pub family: IpFamily,
    /// `--bind-address` when it names one address of this family: the listeners bind to it
    /// (and the portals DNAT to it). `None`: every address, reached by REDIRECT.
    pub listen_ip: Option<IpAddr>,
    /// The node's address of this family, for the node's own traffic.
    pub host_ip: IpAddr,
    /// `--proxy-port-range`; `None`: the kernel picks.
    pub port_range: Option<RangeInclusive<u16>>,
    /// `--udp-timeout`.
    pub udp_timeout: Duration,
    pub limits: Limits,
    /// How TCP bytes are moved (splice unless a measurement says otherwise).
    pub copy: CopyMethod,
    /// TCP threads ([`kpr_relay::workers`]); one per core by default.
    pub tcp_threads: NonZeroUsize,
}

impl UserspaceOptions {
    /// Defaults for `family`: every address, kernel-chosen ports, upstream's 250 ms.
    pub fn new(family: IpFamily, host_ip: IpAddr) -> Self {
        Self {
            family,
            listen_ip: None,
            host_ip,
            port_range: None,
            udp_timeout: Duration::from_millis(250),
            limits: Limits::default(),
            copy: CopyMethod::default(),
            tcp_threads: workers::default_count(),
        }
    }

    /// The address the listeners bind to.
    fn bind_ip(&self) -> IpAddr {
        self.listen_ip.unwrap_or(match self.family {
            IpFamily::V4 => IpAddr::from([0, 0, 0, 0]),
            IpFamily::V6 => IpAddr::from([0u16; 8]),
        })
    }

    /// How the relay carries this family's traffic.
    fn relay(&self) -> RelayOptions {
        RelayOptions {
            ip_family: self.family.label(),
            udp_timeout: self.udp_timeout,
            copy: self.copy,
            tcp_threads: self.tcp_threads,
        }
    }
}

/// What this mode keeps of an open service port beside the relay's listener.
#[derive(Debug)]
struct OpenPort {
    protocol: Protocol,
    /// The listener's port, taken from the allocator.
    listening: u16,
    labels: PortLabels,
    /// UDP: where its flows are found in conntrack (empty for TCP).
    flows: Vec<Scope>,
}

pub struct UserspaceBackend {
    options: UserspaceOptions,
    runtime: Handle,
    /// The listeners: one for each entry of `open`, under the same name.
    relay: Relay<ServicePortName>,
    iptables: Box<dyn Iptables>,
    ports: PortAllocator,
    open: HashMap<ServicePortName, OpenPort>,
    metrics: Option<UserspaceMetrics>,
    /// Ports already reported as unsafe or unsupported (each is reported once).
    reported_refusals: HashSet<RefusedPort>,
    reported_sctp: HashSet<ServicePortName>,
    random: RandomState,
    conntrack: Option<Box<dyn ConntrackTable>>,
    /// UDP ports opened or closed in this sync: their flows' scopes and the listener port
    /// they must lead to now (`None`: closed).
    flow_cleanups: Vec<(Vec<Scope>, Option<u16>)>,
    /// When the last full sync's work was done: every portal chain written, the jumps into
    /// them ensured (`None`: at the next sync).
    full_synced: Option<Instant>,
    /// The portal chains as the last restore left them (empty: unknown, all are written).
    written: ChainHashes,
}

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("cannot open a listener for {port}: {source}")]
    Listen {
        port: String,
        #[source]
        source: AllocError,
    },
    /// What the relay could not do but for a listener: start its TCP threads.
    #[error(transparent)]
    Relay(RelayError),
    #[error(transparent)]
    Exec(#[from] ExecError),
}

impl UserspaceBackend {
    pub fn new(options: UserspaceOptions, iptables: Box<dyn Iptables>, runtime: Handle) -> Self {
        let relay = Relay::new(options.relay(), &Budget::new(options.limits), runtime.clone());
        Self {
            ports: PortAllocator::new(PortSource::of(options.port_range.clone())),
            relay,
            options,
            runtime,
            iptables,
            open: HashMap::new(),
            metrics: None,
            reported_refusals: HashSet::new(),
            reported_sctp: HashSet::new(),
            random: RandomState::new(),
            conntrack: None,
            flow_cleanups: Vec::new(),
            full_synced: None,
            written: ChainHashes::new(),
        }
    }

    /// Draws on `budget` (and its limits) instead of a budget of its own: the other IP
    /// family's backend in the same process does too. Before the first sync.
    pub fn sharing(mut self, budget: &Budget) -> Self {
        self.options.limits = budget.limits();
        self.relay = Relay::new(self.options.relay(), budget, self.runtime.clone());
        self.observe_limits();
        self
    }

    /// Deletes UDP flows that lead to a closed or replaced listener (see
    /// [`crate::conntrack`]) through `table`.
    pub fn with_conntrack(mut self, table: Box<dyn ConntrackTable>) -> Self {
        self.conntrack = Some(table);
        self
    }

    /// Reports to `metrics` (`kubeproxy_userspace_*`).
    pub fn with_metrics(mut self, metrics: UserspaceMetrics) -> Self {
        self.metrics = Some(metrics);
        self.observe_limits();
        self
    }

    /// The relay's refusals counted in the metrics, if there are any.
    fn observe_limits(&mut self) {
        if let Some(metrics) = &self.metrics {
            self.relay.observe_limits(Arc::new(LimitsReached {
                metrics: metrics.clone(),
                ip_family: self.options.family.label(),
            }));
        }
    }

    /// The port each open service port listens on (tests, `explain`).
    pub fn listeners(&self) -> HashMap<ServicePortName, u16> {
        self.open
            .iter()
            .map(|(name, open)| (name.clone(), open.listening))
            .collect()
    }

    /// Entry counts of everything kept between syncs (see `kpr_model::Sizes`).
    pub fn footprint(&self) -> Sizes {
        Sizes::new()
            .with("open_ports", self.open.len())
            .with("allocated_ports", self.ports.in_use())
            .with("sticky_clients", self.relay.sticky_clients())
            .with("reported_refusals", self.reported_refusals.len())
            .with("reported_sctp", self.reported_sctp.len())
            .with("listener_descriptors", self.relay.listener_descriptors())
    }

    /// TCP connections carried now, over all ports.
    pub fn active_connections(&self) -> usize {
        self.relay.active_connections()
    }

    /// Listeners and connections the TCP threads hold (tests: nothing may leak).
    pub fn tcp_held(&self) -> usize {
        self.relay.tcp_held()
    }

    /// UDP sessions held now, over all ports.
    pub fn active_udp_sessions(&self) -> usize {
        self.relay.active_udp_sessions()
    }

    /// Closes every port and removes the portals (shutdown).
    pub fn shutdown(&mut self) -> Result<(), ExecError> {
        for name in self.open.keys().cloned().collect::<Vec<_>>() {
            self.close(&name);
        }
        let report = cleanup_footprint(self.iptables.as_ref(), &PortalFootprint);
        match report.errors.into_iter().next() {
            Some(error) => Err(error.source),
            None => Ok(()),
        }
    }

    fn try_sync(&mut self, state: &DesiredState, force_full: bool) -> Result<SyncReport, SyncError> {
        // A port whose name cannot be written into a rule could have no portal, so nothing
        // could reach a listener for it: it gets none.
        let mut wanted = Vec::new();
        let mut refused = Vec::new();
        for port in self.served_ports(state) {
            match checked_name(port) {
                Ok(_) => wanted.push(port),
                Err(refusal) => refused.push(refusal),
            }
        }
        let names: HashSet<&ServicePortName> = wanted.iter().map(|port| &port.name).collect();
        let gone: Vec<ServicePortName> = self.open.keys().filter(|n| !names.contains(n)).cloned().collect();
        for name in &gone {
            self.close(name);
        }
        // A port that cannot get a listener (no free port in the range, no descriptor left)
        // does not hold back the others, nor fail the sync: as upstream's userspace proxy,
        // which logged such a port and went on, it is logged, counted, and tried again at
        // every later sync (the periodic one at the latest), while the other ports are served
        // and the node reports healthy. A failed sync would hold `/healthz` at 503 for a
        // condition no restart mends (and retry it at once, over and over). What fails a
        // sync is what leaves every port unserved: the TCP threads, the rules.
        let mut failed = None;
        let mut left_out = 0usize;
        for port in &wanted {
            if let Err(error) = self.reconcile(port, state) {
                left_out += 1;
                if left_out <= LOGGED_LEFT_OUT {
                    tracing::error!(%error, "service port left out of this sync");
                }
                if !matches!(error, SyncError::Listen { .. }) {
                    failed.get_or_insert(error);
                }
            }
        }
        if left_out > LOGGED_LEFT_OUT {
            tracing::error!(
                left_out,
                not_logged = left_out - LOGGED_LEFT_OUT,
                "more service ports left out of this sync than logged one by one"
            );
        }
        let portals: Vec<Portal<'_>> = wanted
            .iter()
            .filter_map(|port| {
                let open = self.open.get(&port.name)?;
                Some(Portal {
                    port,
                    proxy_port: open.listening,
                })
            })
            .collect();
        let ruleset = render(&portals, self.targets());
        let full = self.full_sync_due(force_full);
        if full {
            self.written.clear();
        }
        let payload = ruleset.render_changed(&self.written);
        if !payload.text.is_empty() {
            // Unknown until the restore is known to have worked.
            self.written.clear();
            self.iptables.restore(payload.text.as_bytes())?;
        }
        self.written = ruleset.chain_hashes();
        if full {
            self.ensure_jumps()?;
            self.full_synced = Some(Instant::now());
        }
        self.remove_stale_flows();
        self.relay.prune(Instant::now());
        if let Some(error) = failed {
            return Err(error);
        }
        Ok(SyncReport {
            full,
            objects: {
                let tables = ruleset.table_counts(&payload);
                ObjectCount {
                    total: tables.iter().map(|t| t.total).sum(),
                    written: tables.iter().map(|t| t.written).sum(),
                }
            },
            newly_unsafe: self.report_refusals(refused),
            ..SyncReport::default()
        })
    }

    /// Whether this sync does what the iptables mode's full sync does: at the first sync,
    /// after a failed one, when forced, and every [`FULL_SYNC_PERIOD`]. Not every sync:
    /// each `iptables -C` in the nat table reads the whole table (0.6 s with 20,000
    /// Services' portals), and rewriting every portal at each endpoint change would cost
    /// as much as the rules a Service change needs.
    fn full_sync_due(&self, force_full: bool) -> bool {
        force_full || self.full_synced.is_none_or(|at| at.elapsed() >= FULL_SYNC_PERIOD)
    }

    /// Ensures the jumps into the portal chains, and removes those an earlier version made
    /// that [`jump_rules`] replaced.
    fn ensure_jumps(&mut self) -> Result<(), ExecError> {
        for jump in jump_rules() {
            self.iptables.ensure_rule(jump.table, jump.chain, &jump.args)?;
        }
        for old in superseded_jump_rules() {
            if self.iptables.rule_exists(old.table, old.chain, &old.args)? {
                tracing::info!(chain = old.chain, args = ?old.args, "removing a jump of an earlier version");
                self.iptables.delete_rule(old.table, old.chain, &old.args)?;
            }
        }
        Ok(())
    }

    /// The flow cleanups this sync queued, after its portals are in.
    fn remove_stale_flows(&mut self) {
        let cleanups = std::mem::take(&mut self.flow_cleanups);
        let Some(table) = self.conntrack.as_mut() else {
            return;
        };
        let family = self.options.family;
        let deleted: usize = cleanups
            .iter()
            .map(|(scopes, listener)| remove_stale(table.as_mut(), family, scopes, *listener))
            .sum();
        if deleted > 0 {
            tracing::info!(deleted, "deleted UDP flows that led to closed listeners");
        }
    }

    fn targets(&self) -> PortalTargets {
        PortalTargets {
            listen_ip: self.options.listen_ip,
            host_ip: self.options.host_ip,
        }
    }

    /// The state's ports this mode serves; SCTP ports are reported (once each) and counted.
    fn served_ports<'s>(&mut self, state: &'s DesiredState) -> Vec<&'s ServicePort> {
        let (served, sctp): (Vec<&ServicePort>, Vec<&ServicePort>) = state
            .ports()
            .into_iter()
            .partition(|port| port.name.protocol != Protocol::Sctp);
        let current: HashSet<ServicePortName> = sctp.iter().map(|p| p.name.clone()).collect();
        for name in current.difference(&self.reported_sctp) {
            tracing::warn!(service = %name, "SCTP is not supported in userspace mode: this service port is not proxied");
        }
        if let Some(metrics) = &self.metrics {
            let labels = ProtocolLabels {
                ip_family: self.options.family.label(),
                protocol: Protocol::Sctp.api(),
            };
            metrics
                .unsupported_service_ports
                .get_or_create(&labels)
                .set(current.len() as i64);
        }
        self.reported_sctp = current;
        served
    }

    /// Opens `port` or brings its open state up to date.
    fn reconcile(&mut self, port: &ServicePort, state: &DesiredState) -> Result<(), SyncError> {
        let endpoints: Vec<SocketAddr> = state
            .plan(port)
            .endpoints
            .cluster
            .iter()
            .map(|e| e.addr)
            .collect();
        let affinity = port
            .session_affinity_seconds
            .map(|s| Duration::from_secs(u64::from(s)));
        if self
            .open
            .get(&port.name)
            .is_some_and(|open| open.protocol != port.name.protocol)
        {
            self.close(&port.name);
        }
        if !self.open.contains_key(&port.name) {
            self.open_port(port)?;
        }
        match self.relay.set_endpoints(&port.name, endpoints, affinity) {
            Ok(()) => Ok(()),
            Err(RelayError::Closed { source, .. }) => {
                tracing::error!(service = %port.name, error = %source, "cannot change the listener; the port is opened anew at the next sync");
                if let Some(open) = self.open.remove(&port.name) {
                    self.release(&port.name, &open);
                }
                Ok(())
            }
            Err(error) => Err(self.relay_error(port, error)),
        }
    }

    /// What a sync makes of the relay's `error` for `port`: a port left out for want of
    /// descriptors is counted as that limit (see [`UserspaceBackend::refused`]).
    fn relay_error(&self, port: &ServicePort, error: RelayError) -> SyncError {
        let name = port.name.to_string();
        match error {
            RelayError::Descriptors { used, limit } => {
                self.refused(name, AllocError::Descriptors { used, limit })
            }
            RelayError::Serve { port, source } | RelayError::Closed { port, source } => SyncError::Listen {
                port: name,
                source: AllocError::Bind { port, source },
            },
            error @ (RelayError::Threads(_) | RelayError::NotOpen) => SyncError::Relay(error),
        }
    }

    /// The error for a port that gets no listener; one that hit a limit is counted in
    /// `kubeproxy_userspace_limit_reached_total` under that limit's label.
    fn refused(&self, port: String, source: AllocError) -> SyncError {
        if let (Some(metrics), Some(limit)) = (&self.metrics, source.limit()) {
            let labels = crate::metrics::LimitLabels {
                ip_family: self.options.family.label(),
                limit,
            };
            metrics.limit_reached_total.get_or_create(&labels).inc();
        }
        SyncError::Listen { port, source }
    }

    fn open_port(&mut self, port: &ServicePort) -> Result<(), SyncError> {
        if let Err(error) = self.relay.room_for_listener() {
            return Err(self.relay_error(port, error));
        }
        let name = port.name.to_string();
        let labels = PortLabels {
            ip_family: self.options.family.label(),
            service_port: name.clone(),
            protocol: port.name.protocol.api(),
        };
        let stats = match &self.metrics {
            Some(metrics) => metrics.port_stats(&labels),
            None => PortStats::default(),
        };
        let ip = self.options.bind_ip();
        let start = self.random_start();
        let transport = match port.name.protocol {
            Protocol::Udp => Transport::Udp,
            _ => Transport::Tcp,
        };
        let relay = &self.relay;
        let (bound, listening) = self
            .ports
            .allocate(start, |p| {
                let bound = relay.bind(transport, SocketAddr::new(ip, p))?;
                let got = bound.port();
                Ok((bound, got))
            })
            .map_err(|source| self.refused(name.clone(), source))?;
        let mut flows = Vec::new();
        if transport == Transport::Udp {
            flows = crate::conntrack::scopes(port);
            self.flow_cleanups.push((flows.clone(), Some(listening)));
        }
        if let Err(error) = self.relay.open(port.name.clone(), bound, name.clone(), stats) {
            // The socket is gone with the error: its port is free again.
            self.ports.release(listening);
            return Err(self.relay_error(port, error));
        }
        tracing::info!(service = %name, port = listening, "opened the service port's listener");
        self.open.insert(
            port.name.clone(),
            OpenPort {
                protocol: port.name.protocol,
                listening,
                labels,
                flows,
            },
        );
        Ok(())
    }

    /// Closes one service port: listener, connections, sessions, port, metric series.
    fn close(&mut self, name: &ServicePortName) {
        if let Some(open) = self.open.remove(name) {
            if !open.flows.is_empty() {
                self.flow_cleanups.push((open.flows.clone(), None));
            }
            self.relay.close(name);
            self.release(name, &open);
        }
    }

    /// What closing a port gives back besides the relay's listener: its port and its
    /// metric series.
    fn release(&mut self, name: &ServicePortName, open: &OpenPort) {
        self.ports.release(open.listening);
        if let Some(metrics) = &self.metrics {
            metrics.forget(&open.labels);
        }
        tracing::info!(service = %name, port = open.listening, "closed the service port's listener");
    }

    fn random_start(&self) -> usize {
        usize::try_from(self.random.hash_one(Instant::now()) % 65_536).unwrap_or(0)
    }

    fn report_refusals(&mut self, refused: Vec<RefusedPort>) -> Vec<kpr_state::UnsafeObject> {
        let current: HashSet<RefusedPort> = refused.into_iter().collect();
        let mut new: Vec<&RefusedPort> = current.difference(&self.reported_refusals).collect();
        new.sort_by(|a, b| a.port.cmp(&b.port));
        let reported: Vec<_> = new.into_iter().map(RefusedPort::unsafe_object).collect();
        for object in &reported {
            tracing::warn!("{object}; the service's other ports and every other service are still proxied");
        }
        self.reported_refusals = current;
        reported
    }
}

impl Backend for UserspaceBackend {
    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncReport, BackendError> {
        self.try_sync(request.state, request.force_full).map_err(|error| {
            // After a failed restore or check the rules in the kernel are unknown: the next
            // sync is full (every portal chain written, the jumps checked). A port that got
            // no listener is not such a failure: the portals were written without it, and
            // a port refused for good (its range full, no descriptor left) would otherwise
            // make every retry a full sync.
            if let SyncError::Exec(_) = error {
                self.full_synced = None;
                self.written.clear();
            }
            let step = match error {
                SyncError::Exec(ExecError::Restore { .. }) => FailedStep::Restore,
                _ => FailedStep::Other,
            };
            BackendError::new(SyncKind::Full, step, error)
        })
    }
}
