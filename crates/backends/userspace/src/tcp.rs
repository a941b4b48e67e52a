//! TCP: a listener per service port, one task per carried connection (upstream's
//! `tcpProxySocket.ProxyLoop`, `tryConnect` and `proxyTCP`). A listener is one socket per
//! TCP thread ([`crate::workers`]), all bound to the service port's one port with
//! `SO_REUSEPORT`: the kernel hands each new connection to one of them, so exactly one
//! thread wakes up for it (a descriptor shared by every thread's epoll would wake them
//! all), and the connection stays on that thread.
//!
//! A connection goes to the balancer's pick; a connect that fails or outlasts its dial
//! timeout (250 ms, 500 ms, 1 s, 2 s: upstream's ladder, so at most four endpoints and
//! 3.75 s) is retried on the next pick, with the client's affinity reset. When every try
//! failed the client's connection is closed. Bytes then flow both ways until both sides
//! closed (a half-close is passed on), through [`crate::copy`].
//!
//! Small messages are never held back (Nagle's algorithm is off on both sockets, as in
//! upstream's Go proxy): the listener's `TCP_NODELAY` is inherited by every connection it
//! accepts, and the endpoint's socket gets it before its connect, so no connection pays a
//! system call of its own for it.
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

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, Shutdown, SockFlag, SockType, SockaddrStorage, setsockopt, shutdown, sockopt,
};
use tokio::io::Interest;
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

    /// Descriptors it holds: one while held, one per thread it accepts on while accepting.
    pub fn descriptors(&self) -> usize {
        match self {
            Listener::Held { .. } => 1,
            Listener::Accepting { accepting, .. } => accepting.listeners.len(),
        }
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

/// The listening sockets of one port and their accept loops, a socket and a loop per TCP
/// thread. Each socket is shared with its loop, so that dropping this stops the listening
/// at once (`shutdown(SHUT_RD)` takes a listener out of LISTEN synchronously, so the very
/// next connection is refused and the port can be bound again) while the descriptor is
/// still certainly the socket's, not a number the kernel has since given to another file;
/// the loops end on their threads a moment later and close the sockets.
#[derive(Debug)]
pub struct Accepting {
    listeners: Vec<Arc<TcpListener>>,
    _tasks: Vec<AbortOnDrop>,
}

impl Drop for Accepting {
    fn drop(&mut self) {
        for listener in &self.listeners {
            let _ = shutdown(listener.as_raw_fd(), Shutdown::Read);
        }
    }
}

/// Binds `ip:port` (port 0: the kernel picks) without listening, so the port is ours but
/// connections to it are refused. Returns the socket and its port.
pub fn bind(ip: IpAddr, port: u16) -> io::Result<(TcpSocket, u16)> {
    let socket = listener_socket(ip)?;
    socket.bind(SocketAddr::new(ip, port))?;
    let port = socket.local_addr()?.port();
    Ok((socket, port))
}

/// A socket for one of a port's listeners, not bound yet.
fn listener_socket(ip: IpAddr) -> io::Result<TcpSocket> {
    let socket = match ip {
        IpAddr::V4(_) => TcpSocket::new_v4()?,
        IpAddr::V6(_) => {
            let socket = TcpSocket::new_v6()?;
            // The IPv4 family has its own listeners, possibly on the same port numbers.
            setsockopt(&socket, sockopt::Ipv6V6Only, &true)?;
            socket
        }
    };
    // A port we held a moment ago (the listener was closed and is opened again) may still
    // have connections in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    // The port's other listeners join it (see the module docs). The kernel still never
    // picks a port for port 0 that another socket holds, reuse-port or not, and the
    // allocator never hands out a port twice.
    socket.set_reuseport(true)?;
    // Inherited by every accepted connection (see the module docs).
    socket.set_nodelay(true)?;
    Ok(socket)
}

/// Starts accepting on a held socket and as many more on its address as there are
/// `threads`, a listener and its accept loop on each thread (from any thread).
pub fn accept(
    socket: TcpSocket,
    port: u16,
    state: Arc<PortState>,
    slots: Arc<Slots>,
    threads: &[Handle],
) -> io::Result<Listener> {
    let address = socket.local_addr()?;
    let mut sockets = vec![socket];
    for _ in 1..threads.len() {
        let socket = listener_socket(address.ip())?;
        socket.bind(address)?;
        sockets.push(socket);
    }
    // Built up in place: if a later socket fails, those already listening are shut down.
    let mut accepting = Accepting {
        listeners: Vec::with_capacity(threads.len()),
        _tasks: Vec::with_capacity(threads.len()),
    };
    for (thread, socket) in threads.iter().zip(sockets) {
        let listener = {
            let _entered = thread.enter();
            Arc::new(socket.listen(BACKLOG)?)
        };
        let task = thread.spawn(accept_loop(listener.clone(), state.clone(), slots.clone()));
        accepting.listeners.push(listener);
        accepting._tasks.push(AbortOnDrop(task));
    }
    Ok(Listener::Accepting { port, accepting })
}

/// A listener that accepts when `has_endpoints`, else only holds its port; connections it
/// already accepted are not affected either way.
pub fn retarget(
    listener: Listener,
    has_endpoints: bool,
    ip: IpAddr,
    state: &Arc<PortState>,
    slots: &Arc<Slots>,
    threads: &[Handle],
) -> io::Result<Listener> {
    match (has_endpoints, listener) {
        (true, Listener::Held { port, socket }) => {
            accept(socket, port, state.clone(), slots.clone(), threads)
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
            match copy_both_ways(state.copy, &client, &endpoint, stats).await {
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
        match tokio::time::timeout(timeout, connect_to(endpoint)).await {
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

/// A connection to `endpoint` with Nagle's algorithm off from the start.
///
/// Whether the connect worked is read from the readiness event that ends the wait: a
/// refused or unreachable connect closes the socket (`EPOLLHUP`), a working one only makes
/// it writable. So the error is asked of the kernel (`SO_ERROR`) only when there is one,
/// not on every connection as `TcpSocket::connect` does.
async fn connect_to(endpoint: SocketAddr) -> io::Result<TcpStream> {
    let family = match endpoint {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
    let socket = nix::sys::socket::socket(family, SockType::Stream, flags, None)?;
    setsockopt(&socket, sockopt::TcpNoDelay, &true)?;
    match nix::sys::socket::connect(socket.as_raw_fd(), &SockaddrStorage::from(endpoint)) {
        Ok(()) | Err(Errno::EINPROGRESS) => {}
        Err(error) => return Err(error.into()),
    }
    let stream = TcpStream::from_std(std::net::TcpStream::from(socket))?;
    let ready = stream.ready(Interest::WRITABLE).await?;
    if ready.is_write_closed() {
        let error = stream.take_error()?;
        return Err(error.unwrap_or_else(|| io::ErrorKind::ConnectionRefused.into()));
    }
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What saves a system call per connection: an accepted connection has the listener's
    /// `TCP_NODELAY` (loopback of the test's own namespace).
    #[test]
    fn accepted_connections_inherit_no_delay_from_the_listener() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (socket, port) = bind(IpAddr::from([127, 0, 0, 1]), 0).unwrap();
            let listener = socket.listen(16).unwrap();
            let client = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            let (accepted, _) = listener.accept().await.unwrap();
            assert!(accepted.nodelay().unwrap());
            assert!(!client.nodelay().unwrap(), "the client's own socket is not ours");
            let endpoint = connect_to(SocketAddr::from(([127, 0, 0, 1], port)))
                .await
                .unwrap();
            assert!(endpoint.nodelay().unwrap());
        });
    }

    /// Without the `SO_ERROR` question on every connect, a refused connect must still be
    /// seen as refused (the dial ladder moves on), in both families.
    #[test]
    fn a_refused_connect_is_an_error_and_a_working_one_is_not() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            for ip in [
                IpAddr::from([127, 0, 0, 1]),
                IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
            ] {
                // Bound, not listening: the kernel answers a connect with a reset.
                let (held, port) = bind(ip, 0).unwrap();
                let refused = connect_to(SocketAddr::new(ip, port)).await.unwrap_err();
                assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused, "{ip}");
                let listener = held.listen(16).unwrap();
                let stream = connect_to(SocketAddr::new(ip, port)).await.unwrap();
                let (accepted, _) = listener.accept().await.unwrap();
                assert_eq!(stream.local_addr().unwrap(), accepted.peer_addr().unwrap());
            }
        });
    }
}
