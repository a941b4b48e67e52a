//! Rule generation: the desired state, the options and this host's addresses in, the
//! complete ruleset out.
//!
//! A pure function with upstream kube-proxy's (1.28+) chain structure and rule shapes, so
//! that `iptables-save` on a node looks the same whichever proxy wrote it, and the two can
//! take over from each other. The per-service decisions (which endpoints, REJECT or DROP,
//! which chains) come from kpr-state's `PortPlan`; this module only spells them as rules.
//!
//! Every argument is a literal of this file, a typed value (address, port, chain name) or
//! text checked by kpr-naming (see `ruleset::Arg`). A service port whose name cannot be
//! written safely is left out whole, before any of its rules is written, and listed in
//! [`Ruleset::refused`].

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use kpr_model::{Endpoint, NamespacedName, ServicePortName};
use kpr_naming::{ChainName, Comment, SafeText, ServiceChains, UnsafeText, chain};
use kpr_state::{DesiredState, PortPlan, Unreachable};

use crate::names::NameCache;
use crate::nfacct::{CT_STATE_INVALID_DROPPED, LOCALHOST_NODEPORTS_ACCEPTED};
use kpr_host::NodePortTargets;

use crate::options::{IptablesOptions, LocalMatch};
use crate::ruleset::{Arg, ChainKind, RefusedPort, Rule, RuleBuilder, Ruleset};

/// Comment of the last rule of nat KUBE-SERVICES.
const NODEPORTS_TAIL_COMMENT: &str =
    "kubernetes service nodeports; NOTE: this must be the last rule in this chain";
/// Comment of the KUBE-FIREWALL rule that closes the hole route_localnet opens.
pub(crate) const LOCALNET_COMMENT: &str = "block incoming localnet connections";

/// The complete ruleset for `state`. `local_addresses` are this host's addresses of the
/// proxier's family, read before the sync (used when `--nodeport-addresses` narrows the
/// addresses that accept NodePorts).
pub fn build(state: &DesiredState, opts: &IptablesOptions, local_addresses: &[IpAddr]) -> Ruleset {
    build_with_cache(state, opts, local_addresses, &mut NameCache::default())
}

/// Like [`build`], reusing chain names computed by earlier builds.
pub fn build_with_cache(
    state: &DesiredState,
    opts: &IptablesOptions,
    local_addresses: &[IpAddr],
    names: &mut NameCache,
) -> Ruleset {
    names.begin();
    let ports = state.ports();
    let total_endpoints: usize = ports.iter().map(|p| state.endpoints(p).len()).sum();
    let mut b = Builder {
        opts,
        mark: Mark(opts.masquerade_mark_value()),
        names,
        rs: Ruleset {
            large_cluster: total_endpoints > opts.large_cluster_endpoints_threshold,
            ..Ruleset::default()
        },
        probabilities: Vec::new(),
        fixed: Fixed::new(),
        node_ip: opts.primary_node_ip(&state.node.addresses),
        local_addresses,
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
pub fn render_dry_run(state: &DesiredState, opts: &IptablesOptions, local_addresses: &[IpAddr]) -> String {
    build(state, opts, local_addresses).render_full().text
}

fn target(u: Unreachable) -> &'static str {
    match u {
        Unreachable::Reject => "REJECT",
        Unreachable::Drop => "DROP",
    }
}

/// The masquerade mark, spelled as upstream writes it (`0x00004000`).
#[derive(Clone, Copy, Debug)]
pub struct Mark(pub u32);

impl crate::ruleset::sealed::Sealed for Mark {}

impl Arg for Mark {
    fn push_to(&self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = write!(out, "{:#010x}", self.0);
    }
}

/// `<mark>/<mark>`: the mark match with its mask.
pub struct MarkWithMask(pub Mark);

impl crate::ruleset::sealed::Sealed for MarkWithMask {}

impl Arg for MarkWithMask {
    fn push_to(&self, out: &mut String) {
        self.0.push_to(out);
        out.push('/');
        self.0.push_to(out);
    }
}

/// `1/n` with ten decimals, as upstream prints it.
#[derive(Clone, Debug)]
struct Probability(Box<str>);

impl crate::ruleset::sealed::Sealed for Probability {}

impl Arg for Probability {
    fn push_to(&self, out: &mut String) {
        out.push_str(&self.0);
    }
}

/// The fixed chains, named once per build.
struct Fixed {
    services: ChainName,
    external_services: ChainName,
    nodeports: ChainName,
    postrouting: ChainName,
    mark_masq: ChainName,
    forward: ChainName,
    proxy_firewall: ChainName,
    firewall: ChainName,
    canary: ChainName,
}

impl Fixed {
    fn new() -> Self {
        Self {
            services: ChainName::fixed(chain::SERVICES),
            external_services: ChainName::fixed(chain::EXTERNAL_SERVICES),
            nodeports: ChainName::fixed(chain::NODEPORTS),
            postrouting: ChainName::fixed(chain::POSTROUTING),
            mark_masq: ChainName::fixed(chain::MARK_MASQ),
            forward: ChainName::fixed(chain::FORWARD),
            proxy_firewall: ChainName::fixed(chain::PROXY_FIREWALL),
            firewall: ChainName::fixed(chain::FIREWALL),
            canary: ChainName::fixed(chain::CANARY),
        }
    }
}

struct Builder<'a> {
    opts: &'a IptablesOptions,
    mark: Mark,
    names: &'a mut NameCache,
    rs: Ruleset,
    /// `probabilities[n]` = 1/n as upstream prints it.
    probabilities: Vec<Probability>,
    fixed: Fixed,
    /// Upstream's `proxier.nodeIP` for this family.
    node_ip: IpAddr,
    local_addresses: &'a [IpAddr],
}

/// What every rule of one service port needs to know.
struct PortCtx<'p> {
    plan: &'p PortPlan<'p>,
    chains: Arc<ServiceChains>,
    /// `ns/name:port`, as upstream puts it in comments; checked.
    svc: SafeText,
    proto: &'static str,
    owner: NamespacedName,
}

impl PortCtx<'_> {
    /// `-m <proto> -p <proto> -d <ip> --dport <port>` for a destination of this port.
    fn dest(&self, rule: RuleBuilder, ip: IpAddr, port: u16) -> RuleBuilder {
        rule.args(&["-m", self.proto, "-p", self.proto, "-d"])
            .arg(ip)
            .arg("--dport")
            .arg(port)
    }

    /// `<ns/name:port>`.
    fn svc_comment(&self) -> Comment {
        Comment::build().text(&self.svc).finish()
    }

    /// `<ns/name:port><suffix>`.
    fn comment(&self, suffix: &'static str) -> Comment {
        Comment::build().text(&self.svc).literal(suffix).finish()
    }

    /// `<prefix><ns/name:port><suffix>`.
    fn comment_around(&self, prefix: &'static str, suffix: &'static str) -> Comment {
        Comment::build()
            .literal(prefix)
            .text(&self.svc)
            .literal(suffix)
            .finish()
    }

    fn endpoint_comment(&self, endpoint: SocketAddr) -> Comment {
        Comment::build()
            .text(&self.svc)
            .literal(" -> ")
            .endpoint(endpoint)
            .finish()
    }

    fn unreachable_comment(&self, u: Unreachable) -> Comment {
        Comment::build()
            .text(&self.svc)
            .literal(" ")
            .literal(u.comment_suffix())
            .finish()
    }

    fn internal_chain(&self) -> &ChainName {
        if self.plan.port.internal_policy_local {
            &self.chains.local
        } else {
            &self.chains.cluster
        }
    }

    fn external_policy_chain(&self) -> &ChainName {
        if self.plan.port.external_policy_local {
            &self.chains.local
        } else {
            &self.chains.cluster
        }
    }

    fn load_balancer_chain(&self) -> &ChainName {
        if self.plan.uses_firewall_chain {
            &self.chains.firewall
        } else {
            &self.chains.external
        }
    }
}

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
    // === fixed chains ===

    fn fixed_chains(&mut self) {
        for name in [
            &self.fixed.services,
            &self.fixed.external_services,
            &self.fixed.forward,
            &self.fixed.nodeports,
            &self.fixed.proxy_firewall,
        ] {
            self.rs.filter.declare(name, ChainKind::Fixed);
        }
        if self.opts.localhost_nodeports_enabled() {
            self.localnet_firewall();
        }
        for name in [
            &self.fixed.services,
            &self.fixed.nodeports,
            &self.fixed.postrouting,
            &self.fixed.mark_masq,
        ] {
            self.rs.nat.declare(name, ChainKind::Fixed);
        }
        self.rs.filter.declare(&self.fixed.canary, ChainKind::Canary);
        self.rs.nat.declare(&self.fixed.canary, ChainKind::Canary);
        self.masquerade_chains();
    }

    /// route_localnet lets packets to 127.0.0.0/8 arrive from outside; this rule (which
    /// kubelet writes identically) drops them unless they are replies or were DNATed.
    fn localnet_firewall(&mut self) {
        let rule = Rule::builder()
            .comment(&Comment::build().literal(LOCALNET_COMMENT).finish())
            .args(&["-d", "127.0.0.0/8", "!", "-s", "127.0.0.0/8"])
            .args(&["-m", "conntrack", "!", "--ctstate", "RELATED,ESTABLISHED,DNAT"])
            .jump("DROP");
        self.rs.filter.declare(&self.fixed.firewall, ChainKind::Fixed);
        self.rs.filter.append(&self.fixed.firewall, rule);
    }

    fn masquerade_chains(&mut self) {
        let mark = self.mark;
        let nat = &mut self.rs.nat;
        let postrouting = &self.fixed.postrouting;
        nat.append(
            postrouting,
            Rule::builder()
                .args(&["-m", "mark", "!", "--mark"])
                .arg(MarkWithMask(mark))
                .jump("RETURN"),
        );
        // Clear the mark so a packet that traverses the stack again is not SNATed twice.
        nat.append(
            postrouting,
            Rule::builder()
                .args(&["-j", "MARK", "--xor-mark"])
                .arg(mark)
                .build(),
        );
        let mut masq = Rule::builder()
            .comment(
                &Comment::build()
                    .literal("kubernetes service traffic requiring SNAT")
                    .finish(),
            )
            .args(&["-j", "MASQUERADE"]);
        if self.opts.masquerade_random_fully {
            masq = masq.arg("--random-fully");
        }
        nat.append(postrouting, masq.build());
        nat.append(
            &self.fixed.mark_masq,
            Rule::builder()
                .args(&["-j", "MARK", "--or-mark"])
                .arg(mark)
                .build(),
        );
    }

    fn nodeports_tail(&mut self) {
        let opts = self.opts;
        let comment = Comment::build().literal(NODEPORTS_TAIL_COMMENT).finish();
        let rule = || Rule::builder().comment(&comment);
        match opts.nodeport_addresses.targets(opts.family, self.local_addresses) {
            NodePortTargets::AllLocal => {
                let mut r = rule().args(&["-m", "addrtype", "--dst-type", "LOCAL"]);
                // Localhost NodePorts never work on IPv6, and on IPv4 only with route_localnet.
                if !opts.localhost_nodeports_enabled() {
                    r = r.args(&["!", "-d", opts.loopback_cidr()]);
                }
                self.rs.nat.append(&self.fixed.services, r.jump(chain::NODEPORTS));
            }
            NodePortTargets::Ips(ips) => {
                for ip in ips {
                    if ip.is_loopback() && !opts.localhost_nodeports_enabled() {
                        continue;
                    }
                    let r = rule().arg("-d").arg(ip);
                    self.rs.nat.append(&self.fixed.services, r.jump(chain::NODEPORTS));
                }
            }
        }
    }

    fn forward_rules(&mut self) {
        let masked = MarkWithMask(self.mark);
        let filter = &mut self.rs.filter;
        let forward = &self.fixed.forward;
        // INVALID packets would otherwise reach pods un-NATed and reset connections; with
        // nf_conntrack_tcp_be_liberal the kernel marks only out-of-window RSTs INVALID, and
        // upstream then leaves the rule out.
        if !self.opts.conntrack_tcp_be_liberal {
            let mut drop = Rule::builder().args(&["-m", "conntrack", "--ctstate", "INVALID"]);
            // Counted for kubeproxy_iptables_ct_state_invalid_dropped_packets_total.
            if self.opts.nfacct.ct_state_invalid_dropped {
                drop = drop.args(&["-m", "nfacct", "--nfacct-name", CT_STATE_INVALID_DROPPED]);
            }
            filter.append(forward, drop.jump("DROP"));
        }
        // Service traffic is forwarded even when the FORWARD policy is DROP.
        filter.append(
            forward,
            Rule::builder()
                .comment(&Comment::build().literal("kubernetes forwarding rules").finish())
                .args(&["-m", "mark", "--mark"])
                .arg(masked)
                .jump("ACCEPT"),
        );
        filter.append(
            forward,
            Rule::builder()
                .comment(
                    &Comment::build()
                        .literal("kubernetes forwarding conntrack rule")
                        .finish(),
                )
                .args(&["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED"])
                .jump("ACCEPT"),
        );
    }

    // === per service port ===

    fn service_port(&mut self, plan: &PortPlan<'_>) {
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

    fn service_rule(&mut self, ctx: &PortCtx<'_>, chain: &ChainName, rule: Rule) {
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
    fn external_chain(&mut self, ctx: &PortCtx<'_>) {
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
    fn firewall_chain(&mut self, ctx: &PortCtx<'_>) {
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
    fn endpoint_jumps(&mut self, ctx: &PortCtx<'_>, svc_chain: &ChainName, endpoints: &[&Endpoint]) {
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
    fn endpoint_chain(&mut self, ctx: &PortCtx<'_>, ep: &Endpoint) {
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
    use kpr_model::{IpFamily, Protocol};

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

    #[test]
    fn mark_is_written_as_options_spell_it() {
        let opts = IptablesOptions::default();
        let rule = Rule::builder()
            .arg(Mark(opts.masquerade_mark_value()))
            .arg(MarkWithMask(Mark(opts.masquerade_mark_value())))
            .build();
        let mark = opts.masquerade_mark();
        assert_eq!(rule.restore_text(), format!("{mark} {mark}/{mark}"));
    }

    fn restore_lines(rules: &[Rule]) -> Vec<String> {
        rules.iter().map(Rule::restore_text).collect()
    }

    #[test]
    fn empty_state_has_only_fixed_chains() {
        let rs = build(&DesiredState::default(), &IptablesOptions::default(), &[]);
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
            restore_lines(tail),
            [
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
        let rs = build(&DesiredState::default(), &opts, &[]);
        assert!(!rs.filter.contains("KUBE-FIREWALL"));
        let tail = rs.nat.chain("KUBE-SERVICES").unwrap().rules[0].restore_text();
        assert!(
            tail.ends_with("--dst-type LOCAL ! -d ::1/128 -j KUBE-NODEPORTS"),
            "{tail}"
        );
    }

    /// Upstream leaves the INVALID drop out when nf_conntrack_tcp_be_liberal is set.
    #[test]
    fn tcp_be_liberal_leaves_out_the_invalid_drop() {
        let invalid_drop = "-m conntrack --ctstate INVALID -j DROP";
        let forward = |opts: &IptablesOptions| {
            let rs = build(&DesiredState::default(), opts, &[]);
            restore_lines(&rs.filter.chain("KUBE-FORWARD").unwrap().rules)
        };
        let strict = forward(&IptablesOptions::default());
        assert_eq!(strict[0], invalid_drop);
        assert_eq!(strict.len(), 3);
        let liberal = forward(&IptablesOptions {
            conntrack_tcp_be_liberal: true,
            ..Default::default()
        });
        assert_eq!(liberal.len(), 2);
        assert!(liberal.iter().all(|r| r != invalid_drop), "{liberal:?}");
    }

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
