//! Test support: a small cluster "world" for tests of everything after the sources.
//!
//! Tests of the trackers' consumers (rendering, conntrack decisions, topology, the sync
//! loop) need Services and EndpointSlices *as the product would see them*: converted by
//! kpr-model, merged and ordered by the trackers, handed over as one `PendingSync`. Built
//! by hand, such a state silently drifts from what the conversions produce (a default the
//! API applies, an endpoint order the trackers decide), and every crate grew its own
//! near-copy of the same builder. This crate is that builder, once:
//!
//! - [`World`]: API objects (written as JSON, the way a manifest or `kubectl get -o json`
//!   shows them) through the real trackers into a [`kpr_state::PendingSync`] /
//!   [`kpr_state::DesiredState`], for IPv4 or IPv6, on a node of the test's choosing.
//! - [`ep`] / [`eps`]: the endpoint shorthand shared by every test,
//!   `"10.0.0.2 serving terminating local hint-zone=z1"` (see [`ep`] for the words).
//! - [`service_object`], [`slice_object`], [`node_object`]: the API objects alone, for tests
//!   that feed them elsewhere (a sync loop's events).
//! - [`churn::churn`]: many changes that end where they started, for the tests asserting
//!   that no tracker, cache or metric label set grows with the number of changes
//!   (`footprint()` everywhere, [`kpr_model::Sizes`]).
//! - [`service_port`], [`endpoint`], [`node_view`]: single converted values, for the pure
//!   decisions that take them one by one (topology, port plans).
//!
//! Everything goes through the product's own conversions; nothing here builds a
//! `ServicePort` or an `Endpoint` field by field. Input a conversion refuses is a mistake in
//! the test, so it panics (failing the test) with the conversion's own message. A test that
//! needs what no conversion produces (a name the API refuses, to test a backend's own
//! defences) changes the converted value itself, in plain sight.

pub mod churn;
pub mod golden;
mod objects;
mod shorthand;
mod values;
mod world;

pub use objects::{node_object, service_object, slice_object};
pub use shorthand::{ep, eps};
pub use values::{ENDPOINT_PORT, endpoint, node_view, service_port};
pub use world::World;

/// The node the proxy runs on: endpoints written `local` are on it.
pub const NODE: &str = "node-a";
/// Its InternalIP (the primary node IP rule generation uses).
pub const NODE_IP: &str = "192.168.0.10";
/// The zone label of [`World::new`]'s node.
pub const ZONE: &str = "z1";
/// Where endpoints not written `local` run.
pub const OTHER_NODE: &str = "node-b";
/// The namespace of every object the shorthand builders make.
pub const NAMESPACE: &str = "default";
