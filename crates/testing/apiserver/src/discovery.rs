//! Discovery documents (`/api`, `/apis`, `/apis/{group}`, `/api/v1`, `/apis/{group}/{version}`,
//! the aggregated v2 form of `/api` and `/apis`, `/version`, `/`), all derived from the table
//! of served types so discovery never claims a type the server cannot serve.

use serde_json::{Value, json};

use crate::resources::{self, ResourceType};

/// What every served type supports.
const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// The media type of aggregated discovery, as clients ask for it in `Accept`.
const AGGREGATED_V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
const AGGREGATED_V2BETA1: &str = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";

/// Which form of `/api` or `/apis` a client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    Legacy,
    Aggregated {
        content_type: &'static str,
        api_version: &'static str,
    },
}

/// Picks the first media type in `Accept` this server can produce, as the server's content
/// negotiation does (clients list aggregated forms first, plain JSON as the fallback).
pub(crate) fn negotiate(accept: Option<&str>) -> Form {
    for offered in accept.unwrap_or_default().split(',') {
        let offered: String = offered.chars().filter(|c| !c.is_whitespace()).collect();
        if offered == AGGREGATED_V2 {
            return Form::Aggregated {
                content_type: AGGREGATED_V2,
                api_version: "apidiscovery.k8s.io/v2",
            };
        }
        if offered == AGGREGATED_V2BETA1 {
            return Form::Aggregated {
                content_type: AGGREGATED_V2BETA1,
                api_version: "apidiscovery.k8s.io/v2beta1",
            };
        }
        if offered.starts_with("application/json") || offered.starts_with("*/*") {
            return Form::Legacy;
        }
    }
    Form::Legacy
}

/// `/api` (legacy form).
pub(crate) fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": resources::versions_of(""),
        "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": server_address }],
    })
}

/// `/apis` (legacy form).
pub(crate) fn groups() -> Value {
    let groups: Vec<Value> = resources::groups().into_iter().map(group_entry).collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

/// `/apis/{group}`.
pub(crate) fn group(name: &str) -> Value {
    let mut entry = group_entry(name);
    entry["kind"] = json!("APIGroup");
    entry["apiVersion"] = json!("v1");
    entry
}

fn group_entry(name: &str) -> Value {
    let versions: Vec<Value> = resources::versions_of(name)
        .into_iter()
        .map(|version| json!({ "groupVersion": format!("{name}/{version}"), "version": version }))
        .collect();
    let preferred = versions.first().cloned().unwrap_or(Value::Null);
    json!({ "name": name, "versions": versions, "preferredVersion": preferred })
}

/// `/api/v1`, `/apis/{group}/{version}`.
pub(crate) fn resource_list(group: &str, version: &str) -> Value {
    let in_version = resources::in_group_version(group, version);
    let group_version = in_version.first().map(|r| r.api_version()).unwrap_or_default();
    let resources: Vec<Value> = in_version
        .iter()
        .map(|r| {
            json!({
                "name": r.plural,
                "singularName": r.singular,
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": VERBS,
                "shortNames": r.short_names,
            })
        })
        .collect();
    json!({ "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources })
}

/// Aggregated discovery: `/api` with `core` true, `/apis` otherwise.
pub(crate) fn aggregated(core: bool, api_version: &str) -> Value {
    let group_names: Vec<&str> = if core { vec![""] } else { resources::groups() };
    let items: Vec<Value> = group_names
        .into_iter()
        .map(|group| {
            let versions: Vec<Value> = resources::versions_of(group)
                .into_iter()
                .map(|version| {
                    let resources: Vec<Value> = resources::in_group_version(group, version)
                        .into_iter()
                        .map(aggregated_resource)
                        .collect();
                    json!({ "version": version, "resources": resources, "freshness": "Current" })
                })
                .collect();
            json!({ "metadata": { "name": group, "creationTimestamp": null }, "versions": versions })
        })
        .collect();
    json!({ "kind": "APIGroupDiscoveryList", "apiVersion": api_version, "metadata": {}, "items": items })
}

fn aggregated_resource(resource: &ResourceType) -> Value {
    json!({
        "resource": resource.plural,
        "responseKind": { "group": resource.group, "version": resource.version, "kind": resource.kind },
        "scope": if resource.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": resource.singular,
        "verbs": VERBS,
        "shortNames": resource.short_names,
    })
}

/// `/version`: a 1.35 server, which is what the k8s-openapi feature targets.
pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "35",
        "emulationMajor": "1",
        "emulationMinor": "35",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "34",
        "gitVersion": "v1.35.0-kpr-test-apiserver",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/`: every served path, sorted.
pub(crate) fn root_paths() -> Value {
    let mut paths = vec![
        "/api".to_string(),
        "/api/v1".to_string(),
        "/apis".to_string(),
        "/healthz".to_string(),
        "/livez".to_string(),
        "/readyz".to_string(),
        "/version".to_string(),
    ];
    for group in resources::groups() {
        paths.push(format!("/apis/{group}"));
        for version in resources::versions_of(group) {
            paths.push(format!("/apis/{group}/{version}"));
        }
    }
    paths.sort();
    json!({ "paths": paths })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_takes_the_first_producible_type() {
        let kube_rs = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,\
                       application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert!(matches!(
            negotiate(Some(kube_rs)),
            Form::Aggregated {
                api_version: "apidiscovery.k8s.io/v2",
                ..
            }
        ));
        assert_eq!(negotiate(Some("application/json")), Form::Legacy);
        assert_eq!(negotiate(None), Form::Legacy);
    }

    #[test]
    fn documents_name_only_served_types() {
        let core = resource_list("", "v1");
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["services", "nodes", "events"]);
        assert_eq!(core["groupVersion"], "v1");
        let slices = resource_list("discovery.k8s.io", "v1");
        assert_eq!(slices["groupVersion"], "discovery.k8s.io/v1");
        assert_eq!(slices["resources"][0]["kind"], "EndpointSlice");
        assert_eq!(
            groups()["groups"][0]["preferredVersion"]["groupVersion"],
            "discovery.k8s.io/v1"
        );
        let aggregated = aggregated(true, "apidiscovery.k8s.io/v2");
        assert_eq!(
            aggregated["items"][0]["versions"][0]["resources"][1]["scope"],
            "Cluster"
        );
    }
}
