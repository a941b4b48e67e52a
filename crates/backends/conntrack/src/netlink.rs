//! The conntrack table through ctnetlink (`NETLINK_NETFILTER`, subsystem `CTNETLINK`), as
//! upstream does since 1.32 instead of running the `conntrack` tool: one dump per listing
//! and exact deletions, without a process per flow or text to parse.
//!
//! Listing is one `IPCTNL_MSG_CT_GET` dump of the family's table with a kernel-side filter
//! (`CTA_FILTER`, Linux 5.8+) on the L4 protocol and, for a [`Scope`] narrower than all,
//! the original destination: the kernel still walks its table, but only sends (and we only
//! parse) what matches, which is most of the cost. Older kernels ignore the attribute and
//! send every entry, so family, protocol and scope are checked here again. Deleting is
//! `IPCTNL_MSG_CT_DELETE` by exact original tuple plus the entry's id (so an entry that
//! reused the tuple since the listing is not hit), in batches: many requests in one
//! datagram, then their acknowledgements.
//!
//! Every call opens its own socket, so a dump or batch cut short (a timeout, a malformed
//! answer) leaves nothing behind that a later call could mistake for its own answer.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use kpr_model::IpFamily;
use netlink_packet_core::{
    DefaultNla, Emitable, NLA_F_NESTED, NLA_TYPE_MASK, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST,
    NetlinkHeader, NetlinkMessage, NetlinkPayload, Nla,
};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol, Tuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::protocols::NETLINK_NETFILTER;
use netlink_sys::{Socket, SocketAddr as NetlinkAddr};

use crate::entry::{FlowTuple, UdpEntry};
use crate::table::{ConntrackTable, Deletion, ENOENT, Listing, Scope, TableError};

/// `IPCTNL_MSG_CT_GET`.
const IPCTNL_MSG_CT_GET: u8 = 1;
/// `CTA_ID`: the kernel's id of an entry (big-endian u32).
const CTA_ID: u16 = 12;
/// `CTA_ZONE`: the entry's zone when not the default one (big-endian u16).
const CTA_ZONE: u16 = 18;
/// `CTA_FILTER` (nested) and its `CTA_FILTER_ORIG_FLAGS` (host-endian u32).
const CTA_FILTER: u16 = 25;
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
/// `CTA_FILTER_FLAG(...)` bits: which fields of the original tuple the kernel compares.
const FILTER_ON_IP_DST: u32 = 1 << 1;
const FILTER_ON_PROTO_NUM: u32 = 1 << 3;
const FILTER_ON_PROTO_DST_PORT: u32 = 1 << 5;

/// A dump datagram holds at most 32 KiB (the kernel's cap); twice that leaves room.
const RECV_BUFFER: usize = 64 * 1024;
/// Deletions sent in one datagram. Their acknowledgements (~100 bytes each) stay far
/// below the socket's receive buffer, which would otherwise drop some.
const DELETE_BATCH: usize = 128;
/// How long one receive waits for the kernel, which answers at once unless something is
/// badly wrong; without a limit a lost answer would hang the sync.
const RECV_TIMEOUT: Duration = Duration::from_secs(10);

const LISTING: &str = "listing UDP conntrack entries";
const DELETING: &str = "deleting UDP conntrack entries";

/// The real conntrack table of the network namespace the calling thread is in.
#[derive(Debug, Default)]
pub struct NetlinkTable {
    sequence: u32,
}

impl NetlinkTable {
    pub fn new() -> Self {
        Self::default()
    }

    fn next_sequence(&mut self) -> u32 {
        self.sequence = self.sequence.wrapping_add(1);
        self.sequence
    }
}

impl ConntrackTable for NetlinkTable {
    fn udp_entries(&mut self, family: IpFamily, scope: Scope) -> Result<Listing, TableError> {
        let mut channel = Channel::open()?;
        let sequence = self.next_sequence();
        channel.send(&dump_request(family, scope, sequence), LISTING)?;
        let mut listing = Listing::default();
        loop {
            let datagram = channel.recv(LISTING)?;
            for message in split(datagram, LISTING)? {
                if message.sequence != sequence {
                    continue;
                }
                listing.interrupted |= message.flags & NLM_F_DUMP_INTR != 0;
                match message.parse() {
                    Ok(NetlinkPayload::Done(_)) => return Ok(listing),
                    Ok(NetlinkPayload::Error(error)) => {
                        return Err(kernel_error(LISTING, error.raw_code()));
                    }
                    Ok(NetlinkPayload::InnerMessage(inner)) => match entry_of(&inner, family) {
                        Parsed::Udp(entry) if scope.contains(&entry) => listing.entries.push(entry),
                        Parsed::Udp(_) | Parsed::NotUdp => {}
                        Parsed::Unreadable => listing.unreadable += 1,
                    },
                    Ok(_) => {}
                    Err(_) => listing.unreadable += 1,
                }
            }
        }
    }

    fn delete(&mut self, entries: &[UdpEntry]) -> Deletion {
        let mut outcome = Deletion::default();
        let mut channel = None;
        for batch in entries.chunks(DELETE_BATCH) {
            let open = match channel.take() {
                Some(open) => Ok(open),
                None => Channel::open(),
            };
            match open {
                Ok(mut open) => {
                    let first = self.sequence.wrapping_add(1);
                    self.sequence = self.sequence.wrapping_add(batch.len() as u32);
                    // A batch that went wrong leaves the socket in an unknown state: the
                    // next batch opens a new one.
                    if delete_batch(&mut open, batch, first, &mut outcome) {
                        channel = Some(open);
                    }
                }
                Err(error) => outcome.fail(batch.len(), error),
            }
        }
        outcome
    }
}

/// One netlink socket and its receive buffer.
struct Channel {
    socket: Socket,
    buffer: Vec<u8>,
}

impl Channel {
    fn open() -> Result<Self, TableError> {
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(TableError::Socket)?;
        socket.bind_auto().map_err(TableError::Socket)?;
        socket
            .connect(&NetlinkAddr::new(0, 0))
            .map_err(TableError::Socket)?;
        nix::sys::socket::setsockopt(
            &socket,
            nix::sys::socket::sockopt::ReceiveTimeout,
            &nix::sys::time::TimeVal::new(RECV_TIMEOUT.as_secs() as _, 0),
        )
        .map_err(|errno| TableError::Socket(errno.into()))?;
        Ok(Self {
            socket,
            buffer: vec![0; RECV_BUFFER],
        })
    }

    fn send(&self, bytes: &[u8], during: &'static str) -> Result<(), TableError> {
        let sent = self
            .socket
            .send(bytes, 0)
            .map_err(|source| TableError::Io { during, source })?;
        if sent != bytes.len() {
            return Err(TableError::Malformed {
                during,
                reason: format!("sent {sent} of {} bytes", bytes.len()),
            });
        }
        Ok(())
    }

    /// The next datagram from the kernel.
    fn recv(&mut self, during: &'static str) -> Result<&[u8], TableError> {
        let mut space = &mut self.buffer[..];
        let size = self
            .socket
            .recv(&mut space, 0)
            .map_err(|source| TableError::Io { during, source })?;
        if size > self.buffer.len() {
            return Err(TableError::Malformed {
                during,
                reason: format!("a {size}-byte datagram did not fit the {RECV_BUFFER}-byte buffer"),
            });
        }
        Ok(&self.buffer[..size])
    }
}

/// One netlink message of a datagram, with the header fields read before parsing (so a
/// message the parser refuses can still be attributed and skipped).
struct RawMessage<'a> {
    bytes: &'a [u8],
    flags: u16,
    sequence: u32,
}

impl RawMessage<'_> {
    fn parse(&self) -> Result<NetlinkPayload<NetfilterMessage>, String> {
        NetlinkMessage::<NetfilterMessage>::deserialize(self.bytes)
            .map(|message| message.payload)
            .map_err(|e| e.to_string())
    }
}

const HEADER_LEN: usize = 16;

/// Splits a datagram into its messages, by their length fields.
fn split<'a>(datagram: &'a [u8], during: &'static str) -> Result<Vec<RawMessage<'a>>, TableError> {
    let malformed = |reason: String| TableError::Malformed { during, reason };
    let mut messages = Vec::new();
    let mut rest = datagram;
    while !rest.is_empty() {
        let header = rest
            .get(..HEADER_LEN)
            .ok_or_else(|| malformed(format!("{} trailing bytes", rest.len())))?;
        let length = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if length < HEADER_LEN || length > rest.len() {
            return Err(malformed(format!(
                "message length {length} with {} bytes left",
                rest.len()
            )));
        }
        messages.push(RawMessage {
            bytes: &rest[..length],
            flags: u16::from_ne_bytes([header[6], header[7]]),
            sequence: u32::from_ne_bytes([header[8], header[9], header[10], header[11]]),
        });
        // Messages are 4-byte aligned; the last one may end the datagram unpadded.
        let aligned = length.next_multiple_of(4).min(rest.len());
        rest = &rest[aligned..];
    }
    Ok(messages)
}

fn kernel_error(during: &'static str, code: i32) -> TableError {
    TableError::Kernel {
        during,
        errno: code.checked_neg().unwrap_or(i32::MAX),
    }
}

fn netfilter_family(family: IpFamily) -> NetfilterProtoFamily {
    match family {
        IpFamily::V4 => NetfilterProtoFamily::IPv4,
        IpFamily::V6 => NetfilterProtoFamily::IPv6,
    }
}

fn serialize(flags: u16, sequence: u32, family: IpFamily, message: ConntrackMessage) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = sequence;
    let inner = NetfilterMessage::new(NetfilterHeader::new(netfilter_family(family), 0, 0), message);
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(inner));
    packet.finalize();
    let mut bytes = vec![0; packet.buffer_len()];
    packet.serialize(&mut bytes);
    bytes
}

/// A dump of `family`'s UDP entries in `scope`, filtered by kernels that can.
fn dump_request(family: IpFamily, scope: Scope, sequence: u32) -> Vec<u8> {
    let (mut flags, mut ip, mut proto) = (
        FILTER_ON_PROTO_NUM,
        vec![],
        vec![ProtoTuple::Protocol(Protocol::Udp)],
    );
    match scope {
        Scope::All => {}
        Scope::To(address) => {
            flags |= FILTER_ON_IP_DST | FILTER_ON_PROTO_DST_PORT;
            ip.push(IPTuple::DestinationAddress(address.ip()));
            proto.push(ProtoTuple::DestinationPort(address.port()));
        }
        Scope::ToPort(port) => {
            flags |= FILTER_ON_PROTO_DST_PORT;
            proto.push(ProtoTuple::DestinationPort(port));
        }
    }
    let mut tuple = vec![Tuple::Proto(proto)];
    if !ip.is_empty() {
        tuple.insert(0, Tuple::Ip(ip));
    }
    let filter = DefaultNla::new(CTA_FILTER_ORIG_FLAGS, flags.to_ne_bytes().to_vec());
    // The crate's attribute type drops the nested flag of attributes it does not know, and
    // the kernel refuses CTA_FILTER without it: the request is built from raw attributes.
    let attributes = vec![
        raw(&ConntrackAttribute::CtaTupleOrig(tuple)),
        nested(CTA_FILTER, &[filter]),
    ];
    serialize(
        NLM_F_REQUEST | NLM_F_DUMP,
        sequence,
        family,
        ConntrackMessage::Other {
            message_type: IPCTNL_MSG_CT_GET,
            attributes,
        },
    )
}

/// `attribute` as a raw one, flags kept.
fn raw(attribute: &ConntrackAttribute) -> DefaultNla {
    let mut value = vec![0; attribute.value_len()];
    attribute.emit_value(&mut value);
    let nested = if attribute.is_nested() { NLA_F_NESTED } else { 0 };
    DefaultNla::new(attribute.kind() | nested, value)
}

/// A nested attribute the message types of the crate do not cover.
fn nested(kind: u16, children: &[DefaultNla]) -> DefaultNla {
    let mut value = vec![0; children.buffer_len()];
    children.emit(&mut value);
    DefaultNla::new(kind | NLA_F_NESTED, value)
}

fn delete_request(entry: &UdpEntry, sequence: u32) -> Vec<u8> {
    let FlowTuple { src, dst } = entry.original;
    let mut attributes = vec![ConntrackAttribute::CtaTupleOrig(vec![
        Tuple::Ip(vec![
            IPTuple::SourceAddress(src.ip()),
            IPTuple::DestinationAddress(dst.ip()),
        ]),
        Tuple::Proto(vec![
            ProtoTuple::Protocol(Protocol::Udp),
            ProtoTuple::SourcePort(src.port()),
            ProtoTuple::DestinationPort(dst.port()),
        ]),
    ])];
    if let Some(id) = entry.id {
        attributes.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ID,
            id.to_be_bytes().to_vec(),
        )));
    }
    if let Some(zone) = entry.zone {
        attributes.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ZONE,
            zone.to_be_bytes().to_vec(),
        )));
    }
    let family = IpFamily::of(&src.ip());
    serialize(
        NLM_F_REQUEST | NLM_F_ACK,
        sequence,
        family,
        ConntrackMessage::Delete(attributes),
    )
}

/// Sends one batch of deletions (sequence numbers from `first`) and reads every answer.
/// Returns whether the socket can take the next batch.
fn delete_batch(channel: &mut Channel, batch: &[UdpEntry], first: u32, outcome: &mut Deletion) -> bool {
    let mut bytes = Vec::new();
    for (offset, entry) in batch.iter().enumerate() {
        bytes.extend(delete_request(entry, first.wrapping_add(offset as u32)));
    }
    if let Err(error) = channel.send(&bytes, DELETING) {
        outcome.fail(batch.len(), error);
        return false;
    }
    let mut answered = vec![false; batch.len()];
    let mut waiting = batch.len();
    while waiting > 0 {
        let datagram = match channel.recv(DELETING) {
            Ok(datagram) => datagram,
            Err(error) => {
                outcome.fail(waiting, error);
                return false;
            }
        };
        let messages = match split(datagram, DELETING) {
            Ok(messages) => messages,
            Err(error) => {
                outcome.fail(waiting, error);
                return false;
            }
        };
        for message in messages {
            let index = message.sequence.wrapping_sub(first) as usize;
            let Some(seen @ false) = answered.get_mut(index) else {
                continue;
            };
            let Ok(NetlinkPayload::Error(answer)) = message.parse() else {
                continue;
            };
            *seen = true;
            waiting -= 1;
            match answer.raw_code() {
                0 => outcome.deleted += 1,
                code if code == -ENOENT => outcome.gone += 1,
                code => outcome.fail(1, kernel_error(DELETING, code)),
            }
        }
    }
    true
}

/// What one dumped message holds for the reconcile.
#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    Udp(UdpEntry),
    /// Another protocol or family (a kernel without the dump filter sends everything).
    NotUdp,
    Unreadable,
}

fn entry_of(message: &NetfilterMessage, family: IpFamily) -> Parsed {
    let NetfilterMessageInner::Conntrack(ConntrackMessage::New(attributes)) = &message.inner else {
        return Parsed::Unreadable;
    };
    let mut original = None;
    let mut reply = None;
    let mut id = None;
    let mut zone = None;
    for attribute in attributes {
        match attribute {
            ConntrackAttribute::CtaTupleOrig(tuples) => original = Some(tuple_of(tuples)),
            ConntrackAttribute::CtaTupleReply(tuples) => reply = Some(tuple_of(tuples)),
            ConntrackAttribute::Other(nla) => match nla.kind() & NLA_TYPE_MASK {
                CTA_ID => id = value_of(nla).try_into().ok().map(u32::from_be_bytes),
                CTA_ZONE => zone = value_of(nla).try_into().ok().map(u16::from_be_bytes),
                _ => {}
            },
            _ => {}
        }
    }
    match (original, reply) {
        (Some(Some(original)), Some(Some(reply))) => {
            let same = |t: &Endpoints| t.protocol == Some(Protocol::Udp) && family.matches(&t.src_ip);
            if !same(&original) || !same(&reply) {
                return Parsed::NotUdp;
            }
            match (original.flow(), reply.flow()) {
                (Some(original), Some(reply)) => Parsed::Udp(UdpEntry {
                    original,
                    reply,
                    id,
                    zone,
                }),
                _ => Parsed::Unreadable,
            }
        }
        _ => Parsed::Unreadable,
    }
}

/// The fields of one `CTA_TUPLE_*`; ports are absent for protocols without them.
struct Endpoints {
    src_ip: IpAddr,
    dst_ip: IpAddr,
    protocol: Option<Protocol>,
    src_port: Option<u16>,
    dst_port: Option<u16>,
}

impl Endpoints {
    fn flow(&self) -> Option<FlowTuple> {
        Some(FlowTuple {
            src: SocketAddr::new(self.src_ip, self.src_port?),
            dst: SocketAddr::new(self.dst_ip, self.dst_port?),
        })
    }
}

fn tuple_of(tuples: &[Tuple]) -> Option<Endpoints> {
    let (mut src_ip, mut dst_ip) = (None, None);
    let (mut protocol, mut src_port, mut dst_port) = (None, None, None);
    for tuple in tuples {
        match tuple {
            Tuple::Ip(fields) => {
                for field in fields {
                    match field {
                        IPTuple::SourceAddress(ip) => src_ip = Some(*ip),
                        IPTuple::DestinationAddress(ip) => dst_ip = Some(*ip),
                        _ => {}
                    }
                }
            }
            Tuple::Proto(fields) => {
                for field in fields {
                    match field {
                        ProtoTuple::Protocol(p) => protocol = Some(*p),
                        ProtoTuple::SourcePort(port) => src_port = Some(*port),
                        ProtoTuple::DestinationPort(port) => dst_port = Some(*port),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(Endpoints {
        src_ip: src_ip?,
        dst_ip: dst_ip?,
        protocol,
        src_port,
        dst_port,
    })
}

fn value_of(nla: &DefaultNla) -> Vec<u8> {
    let mut value = vec![0; nla.value_len()];
    nla.emit_value(&mut value);
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attributes after the netlink and nfnetlink headers, as (type with flags, value).
    fn attributes(message: &[u8]) -> Vec<(u16, Vec<u8>)> {
        let mut rest = &message[HEADER_LEN + 4..];
        let mut found = Vec::new();
        while rest.len() >= 4 {
            let length = usize::from(u16::from_ne_bytes([rest[0], rest[1]]));
            found.push((u16::from_ne_bytes([rest[2], rest[3]]), rest[4..length].to_vec()));
            rest = &rest[length.next_multiple_of(4).min(rest.len())..];
        }
        found
    }

    #[test]
    fn dump_requests_carry_a_nested_filter_the_kernel_accepts() {
        let request = dump_request(IpFamily::V4, Scope::ToPort(30053), 7);
        let attributes = attributes(&request);
        let kinds: Vec<u16> = attributes.iter().map(|(kind, _)| *kind).collect();
        // The kernel refuses CTA_FILTER without NLA_F_NESTED (EINVAL).
        assert_eq!(kinds, [1 | NLA_F_NESTED, CTA_FILTER | NLA_F_NESTED]);
        let flags = FILTER_ON_PROTO_NUM | FILTER_ON_PROTO_DST_PORT;
        let mut filter = vec![8, 0, 1, 0];
        filter.extend(flags.to_ne_bytes());
        assert_eq!(attributes[1].1, filter);
    }

    #[test]
    fn malformed_answers_are_errors_not_panics() {
        for datagram in [
            vec![1, 2, 3],
            vec![200, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            vec![4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        ] {
            assert!(matches!(
                split(&datagram, LISTING),
                Err(TableError::Malformed { .. })
            ));
        }
        // A well-framed message the parser refuses is skipped, not fatal.
        let mut garbage = vec![0u8; 24];
        garbage[..4].copy_from_slice(&24u32.to_ne_bytes());
        garbage[4..6].copy_from_slice(&0x0100u16.to_ne_bytes());
        garbage[16..24].copy_from_slice(&[2, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
        let messages = split(&garbage, LISTING).unwrap();
        assert_eq!(messages.len(), 1);
        assert!(messages[0].parse().is_err());
    }

    #[test]
    fn delete_requests_name_the_exact_entry() {
        let client: SocketAddr = "192.168.77.2:40000".parse().unwrap();
        let entry = UdpEntry {
            original: FlowTuple {
                src: client,
                dst: "10.96.0.53:53".parse().unwrap(),
            },
            reply: FlowTuple {
                src: "10.244.1.10:5353".parse().unwrap(),
                dst: client,
            },
            id: Some(0x0102_0304),
            zone: Some(7),
        };
        let attributes = attributes(&delete_request(&entry, 1));
        let kinds: Vec<u16> = attributes.iter().map(|(kind, _)| *kind & NLA_TYPE_MASK).collect();
        assert_eq!(kinds, [1, CTA_ID, CTA_ZONE]);
        assert_eq!(attributes[1].1, [1, 2, 3, 4]);
        assert_eq!(attributes[2].1, [0, 7]);
    }
}
