//! The proxies at once, measured in turns (`--l4-turns N`): the comparison the rows cannot
//! make on a machine whose speed drifts.
//!
//! Rows run one after the other, a minute apart, and on this machine the same binary's CPU
//! per connection drifted from 113 to 163 µs between one second and the next: rows a minute
//! apart cannot tell 10 % apart. Here the userspace mode and HAProxy run during the whole
//! measurement, side by side in the node namespace (so conntrack and the nat hooks see every
//! connection of both, as on any Kubernetes node), and the client takes them in turns: per
//! turn and contestant a connection-rate slice ([`super::L4Plan::concurrency`] at once) and
//! a one-at-a-time slice, the contestants' order rotating from turn to turn. A turn's
//! figures were measured seconds apart, so each comparison is made turn by turn (ours over
//! theirs, [`paired`]) and summarised by its median and how many turns each side won.
//!
//! Four contestants, each reached as a user would reach it: the userspace mode through its
//! portal (the cluster IP) and on its listener (the node's address, the port the portal
//! names); HAProxy on the node's address, and behind a portal of the same shape on a second
//! cluster IP ([`SECOND_CLUSTER_IP`]). What the turns measure and compare is pure and
//! unit-tested; [`super::Bench::interleaved`] runs them.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use super::client::Rounds;
use super::figures::{latency_quantiles, median_by, rounds_per_second};
use crate::format::{count, duration};
use crate::load::Outcome;

/// The cluster IP of the portal in front of HAProxy while the userspace mode's own portal
/// holds [`super::cluster::CLUSTER_IP`].
pub const SECOND_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 11);

/// Who is measured, in the order of [`Contestant::ALL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contestant {
    UserspacePortal,
    UserspaceListener,
    Haproxy,
    HaproxyPortal,
}

impl Contestant {
    pub const ALL: [Self; 4] = [
        Self::UserspacePortal,
        Self::UserspaceListener,
        Self::Haproxy,
        Self::HaproxyPortal,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::UserspacePortal => "kube-proxy-rs userspace, through its portal",
            Self::UserspaceListener => "kube-proxy-rs userspace, its listener reached directly",
            Self::Haproxy => "HAProxy mode tcp, on the node's address",
            Self::HaproxyPortal => "HAProxy mode tcp, behind a portal like the userspace mode's",
        }
    }

    /// Its place in [`Contestant::ALL`] and in a turn's slices.
    pub fn index(self) -> usize {
        Self::ALL.iter().position(|c| *c == self).unwrap_or(0)
    }
}

/// The comparisons made turn by turn: ours, theirs, and what the pair means.
pub const PAIRS: [(Contestant, Contestant, &str); 3] = [
    (
        Contestant::UserspacePortal,
        Contestant::Haproxy,
        "each as a user reaches it: the userspace mode through its portal, HAProxy on the node's address",
    ),
    (
        Contestant::UserspacePortal,
        Contestant::HaproxyPortal,
        "both through a portal",
    ),
    (
        Contestant::UserspaceListener,
        Contestant::Haproxy,
        "both on their own listener",
    ),
];

/// The order the contestants go in during turn `turn`: rotated by one each turn, so none
/// always goes first (after the idle gap) or always follows the same one.
pub fn order(turn: usize) -> [Contestant; 4] {
    let n = Contestant::ALL.len();
    std::array::from_fn(|i| Contestant::ALL[(turn + i) % n])
}

/// One contestant's figures in one turn.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Slice {
    /// Completed rounds per second, many at once.
    pub rate: f64,
    /// One at a time: connect + request + answer.
    pub p50: Option<Duration>,
    pub p99: Option<Duration>,
    /// The proxy process's CPU time per completed round of the rate slice.
    pub cpu_per_connection: Option<Duration>,
    /// Rounds that failed in either slice.
    pub failed: usize,
}

impl Slice {
    /// From the two slices' rounds and the proxy's CPU time during the rate slice.
    pub fn measured(many: &Rounds, one: &Rounds, proxy_cpu: Option<Duration>) -> Self {
        let quantiles = latency_quantiles(one);
        let completed = u32::try_from(many.latencies.len()).unwrap_or(u32::MAX);
        Self {
            rate: rounds_per_second(many),
            p50: quantiles.map(|q| q.0),
            p99: quantiles.map(|q| q.1),
            cpu_per_connection: proxy_cpu.filter(|_| completed > 0).map(|cpu| cpu / completed),
            failed: many.failed + one.failed,
        }
    }
}

/// Every turn's slices, `[turn][contestant]` in [`Contestant::ALL`]'s order.
#[derive(Clone, Debug, Default)]
pub struct Interleaved {
    pub concurrency: usize,
    /// Each slice's length.
    pub window: Duration,
    pub turns: Vec<[Slice; 4]>,
}

/// A figure of a slice, and which way is better.
#[derive(Clone, Copy, Debug)]
pub enum Figure {
    Rate,
    P50,
    P99,
    CpuPerConnection,
}

impl Figure {
    pub const ALL: [Self; 4] = [Self::Rate, Self::P50, Self::P99, Self::CpuPerConnection];

    pub fn label(self) -> &'static str {
        match self {
            Self::Rate => "new connections/s, many at once",
            Self::P50 => "connect + request latency p50, one at a time",
            Self::P99 => "connect + request latency p99, one at a time",
            Self::CpuPerConnection => "proxy CPU per connection",
        }
    }

    /// The figure as a number where larger is better for `Rate` and smaller for the rest.
    pub fn of(self, slice: &Slice) -> Option<f64> {
        match self {
            Self::Rate => (slice.rate > 0.0).then_some(slice.rate),
            Self::P50 => slice.p50.map(|d| d.as_secs_f64()),
            Self::P99 => slice.p99.map(|d| d.as_secs_f64()),
            Self::CpuPerConnection => slice.cpu_per_connection.map(|d| d.as_secs_f64()),
        }
    }

    /// How much better `ours` is than `theirs` (above 1: better; 1: equal).
    pub fn advantage(self, ours: f64, theirs: f64) -> f64 {
        match self {
            Self::Rate => ours / theirs,
            Self::P50 | Self::P99 | Self::CpuPerConnection => theirs / ours,
        }
    }
}

/// One comparison over every turn in which both sides have the figure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Paired {
    /// The median of the turns' advantages (above 1: ours is better).
    pub median: f64,
    pub lowest: f64,
    pub highest: f64,
    /// Turns in which ours was at least as good (or as the share asked for).
    pub ours_at_least: usize,
    pub turns: usize,
}

/// `ours` against `theirs` on `figure`, turn by turn; `None` when no turn has both.
pub fn paired(run: &Interleaved, ours: Contestant, theirs: Contestant, figure: Figure) -> Option<Paired> {
    paired_slices(
        run.turns
            .iter()
            .map(|turn| (&turn[ours.index()], &turn[theirs.index()])),
        figure,
        1.0,
    )
}

/// Each turn's (ours, theirs) on `figure`: the advantages' median and spread, and the turns
/// in which ours was at least `factor` as good; `None` when no turn has both.
pub fn paired_slices<'a>(
    turns: impl Iterator<Item = (&'a Slice, &'a Slice)>,
    figure: Figure,
    factor: f64,
) -> Option<Paired> {
    let advantages: Vec<f64> = turns
        .filter_map(|(ours, theirs)| {
            let ours = figure.of(ours)?;
            let theirs = figure.of(theirs)?;
            (ours > 0.0 && theirs > 0.0).then(|| figure.advantage(ours, theirs))
        })
        .collect();
    let median = median_by(advantages.clone(), |a| *a)?;
    Some(Paired {
        median,
        lowest: advantages.iter().copied().fold(f64::INFINITY, f64::min),
        highest: advantages.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        ours_at_least: advantages.iter().filter(|a| **a >= factor).count(),
        turns: advantages.len(),
    })
}

/// One contestant's figure over the turns: median, lowest, highest.
pub fn spread(run: &Interleaved, who: Contestant, figure: Figure) -> Option<(f64, f64, f64)> {
    spread_of(run.turns.iter().map(|turn| &turn[who.index()]), figure)
}

/// `figure` over some slices: median, lowest, highest.
pub fn spread_of<'a>(slices: impl Iterator<Item = &'a Slice>, figure: Figure) -> Option<(f64, f64, f64)> {
    let values: Vec<f64> = slices.filter_map(|slice| figure.of(slice)).collect();
    let median = median_by(values.clone(), |v| *v)?;
    let lowest = values.iter().copied().fold(f64::INFINITY, f64::min);
    let highest = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((median, lowest, highest))
}

/// A one-line account of a turn, for the terminal while the run goes on.
pub fn turn_summary(slices: &[Slice; 4]) -> String {
    Contestant::ALL
        .iter()
        .zip(slices)
        .map(|(who, slice)| {
            let p50 = slice.p50.map_or("none".to_string(), crate::format::duration);
            format!("{}: {:.0}/s, p50 {p50}", who.label(), slice.rate)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Where the client's round `n` to the request/response port goes for `who`; `listener` is
/// the userspace mode's listener port for that port.
pub fn target(who: Contestant, listener: u16) -> SocketAddr {
    use super::cluster::{CLUSTER_IP, RR};
    match who {
        Contestant::UserspacePortal => SocketAddr::from((CLUSTER_IP, RR.service)),
        Contestant::UserspaceListener => SocketAddr::from((kpr_netns::NODE_IP, listener)),
        Contestant::Haproxy => SocketAddr::from((kpr_netns::NODE_IP, RR.haproxy)),
        Contestant::HaproxyPortal => SocketAddr::from((SECOND_CLUSTER_IP, RR.service)),
    }
}

/// The part of BENCHMARKS.md's L4 section: every contestant's figures over the turns, then
/// the comparisons turn by turn.
pub fn section(out: &mut String, outcome: &Outcome<Interleaved>) {
    out.push_str("\n#### The proxies at once, measured in turns\n\n");
    let run = match outcome {
        Outcome::Done(run) => run,
        Outcome::Failed(why) | Outcome::NotAvailable(why) => {
            let _ = writeln!(out, "Not measured: {}", why.replace('\n', " / "));
            return;
        }
        Outcome::TimedOut(after) => {
            let _ = writeln!(out, "Not measured: timed out after {} s", after.as_secs());
            return;
        }
    };
    let _ = write!(
        out,
        "*The userspace mode and HAProxy (default configuration) running at once in the node \
         namespace, so conntrack and the nat hooks see every connection of both; {turns} turns, \
         in each a {window} s slice of {concurrency} connections at once and a {window} s slice \
         of one at a time per contestant, the order rotating each turn. HAProxy behind a portal \
         is reached on a second cluster IP ({second}) whose nat `PREROUTING` `REDIRECT` leads to \
         it. Per contestant: the median over the turns (lowest-highest). Proxy CPU: the proxy \
         process's CPU time in the rate slice over its completed rounds.*\n\n\
         | contestant | new connections/s, {concurrency} at once | p50, one at a time | p99, one at a time | proxy CPU per connection | failed rounds |\n\
         |---|---:|---:|---:|---:|---:|\n",
        turns = run.turns.len(),
        window = run.window.as_secs_f64(),
        concurrency = run.concurrency,
        second = SECOND_CLUSTER_IP,
    );
    for who in Contestant::ALL {
        let failed: usize = run.turns.iter().map(|t| t[who.index()].failed).sum();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            who.label(),
            spread_text(run, who, Figure::Rate),
            spread_text(run, who, Figure::P50),
            spread_text(run, who, Figure::P99),
            spread_text(run, who, Figure::CpuPerConnection),
            count(failed),
        );
    }
    out.push_str(
        "\nTurn by turn: ours over theirs in each turn (above 1.00: the userspace mode is better; \
         for latency and CPU, theirs over ours), the median over the turns (lowest-highest), and \
         the turns in which the userspace mode was at least as good:\n\n\
         | comparison | figure | ours over theirs | turns at least as good | at least HAProxy's (median) |\n\
         |---|---|---:|---:|---|\n",
    );
    for (ours, theirs, what) in PAIRS {
        for figure in Figure::ALL {
            let Some(p) = paired(run, ours, theirs, figure) else {
                let _ = writeln!(out, "| {what} | {} | not measured | | — |", figure.label());
                continue;
            };
            let _ = writeln!(
                out,
                "| {what} | {} | {:.2} ({:.2}-{:.2}) | {} of {} | {} |",
                figure.label(),
                p.median,
                p.lowest,
                p.highest,
                p.ours_at_least,
                p.turns,
                if p.median >= 1.0 { "yes" } else { "**no**" },
            );
        }
    }
}

fn spread_text(run: &Interleaved, who: Contestant, figure: Figure) -> String {
    figure_spread_text(spread(run, who, figure), figure)
}

/// A figure's (median, lowest, highest) as text: "none" when not measured.
pub fn figure_spread_text(spread: Option<(f64, f64, f64)>, figure: Figure) -> String {
    let Some((median, lowest, highest)) = spread else {
        return "none".to_string();
    };
    let show = |v: f64| match figure {
        Figure::Rate => format!("{}/s", count(v.round() as usize)),
        Figure::P50 | Figure::P99 | Figure::CpuPerConnection => {
            Duration::try_from_secs_f64(v).map_or_else(|_| "none".to_string(), duration)
        }
    };
    format!("{} ({}-{})", show(median), show(lowest), show(highest))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The userspace mode through its portal against HAProxy on the node's address.
    fn portal_over_haproxy(run: &Interleaved, figure: Figure) -> Paired {
        paired(run, Contestant::UserspacePortal, Contestant::Haproxy, figure).unwrap()
    }

    fn slice(rate: f64, p50_us: u64) -> Slice {
        Slice {
            rate,
            p50: Some(Duration::from_micros(p50_us)),
            p99: Some(Duration::from_micros(p50_us * 3)),
            cpu_per_connection: Some(Duration::from_micros(150)),
            failed: 0,
        }
    }

    #[test]
    fn every_contestant_goes_first_once_in_four_turns() {
        let firsts: Vec<Contestant> = (0..4).map(|turn| order(turn)[0]).collect();
        assert_eq!(firsts, Contestant::ALL);
        for turn in 0..8 {
            let order = order(turn);
            for who in Contestant::ALL {
                assert!(order.contains(&who), "{who:?} missing in turn {turn}: {order:?}");
            }
        }
    }

    /// The comparison is made within each turn: a machine that is fast in one turn and slow
    /// in the next moves both sides together and does not decide who wins.
    #[test]
    fn turns_are_compared_pairwise_not_pooled() {
        let run = Interleaved {
            concurrency: 32,
            window: Duration::from_secs(2),
            turns: vec![
                [
                    slice(6000.0, 400),
                    slice(6100.0, 400),
                    slice(5000.0, 500),
                    slice(5000.0, 500),
                ],
                [
                    slice(3000.0, 800),
                    slice(3100.0, 800),
                    slice(2500.0, 1000),
                    slice(2500.0, 1000),
                ],
                [
                    slice(4400.0, 600),
                    slice(4400.0, 600),
                    slice(4000.0, 660),
                    slice(4000.0, 660),
                ],
            ],
        };
        let rate = portal_over_haproxy(&run, Figure::Rate);
        assert_eq!((rate.ours_at_least, rate.turns), (3, 3));
        assert!((rate.median - 1.2).abs() < 1e-9, "{rate:?}");
        assert!((rate.lowest - 1.1).abs() < 1e-9 && (rate.highest - 1.2).abs() < 1e-9);
        let p50 = portal_over_haproxy(&run, Figure::P50);
        assert!(
            (p50.median - 1.25).abs() < 1e-9,
            "lower latency is the advantage: {p50:?}"
        );
        // Pooled, ours would look no better than HAProxy's best turn.
        let (median, lowest, highest) = spread(&run, Contestant::Haproxy, Figure::Rate).unwrap();
        assert_eq!((median, lowest, highest), (4000.0, 2500.0, 5000.0));
    }

    #[test]
    fn a_turn_missing_a_figure_is_left_out_of_that_comparison_only() {
        let mut failed = slice(0.0, 400);
        failed.p50 = None;
        let run = Interleaved {
            concurrency: 32,
            window: Duration::from_secs(2),
            turns: vec![
                [failed, slice(1.0, 1), slice(5000.0, 500), slice(1.0, 1)],
                [
                    slice(4000.0, 500),
                    slice(1.0, 1),
                    slice(5000.0, 500),
                    slice(1.0, 1),
                ],
            ],
        };
        let rate = portal_over_haproxy(&run, Figure::Rate);
        assert_eq!((rate.ours_at_least, rate.turns), (0, 1));
        assert!(
            paired(
                &Interleaved::default(),
                Contestant::UserspacePortal,
                Contestant::Haproxy,
                Figure::Rate
            )
            .is_none()
        );
    }

    /// The section shows every contestant and every comparison, with the verdict from the
    /// median of the turns; a run that could not be made says why instead.
    #[test]
    fn the_section_has_a_line_per_contestant_and_per_comparison() {
        let run = Interleaved {
            concurrency: 32,
            window: Duration::from_secs(2),
            turns: vec![
                [
                    slice(5500.0, 400),
                    slice(5600.0, 400),
                    slice(5000.0, 500),
                    slice(6000.0, 300),
                ],
                [
                    slice(4500.0, 400),
                    slice(4600.0, 400),
                    slice(4000.0, 500),
                    slice(5000.0, 300),
                ],
            ],
        };
        let mut out = String::new();
        section(&mut out, &Outcome::Done(run));
        for who in Contestant::ALL {
            assert!(out.contains(&format!("| {} |", who.label())), "{out}");
        }
        let line = |what: &str, figure: Figure| {
            out.lines()
                .find(|l| l.starts_with(&format!("| {what} | {} |", figure.label())))
                .unwrap_or_else(|| panic!("no line for {what} / {}: {out}", figure.label()))
                .to_string()
        };
        let (_, _, user) = PAIRS[0];
        assert!(line(user, Figure::Rate).ends_with("| 2 of 2 | yes |"), "{out}");
        let (_, _, portals) = PAIRS[1];
        assert!(
            line(portals, Figure::P50).ends_with("| 0 of 2 | **no** |"),
            "{out}"
        );
        assert!(out.contains("| kube-proxy-rs userspace, through its portal | 4,500/s (4,500/s-5,500/s) |"));
        let mut failed = String::new();
        section(&mut failed, &Outcome::Failed("haproxy: no such file".into()));
        assert!(failed.contains("Not measured: haproxy: no such file"), "{failed}");
    }

    #[test]
    fn cpu_per_connection_is_the_rate_slices_cpu_over_its_rounds() {
        let many = Rounds {
            concurrency: 32,
            latencies: vec![Duration::from_micros(300); 1000],
            elapsed: Duration::from_secs(2),
            ..Rounds::default()
        };
        let one = Rounds {
            concurrency: 1,
            latencies: vec![Duration::from_micros(400); 10],
            elapsed: Duration::from_secs(2),
            ..Rounds::default()
        };
        let s = Slice::measured(&many, &one, Some(Duration::from_millis(150)));
        assert_eq!(s.cpu_per_connection, Some(Duration::from_micros(150)));
        assert_eq!(s.rate, 500.0);
        assert_eq!(s.p50, Some(Duration::from_micros(400)));
        let none = Slice::measured(&Rounds::default(), &one, Some(Duration::from_millis(150)));
        assert_eq!(none.cpu_per_connection, None, "no round, no per-round figure");
    }
}
