//! nftables proxy mode, built for scale: a constant number of kernel objects per Service
//! (elements of shared sets and maps, never a set or a chain of its own) and syncs that
//! send only what changed.
//!
//! # Why this object design
//!
//! Measured on these machines (Linux 6.18, nft 1.0.6, 10 endpoints per Service, cold load
//! of the whole table with `nft -f`, ../shared/docs/KERNEL-COSTS.md):
//!
//! | design | 10k Services | 50k Services | one endpoint change at 10k |
//! |---|---:|---:|---:|
//! | upstream's: chain per Service and per endpoint, anonymous vmap per Service | 180 s | > 300 s | 1.03 s |
//! | a named map per Service | 8.1 s | > 300 s | 90 ms |
//! | **D3: no per-Service chain or set** (this crate) | 1.28 s | 6.2 s | 21 ms (nft's start-up) |
//!
//! A set per Service is the quadratic trap: binding or looking up a set walks the
//! transaction's or the table's set list. Chains are hashed, so shared chains cost little,
//! but a chain per endpoint multiplies objects by the endpoint count. D3 keeps the table's
//! sets and chains fixed, or shared by every Service of the same shape, and puts each
//! Service in as set and map elements. No element holds a verdict: adding a `goto`
//! element to a verdict map makes the kernel re-validate every element of every verdict
//! map the base chains reach before it commits (linear in Services), while an element of
//! a plain set or a data map is committed without any validation.
//!
//! # The table (`ip kube-proxy`, `ip6 kube-proxy`: upstream's names)
//!
//! Fixed, whatever the cluster: upstream's base chains and check chains (same names,
//! hooks and priorities, so the layout reads like upstream's), the dispatch chains, and
//! these maps and sets:
//!
//! - the entries: every cluster IP, external IP and load-balancer IP (`addr . proto .
//!   port`) and NodePort (`proto . port`) is an element of the plain set of the shared
//!   chain it goes to, `<chain>-ips` or `<chain>-nodeports` (these sets come and go with
//!   their targets, see below). `services` goes to `service-dispatch`, which holds one rule
//!   per such set (`ip daddr . meta l4proto . th dport @pick-service-endpoints-tcp-3-ips
//!   goto pick-service-endpoints-tcp-3`) and ends by going to `nodeport-dispatch` for
//!   NodePort destinations, one rule per `-nodeports` set. Entries are disjoint (a
//!   destination has one holder), so rule order does not matter;
//! - `no-endpoint-reject-ips` / `no-endpoint-drop-ips` and their `-nodeports` twins:
//!   destinations without usable endpoints, looked up by fixed rules of the
//!   `*-endpoints-check` chains (`goto reject-chain` or `drop`);
//!   `cluster-ips` (wrong ports rejected), `service-cidrs` (unallocated cluster IPs
//!   dropped; the CIDRs of the ServiceCIDR objects in the desired state plus any fixed in the
//!   options, outermost networks only since an interval set refuses overlaps), `nodeport-ips` (with `--nodeport-addresses`), `firewall-ips` +
//!   `firewall-allow` (`addr . proto . port . source-range`, an interval set: the
//!   loadBalancerSourceRanges), `hairpin` (`ep . ep`: a pod reaching itself is
//!   masqueraded);
//! - `affinity-<space>-<proto>`: dynamic sets remembering `client . key . slot` for
//!   ClientIP affinity, with per-element timeouts, one per key space (below) and protocol.
//!
//! Shared chains and the endpoint maps they own, created when the first entry needs them
//! and deleted with the last (a chain some entry goes to directly also has its entry set
//! and dispatch rule, created and deleted with it):
//!
//! - endpoint maps, one per key space, protocol, endpoint count M and affinity timeout T
//!   (none for random picks): `service-endpoints-<proto>-<M>[-t<T>]` (`addr . port . slot
//!   : endpoint addr . port`), `nodeport-endpoints-<proto>-<M>[-t<T>]` (`port . slot :
//!   ...`) and their `-shortcut-` twins holding the cluster-wide endpoints of
//!   `externalTrafficPolicy: Local` Services for pod and host traffic. Per count, not one
//!   per key space, because a rule that looks a map up with a result (a DNAT) makes the
//!   kernel walk every element of that map when the rule is added (`nf_tables_bind_set`;
//!   on this kernel even when another rule of the same chain already binds it): a map is
//!   created just before its pick or sticky chain, empty, so binding it walks nothing,
//!   and it is deleted with that chain. Maps come and go with distinct shapes, never with
//!   Services.
//! - `pick-<map>-<M>`: `dnat to <key> . numgen random mod M map @<map>-<M>`: uniform
//!   among the M slots of the entry's key. One chain per distinct endpoint count, not per
//!   Service.
//! - `sticky-<map>-<M>-t<T>` + `slot-<map>-<M>-t<T>-<k>`: ClientIP affinity. The sticky
//!   chain looks the client up in the affinity set for each slot k < M and goes to that
//!   slot's chain, else picks a slot at random; the slot chain refreshes the client's entry
//!   (`update @affinity ... timeout T`) and DNATs to slot k of `<map>-<M>-t<T>`. Chains per
//!   distinct (M, T) and per slot index, not per Service. nft cannot feed one map lookup's
//!   result into another, hence a constant slot is written `numgen random mod 1 offset k`.
//! - `masq-<choice>`: external traffic with policy Cluster: mark for masquerade, choose.
//! - `local-<choice>-via-<choice>`: external traffic with policy Local: pods (local
//!   detector) and the node itself (`fib saddr type local`, masqueraded) go to every
//!   endpoint through the shortcut map, the rest to the node's own endpoints; with none,
//!   the packet falls through and `no-endpoint-*` drops it.
//!
//! Per Service port: one `cluster-ips` element, one entry per destination (cluster IP,
//! each external address, the NodePort: an element of its target's entry set) or its
//! `no-endpoint-*` element, M endpoint-map
//! elements per entry (2M for Local external entries), one `hairpin` element per distinct
//! endpoint IP (shared by every Service using it), and `firewall-*` elements per source range. No chain, no set. Cluster-IP
//! masquerading of non-pod traffic is one rule in `services` for all Services
//! (`ip daddr @cluster-ips <not from pods> jump mark-for-masquerade`).
//!
//! # Syncs
//!
//! Generation is pure ([`build`]: desired state + options + node addresses -> [`Ruleset`],
//! golden-tested through [`render_text`]). Each Service port yields a [`Bundle`] (its
//! entries, its endpoint slot orders, the shared chains it uses, the destinations it
//! holds); a partial sync recomputes the bundles of changed Services only and the
//! [`Ledger`] (who holds each destination; reference counts of cluster IPs, hairpin
//! addresses and shared chains) turns their difference into one ordered [`Batch`]: new
//! endpoint maps and chains, element deletes, element adds, chains and their maps no
//! longer used. A destination (address,
//! protocol, port, or NodePort) is written by one port only: a second claimant is left out
//! and logged, and gets it in the full sync that follows the holder's release. Endpoints
//! keep their slots across syncs (`slots`): one endpoint replaced is one element; a count
//! change moves the last slot into the hole, moves the port's slots (M old, M' new
//! elements) into the endpoint map of the new count and repoints the entry at
//! `pick-...-M'`.
//! A full sync rebuilds the table: in place after a successful sync (our chains and sets
//! flushed, anything else in the table deleted by handle, the dynamic affinity sets and
//! the endpoints' slots kept, so sticky clients stay put), or deleted and recreated on the
//! first sync and after a failure. It is streamed in batches of at most `max_batch_elements` elements, endpoints before the
//! entries leading to them, so no batch holds the nf_tables mutex long and only one batch
//! is in memory. [`NftablesBackend`] decides full vs partial and reconciles (see
//! `backend`); it talks to the kernel only through [`Transport`]: [`NetlinkTransport`]
//! (what the proxy runs: nf_tables netlink from the process, see `netlink`) or [`NftCli`]
//! (`nft -f -`: tests, tools and the oracle the kernel tests compare with). [`check_support`] probes,
//! at start-up and without committing anything, every kernel and nft feature used, and
//! names the first one missing.
//!
//! # Measured here (`examples/scale.rs`, release build, one run each)
//!
//! 10 endpoints per Service (one endpoint count, so T = 1 dispatch rule, see below), in a
//! throw-away namespace, 100 changes each, on a shared 2-core machine (load 3-6: p99s are
//! noisy); "cold" is the backend's whole first sync (build + lowering + kernel); "state" is
//! what the backend keeps between syncs (RSS after the cold sync minus RSS with the test's
//! own World, run with `SCALE_SKIP_DRY=1` so no memory kept from the example's separate dry
//! build counts):
//!
//! | Services | transport | cold full sync | one endpoint change p50/p99 | one new Service p50/p99 | state |
//! |---:|---|---:|---:|---:|---:|
//! | 1k | netlink | 39 ms | 20 / 70 us | 29 / 42 us | ~5 MiB |
//! | 1k | `nft -f` | 0.15 s | 15.7 / 35.2 ms | 3.0 / 3.6 ms | ~3 MiB |
//! | 10k | netlink | 0.31 s | 24 / 80 us | 32 / 48 us | ~24 MiB |
//! | 10k | `nft -f` | 1.21 s | 11.9 / 32.0 ms | 3.1 / 3.6 ms | ~24 MiB |
//! | 50k | netlink | 1.55 s (56 batches of 20k elements) | 33 / 127 us | 44 / 83 us | ~122 MiB |
//! | 50k | `nft -f` | 5.9 s | 15.8 / 32.0 ms | 2.9 / 3.3 ms | ~123 MiB |
//!
//! The "state" column predates issue 12's reductions (hairpin and cluster IP counts keyed
//! per family, IPv4 slot orders as `SocketAddrV4`, no spare capacity in the port index):
//! kpr-bench's heap table per stage now counts ~46 MiB for the backend at 50k (heap bytes,
//! not RSS), and the cold load's transient peak ~15 MiB above that.
//!
//! (Endpoint maps per count, these runs; with one endpoint map per key space, the runs
//! before: 0.42 s / 2.15 s cold at 10k / 50k over netlink, the same per-change figures
//! within the noise. Cold loads create every map and chain before any element, so the
//! map layout does not change their kernel work; one run each.)
//!
//! A replaced endpoint is 4 element operations (one transaction) at any scale. A new
//! Service whose target chain exists is element adds to plain sets and data maps only,
//! which the kernel commits without validating anything: flat in Services. While entries
//! were `goto` elements of one verdict map, each new Service made the kernel re-validate
//! every element of every verdict map the base chains reach before it committed (same
//! runs, netlink: 0.70 / 5.0 ms at 10k, 8.7 / 13.1 ms at 50k; 7.8 / 15.8 ms in another).
//!
//! Rarer changes (netlink, 10k / 50k, p50 / p99, same runs): a target set coming or going
//! (an external IP's `masq-...` target, the pick chain existing) rewrites the dispatch
//! chain: 0.18 / 0.31 ms and 0.20 / 0.41 ms, including the read-back of the rewritten
//! chain's rules; it was 0.69 / 4.7 ms and 6.1 / 15.9 ms with the verdict map.
//!
//! A new endpoint count or affinity timeout brings new chains whose DNAT binds an
//! endpoint map, and the kernel walks every element of a map a new rule binds
//! (`nf_tables_bind_set` -> `nft_rhash_walk`; measured with `nft` on a 500k-element map:
//! ~90 ms per rule, and as much for a second rule in a chain that already binds it, so
//! the walk is not skipped for a chain already bound on this kernel, 6.18). With one map
//! per key space that walk covered every Service's endpoints; with a map per count the
//! new chains bind their own new, empty map. Same runs, netlink, p50 / p99, 10k / 50k
//! (before: one map per key space, `examples/scale.rs` of the same commit):
//!
//! | change | before, 10k | before, 50k | after, 10k | after, 50k |
//! |---|---:|---:|---:|---:|
//! | a Service with an endpoint count no other has (map, pick chain, entry set, dispatch rewrite) | 7.9 / 13.1 ms | 93 / 123 ms | 0.38 / 0.50 ms | 0.39 / 0.55 ms |
//! | a ClientIP Service with a new timeout (map, sticky chain, 10 slot chains, ...) | 72 / 79 ms | 919 / 996 ms | 2.2 / 3.3 ms | 2.3 / 3.5 ms |
//! | a count change to an existing count (slots move between maps: M + M' elements) | 51 / 244 us | 59 / 193 us | 50 / 221 us | 64 / 180 us |
//!
//! A count change writes 22 elements and rules instead of 4 (10 slots out of one map,
//! 9 into another, the entry moved, a hairpin element), still one transaction of element
//! operations; its time does not change measurably. Through `nft -f` every one of these
//! is nft's start-up (~16 / 24-36 ms); before, the new count was 28 / 40 ms and 101 /
//! 112 ms, the new timeout 87 / 98 ms and 539 / 956 ms.
//!
//! Per packet: the first packet of a connection walks the dispatch rules in name order
//! until its entry's set matches, one hash lookup each (~30 ns per rule walked, measured
//! with connects to a VIP behind the last of T rules: T = 1000 added ~30 us to a ~15 us
//! loopback connect, T = 10 nothing measurable). T is the number of entry sets in use:
//! 1 in the benchmark shape (plus the NodePort hand-over rule for NodePort traffic); in
//! general one per distinct (protocol, endpoint count) of cluster IPs, times affinity
//! timeouts, plus one per external-policy shape (masquerade or Local with its local and
//! cluster counts), so bounded by the number of Service ports and in practice by the
//! spread of replica counts (tens to a few hundred). Later packets never reach the nat
//! chains.
//!
//! # Not here
//!
//! No name is built from API text: every set, map and chain name comes from literals and
//! numbers ([`names`]); foreign objects are deleted by their kernel handle, never by name.
//! The only API text in the table is the comment `ns/svc:port` on entry elements (one per
//! destination of a Service port, as upstream's nftables mode writes it, never per
//! endpoint), passed through kpr-naming's text gate and cut to nft's limit; it decides
//! nothing, it lets people and `kube-proxy-rs explain` name the Service. Known limits: a full sync
//! that recreates the table (first sync, after a failure) resets ClientIP affinity; when
//! the endpoint count of an affinity Service shrinks, clients stuck to the moved last slot
//! pick again; while a chunked full sync loads, Services not yet loaded are unreachable.

mod backend;
mod batch;
mod build;
pub mod explain;
mod localhost;
pub mod metrics;
mod mode;
mod model;
pub mod names;
mod netlink;
mod options;
mod render;
pub mod repair;
mod slots;
mod support;
mod transport;

pub use backend::{
    DEFAULT_RECONCILE_PERIOD, FULL_SYNC_PERIOD, FullSyncReason, NftablesBackend, SyncError, cleanup,
};
pub use batch::{
    Batch, BatchCounts, ElementAdd, FullStart, Ledger, Op, batch_text, full_batches, stream_full,
};
pub use build::{
    Bundle, Context, Dest, GroupKey, Owner, Ruleset, SlotGroup, build, build_from, declared_sets,
    dispatch_rules, fixed_chains, node_bundle, port_bundle, shared_rules,
};
pub use localhost::LocalhostProxy;
pub use mode::NftablesMode;
pub use model::{
    ELEMENT_COMMENT_MAX_BYTES, ElemKey, ElemValue, Element, Key, Match, Rule, Slot, Stmt, element_comment,
};
pub use netlink::{GenerationLog, NetlinkTransport, lower as lower_batch, rule_exprs};
pub use options::{
    DEFAULT_MASQUERADE_BIT, DEFAULT_MAX_BATCH_ELEMENTS, LocalhostNodePorts, NftablesOptions, OptionsError,
};
pub use render::{TABLE, render_text, rule_text};
pub use slots::{SlotOrder, assign as assign_slots};
pub use support::{MissingFeature, check_support};
pub use transport::{Listing, NftCli, NoKernel, Transport, TransportError, parse_listing};

/// What a full sync of `state` loads, as an `nft -f` script (for `--dry-run`).
pub fn render_dry_run(
    state: &kpr_state::DesiredState,
    opts: &NftablesOptions,
    local_addresses: &[std::net::IpAddr],
) -> String {
    render_text(&build(state, opts, local_addresses), opts)
}
