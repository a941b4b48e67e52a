//! The resource types this server serves, and how each is named on the wire.
//!
//! Everything else (paths, discovery documents, list kinds, field selectors) is derived from
//! this one table, so adding a resource type is adding one entry.

use std::fmt;

/// One served resource type (a group/version/plural triple with its kind and scope).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceType {
    /// API group; empty for the core group.
    pub group: &'static str,
    pub version: &'static str,
    /// Lower-case plural, as in URL paths (`services`).
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    /// Field-selector labels this type supports beyond `metadata.name`/`metadata.namespace`,
    /// each with the JSON path (object keys) it reads.
    pub extra_field_labels: &'static [(&'static str, &'static [&'static str])],
    /// Whether `PUT` on a missing object creates it (true for events, false for most types).
    pub allow_create_on_update: bool,
}

impl ResourceType {
    /// `v1` for the core group, `group/version` otherwise.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The `kind` of a list of this type (`ServiceList`).
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// `plural` for the core group, `plural.group` otherwise (kubectl's fully qualified name).
    pub fn qualified_name(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The JSON path a field-selector label reads, if this type supports the label.
    pub fn field_label_path(&self, label: &str) -> Option<&'static [&'static str]> {
        match label {
            "metadata.name" => Some(&["metadata", "name"]),
            "metadata.namespace" => Some(&["metadata", "namespace"]),
            _ => self
                .extra_field_labels
                .iter()
                .find(|(name, _)| *name == label)
                .map(|(_, path)| *path),
        }
    }
}

impl fmt::Display for ResourceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.qualified_name())
    }
}

pub static SERVICES: ResourceType = ResourceType {
    group: "",
    version: "v1",
    plural: "services",
    singular: "service",
    kind: "Service",
    namespaced: true,
    short_names: &["svc"],
    extra_field_labels: &[
        ("spec.clusterIP", &["spec", "clusterIP"]),
        ("spec.type", &["spec", "type"]),
    ],
    allow_create_on_update: false,
};

pub static NODES: ResourceType = ResourceType {
    group: "",
    version: "v1",
    plural: "nodes",
    singular: "node",
    kind: "Node",
    namespaced: false,
    short_names: &["no"],
    extra_field_labels: &[("spec.unschedulable", &["spec", "unschedulable"])],
    allow_create_on_update: false,
};

pub static CORE_EVENTS: ResourceType = ResourceType {
    group: "",
    version: "v1",
    plural: "events",
    singular: "event",
    kind: "Event",
    namespaced: true,
    short_names: &["ev"],
    extra_field_labels: &[
        ("involvedObject.kind", &["involvedObject", "kind"]),
        ("involvedObject.name", &["involvedObject", "name"]),
        ("involvedObject.namespace", &["involvedObject", "namespace"]),
        ("reason", &["reason"]),
        ("type", &["type"]),
    ],
    allow_create_on_update: true,
};

pub static ENDPOINT_SLICES: ResourceType = ResourceType {
    group: "discovery.k8s.io",
    version: "v1",
    plural: "endpointslices",
    singular: "endpointslice",
    kind: "EndpointSlice",
    namespaced: true,
    short_names: &[],
    extra_field_labels: &[],
    allow_create_on_update: false,
};

pub static EVENTS: ResourceType = ResourceType {
    group: "events.k8s.io",
    version: "v1",
    plural: "events",
    singular: "event",
    kind: "Event",
    namespaced: true,
    short_names: &["ev"],
    extra_field_labels: &[
        ("regarding.kind", &["regarding", "kind"]),
        ("regarding.name", &["regarding", "name"]),
        ("regarding.namespace", &["regarding", "namespace"]),
        ("reason", &["reason"]),
        ("type", &["type"]),
    ],
    allow_create_on_update: true,
};

pub static SERVICE_CIDRS: ResourceType = ResourceType {
    group: "networking.k8s.io",
    version: "v1",
    plural: "servicecidrs",
    singular: "servicecidr",
    kind: "ServiceCIDR",
    namespaced: false,
    short_names: &[],
    extra_field_labels: &[],
    allow_create_on_update: false,
};

/// Every served type, core group first (the order discovery lists them in).
pub static SERVED: [&ResourceType; 6] = [
    &SERVICES,
    &NODES,
    &CORE_EVENTS,
    &ENDPOINT_SLICES,
    &EVENTS,
    &SERVICE_CIDRS,
];

/// The API groups other than core, in discovery order.
pub fn groups() -> Vec<&'static str> {
    let mut groups: Vec<&'static str> = Vec::new();
    for resource in SERVED.iter().filter(|r| !r.group.is_empty()) {
        if !groups.contains(&resource.group) {
            groups.push(resource.group);
        }
    }
    groups
}

/// The types served in one group/version, in discovery order.
pub fn in_group_version(group: &str, version: &str) -> Vec<&'static ResourceType> {
    SERVED
        .iter()
        .copied()
        .filter(|r| r.group == group && r.version == version)
        .collect()
}

/// The versions served for a group (empty for a group that is not served).
pub fn versions_of(group: &str) -> Vec<&'static str> {
    let mut versions: Vec<&'static str> = Vec::new();
    for resource in SERVED.iter().filter(|r| r.group == group) {
        if !versions.contains(&resource.version) {
            versions.push(resource.version);
        }
    }
    versions
}

/// The type a URL path names.
pub fn by_path(group: &str, version: &str, plural: &str) -> Option<&'static ResourceType> {
    SERVED
        .iter()
        .copied()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The type an object's `apiVersion` and `kind` name.
pub fn by_type_meta(api_version: &str, kind: &str) -> Option<&'static ResourceType> {
    SERVED
        .iter()
        .copied()
        .find(|r| r.api_version() == api_version && r.kind == kind)
}

/// The type for a k8s-openapi resource type.
pub fn of<K: k8s_openapi::Resource>() -> Option<&'static ResourceType> {
    by_type_meta(K::API_VERSION, K::KIND)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice, events::v1::Event};

    #[test]
    fn openapi_types_map_to_served_types() {
        assert_eq!(of::<Service>(), Some(&SERVICES));
        assert_eq!(of::<EndpointSlice>(), Some(&ENDPOINT_SLICES));
        assert_eq!(of::<Event>(), Some(&EVENTS));
        assert_eq!(
            of::<k8s_openapi::api::networking::v1::ServiceCIDR>(),
            Some(&SERVICE_CIDRS)
        );
        assert_eq!(of::<k8s_openapi::api::core::v1::Event>(), Some(&CORE_EVENTS));
        assert_eq!(of::<k8s_openapi::api::core::v1::Pod>(), None);
    }

    #[test]
    fn wire_names() {
        assert_eq!(SERVICES.api_version(), "v1");
        assert_eq!(ENDPOINT_SLICES.api_version(), "discovery.k8s.io/v1");
        assert_eq!(ENDPOINT_SLICES.list_kind(), "EndpointSliceList");
        assert_eq!(
            groups(),
            vec!["discovery.k8s.io", "events.k8s.io", "networking.k8s.io"]
        );
        assert_eq!(SERVICE_CIDRS.api_version(), "networking.k8s.io/v1");
        assert_eq!(by_path("", "v1", "nodes"), Some(&NODES));
        assert_eq!(
            SERVICES.field_label_path("spec.type"),
            Some(&["spec", "type"][..])
        );
        assert_eq!(NODES.field_label_path("spec.type"), None);
    }
}
