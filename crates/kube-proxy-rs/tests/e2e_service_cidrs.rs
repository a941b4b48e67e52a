//! ServiceCIDR objects in nftables mode, on the real kernel: traffic to an address inside a
//! Service CIDR that no Service holds is dropped, a wrong port on a cluster IP is refused,
//! and a Service created later at such an address answers. Once from manifests, once through
//! the test API server (which the proxy watches for `servicecidrs` in nftables mode only).
//!
//! The control that makes "dropped" mean something: the outside client holds the unallocated
//! addresses and answers on them ("outside"), and the node routes to it by default. So
//! before a ServiceCIDR covers them (and after it is deleted), a pod's request is answered;
//! only our drop can make it time out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kpr_netns::{Backend, Netns, eventually, pod_ip};
use serde_json::json;
use support::api::ApiCluster;
use support::*;

/// Unallocated addresses inside 10.96.0.0/16 (the client answers on them).
const FREE_A: &str = "10.96.7.7:80";
const FREE_B: &str = "10.96.7.8:80";
/// A port Service `web` does not have, on its cluster IP.
const WEB_WRONG_PORT: &str = "10.96.0.10:81";
const NFTABLES: &str = "--proxy-mode=nftables";
const SERVICE_CIDRS_PATH: &str = "/apis/networking.k8s.io/v1/servicecidrs";
/// Requests per check; each must get the same outcome.
const CHECKS: usize = 3;

/// Gives the outside client the unallocated addresses and a server on them.
fn outside_answers_on_free_addresses(client: &Netns) -> Vec<Backend> {
    [FREE_A, FREE_B]
        .iter()
        .map(|free| {
            let addr = sock(free);
            client
                .ip(&["addr", "add", &format!("{}/32", addr.ip()), "dev", "lo"])
                .unwrap();
            client.tcp_backend(addr, "outside").unwrap()
        })
        .collect()
}

/// Waits until every one of [`CHECKS`] requests from `from` to `to` gets `outcome` (a reply,
/// or `error: <kind>`).
#[track_caller]
fn wait_outcome(cluster: &Cluster, from: &Netns, to: &str, outcome: &str) {
    let want = BTreeMap::from([(outcome.to_string(), CHECKS)]);
    eventually(CONVERGE, POLL, || {
        let got = kpr_netns::spread(from, sock(to), CHECKS);
        if got == want {
            Ok(())
        } else {
            let rules = cluster.node().sh("nft list ruleset").unwrap_or_default();
            Err(format!(
                "{to}: {got:?}, want {want:?}\n{rules}\n{}",
                cluster.proxy_logs()
            ))
        }
    });
}

const DROPPED: &str = "error: timed out";
const REFUSED: &str = "error: connection refused";

// === From manifests ===

fn service_cidr_yaml(cidr: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata:\n  name: kubernetes\nspec:\n  cidrs: [{cidr}]\n"
    )
}

#[test]
fn manifests_unallocated_cluster_ips_are_dropped_until_a_service_takes_them() {
    let mut c = Cluster::new(3);
    c.tcp_backends(&[0, 1], 8080);
    let _outside = outside_answers_on_free_addresses(c.lab.client());
    c.write("web.yaml", &web_yaml(&[0], None));
    c.start_proxy(&[NFTABLES]);
    let pod = c.lab.pod(2);
    wait_outcome(&c, pod, WEB_VIP, "pod0");
    // No ServiceCIDR yet: nothing drops the free address, the client answers.
    wait_outcome(&c, pod, FREE_A, "outside");

    c.write("cidr.yaml", &service_cidr_yaml("10.96.0.0/16"));
    wait_outcome(&c, pod, FREE_A, DROPPED);
    wait_outcome(&c, pod, FREE_B, DROPPED);
    wait_outcome(&c, pod, WEB_VIP, "pod0");
    wait_outcome(&c, pod, WEB_WRONG_PORT, REFUSED);

    // A Service created at a free address answers from its endpoint.
    c.write(
        "late.yaml",
        &(service("late", "10.96.7.7", 80, 8080, "TCP", None) + &slice("late", &[1], 8080, "TCP")),
    );
    wait_outcome(&c, pod, FREE_A, "pod1");
    wait_outcome(&c, pod, FREE_B, DROPPED);

    // The ServiceCIDR deleted: the rest of the range is no longer ours to drop.
    c.remove("cidr.yaml");
    wait_outcome(&c, pod, FREE_B, "outside");
    wait_outcome(&c, pod, FREE_A, "pod1");
}

// === Through the test API server ===

/// What these tests add to the shared API lab (`support::api`).
trait ApiClusterExt {
    fn service(&self, name: &str, ip: &str, pods: &[usize]);
    fn service_cidr(&self, cidrs: &[&str]);
    fn lists_of_service_cidrs(&self) -> usize;
}

impl ApiClusterExt for ApiCluster {
    fn service(&self, name: &str, ip: &str, pods: &[usize]) {
        let service: Service = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                     "ports": [{"name": "p", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
        }))
        .unwrap();
        let endpoints: Vec<_> = pods
            .iter()
            .map(|&i| json!({"addresses": [pod_ip(i).to_string()], "conditions": {"ready": true}, "nodeName": NODE_NAME}))
            .collect();
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}-abc"), "namespace": "default",
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}],
            "endpoints": endpoints
        }))
        .unwrap();
        self.api.apply(&service).unwrap();
        self.api.apply(&slice).unwrap();
    }

    fn service_cidr(&self, cidrs: &[&str]) {
        let object: ServiceCIDR =
            serde_json::from_value(json!({"metadata": {"name": "kubernetes"}, "spec": {"cidrs": cidrs}}))
                .unwrap();
        self.api.apply(&object).unwrap();
    }

    fn lists_of_service_cidrs(&self) -> usize {
        let requests = self.api.requests();
        requests
            .iter()
            .filter(|r| r.is_list_of(SERVICE_CIDRS_PATH))
            .count()
    }
}

#[test]
fn api_service_cidrs_drop_unallocated_cluster_ips_and_follow_changes() {
    let mut c = ApiCluster::new(3);
    c.cluster.tcp_backends(&[0, 1], 8080);
    let _outside = outside_answers_on_free_addresses(c.cluster.lab.client());
    c.service("web", "10.96.0.10", &[0]);
    c.service_cidr(&["10.96.0.0/16", "fd00:96::/112"]);
    c.start_proxy(&[NFTABLES]);
    let cluster = &c.cluster;
    let pod = cluster.lab.pod(2);
    wait_outcome(cluster, pod, WEB_VIP, "pod0");
    wait_outcome(cluster, pod, FREE_A, DROPPED);
    wait_outcome(cluster, pod, WEB_WRONG_PORT, REFUSED);
    assert!(
        c.lists_of_service_cidrs() > 0,
        "nftables mode watches servicecidrs"
    );

    c.service("late", "10.96.7.7", &[1]);
    wait_outcome(cluster, pod, FREE_A, "pod1");
    wait_outcome(cluster, pod, FREE_B, DROPPED);

    c.api.delete::<ServiceCIDR>("", "kubernetes").unwrap();
    wait_outcome(cluster, pod, FREE_B, "outside");
    // Created again with another CIDR: followed as well.
    c.service_cidr(&["10.96.7.0/24"]);
    wait_outcome(cluster, pod, FREE_B, DROPPED);
    wait_outcome(cluster, pod, FREE_A, "pod1");
}

/// Upstream starts the ServiceCIDR informer for nftables mode only; an iptables-mode proxy
/// never asks for them (and needs no RBAC for them).
#[test]
fn api_iptables_mode_does_not_watch_service_cidrs() {
    let mut c = ApiCluster::new(2);
    c.cluster.tcp_backends(&[0], 8080);
    c.service("web", "10.96.0.10", &[0]);
    c.start_proxy(&["--proxy-mode=iptables"]);
    wait_outcome(&c.cluster, c.cluster.lab.pod(1), WEB_VIP, "pod0");
    let requests = c.api.requests();
    assert!(
        requests.iter().any(|r| r.is_list_of("/api/v1/services")),
        "the API source ran"
    );
    assert!(
        !requests.iter().any(|r| r.path == SERVICE_CIDRS_PATH),
        "servicecidrs were requested in iptables mode"
    );
}
