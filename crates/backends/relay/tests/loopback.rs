//! The relay driven by a second user, without portals: the shape nftables mode's NodePorts
//! on the loopback address take (upstream 1.37, KEP-6032), a listener per TCP NodePort on
//! `127.0.0.1:<nodePort>` (and `[::1]`), its endpoints given and replaced by the caller.
//!
//! Real sockets in a namespace each test creates: `lo` up with the endpoints' addresses,
//! each endpoint a TCP server that says its name on a line and then echoes. Deadlines are
//! ceilings against hangs, not speed checks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::num::NonZeroUsize;
use std::time::Duration;

use kpr_netns::Netns;
use kpr_relay::{Budget, Limits, PortStats, Relay, RelayOptions, Transport};
use tokio::io::AsyncWriteExt;
use tokio::runtime::Runtime;

const NODE_PORT: u16 = 30080;
const ENDPOINTS: [&str; 3] = ["10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"];
const CEILING: Duration = Duration::from_secs(20);

fn sock(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

/// The namespace (`lo` is up) with `addresses` on `lo`.
fn namespace(addresses: &[&str]) -> Netns {
    let ns = Netns::new("relaylo").unwrap();
    for address in addresses {
        match sock(address).ip() {
            IpAddr::V4(ip) => ns.ip(&["addr", "add", &format!("{ip}/32"), "dev", "lo"]),
            IpAddr::V6(ip) => ns.ip(&["-6", "addr", "add", &format!("{ip}/128"), "dev", "lo", "nodad"]),
        }
        .unwrap();
    }
    ns
}

/// A runtime whose threads are in the calling thread's namespace (threads inherit it): the
/// endpoints' servers run on it, and the relay would run UDP ports on it.
fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A relay for `family` with two TCP threads whatever the machine, so a port always has
/// several listeners.
fn relay(family: &'static str, rt: &Runtime) -> Relay<u16> {
    let options = RelayOptions {
        tcp_threads: NonZeroUsize::new(2).unwrap(),
        ..RelayOptions::new(family)
    };
    Relay::new(options, &Budget::new(Limits::default()), rt.handle().clone())
}

/// Serves TCP on each of `addresses`: says its address on a line, then echoes until end of
/// stream.
fn echo_servers(rt: &Runtime, addresses: &[&str]) {
    for address in addresses {
        let address = sock(address);
        let listener = rt.block_on(tokio::net::TcpListener::bind(address)).unwrap();
        rt.spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let _ = stream.write_all(format!("{address}\n").as_bytes()).await;
                    let (mut read, mut write) = stream.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
    }
}

/// A connection to `to`: who answered, and the connection.
fn who(to: SocketAddr) -> io::Result<(String, BufReader<TcpStream>)> {
    let stream = TcpStream::connect_timeout(&to, CEILING)?;
    stream.set_read_timeout(Some(CEILING))?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if line.is_empty() {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok((line.trim().to_owned(), reader))
}

/// `n` connections to `to`, one after the other: who answered how often.
fn spread(to: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for _ in 0..n {
        let name = match who(to) {
            Ok((name, _)) => name,
            Err(error) => format!("error: {:?}", error.kind()),
        };
        *counts.entry(name).or_insert(0) += 1;
    }
    counts
}

fn each(addresses: &[&str], count: usize) -> BTreeMap<String, usize> {
    addresses.iter().map(|a| (a.to_string(), count)).collect()
}

/// A line sent on `connection` comes back.
fn echoes(connection: &mut BufReader<TcpStream>, line: &str) {
    connection.get_mut().write_all(line.as_bytes()).unwrap();
    let mut back = String::new();
    connection.read_line(&mut back).unwrap();
    assert_eq!(back, line);
}

#[test]
fn a_loopback_node_port_is_carried_spread_retargeted_and_closed() {
    let ns = namespace(&ENDPOINTS);
    ns.run(|| {
        let rt = runtime();
        echo_servers(&rt, &ENDPOINTS);
        let mut relay = relay("IPv4", &rt);
        let node_port = SocketAddr::from(([127, 0, 0, 1], NODE_PORT));
        let stats = PortStats::default();

        let bound = relay.bind(Transport::Tcp, node_port).unwrap();
        assert_eq!(bound.port(), NODE_PORT);
        relay
            .open(NODE_PORT, bound, "default/web:http".into(), stats.clone())
            .unwrap();
        assert_eq!(relay.port(&NODE_PORT), Some(NODE_PORT));
        // The address is held: a second port on it, or on every address, is refused.
        for taken in [node_port, SocketAddr::from(([0, 0, 0, 0], NODE_PORT))] {
            let error = relay.bind(Transport::Tcp, taken).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::AddrInUse, "{taken}");
        }
        // No endpoints yet: refused at once.
        let error = who(node_port).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused, "{error}");

        // Two endpoints: carried, both ways, and spread in turn.
        relay
            .set_endpoints(&NODE_PORT, vec![sock(ENDPOINTS[0]), sock(ENDPOINTS[1])], None)
            .unwrap();
        assert_eq!(spread(node_port, 10), each(&ENDPOINTS[..2], 5));
        let (first, mut held) = who(node_port).unwrap();
        echoes(&mut held, "hello\n");

        // Replaced: new connections go to the new endpoint only; the open one is kept.
        relay
            .set_endpoints(&NODE_PORT, vec![sock(ENDPOINTS[2])], None)
            .unwrap();
        assert_eq!(spread(node_port, 4), each(&ENDPOINTS[2..], 4));
        echoes(&mut held, "still here\n");
        assert!(ENDPOINTS[..2].contains(&first.as_str()), "{first}");
        kpr_netns::eventually(CEILING, Duration::from_millis(20), || {
            match relay.active_connections() {
                1 => Ok(()),
                active => Err(format!("{active} active connections, want the held one")),
            }
        });
        assert_eq!(stats.connections.get(), 15);
        assert_eq!(stats.active_connections.get(), 1);
        assert_eq!(stats.to_endpoint_bytes.get(), "hello\nstill here\n".len() as u64);
        assert_eq!(stats.connect_failures.get(), 0);

        // Closed: new connections are refused, the open one ends, the address is free.
        assert_eq!(relay.close(&NODE_PORT), Some(NODE_PORT));
        let error = who(node_port).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused, "{error}");
        let mut rest = String::new();
        match held.read_line(&mut rest) {
            Ok(0) => {}
            Err(error) if !matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            other => panic!("the open connection was not ended: {other:?} {rest:?}"),
        }
        assert!(relay.is_empty());
        assert_eq!(relay.listener_descriptors(), 0);
        kpr_netns::eventually(CEILING, Duration::from_millis(20), || {
            match relay.active_connections() {
                0 => Ok(()),
                active => Err(format!("{active} active connections")),
            }
        });
        assert!(relay.bind(Transport::Tcp, node_port).is_ok(), "the port is free");
    });
}

/// Each family's loopback NodePort is a relay of its own on the same port number, and the
/// two carry their own clients.
#[test]
fn ipv4_and_ipv6_loopback_node_ports_share_the_port_number() {
    const ENDPOINT6: &str = "[fd00::1]:8080";
    let ns = namespace(&[ENDPOINTS[0], ENDPOINT6]);
    ns.run(|| {
        let rt = runtime();
        echo_servers(&rt, &[ENDPOINTS[0], ENDPOINT6]);
        let mut relays = Vec::new();
        for (family, loopback, endpoint) in [
            ("IPv4", IpAddr::from([127, 0, 0, 1]), ENDPOINTS[0]),
            ("IPv6", IpAddr::from([0, 0, 0, 0, 0, 0, 0, 1u16]), ENDPOINT6),
        ] {
            let mut relay = relay(family, &rt);
            let address = SocketAddr::new(loopback, NODE_PORT);
            let bound = relay.bind(Transport::Tcp, address).unwrap();
            relay
                .open(NODE_PORT, bound, "default/web:http".into(), PortStats::default())
                .unwrap();
            relay
                .set_endpoints(&NODE_PORT, vec![sock(endpoint)], None)
                .unwrap();
            relays.push((relay, address, endpoint));
        }
        for (_, address, endpoint) in &relays {
            assert_eq!(spread(*address, 3), each(&[endpoint], 3), "{address}");
        }
    });
}
