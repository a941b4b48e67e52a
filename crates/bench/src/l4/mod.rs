//! The L4 data path beside HAProxy (issue 10, item 6; `--parts l4`, only when asked): how
//! fast TCP goes through kube-proxy-rs's userspace mode, next to HAProxy `mode tcp` on the
//! same cores, the iptables mode (the kernel's DNAT) and no proxy at all.
//!
//! One lab for every row ([`kpr_netns::Lab`]): the outside client's namespace, the node's
//! (where the proxy or HAProxy runs), and a namespace per backend pod running a bulk server
//! and a request/response server ([`servers`]). One Service (ClusterIP + NodePort, two ports)
//! stands in front of the pods ([`cluster`]). Per path, the client ([`client`]) measures on
//! its own side: throughput of one stream and of N streams, the rate of new connections at a
//! fixed concurrency, and the latency of one connect + request at a time, each phase with
//! the CPU time the client, the servers and the proxy used ([`figures`]).
//!
//! Rows run one after the other in [`Path::RUN_ORDER`] (paths that leave the node's
//! netfilter alone first); after each kube-proxy-rs row its rules are removed with
//! `kube-proxy-rs --cleanup`. A path that cannot run (the userspace mode before it exists,
//! HAProxy refusing its configuration) is a failed row that says why; the other rows still
//! run. Nothing is pinned: on a shared machine the load average is reported beside the row.
//! Rows a minute apart cannot tell 10 % apart where the machine's speed drifts, so with
//! `--l4-turns` the userspace mode and HAProxy then also run at once and are measured in
//! turns, seconds apart ([`interleaved`]).

pub mod client;
pub mod cluster;
pub mod figures;
pub mod haproxy;
pub mod interleaved;
pub mod portal;
pub mod report;
pub mod servers;
pub mod service_turns;

use std::path::Path as FilePath;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kpr_netns::{Lab, ProcessGuard};

use crate::churn::{SEED, SplitMix64};
use crate::load::Outcome;
use crate::proxy::{Launch, RunningProxy, Source};
use crate::scratch::ScratchFile;
use client::{Bulk, Client, Rounds};
use cluster::{BULK, CLUSTER_IP, Listeners, Path, Placement, RR};
use figures::{Cpu, Figures, Phase, accepted_between, gbit_per_second, median_by, p50_ms, rounds_per_second};
use interleaved::{Contestant, Interleaved, SECOND_CLUSTER_IP, Slice};
use servers::{BLOCK, Servers};
use service_turns::{ServiceTurns, Via};

/// Seeded request bytes the rounds cycle through.
const REQUESTS: usize = 4096;
/// Between phases, so one phase's closing connections do not run into the next.
const SETTLE: Duration = Duration::from_millis(500);
/// How long a started path gets to answer its first request.
const READY: Duration = Duration::from_secs(30);

pub struct L4Plan<'a> {
    pub proxy: &'a FilePath,
    pub haproxy: &'a FilePath,
    pub backends: usize,
    /// Streams of the second bulk phase.
    pub streams: usize,
    /// Concurrent rounds of the connection-rate phase.
    pub concurrency: usize,
    /// Each phase's measured length.
    pub window: Duration,
    /// Bulk streams read before counting.
    pub warm_up: Duration,
    /// Runs of each phase; the median run is reported.
    pub runs: usize,
    /// Passes through every row; each phase's runs are pooled over them.
    pub rounds: usize,
    /// For kube-proxy-rs's first sync.
    pub timeout: Duration,
    /// The paths measured (all of them unless a run asks for fewer).
    pub paths: &'a [Path],
    /// Turns of the interleaved comparison ([`interleaved`]; 0: none).
    pub turns: usize,
    /// Each slice of a turn.
    pub turn_window: Duration,
    /// Where the client runs.
    pub placement: Placement,
    /// Turns of each kernel mode's Service address against its pods directly
    /// ([`service_turns`]; 0: none).
    pub service_turns: usize,
}

/// The whole L4 run: how it was set up, and a row per path.
#[derive(Clone, Debug)]
pub struct L4Run {
    pub backends: usize,
    pub streams: usize,
    pub concurrency: usize,
    pub window: Duration,
    pub warm_up: Duration,
    pub runs: usize,
    pub rounds: usize,
    /// HAProxy's `nbthread`, kube-proxy-rs's worker threads.
    pub threads: usize,
    pub haproxy_version: String,
    pub placement: Placement,
    pub rows: Vec<L4Row>,
    /// The proxies at once, in turns (when asked for).
    pub interleaved: Option<Outcome<Interleaved>>,
    /// Each kernel mode's Service address against its pods directly, in turns (when asked
    /// for).
    pub service_turns: Vec<Outcome<ServiceTurns>>,
}

#[derive(Clone, Debug)]
pub struct L4Row {
    pub path: Path,
    pub figures: Outcome<Figures>,
    /// 1-minute load average before and after the row.
    pub load_before: String,
    pub load_after: String,
}

impl L4Run {
    pub fn row(&self, path: Path) -> Option<&Figures> {
        self.rows
            .iter()
            .find(|r| r.path == path)
            .and_then(|r| r.figures.done())
    }
}

/// Builds the lab and measures every path.
pub fn measure(plan: &L4Plan<'_>) -> Result<L4Run, String> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let client_pod = usize::from(plan.placement == Placement::Pod);
    let lab = Lab::new(plan.backends + client_pod).map_err(|e| format!("lab: {e}"))?;
    let client_netns = match plan.placement {
        Placement::Outside => lab.client(),
        Placement::Pod => lab.pod(plan.backends),
    };
    tune(&[client_netns, lab.node()])?;
    let mut seed = SplitMix64(SEED);
    let block: Arc<[u8]> = (0..BLOCK).map(|_| seed.below(256) as u8).collect();
    let requests: Arc<[u8]> = (0..REQUESTS).map(|_| seed.below(256) as u8).collect();
    let pods: Vec<_> = (0..plan.backends)
        .map(|i| {
            let (bulk, rr) = (
                cluster::backends(BULK, plan.backends)[i],
                cluster::backends(RR, plan.backends)[i],
            );
            (lab.pod(i), bulk, rr)
        })
        .collect();
    let servers = Servers::start(&pods, Arc::clone(&block))?;
    let client = Client::start(client_netns)?;
    let manifest = ScratchFile::create("l4.json", cluster::manifest_json(plan.backends).as_bytes())?;
    let bench = Bench {
        plan,
        lab: &lab,
        servers: &servers,
        client: &client,
        block,
        requests,
        threads,
    };
    let paths: Vec<Path> = Path::RUN_ORDER
        .into_iter()
        .filter(|p| plan.paths.contains(p))
        .collect();
    let mut passes: Vec<Vec<L4Row>> = vec![Vec::new(); paths.len()];
    let rounds = plan.rounds.max(1);
    for round in 1..=rounds {
        for (path, passed) in paths.iter().zip(&mut passes) {
            eprintln!("[l4] round {round}/{rounds}: {}", path.label());
            let load_before = crate::machine::load_average();
            let figures = bench.row(*path, manifest.path())?;
            let load_after = crate::machine::load_average();
            eprintln!("[l4] {}: {}", path.label(), report::summary(&figures));
            passed.push(L4Row {
                path: *path,
                figures,
                load_before,
                load_after,
            });
        }
    }
    let mut rows: Vec<L4Row> = passes.into_iter().filter_map(pooled_row).collect();
    rows.sort_by_key(|r| Path::ALL.iter().position(|p| *p == r.path));
    let interleaved = match plan.turns {
        0 => None,
        _ => Some(bench.interleaved(manifest.path())?),
    };
    let mut service_turns = Vec::new();
    if plan.service_turns > 0 {
        for mode in [Path::Nftables, Path::Ebpf] {
            if plan.paths.contains(&mode) {
                service_turns.push(bench.service_turns(mode, manifest.path())?);
            }
        }
    }
    servers.stop();
    Ok(L4Run {
        backends: plan.backends,
        streams: plan.streams,
        concurrency: plan.concurrency,
        window: plan.window,
        warm_up: plan.warm_up,
        runs: plan.runs.max(1),
        rounds,
        threads,
        haproxy_version: haproxy::version(plan.haproxy),
        placement: plan.placement,
        rows,
        interleaved,
        service_turns,
    })
}

/// One path's rounds as one row: the load before the first and after the last; a round
/// that failed stands for the row (its reason shown), else the phases pooled.
fn pooled_row(rounds: Vec<L4Row>) -> Option<L4Row> {
    let first = rounds.first()?;
    let (path, load_before) = (first.path, first.load_before.clone());
    let load_after = rounds.last()?.load_after.clone();
    let figures = match rounds.iter().find(|r| r.figures.done().is_none()) {
        Some(failed) => failed.figures.clone(),
        None => Outcome::Done(Figures::pooled(
            rounds
                .into_iter()
                .filter_map(|r| r.figures.done().cloned())
                .collect(),
        )?),
    };
    Some(L4Row {
        path,
        figures,
        load_before,
        load_after,
    })
}

/// Many short connections from one client address, and from the node to the pods: the
/// widest ephemeral port range and reuse of ports in TIME-WAIT, so ports never run out
/// (per namespace; the root namespace is untouched).
fn tune(namespaces: &[&kpr_netns::Netns]) -> Result<(), String> {
    for netns in namespaces {
        netns
            .set_sysctl("net.ipv4.ip_local_port_range", "1024 65535")
            .and_then(|()| netns.set_sysctl("net.ipv4.tcp_tw_reuse", "1"))
            .map_err(|e| format!("tuning {}: {e}", netns.name()))?;
    }
    Ok(())
}

/// What every row shares.
struct Bench<'a> {
    plan: &'a L4Plan<'a>,
    lab: &'a Lab,
    servers: &'a Servers,
    client: &'a Client,
    block: Arc<[u8]>,
    requests: Arc<[u8]>,
    threads: usize,
}

impl Bench<'_> {
    /// One path: its proxy started, ready, measured, stopped. `Err` only when the lab itself
    /// is in doubt (a proxy's rules could not be removed).
    fn row(&self, path: Path, manifest: &FilePath) -> Result<Outcome<Figures>, String> {
        match path {
            Path::Direct => Ok(self.measured(path, None, &|| None)),
            Path::Haproxy | Path::HaproxySplice => Ok(self.haproxy_row(path)),
            Path::HaproxyPortal | Path::HaproxyBesidePortal => {
                let portal = match portal::Portal::add(self.lab.node(), CLUSTER_IP, &[BULK, RR]) {
                    Ok(portal) => portal,
                    Err(why) => return Ok(Outcome::Failed(why)),
                };
                let outcome = self.haproxy_row(path);
                portal.remove()?;
                Ok(outcome)
            }
            Path::Userspace
            | Path::UserspaceListener
            | Path::Iptables
            | Path::Nftables
            | Path::Ebpf
            | Path::DirectBesideEbpf => {
                let outcome = self.proxy_row(path, manifest);
                crate::proxy::cleanup(self.lab.node(), self.plan.proxy)?;
                Ok(outcome)
            }
        }
    }

    fn haproxy_row(&self, path: Path) -> Outcome<Figures> {
        let (_config, mut guard) = match self.start_haproxy(path == Path::HaproxySplice) {
            Ok(started) => started,
            Err(why) => return Outcome::Failed(why),
        };
        let pid = guard.pid();
        let outcome = self.measured(path, None, &|| crate::cpu::process(pid));
        if let (Outcome::Failed(why), Ok(Some(status))) = (&outcome, guard.try_wait()) {
            return Outcome::Failed(format!(
                "haproxy exited ({status}): {} / {why}",
                last_line(&guard.logs())
            ));
        }
        let _ = guard.stop();
        outcome
    }

    /// HAProxy on the node's address, for every port of the Service; its configuration file
    /// lives as long as the returned file.
    fn start_haproxy(&self, splice: bool) -> Result<(ScratchFile, ProcessGuard), String> {
        let config = haproxy::Config {
            threads: self.threads,
            splice,
            listeners: [BULK, RR]
                .into_iter()
                .map(|port| haproxy::Listener {
                    port,
                    bind: self.haproxy_bind(port),
                    servers: cluster::backends(port, self.plan.backends),
                })
                .collect(),
        };
        let file = ScratchFile::create("haproxy.cfg", haproxy::config_text(&config).as_bytes())?;
        let command = haproxy::command(self.plan.haproxy, file.path());
        let guard = self
            .lab
            .spawn(self.lab.node(), command)
            .map_err(|e| format!("starting haproxy: {e}"))?;
        Ok((file, guard))
    }

    /// Where HAProxy listens for `port`: the node's outside address, where the outside
    /// client and a portal's `REDIRECT` of its packets lead. A portal redirects to the
    /// address of the interface a packet came in on, for a pod the node's bridge address,
    /// so from a pod HAProxy listens on every address (its clients still connect to the
    /// outside one).
    fn haproxy_bind(&self, port: cluster::Port) -> std::net::SocketAddr {
        let outside = Path::Haproxy.target(port, self.plan.backends, 0, None);
        match self.plan.placement {
            Placement::Outside => outside,
            Placement::Pod => std::net::SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, outside.port())),
        }
    }

    fn proxy_row(&self, path: Path, manifest: &FilePath) -> Outcome<Figures> {
        let mode = path.proxy_mode().unwrap_or("iptables");
        let proxy = match self.start_proxy(mode, manifest) {
            Ok(proxy) => proxy,
            Err(why) => return Outcome::Failed(why),
        };
        let listeners = match path {
            Path::UserspaceListener => match self.listeners() {
                Ok(listeners) => Some(listeners),
                Err(why) => return Outcome::Failed(why),
            },
            _ => None,
        };
        if let Some(cgroup) = proxy.socket_cgroup() {
            // The client's sockets are now the ones the programs translate, as a pod's in
            // the node's cgroup; the proxy's drop takes the whole process back out.
            if let Err(why) = join_cgroup(cgroup, &self.client.threads.ids()) {
                return Outcome::Failed(why);
            }
        }
        self.measured(path, listeners, &|| proxy.cpu_time())
    }

    /// kube-proxy-rs in `mode` on the manifest, once it made its first sync.
    fn start_proxy(&self, mode: &'static str, manifest: &FilePath) -> Result<RunningProxy<'_>, String> {
        let launch = Launch {
            binary: self.plan.proxy,
            mode,
            source: Source::Manifest(manifest),
            min_sync_period: None,
        };
        let mut proxy = RunningProxy::spawn(self.lab.node(), &launch)?;
        match proxy.wait_first_sync(self.plan.timeout) {
            Outcome::Done(_) => Ok(proxy),
            Outcome::TimedOut(after) => Err(format!(
                "kube-proxy-rs: proxy mode {mode} not available: no first sync within {} s",
                after.as_secs()
            )),
            Outcome::Failed(why) | Outcome::NotAvailable(why) => {
                Err(format!("kube-proxy-rs: proxy mode {mode} not available: {why}"))
            }
        }
    }

    /// The userspace mode and HAProxy at once, in turns ([`interleaved`]). `Err` only when
    /// the lab is in doubt (rules that could not be removed).
    fn interleaved(&self, manifest: &FilePath) -> Result<Outcome<Interleaved>, String> {
        let portal = match portal::Portal::add(self.lab.node(), SECOND_CLUSTER_IP, &[RR]) {
            Ok(portal) => portal,
            Err(why) => return Ok(Outcome::Failed(why)),
        };
        let outcome = match self.turns(manifest) {
            Ok(run) => Outcome::Done(run),
            Err(why) => Outcome::Failed(why),
        };
        portal.remove()?;
        crate::proxy::cleanup(self.lab.node(), self.plan.proxy)?;
        Ok(outcome)
    }

    fn turns(&self, manifest: &FilePath) -> Result<Interleaved, String> {
        let (_config, mut haproxy) = self.start_haproxy(false)?;
        let proxy = self.start_proxy("userspace", manifest)?;
        let listener = self.listeners()?.port(RR);
        for who in Contestant::ALL {
            self.client
                .probe(interleaved::target(who, listener), READY)
                .map_err(|why| format!("{}: {why}", who.label()))?;
        }
        let haproxy_pid = haproxy.pid();
        let cpu_of = |who: Contestant| match who {
            Contestant::UserspacePortal | Contestant::UserspaceListener => proxy.cpu_time(),
            Contestant::Haproxy | Contestant::HaproxyPortal => crate::cpu::process(haproxy_pid),
        };
        let window = self.plan.turn_window;
        let rounds = |target: std::net::SocketAddr, concurrency: usize| {
            let result = self
                .client
                .rounds(move |_| target, Arc::clone(&self.requests), concurrency, window);
            std::thread::sleep(SETTLE);
            result
        };
        let mut run = Interleaved {
            concurrency: self.plan.concurrency,
            window,
            turns: Vec::with_capacity(self.plan.turns),
        };
        for turn in 0..self.plan.turns {
            let mut slices = [Slice::default(); 4];
            for who in interleaved::order(turn) {
                let target = interleaved::target(who, listener);
                let before = cpu_of(who);
                let many = rounds(target, self.plan.concurrency)?;
                let cpu = before.zip(cpu_of(who)).map(|(b, a)| a.saturating_sub(b));
                let one = rounds(target, 1)?;
                slices[who.index()] = Slice::measured(&many, &one, cpu);
            }
            eprintln!(
                "[l4] turn {}/{}: {}",
                turn + 1,
                self.plan.turns,
                interleaved::turn_summary(&slices)
            );
            run.turns.push(slices);
        }
        let _ = haproxy.stop();
        Ok(run)
    }

    /// `mode`'s Service address and the pods directly, in turns ([`service_turns`]). `Err`
    /// only when the lab is in doubt (rules that could not be removed).
    fn service_turns(&self, mode: Path, manifest: &FilePath) -> Result<Outcome<ServiceTurns>, String> {
        let outcome = match self.turns_through(mode, manifest) {
            Ok(run) => Outcome::Done(run),
            Err(why) => Outcome::Failed(why),
        };
        crate::proxy::cleanup(self.lab.node(), self.plan.proxy)?;
        Ok(outcome)
    }

    fn turns_through(&self, mode: Path, manifest: &FilePath) -> Result<ServiceTurns, String> {
        let proxy = self.start_proxy(mode.proxy_mode().unwrap_or("nftables"), manifest)?;
        if let Some(cgroup) = proxy.socket_cgroup() {
            join_cgroup(cgroup, &self.client.threads.ids())?;
        }
        let backends = self.plan.backends;
        for via in Via::ALL {
            self.client
                .probe(via.path(mode).target(RR, backends, 0, None), READY)?;
        }
        let window = self.plan.turn_window;
        let rounds = |path: Path, concurrency: usize| {
            let result = self.client.rounds(
                move |n| path.target(RR, backends, n, None),
                Arc::clone(&self.requests),
                concurrency,
                window,
            );
            std::thread::sleep(SETTLE);
            result
        };
        let mut run = ServiceTurns {
            mode,
            concurrency: self.plan.concurrency,
            window,
            turns: Vec::with_capacity(self.plan.service_turns),
        };
        for turn in 0..self.plan.service_turns {
            let mut slices = [Slice::default(); 2];
            for via in service_turns::order(turn) {
                let path = via.path(mode);
                let many = rounds(path, self.plan.concurrency)?;
                let one = rounds(path, 1)?;
                slices[via.index()] = Slice::measured(&many, &one, None);
            }
            eprintln!(
                "[l4] {} turn {}/{}: via the Service {:.0}/s, directly {:.0}/s",
                mode.label(),
                turn + 1,
                self.plan.service_turns,
                slices[Via::Service.index()].rate,
                slices[Via::Direct.index()].rate,
            );
            run.turns.push(slices);
        }
        Ok(run)
    }

    /// The userspace mode's listener ports, from the portals it wrote in the node. The whole
    /// dump: `-t nat` would create a legacy nat table where there was none.
    fn listeners(&self) -> Result<Listeners, String> {
        let node = self.lab.node();
        let out = node
            .command("iptables-save")
            .output()
            .map_err(|e| format!("iptables-save in {}: {e}", node.name()))?;
        if !out.status.success() {
            return Err(format!(
                "iptables-save in {}: {}",
                node.name(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Listeners::from_portals(&String::from_utf8_lossy(&out.stdout))
    }

    /// The four phases through `path`, once it answers.
    fn measured(
        &self,
        path: Path,
        listeners: Option<Listeners>,
        proxy_cpu: &dyn Fn() -> Option<Duration>,
    ) -> Outcome<Figures> {
        match self.phases(path, listeners, proxy_cpu) {
            Ok(figures) => Outcome::Done(figures),
            Err(why) => Outcome::Failed(why),
        }
    }

    fn phases(
        &self,
        path: Path,
        listeners: Option<Listeners>,
        proxy_cpu: &dyn Fn() -> Option<Duration>,
    ) -> Result<Figures, String> {
        let backends = self.plan.backends;
        // The request/response port answering means the path is programmed (a bulk stream
        // that does not connect fails its phase with the reason).
        self.client
            .probe(path.target(RR, backends, 0, listeners), READY)?;
        let before = self.servers.accepted();
        let bulk = |streams: usize| -> Result<Bulk, String> {
            let targets: Vec<_> = (0..streams)
                .map(|n| path.target(BULK, backends, n, listeners))
                .collect();
            self.client.bulk(
                &targets,
                Arc::clone(&self.block),
                self.plan.warm_up,
                self.plan.window,
            )
        };
        let rounds = |concurrency: usize| -> Result<Rounds, String> {
            self.client.rounds(
                move |n| path.target(RR, backends, n, listeners),
                Arc::clone(&self.requests),
                concurrency,
                self.plan.window,
            )
        };
        let gbit = |b: &Bulk| gbit_per_second(b);
        let one_stream = self.repeated(proxy_cpu, || bulk(1), gbit)?;
        let streams = self.repeated(proxy_cpu, || bulk(self.plan.streams), gbit)?;
        let connections = self.repeated(proxy_cpu, || rounds(self.plan.concurrency), rounds_per_second)?;
        // The run with the median p50; a run without a completed round ranks last.
        let latency = self.repeated(proxy_cpu, || rounds(1), p50_ms)?;
        Ok(Figures {
            one_stream,
            streams,
            connections,
            latency,
            accepted: accepted_between(&before, &self.servers.accepted()),
        })
    }

    /// Runs a phase `plan.runs` times and keeps the run whose `figure` is the median, with
    /// every run's figure beside it (how much the runs differed).
    fn repeated<T>(
        &self,
        proxy_cpu: &dyn Fn() -> Option<Duration>,
        work: impl Fn() -> Result<T, String>,
        figure: impl Fn(&T) -> f64,
    ) -> Result<Phase<T>, String> {
        let mut runs = Vec::new();
        for _ in 0..self.plan.runs.max(1) {
            runs.push(self.phase(proxy_cpu, &work)?);
        }
        let figures: Vec<f64> = runs.iter().map(|run| figure(&run.result)).collect();
        let mut median = median_by(runs, |run| figure(&run.result)).ok_or("no run")?;
        median.runs = figures;
        Ok(median)
    }

    /// Runs `work` with the CPU time of every party counted around it, then lets the
    /// connections it closed settle.
    fn phase<T>(
        &self,
        proxy_cpu: &dyn Fn() -> Option<Duration>,
        work: &impl Fn() -> Result<T, String>,
    ) -> Result<Phase<T>, String> {
        let (client, servers, proxy) = (
            self.client.threads.cpu_time(),
            self.servers.threads.cpu_time(),
            proxy_cpu(),
        );
        let started = Instant::now();
        let result = work()?;
        let cpu = Cpu {
            wall: started.elapsed(),
            client: self.client.threads.cpu_time().saturating_sub(client),
            servers: self.servers.threads.cpu_time().saturating_sub(servers),
            proxy: proxy
                .zip(proxy_cpu())
                .map(|(before, after)| after.saturating_sub(before)),
        };
        std::thread::sleep(SETTLE);
        Ok(Phase {
            result,
            cpu,
            runs: Vec::new(),
        })
    }
}

/// Moves threads `tids` of this process into the threaded cgroup at `cgroup`.
fn join_cgroup(cgroup: &FilePath, tids: &[u32]) -> Result<(), String> {
    let threads = cgroup.join("cgroup.threads");
    tids.iter().try_for_each(|tid| {
        std::fs::write(&threads, tid.to_string())
            .map_err(|e| format!("moving the client's thread {tid} to {}: {e}", threads.display()))
    })
}

fn last_line(text: &str) -> &str {
    text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("")
}
