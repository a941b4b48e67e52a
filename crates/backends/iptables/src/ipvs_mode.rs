//! What upstream's IPVS mode leaves in iptables and ipset, by name, so that starting in
//! iptables mode (and `--cleanup`) can remove it and nothing else.
//!
//! IPVS mode shares some chains with iptables mode (KUBE-SERVICES, KUBE-POSTROUTING,
//! KUBE-MARK-MASQ, KUBE-FORWARD, KUBE-PROXY-FIREWALL): those stay, since iptables mode
//! rewrites them. The chains listed here exist only in IPVS mode (upstream's
//! `iptablesCleanupChains` minus the shared ones, plus the NAT-table KUBE-FIREWALL of
//! releases before 1.28), and so do its ipsets, whose IPv6 twins are named `KUBE-6-...`
//! (cut to ipset's 31 bytes, as upstream cuts them).

use kpr_naming::ipvs_chain;

use crate::ruleset::Table;

/// Chains only IPVS mode creates, per table.
pub fn ipvs_only_chains(table: Table) -> &'static [&'static str] {
    match table {
        Table::Nat => &[ipvs_chain::LOAD_BALANCER, ipvs_chain::NODE_PORT, "KUBE-FIREWALL"],
        Table::Filter => &[
            ipvs_chain::NODE_PORT,
            ipvs_chain::SOURCE_RANGES_FIREWALL,
            ipvs_chain::IPVS_FILTER,
            ipvs_chain::IPVS_OUT_FILTER,
        ],
        Table::Mangle => &[],
    }
}

/// Upstream's IPVS-mode ipsets (IPv4 names; see [`ipvs_set_names`] for both families).
pub const IPVS_SETS: [&str; 17] = [
    "KUBE-LOOP-BACK",
    "KUBE-CLUSTER-IP",
    "KUBE-EXTERNAL-IP",
    "KUBE-EXTERNAL-IP-LOCAL",
    "KUBE-LOAD-BALANCER",
    "KUBE-LOAD-BALANCER-LOCAL",
    "KUBE-LOAD-BALANCER-FW",
    "KUBE-LOAD-BALANCER-SOURCE-IP",
    "KUBE-LOAD-BALANCER-SOURCE-CIDR",
    "KUBE-NODE-PORT-TCP",
    "KUBE-NODE-PORT-LOCAL-TCP",
    "KUBE-NODE-PORT-UDP",
    "KUBE-NODE-PORT-LOCAL-UDP",
    "KUBE-NODE-PORT-SCTP-HASH",
    "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
    "KUBE-HEALTH-CHECK-NODE-PORT",
    "KUBE-IPVS-IPS",
];

/// ipset's longest name (`IPSET_MAXNAMELEN` less the NUL).
const SET_NAME_MAX: usize = 31;

/// The IPv6 twin of an IPVS-mode set: `KUBE-` becomes `KUBE-6-`, cut to 31 bytes.
fn ipv6_name(name: &str) -> String {
    let mut v6 = name.replacen("KUBE-", "KUBE-6-", 1);
    v6.truncate(SET_NAME_MAX);
    v6
}

/// Every IPVS-mode set name, IPv4 then IPv6.
pub fn ipvs_set_names() -> Vec<String> {
    IPVS_SETS
        .iter()
        .map(|name| name.to_string())
        .chain(IPVS_SETS.iter().map(|name| ipv6_name(name)))
        .collect()
}

/// Whether `name` is one of IPVS mode's sets (either family).
pub fn is_ipvs_set(name: &str) -> bool {
    IPVS_SETS.iter().any(|set| *set == name || ipv6_name(set) == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_twins_are_named_and_cut_as_upstream() {
        let names = ipvs_set_names();
        assert_eq!(names.len(), 34);
        assert!(names.contains(&"KUBE-6-CLUSTER-IP".to_string()));
        // 32 characters with the prefix: upstream cuts the last one.
        assert!(names.contains(&"KUBE-6-NODE-PORT-LOCAL-SCTP-HAS".to_string()));
        assert!(names.iter().all(|n| n.len() <= 31), "{names:?}");
        assert!(is_ipvs_set("KUBE-6-LOAD-BALANCER-SOURCE-CID"));
        assert!(is_ipvs_set("KUBE-LOOP-BACK"));
        assert!(!is_ipvs_set("KUBE-MY-OWN-SET"));
        assert!(!is_ipvs_set("kube-cluster-ip"));
    }

    #[test]
    fn no_ipvs_only_chain_is_one_iptables_mode_writes() {
        use kpr_naming::chain;
        let iptables_mode = [
            chain::SERVICES,
            chain::EXTERNAL_SERVICES,
            chain::NODEPORTS,
            chain::POSTROUTING,
            chain::MARK_MASQ,
            chain::FORWARD,
            chain::PROXY_FIREWALL,
            chain::CANARY,
        ];
        for table in [Table::Nat, Table::Filter, Table::Mangle] {
            for name in ipvs_only_chains(table) {
                assert!(!iptables_mode.contains(name), "{table} {name}");
            }
        }
        // Filter KUBE-FIREWALL is iptables mode's (and kubelet's), never IPVS mode's.
        assert!(!ipvs_only_chains(Table::Filter).contains(&chain::FIREWALL));
    }
}
