//! What upstream kube-proxy's other modes leave in the kernel outside iptables, and its
//! removal: the nftables tables of nftables mode (`ip kube-proxy`, `ip6 kube-proxy`), and
//! what IPVS mode leaves besides its iptables chains (its IPVS virtual services, the
//! `kube-ipvs0` link that holds the service addresses, its ipsets). The iptables chains of
//! either mode are kpr-iptables' (`cleanup_modes`).
//!
//! # Why, and what exactly
//!
//! Upstream's platform cleanup removes the other modes' objects when a mode starts (and
//! everything on `--cleanup`): a node switched from IPVS or nftables mode to iptables mode
//! otherwise keeps answering with stale services, or dropping traffic the new rules
//! allow. The rules here:
//!
//! - **Only what is provably upstream's.** Objects are found by the exact names upstream
//!   gives them (tables, link, sets); an IPVS virtual service is upstream's only when its
//!   address sits on `kube-ipvs0` (IPVS mode binds every service address there). Other
//!   tables, sets, links and virtual services (keepalived's, say) are never touched;
//!   upstream's `--cleanup` flushes every virtual service, this does not.
//! - **Absent is fine.** A kernel without nf_tables, ipset or IPVS (this one has no
//!   `ip_vs`: the generic-netlink family lookup says so) simply has nothing to remove.
//! - **Order.** Virtual services are chosen while `kube-ipvs0` still shows their addresses;
//!   sets go last, after kpr-iptables removed the rules that match them (a set in use
//!   cannot be destroyed).
//! - **Failures name the object.** Each one is reported ([`Report::failures`]) and the
//!   other objects are still removed; the caller logs them, and `--cleanup` exits non-zero.
//!
//! All I/O is netlink in the calling thread's network namespace: links and IPVS through
//! kpr-ipvs-netlink, ipsets through kpr-nfnetlink's ipset client, and the nftables batch
//! built here ([`kpr_netlink`]; its bytes are pinned by tests).

mod ipset;
mod ipvs;
mod nftables;

use kpr_netlink::NetlinkError;

pub use ipset::remove_ipvs_sets;
pub use ipvs::upstreams_services;
use kpr_ipvs_netlink::IpvsLinks;
pub use kpr_ipvs_netlink::{IPVS_LINK, IpvsLink};
pub use nftables::{NFTABLES_TABLE, NftFamily, delete_table_batch};

/// One object that could not be removed, and why.
#[derive(Debug, thiserror::Error)]
#[error("{object}: {reason}")]
pub struct LeftoverError {
    /// What it is, as an admin would name it (`ipset KUBE-CLUSTER-IP`).
    pub object: String,
    pub reason: String,
}

impl LeftoverError {
    fn netlink(object: impl Into<String>, error: &NetlinkError) -> Self {
        Self {
            object: object.into(),
            reason: error.to_string(),
        }
    }
}

/// What a removal did.
#[derive(Debug, Default)]
pub struct Report {
    /// The objects removed, named as in [`LeftoverError::object`].
    pub removed: Vec<String>,
    pub failures: Vec<LeftoverError>,
}

impl Report {
    pub fn is_ok(&self) -> bool {
        self.failures.is_empty()
    }

    fn removed(&mut self, object: String) {
        tracing::info!(%object, "removed what another kube-proxy mode left");
        self.removed.push(object);
    }

    fn failed(&mut self, error: LeftoverError) {
        tracing::warn!(%error, "cannot remove what another kube-proxy mode left");
        self.failures.push(error);
    }
}

/// `EOPNOTSUPP` / `EPROTONOSUPPORT`: the kernel lacks the subsystem, so nothing of it exists.
fn subsystem_missing(error: &NetlinkError) -> bool {
    matches!(error.errno(), Some(95 | 93))
}

/// Removes upstream's nftables tables, IPVS mode's virtual services on `kube-ipvs0`, the
/// link itself, and IPVS mode's ipsets. Run after kpr-iptables removed the IPVS-mode
/// rules (so the sets are no longer in use). Safe to run when nothing is there.
pub fn remove_kernel_leftovers() -> Report {
    let mut report = Report::default();
    nftables::remove_tables(&mut report);
    remove_ipvs_objects(&mut report);
    report
}

/// nftables mode's tables only: what an ipvs-mode proxy removes, keeping the IPVS objects
/// it adopts.
pub fn remove_nftables_leftovers() -> Report {
    let mut report = Report::default();
    nftables::remove_tables(&mut report);
    report
}

/// IPVS mode's kernel objects only (virtual services, `kube-ipvs0`, ipsets): what an
/// nftables-mode proxy removes, keeping the `kube-proxy` tables it adopts.
pub fn remove_ipvs_leftovers() -> Report {
    let mut report = Report::default();
    remove_ipvs_objects(&mut report);
    report
}

fn remove_ipvs_objects(report: &mut Report) {
    let object = format!("link {IPVS_LINK}");
    let found = IpvsLinks::open().and_then(|mut links| Ok((links.find()?, links)));
    match found {
        Ok((Some(link), mut links)) => {
            ipvs::remove_services_on(&link.addresses, report);
            match links.delete(&link) {
                Ok(true) => report.removed(object),
                Ok(false) => {}
                Err(error) => report.failed(LeftoverError::netlink(object, &error)),
            }
        }
        Ok((None, _)) => {}
        Err(error) => report.failed(LeftoverError::netlink(object, &error)),
    }
    remove_ipvs_sets(report);
}
