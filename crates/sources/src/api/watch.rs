//! From kube-runtime watcher events to source events, per object kind.
//!
//! The only state is the set of objects we reported as present, so that a relist (after a
//! `410 Gone`, or a restarted watch) can report the deletions it implies.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kpr_model::{NamespacedName, ObjectKind, RejectReason, Rejection};
use kube::Resource;
use kube::runtime::watcher;

use crate::Event;
use crate::api::API_SOURCE;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Service,
    EndpointSlice,
    Node,
    ServiceCidr,
}

impl Kind {
    pub fn plural(self) -> &'static str {
        match self {
            Self::Service => "services",
            Self::EndpointSlice => "endpointslices",
            Self::Node => "nodes",
            Self::ServiceCidr => "servicecidrs",
        }
    }

    fn object_kind(self) -> ObjectKind {
        match self {
            Self::Service => ObjectKind::Service,
            Self::EndpointSlice => ObjectKind::EndpointSlice,
            Self::Node => ObjectKind::Node,
            Self::ServiceCidr => ObjectKind::ServiceCidr,
        }
    }
}

/// A kind the API source watches: how its objects become [`Event`]s.
pub trait Watched:
    Resource<DynamicType = (), Scope: Send>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
    const KIND: Kind;
    fn event(id: NamespacedName, object: Option<Arc<Self>>) -> Event;
}

impl Watched for Service {
    const KIND: Kind = Kind::Service;
    fn event(id: NamespacedName, object: Option<Arc<Self>>) -> Event {
        Event::Service { id, object }
    }
}

impl Watched for EndpointSlice {
    const KIND: Kind = Kind::EndpointSlice;
    fn event(id: NamespacedName, object: Option<Arc<Self>>) -> Event {
        Event::EndpointSlice { id, object }
    }
}

impl Watched for Node {
    const KIND: Kind = Kind::Node;
    fn event(_id: NamespacedName, object: Option<Arc<Self>>) -> Event {
        Event::Node { object }
    }
}

impl Watched for ServiceCIDR {
    const KIND: Kind = Kind::ServiceCidr;
    fn event(id: NamespacedName, object: Option<Arc<Self>>) -> Event {
        Event::ServiceCidr {
            name: id.name.to_string(),
            object,
        }
    }
}

pub(crate) struct WatchState<K> {
    /// Objects reported present and not since deleted.
    present: HashSet<NamespacedName>,
    /// Objects seen by the relist in progress, if one is.
    relisting: Option<HashSet<NamespacedName>>,
    listed_once: bool,
    _kind: std::marker::PhantomData<K>,
}

impl<K> Default for WatchState<K> {
    fn default() -> Self {
        Self {
            present: HashSet::new(),
            relisting: None,
            listed_once: false,
            _kind: std::marker::PhantomData,
        }
    }
}

impl<K: Watched> WatchState<K> {
    /// The source events one watcher event stands for. The first completed list yields an
    /// `Event::Synced` (which the caller turns into a per-kind signal).
    pub(crate) fn handle(&mut self, event: watcher::Event<K>) -> Vec<Event> {
        match event {
            watcher::Event::Init => {
                self.relisting = Some(HashSet::new());
                Vec::new()
            }
            watcher::Event::InitApply(object) => {
                let Some(id) = self.identify(&object) else {
                    return vec![self.nameless()];
                };
                if let Some(seen) = &mut self.relisting {
                    seen.insert(id.clone());
                }
                self.present.insert(id.clone());
                vec![K::event(id, super::arc(object))]
            }
            watcher::Event::InitDone => self.finish_list(),
            watcher::Event::Apply(object) => match self.identify(&object) {
                Some(id) => {
                    self.present.insert(id.clone());
                    vec![K::event(id, super::arc(object))]
                }
                None => vec![self.nameless()],
            },
            watcher::Event::Delete(object) => match self.identify(&object) {
                Some(id) => {
                    self.present.remove(&id);
                    vec![K::event(id, None)]
                }
                None => Vec::new(),
            },
        }
    }

    /// Objects held as present and seen by a relist in progress (kpr_model::Sizes). Only
    /// the churn test asks: the state lives inside a watcher task nobody else can reach.
    #[cfg(test)]
    pub(crate) fn footprint(&self) -> kpr_model::Sizes {
        kpr_model::Sizes::new()
            .with("present", self.present.len())
            .with("relisting", self.relisting.as_ref().map_or(0, HashSet::len))
    }

    /// Ends a (re)list: whatever was present before and not listed now is gone.
    fn finish_list(&mut self) -> Vec<Event> {
        let seen = self.relisting.take().unwrap_or_default();
        let mut gone: Vec<NamespacedName> = self.present.difference(&seen).cloned().collect();
        gone.sort();
        self.present = seen;
        let mut out: Vec<Event> = gone.into_iter().map(|id| K::event(id, None)).collect();
        if !self.listed_once {
            self.listed_once = true;
            out.push(Event::Synced { source: API_SOURCE });
        }
        out
    }

    fn identify(&self, object: &K) -> Option<NamespacedName> {
        let meta = object.meta();
        let name = meta.name.as_deref().filter(|n| !n.is_empty())?;
        let namespace = meta.namespace.as_deref().unwrap_or_default();
        Some(NamespacedName::new(namespace, name))
    }

    fn nameless(&self) -> Event {
        Event::Rejected(Rejection::new(
            K::KIND.object_kind(),
            "(unnamed)",
            "metadata.name",
            RejectReason::MissingField,
            "the API server sent an object without a name",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nothing the watch keeps grows with the number of changes: kpr_world's churn of
    /// Services as watch events, half the deletions lost by the watch and found by the
    /// relist that follows each sync point, leaves the sizes of the warm-up round.
    #[test]
    fn sizes_come_back_after_churn_with_lost_deletions_and_relists() {
        use std::collections::BTreeMap;

        use kpr_world::churn::{Change, churn};

        fn run(
            state: &mut WatchState<Service>,
            listed: &mut BTreeMap<String, Service>,
            changes: &[Change],
        ) -> usize {
            let mut deletions_seen_by_relist = 0;
            for (i, change) in changes.iter().enumerate() {
                match change {
                    Change::Service(name, Some(object)) => {
                        listed.insert(name.clone(), (**object).clone());
                        state.handle(watcher::Event::Apply((**object).clone()));
                    }
                    Change::Service(name, None) => {
                        if let Some(object) = listed.remove(name)
                            && i % 2 == 0
                        {
                            state.handle(watcher::Event::Delete(object));
                        }
                    }
                    Change::Sync => {
                        state.handle(watcher::Event::Init);
                        for object in listed.values() {
                            state.handle(watcher::Event::InitApply(object.clone()));
                        }
                        deletions_seen_by_relist += state.handle(watcher::Event::InitDone).len();
                    }
                    _ => {}
                }
            }
            deletions_seen_by_relist
        }

        let (mut state, mut listed) = (WatchState::<Service>::default(), BTreeMap::new());
        run(&mut state, &mut listed, &churn(0, 1));
        let before = state.footprint();
        let found_by_relists = run(&mut state, &mut listed, &churn(1, 40));
        let after = state.footprint();
        assert_eq!(before.differences(&after), [], "sizes grew with churn:\n{after}");
        assert!(found_by_relists > 0, "no deletion was left to the relists");
    }

    fn svc(name: &str) -> Service {
        let mut s = Service::default();
        s.metadata.name = Some(name.to_string());
        s.metadata.namespace = Some("default".to_string());
        s
    }

    fn describe(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                Event::Service { id, object } => format!("{}{id}", if object.is_some() { "+" } else { "-" }),
                Event::Synced { source } => format!("synced {source}"),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn first_list_reports_objects_then_synced_once() {
        let mut state = WatchState::<Service>::default();
        let mut out = state.handle(watcher::Event::Init);
        out.extend(state.handle(watcher::Event::InitApply(svc("a"))));
        out.extend(state.handle(watcher::Event::InitDone));
        assert_eq!(describe(&out), ["+default/a", "synced api"]);
        let again = [
            state.handle(watcher::Event::Init),
            state.handle(watcher::Event::InitApply(svc("a"))),
            state.handle(watcher::Event::InitDone),
        ]
        .concat();
        assert_eq!(describe(&again), ["+default/a"], "Synced is sent only once");
    }

    #[test]
    fn relist_reports_what_vanished_meanwhile() {
        let mut state = WatchState::<Service>::default();
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(svc("a")),
            watcher::Event::InitApply(svc("b")),
            watcher::Event::InitDone,
            watcher::Event::Apply(svc("c")),
        ] {
            state.handle(e);
        }
        let relist = [
            state.handle(watcher::Event::Init),
            state.handle(watcher::Event::InitApply(svc("b"))),
            state.handle(watcher::Event::InitDone),
        ]
        .concat();
        assert_eq!(describe(&relist), ["+default/b", "-default/a", "-default/c"]);
    }

    #[test]
    fn service_cidrs_are_reported_by_name_and_their_deletions_after_a_relist() {
        let cidr = |name: &str| {
            let mut object = ServiceCIDR::default();
            object.metadata.name = Some(name.to_string());
            object
        };
        let mut state = WatchState::<ServiceCIDR>::default();
        let mut out = Vec::new();
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(cidr("kubernetes")),
            watcher::Event::InitApply(cidr("extra")),
            watcher::Event::InitDone,
            watcher::Event::Init,
            watcher::Event::InitApply(cidr("kubernetes")),
            watcher::Event::InitDone,
        ] {
            out.extend(state.handle(e));
        }
        let seen: Vec<String> = out
            .iter()
            .map(|e| match e {
                Event::ServiceCidr { name, object } => {
                    format!("{}{name}", if object.is_some() { "+" } else { "-" })
                }
                Event::Synced { source } => format!("synced {source}"),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            seen,
            ["+kubernetes", "+extra", "synced api", "+kubernetes", "-extra"]
        );
        assert_eq!(Kind::ServiceCidr.plural(), "servicecidrs");
    }

    #[test]
    fn nameless_objects_are_rejected_not_reported() {
        let mut state = WatchState::<Service>::default();
        let out = state.handle(watcher::Event::Apply(Service::default()));
        assert!(
            matches!(&out[..], [Event::Rejected(r)] if r.field == "metadata.name"),
            "{out:?}"
        );
    }
}
