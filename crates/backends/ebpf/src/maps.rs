//! The map layouts of bpf/socket_lb.c, byte for byte, and their conversions.
//!
//! Addresses and ports are byte arrays in network order (as the programs keep them), so no
//! byte-order conversion happens anywhere; an IPv4 address is stored IPv4-mapped
//! (`::ffff:a.b.c.d`), one address space for both families. Counters and ids are in host
//! order, as the programs read them.
#![allow(unsafe_code)] // `aya::Pod` impls only, each with its SAFETY comment.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use kpr_model::{IpFamily, Protocol};

/// Pinned map names (the C variables), also their file names under the pin directory.
pub const SERVICES: &str = "kpr_services";
pub const BACKENDS: &str = "kpr_backends";
pub const AFFINITY: &str = "kpr_affinity";
pub const REVNAT: &str = "kpr_revnat";
pub const ALL_MAPS: [&str; 4] = [SERVICES, BACKENDS, AFFINITY, REVNAT];

/// IP protocol numbers, as the programs compare them.
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;

/// `service_value.flags`: the address is a NodePort, external IP or load-balancer IP (its
/// endpoints are the cluster-wide ones); otherwise it is the cluster IP.
pub const FLAG_EXTERNAL: u32 = 1;

/// An address and port (`struct addr_port`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AddrPort {
    pub addr: [u8; 16],
    pub port: [u8; 2],
    pub pad: u16,
}

/// A Service address (`struct service_key`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    pub addr: [u8; 16],
    pub port: [u8; 2],
    pub proto: u8,
    pub pad: u8,
}

/// What a Service address goes to (`struct service_value`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceValue {
    pub count: u32,
    pub id: u32,
    pub affinity_seconds: u32,
    pub flags: u32,
}

/// One endpoint slot of an endpoint set (`struct backend_key`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BackendKey {
    pub id: u32,
    pub slot: u32,
}

/// `struct affinity_key`: a client (network namespace cookie, and the source address its
/// socket was bound to, zero if none) and an endpoint set.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AffinityKey {
    pub client: u64,
    pub id: u32,
    pub pad: u32,
    pub source: [u8; 16],
}

/// `struct affinity_value`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AffinityValue {
    pub backend: AddrPort,
    pub slot: u32,
    pub last_used_ns: u64,
}

/// `struct revnat_key`: a socket and the endpoint its datagrams went to.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RevnatKey {
    pub cookie: u64,
    pub backend: AddrPort,
    pub pad: u32,
}

const _: () = assert!(size_of::<AddrPort>() == 20);
const _: () = assert!(size_of::<ServiceKey>() == 20);
const _: () = assert!(size_of::<ServiceValue>() == 16);
const _: () = assert!(size_of::<BackendKey>() == 8);
const _: () = assert!(size_of::<AffinityKey>() == 32);
const _: () = assert!(size_of::<AffinityValue>() == 32);
const _: () = assert!(std::mem::offset_of!(AffinityValue, last_used_ns) == 24);
const _: () = assert!(size_of::<RevnatKey>() == 32);
const _: () = assert!(std::mem::offset_of!(RevnatKey, backend) == 8);

// SAFETY (all impls below): each type is `#[repr(C)]`, `Copy + 'static`, made only of
// integers and integer arrays laid out without implicit padding (sizes and offsets asserted
// above, explicit `pad` fields instead), so every byte is initialised and every bit pattern
// is a valid value: aya may copy them to and from the kernel as plain bytes.
// SAFETY: see above.
unsafe impl aya::Pod for AddrPort {}
// SAFETY: see above.
unsafe impl aya::Pod for ServiceKey {}
// SAFETY: see above.
unsafe impl aya::Pod for ServiceValue {}
// SAFETY: see above.
unsafe impl aya::Pod for BackendKey {}
// SAFETY: see above.
unsafe impl aya::Pod for AffinityKey {}
// SAFETY: see above.
unsafe impl aya::Pod for AffinityValue {}
// SAFETY: see above.
unsafe impl aya::Pod for RevnatKey {}

/// The 16 bytes the maps keep for `ip` (IPv4 mapped).
pub fn addr_bytes(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The address the maps' 16 bytes stand for (an IPv4-mapped one as IPv4).
pub fn addr_from(bytes: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(bytes);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// The family of an address as the maps keep it.
pub fn family_of(bytes: [u8; 16]) -> IpFamily {
    IpFamily::of(&addr_from(bytes))
}

impl AddrPort {
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr: addr_bytes(addr.ip()),
            port: addr.port().to_be_bytes(),
            pad: 0,
        }
    }

    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(addr_from(self.addr), u16::from_be_bytes(self.port))
    }
}

impl ServiceKey {
    pub fn new(ip: IpAddr, port: u16, protocol: Protocol) -> Option<Self> {
        Some(Self {
            addr: addr_bytes(ip),
            port: port.to_be_bytes(),
            proto: proto_number(protocol)?,
            pad: 0,
        })
    }

    pub fn ip(&self) -> IpAddr {
        addr_from(self.addr)
    }

    pub fn port(&self) -> u16 {
        u16::from_be_bytes(self.port)
    }

    pub fn family(&self) -> IpFamily {
        family_of(self.addr)
    }

    /// `TCP` or `UDP` (the only protocols the programs translate).
    pub fn protocol(&self) -> Option<Protocol> {
        match self.proto {
            PROTO_TCP => Some(Protocol::Tcp),
            PROTO_UDP => Some(Protocol::Udp),
            _ => None,
        }
    }
}

/// The programs translate TCP and UDP sockets; SCTP is left to the nftables rules.
pub fn proto_number(protocol: Protocol) -> Option<u8> {
    match protocol {
        Protocol::Tcp => Some(PROTO_TCP),
        Protocol::Udp => Some(PROTO_UDP),
        Protocol::Sctp => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_is_kept_mapped_and_read_back_as_ipv4() {
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let bytes = addr_bytes(ip);
        assert_eq!(&bytes[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
        assert_eq!(&bytes[12..], &[10, 0, 0, 1]);
        assert_eq!(addr_from(bytes), ip);
        assert_eq!(family_of(bytes), IpFamily::V4);
        let v6: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(addr_from(addr_bytes(v6)), v6);
    }

    #[test]
    fn ports_are_in_network_order() {
        let key = ServiceKey::new("10.0.0.1".parse().unwrap(), 80, Protocol::Tcp).unwrap();
        assert_eq!(key.port, [0, 80]);
        assert_eq!(key.port(), 80);
        assert!(ServiceKey::new("10.0.0.1".parse().unwrap(), 80, Protocol::Sctp).is_none());
    }
}
