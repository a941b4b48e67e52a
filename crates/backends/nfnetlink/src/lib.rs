//! nf_tables over netlink from the process: no `nft` process, no libnftnl.
//!
//! Why: a proxy that programs 10k+ Services cannot afford `nft`'s start-up and text
//! parsing on every change (~20 ms per call, ~55 % of a cold load; see
//! shared/docs/KERNEL-COSTS.md). This crate encodes nf_tables messages itself and sends
//! them over one netlink socket:
//!
//! - [`Batch`] collects changes (tables, chains, sets and maps, elements, rules) as
//!   encoded messages; [`Socket::send`] applies a batch as one atomic transaction and, on
//!   refusal, says which message failed, with the errno and the kernel's own text
//!   ([`BatchError`]). [`Socket::send_split`] cuts a cold load into several transactions so
//!   none holds the kernel's nf_tables mutex for long.
//! - [`Socket::tables`], [`Socket::chains`], [`Socket::sets`], [`Socket::elements`],
//!   [`Socket::rules`] and [`Socket::objects`] read a table back as typed values, for
//!   reconciling and debugging.
//! - Named counters ([`Batch::add_counter`], [`Expr::ObjRef`], [`Socket::counter`]): a rule
//!   counts into an object of its table that outlives rule changes and is read at any time
//!   (nft's `add counter` and `counter name "..."`).
//! - A rule's inline map (nft's `numgen random mod 2 vmap { 0 : goto a, 1 : goto b }`) is
//!   [`Batch::add_anonymous_map`] plus [`Expr::AnonymousLookup`] in the same batch; objects
//!   someone else put in a table are deleted by handle ([`Batch::delete_chain_by_handle`],
//!   [`Batch::delete_set_by_handle`]), so their names are never written.
//! - [`Expr`] is the closed set of expressions kube-proxy-style rules need (payload,
//!   meta, ct, cmp, bitwise, lookup/vmap, immediate verdicts, numgen, nat, masquerade,
//!   reject, counter, dynset, fib, objref); anything else reads back as [`Expr::Other`].
//!
//! - [`events`]: nf_tables change notifications (who changed which table), parsed, and
//!   the socket subscribed to them.
//! - [`ipset`]: ipsets over the same socket family (create, add/del members in batches,
//!   list, destroy), for the ipvs mode.
//!
//! The API speaks nft's concepts and nothing of Kubernetes. Keys and values are bytes
//! laid out as the kernel compares them; [`Value`] builds them (each field padded to a
//! 32-bit register; addresses and ports big-endian, marks and numgen slots host-endian).
//!
//! Every socket opens in the network namespace of the calling thread.
//!
//! # Why our own encoder (decided by measurement, 2026-11)
//!
//! - `netlink-packet-netfilter` (rust-netlink, already a dependency) models nf_tables
//!   messages but only six expressions (payload, meta, cmp, bitwise, lookup, immediate):
//!   no nat, masq, numgen, ct, dynset, fib, reject, counter; and it builds a `Vec` per
//!   attribute.
//! - `nftnl`/`nftnl-sys` (libnftnl, what `nft` uses) and `rustables` lack numgen, dynset
//!   and concatenated set keys in their safe APIs; filling the gaps means raw FFI, which
//!   this workspace forbids (`unsafe_code = "forbid"`), and a C library on every host.
//! - The nf_tables ABI is small and stable: this crate is ~2.5k lines plus unit tests, on
//!   `netlink-sys` for the socket. 500k map elements (50k Services x 10 endpoints): 31 ms
//!   to encode, 0.4-1.0 s into the kernel (`nft -f`: 4.4 s); one element change at 500k:
//!   p50 8 us, p99 ~35 us. `benches/elements.rs` has the measurement.
//!
//! # What callers must know
//!
//! - Keys and values: see [`Value`]. A `numgen` result (an endpoint slot) is a host-order
//!   u32; [`Field::Mark`] is the key field type that matches it (nft lists it as hex).
//! - A concatenation lives in consecutive 32-bit registers: with an IPv4 address in
//!   `r32(0)` the next field goes to `r32(1)`; after an IPv6 address, to `r32(4)`.
//! - DNAT through a map: `Lookup { sreg: r32(0), dreg: Some(r32(0)) }` on a map whose value
//!   is `addr . inet_service` loads the address into `r32(0)` and the port into the
//!   register after it (`r32(1)` or `r32(4)`); then `Nat { addr_min: r32(0), proto_min:
//!   that register }`.
//! - Changing a map element's data: delete and add it in the same batch (adding over an
//!   element with other data is `EEXIST`). A verdict element's target chain must exist.
//! - A set's `size` is both a hard limit and the kernel's initial hash size: giving the
//!   500k-element map `size = 2^20` made its load 2.6x faster and its dump 2x faster.
//! - Adding a jump/goto element to a verdict map makes the kernel re-validate the whole
//!   table at commit, walking every element of every verdict map the base chains reach:
//!   with D3's `service-ips` vmap at 50k Services a new Service costs 7-20 ms (p50), at
//!   10k ~0.8 ms; element changes that add no jump/goto stay at ~10-20 us at any size.
//!   `benches/d3.rs` measures two ways out: a set of Service ports per endpoint count
//!   (`ip daddr . meta l4proto . th dport @service-ips-<M> goto lb-tcp-<M>`, one rule per
//!   distinct M) and a two-stage map (count map, then a small vmap; nft 1.0.6 aborts
//!   listing that rule). Both keep a new Service at 50k under 0.1 ms p50; kpr-nftables
//!   took the first (a set per target chain, one dispatch rule each).
//! - Binding a map lookup with data (`... map @m`, `vmap`) to a rule in a chain no other
//!   lookup of that map is in walks every element of the map: a new DNAT chain over a
//!   500k-element endpoint map costs ~0.1 s. Lookups in plain sets (no data) bind freely.
//! - Dumping a set's elements costs the kernel O(n^2) (each 32 KiB answer walks the hash
//!   from the start): 0.4 s at 100k elements, 2.4 s at 250k, 6-11 s at 500k. Compare
//!   [`Socket::generation`] with the generation [`Socket::send`] returned before deciding
//!   to read a big table back.

mod attr;
mod batch;
#[cfg(test)]
mod captured;
mod consts;
mod dump;
mod error;
pub mod events;
mod expr;
pub mod ipset;
#[cfg(test)]
mod object_bytes;
mod objects;
mod socket;
mod wire;

pub use attr::Malformed;
pub use batch::{Batch, Operation};
pub use dump::{ChainInfo, ObjectInfo, RuleInfo, SetInfo, TableInfo};
pub use error::{BatchError, Error, MessageFailure};
pub use expr::{
    CmpOp, CtKey, DynsetOp, Expr, FibResult, MetaKey, NatKind, NumgenKind, PayloadBase, Register, RejectKind,
    addr_type, ct_state, ct_status, fib_flags, icmpx, nat_flags,
};
pub use objects::{
    BaseChain, Chain, ChainType, Counter, Data, Element, Family, Field, Hook, ObjectType, Policy, Set,
    SetData, Table, Value, Verdict, comment_userdata, render,
};
pub use socket::{MAX_TRANSACTION_BYTES, SPLIT_TRANSACTION_BYTES, Socket};
