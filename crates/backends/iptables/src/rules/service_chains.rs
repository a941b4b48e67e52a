//! A Service port's own chains: KUBE-EXT- and KUBE-FW- (external traffic and its source
//! ranges), KUBE-SVC-/KUBE-SVL- (the spread over endpoints) and one KUBE-SEP- per
//! endpoint (the DNAT). Each is declared only when the port's plan uses it.

use kpr_model::Endpoint;
use kpr_naming::{ChainName, chain};

use super::{Builder, PortCtx};
use crate::options::LocalMatch;
use crate::ruleset::{Arg, ChainKind, Rule};

/// `1/n` with ten decimals, as upstream prints it.
#[derive(Clone, Debug)]
pub(super) struct Probability(Box<str>);

impl crate::ruleset::sealed::Sealed for Probability {}

impl Arg for Probability {
    fn push_to(&self, out: &mut String) {
        out.push_str(&self.0);
    }
}

impl Builder<'_> {
    /// Declares the service's chains in upstream's order, so each exists even if empty.
    pub(super) fn declare_service_chains(&mut self, ctx: &PortCtx<'_>) {
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

    fn service_rule(&mut self, ctx: &PortCtx<'_>, chain: &ChainName, rule: Rule) {
        self.rs.nat.declare(chain, ChainKind::Service(ctx.owner.clone()));
        self.rs.nat.append(chain, rule);
    }

    /// Masquerades cluster-IP traffic from outside the pod network (e.g. a static route to
    /// the service range via any node), or everything with masquerade_all.
    pub(super) fn internal_masquerade(&mut self, ctx: &PortCtx<'_>) {
        if ctx.plan.internal_unreachable.is_some() {
            return;
        }
        let port = ctx.plan.port;
        let base = ctx.dest(
            Rule::builder().comment(&ctx.comment(" cluster IP")),
            port.cluster_ip,
            port.port,
        );
        let rule = if self.opts.masquerade_all {
            base.jump(chain::MARK_MASQ)
        } else if let Some(not_local) = self
            .opts
            .local_detector
            .append_match(base, self.opts.family, true)
        {
            not_local.jump(chain::MARK_MASQ)
        } else {
            return;
        };
        self.service_rule(ctx, ctx.internal_chain(), rule);
    }

    /// KUBE-EXT-: the entry for NodePort, external-IP and load-balancer traffic.
    pub(super) fn external_chain(&mut self, ctx: &PortCtx<'_>) {
        let plan = ctx.plan;
        if !plan.uses_external_chain {
            return;
        }
        let ext = &ctx.chains.external;
        if !plan.port.external_policy_local {
            // Endpoints may be on other nodes: SNAT so replies come back through us.
            let rule = Rule::builder()
                .comment(&ctx.comment_around("masquerade traffic for ", " external destinations"))
                .jump(chain::MARK_MASQ);
            self.service_rule(ctx, ext, rule);
        } else if plan.uses_cluster_chain {
            self.external_local_short_circuits(ctx);
        }
        if plan.external_unreachable.is_none() {
            self.service_rule(ctx, ext, Rule::builder().jump(ctx.external_policy_chain()));
        }
    }

    /// With externalTrafficPolicy Local, traffic from pods and from the node itself is sent
    /// to the cluster-wide chain, as if it had gone out to the load balancer and come back.
    /// (Skipped when the service has no cluster-wide chain to send it to.)
    fn external_local_short_circuits(&mut self, ctx: &PortCtx<'_>) {
        let ext = &ctx.chains.external;
        let cluster = &ctx.chains.cluster;
        let pod_traffic =
            Rule::builder().comment(&ctx.comment_around("pod traffic for ", " external destinations"));
        if let Some(local) = self
            .opts
            .local_detector
            .append_match(pod_traffic, self.opts.family, false)
        {
            self.service_rule(ctx, ext, local.jump(cluster));
        }
        // Host-originated traffic gets the (local) VIP as source: it must be SNATed.
        let masq = Rule::builder()
            .comment(&ctx.comment_around("masquerade LOCAL traffic for ", " external destinations"))
            .args(&["-m", "addrtype", "--src-type", "LOCAL"])
            .jump(chain::MARK_MASQ);
        self.service_rule(ctx, ext, masq);
        let route = Rule::builder()
            .comment(&ctx.comment_around("route LOCAL traffic for ", " external destinations"))
            .args(&["-m", "addrtype", "--src-type", "LOCAL"])
            .jump(cluster);
        self.service_rule(ctx, ext, route);
    }

    /// KUBE-FW-: loadBalancerSourceRanges. Allowed sources go on to KUBE-EXT-; the rest
    /// falls through un-DNATed and is dropped by filter KUBE-PROXY-FIREWALL.
    pub(super) fn firewall_chain(&mut self, ctx: &PortCtx<'_>) {
        if !ctx.plan.uses_firewall_chain {
            return;
        }
        let port = ctx.plan.port;
        let fw = &ctx.chains.firewall;
        let comment = ctx.comment(" loadbalancer IP");
        for range in &port.load_balancer_source_ranges {
            let rule = Rule::builder()
                .comment(&comment)
                .arg("-s")
                .arg(*range)
                .jump(&ctx.chains.external);
            self.service_rule(ctx, fw, rule);
        }
        // A VIP that is also a local address loops node-originated requests back with the
        // VIP as source; allow them when the ranges allow this node's primary IP (upstream's
        // `proxier.nodeIP`, not every local address).
        let node_allowed = port
            .load_balancer_source_ranges
            .iter()
            .any(|range| range.contains(&self.node_ip));
        if node_allowed {
            for ip in &port.load_balancer_ips {
                let rule = Rule::builder()
                    .comment(&comment)
                    .arg("-s")
                    .arg(*ip)
                    .jump(&ctx.chains.external);
                self.service_rule(ctx, fw, rule);
            }
        }
        let last = Rule::builder()
            .comment(&ctx.comment_around("other traffic to ", " will be dropped by KUBE-PROXY-FIREWALL"))
            .build();
        self.service_rule(ctx, fw, last);
    }

    fn probability(&mut self, n: usize) -> Probability {
        while self.probabilities.len() <= n {
            let k = self.probabilities.len().max(1);
            let text = format!("{:.10}", 1.0 / k as f64);
            self.probabilities.push(Probability(text.into_boxed_str()));
        }
        self.probabilities[n].clone()
    }

    /// KUBE-SVC-/KUBE-SVL-: affinity lookups first, then a random spread where rule i of n
    /// matches with probability 1/(n-i), giving every endpoint an equal share.
    pub(super) fn endpoint_jumps(
        &mut self,
        ctx: &PortCtx<'_>,
        svc_chain: &ChainName,
        endpoints: &[&Endpoint],
    ) {
        let large = self.rs.large_cluster;
        let name = &ctx.plan.port.name;
        let comment = |ep: &Endpoint| {
            let r = Rule::builder();
            if large {
                r
            } else {
                r.comment(&ctx.endpoint_comment(ep.addr))
            }
        };
        if let Some(seconds) = ctx.plan.port.session_affinity_seconds {
            for ep in endpoints {
                let sep = self.names.endpoint(name, ep.addr);
                let rule = comment(ep)
                    .args(&["-m", "recent", "--name"])
                    .arg(&sep)
                    .args(&["--rcheck", "--seconds"])
                    .arg(seconds)
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
                rule = rule
                    .args(&["-m", "statistic", "--mode", "random", "--probability"])
                    .arg(p);
            }
            self.service_rule(ctx, svc_chain, rule.jump(&sep));
        }
    }

    /// KUBE-SEP-: hairpin SNAT (a pod reaching itself through the service), then DNAT.
    pub(super) fn endpoint_chain(&mut self, ctx: &PortCtx<'_>, ep: &Endpoint) {
        let sep = self.names.endpoint(&ctx.plan.port.name, ep.addr);
        let svc_comment = (!self.rs.large_cluster).then(|| ctx.svc_comment());
        let base = || match &svc_comment {
            Some(comment) => Rule::builder().comment(comment),
            None => Rule::builder(),
        };
        let hairpin = base().arg("-s").arg(ep.addr.ip()).jump(chain::MARK_MASQ);
        let mut dnat = base();
        if ctx.plan.port.session_affinity_seconds.is_some() {
            dnat = dnat.args(&["-m", "recent", "--name"]).arg(&sep).arg("--set");
        }
        let dnat = dnat
            .args(&["-m", ctx.proto, "-p", ctx.proto, "-j", "DNAT", "--to-destination"])
            .arg(ep.addr)
            .build();
        self.service_rule(ctx, &sep, hairpin);
        self.service_rule(ctx, &sep, dnat);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::NameCache;
    use crate::options::IptablesOptions;
    use crate::rules::{Fixed, Mark};
    use crate::ruleset::Ruleset;

    fn builder_parts() -> (IptablesOptions, NameCache) {
        (IptablesOptions::default(), NameCache::default())
    }

    #[test]
    fn probabilities_are_printed_like_upstream() {
        let (opts, mut names) = builder_parts();
        let mut b = Builder {
            opts: &opts,
            mark: Mark(0),
            names: &mut names,
            rs: Ruleset::default(),
            probabilities: Vec::new(),
            fixed: Fixed::new(),
            node_ip: opts.loopback(),
            local_addresses: &[],
        };
        assert_eq!(&*b.probability(3).0, "0.3333333333");
        assert_eq!(&*b.probability(2).0, "0.5000000000");
        assert_eq!(&*b.probability(7).0, "0.1428571429");
    }
}
