//! The proxy's pipeline below the sources, as the sync loop drives it: objects into the
//! trackers of one IP family, one take() into a desired state, rendered by the iptables
//! renderer; with the invariants every target asserts on the way.
//!
//! Invariants are checked with panics: that is how a libFuzzer target reports a finding,
//! and how the corpus replay test fails.

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kpr_iptables::{IptablesOptions, NameCache, build, build_with_cache, render_dry_run};
use kpr_model::{IgnoredValue, IpFamily, NamespacedName, NodeView, Rejection, node_view};
use kpr_sources::Event;
use kpr_state::{DesiredState, PendingSync};
use kpr_tracking::{EndpointsTracker, ServiceTracker};

use kpr_iptables::restore_syntax::check_payload;

/// The node every target runs on.
pub const NODE: &str = "node-a";

/// Trackers of one family, fed like the sync loop's intake feeds them.
pub struct Pipeline {
    services: ServiceTracker,
    endpoints: EndpointsTracker,
    node: Arc<NodeView>,
}

impl Pipeline {
    pub fn new(family: IpFamily) -> Self {
        Self {
            services: ServiceTracker::new(family),
            endpoints: EndpointsTracker::new(family, NODE),
            node: Arc::new(NodeView {
                name: NODE.to_owned(),
                ..NodeView::default()
            }),
        }
    }

    /// One source event, as intake applies it; rejections are checked, not logged.
    pub fn event(&mut self, event: &Event) {
        match event {
            Event::Service { id, object } => self.service(id.clone(), object.as_deref()),
            Event::EndpointSlice { id, object } => self.slice(id.clone(), object.as_deref()),
            Event::Node { object } => self.node(object.as_deref()),
            // The iptables renderer ignores ServiceCIDRs; their conversion is still checked.
            Event::ServiceCidr { object, .. } => {
                if let Some(object) = object {
                    check_outcome(kpr_model::convert_service_cidr(object).map(|c| c.ignored));
                }
            }
            Event::Rejected(rejection) => check_rejection(rejection),
            Event::Synced { .. } | Event::SourceTrouble { .. } => {}
        }
    }

    pub fn service(&mut self, id: NamespacedName, service: Option<&Service>) {
        check_outcome(self.services.update(id, service));
    }

    pub fn slice(&mut self, id: NamespacedName, slice: Option<&EndpointSlice>) {
        check_outcome(self.endpoints.update(id, slice));
    }

    /// This node's Node object; a rejected one keeps the previous view, as intake does.
    pub fn node(&mut self, node: Option<&Node>) {
        match node.map(node_view) {
            Some(Ok(view)) => self.node = Arc::new(view),
            Some(Err(rejection)) => check_rejection(&rejection),
            None => {
                self.node = Arc::new(NodeView {
                    name: self.node.name.clone(),
                    ..NodeView::default()
                });
            }
        }
    }

    /// This node's addresses as the Node object lists them.
    pub fn node_ips(&self) -> &[IpAddr] {
        &self.node.addresses
    }

    /// The desired state after everything fed so far, taken as the sync step takes it.
    pub fn take(&mut self) -> DesiredState {
        self.take_pending().state
    }

    /// Like [`Pipeline::take`], with what changed since the previous take.
    pub fn take_pending(&mut self) -> PendingSync {
        PendingSync::new(self.services.take(), self.endpoints.take(), self.node.clone())
    }
}

fn check_outcome(outcome: Result<Vec<IgnoredValue>, Rejection>) {
    match outcome {
        Ok(ignored) => ignored.iter().for_each(check_ignored),
        Err(rejection) => check_rejection(&rejection),
    }
}

/// A rejection must say which object and which field, or the operator cannot find the typo.
pub fn check_rejection(rejection: &Rejection) {
    assert!(
        !rejection.object.is_empty(),
        "rejection without an object: {rejection:?}"
    );
    assert!(
        !rejection.field.is_empty(),
        "rejection without a field: {rejection:?}"
    );
}

fn check_ignored(ignored: &IgnoredValue) {
    assert!(
        !ignored.object.is_empty() && !ignored.field.is_empty(),
        "dropped list entry without an object or field: {ignored:?}"
    );
}

/// Renders `state` with `options` on a host with `local` addresses, asserts the payload
/// invariants, that the renderer's own text gate refused nothing (every name it sees was
/// accepted by the model first: the two checks must agree), and that rendering is a pure
/// function: again from scratch, and through a name cache warmed by an earlier build, the
/// bytes are the same. Returns the payload.
pub fn render_checked(state: &DesiredState, options: &IptablesOptions, local: &[IpAddr]) -> String {
    let text = render_dry_run(state, options, local);
    if let Err(error) = check_payload(&text) {
        panic!("{error}\n--- payload ---\n{text}");
    }
    assert_eq!(
        render_dry_run(state, options, local),
        text,
        "rendering the same state twice gave different payloads"
    );
    let mut names = NameCache::default();
    let first = build_with_cache(state, options, local, &mut names);
    assert!(
        first.refused.is_empty(),
        "the renderer refused text the model accepted: {:?}",
        first.refused
    );
    let cached = build_with_cache(state, options, local, &mut names);
    assert_eq!(first, cached, "a warm name cache changed the ruleset");
    assert_eq!(
        first,
        build(state, options, local),
        "a name cache changed the ruleset"
    );
    text
}
