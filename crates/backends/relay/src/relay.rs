//! [`Relay`]: the service ports one caller serves in the process, each a listener on an
//! address the caller chose, carried to the endpoints the caller gives it.
//!
//! Why a type of its own: the data path has more than one user. Userspace mode opens a
//! listener per service port on a port of its range and writes portals (iptables rules)
//! that redirect the Service's addresses to it; nftables mode is to serve NodePorts on the
//! loopback address (upstream 1.37, KEP-6032) with a listener per TCP NodePort on
//! `127.0.0.1:<nodePort>` (tests/loopback.rs drives a relay that way). Both drive the same
//! three calls, open, set endpoints, close, and keep what is their own: where an address
//! comes from, the rules that bring clients to it, the names they count under.
//!
//! What the relay decides for every caller alike:
//!
//! - **A TCP port without endpoints** holds its port without listening, so the kernel
//!   refuses its clients at once (as the other modes' REJECT rules do); with endpoints it
//!   listens ([`crate::tcp`]).
//! - **Which TCP threads accept on a port**: every thread while the listeners hold at most
//!   an eighth of the descriptors set aside for them (each thread then takes its share of
//!   every port's connections), else one, chosen by the port number, so that a node with
//!   many Services needs one descriptor per port, not one per port and thread, and the
//!   ports still spread over the threads.
//! - **A new endpoint list restarts the rotation at a random position**, as upstream
//!   shuffles the list: otherwise every node's proxy would send its first connection to the
//!   same pod.
//! - **Endpoint changes never touch carried connections**; closing a port ends them.
//! - **A TCP address is held once.** The listeners share their port with `SO_REUSEPORT`
//!   ([`crate::tcp`]), which would as well let a second port of the same relay bind the
//!   same address and split its connections with the first, so [`Relay::bind`] refuses an
//!   address one of its ports holds, as the kernel refuses another process's.
//!
//! Sockets are bound and listening when a call returns: a caller that writes rules after
//! it has a listener for every rule they lead to. The TCP threads start with the first TCP
//! port that is given endpoints, in the calling thread's network namespace; UDP runs on the
//! caller's tokio runtime, reached through a [`Handle`] (the calls may come from a blocking
//! thread of it).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroUsize;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;

use crate::balancer::PortBalancer;
use crate::copy::CopyMethod;
use crate::limits::{Budget, Kind, LimitObserver, ListenerDescriptors, Slots};
use crate::port::{PortState, PortStats};
use crate::tcp::{self, Listener};
use crate::udp::{self, UdpListener};
use crate::workers::{self, Worker, Workers};

/// What a port carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    Tcp,
    Udp,
}

/// A socket bound for a service port and not serving yet ([`Relay::bind`]): it holds its
/// port, and a TCP connection to it is refused. Dropped, it gives the port back.
#[derive(Debug)]
pub struct Bound {
    socket: BoundSocket,
    address: SocketAddr,
}

#[derive(Debug)]
enum BoundSocket {
    Tcp(OwnedFd),
    Udp(std::net::UdpSocket),
}

impl Bound {
    /// The port it holds (the kernel's choice when it was bound to port 0).
    pub fn port(&self) -> u16 {
        self.address.port()
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    pub fn transport(&self) -> Transport {
        match self.socket {
            BoundSocket::Tcp(_) => Transport::Tcp,
            BoundSocket::Udp(_) => Transport::Udp,
        }
    }
}

/// How a relay carries its ports' traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayOptions {
    /// `IPv4` or `IPv6`: how its log lines name the family it serves.
    pub ip_family: &'static str,
    /// How long a UDP session lives without a datagram either way (`--udp-timeout`).
    pub udp_timeout: Duration,
    /// How TCP bytes are moved (splice unless a measurement says otherwise).
    pub copy: CopyMethod,
    /// TCP threads ([`crate::workers`]).
    pub tcp_threads: NonZeroUsize,
}

impl RelayOptions {
    /// Upstream's 250 ms UDP timeout, [`CopyMethod::Auto`], a TCP thread per core.
    pub fn new(ip_family: &'static str) -> Self {
        Self {
            ip_family,
            udp_timeout: Duration::from_millis(250),
            copy: CopyMethod::default(),
            tcp_threads: workers::default_count(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The listeners of every relay of the budget hold all the descriptors set aside for
    /// them ([`crate::Limits::max_listener_descriptors`]). A port opened before keeps its
    /// port and refuses connections.
    #[error(
        "no file descriptor left for another listener: the listeners hold {used} of the {limit} set aside for them"
    )]
    Descriptors { used: usize, limit: usize },
    #[error("cannot start the TCP threads: {0}")]
    Threads(#[source] io::Error),
    /// A UDP socket could not join the runtime; the port is not open.
    #[error("cannot serve port {port}: {source}")]
    Serve {
        port: u16,
        #[source]
        source: io::Error,
    },
    /// A TCP port could not start or stop listening: it was closed, with its connections.
    #[error("cannot change the listener on port {port}, so it was closed: {source}")]
    Closed {
        port: u16,
        #[source]
        source: io::Error,
    },
    #[error("no such port is open")]
    NotOpen,
}

/// A port's socket.
#[derive(Debug)]
enum Socket {
    Tcp(Listener),
    Udp(UdpListener),
}

impl Socket {
    fn port(&self) -> u16 {
        match self {
            Socket::Tcp(listener) => listener.port(),
            Socket::Udp(listener) => listener.port(),
        }
    }

    fn descriptors(&self) -> usize {
        match self {
            Socket::Tcp(listener) => listener.descriptors(),
            Socket::Udp(_) => 1,
        }
    }
}

/// One open port.
#[derive(Debug)]
struct RelayPort {
    state: Arc<PortState>,
    socket: Socket,
    /// Where it was bound; a TCP port without endpoints binds here again.
    address: SocketAddr,
}

/// A set of service ports, each known to the caller by a key `K` (userspace mode: the
/// service port's name; a NodePort server: its port number). See the module docs.
pub struct Relay<K> {
    options: RelayOptions,
    runtime: Handle,
    /// Started with the first TCP port given endpoints.
    workers: Option<Workers>,
    budget: Budget,
    observer: Option<Arc<dyn LimitObserver>>,
    connections: Arc<Slots>,
    udp_sessions: Arc<Slots>,
    /// Descriptors the open ports' sockets hold (see
    /// [`crate::Limits::max_listener_descriptors`]).
    listener_descriptors: ListenerDescriptors,
    ports: HashMap<K, RelayPort>,
    /// The addresses the open TCP ports hold, by port number (see [`Relay::bind`]).
    tcp_addresses: HashMap<u16, Vec<IpAddr>>,
    random: RandomState,
}

impl<K> std::fmt::Debug for Relay<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("options", &self.options)
            .field("ports", &self.ports.len())
            .field("listener_descriptors", &self.listener_descriptors.own())
            .finish_non_exhaustive()
    }
}

impl<K: Eq + Hash> Relay<K> {
    /// A relay drawing on `budget` (shared with the process's other relays: they draw on
    /// one descriptor limit), its UDP ports on `runtime`.
    pub fn new(options: RelayOptions, budget: &Budget, runtime: Handle) -> Self {
        Self {
            connections: Arc::new(budget.slots(Kind::Connections, options.ip_family, None)),
            udp_sessions: Arc::new(budget.slots(Kind::UdpSessions, options.ip_family, None)),
            listener_descriptors: budget.listener_descriptors(),
            budget: budget.clone(),
            observer: None,
            options,
            runtime,
            workers: None,
            ports: HashMap::new(),
            tcp_addresses: HashMap::new(),
            random: RandomState::new(),
        }
    }

    /// Tells `observer` of every connection and UDP session refused at its limit. Before the
    /// first port opens: an open port keeps reporting where it did.
    pub fn observe_limits(&mut self, observer: Arc<dyn LimitObserver>) {
        let family = self.options.ip_family;
        let slots = |kind| Arc::new(self.budget.slots(kind, family, Some(Arc::clone(&observer))));
        self.connections = slots(Kind::Connections);
        self.udp_sessions = slots(Kind::UdpSessions);
        self.observer = Some(observer);
    }

    /// Binds `address` (port 0: the kernel picks) for a port to [`open`](Relay::open),
    /// without serving. An address one of this relay's TCP ports holds is refused with
    /// [`io::ErrorKind::AddrInUse`], as one another process holds is (see the module docs),
    /// so a caller scanning a range for a free port moves on.
    pub fn bind(&self, transport: Transport, address: SocketAddr) -> io::Result<Bound> {
        let ip = address.ip();
        let (socket, port) = match transport {
            Transport::Tcp => {
                if self.holds_tcp(address) {
                    return Err(io::ErrorKind::AddrInUse.into());
                }
                let (socket, port) = tcp::bind(ip, address.port())?;
                (BoundSocket::Tcp(socket), port)
            }
            Transport::Udp => {
                let (socket, port) = udp::bind(ip, address.port())?;
                (BoundSocket::Udp(socket), port)
            }
        };
        Ok(Bound {
            socket,
            address: SocketAddr::new(ip, port),
        })
    }

    /// Whether an open TCP port holds `address`: the same port on the same address, or on
    /// every address of the family, either way.
    fn holds_tcp(&self, address: SocketAddr) -> bool {
        let ip = address.ip();
        self.tcp_addresses.get(&address.port()).is_some_and(|held| {
            held.iter().any(|other| {
                other.is_ipv4() == ip.is_ipv4()
                    && (*other == ip || other.is_unspecified() || ip.is_unspecified())
            })
        })
    }

    /// Whether the listeners (of every relay of the budget) have a descriptor to spare for
    /// another port: a caller asks before it binds one.
    pub fn room_for_listener(&self) -> Result<(), RelayError> {
        if self.listener_descriptors.spare(1) {
            Ok(())
        } else {
            Err(self.out_of_descriptors())
        }
    }

    fn out_of_descriptors(&self) -> RelayError {
        RelayError::Descriptors {
            used: self.listener_descriptors.total(),
            limit: self.listener_descriptors.limit(),
        }
    }

    /// Opens `bound` as the port `key` (replacing a port open under it), named `name` in
    /// logs (`namespace/name:port`), counting into `stats`. It has no endpoints yet: a UDP
    /// port drops what it receives, a TCP port refuses connections until
    /// [`set_endpoints`](Relay::set_endpoints) gives it some.
    pub fn open(&mut self, key: K, bound: Bound, name: String, stats: PortStats) -> Result<(), RelayError> {
        self.close(&key);
        self.room_for_listener()?;
        let state = PortState::new(name, PortBalancer::new(None), stats, self.options.copy);
        let Bound { socket, address } = bound;
        let port = address.port();
        let socket = match socket {
            BoundSocket::Udp(socket) => {
                let served = udp::serve(
                    socket,
                    port,
                    Arc::clone(&state),
                    Arc::clone(&self.udp_sessions),
                    self.options.udp_timeout,
                    &self.runtime,
                );
                Socket::Udp(served.map_err(|source| RelayError::Serve { port, source })?)
            }
            BoundSocket::Tcp(socket) => {
                self.tcp_addresses.entry(port).or_default().push(address.ip());
                Socket::Tcp(Listener::Held { port, socket })
            }
        };
        let held = self.listener_descriptors.own() + socket.descriptors();
        self.listener_descriptors.set(held);
        self.ports.insert(
            key,
            RelayPort {
                state,
                socket,
                address,
            },
        );
        Ok(())
    }

    /// Gives the port `key` its endpoints and ClientIP affinity (`Some(timeout)`), replacing
    /// the previous ones; connections it carries keep their endpoints. A TCP port listens
    /// when it has endpoints and holds its port without listening when it has none.
    ///
    /// [`RelayError::Descriptors`]: the port has endpoints but stays refusing until
    /// descriptors are spared (ask again). [`RelayError::Closed`]: the port is gone (open it
    /// again).
    pub fn set_endpoints(
        &mut self,
        key: &K,
        endpoints: Vec<SocketAddr>,
        affinity: Option<Duration>,
    ) -> Result<(), RelayError> {
        let is_tcp = match self.ports.get(key) {
            None => return Err(RelayError::NotOpen),
            Some(open) => matches!(open.socket, Socket::Tcp(_)),
        };
        if is_tcp {
            self.start_tcp_threads()?;
        }
        let start = self.random_start();
        let Some((key, mut open)) = self.ports.remove_entry(key) else {
            return Err(RelayError::NotOpen);
        };
        let has_endpoints = !endpoints.is_empty();
        open.state.balancer(|b| {
            b.set_affinity(affinity);
            b.set_endpoints(endpoints, start);
        });
        if let Socket::Tcp(listener) = open.socket {
            let before = listener.descriptors();
            let listening_port = listener.port();
            let threads = self.accepting_threads(listening_port);
            // Held until the descriptors can be spared: refused, as without endpoints. (The
            // held socket becomes the first thread's listener.)
            let accept = has_endpoints
                && (listener.is_accepting()
                    || self.listener_descriptors.spare(threads.len().saturating_sub(1)));
            let ip = open.address.ip();
            match tcp::retarget(listener, accept, ip, &open.state, &self.connections, threads) {
                Ok(listener) => {
                    let held = self.listener_descriptors.own() - before + listener.descriptors();
                    self.listener_descriptors.set(held);
                    open.socket = Socket::Tcp(listener);
                }
                Err(source) => {
                    let held = self.listener_descriptors.own() - before;
                    self.listener_descriptors.set(held);
                    self.end(&open.state, open.address, true);
                    return Err(RelayError::Closed {
                        port: listening_port,
                        source,
                    });
                }
            }
            let held_for_want_of_descriptors = has_endpoints && !accept;
            self.ports.insert(key, open);
            if held_for_want_of_descriptors {
                return Err(self.out_of_descriptors());
            }
            return Ok(());
        }
        self.ports.insert(key, open);
        Ok(())
    }

    /// Closes the port `key`: its listener, its connections and UDP sessions. Returns the
    /// port it had, `None` if none was open.
    pub fn close(&mut self, key: &K) -> Option<u16> {
        let open = self.ports.remove(key)?;
        let held = self.listener_descriptors.own() - open.socket.descriptors();
        self.listener_descriptors.set(held);
        self.end(&open.state, open.address, matches!(open.socket, Socket::Tcp(_)));
        // The socket closes here, after its connections were told to end.
        Some(open.socket.port())
    }

    /// Ends a port's connections and sessions and forgets its address.
    fn end(&mut self, state: &Arc<PortState>, address: SocketAddr, tcp: bool) {
        state.close();
        if let Some(workers) = &self.workers {
            workers.close_port(state);
        }
        if tcp && let Some(held) = self.tcp_addresses.get_mut(&address.port()) {
            if let Some(at) = held.iter().position(|ip| *ip == address.ip()) {
                held.swap_remove(at);
            }
            if held.is_empty() {
                self.tcp_addresses.remove(&address.port());
            }
        }
    }

    /// The port `key` listens on.
    pub fn port(&self, key: &K) -> Option<u16> {
        self.ports.get(key).map(|open| open.socket.port())
    }

    /// Every open port: its key and the port it listens on.
    pub fn ports(&self) -> impl Iterator<Item = (&K, u16)> {
        self.ports.iter().map(|(key, open)| (key, open.socket.port()))
    }

    /// Open ports.
    pub fn len(&self) -> usize {
        self.ports.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ports.is_empty()
    }

    /// Forgets the ClientIP affinity of clients quiet for their port's timeout (upstream
    /// prunes at every sync), so the balancers never outgrow the active clients.
    pub fn prune(&self, now: Instant) {
        for open in self.ports.values() {
            open.state.balancer(|b| b.prune(now));
        }
    }

    /// Clients with a sticky endpoint, over all ports (size checks).
    pub fn sticky_clients(&self) -> usize {
        self.ports
            .values()
            .map(|open| open.state.balancer(|b| b.sticky_clients()))
            .sum()
    }

    /// Descriptors this relay's listeners hold.
    pub fn listener_descriptors(&self) -> usize {
        self.listener_descriptors.own()
    }

    /// TCP connections carried now, over all ports (and the budget's other relays).
    pub fn active_connections(&self) -> usize {
        self.connections.in_use()
    }

    /// UDP sessions held now, over all ports (and the budget's other relays).
    pub fn active_udp_sessions(&self) -> usize {
        self.udp_sessions.in_use()
    }

    /// Listeners and connections the TCP threads hold (tests: nothing may leak).
    pub fn tcp_held(&self) -> usize {
        self.workers.as_ref().map_or(0, Workers::held)
    }

    /// The TCP threads a listener that starts accepting accepts on (see the module docs).
    fn accepting_threads(&self, port: u16) -> &[Worker] {
        let all = self.workers.as_ref().map_or(&[][..], Workers::threads);
        let eighth = self.listener_descriptors.limit() / 8;
        if all.len() <= 1 || self.listener_descriptors.total() + all.len() <= eighth {
            return all;
        }
        let one = usize::from(port) % all.len();
        &all[one..=one]
    }

    /// Starts the TCP threads unless they run.
    fn start_tcp_threads(&mut self) -> Result<(), RelayError> {
        if self.workers.is_none() {
            let workers = Workers::start(self.options.tcp_threads).map_err(RelayError::Threads)?;
            tracing::info!(threads = workers.threads().len(), "started the TCP threads");
            self.workers = Some(workers);
        }
        Ok(())
    }

    fn random_start(&self) -> usize {
        usize::try_from(self.random.hash_one(Instant::now()) % 65_536).unwrap_or(0)
    }
}

impl<K> Drop for Relay<K> {
    /// Ends the UDP ports' sessions; the TCP threads end their connections as they stop.
    fn drop(&mut self) {
        for open in self.ports.values() {
            open.state.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Limits;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A TCP address a port holds is refused to another port of the relay, on it or on
    /// every address of its family, and free again once the port closed; the other family
    /// and UDP are not affected (loopback of the test's own namespace).
    #[test]
    fn an_address_a_tcp_port_holds_is_refused_until_it_closes() {
        let rt = runtime();
        let mut relay: Relay<&str> = Relay::new(
            RelayOptions::new("IPv4"),
            &Budget::new(Limits::default()),
            rt.handle().clone(),
        );
        let bound = relay
            .bind(Transport::Tcp, SocketAddr::from(([127, 0, 0, 1], 0)))
            .unwrap();
        let port = bound.port();
        relay
            .open("web", bound, "default/web:http".into(), PortStats::default())
            .unwrap();
        assert_eq!(relay.listener_descriptors(), 1);
        let at = |ip: IpAddr| SocketAddr::new(ip, port);
        let loopback = IpAddr::from([127, 0, 0, 1]);
        for taken in [loopback, IpAddr::from([0, 0, 0, 0])] {
            let refused = relay.bind(Transport::Tcp, at(taken)).unwrap_err();
            assert_eq!(refused.kind(), io::ErrorKind::AddrInUse, "{taken}");
        }
        assert!(
            relay
                .bind(Transport::Tcp, at(IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1])))
                .is_ok()
        );
        assert!(relay.bind(Transport::Udp, at(loopback)).is_ok());

        assert_eq!(relay.close(&"web"), Some(port));
        assert_eq!(relay.close(&"web"), None);
        assert!(relay.tcp_addresses.is_empty());
        assert_eq!(relay.listener_descriptors(), 0);
        assert!(relay.bind(Transport::Tcp, at(loopback)).is_ok());
        assert!(matches!(
            relay.set_endpoints(&"web", Vec::new(), None),
            Err(RelayError::NotOpen)
        ));
    }
}
