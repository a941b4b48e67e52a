//! Starting the Service health-check servers of the proxied family, on the addresses
//! upstream picks for them.

use std::sync::Arc;

use kpr_events::Recorder;
use kpr_host::{InterfaceAddresses, LocalAddresses, NodePortAddresses, NodePortTargets};
use kpr_metrics::{Metrics, ProxyHealth};
use kpr_model::IpFamily;
use kpr_servers::{HealthCheckAddresses, HttpLimits, ServiceHealthConfig, ServiceHealthServers};

/// The running set for `family`; it follows the state after each successful sync.
pub fn start(
    family: IpFamily,
    nodeport_addresses: &NodePortAddresses,
    node_name: &str,
    health: Arc<ProxyHealth>,
    metrics: Metrics,
    recorder: Recorder,
) -> Arc<ServiceHealthServers> {
    let config = ServiceHealthConfig {
        family,
        node_name: node_name.to_string(),
        addresses: addresses(nodeport_addresses, family, &InterfaceAddresses),
        limits: HttpLimits::SERVICE_HEALTH,
    };
    Arc::new(ServiceHealthServers::start(config, health, metrics, recorder))
}

/// Upstream's choice, made once at start-up: the node's addresses inside
/// `nodePortAddresses` when that names this family, else every address; if the host's
/// addresses cannot be read, every address too (logged).
fn addresses(
    nodeport_addresses: &NodePortAddresses,
    family: IpFamily,
    host: &dyn LocalAddresses,
) -> HealthCheckAddresses {
    if !nodeport_addresses.needs_local_addresses(family) {
        return HealthCheckAddresses::Any;
    }
    match host.addresses(family) {
        Ok(ips) => match nodeport_addresses.targets(family, &ips) {
            NodePortTargets::AllLocal => HealthCheckAddresses::Any,
            NodePortTargets::Ips(ips) => HealthCheckAddresses::Ips(ips),
        },
        Err(error) => {
            tracing::error!(
                %error,
                "cannot read the node's addresses matching nodePortAddresses; \
                 Service health-check ports will listen on all node addresses"
            );
            HealthCheckAddresses::Any
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use kpr_host::{AddressError, FixedAddresses};

    use super::*;

    /// A host whose addresses cannot be read.
    struct Unreadable;

    impl LocalAddresses for Unreadable {
        fn addresses(&self, _: IpFamily) -> Result<Vec<IpAddr>, AddressError> {
            Err(AddressError {
                source: std::io::Error::other("no netlink"),
            })
        }
    }

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|ip| ip.parse().unwrap()).collect()
    }

    fn cidrs(list: &[&str]) -> NodePortAddresses {
        NodePortAddresses::Cidrs(list.iter().map(|c| c.parse().unwrap()).collect())
    }

    #[test]
    fn node_port_addresses_pick_the_listening_addresses_as_upstream() {
        let host = FixedAddresses(ips(&["192.168.77.1", "10.0.0.5", "127.0.0.1", "fd00::1"]));
        assert_eq!(
            addresses(&NodePortAddresses::All, IpFamily::V4, &host),
            HealthCheckAddresses::Any
        );
        assert_eq!(
            addresses(&cidrs(&["192.168.77.0/24", "127.0.0.0/8"]), IpFamily::V4, &host),
            HealthCheckAddresses::Ips(ips(&["127.0.0.1", "192.168.77.1"]))
        );
        // Only IPv6 CIDRs given: the IPv4 set listens everywhere, as upstream's.
        assert_eq!(
            addresses(&cidrs(&["fd00::/64"]), IpFamily::V4, &host),
            HealthCheckAddresses::Any
        );
        assert_eq!(
            addresses(&cidrs(&["fd00::/64"]), IpFamily::V6, &host),
            HealthCheckAddresses::Ips(ips(&["fd00::1"]))
        );
        // CIDRs that match nothing: nothing listens.
        assert_eq!(
            addresses(&cidrs(&["203.0.113.0/24"]), IpFamily::V4, &host),
            HealthCheckAddresses::Ips(Vec::new())
        );
    }

    #[test]
    fn unreadable_host_addresses_fall_back_to_every_address() {
        assert_eq!(
            addresses(&cidrs(&["192.168.77.0/24"]), IpFamily::V4, &Unreadable),
            HealthCheckAddresses::Any
        );
    }
}
