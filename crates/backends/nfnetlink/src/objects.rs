//! The nf_tables objects this crate creates and reads back, at the level of nft's own
//! concepts: families, tables, base and regular chains, sets and maps (with concatenated
//! keys), elements, verdicts. Plain data: nothing here talks to the kernel.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use crate::consts::*;

/// The address family of a table (`nfgenmsg.nfgen_family`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// `ip`: IPv4 only.
    Ip,
    /// `ip6`: IPv6 only.
    Ip6,
    /// `inet`: both (not used by kube-proxy's tables, read back for completeness).
    Inet,
}

impl Family {
    /// The `NFPROTO_*` number.
    pub fn number(self) -> u8 {
        match self {
            Self::Inet => 1,
            Self::Ip => 2,
            Self::Ip6 => 10,
        }
    }

    pub fn from_number(number: u8) -> Option<Self> {
        match number {
            1 => Some(Self::Inet),
            2 => Some(Self::Ip),
            10 => Some(Self::Ip6),
            _ => None,
        }
    }

    /// nft's keyword: `ip`, `ip6`, `inet`.
    pub fn keyword(self) -> &'static str {
        match self {
            Self::Ip => "ip",
            Self::Ip6 => "ip6",
            Self::Inet => "inet",
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.keyword())
    }
}

/// A table by family and name (`ip kube-proxy`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Table {
    pub family: Family,
    pub name: String,
}

impl Table {
    pub fn new(family: Family, name: impl Into<String>) -> Self {
        Self {
            family,
            name: name.into(),
        }
    }
}

impl std::fmt::Display for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.family, self.name)
    }
}

/// A netfilter hook a base chain attaches to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
}

impl Hook {
    pub(crate) fn number(self) -> u32 {
        match self {
            Self::Prerouting => 0,
            Self::Input => 1,
            Self::Forward => 2,
            Self::Output => 3,
            Self::Postrouting => 4,
        }
    }

    pub(crate) fn from_number(number: u32) -> Option<Self> {
        Some(match number {
            0 => Self::Prerouting,
            1 => Self::Input,
            2 => Self::Forward,
            3 => Self::Output,
            4 => Self::Postrouting,
            _ => return None,
        })
    }
}

/// A base chain's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChainType {
    Filter,
    Nat,
    Route,
}

impl ChainType {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Filter => "filter",
            Self::Nat => "nat",
            Self::Route => "route",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "filter" => Self::Filter,
            "nat" => Self::Nat,
            "route" => Self::Route,
            _ => return None,
        })
    }
}

/// What a base chain does with a packet no rule decided on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    Accept,
    Drop,
}

/// Where and how a base chain is attached. nft's named priorities: `dstnat` = -100,
/// `filter` = 0, `srcnat` = 100 (for the ip/ip6 families).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BaseChain {
    pub chain_type: ChainType,
    pub hook: Hook,
    pub priority: i32,
    pub policy: Policy,
}

/// A chain: a base chain when `base` is set, else a regular chain reached by jump/goto.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Chain {
    pub name: String,
    pub base: Option<BaseChain>,
}

impl Chain {
    pub fn regular(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            base: None,
        }
    }

    pub fn base(name: impl Into<String>, base: BaseChain) -> Self {
        Self {
            name: name.into(),
            base: Some(base),
        }
    }
}

/// One field of a set key or map value, with nft's data type (so `nft list` prints the
/// elements as addresses, protocols and ports) and its length in bytes. In a key or value
/// every field takes a whole number of 32-bit registers: see [`Value`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    /// `ipv4_addr`, 4 bytes, network byte order.
    Ipv4Addr,
    /// `ipv6_addr`, 16 bytes, network byte order.
    Ipv6Addr,
    /// `inet_proto`, 1 byte (6 tcp, 17 udp, 132 sctp).
    InetProto,
    /// `inet_service`, 2 bytes, network byte order.
    InetService,
    /// `mark`, 4 bytes, host byte order; also what a `numgen` result looks like.
    Mark,
    /// `ifname`, 16 bytes, NUL-padded.
    IfName,
    /// `integer` of this many bytes, host byte order (nft prints such a field only with
    /// `typeof` user data).
    Integer { bytes: u32 },
}

impl Field {
    /// nft's data type number (`enum datatypes` in nft's datatype.h).
    pub fn type_id(self) -> u32 {
        match self {
            Self::Integer { .. } => 4,
            Self::Ipv4Addr => 7,
            Self::Ipv6Addr => 8,
            Self::InetProto => 12,
            Self::InetService => 13,
            Self::Mark => 19,
            Self::IfName => 41,
        }
    }

    /// The field's own length in bytes (before padding to a register).
    pub fn byte_len(self) -> u32 {
        match self {
            Self::Ipv4Addr | Self::Mark => 4,
            Self::Ipv6Addr | Self::IfName => 16,
            Self::InetProto => 1,
            Self::InetService => 2,
            Self::Integer { bytes } => bytes,
        }
    }

    /// The bytes it takes in a key or value: its length rounded up to 4.
    pub fn padded_len(self) -> u32 {
        self.byte_len().next_multiple_of(4)
    }
}

impl Field {
    /// This field's bytes as nft writes them (`10.96.0.10`, `tcp`, `80`, `0x00004000`);
    /// bytes of the wrong length as hex.
    pub fn render(self, bytes: &[u8]) -> String {
        let own = bytes.get(..self.byte_len() as usize).unwrap_or(bytes);
        match (self, own) {
            (Self::Ipv4Addr, &[a, b, c, d]) => Ipv4Addr::new(a, b, c, d).to_string(),
            (Self::Ipv6Addr, bytes) if bytes.len() == 16 => {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(bytes);
                Ipv6Addr::from(octets).to_string()
            }
            (Self::InetProto, &[6]) => "tcp".into(),
            (Self::InetProto, &[17]) => "udp".into(),
            (Self::InetProto, &[132]) => "sctp".into(),
            (Self::InetProto, &[n]) => n.to_string(),
            (Self::InetService, &[hi, lo]) => u16::from_be_bytes([hi, lo]).to_string(),
            (Self::Mark, &[a, b, c, d]) => format!("0x{:08x}", u32::from_ne_bytes([a, b, c, d])),
            (Self::IfName, bytes) => {
                String::from_utf8_lossy(bytes.split(|b| *b == 0).next().unwrap_or_default()).into_owned()
            }
            (_, bytes) => hex(bytes),
        }
    }
}

/// `0x` and the bytes in order.
fn hex(bytes: &[u8]) -> String {
    let digits: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("0x{digits}")
}

/// A key or value of `fields` as nft writes it (`10.96.0.10 . tcp . 80`): each field from
/// its padded slot; bytes that do not fit `fields` as hex.
pub fn render(fields: &[Field], bytes: &[u8]) -> String {
    let expected: usize = fields.iter().map(|f| f.padded_len() as usize).sum();
    if fields.is_empty() || bytes.len() != expected {
        return hex(bytes);
    }
    let mut parts = Vec::with_capacity(fields.len());
    let mut rest = bytes;
    for field in fields {
        let (slot, tail) = rest.split_at(field.padded_len() as usize);
        parts.push(field.render(slot));
        rest = tail;
    }
    parts.join(" . ")
}

/// nft's number for a concatenation of types: 6 bits per field, the first field highest.
fn concat_type(fields: &[Field]) -> u32 {
    fields
        .iter()
        .fold(0u32, |acc, field| (acc << 6) | field.type_id())
}

fn concat_len(fields: &[Field]) -> u32 {
    fields.iter().map(|f| f.padded_len()).sum()
}

/// What a map maps to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SetData {
    /// A verdict map (`vmap`): elements carry a [`Verdict`].
    Verdict,
    /// A data map: elements carry a value of these fields (e.g. `ipv4_addr . inet_service`
    /// for a DNAT destination).
    Value(Vec<Field>),
}

/// A named set, or a map when `data` is set.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Set {
    pub name: String,
    /// One field, or several for a concatenated key (`a . b . c`).
    pub key: Vec<Field>,
    pub data: Option<SetData>,
    /// `flags interval`: elements are ranges (prefixes). With a concatenated key the
    /// kernel picks its pipapo backend and elements carry `key_end`.
    pub interval: bool,
    /// `flags timeout`: elements may expire; `timeout` is the default for new elements.
    pub timeouts: bool,
    pub timeout: Option<Duration>,
    /// `flags dynamic`: rules may add or update elements (`dynset`, e.g. affinity).
    pub dynamic: bool,
    /// `size`: the most elements the set may hold (the kernel gives dynamic sets 65535
    /// when none is set; updates from the packet path fail silently beyond it).
    pub size: Option<u32>,
    /// Opaque user data (nft keeps its `typeof` and byte-order hints here).
    pub userdata: Vec<u8>,
}

impl Set {
    /// A set of `key` with no flags.
    pub fn new(name: impl Into<String>, key: Vec<Field>) -> Self {
        Self {
            name: name.into(),
            key,
            data: None,
            interval: false,
            timeouts: false,
            timeout: None,
            dynamic: false,
            size: None,
            userdata: Vec::new(),
        }
    }

    /// A map from `key` to `data`.
    pub fn map(name: impl Into<String>, key: Vec<Field>, data: SetData) -> Self {
        Self {
            data: Some(data),
            ..Self::new(name, key)
        }
    }

    /// `NFTA_SET_KEY_TYPE` as nft writes it.
    pub fn key_type(&self) -> u32 {
        concat_type(&self.key)
    }

    /// `NFTA_SET_KEY_LEN`: every field padded to 4 bytes.
    pub fn key_len(&self) -> u32 {
        concat_len(&self.key)
    }

    /// `NFTA_SET_DATA_TYPE` and `NFTA_SET_DATA_LEN`, for a map.
    pub fn data_type_len(&self) -> Option<(u32, u32)> {
        match &self.data {
            None => None,
            Some(SetData::Verdict) => Some((NFT_DATA_VERDICT, 0)),
            Some(SetData::Value(fields)) => Some((concat_type(fields), concat_len(fields))),
        }
    }

    /// `NFTA_SET_FLAGS`.
    pub fn flags(&self) -> u32 {
        let mut flags = 0;
        if self.data.is_some() {
            flags |= NFT_SET_MAP;
        }
        if self.interval {
            flags |= NFT_SET_INTERVAL;
            if self.key.len() > 1 {
                flags |= NFT_SET_CONCAT;
            }
        }
        if self.timeouts || self.timeout.is_some() {
            flags |= NFT_SET_TIMEOUT;
        }
        if self.dynamic {
            flags |= NFT_SET_EVAL;
        }
        flags
    }
}

/// The type of a stateful object (`NFTA_OBJ_TYPE`, the kernel's `NFT_OBJECT_*`). This
/// crate creates counters only; a dump reports any type, and an object of any type can be
/// deleted by its handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectType(pub u32);

impl ObjectType {
    /// `NFT_OBJECT_COUNTER`: `nft add counter`, referenced by `counter name "..."`.
    pub const COUNTER: Self = Self(1);

    /// nft's keyword for the type (`counter`, `quota`, `ct helper`, ...), `None` for a type
    /// this crate does not know.
    pub fn keyword(self) -> Option<&'static str> {
        Some(match self.0 {
            1 => "counter",
            2 => "quota",
            3 => "ct helper",
            4 => "limit",
            7 => "ct timeout",
            8 => "secmark",
            9 => "ct expectation",
            10 => "synproxy",
            _ => return None,
        })
    }

    /// The type nft's `keyword` names (as [`ObjectType::keyword`] spells it).
    pub fn from_keyword(keyword: &str) -> Option<Self> {
        (1..=10).map(Self).find(|kind| kind.keyword() == Some(keyword))
    }
}

impl std::fmt::Display for ObjectType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.keyword() {
            Some(keyword) => f.write_str(keyword),
            None => write!(f, "object type {}", self.0),
        }
    }
}

/// A named counter's numbers, as the kernel reports them (and as a new one starts: zero).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Counter {
    pub packets: u64,
    pub bytes: u64,
}

/// A verdict, in a rule (`immediate`) or as a verdict map's element data.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Verdict {
    Accept,
    Drop,
    Continue,
    Return,
    Jump(String),
    Goto(String),
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Accept => f.write_str("accept"),
            Self::Drop => f.write_str("drop"),
            Self::Continue => f.write_str("continue"),
            Self::Return => f.write_str("return"),
            Self::Jump(chain) => write!(f, "jump {chain}"),
            Self::Goto(chain) => write!(f, "goto {chain}"),
        }
    }
}

impl Verdict {
    pub(crate) fn code(&self) -> i32 {
        match self {
            Self::Accept => NF_ACCEPT,
            Self::Drop => NF_DROP,
            Self::Continue => NFT_CONTINUE,
            Self::Return => NFT_RETURN,
            Self::Jump(_) => NFT_JUMP,
            Self::Goto(_) => NFT_GOTO,
        }
    }

    pub(crate) fn chain(&self) -> Option<&str> {
        match self {
            Self::Jump(chain) | Self::Goto(chain) => Some(chain),
            _ => None,
        }
    }
}

/// Register contents or element data: raw bytes or a verdict.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Data {
    Value(Vec<u8>),
    Verdict(Verdict),
}

/// A set or map element.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Element {
    /// The key, laid out as [`Value`] builds it.
    pub key: Vec<u8>,
    /// The end of a range, for interval sets with a concatenated key.
    pub key_end: Option<Vec<u8>>,
    /// A map element's data.
    pub data: Option<Data>,
    /// This element's timeout (sets with timeouts); `None` takes the set's default.
    pub timeout: Option<Duration>,
    /// Read back only: time left before the element expires.
    pub expiration: Option<Duration>,
    /// For interval sets with a single-field key: this element closes the range that the
    /// previous one opened.
    pub interval_end: bool,
    /// Opaque user data kept with the element (nft keeps its comment there: see
    /// [`comment_userdata`]).
    pub userdata: Vec<u8>,
}

/// nft's user data for a comment on a table, set element or rule: one TLV of type 0 (the
/// comment, for each of them), the text and its NUL. `None` when the text cannot be one
/// (a NUL inside, or longer than the 127 bytes nft allows).
pub fn comment_userdata(text: &str) -> Option<Vec<u8>> {
    if text.contains('\0') || text.len() > 127 {
        return None;
    }
    let mut out = vec![0, text.len() as u8 + 1];
    out.extend_from_slice(text.as_bytes());
    out.push(0);
    Some(out)
}

impl Element {
    /// A set element.
    pub fn key(key: Vec<u8>) -> Self {
        Self {
            key,
            key_end: None,
            data: None,
            timeout: None,
            expiration: None,
            interval_end: false,
            userdata: Vec::new(),
        }
    }

    /// A data map element.
    pub fn mapping(key: Vec<u8>, value: Vec<u8>) -> Self {
        Self {
            data: Some(Data::Value(value)),
            ..Self::key(key)
        }
    }

    /// A verdict map element.
    pub fn verdict(key: Vec<u8>, verdict: Verdict) -> Self {
        Self {
            data: Some(Data::Verdict(verdict)),
            ..Self::key(key)
        }
    }

    /// A range `key ..= key_end` in an interval set with a concatenated key.
    pub fn range(key: Vec<u8>, key_end: Vec<u8>) -> Self {
        Self {
            key_end: Some(key_end),
            ..Self::key(key)
        }
    }
}

/// Builds a key or value the way the kernel compares it: the concatenation of fields, each
/// padded with zeros to a multiple of 4 bytes (one or more 32-bit registers), addresses and
/// ports in network byte order, marks and numgen slots in host byte order.
///
/// `Value::new().ipv4(vip).proto(6).port(80).build()` is the key of
/// `ipv4_addr . inet_proto . inet_service`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Value(Vec<u8>);

impl Value {
    pub fn new() -> Self {
        Self(Vec::with_capacity(16))
    }

    pub fn ipv4(mut self, address: Ipv4Addr) -> Self {
        self.0.extend_from_slice(&address.octets());
        self
    }

    pub fn ipv6(mut self, address: Ipv6Addr) -> Self {
        self.0.extend_from_slice(&address.octets());
        self
    }

    /// An `inet_proto` field: one byte, then 3 bytes of padding.
    pub fn proto(mut self, protocol: u8) -> Self {
        self.0.extend_from_slice(&[protocol, 0, 0, 0]);
        self
    }

    /// An `inet_service` field: the port big-endian, then 2 bytes of padding.
    pub fn port(mut self, port: u16) -> Self {
        self.0.extend_from_slice(&port.to_be_bytes());
        self.0.extend_from_slice(&[0, 0]);
        self
    }

    /// A 32-bit field in host byte order: a mark, or a `numgen` result (an endpoint slot).
    pub fn host_u32(mut self, value: u32) -> Self {
        self.0.extend_from_slice(&value.to_ne_bytes());
        self
    }

    /// An `ifname` field: the name NUL-padded to 16 bytes (longer names are cut).
    pub fn ifname(mut self, name: &str) -> Self {
        let mut field = [0u8; 16];
        let bytes = name.as_bytes();
        let len = bytes.len().min(15);
        field[..len].copy_from_slice(&bytes[..len]);
        self.0.extend_from_slice(&field);
        self
    }

    pub fn build(self) -> Vec<u8> {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concatenated_keys_take_whole_registers_and_nfts_type_numbers() {
        let set = Set::map(
            "service-ips",
            vec![Field::Ipv4Addr, Field::InetProto, Field::InetService],
            SetData::Verdict,
        );
        assert_eq!(set.key_len(), 12);
        assert_eq!(set.key_type(), (7 << 12) | (12 << 6) | 13);
        assert_eq!(set.data_type_len(), Some((NFT_DATA_VERDICT, 0)));
        assert_eq!(set.flags(), NFT_SET_MAP);

        let key = Value::new()
            .ipv4(Ipv4Addr::new(10, 96, 0, 10))
            .proto(6)
            .port(80)
            .build();
        assert_eq!(key, [10, 96, 0, 10, 6, 0, 0, 0, 0, 80, 0, 0]);
    }

    #[test]
    fn keys_and_values_render_as_nft_writes_them() {
        let key = Value::new()
            .ipv4(Ipv4Addr::new(10, 96, 0, 10))
            .proto(6)
            .port(80)
            .build();
        let fields = [Field::Ipv4Addr, Field::InetProto, Field::InetService];
        assert_eq!(render(&fields, &key), "10.96.0.10 . tcp . 80");
        let slot = Value::new()
            .ipv6("fd00::1".parse().unwrap())
            .port(53)
            .host_u32(2)
            .build();
        assert_eq!(
            render(&[Field::Ipv6Addr, Field::InetService, Field::Mark], &slot),
            "fd00::1 . 53 . 0x00000002"
        );
        assert_eq!(render(&fields, &[1, 2]), "0x0102", "a length mismatch is hex");
        assert_eq!(Verdict::Goto("lb-tcp-2".into()).to_string(), "goto lb-tcp-2");
    }

    #[test]
    fn an_ipv6_endpoint_map_is_24_bytes_of_key_and_20_of_value() {
        let set = Set::map(
            "service-endpoints-tcp",
            vec![Field::Ipv6Addr, Field::InetService, Field::Mark],
            SetData::Value(vec![Field::Ipv6Addr, Field::InetService]),
        );
        assert_eq!(set.key_len(), 24);
        assert_eq!(set.data_type_len().map(|(_, len)| len), Some(20));
    }

    #[test]
    fn interval_sets_with_concatenated_keys_are_flagged_concat() {
        let mut set = Set::new("ranges", vec![Field::Ipv4Addr, Field::Ipv4Addr]);
        set.interval = true;
        set.timeout = Some(Duration::from_secs(1));
        assert_eq!(set.flags(), NFT_SET_INTERVAL | NFT_SET_CONCAT | NFT_SET_TIMEOUT);
    }
}
