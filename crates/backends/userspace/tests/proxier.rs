//! The backend's decisions that need no kernel rules: which ports get listeners, what is
//! reported. Real sockets, in a namespace this test creates.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::{Accepting, in_netns, in_netns_with, open_descriptors};
use kpr_iptables::{ExecError, Iptables, IptablesVersion, Table};
use kpr_model::{IpFamily, NamespacedName, ServicePort, ServicePortName};
use kpr_state::{Backend, DesiredState, PendingSync};
use kpr_userspace::{UserspaceBackend, UserspaceOptions};
use kpr_world::{World, ep};
use serde_json::json;

/// A sync of `state` with no change recorded (the backend works from the whole state).
fn pending(state: DesiredState) -> PendingSync {
    PendingSync {
        state,
        changed: Default::default(),
        service_changes: Vec::new(),
        endpoint_changes: Vec::new(),
    }
}

fn sync(backend: &mut UserspaceBackend, state: DesiredState) -> kpr_state::SyncReport {
    backend.sync(&pending(state).request(true)).unwrap()
}

/// `web` and `evil` on cluster IPs; `evil` then renamed to a name no rule may carry (the
/// sources refuse such names; this is the second line of defence).
fn with_evil_name() -> DesiredState {
    let mut world = World::new();
    for (name, ip) in [("web", "10.96.0.10"), ("evil", "10.96.0.66")] {
        world
            .service(
                name,
                json!({"clusterIP": ip, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}),
            )
            .slice(
                name,
                json!([{"name": "http", "port": 8080}]),
                vec![ep("10.244.1.5")],
            );
    }
    let state = world.state();
    let (from, to) = (
        NamespacedName::new("default", "evil"),
        NamespacedName::new("default", "evil\n-A X"),
    );
    let mut services = (*state.services).clone();
    let ports: Vec<ServicePort> = services
        .remove(&from)
        .unwrap()
        .iter()
        .map(|port| ServicePort {
            name: ServicePortName::new(&to.namespace, &to.name, &port.name.port, port.name.protocol),
            ..port.clone()
        })
        .collect();
    services.insert(to, Arc::from(ports));
    DesiredState {
        services: Arc::new(services),
        ..state
    }
}

#[test]
fn a_port_whose_name_cannot_be_a_rule_gets_no_listener_and_is_reported_once() {
    in_netns("usrefuse", 1, |rt| {
        let options = UserspaceOptions::new(IpFamily::V4, "127.0.0.1".parse().unwrap());
        let mut backend = UserspaceBackend::new(options, Box::new(Accepting), rt.handle().clone());
        let first = sync(&mut backend, with_evil_name());
        assert_eq!(first.newly_unsafe.len(), 1, "{:?}", first.newly_unsafe);
        assert_eq!(first.newly_unsafe[0].field, "metadata.name");
        let open: Vec<String> = backend.listeners().keys().map(ToString::to_string).collect();
        assert_eq!(open, ["default/web:http"]);
        let again = sync(&mut backend, with_evil_name());
        assert!(again.newly_unsafe.is_empty(), "reported once, not on every sync");
        assert_eq!(backend.footprint().get("reported_refusals"), Some(1));
    });
}

/// Counts `iptables -C` calls and keeps every restore's input; its restore fails while
/// `fail` is set.
#[derive(Clone, Default)]
struct CountingChecks {
    checks: Arc<AtomicUsize>,
    restores: Arc<Mutex<Vec<String>>>,
    fail: Arc<AtomicBool>,
}

impl CountingChecks {
    /// The chains each restore since the last call declared, one list per restore.
    fn restored_chains(&self) -> Vec<Vec<String>> {
        let restores = std::mem::take(&mut *self.restores.lock().unwrap());
        restores
            .iter()
            .map(|text| {
                text.lines()
                    .filter_map(|line| line.strip_prefix(':'))
                    .filter_map(|line| line.split_whitespace().next())
                    .map(str::to_string)
                    .collect()
            })
            .collect()
    }
}

impl Iptables for CountingChecks {
    fn version(&self) -> Result<IptablesVersion, ExecError> {
        Accepting.version()
    }
    fn restore(&self, input: &[u8]) -> Result<(), ExecError> {
        self.restores
            .lock()
            .unwrap()
            .push(String::from_utf8_lossy(input).into_owned());
        if self.fail.load(Ordering::Relaxed) {
            return Err(ExecError::Failed {
                command: "iptables-restore".into(),
                status: "exit status: 1".into(),
                stderr: "made to fail".into(),
            });
        }
        Ok(())
    }
    fn save(&self, table: Table) -> Result<String, ExecError> {
        Accepting.save(table)
    }
    fn chain_exists(&self, table: Table, chain: &str) -> Result<bool, ExecError> {
        Accepting.chain_exists(table, chain)
    }
    fn rule_exists(&self, table: Table, chain: &str, args: &[String]) -> Result<bool, ExecError> {
        self.checks.fetch_add(1, Ordering::Relaxed);
        Accepting.rule_exists(table, chain, args)
    }
    fn insert_rule(&self, table: Table, chain: &str, args: &[String]) -> Result<(), ExecError> {
        Accepting.insert_rule(table, chain, args)
    }
    fn delete_rule(&self, table: Table, chain: &str, args: &[String]) -> Result<(), ExecError> {
        Accepting.delete_rule(table, chain, args)
    }
    fn create_chain(&self, table: Table, chain: &str) -> Result<(), ExecError> {
        Accepting.create_chain(table, chain)
    }
}

/// The jumps are checked (each check reads the whole nat table) at the first sync, when a
/// sync is forced and after a failed one, not at every sync.
#[test]
fn jumps_are_checked_on_full_syncs_only() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let iptables = CountingChecks::default();
    let options = UserspaceOptions::new(IpFamily::V4, "127.0.0.1".parse().unwrap());
    let mut backend = UserspaceBackend::new(options, Box::new(iptables.clone()), rt.handle().clone());
    let pending = pending(World::new().state());
    let mut checks_of = |force_full: bool| {
        let before = iptables.checks.load(Ordering::Relaxed);
        let result = backend.sync(&pending.request(force_full));
        (result.is_ok(), iptables.checks.load(Ordering::Relaxed) - before)
    };
    // Five jumps, and the one an earlier version made.
    assert_eq!(checks_of(false), (true, 6), "first sync");
    assert_eq!(checks_of(false), (true, 0), "a sync in between");
    assert_eq!(checks_of(true), (true, 6), "a forced sync");
    iptables.fail.store(true, Ordering::Relaxed);
    // Forced, so that it restores (an unchanged sync in between writes nothing).
    assert!(!checks_of(true).0, "the restore fails");
    iptables.fail.store(false, Ordering::Relaxed);
    assert_eq!(checks_of(false), (true, 6), "the sync after a failure");
    assert_eq!(checks_of(false), (true, 0), "and then none again");
}

/// One ClusterIP Service `web` (port 80, with NodePort `node_port` when given) with one
/// endpoint at `endpoint`, and `api` too when `with_api`.
fn portal_world(endpoint: &str, with_api: bool, node_port: Option<u16>) -> DesiredState {
    let mut world = World::new();
    let mut services = vec![("web", "10.96.0.10")];
    if with_api {
        services.push(("api", "10.96.0.11"));
    }
    for (name, ip) in services {
        let mut port = json!({"name": "http", "port": 80, "targetPort": 8080});
        let mut spec = json!({"clusterIP": ip});
        if let (Some(node_port), "web") = (node_port, name) {
            port["nodePort"] = json!(node_port);
            spec["type"] = json!("NodePort");
        }
        spec["ports"] = json!([port]);
        world
            .service(name, spec)
            .slice(name, json!([{"name": "http", "port": 8080}]), vec![ep(endpoint)]);
    }
    world.state()
}

/// A sync writes the portal chains whose rules changed and no others: none when only
/// endpoints changed (the balancers carry them), every chain when the sync is full (first,
/// forced, after a failure).
#[test]
fn portals_are_written_when_they_change_and_on_full_syncs() {
    in_netns("usportal", 1, |rt| {
        let iptables = CountingChecks::default();
        let options = UserspaceOptions::new(IpFamily::V4, "127.0.0.1".parse().unwrap());
        let mut backend = UserspaceBackend::new(options, Box::new(iptables.clone()), rt.handle().clone());
        let mut sync_to = |state: DesiredState, force_full: bool| {
            let report = backend.sync(&pending(state).request(force_full));
            (
                report.map(|r| r.full).map_err(|e| e.to_string()),
                iptables.restored_chains(),
            )
        };
        let all = [
            "KUBE-NODEPORT-NON-LOCAL",
            "KUBE-PORTALS-CONTAINER",
            "KUBE-PORTALS-HOST",
            "KUBE-NODEPORT-CONTAINER",
            "KUBE-NODEPORT-HOST",
        ];
        let (full, restores) = sync_to(portal_world("10.244.1.5", false, None), false);
        assert_eq!(full, Ok(true));
        assert_eq!(restores, [all], "the first sync writes every chain");
        let (full, restores) = sync_to(portal_world("10.244.1.6", false, None), false);
        assert_eq!(
            (full, restores.len()),
            (Ok(false), 0),
            "an endpoint change writes nothing"
        );
        let (full, restores) = sync_to(portal_world("10.244.1.6", true, None), false);
        assert_eq!(full, Ok(false));
        assert_eq!(
            restores,
            [["KUBE-PORTALS-CONTAINER", "KUBE-PORTALS-HOST"]],
            "a new Service"
        );
        let (_, restores) = sync_to(portal_world("10.244.1.6", true, Some(30080)), false);
        assert_eq!(
            restores,
            [[
                "KUBE-NODEPORT-NON-LOCAL",
                "KUBE-NODEPORT-CONTAINER",
                "KUBE-NODEPORT-HOST"
            ]],
            "a NodePort added"
        );
        let (full, restores) = sync_to(portal_world("10.244.1.6", true, Some(30080)), true);
        assert_eq!(full, Ok(true), "a forced sync writes every chain");
        assert_eq!(restores, [all], "a forced sync writes every chain");
        iptables.fail.store(true, Ordering::Relaxed);
        let (full, _) = sync_to(portal_world("10.244.1.6", false, Some(30080)), false);
        assert!(full.is_err(), "the restore fails");
        iptables.fail.store(false, Ordering::Relaxed);
        let (full, restores) = sync_to(portal_world("10.244.1.6", false, Some(30080)), false);
        assert_eq!(full, Ok(true), "the sync after a failure writes every chain");
        assert_eq!(restores, [all], "the sync after a failure writes every chain");
        let (full, restores) = sync_to(portal_world("10.244.1.6", false, Some(30080)), false);
        assert_eq!((full, restores.len()), (Ok(false), 0), "and then nothing again");
    });
}

/// The listeners take no more descriptors than set aside for them: every TCP thread
/// accepts on a port while they hold under an eighth of them, one thread after that, and a port
/// past the limit is left out (logged, counted) while the others are served: the sync does
/// not fail (as upstream's, so `/healthz` stays up), writes their portals, and does not
/// write them again while the port stays refused; the refused port is served at the first
/// sync after descriptors were freed. The count is the real one: one descriptor per
/// listening socket, and closing every port gives back exactly as many.
#[test]
fn listeners_stay_within_their_descriptors_and_the_other_ports_are_served() {
    in_netns("usfds", 1, |rt| {
        let iptables = CountingChecks::default();
        let mut options = UserspaceOptions::new(IpFamily::V4, "127.0.0.1".parse().unwrap());
        options.tcp_threads = std::num::NonZeroUsize::new(2).unwrap();
        options.limits.max_listener_descriptors = 24;
        let metrics = kpr_userspace::metrics::UserspaceMetrics::default();
        let mut backend = UserspaceBackend::new(options, Box::new(iptables.clone()), rt.handle().clone())
            .with_metrics(metrics.clone());
        let services = |numbers| numbered_services(IpFamily::V4, numbers);
        let mut world = services(0..24);
        // The TCP threads start with the first port: count from after a sync that started them.
        let mut first = World::new();
        first
            .service(
                "warm",
                json!({"clusterIP": "10.96.1.1", "ports": [{"name": "http", "port": 80}]}),
            )
            .slice("warm", json!([{"name": "http", "port": 80}]), vec![]);
        backend.sync(&pending(first.state()).request(false)).unwrap();
        backend
            .sync(&pending(World::new().state()).request(false))
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        iptables.restored_chains();
        let before = open_descriptors();
        let report = backend.sync(&pending(world.state()).request(false));
        assert!(
            report.is_ok(),
            "a port refused a listener fails no sync: {report:?}"
        );
        assert_eq!(backend.listeners().len(), 23, "every port but one is served");
        let refused = kpr_userspace::metrics::LimitLabels {
            ip_family: "IPv4",
            limit: "listener_descriptors",
        };
        let refusals = || metrics.limit_reached_total.get_or_create(&refused).get();
        assert_eq!(refusals(), 1, "counted");
        // 2 for the first port (two threads), 1 for each next one.
        assert_eq!(backend.footprint().get("listener_descriptors"), Some(24));
        assert_eq!(open_descriptors() - before, 24);
        let restores = iptables.restored_chains();
        assert_eq!(restores.len(), 1, "the served ports' portals are written");
        let again = backend.sync(&pending(world.state()).request(false));
        assert!(again.is_ok(), "{again:?}");
        assert_eq!(refusals(), 2, "refused again, counted again");
        assert_eq!(
            iptables.restored_chains().len(),
            0,
            "a refused port is no reason to write the portals again"
        );
        for port in backend.listeners().values() {
            std::net::TcpStream::connect(("127.0.0.1", *port)).expect("every served port accepts");
        }
        // svc0 took a descriptor per thread: once it is gone, the port left out is served.
        let served: Vec<String> = backend.listeners().keys().map(|n| n.to_string()).collect();
        backend
            .sync(&pending(services(1..24).state()).request(false))
            .unwrap();
        let now: Vec<String> = backend.listeners().keys().map(|n| n.to_string()).collect();
        assert_eq!(now.len(), 23, "{now:?}");
        assert!(
            now.iter().any(|name| !served.contains(name)),
            "the port refused before is served: {served:?} -> {now:?}"
        );
        assert_eq!(refusals(), 2, "nothing refused");
        backend
            .sync(&pending(World::new().state()).request(false))
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert_eq!(open_descriptors(), before, "closing gives every descriptor back");
    });
}

/// Services `svc<i>` of `family` for each `i` in `numbers`, a TCP port each, one endpoint.
fn numbered_services(family: IpFamily, numbers: std::ops::Range<usize>) -> World {
    let mut world = World::with_family(family);
    for i in numbers {
        let name = format!("svc{i}");
        let (cluster_ip, endpoint) = match family {
            IpFamily::V4 => (format!("10.96.0.{}", 10 + i), "10.244.1.5"),
            IpFamily::V6 => (format!("fd00:96::{:x}", 10 + i), "fd00:244::5"),
        };
        world
            .service(
                &name,
                json!({"clusterIP": cluster_ip, "ipFamilies": [family.label()],
                       "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}),
            )
            .slice(&name, json!([{"name": "http", "port": 8080}]), vec![ep(endpoint)]);
    }
    world
}

/// A dual-stack proxy's two backends share the process's descriptors: with 6 for the
/// listeners, IPv4's 4 ports leave IPv6 room for 2 of its 4 (the rest counted as IPv6's
/// refusals), and once IPv4's backend is gone, IPv6 serves all 4.
#[test]
fn both_families_listeners_share_one_descriptor_budget() {
    in_netns("usbudget", 1, |rt| {
        let backend = |family,
                       host: &str,
                       budget: &kpr_userspace::Budget,
                       metrics: &kpr_userspace::metrics::UserspaceMetrics| {
            let mut options = UserspaceOptions::new(family, host.parse().unwrap());
            options.tcp_threads = std::num::NonZeroUsize::MIN;
            UserspaceBackend::new(options, Box::new(CountingChecks::default()), rt.handle().clone())
                .sharing(budget)
                .with_metrics(metrics.clone())
        };
        let budget = kpr_userspace::Budget::new(kpr_userspace::Limits {
            max_listener_descriptors: 6,
            ..kpr_userspace::Limits::default()
        });
        let metrics = kpr_userspace::metrics::UserspaceMetrics::default();
        let mut v4 = backend(IpFamily::V4, "127.0.0.1", &budget, &metrics);
        let mut v6 = backend(IpFamily::V6, "::1", &budget, &metrics);
        sync(&mut v4, numbered_services(IpFamily::V4, 0..4).state());
        sync(&mut v6, numbered_services(IpFamily::V6, 0..4).state());
        assert_eq!((v4.listeners().len(), v6.listeners().len()), (4, 2));
        let refused = |ip_family| {
            let labels = kpr_userspace::metrics::LimitLabels {
                ip_family,
                limit: "listener_descriptors",
            };
            metrics.limit_reached_total.get_or_create(&labels).get()
        };
        assert_eq!((refused("IPv4"), refused("IPv6")), (0, 2));
        for port in v6.listeners().values() {
            std::net::TcpStream::connect(("::1", *port)).expect("a served IPv6 port accepts");
        }
        drop(v4);
        sync(&mut v6, numbered_services(IpFamily::V6, 0..4).state());
        assert_eq!(
            v6.listeners().len(),
            4,
            "IPv4's descriptors came back to the budget"
        );
    });
}

/// Without `--proxy-port-range` the listeners' ports come from the ephemeral range of the
/// proxy's own namespace, less its reserved ports, odd ones first (as the kernel's search
/// for `bind` takes them), then even ones; past the range a port is left out, counted as
/// `ephemeral_ports`.
#[test]
fn without_a_port_range_the_namespaces_ephemeral_range_is_used() {
    let sysctls = [
        ("net.ipv4.ip_local_port_range", "45000 45005"),
        ("net.ipv4.ip_local_reserved_ports", "45003"),
    ];
    in_netns_with("usephem", 1, &sysctls, |rt| {
        let options = UserspaceOptions::new(IpFamily::V4, "127.0.0.1".parse().unwrap());
        let metrics = kpr_userspace::metrics::UserspaceMetrics::default();
        let mut backend =
            UserspaceBackend::new(options, Box::new(CountingChecks::default()), rt.handle().clone())
                .with_metrics(metrics.clone());
        sync(&mut backend, numbered_services(IpFamily::V4, 0..2).state());
        let mut ports: Vec<u16> = backend.listeners().values().copied().collect();
        ports.sort_unstable();
        assert_eq!(ports, [45001, 45005], "the odd ports but the reserved one");
        sync(&mut backend, numbered_services(IpFamily::V4, 0..6).state());
        let mut ports: Vec<u16> = backend.listeners().values().copied().collect();
        ports.sort_unstable();
        assert_eq!(ports, [45000, 45001, 45002, 45004, 45005]);
        let exhausted = kpr_userspace::metrics::LimitLabels {
            ip_family: "IPv4",
            limit: "ephemeral_ports",
        };
        assert_eq!(metrics.limit_reached_total.get_or_create(&exhausted).get(), 1);
    });
}

/// A full `--proxy-port-range` leaves the ports past it out as the descriptor budget does:
/// the sync goes on with the others, the refusal is counted as the limit
/// `proxy_port_range`.
#[test]
fn a_full_port_range_leaves_a_port_out_and_counts_it() {
    in_netns("usrange", 1, |rt| {
        let iptables = CountingChecks::default();
        let mut options = UserspaceOptions::new(IpFamily::V4, "127.0.0.1".parse().unwrap());
        options.port_range = Some(40000..=40000);
        let metrics = kpr_userspace::metrics::UserspaceMetrics::default();
        let mut backend = UserspaceBackend::new(options, Box::new(iptables.clone()), rt.handle().clone())
            .with_metrics(metrics.clone());
        let report = backend.sync(&pending(portal_world("10.244.1.5", true, None)).request(false));
        assert!(report.is_ok(), "{report:?}");
        let ports: Vec<u16> = backend.listeners().values().copied().collect();
        assert_eq!(ports, [40000], "one port in the range, one Service served");
        let full = kpr_userspace::metrics::LimitLabels {
            ip_family: "IPv4",
            limit: "proxy_port_range",
        };
        assert_eq!(metrics.limit_reached_total.get_or_create(&full).get(), 1);
    });
}
