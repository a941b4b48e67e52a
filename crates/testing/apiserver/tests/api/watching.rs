//! kube-runtime's `watcher` against the server: initial list (paged or streamed), then
//! changes, filtered by the selectors kube-proxy uses.

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::watcher;

use crate::common::{PROXIED, Watching, client, node, server, service, wait_for_watches};

#[tokio::test]
async fn watcher_lists_then_streams_changes() {
    let server = server().await;
    server.apply(&service("default", "a", &[])).unwrap();
    server.apply(&service("kube-system", "b", &[])).unwrap();
    let mut watching = Watching::start(
        Api::<Service>::all(client(&server).await),
        watcher::Config::default(),
    );
    assert_eq!(
        watching.take(4).await,
        [
            "Init",
            "InitApply(default/a)",
            "InitApply(kube-system/b)",
            "InitDone"
        ]
    );
    wait_for_watches(&server, 1).await;

    server.apply(&service("default", "c", &[])).unwrap();
    let mut changed = service("default", "a", &[]);
    changed.spec.as_mut().unwrap().cluster_ip = Some("10.96.0.11".into());
    server.apply(&changed).unwrap();
    server.apply(&changed).unwrap(); // no change, no event
    server.delete::<Service>("kube-system", "b").unwrap();
    server.apply(&node("node-1")).unwrap(); // another type: not this watch's business
    assert_eq!(
        watching.take(3).await,
        ["Apply(default/c)", "Apply(default/a)", "Delete(kube-system/b)"]
    );
    watching
        .is_quiet_for(std::time::Duration::from_millis(300))
        .await
        .unwrap();

    let watch = server
        .requests()
        .into_iter()
        .find(|r| r.is_watch())
        .expect("a watch request");
    assert_eq!(watch.param("allowWatchBookmarks"), Some("true"));
    assert!(watch.param("timeoutSeconds").is_some());
}

#[tokio::test]
async fn watcher_pages_the_initial_list() {
    let server = server().await;
    for name in ["a", "b", "c", "d", "e"] {
        server.apply(&service("default", name, &[])).unwrap();
    }
    let config = watcher::Config::default().page_size(2);
    let mut watching = Watching::start(Api::<Service>::all(client(&server).await), config);
    let events = watching.until("InitDone").await;
    assert_eq!(
        events,
        [
            "Init",
            "InitApply(default/a)",
            "InitApply(default/b)",
            "InitApply(default/c)",
            "InitApply(default/d)",
            "InitApply(default/e)",
            "InitDone"
        ]
    );
    let lists: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.is_list_of("/api/v1/services"))
        .collect();
    assert_eq!(lists.len(), 3, "{lists:?}");
    assert!(lists.iter().all(|r| r.param("limit") == Some("2")));
    assert!(lists[1].param("continue").is_some() && lists[2].param("continue").is_some());
}

#[tokio::test]
async fn selectors_filter_the_watch_including_label_changes() {
    let server = server().await;
    server.apply(&service("default", "plain", &[])).unwrap();
    server
        .apply(&service(
            "default",
            "headless",
            &[("service.kubernetes.io/headless", "")],
        ))
        .unwrap();
    let config = watcher::Config::default().labels(PROXIED);
    let mut watching = Watching::start(Api::<Service>::all(client(&server).await), config);
    assert_eq!(
        watching.take(3).await,
        ["Init", "InitApply(default/plain)", "InitDone"]
    );
    wait_for_watches(&server, 1).await;

    server
        .apply(&service(
            "default",
            "other",
            &[("service.kubernetes.io/service-proxy-name", "x")],
        ))
        .unwrap();
    server
        .apply(&service(
            "default",
            "plain",
            &[("service.kubernetes.io/headless", "")],
        ))
        .unwrap();
    server.apply(&service("default", "headless", &[])).unwrap();
    assert_eq!(
        watching.take(2).await,
        ["Delete(default/plain)", "Apply(default/headless)"]
    );
    watching
        .is_quiet_for(std::time::Duration::from_millis(300))
        .await
        .unwrap();
}

#[tokio::test]
async fn node_watch_by_field_selector_sees_only_this_node() {
    let server = server().await;
    server.apply(&node("node-1")).unwrap();
    server.apply(&node("node-2")).unwrap();
    let config = watcher::Config::default().fields("metadata.name=node-2");
    let mut watching = Watching::start(Api::<Node>::all(client(&server).await), config);
    assert_eq!(watching.take(3).await, ["Init", "InitApply(node-2)", "InitDone"]);
    wait_for_watches(&server, 1).await;
    let mut labelled = node("node-1");
    labelled.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
    server.apply(&labelled).unwrap();
    labelled.metadata.name = Some("node-2".into());
    server.apply(&labelled).unwrap();
    assert_eq!(watching.next().await, "Apply(node-2)");
}

#[tokio::test]
async fn streaming_lists_end_with_the_initial_events_bookmark() {
    let server = server().await;
    let slice = serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": { "name": "web-abc", "namespace": "default", "labels": { "kubernetes.io/service-name": "web" } },
        "addressType": "IPv4",
        "endpoints": [{ "addresses": ["10.0.0.1"] }],
    });
    server.apply_json(slice).unwrap();
    let config = watcher::Config::default().streaming_lists().labels(PROXIED);
    let mut watching = Watching::start(Api::<EndpointSlice>::all(client(&server).await), config);
    assert_eq!(
        watching.take(3).await,
        ["Init", "InitApply(default/web-abc)", "InitDone"]
    );
    server.delete::<EndpointSlice>("default", "web-abc").unwrap();
    assert_eq!(watching.next().await, "Delete(default/web-abc)");
    let requests = server.requests();
    assert!(
        requests.iter().all(|r| r.is_watch()),
        "no list request at all: {requests:?}"
    );
    assert_eq!(requests[0].param("sendInitialEvents"), Some("true"));
}

#[tokio::test]
async fn a_namespaced_watcher_sees_only_its_namespace() {
    let server = server().await;
    server.apply(&service("prod", "a", &[])).unwrap();
    server.apply(&service("dev", "a", &[])).unwrap();
    let api: Api<Service> = Api::namespaced(client(&server).await, "prod");
    let mut watching = Watching::start(api, watcher::Config::default());
    assert_eq!(watching.take(3).await, ["Init", "InitApply(prod/a)", "InitDone"]);
    wait_for_watches(&server, 1).await;
    server.apply(&service("dev", "b", &[])).unwrap();
    server.apply(&service("prod", "b", &[])).unwrap();
    assert_eq!(watching.next().await, "Apply(prod/b)");
}
