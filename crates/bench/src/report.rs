//! The Markdown report: result tables for the terminal, and the whole BENCHMARKS.md
//! (machine, date, command, method, results, commentary).

use std::fmt::Write as _;
use std::time::Duration;

use crate::churn::{ChurnRow, LATENCY_METRIC};
use crate::cluster::{CLUSTER_CIDR, NODES, Shape};
use crate::commentary::commentary;
use crate::e2e::{E2eRow, SETTLE};
use crate::flushed::FlushedResult;
use crate::format::{bytes, count, duration, mebibytes, outcome};
use crate::load::{LoadResult, Outcome, Partial};
use crate::machine::Machine;
use crate::nftables::{NftRow, Spread};
use crate::render::RenderStats;
use crate::soak::SoakRow;
use crate::stages::StageRow;
use crate::targets::targets_section;

/// Everything measured for one cluster size.
#[derive(Clone, Debug)]
pub struct Row {
    pub shape: Shape,
    pub render: RenderStats,
    /// What the backend's partial sync writes (found without a kernel).
    pub partial_payload_bytes: Option<usize>,
    pub legacy: LoadResult,
    pub nft: LoadResult,
    pub nft_flushed: FlushedResult,
}

impl Row {
    fn label(&self) -> String {
        format!("{} × {}", count(self.shape.services), self.shape.endpoints)
    }
}

/// How the run was made.
#[derive(Clone, Debug)]
pub struct Settings {
    pub render_runs: usize,
    pub load_runs: usize,
    pub load_timeout: Duration,
    pub command: String,
    pub date: String,
    /// 1-minute load average before and after the run, to judge how busy the machine was.
    pub load_before: String,
    pub load_after: String,
}

/// Every row a run measured, by part.
#[derive(Clone, Copy)]
pub struct Measured<'a> {
    pub rows: &'a [Row],
    pub nft_rows: &'a [NftRow],
    /// ebpf mode's socket maps (`--parts ebpf-maps`).
    pub ebpf_rows: &'a [crate::ebpf::EbpfRow],
    pub e2e_rows: &'a [E2eRow],
    pub churn_rows: &'a [ChurnRow],
    pub soak_rows: &'a [SoakRow],
    pub stage_rows: &'a [StageRow],
    /// The L4 data path (`--parts l4`).
    pub l4: Option<&'a crate::l4::L4Run>,
}

/// The result tables (what the terminal shows).
pub fn results(m: &Measured<'_>) -> String {
    let mut out = String::new();
    if !m.rows.is_empty() {
        main_table(&mut out, m.rows);
        out.push('\n');
        partial_table(&mut out, m.rows);
        out.push('\n');
        render_table(&mut out, m.rows);
    }
    if !m.nft_rows.is_empty() {
        out.push('\n');
        nft_table(&mut out, m.nft_rows);
    }
    if !m.ebpf_rows.is_empty() {
        out.push('\n');
        crate::ebpf::table(&mut out, m.ebpf_rows);
    }
    if !m.e2e_rows.is_empty() {
        out.push('\n');
        e2e_table(&mut out, m.e2e_rows);
    }
    if !m.churn_rows.is_empty() {
        out.push('\n');
        churn_table(&mut out, m.churn_rows);
    }
    if !m.soak_rows.is_empty() {
        out.push('\n');
        crate::soak::report::summary_table(&mut out, m.soak_rows);
    }
    if !m.stage_rows.is_empty() {
        out.push('\n');
        stage_table(&mut out, m.stage_rows);
    }
    if let Some(run) = m.l4 {
        out.push('\n');
        crate::l4::report::figures_table(&mut out, run);
        out.push('\n');
        crate::l4::report::cpu_table(&mut out, run);
    }
    out
}

fn kib_cell(kib: Option<u64>) -> String {
    kib.map_or_else(|| "n/a".to_string(), mebibytes)
}

/// The real binary, end to end.
fn e2e_table(out: &mut String, rows: &[E2eRow]) {
    out.push_str(
        "| services × endpoints | mode | source | spawn to first sync | proxy CPU time by then | peak RSS (VmHWM) | steady RSS (VmRSS) |\n\
         |---|---|---|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let source = match row.manifest_bytes {
            Some(size) => format!("{} ({})", row.source.label(), bytes(size)),
            None => row.source.label().to_string(),
        };
        let _ = writeln!(
            out,
            "| {} × {} | {} | {source} | {} | {} | {} | {} |",
            count(row.shape.services),
            row.shape.endpoints,
            row.mode,
            outcome(&row.first_sync, |d| duration(*d)),
            row.first_sync_cpu.map_or_else(|| "n/a".to_string(), duration),
            kib_cell(row.memory.peak_kib),
            kib_cell(row.memory.rss_kib),
        );
    }
}

/// Heap bytes per pipeline stage: live after each, the peak within each, and what each
/// added to the live bytes.
fn stage_table(out: &mut String, rows: &[StageRow]) {
    out.push_str(
        "| services × endpoints | source | stage | live after | added | peak within |\n\
         |---|---|---|---:|---:|---:|\n",
    );
    for row in rows {
        let mut before = 0;
        for stage in &row.stages {
            let added =
                i128::try_from(stage.live).unwrap_or(i128::MAX) - i128::try_from(before).unwrap_or(i128::MAX);
            let _ = writeln!(
                out,
                "| {} × {} | {} | {} | {} | {} | {} |",
                count(row.shape.services),
                row.shape.endpoints,
                row.source.label(),
                stage.stage,
                heap(stage.live),
                signed_heap(added),
                heap(stage.peak),
            );
            before = stage.live;
        }
    }
}

/// Heap bytes in MiB with one decimal: stages differ by a few MiB.
fn heap(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

fn signed_heap(bytes: i128) -> String {
    let mib = bytes as f64 / f64::from(1 << 20);
    if mib < 0.0 {
        format!("−{:.1} MiB", -mib)
    } else {
        format!("+{mib:.1} MiB")
    }
}

/// The real binary under churn.
fn churn_table(out: &mut String, rows: &[ChurnRow]) {
    out.push_str(
        "| services × endpoints | mode | min sync period | first sync (from the API) | changes written | latency p50 / p99 | samples | proxy CPU while churning | peak RSS (VmHWM) | RSS at the end (VmRSS) |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let changes = if row.changes == 0 {
            "none".to_string()
        } else {
            format!("{} in {:.1} s", count(row.changes), row.churn_time.as_secs_f64())
        };
        let samples = match &row.latency {
            Outcome::Done(l) if l.samples == row.changes as u64 => count(row.changes),
            Outcome::Done(l) => format!(
                "**{} of {} changes**",
                count(usize::try_from(l.samples).unwrap_or(usize::MAX)),
                count(row.changes)
            ),
            _ => "n/a".to_string(),
        };
        let _ = writeln!(
            out,
            "| {} × {} | {} | {} | {} | {changes} | {} | {samples} | {} | {} | {} |",
            count(row.shape.services),
            row.shape.endpoints,
            row.mode,
            row.min_sync_period.as_deref().unwrap_or("default"),
            outcome(&row.first_sync, |d| duration(*d)),
            outcome(&row.latency, |l| format!(
                "{} / {}",
                duration(l.p50),
                duration(l.p99)
            )),
            row.cpu_percent()
                .map_or_else(|| "n/a".to_string(), |p| format!("{p:.1} % of a core")),
            kib_cell(row.memory.peak_kib),
            kib_cell(row.memory.rss_kib),
        );
    }
}

/// nftables mode: one row per size and transport.
fn nft_table(out: &mut String, rows: &[NftRow]) {
    out.push_str(
        "| services × endpoints | transport | cold full sync | cold batches | cold element ops | one endpoint change p50 / p99 | its element ops | one new Service p50 / p99 | peak RSS added |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let spread = |o: &Outcome<Spread>| {
            outcome(o, |s| {
                format!("{} / {} ({} runs)", duration(s.p50), duration(s.p99), s.samples)
            })
        };
        let _ = writeln!(
            out,
            "| {} × {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            count(row.shape.services),
            row.shape.endpoints,
            row.transport.label(),
            outcome(&row.cold, |d| duration(*d)),
            row.cold_batches,
            count(row.cold_elements),
            spread(&row.endpoint_change),
            row.change_elements,
            spread(&row.new_service),
            row.peak_rss_added_kib
                .map_or_else(|| "n/a".to_string(), mebibytes),
        );
    }
}

fn main_table(out: &mut String, rows: &[Row]) {
    out.push_str(
        "| services × endpoints | render (build + text) | payload | rules | chains | iptables-legacy-restore | iptables-nft-restore | iptables-nft-restore, flushing |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let load = |r: &LoadResult| outcome(&r.full, |d| with_runs(duration(*d), r.runs));
    for row in rows {
        let flushed = &row.nft_flushed;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            row.label(),
            duration(row.render.total),
            bytes(row.render.payload_bytes),
            count(row.render.rules),
            count(row.render.chains),
            load(&row.legacy),
            load(&row.nft),
            outcome(&flushed.load, |d| with_runs(duration(*d), flushed.runs)),
        );
    }
}

fn partial_table(out: &mut String, rows: &[Row]) {
    out.push_str(
        "| services × endpoints | variant | partial payload | restore | whole sync step |\n\
         |---|---|---:|---:|---:|\n",
    );
    for row in rows {
        for (variant, result) in [("legacy", &row.legacy), ("nft", &row.nft)] {
            let cell = |show: &dyn Fn(&Partial) -> String| outcome(&result.partial, show);
            let _ = writeln!(
                out,
                "| {} | {variant} | {} | {} | {} |",
                row.label(),
                cell(&|p| bytes(p.bytes)),
                cell(&|p| duration(p.restore)),
                cell(&|p| duration(p.sync)),
            );
        }
        let _ = writeln!(
            out,
            "| {} | nft, after a flushing load | {} | {} | n/a: restore only |",
            row.label(),
            row.partial_payload_bytes.map_or_else(|| "n/a".to_string(), bytes),
            outcome(&row.nft_flushed.partial, |d| duration(*d)),
        );
    }
}

fn render_table(out: &mut String, rows: &[Row]) {
    out.push_str(
        "| services × endpoints | build | text | total | peak RSS added | runs | endpoint comments |\n\
         |---|---:|---:|---:|---:|---:|---|\n",
    );
    for row in rows {
        let r = &row.render;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            row.label(),
            duration(r.build),
            duration(r.text),
            duration(r.total),
            r.extra_memory_kib.map_or_else(|| "n/a".to_string(), mebibytes),
            r.runs,
            if r.large_cluster {
                "left out (large cluster)"
            } else {
                "kept"
            },
        );
    }
}

fn with_runs(cell: String, runs: usize) -> String {
    if runs > 1 {
        format!("{cell} (median of {runs})")
    } else {
        cell
    }
}

/// The whole BENCHMARKS.md.
pub fn document(machine: &Machine, settings: &Settings, m: &Measured<'_>) -> String {
    let Measured {
        rows,
        nft_rows,
        ebpf_rows,
        e2e_rows,
        churn_rows,
        soak_rows,
        stage_rows,
        l4,
    } = *m;
    let mut out = String::from("# Benchmarks\n\n");
    out.push_str(
        "Generated by `kpr-bench` (crates/bench); rerun it to refresh this file. Rendering is our \
         own code's cost; loading is the kernel's and iptables' cost, measured separately.\n\n",
    );
    machine_section(&mut out, machine, settings);
    results_section(&mut out, rows);
    if !nft_rows.is_empty() {
        out.push_str(
            "### nftables mode: cold full sync and single changes\n\n\
             The real `NftablesBackend` in a fresh namespace: the cold sync is generation plus \
             the kernel load (all batches), as a user waits for it; each change is one partial \
             sync (the changed Service's elements and shared chains only), timed alone.\n\n",
        );
        nft_table(&mut out, nft_rows);
        out.push('\n');
    }
    crate::ebpf::section(&mut out, ebpf_rows);
    if !e2e_rows.is_empty() {
        let _ = write!(
            out,
            "### The real binary, end to end\n\n\
             `kube-proxy-rs` started in a fresh namespace on the cluster, read either from one \
             manifest file (a JSON `List` with this node's Node) or from the test API server \
             (the same objects, served from the proxy's namespace with the real wire protocol: \
             paginated lists, then watches). *Spawn to first sync*: from spawning the process to \
             its metrics reporting the first successful sync (reading and validating the file or \
             listing the API, the trackers, generation and the kernel load); beside it the CPU \
             time the proxy used by then (user + system), which tells its own work from waiting. \
             The test API server runs inside kpr-bench on the same two cores (it serves the \
             pages of one list, 500 items each as kube-rs asks, from one sorted snapshot and \
             encodes every page as JSON), so at large sizes a good part of the wall-clock time \
             from the API is the server's, not the proxy's: compare with the CPU time. Memory is the whole process's, read {settle} s after that sync: \
             the peak so far (`VmHWM`) and what stays resident (`VmRSS`); at the timeout when \
             there was no sync.\n\n",
            settle = SETTLE.as_secs(),
        );
        e2e_table(&mut out, e2e_rows);
        out.push('\n');
        if crate::plots::e2e::drawn(e2e_rows) {
            crate::plots::embed(&mut out, &crate::plots::e2e::FIGURE);
        }
    }
    if !churn_rows.is_empty() {
        churn_intro(&mut out, churn_rows);
        churn_table(&mut out, churn_rows);
        out.push('\n');
        if crate::plots::churn::drawn(churn_rows) {
            crate::plots::embed(&mut out, &crate::plots::churn::FIGURE);
        }
    }
    crate::soak::report::section(&mut out, soak_rows);
    if !stage_rows.is_empty() {
        out.push_str(
            "### Where the memory goes: heap bytes per stage\n\n\
             The product's own pipeline run inside kpr-bench (no proxy process), with a \
             counting allocator in kpr-bench's binary: the source's objects (k8s-openapi \
             objects in `Event`s as the API source hands them, or one manifest file's bytes \
             parsed and validated into the `ManifestCatalog`), intake into the trackers of \
             both families (a dual-stack proxy), each family's `take()` (the `DesiredState` \
             of a sync), the nftables backend of each family after its cold sync into a fresh \
             namespace, and the same after the sync requests are dropped. *Live after*: heap \
             bytes still allocated after the stage, counted from the start of the run, so \
             each stage includes what earlier ones still hold (intake consumes the events, so \
             the API objects are gone after it; the catalog stays). *Peak within*: the most \
             live at any moment during the stage. Heap bytes as the program asked for them, \
             without the allocator's own overhead or fragmentation, which RSS adds. The peak \
             within the manifest file's stage is kpr-bench writing that file (through a \
             serde_json value tree), not the product.\n\n",
        );
        stage_table(&mut out, stage_rows);
        out.push('\n');
    }
    if let Some(run) = l4 {
        crate::l4::report::section(&mut out, run);
    }
    method_section(&mut out, settings);
    out.push_str(&commentary(rows));
    if !nft_rows.is_empty()
        || !e2e_rows.is_empty()
        || !churn_rows.is_empty()
        || !soak_rows.is_empty()
        || l4.is_some()
    {
        out.push('\n');
        out.push_str(&targets_section(m));
    }
    out
}

fn churn_intro(out: &mut String, rows: &[ChurnRow]) {
    let (rate, seconds) = rows.first().map_or((0, 0), |r| (r.rate, r.seconds));
    let _ = write!(
        out,
        "### Network programming latency under churn\n\n\
         `kube-proxy-rs` watching the test API server (in its namespace) that holds the cluster; \
         after its first sync, {rate} EndpointSlice changes per second for {seconds} s at a \
         steady pace, each replacing one endpoint address of a slice picked at random (fixed \
         seed) and stamped with the time of the change in \
         `endpoints.kubernetes.io/last-change-trigger-time` (RFC 3339 with nanoseconds, as the \
         endpoint-slice controller writes it). The latency is the proxy's own \
         `{LATENCY_METRIC}` (trigger time to the end of the sync that programmed the change: the \
         watch, the trackers, the sync runner's min sync period and the kernel), read from \
         `/metrics` once it holds a sample per change (or after a minute); p50/p99 are \
         interpolated linearly inside the bucket holding the rank, as Prometheus' \
         `histogram_quantile` does, so their resolution is the bucket width (1 ms to 50 ms \
         below 0.25 s, then upstream's 0.25 s, 0.5 s and 1 s steps). *Samples* must equal the \
         changes written; a shortfall is shown in bold. Memory is the whole process's at the \
         end. A row whose first sync did not come within the timeout says so and has no \
         latency.\n\n",
    );
}

fn machine_section(out: &mut String, m: &Machine, s: &Settings) {
    let _ = writeln!(out, "## Run\n");
    let _ = writeln!(out, "- Date: {}", s.date);
    let _ = writeln!(out, "- Command: `{}`", s.command);
    let _ = writeln!(out, "- CPU: {} ({} cores available)", m.cpu, m.cores);
    let _ = writeln!(out, "- Memory: {}", m.memory);
    let _ = writeln!(out, "- OS: {}, kernel {}", m.os, m.kernel);
    let _ = writeln!(out, "- iptables: {}", m.iptables.join("; "));
    let _ = writeln!(
        out,
        "- Load average (1 min) at start / end: {} / {}. The machine is shared with other \
         work, so compare ratios more than absolute times.\n",
        s.load_before, s.load_after
    );
}

/// The iptables mode's tables, under the results heading; a run without them (`--parts`,
/// `--modes`) has the heading only.
fn results_section(out: &mut String, rows: &[Row]) {
    out.push_str("## Results\n\n");
    if rows.is_empty() {
        return;
    }
    out.push_str("### Full sync: render, size, kernel load of the whole ruleset\n\n");
    main_table(out, rows);
    out.push_str(
        "\n### Partial sync after one endpoint of one service changed\n\n\
         *Restore* is `iptables-restore` alone; the *whole sync step* is the backend's \
         `sync_rules` call: canary checks, rendering the whole ruleset, choosing the changed \
         chains, and the restore.\n\n",
    );
    partial_table(out, rows);
    out.push_str("\n### Rendering in detail\n\n");
    render_table(out, rows);
    out.push('\n');
}

fn method_section(out: &mut String, s: &Settings) {
    let _ = write!(
        out,
        "## Method\n\n\
         - **Cluster.** N ClusterIP Services (TCP, one port each) with E ready endpoints each, \
         one EndpointSlice per Service, endpoints spread round-robin over {NODES} nodes (one in \
         {NODES} on this node). The objects are k8s-openapi `Service`/`EndpointSlice` values \
         fed through kpr-tracking's `ServiceTracker`/`EndpointsTracker`; the `DesiredState` \
         comes out of their `take()`, as in the product's sync loop. Options: upstream's \
         defaults plus `--cluster-cidr {CLUSTER_CIDR}`. Above 1000 endpoints in all, endpoint \
         comments are left out, as upstream's large-cluster mode does.\n\
         - **Render.** `kpr_iptables::build` (desired state to ruleset) plus \
         `Ruleset::render_full` (the `iptables-restore` text of a full sync), median of {runs} \
         runs. *Peak RSS added*: how far the process's peak RSS rose during the first run \
         (reset through `/proc/self/clear_refs`, read from `VmHWM`).\n\
         - **Kernel load.** A fresh network namespace per run, so every full load starts from \
         empty tables. The product's `IptablesBackend` makes its first (full) sync there and \
         writes exactly the rendered payload (checked by hash) with `ip netns exec NS \
         iptables-{{legacy,nft}}-restore -w 5 --noflush --counters`, the flags the product uses; \
         the time runs from spawning that command to its exit. Median of at most {load_runs} \
         run(s) (a load over 60 s is not repeated); each restore is killed after {timeout} s.\n\
         - **Partial sync.** In the same namespace, one endpoint of one Service is replaced \
         (a rolling update) and the trackers hand that change to the backend, which makes the \
         partial sync production would make.\n\
         - **nf_tables, flushing.** Because `--noflush` loads are slow on nf_tables, a fresh \
         namespace is also loaded with the same full payload by `iptables-nft-restore -w 5 \
         --counters` (flushing the tables it names; in an empty namespace the result is the \
         same ruleset, minus the few jump rules from built-in chains), and then the backend's \
         partial payload (recorded from the real backend, no kernel needed) is restored with \
         the product's `--noflush` flags. This gives the partial-sync cost on nf_tables even \
         where the product's own full load does not finish in time.\n\n",
        runs = s.render_runs,
        load_runs = s.load_runs,
        timeout = s.load_timeout.as_secs(),
    );
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::e2e::E2eSource;

    pub(crate) fn row(services: usize, legacy_secs: f64) -> Row {
        let render = RenderStats {
            runs: 5,
            build: Duration::from_millis(100),
            text: Duration::from_millis(20),
            total: Duration::from_millis(120),
            payload_bytes: 30_000_000,
            rules: 250_000,
            chains: 110_000,
            large_cluster: true,
            extra_memory_kib: Some(200 << 10),
        };
        Row {
            shape: Shape {
                services,
                endpoints: 10,
            },
            render,
            partial_payload_bytes: Some(1_400_000),
            legacy: LoadResult {
                runs: 3,
                full: Outcome::Done(Duration::from_secs_f64(legacy_secs)),
                partial: Outcome::Done(Partial {
                    bytes: 1_400_000,
                    restore: Duration::from_millis(300),
                    sync: Duration::from_millis(500),
                }),
            },
            nft: LoadResult {
                runs: 1,
                full: Outcome::TimedOut(Duration::from_secs(600)),
                partial: Outcome::NotAvailable("full load did not finish".into()),
            },
            nft_flushed: FlushedResult {
                runs: 1,
                load: Outcome::Done(Duration::from_secs_f64(legacy_secs * 2.0)),
                partial: Outcome::Done(Duration::from_millis(700)),
            },
        }
    }

    #[test]
    fn tables_show_every_measurement_and_every_gap() {
        let rows = [row(10_000, 4.9)];
        let text = results(&Measured {
            rows: &rows,
            nft_rows: &[],
            ebpf_rows: &[],
            e2e_rows: &[],
            churn_rows: &[],
            soak_rows: &[],
            stage_rows: &[],
            l4: None,
        });
        assert!(text.contains("| 10,000 × 10 | 120 ms | 30.0 MB | 250,000 | 110,000 | 4.90 s (median of 3) | timed out after 600 s | 9.80 s |"), "{text}");
        assert!(
            text.contains("| 10,000 × 10 | legacy | 1.4 MB | 300 ms | 500 ms |"),
            "{text}"
        );
        assert!(
            text.contains("| 10,000 × 10 | nft | n/a: full load did not finish |"),
            "{text}"
        );
        assert!(
            text.contains(
                "| 10,000 × 10 | 100 ms | 20.0 ms | 120 ms | 200 MiB | 5 | left out (large cluster) |"
            ),
            "{text}"
        );
    }

    /// No rows of any part.
    pub(crate) fn measured_none() -> Measured<'static> {
        Measured {
            rows: &[],
            nft_rows: &[],
            ebpf_rows: &[],
            e2e_rows: &[],
            churn_rows: &[],
            soak_rows: &[],
            stage_rows: &[],
            l4: None,
        }
    }

    pub(crate) fn e2e_row(mode: &'static str, source: E2eSource, first_sync: Outcome<Duration>) -> E2eRow {
        E2eRow {
            shape: Shape {
                services: 10_000,
                endpoints: 10,
            },
            mode,
            source,
            manifest_bytes: (source == E2eSource::Manifest).then_some(17_000_000),
            first_sync,
            first_sync_cpu: Some(Duration::from_millis(1_500)),
            memory: crate::proxy::Memory {
                peak_kib: Some(300 << 10),
                rss_kib: Some(200 << 10),
                anon_kib: None,
            },
        }
    }

    pub(crate) fn churn_row(mode: &'static str, samples: u64, p99_ms: u64) -> ChurnRow {
        ChurnRow {
            shape: Shape {
                services: 10_000,
                endpoints: 10,
            },
            mode,
            min_sync_period: Some("1s".into()),
            rate: 100,
            seconds: 60,
            first_sync: Outcome::Done(Duration::from_millis(2_100)),
            changes: 6_000,
            churn_time: Duration::from_millis(60_010),
            latency: Outcome::Done(crate::churn::Latency {
                p50: Duration::from_millis(12),
                p99: Duration::from_millis(p99_ms),
                samples,
                buckets: vec![(0.01, samples / 2), (0.1, samples), (f64::INFINITY, samples)],
            }),
            churn_cpu: Some(Duration::from_millis(3_001)),
            memory: crate::proxy::Memory {
                peak_kib: Some(400 << 10),
                rss_kib: None,
                anon_kib: None,
            },
        }
    }

    #[test]
    fn stage_rows_show_live_bytes_what_each_stage_added_and_its_peak() {
        use crate::stages::{StageMemory, StageRow, StageSource};
        let mib = |n: usize| n << 20;
        let stages = [StageRow {
            shape: Shape {
                services: 10_000,
                endpoints: 10,
            },
            source: StageSource::Api,
            stages: vec![
                StageMemory {
                    stage: "source",
                    live: mib(40),
                    peak: mib(41),
                },
                StageMemory {
                    stage: "trackers",
                    live: mib(12),
                    peak: mib(52),
                },
            ],
        }];
        let text = results(&Measured {
            rows: &[],
            nft_rows: &[],
            ebpf_rows: &[],
            e2e_rows: &[],
            churn_rows: &[],
            soak_rows: &[],
            stage_rows: &stages,
            l4: None,
        });
        assert!(
            text.contains("| stage | live after | added | peak within |"),
            "{text}"
        );
        assert!(
            text.contains("| 10,000 × 10 | API | source | 40.0 MiB | +40.0 MiB | 41.0 MiB |"),
            "{text}"
        );
        assert!(
            text.contains("| 10,000 × 10 | API | trackers | 12.0 MiB | −28.0 MiB | 52.0 MiB |"),
            "{text}"
        );
    }

    #[test]
    fn end_to_end_rows_show_their_source_and_both_memories() {
        let e2e = [
            e2e_row(
                "nftables",
                E2eSource::Manifest,
                Outcome::Done(Duration::from_millis(1_820)),
            ),
            e2e_row(
                "iptables",
                E2eSource::Api,
                Outcome::TimedOut(Duration::from_secs(120)),
            ),
        ];
        let text = results(&Measured {
            rows: &[],
            nft_rows: &[],
            ebpf_rows: &[],
            e2e_rows: &e2e,
            churn_rows: &[],
            soak_rows: &[],
            stage_rows: &[],
            l4: None,
        });
        assert!(
            text.contains("| source | spawn to first sync | proxy CPU time by then | peak RSS (VmHWM) | steady RSS (VmRSS) |"),
            "{text}"
        );
        assert!(
            text.contains(
                "| 10,000 × 10 | nftables | manifest file (17.0 MB) | 1.82 s | 1.50 s | 300 MiB | 200 MiB |"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "| 10,000 × 10 | iptables | test API server | timed out after 120 s | 1.50 s | 300 MiB | 200 MiB |"
            ),
            "{text}"
        );
    }

    #[test]
    fn churn_rows_show_latency_and_flag_missing_samples() {
        let mut no_sync = churn_row("iptables", 0, 0);
        no_sync.first_sync = Outcome::TimedOut(Duration::from_secs(600));
        no_sync.changes = 0;
        no_sync.latency = Outcome::NotAvailable("no first sync".into());
        let churn = [
            churn_row("nftables", 6_000, 80),
            churn_row("nftables", 5_990, 80),
            no_sync,
        ];
        let text = results(&Measured {
            rows: &[],
            nft_rows: &[],
            ebpf_rows: &[],
            e2e_rows: &[],
            churn_rows: &churn,
            soak_rows: &[],
            stage_rows: &[],
            l4: None,
        });
        assert!(
            text.contains("| 10,000 × 10 | nftables | 1s | 2.10 s | 6,000 in 60.0 s | 12.0 ms / 80.0 ms | 6,000 | 5.0 % of a core | 400 MiB | n/a |"),
            "{text}"
        );
        assert!(text.contains("| **5,990 of 6,000 changes** |"), "{text}");
        assert!(
            text.contains(
                "| 10,000 × 10 | iptables | 1s | timed out after 600 s | none | n/a: no first sync | n/a |"
            ),
            "{text}"
        );
    }

    fn settings() -> Settings {
        Settings {
            render_runs: 5,
            load_runs: 3,
            load_timeout: Duration::from_secs(600),
            command: "cargo run --release -p kpr-bench -- --out BENCHMARKS.md".into(),
            date: "2026-01-01 00:00 UTC".into(),
            load_before: "0.10".into(),
            load_after: "1.50".into(),
        }
    }

    fn machine() -> Machine {
        Machine {
            cpu: "cpu".into(),
            cores: 2,
            memory: "24 GiB".into(),
            os: "Debian".into(),
            kernel: "6.18".into(),
            iptables: vec!["iptables v1.8.9 (legacy)".into()],
        }
    }

    #[test]
    fn the_document_has_run_facts_and_no_links_to_internal_docs() {
        let (settings, machine) = (settings(), machine());
        let rows = [row(1_000, 0.2), row(10_000, 5.0)];
        let doc = document(
            &machine,
            &settings,
            &Measured {
                rows: &rows,
                nft_rows: &[],
                ebpf_rows: &[],
                e2e_rows: &[],
                churn_rows: &[],
                soak_rows: &[],
                stage_rows: &[],
                l4: None,
            },
        );
        for needle in [
            "- Date: 2026-01-01 00:00 UTC",
            "`cargo run --release -p kpr-bench -- --out BENCHMARKS.md`",
            "(2 cores available)",
            "kernel 6.18",
            "at start / end: 0.10 / 1.50.",
            "## Commentary",
        ] {
            assert!(doc.contains(needle), "missing {needle:?}");
        }
        assert!(!doc.contains("../shared") && !doc.contains("/work/"));
    }

    #[test]
    fn a_run_without_iptables_rows_has_no_empty_iptables_tables() {
        let (settings, machine) = (settings(), machine());
        let churn = [churn_row("nftables", 6_000, 80)];
        let doc = document(
            &machine,
            &settings,
            &Measured {
                rows: &[],
                nft_rows: &[],
                ebpf_rows: &[],
                e2e_rows: &[],
                churn_rows: &churn,
                soak_rows: &[],
                stage_rows: &[],
                l4: None,
            },
        );
        assert!(
            doc.contains("## Results\n\n### Network programming latency under churn"),
            "{doc}"
        );
        assert!(!doc.contains("### Full sync"), "{doc}");
        assert!(doc.contains("| 10,000 × 10 | nftables | 1s |"), "{doc}");
    }

    #[test]
    fn sections_with_plots_end_with_their_image_and_others_have_none() {
        let (settings, machine) = (settings(), machine());
        let churn = [churn_row("nftables", 6_000, 80)];
        let e2e = [e2e_row("nftables", E2eSource::Api, Outcome::Failed("no".into()))];
        let m = Measured {
            churn_rows: &churn,
            e2e_rows: &e2e,
            ..measured_none()
        };
        let doc = document(&machine, &settings, &m);
        let churn_table_end = doc.find("| 10,000 × 10 | nftables | 1s |").unwrap();
        let churn_image = doc.find("](benchmarks/churn-latency.svg)\n").unwrap();
        assert!(churn_image > churn_table_end, "{doc}");
        assert!(doc.contains("](benchmarks/e2e-cold-sync.svg)"), "{doc}");
        assert!(
            !doc.contains("soak-rss.svg") && !doc.contains("l4-paths.svg"),
            "{doc}"
        );
        let none = document(&machine, &settings, &measured_none());
        assert!(!none.contains("![") && !none.contains("benchmarks/"), "{none}");
    }
}
