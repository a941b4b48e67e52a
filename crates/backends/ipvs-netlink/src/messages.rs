//! The IPVS generic-netlink messages kube-proxy sends and the answers it reads: pure
//! functions from values to bytes and back (`linux/ip_vs.h` for the numbers).
//!
//! The kernel takes a service or a real server as a nested attribute. Adding or editing one
//! needs the *full entry* (a service: scheduler, flags, timeout and netmask; a real server:
//! forwarding method, weight and both thresholds) or it answers `EINVAL`; deleting one
//! needs only its key. Addresses travel as the kernel's 16-byte `nf_inet_addr`, ports in
//! network order, everything else in host order. A dump answer that cannot be read is an
//! error value, never a panic: the kernel is trusted, but a foreign service can hold what
//! this crate does not model (firewall marks, other forwarding methods).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{
    DefaultNla, Emitable, NLA_F_NESTED, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkDeserializable,
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NlasIterator,
};
use netlink_packet_generic::GenlMessage;
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};

use crate::Scheduler;
use crate::types::{CALLER_FLAGS, Destination, Protocol, Service, ServiceKey, Timeouts};

/// The generic-netlink family name of IPVS.
pub const IPVS_FAMILY: &str = "IPVS";
/// `IPVS_GENL_VERSION`.
const VERSION: u8 = 1;

/// `IPVS_CMD_*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Command {
    NewService = 1,
    SetService = 2,
    DelService = 3,
    GetService = 4,
    NewDest = 5,
    SetDest = 6,
    DelDest = 7,
    GetDest = 8,
    SetConfig = 12,
    GetConfig = 13,
    Flush = 17,
}

/// `IPVS_CMD_ATTR_*`.
const CMD_ATTR_SERVICE: u16 = 1;
const CMD_ATTR_DEST: u16 = 2;
const CMD_ATTR_TIMEOUT_TCP: u16 = 4;
const CMD_ATTR_TIMEOUT_TCP_FIN: u16 = 5;
const CMD_ATTR_TIMEOUT_UDP: u16 = 6;
/// `IPVS_SVC_ATTR_*`.
const SVC_AF: u16 = 1;
const SVC_PROTOCOL: u16 = 2;
const SVC_ADDR: u16 = 3;
const SVC_PORT: u16 = 4;
const SVC_FWMARK: u16 = 5;
const SVC_SCHED_NAME: u16 = 6;
const SVC_FLAGS: u16 = 7;
const SVC_TIMEOUT: u16 = 8;
const SVC_NETMASK: u16 = 9;
/// `IPVS_DEST_ATTR_*`.
const DEST_ADDR: u16 = 1;
const DEST_PORT: u16 = 2;
const DEST_FWD_METHOD: u16 = 3;
const DEST_WEIGHT: u16 = 4;
const DEST_U_THRESH: u16 = 5;
const DEST_L_THRESH: u16 = 6;
const DEST_ACTIVE_CONNS: u16 = 7;
const DEST_INACT_CONNS: u16 = 8;
/// `IP_VS_CONN_F_MASQ`: NAT forwarding, the only method kube-proxy uses.
const FORWARD_MASQUERADE: u32 = 0;
/// `IP_VS_CONN_F_FWD_MASK`.
const FORWARD_MASK: u32 = 0x7;
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// The `CTRL_CMD_GETFAMILY` request for the IPVS family.
pub fn family_request(sequence: u32) -> Vec<u8> {
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

/// The family id in the controller's answer (message type and payload of one answer).
pub fn family_id_in(message_type: u16, payload: &[u8]) -> Option<u16> {
    let mut header = NetlinkHeader::default();
    header.message_type = message_type;
    let message = GenlMessage::<GenlCtrl>::deserialize(&header, payload).ok()?;
    message.payload.nlas.iter().find_map(|attribute| match attribute {
        GenlCtrlAttrs::FamilyId(id) => Some(*id),
        _ => None,
    })
}

/// A request of the IPVS family `family_id`: genlmsghdr and `attributes`.
pub(crate) fn request(
    family_id: u16,
    command: Command,
    flags: u16,
    attributes: &[DefaultNla],
    sequence: u32,
) -> Vec<u8> {
    let mut payload = vec![command as u8, VERSION, 0, 0];
    let start = payload.len();
    payload.resize(start + attributes.buffer_len(), 0);
    attributes.emit(&mut payload[start..]);
    kpr_netlink::message(family_id, flags, sequence, &payload)
}

const ACKED: u16 = NLM_F_REQUEST | NLM_F_ACK;
const DUMP: u16 = NLM_F_REQUEST | NLM_F_DUMP;

pub fn list_services_request(family_id: u16, sequence: u32) -> Vec<u8> {
    request(family_id, Command::GetService, DUMP, &[], sequence)
}

pub fn new_service_request(family_id: u16, service: &Service, sequence: u32) -> Vec<u8> {
    service_request(family_id, Command::NewService, full_service(service), sequence)
}

pub fn set_service_request(family_id: u16, service: &Service, sequence: u32) -> Vec<u8> {
    service_request(family_id, Command::SetService, full_service(service), sequence)
}

pub fn delete_service_request(family_id: u16, key: &ServiceKey, sequence: u32) -> Vec<u8> {
    service_request(family_id, Command::DelService, service_key(key), sequence)
}

pub fn list_destinations_request(family_id: u16, key: &ServiceKey, sequence: u32) -> Vec<u8> {
    let attribute = nested(CMD_ATTR_SERVICE, &service_key(key));
    request(family_id, Command::GetDest, DUMP, &[attribute], sequence)
}

pub fn new_destination_request(
    family_id: u16,
    key: &ServiceKey,
    destination: &Destination,
    sequence: u32,
) -> Vec<u8> {
    let attributes = full_destination(destination);
    destination_request(family_id, Command::NewDest, key, attributes, sequence)
}

pub fn set_destination_request(
    family_id: u16,
    key: &ServiceKey,
    destination: &Destination,
    sequence: u32,
) -> Vec<u8> {
    let attributes = full_destination(destination);
    destination_request(family_id, Command::SetDest, key, attributes, sequence)
}

pub fn delete_destination_request(
    family_id: u16,
    key: &ServiceKey,
    destination: &Destination,
    sequence: u32,
) -> Vec<u8> {
    let attributes = destination_key(destination);
    destination_request(family_id, Command::DelDest, key, attributes, sequence)
}

/// An acknowledged request about one service: its attributes nested.
fn service_request(family_id: u16, command: Command, service: Vec<DefaultNla>, sequence: u32) -> Vec<u8> {
    request(
        family_id,
        command,
        ACKED,
        &[nested(CMD_ATTR_SERVICE, &service)],
        sequence,
    )
}

/// An acknowledged request about one real server of `key`'s service.
fn destination_request(
    family_id: u16,
    command: Command,
    key: &ServiceKey,
    destination: Vec<DefaultNla>,
    sequence: u32,
) -> Vec<u8> {
    let attributes = [
        nested(CMD_ATTR_SERVICE, &service_key(key)),
        nested(CMD_ATTR_DEST, &destination),
    ];
    request(family_id, command, ACKED, &attributes, sequence)
}

/// `ipvsadm --set`: the non-zero timeouts only (the kernel keeps a timeout given as 0).
pub fn set_timeouts_request(family_id: u16, timeouts: &Timeouts, sequence: u32) -> Vec<u8> {
    let attributes = [
        u32_attribute(CMD_ATTR_TIMEOUT_TCP, timeouts.tcp),
        u32_attribute(CMD_ATTR_TIMEOUT_TCP_FIN, timeouts.tcp_fin),
        u32_attribute(CMD_ATTR_TIMEOUT_UDP, timeouts.udp),
    ];
    request(family_id, Command::SetConfig, ACKED, &attributes, sequence)
}

pub fn get_timeouts_request(family_id: u16, sequence: u32) -> Vec<u8> {
    request(family_id, Command::GetConfig, ACKED, &[], sequence)
}

/// Deletes every virtual service of the namespace (`ipvsadm -C`).
pub fn flush_request(family_id: u16, sequence: u32) -> Vec<u8> {
    request(family_id, Command::Flush, ACKED, &[], sequence)
}

fn service_key(key: &ServiceKey) -> Vec<DefaultNla> {
    let (family, address) = inet_address(key.address);
    vec![
        DefaultNla::new(SVC_AF, family.to_ne_bytes().to_vec()),
        DefaultNla::new(SVC_PROTOCOL, key.protocol.number().to_ne_bytes().to_vec()),
        DefaultNla::new(SVC_ADDR, address),
        DefaultNla::new(SVC_PORT, key.port.to_be_bytes().to_vec()),
    ]
}

fn full_service(service: &Service) -> Vec<DefaultNla> {
    let mut scheduler = service.scheduler.as_str().as_bytes().to_vec();
    scheduler.push(0);
    // struct ip_vs_flags { flags, mask }: all bits as given (the kernel sets its hashed
    // bit itself), as ipvsadm sends them.
    let mut flags = (service.flags & CALLER_FLAGS).to_ne_bytes().to_vec();
    flags.extend_from_slice(&u32::MAX.to_ne_bytes());
    let mut attributes = service_key(&service.key);
    attributes.extend([
        DefaultNla::new(SVC_SCHED_NAME, scheduler),
        DefaultNla::new(SVC_FLAGS, flags),
        u32_attribute(SVC_TIMEOUT, service.timeout),
        u32_attribute(SVC_NETMASK, service.netmask),
    ]);
    attributes
}

fn destination_key(destination: &Destination) -> Vec<DefaultNla> {
    let (_, address) = inet_address(destination.address);
    vec![
        DefaultNla::new(DEST_ADDR, address),
        DefaultNla::new(DEST_PORT, destination.port.to_be_bytes().to_vec()),
    ]
}

fn full_destination(destination: &Destination) -> Vec<DefaultNla> {
    let mut attributes = destination_key(destination);
    attributes.extend([
        u32_attribute(DEST_FWD_METHOD, FORWARD_MASQUERADE),
        u32_attribute(DEST_WEIGHT, destination.weight),
        u32_attribute(DEST_U_THRESH, 0),
        u32_attribute(DEST_L_THRESH, 0),
    ]);
    attributes
}

fn nested(kind: u16, attributes: &[DefaultNla]) -> DefaultNla {
    let mut bytes = vec![0; attributes.buffer_len()];
    attributes.emit(&mut bytes);
    DefaultNla::new(kind | NLA_F_NESTED, bytes)
}

fn u32_attribute(kind: u16, value: u32) -> DefaultNla {
    DefaultNla::new(kind, value.to_ne_bytes().to_vec())
}

/// The address family and the 16-byte `nf_inet_addr` of `address`.
fn inet_address(address: IpAddr) -> (u16, Vec<u8>) {
    match address {
        IpAddr::V4(v4) => {
            let mut bytes = v4.octets().to_vec();
            bytes.resize(16, 0);
            (AF_INET, bytes)
        }
        IpAddr::V6(v6) => (AF_INET6, v6.octets().to_vec()),
    }
}

/// One listed service: `Ok(None)` for a service kube-proxy does not model (a firewall
/// mark, a protocol other than TCP/UDP/SCTP), which the caller leaves alone.
pub fn parse_service(payload: &[u8]) -> Result<Option<Service>, String> {
    let nested = top_level_attribute(payload, CMD_ATTR_SERVICE)?.ok_or("no IPVS_CMD_ATTR_SERVICE")?;
    let mut fields = ServiceFields::default();
    for attribute in NlasIterator::new(&nested[..]) {
        let attribute = attribute.map_err(|e| e.to_string())?;
        fields.read(attribute.kind(), attribute.value())?;
    }
    fields.into_service()
}

#[derive(Default)]
struct ServiceFields {
    family: Option<u16>,
    protocol: u16,
    address: Option<Vec<u8>>,
    port: u16,
    fwmark: u32,
    scheduler: Option<String>,
    flags: u32,
    timeout: u32,
    netmask: u32,
}

impl ServiceFields {
    fn read(&mut self, kind: u16, value: &[u8]) -> Result<(), String> {
        match kind {
            SVC_AF => self.family = Some(u16::from_ne_bytes(array(value)?)),
            SVC_PROTOCOL => self.protocol = u16::from_ne_bytes(array(value)?),
            SVC_ADDR => self.address = Some(value.to_vec()),
            SVC_PORT => self.port = u16::from_be_bytes(array(value)?),
            SVC_FWMARK => self.fwmark = u32::from_ne_bytes(array(value)?),
            SVC_SCHED_NAME => self.scheduler = Some(c_string(value)),
            // struct ip_vs_flags: the flags, then a mask the kernel fills with ones.
            SVC_FLAGS => self.flags = u32::from_ne_bytes(array(prefix(value, 4)?)?),
            SVC_TIMEOUT => self.timeout = u32::from_ne_bytes(array(value)?),
            SVC_NETMASK => self.netmask = u32::from_ne_bytes(array(value)?),
            _ => {}
        }
        Ok(())
    }

    fn into_service(self) -> Result<Option<Service>, String> {
        let Some(protocol) = Protocol::from_number(self.protocol) else {
            return Ok(None);
        };
        if self.fwmark != 0 {
            return Ok(None);
        }
        let address = address_of(self.family, self.address.as_deref())?;
        let scheduler = Scheduler::new(self.scheduler.as_deref().unwrap_or_default())?;
        Ok(Some(Service {
            key: ServiceKey {
                protocol,
                address,
                port: self.port,
            },
            scheduler,
            flags: self.flags & CALLER_FLAGS,
            timeout: self.timeout,
            netmask: self.netmask,
        }))
    }
}

/// One listed real server of a service whose address family is `family_of_service`'s,
/// whatever its forwarding method (a sync removes or corrects the ones it did not make).
pub fn parse_destination(payload: &[u8], family_of_service: IpAddr) -> Result<Destination, String> {
    let nested = top_level_attribute(payload, CMD_ATTR_DEST)?.ok_or("no IPVS_CMD_ATTR_DEST")?;
    let (mut address, mut port, mut forward, mut weight) = (None, 0, FORWARD_MASQUERADE, 0);
    let (mut active, mut inactive) = (0, 0);
    for attribute in NlasIterator::new(&nested[..]) {
        let attribute = attribute.map_err(|e| e.to_string())?;
        let value = attribute.value();
        match attribute.kind() {
            DEST_ADDR => address = Some(value.to_vec()),
            DEST_PORT => port = u16::from_be_bytes(array(value)?),
            DEST_FWD_METHOD => forward = u32::from_ne_bytes(array(value)?),
            DEST_WEIGHT => weight = u32::from_ne_bytes(array(value)?),
            DEST_ACTIVE_CONNS => active = u32::from_ne_bytes(array(value)?),
            DEST_INACT_CONNS => inactive = u32::from_ne_bytes(array(value)?),
            _ => {}
        }
    }
    let family = match family_of_service {
        IpAddr::V4(_) => AF_INET,
        IpAddr::V6(_) => AF_INET6,
    };
    Ok(Destination {
        address: address_of(Some(family), address.as_deref())?,
        port,
        weight,
        masquerades: forward & FORWARD_MASK == FORWARD_MASQUERADE,
        active_connections: active,
        inactive_connections: inactive,
    })
}

/// The connection timeouts in a `GET_CONFIG` answer.
pub fn parse_timeouts(payload: &[u8]) -> Result<Timeouts, String> {
    let mut timeouts = Timeouts::default();
    let attributes = payload.get(4..).ok_or("no genlmsghdr")?;
    for attribute in NlasIterator::new(attributes) {
        let attribute = attribute.map_err(|e| e.to_string())?;
        let slot = match attribute.kind() {
            CMD_ATTR_TIMEOUT_TCP => &mut timeouts.tcp,
            CMD_ATTR_TIMEOUT_TCP_FIN => &mut timeouts.tcp_fin,
            CMD_ATTR_TIMEOUT_UDP => &mut timeouts.udp,
            _ => continue,
        };
        *slot = u32::from_ne_bytes(array(attribute.value())?);
    }
    Ok(timeouts)
}

/// The value of the top-level attribute `kind` after the genlmsghdr.
fn top_level_attribute(payload: &[u8], kind: u16) -> Result<Option<Vec<u8>>, String> {
    let attributes = payload.get(4..).ok_or("no genlmsghdr")?;
    for attribute in NlasIterator::new(attributes) {
        let attribute = attribute.map_err(|e| e.to_string())?;
        if attribute.kind() & !NLA_F_NESTED == kind {
            return Ok(Some(attribute.value().to_vec()));
        }
    }
    Ok(None)
}

fn address_of(family: Option<u16>, bytes: Option<&[u8]>) -> Result<IpAddr, String> {
    match (family, bytes) {
        (Some(AF_INET), Some(bytes)) => Ok(IpAddr::V4(Ipv4Addr::from(array::<4>(prefix(bytes, 4)?)?))),
        (Some(AF_INET6), Some(bytes)) => Ok(IpAddr::V6(Ipv6Addr::from(array::<16>(bytes)?))),
        (family, _) => Err(format!("address family {family:?} without a usable address")),
    }
}

fn c_string(value: &[u8]) -> String {
    let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end]).into_owned()
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

#[cfg(test)]
mod tests;
