//! When the conntrack table is reconciled, and how much of it.
//!
//! Upstream lists every UDP entry after every successful sync. Measured here (see the
//! crate docs) that costs about 3 ms of CPU per 1,000 UDP entries: fine for a small node,
//! a third of a core at 100,000 entries with syncs every second. So [`Reconciler`] does
//! the same decision in two sizes:
//! - after every successful sync, only where the sync's changes can have made entries
//!   stale: the frontends of the UDP services it changed (one kernel-filtered dump per
//!   service address and NodePort; the kernel walks its table but sends only matches;
//!   past [`MAX_TARGETED_DUMPS`] one whole-table dump is cheaper and is done instead).
//!   A sync that changed no UDP service costs nothing;
//! - the whole table after the first sync (flows from before a restart), after a failed
//!   sync (its changes never got their cleanup), after a listing that failed, and every
//!   `full_period` (the sync period), which catches whatever else was orphaned.
//!
//! A frontend that no UDP port has any more (a deleted Service's addresses and NodePorts, a
//! port removed, a changed cluster IP) is judged with no endpoint behind it, so its flows
//! go too: the reconciler remembers each Service's UDP frontends from the last state it
//! reconciled against, which is the only place they are still known. Upstream forgot
//! them until its issue #141371 (a deleted Service's flows lived on, kept alive by their
//! clients, and went to the old pod once the cluster IP was reused).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

use kpr_model::{IpFamily, NamespacedName};
use kpr_state::{BackendError, ConntrackReconcile, DesiredState, SyncReport, SyncRequest};

use crate::decision::{Frontends, scopes_of, udp_scopes_by_service, udp_scopes_of};
use crate::entry::UdpEntry;
use crate::netlink::NetlinkTable;
use crate::table::{ConntrackTable, Scope, TableError};

/// Upstream's default `syncPeriod`, for the periodic whole-table reconcile.
pub const DEFAULT_FULL_PERIOD: Duration = Duration::from_secs(30);

/// Past this many filtered dumps one whole-table dump is cheaper: the kernel walks its
/// whole table for each (measured: a filtered dump costs ~1/4 of a full one at 10,000
/// entries and ~1/8 at 100,000, the full one's user-space parsing included).
pub const MAX_TARGETED_DUMPS: usize = 4;

/// What one reconcile found and did.
#[derive(Debug, Default)]
pub struct Reconciled {
    /// Whether the whole table was looked at (else only the changed services' frontends).
    pub full: bool,
    /// Dumps made (one per scope: the whole table, or a service address or NodePort).
    pub listings: usize,
    /// UDP entries listed.
    pub listed: usize,
    pub stale: usize,
    pub deleted: usize,
    /// Stale entries that were gone by the time they were deleted.
    pub gone: usize,
    pub failed: usize,
    pub first_error: Option<TableError>,
    /// A listing may have missed entries (the table changed during the dump).
    pub interrupted: bool,
    pub unreadable: usize,
    pub duration: Duration,
}

/// Called by a backend around its syncs; never fails a sync.
pub trait Conntrack: Send {
    /// Cleans up after the successful sync of `request`, once its rules are in (earlier,
    /// the old rules would re-create what is deleted). `None` when nothing was looked at
    /// (no UDP change) or the table could not be listed (logged).
    fn after_sync(&mut self, request: &SyncRequest<'_>) -> Option<ConntrackReconcile>;

    /// A sync failed: its changes got no cleanup, so the next one covers everything.
    fn sync_failed(&mut self);
}

/// Hands a kernel-NAT backend's sync `result` to its `conntrack` cleanup, as upstream's
/// iptables, nftables and ipvs modes clean up after every sync: after a success only, once
/// the new rules are in (or the old ones would re-create the deleted flows); a failure
/// tells it the next cleanup must cover everything.
pub fn clean_up_after(
    conntrack: Option<&mut (dyn Conntrack + '_)>,
    request: &SyncRequest<'_>,
    result: Result<SyncReport, BackendError>,
) -> Result<SyncReport, BackendError> {
    let Some(conntrack) = conntrack else {
        return result;
    };
    match result {
        Ok(mut report) => {
            report.conntrack_reconcile = conntrack.after_sync(request);
            Ok(report)
        }
        Err(error) => {
            conntrack.sync_failed();
            Err(error)
        }
    }
}

/// Reconciles one family's UDP conntrack entries.
pub struct Reconciler {
    family: IpFamily,
    table: Box<dyn ConntrackTable>,
    full_period: Duration,
    /// When the whole table was last reconciled; `None` before the first time.
    last_full: Option<Instant>,
    /// The next reconcile must cover the whole table.
    full_due: bool,
    /// Each Service's UDP frontends in the state last reconciled against: what a Service
    /// had once it is gone (or a port or address it no longer has).
    known: BTreeMap<NamespacedName, BTreeSet<Scope>>,
    /// How many Services of `known` have each frontend: a frontend a changed Service lost
    /// is retired only when no other Service has it, found without visiting every Service.
    holders: BTreeMap<Scope, usize>,
}

impl std::fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler")
            .field("family", &self.family)
            .field("full_period", &self.full_period)
            .field("full_due", &self.full_due)
            .finish_non_exhaustive()
    }
}

impl Reconciler {
    pub fn new(family: IpFamily, table: Box<dyn ConntrackTable>) -> Self {
        Self {
            family,
            table,
            full_period: DEFAULT_FULL_PERIOD,
            last_full: None,
            full_due: true,
            known: BTreeMap::new(),
            holders: BTreeMap::new(),
        }
    }

    /// The real table (ctnetlink) of the namespace the sync thread runs in.
    pub fn netlink(family: IpFamily) -> Self {
        Self::new(family, Box::new(NetlinkTable::new()))
    }

    /// How often the whole table is reconciled even without a reason.
    pub fn with_full_period(mut self, period: Duration) -> Self {
        self.full_period = period;
        self
    }

    /// Reconciles the whole table against `state`. Fails only when the table cannot be
    /// listed; failed deletions are reported in the result.
    pub fn reconcile(&mut self, state: &DesiredState) -> Result<Reconciled, TableError> {
        let started = Instant::now();
        let current = udp_scopes_by_service(state);
        let mut frontends = Frontends::of(state);
        frontends.retire(&self.retired(&current));
        // Without a UDP frontend nothing can be stale: no need to list anything.
        let scopes = if frontends.is_empty() {
            BTreeSet::new()
        } else {
            BTreeSet::from([Scope::All])
        };
        let mut done = self.reconcile_scopes(&frontends, &scopes)?;
        self.holders = BTreeMap::new();
        for scope in current.values().flatten() {
            *self.holders.entry(*scope).or_default() += 1;
        }
        self.known = current;
        done.full = true;
        done.duration = started.elapsed();
        Ok(done)
    }

    /// Reconciles only the frontends of `services` (those a sync changed), those they had
    /// and lost included, or the whole table when that is cheaper.
    pub fn reconcile_services(
        &mut self,
        state: &DesiredState,
        services: &BTreeSet<NamespacedName>,
    ) -> Result<Reconciled, TableError> {
        // Only the changed Services' frontends: a sync under churn touches a few of
        // thousands, and this runs after every one.
        let current: BTreeMap<NamespacedName, BTreeSet<Scope>> = services
            .iter()
            .map(|service| (service.clone(), udp_scopes_of(state, service)))
            .collect();
        let retired = self.retired_from(&current);
        let mut scopes = scopes_of(state, services);
        scopes.extend(retired.iter().copied());
        if scopes.len() > MAX_TARGETED_DUMPS {
            return self.reconcile(state);
        }
        let started = Instant::now();
        let mut done = if scopes.is_empty() {
            Reconciled::default()
        } else {
            let mut frontends = Frontends::of(state);
            frontends.retire(&retired);
            self.reconcile_scopes(&frontends, &scopes)?
        };
        for (service, scopes) in current {
            self.replace_known(service, scopes);
        }
        done.duration = started.elapsed();
        Ok(done)
    }

    /// The frontends the Services of `changed` (each with its frontends now) had when last
    /// reconciled and that, with their new frontends counted, no Service has any more.
    fn retired_from(&self, changed: &BTreeMap<NamespacedName, BTreeSet<Scope>>) -> BTreeSet<Scope> {
        let mut holders: BTreeMap<Scope, isize> = BTreeMap::new();
        for (service, now) in changed {
            for scope in self.known.get(service).into_iter().flatten() {
                *holders.entry(*scope).or_default() -= 1;
            }
            for scope in now {
                *holders.entry(*scope).or_default() += 1;
            }
        }
        holders
            .into_iter()
            .filter(|(scope, delta)| {
                let before = self.holders.get(scope).copied().unwrap_or(0);
                before > 0 && isize::try_from(before).unwrap_or(isize::MAX) + delta <= 0
            })
            .map(|(scope, _)| scope)
            .collect()
    }

    /// Records `service`'s frontends as `scopes` (none: it is forgotten).
    fn replace_known(&mut self, service: NamespacedName, scopes: BTreeSet<Scope>) {
        for scope in self.known.remove(&service).into_iter().flatten() {
            if let Some(count) = self.holders.get_mut(&scope) {
                *count -= 1;
                if *count == 0 {
                    self.holders.remove(&scope);
                }
            }
        }
        for scope in &scopes {
            *self.holders.entry(*scope).or_default() += 1;
        }
        if !scopes.is_empty() {
            self.known.insert(service, scopes);
        }
    }

    /// The frontends any Service had in the state last reconciled against and that no
    /// Service has in `current` (every Service's frontends now).
    fn retired(&self, current: &BTreeMap<NamespacedName, BTreeSet<Scope>>) -> BTreeSet<Scope> {
        let live: BTreeSet<&Scope> = current.values().flatten().collect();
        self.known
            .values()
            .flatten()
            .filter(|scope| !live.contains(scope))
            .copied()
            .collect()
    }

    fn reconcile_scopes(
        &mut self,
        frontends: &Frontends,
        scopes: &BTreeSet<Scope>,
    ) -> Result<Reconciled, TableError> {
        let mut done = Reconciled::default();
        let mut entries: Vec<UdpEntry> = Vec::new();
        let mut seen = HashSet::new();
        for scope in scopes {
            let listing = self.table.udp_entries(self.family, *scope)?;
            done.interrupted |= listing.interrupted;
            done.unreadable += listing.unreadable;
            // A NodePort scope and an address scope can return the same entry.
            entries.extend(listing.entries.into_iter().filter(|e| seen.insert(e.original)));
        }
        let stale = frontends.stale(&entries);
        let deletion = self.table.delete(&stale);
        done.listings = scopes.len();
        done.listed = entries.len();
        done.stale = stale.len();
        done.deleted = deletion.deleted;
        done.gone = deletion.gone;
        done.failed = deletion.failed;
        done.first_error = deletion.first_error;
        Ok(done)
    }

    fn full_is_due(&self) -> bool {
        self.full_due || self.last_full.is_none_or(|at| at.elapsed() >= self.full_period)
    }
}

impl Conntrack for Reconciler {
    fn after_sync(&mut self, request: &SyncRequest<'_>) -> Option<ConntrackReconcile> {
        let family = self.family.label();
        let full = self.full_is_due();
        let result = if full {
            self.reconcile(request.state)
        } else {
            self.reconcile_services(request.state, request.changed)
        };
        match result {
            Ok(done) => {
                if done.full {
                    self.full_due = false;
                    self.last_full = Some(Instant::now());
                }
                log(family, &done);
                // A pass that had nothing to look at is no reconcile to report.
                (done.full || done.listings > 0).then_some(ConntrackReconcile {
                    deleted: done.deleted as u64,
                    duration: done.duration,
                })
            }
            Err(error) => {
                // What this pass should have cleaned is left to a whole-table pass.
                self.full_due = true;
                tracing::warn!(
                    ip_family = family,
                    "conntrack reconcile failed, retried in full after the next sync: {error}"
                );
                None
            }
        }
    }

    fn sync_failed(&mut self) {
        self.full_due = true;
    }
}

fn log(family: &str, done: &Reconciled) {
    if let Some(error) = &done.first_error {
        tracing::warn!(
            ip_family = family,
            failed = done.failed,
            "could not delete every stale UDP conntrack entry: {error}"
        );
    }
    if done.unreadable > 0 {
        tracing::warn!(
            ip_family = family,
            unreadable = done.unreadable,
            "some conntrack entries could not be read and were left alone"
        );
    }
    tracing::debug!(
        ip_family = family,
        full = done.full,
        listed = done.listed,
        stale = done.stale,
        deleted = done.deleted,
        gone = done.gone,
        interrupted = done.interrupted,
        took = ?done.duration,
        "reconciled UDP conntrack entries"
    );
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};

    use kpr_world::{World, eps};
    use serde_json::json;

    use super::*;
    use crate::entry::FlowTuple;
    use crate::table::{Deletion, Listing};

    /// A conntrack table in memory that records what it was asked.
    #[derive(Clone, Default)]
    struct Fake {
        entries: Arc<Mutex<Vec<UdpEntry>>>,
        scopes: Arc<Mutex<Vec<Scope>>>,
        fail_listing: Arc<Mutex<bool>>,
    }

    impl ConntrackTable for Fake {
        fn udp_entries(&mut self, _family: IpFamily, scope: Scope) -> Result<Listing, TableError> {
            self.scopes.lock().unwrap().push(scope);
            if *self.fail_listing.lock().unwrap() {
                return Err(TableError::Kernel {
                    during: "listing",
                    errno: 1,
                });
            }
            let entries = self.entries.lock().unwrap();
            Ok(Listing {
                entries: entries.iter().filter(|e| scope.contains(e)).copied().collect(),
                ..Listing::default()
            })
        }

        fn delete(&mut self, stale: &[UdpEntry]) -> Deletion {
            let mut entries = self.entries.lock().unwrap();
            let before = entries.len();
            entries.retain(|e| !stale.contains(e));
            Deletion {
                deleted: before - entries.len(),
                ..Deletion::default()
            }
        }
    }

    impl Fake {
        fn took_scopes(&self) -> Vec<Scope> {
            std::mem::take(&mut *self.scopes.lock().unwrap())
        }
    }

    /// UDP (or TCP) service `name` on `vip`:53, target port 5353, with `pods`.
    fn dns(w: &mut World, name: &str, vip: &str, protocol: &str, pods: &[&str]) {
        w.service(
            name,
            json!({"clusterIP": vip, "ports": [{"name": "dns", "port": 53, "protocol": protocol, "targetPort": 5353}]}),
        )
        .slice(
            name,
            json!([{"name": "dns", "port": 5353, "protocol": protocol}]),
            eps(pods),
        );
    }

    fn flow(source_port: u16, to: &str, reply_from: &str) -> UdpEntry {
        let client = SocketAddr::from(([192, 168, 77, 2], source_port));
        UdpEntry {
            original: FlowTuple {
                src: client,
                dst: to.parse().unwrap(),
            },
            reply: FlowTuple {
                src: reply_from.parse().unwrap(),
                dst: client,
            },
            id: Some(u32::from(source_port)),
            zone: None,
        }
    }

    fn reconciler(fake: &Fake) -> Reconciler {
        Reconciler::new(IpFamily::V4, Box::new(fake.clone()))
    }

    #[test]
    fn the_first_sync_reconciles_the_whole_table_then_only_changed_udp_services() {
        let fake = Fake::default();
        *fake.entries.lock().unwrap() = vec![
            flow(1, "10.96.0.1:53", "10.244.1.10:5353"),
            flow(2, "10.96.0.1:53", "10.244.1.66:5353"), // to a pod that left while we were down
            flow(3, "10.96.0.2:53", "10.244.1.20:5353"),
        ];
        let mut r = reconciler(&fake);
        let mut w = World::new();
        dns(&mut w, "a", "10.96.0.1", "UDP", &["10.244.1.10"]);
        dns(&mut w, "b", "10.96.0.2", "UDP", &["10.244.1.20"]);
        let first = w.pending();
        let report = r.after_sync(&first.request(false)).unwrap();
        assert_eq!(fake.took_scopes(), [Scope::All]);
        assert_eq!(report.deleted, 1);
        assert_eq!(fake.entries.lock().unwrap().len(), 2);

        // Service b's endpoint moves: only b's frontend is looked at.
        dns(&mut w, "b", "10.96.0.2", "UDP", &["10.244.1.21"]);
        let second = w.pending();
        let report = r.after_sync(&second.request(false)).unwrap();
        assert_eq!(fake.took_scopes(), [Scope::To("10.96.0.2:53".parse().unwrap())]);
        assert_eq!(report.deleted, 1);
        assert_eq!(
            *fake.entries.lock().unwrap(),
            [flow(1, "10.96.0.1:53", "10.244.1.10:5353")]
        );

        // A TCP-only change, or none: nothing to look at, nothing to report.
        dns(&mut w, "web", "10.96.0.80", "TCP", &["10.244.1.30"]);
        assert_eq!(r.after_sync(&w.pending().request(false)), None);
        assert_eq!(r.after_sync(&w.pending().request(false)), None);
        assert!(fake.took_scopes().is_empty());
    }

    #[test]
    fn a_deleted_udp_services_flows_go_and_a_service_reusing_its_address_keeps_its_own() {
        let fake = Fake::default();
        let mut r = reconciler(&fake);
        let mut w = World::new();
        dns(&mut w, "gone", "10.96.0.1", "UDP", &["10.244.1.10"]);
        dns(&mut w, "stays", "10.96.0.2", "UDP", &["10.244.1.20"]);
        r.after_sync(&w.pending().request(false));
        fake.took_scopes();
        *fake.entries.lock().unwrap() = vec![
            flow(1, "10.96.0.1:53", "10.244.1.10:5353"),
            flow(2, "10.96.0.2:53", "10.244.1.20:5353"),
        ];

        // Only the deleted Service's address is looked at, and its flow goes.
        w.delete_service("gone");
        let report = r.after_sync(&w.pending().request(false)).unwrap();
        assert_eq!(fake.took_scopes(), [Scope::To("10.96.0.1:53".parse().unwrap())]);
        assert_eq!(report.deleted, 1);
        assert_eq!(
            *fake.entries.lock().unwrap(),
            [flow(2, "10.96.0.2:53", "10.244.1.20:5353")]
        );

        // Recreated with the same address and another pod: flows to the new pod stay, a
        // flow left to the old one (made meanwhile, say) goes.
        *fake.entries.lock().unwrap() = vec![
            flow(3, "10.96.0.1:53", "10.244.1.11:5353"),
            flow(4, "10.96.0.1:53", "10.244.1.10:5353"),
        ];
        dns(&mut w, "gone", "10.96.0.1", "UDP", &["10.244.1.11"]);
        let report = r.after_sync(&w.pending().request(false)).unwrap();
        assert_eq!(report.deleted, 1);
        assert_eq!(
            *fake.entries.lock().unwrap(),
            [flow(3, "10.96.0.1:53", "10.244.1.11:5353")]
        );
    }

    #[test]
    fn a_frontend_another_service_takes_over_is_judged_by_that_service() {
        let fake = Fake::default();
        let mut r = reconciler(&fake);
        let mut w = World::new();
        dns(&mut w, "old", "10.96.0.1", "UDP", &["10.244.1.10"]);
        r.after_sync(&w.pending().request(false));
        fake.took_scopes();
        // The same change deletes "old" and gives its address to "new", on the same pod.
        w.delete_service("old");
        dns(&mut w, "new", "10.96.0.1", "UDP", &["10.244.1.10"]);
        *fake.entries.lock().unwrap() = vec![flow(1, "10.96.0.1:53", "10.244.1.10:5353")];
        let report = r.after_sync(&w.pending().request(false)).unwrap();
        assert_eq!(report.deleted, 0);
        assert_eq!(fake.entries.lock().unwrap().len(), 1);
    }

    /// A frontend two Services share (an external IP and port) is not retired when one
    /// of them goes while the other, unchanged in that sync, still has it: the partial
    /// pass counts holders instead of visiting every Service.
    #[test]
    fn a_frontend_an_unchanged_service_still_has_is_not_retired() {
        let fake = Fake::default();
        let mut r = reconciler(&fake);
        let mut w = World::new();
        for (name, vip, pod) in [
            ("a", "10.96.0.1", "10.244.1.10"),
            ("b", "10.96.0.2", "10.244.1.20"),
        ] {
            w.service(
                name,
                json!({"clusterIP": vip, "externalIPs": ["192.0.2.9"],
                       "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]}),
            )
            .slice(
                name,
                json!([{"name": "dns", "port": 5353, "protocol": "UDP"}]),
                eps(&[pod]),
            );
        }
        r.after_sync(&w.pending().request(false));
        fake.took_scopes();
        w.delete_service("a");
        *fake.entries.lock().unwrap() = vec![flow(1, "192.0.2.9:53", "10.244.1.20:5353")];
        let report = r.after_sync(&w.pending().request(false)).unwrap();
        assert_eq!(
            fake.took_scopes(),
            [Scope::To("10.96.0.1:53".parse().unwrap())],
            "only a's own address is retired and looked at"
        );
        assert_eq!(report.deleted, 0);
        assert_eq!(
            *fake.entries.lock().unwrap(),
            [flow(1, "192.0.2.9:53", "10.244.1.20:5353")],
            "b's flow through the shared address stays"
        );
        // Once b goes too, nobody has it: its flows go.
        w.delete_service("b");
        let report = r.after_sync(&w.pending().request(false)).unwrap();
        assert_eq!(report.deleted, 1);
        assert!(fake.entries.lock().unwrap().is_empty());
    }

    #[test]
    fn a_whole_table_reconcile_also_retires_what_deleted_services_had() {
        let fake = Fake::default();
        let mut r = reconciler(&fake);
        let mut w = World::new();
        dns(&mut w, "gone", "10.96.0.1", "UDP", &["10.244.1.10"]);
        r.after_sync(&w.pending().request(false));
        *fake.entries.lock().unwrap() = vec![flow(1, "10.96.0.1:53", "10.244.1.10:5353")];
        // The sync that deleted it failed: the next cleanup is whole, and still knows.
        w.delete_service("gone");
        r.sync_failed();
        fake.took_scopes();
        let report = r.after_sync(&w.pending().request(false)).unwrap();
        assert_eq!(fake.took_scopes(), [Scope::All]);
        assert_eq!(report.deleted, 1);
        assert!(fake.entries.lock().unwrap().is_empty());
    }

    #[test]
    fn a_failed_sync_makes_the_next_reconcile_whole() {
        let fake = Fake::default();
        let mut r = reconciler(&fake);
        let mut w = World::new();
        dns(&mut w, "a", "10.96.0.1", "UDP", &["10.244.1.10"]);
        r.after_sync(&w.pending().request(false));
        fake.took_scopes();
        r.sync_failed();
        assert!(r.after_sync(&w.pending().request(false)).is_some());
        assert_eq!(fake.took_scopes(), [Scope::All]);
    }

    #[test]
    fn a_failed_listing_is_retried_in_full_and_never_fails_the_sync() {
        let fake = Fake::default();
        let mut r = reconciler(&fake);
        let mut w = World::new();
        dns(&mut w, "a", "10.96.0.1", "UDP", &["10.244.1.10"]);
        *fake.fail_listing.lock().unwrap() = true;
        assert_eq!(r.after_sync(&w.pending().request(false)), None);
        *fake.fail_listing.lock().unwrap() = false;
        fake.took_scopes();
        assert!(r.after_sync(&w.pending().request(false)).is_some());
        assert_eq!(fake.took_scopes(), [Scope::All]);
    }

    #[test]
    fn the_whole_table_is_reconciled_every_period() {
        let fake = Fake::default();
        let mut r = reconciler(&fake).with_full_period(Duration::ZERO);
        let mut w = World::new();
        dns(&mut w, "a", "10.96.0.1", "UDP", &["10.244.1.10"]);
        r.after_sync(&w.pending().request(false));
        fake.took_scopes();
        // No change at all, yet the period is over.
        assert!(r.after_sync(&w.pending().request(false)).is_some());
        assert_eq!(fake.took_scopes(), [Scope::All]);
    }

    #[test]
    fn many_changed_frontends_take_one_whole_table_dump() {
        let fake = Fake::default();
        let mut r = reconciler(&fake);
        let mut w = World::new();
        r.after_sync(&w.pending().request(false));
        fake.took_scopes();
        for i in 0..=MAX_TARGETED_DUMPS {
            dns(
                &mut w,
                &format!("s{i}"),
                &format!("10.96.0.{}", i + 1),
                "UDP",
                &["10.244.1.10"],
            );
        }
        r.after_sync(&w.pending().request(false));
        assert_eq!(fake.took_scopes(), [Scope::All]);
    }

    /// Records which of its calls a backend made.
    #[derive(Default)]
    struct Calls(Vec<&'static str>);

    impl Conntrack for Calls {
        fn after_sync(&mut self, _request: &SyncRequest<'_>) -> Option<ConntrackReconcile> {
            self.0.push("after_sync");
            Some(ConntrackReconcile {
                deleted: 2,
                ..ConntrackReconcile::default()
            })
        }

        fn sync_failed(&mut self) {
            self.0.push("sync_failed");
        }
    }

    #[test]
    fn a_backend_cleans_up_after_a_success_and_reports_a_failure() {
        let mut w = World::new();
        let pending = w.pending();
        let request = pending.request(false);
        let mut calls = Calls::default();
        let report = clean_up_after(Some(&mut calls), &request, Ok(SyncReport::default())).unwrap();
        assert_eq!(report.conntrack_reconcile.map(|r| r.deleted), Some(2));
        let failed = BackendError::new(
            kpr_state::SyncKind::Full,
            kpr_state::FailedStep::Restore,
            "restore refused",
        );
        assert!(clean_up_after(Some(&mut calls), &request, Err(failed)).is_err());
        assert_eq!(calls.0, ["after_sync", "sync_failed"]);
        let untouched = clean_up_after(None, &request, Ok(SyncReport::default())).unwrap();
        assert_eq!(untouched.conntrack_reconcile, None);
    }
}
