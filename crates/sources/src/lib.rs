//! Sources: where Services, EndpointSlices, this node's Node object and the cluster's
//! ServiceCIDRs come from.
//!
//! Every source turns its input into a stream of [`Event`]s: the newest state of one object
//! (or its deletion), and once, [`Event::Synced`] when its initial state is complete. The
//! sync loop does not write rules before every source has said `Synced`, so a proxy that
//! restarts never briefly programs a half-loaded world.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kpr_model::{NamespacedName, Rejection};

pub mod api;
pub mod manifests;

pub use api::{API_SOURCE, ApiSource, ClientError, ClientOptions, build_client};
pub use manifests::{MANIFESTS_SOURCE, ManifestError, ManifestSource};

/// One change reported by a source.
#[derive(Clone, Debug)]
pub enum Event {
    /// The newest state of a Service; `None` when it was deleted.
    Service {
        id: NamespacedName,
        object: Option<Arc<Service>>,
    },
    /// The newest state of an EndpointSlice (`id` is the slice's own name); `None` when deleted.
    EndpointSlice {
        id: NamespacedName,
        object: Option<Arc<EndpointSlice>>,
    },
    /// The newest state of this proxy's own Node; `None` when deleted.
    Node { object: Option<Arc<Node>> },
    /// The newest state of a ServiceCIDR (cluster-scoped, so named by `name` alone); `None`
    /// when deleted. Only nftables mode uses them (the API source watches them only when
    /// asked to, as upstream starts that informer only for nftables mode).
    ServiceCidr {
        name: String,
        object: Option<Arc<ServiceCIDR>>,
    },
    /// The source has delivered its complete initial state.
    Synced { source: &'static str },
    /// Input refused by the source: a file that is not YAML or is too large, or (from the
    /// manifest source, which applies the API server's rules) an invalid or conflicting
    /// object. Objects that reach the trackers and are invalid there are rejected by them.
    Rejected(Rejection),
    /// The source cannot currently deliver changes (e.g. the API server is unreachable), or,
    /// with `None`, it can again. Shown by `/healthz` when syncs fall behind.
    SourceTrouble {
        source: &'static str,
        problem: Option<String>,
    },
}

/// Where events go. Bounded, so a source that outruns the proxy waits instead of growing memory.
pub type EventSender = tokio::sync::mpsc::Sender<Event>;
pub type EventReceiver = tokio::sync::mpsc::Receiver<Event>;

/// Capacity of the event channel between the sources and the sync loop.
pub const EVENT_CHANNEL_CAPACITY: usize = 4096;

pub fn event_channel() -> (EventSender, EventReceiver) {
    tokio::sync::mpsc::channel(EVENT_CHANNEL_CAPACITY)
}
