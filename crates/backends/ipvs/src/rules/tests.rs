//! The ruleset of typical plans as `iptables-restore` input, byte for byte
//! (`tests/golden/*.rules`; `UPDATE_GOLDEN=1` rewrites them: review the diff).

use kpr_host::LocalDetector;
use kpr_world::{World, ep};
use serde_json::json;

use super::*;
use crate::test_support::{
    check, ipv6_plan_of, ipv6_web, load_balancer, nodeport, plan_of, spec,
    two_load_balancers_with_source_ranges, web,
};

fn options() -> RuleOptions {
    RuleOptions {
        family: IpFamily::V4,
        masquerade_bit: 14,
        masquerade_all: false,
        local_detector: LocalDetector::ClusterCidr(vec!["10.244.0.0/16".parse().unwrap()]),
        random_fully: true,
    }
}

fn text(plan: &IpvsPlan, options: &RuleOptions) -> String {
    ruleset(plan, options).render_full().text
}

#[test]
fn an_empty_cluster_has_only_the_fixed_rules() {
    let plan = plan_of(&mut World::new(), "rr");
    let text = text(&plan, &options());
    let nat = &text[text.find("*nat").unwrap()..];
    assert!(
        !nat.contains("--match-set"),
        "no nat rule matches an empty set:\n{nat}"
    );
    assert!(text.contains("-A KUBE-IPVS-FILTER -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN"));
    check("empty.rules", &text);
}

#[test]
fn a_node_port_service_masquerades_outside_traffic_only() {
    let mut world = web(nodeport(json!({})), vec![ep("10.244.1.5 local")]);
    let plan = plan_of(&mut world, "rr");
    let text = text(&plan, &options());
    assert!(text.contains(
        "-A KUBE-SERVICES -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" \
         -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ"
    ));
    assert!(text.contains("-A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000"));
    check("nodeport.rules", &text);
}

#[test]
fn without_local_detection_the_node_s_own_traffic_is_masqueraded() {
    let mut world = web(spec(json!({})), vec![ep("10.244.1.5")]);
    let plan = plan_of(&mut world, "rr");
    let options = RuleOptions {
        local_detector: LocalDetector::None,
        random_fully: false,
        ..options()
    };
    let text = text(&plan, &options);
    assert!(text.contains("--match-set KUBE-CLUSTER-IP src,dst -j KUBE-MARK-MASQ"));
    assert!(text.contains("-j MASQUERADE\n"), "no --random-fully");
    let all = RuleOptions {
        masquerade_all: true,
        ..options
    };
    assert!(self::text(&plan, &all).contains("--match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ"));
}

#[test]
fn load_balancers_with_source_ranges_and_external_ips_fill_every_chain() {
    let mut world = World::new();
    two_load_balancers_with_source_ranges(&mut world);
    world
        .service(
            "ext",
            spec(json!({"clusterIP": "10.96.0.12", "externalIPs": ["198.51.100.7"]})),
        )
        .slice(
            "web",
            json!([{"name": "http", "port": 8080}]),
            vec![ep("10.244.1.5 local")],
        );
    let plan = plan_of(&mut world, "rr");
    let text = text(&plan, &options());
    assert!(text.contains(
        "-A KUBE-IPVS-OUT-FILTER -s 203.0.113.2 -m ipvs --vaddr 203.0.113.2 --vproto tcp --vport 80 -j DROP"
    ));
    check("load_balancers.rules", &text);
}

#[test]
fn ipv6_uses_its_loopback_and_set_names() {
    let mut world = World::with_family(IpFamily::V6);
    ipv6_web(&mut world);
    let plan = ipv6_plan_of(&mut world);
    let options = RuleOptions {
        family: IpFamily::V6,
        local_detector: LocalDetector::ClusterCidr(vec!["fd00:244::/64".parse().unwrap()]),
        ..options()
    };
    let text = text(&plan, &options);
    assert!(text.contains("-A KUBE-SERVICES -s ::1/128 -j RETURN"));
    assert!(text.contains("KUBE-6-CLUSTER-IP dst,dst ! -s fd00:244::/64 -j KUBE-MARK-MASQ"));
    check("ipv6.rules", &text);
}

#[test]
fn the_jumps_are_upstreams_nine() {
    let jumps = jump_rules();
    assert_eq!(jumps.len(), 9);
    assert_eq!(
        jumps[7].args.join(" "),
        "-m comment --comment kubernetes ipvs access filter -j KUBE-IPVS-FILTER"
    );
}

/// The kernel's iptables (the host's default flavour) takes the whole ruleset and the
/// jumps, with the sets made first, in a throw-away namespace. (`-m ipvs` needs the IPVS
/// this host lacks, so the plan has no output filter here; the guest tests load one.)
#[test]
fn iptables_restore_takes_the_ruleset_and_the_jumps() {
    let mut world = World::new();
    let lb = load_balancer(
        "web",
        "10.96.0.10",
        30080,
        json!(["192.168.0.0/24"]),
        "203.0.113.1",
    );
    assert!(world.apply_service(&lb).is_empty());
    world
        .service(
            "ext",
            spec(json!({"clusterIP": "10.96.0.12", "externalIPs": ["198.51.100.7"]})),
        )
        .slice(
            "web",
            json!([{"name": "http", "port": 8080}]),
            vec![ep("10.244.1.5 local")],
        );
    let plan = plan_of(&mut world, "rr");
    assert!(plan.out_filter.is_empty());
    let node = kpr_netns::Netns::new("ipvsrules").unwrap();
    let sets = crate::ipset::restore_script(&plan.sets, &crate::ipset::Sets::default());
    node.sh(&format!("ipset restore -exist <<'EOF'\n{sets}EOF"))
        .unwrap();
    let payload = text(&plan, &options());
    node.sh(&format!("iptables-restore --noflush <<'EOF'\n{payload}EOF"))
        .unwrap_or_else(|e| panic!("iptables-restore refused the ruleset: {e}\n{payload}"));
    for jump in jump_rules() {
        let mut command = node.command("iptables");
        command
            .args(["-t", jump.table.as_str(), "-I", jump.chain])
            .args(&jump.args);
        let status = command.status().unwrap();
        assert!(status.success(), "{jump:?}");
    }
    let saved = node.sh("iptables-save").unwrap();
    assert!(
        saved.contains("-A INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER")
    );
    assert!(
        saved.contains("--match-set KUBE-LOAD-BALANCER-SOURCE-IP dst,dst,src -j RETURN"),
        "{saved}"
    );
    assert!(
        saved.contains("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000"),
        "{saved}"
    );
}
