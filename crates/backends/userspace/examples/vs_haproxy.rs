//! userspace mode's data path beside HAProxy, on the same cores, in a throw-away network
//! namespace (run as root; needs `haproxy` on the PATH):
//!
//! ```text
//! cargo run --release -p kpr-userspace --example vs_haproxy [seconds-per-line]
//! ```
//!
//! Both proxies get the same two endpoints and two threads (our listener's runtime has two
//! workers; HAProxy `nbthread 2`, `mode tcp`, `balance roundrobin`, splicing enabled as
//! HAProxy's own tuning guide suggests); the load generator runs in this process on its
//! own runtime. Lines: bulk throughput on 1 and 8 connections (client -> endpoint, the
//! endpoint discards), and connections per second (connect, 64-byte request, 64-byte
//! answer, close) with 64 clients. "direct" is the same load without a proxy. The table is
//! what BENCHMARKS.md shows.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kpr_iptables::{IptablesCli, Variant};
use kpr_model::IpFamily;
use kpr_netns::Netns;
use kpr_state::{Backend, PendingSync};
use kpr_userspace::{CopyMethod, Limits, UserspaceBackend, UserspaceOptions};
use kpr_world::{World, ep};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;

const NODE_IP: &str = "192.168.1.10";
const ENDPOINTS: [&str; 2] = ["192.168.1.21", "192.168.1.22"];
const ENDPOINT_PORT: u16 = 8080;
const HAPROXY_PORT: u16 = 9000;

fn runtime(threads: usize) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap()
}

/// Endpoint: reads a request; a 64-byte one is answered with 64 bytes, anything else is
/// discarded until end of stream.
async fn endpoint(ip: &str) {
    let listener = TcpListener::bind((ip.parse::<std::net::IpAddr>().unwrap(), ENDPOINT_PORT))
        .await
        .unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let _ = stream.set_nodelay(true);
                let mut buffer = vec![0u8; 256 * 1024];
                let mut first = true;
                while let Ok(n) = stream.read(&mut buffer).await {
                    if n == 0 {
                        return;
                    }
                    if first && n == 64 {
                        let _ = stream.write_all(&buffer[..64]).await;
                    }
                    first = false;
                }
            });
        }
    });
}

/// Bytes per second pushed through `to` on `connections` connections for `seconds`.
async fn throughput(to: SocketAddr, connections: usize, seconds: f64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let (stop, sent) = (stop.clone(), sent.clone());
        tasks.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(to).await.unwrap();
            let chunk = vec![1u8; 256 * 1024];
            while !stop.load(Ordering::Relaxed) {
                stream.write_all(&chunk).await.unwrap();
                sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(0.5)).await;
    let start_bytes = sent.load(Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let bytes = sent.load(Ordering::Relaxed) - start_bytes;
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = task.await;
    }
    bytes as f64 / elapsed
}

/// Connections per second (connect, 64 bytes each way, close) with `clients` at once.
async fn connection_rate(to: SocketAddr, clients: usize, seconds: f64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (stop, done) = (stop.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut answer = [0u8; 64];
            while !stop.load(Ordering::Relaxed) {
                let mut stream = TcpStream::connect(to).await.unwrap();
                let _ = stream.set_nodelay(true);
                stream.write_all(&[2u8; 64]).await.unwrap();
                stream.read_exact(&mut answer).await.unwrap();
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(0.5)).await;
    let start = done.load(Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let count = done.load(Ordering::Relaxed) - start;
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = task.await;
    }
    count as f64 / elapsed
}

fn haproxy(ns: &Netns, dir: &std::path::Path) -> Child {
    let servers: String = ENDPOINTS
        .iter()
        .enumerate()
        .map(|(i, ip)| format!("    server e{i} {ip}:{ENDPOINT_PORT}\n"))
        .collect();
    let config = format!(
        "global\n    nbthread 2\n    maxconn 4000\n    tune.maxaccept -1\n\
         defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 60s\n    timeout server 60s\n    option splice-auto\n\
         frontend f\n    bind {NODE_IP}:{HAPROXY_PORT}\n    default_backend b\n\
         backend b\n    balance roundrobin\n{servers}"
    );
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, config).unwrap();
    let child = ns
        .command("haproxy")
        .args(["-db", "-f"])
        .arg(&path)
        .spawn()
        .expect("haproxy");
    std::thread::sleep(Duration::from_millis(500));
    child
}

struct Line {
    name: &'static str,
    one_stream: f64,
    eight_streams: f64,
    connections: f64,
}

fn measure(name: &'static str, to: SocketAddr, load: &Runtime, seconds: f64) -> Line {
    Line {
        name,
        one_stream: load.block_on(throughput(to, 1, seconds)),
        eight_streams: load.block_on(throughput(to, 8, seconds)),
        connections: load.block_on(connection_rate(to, 64, seconds)),
    }
}

fn main() {
    let seconds: f64 = std::env::args().nth(1).map_or(3.0, |s| s.parse().unwrap());
    let ns = Netns::new("usbench").unwrap();
    ns.ip(&["link", "set", "lo", "up"]).unwrap();
    for ip in std::iter::once(NODE_IP).chain(ENDPOINTS) {
        ns.ip(&["addr", "add", &format!("{ip}/32"), "dev", "lo"]).unwrap();
    }
    let dir = std::env::temp_dir().join(format!("kpr-vs-haproxy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lines = ns.run(|| {
        let servers = runtime(1);
        servers.block_on(async {
            for ip in ENDPOINTS {
                endpoint(ip).await;
            }
        });
        let load = runtime(2);
        let mut lines = Vec::new();
        let direct: SocketAddr = format!("{}:{ENDPOINT_PORT}", ENDPOINTS[0]).parse().unwrap();
        lines.push(measure("direct (no proxy)", direct, &load, seconds));
        for (name, method) in [
            ("kube-proxy-rs userspace, auto (buffer, then splice)", CopyMethod::Auto),
            ("kube-proxy-rs userspace, splice", CopyMethod::Splice),
            ("kube-proxy-rs userspace, buffer copy", CopyMethod::Buffer),
        ] {
            let proxy = runtime(2);
            let mut options = UserspaceOptions::new(IpFamily::V4, NODE_IP.parse().unwrap());
            options.copy = method;
            options.limits = Limits {
                max_connections: 100_000,
                max_udp_sessions: 10,
            };
            let cli = IptablesCli::in_netns(IpFamily::V4, Variant::Auto, ns.name());
            let mut backend =
                UserspaceBackend::new(options, Box::new(cli), proxy.handle().clone());
            let mut world = World::new();
            world
                .service("web", json!({"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 80, "targetPort": ENDPOINT_PORT}]}))
                .slice("web", json!([{"name": "http", "port": ENDPOINT_PORT}]), ENDPOINTS.iter().map(|ip| ep(ip)).collect());
            let pending = PendingSync {
                state: world.state(),
                changed: Default::default(),
                service_changes: Vec::new(),
                endpoint_changes: Vec::new(),
            };
            backend.sync(&pending.request(true)).unwrap();
            let port = backend.listeners().into_values().next().unwrap();
            let to: SocketAddr = format!("{NODE_IP}:{port}").parse().unwrap();
            lines.push(measure(name, to, &load, seconds));
            backend.shutdown().unwrap();
        }
        let mut child = haproxy(&ns, &dir);
        let to: SocketAddr = format!("{NODE_IP}:{HAPROXY_PORT}").parse().unwrap();
        lines.push(measure("HAProxy 2.6 (mode tcp, nbthread 2)", to, &load, seconds));
        let _ = child.kill();
        let _ = child.wait();
        lines
    });
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "| proxy | 1 stream (Gbit/s) | 8 streams (Gbit/s) | connections/s (64 clients, 64 B each way) |"
    );
    println!("|---|---:|---:|---:|");
    for line in lines {
        println!(
            "| {} | {:.2} | {:.2} | {:.0} |",
            line.name,
            line.one_stream * 8.0 / 1e9,
            line.eight_streams * 8.0 / 1e9,
            line.connections
        );
    }
}
