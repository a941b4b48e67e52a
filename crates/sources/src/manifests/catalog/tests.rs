use std::path::PathBuf;
use std::time::{Duration, Instant};

use kpr_model::{ObjectKind, RejectReason};

use super::{EMPTY_FILE_GRACE, FileRead, ManifestCatalog, Snapshot};
use crate::Event;
use crate::manifests::ValidationRules;

fn service(name: &str, cluster_ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec: {{clusterIP: {cluster_ip}, ports: [{{port: 80}}]}}\n---\n"
    )
}

fn slice(name: &str, addresses: &[&str]) -> String {
    let endpoints: Vec<String> = addresses
        .iter()
        .map(|a| format!("{{addresses: [{a}]}}"))
        .collect();
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nendpoints: [{}]\n---\n",
        endpoints.join(", ")
    )
}

fn snapshot_at(files: &[(&str, &str)], taken_at: Instant) -> Snapshot {
    let mut snapshot = Snapshot::new(taken_at);
    for (path, text) in files {
        snapshot
            .files
            .insert(PathBuf::from(path), FileRead::Bytes(text.as_bytes().to_vec()));
    }
    snapshot
}

fn snapshot(files: &[(&str, &str)]) -> Snapshot {
    snapshot_at(files, Instant::now())
}

/// A compact, comparable form of events: `+Service default/web 10.0.0.1`, `-Service default/web`.
fn summary(events: &[Event]) -> Vec<String> {
    events.iter().map(describe).collect()
}

fn describe(event: &Event) -> String {
    match event {
        Event::Service { id, object: Some(s) } => {
            let ip = s
                .spec
                .as_ref()
                .and_then(|s| s.cluster_ip.clone())
                .unwrap_or_default();
            format!("+Service {id} {ip}")
        }
        Event::Service { id, object: None } => format!("-Service {id}"),
        Event::EndpointSlice { id, object: Some(s) } => {
            let addresses: Vec<_> = s
                .endpoints
                .iter()
                .flatten()
                .flat_map(|e| e.addresses.clone())
                .collect();
            format!("+EndpointSlice {id} {}", addresses.join(","))
        }
        Event::EndpointSlice { id, object: None } => format!("-EndpointSlice {id}"),
        Event::Node { object: Some(n) } => format!("+Node {}", n.metadata.name.as_deref().unwrap_or("")),
        Event::Node { object: None } => "-Node".to_owned(),
        Event::ServiceCidr {
            name,
            object: Some(c),
        } => {
            let cidrs = c.spec.as_ref().and_then(|s| s.cidrs.clone()).unwrap_or_default();
            format!("+ServiceCIDR {name} {}", cidrs.join(","))
        }
        Event::ServiceCidr { name, object: None } => format!("-ServiceCIDR {name}"),
        Event::Synced { source } => format!("Synced {source}"),
        Event::Rejected(r) => format!("!{} {} {} {}", r.kind, r.object, r.field, r.reason.as_str()),
        Event::SourceTrouble { source, problem } => format!("?{source} {problem:?}"),
    }
}

#[test]
fn initial_load_reports_every_object_then_nothing_for_the_same_files() {
    let mut catalog = ManifestCatalog::new(None);
    let files = [
        (
            "/m/a.yaml",
            format!("{}{}", service("web", "10.0.0.1"), slice("web-1", &["10.1.0.1"])),
        ),
        ("/m/b.yaml", service("db", "10.0.0.2")),
    ];
    let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
    assert_eq!(
        summary(&catalog.apply(snapshot(&files))),
        [
            "+Service default/db 10.0.0.2",
            "+Service default/web 10.0.0.1",
            "+EndpointSlice default/web-1 10.1.0.1"
        ]
    );
    assert!(catalog.apply(snapshot(&files)).is_empty());
}

#[test]
fn edits_report_only_what_changed() {
    let mut catalog = ManifestCatalog::new(None);
    let before = format!(
        "{}{}{}",
        service("web", "10.0.0.1"),
        service("db", "10.0.0.2"),
        slice("web-1", &["10.1.0.1"])
    );
    catalog.apply(snapshot(&[("/m/a.yaml", &before)]));

    let three = format!(
        "{}{}{}",
        service("web", "10.0.0.1"),
        service("db", "10.0.0.2"),
        slice("web-1", &["10.1.0.1", "10.1.0.2", "10.1.0.3"])
    );
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/a.yaml", &three)]))),
        ["+EndpointSlice default/web-1 10.1.0.1,10.1.0.2,10.1.0.3"]
    );
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/a.yaml", &before)]))),
        ["+EndpointSlice default/web-1 10.1.0.1"]
    );
    let without_db = format!("{}{}", service("web", "10.0.0.1"), slice("web-1", &["10.1.0.1"]));
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/a.yaml", &without_db)]))),
        ["-Service default/db"]
    );
}

#[test]
fn reformatting_a_file_without_changing_objects_reports_nothing() {
    let mut catalog = ManifestCatalog::new(None);
    catalog.apply(snapshot(&[("/m/a.yaml", &service("web", "10.0.0.1"))]));
    let reformatted = format!("# edited by hand\n{}", service("web", "10.0.0.1"));
    assert!(catalog.apply(snapshot(&[("/m/a.yaml", &reformatted)])).is_empty());
}

#[test]
fn removing_a_file_deletes_its_objects() {
    let mut catalog = ManifestCatalog::new(None);
    let a = format!("{}{}", service("web", "10.0.0.1"), slice("web-1", &["10.1.0.1"]));
    let b = service("db", "10.0.0.2");
    catalog.apply(snapshot(&[("/m/a.yaml", &a), ("/m/b.yaml", &b)]));
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/b.yaml", &b)]))),
        ["-Service default/web", "-EndpointSlice default/web-1"]
    );
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/a.yaml", &a), ("/m/b.yaml", &b)]))),
        [
            "+Service default/web 10.0.0.1",
            "+EndpointSlice default/web-1 10.1.0.1"
        ]
    );
}

#[test]
fn a_malformed_file_keeps_what_it_defined_until_fixed_or_removed() {
    let mut catalog = ManifestCatalog::new(None);
    let good = service("web", "10.0.0.1");
    catalog.apply(snapshot(&[("/m/a.yaml", &good)]));

    let broken = "apiVersion: v1\nkind: Service\nmetadata: {name: web\n";
    let events = catalog.apply(snapshot(&[("/m/a.yaml", broken)]));
    assert_eq!(summary(&events).len(), 1);
    match &events[0] {
        Event::Rejected(r) => {
            assert_eq!(r.kind, ObjectKind::Manifest);
            assert_eq!(r.object, "/m/a.yaml");
            assert_eq!(r.reason, RejectReason::Malformed);
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    // Rescanning the same broken bytes neither repeats the rejection nor deletes anything.
    assert!(catalog.apply(snapshot(&[("/m/a.yaml", broken)])).is_empty());

    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/a.yaml", &service("web", "10.0.0.9"))]))),
        ["+Service default/web 10.0.0.9"]
    );
    catalog.apply(snapshot(&[("/m/a.yaml", broken)]));
    assert_eq!(summary(&catalog.apply(snapshot(&[]))), ["-Service default/web"]);
}

#[test]
fn a_garbage_file_next_to_good_ones_rejects_only_itself() {
    let mut catalog = ManifestCatalog::new(None);
    let events = catalog.apply(snapshot(&[
        ("/m/a.yaml", &service("a", "10.0.0.1")),
        ("/m/b.yaml", "\u{1}\u{2} not: [yaml"),
        ("/m/c.yaml", &service("c", "10.0.0.3")),
    ]));
    assert_eq!(
        summary(&events),
        [
            "!Manifest /m/b.yaml document 1 (line 1, column 1) malformed",
            "+Service default/a 10.0.0.1",
            "+Service default/c 10.0.0.3"
        ]
    );
}

#[test]
fn a_rejected_document_keeps_the_last_good_version_of_its_object() {
    let mut catalog = ManifestCatalog::new(None);
    let good = format!("{}{}", service("web", "10.0.0.1"), service("db", "10.0.0.2"));
    catalog.apply(snapshot(&[("/m/a.yaml", &good)]));

    let web_broken = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web}}\nspec: {{ports: [{{port: abc}}]}}\n---\n{}",
        service("db", "10.0.0.22")
    );
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/a.yaml", &web_broken)]))),
        [
            "!Service default/web spec.ports[0].port malformed",
            "+Service default/db 10.0.0.22"
        ]
    );
    // Removing the broken document altogether deletes the object.
    let db_only = service("db", "10.0.0.22");
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/a.yaml", &db_only)]))),
        ["-Service default/web"]
    );
}

#[test]
fn a_rejected_new_object_is_simply_absent() {
    let mut catalog = ManifestCatalog::new(None);
    let text = "apiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata: {name: s}\naddressType: IPv4\nendpoints: []\n";
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/a.yaml", text)]))),
        ["!EndpointSlice default/s apiVersion invalid_value"]
    );
}

#[test]
fn the_same_object_in_two_files_comes_from_the_path_that_sorts_last() {
    let mut catalog = ManifestCatalog::new(None);
    let first = service("web", "10.0.0.1");
    let last = service("web", "10.0.0.2");
    let events = catalog.apply(snapshot(&[("/m/b.yaml", &last), ("/m/a.yaml", &first)]));
    assert_eq!(summary(&events), ["+Service default/web 10.0.0.2"]);
    // The winner's file goes away: the other definition takes over, nothing is deleted.
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/a.yaml", &first)]))),
        ["+Service default/web 10.0.0.1"]
    );
}

#[test]
fn unreadable_files_and_directories_keep_what_they_defined() {
    let mut catalog = ManifestCatalog::new(None);
    catalog.apply(snapshot(&[
        ("/m/a.yaml", &service("a", "10.0.0.1")),
        ("/d/b.yaml", &service("b", "10.0.0.2")),
    ]));
    let mut next = Snapshot::new(Instant::now());
    next.files.insert(
        "/m/a.yaml".into(),
        FileRead::Unreadable("permission denied".into()),
    );
    next.unreadable_dirs.push("/d".into());
    assert!(catalog.apply(next).is_empty());
    assert_eq!(
        summary(&catalog.apply(snapshot(&[]))),
        ["-Service default/a", "-Service default/b"]
    );
}

#[test]
fn this_nodes_node_is_reported_changed_and_deleted() {
    let mut catalog = ManifestCatalog::new(Some("worker-1".into()));
    let node = |zone: &str| {
        format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: worker-1, labels: {{topology.kubernetes.io/zone: {zone}}}}}\n---\napiVersion: v1\nkind: Node\nmetadata: {{name: worker-2}}\n"
        )
    };
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/n.yaml", &node("a"))]))),
        ["+Node worker-1"]
    );
    assert!(catalog.apply(snapshot(&[("/m/n.yaml", &node("a"))])).is_empty());
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/n.yaml", &node("b"))]))),
        ["+Node worker-1"]
    );
    assert_eq!(summary(&catalog.apply(snapshot(&[]))), ["-Node"]);
}

/// Start-up reads events until it has the Node and keeps all it read meanwhile: the Node
/// must come before the Services and EndpointSlices (however the files order them), or
/// every one of them is decoded and held at once.
#[test]
fn the_node_comes_before_the_services_and_slices() {
    let mut catalog = ManifestCatalog::new(Some("worker-1".into()));
    let text = format!(
        "{}{}apiVersion: v1\nkind: Node\nmetadata: {{name: worker-1}}\n",
        service("web", "10.0.0.1"),
        slice("web-1", &["10.1.0.1"])
    );
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/a.yaml", &text)]))),
        [
            "+Node worker-1",
            "+Service default/web 10.0.0.1",
            "+EndpointSlice default/web-1 10.1.0.1"
        ]
    );
}

#[test]
fn an_emptied_file_is_believed_only_after_the_grace() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut catalog = ManifestCatalog::new(None);
    let web = service("web", "10.0.0.1");
    catalog.apply(snapshot_at(&[("/m/a.yaml", &web)], t0));

    // `kubectl get -o yaml > a.yaml`: truncated first, written a moment later.
    assert!(
        catalog
            .apply(snapshot_at(&[("/m/a.yaml", "")], t0 + ms(1)))
            .is_empty()
    );
    assert_eq!(catalog.next_recheck(), Some(t0 + ms(1) + EMPTY_FILE_GRACE));
    assert!(
        catalog
            .apply(snapshot_at(&[("/m/a.yaml", &web)], t0 + ms(500)))
            .is_empty()
    );
    assert_eq!(catalog.next_recheck(), None);

    // Emptied for good: believed once the grace has passed, not before.
    let emptied = t0 + ms(1000);
    assert!(
        catalog
            .apply(snapshot_at(&[("/m/a.yaml", "")], emptied))
            .is_empty()
    );
    let almost = emptied + EMPTY_FILE_GRACE - ms(1);
    assert!(
        catalog
            .apply(snapshot_at(&[("/m/a.yaml", "")], almost))
            .is_empty()
    );
    assert_eq!(
        summary(&catalog.apply(snapshot_at(&[("/m/a.yaml", "")], emptied + EMPTY_FILE_GRACE))),
        ["-Service default/web"]
    );
    assert_eq!(catalog.next_recheck(), None);
}

#[test]
fn a_file_that_is_empty_from_the_start_or_removed_needs_no_grace() {
    let mut catalog = ManifestCatalog::new(None);
    assert!(catalog.apply(snapshot(&[("/m/a.yaml", "")])).is_empty());
    assert_eq!(catalog.next_recheck(), None);
    catalog.apply(snapshot(&[("/m/b.yaml", &service("b", "10.0.0.2"))]));
    catalog.apply(snapshot(&[("/m/b.yaml", "")]));
    assert!(catalog.next_recheck().is_some());
    assert_eq!(summary(&catalog.apply(snapshot(&[]))), ["-Service default/b"]);
    assert_eq!(catalog.next_recheck(), None);
}

// === Validation, conflicts and size caps ===

fn node_port_service(name: &str, cluster_ip: &str, node_port: u16, created: Option<&str>) -> String {
    let created = created.map_or(String::new(), |t| format!(", creationTimestamp: \"{t}\""));
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}{created}}}\nspec: {{type: NodePort, clusterIP: {cluster_ip}, ports: [{{port: 80, nodePort: {node_port}}}]}}\n---\n"
    )
}

fn rejections(events: &[Event]) -> Vec<&kpr_model::Rejection> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Rejected(r) => Some(r),
            _ => None,
        })
        .collect()
}

#[test]
fn the_motivating_repro_is_refused_and_its_neighbours_keep_working() {
    let mut catalog = ManifestCatalog::new(None);
    let text = format!(
        "{}{}{}{}{}",
        "apiVersion: v1\nkind: Service\nmetadata: {name: \"evil\\n-A KUBE-SERVICES -j ACCEPT\\n#\"}\nspec: {clusterIP: 10.0.0.66, ports: [{port: 80}]}\n---\n",
        node_port_service("ssh", "10.0.0.22", 22, None),
        "apiVersion: v1\nkind: Service\nmetadata: {name: a/b, namespace: x}\nspec: {clusterIP: 10.0.0.71, ports: [{port: 80}]}\n---\n",
        "apiVersion: v1\nkind: Service\nmetadata: {name: b/c, namespace: a}\nspec: {clusterIP: 10.0.0.72, ports: [{port: 80}]}\n---\n",
        service("web", "10.0.0.1"),
    );
    let events = catalog.apply(snapshot(&[("/m/a.yaml", &text)]));
    assert_eq!(
        summary(&events),
        [
            "!Service a/b/c metadata.name invalid_value",
            "!Service default/evil\\n-A KUBE-SERVICES -j ACCEPT\\n# metadata.name invalid_value",
            "!Service default/ssh spec.ports[0].nodePort invalid_port",
            "!Service x/a/b metadata.name invalid_value",
            "+Service default/web 10.0.0.1",
        ]
    );
    let detail = &rejections(&events)[2].detail;
    assert!(
        detail.contains("22 is outside the node port range 30000-32767"),
        "{detail}"
    );
    assert!(detail.ends_with("(in /m/a.yaml, document 2)"), "{detail}");
}

#[test]
fn an_edit_that_breaks_a_valid_object_keeps_its_last_good_version() {
    let mut catalog = ManifestCatalog::new(None);
    let good = format!("{}{}", service("web", "10.0.0.1"), service("db", "10.0.0.2"));
    catalog.apply(snapshot(&[("/m/a.yaml", &good)]));

    // A typo in the IP, and a port out of range: both Services stay as they were.
    let typo = format!(
        "{}{}",
        service("web", "10.0.0.1O"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: db}\nspec: {clusterIP: 10.0.0.2, ports: [{port: 80000}]}\n"
    );
    let events = catalog.apply(snapshot(&[("/m/a.yaml", &typo)]));
    assert_eq!(
        summary(&events),
        [
            "!Service default/db spec.ports[0].port invalid_port",
            "!Service default/web spec.clusterIP invalid_ip",
        ]
    );
    // Reported once: the same bytes again say nothing.
    assert!(catalog.apply(snapshot(&[("/m/a.yaml", &typo)])).is_empty());

    // Another edit that still carries the typo keeps the last good version too, and the
    // fix is published.
    let half_fixed = format!("{}{}", service("web", "10.0.0.1O"), service("db", "10.0.0.3"));
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/a.yaml", &half_fixed)]))),
        [
            "!Service default/web spec.clusterIP invalid_ip",
            "+Service default/db 10.0.0.3"
        ]
    );
    let fixed = format!("{}{}", service("web", "10.0.0.9"), service("db", "10.0.0.3"));
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/a.yaml", &fixed)]))),
        ["+Service default/web 10.0.0.9"]
    );
}

#[test]
fn the_node_port_range_follows_the_rules() {
    let rules = ValidationRules {
        node_port_range: 20000..=20999,
    };
    let mut catalog = ManifestCatalog::new(None).with_rules(rules);
    let text = format!(
        "{}{}",
        node_port_service("low", "10.0.0.1", 20080, None),
        node_port_service("default-range", "10.0.0.2", 30080, None)
    );
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/a.yaml", &text)]))),
        [
            "!Service default/default-range spec.ports[0].nodePort invalid_port",
            "+Service default/low 10.0.0.1"
        ]
    );
}

#[test]
fn a_node_port_taken_later_is_refused_and_the_holder_keeps_it() {
    let mut catalog = ManifestCatalog::new(None);
    let web = node_port_service("web", "10.0.0.1", 30080, None);
    catalog.apply(snapshot(&[("/m/a.yaml", &web)]));

    // A newer Service in another file asks for the same port: refused, the holder unmoved,
    // even though its path sorts first and it claims to be older.
    let older = node_port_service("api", "10.0.0.2", 30080, Some("2015-01-01T00:00:00Z"));
    let events = catalog.apply(snapshot(&[("/m/a.yaml", &web), ("/m/0.yaml", &older)]));
    assert_eq!(
        summary(&events),
        ["!Service default/api spec.ports[0].nodePort conflict"]
    );
    assert_eq!(
        rejections(&events)[0].detail,
        "node port 30080 is already used by Service default/web; this Service is not programmed"
    );
    // A standing conflict is not reported again when something else changes.
    let db = service("db", "10.0.0.3");
    assert_eq!(
        summary(&catalog.apply(snapshot(&[
            ("/m/a.yaml", &web),
            ("/m/0.yaml", &older),
            ("/m/db.yaml", &db)
        ]))),
        ["+Service default/db 10.0.0.3"]
    );
    // The winner goes away: the loser is programmed on the same scan.
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/0.yaml", &older), ("/m/db.yaml", &db)]))),
        ["+Service default/api 10.0.0.2", "-Service default/web"]
    );
}

#[test]
fn a_conflicting_edit_keeps_the_last_good_version() {
    let mut catalog = ManifestCatalog::new(None);
    let web = node_port_service("web", "10.0.0.1", 30080, None);
    let api = node_port_service("api", "10.0.0.2", 30081, None);
    catalog.apply(snapshot(&[("/m/a.yaml", &format!("{web}{api}"))]));

    // api edited onto web's port and web's cluster IP: refused, api stays on 30081.
    let api_clash = node_port_service("api", "10.0.0.1", 30080, None);
    let events = catalog.apply(snapshot(&[("/m/a.yaml", &format!("{web}{api_clash}"))]));
    assert_eq!(
        summary(&events),
        ["!Service default/api spec.ports[0].nodePort conflict"]
    );
    assert!(
        rejections(&events)[0]
            .detail
            .ends_with("keeping this Service's last good version"),
        "{:?}",
        rejections(&events)
    );
    // web moves away from 30080 in the next edit: api's pending edit now goes through.
    let web_moved = node_port_service("web", "10.0.0.5", 30090, None);
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/a.yaml", &format!("{web_moved}{api_clash}"))]))),
        ["+Service default/api 10.0.0.1", "+Service default/web 10.0.0.5"]
    );
}

#[test]
fn among_new_services_the_older_creation_timestamp_wins() {
    let mut catalog = ManifestCatalog::new(None);
    let newer = node_port_service("newer", "10.0.0.1", 30080, Some("2025-06-01T00:00:00Z"));
    let older = node_port_service("older", "10.0.0.2", 30080, Some("2024-06-01T00:00:00Z"));
    let events = catalog.apply(snapshot(&[("/m/a.yaml", &newer), ("/m/b.yaml", &older)]));
    assert_eq!(
        summary(&events),
        [
            "!Service default/newer spec.ports[0].nodePort conflict",
            "+Service default/older 10.0.0.2"
        ]
    );
    // Without timestamps, the path that sorts first, then the earlier document.
    let mut catalog = ManifestCatalog::new(None);
    let first = node_port_service("first", "10.0.0.1", 30080, None);
    let second = node_port_service("second", "10.0.0.1", 30081, None);
    let events = catalog.apply(snapshot(&[("/m/b.yaml", &format!("{first}{second}"))]));
    assert_eq!(
        summary(&events),
        [
            "!Service default/second spec.clusterIP conflict",
            "+Service default/first 10.0.0.1"
        ]
    );
}

#[test]
fn a_file_over_the_cap_keeps_its_last_good_contents() {
    let mut catalog = ManifestCatalog::new(None);
    let web = service("web", "10.0.0.1");
    catalog.apply(snapshot(&[("/m/a.yaml", &web)]));
    let too_large = |size| {
        let mut snapshot = Snapshot::new(Instant::now());
        snapshot
            .files
            .insert("/m/a.yaml".into(), FileRead::TooLarge { size, limit: 1024 });
        snapshot
    };
    let events = catalog.apply(too_large(5000));
    assert_eq!(summary(&events), ["!Manifest /m/a.yaml file too_large"]);
    assert_eq!(
        rejections(&events)[0].detail,
        "5000 bytes is over the limit of 1024 bytes (--manifests-max-file-bytes); keeping what this file defined before"
    );
    // Once per size; a new size is reported again.
    assert!(catalog.apply(too_large(5000)).is_empty());
    assert_eq!(summary(&catalog.apply(too_large(6000))).len(), 1);
    // Back under the cap with the same contents: nothing changed. Then a real edit.
    assert!(catalog.apply(snapshot(&[("/m/a.yaml", &web)])).is_empty());
    assert_eq!(summary(&catalog.apply(too_large(5000))).len(), 1);
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/a.yaml", &service("web", "10.0.0.2"))]))),
        ["+Service default/web 10.0.0.2"]
    );
    // A new file that is too large defines nothing, and its removal deletes nothing.
    let mut snapshot = snapshot(&[("/m/a.yaml", &service("web", "10.0.0.2"))]);
    snapshot.files.insert(
        "/m/big.yaml".into(),
        FileRead::TooLarge {
            size: 9999,
            limit: 1024,
        },
    );
    assert_eq!(
        summary(&catalog.apply(snapshot)),
        ["!Manifest /m/big.yaml file too_large"]
    );
    assert!(
        catalog
            .apply(snapshot_at(
                &[("/m/a.yaml", &service("web", "10.0.0.2"))],
                Instant::now()
            ))
            .is_empty()
    );
}

fn service_cidr(name: &str, cidrs: &str) -> String {
    format!(
        "---\napiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {{name: {name}}}\nspec: {{cidrs: [{cidrs}]}}\n"
    )
}

#[test]
fn service_cidrs_are_added_edited_kept_when_refused_and_deleted() {
    let mut catalog = ManifestCatalog::new(None);
    let first = format!(
        "{}{}",
        service("web", "10.96.0.10"),
        service_cidr("kubernetes", "10.96.0.0/16")
    );
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/a.yaml", &first)]))),
        [
            "+Service default/web 10.96.0.10",
            "+ServiceCIDR kubernetes 10.96.0.0/16"
        ]
    );
    let dual = format!(
        "{}{}",
        service("web", "10.96.0.10"),
        service_cidr("kubernetes", "10.96.0.0/16, fd00:96::/112")
    );
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/a.yaml", &dual)]))),
        ["+ServiceCIDR kubernetes 10.96.0.0/16,fd00:96::/112"]
    );
    // Two IPv4 CIDRs: refused as the API server would, the last good version stays.
    let bad = format!(
        "{}{}",
        service("web", "10.96.0.10"),
        service_cidr("kubernetes", "10.96.0.0/16, 10.97.0.0/16")
    );
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/a.yaml", &bad)]))),
        ["!ServiceCIDR kubernetes spec.cidrs invalid_cidr"]
    );
    let gone = service("web", "10.96.0.10");
    assert_eq!(
        summary(&catalog.apply(snapshot(&[("/m/a.yaml", &gone)]))),
        ["-ServiceCIDR kubernetes"]
    );
}
