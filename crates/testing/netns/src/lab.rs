//! A one-node "cluster" built from network namespaces: the node, its pods, and a client
//! outside the cluster, wired like a real node so Service traffic takes the real paths.
//!
//! ```text
//!   pod i (eth0 10.244.1.(10+i)/24) --veth-- vp<i> ┐
//!                                                  kbr0 10.244.1.1/24   (node namespace)
//!   client (eth0 192.168.77.2/24) ----veth---- eth0 192.168.77.1/24
//! ```
//!
//! Each interface also has its IPv6 twin (`fd00:10:244:1::<10+i>/64` on pods,
//! `fd00:10:244:1::1/64` on the bridge, `fd00:77::1/64` and `fd00:77::2/64` on the link),
//! added without duplicate address detection so they are usable at once, with IPv6
//! forwarding and bridged IPv6 traffic passing through ip6tables, as on a dual-stack node.
//!
//! Every interface is created inside the namespaces, so the root namespace never sees one;
//! dropping the lab (also while unwinding from a panic) deletes everything it made.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tempfile::TempDir;

use crate::addressing::{
    BRIDGE, CLIENT_IFACE, CLIENT_IP, CLIENT_IP_V6, MAX_PODS, NODE_IFACE, NODE_IP, NODE_IP_V6,
    NODE_LINK_PREFIX_LEN, NODE_LINK_PREFIX_LEN_V6, POD_GATEWAY, POD_GATEWAY_V6, POD_IFACE, POD_PREFIX_LEN,
    POD_PREFIX_LEN_V6, pod_ip, pod_ip_v6, pod_port_name,
};
use crate::error::{Error, Result};
use crate::naming::{NAME_PREFIX, namespace_name, next_serial};
use crate::netns::Netns;
use crate::process::{LogTarget, ProcessGuard, Registry, kill_registered, program_name, spawn_in};
use crate::sweep::{LOG_DIR_MARKER, sweep_stale_log_dirs, sweep_stale_namespaces};

const BRIDGE_NF_CALL_IPTABLES: &str = "net.bridge.bridge-nf-call-iptables";
const BRIDGE_NF_CALL_IP6TABLES: &str = "net.bridge.bridge-nf-call-ip6tables";

/// The node, `pods` pod namespaces and the client, wired up and ready for traffic.
///
/// Fields drop in order: processes first (in [`Drop`]), then pods, client, node.
#[derive(Debug)]
pub struct Lab {
    processes: Registry,
    spawned: AtomicUsize,
    pods: Vec<Netns>,
    client: Netns,
    node: Netns,
    log_dir: Arc<TempDir>,
}

impl Lab {
    /// Sweeps namespaces and log directories left by dead test processes, then builds a
    /// lab with `pods` pods (pod `i` has [`pod_ip`]`(i)`).
    pub fn new(pods: usize) -> Result<Self> {
        if pods > MAX_PODS {
            return Err(Error::TooManyPods {
                requested: pods,
                max: MAX_PODS,
            });
        }
        sweep_stale_namespaces();
        sweep_stale_log_dirs();
        let serial = next_serial();
        let log_dir = log_dir(serial)?;
        let node = Netns::create(namespace_name(serial, "node")?)?;
        wire_node(&node)?;
        let client = Netns::create(namespace_name(serial, "cl")?)?;
        wire_client(&node, &client)?;
        let pods = (0..pods)
            .map(|index| {
                let pod = Netns::create(namespace_name(serial, &format!("p{index}"))?)?;
                wire_pod(&node, &pod, index)?;
                Ok(pod)
            })
            .collect::<Result<Vec<_>>>()?;
        // The node's default routes need the client link up, so they come last.
        node.ip(&["route", "add", "default", "via", &CLIENT_IP.to_string()])?;
        node.ip(&["-6", "route", "add", "default", "via", &CLIENT_IP_V6.to_string()])?;
        Ok(Self {
            processes: Registry::default(),
            spawned: AtomicUsize::new(0),
            pods,
            client,
            node,
            log_dir,
        })
    }

    /// The node namespace: where kube-proxy-rs runs.
    pub fn node(&self) -> &Netns {
        &self.node
    }

    /// The client namespace, outside the cluster.
    pub fn client(&self) -> &Netns {
        &self.client
    }

    /// Pod `index`'s namespace.
    ///
    /// # Panics
    /// When the lab has no such pod.
    pub fn pod(&self, index: usize) -> &Netns {
        self.pods
            .get(index)
            .unwrap_or_else(|| panic!("the lab has {} pods, not pod {index}", self.pods.len()))
    }

    /// All pod namespaces, pod 0 first.
    pub fn pods(&self) -> &[Netns] {
        &self.pods
    }

    /// Where the logs of spawned programs are written (deleted with the lab).
    pub fn log_dir(&self) -> &Path {
        self.log_dir.path()
    }

    /// Starts the long-running `command` inside `ns`, its output going to a log file in
    /// [`Lab::log_dir`]. The guard stops it; so does dropping the lab.
    pub fn spawn(&self, ns: &Netns, command: Command) -> std::io::Result<ProcessGuard> {
        let sequence = self.spawned.fetch_add(1, Ordering::Relaxed);
        let path = self
            .log_dir()
            .join(format!("{sequence}-{}.log", program_name(&command)));
        let log = LogTarget {
            dir: Arc::clone(&self.log_dir),
            path,
        };
        spawn_in(ns, command, log, Arc::clone(&self.processes))
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        kill_registered(&self.processes);
        // The namespaces delete themselves as the fields drop.
    }
}

fn log_dir(serial: usize) -> Result<Arc<TempDir>> {
    let prefix = format!("{NAME_PREFIX}{}x{serial}{LOG_DIR_MARKER}", std::process::id());
    let dir = tempfile::Builder::new()
        .prefix(&prefix)
        .tempdir()
        .map_err(|source| Error::Io {
            what: "cannot create the lab's log directory".to_owned(),
            source,
        })?;
    Ok(Arc::new(dir))
}

/// An IPv6 address on `dev`, usable at once: no duplicate address detection (nothing else
/// shares the lab's links), so a test never races an address that is still "tentative".
fn add_ipv6(ns: &Netns, address: impl std::fmt::Display, prefix_len: u8, dev: &str) -> Result<()> {
    ns.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{address}/{prefix_len}"),
        "dev",
        dev,
        "nodad",
    ])
    .map(drop)
}

/// Forwarding, the pod bridge, and iptables on bridged traffic, for both families.
fn wire_node(node: &Netns) -> Result<()> {
    node.set_sysctl("net.ipv4.ip_forward", "1")?;
    node.set_sysctl("net.ipv6.conf.all.forwarding", "1")?;
    // Loose reverse-path filtering, as on common distributions, whatever the host uses
    // (new namespaces may inherit the host's setting).
    node.set_sysctl("net.ipv4.conf.all.rp_filter", "2")?;
    node.set_sysctl("net.ipv4.conf.default.rp_filter", "2")?;
    node.ip(&["link", "add", BRIDGE, "type", "bridge"])?;
    node.ip(&[
        "addr",
        "add",
        &format!("{POD_GATEWAY}/{POD_PREFIX_LEN}"),
        "dev",
        BRIDGE,
    ])?;
    add_ipv6(node, POD_GATEWAY_V6, POD_PREFIX_LEN_V6, BRIDGE)?;
    node.ip(&["link", "set", BRIDGE, "up"])?;
    // Pod-to-Service traffic between pods on this bridge is only DNATed if bridged
    // frames pass through iptables (ip6tables for IPv6).
    for key in [BRIDGE_NF_CALL_IPTABLES, BRIDGE_NF_CALL_IP6TABLES] {
        if !node.has_sysctl(key) {
            return Err(Error::NoBridgeNetfilter {
                netns: node.name().to_owned(),
                path: format!("/proc/sys/{}", key.replace('.', "/")),
            });
        }
        node.set_sysctl(key, "1")?;
    }
    Ok(())
}

/// The client link: `eth0` on both sides, the client's default route via the node.
fn wire_client(node: &Netns, client: &Netns) -> Result<()> {
    node.ip(&[
        "link",
        "add",
        NODE_IFACE,
        "type",
        "veth",
        "peer",
        "name",
        CLIENT_IFACE,
        "netns",
        client.name(),
    ])?;
    node.ip(&[
        "addr",
        "add",
        &format!("{NODE_IP}/{NODE_LINK_PREFIX_LEN}"),
        "dev",
        NODE_IFACE,
    ])?;
    add_ipv6(node, NODE_IP_V6, NODE_LINK_PREFIX_LEN_V6, NODE_IFACE)?;
    node.ip(&["link", "set", NODE_IFACE, "up"])?;
    client.ip(&[
        "addr",
        "add",
        &format!("{CLIENT_IP}/{NODE_LINK_PREFIX_LEN}"),
        "dev",
        CLIENT_IFACE,
    ])?;
    add_ipv6(client, CLIENT_IP_V6, NODE_LINK_PREFIX_LEN_V6, CLIENT_IFACE)?;
    client.ip(&["link", "set", CLIENT_IFACE, "up"])?;
    client.ip(&["route", "add", "default", "via", &NODE_IP.to_string()])?;
    client.ip(&["-6", "route", "add", "default", "via", &NODE_IP_V6.to_string()])?;
    Ok(())
}

/// Pod `index`: `eth0` with its IP, the node-side end on the bridge in hairpin mode (so a
/// pod reaches itself through a Service VIP), default route via the bridge.
fn wire_pod(node: &Netns, pod: &Netns, index: usize) -> Result<()> {
    let port = pod_port_name(index);
    node.ip(&[
        "link",
        "add",
        &port,
        "type",
        "veth",
        "peer",
        "name",
        POD_IFACE,
        "netns",
        pod.name(),
    ])?;
    node.ip(&["link", "set", &port, "master", BRIDGE])?;
    node.ip(&["link", "set", &port, "type", "bridge_slave", "hairpin", "on"])?;
    node.ip(&["link", "set", &port, "up"])?;
    pod.ip(&[
        "addr",
        "add",
        &format!("{}/{POD_PREFIX_LEN}", pod_ip(index)),
        "dev",
        POD_IFACE,
    ])?;
    add_ipv6(pod, pod_ip_v6(index), POD_PREFIX_LEN_V6, POD_IFACE)?;
    pod.ip(&["link", "set", POD_IFACE, "up"])?;
    pod.ip(&["route", "add", "default", "via", &POD_GATEWAY.to_string()])?;
    pod.ip(&[
        "-6",
        "route",
        "add",
        "default",
        "via",
        &POD_GATEWAY_V6.to_string(),
    ])?;
    Ok(())
}

#[cfg(test)]
mod tests;
