//! The rules a sync wants in the kernel, as data: tables -> ordered chains -> rule lines.
//!
//! Keeping the ruleset as a value (instead of writing text while deciding) lets the proxier
//! choose afterwards which chains a sync must write, hash each chain to notice changes, and
//! count rules per table; rendering to `iptables-restore` input is then mechanical.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use kpr_model::{NamespacedName, ObjectKind, ServicePortName};
use kpr_naming::{ChainName, Comment, InterfaceName, SafeText, UnsafeText};
use kpr_state::UnsafeObject;

/// The iptables tables kube-proxy touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    Filter,
    Nat,
    Mangle,
}

impl Table {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Filter => "filter",
            Self::Nat => "nat",
            Self::Mangle => "mangle",
        }
    }
}

impl std::fmt::Display for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a chain exists, which decides when a sync rewrites it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChainKind {
    /// A fixed chain (KUBE-SERVICES, ...): rewritten on every sync.
    Fixed,
    /// The empty KUBE-PROXY-CANARY chain: created on full syncs; its absence means someone
    /// flushed the tables.
    Canary,
    /// A chain of one service (KUBE-SVC/SVL/EXT/FW/SEP): rewritten when that service changed.
    Service(NamespacedName),
}

/// One chain and its rules, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    pub name: ChainName,
    pub kind: ChainKind,
    pub rules: Vec<Rule>,
}

impl Chain {
    /// A hash of the chain's rules, to tell whether a chain changed since the last sync.
    pub fn content_hash(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.rules.hash(&mut h);
        h.finish()
    }
}

/// The chains of one table, in the order they were first created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableRules {
    pub table: Table,
    chains: Vec<Chain>,
    index: HashMap<ChainName, usize>,
}

impl TableRules {
    pub fn new(table: Table) -> Self {
        Self {
            table,
            chains: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// Creates the chain if it does not exist yet (a chain may exist with no rules).
    pub fn declare(&mut self, name: &ChainName, kind: ChainKind) {
        if !self.index.contains_key(name) {
            self.index.insert(name.clone(), self.chains.len());
            self.chains.push(Chain {
                name: name.clone(),
                kind,
                rules: Vec::new(),
            });
        }
    }

    /// Appends a rule to a chain, declaring it as a fixed chain if needed.
    pub fn append(&mut self, chain: &ChainName, rule: Rule) {
        let i = match self.index.get(chain) {
            Some(&i) => i,
            None => {
                self.declare(chain, ChainKind::Fixed);
                self.chains.len() - 1
            }
        };
        self.chains[i].rules.push(rule);
    }

    pub fn chains(&self) -> &[Chain] {
        &self.chains
    }

    pub fn chain(&self, name: &str) -> Option<&Chain> {
        self.index.get(name).map(|&i| &self.chains[i])
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    pub fn rule_count(&self) -> usize {
        self.chains.iter().map(|c| c.rules.len()).sum()
    }
}

/// Rules of one table: those the proxy owns after a sync, and those the sync wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableCount {
    pub table: &'static str,
    pub total: usize,
    pub written: usize,
}

/// Everything one sync wants in the kernel, plus facts learned while rendering it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ruleset {
    pub filter: TableRules,
    pub nat: TableRules,
    /// Endpoint-level comments were left out because the cluster is large.
    pub large_cluster: bool,
    /// Service ports with internalTrafficPolicy Local and no local endpoint.
    pub no_local_internal: usize,
    /// Service ports with externalTrafficPolicy Local and no local endpoint.
    pub no_local_external: usize,
    /// Service ports left out because a name of theirs cannot be written into rule text.
    pub refused: Vec<RefusedPort>,
}

impl Default for Ruleset {
    fn default() -> Self {
        Self {
            filter: TableRules::new(Table::Filter),
            nat: TableRules::new(Table::Nat),
            large_cluster: false,
            no_local_internal: 0,
            no_local_external: 0,
            refused: Vec::new(),
        }
    }
}

/// A service port whose rules were left out, and why: rendering is pure, so the backend
/// logs and counts these.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RefusedPort {
    pub port: ServicePortName,
    /// The field holding the refused text, e.g. `metadata.name`.
    pub field: &'static str,
    pub error: UnsafeText,
}

impl RefusedPort {
    /// The refusal as the sync loop reports it (`SyncReport::newly_unsafe`).
    pub fn unsafe_object(&self) -> UnsafeObject {
        let port = &self.port;
        UnsafeObject {
            kind: ObjectKind::Service,
            // Escaped: the name is the unsafe text, and logs are text too.
            object: port.service.to_string().escape_debug().to_string(),
            field: self.field.to_string(),
            detail: format!(
                "port {:?} ({}): the text {}",
                port.to_string(),
                port.protocol,
                self.error
            ),
        }
    }
}

impl Ruleset {
    /// The tables in the order they are written (filter first, like upstream).
    pub fn tables(&self) -> [&TableRules; 2] {
        [&self.filter, &self.nat]
    }

    pub fn table(&self, table: Table) -> Option<&TableRules> {
        match table {
            Table::Filter => Some(&self.filter),
            Table::Nat => Some(&self.nat),
            Table::Mangle => None,
        }
    }

    /// Rules per table after a sync that wrote `payload`, for upstream's
    /// `sync_proxy_rules_iptables_total`/`_last`.
    pub fn table_counts(&self, payload: &Payload) -> Vec<TableCount> {
        self.table_counts_of(std::slice::from_ref(payload))
    }

    /// Like [`Self::table_counts`], for a sync written as several restores.
    pub fn table_counts_of(&self, payloads: &[Payload]) -> Vec<TableCount> {
        [Table::Filter, Table::Nat]
            .into_iter()
            .map(|table| TableCount {
                table: table.as_str(),
                total: self.table(table).map_or(0, TableRules::rule_count),
                written: payloads.iter().map(|p| p.written_rules(table)).sum(),
            })
            .collect()
    }

    /// The restore inputs of one sync, applied in order: the chains `write` selects in
    /// filter and nat, then `delete`'s nat chains deleted.
    ///
    /// With `max_chains` `None`, or when the sync declares at most `max_chains` chains in
    /// all, that is one input: one transaction, as upstream. Otherwise the nat per-Service
    /// chains ([`ChainKind::Service`]) are split off into inputs that each hold whole
    /// Services (every chain of a Service that is written, declarations and rules) and at
    /// most `max_chains` chains, unless one Service alone has more; the last input holds
    /// everything else: the filter table, nat's shared chains, and the deletions. Every
    /// state in between is consistent: a declaration flushes and refills a chain inside
    /// its input's transaction, so each Service is switched whole; the shared chains that
    /// jump into Services switch last, when every chain they name exists; nothing is
    /// deleted before nothing refers to it. The shared chains that Service chains jump to
    /// (KUBE-MARK-MASQ) go first, with the first Services, so their targets exist from the
    /// start; rewriting them with the same rules changes nothing for traffic.
    ///
    /// Why split at all: `iptables-nft-restore --noflush`'s cost grows faster than the
    /// size of one input (see [`crate::RESTORE_CHUNK_CHAINS`]).
    pub fn render_split(
        &self,
        write: impl Fn(&Chain) -> bool,
        delete: &[ChainName],
        max_chains: Option<usize>,
    ) -> Vec<Payload> {
        let filter: Vec<&Chain> = self.filter.chains().iter().filter(|c| write(c)).collect();
        let nat: Vec<&Chain> = self.nat.chains().iter().filter(|c| write(c)).collect();
        let single = || {
            let mut payload = PayloadBuilder::default();
            payload.chains(Table::Filter, &filter, &[]);
            payload.chains(Table::Nat, &nat, delete);
            vec![payload.finish()]
        };
        let Some(max_chains) = max_chains.map(|m| m.max(1)) else {
            return single();
        };
        if filter.len() + nat.len() + delete.len() <= max_chains {
            return single();
        }
        let Some(split) = self.split_nat(&nat) else {
            return single();
        };
        let mut payloads: Vec<Payload> = pack(split.first, split.services, max_chains)
            .into_iter()
            .map(|chunk| {
                let mut payload = PayloadBuilder::default();
                payload.chains(Table::Nat, &chunk, &[]);
                payload.finish()
            })
            .collect();
        let mut payload = PayloadBuilder::default();
        payload.chains(Table::Filter, &filter, &[]);
        payload.chains(Table::Nat, &split.last, delete);
        payloads.push(payload.finish());
        payloads
    }

    /// The nat chains of a write, sorted for [`Self::render_split`]; `None` when they must
    /// stay one transaction (no Service chain, or jumps that could cross restores).
    fn split_nat<'a>(&self, nat: &[&'a Chain]) -> Option<NatSplit<'a>> {
        // The Services' chains, grouped by Service in order of first appearance.
        let mut services: Vec<Vec<&Chain>> = Vec::new();
        let mut group_of: HashMap<&NamespacedName, usize> = HashMap::new();
        let mut shared: Vec<&Chain> = Vec::new();
        for &chain in nat {
            match &chain.kind {
                ChainKind::Service(owner) => {
                    let i = *group_of.entry(owner).or_insert_with(|| {
                        services.push(Vec::new());
                        services.len() - 1
                    });
                    services[i].push(chain);
                }
                _ => shared.push(chain),
            }
        }
        if services.is_empty() {
            return None;
        }
        let first = shared_targets(&services, &shared);
        // A shared chain that must go first may not itself need a Service's chain, nor
        // may a Service's chain jump into another Service's (upstream's rules never do).
        let needs_a_service = first
            .iter()
            .flat_map(|c| c.rules.iter().filter_map(Rule::jump_target))
            .any(|target| self.service_of(target).is_some());
        if needs_a_service || self.services_cross(&services) {
            return None;
        }
        let (first, last): (Vec<&Chain>, Vec<&Chain>) = shared
            .into_iter()
            .partition(|c| first.iter().any(|f| f.name == c.name));
        Some(NatSplit {
            first,
            services,
            last,
        })
    }

    /// The Service owning nat chain `name`, if it is a Service's chain.
    fn service_of(&self, name: &str) -> Option<&NamespacedName> {
        match self.nat.chain(name).map(|c| &c.kind) {
            Some(ChainKind::Service(owner)) => Some(owner),
            _ => None,
        }
    }

    /// Whether a Service's chain jumps into another Service's.
    fn services_cross(&self, services: &[Vec<&Chain>]) -> bool {
        services.iter().flatten().any(|chain| {
            let own = self.service_of(chain.name.as_str());
            chain
                .rules
                .iter()
                .filter_map(Rule::jump_target)
                .filter_map(|target| self.service_of(target))
                .any(|target| Some(target) != own)
        })
    }

    /// The restore input of a full sync: every chain, nothing deleted.
    pub fn render_full(&self) -> Payload {
        self.render_changed(&ChainHashes::new())
    }

    /// The restore input that brings chains last written as `written` to this ruleset:
    /// only the chains whose rules differ (or that `written` lacks), nothing deleted; empty
    /// when nothing changed.
    pub fn render_changed(&self, written: &ChainHashes) -> Payload {
        let mut payload = PayloadBuilder::default();
        for table in self.tables() {
            let changed = |chain: &Chain| {
                written.get(&(table.table, chain.name.clone())) != Some(&chain.content_hash())
            };
            payload.table(table, changed, &[]);
        }
        payload.finish()
    }

    /// Every chain's [`Chain::content_hash`], what [`Self::render_changed`] compares with.
    pub fn chain_hashes(&self) -> ChainHashes {
        self.tables()
            .into_iter()
            .flat_map(|table| {
                table
                    .chains()
                    .iter()
                    .map(|chain| ((table.table, chain.name.clone()), chain.content_hash()))
            })
            .collect()
    }
}

/// Chains as written by a restore, by table and name: their [`Chain::content_hash`].
pub type ChainHashes = HashMap<(Table, ChainName), u64>;

/// Rules written for one table by one restore.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WrittenCount {
    pub chains: usize,
    pub rules: usize,
    pub deleted_chains: usize,
}

/// `iptables-restore` input and what it writes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Payload {
    pub text: String,
    pub written: Vec<(Table, WrittenCount)>,
}

impl Payload {
    pub fn written_rules(&self, table: Table) -> usize {
        self.written
            .iter()
            .find(|(t, _)| *t == table)
            .map_or(0, |(_, w)| w.rules)
    }
}

/// Assembles restore input table by table.
#[derive(Debug, Default)]
pub struct PayloadBuilder {
    payload: Payload,
}

impl PayloadBuilder {
    /// Writes the chains of `table` that `write` selects (declaring a chain flushes it, so
    /// the rules that follow replace its content), then deletes `delete`. Deleted chains
    /// are declared too: flushing first drops their own jumps, and iptables-restore
    /// requires the `:chain` line before `-X`. Deletion comes last so any chain that
    /// referenced them has already been rewritten in the same transaction.
    pub fn table(&mut self, table: &TableRules, write: impl Fn(&Chain) -> bool, delete: &[ChainName]) {
        let chosen: Vec<&Chain> = table.chains().iter().filter(|c| write(c)).collect();
        self.chains(table.table, &chosen, delete);
    }

    /// Like [`Self::table`], with the chains to write given (written in the order given).
    pub fn chains(&mut self, table: Table, chosen: &[&Chain], delete: &[ChainName]) {
        if chosen.is_empty() && delete.is_empty() {
            return;
        }
        let text = &mut self.payload.text;
        let _ = writeln!(text, "*{table}");
        for chain in chosen {
            let _ = writeln!(text, ":{} - [0:0]", chain.name);
        }
        for name in delete {
            let _ = writeln!(text, ":{name} - [0:0]");
        }
        let mut count = WrittenCount {
            chains: chosen.len(),
            deleted_chains: delete.len(),
            rules: 0,
        };
        for chain in chosen {
            for rule in &chain.rules {
                let _ = write!(text, "-A {} ", chain.name);
                rule.write_restore(text);
                text.push('\n');
            }
            count.rules += chain.rules.len();
        }
        for name in delete {
            let _ = writeln!(text, "-X {name}");
        }
        text.push_str("COMMIT\n");
        self.payload.written.push((table, count));
    }

    pub fn finish(self) -> Payload {
        self.payload
    }
}

/// Separates the arguments inside a [`Rule`]'s one string. No argument can contain it:
/// every text is checked (no control characters) or is a typed value.
const ARG_SEPARATOR: char = '\0';

/// A value that may be written as one rule argument.
///
/// Implemented only for text written in this crate's source (`&'static str`), for text that
/// passed kpr-naming's check ([`SafeText`], [`Comment`], [`InterfaceName`], [`ChainName`]), and
/// for typed values whose text form is digits, dots, colons and slashes. A `String` from an
/// object does not compile: it must go through the check first. Sealed: other crates (the
/// userspace mode's portals) build rules with it but cannot widen what it accepts.
pub trait Arg: sealed::Sealed {
    #[doc(hidden)]
    fn push_to(&self, out: &mut String);
}

pub(crate) mod sealed {
    pub trait Sealed {}
    impl Sealed for &'static str {}
    impl<T: Sealed + ?Sized> Sealed for &T {}
    impl Sealed for kpr_naming::SafeText {}
    impl Sealed for kpr_naming::Comment {}
    impl Sealed for kpr_naming::InterfaceName {}
    impl Sealed for kpr_naming::ChainName {}
    impl Sealed for std::net::IpAddr {}
    impl Sealed for ipnet::IpNet {}
    impl Sealed for std::net::SocketAddr {}
    impl Sealed for u16 {}
    impl Sealed for u32 {}
}

impl Arg for &'static str {
    fn push_to(&self, out: &mut String) {
        debug_assert!(is_literal_arg(self), "literal argument {self:?}");
        out.push_str(self);
    }
}

/// What a literal argument in the source may look like: the checked-text rules, except
/// that options (`-m`, `!`) may start with '-'.
fn is_literal_arg(arg: &str) -> bool {
    !arg.is_empty() && !arg.contains(|c: char| c.is_control() || c == '"' || c == '\\')
}

impl<T: Arg + ?Sized> Arg for &T {
    fn push_to(&self, out: &mut String) {
        (**self).push_to(out);
    }
}

macro_rules! display_arg {
    ($($t:ty),+) => {$(
        impl Arg for $t {
            fn push_to(&self, out: &mut String) {
                let _ = write!(out, "{self}");
            }
        }
    )+};
}

display_arg!(
    SafeText,
    Comment,
    InterfaceName,
    ChainName,
    IpAddr,
    IpNet,
    SocketAddr,
    u16,
    u32
);

/// One rule: its arguments after `-A <chain>`, each checked or typed when it was added.
/// The arguments stay separate until the payload is written, so each is quoted exactly
/// once and a test can compare what iptables-restore reads with what was meant.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Rule(Box<str>);

impl Rule {
    /// Starts a rule.
    pub fn builder() -> RuleBuilder {
        RuleBuilder::default()
    }

    /// The arguments, as iptables should receive them.
    pub fn args(&self) -> impl Iterator<Item = &str> {
        self.0.split(ARG_SEPARATOR).filter(|a| !a.is_empty())
    }

    /// The rule as `iptables-restore` input: arguments with spaces are double-quoted (no
    /// argument holds a quote or backslash that would need escaping).
    pub fn write_restore(&self, out: &mut String) {
        for (i, arg) in self.args().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            if arg.contains(' ') {
                out.push('"');
                out.push_str(arg);
                out.push('"');
            } else {
                out.push_str(arg);
            }
        }
    }

    /// The chain a `-j`/`-g` argument names, if any (targets such as `MARK` included).
    pub fn jump_target(&self) -> Option<&str> {
        let mut args = self.args();
        while let Some(arg) = args.next() {
            if arg == "-j" || arg == "-g" || arg == "--jump" || arg == "--goto" {
                return args.next();
            }
        }
        None
    }

    pub fn restore_text(&self) -> String {
        let mut out = String::with_capacity(self.0.len() + 4);
        self.write_restore(&mut out);
        out
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.restore_text())
    }
}

/// Builds a [`Rule`] from [`Arg`]s only.
#[derive(Debug, Default)]
pub struct RuleBuilder {
    args: String,
}

impl RuleBuilder {
    pub fn arg(mut self, arg: impl Arg) -> Self {
        if !self.args.is_empty() {
            self.args.push(ARG_SEPARATOR);
        }
        arg.push_to(&mut self.args);
        self
    }

    pub fn args(mut self, args: &[&'static str]) -> Self {
        for a in args {
            self = self.arg(*a);
        }
        self
    }

    /// `-m comment --comment <text>`.
    pub fn comment(self, text: &Comment) -> Self {
        self.args(&["-m", "comment", "--comment"]).arg(text)
    }

    /// `-j <target>`.
    pub fn jump(self, target: impl Arg) -> Rule {
        self.arg("-j").arg(target).build()
    }

    pub fn build(self) -> Rule {
        Rule(self.args.into_boxed_str())
    }
}

/// A write's nat chains, in the order [`Ruleset::render_split`] applies them.
struct NatSplit<'a> {
    /// Shared chains the Services' chains jump to: with the first Services.
    first: Vec<&'a Chain>,
    /// Each Service's chains.
    services: Vec<Vec<&'a Chain>>,
    /// The other shared chains: last.
    last: Vec<&'a Chain>,
}

/// The shared chains that Services' chains jump to, and those those jump to in turn.
fn shared_targets<'a>(services: &[Vec<&'a Chain>], shared: &[&'a Chain]) -> Vec<&'a Chain> {
    let by_name: HashMap<&str, &Chain> = shared.iter().map(|&c| (c.name.as_str(), c)).collect();
    let mut found: Vec<&Chain> = Vec::new();
    let mut todo: Vec<&Chain> = services.iter().flatten().copied().collect();
    while let Some(chain) = todo.pop() {
        for target in chain.rules.iter().filter_map(Rule::jump_target) {
            if let Some(&target) = by_name.get(target)
                && !found.iter().any(|f| f.name == target.name)
            {
                found.push(target);
                todo.push(target);
            }
        }
    }
    found
}

/// `first`, then whole Services, packed into chunks of at most `max_chains` chains (a
/// Service larger than that alone in its chunk).
fn pack<'a>(first: Vec<&'a Chain>, services: Vec<Vec<&'a Chain>>, max_chains: usize) -> Vec<Vec<&'a Chain>> {
    let mut chunks: Vec<Vec<&Chain>> = vec![first];
    for group in services {
        match chunks.last_mut() {
            Some(current) if current.is_empty() || current.len() + group.len() <= max_chains => {
                current.extend(group)
            }
            _ => chunks.push(group),
        }
    }
    chunks
}

#[cfg(test)]
mod tests;
