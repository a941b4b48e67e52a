//! The repository's own examples (what the README and the demo run) pass the manifest
//! source's validation: a rule that refused them would refuse what users copy from us.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Instant;

use kpr_sources::Event;
use kpr_sources::manifests::{FileRead, ManifestCatalog, Snapshot};

#[test]
fn every_example_and_fixture_is_accepted_whole() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut snapshot = Snapshot::new(Instant::now());
    let dirs = [root.join("examples"), root.join("crates/sources/tests/fixtures")];
    for dir in &dirs {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|ext| ext == "yaml") {
                snapshot
                    .files
                    .insert(path.clone(), FileRead::Bytes(std::fs::read(&path).unwrap()));
            }
        }
    }
    assert!(snapshot.files.len() >= 4, "{:?}", snapshot.files.keys());
    let events = ManifestCatalog::new(Some("node1".into())).apply(snapshot);
    let rejected: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Rejected(r) => Some(r.to_string()),
            _ => None,
        })
        .collect();
    assert!(rejected.is_empty(), "{rejected:#?}");
    let services = events
        .iter()
        .filter(|e| matches!(e, Event::Service { .. }))
        .count();
    let nodes = events.iter().filter(|e| matches!(e, Event::Node { .. })).count();
    assert_eq!((services, nodes), (3, 1), "{events:#?}");
}
