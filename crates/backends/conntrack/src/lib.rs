//! Forgetting stale UDP conntrack entries, as every upstream proxy mode does after a sync.
//!
//! UDP has no connection to close: a client that keeps its socket (a DNS resolver, say) keeps
//! the same 5-tuple, so conntrack keeps sending its datagrams wherever the first one was DNATed,
//! even after that endpoint left the Service. Likewise datagrams sent while a Service had no
//! endpoints leave entries without DNAT that would shadow the endpoints once they appear. So
//! after each successful sync:
//! - for every UDP endpoint that stopped being used, entries DNATed to it are deleted (for each
//!   of the port's VIPs, and for its NodePort);
//! - for every UDP service port that went from no endpoints to some, entries to its VIPs and
//!   NodePort are deleted.
//!
//! [`stale_udp_flows`] decides this from the sync request alone (pure); [`ConntrackCli`] runs
//! `conntrack -D` for each flow.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::process::Command;

use kpr_model::{Endpoint, NamespacedName, Protocol, ServicePort};
use kpr_state::SyncRequest;
use kpr_tracking::{PortKey, ServiceEndpoints};

/// Conntrack entries to delete.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StaleFlow {
    /// UDP to `vip:port` that was DNATed to `endpoint`.
    ToEndpoint {
        vip: IpAddr,
        port: u16,
        endpoint: IpAddr,
    },
    /// UDP to NodePort `node_port` that was DNATed to `endpoint`.
    NodePortToEndpoint { node_port: u16, endpoint: IpAddr },
    /// Every UDP entry to `vip:port`.
    ToVip { vip: IpAddr, port: u16 },
    /// Every UDP entry to NodePort `node_port`.
    ToNodePort { node_port: u16 },
}

impl StaleFlow {
    /// The `conntrack` arguments that delete exactly these entries.
    pub fn conntrack_args(&self) -> Vec<String> {
        let mut args: Vec<String> = ["-D", "-p", "udp"].map(String::from).to_vec();
        let mut push = |flag: &str, value: String| {
            args.push(flag.to_string());
            args.push(value);
        };
        match *self {
            Self::ToEndpoint { vip, port, endpoint } => {
                push("--orig-dst", vip.to_string());
                push("--orig-port-dst", port.to_string());
                push("--dst-nat", endpoint.to_string());
            }
            Self::NodePortToEndpoint { node_port, endpoint } => {
                push("--orig-port-dst", node_port.to_string());
                push("--dst-nat", endpoint.to_string());
            }
            Self::ToVip { vip, port } => {
                push("--orig-dst", vip.to_string());
                push("--orig-port-dst", port.to_string());
            }
            Self::ToNodePort { node_port } => push("--orig-port-dst", node_port.to_string()),
        }
        args
    }
}

/// The UDP flows a sync of `request` makes stale, sorted and without repeats.
pub fn stale_udp_flows(request: &SyncRequest<'_>) -> Vec<StaleFlow> {
    let mut flows = HashSet::new();
    for change in request.endpoint_changes {
        let ports = service_ports(request, &change.service);
        for port in ports.iter().filter(|p| p.name.protocol == Protocol::Udp) {
            let key: PortKey = (port.name.port.clone(), Protocol::Udp);
            let before = used(change.previous.as_deref(), &key);
            let after = used(change.current.as_deref(), &key);
            if before.is_empty() && !after.is_empty() {
                flows.extend(to_port(port));
            }
            let still: HashSet<SocketAddr> = after.iter().map(|e| e.addr).collect();
            for gone in before.iter().filter(|e| !still.contains(&e.addr)) {
                flows.extend(to_endpoint(port, gone.addr.ip()));
            }
        }
    }
    let mut flows: Vec<_> = flows.into_iter().collect();
    flows.sort();
    flows
}

/// The service's ports now, or, for a deleted service, as they were.
fn service_ports(request: &SyncRequest<'_>, service: &NamespacedName) -> Vec<ServicePort> {
    if let Some(ports) = request.state.services.get(service) {
        return ports.to_vec();
    }
    request
        .service_changes
        .iter()
        .find(|c| &c.id == service)
        .and_then(|c| c.previous.as_deref())
        .map(<[ServicePort]>::to_vec)
        .unwrap_or_default()
}

/// Endpoints traffic could have been sent to: ready ones (terminating-but-serving ones only
/// carry traffic when nothing is ready, and then they are listed too).
fn used(endpoints: Option<&ServiceEndpoints>, key: &PortKey) -> Vec<Endpoint> {
    let Some(list) = endpoints.and_then(|e| e.get(key)) else {
        return Vec::new();
    };
    let ready: Vec<Endpoint> = list.iter().filter(|e| e.ready).cloned().collect();
    if ready.is_empty() {
        list.iter().filter(|e| e.serving).cloned().collect()
    } else {
        ready
    }
}

fn vips(port: &ServicePort) -> impl Iterator<Item = IpAddr> + '_ {
    std::iter::once(port.cluster_ip)
        .chain(port.external_ips.iter().copied())
        .chain(port.load_balancer_ips.iter().copied())
}

fn to_port(port: &ServicePort) -> Vec<StaleFlow> {
    let mut flows: Vec<_> = vips(port)
        .map(|vip| StaleFlow::ToVip { vip, port: port.port })
        .collect();
    flows.extend(
        port.node_port
            .map(|node_port| StaleFlow::ToNodePort { node_port }),
    );
    flows
}

fn to_endpoint(port: &ServicePort, endpoint: IpAddr) -> Vec<StaleFlow> {
    let mut flows: Vec<_> = vips(port)
        .map(|vip| StaleFlow::ToEndpoint {
            vip,
            port: port.port,
            endpoint,
        })
        .collect();
    flows.extend(
        port.node_port
            .map(|node_port| StaleFlow::NodePortToEndpoint { node_port, endpoint }),
    );
    flows
}

/// Deletes conntrack entries with the `conntrack` tool.
pub trait Conntrack: Send {
    /// Deletes every flow; returns one message per flow that could not be deleted.
    fn delete(&self, flows: &[StaleFlow]) -> Vec<String>;
}

/// The real `conntrack` binary, optionally behind a command prefix (`ip netns exec NAME`).
#[derive(Clone, Debug, Default)]
pub struct ConntrackCli {
    prefix: Vec<String>,
}

impl ConntrackCli {
    pub fn with_command_prefix(prefix: Vec<String>) -> Self {
        Self { prefix }
    }

    fn command(&self) -> Command {
        match self.prefix.split_first() {
            Some((first, rest)) => {
                let mut command = Command::new(first);
                command.args(rest).arg("conntrack");
                command
            }
            None => Command::new("conntrack"),
        }
    }
}

impl Conntrack for ConntrackCli {
    fn delete(&self, flows: &[StaleFlow]) -> Vec<String> {
        let mut errors = Vec::new();
        for flow in flows {
            let args = flow.conntrack_args();
            match self.command().args(&args).env("LC_ALL", "C").output() {
                // Exit 1 with "0 flow entries have been deleted" only means there was nothing.
                Ok(out)
                    if out.status.success()
                        || String::from_utf8_lossy(&out.stderr).contains("0 flow entries") =>
                {
                    tracing::debug!(?flow, "deleted stale UDP conntrack entries");
                }
                Ok(out) => errors.push(format!(
                    "conntrack {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                )),
                Err(error) => errors.push(format!("conntrack {}: {error}", args.join(" "))),
            }
        }
        errors
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kpr_model::IpFamily;
    use kpr_state::PendingSync;
    use kpr_tracking::{EndpointsTracker, ServiceTracker};
    use serde_json::json;

    use super::*;

    struct World {
        services: ServiceTracker,
        endpoints: EndpointsTracker,
    }

    impl World {
        fn new(protocol: &str, node_port: Option<u16>) -> Self {
            let mut services = ServiceTracker::new(IpFamily::V4);
            let mut spec = json!({"type": "ClusterIP", "clusterIP": "10.96.0.53", "externalIPs": ["192.0.2.9"],
                "ports": [{"name": "dns", "port": 53, "protocol": protocol}]});
            if let Some(p) = node_port {
                spec["type"] = json!("NodePort");
                spec["ports"][0]["nodePort"] = json!(p);
            }
            let svc: Service = serde_json::from_value(
                json!({"metadata": {"name": "dns", "namespace": "default"}, "spec": spec}),
            )
            .unwrap();
            services
                .update(NamespacedName::new("default", "dns"), Some(&svc))
                .unwrap();
            let mut world = Self {
                services,
                endpoints: EndpointsTracker::new(IpFamily::V4, "node1"),
            };
            world.slice(protocol, &[]);
            world.take();
            world
        }

        fn slice(&mut self, protocol: &str, ips: &[&str]) {
            let endpoints: Vec<_> = ips.iter().map(|ip| json!({"addresses": [ip]})).collect();
            let slice: EndpointSlice = serde_json::from_value(json!({
                "metadata": {"name": "dns-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "dns"}},
                "addressType": "IPv4", "ports": [{"name": "dns", "port": 5353, "protocol": protocol}],
                "endpoints": endpoints}))
            .unwrap();
            self.endpoints
                .update(NamespacedName::new("default", "dns-1"), Some(&slice))
                .unwrap();
        }

        fn take(&mut self) -> Vec<StaleFlow> {
            let pending = PendingSync::new(self.services.take(), self.endpoints.take(), Arc::default());
            stale_udp_flows(&pending.request(false))
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn first_endpoints_clear_flows_to_the_vips_and_node_port() {
        let mut w = World::new("UDP", Some(30053));
        w.slice("UDP", &["10.244.1.10"]);
        let flows: BTreeSet<_> = w.take().into_iter().collect();
        let want = BTreeSet::from([
            StaleFlow::ToVip {
                vip: ip("10.96.0.53"),
                port: 53,
            },
            StaleFlow::ToVip {
                vip: ip("192.0.2.9"),
                port: 53,
            },
            StaleFlow::ToNodePort { node_port: 30053 },
        ]);
        assert_eq!(flows, want);
    }

    #[test]
    fn removed_endpoints_clear_only_their_own_flows() {
        let mut w = World::new("UDP", None);
        w.slice("UDP", &["10.244.1.10", "10.244.1.11"]);
        w.take();
        w.slice("UDP", &["10.244.1.11", "10.244.1.12"]);
        let flows = w.take();
        assert_eq!(
            flows,
            [
                StaleFlow::ToEndpoint {
                    vip: ip("10.96.0.53"),
                    port: 53,
                    endpoint: ip("10.244.1.10")
                },
                StaleFlow::ToEndpoint {
                    vip: ip("192.0.2.9"),
                    port: 53,
                    endpoint: ip("10.244.1.10")
                },
            ]
        );
        assert_eq!(
            flows[0].conntrack_args().join(" "),
            "-D -p udp --orig-dst 10.96.0.53 --orig-port-dst 53 --dst-nat 10.244.1.10"
        );
    }

    #[test]
    fn tcp_services_and_unchanged_endpoints_clear_nothing() {
        let mut w = World::new("TCP", Some(30053));
        w.slice("TCP", &["10.244.1.10"]);
        assert!(w.take().is_empty());
        w.slice("TCP", &[]);
        assert!(w.take().is_empty());

        let mut udp = World::new("UDP", None);
        udp.slice("UDP", &["10.244.1.10"]);
        udp.take();
        udp.slice("UDP", &["10.244.1.10"]);
        assert!(udp.take().is_empty());
    }
}
