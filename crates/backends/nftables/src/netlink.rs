//! [`NetlinkTransport`]: the model's batches sent as nf_tables netlink transactions from
//! the process (kpr-nfnetlink), with no `nft` process anywhere on the sync path.
//!
//! Why: `nft -f` costs ~20 ms of start-up per call and parses text for ~55 % of a cold load
//! (../shared/docs/KERNEL-COSTS.md); a replaced endpoint is four element operations, which
//! the kernel applies in tens of microseconds. kpr-nfnetlink was chosen over libnftnl
//! (`nftnl`/`nftnl-sys`) by measurement and because libnftnl's safe Rust API lacks numgen,
//! dynset and concatenated keys (see that crate's docs).
//!
//! # Lowering
//!
//! Every [`Op`] becomes the messages `nft` itself would send for its text form
//! ([`crate::render`]): the same set key types, the same expression sequences (a protocol
//! dependency before `tcp dport`, a constant slot as `numgen random mod 1 offset k`), so
//! `nft list` shows the same table whichever transport wrote it (endpoint maps and
//! affinity sets carry nft's `typeof` user data, so slots list as numbers). The random
//! pick of a sticky chain (`numgen ... vmap { ... }`) is a constant anonymous map bound to
//! its rule, as nft makes it. A CIDR in an interval set is a start element and an
//! interval-end element; a source range in `firewall-allow` is a `key . key_end` range.
//!
//! # Noticing foreign changes without listing
//!
//! The kernel's ruleset generation grows by one with every committed transaction in the
//! namespace. The transports of one process share a [`GenerationLog`]: each commit of
//! ours must land right after the last one we know of, and at the start of a sync the
//! current generation must equal the last one we saw. Anything else means someone else
//! committed (another family's table of ours does not count), and
//! [`Transport::foreign_changes`] says so: the backend then reads the table back and
//! repairs it. A quiet node never lists its table; a node where other software commits
//! (iptables-nft, firewalld) lists rules and set names, never elements, after each such
//! commit.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::IpNet;
use kpr_model::{IpFamily, Protocol};
use kpr_naming::text::Comment;
use kpr_nfnetlink as nl;
use nl::{
    BaseChain, CmpOp, CtKey, DynsetOp, Expr, Family, FibResult, Field, MetaKey, NatKind, NumgenKind,
    PayloadBase, Register, RejectKind, Set, SetData, Socket, Table, Value, Verdict,
};

use crate::batch::{Batch, Op};
use crate::model::{ElemKey, ElemValue, Key, Match, Rule, Slot, Stmt};
use crate::names::{ChainId, ChainType, EndpointMap, EntryKind, HookPoint, SetName};
use crate::render::TABLE;
use crate::transport::{Listing, Transport, TransportError};

/// `NFT_SET_ANONYMOUS`: sets the kernel made for rules (`__map0`), not ours to compare.
const ANONYMOUS_SET: u32 = 0x1;
/// `ENOENT`: the table does not exist.
const ENOENT: i32 = 2;

/// The generations the transports of one process have seen (shared by both families).
#[derive(Debug, Default)]
pub struct GenerationLog {
    state: Mutex<GenerationState>,
}

#[derive(Debug, Default)]
struct GenerationState {
    /// The generation after the last commit or check of ours.
    last: Option<u32>,
    /// How many times a generation showed someone else's commit.
    foreign: u64,
}

impl GenerationLog {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GenerationState> {
        // A poisoned lock only means another sync panicked mid-update: the numbers are
        // still numbers, and a wrong one costs one extra read-back.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Our transaction committed as `generation`.
    fn committed(&self, generation: u32) {
        let mut state = self.lock();
        if state.last.is_some_and(|last| last.wrapping_add(1) != generation) {
            state.foreign += 1;
        }
        state.last = Some(generation);
    }

    /// The kernel is at `generation` now; returns the count of foreign commits seen.
    fn observed(&self, generation: u32) -> u64 {
        let mut state = self.lock();
        if state.last != Some(generation) {
            state.foreign += 1;
        }
        state.last = Some(generation);
        state.foreign
    }
}

/// nf_tables over netlink, in the network namespace the socket was opened in.
pub struct NetlinkTransport {
    socket: Socket,
    affinity_capacity: u32,
    generations: Arc<GenerationLog>,
    /// The foreign-commit count this transport has already answered for.
    foreign_seen: u64,
}

impl std::fmt::Debug for NetlinkTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetlinkTransport")
            .field("affinity_capacity", &self.affinity_capacity)
            .finish_non_exhaustive()
    }
}

impl NetlinkTransport {
    /// A transport in the calling thread's network namespace, with a log of its own.
    pub fn open(affinity_capacity: u32) -> Result<Self, TransportError> {
        Self::open_shared(affinity_capacity, GenerationLog::new())
    }

    /// A transport sharing `generations` with the process's other transports (one per
    /// family), so their commits do not look foreign to each other.
    pub fn open_shared(
        affinity_capacity: u32,
        generations: Arc<GenerationLog>,
    ) -> Result<Self, TransportError> {
        let socket = Socket::open().map_err(TransportError::Netlink)?;
        Ok(Self {
            socket,
            affinity_capacity,
            generations,
            foreign_seen: 0,
        })
    }

    /// The nfnetlink batch `batch` lowers to (for tests and tools; changes nothing).
    pub fn lower(&self, batch: &Batch) -> nl::Batch {
        lower(batch, self.affinity_capacity)
    }

    /// The socket, for dumps in tests and tools.
    pub fn socket(&mut self) -> &mut Socket {
        &mut self.socket
    }
}

impl Transport for NetlinkTransport {
    fn apply(&mut self, batch: &Batch) -> Result<(), TransportError> {
        let lowered = self.lower(batch);
        if lowered.is_empty() {
            return Ok(());
        }
        // One transaction: the model already cuts cold loads into bounded batches.
        let generation = self.socket.send(&lowered).map_err(TransportError::Netlink)?;
        self.generations.committed(generation);
        Ok(())
    }

    fn check(&mut self, batch: &Batch) -> Result<(), TransportError> {
        let lowered = self.lower(batch);
        self.socket.validate(&lowered).map_err(TransportError::Netlink)
    }

    fn read_back(&mut self, family: IpFamily) -> Result<Option<Listing>, TransportError> {
        let table = table(family);
        let missing = |e: &nl::Error| e.errno() == Some(ENOENT);
        let chains = match self.socket.chains(&table) {
            Ok(chains) => chains,
            Err(e) if missing(&e) => return Ok(None),
            Err(e) => return Err(TransportError::Netlink(e)),
        };
        let mut listing = Listing::default();
        for chain in chains {
            listing.chains.entry(chain.chain.name.clone()).or_default();
            listing.chain_handles.insert(chain.chain.name, chain.handle);
        }
        let rules = match self.socket.rules(&table, None) {
            Ok(rules) => rules,
            Err(e) if missing(&e) => return Ok(None),
            Err(e) => return Err(TransportError::Netlink(e)),
        };
        let sets = match self.socket.sets(&table) {
            Ok(sets) => sets,
            Err(e) if missing(&e) => return Ok(None),
            Err(e) => return Err(TransportError::Netlink(e)),
        };
        for rule in rules {
            let text: Vec<String> = rule.exprs.iter().map(ToString::to_string).collect();
            listing
                .chains
                .entry(rule.chain)
                .or_default()
                .push(text.join("; "));
        }
        for set in sets {
            if set.flags & ANONYMOUS_SET != 0 {
                continue;
            }
            listing.sets.insert(set.name.clone());
            listing.set_handles.insert(set.name, set.handle);
        }
        Ok(Some(listing))
    }

    fn cheap_read_back(&self) -> bool {
        // Rules and set names only, one dump each: well under a millisecond at any size.
        true
    }

    fn foreign_changes(&mut self) -> Result<Option<bool>, TransportError> {
        let generation = self.socket.generation().map_err(TransportError::Netlink)?;
        let foreign = self.generations.observed(generation);
        let changed = foreign != self.foreign_seen;
        self.foreign_seen = foreign;
        Ok(Some(changed))
    }
}

// === lowering ===

fn nl_family(family: IpFamily) -> Family {
    match family {
        IpFamily::V4 => Family::Ip,
        IpFamily::V6 => Family::Ip6,
    }
}

fn table(family: IpFamily) -> Table {
    Table::new(nl_family(family), TABLE)
}

/// The table's comment, as [`crate::batch_text`] writes it for nft.
fn table_comment() -> Vec<u8> {
    nl::comment_userdata("rules for kube-proxy").unwrap_or_default()
}

/// The nfnetlink batch of `batch`.
pub fn lower(batch: &Batch, affinity_capacity: u32) -> nl::Batch {
    let family = batch.family;
    let table = table(family);
    let mut out = nl::Batch::new();
    for op in &batch.ops {
        match op {
            Op::AddTable => out.add_table_with_userdata(&table, &table_comment()),
            Op::DeleteTable => out.delete_table(&table),
            Op::AddSet(set) => out.add_set(&table, &set_of(family, *set, affinity_capacity)),
            Op::AddChain(chain) => out.add_chain(&table, &chain_of(*chain)),
            Op::AddRule(chain, rule) => {
                let exprs = lower_rule(family, rule, &mut out, &table);
                out.add_rule(&table, &chain.to_string(), &exprs);
            }
            Op::DeleteChain(chain) => {
                let name = chain.to_string();
                out.flush_chain(&table, &name);
                out.delete_chain(&table, &name);
            }
            Op::DeleteSet(set) => out.delete_set(&table, &set.to_string()),
            Op::FlushChain(chain) => out.flush_chain(&table, &chain.to_string()),
            Op::FlushSet(set) => out.flush_set(&table, &set.to_string()),
            Op::DeleteChainByHandle(handle) => out.delete_chain_by_handle(&table, *handle),
            Op::DeleteSetByHandle(handle) => out.delete_set_by_handle(&table, *handle),
            Op::AddElements(set, elements) => {
                let lowered: Vec<nl::Element> = elements
                    .iter()
                    .flat_map(|(key, value, comment)| elements_of(key, value.as_ref(), comment.as_ref()))
                    .collect();
                out.add_elements(&table, &set.to_string(), &lowered);
            }
            Op::DeleteElements(set, keys) => {
                let lowered: Vec<nl::Element> =
                    keys.iter().flat_map(|key| elements_of(key, None, None)).collect();
                out.delete_elements(&table, &set.to_string(), &lowered);
            }
        }
    }
    out
}

fn addr_field(family: IpFamily) -> Field {
    match family {
        IpFamily::V4 => Field::Ipv4Addr,
        IpFamily::V6 => Field::Ipv6Addr,
    }
}

/// A set's declaration, as [`crate::render::set_body`] spells it for nft.
fn set_of(family: IpFamily, set: SetName, affinity_capacity: u32) -> Set {
    let a = addr_field(family);
    let name = set.to_string();
    let (proto, port) = (Field::InetProto, Field::InetService);
    match set {
        SetName::ClusterIps | SetName::NodePortIps => Set::new(name, vec![a]),
        SetName::ServiceCidrs => Set {
            interval: true,
            ..Set::new(name, vec![a])
        },
        SetName::Entries { kind, .. } | SetName::NoEndpoint { kind, .. } => match kind {
            EntryKind::Address => Set::new(name, vec![a, proto, port]),
            EntryKind::NodePort => Set::new(name, vec![proto, port]),
        },
        SetName::FirewallIps => Set::new(name, vec![a, proto, port]),
        SetName::FirewallAllow => Set {
            interval: true,
            ..Set::new(name, vec![a, proto, port, a])
        },
        SetName::Hairpin => Set::new(name, vec![a, a]),
        SetName::Endpoints(choice) => {
            let map = choice.map;
            let mut key = endpoint_key_fields(family, map);
            key.push(SLOT);
            Set {
                userdata: typeof_udata(family, None, map, true),
                ..Set::map(name, key, SetData::Value(vec![a, port]))
            }
        }
        SetName::Affinity(map) => {
            let mut key = vec![a];
            key.extend(endpoint_key_fields(family, map));
            key.push(SLOT);
            Set {
                dynamic: true,
                timeouts: true,
                size: Some(affinity_capacity),
                userdata: typeof_udata(family, Some(()), map, false),
                ..Set::new(name, key)
            }
        }
    }
}

/// An endpoint slot: nft's `numgen` type (an integer of 4 bytes, host order).
const SLOT: Field = Field::Integer { bytes: 4 };

// nft's `typeof` user data (libnftnl udata TLVs: type byte, length byte, value; numbers
// host-order u32), so `nft list` prints endpoint maps and affinity sets as nft wrote them:
// slots as numbers, keys as `ip daddr . tcp dport . numgen random mod 1`. The numbers are
// nft's expression kinds (payload 7, concat 13, numgen 23) and its header and field ids.

fn tlv(out: &mut Vec<u8>, kind: u8, value: &[u8]) {
    out.push(kind);
    out.push(value.len() as u8);
    out.extend_from_slice(value);
}

fn tlv_u32(out: &mut Vec<u8>, kind: u8, value: u32) {
    tlv(out, kind, &value.to_ne_bytes());
}

/// `<header> <field>` (e.g. `ip daddr`: header 12, field 12).
fn typeof_payload(header: u32, field: u32) -> Vec<u8> {
    let mut out = Vec::new();
    tlv_u32(&mut out, 0, 7);
    let mut desc = Vec::new();
    tlv_u32(&mut desc, 0, header);
    tlv_u32(&mut desc, 1, field);
    tlv(&mut out, 1, &desc);
    out
}

/// `numgen random mod 1`.
fn typeof_numgen() -> Vec<u8> {
    let mut out = Vec::new();
    tlv_u32(&mut out, 0, 23);
    let mut args = Vec::new();
    tlv_u32(&mut args, 0, 1);
    tlv_u32(&mut args, 1, 1);
    tlv_u32(&mut args, 2, 0);
    tlv(&mut out, 1, &args);
    out
}

fn typeof_concat(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    tlv_u32(&mut out, 0, 13);
    let mut list = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        tlv(&mut list, i as u8, part);
    }
    tlv(&mut out, 1, &list);
    out
}

/// The user data of an endpoint map (`[daddr .] <proto> dport . numgen : daddr . <proto>
/// dport`) or, with `source`, an affinity set (`saddr . [daddr .] <proto> dport . numgen`).
fn typeof_udata(family: IpFamily, source: Option<()>, map: EndpointMap, is_map: bool) -> Vec<u8> {
    let (header, saddr, daddr) = match family {
        IpFamily::V4 => (12, 11, 12),
        IpFamily::V6 => (13, 8, 9),
    };
    let transport = match map.proto {
        Protocol::Tcp => 8,
        Protocol::Udp => 6,
        Protocol::Sctp => 10,
    };
    let dport = typeof_payload(transport, 2);
    let mut key = Vec::new();
    if source.is_some() {
        key.push(typeof_payload(header, saddr));
    }
    if map.space.keyed_by_address() {
        key.push(typeof_payload(header, daddr));
    }
    key.push(dport.clone());
    key.push(typeof_numgen());
    let mut out = Vec::new();
    tlv_u32(&mut out, 0, 0);
    if is_map {
        tlv_u32(&mut out, 1, 0);
    }
    tlv(&mut out, 3, &typeof_concat(&key));
    if is_map {
        tlv(
            &mut out,
            4,
            &typeof_concat(&[typeof_payload(header, daddr), dport]),
        );
        tlv_u32(&mut out, 6, 0);
    }
    out
}

fn endpoint_key_fields(family: IpFamily, map: EndpointMap) -> Vec<Field> {
    if map.space.keyed_by_address() {
        vec![addr_field(family), Field::InetService]
    } else {
        vec![Field::InetService]
    }
}

fn chain_of(chain: ChainId) -> nl::Chain {
    let name = chain.to_string();
    let ChainId::Fixed(fixed) = chain else {
        return nl::Chain::regular(name);
    };
    let Some(hook) = fixed.hook() else {
        return nl::Chain::regular(name);
    };
    let chain_type = match hook.kind {
        ChainType::Filter => nl::ChainType::Filter,
        ChainType::Nat => nl::ChainType::Nat,
    };
    let point = match hook.hook {
        HookPoint::Prerouting => nl::Hook::Prerouting,
        HookPoint::Input => nl::Hook::Input,
        HookPoint::Forward => nl::Hook::Forward,
        HookPoint::Output => nl::Hook::Output,
        HookPoint::Postrouting => nl::Hook::Postrouting,
    };
    nl::Chain::base(
        name,
        BaseChain {
            chain_type,
            hook: point,
            priority: hook.priority,
            policy: nl::Policy::Accept,
        },
    )
}

fn proto_number(proto: Protocol) -> u8 {
    match proto {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

fn addr(value: Value, ip: IpAddr) -> Value {
    match ip {
        IpAddr::V4(v4) => value.ipv4(v4),
        IpAddr::V6(v6) => value.ipv6(v6),
    }
}

/// The address after the last one of `net`, or `None` past the top of the space.
fn after_last(net: &IpNet) -> Option<IpAddr> {
    match net {
        IpNet::V4(n) => u32::from(n.broadcast())
            .checked_add(1)
            .map(|a| IpAddr::V4(a.into())),
        IpNet::V6(n) => u128::from(n.broadcast())
            .checked_add(1)
            .map(|a| IpAddr::V6(a.into())),
    }
}

/// The kernel elements of one model element: one, or two for a CIDR in an interval set
/// (its start, and the interval end after its last address); a comment goes into the
/// element's user data as nft writes it.
fn elements_of(key: &ElemKey, value: Option<&ElemValue>, comment: Option<&Comment>) -> Vec<nl::Element> {
    let mut elements = plain_elements_of(key, value);
    // The model keeps comments within nft's limit; one it could not write is left out.
    if let Some(userdata) = comment.and_then(|c| nl::comment_userdata(c.as_str())) {
        for element in &mut elements {
            element.userdata = userdata.clone();
        }
    }
    elements
}

fn plain_elements_of(key: &ElemKey, value: Option<&ElemValue>) -> Vec<nl::Element> {
    let bytes = match key {
        ElemKey::Addr(ip) => addr(Value::new(), *ip).build(),
        ElemKey::Net(net) => {
            let mut out = vec![nl::Element::key(addr(Value::new(), net.network()).build())];
            if let Some(end) = after_last(net) {
                out.push(nl::Element {
                    interval_end: true,
                    ..nl::Element::key(addr(Value::new(), end).build())
                });
            }
            return out;
        }
        ElemKey::AddrProtoPort(ip, proto, port) => addr(Value::new(), *ip)
            .proto(proto_number(*proto))
            .port(*port)
            .build(),
        ElemKey::ProtoPort(proto, port) => Value::new().proto(proto_number(*proto)).port(*port).build(),
        ElemKey::AddrProtoPortNet(ip, proto, port, net) => {
            let head = || addr(Value::new(), *ip).proto(proto_number(*proto)).port(*port);
            return vec![nl::Element::range(
                addr(head(), net.network()).build(),
                addr(head(), net.broadcast()).build(),
            )];
        }
        ElemKey::AddrPair(a, b) => addr(addr(Value::new(), *a), *b).build(),
        ElemKey::AddrPortSlot(ip, port, slot) => addr(Value::new(), *ip)
            .port(*port)
            .host_u32(u32::from(*slot))
            .build(),
        ElemKey::PortSlot(port, slot) => Value::new().port(*port).host_u32(u32::from(*slot)).build(),
    };
    let element = match value {
        None => nl::Element::key(bytes),
        Some(ElemValue::Endpoint(ep)) => {
            nl::Element::mapping(bytes, addr(Value::new(), ep.ip()).port(ep.port()).build())
        }
    };
    vec![element]
}

// === rules ===

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
            Stmt::Reject => {
                // nft's plain `reject`: ICMP (v6) port unreachable.
                let code = match self.family {
                    IpFamily::V4 => 3,
                    IpFamily::V6 => 4,
                };
                self.exprs.push(Expr::Reject {
                    kind: RejectKind::IcmpUnreach,
                    code,
                });
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

fn lower_rule(family: IpFamily, rule: &Rule, batch: &mut nl::Batch, table: &Table) -> Vec<Expr> {
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
    use nl::Data;

    #[test]
    fn a_cidr_is_a_start_and_an_interval_end_and_the_top_of_the_space_has_no_end() {
        let net: IpNet = "10.96.0.0/16".parse().unwrap();
        let elements = elements_of(&ElemKey::Net(net), None, None);
        assert_eq!(elements.len(), 2);
        assert_eq!(elements[0].key, vec![10, 96, 0, 0]);
        assert!(!elements[0].interval_end);
        assert_eq!(elements[1].key, vec![10, 97, 0, 0]);
        assert!(elements[1].interval_end);
        let top: IpNet = "255.255.255.0/24".parse().unwrap();
        assert_eq!(elements_of(&ElemKey::Net(top), None, None).len(), 1);
    }

    #[test]
    fn an_endpoint_element_is_vip_port_slot_to_endpoint() {
        let key = ElemKey::AddrPortSlot("10.96.0.10".parse().unwrap(), 80, 2);
        let value = ElemValue::Endpoint("10.244.1.5:8080".parse().unwrap());
        let elements = elements_of(&key, Some(&value), None);
        let mut expected_key = vec![10, 96, 0, 10, 0, 80, 0, 0];
        expected_key.extend_from_slice(&2u32.to_ne_bytes());
        assert_eq!(elements[0].key, expected_key);
        assert_eq!(
            elements[0].data,
            Some(Data::Value(vec![10, 244, 1, 5, 0x1f, 0x90, 0, 0]))
        );
    }

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
