//! Our nftables table as typed values, from the kernel's dumps or from kpr-nftables'
//! generation (golden tests): the input of [`super::explain`].
//!
//! Set and chain names are parsed back through kpr-nftables' `names` (every possible name
//! is generated there and compared), so this reader cannot drift from the writer. Keys and
//! values are decoded by the layout each set's type gives them (each field padded to 32
//! bits, addresses and ports big-endian, slots host-endian). What does not decode is
//! counted as foreign, never guessed at.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::names::{
    ChainId, Choice, EndpointMap, EntryKind, FixedChain, KeySpace, PROTOCOLS, Refusal, SetName, SharedChain,
};
use crate::{ElemKey, ElemValue, Element, Ruleset};
use ipnet::IpNet;
use kpr_model::{IpFamily, Protocol};
use kpr_nfnetlink::Data;

/// Where an entry sends a packet: decided by the set it is in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Goto(String),
    Drop,
}

/// An entry element: the set it is in (which says where it goes) and the Service port it
/// belongs to, when recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub set: SetName,
    pub service: Option<String>,
}

impl Entry {
    /// What the set's rule does with the packet (`None`: not an entry set).
    pub fn verdict(&self) -> Option<Verdict> {
        match self.set {
            SetName::Entries { target, .. } => Some(Verdict::Goto(target.to_string())),
            SetName::NoEndpoint {
                refusal: Refusal::Reject,
                ..
            } => Some(Verdict::Goto(ChainId::Fixed(FixedChain::RejectChain).to_string())),
            SetName::NoEndpoint {
                refusal: Refusal::Drop,
                ..
            } => Some(Verdict::Drop),
            _ => None,
        }
    }
}

/// An address, protocol and port (the `-ips` entry sets, `no-endpoint-*-ips`, `firewall-ips`).
pub type AddrKey = (IpAddr, Protocol, u16);
/// An endpoint map key without its slot: the entry's address (if keyed by address) and port.
pub type GroupKey = (Option<IpAddr>, u16);

/// One family's table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NftTable {
    pub chains: BTreeSet<String>,
    /// (chain, set) for every set a rule of a fixed chain looks up: an entry set counts
    /// only while its dispatch rule is there.
    pub lookups: BTreeSet<(String, String)>,
    pub service_ips: BTreeMap<AddrKey, Entry>,
    pub service_nodeports: BTreeMap<(Protocol, u16), Entry>,
    pub no_endpoint_services: BTreeMap<AddrKey, Entry>,
    pub no_endpoint_nodeports: BTreeMap<(Protocol, u16), Entry>,
    /// By endpoint map (one per choice: key space, count, affinity), key and slot.
    pub endpoints: BTreeMap<(Choice, GroupKey, u16), SocketAddr>,
    pub cluster_ips: BTreeSet<IpAddr>,
    /// Inclusive address ranges.
    pub service_cidrs: Vec<(IpAddr, IpAddr)>,
    pub nodeport_ips: BTreeSet<IpAddr>,
    pub firewall_ips: BTreeSet<AddrKey>,
    /// Accepted source ranges (inclusive) per load-balancer destination.
    pub firewall_allow: BTreeMap<AddrKey, Vec<(IpAddr, IpAddr)>>,
    pub hairpin: BTreeSet<IpAddr>,
    /// NodePorts whose loopback address is refused (localhost NodePorts on).
    pub localhost_nodeports: BTreeSet<(Protocol, u16)>,
    /// Elements that did not decode as ours (sets we do not write, bad layouts).
    pub foreign_elements: usize,
}

/// Every set name kpr-nftables declares whatever the Services, with any options (the
/// entry sets, one per target chain, are parsed by [`parse_set_name`]).
pub fn all_set_names() -> Vec<SetName> {
    crate::declared_sets(&crate::NftablesOptions {
        localhost_nodeports: crate::LocalhostNodePorts::Rejected,
        ..crate::NftablesOptions::default()
    })
}

fn endpoint_maps() -> impl Iterator<Item = EndpointMap> {
    KeySpace::ALL.into_iter().flat_map(|space| {
        PROTOCOLS
            .into_iter()
            .map(move |proto| EndpointMap { space, proto })
    })
}

pub fn parse_set_name(name: &str) -> Option<SetName> {
    if let Some(set) = all_set_names().into_iter().find(|set| set.to_string() == name) {
        return Some(set);
    }
    // `<map>-<M>[-t<T>]`: an endpoint map (printed back the same way: no leading zeros).
    if let Some(map) = parse_choice(name).map(Choice::endpoints)
        && map.to_string() == name
    {
        return Some(map);
    }
    // `<shared chain>-ips` or `<shared chain>-nodeports`.
    EntryKind::ALL.into_iter().find_map(|kind| {
        let chain = name.strip_suffix(&format!("-{}", kind.suffix()))?;
        let Some(ChainId::Shared(target)) = parse_chain_name(chain) else {
            return None;
        };
        Some(SetName::Entries { kind, target })
    })
}

/// `<map>-<count>[-t<timeout>]`.
fn parse_choice(text: &str) -> Option<Choice> {
    endpoint_maps().find_map(|map| {
        let rest = text.strip_prefix(&format!("{map}-"))?;
        let (count, affinity) = match rest.split_once("-t") {
            Some((count, timeout)) => (count, Some(timeout.parse().ok()?)),
            None => (rest, None),
        };
        Some(Choice {
            map,
            count: count.parse().ok()?,
            affinity,
        })
    })
}

fn parse_optional_choice(text: &str) -> Option<Option<Choice>> {
    if text == "none" {
        Some(None)
    } else {
        parse_choice(text).map(Some)
    }
}

/// A chain name as kpr-nftables writes it; `None` for a name it never writes.
pub fn parse_chain_name(name: &str) -> Option<ChainId> {
    if let Some(fixed) = FixedChain::ALL.into_iter().find(|c| c.as_str() == name) {
        return Some(ChainId::Fixed(fixed));
    }
    let shared = if let Some(rest) = name.strip_prefix("pick-") {
        let choice = parse_choice(rest).filter(|c| c.affinity.is_none())?;
        choice.chain()
    } else if let Some(rest) = name.strip_prefix("sticky-") {
        let choice = parse_choice(rest).filter(|c| c.affinity.is_some())?;
        choice.chain()
    } else if let Some(rest) = name.strip_prefix("slot-") {
        let (choice, slot) = rest.rsplit_once('-')?;
        let choice = parse_choice(choice)?;
        SharedChain::Slot {
            map: choice.map,
            count: choice.count,
            timeout: choice.affinity?,
            slot: slot.parse().ok()?,
        }
    } else if let Some(rest) = name.strip_prefix("masq-") {
        SharedChain::Masquerade {
            choice: parse_choice(rest)?,
        }
    } else if let Some(rest) = name.strip_prefix("local-") {
        let (local, shortcut) = rest.split_once("-via-")?;
        SharedChain::LocalPolicy {
            local: parse_optional_choice(local)?,
            shortcut: parse_optional_choice(shortcut)?,
        }
    } else {
        return None;
    };
    // Only names that print back the same way are ours (no leading zeros, no extras).
    (shared.to_string() == name).then_some(ChainId::Shared(shared))
}

fn range_of(net: IpNet) -> (IpAddr, IpAddr) {
    (net.network(), net.broadcast())
}

impl NftTable {
    /// The table a full sync of `ruleset` writes (golden tests); Service names from the
    /// entry elements' comments, as in the kernel.
    pub fn from_ruleset(ruleset: &Ruleset) -> Self {
        let mut table = Self::default();
        for (fixed, rules) in &ruleset.fixed {
            table.chains.insert(fixed.as_str().to_string());
            for rule in rules {
                for m in &rule.matches {
                    if let crate::Match::Lookup { set, .. } = m {
                        table
                            .lookups
                            .insert((fixed.as_str().to_string(), set.to_string()));
                    }
                }
            }
        }
        for bundle in ruleset.bundles.values() {
            table.chains.extend(bundle.chains.iter().map(ToString::to_string));
            for element in bundle.all_elements() {
                let service = element.comment.as_ref().map(|c| c.as_str().to_string());
                table.add_model_element(&element, service);
            }
        }
        table
    }

    fn add_model_element(&mut self, element: &Element, service: Option<String>) {
        let entry = Entry {
            set: element.set,
            service,
        };
        match (&element.set, &element.key, &element.value) {
            (SetName::Entries { .. } | SetName::NoEndpoint { .. }, ElemKey::AddrProtoPort(a, p, n), _) => {
                self.add_entry(Some(*a), *p, *n, entry);
            }
            (SetName::Entries { .. } | SetName::NoEndpoint { .. }, ElemKey::ProtoPort(p, n), _) => {
                self.add_entry(None, *p, *n, entry);
            }
            (
                SetName::Endpoints(choice),
                ElemKey::AddrPortSlot(a, port, slot),
                Some(ElemValue::Endpoint(ep)),
            ) => {
                self.endpoints.insert((*choice, (Some(*a), *port), *slot), *ep);
            }
            (SetName::Endpoints(choice), ElemKey::PortSlot(port, slot), Some(ElemValue::Endpoint(ep))) => {
                self.endpoints.insert((*choice, (None, *port), *slot), *ep);
            }
            (SetName::ClusterIps, ElemKey::Addr(a), _) => {
                self.cluster_ips.insert(*a);
            }
            (SetName::NodePortIps, ElemKey::Addr(a), _) => {
                self.nodeport_ips.insert(*a);
            }
            (SetName::ServiceCidrs, ElemKey::Net(net), _) => self.service_cidrs.push(range_of(*net)),
            (SetName::FirewallIps, ElemKey::AddrProtoPort(a, p, n), _) => {
                self.firewall_ips.insert((*a, *p, *n));
            }
            (SetName::FirewallAllow, ElemKey::AddrProtoPortNet(a, p, n, net), _) => {
                self.firewall_allow
                    .entry((*a, *p, *n))
                    .or_default()
                    .push(range_of(*net));
            }
            (SetName::Hairpin, ElemKey::AddrPair(a, _), _) => {
                self.hairpin.insert(*a);
            }
            (SetName::LocalhostNodePorts, ElemKey::ProtoPort(p, n), _) => {
                self.localhost_nodeports.insert((*p, *n));
            }
            _ => self.foreign_elements += 1,
        }
    }

    /// Whether a rule of `chain` looks `set` up.
    pub fn looks_up(&self, chain: FixedChain, set: SetName) -> bool {
        self.lookups
            .contains(&(chain.as_str().to_string(), set.to_string()))
    }

    /// Records the set lookups of the kernel's rules (see [`NftTable::lookups`]).
    pub fn with_rules(mut self, rules: &[kpr_nfnetlink::RuleInfo]) -> Self {
        for rule in rules {
            for expr in &rule.exprs {
                if let kpr_nfnetlink::Expr::Lookup { set, .. } = expr {
                    self.lookups.insert((rule.chain.clone(), set.clone()));
                }
            }
        }
        self
    }

    /// Files an entry by its key and set: an entry or its no-endpoint twin, of an address
    /// (`addr`) or of a NodePort.
    fn add_entry(&mut self, addr: Option<IpAddr>, proto: Protocol, port: u16, entry: Entry) {
        let refused = matches!(entry.set, SetName::NoEndpoint { .. });
        match (addr, refused) {
            (Some(a), false) => self.service_ips.insert((a, proto, port), entry),
            (Some(a), true) => self.no_endpoint_services.insert((a, proto, port), entry),
            (None, false) => self.service_nodeports.insert((proto, port), entry),
            (None, true) => self.no_endpoint_nodeports.insert((proto, port), entry),
        };
    }

    /// The table from the kernel's dumps: chain names and each set's elements.
    pub fn from_kernel(
        family: IpFamily,
        chains: impl IntoIterator<Item = String>,
        sets: &[(String, Vec<kpr_nfnetlink::Element>)],
    ) -> Self {
        let mut table = Self {
            chains: chains.into_iter().collect(),
            ..Self::default()
        };
        for (name, elements) in sets {
            let Some(set) = parse_set_name(name) else {
                table.foreign_elements += elements.len();
                continue;
            };
            if set == SetName::ServiceCidrs {
                table.service_cidrs = interval_ranges(family, elements);
                continue;
            }
            for element in elements {
                if table.add_kernel_element(family, set, element).is_none() {
                    table.foreign_elements += 1;
                }
            }
        }
        table
    }

    fn add_kernel_element(
        &mut self,
        family: IpFamily,
        set: SetName,
        element: &kpr_nfnetlink::Element,
    ) -> Option<()> {
        let mut key = Fields::new(family, &element.key);
        let entry = || Entry {
            set,
            service: element_comment(element),
        };
        match set {
            SetName::Entries { kind, .. } | SetName::NoEndpoint { kind, .. } => {
                if element.data.is_some() {
                    return None;
                }
                let addr = match kind {
                    EntryKind::Address => Some(key.addr()?),
                    EntryKind::NodePort => None,
                };
                let (proto, port) = (key.proto()?, key.port()?);
                key.end()?;
                self.add_entry(addr, proto, port, entry());
            }
            SetName::FirewallIps => {
                let k = (key.addr()?, key.proto()?, key.port()?);
                key.end()?;
                self.firewall_ips.insert(k);
            }
            SetName::Endpoints(choice) => {
                let addr = if choice.map.space.keyed_by_address() {
                    Some(key.addr()?)
                } else {
                    None
                };
                let (port, slot) = (key.port()?, key.slot()?);
                key.end()?;
                let Some(Data::Value(value)) = &element.data else {
                    return None;
                };
                let mut value = Fields::new(family, value);
                let endpoint = SocketAddr::new(value.addr()?, value.port()?);
                value.end()?;
                self.endpoints.insert((choice, (addr, port), slot), endpoint);
            }
            SetName::ClusterIps | SetName::NodePortIps => {
                let addr = key.addr()?;
                key.end()?;
                if set == SetName::ClusterIps {
                    self.cluster_ips.insert(addr);
                } else {
                    self.nodeport_ips.insert(addr);
                }
            }
            SetName::FirewallAllow => {
                let k = (key.addr()?, key.proto()?, key.port()?);
                let start = key.addr()?;
                key.end()?;
                let end = match &element.key_end {
                    Some(bytes) => {
                        let mut end = Fields::new(family, bytes);
                        end.addr()?;
                        end.proto()?;
                        end.port()?;
                        end.addr()?
                    }
                    None => start,
                };
                self.firewall_allow.entry(k).or_default().push((start, end));
            }
            SetName::Hairpin => {
                let addr = key.addr()?;
                key.addr()?;
                key.end()?;
                self.hairpin.insert(addr);
            }
            SetName::LocalhostNodePorts => {
                let k = (key.proto()?, key.port()?);
                key.end()?;
                self.localhost_nodeports.insert(k);
            }
            // Dynamic affinity entries are the clients' state, not configuration.
            SetName::Affinity(_) => {}
            SetName::ServiceCidrs => return None,
        }
        Some(())
    }
}

/// The Service port an element's comment names (`comment "ns/svc:port"`), kept as element
/// user data.
fn element_comment(element: &kpr_nfnetlink::Element) -> Option<String> {
    comment_of_userdata(&element.userdata)
}

/// The comment in nft's user data TLVs (type 0: the comment, its length, the text and a
/// NUL); `None` without one, or when it is not text.
pub fn comment_of_userdata(userdata: &[u8]) -> Option<String> {
    let mut rest = userdata;
    while let [kind, len, tail @ ..] = rest {
        let (value, next) = tail.split_at_checked(usize::from(*len))?;
        if *kind == 0 {
            let text = value.strip_suffix(&[0]).unwrap_or(value);
            return std::str::from_utf8(text).ok().map(str::to_string);
        }
        rest = next;
    }
    None
}

/// The ranges of a single-field interval set: each range opens with an element and is
/// closed by the next element flagged as an interval end (holding the first address after
/// it); sorted by address, a start without an end runs to the top of the space.
fn interval_ranges(family: IpFamily, elements: &[kpr_nfnetlink::Element]) -> Vec<(IpAddr, IpAddr)> {
    let mut bounds: Vec<(u128, bool)> = elements
        .iter()
        .filter_map(|e| {
            let addr = Fields::new(family, &e.key).addr()?;
            Some((addr_number(addr), e.interval_end))
        })
        .collect();
    bounds.sort();
    let top = match family {
        IpFamily::V4 => u128::from(u32::MAX),
        IpFamily::V6 => u128::MAX,
    };
    let mut ranges = Vec::new();
    let mut open: Option<u128> = None;
    for (addr, is_end) in bounds {
        match (is_end, open) {
            (false, None) => open = Some(addr),
            (true, Some(start)) if addr > start => {
                ranges.push((number_addr(family, start), number_addr(family, addr - 1)));
                open = None;
            }
            _ => {}
        }
    }
    if let Some(start) = open {
        ranges.push((number_addr(family, start), number_addr(family, top)));
    }
    ranges
}

pub(crate) fn addr_number(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn number_addr(family: IpFamily, n: u128) -> IpAddr {
    match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::from(u32::try_from(n).unwrap_or(u32::MAX))),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::from(n)),
    }
}

/// Reads the fields of a concatenated key or value, each padded to 32 bits.
struct Fields<'a> {
    family: IpFamily,
    bytes: &'a [u8],
}

impl<'a> Fields<'a> {
    fn new(family: IpFamily, bytes: &'a [u8]) -> Self {
        Self { family, bytes }
    }

    fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.bytes.split_at_checked(len)?;
        self.bytes = rest;
        Some(head)
    }

    fn addr(&mut self) -> Option<IpAddr> {
        match self.family {
            IpFamily::V4 => {
                let b: [u8; 4] = self.take(4)?.try_into().ok()?;
                Some(IpAddr::V4(Ipv4Addr::from(b)))
            }
            IpFamily::V6 => {
                let b: [u8; 16] = self.take(16)?.try_into().ok()?;
                Some(IpAddr::V6(Ipv6Addr::from(b)))
            }
        }
    }

    fn proto(&mut self) -> Option<Protocol> {
        let b = self.take(4)?;
        match b.first()? {
            6 => Some(Protocol::Tcp),
            17 => Some(Protocol::Udp),
            132 => Some(Protocol::Sctp),
            _ => None,
        }
    }

    fn port(&mut self) -> Option<u16> {
        let b = self.take(4)?;
        Some(u16::from_be_bytes([*b.first()?, *b.get(1)?]))
    }

    fn slot(&mut self) -> Option<u16> {
        let b: [u8; 4] = self.take(4)?.try_into().ok()?;
        u16::try_from(u32::from_ne_bytes(b)).ok()
    }

    fn end(&self) -> Option<()> {
        self.bytes.is_empty().then_some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpr_nfnetlink::Value;

    #[test]
    fn every_chain_name_parses_back() {
        let map = EndpointMap {
            space: KeySpace::NodePortShortcut,
            proto: Protocol::Udp,
        };
        let pick = Choice {
            map,
            count: 7,
            affinity: None,
        };
        let sticky = Choice {
            affinity: Some(10800),
            ..pick
        };
        let chains = [
            pick.chain(),
            sticky.chain(),
            SharedChain::Slot {
                map,
                count: 7,
                timeout: 60,
                slot: 3,
            },
            SharedChain::Masquerade { choice: sticky },
            SharedChain::LocalPolicy {
                local: None,
                shortcut: Some(pick),
            },
            SharedChain::LocalPolicy {
                local: Some(sticky),
                shortcut: None,
            },
        ];
        for chain in chains {
            assert_eq!(parse_chain_name(&chain.to_string()), Some(ChainId::Shared(chain)));
        }
        for fixed in FixedChain::ALL {
            assert_eq!(parse_chain_name(fixed.as_str()), Some(ChainId::Fixed(fixed)));
        }
        for foreign in [
            "pick-service-endpoints-tcp-03",
            "pick-foo-1",
            "KUBE-SERVICES",
            "pick-service-endpoints-tcp-1-t5",
            "slot-service-endpoints-tcp-2-t60-03",
            "slot-service-endpoints-tcp-2-3",
        ] {
            assert_eq!(parse_chain_name(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn comments_are_read_from_nfts_user_data() {
        let mut tlv = vec![0, 17];
        tlv.extend_from_slice(b"default/web:http\0");
        assert_eq!(comment_of_userdata(&tlv).as_deref(), Some("default/web:http"));
        let mut other_first = vec![1, 2, 9, 9];
        other_first.extend_from_slice(&tlv);
        assert_eq!(
            comment_of_userdata(&other_first).as_deref(),
            Some("default/web:http")
        );
        assert_eq!(comment_of_userdata(&[0, 40, b'x']), None, "truncated");
        assert_eq!(comment_of_userdata(&[]), None);
    }

    #[test]
    fn every_set_name_parses_back() {
        for set in all_set_names() {
            assert_eq!(parse_set_name(&set.to_string()), Some(set));
        }
        let map = EndpointMap {
            space: KeySpace::NodePort,
            proto: Protocol::Udp,
        };
        let target = SharedChain::Masquerade {
            choice: Choice {
                map,
                count: 4,
                affinity: Some(60),
            },
        };
        for kind in EntryKind::ALL {
            let set = SetName::Entries { kind, target };
            assert_eq!(parse_set_name(&set.to_string()), Some(set));
        }
        let SharedChain::Masquerade { choice } = target else {
            unreachable!()
        };
        for map in [
            choice.endpoints(),
            Choice {
                affinity: None,
                ..choice
            }
            .endpoints(),
        ] {
            assert_eq!(parse_set_name(&map.to_string()), Some(map));
        }
        for foreign in [
            "my-set",
            "reject-chain-ips",
            "pick-foo-1-ips",
            "service-ips",
            "service-endpoints-tcp",
            "service-endpoints-tcp-03",
        ] {
            assert_eq!(parse_set_name(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn kernel_elements_decode_by_their_sets_layout() {
        let v4 = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        let entry =
            kpr_nfnetlink::Element::key(Value::new().ipv4(v4("10.96.0.10")).proto(6).port(80).build());
        let endpoint = kpr_nfnetlink::Element::mapping(
            Value::new().ipv4(v4("10.96.0.10")).port(80).host_u32(0).build(),
            Value::new().ipv4(v4("10.244.1.5")).port(8080).build(),
        );
        let cidr_start = kpr_nfnetlink::Element::key(Value::new().ipv4(v4("10.96.0.0")).build());
        let cidr_end = kpr_nfnetlink::Element {
            interval_end: true,
            ..kpr_nfnetlink::Element::key(Value::new().ipv4(v4("10.97.0.0")).build())
        };
        let bad = kpr_nfnetlink::Element::key(vec![1, 2, 3]);
        let table = NftTable::from_kernel(
            IpFamily::V4,
            ["services".to_string()],
            &[
                ("pick-service-endpoints-tcp-1-ips".into(), vec![entry]),
                ("service-endpoints-tcp-1".into(), vec![endpoint]),
                ("service-cidrs".into(), vec![cidr_end, cidr_start]),
                ("cluster-ips".into(), vec![bad]),
                ("somebody-elses".into(), Vec::new()),
            ],
        );
        let key = ("10.96.0.10".parse().unwrap(), Protocol::Tcp, 80);
        assert_eq!(
            table.service_ips[&key].verdict(),
            Some(Verdict::Goto("pick-service-endpoints-tcp-1".into()))
        );
        let map = Choice {
            map: EndpointMap {
                space: KeySpace::Address,
                proto: Protocol::Tcp,
            },
            count: 1,
            affinity: None,
        };
        assert_eq!(
            table.endpoints[&(map, (Some(key.0), 80), 0)],
            "10.244.1.5:8080".parse().unwrap()
        );
        assert_eq!(
            table.service_cidrs,
            vec![("10.96.0.0".parse().unwrap(), "10.96.255.255".parse().unwrap())]
        );
        assert_eq!(table.foreign_elements, 1);
    }
}
