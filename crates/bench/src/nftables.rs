//! nftables mode at scale: the real `NftablesBackend` syncing a synthetic cluster into a
//! fresh network namespace. One cold full sync (our generation and the kernel together, as
//! a user waits for it), then single endpoint changes and single new Services, each a
//! partial sync timed on its own, so p50 and p99 describe what one change costs.
//!
//! The whole measurement runs on a thread inside the namespace, so the transport (a child
//! `nft` process, or a netlink socket) reaches that namespace's nf_tables and nothing else.

use std::time::{Duration, Instant};

use kpr_netns::Netns;
use kpr_nftables::{NetlinkTransport, NftCli, NftablesBackend, NftablesOptions, Transport};
use kpr_state::Backend;

use crate::cluster::{CLUSTER_CIDR, NODE_IP, Shape, SyntheticCluster};
use crate::load::Outcome;
use crate::memory::PeakProbe;
use crate::stats::quantile;

/// How the backend reaches the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NftTransport {
    /// `nft -f -`, one process per batch.
    Nft,
    /// nf_tables netlink from the process (what the proxy runs).
    Netlink,
}

impl NftTransport {
    pub fn label(self) -> &'static str {
        match self {
            Self::Nft => "nft -f",
            Self::Netlink => "netlink",
        }
    }

    fn open(self, options: &NftablesOptions) -> Result<Box<dyn Transport>, String> {
        Ok(match self {
            Self::Nft => Box::new(NftCli::new(options.affinity_capacity)),
            Self::Netlink => {
                Box::new(NetlinkTransport::open(options.affinity_capacity).map_err(|e| e.to_string())?)
            }
        })
    }
}

/// p50 and p99 of repeated single changes.
#[derive(Clone, Copy, Debug)]
pub struct Spread {
    pub p50: Duration,
    pub p99: Duration,
    pub samples: usize,
}

/// Everything measured for one cluster size.
#[derive(Clone, Debug)]
pub struct NftRow {
    pub shape: Shape,
    pub transport: NftTransport,
    /// The first sync: generation plus the kernel load, all batches.
    pub cold: Outcome<Duration>,
    /// Batches and element operations of the cold load.
    pub cold_batches: usize,
    pub cold_elements: usize,
    /// Element operations of one endpoint change's batch.
    pub change_elements: usize,
    pub endpoint_change: Outcome<Spread>,
    pub new_service: Outcome<Spread>,
    /// How far the process's peak RSS rose over the whole measurement (trackers, backend
    /// state and batches; the synthetic cluster's own objects included).
    pub peak_rss_added_kib: Option<u64>,
}

pub struct NftPlan {
    pub shape: Shape,
    pub transport: NftTransport,
    /// Single changes of each kind.
    pub changes: usize,
}

/// Measures `plan` in a namespace of its own.
pub fn measure(plan: &NftPlan) -> Result<NftRow, String> {
    let netns = Netns::new("benchnft").map_err(|e| format!("namespace: {e}"))?;
    netns.run(|| measure_inside(plan))
}

fn measure_inside(plan: &NftPlan) -> Result<NftRow, String> {
    let probe = PeakProbe::start();
    let mut cluster =
        SyntheticCluster::new(plan.shape).map_err(|e| format!("synthetic object rejected: {e}"))?;
    let options = bench_options();
    let mut backend = NftablesBackend::new(options.clone(), plan.transport.open(&options)?)
        .map_err(|e| e.to_string())?
        .with_local_addresses(Box::new(kpr_host::FixedAddresses(vec![NODE_IP.into()])));
    let mut row = NftRow {
        shape: plan.shape,
        transport: plan.transport,
        cold: Outcome::NotAvailable("not reached".to_string()),
        cold_batches: 0,
        cold_elements: 0,
        change_elements: 0,
        endpoint_change: Outcome::NotAvailable("the cold load failed".to_string()),
        new_service: Outcome::NotAvailable("the cold load failed".to_string()),
        peak_rss_added_kib: None,
    };
    let base = cluster.take();
    let started = Instant::now();
    match backend.sync(&base.request(false)) {
        Ok(_) => row.cold = Outcome::Done(started.elapsed()),
        Err(error) => {
            row.cold = Outcome::Failed(error.to_string());
            return Ok(row);
        }
    }
    drop(base);
    row.cold_batches = backend.last_batches().len();
    row.cold_elements = backend
        .last_batches()
        .iter()
        .map(|b| b.elements_added + b.elements_deleted)
        .sum();
    row.endpoint_change = repeat(plan.changes, |generation| {
        cluster
            .replace_endpoint(generation + 1)
            .map_err(|e| e.to_string())?;
        let pending = cluster.take();
        let started = Instant::now();
        backend.sync(&pending.request(false)).map_err(|e| e.to_string())?;
        Ok(started.elapsed())
    });
    row.change_elements = backend
        .last_batches()
        .iter()
        .map(|b| b.elements_added + b.elements_deleted)
        .sum();
    row.new_service = repeat(plan.changes, |n| {
        cluster.add_service(n).map_err(|e| e.to_string())?;
        let pending = cluster.take();
        let started = Instant::now();
        backend.sync(&pending.request(false)).map_err(|e| e.to_string())?;
        Ok(started.elapsed())
    });
    row.peak_rss_added_kib = probe.and_then(PeakProbe::extra_kib);
    Ok(row)
}

/// `n` timed runs of `step`; the first failure ends the series and is reported.
pub fn repeat(n: usize, mut step: impl FnMut(usize) -> Result<Duration, String>) -> Outcome<Spread> {
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        match step(i) {
            Ok(took) => samples.push(took),
            Err(error) => return Outcome::Failed(format!("change {}: {error}", i + 1)),
        }
    }
    match (quantile(&samples, 0.5), quantile(&samples, 0.99)) {
        (Some(p50), Some(p99)) => Outcome::Done(Spread {
            p50,
            p99,
            samples: samples.len(),
        }),
        _ => Outcome::NotAvailable("no changes asked for".to_string()),
    }
}

/// Upstream's defaults for nftables mode, with the bench cluster's CIDR for local detection.
fn bench_options() -> NftablesOptions {
    let cidr = CLUSTER_CIDR.parse().map(|c| vec![c]).unwrap_or_default();
    NftablesOptions {
        local_detector: kpr_host::LocalDetector::ClusterCidr(cidr),
        ..NftablesOptions::default()
    }
}
