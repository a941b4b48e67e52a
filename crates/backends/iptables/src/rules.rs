//! Rule generation: the desired state, the options and this host's addresses in, the
//! complete ruleset out.
//!
//! A pure function with upstream kube-proxy's (1.28+) chain structure and rule shapes, so
//! that `iptables-save` on a node looks the same whichever proxy wrote it, and the two can
//! take over from each other. The per-service decisions (which endpoints, REJECT or DROP,
//! which chains) come from kpr-state's `PortPlan`; this module only spells them as rules.
//!
//! Every argument is a literal of this module, a typed value (address, port, chain name) or
//! text checked by kpr-naming (see `ruleset::Arg`). A service port whose name cannot be
//! written safely is left out whole, before any of its rules is written, and listed in
//! [`Ruleset::refused`].
//!
//! The ruleset is written in steps, one module each: `fixed` writes the chains every
//! ruleset has (once per build), `port` checks a Service port's name and captures its
//! destinations in the fixed chains, `service_chains` writes the port's own chains
//! (KUBE-SVC-/SVL-/EXT-/FW-/SEP-). `mark` spells the masquerade mark. They share the
//! `Builder` and, per port, the `PortCtx` defined here.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use kpr_model::NamespacedName;
use kpr_naming::{ChainName, Comment, SafeText, ServiceChains, chain};
use kpr_state::{DesiredState, PortPlan, Unreachable};

use crate::names::NameCache;
use crate::options::IptablesOptions;
use crate::ruleset::{RuleBuilder, Ruleset};

mod fixed;
mod mark;
mod port;
mod service_chains;

pub(crate) use fixed::LOCALNET_COMMENT;
pub use mark::{Mark, MarkWithMask};
pub use port::refused_field;
use service_chains::Probability;

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
