//! IPVS virtual services of upstream's IPVS mode, through the `IPVS` generic-netlink
//! family.
//!
//! IPVS marks no owner on a service. Upstream's IPVS mode binds every address it serves
//! (cluster, external and load-balancer IPs) to `kube-ipvs0`, so a service whose address
//! sits there is upstream's; that is what is removed. NodePort services on the node's own
//! addresses cannot be told apart from other software's (keepalived, say) and stay; once
//! iptables mode runs they see no traffic, since its NAT rules send NodePort traffic to
//! the pods before IPVS (at local input) would. Services with a firewall mark have no
//! address and are never upstream's.
//!
//! A kernel without `ip_vs` has no `IPVS` family: the controller lookup answers ENOENT,
//! and there is nothing to remove.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kpr_netlink::{Answer, Channel, ENOENT, NETLINK_GENERIC, NetlinkError};
use netlink_packet_core::{
    DefaultNla, Emitable, NLA_F_NESTED, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkDeserializable,
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NlasIterator,
};
use netlink_packet_generic::GenlMessage;
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};

use crate::{LeftoverError, Report};

/// The generic-netlink family name of IPVS.
pub const IPVS_FAMILY: &str = "IPVS";
/// `IPVS_GENL_VERSION`.
const VERSION: u8 = 1;
/// `IPVS_CMD_DEL_SERVICE`, `IPVS_CMD_GET_SERVICE`.
const CMD_DEL_SERVICE: u8 = 3;
const CMD_GET_SERVICE: u8 = 4;
/// `IPVS_CMD_ATTR_SERVICE` (nested).
const CMD_ATTR_SERVICE: u16 = 1;
/// `IPVS_SVC_ATTR_*`.
const SVC_AF: u16 = 1;
const SVC_PROTOCOL: u16 = 2;
const SVC_ADDR: u16 = 3;
const SVC_PORT: u16 = 4;
const SVC_FWMARK: u16 = 5;
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// One address-based IPVS virtual service, as the kernel lists it (firewall-mark
/// services are never upstream's and are not read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VirtualService {
    /// IP protocol number (6 TCP, 17 UDP, 132 SCTP).
    pub protocol: u16,
    pub address: IpAddr,
    pub port: u16,
}

impl std::fmt::Display for VirtualService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let protocol = match self.protocol {
            6 => "TCP".to_string(),
            17 => "UDP".to_string(),
            132 => "SCTP".to_string(),
            other => format!("protocol {other}"),
        };
        write!(
            f,
            "IPVS service {protocol} {}",
            std::net::SocketAddr::new(self.address, self.port)
        )
    }
}

/// The services among `services` that upstream's IPVS mode made: those whose address is
/// one of `kube-ipvs0`'s.
pub fn upstreams_services<'a>(
    services: &'a [VirtualService],
    link_addresses: &[IpAddr],
) -> Vec<&'a VirtualService> {
    services
        .iter()
        .filter(|service| link_addresses.contains(&service.address))
        .collect()
}

fn serialize(message_type: u16, flags: u16, sequence: u32, payload: &[u8]) -> Vec<u8> {
    kpr_netlink::message(message_type, flags, sequence, payload)
}

/// genlmsghdr (command, version, reserved) and `attributes`.
fn genl_payload(command: u8, attributes: &[DefaultNla]) -> Vec<u8> {
    let mut payload = vec![command, VERSION, 0, 0];
    let start = payload.len();
    payload.resize(start + attributes.buffer_len(), 0);
    attributes.emit(&mut payload[start..]);
    payload
}

/// The dump of every virtual service.
pub(crate) fn list_services_request(family_id: u16, sequence: u32) -> Vec<u8> {
    serialize(
        family_id,
        NLM_F_REQUEST | NLM_F_DUMP,
        sequence,
        &genl_payload(CMD_GET_SERVICE, &[]),
    )
}

/// The deletion of one virtual service: family, protocol, address (16 bytes, as the
/// kernel's `nf_inet_addr`), port (big-endian).
pub fn delete_service_request(family_id: u16, service: &VirtualService, sequence: u32) -> Vec<u8> {
    let (af, bytes) = match service.address {
        IpAddr::V4(v4) => {
            let mut bytes = v4.octets().to_vec();
            bytes.resize(16, 0);
            (AF_INET, bytes)
        }
        IpAddr::V6(v6) => (AF_INET6, v6.octets().to_vec()),
    };
    let inner = [
        DefaultNla::new(SVC_AF, af.to_ne_bytes().to_vec()),
        DefaultNla::new(SVC_PROTOCOL, service.protocol.to_ne_bytes().to_vec()),
        DefaultNla::new(SVC_ADDR, bytes),
        DefaultNla::new(SVC_PORT, service.port.to_be_bytes().to_vec()),
    ];
    let mut nested = vec![0; inner.as_slice().buffer_len()];
    inner.as_slice().emit(&mut nested);
    let attribute = DefaultNla::new(CMD_ATTR_SERVICE | NLA_F_NESTED, nested);
    serialize(
        family_id,
        NLM_F_REQUEST | NLM_F_ACK,
        sequence,
        &genl_payload(CMD_DEL_SERVICE, &[attribute]),
    )
}

/// The service in one dumped message's payload (genlmsghdr, then the nested service);
/// `None` for a firewall-mark service.
pub fn parse_service(payload: &[u8]) -> Result<Option<VirtualService>, String> {
    let attributes = payload.get(4..).ok_or("no genlmsghdr")?;
    let mut service_attributes = None;
    for attribute in NlasIterator::new(attributes) {
        let attribute = attribute.map_err(|e| e.to_string())?;
        if attribute.kind() & !NLA_F_NESTED == CMD_ATTR_SERVICE {
            service_attributes = Some(attribute.value().to_vec());
        }
    }
    let nested = service_attributes.ok_or("no IPVS_CMD_ATTR_SERVICE")?;
    let (mut af, mut protocol, mut address, mut port, mut fwmark) = (None, 0, None, 0, 0);
    for attribute in NlasIterator::new(&nested[..]) {
        let attribute = attribute.map_err(|e| e.to_string())?;
        let value = attribute.value();
        match attribute.kind() {
            SVC_AF => af = Some(ne_u16(value)?),
            SVC_PROTOCOL => protocol = ne_u16(value)?,
            SVC_ADDR => address = Some(value.to_vec()),
            SVC_PORT => port = u16::from_be_bytes(array(value)?),
            SVC_FWMARK => fwmark = u32::from_ne_bytes(array(value)?),
            _ => {}
        }
    }
    if fwmark != 0 {
        return Ok(None);
    }
    let address = match (af, address) {
        (Some(AF_INET), Some(bytes)) => IpAddr::V4(Ipv4Addr::from(array::<4>(prefix(&bytes, 4)?)?)),
        (Some(AF_INET6), Some(bytes)) => IpAddr::V6(Ipv6Addr::from(array::<16>(&bytes)?)),
        (af, _) => return Err(format!("address family {af:?} without a usable address")),
    };
    Ok(Some(VirtualService {
        protocol,
        address,
        port,
    }))
}

fn prefix(bytes: &[u8], n: usize) -> Result<&[u8], String> {
    bytes
        .get(..n)
        .ok_or_else(|| format!("{} bytes, {n} needed", bytes.len()))
}

fn array<const N: usize>(value: &[u8]) -> Result<[u8; N], String> {
    value
        .try_into()
        .map_err(|_| format!("{} bytes where {N} belong", value.len()))
}

fn ne_u16(value: &[u8]) -> Result<u16, String> {
    Ok(u16::from_ne_bytes(array(value)?))
}

/// The `CTRL_CMD_GETFAMILY` request for the IPVS family.
pub(crate) fn family_request(sequence: u32) -> Vec<u8> {
    let genl = GenlMessage::from_payload(GenlCtrl {
        cmd: GenlCtrlCmd::GetFamily,
        nlas: vec![GenlCtrlAttrs::FamilyName(IPVS_FAMILY.to_string())],
    });
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_ACK;
    header.sequence_number = sequence;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(genl));
    packet.finalize();
    let mut bytes = vec![0; packet.buffer_len()];
    packet.serialize(&mut bytes);
    bytes
}

fn family_id_of(answers: &[Answer]) -> Option<u16> {
    answers.iter().find_map(|answer| {
        let mut header = NetlinkHeader::default();
        header.message_type = answer.message_type;
        let message = GenlMessage::<GenlCtrl>::deserialize(&header, answer.payload()).ok()?;
        message.payload.nlas.iter().find_map(|attribute| match attribute {
            GenlCtrlAttrs::FamilyId(id) => Some(*id),
            _ => None,
        })
    })
}

/// The IPVS family's id, or `None` when the kernel has no IPVS.
fn family_id(channel: &mut Channel) -> Result<Option<u16>, NetlinkError> {
    match channel.request(family_request) {
        Ok(answers) => family_id_of(&answers)
            .map(Some)
            .ok_or_else(|| NetlinkError::Malformed("no family id for IPVS".to_string())),
        Err(NetlinkError::Kernel { errno: ENOENT }) => Ok(None),
        Err(error) => Err(error),
    }
}

/// Deletes the virtual services at `link_addresses` (`kube-ipvs0`'s).
pub(crate) fn remove_services_on(link_addresses: &[IpAddr], report: &mut Report) {
    let failed = |report: &mut Report, error: &NetlinkError| {
        report.failed(LeftoverError::netlink("IPVS services on kube-ipvs0", error));
    };
    let mut channel = match Channel::open(NETLINK_GENERIC) {
        Ok(channel) => channel,
        Err(error) => return failed(report, &error),
    };
    let id = match family_id(&mut channel) {
        Ok(Some(id)) => id,
        Ok(None) => {
            tracing::debug!("no IPVS in this kernel: no IPVS services to remove");
            return;
        }
        Err(error) => return failed(report, &error),
    };
    let listed = match channel.request(|sequence| list_services_request(id, sequence)) {
        Ok(listed) => listed,
        Err(error) => return failed(report, &error),
    };
    let mut services = Vec::new();
    for answer in &listed {
        match parse_service(answer.payload()) {
            Ok(Some(service)) => services.push(service),
            Ok(None) => {}
            Err(reason) => {
                tracing::warn!(%reason, "unreadable IPVS service in the kernel's list; left alone")
            }
        }
    }
    for service in upstreams_services(&services, link_addresses) {
        let result = channel.request(|sequence| delete_service_request(id, service, sequence));
        match result {
            Ok(_)
            | Err(NetlinkError::Kernel {
                errno: kpr_netlink::ESRCH,
            }) => report.removed(service.to_string()),
            Err(error) => report.failed(LeftoverError::netlink(service.to_string(), &error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn service(address: &str, port: u16) -> VirtualService {
        VirtualService {
            protocol: 6,
            address: ip(address),
            port,
        }
    }

    #[test]
    fn only_services_at_kube_ipvs0_addresses_are_upstreams() {
        let services = [
            service("10.96.0.1", 443),
            service("192.168.1.5", 30080), // a NodePort on the node's address
            service("10.0.0.100", 80),     // keepalived's VIP
            service("fd00::10", 53),
        ];
        let chosen = upstreams_services(&services, &[ip("10.96.0.1"), ip("fd00::10")]);
        assert_eq!(chosen, [&services[0], &services[3]]);
        assert!(upstreams_services(&services, &[]).is_empty());
    }

    /// A delete as ipvsadm -D sends it: nested service with family, protocol, the
    /// 16-byte address and the big-endian port.
    #[test]
    fn delete_request_is_byte_exact() {
        let bytes = delete_service_request(0x22, &service("10.96.0.1", 443), 5);
        let mut expected = Vec::new();
        // 16 header + 4 genl + 4 nested header + (8 af + 8 protocol + 20 addr + 8 port)
        expected.extend(68u32.to_ne_bytes());
        expected.extend(0x22u16.to_ne_bytes());
        expected.extend(0x5u16.to_ne_bytes());
        expected.extend(5u32.to_ne_bytes());
        expected.extend([0; 4]);
        expected.extend([3, 1, 0, 0]);
        expected.extend(48u16.to_ne_bytes());
        expected.extend((1u16 | 0x8000).to_ne_bytes());
        expected.extend(6u16.to_ne_bytes());
        expected.extend(1u16.to_ne_bytes());
        expected.extend(2u16.to_ne_bytes());
        expected.extend([0, 0]);
        expected.extend(6u16.to_ne_bytes());
        expected.extend(2u16.to_ne_bytes());
        expected.extend(6u16.to_ne_bytes());
        expected.extend([0, 0]);
        expected.extend(20u16.to_ne_bytes());
        expected.extend(3u16.to_ne_bytes());
        expected.extend([10, 96, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        expected.extend(6u16.to_ne_bytes());
        expected.extend(4u16.to_ne_bytes());
        expected.extend([1, 187, 0, 0]);
        assert_eq!(bytes, expected);
    }

    #[test]
    fn a_listed_service_reads_back() {
        let v6 = service("fd00::53", 53);
        let request = delete_service_request(0x22, &v6, 1);
        // The kernel lists services in the same nested layout (plus fields we skip).
        assert_eq!(parse_service(&request[16..]).unwrap(), Some(v6));
        let v4 = service("10.96.0.10", 80);
        let parsed = parse_service(&delete_service_request(0x22, &v4, 1)[16..]).unwrap();
        assert_eq!(parsed, Some(v4));
    }

    #[test]
    fn firewall_mark_services_are_not_read() {
        let mut payload = vec![1, 1, 0, 0];
        let inner = [
            DefaultNla::new(SVC_AF, AF_INET.to_ne_bytes().to_vec()),
            DefaultNla::new(SVC_FWMARK, 7u32.to_ne_bytes().to_vec()),
        ];
        let mut nested = vec![0; inner.as_slice().buffer_len()];
        inner.as_slice().emit(&mut nested);
        let attribute = DefaultNla::new(CMD_ATTR_SERVICE | NLA_F_NESTED, nested);
        let start = payload.len();
        payload.resize(start + attribute.buffer_len(), 0);
        attribute.emit(&mut payload[start..]);
        assert_eq!(parse_service(&payload).unwrap(), None);
    }

    #[test]
    fn unreadable_services_are_errors_not_panics() {
        assert!(parse_service(&[1, 1]).is_err());
        assert!(parse_service(&[1, 1, 0, 0]).is_err(), "no service attribute");
        let mut bytes = delete_service_request(0x22, &service("10.96.0.1", 443), 1);
        let addr_len_at = 16 + 4 + 4 + 8 + 8;
        bytes[addr_len_at..addr_len_at + 2].copy_from_slice(&6u16.to_ne_bytes()); // a 2-byte address
        assert!(parse_service(&bytes[16..]).is_err());
    }

    /// `GENL_ID_CTRL`.
    const GENL_ID_CTRL: u16 = 0x10;

    #[test]
    fn family_lookup_names_ipvs() {
        let bytes = family_request(2);
        assert_eq!(u16::from_ne_bytes([bytes[4], bytes[5]]), GENL_ID_CTRL);
        assert_eq!(bytes[16], 3, "CTRL_CMD_GETFAMILY");
        assert!(bytes.windows(5).any(|w| w == b"IPVS\0"));
    }

    /// This kernel has no ip_vs: the lookup says so cleanly, in any namespace.
    #[test]
    fn a_kernel_without_ipvs_has_no_ipvs_family() {
        let mut channel = Channel::open(NETLINK_GENERIC).unwrap();
        let present = family_id(&mut channel).unwrap();
        let has_module = std::fs::read_to_string("/proc/modules")
            .unwrap_or_default()
            .lines()
            .any(|l| l.starts_with("ip_vs "))
            || std::path::Path::new("/proc/net/ip_vs").exists();
        assert_eq!(
            present.is_some(),
            has_module,
            "family lookup disagrees with /proc"
        );
    }
}
