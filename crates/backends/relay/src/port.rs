//! What one service port's listener and its connections share with whoever syncs it
//! ([`crate::Relay`]): the balancer (the sync swaps endpoints in it, the connections pick
//! from it), the metric handles, and the signal that the Service port is gone.
//!
//! Endpoint changes go through the balancer only, so a connection already carried never
//! notices them; removal is the one event that ends connections ([`PortState::close`] for
//! UDP sessions, [`crate::workers::Workers::close_port`] for TCP connections).
//!
//! The counts are metric handles ([`PortStats`]) the caller makes and registers under its
//! own names, not calls out to the caller: a connection counts its bytes at every write, and
//! a handle's count is one atomic add, what the data path paid before it had a second user.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;

use crate::balancer::PortBalancer;
use crate::copy::CopyMethod;

/// The metric handles of one service port, looked up once: a connection only increments.
/// Default handles (tests, tools, a caller that counts nothing) count into the void.
#[derive(Clone, Debug, Default)]
pub struct PortStats {
    pub active_connections: Gauge,
    pub connections: Counter,
    pub to_endpoint_bytes: Counter,
    pub from_endpoint_bytes: Counter,
    pub connect_failures: Counter,
    pub endpoint_retries: Counter,
    pub active_udp_sessions: Gauge,
    pub udp_sessions: Counter,
}

/// One service port, shared by its listeners, its connections and the relay.
#[derive(Debug)]
pub struct PortState {
    /// `namespace/name:port`, for logs.
    pub name: String,
    balancer: Mutex<PortBalancer>,
    pub stats: PortStats,
    /// How this port's TCP connections move their bytes.
    pub copy: CopyMethod,
    closed: watch::Sender<bool>,
}

impl PortState {
    pub fn new(name: String, balancer: PortBalancer, stats: PortStats, copy: CopyMethod) -> Arc<Self> {
        Arc::new(Self {
            name,
            balancer: Mutex::new(balancer),
            stats,
            copy,
            closed: watch::Sender::new(false),
        })
    }

    /// Runs `f` on the balancer. A panic elsewhere cannot leave it half-changed (every
    /// change is one assignment), so a poisoned lock is still usable.
    pub fn balancer<T>(&self, f: impl FnOnce(&mut PortBalancer) -> T) -> T {
        f(&mut self.balancer.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The endpoint for `client`'s next connection.
    pub fn pick(&self, client: IpAddr, reset_affinity: bool) -> Option<SocketAddr> {
        self.balancer(|b| b.next(client, reset_affinity, Instant::now()))
    }

    /// Whether `endpoint` is one of the endpoints new traffic may go to.
    pub fn serves(&self, endpoint: SocketAddr) -> bool {
        self.balancer(|b| b.endpoints().binary_search(&endpoint).is_ok())
    }

    /// Ends this port's UDP relay and sessions (its TCP connections are ended by the TCP
    /// threads: [`crate::workers::Workers::close_port`]).
    pub fn close(&self) {
        self.closed.send_replace(true);
    }

    /// A receiver whose `wait_for(|c| *c)` returns once the port is closed.
    pub fn closed(&self) -> watch::Receiver<bool> {
        self.closed.subscribe()
    }
}

/// Waits until `closed` says the port is gone (or its sender is dropped).
pub async fn wait_closed(mut closed: watch::Receiver<bool>) {
    let _ = closed.wait_for(|closed| *closed).await;
}
