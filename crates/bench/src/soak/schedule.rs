//! When the soak does what: a pure, exact timetable merged from a few steady streams
//! (endpoint changes and Service turnover at a rate, watch drops, forced relists and samples
//! at an interval), so the run loop only sleeps and acts, and the counts a run must reach
//! are known (and tested) before any process starts.
//!
//! Due times are computed from the event's index (`k × 1 s / rate`), not by adding up
//! intervals, so a long run does not drift and a late event never shifts the ones after it.

use std::time::Duration;

/// One thing the soak does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Sample the proxy's memory and metric series.
    Sample,
    /// Replace one endpoint of one slice.
    EndpointChange,
    /// Create one extra Service (with its slice) and delete the oldest beyond the window.
    ServiceTurnover,
    /// End every open watch; the proxy resumes from its last version.
    DropWatches,
    /// Forget the server's history, then end every watch: the proxy's resumed watches get
    /// `410 Gone` and it relists everything.
    ForceRelist,
}

/// How often each action happens; a rate or interval of zero turns that stream off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cadence {
    pub length: Duration,
    /// Per second.
    pub endpoint_changes: u32,
    /// Per second.
    pub service_turnovers: u32,
    pub watch_drop_every: Duration,
    pub relist_every: Duration,
    pub sample_every: Duration,
}

/// One stream: event `k` is due at `k × numerator / denominator` nanoseconds, from `first`.
#[derive(Clone, Copy, Debug)]
struct Stream {
    action: Action,
    numerator: u128,
    denominator: u128,
    next: u128,
}

impl Stream {
    fn per_second(action: Action, rate: u32) -> Option<Self> {
        (rate > 0).then_some(Self {
            action,
            numerator: 1_000_000_000,
            denominator: rate.into(),
            next: 0,
        })
    }

    /// Every `interval`; the first at `interval` itself (at the start nothing has happened
    /// yet to drop or relist) unless `from_zero`.
    fn every(action: Action, interval: Duration, from_zero: bool) -> Option<Self> {
        (!interval.is_zero()).then_some(Self {
            action,
            numerator: interval.as_nanos(),
            denominator: 1,
            next: u128::from(!from_zero),
        })
    }

    fn due(&self) -> u128 {
        self.next * self.numerator / self.denominator
    }
}

/// The timetable: `(due since the start, action)` in time order, ties in the order of
/// [`Action`]'s streams (sampling before the changes due at the same instant), ending with
/// one last sample at the end.
pub struct Schedule {
    streams: Vec<Stream>,
    end: u128,
    final_sample: bool,
}

impl Schedule {
    pub fn new(cadence: &Cadence) -> Self {
        let streams = [
            Stream::every(Action::Sample, cadence.sample_every, true),
            Stream::per_second(Action::EndpointChange, cadence.endpoint_changes),
            Stream::per_second(Action::ServiceTurnover, cadence.service_turnovers),
            Stream::every(Action::DropWatches, cadence.watch_drop_every, false),
            Stream::every(Action::ForceRelist, cadence.relist_every, false),
        ];
        Self {
            streams: streams.into_iter().flatten().collect(),
            end: cadence.length.as_nanos(),
            final_sample: true,
        }
    }
}

impl Iterator for Schedule {
    type Item = (Duration, Action);

    fn next(&mut self) -> Option<Self::Item> {
        let earliest = self
            .streams
            .iter_mut()
            .filter(|s| s.due() < self.end)
            .min_by_key(|s| s.due());
        if let Some(stream) = earliest {
            let due = stream.due();
            stream.next += 1;
            return Some((nanos(due), stream.action));
        }
        if std::mem::take(&mut self.final_sample) {
            return Some((nanos(self.end), Action::Sample));
        }
        None
    }
}

fn nanos(n: u128) -> Duration {
    Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
}

/// Service turnover number `k` (from 0) creates extra Service `k` and, once `window` extras
/// exist, deletes extra `k - window`: the oldest. So the Service count stays between N and
/// N + `window`, every create is of a new name and every delete of a live one.
pub fn turnover(k: usize, window: usize) -> (usize, Option<usize>) {
    (k, k.checked_sub(window))
}

/// When the warm-up ends: after a fifth of the run, at most five minutes (a proxy that
/// has run through a few relists and a few thousand changes holds what it will hold).
pub fn warm_up(length: Duration) -> Duration {
    (length / 5).min(Duration::from_secs(300))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cadence(seconds: u64) -> Cadence {
        Cadence {
            length: Duration::from_secs(seconds),
            endpoint_changes: 100,
            service_turnovers: 2,
            watch_drop_every: Duration::from_secs(60),
            relist_every: Duration::from_secs(150),
            sample_every: Duration::from_secs(10),
        }
    }

    fn count(events: &[(Duration, Action)], action: Action) -> usize {
        events.iter().filter(|(_, a)| *a == action).count()
    }

    #[test]
    fn a_five_minute_run_has_exactly_the_planned_counts_in_time_order() {
        let events: Vec<_> = Schedule::new(&cadence(300)).collect();
        assert_eq!(count(&events, Action::EndpointChange), 30_000);
        assert_eq!(count(&events, Action::ServiceTurnover), 600);
        // At 60, 120, 180, 240 s; none at the very end.
        assert_eq!(count(&events, Action::DropWatches), 4);
        assert_eq!(count(&events, Action::ForceRelist), 1);
        // 0, 10, ..., 290 s, and the final one at 300 s.
        assert_eq!(count(&events, Action::Sample), 31);
        assert!(events.windows(2).all(|w| w[0].0 <= w[1].0));
        assert_eq!(events.first(), Some(&(Duration::ZERO, Action::Sample)));
        assert_eq!(events.last(), Some(&(Duration::from_secs(300), Action::Sample)));
        let relist = events.iter().find(|(_, a)| *a == Action::ForceRelist);
        assert_eq!(relist.map(|(at, _)| *at), Some(Duration::from_secs(150)));
    }

    #[test]
    fn due_times_come_from_the_index_and_do_not_drift() {
        let third = Cadence {
            endpoint_changes: 3,
            service_turnovers: 0,
            watch_drop_every: Duration::ZERO,
            relist_every: Duration::ZERO,
            sample_every: Duration::ZERO,
            length: Duration::from_secs(1800),
        };
        let changes: Vec<Duration> = Schedule::new(&third)
            .filter(|(_, a)| *a == Action::EndpointChange)
            .map(|(at, _)| at)
            .collect();
        assert_eq!(changes.len(), 5_400);
        assert_eq!(changes[1], Duration::from_nanos(333_333_333));
        assert_eq!(changes[3_000], Duration::from_secs(1_000));
        assert_eq!(changes[5_399], Duration::from_nanos(1_799_666_666_666));
    }

    #[test]
    fn streams_turned_off_do_not_happen_and_the_end_is_sampled_once() {
        let quiet = Cadence {
            endpoint_changes: 0,
            service_turnovers: 0,
            watch_drop_every: Duration::ZERO,
            relist_every: Duration::ZERO,
            sample_every: Duration::ZERO,
            length: Duration::from_secs(60),
        };
        let events: Vec<_> = Schedule::new(&quiet).collect();
        assert_eq!(events, [(Duration::from_secs(60), Action::Sample)]);
    }

    #[test]
    fn turnover_keeps_the_extra_services_within_the_window() {
        let window = 10;
        let mut alive = std::collections::BTreeSet::new();
        for k in 0..1_000 {
            let (create, delete) = turnover(k, window);
            assert!(alive.insert(create), "extra {create} created twice");
            if let Some(old) = delete {
                assert!(alive.remove(&old), "extra {old} deleted while absent");
            }
            assert!(alive.len() <= window);
        }
        assert_eq!(alive.len(), window);
        assert_eq!(alive.first(), Some(&990));
    }

    #[test]
    fn warm_up_is_a_fifth_of_the_run_at_most_five_minutes() {
        assert_eq!(warm_up(Duration::from_secs(300)), Duration::from_secs(60));
        assert_eq!(warm_up(Duration::from_secs(1_800)), Duration::from_secs(300));
        assert_eq!(warm_up(Duration::from_secs(3_600)), Duration::from_secs(300));
    }
}
