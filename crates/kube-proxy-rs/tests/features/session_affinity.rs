//! `sessionAffinity: ClientIP`, on `examples/features/session-affinity.yaml`: the outside
//! client plays a dozen clients (one address each) against three pods.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use kpr_netns::NODE_IP;
use serde_json::json;

use crate::Mode;
use crate::manifests::Manifests;
use crate::stage::Stage;
use crate::traffic::{Sender, at};

const FILE: &str = "session-affinity.yaml";
/// NodePorts: sticky (ClientIP, 3 hours), brief (ClientIP, 3 s), plain (no affinity).
const STICKY: u16 = 30130;
const BRIEF: u16 = 30131;
const PLAIN: u16 = 30132;
/// Distinct client addresses. Each lands on one of three pods at random, so all of them on
/// the same pod has odds of 3^-11.
const CLIENTS: usize = 12;
const ALL_PODS: [&str; 3] = ["pod0", "pod1", "pod2"];

// The last four are upstream's scenarios (service.go) for a Service of type ClusterIP, from
// pods, and the switch for both types; upstream's NodePort "work" and "timeout" scenarios
// are the first two. ipvs mode: see docs/upstream-e2e.md.
host_modes!(
    each_client_sticks_to_its_pod_while_clients_spread_over_the_pods,
    stickiness_ends_once_a_client_was_quiet_for_the_timeout,
    should_have_session_affinity_work_for_service_with_type_clusterip,
    should_have_session_affinity_timeout_work_for_service_with_type_clusterip,
    should_be_able_to_switch_session_affinity_for_service_with_type_clusterip,
    should_be_able_to_switch_session_affinity_for_nodeport_service,
);
// ipvs: affinity is IPVS persistence, whose template lives as long as a connection it
// placed is still in the kernel's table, and a closed TCP connection stays there (TIME_WAIT)
// for two minutes: a client quiet for the 3-second timeout keeps its pod, in upstream's ipvs
// mode as here (measured in the guest: all twelve clients kept theirs).
in_mode!(ipvs, crate::Mode::Ipvs;
    each_client_sticks_to_its_pod_while_clients_spread_over_the_pods
);

/// The pod `client` sticks to: `requests` connections, all answered, all by one pod.
#[track_caller]
fn stuck_pod(client: &Sender<'_>, to: SocketAddr, requests: usize) -> String {
    let outcome = client.requests(to, requests);
    match outcome.pods()[..] {
        [pod] if outcome.failures.is_empty() => pod.to_owned(),
        _ => panic!("{} to {to} should stick to one pod: {outcome}", client.label),
    }
}

/// Every client sticks (ten connections each, one pod each), yet the clients do not all
/// share a pod; the same client without affinity (Service plain) reaches all three pods.
fn each_client_sticks_to_its_pod_while_clients_spread_over_the_pods(mode: Mode) {
    let stage = Stage::start(mode, 3, &Manifests::example(FILE));
    let clients = stage.add_client_addresses(CLIENTS);
    let sticky = at(NODE_IP, STICKY);
    stage.client().wait_answered(sticky, 1);

    let pods: BTreeSet<String> = clients
        .iter()
        .map(|&client| stuck_pod(&stage.client_from(client), sticky, 10))
        .collect();
    assert!(pods.len() > 1, "all {CLIENTS} clients stick to {pods:?}");

    // 60 connections over three pods: one is left out by chance with odds below 10^-10.
    stage
        .client_from(clients[0])
        .wait_answered_by(at(NODE_IP, PLAIN), 60, &ALL_PODS);
}

/// brief forgets a client after 3 quiet seconds. Each client sticks, goes quiet for
/// a second longer, then sticks again, and some of them now to another pod: each picks anew (odds
/// of 1/3 to pick the same pod at random; the next pod in turn under round robin), so all
/// twelve keeping their pod has odds of 3^-12 (none under round robin).
fn stickiness_ends_once_a_client_was_quiet_for_the_timeout(mode: Mode) {
    let manifests = Manifests::example(FILE);
    let timeout = affinity_timeout(&manifests, "brief");
    let stage = Stage::start(mode, 3, &manifests);
    let clients = stage.add_client_addresses(CLIENTS);
    let brief = at(NODE_IP, BRIEF);
    stage.client().wait_answered(brief, 1);

    let stick_all = || -> Vec<(Ipv4Addr, String)> {
        clients
            .iter()
            .map(|&client| (client, stuck_pod(&stage.client_from(client), brief, 3)))
            .collect()
    };
    let before = stick_all();
    // Waiting out the timeout is the scenario, not a speed check.
    std::thread::sleep(timeout + Duration::from_secs(1));
    // One connection from another address first: under round robin (userspace mode) the
    // twelve would otherwise meet the rotation where they met it before (12 is a multiple
    // of 3) and pick their old pods again by design. Random picks are not affected.
    stage.client().wait_answered(brief, 1);
    let after = stick_all();

    let moved = before.iter().zip(&after).filter(|(b, a)| b.1 != a.1).count();
    assert!(
        moved > 0,
        "no client moved after the timeout:\nbefore {before:?}\nafter  {after:?}"
    );
}

/// Cluster IPs of sticky (ClientIP, 3 hours), brief (ClientIP, 3 s) and plain.
const STICKY_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 3, 10);
const BRIEF_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 3, 20);
const PLAIN_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 3, 30);
/// The pod the ClusterIP scenarios send from, with [`CLIENTS`] addresses.
const CLIENT_POD: usize = 3;

/// Upstream's exec pod reaches sticky's cluster IP over and over and always gets the same
/// pod. Here a dozen clients (one pod's addresses) each stick to theirs, and the same pod
/// reaches all three pods through plain, which has no affinity.
fn should_have_session_affinity_work_for_service_with_type_clusterip(mode: Mode) {
    let stage = Stage::start(mode, 4, &Manifests::example(FILE));
    let clients = stage.add_pod_addresses(CLIENT_POD, CLIENTS);
    let sticky = at(STICKY_VIP, 80);
    stage.pod(CLIENT_POD).wait_answered(sticky, 1);
    for &client in &clients {
        stuck_pod(&stage.pod_from(CLIENT_POD, client), sticky, 10);
    }
    // 60 connections over three pods: one is left out by chance with odds below 10^-10.
    stage
        .pod_from(CLIENT_POD, clients[0])
        .wait_answered_by(at(PLAIN_VIP, 80), 60, &ALL_PODS);
}

/// As [`stickiness_ends_once_a_client_was_quiet_for_the_timeout`], on brief's cluster IP
/// from pods (a dozen addresses of one pod).
fn should_have_session_affinity_timeout_work_for_service_with_type_clusterip(mode: Mode) {
    let manifests = Manifests::example(FILE);
    let timeout = affinity_timeout(&manifests, "brief");
    let stage = Stage::start(mode, 4, &manifests);
    let clients = stage.add_pod_addresses(CLIENT_POD, CLIENTS);
    let brief = at(BRIEF_VIP, 80);
    stage.pod(CLIENT_POD).wait_answered(brief, 1);
    let stick_all = || -> Vec<(Ipv4Addr, String)> {
        clients
            .iter()
            .map(|&client| (client, stuck_pod(&stage.pod_from(CLIENT_POD, client), brief, 3)))
            .collect()
    };
    let before = stick_all();
    // Waiting out the timeout is the scenario, not a speed check.
    std::thread::sleep(timeout + Duration::from_secs(1));
    // Another source first, for round robin (see the NodePort scenario).
    stage.pod(CLIENT_POD).wait_answered(brief, 1);
    let after = stick_all();
    let moved = before.iter().zip(&after).filter(|(b, a)| b.1 != a.1).count();
    assert!(
        moved > 0,
        "no client moved after the timeout:\nbefore {before:?}\nafter  {after:?}"
    );
}

/// Who sends in the switch scenarios: pod [`CLIENT_POD`] (to a cluster IP) or the outside
/// client (to a NodePort), from a source of its own or its default one.
#[derive(Clone, Copy)]
enum Side {
    Pod,
    Outside,
}

impl Side {
    fn sender(self, stage: &Stage, source: Option<Ipv4Addr>) -> Sender<'_> {
        match (self, source) {
            (Side::Pod, Some(source)) => stage.pod_from(CLIENT_POD, source),
            (Side::Pod, None) => stage.pod(CLIENT_POD),
            (Side::Outside, Some(source)) => stage.client_from(source),
            (Side::Outside, None) => stage.client(),
        }
    }

    fn addresses(self, stage: &Stage, count: usize) -> Vec<Ipv4Addr> {
        match self {
            Side::Pod => stage.add_pod_addresses(CLIENT_POD, count),
            Side::Outside => stage.add_client_addresses(count),
        }
    }
}

/// Affinity switched off and on again on sticky, a live Service: three clients stick at
/// first; without affinity one client reaches every pod; with it again, each sticks anew.
fn switch_affinity(mode: Mode, from: Side, to: SocketAddr) {
    let mut manifests = Manifests::example(FILE);
    let stage = Stage::start(mode, 4, &manifests);
    let clients = from.addresses(&stage, 3);
    from.sender(&stage, None).wait_answered(to, 1);
    for &client in &clients {
        stuck_pod(&from.sender(&stage, Some(client)), to, 10);
    }

    let spec = &mut manifests.service_mut("sticky")["spec"];
    spec["sessionAffinity"] = json!("None");
    spec.as_object_mut().unwrap().remove("sessionAffinityConfig");
    stage.apply(&manifests);
    // 60 connections over three pods: one is left out by chance with odds below 10^-10.
    from.sender(&stage, Some(clients[0]))
        .wait_answered_by(to, 60, &ALL_PODS);

    manifests.service_mut("sticky")["spec"]["sessionAffinity"] = json!("ClientIP");
    stage.apply(&manifests);
    // Ten connections on one pod: without affinity, odds of 3^-9.
    kpr_netns::eventually(crate::support::CONVERGE, crate::support::POLL, || {
        let outcome = from.sender(&stage, Some(clients[0])).requests(to, 10);
        match outcome.pods()[..] {
            [_] if outcome.failures.is_empty() => Ok(()),
            _ => Err(format!("should stick again: {outcome}")),
        }
    });
    for &client in &clients {
        stuck_pod(&from.sender(&stage, Some(client)), to, 10);
    }
}

/// Upstream's switch on a ClusterIP Service, from pods.
fn should_be_able_to_switch_session_affinity_for_service_with_type_clusterip(mode: Mode) {
    switch_affinity(mode, Side::Pod, at(STICKY_VIP, 80));
}

/// Upstream's switch on a NodePort Service, from the outside client.
fn should_be_able_to_switch_session_affinity_for_nodeport_service(mode: Mode) {
    switch_affinity(mode, Side::Outside, at(NODE_IP, STICKY));
}

/// Service `name`'s `sessionAffinityConfig.clientIP.timeoutSeconds`, as the example sets it.
fn affinity_timeout(manifests: &Manifests, name: &str) -> Duration {
    let spec = &manifests.service(name)["spec"];
    let seconds = spec["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"]
        .as_u64()
        .unwrap_or_else(|| panic!("Service {name} sets no affinity timeout: {spec}"));
    Duration::from_secs(seconds)
}
