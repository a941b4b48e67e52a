//! The pure part of a full sync, timed: `kpr_iptables::build` (desired state -> ruleset)
//! and rendering the ruleset as `iptables-restore` input. No kernel, no I/O, so this is
//! the cost of our own code alone.

use std::time::{Duration, Instant};

use kpr_iptables::{IptablesOptions, Ruleset, build};
use kpr_state::DesiredState;

use crate::memory::PeakProbe;
use crate::stats::median;

/// Medians over several runs, and the size of what they produced.
#[derive(Clone, Debug)]
pub struct RenderStats {
    pub runs: usize,
    /// Desired state -> ruleset.
    pub build: Duration,
    /// Ruleset -> restore text.
    pub text: Duration,
    /// Both, per run.
    pub total: Duration,
    pub payload_bytes: usize,
    /// Rules in filter and nat.
    pub rules: usize,
    /// Chains in filter and nat.
    pub chains: usize,
    /// Endpoint comments left out (upstream's large-cluster mode).
    pub large_cluster: bool,
    /// How far the process's peak RSS rose during the first run, if /proc tells.
    pub extra_memory_kib: Option<u64>,
}

/// One timed run's results.
struct Run {
    build: Duration,
    text: Duration,
    ruleset: Ruleset,
    payload: String,
}

fn run_once(state: &DesiredState, opts: &IptablesOptions) -> Run {
    let started = Instant::now();
    // NodePorts on every local address: rendering needs none of the host's addresses.
    let ruleset = build(state, opts, &[]);
    let built = Instant::now();
    let payload = ruleset.render_full().text;
    Run {
        build: built - started,
        text: built.elapsed(),
        ruleset,
        payload,
    }
}

/// Renders `state` `runs` times (at least once); returns the stats and the payload, which
/// is the same every run (rendering is a pure function).
pub fn measure(state: &DesiredState, opts: &IptablesOptions, runs: usize) -> (RenderStats, String) {
    let probe = PeakProbe::start();
    let first = run_once(state, opts);
    let extra_memory_kib = probe.and_then(PeakProbe::extra_kib);
    let mut builds = vec![first.build];
    let mut texts = vec![first.text];
    let mut totals = vec![first.build + first.text];
    for _ in 1..runs {
        // Dropped at once, so a run never pays for freeing the previous one's memory.
        let run = run_once(state, opts);
        builds.push(run.build);
        texts.push(run.text);
        totals.push(run.build + run.text);
    }
    let tables = first.ruleset.tables();
    let stats = RenderStats {
        runs: totals.len(),
        build: median(&builds).unwrap_or_default(),
        text: median(&texts).unwrap_or_default(),
        total: median(&totals).unwrap_or_default(),
        payload_bytes: first.payload.len(),
        rules: tables.iter().map(|t| t.rule_count()).sum(),
        chains: tables.iter().map(|t| t.chains().len()).sum(),
        large_cluster: first.ruleset.large_cluster,
        extra_memory_kib,
    };
    (stats, first.payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{Shape, SyntheticCluster};
    use crate::options::bench_options;

    #[test]
    fn counts_match_the_upstream_chain_layout() {
        let shape = Shape {
            services: 3,
            endpoints: 2,
        };
        let state = SyntheticCluster::new(shape).expect("valid").take().state;
        let (stats, payload) = measure(&state, &bench_options(), 3);
        assert_eq!(stats.runs, 3);
        assert_eq!(stats.payload_bytes, payload.len());
        let svc_chains = payload.lines().filter(|l| l.starts_with(":KUBE-SVC-")).count();
        let sep_chains = payload.lines().filter(|l| l.starts_with(":KUBE-SEP-")).count();
        assert_eq!((svc_chains, sep_chains), (3, 6));
        let declared = payload.lines().filter(|l| l.starts_with(':')).count();
        let appended = payload.lines().filter(|l| l.starts_with("-A ")).count();
        assert_eq!((stats.chains, stats.rules), (declared, appended));
        assert!(!stats.large_cluster);
        assert!(stats.total >= stats.build);
    }
}
