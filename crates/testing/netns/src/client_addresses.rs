//! More addresses for the outside client, so one namespace plays several clients: one inside
//! a Service's `loadBalancerSourceRanges` and one outside, or a dozen clients that session
//! affinity keeps apart. Requests pick their source with the `_from` clients
//! ([`crate::spread_from`], [`Netns::tcp_request_from`](crate::Netns::tcp_request_from)).
//!
//! The addresses extend the [addressing plan](crate::addressing): they sit on the client's
//! link ([`crate::NODE_LINK_SUBNET`]), so the node reaches them without a route, far above
//! [`crate::CLIENT_IP`] and [`crate::NODE_IP`].

use std::net::Ipv4Addr;

use crate::addressing::{CLIENT_IFACE, NODE_LINK_PREFIX_LEN};
use crate::error::Result;
use crate::lab::Lab;

/// Host part of the first extra client address: extra address `i` is `192.168.77.(100 + i)`.
pub const FIRST_EXTRA_CLIENT_HOST: u8 = 100;

/// How many extra client addresses fit on the link after [`FIRST_EXTRA_CLIENT_HOST`].
pub const MAX_EXTRA_CLIENT_ADDRESSES: usize = 254 - FIRST_EXTRA_CLIENT_HOST as usize + 1;

/// Extra client address `index` (0-based): `192.168.77.(100 + index)`.
///
/// # Panics
/// When `index >= MAX_EXTRA_CLIENT_ADDRESSES`.
pub const fn extra_client_ip(index: usize) -> Ipv4Addr {
    assert!(
        index < MAX_EXTRA_CLIENT_ADDRESSES,
        "extra client address index is outside the client's link"
    );
    Ipv4Addr::new(192, 168, 77, FIRST_EXTRA_CLIENT_HOST + index as u8)
}

impl Lab {
    /// Gives the client `count` more addresses on its link ([`extra_client_ip`]`(0..count)`)
    /// and returns them. Replies to them come back like replies to [`crate::CLIENT_IP`].
    ///
    /// # Panics
    /// When `count > MAX_EXTRA_CLIENT_ADDRESSES`.
    pub fn add_client_addresses(&self, count: usize) -> Result<Vec<Ipv4Addr>> {
        let addresses: Vec<Ipv4Addr> = (0..count).map(extra_client_ip).collect();
        for address in &addresses {
            self.client().ip(&[
                "addr",
                "add",
                &format!("{address}/{NODE_LINK_PREFIX_LEN}"),
                "dev",
                CLIENT_IFACE,
            ])?;
        }
        Ok(addresses)
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::net::{IpAddr, SocketAddr};
    use std::time::Duration;

    use super::*;
    use crate::{CLIENT_IP, pod_ip, split_peer_reply, spread_from};

    const TIMEOUT: Duration = Duration::from_secs(5);

    #[test]
    fn extra_addresses_start_at_one_hundred_and_stay_on_the_link() {
        assert_eq!(extra_client_ip(0), Ipv4Addr::new(192, 168, 77, 100));
        assert_eq!(
            extra_client_ip(MAX_EXTRA_CLIENT_ADDRESSES - 1),
            Ipv4Addr::new(192, 168, 77, 254)
        );
    }

    #[test]
    #[should_panic(expected = "outside the client's link")]
    fn an_index_past_the_link_is_refused() {
        let _ = extra_client_ip(MAX_EXTRA_CLIENT_ADDRESSES);
    }

    #[test]
    fn each_source_address_is_the_one_a_pod_sees() {
        let lab = Lab::new(1).unwrap();
        let extra = lab.add_client_addresses(2).unwrap();
        assert_eq!(extra, [extra_client_ip(0), extra_client_ip(1)]);
        let addr = SocketAddr::from((pod_ip(0), 8080));
        let _backend = lab.pod(0).tcp_backend_telling_peer(addr, "pod0").unwrap();
        for source in [CLIENT_IP, extra[0], extra[1]] {
            let reply = lab
                .client()
                .tcp_request_from(source.into(), addr, TIMEOUT)
                .unwrap();
            assert_eq!(split_peer_reply(&reply), Some(("pod0", IpAddr::from(source))));
        }
        let counts = spread_from(lab.client(), extra[1].into(), addr, 3);
        assert_eq!(
            counts.get(&format!("pod0 from {}", extra[1])),
            Some(&3),
            "{counts:?}"
        );
    }

    #[test]
    fn a_source_the_namespace_does_not_have_is_an_error() {
        let lab = Lab::new(1).unwrap();
        let addr = SocketAddr::from((pod_ip(0), 8080));
        let err = lab
            .client()
            .tcp_request_from(extra_client_ip(7).into(), addr, TIMEOUT)
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrNotAvailable, "{err}");
    }
}
