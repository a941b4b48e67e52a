//! One line per expression, for `explain` and error reports: what a person reads when a
//! rule does not do what they expected, so registers and data are spelled out rather than
//! in nft's syntax (which needs the set's and the table's context to print).

use super::{Data, Expr, Register, nat_flags};

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
            Self::ObjRef { kind, name } => write!(f, "{kind} name {name:?}"),
            Self::Other { name, data } => write!(f, "{name} ({} bytes)", data.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::CmpOp;
    use crate::objects::Verdict;

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
}
