//! Nothing the catalog keeps grows with the number of changes: kpr_world's churn written
//! as manifest files (one JSON file per object, deleted with it), plus per round what only
//! files can do (two Services claiming one nodePort, a file that is not YAML, one over the
//! size cap, one emptied and removed within the grace), ending where it started; every
//! size is then what it was after a warm-up round.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kpr_world::churn::{Change, churn};
use serde_json::json;

use super::{FileRead, ManifestCatalog, Snapshot};
use crate::Event;

/// The manifest directory: file name -> bytes.
#[derive(Default)]
struct Directory {
    files: BTreeMap<String, FileRead>,
    now: Option<Instant>,
}

impl Directory {
    fn write(&mut self, name: String, bytes: Vec<u8>) {
        self.files.insert(name, FileRead::Bytes(bytes));
    }

    fn set(&mut self, name: String, object: Option<Vec<u8>>) {
        match object {
            Some(bytes) => self.write(name, bytes),
            None => {
                self.files.remove(&name);
            }
        }
    }

    /// A scan, each one a second after the previous.
    fn scan(&mut self) -> Snapshot {
        let now = self.now.map_or_else(Instant::now, |t| t + Duration::from_secs(1));
        self.now = Some(now);
        let mut snapshot = Snapshot::new(now);
        for (name, read) in &self.files {
            snapshot
                .files
                .insert(PathBuf::from("/m").join(name), read.clone());
        }
        snapshot
    }

    fn apply(&mut self, change: &Change) {
        match change {
            Change::Service(name, object) => {
                self.set(format!("svc-{name}.json"), object.as_deref().map(bytes))
            }
            Change::Slice(name, object) => {
                self.set(format!("slice-{name}.json"), object.as_deref().map(bytes))
            }
            Change::Node(node) => self.write("node.json".into(), bytes(&**node)),
            Change::ServiceCidr(name, object) => {
                self.set(format!("cidr-{name}.json"), object.as_deref().map(bytes))
            }
            Change::Sync => {}
        }
    }
}

/// An API object as the JSON a manifest holds (k8s-openapi writes apiVersion and kind).
fn bytes<T: serde::Serialize>(object: &T) -> Vec<u8> {
    serde_json::to_vec(object).expect("API objects serialize")
}

/// What only files can do, in round `r`, undone by the end of the round.
fn file_only_changes(dir: &mut Directory, catalog: &mut ManifestCatalog, r: u16) -> Vec<Event> {
    let mut events = Vec::new();
    let node_port = 30000 + r % 2000;
    let claimant = |name: &str, ip: &str| {
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"type": "NodePort", "clusterIP": ip,
                     "ports": [{"port": 80, "nodePort": node_port}]}}))
        .unwrap()
    };
    dir.write(
        format!("a-{r}.json"),
        claimant(&format!("first-{r}"), "10.97.0.1"),
    );
    dir.write(
        format!("b-{r}.json"),
        claimant(&format!("second-{r}"), "10.97.0.2"),
    );
    dir.write(format!("broken-{r}.yaml"), b"kind: [unclosed".to_vec());
    dir.files.insert(
        format!("huge-{r}.yaml"),
        FileRead::TooLarge {
            size: 1 << 30,
            limit: 1 << 20,
        },
    );
    events.extend(catalog.apply(dir.scan()));
    // Emptied: the catalog waits out the grace before believing it.
    dir.write(format!("a-{r}.json"), Vec::new());
    events.extend(catalog.apply(dir.scan()));
    for name in [
        format!("a-{r}.json"),
        format!("b-{r}.json"),
        format!("broken-{r}.yaml"),
        format!("huge-{r}.yaml"),
    ] {
        dir.files.remove(&name);
    }
    events.extend(catalog.apply(dir.scan()));
    events
}

fn run(dir: &mut Directory, catalog: &mut ManifestCatalog, first_round: u16, rounds: u16) -> Vec<Event> {
    let mut events = Vec::new();
    for r in first_round..first_round + rounds {
        for change in churn(r, 1) {
            dir.apply(&change);
            if matches!(change, Change::Sync) {
                events.extend(catalog.apply(dir.scan()));
            }
        }
        events.extend(file_only_changes(dir, catalog, r));
    }
    events
}

fn catalog_and_directory() -> (ManifestCatalog, Directory) {
    let mut dir = Directory::default();
    dir.apply(&Change::Node(std::sync::Arc::new(kpr_world::node_object(Some(
        kpr_world::ZONE,
    )))));
    let mut catalog = ManifestCatalog::new(Some(kpr_world::NODE.into()));
    catalog.apply(dir.scan());
    (catalog, dir)
}

#[test]
fn catalog_sizes_come_back_after_churn() {
    let (mut catalog, mut dir) = catalog_and_directory();
    run(&mut dir, &mut catalog, 0, 1);
    let before = catalog.footprint();
    run(&mut dir, &mut catalog, 1, 40);
    let after = catalog.footprint();
    assert_eq!(before.differences(&after), [], "sizes grew with churn:\n{after}");
}

#[test]
fn the_churn_reaches_every_kind_conflicts_and_bad_files() {
    // Without these the check above could compare two catalogs that never held anything.
    let (mut catalog, mut dir) = catalog_and_directory();
    let events = run(&mut dir, &mut catalog, 0, 1);
    let count = |what: fn(&Event) -> bool| events.iter().filter(|e| what(e)).count();
    assert!(count(|e| matches!(e, Event::Service { object: Some(_), .. })) >= 3);
    assert!(count(|e| matches!(e, Event::EndpointSlice { object: Some(_), .. })) >= 6);
    assert!(count(|e| matches!(e, Event::ServiceCidr { object: Some(_), .. })) == 1);
    assert!(count(|e| matches!(e, Event::Node { object: Some(_) })) >= 1);
    let rejected: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            Event::Rejected(r) => Some(r.reason.as_str().to_string()),
            _ => None,
        })
        .collect();
    for reason in ["conflict", "malformed", "too_large", "invalid_ip"] {
        assert!(
            rejected.iter().any(|r| r == reason),
            "no {reason} rejection in {rejected:?}"
        );
    }
    assert!(
        catalog.footprint().get("emptied_at") == Some(0),
        "the emptied file was removed, so nothing waits"
    );
}
