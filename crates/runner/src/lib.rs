//! When to sync: upstream's bounded-frequency runner, as a small async loop.
//!
//! Rules are rewritten when something changed, but never more often than `min_interval`
//! (a burst of a thousand endpoint updates costs one sync, not a thousand), and at least
//! every `max_interval` (to repair anything that drifted). A failed sync is retried with
//! exponential backoff, starting at `min_interval` and capped at `max_interval`, so a
//! persistent error neither spins the CPU nor waits a full period before the first retry.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunnerConfig {
    pub min_interval: Duration,
    pub max_interval: Duration,
}

/// Asks the runner for a sync. Cheap to clone; triggers while a sync runs are not lost.
#[derive(Clone, Debug)]
pub struct Trigger(Arc<Notify>);

impl Trigger {
    pub fn fire(&self) {
        self.0.notify_one();
    }
}

#[derive(Debug)]
pub struct SyncRunner {
    config: RunnerConfig,
    wake: Arc<Notify>,
}

/// What the runner remembers between runs.
#[derive(Debug, Default)]
struct Schedule {
    last_start: Option<Instant>,
    triggered: bool,
    failures: u32,
}

impl Schedule {
    /// The earliest moment the next run may start, given what is pending.
    fn next_due(&self, config: &RunnerConfig) -> Instant {
        let Some(last) = self.last_start else {
            return Instant::now();
        };
        let earliest = last + config.min_interval;
        let mut due = last + config.max_interval;
        if self.triggered {
            due = due.min(earliest);
        }
        if self.failures > 0 {
            due = due.min(earliest.max(last + backoff(config, self.failures)));
        }
        due
    }
}

/// min_interval, doubled per consecutive failure, capped at max_interval (at least 1 s base,
/// so a zero min interval does not retry in a tight loop).
fn backoff(config: &RunnerConfig, failures: u32) -> Duration {
    let base = config.min_interval.max(Duration::from_secs(1));
    let factor = 1u32 << failures.saturating_sub(1).min(16);
    base.saturating_mul(factor).min(config.max_interval)
}

impl SyncRunner {
    pub fn new(config: RunnerConfig) -> (Self, Trigger) {
        let wake = Arc::new(Notify::new());
        (
            Self {
                config,
                wake: wake.clone(),
            },
            Trigger(wake),
        )
    }

    /// Runs `sync` forever: once at start, then as the schedule says.
    pub async fn run<F, Fut, E>(self, mut sync: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        let mut schedule = Schedule::default();
        loop {
            let due = schedule.next_due(&self.config);
            tokio::select! {
                // Biased: a trigger that is already stored must count before the run starts,
                // or it would cause a second, useless run after this one.
                biased;
                _ = self.wake.notified() => {
                    schedule.triggered = true;
                    continue;
                }
                _ = tokio::time::sleep_until(due) => {}
            }
            schedule.last_start = Some(Instant::now());
            schedule.triggered = false;
            match sync().await {
                Ok(()) => schedule.failures = 0,
                Err(error) => {
                    schedule.failures = schedule.failures.saturating_add(1);
                    tracing::warn!(
                        %error,
                        failures = schedule.failures,
                        retry_in = ?backoff(&self.config, schedule.failures),
                        "sync failed; will retry"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records the (virtual) time of every run, relative to the test's start.
    struct Recorder {
        start: Instant,
        runs: Mutex<Vec<Duration>>,
        fail_first: Mutex<u32>,
    }

    impl Recorder {
        fn new(fail_first: u32) -> Arc<Self> {
            Arc::new(Self {
                start: Instant::now(),
                runs: Mutex::new(Vec::new()),
                fail_first: Mutex::new(fail_first),
            })
        }

        fn run(&self) -> Result<(), String> {
            self.runs.lock().unwrap().push(self.start.elapsed());
            let mut fails = self.fail_first.lock().unwrap();
            if *fails > 0 {
                *fails -= 1;
                return Err("boom".into());
            }
            Ok(())
        }

        fn secs(&self) -> Vec<u64> {
            self.runs.lock().unwrap().iter().map(|d| d.as_secs()).collect()
        }
    }

    fn start(min: u64, max: u64, rec: &Arc<Recorder>) -> Trigger {
        let (runner, trigger) = SyncRunner::new(RunnerConfig {
            min_interval: Duration::from_secs(min),
            max_interval: Duration::from_secs(max),
        });
        let rec = rec.clone();
        tokio::spawn(runner.run(move || {
            let result = rec.run();
            async move { result }
        }));
        trigger
    }

    async fn advance(secs: u64) {
        for _ in 0..secs * 10 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn runs_at_start_then_every_max_interval() {
        let rec = Recorder::new(0);
        start(1, 30, &rec);
        advance(65).await;
        assert_eq!(rec.secs(), [0, 30, 60]);
    }

    #[tokio::test(start_paused = true)]
    async fn burst_of_triggers_is_one_run_after_min_interval() {
        let rec = Recorder::new(0);
        let trigger = start(2, 30, &rec);
        advance(5).await;
        for _ in 0..100 {
            trigger.fire();
        }
        advance(5).await;
        assert_eq!(rec.secs(), [0, 5]);
    }

    #[tokio::test(start_paused = true)]
    async fn triggers_closer_than_min_interval_wait_for_it() {
        let rec = Recorder::new(0);
        let trigger = start(4, 30, &rec);
        advance(1).await;
        trigger.fire();
        advance(1).await;
        trigger.fire();
        advance(10).await;
        assert_eq!(rec.secs(), [0, 4]);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_retry_with_growing_backoff_capped_at_max() {
        let rec = Recorder::new(5);
        start(1, 10, &rec);
        advance(40).await;
        // Retries after 1, 2, 4, 8, then capped at 10; then success and the normal period.
        assert_eq!(rec.secs(), [0, 1, 3, 7, 15, 25, 35]);
    }
}
