//! `kube-ipvs0`: the dummy link the ipvs mode binds every service address to, so the node
//! accepts traffic for them (IPVS sees packets at local input only). Upstream creates it
//! and never sets it up: a down dummy link still makes its addresses local, and answers
//! nothing on the wire. Found by name; removed whatever its type, as upstream removes it;
//! its addresses tell which IPVS services are upstream's. All through rtnetlink
//! (netlink-packet-route messages over kpr-netlink).

use std::net::IpAddr;

use kpr_netlink::{Answer, Channel, ENODEV, NETLINK_ROUTE, NetlinkError};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NetlinkDeserializable, NetlinkHeader,
    NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

/// `EEXIST`: the link or address is already there.
const EEXIST: i32 = 17;
/// `EADDRNOTAVAIL`: the address to remove is not there.
const EADDRNOTAVAIL: i32 = 99;

/// The link upstream's IPVS mode binds service addresses to.
pub const IPVS_LINK: &str = "kube-ipvs0";

/// `kube-ipvs0` as found: its index and addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpvsLink {
    pub index: u32,
    pub addresses: Vec<IpAddr>,
}

fn serialize(flags: u16, sequence: u32, message: RouteNetlinkMessage) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = sequence;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(message));
    packet.finalize();
    let mut bytes = vec![0; packet.buffer_len()];
    packet.serialize(&mut bytes);
    bytes
}

fn parse(answer: &Answer) -> Option<RouteNetlinkMessage> {
    let mut header = NetlinkHeader::default();
    header.message_type = answer.message_type;
    RouteNetlinkMessage::deserialize(&header, answer.payload()).ok()
}

/// `RTM_GETLINK` for the link named `name`.
pub(crate) fn get_link_request(name: &str, sequence: u32) -> Vec<u8> {
    let mut message = LinkMessage::default();
    message.attributes.push(LinkAttribute::IfName(name.to_string()));
    serialize(
        NLM_F_REQUEST | NLM_F_ACK,
        sequence,
        RouteNetlinkMessage::GetLink(message),
    )
}

/// `RTM_DELLINK` for the link with `index`.
pub(crate) fn delete_link_request(index: u32, sequence: u32) -> Vec<u8> {
    let mut message = LinkMessage::default();
    message.header.index = index;
    serialize(
        NLM_F_REQUEST | NLM_F_ACK,
        sequence,
        RouteNetlinkMessage::DelLink(message),
    )
}

/// `RTM_GETADDR` dump of every address.
pub(crate) fn address_dump_request(sequence: u32) -> Vec<u8> {
    serialize(
        NLM_F_REQUEST | NLM_F_DUMP,
        sequence,
        RouteNetlinkMessage::GetAddress(AddressMessage::default()),
    )
}

/// The addresses on link `index` among dumped address messages.
pub(crate) fn addresses_of(index: u32, answers: &[Answer]) -> Vec<IpAddr> {
    let mut addresses = Vec::new();
    for answer in answers {
        let Some(RouteNetlinkMessage::NewAddress(message)) = parse(answer) else {
            continue;
        };
        if message.header.index != index {
            continue;
        }
        for attribute in &message.attributes {
            if let AddressAttribute::Address(ip) = attribute
                && !addresses.contains(ip)
            {
                addresses.push(*ip);
            }
        }
    }
    addresses
}

/// `RTM_NEWLINK` creating a dummy link named `name` (left down, as upstream).
pub(crate) fn create_dummy_request(name: &str, sequence: u32) -> Vec<u8> {
    let mut message = LinkMessage::default();
    message.attributes.push(LinkAttribute::IfName(name.to_string()));
    message
        .attributes
        .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Dummy)]));
    serialize(
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        sequence,
        RouteNetlinkMessage::NewLink(message),
    )
}

/// A host address (`/32` or `/128`) on link `index`, as `RTM_NEWADDR` or `RTM_DELADDR`.
fn host_address(index: u32, ip: IpAddr) -> AddressMessage {
    let mut message = AddressMessage::default();
    message.header.index = index;
    (message.header.family, message.header.prefix_len) = match ip {
        IpAddr::V4(_) => (AddressFamily::Inet, 32),
        IpAddr::V6(_) => (AddressFamily::Inet6, 128),
    };
    message.attributes.push(AddressAttribute::Local(ip));
    message.attributes.push(AddressAttribute::Address(ip));
    message
}

pub(crate) fn add_address_request(index: u32, ip: IpAddr, sequence: u32) -> Vec<u8> {
    serialize(
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        sequence,
        RouteNetlinkMessage::NewAddress(host_address(index, ip)),
    )
}

pub(crate) fn delete_address_request(index: u32, ip: IpAddr, sequence: u32) -> Vec<u8> {
    serialize(
        NLM_F_REQUEST | NLM_F_ACK,
        sequence,
        RouteNetlinkMessage::DelAddress(host_address(index, ip)),
    )
}

/// An rtnetlink socket for `kube-ipvs0` in the calling thread's network namespace.
#[derive(Debug)]
pub struct IpvsLinks {
    channel: Channel,
}

impl IpvsLinks {
    pub fn open() -> Result<Self, NetlinkError> {
        Ok(Self {
            channel: Channel::open(NETLINK_ROUTE)?,
        })
    }

    /// `kube-ipvs0` with its addresses, or `None` when there is no such link.
    pub fn find(&mut self) -> Result<Option<IpvsLink>, NetlinkError> {
        let answers = match self
            .channel
            .request(|sequence| get_link_request(IPVS_LINK, sequence))
        {
            Err(NetlinkError::Kernel { errno: ENODEV }) => return Ok(None),
            other => other?,
        };
        let index = answers
            .iter()
            .find_map(|answer| match parse(answer) {
                Some(RouteNetlinkMessage::NewLink(link)) => Some(link.header.index),
                _ => None,
            })
            .ok_or_else(|| {
                NetlinkError::Malformed(format!("no link message in the answer for {IPVS_LINK}"))
            })?;
        let dump = self.channel.request(address_dump_request)?;
        Ok(Some(IpvsLink {
            index,
            addresses: addresses_of(index, &dump),
        }))
    }

    /// `kube-ipvs0`, created as a dummy link if it is missing.
    pub fn ensure(&mut self) -> Result<IpvsLink, NetlinkError> {
        if let Some(link) = self.find()? {
            return Ok(link);
        }
        match self
            .channel
            .request(|sequence| create_dummy_request(IPVS_LINK, sequence))
        {
            Ok(_) | Err(NetlinkError::Kernel { errno: EEXIST }) => {}
            Err(error) => return Err(error),
        }
        self.find()?.ok_or_else(|| {
            NetlinkError::Malformed(format!("{IPVS_LINK} is missing right after its creation"))
        })
    }

    /// Binds `ip` to the link (already bound is fine).
    pub fn bind(&mut self, link: &IpvsLink, ip: IpAddr) -> Result<(), NetlinkError> {
        match self
            .channel
            .request(|sequence| add_address_request(link.index, ip, sequence))
        {
            Ok(_) | Err(NetlinkError::Kernel { errno: EEXIST }) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Removes `ip` from the link (already gone is fine).
    pub fn unbind(&mut self, link: &IpvsLink, ip: IpAddr) -> Result<(), NetlinkError> {
        match self
            .channel
            .request(|sequence| delete_address_request(link.index, ip, sequence))
        {
            Ok(_) | Err(NetlinkError::Kernel { errno: EADDRNOTAVAIL }) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Deletes the link by the index it was found with (so a link of another name that
    /// took the index meanwhile cannot be hit: the kernel reuses indexes only much later);
    /// `Ok(false)` when it was already gone.
    pub fn delete(&mut self, link: &IpvsLink) -> Result<bool, NetlinkError> {
        match self
            .channel
            .request(|sequence| delete_link_request(link.index, sequence))
        {
            Ok(_) => Ok(true),
            Err(NetlinkError::Kernel { errno: ENODEV }) => Ok(false),
            Err(error) => Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_link_asks_by_name_with_an_acknowledgement() {
        let bytes = get_link_request(IPVS_LINK, 4);
        assert_eq!(u16::from_ne_bytes([bytes[4], bytes[5]]), 18, "RTM_GETLINK");
        assert_eq!(u16::from_ne_bytes([bytes[6], bytes[7]]), 0x5);
        // ifinfomsg (16 bytes, index 0), then IFLA_IFNAME (3) "kube-ipvs0\0".
        assert_eq!(&bytes[20..24], &[0; 4], "no index: asked by name");
        assert_eq!(u16::from_ne_bytes([bytes[34], bytes[35]]), 3);
        assert_eq!(&bytes[36..47], b"kube-ipvs0\0");
    }

    #[test]
    fn delete_names_the_index() {
        let bytes = delete_link_request(42, 1);
        assert_eq!(u16::from_ne_bytes([bytes[4], bytes[5]]), 17, "RTM_DELLINK");
        assert_eq!(
            u32::from_ne_bytes([bytes[20], bytes[21], bytes[22], bytes[23]]),
            42
        );
        assert_eq!(bytes.len(), 32, "nothing but the header and ifinfomsg");
    }

    #[test]
    fn a_new_dummy_link_is_created_exclusively_by_name_and_kind() {
        let bytes = create_dummy_request(IPVS_LINK, 2);
        assert_eq!(u16::from_ne_bytes([bytes[4], bytes[5]]), 16, "RTM_NEWLINK");
        assert_eq!(
            u16::from_ne_bytes([bytes[6], bytes[7]]),
            0x605,
            "request, ack, create, exclusive"
        );
        assert!(bytes.windows(11).any(|w| w == b"kube-ipvs0\0"));
        assert!(bytes.windows(6).any(|w| w == b"dummy\0"));
    }

    #[test]
    fn host_addresses_have_full_prefixes_in_their_family() {
        let v4 = add_address_request(7, "10.96.0.1".parse().unwrap(), 1);
        assert_eq!(u16::from_ne_bytes([v4[4], v4[5]]), 20, "RTM_NEWADDR");
        // ifaddrmsg: family, prefix length, flags, scope, index.
        assert_eq!(&v4[16..18], &[2, 32]);
        assert_eq!(u32::from_ne_bytes([v4[20], v4[21], v4[22], v4[23]]), 7);
        let v6 = delete_address_request(7, "fd00::1".parse().unwrap(), 1);
        assert_eq!(u16::from_ne_bytes([v6[4], v6[5]]), 21, "RTM_DELADDR");
        assert_eq!(&v6[16..18], &[10, 128]);
    }

    fn address_answer(index: u32, ip: IpAddr) -> Answer {
        let mut message = AddressMessage::default();
        message.header.index = index;
        message.attributes.push(AddressAttribute::Address(ip));
        let bytes = serialize(0, 1, RouteNetlinkMessage::NewAddress(message));
        Answer {
            message_type: 20,
            flags: 0,
            bytes,
        }
    }

    #[test]
    fn only_the_links_own_addresses_count() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let answers = [
            address_answer(7, ip("10.96.0.1")),
            address_answer(3, ip("192.168.1.5")),
            address_answer(7, ip("fd00::10")),
            Answer {
                message_type: 20,
                flags: 0,
                bytes: vec![0; 20],
            },
        ];
        assert_eq!(addresses_of(7, &answers), [ip("10.96.0.1"), ip("fd00::10")]);
        assert!(addresses_of(9, &answers).is_empty());
    }
}
