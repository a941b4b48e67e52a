//! The manifest source against a real directory: files are created, edited, replaced and
//! removed while it runs, and the events must follow. Waits are generous deadlines, never
//! timing assertions; the periodic rescan is set to an hour so that only notifications
//! (and the emptied-file recheck) can make these tests pass.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns may panic: that fails the test

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kpr_model::{ObjectKind, RejectReason};
use kpr_sources::{Event, EventReceiver, MANIFESTS_SOURCE, ManifestSource, event_channel};

const PATIENCE: Duration = Duration::from_secs(30);
const RESYNC: Duration = Duration::from_secs(3600);

struct Running {
    events: EventReceiver,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn start(paths: Vec<PathBuf>, node_name: Option<&str>) -> Running {
    let source = ManifestSource::new(paths, node_name.map(Into::into), RESYNC).unwrap();
    let (sender, events) = event_channel();
    let task = tokio::spawn(source.run(sender));
    Running { events, task }
}

fn fixture() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/web-service.yaml");
    fs::read_to_string(path).unwrap()
}

/// Replaces a file the way careful editors and tools do: write a hidden temporary, rename it over.
fn write_atomically(path: &Path, text: &str) {
    let name = path.file_name().unwrap().to_string_lossy();
    let temp = path.with_file_name(format!(".{name}.tmp"));
    fs::write(&temp, text).unwrap();
    fs::rename(&temp, path).unwrap();
}

fn service(name: &str, cluster_ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{clusterIP: {cluster_ip}, ports: [{{port: 80}}]}}\n---\n"
    )
}

fn slice(addresses: &[&str]) -> String {
    let endpoints: Vec<String> = addresses
        .iter()
        .map(|a| format!("{{addresses: [{a}], conditions: {{ready: true}}}}"))
        .collect();
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, namespace: shop, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{port: 8080}}]\nendpoints: [{}]\n",
        endpoints.join(", ")
    )
}

fn describe(event: &Event) -> String {
    match event {
        Event::Service { id, object: Some(_) } => format!("+Service {id}"),
        Event::Service { id, object: None } => format!("-Service {id}"),
        Event::EndpointSlice { id, object: Some(s) } => {
            let addresses: Vec<_> = s
                .endpoints
                .iter()
                .flatten()
                .flat_map(|e| e.addresses.clone())
                .collect();
            format!("+EndpointSlice {id} [{}]", addresses.join(","))
        }
        Event::EndpointSlice { id, object: None } => format!("-EndpointSlice {id}"),
        Event::Node { object: Some(n) } => format!("+Node {}", n.metadata.name.as_deref().unwrap_or("")),
        Event::Node { object: None } => "-Node".into(),
        Event::ServiceCidr { name, object } => {
            format!("{}ServiceCIDR {name}", if object.is_some() { "+" } else { "-" })
        }
        Event::Synced { source } => format!("Synced {source}"),
        Event::Rejected(r) => format!("!{} {} {}", r.kind, r.object, r.reason.as_str()),
        Event::SourceTrouble { source, problem } => format!("?{source} {problem:?}"),
    }
}

fn summary(events: &[Event]) -> Vec<String> {
    events.iter().map(describe).collect()
}

/// Receives events until one described as `awaited` arrives; returns all of them, that one last.
async fn until(running: &mut Running, awaited: &str) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, running.events.recv()).await {
            Ok(Some(event)) => {
                let described = describe(&event);
                seen.push(described.clone());
                if described == awaited {
                    return seen;
                }
            }
            Ok(None) => panic!("source stopped while waiting for {awaited:?}; saw {seen:?}"),
            Err(_) => panic!("no {awaited:?} within {PATIENCE:?}; saw {seen:?}"),
        }
    }
}

fn synced() -> String {
    format!("Synced {MANIFESTS_SOURCE}")
}

#[tokio::test]
async fn initial_load_reports_objects_and_rejections_then_synced_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::write(root.join("web.yaml"), fixture()).unwrap();
    fs::write(root.join("garbage.yaml"), "kind: Service\n  metadata: [oops\n").unwrap();
    fs::write(
        root.join("deployment.yaml"),
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n",
    )
    .unwrap();
    fs::write(root.join(".hidden.yaml"), "{{{ not even read").unwrap();
    fs::write(root.join("README.md"), "{{{ not even read").unwrap();
    let mut running = start(vec![root.to_path_buf()], None);

    let initial = until(&mut running, &synced()).await;
    let garbage = root.join("garbage.yaml");
    assert_eq!(
        initial,
        [
            format!("!Manifest {} malformed", garbage.display()),
            "+Service shop/web".into(),
            "+EndpointSlice shop/web-8xk2p [10.244.1.12,10.244.2.31]".into(),
            synced(),
        ]
    );

    // Later changes arrive as differences only, and never with a second Synced.
    write_atomically(&root.join("db.yaml"), &service("db", "10.96.0.20"));
    assert_eq!(
        until(&mut running, "+Service shop/db").await,
        ["+Service shop/db"]
    );
    fs::remove_file(&garbage).unwrap();
    write_atomically(&root.join("cache.yaml"), &service("cache", "10.96.0.21"));
    let later = until(&mut running, "+Service shop/cache").await;
    assert_eq!(later, ["+Service shop/cache"]);
}

#[tokio::test]
async fn endpoints_follow_edits_from_one_to_three_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yaml");
    let one = format!("{}{}", service("web", "10.96.0.10"), slice(&["10.244.0.1"]));
    let three = format!(
        "{}{}",
        service("web", "10.96.0.10"),
        slice(&["10.244.0.1", "10.244.0.2", "10.244.0.3"])
    );
    fs::write(&file, &one).unwrap();
    let mut running = start(vec![dir.path().to_path_buf()], None);
    until(&mut running, &synced()).await;

    write_atomically(&file, &three);
    let grown = until(
        &mut running,
        "+EndpointSlice shop/web-1 [10.244.0.1,10.244.0.2,10.244.0.3]",
    )
    .await;
    assert_eq!(grown.len(), 1, "the unchanged Service is not re-sent: {grown:?}");

    // In place this time: truncate, then write. The short empty moment deletes nothing.
    fs::write(&file, &one).unwrap();
    let shrunk = until(&mut running, "+EndpointSlice shop/web-1 [10.244.0.1]").await;
    assert_eq!(shrunk, ["+EndpointSlice shop/web-1 [10.244.0.1]"]);
}

#[tokio::test]
async fn a_named_file_replaced_by_rename_is_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yaml");
    fs::write(&file, service("web", "10.96.0.10")).unwrap();
    // A neighbour that is not configured: its changes must not become events.
    fs::write(dir.path().join("other.yaml"), service("other", "10.96.0.99")).unwrap();
    let mut running = start(vec![file.clone()], None);
    assert_eq!(
        until(&mut running, &synced()).await,
        ["+Service shop/web", &synced()]
    );

    // What vim (backupcopy=no) does: write elsewhere, rename over the original.
    let replacement = dir.path().join("web.yaml.new");
    fs::write(
        &replacement,
        format!("{}{}", service("web", "10.96.0.10"), slice(&["10.244.0.7"])),
    )
    .unwrap();
    fs::rename(&replacement, &file).unwrap();
    write_atomically(&dir.path().join("other.yaml"), &service("other", "10.96.0.98"));
    let events = until(&mut running, "+EndpointSlice shop/web-1 [10.244.0.7]").await;
    assert_eq!(events, ["+EndpointSlice shop/web-1 [10.244.0.7]"]);
}

#[tokio::test]
async fn removing_a_file_deletes_its_objects_and_recreating_reloads_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yaml");
    let text = format!("{}{}", service("web", "10.96.0.10"), slice(&["10.244.0.1"]));
    fs::write(&file, &text).unwrap();
    let mut running = start(vec![file.clone()], None);
    until(&mut running, &synced()).await;

    fs::remove_file(&file).unwrap();
    let gone = until(&mut running, "-EndpointSlice shop/web-1").await;
    assert!(gone.contains(&"-Service shop/web".to_string()), "{gone:?}");

    fs::write(&file, &text).unwrap();
    let back = until(&mut running, "+EndpointSlice shop/web-1 [10.244.0.1]").await;
    assert!(back.contains(&"+Service shop/web".to_string()), "{back:?}");
}

#[tokio::test]
async fn a_file_turned_to_garbage_keeps_its_objects_until_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yaml");
    fs::write(&file, service("web", "10.96.0.10")).unwrap();
    fs::write(dir.path().join("db.yaml"), service("db", "10.96.0.20")).unwrap();
    let mut running = start(vec![dir.path().to_path_buf()], None);
    until(&mut running, &synced()).await;

    write_atomically(&file, "apiVersion: v1\nkind: Service\nmetadata: {name: web\n");
    let rejected = format!("!Manifest {} malformed", file.display());
    assert_eq!(
        until(&mut running, &rejected).await,
        std::slice::from_ref(&rejected)
    );

    let fixed = format!("{}{}", service("web", "10.96.0.10"), slice(&["10.244.0.5"]));
    write_atomically(&file, &fixed);
    // Nothing was deleted in between: the next event is the new slice, not a deletion.
    let events = until(&mut running, "+EndpointSlice shop/web-1 [10.244.0.5]").await;
    assert_eq!(events, ["+EndpointSlice shop/web-1 [10.244.0.5]"]);
}

#[tokio::test]
async fn a_bad_document_is_rejected_with_its_field_and_the_rest_loads() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yaml");
    let text = format!(
        "{}apiVersion: v1\nkind: Service\nmetadata: {{name: bad, namespace: shop}}\nspec: {{ports: [{{port: \"abc\"}}]}}\n",
        service("web", "10.96.0.10")
    );
    fs::write(&file, text).unwrap();
    let source = ManifestSource::new(vec![file.clone()], None, RESYNC).unwrap();
    let (sender, mut events) = event_channel();
    let task = tokio::spawn(source.run(sender));

    let mut seen = Vec::new();
    while !matches!(seen.last(), Some(Event::Synced { .. })) {
        let event = tokio::time::timeout(PATIENCE, events.recv())
            .await
            .unwrap()
            .unwrap();
        seen.push(event);
    }
    task.abort();
    let rejection = seen
        .iter()
        .find_map(|e| match e {
            Event::Rejected(r) => Some(r),
            _ => None,
        })
        .expect("a rejection");
    assert_eq!(rejection.kind, ObjectKind::Service);
    assert_eq!(rejection.object, "shop/bad");
    assert_eq!(rejection.field, "spec.ports[0].port");
    assert_eq!(rejection.reason, RejectReason::Malformed);
    assert!(
        rejection.detail.contains(&file.display().to_string()),
        "{}",
        rejection.detail
    );
    assert_eq!(summary(&seen)[1..], ["+Service shop/web".to_string(), synced()]);
}

#[tokio::test]
async fn this_nodes_node_comes_from_the_manifests() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nodes.yaml");
    let nodes = |zone: &str| {
        format!(
            "apiVersion: v1\nkind: NodeList\nitems:\n\
             - metadata: {{name: worker-1, labels: {{topology.kubernetes.io/zone: {zone}}}}}\n\
             - metadata: {{name: worker-2}}\n"
        )
    };
    fs::write(&file, nodes("a")).unwrap();
    let mut running = start(vec![file.clone()], Some("worker-1"));
    assert_eq!(
        until(&mut running, &synced()).await,
        ["+Node worker-1", &synced()]
    );
    write_atomically(&file, &nodes("b"));
    assert_eq!(until(&mut running, "+Node worker-1").await, ["+Node worker-1"]);
}

#[tokio::test]
async fn an_emptied_file_is_believed_after_a_moment() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yaml");
    fs::write(&file, service("web", "10.96.0.10")).unwrap();
    let mut running = start(vec![file.clone()], None);
    until(&mut running, &synced()).await;
    fs::write(&file, "").unwrap();
    assert_eq!(
        until(&mut running, "-Service shop/web").await,
        ["-Service shop/web"]
    );
}

#[tokio::test]
async fn the_source_stops_when_nobody_listens() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("web.yaml"), service("web", "10.96.0.10")).unwrap();
    let source = ManifestSource::new(vec![dir.path().to_path_buf()], None, RESYNC).unwrap();
    let (sender, mut events) = event_channel();
    let task = tokio::spawn(source.run(sender));
    while !matches!(events.recv().await, Some(Event::Synced { .. })) {}
    drop(events);
    tokio::time::timeout(PATIENCE, task)
        .await
        .expect("run returns once the receiver is gone")
        .unwrap();
}

#[tokio::test]
async fn a_file_that_grows_past_the_cap_keeps_its_last_good_contents() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yaml");
    let one = format!("{}{}", service("web", "10.96.0.10"), slice(&["10.244.0.1"]));
    fs::write(&file, &one).unwrap();
    let source = ManifestSource::new(vec![dir.path().to_path_buf()], None, RESYNC)
        .unwrap()
        .max_file_bytes(2048);
    let (sender, events) = event_channel();
    let mut running = Running {
        events,
        task: tokio::spawn(source.run(sender)),
    };
    until(&mut running, &synced()).await;

    // The new slice is padded past the cap: refused, the old one stays (no deletion).
    let padded = format!("{one}# {}\n", "x".repeat(4096));
    let padded = padded.replace("[10.244.0.1]", "[10.244.0.2]");
    write_atomically(&file, &padded);
    let rejected = format!("!Manifest {} too_large", file.display());
    assert_eq!(
        until(&mut running, &rejected).await,
        std::slice::from_ref(&rejected)
    );

    let two = format!("{}{}", service("web", "10.96.0.10"), slice(&["10.244.0.3"]));
    write_atomically(&file, &two);
    let events = until(&mut running, "+EndpointSlice shop/web-1 [10.244.0.3]").await;
    assert_eq!(events, ["+EndpointSlice shop/web-1 [10.244.0.3]"]);
}

#[tokio::test]
async fn an_edit_that_breaks_a_rule_keeps_the_last_good_version() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yaml");
    fs::write(&file, service("web", "10.96.0.10")).unwrap();
    let mut running = start(vec![dir.path().to_path_buf()], None);
    until(&mut running, &synced()).await;

    write_atomically(&file, &service("web", "10.96.0.1O"));
    assert_eq!(
        until(&mut running, "!Service shop/web invalid_ip").await,
        ["!Service shop/web invalid_ip"]
    );
    // Fixed: an update, not a re-creation after a deletion.
    write_atomically(&file, &service("web", "10.96.0.11"));
    assert_eq!(
        until(&mut running, "+Service shop/web").await,
        ["+Service shop/web"]
    );
}

#[tokio::test]
async fn the_node_port_range_is_the_sources_to_set() {
    let dir = tempfile::tempdir().unwrap();
    let node_port = |name: &str, ip: &str, port: u16| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{type: NodePort, clusterIP: {ip}, ports: [{{port: 80, nodePort: {port}}}]}}\n---\n"
        )
    };
    let text = format!(
        "{}{}",
        node_port("low", "10.96.0.80", 8080),
        node_port("usual", "10.96.0.81", 30080)
    );
    fs::write(dir.path().join("svc.yaml"), text).unwrap();
    let source = ManifestSource::new(vec![dir.path().to_path_buf()], None, RESYNC)
        .unwrap()
        .node_port_range(8000..=8999);
    let (sender, events) = event_channel();
    let mut running = Running {
        events,
        task: tokio::spawn(source.run(sender)),
    };
    assert_eq!(
        until(&mut running, &synced()).await,
        ["!Service shop/usual invalid_port", "+Service shop/low", &synced()]
    );
}
