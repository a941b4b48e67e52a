//! The ipvs mode's ipsets as values, what turns what the kernel holds into what is wanted
//! ([`changes`], pure), and the [`Ipset`] trait that reads and writes them.
//!
//! Why netlink and not the `ipset` tool (issue 11, decided by measurement): the proxy
//! writes its sets through kpr-nfnetlink's ipset client ([`IpsetNetlink`]), one socket
//! per backend, many member changes per `sendmsg`. `cargo bench -p kpr-ipvs --bench ipset`
//! (BENCHMARKS.md, ipvs section: 2026-11-26 08:45 UTC, the shared 2-core machine under
//! other load, median of 11 runs, KUBE-CLUSTER-IP holding one member per Service, all
//! seventeen sets):
//!
//! | Services | path | cold load | one change (1 del + 1 add) | read back |
//! |---:|---|---:|---:|---:|
//! | 1,000 | `ipset restore -exist` / `ipset save` | 5.0 ms | 1.1 ms | 4.8 ms |
//! | 1,000 | netlink | 1.2 ms | 0.002 ms | 0.9 ms |
//! | 10,000 | `ipset restore -exist` / `ipset save` | 60 ms | 1.9 ms | 68 ms |
//! | 10,000 | netlink | 31 ms | 0.004 ms | 3.3 ms |
//!
//! The change a user feels on every endpoint or Service change is a process start with
//! the tool (1-2 ms whatever the size) and a few microseconds over netlink; cold loads
//! (first sync) are 2-4x and read-backs (every full sync) 5-20x faster too. The tool stays as
//! [`IpsetCli`]: the benchmark's baseline and a second writer in tests, never the
//! proxy's; `--cleanup` and mode switches destroy the sets over netlink (kpr-leftovers).
//!
//! Members and changes are typed values (addresses, ports, CIDRs, protocols and fixed
//! set names), so nothing from an API object reaches the kernel as text. Sets are created
//! with upstream's sizes and never destroyed while the mode runs (an empty set costs
//! nothing, and iptables rules may still name it).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::net::IpAddr;

use ipnet::IpNet;
pub use kpr_model::Protocol;

mod netlink;
mod tool;

pub use netlink::IpsetNetlink;
pub use tool::IpsetCli;

/// Upstream's initial buckets of a hash set.
pub const HASH_SIZE: u32 = 1024;
/// Upstream's most members of a hash set.
pub const MAX_ELEMENTS: u32 = 65536;

/// The kernel's ipsets as the backend reads and writes them: over netlink in the proxy
/// ([`IpsetNetlink`]), through the `ipset` tool as the benchmark's baseline and the
/// tests' oracle ([`IpsetCli`]).
pub trait Ipset: Send {
    /// The sets of `specs` the kernel has, with their members; a set it lacks is absent.
    fn read(&mut self, specs: &[SetSpec]) -> Result<Sets, String>;
    /// Applies `changes` in order.
    fn write(&mut self, changes: &[SetChange]) -> Result<(), String>;
}

/// The set types the ipvs mode uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetKind {
    /// `hash:ip,port`: a service address and port.
    IpPort,
    /// `hash:ip,port,ip`: an address and port plus a second address (hairpin, source IP).
    IpPortIp,
    /// `hash:ip,port,net`: an address and port plus a source range.
    IpPortNet,
    /// `hash:ip`: an address.
    Ip,
    /// `bitmap:port`: a port.
    Port,
}

impl SetKind {
    pub fn type_name(self) -> &'static str {
        match self {
            Self::IpPort => "hash:ip,port",
            Self::IpPortIp => "hash:ip,port,ip",
            Self::IpPortNet => "hash:ip,port,net",
            Self::Ip => "hash:ip",
            Self::Port => "bitmap:port",
        }
    }

    /// Upstream's creation options: hash sets of the family, [`HASH_SIZE`] buckets,
    /// [`MAX_ELEMENTS`] members at most; the port bitmap covers every port.
    fn create_options(self, family: Family) -> String {
        match self {
            Self::Port => "range 0-65535".to_string(),
            _ => format!(
                "family {} hashsize {HASH_SIZE} maxelem {MAX_ELEMENTS}",
                family.as_str()
            ),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    fn as_str(self) -> &'static str {
        match self {
            Self::V4 => "inet",
            Self::V6 => "inet6",
        }
    }
}

/// One member of a set, in the shape its set's kind takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Member {
    IpPort(IpAddr, Protocol, u16),
    IpPortIp(IpAddr, Protocol, u16, IpAddr),
    IpPortNet(IpAddr, Protocol, u16, IpNet),
    Ip(IpAddr),
    Port(u16),
}

impl Member {
    pub fn kind(&self) -> SetKind {
        match self {
            Self::IpPort(..) => SetKind::IpPort,
            Self::IpPortIp(..) => SetKind::IpPortIp,
            Self::IpPortNet(..) => SetKind::IpPortNet,
            Self::Ip(_) => SetKind::Ip,
            Self::Port(_) => SetKind::Port,
        }
    }

    /// The member as `ipset save` prints it for a set of `kind`.
    pub fn parse(kind: SetKind, text: &str) -> Result<Self, String> {
        let bad = || format!("{text:?} is not a {} member", kind.type_name());
        let parts: Vec<&str> = text.split(',').collect();
        let ip = |s: &str| s.parse::<IpAddr>().map_err(|_| bad());
        let proto_port = |s: &str| -> Result<(Protocol, u16), String> {
            let (proto, port) = s.split_once(':').ok_or_else(bad)?;
            let proto = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
                .into_iter()
                .find(|p| p.lower() == proto)
                .ok_or_else(bad)?;
            Ok((proto, port.parse().map_err(|_| bad())?))
        };
        match (kind, parts.as_slice()) {
            (SetKind::IpPort, [a, pp]) => {
                let (proto, port) = proto_port(pp)?;
                Ok(Self::IpPort(ip(a)?, proto, port))
            }
            (SetKind::IpPortIp, [a, pp, b]) => {
                let (proto, port) = proto_port(pp)?;
                Ok(Self::IpPortIp(ip(a)?, proto, port, ip(b)?))
            }
            (SetKind::IpPortNet, [a, pp, net]) => {
                let (proto, port) = proto_port(pp)?;
                let net = net
                    .parse::<IpNet>()
                    .or_else(|_| ip(net).map(IpNet::from))
                    .map_err(|_| bad())?;
                Ok(Self::IpPortNet(ip(a)?, proto, port, net))
            }
            (SetKind::Ip, [a]) => Ok(Self::Ip(ip(a)?)),
            (SetKind::Port, [p]) => Ok(Self::Port(p.parse().map_err(|_| bad())?)),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::IpPort(ip, proto, port) => write!(f, "{ip},{}:{port}", proto.lower()),
            Self::IpPortIp(ip, proto, port, ip2) => write!(f, "{ip},{}:{port},{ip2}", proto.lower()),
            Self::IpPortNet(ip, proto, port, net) => write!(f, "{ip},{}:{port},{net}", proto.lower()),
            Self::Ip(ip) => write!(f, "{ip}"),
            Self::Port(port) => write!(f, "{port}"),
        }
    }
}

/// A set the mode owns: its name (one of upstream's), kind and family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SetSpec {
    pub name: &'static str,
    pub kind: SetKind,
    pub family: Family,
}

/// Sets by name with their members.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sets {
    sets: BTreeMap<&'static str, (SetSpec, BTreeSet<Member>)>,
}

impl Sets {
    /// Declares `spec` (a set exists, maybe empty, once declared).
    pub fn declare(&mut self, spec: SetSpec) {
        self.sets
            .entry(spec.name)
            .or_insert_with(|| (spec, BTreeSet::new()));
    }

    /// Adds `member` to the declared set `name`; a member of another kind is a bug in the
    /// caller, reported as an error rather than written.
    pub fn insert(&mut self, name: &str, member: Member) -> Result<(), String> {
        let (spec, members) = self
            .sets
            .get_mut(name)
            .ok_or_else(|| format!("ipset {name} is not declared"))?;
        if member.kind() != spec.kind {
            return Err(format!(
                "{member} is not a member of {} ({})",
                spec.name,
                spec.kind.type_name()
            ));
        }
        members.insert(member);
        Ok(())
    }

    pub fn members(&self, name: &str) -> Option<&BTreeSet<Member>> {
        self.sets.get(name).map(|(_, members)| members)
    }

    pub fn is_empty(&self, name: &str) -> bool {
        self.members(name).is_none_or(BTreeSet::is_empty)
    }

    pub fn specs(&self) -> impl Iterator<Item = &SetSpec> {
        self.sets.values().map(|(spec, _)| spec)
    }

    /// Members across all sets, for metrics and benchmarks.
    pub fn member_count(&self) -> usize {
        self.sets.values().map(|(_, members)| members.len()).sum()
    }
}

/// One step from what the kernel holds to what is wanted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetChange {
    /// Create the set (`-exist`: one that is there stays).
    Create(SetSpec),
    Delete(&'static str, Member),
    Add(&'static str, Member),
}

/// What makes the kernel's sets (`current`, as read back) hold exactly `wanted`'s
/// members, set by set: its creation if the kernel lacks it, deletions of members no
/// longer wanted, additions of new ones. Empty when nothing differs.
pub fn changes(wanted: &Sets, current: &Sets) -> Vec<SetChange> {
    let mut changes = Vec::new();
    let empty = BTreeSet::new();
    for (name, (spec, members)) in &wanted.sets {
        let had = current.members(name);
        if had.is_none() {
            changes.push(SetChange::Create(*spec));
        }
        let had = had.unwrap_or(&empty);
        changes.extend(
            had.difference(members)
                .map(|gone| SetChange::Delete(spec.name, *gone)),
        );
        changes.extend(members.difference(had).map(|new| SetChange::Add(spec.name, *new)));
    }
    changes
}

/// [`changes`] as an `ipset restore -exist` script (the `ipset` tool's path: the
/// benchmark's baseline and the tests' oracle).
pub fn restore_script(wanted: &Sets, current: &Sets) -> String {
    render(&changes(wanted, current))
}

fn render(changes: &[SetChange]) -> String {
    let mut script = String::new();
    for change in changes {
        let _ = match change {
            SetChange::Create(spec) => writeln!(
                script,
                "create {} {} {}",
                spec.name,
                spec.kind.type_name(),
                spec.kind.create_options(spec.family)
            ),
            SetChange::Delete(name, member) => writeln!(script, "del {name} {member}"),
            SetChange::Add(name, member) => writeln!(script, "add {name} {member}"),
        };
    }
    script
}

/// The members of `specs`' sets in `ipset save` output; sets not in `specs` are skipped,
/// and a set in `specs` that the output lacks is absent from the result.
pub fn parse_save(text: &str, specs: &[SetSpec]) -> Result<Sets, String> {
    let mut sets = Sets::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(verb), Some(name)) = (words.next(), words.next()) else {
            continue;
        };
        let Some(spec) = specs.iter().find(|spec| spec.name == name) else {
            continue;
        };
        match verb {
            "create" => sets.declare(*spec),
            "add" => {
                let text = words.next().ok_or_else(|| format!("{line:?}: no member"))?;
                sets.insert(name, Member::parse(spec.kind, text)?)?;
            }
            _ => {}
        }
    }
    Ok(sets)
}

#[cfg(test)]
mod tests;
