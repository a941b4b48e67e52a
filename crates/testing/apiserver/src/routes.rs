//! From a URL path to what it names, following the API server's path layout:
//! `/api/v1/...` for the core group, `/apis/{group}/{version}/...` for the others, and
//! `namespaces/{ns}/` before the plural of namespaced types.
//!
//! Pure, so the mapping (including which paths are *not* served) is tested without HTTP.

use crate::resources::{self, ResourceType};

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// `/`: the list of served paths.
    Root,
    Version,
    /// `/healthz`, `/livez`, `/readyz`.
    Health,
    /// `/api`: the core group's versions.
    CoreVersions,
    /// `/apis`: every other group.
    Groups,
    /// `/apis/{group}`.
    Group(&'static str),
    /// `/api/v1`, `/apis/{group}/{version}`: the resources of one group/version.
    Resources {
        group: &'static str,
        version: &'static str,
    },
    /// A type's objects, in one namespace or (for `None`) all of them.
    Collection {
        resource: &'static ResourceType,
        namespace: Option<String>,
    },
    /// One object; `namespace` is `None` for cluster-scoped types.
    Item {
        resource: &'static ResourceType,
        namespace: Option<String>,
        name: String,
    },
}

/// The route a path names, or `None` for anything this server does not serve.
pub(crate) fn route(path: &str) -> Option<Route> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segments.as_slice() {
        [] => Some(Route::Root),
        ["version"] => Some(Route::Version),
        ["healthz" | "livez" | "readyz"] => Some(Route::Health),
        ["api"] => Some(Route::CoreVersions),
        ["api", version, rest @ ..] => group_version_route("", version, rest),
        ["apis"] => Some(Route::Groups),
        ["apis", group] => resources::groups()
            .into_iter()
            .find(|g| g == group)
            .map(Route::Group),
        ["apis", group, version, rest @ ..] => group_version_route(group, version, rest),
        _ => None,
    }
}

fn group_version_route(group: &str, version: &str, rest: &[&str]) -> Option<Route> {
    let served_version = resources::versions_of(group)
        .into_iter()
        .find(|v| *v == version)?;
    let served_group = if group.is_empty() {
        ""
    } else {
        resources::groups().into_iter().find(|g| *g == group)?
    };
    let resource = |plural: &str| resources::by_path(served_group, served_version, plural);
    match rest {
        [] => Some(Route::Resources {
            group: served_group,
            version: served_version,
        }),
        ["namespaces", namespace, plural] => {
            let resource = resource(plural).filter(|r| r.namespaced)?;
            Some(Route::Collection {
                resource,
                namespace: Some(namespace.to_string()),
            })
        }
        ["namespaces", namespace, plural, name] => {
            let resource = resource(plural).filter(|r| r.namespaced)?;
            Some(Route::Item {
                resource,
                namespace: Some(namespace.to_string()),
                name: name.to_string(),
            })
        }
        [plural] => Some(Route::Collection {
            resource: resource(plural)?,
            namespace: None,
        }),
        [plural, name] => {
            let resource = resource(plural).filter(|r| !r.namespaced)?;
            Some(Route::Item {
                resource,
                namespace: None,
                name: name.to_string(),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{CORE_EVENTS, ENDPOINT_SLICES, EVENTS, NODES, SERVICES};

    fn collection(resource: &'static ResourceType, namespace: Option<&str>) -> Option<Route> {
        Some(Route::Collection {
            resource,
            namespace: namespace.map(str::to_string),
        })
    }

    #[test]
    fn collections_across_and_within_namespaces() {
        assert_eq!(route("/api/v1/services"), collection(&SERVICES, None));
        assert_eq!(
            route("/api/v1/namespaces/prod/services"),
            collection(&SERVICES, Some("prod"))
        );
        assert_eq!(
            route("/apis/discovery.k8s.io/v1/endpointslices"),
            collection(&ENDPOINT_SLICES, None)
        );
        assert_eq!(
            route("/apis/events.k8s.io/v1/namespaces/d/events"),
            collection(&EVENTS, Some("d"))
        );
        assert_eq!(
            route("/api/v1/namespaces/d/events"),
            collection(&CORE_EVENTS, Some("d"))
        );
        assert_eq!(route("/api/v1/nodes"), collection(&NODES, None));
    }

    #[test]
    fn items_respect_scope() {
        assert_eq!(
            route("/api/v1/nodes/n1"),
            Some(Route::Item {
                resource: &NODES,
                namespace: None,
                name: "n1".into()
            })
        );
        assert_eq!(
            route("/api/v1/namespaces/prod/services/web"),
            Some(Route::Item {
                resource: &SERVICES,
                namespace: Some("prod".into()),
                name: "web".into()
            })
        );
        assert_eq!(
            route("/api/v1/services/web"),
            None,
            "namespaced types have no cluster-wide items"
        );
        assert_eq!(
            route("/api/v1/namespaces/prod/nodes"),
            None,
            "nodes are cluster-scoped"
        );
    }

    #[test]
    fn discovery_paths() {
        assert_eq!(route("/api"), Some(Route::CoreVersions));
        assert_eq!(route("/apis/"), Some(Route::Groups));
        assert_eq!(
            route("/apis/discovery.k8s.io"),
            Some(Route::Group("discovery.k8s.io"))
        );
        assert_eq!(
            route("/api/v1"),
            Some(Route::Resources {
                group: "",
                version: "v1"
            })
        );
        assert_eq!(
            route("/apis/events.k8s.io/v1"),
            Some(Route::Resources {
                group: "events.k8s.io",
                version: "v1"
            })
        );
    }

    #[test]
    fn unserved_paths() {
        for path in [
            "/api/v2",
            "/api/v1/pods",
            "/apis/apps/v1/deployments",
            "/apis/discovery.k8s.io/v1beta1/endpointslices",
            "/api/v1/namespaces/prod/services/web/status",
            "/api/v1/namespaces/prod",
            "/apis/apps",
            "/metrics",
        ] {
            assert_eq!(route(path), None, "{path}");
        }
    }
}
