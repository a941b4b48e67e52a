//! TCP: a listener per service port, one task per carried connection (upstream's
//! `tcpProxySocket.ProxyLoop`, `tryConnect` and `proxyTCP`).
//!
//! A connection goes to the balancer's pick; a connect that fails or outlasts its dial
//! timeout (250 ms, 500 ms, 1 s, 2 s: upstream's ladder, so at most four endpoints and
//! 3.75 s) is retried on the next pick, with the client's affinity reset. When every try
//! failed the client's connection is closed. Bytes then flow both ways until both sides
//! closed (a half-close is passed on), through [`crate::copy`].
//!
//! A port without endpoints has no listener, only a bound socket holding its port
//! ([`Listener::Held`]): the kernel answers a connection to it with a reset, so clients are
//! refused at once, as the other modes' REJECT rules do, instead of being accepted and
//! closed. Closing or holding the listener never touches carried connections; only
//! [`crate::port::PortState::close`] (the Service port is gone) ends them.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{Shutdown, shutdown};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinHandle;

use crate::copy::copy_both_ways;
use crate::limits::Slots;
use crate::port::{PortState, wait_closed};

/// Upstream's `endpointDialTimeouts`: one try per entry, each on another pick.
pub const DIAL_TIMEOUTS: [Duration; 4] = [
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
];

/// Pending connections the kernel queues per listener.
const BACKLOG: u32 = 4096;

/// A service port's TCP socket: accepting, or only holding its port.
#[derive(Debug)]
pub enum Listener {
    Accepting { port: u16, accepting: Accepting },
    Held { port: u16, socket: TcpSocket },
}

impl Listener {
    pub fn port(&self) -> u16 {
        match self {
            Listener::Accepting { port, .. } | Listener::Held { port, .. } => *port,
        }
    }

    pub fn is_accepting(&self) -> bool {
        matches!(self, Listener::Accepting { .. })
    }
}

/// A task that ends with its owner; accepted connections run in their own tasks and
/// carry on.
#[derive(Debug)]
pub struct AbortOnDrop(pub JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A listening socket and its accept loop. Dropping it stops the listening at once
/// (`shutdown(SHUT_RD)` takes a listener out of LISTEN synchronously, so the very next
/// connection is refused and the port can be bound again), while the task, and with it
/// the socket, ends on the runtime a moment later.
#[derive(Debug)]
pub struct Accepting {
    listener: Arc<TcpListener>,
    _task: AbortOnDrop,
}

impl Drop for Accepting {
    fn drop(&mut self) {
        let _ = shutdown(self.listener.as_raw_fd(), Shutdown::Read);
    }
}

/// Binds `ip:port` (port 0: the kernel picks) without listening, so the port is ours but
/// connections to it are refused. Returns the socket and its port.
pub fn bind(ip: IpAddr, port: u16) -> io::Result<(TcpSocket, u16)> {
    let socket = match ip {
        IpAddr::V4(_) => TcpSocket::new_v4()?,
        IpAddr::V6(_) => TcpSocket::new_v6()?,
    };
    // A port we held a moment ago (the listener was closed and is opened again) may still
    // have connections in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(SocketAddr::new(ip, port))?;
    let port = socket.local_addr()?.port();
    Ok((socket, port))
}

/// Starts accepting on a held socket, on `runtime` (from any thread).
pub fn accept(
    socket: TcpSocket,
    port: u16,
    state: Arc<PortState>,
    slots: Arc<Slots>,
    runtime: &Handle,
) -> io::Result<Listener> {
    let _entered = runtime.enter();
    let listener = Arc::new(socket.listen(BACKLOG)?);
    let task = runtime.spawn(accept_loop(listener.clone(), state, slots));
    Ok(Listener::Accepting {
        port,
        accepting: Accepting {
            listener,
            _task: AbortOnDrop(task),
        },
    })
}

/// A listener that accepts when `has_endpoints`, else only holds its port; connections it
/// already accepted are not affected either way.
pub fn retarget(
    listener: Listener,
    has_endpoints: bool,
    ip: IpAddr,
    state: &Arc<PortState>,
    slots: &Arc<Slots>,
    runtime: &Handle,
) -> io::Result<Listener> {
    match (has_endpoints, listener) {
        (true, Listener::Held { port, socket }) => {
            accept(socket, port, state.clone(), slots.clone(), runtime)
        }
        (false, accepting @ Listener::Accepting { .. }) => hold(accepting, ip),
        (_, unchanged) => Ok(unchanged),
    }
}

/// Stops accepting and holds the port again (the service port has no endpoints).
fn hold(listener: Listener, ip: IpAddr) -> io::Result<Listener> {
    let port = listener.port();
    drop(listener);
    let (socket, port) = bind(ip, port)?;
    Ok(Listener::Held { port, socket })
}

async fn accept_loop(listener: Arc<TcpListener>, state: Arc<PortState>, slots: Arc<Slots>) {
    let closed = state.closed();
    tokio::select! {
        () = wait_closed(closed.clone()) => {}
        () = async {
            loop {
                match listener.accept().await {
                    Ok((client, peer)) => {
                        // At the limit the client is closed at once (Slots logs and counts).
                        let Some(slot) = slots.try_take() else { continue };
                        tokio::spawn(carry(client, peer, state.clone(), slot));
                    }
                    // The listener was shut down (see Accepting): the task ends.
                    Err(error) if error.kind() == io::ErrorKind::InvalidInput => return,
                    Err(error) => {
                        // EMFILE and friends: wait a little rather than spin.
                        tracing::warn!(service = %state.name, %error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        } => {}
    }
}

/// One client connection, from connect to both sides closed; ends early if the Service
/// port is removed.
async fn carry(client: TcpStream, peer: SocketAddr, state: Arc<PortState>, _slot: OwnedSemaphorePermit) {
    let stats = &state.stats;
    stats.connections.inc();
    stats.active_connections.inc();
    tokio::select! {
        () = wait_closed(state.closed()) => {}
        () = async {
            let Some(endpoint) = connect(&state, peer.ip()).await else { return };
            let _ = client.set_nodelay(true);
            let _ = endpoint.set_nodelay(true);
            match copy_both_ways(&client, &endpoint, stats).await {
                Ok(()) => {}
                Err(error) => tracing::debug!(service = %state.name, %peer, %error, "connection ended"),
            }
        } => {}
    }
    stats.active_connections.dec();
}

/// Connects to an endpoint for `client`, down the dial-timeout ladder.
async fn connect(state: &PortState, client: IpAddr) -> Option<TcpStream> {
    let stats = &state.stats;
    let mut reset_affinity = false;
    for (attempt, timeout) in DIAL_TIMEOUTS.into_iter().enumerate() {
        let Some(endpoint) = state.pick(client, reset_affinity) else {
            tracing::debug!(service = %state.name, "no endpoint to connect to");
            return None;
        };
        if attempt > 0 {
            stats.endpoint_retries.inc();
        }
        match tokio::time::timeout(timeout, TcpStream::connect(endpoint)).await {
            Ok(Ok(stream)) => return Some(stream),
            Ok(Err(error)) => {
                tracing::debug!(service = %state.name, %endpoint, %error, "connect failed");
            }
            Err(_) => {
                tracing::debug!(service = %state.name, %endpoint, ?timeout, "connect timed out");
            }
        }
        stats.connect_failures.inc();
        reset_affinity = true;
    }
    tracing::warn!(service = %state.name, %client, "no endpoint accepted the connection after {} tries", DIAL_TIMEOUTS.len());
    None
}
