//! The `render` target's structured input: a cluster (Services, EndpointSlices, this
//! node) and iptables options, decoded from raw bytes with `arbitrary`, then spelled as the
//! API objects a source would deliver.
//!
//! Every text field is either picked from a short list of telling values (valid names at the
//! length limits, names that once broke things: newlines, slashes, quotes, legacy
//! leading-zero IPs) or taken raw, so the fuzzer reaches deep into rendering quickly and still
//! tries everything. Numbers likewise: common ports and the edges of the ranges, or any `i32`.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use arbitrary::Arbitrary;
use k8s_openapi::api::core::v1::{
    ClientIPConfig, LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress, NodeSpec, NodeStatus, Service,
    ServicePort, ServiceSpec, ServiceStatus, SessionAffinityConfig, Taint,
};
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForNode, ForZone,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kpr_model::{NamespacedName, SERVICE_NAME_LABEL, ZONE_LABEL};

use crate::pipeline::NODE;

/// Object names and namespaces worth trying.
const NAMES: &[&str] = &[
    "web",
    "db",
    "default",
    "kube-system",
    "a",
    "a-b",
    "a.b",
    "a/b",
    "b/c",
    "",
    "Web",
    "1abc",
    "evil\n-A KUBE-SERVICES -j ACCEPT\n#",
    "quote\"d",
    "with space",
    "back\\slash",
    "tab\there",
    "nul\0byte",
    "ünïcode",
    // 63 characters: the longest DNS label.
    "abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefgh",
    // 64 characters: one too many.
    "abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghi",
];

/// Port names worth trying (IANA service names: at most 15 characters, one letter at least).
const PORT_NAMES: &[&str] = &[
    "", "http", "https", "dns", "dns-tcp", "metrics", "p", "abcdefghijklmno", "abcdefghijklmnop", "HTTP",
    "80", "a--b", "http:80", "a b", "x\ny",
];

/// Zones (and node names for hints) worth trying.
const ZONES: &[&str] = &["z1", "z2", "zone-a", "", "z\n1", "a-very-long-zone-name-that-goes-on-and-on"];

/// Address texts worth trying, beyond the generated ones.
const ADDRESSES: &[&str] = &[
    "172.30.0.041",
    "10.180.00.001",
    "010.096.000.010",
    "1.2.3.4/24",
    "None",
    "",
    " 10.0.0.1 ",
    "::ffff:10.0.0.1",
    "fd00::1",
    "fe80::1%eth0",
    "0.0.0.0",
    "255.255.255.255",
    "::",
    "127.0.0.1",
    "10.0.0.1\n-A X",
    "example.com",
];

/// CIDR texts worth trying.
const CIDRS: &[&str] = &[
    "0.0.0.0/0",
    "::/0",
    "10.0.0.0/8",
    "192.168.0.10/32",
    " 10.1.0.0/16 ",
    "10.1.0.0/33",
    "10.1.0.1/16",
    "010.001.0.0/16",
    "fd00::/64",
    "",
    "not a cidr",
];

const PORTS: &[i32] = &[80, 443, 53, 8080, 9090, 30080, 32767, 30000, 22, 1, 65535, 0, 65536, -1];

#[derive(Arbitrary, Debug)]
pub enum Text {
    Known(u8),
    Raw(String),
}

impl Text {
    fn pick(&self, list: &[&str]) -> String {
        match self {
            Self::Known(i) => list[usize::from(*i) % list.len()].to_owned(),
            Self::Raw(raw) => raw.clone(),
        }
    }
}

#[derive(Arbitrary, Debug)]
pub enum Number {
    Common(u8),
    Any(i32),
}

impl Number {
    fn value(&self) -> i32 {
        match self {
            Self::Common(i) => PORTS[usize::from(*i) % PORTS.len()],
            Self::Any(n) => *n,
        }
    }
}

#[derive(Arbitrary, Debug)]
pub enum Address {
    V4([u8; 4]),
    /// In a small range, so several objects share addresses.
    V4Near(u8),
    V6([u16; 8]),
    V6Near(u8),
    Known(u8),
    Raw(String),
}

impl Address {
    fn text(&self) -> String {
        match self {
            Self::V4(octets) => Ipv4Addr::from(*octets).to_string(),
            Self::V4Near(n) => format!("10.0.{}.{}", n / 16, n % 16),
            Self::V6(segments) => Ipv6Addr::from(*segments).to_string(),
            Self::V6Near(n) => format!("fd00::{n:x}"),
            Self::Known(i) => ADDRESSES[usize::from(*i) % ADDRESSES.len()].to_owned(),
            Self::Raw(raw) => raw.clone(),
        }
    }
}

#[derive(Arbitrary, Debug)]
pub enum Cidr {
    V4([u8; 4], u8),
    V6([u16; 8], u8),
    Known(u8),
    Raw(String),
}

impl Cidr {
    fn text(&self) -> String {
        match self {
            Self::V4(octets, prefix) => format!("{}/{}", Ipv4Addr::from(*octets), prefix % 34),
            Self::V6(segments, prefix) => format!("{}/{}", Ipv6Addr::from(*segments), prefix % 130),
            Self::Known(i) => CIDRS[usize::from(*i) % CIDRS.len()].to_owned(),
            Self::Raw(raw) => raw.clone(),
        }
    }
}

/// A field with a few meaningful values, or anything.
#[derive(Arbitrary, Debug)]
pub enum Choice {
    Known(u8),
    Raw(String),
}

impl Choice {
    fn pick(&self, list: &[&str]) -> String {
        match self {
            Self::Known(i) => list[usize::from(*i) % list.len()].to_owned(),
            Self::Raw(raw) => raw.clone(),
        }
    }
}

#[derive(Arbitrary, Debug)]
pub struct Scenario {
    pub ipv6: bool,
    pub options: OptionChoices,
    pub node: NodeInput,
    pub services: Vec<ServiceInput>,
    pub slices: Vec<SliceInput>,
}

#[derive(Arbitrary, Debug)]
pub struct OptionChoices {
    pub masquerade_all: bool,
    pub masquerade_bit: u8,
    pub random_fully: bool,
    pub detector: Detector,
    pub localhost_nodeports: bool,
    pub nodeport_addresses: NodePortChoice,
    pub large_cluster_threshold: Threshold,
}

#[derive(Arbitrary, Debug)]
pub enum Detector {
    None,
    ClusterCidr,
    Bridge,
    InterfacePrefix,
}

#[derive(Arbitrary, Debug)]
pub enum NodePortChoice {
    All,
    /// Only the node's primary address.
    NodeIp,
    Loopback,
    /// A CIDR no node address is in.
    Elsewhere,
}

#[derive(Arbitrary, Debug)]
pub enum Threshold {
    Default,
    Small(u8),
}

#[derive(Arbitrary, Debug)]
pub struct NodeInput {
    pub zone: Option<Text>,
    pub addresses: Vec<Address>,
    pub going_away: bool,
}

#[derive(Arbitrary, Debug)]
pub struct ServiceInput {
    pub namespace: Option<Text>,
    pub name: Text,
    pub type_: Option<Choice>,
    pub cluster_ip: Option<Address>,
    pub cluster_ips: Option<Vec<Address>>,
    pub ports: Vec<PortInput>,
    pub external_ips: Option<Vec<Address>>,
    pub ingress: Option<Vec<IngressInput>>,
    pub source_ranges: Option<Vec<Cidr>>,
    pub external_policy: Option<Choice>,
    pub internal_policy: Option<Choice>,
    pub affinity: Option<Choice>,
    pub affinity_timeout: Option<Number>,
    pub health_check_node_port: Option<Number>,
    pub ip_families: Option<Vec<Choice>>,
    pub ip_family_policy: Option<Choice>,
}

#[derive(Arbitrary, Debug)]
pub struct PortInput {
    pub name: Option<Text>,
    pub protocol: Option<Choice>,
    pub port: Number,
    pub node_port: Option<Number>,
    pub target_port: Option<Number>,
}

#[derive(Arbitrary, Debug)]
pub struct IngressInput {
    pub ip: Option<Address>,
    pub hostname: Option<Text>,
    pub ip_mode: Option<Choice>,
}

#[derive(Arbitrary, Debug)]
pub struct SliceInput {
    pub name: Text,
    pub service: ServiceRef,
    pub address_type: Choice,
    pub ports: Option<Vec<SlicePortInput>>,
    pub endpoints: Vec<EndpointInput>,
}

/// Which Service a slice belongs to: most usefully one of the scenario's.
#[derive(Arbitrary, Debug)]
pub enum ServiceRef {
    Index(u8),
    Other { namespace: Option<Text>, name: Text },
    Unlabelled,
}

#[derive(Arbitrary, Debug)]
pub struct SlicePortInput {
    pub name: Option<Text>,
    pub port: Option<Number>,
    pub protocol: Option<Choice>,
}

#[derive(Arbitrary, Debug)]
pub struct EndpointInput {
    pub addresses: Vec<Address>,
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
    pub local: Option<bool>,
    pub zone: Option<Text>,
    pub zone_hints: Option<Vec<Text>>,
    pub node_hints: Option<Vec<Text>>,
}

const TYPES: &[&str] = &["ClusterIP", "NodePort", "LoadBalancer", "ExternalName", "", "nodeport"];
const PROTOCOLS: &[&str] = &["TCP", "UDP", "SCTP", "", "tcp", "ICMP"];
const POLICIES: &[&str] = &["Cluster", "Local", "", "local"];
const AFFINITIES: &[&str] = &["None", "ClientIP", "", "clientip"];
const FAMILIES: &[&str] = &["IPv4", "IPv6", "", "ipv4"];
const FAMILY_POLICIES: &[&str] = &["SingleStack", "PreferDualStack", "RequireDualStack", ""];
const ADDRESS_TYPES: &[&str] = &["IPv4", "IPv6", "FQDN", ""];
const IP_MODES: &[&str] = &["VIP", "Proxy", ""];

impl ServiceInput {
    /// `namespace/name` as the API would store it (an absent namespace is `default`).
    pub fn id(&self) -> NamespacedName {
        let namespace = self.namespace.as_ref().map(|n| n.pick(NAMES));
        let namespace = namespace.filter(|n| !n.is_empty());
        NamespacedName::new(namespace.as_deref().unwrap_or("default"), &self.name.pick(NAMES))
    }

    pub fn to_api(&self) -> Service {
        let id = self.id();
        let affinity_config = self.affinity_timeout.as_ref().map(|t| SessionAffinityConfig {
            client_ip: Some(ClientIPConfig {
                timeout_seconds: Some(t.value()),
            }),
        });
        let ingress = self.ingress.as_ref().map(|list| LoadBalancerStatus {
            ingress: Some(list.iter().map(IngressInput::to_api).collect()),
        });
        Service {
            metadata: ObjectMeta {
                name: Some(id.name.to_string()),
                namespace: Some(id.namespace.to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                type_: self.type_.as_ref().map(|t| t.pick(TYPES)),
                cluster_ip: self.cluster_ip.as_ref().map(Address::text),
                cluster_ips: texts(&self.cluster_ips, Address::text),
                ports: Some(self.ports.iter().map(PortInput::to_api).collect()),
                external_ips: texts(&self.external_ips, Address::text),
                load_balancer_source_ranges: texts(&self.source_ranges, Cidr::text),
                external_traffic_policy: self.external_policy.as_ref().map(|p| p.pick(POLICIES)),
                internal_traffic_policy: self.internal_policy.as_ref().map(|p| p.pick(POLICIES)),
                session_affinity: self.affinity.as_ref().map(|a| a.pick(AFFINITIES)),
                session_affinity_config: affinity_config,
                health_check_node_port: self.health_check_node_port.as_ref().map(Number::value),
                ip_families: texts(&self.ip_families, |f| f.pick(FAMILIES)),
                ip_family_policy: self.ip_family_policy.as_ref().map(|p| p.pick(FAMILY_POLICIES)),
                ..ServiceSpec::default()
            }),
            status: Some(ServiceStatus {
                load_balancer: ingress,
                ..ServiceStatus::default()
            }),
        }
    }
}

fn texts<T>(list: &Option<Vec<T>>, text: impl Fn(&T) -> String) -> Option<Vec<String>> {
    list.as_ref().map(|items| items.iter().map(text).collect())
}

impl PortInput {
    fn to_api(&self) -> ServicePort {
        ServicePort {
            name: self.name.as_ref().map(|n| n.pick(PORT_NAMES)),
            protocol: self.protocol.as_ref().map(|p| p.pick(PROTOCOLS)),
            port: self.port.value(),
            node_port: self.node_port.as_ref().map(Number::value),
            target_port: self.target_port.as_ref().map(|t| IntOrString::Int(t.value())),
            ..ServicePort::default()
        }
    }
}

impl IngressInput {
    fn to_api(&self) -> LoadBalancerIngress {
        LoadBalancerIngress {
            ip: self.ip.as_ref().map(Address::text),
            hostname: self.hostname.as_ref().map(|h| h.pick(NAMES)),
            ip_mode: self.ip_mode.as_ref().map(|m| m.pick(IP_MODES)),
            ..LoadBalancerIngress::default()
        }
    }
}

impl SliceInput {
    /// The slice's own `namespace/name` (its namespace is its Service's) and the object.
    pub fn to_api(&self, services: &[ServiceInput]) -> (NamespacedName, EndpointSlice) {
        let owner = match &self.service {
            ServiceRef::Index(i) if !services.is_empty() => {
                Some(services[usize::from(*i) % services.len()].id())
            }
            ServiceRef::Index(_) | ServiceRef::Unlabelled => None,
            ServiceRef::Other { namespace, name } => {
                let namespace = namespace.as_ref().map_or_else(|| "default".to_owned(), |n| n.pick(NAMES));
                Some(NamespacedName::new(&namespace, &name.pick(NAMES)))
            }
        };
        let namespace = owner.as_ref().map_or_else(|| "default".into(), |o| o.namespace.clone());
        let id = NamespacedName::new(&namespace, &self.name.pick(NAMES));
        let labels = owner.map(|o| BTreeMap::from([(SERVICE_NAME_LABEL.to_owned(), o.name.to_string())]));
        let slice = EndpointSlice {
            metadata: ObjectMeta {
                name: Some(id.name.to_string()),
                namespace: Some(id.namespace.to_string()),
                labels,
                ..ObjectMeta::default()
            },
            address_type: self.address_type.pick(ADDRESS_TYPES),
            ports: self
                .ports
                .as_ref()
                .map(|ports| ports.iter().map(SlicePortInput::to_api).collect()),
            endpoints: self.endpoints.iter().map(EndpointInput::to_api).collect(),
        };
        (id, slice)
    }
}

impl SlicePortInput {
    fn to_api(&self) -> EndpointPort {
        EndpointPort {
            name: self.name.as_ref().map(|n| n.pick(PORT_NAMES)),
            port: self.port.as_ref().map(Number::value),
            protocol: self.protocol.as_ref().map(|p| p.pick(PROTOCOLS)),
            ..EndpointPort::default()
        }
    }
}

impl EndpointInput {
    fn to_api(&self) -> Endpoint {
        let conditions = EndpointConditions {
            ready: self.ready,
            serving: self.serving,
            terminating: self.terminating,
        };
        let hints = (self.zone_hints.is_some() || self.node_hints.is_some()).then(|| EndpointHints {
            for_zones: texts(&self.zone_hints, |z| z.pick(ZONES))
                .map(|zones| zones.into_iter().map(|name| ForZone { name }).collect()),
            for_nodes: texts(&self.node_hints, |n| n.pick(&[NODE, "node-b", ""]))
                .map(|nodes| nodes.into_iter().map(|name| ForNode { name }).collect()),
        });
        Endpoint {
            addresses: self.addresses.iter().map(Address::text).collect(),
            conditions: Some(conditions),
            hints,
            node_name: self.local.map(|local| if local { NODE } else { "node-b" }.to_owned()),
            zone: self.zone.as_ref().map(|z| z.pick(ZONES)),
            ..Endpoint::default()
        }
    }
}

impl NodeInput {
    pub fn to_api(&self) -> Node {
        let labels = self
            .zone
            .as_ref()
            .map(|z| BTreeMap::from([(ZONE_LABEL.to_owned(), z.pick(ZONES))]));
        let addresses = self
            .addresses
            .iter()
            .enumerate()
            .map(|(i, a)| NodeAddress {
                address: a.text(),
                type_: if i % 2 == 0 { "InternalIP" } else { "ExternalIP" }.to_owned(),
            })
            .collect();
        let taints = self.going_away.then(|| {
            vec![Taint {
                key: kpr_model::TO_BE_DELETED_TAINT.to_owned(),
                effect: "NoSchedule".to_owned(),
                ..Taint::default()
            }]
        });
        Node {
            metadata: ObjectMeta {
                name: Some(NODE.to_owned()),
                labels,
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints,
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(addresses),
                ..NodeStatus::default()
            }),
        }
    }
}

/// The node's primary address of `family`, or a fixed one when it lists none.
pub fn primary_ip(addresses: &[IpAddr], ipv6: bool) -> IpAddr {
    addresses
        .iter()
        .copied()
        .find(|ip| ip.is_ipv6() == ipv6)
        .unwrap_or(if ipv6 {
            IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x10))
        } else {
            IpAddr::V4(Ipv4Addr::new(192, 168, 0, 10))
        })
}
