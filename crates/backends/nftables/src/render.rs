//! nft text (`nft -f` syntax) for the typed model: used by golden tests, `--dry-run` and
//! the `nft` transport.
//!
//! Every token is a literal of this file, a number, an address, a name from
//! [`crate::names`], a checked [`kpr_naming::InterfaceName`] or an element's checked
//! [`kpr_naming::text::Comment`]; both are quoted and neither can contain a quote or a
//! control character.

use std::fmt::Write as _;

use ipnet::IpNet;
use kpr_model::IpFamily;
use kpr_naming::text::Comment;

use crate::build::Ruleset;
use crate::model::{ElemKey, ElemValue, Key, Match, Rule, Slot, Stmt};
use crate::names::{ChainId, EndpointMap, EntryKind, SetName};
use crate::options::NftablesOptions;

/// The table's name in both families (upstream's, so either proxy removes the other's table).
pub const TABLE: &str = "kube-proxy";

/// `ip` or `ip6`: the table family and the address expression prefix alike.
pub fn family_word(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

fn addr_type(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ipv4_addr",
        IpFamily::V6 => "ipv6_addr",
    }
}

/// `<key of an endpoint map entry>`: `ip daddr . tcp dport` or `tcp dport`.
fn endpoint_key(out: &mut String, family: IpFamily, map: EndpointMap) {
    let proto = map.proto.lower();
    if map.space.keyed_by_address() {
        let _ = write!(out, "{} daddr . {proto} dport", family_word(family));
    } else {
        let _ = write!(out, "{proto} dport");
    }
}

/// The body of a set or map declaration (between the braces).
pub fn set_body(family: IpFamily, set: SetName, affinity_capacity: u32) -> String {
    let addr = addr_type(family);
    let fam = family_word(family);
    match set {
        SetName::ClusterIps | SetName::NodePortIps => format!("type {addr} ;"),
        SetName::ServiceCidrs => format!("type {addr} ; flags interval ;"),
        SetName::Entries { kind, .. } | SetName::NoEndpoint { kind, .. } => match kind {
            EntryKind::Address => format!("type {addr} . inet_proto . inet_service ;"),
            EntryKind::NodePort => "type inet_proto . inet_service ;".to_string(),
        },
        SetName::FirewallIps => format!("type {addr} . inet_proto . inet_service ;"),
        SetName::LocalhostNodePorts => "type inet_proto . inet_service ;".to_string(),
        SetName::FirewallAllow => {
            format!("type {addr} . inet_proto . inet_service . {addr} ; flags interval ;")
        }
        SetName::Hairpin => format!("type {addr} . {addr} ;"),
        SetName::Endpoints(choice) => {
            let map = choice.map;
            let mut key = String::new();
            endpoint_key(&mut key, family, map);
            let proto = map.proto.lower();
            format!("typeof {key} . numgen random mod 1 : {fam} daddr . {proto} dport ;")
        }
        SetName::Affinity(map) => {
            let mut key = String::new();
            endpoint_key(&mut key, family, map);
            format!(
                "typeof {fam} saddr . {key} . numgen random mod 1 ; size {affinity_capacity} ; flags dynamic,timeout ;"
            )
        }
    }
}

/// A chain declaration's body (`{ type ... }` for base chains), or `None` for a regular one.
pub fn chain_hook(chain: ChainId) -> Option<String> {
    let ChainId::Fixed(fixed) = chain else {
        return None;
    };
    let hook = fixed.hook()?;
    // The policy is spelled out so a full sync also resets one someone changed.
    Some(format!(
        "type {} hook {} priority {} ; policy accept ;",
        hook.kind.as_str(),
        hook.hook.as_str(),
        hook.priority
    ))
}

fn net(out: &mut String, net: &IpNet) {
    // A single address is written bare: nft lists it that way.
    if net.prefix_len() == net.max_prefix_len() {
        let _ = write!(out, "{}", net.addr());
    } else {
        let _ = write!(out, "{net}");
    }
}

fn key_expr(out: &mut String, family: IpFamily, key: Key) {
    let fam = family_word(family);
    match key {
        Key::DestProtoPort => {
            let _ = write!(out, "{fam} daddr . meta l4proto . th dport");
        }
        Key::ProtoPort => out.push_str("meta l4proto . th dport"),
        Key::DestProtoPortSource => {
            let _ = write!(out, "{fam} daddr . meta l4proto . th dport . {fam} saddr");
        }
        Key::SourceDest => {
            let _ = write!(out, "{fam} saddr . {fam} daddr");
        }
        Key::AffinityEntry { map, slot } => {
            let _ = write!(out, "{fam} saddr . ");
            endpoint_key(out, family, map);
            let _ = write!(out, " . numgen random mod 1 offset {slot}");
        }
    }
}

fn match_expr(out: &mut String, family: IpFamily, m: &Match) {
    let fam = family_word(family);
    let neq = |negate: bool| if negate { "!= " } else { "" };
    match m {
        Match::CtStateNew => out.push_str("ct state new"),
        Match::CtStateInvalid => out.push_str("ct state invalid"),
        Match::CtStatusDnat => out.push_str("ct status dnat"),
        Match::SourceNet { net: n, negate } => {
            let _ = write!(out, "{fam} saddr {}", neq(*negate));
            net(out, n);
        }
        Match::DestNotNet(n) => {
            let _ = write!(out, "{fam} daddr != ");
            net(out, n);
        }
        Match::DestNet(n) => {
            let _ = write!(out, "{fam} daddr ");
            net(out, n);
        }
        Match::L4Proto(proto) => {
            let _ = write!(out, "meta l4proto {}", proto.lower());
        }
        Match::InputInterface { name, prefix, negate } => {
            let star = if *prefix { "*" } else { "" };
            let _ = write!(out, "iifname {}\"{}{star}\"", neq(*negate), name.as_str());
        }
        Match::SourceIsLocal => out.push_str("fib saddr type local"),
        Match::DestIsLocal => out.push_str("fib daddr type local"),
        Match::DestIn(set) => {
            let _ = write!(out, "{fam} daddr @{set}");
        }
        Match::Lookup { key, set, negate } => {
            key_expr(out, family, *key);
            let _ = write!(out, " {}@{set}", neq(*negate));
        }
        Match::MarkClear(mask) => {
            let _ = write!(out, "mark and {mask:#x} == 0");
        }
    }
}

fn stmt(out: &mut String, family: IpFamily, s: &Stmt) {
    match s {
        Stmt::Jump(c) => {
            let _ = write!(out, "jump {c}");
        }
        Stmt::Goto(c) => {
            let _ = write!(out, "goto {c}");
        }
        Stmt::Return => out.push_str("return"),
        Stmt::Drop => out.push_str("drop"),
        Stmt::Reject => out.push_str("reject"),
        Stmt::CountReject(counter) => {
            let _ = write!(out, "counter name \"{counter}\" reject");
        }
        Stmt::RandomGoto(targets) => {
            let _ = write!(out, "numgen random mod {} vmap {{ ", targets.len());
            for (i, target) in targets.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let _ = write!(out, "{i} : goto {target}");
            }
            out.push_str(" }");
        }
        Stmt::MarkOr(bits) => {
            let _ = write!(out, "mark set mark or {bits:#x}");
        }
        Stmt::MarkXor(bits) => {
            let _ = write!(out, "mark set mark xor {bits:#x}");
        }
        Stmt::Masquerade => out.push_str("masquerade fully-random"),
        Stmt::DnatMap { choice, slot } => {
            out.push_str("dnat to ");
            endpoint_key(out, family, choice.map);
            match slot {
                Slot::Random(count) => {
                    let _ = write!(out, " . numgen random mod {count}");
                }
                Slot::Fixed(slot) => {
                    let _ = write!(out, " . numgen random mod 1 offset {slot}");
                }
            }
            let _ = write!(out, " map @{}", choice.endpoints());
        }
        Stmt::RememberSlot { map, slot, timeout } => {
            let _ = write!(out, "update @{} {{ ", SetName::Affinity(*map));
            key_expr(
                out,
                family,
                Key::AffinityEntry {
                    map: *map,
                    slot: *slot,
                },
            );
            let _ = write!(out, " timeout {timeout}s }}");
        }
    }
}

/// One rule's text (after `add rule <family> kube-proxy <chain> `).
pub fn rule_text(family: IpFamily, rule: &Rule) -> String {
    let mut out = String::new();
    for m in &rule.matches {
        match_expr(&mut out, family, m);
        out.push(' ');
    }
    stmt(&mut out, family, &rule.stmt);
    out
}

/// One element's text inside `{ }`. A comment goes between key and data, as nft reads
/// element options; it is kpr-naming-checked text (no quote, no control character).
pub fn element_text(out: &mut String, key: &ElemKey, value: Option<&ElemValue>, comment: Option<&Comment>) {
    match key {
        ElemKey::Addr(ip) => {
            let _ = write!(out, "{ip}");
        }
        ElemKey::Net(n) => net(out, n),
        ElemKey::AddrProtoPort(ip, proto, port) => {
            let _ = write!(out, "{ip} . {} . {port}", proto.lower());
        }
        ElemKey::ProtoPort(proto, port) => {
            let _ = write!(out, "{} . {port}", proto.lower());
        }
        ElemKey::AddrProtoPortNet(ip, proto, port, n) => {
            let _ = write!(out, "{ip} . {} . {port} . ", proto.lower());
            net(out, n);
        }
        ElemKey::AddrPair(a, b) => {
            let _ = write!(out, "{a} . {b}");
        }
        ElemKey::AddrPortSlot(ip, port, slot) => {
            let _ = write!(out, "{ip} . {port} . {slot}");
        }
        ElemKey::PortSlot(port, slot) => {
            let _ = write!(out, "{port} . {slot}");
        }
    }
    if let Some(comment) = comment {
        let _ = write!(out, " comment \"{}\"", comment.as_str());
    }
    match value {
        None => {}
        Some(ElemValue::Endpoint(ep)) => {
            let _ = write!(out, " : {} . {}", ep.ip(), ep.port());
        }
    }
}

/// What a full sync of `ruleset` loads, as one readable `nft -f` script (for golden tests
/// and `--dry-run`); the backend sends the same operations, possibly split in batches.
pub fn render_text(ruleset: &Ruleset, opts: &NftablesOptions) -> String {
    let batches = crate::batch::full_batches(ruleset, opts, usize::MAX);
    let mut out = String::new();
    for batch in &batches {
        out.push_str(&crate::batch::batch_text(batch, opts.affinity_capacity));
    }
    out
}
