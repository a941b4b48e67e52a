//! What upstream's (and our) ipvs mode leaves in the kernel, and its removal: when another
//! mode starts (upstream's platform cleanup) and on `--cleanup`. A node switched away from
//! ipvs mode otherwise keeps answering with stale virtual servers, and its filter rules
//! (KUBE-IPVS-FILTER rejects new connections to addresses in its sets) keep acting.
//!
//! - **Only what is provably the mode's.** Objects are found by the exact names upstream
//!   gives them (chains, sets, `kube-ipvs0`); a virtual server is the mode's when its address
//!   sits on `kube-ipvs0` ([`services`]), or when it sits on the node's address at a port
//!   the mode's NodePort sets hold ([`node_ports`]). Other sets, links and virtual servers
//!   (keepalived's, say) are never touched; upstream's `--cleanup` flushes every virtual
//!   server, this does not.
//! - **Order.** NodePort virtual servers are found through the sets, and virtual servers on
//!   `kube-ipvs0` while the link still shows their addresses; the iptables rules that match
//!   the sets go before the sets, since a set in use cannot be destroyed (the `sets` module).
//! - **Absent is fine.** A kernel without ipset or IPVS (this host's has no `ip_vs`) simply
//!   has nothing to remove.
//! - **Failures name the object**, and the other objects are still removed.

pub mod node_ports;
pub mod services;
mod sets;

use kpr_iptables::{Footprint, SavedRule, SavedTable, Table, remove_everywhere};
use kpr_ipvs_netlink::{IPVS_LINK, IpvsLinks};
use kpr_mode::Leftovers;
use kpr_naming::{chain, ipvs_chain};

use crate::ipset::IpsetNetlink;
use crate::sets::is_mode_set;

/// Removes everything the mode leaves, in the order above.
pub fn remove_all() -> Leftovers {
    let mut leftovers = Leftovers::default();
    match node_ports::remove_node_port_servers(&mut IpsetNetlink::default()) {
        Ok(keys) => {
            for key in keys {
                removed(&mut leftovers, format!("IPVS service {key}"));
            }
        }
        Err(error) => leftovers
            .failures
            .push(format!("IPVS NodePort services: {error}")),
    }
    leftovers.merge(remove_everywhere(&IpvsFootprint));
    remove_link_and_its_services(&mut leftovers);
    sets::remove_sets(&mut leftovers);
    leftovers
}

/// Records (and logs) one object removed.
fn removed(leftovers: &mut Leftovers, object: String) {
    tracing::info!(%object, "removed what another kube-proxy mode left");
    leftovers.removed.push(object);
}

fn remove_link_and_its_services(leftovers: &mut Leftovers) {
    let object = format!("link {IPVS_LINK}");
    let found = IpvsLinks::open().and_then(|mut links| Ok((links.find()?, links)));
    match found {
        Ok((Some(link), mut links)) => {
            services::remove_services_on(&link.addresses, leftovers);
            match links.delete(&link) {
                Ok(true) => removed(leftovers, object),
                Ok(false) => {}
                Err(error) => leftovers.failures.push(format!("{object}: {error}")),
            }
        }
        Ok((None, _)) => {}
        Err(error) => leftovers.failures.push(format!("{object}: {error}")),
    }
}

/// What the mode writes into iptables. It shares iptables mode's fixed chains (they stay:
/// whichever mode runs rewrites them) but deletes its rules in them, and creates chains of
/// its own (upstream's `iptablesCleanupChains` less the shared ones, plus the NAT-table
/// KUBE-FIREWALL of releases before 1.28).
#[derive(Clone, Copy, Debug, Default)]
pub struct IpvsFootprint;

impl IpvsFootprint {
    /// Chains only ipvs mode creates, per table.
    fn own_chains(table: Table) -> &'static [&'static str] {
        match table {
            Table::Nat => &[ipvs_chain::LOAD_BALANCER, ipvs_chain::NODE_PORT, "KUBE-FIREWALL"],
            Table::Filter => &[
                ipvs_chain::NODE_PORT,
                ipvs_chain::SOURCE_RANGES_FIREWALL,
                ipvs_chain::IPVS_FILTER,
                ipvs_chain::IPVS_OUT_FILTER,
            ],
            Table::Mangle => &[],
        }
    }
}

impl Footprint for IpvsFootprint {
    fn owns(&self, table: Table, name: &str, _saved: &SavedTable) -> bool {
        Self::own_chains(table).contains(&name)
    }

    /// The chains it shares with iptables mode.
    fn writes_into(&self, table: Table, name: &str) -> bool {
        let shared: &[&str] = match table {
            Table::Nat => &[chain::SERVICES, chain::POSTROUTING, chain::MARK_MASQ],
            Table::Filter => &[chain::FORWARD, chain::PROXY_FIREWALL],
            Table::Mangle => &[],
        };
        shared.contains(&name)
    }

    /// Its rules matching its sets: `-m set --match-set <name> ...`.
    fn owns_rule(&self, rule: &SavedRule) -> bool {
        rule.words()
            .windows(2)
            .any(|pair| pair[0] == "--match-set" && is_mode_set(&pair[1]))
    }
}

#[cfg(test)]
mod tests;
