//! IPVS objects as values: what a virtual service and a real server are to the kernel,
//! without the wire format.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// The transport protocol of a virtual service (IP protocol numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub fn number(self) -> u16 {
        match self {
            Self::Tcp => 6,
            Self::Udp => 17,
            Self::Sctp => 132,
        }
    }

    pub fn from_number(number: u16) -> Option<Self> {
        match number {
            6 => Some(Self::Tcp),
            17 => Some(Self::Udp),
            132 => Some(Self::Sctp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        })
    }
}

/// What identifies an address-based virtual service (firewall-mark services have no
/// address; kube-proxy never makes them and reads them as foreign).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    pub protocol: Protocol,
    pub address: IpAddr,
    pub port: u16,
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}",
            self.protocol,
            SocketAddr::new(self.address, self.port)
        )
    }
}

/// `IP_VS_SVC_F_PERSISTENT`: ClientIP affinity ("persistence").
pub const FLAG_PERSISTENT: u32 = 0x1;
/// `IP_VS_SVC_F_HASHED`: set by the kernel on every listed service, never by a caller.
pub const FLAG_HASHED: u32 = 0x2;
/// `IP_VS_SVC_F_SCHED2`, for the `mh` scheduler `IP_VS_SVC_F_SCHED_MH_PORT`: hash the
/// source port too (upstream sets it whenever the scheduler is `mh`).
pub const FLAG_MH_PORT: u32 = 0x10;
/// The flags a caller sets; the kernel keeps its own in the others.
pub const CALLER_FLAGS: u32 = !FLAG_HASHED;

/// A virtual service as kube-proxy programs it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Service {
    pub key: ServiceKey,
    /// The scheduler's name (`rr`, `wrr`, `lc`, `sh`, `mh`, ...).
    pub scheduler: Scheduler,
    /// `FLAG_*` bits; [`FLAG_HASHED`] is dropped when read back.
    pub flags: u32,
    /// Persistence timeout in seconds (used with [`FLAG_PERSISTENT`]).
    pub timeout: u32,
    /// The persistence netmask: `0xffffffff` for IPv4, the prefix length 128 for IPv6.
    pub netmask: u32,
}

impl Service {
    /// A service with upstream's defaults: no persistence, a host netmask.
    pub fn new(key: ServiceKey, scheduler: Scheduler) -> Self {
        let netmask = match key.address {
            IpAddr::V4(_) => u32::MAX,
            IpAddr::V6(_) => 128,
        };
        Self {
            key,
            scheduler,
            flags: 0,
            timeout: 0,
            netmask,
        }
    }
}

/// A scheduler name the kernel can take: 1 to 15 bytes of lowercase ASCII letters and
/// digits (`IP_VS_SCHEDNAME_MAXLEN` is 16 with the NUL). Checked on construction, so a name
/// from a flag or a config file cannot put arbitrary bytes into a message.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Scheduler(String);

/// `IP_VS_SCHEDNAME_MAXLEN` without the terminating NUL.
const SCHEDULER_MAX_LEN: usize = 15;

impl Scheduler {
    pub fn new(name: &str) -> Result<Self, String> {
        let valid = !name.is_empty()
            && name.len() <= SCHEDULER_MAX_LEN
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if valid {
            Ok(Self(name.to_owned()))
        } else {
            Err(format!(
                "IPVS scheduler {name:?}: must be 1 to {SCHEDULER_MAX_LEN} lowercase letters or digits"
            ))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A real server of a virtual service. kube-proxy forwards by masquerading (NAT), as
/// upstream's ipvs mode does; the connection counts are the kernel's, read back only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Destination {
    pub address: IpAddr,
    pub port: u16,
    pub weight: u32,
    /// Whether the kernel forwards to it by masquerading: always in what a caller writes;
    /// a listed one that does not (direct routing, tunnelling) was set up by someone else.
    pub masquerades: bool,
    /// Connections the kernel counts for this server (0 in what a caller writes).
    pub active_connections: u32,
    pub inactive_connections: u32,
}

impl Destination {
    pub fn new(address: IpAddr, port: u16, weight: u32) -> Self {
        Self {
            address,
            port,
            weight,
            masquerades: true,
            active_connections: 0,
            inactive_connections: 0,
        }
    }

    pub fn socket(&self) -> SocketAddr {
        SocketAddr::new(self.address, self.port)
    }
}

/// IPVS's connection timeouts in seconds (`ipvsadm --set`); 0 leaves one unchanged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timeouts {
    pub tcp: u32,
    pub tcp_fin: u32,
    pub udp: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_names_are_short_lowercase_words() {
        for good in [
            "rr", "wrr", "lc", "wlc", "sh", "mh", "sed", "nq", "fo", "ovf", "lblcr", "twos",
        ] {
            assert_eq!(Scheduler::new(good).unwrap().as_str(), good);
        }
        for bad in [
            "",
            "RR",
            "r r",
            "rr\0",
            "a-b",
            "sixteen_letters_",
            "abcdefghijklmnop",
        ] {
            assert!(Scheduler::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn protocols_round_trip_through_their_numbers() {
        for protocol in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
            assert_eq!(Protocol::from_number(protocol.number()), Some(protocol));
        }
        assert_eq!(Protocol::from_number(1), None);
    }
}
