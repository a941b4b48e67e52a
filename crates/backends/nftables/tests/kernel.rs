//! Kernel tests: the real [`NftablesBackend`] driving the real `nft` binary inside network
//! namespaces the tests create (never the root namespace; dropping a namespace frees its
//! tables, also when a test panics).
//!
//! Golden and update tests prove what we *send*; these prove the kernel takes it, that the
//! read-back reconcile sees what others did to our table, and that real traffic follows
//! the maps. A machine without `nft` FAILS these tests (there is no skip).

#![allow(clippy::unwrap_used)]

#[macro_use]
mod common;

use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::{Via, clusterip, golden_dir, http_port, http_slice_port, options, transport, web};
use kpr_host::LocalDetector;
use kpr_model::IpFamily;
use kpr_netns::{CLUSTER_CIDR, Lab, NODE_IP, Netns, pod_ip, spread};
use kpr_nftables::{FullSyncReason, LocalhostNodePorts, NftCli, NftablesBackend, NftablesOptions, cleanup};
use kpr_state::{Backend, SyncReport};
use kpr_world::{World, ep};
use serde_json::json;

fn cli(netns: &Netns) -> NftCli {
    NftCli::new(options().affinity_capacity).with_prefix(&["ip", "netns", "exec", netns.name()])
}

fn nft(netns: &Netns, args: &[&str]) -> String {
    let out = netns
        .command("nft")
        .args(args)
        .output()
        .expect("running nft (is nftables installed?)");
    assert!(
        out.status.success(),
        "nft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sync(backend: &mut NftablesBackend, world: &mut World) -> SyncReport {
    backend.sync(&world.pending().request(false)).unwrap()
}

fn new_backend(netns: &Netns, opts: NftablesOptions, via: Via) -> NftablesBackend {
    let transport = transport(netns, via, opts.affinity_capacity);
    NftablesBackend::new(opts, transport).unwrap()
}

#[test]
fn every_golden_file_loads_into_the_kernel() {
    let netns = Netns::new("nftgold").unwrap();
    let mut files: Vec<_> = std::fs::read_dir(golden_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 10);
    for file in files {
        let script = std::fs::read_to_string(&file).unwrap();
        cli(&netns)
            .run_script(&script)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    }
}

fn first_sync_then_element_changes_and_a_quiet_reconcile(via: Via) {
    let netns = Netns::new("nftsync").unwrap();
    let mut world = web(vec![ep("10.244.1.5"), ep("10.244.2.6")]);
    let mut backend = new_backend(&netns, options(), via);
    assert!(sync(&mut backend, &mut world).full);
    let listed = nft(
        &netns,
        &[
            "list",
            "set",
            "ip",
            "kube-proxy",
            "pick-service-endpoints-tcp-2-ips",
        ],
    );
    assert!(
        listed.contains("10.96.0.10 . tcp . 80 comment \"default/web:http\""),
        "{listed}"
    );
    let dispatch = nft(&netns, &["list", "chain", "ip", "kube-proxy", "service-dispatch"]);
    assert!(
        dispatch.contains(
            "ip daddr . meta l4proto . th dport @pick-service-endpoints-tcp-2-ips goto pick-service-endpoints-tcp-2"
        ),
        "{dispatch}"
    );

    world.slice(
        "web",
        http_slice_port(),
        vec![ep("10.244.1.5"), ep("10.244.2.6"), ep("10.244.3.7")],
    );
    let report = sync(&mut backend, &mut world);
    assert!(!report.full);
    let listed = nft(
        &netns,
        &["list", "map", "ip", "kube-proxy", "service-endpoints-tcp-3"],
    );
    assert!(
        listed.contains("10.96.0.10 . 80 . 2 : 10.244.3.7 . 8080"),
        "{listed}"
    );
    // The slots moved to the new count's map; the old count's map went with its chain.
    let maps = nft(&netns, &["list", "maps", "ip"]);
    assert!(
        maps.contains("map service-endpoints-tcp-3 ") && !maps.contains("service-endpoints-tcp-2"),
        "{maps}"
    );
    let chains = nft(&netns, &["list", "chains", "ip"]);
    assert!(
        chains.contains("pick-service-endpoints-tcp-3") && !chains.contains("pick-service-endpoints-tcp-2"),
        "{chains}"
    );
    // The new count's set and dispatch rule replaced the old ones in the same transaction.
    let sets = nft(&netns, &["list", "sets", "ip"]);
    assert!(
        sets.contains("set pick-service-endpoints-tcp-3-ips")
            && !sets.contains("pick-service-endpoints-tcp-2-ips"),
        "{sets}"
    );
    let dispatch = nft(&netns, &["list", "chain", "ip", "kube-proxy", "service-dispatch"]);
    assert!(
        dispatch.contains("@pick-service-endpoints-tcp-3-ips goto pick-service-endpoints-tcp-3")
            && !dispatch.contains("tcp-2"),
        "{dispatch}"
    );

    // Nothing changed: the read-back matches, nothing is rewritten.
    let report = sync(&mut backend, &mut world);
    assert!(!report.full, "{:?}", backend.last_full_reason());
    assert_eq!(report.objects.written, 0);
}

fn a_flushed_table_is_rebuilt_by_the_next_reconcile(via: Via) {
    let netns = Netns::new("nftflush").unwrap();
    let mut world = web(vec![ep("10.244.1.5")]);
    let mut backend = new_backend(&netns, options(), via);
    sync(&mut backend, &mut world);
    let before = nft(&netns, &["list", "table", "ip", "kube-proxy"]);
    nft(&netns, &["flush", "table", "ip", "kube-proxy"]);
    assert!(sync(&mut backend, &mut world).full);
    assert_eq!(backend.last_full_reason(), Some(FullSyncReason::TableChanged));
    assert_eq!(nft(&netns, &["list", "table", "ip", "kube-proxy"]), before);
}

fn foreign_rules_and_chains_in_our_table_are_removed_other_tables_untouched(via: Via) {
    let netns = Netns::new("nftforeign").unwrap();
    nft(&netns, &["add", "table", "ip", "user"]);
    nft(
        &netns,
        &[
            "add",
            "chain",
            "ip",
            "user",
            "mine",
            "{ type filter hook input priority 0 ; }",
        ],
    );
    nft(
        &netns,
        &[
            "add", "rule", "ip", "user", "mine", "tcp", "dport", "22", "accept",
        ],
    );
    let user_before = nft(&netns, &["list", "table", "ip", "user"]);

    let mut world = web(vec![ep("10.244.1.5")]);
    let mut backend = new_backend(&netns, options(), via);
    sync(&mut backend, &mut world);
    // A first reconcile records the baseline listing.
    assert!(!sync(&mut backend, &mut world).full);
    let before = nft(&netns, &["list", "table", "ip", "kube-proxy"]);

    // Someone edits a rule of ours in place (same count): the baseline comparison sees it.
    let handle = nft(
        &netns,
        &["-a", "list", "chain", "ip", "kube-proxy", "reject-chain"],
    )
    .lines()
    .filter(|l| l.contains("reject #"))
    .find_map(|l| l.split("# handle ").nth(1).map(str::trim).map(str::to_string))
    .unwrap();
    nft(
        &netns,
        &[
            "replace",
            "rule",
            "ip",
            "kube-proxy",
            "reject-chain",
            "handle",
            &handle,
            "accept",
        ],
    );
    assert!(sync(&mut backend, &mut world).full);
    assert_eq!(nft(&netns, &["list", "table", "ip", "kube-proxy"]), before);

    // Someone adds a rule and a chain.
    nft(
        &netns,
        &[
            "add",
            "rule",
            "ip",
            "kube-proxy",
            "services",
            "tcp",
            "dport",
            "9",
            "accept",
        ],
    );
    nft(&netns, &["add", "chain", "ip", "kube-proxy", "intruder"]);
    assert!(sync(&mut backend, &mut world).full);
    assert_eq!(backend.last_full_reason(), Some(FullSyncReason::TableChanged));
    assert_eq!(nft(&netns, &["list", "table", "ip", "kube-proxy"]), before);
    assert_eq!(nft(&netns, &["list", "table", "ip", "user"]), user_before);
}

fn a_restarted_proxy_adopts_the_existing_table_and_cleanup_removes_only_ours(via: Via) {
    let netns = Netns::new("nftadopt").unwrap();
    // What upstream's nftables mode (or an older proxy) left: same table, other contents.
    nft(&netns, &["add", "table", "ip", "kube-proxy"]);
    nft(
        &netns,
        &[
            "add",
            "chain",
            "ip",
            "kube-proxy",
            "service-ULMVA6XW-ns1/svc1/tcp/p80",
        ],
    );
    nft(&netns, &["add", "table", "ip6", "user6"]);
    let mut world = web(vec![ep("10.244.1.5"), ep("10.244.2.6")]);
    let mut first = new_backend(&netns, options(), via);
    sync(&mut first, &mut world);
    let written = nft(&netns, &["list", "table", "ip", "kube-proxy"]);
    assert!(!written.contains("ULMVA6XW"));
    drop(first);

    let mut second = new_backend(&netns, options(), via);
    let mut again = web(vec![ep("10.244.1.5"), ep("10.244.2.6")]);
    assert!(sync(&mut second, &mut again).full);
    assert_eq!(nft(&netns, &["list", "table", "ip", "kube-proxy"]), written);

    let mut transport = transport(&netns, via, 1);
    assert!(cleanup(&mut *transport, IpFamily::V4).unwrap());
    assert!(
        !cleanup(&mut *transport, IpFamily::V4).unwrap(),
        "nothing left to remove"
    );
    assert!(transport.read_back(IpFamily::V4).unwrap().is_none());
    assert!(nft(&netns, &["list", "tables"]).contains("table ip6 user6"));
}

fn ipv6_table_loads_and_updates(via: Via) {
    let netns = Netns::new("nft6").unwrap();
    let mut world = World::with_family(IpFamily::V6);
    world
        .service("web", json!({"type": "NodePort", "clusterIP": "fd00:96::10", "ipFamilies": ["IPv6"],
                               "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}))
        .slice("web", http_slice_port(), vec![ep("fd00:10:244:1::5")]);
    let opts = NftablesOptions {
        family: IpFamily::V6,
        local_detector: LocalDetector::ClusterCidr(vec!["fd00:10:244::/56".parse().unwrap()]),
        ..options()
    };
    let mut backend = new_backend(&netns, opts, via);
    assert!(sync(&mut backend, &mut world).full);
    world.slice(
        "web",
        http_slice_port(),
        vec![ep("fd00:10:244:1::5"), ep("fd00:10:244:1::6")],
    );
    assert!(!sync(&mut backend, &mut world).full);
    let listed = nft(&netns, &["list", "table", "ip6", "kube-proxy"]);
    assert!(listed.contains("30080 . 1 : fd00:10:244:1::6 . 8080"), "{listed}");
}

// === real traffic ===

fn sock(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

fn answered(counts: &std::collections::BTreeMap<String, usize>) -> Vec<&str> {
    counts.keys().map(String::as_str).collect()
}

fn traffic_follows_cluster_ip_and_node_port_through_an_endpoint_change(via: Via) {
    let lab = Lab::new(3).unwrap();
    let _servers: Vec<_> = (0..3)
        .map(|i| {
            lab.pod(i)
                .tcp_backend(sock(pod_ip(i), 8080), &format!("pod{i}"))
                .unwrap()
        })
        .collect();
    let opts = NftablesOptions {
        local_detector: LocalDetector::ClusterCidr(vec![CLUSTER_CIDR.parse().unwrap()]),
        service_cidrs: vec!["10.96.0.0/16".parse().unwrap()],
        ..NftablesOptions::default()
    };
    let endpoint = |i: usize| ep(&pod_ip(i).to_string());
    let mut world = World::new();
    world
        .service("web", json!({"type": "NodePort", "clusterIP": "10.96.0.10",
                               "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}))
        .slice("web", http_slice_port(), vec![endpoint(0), endpoint(1)])
        .service("empty", clusterip("10.96.0.30", http_port()));
    let mut backend = new_backend(lab.node(), opts, via);
    assert!(sync(&mut backend, &mut world).full);

    let vip = sock([10, 96, 0, 10], 80);
    assert_eq!(answered(&spread(lab.pod(2), vip, 60)), ["pod0", "pod1"]);
    assert_eq!(
        answered(&spread(lab.client(), sock(NODE_IP, 30080), 60)),
        ["pod0", "pod1"]
    );
    assert_eq!(answered(&spread(lab.node(), vip, 30)), ["pod0", "pod1"]);

    // Wrong port of a cluster IP, and a Service without endpoints: refused at once.
    let short = Duration::from_secs(2);
    let refused = |addr| lab.pod(2).tcp_request(addr, short).unwrap_err().kind();
    assert_eq!(refused(sock([10, 96, 0, 10], 81)), ErrorKind::ConnectionRefused);
    assert_eq!(refused(sock([10, 96, 0, 30], 80)), ErrorKind::ConnectionRefused);
    // An address of the Service CIDR no Service holds: dropped.
    assert_eq!(refused(sock([10, 96, 0, 99], 80)), ErrorKind::TimedOut);

    // pod0 leaves, pod2 joins: one partial sync, traffic follows at once.
    world.slice("web", http_slice_port(), vec![endpoint(1), endpoint(2)]);
    assert!(!sync(&mut backend, &mut world).full);
    assert_eq!(answered(&spread(lab.pod(0), vip, 60)), ["pod1", "pod2"]);
    assert_eq!(
        answered(&spread(lab.client(), sock(NODE_IP, 30080), 60)),
        ["pod1", "pod2"]
    );
    // Down to one endpoint.
    world.slice("web", http_slice_port(), vec![endpoint(2)]);
    assert!(!sync(&mut backend, &mut world).full);
    assert_eq!(answered(&spread(lab.pod(0), vip, 20)), ["pod2"]);
}

fn this_kernel_supports_every_feature_and_the_check_commits_nothing(via: Via) {
    let netns = Netns::new("nftcheck").unwrap();
    for family in [IpFamily::V4, IpFamily::V6] {
        for localhost_nodeports in [
            LocalhostNodePorts::Off,
            LocalhostNodePorts::Rejected,
            LocalhostNodePorts::Proxied,
        ] {
            let opts = NftablesOptions {
                family,
                localhost_nodeports,
                ..options()
            };
            kpr_nftables::check_support(&mut *transport(&netns, via, 1), &opts).unwrap();
        }
    }
    assert_eq!(
        nft(&netns, &["list", "tables"]),
        "",
        "a check leaves no table behind"
    );
}

fn under_steady_churn_the_table_is_still_checked_every_reconcile_period(via: Via) {
    let netns = Netns::new("nftchurn").unwrap();
    let mut world = web(vec![ep("10.244.1.5")]);
    let mut backend = new_backend(&netns, options(), via).with_reconcile_period(std::time::Duration::ZERO);
    sync(&mut backend, &mut world);
    nft(&netns, &["flush", "table", "ip", "kube-proxy"]);
    // A sync with a change: the check is due anyway.
    world.slice("web", http_slice_port(), vec![ep("10.244.1.6")]);
    assert!(sync(&mut backend, &mut world).full);
    assert_eq!(backend.last_full_reason(), Some(FullSyncReason::TableChanged));
    let listed = nft(
        &netns,
        &["list", "map", "ip", "kube-proxy", "service-endpoints-tcp-1"],
    );
    assert!(listed.contains("10.244.1.6 . 8080"), "{listed}");
}

through_both_transports!(
    first_sync_then_element_changes_and_a_quiet_reconcile,
    a_flushed_table_is_rebuilt_by_the_next_reconcile,
    foreign_rules_and_chains_in_our_table_are_removed_other_tables_untouched,
    a_restarted_proxy_adopts_the_existing_table_and_cleanup_removes_only_ours,
    ipv6_table_loads_and_updates,
    traffic_follows_cluster_ip_and_node_port_through_an_endpoint_change,
    this_kernel_supports_every_feature_and_the_check_commits_nothing,
    under_steady_churn_the_table_is_still_checked_every_reconcile_period,
);

// === netlink only: what goes over the wire, and foreign commits seen by generation ===

/// What [`Recording`] notes for a read-back.
const READ_BACK: &str = "(read back)";

/// Records every batch it passes on, lowered to netlink, and every read-back, so tests can
/// see what went to the kernel.
struct Recording {
    inner: kpr_nftables::NetlinkTransport,
    sent: std::sync::Arc<std::sync::Mutex<Vec<Vec<String>>>>,
}

impl kpr_nftables::Transport for Recording {
    fn apply(&mut self, batch: &kpr_nftables::Batch) -> Result<(), kpr_nftables::TransportError> {
        let ops = self
            .inner
            .lower(batch)
            .operations()
            .map(|o| o.to_string())
            .collect();
        self.sent.lock().unwrap().push(ops);
        self.inner.apply(batch)
    }
    fn read_back(
        &mut self,
        family: IpFamily,
    ) -> Result<Option<kpr_nftables::Listing>, kpr_nftables::TransportError> {
        self.sent.lock().unwrap().push(vec![READ_BACK.to_string()]);
        self.inner.read_back(family)
    }
    fn check(&mut self, batch: &kpr_nftables::Batch) -> Result<(), kpr_nftables::TransportError> {
        self.inner.check(batch)
    }
    fn foreign_changes(&mut self) -> Result<Option<bool>, kpr_nftables::TransportError> {
        self.inner.foreign_changes()
    }
    fn cheap_read_back(&self) -> bool {
        self.inner.cheap_read_back()
    }
}

#[allow(clippy::type_complexity)]
fn recording_backend(
    netns: &Netns,
) -> (
    NftablesBackend,
    std::sync::Arc<std::sync::Mutex<Vec<Vec<String>>>>,
) {
    let sent = std::sync::Arc::default();
    let inner = netns.run(|| kpr_nftables::NetlinkTransport::open(options().affinity_capacity).unwrap());
    let transport = Recording {
        inner,
        sent: std::sync::Arc::clone(&sent),
    };
    (
        NftablesBackend::new(options(), Box::new(transport)).unwrap(),
        sent,
    )
}

#[test]
fn a_partial_sync_sends_one_netlink_transaction_of_element_changes_only() {
    let netns = Netns::new("nlbatch").unwrap();
    let mut world = web(vec![ep("10.244.1.5"), ep("10.244.2.6")]);
    let (mut backend, sent) = recording_backend(&netns);
    assert!(sync(&mut backend, &mut world).full);
    sent.lock().unwrap().clear();

    // One endpoint replaced by another: same count, so no chain changes.
    world.slice("web", http_slice_port(), vec![ep("10.244.1.5"), ep("10.244.3.7")]);
    assert!(!sync(&mut backend, &mut world).full);
    let batches = sent.lock().unwrap().clone();
    assert_eq!(batches.len(), 1, "one transaction and no read-back: {batches:?}");
    let ops = &batches[0];
    assert!(!ops.is_empty());
    assert!(
        ops.iter()
            .all(|op| op.starts_with("add ") && op.contains(" element(s) to set ")
                || op.starts_with("delete ") && op.contains(" element(s) from set ")),
        "only element changes: {ops:?}"
    );
    assert!(
        ops.iter().any(|op| op.contains("service-endpoints-tcp-2")),
        "{ops:?}"
    );
    let listed = nft(
        &netns,
        &["list", "map", "ip", "kube-proxy", "service-endpoints-tcp-2"],
    );
    assert!(listed.contains("10.244.3.7 . 8080"), "{listed}");
    assert!(!listed.contains("10.244.2.6"), "{listed}");
}

/// nf_tables' data type of verdict maps (`NFT_DATA_VERDICT`).
const VERDICT_DATA: u32 = 0xffff_ff00;

/// The issue this model answers: a new Service whose target chain exists must not make the
/// kernel re-validate the table, so its transaction may hold only element adds to sets
/// without verdicts (an added `goto` element is what triggers the validation).
#[test]
fn a_new_service_whose_target_exists_is_plain_set_element_adds_only() {
    let netns = Netns::new("nlnewsvc").unwrap();
    let mut world = web(vec![ep("10.244.1.5"), ep("10.244.2.6")]);
    let (mut backend, sent) = recording_backend(&netns);
    assert!(sync(&mut backend, &mut world).full);
    sent.lock().unwrap().clear();

    world.service("api", clusterip("10.96.0.20", http_port())).slice(
        "api",
        http_slice_port(),
        vec![ep("10.244.1.8"), ep("10.244.2.9")],
    );
    assert!(!sync(&mut backend, &mut world).full);
    let batches = sent.lock().unwrap().clone();
    assert_eq!(batches.len(), 1, "one transaction and no read-back: {batches:?}");
    let ops = &batches[0];
    assert!(
        ops.iter()
            .all(|op| op.starts_with("add ") && op.contains(" element(s) to set ")),
        "only element adds: {ops:?}"
    );
    let written: Vec<&str> = ops.iter().filter_map(|op| op.rsplit(' ').next()).collect();
    assert!(
        written.contains(&"pick-service-endpoints-tcp-2-ips"),
        "the entry goes to its target's set: {ops:?}"
    );
    let table = kpr_nfnetlink::Table::new(kpr_nfnetlink::Family::Ip, "kube-proxy");
    let mut socket = netns.run(|| kpr_nfnetlink::Socket::open().unwrap());
    let sets = socket.sets(&table).unwrap();
    for name in &written {
        let set = sets.iter().find(|s| s.name == *name).unwrap();
        assert_ne!(
            set.data.map(|(kind, _)| kind),
            Some(VERDICT_DATA),
            "{name} holds verdicts"
        );
    }
    assert!(
        sets.iter()
            .all(|s| s.data.map(|(kind, _)| kind) != Some(VERDICT_DATA)),
        "no verdict map is left in the table"
    );
    let listed = nft(
        &netns,
        &[
            "list",
            "set",
            "ip",
            "kube-proxy",
            "pick-service-endpoints-tcp-2-ips",
        ],
    );
    assert!(
        listed.contains("10.96.0.20 . tcp . 80 comment \"default/api:http\""),
        "{listed}"
    );
}

#[test]
fn a_quiet_netlink_sync_lists_nothing_and_a_foreign_commit_is_noticed_and_repaired() {
    let netns = Netns::new("nlgen").unwrap();
    let mut world = web(vec![ep("10.244.1.5")]);
    let (mut backend, sent) = recording_backend(&netns);
    assert!(sync(&mut backend, &mut world).full);
    let reject_chain = || nft(&netns, &["list", "chain", "ip", "kube-proxy", "reject-chain"]);
    let before = reject_chain();

    // Nothing committed by anyone: nothing sent, nothing listed (the generation says so).
    sent.lock().unwrap().clear();
    assert!(!sync(&mut backend, &mut world).full);
    assert!(sent.lock().unwrap().is_empty(), "{:?}", sent.lock().unwrap());

    // A commit to another table is noticed, read back once, and found harmless.
    nft(&netns, &["add", "table", "ip", "user"]);
    assert!(!sync(&mut backend, &mut world).full);
    assert_eq!(*sent.lock().unwrap(), vec![vec![READ_BACK.to_string()]]);
    sent.lock().unwrap().clear();
    assert!(!sync(&mut backend, &mut world).full);
    assert!(
        sent.lock().unwrap().is_empty(),
        "seen once: {:?}",
        sent.lock().unwrap()
    );

    // Someone replaces one of our rules in place while Services keep changing (a sync
    // with changes, long before any reconcile period): repaired at once.
    let handle = nft(
        &netns,
        &["-a", "list", "chain", "ip", "kube-proxy", "reject-chain"],
    )
    .lines()
    .filter(|l| l.contains("reject #"))
    .find_map(|l| l.split("# handle ").nth(1).map(str::trim).map(str::to_string))
    .unwrap();
    nft(
        &netns,
        &[
            "replace",
            "rule",
            "ip",
            "kube-proxy",
            "reject-chain",
            "handle",
            &handle,
            "accept",
        ],
    );
    world.slice("web", http_slice_port(), vec![ep("10.244.1.5")]);
    world.service("other", clusterip("10.96.0.20", http_port()));
    assert!(sync(&mut backend, &mut world).full);
    assert_eq!(backend.last_full_reason(), Some(FullSyncReason::TableChanged));
    let after = nft(&netns, &["list", "table", "ip", "kube-proxy"]);
    assert!(after.contains("10.96.0.20"), "{after}");
    assert_eq!(reject_chain(), before, "our rule is back");
    assert!(nft(&netns, &["list", "tables"]).contains("table ip user"));
}

/// Loads `world` through both transports, each into a namespace of its own, and returns
/// both `nft list table` texts.
fn listed_through_both(world: &mut World, opts: &NftablesOptions) -> (String, String) {
    let pending = world.pending();
    let family = match opts.family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    };
    let list = |via: Via| {
        let netns = Netns::new("nloracle").unwrap();
        let mut backend = new_backend(&netns, opts.clone(), via);
        assert!(backend.sync(&pending.request(false)).unwrap().full);
        nft(&netns, &["list", "table", family, "kube-proxy"])
    };
    (list(Via::Nft), list(Via::Netlink))
}

/// nft is the oracle: whatever the netlink transport writes lists exactly as what `nft -f`
/// writes for the same state, for every kind of set, element, chain and rule the mode has.
#[test]
fn netlink_writes_what_nft_writes() {
    let mut world = World::new();
    world
        .service("web", common::nodeport_web(json!({"externalTrafficPolicy": "Local", "externalIPs": ["203.0.113.9"]})))
        .slice("web", http_slice_port(), vec![ep("10.244.1.5 local"), ep("10.244.2.6"), ep("10.244.3.7")])
        .service("lb", json!({"type": "LoadBalancer", "clusterIP": "10.96.0.20",
                   "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30081}],
                   "loadBalancerSourceRanges": ["192.0.2.0/24", "198.51.100.7/32"],
                   "status": {"loadBalancer": {"ingress": [{"ip": "5.6.7.8"}]}}}))
        .slice("lb", http_slice_port(), vec![ep("10.244.1.5")])
        .service("sticky", json!({"type": "ClusterIP", "clusterIP": "10.96.0.30", "ports": http_port(),
                   "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}))
        .slice("sticky", http_slice_port(), vec![ep("10.244.1.5"), ep("10.244.2.6")])
        .service("dns", json!({"type": "ClusterIP", "clusterIP": "10.96.0.53",
                   "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "s", "port": 9, "protocol": "SCTP"}]}))
        .slice("dns", json!([{"name": "dns", "port": 5353, "protocol": "UDP"}, {"name": "s", "port": 99, "protocol": "SCTP"}]), vec![ep("10.244.1.5")])
        .service("empty", clusterip("10.96.0.40", http_port()));
    let opts = NftablesOptions {
        local_detector: LocalDetector::InterfaceNamePrefix(
            kpr_model::text::InterfaceName::prefix("veth").unwrap(),
        ),
        ..options()
    };
    let (nft_text, netlink_text) = listed_through_both(&mut world, &opts);
    for expected in [
        "numgen random mod 2 vmap",
        "update @affinity-service-endpoints-tcp",
        "5.6.7.8 . tcp . 80 . 192.0.2.0/24",
        "10.96.0.53 . 9 . 0 : 10.244.1.5 . 99",
        "iifname \"veth*\"",
        "set no-endpoint-reject-ips",
        "10.96.0.40 . tcp . 80 comment \"default/empty:http\"",
        "@pick-service-endpoints-tcp-1-ips goto pick-service-endpoints-tcp-1",
        "goto nodeport-dispatch",
        "10.96.0.0/16",
        "comment \"rules for kube-proxy\"",
    ] {
        assert!(nft_text.contains(expected), "{expected}: {nft_text}");
    }
    assert_eq!(netlink_text, nft_text);

    let mut world = World::with_family(IpFamily::V6);
    world
        .service("web", json!({"type": "NodePort", "clusterIP": "fd00:96::10", "ipFamilies": ["IPv6"],
                               "sessionAffinity": "ClientIP",
                               "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}))
        .slice("web", http_slice_port(), vec![ep("fd00:10:244:1::5"), ep("fd00:10:244:1::6")]);
    let opts = NftablesOptions {
        family: IpFamily::V6,
        local_detector: LocalDetector::ClusterCidr(vec!["fd00:10:244::/56".parse().unwrap()]),
        ..options()
    };
    let (nft_text, netlink_text) = listed_through_both(&mut world, &opts);
    assert_eq!(netlink_text, nft_text);

    // Localhost NodePorts: the set, the named counters and the rules counting into them.
    let opts = NftablesOptions {
        localhost_nodeports: LocalhostNodePorts::Proxied,
        ..opts
    };
    let (nft_text, netlink_text) = listed_through_both(&mut world, &opts);
    assert!(
        nft_text.contains("counter localhost-nodeport-rejected-sctp {"),
        "{nft_text}"
    );
    assert!(
        nft_text.contains(
            "ip6 daddr ::1 meta l4proto . udp dport @localhost-nodeports counter name \"localhost-nodeport-rejected-udp\" reject"
        ),
        "{nft_text}"
    );
    assert_eq!(netlink_text, nft_text);
    let mut world = World::new();
    world.service("web", common::nodeport_web(json!({}))).slice(
        "web",
        http_slice_port(),
        vec![ep("10.244.1.5")],
    );
    let opts = NftablesOptions {
        localhost_nodeports: LocalhostNodePorts::Rejected,
        ..options()
    };
    let (nft_text, netlink_text) = listed_through_both(&mut world, &opts);
    assert!(
        nft_text.contains(
            "ip daddr 127.0.0.0/8 meta l4proto . tcp dport @localhost-nodeports counter name \"localhost-nodeport-rejected-tcp\" reject"
        ),
        "{nft_text}"
    );
    assert!(
        nft_text.contains("tcp . 30080 comment \"default/web:http\""),
        "{nft_text}"
    );
    assert_eq!(netlink_text, nft_text);
}
