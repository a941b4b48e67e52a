//! The feature gates kube-proxy-rs acts on (`--feature-gates`, `featureGates`).
//!
//! Upstream carries every Kubernetes gate and refuses names it does not know; a drop-in that
//! refused upstream's other gates would fail on configurations written for upstream, so the
//! gates not listed here are accepted and reported once as ignored (a deliberate difference,
//! in docs/configuration.md).

use std::collections::BTreeMap;

/// A gate kube-proxy-rs reads, with upstream's name and default (1.37).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Gate {
    /// ipvs mode may run (deprecated in 1.35; upstream's default turns false in 1.40).
    KubeProxyIPVS,
    /// nftables mode serves NodePorts on the loopback addresses through a userspace TCP
    /// proxy (KEP-6032, alpha in 1.37).
    KubeProxyNFTablesLocalhostNodePorts,
}

impl Gate {
    pub const ALL: [Self; 2] = [Self::KubeProxyIPVS, Self::KubeProxyNFTablesLocalhostNodePorts];

    /// Upstream's name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::KubeProxyIPVS => "KubeProxyIPVS",
            Self::KubeProxyNFTablesLocalhostNodePorts => "KubeProxyNFTablesLocalhostNodePorts",
        }
    }

    /// Upstream's default in 1.37.
    pub const fn default_enabled(self) -> bool {
        match self {
            Self::KubeProxyIPVS => true,
            Self::KubeProxyNFTablesLocalhostNodePorts => false,
        }
    }
}

/// The gates as configured: those set explicitly, the defaults for the rest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeatureGates {
    explicit: BTreeMap<String, bool>,
}

impl FeatureGates {
    /// From the merged `featureGates` (config file, then flags).
    pub fn new(explicit: &BTreeMap<String, bool>) -> Self {
        Self {
            explicit: explicit.clone(),
        }
    }

    pub fn enabled(&self, gate: Gate) -> bool {
        self.explicit
            .get(gate.name())
            .copied()
            .unwrap_or(gate.default_enabled())
    }

    /// The names set that kube-proxy-rs does not act on.
    pub fn ignored(&self) -> impl Iterator<Item = &str> {
        self.explicit
            .keys()
            .map(String::as_str)
            .filter(|name| !Gate::ALL.iter().any(|gate| gate.name() == *name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_upstreams_and_explicit_settings_win() {
        let none = FeatureGates::default();
        assert!(none.enabled(Gate::KubeProxyIPVS));
        assert!(!none.enabled(Gate::KubeProxyNFTablesLocalhostNodePorts));
        let set = FeatureGates::new(&BTreeMap::from([
            ("KubeProxyIPVS".to_string(), false),
            ("KubeProxyNFTablesLocalhostNodePorts".to_string(), true),
            ("SomeUpstreamGate".to_string(), true),
        ]));
        assert!(!set.enabled(Gate::KubeProxyIPVS));
        assert!(set.enabled(Gate::KubeProxyNFTablesLocalhostNodePorts));
        assert_eq!(set.ignored().collect::<Vec<_>>(), ["SomeUpstreamGate"]);
    }
}
