//! The rules in built-in chains (INPUT, PREROUTING, ...) that send packets into ours.
//!
//! They cannot go through `iptables-restore --noflush` without rewriting those shared
//! chains, so they are checked (`-C`) and inserted (`-I`) one by one, on full syncs only:
//! they exist from the first sync on, and only a flush removes them, which makes the
//! next sync full.
//!
//! Like upstream (`iptablesJumpChains` + `iptablesKubeletJumpChains`), the list always
//! includes kubelet's INPUT/OUTPUT jumps to KUBE-FIREWALL, whether or not we write that
//! chain's localnet rule: the chain is created empty if missing, never flushed.

use kpr_naming::chain;

use crate::ruleset::Table;

/// One rule in a built-in chain jumping to one of our chains.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JumpRule {
    pub table: Table,
    /// The built-in chain holding the rule.
    pub chain: &'static str,
    /// Our chain it jumps to.
    pub target: &'static str,
    /// The rule's arguments, as passed to `iptables -C/-I` (no quoting).
    pub args: Vec<String>,
}

impl JumpRule {
    /// `-m comment --comment <comment> -j <target>` in `table`'s built-in `chain`: the shape
    /// every mode's jumps share.
    pub fn new(table: Table, chain: &'static str, target: &'static str, comment: &str) -> Self {
        jump(table, chain, target, comment, false)
    }

    /// The same jump for a connection's first packet only (`-m conntrack --ctstate NEW`
    /// before the rest): for a chain whose every rule matches only new connections, so
    /// the packets of established ones skip it, and its comment match too (a compat match,
    /// called per packet, under iptables-nft).
    pub fn new_connections_only(mut self) -> Self {
        self.args.splice(0..0, NEW.map(String::from));
        self
    }

    /// The same jump for packets to this host's own addresses only (`-m addrtype
    /// --dst-type LOCAL` before the rest): how NodePort chains are entered.
    pub fn to_local_addresses(mut self) -> Self {
        self.args
            .splice(0..0, ["-m", "addrtype", "--dst-type", "LOCAL"].map(String::from));
        self
    }
}

const NEW: [&str; 4] = ["-m", "conntrack", "--ctstate", "NEW"];

fn jump(table: Table, chain: &'static str, target: &'static str, comment: &str, new_only: bool) -> JumpRule {
    let mut args: Vec<String> = Vec::new();
    if new_only {
        args.extend(NEW.iter().map(|s| s.to_string()));
    }
    if !comment.is_empty() {
        args.extend(["-m", "comment", "--comment", comment].map(String::from));
    }
    args.extend(["-j", target].map(String::from));
    JumpRule {
        table,
        chain,
        target,
        args,
    }
}

/// The jump rules in upstream's order. Each is inserted at the top of its chain, so the
/// last one listed ends up first, as upstream's do.
pub fn jump_rules() -> Vec<JumpRule> {
    use Table::{Filter, Nat};
    const EXTERNAL: &str = "kubernetes externally-visible service portals";
    const PORTALS: &str = "kubernetes service portals";
    const LB_FIREWALL: &str = "kubernetes load balancer firewall";
    vec![
        jump(Filter, "INPUT", chain::EXTERNAL_SERVICES, EXTERNAL, true),
        jump(Filter, "FORWARD", chain::EXTERNAL_SERVICES, EXTERNAL, true),
        jump(
            Filter,
            "INPUT",
            chain::NODEPORTS,
            "kubernetes health check service ports",
            false,
        ),
        jump(Filter, "FORWARD", chain::SERVICES, PORTALS, true),
        jump(Filter, "OUTPUT", chain::SERVICES, PORTALS, true),
        jump(
            Filter,
            "FORWARD",
            chain::FORWARD,
            "kubernetes forwarding rules",
            false,
        ),
        jump(Filter, "INPUT", chain::PROXY_FIREWALL, LB_FIREWALL, true),
        jump(Filter, "OUTPUT", chain::PROXY_FIREWALL, LB_FIREWALL, true),
        jump(Filter, "FORWARD", chain::PROXY_FIREWALL, LB_FIREWALL, true),
        jump(Nat, "OUTPUT", chain::SERVICES, PORTALS, false),
        jump(Nat, "PREROUTING", chain::SERVICES, PORTALS, false),
        jump(
            Nat,
            "POSTROUTING",
            chain::POSTROUTING,
            "kubernetes postrouting rules",
            false,
        ),
        // Kubelet's own jumps, duplicated as upstream does.
        jump(Filter, "INPUT", chain::FIREWALL, "", false),
        jump(Filter, "OUTPUT", chain::FIREWALL, "", false),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jump_rules_match_upstream_shapes() {
        let rules = jump_rules();
        assert_eq!(rules.len(), 14);
        assert_eq!(
            rules[6].args.join(" "),
            "-m conntrack --ctstate NEW -m comment --comment kubernetes load balancer firewall -j KUBE-PROXY-FIREWALL"
        );
        let kubelet: Vec<_> = rules[12..]
            .iter()
            .map(|j| (j.table, j.chain, j.args.join(" ")))
            .collect();
        assert_eq!(
            kubelet,
            [
                (Table::Filter, "INPUT", "-j KUBE-FIREWALL".to_string()),
                (Table::Filter, "OUTPUT", "-j KUBE-FIREWALL".to_string()),
            ],
            "always, as upstream: kubelet's jumps do not depend on localhost NodePorts"
        );
    }

    #[test]
    fn a_jump_to_local_addresses_matches_them_first() {
        let jump = JumpRule::new(
            Table::Nat,
            "OUTPUT",
            "KUBE-NODEPORT-HOST",
            "handle service NodePorts",
        )
        .to_local_addresses();
        assert_eq!(
            jump.args.join(" "),
            "-m addrtype --dst-type LOCAL -m comment --comment handle service NodePorts -j KUBE-NODEPORT-HOST"
        );
        assert_eq!(
            (jump.table, jump.chain, jump.target),
            (Table::Nat, "OUTPUT", "KUBE-NODEPORT-HOST")
        );
    }
}
