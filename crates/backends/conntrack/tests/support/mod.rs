//! Test support: the lab's DNS-like Service (its desired state comes from kpr-world, the
//! real conversions and trackers), and a namespace lab whose node DNATs real UDP flows.
//!
//! The lab's node holds the conntrack table under test. Its DNAT rules are the test's own
//! (one per client source-port range, so each flow's endpoint is known in advance); which
//! entries a reconcile then deletes is read back with the `conntrack` tool, not with the
//! code under test.

#![allow(dead_code, clippy::unwrap_used)]

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};

use kpr_netns::{CLIENT_IP, Lab, NODE_IP, Netns, pod_ip};
use serde_json::{Value, json};

pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 53);
pub const EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 53);
pub const OTHER_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 99);
pub const PORT: u16 = 53;
pub const TARGET_PORT: u16 = 5353;
pub const NODE_PORT: u16 = 30053;

/// The lab's DNS-like Service: UDP port 53 on [`VIP`] and [`EXTERNAL_IP`], NodePort
/// [`NODE_PORT`], target port [`TARGET_PORT`].
pub fn dns_service() -> Value {
    json!({"type": "NodePort", "clusterIP": VIP.to_string(), "externalIPs": [EXTERNAL_IP.to_string()],
           "ports": [{"name": "dns", "port": PORT, "protocol": "UDP", "targetPort": TARGET_PORT,
                      "nodePort": NODE_PORT}]})
}

/// The ports of the DNS-like Service's slices: `dns` (UDP) on `target_port`.
pub fn dns_slice_ports(target_port: u16) -> Value {
    json!([{"name": "dns", "port": target_port, "protocol": "UDP"}])
}

/// Client source ports `first..first + count` DNATed from `frontend` to `endpoint`.
#[derive(Clone, Copy, Debug)]
pub struct Route {
    pub frontend: SocketAddrV4,
    pub first_source_port: u16,
    pub count: u16,
    pub endpoint: SocketAddrV4,
}

impl Route {
    fn rule(&self) -> String {
        let last = self.first_source_port + (self.count - 1);
        format!(
            "-A KPR-CT-TEST -d {}/32 -p udp --dport {} --sport {}:{last} -j DNAT --to-destination {}",
            self.frontend.ip(),
            self.frontend.port(),
            self.first_source_port,
            self.endpoint
        )
    }

    pub fn source_ports(&self) -> impl Iterator<Item = u16> {
        self.first_source_port..self.first_source_port + self.count
    }
}

/// A lab (node, `pods` pods, a client) whose node DNATs by `routes` (the client reaches
/// every address through the node, its default gateway).
pub fn lab(pods: usize, routes: &[Route]) -> Lab {
    let lab = Lab::new(pods).expect("building the namespace lab (needs root, iproute2, br_netfilter)");
    let node = lab.node();
    // Long enough that no entry times out during a test.
    node.set_sysctl("net.netfilter.nf_conntrack_udp_timeout", "600")
        .expect("the node namespace has conntrack sysctls (nf_conntrack loaded)");
    let mut payload = String::from("*nat\n:KPR-CT-TEST - [0:0]\n-A PREROUTING -j KPR-CT-TEST\n");
    for route in routes {
        payload.push_str(&route.rule());
        payload.push('\n');
    }
    payload.push_str("COMMIT\n");
    restore(node, &payload);
    lab
}

/// Applies an `iptables-restore --noflush` payload in `node`.
pub fn restore(node: &Netns, payload: &str) {
    use std::io::Write;
    let mut child = node
        .command("iptables-restore")
        .arg("--noflush")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running iptables-restore in the node namespace");
    child.stdin.take().unwrap().write_all(payload.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "iptables-restore failed: {}\n{payload}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One datagram from the client, from `source_port` to `to`: one conntrack entry on the
/// node (unreplied unless a backend answers; the test does not wait for one).
pub fn send_from(
    client: &Netns,
    source: Ipv4Addr,
    source_ports: impl Iterator<Item = u16> + Send,
    to: SocketAddr,
) {
    client.run(move || {
        for port in source_ports {
            let socket = UdpSocket::bind(SocketAddr::from((source, port)))
                .unwrap_or_else(|e| panic!("binding {source}:{port} in the client namespace: {e}"));
            socket.send_to(b"q", to).unwrap();
        }
    });
}

/// Sends one datagram per source port of every route, from [`CLIENT_IP`].
pub fn send_routes(client: &Netns, routes: &[Route]) {
    for route in routes {
        send_from(
            client,
            CLIENT_IP,
            route.source_ports(),
            SocketAddr::V4(route.frontend),
        );
    }
}

/// A UDP conntrack entry as the `conntrack` tool shows it (the independent witness).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Seen {
    pub source_port: u16,
    pub destination: SocketAddr,
    pub reply_source: SocketAddr,
}

/// Runs the `conntrack` tool with `args` in `netns`: its output. Panics (failing the test)
/// when the tool cannot run or fails.
pub fn conntrack(netns: &Netns, args: &[&str]) -> String {
    let out = netns
        .command("conntrack")
        .args(args)
        .output()
        .expect("running the conntrack tool in the namespace (scripts/ensure-packages installs it)");
    assert!(
        out.status.success(),
        "conntrack {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every UDP entry in `node`'s table from [`CLIENT_IP`], as the `conntrack` tool lists them.
/// Panics (failing the test) when the tool cannot run.
pub fn conntrack_entries(node: &Netns) -> Vec<Seen> {
    let client = CLIENT_IP.to_string();
    let mut seen: Vec<Seen> = conntrack(node, &["-L", "-p", "udp", "-f", "ipv4", "-s", &client])
        .lines()
        .map(parse_conntrack_line)
        .collect();
    seen.sort();
    seen
}

/// `udp 17 598 src=A dst=B sport=P dport=Q [UNREPLIED] src=C dst=A sport=R dport=P ...`.
fn parse_conntrack_line(line: &str) -> Seen {
    let values = |key: &str| -> Vec<&str> {
        line.split_whitespace()
            .filter_map(|word| word.strip_prefix(key))
            .collect()
    };
    let (src, dst, sport, dport) = (values("src="), values("dst="), values("sport="), values("dport="));
    assert!(
        src.len() == 2 && dst.len() == 2 && sport.len() == 2 && dport.len() == 2,
        "unexpected conntrack line: {line}"
    );
    Seen {
        source_port: sport[0].parse().unwrap(),
        destination: SocketAddr::new(dst[0].parse().unwrap(), dport[0].parse().unwrap()),
        reply_source: SocketAddr::new(src[1].parse().unwrap(), sport[1].parse().unwrap()),
    }
}

/// Pod `index`'s address with [`TARGET_PORT`].
pub fn pod(index: usize) -> SocketAddrV4 {
    SocketAddrV4::new(pod_ip(index), TARGET_PORT)
}

pub fn node_port() -> SocketAddrV4 {
    SocketAddrV4::new(NODE_IP, NODE_PORT)
}
