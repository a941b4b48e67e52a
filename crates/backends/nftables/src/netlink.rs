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
//!
//! The lowering is split by what it lowers: `sets` declares sets and maps (with `udata`,
//! nft's `typeof` user data), `elements` writes their elements, `rules` turns a rule's
//! matches and statement into expressions. This file keeps the transport, the generation
//! bookkeeping and the walk over a batch's operations that calls them.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use kpr_model::{IpFamily, Protocol};
use kpr_nfnetlink as nl;
use nl::{BaseChain, Family, Socket, Table, Value};

use crate::batch::{Batch, Op};
use crate::names::{ChainId, ChainType, HookPoint};
use crate::render::TABLE;
use crate::transport::{Listing, Transport, TransportError};

mod elements;
mod rules;
mod sets;
mod udata;

use elements::elements_of;
use rules::lower_rule;
pub use rules::rule_exprs;
use sets::set_of;

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
        let objects = match self.socket.objects(&table, None) {
            Ok(objects) => objects,
            Err(e) if missing(&e) => return Ok(None),
            Err(e) => return Err(TransportError::Netlink(e)),
        };
        for object in objects {
            listing.objects.insert((object.kind, object.name), object.handle);
        }
        Ok(Some(listing))
    }

    fn cheap_read_back(&self) -> bool {
        // Rules and set names only, one dump each: well under a millisecond at any size.
        true
    }

    fn own_port_id(&self) -> Option<u32> {
        self.socket
            .port_id()
            .inspect_err(|error| tracing::warn!("cannot read our nf_tables socket's port id: {error}"))
            .ok()
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

pub(crate) fn table(family: IpFamily) -> Table {
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
            Op::AddCounter(counter) => out.add_counter(&table, &counter.to_string()),
            Op::DeleteObjectByHandle(kind, handle) => out.delete_object_by_handle(&table, *kind, *handle),
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
