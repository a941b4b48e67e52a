//! Identities: which object, which service port, which protocol and address family.
//!
//! `ServicePortName`'s string form is part of the kernel ABI: chain names are hashes of it,
//! so its `Display` must stay byte-identical to upstream's `ServicePortName.String()`.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

/// `namespace/name` of a namespaced object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespacedName {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

impl NamespacedName {
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The transport protocols a Service port can carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// Parses the API spelling; an absent protocol means TCP, as the API server defaults it.
    pub fn from_api(value: Option<&str>) -> Option<Self> {
        match value {
            None | Some("TCP") => Some(Self::Tcp),
            Some("UDP") => Some(Self::Udp),
            Some("SCTP") => Some(Self::Sctp),
            Some(_) => None,
        }
    }

    /// Lower case, as iptables/nft spell it and as upstream feeds it to chain-name hashes.
    pub fn lower(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
        }
    }

    /// Upper case, as the Kubernetes API spells it.
    pub fn api(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.api())
    }
}

/// IPv4 or IPv6. Each proxier instance serves one family, as upstream's do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub fn of(ip: &IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Self::V4,
            IpAddr::V6(_) => Self::V6,
        }
    }

    pub fn matches(self, ip: &IpAddr) -> bool {
        Self::of(ip) == self
    }

    /// The label value upstream metrics use (`ip_family="IPv4"`).
    pub fn label(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }
}

/// One port of one Service: `namespace/name:portname` plus the protocol.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServicePortName {
    pub service: NamespacedName,
    pub port: Arc<str>,
    pub protocol: Protocol,
}

impl ServicePortName {
    pub fn new(namespace: &str, name: &str, port: &str, protocol: Protocol) -> Self {
        Self {
            service: NamespacedName::new(namespace, name),
            port: port.into(),
            protocol,
        }
    }
}

/// `ns/name:port`, or `ns/name` for an unnamed port; the protocol is not part of it
/// (upstream appends it separately when hashing chain names).
impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port.is_empty() {
            write!(f, "{}", self.service)
        } else {
            write!(f, "{}:{}", self.service, self.port)
        }
    }
}

/// The kinds of object the proxy consumes; used in errors and metric labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    Service,
    EndpointSlice,
    Node,
    /// `networking.k8s.io/v1` ServiceCIDR (cluster-scoped).
    ServiceCidr,
    /// A document in a manifest file that could not even be read as an object.
    Manifest,
}

impl ObjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Service => "Service",
            Self::EndpointSlice => "EndpointSlice",
            Self::Node => "Node",
            Self::ServiceCidr => "ServiceCIDR",
            Self::Manifest => "Manifest",
        }
    }
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_port_name_matches_upstream_string_form() {
        let named = ServicePortName::new("default", "httpbin", "http", Protocol::Tcp);
        assert_eq!(named.to_string(), "default/httpbin:http");
        let unnamed = ServicePortName::new("kube-system", "dns", "", Protocol::Udp);
        assert_eq!(unnamed.to_string(), "kube-system/dns");
    }

    #[test]
    fn protocol_defaults_to_tcp_and_rejects_unknown() {
        assert_eq!(Protocol::from_api(None), Some(Protocol::Tcp));
        assert_eq!(Protocol::from_api(Some("UDP")), Some(Protocol::Udp));
        assert_eq!(Protocol::from_api(Some("udp")), None);
        assert_eq!(Protocol::from_api(Some("ICMP")), None);
    }
}
