//! Flat under churn (issue 12, item 4): the real kube-proxy-rs watching the test API server
//! for a long stretch of steady change — endpoint changes, Services created and deleted,
//! watches dropped, and now and then a forced relist (history compacted, so the resumed
//! watches get `410 Gone`) — while its resident memory and its metric series are sampled.
//! A proxy whose trackers, caches or label sets keep something per change shows it here as
//! growth after the warm-up; one that only holds the cluster stays flat.
//!
//! Every write is a real change (a new endpoint address per change, a new name per created
//! Service, a live one per delete) and creates and deletes balance, so the cluster stays at
//! N Services (plus a small window of extras) and any growth is the proxy's, not the
//! cluster's. The timetable is [`schedule`]'s, the figures [`samples`]'.

pub mod report;
pub mod samples;
pub mod schedule;

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::api_lab::ApiLab;
use crate::churn::{SEED, SplitMix64, trigger_time_now};
use crate::cluster::{NAMESPACE, Shape, churned_slice, extra_service, extra_service_names};
use crate::load::Outcome;
use crate::proxy::{Launch, RunningProxy, Source};
use samples::{Sample, series_per_family};
use schedule::{Action, Cadence, Schedule, turnover};

/// Extra Services alive at once: each turnover creates one and, past this many, deletes the
/// oldest.
pub const TURNOVER_WINDOW: usize = 10;
/// How often the loop checks that the proxy still runs (in endpoint changes).
const ALIVE_CHECK_EVERY: usize = 100;
/// The proxy's count of the slice events it took in (IPv4 only here).
const ENDPOINT_CHANGES: &str = "kubeproxy_sync_proxy_rules_endpoint_changes_total{ip_family=\"IPv4\"}";

pub struct SoakPlan<'a> {
    pub binary: &'a Path,
    pub shape: Shape,
    pub mode: &'static str,
    pub cadence: Cadence,
    /// For the first sync.
    pub timeout: Duration,
}

impl SoakPlan<'_> {
    fn count(&self, action: Action) -> usize {
        Schedule::new(&self.cadence).filter(|(_, a)| *a == action).count()
    }
}

/// What the soak wrote, and what the server and the proxy saw of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Written {
    pub endpoint_changes: usize,
    pub services_created: usize,
    pub services_deleted: usize,
    pub watch_drops: usize,
    pub relists: usize,
    /// List requests (first pages) the server answered after the first sync: the proxy's
    /// relists (each relist lists every watched type).
    pub lists_seen: usize,
    /// Growth of the proxy's endpoint-change counter during the soak (every slice event it
    /// took in, relists included), against the slice writes.
    pub slice_events_counted: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct SoakRow {
    pub shape: Shape,
    pub mode: &'static str,
    pub cadence: Cadence,
    pub first_sync: Outcome<Duration>,
    /// Why the soak stopped early, if it did.
    pub stopped: Option<String>,
    pub written: Written,
    pub samples: Vec<Sample>,
    /// How long the soak really ran (the writes can fall behind the timetable).
    pub elapsed: Duration,
}

/// One soak: lab, proxy, first sync, the timetable, samples.
pub fn measure(plan: &SoakPlan<'_>) -> Result<SoakRow, String> {
    let changes = plan.count(Action::EndpointChange);
    let extras = plan.count(Action::ServiceTurnover);
    if !plan.shape.fits_soak(changes, extras) {
        return Err(format!(
            "{:?} with {changes} endpoint changes and {extras} new Services does not fit the address ranges",
            plan.shape
        ));
    }
    let lab = ApiLab::start("benchsoak", plan.shape, 0)?;
    eprintln!(
        "[soak] {} Services loaded into the test API server in {:.1} s",
        plan.shape.services,
        lab.load_time.as_secs_f64()
    );
    let launch = Launch {
        binary: plan.binary,
        mode: plan.mode,
        source: Source::Api {
            kubeconfig: lab.kubeconfig.path(),
        },
        min_sync_period: None,
    };
    let mut proxy = RunningProxy::spawn(&lab.netns, &launch)?;
    let mut row = SoakRow {
        shape: plan.shape,
        mode: plan.mode,
        cadence: plan.cadence,
        first_sync: proxy.wait_first_sync(plan.timeout),
        stopped: None,
        written: Written::default(),
        samples: Vec::new(),
        elapsed: Duration::ZERO,
    };
    if row.first_sync.done().is_none() {
        return Ok(row);
    }
    let mut soak = Soak::new(&lab, &mut proxy, plan.shape);
    let started = Instant::now();
    let counted_before = soak.counter(ENDPOINT_CHANGES);
    for (due, action) in Schedule::new(&plan.cadence) {
        if let Some(wait) = (started + due).checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        if let Err(why) = soak.act(action, started.elapsed()) {
            row.stopped = Some(why);
            break;
        }
    }
    row.elapsed = started.elapsed();
    let counted_after = soak.counter(ENDPOINT_CHANGES);
    row.written = soak.written;
    row.written.slice_events_counted = counted_after
        .zip(counted_before)
        .map(|(after, before)| after.saturating_sub(before));
    row.written.lists_seen = first_pages(&lab);
    row.samples = soak.samples;
    Ok(row)
}

/// The run's state between actions.
struct Soak<'a, 'p> {
    lab: &'a ApiLab,
    proxy: &'a mut RunningProxy<'p>,
    shape: Shape,
    pick: SplitMix64,
    turnovers: usize,
    written: Written,
    samples: Vec<Sample>,
}

impl<'a, 'p> Soak<'a, 'p> {
    fn new(lab: &'a ApiLab, proxy: &'a mut RunningProxy<'p>, shape: Shape) -> Self {
        // The first sync's lists are not relists.
        lab.api.clear_requests();
        Self {
            lab,
            proxy,
            shape,
            pick: SplitMix64(SEED),
            turnovers: 0,
            written: Written::default(),
            samples: Vec::new(),
        }
    }

    fn act(&mut self, action: Action, at: Duration) -> Result<(), String> {
        match action {
            Action::Sample => self.sample(at),
            Action::EndpointChange => self.change_endpoint(),
            Action::ServiceTurnover => self.turn_over(),
            Action::DropWatches => {
                self.lab.api.drop_watches();
                self.written.watch_drops += 1;
                Ok(())
            }
            Action::ForceRelist => {
                // Compacting alone leaves open watches running; ending them makes the
                // proxy resume from a version the server no longer has.
                self.lab.api.compact();
                self.lab.api.drop_watches();
                self.written.relists += 1;
                Ok(())
            }
        }
    }

    fn sample(&mut self, at: Duration) -> Result<(), String> {
        self.proxy.check_alive()?;
        let series = self.proxy.metrics().ok().map(|text| series_per_family(&text));
        let sample = Sample {
            at,
            memory: self.proxy.memory(),
            series,
            endpoint_changes: self.written.endpoint_changes,
            services: self.shape.services + self.written.services_created - self.written.services_deleted,
        };
        eprintln!(
            "[soak] {:>5} s: RSS {} KiB, {} endpoint changes, {} Services",
            at.as_secs(),
            sample.memory.rss_kib.unwrap_or(0),
            sample.endpoint_changes,
            sample.services
        );
        self.samples.push(sample);
        Ok(())
    }

    /// One endpoint of a random slice of the shape's Services moves to a fresh address.
    fn change_endpoint(&mut self) -> Result<(), String> {
        let n = self.written.endpoint_changes;
        if n.is_multiple_of(ALIVE_CHECK_EVERY) {
            self.proxy.check_alive()?;
        }
        let index = self.pick.below(self.shape.services);
        let slice = churned_slice(self.shape, index, n + 1, &trigger_time_now());
        self.lab
            .api
            .apply(&slice)
            .map_err(|e| format!("endpoint change {} (slice of svc-{index}): {e}", n + 1))?;
        self.written.endpoint_changes += 1;
        Ok(())
    }

    /// A new Service with its slice, and the oldest extra beyond the window deleted.
    fn turn_over(&mut self) -> Result<(), String> {
        let (create, delete) = turnover(self.turnovers, TURNOVER_WINDOW);
        let (service, slice) = extra_service(self.shape, create);
        let api = &self.lab.api;
        let failed = |e: kpr_apiserver::ApiError| format!("turnover {}: {e}", self.turnovers + 1);
        api.create(&service).map_err(failed)?;
        api.create(&slice).map_err(failed)?;
        self.written.services_created += 1;
        if let Some(old) = delete {
            let (service, slice) = extra_service_names(self.shape, old);
            api.delete::<EndpointSlice>(NAMESPACE, &slice).map_err(failed)?;
            api.delete::<Service>(NAMESPACE, &service).map_err(failed)?;
            self.written.services_deleted += 1;
        }
        self.turnovers += 1;
        Ok(())
    }

    /// A counter's value off `/metrics` (`series` with its labels, as exposed).
    fn counter(&self, series: &str) -> Option<u64> {
        let text = self.proxy.metrics().ok()?;
        text.lines().find_map(|line| {
            let value = line.strip_prefix(series)?.trim();
            value.parse::<f64>().ok().map(|v| v as u64)
        })
    }
}

/// List requests the server answered since the first sync, first pages only (a list of
/// 10k Services comes in pages; a relist is one first page per watched type).
fn first_pages(lab: &ApiLab) -> usize {
    lab.api
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.param("watch").is_none() && r.param("continue").is_none())
        .count()
}
