//! This host's own addresses, read before every sync.
//!
//! Upstream reads the interface addresses on every sync (`GetNodeIPs`) when
//! `--nodeport-addresses` narrows which of them accept NodePorts, so an address added to the
//! node later is served without a restart. Rendering stays pure: the backend reads the
//! addresses through [`LocalAddresses`] and passes them in.

use std::net::IpAddr;

use kpr_model::IpFamily;

#[derive(Debug, thiserror::Error)]
#[error("reading this host's interface addresses: {source}")]
pub struct AddressError {
    #[source]
    pub source: std::io::Error,
}

/// Where the backend learns this host's addresses.
pub trait LocalAddresses: Send {
    /// The addresses of `family` on this host, sorted, without duplicates.
    fn addresses(&self, family: IpFamily) -> Result<Vec<IpAddr>, AddressError>;
}

/// The addresses on the interfaces of the network namespace the calling thread is in.
#[derive(Clone, Copy, Debug, Default)]
pub struct InterfaceAddresses;

impl LocalAddresses for InterfaceAddresses {
    fn addresses(&self, family: IpFamily) -> Result<Vec<IpAddr>, AddressError> {
        let interfaces = nix::ifaddrs::getifaddrs().map_err(|errno| AddressError {
            source: std::io::Error::from(errno),
        })?;
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
        Ok(addresses)
    }
}

/// A fixed list (a node described in a test or a benchmark).
#[derive(Clone, Debug, Default)]
pub struct FixedAddresses(pub Vec<IpAddr>);

impl LocalAddresses for FixedAddresses {
    fn addresses(&self, family: IpFamily) -> Result<Vec<IpAddr>, AddressError> {
        let mut addresses: Vec<IpAddr> = self.0.iter().copied().filter(|ip| family.matches(ip)).collect();
        addresses.sort();
        addresses.dedup();
        Ok(addresses)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_among_the_interface_addresses() {
        let v4 = InterfaceAddresses.addresses(IpFamily::V4).unwrap();
        assert!(v4.contains(&"127.0.0.1".parse().unwrap()), "{v4:?}");
        assert!(v4.iter().all(IpAddr::is_ipv4));
    }

    #[test]
    fn fixed_addresses_keep_the_family() {
        let fixed = FixedAddresses(vec!["fd00::1".parse().unwrap(), "10.0.0.2".parse().unwrap()]);
        assert_eq!(
            fixed.addresses(IpFamily::V4).unwrap(),
            ["10.0.0.2".parse::<IpAddr>().unwrap()]
        );
    }
}
