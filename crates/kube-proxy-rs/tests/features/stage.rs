//! Where a scenario plays: a namespace lab whose pods all serve TCP 8080, kube-proxy-rs in
//! its node in the scenario's mode, on an example's manifests.
//!
//! Every pod answers `"pod<i> from <source it saw>"` whether or not a Service lists it, as
//! a real pod would: whether traffic reaches it is the proxy's decision alone.

use std::net::{IpAddr, Ipv4Addr};

use kpr_netns::{Backend, Lab, pod_ip};

use crate::manifests::Manifests;
use crate::mode::Mode;
use crate::support::Cluster;
use crate::traffic::{Sender, at};

/// The port every pod serves on (the examples' `targetPort`).
pub const POD_PORT: u16 = 8080;

/// A lab with serving pods and a running proxy.
pub struct Stage {
    mode: Mode,
    cluster: Cluster,
    _pods: Vec<Backend>,
}

impl Stage {
    /// Builds a lab with `pods` serving pods, writes `manifests`, starts kube-proxy-rs in
    /// `mode` and waits for its first sync.
    pub fn start(mode: Mode, pods: usize, manifests: &Manifests) -> Self {
        let mut cluster = Cluster::new(pods);
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
        let flags = mode.flags();
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        cluster.start_proxy(&flags);
        Self {
            mode,
            cluster,
            _pods: serving,
        }
    }

    /// Writes the manifests' current state; the proxy picks it up on its own.
    pub fn apply(&self, manifests: &Manifests) {
        self.cluster.write(manifests.file(), &manifests.yaml());
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
