//! The "portals": upstream's userspace-mode iptables rules that send a Service's traffic to
//! the proxy's listener for it. Pure: the service ports and their listeners' ports in,
//! a [`Ruleset`] (and so an `iptables-restore` payload) out, golden-tested.
//!
//! Upstream's chains and shapes (proxier.go's `iptablesContainerPortalArgs`,
//! `iptablesHostPortalArgs`, `iptablesNonLocalNodePortArgs`):
//!
//! - `KUBE-PORTALS-CONTAINER` (from nat PREROUTING: pods and the outside): each cluster IP,
//!   external IP and load-balancer ingress IP of a port, `REDIRECT` to the listener's port
//!   when the listeners are bound to every address, else `DNAT` to the bound address.
//! - `KUBE-PORTALS-HOST` (from nat OUTPUT: the node itself): the same addresses, `DNAT` to
//!   the node's address (`REDIRECT` would send them to 127.0.0.1, which the listener's
//!   replies could not leave from).
//! - `KUBE-NODEPORT-CONTAINER` / `KUBE-NODEPORT-HOST` (jumped to for local destinations
//!   only): the NodePort, no address, the same targets.
//! - filter `KUBE-NODEPORT-NON-LOCAL` (from INPUT): accepts new connections to a NodePort's
//!   listener, so a host firewall that drops unknown ports does not drop NodePort traffic.
//!   Entered for new connections only (`-m conntrack --ctstate NEW` before upstream's
//!   jump), as the iptables mode enters its filter chains: upstream's jump sent every
//!   packet the node receives through the chain and its comment matches (xt compat matches
//!   under iptables-nft, 1 % of a short connection's CPU in the L4 profile) to accept none
//!   of the established ones. The old jump is removed when found.
//!
//! A chain is written whole (its rules replaced in one restore, so what is gone goes with
//! it) when its rules changed, and every chain on the syncs the proxier makes full
//! ([`crate::proxier`]); upstream re-added every portal at every sync. One deliberate difference:
//! upstream matched external IPs that are not local only for non-bridged traffic
//! (`-m physdev ! --physdev-is-in`), which needs br_netfilter; here an external IP is
//! served like a cluster IP, as the other modes serve it.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use kpr_iptables::{
    ChainKind, Footprint, JumpRule, RefusedPort, Rule, RuleBuilder, Ruleset, SavedRule, SavedTable, Table,
    refused_field,
};
use kpr_model::ServicePort;
use kpr_naming::{ChainName, Comment, SafeText, userspace_chain};

/// Where the portals send traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortalTargets {
    /// The listeners' address when they are bound to one (`--bind-address`), else `None`:
    /// bound to every address, reached by `REDIRECT`.
    pub listen_ip: Option<IpAddr>,
    /// Where the node's own traffic is sent (upstream: the bound address, else the
    /// node's address).
    pub host_ip: IpAddr,
}

/// One service port and the port its listener got.
#[derive(Clone, Copy, Debug)]
pub struct Portal<'a> {
    pub port: &'a ServicePort,
    pub proxy_port: u16,
}

/// The five chains for `portals`, in a [`Ruleset`]; ports whose name cannot be written into
/// a rule are left out and listed in `refused`.
pub fn render(portals: &[Portal<'_>], targets: PortalTargets) -> Ruleset {
    let mut rs = Ruleset::default();
    let chains = Chains::new();
    for name in [
        &chains.container,
        &chains.host,
        &chains.nodeport_container,
        &chains.nodeport_host,
    ] {
        rs.nat.declare(name, ChainKind::Fixed);
    }
    rs.filter.declare(&chains.non_local, ChainKind::Fixed);
    for portal in portals {
        let port = portal.port;
        let svc = match checked_name(port) {
            Ok(svc) => svc,
            Err(refused) => {
                rs.refused.push(refused);
                continue;
            }
        };
        let rules = PortRules {
            comment: Comment::build().text(&svc).finish(),
            proto: port.name.protocol.lower(),
            listener: portal.proxy_port,
            targets,
        };
        for ip in destinations(port) {
            rs.nat.append(
                &chains.container,
                rules.container(rules.to_address(ip, port.port)),
            );
            rs.nat
                .append(&chains.host, rules.host(rules.to_address(ip, port.port)));
        }
        if let Some(node_port) = port.node_port {
            rs.nat.append(
                &chains.nodeport_container,
                rules.container(rules.to_port(node_port)),
            );
            rs.nat
                .append(&chains.nodeport_host, rules.host(rules.to_port(node_port)));
            rs.filter.append(&chains.non_local, rules.accept_new());
        }
    }
    rs
}

/// The port's `namespace/name:port` as rule text, or why it cannot be: the one check of
/// whether a port can have portals (the proxier opens no listener for a refused one).
pub fn checked_name(port: &ServicePort) -> Result<SafeText, RefusedPort> {
    SafeText::new(&port.name.to_string()).map_err(|error| RefusedPort {
        port: port.name.clone(),
        field: refused_field(&port.name, &error),
        error,
    })
}

/// The addresses a service port is reached at: its cluster IP, external IPs and
/// load-balancer ingress IPs, each once.
fn destinations(port: &ServicePort) -> Vec<IpAddr> {
    let mut ips = vec![port.cluster_ip];
    for ip in port.external_ips.iter().chain(&port.load_balancer_ips) {
        if !ips.contains(ip) {
            ips.push(*ip);
        }
    }
    ips
}

struct Chains {
    container: ChainName,
    host: ChainName,
    nodeport_container: ChainName,
    nodeport_host: ChainName,
    non_local: ChainName,
}

impl Chains {
    fn new() -> Self {
        Self {
            container: ChainName::fixed(userspace_chain::PORTALS_CONTAINER),
            host: ChainName::fixed(userspace_chain::PORTALS_HOST),
            nodeport_container: ChainName::fixed(userspace_chain::NODEPORT_CONTAINER),
            nodeport_host: ChainName::fixed(userspace_chain::NODEPORT_HOST),
            non_local: ChainName::fixed(userspace_chain::NODEPORT_NON_LOCAL),
        }
    }
}

/// What every rule of one service port shares.
struct PortRules {
    comment: Comment,
    proto: &'static str,
    listener: u16,
    targets: PortalTargets,
}

impl PortRules {
    /// `-m comment --comment <svc> -p <proto> -m <proto> --dport <port>`.
    fn matching(&self, port: u16) -> RuleBuilder {
        Rule::builder()
            .comment(&self.comment)
            .args(&["-p", self.proto, "-m", self.proto, "--dport"])
            .arg(port)
    }

    /// Traffic to `ip:port`.
    fn to_address(&self, ip: IpAddr, port: u16) -> RuleBuilder {
        self.matching(port).arg("-d").arg(IpNet::from(ip))
    }

    /// Traffic to a NodePort on any (local) address.
    fn to_port(&self, node_port: u16) -> RuleBuilder {
        self.matching(node_port)
    }

    /// From pods and the outside: to the listener.
    fn container(&self, rule: RuleBuilder) -> Rule {
        match self.targets.listen_ip {
            None => rule
                .args(&["-j", "REDIRECT", "--to-ports"])
                .arg(self.listener)
                .build(),
            Some(ip) => self.dnat(rule, ip),
        }
    }

    /// From the node itself: to the listener on the node's address.
    fn host(&self, rule: RuleBuilder) -> Rule {
        self.dnat(rule, self.targets.listen_ip.unwrap_or(self.targets.host_ip))
    }

    fn dnat(&self, rule: RuleBuilder, ip: IpAddr) -> Rule {
        rule.args(&["-j", "DNAT", "--to-destination"])
            .arg(SocketAddr::new(ip, self.listener))
            .build()
    }

    /// filter: new connections to the listener are accepted.
    fn accept_new(&self) -> Rule {
        Rule::builder()
            .comment(&self.comment)
            .args(&[
                "-m", "state", "--state", "NEW", "-p", self.proto, "-m", self.proto, "--dport",
            ])
            .arg(self.listener)
            .jump("ACCEPT")
    }
}

/// What the mode writes into iptables, for its removal: the portal chains, reached only from
/// built-in chains.
#[derive(Clone, Copy, Debug, Default)]
pub struct PortalFootprint;

impl Footprint for PortalFootprint {
    fn owns(&self, table: Table, name: &str, _saved: &SavedTable) -> bool {
        match table {
            Table::Nat => userspace_chain::NAT.contains(&name),
            Table::Filter => userspace_chain::FILTER.contains(&name),
            Table::Mangle => false,
        }
    }

    fn writes_into(&self, _table: Table, _name: &str) -> bool {
        false
    }

    fn owns_rule(&self, _rule: &SavedRule) -> bool {
        false
    }
}

/// The rules in built-in chains that lead into the portal chains. Each is inserted at the
/// top of its chain, in this order, so the portals end up above the NodePort jumps (an
/// external IP on the node must not be taken for a NodePort), and both above whatever
/// else the chain holds.
pub fn jump_rules() -> Vec<JumpRule> {
    use userspace_chain::*;
    const NODEPORTS: &str = "handle service NodePorts";
    const CLUSTER_IPS: &str = "handle ClusterIPs";
    vec![
        JumpRule::new(Table::Nat, "PREROUTING", NODEPORT_CONTAINER, NODEPORTS).to_local_addresses(),
        JumpRule::new(Table::Nat, "OUTPUT", NODEPORT_HOST, NODEPORTS).to_local_addresses(),
        JumpRule::new(Table::Nat, "PREROUTING", PORTALS_CONTAINER, CLUSTER_IPS),
        JumpRule::new(Table::Nat, "OUTPUT", PORTALS_HOST, CLUSTER_IPS),
        non_local_jump().new_connections_only(),
    ]
}

/// Jumps earlier versions made that [`jump_rules`] replaced: removed when found, else they
/// would go on costing every packet.
pub fn superseded_jump_rules() -> Vec<JumpRule> {
    vec![non_local_jump()]
}

/// Upstream's shape of the jump to `KUBE-NODEPORT-NON-LOCAL`, taken by every packet the
/// node receives. Every rule in the chain accepts new connections only, so
/// [`jump_rules`] enters it for those alone.
fn non_local_jump() -> JumpRule {
    JumpRule::new(
        Table::Filter,
        "INPUT",
        userspace_chain::NODEPORT_NON_LOCAL,
        "Ensure that non-local NodePort traffic can flow",
    )
}

#[cfg(test)]
mod tests {
    use kpr_iptables::{IptablesFootprint, plan_table_for};

    use super::*;

    /// Userspace mode's portal chains and their jumps, next to iptables mode's rules.
    const USERSPACE_NAT: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-PORTALS-CONTAINER - [0:0]\n:KUBE-PORTALS-HOST - [0:0]\n:KUBE-NODEPORT-CONTAINER - [0:0]\n:KUBE-NODEPORT-HOST - [0:0]\n-A PREROUTING -j KUBE-PORTALS-CONTAINER\n-A PREROUTING -j KUBE-SERVICES\n-A PREROUTING -m addrtype --dst-type LOCAL -j KUBE-NODEPORT-CONTAINER\n-A OUTPUT -j KUBE-PORTALS-HOST\n-A OUTPUT -m addrtype --dst-type LOCAL -j KUBE-NODEPORT-HOST\n-A KUBE-PORTALS-CONTAINER -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 40000\nCOMMIT\n";

    #[test]
    fn portals_are_removed_by_their_mode_and_left_by_iptables_modes() {
        let plan = plan_table_for(&PortalFootprint, Table::Nat, USERSPACE_NAT);
        assert_eq!(
            plan.delete,
            [
                "KUBE-PORTALS-CONTAINER",
                "KUBE-PORTALS-HOST",
                "KUBE-NODEPORT-CONTAINER",
                "KUBE-NODEPORT-HOST"
            ]
        );
        assert_eq!(plan.jumps.len(), 4, "{:?}", plan.jumps);
        assert!(
            !plan.payload().contains("KUBE-SERVICES"),
            "iptables mode's chain stays"
        );
        let iptables = plan_table_for(&IptablesFootprint, Table::Nat, USERSPACE_NAT);
        assert_eq!(iptables.delete, ["KUBE-SERVICES"]);
        let filter = "*filter\n:INPUT ACCEPT [0:0]\n:KUBE-NODEPORT-NON-LOCAL - [0:0]\n-A INPUT -j KUBE-NODEPORT-NON-LOCAL\nCOMMIT\n";
        assert_eq!(
            plan_table_for(&PortalFootprint, Table::Filter, filter).delete,
            ["KUBE-NODEPORT-NON-LOCAL"]
        );
    }
}
