//! Desired state: what the node should look like, independent of how a mode programs it.
//!
//! [`DesiredState`] is the immutable snapshot a backend renders (services, endpoints, this
//! node, the cluster's Service CIDRs of the family). [`PortPlan`] holds the decisions upstream makes at the top of every proxier's
//! per-service loop: which endpoints serve cluster-internal and external traffic, whether a
//! service with no usable endpoint must REJECT or DROP, and which chains it needs. Computing
//! them once here keeps the modes from drifting apart on semantics.
//! [`health_checks`] derives the Service health-check servers this node must run, and
//! [`SyncObserver`] is how they (and anything else that follows the rules) hear of a sync.

mod after_sync;
mod backend;
mod health_check;
mod plan;
mod repair;
mod topology;

use std::sync::Arc;

use ipnet::IpNet;
use kpr_model::{Endpoint, NodeView, ServicePort};
use kpr_tracking::{EndpointsMap, ServiceMap, endpoints_for};

pub use after_sync::SyncObserver;
pub use backend::{
    Backend, BackendError, ConntrackReconcile, FailedStep, ObjectCount, PendingSync, SyncKind, SyncReport,
    SyncRequest, UnsafeObject,
};
pub use health_check::{HealthCheck, HealthChecks, health_checks, update_health_checks};
pub use plan::{PortPlan, Unreachable};
pub use repair::RepairRequest;
pub use topology::{Categorized, categorize};

/// One consistent view of everything the rules are generated from.
#[derive(Clone, Debug, Default)]
pub struct DesiredState {
    pub services: Arc<ServiceMap>,
    pub endpoints: Arc<EndpointsMap>,
    pub node: Arc<NodeView>,
    /// This family's Service CIDRs from the ServiceCIDR objects, sorted and without
    /// duplicates: a mode that uses them drops traffic to an address inside them that no
    /// Service holds (upstream's nftables mode does; its other modes ignore them).
    pub service_cidrs: Arc<Vec<IpNet>>,
}

impl DesiredState {
    /// Every service port, sorted by name so generated rules are stable across syncs.
    pub fn ports(&self) -> Vec<&ServicePort> {
        let mut ports: Vec<_> = self.services.values().flat_map(|ports| ports.iter()).collect();
        ports.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        ports
    }

    pub fn endpoints(&self, port: &ServicePort) -> &[Endpoint] {
        endpoints_for(&self.endpoints, &port.name)
    }

    /// Endpoints over all service ports (upstream's "large cluster" threshold counts these).
    pub fn endpoint_count(&self) -> usize {
        self.endpoints
            .values()
            .flat_map(|ports| ports.values())
            .map(|eps| eps.len())
            .sum()
    }

    pub fn plan<'a>(&'a self, port: &'a ServicePort) -> PortPlan<'a> {
        PortPlan::new(port, self.endpoints(port), &self.node)
    }
}
