//! EndpointSlices, joined per Service and split per service port.
//!
//! The tracker keeps every slice as the endpoints it gives each Service port, already in the
//! form the proxier reads (`Endpoint`s, deduplicated and sorted), not as the converted slice:
//! most Services have one slice, and then the snapshot shares that slice's lists instead of
//! holding a second copy of every endpoint (at 50k Services x 10 endpoints the copy was
//! ~50 MB). An update only marks the owning Service dirty; at `take()` each dirty Service's
//! slices are merged again (duplicates across slices removed as upstream's
//! EndpointSliceCache does: a copy that is not terminating wins) and compared with what the
//! proxier last saw, so a slice update that changes nothing the rules depend on costs no
//! sync work.
//!
//! A slice version counts as changed when its Service or its endpoints as the proxier sees
//! them changed. Fields the rules never read (the zone, which other node an endpoint runs
//! on) are not kept, so a version differing only there changes nothing here; upstream
//! would queue a sync for it that then writes nothing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kpr_model::{
    Converted, Endpoint, IgnoredValue, IpFamily, NamespacedName, Protocol, Rejection, ServicePortName, Sizes,
    SliceView, last_change_trigger_time, slice_view,
};

use crate::{Changes, Recorded};

/// Matches a slice port to a Service port: same name, same protocol.
pub type PortKey = (Arc<str>, Protocol);

/// The endpoints of one Service, per port, each list sorted by `ip:port` string as upstream
/// sorts them (this order decides which KUBE-SEP chain gets which probability).
///
/// A boxed slice sorted by port, not a `BTreeMap`: a Service has one port or a few, and a
/// `BTreeMap` allocates a whole node (~450 bytes) even for one, in every Service of every
/// snapshot (22 MB at 50k Services). Built with `collect()`, which sorts and keeps the last
/// of equal keys, as inserting into a map would.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceEndpoints(Box<[(PortKey, Arc<[Endpoint]>)]>);

impl ServiceEndpoints {
    pub fn get(&self, port: &PortKey) -> Option<&Arc<[Endpoint]>> {
        let at = self.0.binary_search_by(|(key, _)| key.cmp(port)).ok()?;
        Some(&self.0[at].1)
    }

    /// Ports and their endpoints, in port order.
    pub fn iter(&self) -> impl Iterator<Item = (&PortKey, &Arc<[Endpoint]>)> {
        self.0.iter().map(|(key, endpoints)| (key, endpoints))
    }

    pub fn values(&self) -> impl Iterator<Item = &Arc<[Endpoint]>> {
        self.0.iter().map(|(_, endpoints)| endpoints)
    }

    /// How many ports have endpoints.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromIterator<(PortKey, Arc<[Endpoint]>)> for ServiceEndpoints {
    fn from_iter<I: IntoIterator<Item = (PortKey, Arc<[Endpoint]>)>>(iter: I) -> Self {
        let by_port: BTreeMap<_, _> = iter.into_iter().collect();
        Self(by_port.into_iter().collect())
    }
}

/// Every Service's endpoints, by Service `namespace/name`.
pub type EndpointsMap = HashMap<NamespacedName, Arc<ServiceEndpoints>>;

/// Endpoints of one Service port, or an empty slice.
pub fn endpoints_for<'a>(map: &'a EndpointsMap, port: &ServicePortName) -> &'a [Endpoint] {
    map.get(&port.service)
        .and_then(|eps| eps.get(&(port.port.clone(), port.protocol)))
        .map(|eps| &eps[..])
        .unwrap_or_default()
}

/// One Service whose merged endpoints differ from what the proxier last saw.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointsChange {
    pub service: NamespacedName,
    pub previous: Option<Arc<ServiceEndpoints>>,
    pub current: Option<Arc<ServiceEndpoints>>,
}

/// What the tracker keeps of one slice: its Service and the endpoints it gives each port.
#[derive(Debug, PartialEq)]
struct TrackedSlice {
    service: NamespacedName,
    /// Shared with the snapshot while the slice is its Service's only one.
    endpoints: Arc<ServiceEndpoints>,
}

#[derive(Debug)]
pub struct EndpointsTracker {
    family: IpFamily,
    node_name: Arc<str>,
    slices: HashMap<NamespacedName, TrackedSlice>,
    /// Slice ids per Service, sorted so merging is deterministic. A sorted `Vec`, not a
    /// `BTreeSet`: most Services have one slice, and a one-element `BTreeSet` allocates a
    /// whole node (~370 bytes; 18 MB at 50k Services).
    slices_by_service: HashMap<NamespacedName, Vec<NamespacedName>>,
    dirty: HashSet<NamespacedName>,
    applied: Arc<EndpointsMap>,
    /// Trigger times of slice updates since the last sync, per Service, for the
    /// network-programming latency (upstream ignores those older than the tracker, i.e. the
    /// initial list).
    trigger_times: HashMap<NamespacedName, Vec<SystemTime>>,
    started: SystemTime,
}

impl EndpointsTracker {
    pub fn new(family: IpFamily, node_name: &str) -> Self {
        Self {
            family,
            node_name: node_name.into(),
            slices: HashMap::new(),
            slices_by_service: HashMap::new(),
            dirty: HashSet::new(),
            applied: Arc::default(),
            trigger_times: HashMap::new(),
            started: SystemTime::now(),
        }
    }

    /// Records the newest state of a slice (`None`: deleted). A rejected slice is treated as
    /// deleted; the rejection is returned for the caller to log and count. So are the
    /// endpoints the conversion dropped from an accepted slice (once per update, not per sync).
    pub fn update(
        &mut self,
        id: NamespacedName,
        slice: Option<&EndpointSlice>,
    ) -> Result<Vec<IgnoredValue>, Rejection> {
        self.record(id, slice).outcome
    }

    /// [`Self::update`], also saying whether the slice's converted view changed.
    pub fn record(&mut self, id: NamespacedName, slice: Option<&EndpointSlice>) -> Recorded {
        let (view, outcome) = match slice.map(|s| slice_view(s, self.family)) {
            None => (None, Ok(Vec::new())),
            Some(Ok(Converted { view, ignored })) => (view, Ok(ignored)),
            Some(Err(rejection)) => (None, Err(rejection)),
        };
        let tracked = view.as_ref().map(|view| self.track(view));
        let changed = self.slices.get(&id) != tracked.as_ref();
        if !changed {
            // The same version again (a relist), or a slice of the other family: nothing to
            // merge, no latency sample.
            return Recorded { changed, outcome };
        }
        if let (Some(slice), Some(view)) = (slice, &view) {
            self.record_trigger_time(slice, view);
        }
        if let Some(old) = self.slices.remove(&id) {
            if slice.is_none() {
                // Upstream: a deletion's trigger time says nothing, and the pending ones of
                // its Service are dropped.
                self.trigger_times.remove(&old.service);
            }
            self.forget_slice(&old.service, &id);
        }
        if let Some(tracked) = tracked {
            let ids = self.slices_by_service.entry(tracked.service.clone()).or_default();
            if let Err(at) = ids.binary_search(&id) {
                // Exactly one more: a Vec's first growth would make room for four.
                ids.reserve_exact(1);
                ids.insert(at, id.clone());
            }
            self.dirty.insert(tracked.service.clone());
            self.slices.insert(id, tracked);
        }
        Recorded { changed, outcome }
    }

    /// The slice as the tracker keeps it: each port's endpoints, as one merge of this slice
    /// alone would give them.
    fn track(&self, view: &SliceView) -> TrackedSlice {
        let mut by_port = ByPort::new();
        for port in &view.ports {
            let set = by_port.entry((port.name.clone(), port.protocol)).or_default();
            for address in &view.addresses {
                keep_preferred_copy(set, Endpoint::new(address, port.port, &self.node_name));
            }
        }
        TrackedSlice {
            service: view.service.clone(),
            endpoints: Arc::new(sorted_per_port(by_port)),
        }
    }

    /// Upstream's sample rule: a slice of this proxier's family that changed (the caller
    /// checks), with a trigger time after the tracker started.
    fn record_trigger_time(&mut self, slice: &EndpointSlice, view: &SliceView) {
        let Some(t) = last_change_trigger_time(slice).filter(|t| *t > self.started) else {
            return;
        };
        self.trigger_times
            .entry(view.service.clone())
            .or_default()
            .push(t);
    }

    fn forget_slice(&mut self, service: &NamespacedName, slice: &NamespacedName) {
        if let Some(ids) = self.slices_by_service.get_mut(service) {
            if let Ok(at) = ids.binary_search(slice) {
                ids.remove(at);
            }
            if ids.is_empty() {
                self.slices_by_service.remove(service);
            }
        }
        self.dirty.insert(service.clone());
    }

    /// The trigger times recorded since the last call: the sync that applies the pending
    /// changes measures its network-programming latency from them.
    pub fn take_trigger_times(&mut self) -> Vec<SystemTime> {
        let mut times: Vec<_> = self.trigger_times.drain().flat_map(|(_, t)| t).collect();
        self.trigger_times.shrink_to(crate::ROOM_AFTER_TAKE);
        times.sort();
        times
    }

    /// Services whose slices changed since the last `take()` (some may turn out unchanged).
    pub fn pending(&self) -> usize {
        self.dirty.len()
    }

    /// How many slices, Services and pending samples it holds (kpr_model::Sizes).
    pub fn footprint(&self) -> Sizes {
        Sizes::new()
            .with("slices", self.slices.len())
            .with("slices_by_service", self.slices_by_service.len())
            .with("dirty", self.dirty.len())
            .with("applied", self.applied.len())
            .with("trigger_times", self.trigger_times.values().map(Vec::len).sum())
    }

    /// The current map, without taking pending changes.
    pub fn snapshot(&self) -> Arc<EndpointsMap> {
        self.applied.clone()
    }

    /// Hands over the Services whose merged endpoints changed, and a snapshot including them.
    pub fn take(&mut self) -> Changes<EndpointsChange, EndpointsMap> {
        let mut changed = Vec::new();
        let dirty: Vec<_> = self.dirty.drain().collect();
        self.dirty.shrink_to(crate::ROOM_AFTER_TAKE);
        let merged: Vec<_> = dirty
            .into_iter()
            .map(|svc| {
                let current = self.merge(&svc);
                (svc, current)
            })
            .collect();
        let applied = Arc::make_mut(&mut self.applied);
        for (service, current) in merged {
            if applied.get(&service) == current.as_ref() {
                continue;
            }
            let previous = match &current {
                Some(eps) => applied.insert(service.clone(), eps.clone()),
                None => applied.remove(&service),
            };
            changed.push(EndpointsChange {
                service,
                previous,
                current,
            });
        }
        changed.sort_by(|a, b| a.service.cmp(&b.service));
        Changes {
            changed,
            snapshot: self.applied.clone(),
        }
    }

    /// The Service's endpoints from all its slices; a Service with one slice shares that
    /// slice's lists.
    fn merge(&self, service: &NamespacedName) -> Option<Arc<ServiceEndpoints>> {
        let ids = self.slices_by_service.get(service)?;
        let mut slices = ids.iter().filter_map(|id| self.slices.get(id));
        let merged = match (slices.next(), ids.len()) {
            (None, _) => return None,
            (Some(only), 1) => only.endpoints.clone(),
            (Some(first), _) => {
                let mut by_port = ByPort::new();
                for slice in std::iter::once(first).chain(slices) {
                    for (key, endpoints) in slice.endpoints.iter() {
                        let set = by_port.entry(key.clone()).or_default();
                        for endpoint in endpoints.iter() {
                            keep_preferred_copy(set, endpoint.clone());
                        }
                    }
                }
                Arc::new(sorted_per_port(by_port))
            }
        };
        (!merged.is_empty()).then_some(merged)
    }
}

/// Endpoints per port while slices are merged, one copy per `ip:port`.
type ByPort = BTreeMap<PortKey, HashMap<SocketAddr, Endpoint>>;

/// Each port's endpoints sorted by `ip:port` string, as upstream sorts them; ports without
/// endpoints left out.
fn sorted_per_port(by_port: ByPort) -> ServiceEndpoints {
    by_port
        .into_iter()
        .filter(|(_, set)| !set.is_empty())
        .map(|(key, set)| {
            let mut eps: Vec<_> = set.into_values().map(|e| (e.addr_string(), e)).collect();
            eps.sort_by(|a, b| a.0.cmp(&b.0));
            (key, eps.into_iter().map(|(_, e)| e).collect())
        })
        .collect()
}

/// Adds `endpoint` unless `set` already holds a better copy of the same `ip:port`.
///
/// The same address can appear twice in one Service's slices: an endpoint moving from one
/// slice to another (both copies are briefly seen; the next update resolves it), or a pod IP
/// reused by a new pod while the old pod still terminates. As upstream's EndpointSliceCache
/// does, a copy that is not terminating replaces an earlier one (the running pod wins over
/// the terminating one), and a terminating copy is only used if nothing else claims the
/// address. Slices are visited in name order, so the outcome is deterministic.
fn keep_preferred_copy(set: &mut HashMap<SocketAddr, Endpoint>, endpoint: Endpoint) {
    if !endpoint.terminating || !set.contains_key(&endpoint.addr) {
        set.insert(endpoint.addr, endpoint);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(name: &str, service: &str, ips: &[&str], port: u16) -> EndpointSlice {
        let endpoints: Vec<_> = ips
            .iter()
            .map(|ip| json!({"addresses": [ip], "nodeName": if ip.ends_with(".9") { "me" } else { "other" }}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": port}],
            "endpoints": endpoints,
        }))
        .unwrap()
    }

    fn web() -> NamespacedName {
        NamespacedName::new("default", "web")
    }

    fn port() -> ServicePortName {
        ServicePortName::new("default", "web", "http", Protocol::Tcp)
    }

    fn addrs(map: &EndpointsMap) -> Vec<String> {
        endpoints_for(map, &port())
            .iter()
            .map(Endpoint::addr_string)
            .collect()
    }

    #[test]
    fn slices_of_one_service_merge_sorted_and_deduplicated() {
        let mut t = EndpointsTracker::new(IpFamily::V4, "me");
        t.update(
            NamespacedName::new("default", "web-a"),
            Some(&slice("web-a", "web", &["10.0.0.2", "10.0.0.10"], 80)),
        )
        .unwrap();
        t.update(
            NamespacedName::new("default", "web-b"),
            Some(&slice("web-b", "web", &["10.0.0.10", "10.0.0.3"], 80)),
        )
        .unwrap();
        let changes = t.take();
        assert_eq!(changes.changed.len(), 1);
        // Sorted as strings, like upstream: "10.0.0.10:80" < "10.0.0.2:80".
        assert_eq!(
            addrs(&changes.snapshot),
            ["10.0.0.10:80", "10.0.0.2:80", "10.0.0.3:80"]
        );
    }

    /// Upstream's EndpointSliceCache: of two copies of one address, the one that is not
    /// terminating wins, whichever slice comes first and whichever copy is local (a new pod
    /// that reused the IP of a pod still terminating on this node).
    #[test]
    fn duplicate_prefers_the_copy_that_is_not_terminating() {
        let running = || {
            let mut s = slice("unused", "web", &["10.0.0.7"], 80);
            s.endpoints.as_mut().unwrap()[0].node_name = Some("other".into());
            s
        };
        let terminating = || {
            let mut s = slice("unused", "web", &["10.0.0.7"], 80);
            s.endpoints.as_mut().unwrap()[0].node_name = Some("me".into());
            s.endpoints.as_mut().unwrap()[0].conditions =
                Some(k8s_openapi::api::discovery::v1::EndpointConditions {
                    ready: Some(false),
                    serving: Some(true),
                    terminating: Some(true),
                });
            s
        };
        for (first, second) in [(running(), terminating()), (terminating(), running())] {
            let mut t = EndpointsTracker::new(IpFamily::V4, "me");
            for (name, mut s) in [("web-a", first), ("web-b", second)] {
                s.metadata.name = Some(name.into());
                t.update(NamespacedName::new("default", name), Some(&s)).unwrap();
            }
            let snap = t.take().snapshot;
            let eps = endpoints_for(&snap, &port());
            assert_eq!(eps.len(), 1, "{eps:?}");
            assert!(
                eps[0].ready && !eps[0].terminating && !eps[0].is_local,
                "the running copy wins: {eps:?}"
            );
        }
    }

    /// A Service with one slice: the snapshot holds that slice's lists, not a copy of them.
    #[test]
    fn a_single_slice_is_shared_with_the_snapshot() {
        let mut t = EndpointsTracker::new(IpFamily::V4, "me");
        let id = NamespacedName::new("default", "web-a");
        t.update(
            id.clone(),
            Some(&slice("web-a", "web", &["10.0.0.3", "10.0.0.2"], 80)),
        )
        .unwrap();
        let snap = t.take().snapshot;
        assert_eq!(addrs(&snap), ["10.0.0.2:80", "10.0.0.3:80"]);
        assert!(Arc::ptr_eq(&t.slices[&id].endpoints, &snap[&web()]));
    }

    /// Within one slice, duplicates resolve as across slices: the copy that is not
    /// terminating wins, whichever comes first.
    #[test]
    fn duplicates_within_one_slice_prefer_the_copy_that_is_not_terminating() {
        for terminating_first in [true, false] {
            let mut s = slice("web-a", "web", &["10.0.0.7", "10.0.0.7"], 80);
            let at = usize::from(!terminating_first);
            s.endpoints.as_mut().unwrap()[at].conditions =
                Some(k8s_openapi::api::discovery::v1::EndpointConditions {
                    ready: Some(false),
                    serving: Some(true),
                    terminating: Some(true),
                });
            let mut t = EndpointsTracker::new(IpFamily::V4, "me");
            t.update(NamespacedName::new("default", "web-a"), Some(&s))
                .unwrap();
            let snap = t.take().snapshot;
            let eps = endpoints_for(&snap, &port());
            assert_eq!(eps.len(), 1, "{eps:?}");
            assert!(eps[0].ready && !eps[0].terminating, "{eps:?}");
        }
    }

    /// The tracker keeps what the rules read: a version that differs only in the zone or
    /// in which other node runs an endpoint changes nothing; one that makes an endpoint
    /// local does.
    #[test]
    fn a_version_differing_only_in_what_no_rule_reads_changes_nothing() {
        let mut t = EndpointsTracker::new(IpFamily::V4, "me");
        let id = NamespacedName::new("default", "web-a");
        let base = slice("web-a", "web", &["10.0.0.2"], 80);
        assert!(t.record(id.clone(), Some(&base)).changed);
        t.take();
        let mut moved = base.clone();
        moved.endpoints.as_mut().unwrap()[0].node_name = Some("yet-another".into());
        moved.endpoints.as_mut().unwrap()[0].zone = Some("z9".into());
        assert!(!t.record(id.clone(), Some(&moved)).changed);
        let mut local = base;
        local.endpoints.as_mut().unwrap()[0].node_name = Some("me".into());
        assert!(t.record(id, Some(&local)).changed);
        assert!(endpoints_for(&t.take().snapshot, &port())[0].is_local);
    }

    /// Two copies that are both terminating: the first one seen (in slice-name order) stays.
    #[test]
    fn duplicate_terminating_copies_keep_the_first() {
        let mut t = EndpointsTracker::new(IpFamily::V4, "me");
        for (name, node) in [("web-a", "me"), ("web-b", "other")] {
            let mut s = slice(name, "web", &["10.0.0.7"], 80);
            s.endpoints.as_mut().unwrap()[0].node_name = Some(node.into());
            s.endpoints.as_mut().unwrap()[0].conditions =
                Some(k8s_openapi::api::discovery::v1::EndpointConditions {
                    ready: Some(false),
                    serving: Some(true),
                    terminating: Some(true),
                });
            t.update(NamespacedName::new("default", name), Some(&s)).unwrap();
        }
        let snap = t.take().snapshot;
        let eps = endpoints_for(&snap, &port());
        assert_eq!(eps.len(), 1);
        assert!(eps[0].is_local, "web-a's copy: {eps:?}");
    }

    /// Upstream's `EndpointSliceUpdate`: a trigger time is a sample only for a slice of this
    /// family that changed, and a slice deletion drops its Service's pending samples.
    #[test]
    fn trigger_times_follow_upstreams_sample_rule() {
        // Trigger times after the tracker started (a fixed future second).
        let annotated = |ip: &str, family: &str, second: u32| {
            let mut s = slice("web-a", "web", &[ip], 80);
            s.address_type = family.into();
            let stamp = format!("2999-01-01T00:00:{second:02}Z");
            s.metadata.annotations =
                Some([(kpr_model::LAST_CHANGE_TRIGGER_TIME_ANNOTATION.to_string(), stamp)].into());
            s
        };
        let id = NamespacedName::new("default", "web-a");
        let mut t = EndpointsTracker::new(IpFamily::V4, "me");
        t.update(id.clone(), Some(&annotated("10.0.0.1", "IPv4", 1)))
            .unwrap();
        // The same slice again (a relist): no new sample.
        t.update(id.clone(), Some(&annotated("10.0.0.1", "IPv4", 1)))
            .unwrap();
        // A slice of the other family: no sample.
        t.update(
            NamespacedName::new("default", "web-v6"),
            Some(&annotated("fd00::1", "IPv6", 2)),
        )
        .unwrap();
        assert_eq!(t.take_trigger_times().len(), 1);

        t.update(id.clone(), Some(&annotated("10.0.0.2", "IPv4", 3)))
            .unwrap();
        t.update(id, None).unwrap();
        assert_eq!(
            t.take_trigger_times(),
            [],
            "deleted before the sync: dropped, as upstream"
        );
    }

    /// Upstream's `EndpointSliceUpdate` asks for a sync only when the slice changed: not for
    /// the same version again, nor for a slice of the other family.
    #[test]
    fn record_says_whether_the_slice_changed() {
        let mut t = EndpointsTracker::new(IpFamily::V4, "me");
        let id = NamespacedName::new("default", "web-a");
        assert!(
            t.record(id.clone(), Some(&slice("web-a", "web", &["10.0.0.2"], 80)))
                .changed
        );
        assert!(
            !t.record(id.clone(), Some(&slice("web-a", "web", &["10.0.0.2"], 80)))
                .changed
        );
        assert!(
            t.record(id.clone(), Some(&slice("web-a", "web", &["10.0.0.3"], 80)))
                .changed
        );
        let mut v6 = slice("web-v6", "web", &["fd00::1"], 80);
        v6.address_type = "IPv6".into();
        let v6_id = NamespacedName::new("default", "web-v6");
        assert!(!t.record(v6_id.clone(), Some(&v6)).changed);
        assert!(!t.record(v6_id, None).changed, "never tracked");
        assert!(t.record(id.clone(), None).changed);
        assert!(!t.record(id, None).changed, "already gone");
    }

    /// A slice port feeds the Service port of the same name *and* protocol only, as
    /// upstream's ServicePortName key: a UDP "http" gives a TCP "http" no endpoints.
    #[test]
    fn a_port_of_another_protocol_feeds_nothing() {
        let mut t = EndpointsTracker::new(IpFamily::V4, "me");
        let mut udp = slice("web-a", "web", &["10.0.0.2"], 80);
        udp.ports.as_mut().unwrap()[0].protocol = Some("UDP".into());
        t.update(NamespacedName::new("default", "web-a"), Some(&udp))
            .unwrap();
        let snap = t.take().snapshot;
        assert!(endpoints_for(&snap, &port()).is_empty());
        let udp_port = ServicePortName::new("default", "web", "http", Protocol::Udp);
        assert_eq!(endpoints_for(&snap, &udp_port).len(), 1);
    }

    /// A slice belongs to the Service of its label *in its own namespace*.
    #[test]
    fn a_slice_feeds_the_service_of_its_own_namespace() {
        let mut t = EndpointsTracker::new(IpFamily::V4, "me");
        let mut other = slice("web-a", "web", &["10.0.0.2"], 80);
        other.metadata.namespace = Some("other".into());
        t.update(NamespacedName::new("other", "web-a"), Some(&other))
            .unwrap();
        let snap = t.take().snapshot;
        assert!(endpoints_for(&snap, &port()).is_empty());
        let theirs = ServicePortName::new("other", "web", "http", Protocol::Tcp);
        assert_eq!(endpoints_for(&snap, &theirs).len(), 1);
    }

    #[test]
    fn unchanged_merge_is_not_reported() {
        let mut t = EndpointsTracker::new(IpFamily::V4, "me");
        let id = NamespacedName::new("default", "web-a");
        t.update(id.clone(), Some(&slice("web-a", "web", &["10.0.0.2"], 80)))
            .unwrap();
        t.take();
        t.update(id.clone(), Some(&slice("web-a", "web", &["10.0.0.2"], 80)))
            .unwrap();
        assert!(t.take().changed.is_empty());
        t.update(id, None).unwrap();
        let changes = t.take();
        assert_eq!(changes.changed[0].service, web());
        assert!(changes.changed[0].current.is_none());
        assert!(changes.snapshot.is_empty());
    }

    /// A slice whose service-name label changes leaves its old Service. (Upstream's cache is
    /// keyed by the label of each new version, so there the old Service keeps the slice's
    /// endpoints until the slice is deleted; following the label is deliberate here.)
    #[test]
    fn relabelled_slice_moves_between_services() {
        let mut t = EndpointsTracker::new(IpFamily::V4, "me");
        let id = NamespacedName::new("default", "s");
        t.update(id.clone(), Some(&slice("s", "web", &["10.0.0.2"], 80)))
            .unwrap();
        t.take();
        t.update(id, Some(&slice("s", "api", &["10.0.0.2"], 80))).unwrap();
        let changes = t.take();
        let names: Vec<_> = changes.changed.iter().map(|c| c.service.to_string()).collect();
        assert_eq!(names, ["default/api", "default/web"]);
    }

    #[test]
    fn rejected_slice_removes_its_endpoints_only() {
        let mut t = EndpointsTracker::new(IpFamily::V4, "me");
        t.update(
            NamespacedName::new("default", "a"),
            Some(&slice("a", "web", &["10.0.0.2"], 80)),
        )
        .unwrap();
        t.update(
            NamespacedName::new("default", "b"),
            Some(&slice("b", "web", &["10.0.0.3"], 80)),
        )
        .unwrap();
        t.take();
        let mut bad = slice("b", "web", &["10.0.0.3"], 80);
        bad.metadata.labels = Some([("kubernetes.io/service-name".to_string(), "we/b".to_string())].into());
        let err = t
            .update(NamespacedName::new("default", "b"), Some(&bad))
            .unwrap_err();
        assert_eq!(err.field, "metadata.labels[\"kubernetes.io/service-name\"]");
        assert_eq!(addrs(&t.take().snapshot), ["10.0.0.2:80"]);
    }

    #[test]
    fn unusable_endpoints_are_returned_and_the_others_kept() {
        let mut t = EndpointsTracker::new(IpFamily::V4, "me");
        let ignored = t
            .update(
                NamespacedName::new("default", "a"),
                Some(&slice("a", "web", &["10.0.0.2", "10.0.0.300", "10.0.00.004"], 80)),
            )
            .unwrap();
        let fields: Vec<_> = ignored.iter().map(|w| w.field.as_str()).collect();
        assert_eq!(fields, ["endpoints[1].addresses[0]"]);
        assert_eq!(addrs(&t.take().snapshot), ["10.0.0.2:80", "10.0.0.4:80"]);
    }
}
