//! How the listeners' sockets are bound, on the real kernel, in a namespace each test
//! creates (its own ports and ephemeral range): the families keep apart, and a port the
//! kernel picks is never one a listener holds. Moved from kpr-userspace's traffic tests
//! with the sockets they test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;

use kpr_netns::Netns;

/// A namespace of the test's own (`lo` is up).
fn namespace() -> Netns {
    Netns::new("relaysk").unwrap()
}

/// Each family's backend has its own listeners: an IPv6 one must not take the IPv4 port of
/// the same number (a dual-stack `[::]` socket would).
#[test]
fn ipv4_and_ipv6_listeners_share_port_numbers() {
    let ns = namespace();
    ns.run(|| {
        let any4 = IpAddr::from([0, 0, 0, 0]);
        let any6 = IpAddr::from([0u16; 8]);
        let (tcp4, port) = kpr_relay::tcp::bind(any4, 0).unwrap();
        let (tcp6, same) = kpr_relay::tcp::bind(any6, port).unwrap();
        assert_eq!(same, port);
        let backlog = || nix::sys::socket::Backlog::new(16).unwrap();
        nix::sys::socket::listen(&tcp4, backlog()).unwrap();
        nix::sys::socket::listen(&tcp6, backlog()).unwrap();
        let (_udp4, port) = kpr_relay::udp::bind(any4, 0).unwrap();
        let (_udp6, same) = kpr_relay::udp::bind(any6, port).unwrap();
        assert_eq!(same, port);
    });
}

/// A port's listeners share it through `SO_REUSEPORT`; the kernel still never picks a port
/// for port 0 that one of them holds, so two service ports never share a listener port.
#[test]
fn kernel_chosen_ports_are_never_shared() {
    let ns = namespace();
    ns.set_sysctl("net.ipv4.ip_local_port_range", "40000 40001")
        .unwrap();
    ns.run(|| {
        let any = IpAddr::from([0, 0, 0, 0]);
        let (_first, a) = kpr_relay::tcp::bind(any, 0).unwrap();
        let (_second, b) = kpr_relay::tcp::bind(any, 0).unwrap();
        assert_ne!(a, b);
        let third = kpr_relay::tcp::bind(any, 0);
        assert!(third.is_err(), "both ports are held: {:?}", third.map(|t| t.1));
    });
}
