//! A mode's Service address against the same pods reached directly, the mode running, in
//! turns (`--l4-service-turns N`): what reaching a pod through the Service costs, apart from
//! what the mode's rules cost every connection of the node.
//!
//! The rows compare ebpf mode with a node that has no rules at all, a minute apart; on this
//! shared machine such rows drift by 20 % and more. Here one mode runs for the whole
//! measurement (ebpf mode: the client's threads in its cgroup) and the client alternates, a
//! few seconds apart, between the cluster IP and the pods' own addresses: per turn a
//! connection-rate slice and a one-at-a-time slice each way, the order swapped every turn.
//! Each figure is compared turn by turn ([`super::interleaved::paired_slices`]).

use std::fmt::Write as _;
use std::time::Duration;

use super::cluster::Path;
use super::interleaved::{Figure, Slice, figure_spread_text, paired_slices, spread_of};
use crate::load::Outcome;

/// The share of the direct path's figure the Service address must reach (issue 23).
pub const TARGET: f64 = 0.95;

/// Which way a slice went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// The cluster IP.
    Service,
    /// The pods' own addresses, in turn.
    Direct,
}

impl Via {
    pub const ALL: [Self; 2] = [Self::Service, Self::Direct];

    pub fn index(self) -> usize {
        match self {
            Self::Service => 0,
            Self::Direct => 1,
        }
    }

    /// The path whose target this way is, for `mode`'s row.
    pub fn path(self, mode: Path) -> Path {
        match self {
            Self::Service => mode,
            Self::Direct => Path::Direct,
        }
    }
}

/// Swapped every turn, so neither way always goes first.
pub fn order(turn: usize) -> [Via; 2] {
    if turn.is_multiple_of(2) {
        Via::ALL
    } else {
        [Via::Direct, Via::Service]
    }
}

/// One mode's turns: `[turn][via]` in [`Via::ALL`]'s order.
#[derive(Clone, Debug)]
pub struct ServiceTurns {
    pub mode: Path,
    pub concurrency: usize,
    pub window: Duration,
    pub turns: Vec<[Slice; 2]>,
}

/// The figures compared (the proxy's CPU is nobody's here: the kernel does the work).
const FIGURES: [Figure; 3] = [Figure::Rate, Figure::P50, Figure::P99];

/// The part of the pod section of BENCHMARKS.md (nothing when no turns were asked for).
pub fn section(out: &mut String, runs: &[Outcome<ServiceTurns>]) {
    let Some(first) = runs.iter().find_map(Outcome::done) else {
        for run in runs {
            let _ = writeln!(out, "\nService turns not measured: {}", why(run));
        }
        return;
    };
    let _ = write!(
        out,
        "\n#### The Service address against its pods reached directly, the mode running, in turns\n\n\
         *One mode running for the whole measurement (ebpf mode: the client's threads in its \
         cgroup); {turns} turns, in each a {window} s slice of {concurrency} connections at once \
         and a {window} s slice of one at a time to the cluster IP and to the pods' own \
         addresses, the order swapped each turn. Service over direct per turn (for latency: \
         direct over Service; above 1.00 the Service address is faster), the median over the \
         turns (lowest-highest), the turns at {target:.2} or better.*\n\n\
         | mode | figure | via the cluster IP | pods directly | Service over direct | turns at {target:.2} or better | at least {target:.2}x (median) |\n\
         |---|---|---:|---:|---:|---:|---|\n",
        turns = first.turns.len(),
        window = first.window.as_secs_f64(),
        concurrency = first.concurrency,
        target = TARGET,
    );
    for run in runs {
        let Outcome::Done(run) = run else {
            let _ = writeln!(out, "| — | not measured: {} | | | | | |", why(run));
            continue;
        };
        for figure in FIGURES {
            let way = |via: Via| {
                figure_spread_text(
                    spread_of(run.turns.iter().map(|t| &t[via.index()]), figure),
                    figure,
                )
            };
            let paired = paired_slices(
                run.turns
                    .iter()
                    .map(|t| (&t[Via::Service.index()], &t[Via::Direct.index()])),
                figure,
                TARGET,
            );
            let (ratio, turns, met) = paired.map_or_else(
                || ("not measured".to_string(), String::new(), "—"),
                |p| {
                    (
                        format!("{:.2} ({:.2}-{:.2})", p.median, p.lowest, p.highest),
                        format!("{} of {}", p.ours_at_least, p.turns),
                        if p.median >= TARGET { "yes" } else { "**no**" },
                    )
                },
            );
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {ratio} | {turns} | {met} |",
                run.mode.label(),
                figure.label(),
                way(Via::Service),
                way(Via::Direct),
            );
        }
    }
}

fn why(run: &Outcome<ServiceTurns>) -> String {
    match run {
        Outcome::Done(_) => String::new(),
        Outcome::Failed(why) | Outcome::NotAvailable(why) => why.replace('\n', " / "),
        Outcome::TimedOut(after) => format!("timed out after {} s", after.as_secs()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(rate: f64, p50_us: u64) -> Slice {
        Slice {
            rate,
            p50: Some(Duration::from_micros(p50_us)),
            p99: Some(Duration::from_micros(p50_us * 3)),
            cpu_per_connection: None,
            failed: 0,
        }
    }

    #[test]
    fn the_order_swaps_each_turn() {
        assert_eq!(order(0), [Via::Service, Via::Direct]);
        assert_eq!(order(1), [Via::Direct, Via::Service]);
        assert_eq!(Via::Service.path(Path::Ebpf), Path::Ebpf);
        assert_eq!(Via::Direct.path(Path::Ebpf), Path::Direct);
    }

    /// Turn by turn: a turn at 0.96 counts toward the target, one at 0.90 does not; the
    /// verdict is the median's.
    #[test]
    fn each_figure_is_compared_turn_by_turn_against_095() {
        let run = ServiceTurns {
            mode: Path::Ebpf,
            concurrency: 32,
            window: Duration::from_secs(2),
            turns: vec![
                [slice(9_600.0, 150), slice(10_000.0, 150)],
                [slice(9_000.0, 160), slice(10_000.0, 150)],
                [slice(10_100.0, 140), slice(10_000.0, 150)],
            ],
        };
        let mut text = String::new();
        section(&mut text, &[Outcome::Done(run)]);
        assert!(
            text.contains("| (e) kube-proxy-rs ebpf | new connections/s, many at once | 9,600/s (9,000/s-10,100/s) | 10,000/s (10,000/s-10,000/s) | 0.96 (0.90-1.01) | 2 of 3 | yes |"),
            "{text}"
        );
        assert!(
            text.contains("| (e) kube-proxy-rs ebpf | connect + request latency p50, one at a time | 0.15 ms (0.14 ms-0.16 ms) | 0.15 ms (0.15 ms-0.15 ms) | 1.00 (0.94-1.07) | 2 of 3 | yes |"),
            "{text}"
        );
    }

    #[test]
    fn a_mode_that_could_not_run_says_why() {
        let mut text = String::new();
        section(&mut text, &[Outcome::Failed("no cgroup v2".into())]);
        assert_eq!(text, "\nService turns not measured: no cgroup v2\n");
    }
}
