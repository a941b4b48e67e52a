//! Rules: a rule's matches and statement as the expression sequences nft itself would
//! send for the rule's text form ([`crate::render`]), in the family's register layout, so
//! `nft list` shows the rule as the text transport would have written it.

use std::time::Duration;

use ipnet::IpNet;
use kpr_model::{IpFamily, Protocol};
use kpr_nfnetlink::{
    self as nl, CmpOp, CtKey, DynsetOp, Expr, FibResult, Field, MetaKey, NatKind, NumgenKind, ObjectType,
    PayloadBase, Register, RejectKind, Set, SetData, Table, Value, Verdict,
};

use super::udata::tlv_u32;
use super::{addr, nl_family, proto_number, table};
use crate::model::{Key, Match, Rule, Slot, Stmt};
use crate::names::{EndpointMap, SetName};

/// Expressions of one rule, with the family's register layout.
struct Lowering {
    family: IpFamily,
    exprs: Vec<Expr>,
}

fn r(index: u8) -> Register {
    Register::r32(index)
}

impl Lowering {
    /// Registers one address takes: 1 for IPv4, 4 for IPv6.
    fn addr_regs(&self) -> u8 {
        match self.family {
            IpFamily::V4 => 1,
            IpFamily::V6 => 4,
        }
    }

    fn addr_len(&self) -> u32 {
        u32::from(self.addr_regs()) * 4
    }

    fn saddr(&mut self, dreg: u8) {
        let offset = match self.family {
            IpFamily::V4 => 12,
            IpFamily::V6 => 8,
        };
        self.payload(PayloadBase::Network, offset, self.addr_len(), dreg);
    }

    fn daddr(&mut self, dreg: u8) {
        let offset = match self.family {
            IpFamily::V4 => 16,
            IpFamily::V6 => 24,
        };
        self.payload(PayloadBase::Network, offset, self.addr_len(), dreg);
    }

    fn payload(&mut self, base: PayloadBase, offset: u32, len: u32, dreg: u8) {
        self.exprs.push(Expr::Payload {
            base,
            offset,
            len,
            dreg: r(dreg),
        });
    }

    /// `th dport` (or `tcp dport` after its protocol dependency).
    fn dport(&mut self, dreg: u8) {
        self.payload(PayloadBase::Transport, 2, 2, dreg);
    }

    fn l4proto(&mut self, dreg: u8) {
        self.exprs.push(Expr::Meta {
            key: MetaKey::L4Proto,
            dreg: r(dreg),
        });
    }

    /// `meta l4proto <proto>`: what nft puts before `tcp dport`.
    fn proto_dependency(&mut self, proto: Protocol) {
        self.l4proto(0);
        self.cmp(CmpOp::Eq, vec![proto_number(proto)]);
    }

    fn cmp(&mut self, op: CmpOp, data: Vec<u8>) {
        self.exprs.push(Expr::Cmp { op, sreg: r(0), data });
    }

    fn masked(&mut self, mask: Vec<u8>) {
        let xor = vec![0; mask.len()];
        self.exprs.push(Expr::Bitwise {
            sreg: r(0),
            dreg: r(0),
            mask,
            xor,
        });
    }

    fn numgen(&mut self, modulus: u32, offset: u32, dreg: u8) {
        self.exprs.push(Expr::Numgen {
            kind: NumgenKind::Random,
            modulus,
            offset,
            dreg: r(dreg),
        });
    }

    /// An endpoint map's key (`[daddr .] dport`) from register `first`; returns the next
    /// free register.
    fn endpoint_key(&mut self, map: EndpointMap, first: u8) -> u8 {
        if map.space.keyed_by_address() {
            self.daddr(first);
            let port = first + self.addr_regs();
            self.dport(port);
            port + 1
        } else {
            self.dport(first);
            first + 1
        }
    }

    /// Loads `key` from register 0 on, as [`crate::render`]'s `key_expr` spells it.
    fn key(&mut self, key: Key) {
        let a = self.addr_regs();
        match key {
            Key::DestProtoPort => {
                self.daddr(0);
                self.l4proto(a);
                self.dport(a + 1);
            }
            Key::ProtoPort => {
                self.l4proto(0);
                self.dport(1);
            }
            Key::DestProtoPortSource => {
                self.daddr(0);
                self.l4proto(a);
                self.dport(a + 1);
                self.saddr(a + 2);
            }
            Key::SourceDest => {
                self.saddr(0);
                self.daddr(a);
            }
            Key::AffinityEntry { map, slot } => {
                self.proto_dependency(map.proto);
                self.saddr(0);
                let next = self.endpoint_key(map, a);
                self.numgen(1, u32::from(slot), next);
            }
        }
    }

    fn net(&mut self, net: &IpNet, source: bool, negate: bool) {
        if source {
            self.saddr(0);
        } else {
            self.daddr(0);
        }
        if net.prefix_len() < net.max_prefix_len() {
            self.masked(addr(Value::new(), net.netmask()).build());
        }
        let op = if negate { CmpOp::Neq } else { CmpOp::Eq };
        self.cmp(op, addr(Value::new(), net.network()).build());
    }

    /// `<load> & bits != 0` over a 32-bit host-order value.
    fn bits_set(&mut self, load: Expr, bits: u32) {
        self.exprs.push(load);
        self.masked(bits.to_ne_bytes().to_vec());
        self.cmp(CmpOp::Neq, vec![0; 4]);
    }

    fn ct(key: CtKey) -> Expr {
        Expr::Ct {
            key,
            dreg: r(0),
            direction: None,
        }
    }

    fn fib_local(&mut self, flags: u32) {
        self.exprs.push(Expr::Fib {
            flags,
            result: FibResult::AddrType,
            dreg: r(0),
        });
        self.cmp(CmpOp::Eq, nl::addr_type::LOCAL.to_ne_bytes().to_vec());
    }

    fn lookup(&mut self, set: SetName, dreg: Option<Register>, invert: bool) {
        self.exprs.push(Expr::Lookup {
            set: set.to_string(),
            sreg: r(0),
            dreg,
            invert,
        });
    }

    fn matches(&mut self, m: &Match) {
        match m {
            Match::CtStateNew => self.bits_set(Self::ct(CtKey::State), nl::ct_state::NEW),
            Match::CtStateInvalid => self.bits_set(Self::ct(CtKey::State), nl::ct_state::INVALID),
            Match::CtStatusDnat => self.bits_set(Self::ct(CtKey::Status), nl::ct_status::DNAT),
            Match::SourceNet { net, negate } => self.net(net, true, *negate),
            Match::DestNotNet(net) => self.net(net, false, true),
            Match::DestNet(net) => self.net(net, false, false),
            Match::L4Proto(proto) => self.proto_dependency(*proto),
            Match::InputInterface { name, prefix, negate } => {
                self.exprs.push(Expr::Meta {
                    key: MetaKey::IifName,
                    dreg: r(0),
                });
                // A prefix compares its own bytes; a whole name all 16, NUL-padded.
                let data = if *prefix {
                    name.as_str().as_bytes().to_vec()
                } else {
                    Value::new().ifname(name.as_str()).build()
                };
                self.cmp(if *negate { CmpOp::Neq } else { CmpOp::Eq }, data);
            }
            Match::SourceIsLocal => self.fib_local(nl::fib_flags::SADDR),
            Match::DestIsLocal => self.fib_local(nl::fib_flags::DADDR),
            Match::DestIn(set) => {
                self.daddr(0);
                self.lookup(*set, None, false);
            }
            Match::Lookup { key, set, negate } => {
                self.key(*key);
                self.lookup(*set, None, *negate);
            }
            Match::MarkClear(mask) => {
                self.exprs.push(Expr::Meta {
                    key: MetaKey::Mark,
                    dreg: r(0),
                });
                self.masked(mask.to_ne_bytes().to_vec());
                self.cmp(CmpOp::Eq, vec![0; 4]);
            }
        }
    }

    /// nft's plain `reject`: ICMP (v6) port unreachable, for TCP too.
    fn reject(&mut self) {
        let code = match self.family {
            IpFamily::V4 => 3,
            IpFamily::V6 => 4,
        };
        self.exprs.push(Expr::Reject {
            kind: RejectKind::IcmpUnreach,
            code,
        });
    }

    fn verdict(&mut self, verdict: Verdict) {
        self.exprs.push(Expr::verdict(verdict));
    }

    /// `mark set mark & mask ^ xor`.
    fn set_mark(&mut self, mask: u32, xor: u32) {
        self.exprs.push(Expr::Meta {
            key: MetaKey::Mark,
            dreg: r(0),
        });
        self.exprs.push(Expr::Bitwise {
            sreg: r(0),
            dreg: r(0),
            mask: mask.to_ne_bytes().to_vec(),
            xor: xor.to_ne_bytes().to_vec(),
        });
        self.exprs.push(Expr::MetaSet {
            key: MetaKey::Mark,
            sreg: r(0),
        });
    }

    /// The statement; a random pick first creates its anonymous map in `batch`.
    fn stmt(&mut self, stmt: &Stmt, batch: &mut nl::Batch, table: &Table) {
        match stmt {
            Stmt::Jump(chain) => self.verdict(Verdict::Jump(chain.to_string())),
            Stmt::Goto(chain) => self.verdict(Verdict::Goto(chain.to_string())),
            Stmt::Return => self.verdict(Verdict::Return),
            Stmt::Drop => self.verdict(Verdict::Drop),
            Stmt::Reject => self.reject(),
            Stmt::CountReject(counter) => {
                self.exprs.push(Expr::ObjRef {
                    kind: ObjectType::COUNTER,
                    name: counter.to_string(),
                });
                self.reject();
            }
            Stmt::RandomGoto(targets) => {
                let elements: Vec<nl::Element> = (0u32..)
                    .zip(targets)
                    .map(|(i, target)| {
                        nl::Element::verdict(
                            Value::new().host_u32(i).build(),
                            Verdict::Goto(target.to_string()),
                        )
                    })
                    .collect();
                let mut set = Set::map("", vec![Field::Integer { bytes: 4 }], SetData::Verdict);
                // As nft writes it: a host-endian key, so slots list as numbers.
                tlv_u32(&mut set.userdata, 0, 1);
                let set_id = batch.add_anonymous_map(table, &set, &elements);
                self.numgen(targets.len() as u32, 0, 0);
                self.exprs.push(Expr::AnonymousLookup {
                    set_id,
                    sreg: r(0),
                    dreg: Some(Register::Verdict),
                });
            }
            Stmt::MarkOr(bits) => self.set_mark(!bits, *bits),
            Stmt::MarkXor(bits) => self.set_mark(u32::MAX, *bits),
            Stmt::Masquerade => self.exprs.push(Expr::Masquerade {
                flags: nl::nat_flags::PROTO_RANDOM_FULLY,
            }),
            Stmt::DnatMap { choice, slot } => {
                self.proto_dependency(choice.map.proto);
                let next = self.endpoint_key(choice.map, 0);
                match slot {
                    Slot::Random(count) => self.numgen(u32::from(*count), 0, next),
                    Slot::Fixed(slot) => self.numgen(1, u32::from(*slot), next),
                }
                self.lookup(choice.endpoints(), Some(r(0)), false);
                self.exprs.push(Expr::Nat {
                    kind: NatKind::Dnat,
                    family: nl_family(self.family),
                    addr_min: Some(r(0)),
                    addr_max: None,
                    proto_min: Some(r(self.addr_regs())),
                    proto_max: None,
                    flags: 0,
                });
            }
            Stmt::RememberSlot { map, slot, timeout } => {
                self.key(Key::AffinityEntry {
                    map: *map,
                    slot: *slot,
                });
                self.exprs.push(Expr::Dynset {
                    op: DynsetOp::Update,
                    set: SetName::Affinity(*map).to_string(),
                    sreg_key: r(0),
                    sreg_data: None,
                    timeout: Some(Duration::from_secs(u64::from(*timeout))),
                });
            }
        }
    }
}

/// The expressions of `rule` (without the anonymous maps a random pick needs: for
/// tests comparing expressions).
pub fn rule_exprs(family: IpFamily, rule: &Rule) -> Vec<Expr> {
    let table = table(family);
    let mut scratch = nl::Batch::new();
    lower_rule(family, rule, &mut scratch, &table)
}

pub(super) fn lower_rule(family: IpFamily, rule: &Rule, batch: &mut nl::Batch, table: &Table) -> Vec<Expr> {
    let mut lowering = Lowering {
        family,
        exprs: Vec::new(),
    };
    for m in &rule.matches {
        lowering.matches(m);
    }
    lowering.stmt(&rule.stmt, batch, table);
    lowering.exprs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::{Choice, KeySpace};

    #[test]
    fn a_dnat_through_an_ipv6_map_takes_the_port_from_the_register_after_the_address() {
        let map = EndpointMap {
            space: KeySpace::Address,
            proto: Protocol::Udp,
        };
        let rule = Rule::always(Stmt::DnatMap {
            choice: Choice {
                map,
                count: 3,
                affinity: None,
            },
            slot: Slot::Random(3),
        });
        let exprs = rule_exprs(IpFamily::V6, &rule);
        assert!(matches!(
            exprs.last(),
            Some(Expr::Nat {
                addr_min: Some(Register::R32(0)),
                proto_min: Some(Register::R32(4)),
                ..
            })
        ));
        assert!(exprs.contains(&Expr::Numgen {
            kind: NumgenKind::Random,
            modulus: 3,
            offset: 0,
            dreg: r(5),
        }));
    }
}
