//! Where a scenario plays: a namespace lab whose pods all serve TCP 8080, kube-proxy-rs in
//! its node in the scenario's mode, on an example's manifests.
//!
//! Every pod answers `"pod<i> from <source it saw>"` whether or not a Service lists it, as
//! a real pod would: whether traffic reaches it is the proxy's decision alone.

use std::net::{IpAddr, Ipv4Addr};

use kpr_netns::{Backend, Lab, eventually, pod_ip};

use crate::manifests::Manifests;
use crate::mode::Mode;
use crate::support::{CONVERGE, Cluster, POLL};
use crate::traffic::{Sender, at};

/// The port every pod serves on (the examples' `targetPort`).
pub const POD_PORT: u16 = 8080;

/// A lab with serving pods and a running proxy.
pub struct Stage {
    mode: Mode,
    cluster: Cluster,
    /// The proxy's flags, for a restart.
    flags: Vec<String>,
    _pods: Vec<Backend>,
    /// Servers started later ([`Stage::serve_udp`], [`Stage::serve_tcp`]).
    servers: Vec<Backend>,
}

impl Stage {
    /// Builds a lab with `pods` serving pods, writes `manifests`, starts kube-proxy-rs in
    /// `mode` and waits for its first sync.
    pub fn start(mode: Mode, pods: usize, manifests: &Manifests) -> Self {
        Self::start_with(mode, pods, manifests, &[])
    }

    /// [`Stage::start`] with `extra` flags for the proxy.
    pub fn start_with(mode: Mode, pods: usize, manifests: &Manifests, extra: &[&str]) -> Self {
        let mut stage = Self::build(mode, pods, manifests, extra);
        stage.start_proxy();
        stage
    }

    /// [`Stage::start_with`] without starting the proxy: for a scenario that prepares the
    /// node first, then calls [`Stage::start_proxy`].
    pub fn build(mode: Mode, pods: usize, manifests: &Manifests, extra: &[&str]) -> Self {
        let cluster = Cluster::new(pods);
        let serving = (0..pods)
            .map(|i| {
                cluster
                    .lab
                    .pod(i)
                    .tcp_backend_telling_peer(at(pod_ip(i), POD_PORT), &pod_name(i))
                    .unwrap()
            })
            .collect();
        cluster.write(manifests.file(), &manifests.yaml());
        let mut flags = mode.flags();
        flags.extend(extra.iter().map(|flag| (*flag).to_owned()));
        Self {
            mode,
            cluster,
            flags,
            _pods: serving,
            servers: Vec::new(),
        }
    }

    /// Starts kube-proxy-rs and waits for its first sync.
    pub fn start_proxy(&mut self) {
        let flags: Vec<&str> = self.flags.iter().map(String::as_str).collect();
        self.cluster.start_proxy(&flags);
    }

    /// Stops the proxy as a DaemonSet's rollout does (SIGTERM; it must exit 0), starts it
    /// again with the same flags and waits for its first sync.
    pub fn restart_proxy(&mut self) {
        let mut proxy = self.cluster.proxy.take().expect("the proxy runs");
        let status = proxy.stop().unwrap();
        assert_eq!(
            status.code(),
            Some(0),
            "the proxy's exit: {status:?}\n{}",
            proxy.logs()
        );
        self.start_proxy();
    }

    /// Pod `pod` also serves UDP on `port`, answering like its TCP server
    /// (`"pod<i> from <source>"`).
    pub fn serve_udp(&mut self, pod: usize, port: u16) {
        let server = self
            .lab()
            .pod(pod)
            .udp_backend_telling_peer(at(pod_ip(pod), port), &pod_name(pod))
            .unwrap();
        self.servers.push(server);
    }

    /// Pod `pod` also serves TCP on `port`.
    pub fn serve_tcp(&mut self, pod: usize, port: u16) {
        let server = self
            .lab()
            .pod(pod)
            .tcp_backend_telling_peer(at(pod_ip(pod), port), &pod_name(pod))
            .unwrap();
        self.servers.push(server);
    }

    /// Gives pod `pod` `count` more addresses (`10.244.1.200` and up, on its own subnet) and
    /// returns them, so one pod plays several clients ([`Stage::pod_from`]).
    pub fn add_pod_addresses(&self, pod: usize, count: usize) -> Vec<Ipv4Addr> {
        assert!(
            pod < 190 && count <= 50,
            "pod {pod} or {count} addresses collide with pod IPs"
        );
        (0..count)
            .map(|i| {
                let address = Ipv4Addr::new(10, 244, 1, 200 + i as u8);
                self.lab()
                    .pod(pod)
                    .ip(&["addr", "add", &format!("{address}/32"), "dev", "eth0"])
                    .unwrap();
                address
            })
            .collect()
    }

    /// The value of one of the proxy's metric samples (`name{labels}` as exposed).
    pub fn metric(&self, sample: &str) -> Option<f64> {
        self.cluster.metric(sample)
    }

    /// Waits until the proxy's `/healthz` answers `status`.
    pub fn wait_healthz(&self, status: u16) {
        self.cluster.wait_healthz(status);
    }

    /// The proxy's logs so far.
    pub fn proxy_logs(&self) -> String {
        self.cluster.proxy_logs()
    }

    /// Writes the manifests' current state; the proxy picks it up on its own.
    pub fn apply(&self, manifests: &Manifests) {
        self.cluster.write(manifests.file(), &manifests.yaml());
    }

    /// [`Stage::apply`], then waits until the proxy has programmed the change: for a change
    /// that changes no answer (so traffic cannot tell), as the proxy's metrics say it: the
    /// change counted, nothing pending, and a sync finished after the write.
    pub fn apply_and_wait_synced(&self, manifests: &Manifests) {
        const FAMILY: &str = "{ip_family=\"IPv4\"}";
        let metric = |name: &str| self.metric(&format!("kubeproxy_sync_proxy_rules_{name}{FAMILY}"));
        let changes = || {
            metric("endpoint_changes_total").unwrap_or(0.0) + metric("service_changes_total").unwrap_or(0.0)
        };
        let before = changes();
        let written = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        self.apply(manifests);
        eventually(CONVERGE, POLL, || {
            let (counted, last) = (changes(), metric("last_timestamp_seconds").unwrap_or(0.0));
            let pending = metric("endpoint_changes_pending").unwrap_or(0.0)
                + metric("service_changes_pending").unwrap_or(0.0);
            if counted > before && pending == 0.0 && last > written {
                Ok(())
            } else {
                Err(format!(
                    "changes {counted} (before {before}), pending {pending}, last sync {last} (written {written})"
                ))
            }
        });
    }

    pub fn lab(&self) -> &Lab {
        &self.cluster.lab
    }

    /// The outside client, from its own address.
    pub fn client(&self) -> Sender<'_> {
        Sender {
            ns: self.lab().client(),
            source: None,
            label: "the client".to_owned(),
        }
    }

    /// The outside client, from `source` (see [`Stage::add_client_addresses`]).
    pub fn client_from(&self, source: Ipv4Addr) -> Sender<'_> {
        Sender {
            ns: self.lab().client(),
            source: Some(IpAddr::V4(source)),
            label: format!("the client from {source}"),
        }
    }

    /// Gives the outside client `count` more addresses and returns them.
    pub fn add_client_addresses(&self, count: usize) -> Vec<Ipv4Addr> {
        self.lab().add_client_addresses(count).unwrap()
    }

    /// Pod `index`, as a client.
    pub fn pod(&self, index: usize) -> Sender<'_> {
        Sender {
            ns: self.lab().pod(index),
            source: None,
            label: pod_name(index),
        }
    }

    /// Pod `index`, as a client from `source` (see [`Stage::add_pod_addresses`]).
    pub fn pod_from(&self, index: usize, source: Ipv4Addr) -> Sender<'_> {
        Sender {
            ns: self.lab().pod(index),
            source: Some(IpAddr::V4(source)),
            label: format!("{} from {source}", pod_name(index)),
        }
    }

    /// The node itself, as a client (a host-network process).
    pub fn node(&self) -> Sender<'_> {
        Sender {
            ns: self.lab().node(),
            source: None,
            label: "the node".to_owned(),
        }
    }

    /// What the proxy programmed, as the mode's tools print it.
    pub fn ruleset(&self) -> String {
        self.mode.ruleset(self.lab().node()).unwrap()
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        // The proxy's logs follow (its guard prints them); the rules belong next to them.
        if std::thread::panicking() {
            let rules = self
                .mode
                .ruleset(self.lab().node())
                .unwrap_or_else(|err| format!("<cannot show them: {err}>"));
            eprintln!(
                "----- {} rules in the node -----\n{rules}\n----- end of rules -----",
                self.mode.name()
            );
        }
    }
}

/// How pod `index` names itself in replies.
pub fn pod_name(index: usize) -> String {
    format!("pod{index}")
}
