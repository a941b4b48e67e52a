//! UDP: one socket per service port, a session per client address (upstream's
//! `udpProxySocket`).
//!
//! The first datagram of a client picks an endpoint and opens a socket connected to it;
//! the client's later datagrams go through that socket, and a task relays the endpoint's
//! replies back through the service port's socket, so the client hears from the address
//! and port it sent to (the NAT of a rule that redirected the client here, such as a
//! portal, is undone by conntrack on the way out). A session ends when neither side sent
//! for `--udp-timeout` (upstream's idle deadline, refreshed by every datagram), when its
//! endpoint's socket fails, or when the Service port is removed. A session whose endpoint
//! left the port is left at the client's next datagram, which opens a new one: the kernel
//! modes delete such a flow's conntrack entry for the same reason. A client that keeps
//! sending would otherwise stay on a pod that left the Service, or on a dead one that sends
//! no ICMP error, for as long as it sends (upstream's userspace proxy kept it there).
//! Sessions count against the relay's UDP session limit; a datagram that would open one
//! past it is dropped.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;
use tokio::runtime::Handle;
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinHandle;

use crate::limits::Slots;
use crate::port::{PortState, wait_closed};

/// Largest datagram relayed (UDP's maximum payload).
const DATAGRAM: usize = 65_535;

/// A task that ends with its owner.
#[derive(Debug)]
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A service port's UDP socket and its relay task.
#[derive(Debug)]
pub struct UdpListener {
    port: u16,
    _task: AbortOnDrop,
}

impl UdpListener {
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// Binds `ip:port` (0: the kernel picks) and returns the std socket and its port.
pub fn bind(ip: IpAddr, port: u16) -> io::Result<(std::net::UdpSocket, u16)> {
    if ip.is_ipv6() && ip.is_unspecified() {
        // std binds `[::]` dual-stack; the IPv4 family has its own sockets, possibly on the
        // same port numbers, so this one must take IPv6 only: bind through tokio's socket.
        return bind_v6_only(ip, port);
    }
    let socket = std::net::UdpSocket::bind(SocketAddr::new(ip, port))?;
    socket.set_nonblocking(true)?;
    let port = socket.local_addr()?.port();
    Ok((socket, port))
}

fn bind_v6_only(ip: IpAddr, port: u16) -> io::Result<(std::net::UdpSocket, u16)> {
    use nix::sys::socket::{
        AddressFamily, SockFlag, SockType, SockaddrIn6, bind, setsockopt, socket, sockopt,
    };
    let IpAddr::V6(v6) = ip else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    let fd = socket(
        AddressFamily::Inet6,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    setsockopt(&fd, sockopt::Ipv6V6Only, &true)?;
    let address = SockaddrIn6::from(std::net::SocketAddrV6::new(v6, port, 0, 0));
    bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &address)?;
    let socket = std::net::UdpSocket::from(fd);
    let port = socket.local_addr()?.port();
    Ok((socket, port))
}

/// Starts relaying on a bound socket.
pub fn serve(
    socket: std::net::UdpSocket,
    port: u16,
    state: Arc<PortState>,
    slots: Arc<Slots>,
    idle: Duration,
    runtime: &Handle,
) -> io::Result<UdpListener> {
    let _entered = runtime.enter();
    let socket = Arc::new(UdpSocket::from_std(socket)?);
    let relay = Relay {
        socket,
        state,
        slots,
        idle,
        sessions: Arc::default(),
    };
    let task = runtime.spawn(relay.run());
    Ok(UdpListener {
        port,
        _task: AbortOnDrop(task),
    })
}

/// One client's session.
#[derive(Debug)]
struct Session {
    /// The endpoint it was opened to.
    to: SocketAddr,
    endpoint: Arc<UdpSocket>,
    activity: Arc<Activity>,
}

type Sessions = Arc<Mutex<HashMap<SocketAddr, Session>>>;

/// When a session last saw a datagram either way, as milliseconds since it started.
#[derive(Debug)]
struct Activity {
    started: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(now, Ordering::Relaxed);
    }

    /// How long the session has been quiet.
    fn quiet(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(last)
    }
}

struct Relay {
    socket: Arc<UdpSocket>,
    state: Arc<PortState>,
    slots: Arc<Slots>,
    idle: Duration,
    sessions: Sessions,
}

impl Relay {
    async fn run(self) {
        let closed = self.state.closed();
        tokio::select! {
            () = wait_closed(closed) => {}
            () = self.receive() => {}
        }
        // Ends every session's reply task (they watch the same signal) and their sockets.
        lock(&self.sessions).clear();
    }

    async fn receive(&self) {
        let mut buffer = vec![0u8; DATAGRAM];
        loop {
            let (size, client) = match self.socket.recv_from(&mut buffer).await {
                Ok(received) => received,
                Err(error) => {
                    tracing::debug!(service = %self.state.name, %error, "UDP receive failed");
                    continue;
                }
            };
            let Some((endpoint, activity)) = self.session(client).await else {
                continue;
            };
            activity.touch();
            match endpoint.send(&buffer[..size]).await {
                Ok(sent) => {
                    self.state.stats.to_endpoint_bytes.inc_by(sent as u64);
                }
                Err(error) => {
                    tracing::debug!(service = %self.state.name, %client, %error, "UDP send to endpoint failed")
                }
            }
        }
    }

    /// `client`'s session: the existing one, or a new one (`None` without an endpoint or a
    /// free slot).
    async fn session(&self, client: SocketAddr) -> Option<(Arc<UdpSocket>, Arc<Activity>)> {
        {
            let mut sessions = lock(&self.sessions);
            if let Some(session) = sessions.get(&client) {
                if self.state.serves(session.to) {
                    return Some((session.endpoint.clone(), session.activity.clone()));
                }
                // Its endpoint left the port (see the module docs). The old session's reply
                // task ends once it has been idle for `--udp-timeout`: nothing touches it now.
                sessions.remove(&client);
            }
        }
        let slot = self.slots.try_take()?;
        let Some(endpoint) = self.state.pick(client.ip(), false) else {
            tracing::debug!(service = %self.state.name, %client, "no endpoint for UDP client");
            return None;
        };
        let socket = match connect(endpoint).await {
            Ok(socket) => Arc::new(socket),
            Err(error) => {
                self.state.stats.connect_failures.inc();
                tracing::debug!(service = %self.state.name, %endpoint, %error, "UDP connect failed");
                return None;
            }
        };
        let activity = Arc::new(Activity::new());
        lock(&self.sessions).insert(
            client,
            Session {
                to: endpoint,
                endpoint: socket.clone(),
                activity: activity.clone(),
            },
        );
        self.state.stats.udp_sessions.inc();
        self.state.stats.active_udp_sessions.inc();
        let replies = Replies {
            client,
            endpoint: socket.clone(),
            service: self.socket.clone(),
            activity: activity.clone(),
            idle: self.idle,
            state: self.state.clone(),
            sessions: self.sessions.clone(),
            _slot: slot,
        };
        tokio::spawn(replies.run());
        Some((socket, activity))
    }
}

fn lock(sessions: &Sessions) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Session>> {
    sessions.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn connect(endpoint: SocketAddr) -> io::Result<UdpSocket> {
    let any = match endpoint.ip() {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let socket = UdpSocket::bind(SocketAddr::new(any, 0)).await?;
    socket.connect(endpoint).await?;
    Ok(socket)
}

/// The task relaying one session's replies; its end is the session's end.
struct Replies {
    client: SocketAddr,
    endpoint: Arc<UdpSocket>,
    service: Arc<UdpSocket>,
    activity: Arc<Activity>,
    idle: Duration,
    state: Arc<PortState>,
    sessions: Sessions,
    _slot: OwnedSemaphorePermit,
}

impl Replies {
    async fn run(self) {
        tokio::select! {
            () = wait_closed(self.state.closed()) => {}
            () = self.relay() => {}
        }
        {
            let mut sessions = lock(&self.sessions);
            // Only our own session: the client may have a newer one by now.
            if sessions
                .get(&self.client)
                .is_some_and(|s| Arc::ptr_eq(&s.activity, &self.activity))
            {
                sessions.remove(&self.client);
            }
        }
        self.state.stats.active_udp_sessions.dec();
    }

    async fn relay(&self) {
        let mut buffer = vec![0u8; DATAGRAM];
        loop {
            let wait = self.idle.saturating_sub(self.activity.quiet());
            if wait.is_zero() {
                return;
            }
            let size = match tokio::time::timeout(wait, self.endpoint.recv(&mut buffer)).await {
                Err(_) => continue, // re-check: the client may have sent meanwhile
                Ok(Ok(size)) => size,
                Ok(Err(error)) => {
                    // E.g. the endpoint's port is closed (ICMP unreachable).
                    tracing::debug!(service = %self.state.name, client = %self.client, %error, "UDP session ended");
                    return;
                }
            };
            self.activity.touch();
            match self.service.send_to(&buffer[..size], self.client).await {
                Ok(sent) => {
                    self.state.stats.from_endpoint_bytes.inc_by(sent as u64);
                }
                Err(error) => {
                    tracing::debug!(service = %self.state.name, client = %self.client, %error, "UDP reply failed");
                }
            }
        }
    }
}
