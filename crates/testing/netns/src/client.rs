//! Clients that send real traffic from inside a namespace and say what came back.
//!
//! Failures stay plain [`io::Error`]s with their kind intact: a test tells "the proxy
//! rejected it" ([`io::ErrorKind::ConnectionRefused`]) from "nothing answered"
//! ([`io::ErrorKind::TimedOut`]).
//!
//! The `_from` variants send from a chosen source address of the namespace (see
//! [`crate::Lab::add_client_addresses`]), so one namespace can play several clients: what
//! source ranges and session affinity decide on.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::http::parse_response;
use crate::netns::Netns;

/// Timeout of each connection made by [`spread`].
pub const SPREAD_TIMEOUT: Duration = Duration::from_secs(2);

impl Netns {
    /// Connects to `addr` over TCP from inside this namespace, reads until the server
    /// closes, and returns the reply trimmed. Connecting and reading share `timeout`.
    pub fn tcp_request(&self, addr: SocketAddr, timeout: Duration) -> io::Result<String> {
        self.run(move || tcp_request_here(addr, timeout))
    }

    /// Like [`Netns::tcp_request`], from `source` (an address of this namespace).
    pub fn tcp_request_from(
        &self,
        source: IpAddr,
        addr: SocketAddr,
        timeout: Duration,
    ) -> io::Result<String> {
        self.run(move || tcp_request_from_here(source, addr, timeout))
    }

    /// Sends one UDP datagram to `addr` from inside this namespace and returns the first
    /// datagram that comes back, trimmed.
    pub fn udp_request(&self, addr: SocketAddr, timeout: Duration) -> io::Result<String> {
        self.run(move || udp_request_here(addr, 0, timeout))
    }

    /// Like [`Netns::udp_request`], from source port `port`: every call with the same port
    /// is the same conntrack flow, as a resolver that keeps its socket would be.
    pub fn udp_request_from_port(
        &self,
        port: u16,
        addr: SocketAddr,
        timeout: Duration,
    ) -> io::Result<String> {
        self.run(move || udp_request_here(addr, port, timeout))
    }

    /// A minimal HTTP/1.1 `GET path` (with `Connection: close`) to `addr` from inside this
    /// namespace; returns the status code and the body.
    pub fn http_get(&self, addr: SocketAddr, path: &str, timeout: Duration) -> io::Result<(u16, String)> {
        self.run(move || http_get_here(addr, path, timeout))
    }
}

/// Makes `n` TCP requests to `addr` from inside `ns` and counts the replies: which backends
/// answered, how often. A failed request counts under `"error: <kind>"`, so the map shows
/// it next to the backends that did answer.
pub fn spread(ns: &Netns, addr: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    ns.run(move || tally((0..n).map(|_| tcp_request_here(addr, SPREAD_TIMEOUT))))
}

/// Like [`spread`], from `source` (an address of `ns`).
pub fn spread_from(ns: &Netns, source: IpAddr, addr: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    ns.run(move || tally((0..n).map(|_| tcp_request_from_here(source, addr, SPREAD_TIMEOUT))))
}

/// Like [`spread`], over UDP (one fresh socket, so one fresh conntrack entry, per request).
pub fn spread_udp(ns: &Netns, addr: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    ns.run(move || tally((0..n).map(|_| udp_request_here(addr, 0, SPREAD_TIMEOUT))))
}

fn tally(replies: impl Iterator<Item = io::Result<String>>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for reply in replies {
        let key = reply.unwrap_or_else(|err| format!("error: {}", err.kind()));
        *counts.entry(key).or_insert(0) += 1;
    }
    counts
}

fn tcp_request_here(addr: SocketAddr, timeout: Duration) -> io::Result<String> {
    let reply = exchange_tcp(addr, b"", timeout)?;
    Ok(String::from_utf8_lossy(&reply).trim().to_owned())
}

fn tcp_request_from_here(source: IpAddr, addr: SocketAddr, timeout: Duration) -> io::Result<String> {
    let deadline = Instant::now() + timeout;
    let stream = connect_from(source, addr, timeout)?;
    let reply = exchange_on(stream, b"", deadline)?;
    Ok(String::from_utf8_lossy(&reply).trim().to_owned())
}

/// A TCP connection to `addr` from `source` (port chosen by the kernel): std cannot bind
/// before connecting, socket2 can.
fn connect_from(source: IpAddr, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.bind(&SocketAddr::new(source, 0).into())?;
    socket.connect_timeout(&addr.into(), timeout)?;
    Ok(socket.into())
}

fn http_get_here(addr: SocketAddr, path: &str, timeout: Duration) -> io::Result<(u16, String)> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let raw = exchange_tcp(addr, request.as_bytes(), timeout)?;
    parse_response(&raw)
}

/// Connects, sends `request`, reads to EOF; all within `timeout`.
fn exchange_tcp(addr: SocketAddr, request: &[u8], timeout: Duration) -> io::Result<Vec<u8>> {
    let deadline = Instant::now() + timeout;
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    exchange_on(stream, request, deadline)
}

/// Sends `request` on the connected `stream` and reads to EOF, before `deadline`.
fn exchange_on(mut stream: TcpStream, request: &[u8], deadline: Instant) -> io::Result<Vec<u8>> {
    stream.set_write_timeout(Some(remaining(deadline)?))?;
    stream.write_all(request)?;
    let mut reply = Vec::new();
    let mut buf = [0_u8; 8192];
    loop {
        stream.set_read_timeout(Some(remaining(deadline)?))?;
        match stream.read(&mut buf).map_err(timeouts_as_timed_out)? {
            0 => return Ok(reply),
            n => reply.extend_from_slice(&buf[..n]),
        }
    }
}

fn udp_request_here(addr: SocketAddr, port: u16, timeout: Duration) -> io::Result<String> {
    let any: SocketAddr = match addr {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, port).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, port).into(),
    };
    let socket = UdpSocket::bind(any)?;
    // Connected, so an ICMP port-unreachable comes back as ConnectionRefused.
    socket.connect(addr)?;
    socket.set_read_timeout(Some(timeout))?;
    socket.send(b"ping\n")?;
    let mut buf = [0_u8; 2048];
    let n = socket.recv(&mut buf).map_err(timeouts_as_timed_out)?;
    Ok(String::from_utf8_lossy(&buf[..n]).trim().to_owned())
}

/// Time left until `deadline`, or a timeout error when none is.
fn remaining(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(io::Error::new(io::ErrorKind::TimedOut, "request timed out"))
    } else {
        Ok(left)
    }
}

/// A socket timeout surfaces as `WouldBlock` on Linux; tests should see `TimedOut`.
fn timeouts_as_timed_out(err: io::Error) -> io::Error {
    if err.kind() == io::ErrorKind::WouldBlock {
        io::Error::new(io::ErrorKind::TimedOut, "no reply before the timeout")
    } else {
        err
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_counts_replies_and_errors_by_kind() {
        let replies = vec![
            Ok("pod-0".to_owned()),
            Ok("pod-1".to_owned()),
            Ok("pod-0".to_owned()),
            Err(io::Error::from(io::ErrorKind::ConnectionRefused)),
        ];
        let counts = tally(replies.into_iter());
        let expected: BTreeMap<String, usize> =
            [("pod-0", 2), ("pod-1", 1), ("error: connection refused", 1)]
                .map(|(k, v)| (k.to_owned(), v))
                .into();
        assert_eq!(counts, expected);
    }

    #[test]
    fn would_block_becomes_timed_out() {
        assert_eq!(
            timeouts_as_timed_out(io::ErrorKind::WouldBlock.into()).kind(),
            io::ErrorKind::TimedOut
        );
        assert_eq!(
            timeouts_as_timed_out(io::ErrorKind::ConnectionRefused.into()).kind(),
            io::ErrorKind::ConnectionRefused
        );
    }

    #[test]
    fn a_passed_deadline_is_a_timeout() {
        let past = Instant::now() - Duration::from_millis(1);
        assert_eq!(remaining(past).unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert!(remaining(Instant::now() + Duration::from_secs(5)).is_ok());
    }
}
