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

use std::time::Duration;

use crate::attr::{Attrs, Malformed, Writer};
use crate::consts::{NFTA_DATA_VALUE, NFTA_EXPR_DATA, NFTA_EXPR_NAME, NFTA_LIST_ELEM};
use crate::objects::{Data, Family, Verdict};
use crate::wire::{decode_data, encode_data};

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
            Self::Other { name, .. } => name,
        }
    }
}

// === impl Display: one line per expression, for `explain` and error reports ===

impl std::fmt::Display for Register {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Verdict => f.write_str("verdict"),
            Self::R32(index) => write!(f, "r{index}"),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    let digits: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("0x{digits}")
}

impl std::fmt::Display for Expr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Payload {
                base,
                offset,
                len,
                dreg,
            } => write!(f, "load {len}b @ {base:?} header + {offset} => {dreg}"),
            Self::Meta { key, dreg } => write!(f, "load meta {key:?} => {dreg}"),
            Self::MetaSet { key, sreg } => write!(f, "set meta {key:?} <= {sreg}"),
            Self::Ct { key, dreg, .. } => write!(f, "load ct {key:?} => {dreg}"),
            Self::Cmp { op, sreg, data } => write!(f, "{sreg} {op:?} {}", hex(data)),
            Self::Bitwise {
                sreg,
                dreg,
                mask,
                xor,
            } => write!(f, "{dreg} = ({sreg} & {}) ^ {}", hex(mask), hex(xor)),
            Self::Lookup {
                set,
                sreg,
                dreg,
                invert,
            } => {
                let not = if *invert { "not " } else { "" };
                write!(f, "{sreg} {not}in @{set}")?;
                match dreg {
                    Some(dreg) => write!(f, " => {dreg}"),
                    None => Ok(()),
                }
            }
            Self::AnonymousLookup { set_id, sreg, dreg } => {
                write!(f, "{sreg} in anonymous set {set_id}")?;
                match dreg {
                    Some(dreg) => write!(f, " => {dreg}"),
                    None => Ok(()),
                }
            }
            Self::Immediate {
                data: Data::Verdict(verdict),
                ..
            } => write!(f, "{verdict}"),
            Self::Immediate {
                dreg,
                data: Data::Value(bytes),
            } => write!(f, "load {} => {dreg}", hex(bytes)),
            Self::Numgen {
                kind,
                modulus,
                offset,
                dreg,
            } => write!(f, "numgen {kind:?} mod {modulus} offset {offset} => {dreg}"),
            Self::Nat {
                kind,
                family,
                addr_min,
                proto_min,
                flags,
                ..
            } => {
                write!(f, "{kind:?} {family}")?;
                if let Some(addr) = addr_min {
                    write!(f, " addr {addr}")?;
                }
                if let Some(port) = proto_min {
                    write!(f, " port {port}")?;
                }
                if *flags != 0 {
                    write!(f, " flags {flags:#x}")?;
                }
                Ok(())
            }
            Self::Masquerade { flags } if *flags & nat_flags::PROTO_RANDOM_FULLY != 0 => {
                f.write_str("masquerade fully-random")
            }
            Self::Masquerade { .. } => f.write_str("masquerade"),
            Self::Reject { kind, code } => write!(f, "reject {kind:?} code {code}"),
            Self::Counter { packets, bytes } => write!(f, "counter packets {packets} bytes {bytes}"),
            Self::Dynset {
                op,
                set,
                sreg_key,
                sreg_data,
                timeout,
            } => {
                write!(f, "{op:?} @{set} key {sreg_key}")?;
                if let Some(data) = sreg_data {
                    write!(f, " data {data}")?;
                }
                if let Some(timeout) = timeout {
                    write!(f, " timeout {}s", timeout.as_secs())?;
                }
                Ok(())
            }
            Self::Fib { flags, result, dreg } => write!(f, "fib flags {flags:#x} {result:?} => {dreg}"),
            Self::Other { name, data } => write!(f, "{name} ({} bytes)", data.len()),
        }
    }
}

// Attribute numbers of each expression's NFTA_EXPR_DATA.
mod attrs {
    pub const PAYLOAD_DREG: u16 = 1;
    pub const PAYLOAD_BASE: u16 = 2;
    pub const PAYLOAD_OFFSET: u16 = 3;
    pub const PAYLOAD_LEN: u16 = 4;
    pub const META_DREG: u16 = 1;
    pub const META_KEY: u16 = 2;
    pub const META_SREG: u16 = 3;
    pub const CT_DREG: u16 = 1;
    pub const CT_KEY: u16 = 2;
    pub const CT_DIRECTION: u16 = 3;
    pub const CMP_SREG: u16 = 1;
    pub const CMP_OP: u16 = 2;
    pub const CMP_DATA: u16 = 3;
    pub const BITWISE_SREG: u16 = 1;
    pub const BITWISE_DREG: u16 = 2;
    pub const BITWISE_LEN: u16 = 3;
    pub const BITWISE_MASK: u16 = 4;
    pub const BITWISE_XOR: u16 = 5;
    pub const LOOKUP_SET: u16 = 1;
    pub const LOOKUP_SREG: u16 = 2;
    pub const LOOKUP_DREG: u16 = 3;
    pub const LOOKUP_SET_ID: u16 = 4;
    pub const LOOKUP_FLAGS: u16 = 5;
    pub const IMMEDIATE_DREG: u16 = 1;
    pub const IMMEDIATE_DATA: u16 = 2;
    pub const NG_DREG: u16 = 1;
    pub const NG_MODULUS: u16 = 2;
    pub const NG_TYPE: u16 = 3;
    pub const NG_OFFSET: u16 = 4;
    pub const NAT_TYPE: u16 = 1;
    pub const NAT_FAMILY: u16 = 2;
    pub const NAT_REG_ADDR_MIN: u16 = 3;
    pub const NAT_REG_ADDR_MAX: u16 = 4;
    pub const NAT_REG_PROTO_MIN: u16 = 5;
    pub const NAT_REG_PROTO_MAX: u16 = 6;
    pub const NAT_FLAGS: u16 = 7;
    pub const MASQ_FLAGS: u16 = 1;
    pub const REJECT_TYPE: u16 = 1;
    pub const REJECT_ICMP_CODE: u16 = 2;
    pub const COUNTER_BYTES: u16 = 1;
    pub const COUNTER_PACKETS: u16 = 2;
    pub const DYNSET_SET_NAME: u16 = 1;
    pub const DYNSET_OP: u16 = 3;
    pub const DYNSET_SREG_KEY: u16 = 4;
    pub const DYNSET_SREG_DATA: u16 = 5;
    pub const DYNSET_TIMEOUT: u16 = 6;
    pub const FIB_DREG: u16 = 1;
    pub const FIB_RESULT: u16 = 2;
    pub const FIB_FLAGS: u16 = 3;
}
use attrs::*;

/// Writes `exprs` as the elements of an `NFTA_RULE_EXPRESSIONS` list.
pub(crate) fn encode_list(w: &mut Writer<'_>, exprs: &[Expr]) {
    for expr in exprs {
        let elem = w.begin(NFTA_LIST_ELEM);
        w.string(NFTA_EXPR_NAME, expr.name());
        if let Expr::Other { data, .. } = expr {
            w.bytes(NFTA_EXPR_DATA, data);
        } else {
            let nest = w.begin(NFTA_EXPR_DATA);
            encode(w, expr);
            w.end(nest);
        }
        w.end(elem);
    }
}

fn value(w: &mut Writer<'_>, kind: u16, bytes: &[u8]) {
    let nest = w.begin(kind);
    w.bytes(NFTA_DATA_VALUE, bytes);
    w.end(nest);
}

fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn encode(w: &mut Writer<'_>, expr: &Expr) {
    match expr {
        Expr::Payload {
            base,
            offset,
            len,
            dreg,
        } => {
            w.u32(PAYLOAD_DREG, dreg.number());
            let base = match base {
                PayloadBase::Link => 0,
                PayloadBase::Network => 1,
                PayloadBase::Transport => 2,
            };
            w.u32(PAYLOAD_BASE, base);
            w.u32(PAYLOAD_OFFSET, *offset);
            w.u32(PAYLOAD_LEN, *len);
        }
        Expr::Meta { key, dreg } => {
            w.u32(META_KEY, key.number());
            w.u32(META_DREG, dreg.number());
        }
        Expr::MetaSet { key, sreg } => {
            w.u32(META_KEY, key.number());
            w.u32(META_SREG, sreg.number());
        }
        Expr::Ct { key, dreg, direction } => {
            w.u32(CT_KEY, key.number());
            w.u32(CT_DREG, dreg.number());
            if let Some(direction) = direction {
                w.bytes(CT_DIRECTION, &[*direction]);
            }
        }
        Expr::Cmp { op, sreg, data } => {
            w.u32(CMP_SREG, sreg.number());
            let op = match op {
                CmpOp::Eq => 0,
                CmpOp::Neq => 1,
                CmpOp::Lt => 2,
                CmpOp::Lte => 3,
                CmpOp::Gt => 4,
                CmpOp::Gte => 5,
            };
            w.u32(CMP_OP, op);
            value(w, CMP_DATA, data);
        }
        Expr::Bitwise {
            sreg,
            dreg,
            mask,
            xor,
        } => {
            w.u32(BITWISE_SREG, sreg.number());
            w.u32(BITWISE_DREG, dreg.number());
            w.u32(BITWISE_LEN, mask.len() as u32);
            value(w, BITWISE_MASK, mask);
            value(w, BITWISE_XOR, xor);
        }
        Expr::Lookup {
            set,
            sreg,
            dreg,
            invert,
        } => {
            w.string(LOOKUP_SET, set);
            w.u32(LOOKUP_SREG, sreg.number());
            if let Some(dreg) = dreg {
                w.u32(LOOKUP_DREG, dreg.number());
            }
            if *invert {
                w.u32(LOOKUP_FLAGS, 1);
            }
        }
        Expr::AnonymousLookup { set_id, sreg, dreg } => {
            w.string(LOOKUP_SET, crate::batch::ANONYMOUS_MAP_NAME);
            w.u32(LOOKUP_SET_ID, *set_id);
            w.u32(LOOKUP_SREG, sreg.number());
            if let Some(dreg) = dreg {
                w.u32(LOOKUP_DREG, dreg.number());
            }
        }
        Expr::Immediate { dreg, data } => {
            w.u32(IMMEDIATE_DREG, dreg.number());
            encode_data(w, IMMEDIATE_DATA, data);
        }
        Expr::Numgen {
            kind,
            modulus,
            offset,
            dreg,
        } => {
            w.u32(NG_DREG, dreg.number());
            w.u32(NG_MODULUS, *modulus);
            w.u32(NG_TYPE, matches!(kind, NumgenKind::Random).into());
            w.u32(NG_OFFSET, *offset);
        }
        Expr::Nat {
            kind,
            family,
            addr_min,
            addr_max,
            proto_min,
            proto_max,
            flags,
        } => {
            w.u32(NAT_TYPE, matches!(kind, NatKind::Dnat).into());
            w.u32(NAT_FAMILY, family.number().into());
            let registers = [
                (NAT_REG_ADDR_MIN, addr_min),
                (NAT_REG_ADDR_MAX, addr_max),
                (NAT_REG_PROTO_MIN, proto_min),
                (NAT_REG_PROTO_MAX, proto_max),
            ];
            for (kind, register) in registers {
                if let Some(register) = register {
                    w.u32(kind, register.number());
                }
            }
            if *flags != 0 {
                w.u32(NAT_FLAGS, *flags);
            }
        }
        Expr::Masquerade { flags } => {
            if *flags != 0 {
                w.u32(MASQ_FLAGS, *flags);
            }
        }
        Expr::Reject { kind, code } => {
            let kind = match kind {
                RejectKind::IcmpUnreach => 0,
                RejectKind::TcpRst => 1,
                RejectKind::IcmpxUnreach => 2,
            };
            w.u32(REJECT_TYPE, kind);
            w.bytes(REJECT_ICMP_CODE, &[*code]);
        }
        Expr::Counter { packets, bytes } => {
            w.u64(COUNTER_BYTES, *bytes);
            w.u64(COUNTER_PACKETS, *packets);
        }
        Expr::Dynset {
            op,
            set,
            sreg_key,
            sreg_data,
            timeout,
        } => {
            w.string(DYNSET_SET_NAME, set);
            let op = match op {
                DynsetOp::Add => 0,
                DynsetOp::Update => 1,
                DynsetOp::Delete => 2,
            };
            w.u32(DYNSET_OP, op);
            w.u32(DYNSET_SREG_KEY, sreg_key.number());
            if let Some(sreg_data) = sreg_data {
                w.u32(DYNSET_SREG_DATA, sreg_data.number());
            }
            if let Some(timeout) = timeout {
                w.u64(DYNSET_TIMEOUT, duration_ms(*timeout));
            }
        }
        Expr::Fib { flags, result, dreg } => {
            w.u32(FIB_DREG, dreg.number());
            let result = match result {
                FibResult::Oif => 1,
                FibResult::OifName => 2,
                FibResult::AddrType => 3,
            };
            w.u32(FIB_RESULT, result);
            w.u32(FIB_FLAGS, *flags);
        }
        Expr::Other { .. } => {}
    }
}

/// Reads the expressions of an `NFTA_RULE_EXPRESSIONS` list.
pub(crate) fn decode_list(list: Attrs<'_>) -> Result<Vec<Expr>, Malformed> {
    let mut exprs = Vec::new();
    for elem in list {
        let mut name = None;
        let mut data: &[u8] = &[];
        for attr in elem?.nested() {
            let attr = attr?;
            match attr.kind {
                NFTA_EXPR_NAME => name = Some(attr.string()?),
                NFTA_EXPR_DATA => data = attr.value,
                _ => {}
            }
        }
        let name = name.ok_or_else(|| Malformed("an expression without a name".into()))?;
        exprs.push(decode(&name, data)?);
    }
    Ok(exprs)
}

/// The attributes of one expression by number, each at most once.
struct Fields<'a>(Vec<(u16, crate::attr::Attr<'a>)>);

impl<'a> Fields<'a> {
    fn read(data: &'a [u8]) -> Result<Self, Malformed> {
        let mut fields = Vec::new();
        for attr in Attrs::new(data) {
            let attr = attr?;
            fields.push((attr.kind, attr));
        }
        Ok(Self(fields))
    }

    fn get(&self, kind: u16) -> Option<crate::attr::Attr<'a>> {
        self.0.iter().find(|(k, _)| *k == kind).map(|(_, a)| *a)
    }

    fn u32(&self, kind: u16, expr: &str) -> Result<u32, Malformed> {
        self.get(kind)
            .ok_or_else(|| Malformed(format!("{expr} without attribute {kind}")))?
            .u32()
    }

    fn opt_u32(&self, kind: u16) -> Result<Option<u32>, Malformed> {
        self.get(kind).map(|a| a.u32()).transpose()
    }

    fn register(&self, kind: u16, expr: &str) -> Result<Register, Malformed> {
        Register::from_number(self.u32(kind, expr)?)
    }

    fn opt_register(&self, kind: u16) -> Result<Option<Register>, Malformed> {
        self.opt_u32(kind)?.map(Register::from_number).transpose()
    }

    fn string(&self, kind: u16, expr: &str) -> Result<String, Malformed> {
        self.get(kind)
            .ok_or_else(|| Malformed(format!("{expr} without attribute {kind}")))?
            .string()
    }

    /// A nested `NFTA_DATA_VALUE`.
    fn value(&self, kind: u16, expr: &str) -> Result<Vec<u8>, Malformed> {
        let attr = self
            .get(kind)
            .ok_or_else(|| Malformed(format!("{expr} without attribute {kind}")))?;
        match decode_data(attr.nested())? {
            Data::Value(bytes) => Ok(bytes),
            Data::Verdict(_) => Err(Malformed(format!("{expr}: a verdict where data was expected"))),
        }
    }

    fn byte(&self, kind: u16) -> Option<u8> {
        self.get(kind).and_then(|a| a.value.first().copied())
    }
}

fn decode(name: &str, data: &[u8]) -> Result<Expr, Malformed> {
    let f = Fields::read(data)?;
    let expr = match name {
        "payload" => Expr::Payload {
            base: match f.u32(PAYLOAD_BASE, name)? {
                0 => PayloadBase::Link,
                1 => PayloadBase::Network,
                2 => PayloadBase::Transport,
                other => return Err(Malformed(format!("payload base {other}"))),
            },
            offset: f.u32(PAYLOAD_OFFSET, name)?,
            len: f.u32(PAYLOAD_LEN, name)?,
            // A payload write (checksum update) has no dreg: not ours, kept as Other.
            dreg: match f.opt_register(PAYLOAD_DREG)? {
                Some(dreg) => dreg,
                None => return Ok(other(name, data)),
            },
        },
        "meta" => {
            let key = MetaKey::from_number(f.u32(META_KEY, name)?);
            match (f.opt_register(META_DREG)?, f.opt_register(META_SREG)?) {
                (Some(dreg), _) => Expr::Meta { key, dreg },
                (None, Some(sreg)) => Expr::MetaSet { key, sreg },
                (None, None) => return Err(Malformed("meta without a register".into())),
            }
        }
        "ct" => match f.opt_register(CT_DREG)? {
            Some(dreg) => Expr::Ct {
                key: CtKey::from_number(f.u32(CT_KEY, name)?),
                dreg,
                direction: f.byte(CT_DIRECTION),
            },
            None => return Ok(other(name, data)),
        },
        "cmp" => Expr::Cmp {
            op: match f.u32(CMP_OP, name)? {
                0 => CmpOp::Eq,
                1 => CmpOp::Neq,
                2 => CmpOp::Lt,
                3 => CmpOp::Lte,
                4 => CmpOp::Gt,
                5 => CmpOp::Gte,
                other => return Err(Malformed(format!("cmp op {other}"))),
            },
            sreg: f.register(CMP_SREG, name)?,
            data: f.value(CMP_DATA, name)?,
        },
        // Shifts (NFTA_BITWISE_OP != 0) are not ours.
        "bitwise" if f.opt_u32(6)?.unwrap_or(0) == 0 => Expr::Bitwise {
            sreg: f.register(BITWISE_SREG, name)?,
            dreg: f.register(BITWISE_DREG, name)?,
            mask: f.value(BITWISE_MASK, name)?,
            xor: f.value(BITWISE_XOR, name)?,
        },
        "lookup" => Expr::Lookup {
            set: f.string(LOOKUP_SET, name)?,
            sreg: f.register(LOOKUP_SREG, name)?,
            dreg: f.opt_register(LOOKUP_DREG)?,
            invert: f.opt_u32(LOOKUP_FLAGS)?.unwrap_or(0) & 1 != 0,
        },
        "immediate" => Expr::Immediate {
            dreg: f.register(IMMEDIATE_DREG, name)?,
            data: decode_data(
                f.get(IMMEDIATE_DATA)
                    .ok_or_else(|| Malformed("immediate without data".into()))?
                    .nested(),
            )?,
        },
        "numgen" => Expr::Numgen {
            kind: if f.u32(NG_TYPE, name)? == 1 {
                NumgenKind::Random
            } else {
                NumgenKind::Incremental
            },
            modulus: f.u32(NG_MODULUS, name)?,
            offset: f.opt_u32(NG_OFFSET)?.unwrap_or(0),
            dreg: f.register(NG_DREG, name)?,
        },
        "nat" => {
            // The kernel fills in what a range implies: max = min, and the MAP_IPS and
            // PROTO_SPECIFIED flags. Read back without them, so a rule reads as it was built.
            let addr_min = f.opt_register(NAT_REG_ADDR_MIN)?;
            let proto_min = f.opt_register(NAT_REG_PROTO_MIN)?;
            let mut flags = f.opt_u32(NAT_FLAGS)?.unwrap_or(0);
            if addr_min.is_some() {
                flags &= !nat_flags::MAP_IPS;
            }
            if proto_min.is_some() {
                flags &= !nat_flags::PROTO_SPECIFIED;
            }
            Expr::Nat {
                kind: if f.u32(NAT_TYPE, name)? == 1 {
                    NatKind::Dnat
                } else {
                    NatKind::Snat
                },
                family: Family::from_number(f.u32(NAT_FAMILY, name)? as u8)
                    .ok_or_else(|| Malformed("nat family".into()))?,
                addr_min,
                addr_max: f
                    .opt_register(NAT_REG_ADDR_MAX)?
                    .filter(|max| Some(*max) != addr_min),
                proto_min,
                proto_max: f
                    .opt_register(NAT_REG_PROTO_MAX)?
                    .filter(|max| Some(*max) != proto_min),
                flags,
            }
        }
        "masq" => Expr::Masquerade {
            flags: f.opt_u32(MASQ_FLAGS)?.unwrap_or(0),
        },
        "reject" => Expr::Reject {
            kind: match f.u32(REJECT_TYPE, name)? {
                0 => RejectKind::IcmpUnreach,
                1 => RejectKind::TcpRst,
                2 => RejectKind::IcmpxUnreach,
                other => return Err(Malformed(format!("reject type {other}"))),
            },
            code: f.byte(REJECT_ICMP_CODE).unwrap_or(0),
        },
        "counter" => Expr::Counter {
            bytes: f.get(COUNTER_BYTES).map(|a| a.u64()).transpose()?.unwrap_or(0),
            packets: f.get(COUNTER_PACKETS).map(|a| a.u64()).transpose()?.unwrap_or(0),
        },
        "dynset" => Expr::Dynset {
            op: match f.u32(DYNSET_OP, name)? {
                0 => DynsetOp::Add,
                1 => DynsetOp::Update,
                2 => DynsetOp::Delete,
                other => return Err(Malformed(format!("dynset op {other}"))),
            },
            set: f.string(DYNSET_SET_NAME, name)?,
            sreg_key: f.register(DYNSET_SREG_KEY, name)?,
            sreg_data: f.opt_register(DYNSET_SREG_DATA)?,
            timeout: f
                .get(DYNSET_TIMEOUT)
                .map(|a| a.u64())
                .transpose()?
                .filter(|ms| *ms != 0)
                .map(Duration::from_millis),
        },
        "fib" => Expr::Fib {
            flags: f.u32(FIB_FLAGS, name)?,
            result: match f.u32(FIB_RESULT, name)? {
                1 => FibResult::Oif,
                2 => FibResult::OifName,
                3 => FibResult::AddrType,
                other => return Err(Malformed(format!("fib result {other}"))),
            },
            dreg: f.register(FIB_DREG, name)?,
        },
        _ => other(name, data),
    };
    Ok(expr)
}

fn other(name: &str, data: &[u8]) -> Expr {
    Expr::Other {
        name: name.to_owned(),
        data: data.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            Expr::Other {
                name: "log".into(),
                data: vec![],
            },
        ]);
    }

    #[test]
    fn expressions_display_as_one_readable_line_each() {
        let lookup = Expr::Lookup {
            set: "service-ips".into(),
            sreg: Register::r32(0),
            dreg: Some(Register::Verdict),
            invert: false,
        };
        assert_eq!(lookup.to_string(), "r0 in @service-ips => verdict");
        assert_eq!(
            Expr::verdict(Verdict::Goto("lb-tcp-2".into())).to_string(),
            "goto lb-tcp-2"
        );
        let cmp = Expr::Cmp {
            op: CmpOp::Neq,
            sreg: Register::r32(0),
            data: vec![10, 244, 0, 0],
        };
        assert_eq!(cmp.to_string(), "r0 Neq 0x0af40000");
        let masq = Expr::Masquerade {
            flags: nat_flags::PROTO_RANDOM_FULLY,
        };
        assert_eq!(masq.to_string(), "masquerade fully-random");
    }

    #[test]
    fn the_kernels_128_bit_register_numbers_read_as_32_bit_registers() {
        assert_eq!(Register::from_number(1).unwrap(), Register::r32(0));
        assert_eq!(Register::from_number(2).unwrap(), Register::r32(4));
        assert_eq!(Register::from_number(9).unwrap(), Register::r32(1));
        assert!(Register::from_number(5).is_err());
        assert!(Register::from_number(24).is_err());
    }

    #[test]
    fn garbage_expression_data_is_an_error_or_other_never_a_panic() {
        for data in [&[0xffu8, 0xff, 0x01, 0x00][..], &[8, 0, 1, 0, 1][..], &[]] {
            for name in ["payload", "cmp", "lookup", "immediate", "nat", "dynset", "weird"] {
                let _ = decode(name, data);
            }
        }
    }
}
