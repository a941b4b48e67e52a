//! `kube-ipvs0`: the link upstream's IPVS mode creates (a dummy) and binds every service
//! address to, so the node accepts traffic for them. Found by name; removed whatever its
//! type, as upstream removes it; its addresses tell which IPVS services are upstream's.
//! Links are read and deleted through rtnetlink (netlink-packet-route).

use std::net::IpAddr;

use kpr_netlink::{Answer, Channel, ENODEV, NETLINK_ROUTE, NetlinkError};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkDeserializable, NetlinkHeader, NetlinkMessage,
    NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};

use crate::{LeftoverError, Report};

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

/// `kube-ipvs0` with its addresses, or `None` when there is no such link.
pub fn find_ipvs_link() -> Result<Option<IpvsLink>, NetlinkError> {
    let mut channel = Channel::open(NETLINK_ROUTE)?;
    let answers = match channel.request(|sequence| get_link_request(IPVS_LINK, sequence)) {
        Err(NetlinkError::Kernel { errno: ENODEV }) => return Ok(None),
        other => other?,
    };
    let index = answers
        .iter()
        .find_map(|answer| match parse(answer) {
            Some(RouteNetlinkMessage::NewLink(link)) => Some(link.header.index),
            _ => None,
        })
        .ok_or_else(|| NetlinkError::Malformed(format!("no link message in the answer for {IPVS_LINK}")))?;
    let dump = channel.request(address_dump_request)?;
    Ok(Some(IpvsLink {
        index,
        addresses: addresses_of(index, &dump),
    }))
}

/// Deletes `kube-ipvs0` (by the index it was found with, so a link of another name that
/// took the index meanwhile cannot be hit: the kernel reuses indexes only much later).
pub(crate) fn remove(link: &IpvsLink, report: &mut Report) {
    let object = format!("link {IPVS_LINK}");
    let result = Channel::open(NETLINK_ROUTE)
        .and_then(|mut channel| channel.request(|sequence| delete_link_request(link.index, sequence)));
    match result {
        Ok(_) => report.removed(object),
        Err(NetlinkError::Kernel { errno: ENODEV }) => {}
        Err(error) => report.failed(LeftoverError::netlink(object, &error)),
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
