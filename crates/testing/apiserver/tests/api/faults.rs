//! Faults a real control plane has, and how kube-runtime's watcher recovers from each: a
//! dropped watch resumes, a compacted history forces a relist, a killed server is retried
//! until it is back, a hung server just delays.

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kpr_apiserver::Options;
use kube::Api;
use kube::api::ListParams;
use kube::runtime::watcher;

use crate::common::{
    PATIENCE, Watching, client, node, server, server_with, service, wait_for_request, wait_for_watches,
};

#[tokio::test]
async fn dropped_watches_resume_without_a_relist() {
    let server = server().await;
    server.apply(&service("default", "a", &[])).unwrap();
    let mut watching = Watching::start(
        Api::<Service>::all(client(&server).await),
        watcher::Config::default(),
    );
    assert_eq!(
        watching.take(3).await,
        ["Init", "InitApply(default/a)", "InitDone"]
    );
    wait_for_watches(&server, 1).await;
    let listed_at = server.resource_version();

    server.clear_requests();
    assert_eq!(server.drop_watches(), 1);
    server.apply(&service("default", "b", &[])).unwrap();
    assert_eq!(watching.next().await, "Apply(default/b)");

    let requests = server.requests();
    assert!(
        requests.iter().all(|r| r.is_watch()),
        "resumed without listing: {requests:?}"
    );
    assert_eq!(
        requests[0].param("resourceVersion"),
        Some(listed_at.to_string().as_str())
    );
}

#[tokio::test]
async fn compaction_makes_a_resuming_watcher_relist() {
    let server = server().await;
    server.apply(&service("default", "a", &[])).unwrap();
    server.apply(&service("default", "b", &[])).unwrap();
    let mut watching = Watching::start(
        Api::<Service>::all(client(&server).await),
        watcher::Config::default(),
    );
    assert_eq!(watching.until("InitDone").await.len(), 4);
    wait_for_watches(&server, 1).await;

    // While the watch is down: b goes, c comes, and the history of it is compacted away.
    server.pause();
    server.drop_watches();
    server.delete::<Service>("default", "b").unwrap();
    server.apply(&service("default", "c", &[])).unwrap();
    server.compact();
    server.resume();

    assert_eq!(
        watching.take(5).await,
        [
            "Error(410 Expired)",
            "Init",
            "InitApply(default/a)",
            "InitApply(default/c)",
            "InitDone"
        ]
    );
    server.apply(&service("default", "d", &[])).unwrap();
    assert_eq!(watching.next().await, "Apply(default/d)");
}

#[tokio::test]
async fn a_small_history_window_expires_slow_watchers() {
    let server = server_with(Options {
        history_limit: 3,
        ..Options::default()
    })
    .await;
    server.apply(&service("default", "a", &[])).unwrap();
    let mut watching = Watching::start(
        Api::<Service>::all(client(&server).await),
        watcher::Config::default(),
    );
    assert_eq!(
        watching.take(3).await,
        ["Init", "InitApply(default/a)", "InitDone"]
    );
    wait_for_watches(&server, 1).await;
    server.pause();
    server.drop_watches();
    for name in ["n1", "n2", "n3", "n4"] {
        server.apply(&node(name)).unwrap();
    }
    server.resume();
    assert_eq!(
        watching.take(4).await,
        ["Error(410 Expired)", "Init", "InitApply(default/a)", "InitDone"]
    );
}

#[tokio::test]
async fn a_killed_and_restarted_server_is_watched_again() {
    let server = server().await;
    server.apply(&service("default", "a", &[])).unwrap();
    let mut watching = Watching::start_with_backoff(
        Api::<Service>::all(client(&server).await),
        watcher::Config::default(),
    );
    assert_eq!(
        watching.take(3).await,
        ["Init", "InitApply(default/a)", "InitDone"]
    );
    wait_for_watches(&server, 1).await;

    server.stop().await;
    assert!(!server.is_running());
    assert_eq!(server.open_watches(), 0, "every connection was cut");
    let refused = tokio::net::TcpStream::connect(server.addr()).await.unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    // The watcher notices: its reconnect is refused.
    assert!(watching.next().await.starts_with("Error("));

    server.apply(&service("default", "b", &[])).unwrap();
    server.restart().await.unwrap();
    let events = watching.until("Apply(default/b)").await;
    assert!(
        events
            .iter()
            .all(|e| e.starts_with("Error(") || e == "Apply(default/b)"),
        "{events:?}"
    );
}

#[tokio::test]
async fn bookmarks_move_the_resume_point_forward() {
    let options = Options {
        bookmark_interval: Duration::from_millis(100),
        ..Options::default()
    };
    let server = server_with(options).await;
    server.apply(&service("default", "a", &[])).unwrap();
    let mut watching = Watching::start(
        Api::<Service>::all(client(&server).await),
        watcher::Config::default(),
    );
    assert_eq!(
        watching.take(3).await,
        ["Init", "InitApply(default/a)", "InitDone"]
    );
    wait_for_watches(&server, 1).await;
    let listed_at = server.resource_version();

    // Writes to another type move the global version; only bookmarks tell this watcher.
    server.apply(&node("n1")).unwrap();
    server.apply(&node("n2")).unwrap();
    let head = server.resource_version();
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.clear_requests();
    server.drop_watches();
    let resumed = wait_for_request(&server, |r| r.is_watch()).await;
    assert_ne!(listed_at, head);
    assert_eq!(resumed.param("resourceVersion"), Some(head.to_string().as_str()));
}

#[tokio::test]
async fn a_paused_server_holds_requests_until_resumed() {
    let server = server().await;
    server.apply(&service("default", "a", &[])).unwrap();
    let api: Api<Service> = Api::all(client(&server).await);
    server.pause();
    let list = tokio::spawn({
        let api = api.clone();
        async move { api.list(&ListParams::default()).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!list.is_finished(), "the list is held while paused");
    server.resume();
    let listed = tokio::time::timeout(PATIENCE, list)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(listed.items.len(), 1);
}

#[tokio::test]
async fn a_paused_server_delivers_watch_events_on_resume() {
    let server = server().await;
    let mut watching = Watching::start(
        Api::<Service>::all(client(&server).await),
        watcher::Config::default(),
    );
    assert_eq!(watching.take(2).await, ["Init", "InitDone"]);
    wait_for_watches(&server, 1).await;
    server.pause();
    server.apply(&service("default", "a", &[])).unwrap();
    watching.is_quiet_for(Duration::from_millis(300)).await.unwrap();
    server.resume();
    assert_eq!(watching.next().await, "Apply(default/a)");
}
