//! The manager against real sockets on 127.0.0.1 (and the wildcards for the per-family
//! test): what each port answers as Services come, change and go, and how failures are
//! reported. The end-to-end test (crates/kube-proxy-rs/tests/e2e_health_check_ports.rs)
//! runs the same through the binary in a namespace lab.

use std::time::Duration;

use kpr_events::Collected;
use prometheus_client::registry::Registry;
use serde_json::json;

use super::answer::{WEIGHT_HEADER, body};
use super::*;
use crate::test_client::{Reply, get, request};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A port nobody listens on right now (the kernel's pick, released again).
fn free_port() -> u16 {
    free_ports(1)[0]
}

/// `n` distinct ports nobody listens on right now: all are held until all are picked, as
/// the kernel may hand a port released a moment ago to the next bind.
fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

fn service(name: &str) -> NamespacedName {
    NamespacedName::new("shop", name)
}

fn check(node_port: u16, local_endpoints: usize) -> HealthCheck {
    HealthCheck {
        node_port,
        local_endpoints,
    }
}

/// A manager on 127.0.0.1, its Events, its metrics and the proxy health it reports.
struct Harness {
    manager: Manager,
    events: Arc<Collected>,
    registry: Registry,
    health: Arc<ProxyHealth>,
}

impl Harness {
    fn new() -> Self {
        Self::on(IpFamily::V4, HealthCheckAddresses::Ips(vec![LOCALHOST]))
    }

    fn on(family: IpFamily, addresses: HealthCheckAddresses) -> Self {
        Self::with_health_timeout(family, addresses, Duration::from_secs(60))
    }

    fn with_health_timeout(family: IpFamily, addresses: HealthCheckAddresses, timeout: Duration) -> Self {
        Self::with(family, addresses, timeout, HttpLimits::SERVICE_HEALTH)
    }

    fn with(
        family: IpFamily,
        addresses: HealthCheckAddresses,
        timeout: Duration,
        limits: HttpLimits,
    ) -> Self {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let events = Arc::new(Collected::default());
        let health = Arc::new(ProxyHealth::new(timeout));
        let config = ServiceHealthConfig {
            family,
            node_name: "node-a".into(),
            addresses,
            limits,
        };
        Self {
            manager: Manager::new(config, health.clone(), metrics, events.clone()),
            events,
            registry,
            health,
        }
    }

    async fn apply(&mut self, wanted: &[(&str, HealthCheck)]) {
        let wanted: HealthChecks = wanted.iter().map(|(name, c)| (service(name), *c)).collect();
        self.manager.apply(&wanted).await;
    }

    /// The failure counter of the IPv4 set for `reason` (0 while absent).
    fn failures(&self, reason: &str) -> f64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        let series = format!(
            "kubeproxy_service_healthcheck_failures_total{{ip_family=\"IPv4\",reason=\"{reason}\"}} "
        );
        text.lines()
            .find_map(|l| l.strip_prefix(&series))
            .map_or(0.0, |v| v.parse().unwrap())
    }

    /// Every Event's note so far.
    fn notes(&self) -> Vec<String> {
        self.events.events().into_iter().map(|e| e.note).collect()
    }
}

async fn probe(port: u16) -> Reply {
    get(SocketAddr::new(LOCALHOST, port), "/").await
}

/// [`probe`] once something listens on `port` (the running set opens it from its own task).
async fn probe_when_listening(port: u16) -> Option<Reply> {
    if refused(port).await {
        return None;
    }
    Some(probe(port).await)
}

async fn refused(port: u16) -> bool {
    tokio::net::TcpStream::connect(SocketAddr::new(LOCALHOST, port))
        .await
        .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
}

/// One budget for the whole set: half-sent requests on one Service's port are evicted by a
/// probe of another's, so the bound does not grow with the number of Services.
#[tokio::test]
async fn every_port_of_the_set_shares_one_connection_budget() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let limits = HttpLimits {
        max_connections: 2,
        ..HttpLimits::SERVICE_HEALTH
    };
    let local = HealthCheckAddresses::Ips(vec![LOCALHOST]);
    let mut h = Harness::with(IpFamily::V4, local, Duration::from_secs(60), limits);
    let [a, b] = free_ports(2).try_into().unwrap();
    h.apply(&[("a", check(a, 1)), ("b", check(b, 1))]).await;
    let mut half_sent = Vec::new();
    for n in 1..=2 {
        let mut stream = tokio::net::TcpStream::connect(SocketAddr::new(LOCALHOST, a))
            .await
            .unwrap();
        stream.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n").await.unwrap();
        half_sent.push(stream);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while h.manager.budget.open() < n {
            assert!(tokio::time::Instant::now() < deadline, "not admitted");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert_eq!(probe(b).await.status, 200);
    // The oldest of port a's connections made room.
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(20), half_sent[0].read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0) | Err(_))), "{read:?}");
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &h.registry).unwrap();
    assert!(
        text.lines()
            .any(|l| l == "kubeproxy_http_connections_rejected_total{server=\"service-healthcheck\",reason=\"evicted\"} 1"),
        "{text}"
    );
}

#[test]
fn the_body_is_upstreams_template_byte_for_byte() {
    assert_eq!(
        body(&service("web"), 2, true),
        "{\n\t\"service\": {\n\t\t\"namespace\": \"shop\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
    );
}

#[tokio::test]
async fn a_local_endpoint_answers_200_with_upstreams_headers_and_body() {
    let mut h = Harness::new();
    let port = free_port();
    h.apply(&[("web", check(port, 2))]).await;
    let reply = probe(port).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(reply.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(reply.header(WEIGHT_HEADER), Some("2"));
    assert_eq!(reply.body, body(&service("web"), 2, true));
    let parsed: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(
        parsed,
        json!({"service": {"namespace": "shop", "name": "web"}, "localEndpoints": 2,
               "serviceProxyHealthy": true})
    );
    // Upstream's handler serves the whole port, whatever the method and path.
    let other = request(SocketAddr::new(LOCALHOST, port), "HEAD", "/anything").await;
    assert_eq!(other.status, 200);
    assert!(h.events.events().is_empty());
}

#[tokio::test]
async fn no_local_endpoint_or_a_late_proxy_answers_503() {
    let localhost = HealthCheckAddresses::Ips(vec![LOCALHOST]);
    let mut h = Harness::with_health_timeout(IpFamily::V4, localhost, Duration::from_millis(1));
    let [empty, late] = free_ports(2)[..] else {
        unreachable!()
    };
    h.apply(&[("empty", check(empty, 0)), ("late", check(late, 1))])
        .await;
    let reply = probe(empty).await;
    assert_eq!(reply.status, 503);
    assert_eq!(reply.header(WEIGHT_HEADER), Some("0"));
    assert_eq!(reply.body, body(&service("empty"), 0, true));
    assert_eq!(probe(late).await.status, 200);

    // A change queued and not applied within the health timeout: the rules are stale, and
    // a node with stale rules must not attract traffic, local endpoints or not.
    h.health.updated();
    h.health.queued_update();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let reply = probe(late).await;
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert_eq!(reply.body, body(&service("late"), 1, false));
}

#[tokio::test]
async fn counts_follow_each_sync_and_a_removed_service_closes_its_port() {
    let mut h = Harness::new();
    let port = free_port();
    h.apply(&[("web", check(port, 1))]).await;
    assert_eq!(probe(port).await.status, 200);
    h.apply(&[("web", check(port, 0))]).await;
    assert_eq!(probe(port).await.status, 503, "endpoints moved off the node");
    h.apply(&[("web", check(port, 3))]).await;
    let reply = probe(port).await;
    assert_eq!((reply.status, reply.header(WEIGHT_HEADER)), (200, Some("3")));
    h.apply(&[]).await;
    assert!(refused(port).await, "the Service is gone: nothing listens");
}

#[tokio::test]
async fn a_new_health_check_port_moves_the_server() {
    let mut h = Harness::new();
    let [old, new] = free_ports(2)[..] else {
        unreachable!()
    };
    h.apply(&[("web", check(old, 1))]).await;
    h.apply(&[("web", check(new, 1))]).await;
    assert!(refused(old).await);
    assert_eq!(probe(new).await.status, 200);
}

/// Another program holds one Service's port: reported and retried at every sync, served
/// once free; the other Service answers throughout.
#[tokio::test]
async fn a_busy_port_is_reported_and_retried_while_other_services_answer() {
    let mut h = Harness::new();
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = holder.local_addr().unwrap().port();
    let fine = free_port();
    let wanted = [("busy", check(busy, 1)), ("fine", check(fine, 1))];
    h.apply(&wanted).await;
    assert_eq!(probe(fine).await.status, 200);
    let events = h.events.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let event = &events[0];
    assert_eq!(event.event_type, EventType::Warning);
    assert_eq!(
        (event.reason, event.action),
        ("FailedToStartServiceHealthcheck", "Listen")
    );
    assert_eq!(event.regarding.to_string(), "Service shop/busy");
    assert_eq!(event.regarding.uid.as_deref(), Some("shop/busy"));
    let expected = format!("node node-a failed to start healthcheck \"shop/busy\" on port {busy}: ");
    assert!(event.note.starts_with(&expected), "{}", event.note);
    assert!(
        event.note.contains(&format!("127.0.0.1:{busy}")),
        "{}",
        event.note
    );
    assert_eq!(h.failures("port_in_use"), 1.0);

    h.apply(&wanted).await;
    assert_eq!(
        h.events.events().len(),
        2,
        "retried (and reported) at the next sync"
    );
    assert_eq!(h.failures("port_in_use"), 2.0);
    assert_eq!(probe(fine).await.status, 200);

    drop(holder);
    h.apply(&wanted).await;
    assert_eq!(probe(busy).await.status, 200, "served once the port is free");
    assert_eq!(probe(fine).await.status, 200);
    assert_eq!(h.events.events().len(), 2, "no failure once it opened");
}

/// Two Services claiming one port: the first gets it, the second is reported (naming the
/// first) and gets it once the first lets go; one already serving keeps it.
#[tokio::test]
async fn a_port_claimed_twice_stays_with_one_service_and_the_other_is_reported() {
    let mut h = Harness::new();
    let port = free_port();
    h.apply(&[("b", check(port, 2)), ("c", check(port, 0))]).await;
    let reply = probe(port).await;
    assert_eq!(reply.body, body(&service("b"), 2, true), "first by name wins");
    assert_eq!(
        h.notes(),
        [format!(
            "node node-a failed to start healthcheck \"shop/c\" on port {port}: port {port} already serves the health check of Service shop/b"
        )]
    );
    assert_eq!(h.failures("port_claimed_twice"), 1.0);

    // A new claimant sorting before the holder does not take the port away.
    h.apply(&[
        ("a", check(port, 0)),
        ("b", check(port, 2)),
        ("c", check(port, 0)),
    ])
    .await;
    assert_eq!(probe(port).await.body, body(&service("b"), 2, true));
    assert_eq!(h.failures("port_claimed_twice"), 3.0);

    // The holder goes away: the next claimant in line gets the port in the same sync.
    h.apply(&[("a", check(port, 0)), ("c", check(port, 0))]).await;
    assert_eq!(probe(port).await.body, body(&service("a"), 0, true));
    assert_eq!(h.failures("port_claimed_twice"), 4.0, "c is still refused");
}

/// IPv4's and IPv6's sets each bind their own family's wildcard, so a dual-stack Service's
/// one port opens in both (upstream's fix for kubernetes#114702).
#[tokio::test]
async fn the_ipv4_and_ipv6_sets_both_hold_a_dual_stack_services_port() {
    let mut v4 = Harness::on(IpFamily::V4, HealthCheckAddresses::Any);
    let mut v6 = Harness::on(IpFamily::V6, HealthCheckAddresses::Any);
    let port = free_port();
    v4.apply(&[("web", check(port, 1))]).await;
    v6.apply(&[("web", check(port, 0))]).await;
    assert!(v4.events.events().is_empty() && v6.events.events().is_empty());
    let over_v4 = get(SocketAddr::new(LOCALHOST, port), "/").await;
    let over_v6 = get(SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), port), "/").await;
    assert_eq!(
        (over_v4.status, over_v6.status),
        (200, 503),
        "each family answers its own count"
    );
}

/// Addresses of the other family in the list are not listened on.
#[test]
fn only_the_familys_own_addresses_are_listened_on() {
    let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
    let h = Harness::on(IpFamily::V4, HealthCheckAddresses::Ips(vec![LOCALHOST, v6]));
    let on: Vec<SocketAddr> = h.manager.listen_on(32000).iter().map(|on| on.addr).collect();
    assert_eq!(on, [SocketAddr::new(LOCALHOST, 32000)]);
    let any = Harness::on(IpFamily::V6, HealthCheckAddresses::Any);
    let on = any.manager.listen_on(32000);
    assert_eq!(on[0].addr, "[::]:32000".parse().unwrap());
    assert!(on[0].v6_only);
}

/// The whole path the binary uses: a synced state (through the real conversions and
/// trackers) handed to the running set, which follows it from its own task.
#[tokio::test]
async fn the_running_set_follows_each_synced_state() {
    let port = free_port();
    let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)));
    let config = ServiceHealthConfig {
        family: IpFamily::V4,
        node_name: kpr_world::NODE.into(),
        addresses: HealthCheckAddresses::Ips(vec![LOCALHOST]),
        limits: HttpLimits::SERVICE_HEALTH,
    };
    let servers = ServiceHealthServers::start(
        config,
        health,
        Metrics::new(&mut Registry::default()),
        Arc::new(Collected::default()),
    );
    let mut world = kpr_world::World::new();
    world
        .service(
            "web",
            json!({"type": "LoadBalancer", "clusterIP": "10.96.0.1", "externalTrafficPolicy": "Local",
                   "healthCheckNodePort": port, "ports": [{"port": 80, "nodePort": 30080}]}),
        )
        .slice(
            "web",
            json!([{"port": 8080}]),
            kpr_world::eps(&["10.244.1.5 local", "10.244.2.6"]),
        );
    servers.synced(&world.state(), None);
    let reply = eventually(|| async { probe_when_listening(port).await.filter(|r| r.status == 200) }).await;
    assert_eq!(reply.body, body(&NamespacedName::new("default", "web"), 1, true));

    world.slice("web", json!([{"port": 8080}]), kpr_world::eps(&["10.244.2.6"]));
    servers.synced(&world.state(), None);
    eventually(|| async { probe_when_listening(port).await.filter(|r| r.status == 503) }).await;

    drop(servers);
    eventually(|| async { refused(port).await.then_some(()) }).await;
}

/// Polls `attempt` until it gives a value; a ceiling against hangs, not a speed check.
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(mut attempt: impl FnMut() -> F) -> T {
    for _ in 0..3000 {
        if let Some(value) = attempt().await {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never happened");
}

/// Nothing the manager keeps grows with the number of changes: rounds of Services whose
/// servers open, change their counts, move to another port, fail on a port in use (and
/// are retried), then all go, leave the sizes and the metric label sets of the warm-up
/// round.
#[tokio::test]
async fn sizes_and_metric_label_sets_come_back_after_churn() {
    /// Returns how many Services had servers midway.
    async fn round(h: &mut Harness, r: usize) -> usize {
        let names: Vec<String> = (0..3).map(|i| format!("churn-{r}-{i}")).collect();
        let ports = free_ports(names.len());
        let wanted: Vec<(&str, HealthCheck)> = names
            .iter()
            .zip(&ports)
            .map(|(name, port)| (name.as_str(), check(*port, 1)))
            .collect();
        h.apply(&wanted).await;
        let midway = h.manager.footprint().get("open").unwrap();
        // Somebody else holds the port: reported, retried by the next update. Bound before
        // the move's port is picked, so the two differ.
        let taken = std::net::TcpListener::bind((LOCALHOST, 0)).unwrap();
        let mut changed = wanted.clone();
        changed[0].1 = check(ports[0], 0);
        changed[1].1 = check(free_port(), 2);
        changed[2].1 = check(taken.local_addr().unwrap().port(), 1);
        h.apply(&changed).await;
        drop(taken);
        h.apply(&changed).await;
        h.apply(&[]).await;
        midway
    }
    fn label_sets(h: &Harness) -> std::collections::BTreeSet<String> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &h.registry).unwrap();
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' ').map(|(series, _)| series.to_string()))
            .collect()
    }

    let mut h = Harness::new();
    assert_eq!(round(&mut h, 0).await, 3, "the churn must open servers");
    let (before, labels) = (h.manager.footprint(), label_sets(&h));
    assert!(h.failures("port_in_use") > 0.0, "the churn must reach a failure");
    for r in 1..=30 {
        round(&mut h, r).await;
    }
    let after = h.manager.footprint();
    assert_eq!(before.differences(&after), [], "sizes grew with churn:\n{after}");
    assert_eq!(label_sets(&h), labels, "metric label sets changed with churn");
}
