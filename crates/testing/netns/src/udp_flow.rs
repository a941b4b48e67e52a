//! A UDP client that keeps sending, as a resolver or a metrics agent does: one socket, so
//! one source port, one datagram every interval, for as long as the test holds it.
//!
//! Such a client keeps one conntrack entry alive (every datagram refreshes its timeout), so
//! it shows what a stale UDP entry does: after its endpoint left the Service, the flow keeps
//! going where the entry points until the proxy deletes the entry. Upstream's conntrack e2e
//! tests run `nc -u -p 12345` in a loop for the same reason.
//!
//! Every reply is recorded (trimmed), and every datagram that got none as `"error: <kind>"`
//! (`timed out`, or `connection refused` when an ICMP port unreachable came back), oldest
//! first, so a test waits for the reply it expects and reads what came before.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::netns::{Netns, enter};

/// A running [`Netns::udp_flow`]; stops (and is joined) on drop, or when its namespace is
/// deleted.
#[derive(Debug)]
pub struct UdpFlow {
    to: SocketAddr,
    replies: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Netns {
    /// Starts sending `"ping"` to `to` every `interval` from source port `port` (any
    /// address of this namespace), recording what comes back (see the module docs).
    pub fn udp_flow(&self, port: u16, to: SocketAddr, interval: Duration) -> io::Result<UdpFlow> {
        let path = self.path();
        let replies = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let flags = [Arc::clone(&stop), self.closed_flag()];
        let record = Arc::clone(&replies);
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name(format!("udp-flow-{}", self.name()))
            .spawn(move || {
                let socket = match open(&path, port, to, interval) {
                    Ok(socket) => {
                        let _ = ready_tx.send(Ok(()));
                        socket
                    }
                    Err(err) => {
                        let _ = ready_tx.send(Err(err));
                        return;
                    }
                };
                while !flags.iter().any(|flag| flag.load(Ordering::SeqCst)) {
                    let sent = Instant::now();
                    let outcome = exchange(&socket);
                    let answered = outcome.is_ok();
                    record
                        .lock()
                        .unwrap_or_else(|poison| poison.into_inner())
                        .push(outcome.unwrap_or_else(|kind| format!("error: {kind}")));
                    // An answer leaves the rest of the interval to wait; a timeout took it all.
                    if answered {
                        std::thread::sleep(interval.saturating_sub(sent.elapsed()));
                    }
                }
            })?;
        ready_rx
            .recv()
            .map_err(|_| io::Error::other(format!("the UDP flow to {to} died before sending")))??;
        Ok(UdpFlow {
            to,
            replies,
            stop,
            thread: Some(thread),
        })
    }
}

impl UdpFlow {
    /// Where it sends.
    pub fn to(&self) -> SocketAddr {
        self.to
    }

    /// How many datagrams have had their outcome recorded: a mark for
    /// [`UdpFlow::replies_since`].
    pub fn count(&self) -> usize {
        self.lock().len()
    }

    /// Every outcome recorded so far, oldest first.
    pub fn replies(&self) -> Vec<String> {
        self.lock().clone()
    }

    /// The outcomes recorded after the first `mark` ([`UdpFlow::count`]), oldest first.
    pub fn replies_since(&self, mark: usize) -> Vec<String> {
        self.lock()
            .get(mark..)
            .map(<[String]>::to_vec)
            .unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.replies.lock().unwrap_or_else(|poison| poison.into_inner())
    }
}

impl Drop for UdpFlow {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Joins the namespace at `path`; a socket on source port `port`, connected to `to` (so an
/// ICMP port unreachable comes back as `ConnectionRefused`), waiting `interval` for replies.
fn open(path: &Path, port: u16, to: SocketAddr, interval: Duration) -> io::Result<UdpSocket> {
    enter(path).map_err(io::Error::other)?;
    let any: SocketAddr = match to {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, port).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, port).into(),
    };
    let socket = UdpSocket::bind(any)?;
    socket.connect(to)?;
    socket.set_read_timeout(Some(interval))?;
    Ok(socket)
}

/// One datagram and its answer (trimmed), or the kind of failure.
fn exchange(socket: &UdpSocket) -> Result<String, io::ErrorKind> {
    socket.send(b"ping\n").map_err(|err| err.kind())?;
    let mut buf = [0_u8; 2048];
    match socket.recv(&mut buf) {
        Ok(n) => Ok(String::from_utf8_lossy(&buf[..n]).trim().to_owned()),
        Err(err) if err.kind() == io::ErrorKind::WouldBlock => Err(io::ErrorKind::TimedOut),
        Err(err) => Err(err.kind()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Lab, eventually, pod_ip};

    const TIMEOUT: Duration = Duration::from_secs(5);
    const INTERVAL: Duration = Duration::from_millis(50);

    #[test]
    fn a_flow_records_replies_and_what_went_unanswered_and_keeps_its_port() {
        let lab = Lab::new(2).unwrap();
        let addr = SocketAddr::from((pod_ip(0), 5353));
        let backend = lab.pod(0).udp_backend(addr, "pod0").unwrap();
        let flow = lab.pod(1).udp_flow(40123, addr, INTERVAL).unwrap();
        eventually(TIMEOUT, INTERVAL, || {
            (flow.replies().iter().filter(|r| *r == "pod0").count() >= 3)
                .then_some(())
                .ok_or(format!("{:?}", flow.replies()))
        });
        assert!(
            backend.peers().iter().all(|peer| peer.port() == 40123),
            "one source port: {:?}",
            backend.peers()
        );
        drop(backend);
        let mark = flow.count();
        eventually(TIMEOUT, INTERVAL, || {
            let since = flow.replies_since(mark);
            since
                .iter()
                .any(|r| r == "error: connection refused")
                .then_some(())
                .ok_or(format!("{since:?}"))
        });
    }
}
