//! The proxy health state behind `/healthz` and `/livez`, with upstream's semantics.
//!
//! Healthy means "rules keep up with changes": when a change is queued and no sync has
//! applied it within the timeout (2 x sync period), the proxy is unhealthy. A proxy with
//! nothing queued is healthy however long ago it last synced. Start-up is healthy too, as
//! upstream's: the sync loop marks itself updated when it starts, and nothing is queued until
//! the sources have delivered their initial state and something changes after that; a proxy
//! that has not started its sync loop yet has nothing that could be late. `/healthz`
//! additionally fails while the node is not eligible (being deleted, or tainted by the
//! cluster autoscaler), so load balancers drain it; `/livez` ignores the node, since kubelet
//! restarting the pod would help no one.
//!
//! As upstream's maps, this is kept per IP family: a dual-stack proxy runs one proxier per
//! family, each marks itself updated and queues changes on its own, and the proxy is healthy
//! only while every family keeps up (a family whose loop never started is not judged).
//!
//! The bodies are upstream's, byte for byte apart from the times
//! (`{"lastUpdated": "...","currentTime": "...", "nodeEligible": true}`), with Go's time
//! format (see [`go_time`]). One addition: an unhealthy answer also says why syncs are late
//! (`"problem"`), when we know (the late family's failed sync, else a source in trouble);
//! healthy answers never carry it.

mod go_time;

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use kpr_model::IpFamily;

use go_time::{Stamp, ZERO_TIME};

/// Upstream's per-family entries (`lastUpdatedMap`, `oldestPendingQueuedMap`) for one
/// proxier, plus why its last sync failed.
#[derive(Debug, Default)]
struct ProxierState {
    /// The sync loop's start, then every successful sync. `None` until the loop starts.
    last_updated: Option<Stamp>,
    /// The first change not yet applied.
    oldest_queued: Option<Stamp>,
    /// Why the last sync failed, until one succeeds.
    sync_problem: Option<String>,
}

#[derive(Debug)]
struct State {
    /// One entry per IP family that has reported anything; a dual-stack proxy has two.
    proxiers: BTreeMap<IpFamily, ProxierState>,
    /// Eligible while starting, until a Node says otherwise (upstream's initial value).
    node_eligible: bool,
    /// Why changes cannot arrive or be applied, if we know, beyond a failed sync: a source
    /// in trouble, sources not in yet. Set and withdrawn by whoever knows.
    problem: Option<String>,
}

impl State {
    fn proxier(&mut self, family: IpFamily) -> &mut ProxierState {
        self.proxiers.entry(family).or_default()
    }

    /// The first proxier (IPv4 before IPv6) with a change queued for `timeout` or longer,
    /// among those that have marked themselves updated (upstream judges only those).
    fn late(&self, now: Stamp, timeout: Duration) -> Option<(IpFamily, &ProxierState)> {
        self.proxiers
            .iter()
            .filter(|(_, p)| p.last_updated.is_some())
            .find(|(_, p)| p.oldest_queued.is_some_and(|queued| now.since(queued) >= timeout))
            .map(|(family, p)| (*family, p))
    }

    /// The most recent update of any proxier.
    fn last_updated(&self) -> Option<Stamp> {
        self.proxiers
            .values()
            .filter_map(|p| p.last_updated)
            .reduce(|a, b| if b.since(a).is_zero() { a } else { b })
    }
}

#[derive(Debug)]
pub struct ProxyHealth {
    timeout: Duration,
    state: Mutex<State>,
}

/// The answer to one health probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthReport {
    pub healthy: bool,
    /// Go's `time.Time` text: the current time when healthy (upstream's compatibility rule),
    /// else the last update.
    pub last_updated: String,
    pub current_time: String,
    /// Only `/healthz` reports it.
    pub node_eligible: Option<bool>,
    /// Why syncs are late; only in an answer that is unhealthy because they are.
    pub problem: Option<String>,
}

impl HealthReport {
    /// 200 or 503, as upstream answers.
    pub fn status_code(&self) -> u16 {
        if self.healthy { 200 } else { 503 }
    }

    /// The JSON body exactly as upstream writes it (its spacing included), plus `problem`.
    pub fn body(&self) -> String {
        let mut body = format!(
            "{{\"lastUpdated\": {},\"currentTime\": {}",
            json_string(&self.last_updated),
            json_string(&self.current_time)
        );
        if let Some(eligible) = self.node_eligible {
            body.push_str(&format!(", \"nodeEligible\": {eligible}"));
        }
        if let Some(problem) = &self.problem {
            body.push_str(&format!(", \"problem\": {}", json_string(problem)));
        }
        body.push('}');
        body
    }
}

fn json_string(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

impl ProxyHealth {
    /// `timeout` is upstream's healthTimeout: 2 x the sync period.
    pub fn new(timeout: Duration) -> Self {
        // Starts Go's monotonic clock, which counts from the process start.
        let _ = Stamp::now();
        Self {
            timeout,
            state: Mutex::new(State {
                proxiers: BTreeMap::new(),
                node_eligible: true,
                problem: None,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock must not take health reporting down too.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Upstream's `QueuedUpdate(family)`: a change arrived that the next sync of `family`'s
    /// proxier must apply.
    pub fn proxier_queued_update(&self, family: IpFamily) {
        let mut s = self.state();
        s.proxier(family).oldest_queued.get_or_insert_with(Stamp::now);
    }

    /// Upstream's `Updated(family)`: everything queued for `family` so far is applied (a
    /// sync succeeded, or the sync loop starts, "in case Sync() never succeeds").
    pub fn proxier_updated(&self, family: IpFamily) {
        let mut s = self.state();
        let proxier = s.proxier(family);
        proxier.oldest_queued = None;
        proxier.last_updated = Some(Stamp::now());
        proxier.sync_problem = None;
    }

    /// `family`'s last sync failed, and why: shown (instead of [`Self::problem`]) when that
    /// proxier is the late one; the next successful sync of `family` withdraws it.
    pub fn proxier_sync_failed(&self, family: IpFamily, problem: String) {
        self.state().proxier(family).sync_problem = Some(problem);
    }

    /// [`Self::proxier_queued_update`] for a single-stack IPv4 proxy.
    pub fn queued_update(&self) {
        self.proxier_queued_update(IpFamily::V4);
    }

    /// [`Self::proxier_updated`] for a single-stack IPv4 proxy.
    pub fn updated(&self) {
        self.proxier_updated(IpFamily::V4);
    }

    /// Records why the proxy cannot keep up beyond a failed sync (a source in trouble, sources
    /// not in yet); shown in unhealthy bodies, not deciding health.
    pub fn set_problem(&self, problem: Option<String>) {
        self.state().problem = problem;
    }

    /// Replaces the problem text with `to` only while it is still `from`, atomically: whoever
    /// set a text can withdraw it without erasing one set by someone else since (a source
    /// that recovers must not clear another source's text). Returns whether it replaced.
    pub fn replace_problem(&self, from: &str, to: Option<String>) -> bool {
        let mut s = self.state();
        if s.problem.as_deref() != Some(from) {
            return false;
        }
        s.problem = to;
        true
    }

    /// Upstream's `SyncNode`: eligible unless the Node is being deleted or tainted
    /// `ToBeDeletedByClusterAutoscaler`.
    pub fn set_node_eligible(&self, eligible: bool) {
        self.state().node_eligible = eligible;
    }

    pub fn node_eligible(&self) -> bool {
        self.state().node_eligible
    }

    /// What is currently known to be wrong besides failed syncs ([`Self::set_problem`]),
    /// whether or not it has made the proxy late.
    pub fn problem(&self) -> Option<String> {
        self.state().problem.clone()
    }

    /// Why `family`'s last sync failed, until one succeeds.
    pub fn proxier_sync_problem(&self, family: IpFamily) -> Option<String> {
        self.state().proxiers.get(&family)?.sync_problem.clone()
    }

    /// When any proxier's sync loop started or last synced successfully, if one has started.
    pub fn last_updated(&self) -> Option<SystemTime> {
        self.state().last_updated().map(Stamp::wall)
    }

    /// When `family`'s sync loop started or last synced successfully, if it has started.
    pub fn proxier_last_updated(&self, family: IpFamily) -> Option<SystemTime> {
        self.state().proxiers.get(&family)?.last_updated.map(Stamp::wall)
    }

    /// For `/livez`: node eligibility does not matter.
    pub fn livez(&self) -> HealthReport {
        self.report(Stamp::now(), false)
    }

    /// For `/healthz`: also unhealthy while the node is not eligible.
    pub fn healthz(&self) -> HealthReport {
        self.report(Stamp::now(), true)
    }

    /// Upstream's rule over its per-family maps: unhealthy as soon as one proxier is late,
    /// reporting that proxier's last update; healthy ones report the current time.
    fn report(&self, now: Stamp, check_node: bool) -> HealthReport {
        let s = self.state();
        let late = s.late(now, self.timeout);
        let healthy = late.is_none() && (s.node_eligible || !check_node);
        let current_time = now.go_string();
        let last_updated = match (&late, s.last_updated()) {
            // A healthy answer says "recent", as upstream keeps for older clients.
            _ if healthy => current_time.clone(),
            (Some((_, proxier)), _) => proxier
                .last_updated
                .map_or(ZERO_TIME.to_string(), Stamp::go_string),
            (None, Some(stamp)) => stamp.go_string(),
            (None, None) => ZERO_TIME.to_string(),
        };
        let problem = late.map(|(family, proxier)| match &proxier.sync_problem {
            Some(sync) => format!("{}: {sync}", family.label()),
            None => s.problem.clone().unwrap_or_default(),
        });
        HealthReport {
            healthy,
            last_updated,
            current_time,
            node_eligible: check_node.then_some(s.node_eligible),
            problem: problem.filter(|text| !text.is_empty()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(60);

    /// The health state and a moment well past its timeout.
    fn after_timeout(h: &ProxyHealth) -> Stamp {
        Stamp::now().later(h.timeout + Duration::from_secs(1))
    }

    #[test]
    fn healthy_while_starting_even_when_nothing_ever_syncs() {
        let h = ProxyHealth::new(TIMEOUT);
        let later = after_timeout(&h);
        assert!(h.report(later, true).healthy, "before the sync loop starts");
        h.updated(); // the sync loop starts
        assert!(h.report(after_timeout(&h), true).healthy, "nothing queued");
    }

    #[test]
    fn a_queued_change_not_applied_within_the_timeout_is_late() {
        let h = ProxyHealth::new(TIMEOUT);
        h.updated();
        h.queued_update();
        assert!(h.healthz().healthy, "not late yet");
        h.proxier_sync_failed(IpFamily::V4, "iptables-restore failed".into());
        let late = h.report(after_timeout(&h), true);
        assert!(!late.healthy);
        assert_eq!(late.problem.as_deref(), Some("IPv4: iptables-restore failed"));
        assert!(!h.report(after_timeout(&h), false).healthy, "livez too");
        h.updated();
        assert!(h.report(after_timeout(&h), true).healthy);
        assert_eq!(
            h.proxier_sync_problem(IpFamily::V4),
            None,
            "a good sync clears its failure"
        );
    }

    /// A late proxier whose syncs did not fail shows what else is known (a source in trouble).
    #[test]
    fn a_late_proxier_without_a_failed_sync_shows_the_other_problem() {
        let h = ProxyHealth::new(TIMEOUT);
        h.updated();
        h.queued_update();
        h.set_problem(Some("source api: connection refused".into()));
        let late = h.report(after_timeout(&h), true);
        assert_eq!(late.problem.as_deref(), Some("source api: connection refused"));
        h.updated();
        assert_eq!(
            h.problem().as_deref(),
            Some("source api: connection refused"),
            "a sync does not withdraw a source's text; the source does"
        );
    }

    #[test]
    fn only_the_oldest_queued_change_counts() {
        let h = ProxyHealth::new(TIMEOUT);
        h.updated();
        h.queued_update();
        let first = h.state().proxiers[&IpFamily::V4].oldest_queued;
        h.queued_update();
        assert_eq!(h.state().proxiers[&IpFamily::V4].oldest_queued, first);
    }

    /// Upstream's maps: healthy only while every family keeps up, and a late family's last
    /// update is the one reported; the other family syncing does not hide it.
    #[test]
    fn every_family_must_keep_up() {
        let h = ProxyHealth::new(TIMEOUT);
        h.proxier_updated(IpFamily::V4);
        h.proxier_updated(IpFamily::V6);
        let v6_synced = h.state().proxiers[&IpFamily::V6].last_updated.unwrap();
        h.proxier_queued_update(IpFamily::V4);
        h.proxier_queued_update(IpFamily::V6);
        h.proxier_sync_failed(IpFamily::V6, "ip6tables-restore: exit 2".into());
        h.proxier_updated(IpFamily::V4);
        let report = h.report(after_timeout(&h), true);
        assert!(!report.healthy, "IPv6 is late although IPv4 keeps up");
        assert_eq!(report.last_updated, v6_synced.go_string());
        assert_eq!(report.problem.as_deref(), Some("IPv6: ip6tables-restore: exit 2"));
        assert!(!h.report(after_timeout(&h), false).healthy, "livez too");

        h.proxier_updated(IpFamily::V6);
        assert!(h.report(after_timeout(&h), true).healthy);
        assert!(h.proxier_last_updated(IpFamily::V6).is_some());
    }

    /// A family whose sync loop has not started is not judged (upstream iterates over the
    /// families in `lastUpdatedMap` only).
    #[test]
    fn a_family_that_never_started_is_not_judged() {
        let h = ProxyHealth::new(TIMEOUT);
        h.proxier_updated(IpFamily::V4);
        h.proxier_queued_update(IpFamily::V6);
        assert!(h.report(after_timeout(&h), true).healthy);
        assert_eq!(h.proxier_last_updated(IpFamily::V6), None);
    }

    #[test]
    fn a_queued_change_before_the_sync_loop_starts_is_not_judged() {
        let h = ProxyHealth::new(TIMEOUT);
        h.queued_update();
        assert!(h.report(after_timeout(&h), true).healthy);
    }

    #[test]
    fn ineligible_node_fails_healthz_not_livez() {
        let h = ProxyHealth::new(TIMEOUT);
        h.updated();
        assert!(h.node_eligible(), "eligible while starting");
        h.set_node_eligible(false);
        let healthz = h.healthz();
        assert!(!healthz.healthy);
        assert_eq!(healthz.node_eligible, Some(false));
        assert_eq!(healthz.problem, None, "syncs are not late");
        let livez = h.livez();
        assert!(livez.healthy);
        assert_eq!(livez.node_eligible, None);
    }

    #[test]
    fn healthy_bodies_are_upstreams_with_last_updated_equal_to_current_time() {
        let h = ProxyHealth::new(TIMEOUT);
        h.updated();
        let healthz = h.healthz();
        assert_eq!(healthz.last_updated, healthz.current_time);
        let t = &healthz.current_time;
        assert_eq!(
            healthz.body(),
            format!("{{\"lastUpdated\": \"{t}\",\"currentTime\": \"{t}\", \"nodeEligible\": true}}")
        );
        let livez = h.livez();
        let t = &livez.current_time;
        assert_eq!(
            livez.body(),
            format!("{{\"lastUpdated\": \"{t}\",\"currentTime\": \"{t}\"}}")
        );
        // Go's time.Time String(): date, time, offset, zone, monotonic reading.
        let fields: Vec<&str> = t.split(' ').collect();
        assert_eq!(fields.len(), 5, "{t}");
        assert!(fields[4].starts_with("m=+"), "{t}");
    }

    #[test]
    fn unhealthy_body_keeps_the_last_update_and_says_why() {
        let h = ProxyHealth::new(TIMEOUT);
        h.updated();
        let synced = h.state().last_updated().unwrap();
        h.queued_update();
        h.proxier_sync_failed(IpFamily::V4, "restore said \"no\"".into());
        let now = after_timeout(&h);
        let report = h.report(now, true);
        assert_eq!(report.last_updated, synced.go_string());
        assert_ne!(report.last_updated, report.current_time);
        let body: serde_json::Value = serde_json::from_str(&report.body()).unwrap();
        assert_eq!(body["nodeEligible"], true);
        assert_eq!(body["problem"], "IPv4: restore said \"no\"");
        assert_eq!(body["currentTime"], now.go_string());
    }

    #[test]
    fn a_problem_is_only_replaced_while_it_is_still_the_expected_one() {
        let h = ProxyHealth::new(TIMEOUT);
        h.set_problem(Some("source api: unreachable".into()));
        assert!(h.replace_problem("source api: unreachable", None));
        assert_eq!(h.problem(), None);
        h.set_problem(Some("source manifests: cannot read".into()));
        assert!(!h.replace_problem("source api: unreachable", None));
        assert_eq!(h.problem().as_deref(), Some("source manifests: cannot read"));
    }

    #[test]
    fn ineligible_before_any_update_reports_gos_zero_time() {
        let h = ProxyHealth::new(TIMEOUT);
        h.set_node_eligible(false);
        let report = h.healthz();
        assert_eq!(report.status_code(), 503);
        assert_eq!(report.last_updated, "0001-01-01 00:00:00 +0000 UTC");
    }
}
