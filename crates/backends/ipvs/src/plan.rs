//! The pure decision of one sync: the desired state of one family in, the IPVS virtual
//! servers with their real servers, the addresses bound to `kube-ipvs0` and the ipset
//! members out. `UPSTREAM.md` §2-§3 is the specification, case by case.
//!
//! Two places differ from the iptables and nftables modes on purpose, because upstream's
//! ipvs mode does: a Local policy without a local endpoint falls back to the cluster's
//! endpoints instead of dropping (only a cluster IP of an `internalTrafficPolicy: Local`
//! Service that is not externally reachable ends up with no real server), and a Service
//! without endpoints keeps its virtual servers, with no real server (the kernel then
//! refuses new connections), instead of a REJECT rule.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use kpr_ipvs_netlink::{FLAG_MH_PORT, FLAG_PERSISTENT, Scheduler, Service, ServiceKey};
use kpr_model::{IpFamily, NamespacedName, Protocol, ServicePort, ServicePortName};
use kpr_state::{Categorized, DesiredState, PortPlan, Unreachable};

use crate::ipset::{Family, Member, Sets};
use crate::sets::SetId;

/// What the plan needs besides the desired state: the scheduler and this host's
/// addresses, read by the caller.
#[derive(Clone, Copy, Debug)]
pub struct PlanInputs<'a> {
    pub family: IpFamily,
    pub scheduler: &'a Scheduler,
    /// The addresses NodePorts are served on (`UPSTREAM.md` §3.1); none leaves NodePorts
    /// (and health-check ports) out.
    pub node_port_addresses: &'a [IpAddr],
    /// This family's addresses on interfaces other than `kube-ipvs0`: an external or
    /// load-balancer IP found there is served but not bound.
    pub other_interface_addresses: &'a BTreeSet<IpAddr>,
    /// The family's primary node IP: a load balancer's source ranges that contain it let
    /// the node itself reach the load-balancer IP.
    pub node_ip: Option<IpAddr>,
}

/// One virtual server and the real servers it should have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VirtualServer {
    pub service: Service,
    pub real_servers: BTreeSet<SocketAddr>,
    /// The Service port it serves (the first one, by name, when two claim the same address,
    /// port and protocol).
    pub owner: ServicePortName,
}

/// Everything one family's sync should leave in the kernel, apart from the fixed rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpvsPlan {
    pub virtual_servers: BTreeMap<ServiceKey, VirtualServer>,
    /// Addresses bound to `kube-ipvs0`.
    pub bound: BTreeSet<IpAddr>,
    /// Every one of the mode's sets, declared even when empty.
    pub sets: Sets,
    /// Load-balancer IPs whose source ranges leave the node out: the node's own traffic to
    /// them is dropped (`KUBE-IPVS-OUT-FILTER`).
    pub out_filter: BTreeSet<ServiceKey>,
    /// Services with a Local policy, endpoints, and none of them on this node
    /// (`sync_proxy_rules_no_local_endpoints_total`): counted per Service, as upstream's
    /// ipvs mode does, while its virtual servers fall back to the cluster's endpoints.
    pub no_local_internal: BTreeSet<NamespacedName>,
    pub no_local_external: BTreeSet<NamespacedName>,
}

/// The plan for `state`, one family's desired state.
pub fn plan(state: &DesiredState, inputs: &PlanInputs<'_>) -> IpvsPlan {
    let family = set_family(inputs.family);
    let mut sets = Sets::default();
    for id in SetId::ALL {
        sets.declare(id.spec(family));
    }
    let mut builder = Builder {
        inputs,
        family,
        plan: IpvsPlan {
            virtual_servers: BTreeMap::new(),
            bound: BTreeSet::new(),
            sets,
            out_filter: BTreeSet::new(),
            no_local_internal: BTreeSet::new(),
            no_local_external: BTreeSet::new(),
        },
    };
    for port in state.ports() {
        builder.add_port(port, state.endpoints(port), &state.plan(port));
    }
    let bound: Vec<IpAddr> = builder.plan.bound.iter().copied().collect();
    for ip in bound {
        builder.member(SetId::IpvsIps, Member::Ip(ip));
    }
    builder.plan
}

pub(crate) fn set_family(family: IpFamily) -> Family {
    match family {
        IpFamily::V4 => Family::V4,
        IpFamily::V6 => Family::V6,
    }
}

struct Builder<'a> {
    inputs: &'a PlanInputs<'a>,
    family: Family,
    plan: IpvsPlan,
}

/// The real servers of one kind of virtual server: `UPSTREAM.md` §2.
fn real_servers(categorized: &Categorized<'_>, only_local: bool) -> BTreeSet<SocketAddr> {
    let chosen = if only_local && !categorized.local.is_empty() {
        &categorized.local
    } else {
        &categorized.cluster
    };
    chosen.iter().map(|endpoint| endpoint.addr).collect()
}

impl Builder<'_> {
    fn add_port(&mut self, port: &ServicePort, endpoints: &[kpr_model::Endpoint], port_plan: &PortPlan<'_>) {
        let categorized = &port_plan.endpoints;
        let protocol = port.name.protocol;
        for endpoint in endpoints.iter().filter(|endpoint| endpoint.is_local) {
            let (ip, target) = (endpoint.addr.ip(), endpoint.addr.port());
            self.member(SetId::LoopBack, Member::IpPortIp(ip, protocol, target, ip));
        }
        let internal = real_servers(categorized, port.internal_policy_local);
        let external = real_servers(categorized, port.external_policy_local);
        self.count_no_local(port_plan);

        self.member(
            SetId::ClusterIp,
            Member::IpPort(port.cluster_ip, protocol, port.port),
        );
        self.virtual_server(port, port.cluster_ip, port.port, &internal, true);

        let external_set = if port.external_policy_local {
            SetId::ExternalIpLocal
        } else {
            SetId::ExternalIp
        };
        for &ip in &port.external_ips {
            self.member(external_set, Member::IpPort(ip, protocol, port.port));
            let bind = !self.inputs.other_interface_addresses.contains(&ip);
            self.virtual_server(port, ip, port.port, &external, bind);
        }

        for &vip in &port.load_balancer_ips {
            self.load_balancer_ip(port, vip);
            let bind = !self.inputs.other_interface_addresses.contains(&vip);
            self.virtual_server(port, vip, port.port, &external, bind);
        }

        if let Some(node_port) = port.node_port {
            if self.inputs.node_port_addresses.is_empty() {
                return;
            }
            self.node_port(port, node_port);
            for &address in self.inputs.node_port_addresses {
                self.virtual_server(port, address, node_port, &external, false);
            }
        }
        if let Some(health_check) = port.health_check_node_port {
            self.member(SetId::HealthCheckNodePort, Member::Port(health_check));
        }
    }

    /// The other modes drop this traffic ([`Unreachable::Drop`]); ipvs mode falls back to
    /// the cluster's endpoints but counts the Service all the same, as upstream's.
    fn count_no_local(&mut self, port_plan: &PortPlan<'_>) {
        let service = &port_plan.port.name.service;
        if port_plan.internal_unreachable == Some(Unreachable::Drop) {
            self.plan.no_local_internal.insert(service.clone());
        }
        if port_plan.external_unreachable == Some(Unreachable::Drop) {
            self.plan.no_local_external.insert(service.clone());
        }
    }

    fn load_balancer_ip(&mut self, port: &ServicePort, vip: IpAddr) {
        let protocol = port.name.protocol;
        let member = Member::IpPort(vip, protocol, port.port);
        self.member(SetId::LoadBalancer, member);
        if port.external_policy_local {
            self.member(SetId::LoadBalancerLocal, member);
        }
        if port.load_balancer_source_ranges.is_empty() {
            return;
        }
        self.member(SetId::LoadBalancerFirewall, member);
        for &range in &port.load_balancer_source_ranges {
            self.member(
                SetId::LoadBalancerSourceCidr,
                Member::IpPortNet(vip, protocol, port.port, range),
            );
        }
        let node_allowed = self.inputs.node_ip.is_some_and(|node| {
            port.load_balancer_source_ranges
                .iter()
                .any(|range| range.contains(&node))
        });
        if node_allowed {
            self.member(
                SetId::LoadBalancerSourceIp,
                Member::IpPortIp(vip, protocol, port.port, vip),
            );
        } else {
            self.plan.out_filter.insert(service_key(protocol, vip, port.port));
        }
    }

    fn node_port(&mut self, port: &ServicePort, node_port: u16) {
        let local = port.external_policy_local;
        let (set, local_set) = match port.name.protocol {
            Protocol::Tcp => (SetId::NodePortTcp, SetId::NodePortLocalTcp),
            Protocol::Udp => (SetId::NodePortUdp, SetId::NodePortLocalUdp),
            Protocol::Sctp => (SetId::NodePortSctp, SetId::NodePortLocalSctp),
        };
        let members: Vec<Member> = match port.name.protocol {
            Protocol::Sctp => self
                .inputs
                .node_port_addresses
                .iter()
                .map(|&address| Member::IpPort(address, Protocol::Sctp, node_port))
                .collect(),
            _ => vec![Member::Port(node_port)],
        };
        for member in members {
            self.member(set, member);
            if local {
                self.member(local_set, member);
            }
        }
    }

    fn virtual_server(
        &mut self,
        port: &ServicePort,
        address: IpAddr,
        listen_port: u16,
        real_servers: &BTreeSet<SocketAddr>,
        bind: bool,
    ) {
        let key = service_key(port.name.protocol, address, listen_port);
        if self.plan.virtual_servers.contains_key(&key) {
            return;
        }
        let mut service = Service::new(key, self.inputs.scheduler.clone());
        if let Some(seconds) = port.session_affinity_seconds {
            service.flags |= FLAG_PERSISTENT;
            service.timeout = seconds;
        }
        if service.scheduler.as_str() == "mh" {
            service.flags |= FLAG_MH_PORT;
        }
        self.plan.virtual_servers.insert(
            key,
            VirtualServer {
                service,
                real_servers: real_servers.clone(),
                owner: port.name.clone(),
            },
        );
        if bind {
            self.plan.bound.insert(address);
        }
    }

    /// Adds a member to one of the mode's sets; they are all declared, and each id's kind
    /// is the one its members are built with here, so this cannot fail.
    fn member(&mut self, id: SetId, member: Member) {
        let added = self.plan.sets.insert(id.name(self.family), member);
        debug_assert!(added.is_ok(), "{added:?}");
    }
}

/// The plan as text, one object per line in a stable order (virtual servers with their
/// real servers as `ipvsadm -Ln` shows them, bound addresses, set members, output
/// filters): what `--dry-run` prints and the golden files hold.
impl std::fmt::Display for IpvsPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for server in self.virtual_servers.values() {
            let service = &server.service;
            write!(f, "virtual-server {} {}", service.key, service.scheduler)?;
            if service.flags & FLAG_PERSISTENT != 0 {
                write!(f, " persistent {}", service.timeout)?;
            }
            if service.flags & FLAG_MH_PORT != 0 {
                write!(f, " mh-port")?;
            }
            writeln!(f, " # {}", server.owner)?;
            for real in &server.real_servers {
                writeln!(f, "  -> {real}")?;
            }
        }
        for address in &self.bound {
            writeln!(f, "bound {address}")?;
        }
        for spec in self.sets.specs() {
            for member in self.sets.members(spec.name).into_iter().flatten() {
                writeln!(f, "set {} {member}", spec.name)?;
            }
        }
        for key in &self.out_filter {
            writeln!(f, "out-filter {key}")?;
        }
        Ok(())
    }
}

pub(crate) fn service_key(protocol: Protocol, address: IpAddr, port: u16) -> ServiceKey {
    ServiceKey {
        protocol: match protocol {
            Protocol::Tcp => kpr_ipvs_netlink::Protocol::Tcp,
            Protocol::Udp => kpr_ipvs_netlink::Protocol::Udp,
            Protocol::Sctp => kpr_ipvs_netlink::Protocol::Sctp,
        },
        address,
        port,
    }
}

#[cfg(test)]
mod tests;
