//! The ipvs mode's iptables ruleset (`UPSTREAM.md` §4): a fixed set of chains whose rules
//! match Services through the ipsets, so the ruleset's size does not grow with the number
//! of Services. Pure: the plan (which sets are empty, the output filters) and the options
//! in, a kpr-iptables [`Ruleset`] out, written with the same typed rule builder as iptables
//! mode (set names, comments and chains are literals of this crate; addresses and ports
//! are typed values).

use kpr_host::LocalDetector;
use kpr_iptables::{ChainKind, JumpRule, LocalMatch, Mark, MarkWithMask, Rule, RuleBuilder, Ruleset, Table};
use kpr_model::IpFamily;
use kpr_naming::{ChainName, Comment, chain, ipvs_chain};

use crate::IpvsPlan;
use crate::plan::set_family;
use crate::sets::SetId;

/// What the rules depend on besides the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleOptions {
    pub family: IpFamily,
    /// Bit of the packet mark that flags traffic needing SNAT.
    pub masquerade_bit: u8,
    /// SNAT all traffic to cluster IPs.
    pub masquerade_all: bool,
    pub local_detector: LocalDetector,
    /// The iptables binary supports `--random-fully`.
    pub random_fully: bool,
}

/// The chains, in upstream's declaration order.
const NAT_CHAINS: [&str; 5] = [
    chain::SERVICES,
    chain::POSTROUTING,
    ipvs_chain::NODE_PORT,
    ipvs_chain::LOAD_BALANCER,
    chain::MARK_MASQ,
];
const FILTER_CHAINS: [&str; 6] = [
    chain::FORWARD,
    ipvs_chain::NODE_PORT,
    chain::PROXY_FIREWALL,
    ipvs_chain::SOURCE_RANGES_FIREWALL,
    ipvs_chain::IPVS_FILTER,
    ipvs_chain::IPVS_OUT_FILTER,
];

/// The jumps from built-in chains into the mode's chains, each ensured at the top of its
/// chain before the restore (so the later ones listed end up first: upstream's order).
pub fn jump_rules() -> Vec<JumpRule> {
    use Table::{Filter, Nat};
    [
        (Nat, "OUTPUT", chain::SERVICES, "kubernetes service portals"),
        (Nat, "PREROUTING", chain::SERVICES, "kubernetes service portals"),
        (
            Nat,
            "POSTROUTING",
            chain::POSTROUTING,
            "kubernetes postrouting rules",
        ),
        (Filter, "FORWARD", chain::FORWARD, "kubernetes forwarding rules"),
        (
            Filter,
            "INPUT",
            ipvs_chain::NODE_PORT,
            "kubernetes health check rules",
        ),
        (
            Filter,
            "INPUT",
            chain::PROXY_FIREWALL,
            "kube-proxy firewall rules",
        ),
        (
            Filter,
            "FORWARD",
            chain::PROXY_FIREWALL,
            "kube-proxy firewall rules",
        ),
        (
            Filter,
            "INPUT",
            ipvs_chain::IPVS_FILTER,
            "kubernetes ipvs access filter",
        ),
        (
            Filter,
            "OUTPUT",
            ipvs_chain::IPVS_OUT_FILTER,
            "kubernetes ipvs access filter",
        ),
    ]
    .into_iter()
    .map(|(table, from, target, comment)| JumpRule::new(table, from, target, comment))
    .collect()
}

/// The whole ruleset for `plan`.
pub fn ruleset(plan: &IpvsPlan, options: &RuleOptions) -> Ruleset {
    let mut rules = Rules {
        plan,
        options,
        ruleset: Ruleset::default(),
        mark: Mark(1 << options.masquerade_bit),
    };
    for name in NAT_CHAINS {
        rules
            .ruleset
            .nat
            .declare(&ChainName::fixed(name), ChainKind::Fixed);
    }
    for name in FILTER_CHAINS {
        rules
            .ruleset
            .filter
            .declare(&ChainName::fixed(name), ChainKind::Fixed);
    }
    rules.write_nat();
    rules.write_filter();
    rules.ruleset
}

struct Rules<'a> {
    plan: &'a IpvsPlan,
    options: &'a RuleOptions,
    ruleset: Ruleset,
    mark: Mark,
}

impl Rules<'_> {
    fn set(&self, id: SetId) -> &'static str {
        id.name(set_family(self.options.family))
    }

    fn has(&self, id: SetId) -> bool {
        !self.plan.sets.is_empty(self.set(id))
    }

    /// `-m comment --comment <the set's comment> -m set --match-set <set> <flags>`.
    fn match_set(&self, id: SetId, flags: &'static str) -> RuleBuilder {
        self.match_set_after(Rule::builder(), id, flags)
    }

    /// [`Self::match_set`] after the arguments `rule` already has.
    fn match_set_after(&self, rule: RuleBuilder, id: SetId, flags: &'static str) -> RuleBuilder {
        rule.comment(&Comment::build().literal(id.comment()).finish())
            .args(&["-m", "set", "--match-set"])
            .arg(self.set(id))
            .arg(flags)
    }

    /// The same match without the comment (upstream writes some rules bare).
    fn bare_match_set(&self, id: SetId, flags: &'static str) -> RuleBuilder {
        Rule::builder()
            .args(&["-m", "set", "--match-set"])
            .arg(self.set(id))
            .arg(flags)
    }

    fn add_nat(&mut self, chain: &'static str, rule: Rule) {
        self.ruleset.nat.append(&ChainName::fixed(chain), rule);
    }

    fn add_filter(&mut self, chain: &'static str, rule: Rule) {
        self.ruleset.filter.append(&ChainName::fixed(chain), rule);
    }

    fn write_nat(&mut self) {
        let loopback = match self.options.family {
            IpFamily::V4 => "127.0.0.0/8",
            IpFamily::V6 => "::1/128",
        };
        self.add_nat(
            chain::SERVICES,
            Rule::builder().args(&["-s", loopback]).jump("RETURN"),
        );
        if self.has(SetId::LoopBack) {
            let rule = self.match_set(SetId::LoopBack, "dst,dst,src").jump("MASQUERADE");
            self.add_nat(chain::POSTROUTING, rule);
        }
        if self.has(SetId::LoadBalancer) {
            let rule = self
                .match_set(SetId::LoadBalancer, "dst,dst")
                .jump(ipvs_chain::LOAD_BALANCER);
            self.add_nat(chain::SERVICES, rule);
        }
        if self.has(SetId::LoadBalancerLocal) {
            let rule = self.match_set(SetId::LoadBalancerLocal, "dst,dst").jump("RETURN");
            self.add_nat(ipvs_chain::LOAD_BALANCER, rule);
        }
        self.node_port_rules();
        self.cluster_ip_masquerade();
        self.external_ip_rules();
        let to_node_ports = Rule::builder()
            .args(&["-m", "addrtype", "--dst-type", "LOCAL"])
            .jump(ipvs_chain::NODE_PORT);
        self.add_nat(chain::SERVICES, to_node_ports);
        self.add_nat(ipvs_chain::LOAD_BALANCER, Rule::builder().jump(chain::MARK_MASQ));
        if self.has(SetId::ClusterIp) {
            let rule = self.bare_match_set(SetId::ClusterIp, "dst,dst").jump("ACCEPT");
            self.add_nat(chain::SERVICES, rule);
        }
        if self.has(SetId::LoadBalancer) {
            let rule = self.bare_match_set(SetId::LoadBalancer, "dst,dst").jump("ACCEPT");
            self.add_nat(chain::SERVICES, rule);
        }
        self.postrouting();
    }

    fn node_port_rules(&mut self) {
        let per_protocol = [
            ("tcp", SetId::NodePortLocalTcp, SetId::NodePortTcp, "dst"),
            ("udp", SetId::NodePortLocalUdp, SetId::NodePortUdp, "dst"),
            ("sctp", SetId::NodePortLocalSctp, SetId::NodePortSctp, "dst,dst"),
        ];
        for (protocol, local, all, flags) in per_protocol {
            let on_protocol = || Rule::builder().args(&["-p", protocol]);
            if self.has(local) {
                let rule = self.match_set_after(on_protocol(), local, flags).jump("RETURN");
                self.add_nat(ipvs_chain::NODE_PORT, rule);
            }
            if self.has(all) {
                let rule = self
                    .match_set_after(on_protocol(), all, flags)
                    .jump(chain::MARK_MASQ);
                self.add_nat(ipvs_chain::NODE_PORT, rule);
            }
        }
    }

    fn cluster_ip_masquerade(&mut self) {
        if !self.has(SetId::ClusterIp) {
            return;
        }
        let family = self.options.family;
        let rule = if self.options.masquerade_all {
            self.match_set(SetId::ClusterIp, "dst,dst")
        } else {
            let matched = self.match_set(SetId::ClusterIp, "dst,dst");
            match self.options.local_detector.append_match(matched, family, true) {
                Some(rule) => rule,
                // No way to tell pods apart: masquerade what the node itself sends.
                None => self.match_set(SetId::ClusterIp, "src,dst"),
            }
        };
        self.add_nat(chain::SERVICES, rule.jump(chain::MARK_MASQ));
    }

    fn external_ip_rules(&mut self) {
        if self.has(SetId::ExternalIp) {
            let rule = self
                .match_set(SetId::ExternalIp, "dst,dst")
                .jump(chain::MARK_MASQ);
            self.add_nat(chain::SERVICES, rule);
            self.external_ip_accepts(SetId::ExternalIp);
        }
        if self.has(SetId::ExternalIpLocal) {
            self.external_ip_accepts(SetId::ExternalIpLocal);
        }
    }

    /// Traffic to an external IP that did not come through a bridge from a local pod, or
    /// that is for a local address, goes to IPVS as is.
    fn external_ip_accepts(&mut self, id: SetId) {
        let not_bridged = self
            .match_set(id, "dst,dst")
            .args(&[
                "-m",
                "physdev",
                "!",
                "--physdev-is-in",
                "-m",
                "addrtype",
                "!",
                "--src-type",
                "LOCAL",
            ])
            .jump("ACCEPT");
        self.add_nat(chain::SERVICES, not_bridged);
        let local = self
            .match_set(id, "dst,dst")
            .args(&["-m", "addrtype", "--dst-type", "LOCAL"])
            .jump("ACCEPT");
        self.add_nat(chain::SERVICES, local);
    }

    fn postrouting(&mut self) {
        let mark = self.mark;
        let unmarked = Rule::builder()
            .args(&["-m", "mark", "!", "--mark"])
            .arg(MarkWithMask(mark))
            .jump("RETURN");
        self.add_nat(chain::POSTROUTING, unmarked);
        let clear = Rule::builder()
            .args(&["-j", "MARK", "--xor-mark"])
            .arg(mark)
            .build();
        self.add_nat(chain::POSTROUTING, clear);
        let comment = Comment::build()
            .literal("kubernetes service traffic requiring SNAT")
            .finish();
        let mut masquerade = Rule::builder().comment(&comment).args(&["-j", "MASQUERADE"]);
        if self.options.random_fully {
            masquerade = masquerade.arg("--random-fully");
        }
        self.add_nat(chain::POSTROUTING, masquerade.build());
        let set_mark = Rule::builder()
            .args(&["-j", "MARK", "--or-mark"])
            .arg(mark)
            .build();
        self.add_nat(chain::MARK_MASQ, set_mark);
    }

    fn write_filter(&mut self) {
        if self.has(SetId::LoadBalancerFirewall) {
            let rule = self
                .match_set(SetId::LoadBalancerFirewall, "dst,dst")
                .jump(ipvs_chain::SOURCE_RANGES_FIREWALL);
            self.add_filter(chain::PROXY_FIREWALL, rule);
        }
        for id in [SetId::LoadBalancerSourceCidr, SetId::LoadBalancerSourceIp] {
            if self.has(id) {
                let rule = self.match_set(id, "dst,dst,src").jump("RETURN");
                self.add_filter(ipvs_chain::SOURCE_RANGES_FIREWALL, rule);
            }
        }
        self.add_filter(ipvs_chain::SOURCE_RANGES_FIREWALL, Rule::builder().jump("DROP"));
        for key in &self.plan.out_filter {
            let protocol = match key.protocol {
                kpr_ipvs_netlink::Protocol::Tcp => "tcp",
                kpr_ipvs_netlink::Protocol::Udp => "udp",
                kpr_ipvs_netlink::Protocol::Sctp => "sctp",
            };
            let rule = Rule::builder()
                .arg("-s")
                .arg(key.address)
                .args(&["-m", "ipvs", "--vaddr"])
                .arg(key.address)
                .arg("--vproto")
                .arg(protocol)
                .arg("--vport")
                .arg(key.port)
                .jump("DROP");
            self.add_filter(ipvs_chain::IPVS_OUT_FILTER, rule);
        }
        self.forward();
        let health = self.match_set(SetId::HealthCheckNodePort, "dst").jump("ACCEPT");
        self.add_filter(ipvs_chain::NODE_PORT, health);
        for id in [
            SetId::LoadBalancer,
            SetId::ClusterIp,
            SetId::ExternalIp,
            SetId::ExternalIpLocal,
        ] {
            let rule = self.bare_match_set(id, "dst,dst").jump("RETURN");
            self.add_filter(ipvs_chain::IPVS_FILTER, rule);
        }
        let health = self
            .bare_match_set(SetId::HealthCheckNodePort, "dst")
            .jump("RETURN");
        self.add_filter(ipvs_chain::IPVS_FILTER, health);
        let unknown = Rule::builder()
            .args(&["-m", "conntrack", "--ctstate", "NEW", "-m", "set", "--match-set"])
            .arg(self.set(SetId::IpvsIps))
            .arg("dst")
            .jump("REJECT");
        self.add_filter(ipvs_chain::IPVS_FILTER, unknown);
    }

    fn forward(&mut self) {
        let marked = Rule::builder()
            .comment(&Comment::build().literal("kubernetes forwarding rules").finish())
            .args(&["-m", "mark", "--mark"])
            .arg(MarkWithMask(self.mark))
            .jump("ACCEPT");
        self.add_filter(chain::FORWARD, marked);
        let established = Rule::builder()
            .comment(
                &Comment::build()
                    .literal("kubernetes forwarding conntrack rule")
                    .finish(),
            )
            .args(&["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED"])
            .jump("ACCEPT");
        self.add_filter(chain::FORWARD, established);
    }
}

#[cfg(test)]
mod tests;
