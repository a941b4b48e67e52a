//! iptables proxy mode, shaped like upstream kube-proxy's (1.28+).
//!
//! # Design
//!
//! - **Pure render.** [`build`] turns a [`kpr_state::DesiredState`] and [`IptablesOptions`]
//!   into a [`Ruleset`] (tables -> ordered chains -> rules) with upstream's chain names
//!   (from kpr-naming) and rule shapes, so `iptables-save` output matches upstream's and
//!   either proxy can take over a node from the other. Per-service decisions (which
//!   endpoints, REJECT vs DROP, which chains) come from kpr-state's `PortPlan`.
//!   [`render_dry_run`] prints what a full sync would apply.
//! - **One atomic write per sync, but for large full syncs on nf_tables.** Each sync is one
//!   `iptables-restore --noflush` covering filter and nat; chains that are not ours are never
//!   named, so never touched. Jump rules from built-in chains are ensured one by one (`-C`,
//!   then `-I`) on full syncs only. Exception: a full sync on iptables-nft declaring more
//!   than [`RESTORE_CHUNK_CHAINS`] chains is several restores ([`Ruleset::render_split`]),
//!   because `iptables-nft-restore --noflush` costs more than linearly in one input's size
//!   (10,000 Services x 10 endpoints: over 150 s as one input, about 24 s split). First
//!   restores of whole Services' chains (each Service switches atomically, old jumps still
//!   lead to existing chains), then one with the filter table, nat's shared chains and the
//!   deletions. Each Service stays atomic; the sync as a whole does not (upstream writes
//!   one transaction). iptables-legacy and partial syncs keep one transaction.
//! - **Partial syncs via chain hashes.** [`IptablesBackend`] remembers a hash of every
//!   per-service chain it wrote. A partial sync rewrites the fixed chains, the chains of
//!   services reported changed whose hash differs, and deletes chains that disappeared.
//! - **Full syncs** on the first sync, after a failure, when forced, hourly, when the
//!   large-cluster mode flips, and when the `KUBE-PROXY-CANARY` chain (created by full
//!   syncs in nat and filter) is gone: someone flushed the tables. Full syncs also delete
//!   stale service chains found with `iptables-save`.
//! - **I/O behind a trait.** [`Iptables`] is all the proxier and [`cleanup()`] need
//!   ([`cleanup_footprint`] removes another mode's rules, given its [`Footprint`]);
//!   [`IptablesCli`] runs the legacy, nft or auto-detected binaries, optionally behind a
//!   command prefix such as `ip netns exec NAME`.
//! - **IPv6** is a parameter (`IptablesOptions::family`, `ip6tables` binaries, `::1/128`
//!   NodePort exclusion, no localnet firewall), not a separate code path.
//! - **Rule text cannot be injected.** A rule is built only from literals of this crate,
//!   typed values and text checked by `kpr_naming::text` (no control characters, quotes or
//!   backslashes; comments cut to the kernel's 255 bytes); the compiler refuses a plain
//!   `String`. A service port whose name fails the check is left out and reported; the
//!   rest of the ruleset is written as usual.
//! - **Upstream's nfacct counters.** Where the kernel has nfnetlink_acct, the INVALID drop
//!   and the localhost NodePort jumps count packets with `-m nfacct` (upstream's names),
//!   for upstream's two packet metrics; see [`ensure_counters`].
//! - **Host facts at the edge.** The host's addresses come through kpr-host's `LocalAddresses`
//!   before each sync; the iptables version (for `--random-fully`) is asked once.

mod cleanup;
mod everywhere;
mod exec;
pub mod explain;
mod host;
mod jumps;
pub mod metrics;
mod mode;
mod names;
mod nfacct;
mod options;
mod proxier;
pub mod repair;
pub mod restore_syntax;
mod rules;
mod ruleset;
mod saved;

pub use cleanup::{
    CLEANUP_TABLES, CleanupError, CleanupReport, Footprint, IptablesFootprint, TableCleanup, cleanup,
    cleanup_footprint, plan_table, plan_table_for,
};
pub use everywhere::remove_everywhere;
pub use exec::{ExecError, Iptables, IptablesCli, IptablesVersion, Variant, restore_error_line};
pub use host::{HostError, ROUTE_LOCALNET, prepare_host};
pub use jumps::{JumpRule, jump_rules};
pub use mode::{IptablesMode, nat_table_works, restore_tool};
pub use names::NameCache;
pub use nfacct::{
    Accounting, CT_STATE_INVALID_DROPPED, Counter, LOCALHOST_NODEPORTS_ACCEPTED, NetlinkAccounting,
    NfacctCounters, NfacctError, ensure_counters, get_request, new_request, parse_counter,
};
pub use options::{
    DEFAULT_LARGE_CLUSTER_ENDPOINTS_THRESHOLD, DEFAULT_MASQUERADE_BIT, IptablesOptions, LocalMatch,
    OptionsError,
};
pub use proxier::{FULL_SYNC_PERIOD, FullSyncReason, IptablesBackend, RESTORE_CHUNK_CHAINS, SyncError};
pub use rules::{Mark, MarkWithMask, build, build_with_cache, refused_field, render_dry_run};
pub use ruleset::{
    Arg, Chain, ChainHashes, ChainKind, Payload, PayloadBuilder, RefusedPort, Rule, RuleBuilder, Ruleset,
    Table, TableCount, TableRules, WrittenCount,
};
pub use saved::{SavedChain, SavedRule, SavedTable};
