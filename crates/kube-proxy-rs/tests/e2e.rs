//! kube-proxy-rs end to end on the real kernel: a node, pods and an outside client in network
//! namespaces this test creates, the real binary in the node, manifests it watches, and real
//! TCP/UDP through the Service VIPs. Deadlines are ceilings against hangs, not speed checks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::ErrorKind;
use std::time::{Duration, Instant};

use kpr_netns::{CLIENT_IP, NODE_IP, POD_GATEWAY, eventually, spread_udp};
use support::*;

fn web_cluster(pods: &[usize], total_pods: usize, node_port: Option<u16>) -> Cluster {
    let mut cluster = Cluster::new(total_pods);
    cluster.tcp_backends(pods, 8080);
    cluster.write("web.yaml", &web_yaml(pods, node_port));
    cluster
}

/// Service `dns` on 10.96.0.53:53 (UDP, target port 5353) and its slice with `pods`.
#[test]
fn cluster_ip_spreads_fairly_from_a_pod_and_from_the_node() {
    // Pod 3 is a client only; pods 0-2 serve.
    let mut cluster = web_cluster(&[0, 1, 2], 4, None);
    cluster.start_proxy(&[]);
    let all = ["pod0", "pod1", "pod2"];
    let from_pod = wait_spread(cluster.lab.pod(3), sock(WEB_VIP), 300, &all);
    assert_fair(&from_pod);
    let from_node = wait_spread(cluster.node(), sock(WEB_VIP), 300, &all);
    assert_fair(&from_node);
}

#[test]
fn a_pod_reaches_itself_through_its_service_masqueraded() {
    let mut cluster = web_cluster(&[0], 1, None);
    cluster.start_proxy(&[]);
    // Hairpin: without SNAT the reply would go pod -> pod directly and the client would
    // drop it, so the request would time out instead of being answered.
    wait_spread(cluster.lab.pod(0), sock(WEB_VIP), 20, &["pod0"]);
    let sources: std::collections::BTreeSet<_> = cluster.backend_peers().iter().map(|p| p.ip()).collect();
    assert_eq!(
        sources,
        [std::net::IpAddr::from(POD_GATEWAY)].into(),
        "hairpin traffic not masqueraded"
    );
}

#[test]
fn node_port_spreads_from_the_outside_client() {
    let mut cluster = web_cluster(&[0, 1, 2], 3, Some(30080));
    cluster.start_proxy(&[]);
    let node_port = std::net::SocketAddr::new(NODE_IP.into(), 30080);
    let counts = wait_spread(cluster.lab.client(), node_port, 300, &["pod0", "pod1", "pod2"]);
    assert_fair(&counts);
    // Masqueraded (externalTrafficPolicy Cluster): the pods see the node's bridge address,
    // not the client, so replies return through the node.
    let sources: std::collections::BTreeSet<_> = cluster.backend_peers().iter().map(|p| p.ip()).collect();
    assert!(
        !sources.contains(&std::net::IpAddr::from(CLIENT_IP)),
        "{sources:?}"
    );
    assert!(
        sources.contains(&std::net::IpAddr::from(POD_GATEWAY)),
        "{sources:?}"
    );
}

#[test]
fn udp_cluster_ip_spreads_over_its_pods() {
    let mut cluster = Cluster::new(3);
    cluster.udp_backends(&[0, 1], 5353);
    cluster.write("dns.yaml", &dns_yaml(&[0, 1]));
    cluster.start_proxy(&[]);
    let counts = eventually(CONVERGE, POLL, || {
        let counts = spread_udp(cluster.lab.pod(2), sock("10.96.0.53:53"), 200);
        let keys: Vec<&str> = counts.keys().map(String::as_str).collect();
        (keys == ["pod0", "pod1"])
            .then_some(counts.clone())
            .ok_or(format!("{counts:?}"))
    });
    assert_fair(&counts);
}

#[test]
fn a_service_whose_endpoints_all_go_away_is_refused_at_once() {
    let mut cluster = web_cluster(&[0], 2, None);
    cluster.start_proxy(&[]);
    wait_spread(cluster.lab.pod(1), sock(WEB_VIP), 10, &["pod0"]);

    cluster.write("web.yaml", &web_yaml(&[], None));
    let pod = cluster.lab.pod(1);
    eventually(CONVERGE, POLL, || {
        let started = Instant::now();
        match pod.tcp_request(sock(WEB_VIP), Duration::from_secs(5)) {
            // REJECT answers at once; a timeout would take the full 5 s.
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => Ok(started.elapsed()),
            other => Err(format!("{other:?}")),
        }
    });
    let rules = cluster.iptables_save();
    assert!(rules.contains("default/web:p has no endpoints"), "{rules}");
}

#[test]
fn editing_a_manifest_moves_traffic_without_a_restart() {
    let mut cluster = web_cluster(&[0], 4, None);
    cluster.tcp_backends(&[1, 2], 8080);
    cluster.start_proxy(&[]);
    let client = cluster.lab.pod(3);
    wait_spread(client, sock(WEB_VIP), 30, &["pod0"]);
    let pid = cluster.proxy.as_ref().unwrap().pid();

    cluster.write("web.yaml", &web_yaml(&[0, 1, 2], None));
    let counts = wait_spread(client, sock(WEB_VIP), 300, &["pod0", "pod1", "pod2"]);
    assert_fair(&counts);

    cluster.write("web.yaml", &web_yaml(&[2], None));
    wait_spread(client, sock(WEB_VIP), 30, &["pod2"]);
    assert_eq!(
        cluster.proxy.as_ref().unwrap().pid(),
        pid,
        "same process throughout"
    );
}

#[test]
fn an_invalid_manifest_next_to_valid_ones_leaves_them_working() {
    let mut cluster = web_cluster(&[0, 1], 3, None);
    // A Service with an impossible cluster IP, and a file that is not YAML at all.
    cluster.write(
        "bad-ip.yaml",
        &service("broken", "10.96.0.999", 80, 8080, "TCP", None),
    );
    cluster.write(
        "garbage.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: [unclosed\n",
    );
    cluster.start_proxy(&[]);
    wait_spread(cluster.lab.pod(2), sock(WEB_VIP), 50, &["pod0", "pod1"]);

    let rejected = eventually(CONVERGE, POLL, || {
        let (_, body) = cluster.get(METRICS, "/metrics").map_err(|e| e.to_string())?;
        let lines: Vec<String> = body
            .lines()
            .filter(|l| l.starts_with("kubeproxy_rejected_objects_total{"))
            .map(str::to_string)
            .collect();
        if lines.len() >= 2 { Ok(lines) } else { Err(body) }
    });
    assert!(
        rejected
            .iter()
            .any(|l| l.contains("kind=\"Service\"") && l.contains("invalid_ip")),
        "{rejected:?}"
    );
    assert!(
        rejected.iter().any(|l| l.contains("kind=\"Manifest\"")),
        "{rejected:?}"
    );
    let logs = cluster.proxy_logs();
    assert!(
        logs.contains("default/broken") && logs.contains("clusterIP"),
        "{logs}"
    );

    // A later valid service still gets programmed while the bad files stay.
    cluster.tcp_backends(&[2], 9090);
    let api = service("api", "10.96.0.20", 90, 9090, "TCP", None) + &slice("api", &[2], 9090, "TCP");
    cluster.write("api.yaml", &api);
    wait_spread(cluster.lab.pod(0), sock("10.96.0.20:90"), 10, &["pod2"]);
}

#[test]
fn cleanup_removes_every_kube_chain_and_rule() {
    let mut cluster = web_cluster(&[0], 1, Some(30080));
    cluster
        .node()
        .sh("iptables -t filter -N USER-CHAIN && iptables -A USER-CHAIN -j ACCEPT")
        .unwrap();
    cluster.start_proxy(&[]);
    wait_spread(cluster.node(), sock(WEB_VIP), 5, &["pod0"]);
    assert!(cluster.iptables_save().contains("KUBE-SVC-"));
    cluster.proxy.take().unwrap().stop().unwrap();

    let status = cluster
        .node()
        .command(proxy_binary())
        .arg("--cleanup")
        .status()
        .unwrap();
    assert!(status.success());
    let after = cluster.iptables_save() + &cluster.node().sh("iptables-legacy-save").unwrap();
    assert!(!after.contains("KUBE-"), "left behind:\n{after}");
    assert!(
        after.contains("-A USER-CHAIN -j ACCEPT"),
        "cleanup touched a foreign chain:\n{after}"
    );
}

#[test]
fn health_turns_503_while_syncs_fail_and_recovers() {
    let mut cluster = web_cluster(&[0], 2, None);
    cluster.start_proxy(&["--iptables-sync-period=2s"]);
    wait_spread(cluster.lab.pod(1), sock(WEB_VIP), 5, &["pod0"]);
    let svc_chain = cluster.first_service_chain();

    // Someone else's rule jumps to our chain, so deleting the service cannot delete it.
    cluster.hold_chain(&svc_chain);
    cluster.remove("web.yaml");
    let body = cluster.wait_healthz(503);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_ne!(json["lastUpdated"], json["currentTime"], "{body}");
    assert!(
        json["problem"].as_str().unwrap_or_default().contains("restore"),
        "a late 503 says why: {body}"
    );
    let failures =
        cluster.metric("kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family=\"IPv4\"}");
    assert!(failures.unwrap_or(0.0) >= 1.0, "restore failures: {failures:?}");

    cluster.release_chain();
    cluster.wait_healthz(200);
    let rules = cluster.iptables_save();
    assert!(!rules.contains(&svc_chain), "{svc_chain} still there:\n{rules}");
}

/// `/metrics`, `/metrics/slis` and `/proxyMode` on the metrics port, as upstream serves them.
#[test]
fn metrics_and_proxy_mode_answer_on_the_metrics_port() {
    let mut cluster = web_cluster(&[0], 1, None);
    cluster.start_proxy(&[]);
    let (status, mode) = cluster.get(METRICS, "/proxyMode").unwrap();
    assert_eq!((status, mode.as_str()), (200, "iptables"));
    let (_, body) = cluster.get(METRICS, "/metrics").unwrap();
    for name in [
        "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        "kubeproxy_sync_proxy_rules_iptables_total",
        "kubeproxy_sync_proxy_rules_service_changes_total",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total",
    ] {
        assert!(body.contains(name), "{name} missing:\n{body}");
    }
    let (status, livez) = cluster.get(HEALTHZ, "/livez").unwrap();
    assert_eq!(status, 200, "{livez}");

    // Upstream's text format 0.0.4 unless OpenMetrics is asked for; the health-check SLIs
    // on /metrics/slis.
    let (status, content_type, body) = http(&cluster, "GET", "/metrics", &[]);
    assert_eq!(status, 200, "{body}");
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    for line in [
        "# TYPE kubeproxy_sync_proxy_rules_endpoint_changes_total counter",
        "# HELP kubeproxy_sync_proxy_rules_duration_seconds [ALPHA] SyncProxyRules latency in seconds",
        "# TYPE kubeproxy_sync_proxy_rules_iptables_total gauge",
    ] {
        assert!(body.lines().any(|l| l == line), "{line:?} missing:\n{body}");
    }
    assert!(!body.contains("# EOF") && !body.contains("_created"), "{body}");

    let (_, content_type, body) = http(
        &cluster,
        "GET",
        "/metrics",
        &["Accept: application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3"],
    );
    assert_eq!(
        content_type,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");

    for _ in 0..3 {
        assert_eq!(cluster.get(METRICS, "/healthz").unwrap(), (200, "ok".to_string()));
    }
    let (status, content_type, slis) = http(&cluster, "GET", "/metrics/slis", &[]);
    assert_eq!(
        (status, content_type.as_str()),
        (200, "text/plain; version=0.0.4; charset=utf-8")
    );
    assert!(
        slis.contains("kubernetes_healthchecks_total{name=\"ping\",status=\"success\",type=\"healthz\"} 3\n"),
        "{slis}"
    );
    let (status, _, reset) = http(&cluster, "DELETE", "/metrics/slis", &[]);
    assert_eq!((status, reset.as_str()), (200, "metrics reset\n"));
    assert_eq!(http(&cluster, "GET", "/metrics/slis", &[]).2, "");
}

/// One HTTP/1.1 request from the node namespace, with extra header lines: status, the
/// `Content-Type` and the body (answers here carry a Content-Length, never chunks).
fn http(cluster: &Cluster, method: &str, path: &str, headers: &[&str]) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {METRICS}\r\nConnection: close\r\n");
    for header in headers {
        request.push_str(header);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    let raw = cluster.node().run(move || {
        let mut stream = std::net::TcpStream::connect(METRICS).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).unwrap();
        raw
    });
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let content_type = head
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-type"))
        .map(|(_, value)| value.trim().to_string())
        .unwrap_or_default();
    (status, content_type, body.to_string())
}

#[test]
fn bad_flags_exit_2_with_a_clear_message() {
    let out = std::process::Command::new(proxy_binary())
        .args(["--proxy-mode=bogus", "--manifests=/nonexistent"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bogus"), "{stderr}");

    let out = std::process::Command::new(proxy_binary())
        .args(["--iptables-masquerade-bit=40", "--manifests=/nonexistent"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("masquerade"));
}

#[test]
fn dry_run_prints_the_ruleset_and_programs_nothing() {
    let cluster = web_cluster(&[0, 1, 2], 3, Some(30080));
    let all = cluster.dry_run();
    // One section per IP family the node runs, each under a line saying which it is.
    let (v4, v6) = all
        .strip_prefix("# IPv4 rules (iptables-restore input)\n")
        .and_then(|rest| rest.split_once("# IPv6 rules (ip6tables-restore input)\n"))
        .unwrap_or_else(|| panic!("not an IPv4 then an IPv6 section:\n{all}"));
    let text = v4;
    assert!(text.starts_with("*filter\n"), "{text}");
    assert!(text.contains("--probability 0.3333333333"), "{text}");
    assert!(text.contains("-A KUBE-NODEPORTS"), "{text}");
    assert!(text.trim_end().ends_with("COMMIT"), "{text}");
    assert!(
        v6.starts_with("*filter\n") && v6.trim_end().ends_with("COMMIT"),
        "{v6}"
    );
    assert!(
        !v6.contains("10.96.0.10"),
        "an IPv4 Service in the IPv6 rules:\n{v6}"
    );
    let rules = cluster.iptables_save();
    assert!(
        !rules.contains("KUBE-"),
        "dry run programmed the kernel:\n{rules}"
    );
}

#[test]
fn sigterm_exits_0_and_leaves_the_rules_serving() {
    let mut cluster = web_cluster(&[0], 2, None);
    cluster.start_proxy(&[]);
    wait_spread(cluster.lab.pod(1), sock(WEB_VIP), 5, &["pod0"]);
    let status = cluster.proxy.take().unwrap().stop().unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
    // Upstream leaves the rules on exit so a restart does not interrupt traffic.
    wait_spread(cluster.lab.pod(1), sock(WEB_VIP), 5, &["pod0"]);
}

#[test]
fn a_udp_flow_moves_when_its_endpoint_leaves_the_service() {
    assert_a_udp_flow_moves_off_a_removed_pod(&[]);
}

#[test]
fn conntrack_flags_set_the_nodes_conntrack_timeouts() {
    let mut cluster = web_cluster(&[0], 1, None);
    cluster.start_proxy(&[
        "--conntrack-tcp-timeout-established=12345s",
        "--conntrack-tcp-timeout-close-wait=1m",
    ]);
    let node = cluster.node();
    assert_eq!(
        node.sysctl("net.netfilter.nf_conntrack_tcp_timeout_established")
            .unwrap(),
        "12345"
    );
    assert_eq!(
        node.sysctl("net.netfilter.nf_conntrack_tcp_timeout_close_wait")
            .unwrap(),
        "60"
    );
}

/// Go's `time.Time` String(), as upstream prints it: "2024-05-01 12:34:56.789 +0000 UTC m=+1.000000000".
fn is_go_time(text: &str) -> bool {
    let fields: Vec<&str> = text.split(' ').collect();
    let [date, time, offset, zone, monotonic] = fields[..] else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (whole, fraction) = time.split_once('.').unwrap_or((time, "1"));
    let monotonic = monotonic.strip_prefix("m=+").unwrap_or_default();
    date.split('-').map(digits).eq([true; 3])
        && whole.split(':').map(digits).eq([true; 3])
        && digits(fraction)
        && (offset.starts_with('+') || offset.starts_with('-'))
        && digits(&offset[1..])
        && offset.len() == 5
        && !zone.is_empty()
        && monotonic
            .split_once('.')
            .is_some_and(|(s, n)| digits(s) && digits(n) && n.len() == 9)
}

#[test]
fn healthz_and_livez_answer_with_upstreams_bodies_and_counters() {
    let mut cluster = web_cluster(&[0], 1, None);
    cluster.start_proxy(&[]);
    let (status, body) = cluster.get(HEALTHZ, "/healthz").unwrap();
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let now = json["currentTime"].as_str().unwrap();
    assert!(is_go_time(now), "{body}");
    // Healthy: lastUpdated is the current time, as upstream answers; upstream's exact layout.
    assert_eq!(
        body,
        format!("{{\"lastUpdated\": \"{now}\",\"currentTime\": \"{now}\", \"nodeEligible\": true}}")
    );
    let (status, body) = cluster.get(HEALTHZ, "/livez").unwrap();
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let now = json["currentTime"].as_str().unwrap();
    assert_eq!(
        body,
        format!("{{\"lastUpdated\": \"{now}\",\"currentTime\": \"{now}\"}}")
    );
    let healthz = cluster.metric("kubeproxy_proxy_healthz_total{code=\"200\"}");
    assert!(healthz.unwrap_or(0.0) >= 1.0, "{healthz:?}");
    let livez = cluster.metric("kubeproxy_proxy_livez_total{code=\"200\"}");
    assert!(livez.unwrap_or(0.0) >= 1.0, "{livez:?}");
}

/// Listeners holding the healthz and metrics ports in the node namespace, as another
/// program (an old proxy still shutting down) would.
fn hold_ports(cluster: &Cluster, addresses: &[&str]) -> Vec<std::net::TcpListener> {
    cluster.node().run(|| {
        addresses
            .iter()
            .map(|a| std::net::TcpListener::bind(a).unwrap())
            .collect()
    })
}

#[test]
fn busy_healthz_and_metrics_ports_are_retried_until_free() {
    let mut cluster = web_cluster(&[0], 2, None);
    let holders = hold_ports(&cluster, &[HEALTHZ, METRICS]);
    cluster.spawn_proxy(&[], true);
    // The proxy does its job meanwhile.
    wait_spread(cluster.lab.pod(1), sock(WEB_VIP), 5, &["pod0"]);
    // Every attempt is logged; upstream retries every 5 s, so two of each take a while.
    eventually(CONVERGE, POLL, || {
        let logs = cluster.proxy_logs();
        let attempts = |address: &str| logs.matches(&format!("cannot listen on {address}")).count();
        (attempts(HEALTHZ) >= 2 && attempts(METRICS) >= 2)
            .then_some(())
            .ok_or(logs.clone())
    });
    drop(holders);
    cluster.wait_healthz(200);
    eventually(CONVERGE, POLL, || match cluster.get(METRICS, "/proxyMode") {
        Ok((200, mode)) if mode == "iptables" => Ok(()),
        other => Err(format!("{other:?}")),
    });
    let running = cluster.proxy.as_mut().unwrap().try_wait().unwrap();
    assert_eq!(running, None, "the proxy exited");
}

#[test]
fn a_busy_port_with_bind_address_hard_fail_exits_1_naming_it() {
    let mut cluster = web_cluster(&[0], 1, None);
    let _holder = hold_ports(&cluster, &[HEALTHZ]);
    cluster.spawn_proxy(&["--bind-address-hard-fail"], true);
    let status = eventually(CONVERGE, POLL, || {
        let proxy = cluster.proxy.as_mut().unwrap();
        proxy
            .try_wait()
            .unwrap()
            .ok_or_else(|| "still running".to_string())
    });
    assert_eq!(status.code(), Some(1), "{}", cluster.proxy_logs());
    let logs = cluster.proxy_logs();
    assert!(logs.contains(&format!("cannot listen on {HEALTHZ}")), "{logs}");
}

/// Where `name` is on this machine's PATH; the test fails (never skips) when it is missing.
fn installed(name: &str) -> std::path::PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.exists())
        .unwrap_or_else(|| panic!("{name} is not installed (scripts/ensure-packages installs it)"))
}

/// `kube-proxy-rs --cleanup` in the node namespace with only `path` to find programs in.
fn cleanup_with_path(cluster: &Cluster, path: &std::path::Path) -> std::process::Output {
    cluster.node().run(|| {
        std::process::Command::new(proxy_binary())
            .arg("--cleanup")
            .env("PATH", path)
            .output()
            .unwrap()
    })
}

#[test]
fn cleanup_without_the_iptables_tools_fails_and_names_them() {
    let cluster = Cluster::new(1);
    let empty = tempfile::tempdir().unwrap();
    let out = cleanup_with_path(&cluster, empty.path());
    let logs = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{logs}");
    for tool in [
        "iptables-legacy-save",
        "iptables-nft-save",
        "ip6tables-legacy-save",
        "ip6tables-nft-save",
    ] {
        assert!(logs.contains(tool), "{tool} not named:\n{logs}");
    }
}

#[test]
fn cleanup_with_only_the_nft_tools_cleans_them_and_names_the_missing_legacy_ones() {
    let cluster = Cluster::new(1);
    let node = cluster.node();
    node.sh(
        "iptables-nft -t nat -N KUBE-SERVICES && \
         iptables-nft -t nat -A PREROUTING -m comment --comment 'kubernetes service portals' -j KUBE-SERVICES",
    )
    .unwrap();
    let tools = tempfile::tempdir().unwrap();
    for family in ["iptables", "ip6tables"] {
        for suffix in ["", "-save", "-restore"] {
            let name = format!("{family}-nft{suffix}");
            std::os::unix::fs::symlink(installed(&name), tools.path().join(&name)).unwrap();
        }
    }
    let out = cleanup_with_path(&cluster, tools.path());
    let logs = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{logs}");
    assert!(
        logs.contains("iptables-legacy-save"),
        "the skipped flavour is not named:\n{logs}"
    );
    let after = node.sh("iptables-nft-save").unwrap();
    assert!(!after.contains("KUBE-"), "left behind:\n{after}");
}
