//! Facts about the node this proxy runs on: its name, its IPs and primary IP family, and (for
//! `--detect-local-mode=NodeCIDR`) its pod CIDRs.
//!
//! The name comes from the host or `--hostname-override`. The rest comes from the Node
//! object, as upstream's start-up reads it ([`wait`]: waiting for the Node where upstream
//! waits), and from `--bind-address` (kpr-host's `NodeIps`: upstream's `detectNodeIPs`). The facts are
//! fixed at start-up, as upstream fixes them: the families to run, the detectors and the
//! NodePort addresses are built from them. A change of the node IPs, the Node's deletion,
//! or a change of the pod CIDRs NodeCIDR mode depends on ends the process so the DaemonSet
//! restarts it ([`watch`]), as upstream's NodeManager does.

mod wait;
mod watch;

pub use kpr_host::node_host_ips;
pub use wait::{NODE_IPS_WAIT, NodeWait, POD_CIDRS_WAIT, wait_for_node};
pub use watch::{NodeWatch, forward_events};

/// `--hostname-override`, else the host name, lower-cased as upstream does (Node names are
/// DNS labels, host names need not be).
pub fn node_name(hostname_override: &str) -> Result<String, String> {
    let name = if hostname_override.trim().is_empty() {
        nix::unistd::gethostname()
            .map_err(|e| format!("cannot read the host name: {e}"))?
            .to_string_lossy()
            .into_owned()
    } else {
        hostname_override.trim().to_string()
    };
    if name.is_empty() {
        return Err("the host name is empty; set --hostname-override".to_string());
    }
    Ok(name.to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_wins_and_is_lower_cased() {
        assert_eq!(node_name(" Node-1 ").unwrap(), "node-1");
        assert!(!node_name("").unwrap().is_empty());
    }
}
