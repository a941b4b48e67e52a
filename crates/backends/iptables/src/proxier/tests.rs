//! The backend's decisions against a fake iptables: what each sync writes, what a failure
//! says about itself, and the host facts it reads. The kernel tests run the same backend on
//! the real binaries.

use std::collections::{BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use kpr_model::{IpFamily, NamespacedName, ServicePort, ServicePortName};
use kpr_state::{DesiredState, FailedStep, SyncKind, SyncRequest};
use kpr_world::{World, ep};
use serde_json::json;

use super::*;
use crate::exec::IptablesVersion;
use kpr_host::AddressError;
use kpr_host::NodePortAddresses;

/// What the fake kernel holds and how the next calls fail.
#[derive(Debug, Default)]
struct Kernel {
    restores: Vec<String>,
    /// How many jump rules the kernel held when each restore ran.
    rules_at_restore: Vec<usize>,
    chains: HashSet<(Table, String)>,
    rules: HashSet<(Table, String, Vec<String>)>,
    version: Option<IptablesVersion>,
    fail_save: bool,
    fail_restore: bool,
    /// Fails only the restore with this 1-based number (counting every restore).
    fail_restore_number: Option<usize>,
    fail_canary_check: bool,
}

#[derive(Clone, Default)]
struct Fake(Arc<Mutex<Kernel>>);

impl Fake {
    fn kernel(&self) -> std::sync::MutexGuard<'_, Kernel> {
        self.0.lock().unwrap()
    }

    fn last_restore(&self) -> String {
        self.kernel().restores.last().cloned().unwrap_or_default()
    }
}

fn failed(what: &str) -> ExecError {
    ExecError::Failed {
        command: what.to_string(),
        status: "exit status: 4".to_string(),
        stderr: "told to fail".to_string(),
    }
}

fn table_of(name: &str) -> Option<Table> {
    match name {
        "filter" => Some(Table::Filter),
        "nat" => Some(Table::Nat),
        _ => None,
    }
}

impl Iptables for Fake {
    fn version(&self) -> Result<IptablesVersion, ExecError> {
        self.kernel().version.ok_or_else(|| failed("iptables --version"))
    }

    fn restore(&self, payload: &[u8]) -> Result<(), ExecError> {
        let mut k = self.kernel();
        let text = String::from_utf8_lossy(payload).into_owned();
        k.restores.push(text.clone());
        let rules = k.rules.len();
        k.rules_at_restore.push(rules);
        if k.fail_restore || k.fail_restore_number == Some(k.restores.len()) {
            return Err(ExecError::Restore {
                command: "iptables-restore".into(),
                line: None,
                input_line: None,
                stderr: "told to fail".into(),
            });
        }
        let mut table = None;
        for line in text.lines() {
            if let Some(name) = line.strip_prefix('*') {
                table = table_of(name);
            } else if let (Some(t), Some(decl)) = (table, line.strip_prefix(':')) {
                let name = decl.split(' ').next().unwrap_or_default().to_string();
                k.chains.insert((t, name));
            } else if let (Some(t), Some(name)) = (table, line.strip_prefix("-X ")) {
                k.chains.remove(&(t, name.to_string()));
            }
        }
        Ok(())
    }

    fn save(&self, table: Table) -> Result<String, ExecError> {
        let k = self.kernel();
        if k.fail_save {
            return Err(failed("iptables-save"));
        }
        let mut out = format!("*{table}\n");
        for (t, chain) in &k.chains {
            if *t == table {
                out.push_str(&format!(":{chain} - [0:0]\n"));
            }
        }
        out.push_str("COMMIT\n");
        Ok(out)
    }

    fn chain_exists(&self, table: Table, chain: &str) -> Result<bool, ExecError> {
        let k = self.kernel();
        if k.fail_canary_check {
            return Err(failed("iptables -S"));
        }
        Ok(k.chains.contains(&(table, chain.to_string())))
    }

    fn rule_exists(&self, table: Table, chain: &str, args: &[String]) -> Result<bool, ExecError> {
        Ok(self
            .kernel()
            .rules
            .contains(&(table, chain.to_string(), args.to_vec())))
    }

    fn insert_rule(&self, table: Table, chain: &str, args: &[String]) -> Result<(), ExecError> {
        let mut k = self.kernel();
        if !k.chains.contains(&(table, jump_target(args))) {
            return Err(failed("iptables -I: no such target chain"));
        }
        k.rules.insert((table, chain.to_string(), args.to_vec()));
        Ok(())
    }

    fn delete_rule(&self, table: Table, chain: &str, args: &[String]) -> Result<(), ExecError> {
        self.kernel()
            .rules
            .remove(&(table, chain.to_string(), args.to_vec()));
        Ok(())
    }

    fn create_chain(&self, table: Table, chain: &str) -> Result<(), ExecError> {
        if !self.kernel().chains.insert((table, chain.to_string())) {
            return Err(failed("iptables -N: chain exists"));
        }
        Ok(())
    }

    fn for_checks(&self) -> Option<Box<dyn Iptables>> {
        Some(Box::new(self.clone()))
    }
}

fn jump_target(args: &[String]) -> String {
    args.iter()
        .skip_while(|a| *a != "-j")
        .nth(1)
        .cloned()
        .unwrap_or_default()
}

const CURRENT: IptablesVersion = IptablesVersion {
    major: 1,
    minor: 8,
    patch: 9,
};

fn backend(fake: &Fake, opts: IptablesOptions) -> IptablesBackend {
    if fake.kernel().version.is_none() {
        fake.kernel().version = Some(CURRENT);
    }
    IptablesBackend::new(opts, Box::new(fake.clone())).unwrap()
}

/// The spec of a NodePort Service on `cluster_ip` (port `http` 80 -> 8080, NodePort 30080).
fn nodeport(cluster_ip: &str) -> serde_json::Value {
    json!({"type": "NodePort", "clusterIP": cluster_ip,
           "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]})
}

/// A state with these NodePort Services (name, cluster IP), each with one endpoint, through
/// the real conversions and trackers.
fn state(services: &[(&str, &str)]) -> DesiredState {
    let mut world = World::new();
    for (i, (name, cluster_ip)) in services.iter().enumerate() {
        world.service(name, nodeport(cluster_ip)).slice(
            name,
            json!([{"name": "http", "port": 8080}]),
            vec![ep(&format!("10.244.1.{}", i + 1))],
        );
    }
    world.state()
}

/// `state` with Service `default/<from>` renamed to `to`: a name the API server (and
/// kpr-model) refuses, so only a state changed after the conversion can carry it, which is
/// what the renderer's own check must stop.
fn renamed(state: DesiredState, from: &str, to: &str) -> DesiredState {
    let (from, to) = (
        NamespacedName::new("default", from),
        NamespacedName::new("default", to),
    );
    let mut services = (*state.services).clone();
    let ports: Vec<ServicePort> = services
        .remove(&from)
        .expect("the Service to rename")
        .iter()
        .map(|port| ServicePort {
            name: ServicePortName::new(&to.namespace, &to.name, &port.name.port, port.name.protocol),
            ..port.clone()
        })
        .collect();
    services.insert(to.clone(), Arc::from(ports));
    let mut endpoints = (*state.endpoints).clone();
    if let Some(moved) = endpoints.remove(&from) {
        endpoints.insert(to, moved);
    }
    DesiredState {
        services: Arc::new(services),
        endpoints: Arc::new(endpoints),
        node: state.node,
        ..DesiredState::default()
    }
}

fn sync(
    backend: &mut IptablesBackend,
    state: &DesiredState,
    changed: &[&str],
) -> Result<SyncReport, SyncError> {
    let changed: BTreeSet<NamespacedName> = changed
        .iter()
        .map(|n| NamespacedName::new("default", n))
        .collect();
    backend.sync_rules(&SyncRequest {
        state,
        changed: &changed,
        service_changes: &[],
        endpoint_changes: &[],
        force_full: false,
    })
}

#[test]
fn random_fully_only_where_iptables_supports_it() {
    let masquerade = |version: Option<IptablesVersion>| {
        let fake = Fake::default();
        fake.kernel().version = version;
        let mut b = IptablesBackend::new(IptablesOptions::default(), Box::new(fake.clone())).unwrap();
        sync(&mut b, &state(&[]), &[]).unwrap();
        let payload = fake.last_restore();
        payload
            .lines()
            .find(|l| l.contains("-j MASQUERADE"))
            .unwrap()
            .to_string()
    };
    assert!(masquerade(Some(CURRENT)).ends_with("-j MASQUERADE --random-fully"));
    assert!(
        masquerade(Some(IptablesVersion::RANDOM_FULLY)).ends_with("--random-fully"),
        "1.6.2 is the first that has it"
    );
    let old = IptablesVersion {
        major: 1,
        minor: 6,
        patch: 1,
    };
    assert!(masquerade(Some(old)).ends_with("-j MASQUERADE"));
    assert!(
        masquerade(None).ends_with("-j MASQUERADE"),
        "an unreadable version counts as old, as upstream"
    );
}

#[test]
fn failures_say_what_was_attempted_and_whether_the_restore_failed() {
    let fake = Fake::default();
    let mut b = backend(&fake, IptablesOptions::default());
    let s = state(&[("web", "10.96.0.10")]);
    let kind = |e: SyncError| (e.attempted(), e.step());

    fake.kernel().fail_save = true;
    let e = sync(&mut b, &s, &[]).unwrap_err();
    assert!(matches!(e, SyncError::ListChains { .. }), "{e}");
    assert_eq!(kind(e), (SyncKind::Full, FailedStep::Other));
    fake.kernel().fail_save = false;

    fake.kernel().fail_restore = true;
    assert_eq!(
        kind(sync(&mut b, &s, &[]).unwrap_err()),
        (SyncKind::Full, FailedStep::Restore)
    );
    fake.kernel().fail_restore = false;
    assert!(sync(&mut b, &s, &[]).unwrap().full);

    fake.kernel().fail_restore = true;
    assert_eq!(
        kind(sync(&mut b, &s, &["web"]).unwrap_err()),
        (SyncKind::Partial, FailedStep::Restore)
    );
    fake.kernel().fail_restore = false;
    assert!(
        sync(&mut b, &s, &[]).unwrap().full,
        "a failure makes the next sync full"
    );

    fake.kernel().fail_canary_check = true;
    assert_eq!(
        kind(sync(&mut b, &s, &[]).unwrap_err()),
        (SyncKind::Partial, FailedStep::Other)
    );
}

/// The value of the metric line starting with `series ` (0 when absent).
fn metric(registry: &prometheus_client::registry::Registry, series: &str) -> f64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.parse().unwrap())
}

/// Upstream's accounting, recorded by the backend itself: every failed partial sync, and
/// every failed restore (full or partial); after a success, the rules of each table.
#[test]
fn the_mode_counts_its_restore_failures_and_rules_per_table() {
    const RESTORE: &str = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family=\"IPv4\"}";
    const PARTIAL: &str =
        "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total{ip_family=\"IPv4\"}";
    const NAT_TOTAL: &str = "kubeproxy_sync_proxy_rules_iptables_total{ip_family=\"IPv4\",table=\"nat\"}";
    const NAT_LAST: &str = "kubeproxy_sync_proxy_rules_iptables_last{ip_family=\"IPv4\",table=\"nat\"}";
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = crate::metrics::IptablesMetrics::register(&mut registry);
    let fake = Fake::default();
    let mut b = backend(&fake, IptablesOptions::default()).with_metrics(metrics);
    let s = state(&[("web", "10.96.0.10"), ("api", "10.96.0.11")]);

    fake.kernel().fail_restore = true;
    sync(&mut b, &s, &[]).unwrap_err();
    assert_eq!(metric(&registry, RESTORE), 1.0, "a failed full restore");
    assert_eq!(metric(&registry, PARTIAL), 0.0, "not a partial one");
    fake.kernel().fail_restore = false;

    let report = sync(&mut b, &s, &[]).unwrap();
    let total = metric(&registry, NAT_TOTAL);
    assert!(
        total > 0.0 && metric(&registry, NAT_LAST) == total,
        "a full sync writes every rule"
    );
    assert_eq!(
        report.objects.total as f64,
        total + metric(&registry, &NAT_TOTAL.replace("nat", "filter"))
    );

    fake.kernel().fail_restore = true;
    sync(&mut b, &s, &["web"]).unwrap_err();
    assert_eq!(metric(&registry, RESTORE), 2.0, "a failed partial restore");
    assert_eq!(metric(&registry, PARTIAL), 1.0);
    fake.kernel().fail_restore = false;
    sync(&mut b, &s, &[]).unwrap();

    fake.kernel().fail_canary_check = true;
    sync(&mut b, &s, &["web"]).unwrap_err();
    assert_eq!(
        metric(&registry, PARTIAL),
        2.0,
        "a failed partial sync, restore or not"
    );
    assert_eq!(metric(&registry, RESTORE), 2.0, "no restore failed");
    fake.kernel().fail_canary_check = false;

    sync(&mut b, &s, &[]).unwrap();
    sync(&mut b, &s, &["web"]).unwrap();
    assert!(
        metric(&registry, NAT_LAST) < metric(&registry, NAT_TOTAL),
        "a partial sync writes fewer rules than the table holds"
    );
}

#[test]
fn a_refused_port_is_left_out_reported_once_and_the_rest_syncs() {
    let fake = Fake::default();
    let mut b = backend(&fake, IptablesOptions::default());
    let evil = "evil\n-A KUBE-SERVICES -j ACCEPT\n#";
    let s = renamed(
        state(&[("evil", "10.96.0.66"), ("web", "10.96.0.10")]),
        "evil",
        evil,
    );

    let first = sync(&mut b, &s, &[]).unwrap();
    assert_eq!(first.newly_unsafe.len(), 1, "{:?}", first.newly_unsafe);
    let reported = &first.newly_unsafe[0];
    assert_eq!(reported.field, "metadata.name");
    assert!(
        reported.detail.contains("control character"),
        "{}",
        reported.detail
    );
    let payload = fake.last_restore();
    assert!(!payload.contains("10.96.0.66"), "{payload}");
    assert!(!payload.contains("evil"), "{payload}");
    assert!(payload.contains("default/web:http cluster IP"), "{payload}");
    assert!(payload.lines().all(|l| l != "-A KUBE-SERVICES -j ACCEPT"));

    let again = sync(&mut b, &s, &[]).unwrap();
    assert!(again.newly_unsafe.is_empty(), "reported once, not on every sync");

    // Fixed, then broken again: reported again.
    sync(&mut b, &state(&[("web", "10.96.0.10")]), &["evil"]).unwrap();
    let relapse = sync(&mut b, &s, &[]).unwrap();
    assert_eq!(relapse.newly_unsafe.len(), 1);
}

/// A source that reports whatever the test last put in it.
#[derive(Clone)]
struct Addresses(Arc<Mutex<Result<Vec<IpAddr>, String>>>);

impl Default for Addresses {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(Ok(Vec::new()))))
    }
}

impl LocalAddresses for Addresses {
    fn addresses(&self, family: IpFamily) -> Result<Vec<IpAddr>, AddressError> {
        match &*self.0.lock().unwrap() {
            Ok(all) => Ok(all.iter().copied().filter(|ip| family.matches(ip)).collect()),
            Err(why) => Err(AddressError {
                source: std::io::Error::other(why.clone()),
            }),
        }
    }
}

/// Upstream reads the node's addresses on every sync: one added later is served.
#[test]
fn nodeport_addresses_are_read_again_on_every_sync() {
    let fake = Fake::default();
    let addresses = Addresses::default();
    *addresses.0.lock().unwrap() = Ok(vec!["192.168.0.10".parse().unwrap()]);
    let opts = IptablesOptions {
        nodeport_addresses: NodePortAddresses::Cidrs(vec!["192.168.0.0/16".parse().unwrap()]),
        ..IptablesOptions::default()
    };
    let mut b = backend(&fake, opts).with_local_addresses(Box::new(addresses.clone()));
    let s = state(&[("web", "10.96.0.10")]);
    let tails = |payload: &str| -> Vec<String> {
        payload
            .lines()
            .filter(|l| l.starts_with("-A KUBE-SERVICES") && l.ends_with("-j KUBE-NODEPORTS"))
            .map(|l| l.split(" -d ").nth(1).unwrap().to_string())
            .collect()
    };
    sync(&mut b, &s, &[]).unwrap();
    assert_eq!(tails(&fake.last_restore()), ["192.168.0.10 -j KUBE-NODEPORTS"]);

    *addresses.0.lock().unwrap() = Ok(vec![
        "192.168.0.10".parse().unwrap(),
        "192.168.7.7".parse().unwrap(),
    ]);
    let report = sync(&mut b, &s, &[]).unwrap();
    assert!(
        !report.full,
        "no change in the state: a partial sync, still with the new address"
    );
    assert_eq!(
        tails(&fake.last_restore()),
        ["192.168.0.10 -j KUBE-NODEPORTS", "192.168.7.7 -j KUBE-NODEPORTS"]
    );

    *addresses.0.lock().unwrap() = Err("netlink said no".into());
    let e = sync(&mut b, &s, &[]).unwrap_err();
    assert!(e.to_string().contains("netlink said no"), "{e}");
    assert_eq!((e.attempted(), e.step()), (SyncKind::Partial, FailedStep::Other));
}

/// Kubelet's KUBE-FIREWALL jumps go in on every full sync, as upstream's; when we do not
/// write that chain (IPv6, or no localhost NodePorts) it is created empty, never flushed.
#[test]
fn kubelet_firewall_jumps_are_ensured_even_without_our_localnet_rule() {
    let fake = Fake::default();
    let opts = IptablesOptions {
        localhost_nodeports: false,
        ..IptablesOptions::default()
    };
    let mut b = backend(&fake, opts);
    sync(&mut b, &state(&[]), &[]).unwrap();
    assert!(
        !fake.last_restore().contains("KUBE-FIREWALL"),
        "not ours to write"
    );
    let k = fake.kernel();
    assert!(k.chains.contains(&(Table::Filter, "KUBE-FIREWALL".to_string())));
    for chain in ["INPUT", "OUTPUT"] {
        let jump = (
            Table::Filter,
            chain.to_string(),
            vec!["-j".to_string(), "KUBE-FIREWALL".to_string()],
        );
        assert!(k.rules.contains(&jump), "{chain}");
    }
}

#[test]
fn full_syncs_ensure_the_jumps_before_the_restore_fills_the_chains() {
    let fake = Fake::default();
    let mut b = backend(&fake, IptablesOptions::default());
    let web = ("web", "10.96.0.10");
    sync(&mut b, &state(&[web]), &["web"]).unwrap();
    // Jumps added one by one after the restore would leave a window in which PREROUTING
    // already DNATs and POSTROUTING does not masquerade yet.
    assert_eq!(fake.kernel().rules_at_restore, [jump_rules().len()]);
    sync(&mut b, &state(&[web]), &["web"]).unwrap();
    assert_eq!(
        fake.kernel().rules_at_restore.len(),
        2,
        "a partial sync restores without touching the jumps"
    );
}

/// Nothing the backend keeps between syncs (per-service chains, the name cache, reported
/// refusals) grows with the number of changes: after rounds of kpr_world's churn, ending
/// where they started, every size is what it was after a warm-up round. Partial syncs
/// only, as a long-running proxy syncs.
#[test]
fn sizes_come_back_after_churn_in_both_families() {
    use kpr_world::churn::{Change, churn};

    fn run(world: &mut World, b: &mut IptablesBackend, changes: &[Change]) -> usize {
        let mut most_chains = 0;
        for change in changes {
            world.apply(change);
            if matches!(change, Change::Sync) {
                let pending = world.pending();
                let report = b.sync_rules(&pending.request(false)).unwrap();
                assert!(!report.full, "churn must take the partial path");
                most_chains = most_chains.max(b.footprint().get("applied.chains").unwrap());
            }
        }
        most_chains
    }

    for family in [IpFamily::V4, IpFamily::V6] {
        let fake = Fake::default();
        let opts = IptablesOptions {
            family,
            ..IptablesOptions::default()
        };
        let mut b = backend(&fake, opts).with_full_sync_period(Duration::from_secs(3600));
        let mut world = World::with_family(family);
        b.sync_rules(&world.pending().request(false)).unwrap();
        let most_chains = run(&mut world, &mut b, &churn(0, 1));
        let before = b.footprint();
        run(&mut world, &mut b, &churn(1, 40));
        let after = b.footprint();
        assert_eq!(
            before.differences(&after),
            [],
            "{family:?}: sizes grew with churn:\n{after}"
        );
        assert!(
            most_chains > before.get("applied.chains").unwrap(),
            "{family:?}: the churn never added a chain"
        );
    }
}

/// The check between syncs (crate::repair) against the fake: nothing while the rules are
/// intact, one request when the canary is deleted, a full sync for it, then quiet again.
#[test]
fn damage_found_between_syncs_asks_once_for_a_full_sync() {
    use std::sync::mpsc;
    use std::time::Duration;
    let fake = Fake::default();
    let mut b = backend(&fake, IptablesOptions::default()).with_repair_interval(Duration::from_millis(5));
    let (asked, requests) = mpsc::channel();
    let asked = Mutex::new(asked);
    b.repair_with(RepairRequest::new(move || {
        let _ = asked.lock().unwrap().send(());
    }));
    let s = state(&[("a", "10.96.0.10")]);
    assert!(sync(&mut b, &s, &["a"]).unwrap().full);
    let quiet = Duration::from_millis(200);
    assert!(
        requests.recv_timeout(quiet).is_err(),
        "intact rules ask for nothing"
    );
    assert!(!sync(&mut b, &s, &[]).unwrap().full);

    fake.kernel()
        .chains
        .remove(&(Table::Nat, kpr_naming::chain::CANARY.to_string()));
    requests
        .recv_timeout(Duration::from_secs(10))
        .expect("the deleted canary asks for a sync");
    assert!(requests.recv_timeout(quiet).is_err(), "one request per damage");
    assert!(sync(&mut b, &s, &[]).unwrap().full, "the repair sync is full");
    assert!(requests.recv_timeout(quiet).is_err(), "repaired: quiet again");

    // A deleted jump (the canary intact) asks too.
    let jumps: Vec<_> = fake.kernel().rules.iter().cloned().collect();
    fake.kernel()
        .rules
        .retain(|(table, chain, _)| !(*table == Table::Nat && chain == "PREROUTING"));
    requests
        .recv_timeout(Duration::from_secs(10))
        .expect("the deleted jump asks for a sync");
    assert!(sync(&mut b, &s, &[]).unwrap().full);
    assert_eq!(
        fake.kernel().rules.iter().cloned().collect::<HashSet<_>>(),
        jumps.into_iter().collect::<HashSet<_>>(),
        "the jump is back"
    );
}

/// Every restore line but table headers and COMMITs, sorted.
fn body_lines(restores: &[String]) -> Vec<String> {
    let mut lines: Vec<String> = restores
        .iter()
        .flat_map(|r| r.lines())
        .filter(|l| !l.starts_with('*') && *l != "COMMIT")
        .map(str::to_string)
        .collect();
    lines.sort_unstable();
    lines
}

/// With a bound on chains per restore, a full sync above it is several restores that
/// together write what one restore would; the shared chains and deletions come last;
/// partial syncs stay one restore; a failed part fails the sync, says which part, and
/// makes the next sync full.
#[test]
fn a_large_full_sync_is_split_and_a_partial_one_is_not() {
    let services = [
        ("web", "10.96.0.10"),
        ("api", "10.96.0.11"),
        ("db", "10.96.0.12"),
        ("cache", "10.96.0.13"),
    ];
    let s = state(&services);
    let whole = Fake::default();
    let whole_report = sync(&mut backend(&whole, IptablesOptions::default()), &s, &[]).unwrap();
    assert_eq!(whole.kernel().restores.len(), 1, "no bound: one restore");

    let fake = Fake::default();
    let mut b = backend(&fake, IptablesOptions::default()).with_restore_chunk_chains(Some(6));
    let report = sync(&mut b, &s, &[]).unwrap();
    let restores = fake.kernel().restores.clone();
    assert!(restores.len() > 2, "{restores:#?}");
    assert_eq!(body_lines(&restores), body_lines(&whole.kernel().restores));
    assert_eq!(report, whole_report, "the counts are the unsplit write's");
    let (last, parts) = restores.split_last().unwrap();
    assert!(
        last.contains(":KUBE-SERVICES ") && last.starts_with("*filter\n"),
        "{last}"
    );
    for part in parts {
        assert!(
            !part.contains("*filter") && !part.contains(":KUBE-SERVICES "),
            "{part}"
        );
        let chains = part.lines().filter(|l| l.starts_with(':')).count();
        assert!(chains <= 6, "{part}");
    }

    // A Service removed: its chains are deleted in the last restore.
    let fewer = state(&services[..3]);
    let before = fake.kernel().restores.len();
    sync(&mut b, &fewer, &["cache"]).unwrap();
    assert_eq!(
        fake.kernel().restores.len(),
        before + 1,
        "a partial sync is one restore"
    );
    assert!(
        fake.last_restore().contains("-X KUBE-SVC-"),
        "{}",
        fake.last_restore()
    );

    // A failed middle part fails the full sync and names its part.
    let before = fake.kernel().restores.len();
    fake.kernel().fail_restore_number = Some(before + 2);
    let e = b
        .sync_rules(&SyncRequest {
            state: &s,
            changed: &BTreeSet::new(),
            service_changes: &[],
            endpoint_changes: &[],
            force_full: true,
        })
        .unwrap_err();
    assert_eq!((e.attempted(), e.step()), (SyncKind::Full, FailedStep::Restore));
    assert!(e.to_string().contains("(restore 2 of "), "{e}");
    assert_eq!(
        fake.kernel().restores.len(),
        before + 2,
        "no restore after the failed one"
    );
    fake.kernel().fail_restore_number = None;
    assert!(
        sync(&mut b, &s, &[]).unwrap().full,
        "a failure makes the next sync full"
    );
}
