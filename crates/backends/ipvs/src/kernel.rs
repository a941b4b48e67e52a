//! The IPVS table's side of a sync: reading it into [`KernelService`]s and writing
//! [`Operation`]s, through kpr-ipvs-netlink in the calling thread's namespace.

use kpr_ipvs_netlink::{Ipvs, NetlinkError};

use crate::reconcile::{KernelService, Operation};

/// A failed read or write of the IPVS table; `operation` names the write that failed.
#[derive(Debug, thiserror::Error)]
#[error("IPVS {what}: {source}")]
pub struct IpvsError {
    pub what: String,
    #[source]
    pub source: NetlinkError,
}

/// Every virtual server the kernel lists, with its real servers. Listed objects kube-proxy
/// does not model (firewall marks, other forwarding methods) are not returned; the reasons
/// for unreadable ones are, for the caller to log.
pub fn read(ipvs: &mut Ipvs) -> Result<(Vec<KernelService>, Vec<String>), IpvsError> {
    let failed = |what: &str| {
        let what = what.to_string();
        move |source| IpvsError { what, source }
    };
    let listing = ipvs.services().map_err(failed("listing virtual servers"))?;
    let mut unreadable = listing.unreadable;
    let mut services = Vec::with_capacity(listing.objects.len());
    for service in listing.objects {
        let destinations = ipvs
            .destinations(&service.key)
            .map_err(failed(&format!("listing the real servers of {}", service.key)))?;
        unreadable.extend(destinations.unreadable);
        services.push(KernelService {
            service,
            destinations: destinations.objects,
        });
    }
    Ok((services, unreadable))
}

/// Writes `operations` in order; stops at the first failure, which it names.
pub fn apply(ipvs: &mut Ipvs, operations: &[Operation]) -> Result<(), IpvsError> {
    for operation in operations {
        let result = match operation {
            Operation::AddService(service) => ipvs.add_service(service),
            Operation::UpdateService(service) => ipvs.update_service(service),
            Operation::DeleteService(key) => ipvs.delete_service(key),
            Operation::AddDestination(key, destination) => ipvs.add_destination(key, destination),
            Operation::UpdateDestination(key, destination) => ipvs.update_destination(key, destination),
            Operation::DeleteDestination(key, destination) => ipvs.delete_destination(key, destination),
        };
        result.map_err(|source| IpvsError {
            what: describe(operation),
            source,
        })?;
    }
    Ok(())
}

fn describe(operation: &Operation) -> String {
    match operation {
        Operation::AddService(service) => format!("adding virtual server {}", service.key),
        Operation::UpdateService(service) => format!("updating virtual server {}", service.key),
        Operation::DeleteService(key) => format!("deleting virtual server {key}"),
        Operation::AddDestination(key, d) => format!("adding real server {} to {key}", d.socket()),
        Operation::UpdateDestination(key, d) => {
            format!(
                "setting real server {} of {key} to weight {}",
                d.socket(),
                d.weight
            )
        }
        Operation::DeleteDestination(key, d) => format!("deleting real server {} of {key}", d.socket()),
    }
}
