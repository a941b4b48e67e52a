//! The proxy's own view of Kubernetes Services, EndpointSlices and its Node.
//!
//! Everything downstream of the sources (trackers, desired state, rule generation) works on
//! these small, validated types instead of the raw API objects. Converting once, at the edge,
//! means a malformed object is rejected in exactly one place, with an error that names the
//! object, the field and the reason, and never reaches rule generation.
//!
//! The conversion follows upstream kube-proxy's `newBaseServiceInfo` and EndpointSlice cache:
//! one [`ServicePort`] per (service, port) for one IP family, and one [`Endpoint`] per
//! ready-or-not address of a slice. Like upstream, a malformed entry of a list (external IPs,
//! load-balancer ingress, source ranges, a slice's endpoint addresses and ports, a Node's
//! addresses, a ServiceCIDR's CIDRs) drops only that entry; the conversions return it as an [`IgnoredValue`] beside the view
//! ([`Converted`]) for the caller to log and count, since this crate does no I/O.
//!
//! [`text`] lives here because it is where untrusted text is judged: the one check every
//! free-form string (names in comments, interface names) passes before it may appear in
//! kernel rule text, shared by the configuration, the node's facts and every backend.
//!
//! [`Sizes`] lives here too, though it is no Kubernetes type: it is what every long-lived
//! structure's `footprint()` returns, and this is the one crate all of them depend on.

mod endpoint;
mod ident;
mod ignored;
mod node;
mod rejection;
mod service;
mod service_cidr;
mod sizes;
pub mod syntax;
pub mod text;

pub use endpoint::{
    Endpoint, Hints, LAST_CHANGE_TRIGGER_TIME_ANNOTATION, SERVICE_NAME_LABEL, SliceAddress, SlicePort,
    SliceView, last_change_trigger_time, slice_view,
};
pub use ident::{IpFamily, NamespacedName, ObjectKind, Protocol, ServicePortName};
pub use ignored::{Converted, IgnoredValue};
pub use node::{NodeView, TO_BE_DELETED_TAINT, ZONE_LABEL, convert_node, node_view};
pub use rejection::{RejectReason, Rejection};
pub use service::{
    DEFAULT_AFFINITY_TIMEOUT_SECONDS, ServicePort, ServiceType, ServiceView, SkipReason, service_view,
};
pub use service_cidr::{ServiceCidrView, convert_service_cidr};
pub use sizes::Sizes;
