//! A chosen few of upstream's e2e scenarios in ipvs mode, played one after the other in one
//! guest: a guest per scenario would cost a minute each (see [`crate::mode`]). They are the
//! ones where ipvs mode's own mechanism is at stake: a virtual server without real
//! servers, UDP flows and IPVS's own connection table when a pod cycles, the iptables rule
//! that drops INVALID packets, and surviving a restart. docs/upstream-e2e.md says, for every
//! other scenario, why ipvs mode leaves it out.

in_one_ipvs_guest!(upstream_scenarios;
    crate::services::should_be_rejected_when_no_endpoints_exist,
    crate::services::should_work_after_restarting_kube_proxy,
    crate::conntrack::should_be_able_to_preserve_udp_traffic_when_server_pod_cycles_for_a_nodeport_service,
    crate::conntrack::proxy_implementation_should_not_be_vulnerable_to_the_invalid_conntrack_state_bug,
);
