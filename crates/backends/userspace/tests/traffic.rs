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
use std::num::NonZeroUsize;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use kpr_iptables::{Iptables, IptablesCli, Table, Variant};
use kpr_model::IpFamily;
use kpr_netns::Netns;
use kpr_state::{Backend, DesiredState, PendingSync};
use kpr_userspace::metrics::UserspaceMetrics;
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

/// Held by every test, and alone by the one that counts the process's descriptors: tests
/// run in parallel threads of one process, so another test's sockets would be counted.
static DESCRIPTORS: RwLock<()> = RwLock::new(());

fn shared() -> RwLockReadGuard<'static, ()> {
    DESCRIPTORS.read().unwrap_or_else(PoisonError::into_inner)
}

fn exclusive() -> RwLockWriteGuard<'static, ()> {
    DESCRIPTORS.write().unwrap_or_else(PoisonError::into_inner)
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
    // Two TCP threads whatever the machine, so a port always has several listeners.
    options.tcp_threads = NonZeroUsize::new(2).unwrap();
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

/// What almost every test starts from: the namespace, a runtime whose threads live in it,
/// a backend writing real portals there with its metrics, and the cluster it syncs.
struct Lab<'a> {
    ns: &'a Netns,
    rt: Runtime,
    backend: UserspaceBackend,
    metrics: UserspaceMetrics,
    world: World,
}

/// Runs `test` in a fresh namespace (see the module docs) with a backend at `limits`.
fn in_lab(limits: Limits, test: impl FnOnce(&mut Lab<'_>) + Send) {
    let _shared = shared();
    in_lab_alone(limits, test);
}

/// [`in_lab`] without taking [`DESCRIPTORS`] (the caller holds it).
fn in_lab_alone(limits: Limits, test: impl FnOnce(&mut Lab<'_>) + Send) {
    let ns = node();
    ns.run(|| {
        let rt = runtime();
        let (backend, metrics) = backend(&ns, &rt, limits);
        test(&mut Lab {
            ns: &ns,
            rt,
            backend,
            metrics,
            world: World::new(),
        });
    });
}

impl Lab<'_> {
    fn tcp_servers(&self, ips: &[&str]) {
        self.rt.block_on(async {
            for ip in ips {
                tcp_server(ip).await;
            }
        });
    }

    fn udp_servers(&self, ips: &[&str]) {
        self.rt.block_on(async {
            for ip in ips {
                udp_server(ip).await;
            }
        });
    }

    /// The world as it is now, synced.
    fn sync(&mut self) {
        sync(&mut self.backend, self.world.state());
    }

    /// Service `web` (see [`web`]) with endpoints `ips`, synced.
    fn web(&mut self, ips: &[&str], affinity: Option<u32>) {
        web(&mut self.world, ips, affinity);
        self.sync();
    }

    /// Service `dns` (see [`dns`]) with endpoints `ips`, synced.
    fn dns(&mut self, ips: &[&str]) {
        dns(&mut self.world, ips);
        self.sync();
    }

    /// One connection to `web`'s cluster IP: who answered.
    fn who(&self) -> io::Result<(String, BufReader<TcpStream>)> {
        self.rt.block_on(who(sock(VIP)))
    }

    /// `web` counted at least `least` failed connects, each followed by a try on another
    /// endpoint.
    fn assert_each_failure_retried(&self, least: u64) {
        let failures = self
            .metrics
            .connect_failures_total
            .get_or_create(&web_labels())
            .get();
        let retries = self
            .metrics
            .endpoint_retries_total
            .get_or_create(&web_labels())
            .get();
        assert!(
            failures >= least && failures == retries,
            "failures {failures}, retries {retries}"
        );
    }

    /// `n` connections to `web`'s cluster IP, one after the other: who answered how often.
    fn spread(&self, n: usize) -> BTreeMap<String, usize> {
        self.rt.block_on(spread(sock(VIP), n))
    }
}

/// `web`'s TCP metric labels.
fn web_labels() -> kpr_userspace::metrics::PortLabels {
    kpr_userspace::metrics::PortLabels {
        ip_family: "IPv4",
        service_port: "default/web:http".into(),
        protocol: "TCP",
    }
}

/// Each of `ips` answering `count` times.
fn each(ips: &[&str], count: usize) -> BTreeMap<String, usize> {
    ips.iter().map(|ip| (ip.to_string(), count)).collect()
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

/// Service `dns` (10.96.0.53:53 -> 5353, UDP) with endpoints `ips`.
fn dns(world: &mut World, ips: &[&str]) {
    world
        .service(
            "dns",
            json!({"clusterIP": "10.96.0.53",
                   "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]}),
        )
        .slice(
            "dns",
            json!([{"name": "dns", "port": 5353, "protocol": "UDP"}]),
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
    in_lab(Limits::default(), |lab| {
        lab.tcp_servers(&ENDPOINTS[..3]);
        lab.web(&ENDPOINTS[..3], None);
        assert_eq!(lab.spread(30), each(&ENDPOINTS[..3], 10), "round robin is exact");
        // Bytes both ways, a half-close passed on.
        lab.rt.block_on(async {
            let (_, mut conn) = who(sock(VIP)).await.unwrap();
            let payload = vec![7u8; 1 << 20];
            conn.get_mut().write_all(&payload).await.unwrap();
            conn.get_mut().shutdown().await.unwrap();
            let mut back = Vec::new();
            conn.read_to_end(&mut back).await.unwrap();
            assert_eq!(back.len(), payload.len());
        });
        let metrics = &lab.metrics;
        assert_eq!(metrics.connections_total.get_or_create(&web_labels()).get(), 31);
        let sent = metrics
            .bytes_total
            .get_or_create(&kpr_userspace::metrics::BytesLabels {
                ip_family: "IPv4",
                service_port: "default/web:http".into(),
                protocol: "TCP",
                direction: "to_endpoint",
            });
        assert_eq!(sent.get(), 1 << 20);
    });
}

/// Bulk both ways at once (the endpoint echoes as the client sends), far more than the
/// sockets buffer: every byte arrives, in order, and the end of stream.
#[test]
fn bulk_data_both_ways_arrives_whole() {
    const BYTES: usize = 64 << 20;
    in_lab(Limits::default(), |lab| {
        lab.tcp_servers(&ENDPOINTS[..1]);
        lab.web(&ENDPOINTS[..1], None);
        lab.rt.block_on(async {
            let (_, conn) = who(sock(VIP)).await.unwrap();
            let (mut reader, mut writer) = conn.into_inner().into_split();
            let pattern = |at: usize| (at % 251) as u8;
            let sending = async move {
                for start in (0..BYTES).step_by(1 << 20) {
                    let block: Vec<u8> = (start..start + (1 << 20)).map(pattern).collect();
                    writer.write_all(&block).await.unwrap();
                }
                writer.shutdown().await.unwrap();
            };
            let hearing = async move {
                let mut heard = 0usize;
                let mut buffer = vec![0u8; 1 << 16];
                loop {
                    let read = reader.read(&mut buffer).await.unwrap();
                    if read == 0 {
                        return heard;
                    }
                    let expected: Vec<u8> = (heard..heard + read).map(pattern).collect();
                    assert!(buffer[..read] == expected[..], "bytes {heard}.. differ");
                    heard += read;
                }
            };
            // A ceiling against a stall, not a speed check.
            let both = async { tokio::join!(sending, hearing) };
            let ((), heard) = tokio::time::timeout(CEILING * 3, both)
                .await
                .expect("the transfer stalled");
            assert_eq!(heard, BYTES);
        });
    });
}

/// Megabytes and the end of stream already queued when the endpoint answers, so no event
/// will come for them again: the proxy's thread reads so much per turn, yields, and must
/// come back to the connection by itself. (The namespace's socket buffers are made large
/// enough to queue it all; the endpoint's SYNs are dropped until everything is queued, so
/// the proxy connects at its second try.)
#[test]
fn bytes_queued_beyond_one_turn_are_carried_without_a_new_event() {
    const BYTES: usize = 8 << 20;
    in_lab(Limits::default(), |lab| {
        for key in ["net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"] {
            lab.ns.set_sysctl(key, "4096 33554432 33554432").unwrap();
        }
        let hold: Vec<String> = ["-d", ENDPOINTS[0], "-p", "tcp", "--syn", "-j", "DROP"]
            .map(str::to_owned)
            .into();
        let iptables = iptables(lab.ns);
        iptables.insert_rule(Table::Filter, "OUTPUT", &hold).unwrap();
        lab.web(&ENDPOINTS[..1], None);
        let heard = lab.rt.block_on(async {
            let sink = TcpListener::bind((ENDPOINTS[0].parse::<IpAddr>().unwrap(), PORT))
                .await
                .unwrap();
            let mut client = TcpStream::connect(sock(VIP)).await.unwrap();
            client.write_all(&vec![5u8; BYTES]).await.unwrap();
            client.shutdown().await.unwrap();
            iptables.delete_rule(Table::Filter, "OUTPUT", &hold).unwrap();
            // A ceiling against a stall, not a speed check.
            tokio::time::timeout(CEILING, async {
                let (mut endpoint, _) = sink.accept().await.unwrap();
                let mut all = Vec::new();
                endpoint.read_to_end(&mut all).await.unwrap();
                all.len()
            })
            .await
        });
        assert_eq!(heard, Ok(BYTES), "the bytes left after a turn were carried");
    });
}

#[test]
fn a_service_port_without_endpoints_is_refused_at_once() {
    in_lab(Limits::default(), |lab| {
        lab.web(&[], None);
        let error = lab.who().unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused, "{error}");
        // Endpoints come: served; gone again: refused again.
        lab.tcp_servers(&ENDPOINTS[..1]);
        lab.web(&ENDPOINTS[..1], None);
        assert_eq!(lab.who().unwrap().0, ENDPOINTS[0]);
        lab.web(&[], None);
        let error = lab.who().unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused, "{error}");
    });
}

#[test]
fn endpoint_changes_keep_established_connections_and_removal_ends_them() {
    in_lab(Limits::default(), |lab| {
        lab.tcp_servers(&ENDPOINTS[..2]);
        lab.web(&ENDPOINTS[..1], None);
        let (name, mut held) = lab.who().unwrap();
        assert_eq!(name, ENDPOINTS[0]);

        // The endpoint leaves the Service: new connections go elsewhere, the held one lives.
        lab.web(&ENDPOINTS[1..2], None);
        assert_eq!(lab.spread(5), each(&ENDPOINTS[1..2], 5));
        lab.rt.block_on(async {
            held.get_mut().write_all(b"still here\n").await.unwrap();
            let mut line = String::new();
            held.read_line(&mut line).await.unwrap();
            assert_eq!(line, "still here\n");
        });
        // The five short connections end on the proxy's side a moment after the client's.
        kpr_netns::eventually(CEILING, Duration::from_millis(20), || {
            let active = lab.backend.active_connections();
            if active == 1 {
                Ok(())
            } else {
                Err(format!("{active} active connections, want the held one"))
            }
        });

        // The Service goes: its connections end and its listener closes.
        let port = lab.backend.listeners().into_values().next().unwrap();
        lab.world.delete_service("web");
        lab.sync();
        lab.rt.block_on(async {
            let mut rest = Vec::new();
            let read = tokio::time::timeout(CEILING, held.read_to_end(&mut rest))
                .await
                .unwrap();
            assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
            let direct = TcpStream::connect((NODE_IP.parse::<IpAddr>().unwrap(), port)).await;
            assert_eq!(direct.unwrap_err().kind(), io::ErrorKind::ConnectionRefused);
        });
        assert!(lab.backend.listeners().is_empty());
        let nat = iptables(lab.ns).save(Table::Nat).unwrap();
        assert!(!nat.contains("default/web"), "{nat}");
    });
}

#[test]
fn a_dead_endpoint_is_retried_on_the_next_one_and_counted() {
    in_lab(Limits::default(), |lab| {
        lab.tcp_servers(&ENDPOINTS[..1]);
        // ENDPOINTS[3] has no server: its connects are refused at once.
        lab.web(&[ENDPOINTS[0], ENDPOINTS[3]], None);
        assert_eq!(
            lab.spread(20),
            each(&ENDPOINTS[..1], 20),
            "no client sees the dead one"
        );
        // Two endpoints in rotation: about every other connection tries the dead one first.
        lab.assert_each_failure_retried(9);
    });
}

/// An endpoint that never answers (the namespace drops its SYNs, so its connects would
/// hang for minutes) is given up at the dial ladder's first timeout, and the next endpoint
/// answers: every client is served, and each give-up is counted.
#[test]
fn a_silent_endpoint_times_out_and_the_next_one_answers() {
    in_lab(Limits::default(), |lab| {
        lab.tcp_servers(&ENDPOINTS[..1]);
        let silent: Vec<String> = ["-d", ENDPOINTS[3], "-p", "tcp", "--syn", "-j", "DROP"]
            .map(str::to_owned)
            .into();
        iptables(lab.ns)
            .insert_rule(Table::Filter, "OUTPUT", &silent)
            .unwrap();
        lab.web(&[ENDPOINTS[0], ENDPOINTS[3]], None);
        assert_eq!(lab.spread(4), each(&ENDPOINTS[..1], 4), "every client is served");
        // Two endpoints in rotation, a failure moving it on: each connection but maybe the
        // first tries the silent one.
        lab.assert_each_failure_retried(3);
    });
}

#[test]
fn client_ip_affinity_sticks_until_the_client_was_quiet_for_the_timeout() {
    in_lab(Limits::default(), |lab| {
        lab.tcp_servers(&ENDPOINTS[..3]);
        lab.web(&ENDPOINTS[..3], Some(1));
        let counts = lab.spread(20);
        assert_eq!(counts.len(), 1, "one client, one endpoint: {counts:?}");
        let first = counts.keys().next().unwrap().clone();
        std::thread::sleep(Duration::from_millis(1200));
        let (after, _) = lab.who().unwrap();
        assert_ne!(after, first, "after the timeout the rotation's next endpoint");
    });
}

#[test]
fn connections_past_the_limit_are_refused_and_counted() {
    let limits = Limits {
        max_connections: 2,
        max_udp_sessions: 2,
        ..Limits::default()
    };
    in_lab(limits, |lab| {
        lab.tcp_servers(&ENDPOINTS[..1]);
        lab.web(&ENDPOINTS[..1], None);
        lab.rt.block_on(async {
            let a = who(sock(VIP)).await.unwrap();
            let b = who(sock(VIP)).await.unwrap();
            let third = who(sock(VIP)).await;
            assert!(third.is_err(), "past the limit: {:?}", third.map(|t| t.0));
            drop((a, b));
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(who(sock(VIP)).await.is_ok(), "slots come back");
        });
        let labels = kpr_userspace::metrics::LimitLabels {
            ip_family: "IPv4",
            limit: "connections",
        };
        assert_eq!(lab.metrics.limit_reached_total.get_or_create(&labels).get(), 1);
    });
}

#[test]
fn udp_sessions_answer_from_the_service_address_and_end_when_idle() {
    in_lab(Limits::default(), |lab| {
        lab.udp_servers(&ENDPOINTS[..2]);
        lab.dns(&ENDPOINTS[..2]);
        lab.rt.block_on(async {
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
            assert_eq!(seen, each(&ENDPOINTS[..2], 10));
        });
        assert_eq!(lab.backend.active_udp_sessions(), 10);
        std::thread::sleep(Duration::from_millis(600));
        assert_eq!(
            lab.backend.active_udp_sessions(),
            0,
            "idle for longer than --udp-timeout (250ms)"
        );
    });
}

/// Opens and closes tens of thousands of connections through the proxy; afterwards the
/// process's descriptors, the tasks (of the test's runtime and of the backend's TCP
/// threads) and the active-connection count are back where they were.
#[test]
fn tens_of_thousands_of_connections_leak_no_descriptor_or_task() {
    const CONNECTIONS: usize = 20_000;
    const AT_ONCE: usize = 200;
    let _alone = exclusive();
    in_lab_alone(Limits::default(), |lab| {
        lab.tcp_servers(&ENDPOINTS[..2]);
        lab.web(&ENDPOINTS[..2], None);
        // Warm up (the runtime's and the listener's own descriptors and tasks exist now).
        lab.spread(10);
        std::thread::sleep(Duration::from_millis(200));
        // Tasks of the runtime (UDP, the test's own) and what the TCP threads hold.
        let tasks = |lab: &Lab<'_>| lab.rt.metrics().num_alive_tasks() + lab.backend.tcp_held();
        let fds_before = open_descriptors();
        let tasks_before = tasks(lab);
        assert!(lab.backend.tcp_held() > 0, "the listeners are counted");

        let done = lab.rt.block_on(async {
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
            let state = (open_descriptors(), tasks(lab), lab.backend.active_connections());
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
        let metrics = &lab.metrics;
        assert_eq!(metrics.active_connections.get_or_create(&web_labels()).get(), 0);
        assert_eq!(
            metrics.connections_total.get_or_create(&web_labels()).get(),
            (CONNECTIONS + 10) as u64
        );
    });
}

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn shutdown_removes_the_portals_and_their_jumps() {
    in_lab(Limits::default(), |lab| {
        lab.web(&ENDPOINTS[..1], None);
        let cli = iptables(lab.ns);
        assert!(
            cli.save(Table::Nat).unwrap().contains(
                "-A PREROUTING -m comment --comment \"handle ClusterIPs\" -j KUBE-PORTALS-CONTAINER"
            )
        );
        lab.backend.shutdown().unwrap();
        let nat = cli.save(Table::Nat).unwrap();
        let filter = cli.save(Table::Filter).unwrap();
        assert!(
            !nat.contains("KUBE-") && !filter.contains("KUBE-"),
            "{nat}\n{filter}"
        );
        assert!(lab.backend.listeners().is_empty());
    });
}

/// The shared runtime handle is what `sync` uses from the sync loop's blocking thread.
#[test]
fn sync_from_a_blocking_thread_of_the_runtime() {
    let _shared = shared();
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

/// IPv6: the family's own listener (IPv6 only), ip6tables portals, DNAT to the node's IPv6
/// address for the node's own traffic.
#[test]
fn ipv6_through_the_cluster_ip() {
    let _shared = shared();
    const NODE6: &str = "fd00::10";
    const ENDPOINTS6: [&str; 2] = ["fd00::21", "fd00::22"];
    let ns = node();
    for ip in std::iter::once(NODE6).chain(ENDPOINTS6) {
        ns.ip(&["-6", "addr", "add", &format!("{ip}/128"), "dev", "lo", "nodad"])
            .unwrap();
    }
    ns.ip(&["-6", "route", "add", "fd00:10:96::/112", "dev", "lo"])
        .unwrap();
    ns.run(|| {
        let rt = runtime();
        let options = UserspaceOptions::new(IpFamily::V6, NODE6.parse().unwrap());
        let cli = IptablesCli::in_netns(IpFamily::V6, Variant::Auto, ns.name());
        let mut backend = UserspaceBackend::new(options, Box::new(cli), rt.handle().clone());
        rt.block_on(async {
            for ip in ENDPOINTS6 {
                tcp_server(ip).await;
            }
        });
        let mut world = World::with_family(IpFamily::V6);
        world
            .service(
                "web",
                json!({"clusterIP": "fd00:10:96::10", "ipFamilies": ["IPv6"],
                       "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}),
            )
            .slice(
                "web",
                json!([{"name": "http", "port": PORT}]),
                ENDPOINTS6.iter().map(|ip| ep(ip)).collect(),
            );
        sync(&mut backend, world.state());
        let counts = rt.block_on(spread(sock("[fd00:10:96::10]:80"), 10));
        assert_eq!(
            counts,
            ENDPOINTS6
                .iter()
                .map(|ip| (ip.to_string(), 5))
                .collect::<BTreeMap<_, _>>()
        );
    });
}

/// A client that keeps one socket and keeps sending keeps its session; once the session's
/// endpoint leaves the Service, the client's next datagram goes to an endpoint that serves.
/// The idle timeout is an hour here, so only the endpoint change can move it.
#[test]
fn a_udp_client_that_keeps_sending_moves_off_an_endpoint_that_left() {
    let _shared = shared();
    let ns = node();
    ns.run(|| {
        let rt = runtime();
        let mut options = UserspaceOptions::new(IpFamily::V4, NODE_IP.parse().unwrap());
        options.udp_timeout = Duration::from_secs(3600);
        let mut backend = UserspaceBackend::new(options, Box::new(iptables(&ns)), rt.handle().clone());
        rt.block_on(async {
            udp_server(ENDPOINTS[0]).await;
            udp_server(ENDPOINTS[1]).await;
        });
        let mut world = World::new();
        dns(&mut world, &ENDPOINTS[..1]);
        sync(&mut backend, world.state());
        let client = rt.block_on(async {
            let client = UdpSocket::bind("192.168.1.10:0").await.unwrap();
            client.connect(sock(DNS_VIP)).await.unwrap();
            client
        });
        let ask = |what: &str| {
            rt.block_on(async {
                client.send(what.as_bytes()).await.unwrap();
                let mut buffer = [0u8; 256];
                let n = tokio::time::timeout(CEILING, client.recv(&mut buffer))
                    .await
                    .unwrap()
                    .unwrap();
                String::from_utf8_lossy(&buffer[..n]).into_owned()
            })
        };
        assert_eq!(ask("one"), format!("{} one", ENDPOINTS[0]));
        assert_eq!(ask("two"), format!("{} two", ENDPOINTS[0]), "one session");

        dns(&mut world, &ENDPOINTS[1..2]);
        sync(&mut backend, world.state());
        assert_eq!(ask("three"), format!("{} three", ENDPOINTS[1]));
        assert_eq!(
            backend.active_udp_sessions(),
            2,
            "the old session idles out later"
        );
    });
}

/// A client that keeps its source port keeps its conntrack entry, and with it the
/// REDIRECT to the listener port its first datagram met. When the Service is deleted and
/// created again (on another listener port), that entry is deleted, so the same client
/// socket is answered again.
#[test]
fn a_udp_client_keeping_its_port_follows_a_recreated_service() {
    let _shared = shared();
    let ns = node();
    ns.run(|| {
        let rt = runtime();
        let (backend, _) = backend(&ns, &rt, Limits::default());
        let mut backend = backend.with_conntrack(Box::new(kpr_conntrack::NetlinkTable::new()));
        rt.block_on(udp_server(ENDPOINTS[0]));
        let mut world = World::new();
        dns(&mut world, &ENDPOINTS[..1]);
        sync(&mut backend, world.state());
        let first_port = backend.listeners().into_values().next().unwrap();
        let client = rt.block_on(async {
            let client = UdpSocket::bind("192.168.1.10:0").await.unwrap();
            client.connect(sock(DNS_VIP)).await.unwrap();
            client
        });
        let ask = |what: &str| {
            rt.block_on(async {
                client.send(what.as_bytes()).await.unwrap();
                let mut buffer = [0u8; 256];
                let n = tokio::time::timeout(Duration::from_secs(2), client.recv(&mut buffer))
                    .await
                    .map_err(|_| "timed out".to_owned())?
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(String::from_utf8_lossy(&buffer[..n]).into_owned())
            })
        };
        assert_eq!(ask("one"), Ok(format!("{} one", ENDPOINTS[0])));

        world.delete_service("dns");
        sync(&mut backend, world.state());
        dns(&mut world, &ENDPOINTS[..1]);
        sync(&mut backend, world.state());
        let second_port = backend.listeners().into_values().next().unwrap();
        assert_ne!(
            first_port, second_port,
            "the kernel picked the same port: nothing to show"
        );
        assert_eq!(ask("two"), Ok(format!("{} two", ENDPOINTS[0])));
    });
}
