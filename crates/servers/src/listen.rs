//! Listening on a configured "IP:port" the way upstream does.
//!
//! Upstream runs each server under `wait.Until(..., 5s)`: a port that is busy (an old
//! kube-proxy still shutting down, another program) is retried every 5 s, logged each time,
//! and the server comes up as soon as the port is free; the proxy keeps programming rules
//! meanwhile. With `--bind-address-hard-fail` the first failure is fatal instead. A server
//! that stops with an error is restarted under the same rule.
//!
//! Unlike upstream, a server holds its connections within bounds ([`crate::limits`]): each
//! accepted connection is admitted into the server's budget ([`crate::connections`]), which
//! may evict an idle one or refuse the newcomer, and is served on its own task
//! ([`crate::connection`]).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::connection;
use crate::connections::Budget;
use crate::handle::{ServeError, ServerHandle};

/// Upstream's pause between attempts.
pub const UPSTREAM_RETRY_INTERVAL: Duration = Duration::from_secs(5);

/// What happens when a server cannot listen or stops with an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindPolicy {
    /// `--bind-address-hard-fail`: return the error (the proxy exits) instead of retrying.
    pub hard_fail: bool,
    pub retry_interval: Duration,
}

impl BindPolicy {
    /// Upstream's behaviour: retry every 5 s unless `hard_fail`.
    pub fn upstream(hard_fail: bool) -> Self {
        Self {
            hard_fail,
            retry_interval: UPSTREAM_RETRY_INTERVAL,
        }
    }
}

/// Where a server listens: an address, and for an IPv6 wildcard whether it takes IPv4 too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ListenOn {
    pub addr: SocketAddr,
    /// `[::]` answers IPv6 only. Go listens dual-stack on a wildcard, so the configured
    /// servers (`--healthz-bind-address=[::]:10256`) keep this off; the per-family
    /// Service health-check servers turn it on, so that IPv4's and IPv6's sets can both
    /// hold a dual-stack Service's one port, as upstream's do since they bind per family.
    pub v6_only: bool,
}

impl ListenOn {
    /// Binds and listens, with `SO_REUSEADDR` as Go and tokio set it (a port closed a
    /// moment ago is free again at once).
    fn bind(self) -> io::Result<TcpListener> {
        let socket = Socket::new(Domain::for_address(self.addr), Type::STREAM, Some(Protocol::TCP))?;
        socket.set_reuse_address(true)?;
        if self.addr.is_ipv6() {
            socket.set_only_v6(self.v6_only)?;
        }
        socket.set_nonblocking(true)?;
        socket.bind(&self.addr.into())?;
        socket.listen(LISTEN_BACKLOG)?;
        TcpListener::from_std(socket.into())
    }
}

/// Tokio's (and Go's usual) backlog.
const LISTEN_BACKLOG: i32 = 1024;

/// The pause after an accept error that is not the client's (hyper's and axum's).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// An accept error that concerns one client only: the next accept may work.
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}

/// Serves `router` on `address` from a spawned task; `Ok(None)` when the address is blank
/// (the server is disabled). The first bind happens before this returns, so a hard-failing
/// policy reports a busy port here; otherwise the task keeps trying. Connections are held
/// within `budget`.
pub(crate) async fn start(
    address: &str,
    router: Router,
    policy: BindPolicy,
    budget: Arc<Budget>,
) -> Result<Option<ServerHandle>, ServeError> {
    let server = budget.server();
    let address = address.trim();
    if address.is_empty() {
        return Ok(None);
    }
    let socket_addr: SocketAddr = address.parse().map_err(|e| ServeError::InvalidAddress {
        server,
        address: address.to_string(),
        reason: format!("{e} (expected IP:port, e.g. 0.0.0.0:10256 or [::]:10256)"),
    })?;
    let on = ListenOn {
        addr: socket_addr,
        v6_only: false,
    };
    start_on(on, router, policy, budget).await.map(Some)
}

/// Serves `router` on `on` from a spawned task, binding as `policy` says (see [`start`]).
/// Several listeners may share one `budget`.
pub(crate) async fn start_on(
    on: ListenOn,
    router: Router,
    policy: BindPolicy,
    budget: Arc<Budget>,
) -> Result<ServerHandle, ServeError> {
    let server = budget.server();
    let address = on.addr.to_string();
    let (bound_tx, bound_rx) = watch::channel(None);
    let (stop_tx, stop_rx) = watch::channel(false);
    let serving = Serving {
        server,
        address: address.clone(),
        on,
        router,
        policy,
        budget,
        bound: bound_tx,
        stop: stop_rx,
    };
    let first = match on.bind() {
        Ok(listener) => {
            // Known at once, so callers can read the port (e.g. of "IP:0") right away.
            serving.bound.send_replace(listener.local_addr().ok());
            Some(listener)
        }
        Err(source) if policy.hard_fail => return Err(serving.bind_error(source)),
        Err(source) => {
            serving.log_retry(&serving.bind_error(source));
            None
        }
    };
    let task = tokio::spawn(serving.run(first));
    Ok(ServerHandle::new(server, address, bound_rx, stop_tx, task))
}

/// One server's task: bind (again) when needed, serve until told to stop.
struct Serving {
    server: &'static str,
    address: String,
    on: ListenOn,
    router: Router,
    policy: BindPolicy,
    budget: Arc<Budget>,
    bound: watch::Sender<Option<SocketAddr>>,
    stop: watch::Receiver<bool>,
}

impl Serving {
    async fn run(self, mut listener: Option<TcpListener>) -> Result<(), ServeError> {
        loop {
            let ready = match listener.take() {
                Some(ready) => ready,
                None => match self.bind_after_pause().await {
                    Some(ready) => ready,
                    None => return Ok(()),
                },
            };
            match self.serve(ready).await {
                Ok(()) => return Ok(()),
                Err(error) if self.policy.hard_fail => return Err(error),
                Err(error) => self.log_retry(&error),
            }
        }
    }

    /// Pauses, then binds, until it works; `None` when told to stop meanwhile.
    async fn bind_after_pause(&self) -> Option<TcpListener> {
        loop {
            if self.stopped_within(self.policy.retry_interval).await {
                return None;
            }
            match self.on.bind() {
                Ok(listener) => return Some(listener),
                Err(source) => self.log_retry(&self.bind_error(source)),
            }
        }
    }

    /// Accepts until told to stop, then lets the connections finish (requests in flight are
    /// answered, idle connections close) and returns `Ok`. Each connection is served on a
    /// task of its own, within the budget ([`crate::connection`]).
    async fn serve(&self, listener: TcpListener) -> Result<(), ServeError> {
        let local = listener.local_addr().map_err(|source| self.bind_error(source))?;
        tracing::info!(server = self.server, address = %local, "serving");
        self.bound.send_replace(Some(local));
        // Each connection holds a receiver; `closed()` resolves once all are gone.
        let (open_tx, open_rx) = watch::channel(());
        let mut stop = self.stop.clone();
        loop {
            let accepted = tokio::select! {
                _ = stop.wait_for(|stop| *stop) => break,
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok((stream, _peer)) => {
                    // Refused (dropped, so closed) when the budget is full of busy connections.
                    if let Some(tracker) = self.budget.admit() {
                        let router = self.router.clone();
                        tokio::spawn(connection::serve(
                            stream,
                            tracker,
                            router,
                            self.stop.clone(),
                            open_rx.clone(),
                        ));
                    }
                    // Lets the new connection read the request it may already have sent before
                    // more newcomers arrive (each may evict the oldest idle connection).
                    tokio::task::yield_now().await;
                }
                Err(error) if is_connection_error(&error) => {}
                Err(error) => {
                    // Out of descriptors, most likely: others may close soon. As hyper's and
                    // axum's accept loops do, pause for a second.
                    tracing::error!(server = self.server, address = %local, "accept: {error}");
                    if self.stopped_within(ACCEPT_ERROR_PAUSE).await {
                        break;
                    }
                }
            }
        }
        drop(listener);
        drop(open_rx);
        open_tx.closed().await;
        self.bound.send_replace(None);
        Ok(())
    }

    /// Sleeps `pause`; true if told to stop before or during it.
    async fn stopped_within(&self, pause: Duration) -> bool {
        let mut stop = self.stop.clone();
        let told = tokio::select! {
            () = tokio::time::sleep(pause) => false,
            _ = stop.wait_for(|stop| *stop) => true,
        };
        told || *self.stop.borrow()
    }

    fn bind_error(&self, source: io::Error) -> ServeError {
        ServeError::Bind {
            server: self.server,
            address: self.address.clone(),
            source,
        }
    }

    fn log_retry(&self, error: &ServeError) {
        tracing::error!(
            server = self.server,
            "{error}; retrying in {:?} (--bind-address-hard-fail makes this fatal)",
            self.policy.retry_interval
        );
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use kpr_metrics::Metrics;
    use prometheus_client::registry::Registry;

    use super::*;
    use crate::limits::HttpLimits;

    fn connects(addr: SocketAddr) -> bool {
        std::net::TcpStream::connect(addr).is_ok()
    }

    /// `--healthz-bind-address=[::]:10256` answers IPv4 too, as Go's listener does.
    #[tokio::test]
    async fn a_configured_ipv6_wildcard_takes_ipv4_too_as_gos_listener() {
        let budget = Budget::new(
            "healthz",
            HttpLimits::HEALTHZ,
            &Metrics::new(&mut Registry::default()),
        );
        let server = start("[::]:0", Router::new(), BindPolicy::upstream(true), budget)
            .await
            .unwrap()
            .unwrap();
        let port = server.local_addr().unwrap().port();
        assert!(connects(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port)));
        assert!(connects(SocketAddr::new(Ipv6Addr::LOCALHOST.into(), port)));
    }

    /// A v6-only wildcard leaves the port's IPv4 side to someone else (the IPv4 set of
    /// Service health-check servers).
    #[tokio::test]
    async fn a_v6_only_wildcard_leaves_ipv4_alone() {
        let v4 = ListenOn {
            addr: SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0),
            v6_only: true,
        }
        .bind()
        .unwrap();
        let port = v4.local_addr().unwrap().port();
        let v6 = ListenOn {
            addr: SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port),
            v6_only: true,
        };
        drop(v6.bind().expect("IPv6's wildcard binds next to IPv4's"));
        let dual = ListenOn { v6_only: false, ..v6 };
        let refused = dual
            .bind()
            .expect_err("a dual-stack wildcard would take IPv4's port too");
        assert_eq!(refused.kind(), io::ErrorKind::AddrInUse);
    }
}
