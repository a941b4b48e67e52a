//! The userspace mode's portal in front of HAProxy: the same `REDIRECT` from the cluster IP
//! that kube-proxy-rs's `KUBE-PORTALS-CONTAINER` writes, leading to HAProxy's port instead
//! of the proxy's listener. The row through it shows what the portal itself costs (NAT and
//! conntrack in the node's kernel): HAProxy is otherwise reached on the node's address,
//! without either.
//!
//! The rules are pure ([`rules`]); [`Portal`] adds them in the node namespace and deletes
//! them when dropped, also when the row failed.

use std::process::Command;

use std::net::Ipv4Addr;

use kpr_netns::Netns;

use super::cluster::Port;

/// The arguments after `iptables -t nat -A|-D` of each port's rule: `vip`'s Service ports
/// lead to HAProxy's.
pub fn rules(vip: Ipv4Addr, ports: &[Port]) -> Vec<Vec<String>> {
    ports
        .iter()
        .map(|port| {
            [
                "PREROUTING".to_string(),
                "-d".to_string(),
                format!("{vip}/32"),
                "-p".to_string(),
                "tcp".to_string(),
                "--dport".to_string(),
                port.service.to_string(),
                "-j".to_string(),
                "REDIRECT".to_string(),
                "--to-ports".to_string(),
                port.haproxy.to_string(),
            ]
            .into()
        })
        .collect()
}

/// The rules, in place in `netns` until dropped.
pub struct Portal<'a> {
    netns: &'a Netns,
    added: Vec<Vec<String>>,
}

impl<'a> Portal<'a> {
    pub fn add(netns: &'a Netns, vip: Ipv4Addr, ports: &[Port]) -> Result<Self, String> {
        let mut portal = Self {
            netns,
            added: Vec::new(),
        };
        for rule in rules(vip, ports) {
            iptables(netns, "-A", &rule)?;
            portal.added.push(rule);
        }
        Ok(portal)
    }

    /// Deletes the rules; `Err` names the first that could not be deleted.
    pub fn remove(mut self) -> Result<(), String> {
        self.delete()
    }

    fn delete(&mut self) -> Result<(), String> {
        let mut first_error = None;
        for rule in std::mem::take(&mut self.added) {
            if let Err(why) = iptables(self.netns, "-D", &rule) {
                first_error.get_or_insert(why);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Portal<'_> {
    fn drop(&mut self) {
        if let Err(why) = self.delete() {
            eprintln!("[l4] {why}");
        }
    }
}

fn iptables(netns: &Netns, action: &str, rule: &[String]) -> Result<(), String> {
    let mut command: Command = netns.command("iptables");
    command.args(["-w", "5", "-t", "nat", action]).args(rule);
    let out = command
        .output()
        .map_err(|e| format!("iptables {action} in {}: {e}", netns.name()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "iptables -t nat {action} {} in {}: {}",
            rule.join(" "),
            netns.name(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::l4::cluster::{BULK, CLUSTER_IP, RR};

    /// The cluster IP's ports lead to HAProxy's, as a portal leads to a listener.
    #[test]
    fn each_service_port_is_redirected_to_haproxys() {
        let text: Vec<String> = rules(CLUSTER_IP, &[BULK, RR])
            .iter()
            .map(|r| r.join(" "))
            .collect();
        assert_eq!(
            text,
            [
                "PREROUTING -d 10.96.0.10/32 -p tcp --dport 5001 -j REDIRECT --to-ports 15001",
                "PREROUTING -d 10.96.0.10/32 -p tcp --dport 80 -j REDIRECT --to-ports 18080",
            ]
        );
    }
}
