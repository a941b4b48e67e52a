//! The footprint against what upstream's ipvs mode leaves in iptables (pure plans; the
//! kernel tests are in `tests/leftovers_kernel.rs`).

use kpr_iptables::{TableCleanup, plan_table_for};

use super::*;

/// iptables mode's filter rules: nothing of ipvs mode's.
const FILTER: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:KUBE-FORWARD - [0:0]\n:KUBE-PROXY-FIREWALL - [0:0]\n-A INPUT -m conntrack --ctstate NEW -j KUBE-PROXY-FIREWALL\n-A FORWARD -j KUBE-FORWARD\n-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\nCOMMIT\n";

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
    let plan = plan_table_for(&IpvsFootprint, Table::Nat, IPVS_NAT);
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

    let plan = plan_table_for(&IpvsFootprint, Table::Filter, IPVS_FILTER);
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
fn iptables_mode_rules_give_the_ipvs_cleanup_nothing_to_do() {
    assert!(plan_table_for(&IpvsFootprint, Table::Filter, FILTER).is_empty());
    let nat = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAA - [0:0]\n-A PREROUTING -j KUBE-SERVICES\n-A KUBE-SERVICES -d 10.96.0.1/32 -j KUBE-SVC-AAAA\nCOMMIT\n";
    assert!(plan_table_for(&IpvsFootprint, Table::Nat, nat).is_empty());
}
