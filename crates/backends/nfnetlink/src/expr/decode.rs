//! Netlink attributes to expressions: a rule dump as the kernel reports it, which may hold
//! rules someone else wrote. Nothing in the data is trusted: a malformed expression is an
//! error, never a panic, and an expression (or a form of one) this crate does not model
//! reads as [`Expr::Other`], so a foreign rule is still read and can be recognised.

use std::time::Duration;

use super::attrs::*;
use super::{
    CmpOp, CtKey, DynsetOp, Expr, FibResult, MetaKey, NatKind, NumgenKind, PayloadBase, Register, RejectKind,
    nat_flags,
};
use crate::attr::{Attrs, Malformed};
use crate::consts::{NFTA_EXPR_DATA, NFTA_EXPR_NAME};
use crate::objects::{Data, Family, ObjectType};
use crate::wire::decode_data;

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
        // A reference through a map (`counter name ip saddr map @m`) is not ours.
        "objref" if f.get(OBJREF_IMM_NAME).is_some() => Expr::ObjRef {
            kind: ObjectType(f.u32(OBJREF_IMM_TYPE, name)?),
            name: f.string(OBJREF_IMM_NAME, name)?,
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

    const NAMES: [&str; 7] = ["payload", "cmp", "lookup", "immediate", "nat", "dynset", "weird"];

    #[test]
    fn garbage_expression_data_is_an_error_or_other_never_a_panic() {
        // An attribute whose length runs past the end of the data (65535 bytes in 4, 8 in
        // 5): refused whatever the name, an unknown one too, because the attributes are
        // read before the name is looked at; the error says how much was left.
        for (data, left) in [(&[0xffu8, 0xff, 0x01, 0x00][..], 4), (&[8, 0, 1, 0, 1][..], 5)] {
            for name in NAMES {
                match decode(name, data) {
                    Err(Malformed(why)) => {
                        assert!(why.ends_with(&format!("with {left} bytes left")), "{name}: {why}")
                    }
                    Ok(expr) => panic!("{name} {data:?} decoded as {expr:?}"),
                }
            }
        }
        // No attributes at all: each modelled expression misses the first attribute it
        // requires; an unknown name keeps its (empty) data as `Other`.
        let empty = [
            ("payload", Err("payload without attribute 2")),
            ("cmp", Err("cmp without attribute 2")),
            ("lookup", Err("lookup without attribute 1")),
            ("immediate", Err("immediate without attribute 1")),
            ("nat", Err("nat without attribute 1")),
            ("dynset", Err("dynset without attribute 3")),
            ("weird", Ok(())),
        ];
        for (name, expected) in empty {
            let expected = match expected {
                Ok(()) => Ok(Expr::Other {
                    name: name.to_owned(),
                    data: Vec::new(),
                }),
                Err(why) => Err(Malformed(why.to_owned())),
            };
            assert_eq!(decode(name, &[]), expected, "{name}");
        }
    }
}
