//! Services, as lists of [`ServicePort`]s keyed by `namespace/name`.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kpr_model::{
    Converted, IgnoredValue, IpFamily, NamespacedName, Rejection, ServicePort, ServiceView, Sizes,
    service_view,
};

use crate::{Changes, Recorded};

/// Every proxied Service of one IP family, by `namespace/name`.
pub type ServiceMap = HashMap<NamespacedName, Arc<[ServicePort]>>;

/// One Service whose ports differ from what the proxier last saw.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceChange {
    pub id: NamespacedName,
    pub previous: Option<Arc<[ServicePort]>>,
    pub current: Option<Arc<[ServicePort]>>,
}

#[derive(Debug)]
pub struct ServiceTracker {
    family: IpFamily,
    applied: Arc<ServiceMap>,
    /// Newest state per Service not yet handed over; `None` = deleted (or rejected, or skipped).
    pending: HashMap<NamespacedName, Option<Arc<[ServicePort]>>>,
}

impl ServiceTracker {
    pub fn new(family: IpFamily) -> Self {
        Self {
            family,
            applied: Arc::default(),
            pending: HashMap::new(),
        }
    }

    /// Records the newest state of a Service (`None`: deleted). A rejected Service is treated
    /// as deleted, so rules for an object that became invalid do not linger; the rejection
    /// is returned for the caller to log and count. So are the list entries the conversion
    /// dropped from an accepted Service (once per update, not per sync).
    pub fn update(
        &mut self,
        id: NamespacedName,
        service: Option<&Service>,
    ) -> Result<Vec<IgnoredValue>, Rejection> {
        self.record(id, service).outcome
    }

    /// [`Self::update`], also saying whether the pending state changed.
    pub fn record(&mut self, id: NamespacedName, service: Option<&Service>) -> Recorded {
        let before = self.pending.get(&id).cloned();
        let (ports, outcome) = match service.map(|s| service_view(s, self.family)) {
            None => (None, Ok(Vec::new())),
            Some(Ok(Converted {
                view: ServiceView::Skipped(_),
                ignored,
            })) => (None, Ok(ignored)),
            Some(Ok(Converted {
                view: ServiceView::Proxied(ports),
                ignored,
            })) => (Some(Arc::from(share_name(ports, &id))), Ok(ignored)),
            Some(Err(rejection)) => (None, Err(rejection)),
        };
        let after = if self.applied.get(&id) == ports.as_ref() {
            self.pending.remove(&id);
            None
        } else {
            self.pending.insert(id, ports.clone());
            Some(ports)
        };
        Recorded {
            changed: before != after,
            outcome,
        }
    }

    /// Services with changes not yet handed to the proxier.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// How many Services it holds and how many changes wait (kpr_model::Sizes).
    pub fn footprint(&self) -> Sizes {
        Sizes::new()
            .with("applied", self.applied.len())
            .with("pending", self.pending.len())
    }

    /// The current map, without taking pending changes.
    pub fn snapshot(&self) -> Arc<ServiceMap> {
        self.applied.clone()
    }

    /// Hands over the pending changes and a snapshot that includes them.
    pub fn take(&mut self) -> Changes<ServiceChange, ServiceMap> {
        let applied = Arc::make_mut(&mut self.applied);
        let mut changed = Vec::with_capacity(self.pending.len());
        for (id, current) in self.pending.drain() {
            let previous = match &current {
                Some(ports) => applied.insert(id.clone(), ports.clone()),
                None => applied.remove(&id),
            };
            changed.push(ServiceChange {
                id,
                previous,
                current,
            });
        }
        self.pending.shrink_to(crate::ROOM_AFTER_TAKE);
        changed.sort_by(|a, b| a.id.cmp(&b.id));
        Changes {
            changed,
            snapshot: self.applied.clone(),
        }
    }
}

/// The ports with their Service's name shared with the tracker's key instead of their own
/// copy of the same two strings (two allocations per Service, ~3 MB at 50k).
fn share_name(mut ports: Vec<ServicePort>, id: &NamespacedName) -> Vec<ServicePort> {
    for port in &mut ports {
        if port.name.service == *id {
            port.name.service = id.clone();
        }
    }
    ports
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(ip: &str, port: u16) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"clusterIP": ip, "ports": [{"name": "http", "port": port}]}
        }))
        .unwrap()
    }

    fn id() -> NamespacedName {
        NamespacedName::new("default", "web")
    }

    #[test]
    fn add_then_take_reports_once() {
        let mut t = ServiceTracker::new(IpFamily::V4);
        t.update(id(), Some(&svc("10.0.0.1", 80))).unwrap();
        assert_eq!(t.pending(), 1);
        let changes = t.take();
        assert_eq!(changes.changed.len(), 1);
        assert!(changes.changed[0].previous.is_none());
        assert_eq!(changes.snapshot.len(), 1);
        assert!(t.take().changed.is_empty());
    }

    #[test]
    fn ports_share_the_name_of_the_key() {
        let mut t = ServiceTracker::new(IpFamily::V4);
        let key = id();
        t.update(key.clone(), Some(&svc("10.0.0.1", 80))).unwrap();
        let snapshot = t.take().snapshot;
        let port = &snapshot[&key][0];
        assert!(Arc::ptr_eq(&port.name.service.name, &key.name));
        assert!(Arc::ptr_eq(&port.name.service.namespace, &key.namespace));
    }

    #[test]
    fn update_and_revert_cancel_out() {
        let mut t = ServiceTracker::new(IpFamily::V4);
        t.update(id(), Some(&svc("10.0.0.1", 80))).unwrap();
        t.take();
        t.update(id(), Some(&svc("10.0.0.1", 81))).unwrap();
        t.update(id(), Some(&svc("10.0.0.1", 80))).unwrap();
        assert_eq!(t.pending(), 0);
        assert!(t.take().changed.is_empty());
    }

    #[test]
    fn add_then_delete_before_sync_is_a_no_op() {
        let mut t = ServiceTracker::new(IpFamily::V4);
        t.update(id(), Some(&svc("10.0.0.1", 80))).unwrap();
        t.update(id(), None).unwrap();
        assert_eq!(t.pending(), 0);
    }

    #[test]
    fn rejected_update_removes_the_service_and_reports_why() {
        let mut t = ServiceTracker::new(IpFamily::V4);
        t.update(id(), Some(&svc("10.0.0.1", 80))).unwrap();
        t.take();
        let err = t.update(id(), Some(&svc("10.0.0.999", 80))).unwrap_err();
        assert_eq!(err.field, "spec.clusterIP");
        let changes = t.take();
        assert!(changes.changed[0].current.is_none());
        assert!(changes.snapshot.is_empty());
    }

    #[test]
    fn dropped_entries_are_returned_and_the_rest_is_tracked() {
        let mut t = ServiceTracker::new(IpFamily::V4);
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"clusterIP": "10.0.0.1", "externalIPs": ["192.0.2.1", "192.0.2.x"],
                     "ports": [{"name": "http", "port": 80}]}
        }))
        .unwrap();
        let ignored = t.update(id(), Some(&svc)).unwrap();
        let fields: Vec<_> = ignored.iter().map(|w| w.field.as_str()).collect();
        assert_eq!(fields, ["spec.externalIPs[1]"]);
        let snapshot = t.take().snapshot;
        let ports = &snapshot[&id()];
        assert_eq!(
            ports[0].external_ips,
            ["192.0.2.1".parse::<std::net::IpAddr>().unwrap()]
        );
    }

    /// Upstream's `Update` asks for a sync only when something is pending: the same version
    /// again, or an update and its revert, change nothing.
    #[test]
    fn record_says_whether_anything_changed() {
        let mut t = ServiceTracker::new(IpFamily::V4);
        assert!(t.record(id(), Some(&svc("10.0.0.1", 80))).changed);
        assert!(!t.record(id(), Some(&svc("10.0.0.1", 80))).changed, "same again");
        t.take();
        assert!(!t.record(id(), Some(&svc("10.0.0.1", 80))).changed, "as applied");
        assert!(t.record(id(), Some(&svc("10.0.0.1", 81))).changed);
        assert!(t.record(id(), Some(&svc("10.0.0.1", 80))).changed, "the revert");
        assert_eq!(t.pending(), 0);
        let v6: Service = serde_json::from_value(json!({
            "metadata": {"name": "v6", "namespace": "default"},
            "spec": {"clusterIP": "fd00::1", "ports": [{"port": 80}]}
        }))
        .unwrap();
        let other = NamespacedName::new("default", "v6");
        assert!(!t.record(other, Some(&v6)).changed, "other family");
    }

    #[test]
    fn snapshot_held_by_proxier_is_not_mutated() {
        let mut t = ServiceTracker::new(IpFamily::V4);
        t.update(id(), Some(&svc("10.0.0.1", 80))).unwrap();
        let first = t.take().snapshot;
        t.update(id(), None).unwrap();
        let second = t.take().snapshot;
        assert_eq!(first.len(), 1);
        assert!(second.is_empty());
    }
}
