//! One Service port's entry into the ruleset: its name checked (a port that cannot be
//! written safely is refused before any of its rules exists), then the rules in the
//! fixed chains that capture its destinations (cluster IP, external IPs, load-balancer
//! IPs, NodePort) and send them to its own chains, or REJECT/DROP them.

use kpr_model::ServicePortName;
use kpr_naming::{Comment, SafeText, UnsafeText};
use kpr_state::{PortPlan, Unreachable};

use super::{Builder, PortCtx, target};
use crate::nfacct::LOCALHOST_NODEPORTS_ACCEPTED;
use crate::ruleset::{RefusedPort, Rule, RuleBuilder};

/// Which field of the service port holds the text position `error` points at, given that
/// the checked text is `namespace/name:port`.
pub fn refused_field(name: &ServicePortName, error: &UnsafeText) -> &'static str {
    let at = match error {
        UnsafeText::Control { at, .. } | UnsafeText::Quoting { at, .. } => *at,
        _ => 0,
    };
    let namespace_end = name.service.namespace.len();
    let name_end = namespace_end + 1 + name.service.name.len();
    if at < namespace_end {
        "metadata.namespace"
    } else if at < name_end {
        "metadata.name"
    } else {
        "spec.ports[].name"
    }
}

impl Builder<'_> {
    pub(super) fn service_port(&mut self, plan: &PortPlan<'_>) {
        let port = plan.port;
        // The one free-form text of a service port; everything else is typed.
        let svc = match SafeText::new(&port.name.to_string()) {
            Ok(svc) => svc,
            Err(error) => {
                self.rs.refused.push(RefusedPort {
                    port: port.name.clone(),
                    field: refused_field(&port.name, &error),
                    error,
                });
                return;
            }
        };
        let ctx = PortCtx {
            plan,
            chains: self.names.service(&port.name),
            svc,
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
                let comment = ctx.comment(" cluster IP");
                let rule = ctx.dest(Rule::builder().comment(&comment), port.cluster_ip, port.port);
                self.rs
                    .nat
                    .append(&self.fixed.services, rule.jump(ctx.internal_chain()));
            }
            Some(u) => {
                let rule = ctx.dest(
                    Rule::builder().comment(&ctx.unreachable_comment(u)),
                    port.cluster_ip,
                    port.port,
                );
                self.rs.filter.append(&self.fixed.services, rule.jump(target(u)));
            }
        }
    }

    fn capture_external_ips(&mut self, ctx: &PortCtx<'_>) {
        let port = ctx.plan.port;
        let comment = ctx.comment(" external IP");
        for ip in &port.external_ips {
            if ctx.plan.has_endpoints() {
                let rule = ctx.dest(Rule::builder().comment(&comment), *ip, port.port);
                self.rs
                    .nat
                    .append(&self.fixed.services, rule.jump(&ctx.chains.external));
            }
            if let Some(u) = ctx.plan.external_unreachable {
                let rule = ctx.dest(
                    Rule::builder().comment(&ctx.unreachable_comment(u)),
                    *ip,
                    port.port,
                );
                self.rs
                    .filter
                    .append(&self.fixed.external_services, rule.jump(target(u)));
            }
        }
    }

    fn capture_load_balancer_ips(&mut self, ctx: &PortCtx<'_>) {
        let port = ctx.plan.port;
        let comment = ctx.comment(" loadbalancer IP");
        let not_accepted = Comment::build()
            .text(&ctx.svc)
            .literal(" traffic not accepted by ")
            .object_name(ctx.chains.firewall.as_str())
            .finish();
        for ip in &port.load_balancer_ips {
            if ctx.plan.has_endpoints() {
                let rule = ctx.dest(Rule::builder().comment(&comment), *ip, port.port);
                self.rs
                    .nat
                    .append(&self.fixed.services, rule.jump(ctx.load_balancer_chain()));
            }
            if ctx.plan.uses_firewall_chain {
                let rule = ctx.dest(Rule::builder().comment(&not_accepted), *ip, port.port);
                self.rs
                    .filter
                    .append(&self.fixed.proxy_firewall, rule.jump("DROP"));
            }
        }
        if let Some(u) = ctx.plan.external_unreachable {
            for ip in &port.load_balancer_ips {
                let rule = ctx.dest(
                    Rule::builder().comment(&ctx.unreachable_comment(u)),
                    *ip,
                    port.port,
                );
                self.rs
                    .filter
                    .append(&self.fixed.external_services, rule.jump(target(u)));
            }
        }
    }

    fn capture_node_port(&mut self, ctx: &PortCtx<'_>) {
        let Some(node_port) = ctx.plan.port.node_port else {
            return;
        };
        let proto_port = |rule: RuleBuilder| {
            rule.args(&["-m", ctx.proto, "-p", ctx.proto, "--dport"])
                .arg(node_port)
        };
        if ctx.plan.has_endpoints() {
            if self.opts.localhost_nodeports_enabled() && self.opts.nfacct.localhost_nodeports_accepted {
                // The same jump for 127.0.0.0/8 first, only to count it for
                // kubeproxy_iptables_localhost_nodeports_accepted_packets_total.
                let rule = Rule::builder()
                    .comment(&ctx.svc_comment())
                    .args(&["-m", ctx.proto, "-p", ctx.proto, "-d", "127.0.0.0/8", "--dport"])
                    .arg(node_port)
                    .args(&["-m", "nfacct", "--nfacct-name", LOCALHOST_NODEPORTS_ACCEPTED]);
                self.rs
                    .nat
                    .append(&self.fixed.nodeports, rule.jump(&ctx.chains.external));
            }
            // NodePorts are not subject to loadBalancerSourceRanges, as upstream.
            let rule = proto_port(Rule::builder().comment(&ctx.svc_comment()));
            self.rs
                .nat
                .append(&self.fixed.nodeports, rule.jump(&ctx.chains.external));
        }
        if let Some(u) = ctx.plan.external_unreachable {
            let rule = proto_port(Rule::builder().comment(&ctx.unreachable_comment(u)).args(&[
                "-m",
                "addrtype",
                "--dst-type",
                "LOCAL",
            ]));
            self.rs
                .filter
                .append(&self.fixed.external_services, rule.jump(target(u)));
        }
    }

    fn accept_health_check_node_port(&mut self, ctx: &PortCtx<'_>) {
        let Some(hc) = ctx.plan.port.health_check_node_port else {
            return;
        };
        let rule = Rule::builder()
            .comment(&ctx.comment(" health check node port"))
            .args(&["-m", "tcp", "-p", "tcp", "--dport"])
            .arg(hc)
            .jump("ACCEPT");
        self.rs.filter.append(&self.fixed.nodeports, rule);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpr_model::Protocol;

    #[test]
    fn refused_text_points_at_its_field() {
        let name = |ns: &str, n: &str, p: &str| ServicePortName::new(ns, n, p, Protocol::Tcp);
        let check = |name: &ServicePortName| {
            let error = SafeText::new(&name.to_string()).unwrap_err();
            refused_field(name, &error)
        };
        assert_eq!(check(&name("de\nfault", "web", "http")), "metadata.namespace");
        assert_eq!(check(&name("-x", "web", "http")), "metadata.namespace");
        assert_eq!(check(&name("default", "evil\n-A X", "http")), "metadata.name");
        assert_eq!(check(&name("default", "web", "ht\"tp")), "spec.ports[].name");
    }
}
