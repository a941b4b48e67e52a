//! Service health-check node ports, end to end: the real binary in a namespace lab, LoadBalancer
//! Services with `externalTrafficPolicy: Local` in its manifests, and a load balancer's
//! probes played by the outside client (real TCP to the node's address). Each test is one
//! thing a cloud load balancer relies on: the port says 200 exactly while this node has a
//! ready endpoint of the Service, closes with the Service, listens where
//! `nodePortAddresses` says, and a port another program holds is reported and taken over
//! once free while the other Services' ports keep answering. Deadlines are ceilings against
//! hangs, not speed checks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use kpr_netns::{NODE_IP, Netns, POD_GATEWAY, eventually, pod_ip};
use serde_json::json;
use support::*;

const OTHER_NODE: &str = "node2";

/// LoadBalancer Service `name` (TCP 80 -> 8080) with `externalTrafficPolicy: Local`, its
/// NodePort and its health-check node port.
fn local_lb(name: &str, cluster_ip: &str, node_port: u16, health_port: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  type: LoadBalancer\n  \
         clusterIP: {cluster_ip}\n  clusterIPs: [{cluster_ip}]\n  externalTrafficPolicy: Local\n  \
         healthCheckNodePort: {health_port}\n  ports:\n  - name: p\n    port: 80\n    targetPort: 8080\n    \
         protocol: TCP\n    nodePort: {node_port}\n"
    )
}

/// One endpoint of a slice: pod `pod`'s IP on `node`, with its conditions.
struct Ep {
    pod: usize,
    node: &'static str,
    ready: bool,
    terminating: bool,
}

fn ready_on(pod: usize, node: &'static str) -> Ep {
    Ep {
        pod,
        node,
        ready: true,
        terminating: false,
    }
}

/// Shutting down gracefully: still serving, no longer ready.
fn terminating_on(pod: usize, node: &'static str) -> Ep {
    Ep {
        pod,
        node,
        ready: false,
        terminating: true,
    }
}

/// The EndpointSlice of Service `name` (port 8080) with these endpoints.
fn slice_of(name: &str, endpoints: &[Ep]) -> String {
    let list: String = endpoints
        .iter()
        .map(|ep| {
            format!(
                "\n- addresses: [\"{}\"]\n  conditions: {{ready: {}, serving: true, terminating: {}}}\n  nodeName: {}",
                pod_ip(ep.pod),
                ep.ready,
                ep.terminating,
                ep.node
            )
        })
        .collect();
    let list = if list.is_empty() { " []".to_string() } else { list };
    format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-abc\n  namespace: default\n  \
         labels:\n    kubernetes.io/service-name: {name}\naddressType: IPv4\nports:\n- name: p\n  port: 8080\n  \
         protocol: TCP\nendpoints:{list}\n"
    )
}

/// One answer of a health-check port: status, headers (names lower-cased), body.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

/// A load balancer's probe: `GET /healthz` from inside `ns`, headers kept (the lab's client
/// keeps only status and body).
fn probe(ns: &Netns, addr: SocketAddr) -> std::io::Result<Answer> {
    ns.run(move || {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let request = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes())?;
        let mut raw = String::new();
        stream.read_to_string(&mut raw)?;
        parse(&raw).ok_or_else(|| std::io::Error::new(ErrorKind::InvalidData, format!("not HTTP: {raw:?}")))
    })
}

/// Enough of HTTP/1.1 for these answers (upstream's are small, with a Content-Length).
fn parse(raw: &str) -> Option<Answer> {
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Some(Answer {
        status,
        headers,
        body: body.to_string(),
    })
}

fn at_node(port: u16) -> SocketAddr {
    SocketAddr::new(NODE_IP.into(), port)
}

/// Probes from the outside client until the answer has `status`, and returns it.
fn wait_answer(cluster: &Cluster, addr: SocketAddr, status: u16) -> Answer {
    eventually(CONVERGE, POLL, || match probe(cluster.lab.client(), addr) {
        Ok(answer) if answer.status == status => Ok(answer),
        other => Err(format!("{addr}: {other:?}\n{}", cluster.proxy_logs())),
    })
}

fn assert_local_endpoints(answer: &Answer, name: &str, count: usize) {
    assert_eq!(
        answer.json(),
        json!({"service": {"namespace": "default", "name": name}, "localEndpoints": count,
               "serviceProxyHealthy": true}),
        "{answer:?}"
    );
    assert_eq!(
        answer.header("x-load-balancing-endpoint-weight"),
        Some(count.to_string().as_str())
    );
}

#[test]
fn the_health_check_port_answers_200_only_while_this_node_has_a_ready_endpoint() {
    let mut cluster = Cluster::new(2);
    cluster.tcp_backends(&[0, 1], 8080);
    let service = local_lb("lb", "10.96.0.30", 30100, 32100);
    cluster.write(
        "lb.yaml",
        &(service.clone() + &slice_of("lb", &[ready_on(0, NODE_NAME)])),
    );
    cluster.start_proxy(&[]);
    let health = at_node(32100);

    let answer = wait_answer(&cluster, health, 200);
    assert_local_endpoints(&answer, "lb", 1);
    assert_eq!(answer.header("content-type"), Some("application/json"));
    assert_eq!(answer.header("x-content-type-options"), Some("nosniff"));
    // What the load balancer then sends through this node reaches the local pod, with
    // the client's own address (Local policy: no masquerade).
    let reply = cluster
        .lab
        .client()
        .tcp_request(at_node(30100), Duration::from_secs(5))
        .unwrap();
    assert_eq!(reply, "pod0");

    let both = [ready_on(0, NODE_NAME), ready_on(1, NODE_NAME)];
    cluster.write("lb.yaml", &(service.clone() + &slice_of("lb", &both)));
    let answer = eventually(CONVERGE, POLL, || match probe(cluster.lab.client(), health) {
        Ok(a) if a.json()["localEndpoints"] == 2 => Ok(a),
        other => Err(format!("{other:?}")),
    });
    assert_eq!(answer.status, 200);
    assert_local_endpoints(&answer, "lb", 2);

    // The pods move to another node: this node must fail its probe.
    let elsewhere = [ready_on(0, OTHER_NODE), ready_on(1, OTHER_NODE)];
    cluster.write("lb.yaml", &(service.clone() + &slice_of("lb", &elsewhere)));
    assert_local_endpoints(&wait_answer(&cluster, health, 503), "lb", 0);

    cluster.write(
        "lb.yaml",
        &(service.clone() + &slice_of("lb", &[ready_on(1, NODE_NAME)])),
    );
    assert_local_endpoints(&wait_answer(&cluster, health, 200), "lb", 1);

    // Its only local pod shutting down: it still serves, but the node must be drained.
    let draining = [terminating_on(1, NODE_NAME)];
    cluster.write("lb.yaml", &(service.clone() + &slice_of("lb", &draining)));
    assert_local_endpoints(&wait_answer(&cluster, health, 503), "lb", 0);

    cluster.write(
        "lb.yaml",
        &(service.clone() + &slice_of("lb", &[ready_on(0, NODE_NAME)])),
    );
    wait_answer(&cluster, health, 200);
    // The endpoints go away altogether.
    cluster.write("lb.yaml", &(service + &slice_of("lb", &[])));
    assert_local_endpoints(&wait_answer(&cluster, health, 503), "lb", 0);

    // The Service is deleted: the port closes.
    cluster.remove("lb.yaml");
    eventually(CONVERGE, POLL, || match probe(cluster.lab.client(), health) {
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => Ok(()),
        other => Err(format!("{other:?}\n{}", cluster.proxy_logs())),
    });
}

/// Another program holds one Service's health-check port when the proxy starts: the
/// failure is logged, recorded as upstream's Event, counted, and retried at every sync; the
/// proxy takes the port as soon as it is free. Another Service's port answers throughout.
#[test]
fn a_busy_health_check_port_is_reported_and_served_once_freed_while_others_answer() {
    let mut cluster = Cluster::new(1);
    cluster.tcp_backends(&[0], 8080);
    let squatter = cluster
        .node()
        .tcp_backend(SocketAddr::new(IpAddr::from([0, 0, 0, 0]), 32101), "squatter")
        .unwrap();
    let local = [ready_on(0, NODE_NAME)];
    let busy = local_lb("busy", "10.96.0.31", 30101, 32101) + &slice_of("busy", &local);
    let fine = local_lb("fine", "10.96.0.32", 30102, 32102) + &slice_of("fine", &local);
    cluster.write("busy.yaml", &busy);
    cluster.write("fine.yaml", &fine);
    // Syncs every 2 s, so retries come quickly (upstream retries at each sync too).
    cluster.start_proxy(&["--iptables-sync-period=2s"]);

    assert_local_endpoints(&wait_answer(&cluster, at_node(32102), 200), "fine", 1);
    let failures = "kubeproxy_service_healthcheck_failures_total{ip_family=\"IPv4\",reason=\"port_in_use\"}";
    eventually(CONVERGE, POLL, || match cluster.metric(failures) {
        Some(n) if n >= 2.0 => Ok(()),
        other => Err(format!(
            "{failures} = {other:?}, want a failure and a retry\n{}",
            cluster.proxy_logs()
        )),
    });
    let logs = cluster.proxy_logs();
    assert!(
        logs.contains("failed to start health check") && logs.contains("default/busy"),
        "{logs}"
    );
    assert!(
        logs.contains("FailedToStartServiceHealthcheck")
            && logs.contains("node node1 failed to start healthcheck \"default/busy\" on port 32101"),
        "upstream's Event: {logs}"
    );
    let held = cluster
        .lab
        .client()
        .tcp_request(at_node(32101), Duration::from_secs(5))
        .unwrap();
    assert_eq!(held, "squatter", "the proxy must not steal a port in use");
    assert_eq!(probe(cluster.lab.client(), at_node(32102)).unwrap().status, 200);

    squatter.stop();
    assert_local_endpoints(&wait_answer(&cluster, at_node(32101), 200), "busy", 1);
    assert_local_endpoints(&wait_answer(&cluster, at_node(32102), 200), "fine", 1);
}

/// With `nodePortAddresses`, the health-check port listens on the node addresses inside
/// it only, as upstream's: the node IP answers, the pod-network gateway does not.
#[test]
fn node_port_addresses_limit_where_the_health_check_port_listens() {
    let mut cluster = Cluster::new(2);
    cluster.tcp_backends(&[0], 8080);
    let lb = local_lb("lb", "10.96.0.30", 30100, 32100) + &slice_of("lb", &[ready_on(0, NODE_NAME)]);
    cluster.write("lb.yaml", &lb);
    cluster.start_proxy(&["--nodeport-addresses=192.168.77.0/24"]);

    assert_local_endpoints(&wait_answer(&cluster, at_node(32100), 200), "lb", 1);
    let pod = cluster.lab.pod(1);
    assert_eq!(probe(pod, at_node(32100)).unwrap().status, 200);
    let gateway = probe(pod, SocketAddr::new(POD_GATEWAY.into(), 32100));
    assert!(
        gateway
            .as_ref()
            .is_err_and(|e| e.kind() == ErrorKind::ConnectionRefused),
        "nothing may listen outside nodePortAddresses: {gateway:?}"
    );
}
