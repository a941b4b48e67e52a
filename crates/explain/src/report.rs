//! What an explanation says, independent of the mode that produced it, and its text form.

use std::fmt::Write as _;
use std::net::SocketAddr;

use kpr_model::IpFamily;

use crate::query::Query;

/// What the kernel does with a new connection to the destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// DNAT to one of the endpoints below.
    Forwarded,
    /// Refused with ICMP port unreachable (TCP too); the reason says why.
    Rejected(String),
    /// Dropped silently; the reason says why.
    Dropped(String),
}

/// How likely an endpoint is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Weight {
    /// nftables: slot `slot` of `count`, each drawn with probability 1/count.
    Slot { slot: u16, count: u16 },
    /// iptables: the share of new connections the statistic rules give it.
    Share(f64),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub weight: Weight,
    /// Known to run on this node (it is among the node-local endpoints of a Local policy).
    pub local: bool,
}

/// Endpoints one kind of traffic is spread over.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointGroup {
    /// Which traffic, e.g. "all traffic" or "traffic from pods and from this node".
    pub traffic: String,
    pub endpoints: Vec<Endpoint>,
}

/// One way the destination is handled: usually one per query and mode.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    /// What the destination is, e.g. "cluster IP" or "NodePort 30080 on node address 192.168.0.10".
    pub destination: String,
    /// `namespace/name:port`, when the kernel objects record it.
    pub service: Option<String>,
    /// A check of the whole table (wrong port of a cluster IP, unallocated address of a
    /// Service CIDR), not one Service's objects.
    pub table_wide: bool,
    pub outcome: Outcome,
    pub groups: Vec<EndpointGroup>,
    /// Policy decisions: masquerading, affinity, source ranges, Local policies.
    pub decisions: Vec<String>,
    /// The kernel objects that implement it, as the kernel names them.
    pub objects: Vec<String>,
}

/// What one mode's objects of one family say about the query.
#[derive(Clone, Debug, PartialEq)]
pub struct Section {
    /// Which mode's objects, and which of them, e.g. "nftables mode (table ip kube-proxy)".
    pub title: String,
    pub family: IpFamily,
    pub findings: Vec<Finding>,
}

/// The whole answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Explanation {
    pub query: Query,
    /// One per mode whose objects exist in this namespace, for the query's family.
    pub sections: Vec<Section>,
    /// What could not be read (a missing tool, a refused dump), said next to the answer.
    pub problems: Vec<String>,
    /// What every mode's objects are called, for the answer when none exist.
    pub looked_for: Vec<String>,
    /// Sections of modes that write beside another mode's objects (ebpf mode's socket maps
    /// beside nftables mode's tables): not another mode for the multi-mode note.
    pub add_ons: usize,
}

impl Explanation {
    /// Whether any mode maps the destination to something.
    pub fn found(&self) -> bool {
        self.sections.iter().any(|s| !s.findings.is_empty())
    }
}

fn weight_text(weight: Weight) -> String {
    match weight {
        Weight::Slot { slot, count } => {
            format!(
                "slot {slot} of {count} ({:.1} %)",
                100.0 / f64::from(count.max(1))
            )
        }
        Weight::Share(share) => format!("{:.1} %", share * 100.0),
    }
}

/// The text `kube-proxy-rs explain` prints.
pub fn render(explanation: &Explanation) -> String {
    let mut out = String::new();
    let query = &explanation.query;
    for problem in &explanation.problems {
        let _ = writeln!(out, "warning: {problem}");
    }
    if explanation.sections.is_empty() {
        let _ = writeln!(
            out,
            "{query}: no kube-proxy rules of this address family in this network namespace (looked for: {})",
            explanation.looked_for.join("; ")
        );
        return out;
    }
    if explanation.sections.len().saturating_sub(explanation.add_ons) > 1 {
        let _ = writeln!(
            out,
            "note: objects of more than one proxy mode exist here; each is explained (normally only one mode's objects are programmed: the others are leftovers)"
        );
    }
    for section in &explanation.sections {
        let _ = writeln!(out, "{}:", section.title);
        if section.findings.is_empty() {
            let _ = writeln!(
                out,
                "  {query}: nothing matches (no Service port, NodePort or cluster IP uses it)"
            );
        }
        for finding in &section.findings {
            render_finding(&mut out, query, finding);
        }
    }
    out
}

fn render_finding(out: &mut String, query: &Query, finding: &Finding) {
    match &finding.service {
        Some(service) => {
            let _ = writeln!(out, "  {query}: {} of {service}", finding.destination);
        }
        // A Service's own objects whose name the kernel objects read do not give.
        None if !finding.table_wide => {
            let _ = writeln!(
                out,
                "  {query}: {} of a Service (its name is not recorded in the kernel objects read)",
                finding.destination
            );
        }
        // Table-wide checks (wrong port of a cluster IP, unallocated address): no Service.
        None => {
            let _ = writeln!(out, "  {query}: {}", finding.destination);
        }
    }
    match &finding.outcome {
        Outcome::Forwarded => {}
        Outcome::Rejected(why) => {
            let _ = writeln!(out, "    REJECT: {why}");
        }
        Outcome::Dropped(why) => {
            let _ = writeln!(out, "    DROP: {why}");
        }
    }
    for group in &finding.groups {
        let _ = writeln!(
            out,
            "    {} -> {} endpoint(s):",
            group.traffic,
            group.endpoints.len()
        );
        for ep in &group.endpoints {
            let local = if ep.local { "  local" } else { "" };
            let _ = writeln!(
                out,
                "      {:<24} {}{local}",
                ep.addr.to_string(),
                weight_text(ep.weight)
            );
        }
    }
    if !finding.decisions.is_empty() {
        let _ = writeln!(out, "    policy:");
        for d in &finding.decisions {
            let _ = writeln!(out, "      - {d}");
        }
    }
    if !finding.objects.is_empty() {
        let _ = writeln!(out, "    kernel objects:");
        for o in &finding.objects {
            let _ = writeln!(out, "      {o}");
        }
    }
}
