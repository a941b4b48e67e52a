//! A workload of many changes that ends where it started, for the tests that assert that
//! no tracker, cache or metric label set grows with the number of changes (issue 12:
//! upstream's users met an EndpointSlice cache that grew to ~8 GiB, kubernetes #128928).
//!
//! Every round uses names, IPs and ports of its own, so a structure that forgets to drop an
//! entry grows by a round's worth each round instead of being refilled by the next one.
//! Within a round: dual-stack Services (ClusterIP, NodePort with ClientIP affinity,
//! LoadBalancer with `externalTrafficPolicy: Local`) and their slices of both families come,
//! their endpoints change (count up, a terminating one, a slice split in two and merged
//! back), a Service the conversions reject and a slice with a malformed address are later
//! fixed, the Node's zone label moves and comes back, a ServiceCIDR is added (slices carry
//! a trigger time, kept by the trackers until a sync); then
//! everything the round added is deleted. One Service stays throughout, its endpoints
//! changing every round and restored at its end, so what grows per change of a Service
//! that is never deleted shows too. [`Change::Sync`] marks where a proxy would sync.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kpr_model::LAST_CHANGE_TRIGGER_TIME_ANNOTATION;
use serde_json::{Value, json};

use crate::{ZONE, ep, node_object, service_object, slice_object};

/// One change as a source reports it (namespace [`crate::NAMESPACE`]; objects behind an
/// `Arc` as in the sources' events); `None`: deleted.
#[derive(Clone, Debug)]
pub enum Change {
    Service(String, Option<Arc<Service>>),
    Slice(String, Option<Arc<EndpointSlice>>),
    /// The proxy's own Node ([`crate::NODE`]).
    Node(Arc<Node>),
    ServiceCidr(String, Option<Arc<ServiceCIDR>>),
    /// A sync would run here: what came before must be handed to the backend.
    Sync,
}

/// Services per round.
const SERVICES: u16 = 3;

/// The changes of `rounds` rounds, each ending with the Node in zone [`ZONE`], no
/// ServiceCIDR and only the steady Service (`churn-steady`) and its two slices: after one
/// warm-up round (which creates the steady Service and every metric label combination the
/// workload reaches), every size must come back after each further round.
pub fn churn(first_round: u16, rounds: u16) -> Vec<Change> {
    (first_round..first_round + rounds).flat_map(round).collect()
}

fn round(r: u16) -> Vec<Change> {
    let steady = Names::steady();
    // The steady Service lives on: a structure that grows per change of a Service that
    // is never deleted (what deletion would hide) grows with it.
    let mut changes = vec![
        Change::Service(steady.service.clone(), Some(Arc::new(service(&steady, 0)))),
        slice(&steady, "v4", &steady.v4_eps(&[1, 2, 3 + r % 5])),
        slice(&steady, "v6", &steady.v6_eps(&[1, 2, 3 + r % 5])),
    ];
    for i in 0..SERVICES {
        let s = Names::new(r, i);
        changes.push(Change::Service(s.service.clone(), Some(Arc::new(service(&s, i)))));
        changes.push(slice(&s, "v4", &s.v4_eps(&[1, 2])));
        changes.push(slice(&s, "v6", &s.v6_eps(&[1, 2])));
    }
    changes.push(Change::Sync);
    for i in 0..SERVICES {
        let s = Names::new(r, i);
        // A third endpoint, one terminating, then the slice split in two and merged back.
        changes.push(slice(&s, "v4", &s.v4_eps(&[1, 2, 3])));
        changes.push(slice(
            &s,
            "v6",
            &[s.v6_eps(&[1])[0].clone(), terminating(&s.v6_ep(2))],
        ));
    }
    changes.push(Change::Sync);
    for i in 0..SERVICES {
        let s = Names::new(r, i);
        changes.push(slice(&s, "v4", &s.v4_eps(&[1])));
        changes.push(slice(&s, "v4b", &s.v4_eps(&[2, 3])));
    }
    changes.push(Change::Sync);
    for i in 0..SERVICES {
        let s = Names::new(r, i);
        changes.push(Change::Slice(s.slice("v4b"), None));
        changes.push(slice(&s, "v4", &s.v4_eps(&[1, 2])));
    }
    changes.extend(rejected_then_fixed(r));
    changes.push(Change::Node(Arc::new(node_object(Some(&format!("zone-{r}"))))));
    changes.push(Change::ServiceCidr(
        format!("churn-{r}"),
        Some(Arc::new(service_cidr(r))),
    ));
    changes.push(Change::Sync);
    changes.push(Change::Node(Arc::new(node_object(Some(ZONE)))));
    changes.push(Change::ServiceCidr(format!("churn-{r}"), None));
    for i in 0..SERVICES {
        let s = Names::new(r, i);
        changes.push(Change::Service(s.service.clone(), None));
        changes.push(Change::Slice(s.slice("v4"), None));
        changes.push(Change::Slice(s.slice("v6"), None));
    }
    changes.push(slice(&steady, "v4", &steady.v4_eps(&[1, 2])));
    changes.push(slice(&steady, "v6", &steady.v6_eps(&[1, 2])));
    changes.push(Change::Sync);
    changes
}

/// A Service whose cluster IP no conversion accepts and a slice with a malformed address,
/// both fixed a sync later and then deleted.
fn rejected_then_fixed(r: u16) -> Vec<Change> {
    let s = Names::new(r, SERVICES);
    let mut bad = service(&s, 0);
    bad.spec.as_mut().expect("a spec").cluster_ip = Some("10.96.0.999".into());
    bad.spec.as_mut().expect("a spec").cluster_ips = Some(vec!["10.96.0.999".into()]);
    let bad_slice = slice(&s, "v4", &[json!({"addresses": ["10.0.0.999"]}), s.v4_ep(1)]);
    vec![
        Change::Service(s.service.clone(), Some(Arc::new(bad))),
        bad_slice,
        Change::Sync,
        Change::Service(s.service.clone(), Some(Arc::new(service(&s, 0)))),
        slice(&s, "v4", &s.v4_eps(&[1])),
        Change::Sync,
        Change::Service(s.service.clone(), None),
        Change::Slice(s.slice("v4"), None),
    ]
}

/// The names and addresses of Service `i` of round `r`.
struct Names {
    r: u16,
    i: u16,
    service: String,
}

impl Names {
    fn new(r: u16, i: u16) -> Self {
        Self {
            r,
            i,
            service: format!("churn-{r}-{i}"),
        }
    }

    /// The Service every round keeps (`churn-steady`, 10.96.0.8 / fd00::8), its endpoints
    /// changing and coming back.
    fn steady() -> Self {
        Self {
            r: 0,
            i: 7,
            service: "churn-steady".into(),
        }
    }

    fn slice(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.service)
    }

    /// 10.96.R.I / fd00::R:I, round and index in the address so no two rounds share one.
    fn cluster_ips(&self) -> [String; 2] {
        let (hi, lo) = (self.r / 250, self.r % 250);
        [
            format!("10.{}.{lo}.{}", 96 + hi, self.i + 1),
            format!("fd00::{:x}:{:x}", self.r, self.i + 1),
        ]
    }

    fn v4_ep(&self, n: u16) -> Value {
        ep(&format!(
            "10.{}.{}.{n}{}",
            100 + self.r / 250,
            self.r % 250,
            local(n)
        ))
    }

    fn v6_ep(&self, n: u16) -> Value {
        ep(&format!("fd01::{:x}:{:x}:{n}{}", self.r, self.i, local(n)))
    }

    fn v4_eps(&self, ns: &[u16]) -> Vec<Value> {
        ns.iter().map(|&n| self.v4_ep(n + 10 * self.i)).collect()
    }

    fn v6_eps(&self, ns: &[u16]) -> Vec<Value> {
        ns.iter().map(|&n| self.v6_ep(n)).collect()
    }

    /// A port per round and Service, so NodePorts and ports do not repeat across rounds.
    fn port(&self) -> u16 {
        1000 + self.r * 4 + self.i
    }

    fn node_port(&self) -> u16 {
        30000 + (self.r * 4 + self.i) % 2767
    }
}

/// Service `i % 3`: ClusterIP, NodePort with ClientIP affinity, LoadBalancer with
/// `externalTrafficPolicy: Local` and an ingress IP.
fn service(s: &Names, i: u16) -> Service {
    let [v4, v6] = s.cluster_ips();
    let mut spec = json!({
        "clusterIP": v4, "clusterIPs": [v4, v6], "ipFamilies": ["IPv4", "IPv6"],
        "ipFamilyPolicy": "RequireDualStack",
        "ports": [{"name": "http", "port": s.port(), "targetPort": 8080}],
    });
    match i % 3 {
        0 => {}
        1 => {
            spec["type"] = json!("NodePort");
            spec["ports"][0]["nodePort"] = json!(s.node_port());
            spec["sessionAffinity"] = json!("ClientIP");
        }
        _ => {
            spec["type"] = json!("LoadBalancer");
            spec["ports"][0]["nodePort"] = json!(s.node_port());
            spec["externalTrafficPolicy"] = json!("Local");
            spec["healthCheckNodePort"] = json!(s.node_port() + 1);
            spec["status"] = json!({"loadBalancer": {"ingress": [
                {"ip": format!("192.0.2.{}", s.r % 250 + 1)},
                {"ip": format!("2001:db8::{:x}", s.r + 1)},
            ]}});
        }
    }
    service_object(&s.service, spec)
}

/// Endpoint 1 of each Service runs on this node, so Local policies find one.
fn local(n: u16) -> &'static str {
    if n % 10 == 1 { " local" } else { "" }
}

fn slice(s: &Names, suffix: &str, endpoints: &[Value]) -> Change {
    let family = if suffix.starts_with("v6") { "IPv6" } else { "IPv4" };
    let mut object = slice_object(
        &s.slice(suffix),
        &s.service,
        family,
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
        endpoints.to_vec(),
    );
    // Now, so the trackers keep it as a network-programming latency sample until a sync.
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    object.metadata.annotations = Some([(LAST_CHANGE_TRIGGER_TIME_ANNOTATION.to_string(), now)].into());
    Change::Slice(s.slice(suffix), Some(Arc::new(object)))
}

fn terminating(endpoint: &Value) -> Value {
    let mut endpoint = endpoint.clone();
    endpoint["conditions"] = json!({"ready": false, "serving": true, "terminating": true});
    endpoint
}

fn service_cidr(r: u16) -> ServiceCIDR {
    serde_json::from_value(json!({
        "metadata": {"name": format!("churn-{r}")},
        "spec": {"cidrs": [format!("10.{}.0.0/16", 200 + r % 50), format!("fd02:{:x}::/112", r)]},
    }))
    .expect("a ServiceCIDR")
}
