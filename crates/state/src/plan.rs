//! Per-service-port decisions shared by every mode.

use kpr_model::{Endpoint, NodeView, ServicePort};

use crate::topology::{Categorized, categorize};

/// What to do with traffic that has no endpoint to go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unreachable {
    /// No usable endpoint anywhere: refuse at once (ICMP port unreachable -> ECONNREFUSED).
    Reject,
    /// Endpoints exist, but none on this node for a Local policy: drop silently, so a
    /// load balancer's health check, not the client, finds out.
    Drop,
}

impl Unreachable {
    pub fn comment_suffix(self) -> &'static str {
        match self {
            Self::Reject => "has no endpoints",
            Self::Drop => "has no local endpoints",
        }
    }
}

/// Upstream's per-service-port preamble, computed once for any mode.
#[derive(Debug)]
pub struct PortPlan<'a> {
    pub port: &'a ServicePort,
    pub endpoints: Categorized<'a>,
    /// Traffic to the cluster IP: `None` when it has endpoints, else what to do with it.
    pub internal_unreachable: Option<Unreachable>,
    /// Traffic to NodePorts, external IPs and load-balancer IPs.
    pub external_unreachable: Option<Unreachable>,
    /// The cluster-policy chain (KUBE-SVC-) is needed.
    pub uses_cluster_chain: bool,
    /// The local-policy chain (KUBE-SVL-) is needed.
    pub uses_local_chain: bool,
    /// The external entry chain (KUBE-EXT-) is needed. It exists whenever there are any
    /// endpoints, even with none usable for external traffic, because it also carries the
    /// short-circuit rules for pod and host traffic.
    pub uses_external_chain: bool,
    /// The load-balancer source-range chain (KUBE-FW-) is needed.
    pub uses_firewall_chain: bool,
}

impl<'a> PortPlan<'a> {
    pub fn new(port: &'a ServicePort, endpoints: &'a [Endpoint], node: &NodeView) -> Self {
        let endpoints = categorize(port, endpoints, node);
        let has_any = endpoints.has_any;
        let has_local = !endpoints.local.is_empty();
        let narrowed = |local_policy: bool| match (has_any, local_policy && !has_local) {
            (false, _) => Some(Unreachable::Reject),
            (true, true) => Some(Unreachable::Drop),
            (true, false) => None,
        };
        Self {
            internal_unreachable: narrowed(port.internal_policy_local),
            external_unreachable: narrowed(port.external_policy_local),
            uses_cluster_chain: !endpoints.cluster.is_empty() && port.uses_cluster_endpoints(),
            uses_local_chain: has_local && port.uses_local_endpoints(),
            uses_external_chain: has_any && port.externally_accessible(),
            uses_firewall_chain: has_any
                && !port.load_balancer_ips.is_empty()
                && !port.load_balancer_source_ranges.is_empty(),
            port,
            endpoints,
        }
    }

    pub fn has_endpoints(&self) -> bool {
        self.endpoints.has_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::tests::{ep, node, port};
    use serde_json::json;

    #[test]
    fn no_endpoints_rejects_everything() {
        let p = port(json!({"type": "NodePort"}));
        let plan = PortPlan::new(&p, &[], &node(None));
        assert_eq!(plan.internal_unreachable, Some(Unreachable::Reject));
        assert_eq!(plan.external_unreachable, Some(Unreachable::Reject));
        assert!(!plan.uses_cluster_chain && !plan.uses_external_chain);
    }

    #[test]
    fn external_local_without_local_endpoints_drops_external_only() {
        let p = port(json!({"type": "NodePort", "externalTrafficPolicy": "Local"}));
        let eps = [ep("10.0.0.2 ready")];
        let plan = PortPlan::new(&p, &eps, &node(None));
        assert_eq!(plan.internal_unreachable, None);
        assert_eq!(plan.external_unreachable, Some(Unreachable::Drop));
        assert!(plan.uses_cluster_chain);
        assert!(!plan.uses_local_chain);
        assert!(
            plan.uses_external_chain,
            "EXT chain still short-circuits pod and host traffic"
        );
    }

    /// With both policies Local, the cluster chain is still needed: the EXT chain sends pod
    /// and host traffic for external addresses there (upstream's `UsesClusterEndpoints`).
    #[test]
    fn both_policies_local_keep_the_cluster_chain_for_short_circuits() {
        let p = port(
            json!({"type": "NodePort", "internalTrafficPolicy": "Local", "externalTrafficPolicy": "Local"}),
        );
        let eps = [ep("10.0.0.1 ready local"), ep("10.0.0.2 ready")];
        let plan = PortPlan::new(&p, &eps, &node(None));
        assert_eq!(plan.internal_unreachable, None);
        assert_eq!(plan.external_unreachable, None);
        assert!(plan.uses_local_chain && plan.uses_external_chain);
        assert!(
            plan.uses_cluster_chain,
            "pod/host traffic to the NodePort goes to every endpoint"
        );
        // No local endpoint: both kinds of traffic from outside are dropped, but the
        // cluster chain still serves the short-circuit.
        let remote = [ep("10.0.0.2 ready")];
        let plan = PortPlan::new(&p, &remote, &node(None));
        assert_eq!(plan.internal_unreachable, Some(Unreachable::Drop));
        assert_eq!(plan.external_unreachable, Some(Unreachable::Drop));
        assert!(plan.uses_cluster_chain && !plan.uses_local_chain);
    }

    /// Load-balancer ingress IPs make any Service type externally reachable, as upstream.
    #[test]
    fn ingress_ips_on_a_cluster_ip_service_need_the_external_chain() {
        let mut p = port(json!({"type": "ClusterIP"}));
        let eps = [ep("10.0.0.2 ready")];
        assert!(!PortPlan::new(&p, &eps, &node(None)).uses_external_chain);
        p.load_balancer_ips.push("203.0.113.1".parse().unwrap());
        assert!(PortPlan::new(&p, &eps, &node(None)).uses_external_chain);
    }

    #[test]
    fn firewall_chain_needs_lb_ips_and_source_ranges() {
        let mut p = port(json!({"type": "LoadBalancer", "loadBalancerSourceRanges": ["192.0.2.0/24"]}));
        let eps = [ep("10.0.0.2 ready")];
        assert!(!PortPlan::new(&p, &eps, &node(None)).uses_firewall_chain);
        p.load_balancer_ips.push("203.0.113.1".parse().unwrap());
        assert!(PortPlan::new(&p, &eps, &node(None)).uses_firewall_chain);
    }
}
