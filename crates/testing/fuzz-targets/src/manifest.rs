//! Target `manifest`: arbitrary bytes as a manifest file, through everything a file goes
//! through in the proxy.
//!
//! The bytes are one file of a scan, once as `.yaml` and once as `.json` (the extension picks
//! the parser), handed to the manifest source's pure half (`ManifestCatalog::apply`: parse,
//! validation, last-good bookkeeping). Asserted: nothing panics; every rejection names an
//! object and a field; applying the same scan again reports nothing (an unchanged file must
//! never cause work or repeat a rejection); and what was accepted, fed to the trackers of
//! each family, renders to a payload with only the lines the renderer means to write.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Instant;

use kpr_host::LocalDetector;
use kpr_iptables::IptablesOptions;
use kpr_model::IpFamily;
use kpr_sources::Event;
use kpr_sources::manifests::{FileRead, ManifestCatalog, Snapshot};

use crate::pipeline::{NODE, Pipeline, render_checked};

/// The paths the bytes are offered under: one per parser.
pub const PATHS: [&str; 2] = ["/manifests/fuzz.yaml", "/manifests/fuzz.json"];

pub fn manifest(data: &[u8]) {
    manifest_payloads(data);
}

/// The checks of [`manifest`]; returns the payloads rendered, per path then family (IPv4,
/// IPv6), so tests can see that accepted objects really reach the rules.
pub fn manifest_payloads(data: &[u8]) -> Vec<String> {
    let mut payloads = Vec::new();
    for path in PATHS {
        let events = apply_twice(path, data);
        for family in [IpFamily::V4, IpFamily::V6] {
            let mut pipeline = Pipeline::new(family);
            for event in &events {
                pipeline.event(event);
            }
            let local = local_addresses(family, pipeline.node_ips());
            let state = pipeline.take();
            payloads.push(render_checked(&state, &options(family), &local));
        }
    }
    payloads
}

/// The events of a first scan that finds `data` at `path`, after checking that a second
/// scan finding the same bytes reports nothing.
fn apply_twice(path: &str, data: &[u8]) -> Vec<Event> {
    let mut catalog = ManifestCatalog::new(Some(NODE.to_owned()));
    let events = catalog.apply(scan(path, data));
    let again = catalog.apply(scan(path, data));
    assert!(
        again.is_empty(),
        "a rescan of an unchanged {path} reported {} events: {again:?}",
        again.len()
    );
    events
}

fn scan(path: &str, data: &[u8]) -> Snapshot {
    let mut snapshot = Snapshot::new(Instant::now());
    snapshot
        .files
        .insert(PathBuf::from(path), FileRead::Bytes(data.to_vec()));
    snapshot
}

/// A common cluster's options: pods detected by the cluster CIDR.
fn options(family: IpFamily) -> IptablesOptions {
    let cluster_cidr = match family {
        IpFamily::V4 => "10.244.0.0/16",
        IpFamily::V6 => "fd00:10:244::/56",
    };
    IptablesOptions {
        family,
        local_detector: LocalDetector::ClusterCidr(cluster_cidr.parse().into_iter().collect()),
        ..IptablesOptions::default()
    }
}

/// The host's addresses: the node's own (from its Node object, if the file has one).
fn local_addresses(family: IpFamily, node_ips: &[IpAddr]) -> Vec<IpAddr> {
    node_ips.iter().copied().filter(|ip| family.matches(ip)).collect()
}
