//! The rules a sync wants in the kernel, as data: tables -> ordered chains -> rule lines.
//!
//! Keeping the ruleset as a value (instead of writing text while deciding) lets the proxier
//! choose afterwards which chains a sync must write, hash each chain to notice changes, and
//! count rules per table; rendering to `iptables-restore` input is then mechanical.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{DefaultHasher, Hash, Hasher};

use kpr_model::NamespacedName;

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

/// One chain and its rules, in order. A rule is the text after `-A <chain> `.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    pub name: String,
    pub kind: ChainKind,
    pub rules: Vec<String>,
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
    index: HashMap<String, usize>,
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
    pub fn declare(&mut self, name: &str, kind: ChainKind) {
        if !self.index.contains_key(name) {
            self.index.insert(name.to_string(), self.chains.len());
            self.chains.push(Chain {
                name: name.to_string(),
                kind,
                rules: Vec::new(),
            });
        }
    }

    /// Appends a rule to a chain, declaring it as a fixed chain if needed.
    pub fn append(&mut self, chain: &str, rule: String) {
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
}

impl Default for Ruleset {
    fn default() -> Self {
        Self {
            filter: TableRules::new(Table::Filter),
            nat: TableRules::new(Table::Nat),
            large_cluster: false,
            no_local_internal: 0,
            no_local_external: 0,
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

    /// The restore input of a full sync: every chain, nothing deleted.
    pub fn render_full(&self) -> Payload {
        let mut payload = PayloadBuilder::default();
        for table in self.tables() {
            payload.table(table, |_| true, &[]);
        }
        payload.finish()
    }
}

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
    pub fn table(&mut self, table: &TableRules, write: impl Fn(&Chain) -> bool, delete: &[String]) {
        let chosen: Vec<&Chain> = table.chains().iter().filter(|c| write(c)).collect();
        if chosen.is_empty() && delete.is_empty() {
            return;
        }
        let text = &mut self.payload.text;
        let _ = writeln!(text, "*{}", table.table);
        for chain in &chosen {
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
        for chain in &chosen {
            for rule in &chain.rules {
                let _ = writeln!(text, "-A {} {rule}", chain.name);
            }
            count.rules += chain.rules.len();
        }
        for name in delete {
            let _ = writeln!(text, "-X {name}");
        }
        text.push_str("COMMIT\n");
        self.payload.written.push((table.table, count));
    }

    pub fn finish(self) -> Payload {
        self.payload
    }
}

/// Builds one rule's text, quoting what iptables-restore would otherwise split.
#[derive(Debug, Default)]
pub struct Rule {
    text: String,
}

impl Rule {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one argument, in double quotes if it contains whitespace or is empty.
    pub fn arg(mut self, arg: &str) -> Self {
        if !self.text.is_empty() {
            self.text.push(' ');
        }
        if arg.is_empty() || arg.contains(char::is_whitespace) || arg.contains('"') {
            self.text.push('"');
            for c in arg.chars() {
                if c == '"' || c == '\\' {
                    self.text.push('\\');
                }
                self.text.push(c);
            }
            self.text.push('"');
        } else {
            self.text.push_str(arg);
        }
        self
    }

    pub fn args<S: AsRef<str>>(mut self, args: &[S]) -> Self {
        for a in args {
            self = self.arg(a.as_ref());
        }
        self
    }

    /// `-m comment --comment <text>`.
    pub fn comment(self, text: &str) -> Self {
        self.args(&["-m", "comment", "--comment"]).arg(text)
    }

    /// `-j <target>`.
    pub fn jump(self, target: &str) -> String {
        self.args(&["-j", target]).text
    }

    pub fn build(self) -> String {
        self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_quotes_only_what_needs_it() {
        let r = Rule::new()
            .comment("ns/svc:http cluster IP")
            .arg("-d")
            .arg("10.0.0.1")
            .jump("KUBE-SVC-X");
        assert_eq!(
            r,
            r#"-m comment --comment "ns/svc:http cluster IP" -d 10.0.0.1 -j KUBE-SVC-X"#
        );
        assert_eq!(
            Rule::new().comment("ns/svc:http").build(),
            "-m comment --comment ns/svc:http"
        );
    }

    #[test]
    fn payload_declares_writes_then_deletes() {
        let mut nat = TableRules::new(Table::Nat);
        nat.declare("KUBE-SERVICES", ChainKind::Fixed);
        nat.append("KUBE-SERVICES", "-j KUBE-SVC-A".into());
        nat.declare("KUBE-SVC-A", ChainKind::Service(NamespacedName::new("d", "a")));
        nat.append("KUBE-SVC-A", "-j KUBE-SEP-A".into());
        let mut b = PayloadBuilder::default();
        b.table(
            &nat,
            |c| c.kind == ChainKind::Fixed,
            &["KUBE-SEP-OLD".to_string()],
        );
        let p = b.finish();
        assert_eq!(
            p.text,
            "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SEP-OLD - [0:0]\n-A KUBE-SERVICES -j KUBE-SVC-A\n-X KUBE-SEP-OLD\nCOMMIT\n"
        );
        assert_eq!(p.written_rules(Table::Nat), 1);
        assert_eq!(p.written_rules(Table::Filter), 0);
    }

    #[test]
    fn content_hash_follows_rules() {
        let mut a = TableRules::new(Table::Nat);
        a.append("C", "-j X".into());
        let mut b = a.clone();
        assert_eq!(a.chains()[0].content_hash(), b.chains()[0].content_hash());
        b.append("C", "-j Y".into());
        assert_ne!(a.chains()[0].content_hash(), b.chains()[0].content_hash());
        a.declare("C", ChainKind::Canary);
        assert_eq!(
            a.chains()[0].kind,
            ChainKind::Fixed,
            "declare keeps the first kind"
        );
    }
}
