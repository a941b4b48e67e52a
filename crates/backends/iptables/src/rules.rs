//! Rule generation: the desired state and the options in, the complete ruleset out.
//!
//! A pure function with upstream kube-proxy's (1.28+) chain structure and rule shapes, so
//! that `iptables-save` on a node looks the same whichever proxy wrote it, and the two can
//! take over from each other. The per-service decisions (which endpoints, REJECT or DROP,
//! which chains) come from kpr-state's `PortPlan`; this module only spells them as rules.

use std::net::IpAddr;
use std::sync::Arc;

use kpr_model::{Endpoint, NamespacedName};
use kpr_naming::{ServiceChains, chain};
use kpr_state::{DesiredState, PortPlan, Unreachable};

use crate::names::NameCache;
use crate::options::{IptablesOptions, NodePortTargets};
use crate::ruleset::{ChainKind, Rule, Ruleset};

/// Comment of the last rule of nat KUBE-SERVICES.
const NODEPORTS_TAIL_COMMENT: &str =
    "kubernetes service nodeports; NOTE: this must be the last rule in this chain";
/// Comment of the KUBE-FIREWALL rule that closes the hole route_localnet opens.
pub(crate) const LOCALNET_COMMENT: &str = "block incoming localnet connections";

/// The complete ruleset for `state`.
pub fn build(state: &DesiredState, opts: &IptablesOptions) -> Ruleset {
    build_with_cache(state, opts, &mut NameCache::default())
}

/// Like [`build`], reusing chain names computed by earlier builds.
pub fn build_with_cache(state: &DesiredState, opts: &IptablesOptions, names: &mut NameCache) -> Ruleset {
    names.begin();
    let ports = state.ports();
    let total_endpoints: usize = ports.iter().map(|p| state.endpoints(p).len()).sum();
    let mut b = Builder {
        opts,
        mark: opts.masquerade_mark(),
        names,
        rs: Ruleset {
            large_cluster: total_endpoints > opts.large_cluster_endpoints_threshold,
            ..Ruleset::default()
        },
        probabilities: Vec::new(),
    };
    b.fixed_chains();
    for port in ports {
        b.service_port(&state.plan(port));
    }
    b.nodeports_tail();
    b.forward_rules();
    b.rs
}

/// The restore input a full sync of `state` applies (for `--dry-run`); stale chains found
/// in the kernel would be deleted on top of this.
pub fn render_dry_run(state: &DesiredState, opts: &IptablesOptions) -> String {
    build(state, opts).render_full().text
}

fn target(u: Unreachable) -> &'static str {
    match u {
        Unreachable::Reject => "REJECT",
        Unreachable::Drop => "DROP",
    }
}

struct Builder<'a> {
    opts: &'a IptablesOptions,
    mark: String,
    names: &'a mut NameCache,
    rs: Ruleset,
    /// `probabilities[n]` = 1/n as upstream prints it.
    probabilities: Vec<String>,
}

/// What every rule of one service port needs to know.
struct PortCtx<'p> {
    plan: &'p PortPlan<'p>,
    chains: Arc<ServiceChains>,
    /// `ns/name:port`, as upstream puts it in comments.
    svc: String,
    proto: &'static str,
    owner: NamespacedName,
}

impl PortCtx<'_> {
    /// `-m <proto> -p <proto> -d <ip> --dport <port>` for a destination of this port.
    fn dest(&self, rule: Rule, ip: &IpAddr, port: u16) -> Rule {
        rule.args(&["-m", self.proto, "-p", self.proto, "-d"])
            .arg(&ip.to_string())
            .arg("--dport")
            .arg(&port.to_string())
    }

    fn internal_chain(&self) -> &str {
        if self.plan.port.internal_policy_local {
            &self.chains.local
        } else {
            &self.chains.cluster
        }
    }

    fn external_policy_chain(&self) -> &str {
        if self.plan.port.external_policy_local {
            &self.chains.local
        } else {
            &self.chains.cluster
        }
    }

    fn load_balancer_chain(&self) -> &str {
        if self.plan.uses_firewall_chain {
            &self.chains.firewall
        } else {
            &self.chains.external
        }
    }

    fn unreachable_comment(&self, u: Unreachable) -> String {
        format!("{} {}", self.svc, u.comment_suffix())
    }
}

impl Builder<'_> {
    // === fixed chains ===

    fn fixed_chains(&mut self) {
        for name in [
            chain::SERVICES,
            chain::EXTERNAL_SERVICES,
            chain::FORWARD,
            chain::NODEPORTS,
            chain::PROXY_FIREWALL,
        ] {
            self.rs.filter.declare(name, ChainKind::Fixed);
        }
        if self.opts.localhost_nodeports_enabled() {
            self.localnet_firewall();
        }
        for name in [
            chain::SERVICES,
            chain::NODEPORTS,
            chain::POSTROUTING,
            chain::MARK_MASQ,
        ] {
            self.rs.nat.declare(name, ChainKind::Fixed);
        }
        self.rs.filter.declare(chain::CANARY, ChainKind::Canary);
        self.rs.nat.declare(chain::CANARY, ChainKind::Canary);
        self.masquerade_chains();
    }

    /// route_localnet lets packets to 127.0.0.0/8 arrive from outside; this rule (which
    /// kubelet writes identically) drops them unless they are replies or were DNATed.
    fn localnet_firewall(&mut self) {
        let rule = Rule::new()
            .comment(LOCALNET_COMMENT)
            .args(&["-d", "127.0.0.0/8", "!", "-s", "127.0.0.0/8"])
            .args(&["-m", "conntrack", "!", "--ctstate", "RELATED,ESTABLISHED,DNAT"])
            .jump("DROP");
        self.rs.filter.declare(chain::FIREWALL, ChainKind::Fixed);
        self.rs.filter.append(chain::FIREWALL, rule);
    }

    fn masquerade_chains(&mut self) {
        let mark = self.mark.clone();
        let masked = format!("{mark}/{mark}");
        let nat = &mut self.rs.nat;
        nat.append(
            chain::POSTROUTING,
            Rule::new()
                .args(&["-m", "mark", "!", "--mark", &masked])
                .jump("RETURN"),
        );
        // Clear the mark so a packet that traverses the stack again is not SNATed twice.
        nat.append(
            chain::POSTROUTING,
            Rule::new().args(&["-j", "MARK", "--xor-mark", &mark]).build(),
        );
        let mut masq = Rule::new()
            .comment("kubernetes service traffic requiring SNAT")
            .args(&["-j", "MASQUERADE"]);
        if self.opts.masquerade_random_fully {
            masq = masq.arg("--random-fully");
        }
        nat.append(chain::POSTROUTING, masq.build());
        nat.append(
            chain::MARK_MASQ,
            Rule::new().args(&["-j", "MARK", "--or-mark", &mark]).build(),
        );
    }

    fn nodeports_tail(&mut self) {
        let opts = self.opts;
        let rule = || Rule::new().comment(NODEPORTS_TAIL_COMMENT);
        match opts.nodeport_addresses.targets(opts.family, &opts.node_ips) {
            NodePortTargets::AllLocal => {
                let mut r = rule().args(&["-m", "addrtype", "--dst-type", "LOCAL"]);
                // Localhost NodePorts never work on IPv6, and on IPv4 only with route_localnet.
                if !opts.localhost_nodeports_enabled() {
                    r = r.args(&["!", "-d", opts.loopback_cidr()]);
                }
                self.rs.nat.append(chain::SERVICES, r.jump(chain::NODEPORTS));
            }
            NodePortTargets::Ips(ips) => {
                for ip in ips {
                    if ip.is_loopback() && !opts.localhost_nodeports_enabled() {
                        continue;
                    }
                    let r = rule().arg("-d").arg(&ip.to_string());
                    self.rs.nat.append(chain::SERVICES, r.jump(chain::NODEPORTS));
                }
            }
        }
    }

    fn forward_rules(&mut self) {
        let masked = format!("{}/{}", self.mark, self.mark);
        let filter = &mut self.rs.filter;
        // INVALID packets would otherwise reach pods un-NATed and reset connections.
        filter.append(
            chain::FORWARD,
            Rule::new()
                .args(&["-m", "conntrack", "--ctstate", "INVALID"])
                .jump("DROP"),
        );
        // Service traffic is forwarded even when the FORWARD policy is DROP.
        filter.append(
            chain::FORWARD,
            Rule::new()
                .comment("kubernetes forwarding rules")
                .args(&["-m", "mark", "--mark", &masked])
                .jump("ACCEPT"),
        );
        filter.append(
            chain::FORWARD,
            Rule::new()
                .comment("kubernetes forwarding conntrack rule")
                .args(&["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED"])
                .jump("ACCEPT"),
        );
    }

    // === per service port ===

    fn service_port(&mut self, plan: &PortPlan<'_>) {
        let port = plan.port;
        let ctx = PortCtx {
            plan,
            chains: self.names.service(&port.name),
            svc: port.name.to_string(),
            proto: port.name.protocol.lower(),
            owner: port.name.service.clone(),
        };
        if plan.has_endpoints() {
            self.rs.no_local_internal += usize::from(plan.internal_unreachable == Some(Unreachable::Drop));
            self.rs.no_local_external += usize::from(plan.external_unreachable == Some(Unreachable::Drop));
        }
        self.capture_cluster_ip(&ctx);
        self.capture_external_ips(&ctx);
        self.capture_load_balancer_ips(&ctx);
        self.capture_node_port(&ctx);
        self.accept_health_check_node_port(&ctx);
        self.declare_service_chains(&ctx);
        self.internal_masquerade(&ctx);
        self.external_chain(&ctx);
        self.firewall_chain(&ctx);
        if plan.uses_cluster_chain {
            self.endpoint_jumps(&ctx, &ctx.chains.cluster, &plan.endpoints.cluster);
        }
        if plan.uses_local_chain {
            self.endpoint_jumps(&ctx, &ctx.chains.local, &plan.endpoints.local);
        }
        for ep in &plan.endpoints.reachable {
            self.endpoint_chain(&ctx, ep);
        }
    }

    fn capture_cluster_ip(&mut self, ctx: &PortCtx<'_>) {
        let port = ctx.plan.port;
        match ctx.plan.internal_unreachable {
            None => {
                let comment = format!("{} cluster IP", ctx.svc);
                let rule = ctx.dest(Rule::new().comment(&comment), &port.cluster_ip, port.port);
                self.rs
                    .nat
                    .append(chain::SERVICES, rule.jump(ctx.internal_chain()));
            }
            Some(u) => {
                let rule = ctx.dest(
                    Rule::new().comment(&ctx.unreachable_comment(u)),
                    &port.cluster_ip,
                    port.port,
                );
                self.rs.filter.append(chain::SERVICES, rule.jump(target(u)));
            }
        }
    }

    fn capture_external_ips(&mut self, ctx: &PortCtx<'_>) {
        let port = ctx.plan.port;
        let comment = format!("{} external IP", ctx.svc);
        for ip in &port.external_ips {
            if ctx.plan.has_endpoints() {
                let rule = ctx.dest(Rule::new().comment(&comment), ip, port.port);
                self.rs
                    .nat
                    .append(chain::SERVICES, rule.jump(&ctx.chains.external));
            }
            if let Some(u) = ctx.plan.external_unreachable {
                let rule = ctx.dest(Rule::new().comment(&ctx.unreachable_comment(u)), ip, port.port);
                self.rs
                    .filter
                    .append(chain::EXTERNAL_SERVICES, rule.jump(target(u)));
            }
        }
    }

    fn capture_load_balancer_ips(&mut self, ctx: &PortCtx<'_>) {
        let port = ctx.plan.port;
        let comment = format!("{} loadbalancer IP", ctx.svc);
        let not_accepted = format!("{} traffic not accepted by {}", ctx.svc, ctx.chains.firewall);
        for ip in &port.load_balancer_ips {
            if ctx.plan.has_endpoints() {
                let rule = ctx.dest(Rule::new().comment(&comment), ip, port.port);
                self.rs
                    .nat
                    .append(chain::SERVICES, rule.jump(ctx.load_balancer_chain()));
            }
            if ctx.plan.uses_firewall_chain {
                let rule = ctx.dest(Rule::new().comment(&not_accepted), ip, port.port);
                self.rs.filter.append(chain::PROXY_FIREWALL, rule.jump("DROP"));
            }
        }
        if let Some(u) = ctx.plan.external_unreachable {
            for ip in &port.load_balancer_ips {
                let rule = ctx.dest(Rule::new().comment(&ctx.unreachable_comment(u)), ip, port.port);
                self.rs
                    .filter
                    .append(chain::EXTERNAL_SERVICES, rule.jump(target(u)));
            }
        }
    }

    fn capture_node_port(&mut self, ctx: &PortCtx<'_>) {
        let Some(node_port) = ctx.plan.port.node_port else {
            return;
        };
        let proto_port = |rule: Rule| {
            rule.args(&["-m", ctx.proto, "-p", ctx.proto, "--dport"])
                .arg(&node_port.to_string())
        };
        if ctx.plan.has_endpoints() {
            // NodePorts are not subject to loadBalancerSourceRanges, as upstream.
            let rule = proto_port(Rule::new().comment(&ctx.svc));
            self.rs
                .nat
                .append(chain::NODEPORTS, rule.jump(&ctx.chains.external));
        }
        if let Some(u) = ctx.plan.external_unreachable {
            let rule = proto_port(Rule::new().comment(&ctx.unreachable_comment(u)).args(&[
                "-m",
                "addrtype",
                "--dst-type",
                "LOCAL",
            ]));
            self.rs
                .filter
                .append(chain::EXTERNAL_SERVICES, rule.jump(target(u)));
        }
    }

    fn accept_health_check_node_port(&mut self, ctx: &PortCtx<'_>) {
        let Some(hc) = ctx.plan.port.health_check_node_port else {
            return;
        };
        let rule = Rule::new()
            .comment(&format!("{} health check node port", ctx.svc))
            .args(&["-m", "tcp", "-p", "tcp", "--dport"])
            .arg(&hc.to_string())
            .jump("ACCEPT");
        self.rs.filter.append(chain::NODEPORTS, rule);
    }

    /// Declares the service's chains in upstream's order, so each exists even if empty.
    fn declare_service_chains(&mut self, ctx: &PortCtx<'_>) {
        let plan = ctx.plan;
        let used = [
            (plan.uses_external_chain, &ctx.chains.external),
            (plan.uses_firewall_chain, &ctx.chains.firewall),
            (plan.uses_cluster_chain, &ctx.chains.cluster),
            (plan.uses_local_chain, &ctx.chains.local),
        ];
        for (uses, name) in used {
            if uses {
                self.rs.nat.declare(name, ChainKind::Service(ctx.owner.clone()));
            }
        }
    }

    fn service_rule(&mut self, ctx: &PortCtx<'_>, chain: &str, rule: String) {
        self.rs.nat.declare(chain, ChainKind::Service(ctx.owner.clone()));
        self.rs.nat.append(chain, rule);
    }

    /// Masquerades cluster-IP traffic from outside the pod network (e.g. a static route to
    /// the service range via any node), or everything with masquerade_all.
    fn internal_masquerade(&mut self, ctx: &PortCtx<'_>) {
        if ctx.plan.internal_unreachable.is_some() {
            return;
        }
        let port = ctx.plan.port;
        let comment = format!("{} cluster IP", ctx.svc);
        let base = ctx.dest(Rule::new().comment(&comment), &port.cluster_ip, port.port);
        let rule = if self.opts.masquerade_all {
            base.jump(chain::MARK_MASQ)
        } else if let Some(not_local) = self.opts.local_detector.if_not_local(self.opts.family) {
            base.args(&not_local).jump(chain::MARK_MASQ)
        } else {
            return;
        };
        self.service_rule(ctx, ctx.internal_chain(), rule);
    }

    /// KUBE-EXT-: the entry for NodePort, external-IP and load-balancer traffic.
    fn external_chain(&mut self, ctx: &PortCtx<'_>) {
        let plan = ctx.plan;
        if !plan.uses_external_chain {
            return;
        }
        let ext = ctx.chains.external.as_str();
        let svc = &ctx.svc;
        if !plan.port.external_policy_local {
            // Endpoints may be on other nodes: SNAT so replies come back through us.
            let rule = Rule::new()
                .comment(&format!("masquerade traffic for {svc} external destinations"))
                .jump(chain::MARK_MASQ);
            self.service_rule(ctx, ext, rule);
        } else if plan.uses_cluster_chain {
            self.external_local_short_circuits(ctx);
        }
        if plan.external_unreachable.is_none() {
            self.service_rule(ctx, ext, Rule::new().jump(ctx.external_policy_chain()));
        }
    }

    /// With externalTrafficPolicy Local, traffic from pods and from the node itself is sent
    /// to the cluster-wide chain, as if it had gone out to the load balancer and come back.
    /// (Skipped when the service has no cluster-wide chain to send it to.)
    fn external_local_short_circuits(&mut self, ctx: &PortCtx<'_>) {
        let ext = ctx.chains.external.as_str();
        let cluster = ctx.chains.cluster.as_str();
        let svc = &ctx.svc;
        if let Some(local) = self.opts.local_detector.if_local(self.opts.family) {
            let rule = Rule::new()
                .comment(&format!("pod traffic for {svc} external destinations"))
                .args(&local)
                .jump(cluster);
            self.service_rule(ctx, ext, rule);
        }
        // Host-originated traffic gets the (local) VIP as source: it must be SNATed.
        let masq = Rule::new()
            .comment(&format!(
                "masquerade LOCAL traffic for {svc} external destinations"
            ))
            .args(&["-m", "addrtype", "--src-type", "LOCAL"])
            .jump(chain::MARK_MASQ);
        self.service_rule(ctx, ext, masq);
        let route = Rule::new()
            .comment(&format!("route LOCAL traffic for {svc} external destinations"))
            .args(&["-m", "addrtype", "--src-type", "LOCAL"])
            .jump(cluster);
        self.service_rule(ctx, ext, route);
    }

    /// KUBE-FW-: loadBalancerSourceRanges. Allowed sources go on to KUBE-EXT-; the rest
    /// falls through un-DNATed and is dropped by filter KUBE-PROXY-FIREWALL.
    fn firewall_chain(&mut self, ctx: &PortCtx<'_>) {
        if !ctx.plan.uses_firewall_chain {
            return;
        }
        let port = ctx.plan.port;
        let fw = ctx.chains.firewall.as_str();
        let comment = format!("{} loadbalancer IP", ctx.svc);
        for range in &port.load_balancer_source_ranges {
            let rule = Rule::new()
                .comment(&comment)
                .arg("-s")
                .arg(&range.to_string())
                .jump(&ctx.chains.external);
            self.service_rule(ctx, fw, rule);
        }
        // A VIP that is also a local address loops node-originated requests back with the
        // VIP as source; allow them when the ranges allow this node.
        let node_allowed = self.opts.node_ips.iter().any(|ip| {
            port.load_balancer_source_ranges
                .iter()
                .any(|range| range.contains(ip))
        });
        if node_allowed {
            for ip in &port.load_balancer_ips {
                let rule = Rule::new()
                    .comment(&comment)
                    .arg("-s")
                    .arg(&ip.to_string())
                    .jump(&ctx.chains.external);
                self.service_rule(ctx, fw, rule);
            }
        }
        let last = Rule::new()
            .comment(&format!(
                "other traffic to {} will be dropped by KUBE-PROXY-FIREWALL",
                ctx.svc
            ))
            .build();
        self.service_rule(ctx, fw, last);
    }

    fn probability(&mut self, n: usize) -> String {
        while self.probabilities.len() <= n {
            let k = self.probabilities.len().max(1);
            self.probabilities.push(format!("{:.10}", 1.0 / k as f64));
        }
        self.probabilities[n].clone()
    }

    /// KUBE-SVC-/KUBE-SVL-: affinity lookups first, then a random spread where rule i of n
    /// matches with probability 1/(n-i), giving every endpoint an equal share.
    fn endpoint_jumps(&mut self, ctx: &PortCtx<'_>, svc_chain: &str, endpoints: &[&Endpoint]) {
        let large = self.rs.large_cluster;
        let name = &ctx.plan.port.name;
        let comment = |ep: &Endpoint| {
            let r = Rule::new();
            if large {
                r
            } else {
                r.comment(&format!("{} -> {}", ctx.svc, ep.addr))
            }
        };
        if let Some(seconds) = ctx.plan.port.session_affinity_seconds {
            for ep in endpoints {
                let sep = self.names.endpoint(name, ep.addr);
                let rule = comment(ep)
                    .args(&["-m", "recent", "--name", &sep, "--rcheck", "--seconds"])
                    .arg(&seconds.to_string())
                    .arg("--reap")
                    .jump(&sep);
                self.service_rule(ctx, svc_chain, rule);
            }
        }
        let n = endpoints.len();
        for (i, ep) in endpoints.iter().enumerate() {
            let sep = self.names.endpoint(name, ep.addr);
            let mut rule = comment(ep);
            if i + 1 < n {
                let p = self.probability(n - i);
                rule = rule.args(&["-m", "statistic", "--mode", "random", "--probability", &p]);
            }
            self.service_rule(ctx, svc_chain, rule.jump(&sep));
        }
    }

    /// KUBE-SEP-: hairpin SNAT (a pod reaching itself through the service), then DNAT.
    fn endpoint_chain(&mut self, ctx: &PortCtx<'_>, ep: &Endpoint) {
        let sep = self.names.endpoint(&ctx.plan.port.name, ep.addr);
        let base = || {
            if self.rs.large_cluster {
                Rule::new()
            } else {
                Rule::new().comment(&ctx.svc)
            }
        };
        let hairpin = base()
            .arg("-s")
            .arg(&ep.addr.ip().to_string())
            .jump(chain::MARK_MASQ);
        let mut dnat = base();
        if ctx.plan.port.session_affinity_seconds.is_some() {
            dnat = dnat.args(&["-m", "recent", "--name", &sep, "--set"]);
        }
        let dnat = dnat
            .args(&["-m", ctx.proto, "-p", ctx.proto, "-j", "DNAT", "--to-destination"])
            .arg(&ep.addr.to_string())
            .build();
        self.service_rule(ctx, &sep, hairpin);
        self.service_rule(ctx, &sep, dnat);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpr_model::IpFamily;

    #[test]
    fn probabilities_are_printed_like_upstream() {
        let opts = IptablesOptions::default();
        let mut names = NameCache::default();
        let mut b = Builder {
            opts: &opts,
            mark: String::new(),
            names: &mut names,
            rs: Ruleset::default(),
            probabilities: Vec::new(),
        };
        assert_eq!(b.probability(3), "0.3333333333");
        assert_eq!(b.probability(2), "0.5000000000");
        assert_eq!(b.probability(7), "0.1428571429");
    }

    #[test]
    fn empty_state_has_only_fixed_chains() {
        let rs = build(&DesiredState::default(), &IptablesOptions::default());
        let nat: Vec<_> = rs.nat.chains().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            nat,
            [
                "KUBE-SERVICES",
                "KUBE-NODEPORTS",
                "KUBE-POSTROUTING",
                "KUBE-MARK-MASQ",
                "KUBE-PROXY-CANARY"
            ]
        );
        let tail = &rs.nat.chain("KUBE-SERVICES").unwrap().rules;
        assert_eq!(
            tail,
            &[
                r#"-m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"#
            ]
        );
        assert!(rs.filter.contains("KUBE-FIREWALL"));
        assert_eq!(rs.filter.rule_count(), 4);
    }

    #[test]
    fn ipv6_excludes_loopback_nodeports_and_has_no_localnet_rule() {
        let opts = IptablesOptions {
            family: IpFamily::V6,
            ..Default::default()
        };
        let rs = build(&DesiredState::default(), &opts);
        assert!(!rs.filter.contains("KUBE-FIREWALL"));
        let tail = &rs.nat.chain("KUBE-SERVICES").unwrap().rules[0];
        assert!(
            tail.ends_with("--dst-type LOCAL ! -d ::1/128 -j KUBE-NODEPORTS"),
            "{tail}"
        );
    }
}
