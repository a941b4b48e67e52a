//! ebpf mode's control plane at scale (`--parts ebpf-maps`): the socket layer's maps, as
//! the mode writes them, loaded with a synthetic cluster and then changed one endpoint at
//! a time. The programs are attached to a cgroup of the run's own (nothing of this
//! machine lives in it) and pinned under a directory of its own; both go with the run.
//!
//! What is timed is the socket layer's part of a sync: the pure diff of the desired state
//! against what the maps hold, and the map writes. The nftables half of the mode is the
//! nftables backend, measured by `--parts nft-backend`.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use kpr_ebpf::table::{Adopted, Ids, Table};
use kpr_ebpf::{Capacities, Pins, SocketLayer};
use kpr_model::IpFamily;
use kpr_netns::SocketCgroup;

use crate::cluster::{NODE_IP, Shape, SyntheticCluster};
use crate::format::{count, duration, mebibytes, outcome};
use crate::load::Outcome;
use crate::memory::PeakProbe;
use crate::nftables::{Spread, repeat};

/// Everything measured for one cluster size.
#[derive(Clone, Debug)]
pub struct EbpfRow {
    pub shape: Shape,
    /// The first sync: the diff of every Service plus every map write.
    pub cold: Outcome<Duration>,
    /// Map writes of the first sync.
    pub cold_writes: usize,
    /// Service entries and endpoint slots the maps hold after it.
    pub entries: (usize, usize),
    pub endpoint_change: Outcome<Spread>,
    /// Map writes of one endpoint change.
    pub change_writes: usize,
    /// How far the process's peak RSS rose over the measurement (the synthetic cluster's
    /// trackers included; the maps are kernel memory, not counted here).
    pub peak_rss_added_kib: Option<u64>,
}

pub struct EbpfPlan {
    pub shape: Shape,
    pub changes: usize,
}

pub fn measure(plan: &EbpfPlan) -> Result<EbpfRow, String> {
    let sandbox = SocketCgroup::create("benchmaps", &[]).map_err(|e| format!("cgroup: {e}"))?;
    let probe = PeakProbe::start();
    let mut cluster =
        SyntheticCluster::new(plan.shape).map_err(|e| format!("synthetic object rejected: {e}"))?;
    let mut layer = SocketLayer::start(Pins::new(sandbox.pins()), sandbox.path(), Capacities::default())
        .map_err(|e| format!("socket layer: {e}"))?;
    let node: [IpAddr; 1] = [NODE_IP.into()];
    let mut table = Table::new(IpFamily::V4, Adopted::default());
    let mut ids = Ids::default();
    let mut row = EbpfRow {
        shape: plan.shape,
        cold: Outcome::NotAvailable("not reached".to_string()),
        cold_writes: 0,
        entries: (0, 0),
        endpoint_change: Outcome::NotAvailable("the cold load failed".to_string()),
        change_writes: 0,
        peak_rss_added_kib: None,
    };
    let base = cluster.take();
    let started = Instant::now();
    let batch = table.sync(&base.state, None, &node, &mut ids);
    if let Err(error) = layer.apply(&batch.ops) {
        row.cold = Outcome::Failed(error.to_string());
        return Ok(row);
    }
    row.cold = Outcome::Done(started.elapsed());
    row.cold_writes = batch.ops.len();
    row.entries = table.sizes();
    drop((base, batch));
    row.endpoint_change = repeat(plan.changes, |generation| {
        cluster
            .replace_endpoint(generation + 1)
            .map_err(|e| e.to_string())?;
        let pending = cluster.take();
        let started = Instant::now();
        let batch = table.sync(&pending.state, Some(&pending.changed), &node, &mut ids);
        layer.apply(&batch.ops).map_err(|e| e.to_string())?;
        let took = started.elapsed();
        row.change_writes = batch.ops.len();
        Ok(took)
    });
    row.peak_rss_added_kib = probe.and_then(PeakProbe::extra_kib);
    // Detach before the cgroup goes (dropping the layer closes its links; the sandbox
    // removes the pins and the cgroups).
    drop(layer);
    drop(sandbox);
    Ok(row)
}

/// The section of BENCHMARKS.md (nothing without rows).
pub fn section(out: &mut String, rows: &[EbpfRow]) {
    if rows.is_empty() {
        return;
    }
    out.push_str(
        "### ebpf mode: the socket maps at scale (issue 23)\n\n\
         The socket layer as ebpf mode runs it (the programs attached to a cgroup of the run's \
         own, maps pinned in a directory of its own), fed the synthetic cluster's desired \
         state: the cold load is the pure diff of every Service plus every map write; each \
         change is one endpoint of one Service replaced, the diff of that Service and its \
         writes, timed alone. The nftables half of the mode is the nftables backend above; \
         the process's whole memory in this mode is in the end-to-end table.\n\n",
    );
    table(out, rows);
    out.push('\n');
}

/// The socket maps' figures (what the terminal shows too).
pub fn table(out: &mut String, rows: &[EbpfRow]) {
    out.push_str(
        "| services × endpoints | cold load (diff + writes) | its map writes | Service entries / endpoint slots | one endpoint change p50 / p99 | its map writes | peak RSS added |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let _ = writeln!(
            out,
            "| {} × {} | {} | {} | {} / {} | {} | {} | {} |",
            count(row.shape.services),
            row.shape.endpoints,
            outcome(&row.cold, |d| duration(*d)),
            count(row.cold_writes),
            count(row.entries.0),
            count(row.entries.1),
            outcome(&row.endpoint_change, |s| {
                format!("{} / {} ({} runs)", duration(s.p50), duration(s.p99), s.samples)
            }),
            row.change_writes,
            row.peak_rss_added_kib
                .map_or_else(|| "n/a".to_string(), mebibytes),
        );
    }
}
