//! kpr-bench: what a full sync of kube-proxy-rs's iptables mode costs at 1k and 10k
//! services, split into our own code (rendering the ruleset) and the kernel (loading it with
//! iptables-legacy and iptables-nft), plus the partial sync after one endpoint changed.
//!
//! ```text
//! cargo run --release -p kpr-bench -- [--services 1000,10000] [--endpoints 10] [--out BENCHMARKS.md]
//! ```
//!
//! Kernel loads happen only in network namespaces this process creates (needs root); the
//! results are printed as Markdown and, with `--out`, written as the whole BENCHMARKS.md,
//! with its plots (SVG, drawn by `plots` with plotters) in `benchmarks/` beside it: the
//! programming latency under churn, RSS over the soak, cold sync time and peak RSS against
//! the number of Services, and the L4 paths as bars, each when its part ran.
//!
//! Five parts, each selectable with `--parts`: the iptables backend's rendering and kernel
//! loads, the nftables backend's syncs, the real binary's start-up end to end (from a manifest
//! file and from the test API server), the real binary's network programming latency
//! under endpoint churn through the test API server, where the memory goes (`stages`: the
//! product's pipeline in-process, heap bytes per stage, counted by this binary's own
//! allocator), and, only when asked for, the soak (it lasts half an hour by default: the
//! real binary's memory and metric series under long churn with watch drops and forced
//! relists), ebpf mode's socket maps (`ebpf-maps`: cold load and single endpoint changes)
//! and the L4 data path (`l4`: TCP throughput, new connections per second and latency
//! through the userspace mode beside HAProxy, the iptables, nftables and ebpf modes and no
//! proxy, from outside the node or, with `--l4-client pod`, from a pod; it needs `haproxy`).

mod api_lab;
mod churn;
mod cluster;
mod commentary;
#[allow(unsafe_code)] // GlobalAlloc is an unsafe trait; see the module docs.
mod counting;
mod cpu;
mod e2e;
mod ebpf;
mod flushed;
mod format;
mod histogram;
mod l4;
mod load;
mod machine;
mod memory;
mod nftables;
mod options;
mod payloads;
mod plots;
mod proxy;
mod render;
mod report;
mod scratch;
mod soak;
mod stages;
mod stats;
mod targets;
mod timed;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser};
use kpr_iptables::Variant;

use crate::cluster::{Shape, Snapshot, SyntheticCluster};
use crate::flushed::{FlushedPlan, FlushedResult};
use crate::load::{LoadPlan, LoadResult, Outcome};
use crate::report::{Row, Settings};

/// Counts live heap bytes for the stage table (`--parts stages`); the product binary keeps
/// the system allocator.
#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

#[derive(Debug, Parser)]
#[command(
    name = "kpr-bench",
    about = "Render and kernel-load benchmarks of the iptables mode; writes BENCHMARKS.md"
)]
struct Args {
    /// Cluster sizes to measure (services), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    services: Vec<usize>,
    /// Endpoints per service.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..))]
    endpoints: u16,
    /// Render runs per size (the median is reported).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..))]
    runs: u16,
    /// Kernel loads per size and variant, each in a fresh namespace (the median is reported;
    /// loads over 60 s are not repeated).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
    load_runs: u16,
    /// Seconds after which one iptables-restore is killed and reported as timed out.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    load_timeout: u64,
    /// Only measure rendering; no namespaces, no kernel.
    #[arg(long)]
    render_only: bool,
    /// Proxy modes to measure.
    #[arg(long, value_delimiter = ',', value_enum, default_value = "iptables,nftables")]
    modes: Vec<BenchMode>,
    /// Cluster sizes to measure in nftables mode (services), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,50000")]
    nft_services: Vec<usize>,
    /// How nftables mode reaches the kernel.
    #[arg(long, value_enum, default_value = "netlink")]
    nft_transport: nftables::NftTransport,
    /// Single changes of each kind (endpoint change, new Service) timed in nftables mode.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..))]
    changes: u16,
    /// Cluster sizes (services) for ebpf mode's socket maps (`--parts ebpf-maps`).
    #[arg(long, value_delimiter = ',', default_value = "10000,50000")]
    ebpf_services: Vec<usize>,
    /// Cluster sizes (services) for the end-to-end run of the real binary, per mode and source.
    #[arg(long, value_delimiter = ',', default_value = "10000,50000")]
    e2e_services: Vec<usize>,
    /// Where the end-to-end run's binary reads the cluster from.
    #[arg(long, value_delimiter = ',', value_enum, default_value = "manifest,api")]
    e2e_sources: Vec<e2e::E2eSource>,
    /// The kube-proxy-rs binary for the end-to-end and churn runs (default: next to kpr-bench).
    #[arg(long, value_name = "FILE")]
    proxy: Option<PathBuf>,
    /// Seconds the end-to-end and churn runs wait for the first sync.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    e2e_timeout: u64,
    /// Cluster sizes (services) for the churn run of the real binary, per mode.
    #[arg(long, value_delimiter = ',', default_value = "10000,50000")]
    churn_services: Vec<usize>,
    /// Endpoint changes per second during the churn run.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    churn_rate: u32,
    /// How long the churn lasts.
    #[arg(long, value_name = "SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u32).range(1..=3600))]
    churn_seconds: u32,
    /// The proxy's `--iptables-min-sync-period` (both modes) in the churn run; one run per
    /// value given (Go durations, or `default`: no flag, each mode's own default).
    #[arg(long, value_delimiter = ',', default_value = "default")]
    churn_min_sync_period: Vec<String>,
    /// Cluster sizes (services) for the in-process stage accounting (`--parts stages`).
    #[arg(long, value_delimiter = ',', default_value = "10000,50000")]
    stage_services: Vec<usize>,
    /// Where the stage accounting's pipeline starts.
    #[arg(long, value_delimiter = ',', value_enum, default_value = "api,manifest")]
    stage_sources: Vec<stages::StageSource>,
    /// Which parts to run (the soak only when named).
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "render-load,nft-backend,e2e,churn,stages"
    )]
    parts: Vec<Part>,
    /// Services (× `--endpoints`) the soak starts from and keeps.
    #[arg(long, default_value_t = 10_000)]
    soak_services: usize,
    /// How long the soak churns, after the first sync.
    #[arg(long, value_name = "MINUTES", default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=1440))]
    soak_minutes: u32,
    /// Endpoint changes per second during the soak.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    soak_endpoint_rate: u32,
    /// Service turnovers per second during the soak: each creates a Service (with its
    /// slice) and deletes the oldest extra one, so the count stays put.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=1_000))]
    soak_service_rate: u32,
    /// Seconds between ending every watch during the soak (0: never).
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    soak_watch_drop_seconds: u64,
    /// Seconds between forced relists (history compacted, watches ended; 0: never).
    #[arg(long, value_name = "SECONDS", default_value_t = 150)]
    soak_relist_seconds: u64,
    /// Seconds between samples of the proxy's memory and metric series.
    #[arg(long, value_name = "SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    soak_sample_seconds: u64,
    /// Backend pods of the L4 benchmark (`--parts l4`).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    l4_backends: u16,
    /// Streams of the L4 benchmark's second bulk phase.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    l4_streams: u16,
    /// Concurrent connections of the L4 benchmark's connection-rate phase.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=1024))]
    l4_concurrency: u16,
    /// Seconds each L4 phase is measured.
    #[arg(long, value_name = "SECONDS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    l4_seconds: u64,
    /// Runs of each L4 phase per path (the median run is reported).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=99))]
    l4_runs: u16,
    /// Times the L4 benchmark goes through all its rows, one after the other; each phase's
    /// runs are pooled over the rounds (the machine's load drifts: a row measured in one
    /// stretch of time only can be lucky).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=20))]
    l4_rounds: u16,
    /// Turns of the L4 benchmark's interleaved comparison, after its rows: the userspace
    /// mode and HAProxy run at once and are measured in turns, each turn comparing figures
    /// taken seconds apart (0: none).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=200))]
    l4_turns: u16,
    /// Seconds of each slice of an interleaved turn (one for many connections at once, one
    /// for one at a time, per contestant).
    #[arg(long, value_name = "SECONDS", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=60))]
    l4_turn_seconds: u64,
    /// The paths the L4 benchmark measures (default: all; fewer for a quick comparison).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = l4::cluster::Path::ALL)]
    l4_paths: Vec<l4::cluster::Path>,
    /// Turns of the L4 benchmark's comparison of each kernel mode's Service address with
    /// its pods reached directly, the mode running (nftables and ebpf, those in
    /// `--l4-paths`; 0: none).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=200))]
    l4_service_turns: u16,
    /// Where the L4 benchmark's client runs: outside the node, or in a pod of its own.
    #[arg(long, value_enum, default_value = "outside")]
    l4_client: l4::cluster::Placement,
    /// The haproxy program for the L4 benchmark (default: `haproxy` from PATH).
    #[arg(long, value_name = "FILE")]
    haproxy: Option<PathBuf>,
    /// Whether `--modes` was given (the soak runs nftables mode only unless it was).
    #[arg(skip)]
    modes_given: bool,
    /// Write the whole report (BENCHMARKS.md) to this file.
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum BenchMode {
    Iptables,
    Nftables,
    /// The real binary only (end to end, churn, soak): the userspace mode has no
    /// in-process part of its own.
    Userspace,
    /// The real binary (end to end, churn, soak), its programs attached to a cgroup of the
    /// run's own; the socket maps in-process with `--parts ebpf-maps`.
    Ebpf,
}

/// The parts of a run (`--parts`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    /// iptables mode: rendering, kernel loads, partial syncs (`--services`).
    RenderLoad,
    /// nftables mode's backend: cold sync and single changes (`--nft-services`).
    NftBackend,
    /// The real binary's first sync and memory (`--e2e-services`, `--e2e-sources`).
    E2e,
    /// The real binary's programming latency under churn (`--churn-*`).
    Churn,
    /// The real binary's memory and metric series under long churn (`--soak-*`; nftables
    /// mode unless `--modes` is given).
    Soak,
    /// Heap bytes per pipeline stage, in-process (`--stage-services`, `--stage-sources`).
    Stages,
    /// ebpf mode's socket maps: cold load and single endpoint changes (`--ebpf-services`;
    /// only when asked for).
    EbpfMaps,
    /// The L4 data path: TCP through the userspace mode beside HAProxy, the iptables mode
    /// and no proxy (`--l4-*`; only when asked for).
    L4,
}

impl BenchMode {
    fn name(self) -> &'static str {
        match self {
            Self::Iptables => "iptables",
            Self::Nftables => "nftables",
            Self::Userspace => "userspace",
            Self::Ebpf => "ebpf",
        }
    }
}

fn main() -> ExitCode {
    let matches = Args::command().get_matches();
    let mut args = match Args::from_arg_matches(&matches) {
        Ok(args) => args,
        Err(e) => e.exit(),
    };
    args.modes_given = matches.value_source("modes") == Some(clap::parser::ValueSource::CommandLine);
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("kpr-bench: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let mut settings = Settings {
        render_runs: args.runs.into(),
        load_runs: args.load_runs.into(),
        load_timeout: Duration::from_secs(args.load_timeout),
        command: invocation(),
        date: now(),
        load_before: machine::load_average(),
        load_after: String::new(),
    };
    let machine = machine::Machine::detect();
    let mut rows = Vec::new();
    if args.modes.contains(&BenchMode::Iptables) && args.parts.contains(&Part::RenderLoad) {
        for &services in &args.services {
            let shape = Shape {
                services,
                endpoints: args.endpoints.into(),
            };
            rows.push(measure_shape(shape, args, &settings)?);
        }
    }
    let mut nft_rows = Vec::new();
    if args.modes.contains(&BenchMode::Nftables)
        && args.parts.contains(&Part::NftBackend)
        && !args.render_only
    {
        for &services in &args.nft_services {
            let plan = nftables::NftPlan {
                shape: Shape {
                    services,
                    endpoints: args.endpoints.into(),
                },
                transport: args.nft_transport,
                changes: args.changes.into(),
            };
            eprintln!(
                "[{services} services, nftables] cold sync and {} changes",
                plan.changes
            );
            let row = nftables::measure(&plan)?;
            eprintln!("[{services} services, nftables] {row:?}");
            nft_rows.push(row);
        }
    }
    let mut ebpf_rows = Vec::new();
    if args.parts.contains(&Part::EbpfMaps) && !args.render_only {
        for &services in &args.ebpf_services {
            let plan = ebpf::EbpfPlan {
                shape: Shape {
                    services,
                    endpoints: args.endpoints.into(),
                },
                changes: args.changes.into(),
            };
            eprintln!(
                "[{services} services, ebpf maps] cold load and {} changes",
                plan.changes
            );
            let row = ebpf::measure(&plan)?;
            eprintln!("[{services} services, ebpf maps] {row:?}");
            ebpf_rows.push(row);
        }
    }
    let real_binary = |part| args.parts.contains(&part) && !args.render_only;
    let e2e_rows = if real_binary(Part::E2e) {
        end_to_end(args)?
    } else {
        Vec::new()
    };
    let churn_rows = if real_binary(Part::Churn) {
        churn(args)?
    } else {
        Vec::new()
    };
    let soak_rows = if real_binary(Part::Soak) {
        soak(args)?
    } else {
        Vec::new()
    };
    let stage_rows = if real_binary(Part::Stages) {
        stage_accounting(args)?
    } else {
        Vec::new()
    };
    let l4_run = if real_binary(Part::L4) {
        Some(l4(args)?)
    } else {
        None
    };
    settings.load_after = machine::load_average();
    let measured = report::Measured {
        rows: &rows,
        nft_rows: &nft_rows,
        ebpf_rows: &ebpf_rows,
        e2e_rows: &e2e_rows,
        churn_rows: &churn_rows,
        soak_rows: &soak_rows,
        stage_rows: &stage_rows,
        l4: l4_run.as_ref(),
    };
    println!("{}", report::results(&measured));
    if let Some(path) = &args.out {
        let text = report::document(&machine, &settings, &measured);
        std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
        for plot in plots::write_beside(path, &measured)? {
            eprintln!("wrote {}", plot.display());
        }
    }
    Ok(())
}

/// The kube-proxy-rs binary the end-to-end and churn runs start.
fn proxy_binary(args: &Args) -> Result<PathBuf, String> {
    let proxy = match &args.proxy {
        Some(path) => path.clone(),
        None => std::env::current_exe()
            .map_err(|e| format!("cannot find kpr-bench's own path: {e}"))?
            .with_file_name("kube-proxy-rs"),
    };
    if !proxy.exists() {
        return Err(format!(
            "{} not found: build it (cargo build --release -p kube-proxy-rs) or pass --proxy",
            proxy.display()
        ));
    }
    Ok(proxy)
}

/// The real binary on the synthetic cluster, per size, mode and source.
fn end_to_end(args: &Args) -> Result<Vec<e2e::E2eRow>, String> {
    let proxy = proxy_binary(args)?;
    let mut rows = Vec::new();
    for &services in &args.e2e_services {
        for mode in &args.modes {
            for &source in &args.e2e_sources {
                let plan = e2e::E2ePlan {
                    proxy: &proxy,
                    shape: Shape {
                        services,
                        endpoints: args.endpoints.into(),
                    },
                    mode: mode.name(),
                    source,
                    timeout: Duration::from_secs(args.e2e_timeout),
                };
                let label = format!("[{services} services, {}, {}]", plan.mode, source.label());
                eprintln!("{label} the real binary, end to end");
                let row = e2e::measure(&plan)?;
                eprintln!("{label} {row:?}");
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

/// The product's pipeline in-process, per size and source: heap bytes per stage.
fn stage_accounting(args: &Args) -> Result<Vec<stages::StageRow>, String> {
    let mut rows = Vec::new();
    for &services in &args.stage_services {
        for &source in &args.stage_sources {
            let shape = Shape {
                services,
                endpoints: args.endpoints.into(),
            };
            eprintln!(
                "[{services} services, stages from {}] in-process pipeline",
                source.label()
            );
            rows.push(stages::measure(shape, source)?);
        }
    }
    Ok(rows)
}

/// The real binary under endpoint churn through the test API server, per size, mode and
/// min sync period.
fn churn(args: &Args) -> Result<Vec<churn::ChurnRow>, String> {
    let proxy = proxy_binary(args)?;
    let mut rows = Vec::new();
    for &services in &args.churn_services {
        for mode in &args.modes {
            for period in &args.churn_min_sync_period {
                let plan = churn::ChurnPlan {
                    binary: &proxy,
                    shape: Shape {
                        services,
                        endpoints: args.endpoints.into(),
                    },
                    mode: mode.name(),
                    rate: args.churn_rate,
                    seconds: args.churn_seconds,
                    min_sync_period: (period != "default").then_some(period.as_str()),
                    timeout: Duration::from_secs(args.e2e_timeout),
                };
                let label = format!("[{services} services, {}, min sync period {period}]", plan.mode);
                eprintln!(
                    "{label} churn: {} changes/s for {} s through the test API server",
                    plan.rate, plan.seconds
                );
                let row = churn::measure(&plan)?;
                eprintln!("{label} {row:?}");
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

/// TCP through every path of the L4 lab.
fn l4(args: &Args) -> Result<l4::L4Run, String> {
    let haproxy = l4::haproxy::program(args.haproxy.as_deref())?;
    let proxy = proxy_binary(args)?;
    let plan = l4::L4Plan {
        proxy: &proxy,
        haproxy: &haproxy,
        backends: args.l4_backends.into(),
        streams: args.l4_streams.into(),
        concurrency: args.l4_concurrency.into(),
        window: Duration::from_secs(args.l4_seconds),
        warm_up: Duration::from_millis(500),
        runs: args.l4_runs.into(),
        rounds: args.l4_rounds.into(),
        timeout: Duration::from_secs(args.e2e_timeout),
        paths: &args.l4_paths,
        turns: args.l4_turns.into(),
        turn_window: Duration::from_secs(args.l4_turn_seconds),
        placement: args.l4_client,
        service_turns: args.l4_service_turns.into(),
    };
    eprintln!(
        "[l4] {} pods; {} round(s) of {} runs of {} s per phase; 1 and {} streams, {} connections at once",
        plan.backends, plan.rounds, plan.runs, args.l4_seconds, plan.streams, plan.concurrency
    );
    l4::measure(&plan)
}

/// The real binary under long churn, per mode (nftables unless `--modes` was given).
fn soak(args: &Args) -> Result<Vec<soak::SoakRow>, String> {
    let proxy = proxy_binary(args)?;
    let modes = if args.modes_given {
        args.modes.clone()
    } else {
        vec![BenchMode::Nftables]
    };
    let cadence = soak::schedule::Cadence {
        length: Duration::from_secs(u64::from(args.soak_minutes) * 60),
        endpoint_changes: args.soak_endpoint_rate,
        service_turnovers: args.soak_service_rate,
        watch_drop_every: Duration::from_secs(args.soak_watch_drop_seconds),
        relist_every: Duration::from_secs(args.soak_relist_seconds),
        sample_every: Duration::from_secs(args.soak_sample_seconds),
    };
    let mut rows = Vec::new();
    for mode in modes {
        let plan = soak::SoakPlan {
            binary: &proxy,
            shape: Shape {
                services: args.soak_services,
                endpoints: args.endpoints.into(),
            },
            mode: mode.name(),
            cadence,
            timeout: Duration::from_secs(args.e2e_timeout),
        };
        eprintln!(
            "[{} services, {}] soak: {} min, {} endpoint changes/s, {} Service turnovers/s",
            args.soak_services,
            plan.mode,
            args.soak_minutes,
            cadence.endpoint_changes,
            cadence.service_turnovers
        );
        let row = soak::measure(&plan)?;
        eprintln!(
            "[{} services, {}] soak done: {:?}",
            args.soak_services, plan.mode, row.written
        );
        rows.push(row);
    }
    Ok(rows)
}

fn measure_shape(shape: Shape, args: &Args, settings: &Settings) -> Result<Row, String> {
    let label = format!("{} services × {} endpoints", shape.services, shape.endpoints);
    if !shape.fits() {
        return Err(format!("{label} do not fit the synthetic address ranges"));
    }
    eprintln!("[{label}] feeding the trackers");
    let (base, changed) = states(shape).map_err(|e| format!("synthetic object rejected: {e}"))?;
    let options = options::bench_options();
    eprintln!("[{label}] rendering ({} runs)", settings.render_runs);
    let (render, payload) = render::measure(&base.state, &options, settings.render_runs);
    eprintln!(
        "[{label}] render {} -> {}",
        format::duration(render.total),
        format::bytes(render.payload_bytes)
    );
    let partial_payload = payloads::partial_payload(&options, &base, &changed);
    let kernel = Kernel {
        label: &label,
        settings,
        render_only: args.render_only,
    };
    let load = |variant| {
        kernel.load(&LoadPlan {
            variant,
            options: &options,
            base: &base,
            expected_payload: &payload,
            changed: &changed,
            timeout: settings.load_timeout,
            runs: settings.load_runs,
        })
    };
    Ok(Row {
        shape,
        legacy: load(Variant::Legacy),
        nft: load(Variant::Nft),
        nft_flushed: kernel.load_flushed(&payload, partial_payload.as_deref()),
        partial_payload_bytes: partial_payload.as_ref().ok().map(String::len),
        render,
    })
}

/// The desired state of `shape`, and the one after a pod of one service was replaced.
fn states(shape: Shape) -> Result<(Snapshot, Snapshot), kpr_model::Rejection> {
    let mut cluster = SyntheticCluster::new(shape)?;
    let base = cluster.take();
    cluster.replace_one_endpoint()?;
    Ok((base, cluster.take()))
}

/// The kernel measurements of one size, skipped with `--render-only`.
struct Kernel<'a> {
    label: &'a str,
    settings: &'a Settings,
    render_only: bool,
}

impl Kernel<'_> {
    fn load(&self, plan: &LoadPlan<'_>) -> LoadResult {
        if self.render_only {
            let why = "--render-only".to_string();
            return LoadResult {
                runs: 0,
                full: Outcome::NotAvailable(why.clone()),
                partial: Outcome::NotAvailable(why),
            };
        }
        eprintln!(
            "[{}] loading with {}",
            self.label,
            load::restore_program(plan.variant)
        );
        let result = load::measure(plan);
        eprintln!("[{}] {:?}: {result:?}", self.label, plan.variant);
        result
    }

    fn load_flushed(&self, full: &str, partial: Result<&str, &String>) -> FlushedResult {
        let partial = match (partial, self.render_only) {
            (_, true) => return FlushedResult::not_measured("--render-only"),
            (Err(why), false) => return FlushedResult::not_measured(&format!("no partial payload: {why}")),
            (Ok(partial), false) => partial,
        };
        eprintln!("[{}] loading with a flushing iptables-nft-restore", self.label);
        let result = flushed::measure(&FlushedPlan {
            variant: Variant::Nft,
            full_payload: full,
            partial_payload: partial,
            timeout: self.settings.load_timeout,
            runs: self.settings.load_runs,
        });
        eprintln!("[{}] Nft, flushing: {result:?}", self.label);
        result
    }
}

/// The command line that reproduces this run.
fn invocation() -> String {
    let mut parts = vec!["cargo run --release -p kpr-bench".to_string()];
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.is_empty() {
        parts.push("--".to_string());
        parts.extend(args.into_iter().map(|a| {
            if a.contains(char::is_whitespace) {
                format!("'{a}'")
            } else {
                a
            }
        }));
    }
    parts.join(" ")
}

/// `2026-05-02 10:04 UTC`.
fn now() -> String {
    let stamp = jiff::Timestamp::now().to_string();
    match (stamp.get(..10), stamp.get(11..16)) {
        (Some(day), Some(time)) => format!("{day} {time} UTC"),
        _ => stamp,
    }
}
