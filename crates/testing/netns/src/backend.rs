//! Real TCP and UDP servers standing in for pods' containers.
//!
//! Each answers with a fixed text (usually the pod's name), so a client learns which
//! endpoint the proxy picked, and records who connected, so a test can assert that a
//! backend got traffic and whether the client's source address survived (masquerading).
//! A backend [telling the peer](Netns::tcp_backend_telling_peer) puts that address into
//! each reply, so every single request shows both.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::netns::{Netns, enter};

/// How often an idle backend looks at its stop flags.
const POLL: Duration = Duration::from_millis(20);

/// How long a backend waits to hand its reply to a stalled client.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a backend waits, after replying, for the client to close.
const LINGER: Duration = Duration::from_millis(500);

/// Between the name and the peer address in the replies of
/// [`Netns::tcp_backend_telling_peer`].
const PEER_SEPARATOR: &str = " from ";

/// A server thread inside a namespace; stops (and is joined) on drop, or when its
/// namespace is deleted.
#[derive(Debug)]
pub struct Backend {
    local_addr: SocketAddr,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Stats {
    peers: Mutex<Vec<SocketAddr>>,
}

impl Stats {
    fn record(&self, peer: SocketAddr) {
        self.peers
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .push(peer);
    }

    fn peers(&self) -> Vec<SocketAddr> {
        self.peers
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .clone()
    }
}

impl Backend {
    /// The address it listens on (with the real port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Connections (TCP) or datagrams (UDP) answered so far.
    pub fn served(&self) -> usize {
        self.stats.peers().len()
    }

    /// The source address of every connection or datagram answered, oldest first: the
    /// client's own address when the proxy kept it, the node's when it masqueraded.
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.stats.peers()
    }

    /// Stops the server and waits for its thread.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.shut_down();
    }
}

impl Netns {
    /// Starts a TCP server on `addr` inside this namespace. For every connection it writes
    /// `reply` and a newline, then closes.
    pub fn tcp_backend(&self, addr: SocketAddr, reply: &str) -> io::Result<Backend> {
        let reply = format!("{reply}\n").into_bytes();
        self.start_backend(addr, bind_tcp, move |listener, stats| {
            serve_tcp(listener, |_| reply.clone(), stats)
        })
    }

    /// Starts a TCP server on `addr` that answers every connection with `"<name> from <peer
    /// IP>"` and a newline: which backend the proxy picked, and the source address it
    /// delivered (the client's own when kept, the node's when masqueraded).
    /// [`split_peer_reply`] reads such a reply back.
    pub fn tcp_backend_telling_peer(&self, addr: SocketAddr, name: &str) -> io::Result<Backend> {
        let name = name.to_owned();
        self.start_backend(addr, bind_tcp, move |listener, stats| {
            serve_tcp(
                listener,
                |peer| format!("{name}{PEER_SEPARATOR}{}\n", peer.ip()).into_bytes(),
                stats,
            )
        })
    }

    /// Starts a UDP server on `addr` inside this namespace. It answers every datagram with
    /// `reply`.
    pub fn udp_backend(&self, addr: SocketAddr, reply: &str) -> io::Result<Backend> {
        let reply = reply.as_bytes().to_vec();
        self.start_backend(addr, bind_udp, move |socket, stats| {
            serve_udp(socket, |_| reply.clone(), stats)
        })
    }

    /// Like [`Netns::tcp_backend_telling_peer`], over UDP: every datagram is answered with
    /// `"<name> from <peer IP>"`, so each reply says which backend the proxy picked and
    /// the source address it delivered.
    pub fn udp_backend_telling_peer(&self, addr: SocketAddr, name: &str) -> io::Result<Backend> {
        let name = name.to_owned();
        self.start_backend(addr, bind_udp, move |socket, stats| {
            serve_udp(
                socket,
                |peer| format!("{name}{PEER_SEPARATOR}{}", peer.ip()).into_bytes(),
                stats,
            )
        })
    }

    /// Spawns the server thread: it joins the namespace, binds with `bind`, reports the
    /// outcome, then calls `serve` until either stop flag is set.
    fn start_backend<S: Send + 'static>(
        &self,
        addr: SocketAddr,
        bind: impl FnOnce(SocketAddr) -> io::Result<(S, SocketAddr)> + Send + 'static,
        serve: impl Fn(&S, &Stats) -> io::Result<()> + Send + 'static,
    ) -> io::Result<Backend> {
        let path = self.path();
        let stats = Arc::new(Stats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let flags = [Arc::clone(&stop), self.closed_flag()];
        let thread_stats = Arc::clone(&stats);
        let (bound_tx, bound_rx) = mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name(format!("backend-{}", self.name()))
            .spawn(move || {
                let socket = match bind_inside(&path, addr, bind) {
                    Ok((socket, local)) => {
                        let _ = bound_tx.send(Ok(local));
                        socket
                    }
                    Err(err) => {
                        let _ = bound_tx.send(Err(err));
                        return;
                    }
                };
                while !flags.iter().any(|flag| flag.load(Ordering::SeqCst)) {
                    if let Err(err) = serve(&socket, &thread_stats) {
                        eprintln!("kpr-netns: backend on {addr}: {err}");
                        std::thread::sleep(POLL);
                    }
                }
            })?;
        let local_addr = bound_rx
            .recv()
            .map_err(|_| io::Error::other(format!("backend thread for {addr} died before binding")))??;
        Ok(Backend {
            local_addr,
            stats,
            stop,
            thread: Some(thread),
        })
    }
}

/// Joins the namespace at `path` and binds there.
fn bind_inside<S>(
    path: &Path,
    addr: SocketAddr,
    bind: impl FnOnce(SocketAddr) -> io::Result<(S, SocketAddr)>,
) -> io::Result<(S, SocketAddr)> {
    enter(path).map_err(io::Error::other)?;
    bind(addr)
}

fn bind_tcp(addr: SocketAddr) -> io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr)?;
    // Accept without blocking so the loop notices the stop flags.
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}

fn bind_udp(addr: SocketAddr) -> io::Result<(UdpSocket, SocketAddr)> {
    let socket = UdpSocket::bind(addr)?;
    // Wake up regularly so the loop notices the stop flags.
    socket.set_read_timeout(Some(POLL))?;
    let local = socket.local_addr()?;
    Ok((socket, local))
}

/// Reads a (trimmed) reply of [`Netns::tcp_backend_telling_peer`]: the backend's name and
/// the peer address it saw, or `None` when `reply` is not one.
pub fn split_peer_reply(reply: &str) -> Option<(&str, IpAddr)> {
    let (name, peer) = reply.rsplit_once(PEER_SEPARATOR)?;
    Some((name, peer.parse().ok()?))
}

/// Answers at most one pending connection with `reply(peer)`; waits a poll interval when
/// there is none.
fn serve_tcp(listener: &TcpListener, reply: impl Fn(SocketAddr) -> Vec<u8>, stats: &Stats) -> io::Result<()> {
    match listener.accept() {
        Ok((stream, peer)) => {
            stats.record(peer);
            answer_tcp(stream, &reply(peer))
        }
        Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
            std::thread::sleep(POLL);
            Ok(())
        }
        Err(err) => Err(err),
    }
}

fn answer_tcp(mut stream: TcpStream, reply: &[u8]) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    stream.write_all(reply)?;
    stream.shutdown(Shutdown::Write)?;
    discard_input_until_close(&mut stream);
    Ok(())
}

/// Reads what the client sends until it closes (briefly): closing with unread data would
/// send a reset, and the client could lose the reply.
fn discard_input_until_close(stream: &mut TcpStream) {
    if stream.set_read_timeout(Some(LINGER)).is_ok() {
        let mut sink = [0_u8; 4096];
        while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
    }
}

/// Answers at most one datagram with `reply(peer)`; returns after a poll interval when
/// there is none.
fn serve_udp(socket: &UdpSocket, reply: impl Fn(SocketAddr) -> Vec<u8>, stats: &Stats) -> io::Result<()> {
    let mut buf = [0_u8; 2048];
    match socket.recv_from(&mut buf) {
        Ok((_, peer)) => {
            stats.record(peer);
            socket.send_to(&reply(peer), peer).map(drop)
        }
        Err(err) if matches!(err.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => Ok(()),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::{Lab, eventually, pod_ip};

    const TIMEOUT: Duration = Duration::from_secs(5);

    #[test]
    fn a_dropped_backend_closes_its_port() {
        let lab = Lab::new(1).unwrap();
        let addr = SocketAddr::from((pod_ip(0), 8080));
        let backend = lab.pod(0).tcp_backend(addr, "pod-0").unwrap();
        assert_eq!(lab.node().tcp_request(addr, TIMEOUT).unwrap(), "pod-0");
        drop(backend);
        let err = lab.node().tcp_request(addr, TIMEOUT).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
    }

    #[test]
    fn backends_stop_when_their_namespace_is_deleted() {
        let lab = Lab::new(1).unwrap();
        let tcp = lab
            .pod(0)
            .tcp_backend(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)), "t")
            .unwrap();
        let udp = lab
            .pod(0)
            .udp_backend(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)), "u")
            .unwrap();
        assert_ne!(tcp.local_addr().port(), 0, "the real port is reported");
        drop(lab);
        for backend in [&tcp, &udp] {
            eventually(TIMEOUT, Duration::from_millis(10), || {
                let finished = backend.thread.as_ref().is_some_and(JoinHandle::is_finished);
                if finished {
                    Ok(())
                } else {
                    Err(format!("backend on {} still runs", backend.local_addr()))
                }
            });
        }
    }

    #[test]
    fn a_backend_telling_the_peer_names_itself_and_the_source_it_saw() {
        let lab = Lab::new(2).unwrap();
        let addr = SocketAddr::from((pod_ip(0), 8080));
        let backend = lab.pod(0).tcp_backend_telling_peer(addr, "pod0").unwrap();
        let reply = lab.pod(1).tcp_request(addr, TIMEOUT).unwrap();
        assert_eq!(reply, format!("pod0 from {}", pod_ip(1)));
        assert_eq!(split_peer_reply(&reply), Some(("pod0", IpAddr::from(pod_ip(1)))));
        assert_eq!(backend.served(), 1);
    }

    #[test]
    fn a_udp_backend_telling_the_peer_names_itself_and_the_source_it_saw() {
        let lab = Lab::new(2).unwrap();
        let addr = SocketAddr::from((pod_ip(0), 5353));
        let backend = lab.pod(0).udp_backend_telling_peer(addr, "pod0").unwrap();
        let reply = lab.pod(1).udp_request(addr, TIMEOUT).unwrap();
        assert_eq!(split_peer_reply(&reply), Some(("pod0", IpAddr::from(pod_ip(1)))));
        assert_eq!(backend.served(), 1);
    }

    #[test]
    fn only_replies_telling_a_peer_split() {
        assert_eq!(
            split_peer_reply("web from x from 10.0.0.1"),
            Some(("web from x", IpAddr::from([10, 0, 0, 1])))
        );
        assert_eq!(split_peer_reply("pod0"), None);
        assert_eq!(split_peer_reply("pod0 from nowhere"), None);
        assert_eq!(split_peer_reply("error: timed out"), None);
    }

    #[test]
    fn a_client_that_sends_data_still_gets_the_reply() {
        let lab = Lab::new(1).unwrap();
        let addr = SocketAddr::from((pod_ip(0), 8080));
        let _backend = lab.pod(0).tcp_backend(addr, "pod-0").unwrap();
        // More than the backend reads before replying: it must not reset the connection.
        let raw = lab.node().run(move || {
            let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT).unwrap();
            stream.write_all(&[b'x'; 10_000]).unwrap();
            let mut reply = String::new();
            stream.read_to_string(&mut reply).unwrap();
            reply
        });
        assert_eq!(raw, "pod-0\n");
    }
}
