//! The objects a manifest can contribute, and their identity.
//!
//! Identity is (kind, namespace, name), as in the API server; two documents with the same
//! identity describe the same object, whichever file they sit in. Objects are shared
//! behind `Arc` so an unchanged object costs a pointer comparison on a rescan, not a
//! deep comparison.
//!
//! Between scans the catalog keeps a [`Stored`] form instead of the decoded object: its
//! compact JSON, decoded again only when an event must carry it. Typed API objects are
//! many small heap allocations (~5 KB for a Service and its 10-endpoint slice); the compact
//! JSON is a third of that in one allocation, and the trackers keep their own view anyway.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kpr_model::{NamespacedName, ObjectKind};

use kpr_model::{RejectReason, Rejection};

use super::claims::ServiceClaims;
use crate::Event;

/// Which object a document describes. Nodes and ServiceCIDRs are cluster-scoped: their
/// namespace is empty.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub kind: ObjectKind,
    pub id: NamespacedName,
}

impl ObjectKey {
    pub fn new(kind: ObjectKind, namespace: &str, name: &str) -> Self {
        Self {
            kind,
            id: NamespacedName::new(namespace, name),
        }
    }

    /// The event that tells consumers this object no longer exists.
    pub fn deletion(&self) -> Event {
        match self.kind {
            ObjectKind::Node => Event::Node { object: None },
            ObjectKind::ServiceCidr => Event::ServiceCidr {
                name: self.id.name.to_string(),
                object: None,
            },
            ObjectKind::EndpointSlice => Event::EndpointSlice {
                id: self.id.clone(),
                object: None,
            },
            // Manifest keys are never built; Service is the only remaining kind.
            ObjectKind::Service | ObjectKind::Manifest => Event::Service {
                id: self.id.clone(),
                object: None,
            },
        }
    }

    /// `ns/name` for namespaced objects, `name` for Nodes: what log lines and rejections show.
    /// Control characters are escaped: the name may be the very thing being rejected, and a
    /// newline in it must not start a forged log line.
    pub fn display_name(&self) -> String {
        if self.id.namespace.is_empty() {
            printable(&self.id.name).into_owned()
        } else {
            format!("{}/{}", printable(&self.id.namespace), printable(&self.id.name))
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind, self.display_name())
    }
}

/// `text` with control characters escaped (`\n`, `\u{1b}`), for untrusted names and paths
/// shown in logs and rejections.
pub(crate) fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A path as log lines and rejections show it: a file name inside a watched directory is
/// as untrusted as the file's contents.
pub(crate) fn shown_path(path: &std::path::Path) -> String {
    printable(&path.display().to_string()).into_owned()
}

/// One decoded object, as read from a manifest.
#[derive(Clone, Debug)]
pub enum ManifestObject {
    Service(Arc<Service>),
    EndpointSlice(Arc<EndpointSlice>),
    Node(Arc<Node>),
    ServiceCidr(Arc<ServiceCIDR>),
}

impl ManifestObject {
    /// Whether two versions describe the same content. Objects from an unchanged file are
    /// the very same allocation, so the deep comparison only runs for re-parsed files.
    pub fn same_content(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Service(a), Self::Service(b)) => Arc::ptr_eq(a, b) || a == b,
            (Self::EndpointSlice(a), Self::EndpointSlice(b)) => Arc::ptr_eq(a, b) || a == b,
            (Self::Node(a), Self::Node(b)) => Arc::ptr_eq(a, b) || a == b,
            (Self::ServiceCidr(a), Self::ServiceCidr(b)) => Arc::ptr_eq(a, b) || a == b,
            _ => false,
        }
    }

    /// The event announcing this object's newest state.
    pub fn to_event(&self, key: &ObjectKey) -> Event {
        match self {
            Self::Service(s) => Event::Service {
                id: key.id.clone(),
                object: Some(Arc::clone(s)),
            },
            Self::EndpointSlice(s) => Event::EndpointSlice {
                id: key.id.clone(),
                object: Some(Arc::clone(s)),
            },
            Self::Node(n) => Event::Node {
                object: Some(Arc::clone(n)),
            },
            Self::ServiceCidr(c) => Event::ServiceCidr {
                name: key.id.name.to_string(),
                object: Some(Arc::clone(c)),
            },
        }
    }
}

/// `object` as compact JSON in one exact allocation: written into a per-thread scratch
/// buffer first, so that the growing buffer's discarded steps do not leave holes between
/// the stored objects on the heap.
fn compact_json(object: &ManifestObject) -> Result<Arc<[u8]>, serde_json::Error> {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with_borrow_mut(|buffer| {
        buffer.clear();
        match object {
            ManifestObject::Service(s) => serde_json::to_writer(&mut *buffer, &**s)?,
            ManifestObject::EndpointSlice(s) => serde_json::to_writer(&mut *buffer, &**s)?,
            ManifestObject::Node(n) => serde_json::to_writer(&mut *buffer, &**n)?,
            ManifestObject::ServiceCidr(c) => serde_json::to_writer(&mut *buffer, &**c)?,
        }
        let json = Arc::from(&buffer[..]);
        // A huge object must not pin its buffer for the thread's life.
        if buffer.capacity() > 1 << 20 {
            *buffer = Vec::new();
        }
        Ok(json)
    })
}

/// What the catalog keeps of one object between scans: its kind, its compact JSON, and for
/// a Service what claims need (so that settling never decodes it).
///
/// Two versions are the same content when their JSON is byte for byte the same:
/// k8s-openapi serializes a value deterministically (fields in declaration order, maps
/// sorted). The one thing the JSON does not keep is a fraction of a second in `Time`
/// fields, which the API server never writes either.
#[derive(Clone, Debug)]
pub(crate) struct Stored {
    kind: ObjectKind,
    json: Arc<[u8]>,
    claims: Option<Arc<ServiceClaims>>,
}

impl Stored {
    /// The compact form of a decoded object.
    pub(crate) fn of(object: &ManifestObject) -> Result<Self, serde_json::Error> {
        let (kind, claims) = match object {
            ManifestObject::Service(s) => (ObjectKind::Service, Some(Arc::new(ServiceClaims::of(s)))),
            ManifestObject::EndpointSlice(_) => (ObjectKind::EndpointSlice, None),
            ManifestObject::Node(_) => (ObjectKind::Node, None),
            ManifestObject::ServiceCidr(_) => (ObjectKind::ServiceCidr, None),
        };
        Ok(Self {
            kind,
            json: compact_json(object)?,
            claims,
        })
    }

    /// What this Service claims; `None` for other kinds.
    pub(crate) fn service_claims(&self) -> Option<&ServiceClaims> {
        self.claims.as_deref()
    }

    /// Whether two versions describe the same content; versions kept from an unchanged
    /// file share their bytes, so this is mostly a pointer comparison.
    pub(crate) fn same_content(&self, other: &Self) -> bool {
        self.kind == other.kind && (Arc::ptr_eq(&self.json, &other.json) || self.json == other.json)
    }

    /// The object again, decoded from its JSON.
    pub(crate) fn decode(&self) -> Result<ManifestObject, serde_json::Error> {
        Ok(match self.kind {
            ObjectKind::EndpointSlice => {
                ManifestObject::EndpointSlice(Arc::new(serde_json::from_slice(&self.json)?))
            }
            ObjectKind::Node => ManifestObject::Node(Arc::new(serde_json::from_slice(&self.json)?)),
            ObjectKind::ServiceCidr => {
                ManifestObject::ServiceCidr(Arc::new(serde_json::from_slice(&self.json)?))
            }
            ObjectKind::Service | ObjectKind::Manifest => {
                ManifestObject::Service(Arc::new(serde_json::from_slice(&self.json)?))
            }
        })
    }

    /// The event announcing this version. JSON this catalog wrote always decodes; should it
    /// ever not, the object is reported as rejected rather than silently dropped.
    pub(crate) fn to_event(&self, key: &ObjectKey) -> Event {
        match self.decode() {
            Ok(object) => object.to_event(key),
            Err(error) => Event::Rejected(Rejection::new(
                key.kind,
                key.display_name(),
                "object",
                RejectReason::Malformed,
                format!(
                    "the catalog's stored form of this object does not decode ({error}); it is not programmed"
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_display_without_namespace() {
        let node = ObjectKey::new(ObjectKind::Node, "", "worker-1");
        assert_eq!(node.to_string(), "Node worker-1");
        let svc = ObjectKey::new(ObjectKind::Service, "shop", "web");
        assert_eq!(svc.to_string(), "Service shop/web");
    }

    #[test]
    fn names_with_control_characters_display_escaped() {
        let evil = ObjectKey::new(
            ObjectKind::Service,
            "default",
            "evil\n-A KUBE-SERVICES -j ACCEPT\n#",
        );
        assert_eq!(
            evil.display_name(),
            "default/evil\\n-A KUBE-SERVICES -j ACCEPT\\n#"
        );
        assert!(!evil.to_string().contains('\n'));
        let node = ObjectKey::new(ObjectKind::Node, "", "n\u{1b}[2J");
        assert_eq!(node.display_name(), "n\\u{1b}[2J");
        assert_eq!(printable("plain/name"), "plain/name");
    }

    #[test]
    fn same_content_compares_values_not_pointers() {
        let a = ManifestObject::Service(Arc::new(Service::default()));
        let b = ManifestObject::Service(Arc::new(Service::default()));
        assert!(a.same_content(&b));
        let mut changed = Service::default();
        changed.metadata.name = Some("x".into());
        assert!(!a.same_content(&ManifestObject::Service(Arc::new(changed))));
        let node = ManifestObject::Node(Arc::new(Node::default()));
        assert!(!a.same_content(&node));
    }

    #[test]
    fn stored_objects_decode_to_what_was_stored() {
        let service: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "creationTimestamp": "2025-01-01T00:00:00Z",
                         "labels": {"b": "2", "a": "1"}},
            "spec": {"type": "NodePort", "clusterIP": "10.0.0.1",
                     "ports": [{"port": 80, "nodePort": 30080, "targetPort": "http"}]}
        }))
        .unwrap();
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "shop"}, "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.1.0.1"], "conditions": {"ready": true}}],
            "ports": [{"port": 8080, "name": "http"}]
        }))
        .unwrap();
        let objects = [
            ManifestObject::Service(Arc::new(service)),
            ManifestObject::EndpointSlice(Arc::new(slice)),
            ManifestObject::Node(Arc::new(Node::default())),
            ManifestObject::ServiceCidr(Arc::new(ServiceCIDR::default())),
        ];
        for object in &objects {
            let stored = Stored::of(object).unwrap();
            let decoded = stored.decode().unwrap();
            assert!(
                decoded.same_content(object),
                "{object:?} came back as {decoded:?}"
            );
            assert!(Stored::of(&decoded).unwrap().same_content(&stored));
        }
        let service = Stored::of(&objects[0]).unwrap();
        assert!(service.service_claims().is_some());
        assert!(Stored::of(&objects[1]).unwrap().service_claims().is_none());
        assert!(!service.same_content(&Stored::of(&objects[1]).unwrap()));
    }

    #[test]
    fn stored_objects_differ_when_any_field_differs() {
        let mut a = Service::default();
        a.metadata.name = Some("x".into());
        let mut b = a.clone();
        b.metadata.annotations = Some([("k".to_owned(), "v".to_owned())].into());
        let a = Stored::of(&ManifestObject::Service(Arc::new(a))).unwrap();
        let b = Stored::of(&ManifestObject::Service(Arc::new(b))).unwrap();
        assert!(!a.same_content(&b));
        assert!(a.same_content(&a.clone()));
    }

    #[test]
    fn deletion_events_carry_the_identity() {
        let key = ObjectKey::new(ObjectKind::EndpointSlice, "shop", "web-abc");
        match key.deletion() {
            Event::EndpointSlice { id, object: None } => assert_eq!(id.to_string(), "shop/web-abc"),
            other => panic!("unexpected {other:?}"),
        }
        let node = ObjectKey::new(ObjectKind::Node, "", "n1");
        assert!(matches!(node.deletion(), Event::Node { object: None }));
        let cidr = ObjectKey::new(ObjectKind::ServiceCidr, "", "kubernetes");
        assert_eq!(cidr.to_string(), "ServiceCIDR kubernetes");
        assert!(matches!(cidr.deletion(), Event::ServiceCidr { name, object: None } if name == "kubernetes"));
    }
}
