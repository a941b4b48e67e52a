//! The proxy health state behind `/healthz` and `/livez`, with upstream's semantics.
//!
//! Healthy means "rules keep up with changes": when a change is queued and no sync has
//! applied it within the timeout (2 x sync period), the proxy is unhealthy. A proxy with
//! nothing queued is healthy however long ago it last synced. Start-up counts as a queued
//! change, so a proxy that never manages its first sync turns unhealthy too. `/healthz`
//! additionally fails while the node is being deleted, so load balancers drain it.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde::Serialize;

#[derive(Debug, Default)]
struct State {
    last_updated: Option<SystemTime>,
    oldest_queued: Option<SystemTime>,
    node_going_away: bool,
    /// Why syncs are not happening, if we know: a failed sync, or a source still waiting.
    problem: Option<String>,
}

#[derive(Debug)]
pub struct ProxyHealth {
    timeout: Duration,
    state: Mutex<State>,
}

/// The answer to one health probe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthReport {
    #[serde(skip)]
    pub healthy: bool,
    pub last_updated: String,
    pub current_time: String,
    pub node_eligible: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

impl ProxyHealth {
    /// `timeout` is upstream's healthTimeout: 2 x the sync period.
    pub fn new(timeout: Duration) -> Self {
        let state = State {
            oldest_queued: Some(SystemTime::now()),
            ..State::default()
        };
        Self {
            timeout,
            state: Mutex::new(state),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock must not take health reporting down too.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A change arrived that the next sync must apply.
    pub fn queued_update(&self) {
        let mut s = self.state();
        s.oldest_queued.get_or_insert_with(SystemTime::now);
    }

    /// A sync succeeded: everything queued so far is applied.
    pub fn updated(&self) {
        let mut s = self.state();
        s.oldest_queued = None;
        s.last_updated = Some(SystemTime::now());
        s.problem = None;
    }

    /// Records why the proxy is not keeping up (shown in the probe body, not deciding health).
    pub fn set_problem(&self, problem: Option<String>) {
        self.state().problem = problem;
    }

    pub fn set_node_going_away(&self, going_away: bool) {
        self.state().node_going_away = going_away;
    }

    /// What is currently known to be wrong, whether or not it has made the proxy late.
    pub fn problem(&self) -> Option<String> {
        self.state().problem.clone()
    }

    /// Timestamp of the last successful sync, if any.
    pub fn last_updated(&self) -> Option<SystemTime> {
        self.state().last_updated
    }

    /// For `/livez`: node eligibility does not matter.
    pub fn livez(&self) -> HealthReport {
        self.report(SystemTime::now(), false)
    }

    /// For `/healthz`: also unhealthy while the node is going away.
    pub fn healthz(&self) -> HealthReport {
        self.report(SystemTime::now(), true)
    }

    fn report(&self, now: SystemTime, check_node: bool) -> HealthReport {
        let s = self.state();
        let late = s
            .oldest_queued
            .is_some_and(|queued| now.duration_since(queued).unwrap_or_default() >= self.timeout);
        let node_eligible = !s.node_going_away;
        HealthReport {
            healthy: !late && (node_eligible || !check_node),
            last_updated: s.last_updated.map(rfc3339).unwrap_or_default(),
            current_time: rfc3339(now),
            node_eligible,
            problem: if late { s.problem.clone() } else { None },
        }
    }
}

fn rfc3339(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_until_a_queued_change_is_late() {
        let h = ProxyHealth::new(Duration::from_millis(50));
        h.updated();
        assert!(h.healthz().healthy);
        h.queued_update();
        assert!(h.healthz().healthy, "not late yet");
        std::thread::sleep(Duration::from_millis(60));
        h.set_problem(Some("iptables-restore failed".into()));
        let report = h.healthz();
        assert!(!report.healthy);
        assert_eq!(report.problem.as_deref(), Some("iptables-restore failed"));
        h.updated();
        assert!(h.healthz().healthy);
    }

    #[test]
    fn idle_proxy_stays_healthy() {
        let h = ProxyHealth::new(Duration::from_millis(10));
        h.updated();
        std::thread::sleep(Duration::from_millis(20));
        assert!(h.healthz().healthy);
    }

    #[test]
    fn never_synced_turns_unhealthy() {
        let h = ProxyHealth::new(Duration::from_millis(10));
        std::thread::sleep(Duration::from_millis(20));
        assert!(!h.healthz().healthy);
        assert_eq!(h.healthz().last_updated, "");
    }

    #[test]
    fn node_going_away_fails_healthz_not_livez() {
        let h = ProxyHealth::new(Duration::from_secs(60));
        h.updated();
        h.set_node_going_away(true);
        assert!(!h.healthz().healthy);
        assert!(!h.healthz().node_eligible);
        assert!(h.livez().healthy);
    }

    #[test]
    fn body_uses_upstream_field_names() {
        let h = ProxyHealth::new(Duration::from_secs(60));
        h.updated();
        let json = serde_json::to_value(h.healthz()).unwrap();
        assert!(json["lastUpdated"].as_str().unwrap().ends_with('Z'));
        assert!(json["currentTime"].is_string());
        assert_eq!(json["nodeEligible"], true);
    }
}
