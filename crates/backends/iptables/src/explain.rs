//! iptables mode: follows an address through `iptables-save` output of the nat and filter
//! tables (KUBE-SERVICES, KUBE-NODEPORTS, KUBE-EXT-, KUBE-FW-, KUBE-SVC-, KUBE-SVL-,
//! KUBE-SEP- chains; the filter table's REJECT/DROP rules), reading the Service names from
//! the rule comments and the endpoints' shares from the statistic probabilities.
//!
//! Rules are split into arguments by kpr-iptables' restore tokenizer and read by option,
//! not by position, so the order `iptables-save` prints options in does not matter.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use kpr_explain::{Endpoint, EndpointGroup, Explainer, Finding, Outcome, Query, Section, Weight};
use kpr_model::IpFamily;

use crate::exec::{Iptables, IptablesCli, Variant};
use crate::restore_syntax::split_args;

/// iptables mode's reader: `iptables-save` of nat and filter, from the flavour holding kube
/// rules (as the mode picks it).
#[derive(Clone, Copy, Debug, Default)]
pub struct IptablesExplainer;

impl Explainer for IptablesExplainer {
    fn looks_for(&self, family: IpFamily) -> String {
        format!("the KUBE-SERVICES chain of {} nat", tool(family))
    }

    fn explain(&self, query: &Query, local_addresses: &[IpAddr]) -> Result<Option<Section>, String> {
        let family = query.family();
        let cli = IptablesCli::new(family, Variant::Auto);
        let nat = cli
            .save(crate::Table::Nat)
            .map_err(|e| format!("reading the iptables nat table: {e}"))?;
        if !has_kube_services(&nat) {
            return Ok(None);
        }
        let filter = cli
            .save(crate::Table::Filter)
            .map_err(|e| format!("reading the iptables filter table: {e}"))?;
        Ok(Some(Section {
            title: title(family),
            family,
            findings: explain(&nat, &filter, local_addresses, query),
        }))
    }
}

fn tool(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "iptables",
        IpFamily::V6 => "ip6tables",
    }
}

/// The heading of this mode's section.
pub fn title(family: IpFamily) -> String {
    format!("iptables mode ({} nat/filter)", tool(family))
}

/// One `-A` line, split into arguments.
#[derive(Clone, Debug)]
struct Rule {
    chain: String,
    args: Vec<String>,
}

impl Rule {
    /// The value after `option` and whether it is negated (`! option value`).
    fn value(&self, option: &str) -> Option<(&str, bool)> {
        let at = self.args.iter().position(|a| a == option)?;
        let value = self.args.get(at + 1)?;
        let negated = at > 0 && self.args.get(at - 1).is_some_and(|a| a == "!");
        Some((value.as_str(), negated))
    }

    fn plain(&self, option: &str) -> Option<&str> {
        self.value(option).filter(|(_, negated)| !negated).map(|(v, _)| v)
    }

    fn has(&self, word: &str) -> bool {
        self.args.iter().any(|a| a == word)
    }

    fn target(&self) -> Option<&str> {
        self.plain("-j").or_else(|| self.plain("-g"))
    }

    fn comment(&self) -> Option<&str> {
        self.plain("--comment")
    }

    /// Whether `-d` names `ip` (`None`: the rule has no `-d`).
    fn dest_is(&self, ip: IpAddr) -> Option<bool> {
        let (value, negated) = self.value("-d")?;
        Some(!negated && net_contains(value, ip))
    }

    fn proto_port_is(&self, query: &Query) -> bool {
        self.plain("-p") == Some(query.protocol.lower())
            && self.plain("--dport").and_then(|p| p.parse::<u16>().ok()) == Some(query.port)
    }

    /// The rule as `iptables-save` prints it (arguments with blanks quoted).
    fn text(&self) -> String {
        let args: Vec<String> = self
            .args
            .iter()
            .map(|a| {
                if a.contains(' ') {
                    format!("\"{a}\"")
                } else {
                    a.clone()
                }
            })
            .collect();
        format!("-A {} {}", self.chain, args.join(" "))
    }
}

fn net_contains(value: &str, ip: IpAddr) -> bool {
    match value.parse::<IpNet>() {
        Ok(net) => net.contains(&ip),
        Err(_) => value.parse::<IpAddr>() == Ok(ip),
    }
}

/// One table of `iptables-save` output.
#[derive(Clone, Debug, Default)]
struct Table {
    rules: Vec<Rule>,
}

impl Table {
    fn parse(saved: &str) -> Self {
        let rules = saved
            .lines()
            .filter_map(|line| line.strip_prefix("-A "))
            .filter_map(|rest| {
                let (chain, args) = rest.split_once(' ').unwrap_or((rest, ""));
                Some(Rule {
                    chain: chain.to_string(),
                    args: split_args(args).ok()?,
                })
            })
            .collect();
        Self { rules }
    }

    fn chain<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Rule> + 'a {
        self.rules.iter().filter(move |r| r.chain == name)
    }
}

/// Whether this output holds kube-proxy rules (the mode's marker chain).
pub fn has_kube_services(nat: &str) -> bool {
    nat.lines()
        .any(|l| l.starts_with(":KUBE-SERVICES ") || l == ":KUBE-SERVICES")
}

/// What the iptables rules do with a new connection to `query`. `nat` and `filter`:
/// `iptables-save -t nat` / `-t filter` output; `local_addresses`: this host's addresses.
pub fn explain(nat: &str, filter: &str, local_addresses: &[IpAddr], query: &Query) -> Vec<Finding> {
    let nat = Table::parse(nat);
    let filter = Table::parse(filter);
    let mut findings: Vec<Finding> = Vec::new();
    // Cluster IPs, external IPs and load-balancer IPs.
    for rule in nat.chain("KUBE-SERVICES") {
        if rule.dest_is(query.ip) == Some(true) && rule.proto_port_is(query) {
            let Some(target) = rule.target() else { continue };
            let (service, kind) = split_comment(rule.comment());
            let mut finding = new_finding(kind.unwrap_or("Service address"), service);
            finding.objects.push(rule.text());
            walk(&nat, target, "all traffic", &mut finding, query.ip, 0);
            findings.push(finding);
        }
    }
    for rule in filter_verdicts(&filter) {
        if rule.dest_is(query.ip) == Some(true) && rule.proto_port_is(query) {
            attach_verdict(
                &mut findings,
                rule,
                "Service address (cluster IP, external IP or load-balancer IP)",
            );
        }
    }
    // NodePorts, on the addresses that accept them.
    if accepts_node_ports(&nat, local_addresses, query.ip) {
        let destination = format!(
            "NodePort {}/{} on node address {}",
            query.port,
            query.protocol.lower(),
            query.ip
        );
        let before = findings.len();
        for rule in nat.chain("KUBE-NODEPORTS") {
            if rule.proto_port_is(query)
                && let Some(target) = rule.target()
            {
                let (service, _) = split_comment(rule.comment());
                let mut finding = new_finding(&destination, service);
                finding.objects.push(rule.text());
                walk(&nat, target, "all traffic", &mut finding, query.ip, 0);
                findings.push(finding);
            }
        }
        for rule in filter_verdicts(&filter) {
            let local_dest =
                rule.plain("--dst-type") == Some("LOCAL") || rule.dest_is(query.ip) == Some(true);
            if rule.dest_is(query.ip) != Some(true) && local_dest && rule.proto_port_is(query) {
                let mut nodeports: Vec<Finding> = findings.drain(before..).collect();
                attach_verdict(&mut nodeports, rule, &destination);
                findings.extend(nodeports);
            }
        }
    }
    for finding in &mut findings {
        mark_local(finding);
        dedup(&mut finding.decisions);
        dedup(&mut finding.objects);
    }
    findings
}

fn new_finding(destination: &str, service: Option<&str>) -> Finding {
    Finding {
        destination: destination.to_string(),
        service: service.map(str::to_string),
        table_wide: false,
        outcome: Outcome::Forwarded,
        groups: Vec::new(),
        decisions: Vec::new(),
        objects: Vec::new(),
    }
}

/// `"ns/svc:port cluster IP"` -> (`ns/svc:port`, `cluster IP`).
fn split_comment(comment: Option<&str>) -> (Option<&str>, Option<&str>) {
    match comment {
        None => (None, None),
        Some(text) => match text.split_once(' ') {
            Some((service, kind)) => (Some(service), Some(kind)),
            None => (Some(text), None),
        },
    }
}

/// The filter table's per-Service REJECT and DROP rules.
fn filter_verdicts(filter: &Table) -> impl Iterator<Item = &Rule> {
    ["KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-PROXY-FIREWALL"]
        .into_iter()
        .flat_map(|chain| filter.chain(chain))
        .filter(|r| matches!(r.target(), Some("REJECT") | Some("DROP")))
}

/// Adds a filter REJECT/DROP to the finding of the same Service, or as its own finding.
fn attach_verdict(findings: &mut Vec<Finding>, rule: &Rule, destination: &str) {
    let (service, why) = split_comment(rule.comment());
    let why = why.unwrap_or("a filter rule").to_string();
    let reason = format!(
        "{why} (filter {}: -j {})",
        rule.chain,
        rule.target().unwrap_or_default()
    );
    let outcome = if rule.target() == Some("REJECT") {
        Outcome::Rejected(reason)
    } else if rule.chain == "KUBE-PROXY-FIREWALL" {
        Outcome::Dropped(format!("source not in loadBalancerSourceRanges: {reason}"))
    } else {
        Outcome::Dropped(reason)
    };
    let index = match findings.iter().position(|f| f.service.as_deref() == service) {
        Some(index) => index,
        None => {
            findings.push(new_finding(destination, service));
            findings.len() - 1
        }
    };
    let Some(finding) = findings.get_mut(index) else {
        return;
    };
    finding.objects.push(format!("filter: {}", rule.text()));
    // The firewall only drops sources outside the ranges: a decision, not the outcome.
    if rule.chain == "KUBE-PROXY-FIREWALL" && !finding.groups.is_empty() {
        finding.decisions.push(format!(
            "sources outside loadBalancerSourceRanges are dropped (filter {})",
            rule.chain
        ));
    } else {
        finding.outcome = outcome;
    }
}

/// Whether NodePorts are served on `ip`: the KUBE-SERVICES tail jumps to KUBE-NODEPORTS
/// for local addresses (`--dst-type LOCAL`) or for the `--nodeport-addresses` ones.
fn accepts_node_ports(nat: &Table, local_addresses: &[IpAddr], ip: IpAddr) -> bool {
    nat.chain("KUBE-SERVICES")
        .filter(|r| r.target() == Some("KUBE-NODEPORTS"))
        .any(|r| match r.dest_is(ip) {
            Some(matches) => matches,
            None => {
                r.plain("--dst-type") == Some("LOCAL") && !ip.is_loopback() && local_addresses.contains(&ip)
            }
        })
}

/// Who a rule applies to, from its source matches.
fn traffic_of(rule: &Rule) -> Option<String> {
    if let Some((net, negated)) = rule.value("-s") {
        return Some(if negated {
            format!("traffic not from {net}")
        } else {
            format!("traffic from {net}")
        });
    }
    (rule.plain("--src-type") == Some("LOCAL")).then(|| "traffic from this node".to_string())
}

fn walk(nat: &Table, chain: &str, traffic: &str, finding: &mut Finding, ip: IpAddr, depth: usize) {
    if depth > 4 {
        return;
    }
    if chain.starts_with("KUBE-SVC-") || chain.starts_with("KUBE-SVL-") {
        endpoints(nat, chain, traffic, finding, ip);
    } else if chain.starts_with("KUBE-EXT-") {
        external(nat, chain, finding, ip, depth);
    } else if chain.starts_with("KUBE-FW-") {
        firewall(nat, chain, finding, ip, depth);
    } else {
        finding.decisions.push(format!("goes to {chain}"));
    }
}

fn external(nat: &Table, chain: &str, finding: &mut Finding, ip: IpAddr, depth: usize) {
    let mut local_policy = false;
    let mut reaches_local = false;
    for rule in nat.chain(chain) {
        finding.objects.push(rule.text());
        match rule.target() {
            Some("KUBE-MARK-MASQ") => {
                let who = traffic_of(rule).unwrap_or_else(|| "all external traffic".into());
                finding.decisions.push(format!("{who} is masqueraded ({chain})"));
            }
            Some(target) if target.starts_with("KUBE-SVC-") || target.starts_with("KUBE-SVL-") => {
                let who = traffic_of(rule);
                let conditional = who.is_some();
                reaches_local |= target.starts_with("KUBE-SVL-");
                let who = who.unwrap_or_else(|| {
                    if local_policy {
                        "other traffic"
                    } else {
                        "all traffic"
                    }
                    .to_string()
                });
                local_policy |= conditional;
                walk(nat, target, &who, finding, ip, depth + 1);
            }
            _ => {}
        }
    }
    if local_policy {
        finding.decisions.push(
            "externalTrafficPolicy Local: client source addresses are kept; pods and this node may use every endpoint".into(),
        );
        if !reaches_local {
            finding
                .decisions
                .push("no endpoint on this node: traffic from outside the node is dropped".into());
        }
    } else {
        finding.decisions.push("externalTrafficPolicy Cluster".into());
    }
}

fn firewall(nat: &Table, chain: &str, finding: &mut Finding, ip: IpAddr, depth: usize) {
    let mut ranges = Vec::new();
    let mut next = None;
    for rule in nat.chain(chain) {
        finding.objects.push(rule.text());
        if let (Some(target), Some(source)) = (rule.target(), rule.plain("-s")) {
            ranges.push(source.to_string());
            next.get_or_insert(target.to_string());
        }
    }
    finding.decisions.push(format!(
        "loadBalancerSourceRanges: only sources in [{}] are accepted; others are dropped ({chain}, KUBE-PROXY-FIREWALL)",
        ranges.join(", ")
    ));
    if let Some(next) = next {
        walk(nat, &next, "accepted sources", finding, ip, depth + 1);
    }
}

/// A KUBE-SVC-/KUBE-SVL- chain: its endpoints with the shares the statistic rules give.
fn endpoints(nat: &Table, chain: &str, traffic: &str, finding: &mut Finding, ip: IpAddr) {
    let local = chain.starts_with("KUBE-SVL-");
    let mut remaining = 1.0_f64;
    let mut group = EndpointGroup {
        traffic: if local {
            format!("{traffic} (only endpoints on this node)")
        } else {
            traffic.to_string()
        },
        endpoints: Vec::new(),
    };
    for rule in nat.chain(chain) {
        finding.objects.push(rule.text());
        let Some(target) = rule.target() else { continue };
        if target == "KUBE-MARK-MASQ" {
            // The cluster-IP rule sits in the shared chain; it matters only for the cluster IP.
            if rule.dest_is(ip) == Some(false) {
                continue;
            }
            let who = traffic_of(rule).unwrap_or_else(|| "all traffic".into());
            finding
                .decisions
                .push(format!("{who} to the cluster IP is masqueraded ({chain})"));
            continue;
        }
        if !target.starts_with("KUBE-SEP-") {
            continue;
        }
        if rule.has("--rcheck") {
            let seconds = rule.plain("--seconds").unwrap_or("?");
            let decision =
                format!("sessionAffinity ClientIP, timeout {seconds} s (-m recent, per endpoint chain)");
            if !finding.decisions.contains(&decision) {
                finding.decisions.push(decision);
            }
            continue;
        }
        let probability = rule
            .plain("--probability")
            .and_then(|p| p.parse::<f64>().ok())
            .unwrap_or(1.0);
        let share = remaining * probability;
        remaining -= share;
        for sep in nat.chain(target) {
            finding.objects.push(sep.text());
            if sep.target() == Some("KUBE-MARK-MASQ") {
                let decision =
                    "hairpin: an endpoint reaching itself is masqueraded (KUBE-SEP- chains)".to_string();
                if !finding.decisions.contains(&decision) {
                    finding.decisions.push(decision);
                }
            }
            if let Some(addr) = sep
                .plain("--to-destination")
                .and_then(|d| d.parse::<SocketAddr>().ok())
            {
                group.endpoints.push(Endpoint {
                    addr,
                    weight: Weight::Share(share),
                    local,
                });
            }
        }
    }
    finding.groups.push(group);
}

/// Endpoints of a node-local chain are local wherever else they appear.
fn mark_local(finding: &mut Finding) {
    let local: Vec<SocketAddr> = finding
        .groups
        .iter()
        .flat_map(|g| g.endpoints.iter().filter(|e| e.local).map(|e| e.addr))
        .collect();
    for group in &mut finding.groups {
        for ep in &mut group.endpoints {
            ep.local |= local.contains(&ep.addr);
        }
    }
}

/// A chain reached twice (pod traffic and node traffic to one KUBE-SVC-) is told once.
fn dedup(lines: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    lines.retain(|line| seen.insert(line.clone()));
}
