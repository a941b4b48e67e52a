//! Upstream kube-proxy's bugs, as regression tests that pass here (docs/upstream-e2e.md,
//! "Upstream bugs"). Each is named after what must hold, and says which issue it pins.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use kpr_netns::{NODE_IP, Netns, pod_ip};
use kpr_nfnetlink::{Batch, Element, Family, Field, Set, Socket, Table, Value as Key, comment_userdata};
use serde_json::json;

use crate::Mode;
use crate::conntrack::{flow, udp_entries_to, udp_service, vip, wait_flow_reaches, wait_flow_unanswered};
use crate::external_traffic_policy::{health, probe};
use crate::manifests::Manifests;
use crate::objects::{OTHER_NODE, ready, ready_here, service, slice, slice_port, tcp_port, with_node_port};
use crate::stage::{POD_PORT, Stage};
use crate::traffic::at;

const FILE: &str = "upstream-bugs.yaml";

netfilter_modes!(
    pods_and_the_node_reach_external_addresses_of_a_local_policy_service_without_a_local_pod,
    a_foreign_table_of_a_newer_nft_breaks_no_sync_read_or_conntrack_cleanup,
    a_udp_client_that_kept_sending_reaches_the_pod_of_a_service_scaled_to_zero_and_back,
    a_deleted_udp_services_flows_go_and_reach_the_new_pod_once_it_is_recreated,
);
// #131765 is about the kernel modes' rules for `externalTrafficPolicy: Local` (userspace
// mode has no traffic policies), #136786 about nf_tables, which userspace mode does not
// program beyond its portals. ipvs mode sends #131765's traffic to every pod by design
// (external_traffic_policy.rs); for the rest see docs/upstream-e2e.md.
in_mode!(userspace, crate::Mode::Userspace;
    a_udp_client_that_kept_sending_reaches_the_pod_of_a_service_scaled_to_zero_and_back,
    a_deleted_udp_services_flows_go_and_reach_the_new_pod_once_it_is_recreated
);

/// Upstream #131765 (nftables mode, fixed by #132456): a LoadBalancer Service with an
/// external IP and `externalTrafficPolicy: Local` whose only pod is on node2. Pods and the
/// node itself reach its load-balancer IP and its external IP, through node2's pod (their
/// traffic never came through a load balancer); the outside client is dropped at this
/// node, on both addresses and on the NodePort, and the health-check port says 503.
fn pods_and_the_node_reach_external_addresses_of_a_local_policy_service_without_a_local_pod(mode: Mode) {
    const INGRESS: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 60);
    const EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 60);
    let manifests = Manifests::new(
        FILE,
        vec![
            service(
                "local-lb",
                Ipv4Addr::new(10, 96, 22, 10),
                json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "healthCheckNodePort": 30261,
                       "externalIPs": [EXTERNAL_IP.to_string()],
                       "ports": [with_node_port(tcp_port("http", 80), 30260)]}),
            )
            .tap(|s| s["status"] = json!({"loadBalancer": {"ingress": [{"ip": INGRESS.to_string()}]}})),
            slice(
                "local-lb",
                json!([slice_port("http", "TCP", POD_PORT)]),
                vec![ready(1, OTHER_NODE)],
            ),
        ],
    );
    let stage = Stage::start(mode, 3, &manifests);
    assert_eq!(probe(&stage, 30261, 503), health("local-lb", 0));
    let (ingress, external) = (at(INGRESS, 80), at(EXTERNAL_IP, 80));
    for sender in [stage.pod(2), stage.node()] {
        for to in [ingress, external] {
            sender.wait_answered_by(to, 10, &["pod1"]);
        }
    }
    // The rules that answered the pod are the ones that turn the client away.
    for to in [ingress, external, at(NODE_IP, 30260)] {
        stage.client().assert_dropped(to);
    }
}

/// Upstream #139628 (fixed by #139629): a UDP Service is scaled to zero and back. The
/// client keeps sending all along on one source port. With no pod left, its flow no longer
/// reaches the old pod (which here still serves: only the flow's conntrack entry could send
/// it there); once the new pod is ready, the flow reaches it.
fn a_udp_client_that_kept_sending_reaches_the_pod_of_a_service_scaled_to_zero_and_back(mode: Mode) {
    let mut manifests = Manifests::new(
        FILE,
        udp_service("scaled", 20, None, json!({}), vec![ready_here(0)]),
    );
    let mut stage = Stage::start(mode, 3, &manifests);
    stage.serve_udp(0, POD_PORT);
    stage.serve_udp(1, POD_PORT);
    let flow = flow(stage.lab().pod(2), at(vip(20), 80));
    wait_flow_reaches(&flow, "pod0");

    manifests.set_endpoints("scaled", vec![]);
    stage.apply(&manifests);
    wait_flow_unanswered(&flow);

    manifests.set_endpoints("scaled", vec![ready_here(1)]);
    stage.apply(&manifests);
    wait_flow_reaches(&flow, "pod1");
}

/// Upstream #141371: a UDP Service is deleted while a client keeps sending to it. Its
/// flow's entry goes (the flow no longer reaches the pod, which still serves; in the kernel
/// modes the node's table holds no entry of it DNATed to that pod). The Service is created
/// again with the same cluster IP and another pod: the flow reaches the new pod.
fn a_deleted_udp_services_flows_go_and_reach_the_new_pod_once_it_is_recreated(mode: Mode) {
    let docs = |pod| udp_service("deleted", 21, None, json!({}), vec![ready_here(pod)]);
    let mut manifests = Manifests::new(FILE, docs(0));
    let mut stage = Stage::start(mode, 3, &manifests);
    stage.serve_udp(0, POD_PORT);
    stage.serve_udp(1, POD_PORT);
    let to = at(vip(21), 80);
    let flow = flow(stage.lab().pod(2), to);
    wait_flow_reaches(&flow, "pod0");

    manifests.delete_service("deleted");
    stage.apply(&manifests);
    wait_flow_unanswered(&flow);
    if mode != Mode::Userspace {
        // In userspace mode the flow's entry points at the proxy, never at the pod.
        let pod0 = format!("src={}", pod_ip(0));
        let entries = udp_entries_to(&stage, to);
        assert!(
            !entries.lines().any(|line| line.contains(&pod0)),
            "an entry still sends the deleted Service's flow to pod0:\n{entries}"
        );
    }

    for doc in docs(1) {
        manifests.add(doc);
    }
    stage.apply(&manifests);
    wait_flow_reaches(&flow, "pod1");
}

/// Upstream #136786: another tool, built with a newer nft, keeps a table of its own whose
/// sets carry user data (`typeof`, comments, and kinds of user data an older nft does not
/// know), `ifname` keys, interval concatenations and named counters. Upstream's bundled
/// nft crashed listing such a ruleset, and every sync failed. Here the proxy starts beside
/// such tables and more of them appear while it runs (each a foreign commit, which makes
/// the nftables mode read its own table back): it programs its Services, follows a change
/// of endpoints, cleans up the stale UDP flow that change leaves (the conntrack reconciler),
/// finds its own table as written when it reads it back, `explain` reads its rules, no
/// sync fails, and the foreign tables are left as they were.
fn a_foreign_table_of_a_newer_nft_breaks_no_sync_read_or_conntrack_cleanup(mode: Mode) {
    let mut manifests = Manifests::new(FILE, udp_service("dns", 22, None, json!({}), vec![ready_here(0)]));
    let mut stage = Stage::build(mode, 3, &manifests, &[]);
    let node = stage.lab().node();
    node.sh(FOREIGN_NFT)
        .unwrap_or_else(|err| panic!("nft refused the foreign table: {err}"));
    add_newer_table(node, "newer-before");
    let before = foreign_tables(node);
    stage.start_proxy();
    stage.serve_udp(0, POD_PORT);
    stage.serve_udp(1, POD_PORT);
    let to = at(vip(22), 80);
    let flow = flow(stage.lab().pod(2), to);
    wait_flow_reaches(&flow, "pod0");

    add_newer_table(stage.lab().node(), "newer-after");
    manifests.set_endpoints("dns", vec![ready_here(1)]);
    stage.apply(&manifests);
    wait_flow_reaches(&flow, "pod1");

    let explained = stage
        .lab()
        .node()
        .command(crate::support::proxy_binary())
        .args(["explain", &format!("{to}/udp")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&explained.stdout);
    assert!(
        explained.status.success() && text.contains(&pod_ip(1).to_string()),
        "explain {to}: {}{text}{}",
        explained.status,
        String::from_utf8_lossy(&explained.stderr)
    );
    let failures = match mode {
        Mode::Nftables => "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv4\"}",
        _ => "kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family=\"IPv4\"}",
    };
    assert_eq!(
        stage.metric(failures).unwrap_or(0.0),
        0.0,
        "{failures}\n{}",
        stage.proxy_logs()
    );
    stage.wait_healthz(200);
    // The foreign commits made the nftables mode read its table back: it must have found it
    // as written, not rebuilt it because of someone else's objects.
    let logs = stage.proxy_logs();
    assert!(
        !logs.contains("differs from what was written") && !logs.contains("is gone; rebuilding"),
        "a foreign table was taken for a change of ours:\n{logs}"
    );
    let mut after = foreign_tables(stage.lab().node());
    after.remove("ip newer-after");
    assert_eq!(after, before, "the foreign tables changed");
}

/// What a tool with a newer nft might keep: `typeof` sets (nft keeps the expression in the
/// set's user data), an `ifname` set with a comment, an interval concatenation, a named
/// counter, and a base chain using them (policy accept: it changes no verdict).
const FOREIGN_NFT: &str = r#"nft -f - <<'EOF'
table inet foreign {
	counter seen {
	}
	set ifaces {
		typeof iifname
		elements = { "eth0", "kbr0" }
	}
	set names {
		type ifname
		comment "names with a comment"
		elements = { "lo" }
	}
	set pairs {
		typeof ip saddr . tcp dport
		flags interval
		elements = { 10.0.0.0/8 . 80 }
	}
	chain input {
		type filter hook input priority 0; policy accept;
		iifname @ifaces counter name "seen" comment "newer nft"
	}
}
EOF"#;

/// Table `ip <name>` written over netlink as a newer nft would: table and set user data
/// holding kinds of user data no nft this old knows (types 0x20 and up), an `ifname` set
/// and an `integer` set whose only description is that user data.
fn add_newer_table(node: &Netns, name: &str) {
    let table = Table::new(Family::Ip, name);
    // TLVs: type, length, value; types nft 1.0 does not define.
    let unknown_udata = vec![0x20, 3, b'n', b'e', b'w', 0x21, 4, 1, 2, 3, 4];
    let mut ifnames = Set::new("future-ifnames", vec![Field::IfName]);
    ifnames.userdata = [
        comment_userdata("from a newer nft").unwrap(),
        unknown_udata.clone(),
    ]
    .concat();
    let mut integers = Set::new("future-integers", vec![Field::Integer { bytes: 4 }]);
    integers.userdata = unknown_udata.clone();
    let mut batch = Batch::new();
    batch.add_table_with_userdata(&table, &unknown_udata);
    batch.add_set(&table, &ifnames);
    batch.add_set(&table, &integers);
    batch.add_elements(
        &table,
        "future-ifnames",
        &[Element::key(Key::new().ifname("eth0").build())],
    );
    batch.add_elements(
        &table,
        "future-integers",
        &[Element::key(Key::new().host_u32(42).build())],
    );
    node.run(|| Socket::open().and_then(|mut socket| socket.send(&batch)))
        .unwrap_or_else(|err| panic!("writing table {name}: {err}"));
}

/// The tables this scenario wrote, with their sets (and elements), chains and rules, as
/// netlink reads them.
fn foreign_tables(node: &Netns) -> BTreeMap<String, String> {
    const OURS: [&str; 3] = ["foreign", "newer-before", "newer-after"];
    node.run(|| {
        let mut socket = Socket::open().unwrap();
        let mut tables = BTreeMap::new();
        for info in socket.tables(None).unwrap() {
            let table = info.table;
            if !OURS.contains(&table.name.as_str()) {
                continue;
            }
            let mut text = String::new();
            for set in socket.sets(&table).unwrap() {
                let elements = socket.elements(&table, &set.name).unwrap();
                text += &format!("set {} {:?} {:?}\n", set.name, set.userdata, elements);
            }
            for chain in socket.chains(&table).unwrap() {
                text += &format!("chain {:?}\n", chain.chain);
            }
            for rule in socket.rules(&table, None).unwrap() {
                text += &format!("rule {rule}\n");
            }
            tables.insert(format!("{} {}", table.family.keyword(), table.name), text);
        }
        tables
    })
}

/// `value` changed by `f`: for building one object in an expression.
trait Tap: Sized {
    fn tap(self, f: impl FnOnce(&mut Self)) -> Self;
}

impl Tap for serde_json::Value {
    fn tap(mut self, f: impl FnOnce(&mut Self)) -> Self {
        f(&mut self);
        self
    }
}
