//! The socket layer in the kernel: programs attached to a cgroup this test creates, maps
//! pinned in a directory of its own, traffic inside a network namespace of its own, with
//! nftables rules standing in for nftables mode's (DNAT for a Service, REJECT for one
//! without endpoints). The test process joins its cgroup for the checks that need
//! translation and leaves it again (guards undo everything, also when a check fails).
//!
//! Needs root, cgroup v2, bpffs, `ip`, `nft` and `conntrack`; a missing one fails the test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kpr_ebpf::host::cgroup2_root;
use kpr_ebpf::layer::{Capacities, Pins, SocketLayer, remove};
use kpr_ebpf::table::{Adopted, Ids, Table, adopted_of};
use kpr_model::IpFamily;
use kpr_netns::Netns;
use kpr_world::{World, ep};
use serde_json::json;

/// One test at a time: a test moves the whole process into its cgroup.
static SERIAL: Mutex<()> = Mutex::new(());

/// A cgroup under the cgroup v2 root, removed on drop (after the process left it).
struct TestCgroup {
    path: PathBuf,
    home: PathBuf,
}

impl TestCgroup {
    fn create(tag: &str) -> Self {
        let root = cgroup2_root().expect("a cgroup v2 hierarchy");
        let path = root.join(format!("kpr-ebpf-test-{}-{tag}", std::process::id()));
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let relative = own
            .lines()
            .find_map(|line| line.strip_prefix("0::"))
            .expect("this process's cgroup v2 path");
        let home = root.join(relative.trim_start_matches('/'));
        Self { path, home }
    }

    /// Moves this whole process (every thread) into the cgroup.
    fn join(&self) {
        move_process(&self.path);
    }

    fn leave(&self) {
        move_process(&self.home);
    }
}

fn move_process(cgroup: &Path) {
    std::fs::write(cgroup.join("cgroup.procs"), std::process::id().to_string())
        .unwrap_or_else(|e| panic!("join {}: {e}", cgroup.display()));
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.home.join("cgroup.procs"), std::process::id().to_string());
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// A pin directory of the test's own, detached and removed on drop.
struct TestPins(Pins);

impl TestPins {
    fn new(tag: &str) -> Self {
        let root = PathBuf::from(format!("/sys/fs/bpf/kpr-ebpf-test-{}-{tag}", std::process::id()));
        kpr_ebpf::host::ensure_bpffs(&root).expect("bpffs");
        let _ = remove(&Pins::new(&root));
        Self(Pins::new(root))
    }
}

impl Drop for TestPins {
    fn drop(&mut self) {
        let _ = remove(&self.0);
    }
}

/// Small capacities: the test needs a few entries.
fn capacities() -> Capacities {
    Capacities {
        services: 1024,
        backends: 4096,
        affinity: 1024,
        revnat: 4096,
    }
}

/// The namespace: endpoints on `lo`, routes to the Service ranges, and rules
/// like nftables mode's: DNAT for 10.96.0.10 (so an untranslated connection is seen as
/// such in conntrack) and REJECT for 10.96.0.11 (no endpoints).
fn lab() -> Netns {
    let ns = Netns::new("ebpf").unwrap();
    ns.sh("set -e
         ip addr add 10.99.0.2/32 dev lo
         ip addr add 10.99.0.3/32 dev lo
         ip route add 10.96.0.0/16 dev lo
         ip -6 addr add fd99::2/128 dev lo nodad
         ip -6 route add fd96::/64 dev lo
         nft -f - <<'EOF'
table inet kpr-test {
  chain nat-output {
    type nat hook output priority -100;
    ip daddr 10.96.0.10 tcp dport 80 dnat ip to 10.99.0.2:8080
    ip daddr 10.96.0.10 udp dport 53 dnat ip to 10.99.0.2:5353
  }
  chain filter-output {
    type filter hook output priority 0;
    ip daddr 10.96.0.11 tcp dport 80 reject with tcp reset
  }
}
EOF")
        .unwrap();
    ns
}

/// A TCP endpoint that answers each connection with the address it was reached at.
fn tcp_endpoint(ns: &Netns, addr: &str) -> SocketAddr {
    let listener = ns.run(|| TcpListener::bind(addr).unwrap());
    let local = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.write_all(local.to_string().as_bytes());
        }
    });
    local
}

/// A UDP endpoint that echoes each datagram prefixed with the address it was reached at.
fn udp_endpoint(ns: &Netns, addr: &str) -> SocketAddr {
    let socket = ns.run(|| UdpSocket::bind(addr).unwrap());
    let local = socket.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while let Ok((n, from)) = socket.recv_from(&mut buf) {
            let reply = format!("{local} {}", String::from_utf8_lossy(&buf[..n]));
            let _ = socket.send_to(reply.as_bytes(), from);
        }
    });
    local
}

/// Connects to `to` from inside the namespace; the answering endpoint and the peer address
/// the client's socket reports (getpeername).
fn request(ns: &Netns, to: &str) -> std::io::Result<(String, SocketAddr)> {
    let to: SocketAddr = to.parse().unwrap();
    ns.run(|| {
        let mut stream = TcpStream::connect_timeout(&to, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let peer = stream.peer_addr()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        Ok((answer, peer))
    })
}

fn conntrack(ns: &Netns) -> String {
    ns.sh("conntrack -L 2>/dev/null || true").unwrap()
}

/// The Services of the test, of one family, fed to the table.
struct Driver {
    world: World,
    table: Table,
    ids: Ids,
}

impl Driver {
    fn new(family: IpFamily, adopted: Adopted, ids: Ids) -> Self {
        Self {
            world: World::with_family(family),
            table: Table::new(family, adopted),
            ids,
        }
    }

    fn sync(&mut self, layer: &mut SocketLayer, full: bool) {
        let (state, changed) = self.world.take();
        let batch = self
            .table
            .sync(&state, (!full).then_some(&changed), &[], &mut self.ids);
        layer.apply(&batch.ops).unwrap();
    }

    /// Service `name` at `cluster_ip`, TCP 80 -> 8080 and UDP 53 -> 5353, with these
    /// endpoint addresses (and ClientIP affinity when `affinity` is given).
    fn service(&mut self, name: &str, cluster_ip: &str, endpoints: &[&str], affinity: Option<u32>) {
        let mut spec = json!({"clusterIP": cluster_ip, "ports": [
            {"name": "http", "port": 80, "targetPort": 8080},
            {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"}]});
        if let Some(seconds) = affinity {
            spec["sessionAffinity"] = json!("ClientIP");
            spec["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": seconds}});
        }
        self.world.service(name, spec);
        self.world.slice(
            name,
            json!([{"name": "http", "port": 8080}, {"name": "dns", "port": 5353, "protocol": "UDP"}]),
            endpoints.iter().map(|e| ep(e)).collect(),
        );
    }
}

fn start(pins: &TestPins, cgroup: &TestCgroup) -> SocketLayer {
    SocketLayer::start(pins.0.clone(), &cgroup.path, capacities()).expect("the socket layer starts")
}

#[test]
fn connections_to_a_cluster_ip_are_translated_at_connect_without_nat() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cgroup = TestCgroup::create("connect");
    let pins = TestPins::new("connect");
    let ns = lab();
    tcp_endpoint(&ns, "10.99.0.2:8080");
    udp_endpoint(&ns, "10.99.0.2:5353");
    tcp_endpoint(&ns, "[fd99::2]:8080");

    // Control: outside the cgroup, the rules DNAT the Service (a conntrack entry to the VIP).
    let (answer, _) = request(&ns, "10.96.0.10:80").unwrap();
    assert_eq!(answer, "10.99.0.2:8080");
    assert!(conntrack(&ns).contains("dst=10.96.0.10"), "{}", conntrack(&ns));
    ns.sh("conntrack -F 2>/dev/null || true").unwrap();

    let mut layer = start(&pins, &cgroup);
    let mut v4 = Driver::new(IpFamily::V4, Adopted::default(), Ids::default());
    v4.service("web", "10.96.0.10", &["10.99.0.2 ready"], None);
    v4.service("empty", "10.96.0.11", &[], None);
    v4.sync(&mut layer, true);
    let mut v6 = Driver::new(IpFamily::V6, Adopted::default(), Ids::above([100]));
    v6.service("web6", "fd96::10", &["fd99::2 ready"], None);
    v6.sync(&mut layer, true);
    // explain reads the pinned maps: which endpoints the cluster IP goes to.
    let query = kpr_explain::Query::parse("10.96.0.10:80").unwrap();
    let section = kpr_ebpf::explain_at(&pins.0, &query)
        .unwrap()
        .expect("maps pinned");
    let endpoints: Vec<SocketAddr> = section.findings[0].groups[0]
        .endpoints
        .iter()
        .map(|e| e.addr)
        .collect();
    assert_eq!(endpoints, ["10.99.0.2:8080".parse::<SocketAddr>().unwrap()]);
    let none = kpr_explain::Query::parse("10.96.0.11:80").unwrap();
    assert!(
        kpr_ebpf::explain_at(&pins.0, &none)
            .unwrap()
            .unwrap()
            .findings
            .is_empty(),
        "no endpoints, no entry"
    );
    cgroup.join();

    // TCP: the endpoint answers, the application sees the Service address, and conntrack
    // holds the connection to the endpoint only (no DNAT).
    let (answer, peer) = request(&ns, "10.96.0.10:80").unwrap();
    assert_eq!(answer, "10.99.0.2:8080");
    assert_eq!(
        peer,
        "10.96.0.10:80".parse().unwrap(),
        "getpeername shows the Service"
    );
    let table = conntrack(&ns);
    assert!(
        table.contains("dst=10.99.0.2") && table.contains("dport=8080"),
        "{table}"
    );
    assert!(!table.contains("10.96.0.10"), "no DNAT entry: {table}");

    // IPv6, and an IPv6 socket to the IPv4 Service through its IPv4-mapped address.
    let (answer, peer) = request(&ns, "[fd96::10]:80").unwrap();
    assert_eq!(
        (answer.as_str(), peer),
        ("[fd99::2]:8080", "[fd96::10]:80".parse().unwrap())
    );
    let (answer, peer) = request(&ns, "[::ffff:10.96.0.10]:80").unwrap();
    assert_eq!(answer, "10.99.0.2:8080", "the IPv4 endpoint answered");
    assert_eq!(peer, "[::ffff:10.96.0.10]:80".parse().unwrap());

    // UDP, unconnected and connected: the reply comes from the Service address.
    let (reply, from, connected_peer) = ns.run(|| {
        let socket = UdpSocket::bind("0.0.0.0:0").unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        socket.send_to(b"ping", "10.96.0.10:53").unwrap();
        let mut buf = [0u8; 1500];
        let (n, from) = socket.recv_from(&mut buf).unwrap();
        let reply = String::from_utf8_lossy(&buf[..n]).into_owned();
        let connected = UdpSocket::bind("0.0.0.0:0").unwrap();
        connected.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        connected.connect("10.96.0.10:53").unwrap();
        connected.send(b"again").unwrap();
        let n = connected.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"10.99.0.2:5353 again");
        (reply, from, connected.peer_addr().unwrap())
    });
    assert_eq!(reply, "10.99.0.2:5353 ping");
    assert_eq!(
        from,
        "10.96.0.10:53".parse().unwrap(),
        "the reply's source is the Service"
    );
    assert_eq!(connected_peer, "10.96.0.10:53".parse().unwrap());

    // No endpoints: untranslated, so the rules REJECT it.
    let refused = request(&ns, "10.96.0.11:80").unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused, "{refused}");

    // Cleanup detaches: the same connection is DNATed by the rules again.
    cgroup.leave();
    drop(layer);
    remove(&pins.0).unwrap();
    assert!(!pins.0.exists());
    cgroup.join();
    ns.sh("conntrack -F 2>/dev/null || true").unwrap();
    let (answer, peer) = request(&ns, "10.96.0.10:80").unwrap();
    assert_eq!(
        (answer.as_str(), peer),
        ("10.99.0.2:8080", "10.96.0.10:80".parse().unwrap())
    );
    assert!(
        conntrack(&ns).contains("dst=10.96.0.10"),
        "programs detached: {}",
        conntrack(&ns)
    );
    cgroup.leave();
}

#[test]
fn affinity_keeps_a_client_on_one_endpoint_and_random_spreads() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cgroup = TestCgroup::create("affinity");
    let pins = TestPins::new("affinity");
    let ns = lab();
    tcp_endpoint(&ns, "10.99.0.2:8080");
    tcp_endpoint(&ns, "10.99.0.3:8080");
    let mut layer = start(&pins, &cgroup);
    let mut v4 = Driver::new(IpFamily::V4, Adopted::default(), Ids::default());
    v4.service(
        "spread",
        "10.96.0.20",
        &["10.99.0.2 ready", "10.99.0.3 ready"],
        None,
    );
    v4.service(
        "sticky",
        "10.96.0.21",
        &["10.99.0.2 ready", "10.99.0.3 ready"],
        Some(600),
    );
    v4.sync(&mut layer, true);
    cgroup.join();
    let answers = |vip: &str| -> BTreeSet<String> { (0..40).map(|_| request(&ns, vip).unwrap().0).collect() };
    // Chance of one endpoint in 40 random picks of 2: 2^-39.
    assert_eq!(answers("10.96.0.20:80").len(), 2);
    assert_eq!(
        answers("10.96.0.21:80").len(),
        1,
        "affinity per client network namespace"
    );
    cgroup.leave();
}

/// Endpoint changes and a restart (a new process adopting the pinned maps and links) while
/// connections are opened back to back: none fails.
#[test]
fn map_updates_and_a_restart_under_load_lose_no_connection() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cgroup = TestCgroup::create("load");
    let pins = TestPins::new("load");
    let ns = Arc::new(lab());
    tcp_endpoint(&ns, "10.99.0.2:8080");
    tcp_endpoint(&ns, "10.99.0.3:8080");
    // Outside the socket layer, 10.96.0.30 goes nowhere: a connect that is not translated
    // fails, so the count below proves every one was.
    let mut layer = start(&pins, &cgroup);
    let mut v4 = Driver::new(IpFamily::V4, Adopted::default(), Ids::default());
    v4.service("busy", "10.96.0.30", &["10.99.0.2 ready"], None);
    v4.sync(&mut layer, true);
    cgroup.join();

    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(Vec::new())));
    let load = {
        let (ns, stop, ok, failed) = (ns.clone(), stop.clone(), ok.clone(), failed.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match request(&ns, "10.96.0.30:80") {
                    Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        failed.lock().unwrap().push(e.to_string());
                        0
                    }
                };
            }
        })
    };
    let sets: [&[&str]; 3] = [
        &["10.99.0.3 ready"],
        &["10.99.0.2 ready", "10.99.0.3 ready"],
        &["10.99.0.2 ready"],
    ];
    for round in 0..300 {
        v4.service("busy", "10.96.0.30", sets[round % 3], None);
        v4.sync(&mut layer, false);
        std::thread::sleep(Duration::from_millis(2));
    }
    // Restart: the new process adopts the maps and links, rewrites everything, and the old
    // one goes away.
    let mut restarted = start(&pins, &cgroup);
    let (services, backends) = restarted.adopted_entries().unwrap();
    assert!(!services.is_empty(), "the maps were adopted with their entries");
    let mut next = Driver::new(
        IpFamily::V4,
        adopted_of(IpFamily::V4, &services, &backends),
        Ids::above(backends.iter().map(|(k, _)| k.id)),
    );
    drop(layer);
    next.service("busy", "10.96.0.30", &["10.99.0.3 ready"], None);
    next.sync(&mut restarted, true);
    std::thread::sleep(Duration::from_millis(300));
    for round in 0..100 {
        next.service("busy", "10.96.0.30", sets[round % 3], None);
        next.sync(&mut restarted, false);
        std::thread::sleep(Duration::from_millis(2));
    }
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    cgroup.leave();
    let failed = failed.lock().unwrap();
    let ok = ok.load(Ordering::Relaxed);
    eprintln!(
        "connections under updates and a restart: {ok} answered, {} failed",
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{} of {} failed: {:?}",
        failed.len(),
        ok + failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(ok > 100, "only {ok} connections were made");
    let links = std::fs::read_dir(pins.0.links()).unwrap().count();
    assert_eq!(links, 8, "one link per program after the restart");
}

/// A full map refuses the write with an error that says so.
#[test]
fn a_full_map_is_reported_as_capacity_exceeded() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cgroup = TestCgroup::create("capacity");
    let pins = TestPins::new("capacity");
    let mut layer = SocketLayer::start(
        pins.0.clone(),
        &cgroup.path,
        Capacities {
            services: 2,
            ..capacities()
        },
    )
    .unwrap();
    let mut v4 = Driver::new(IpFamily::V4, Adopted::default(), Ids::default());
    for (name, ip) in [("a", "10.96.0.40"), ("b", "10.96.0.41")] {
        v4.service(name, ip, &["10.99.0.2 ready"], None);
    }
    let (state, _) = v4.world.take();
    let batch = v4.table.sync(&state, None, &[], &mut v4.ids);
    let error = layer.apply(&batch.ops).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("map capacity exceeded: map kpr_services holds 2 Service addresses"),
        "{error}"
    );
}

/// Control-plane cost at scale: loading N Services x 10 endpoints into the maps (pure diff
/// plus writes), then single-endpoint changes one at a time. N is 10,000, or
/// `KPR_EBPF_SERVICES`. The figures are printed; the assertions are about what was written.
#[test]
fn loading_many_services_and_changing_one_endpoint() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let services: u32 = std::env::var("KPR_EBPF_SERVICES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    let cgroup = TestCgroup::create("scale");
    let pins = TestPins::new("scale");
    let mut layer = SocketLayer::start(pins.0.clone(), &cgroup.path, Capacities::default()).unwrap();
    let ip = |base: u32, n: u32| std::net::Ipv4Addr::from(base + n).to_string();
    let mut world = World::with_family(IpFamily::V4);
    let endpoints_of = |i: u32, shift: u32| -> Vec<serde_json::Value> {
        (0..10)
            .map(|e| ep(&format!("{} ready", ip(0x0a80_0000, i * 16 + e + shift))))
            .collect()
    };
    for i in 0..services {
        let name = format!("s{i}");
        world.service(
            &name,
            json!({"clusterIP": ip(0x0a40_0000, i + 1), "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}),
        );
        world.slice(&name, json!([{"name": "http", "port": 8080}]), endpoints_of(i, 0));
    }
    let mut table = Table::new(IpFamily::V4, Adopted::default());
    let mut ids = Ids::default();
    let started = std::time::Instant::now();
    let (state, _) = world.take();
    let batch = table.sync(&state, None, &[], &mut ids);
    let computed = started.elapsed();
    layer.apply(&batch.ops).unwrap();
    let loaded = started.elapsed();
    let writes = batch.ops.len();
    assert_eq!(table.sizes(), (services as usize, services as usize * 10));
    let mut changes = Vec::new();
    for round in 0..200u32 {
        let i = round * 37 % services;
        world.slice(
            &format!("s{i}"),
            json!([{"name": "http", "port": 8080}]),
            endpoints_of(i, 1 + round % 2),
        );
        let (state, changed) = world.take();
        let started = std::time::Instant::now();
        let batch = table.sync(&state, Some(&changed), &[], &mut ids);
        layer.apply(&batch.ops).unwrap();
        changes.push(started.elapsed());
        assert!(
            batch.ops.len() <= 12,
            "one endpoint change is a few writes: {}",
            batch.ops.len()
        );
    }
    changes.sort();
    let rss = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .unwrap_or_default()
        .to_owned();
    eprintln!(
        "{services} Services x 10 endpoints: diff {computed:?}, diff + {} map writes {loaded:?}; \
         one endpoint change: p50 {:?}, p99 {:?}, max {:?}; test process {rss}",
        writes,
        changes[changes.len() / 2],
        changes[changes.len() * 99 / 100],
        changes[changes.len() - 1]
    );
}

/// Pinned maps of another size (another build's layout, other capacities) are not adopted:
/// the loader would reuse them by name without comparing; they are replaced by new maps.
#[test]
fn pinned_maps_of_another_capacity_are_replaced_not_adopted() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cgroup = TestCgroup::create("replace");
    let pins = TestPins::new("replace");
    let mut first = start(&pins, &cgroup);
    let mut v4 = Driver::new(IpFamily::V4, Adopted::default(), Ids::default());
    v4.service("web", "10.96.0.50", &["10.99.0.2 ready"], None);
    v4.sync(&mut first, true);
    drop(first);
    let same = start(&pins, &cgroup);
    assert!(
        !same.adopted_entries().unwrap().0.is_empty(),
        "same capacities: adopted"
    );
    drop(same);
    let other = SocketLayer::start(
        pins.0.clone(),
        &cgroup.path,
        Capacities {
            services: 2048,
            ..capacities()
        },
    )
    .unwrap();
    assert!(
        other.adopted_entries().unwrap().0.is_empty(),
        "other capacities: new maps"
    );
    assert_eq!(std::fs::read_dir(pins.0.links()).unwrap().count(), 8);
}

/// What the programs cost a connection: sequential connect + one answer + close, to the
/// Service address (translated, with affinity and without) and straight to the endpoint,
/// alternating in rounds inside one namespace. Printed; asserted only that all answered.
#[test]
fn connects_through_the_socket_layer_and_direct() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cgroup = TestCgroup::create("cost");
    let pins = TestPins::new("cost");
    let ns = lab();
    tcp_endpoint(&ns, "10.99.0.2:8080");
    let mut layer = start(&pins, &cgroup);
    let mut v4 = Driver::new(IpFamily::V4, Adopted::default(), Ids::default());
    v4.service("plain", "10.96.0.60", &["10.99.0.2 ready"], None);
    v4.service("sticky", "10.96.0.61", &["10.99.0.2 ready"], Some(600));
    v4.sync(&mut layer, true);
    cgroup.join();
    let rate = |to: &str| -> f64 {
        let to: SocketAddr = to.parse().unwrap();
        ns.run(|| {
            let started = std::time::Instant::now();
            for _ in 0..2000 {
                let mut stream = TcpStream::connect(to).unwrap();
                let mut answer = [0u8; 64];
                let _ = stream.read(&mut answer).unwrap();
            }
            2000.0 / started.elapsed().as_secs_f64()
        })
    };
    let (mut direct, mut service, mut sticky) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        direct.push(rate("10.99.0.2:8080"));
        service.push(rate("10.96.0.60:80"));
        sticky.push(rate("10.96.0.61:80"));
    }
    cgroup.leave();
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[1]
    };
    let (d, s, a) = (median(&mut direct), median(&mut service), median(&mut sticky));
    eprintln!(
        "sequential connects/s, median of 3 rounds of 2000: direct {d:.0}, Service {s:.0} ({:.2}x), \
         Service with affinity {a:.0} ({:.2}x)",
        s / d,
        a / d
    );
}

/// Stands in for nftables mode's backend: the socket layer's capacity is under test.
struct NoRules;

impl kpr_state::Backend for NoRules {
    fn sync(
        &mut self,
        _request: &kpr_state::SyncRequest<'_>,
    ) -> Result<kpr_state::SyncReport, kpr_state::BackendError> {
        Ok(kpr_state::SyncReport::default())
    }
}

/// ebpf mode's IPv4 backend over a layer started with room for two Service addresses (one
/// Service of the test: TCP and UDP), and its metrics.
fn small_backend(
    pins: &TestPins,
    cgroup: &TestCgroup,
) -> (kpr_ebpf::EbpfBackend, prometheus_client::registry::Registry) {
    use kpr_mode::Mode as _;
    let mut registry = prometheus_client::registry::Registry::default();
    let settings = kpr_config::load(["kube-proxy"]).unwrap();
    kpr_ebpf::EbpfMode.register_metrics(&settings, &mut registry);
    let layer = SocketLayer::start(
        pins.0.clone(),
        &cgroup.path,
        Capacities {
            services: 2,
            ..capacities()
        },
    )
    .unwrap();
    let (shared, v4, _) = kpr_ebpf::SharedLayer::new(layer).unwrap();
    let backend = kpr_ebpf::EbpfBackend::new(
        IpFamily::V4,
        Box::new(NoRules),
        shared,
        Table::new(IpFamily::V4, v4),
        kpr_host::NodePortAddresses::All,
    );
    (backend, registry)
}

fn sync_world(backend: &mut kpr_ebpf::EbpfBackend, world: &mut World) -> Result<(), kpr_state::BackendError> {
    use kpr_state::Backend as _;
    let (state, changed) = world.take();
    let request = kpr_state::SyncRequest {
        state: &state,
        changed: &changed,
        service_changes: &[],
        endpoint_changes: &[],
        force_full: false,
    };
    backend.sync(&request).map(|_| ())
}

fn service_keys(pins: &TestPins) -> Vec<String> {
    let services = kpr_ebpf::layer::open_pinned::<kpr_ebpf::maps::ServiceKey, kpr_ebpf::maps::ServiceValue>(
        &pins.0,
        kpr_ebpf::maps::SERVICES,
    )
    .unwrap();
    let mut keys: Vec<String> = services
        .keys()
        .map(|k| k.unwrap())
        .map(|k| format!("{}:{}", k.ip(), k.port()))
        .collect();
    keys.sort();
    keys
}

/// The first sync of a cluster larger than the maps: an error only the operator can fix
/// (the binary exits 1 with it), naming the map, its capacity, the need and the flag; and
/// what this start attached and pinned is taken away.
#[test]
fn a_cluster_too_large_for_the_maps_at_the_first_sync_is_fatal_and_detaches() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cgroup = TestCgroup::create("capacity-first");
    let pins = TestPins::new("capacity-first");
    let (mut backend, registry) = small_backend(&pins, &cgroup);
    let mut v4 = Driver::new(IpFamily::V4, Adopted::default(), Ids::default());
    v4.service("a", "10.96.0.40", &["10.99.0.2 ready"], None);
    v4.service("b", "10.96.0.41", &["10.99.0.2 ready"], None);
    let error = sync_world(&mut backend, &mut v4.world).unwrap_err();
    assert!(error.needs_operator, "{error}");
    let message = error.to_string();
    assert_eq!(
        message,
        "map capacity exceeded: map kpr_services holds 2 Service addresses, the cluster needs 4; \
         --ebpf-max-service-addresses (ebpf.maxServiceAddresses in the config file) sizes it"
    );
    assert!(!pins.0.exists(), "nothing left pinned (so nothing attached)");
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(
            "kubeproxy_ebpf_socket_map_sync_failures_total{ip_family=\"IPv4\",reason=\"capacity\"} 1"
        ),
        "{text}"
    );
}

/// A later change that does not fit fails its sync (retried, reported as any failed sync)
/// before anything is written: the maps keep what the previous sync wrote.
#[test]
fn a_later_change_too_large_for_the_maps_fails_without_writing() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cgroup = TestCgroup::create("capacity-later");
    let pins = TestPins::new("capacity-later");
    let (mut backend, _registry) = small_backend(&pins, &cgroup);
    let mut v4 = Driver::new(IpFamily::V4, Adopted::default(), Ids::default());
    v4.service("a", "10.96.0.40", &["10.99.0.2 ready"], None);
    sync_world(&mut backend, &mut v4.world).unwrap();
    let before = service_keys(&pins);
    assert_eq!(before, ["10.96.0.40:53", "10.96.0.40:80"]);
    // a moves to another endpoint and b comes: too many.
    v4.service("a", "10.96.0.40", &["10.99.0.3 ready"], None);
    v4.service("b", "10.96.0.41", &["10.99.0.2 ready"], None);
    let error = sync_world(&mut backend, &mut v4.world).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("map capacity exceeded: map kpr_services"),
        "{error}"
    );
    assert_eq!(service_keys(&pins), before, "nothing of the failed sync written");
    assert_eq!(
        std::fs::read_dir(pins.0.links()).unwrap().count(),
        8,
        "still attached"
    );
    // Once it fits again (b gone), the next (full) sync succeeds.
    v4.world.delete_service("b");
    sync_world(&mut backend, &mut v4.world).unwrap();
    assert_eq!(service_keys(&pins), before);
    let backends = kpr_ebpf::layer::open_pinned::<kpr_ebpf::maps::BackendKey, kpr_ebpf::maps::AddrPort>(
        &pins.0,
        kpr_ebpf::maps::BACKENDS,
    )
    .unwrap();
    let mut slots: Vec<String> = backends
        .iter()
        .map(|entry| entry.unwrap().1.socket_addr().to_string())
        .collect();
    slots.sort();
    assert_eq!(
        slots,
        ["10.99.0.3:5353", "10.99.0.3:8080"],
        "a's new endpoint only"
    );
}

/// Start-up failing after the socket layer attached (the IPv6 family's backend, or a first
/// sync only the operator can fix): what this start attached and pinned is taken away; a
/// layer over maps adopted from a previous process keeps serving them.
#[test]
fn a_failed_start_detaches_its_own_layer_and_keeps_an_adopted_one() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cgroup = TestCgroup::create("abandon");
    let pins = TestPins::new("abandon");
    let fresh = start(&pins, &cgroup);
    assert_eq!(fresh.abandon(), Ok(true));
    assert!(!pins.0.exists(), "nothing left pinned, so nothing attached");
    drop(fresh);

    let mut first = start(&pins, &cgroup);
    let mut v4 = Driver::new(IpFamily::V4, Adopted::default(), Ids::default());
    v4.service("web", "10.96.0.50", &["10.99.0.2 ready"], None);
    v4.sync(&mut first, true);
    drop(first);
    let adopting = start(&pins, &cgroup);
    assert!(adopting.adopted());
    assert_eq!(adopting.abandon(), Ok(false));
    assert_eq!(
        std::fs::read_dir(pins.0.links()).unwrap().count(),
        8,
        "still attached"
    );
    assert_eq!(service_keys(&pins), ["10.96.0.50:53", "10.96.0.50:80"]);
}

/// bpf/socket_lb.c built with one program breaking a kernel rule (a getpeername program
/// must return 1; build.rs builds it beside the real object).
static REFUSED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/socket_lb_refused.o"));

/// Everything under a pin directory (empty when nothing is left).
fn pinned_files(pins: &TestPins) -> Vec<String> {
    [pins.0.maps(), pins.0.links()]
        .iter()
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .flatten()
        .map(|entry| entry.unwrap().path().display().to_string())
        .collect()
}

/// A program the verifier refuses: a clear error naming the program and quoting the
/// verifier, before anything is attached. A fresh start leaves no pin at all; a start over
/// a previous process's layer leaves that layer serving (its links and its entries).
#[test]
fn a_program_the_verifier_refuses_is_a_clear_error_and_leaves_nothing_behind() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cgroup = TestCgroup::create("refused");
    let pins = TestPins::new("refused");
    let refused = |pins: &TestPins| {
        SocketLayer::start_from(pins.0.clone(), &cgroup.path, capacities(), REFUSED)
            .expect_err("the verifier refuses kpr_getpeername6")
            .to_string()
    };
    let message = refused(&pins);
    assert!(
        message.starts_with(
            "BPF programs refused by the kernel (verifier or missing feature): kpr_getpeername6: "
        ),
        "{message}"
    );
    assert!(
        message.contains("R0"),
        "the verifier's own reason (about R0, the return value): {message}"
    );
    assert!(!pins.0.exists(), "left pinned: {:?}", pinned_files(&pins));

    let mut first = start(&pins, &cgroup);
    let mut v4 = Driver::new(IpFamily::V4, Adopted::default(), Ids::default());
    v4.service("web", "10.96.0.50", &["10.99.0.2 ready"], None);
    v4.sync(&mut first, true);
    drop(first);
    let before = pinned_files(&pins);
    assert_eq!(before.len(), 4 + 8, "four maps, eight links");
    refused(&pins);
    assert_eq!(pinned_files(&pins), before, "the previous layer is untouched");
    assert_eq!(service_keys(&pins), ["10.96.0.50:53", "10.96.0.50:80"]);
}
