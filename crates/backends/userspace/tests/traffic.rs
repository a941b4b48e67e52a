//! userspace mode on the real kernel: a network namespace this test creates, the real
//! portals written with the real iptables into it, the backend's listeners and endpoint
//! servers on a tokio runtime whose threads all live in that namespace, and real TCP/UDP
//! through the cluster IP. Deadlines are ceilings against hangs, not speed checks.
//!
//! The namespace: `lo` up with the node's address (192.168.1.10) and the endpoints'
//! (192.168.1.21-24), and a route sending the Service range to `lo`, so a connection to a
//! cluster IP leaves through nat OUTPUT, where KUBE-PORTALS-HOST sends it to the listener.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use kpr_iptables::{Iptables, IptablesCli, Table, Variant};
use kpr_metrics::UserspaceMetrics;
use kpr_model::IpFamily;
use kpr_netns::Netns;
use kpr_state::{Backend, DesiredState, PendingSync};
use kpr_userspace::{Limits, UserspaceBackend, UserspaceOptions};
use kpr_world::{World, ep};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::runtime::Runtime;

const NODE_IP: &str = "192.168.1.10";
const VIP: &str = "10.96.0.10:80";
const DNS_VIP: &str = "10.96.0.53:53";
const ENDPOINTS: [&str; 4] = ["192.168.1.21", "192.168.1.22", "192.168.1.23", "192.168.1.24"];
const PORT: u16 = 8080;
const CEILING: Duration = Duration::from_secs(20);

fn sock(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

/// The namespace, set up as the module docs say.
fn node() -> Netns {
    let ns = Netns::new("us").unwrap();
    ns.ip(&["link", "set", "lo", "up"]).unwrap();
    for ip in std::iter::once(NODE_IP).chain(ENDPOINTS) {
        ns.ip(&["addr", "add", &format!("{ip}/32"), "dev", "lo"]).unwrap();
    }
    ns.ip(&["route", "add", "10.96.0.0/16", "dev", "lo"]).unwrap();
    ns
}

fn iptables(ns: &Netns) -> IptablesCli {
    IptablesCli::in_netns(IpFamily::V4, Variant::Auto, ns.name())
}

/// A runtime whose threads are in the calling thread's namespace (threads inherit it).
fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn backend(ns: &Netns, rt: &Runtime, limits: Limits) -> (UserspaceBackend, UserspaceMetrics) {
    let mut options = UserspaceOptions::new(IpFamily::V4, NODE_IP.parse().unwrap());
    options.limits = limits;
    let metrics = UserspaceMetrics::default();
    let backend = UserspaceBackend::new(options, Box::new(iptables(ns)), rt.handle().clone())
        .with_metrics(metrics.clone());
    (backend, metrics)
}

fn sync(backend: &mut UserspaceBackend, state: DesiredState) {
    let pending = PendingSync {
        state,
        changed: Default::default(),
        service_changes: Vec::new(),
        endpoint_changes: Vec::new(),
    };
    backend.sync(&pending.request(true)).unwrap();
}

/// Service `web` (10.96.0.10:80 -> 8080, TCP) with endpoints `ips`.
fn web(world: &mut World, ips: &[&str], affinity: Option<u32>) {
    let mut spec = json!({"clusterIP": "10.96.0.10",
        "ports": [{"name": "http", "port": 80, "targetPort": 8080}]});
    if let Some(seconds) = affinity {
        spec["sessionAffinity"] = json!("ClientIP");
        spec["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": seconds}});
    }
    world.service("web", spec).slice(
        "web",
        json!([{"name": "http", "port": PORT}]),
        ips.iter().map(|ip| ep(ip)).collect(),
    );
}

/// Serves TCP on `ip:8080`: says its name on a line, then echoes until end of stream.
async fn tcp_server(ip: &str) -> tokio::task::JoinHandle<()> {
    let listener = TcpListener::bind((ip.parse::<IpAddr>().unwrap(), PORT))
        .await
        .unwrap();
    let name = ip.to_owned();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let name = name.clone();
            tokio::spawn(async move {
                let _ = stream.write_all(format!("{name}\n").as_bytes()).await;
                let (mut read, mut write) = stream.split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
            });
        }
    })
}

/// Serves UDP on `ip:5353`: answers each datagram with `<name> <datagram>`.
async fn udp_server(ip: &str) -> tokio::task::JoinHandle<()> {
    let socket = UdpSocket::bind((ip.parse::<IpAddr>().unwrap(), 5353))
        .await
        .unwrap();
    let name = ip.to_owned();
    tokio::spawn(async move {
        let mut buffer = [0u8; 2048];
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buffer).await else {
                return;
            };
            let reply = format!("{name} {}", String::from_utf8_lossy(&buffer[..n]));
            let _ = socket.send_to(reply.as_bytes(), from).await;
        }
    })
}

/// Connects to `to` and reads the answering server's name.
async fn who(to: SocketAddr) -> io::Result<(String, BufReader<TcpStream>)> {
    let stream = tokio::time::timeout(CEILING, TcpStream::connect(to)).await??;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    tokio::time::timeout(CEILING, reader.read_line(&mut line)).await??;
    if line.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "closed without a name",
        ));
    }
    Ok((line.trim().to_owned(), reader))
}

async fn spread(to: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for _ in 0..n {
        let name = match who(to).await {
            Ok((name, _)) => name,
            Err(error) => format!("error: {:?}", error.kind()),
        };
        *counts.entry(name).or_insert(0) += 1;
    }
    counts
}

#[test]
fn tcp_through_the_cluster_ip_goes_round_robin_and_echoes() {
    let ns = node();
    ns.run(|| {
        let rt = runtime();
        let (mut backend, metrics) = backend(&ns, &rt, Limits::default());
        let mut world = World::new();
        web(&mut world, &ENDPOINTS[..3], None);
        rt.block_on(async {
            for ip in &ENDPOINTS[..3] {
                tcp_server(ip).await;
            }
        });
        sync(&mut backend, world.state());
        let counts = rt.block_on(spread(sock(VIP), 30));
        assert_eq!(
            counts,
            ENDPOINTS[..3]
                .iter()
                .map(|ip| (ip.to_string(), 10))
                .collect::<BTreeMap<_, _>>(),
            "round robin is exact"
        );
        // Bytes both ways, a half-close passed on.
        rt.block_on(async {
            let (_, mut conn) = who(sock(VIP)).await.unwrap();
            let payload = vec![7u8; 1 << 20];
            conn.get_mut().write_all(&payload).await.unwrap();
            conn.get_mut().shutdown().await.unwrap();
            let mut back = Vec::new();
            conn.read_to_end(&mut back).await.unwrap();
            assert_eq!(back.len(), payload.len());
        });
        let labels = kpr_metrics::PortLabels {
            ip_family: "IPv4",
            service_port: "default/web:http".into(),
            protocol: "TCP",
        };
        assert_eq!(metrics.connections_total.get_or_create(&labels).get(), 31);
        let sent = metrics.bytes_total.get_or_create(&kpr_metrics::BytesLabels {
            ip_family: "IPv4",
            service_port: "default/web:http".into(),
            protocol: "TCP",
            direction: "to_endpoint",
        });
        assert_eq!(sent.get(), 1 << 20);
    });
}

#[test]
fn a_service_port_without_endpoints_is_refused_at_once() {
    let ns = node();
    ns.run(|| {
        let rt = runtime();
        let (mut backend, _) = backend(&ns, &rt, Limits::default());
        let mut world = World::new();
        web(&mut world, &[], None);
        sync(&mut backend, world.state());
        let error = rt.block_on(who(sock(VIP))).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused, "{error}");
        // Endpoints come: served; gone again: refused again.
        rt.block_on(tcp_server(ENDPOINTS[0]));
        web(&mut world, &ENDPOINTS[..1], None);
        sync(&mut backend, world.state());
        assert_eq!(rt.block_on(who(sock(VIP))).unwrap().0, ENDPOINTS[0]);
        web(&mut world, &[], None);
        sync(&mut backend, world.state());
        let error = rt.block_on(who(sock(VIP))).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused, "{error}");
    });
}

#[test]
fn endpoint_changes_keep_established_connections_and_removal_ends_them() {
    let ns = node();
    ns.run(|| {
        let rt = runtime();
        let (mut backend, _) = backend(&ns, &rt, Limits::default());
        let mut world = World::new();
        rt.block_on(async {
            for ip in &ENDPOINTS[..2] {
                tcp_server(ip).await;
            }
        });
        web(&mut world, &ENDPOINTS[..1], None);
        sync(&mut backend, world.state());
        let (name, mut held) = rt.block_on(who(sock(VIP))).unwrap();
        assert_eq!(name, ENDPOINTS[0]);

        // The endpoint leaves the Service: new connections go elsewhere, the held one lives.
        web(&mut world, &ENDPOINTS[1..2], None);
        sync(&mut backend, world.state());
        assert_eq!(
            rt.block_on(spread(sock(VIP), 5)),
            BTreeMap::from([(ENDPOINTS[1].to_owned(), 5)])
        );
        rt.block_on(async {
            held.get_mut().write_all(b"still here\n").await.unwrap();
            let mut line = String::new();
            held.read_line(&mut line).await.unwrap();
            assert_eq!(line, "still here\n");
        });
        assert_eq!(backend.active_connections(), 1);

        // The Service goes: its connections end and its listener closes.
        let port = backend.listeners().into_values().next().unwrap();
        world.delete_service("web");
        sync(&mut backend, world.state());
        rt.block_on(async {
            let mut rest = Vec::new();
            let read = tokio::time::timeout(CEILING, held.read_to_end(&mut rest))
                .await
                .unwrap();
            assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
            let direct = TcpStream::connect((NODE_IP.parse::<IpAddr>().unwrap(), port)).await;
            assert_eq!(direct.unwrap_err().kind(), io::ErrorKind::ConnectionRefused);
        });
        assert!(backend.listeners().is_empty());
        let nat = iptables(&ns).save(Table::Nat).unwrap();
        assert!(!nat.contains("default/web"), "{nat}");
    });
}

#[test]
fn a_dead_endpoint_is_retried_on_the_next_one_and_counted() {
    let ns = node();
    ns.run(|| {
        let rt = runtime();
        let (mut backend, metrics) = backend(&ns, &rt, Limits::default());
        let mut world = World::new();
        rt.block_on(tcp_server(ENDPOINTS[0]));
        // ENDPOINTS[3] has no server: its connects are refused at once.
        web(&mut world, &[ENDPOINTS[0], ENDPOINTS[3]], None);
        sync(&mut backend, world.state());
        let counts = rt.block_on(spread(sock(VIP), 20));
        assert_eq!(
            counts,
            BTreeMap::from([(ENDPOINTS[0].to_owned(), 20)]),
            "no client sees the dead one"
        );
        let labels = kpr_metrics::PortLabels {
            ip_family: "IPv4",
            service_port: "default/web:http".into(),
            protocol: "TCP",
        };
        let failures = metrics.connect_failures_total.get_or_create(&labels).get();
        let retries = metrics.endpoint_retries_total.get_or_create(&labels).get();
        assert!(
            failures >= 9 && failures == retries,
            "failures {failures}, retries {retries}"
        );
    });
}

#[test]
fn client_ip_affinity_sticks_until_the_client_was_quiet_for_the_timeout() {
    let ns = node();
    ns.run(|| {
        let rt = runtime();
        let (mut backend, _) = backend(&ns, &rt, Limits::default());
        let mut world = World::new();
        rt.block_on(async {
            for ip in &ENDPOINTS[..3] {
                tcp_server(ip).await;
            }
        });
        web(&mut world, &ENDPOINTS[..3], Some(1));
        sync(&mut backend, world.state());
        let counts = rt.block_on(spread(sock(VIP), 20));
        assert_eq!(counts.len(), 1, "one client, one endpoint: {counts:?}");
        let first = counts.keys().next().unwrap().clone();
        std::thread::sleep(Duration::from_millis(1200));
        let (after, _) = rt.block_on(who(sock(VIP))).unwrap();
        assert_ne!(after, first, "after the timeout the rotation's next endpoint");
    });
}

#[test]
fn connections_past_the_limit_are_refused_and_counted() {
    let ns = node();
    ns.run(|| {
        let rt = runtime();
        let limits = Limits {
            max_connections: 2,
            max_udp_sessions: 2,
        };
        let (mut backend, metrics) = backend(&ns, &rt, limits);
        let mut world = World::new();
        rt.block_on(tcp_server(ENDPOINTS[0]));
        web(&mut world, &ENDPOINTS[..1], None);
        sync(&mut backend, world.state());
        rt.block_on(async {
            let a = who(sock(VIP)).await.unwrap();
            let b = who(sock(VIP)).await.unwrap();
            let third = who(sock(VIP)).await;
            assert!(third.is_err(), "past the limit: {:?}", third.map(|t| t.0));
            drop((a, b));
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(who(sock(VIP)).await.is_ok(), "slots come back");
        });
        let labels = kpr_metrics::LimitLabels {
            ip_family: "IPv4",
            limit: "connections",
        };
        assert_eq!(metrics.limit_reached_total.get_or_create(&labels).get(), 1);
    });
}

#[test]
fn udp_sessions_answer_from_the_service_address_and_end_when_idle() {
    let ns = node();
    ns.run(|| {
        let rt = runtime();
        let (mut backend, _) = backend(&ns, &rt, Limits::default());
        let mut world = World::new();
        rt.block_on(async {
            for ip in &ENDPOINTS[..2] {
                udp_server(ip).await;
            }
        });
        world
            .service(
                "dns",
                json!({"clusterIP": "10.96.0.53",
                       "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]}),
            )
            .slice(
                "dns",
                json!([{"name": "dns", "port": 5353, "protocol": "UDP"}]),
                ENDPOINTS[..2].iter().map(|ip| ep(ip)).collect(),
            );
        sync(&mut backend, world.state());
        rt.block_on(async {
            let mut seen = BTreeMap::new();
            for i in 0..10 {
                // A connected socket only takes datagrams from the address it sent to: an
                // answer proves the reply came from the service address.
                let client = UdpSocket::bind("192.168.1.10:0").await.unwrap();
                client.connect(sock(DNS_VIP)).await.unwrap();
                let mut buffer = [0u8; 256];
                for round in 0..2 {
                    client.send(format!("q{i}.{round}").as_bytes()).await.unwrap();
                    let n = tokio::time::timeout(CEILING, client.recv(&mut buffer))
                        .await
                        .unwrap()
                        .unwrap();
                    let reply = String::from_utf8_lossy(&buffer[..n]).into_owned();
                    let (server, echo) = reply.split_once(' ').unwrap();
                    assert_eq!(echo, format!("q{i}.{round}"));
                    *seen.entry(server.to_owned()).or_insert(0) += 1;
                }
            }
            // Each client's two datagrams share a session, so an endpoint; clients alternate.
            assert_eq!(
                seen,
                ENDPOINTS[..2]
                    .iter()
                    .map(|ip| (ip.to_string(), 10))
                    .collect::<BTreeMap<_, _>>()
            );
        });
        assert_eq!(backend.active_udp_sessions(), 10);
        std::thread::sleep(Duration::from_millis(600));
        assert_eq!(
            backend.active_udp_sessions(),
            0,
            "idle for longer than --udp-timeout (250ms)"
        );
    });
}

/// Opens and closes tens of thousands of connections through the proxy; afterwards the
/// process's descriptors, the runtime's tasks and the active-connection count are back
/// where they were.
#[test]
fn tens_of_thousands_of_connections_leak_no_descriptor_or_task() {
    const CONNECTIONS: usize = 20_000;
    const AT_ONCE: usize = 200;
    let ns = node();
    ns.run(|| {
        let rt = runtime();
        let (mut backend, metrics) = backend(&ns, &rt, Limits::default());
        let mut world = World::new();
        rt.block_on(async {
            for ip in &ENDPOINTS[..2] {
                tcp_server(ip).await;
            }
        });
        web(&mut world, &ENDPOINTS[..2], None);
        sync(&mut backend, world.state());
        // Warm up (the runtime's and the listener's own descriptors and tasks exist now).
        rt.block_on(spread(sock(VIP), 10));
        std::thread::sleep(Duration::from_millis(200));
        let fds_before = open_descriptors();
        let tasks_before = rt.metrics().num_alive_tasks();

        let done = rt.block_on(async {
            let mut handles = Vec::new();
            for worker in 0..AT_ONCE {
                handles.push(tokio::spawn(async move {
                    let mut ok = 0;
                    for i in 0..CONNECTIONS / AT_ONCE {
                        let (_, mut conn) = who(sock(VIP))
                            .await
                            .unwrap_or_else(|e| panic!("{worker}.{i}: {e}"));
                        // Half the clients close first, half let the endpoint's end arrive.
                        if i % 2 == 0 {
                            conn.get_mut().shutdown().await.unwrap();
                            let mut rest = Vec::new();
                            conn.read_to_end(&mut rest).await.unwrap();
                        }
                        ok += 1;
                    }
                    ok
                }));
            }
            let mut done = 0;
            for handle in handles {
                done += handle.await.unwrap();
            }
            done
        });
        assert_eq!(done, CONNECTIONS);

        let settled = kpr_netns::eventually(CEILING, Duration::from_millis(100), || {
            let state = (
                open_descriptors(),
                rt.metrics().num_alive_tasks(),
                backend.active_connections(),
            );
            if state == (fds_before, tasks_before, 0) {
                Ok(state)
            } else {
                Err(format!(
                    "descriptors {} (before {fds_before}), tasks {} (before {tasks_before}), active {}",
                    state.0, state.1, state.2
                ))
            }
        });
        assert_eq!(settled.2, 0);
        let labels = kpr_metrics::PortLabels {
            ip_family: "IPv4",
            service_port: "default/web:http".into(),
            protocol: "TCP",
        };
        assert_eq!(metrics.active_connections.get_or_create(&labels).get(), 0);
        assert_eq!(
            metrics.connections_total.get_or_create(&labels).get(),
            (CONNECTIONS + 10) as u64
        );
    });
}

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn shutdown_removes_the_portals_and_their_jumps() {
    let ns = node();
    ns.run(|| {
        let rt = runtime();
        let (mut backend, _) = backend(&ns, &rt, Limits::default());
        let mut world = World::new();
        web(&mut world, &ENDPOINTS[..1], None);
        sync(&mut backend, world.state());
        let cli = iptables(&ns);
        assert!(
            cli.save(Table::Nat).unwrap().contains(
                "-A PREROUTING -m comment --comment \"handle ClusterIPs\" -j KUBE-PORTALS-CONTAINER"
            )
        );
        backend.shutdown().unwrap();
        let nat = cli.save(Table::Nat).unwrap();
        let filter = cli.save(Table::Filter).unwrap();
        assert!(
            !nat.contains("KUBE-") && !filter.contains("KUBE-"),
            "{nat}\n{filter}"
        );
        assert!(backend.listeners().is_empty());
    });
}

/// The shared runtime handle is what `sync` uses from the sync loop's blocking thread.
#[test]
fn sync_from_a_blocking_thread_of_the_runtime() {
    let ns = node();
    ns.run(|| {
        let rt = runtime();
        let (backend, _) = backend(&ns, &rt, Limits::default());
        let backend = Arc::new(std::sync::Mutex::new(backend));
        let mut world = World::new();
        web(&mut world, &ENDPOINTS[..1], None);
        let state = world.state();
        rt.block_on(tcp_server(ENDPOINTS[0]));
        let shared = backend.clone();
        rt.block_on(rt.spawn_blocking(move || sync(&mut shared.lock().unwrap(), state)))
            .unwrap();
        assert_eq!(rt.block_on(who(sock(VIP))).unwrap().0, ENDPOINTS[0]);
    });
}
