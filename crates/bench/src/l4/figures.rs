//! The figures of one row, computed from what the client counted (pure, unit-tested): bulk
//! throughput in Gbit/s, new connections per second, latency quantiles, and the CPU each
//! party used per phase, in percent of one core.

use std::time::Duration;

use super::client::{Bulk, Rounds};
use crate::stats::quantile;

/// CPU time each party used during one phase, and the phase's wall-clock length.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cpu {
    pub wall: Duration,
    pub client: Duration,
    pub servers: Duration,
    /// The proxy process (kube-proxy-rs or HAProxy); `None` without one, or when it could not
    /// be read. Kernel work done in softirq context (forwarding, NAT, veth) is nobody's here.
    pub proxy: Option<Duration>,
}

/// One measured phase: what the client saw and what it cost.
#[derive(Clone, Debug)]
pub struct Phase<T> {
    pub result: T,
    pub cpu: Cpu,
    /// When the phase ran several times (this is the median run): every run's figure, in
    /// the order they ran.
    pub runs: Vec<f64>,
}

/// Everything measured on one path.
#[derive(Clone, Debug)]
pub struct Figures {
    pub one_stream: Phase<Bulk>,
    pub streams: Phase<Bulk>,
    /// Many concurrent rounds: the rate of new connections.
    pub connections: Phase<Rounds>,
    /// One round at a time: the latency of the path itself.
    pub latency: Phase<Rounds>,
    /// Connections each pod accepted during the row (bulk and rounds), pod 0 first.
    pub accepted: Vec<usize>,
}

impl Figures {
    /// One path measured in several rounds, as one: per phase, the round whose (median)
    /// figure is the median, with every round's runs beside it; the pods' counts summed.
    /// `None` for no rounds.
    pub fn pooled(rounds: Vec<Self>) -> Option<Self> {
        let accepted = rounds.iter().fold(Vec::new(), |sum: Vec<usize>, f| {
            (0..sum.len().max(f.accepted.len()))
                .map(|i| sum.get(i).copied().unwrap_or(0) + f.accepted.get(i).copied().unwrap_or(0))
                .collect()
        });
        let mut one_stream = Vec::new();
        let mut streams = Vec::new();
        let mut connections = Vec::new();
        let mut latency = Vec::new();
        for f in rounds {
            one_stream.push(f.one_stream);
            streams.push(f.streams);
            connections.push(f.connections);
            latency.push(f.latency);
        }
        Some(Self {
            one_stream: pooled_phase(one_stream, gbit_per_second)?,
            streams: pooled_phase(streams, gbit_per_second)?,
            connections: pooled_phase(connections, rounds_per_second)?,
            latency: pooled_phase(latency, p50_ms)?,
            accepted,
        })
    }
}

/// The phase whose `figure` is the median of the rounds', carrying every round's runs.
fn pooled_phase<T>(phases: Vec<Phase<T>>, figure: impl Fn(&T) -> f64) -> Option<Phase<T>> {
    let runs: Vec<f64> = phases.iter().flat_map(|p| p.runs.iter().copied()).collect();
    let mut median = median_by(phases, |p| figure(&p.result))?;
    median.runs = runs;
    Some(median)
}

/// The p50 latency in milliseconds, the figure one-at-a-time phases are ranked by; a phase
/// without a completed round ranks last.
pub fn p50_ms(rounds: &Rounds) -> f64 {
    latency_quantiles(rounds).map_or(f64::INFINITY, |q| q.0.as_secs_f64() * 1e3)
}

/// Bits per second over the window, in Gbit/s (10^9).
pub fn gbit_per_second(bulk: &Bulk) -> f64 {
    let secs = bulk.window.as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    bulk.bytes as f64 * 8.0 / secs / 1e9
}

/// Completed rounds per second of the loop's whole run.
pub fn rounds_per_second(rounds: &Rounds) -> f64 {
    let secs = rounds.elapsed.as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    rounds.latencies.len() as f64 / secs
}

/// p50 and p99 of the rounds' latencies (nearest rank); `None` without a completed round.
pub fn latency_quantiles(rounds: &Rounds) -> Option<(Duration, Duration)> {
    Some((
        quantile(&rounds.latencies, 0.5)?,
        quantile(&rounds.latencies, 0.99)?,
    ))
}

/// `used` over `wall`, in percent of one core (a party busy on both of two cores shows 200).
pub fn core_percent(used: Duration, wall: Duration) -> f64 {
    let wall = wall.as_secs_f64();
    if wall <= 0.0 {
        return 0.0;
    }
    used.as_secs_f64() / wall * 100.0
}

/// The item whose `key` is the median (the lower of the two middle ones for an even count,
/// so it is always a real run); `None` for no items.
pub fn median_by<T>(items: Vec<T>, key: impl Fn(&T) -> f64) -> Option<T> {
    let mut keyed: Vec<(f64, T)> = items.into_iter().map(|item| (key(&item), item)).collect();
    keyed.sort_by(|a, b| a.0.total_cmp(&b.0));
    let middle = keyed.len().checked_sub(1)? / 2;
    keyed.into_iter().nth(middle).map(|(_, item)| item)
}

/// Per-pod counts accepted between two readings of the servers' counters.
pub fn accepted_between(before: &[usize], after: &[usize]) -> Vec<usize> {
    after
        .iter()
        .enumerate()
        .map(|(i, a)| a.saturating_sub(before.get(i).copied().unwrap_or(0)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rounds(ms: &[u64], elapsed_ms: u64) -> Rounds {
        Rounds {
            concurrency: 1,
            latencies: ms.iter().map(|&m| Duration::from_millis(m)).collect(),
            failed: 0,
            first_error: None,
            elapsed: Duration::from_millis(elapsed_ms),
        }
    }

    #[test]
    fn throughput_is_bits_over_the_window() {
        let bulk = Bulk {
            streams: 1,
            bytes: 625_000_000,
            window: Duration::from_secs(5),
        };
        assert!((gbit_per_second(&bulk) - 1.0).abs() < 1e-12);
        let empty = Bulk {
            window: Duration::ZERO,
            ..bulk
        };
        assert_eq!(gbit_per_second(&empty), 0.0);
    }

    #[test]
    fn rate_counts_completed_rounds_only() {
        let mut r = rounds(&[1; 500], 250);
        r.failed = 100;
        assert!((rounds_per_second(&r) - 2000.0).abs() < 1e-9);
        assert_eq!(rounds_per_second(&rounds(&[], 0)), 0.0);
    }

    #[test]
    fn quantiles_are_nearest_rank_of_the_latencies() {
        let ms: Vec<u64> = (1..=200).collect();
        let (p50, p99) = latency_quantiles(&rounds(&ms, 1000)).unwrap();
        assert_eq!(p50, Duration::from_millis(100));
        assert_eq!(p99, Duration::from_millis(198));
        assert_eq!(latency_quantiles(&rounds(&[], 1000)), None);
    }

    #[test]
    fn cpu_is_percent_of_one_core() {
        assert!((core_percent(Duration::from_secs(3), Duration::from_secs(2)) - 150.0).abs() < 1e-9);
        assert_eq!(core_percent(Duration::from_secs(1), Duration::ZERO), 0.0);
    }

    #[test]
    fn median_by_keeps_a_real_item() {
        assert_eq!(median_by(vec![30, 10, 20], |&x| f64::from(x)), Some(20));
        assert_eq!(median_by(vec![40, 10, 30, 20], |&x| f64::from(x)), Some(20));
        assert_eq!(median_by(vec![7], |&x| f64::from(x)), Some(7));
        assert_eq!(median_by(Vec::<u32>::new(), |&x| f64::from(x)), None);
        // An unmeasured run (infinite) ranks last.
        assert_eq!(median_by(vec![1.0, f64::INFINITY, 2.0], |&x| x), Some(2.0));
    }

    fn phase(ms: u64, runs: &[f64]) -> Phase<Rounds> {
        Phase {
            result: rounds(&[ms], 1000),
            cpu: Cpu::default(),
            runs: runs.to_vec(),
        }
    }

    fn figures(ms: u64, runs: &[f64], accepted: &[usize]) -> Figures {
        let bulk = |bytes| Phase {
            result: Bulk {
                streams: 1,
                bytes,
                window: Duration::from_secs(1),
            },
            cpu: Cpu::default(),
            runs: vec![bytes as f64],
        };
        Figures {
            one_stream: bulk(ms * 1000),
            streams: bulk(ms * 2000),
            connections: phase(ms, runs),
            latency: phase(ms, runs),
            accepted: accepted.to_vec(),
        }
    }

    /// Each phase of the pooled row is a real round's (the median one), its runs every
    /// round's; the pods' counts add up.
    #[test]
    fn rounds_pool_into_the_median_round_with_every_run() {
        let pooled = Figures::pooled(vec![
            figures(3, &[3.0, 3.1], &[1, 2]),
            figures(1, &[1.0, 1.2], &[10, 20]),
            figures(2, &[2.0], &[100, 200, 5]),
        ])
        .unwrap();
        assert_eq!(pooled.latency.result.latencies, [Duration::from_millis(2)]);
        assert_eq!(pooled.latency.runs, [3.0, 3.1, 1.0, 1.2, 2.0]);
        assert_eq!(pooled.one_stream.result.bytes, 2000);
        assert_eq!(pooled.one_stream.runs, [3000.0, 1000.0, 2000.0]);
        assert_eq!(pooled.accepted, [111, 222, 5]);
        assert!(Figures::pooled(Vec::new()).is_none());
    }

    #[test]
    fn accepted_counts_are_differences_per_pod() {
        assert_eq!(accepted_between(&[5, 7, 0], &[15, 7, 4]), [10, 0, 4]);
        assert_eq!(accepted_between(&[], &[3, 1]), [3, 1]);
    }
}
