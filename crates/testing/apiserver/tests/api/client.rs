//! Requests kube-rs's `Api` makes: list (pagination, selectors), get/create/replace/delete,
//! discovery, the event recorder, and errors as `Status`.

use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod, Service};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, ResourceExt};

use crate::common::{PROXIED, client, node, server, service};

#[tokio::test]
async fn list_paginates_with_limit_and_continue() {
    let server = server().await;
    for name in ["e", "a", "g", "c", "b", "f", "d"] {
        server.apply(&service("default", name, &[])).unwrap();
    }
    server.apply(&service("other", "z", &[])).unwrap();
    let api: Api<Service> = Api::all(client(&server).await);

    let first = api.list(&ListParams::default().limit(3)).await.unwrap();
    let names =
        |list: &kube::core::ObjectList<Service>| list.items.iter().map(|s| s.name_any()).collect::<Vec<_>>();
    assert_eq!(names(&first), ["a", "b", "c"]);
    assert_eq!(first.metadata.remaining_item_count, Some(5));
    let token = first.metadata.continue_.clone().expect("a continue token");
    let second = api
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(&second), ["d", "e", "f"]);
    assert_eq!(
        second.metadata.resource_version, first.metadata.resource_version,
        "one snapshot"
    );

    // A write between pages does not show up in later pages of the same list.
    server.apply(&service("default", "fa", &[])).unwrap();
    let token = second.metadata.continue_.clone().expect("a continue token");
    let last = api
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(&last), ["g", "z"]);
    assert_eq!(last.metadata.continue_, None);

    let namespaced: Api<Service> = Api::namespaced(client(&server).await, "other");
    assert_eq!(
        names(&namespaced.list(&ListParams::default()).await.unwrap()),
        ["z"]
    );
}

#[tokio::test]
async fn a_compacted_continue_token_is_gone() {
    let server = server().await;
    for name in ["a", "b", "c"] {
        server.apply(&service("default", name, &[])).unwrap();
    }
    let api: Api<Service> = Api::all(client(&server).await);
    let first = api.list(&ListParams::default().limit(1)).await.unwrap();
    server.compact();
    let token = first.metadata.continue_.expect("a continue token");
    let error = api
        .list(&ListParams::default().limit(1).continue_token(&token))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = error else {
        panic!("expected a Status, got {error:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
}

#[tokio::test]
async fn selectors_filter_lists_like_kube_proxy_needs() {
    let server = server().await;
    server.apply(&service("default", "plain", &[])).unwrap();
    server
        .apply(&service(
            "default",
            "headless",
            &[("service.kubernetes.io/headless", "")],
        ))
        .unwrap();
    server
        .apply(&service(
            "default",
            "other",
            &[("service.kubernetes.io/service-proxy-name", "x")],
        ))
        .unwrap();
    server.apply(&node("node-1")).unwrap();
    server.apply(&node("node-2")).unwrap();
    let client = client(&server).await;

    let services: Api<Service> = Api::all(client.clone());
    let proxied = services
        .list(&ListParams::default().labels(PROXIED))
        .await
        .unwrap();
    assert_eq!(
        proxied.items.iter().map(|s| s.name_any()).collect::<Vec<_>>(),
        ["plain"]
    );

    let nodes: Api<Node> = Api::all(client);
    let mine = nodes
        .list(&ListParams::default().fields("metadata.name=node-2"))
        .await
        .unwrap();
    assert_eq!(
        mine.items.iter().map(|n| n.name_any()).collect::<Vec<_>>(),
        ["node-2"]
    );

    let error = services
        .list(&ListParams::default().labels("a in b"))
        .await
        .unwrap_err();
    assert!(
        matches!(error, kube::Error::Api(ref s) if s.code == 400),
        "{error:?}"
    );
    let error = nodes
        .list(&ListParams::default().fields("spec.clusterIP=1.2.3.4"))
        .await
        .unwrap_err();
    assert!(
        matches!(error, kube::Error::Api(ref s) if s.code == 400),
        "{error:?}"
    );
}

#[tokio::test]
async fn single_object_requests_round_trip() {
    let server = server().await;
    let api: Api<Service> = Api::namespaced(client(&server).await, "prod");
    let created = api
        .create(&PostParams::default(), &service("prod", "web", &[]))
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
    assert_eq!(api.get("web").await.unwrap().metadata.uid, created.metadata.uid);
    let again = api
        .create(&PostParams::default(), &service("prod", "web", &[]))
        .await
        .unwrap_err();
    assert!(
        matches!(again, kube::Error::Api(ref s) if s.code == 409 && s.reason == "AlreadyExists"),
        "{again:?}"
    );

    let mut changed = created.clone();
    changed.spec.as_mut().unwrap().cluster_ip = Some("10.96.0.99".into());
    let replaced = api
        .replace("web", &PostParams::default(), &changed)
        .await
        .unwrap();
    assert_ne!(replaced.resource_version(), created.resource_version());
    let stale = api
        .replace("web", &PostParams::default(), &changed)
        .await
        .unwrap_err();
    assert!(
        matches!(stale, kube::Error::Api(ref s) if s.code == 409 && s.reason == "Conflict"),
        "{stale:?}"
    );

    api.delete("web", &DeleteParams::default()).await.unwrap();
    let gone = api.get("web").await.unwrap_err();
    let kube::Error::Api(status) = gone else {
        panic!("expected a Status")
    };
    assert_eq!((status.code, status.reason.as_str()), (404, "NotFound"));
    assert_eq!(status.message, "services \"web\" not found");
    assert!(server.get::<Service>("prod", "web").is_none());
}

/// ServiceCIDRs are cluster-scoped: created, listed and deleted without a namespace.
#[tokio::test]
async fn service_cidrs_are_served_cluster_wide() {
    let server = server().await;
    let api: Api<ServiceCIDR> = Api::all(client(&server).await);
    let object: ServiceCIDR = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "kubernetes"},
        "spec": {"cidrs": ["10.96.0.0/16"]}
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &object).await.unwrap();
    assert_eq!(created.metadata.namespace, None);
    let listed = api.list(&ListParams::default()).await.unwrap();
    let names: Vec<String> = listed.items.iter().map(ResourceExt::name_any).collect();
    assert_eq!(names, ["kubernetes"]);
    assert!(server.get::<ServiceCIDR>("", "kubernetes").is_some());
    api.delete("kubernetes", &DeleteParams::default()).await.unwrap();
    assert!(api.list(&ListParams::default()).await.unwrap().items.is_empty());
}

#[tokio::test]
async fn unserved_types_are_404() {
    let server = server().await;
    let pods: Api<Pod> = Api::all(client(&server).await);
    let error = pods.list(&ListParams::default()).await.unwrap_err();
    let kube::Error::Api(status) = error else {
        panic!("expected a Status, got {error:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (404, "NotFound"));
    assert_eq!(status.message, "the server could not find the requested resource");
}

#[tokio::test]
async fn discovery_finds_the_served_types() {
    let server = server().await;
    let client = client(&server).await;
    assert_eq!(client.apiserver_version().await.unwrap().minor, "35");
    for discovery in [
        kube::Discovery::new(client.clone()).run().await.unwrap(),
        kube::Discovery::new(client.clone())
            .run_aggregated()
            .await
            .unwrap(),
    ] {
        let slices = discovery
            .get("discovery.k8s.io")
            .expect("the discovery.k8s.io group");
        let (resource, capabilities) = slices.recommended_kind("EndpointSlice").expect("EndpointSlices");
        assert_eq!(resource.plural, "endpointslices");
        assert_eq!(capabilities.scope, kube::discovery::Scope::Namespaced);
        assert!(capabilities.supports_operation(kube::discovery::verbs::WATCH));
        let core = discovery.get("").expect("the core group");
        let (nodes, capabilities) = core.recommended_kind("Node").expect("Nodes");
        assert_eq!(
            (nodes.plural.as_str(), capabilities.scope.clone()),
            ("nodes", kube::discovery::Scope::Cluster)
        );
        assert!(discovery.get("apps").is_none());
    }
}

#[tokio::test]
async fn event_recorder_creates_then_patches_a_series() {
    let server = server().await;
    let reporter = Reporter {
        controller: "kube-proxy".into(),
        instance: Some("node-1".into()),
    };
    let recorder = Recorder::new(client(&server).await, reporter);
    let node_ref = ObjectReference {
        kind: Some("Node".into()),
        name: Some("node-1".into()),
        ..Default::default()
    };
    let event = Event {
        type_: EventType::Normal,
        reason: "Starting".into(),
        note: Some("Starting kube-proxy.".into()),
        action: "StartKubeProxy".into(),
        secondary: None,
    };
    recorder.publish(&event, &node_ref).await.unwrap();
    recorder.publish(&event, &node_ref).await.unwrap();

    let stored = server.list::<K8sEvent>();
    assert_eq!(stored.len(), 1, "the repeat patched the first event: {stored:?}");
    assert_eq!(stored[0].namespace().as_deref(), Some("default"));
    assert_eq!(stored[0].series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(stored[0].reason.as_deref(), Some("Starting"));
    let methods: Vec<String> = server
        .requests()
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    let prefix = "/apis/events.k8s.io/v1/namespaces/default/events";
    assert_eq!(methods[0], format!("POST {prefix}"));
    assert!(
        methods[1].starts_with(&format!("PATCH {prefix}/node-1.")),
        "{methods:?}"
    );
}
