//! Rule expressions: the nf_tables virtual machine's instructions that kube-proxy-style
//! rules are made of, typed, with their netlink encoding and decoding.
//!
//! Expressions pass values through registers: a load (`Payload`, `Meta`, `Ct`, `Numgen`,
//! `Fib`) writes one, `Cmp`/`Lookup`/`Nat`/... read it. A concatenation is consecutive
//! 32-bit registers: load the first field into `Register::r32(0)`, the next into the
//! register after the first field's padded length, and look the first register up in a
//! set whose key is that concatenation. An expression this crate does not know decodes as
//! [`Expr::Other`], so a dump of a foreign rule is still read (and can be recognised as
//! foreign) rather than failing.
//!
//! The types live here; the kernel's wire format is split by direction, because the two
//! directions answer to different readers: [`encode`] writes what this crate's callers
//! built (every field known, nothing to check), [`decode`] reads what the kernel reports
//! (any expression anyone put in a table, lengths and attributes not to be trusted).
//! [`display`] is for people, not the kernel.

use std::time::Duration;

use crate::attr::Malformed;
use crate::objects::{Data, Family, ObjectType, Verdict};

mod attrs;
mod decode;
mod display;
mod encode;

pub(crate) use decode::decode_list;
pub(crate) use encode::encode_list;

/// A register: the verdict register, or one of the sixteen 32-bit data registers.
/// (nft's "reg 1" is `r32(0)`, its "reg 9" is `r32(1)`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Register {
    Verdict,
    R32(u8),
}

impl Register {
    /// The `index`th 32-bit register (0..16).
    pub fn r32(index: u8) -> Self {
        Self::R32(index)
    }

    fn number(self) -> u32 {
        match self {
            Self::Verdict => 0,
            // NFT_REG32_00 = 8.
            Self::R32(index) => 8 + u32::from(index),
        }
    }

    /// The kernel reports 16-byte-aligned registers by their 128-bit number (1..4).
    fn from_number(number: u32) -> Result<Self, Malformed> {
        match number {
            0 => Ok(Self::Verdict),
            1..=4 => Ok(Self::R32(((number - 1) * 4) as u8)),
            8..=23 => Ok(Self::R32((number - 8) as u8)),
            _ => Err(Malformed(format!("register {number}"))),
        }
    }
}

/// Where a payload offset counts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayloadBase {
    Link,
    Network,
    Transport,
}

/// Packet metadata keys (`meta ...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetaKey {
    Len,
    Protocol,
    Mark,
    Iif,
    Oif,
    IifName,
    OifName,
    NfProto,
    L4Proto,
    PktType,
    Other(u32),
}

impl MetaKey {
    fn number(self) -> u32 {
        match self {
            Self::Len => 0,
            Self::Protocol => 1,
            Self::Mark => 3,
            Self::Iif => 4,
            Self::Oif => 5,
            Self::IifName => 6,
            Self::OifName => 7,
            Self::NfProto => 15,
            Self::L4Proto => 16,
            Self::PktType => 19,
            Self::Other(n) => n,
        }
    }

    fn from_number(n: u32) -> Self {
        match n {
            0 => Self::Len,
            1 => Self::Protocol,
            3 => Self::Mark,
            4 => Self::Iif,
            5 => Self::Oif,
            6 => Self::IifName,
            7 => Self::OifName,
            15 => Self::NfProto,
            16 => Self::L4Proto,
            19 => Self::PktType,
            n => Self::Other(n),
        }
    }
}

/// Conntrack keys (`ct ...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CtKey {
    State,
    Direction,
    Status,
    Mark,
    Other(u32),
}

impl CtKey {
    fn number(self) -> u32 {
        match self {
            Self::State => 0,
            Self::Direction => 1,
            Self::Status => 2,
            Self::Mark => 3,
            Self::Other(n) => n,
        }
    }

    fn from_number(n: u32) -> Self {
        match n {
            0 => Self::State,
            1 => Self::Direction,
            2 => Self::Status,
            3 => Self::Mark,
            n => Self::Other(n),
        }
    }
}

/// `ct state` bits (host byte order, 4 bytes).
pub mod ct_state {
    pub const INVALID: u32 = 1;
    pub const ESTABLISHED: u32 = 2;
    pub const RELATED: u32 = 4;
    pub const NEW: u32 = 8;
    pub const UNTRACKED: u32 = 64;
}

/// `ct status` bits (host byte order, 4 bytes).
pub mod ct_status {
    pub const EXPECTED: u32 = 1;
    pub const SEEN_REPLY: u32 = 2;
    pub const ASSURED: u32 = 4;
    pub const CONFIRMED: u32 = 8;
    pub const SNAT: u32 = 0x10;
    pub const DNAT: u32 = 0x20;
}

/// NAT range flags (`NF_NAT_RANGE_*`), for [`Expr::Nat`] and [`Expr::Masquerade`].
pub mod nat_flags {
    pub const MAP_IPS: u32 = 1;
    pub const PROTO_SPECIFIED: u32 = 2;
    pub const PROTO_RANDOM: u32 = 4;
    pub const PERSISTENT: u32 = 8;
    /// `fully-random`.
    pub const PROTO_RANDOM_FULLY: u32 = 0x10;
}

/// `fib` flags (`NFTA_FIB_F_*`).
pub mod fib_flags {
    pub const SADDR: u32 = 1;
    pub const DADDR: u32 = 2;
    pub const MARK: u32 = 4;
    pub const IIF: u32 = 8;
    pub const OIF: u32 = 16;
    pub const PRESENT: u32 = 32;
}

/// `fib ... type` results (`RTN_*`, host byte order, 4 bytes) for `FibResult::AddrType`.
pub mod addr_type {
    pub const UNICAST: u32 = 1;
    pub const LOCAL: u32 = 2;
    pub const BROADCAST: u32 = 3;
    pub const MULTICAST: u32 = 5;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    Neq,
    Lt,
    Lte,
    Gt,
    Gte,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NumgenKind {
    Incremental,
    Random,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NatKind {
    Snat,
    Dnat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectKind {
    /// ICMP (or ICMPv6) unreachable with the family's code.
    IcmpUnreach,
    TcpRst,
    /// ICMPX: the family-independent code (`NFT_REJECT_ICMPX_*`).
    IcmpxUnreach,
}

/// ICMPX codes for [`RejectKind::IcmpxUnreach`].
pub mod icmpx {
    pub const NO_ROUTE: u8 = 0;
    pub const PORT_UNREACH: u8 = 1;
    pub const HOST_UNREACH: u8 = 2;
    pub const ADMIN_PROHIBITED: u8 = 3;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DynsetOp {
    Add,
    Update,
    Delete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FibResult {
    Oif,
    OifName,
    AddrType,
}

/// One expression of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Expr {
    /// Load `len` bytes at `offset` from `base` into `dreg`.
    Payload {
        base: PayloadBase,
        offset: u32,
        len: u32,
        dreg: Register,
    },
    /// Load packet metadata into `dreg`.
    Meta { key: MetaKey, dreg: Register },
    /// Set packet metadata from `sreg` (`meta mark set ...`).
    MetaSet { key: MetaKey, sreg: Register },
    /// Load conntrack data into `dreg` (`direction`: 0 original, 1 reply, for keys that need it).
    Ct {
        key: CtKey,
        dreg: Register,
        direction: Option<u8>,
    },
    /// Compare `sreg` with `data`; the rule stops here unless it holds.
    Cmp {
        op: CmpOp,
        sreg: Register,
        data: Vec<u8>,
    },
    /// `dreg = (sreg & mask) ^ xor` over `mask.len()` bytes.
    Bitwise {
        sreg: Register,
        dreg: Register,
        mask: Vec<u8>,
        xor: Vec<u8>,
    },
    /// Look `sreg` up in `set`: a match (or, with `invert`, a miss) continues the rule; with
    /// `dreg`, the map's data is loaded there (`Register::Verdict` for a verdict map).
    Lookup {
        set: String,
        sreg: Register,
        dreg: Option<Register>,
        invert: bool,
    },
    /// Like [`Expr::Lookup`] in the anonymous map that [`crate::Batch::add_anonymous_map`]
    /// created in the same batch with this `set_id` (nft's `vmap { ... }` inside a rule).
    /// Reads back as a [`Expr::Lookup`] of the kernel's name for it (`__map<n>`).
    AnonymousLookup {
        set_id: u32,
        sreg: Register,
        dreg: Option<Register>,
    },
    /// Load constant data into `dreg`, or a verdict into `Register::Verdict`.
    Immediate { dreg: Register, data: Data },
    /// A number in `offset .. offset + modulus` into `dreg` (host byte order, 4 bytes).
    Numgen {
        kind: NumgenKind,
        modulus: u32,
        offset: u32,
        dreg: Register,
    },
    /// SNAT/DNAT to the address (and port) in registers; `family` is the address family.
    /// For a single address (port) leave the `_max` registers `None` and the flags without
    /// `MAP_IPS`/`PROTO_SPECIFIED`: the kernel implies them, and reads back that way.
    Nat {
        kind: NatKind,
        family: Family,
        addr_min: Option<Register>,
        addr_max: Option<Register>,
        proto_min: Option<Register>,
        proto_max: Option<Register>,
        flags: u32,
    },
    /// Masquerade (`flags` from [`nat_flags`], e.g. fully-random).
    Masquerade { flags: u32 },
    /// Reject with `code` (ICMP code, ignored for TCP reset).
    Reject { kind: RejectKind, code: u8 },
    /// Count packets and bytes (read back with the kernel's current numbers).
    Counter { packets: u64, bytes: u64 },
    /// Add/update/delete the element `sreg_key` (-> `sreg_data`) in `set` from the packet
    /// path, with a `timeout` (the set needs `dynamic` and timeouts).
    Dynset {
        op: DynsetOp,
        set: String,
        sreg_key: Register,
        sreg_data: Option<Register>,
        timeout: Option<Duration>,
    },
    /// The named object `name` of type `kind` of the rule's table does its work on the
    /// packet (`counter name "..."`: the named counter counts it). The object must exist.
    ObjRef { kind: ObjectType, name: String },
    /// Route lookup (`fib daddr type`, ...) into `dreg`.
    Fib {
        flags: u32,
        result: FibResult,
        dreg: Register,
    },
    /// An expression this crate does not model, as the kernel reported it.
    Other { name: String, data: Vec<u8> },
}

impl Expr {
    /// An `immediate` verdict: `jump`, `goto`, `return`, `accept`, `drop`.
    pub fn verdict(verdict: Verdict) -> Self {
        Self::Immediate {
            dreg: Register::Verdict,
            data: Data::Verdict(verdict),
        }
    }

    /// The kernel's name for this expression.
    pub fn name(&self) -> &str {
        match self {
            Self::Payload { .. } => "payload",
            Self::Meta { .. } | Self::MetaSet { .. } => "meta",
            Self::Ct { .. } => "ct",
            Self::Cmp { .. } => "cmp",
            Self::Bitwise { .. } => "bitwise",
            Self::Lookup { .. } | Self::AnonymousLookup { .. } => "lookup",
            Self::Immediate { .. } => "immediate",
            Self::Numgen { .. } => "numgen",
            Self::Nat { .. } => "nat",
            Self::Masquerade { .. } => "masq",
            Self::Reject { .. } => "reject",
            Self::Counter { .. } => "counter",
            Self::Dynset { .. } => "dynset",
            Self::Fib { .. } => "fib",
            Self::ObjRef { .. } => "objref",
            Self::Other { name, .. } => name,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::{Attrs, Writer};

    fn round_trip(exprs: Vec<Expr>) {
        let mut buf = Vec::new();
        encode_list(&mut Writer::new(&mut buf), &exprs);
        let decoded = decode_list(Attrs::new(&buf)).unwrap();
        assert_eq!(decoded, exprs);
    }

    #[test]
    fn every_modelled_expression_decodes_to_what_was_encoded() {
        let r0 = Register::r32(0);
        let r1 = Register::r32(1);
        round_trip(vec![
            Expr::Payload {
                base: PayloadBase::Network,
                offset: 16,
                len: 4,
                dreg: r0,
            },
            Expr::Meta {
                key: MetaKey::L4Proto,
                dreg: r1,
            },
            Expr::MetaSet {
                key: MetaKey::Mark,
                sreg: r0,
            },
            Expr::Ct {
                key: CtKey::Status,
                dreg: r0,
                direction: None,
            },
            Expr::Cmp {
                op: CmpOp::Neq,
                sreg: r0,
                data: vec![0; 4],
            },
            Expr::Bitwise {
                sreg: r0,
                dreg: r0,
                mask: 0x20u32.to_ne_bytes().to_vec(),
                xor: vec![0; 4],
            },
            Expr::Lookup {
                set: "service-ips".into(),
                sreg: r0,
                dreg: Some(Register::Verdict),
                invert: true,
            },
            Expr::verdict(Verdict::Goto("lb-tcp-2".into())),
            Expr::verdict(Verdict::Return),
            Expr::Numgen {
                kind: NumgenKind::Random,
                modulus: 3,
                offset: 0,
                dreg: Register::r32(2),
            },
            Expr::Nat {
                kind: NatKind::Dnat,
                family: Family::Ip6,
                addr_min: Some(r0),
                addr_max: None,
                proto_min: Some(Register::r32(4)),
                proto_max: None,
                flags: 0,
            },
            Expr::Masquerade {
                flags: nat_flags::PROTO_RANDOM_FULLY,
            },
            Expr::Reject {
                kind: RejectKind::IcmpxUnreach,
                code: icmpx::PORT_UNREACH,
            },
            Expr::Counter { packets: 0, bytes: 0 },
            Expr::Dynset {
                op: DynsetOp::Update,
                set: "affinity".into(),
                sreg_key: r0,
                sreg_data: None,
                timeout: Some(Duration::from_secs(10800)),
            },
            Expr::Fib {
                flags: fib_flags::DADDR,
                result: FibResult::AddrType,
                dreg: r0,
            },
            Expr::ObjRef {
                kind: ObjectType::COUNTER,
                name: "localhost-nodeport-rejected-udp".into(),
            },
            Expr::Other {
                name: "log".into(),
                data: vec![],
            },
        ]);
    }

    #[test]
    fn the_kernels_128_bit_register_numbers_read_as_32_bit_registers() {
        assert_eq!(Register::from_number(1).unwrap(), Register::r32(0));
        assert_eq!(Register::from_number(2).unwrap(), Register::r32(4));
        assert_eq!(Register::from_number(9).unwrap(), Register::r32(1));
        assert!(Register::from_number(5).is_err());
        assert!(Register::from_number(24).is_err());
    }
}
