//! O(change) syncs: after the first (full) sync, each sync sends one batch holding only the
//! elements and shared chains that changed. These tests drive the real backend through a
//! transport that records batches (no kernel; tests/kernel.rs applies the same batches).

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};

use common::{clusterip, http_port, http_slice_port, options, web};
use kpr_model::IpFamily;
use kpr_nftables::{
    Batch, FullSyncReason, Listing, NftablesBackend, Op, Transport, TransportError, names::SetName,
};
use kpr_state::Backend;
use kpr_world::{World, ep};
use serde_json::json;

#[derive(Clone, Default)]
struct Recorder {
    batches: Arc<Mutex<Vec<Batch>>>,
}

impl Transport for Recorder {
    fn apply(&mut self, batch: &Batch) -> Result<(), TransportError> {
        self.batches.lock().unwrap().push(batch.clone());
        Ok(())
    }
    fn read_back(&mut self, _family: IpFamily) -> Result<Option<Listing>, TransportError> {
        Ok(None)
    }
    fn check(&mut self, _batch: &Batch) -> Result<(), TransportError> {
        Ok(())
    }
}

struct Harness {
    world: World,
    backend: NftablesBackend,
    batches: Arc<Mutex<Vec<Batch>>>,
}

impl Harness {
    fn new(world: World) -> Self {
        let recorder = Recorder::default();
        let batches = recorder.batches.clone();
        let mut h = Self {
            world,
            backend: NftablesBackend::new(options(), Box::new(recorder)).unwrap(),
            batches,
        };
        let report = h.sync();
        assert!(report.full);
        h.batches.lock().unwrap().clear();
        h
    }

    fn sync(&mut self) -> kpr_state::SyncReport {
        let pending = self.world.pending();
        self.backend.sync(&pending.request(false)).unwrap()
    }

    /// Syncs and returns the one batch the partial sync sent, as nft text.
    fn partial(&mut self) -> (Batch, String) {
        let report = self.sync();
        assert!(!report.full, "expected a partial sync");
        let mut batches = std::mem::take(&mut *self.batches.lock().unwrap());
        assert_eq!(batches.len(), 1, "one atomic batch per partial sync");
        let batch = batches.remove(0);
        let text = kpr_nftables::batch_text(&batch, 1);
        (batch, text)
    }
}

fn lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

/// A count change moves the Service's slots (in their order) into the endpoint map of the
/// new count; a count nobody had comes with its map, created empty before the chain that
/// binds it (the kernel walks a map's elements when a new rule binds it), and the map of
/// the count nobody has any more goes after its chain.
#[test]
fn one_endpoint_added_moves_the_slots_to_the_new_counts_map() {
    let mut h = Harness::new(web(vec![ep("10.244.1.5"), ep("10.244.2.6")]));
    h.world.slice(
        "web",
        http_slice_port(),
        vec![ep("10.244.1.5"), ep("10.244.2.6"), ep("10.244.3.7")],
    );
    let (_, text) = h.partial();
    assert_eq!(
        lines(&text),
        [
            "add map ip kube-proxy service-endpoints-tcp-3 { typeof ip daddr . tcp dport . numgen random mod 1 : ip daddr . tcp dport ; }",
            "add chain ip kube-proxy pick-service-endpoints-tcp-3",
            "add rule ip kube-proxy pick-service-endpoints-tcp-3 dnat to ip daddr . tcp dport . numgen random mod 3 map @service-endpoints-tcp-3",
            "add set ip kube-proxy pick-service-endpoints-tcp-3-ips { type ipv4_addr . inet_proto . inet_service ; }",
            "flush chain ip kube-proxy service-dispatch",
            "add rule ip kube-proxy service-dispatch ip daddr . meta l4proto . th dport @pick-service-endpoints-tcp-3-ips goto pick-service-endpoints-tcp-3",
            "add rule ip kube-proxy service-dispatch fib daddr type local ip daddr != 127.0.0.0/8 goto nodeport-dispatch",
            "delete element ip kube-proxy pick-service-endpoints-tcp-2-ips { 10.96.0.10 . tcp . 80 }",
            "delete element ip kube-proxy service-endpoints-tcp-2 { 10.96.0.10 . 80 . 0, 10.96.0.10 . 80 . 1 }",
            "add element ip kube-proxy hairpin { 10.244.3.7 . 10.244.3.7 }",
            "add element ip kube-proxy service-endpoints-tcp-3 { 10.96.0.10 . 80 . 0 : 10.244.1.5 . 8080, 10.96.0.10 . 80 . 1 : 10.244.2.6 . 8080, 10.96.0.10 . 80 . 2 : 10.244.3.7 . 8080 }",
            "add element ip kube-proxy pick-service-endpoints-tcp-3-ips { 10.96.0.10 . tcp . 80 comment \"default/web:http\" }",
            "delete set ip kube-proxy pick-service-endpoints-tcp-2-ips",
            "flush chain ip kube-proxy pick-service-endpoints-tcp-2",
            "delete chain ip kube-proxy pick-service-endpoints-tcp-2",
            "delete map ip kube-proxy service-endpoints-tcp-2",
        ]
    );
}

#[test]
fn one_endpoint_removed_moves_the_last_slot_into_the_hole() {
    let mut h = Harness::new(web(vec![ep("10.244.1.5"), ep("10.244.2.6"), ep("10.244.3.7")]));
    h.world
        .slice("web", http_slice_port(), vec![ep("10.244.1.5"), ep("10.244.3.7")]);
    let (batch, text) = h.partial();
    assert_eq!(
        lines(&text),
        [
            "add map ip kube-proxy service-endpoints-tcp-2 { typeof ip daddr . tcp dport . numgen random mod 1 : ip daddr . tcp dport ; }",
            "add chain ip kube-proxy pick-service-endpoints-tcp-2",
            "add rule ip kube-proxy pick-service-endpoints-tcp-2 dnat to ip daddr . tcp dport . numgen random mod 2 map @service-endpoints-tcp-2",
            "add set ip kube-proxy pick-service-endpoints-tcp-2-ips { type ipv4_addr . inet_proto . inet_service ; }",
            "flush chain ip kube-proxy service-dispatch",
            "add rule ip kube-proxy service-dispatch ip daddr . meta l4proto . th dport @pick-service-endpoints-tcp-2-ips goto pick-service-endpoints-tcp-2",
            "add rule ip kube-proxy service-dispatch fib daddr type local ip daddr != 127.0.0.0/8 goto nodeport-dispatch",
            "delete element ip kube-proxy pick-service-endpoints-tcp-3-ips { 10.96.0.10 . tcp . 80 }",
            "delete element ip kube-proxy hairpin { 10.244.2.6 . 10.244.2.6 }",
            "delete element ip kube-proxy service-endpoints-tcp-3 { 10.96.0.10 . 80 . 0, 10.96.0.10 . 80 . 1, 10.96.0.10 . 80 . 2 }",
            "add element ip kube-proxy service-endpoints-tcp-2 { 10.96.0.10 . 80 . 0 : 10.244.1.5 . 8080, 10.96.0.10 . 80 . 1 : 10.244.3.7 . 8080 }",
            "add element ip kube-proxy pick-service-endpoints-tcp-2-ips { 10.96.0.10 . tcp . 80 comment \"default/web:http\" }",
            "delete set ip kube-proxy pick-service-endpoints-tcp-3-ips",
            "flush chain ip kube-proxy pick-service-endpoints-tcp-3",
            "delete chain ip kube-proxy pick-service-endpoints-tcp-3",
            "delete map ip kube-proxy service-endpoints-tcp-3",
        ]
    );
    let counts = batch.counts();
    // The M' = 2 slots added to the new count's map, the M = 3 deleted from the old one.
    assert_eq!((counts.elements_added, counts.elements_deleted), (3, 5));
}

#[test]
fn one_endpoint_replaced_is_one_slot() {
    let mut h = Harness::new(web(vec![ep("10.244.1.5"), ep("10.244.2.6"), ep("10.244.3.7")]));
    h.world.slice(
        "web",
        http_slice_port(),
        vec![ep("10.244.1.5"), ep("10.244.9.9"), ep("10.244.3.7")],
    );
    let (_, text) = h.partial();
    assert_eq!(
        lines(&text),
        [
            "delete element ip kube-proxy hairpin { 10.244.2.6 . 10.244.2.6 }",
            "delete element ip kube-proxy service-endpoints-tcp-3 { 10.96.0.10 . 80 . 1 }",
            "add element ip kube-proxy hairpin { 10.244.9.9 . 10.244.9.9 }",
            "add element ip kube-proxy service-endpoints-tcp-3 { 10.96.0.10 . 80 . 1 : 10.244.9.9 . 8080 }",
        ]
    );
}

#[test]
fn a_new_service_with_a_known_count_is_elements_only() {
    let mut h = Harness::new(web(vec![ep("10.244.1.5"), ep("10.244.2.6")]));
    h.world
        .service("api", clusterip("10.96.0.20", http_port()))
        .slice("api", http_slice_port(), vec![ep("10.244.1.8"), ep("10.244.2.9")]);
    let (batch, text) = h.partial();
    assert!(
        batch.ops.iter().all(|op| matches!(op, Op::AddElements(..))),
        "element adds only: no chain, set or rule\n{text}"
    );
    assert!(text.contains(
        "add element ip kube-proxy pick-service-endpoints-tcp-2-ips { 10.96.0.20 . tcp . 80 comment \"default/api:http\" }"
    ));
    assert!(text.contains("add element ip kube-proxy cluster-ips { 10.96.0.20 }"));
    assert_eq!(batch.counts().elements_added, 6, "{text}");
    assert_eq!(batch.counts().elements_deleted, 0);
}

/// Every chain binding an endpoint map is created with that map, after it and while it is
/// empty: the pick chain with its count's map, the slot chains of a sticky chain with the
/// map of its count and timeout. So no new rule ever binds a map holding elements.
#[test]
fn a_new_shape_brings_its_own_empty_map_before_the_chains_binding_it() {
    let mut h = Harness::new(web(vec![ep("10.244.1.5"), ep("10.244.2.6")]));
    h.world
        .service(
            "sticky",
            json!({"type": "ClusterIP", "clusterIP": "10.96.0.20", "ports": http_port(),
                   "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}),
        )
        .slice("sticky", http_slice_port(), vec![ep("10.244.1.8"), ep("10.244.2.9")]);
    let (batch, text) = h.partial();
    let map = "service-endpoints-tcp-2-t60";
    let created = batch
        .ops
        .iter()
        .position(|op| matches!(op, Op::AddSet(set) if set.to_string() == map))
        .unwrap_or_else(|| panic!("{map} created\n{text}"));
    let first_chain = batch
        .ops
        .iter()
        .position(|op| matches!(op, Op::AddChain(_)))
        .unwrap();
    let filled = batch
        .ops
        .iter()
        .position(|op| matches!(op, Op::AddElements(set, _) if set.to_string() == map))
        .unwrap();
    assert!(created < first_chain && first_chain < filled, "{text}");
    for slot in 0..2 {
        assert!(text.contains(&format!(
            "add rule ip kube-proxy slot-{map}-{slot} dnat to ip daddr . tcp dport . numgen random mod 1 offset {slot} map @{map}\n"
        )), "{text}");
    }
    // The existing pick chain's map only gets elements; the new Service's slots are not in it.
    assert!(!text.contains("service-endpoints-tcp-2 {"), "{text}");
}

#[test]
fn a_deleted_service_takes_its_elements_and_unused_chains() {
    let mut world = web(vec![ep("10.244.1.5"), ep("10.244.2.6")]);
    world.service("api", clusterip("10.96.0.20", http_port())).slice(
        "api",
        http_slice_port(),
        vec![ep("10.244.1.5")],
    );
    let mut h = Harness::new(world);
    h.world.delete_service("api");
    let (batch, text) = h.partial();
    assert_eq!(
        lines(&text),
        [
            "flush chain ip kube-proxy service-dispatch",
            "add rule ip kube-proxy service-dispatch ip daddr . meta l4proto . th dport @pick-service-endpoints-tcp-2-ips goto pick-service-endpoints-tcp-2",
            "add rule ip kube-proxy service-dispatch fib daddr type local ip daddr != 127.0.0.0/8 goto nodeport-dispatch",
            "delete element ip kube-proxy pick-service-endpoints-tcp-1-ips { 10.96.0.20 . tcp . 80 }",
            "delete element ip kube-proxy cluster-ips { 10.96.0.20 }",
            "delete element ip kube-proxy service-endpoints-tcp-1 { 10.96.0.20 . 80 . 0 }",
            "delete set ip kube-proxy pick-service-endpoints-tcp-1-ips",
            "flush chain ip kube-proxy pick-service-endpoints-tcp-1",
            "delete chain ip kube-proxy pick-service-endpoints-tcp-1",
            "delete map ip kube-proxy service-endpoints-tcp-1",
        ],
        "the hairpin element of 10.244.1.5 stays: web still uses it"
    );
    assert_eq!(batch.counts().elements_added, 0);
}

#[test]
fn a_policy_change_repoints_the_entry() {
    let mut h = Harness::new(web(vec![ep("10.244.1.5 local"), ep("10.244.2.6")]));
    h.world.service(
        "web",
        json!({"type": "ClusterIP", "clusterIP": "10.96.0.10", "internalTrafficPolicy": "Local", "ports": http_port()}),
    );
    let (_, text) = h.partial();
    assert!(text.contains("add element ip kube-proxy pick-service-endpoints-tcp-1-ips { 10.96.0.10 . tcp . 80 comment \"default/web:http\" }"), "{text}");
    assert!(
        text.contains("delete element ip kube-proxy service-endpoints-tcp-2 { 10.96.0.10 . 80 . 0, 10.96.0.10 . 80 . 1 }"),
        "{text}"
    );
    // No local endpoint left: the cluster IP drops.
    h.world.slice("web", http_slice_port(), vec![ep("10.244.2.6")]);
    let (_, text) = h.partial();
    assert!(
        text.contains("add element ip kube-proxy no-endpoint-drop-ips { 10.96.0.10 . tcp . 80 comment \"default/web:http\" }"),
        "{text}"
    );
    assert!(
        text.contains(
            "delete element ip kube-proxy pick-service-endpoints-tcp-1-ips { 10.96.0.10 . tcp . 80 }"
        ),
        "{text}"
    );
}

#[test]
fn nothing_changed_sends_nothing_but_reconciles() {
    let mut h = Harness::new(web(vec![ep("10.244.1.5")]));
    // The recorder's read-back finds no table: someone deleted it, so the sync is full.
    let report = h.sync();
    assert!(report.full);
    assert_eq!(h.backend.last_full_reason(), Some(FullSyncReason::TableChanged));
}

#[test]
fn large_cold_loads_are_split_by_element_count() {
    let mut world = World::new();
    for i in 0..50u32 {
        let name = format!("svc{i}");
        world
            .service(&name, clusterip(&format!("10.96.1.{i}"), http_port()))
            .slice(
                &name,
                http_slice_port(),
                vec![ep(&format!("10.244.1.{i}")), ep(&format!("10.244.2.{i}"))],
            );
    }
    let recorder = Recorder::default();
    let batches = recorder.batches.clone();
    let opts = kpr_nftables::NftablesOptions {
        max_batch_elements: 40,
        ..options()
    };
    let mut backend = NftablesBackend::new(opts, Box::new(recorder)).unwrap();
    backend.sync(&world.pending().request(false)).unwrap();
    let batches = batches.lock().unwrap();
    // 50 x (2 endpoints + 2 hairpin + entry + cluster IP) + 1 service CIDR = 301 elements.
    let sizes: Vec<usize> = batches.iter().map(|b| b.counts().elements_added).collect();
    assert_eq!(sizes.iter().sum::<usize>(), 301);
    assert!(sizes.iter().all(|n| *n <= 40), "{sizes:?}");
    assert_eq!(sizes.len(), 8);
    // Endpoints go in before the entries that lead to them.
    let ops: Vec<&Op> = batches.iter().flat_map(|b| &b.ops).collect();
    let first_entry = ops
        .iter()
        .position(|op| matches!(op, Op::AddElements(SetName::Entries { .. }, _)))
        .unwrap();
    let last_endpoint = ops
        .iter()
        .rposition(|op| matches!(op, Op::AddElements(SetName::Endpoints(_), _)))
        .unwrap();
    assert!(last_endpoint < first_entry);
}

/// Refuses any batch that declares an affinity set, as a kernel without dynamic sets would.
struct NoDynamicSets;

impl Transport for NoDynamicSets {
    fn apply(&mut self, _batch: &Batch) -> Result<(), TransportError> {
        Ok(())
    }
    fn read_back(&mut self, _family: IpFamily) -> Result<Option<Listing>, TransportError> {
        Ok(None)
    }
    fn check(&mut self, batch: &Batch) -> Result<(), TransportError> {
        if batch
            .ops
            .iter()
            .any(|op| matches!(op, Op::AddSet(SetName::Affinity(_))))
        {
            return Err(TransportError::Refused {
                status: "exit status: 1".into(),
                stderr: "Error: Operation not supported".into(),
            });
        }
        Ok(())
    }
}

#[test]
fn a_missing_kernel_feature_is_named_at_start_up() {
    let error = kpr_nftables::check_support(&mut NoDynamicSets, &options()).unwrap_err();
    assert_eq!(error.feature, "dynamic sets with timeouts (ClientIP affinity)");
    assert!(error.to_string().contains("Operation not supported"), "{error}");
}

/// Two Services claiming one external IP and port: the first keeps it, the second's entry
/// is left out (never a second element with the same key, which the kernel would refuse);
/// when the holder goes, a full sync hands the destination over.
#[test]
fn a_contested_destination_stays_with_its_holder_until_released() {
    let external = |ip: &str| json!({"type": "ClusterIP", "clusterIP": ip, "externalIPs": ["203.0.113.9"], "ports": http_port()});
    let mut world = World::new();
    world
        .service("a", external("10.96.0.10"))
        .slice("a", http_slice_port(), vec![ep("10.244.1.5")]);
    let mut h = Harness::new(world);
    h.world
        .service("b", external("10.96.0.20"))
        .slice("b", http_slice_port(), vec![ep("10.244.2.6")]);
    let (_, text) = h.partial();
    assert!(
        !text.contains("203.0.113.9"),
        "b may not touch a's destination:\n{text}"
    );
    assert!(
        text.contains(
            "pick-service-endpoints-tcp-1-ips { 10.96.0.20 . tcp . 80 comment \"default/b:http\" }"
        ),
        "{text}"
    );

    h.world.delete_service("a");
    let (_, text) = h.partial();
    assert!(
        text.contains(
            "delete element ip kube-proxy masq-service-endpoints-tcp-1-ips { 203.0.113.9 . tcp . 80 }"
        ),
        "{text}"
    );
    let report = h.sync();
    assert!(report.full, "b gets the destination in a full sync");
    assert_eq!(
        h.backend.last_full_reason(),
        Some(FullSyncReason::ConflictReleased)
    );
    let batches = std::mem::take(&mut *h.batches.lock().unwrap());
    let text: String = batches.iter().map(|b| kpr_nftables::batch_text(b, 1)).collect();
    assert!(
        text.contains(
            "masq-service-endpoints-tcp-1-ips { 203.0.113.9 . tcp . 80 comment \"default/b:http\" }"
        ),
        "{text}"
    );
}

#[test]
fn service_cidr_changes_are_element_changes() {
    let mut h = Harness::new(web(vec![ep("10.244.1.5")]));
    h.backend.set_service_cidrs(vec![
        "10.96.0.0/16".parse().unwrap(),
        "10.97.0.0/16".parse().unwrap(),
    ]);
    // Any sync carries it; here one with an endpoint change.
    h.world.slice("web", http_slice_port(), vec![ep("10.244.1.6")]);
    let (_, text) = h.partial();
    assert!(
        text.contains("add element ip kube-proxy service-cidrs { 10.97.0.0/16 }"),
        "{text}"
    );
    assert!(!text.contains("10.96.0.0/16"), "{text}");
}

/// ServiceCIDR objects reach the backend through the desired state: their CIDRs (of the
/// family) are node elements beside the options' fixed ones, added and removed by element.
#[test]
fn service_cidrs_of_the_desired_state_are_element_changes() {
    let mut h = Harness::new(web(vec![ep("10.244.1.5")]));
    let with = |h: &mut Harness, cidrs: &[&str]| {
        let cidrs = cidrs.iter().map(|c| c.parse().unwrap()).collect();
        let pending = h.world.pending().with_service_cidrs(Arc::new(cidrs));
        assert!(!h.backend.sync(&pending.request(false)).unwrap().full);
        let batches = std::mem::take(&mut *h.batches.lock().unwrap());
        assert_eq!(batches.len(), 1, "one atomic batch per partial sync");
        kpr_nftables::batch_text(&batches[0], 1)
    };
    h.world.slice("web", http_slice_port(), vec![ep("10.244.1.6")]);
    let text = with(&mut h, &["10.96.0.0/16", "10.100.0.0/16", "fd00:96::/112"]);
    assert!(
        text.contains("add element ip kube-proxy service-cidrs { 10.100.0.0/16 }"),
        "{text}"
    );
    assert!(
        !text.contains("fd00:96::"),
        "the other family's CIDR stays out:\n{text}"
    );
    assert!(
        !text.contains("10.96.0.0/16"),
        "the options' CIDR was there already:\n{text}"
    );
    h.world.slice("web", http_slice_port(), vec![ep("10.244.1.7")]);
    let text = with(&mut h, &[]);
    assert!(
        text.contains("delete element ip kube-proxy service-cidrs { 10.100.0.0/16 }"),
        "{text}"
    );
    assert!(!text.contains("10.96.0.0/16"), "the options' CIDR stays:\n{text}");
}

/// Overlapping ServiceCIDRs (allowed by the API server) must not reach the interval set,
/// which refuses overlapping elements: only the outermost network is written.
#[test]
fn overlapping_service_cidrs_keep_the_outermost_network_only() {
    let mut h = Harness::new(web(vec![ep("10.244.1.5")]));
    h.world.slice("web", http_slice_port(), vec![ep("10.244.1.6")]);
    let cidrs = ["10.96.0.0/12", "10.96.0.0/16", "10.100.0.0/24", "10.96.0.0/12"];
    let cidrs = cidrs.iter().map(|c| c.parse().unwrap()).collect();
    let pending = h.world.pending().with_service_cidrs(Arc::new(cidrs));
    h.backend.sync(&pending.request(false)).unwrap();
    let batches = std::mem::take(&mut *h.batches.lock().unwrap());
    let text: String = batches.iter().map(|b| kpr_nftables::batch_text(b, 1)).collect();
    assert!(
        text.contains("delete element ip kube-proxy service-cidrs { 10.96.0.0/16 }"),
        "{text}"
    );
    assert!(
        text.contains("add element ip kube-proxy service-cidrs { 10.96.0.0/12 }"),
        "{text}"
    );
    assert!(!text.contains("10.100.0.0/24"), "{text}");
}

#[test]
fn no_local_endpoint_counts_follow_partial_syncs() {
    let local = |eps| {
        let mut world = World::new();
        world
            .service("web", json!({"type": "NodePort", "clusterIP": "10.96.0.10", "externalTrafficPolicy": "Local",
                                   "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}))
            .slice("web", http_slice_port(), eps);
        world
    };
    let mut h = Harness::new(local(vec![ep("10.244.1.5 local")]));
    h.world.slice("web", http_slice_port(), vec![ep("10.244.2.6")]);
    let report = h.sync();
    assert!(!report.full);
    assert_eq!((report.no_local_internal, report.no_local_external), (0, 1));
    h.world.slice(
        "web",
        http_slice_port(),
        vec![ep("10.244.2.6"), ep("10.244.1.7 local")],
    );
    let report = h.sync();
    assert_eq!((report.no_local_internal, report.no_local_external), (0, 0));
}

/// A full sync after a good one rebuilds the table in place: ours flushed, the rest deleted
/// by handle (a foreign name never goes into a command), the affinity sets untouched.
#[test]
fn an_in_place_full_sync_flushes_ours_and_deletes_the_rest_by_handle() {
    let mut world = web(vec![ep("10.244.1.5")]);
    let opts = options();
    let ruleset = kpr_nftables::build(&world.state(), &opts, &[]);
    let listing = kpr_nftables::parse_listing(
        br#"{"nftables": [{"metainfo": {}}, {"table": {"family": "ip", "name": "kube-proxy", "handle": 1}},
            {"chain": {"name": "services", "handle": 5}}, {"chain": {"name": "x\"; delete table ip filter", "handle": 77}},
            {"set": {"name": "cluster-ips", "handle": 6}}, {"set": {"name": "affinity-service-endpoints-tcp", "handle": 7}},
            {"set": {"name": "intruder", "handle": 78}}]}"#,
    )
    .unwrap();
    let mut batches = Vec::new();
    kpr_nftables::stream_full(
        &ruleset,
        &opts,
        kpr_nftables::FullStart::InPlace(&listing),
        1000,
        &mut |b| {
            batches.push(b);
            Ok::<(), ()>(())
        },
    )
    .unwrap();
    let text = kpr_nftables::batch_text(&batches[0], 1);
    let head: Vec<&str> = text.lines().take(6).collect();
    assert_eq!(
        head,
        [
            "add table ip kube-proxy { comment \"rules for kube-proxy\" ; }",
            "flush chain ip kube-proxy services",
            "flush set ip kube-proxy cluster-ips",
            "delete chain ip kube-proxy handle 77",
            "delete set ip kube-proxy handle 78",
            "add set ip kube-proxy cluster-ips { type ipv4_addr ; }",
        ]
    );
    assert!(
        !text.contains("delete table") && !text.contains("flush set ip kube-proxy affinity"),
        "{text}"
    );
}

/// With localhost NodePorts on, an in-place full sync keeps our named counters (and their
/// numbers: they are declared again, which changes nothing) and deletes every other object
/// by its type and handle.
#[test]
fn an_in_place_full_sync_keeps_our_counters_and_deletes_foreign_objects() {
    let mut world = World::new();
    world.service("web", common::nodeport_web(json!({})));
    let opts = kpr_nftables::NftablesOptions {
        localhost_nodeports: kpr_nftables::LocalhostNodePorts::Proxied,
        ..options()
    };
    let ruleset = kpr_nftables::build(&world.state(), &opts, &[]);
    let listing = kpr_nftables::parse_listing(
        br#"{"nftables": [{"metainfo": {}}, {"table": {"family": "ip", "name": "kube-proxy", "handle": 1}},
            {"counter": {"family": "ip", "name": "localhost-nodeport-rejected-udp", "table": "kube-proxy", "handle": 3, "packets": 7, "bytes": 420}},
            {"counter": {"family": "ip", "name": "localhost-nodeport-rejected-tcp", "table": "kube-proxy", "handle": 4, "packets": 0, "bytes": 0}},
            {"quota": {"family": "ip", "name": "q\"; delete table ip filter", "table": "kube-proxy", "handle": 9, "bytes": 1}}]}"#,
    )
    .unwrap();
    assert_eq!(listing.objects.len(), 3);
    let mut batches = Vec::new();
    kpr_nftables::stream_full(
        &ruleset,
        &opts,
        kpr_nftables::FullStart::InPlace(&listing),
        1000,
        &mut |b| {
            batches.push(b);
            Ok::<(), ()>(())
        },
    )
    .unwrap();
    let text = kpr_nftables::batch_text(&batches[0], 1);
    let objects: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("counter ip") || l.contains("quota"))
        .collect();
    assert_eq!(
        objects,
        [
            // The TCP counter is not ours with the proxy running, so it goes like the quota.
            "delete counter ip kube-proxy handle 4",
            "delete quota ip kube-proxy handle 9",
            "add counter ip kube-proxy localhost-nodeport-rejected-udp",
            "add counter ip kube-proxy localhost-nodeport-rejected-sctp",
        ]
    );
}

/// A NodePort coming and going is one element of `localhost-nodeports` more or less, in
/// the same partial batch as its other elements; rules and counters are not touched.
#[test]
fn localhost_nodeport_elements_follow_partial_syncs() {
    let recorder = Recorder::default();
    let batches = recorder.batches.clone();
    let opts = kpr_nftables::NftablesOptions {
        localhost_nodeports: kpr_nftables::LocalhostNodePorts::Rejected,
        ..options()
    };
    let mut world = World::new();
    world.service("web", clusterip("10.96.0.10", http_port()));
    let mut backend = NftablesBackend::new(opts, Box::new(recorder)).unwrap();
    assert!(backend.sync(&world.pending().request(false)).unwrap().full);
    batches.lock().unwrap().clear();
    let localhost = |batch: &Batch| -> Vec<Op> {
        batch
            .ops
            .iter()
            .filter(|op| {
                matches!(
                    op,
                    Op::AddElements(SetName::LocalhostNodePorts, _)
                        | Op::DeleteElements(SetName::LocalhostNodePorts, _)
                ) || matches!(op, Op::AddCounter(_) | Op::AddRule(..))
            })
            .cloned()
            .collect()
    };

    world.service("svc", common::nodeport_web(json!({"clusterIP": "10.96.0.20"})));
    assert!(!backend.sync(&world.pending().request(false)).unwrap().full);
    let sent = batches.lock().unwrap().pop().unwrap();
    let ops = localhost(&sent);
    assert_eq!(ops.len(), 1, "{ops:?}");
    let Op::AddElements(_, added) = &ops[0] else {
        panic!("{ops:?}")
    };
    assert_eq!(added.len(), 1);
    assert_eq!(
        added[0].0,
        kpr_nftables::ElemKey::ProtoPort(kpr_model::Protocol::Tcp, 30080)
    );

    world.delete_service("svc");
    assert!(!backend.sync(&world.pending().request(false)).unwrap().full);
    let sent = batches.lock().unwrap().pop().unwrap();
    assert!(matches!(
        &localhost(&sent)[..],
        [Op::DeleteElements(SetName::LocalhostNodePorts, keys)] if keys.len() == 1
    ));
}
