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
//! - [`Socket::tables`], [`Socket::chains`], [`Socket::sets`], [`Socket::elements`] and
//!   [`Socket::rules`] read a table back as typed values, for reconciling and debugging.
//! - [`Expr`] is the closed set of expressions kube-proxy-style rules need (payload,
//!   meta, ct, cmp, bitwise, lookup/vmap, immediate verdicts, numgen, nat, masquerade,
//!   reject, counter, dynset, fib); anything else reads back as [`Expr::Other`].
//!
//! The API speaks nft's concepts and nothing of Kubernetes. Keys and values are bytes
//! laid out as the kernel compares them; [`Value`] builds them (each field padded to a
//! 32-bit register; addresses and ports big-endian, marks and numgen slots host-endian).
//!
//! Every socket opens in the network namespace of the calling thread.

mod attr;
mod batch;
mod consts;
mod dump;
mod error;
mod expr;
mod objects;
mod socket;
mod wire;

pub use attr::Malformed;
pub use batch::{Batch, Operation};
pub use dump::{ChainInfo, RuleInfo, SetInfo, TableInfo};
pub use error::{BatchError, Error, MessageFailure};
pub use expr::{
    CmpOp, CtKey, DynsetOp, Expr, FibResult, MetaKey, NatKind, NumgenKind, PayloadBase, Register, RejectKind,
    addr_type, ct_state, ct_status, fib_flags, icmpx, nat_flags,
};
pub use objects::{
    BaseChain, Chain, ChainType, Data, Element, Family, Field, Hook, Policy, Set, SetData, Table, Value,
    Verdict,
};
pub use socket::{MAX_TRANSACTION_BYTES, Socket};
