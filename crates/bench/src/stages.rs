//! Where the memory goes: the product's own pipeline run in-process, stage by stage, with
//! the heap bytes live after each stage and the peak within it (the counting allocator of
//! `counting`, kpr-bench's binary only).
//!
//! The real binary's RSS (the `e2e` part) says how much; this says who holds it. The
//! stages are the ones ARCHITECTURE.md draws: the source's objects (as the API source hands
//! them, k8s-openapi objects behind `Arc` in `Event`s; or the manifest file's bytes, parsed
//! into the `ManifestCatalog`), intake into the trackers of both families (as a dual-stack
//! proxy runs, the default wherever the host has both), the `DesiredState` each family's
//! `take()` hands a sync, and the nftables backend of each family after its cold sync into a
//! throw-away namespace (its ledger and bundles), then with the sync request dropped, as
//! the sync loop drops it. Live bytes are cumulative: each stage holds what the ones before
//! it still hold, as the process would. Intake consumes the events one by one, so the
//! source's objects are gone after it unless the source keeps them (the catalog does).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use kpr_model::{IpFamily, NodeView, node_view};
use kpr_netns::Netns;
use kpr_nftables::{NetlinkTransport, NftablesBackend, NftablesOptions};
use kpr_sources::Event;
use kpr_sources::manifests::{FileRead, ManifestCatalog, Snapshot as Scan};
use kpr_state::{Backend, PendingSync};
use kpr_tracking::{EndpointsTracker, ServiceTracker};

use crate::cluster::{CLUSTER_CIDR, ClusterObject, NODE_IP, NODE_NAME, Shape, manifest_json, objects};
use crate::counting;

/// Where the pipeline's objects come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StageSource {
    /// k8s-openapi objects in `Event`s, as the API source hands them to intake.
    Api,
    /// One manifest file's bytes, parsed and validated into the `ManifestCatalog`.
    Manifest,
}

impl StageSource {
    pub fn label(self) -> &'static str {
        match self {
            Self::Api => "API",
            Self::Manifest => "manifest",
        }
    }
}

/// Heap bytes after one stage, counted from the start of the run.
#[derive(Clone, Debug)]
pub struct StageMemory {
    pub stage: &'static str,
    /// Live after the stage (everything still held, earlier stages' included).
    pub live: usize,
    /// The most live at any moment within the stage.
    pub peak: usize,
}

/// One pipeline run.
#[derive(Clone, Debug)]
pub struct StageRow {
    pub shape: Shape,
    pub source: StageSource,
    pub stages: Vec<StageMemory>,
}

/// Stage names, in pipeline order (the report's table uses them as they are).
pub const SOURCE_OBJECTS: &str = "source: API objects in events";
pub const MANIFEST_BYTES: &str = "source: manifest file bytes";
pub const MANIFEST_CATALOG: &str = "source: parse + catalog (and its events)";
pub const TRACKERS: &str = "intake: trackers of both families";
pub const DESIRED: &str = "desired state: take() of both families";
pub const BACKEND: &str = "nftables backends: cold sync";
pub const AFTER_SYNC: &str = "after the sync (requests dropped)";

/// Counts live heap bytes relative to where it started.
struct Meter {
    baseline: usize,
    stages: Vec<StageMemory>,
}

impl Meter {
    fn start() -> Self {
        Self {
            baseline: counting::live(),
            stages: Vec::new(),
        }
    }

    /// Runs `f` as stage `stage`, recording the peak within it and what is live after it.
    fn stage<T>(&mut self, stage: &'static str, f: impl FnOnce() -> T) -> T {
        counting::reset_peak();
        let out = f();
        self.stages.push(StageMemory {
            stage,
            live: counting::live().saturating_sub(self.baseline),
            peak: counting::peak().saturating_sub(self.baseline),
        });
        out
    }
}

/// Runs the pipeline of `shape` from `source` in a namespace of its own (the backends'
/// cold sync is a real kernel load).
pub fn measure(shape: Shape, source: StageSource) -> Result<StageRow, String> {
    let netns = Netns::new("benchstage").map_err(|e| format!("namespace: {e}"))?;
    netns.run(|| measure_inside(shape, source))
}

fn measure_inside(shape: Shape, source: StageSource) -> Result<StageRow, String> {
    let started = Instant::now();
    let mut meter = Meter::start();
    // The catalog is long-lived in the product: it stays until the end of the run.
    let (events, _catalog) = match source {
        StageSource::Api => (meter.stage(SOURCE_OBJECTS, || api_events(shape)), None),
        StageSource::Manifest => {
            let bytes = meter
                .stage(MANIFEST_BYTES, || manifest_json(shape))
                .map_err(|e| format!("manifest: {e}"))?;
            let (catalog, events) = meter.stage(MANIFEST_CATALOG, || catalog_events(bytes.into_bytes()));
            (events, Some(catalog))
        }
    };
    let mut families = meter.stage(TRACKERS, || intake(events))?;
    let pending = meter.stage(DESIRED, || {
        families.iter_mut().map(Family::take).collect::<Vec<_>>()
    });
    let backends = meter.stage(BACKEND, || cold_sync(&pending))?;
    meter.stage(AFTER_SYNC, || drop(pending));
    eprintln!(
        "[{} services, stages from {}] {:.1} s",
        shape.services,
        source.label(),
        started.elapsed().as_secs_f64()
    );
    drop((backends, families));
    Ok(StageRow {
        shape,
        source,
        stages: meter.stages,
    })
}

/// The cluster as the API source's watchers hand it to intake: each object behind an `Arc`.
fn api_events(shape: Shape) -> Vec<Event> {
    objects(shape)
        .map(|object| match object {
            ClusterObject::Node(node) => Event::Node {
                object: Some(Arc::from(node)),
            },
            ClusterObject::Service(service) => Event::Service {
                id: kpr_model::NamespacedName::new(
                    service.metadata.namespace.as_deref().unwrap_or_default(),
                    service.metadata.name.as_deref().unwrap_or_default(),
                ),
                object: Some(Arc::from(service)),
            },
            ClusterObject::Slice(slice) => Event::EndpointSlice {
                id: kpr_model::NamespacedName::new(
                    slice.metadata.namespace.as_deref().unwrap_or_default(),
                    slice.metadata.name.as_deref().unwrap_or_default(),
                ),
                object: Some(Arc::from(slice)),
            },
        })
        .collect()
}

/// The manifest source's first scan: one file, parsed, validated and kept by the catalog,
/// which answers with the events for intake. The file's bytes are dropped here, as the
/// source drops them after the scan.
fn catalog_events(bytes: Vec<u8>) -> (ManifestCatalog, Vec<Event>) {
    let mut scan = Scan::new(Instant::now());
    scan.files
        .insert(PathBuf::from("/bench/cluster.json"), FileRead::Bytes(bytes));
    let mut catalog = ManifestCatalog::new(Some(NODE_NAME.to_string()));
    let events = catalog.apply(scan);
    (catalog, events)
}

/// One family's trackers and the Node, as a proxier of kpr-sync holds them.
struct Family {
    services: ServiceTracker,
    endpoints: EndpointsTracker,
    node: Arc<NodeView>,
}

impl Family {
    fn new(family: IpFamily) -> Self {
        Self {
            services: ServiceTracker::new(family),
            endpoints: EndpointsTracker::new(family, NODE_NAME),
            node: Arc::default(),
        }
    }

    fn take(&mut self) -> PendingSync {
        PendingSync::new(self.services.take(), self.endpoints.take(), self.node.clone())
    }
}

/// What kpr-sync's intake does with each event, for both families: each event is consumed
/// (and its object dropped) once every family has recorded it.
fn intake(events: Vec<Event>) -> Result<Vec<Family>, String> {
    let mut families = vec![Family::new(IpFamily::V4), Family::new(IpFamily::V6)];
    for event in events {
        match event {
            Event::Service { id, object } => {
                for family in &mut families {
                    family
                        .services
                        .update(id.clone(), object.as_deref())
                        .map_err(|e| e.to_string())?;
                }
            }
            Event::EndpointSlice { id, object } => {
                for family in &mut families {
                    family
                        .endpoints
                        .update(id.clone(), object.as_deref())
                        .map_err(|e| e.to_string())?;
                }
            }
            Event::Node { object: Some(node) } => {
                let view = Arc::new(node_view(&node).map_err(|e| e.to_string())?);
                for family in &mut families {
                    family.node = view.clone();
                }
            }
            Event::Rejected(rejection) => return Err(format!("the source rejected {rejection}")),
            _ => {}
        }
    }
    Ok(families)
}

/// Each family's nftables backend after its cold sync, as the proxy runs it (netlink).
fn cold_sync(pending: &[PendingSync]) -> Result<Vec<NftablesBackend>, String> {
    let families = [IpFamily::V4, IpFamily::V6];
    pending
        .iter()
        .zip(families)
        .map(|(pending, family)| {
            let options = options(family);
            let transport = NetlinkTransport::open(options.affinity_capacity).map_err(|e| e.to_string())?;
            let addresses = match family {
                IpFamily::V4 => vec![NODE_IP.into()],
                IpFamily::V6 => Vec::new(),
            };
            let mut backend = NftablesBackend::new(options, Box::new(transport))
                .map_err(|e| e.to_string())?
                .with_local_addresses(Box::new(kpr_host::FixedAddresses(addresses)));
            backend.sync(&pending.request(false)).map_err(|e| e.to_string())?;
            Ok(backend)
        })
        .collect()
}

/// Upstream's defaults for `family`, with the bench cluster's CIDR for local detection (the
/// detector uses the CIDRs of its own family; the synthetic cluster has no IPv6 pods).
fn options(family: IpFamily) -> NftablesOptions {
    let cidrs = CLUSTER_CIDR.parse().map(|c| vec![c]).unwrap_or_default();
    NftablesOptions {
        family,
        local_detector: kpr_host::LocalDetector::ClusterCidr(cidrs),
        ..NftablesOptions::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both sources at a small size, in a namespace (needs root, as every kernel part).
    #[test]
    fn every_stage_is_measured_and_what_stays_is_held_by_someone() {
        let shape = Shape {
            services: 200,
            endpoints: 10,
        };
        for source in [StageSource::Api, StageSource::Manifest] {
            let row = measure(shape, source).expect("the pipeline runs");
            let names: Vec<_> = row.stages.iter().map(|s| s.stage).collect();
            let mut expected = match source {
                StageSource::Api => vec![SOURCE_OBJECTS],
                StageSource::Manifest => vec![MANIFEST_BYTES, MANIFEST_CATALOG],
            };
            expected.extend([TRACKERS, DESIRED, BACKEND, AFTER_SYNC]);
            assert_eq!(names, expected);
            let live = |name| row.stages.iter().find(|s| s.stage == name).map(|s| s.live);
            for stage in &row.stages {
                assert!(stage.peak >= stage.live, "{stage:?}");
            }
            // 2,000 endpoints: the trackers and the backend hold something for each.
            let trackers = live(TRACKERS).expect("measured");
            let backend = live(BACKEND).expect("measured");
            assert!(trackers > 2_000 * 50, "{:?}", row.stages);
            assert!(backend > trackers, "{:?}", row.stages);
            if source == StageSource::Api {
                // Intake consumed the events: their objects are gone after it.
                let objects = live(SOURCE_OBJECTS).expect("measured");
                assert!(trackers < objects, "{:?}", row.stages);
            }
        }
    }
}
