//! The objects a manifest can contribute, and their identity.
//!
//! Identity is (kind, namespace, name), as in the API server; two documents with the same
//! identity describe the same object, whichever file they sit in. Objects are shared
//! behind `Arc` so an unchanged object costs a pointer comparison on a rescan, not a
//! deep comparison.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kpr_model::{NamespacedName, ObjectKind};

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
