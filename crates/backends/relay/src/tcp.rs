//! TCP: a listener per service port, and how its sockets are made (upstream's
//! `tcpProxySocket`). A listener is one socket per TCP thread ([`crate::workers`]), all
//! bound to the service port's one port with `SO_REUSEPORT`: the kernel hands each new
//! connection to one of them, so exactly one thread wakes up for it (a descriptor shared
//! by every thread's epoll would wake them all), and the connection stays on that thread,
//! whose event loop ([`crate::reactor`]) accepts it, dials an endpoint and carries it.
//!
//! A connection goes to the balancer's pick; a connect that fails or outlasts its dial
//! timeout ([`DIAL_TIMEOUTS`]: upstream's ladder, so at most four endpoints and 3.75 s) is
//! retried on the next pick, with the client's affinity reset.
//!
//! Small messages are never held back (Nagle's algorithm is off on both sockets, as in
//! upstream's Go proxy): the listener's `TCP_NODELAY` is inherited by every connection it
//! accepts, and the endpoint's socket gets it before its connect, so no connection pays a
//! system call of its own for it.
//!
//! A port without endpoints has no listener, only a bound socket holding its port
//! ([`Listener::Held`]): the kernel answers a connection to it with a reset, so clients are
//! refused at once, as the other modes' REJECT rules do, instead of being accepted and
//! closed. Closing or holding the listener never touches carried connections; only closing
//! the Service port ([`crate::workers::Workers::close_port`]) ends them.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, Backlog, Shutdown, SockFlag, SockType, SockaddrStorage, getsockname, setsockopt, shutdown,
    sockopt,
};

use crate::limits::Slots;
use crate::port::PortState;
use crate::reactor::Command;
use crate::workers::Worker;

/// Upstream's `endpointDialTimeouts`: one try per entry, each on another pick.
pub const DIAL_TIMEOUTS: [Duration; 4] = [
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
];

/// Pending connections the kernel queues per listener.
const BACKLOG: i32 = 4096;

/// A service port's TCP socket: accepting, or only holding its port.
#[derive(Debug)]
pub enum Listener {
    Accepting { port: u16, accepting: Accepting },
    Held { port: u16, socket: OwnedFd },
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

/// The listening sockets of one port, a socket on each TCP thread it accepts on. Each
/// socket is shared with its thread, so that dropping this stops the listening at once
/// (`shutdown(SHUT_RD)` takes a listener out of LISTEN synchronously, so the very next
/// connection is refused and the port can be bound again) while the descriptor is still
/// certainly the socket's, not a number the kernel has since given to another file; the
/// threads let go of theirs a moment later, which closes them.
#[derive(Debug)]
pub struct Accepting {
    listeners: Vec<(Arc<TcpListener>, Worker)>,
}

impl Drop for Accepting {
    fn drop(&mut self) {
        for (listener, worker) in &self.listeners {
            let _ = shutdown(listener.as_raw_fd(), Shutdown::Read);
            worker.send(Command::Unlisten(Arc::clone(listener)));
        }
    }
}

/// Binds `ip:port` (port 0: the kernel picks) without listening, so the port is ours but
/// connections to it are refused. Returns the socket and its port.
pub fn bind(ip: IpAddr, port: u16) -> io::Result<(OwnedFd, u16)> {
    let socket = listener_socket(ip)?;
    nix::sys::socket::bind(
        socket.as_raw_fd(),
        &SockaddrStorage::from(SocketAddr::new(ip, port)),
    )?;
    let port = local_address(&socket)?.port();
    Ok((socket, port))
}

fn local_address(socket: &OwnedFd) -> io::Result<SocketAddr> {
    let address: SockaddrStorage = getsockname(socket.as_raw_fd())?;
    if let Some(v4) = address.as_sockaddr_in() {
        return Ok(SocketAddr::V4((*v4).into()));
    }
    if let Some(v6) = address.as_sockaddr_in6() {
        return Ok(SocketAddr::V6((*v6).into()));
    }
    Err(io::ErrorKind::InvalidInput.into())
}

/// A non-blocking stream socket of `address`'s family.
fn stream_socket(address: IpAddr) -> io::Result<OwnedFd> {
    let family = match address {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
    Ok(nix::sys::socket::socket(family, SockType::Stream, flags, None)?)
}

/// A socket for one of a port's listeners, not bound yet.
fn listener_socket(ip: IpAddr) -> io::Result<OwnedFd> {
    let socket = stream_socket(ip)?;
    if ip.is_ipv6() {
        // The IPv4 family has its own listeners, possibly on the same port numbers.
        setsockopt(&socket, sockopt::Ipv6V6Only, &true)?;
    }
    // A port we held a moment ago (the listener was closed and is opened again) may still
    // have connections in TIME_WAIT.
    setsockopt(&socket, sockopt::ReuseAddr, &true)?;
    // The port's other listeners join it (see the module docs). The kernel still never
    // picks a port for port 0 that another socket holds, reuse-port or not, and the
    // caller never asks for a port it already has (userspace mode's allocator, say).
    setsockopt(&socket, sockopt::ReusePort, &true)?;
    // Inherited by every accepted connection (see the module docs).
    setsockopt(&socket, sockopt::TcpNoDelay, &true)?;
    Ok(socket)
}

/// Starts accepting on a held socket and as many more on its address as there are
/// `threads`, a listener on each thread's event loop (from any thread).
pub fn accept(
    socket: OwnedFd,
    port: u16,
    state: Arc<PortState>,
    slots: Arc<Slots>,
    threads: &[Worker],
) -> io::Result<Listener> {
    let ip = local_address(&socket)?.ip();
    let mut sockets = vec![socket];
    for _ in 1..threads.len() {
        sockets.push(bind(ip, port)?.0);
    }
    // Built up in place: if a later socket fails, those already listening are shut down.
    let mut accepting = Accepting {
        listeners: Vec::with_capacity(threads.len()),
    };
    let backlog = Backlog::new(BACKLOG).unwrap_or(Backlog::MAXCONN);
    for (worker, socket) in threads.iter().zip(sockets) {
        nix::sys::socket::listen(&socket, backlog)?;
        let listener = Arc::new(TcpListener::from(socket));
        worker.send(Command::Listen {
            listener: Arc::clone(&listener),
            state: Arc::clone(&state),
            slots: Arc::clone(&slots),
        });
        accepting.listeners.push((listener, worker.clone()));
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
    threads: &[Worker],
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

/// Starts connecting to `endpoint` with Nagle's algorithm off from the start. The connect
/// is under way when this returns: the socket's first writable event says it is done, an
/// error or hang-up event that it failed (so `SO_ERROR` is asked only of failed ones).
pub fn start_connect(endpoint: SocketAddr) -> io::Result<TcpStream> {
    let socket = stream_socket(endpoint.ip())?;
    setsockopt(&socket, sockopt::TcpNoDelay, &true)?;
    match nix::sys::socket::connect(socket.as_raw_fd(), &SockaddrStorage::from(endpoint)) {
        Ok(()) | Err(Errno::EINPROGRESS) => Ok(TcpStream::from(socket)),
        Err(error) => Err(error.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    fn nodelay(socket: &impl std::os::fd::AsFd) -> bool {
        nix::sys::socket::getsockopt(socket, sockopt::TcpNoDelay).unwrap()
    }

    /// What saves a system call per connection: an accepted connection has the listener's
    /// `TCP_NODELAY`, the endpoint's socket its own (loopback of the test's own namespace).
    #[test]
    fn accepted_and_dialled_connections_have_no_delay() {
        let (socket, port) = bind(IpAddr::from([127, 0, 0, 1]), 0).unwrap();
        nix::sys::socket::listen(&socket, Backlog::new(16).unwrap()).unwrap();
        let listener = std::net::TcpListener::from(socket);
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        assert!(nodelay(&accepted));
        assert!(!nodelay(&client), "the client's own socket is not ours");
        let endpoint = start_connect(SocketAddr::from(([127, 0, 0, 1], port))).unwrap();
        assert!(nodelay(&endpoint));
    }

    /// Bound and not listening: the port is held and a connect to it is refused, in both
    /// families, and the IPv6 socket leaves the IPv4 port number free.
    #[test]
    fn a_held_port_refuses_connections() {
        for ip in [IpAddr::from([127, 0, 0, 1]), IpAddr::from(Ipv6Addr::LOCALHOST)] {
            let (_held, port) = bind(ip, 0).unwrap();
            assert_ne!(port, 0);
            let refused = std::net::TcpStream::connect(SocketAddr::new(ip, port)).unwrap_err();
            assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused, "{ip}");
        }
    }
}
