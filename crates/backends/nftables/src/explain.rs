//! nftables mode: follows an address through our table as the kernel would (the entry set
//! holding it and its dispatch rule, the no-endpoint sets, the shared chain the entry goes
//! to, the endpoint map slots it draws from) and says what each step decides.

use std::net::IpAddr;

use ipnet::IpNet;
use kpr_explain::{Endpoint, EndpointGroup, Explainer, Finding, Outcome, Query, Section, Weight};
use kpr_model::IpFamily;
use kpr_model::Protocol;
use kpr_nfnetlink::{Family, Socket, Table};

use self::table::{Entry, GroupKey, Verdict, addr_number, parse_chain_name};
pub use self::table::{NftTable, comment_of_userdata, parse_set_name};
use crate::names::{ChainId, Choice, EntryKind, FixedChain, SetName, SharedChain};
use crate::render::TABLE;

pub mod table;

/// nftables mode's reader: our table of the query's family, over netlink (typed dumps, no
/// `nft` process). The Service name comes from the entry elements' comments.
#[derive(Clone, Copy, Debug, Default)]
pub struct NftablesExplainer;

impl Explainer for NftablesExplainer {
    fn looks_for(&self, family: IpFamily) -> String {
        format!("table {} {TABLE}", nl_family(family))
    }

    fn explain(&self, query: &Query, local_addresses: &[IpAddr]) -> Result<Option<Section>, String> {
        let family = query.family();
        let Some(table) = read_nftables(family)? else {
            return Ok(None);
        };
        Ok(Some(Section {
            title: title(family),
            family,
            findings: explain(&table, local_addresses, query),
        }))
    }
}

/// The heading of this mode's section.
pub fn title(family: IpFamily) -> String {
    format!("nftables mode (table {} {TABLE})", nl_family(family))
}

fn nl_family(family: IpFamily) -> Family {
    match family {
        IpFamily::V4 => Family::Ip,
        IpFamily::V6 => Family::Ip6,
    }
}

/// Our table of `family`, or `None` when it does not exist.
fn read_nftables(family: IpFamily) -> Result<Option<NftTable>, String> {
    let nl_family = nl_family(family);
    let table = Table::new(nl_family, TABLE);
    let fail =
        |what: &str, e: kpr_nfnetlink::Error| format!("reading {what} of table {table} over netlink: {e}");
    let mut socket = Socket::open().map_err(|e| fail("the tables", e))?;
    let tables = socket
        .tables(Some(nl_family))
        .map_err(|e| fail("the tables", e))?;
    if !tables.iter().any(|t| t.table == table) {
        return Ok(None);
    }
    let chains = socket.chains(&table).map_err(|e| fail("the chains", e))?;
    let sets = socket.sets(&table).map_err(|e| fail("the sets", e))?;
    let mut contents = Vec::new();
    for set in sets {
        // Affinity sets hold clients, not configuration, and can be large.
        if matches!(parse_set_name(&set.name), Some(SetName::Affinity(_))) {
            continue;
        }
        let elements = socket
            .elements(&table, &set.name)
            .map_err(|e| fail(&format!("the elements of {}", set.name), e))?;
        contents.push((set.name, elements));
    }
    let rules = socket.rules(&table, None).map_err(|e| fail("the rules", e))?;
    let names = chains.into_iter().map(|c| c.chain.name);
    Ok(Some(
        NftTable::from_kernel(family, names, &contents).with_rules(&rules),
    ))
}

/// What the table does with a new connection to `query`. `local_addresses`: this host's
/// addresses of the query's family (NodePorts are served on them unless `nodeport-ips`
/// narrows them).
pub fn explain(table: &NftTable, local_addresses: &[IpAddr], query: &Query) -> Vec<Finding> {
    let mut findings = Vec::new();
    let (ip, proto, port) = (query.ip, query.protocol, query.port);
    let key = (ip, proto, port);
    let entry = table.service_ips.get(&key);
    let unreachable = table.no_endpoint_services.get(&key);
    if entry.is_some() || unreachable.is_some() {
        let destination = if table.cluster_ips.contains(&ip) {
            "cluster IP".to_string()
        } else if table.firewall_ips.contains(&key) {
            "load-balancer IP".to_string()
        } else {
            "external IP or load-balancer IP".to_string()
        };
        let element = format!("{ip} . {} . {port}", proto.lower());
        let mut finding = destination_finding(
            table,
            destination,
            Destination {
                element,
                kind: EntryKind::Address,
                group: (Some(ip), port),
                cluster_ip: table.cluster_ips.contains(&ip),
            },
            entry,
            unreachable,
        );
        firewall(table, &key, &mut finding);
        findings.push(finding);
    }
    if serves_node_ports(table, local_addresses, ip) {
        let entry = table.service_nodeports.get(&(proto, port));
        let unreachable = table.no_endpoint_nodeports.get(&(proto, port));
        if entry.is_some() || unreachable.is_some() {
            let mut finding = destination_finding(
                table,
                format!("NodePort {port}/{} on node address {ip}", proto.lower()),
                Destination {
                    element: format!("{} . {port}", proto.lower()),
                    kind: EntryKind::NodePort,
                    group: (None, port),
                    cluster_ip: false,
                },
                entry,
                unreachable,
            );
            finding.objects.insert(0, node_port_rule(table));
            findings.push(finding);
        }
    }
    if findings.is_empty() {
        findings.extend(unallocated(table, query));
    }
    findings
}

struct Destination {
    /// The entry's key as nft prints it.
    element: String,
    kind: EntryKind,
    group: GroupKey,
    cluster_ip: bool,
}

fn serves_node_ports(table: &NftTable, local_addresses: &[IpAddr], ip: IpAddr) -> bool {
    if !table.nodeport_ips.is_empty() {
        return table.nodeport_ips.contains(&ip);
    }
    !ip.is_loopback() && local_addresses.contains(&ip)
}

fn node_port_rule(table: &NftTable) -> String {
    if table.nodeport_ips.is_empty() {
        "chain service-dispatch: fib daddr type local ... goto nodeport-dispatch (any local address but loopback)".into()
    } else {
        let ips: Vec<String> = table.nodeport_ips.iter().map(ToString::to_string).collect();
        format!("set nodeport-ips: {} (--nodeport-addresses)", ips.join(", "))
    }
}

fn destination_finding(
    table: &NftTable,
    destination: String,
    dest: Destination,
    entry: Option<&Entry>,
    unreachable: Option<&Entry>,
) -> Finding {
    let mut finding = Finding {
        destination,
        service: entry.or(unreachable).and_then(|e| e.service.clone()),
        table_wide: false,
        outcome: Outcome::Forwarded,
        groups: Vec::new(),
        decisions: Vec::new(),
        objects: Vec::new(),
    };
    if let Some(entry) = entry {
        entry_objects(table, entry, &dest, dest.kind.dispatch_chain(), &mut finding);
    }
    if let Some(unreachable) = unreachable {
        let check = match dest.kind {
            EntryKind::Address => FixedChain::ServiceEndpointsCheck,
            EntryKind::NodePort => FixedChain::NodePortEndpointsCheck,
        };
        entry_objects(table, unreachable, &dest, check, &mut finding);
        finding.outcome = unreachable_outcome(unreachable, &dest, entry.is_some());
    }
    if dest.cluster_ip {
        finding.decisions.push(
            "cluster IP: traffic not from the pod network (all traffic with masqueradeAll) is masqueraded (chain services: ip daddr @cluster-ips ... jump mark-for-masquerade)".into(),
        );
    }
    if let Some(Verdict::Goto(chain)) = entry.and_then(Entry::verdict) {
        follow(table, &chain, dest.group, &mut finding);
    }
    hairpin(table, &mut finding);
    finding
}

/// The element of `entry` and the rule of `chain` that looks its set up.
fn entry_objects(
    table: &NftTable,
    entry: &Entry,
    dest: &Destination,
    chain: FixedChain,
    finding: &mut Finding,
) {
    finding
        .objects
        .push(format!("set {}: {}", entry.set, dest.element));
    let key = match dest.group.0 {
        Some(IpAddr::V4(_)) => "ip daddr . meta l4proto . th dport",
        Some(IpAddr::V6(_)) => "ip6 daddr . meta l4proto . th dport",
        None => "meta l4proto . th dport",
    };
    let verdict = entry.verdict().map_or("?".into(), |v| verdict_text(&v));
    finding.objects.push(format!(
        "chain {}: {key} @{} {verdict}",
        chain.as_str(),
        entry.set
    ));
    if !table.looks_up(chain, entry.set) {
        finding.decisions.push(format!(
            "chain {} has no rule looking up set {}: this entry decides nothing (the next reconcile repairs it)",
            chain.as_str(),
            entry.set
        ));
    }
}

fn unreachable_outcome(entry: &Entry, dest: &Destination, has_entry: bool) -> Outcome {
    let set = entry.set;
    match entry.verdict() {
        Some(Verdict::Goto(chain)) => Outcome::Rejected(format!(
            "the Service has no endpoints that can serve (set {set}: goto {chain}, checked in the filter hooks before DNAT)"
        )),
        Some(Verdict::Drop) if dest.cluster_ip => Outcome::Dropped(format!(
            "internalTrafficPolicy Local and no endpoint on this node (set {set}: drop)"
        )),
        Some(Verdict::Drop) if has_entry => Outcome::Dropped(format!(
            "externalTrafficPolicy Local and no endpoint on this node: traffic from outside the node is dropped (set {set}: drop); pods and this node still reach the endpoints below"
        )),
        Some(Verdict::Drop) => Outcome::Dropped(format!(
            "externalTrafficPolicy Local and no endpoint on this node (set {set}: drop)"
        )),
        None => Outcome::Dropped(format!("unexpected set {set}")),
    }
}

fn verdict_text(verdict: &Verdict) -> String {
    match verdict {
        Verdict::Goto(chain) => format!("goto {chain}"),
        Verdict::Drop => "drop".into(),
    }
}

/// Describes the shared chain an entry goes to and the endpoints it draws from.
fn follow(table: &NftTable, chain: &str, group: GroupKey, finding: &mut Finding) {
    let Some(ChainId::Shared(shared)) = parse_chain_name(chain) else {
        finding.decisions.push(format!(
            "goes to chain {chain}, which kube-proxy-rs does not write (a foreign edit: the next reconcile removes it)"
        ));
        return;
    };
    if !table.chains.contains(chain) {
        finding.decisions.push(format!(
            "chain {chain} is missing from the table (the next reconcile repairs it)"
        ));
    }
    match shared {
        SharedChain::Pick { .. } | SharedChain::Sticky { .. } | SharedChain::Slot { .. } => {
            if let Some(choice) = choice_of(shared) {
                let endpoints = choose(table, choice, group, false, finding);
                finding.groups.push(EndpointGroup {
                    traffic: "all traffic".into(),
                    endpoints,
                });
            }
        }
        SharedChain::Masquerade { choice } => {
            finding.objects.push(format!(
                "chain {shared}: jump mark-for-masquerade, goto {}",
                choice.chain()
            ));
            finding.decisions.push(format!(
                "externalTrafficPolicy Cluster: every connection is masqueraded (chain {shared}: jump mark-for-masquerade)"
            ));
            let endpoints = choose(table, choice, group, false, finding);
            finding.groups.push(EndpointGroup {
                traffic: "all traffic".into(),
                endpoints,
            });
        }
        SharedChain::LocalPolicy { local, shortcut } => {
            finding.objects.push(format!(
                "chain {shared}: pods and this node -> {}, other traffic -> {}",
                shortcut.map_or("none".into(), |c| c.chain().to_string()),
                local.map_or("none (falls through)".into(), |c| c.chain().to_string())
            ));
            let local_eps = local.map(|c| choose(table, c, group, true, finding));
            finding.decisions.push(format!(
                "externalTrafficPolicy Local: client source addresses are kept; traffic from pods and from this node (masqueraded) may use every endpoint (chain {shared})"
            ));
            if let Some(shortcut) = shortcut {
                let mut all = choose(table, shortcut, group, false, finding);
                for ep in &mut all {
                    ep.local = local_eps
                        .as_ref()
                        .is_some_and(|l| l.iter().any(|x| x.addr == ep.addr));
                }
                finding.groups.push(EndpointGroup {
                    traffic: "traffic from pods and from this node".into(),
                    endpoints: all,
                });
            }
            match local_eps {
                Some(endpoints) => finding.groups.push(EndpointGroup {
                    traffic: "other traffic (only endpoints on this node)".into(),
                    endpoints,
                }),
                None => finding.decisions.push(
                    "no endpoint on this node: other traffic falls through to the no-endpoint set and is dropped".into(),
                ),
            }
        }
    }
}

fn choice_of(chain: SharedChain) -> Option<Choice> {
    match chain {
        SharedChain::Pick { map, count } => Some(Choice {
            map,
            count,
            affinity: None,
        }),
        SharedChain::Sticky { map, count, timeout } => Some(Choice {
            map,
            count,
            affinity: Some(timeout),
        }),
        _ => None,
    }
}

/// The endpoints of `choice` for `group`, slot by slot, and the objects involved.
fn choose(
    table: &NftTable,
    choice: Choice,
    group: GroupKey,
    local: bool,
    finding: &mut Finding,
) -> Vec<Endpoint> {
    let chain = choice.chain();
    let map = choice.endpoints();
    finding.objects.push(format!(
        "chain {chain}: dnat to <key> . numgen random mod {} map @{map}",
        choice.count
    ));
    if let Some(timeout) = choice.affinity {
        finding.decisions.push(format!(
            "sessionAffinity ClientIP, timeout {timeout} s: a client keeps its slot (set {}; chains {chain}, slot-{}-<k>)",
            SetName::Affinity(choice.map),
            choice.endpoints()
        ));
    }
    let prefix = match group.0 {
        Some(ip) => format!("{ip} . {}", group.1),
        None => group.1.to_string(),
    };
    let mut endpoints = Vec::new();
    for slot in 0..choice.count {
        match table.endpoints.get(&(choice, group, slot)) {
            Some(addr) => {
                finding
                    .objects
                    .push(format!("map {map}: {prefix} . {slot} : {} . {}", addr.ip(), addr.port()));
                endpoints.push(Endpoint {
                    addr: *addr,
                    weight: Weight::Slot {
                        slot,
                        count: choice.count,
                    },
                    local,
                });
            }
            None => finding.decisions.push(format!(
                "slot {slot} of {prefix} is missing from map {map}: connections drawing it are not translated (the next reconcile repairs it)"
            )),
        }
    }
    endpoints
}

fn hairpin(table: &NftTable, finding: &mut Finding) {
    let mut ips: Vec<IpAddr> = finding
        .groups
        .iter()
        .flat_map(|g| g.endpoints.iter().map(|e| e.addr.ip()))
        .filter(|ip| table.hairpin.contains(ip))
        .collect();
    ips.sort();
    ips.dedup();
    if !ips.is_empty() {
        finding.decisions.push(
            "hairpin: an endpoint reaching itself through this destination is masqueraded (set hairpin, chain nat-postrouting)".into(),
        );
        for ip in ips {
            finding.objects.push(format!("set hairpin: {ip} . {ip}"));
        }
    }
}

fn firewall(table: &NftTable, key: &(IpAddr, Protocol, u16), finding: &mut Finding) {
    if !table.firewall_ips.contains(key) {
        return;
    }
    let (ip, proto, port) = key;
    let ranges: Vec<String> = table
        .firewall_allow
        .get(key)
        .map(|r| r.iter().map(|(a, b)| range_text(*a, *b)).collect())
        .unwrap_or_default();
    finding.decisions.push(format!(
        "loadBalancerSourceRanges: only sources in [{}] are accepted; other sources are dropped before DNAT (chain firewall-check)",
        ranges.join(", ")
    ));
    finding
        .objects
        .push(format!("set firewall-ips: {ip} . {} . {port}", proto.lower()));
    for range in ranges {
        finding.objects.push(format!(
            "set firewall-allow: {ip} . {} . {port} . {range}",
            proto.lower()
        ));
    }
}

/// `a/len` when the range is one prefix, `a` for one address, else `a-b`.
pub(crate) fn range_text(start: IpAddr, end: IpAddr) -> String {
    if start == end {
        return start.to_string();
    }
    let max = if start.is_ipv4() { 32 } else { 128 };
    for len in 0..=max {
        if let Ok(net) = IpNet::new(start, len)
            && net.network() == start
            && net.broadcast() == end
        {
            return net.to_string();
        }
    }
    format!("{start}-{end}")
}

/// A cluster IP without this port, or an unallocated address of a Service CIDR.
fn unallocated(table: &NftTable, query: &Query) -> Option<Finding> {
    let ip = query.ip;
    let finding = |destination: &str, outcome, object: String| Finding {
        destination: destination.to_string(),
        service: None,
        table_wide: true,
        outcome,
        groups: Vec::new(),
        decisions: Vec::new(),
        objects: vec![object],
    };
    if table.cluster_ips.contains(&ip) {
        return Some(finding(
            "cluster IP, but no Service port uses this port and protocol",
            Outcome::Rejected(
                "wrong port of a cluster IP (chain cluster-ips-check: ip daddr @cluster-ips reject)".into(),
            ),
            format!("set cluster-ips: {ip}"),
        ));
    }
    let n = addr_number(ip);
    let range = table
        .service_cidrs
        .iter()
        .find(|(a, b)| a.is_ipv4() == ip.is_ipv4() && addr_number(*a) <= n && n <= addr_number(*b))?;
    Some(finding(
        "address in a Service CIDR that no Service holds",
        Outcome::Dropped(
            "unallocated cluster IP (chain cluster-ips-check: ip daddr @service-cidrs drop)".into(),
        ),
        format!("set service-cidrs: {}", range_text(range.0, range.1)),
    ))
}
