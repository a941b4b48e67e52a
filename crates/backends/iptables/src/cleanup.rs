//! `--cleanup`, and the start-up cleanup of other modes: remove every rule and chain a
//! kube-proxy (ours or upstream's, iptables or IPVS mode) created, and nothing else.
//!
//! Planning is pure: from `iptables-save` output it decides which chains belong to the
//! [`Modes`] being removed and which rules elsewhere point into them (whatever their
//! match arguments, so older upstream variants of the jump rules go too). Each table is
//! then cleaned with one `iptables-restore --noflush`, so a table is either fully cleaned
//! or left as it was. Rules in other user-defined chains are never touched: a chain of
//! ours that one still jumps to is flushed but kept, since deleting it would fail the
//! whole table.
//!
//! Removing only IPVS mode (iptables mode starting where IPVS mode ran) keeps the chains
//! both modes use, which iptables mode rewrites, but deletes the rules in them, and in
//! the built-in chains, that jump to IPVS-only chains or match IPVS-mode ipsets, so that
//! those sets can be destroyed afterwards (see kpr-leftovers).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use kpr_naming::{ChainName, chain, is_service_chain, userspace_chain};

use crate::exec::{ExecError, Iptables};
use crate::ipvs_mode::{ipvs_only_chains, is_ipvs_set};
use crate::rules::LOCALNET_COMMENT;
use crate::ruleset::Table;
use crate::saved::{SavedRule, SavedTable, split_words};

/// The tables a kube-proxy writes to, in cleanup order.
pub const CLEANUP_TABLES: [Table; 3] = [Table::Nat, Table::Filter, Table::Mangle];

/// Which kube-proxy modes' chains a cleanup removes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Modes {
    pub iptables: bool,
    pub ipvs: bool,
    /// Upstream's (and our) userspace mode: its portal chains.
    pub userspace: bool,
}

impl Modes {
    /// Upstream's (and our) iptables mode.
    pub const IPTABLES: Self = Self {
        iptables: true,
        ipvs: false,
        userspace: false,
    };
    /// What only upstream's IPVS mode leaves: removed when iptables mode starts.
    pub const IPVS: Self = Self {
        iptables: false,
        ipvs: true,
        userspace: false,
    };
    /// Userspace mode's portals only: removed on its shutdown.
    pub const USERSPACE: Self = Self {
        iptables: false,
        ipvs: false,
        userspace: true,
    };
    /// The modes not in `self`: what a mode removes when it starts.
    pub const fn others(self) -> Self {
        Self {
            iptables: !self.iptables,
            ipvs: !self.ipvs,
            userspace: !self.userspace,
        }
    }
    /// Every mode: `--cleanup`.
    pub const ALL: Self = Self {
        iptables: true,
        ipvs: true,
        userspace: true,
    };
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

/// The portal chains userspace mode creates, per table.
fn userspace_chains(table: Table) -> &'static [&'static str] {
    match table {
        Table::Nat => &userspace_chain::NAT,
        Table::Filter => &userspace_chain::FILTER,
        Table::Mangle => &[],
    }
}

/// A chain some kube-proxy mode creates.
fn kube_proxy_chain(table: Table, name: &str, saved: &SavedTable) -> bool {
    iptables_mode_owns(table, name, saved)
        || ipvs_only_chains(table).contains(&name)
        || userspace_chains(table).contains(&name)
}

fn is_ours(modes: Modes, table: Table, name: &str, saved: &SavedTable) -> bool {
    // Every name written back into restore input passes the chain-name check; a name
    // that fails it is no name we (or upstream) ever gave a chain.
    if ChainName::parse(name).is_err() {
        return false;
    }
    (modes.iptables && iptables_mode_owns(table, name, saved))
        || (modes.ipvs && ipvs_only_chains(table).contains(&name))
        || (modes.userspace && userspace_chains(table).contains(&name))
}

/// Whether the rule matches one of IPVS mode's ipsets (`-m set --match-set <name> ...`).
fn matches_ipvs_set(rule: &SavedRule) -> bool {
    split_words(&rule.spec)
        .windows(2)
        .any(|pair| pair[0] == "--match-set" && is_ipvs_set(&pair[1]))
}

/// Decides what to remove from one table for iptables mode, given its `iptables-save`
/// output.
pub fn plan_table(table: Table, saved: &str) -> TableCleanup {
    plan_table_for(Modes::IPTABLES, table, saved)
}

/// Decides what to remove from one table for `modes`, given its `iptables-save` output.
pub fn plan_table_for(modes: Modes, table: Table, saved: &str) -> TableCleanup {
    let saved = SavedTable::parse(saved);
    let ours: BTreeSet<&str> = saved
        .chains
        .iter()
        .filter(|c| !c.builtin && is_ours(modes, table, &c.name, &saved))
        .map(|c| c.name.as_str())
        .collect();
    let builtin: BTreeSet<&str> = saved
        .chains
        .iter()
        .filter(|c| c.builtin)
        .map(|c| c.name.as_str())
        .collect();
    // Chains that stay and whose rules we may still edit: built-in ones and a staying
    // mode's kube-proxy chains; everything else is someone else's.
    let editable = |name: &str| builtin.contains(name) || kube_proxy_chain(table, name, &saved);
    let mut jumps = Vec::new();
    let mut still_referenced = BTreeSet::new();
    for rule in &saved.rules {
        if ours.contains(rule.chain.as_str()) {
            continue; // flushed with its chain
        }
        let target = rule.target.as_deref().filter(|t| ours.contains(t));
        let points_at_removed = target.is_some() || (modes.ipvs && matches_ipvs_set(rule));
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
    cleanup_modes(exec, Modes::IPTABLES)
}

/// Like [`cleanup`], for the chains of `modes`.
pub fn cleanup_modes(exec: &dyn Iptables, modes: Modes) -> CleanupReport {
    let mut report = CleanupReport::default();
    for table in CLEANUP_TABLES {
        match clean_table(exec, modes, table) {
            Ok(Some(done)) => report.applied.push(done),
            Ok(None) => {}
            Err(source) => report.errors.push(CleanupError { table, source }),
        }
    }
    report
}

fn clean_table(exec: &dyn Iptables, modes: Modes, table: Table) -> Result<Option<TableCleanup>, ExecError> {
    let Some(saved) = exec.save_if_present(table)? else {
        return Ok(None);
    };
    let plan = plan_table_for(modes, table, &saved);
    if plan.is_empty() {
        return Ok(None);
    }
    tracing::info!(
        %table,
        ?modes,
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

    /// What upstream's IPVS mode leaves in nat, plus a user's chain that matches one of
    /// its sets.
    const IPVS_NAT: &str = r#"*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-LOAD-BALANCER - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SERVICES - [0:0]
:USER-NAT - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -j USER-NAT
-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-NODE-PORT -p tcp -m comment --comment "Kubernetes nodeport TCP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ
-A KUBE-POSTROUTING -m comment --comment "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-SERVICES -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP src,dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
-A USER-NAT -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN
COMMIT
"#;

    const IPVS_FILTER: &str = r#"*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-IPVS-FILTER - [0:0]
:KUBE-IPVS-OUT-FILTER - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SOURCE-RANGES-FIREWALL - [0:0]
-A INPUT -m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT
-A INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER
-A INPUT -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A OUTPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-OUT-FILTER
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-IPVS-FILTER -m set --match-set KUBE-LOAD-BALANCER dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT --reject-with icmp-port-unreachable
-A KUBE-NODE-PORT -m comment --comment "Kubernetes health check node port" -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j ACCEPT
-A KUBE-PROXY-FIREWALL -m comment --comment "Kubernetes service load balancer ip + port for load balancer with sourceRange" -m set --match-set KUBE-LOAD-BALANCER-FW dst,dst -j KUBE-SOURCE-RANGES-FIREWALL
-A KUBE-SOURCE-RANGES-FIREWALL -j DROP
COMMIT
"#;

    fn deleted_rules(plan: &TableCleanup) -> Vec<String> {
        plan.jumps
            .iter()
            .map(|r| format!("{} {}", r.chain, r.spec))
            .collect()
    }

    #[test]
    fn ipvs_mode_leaves_its_own_chains_and_every_rule_that_uses_them_or_its_sets() {
        let plan = plan_table_for(Modes::IPVS, Table::Nat, IPVS_NAT);
        assert_eq!(plan.delete, ["KUBE-LOAD-BALANCER", "KUBE-NODE-PORT"]);
        assert!(plan.flush_only.is_empty());
        assert_eq!(
            deleted_rules(&plan),
            [
                "KUBE-POSTROUTING -m comment --comment \"Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose\" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE",
                "KUBE-SERVICES -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP src,dst -j KUBE-MARK-MASQ",
                "KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT",
                "KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT",
            ]
        );
        let payload = plan.payload();
        assert!(
            !payload.contains("USER-NAT"),
            "a user's rule is never touched:\n{payload}"
        );
        assert!(
            !payload.contains(":KUBE-SERVICES"),
            "shared chains are not flushed:\n{payload}"
        );

        let plan = plan_table_for(Modes::IPVS, Table::Filter, IPVS_FILTER);
        assert_eq!(
            plan.delete,
            [
                "KUBE-IPVS-FILTER",
                "KUBE-IPVS-OUT-FILTER",
                "KUBE-NODE-PORT",
                "KUBE-SOURCE-RANGES-FIREWALL"
            ]
        );
        let targets: Vec<_> = plan.jumps.iter().map(|r| r.target.as_deref().unwrap()).collect();
        assert_eq!(
            targets,
            [
                "KUBE-NODE-PORT",
                "KUBE-IPVS-FILTER",
                "KUBE-IPVS-OUT-FILTER",
                "KUBE-SOURCE-RANGES-FIREWALL"
            ]
        );
        assert!(!plan.payload().contains("KUBE-FORWARD"));
    }

    #[test]
    fn cleanup_of_every_mode_deletes_the_shared_chains_without_editing_them_first() {
        let plan = plan_table_for(Modes::ALL, Table::Nat, IPVS_NAT);
        assert_eq!(
            plan.delete,
            [
                "KUBE-LOAD-BALANCER",
                "KUBE-MARK-MASQ",
                "KUBE-NODE-PORT",
                "KUBE-POSTROUTING",
                "KUBE-SERVICES"
            ]
        );
        assert!(
            plan.jumps
                .iter()
                .all(|r| ["PREROUTING", "OUTPUT", "POSTROUTING"].contains(&r.chain.as_str())),
            "{:?}",
            plan.jumps
        );
        assert_eq!(plan.jumps.len(), 3);
        assert!(!plan.delete.contains(&"KUBE-KUBELET-CANARY".to_string()));
    }

    #[test]
    fn iptables_mode_rules_give_the_ipvs_cleanup_nothing_to_do() {
        assert!(plan_table_for(Modes::IPVS, Table::Filter, FILTER).is_empty());
        let nat = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAA - [0:0]\n-A PREROUTING -j KUBE-SERVICES\n-A KUBE-SERVICES -d 10.96.0.1/32 -j KUBE-SVC-AAAA\nCOMMIT\n";
        assert!(plan_table_for(Modes::IPVS, Table::Nat, nat).is_empty());
    }

    /// Userspace mode's portal chains and their jumps, next to iptables mode's rules.
    const USERSPACE_NAT: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-PORTALS-CONTAINER - [0:0]\n:KUBE-PORTALS-HOST - [0:0]\n:KUBE-NODEPORT-CONTAINER - [0:0]\n:KUBE-NODEPORT-HOST - [0:0]\n-A PREROUTING -j KUBE-PORTALS-CONTAINER\n-A PREROUTING -j KUBE-SERVICES\n-A PREROUTING -m addrtype --dst-type LOCAL -j KUBE-NODEPORT-CONTAINER\n-A OUTPUT -j KUBE-PORTALS-HOST\n-A OUTPUT -m addrtype --dst-type LOCAL -j KUBE-NODEPORT-HOST\n-A KUBE-PORTALS-CONTAINER -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 40000\nCOMMIT\n";

    #[test]
    fn userspace_portals_are_removed_by_their_mode_and_left_by_the_others() {
        let plan = plan_table_for(Modes::USERSPACE, Table::Nat, USERSPACE_NAT);
        assert_eq!(
            plan.delete,
            [
                "KUBE-PORTALS-CONTAINER",
                "KUBE-PORTALS-HOST",
                "KUBE-NODEPORT-CONTAINER",
                "KUBE-NODEPORT-HOST"
            ]
        );
        assert_eq!(plan.jumps.len(), 4, "{:?}", plan.jumps);
        assert!(
            !plan.payload().contains("KUBE-SERVICES"),
            "iptables mode's chain stays"
        );
        let iptables = plan_table_for(Modes::IPTABLES, Table::Nat, USERSPACE_NAT);
        assert_eq!(iptables.delete, ["KUBE-SERVICES"]);
        assert_eq!(
            Modes::USERSPACE.others(),
            Modes {
                iptables: true,
                ipvs: true,
                userspace: false
            }
        );
        let filter = "*filter\n:INPUT ACCEPT [0:0]\n:KUBE-NODEPORT-NON-LOCAL - [0:0]\n-A INPUT -j KUBE-NODEPORT-NON-LOCAL\nCOMMIT\n";
        assert_eq!(
            plan_table_for(Modes::ALL, Table::Filter, filter).delete,
            ["KUBE-NODEPORT-NON-LOCAL"]
        );
    }
}
