//! The ipvs mode's objects explained: the virtual server a destination reaches, its real
//! servers with their share of new connections (weight over the weights' sum; a draining
//! real server has weight 0), persistence, and whether the address is bound to
//! `kube-ipvs0`. Pure: the IPVS table as kpr-ipvs-netlink lists it, `kube-ipvs0`'s
//! addresses and the query in, findings out.
//!
//! IPVS records no Service name: the finding names the virtual server, not the Service.

use std::net::{IpAddr, SocketAddr};

use kpr_explain::{Endpoint, EndpointGroup, Explainer, Finding, Outcome, Query, Section, Weight};
use kpr_ipvs_netlink::{Destination, FLAG_PERSISTENT, Ipvs, IpvsLinks, Protocol, Service};
use kpr_model::IpFamily;
use kpr_model::Protocol as ServiceProtocol;

/// ipvs mode's reader: the IPVS table and `kube-ipvs0`, over netlink.
#[derive(Clone, Copy, Debug, Default)]
pub struct IpvsExplainer;

impl Explainer for IpvsExplainer {
    fn looks_for(&self, _family: IpFamily) -> String {
        "kube-ipvs0".to_string()
    }

    fn explain(&self, query: &Query, _local_addresses: &[IpAddr]) -> Result<Option<Section>, String> {
        read_ipvs(query.family(), query)
    }
}

/// The heading of this mode's section.
pub fn title(family: IpFamily) -> String {
    format!("ipvs mode (IPVS, kube-ipvs0, {})", family.label())
}

/// The ipvs mode's section: `None` without `kube-ipvs0` (the mode's mark) or without IPVS.
fn read_ipvs(family: IpFamily, query: &Query) -> Result<Option<Section>, String> {
    let fail = |what: &str, e: kpr_ipvs_netlink::NetlinkError| format!("reading {what} over netlink: {e}");
    let mut links = IpvsLinks::open().map_err(|e| fail("kube-ipvs0", e))?;
    let Some(link) = links.find().map_err(|e| fail("kube-ipvs0", e))? else {
        return Ok(None);
    };
    let Some(mut ipvs) = Ipvs::open().map_err(|e| fail("the IPVS family", e))? else {
        return Ok(None);
    };
    let listed = ipvs.services().map_err(|e| fail("the IPVS virtual servers", e))?;
    let mut servers = Vec::new();
    for service in listed
        .objects
        .into_iter()
        .filter(|s| family.matches(&s.key.address))
    {
        let destinations = ipvs
            .destinations(&service.key)
            .map_err(|e| fail(&format!("the real servers of {}", service.key), e))?;
        servers.push(VirtualServer {
            service,
            destinations: destinations.objects,
        });
    }
    Ok(Some(Section {
        title: title(family),
        family,
        findings: explain(&servers, &link.addresses, query),
    }))
}

/// One virtual server with its real servers, as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VirtualServer {
    pub service: Service,
    pub destinations: Vec<Destination>,
}

/// What IPVS does with a new connection to `query`.
pub fn explain(servers: &[VirtualServer], bound: &[IpAddr], query: &Query) -> Vec<Finding> {
    let protocol = match query.protocol {
        ServiceProtocol::Tcp => Protocol::Tcp,
        ServiceProtocol::Udp => Protocol::Udp,
        ServiceProtocol::Sctp => Protocol::Sctp,
    };
    servers
        .iter()
        .filter(|s| s.service.key.protocol == protocol && s.service.key.address == query.ip)
        .filter(|s| s.service.key.port == query.port)
        .map(|server| finding(server, bound.contains(&query.ip)))
        .collect()
}

fn finding(server: &VirtualServer, bound: bool) -> Finding {
    let service = &server.service;
    let total: u64 = server.destinations.iter().map(|d| u64::from(d.weight)).sum();
    let endpoints: Vec<Endpoint> = server
        .destinations
        .iter()
        .map(|d| Endpoint {
            addr: SocketAddr::new(d.address, d.port),
            weight: Weight::Share(if total == 0 {
                0.0
            } else {
                d.weight as f64 / total as f64
            }),
            local: false,
        })
        .collect();
    let outcome = if total == 0 {
        Outcome::Rejected(
            "the virtual server has no real server with a weight: IPVS refuses new connections".into(),
        )
    } else {
        Outcome::Forwarded
    };
    let mut decisions = vec![format!("scheduler {}", service.scheduler)];
    if service.flags & FLAG_PERSISTENT != 0 {
        decisions.push(format!(
            "ClientIP affinity: persistence for {} s per client address",
            service.timeout
        ));
    }
    for draining in server.destinations.iter().filter(|d| d.weight == 0) {
        decisions.push(format!(
            "{} is draining (weight 0: no new connections; {} active, {} inactive still open)",
            draining.socket(),
            draining.active_connections,
            draining.inactive_connections
        ));
    }
    let mut objects = vec![format!(
        "IPVS virtual server {} ({})",
        service.key, service.scheduler
    )];
    if bound {
        objects.push(format!("address {} on kube-ipvs0", service.key.address));
    }
    Finding {
        destination: if bound {
            "a Service address on kube-ipvs0 (cluster, external or load-balancer IP)".into()
        } else {
            "an address of this node (NodePort, or an external IP held by another interface)".into()
        },
        service: None,
        table_wide: false,
        outcome,
        groups: vec![EndpointGroup {
            traffic: "all traffic".into(),
            endpoints,
        }],
        decisions,
        objects,
    }
}

#[cfg(test)]
mod tests {
    use kpr_ipvs_netlink::{Scheduler, ServiceKey};

    use super::*;

    fn server(real: &[(&str, u32)]) -> VirtualServer {
        let key = ServiceKey {
            protocol: Protocol::Tcp,
            address: "10.96.0.10".parse().unwrap(),
            port: 80,
        };
        let mut service = Service::new(key, Scheduler::new("rr").unwrap());
        service.flags = FLAG_PERSISTENT;
        service.timeout = 600;
        let destinations = real
            .iter()
            .map(|(addr, weight)| {
                let socket: SocketAddr = addr.parse().unwrap();
                Destination::new(socket.ip(), socket.port(), *weight)
            })
            .collect();
        VirtualServer {
            service,
            destinations,
        }
    }

    #[test]
    fn shares_follow_the_weights_and_a_draining_server_is_said() {
        let servers = [server(&[
            ("10.244.1.5:8080", 1),
            ("10.244.2.6:8080", 1),
            ("10.244.3.7:8080", 0),
        ])];
        let bound = ["10.96.0.10".parse().unwrap()];
        let findings = explain(&servers, &bound, &Query::parse("10.96.0.10:80").unwrap());
        assert_eq!(findings.len(), 1);
        let finding = &findings[0];
        assert_eq!(finding.outcome, Outcome::Forwarded);
        let shares: Vec<Weight> = finding.groups[0].endpoints.iter().map(|e| e.weight).collect();
        assert_eq!(
            shares,
            [Weight::Share(0.5), Weight::Share(0.5), Weight::Share(0.0)]
        );
        assert!(
            finding
                .decisions
                .iter()
                .any(|d| d.contains("persistence for 600 s"))
        );
        assert!(
            finding
                .decisions
                .iter()
                .any(|d| d.starts_with("10.244.3.7:8080 is draining"))
        );
        assert!(
            finding
                .objects
                .contains(&"address 10.96.0.10 on kube-ipvs0".to_string())
        );
    }

    #[test]
    fn no_weighted_real_server_is_a_refusal_and_other_ports_do_not_match() {
        let servers = [server(&[])];
        let findings = explain(&servers, &[], &Query::parse("10.96.0.10:80").unwrap());
        assert!(matches!(findings[0].outcome, Outcome::Rejected(_)));
        assert!(explain(&servers, &[], &Query::parse("10.96.0.10:81").unwrap()).is_empty());
        assert!(explain(&servers, &[], &Query::parse("10.96.0.10:80/udp").unwrap()).is_empty());
    }
}
