//! Network programming latency under churn, on the real binary: kube-proxy-rs watches the
//! test API server holding the synthetic cluster; once it has synced everything, endpoint
//! changes arrive at a steady rate (one EndpointSlice each: one endpoint replaced, as in a
//! rolling update), each stamped with its time in the `last-change-trigger-time`
//! annotation, as the endpoint-slice controller stamps it. The proxy's own metric
//! `kubeproxy_network_programming_duration_seconds` (trigger time to the end of the sync
//! that programmed it) is then read off `/metrics`: the latency a user of the cluster sees,
//! with the watch, the trackers, the sync runner's pacing and the kernel all in it.

use std::time::{Duration, Instant};

use crate::api_lab::ApiLab;
use crate::cluster::{Shape, churned_slice};
use crate::histogram::Histogram;
use crate::load::Outcome;
use crate::proxy::{Launch, Memory, RunningProxy, Source};

pub const LATENCY_METRIC: &str = "kubeproxy_network_programming_duration_seconds";
/// After the last change, how long the proxy gets to account for every change.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
const SETTLE_POLL: Duration = Duration::from_millis(200);
/// How often the churn loop checks that the proxy still runs (in changes).
const ALIVE_CHECK_EVERY: usize = 50;
/// Fixed, so every run changes the same slices in the same order.
pub const SEED: u64 = 0x6b70_722d_6368_7572;

pub struct ChurnPlan<'a> {
    pub binary: &'a std::path::Path,
    pub shape: Shape,
    pub mode: &'static str,
    /// Endpoint changes per second.
    pub rate: u32,
    pub seconds: u32,
    /// `--iptables-min-sync-period` given to the proxy (`None`: the mode's default).
    pub min_sync_period: Option<&'a str>,
    /// For the first sync.
    pub timeout: Duration,
}

impl ChurnPlan<'_> {
    pub fn changes(&self) -> usize {
        self.rate as usize * self.seconds as usize
    }
}

/// The latency figures of one run, from the proxy's histogram.
#[derive(Clone, Debug, PartialEq)]
pub struct Latency {
    pub p50: Duration,
    pub p99: Duration,
    /// Samples in the histogram: one per change when every change was measured.
    pub samples: u64,
    /// The histogram's cumulative buckets (`le` in seconds, count), `+Inf` last: the whole
    /// distribution, which the report's plot draws as a CDF.
    pub buckets: Vec<(f64, u64)>,
}

#[derive(Clone, Debug)]
pub struct ChurnRow {
    pub shape: Shape,
    pub mode: &'static str,
    /// As given to the proxy; `None`: the default.
    pub min_sync_period: Option<String>,
    pub rate: u32,
    pub seconds: u32,
    pub first_sync: Outcome<Duration>,
    /// Changes written to the API server, and how long writing them took.
    pub changes: usize,
    pub churn_time: Duration,
    pub latency: Outcome<Latency>,
    /// The proxy's CPU time while the changes were written (and settled): what the
    /// coalescing of changes costs, so a short min sync period cannot hide a hot loop.
    pub churn_cpu: Option<Duration>,
    /// The proxy's memory at the end.
    pub memory: Memory,
}

impl ChurnRow {
    /// The proxy's share of one core while churning, in percent.
    pub fn cpu_percent(&self) -> Option<f64> {
        let cpu = self.churn_cpu?;
        (!self.churn_time.is_zero()).then(|| 100.0 * cpu.as_secs_f64() / self.churn_time.as_secs_f64())
    }
}

/// One run: lab, proxy, first sync, churn, settle, read.
pub fn measure(plan: &ChurnPlan<'_>) -> Result<ChurnRow, String> {
    if !plan.shape.fits_with_changes(plan.changes()) {
        return Err(format!(
            "{:?} with {} changes does not fit the address ranges",
            plan.shape,
            plan.changes()
        ));
    }
    let lab = ApiLab::start("benchchurn", plan.shape, 2 * plan.changes())?;
    let mut proxy = RunningProxy::spawn(
        &lab.netns,
        &Launch {
            binary: plan.binary,
            mode: plan.mode,
            source: Source::Api {
                kubeconfig: lab.kubeconfig.path(),
            },
            min_sync_period: plan.min_sync_period,
        },
    )?;
    let mut row = ChurnRow {
        shape: plan.shape,
        mode: plan.mode,
        min_sync_period: plan.min_sync_period.map(str::to_string),
        rate: plan.rate,
        seconds: plan.seconds,
        first_sync: proxy.wait_first_sync(plan.timeout),
        changes: 0,
        churn_time: Duration::ZERO,
        latency: Outcome::NotAvailable("no first sync".to_string()),
        churn_cpu: None,
        memory: Memory::default(),
    };
    if row.first_sync.done().is_some() {
        let started = Instant::now();
        let cpu_before = proxy.cpu_time();
        match churn(&lab, &mut proxy, plan) {
            Ok(changes) => {
                row.changes = changes;
                row.churn_time = started.elapsed();
                row.churn_cpu = proxy
                    .cpu_time()
                    .zip(cpu_before)
                    .map(|(after, before)| after.saturating_sub(before));
                row.latency = settle(&proxy, changes);
            }
            Err(why) => row.latency = Outcome::Failed(why),
        }
    }
    row.memory = proxy.memory();
    Ok(row)
}

/// Writes the plan's changes at a steady pace (change `i` is due `i / rate` seconds after
/// the start; a late one is written at once, never skipped); returns how many were written.
fn churn(lab: &ApiLab, proxy: &mut RunningProxy<'_>, plan: &ChurnPlan<'_>) -> Result<usize, String> {
    let interval = Duration::from_secs(1) / plan.rate.max(1);
    let mut pick = SplitMix64(SEED);
    let start = Instant::now();
    for i in 0..plan.changes() {
        let due = start + interval * u32::try_from(i).unwrap_or(u32::MAX);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        if i % ALIVE_CHECK_EVERY == 0 {
            proxy.check_alive()?;
        }
        let index = pick.below(plan.shape.services);
        let slice = churned_slice(plan.shape, index, i + 1, &trigger_time_now());
        lab.api
            .apply(&slice)
            .map_err(|e| format!("change {} (slice of svc-{index}): {e}", i + 1))?;
    }
    Ok(plan.changes())
}

/// Waits until the histogram holds a sample per change (or the settle timeout), then reads
/// it. Fewer samples than changes is reported, not hidden: the row shows the count.
fn settle(proxy: &RunningProxy<'_>, changes: usize) -> Outcome<Latency> {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    let last = loop {
        let read = proxy.metrics().and_then(|text| {
            Histogram::parse(&text, LATENCY_METRIC, &[("ip_family", "IPv4")])
                .ok_or_else(|| format!("no {LATENCY_METRIC} series for IPv4"))
        });
        let complete = read.as_ref().is_ok_and(|h| h.count() >= changes as u64);
        if complete || Instant::now() >= deadline {
            break read;
        }
        std::thread::sleep(SETTLE_POLL);
    };
    match last {
        Ok(histogram) => summarize(&histogram),
        Err(why) => Outcome::Failed(why),
    }
}

fn summarize(histogram: &Histogram) -> Outcome<Latency> {
    match (histogram.quantile(0.5), histogram.quantile(0.99)) {
        (Some(p50), Some(p99)) => Outcome::Done(Latency {
            p50: Duration::from_secs_f64(p50),
            p99: Duration::from_secs_f64(p99),
            samples: histogram.count(),
            buckets: histogram.buckets.clone(),
        }),
        _ => Outcome::Failed("the latency histogram has no samples".to_string()),
    }
}

/// Now, as the endpoint-slice controller writes the trigger time annotation.
pub fn trigger_time_now() -> String {
    trigger_time(jiff::Timestamp::now())
}

/// Go's `time.RFC3339Nano` in UTC, as the endpoint-slice controller formats the annotation:
/// nanoseconds with trailing zeros dropped, no fraction at all on a whole second.
fn trigger_time(at: jiff::Timestamp) -> String {
    // jiff prints a Timestamp as RFC 3339 in UTC with exactly the digits needed.
    at.to_string()
}

/// A small fixed-seed generator (SplitMix64) picking which slice changes next: reproducible
/// across runs, and no dependency for it.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// In `0..n` (`0` for `n == 0`).
    pub fn below(&mut self, n: usize) -> usize {
        match n as u64 {
            0 => 0,
            n => (self.next() % n) as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64, nanos: i32) -> jiff::Timestamp {
        jiff::Timestamp::new(seconds, nanos).unwrap()
    }

    /// What Go's `t.UTC().Format(time.RFC3339Nano)` prints for the same instants.
    #[test]
    fn trigger_times_are_written_as_go_rfc3339nano() {
        assert_eq!(
            trigger_time(at(1_795_428_000, 123_456_789)),
            "2026-11-23T10:00:00.123456789Z"
        );
        assert_eq!(
            trigger_time(at(1_795_428_000, 120_000_000)),
            "2026-11-23T10:00:00.12Z"
        );
        assert_eq!(
            trigger_time(at(1_795_428_000, 1_000)),
            "2026-11-23T10:00:00.000001Z"
        );
        assert_eq!(trigger_time(at(1_795_428_000, 0)), "2026-11-23T10:00:00Z");
    }

    /// The proxy reads back exactly the instant written, to the nanosecond.
    #[test]
    fn the_proxy_reads_the_trigger_time_back_exactly() {
        let written = at(1_795_428_000, 7_654_321);
        let shape = Shape {
            services: 2,
            endpoints: 1,
        };
        let slice = churned_slice(shape, 0, 1, &trigger_time(written));
        let read = kpr_model::last_change_trigger_time(&slice).expect("parsed");
        assert_eq!(jiff::Timestamp::try_from(read).unwrap(), written);
    }

    #[test]
    fn summaries_take_the_interpolated_quantiles_and_the_count() {
        let h = Histogram {
            buckets: vec![(0.01, 40), (0.05, 98), (0.1, 100), (f64::INFINITY, 100)],
        };
        let Outcome::Done(latency) = summarize(&h) else {
            panic!("no summary");
        };
        assert_eq!(latency.samples, 100);
        assert_eq!(latency.buckets, h.buckets);
        // Rank 50: 10 of 58 into (0.01, 0.05]; rank 99: 1 of 2 into (0.05, 0.1].
        let close = |d: Duration, secs: f64| (d.as_secs_f64() - secs).abs() < 1e-9;
        assert!(close(latency.p50, 0.01 + 0.04 * 10.0 / 58.0), "{latency:?}");
        assert!(close(latency.p99, 0.075), "{latency:?}");
        let empty = Histogram {
            buckets: vec![(f64::INFINITY, 0)],
        };
        assert!(matches!(summarize(&empty), Outcome::Failed(_)));
    }

    #[test]
    fn slices_are_picked_reproducibly_and_spread() {
        let picks = |n| {
            let mut g = SplitMix64(SEED);
            (0..1000).map(|_| g.below(n)).collect::<Vec<_>>()
        };
        assert_eq!(picks(10_000), picks(10_000));
        let distinct: std::collections::BTreeSet<_> = picks(10_000).into_iter().collect();
        assert!(distinct.len() > 900, "{} distinct of 1000", distinct.len());
        assert!(picks(3).iter().all(|&i| i < 3));
        assert_eq!(SplitMix64(1).below(0), 0);
    }
}
