//! Exact wire shapes, checked with a raw HTTP/1.1 client: what the real server sends, byte
//! framing included.

use std::time::Duration;

use kpr_apiserver::Options;
use serde_json::json;

use crate::common::{node, raw, server, server_with, service, wait_for_watches};

#[tokio::test]
async fn list_documents_look_like_the_real_servers() {
    let server = server().await;
    server.apply(&service("default", "web", &[])).unwrap();
    let response = raw(&server, "GET", "/api/v1/namespaces/default/services", None).await;
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-type"), Some("application/json"));
    assert!(response.body().ends_with(b"\n"));
    let list = response.json();
    assert_eq!(list["kind"], "ServiceList");
    assert_eq!(list["apiVersion"], "v1");
    assert_eq!(
        list["metadata"]["resourceVersion"],
        server.resource_version().to_string()
    );
    assert!(list["metadata"].get("continue").is_none());
    let item = &list["items"][0];
    assert!(
        item.get("kind").is_none() && item.get("apiVersion").is_none(),
        "items carry no type: {item}"
    );
    assert_eq!(item["metadata"]["name"], "web");

    let empty = raw(&server, "GET", "/apis/discovery.k8s.io/v1/endpointslices", None)
        .await
        .json();
    assert_eq!(empty["kind"], "EndpointSliceList");
    assert_eq!(empty["apiVersion"], "discovery.k8s.io/v1");
    assert_eq!(empty["items"], json!([]));

    let single = raw(&server, "GET", "/api/v1/namespaces/default/services/web", None)
        .await
        .json();
    assert_eq!(
        (single["kind"].as_str(), single["apiVersion"].as_str()),
        (Some("Service"), Some("v1"))
    );
}

#[tokio::test]
async fn watches_are_chunked_json_lines_ended_by_timeout_seconds() {
    let server = server().await;
    server.apply(&service("default", "a", &[])).unwrap();
    let since = server.resource_version();
    let target = format!("/api/v1/services?watch=true&resourceVersion={since}&timeoutSeconds=2");
    let request = raw(&server, "GET", &target, None);
    let writes = async {
        wait_for_watches(&server, 1).await;
        server.apply(&service("default", "b", &[])).unwrap();
        server
            .delete::<k8s_openapi::api::core::v1::Service>("default", "a")
            .unwrap();
    };
    let (response, ()) = tokio::join!(request, writes);
    assert_eq!(response.status, 200);
    assert!(response.is_chunked());
    assert_eq!(response.header("content-type"), Some("application/json"));
    let events = response.lines(); // also checks the final chunk ended the stream cleanly
    let summary: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().into(),
                e["object"]["metadata"]["name"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [("ADDED".into(), "b".into()), ("DELETED".into(), "a".into())]
    );
    assert_eq!(
        events[0]["object"]["kind"], "Service",
        "watch objects carry their type"
    );
    let versions: Vec<u64> = events
        .iter()
        .map(|e| {
            e["object"]["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(
        versions,
        [since + 1, since + 2],
        "the deletion has its own version"
    );
}

#[tokio::test]
async fn a_watch_from_a_compacted_version_gets_an_in_stream_410() {
    let server = server().await;
    server.apply(&service("default", "a", &[])).unwrap();
    let held = server.resource_version();
    server.compact();
    let target = format!("/api/v1/services?watch=true&resourceVersion={held}&allowWatchBookmarks=true");
    let response = raw(&server, "GET", &target, None).await;
    assert_eq!(response.status, 200, "the error travels inside the stream");
    let events = response.lines();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "ERROR");
    let status = &events[0]["object"];
    assert_eq!(
        (status["kind"].as_str(), status["code"].as_u64()),
        (Some("Status"), Some(410))
    );
    assert_eq!(status["reason"], "Expired");
    assert_eq!(status["status"], "Failure");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .starts_with("too old resource version")
    );

    let list_target = format!("/api/v1/services?resourceVersion={held}&resourceVersionMatch=Exact");
    let list = raw(&server, "GET", &list_target, None).await;
    assert_eq!(
        (list.status, list.json()["reason"].as_str()),
        (410, Some("Expired"))
    );
}

#[tokio::test]
async fn initial_events_and_bookmarks() {
    let options = Options {
        bookmark_interval: Duration::from_secs(3600),
        ..Options::default()
    };
    let server = server_with(options).await;
    server.apply(&node("n1")).unwrap();
    let target = "/api/v1/nodes?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan\
                  &allowWatchBookmarks=true&timeoutSeconds=2";
    let request = raw(&server, "GET", target, None);
    let force = async {
        wait_for_watches(&server, 1).await;
        server.send_bookmarks();
    };
    let (response, ()) = tokio::join!(request, force);
    let events = response.lines();
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["ADDED", "BOOKMARK", "BOOKMARK"]);
    let end = &events[1]["object"];
    assert_eq!(
        end["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(end["kind"], "Node");
    assert_eq!(
        end["metadata"]["resourceVersion"],
        server.resource_version().to_string()
    );
    assert!(events[2]["object"]["metadata"].get("annotations").is_none());

    let unbookmarked = raw(
        &server,
        "GET",
        "/api/v1/nodes?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
        None,
    )
    .await;
    assert_eq!(
        (unbookmarked.status, unbookmarked.json()["reason"].as_str()),
        (422, Some("Invalid"))
    );
}

#[tokio::test]
async fn errors_are_status_objects() {
    let server = server().await;
    let not_found = raw(&server, "GET", "/api/v1/pods", None).await;
    assert_eq!(not_found.status, 404);
    assert_eq!(
        not_found.json(),
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "the server could not find the requested resource", "reason": "NotFound",
            "details": {}, "code": 404,
        })
    );
    assert_eq!(
        raw(&server, "GET", "/apis/apps/v1/deployments", None)
            .await
            .status,
        404
    );
    let cluster_post = raw(
        &server,
        "POST",
        "/api/v1/services",
        Some(("application/json", "{}")),
    )
    .await;
    assert_eq!(
        (cluster_post.status, cluster_post.json()["reason"].as_str()),
        (405, Some("MethodNotAllowed"))
    );
    let bad_selector = raw(&server, "GET", "/api/v1/services?labelSelector=a%20in%20b", None).await;
    assert_eq!(
        (bad_selector.status, bad_selector.json()["reason"].as_str()),
        (400, Some("BadRequest"))
    );
    let future = server.resource_version() + 10;
    let too_new = raw(
        &server,
        "GET",
        &format!("/api/v1/services?resourceVersion={future}&resourceVersionMatch=NotOlderThan"),
        None,
    )
    .await;
    let status = too_new.json();
    assert_eq!(
        (too_new.status, status["reason"].as_str()),
        (504, Some("Timeout"))
    );
    assert_eq!(
        status["details"]["causes"][0]["reason"],
        "ResourceVersionTooLarge"
    );
}

#[tokio::test]
async fn writes_over_http() {
    let server = server().await;
    let body =
        r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"web"},"spec":{"ports":[{"port":80}]}}"#;
    let created = raw(
        &server,
        "POST",
        "/api/v1/namespaces/prod/services",
        Some(("application/json", body)),
    )
    .await;
    assert_eq!(created.status, 201);
    let object = created.json();
    assert_eq!(object["metadata"]["namespace"], "prod");
    assert_eq!(
        object["metadata"]["resourceVersion"],
        server.resource_version().to_string()
    );

    let yaml = "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-1\n";
    assert_eq!(
        raw(&server, "POST", "/api/v1/nodes", Some(("application/yaml", yaml)))
            .await
            .status,
        201
    );

    let wrong_ns = r#"{"metadata":{"name":"x","namespace":"dev"}}"#;
    let mismatch = raw(
        &server,
        "POST",
        "/api/v1/namespaces/prod/services",
        Some(("application/json", wrong_ns)),
    )
    .await;
    assert_eq!(mismatch.status, 400);

    let patch = r#"[{"op":"replace","path":"/spec/ports/0/port","value":8080}]"#;
    let patched = raw(
        &server,
        "PATCH",
        "/api/v1/namespaces/prod/services/web",
        Some(("application/json-patch+json", patch)),
    )
    .await;
    assert_eq!(
        (
            patched.status,
            patched.json()["spec"]["ports"][0]["port"].as_u64()
        ),
        (200, Some(8080))
    );

    let gone = raw(
        &server,
        "DELETE",
        "/api/v1/namespaces/prod/services?labelSelector=",
        None,
    )
    .await;
    assert_eq!(gone.json()["items"][0]["metadata"]["name"], "web");
    assert!(
        server
            .get::<k8s_openapi::api::core::v1::Service>("prod", "web")
            .is_none()
    );
}

#[tokio::test]
async fn discovery_documents() {
    let server = server().await;
    let api = raw(&server, "GET", "/api", None).await.json();
    assert_eq!(api["kind"], "APIVersions");
    assert_eq!(api["versions"], json!(["v1"]));
    let groups = raw(&server, "GET", "/apis", None).await.json();
    let names: Vec<&str> = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["discovery.k8s.io", "events.k8s.io", "networking.k8s.io"]);
    let core = raw(&server, "GET", "/api/v1", None).await.json();
    assert_eq!(core["kind"], "APIResourceList");
    assert_eq!(raw(&server, "GET", "/healthz", None).await.body(), b"ok");
}

#[tokio::test]
async fn the_kubeconfig_names_the_server() {
    let server = server().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path).unwrap();
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    let cluster = kubeconfig.clusters[0].cluster.as_ref().unwrap();
    assert_eq!(cluster.server.as_deref(), Some(server.url().as_str()));
    assert_eq!(
        kubeconfig.current_context.as_deref(),
        Some(kpr_apiserver::kubeconfig::CONTEXT)
    );
}
