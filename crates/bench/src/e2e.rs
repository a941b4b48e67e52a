//! What a user of the real binary feels at start-up: kube-proxy-rs started in a fresh network
//! namespace on the synthetic cluster, read from a manifest file or from the test API server;
//! the time from spawning the process until its metrics report the first successful sync, and
//! the whole process's peak (`VmHWM`) and steady (`VmRSS`) resident memory once it has
//! settled after that sync.
//!
//! Everything the binary does is in: reading and validating the file (or listing and
//! watching the API), the trackers, the backend's generation and the kernel load.

use std::path::Path;
use std::time::Duration;

use crate::api_lab::ApiLab;
use crate::cluster::{Shape, manifest_json};
use crate::load::Outcome;
use crate::proxy::{Launch, Memory, RunningProxy, Source};
use crate::scratch::ScratchFile;

/// How long the proxy runs after its first sync before its memory is read: the allocations
/// of the first sync are freed (or not) by then, and an idle proxy does nothing else.
pub const SETTLE: Duration = Duration::from_secs(5);

/// Where the binary reads the cluster from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum E2eSource {
    /// One manifest file (a JSON `List`).
    Manifest,
    /// The test API server, in the proxy's namespace.
    Api,
}

impl E2eSource {
    pub fn label(self) -> &'static str {
        match self {
            Self::Manifest => "manifest file",
            Self::Api => "test API server",
        }
    }
}

#[derive(Clone, Debug)]
pub struct E2eRow {
    pub shape: Shape,
    pub mode: &'static str,
    pub source: E2eSource,
    /// The manifest file's size (`None` from the API server).
    pub manifest_bytes: Option<usize>,
    /// Spawn to the first successful sync, as the metrics report it.
    pub first_sync: Outcome<Duration>,
    /// CPU time the proxy used by then (at the timeout when there was no sync).
    pub first_sync_cpu: Option<Duration>,
    /// After [`SETTLE`] past the first sync (at the timeout when there was none).
    pub memory: Memory,
}

pub struct E2ePlan<'a> {
    pub proxy: &'a Path,
    pub shape: Shape,
    pub mode: &'static str,
    pub source: E2eSource,
    pub timeout: Duration,
}

/// Runs the binary once for `plan`.
pub fn measure(plan: &E2ePlan<'_>) -> Result<E2eRow, String> {
    let mut manifest_bytes = None;
    let (first_sync, first_sync_cpu, memory) = match plan.source {
        E2eSource::Manifest => {
            let manifest = manifest_json(plan.shape).map_err(|e| format!("manifest: {e}"))?;
            manifest_bytes = Some(manifest.len());
            let file = ScratchFile::create("cluster.json", manifest.as_bytes())?;
            drop(manifest);
            let netns = kpr_netns::Netns::new("benche2e").map_err(|e| format!("namespace: {e}"))?;
            run(&netns, plan, Source::Manifest(file.path()))?
        }
        E2eSource::Api => {
            let lab = ApiLab::start("benche2eapi", plan.shape, 0)?;
            eprintln!(
                "[{} services] loaded into the test API server in {:.1} s",
                plan.shape.services,
                lab.load_time.as_secs_f64()
            );
            run(
                &lab.netns,
                plan,
                Source::Api {
                    kubeconfig: lab.kubeconfig.path(),
                },
            )?
        }
    };
    Ok(E2eRow {
        shape: plan.shape,
        mode: plan.mode,
        source: plan.source,
        manifest_bytes,
        first_sync,
        first_sync_cpu,
        memory,
    })
}

/// First sync, the CPU time used by then, and the memory after settling.
type Measurement = (Outcome<Duration>, Option<Duration>, Memory);

fn run(netns: &kpr_netns::Netns, plan: &E2ePlan<'_>, source: Source<'_>) -> Result<Measurement, String> {
    let launch = Launch {
        binary: plan.proxy,
        mode: plan.mode,
        source,
        min_sync_period: None,
    };
    let mut proxy = RunningProxy::spawn(netns, &launch)?;
    let first_sync = proxy.wait_first_sync(plan.timeout);
    let cpu = proxy.cpu_time();
    if first_sync.done().is_some() {
        std::thread::sleep(SETTLE);
    }
    Ok((first_sync, cpu, proxy.memory()))
}
