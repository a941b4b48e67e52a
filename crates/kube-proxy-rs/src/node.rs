//! Facts about the node this proxy runs on that no Kubernetes object tells us.

use std::net::IpAddr;

use kpr_model::IpFamily;

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

/// Addresses of `family` on this node's interfaces: the candidates `--nodeport-addresses`
/// filters, as upstream uses the interface addresses for it.
pub fn local_addresses(family: IpFamily) -> Vec<IpAddr> {
    let Ok(interfaces) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut addresses: Vec<IpAddr> = interfaces
        .filter_map(|interface| interface.address)
        .filter_map(|address| {
            if let Some(v4) = address.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                address.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .filter(|ip| family.matches(ip))
        .collect();
    addresses.sort();
    addresses.dedup();
    addresses
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_wins_and_is_lower_cased() {
        assert_eq!(node_name(" Node-1 ").unwrap(), "node-1");
        assert!(!node_name("").unwrap().is_empty());
    }

    #[test]
    fn loopback_is_among_local_addresses() {
        let v4 = local_addresses(IpFamily::V4);
        assert!(v4.contains(&"127.0.0.1".parse().unwrap()), "{v4:?}");
        assert!(v4.iter().all(|ip| ip.is_ipv4()));
    }
}
