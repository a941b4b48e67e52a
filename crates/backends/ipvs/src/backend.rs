//! The ipvs mode's [`Backend`]: one sync as upstream's (`UPSTREAM.md` §5), each step
//! writing only what differs from what the kernel holds.
//!
//! Every sync walks the whole desired state (the plan is cheap next to the kernel), as
//! upstream's ipvs proxier does. A *full* sync reads the kernel back (the IPVS table, the
//! sets, `kube-ipvs0`) and repairs whatever differs, so someone deleting a virtual server or
//! flushing a set is repaired within a sync period; a *partial* sync (a change between those)
//! writes only the difference from what the last sync wrote, reading back only the real
//! servers whose connection counts decide graceful termination.
//! Order matters: sets before the rules that match them, `kube-ipvs0`'s new addresses
//! before the virtual servers that serve them, stale addresses removed only after the
//! rules and servers no longer need them.

use kpr_conntrack::Conntrack;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use kpr_host::NodePortAddresses;
use kpr_iptables::{ExecError, Iptables};
use kpr_ipvs_netlink::{Destination, Ipvs, IpvsLink, IpvsLinks, NetlinkError, Scheduler, ServiceKey};
use kpr_model::IpFamily;
use kpr_state::{Backend, BackendError, FailedStep, ObjectCount, SyncKind, SyncReport, SyncRequest};

use crate::addresses::{HostAddresses, read_interface_addresses};
use crate::ipset::{Ipset, SetSpec, changes};
use crate::kernel::{self, IpvsError};
use crate::plan::set_family;
use crate::reconcile::{Graceful, KernelService, WEIGHT, reconcile};
use crate::rules::{self, RuleOptions, jump_rules};
use crate::sets::SetId;
use crate::{IpvsPlan, PlanInputs, plan};

/// The ipvs mode's settings for one family.
#[derive(Clone, Debug)]
pub struct IpvsOptions {
    pub scheduler: Scheduler,
    pub rules: RuleOptions,
    pub node_port_addresses: NodePortAddresses,
    /// `--ipvs-exclude-cidrs`: virtual servers there are never deleted.
    pub exclude_cidrs: Vec<IpNet>,
    /// The family's primary node IP.
    pub node_ip: Option<IpAddr>,
}

impl IpvsOptions {
    fn family(&self) -> IpFamily {
        self.rules.family
    }
}

/// Why a sync failed, by step.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("kube-ipvs0: {0}")]
    Link(#[source] NetlinkError),
    #[error("reading this host's addresses: {0}")]
    Addresses(#[source] std::io::Error),
    #[error("ipsets: {0}")]
    Ipset(String),
    #[error("iptables: {0}")]
    Iptables(#[source] ExecError),
    #[error("this kernel has no IPVS (the ip_vs module is not loaded and cannot be)")]
    NoIpvs,
    #[error(transparent)]
    Ipvs(#[from] IpvsError),
}

/// What one sync wrote: the requests it sent the kernel, by kind (benchmarks and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncStats {
    pub full: bool,
    /// IPVS netlink requests that changed something (virtual and real servers).
    pub ipvs_operations: usize,
    /// IPVS dumps read (the whole table on a full sync; single servers on a partial one).
    pub ipvs_dumps: usize,
    /// Set creations and member changes.
    pub set_changes: usize,
    /// Addresses bound to or removed from kube-ipvs0.
    pub address_changes: usize,
    /// Whether the ruleset was restored.
    pub rules_written: bool,
}

/// What the last successful sync wrote, the kernel's state as far as this process knows.
struct Applied {
    plan: IpvsPlan,
    rules: String,
    link: IpvsLink,
    reconciled_at: Instant,
}

pub struct IpvsBackend {
    options: IpvsOptions,
    iptables: Box<dyn Iptables>,
    ipset: Box<dyn Ipset>,
    graceful: Graceful,
    first_sync: bool,
    applied: Option<Applied>,
    reconcile_period: Duration,
    stats: SyncStats,
    /// Cleans up stale UDP conntrack entries after syncs; `None` leaves conntrack alone.
    conntrack: Option<Box<dyn Conntrack>>,
}

/// Upstream's default `ipvs.syncPeriod`: the kernel is read back at least this often.
pub const DEFAULT_RECONCILE_PERIOD: Duration = Duration::from_secs(30);

impl IpvsBackend {
    pub fn new(options: IpvsOptions, iptables: Box<dyn Iptables>, ipset: Box<dyn Ipset>) -> Self {
        Self {
            options,
            iptables,
            ipset,
            graceful: Graceful::default(),
            first_sync: true,
            applied: None,
            reconcile_period: DEFAULT_RECONCILE_PERIOD,
            stats: SyncStats::default(),
            conntrack: None,
        }
    }

    /// Deletes stale UDP conntrack entries after each successful sync, as upstream's ipvs
    /// mode does: IPVS keeps the kernel's conntrack entries of the flows it translates
    /// (`net/ipv4/vs/conntrack`), so a flow to a removed pod would otherwise stay pinned.
    pub fn with_conntrack(mut self, conntrack: Box<dyn Conntrack>) -> Self {
        self.conntrack = Some(conntrack);
        self
    }

    /// How often at the least a sync reads the kernel back instead of trusting what this
    /// process wrote (the sync period).
    pub fn with_reconcile_period(mut self, period: Duration) -> Self {
        self.reconcile_period = period;
        self
    }

    /// What the last sync wrote.
    pub fn last_stats(&self) -> SyncStats {
        self.stats
    }

    /// Real servers draining after their removal (for tests and metrics).
    pub fn draining(&self) -> usize {
        self.graceful.len()
    }

    /// A full sync reads the kernel back and repairs whatever differs: the first one, after
    /// a failure, when forced, on the sync period's tick (a sync with nothing changed) and
    /// at least every reconcile period. Otherwise what the last sync wrote stands for the
    /// kernel's state and only the difference is written.
    fn is_full(&self, request: &SyncRequest<'_>) -> bool {
        match &self.applied {
            None => true,
            Some(applied) => {
                request.force_full
                    || request.changed.is_empty()
                    || applied.reconciled_at.elapsed() >= self.reconcile_period
            }
        }
    }

    fn try_sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncReport, SyncError> {
        let full = self.is_full(request);
        self.stats = SyncStats {
            full,
            ..SyncStats::default()
        };
        let applied = self.applied.take().filter(|_| !full);
        let family = self.options.family();
        let mut links = IpvsLinks::open().map_err(SyncError::Link)?;
        let link = match &applied {
            Some(applied) => applied.link.clone(),
            None => links.ensure().map_err(SyncError::Link)?,
        };
        let all = read_interface_addresses().map_err(SyncError::Addresses)?;
        let host = HostAddresses::new(&all, family, &self.options.node_port_addresses);
        let plan = plan(request.state, &self.inputs(&host));
        self.stats.set_changes = self.write_sets(&plan, applied.as_ref())?;
        let ruleset = rules::ruleset(&plan, &self.options.rules);
        let payload = ruleset.render_full();
        if applied.as_ref().is_none_or(|a| a.rules != payload.text) {
            self.write_rules(&payload.text)?;
            self.stats.rules_written = true;
        }
        let bound_before = applied.as_ref().map_or(&host.bound, |a| &a.plan.bound);
        let new: Vec<IpAddr> = plan.bound.difference(bound_before).copied().collect();
        bind(&mut links, &link, new.iter())?;
        self.write_virtual_servers(&plan, applied.as_ref())?;
        let stale: BTreeSet<IpAddr> = bound_before.difference(&plan.bound).copied().collect();
        unbind(&mut links, &link, &stale)?;
        self.stats.address_changes = new.len() + stale.len();
        self.first_sync = false;
        let reconciled_at = match &applied {
            Some(applied) => applied.reconciled_at,
            None => Instant::now(),
        };
        let report = SyncReport {
            full,
            objects: {
                let tables = ruleset.table_counts(&payload);
                ObjectCount {
                    total: tables.iter().map(|t| t.total).sum(),
                    written: tables.iter().map(|t| t.written).sum(),
                }
            },
            no_local_internal: plan.no_local_internal.len(),
            no_local_external: plan.no_local_external.len(),
            ..SyncReport::default()
        };
        self.applied = Some(Applied {
            plan,
            rules: payload.text,
            link,
            reconciled_at,
        });
        Ok(report)
    }

    fn inputs<'a>(&'a self, host: &'a HostAddresses) -> PlanInputs<'a> {
        PlanInputs {
            family: self.options.family(),
            scheduler: &self.options.scheduler,
            node_port_addresses: &host.node_ports,
            other_interface_addresses: &host.others,
            node_ip: self.options.node_ip,
        }
    }

    /// The sets' difference from what the kernel holds (read back on a full sync) or from
    /// what the last sync wrote; how many changes that was.
    fn write_sets(&mut self, plan: &IpvsPlan, applied: Option<&Applied>) -> Result<usize, SyncError> {
        let read;
        let current = match applied {
            Some(applied) => &applied.plan.sets,
            None => {
                let family = set_family(self.options.family());
                let specs: Vec<SetSpec> = SetId::ALL.iter().map(|id| id.spec(family)).collect();
                read = self.ipset.read(&specs).map_err(SyncError::Ipset)?;
                &read
            }
        };
        let changes = changes(&plan.sets, current);
        self.ipset.write(&changes).map_err(SyncError::Ipset)?;
        Ok(changes.len())
    }

    /// The ruleset (declaring a chain flushes it: each is rewritten whole) and the jumps.
    fn write_rules(&self, text: &str) -> Result<(), SyncError> {
        self.iptables
            .restore(text.as_bytes())
            .map_err(SyncError::Iptables)?;
        for jump in jump_rules() {
            self.iptables
                .ensure_rule(jump.table, jump.chain, &jump.args)
                .map_err(SyncError::Iptables)?;
        }
        Ok(())
    }

    fn write_virtual_servers(&mut self, plan: &IpvsPlan, applied: Option<&Applied>) -> Result<(), SyncError> {
        let mut ipvs = Ipvs::open()
            .map_err(|source| IpvsError {
                what: "opening the IPVS family".to_string(),
                source,
            })?
            .ok_or(SyncError::NoIpvs)?;
        let listed = match applied {
            Some(applied) => {
                let (listed, dumps) = known_state(&mut ipvs, &applied.plan, plan, &self.graceful)?;
                self.stats.ipvs_dumps = dumps;
                listed
            }
            None => {
                let (listed, unreadable) = kernel::read(&mut ipvs)?;
                // One dump of the services, one of each one's real servers.
                self.stats.ipvs_dumps = 1 + listed.len();
                for reason in unreadable {
                    tracing::warn!(%reason, "IPVS object kube-proxy-rs cannot read; left alone");
                }
                listed
            }
        };
        let family = self.options.family();
        let excluded = &self.options.exclude_cidrs;
        let owns = |key: &ServiceKey| {
            family.matches(&key.address) && !excluded.iter().any(|cidr| cidr.contains(&key.address))
        };
        let operations = reconcile(
            &plan.virtual_servers,
            &listed,
            &mut self.graceful,
            self.first_sync,
            owns,
        );
        kernel::apply(&mut ipvs, &operations)?;
        self.stats.ipvs_operations = operations.len();
        Ok(())
    }
}

/// The IPVS table as the last sync left it, without listing it: each virtual server with
/// its planned real servers at full weight, except where connection counts matter (a real
/// server leaving now, or one draining): those servers' real servers are read from the
/// kernel, one small dump each (counted in the second value).
fn known_state(
    ipvs: &mut Ipvs,
    before: &IpvsPlan,
    now: &IpvsPlan,
    graceful: &Graceful,
) -> Result<(Vec<KernelService>, usize), SyncError> {
    let mut listed = Vec::with_capacity(before.virtual_servers.len());
    let mut dumps = 0;
    for (key, server) in &before.virtual_servers {
        let losing = now
            .virtual_servers
            .get(key)
            .is_some_and(|next| !server.real_servers.is_subset(&next.real_servers));
        let destinations = if losing || graceful.has_server(key) {
            dumps += 1;
            let read = ipvs.destinations(key).map_err(|source| IpvsError {
                what: format!("listing the real servers of {key}"),
                source,
            })?;
            read.objects
        } else {
            server
                .real_servers
                .iter()
                .map(|real| Destination::new(real.ip(), real.port(), WEIGHT))
                .collect()
        };
        listed.push(KernelService {
            service: server.service.clone(),
            destinations,
        });
    }
    Ok((listed, dumps))
}

fn bind<'a>(
    links: &mut IpvsLinks,
    link: &IpvsLink,
    new: impl Iterator<Item = &'a IpAddr>,
) -> Result<(), SyncError> {
    for &address in new {
        links.bind(link, address).map_err(SyncError::Link)?;
    }
    Ok(())
}

fn unbind(links: &mut IpvsLinks, link: &IpvsLink, stale: &BTreeSet<IpAddr>) -> Result<(), SyncError> {
    for &address in stale {
        links.unbind(link, address).map_err(SyncError::Link)?;
    }
    Ok(())
}

impl Backend for IpvsBackend {
    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncReport, BackendError> {
        let result = self.try_sync(request).map_err(|error| {
            let step = match &error {
                SyncError::Iptables(ExecError::Restore { .. }) => FailedStep::Restore,
                _ => FailedStep::Other,
            };
            BackendError::new(SyncKind::Full, step, error)
        });
        kpr_conntrack::clean_up_after(self.conntrack.as_deref_mut(), request, result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addresses::InterfaceAddress;

    #[test]
    fn kube_ipvs0_holds_only_this_familys_addresses_for_unbinding() {
        let all = vec![
            InterfaceAddress {
                interface: kpr_ipvs_netlink::IPVS_LINK.to_string(),
                address: "10.96.0.10".parse().unwrap(),
            },
            InterfaceAddress {
                interface: kpr_ipvs_netlink::IPVS_LINK.to_string(),
                address: "fd00:96::10".parse().unwrap(),
            },
        ];
        let v4 = HostAddresses::new(&all, IpFamily::V4, &NodePortAddresses::All);
        assert_eq!(v4.bound.len(), 1, "the IPv6 backend owns the IPv6 address");
    }
}
