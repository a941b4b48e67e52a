//! UDP flows that still point at a listener that is gone.
//!
//! A portal's REDIRECT is remembered by conntrack per flow: a UDP client that keeps its
//! source port (a resolver, say) keeps being sent to the listener port its first datagram
//! was redirected to, for as long as it keeps sending, even after that port was closed (the
//! Service was deleted, or recreated on another port). Upstream's userspace proxy deleted
//! such entries when a UDP Service went away; here every UDP port that closed or opened in
//! a sync has the entries to its addresses removed unless they lead to its current
//! listener, once the new portals are in (earlier, the old ones would re-create them).
//!
//! The decision is pure ([`stale`]); the listing and deletion are kpr-conntrack's.

use kpr_conntrack::{ConntrackTable, Scope, UdpEntry};
use kpr_model::{IpFamily, ServicePort};

/// Where a UDP service port's flows are found: its addresses and, if it has one, its
/// NodePort on any address.
pub fn scopes(port: &ServicePort) -> Vec<Scope> {
    let mut scopes: Vec<Scope> = std::iter::once(port.cluster_ip)
        .chain(port.external_ips.iter().copied())
        .chain(port.load_balancer_ips.iter().copied())
        .map(|ip| Scope::To(std::net::SocketAddr::new(ip, port.port)))
        .collect();
    scopes.extend(port.node_port.map(Scope::ToPort));
    scopes.dedup();
    scopes
}

/// The entries of `listing` that do not lead to `listener` (the port's current listener
/// port; `None`: the port has none any more, so every entry to it is stale).
pub fn stale(entries: &[UdpEntry], listener: Option<u16>) -> Vec<UdpEntry> {
    entries
        .iter()
        .filter(|entry| Some(entry.reply.src.port()) != listener)
        .copied()
        .collect()
}

/// Deletes the stale entries in `scopes`; returns how many went. Failures are logged:
/// a stale flow then lasts until the client pauses, as before this cleanup existed.
pub fn remove_stale(
    table: &mut dyn ConntrackTable,
    family: IpFamily,
    scopes: &[Scope],
    listener: Option<u16>,
) -> usize {
    let mut deleted = 0;
    for &scope in scopes {
        match table.udp_entries(family, scope) {
            Ok(listing) => {
                let doomed = stale(&listing.entries, listener);
                if doomed.is_empty() {
                    continue;
                }
                let deletion = table.delete(&doomed);
                deleted += deletion.deleted;
                if let Some(error) = deletion.first_error {
                    tracing::warn!(?scope, %error, failed = deletion.failed, "stale UDP flows not deleted");
                }
            }
            Err(error) => tracing::warn!(?scope, %error, "cannot list UDP flows"),
        }
    }
    deleted
}

#[cfg(test)]
mod tests {
    use kpr_conntrack::FlowTuple;

    use super::*;

    fn entry(redirected_to: u16) -> UdpEntry {
        UdpEntry {
            original: FlowTuple {
                src: "10.244.1.5:5000".parse().unwrap_or_else(|_| unreachable!()),
                dst: "10.96.0.53:53".parse().unwrap_or_else(|_| unreachable!()),
            },
            reply: FlowTuple {
                src: std::net::SocketAddr::from(([10, 244, 1, 1], redirected_to)),
                dst: "10.244.1.5:5000".parse().unwrap_or_else(|_| unreachable!()),
            },
            id: Some(7),
            zone: None,
        }
    }

    #[test]
    fn flows_to_another_listener_or_to_none_are_stale() {
        let entries = [entry(40001), entry(40002)];
        assert_eq!(stale(&entries, Some(40002)), [entry(40001)]);
        assert_eq!(stale(&entries, None), entries);
        assert!(stale(&entries[1..], Some(40002)).is_empty());
    }
}
