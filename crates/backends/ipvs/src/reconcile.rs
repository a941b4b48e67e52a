//! From what the kernel's IPVS table holds to what the plan wants, as a list of operations
//! (pure); and graceful termination, which keeps a removed real server at weight 0 until
//! its connections are gone (`UPSTREAM.md` §5.1-§5.2).
//!
//! Only differences become operations, so a sync where nothing changed writes nothing. A
//! virtual server the plan does not hold is deleted when the caller says it is the mode's
//! to delete (its family, outside `--ipvs-exclude-cidrs`), as upstream deletes every such
//! server of its family. A removed TCP real server with connections is not deleted: it
//! gets weight 0 (no new connections) and waits in [`Graceful`]; every later sync deletes
//! the ones whose connection counts reached zero. UDP and SCTP real servers are deleted at
//! once (the kernel expires their flows on the next packet), as upstream.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use kpr_ipvs_netlink::{Destination, Protocol, Service, ServiceKey};

use crate::plan::VirtualServer;

/// The weight of every real server kube-proxy adds, as upstream's.
pub const WEIGHT: u32 = 1;

/// A virtual server as the kernel lists it, with its real servers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelService {
    pub service: Service,
    pub destinations: Vec<Destination>,
}

/// One change to the kernel's IPVS table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operation {
    AddService(Service),
    UpdateService(Service),
    DeleteService(ServiceKey),
    AddDestination(ServiceKey, Destination),
    /// A new weight for a real server that stays (1 again, or 0 to drain it).
    UpdateDestination(ServiceKey, Destination),
    DeleteDestination(ServiceKey, Destination),
}

/// Real servers draining at weight 0: (virtual server, real server).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Graceful {
    draining: BTreeSet<(ServiceKey, SocketAddr)>,
}

impl Graceful {
    pub fn len(&self) -> usize {
        self.draining.len()
    }

    pub fn is_empty(&self) -> bool {
        self.draining.is_empty()
    }

    /// Whether a real server of `key`'s virtual server is draining.
    pub fn has_server(&self, key: &ServiceKey) -> bool {
        self.draining.iter().any(|(server, _)| server == key)
    }

    pub fn contains(&self, key: &ServiceKey, real: SocketAddr) -> bool {
        self.draining.contains(&(*key, real))
    }
}

/// What one sync must do to the IPVS table. `first_sync`: real servers a previous process
/// left at another weight are set back to [`WEIGHT`]. `owns`: whether a virtual server the
/// plan lacks is this mode's to delete.
pub fn reconcile(
    wanted: &BTreeMap<ServiceKey, VirtualServer>,
    kernel: &[KernelService],
    graceful: &mut Graceful,
    first_sync: bool,
    owns: impl Fn(&ServiceKey) -> bool,
) -> Vec<Operation> {
    let listed: BTreeMap<ServiceKey, &KernelService> = kernel.iter().map(|k| (k.service.key, k)).collect();
    let mut operations = Vec::new();
    for (key, server) in wanted {
        match listed.get(key) {
            None => {
                operations.push(Operation::AddService(server.service.clone()));
                for &real in &server.real_servers {
                    operations.push(Operation::AddDestination(*key, new_destination(real, WEIGHT)));
                }
            }
            Some(current) => {
                if !same_settings(&current.service, &server.service) {
                    operations.push(Operation::UpdateService(server.service.clone()));
                }
                reconcile_destinations(server, current, graceful, first_sync, &mut operations);
            }
        }
    }
    for key in listed.keys() {
        if !wanted.contains_key(key) && owns(key) {
            operations.push(Operation::DeleteService(*key));
            graceful.draining.retain(|(server, _)| server != key);
        }
    }
    operations
}

/// The settings `ipvsadm -E` changes: scheduler, flags (the kernel's own bits are already
/// dropped when listed), persistence timeout and netmask.
fn same_settings(current: &Service, wanted: &Service) -> bool {
    current.scheduler == wanted.scheduler
        && current.flags == wanted.flags
        && current.timeout == wanted.timeout
        && current.netmask == wanted.netmask
}

fn reconcile_destinations(
    server: &VirtualServer,
    current: &KernelService,
    graceful: &mut Graceful,
    first_sync: bool,
    operations: &mut Vec<Operation>,
) {
    let key = server.service.key;
    let listed: BTreeMap<SocketAddr, &Destination> =
        current.destinations.iter().map(|d| (d.socket(), d)).collect();
    for &real in &server.real_servers {
        match listed.get(&real) {
            None => operations.push(Operation::AddDestination(key, new_destination(real, WEIGHT))),
            Some(destination) => {
                let back_from_draining = graceful.draining.remove(&(key, real));
                let reset_weight = destination.weight != WEIGHT && (back_from_draining || first_sync);
                // Someone else made it forward another way: kube-proxy's real servers masquerade.
                if reset_weight || !destination.masquerades {
                    operations.push(Operation::UpdateDestination(key, new_destination(real, WEIGHT)));
                }
            }
        }
    }
    for (real, destination) in listed {
        if server.real_servers.contains(&real) {
            continue;
        }
        if graceful.draining.contains(&(key, real)) {
            if idle(destination) {
                graceful.draining.remove(&(key, real));
                operations.push(Operation::DeleteDestination(key, *destination));
            }
            continue;
        }
        if key.protocol != Protocol::Tcp || idle(destination) {
            operations.push(Operation::DeleteDestination(key, *destination));
        } else {
            graceful.draining.insert((key, real));
            if destination.weight != 0 {
                operations.push(Operation::UpdateDestination(key, new_destination(real, 0)));
            }
        }
    }
    graceful
        .draining
        .retain(|(server, real)| *server != key || current.destinations.iter().any(|d| d.socket() == *real));
}

fn idle(destination: &Destination) -> bool {
    destination.active_connections == 0 && destination.inactive_connections == 0
}

fn new_destination(real: SocketAddr, weight: u32) -> Destination {
    Destination::new(real.ip(), real.port(), weight)
}

#[cfg(test)]
mod tests;
