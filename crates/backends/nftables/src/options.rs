//! The knobs of nftables mode, with upstream's defaults.
//!
//! Generation is a pure function of (desired state, options, node facts); everything it
//! needs beyond the desired state is here. The local-traffic detector and
//! `--nodeport-addresses` are the iptables mode's own types, so the binary builds both modes'
//! options from its settings the same way.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use kpr_host::{LocalDetector, NodePortAddresses};
use kpr_model::{IpFamily, Protocol};

/// Upstream's `nftables.masqueradeBit` default: mark 0x4000.
pub const DEFAULT_MASQUERADE_BIT: u8 = 14;
/// Elements per batch in a cold load: a batch this size takes well under 100 ms of kernel
/// time on the measured machines, so the nf_tables mutex is never held long.
pub const DEFAULT_MAX_BATCH_ELEMENTS: usize = 20_000;
/// Capacity of each dynamic affinity set (clients x Services with ClientIP affinity).
pub const DEFAULT_AFFINITY_CAPACITY: u32 = 1 << 20;

/// NodePorts on this family's loopback address (upstream 1.37, KEP-6032: the gate
/// `KubeProxyNFTablesLocalhostNodePorts`): what the table does with a packet to
/// `127.0.0.0/8` (`::1`) at a NodePort. NodePort rules never match loopback destinations
/// (nft cannot DNAT them out of the host as iptables mode does with `route_localnet`), so
/// TCP to them is carried by the localhost proxy ([`crate::LocalhostProxy`]) instead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LocalhostNodePorts {
    /// The gate is off: no rule, set or counter (nothing listens there, so the kernel
    /// refuses TCP and UDP itself), as before 1.37.
    #[default]
    Off,
    /// The gate is on but this family's `nodePortAddresses` names no loopback address: TCP,
    /// UDP and SCTP to a loopback NodePort are counted and rejected.
    Rejected,
    /// The gate is on and this family's `nodePortAddresses` names a loopback address: the
    /// localhost proxy serves TCP; UDP and SCTP are counted and rejected.
    Proxied,
}

impl LocalhostNodePorts {
    /// Upstream's per-family decision: the gate, and an explicit loopback address among
    /// this family's NodePort addresses (`localhost`, `127.0.0.0/8`, `::1/128`; a
    /// catch-all range such as `all` does not count).
    pub fn decide(gate: bool, addresses: &NodePortAddresses, family: IpFamily) -> Self {
        match (gate, addresses.contains_explicit_loopback(family)) {
            (false, _) => Self::Off,
            (true, false) => Self::Rejected,
            (true, true) => Self::Proxied,
        }
    }

    /// The protocols counted and rejected on loopback NodePorts, each with its named
    /// counter ([`crate::names::RejectCounter`]).
    pub fn rejected(self) -> &'static [Protocol] {
        match self {
            Self::Off => &[],
            Self::Rejected => &[Protocol::Tcp, Protocol::Udp, Protocol::Sctp],
            Self::Proxied => &[Protocol::Udp, Protocol::Sctp],
        }
    }

    /// Whether the table has the loopback NodePort set, rules and counters at all.
    pub fn is_on(self) -> bool {
        self != Self::Off
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    #[error("nftables option masqueradeBit: {0} is outside 0-31")]
    MasqueradeBit(u8),
    #[error("nftables option maxBatchElements: must be at least 1")]
    BatchSize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftablesOptions {
    /// The family of this proxier: table `ip kube-proxy` or `ip6 kube-proxy`.
    pub family: IpFamily,
    /// Bit of the packet mark that flags traffic needing SNAT (mark = 1 << bit).
    pub masquerade_bit: u8,
    /// SNAT all traffic sent to cluster IPs (upstream's `--masquerade-all`).
    pub masquerade_all: bool,
    pub local_detector: LocalDetector,
    pub nodeport_addresses: NodePortAddresses,
    /// `--bind-address`, when specific: upstream's first choice for the node's primary IP,
    /// which decides whether load-balancer source ranges admit the node itself.
    pub bind_address: Option<IpAddr>,
    /// `nf_conntrack_tcp_be_liberal` is on: the `ct state invalid drop` rule is left out.
    pub conntrack_tcp_be_liberal: bool,
    /// Fixed Service CIDRs, beside those of the desired state (ServiceCIDR objects): traffic
    /// to an address inside them that no Service holds is dropped.
    pub service_cidrs: Vec<IpNet>,
    /// The most elements one batch of a cold load carries.
    pub max_batch_elements: usize,
    pub affinity_capacity: u32,
    /// NodePorts on the loopback address (the gate `KubeProxyNFTablesLocalhostNodePorts`).
    pub localhost_nodeports: LocalhostNodePorts,
}

impl Default for NftablesOptions {
    fn default() -> Self {
        Self {
            family: IpFamily::V4,
            masquerade_bit: DEFAULT_MASQUERADE_BIT,
            masquerade_all: false,
            local_detector: LocalDetector::None,
            nodeport_addresses: NodePortAddresses::All,
            bind_address: None,
            conntrack_tcp_be_liberal: false,
            service_cidrs: Vec::new(),
            max_batch_elements: DEFAULT_MAX_BATCH_ELEMENTS,
            affinity_capacity: DEFAULT_AFFINITY_CAPACITY,
            localhost_nodeports: LocalhostNodePorts::Off,
        }
    }
}

impl NftablesOptions {
    pub fn validate(&self) -> Result<(), OptionsError> {
        if self.masquerade_bit > 31 {
            return Err(OptionsError::MasqueradeBit(self.masquerade_bit));
        }
        if self.max_batch_elements == 0 {
            return Err(OptionsError::BatchSize);
        }
        Ok(())
    }

    pub fn mark(&self) -> u32 {
        1u32 << self.masquerade_bit.min(31)
    }

    pub fn loopback_net(&self) -> IpNet {
        match self.family {
            IpFamily::V4 => IpNet::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)), 8),
            IpFamily::V6 => IpNet::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 128),
        }
        .unwrap_or_default()
    }

    /// Upstream's node IP for this family: `--bind-address` when specific, else the Node's
    /// first address of the family, else loopback.
    pub fn primary_node_ip(&self, node_addresses: &[IpAddr]) -> IpAddr {
        let family = self.family;
        self.bind_address
            .filter(|ip| !ip.is_unspecified() && family.matches(ip))
            .or_else(|| node_addresses.iter().copied().find(|ip| family.matches(ip)))
            .unwrap_or(match family {
                IpFamily::V4 => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpFamily::V6 => IpAddr::V6(Ipv6Addr::LOCALHOST),
            })
    }

    /// The Service CIDRs of this family.
    pub fn service_cidrs(&self) -> impl Iterator<Item = IpNet> + '_ {
        self.service_cidrs
            .iter()
            .filter(|net| self.family.matches(&net.addr()))
            .map(IpNet::trunc)
    }
}
