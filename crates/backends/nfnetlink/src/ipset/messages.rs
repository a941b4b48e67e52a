//! ipset's netlink messages as bytes, and list answers read back: pure, no socket.
//!
//! Numbers are from the kernel's UAPI header `linux/netfilter/ipset/ip_set.h` (and
//! `ip_set_hash.h`, `ip_set_bitmap.h` for the type-specific error codes). Every message
//! starts with the netlink header and an `nfgenmsg` whose family is `NFPROTO_IPV4`, as
//! the `ipset` tool sends it whatever the set's family; the set's own family is an
//! attribute. The layout of each message (attribute order, `NLA_F_NET_BYTEORDER` on
//! integers and addresses, a line number of 0 in member data, no prefix attribute for a
//! full-length net) follows the tool's, so tests can pin our bytes to the tool's.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::attr::{Attr, Attrs, Malformed, Writer};
use crate::consts::{NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use crate::wire::{self, NFGENMSG_LEN};

// === nfnetlink ===
const NFNL_SUBSYS_IPSET: u16 = 6;
/// `IPSET_PROTOCOL`: what the tool and every kernel since 3.x speak.
pub const PROTOCOL: u8 = 7;
const NFPROTO_UNSPEC: u8 = 0;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
/// `IPSET_MAXNAMELEN` less the NUL.
pub const NAME_MAX: usize = 31;
const NLA_F_NET_BYTEORDER: u16 = 0x4000;

// === commands (`enum ipset_cmd`) ===
const CMD_CREATE: u16 = 2;
const CMD_DESTROY: u16 = 3;
const CMD_LIST: u16 = 7;
const CMD_ADD: u16 = 9;
const CMD_DEL: u16 = 10;
const CMD_TYPE: u16 = 13;

// === command-level attributes ===
const ATTR_PROTOCOL: u16 = 1;
const ATTR_SETNAME: u16 = 2;
const ATTR_TYPENAME: u16 = 3;
const ATTR_REVISION: u16 = 4;
const ATTR_FAMILY: u16 = 5;
const ATTR_DATA: u16 = 7;
const ATTR_ADT: u16 = 8;

// === data attributes (create and member data) ===
const ATTR_IP: u16 = 1;
const ATTR_PORT: u16 = 4;
const ATTR_PORT_TO: u16 = 5;
const ATTR_PROTO: u16 = 7;
const ATTR_LINENO: u16 = 9;
const ATTR_HASHSIZE: u16 = 18;
const ATTR_MAXELEM: u16 = 19;
const ATTR_IP2: u16 = 20;
const ATTR_CIDR2: u16 = 21;
const ATTR_IPADDR_IPV4: u16 = 1;
const ATTR_IPADDR_IPV6: u16 = 2;

// === error codes (`enum ipset_errno` and the type-specific ones) ===
const ERR_PROTOCOL: i32 = 4097;
const ERR_FIND_TYPE: i32 = 4098;
const ERR_MAX_SETS: i32 = 4099;
const ERR_BUSY: i32 = 4100;
const ERR_EXIST_SETNAME2: i32 = 4101;
const ERR_TYPE_MISMATCH: i32 = 4102;
const ERR_EXIST: i32 = 4103;
const ERR_INVALID_CIDR: i32 = 4104;
const ERR_INVALID_FAMILY: i32 = 4106;
const ERR_REFERENCED: i32 = 4108;
const ERR_IPADDR_IPV4: i32 = 4109;
const ERR_IPADDR_IPV6: i32 = 4110;
/// `IPSET_ERR_TYPE_SPECIFIC`: hash types' `HASH_FULL`, bitmaps' `BITMAP_RANGE`, ...
const ERR_TYPE_SPECIFIC: i32 = 4352;

/// The set types this module builds and reads members of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetType {
    /// `hash:ip`
    HashIp,
    /// `hash:ip,port`
    HashIpPort,
    /// `hash:ip,port,ip`
    HashIpPortIp,
    /// `hash:ip,port,net`
    HashIpPortNet,
    /// `bitmap:port`
    BitmapPort,
}

impl SetType {
    pub const ALL: [SetType; 5] = [
        Self::HashIp,
        Self::HashIpPort,
        Self::HashIpPortIp,
        Self::HashIpPortNet,
        Self::BitmapPort,
    ];

    /// The kernel's type name.
    pub fn name(self) -> &'static str {
        match self {
            Self::HashIp => "hash:ip",
            Self::HashIpPort => "hash:ip,port",
            Self::HashIpPortIp => "hash:ip,port,ip",
            Self::HashIpPortNet => "hash:ip,port,net",
            Self::BitmapPort => "bitmap:port",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The family the type is asked about: hash types serve both and are asked as IPv4,
    /// port bitmaps have none (as the tool asks).
    fn query_family(self) -> u8 {
        match self {
            Self::BitmapPort => NFPROTO_UNSPEC,
            _ => NFPROTO_IPV4,
        }
    }
}

/// The address family of a hash set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetFamily {
    Inet,
    Inet6,
}

impl SetFamily {
    fn number(self) -> u8 {
        match self {
            Self::Inet => NFPROTO_IPV4,
            Self::Inet6 => NFPROTO_IPV6,
        }
    }

    fn from_number(number: u8) -> Option<Self> {
        match number {
            NFPROTO_IPV4 => Some(Self::Inet),
            NFPROTO_IPV6 => Some(Self::Inet6),
            _ => None,
        }
    }
}

/// How a set is created: a hash set's family, initial buckets and capacity, or a port
/// bitmap's range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateOptions {
    Hash {
        family: SetFamily,
        hash_size: u32,
        max_elements: u32,
    },
    Ports {
        from: u16,
        to: u16,
    },
}

/// A set to create.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetDef<'a> {
    pub name: &'a str,
    pub set_type: SetType,
    pub options: CreateOptions,
}

/// One member, in the shape of its set's type. Protocols are IP protocol numbers
/// (6 TCP, 17 UDP, 132 SCTP); a net is an address and a prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Entry {
    Ip(IpAddr),
    IpPort {
        ip: IpAddr,
        protocol: u8,
        port: u16,
    },
    IpPortIp {
        ip: IpAddr,
        protocol: u8,
        port: u16,
        ip2: IpAddr,
    },
    IpPortNet {
        ip: IpAddr,
        protocol: u8,
        port: u16,
        net: IpAddr,
        prefix: u8,
    },
    Port(u16),
}

impl Entry {
    /// The set type this member belongs to.
    pub fn set_type(&self) -> SetType {
        match self {
            Self::Ip(_) => SetType::HashIp,
            Self::IpPort { .. } => SetType::HashIpPort,
            Self::IpPortIp { .. } => SetType::HashIpPortIp,
            Self::IpPortNet { .. } => SetType::HashIpPortNet,
            Self::Port(_) => SetType::BitmapPort,
        }
    }
}

fn protocol_name(protocol: u8) -> String {
    match protocol {
        6 => "tcp".into(),
        17 => "udp".into(),
        132 => "sctp".into(),
        other => other.to_string(),
    }
}

/// As `ipset save` prints it.
impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ip(ip) => write!(f, "{ip}"),
            Self::IpPort { ip, protocol, port } => write!(f, "{ip},{}:{port}", protocol_name(*protocol)),
            Self::IpPortIp {
                ip,
                protocol,
                port,
                ip2,
            } => write!(f, "{ip},{}:{port},{ip2}", protocol_name(*protocol)),
            Self::IpPortNet {
                ip,
                protocol,
                port,
                net,
                prefix,
            } => write!(f, "{ip},{}:{port},{net}/{prefix}", protocol_name(*protocol)),
            Self::Port(port) => write!(f, "{port}"),
        }
    }
}

/// Adding or deleting a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Add,
    Delete,
}

/// One member change of one set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Change<'a> {
    pub op: Op,
    pub set: &'a str,
    pub entry: Entry,
}

impl std::fmt::Display for Change<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.op {
            Op::Add => write!(f, "adding {} to set {}", self.entry, self.set),
            Op::Delete => write!(f, "deleting {} from set {}", self.entry, self.set),
        }
    }
}

/// A set as the kernel lists it. Members are read for the types of [`SetType`]; a set of
/// another type lists with its type name and no members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedSet {
    pub name: String,
    pub type_name: String,
    pub set_type: Option<SetType>,
    /// A hash set's family (`None` for bitmaps).
    pub family: Option<SetFamily>,
    pub revision: u8,
    pub entries: Vec<Entry>,
}

/// Why `name` cannot be a set name, if it cannot.
pub fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        Some("an empty set name (a destroy or flush without a name means every set)".into())
    } else if name.contains('\0') {
        Some(format!("{name:?} contains a NUL byte"))
    } else if name.len() > NAME_MAX {
        Some(format!(
            "{name:?} is {} bytes, longer than ipset's {NAME_MAX}",
            name.len()
        ))
    } else {
        None
    }
}

fn message_type(command: u16) -> u16 {
    (NFNL_SUBSYS_IPSET << 8) | command
}

/// One message (sequence number 0, patched when sent) appended to `buf`: header,
/// `nfgenmsg`, the protocol attribute, then what `attrs` writes.
fn append(buf: &mut Vec<u8>, command: u16, flags: u16, attrs: impl FnOnce(&mut Writer<'_>)) {
    let start = wire::start(buf, message_type(command), flags, NFPROTO_IPV4, 0);
    let mut w = Writer::new(buf);
    w.bytes(ATTR_PROTOCOL, &[PROTOCOL]);
    attrs(&mut w);
    wire::finish(buf, start);
}

fn single(command: u16, flags: u16, attrs: impl FnOnce(&mut Writer<'_>)) -> Vec<u8> {
    let mut buf = Vec::with_capacity(128);
    append(&mut buf, command, flags, attrs);
    buf
}

fn checked(name: &str) -> Result<(), String> {
    name_problem(name).map_or(Ok(()), Err)
}

/// `IPSET_CMD_TYPE`: the kernel's newest and oldest revision of `set_type` (answered
/// without an acknowledgement).
pub fn type_query(set_type: SetType) -> Vec<u8> {
    single(CMD_TYPE, 0, |w| {
        w.string(ATTR_TYPENAME, set_type.name());
        w.bytes(ATTR_FAMILY, &[set_type.query_family()]);
    })
}

/// `ipset create -exist`: creates `set` at `revision`; an existing set of the same type
/// and options is no error.
pub fn create(set: &SetDef<'_>, revision: u8) -> Result<Vec<u8>, String> {
    checked(set.name)?;
    let family = match set.options {
        CreateOptions::Hash { family, .. } => family.number(),
        CreateOptions::Ports { .. } => NFPROTO_UNSPEC,
    };
    Ok(single(CMD_CREATE, NLM_F_ACK | NLM_F_CREATE, |w| {
        w.string(ATTR_SETNAME, set.name);
        w.string(ATTR_TYPENAME, set.set_type.name());
        w.bytes(ATTR_REVISION, &[revision]);
        w.bytes(ATTR_FAMILY, &[family]);
        let data = w.begin(ATTR_DATA);
        match set.options {
            CreateOptions::Hash {
                hash_size,
                max_elements,
                ..
            } => {
                w.u32(ATTR_HASHSIZE | NLA_F_NET_BYTEORDER, hash_size);
                w.u32(ATTR_MAXELEM | NLA_F_NET_BYTEORDER, max_elements);
            }
            CreateOptions::Ports { from, to } => {
                w.bytes(ATTR_PORT | NLA_F_NET_BYTEORDER, &from.to_be_bytes());
                w.bytes(ATTR_PORT_TO | NLA_F_NET_BYTEORDER, &to.to_be_bytes());
            }
        }
        w.end(data);
    }))
}

/// `ipset destroy NAME`: a missing set is an error (`ENOENT`). Never without a name.
pub fn destroy(name: &str) -> Result<Vec<u8>, String> {
    checked(name)?;
    Ok(single(CMD_DESTROY, NLM_F_ACK | NLM_F_EXCL, |w| {
        w.string(ATTR_SETNAME, name)
    }))
}

/// `ipset list [NAME]` as a dump: one set, or every set when `name` is `None`.
pub fn list(name: Option<&str>) -> Result<Vec<u8>, String> {
    if let Some(name) = name {
        checked(name)?;
    }
    Ok(single(CMD_LIST, NLM_F_ACK | NLM_F_DUMP, |w| {
        if let Some(name) = name {
            w.string(ATTR_SETNAME, name);
        }
    }))
}

/// Appends `ipset add -exist` / `ipset del -exist` of one member to `buf` (adding a
/// member that is there, or deleting one that is not, is no error); returns where the
/// message starts.
pub fn append_change(buf: &mut Vec<u8>, change: &Change<'_>) -> Result<usize, String> {
    checked(change.set)?;
    let command = match change.op {
        Op::Add => CMD_ADD,
        Op::Delete => CMD_DEL,
    };
    let start = buf.len();
    append(buf, command, NLM_F_ACK, |w| {
        w.string(ATTR_SETNAME, change.set);
        let data = w.begin(ATTR_DATA);
        entry_data(w, &change.entry);
        w.u32(ATTR_LINENO | NLA_F_NET_BYTEORDER, 0);
        w.end(data);
    });
    Ok(start)
}

/// One change as a message of its own.
pub fn change(change: &Change<'_>) -> Result<Vec<u8>, String> {
    let mut buf = Vec::with_capacity(128);
    append_change(&mut buf, change)?;
    Ok(buf)
}

fn entry_data(w: &mut Writer<'_>, entry: &Entry) {
    match *entry {
        Entry::Ip(ip) => address(w, ATTR_IP, ip),
        Entry::IpPort { ip, protocol, port } => {
            address(w, ATTR_IP, ip);
            port_protocol(w, port, protocol);
        }
        Entry::IpPortIp {
            ip,
            protocol,
            port,
            ip2,
        } => {
            address(w, ATTR_IP, ip);
            port_protocol(w, port, protocol);
            address(w, ATTR_IP2, ip2);
        }
        Entry::IpPortNet {
            ip,
            protocol,
            port,
            net,
            prefix,
        } => {
            address(w, ATTR_IP, ip);
            port_protocol(w, port, protocol);
            address(w, ATTR_IP2, net);
            // The kernel takes a missing prefix as the full length; the tool leaves it out.
            if prefix != full_prefix(net) {
                w.bytes(ATTR_CIDR2, &[prefix]);
            }
        }
        Entry::Port(port) => w.bytes(ATTR_PORT | NLA_F_NET_BYTEORDER, &port.to_be_bytes()),
    }
}

fn full_prefix(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

fn address(w: &mut Writer<'_>, kind: u16, ip: IpAddr) {
    let nest = w.begin(kind);
    match ip {
        IpAddr::V4(v4) => w.bytes(ATTR_IPADDR_IPV4 | NLA_F_NET_BYTEORDER, &v4.octets()),
        IpAddr::V6(v6) => w.bytes(ATTR_IPADDR_IPV6 | NLA_F_NET_BYTEORDER, &v6.octets()),
    }
    w.end(nest);
}

fn port_protocol(w: &mut Writer<'_>, port: u16, protocol: u8) {
    w.bytes(ATTR_PORT | NLA_F_NET_BYTEORDER, &port.to_be_bytes());
    w.bytes(ATTR_PROTO, &[protocol]);
}

/// The kernel's answer to a type query: (newest, oldest) revision.
pub fn parse_type_answer(payload: &[u8]) -> Result<(u8, u8), Malformed> {
    let mut newest = None;
    let mut oldest = None;
    for attr in attrs_of(payload)? {
        let attr = attr?;
        match attr.kind {
            ATTR_REVISION => newest = Some(u8_of(&attr)?),
            // IPSET_ATTR_REVISION_MIN shares IPSET_ATTR_PROTOCOL_MIN's number.
            10 => oldest = Some(u8_of(&attr)?),
            _ => {}
        }
    }
    let newest = newest.ok_or_else(|| Malformed("a type answer without a revision".into()))?;
    Ok((newest, oldest.unwrap_or(newest)))
}

fn attrs_of(payload: &[u8]) -> Result<Attrs<'_>, Malformed> {
    payload
        .get(NFGENMSG_LEN..)
        .map(Attrs::new)
        .ok_or_else(|| Malformed("an ipset message shorter than nfgenmsg".into()))
}

fn u8_of(attr: &Attr<'_>) -> Result<u8, Malformed> {
    attr.value
        .first()
        .copied()
        .ok_or_else(|| Malformed(format!("ipset attribute {} is empty", attr.kind)))
}

fn u16_of(attr: &Attr<'_>) -> Result<u16, Malformed> {
    match attr.value {
        [a, b, ..] => Ok(u16::from_be_bytes([*a, *b])),
        _ => Err(Malformed(format!("ipset attribute {} is not a u16", attr.kind))),
    }
}

/// Reads one answer of a list dump into `sets`. A big set comes in several messages
/// (each repeating its name); they are merged into one [`ListedSet`].
pub fn parse_list_answer(payload: &[u8], sets: &mut Vec<ListedSet>) -> Result<(), Malformed> {
    let mut name = None;
    let mut type_name = None;
    let mut family = None;
    let mut revision = 0;
    let mut members = None;
    for attr in attrs_of(payload)? {
        let attr = attr?;
        match attr.kind {
            ATTR_SETNAME => name = Some(attr.string()?),
            ATTR_TYPENAME => type_name = Some(attr.string()?),
            ATTR_FAMILY => family = SetFamily::from_number(u8_of(&attr)?),
            ATTR_REVISION => revision = u8_of(&attr)?,
            ATTR_ADT => members = Some(attr.nested()),
            _ => {}
        }
    }
    let name = name.ok_or_else(|| Malformed("a listed set without a name".into()))?;
    let set = match sets.last_mut() {
        Some(last) if last.name == name => last,
        _ => {
            let type_name =
                type_name.ok_or_else(|| Malformed(format!("set {name} listed without its type")))?;
            sets.push(ListedSet {
                set_type: SetType::from_name(&type_name),
                name,
                type_name,
                family,
                revision,
                entries: Vec::new(),
            });
            sets.last_mut()
                .ok_or_else(|| Malformed("a set vanished while listing".into()))?
        }
    };
    let (Some(members), Some(set_type)) = (members, set.set_type) else {
        return Ok(());
    };
    for member in members {
        let member = member?;
        if member.kind == ATTR_DATA {
            set.entries.push(parse_entry(set_type, member.nested())?);
        }
    }
    Ok(())
}

/// One member's data nest, in the shape of `set_type`.
fn parse_entry(set_type: SetType, attrs: Attrs<'_>) -> Result<Entry, Malformed> {
    let mut ip = None;
    let mut ip2 = None;
    let mut port = None;
    let mut protocol = None;
    let mut prefix2 = None;
    for attr in attrs {
        let attr = attr?;
        match attr.kind {
            ATTR_IP => ip = Some(parse_address(attr.nested())?),
            ATTR_IP2 => ip2 = Some(parse_address(attr.nested())?),
            ATTR_PORT => port = Some(u16_of(&attr)?),
            ATTR_PROTO => protocol = Some(u8_of(&attr)?),
            ATTR_CIDR2 => prefix2 = Some(u8_of(&attr)?),
            _ => {}
        }
    }
    let missing = |what: &str| Malformed(format!("a {} member without {what}", set_type.name()));
    let ip = || ip.ok_or_else(|| missing("an address"));
    let port = || port.ok_or_else(|| missing("a port"));
    let protocol = || protocol.ok_or_else(|| missing("a protocol"));
    let ip2 = || ip2.ok_or_else(|| missing("a second address"));
    Ok(match set_type {
        SetType::HashIp => Entry::Ip(ip()?),
        SetType::HashIpPort => Entry::IpPort {
            ip: ip()?,
            protocol: protocol()?,
            port: port()?,
        },
        SetType::HashIpPortIp => Entry::IpPortIp {
            ip: ip()?,
            protocol: protocol()?,
            port: port()?,
            ip2: ip2()?,
        },
        SetType::HashIpPortNet => {
            let net = ip2()?;
            Entry::IpPortNet {
                ip: ip()?,
                protocol: protocol()?,
                port: port()?,
                net,
                prefix: prefix2.unwrap_or(full_prefix(net)),
            }
        }
        SetType::BitmapPort => Entry::Port(port()?),
    })
}

fn parse_address(attrs: Attrs<'_>) -> Result<IpAddr, Malformed> {
    for attr in attrs {
        let attr = attr?;
        match (attr.kind, attr.value.len()) {
            (ATTR_IPADDR_IPV4, 4) => {
                let octets: [u8; 4] = attr.value.try_into().map_err(|_| bad_address())?;
                return Ok(IpAddr::V4(Ipv4Addr::from(octets)));
            }
            (ATTR_IPADDR_IPV6, 16) => {
                let octets: [u8; 16] = attr.value.try_into().map_err(|_| bad_address())?;
                return Ok(IpAddr::V6(Ipv6Addr::from(octets)));
            }
            _ => {}
        }
    }
    Err(bad_address())
}

fn bad_address() -> Malformed {
    Malformed("an ipset address nest without a 4- or 16-byte address".into())
}

/// What an errno from ipset means: its own codes (4096 and up, which `strerror` does
/// not know) in the tool's words, others as the system names them.
pub fn reason(errno: i32) -> String {
    let text = match errno {
        ERR_PROTOCOL => "the kernel does not speak this ipset protocol version",
        ERR_FIND_TYPE => "the kernel has no such set type (or revision)",
        ERR_MAX_SETS => "the kernel's maximum number of sets is reached",
        ERR_BUSY => "the set is in use by a rule or another set",
        ERR_EXIST_SETNAME2 => "the set to rename or swap with exists already",
        ERR_TYPE_MISMATCH => "the sets are not of the same type",
        ERR_EXIST => "a set of that name exists with other options, or the member exists already",
        ERR_INVALID_CIDR => "the prefix length is invalid",
        ERR_INVALID_FAMILY => "the address is not of the set's family",
        ERR_REFERENCED => "the set is referenced and cannot be destroyed",
        ERR_IPADDR_IPV4 => "an IPv4 address was expected",
        ERR_IPADDR_IPV6 => "an IPv6 address was expected",
        ERR_TYPE_SPECIFIC => "the set is full (hash), or the member is out of its range (bitmap)",
        4353 => "the member does not fit the set's type (hash), or the range is too large (bitmap)",
        4354 => "the protocol is invalid for this set type",
        4355 => "the protocol is missing",
        _ => return std::io::Error::from_raw_os_error(errno).to_string(),
    };
    text.to_string()
}

#[cfg(test)]
mod tests;
