//! The proxy modes the suite runs in, and what differs between them for a test: the flags
//! that select a mode, and how to show what it programmed when a scenario fails.
//!
//! Everything a scenario asserts is traffic (or, once, the absence of an address from the
//! programmed rules), so the same scenarios hold for every mode. Where a mode plays differs:
//! ipvs mode needs IPVS, which this host's kernel lacks, so its scenarios play inside a
//! throw-away guest booting Debian's kernel (kpr-vm), the same test binary running there.

use std::net::SocketAddr;

use kpr_netns::Netns;

use crate::traffic::Sender;

/// A proxy mode the suite runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Iptables,
    Nftables,
    /// The proxy process carries the traffic; its portals are iptables rules.
    Userspace,
    /// IPVS virtual servers, played inside a guest (see the module docs).
    Ipvs,
}

impl Mode {
    /// The mode's name, as `--proxy-mode` and `/proxyMode` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Iptables => "iptables",
            Mode::Nftables => "nftables",
            Mode::Userspace => "userspace",
            Mode::Ipvs => "ipvs",
        }
    }

    /// The flags that make kube-proxy-rs run in this mode.
    pub fn flags(self) -> Vec<String> {
        vec![format!("--proxy-mode={}", self.name())]
    }

    /// Everything the mode programmed in `node`, as its own tools print it: for a failed
    /// scenario's reader, and for "this address appears in no rule".
    pub fn ruleset(self, node: &Netns) -> kpr_netns::Result<String> {
        let dump = match self {
            Mode::Iptables | Mode::Userspace => "iptables-save",
            // Map elements hold the addresses in this mode, and the listing shows them.
            Mode::Nftables => "nft list ruleset",
            // Virtual servers hold the addresses, the sets their ports; the rules match sets.
            Mode::Ipvs => "ipvsadm -Ln && ipset list && iptables-save",
        };
        node.sh(dump)
    }
}

impl Mode {
    /// Asserts what `sender` sees from `to`, a Service address whose traffic policy leaves
    /// it no endpoint: iptables and nftables modes drop it (upstream's rules do), ipvs mode
    /// refuses it (a virtual server without real servers, as upstream's ipvs mode leaves it).
    #[track_caller]
    pub fn assert_turned_away(self, sender: &Sender<'_>, to: SocketAddr) {
        match self {
            Mode::Ipvs => sender.wait_refused(to),
            _ => sender.assert_dropped(to),
        }
    }
}

/// Plays `scenario` in `mode`: here, or for ipvs mode inside a guest that runs this same
/// test (`module` is the calling test module's `module_path!()`, `name` the test's name).
pub fn play(mode: Mode, module: &str, name: &str, scenario: fn(Mode)) {
    if mode != Mode::Ipvs {
        return scenario(mode);
    }
    // libtest names a test by its path without the crate.
    let (_crate, path) = module.split_once("::").expect("a test module inside the crate");
    kpr_vm::Guest::new()
        .binary(crate::support::proxy_binary())
        .in_guest(&format!("{path}::{name}"), || scenario(mode));
}
