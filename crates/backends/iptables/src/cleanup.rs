//! `--cleanup`, and the start-up cleanup of other modes: remove every rule and chain one
//! mode (ours or upstream's) wrote into iptables, and nothing else.
//!
//! Each mode that writes iptables rules describes what it writes as a [`Footprint`] (this
//! crate describes iptables mode's, [`IptablesFootprint`]; ipvs and userspace modes describe
//! theirs in their own crates). Planning is pure: from `iptables-save` output it decides
//! which chains are the footprint's and which rules elsewhere point into them (whatever
//! their match arguments, so older upstream variants of the jump rules go too). Each table
//! is then cleaned with one `iptables-restore --noflush`, so a table is either fully cleaned
//! or left as it was. Rules in other user-defined chains are never touched: a chain of ours
//! that one still jumps to is flushed but kept, since deleting it would fail the whole
//! table.
//!
//! A mode that shares chains with another (ipvs mode writes iptables mode's KUBE-SERVICES)
//! keeps them, but its rules in them go: those that jump to its own chains, and those it
//! [recognises as its own](Footprint::owns_rule) (ipvs mode's rules matching its ipsets, so
//! that those sets can be destroyed afterwards).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use kpr_naming::{ChainName, chain, is_service_chain};

use crate::exec::{ExecError, Iptables};
use crate::rules::LOCALNET_COMMENT;
use crate::ruleset::Table;
use crate::saved::{SavedRule, SavedTable, split_words};

/// The tables a kube-proxy writes to, in cleanup order.
pub const CLEANUP_TABLES: [Table; 3] = [Table::Nat, Table::Filter, Table::Mangle];

/// What one mode writes into iptables, as far as removing it needs to know.
pub trait Footprint: Sync + std::fmt::Debug {
    /// A chain the mode creates: flushed and deleted with it.
    fn owns(&self, table: Table, name: &str, saved: &SavedTable) -> bool;

    /// A chain that stays but that the mode also writes rules into (a chain it shares with
    /// another mode); its rules there that point at what goes are deleted. Built-in chains
    /// count anyway.
    fn writes_into(&self, table: Table, name: &str) -> bool;

    /// A rule recognisable as the mode's by what it matches rather than where it jumps,
    /// deleted wherever the mode writes rules.
    fn owns_rule(&self, rule: &SavedRule) -> bool;
}

/// iptables mode's chains (ours and upstream's): the fixed ones, the per-Service ones, and
/// KUBE-FIREWALL when all it holds is the localnet rule.
#[derive(Clone, Copy, Debug, Default)]
pub struct IptablesFootprint;

impl Footprint for IptablesFootprint {
    fn owns(&self, table: Table, name: &str, saved: &SavedTable) -> bool {
        iptables_mode_owns(table, name, saved)
    }

    fn writes_into(&self, _table: Table, _name: &str) -> bool {
        false
    }

    fn owns_rule(&self, _rule: &SavedRule) -> bool {
        false
    }
}

/// What cleanup removes from one table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableCleanup {
    pub table: Table,
    /// Rules in chains that stay (built-in chains, or kube-proxy chains of a mode that
    /// stays) that jump to a removed chain or match an IPVS-mode ipset being removed.
    pub jumps: Vec<SavedRule>,
    /// Our chains: flushed and deleted.
    pub delete: Vec<String>,
    /// Our chains that a foreign user-defined chain still jumps to: flushed, kept.
    pub flush_only: Vec<String>,
}

impl TableCleanup {
    pub fn is_empty(&self) -> bool {
        self.jumps.is_empty() && self.delete.is_empty() && self.flush_only.is_empty()
    }

    /// The restore input that carries the cleanup out.
    pub fn payload(&self) -> String {
        let mut text = format!("*{}\n", self.table);
        for name in self.delete.iter().chain(&self.flush_only) {
            let _ = writeln!(text, ":{name} - [0:0]");
        }
        for rule in &self.jumps {
            let _ = writeln!(text, "-D {} {}", rule.chain, rule.spec);
        }
        for name in &self.delete {
            let _ = writeln!(text, "-X {name}");
        }
        text.push_str("COMMIT\n");
        text
    }
}

/// Fixed chains only a kube-proxy creates, per table.
fn fixed_chains(table: Table) -> &'static [&'static str] {
    match table {
        Table::Nat => &[
            chain::SERVICES,
            chain::NODEPORTS,
            chain::POSTROUTING,
            chain::MARK_MASQ,
            chain::CANARY,
        ],
        Table::Filter => &[
            chain::SERVICES,
            chain::EXTERNAL_SERVICES,
            chain::NODEPORTS,
            chain::FORWARD,
            chain::PROXY_FIREWALL,
            chain::CANARY,
        ],
        Table::Mangle => &[chain::CANARY],
    }
}

/// Kubelet owns KUBE-FIREWALL too; it is ours only if every rule in it is the localnet rule
/// kube-proxy writes.
fn firewall_is_ours(saved: &SavedTable) -> bool {
    saved.rules_of(chain::FIREWALL).all(|rule| {
        let words = split_words(&rule.spec);
        rule.target.as_deref() == Some("DROP") && words.iter().any(|w| w == LOCALNET_COMMENT)
    })
}

/// A chain iptables mode (ours or upstream's) creates.
fn iptables_mode_owns(table: Table, name: &str, saved: &SavedTable) -> bool {
    if fixed_chains(table).contains(&name) {
        return true;
    }
    match table {
        Table::Mangle => false,
        Table::Filter if name == chain::FIREWALL => firewall_is_ours(saved),
        Table::Nat | Table::Filter => is_service_chain(name),
    }
}

fn is_ours(footprint: &dyn Footprint, table: Table, name: &str, saved: &SavedTable) -> bool {
    // Every name written back into restore input passes the chain-name check; a name
    // that fails it is no name we (or upstream) ever gave a chain.
    ChainName::parse(name).is_ok() && footprint.owns(table, name, saved)
}

/// Decides what to remove from one table for iptables mode, given its `iptables-save`
/// output.
pub fn plan_table(table: Table, saved: &str) -> TableCleanup {
    plan_table_for(&IptablesFootprint, table, saved)
}

/// Decides what to remove from one table for `footprint`, given its `iptables-save` output.
pub fn plan_table_for(footprint: &dyn Footprint, table: Table, saved: &str) -> TableCleanup {
    let saved = SavedTable::parse(saved);
    let ours: BTreeSet<&str> = saved
        .chains
        .iter()
        .filter(|c| !c.builtin && is_ours(footprint, table, &c.name, &saved))
        .map(|c| c.name.as_str())
        .collect();
    let builtin: BTreeSet<&str> = saved
        .chains
        .iter()
        .filter(|c| c.builtin)
        .map(|c| c.name.as_str())
        .collect();
    // Chains that stay and whose rules we may still edit: built-in ones and those the mode
    // writes into; everything else is someone else's.
    let editable = |name: &str| builtin.contains(name) || footprint.writes_into(table, name);
    let mut jumps = Vec::new();
    let mut still_referenced = BTreeSet::new();
    for rule in &saved.rules {
        if ours.contains(rule.chain.as_str()) {
            continue; // flushed with its chain
        }
        let target = rule.target.as_deref().filter(|t| ours.contains(t));
        let points_at_removed = target.is_some() || footprint.owns_rule(rule);
        if !points_at_removed {
            continue;
        }
        if editable(&rule.chain) {
            jumps.push(rule.clone());
        } else if let Some(target) = target {
            still_referenced.insert(target);
        }
    }
    // Keep iptables-save's order: stable output, and easy to compare with what one sees.
    let in_order = |keep: bool| {
        saved
            .chains
            .iter()
            .map(|c| c.name.as_str())
            .filter(|n| ours.contains(n) && still_referenced.contains(n) != keep)
            .map(str::to_string)
            .collect()
    };
    TableCleanup {
        table,
        jumps,
        delete: in_order(true),
        flush_only: in_order(false),
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cleanup of table {table} failed: {source}")]
pub struct CleanupError {
    pub table: Table,
    #[source]
    pub source: ExecError,
}

/// What a cleanup did (and, on error, what it could not do).
#[derive(Debug, Default)]
pub struct CleanupReport {
    /// The non-empty cleanups that were applied.
    pub applied: Vec<TableCleanup>,
    pub errors: Vec<CleanupError>,
}

impl CleanupReport {
    pub fn is_ok(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Removes every iptables-mode rule and chain from nat, filter and mangle. A table that
/// fails is reported and the others are still cleaned. Safe to run when nothing is there.
pub fn cleanup(exec: &dyn Iptables) -> CleanupReport {
    cleanup_footprint(exec, &IptablesFootprint)
}

/// Like [`cleanup`], for the chains and rules of `footprint`.
pub fn cleanup_footprint(exec: &dyn Iptables, footprint: &dyn Footprint) -> CleanupReport {
    let mut report = CleanupReport::default();
    for table in CLEANUP_TABLES {
        match clean_table(exec, footprint, table) {
            Ok(Some(done)) => report.applied.push(done),
            Ok(None) => {}
            Err(source) => report.errors.push(CleanupError { table, source }),
        }
    }
    report
}

fn clean_table(
    exec: &dyn Iptables,
    footprint: &dyn Footprint,
    table: Table,
) -> Result<Option<TableCleanup>, ExecError> {
    let Some(saved) = exec.save_if_present(table)? else {
        return Ok(None);
    };
    let plan = plan_table_for(footprint, table, &saved);
    if plan.is_empty() {
        return Ok(None);
    }
    tracing::info!(
        %table,
        ?footprint,
        jumps = plan.jumps.len(),
        deleted = plan.delete.len(),
        kept_referenced = ?plan.flush_only,
        "removing kube-proxy rules"
    );
    exec.restore(plan.payload().as_bytes())?;
    Ok(Some(plan))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILTER: &str = r#"*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:FOREIGN-CHAIN - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -j KUBE-FIREWALL
-A INPUT -s 10.9.9.9/32 -j ACCEPT
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m comment --comment "old variant" -j KUBE-SERVICES
-A OUTPUT -j FOREIGN-CHAIN
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A FOREIGN-CHAIN -d 10.1.1.1/32 -j DROP
COMMIT
"#;

    #[test]
    fn removes_our_chains_and_every_jump_into_them() {
        let plan = plan_table(Table::Filter, FILTER);
        assert_eq!(
            plan.delete,
            [
                "KUBE-FIREWALL",
                "KUBE-FORWARD",
                "KUBE-PROXY-FIREWALL",
                "KUBE-SERVICES",
                "KUBE-PROXY-CANARY"
            ]
        );
        assert!(plan.flush_only.is_empty());
        let jumps: Vec<_> = plan.jumps.iter().map(|r| r.target.as_deref().unwrap()).collect();
        assert_eq!(
            jumps,
            [
                "KUBE-PROXY-FIREWALL",
                "KUBE-FIREWALL",
                "KUBE-FORWARD",
                "KUBE-SERVICES"
            ]
        );
        let payload = plan.payload();
        assert!(payload.contains("-D FORWARD -m comment --comment \"old variant\" -j KUBE-SERVICES\n"));
        assert!(!payload.contains("FOREIGN"), "{payload}");
        assert!(!payload.contains("10.9.9.9"));
    }

    #[test]
    fn kubelets_firewall_chain_is_left_alone() {
        let kubelet = FILTER.replace(
            "-A KUBE-FORWARD -m conntrack",
            "-A KUBE-FIREWALL -m comment --comment \"kubernetes firewall for dropping marked packets\" -m mark --mark 0x8000/0x8000 -j DROP\n-A KUBE-FORWARD -m conntrack",
        );
        let plan = plan_table(Table::Filter, &kubelet);
        assert!(!plan.delete.contains(&"KUBE-FIREWALL".to_string()));
        assert!(
            plan.jumps
                .iter()
                .all(|r| r.target.as_deref() != Some("KUBE-FIREWALL"))
        );
    }

    #[test]
    fn chain_still_used_by_a_foreign_chain_is_only_flushed() {
        let nat = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-SVC-AAAA - [0:0]\n:CNI-HOSTPORT - [0:0]\n-A CNI-HOSTPORT -j KUBE-MARK-MASQ\n-A KUBE-SVC-AAAA -j KUBE-MARK-MASQ\n-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\nCOMMIT\n";
        let plan = plan_table(Table::Nat, nat);
        assert_eq!(plan.delete, ["KUBE-SVC-AAAA"]);
        assert_eq!(plan.flush_only, ["KUBE-MARK-MASQ"]);
        assert_eq!(
            plan.payload(),
            "*nat\n:KUBE-SVC-AAAA - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n-X KUBE-SVC-AAAA\nCOMMIT\n"
        );
    }

    #[test]
    fn names_that_fail_the_chain_name_check_are_not_written_back() {
        let nat = "*nat\n:KUBE-SVC-AAAA - [0:0]\n:KUBE-SVC-A\"B - [0:0]\nCOMMIT\n";
        let plan = plan_table(Table::Nat, nat);
        assert_eq!(plan.delete, ["KUBE-SVC-AAAA"]);
        assert!(!plan.payload().contains('"'), "{}", plan.payload());
    }

    #[test]
    fn nothing_there_means_nothing_to_do() {
        let empty =
            "*mangle\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n";
        assert!(plan_table(Table::Mangle, empty).is_empty());
        assert!(plan_table(Table::Nat, "").is_empty());
    }
}
