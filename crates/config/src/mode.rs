//! The proxy mode and the local-traffic detection mode, as enums.
//!
//! The file and flags carry them as strings (upstream's `ProxyMode` and `LocalMode` are
//! strings too); the rest of the program should match on enums, never on text.

use std::fmt;

use crate::effective::Section;

/// How Services are programmed into the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProxyMode {
    Iptables,
    Nftables,
    Ipvs,
    /// Removed upstream in 1.26; this project keeps it.
    Userspace,
    /// kube-proxy-rs only: nftables mode plus cgroup socket programs that translate local
    /// connections at `connect()` (kpr-ebpf).
    Ebpf,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModeError {
    #[error(
        "proxy mode \"kernelspace\" is Windows only; on Linux use iptables, nftables, ipvs, userspace or ebpf"
    )]
    WindowsOnly,
    #[error(
        "unknown proxy mode {0:?}: must be iptables, nftables, ipvs, userspace, ebpf or blank (iptables)"
    )]
    UnknownProxyMode(String),
    #[error(
        "unknown detect-local mode {0:?}: must be ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix or blank (ClusterCIDR)"
    )]
    UnknownLocalMode(String),
}

impl ProxyMode {
    /// Every mode. iptables mode comes first because modes after it may write into its
    /// chains (ipvs mode does): whoever removes every mode's leftovers goes from the last to
    /// the first, so a shared chain is no longer referenced when its owner removes it.
    /// ebpf mode comes after nftables mode, whose tables it writes too.
    pub const ALL: [Self; 5] = [
        Self::Iptables,
        Self::Nftables,
        Self::Ipvs,
        Self::Userspace,
        Self::Ebpf,
    ];

    /// Parses upstream's mode string; blank means iptables, as on upstream's Linux build.
    pub fn parse(text: &str) -> Result<Self, ModeError> {
        match text {
            "" | "iptables" => Ok(Self::Iptables),
            "nftables" => Ok(Self::Nftables),
            "ipvs" => Ok(Self::Ipvs),
            "userspace" => Ok(Self::Userspace),
            "ebpf" => Ok(Self::Ebpf),
            "kernelspace" => Err(ModeError::WindowsOnly),
            other => Err(ModeError::UnknownProxyMode(other.to_string())),
        }
    }

    /// The v1alpha1 section holding the mode's sync periods and masquerade settings
    /// (upstream's userspace mode read the iptables one; ipvs mode takes its masquerade
    /// settings from it too, see [`crate::KubeProxyConfiguration::masquerade_bit`]).
    pub(crate) const fn section(self) -> Section {
        match self {
            Self::Iptables | Self::Userspace => Section::Iptables,
            Self::Ipvs => Section::Ipvs,
            Self::Nftables | Self::Ebpf => Section::Nftables,
        }
    }

    /// Upstream's `nodePortAddresses` for the mode when none is given: nftables mode serves
    /// NodePorts on the node's primary IPs only, the others on every local address.
    pub const fn default_node_port_addresses(self) -> Option<&'static str> {
        match self {
            Self::Nftables | Self::Ebpf => Some(crate::NODE_PORT_ADDRESSES_PRIMARY),
            Self::Iptables | Self::Ipvs | Self::Userspace => None,
        }
    }

    /// Upstream's name, as `/proxyMode` reports it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Iptables => "iptables",
            Self::Nftables => "nftables",
            Self::Ipvs => "ipvs",
            Self::Userspace => "userspace",
            Self::Ebpf => "ebpf",
        }
    }
}

impl fmt::Display for ProxyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How traffic from local pods is recognised (upstream's `LocalMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LocalMode {
    ClusterCidr,
    NodeCidr,
    BridgeInterface,
    InterfaceNamePrefix,
}

impl LocalMode {
    /// Parses upstream's name; blank means ClusterCIDR, as on upstream's Linux build.
    pub fn parse(text: &str) -> Result<Self, ModeError> {
        match text {
            "" | "ClusterCIDR" => Ok(Self::ClusterCidr),
            "NodeCIDR" => Ok(Self::NodeCidr),
            "BridgeInterface" => Ok(Self::BridgeInterface),
            "InterfaceNamePrefix" => Ok(Self::InterfaceNamePrefix),
            other => Err(ModeError::UnknownLocalMode(other.to_string())),
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ClusterCidr => "ClusterCIDR",
            Self::NodeCidr => "NodeCIDR",
            Self::BridgeInterface => "BridgeInterface",
            Self::InterfaceNamePrefix => "InterfaceNamePrefix",
        }
    }
}

impl fmt::Display for LocalMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_mode_is_iptables() {
        assert_eq!(ProxyMode::parse("").unwrap(), ProxyMode::Iptables);
        for mode in ProxyMode::ALL {
            assert_eq!(ProxyMode::parse(mode.as_str()).unwrap(), mode);
        }
    }

    /// A mode added to the enum but not to ALL would get no leftovers removed and no
    /// `explain`: the match below stops compiling until the new mode is placed.
    #[test]
    fn all_holds_every_mode_once() {
        let position = |mode: ProxyMode| match mode {
            ProxyMode::Iptables => 0,
            ProxyMode::Nftables => 1,
            ProxyMode::Ipvs => 2,
            ProxyMode::Userspace => 3,
            ProxyMode::Ebpf => 4,
        };
        for (index, mode) in ProxyMode::ALL.into_iter().enumerate() {
            assert_eq!(position(mode), index, "{mode}");
        }
    }

    #[test]
    fn kernelspace_is_windows_only() {
        let err = ProxyMode::parse("kernelspace").unwrap_err();
        assert_eq!(err, ModeError::WindowsOnly);
        assert!(err.to_string().contains("Windows only"));
    }

    #[test]
    fn unknown_mode_is_named() {
        let err = ProxyMode::parse("IPTables").unwrap_err();
        assert!(err.to_string().contains("\"IPTables\""), "{err}");
    }

    #[test]
    fn local_modes_use_upstream_names() {
        assert_eq!(LocalMode::parse("").unwrap(), LocalMode::ClusterCidr);
        for mode in [
            LocalMode::ClusterCidr,
            LocalMode::NodeCidr,
            LocalMode::BridgeInterface,
            LocalMode::InterfaceNamePrefix,
        ] {
            assert_eq!(LocalMode::parse(mode.as_str()).unwrap(), mode);
        }
        assert!(LocalMode::parse("clustercidr").is_err());
    }
}
