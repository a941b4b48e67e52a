//! The ipvs mode's [`Backend`]: one sync as upstream's (`UPSTREAM.md` §5), each step
//! writing only what differs from what the kernel holds.
//!
//! Every sync walks the whole desired state (the plan is cheap next to reading the
//! kernel), as upstream's ipvs proxier does; the kernel's own state is read back each time,
//! so someone deleting a virtual server or flushing a set is repaired by the next sync.
//! Order matters: sets before the rules that match them, `kube-ipvs0`'s new addresses
//! before the virtual servers that serve them, stale addresses removed only after the
//! rules and servers no longer need them.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use kpr_iptables::{ExecError, Iptables, NodePortAddresses};
use kpr_ipvs_netlink::{Ipvs, IpvsLink, IpvsLinks, NetlinkError, Scheduler, ServiceKey};
use kpr_model::IpFamily;
use kpr_state::{Backend, BackendError, FailedStep, SyncKind, SyncReport, SyncRequest};

use crate::addresses::{HostAddresses, read_interface_addresses};
use crate::ipset::{SetSpec, parse_save, restore_script};
use crate::kernel::{self, IpvsError};
use crate::plan::set_family;
use crate::reconcile::{Graceful, reconcile};
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

/// The `ipset` tool, or a stand-in in tests.
pub trait Ipset: Send {
    /// `ipset save`: every set with its members.
    fn save(&self) -> Result<String, std::io::Error>;
    /// `ipset restore -exist` with `script` on stdin.
    fn restore(&self, script: &str) -> Result<(), std::io::Error>;
}

/// The `ipset` binary in the calling thread's network namespace.
#[derive(Clone, Copy, Debug, Default)]
pub struct IpsetCli;

impl Ipset for IpsetCli {
    fn save(&self) -> Result<String, std::io::Error> {
        let output = std::process::Command::new("ipset").arg("save").output()?;
        checked("ipset save", &output)?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    fn restore(&self, script: &str) -> Result<(), std::io::Error> {
        use std::io::Write as _;
        let mut child = std::process::Command::new("ipset")
            .args(["restore", "-exist"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(script.as_bytes())?;
        }
        let output = child.wait_with_output()?;
        checked("ipset restore -exist", &output)
    }
}

fn checked(what: &str, output: &std::process::Output) -> Result<(), std::io::Error> {
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    Err(std::io::Error::other(format!(
        "{what} failed ({}): {}",
        output.status,
        stderr.trim()
    )))
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

pub struct IpvsBackend {
    options: IpvsOptions,
    iptables: Box<dyn Iptables>,
    ipset: Box<dyn Ipset>,
    graceful: Graceful,
    first_sync: bool,
}

impl IpvsBackend {
    pub fn new(options: IpvsOptions, iptables: Box<dyn Iptables>, ipset: Box<dyn Ipset>) -> Self {
        Self {
            options,
            iptables,
            ipset,
            graceful: Graceful::default(),
            first_sync: true,
        }
    }

    /// Real servers draining after their removal (for tests and metrics).
    pub fn draining(&self) -> usize {
        self.graceful.len()
    }

    fn try_sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncReport, SyncError> {
        let family = self.options.family();
        let mut links = IpvsLinks::open().map_err(SyncError::Link)?;
        let link = links.ensure().map_err(SyncError::Link)?;
        let all = read_interface_addresses().map_err(SyncError::Addresses)?;
        let host = HostAddresses::new(&all, family, &self.options.node_port_addresses);
        let plan = plan(request.state, &self.inputs(&host));
        self.write_sets(&plan)?;
        let ruleset = rules::ruleset(&plan, &self.options.rules);
        let payload = ruleset.render_full();
        self.iptables
            .restore(payload.text.as_bytes())
            .map_err(SyncError::Iptables)?;
        for jump in jump_rules() {
            self.iptables
                .ensure_rule(jump.table, jump.chain, &jump.args)
                .map_err(SyncError::Iptables)?;
        }
        bind(&mut links, &link, plan.bound.difference(&host.bound))?;
        self.write_virtual_servers(&plan)?;
        let stale: BTreeSet<IpAddr> = host.bound.difference(&plan.bound).copied().collect();
        unbind(&mut links, &link, &stale)?;
        self.first_sync = false;
        Ok(SyncReport {
            full: true,
            tables: ruleset.table_counts(&payload),
            ..SyncReport::default()
        })
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

    fn write_sets(&self, plan: &IpvsPlan) -> Result<(), SyncError> {
        let family = set_family(self.options.family());
        let specs: Vec<SetSpec> = SetId::ALL.iter().map(|id| id.spec(family)).collect();
        let saved = self.ipset.save().map_err(|e| SyncError::Ipset(e.to_string()))?;
        let current = parse_save(&saved, &specs).map_err(SyncError::Ipset)?;
        let script = restore_script(&plan.sets, &current);
        if script.is_empty() {
            return Ok(());
        }
        self.ipset
            .restore(&script)
            .map_err(|e| SyncError::Ipset(e.to_string()))
    }

    fn write_virtual_servers(&mut self, plan: &IpvsPlan) -> Result<(), SyncError> {
        let mut ipvs = Ipvs::open()
            .map_err(|source| IpvsError {
                what: "opening the IPVS family".to_string(),
                source,
            })?
            .ok_or(SyncError::NoIpvs)?;
        let (listed, unreadable) = kernel::read(&mut ipvs)?;
        for reason in unreadable {
            tracing::warn!(%reason, "IPVS object kube-proxy-rs cannot read; left alone");
        }
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
        Ok(())
    }
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
    fn mode(&self) -> &'static str {
        "ipvs"
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncReport, BackendError> {
        self.try_sync(request).map_err(|error| {
            let step = match &error {
                SyncError::Iptables(ExecError::Restore { .. }) => FailedStep::Restore,
                _ => FailedStep::Other,
            };
            BackendError::new(SyncKind::Full, step, error)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addresses::InterfaceAddress;

    #[test]
    fn an_ipset_failure_names_the_command() {
        let output = std::process::Command::new("sh")
            .args(["-c", "echo 'set KUBE-X does not exist' >&2; exit 1"])
            .output()
            .unwrap();
        let error = checked("ipset restore -exist", &output).unwrap_err();
        assert!(
            error.to_string().contains("ipset restore -exist failed"),
            "{error}"
        );
        assert!(error.to_string().contains("KUBE-X does not exist"), "{error}");
    }

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
