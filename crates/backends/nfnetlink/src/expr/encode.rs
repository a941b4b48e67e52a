//! Expressions to netlink attributes. Only for what this crate's callers built, so every
//! field is known and nothing is checked: the kernel refuses what it does not take, and
//! the batch reports which message it refused.

use std::time::Duration;

use super::attrs::*;
use super::{CmpOp, DynsetOp, Expr, FibResult, NatKind, NumgenKind, PayloadBase, RejectKind};
use crate::attr::Writer;
use crate::consts::{NFTA_DATA_VALUE, NFTA_EXPR_DATA, NFTA_EXPR_NAME, NFTA_LIST_ELEM};
use crate::wire::encode_data;

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
        Expr::ObjRef { kind, name } => {
            w.u32(OBJREF_IMM_TYPE, kind.0);
            // Without its NUL, as libnftnl writes it.
            w.bare_string(OBJREF_IMM_NAME, name);
        }
        Expr::Other { .. } => {}
    }
}
