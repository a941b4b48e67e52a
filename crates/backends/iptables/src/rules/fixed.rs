//! The fixed chains (KUBE-SERVICES, KUBE-NODEPORTS, KUBE-POSTROUTING, KUBE-FORWARD, ...):
//! declared and filled once per build, before and after the Service ports, whatever the
//! Services are; their names are upstream's, so the two proxies can take over from each
//! other.

use kpr_naming::{Comment, chain};

use super::{Builder, MarkWithMask};
use crate::nfacct::CT_STATE_INVALID_DROPPED;
use crate::ruleset::{ChainKind, Rule};
use kpr_host::NodePortTargets;

/// Comment of the last rule of nat KUBE-SERVICES.
const NODEPORTS_TAIL_COMMENT: &str =
    "kubernetes service nodeports; NOTE: this must be the last rule in this chain";
/// Comment of the KUBE-FIREWALL rule that closes the hole route_localnet opens.
pub(crate) const LOCALNET_COMMENT: &str = "block incoming localnet connections";

impl Builder<'_> {
    pub(super) fn fixed_chains(&mut self) {
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

    pub(super) fn nodeports_tail(&mut self) {
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

    pub(super) fn forward_rules(&mut self) {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::IptablesOptions;
    use crate::rules::build;
    use kpr_model::IpFamily;
    use kpr_state::DesiredState;

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
}
