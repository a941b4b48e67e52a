//! The `render` target's structured input: a cluster (Services, EndpointSlices, this
//! node) and iptables options, decoded from raw bytes with `arbitrary`, then spelled as the
//! API objects a source would deliver.
//!
//! Every text field is drawn from a [`Pool`]: mostly good values (valid, at the length
//! limits), so most objects pass validation and the fuzzer spends its time in rendering;
//! sometimes hostile ones (newlines, slashes, quotes, legacy leading-zero IPs, one past a
//! limit); sometimes any string at all. Numbers and addresses likewise; "near" addresses
//! are of the scenario's family and from a small range, so objects share and collide.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use arbitrary::{Arbitrary, Unstructured};
use k8s_openapi::api::core::v1::{
    ClientIPConfig, LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress, NodeSpec, NodeStatus,
    Service, ServicePort, ServiceSpec, ServiceStatus, SessionAffinityConfig, Taint,
};
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForNode, ForZone,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kpr_model::{NamespacedName, SERVICE_NAME_LABEL, ZONE_LABEL};

use crate::pipeline::NODE;

/// A list of values worth trying for one field: good ones (valid, at the limits) that take
/// an object deep into rendering, and hostile ones that must be refused cleanly.
pub struct Pool {
    pub good: &'static [&'static str],
    pub hostile: &'static [&'static str],
}

/// Object names and namespaces.
pub const NAMES: Pool = Pool {
    good: &[
        "web",
        "db",
        "default",
        "kube-system",
        "a",
        "a-b",
        "x1",
        // 63 characters: the longest DNS label.
        "abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefgh",
    ],
    hostile: &[
        "",
        "a.b",
        "a/b",
        "b/c",
        "Web",
        "1abc",
        "evil\n-A KUBE-SERVICES -j ACCEPT\n#",
        "quote\"d",
        "with space",
        "back\\slash",
        "tab\there",
        "nul\0byte",
        "ünïcode",
        // 64 characters: one too many.
        "abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghi",
    ],
};

/// Port names: DNS-1123 labels, as upstream's validateServicePort checks them.
pub const PORT_NAMES: Pool = Pool {
    good: &[
        "http",
        "https",
        "dns",
        "dns-tcp",
        "metrics",
        "p",
        "80",
        "http-metrics-port",
        "abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefgh",
    ],
    hostile: &[
        "",
        "HTTP",
        "a_b",
        "-a",
        "a-",
        "http:80",
        "a b",
        "x\ny",
        "abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghi",
    ],
};

/// Zones, for node labels, endpoints and hints.
pub const ZONES: Pool = Pool {
    good: &["z1", "z2", "zone-a"],
    hostile: &[
        "",
        "z\n1",
        "a-very-long-zone-name-that-goes-on-and-on-and-on-past-sixty-three-chars",
    ],
};

pub const NODES: Pool = Pool {
    good: &[NODE, "node-b"],
    hostile: &["", "Node\nA"],
};

pub const TYPES: Pool = Pool {
    good: &["ClusterIP", "NodePort", "LoadBalancer"],
    hostile: &["ExternalName", "", "nodeport", "Headless"],
};
pub const PROTOCOLS: Pool = Pool {
    good: &["TCP", "UDP", "SCTP"],
    hostile: &["", "tcp", "ICMP"],
};
pub const POLICIES: Pool = Pool {
    good: &["Cluster", "Local"],
    hostile: &["", "local"],
};
pub const AFFINITIES: Pool = Pool {
    good: &["None", "ClientIP"],
    hostile: &["", "clientip"],
};
pub const FAMILIES: Pool = Pool {
    good: &["IPv4", "IPv6"],
    hostile: &["", "ipv4"],
};
pub const FAMILY_POLICIES: Pool = Pool {
    good: &["SingleStack", "PreferDualStack", "RequireDualStack"],
    hostile: &["", "DualStack"],
};
pub const IP_MODES: Pool = Pool {
    good: &["VIP", "Proxy"],
    hostile: &[""],
};

/// Address texts that are not plain addresses.
const ODD_ADDRESSES: &[&str] = &[
    "172.30.0.041",
    "10.180.00.001",
    "010.096.000.010",
    "1.2.3.4/24",
    "None",
    "",
    " 10.0.0.1 ",
    "::ffff:10.0.0.1",
    "fe80::1%eth0",
    "0.0.0.0",
    "255.255.255.255",
    "::",
    "127.0.0.1",
    "10.0.0.1\n-A X",
    "example.com",
];

/// CIDR texts that are not plain CIDRs.
const ODD_CIDRS: &[&str] = &[
    "0.0.0.0/0",
    "::/0",
    " 10.1.0.0/16 ",
    "10.1.0.0/33",
    "10.1.0.1/16",
    "010.001.0.0/16",
    "",
    "not a cidr",
];

const PORTS: &[i32] = &[80, 443, 53, 8080, 9090, 30080, 32767, 30000, 1, 65535];
const ODD_PORTS: &[i32] = &[0, 22, 65536, -1, i32::MAX, i32::MIN];

/// Draws from a byte which kind of value to build: good values almost always, as a Service
/// has a dozen fields and one bad one refuses it whole, so most objects reach the renderer;
/// hostile values and any value at all are a byte flip away for the fuzzer.
fn draw(u: &mut Unstructured<'_>) -> arbitrary::Result<(u8, Kind)> {
    let byte: u8 = u.arbitrary()?;
    let kind = match byte {
        0..240 => Kind::Good,
        240..252 => Kind::Hostile,
        _ => Kind::Raw,
    };
    Ok((byte, kind))
}

enum Kind {
    Good,
    Hostile,
    Raw,
}

/// One text field: a value from a [`Pool`] or any string.
#[derive(Clone, Debug)]
pub enum Pick {
    Good(u8),
    Hostile(u8),
    Raw(String),
}

impl<'a> Arbitrary<'a> for Pick {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match draw(u)? {
            (byte, Kind::Good) => Self::Good(byte),
            (byte, Kind::Hostile) => Self::Hostile(byte),
            (_, Kind::Raw) => Self::Raw(u.arbitrary()?),
        })
    }
}

impl Pick {
    pub fn raw(text: &str) -> Self {
        Self::Raw(text.to_owned())
    }

    pub fn text(&self, pool: &Pool) -> String {
        match self {
            Self::Good(i) => nth(pool.good, *i).to_owned(),
            Self::Hostile(i) => nth(pool.hostile, *i).to_owned(),
            Self::Raw(raw) => raw.clone(),
        }
    }
}

fn nth<T: Copy>(list: &[T], index: u8) -> T {
    list[usize::from(index) % list.len()]
}

/// A port number, timeout or other integer field.
#[derive(Clone, Debug)]
pub enum Number {
    Common(u8),
    Odd(u8),
    Any(i32),
}

impl<'a> Arbitrary<'a> for Number {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match draw(u)? {
            (byte, Kind::Good) => Self::Common(byte),
            (byte, Kind::Hostile) => Self::Odd(byte),
            (_, Kind::Raw) => Self::Any(u.arbitrary()?),
        })
    }
}

impl Number {
    pub fn value(&self) -> i32 {
        match self {
            Self::Common(i) => nth(PORTS, *i),
            Self::Odd(i) => nth(ODD_PORTS, *i),
            Self::Any(n) => *n,
        }
    }
}

/// An IP address field. `Near` addresses are of the scenario's family and from a small
/// range, so objects share and collide.
#[derive(Clone, Debug)]
pub enum Address {
    Near(u8),
    V4([u8; 4]),
    V6([u16; 8]),
    Odd(u8),
    Raw(String),
}

impl<'a> Arbitrary<'a> for Address {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match draw(u)? {
            (_, Kind::Good) => Self::Near(u.arbitrary()?),
            (byte, Kind::Hostile) if byte % 3 == 0 => Self::V4(u.arbitrary()?),
            (byte, Kind::Hostile) if byte % 3 == 1 => Self::V6(u.arbitrary()?),
            (byte, Kind::Hostile) => Self::Odd(byte),
            (_, Kind::Raw) => Self::Raw(u.arbitrary()?),
        })
    }
}

impl Address {
    pub fn raw(text: &str) -> Self {
        Self::Raw(text.to_owned())
    }

    fn text(&self, ipv6: bool) -> String {
        match self {
            Self::Near(n) if ipv6 => format!("fd00::{n:x}"),
            Self::Near(n) => format!("10.0.{}.{}", n / 16, n % 16),
            Self::V4(octets) => Ipv4Addr::from(*octets).to_string(),
            Self::V6(segments) => Ipv6Addr::from(*segments).to_string(),
            Self::Odd(i) => nth(ODD_ADDRESSES, *i).to_owned(),
            Self::Raw(raw) => raw.clone(),
        }
    }
}

/// A CIDR field (`loadBalancerSourceRanges`), like [`Address`].
#[derive(Clone, Debug)]
pub enum Cidr {
    Near(u8),
    V4([u8; 4], u8),
    V6([u16; 8], u8),
    Odd(u8),
    Raw(String),
}

impl<'a> Arbitrary<'a> for Cidr {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match draw(u)? {
            (_, Kind::Good) => Self::Near(u.arbitrary()?),
            (byte, Kind::Hostile) if byte % 3 == 0 => Self::V4(u.arbitrary()?, u.arbitrary()?),
            (byte, Kind::Hostile) if byte % 3 == 1 => Self::V6(u.arbitrary()?, u.arbitrary()?),
            (byte, Kind::Hostile) => Self::Odd(byte),
            (_, Kind::Raw) => Self::Raw(u.arbitrary()?),
        })
    }
}

impl Cidr {
    fn text(&self, ipv6: bool) -> String {
        match self {
            Self::Near(n) if ipv6 => format!("fd00:{n:x}::/{}", 48 + n % 80),
            Self::Near(n) => format!("10.{n}.0.0/{}", 8 + n % 25),
            Self::V4(octets, prefix) => format!("{}/{}", Ipv4Addr::from(*octets), prefix % 34),
            Self::V6(segments, prefix) => format!("{}/{}", Ipv6Addr::from(*segments), prefix % 130),
            Self::Odd(i) => nth(ODD_CIDRS, *i).to_owned(),
            Self::Raw(raw) => raw.clone(),
        }
    }
}

#[derive(Arbitrary, Debug)]
pub struct Scenario {
    pub ipv6: bool,
    pub options: OptionChoices,
    pub node: NodeInput,
    /// What changes before the next sync, if there is one.
    pub then: Option<Change>,
    pub services: Vec<ServiceInput>,
    pub slices: Vec<SliceInput>,
}

/// The next state of the cluster, as edits of the previous one: objects dropped (bit `i` of
/// a mask drops object `i`), then objects added or replaced.
#[derive(Arbitrary, Debug)]
pub struct Change {
    pub drop_services: u64,
    pub drop_slices: u64,
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
    pub bind_address: BindChoice,
    pub tcp_be_liberal: bool,
}

/// `--bind-address`, which can decide the node's primary address.
#[derive(Arbitrary, Debug)]
pub enum BindChoice {
    Unset,
    Any,
    NodeIp,
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
    pub zone: Option<Pick>,
    pub addresses: Vec<Address>,
    pub going_away: bool,
}

#[derive(Arbitrary, Debug)]
pub struct ServiceInput {
    pub namespace: Option<Pick>,
    pub name: Pick,
    pub type_: Option<Pick>,
    pub cluster_ip: Address,
    pub cluster_ips: Option<Vec<Address>>,
    /// At least one: a Service without ports is refused.
    pub ports: (PortInput, Vec<PortInput>),
    pub external_ips: Option<Vec<Address>>,
    pub ingress: Option<Vec<IngressInput>>,
    pub source_ranges: Option<Vec<Cidr>>,
    pub external_policy: Option<Pick>,
    pub internal_policy: Option<Pick>,
    pub affinity: Option<Pick>,
    pub affinity_timeout: Option<Number>,
    pub health_check_node_port: Option<Number>,
    pub ip_families: Option<Vec<Pick>>,
    pub ip_family_policy: Option<Pick>,
}

#[derive(Arbitrary, Debug)]
pub struct PortInput {
    /// Good names are never empty: a Service of several ports needs them all named.
    pub name: Pick,
    pub protocol: Option<Pick>,
    pub port: Number,
    pub node_port: Option<Number>,
    pub target_port: Option<Number>,
}

#[derive(Arbitrary, Debug)]
pub struct IngressInput {
    pub ip: Option<Address>,
    pub hostname: Option<Pick>,
    pub ip_mode: Option<Pick>,
}

#[derive(Arbitrary, Debug)]
pub struct SliceInput {
    pub name: Pick,
    pub service: ServiceRef,
    pub address_type: AddressType,
    pub ports: Option<Vec<SlicePortInput>>,
    /// At least one: slices without endpoints come from Services without slices.
    pub endpoints: (EndpointInput, Vec<EndpointInput>),
}

/// Which Service a slice belongs to: almost always one of the scenario's.
#[derive(Debug)]
pub enum ServiceRef {
    Index(u8),
    Other { namespace: Option<Pick>, name: Pick },
    Unlabelled,
}

impl<'a> Arbitrary<'a> for ServiceRef {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match draw(u)? {
            (byte, Kind::Good) => Self::Index(byte),
            (_, Kind::Hostile) => Self::Other {
                namespace: u.arbitrary()?,
                name: u.arbitrary()?,
            },
            (_, Kind::Raw) => Self::Unlabelled,
        })
    }
}

/// A slice's `addressType`: almost always the scenario's family.
#[derive(Debug)]
pub enum AddressType {
    Matching,
    Other(u8),
    Raw(String),
}

impl<'a> Arbitrary<'a> for AddressType {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match draw(u)? {
            (_, Kind::Good) => Self::Matching,
            (byte, Kind::Hostile) => Self::Other(byte),
            (_, Kind::Raw) => Self::Raw(u.arbitrary()?),
        })
    }
}

impl AddressType {
    fn text(&self, ipv6: bool) -> String {
        match self {
            Self::Matching if ipv6 => "IPv6".to_owned(),
            Self::Matching => "IPv4".to_owned(),
            Self::Other(i) => nth(&["IPv4", "IPv6", "FQDN", "", "ipv4"], *i).to_owned(),
            Self::Raw(raw) => raw.clone(),
        }
    }
}

#[derive(Arbitrary, Debug)]
pub enum SlicePortInput {
    /// Named and typed like port `index` of the owning Service, so endpoints attach to it.
    Like { index: u8, port: Option<Number> },
    Own {
        name: Option<Pick>,
        port: Option<Number>,
        protocol: Option<Pick>,
    },
}

#[derive(Arbitrary, Debug)]
pub struct EndpointInput {
    /// The API requires one address at least; consumers use the first.
    pub addresses: (Address, Vec<Address>),
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
    pub node_name: Option<Pick>,
    pub zone: Option<Pick>,
    pub zone_hints: Option<Vec<Pick>>,
    pub node_hints: Option<Vec<Pick>>,
}

fn texts<T>(list: &Option<Vec<T>>, text: impl Fn(&T) -> String) -> Option<Vec<String>> {
    list.as_ref().map(|items| items.iter().map(text).collect())
}

fn pick(field: &Option<Pick>, pool: &Pool) -> Option<String> {
    field.as_ref().map(|p| p.text(pool))
}

impl ServiceInput {
    /// `namespace/name` as the API would store it (an absent namespace is `default`).
    pub fn id(&self) -> NamespacedName {
        let namespace = pick(&self.namespace, &NAMES).filter(|n| !n.is_empty());
        NamespacedName::new(namespace.as_deref().unwrap_or("default"), &self.name.text(&NAMES))
    }

    pub fn ports(&self) -> impl Iterator<Item = &PortInput> {
        std::iter::once(&self.ports.0).chain(&self.ports.1)
    }

    pub fn to_api(&self, ipv6: bool) -> Service {
        let id = self.id();
        let address = |a: &Address| a.text(ipv6);
        let affinity_config = self.affinity_timeout.as_ref().map(|t| SessionAffinityConfig {
            client_ip: Some(ClientIPConfig {
                timeout_seconds: Some(t.value()),
            }),
        });
        let ingress = self.ingress.as_ref().map(|list| LoadBalancerStatus {
            ingress: Some(list.iter().map(|i| i.to_api(ipv6)).collect()),
        });
        Service {
            metadata: ObjectMeta {
                name: Some(id.name.to_string()),
                namespace: Some(id.namespace.to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                type_: pick(&self.type_, &TYPES),
                cluster_ip: Some(address(&self.cluster_ip)),
                cluster_ips: texts(&self.cluster_ips, address),
                ports: Some(self.ports().map(PortInput::to_api).collect()),
                external_ips: texts(&self.external_ips, address),
                load_balancer_source_ranges: texts(&self.source_ranges, |c| c.text(ipv6)),
                external_traffic_policy: pick(&self.external_policy, &POLICIES),
                internal_traffic_policy: pick(&self.internal_policy, &POLICIES),
                session_affinity: pick(&self.affinity, &AFFINITIES),
                session_affinity_config: affinity_config,
                health_check_node_port: self.health_check_node_port.as_ref().map(Number::value),
                ip_families: texts(&self.ip_families, |f| f.text(&FAMILIES)),
                ip_family_policy: pick(&self.ip_family_policy, &FAMILY_POLICIES),
                ..ServiceSpec::default()
            }),
            status: Some(ServiceStatus {
                load_balancer: ingress,
                ..ServiceStatus::default()
            }),
        }
    }
}

impl PortInput {
    fn to_api(&self) -> ServicePort {
        ServicePort {
            name: Some(self.name.text(&PORT_NAMES)),
            protocol: pick(&self.protocol, &PROTOCOLS),
            port: self.port.value(),
            node_port: self.node_port.as_ref().map(Number::value),
            target_port: self.target_port.as_ref().map(|t| IntOrString::Int(t.value())),
            ..ServicePort::default()
        }
    }
}

impl IngressInput {
    fn to_api(&self, ipv6: bool) -> LoadBalancerIngress {
        LoadBalancerIngress {
            ip: self.ip.as_ref().map(|a| a.text(ipv6)),
            hostname: pick(&self.hostname, &NAMES),
            ip_mode: pick(&self.ip_mode, &IP_MODES),
            ..LoadBalancerIngress::default()
        }
    }
}

impl SliceInput {
    /// The slice's own `namespace/name` (its namespace is its Service's) and the object.
    pub fn to_api(&self, services: &[&ServiceInput], ipv6: bool) -> (NamespacedName, EndpointSlice) {
        let owner = match &self.service {
            ServiceRef::Index(i) if !services.is_empty() => Some(services[usize::from(*i) % services.len()]),
            ServiceRef::Index(_) | ServiceRef::Other { .. } | ServiceRef::Unlabelled => None,
        };
        let owner_id = match &self.service {
            ServiceRef::Other { namespace, name } => {
                let namespace = pick(namespace, &NAMES).unwrap_or_else(|| "default".to_owned());
                Some(NamespacedName::new(&namespace, &name.text(&NAMES)))
            }
            _ => owner.map(|o| o.id()),
        };
        let namespace = owner_id
            .as_ref()
            .map_or_else(|| "default".into(), |o| o.namespace.clone());
        let id = NamespacedName::new(&namespace, &self.name.text(&NAMES));
        let labels = owner_id.map(|o| BTreeMap::from([(SERVICE_NAME_LABEL.to_owned(), o.name.to_string())]));
        let owner_ports: Vec<ServicePort> = owner
            .map(|o| o.ports().map(PortInput::to_api).collect())
            .unwrap_or_default();
        let slice = EndpointSlice {
            metadata: ObjectMeta {
                name: Some(id.name.to_string()),
                namespace: Some(id.namespace.to_string()),
                labels,
                ..ObjectMeta::default()
            },
            address_type: self.address_type.text(ipv6),
            ports: self
                .ports
                .as_ref()
                .map(|ports| ports.iter().map(|p| p.to_api(&owner_ports)).collect()),
            endpoints: Some(
                std::iter::once(&self.endpoints.0)
                    .chain(&self.endpoints.1)
                    .map(|e| e.to_api(ipv6))
                    .collect(),
            ),
        };
        (id, slice)
    }
}

impl SlicePortInput {
    fn to_api(&self, owner_ports: &[ServicePort]) -> EndpointPort {
        match self {
            Self::Like { index, port } => {
                let like = owner_ports.get(usize::from(*index) % owner_ports.len().max(1));
                EndpointPort {
                    name: like.and_then(|p| p.name.clone()),
                    protocol: like.and_then(|p| p.protocol.clone()),
                    port: port.as_ref().map(Number::value).or(like.map(|p| p.port)),
                    ..EndpointPort::default()
                }
            }
            Self::Own { name, port, protocol } => EndpointPort {
                name: pick(name, &PORT_NAMES),
                port: port.as_ref().map(Number::value),
                protocol: pick(protocol, &PROTOCOLS),
                ..EndpointPort::default()
            },
        }
    }
}

impl EndpointInput {
    fn to_api(&self, ipv6: bool) -> Endpoint {
        let conditions = EndpointConditions {
            ready: self.ready,
            serving: self.serving,
            terminating: self.terminating,
        };
        let hints = (self.zone_hints.is_some() || self.node_hints.is_some()).then(|| EndpointHints {
            for_zones: texts(&self.zone_hints, |z| z.text(&ZONES))
                .map(|zones| zones.into_iter().map(|name| ForZone { name }).collect()),
            for_nodes: texts(&self.node_hints, |n| n.text(&NODES))
                .map(|nodes| nodes.into_iter().map(|name| ForNode { name }).collect()),
        });
        Endpoint {
            addresses: std::iter::once(&self.addresses.0)
                .chain(&self.addresses.1)
                .map(|a| a.text(ipv6))
                .collect(),
            conditions: Some(conditions),
            hints,
            node_name: pick(&self.node_name, &NODES),
            zone: pick(&self.zone, &ZONES),
            ..Endpoint::default()
        }
    }
}

impl NodeInput {
    pub fn to_api(&self, ipv6: bool) -> Node {
        let labels = pick(&self.zone, &ZONES).map(|z| BTreeMap::from([(ZONE_LABEL.to_owned(), z)]));
        let addresses = self
            .addresses
            .iter()
            .enumerate()
            .map(|(i, a)| NodeAddress {
                address: a.text(ipv6),
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
