//! Kernel tests: the real [`IptablesBackend`] and [`cleanup`] driving the real iptables
//! binaries, legacy and nf_tables, each inside a network namespace the test creates.
//!
//! Golden tests prove what we *write*; these prove the kernel takes it and that the sync
//! bookkeeping (full vs. partial, stale chains, the canary) matches what the kernel then
//! holds. Every command runs behind `ip netns exec <ns>`; nothing touches the root
//! namespace, and dropping the namespace frees all its tables, also when a test panics.
//!
//! Both variants must work: a variant whose binaries or kernel support are missing or
//! broken FAILS every test of it. A machine that truly lacks one may skip it only by naming
//! it in `KPR_SKIP_IPTABLES_VARIANTS` (e.g. `legacy`, or `legacy,nft`); CI never sets it,
//! and each skip is printed.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns may panic: that fails the test

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use common::{SKIP_VARIANTS_ENV, skip_requested, variant_name};
use kpr_iptables::{
    ExecError, Iptables, IptablesBackend, IptablesCli, IptablesOptions, IptablesVersion, SavedTable, Table,
    Variant, build, cleanup,
};
use kpr_model::IpFamily;
use kpr_netns::Netns;
use kpr_state::{PendingSync, SyncReport};
use kpr_world::{World, ep};
use serde_json::json;

/// A user's own rules, which no sync and no cleanup may touch.
const FOREIGN_FILTER: &[&str] = &[
    "-N USER-ALLOW",
    "-A USER-ALLOW -s 10.9.9.9/32 -j ACCEPT",
    "-A INPUT -j USER-ALLOW",
];
const FOREIGN_NAT: &[&str] = &[
    "-N USER-NAT",
    "-A USER-NAT -d 10.8.8.8/32 -p tcp -j DNAT --to-destination 10.7.7.7:80",
    "-A PREROUTING -j USER-NAT",
];

/// The seed-002 example (upstream's httpbin) and its chains as upstream named them.
const HTTPBIN_SVC: &str = "KUBE-SVC-FREKB6WNWYJLKTHC";
const HTTPBIN_EXT: &str = "KUBE-EXT-FREKB6WNWYJLKTHC";
const HTTPBIN_PODS: [(&str, &str); 3] = [
    ("172.20.0.40", "KUBE-SEP-PEA6WHECIZEOX47B"),
    ("172.20.0.41", "KUBE-SEP-JXNDCT5ED2555YYJ"),
    ("172.20.1.183", "KUBE-SEP-UHAR347MOFCEOPWZ"),
];

/// Passes every call to the real CLI and keeps the restore inputs, so a test can see
/// which chains a sync wrote, and how long each restore took (with its size).
struct Recording {
    cli: IptablesCli,
    restores: Arc<Mutex<Vec<String>>>,
    times: Arc<Mutex<Vec<(std::time::Duration, usize)>>>,
}

impl Iptables for Recording {
    fn version(&self) -> Result<IptablesVersion, ExecError> {
        self.cli.version()
    }
    fn is_nf_tables(&self) -> bool {
        self.cli.is_nf_tables()
    }
    fn create_chain(&self, table: Table, chain: &str) -> Result<(), ExecError> {
        self.cli.create_chain(table, chain)
    }
    fn restore(&self, payload: &[u8]) -> Result<(), ExecError> {
        self.restores
            .lock()
            .unwrap()
            .push(String::from_utf8_lossy(payload).into_owned());
        let started = std::time::Instant::now();
        let result = self.cli.restore(payload);
        self.times
            .lock()
            .unwrap()
            .push((started.elapsed(), payload.len()));
        result
    }
    fn save(&self, table: Table) -> Result<String, ExecError> {
        self.cli.save(table)
    }
    fn chain_exists(&self, table: Table, chain: &str) -> Result<bool, ExecError> {
        self.cli.chain_exists(table, chain)
    }
    fn rule_exists(&self, table: Table, chain: &str, args: &[String]) -> Result<bool, ExecError> {
        self.cli.rule_exists(table, chain, args)
    }
    fn insert_rule(&self, table: Table, chain: &str, args: &[String]) -> Result<(), ExecError> {
        self.cli.insert_rule(table, chain, args)
    }
    fn delete_rule(&self, table: Table, chain: &str, args: &[String]) -> Result<(), ExecError> {
        self.cli.delete_rule(table, chain, args)
    }
}

/// One namespace programmed with one iptables variant, plus the user's foreign rules.
struct Node {
    netns: Netns,
    variant: Variant,
    restores: Arc<Mutex<Vec<String>>>,
    opts: IptablesOptions,
}

impl Node {
    /// A fresh namespace for `variant`, or `None` (with a notice) when the variant is named in
    /// `KPR_SKIP_IPTABLES_VARIANTS`. A variant that does not work fails the test.
    fn new(variant: Variant) -> Option<Self> {
        if skip_requested(variant) {
            return None;
        }
        let node = Self {
            netns: Netns::new("ipt").expect("creating a network namespace (needs root)"),
            variant,
            restores: Arc::default(),
            opts: IptablesOptions::default(),
        };
        let probe = node.cli();
        let usable = probe
            .version()
            .and_then(|_| probe.save(Table::Nat))
            .and_then(|_| probe.save(Table::Filter));
        if let Err(err) = usable {
            panic!(
                "iptables variant {} does not work in a network namespace: {err}\n\
                 (on a machine that cannot run it, set {SKIP_VARIANTS_ENV}={} to skip it)",
                variant_name(variant),
                variant_name(variant)
            );
        }
        node.add_foreign_rules();
        Some(node)
    }

    fn cli(&self) -> IptablesCli {
        IptablesCli::in_netns(IpFamily::V4, self.variant, self.netns.name())
    }

    fn backend(&self) -> IptablesBackend {
        let exec = Recording {
            cli: self.cli(),
            restores: self.restores.clone(),
            times: Arc::default(),
        };
        IptablesBackend::new(self.opts.clone(), Box::new(exec)).unwrap()
    }

    /// Runs this variant's `iptables -t <table> <args>` inside the namespace.
    fn iptables(&self, table: Table, args: &[&str]) {
        let binary = format!("iptables-{}", variant_name(self.variant));
        let out = self
            .netns
            .command(&binary)
            .args(["-w", "5", "-t", table.as_str()])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{binary} -t {table} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn add_foreign_rules(&self) {
        for (table, rules) in [(Table::Filter, FOREIGN_FILTER), (Table::Nat, FOREIGN_NAT)] {
            for rule in rules {
                self.iptables(table, &rule.split(' ').collect::<Vec<_>>());
            }
        }
    }

    fn save(&self, table: Table) -> String {
        self.cli().save(table).unwrap()
    }

    fn chains(&self, table: Table) -> BTreeSet<String> {
        SavedTable::parse(&self.save(table))
            .chains
            .into_iter()
            .map(|c| c.name)
            .collect()
    }

    /// The per-service chains (KUBE-SVC/SVL/EXT/FW/SEP) in nat.
    fn service_chains(&self) -> BTreeSet<String> {
        self.chains(Table::Nat)
            .into_iter()
            .filter(|c| kpr_naming::is_service_chain(c))
            .collect()
    }

    fn rules_of(&self, table: Table, chain: &str) -> Vec<String> {
        SavedTable::parse(&self.save(table))
            .rules_of(chain)
            .map(|r| r.spec.clone())
            .collect()
    }

    /// Lines of `iptables-save` that mention the user's chains.
    fn foreign_lines(&self, table: Table) -> Vec<String> {
        self.save(table)
            .lines()
            .filter(|l| l.contains("USER-"))
            .map(str::to_string)
            .collect()
    }

    fn assert_foreign_rules_intact(&self) {
        self.assert_foreign_filter_rules_intact();
        assert_eq!(
            self.foreign_lines(Table::Nat),
            [
                ":USER-NAT - [0:0]",
                "-A PREROUTING -j USER-NAT",
                "-A USER-NAT -d 10.8.8.8/32 -p tcp -j DNAT --to-destination 10.7.7.7:80"
            ]
        );
    }

    fn assert_foreign_filter_rules_intact(&self) {
        assert_eq!(
            self.foreign_lines(Table::Filter),
            [
                ":USER-ALLOW - [0:0]",
                "-A INPUT -j USER-ALLOW",
                "-A USER-ALLOW -s 10.9.9.9/32 -j ACCEPT"
            ]
        );
    }

    /// Number of chains the latest restore input declared (written or deleted).
    fn last_restore_chain_count(&self) -> usize {
        let restores = self.restores.lock().unwrap();
        let last = restores.last().expect("a restore ran");
        last.lines().filter(|l| l.starts_with(':')).count()
    }

    fn last_restore(&self) -> String {
        self.restores.lock().unwrap().last().cloned().unwrap_or_default()
    }
}

fn sync(backend: &mut IptablesBackend, world: &mut World) -> (SyncReport, PendingSync) {
    let pending = world.pending();
    let report = backend
        .sync_rules(&pending.request(false))
        .unwrap_or_else(|e| panic!("sync failed: {e}"));
    (report, pending)
}

/// Seed 002's httpbin as a NodePort service (NodePort 11387) with these pod IPs.
fn httpbin(world: &mut World, pods: &[&str]) {
    world
        .service(
            "httpbin",
            json!({"type": "NodePort", "clusterIP": "172.20.255.90",
                   "ports": [{"name": "http", "port": 80, "targetPort": 80, "nodePort": 11387}]}),
        )
        .slice(
            "httpbin",
            json!([{"name": "http", "port": 80}]),
            pods.iter().map(|ip| ep(ip)).collect(),
        );
}

fn httpbin_pods() -> Vec<&'static str> {
    HTTPBIN_PODS.iter().map(|(ip, _)| *ip).collect()
}

/// A plain ClusterIP service `name` (port 80 -> 8080) with these pod IPs.
fn web(world: &mut World, name: &str, cluster_ip: &str, pods: &[&str]) {
    world
        .service(
            name,
            json!({"clusterIP": cluster_ip, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}),
        )
        .slice(
            name,
            json!([{"name": "http", "port": 8080}]),
            pods.iter().map(|ip| ep(ip)).collect(),
        );
}

/// The per-service chains a full render of `pending` wants in nat.
fn wanted_service_chains(node: &Node, pending: &PendingSync) -> BTreeSet<String> {
    build(&pending.state, &node.opts, &[])
        .nat
        .chains()
        .iter()
        .map(|c| c.name.to_string())
        .filter(|c| kpr_naming::is_service_chain(c))
        .collect()
}

fn first_sync_is_full_and_programs_the_services(variant: Variant) {
    let Some(node) = Node::new(variant) else { return };
    let mut world = World::new();
    httpbin(&mut world, &httpbin_pods());
    world.service(
        "empty",
        json!({"clusterIP": "10.96.0.99", "ports": [{"name": "http", "port": 80}]}),
    );
    let mut backend = node.backend();
    let (report, pending) = sync(&mut backend, &mut world);
    assert!(report.full, "the first sync is full");

    let nat = node.save(Table::Nat);
    for jump in [
        r#"-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES"#,
        r#"-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES"#,
        r#"-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING"#,
    ] {
        assert!(nat.contains(jump), "missing {jump:?} in\n{nat}");
    }
    assert_eq!(node.service_chains(), wanted_service_chains(&node, &pending));
    let mut expected: BTreeSet<String> = [HTTPBIN_SVC, HTTPBIN_EXT].map(String::from).into();
    expected.extend(HTTPBIN_PODS.map(|(_, sep)| sep.to_string()));
    assert_eq!(node.service_chains(), expected);
    assert_eq!(node.rules_of(Table::Nat, HTTPBIN_SVC).len(), 3);
    for (ip, sep) in HTTPBIN_PODS {
        let rules = node.rules_of(Table::Nat, sep);
        assert!(
            rules
                .last()
                .unwrap()
                .ends_with(&format!("-j DNAT --to-destination {ip}:80")),
            "{rules:?}"
        );
    }
    let filter = node.save(Table::Filter);
    assert!(filter.contains(
        r#"-A KUBE-SERVICES -d 10.96.0.99/32 -p tcp -m comment --comment "default/empty:http has no endpoints" -m tcp --dport 80 -j REJECT"#
    ), "{filter}");
    for table in [Table::Filter, Table::Nat] {
        assert!(node.chains(table).contains("KUBE-PROXY-CANARY"), "{table}");
    }
    node.assert_foreign_rules_intact();
}

/// The kernel's own `iptables-save` of the seed-002 example, chain by chain. Seed 002 is
/// `iptables-save` of an upstream v1.14 node; the lines marked "seed" are identical to it,
/// the others show what upstream changed since (1.28+): comments on SVC/SEP rules, NodePorts
/// through KUBE-EXT-, and KUBE-POSTROUTING clearing the mark.
fn seed_002_saves_like_upstream(variant: Variant) {
    let Some(node) = Node::new(variant) else { return };
    let mut world = World::new();
    httpbin(&mut world, &httpbin_pods());
    sync(&mut node.backend(), &mut world);
    let svc_comment = |i: usize| {
        format!(
            r#"-m comment --comment "default/httpbin:http -> {}:80""#,
            HTTPBIN_PODS[i].0
        )
    };
    let mut expected: Vec<(&str, Vec<String>)> = vec![
        (
            "KUBE-SERVICES",
            vec![
                // seed
                format!(
                    r#"-d 172.20.255.90/32 -p tcp -m comment --comment "default/httpbin:http cluster IP" -m tcp --dport 80 -j {HTTPBIN_SVC}"#
                ),
                // seed
                r#"-m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"#.to_string(),
            ],
        ),
        (
            "KUBE-NODEPORTS",
            vec![format!(
                r#"-p tcp -m comment --comment "default/httpbin:http" -m tcp --dport 11387 -j {HTTPBIN_EXT}"#
            )],
        ),
        (
            HTTPBIN_EXT,
            vec![
                r#"-m comment --comment "masquerade traffic for default/httpbin:http external destinations" -j KUBE-MARK-MASQ"#.to_string(),
                format!("-j {HTTPBIN_SVC}"),
            ],
        ),
        (
            HTTPBIN_SVC,
            vec![
                // The seed's probabilities: the kernel's round trip of 1/3 and 1/2.
                format!(
                    "{} -m statistic --mode random --probability 0.33333333349 -j {}",
                    svc_comment(0),
                    HTTPBIN_PODS[0].1
                ),
                format!(
                    "{} -m statistic --mode random --probability 0.50000000000 -j {}",
                    svc_comment(1),
                    HTTPBIN_PODS[1].1
                ),
                format!("{} -j {}", svc_comment(2), HTTPBIN_PODS[2].1),
            ],
        ),
        // seed
        ("KUBE-MARK-MASQ", vec!["-j MARK --set-xmark 0x4000/0x4000".to_string()]),
        // The binary's version was read: every supported iptables takes --random-fully.
        (
            "KUBE-POSTROUTING",
            vec![
                "-m mark ! --mark 0x4000/0x4000 -j RETURN".to_string(),
                "-j MARK --set-xmark 0x4000/0x0".to_string(),
                r#"-m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully"#
                    .to_string(),
            ],
        ),
    ];
    for (ip, sep) in HTTPBIN_PODS {
        expected.push((
            sep,
            vec![
                format!(r#"-s {ip}/32 -m comment --comment "default/httpbin:http" -j KUBE-MARK-MASQ"#),
                format!(
                    r#"-p tcp -m comment --comment "default/httpbin:http" -m tcp -j DNAT --to-destination {ip}:80"#
                ),
            ],
        ));
    }
    for (chain, rules) in expected {
        assert_eq!(node.rules_of(Table::Nat, chain), rules, "chain {chain}");
    }
}

fn endpoint_change_syncs_partially(variant: Variant) {
    let Some(node) = Node::new(variant) else { return };
    let mut world = World::new();
    httpbin(&mut world, &httpbin_pods());
    web(&mut world, "web", "10.96.0.10", &["10.244.1.5", "10.244.1.6"]);
    let mut backend = node.backend();
    let (first, _) = sync(&mut backend, &mut world);
    assert!(first.full);
    let full_chains = node.last_restore_chain_count();
    let web_chains_before: Vec<_> = node
        .service_chains()
        .into_iter()
        .filter(|c| !c.ends_with("FREKB6WNWYJLKTHC") && !HTTPBIN_PODS.iter().any(|(_, s)| s == c))
        .collect();
    assert!(!web_chains_before.is_empty());

    // One pod replaced: 172.20.1.183 goes, 172.20.1.184 comes.
    httpbin(&mut world, &["172.20.0.40", "172.20.0.41", "172.20.1.184"]);
    let (second, pending) = sync(&mut backend, &mut world);
    assert!(!second.full, "an endpoint change alone is a partial sync");
    let partial_chains = node.last_restore_chain_count();
    assert!(
        partial_chains < full_chains,
        "partial sync declared {partial_chains} chains, full {full_chains}"
    );
    let payload = node.last_restore();
    for untouched in &web_chains_before {
        let declared = format!(":{untouched} ");
        assert!(!payload.contains(&declared), "{untouched} rewritten:\n{payload}");
    }
    assert!(payload.contains("-X KUBE-SEP-UHAR347MOFCEOPWZ"), "{payload}");
    assert!(
        second.objects.written < second.objects.total,
        "{:?}",
        second.objects
    );

    let chains = node.service_chains();
    assert_eq!(chains, wanted_service_chains(&node, &pending));
    assert!(!chains.contains("KUBE-SEP-UHAR347MOFCEOPWZ"));
    for untouched in &web_chains_before {
        assert!(
            !node.rules_of(Table::Nat, untouched).is_empty(),
            "{untouched} lost its rules"
        );
    }
    let svc = node.rules_of(Table::Nat, HTTPBIN_SVC);
    assert!(svc[2].contains("172.20.1.184:80"), "{svc:?}");
    node.assert_foreign_rules_intact();
}

fn removed_services_leave_no_chains(variant: Variant) {
    let Some(node) = Node::new(variant) else { return };
    let mut world = World::new();
    httpbin(&mut world, &httpbin_pods());
    web(&mut world, "web", "10.96.0.10", &["10.244.1.5", "10.244.1.6"]);
    let mut backend = node.backend();
    sync(&mut backend, &mut world);

    world.delete_service("httpbin");
    let (report, pending) = sync(&mut backend, &mut world);
    assert!(!report.full);
    let chains = node.service_chains();
    assert_eq!(chains, wanted_service_chains(&node, &pending));
    assert!(
        chains.iter().all(|c| !c.ends_with("FREKB6WNWYJLKTHC")),
        "{chains:?}"
    );
    assert!(!chains.is_empty(), "web keeps its chains");
    assert!(!node.save(Table::Nat).contains("httpbin"));

    world.delete_service("web");
    let (report, _) = sync(&mut backend, &mut world);
    assert!(!report.full);
    assert_eq!(node.service_chains(), BTreeSet::new());
    node.assert_foreign_rules_intact();
}

/// After a restart the proxy knows nothing of the chains in the kernel: its first (full)
/// sync finds stale ones with iptables-save and deletes them.
fn restart_deletes_stale_chains(variant: Variant) {
    let Some(node) = Node::new(variant) else { return };
    let mut world = World::new();
    httpbin(&mut world, &httpbin_pods());
    web(&mut world, "web", "10.96.0.10", &["10.244.1.5"]);
    sync(&mut node.backend(), &mut world);

    world.delete_service("httpbin");
    let (report, pending) = sync(&mut node.backend(), &mut world);
    assert!(report.full);
    assert_eq!(node.service_chains(), wanted_service_chains(&node, &pending));
    assert!(!node.save(Table::Nat).contains("FREKB6WNWYJLKTHC"));
    node.assert_foreign_rules_intact();
}

/// Someone flushes and deletes the nat chains (what a firewall reload does): the canary is
/// gone, so the next sync is full and puts everything back, jumps from built-ins included.
fn flushed_nat_table_forces_a_full_sync(variant: Variant) {
    let Some(node) = Node::new(variant) else { return };
    let mut world = World::new();
    httpbin(&mut world, &httpbin_pods());
    let mut backend = node.backend();
    sync(&mut backend, &mut world);
    let (unchanged, _) = sync(&mut backend, &mut world);
    assert!(!unchanged.full, "nothing changed, canary in place: partial");
    let nat_before = node.save(Table::Nat);

    node.iptables(Table::Nat, &["-F"]);
    node.iptables(Table::Nat, &["-X"]);
    assert!(node.service_chains().is_empty());
    let (after_flush, pending) = sync(&mut backend, &mut world);
    assert!(after_flush.full, "a missing canary makes the sync full");
    assert_eq!(node.service_chains(), wanted_service_chains(&node, &pending));
    let restored: Vec<_> = node
        .save(Table::Nat)
        .lines()
        .filter(|l| l.contains("KUBE-"))
        .map(str::to_string)
        .collect();
    let before: Vec<_> = nat_before
        .lines()
        .filter(|l| l.contains("KUBE-"))
        .map(str::to_string)
        .collect();
    assert_eq!(restored, before, "the full sync restores the nat table exactly");
    assert!(node.chains(Table::Nat).contains("KUBE-PROXY-CANARY"));
    // The flush took the user's nat rules too; filter is still theirs.
    node.assert_foreign_filter_rules_intact();
}

fn cleanup_removes_every_kube_rule_and_keeps_foreign_ones(variant: Variant) {
    let Some(node) = Node::new(variant) else { return };
    let mut world = World::new();
    httpbin(&mut world, &httpbin_pods());
    world.service(
        "empty",
        json!({"clusterIP": "10.96.0.99", "ports": [{"name": "http", "port": 80}]}),
    );
    sync(&mut node.backend(), &mut world);

    let report = cleanup(&node.cli());
    assert!(report.is_ok(), "{:?}", report.errors);
    assert!(!report.applied.is_empty());
    for table in [Table::Nat, Table::Filter, Table::Mangle] {
        let saved = node.save(table);
        let kube: Vec<_> = saved.lines().filter(|l| l.contains("KUBE-")).collect();
        assert!(kube.is_empty(), "{table} still has {kube:?}");
    }
    node.assert_foreign_rules_intact();

    let again = cleanup(&node.cli());
    assert!(again.is_ok() && again.applied.is_empty(), "{again:?}");
}

/// `iptables-save` of `table` without its comment lines (they carry the time), sorted.
fn sorted_save(node: &Node, table: Table) -> Vec<String> {
    let mut lines: Vec<String> = node
        .save(table)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// A world of `count` Services, every fifth a NodePort Service (KUBE-EXT chains too),
/// each with 3 endpoints, plus one Service without endpoints (filter's REJECT).
fn many_services(count: usize) -> World {
    let mut world = World::new();
    for i in 0..count {
        let name = format!("svc{i}");
        let spec = if i % 5 == 0 {
            json!({"type": "NodePort", "clusterIP": format!("10.96.1.{i}"),
                   "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30000 + i}]})
        } else {
            json!({"clusterIP": format!("10.96.1.{i}"),
                   "ports": [{"name": "http", "port": 80, "targetPort": 8080}]})
        };
        let pods: Vec<String> = (0..3).map(|e| format!("10.244.{e}.{i}")).collect();
        world.service(&name, spec).slice(
            &name,
            json!([{"name": "http", "port": 8080}]),
            pods.iter().map(|ip| ep(ip)).collect(),
        );
    }
    world.service(
        "empty",
        json!({"clusterIP": "10.96.0.99", "ports": [{"name": "http", "port": 80}]}),
    );
    world
}

/// A full sync written as several restores (a small bound on chains per restore, as
/// nf_tables gets with [`kpr_iptables::RESTORE_CHUNK_CHAINS`] at scale) leaves exactly what
/// one restore leaves; so does a full resync over it (a restart), and a restart that finds
/// a removed Service's chains deletes them.
fn split_full_sync_programs_what_one_restore_does(variant: Variant) {
    let (Some(split), Some(whole)) = (Node::new(variant), Node::new(variant)) else {
        return;
    };
    let mut world = many_services(40);
    let mut whole_backend = whole.backend().with_restore_chunk_chains(None);
    let (whole_report, _) = sync(&mut whole_backend, &mut world);
    assert_eq!(whole.restores.lock().unwrap().len(), 1);

    let mut backend = split.backend().with_restore_chunk_chains(Some(25));
    let (report, pending) = sync(&mut backend, &mut world);
    let restores = split.restores.lock().unwrap().len();
    assert!(restores > 3, "{restores} restores");
    assert_eq!(report, whole_report);
    for table in [Table::Nat, Table::Filter] {
        assert_eq!(sorted_save(&split, table), sorted_save(&whole, table), "{table}");
    }
    assert_eq!(split.service_chains(), wanted_service_chains(&split, &pending));

    // A restart: the full sync rewrites every chain that is already there.
    let mut restarted = split.backend().with_restore_chunk_chains(Some(25));
    let (report, _) = sync(&mut restarted, &mut world);
    assert!(report.full);
    assert_eq!(split.restores.lock().unwrap().len(), 2 * restores);
    for table in [Table::Nat, Table::Filter] {
        assert_eq!(sorted_save(&split, table), sorted_save(&whole, table), "{table}");
    }

    // Services gone while the proxy was down: the next full sync deletes their chains last.
    for i in 0..10 {
        world.delete_service(&format!("svc{i}"));
    }
    let mut restarted = split.backend().with_restore_chunk_chains(Some(25));
    sync(&mut restarted, &mut world);
    let mut whole_backend = whole.backend().with_restore_chunk_chains(None);
    sync(&mut whole_backend, &mut world);
    assert!(
        split.last_restore().contains("-X KUBE-SVC-"),
        "{}",
        split.last_restore()
    );
    for table in [Table::Nat, Table::Filter] {
        assert_eq!(sorted_save(&split, table), sorted_save(&whole, table), "{table}");
    }
    split.assert_foreign_rules_intact();
}

/// A timing run, not a test: the first full sync and a full resync of 10,000 Services x
/// 10 endpoints on iptables-nft, with the time each restore took printed. Run with
/// `cargo nextest run -p kpr-iptables --test kernel --run-ignored only --no-capture
/// scale_timing` (`KPR_SCALE_SERVICES` overrides the 10,000).
#[test]
#[ignore = "a timing run of about a minute"]
fn scale_timing_nft() {
    let services: usize = std::env::var("KPR_SCALE_SERVICES").map_or(10_000, |v| v.parse().unwrap());
    let Some(node) = Node::new(Variant::Nft) else {
        return;
    };
    let mut world = World::new();
    for i in 0..services {
        let name = format!("svc{i}");
        let ip = format!("10.{}.{}.{}", 96 + i / 65536, (i / 256) % 256, i % 256);
        world
            .service(
                &name,
                json!({"clusterIP": ip, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}),
            )
            .slice(
                &name,
                json!([{"name": "http", "port": 8080}]),
                (0..10)
                    .map(|e| ep(&format!("10.{}.{}.{}", 128 + e, (i / 256) % 256, i % 256)))
                    .collect(),
            );
    }
    let timed = Arc::new(Mutex::new(Vec::new()));
    let exec = Recording {
        cli: node.cli(),
        restores: Arc::default(),
        times: timed.clone(),
    };
    let mut backend = IptablesBackend::new(node.opts.clone(), Box::new(exec)).unwrap();
    if let Ok(bound) = std::env::var("KPR_SCALE_CHUNK_CHAINS") {
        backend = backend.with_restore_chunk_chains(Some(bound.parse().unwrap()));
    }
    for round in ["first sync", "full resync"] {
        let pending = world.pending();
        let started = std::time::Instant::now();
        backend.sync_rules(&pending.request(true)).unwrap();
        let elapsed = started.elapsed();
        let times = std::mem::take(&mut *timed.lock().unwrap());
        let restore: std::time::Duration = times.iter().map(|(t, _)| *t).sum();
        let (last, _) = times.last().copied().unwrap();
        let slowest = times.iter().map(|(t, _)| *t).max().unwrap();
        let bytes: usize = times.iter().map(|(_, b)| *b).sum();
        println!(
            "{services} Services x 10 endpoints, {round}: {elapsed:.2?} in all, {} restores \
             ({bytes} bytes) {restore:.2?}, slowest {slowest:.2?}, last (shared chains) {last:.2?}",
            times.len()
        );
    }
    assert!(node.chains(Table::Nat).len() > services);
}

/// The scenarios above, once per variant, so a failure names the variant.
macro_rules! per_variant {
    ($($variant:ident => $value:expr),+ $(,)?) => {$(
        mod $variant {
            use super::*;

            #[test]
            fn first_sync_is_full_and_programs_the_services() {
                super::first_sync_is_full_and_programs_the_services($value);
            }

            #[test]
            fn seed_002_saves_like_upstream() {
                super::seed_002_saves_like_upstream($value);
            }

            #[test]
            fn endpoint_change_syncs_partially() {
                super::endpoint_change_syncs_partially($value);
            }

            #[test]
            fn removed_services_leave_no_chains() {
                super::removed_services_leave_no_chains($value);
            }

            #[test]
            fn restart_deletes_stale_chains() {
                super::restart_deletes_stale_chains($value);
            }

            #[test]
            fn flushed_nat_table_forces_a_full_sync() {
                super::flushed_nat_table_forces_a_full_sync($value);
            }

            #[test]
            fn split_full_sync_programs_what_one_restore_does() {
                super::split_full_sync_programs_what_one_restore_does($value);
            }

            #[test]
            fn cleanup_removes_every_kube_rule_and_keeps_foreign_ones() {
                super::cleanup_removes_every_kube_rule_and_keeps_foreign_ones($value);
            }
        }
    )+};
}

per_variant!(legacy => Variant::Legacy, nft => Variant::Nft);

/// Skipping is explicit and for one variant at most: skipping both would test nothing.
#[test]
fn at_most_one_variant_is_skipped() {
    let skipped: Vec<_> = [Variant::Legacy, Variant::Nft]
        .into_iter()
        .filter(|v| skip_requested(*v))
        .collect();
    assert!(
        skipped.len() < 2,
        "{SKIP_VARIANTS_ENV} skips both iptables variants: nothing would be tested"
    );
}
