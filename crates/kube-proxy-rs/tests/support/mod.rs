//! A running kube-proxy-rs on a one-node namespace lab, fed by a manifest directory the test
//! edits, with real backends in the pods.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // test support: a panic fails the test

pub mod api;
pub mod families;

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use kpr_netns::{Backend, Lab, Netns, ProcessGuard, eventually, pod_ip};

pub const NODE_NAME: &str = "node1";
/// The Service most tests run ([`web_yaml`]): cluster IP 10.96.0.10, port 80.
pub const WEB_VIP: &str = "10.96.0.10:80";
pub const HEALTHZ: &str = "127.0.0.1:10256";
pub const METRICS: &str = "127.0.0.1:10249";
const LAST_SYNC: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";
/// Long enough for a loaded 2-core CI machine; a ceiling against hangs, not a speed check.
pub const CONVERGE: Duration = Duration::from_secs(30);
pub const POLL: Duration = Duration::from_millis(100);

/// This node's Node as the API holds it (its InternalIP is the lab's node address), with
/// `taints`: a real cluster has one, and the proxy reads its node IP there at start-up (and
/// waits for it, as upstream does).
pub fn node_object(taints: serde_json::Value) -> k8s_openapi::api::core::v1::Node {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": NODE_NAME},
        "spec": {"taints": taints},
        "status": {"addresses": [{"type": "InternalIP", "address": kpr_netns::NODE_IP.to_string()}]}
    }))
    .unwrap()
}

/// The binary under test; inside a kpr-vm guest, the copy the guest was given.
pub fn proxy_binary() -> &'static str {
    if std::env::var_os(kpr_vm::GUEST_ENV).is_some() {
        return "/payload/bin/kube-proxy-rs";
    }
    env!("CARGO_BIN_EXE_kube-proxy-rs")
}

/// A lab, its manifest directory, and the proxy (once started).
pub struct Cluster {
    pub lab: Lab,
    pub manifests: tempfile::TempDir,
    pub proxy: Option<ProcessGuard>,
    backends: Vec<Backend>,
}

impl Cluster {
    pub fn new(pods: usize) -> Self {
        Self {
            lab: Lab::new(pods).expect("lab"),
            manifests: tempfile::tempdir().expect("manifest dir"),
            proxy: None,
            backends: Vec::new(),
        }
    }

    pub fn node(&self) -> &Netns {
        self.lab.node()
    }

    /// Writes (or replaces, atomically) one manifest file.
    pub fn write(&self, file: &str, yaml: &str) {
        let path = self.manifests.path().join(file);
        let temp = self.manifests.path().join(format!(".{file}.tmp"));
        std::fs::write(&temp, yaml).unwrap();
        std::fs::rename(&temp, &path).unwrap();
    }

    pub fn remove(&self, file: &str) {
        std::fs::remove_file(self.manifests.path().join(file)).unwrap();
    }

    pub fn manifest_path(&self) -> PathBuf {
        self.manifests.path().to_path_buf()
    }

    /// TCP backends answering with "pod<i>" on `port` in the given pods.
    pub fn tcp_backends(&mut self, pods: &[usize], port: u16) {
        for &i in pods {
            let addr = SocketAddr::new(IpAddr::V4(pod_ip(i)), port);
            let backend = self.lab.pod(i).tcp_backend(addr, &format!("pod{i}")).unwrap();
            self.backends.push(backend);
        }
    }

    /// Source addresses of every connection any backend answered.
    pub fn backend_peers(&self) -> Vec<SocketAddr> {
        self.backends.iter().flat_map(Backend::peers).collect()
    }

    pub fn udp_backends(&mut self, pods: &[usize], port: u16) {
        for &i in pods {
            let addr = SocketAddr::new(IpAddr::V4(pod_ip(i)), port);
            let backend = self.lab.pod(i).udp_backend(addr, &format!("pod{i}")).unwrap();
            self.backends.push(backend);
        }
    }

    /// Starts the proxy on the manifest directory in the node namespace and waits until it
    /// has synced once.
    pub fn start_proxy(&mut self, extra: &[&str]) {
        self.start_proxy_with(extra, true);
    }

    /// Starts the proxy with `extra` flags, on the manifest directory if `manifests`, and
    /// waits until its healthz port answers (and, on manifests, until its first sync).
    pub fn start_proxy_with(&mut self, extra: &[&str], manifests: bool) {
        self.spawn_proxy(extra, manifests);
        if manifests {
            // /healthz is 200 from the start, as upstream's: the first sync shows in the metrics.
            self.wait_healthz(200);
            self.wait_first_sync();
        } else {
            self.wait_listening();
        }
    }

    /// Starts the proxy like [`Cluster::start_proxy_with`] without waiting for anything.
    pub fn spawn_proxy(&mut self, extra: &[&str], manifests: bool) {
        let mut command = Command::new(proxy_binary());
        command.arg(format!("--hostname-override={NODE_NAME}"));
        if manifests {
            command.arg(format!("--manifests={}", self.manifests.path().display()));
        }
        command
            .arg(format!("--healthz-bind-address={HEALTHZ}"))
            .arg(format!("--metrics-bind-address={METRICS}"))
            .arg("--iptables-min-sync-period=200ms");
        // The lab's IPv4 pod network, unless the test gives its own (a flag counts once).
        if !extra.iter().any(|arg| arg.starts_with("--cluster-cidr")) {
            command.arg("--cluster-cidr=10.244.0.0/16");
        }
        command.args(extra).env("RUST_LOG", "debug");
        self.proxy = Some(self.lab.spawn(self.lab.node(), command).unwrap());
    }

    /// Waits until a sync has succeeded (upstream's last-sync timestamp metric is set).
    pub fn wait_first_sync(&self) {
        eventually(CONVERGE, POLL, || {
            match self.metric(&format!("{LAST_SYNC}{{ip_family=\"IPv4\"}}")) {
                Some(t) if t > 0.0 => Ok(()),
                other => Err(format!("{LAST_SYNC}: {other:?}\n{}", self.proxy_logs())),
            }
        });
    }

    /// Waits until the healthz server answers at all (200 or 503).
    pub fn wait_listening(&self) {
        eventually(CONVERGE, POLL, || {
            self.get(HEALTHZ, "/healthz")
                .map_err(|e| format!("healthz: {e}\n{}", self.proxy_logs()))
        });
    }

    pub fn proxy_logs(&self) -> String {
        self.proxy.as_ref().map(ProcessGuard::logs).unwrap_or_default()
    }

    /// `GET path` on the node's healthz or metrics port: (status, body).
    pub fn get(&self, address: &str, path: &str) -> io::Result<(u16, String)> {
        self.node()
            .http_get(address.parse().unwrap(), path, Duration::from_secs(2))
    }

    pub fn wait_healthz(&self, status: u16) -> String {
        eventually(CONVERGE, POLL, || match self.get(HEALTHZ, "/healthz") {
            Ok((got, body)) if got == status => Ok(body),
            Ok((got, body)) => Err(format!("healthz {got}: {body}\n{}", self.proxy_logs())),
            Err(e) => Err(format!("healthz: {e}\n{}", self.proxy_logs())),
        })
    }

    /// The value of one metric sample line (`name{labels}` exactly as exposed).
    pub fn metric(&self, sample: &str) -> Option<f64> {
        let (_, body) = self.get(METRICS, "/metrics").ok()?;
        body.lines()
            .find_map(|line| line.strip_prefix(sample)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// `iptables-save` inside the node, with the binaries the proxy picks by default.
    pub fn iptables_save(&self) -> String {
        self.node().sh("iptables-save").unwrap()
    }

    /// `kube-proxy-rs --dry-run` on the manifest directory, in the node namespace: what it
    /// printed (the run must succeed).
    pub fn dry_run(&self) -> String {
        let out = self
            .node()
            .command(proxy_binary())
            .args(["--dry-run", &format!("--hostname-override={NODE_NAME}")])
            .arg(format!("--manifests={}", self.manifest_path().display()))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The first KUBE-SVC- chain in the node's nat table (panics when there is none).
    pub fn first_service_chain(&self) -> String {
        self.iptables_save()
            .lines()
            .find_map(|l| {
                l.strip_prefix(":KUBE-SVC-")
                    .map(|rest| format!("KUBE-SVC-{}", &rest[..16]))
            })
            .unwrap()
    }

    /// Makes someone else's rule (in chain HOLDER) jump to `chain`, so no sync can delete
    /// `chain` until [`Cluster::release_chain`].
    pub fn hold_chain(&self, chain: &str) {
        self.node()
            .sh(&format!(
                "iptables -t nat -N HOLDER && iptables -t nat -A HOLDER -j {chain}"
            ))
            .unwrap();
    }

    /// Removes [`Cluster::hold_chain`]'s rule and chain.
    pub fn release_chain(&self) {
        self.node()
            .sh("iptables -t nat -F HOLDER && iptables -t nat -X HOLDER")
            .unwrap();
    }
}

/// Waits until `n` TCP requests from `ns` to `addr` are all answered by exactly `expected`,
/// and returns the counts.
pub fn wait_spread(ns: &Netns, addr: SocketAddr, n: usize, expected: &[&str]) -> BTreeMap<String, usize> {
    eventually(CONVERGE, POLL, || {
        let counts = kpr_netns::spread(ns, addr, n);
        let keys: Vec<&str> = counts.keys().map(String::as_str).collect();
        if keys == expected {
            Ok(counts)
        } else {
            Err(format!("replies from {addr}: {counts:?}, want only {expected:?}"))
        }
    })
}

/// Each of `counts`' backends got at least a third of its fair share: with a few hundred
/// connections spread uniformly, anything less means the probabilities are wrong.
pub fn assert_fair(counts: &BTreeMap<String, usize>) {
    let total: usize = counts.values().sum();
    let fair = total / counts.len();
    for (backend, n) in counts {
        assert!(
            *n * 3 >= fair,
            "{backend} got {n} of {total} (fair share {fair}): {counts:?}"
        );
    }
}

pub fn service(
    name: &str,
    cluster_ip: &str,
    port: u16,
    target: u16,
    protocol: &str,
    node_port: Option<u16>,
) -> String {
    let (kind, node_port) = match node_port {
        Some(p) => ("NodePort", format!("\n    nodePort: {p}")),
        None => ("ClusterIP", String::new()),
    };
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  type: {kind}\n  \
         clusterIP: {cluster_ip}\n  clusterIPs: [{cluster_ip}]\n  ports:\n  - name: p\n    port: {port}\n    \
         targetPort: {target}\n    protocol: {protocol}{node_port}\n"
    )
}

/// Service `web` on [`WEB_VIP`] (target port 8080, TCP; a NodePort Service if `node_port`
/// is given) and its slice with ready endpoints on `pods`.
/// The tests' UDP Service `dns` (10.96.0.53:53 -> 5353) with `pods` as its endpoints.
pub fn dns_yaml(pods: &[usize]) -> String {
    service("dns", "10.96.0.53", 53, 5353, "UDP", None) + &slice("dns", pods, 5353, "UDP")
}

/// One UDP request to `to` from source port 40053: every call is the same conntrack flow.
pub fn udp_from_fixed_port(ns: &Netns, to: SocketAddr) -> Result<String, String> {
    ns.udp_request_from_port(40053, to, Duration::from_millis(500))
        .map_err(|e| e.to_string())
}

/// pod0 keeps answering but leaves the UDP Service `dns`: the same flow (one source port,
/// polled so its conntrack entry never expires) must reach pod1, in the mode `flags` select.
pub fn assert_a_udp_flow_moves_off_a_removed_pod(flags: &[&str]) {
    let mut cluster = Cluster::new(3);
    cluster.udp_backends(&[0, 1], 5353);
    let dns = sock("10.96.0.53:53");
    cluster.write("dns.yaml", &dns_yaml(&[0]));
    cluster.start_proxy(flags);
    let client = cluster.lab.pod(2);
    eventually(CONVERGE, POLL, || match udp_from_fixed_port(client, dns)? {
        reply if reply == "pod0" => Ok(()),
        other => Err(other),
    });
    // Only deleting the old flow's state (conntrack's, or IPVS's own) makes this pass.
    cluster.write("dns.yaml", &dns_yaml(&[1]));
    eventually(CONVERGE, POLL, || match udp_from_fixed_port(client, dns)? {
        reply if reply == "pod1" => Ok(()),
        other => Err(format!("still answered by {other}")),
    });
}

pub fn web_yaml(pods: &[usize], node_port: Option<u16>) -> String {
    service("web", "10.96.0.10", 80, 8080, "TCP", node_port) + &slice("web", pods, 8080, "TCP")
}

/// An EndpointSlice for service `name` with ready endpoints on the given pods.
pub fn slice(name: &str, pods: &[usize], port: u16, protocol: &str) -> String {
    let endpoints: String = pods
        .iter()
        .map(|&i| {
            format!(
                "- addresses: [\"{}\"]\n  conditions: {{ready: true, serving: true, terminating: false}}\n  nodeName: {NODE_NAME}\n",
                pod_ip(i)
            )
        })
        .collect();
    let endpoints = if endpoints.is_empty() {
        "[]\n".to_string()
    } else {
        format!("\n{endpoints}")
    };
    format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-abc\n  namespace: default\n  \
         labels:\n    kubernetes.io/service-name: {name}\naddressType: IPv4\nports:\n- name: p\n  port: {port}\n  \
         protocol: {protocol}\nendpoints: {endpoints}"
    )
}

pub fn sock(addr: &str) -> SocketAddr {
    addr.parse().unwrap()
}
