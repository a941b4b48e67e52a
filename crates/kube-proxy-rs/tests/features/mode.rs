//! The proxy modes the suite runs in, and what differs between them for a test: the flags
//! that select a mode, and how to show what it programmed when a scenario fails.
//!
//! Everything a scenario asserts is traffic (or, once, the absence of an address from the
//! programmed rules), so the same scenarios hold for every mode.

use kpr_netns::Netns;

/// A proxy mode the suite runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Iptables,
    Nftables,
    /// The proxy process carries the traffic; its portals are iptables rules.
    Userspace,
}

impl Mode {
    /// The mode's name, as `--proxy-mode` and `/proxyMode` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Iptables => "iptables",
            Mode::Nftables => "nftables",
            Mode::Userspace => "userspace",
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
        };
        node.sh(dump)
    }
}
